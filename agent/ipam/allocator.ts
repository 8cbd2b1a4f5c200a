// ipam/ pure core: which pool applies to a service, and which address of it
// the service gets. No I/O, no clock (time is the `now` argument), no state:
// the caller passes in the claims of other services, the addresses found in
// conflict on the LAN and the addresses this node must never hand out, and
// gets back an address or a reason that is also a status line and a metric
// label (metallb's allocator style).
import type { Pool, PoolRange } from '../config/types';
import { poolContains, poolLookupOrder, selectPool } from '../config/pools';
import { formatIPv4, parseCidr, parseIPv4, broadcastOf } from '../address';

/** Why no address could be given; stable strings, used as status reasons. */
export type AllocationFailure = 'exhausted' | 'no-pool' | 'not-in-pool' | 'taken';

/** How the address was chosen, for logs and status. */
export type AllocationVia = 'loadBalancerIP' | 'claim' | 'lowest-free';

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

/** A pool's ranges in address order (config/pools.ts rejects overlaps, so they are disjoint). */
function inOrder(pool: Pool): readonly PoolRange[] {
  return [...pool.ranges].sort((a, b) => a.start - b.start);
}

/** Number of addresses the pool may hand out, less the reserved ones inside it. */
export function poolSize(pool: Pool, reserved?: ReadonlySet<number>): number {
  let n = pool.ranges.reduce((sum, r) => sum + (r.end - r.start + 1), 0);
  if (reserved) {
    for (const a of reserved) if (poolContains(pool, a)) n--;
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
  const pool = selectPool(pools, req.namespace);
  if (!pool) {
    return {
      ok: false, reason: 'no-pool',
      message: `service ${req.service}: no IP pool applies to namespace ${req.namespace}: none of ${poolLookupOrder(req.namespace).join(', ')} is configured under pools`,
    };
  }

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
  for (const r of inOrder(pool)) {
    for (let a = r.start; a <= r.end; a++) {
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
