// lab/within.ts owns the bounded wait on one promise ("did the agent exit
// within 12 s?"). Its timer is cleared as soon as the promise settles: a
// Promise.race against a bare setTimeout leaves that timer holding the event
// loop, so a test file whose work is done sat out the rest of the bound
// before it could exit (up to 12 s per file in CI, against a 20-minute
// budget for the whole suite).

/** What within() returns when the bound ran out first. */
export const TIMED_OUT: unique symbol = Symbol('timed out');

/** p's value if it settles within ms, else TIMED_OUT; p's rejection passes through. */
export async function within<T>(p: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<typeof TIMED_OUT>((r) => { timer = setTimeout(() => r(TIMED_OUT), ms); })]);
  } finally {
    clearTimeout(timer);
  }
}
