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
 * it in memory and rewrites the whole document on each change: a handful of
 * services, a few hundred bytes, and one atomic rename keeps the file
 * consistent (never half of a change).
 */
export class ClaimStore {
  private readonly store: StateStore;
  private readonly log: Logger | undefined;
  private readonly file: string;
  private claims: Map<string, PoolClaim> | undefined;

  constructor(opts: { store: StateStore; log?: Logger | undefined; file?: string }) {
    this.store = opts.store;
    this.log = opts.log?.child({ module: 'ipam.claims' });
    this.file = opts.file ?? CLAIMS_FILE;
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

  /** Every claim, by service key. */
  all(): ReadonlyMap<string, PoolClaim> {
    return new Map(this.load());
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
    this.claims = copy;
    return next;
  }

  /** Delete a service's claim (service removed from the config). True if there was one. */
  delete(service: string): boolean {
    const claims = this.load();
    if (!claims.has(service)) return false;
    const copy = new Map(claims);
    copy.delete(service);
    this.persist(copy);
    this.claims = copy;
    return true;
  }

  private persist(claims: Map<string, PoolClaim>): void {
    const doc: ClaimsDocument = { version: VERSION, claims: Object.fromEntries([...claims].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) };
    this.store.write(this.file, doc);
  }
}
