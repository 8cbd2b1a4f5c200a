// kube-vip pool syntax (the keys of the kube-system/kubevip ConfigMap) parsed
// once into typed, non-overlapping ranges of usable addresses, the lookup
// order that picks a pool for a namespace and a family, and membership. One
// key may list ranges of both families ("10.0.0.5-10.0.0.9,fd00::5-fd00::9");
// each range carries its family. Pure; the one home of pool bounds: config
// validation and ipam/allocator.ts both use it.
import { formatNetwork, lastAddressOf, parseAddress, parseNetwork, type Address, type Family } from '../address';
import type { Pool, PoolRange } from './types';

export interface PoolError { key: string; message: string }

/**
 * The usable addresses of a CIDR. IPv4: the network and broadcast addresses
 * are never handed out (RFC 919/922), except in a /31 (RFC 3021) or /32,
 * which have none. IPv6 has no broadcast; its all-zero host address is the
 * subnet-router anycast address (RFC 4291 §2.6.1), left out except in a /127
 * (RFC 6164) or /128.
 */
function usable(family: Family, network: bigint, last: bigint, prefix: number): { start: bigint; end: bigint } {
  if (family === 'IPv4') return prefix >= 31 ? { start: network, end: last } : { start: network + 1n, end: last - 1n };
  return prefix >= 127 ? { start: network, end: last } : { start: network + 1n, end: last };
}

/** Parse one pool value ("10.0.0.0/28,fd00::/120" or "10.0.0.5-10.0.0.9,fd00::5-fd00::9"). */
export function parsePoolValue(key: string, value: string): { ranges: PoolRange[]; errors: PoolError[] } {
  const kind: 'cidr' | 'range' = key.startsWith('cidr-') ? 'cidr' : 'range';
  const ranges: PoolRange[] = [];
  const errors: PoolError[] = [];
  const items = value.split(',').map((s) => s.trim());
  if (items.every((s) => s === '')) {
    errors.push({ key, message: `${JSON.stringify(value)} is empty; expected a comma-separated list of ${kind === 'cidr' ? 'CIDRs (a.b.c.d/n or x:y::/n)' : 'ranges a.b.c.d-e.f.g.h or x:y::a-x:y::b'}` });
    return { ranges, errors };
  }
  for (const item of items) {
    if (item === '') { errors.push({ key, message: `${JSON.stringify(value)} has an empty list element` }); continue; }
    if (kind === 'cidr') {
      const c = parseNetwork(item);
      if (!c) {
        const loose = parseNetwork(item, true);
        errors.push({ key, message: loose
          ? `${JSON.stringify(item)} has host bits set; did you mean ${formatNetwork(loose)}?`
          : `${JSON.stringify(item)} is not a CIDR (a.b.c.d/n or x:y::/n)` });
        continue;
      }
      const { start, end } = usable(c.family, c.network, lastAddressOf(c).value, c.prefix);
      ranges.push({ family: c.family, start, end, text: item, kind });
    } else {
      const m = /^([^-\s]+)\s*-\s*([^-\s]+)$/.exec(item);
      const a = m ? parseAddress(m[1]!) : undefined;
      const b = m ? parseAddress(m[2]!) : undefined;
      if (a === undefined || b === undefined) {
        errors.push({ key, message: `${JSON.stringify(item)} is not a range (a.b.c.d-e.f.g.h or x:y::a-x:y::b)` });
        continue;
      }
      if (a.family !== b.family) {
        errors.push({ key, message: `${JSON.stringify(item)} mixes families: ${m![1]} is ${a.family}, ${m![2]} is ${b.family}` });
        continue;
      }
      if (a.value > b.value) {
        errors.push({ key, message: `${JSON.stringify(item)} is reversed: ${m![1]} comes after ${m![2]}` });
        continue;
      }
      ranges.push({ family: a.family, start: a.value, end: b.value, text: item, kind });
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
  all.sort((x, y) => (x.r.family !== y.r.family ? (x.r.family < y.r.family ? -1 : 1) : x.r.start < y.r.start ? -1 : x.r.start > y.r.start ? 1 : 0));
  for (let i = 1; i < all.length; i++) {
    const prev = all[i - 1]!;
    const cur = all[i]!;
    if (cur.r.family === prev.r.family && cur.r.start <= prev.r.end) {
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

/** True when the pool lists at least one range of the family. */
export function poolHasFamily(pool: Pool, family: Family): boolean {
  return pool.ranges.some((r) => r.family === family);
}

/**
 * The pool that gives a namespace its addresses of a family: the first key in
 * lookup order that lists a range of that family. A key with only IPv4
 * ranges does not shadow a later key with IPv6 ones, so `cidr-<ns>` may hold
 * a namespace's IPv4 addresses and `range-global` everybody's IPv6 ones.
 */
export function selectPool(pools: readonly Pool[], namespace: string, family: Family = 'IPv4'): Pool | undefined {
  for (const key of poolLookupOrder(namespace)) {
    const p = pools.find((x) => x.key === key);
    if (p && poolHasFamily(p, family)) return p;
  }
  return undefined;
}

/** The ranges of one family of a pool, in address order (parsePools rejects overlaps, so they are disjoint). */
export function familyRanges(pool: Pool, family: Family): readonly PoolRange[] {
  return pool.ranges.filter((r) => r.family === family).sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0));
}

/**
 * Whether the pool may hand out an address. The ranges are usable addresses
 * already (parsePoolValue drops what a CIDR never hands out), so this is a
 * bounds check in the address's family; nothing downstream re-reads the text.
 */
export function poolContains(pool: Pool, a: Address): boolean {
  return pool.ranges.some((r) => r.family === a.family && a.value >= r.start && a.value <= r.end);
}

/** The pool's ranges as written, of one family or all, for messages. */
export function describePool(pool: Pool, family?: Family): string {
  return `${pool.key} (${pool.ranges.filter((r) => family === undefined || r.family === family).map((r) => r.text).join(',')})`;
}
