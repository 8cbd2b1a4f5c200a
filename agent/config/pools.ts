// kube-vip pool syntax (the keys of the kube-system/kubevip ConfigMap) parsed
// once into typed, non-overlapping ranges of usable addresses, the lookup
// order that picks a pool for a namespace, and membership. Pure; the one home
// of pool bounds: config validation and ipam/allocator.ts both use it.
import { parseCidr, parseIPv4, broadcastOf, formatIPv4 } from '../address';
import type { Pool, PoolRange } from './types';

export interface PoolError { key: string; message: string }

/** Parse one pool value ("10.0.0.0/28,10.0.1.0/29" or "10.0.0.5-10.0.0.9,..."). */
export function parsePoolValue(key: string, value: string): { ranges: PoolRange[]; errors: PoolError[] } {
  const kind: 'cidr' | 'range' = key.startsWith('cidr-') ? 'cidr' : 'range';
  const ranges: PoolRange[] = [];
  const errors: PoolError[] = [];
  const items = value.split(',').map((s) => s.trim());
  if (items.every((s) => s === '')) {
    errors.push({ key, message: `${JSON.stringify(value)} is empty; expected a comma-separated list of ${kind === 'cidr' ? 'CIDRs' : 'ranges a.b.c.d-e.f.g.h'}` });
    return { ranges, errors };
  }
  for (const item of items) {
    if (item === '') { errors.push({ key, message: `${JSON.stringify(value)} has an empty list element` }); continue; }
    if (kind === 'cidr') {
      const c = parseCidr(item);
      if (!c) {
        const loose = parseCidr(item, true);
        errors.push({ key, message: loose
          ? `${JSON.stringify(item)} has host bits set; did you mean ${formatIPv4(loose.network)}/${loose.prefix}?`
          : `${JSON.stringify(item)} is not a CIDR (a.b.c.d/n)` });
        continue;
      }
      const bcast = broadcastOf(c);
      // Network and broadcast addresses are never handed out (RFC 919/922);
      // /31 (RFC 3021) and /32 have none.
      const start = c.prefix >= 31 ? c.network : c.network + 1;
      const end = c.prefix >= 31 ? bcast : bcast - 1;
      ranges.push({ start: start >>> 0, end: end >>> 0, text: item, kind });
    } else {
      const m = /^([^-\s]+)\s*-\s*([^-\s]+)$/.exec(item);
      const a = m ? parseIPv4(m[1]!) : undefined;
      const b = m ? parseIPv4(m[2]!) : undefined;
      if (a === undefined || b === undefined) {
        errors.push({ key, message: `${JSON.stringify(item)} is not a range (a.b.c.d-e.f.g.h)` });
        continue;
      }
      if (a > b) {
        errors.push({ key, message: `${JSON.stringify(item)} is reversed: ${m![1]} comes after ${m![2]}` });
        continue;
      }
      ranges.push({ start: a, end: b, text: item, kind });
    }
  }
  return { ranges, errors };
}

/** Parse all pools, rejecting overlaps within and across keys. */
export function parsePools(raw: Record<string, string>): { pools: Pool[]; errors: PoolError[] } {
  const pools: Pool[] = [];
  const errors: PoolError[] = [];
  const all: { key: string; r: PoolRange }[] = [];
  for (const [key, value] of Object.entries(raw)) {
    const res = parsePoolValue(key, value);
    errors.push(...res.errors);
    pools.push({ key, ranges: res.ranges });
    for (const r of res.ranges) all.push({ key, r });
  }
  all.sort((x, y) => x.r.start - y.r.start);
  for (let i = 1; i < all.length; i++) {
    const prev = all[i - 1]!;
    const cur = all[i]!;
    if (cur.r.start <= prev.r.end) {
      const where = prev.key === cur.key ? `in ${cur.key}` : `with ${prev.key}`;
      errors.push({ key: cur.key, message: `${JSON.stringify(cur.r.text)} overlaps ${JSON.stringify(prev.r.text)} ${where}` });
    }
  }
  return { pools, errors };
}

/**
 * The pool keys consulted for a namespace, in kube-vip's order
 * (kube-vip-cloud-provider discoverPool): every CIDR key before every range
 * key, so `cidr-global` shadows `range-<ns>`. Kept as is for compatibility
 * with the ConfigMaps users already have.
 */
export function poolLookupOrder(namespace: string): readonly string[] {
  return [`cidr-${namespace}`, 'cidr-global', `range-${namespace}`, 'range-global'];
}

/** The pool that applies to a namespace: the first key in lookup order that exists. */
export function selectPool(pools: readonly Pool[], namespace: string): Pool | undefined {
  for (const key of poolLookupOrder(namespace)) {
    const p = pools.find((x) => x.key === key);
    if (p) return p;
  }
  return undefined;
}

/**
 * Whether the pool may hand out an address. The ranges are usable addresses
 * already (parsePoolValue drops the network and broadcast addresses of CIDRs
 * up to /30), so this is a bounds check; nothing downstream re-reads the text.
 */
export function poolContains(pool: Pool, ip: number): boolean {
  const a = ip >>> 0;
  return pool.ranges.some((r) => a >= r.start && a <= r.end);
}
