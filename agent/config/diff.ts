// Reload by diff: which services were added, removed, changed or kept, and
// which top-level sections changed. Pure. Whether a reload may proceed, and
// the steps it takes, are daemon/reconciler.ts's.
import { isDeepStrictEqual } from 'node:util';
import type { Desired, ServiceSpec } from './types';

export interface ConfigDiff {
  readonly added: readonly ServiceSpec[];
  readonly removed: readonly ServiceSpec[];
  /** Services whose spec changed: [old, new]. */
  readonly changed: readonly (readonly [ServiceSpec, ServiceSpec])[];
  readonly unchanged: readonly ServiceSpec[];
  /** Top-level sections that changed (node, failover, dataplane, pools, networks, arp, dhcp, proxy, metrics, backend). */
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
  for (const k of ['node', 'failover', 'dataplane', 'pools', 'networks', 'arp', 'dhcp', 'proxy', 'kernel', 'metrics', 'control', 'stateDir', 'backend', 'reconcile'] as const) {
    if (!isDeepStrictEqual(oldC[k], newC[k])) globals.push(k);
  }
  return { added, removed, changed, unchanged, globals };
}
