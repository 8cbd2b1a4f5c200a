// forward/ layer: the balancer, the pure pick over a healthy set. No I/O, no
// timers, no sockets: callers (the userspace proxy per connection, the
// nftables renderer per slot table) hand it the candidates and, for
// least-connections, how many connections each one holds.
//
// Two algorithms, both nginx's (src/http/ngx_http_upstream_round_robin.c and
// ngx_http_upstream_least_conn_module.c), because operators know them:
// - smooth weighted round-robin: weights {a:5, b:1, c:1} give a a b a c a a,
//   not a a a a a b c, so a heavy backend never takes a burst;
// - weighted least-connections: the candidate with the fewest active
//   connections per unit of weight; ties are broken by smooth weighted
//   round-robin among the tied candidates (nginx does the same).
// Both are stable when the set changes: the running state is kept per
// address, so a backend leaving or joining does not reset the others' turns.
import type { BalanceAlgorithm } from '../config/types';

/** What the balancer needs to know of a backend. */
export interface Weighted {
  readonly address: string;
  /** Relative share; 0 or less means "never pick" (treated as drained). */
  readonly weight: number;
}

export interface PickOptions {
  /** Skip this address (a retry after a failed connect goes to another backend). */
  readonly exclude?: string | undefined;
  /** Active connections per address; needed by least-connections, ignored by round-robin. */
  readonly active?: ((address: string) => number) | undefined;
}

export interface Balancer {
  readonly algorithm: BalanceAlgorithm;
  /** One pick among the candidates; undefined when none is eligible. */
  pick<T extends Weighted>(candidates: readonly T[], opts?: PickOptions): T | undefined;
}

/**
 * nginx's smooth weighted round-robin. Each pick adds every eligible
 * candidate's weight to its current weight, takes the largest current weight
 * (first in candidate order on a tie), and subtracts the eligible total from
 * the winner. Over any window of sum(weights) picks each candidate is chosen
 * exactly `weight` times when the set does not change.
 */
export class SmoothWeightedRoundRobin implements Balancer {
  readonly algorithm = 'round-robin' as const;
  // The current weights are kept aligned with the last candidate array (the
  // proxy passes the same frozen array until the healthy set changes), so the
  // common pick is one pass over a typed array with no Map look-ups.
  private bound: readonly Weighted[] = [];
  private current: Float64Array = new Float64Array(0);

  pick<T extends Weighted>(candidates: readonly T[], opts?: PickOptions): T | undefined {
    const exclude = opts?.exclude;
    return this.pickWhere(candidates, exclude === undefined ? undefined : (c) => c.address !== exclude);
  }

  /** Pick among the candidates that pass `eligible` (all when undefined). */
  pickWhere<T extends Weighted>(candidates: readonly T[], eligible: ((c: T) => boolean) | undefined): T | undefined {
    if (candidates !== this.bound) this.rebind(candidates);
    const cur = this.current;
    let total = 0;
    let best = -1;
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i]!;
      const w = c.weight;
      if (!(w > 0) || (eligible !== undefined && !eligible(c))) continue;
      cur[i]! += w;
      total += w;
      if (best < 0 || cur[i]! > cur[best]!) best = i;
    }
    if (best < 0) return undefined;
    cur[best]! -= total;
    return candidates[best];
  }

  /** Carry current weights over by address into the new candidate order. */
  private rebind(candidates: readonly Weighted[]): void {
    const old = new Map<string, number>();
    for (let i = 0; i < this.bound.length; i++) old.set(this.bound[i]!.address, this.current[i]!);
    const next = new Float64Array(candidates.length);
    for (let i = 0; i < candidates.length; i++) next[i] = old.get(candidates[i]!.address) ?? 0;
    this.bound = candidates;
    this.current = next;
  }
}

/**
 * nginx's weighted least-connections: minimise active/weight (compared by
 * cross-multiplication, so no division and no float ties), smooth weighted
 * round-robin among the candidates tied at the minimum.
 */
export class WeightedLeastConnections implements Balancer {
  readonly algorithm = 'least-connections' as const;
  private readonly tieBreak = new SmoothWeightedRoundRobin();

  pick<T extends Weighted>(candidates: readonly T[], opts?: PickOptions): T | undefined {
    const exclude = opts?.exclude;
    const active = opts?.active ?? (() => 0);
    let bestActive = 0;
    let bestWeight = 0;
    let ties = 0;
    let only: T | undefined;
    for (let i = 0; i < candidates.length; i++) {
      const c = candidates[i]!;
      if (!(c.weight > 0) || c.address === exclude) continue;
      const a = active(c.address);
      if (only === undefined || a * bestWeight < bestActive * c.weight) {
        only = c;
        bestActive = a;
        bestWeight = c.weight;
        ties = 1;
      } else if (a * bestWeight === bestActive * c.weight) {
        ties++;
      }
    }
    // A clear winner leaves the round-robin state alone, as in nginx.
    if (only === undefined || ties === 1) return only;
    return this.tieBreak.pickWhere(candidates, (c) =>
      c.weight > 0 && c.address !== exclude && active(c.address) * bestWeight === bestActive * c.weight);
  }
}

/**
 * Weighted round-robin with its position kept outside: the proxy's workers
 * share one counter per listener (an atomic add each pick), so the split over
 * all of them is exactly by weight, as with one. The sequence is the smooth
 * one (weightedSlots, the kernel path's table). A retry (an excluded
 * address) takes the next slot that is not excluded without moving the
 * position, so a dead backend costs each of its turns one retry and no more:
 * the next new connection still gets the slot after it.
 */
export class SharedPositionRoundRobin implements Balancer {
  readonly algorithm = 'round-robin' as const;
  private bound: readonly Weighted[] | undefined;
  private table: Weighted[] = [];

  constructor(private readonly position: { next(): number; peek(): number }) {}

  pick<T extends Weighted>(candidates: readonly T[], opts?: PickOptions): T | undefined {
    if (candidates !== this.bound) { this.bound = candidates; this.table = weightedSlots(candidates); }
    const table = this.table as T[];
    const n = table.length;
    if (n === 0) return undefined;
    const exclude = opts?.exclude;
    const at = (exclude === undefined ? this.position.next() : this.position.peek()) % n;
    for (let i = 0; i < n; i++) {
      const c = table[(at + i) % n]!;
      if (c.address !== exclude) return c;
    }
    return undefined;
  }
}

export function createBalancer(algorithm: BalanceAlgorithm): Balancer {
  return algorithm === 'least-connections' ? new WeightedLeastConnections() : new SmoothWeightedRoundRobin();
}

function gcd(a: number, b: number): number {
  while (b !== 0) [a, b] = [b, a % b];
  return a;
}

/** Each candidate's count of slots in weightedSlots' table (rounded, scaled down past maxSlots, divided by their greatest common divisor). */
function slotWeights(candidates: readonly Weighted[], maxSlots: number): number[] {
  let ints = candidates.map((c) => (c.weight > 0 ? Math.max(1, Math.round(c.weight)) : 0));
  const total = ints.reduce((s, w) => s + w, 0);
  if (total === 0) return ints;
  if (total > maxSlots) {
    const scale = maxSlots / total;
    ints = ints.map((w) => (w > 0 ? Math.max(1, Math.floor(w * scale)) : 0));
  }
  const g = ints.reduce((acc, w) => (w > 0 ? gcd(acc, w) : acc), 0);
  return ints.map((w) => w / g);
}

/** The length of weightedSlots' table for these candidates, without building it. */
export function weightedSlotCount(candidates: readonly Weighted[], maxSlots = 1024): number {
  return slotWeights(candidates, maxSlots).reduce((s, w) => s + w, 0);
}

const lcm = (a: number, b: number): number => (a / gcd(a, b)) * b;

/**
 * The fixed modulus of a port's round-robin pick (`numgen inc mod M`) over
 * the slot tables of its healthy sets: the least common multiple of the
 * table lengths of the whole set and of the set less any one backend (and,
 * with equal weights, of every smaller count), taken in that order while it
 * stays within maxSlots. A healthy set whose table length divides M is laid
 * out as its table repeated M/length times, so every window of `length`
 * connections still splits exactly by weight, and a health transition
 * between such sets changes the slot map's elements, never the rule.
 */
export function roundRobinModulus(all: readonly Weighted[], maxSlots = 1024): number {
  const counts = [weightedSlotCount(all, maxSlots)];
  for (let i = 0; i < all.length; i++) counts.push(weightedSlotCount(all.filter((_, j) => j !== i), maxSlots));
  const ints = all.map((c) => Math.round(c.weight));
  if (ints.every((w) => w === ints[0])) for (let h = all.length - 2; h >= 1; h--) counts.push(h);
  let m = 1;
  for (const c of counts) {
    if (c <= 0) continue;
    const next = lcm(m, c);
    if (next <= maxSlots) m = next;
  }
  return m;
}

/**
 * weightedSlots' table for `healthy`, repeated to `modulus` entries when its
 * length divides it (roundRobinModulus); the table itself when not.
 */
export function roundRobinSlots<T extends Weighted>(healthy: readonly T[], modulus: number, maxSlots = 1024): T[] {
  const table = weightedSlots(healthy, maxSlots);
  if (table.length === 0 || modulus % table.length !== 0 || modulus === table.length) return table;
  return Array.from({ length: modulus }, (_, i) => table[i % table.length]!);
}

/**
 * The slot table for a stateless kernel pick (`numgen inc mod N`): the first
 * N picks of smooth weighted round-robin over the candidates, N = sum of the
 * weights divided by their greatest common divisor. Walking the table in
 * order therefore reproduces the smooth sequence exactly. Weights are
 * rounded to integers (minimum 1 for a positive weight); when N would exceed
 * maxSlots they are scaled down proportionally so the kernel map stays small.
 */
export function weightedSlots<T extends Weighted>(candidates: readonly T[], maxSlots = 1024): T[] {
  const ints = slotWeights(candidates, maxSlots);
  const total = ints.reduce((s, w) => s + w, 0);
  if (total === 0) return [];
  const rr = new SmoothWeightedRoundRobin();
  const scaled = candidates.map((c, i) => ({ address: c.address, weight: ints[i]!, c }));
  const slots: T[] = [];
  for (let i = 0; i < total; i++) slots.push(rr.pick(scaled)!.c);
  return slots;
}
