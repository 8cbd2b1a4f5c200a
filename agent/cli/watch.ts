// `lb-agent status --watch`: the redraw loop. Asks for the status document at
// an interval and redraws the terminal in place (ANSI: home, clear to end);
// an unreachable daemon is shown, not fatal, and asked again next tick.
// SIGINT (Ctrl-C) and SIGTERM stop it with the cursor restored and exit 0.
// Everything it touches is passed in, so the loop is tested without a TTY.
import type { StatusDocument } from '../daemon/daemon';
import { formatStatus } from './format';
import { errorMessage } from '../errors';
import { isoTime } from '../clock';

export const ANSI = {
  home: '\x1b[H',
  clearToEnd: '\x1b[J',
  clearScreen: '\x1b[2J',
  hideCursor: '\x1b[?25l',
  showCursor: '\x1b[?25h',
} as const;

export interface WatchOptions {
  /** One status request (bounded by its own timeout). */
  fetch: () => Promise<StatusDocument>;
  intervalMs: number;
  write: (s: string) => void;
  /** Where the daemon is asked, for the header and the unreachable line. */
  socket: string;
  now?: () => number;
  /** Registers the stop signals; returns the function that unregisters them. */
  onStop?: (stop: () => void) => () => void;
}

/** One screen: a header line with the time and interval, then the status text or why there is none. */
export function renderWatch(r: { doc: StatusDocument } | { error: string }, o: { socket: string; intervalMs: number; now: number }): string {
  const head = `every ${o.intervalMs / 1000}s: lb-agent status (${o.socket})    ${isoTime(o.now)}    Ctrl-C to stop\n\n`;
  const body = 'doc' in r ? formatStatus(r.doc, o.now) : `daemon unreachable: ${r.error}\nretrying every ${o.intervalMs / 1000}s\n`;
  // \x1b[K after each line clears what a longer earlier line left on it.
  return ANSI.home + (head + body).replace(/\n/g, '\x1b[K\n') + ANSI.clearToEnd;
}

const processSignals = (stop: () => void): (() => void) => {
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  return () => { process.off('SIGINT', stop); process.off('SIGTERM', stop); };
};

/** Redraw until stopped; resolves (exit 0) once the cursor is restored. */
export async function watchStatus(opts: WatchOptions): Promise<void> {
  const now = opts.now ?? Date.now;
  let stopped = false;
  let wake: (() => void) | undefined;
  const stop = (): void => { stopped = true; wake?.(); };
  const unregister = (opts.onStop ?? processSignals)(stop);
  opts.write(ANSI.hideCursor + ANSI.clearScreen);
  try {
    while (!stopped) {
      const started = now();
      let r: { doc: StatusDocument } | { error: string };
      try { r = { doc: await opts.fetch() }; } catch (e) { r = { error: errorMessage(e) }; }
      if (stopped) break;
      opts.write(renderWatch(r, { socket: opts.socket, intervalMs: opts.intervalMs, now: now() }));
      const wait = Math.max(0, opts.intervalMs - (now() - started));
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, wait);
        wake = () => { clearTimeout(timer); resolve(); };
      });
      wake = undefined;
    }
  } finally {
    unregister();
    opts.write(ANSI.showCursor);
  }
}
