// Test helper: ServiceSpec values as config/load.ts would produce them, with
// Harvester's health-check defaults, for the health checker's tests and the
// privileged driver. Not a test file itself.
import type { BackendSpec, HealthCheckSpec, ServiceSpec } from '../../agent/config/types';
import { parseIPv4 } from '../../agent/address';

export interface ServiceInput {
  name: string;
  namespace?: string;
  backends: (string | { address: string; weight?: number })[];
  healthCheck?: Partial<HealthCheckSpec>;
}

export function backend(address: string, weight = 1): BackendSpec {
  const n = parseIPv4(address);
  if (n === undefined) throw new Error(`bad address ${address}`);
  return { address, addressNum: n, weight };
}

export function healthCheck(over: Partial<HealthCheckSpec> = {}): HealthCheckSpec {
  return {
    enabled: true, type: 'tcp', port: 8080, successThreshold: 1, failureThreshold: 3,
    periodSeconds: 5, timeoutSeconds: 3, http: undefined, passiveFailures: 3, ...over,
  };
}

export function service(input: ServiceInput): ServiceSpec {
  const namespace = input.namespace ?? 'default';
  const hc = healthCheck(input.healthCheck);
  return {
    key: `${namespace}/${input.name}`,
    name: input.name,
    namespace,
    ipam: 'pool',
    primaryService: undefined,
    loadBalancerIP: undefined,
    vrid: undefined,
    priority: undefined,
    ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: hc.port }],
    backends: input.backends.map((b) => (typeof b === 'string' ? backend(b) : backend(b.address, b.weight ?? 1))),
    healthCheck: hc,
    sourceIP: 'snat',
    topology: 'any',
  };
}
