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
  /** The VIPs whose rules are in the kernel now (served or armed). */
  private vips = new Set<string>();
  /** The services the last committed state forwards to at least one backend. */
  private serving = new Set<string>();

  constructor(private readonly opts: ApplyLoopOptions) {}

  /** Are this VIP's rules in place now? (A takeover of it need not wait for an apply.) */
  hasVip(vip: string): boolean { return this.vips.has(vip); }

  /** Does the state in place forward this service to a healthy backend? */
  serves(key: string): boolean { return this.serving.has(key); }

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
    const next = new Set<string>();
    const nextServing = new Set<string>();
    for (const f of state) {
      if (f.vip === undefined) continue;
      next.add(f.vip);
      if (f.healthy.length > 0) nextServing.add(f.key);
    }
    const before = this.vips;
    const beforeServing = this.serving;
    // The table is swapped in one transaction: a VIP in both the old and the
    // new table is covered throughout the apply, one leaving it may be gone
    // at any moment, one joining it only once it is done.
    this.vips = new Set<string>();
    for (const v of before) if (next.has(v)) this.vips.add(v);
    this.serving = new Set<string>();
    for (const k of beforeServing) if (nextServing.has(k)) this.serving.add(k);
    try {
      await this.opts.apply(state);
    } catch (e) {
      // A failed transaction is not committed: the old table stands.
      this.vips = before;
      this.serving = beforeServing;
      throw e;
    }
    this.vips = next;
    let servingChanged = nextServing.size !== beforeServing.size;
    if (!servingChanged) for (const k of nextServing) if (!beforeServing.has(k)) { servingChanged = true; break; }
    this.serving = nextServing;
    // Readiness follows the applied table.
    if (servingChanged) this.opts.onServingChanged();
  }
}
