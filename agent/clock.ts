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

/**
 * `new Date(ms).toISOString()`, written from the UTC fields. V8's own
 * toISOString (and toJSON, and JSON.stringify of a Date) also looks up the
 * local time zone's display name on every call (its ToDateString computes it
 * for every format), which pages ~0.9 MiB of ICU's time-zone data and code
 * of the `node` binary into the agent's RSS for good. Every
 * timestamp the agent writes - log lines, state files, the status
 * document - goes through here instead.
 */
export function isoTime(ms: number): string {
  const d = new Date(ms);
  const y = d.getUTCFullYear();
  // Outside 0000-9999 (never a real timestamp), or invalid: V8's, with its +/-YYYYYY form and its RangeError.
  if (!(y >= 0 && y <= 9999)) return d.toISOString();
  const p2 = (n: number): string => (n < 10 ? `0${n}` : `${n}`);
  const ms3 = d.getUTCMilliseconds();
  return `${y < 1000 ? `${y}`.padStart(4, '0') : y}-${p2(d.getUTCMonth() + 1)}-${p2(d.getUTCDate())}T${p2(d.getUTCHours())}:${p2(d.getUTCMinutes())}:${p2(d.getUTCSeconds())}.${ms3 < 10 ? `00${ms3}` : ms3 < 100 ? `0${ms3}` : ms3}Z`;
}

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
