// Reload by diff: which services were added, removed, changed or kept, and
// whether a new config may replace the running one at all (rules that only
// exist between two versions: IPAM mode is fixed once created, and settings
// that need a restart). Pure.
import { isDeepStrictEqual } from 'node:util';
import type { Desired, ServiceSpec } from './types';
import type { ConfigError } from './load';

export interface ConfigDiff {
  readonly added: readonly ServiceSpec[];
  readonly removed: readonly ServiceSpec[];
  /** Services whose spec changed: [old, new]. */
  readonly changed: readonly (readonly [ServiceSpec, ServiceSpec])[];
  readonly unchanged: readonly ServiceSpec[];
  /** Top-level sections that changed (node, failover, dataplane, pools, arp, dhcp, proxy, metrics). */
  readonly globals: readonly string[];
}

export function diffConfigs(oldC: Desired, newC: Desired): ConfigDiff {
  const oldBy = new Map(oldC.services.map((s) => [s.key, s]));
  const newBy = new Map(newC.services.map((s) => [s.key, s]));
  const added: ServiceSpec[] = [];
  const removed: ServiceSpec[] = [];
  const changed: [ServiceSpec, ServiceSpec][] = [];
  const unchanged: ServiceSpec[] = [];
  for (const s of newC.services) {
    const o = oldBy.get(s.key);
    if (!o) added.push(s);
    else if (isDeepStrictEqual(o, s)) unchanged.push(s);
    else changed.push([o, s]);
  }
  for (const s of oldC.services) if (!newBy.has(s.key)) removed.push(s);
  const globals: string[] = [];
  for (const k of ['node', 'failover', 'dataplane', 'pools', 'arp', 'dhcp', 'proxy', 'metrics', 'control', 'stateDir'] as const) {
    if (!isDeepStrictEqual(oldC[k], newC[k])) globals.push(k);
  }
  return { added, removed, changed, unchanged, globals };
}

/** Rules between the running and the new config; empty when the reload may proceed. */
export function reloadErrors(oldC: Desired, newC: Desired): ConfigError[] {
  const errors: ConfigError[] = [];
  newC.services.forEach((s, i) => {
    const o = oldC.services.find((x) => x.key === s.key);
    if (o && o.ipam !== s.ipam) {
      errors.push({ path: `services[${i}].ipam`, message: `service ${s.key} was created with ${o.ipam} IPAM and cannot change to ${s.ipam}; create a new service instead` });
    }
  });
  if (oldC.stateDir !== newC.stateDir) errors.push({ path: 'stateDir', message: `changed from ${oldC.stateDir} to ${newC.stateDir}: this needs a restart, not a reload` });
  if (oldC.control.socket !== newC.control.socket) errors.push({ path: 'control.socket', message: `changed from ${oldC.control.socket} to ${newC.control.socket}: this needs a restart, not a reload` });
  if (oldC.node.interface !== newC.node.interface) errors.push({ path: 'node.interface', message: `changed from ${oldC.node.interface ?? '(default route)'} to ${newC.node.interface ?? '(default route)'}: this needs a restart, not a reload` });
  return errors;
}
