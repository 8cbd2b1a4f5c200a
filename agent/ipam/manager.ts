// ipam/ coordination of every pool service of this node: one PoolManager
// owns the persisted claims, the addresses being probed, the addresses found
// in conflict on the LAN and the pool metrics, and hands out addresses
// through the pure allocator. It sends no packets: the pool sources probe,
// add and announce, then report back (commit or conflict).
//
// Allocation decisions are serialized by construction: reserve() is
// synchronous and records a hold before it returns, so two services probing
// at the same time never probe (or get) the same address, while their probes
// (seconds each, RFC 5227 §2.1.1) still run concurrently.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { Gauge, Counter } from '../metrics/prom';
import type { Pool } from '../config/types';
import type { StateStore } from '../state/store';
import type { Logger } from '../log';
import { realClock, type Clock } from '../clock';
import { parseAddress, type Family } from '../address';
import { addressKey, allocate, poolSize, type AllocationResult } from './allocator';
import { poolContains, selectPool } from '../config/pools';
import { DEFAULT_NETWORK, poolLabel, poolsOfNetwork } from '../config/networks';
import { ClaimStore, type PoolClaim } from './claims';
import { SerialQueue } from '../serial';
import { ParentReads } from './parent-reads';

/** RFC 5227 §1.1: MAX_CONFLICTS 10, RATE_LIMIT_INTERVAL 60 s. */
export const MAX_CONFLICTS = 10;
export const RATE_LIMIT_INTERVAL_MS = 60_000;

export interface ConflictBackoff {
  /** How long an address found in conflict is left alone the first time (ms). */
  readonly initialMs: number;
  /** Upper bound of the doubling (ms). */
  readonly maxMs: number;
}
export const DEFAULT_CONFLICT_BACKOFF: ConflictBackoff = { initialMs: 60_000, maxMs: 3_600_000 };

export interface ConflictInfo {
  readonly address: string;
  readonly pool: string | undefined;
  /** Conflicts seen for this address since the agent started. */
  readonly count: number;
  /** Clock time after which the address may be tried again. */
  readonly retryAt: number;
  /** MAC of the host that answered, when known. */
  readonly mac: string | undefined;
  readonly service: string;
}

export interface PoolMetrics {
  readonly size: Gauge<'pool'>;
  readonly inUse: Gauge<'pool'>;
  readonly conflicts: Counter<'pool'>;
}

/** Where a pool gauge's collect hook finds the manager that computes it (the last one made on the registry). */
const COMPUTE = Symbol('lbagent.pool.compute');
type Computed = Gauge<'pool'> & { [COMPUTE]?: () => void };

/** prom-client calls a metric's collect() with the metric as `this`, at every scrape (and every get()). */
function computeAtScrape(this: Computed): void {
  this[COMPUTE]?.();
}

/**
 * The pool metrics of a registry. Registered once per registry: a metric
 * already there (another PoolManager on the same registry) is
 * reused, since prom-client refuses a second registration of a name.
 * The gauges are computed at scrape time (their collect hooks), never at
 * a claim change: a start or a stop of n services changes claims and
 * holds n times, and recomputing at each would read every claim each time.
 */
export function poolMetrics(registry: Registry): PoolMetrics {
  const get = <T>(name: string, make: () => T): T => (registry.getSingleMetric(name) as T | undefined) ?? make();
  return {
    size: get('lbagent_pool_size', () => new Gauge({ name: 'lbagent_pool_size', help: 'Addresses a pool may hand out (network, broadcast and this node\'s own addresses excluded).', labelNames: ['pool'], registers: [registry], collect: computeAtScrape })),
    inUse: get('lbagent_pool_in_use', () => new Gauge({ name: 'lbagent_pool_in_use', help: 'Addresses of a pool claimed by a service or being probed.', labelNames: ['pool'], registers: [registry], collect: computeAtScrape })),
    conflicts: get('lbagent_pool_conflicts_total', () => new Counter({ name: 'lbagent_pool_conflicts_total', help: 'Addresses of a pool found held by another host on the LAN (ARP probe, or defence given up).', labelNames: ['pool'], registers: [registry] })),
  };
}

export interface PoolManagerOptions {
  pools: readonly Pool[];
  store: StateStore;
  log: Logger;
  registry: Registry;
  clock?: Clock;
  conflictBackoff?: ConflictBackoff;
}

export interface ReserveRequest {
  readonly service: string;
  readonly namespace: string;
  /** The family of the address; default IPv4. */
  readonly family?: Family | undefined;
  readonly loadBalancerIP?: string | undefined;
  /** The service's network: its pools only (config/networks.ts); absent: the default network. */
  readonly network?: string | undefined;
}

/** Addresses are canonical text (allocator.ts addressKey). */
interface Hold { address: string; pool: string }

/** The holds, counting their changes: the pool gauges are worked out again only after one. */
class Holds extends Map<string, Hold> {
  changes = 0;
  override set(k: string, v: Hold): this { this.changes++; return super.set(k, v); }
  override delete(k: string): boolean { const had = super.delete(k); if (had) this.changes++; return had; }
  override clear(): void { this.changes++; super.clear(); }
}
interface Conflict { count: number; retryAt: number; mac: string | undefined; service: string }

/**
 * Events: 'changed' () whenever an address may have become available
 * (a release, a pruned claim, new pools, new reserved set). Waiting sources
 * retry on it.
 */
export class PoolManager extends EventEmitter {
  private pools: readonly Pool[];
  private readonly claims: ClaimStore;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly backoff: ConflictBackoff;
  readonly metrics: PoolMetrics;
  /** Tentative holds: addresses being probed or held in memory, by service. */
  private readonly holds = new Holds();
  private readonly conflictMap = new Map<string, Conflict>();
  private reserved = new Set<string>();
  /** The reserved addresses of each network's interface; `reserved` is their union. */
  private readonly reservedBy = new Map<string, Set<string>>();
  /** RFC 5227 §2.1.1 rate limiting: conflicts since the last successful claim. */
  private conflictRun = 0;
  private lastAttempt = -Infinity;
  private readonly sizeLabels = new Set<string>();
  /**
   * What the pool gauges were last worked out from: the claims map (the
   * claim store hands out a new one after any change), the holds' change
   * count, the pools and the reserved set (both replaced, never changed in
   * place). A scrape with none of them changed sets nothing.
   */
  private gaugesFrom: { claims: ReadonlyMap<string, PoolClaim>; holds: number; pools: readonly Pool[]; reserved: ReadonlySet<string> } | undefined;
  private sizeFrom: { pools: readonly Pool[]; reserved: ReadonlySet<string> } | undefined;
  private readonly queue = new SerialQueue();
  private readonly parentReads = new ParentReads<unknown>({ run: (fn) => this.serialize(fn) });

  constructor(opts: PoolManagerOptions) {
    super();
    // Every waiting pool source listens for 'changed': one listener per service, not a leak.
    this.setMaxListeners(0);
    this.pools = opts.pools;
    this.log = opts.log.child({ module: 'ipam.manager' });
    this.claims = new ClaimStore({ store: opts.store, log: opts.log });
    this.clock = opts.clock ?? realClock;
    this.backoff = opts.conflictBackoff ?? DEFAULT_CONFLICT_BACKOFF;
    this.metrics = poolMetrics(opts.registry);
    (this.metrics.size as Computed)[COMPUTE] = () => this.computeSize();
    (this.metrics.inUse as Computed)[COMPUTE] = () => this.computeInUse();
    this.notePoolLabels();
  }

  /**
   * Run the pool sources' kernel calls one at a time. An rtnetlink socket
   * serves one dump at a time (a second concurrent dump gets EBUSY, or
   * interleaved replies), and the sources share one NetlinkClient; going
   * one at a time also makes "read the parent's addresses, then reserve"
   * atomic with respect to the other pool sources.
   */
  serialize<T>(fn: () => Promise<T>): Promise<T> {
    return this.queue.run(fn);
  }

  /**
   * A read of a parent interface in the queue, shared by every caller of
   * the same `key` that asks before it starts (parent-reads.ts), each
   * caller's `then` right after it in the same turn. `key` names what is
   * read: callers of one key must read the same thing.
   */
  readParent<P, T>(key: string, read: () => Promise<P>, then: (p: P) => T): Promise<{ p: P; result: T }> {
    return this.parentReads.read(key, read, then as (p: unknown) => T) as Promise<{ p: P; result: T }>;
  }

  /** Parent reads sent since the manager was made (one per batch of callers). */
  get parentReadCount(): number { return this.parentReads.reads; }

  /** New pools (config reload). Bound services keep their address until their source is restarted. */
  setPools(pools: readonly Pool[]): void {
    this.pools = pools;
    this.notePoolLabels();
    this.emit('changed');
  }

  currentPools(): readonly Pool[] { return this.pools; }

  /**
   * Addresses that must never be handed out: the parent interface's own
   * addresses and the network/broadcast addresses of its subnets (a pool
   * written as a range knows nothing of the LAN's prefix).
   */
  setReserved(addresses: Iterable<string>, network: string = DEFAULT_NETWORK): void {
    // One network's interface at a time: every node address of every network stays out of every pool.
    this.reservedBy.set(network, new Set([...addresses].map(addressKey).filter((a): a is string => a !== undefined)));
    const next = new Set([...this.reservedBy.values()].flatMap((x) => [...x]));
    const same = next.size === this.reserved.size && [...next].every((a) => this.reserved.has(a));
    if (same) return;
    this.reserved = next;
    this.emit('changed');
  }

  /** The pool that gives a namespace its addresses of a family, or undefined. */
  poolFor(namespace: string, family: Family = 'IPv4', network?: string): Pool | undefined {
    return selectPool(poolsOfNetwork(this.pools, network), namespace, family);
  }

  /** The persisted claim of a service (throws LB_ERR_STATE_CORRUPT on a corrupt claims file). */
  claimOf(service: string): PoolClaim | undefined {
    return this.claims.get(service);
  }

  allClaims(): ReadonlyMap<string, PoolClaim> { return this.claims.all(); }

  /**
   * Choose an address for a service and hold it for that service until
   * commit(), markConflict() or release(). Synchronous, so concurrent
   * callers are serialized. Replaces any earlier hold of the same service.
   */
  reserve(req: ReserveRequest): AllocationResult {
    const now = this.clock.now();
    this.lastAttempt = now;
    this.holds.delete(req.service);
    const claim = this.claims.get(req.service);
    const result = allocate(poolsOfNetwork(this.pools, req.network), { ...req, claim }, {
      taken: this.takenBy(req.service),
      conflicts: new Map([...this.conflictMap].map(([a, c]) => [a, c.retryAt])),
      reserved: this.reserved,
      now,
    });
    if (result.ok) this.holds.set(req.service, { address: result.address, pool: result.pool });
    return result;
  }

  /**
   * RFC 5227 §2.1.1: after MAX_CONFLICTS conflicts without a success, at most
   * one new address is tried per RATE_LIMIT_INTERVAL, so a pool overlapping
   * someone else's addresses does not turn into an ARP storm. Returns how
   * long to wait before the next reserve() (0 = now).
   */
  attemptDelay(): number {
    if (this.conflictRun < MAX_CONFLICTS) return 0;
    return Math.max(0, this.lastAttempt + RATE_LIMIT_INTERVAL_MS - this.clock.now());
  }

  /** The service probed its held address and found it free: persist the claim. Throws LB_ERR_STATE_WRITE (hold kept). */
  commit(service: string, address: string): PoolClaim {
    const { a, hold } = this.heldFor(service, address);
    const claim = this.claims.set(service, { address, pool: hold.pool }, this.clock.wallNow());
    this.committed(a);
    return claim;
  }

  /** The service's hold on this address, or a throw: a commit needs a matching reservation. */
  private heldFor(service: string, address: string): { a: string; hold: Hold } {
    const a = addressKey(address);
    const hold = this.holds.get(service);
    if (a === undefined || !hold || hold.address !== a) {
      throw new Error(`commit of ${address} for ${service} without a matching reservation`);
    }
    return { a, hold };
  }

  private committed(a: string): void {
    this.conflictRun = 0;
    this.conflictMap.delete(a); // whoever held it has left
  }

  /**
   * commit(), with the claim written together with the other claims
   * committed in this turn (ClaimStore.setSoon): a start of many services
   * writes the claims file a few times, not once per service. The claim
   * holds in memory at once; the promise resolves once it is on disk, and
   * rejects with LB_ERR_STATE_WRITE (the claim taken back, the hold kept).
   * Throws at once, as commit() does, without a matching reservation.
   */
  commitSoon(service: string, address: string): Promise<PoolClaim> {
    const { a, hold } = this.heldFor(service, address);
    const written = this.claims.setSoon(service, { address, pool: hold.pool }, this.clock.wallNow());
    this.committed(a);
    return written;
  }

  /**
   * Another host answers for this address (probe conflict, or a defence
   * given up). The address is left alone until its retry time, doubling with
   * each conflict; the service's hold on it is dropped so the next reserve()
   * picks another address. A persisted claim pointing there stays until a
   * new address is committed: if the pool has nothing else, the service may
   * get it back after the retry time.
   */
  markConflict(service: string, address: string, mac?: string, opts: { counted?: boolean } = {}): ConflictInfo {
    const a = addressKey(address) ?? address;
    const now = this.clock.now();
    const prev = this.conflictMap.get(a);
    const count = (prev?.count ?? 0) + 1;
    const wait = Math.min(this.backoff.maxMs, this.backoff.initialMs * 2 ** (count - 1));
    const c: Conflict = { count, retryAt: now + wait, mac, service };
    this.conflictMap.set(a, c);
    this.conflictRun++;
    const hold = this.holds.get(service);
    if (hold && hold.address === a) this.holds.delete(service);
    const pool = this.poolOf(a) ?? hold?.pool;
    if (pool && !opts.counted) this.metrics.conflicts.inc({ pool });
    this.log.warn({ op: 'conflict', service, address, mac, count, retryInMs: wait, pool }, `address ${address} is held by another host on the LAN${mac ? ` (${mac})` : ''}; not using it for ${Math.round(wait / 1000)} s`);
    return { address, pool, count, retryAt: c.retryAt, mac, service };
  }

  /**
   * Count a conflicting ARP seen for a held address that is being defended
   * (RFC 5227 §2.4), without giving the address up. A later markConflict()
   * for the same event passes { counted: true }.
   */
  noteConflict(address: string): void {
    const pool = this.poolOf(address);
    if (pool) this.metrics.conflicts.inc({ pool });
  }

  /** Addresses currently held back by a conflict, for status. */
  conflicts(): ConflictInfo[] {
    const now = this.clock.now();
    return [...this.conflictMap].filter(([, c]) => c.retryAt > now).map(([a, c]) => ({
      address: a, pool: this.poolOf(a), count: c.count, retryAt: c.retryAt, mac: c.mac, service: c.service,
    }));
  }

  /**
   * A service stops using its address. `deleteClaim` (service removed from
   * the config) also deletes the persisted claim, freeing the address for
   * others; otherwise the claim stays and nobody else gets the address.
   */
  release(service: string, opts: { deleteClaim: boolean }): void {
    this.holds.delete(service);
    if (opts.deleteClaim) this.claims.delete(service);
    this.emit('changed');
  }

  /**
   * Delete the claims of services that no longer exist (removed from the
   * config while the agent was down). Returns the claims deleted, so the
   * caller can take their addresses off the parent interface.
   */
  pruneClaims(liveServices: Iterable<string>): Map<string, PoolClaim> {
    const live = new Set(liveServices);
    const gone = new Map<string, PoolClaim>();
    for (const [svc, claim] of this.claims.all()) {
      if (live.has(svc)) continue;
      this.claims.delete(svc);
      this.holds.delete(svc);
      gone.set(svc, claim);
      this.log.info({ op: 'prune', service: svc, address: claim.address }, `released the pool claim of removed service ${svc}`);
    }
    if (gone.size > 0) this.emit('changed');
    return gone;
  }

  /** The label (config/networks.ts poolLabel) of the pool an address lies in, if any. */
  private poolOf(address: string): string | undefined {
    const a = parseAddress(address);
    const p = a === undefined ? undefined : this.pools.find((x) => poolContains(x, a));
    return p === undefined ? undefined : poolLabel(p);
  }

  /** Address -> service of every claim and hold except the given service's. */
  private takenBy(except: string): Map<string, string> {
    const taken = new Map<string, string>();
    for (const [svc, claim] of this.claims.all()) {
      const a = addressKey(claim.address);
      if (svc !== except && a !== undefined) taken.set(a, svc);
    }
    for (const [svc, h] of this.holds) if (svc !== except) taken.set(h.address, svc);
    return taken;
  }

  /**
   * The pools' labels as the pools change: a new pool's conflicts counter
   * starts at 0, a removed pool's series go.
   */
  private notePoolLabels(): void {
    const seen = new Set<string>();
    for (const pool of this.pools) {
      const label = poolLabel(pool);
      seen.add(label);
      this.sizeLabels.add(label);
      this.metrics.conflicts.inc({ pool: label }, 0);
    }
    for (const key of [...this.sizeLabels]) {
      if (seen.has(key)) continue;
      this.metrics.size.remove({ pool: key });
      this.metrics.inUse.remove({ pool: key });
      this.sizeLabels.delete(key);
    }
  }

  /** lbagent_pool_size, at scrape time. */
  private computeSize(): void {
    const f = this.sizeFrom;
    if (f && f.pools === this.pools && f.reserved === this.reserved) return;
    this.sizeFrom = { pools: this.pools, reserved: this.reserved };
    for (const pool of this.pools) this.metrics.size.set({ pool: poolLabel(pool) }, poolSize(pool, this.reserved));
  }

  /**
   * lbagent_pool_in_use, at scrape time when a claim, a hold, the pools or
   * the reserved set changed since the last: every claim and hold read
   * once, each counted in the pool it lies in. Unchanged, the gauges keep
   * the values set last time.
   */
  private computeInUse(): void {
    let claims: ReadonlyMap<string, PoolClaim>;
    try { claims = this.claims.all(); } catch { return; /* corrupt claims: reported by the sources */ }
    const f = this.gaugesFrom;
    if (f && f.claims === claims && f.holds === this.holds.changes && f.pools === this.pools && f.reserved === this.reserved) return;
    let inUse: Map<string, string>;
    try { inUse = this.takenBy(''); } catch { return; }
    this.gaugesFrom = { claims, holds: this.holds.changes, pools: this.pools, reserved: this.reserved };
    const counts = new Map<string, number>(this.pools.map((p) => [poolLabel(p), 0]));
    for (const a of inUse.keys()) {
      if (this.reserved.has(a)) continue;
      const label = this.poolOf(a);
      if (label !== undefined && counts.has(label)) counts.set(label, counts.get(label)! + 1);
    }
    for (const [label, n] of counts) this.metrics.inUse.set({ pool: label }, n);
  }
}

