// bench/lib/stats.ts: the numbers that reach the table are medians of finite
// samples, and a missing measurement stays missing (n/a), never a zero.
import t from 'tap';
import { median, percentile, ratio, round, fmt, fmtRatio, rotate, max, min } from '../../../bench/lib/stats';

t.test('median of odd and even counts, ignoring NaN', async (t) => {
  t.equal(median([3, 1, 2]), 2);
  t.equal(median([4, 1, 3, 2]), 2.5);
  t.equal(median([NaN, 5, Infinity, 1]), 3, 'non-finite samples are left out');
  t.ok(Number.isNaN(median([])), 'no sample: NaN');
  t.ok(Number.isNaN(median([NaN])));
});

t.test('nearest-rank percentile', async (t) => {
  const xs = Array.from({ length: 100 }, (_, i) => i + 1);
  t.equal(percentile(xs, 0.5), 50);
  t.equal(percentile(xs, 0.99), 99);
  t.equal(percentile(xs, 1), 100);
  t.equal(percentile([7], 0.01), 7);
  t.ok(Number.isNaN(percentile([], 0.5)));
});

t.test('ratio is NaN unless both sides are real and the base is not zero', async (t) => {
  t.equal(ratio(3, 2), 1.5);
  t.ok(Number.isNaN(ratio(1, 0)));
  t.ok(Number.isNaN(ratio(NaN, 2)));
  t.ok(Number.isNaN(ratio(2, NaN)));
});

t.test('min and max ignore missing samples', async (t) => {
  t.equal(max([1, NaN, 3]), 3);
  t.equal(min([NaN, 4, 2]), 2);
  t.ok(Number.isNaN(max([])));
});

t.test('formatting for table cells', async (t) => {
  t.equal(round(1.23456, 2), 1.23);
  t.ok(Number.isNaN(round(NaN)));
  t.equal(fmt(12345.6), '12,346');
  t.equal(fmt(1.5, 2), '1.50');
  t.equal(fmt(NaN), 'n/a');
  t.equal(fmt(undefined), 'n/a');
  t.equal(fmtRatio(1.4321), '1.43x');
  t.equal(fmtRatio(NaN), 'n/a');
});

t.test('rotate gives each round another first peer', async (t) => {
  t.same(rotate(['a', 'b', 'c'], 0), ['a', 'b', 'c']);
  t.same(rotate(['a', 'b', 'c'], 1), ['b', 'c', 'a']);
  t.same(rotate(['a', 'b', 'c'], 4), ['b', 'c', 'a']);
  t.same(rotate(['a', 'b', 'c'], -1), ['c', 'a', 'b']);
  t.same(rotate([], 3), []);
});
