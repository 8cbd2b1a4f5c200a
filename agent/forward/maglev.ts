// forward/ layer: the consistent-hash slot table of direct server return,
// PURE. The kernel hashes each packet's client address and port
// into one of M slots (`jhash ip saddr . th sport mod M`, nft-dsr.ts) and
// sends it to the slot's backend. There is no per-flow state on that path
// (nftables' netdev family has no conntrack), so "a flow stays on its
// backend" has to come from the table itself: a slot may change hands only
// when it must.
//
// Two layers:
// 1. Maglev (Eisenbud et al., NSDI 2016; what Katran and Cilium use) over
//    every CONFIGURED backend, weighted: each backend walks its own
//    permutation of the slots and claims the next free one, in turns
//    proportional to its weight. Shares match the weights to within a slot
//    or two per backend; the table depends only on the configured set, so it
//    is the same after a restart and moves only when a reload changes the
//    backends (a small fraction beyond the minimum, measured in
//    test/forward/maglev.test.ts and the bench).
// 2. Health on top: a slot whose Maglev owner is not in the healthy set goes
//    to the healthy backend that wins weighted rendezvous hashing for that
//    slot (score = weight / -ln(hash(slot, backend))). So when a backend
//    fails only ITS slots move, spread over the others by weight, and when it
//    returns exactly those slots come back: health changes move the minimum
//    possible number of flows, never a flow between two healthy backends.
//
// M is a prime from a few fixed sizes, chosen from the number of configured
// backends (M >= 100 x N as the paper advises, at least 1021), so a health
// change never resizes the table.
import type { Weighted } from './balancer';

/** Slot-table sizes (primes). */
export const MAGLEV_SIZES = [1021, 4093, 16381, 65521] as const;

/** The table size for N configured backends: the smallest size with at least 100 slots per backend. */
export function maglevSize(backends: number): number {
  for (const m of MAGLEV_SIZES) if (m >= 100 * backends) return m;
  return MAGLEV_SIZES[MAGLEV_SIZES.length - 1]!;
}

/** 32-bit FNV-1a of a string (UTF-16 code units), then murmur3's finaliser for avalanche. */
export function hash32(s: string, seed = 0): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return fmix32(h);
}

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * Weighted Maglev population: slot -> index into `backends` (-1 only when
 * there are none). Backends are taken in the order given (callers sort them),
 * so the same set always gives the same table.
 */
export function maglevTable(backends: readonly Weighted[], size: number): Int32Array {
  const table = new Int32Array(size).fill(-1);
  const n = backends.length;
  if (n === 0) return table;
  const offset = new Uint32Array(n);
  const skip = new Uint32Array(n);
  const next = new Uint32Array(n);
  const weight = backends.map((b) => (b.weight > 0 ? b.weight : 0));
  const wmax = Math.max(...weight);
  if (!(wmax > 0)) return table;
  for (let i = 0; i < n; i++) {
    offset[i] = hash32(backends[i]!.address, 0x6d61676c) % size;
    skip[i] = (hash32(backends[i]!.address, 0x65762031) % (size - 1)) + 1;
  }
  const credit = new Float64Array(n);
  let filled = 0;
  while (filled < size) {
    for (let i = 0; i < n && filled < size; i++) {
      // Turns proportional to weight: the heaviest backend claims one slot a
      // round, a backend of half its weight one every other round.
      credit[i]! += weight[i]!;
      if (credit[i]! < wmax) continue;
      credit[i]! -= wmax;
      let c = (offset[i]! + next[i]! * skip[i]!) % size;
      while (table[c]! >= 0) {
        next[i]!++;
        c = (offset[i]! + next[i]! * skip[i]!) % size;
      }
      table[c] = i;
      next[i]!++;
      filled++;
    }
  }
  return table;
}

/** Weighted rendezvous: the candidate with the highest weight / -ln(u), u = hash(slot, address) in (0, 1). */
function rendezvous<T extends Weighted>(slot: number, candidates: readonly T[]): T | undefined {
  let best: T | undefined;
  let bestScore = -Infinity;
  for (const c of candidates) {
    if (!(c.weight > 0)) continue;
    const u = (hash32(c.address, Math.imul(slot + 1, 0x9e3779b1)) + 0.5) / 4294967296;
    const score = c.weight / -Math.log(u);
    if (score > bestScore) { bestScore = score; best = c; }
  }
  return best;
}

/**
 * The slot table of one DSR service: slot -> backend. `configured` is every
 * backend of the service (sorted; the Maglev base), `healthy` the ones new
 * flows may reach now (weights as configured). Empty when none is healthy.
 */
export function dsrSlotTable<T extends Weighted>(configured: readonly T[], healthy: readonly T[], size = maglevSize(configured.length)): T[] {
  const live = healthy.filter((b) => b.weight > 0);
  if (live.length === 0) return [];
  const alive = new Set(live.map((b) => b.address));
  // A healthy backend missing from the configured list (not expected) still
  // takes part: the base is built over both.
  const base = [...configured, ...live.filter((b) => !configured.some((c) => c.address === b.address))];
  const owners = maglevTable(base, size);
  const out: T[] = new Array<T>(size);
  const liveBy = new Map(live.map((b) => [b.address, b]));
  for (let s = 0; s < size; s++) {
    const owner = base[owners[s]!];
    out[s] = owner !== undefined && alive.has(owner.address) ? liveBy.get(owner.address)! : rendezvous(s, live)!;
  }
  return out;
}

/** The share of slots whose backend differs between two tables of the same size: the flows a change moves. */
export function movedFraction(a: readonly Weighted[], b: readonly Weighted[]): number {
  if (a.length !== b.length || a.length === 0) return 1;
  let moved = 0;
  for (let i = 0; i < a.length; i++) if (a[i]!.address !== b[i]!.address) moved++;
  return moved / a.length;
}
