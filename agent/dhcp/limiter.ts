// Start limiter (driver helper, timers only): at most `max` DHCP services
// acquire at once, each after a small random delay, so an agent that starts
// with 50 services does not send 50 DISCOVERs in the same millisecond
// (RFC 2131 §4.4.1 asks clients to desynchronise their start). A slot is
// held from the first DISCOVER until the ACK (only the ARP probe of the
// address remains), or until the service gives up waiting for a server,
// fails or stops; the driver releases it. Link set-up happens before it
// (the slot bounds DHCP exchanges in flight, nothing else).
import type { Registry } from 'prom-client';
import { realClock, type Clock, type TimerHandle } from '../clock';

export interface StartLimiterOptions {
  /** Concurrent acquisitions (DhcpTimings.maxConcurrentStarts). */
  readonly max: number;
  /** Each acquisition first waits a uniform random delay in [0, jitterMs). */
  readonly jitterMs: number;
  readonly clock?: Clock;
  readonly random?: () => number;
}

/** Give the slot back; calling it again does nothing. */
export type ReleaseSlot = () => void;

interface Waiter {
  /** Hand the slot over (or undefined: aborted). */
  readonly settle: (release: ReleaseSlot | undefined) => void;
  timer: TimerHandle | undefined;
  queued: boolean;
  done: boolean;
}

export class StartLimiter {
  private max: number;
  private jitterMs: number;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly queue: Waiter[] = [];
  private running = 0;

  constructor(opts: StartLimiterOptions) {
    this.max = Math.max(1, Math.floor(opts.max));
    this.jitterMs = Math.max(0, opts.jitterMs);
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
  }

  /** A reload's new bounds: a larger max lets waiting starts go at once; jitter applies to later acquisitions. */
  reconfigure(opts: { max: number; jitterMs: number }): void {
    this.max = Math.max(1, Math.floor(opts.max));
    this.jitterMs = Math.max(0, opts.jitterMs);
    this.pump();
  }

  get active(): number { return this.running; }
  get waiting(): number { return this.queue.length; }

  /** Wait for a slot; resolves with its release, or undefined when `signal` aborts first. */
  acquire(signal?: AbortSignal): Promise<ReleaseSlot | undefined> {
    return new Promise((resolve) => {
      if (signal?.aborted) { resolve(undefined); return; }
      const onAbort = (): void => {
        if (w.done) return;
        w.done = true;
        if (w.timer !== undefined) this.clock.clearTimeout(w.timer);
        if (w.queued) this.queue.splice(this.queue.indexOf(w), 1);
        w.settle(undefined);
      };
      const w: Waiter = {
        settle: (r) => { signal?.removeEventListener('abort', onAbort); resolve(r); },
        timer: undefined,
        queued: false,
        done: false,
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      const enqueue = (): void => {
        w.timer = undefined;
        if (w.done) return;
        w.queued = true;
        this.queue.push(w);
        this.pump();
      };
      const delay = this.jitterMs > 0 ? this.random() * this.jitterMs : 0;
      if (delay > 0) w.timer = this.clock.setTimeout(enqueue, delay);
      else enqueue();
    });
  }

  private pump(): void {
    while (this.running < this.max && this.queue.length > 0) {
      const w = this.queue.shift()!;
      w.queued = false;
      w.done = true;
      this.running++;
      let released = false;
      w.settle(() => {
        if (released) return;
        released = true;
        this.running--;
        this.pump();
      });
    }
  }
}

/**
 * The limiter shared by every DHCP service on one registry, i.e. of one
 * agent: the driver's default when the daemon does not pass one. Keyed
 * weakly, so it goes away with the registry.
 */
const shared = new WeakMap<Registry, StartLimiter>();
export function sharedStartLimiter(registry: Registry, opts: StartLimiterOptions): StartLimiter {
  let l = shared.get(registry);
  if (!l) {
    l = new StartLimiter(opts);
    shared.set(registry, l);
  }
  return l;
}
