// The apply loop: every change (a VIP gained or lost, a health verdict, a
// VRRP transition, a reload) asks for one data path transaction; changes
// that arrive while one is under way fold into one more. It knows which
// VIPs and which services the kernel (or the proxy) forwards now, as the
// last committed transaction left them, and during a start it batches the
// writes while address sources are still acquiring.
import { errorMessage } from '../errors';
import type { Logger } from '../log';
import type { Clock } from '../clock';
import type { ForwardService } from './subsystems';

export interface ApplyLoopOptions {
  readonly log: Logger;
  readonly clock: Clock;
  /** The forwarding state to apply, read when a transaction starts (never a copy taken earlier). */
  state(): ForwardService[];
  /** One transaction; rejects when it was not committed (the old state stands). */
  apply(state: readonly ForwardService[]): Promise<void>;
  /** Whether a start's address source is still acquiring, so a write may wait for it (Daemon.acquiringForBatch). */
  acquiring(): boolean;
  /** The longest a change waits for the start's batch (ms). */
  readonly batchMs: number;
  /** The set of services forwarded to a healthy backend changed with the last commit. */
  onServingChanged(): void;
  /** The loop went idle (after the last transaction of a burst). */
  onIdle(): void;
}

export class ApplyLoop {
  private running: Promise<void> | undefined;
  private again = false;
  private forced = false;
  private stopped = false;
  private batchSince: number | undefined;
  private batchTimer: NodeJS.Timeout | undefined;
  /** The state of the last committed transaction (a copy of the array: its services by identity). */
  private last: readonly ForwardService[] = [];
  /** How many services of the last committed state carry each VIP: its rules are in the kernel (served or armed). */
  private readonly vipUsers = new Map<string, number>();
  /** How many services of the last committed state under each key forward to at least one backend. */
  private readonly servingUsers = new Map<string, number>();
  /** While a transaction is under way: the VIPs and serving keys it takes away (they may be gone at any moment). */
  private leaving: { readonly vips: ReadonlySet<string>; readonly keys: ReadonlySet<string> } | undefined;

  constructor(private readonly opts: ApplyLoopOptions) {}

  /** Are this VIP's rules in place now? (A takeover of it need not wait for an apply.) */
  hasVip(vip: string): boolean { return (this.vipUsers.get(vip) ?? 0) > 0 && this.leaving?.vips.has(vip) !== true; }

  /** Does the state in place forward this service to a healthy backend? */
  serves(key: string): boolean { return (this.servingUsers.get(key) ?? 0) > 0 && this.leaving?.keys.has(key) !== true; }

  /** A transaction soon (coalesced with the changes of this turn, batched during a start). */
  schedule(): void {
    if (this.stopped) return;
    if (this.running) { this.again = true; return; }
    this.running = this.loop().finally(() => { this.running = undefined; this.opts.onIdle(); });
  }

  /** A transaction now, not batched; resolves once the loop is idle. */
  async now(): Promise<void> {
    this.forced = true;
    this.schedule();
    while (this.running) await this.running;
  }

  /** No more transactions; waits for the one under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.batchTimer) { clearTimeout(this.batchTimer); this.batchTimer = undefined; }
    await this.running?.catch(() => undefined);
  }

  /** Wait for the transaction under way, if any. */
  async idle(): Promise<void> {
    await this.running?.catch(() => undefined);
  }

  /** How long the next transaction should wait (ms, 0: now): see Daemon.acquiringForBatch. */
  private batchWait(): number {
    if (!this.opts.acquiring()) return 0;
    const now = this.opts.clock.now();
    this.batchSince ??= now;
    return Math.max(0, this.batchSince + this.opts.batchMs - now);
  }

  private async loop(): Promise<void> {
    do {
      // Changes of this turn of the loop are in the state read after it.
      await new Promise((r) => setImmediate(r));
      this.again = false;
      if (this.stopped) break;
      const wait = this.forced ? 0 : this.batchWait();
      if (wait > 0) {
        this.batchTimer ??= setTimeout(() => { this.batchTimer = undefined; this.schedule(); }, wait);
        break;
      }
      this.forced = false;
      this.batchSince = undefined;
      if (this.batchTimer) { clearTimeout(this.batchTimer); this.batchTimer = undefined; }
      try {
        await this.transaction();
      } catch (e) {
        this.opts.log.error({ op: 'apply', err: errorMessage(e) }, 'dataplane update failed; will retry on the next change');
      }
    } while (this.again && !this.stopped);
  }

  private async transaction(): Promise<void> {
    const state = this.opts.state();
    // What changed since the last commit, by identity: the daemon hands over
    // the same object for a service whose forwarding state did not change,
    // so a health transition among a thousand services counts one.
    const vipDelta = new Map<string, number>();
    const keyDelta = new Map<string, number>();
    const count = (f: ForwardService | undefined, by: number): void => {
      if (f?.vip === undefined) return;
      vipDelta.set(f.vip, (vipDelta.get(f.vip) ?? 0) + by);
      if (f.healthy.length > 0) keyDelta.set(f.key, (keyDelta.get(f.key) ?? 0) + by);
    };
    const n = Math.max(state.length, this.last.length);
    for (let i = 0; i < n; i++) {
      if (state[i] === this.last[i]) continue;
      count(this.last[i], -1);
      count(state[i], 1);
    }
    const after = (users: ReadonlyMap<string, number>, k: string, d: number): number => (users.get(k) ?? 0) + d;
    const gone = (users: ReadonlyMap<string, number>, delta: ReadonlyMap<string, number>): Set<string> => {
      const out = new Set<string>();
      for (const [k, d] of delta) if (d < 0 && (users.get(k) ?? 0) > 0 && after(users, k, d) <= 0) out.add(k);
      return out;
    };
    // The table is swapped in one transaction: a VIP in both the old and the
    // new table is covered throughout the apply, one leaving it may be gone
    // at any moment, one joining it only once it is done.
    this.leaving = { vips: gone(this.vipUsers, vipDelta), keys: gone(this.servingUsers, keyDelta) };
    try {
      await this.opts.apply(state);
    } catch (e) {
      // A failed transaction is not committed: the old table stands.
      this.leaving = undefined;
      throw e;
    }
    this.leaving = undefined;
    this.last = state.slice();
    const commit = (users: Map<string, number>, delta: ReadonlyMap<string, number>): boolean => {
      let crossed = false;
      for (const [k, d] of delta) {
        if (d === 0) continue;
        const was = users.get(k) ?? 0;
        const now = was + d;
        if (now > 0) users.set(k, now);
        else users.delete(k);
        if ((was > 0) !== (now > 0)) crossed = true;
      }
      return crossed;
    };
    commit(this.vipUsers, vipDelta);
    // Readiness follows the applied table.
    if (commit(this.servingUsers, keyDelta)) this.opts.onServingChanged();
  }
}
