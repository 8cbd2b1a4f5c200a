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

/**
 * Each service's fingerprint, its canonical text (JSON of the frozen spec),
 * made once per spec object and kept while the object lives: a reload
 * compares a thousand services by their text, each made once, not by a
 * deep comparison of every field of every one. Specs are plain data (strings,
 * finite numbers, booleans, arrays, plain objects: the schema allows no
 * other; a field left undefined is one left out), so the same text is the
 * same spec; a different text may still be
 * the same spec written with its keys in another order, which the deep
 * comparison then decides.
 */
export class SpecFingerprints {
  private readonly texts = new WeakMap<ServiceSpec, string>();
  /** Fingerprints made (tests read it: a spec's is made once). */
  made = 0;

  of(spec: ServiceSpec): string {
    let t = this.texts.get(spec);
    if (t === undefined) {
      t = JSON.stringify(spec);
      this.made++;
      this.texts.set(spec, t);
    }
    return t;
  }

  /** The same spec: the same object, the same text, or (texts differing in key order only) deeply equal. */
  same(a: ServiceSpec, b: ServiceSpec): boolean {
    return a === b || this.of(a) === this.of(b) || isDeepStrictEqual(a, b);
  }
}

/** Two specs compare equal (SpecFingerprints.same, or a deep comparison). */
export type SameSpec = (a: ServiceSpec, b: ServiceSpec) => boolean;

export function diffConfigs(oldC: Desired, newC: Desired, same: SameSpec = isDeepStrictEqual): ConfigDiff {
  const oldBy = new Map(oldC.services.map((s) => [s.key, s]));
  const newBy = new Map(newC.services.map((s) => [s.key, s]));
  const added: ServiceSpec[] = [];
  const removed: ServiceSpec[] = [];
  const changed: [ServiceSpec, ServiceSpec][] = [];
  const unchanged: ServiceSpec[] = [];
  for (const s of newC.services) {
    const o = oldBy.get(s.key);
    if (!o) added.push(s);
    else if (same(o, s)) unchanged.push(s);
    else changed.push([o, s]);
  }
  for (const s of oldC.services) if (!newBy.has(s.key)) removed.push(s);
  const globals: string[] = [];
  for (const k of ['node', 'failover', 'dataplane', 'pools', 'networks', 'arp', 'dhcp', 'proxy', 'kernel', 'metrics', 'control', 'stateDir', 'backend', 'reconcile'] as const) {
    if (!isDeepStrictEqual(oldC[k], newC[k])) globals.push(k);
  }
  return { added, removed, changed, unchanged, globals };
}
