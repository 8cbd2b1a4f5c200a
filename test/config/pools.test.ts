// kube-vip pool syntax and lookup order.
import t from 'tap';
import { parsePools, selectPool, poolLookupOrder, poolContains } from '../../agent/config/pools';
import { parseIPv4 } from '../../agent/address';

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

t.test('lists, bounds, /31 and /32: the ranges are the usable addresses', async (t) => {
  const { pools, errors } = parsePools({ 'cidr-a': '10.0.0.0/29, 10.0.1.0/31,10.0.2.7/32' });
  t.same(errors, []);
  const ip = (s: string): bigint => BigInt(parseIPv4(s)!);
  t.same(pools[0]!.ranges.map((r) => [r.start, r.end]), [
    [ip('10.0.0.1'), ip('10.0.0.6')], // network .0 and broadcast .7 dropped (RFC 919/922)
    [ip('10.0.1.0'), ip('10.0.1.1')], // RFC 3021: a /31 has neither
    [ip('10.0.2.7'), ip('10.0.2.7')],
  ]);
  for (const [a, want] of [['10.0.0.0', false], ['10.0.0.1', true], ['10.0.0.6', true], ['10.0.0.7', false], ['10.0.1.0', true], ['10.0.1.1', true], ['10.0.2.7', true], ['10.0.2.8', false]] as const) {
    t.equal(poolContains(pools[0]!, { family: 'IPv4', value: ip(a) }), want, a);
  }
});

t.test('errors name the key and the element', async (t) => {
  const { errors } = parsePools({ 'range-x': '10.0.0.9-10.0.0.1,,nonsense', 'cidr-y': '10.0.0.0/33' });
  const msgs = errors.map((e) => `${e.key}: ${e.message}`);
  t.ok(msgs.some((m) => m.includes('range-x') && m.includes('is reversed')));
  t.ok(msgs.some((m) => m.includes('empty list element')));
  t.ok(msgs.some((m) => m.includes('"nonsense" is not a range')));
  t.ok(msgs.some((m) => m.includes('cidr-y') && m.includes('is not a CIDR')));
});
