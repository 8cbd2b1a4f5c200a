// Bench statistics (pure): medians, percentiles, ratios and rounding for the
// numbers the bench areas collect. No I/O. A NaN never becomes a number: a
// missing measurement stays missing all the way to the table.

/** Median of the finite values; NaN when there are none. */
export function median(xs: readonly number[]): number {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Nearest-rank percentile (p in [0, 1]) of the finite values; NaN when there are none. */
export function percentile(xs: readonly number[], p: number): number {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))]!;
}

export function max(xs: readonly number[]): number {
  const s = xs.filter((x) => Number.isFinite(x));
  return s.length ? Math.max(...s) : NaN;
}

export function min(xs: readonly number[]): number {
  const s = xs.filter((x) => Number.isFinite(x));
  return s.length ? Math.min(...s) : NaN;
}

/** a / b, NaN unless both are finite and b is not 0. */
export function ratio(a: number, b: number): number {
  return Number.isFinite(a) && Number.isFinite(b) && b !== 0 ? a / b : NaN;
}

/** Round to `digits` significant decimals after the point (NaN stays NaN; JSON writes it as null). */
export function round(x: number, digits = 2): number {
  if (!Number.isFinite(x)) return NaN;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** A number for a table cell: thousands grouped, fixed decimals, "n/a" when missing. */
export function fmt(x: number | undefined | null, decimals = 0): string {
  if (x === undefined || x === null || !Number.isFinite(x)) return 'n/a';
  return x.toLocaleString('en-US', { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
}

/** A ratio for a table cell: "1.43x", or "n/a". */
export function fmtRatio(x: number): string {
  return Number.isFinite(x) ? `${x.toFixed(2)}x` : 'n/a';
}

/** Rotate a list by `by` places: round r visits the peers in a different order, so no peer always goes first. */
export function rotate<T>(xs: readonly T[], by: number): T[] {
  if (xs.length === 0) return [];
  const k = ((by % xs.length) + xs.length) % xs.length;
  return [...xs.slice(k), ...xs.slice(0, k)];
}
