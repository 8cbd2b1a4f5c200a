// Unit tests of the PoolManager: serialized reservations, persisted claims
// across a restart, conflicts with backoff and RFC 5227 rate limiting,
// release, pruning, and the pool metrics. Real StateStore in a temp dir,
// ManualClock, a fresh prom-client Registry per test.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Registry } from 'prom-client';
import type { Pool } from '../../agent/config/types';
import { StateStore } from '../../agent/state/store';
import { ManualClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import { parseIPv4 } from '../../agent/address';
import { PoolManager, MAX_CONFLICTS, RATE_LIMIT_INTERVAL_MS, poolMetrics } from '../../agent/ipam/manager';

const ip = (s: string): bigint => BigInt(parseIPv4(s)!);
const rangeGlobal: Pool = { key: 'range-global', ranges: [{ family: 'IPv4', start: ip('10.0.0.10'), end: ip('10.0.0.13'), text: '10.0.0.10-10.0.0.13', kind: 'range' }] };
const rangeWeb: Pool = { key: 'range-web', ranges: [{ family: 'IPv4', start: ip('10.0.1.10'), end: ip('10.0.1.11'), text: '10.0.1.10-10.0.1.11', kind: 'range' }] };

function setup(t: { teardown(fn: () => void): void }, pools: Pool[] = [rangeGlobal, rangeWeb]) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbpoolmgr-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const store = new StateStore(dir);
  store.ensure();
  const clock = new ManualClock();
  const registry = new Registry();
  const make = () => new PoolManager({ pools, store, log: silentLogger(), registry, clock });
  return { store, clock, registry, make, mgr: make() };
}

async function metric(registry: Registry, name: string, labels: Record<string, string>): Promise<number | undefined> {
  const m = await registry.getSingleMetric(name)?.get();
  return m?.values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value;
}

t.test('two services reserving at once never get the same address', async (t) => {
  const { mgr } = setup(t);
  const a = mgr.reserve({ service: 'default/a', namespace: 'default' });
  const b = mgr.reserve({ service: 'default/b', namespace: 'default' });
  t.match(a, { ok: true, address: '10.0.0.10' });
  t.match(b, { ok: true, address: '10.0.0.11' }, 'a hold (probe in flight) blocks the address');
  const w = mgr.reserve({ service: 'web/x', namespace: 'web' });
  t.match(w, { ok: true, address: '10.0.1.10', pool: 'range-web' }, 'the namespace pool');
  t.match(mgr.reserve({ service: 'default/a', namespace: 'default' }), { ok: true, address: '10.0.0.10' }, 're-reserving replaces the own hold');
});

t.test('a committed claim survives a restart; a shutdown keeps it, a removal frees it', async (t) => {
  const { mgr, make } = setup(t);
  for (const s of ['a', 'b', 'c']) {
    const r = mgr.reserve({ service: `default/${s}`, namespace: 'default' });
    if (r.ok) mgr.commit(`default/${s}`, r.address);
  }
  t.same([...mgr.allClaims()].map(([k, c]) => [k, c.address]), [['default/a', '10.0.0.10'], ['default/b', '10.0.0.11'], ['default/c', '10.0.0.12']]);
  mgr.release('default/a', { deleteClaim: false });
  t.match(mgr.reserve({ service: 'default/new', namespace: 'default' }), { ok: true, address: '10.0.0.13' }, 'a stopped service keeps its address');

  const again = make();
  // Restart order differs from the first start: each still gets its own address.
  t.match(again.reserve({ service: 'default/c', namespace: 'default' }), { ok: true, address: '10.0.0.12', via: 'claim' });
  t.match(again.reserve({ service: 'default/a', namespace: 'default' }), { ok: true, address: '10.0.0.10', via: 'claim' });
  t.match(again.reserve({ service: 'default/b', namespace: 'default' }), { ok: true, address: '10.0.0.11', via: 'claim' });

  let changed = 0;
  again.on('changed', () => changed++);
  again.release('default/a', { deleteClaim: true });
  t.equal(changed, 1);
  t.equal(again.claimOf('default/a'), undefined);
  t.match(again.reserve({ service: 'default/d', namespace: 'default' }), { ok: true, address: '10.0.0.10' }, 'the removed service\'s address is free again');
  t.equal(make().claimOf('default/a'), undefined, 'deleted on disk');
});

t.test('commit without a matching reservation is a bug, not a claim', async (t) => {
  const { mgr } = setup(t);
  t.throws(() => mgr.commit('default/a', '10.0.0.10'));
  mgr.reserve({ service: 'default/a', namespace: 'default' });
  t.throws(() => mgr.commit('default/a', '10.0.0.11'));
  t.equal(mgr.claimOf('default/a'), undefined);
});

t.test('an address in conflict is skipped, retried after a doubling backoff, forgotten once claimed', async (t) => {
  const { mgr, clock, registry } = setup(t);
  mgr.reserve({ service: 'default/a', namespace: 'default' });
  const c1 = mgr.markConflict('default/a', '10.0.0.10', '02:00:00:00:00:99');
  t.match(c1, { count: 1, pool: 'range-global', mac: '02:00:00:00:00:99' });
  t.equal(c1.retryAt - clock.now(), 60_000);
  t.match(mgr.reserve({ service: 'default/a', namespace: 'default' }), { ok: true, address: '10.0.0.11' });
  t.equal(await metric(registry, 'lbagent_pool_conflicts_total', { pool: 'range-global' }), 1);
  t.equal(mgr.conflicts().length, 1);
  mgr.commit('default/a', '10.0.0.11');

  clock.advance(60_000);
  t.same(mgr.conflicts(), [], 'retry time passed');
  const r = mgr.reserve({ service: 'default/b', namespace: 'default' });
  t.match(r, { ok: true, address: '10.0.0.10' }, 'tried again after the retry time');
  const c2 = mgr.markConflict('default/b', '10.0.0.10');
  t.equal(c2.count, 2);
  t.equal(c2.retryAt - clock.now(), 120_000, 'the backoff doubles');
  clock.advance(120_000);
  mgr.reserve({ service: 'default/b', namespace: 'default' });
  mgr.commit('default/b', '10.0.0.10');
  mgr.release('default/b', { deleteClaim: true });
  mgr.reserve({ service: 'default/c', namespace: 'default' });
  t.equal(mgr.markConflict('default/c', '10.0.0.10').count, 1, 'a successful claim clears the history');
});

t.test('exhausted: pending with the reason and the time a conflict clears', async (t) => {
  const { mgr, clock } = setup(t);
  for (const s of ['a', 'b', 'c']) {
    const r = mgr.reserve({ service: `default/${s}`, namespace: 'default' });
    if (r.ok) mgr.commit(`default/${s}`, r.address);
  }
  mgr.reserve({ service: 'default/d', namespace: 'default' });
  const c = mgr.markConflict('default/d', '10.0.0.13');
  const r = mgr.reserve({ service: 'default/d', namespace: 'default' });
  t.match(r, { ok: false, reason: 'exhausted', retryAt: c.retryAt });
  t.match(mgr.reserve({ service: 'web/x', namespace: 'web' }), { ok: true }, 'another pool is unaffected');
  clock.advance(c.retryAt - clock.now());
  t.match(mgr.reserve({ service: 'default/d', namespace: 'default' }), { ok: true, address: '10.0.0.13' });
});

t.test(`RFC 5227 rate limit: after ${MAX_CONFLICTS} conflicts, one attempt per ${RATE_LIMIT_INTERVAL_MS / 1000} s`, async (t) => {
  const wide: Pool = { key: 'range-global', ranges: [{ family: 'IPv4', start: ip('10.0.0.1'), end: ip('10.0.0.100'), text: '10.0.0.1-10.0.0.100', kind: 'range' }] };
  const { mgr, clock } = setup(t, [wide]);
  for (let i = 0; i < MAX_CONFLICTS; i++) {
    t.equal(mgr.attemptDelay(), 0);
    const r = mgr.reserve({ service: 'default/a', namespace: 'default' });
    if (r.ok) mgr.markConflict('default/a', r.address);
    clock.advance(100);
  }
  t.equal(mgr.attemptDelay(), RATE_LIMIT_INTERVAL_MS - 100);
  clock.advance(RATE_LIMIT_INTERVAL_MS);
  t.equal(mgr.attemptDelay(), 0);
  const r = mgr.reserve({ service: 'default/a', namespace: 'default' });
  t.equal(mgr.attemptDelay(), RATE_LIMIT_INTERVAL_MS);
  if (r.ok) mgr.commit('default/a', r.address);
  t.equal(mgr.attemptDelay(), 0, 'a success ends the rate limit');
});

t.test('reserved addresses (the node\'s own) are never handed out and do not count', async (t) => {
  const { mgr, registry } = setup(t);
  t.equal(await metric(registry, 'lbagent_pool_size', { pool: 'range-global' }), 4);
  let changed = 0;
  mgr.on('changed', () => changed++);
  mgr.setReserved(['10.0.0.10', '192.168.1.1']);
  mgr.setReserved(['192.168.1.1', '10.0.0.10']);
  t.equal(changed, 1, 'the same set twice is no change');
  t.equal(await metric(registry, 'lbagent_pool_size', { pool: 'range-global' }), 3);
  t.match(mgr.reserve({ service: 'default/a', namespace: 'default' }), { ok: true, address: '10.0.0.11' });
});

t.test('pruneClaims deletes the claims of services gone from the config', async (t) => {
  const { mgr, make } = setup(t);
  for (const s of ['a', 'b']) {
    const r = mgr.reserve({ service: `default/${s}`, namespace: 'default' });
    if (r.ok) mgr.commit(`default/${s}`, r.address);
  }
  const again = make();
  const gone = again.pruneClaims(['default/b', 'default/zzz']);
  t.same([...gone.keys()], ['default/a']);
  t.equal(gone.get('default/a')?.address, '10.0.0.10');
  t.same([...make().allClaims().keys()], ['default/b']);
});

t.test('metrics: size and in-use per pool, follow the pools on reload, one registration per registry', async (t) => {
  const { mgr, registry, store, clock } = setup(t);
  const r = mgr.reserve({ service: 'web/x', namespace: 'web' });
  t.equal(await metric(registry, 'lbagent_pool_in_use', { pool: 'range-web' }), 1, 'a probe in flight counts');
  if (r.ok) mgr.commit('web/x', r.address);
  t.equal(await metric(registry, 'lbagent_pool_in_use', { pool: 'range-web' }), 1);
  t.equal(await metric(registry, 'lbagent_pool_in_use', { pool: 'range-global' }), 0);
  t.equal(await metric(registry, 'lbagent_pool_size', { pool: 'range-web' }), 2);
  mgr.setPools([rangeGlobal]);
  t.equal(await metric(registry, 'lbagent_pool_size', { pool: 'range-web' }), undefined, 'a removed pool leaves the metrics');
  t.doesNotThrow(() => new PoolManager({ pools: [rangeGlobal], store, log: silentLogger(), registry, clock }), 'a second manager on the same registry');
  t.equal(poolMetrics(registry).size, poolMetrics(registry).size);
});

t.test('metrics: the in-use gauge follows every kind of change, scrape after scrape', async (t) => {
  const { mgr, registry } = setup(t);
  const inUse = (): Promise<(number | undefined)[]> => Promise.all([metric(registry, 'lbagent_pool_in_use', { pool: 'range-global' }), metric(registry, 'lbagent_pool_in_use', { pool: 'range-web' })]);
  t.same(await inUse(), [0, 0]);
  t.same(await inUse(), [0, 0], 'nothing changed: the same values');
  const a = mgr.reserve({ service: 'default/a', namespace: 'default' });
  t.same(await inUse(), [1, 0], 'a hold');
  if (a.ok) mgr.commit('default/a', a.address);
  t.same(await inUse(), [1, 0], 'the hold made a claim');
  const b = mgr.reserve({ service: 'default/b', namespace: 'default' });
  t.same(await inUse(), [2, 0], 'a second hold');
  if (b.ok) await mgr.commitSoon('default/b', b.address);
  t.same(await inUse(), [2, 0], 'a claim written with others of its turn');
  const c = mgr.reserve({ service: 'default/c', namespace: 'default' });
  t.same(await inUse(), [3, 0]);
  if (c.ok) mgr.markConflict('default/c', c.address);
  t.same(await inUse(), [2, 0], 'a conflict drops the hold');
  mgr.release('default/a', { deleteClaim: true });
  t.same(await inUse(), [1, 0], 'a claim deleted');
  mgr.setReserved([b.ok ? b.address : '']);
  t.same(await inUse(), [0, 0], 'a reserved address is not counted in use');
  t.equal(await metric(registry, 'lbagent_pool_size', { pool: 'range-global' }), 3, 'and leaves the pool\'s size');
  mgr.setReserved([]);
  t.same(await inUse(), [1, 0]);
  t.same([...mgr.pruneClaims([]).keys()], ['default/b']);
  t.same(await inUse(), [0, 0], 'a pruned claim');
});

t.test('a corrupt claims file fails reservations loudly', async (t) => {
  const { store, make } = setup(t);
  fs.writeFileSync(path.join(store.dir, 'pool-claims.json'), 'not json');
  const mgr = make();
  t.throws(() => mgr.reserve({ service: 'default/a', namespace: 'default' }), { code: 'LB_ERR_STATE_CORRUPT' });
});

t.test('lbagent_service_vip_info is not the pool\'s to write: one writer, the daemon\'s collect', async (t) => {
  // The pool source used to set it too, and the daemon's collect reset it at
  // every scrape; now the pool metrics do not register it at all.
  const { mgr, registry } = setup(t);
  const r = mgr.reserve({ service: 'default/a', namespace: 'default' });
  if (r.ok) mgr.commit('default/a', r.address);
  t.notOk(Object.keys(poolMetrics(registry)).includes('vipInfo'));
  t.equal(registry.getSingleMetric('lbagent_service_vip_info'), undefined);
  t.notMatch(await registry.metrics(), /lbagent_service_vip_info/);
});

t.test('networks: a service gets an address of its own network\'s pools; metrics name a pool by network; every NIC\'s addresses stay reserved', async (t) => {
  const vmGlobal: Pool = { key: 'range-global', network: 'vmnet', ranges: [{ family: 'IPv4', start: ip('10.0.2.10'), end: ip('10.0.2.11'), text: '10.0.2.10-10.0.2.11', kind: 'range' }] };
  const { mgr, registry } = setup(t, [rangeGlobal, vmGlobal]);
  const a = mgr.reserve({ service: 'default/a', namespace: 'default' });
  const b = mgr.reserve({ service: 'default/b', namespace: 'default', network: 'vmnet' });
  t.match(a, { ok: true, address: '10.0.0.10' }, 'the default network\'s range-global');
  t.match(b, { ok: true, address: '10.0.2.10' }, 'vmnet\'s own range-global, not the default one');
  t.equal(mgr.poolFor('default', 'IPv4', 'vmnet'), vmGlobal);
  t.equal(mgr.poolFor('default'), rangeGlobal);
  t.equal(await metric(registry, 'lbagent_pool_size', { pool: 'vmnet/range-global' }), 2);
  t.equal(await metric(registry, 'lbagent_pool_in_use', { pool: 'vmnet/range-global' }), 1);
  t.equal(await metric(registry, 'lbagent_pool_in_use', { pool: 'range-global' }), 1);
  // Each network's NIC reports its own addresses; one does not undo the other's.
  mgr.setReserved(['10.0.2.11'], 'vmnet');
  mgr.setReserved(['10.0.0.11'], 'default');
  mgr.release('default/b', { deleteClaim: true });
  const c = mgr.reserve({ service: 'default/c', namespace: 'default', network: 'vmnet' });
  const d = mgr.reserve({ service: 'default/d', namespace: 'default', network: 'vmnet' });
  t.match(c, { ok: true, address: '10.0.2.10' });
  t.equal(d.ok, false, 'vmnet\'s NIC address 10.0.2.11 is never handed out, after the default NIC reported its own');
});
