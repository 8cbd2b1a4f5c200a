// Probe scheduler (driver core, injected clock): runs one task per key on a
// fixed per-key grid, all keys on ONE timer. A binary min-heap orders the next
// due times and a single clock.setTimeout is armed for the earliest, so 10,000
// keys at a 1 s period cost one timer, O(log n) per probe, and no drift.
// Knows nothing about sockets or health: it calls `run(run)` and the runner
// calls `run.done()` when it is over.
//
// Cost per run (at 10,000 probes/s the scheduler was a large part
// of the checker's own cost): the heap lives in typed arrays (due, grid point,
// key index, generation), so a sift touches contiguous numbers, not objects;
// a run is one object per key, reused once its runner called done(); no
// Promise, AbortController, closure or Map lookup per run.
//
// Timing rules:
// - A key is run at once when added (when started): a new service's first
//   verdict does not wait for its place in the period. Its grid then starts
//   at the first point at least one period later that falls on its phase:
//   grid points are phase*period + k*period on the clock, the same points
//   whenever the key's grid is restarted (runSoon, a new subscriber), so
//   a reload leaves every key where it was. By default the phase of the
//   key in slot i is frac((i + 1) * 0.618...), the golden-ratio sequence:
//   the first n slots split the period into gaps of at most three lengths
//   (Steinhaus' three-gap theorem), so at any moment about 1/period of the
//   keys are due, and a slot freed by a removed key is taken, phase and
//   all, by the next key added. 10,000 keys added together are probed
//   together once (bounded by maxInFlight), then evenly over the period, as
//   HAProxy spreads its checks (spread-checks) rather than bunching them.
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
// - runExtra() runs a key once now, outside its grid (the grid stays where
//   it is): a result wanted sooner than the next grid point.
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

/** One run in progress: the slot it stands for, and how it ends. */
export interface Run<T = unknown> extends Slot {
  readonly key: string;
  /** What the key was added with: the runner's own object, so a run needs no lookup by key. */
  readonly data: T;
  /** True once the run was abandoned (its key removed, the scheduler stopped): its outcome must be ignored. */
  readonly aborted: boolean;
  /** Run by runExtra(), outside the key's grid; its base is when it was asked for. */
  readonly extra: boolean;
  /** The runner's own handle on what it started (a probe id, an AbortController), for onAbort. */
  token: unknown;
  /**
   * Ends the run and frees its slot; a no-op once the run was abandoned.
   * Call it once: the object is reused for the key's next run.
   */
  done(): void;
}

export type SkipReason = 'busy' | 'overrun';

export interface SchedulerOptions<T = unknown> {
  readonly clock: Clock;
  /**
   * Starts one run. The runner calls run.done() when it is over, at once or
   * later; a run that throws is over.
   */
  readonly run: (run: Run<T>) => void;
  /**
   * A run in flight was abandoned (remove, stop): its slot is already free and
   * done() will be ignored; the runner may cancel what it started.
   */
  readonly onAbort?: (run: Run<T>) => void;
  /** Concurrent runs at most (>= 1). */
  readonly maxInFlight?: number;
  /** Jitter as a fraction of the period, 0 .. 0.5 (default 0.05). */
  readonly jitter?: number;
  /** Uniform [0, 1) source for jitter; injectable for deterministic tests. */
  readonly random?: () => number;
  /**
   * A key's phase, a fraction of its period in [0, 1), asked once when it
   * is added; `slot` is its index, reused after a removal. Default
   * spreadPhase(slot): even spacing. Tests pin phases here.
   */
  readonly phase?: (key: string, slot: number) => number;
  /** Called when a grid point is skipped. */
  readonly onSkip?: (key: string, reason: SkipReason, count: number) => void;
  /**
   * Timer coalescing, ms (default 0: each due time its own wake-up). With q >
   * 0 the timer fires on multiples of q, so grid runs due within one q start
   * together, up to q late: fewer event-loop wake-ups and larger probe
   * batches, at 10,000 probes/s the difference between a thousand wake-ups a
   * second and a hundred. Runs wanted at once (add, start, runSoon) are not
   * delayed.
   */
  readonly coalesceMs?: number;
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

interface Entry<T> {
  readonly key: string;
  /** Its place in ProbeScheduler.byIndex, which heap slots refer to. */
  readonly index: number;
  data: T;
  /** False once removed: its heap slots and a waiting run are stale. */
  live: boolean;
  period: number;
  /** Where in its period the key's grid points fall, [0, 1). */
  phase: number;
  /** Next grid point not yet in the heap. */
  nextBase: number;
  /** Base of the last run fired; undefined while the first run is pending. */
  lastBase: number | undefined;
  /** The generation of the entry's one live heap slot; any other slot of it is stale. */
  gen: number;
  inFlight: boolean;
  waiting: boolean;
  /** The slot a waiting run will use. */
  pendingBase: number;
  pendingDue: number;
  /** The waiting run was asked for by runExtra(). */
  pendingExtra: boolean;
  /** The run in flight. */
  current: RunNode<T> | undefined;
  /** The last run's object, ended by done(): the next run reuses it. */
  spare: RunNode<T> | undefined;
}

class RunNode<T> implements Run<T> {
  due = 0;
  base = 0;
  started = 0;
  aborted = false;
  finished = false;
  extra = false;
  token: unknown = undefined;
  constructor(private readonly owner: { finish(run: RunNode<T>): void }, readonly entry: Entry<T>) {}
  get key(): string { return this.entry.key; }
  get data(): T { return this.entry.data; }
  done(): void { this.owner.finish(this); }
}

/**
 * A binary min-heap on due time, in typed arrays. Slots are (due, base, key
 * index, generation); a slot whose generation is not its entry's is stale and
 * dropped when it reaches the top. pop() leaves the top in top*.
 */
class SlotHeap {
  private due = new Float64Array(1024);
  private base = new Float64Array(1024);
  private ent = new Int32Array(1024);
  private gen = new Float64Array(1024);
  size = 0;
  topDue = 0;
  topBase = 0;
  topEnt = 0;
  topGen = 0;

  peekDue(): number { return this.due[0]!; }
  peekEnt(): number { return this.ent[0]!; }
  peekGen(): number { return this.gen[0]!; }

  push(due: number, base: number, ent: number, gen: number): void {
    if (this.size === this.due.length) this.grow();
    let i = this.size++;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this.due[p]! <= due) break;
      this.move(p, i);
      i = p;
    }
    this.due[i] = due;
    this.base[i] = base;
    this.ent[i] = ent;
    this.gen[i] = gen;
  }

  pop(): void {
    this.topDue = this.due[0]!;
    this.topBase = this.base[0]!;
    this.topEnt = this.ent[0]!;
    this.topGen = this.gen[0]!;
    const n = --this.size;
    if (n === 0) return;
    const due = this.due[n]!;
    const base = this.base[n]!;
    const ent = this.ent[n]!;
    const gen = this.gen[n]!;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && this.due[r]! < this.due[l]! ? r : l;
      if (this.due[c]! >= due) break;
      this.move(c, i);
      i = c;
    }
    this.due[i] = due;
    this.base[i] = base;
    this.ent[i] = ent;
    this.gen[i] = gen;
  }

  clear(): void { this.size = 0; }

  private move(from: number, to: number): void {
    this.due[to] = this.due[from]!;
    this.base[to] = this.base[from]!;
    this.ent[to] = this.ent[from]!;
    this.gen[to] = this.gen[from]!;
  }

  private grow(): void {
    const n = this.due.length * 2;
    const due = new Float64Array(n); due.set(this.due); this.due = due;
    const base = new Float64Array(n); base.set(this.base); this.base = base;
    const ent = new Int32Array(n); ent.set(this.ent); this.ent = ent;
    const gen = new Float64Array(n); gen.set(this.gen); this.gen = gen;
  }
}

/** (sqrt(5) - 1) / 2: the golden-ratio sequence's step. */
const GOLDEN = (Math.sqrt(5) - 1) / 2;

/**
 * The default phase of the key in slot i: frac((i + 1) * 0.618...), the
 * golden-ratio (Weyl) sequence, whose first n points, for every n, split
 * [0, 1) into gaps of at most three lengths, the largest under 2.62/n.
 */
export function spreadPhase(slot: number): number {
  // From i + 1: no key's phase is exactly 0, the period's boundary.
  const x = (slot + 1) * GOLDEN;
  return x - Math.floor(x);
}

export class ProbeScheduler<T = undefined> {
  private readonly clock: Clock;
  private readonly runFn: SchedulerOptions<T>['run'];
  private readonly onAbort: SchedulerOptions<T>['onAbort'];
  private readonly owner = { finish: (run: RunNode<T>): void => this.finish(run) };
  private readonly maxInFlight: number;
  private readonly jitter: number;
  private readonly random: () => number;
  private readonly phaseOf: (key: string, slot: number) => number;
  private readonly onSkip: SchedulerOptions<T>['onSkip'];
  private coalesceMs: number;
  private readonly entries = new Map<string, Entry<T>>();
  /** Entries by index (heap slots name them by index); free indices are reused. */
  private readonly byIndex: (Entry<T> | undefined)[] = [];
  private readonly freeIndex: number[] = [];
  /** Generations are unique across entries, so a reused index never revives a stale slot. */
  private genCounter = 0;
  private readonly heap = new SlotHeap();
  /** FIFO of entries waiting for a slot (array + head index: O(1) dequeue). */
  private waitQ: Entry<T>[] = [];
  private waitHead = 0;
  private timer: TimerHandle | undefined;
  private timerAt = Infinity;
  private readonly onTimerFn = (): void => this.onTimer();
  private running = false;
  private draining = false;
  private inFlight = 0;
  private launched = 0;
  private skippedBusy = 0;
  private skippedOverrun = 0;
  private maxLagMs = 0;

  constructor(opts: SchedulerOptions<T>) {
    this.clock = opts.clock;
    this.runFn = opts.run;
    this.onAbort = opts.onAbort;
    this.maxInFlight = Math.max(1, Math.floor(opts.maxInFlight ?? 256));
    this.jitter = Math.min(0.5, Math.max(0, opts.jitter ?? 0.05));
    this.random = opts.random ?? Math.random;
    this.phaseOf = opts.phase ?? ((_key, slot) => spreadPhase(slot));
    this.onSkip = opts.onSkip;
    this.coalesceMs = Math.max(0, opts.coalesceMs ?? 0);
  }

  has(key: string): boolean { return this.entries.has(key); }

  /** Change the timer coalescing (see SchedulerOptions.coalesceMs); applies from the next arming. */
  setCoalesce(ms: number): void {
    this.coalesceMs = Math.max(0, ms);
  }

  /** Add a key with the data its runs carry; when running, its first run is due at once. An existing key takes the new period (and data, if given). */
  add(key: string, periodMs: number, data?: T): void {
    const old = this.entries.get(key);
    if (old) {
      if (data !== undefined) old.data = data;
      this.setPeriod(key, periodMs);
      return;
    }
    const index = this.freeIndex.length > 0 ? this.freeIndex.pop()! : this.byIndex.length;
    const phase = this.phaseOf(key, index);
    const e: Entry<T> = {
      key, index, data: data as T, live: true, period: periodMs, phase: phase >= 0 && phase < 1 ? phase : 0, nextBase: 0, lastBase: undefined, gen: 0,
      inFlight: false, waiting: false, pendingBase: 0, pendingDue: 0, pendingExtra: false, current: undefined, spare: undefined,
    };
    this.byIndex[index] = e;
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
      e.nextBase = gridFrom(e, this.clock.now() + periodMs);
      return;
    }
    // The grid is anchored at the last run: the new period neither shortens
    // the gap to it below one period nor stretches it beyond.
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

  /**
   * Run a key once now (or as soon as a slot is free), outside its grid:
   * the grid points, their phase and the runs they bring stay as they
   * were. The run's `extra` is true and its base is now. False (nothing
   * started) while the key is in flight or waiting, or not running: the
   * run under way is as fresh.
   */
  runExtra(key: string): boolean {
    const e = this.entries.get(key);
    if (!e || !this.running || e.inFlight || e.waiting) return false;
    const now = this.clock.now();
    this.launchOrWait(e, now, now, now, true);
    return true;
  }

  /** Remove a key; an in-flight run is aborted. */
  remove(key: string): void {
    const e = this.entries.get(key);
    if (!e) return;
    this.entries.delete(key);
    e.live = false;
    e.gen = ++this.genCounter;
    e.waiting = false;
    this.byIndex[e.index] = undefined;
    this.freeIndex.push(e.index);
    this.abandon(e);
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
      e.gen = ++this.genCounter;
      e.waiting = false;
      this.abandon(e);
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

  /** Due now; the grid restarts at its first point one period or more later. */
  private scheduleFirst(e: Entry<T>, now: number, arm = true): void {
    e.lastBase = undefined;
    e.gen = ++this.genCounter;
    this.heap.push(now, now, e.index, e.gen);
    // At least a period after this run: a subscriber takes a grid result
    // only a period after the last one it took.
    e.nextBase = gridFrom(e, now + e.period);
    if (arm) this.arm();
  }

  private scheduleAt(e: Entry<T>, base: number): void {
    e.nextBase = base;
    e.gen = ++this.genCounter;
    this.pushNext(e);
    this.arm();
  }

  /** Push e.nextBase (with jitter) under the entry's current generation, and advance the grid by one period. */
  private pushNext(e: Entry<T>): void {
    const j = this.jitter > 0 ? (this.random() * 2 - 1) * this.jitter * e.period : 0;
    this.heap.push(e.nextBase + j, e.nextBase, e.index, e.gen);
    e.nextBase += e.period;
  }

  /** The top slot is stale: its key was removed or rescheduled since. */
  private topStale(): boolean {
    const e = this.byIndex[this.heap.peekEnt()];
    return e === undefined || e.gen !== this.heap.peekGen();
  }

  private arm(): void {
    if (!this.running) return;
    // Drop stale tops so the timer is armed for a live slot.
    while (this.heap.size > 0 && this.topStale()) this.heap.pop();
    if (this.heap.size === 0) {
      if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
      this.timer = undefined;
      this.timerAt = Infinity;
      return;
    }
    const now = this.clock.now();
    const top = this.heap.peekDue();
    // Coalesced to the next multiple of q, except a run already due (added,
    // started or runSoon): that one is wanted at once.
    const q = this.coalesceMs;
    const due = q > 0 && top > now ? Math.ceil(top / q) * q : top;
    if (this.timer !== undefined && this.timerAt <= due) return;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timerAt = due;
    this.timer = this.clock.setTimeout(this.onTimerFn, Math.max(0, Math.ceil(due - now)));
  }

  private onTimer(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    if (!this.running) return;
    const now = this.clock.now();
    const heap = this.heap;
    while (heap.size > 0 && heap.peekDue() <= now) {
      heap.pop();
      const e = this.byIndex[heap.topEnt];
      if (e === undefined || e.gen !== heap.topGen) continue;
      this.fire(e, heap.topBase, heap.topDue, now);
    }
    this.arm();
  }

  private fire(e: Entry<T>, base: number, due: number, now: number): void {
    // The next grid point first, so a slow or waiting run never moves it.
    // Missed grid points (timer more than a period late) are skipped.
    e.lastBase = base;
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
    this.launchOrWait(e, base, due, now, false);
  }

  /** Run at once when a slot is free; else wait in the FIFO with this slot. */
  private launchOrWait(e: Entry<T>, base: number, due: number, now: number, extra: boolean): void {
    if (this.inFlight < this.maxInFlight) {
      this.launch(e, base, due, now, extra);
      return;
    }
    e.waiting = true;
    e.pendingBase = base;
    e.pendingDue = due;
    e.pendingExtra = extra;
    this.waitQ.push(e);
  }

  private launch(e: Entry<T>, base: number, due: number, now: number, extra = false): void {
    let node = e.spare;
    if (node === undefined) {
      node = new RunNode(this.owner, e);
    } else {
      e.spare = undefined;
      node.aborted = false;
      node.finished = false;
      node.token = undefined;
    }
    node.base = base;
    node.due = due;
    node.started = now;
    node.extra = extra;
    e.inFlight = true;
    e.current = node;
    this.inFlight++;
    this.launched++;
    const lag = now - due;
    if (lag > this.maxLagMs) this.maxLagMs = lag;
    try {
      this.runFn(node);
    } catch {
      // A run reports its own failures; one that throws is simply over.
      this.finish(node);
    }
  }

  /** A run is over (done() or a throw): free its slot and start waiting runs. */
  private finish(node: RunNode<T>): void {
    if (node.finished) return;
    node.finished = true;
    const e = node.entry;
    if (e.current === node) {
      e.current = undefined;
      e.inFlight = false;
    }
    // Its runner is done with it (an abandoned run is not reused: its runner may still hold it).
    if (!node.aborted) e.spare = node;
    this.inFlight--;
    this.drain();
  }

  /** The run in flight of an entry is abandoned: aborted, its slot freed now. */
  private abandon(e: Entry<T>): void {
    const run = e.current;
    if (!run) return;
    run.aborted = true;
    try {
      this.onAbort?.(run);
    } catch {
      // The run is abandoned either way.
    }
    this.finish(run);
  }

  /** Start waiting runs while slots are free (not re-entered from a run that ends at once). */
  private drain(): void {
    if (!this.running || this.draining) return;
    this.draining = true;
    let now: number | undefined;
    try {
      while (this.inFlight < this.maxInFlight && this.waitHead < this.waitQ.length) {
        const e = this.waitQ[this.waitHead++]!;
        if (!e.waiting || !e.live) continue;
        e.waiting = false;
        now ??= this.clock.now();
        this.launch(e, e.pendingBase, e.pendingDue, now, e.pendingExtra);
      }
    } finally {
      this.draining = false;
    }
    if (this.waitHead > 1024 && this.waitHead * 2 > this.waitQ.length) {
      this.waitQ = this.waitQ.slice(this.waitHead);
      this.waitHead = 0;
    }
  }
}

/** The key's first grid point at or after t: phase * period + k * period on the clock. */
function gridFrom(e: { readonly period: number; readonly phase: number }, t: number): number {
  const offset = e.phase * e.period;
  return offset + Math.ceil((t - offset) / e.period) * e.period;
}
