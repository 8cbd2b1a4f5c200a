// Every default of the configuration file, in one place. The schema reads
// them (ajv useDefaults), the docs cite them, nothing else hard-codes them.
import type { ArpConfig, DhcpTimings, KernelConfig, ProxyConfig } from './types';

export const DEFAULT_CONFIG_PATH = '/etc/lb-agent/config.yaml';

export const DEFAULTS = {
  // labelsFile: where topology.kubernetes.io/zone and /region are read from
  // when node.zone / node.region are not set (docs/datapaths.md "Zones").
  node: { priority: 100, labelsFile: '/etc/lb-agent/node-labels' },
  failover: { mode: 'none', vrid: 51, advertInterval: 1, preempt: true, preemptDelay: 0, peers: [] as string[] },
  // Tracking: an interface acts at once, as keepalived's track_interface
  // does; a service waits out a second of shortage (a flapping backend
  // cannot move the VIP) and five of health before it counts again (no
  // ping-pong under preemption).
  track: {
    interface: { failAfter: 0, recoverAfter: 0 },
    service: { minHealthy: 1, failAfter: 1, recoverAfter: 5 },
  },
  stateDir: '/var/lib/lb-agent',
  metrics: { listen: '0.0.0.0:9477' },
  control: { socket: '/run/lb-agent/agent.sock' },
  // Notifications repair drift at once; the resync is the safety net for a lost one (Calico Felix refreshes every 90 s).
  reconcile: { resyncInterval: 30 },
  dataplane: 'auto',
  namespace: 'default',
  // Harvester's default IPAM mode is pool.
  ipam: 'pool',
  protocol: 'TCP',
  weight: 1,
  // SNAT to the VIP as before unless a service asks to keep the
  // client's address (direct server return); every backend of every zone.
  sourceIP: 'snat',
  topology: 'any',
  // Harvester cloud provider defaults: TCP, success 1, failure 3, period 5 s, timeout 3 s.
  healthCheck: { enabled: true, type: 'tcp', successThreshold: 1, failureThreshold: 3, periodSeconds: 5, timeoutSeconds: 3, passiveFailures: 3, proxyProtocol: false },
  httpCheck: { path: '/', expectStatus: [200, 399] as [number, number] },
} as const;

// RFC 5227 §1.1 constants, in seconds. refreshInterval: 10 s, docs/configuration.md
// "arp.refreshInterval" says why (RFC 5227 DEFEND_INTERVAL; below every client's ARP timeout).
export const DEFAULT_ARP: ArpConfig = {
  probeWait: 1, probeNum: 3, probeMin: 1, probeMax: 2, announceWait: 2, announceNum: 2, announceInterval: 2, refreshInterval: 10,
};

// RFC 2131 §4.1 (4 s doubling to 64 s, ±1 s) and §3.1.5 (10 s after DECLINE).
export const DEFAULT_DHCP: DhcpTimings = {
  retransmitInitial: 4, retransmitMax: 64, retransmitJitter: 1, declineWait: 10, maxConcurrentStarts: 8, probeOffer: true,
};

// DHCP answers are checked against the parent's subnets; any server may answer.
export const DEFAULT_DHCP_GUARD = { allowOtherSubnets: false, servers: [] as string[], servers6: [] as string[] } as const;

export const DEFAULT_PROXY: ProxyConfig = { algorithm: 'round-robin', idleTimeout: 300, connectTimeout: 3 };

// The eBPF engine where it loads, else the nft table (docs/design.md says why);
// 65,536 flows a direction; NAT ports above Linux's default ephemeral range (32768-60999).
export const DEFAULT_KERNEL: KernelConfig = { engine: 'auto', flowEntries: 65536, natPorts: [61001, 65535] };

/** Harvester cloud provider annotation keys, mapped onto typed service fields. */
export const ANNOTATION_PREFIX = 'cloudprovider.harvesterhci.io/';
export const ANNOTATIONS = {
  ipam: `${ANNOTATION_PREFIX}ipam`,
  primaryService: `${ANNOTATION_PREFIX}primary-service`,
  healthcheckPort: `${ANNOTATION_PREFIX}healthcheck-port`,
  successThreshold: `${ANNOTATION_PREFIX}healthcheck-success-threshold`,
  failureThreshold: `${ANNOTATION_PREFIX}healthcheck-failure-threshold`,
  periodSeconds: `${ANNOTATION_PREFIX}healthcheck-periodseconds`,
  timeoutSeconds: `${ANNOTATION_PREFIX}healthcheck-timeoutseconds`,
} as const;

/** A VIP owner's announcement timings (net/vip-owner.ts) from the arp: section, in ms. */
export function ownerTimings(arp: { readonly announceNum: number; readonly announceInterval: number; readonly refreshInterval?: number | undefined }): { announceNum: number; announceIntervalMs: number; refreshMs: number } {
  return { announceNum: arp.announceNum, announceIntervalMs: arp.announceInterval * 1000, refreshMs: (arp.refreshInterval ?? DEFAULT_ARP.refreshInterval) * 1000 };
}
