// ipam/ persisted pool claims: one JSON document under stateDir
// (`pool-claims.json`) mapping a service key ("ns/name") to the address it
// holds, written atomically through StateStore on every change, so a service
// gets the same address after a restart, a crash or a reboot. A claim is kept
// on shutdown and failover and deleted only when the service is removed.
import type { StateStore } from '../state/store';
import type { Logger } from '../log';
import { LbError } from '../errors';
import { parseAddress } from '../address';
import { isoTime } from '../clock';

export const CLAIMS_FILE = 'pool-claims.json';
const VERSION = 1;

export interface PoolClaim {
  /** Dotted quad. */
  readonly address: string;
  /** The pool key it came from ("range-global", ...). */
  readonly pool: string;
  /** ISO 8601 wall-clock time the claim was first made. */
  readonly claimedAt: string;
}

interface ClaimsDocument {
  version: number;
  claims: Record<string, PoolClaim>;
}

function validClaim(v: unknown): v is PoolClaim {
  if (typeof v !== 'object' || v === null) return false;
  const c = v as Record<string, unknown>;
  return typeof c.address === 'string' && parseAddress(c.address) !== undefined
    && typeof c.pool === 'string' && c.pool !== ''
    && typeof c.claimedAt === 'string';
}

/**
 * The claims of every pool service of this node. Reads the file once, keeps
 * it in memory and rewrites the whole document on each change: one atomic
 * rename keeps the file consistent (never half of a change). The claims a
 * start of many services commits in one turn of the event loop are written
 * together (setSoon): the document grows with the services, and a write of
 * it per claim made a start of n services O(n^2) in bytes and n fsyncs.
 */
export interface ClaimStoreOptions {
  store: StateStore;
  log?: Logger | undefined;
  file?: string;
  /** When the claims of this turn are written (setSoon); default setImmediate. */
  defer?: (fn: () => void) => void;
}

interface PendingClaim {
  readonly service: string;
  readonly claim: PoolClaim;
  readonly prev: PoolClaim | undefined;
  resolve(c: PoolClaim): void;
  reject(err: unknown): void;
}

export class ClaimStore {
  private readonly store: StateStore;
  private readonly log: Logger | undefined;
  private readonly file: string;
  private readonly defer: (fn: () => void) => void;
  private claims: Map<string, PoolClaim> | undefined;
  /** all() handed the map out: the next change copies it first. */
  private shared = false;
  /** Claims set in memory by setSoon whose write has not run yet. */
  private pending: PendingClaim[] | undefined;

  constructor(opts: ClaimStoreOptions) {
    this.store = opts.store;
    this.log = opts.log?.child({ module: 'ipam.claims' });
    this.file = opts.file ?? CLAIMS_FILE;
    this.defer = opts.defer ?? setImmediate;
  }

  /**
   * Load from disk (once). A file that is not JSON throws LB_ERR_STATE_CORRUPT
   * rather than starting empty: starting empty could hand one service's
   * address to another after a restart, silently redirecting clients. Single
   * malformed entries are dropped with a warning.
   */
  private load(): Map<string, PoolClaim> {
    if (this.claims) return this.claims;
    const doc = this.store.read<unknown>(this.file);
    const claims = new Map<string, PoolClaim>();
    if (doc !== undefined) {
      if (typeof doc !== 'object' || doc === null || typeof (doc as ClaimsDocument).claims !== 'object' || (doc as ClaimsDocument).claims === null) {
        throw new LbError('LB_ERR_STATE_CORRUPT', `state file ${this.store.dir}/${this.file} is not a pool claims document; remove it to start fresh`,
          { path: `${this.store.dir}/${this.file}` });
      }
      for (const [key, value] of Object.entries((doc as ClaimsDocument).claims)) {
        if (validClaim(value)) {
          claims.set(key, { address: value.address, pool: value.pool, claimedAt: value.claimedAt });
        } else {
          this.log?.warn({ op: 'load', service: key, entry: value }, 'dropping malformed pool claim');
        }
      }
    }
    this.claims = claims;
    return claims;
  }

  get(service: string): PoolClaim | undefined {
    return this.load().get(service);
  }

  /**
   * Every claim, by service key. A snapshot without a copy: the next change
   * copies the map rather than change the one handed out, so what a caller
   * holds never moves under it.
   */
  all(): ReadonlyMap<string, PoolClaim> {
    const claims = this.load();
    this.shared = true;
    return claims;
  }

  /**
   * Record (or move) a service's claim and write the file before returning.
   * claimedAt is kept when the address does not change. On a write error
   * nothing changes in memory either, and LB_ERR_STATE_WRITE is thrown.
   */
  set(service: string, claim: { address: string; pool: string }, wallNow: number): PoolClaim {
    const claims = this.load();
    const prev = claims.get(service);
    if (prev && prev.address === claim.address && prev.pool === claim.pool) return prev;
    const next: PoolClaim = { address: claim.address, pool: claim.pool, claimedAt: isoTime(wallNow) };
    const copy = new Map(claims);
    copy.set(service, next);
    this.persist(copy);
    this.replace(copy);
    return next;
  }

  /**
   * set(), written with the other claims set this turn in one write: the
   * claim is in memory (get(), all()) at once, and the promise resolves once
   * it is on disk. On a write error every claim of that write is taken back
   * (unless changed since) and its promise rejects with LB_ERR_STATE_WRITE.
   */
  setSoon(service: string, claim: { address: string; pool: string }, wallNow: number): Promise<PoolClaim> {
    const claims = this.load();
    const prev = claims.get(service);
    if (prev && prev.address === claim.address && prev.pool === claim.pool && !this.pending?.some((p) => p.service === service)) return Promise.resolve(prev);
    const next: PoolClaim = { address: claim.address, pool: claim.pool, claimedAt: prev?.address === claim.address ? prev.claimedAt : isoTime(wallNow) };
    this.writable().set(service, next);
    return new Promise<PoolClaim>((resolve, reject) => {
      if (this.pending === undefined) {
        this.pending = [];
        this.defer(() => this.flush());
      }
      this.pending.push({ service, claim: next, prev, resolve, reject });
    });
  }

  /** Delete a service's claim (service removed from the config). True if there was one. */
  delete(service: string): boolean {
    const claims = this.load();
    if (!claims.has(service)) return false;
    const copy = new Map(claims);
    copy.delete(service);
    this.persist(copy);
    this.replace(copy);
    return true;
  }

  /** The pending claims of this turn, in one write of the whole document. */
  private flush(): void {
    const batch = this.pending ?? [];
    this.pending = undefined;
    try {
      this.persist(this.load());
    } catch (err) {
      const claims = this.writable();
      for (const p of batch) {
        if (claims.get(p.service) !== p.claim) continue;
        if (p.prev === undefined) claims.delete(p.service);
        else claims.set(p.service, p.prev);
      }
      for (const p of batch) p.reject(err);
      return;
    }
    for (const p of batch) p.resolve(p.claim);
  }

  /** The map to change in place: a copy first when all() handed the current one out. */
  private writable(): Map<string, PoolClaim> {
    const claims = this.load();
    if (!this.shared) return claims;
    const copy = new Map(claims);
    this.replace(copy);
    return copy;
  }

  private replace(claims: Map<string, PoolClaim>): void {
    this.claims = claims;
    this.shared = false;
  }

  private persist(claims: Map<string, PoolClaim>): void {
    const doc: ClaimsDocument = { version: VERSION, claims: Object.fromEntries([...claims].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) };
    this.store.write(this.file, doc);
  }
}
