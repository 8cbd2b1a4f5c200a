// kube-vip pool syntax and lookup order.
import t from 'tap';
import { parsePools, selectPool, poolLookupOrder, poolSize } from '../../agent/config/pools';

t.test('lookup order is kube-vip\'s', async (t) => {
  t.same(poolLookupOrder('prod'), ['cidr-prod', 'cidr-global', 'range-prod', 'range-global']);
  const { pools } = parsePools({ 'range-global': '10.0.0.1-10.0.0.2', 'range-prod': '10.0.1.1-10.0.1.2', 'cidr-global': '10.0.2.0/30' });
  t.equal(selectPool(pools, 'prod')?.key, 'cidr-global', 'cidr-global wins over range-prod');
  t.equal(selectPool(pools, 'dev')?.key, 'cidr-global');
  const { pools: p2 } = parsePools({ 'range-global': '10.0.0.1-10.0.0.2', 'range-prod': '10.0.1.1-10.0.1.2' });
  t.equal(selectPool(p2, 'prod')?.key, 'range-prod');
  t.equal(selectPool(p2, 'dev')?.key, 'range-global');
  t.equal(selectPool([], 'dev'), undefined);
});

t.test('lists, sizes, /31 and /32', async (t) => {
  const { pools, errors } = parsePools({ 'cidr-a': '10.0.0.0/29, 10.0.1.0/31,10.0.2.7/32' });
  t.same(errors, []);
  t.equal(poolSize(pools[0]!), 6 + 2 + 1);
});

t.test('errors name the key and the element', async (t) => {
  const { errors } = parsePools({ 'range-x': '10.0.0.9-10.0.0.1,,nonsense', 'cidr-y': '10.0.0.0/33' });
  const msgs = errors.map((e) => `${e.key}: ${e.message}`);
  t.ok(msgs.some((m) => m.includes('range-x') && m.includes('is reversed')));
  t.ok(msgs.some((m) => m.includes('empty list element')));
  t.ok(msgs.some((m) => m.includes('"nonsense" is not a range')));
  t.ok(msgs.some((m) => m.includes('cidr-y') && m.includes('is not a CIDR')));
});
