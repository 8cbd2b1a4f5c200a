// Time as a dependency: pure state machines take `now` as an argument and
// drivers take a Clock, so tests run a 12-hour lease in milliseconds.

export interface Clock {
  /** Milliseconds, monotonic enough for timers (performance.now based). */
  now(): number;
  /** Wall-clock milliseconds since the epoch, for persisted timestamps. */
  wallNow(): number;
  setTimeout(fn: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

export interface TimerHandle {
  unref?(): unknown;
}

export const realClock: Clock = {
  now: () => performance.timeOrigin + performance.now(),
  wallNow: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, Math.max(0, ms)),
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** A manually advanced clock for tests of drivers. */
export class ManualClock implements Clock {
  private t: number;
  private readonly wallOffset: number;
  private timers: { at: number; fn: () => void; seq: number; cancelled: boolean }[] = [];
  private seq = 0;

  constructor(start = 1_000_000, wallStart = Date.UTC(2026, 0, 1)) {
    this.t = start;
    this.wallOffset = wallStart - start;
  }
  now(): number { return this.t; }
  wallNow(): number { return this.t + this.wallOffset; }
  setTimeout(fn: () => void, ms: number): TimerHandle {
    const timer = { at: this.t + Math.max(0, ms), fn, seq: this.seq++, cancelled: false };
    this.timers.push(timer);
    return timer as unknown as TimerHandle;
  }
  clearTimeout(handle: TimerHandle): void {
    (handle as unknown as { cancelled: boolean }).cancelled = true;
  }
  /** Advance time, firing due timers in order. */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      const due = this.timers
        .filter((x) => !x.cancelled && x.at <= end)
        .sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!due) break;
      this.t = due.at;
      due.cancelled = true;
      due.fn();
    }
    this.timers = this.timers.filter((x) => !x.cancelled);
    this.t = end;
  }
}
