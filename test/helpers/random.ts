// Seeded randomness for tests: one deterministic generator, so a fuzz or
// property test that fails replays from its seed.

/** mulberry32: a small 32-bit PRNG; returns floats in [0, 1). The same seed gives the same sequence. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}
