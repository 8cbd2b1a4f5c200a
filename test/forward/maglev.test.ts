// The consistent-hash slot table of direct server return (forward/maglev.ts):
// shares follow the weights, the table is a pure function of the sets, and
// the flows a change moves are measured against the minimum possible.
import t from 'tap';
import { MAGLEV_SIZES, dsrSlotTable, hash32, maglevSize, maglevTable, movedFraction } from '../../agent/forward/maglev';

const B = (address: string, weight = 1) => ({ address, weight });
const share = (table: readonly { address: string }[]): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const s of table) out[s.address] = (out[s.address] ?? 0) + 1;
  return out;
};

t.test('sizes: prime, >= 100 slots per configured backend, fixed tiers', async (t) => {
  t.equal(maglevSize(1), 1021);
  t.equal(maglevSize(10), 1021);
  t.equal(maglevSize(11), 4093);
  t.equal(maglevSize(5000), 65521, 'capped at the largest tier');
  for (const m of MAGLEV_SIZES) {
    let prime = true;
    for (let d = 2; d * d <= m; d++) if (m % d === 0) prime = false;
    t.ok(prime, `${m} is prime (Maglev's permutations need it)`);
  }
});

t.test('hash32 is pinned: a change would reshuffle every DSR flow at the upgrade that ships it', async (t) => {
  t.equal(hash32('10.0.0.11'), 0x7278bc24);
  t.equal(hash32('default/web', 0x64737221), 0xfaa73a5c, 'the jhash seed of default/web (nft-dsr.ts dsrSeed)');
  t.not(hash32('x', 1), hash32('x', 2));
});

t.test('every slot is filled, each backend holds its weight\'s share to within 2 slots', async (t) => {
  for (const weights of [[1, 1, 1], [1, 2, 3], [5, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]) {
    const all = weights.map((w, i) => B(`10.0.0.${11 + i}`, w));
    const m = maglevSize(all.length);
    const tab = maglevTable(all, m);
    t.notOk(tab.includes(-1), `${weights.join(':')}: no empty slot`);
    const total = weights.reduce((a, b) => a + b, 0);
    const counts = weights.map((_, i) => tab.filter((x) => x === i).length);
    counts.forEach((c, i) => t.ok(Math.abs(c - (m * weights[i]!) / total) <= 2, `${weights.join(':')}: backend ${i} holds ${c} of ${m}, expected ${((m * weights[i]!) / total).toFixed(1)}`));
  }
});

t.test('the same sets give the same table, whatever the process', async (t) => {
  const all = [B('10.0.0.11'), B('10.0.0.12', 2), B('10.0.0.13')];
  t.same(dsrSlotTable(all, all).map((b) => b.address), dsrSlotTable([...all], [...all].reverse()).map((b) => b.address));
});

t.test('health changes move exactly the slots of the backend that changed', async (t) => {
  for (const weights of [[1, 1, 1], [1, 2, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]) {
    const all = weights.map((w, i) => B(`10.0.0.${11 + i}`, w));
    const full = dsrSlotTable(all, all);
    const gone = all[1]!;
    const less = dsrSlotTable(all, all.filter((b) => b !== gone));
    const owned = full.filter((b) => b.address === gone.address).length / full.length;
    t.equal(movedFraction(full, less), owned, `${weights.join(':')}: removing one moves its ${(owned * 100).toFixed(1)}% and nothing else`);
    t.notOk(less.some((b) => b.address === gone.address), 'none left on it');
    for (let i = 0; i < full.length; i++) {
      if (full[i]!.address !== gone.address && less[i]!.address !== full[i]!.address) t.fail(`slot ${i} moved between two healthy backends`);
    }
    t.same(dsrSlotTable(all, all).map((b) => b.address), full.map((b) => b.address), 'its return brings back exactly its slots');
    // Its slots spread over the rest by weight (rendezvous): within 12% of the ideal share.
    const rest = all.filter((b) => b !== gone);
    const restTotal = rest.reduce((a, b) => a + b.weight, 0);
    const counts = share(less);
    for (const r of rest) {
      const want = (less.length * r.weight) / restTotal;
      t.ok(Math.abs((counts[r.address] ?? 0) - want) <= want * 0.12, `${weights.join(':')}: ${r.address} holds ${counts[r.address]} after the removal, ideal ${want.toFixed(1)}`);
    }
  }
});

t.test('a reload that changes the configured set: measured disruption, close to the minimum', async (t) => {
  // Maglev (NSDI'16 §3.4): adding or removing a configured backend moves
  // its share plus a small fraction of other slots. Here: at most 4 points
  // above the minimum for 3 and 10 backends.
  for (const n of [3, 10]) {
    const all = Array.from({ length: n }, (_, i) => B(`10.0.1.${i + 1}`));
    const base = dsrSlotTable(all, all);
    const added = [...all, B('10.0.1.200')];
    const m = base.length;
    const grown = dsrSlotTable(added, added, m);
    const addMoved = movedFraction(base, grown);
    t.ok(addMoved <= 1 / (n + 1) + 0.04, `n=${n}: adding one moves ${(addMoved * 100).toFixed(1)}% (minimum ${(100 / (n + 1)).toFixed(1)}%)`);
    const shrunk = dsrSlotTable(all.slice(1), all.slice(1), m);
    const rmMoved = movedFraction(base, shrunk);
    t.ok(rmMoved <= 1 / n + 0.04, `n=${n}: removing one moves ${(rmMoved * 100).toFixed(1)}% (minimum ${(100 / n).toFixed(1)}%)`);
  }
});

t.test('no healthy backend: no table; one: every slot', async (t) => {
  const all = [B('10.0.0.11'), B('10.0.0.12')];
  t.same(dsrSlotTable(all, []), []);
  t.ok(dsrSlotTable(all, [all[1]!]).every((b) => b.address === '10.0.0.12'));
  t.equal(movedFraction([], []), 1, 'tables of no size count as fully moved');
});
