// Probe scheduler (driver core, injected clock): runs one task per key on a
// fixed per-key grid, all keys on ONE timer. A binary min-heap orders the next
// due times and a single clock.setTimeout is armed for the earliest, so 10,000
// keys at a 1 s period cost one timer, O(log n) per probe, and no drift.
// Knows nothing about sockets or health: it calls `run(key, slot, signal)`.
//
// Timing rules:
// - A key is run at once when added (when started), then on the grid
//   first + phase + k*period (k >= 1), with phase uniform in [0, period):
//   10,000 keys added together are probed together once (bounded by
//   maxInFlight), then spread evenly over the period.
// - Each run is moved by a jitter uniform in [-jitter, +jitter] * period
//   around its grid point (HAProxy spread-checks, Envoy interval_jitter); the
//   grid itself does not move, so jitter never accumulates.
// - At most maxInFlight runs at once. A run that finds no free slot waits in a
//   FIFO and starts as soon as one frees; its grid is unaffected, so a
//   saturated scheduler delays probes but keeps the schedule.
// - A key never runs twice at once: a grid point that comes while the key's
//   previous run is still in flight or waiting is skipped (counted, 'busy').
//   If the timer itself fell more than a period behind (a blocked event loop),
//   the missed grid points are skipped, not replayed in a burst ('overrun').
import type { Clock, TimerHandle } from '../clock';

/** What a run is for: the grid time it stands for (or its add time). */
export interface Slot {
  /** The grid point (clock ms) this run stands for, without jitter. */
  readonly base: number;
  /** When it was due, jitter included. */
  readonly due: number;
  /** When it actually started (>= due unless the timer fired early). */
  readonly started: number;
}

export type SkipReason = 'busy' | 'overrun';

export interface SchedulerOptions {
  readonly clock: Clock;
  /** Performs one run; must settle. Rejections are swallowed. */
  readonly run: (key: string, slot: Slot, signal: AbortSignal) => Promise<void>;
  /** Concurrent runs at most (>= 1). */
  readonly maxInFlight?: number;
  /** Jitter as a fraction of the period, 0 .. 0.5 (default 0.05). */
  readonly jitter?: number;
  /** Uniform [0, 1) source; injectable for deterministic tests. */
  readonly random?: () => number;
  /** Called when a grid point is skipped. */
  readonly onSkip?: (key: string, reason: SkipReason, count: number) => void;
}

export interface SchedulerStats {
  readonly keys: number;
  readonly inFlight: number;
  readonly waiting: number;
  readonly launched: number;
  readonly skippedBusy: number;
  readonly skippedOverrun: number;
  /** Largest start - due seen, ms: how far behind the schedule ran. */
  readonly maxLagMs: number;
}

interface Entry {
  readonly key: string;
  period: number;
  /** Next grid point not yet in the heap. */
  nextBase: number;
  /** Base of the last run fired; undefined while the first run is pending. */
  lastBase: number | undefined;
  /** Bumped whenever the entry's heap node becomes stale. */
  gen: number;
  inFlight: boolean;
  waiting: boolean;
  /** The slot a waiting run will use. */
  pending: { base: number; due: number } | undefined;
  abort: AbortController | undefined;
}

interface HeapNode { due: number; base: number; gen: number; entry: Entry }

/** A binary min-heap on `due`; stale nodes (gen mismatch) are dropped lazily. */
class MinHeap {
  private readonly a: HeapNode[] = [];
  get size(): number { return this.a.length; }
  peek(): HeapNode | undefined { return this.a[0]; }
  push(n: HeapNode): void {
    const a = this.a;
    a.push(n);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (a[p]!.due <= n.due) break;
      a[i] = a[p]!;
      i = p;
    }
    a[i] = n;
  }
  pop(): HeapNode | undefined {
    const a = this.a;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last) {
      let i = 0;
      const n = a.length;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= n) break;
        const r = l + 1;
        const c = r < n && a[r]!.due < a[l]!.due ? r : l;
        if (a[c]!.due >= last.due) break;
        a[i] = a[c]!;
        i = c;
      }
      a[i] = last;
    }
    return top;
  }
  clear(): void { this.a.length = 0; }
}

export class ProbeScheduler {
  private readonly clock: Clock;
  private readonly runFn: SchedulerOptions['run'];
  private readonly maxInFlight: number;
  private readonly jitter: number;
  private readonly random: () => number;
  private readonly onSkip: SchedulerOptions['onSkip'];
  private readonly entries = new Map<string, Entry>();
  private readonly heap = new MinHeap();
  /** FIFO of entries waiting for a slot (array + head index: O(1) dequeue). */
  private waitQ: Entry[] = [];
  private waitHead = 0;
  private timer: TimerHandle | undefined;
  private timerAt = Infinity;
  private running = false;
  private inFlight = 0;
  private launched = 0;
  private skippedBusy = 0;
  private skippedOverrun = 0;
  private maxLagMs = 0;

  constructor(opts: SchedulerOptions) {
    this.clock = opts.clock;
    this.runFn = opts.run;
    this.maxInFlight = Math.max(1, Math.floor(opts.maxInFlight ?? 256));
    this.jitter = Math.min(0.5, Math.max(0, opts.jitter ?? 0.05));
    this.random = opts.random ?? Math.random;
    this.onSkip = opts.onSkip;
  }

  has(key: string): boolean { return this.entries.has(key); }

  /** Add a key; when running, its first run is due at once. */
  add(key: string, periodMs: number): void {
    if (this.entries.has(key)) { this.setPeriod(key, periodMs); return; }
    const e: Entry = { key, period: periodMs, nextBase: 0, lastBase: undefined, gen: 0, inFlight: false, waiting: false, pending: undefined, abort: undefined };
    this.entries.set(key, e);
    if (this.running) this.scheduleFirst(e, this.clock.now());
  }

  /** Change a key's period; the next run is one new period after the last grid point (or now). */
  setPeriod(key: string, periodMs: number): void {
    const e = this.entries.get(key);
    if (!e || e.period === periodMs) return;
    e.period = periodMs;
    if (!this.running) return;
    if (e.lastBase === undefined) {
      // The first run is still pending: only the grid after it changes.
      e.nextBase = this.clock.now() + periodMs + this.random() * periodMs;
      return;
    }
    this.scheduleAt(e, Math.max(e.lastBase + periodMs, this.clock.now()));
  }

  /**
   * Run a key as soon as a slot is free (a new subscriber wants an answer now),
   * then restart its grid from here. No-op while it is in flight or waiting:
   * that run's result is as fresh.
   */
  runSoon(key: string): void {
    const e = this.entries.get(key);
    if (!e || !this.running || e.inFlight || e.waiting) return;
    this.scheduleFirst(e, this.clock.now());
  }

  /** Remove a key; an in-flight run is aborted. */
  remove(key: string): void {
    const e = this.entries.get(key);
    if (!e) return;
    this.entries.delete(key);
    e.gen++;
    e.waiting = false;
    e.abort?.abort();
  }

  /** Start: every key is due at once. */
  start(): void {
    if (this.running) return;
    this.running = true;
    const now = this.clock.now();
    for (const e of this.entries.values()) this.scheduleFirst(e, now, false);
    this.arm();
  }

  /** Stop: no more runs; in-flight runs are aborted. Keys are kept. */
  stop(): void {
    if (!this.running) return;
    this.running = false;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = Infinity;
    this.heap.clear();
    for (const e of this.entries.values()) {
      e.gen++;
      e.waiting = false;
      e.pending = undefined;
      e.abort?.abort();
    }
    this.waitQ = [];
    this.waitHead = 0;
  }

  stats(): SchedulerStats {
    return {
      keys: this.entries.size, inFlight: this.inFlight, waiting: this.waitQ.length - this.waitHead,
      launched: this.launched, skippedBusy: this.skippedBusy, skippedOverrun: this.skippedOverrun, maxLagMs: this.maxLagMs,
    };
  }

  // --- internals -------------------------------------------------------------

  /** Due now; the grid restarts at now + phase + period. */
  private scheduleFirst(e: Entry, now: number, arm = true): void {
    e.gen++;
    e.lastBase = undefined;
    this.heap.push({ due: now, base: now, gen: e.gen, entry: e });
    // The grid that follows: phase spreads keys over the period.
    e.nextBase = now + e.period + this.random() * e.period;
    if (arm) this.arm();
  }

  private scheduleAt(e: Entry, base: number): void {
    e.gen++;
    e.nextBase = base;
    this.pushNext(e);
    this.arm();
  }

  /** Push e.nextBase (with jitter) and advance the grid by one period. */
  private pushNext(e: Entry): void {
    const j = this.jitter > 0 ? (this.random() * 2 - 1) * this.jitter * e.period : 0;
    this.heap.push({ due: e.nextBase + j, base: e.nextBase, gen: e.gen, entry: e });
    e.nextBase += e.period;
  }

  private arm(): void {
    if (!this.running) return;
    // Drop stale tops so the timer is armed for a live node.
    let top = this.heap.peek();
    while (top && (top.gen !== top.entry.gen || !this.entries.has(top.entry.key))) {
      this.heap.pop();
      top = this.heap.peek();
    }
    if (!top) {
      if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
      this.timer = undefined;
      this.timerAt = Infinity;
      return;
    }
    if (this.timer !== undefined && this.timerAt <= top.due) return;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    const now = this.clock.now();
    this.timerAt = top.due;
    this.timer = this.clock.setTimeout(() => this.onTimer(), Math.max(0, Math.ceil(top.due - now)));
  }

  private onTimer(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    if (!this.running) return;
    const now = this.clock.now();
    for (;;) {
      const top = this.heap.peek();
      if (!top || top.due > now) break;
      this.heap.pop();
      const e = top.entry;
      if (top.gen !== e.gen || !this.entries.has(e.key)) continue;
      this.fire(e, top, now);
    }
    this.arm();
  }

  private fire(e: Entry, node: HeapNode, now: number): void {
    // The next grid point first, so a slow or waiting run never moves it.
    // Missed grid points (timer more than a period late) are skipped.
    e.lastBase = node.base;
    if (e.nextBase <= now) {
      const missed = Math.floor((now - e.nextBase) / e.period) + 1;
      e.nextBase += missed * e.period;
      this.skippedOverrun += missed;
      this.onSkip?.(e.key, 'overrun', missed);
    }
    this.pushNext(e);
    if (e.inFlight || e.waiting) {
      this.skippedBusy++;
      this.onSkip?.(e.key, 'busy', 1);
      return;
    }
    if (this.inFlight < this.maxInFlight) {
      this.launch(e, node.base, node.due, now);
    } else {
      e.waiting = true;
      e.pending = { base: node.base, due: node.due };
      this.waitQ.push(e);
    }
  }

  private launch(e: Entry, base: number, due: number, now: number): void {
    e.inFlight = true;
    this.inFlight++;
    this.launched++;
    const lag = now - due;
    if (lag > this.maxLagMs) this.maxLagMs = lag;
    const ac = new AbortController();
    e.abort = ac;
    let p: Promise<void>;
    try {
      p = this.runFn(e.key, { base, due, started: now }, ac.signal);
    } catch (err) {
      p = Promise.reject(err);
    }
    p.catch(() => { /* a run reports its own failures */ }).finally(() => {
      e.inFlight = false;
      if (e.abort === ac) e.abort = undefined;
      this.inFlight--;
      this.drain();
    });
  }

  /** Start waiting runs while slots are free. */
  private drain(): void {
    if (!this.running) return;
    while (this.inFlight < this.maxInFlight && this.waitHead < this.waitQ.length) {
      const e = this.waitQ[this.waitHead++]!;
      if (!e.waiting || !this.entries.has(e.key) || !e.pending) continue;
      e.waiting = false;
      const { base, due } = e.pending;
      e.pending = undefined;
      this.launch(e, base, due, this.clock.now());
    }
    if (this.waitHead > 1024 && this.waitHead * 2 > this.waitQ.length) {
      this.waitQ = this.waitQ.slice(this.waitHead);
      this.waitHead = 0;
    }
  }
}
