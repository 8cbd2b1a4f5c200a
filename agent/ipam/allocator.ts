// ipam/ pure core: which pool applies to a service, and which address of it
// the service gets. No I/O, no clock (time is the `now` argument), no state:
// the caller passes in the claims of other services, the addresses found in
// conflict on the LAN and the addresses this node must never hand out, and
// gets back an address or a reason that is also a status line and a metric
// label (metallb's allocator style).
import type { Pool, PoolRange } from '../config/types';
import { formatIPv4, parseCidr, parseIPv4, broadcastOf } from '../ipv4';

/** Why no address could be given; stable strings, used as status reasons. */
export type AllocationFailure = 'exhausted' | 'no-pool' | 'not-in-pool' | 'taken';

/** How the address was chosen, for logs and status. */
export type AllocationVia = 'loadBalancerIP' | 'claim' | 'lowest-free';

export type PoolSelection =
  | { readonly ok: true; readonly pool: Pool }
  | { readonly ok: false; readonly reason: 'no-pool'; readonly message: string };

export interface AllocationRequest {
  /** "namespace/name". */
  readonly service: string;
  readonly namespace: string;
  /** Exact address asked for (dotted quad); must lie in the selected pool. */
  readonly loadBalancerIP?: string | undefined;
  /** The address this service held before (persisted claim), if any. */
  readonly claim?: { readonly address: string; readonly pool: string } | undefined;
}

export interface AllocationState {
  /** Addresses claimed or being probed by other services: address -> service key. */
  readonly taken: ReadonlyMap<number, string>;
  /** Addresses another host on the LAN answered for: address -> time (same clock as `now`) after which it may be tried again. */
  readonly conflicts: ReadonlyMap<number, number>;
  /** Addresses never to hand out whatever the pool says: the node's own addresses, its subnets' network and broadcast. */
  readonly reserved?: ReadonlySet<number> | undefined;
  readonly now: number;
}

export type AllocationResult =
  | {
    readonly ok: true;
    readonly address: string;
    readonly addressNum: number;
    /** Key of the pool the address came from. */
    readonly pool: string;
    readonly via: AllocationVia;
  }
  | {
    readonly ok: false;
    readonly reason: AllocationFailure;
    readonly message: string;
    /** The selected pool's key, when one was selected. */
    readonly pool?: string | undefined;
    /** Earliest time (same clock as `now`) at which an address held back by a conflict may be tried again, if any. */
    readonly retryAt?: number | undefined;
  };

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
export function selectPool(pools: readonly Pool[], namespace: string): PoolSelection {
  const order = poolLookupOrder(namespace);
  for (const key of order) {
    const pool = pools.find((p) => p.key === key);
    if (pool) return { ok: true, pool };
  }
  return {
    ok: false,
    reason: 'no-pool',
    message: `no IP pool applies to namespace ${namespace}: none of ${order.join(', ')} is configured under pools`,
  };
}

interface Interval { start: number; end: number }

/**
 * The usable addresses of a range as inclusive intervals. The config loader
 * already drops the network and broadcast addresses of CIDRs; this checks
 * again from the CIDR as written, because handing out a broadcast address
 * breaks every host on the subnet that answers to it. /31 and /32 have no
 * network or broadcast address (RFC 3021).
 */
function usableIntervals(r: PoolRange): Interval[] {
  let start = r.start >>> 0;
  let end = r.end >>> 0;
  if (start > end) return [];
  if (r.kind === 'cidr') {
    const c = parseCidr(r.text.trim(), true);
    if (c && c.prefix <= 30) {
      const net = c.network;
      const bcast = broadcastOf(c);
      if (start < net + 1) start = net + 1;
      if (end > bcast - 1) end = bcast - 1;
      if (start > end) return [];
    }
  }
  return [{ start, end }];
}

/** The usable addresses of a pool, merged, sorted, without overlaps. */
function poolIntervals(pool: Pool): Interval[] {
  const all = pool.ranges.flatMap(usableIntervals).sort((a, b) => a.start - b.start);
  const out: Interval[] = [];
  for (const iv of all) {
    const last = out[out.length - 1];
    if (last && iv.start <= last.end + 1) {
      if (iv.end > last.end) last.end = iv.end;
    } else {
      out.push({ ...iv });
    }
  }
  return out;
}

/** Whether an address (u32) is one the pool may hand out (network/broadcast of its CIDRs excluded). */
export function poolContains(pool: Pool, address: number): boolean {
  const a = address >>> 0;
  return poolIntervals(pool).some((iv) => a >= iv.start && a <= iv.end);
}

/** Number of addresses the pool may hand out, less the reserved ones inside it. */
export function poolSize(pool: Pool, reserved?: ReadonlySet<number>): number {
  const ivs = poolIntervals(pool);
  let n = ivs.reduce((sum, iv) => sum + (iv.end - iv.start + 1), 0);
  if (reserved) {
    for (const a of reserved) if (ivs.some((iv) => a >= iv.start && a <= iv.end)) n--;
  }
  return n;
}

function describe(pool: Pool): string {
  return `${pool.key} (${pool.ranges.map((r) => r.text).join(',')})`;
}

type Block = { why: 'taken'; by: string } | { why: 'conflict'; until: number } | { why: 'reserved' };

function blocked(a: number, req: AllocationRequest, st: AllocationState): Block | undefined {
  if (st.reserved?.has(a)) return { why: 'reserved' };
  const by = st.taken.get(a);
  if (by !== undefined && by !== req.service) return { why: 'taken', by };
  const until = st.conflicts.get(a);
  if (until !== undefined && until > st.now) return { why: 'conflict', until };
  return undefined;
}

function earliestRetry(pool: Pool, st: AllocationState): number | undefined {
  let min: number | undefined;
  for (const [a, until] of st.conflicts) {
    if (until > st.now && poolContains(pool, a) && (min === undefined || until < min)) min = until;
  }
  return min;
}

/**
 * The address a service gets, in order: its loadBalancerIP (must lie in the
 * selected pool and be free), its persisted claim (if still in the pool and
 * free), else the lowest free address of the pool. Free means not held by
 * another service, not reserved, and not in conflict on the LAN (a conflict
 * holds an address back until its retry time).
 */
export function allocate(pools: readonly Pool[], req: AllocationRequest, st: AllocationState): AllocationResult {
  const sel = selectPool(pools, req.namespace);
  if (!sel.ok) return { ok: false, reason: 'no-pool', message: `service ${req.service}: ${sel.message}` };
  const pool = sel.pool;

  if (req.loadBalancerIP !== undefined && req.loadBalancerIP !== '') {
    const want = parseIPv4(req.loadBalancerIP);
    if (want === undefined || !poolContains(pool, want)) {
      return {
        ok: false, reason: 'not-in-pool', pool: pool.key,
        message: `service ${req.service}: loadBalancerIP ${req.loadBalancerIP} is not in pool ${describe(pool)}; choose an address of the pool or remove loadBalancerIP`,
      };
    }
    const b = blocked(want, req, st);
    if (!b) return { ok: true, address: formatIPv4(want), addressNum: want, pool: pool.key, via: 'loadBalancerIP' };
    const why = b.why === 'taken' ? `is held by service ${b.by}`
      : b.why === 'reserved' ? 'is an address of this node\'s own interface (or its subnet\'s network/broadcast address)'
        : 'is answered for by another host on the LAN (ARP conflict)';
    return {
      ok: false, reason: 'taken', pool: pool.key, retryAt: b.why === 'conflict' ? b.until : undefined,
      message: `service ${req.service}: loadBalancerIP ${req.loadBalancerIP} ${why}`,
    };
  }

  if (req.claim && req.claim.pool === pool.key) {
    const had = parseIPv4(req.claim.address);
    if (had !== undefined && poolContains(pool, had) && !blocked(had, req, st)) {
      return { ok: true, address: formatIPv4(had), addressNum: had, pool: pool.key, via: 'claim' };
    }
  }

  // Lowest free: walking in address order, each blocked address costs one
  // step, so the walk ends within |taken|+|conflicts|+|reserved|+1 steps
  // even in a /8.
  let held = 0;
  let inConflict = 0;
  for (const iv of poolIntervals(pool)) {
    for (let a = iv.start; a <= iv.end; a++) {
      const b = blocked(a, req, st);
      if (!b) return { ok: true, address: formatIPv4(a), addressNum: a, pool: pool.key, via: 'lowest-free' };
      if (b.why === 'conflict') inConflict++; else held++;
    }
  }
  const retryAt = earliestRetry(pool, st);
  return {
    ok: false, reason: 'exhausted', pool: pool.key, retryAt,
    message: `service ${req.service}: pool ${describe(pool)} has no free address (${held} held, ${inConflict} in conflict on the LAN); `
      + 'enlarge the pool or remove a service',
  };
}

/**
 * The addresses a node must never hand out, from the addresses on its parent
 * interface: each subnet address (prefix < 32) itself and, up to /30, its
 * subnet's network and broadcast addresses; and every /32 that no pool claim
 * accounts for (a VIP of keepalived or of an operator: our own probe cannot
 * see it, since a host does not answer its own ARP probe). The /32s that
 * claims account for are our VIPs, left by an earlier run and adopted.
 */
export function reservedFromInterface(addresses: readonly { readonly address: string; readonly prefix: number }[], claimed: ReadonlySet<number>): Set<number> {
  const out = new Set<number>();
  for (const a of addresses) {
    const n = parseIPv4(a.address);
    if (n === undefined) continue;
    if (a.prefix >= 32) {
      if (!claimed.has(n)) out.add(n);
      continue;
    }
    out.add(n);
    const c = parseCidr(`${a.address}/${a.prefix}`, true);
    if (c && c.prefix <= 30) {
      out.add(c.network);
      out.add(broadcastOf(c));
    }
  }
  return out;
}
