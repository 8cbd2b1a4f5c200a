// Unit tests of the pure balancer: weights honoured, smooth interleaving,
// stability when the set changes, least-connections, the nft slot table.
import t from 'tap';
import { SharedPositionRoundRobin, SmoothWeightedRoundRobin, WeightedLeastConnections, createBalancer, roundRobinModulus, roundRobinSlots, weightedSlots, type Weighted } from '../../agent/forward/balancer';

const set = (...ws: [string, number][]): Weighted[] => ws.map(([address, weight]) => ({ address, weight }));

function countPicks(pick: () => Weighted | undefined, n: number): Map<string, number> {
  const m = new Map<string, number>();
  for (let i = 0; i < n; i++) {
    const p = pick();
    if (p) m.set(p.address, (m.get(p.address) ?? 0) + 1);
  }
  return m;
}

function within10(t: tap.Test, counts: Map<string, number>, weights: Weighted[], n: number): void {
  const total = weights.reduce((s, w) => s + w.weight, 0);
  for (const w of weights) {
    const expected = (n * w.weight) / total;
    const got = counts.get(w.address) ?? 0;
    t.ok(Math.abs(got - expected) <= expected * 0.1, `${w.address}: ${got} picks, expected ${expected.toFixed(1)} (±10%)`);
  }
}

t.test('smooth weighted round-robin honours weights over a few hundred picks', async (t) => {
  const c = set(['10.0.0.1', 1], ['10.0.0.2', 2], ['10.0.0.3', 3]);
  const rr = new SmoothWeightedRoundRobin();
  within10(t, countPicks(() => rr.pick(c), 300), c, 300);
  // Uneven window too (not a multiple of the weight sum).
  const rr2 = new SmoothWeightedRoundRobin();
  within10(t, countPicks(() => rr2.pick(c), 301), c, 301);
});

t.test('smooth interleaving: nginx sequence for {5,1,1}', async (t) => {
  const c = set(['a', 5], ['b', 1], ['c', 1]);
  const rr = new SmoothWeightedRoundRobin();
  const seq = Array.from({ length: 7 }, () => rr.pick(c)!.address).join('');
  t.equal(seq, 'aabacaa', 'the sequence nginx documents for weights 5,1,1');
});

t.test('zero or negative weight is never picked; empty set gives undefined', async (t) => {
  const rr = new SmoothWeightedRoundRobin();
  const c = set(['a', 0], ['b', 1], ['c', -1]);
  const counts = countPicks(() => rr.pick(c), 50);
  t.same([...counts.keys()], ['b']);
  t.equal(rr.pick([]), undefined);
  t.equal(rr.pick(set(['a', 0])), undefined);
});

t.test('exclude skips a candidate (retry after a failed connect)', async (t) => {
  const rr = new SmoothWeightedRoundRobin();
  const c = set(['a', 1], ['b', 1]);
  for (let i = 0; i < 10; i++) t.equal(rr.pick(c, { exclude: 'a' })!.address, 'b');
  t.equal(rr.pick(set(['a', 1]), { exclude: 'a' }), undefined, 'nothing else to try');
});

t.test('stable when the set changes: the others keep their turns, a returning backend resumes its share', async (t) => {
  const rr = new SmoothWeightedRoundRobin();
  const all = set(['a', 1], ['b', 1], ['c', 1]);
  const first = Array.from({ length: 4 }, () => rr.pick(all)!.address);
  t.same(first, ['a', 'b', 'c', 'a']);
  // b leaves: a and c share, starting from where they were (c is due next,
  // not a again: nothing restarts from scratch).
  const without = set(['a', 1], ['c', 1]);
  const during = Array.from({ length: 200 }, () => rr.pick(without)!.address);
  t.equal(during[0], 'c');
  t.notOk(during.includes('b'), 'a removed backend gets nothing');
  within10(t, countPicks(() => rr.pick(without), 200), without, 200);
  // b returns: equal shares again over the next window.
  const back = countPicks(() => rr.pick(all), 300);
  within10(t, back, all, 300);
  // Reordering the same set does not disturb the distribution.
  const reordered = [all[2]!, all[0]!, all[1]!];
  within10(t, countPicks(() => rr.pick(reordered), 300), all, 300);
});

t.test('weighted least-connections: fewest active per weight, ties by weighted round-robin', async (t) => {
  const lc = new WeightedLeastConnections();
  const c = set(['a', 1], ['b', 2], ['c', 1]);
  // No connection held (requests one after the other): behaves like weighted round-robin.
  within10(t, countPicks(() => lc.pick(c, { active: () => 0 }), 400), c, 400);
  // Held connections: a has 3, b 2 (1 per weight), c 0: c wins.
  const active = new Map([['a', 3], ['b', 2], ['c', 0]]);
  t.equal(lc.pick(c, { active: (x) => active.get(x) ?? 0 })!.address, 'c');
  // a 1/1, b 2/2, c 1/1: all tie at 1 per weight; the tie goes by weights.
  active.set('a', 1).set('b', 2).set('c', 1);
  within10(t, countPicks(() => lc.pick(c, { active: (x) => active.get(x) ?? 0 }), 400), c, 400);
  // Connections accumulate (never closed): the shares still follow the weights.
  const open = new Map<string, number>();
  const lc2 = new WeightedLeastConnections();
  for (let i = 0; i < 400; i++) {
    const p = lc2.pick(c, { active: (x) => open.get(x) ?? 0 })!;
    open.set(p.address, (open.get(p.address) ?? 0) + 1);
  }
  within10(t, open, c, 400);
  t.equal(lc.pick(c, { exclude: 'c', active: () => 0 })!.address === 'c', false, 'exclude honoured');
  t.equal(lc.pick([], {}), undefined);
});

t.test('createBalancer maps the config algorithm', async (t) => {
  t.equal(createBalancer('round-robin').algorithm, 'round-robin');
  t.equal(createBalancer('least-connections').algorithm, 'least-connections');
});

t.test('weightedSlots: the smooth sequence over sum(weights)/gcd slots', async (t) => {
  const c = set(['a', 2], ['b', 4], ['c', 6]);
  const slots = weightedSlots(c).map((x) => x.address);
  t.equal(slots.length, 6, 'gcd 2 divides the table down to 6 slots');
  t.same(slots, ['c', 'b', 'a', 'c', 'b', 'c']);
  t.same(weightedSlots(set(['a', 0])), []);
  t.same(weightedSlots([]), []);
  const big = weightedSlots(set(['a', 1000], ['b', 3000]), 100);
  t.ok(big.length <= 100, `scaled down to ${big.length} slots`);
  t.equal(big.filter((x) => x.address === 'b').length, 3 * big.filter((x) => x.address === 'a').length, 'ratio kept');
  const frac = weightedSlots(set(['a', 0.2], ['b', 1]));
  t.same(frac.map((x) => x.address).sort(), ['a', 'b'], 'a positive fractional weight still gets a slot');
});

t.test('SharedPositionRoundRobin: several pickers on one position split exactly by weight; a retry does not move it', async (t) => {
  let pos = 0;
  const position = { next: () => pos++, peek: () => pos };
  const ws = set(['a', 1], ['b', 2], ['c', 3]);
  const pickers = [new SharedPositionRoundRobin(position), new SharedPositionRoundRobin(position)];
  const counts: Record<string, number> = {};
  const order: string[] = [];
  for (let i = 0; i < 60; i++) {
    const c = pickers[(i * 7) % 2]!.pick(ws)!; // interleaved as workers would be
    counts[c.address] = (counts[c.address] ?? 0) + 1;
    order.push(c.address);
  }
  t.same(counts, { a: 10, b: 20, c: 30 }, 'exact over every window of 6, whichever picker');
  t.same(order.slice(0, 6), weightedSlots(ws).map((x) => x.address), 'the smooth sequence, as the kernel path');
  const before = pos;
  const retry = pickers[0]!.pick(ws, { exclude: order[60 % 6] });
  t.not(retry?.address, order[60 % 6], 'the retry avoids the failed backend');
  t.equal(pos, before, 'and leaves the position for the next new connection');
  t.equal(pickers[1]!.pick([] as Weighted[]), undefined, 'nothing to pick from');
});

t.test('roundRobinModulus: a fixed modulus that the slot tables of the healthy sets divide, within maxSlots', async (t) => {
  const eq = (n: number) => Array.from({ length: n }, (_, i) => ({ address: `10.0.0.${i + 1}`, weight: 1 }));
  t.equal(roundRobinModulus(eq(1)), 1);
  t.equal(roundRobinModulus(eq(3)), 6, 'three equal backends: 3, 2 and 1 divide it');
  t.equal(roundRobinModulus(eq(4)), 12);
  t.equal(roundRobinModulus(eq(8)), 840, 'lcm(1..8)');
  const m9 = roundRobinModulus(eq(9));
  t.ok(m9 <= 1024 && m9 % 9 === 0 && m9 % 8 === 0, `nine: what fits of lcm(1..9) = 2520, the whole set and one less first (${m9})`);
  t.equal(roundRobinModulus(eq(4), 6), 4, 'maxSlots 6: 4, then 3 would make 12: only 4');
  t.equal(roundRobinModulus([{ address: 'a', weight: 1 }, { address: 'b', weight: 3 }, { address: 'c', weight: 2 }]), 60, 'weights 1:3:2: tables of 6, 5, 3 and 4');
});

t.test('roundRobinSlots: the healthy table repeated to the modulus when it divides it, each window exact', async (t) => {
  const [a, b2, c] = [{ address: 'a', weight: 1 }, { address: 'b', weight: 2 }, { address: 'c', weight: 1 }];
  const slots = roundRobinSlots([a, b2, c], 12).map((x) => x.address);
  t.equal(slots.length, 12);
  t.same(slots.slice(0, 4), weightedSlots([a, b2, c]).map((x) => x.address), 'the smooth sequence first');
  for (let w = 0; w < 12; w += 4) t.same(['a', 'b', 'c'].map((x) => slots.slice(w, w + 4).filter((y) => y === x).length), [1, 2, 1], `window ${w}: 1:2:1`);
  t.equal(roundRobinSlots([a, b2, c], 10).length, 4, 'a table that does not divide the modulus: the table itself');
  t.same(roundRobinSlots([], 12), [], 'no healthy backend: no slot');
});
