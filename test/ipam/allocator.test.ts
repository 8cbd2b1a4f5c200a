// Unit tests of the pure pool allocator: kube-vip lookup order, lowest free,
// loadBalancerIP, persisted claims, exhaustion, conflicts, never a network or
// broadcast address, stability.
import t from 'tap';
import type { Pool, PoolRange } from '../../agent/config/types';
import { parsePools, parsePoolValue, poolContains } from '../../agent/config/pools';
import { parseConfigText } from '../../agent/config/load';
import { allocate, poolSize, reservedFromInterface, AllocationState } from '../../agent/ipam/allocator';
import { formatIPv4, parseAddress, parseIPv4 } from '../../agent/address';

const ip = (s: string): string => formatIPv4(parseIPv4(s)!);

function range(text: string): PoolRange {
  const { ranges, errors } = parsePoolValue('range-test', text);
  if (errors.length > 0 || ranges.length !== 1) throw new Error(`bad range in test: ${text}`);
  return ranges[0]!;
}
/** A CIDR range as the config loader produces it: the one parse, network/broadcast excluded. */
function cidr(text: string): PoolRange {
  const { ranges, errors } = parsePoolValue('cidr-test', text);
  if (errors.length > 0 || ranges.length !== 1) throw new Error(`bad CIDR in test: ${text}`);
  return ranges[0]!;
}
const pool = (key: string, ...ranges: PoolRange[]): Pool => ({ key, ranges });

function st(over: Partial<AllocationState> = {}): AllocationState {
  return { taken: new Map(), conflicts: new Map(), now: 1000, ...over };
}

t.test('pool lookup order is kube-vip\'s: cidr-<ns>, cidr-global, range-<ns>, range-global', async (t) => {
  const all = [
    pool('range-global', range('10.0.3.1-10.0.3.9')),
    pool('range-web', range('10.0.2.1-10.0.2.9')),
    pool('cidr-global', cidr('10.0.1.0/28')),
    pool('cidr-web', cidr('10.0.0.0/28')),
  ];
  const pick = (pools: Pool[], ns: string) => { const r = allocate(pools, { service: `${ns}/a`, namespace: ns }, st()); return r.ok ? r.pool : r.reason; };
  t.equal(pick(all, 'web'), 'cidr-web');
  t.equal(pick(all.filter((p) => p.key !== 'cidr-web'), 'web'), 'cidr-global');
  t.equal(pick(all.filter((p) => !p.key.startsWith('cidr')), 'web'), 'range-web');
  t.equal(pick(all.filter((p) => p.key === 'range-global'), 'web'), 'range-global');
  t.equal(pick(all, 'other'), 'cidr-global', 'another namespace falls to the global pools');
  t.equal(pick([all[1]!], 'other'), 'no-pool', 'a namespace pool of someone else does not apply');
  const none = allocate([], { service: 'web/a', namespace: 'web' }, st());
  if (!none.ok) t.match(none.message, /cidr-web, cidr-global, range-web, range-global/);
  else t.fail('no pool expected');
});

t.test('no pool: the reason names the service and the keys looked up', async (t) => {
  const r = allocate([pool('range-other', range('10.0.0.1-10.0.0.2'))], { service: 'web/a', namespace: 'web' }, st());
  t.match(r, { ok: false, reason: 'no-pool' });
  if (!r.ok) t.match(r.message, /web\/a.*range-global/);
});

t.test('lowest free address of the selected pool', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20'))];
  t.match(allocate(pools, { service: 'default/a', namespace: 'default' }, st()), { ok: true, address: '10.0.0.10', pool: 'range-global', via: 'lowest-free' });
  const taken = new Map([[ip('10.0.0.10'), 'default/b'], [ip('10.0.0.11'), 'default/c'], [ip('10.0.0.13'), 'default/d']]);
  t.match(allocate(pools, { service: 'default/a', namespace: 'default' }, st({ taken })), { ok: true, address: '10.0.0.12' });
});

t.test('several ranges in one pool: numerically lowest, whatever the order written', async (t) => {
  const p = pool('range-global', range('10.0.0.200-10.0.0.202'), range('10.0.0.100-10.0.0.102'));
  t.equal(poolSize(p), 6);
  const taken = new Map([[ip('10.0.0.100'), 'x/x'], [ip('10.0.0.101'), 'x/y'], [ip('10.0.0.102'), 'x/z']]);
  t.match(allocate([p], { service: 'a/a', namespace: 'a' }, st({ taken })), { ok: true, address: '10.0.0.200' });
  // Overlapping ranges never reach the allocator: the loader refuses them.
  t.match(parsePools({ 'range-global': '10.0.0.100-10.0.0.101,10.0.0.101-10.0.0.102' }).errors, [{ key: 'range-global', message: /overlaps/ }]);
});

t.test('loadBalancerIP: honoured when in the pool and free', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20'))];
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', loadBalancerIP: '10.0.0.15' }, st()),
    { ok: true, address: '10.0.0.15', via: 'loadBalancerIP' });
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', loadBalancerIP: '' }, st()),
    { ok: true, address: '10.0.0.10', via: 'lowest-free' }, 'empty loadBalancerIP means none');
  // The service's own claim on it does not block it.
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', loadBalancerIP: '10.0.0.15' },
    st({ taken: new Map([[ip('10.0.0.15'), 'default/a']]) })), { ok: true, address: '10.0.0.15' });
});

t.test('loadBalancerIP outside the selected pool: a clear error naming service, IP and pool', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20')), pool('range-web', range('10.0.1.10-10.0.1.20'))];
  const r = allocate(pools, { service: 'web/site', namespace: 'web', loadBalancerIP: '10.0.0.15' }, st());
  t.match(r, { ok: false, reason: 'not-in-pool', pool: 'range-web' });
  if (!r.ok) {
    t.match(r.message, /web\/site/);
    t.match(r.message, /10\.0\.0\.15/);
    t.match(r.message, /range-web \(10\.0\.1\.10-10\.0\.1\.20\)/);
  }
  t.match(allocate(pools, { service: 'web/site', namespace: 'web', loadBalancerIP: 'nonsense' }, st()), { ok: false, reason: 'not-in-pool' });
});

t.test('loadBalancerIP held by another service or in conflict: taken, with the holder', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20'))];
  const req = { service: 'default/a', namespace: 'default', loadBalancerIP: '10.0.0.15' };
  const r = allocate(pools, req, st({ taken: new Map([[ip('10.0.0.15'), 'default/b']]) }));
  t.match(r, { ok: false, reason: 'taken' });
  if (!r.ok) t.match(r.message, /default\/b/);
  const c = allocate(pools, req, st({ conflicts: new Map([[ip('10.0.0.15'), 5000]]) }));
  t.match(c, { ok: false, reason: 'taken', retryAt: 5000 });
  if (!c.ok) t.match(c.message, /another host on the LAN/);
  t.match(allocate(pools, req, st({ conflicts: new Map([[ip('10.0.0.15'), 5000]]), now: 5000 })), { ok: true, address: '10.0.0.15' },
    'after the retry time it is tried again');
});

t.test('persisted claim: kept when still in the pool and free, else the lowest free', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20'))];
  const claim = { address: '10.0.0.17', pool: 'range-global' };
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', claim }, st()), { ok: true, address: '10.0.0.17', via: 'claim' });
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', claim }, st({ taken: new Map([[ip('10.0.0.17'), 'default/b']]) })),
    { ok: true, address: '10.0.0.10', via: 'lowest-free' }, 'claim taken meanwhile');
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', claim }, st({ conflicts: new Map([[ip('10.0.0.17'), 9999]]) })),
    { ok: true, address: '10.0.0.10' }, 'claim in conflict');
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', claim: { address: '10.0.0.30', pool: 'range-global' } }, st()),
    { ok: true, address: '10.0.0.10' }, 'claim no longer in the pool (pool shrank)');
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', claim: { address: '10.0.0.17', pool: 'range-default' } }, st()),
    { ok: true, address: '10.0.0.10' }, 'claim from another pool');
  t.match(allocate(pools, { service: 'default/a', namespace: 'default', claim, loadBalancerIP: '10.0.0.12' }, st()),
    { ok: true, address: '10.0.0.12', via: 'loadBalancerIP' }, 'loadBalancerIP wins over the claim');
});

t.test('exhaustion: a reason with counts, and the earliest retry time', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.12'))];
  const taken = new Map([[ip('10.0.0.10'), 'default/b'], [ip('10.0.0.11'), 'default/c']]);
  const conflicts = new Map([[ip('10.0.0.12'), 7000], [ip('10.0.9.9'), 3000]]);
  const r = allocate(pools, { service: 'default/a', namespace: 'default' }, st({ taken, conflicts }));
  t.match(r, { ok: false, reason: 'exhausted', pool: 'range-global', retryAt: 7000 });
  if (!r.ok) {
    t.match(r.message, /default\/a/);
    t.match(r.message, /range-global/);
    t.match(r.message, /2 held, 1 in conflict/);
  }
  const full = allocate(pools, { service: 'default/a', namespace: 'default' }, st({ taken: new Map([...taken, [ip('10.0.0.12'), 'default/d']]) }));
  t.match(full, { ok: false, reason: 'exhausted', retryAt: undefined });
});

t.test('conflicts are skipped until their retry time', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20'))];
  const conflicts = new Map([[ip('10.0.0.10'), 2000], [ip('10.0.0.11'), 3000]]);
  const req = { service: 'default/a', namespace: 'default' };
  t.match(allocate(pools, req, st({ conflicts, now: 1000 })), { ok: true, address: '10.0.0.12' });
  t.match(allocate(pools, req, st({ conflicts, now: 2000 })), { ok: true, address: '10.0.0.10' });
  t.match(allocate(pools, req, st({ conflicts: new Map([[ip('10.0.0.10'), 9000]]), now: 2500 })), { ok: true, address: '10.0.0.11' });
});

t.test('network and broadcast addresses are never handed out', async (t) => {
  const p = pool('cidr-global', cidr('10.0.0.0/30'));
  t.equal(poolSize(p), 2, 'a /30 has two usable addresses');
  t.notOk(poolContains(p, parseAddress('10.0.0.0')!));
  t.notOk(poolContains(p, parseAddress('10.0.0.3')!));
  const got: string[] = [];
  const taken = new Map<string, string>();
  for (let i = 0; i < 5; i++) {
    const r = allocate([p], { service: `ns/s${i}`, namespace: 'ns' }, st({ taken }));
    if (!r.ok) { t.equal(r.reason, 'exhausted'); break; }
    got.push(r.address);
    taken.set(r.address, `ns/s${i}`);
  }
  t.same(got, ['10.0.0.1', '10.0.0.2']);
  t.match(allocate([p], { service: 'ns/x', namespace: 'ns', loadBalancerIP: '10.0.0.3' }, st()), { ok: false, reason: 'not-in-pool' });
  t.match(allocate([p], { service: 'ns/x', namespace: 'ns', loadBalancerIP: '10.0.0.0' }, st()), { ok: false, reason: 'not-in-pool' });
  t.match(allocate([p], { service: 'ns/x', namespace: 'ns', claim: { address: '10.0.0.0', pool: 'cidr-global' } }, st()), { ok: true, address: '10.0.0.1' });
  // /31 and /32 have no network or broadcast address (RFC 3021).
  t.equal(poolSize(pool('cidr-global', cidr('10.0.0.4/31'))), 2);
  t.equal(poolSize(pool('cidr-global', cidr('10.0.0.9/32'))), 1);
  // Reserved addresses (the node's own, its subnet's broadcast) are never handed out either.
  const r = pool('range-global', range('10.0.0.254-10.0.1.1'));
  const reserved = new Set([ip('10.0.0.255'), ip('10.0.1.0'), ip('10.0.0.254')]);
  t.equal(poolSize(r, reserved), 1);
  t.match(allocate([r], { service: 'a/b', namespace: 'a' }, st({ reserved })), { ok: true, address: '10.0.1.1' });
  t.match(allocate([r], { service: 'a/b', namespace: 'a', loadBalancerIP: '10.0.0.255' }, st({ reserved })), { ok: false, reason: 'taken' });
});

t.test('config validation and the allocator agree on every address around a pool', async (t) => {
  // Two copies of the pool bounds once lived in config/pools.ts and here; a
  // loadBalancerIP the config accepts must be one the allocator hands out, and
  // one it refuses must be refused here too.
  for (const text of ['10.0.0.0/30', '10.0.0.8/29', '10.0.0.4/31', '10.0.0.9/32', '10.0.0.20-10.0.0.22']) {
    const key = text.includes('/') ? 'cidr-global' : 'range-global';
    const base = parseIPv4(text.split(/[/-]/)[0]!)!;
    for (let a = base - 2; a <= base + 10; a++) {
      const addr = formatIPv4(a);
      const res = parseConfigText(`pools:\n  ${key}: ${text}\nservices:\n  - { name: s, ipam: pool, loadBalancerIP: ${addr}, ports: [{ port: 80, targetPort: 8080 }], backends: [10.1.0.1] }\n`, 'host');
      const alloc = allocate(parsePools({ [key]: text }).pools, { service: 'default/s', namespace: 'default', loadBalancerIP: addr }, st());
      t.equal(alloc.ok, res.ok, `${text} ${addr}: config ${res.ok ? 'accepts' : 'refuses'}, allocator ${alloc.ok ? 'hands out' : 'refuses'}`);
    }
  }
});

t.test('stability: removing a service does not move the others', async (t) => {
  const pools = [pool('range-global', range('10.0.0.10-10.0.0.20'))];
  const claims = new Map<string, string>();
  const taken = () => new Map([...claims].map(([svc, a]) => [ip(a), svc] as [string, string]));
  const run = (svc: string) => {
    const prev = claims.get(svc);
    const r = allocate(pools, { service: svc, namespace: 'default', claim: prev ? { address: prev, pool: 'range-global' } : undefined },
      st({ taken: new Map([...taken()].filter(([, s]) => s !== svc)) }));
    if (r.ok) claims.set(svc, r.address);
    return r;
  };
  for (const s of ['default/a', 'default/b', 'default/c']) run(s);
  t.same([...claims.values()], ['10.0.0.10', '10.0.0.11', '10.0.0.12']);
  claims.delete('default/a');
  // Every remaining service re-allocates (e.g. after a restart) and keeps its address.
  t.match(run('default/c'), { ok: true, address: '10.0.0.12', via: 'claim' });
  t.match(run('default/b'), { ok: true, address: '10.0.0.11', via: 'claim' });
  // A new service takes the freed, lowest address.
  t.match(run('default/d'), { ok: true, address: '10.0.0.10', via: 'lowest-free' });
});

t.test('a large pool answers quickly: the walk is bounded by the blocked addresses', async (t) => {
  const p = pool('cidr-global', cidr('10.0.0.0/8'));
  t.equal(poolSize(p), 2 ** 24 - 2);
  const taken = new Map<string, string>();
  for (let i = 1; i <= 1000; i++) taken.set(formatIPv4(parseIPv4('10.0.0.0')! + i), `x/${i}`);
  t.match(allocate([p], { service: 'a/b', namespace: 'a' }, st({ taken })), { ok: true, address: '10.0.3.233' });
});

t.test('reservedFromInterface: the node\'s own addresses, its subnets\' network and broadcast, unclaimed /32s', async (t) => {
  const claimed = new Set([ip('10.99.0.201')]);
  const r = reservedFromInterface([
    { address: '10.99.0.2', prefix: 24 },
    { address: '10.99.0.201', prefix: 32 },
    { address: '10.99.0.250', prefix: 32 },
    { address: '192.168.7.1', prefix: 31 },
  ], claimed);
  t.same([...r].sort(), [ip('10.99.0.0'), ip('10.99.0.2'), ip('10.99.0.250'), ip('10.99.0.255'), ip('192.168.7.1')].sort());
});

t.test('IPv6: lowest free of the family\'s ranges, skipping conflicts and the node\'s own addresses; keys are canonical text', async (t) => {
  const { pools } = parsePools({ 'range-global': '10.0.0.10-10.0.0.12,fd00:99::200-fd00:99::20f' });
  const req = { service: 'default/a', namespace: 'default', family: 'IPv6' as const };
  t.match(allocate(pools, req, st()), { ok: true, address: 'fd00:99::200', pool: 'range-global', via: 'lowest-free' });
  t.match(allocate(pools, { ...req, family: 'IPv4' }, st()), { ok: true, address: '10.0.0.10' }, 'the same key gives IPv4 to an IPv4 request');
  const conflicts = new Map([['fd00:99::200', 5000]]);
  t.match(allocate(pools, req, st({ conflicts })), { ok: true, address: 'fd00:99::201' }, 'an address found in use (DAD) is skipped');
  const reserved = reservedFromInterface([{ address: 'fd00:99::201', prefix: 64 }, { address: 'fe80::1', prefix: 64 }, { address: 'fd00:99::203', prefix: 128 }], new Set());
  t.same([...reserved].sort(), ['fd00:99::201', 'fd00:99::203', 'fe80::1'], 'own addresses and unclaimed /128s; no broadcast in IPv6');
  t.match(allocate(pools, req, st({ conflicts, reserved, taken: new Map([['fd00:99::202', 'default/b']]) })), { ok: true, address: 'fd00:99::204' });
  t.match(allocate(pools, { ...req, loadBalancerIP: 'FD00:99:0::20a' }, st()), { ok: true, address: 'fd00:99::20a', via: 'loadBalancerIP' }, 'asked for in any spelling, held in canonical text');
  t.match(allocate(pools, { ...req, loadBalancerIP: 'fd00:98::1' }, st()), { ok: false, reason: 'not-in-pool', message: /range-global \(fd00:99::200-fd00:99::20f\)/ });
  t.match(allocate(pools, { ...req, namespace: 'x', service: 'x/a' }, st()), { ok: true }, 'range-global serves every namespace');
  const v4only = parsePools({ 'range-global': '10.0.0.10-10.0.0.12' }).pools;
  t.match(allocate(v4only, req, st()), { ok: false, reason: 'no-pool', message: /with IPv6 addresses/ });
});
