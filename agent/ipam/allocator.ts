// ipam/ pure core: which pool applies to a service, and which address of it
// the service gets. No I/O, no clock (time is the `now` argument), no state:
// the caller passes in the claims of other services, the addresses found in
// conflict on the LAN and the addresses this node must never hand out, and
// gets back an address or a reason that is also a status line and a metric
// label (metallb's allocator style). Both families: a request names its
// family, and addresses are keyed by their canonical text (formatAddress),
// which never confuses an IPv4 address with an IPv6 one.
import type { Pool } from '../config/types';
import { describePool, familyRanges, poolContains, poolLookupOrder, selectPool } from '../config/pools';
import { formatAddress, lastAddressOf, parseAddress, parseNetwork, type Family } from '../address';

/** Why no address could be given; stable strings, used as status reasons. */
export type AllocationFailure = 'exhausted' | 'no-pool' | 'not-in-pool' | 'taken';

/** How the address was chosen, for logs and status. */
export type AllocationVia = 'loadBalancerIP' | 'claim' | 'lowest-free';

export interface AllocationRequest {
  /** "namespace/name". */
  readonly service: string;
  readonly namespace: string;
  /** The family of the address wanted; default IPv4. */
  readonly family?: Family | undefined;
  /** Exact address asked for, of that family; must lie in the selected pool. */
  readonly loadBalancerIP?: string | undefined;
  /** The address this service held before (persisted claim), if any. */
  readonly claim?: { readonly address: string; readonly pool: string } | undefined;
}

/** Addresses in the allocator's maps and sets are canonical text (formatAddress). */
export interface AllocationState {
  /** Addresses claimed or being probed by other services: address -> service key. */
  readonly taken: ReadonlyMap<string, string>;
  /** Addresses another host on the LAN answered for: address -> time (same clock as `now`) after which it may be tried again. */
  readonly conflicts: ReadonlyMap<string, number>;
  /** Addresses never to hand out whatever the pool says: the node's own addresses, its subnets' network and broadcast. */
  readonly reserved?: ReadonlySet<string> | undefined;
  readonly now: number;
}

export type AllocationResult =
  | {
    readonly ok: true;
    /** Canonical text. */
    readonly address: string;
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

/** Whether a key of the allocator's maps lies in the pool. */
function inPool(pool: Pool, text: string): boolean {
  const a = parseAddress(text);
  return a !== undefined && poolContains(pool, a);
}

/**
 * Number of addresses the pool may hand out, less the reserved ones inside
 * it (a float: an IPv6 /64 has 2^64 of them).
 */
export function poolSize(pool: Pool, reserved?: ReadonlySet<string>): number {
  let n = pool.ranges.reduce((sum, r) => sum + Number(r.end - r.start + 1n), 0);
  if (reserved) {
    for (const a of reserved) if (inPool(pool, a)) n--;
  }
  return n;
}

type Block = { why: 'taken'; by: string } | { why: 'conflict'; until: number } | { why: 'reserved' };

function blocked(a: string, req: AllocationRequest, st: AllocationState): Block | undefined {
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
    if (until > st.now && inPool(pool, a) && (min === undefined || until < min)) min = until;
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
  const family = req.family ?? 'IPv4';
  const pool = selectPool(pools, req.namespace, family);
  if (!pool) {
    return {
      ok: false, reason: 'no-pool',
      message: `service ${req.service}: no IP pool applies to namespace ${req.namespace}: none of ${poolLookupOrder(req.namespace).join(', ')} is configured under pools with ${family} addresses`,
    };
  }
  const describe = (p: Pool): string => describePool(p, family);

  if (req.loadBalancerIP !== undefined && req.loadBalancerIP !== '') {
    const parsed = parseAddress(req.loadBalancerIP);
    if (parsed === undefined || !poolContains(pool, parsed)) {
      return {
        ok: false, reason: 'not-in-pool', pool: pool.key,
        message: `service ${req.service}: loadBalancerIP ${req.loadBalancerIP} is not in pool ${describe(pool)}; choose an address of the pool or remove loadBalancerIP`,
      };
    }
    const want = formatAddress(parsed);
    const b = blocked(want, req, st);
    if (!b) return { ok: true, address: want, pool: pool.key, via: 'loadBalancerIP' };
    const why = b.why === 'taken' ? `is held by service ${b.by}`
      : b.why === 'reserved' ? 'is an address of this node\'s own interface (or its subnet\'s network/broadcast address)'
        : `is answered for by another host on the LAN (${family === 'IPv4' ? 'ARP' : 'duplicate address detection'} conflict)`;
    return {
      ok: false, reason: 'taken', pool: pool.key, retryAt: b.why === 'conflict' ? b.until : undefined,
      message: `service ${req.service}: loadBalancerIP ${req.loadBalancerIP} ${why}`,
    };
  }

  if (req.claim && req.claim.pool === pool.key) {
    const had = parseAddress(req.claim.address);
    if (had !== undefined && poolContains(pool, had) && !blocked(formatAddress(had), req, st)) {
      return { ok: true, address: formatAddress(had), pool: pool.key, via: 'claim' };
    }
  }

  // Lowest free: walking in address order, each blocked address costs one
  // step, so the walk ends within |taken|+|conflicts|+|reserved|+1 steps
  // even in a /8.
  let held = 0;
  let inConflict = 0;
  for (const r of familyRanges(pool, family)) {
    for (let v = r.start; v <= r.end; v++) {
      const a = formatAddress({ family, value: v });
      const b = blocked(a, req, st);
      if (!b) return { ok: true, address: a, pool: pool.key, via: 'lowest-free' };
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
 * interface: each subnet address (IPv4 prefix < 32, IPv6 < 128) itself and,
 * for IPv4 up to /30, its subnet's network and broadcast addresses; and every
 * host address (/32, /128) that no pool claim accounts for (a VIP of
 * keepalived or of an operator: our own probe cannot see it, since a host
 * does not answer its own probe). The host addresses that claims account for
 * are our VIPs, left by an earlier run and adopted. Keys are canonical text.
 */
export function reservedFromInterface(addresses: readonly { readonly address: string; readonly prefix: number }[], claimed: ReadonlySet<string>): Set<string> {
  const out = new Set<string>();
  for (const a of addresses) {
    const parsed = parseAddress(a.address);
    if (parsed === undefined) continue;
    const text = formatAddress(parsed);
    if (a.prefix >= (parsed.family === 'IPv4' ? 32 : 128)) {
      if (!claimed.has(text)) out.add(text);
      continue;
    }
    out.add(text);
    const n = parseNetwork(`${a.address}/${a.prefix}`, true);
    if (n && n.family === 'IPv4' && n.prefix <= 30) {
      out.add(formatAddress({ family: 'IPv4', value: n.network }));
      out.add(formatAddress(lastAddressOf(n)));
    }
  }
  return out;
}

/** An address in the allocator's key form (canonical text); undefined for text that is no address. */
export function addressKey(text: string): string | undefined {
  const a = parseAddress(text);
  return a === undefined ? undefined : formatAddress(a);
}
