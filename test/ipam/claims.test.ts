// Unit tests of persisted pool claims on a real temporary StateStore.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { StateStore } from '../../agent/state/store';
import { ClaimStore, CLAIMS_FILE } from '../../agent/ipam/claims';

function tmpStore(t: { teardown(fn: () => void): void }): StateStore {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbclaims-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const s = new StateStore(dir);
  s.ensure();
  return s;
}
const T0 = Date.UTC(2026, 0, 1);

t.test('a claim survives a new ClaimStore (a restart) and is released on delete', async (t) => {
  const store = tmpStore(t);
  const a = new ClaimStore({ store });
  t.equal(a.get('default/web'), undefined);
  a.set('default/web', { address: '10.0.0.10', pool: 'range-global' }, T0);
  a.set('web/site', { address: '10.0.1.10', pool: 'range-web' }, T0 + 1000);

  const b = new ClaimStore({ store });
  t.same(b.get('default/web'), { address: '10.0.0.10', pool: 'range-global', claimedAt: '2026-01-01T00:00:00.000Z' });
  t.same([...b.all().keys()].sort(), ['default/web', 'web/site']);
  const doc = JSON.parse(fs.readFileSync(path.join(store.dir, CLAIMS_FILE), 'utf8')) as { version: number; claims: Record<string, unknown> };
  t.equal(doc.version, 1);
  t.same(doc.claims['web/site'], { address: '10.0.1.10', pool: 'range-web', claimedAt: '2026-01-01T00:00:01.000Z' });

  t.equal(b.delete('default/web'), true);
  t.equal(b.delete('default/web'), false, 'deleting twice is harmless');
  t.equal(new ClaimStore({ store }).get('default/web'), undefined, 'the release is on disk');
  t.ok(new ClaimStore({ store }).get('web/site'), 'other claims untouched');
  t.same(store.list().filter((f) => f.includes('tmp')), [], 'no temp files left');
});

t.test('claimedAt is kept while the address stays, renewed when it moves', async (t) => {
  const store = tmpStore(t);
  const c = new ClaimStore({ store });
  c.set('a/b', { address: '10.0.0.10', pool: 'range-global' }, T0);
  t.equal(c.set('a/b', { address: '10.0.0.10', pool: 'range-global' }, T0 + 5000).claimedAt, '2026-01-01T00:00:00.000Z');
  t.equal(c.set('a/b', { address: '10.0.0.11', pool: 'range-global' }, T0 + 5000).claimedAt, '2026-01-01T00:00:05.000Z');
});

t.test('a file that is not JSON is reported, not silently replaced', async (t) => {
  const store = tmpStore(t);
  fs.writeFileSync(path.join(store.dir, CLAIMS_FILE), '{"version":1,"claims":{');
  const c = new ClaimStore({ store });
  t.throws(() => c.get('a/b'), { code: 'LB_ERR_STATE_CORRUPT' });
  fs.writeFileSync(path.join(store.dir, CLAIMS_FILE), '[1,2]');
  t.throws(() => new ClaimStore({ store }).get('a/b'), { code: 'LB_ERR_STATE_CORRUPT', message: /remove it/ });
});

t.test('malformed entries are dropped, the rest kept', async (t) => {
  const store = tmpStore(t);
  fs.writeFileSync(path.join(store.dir, CLAIMS_FILE), JSON.stringify({
    version: 1,
    claims: {
      'a/good': { address: '10.0.0.1', pool: 'range-global', claimedAt: 'x' },
      'a/bad-ip': { address: '10.0.0.300', pool: 'range-global', claimedAt: 'x' },
      'a/no-pool': { address: '10.0.0.2', claimedAt: 'x' },
      'a/null': null,
    },
  }));
  const c = new ClaimStore({ store });
  t.same([...c.all().keys()], ['a/good']);
});

t.test('a write error leaves memory unchanged and throws LB_ERR_STATE_WRITE', async (t) => {
  const store = tmpStore(t);
  const c = new ClaimStore({ store });
  c.set('a/b', { address: '10.0.0.1', pool: 'range-global' }, T0);
  // The state directory vanishing under us (root ignores permission bits, so this is the portable failure).
  fs.rmSync(store.dir, { recursive: true, force: true });
  t.throws(() => c.set('a/c', { address: '10.0.0.2', pool: 'range-global' }, T0), { code: 'LB_ERR_STATE_WRITE' });
  t.equal(c.get('a/c'), undefined);
  t.throws(() => c.delete('a/b'), { code: 'LB_ERR_STATE_WRITE' });
  t.ok(c.get('a/b'), 'a failed release keeps the claim in memory');
});

t.test('an IPv6 claim survives a restart like an IPv4 one (a family service "ns/name@IPv6")', async (t) => {
  const store = tmpStore(t);
  new ClaimStore({ store }).set('default/web@IPv6', { address: 'fd00:99::201', pool: 'range-global' }, T0);
  t.match(new ClaimStore({ store }).get('default/web@IPv6'), { address: 'fd00:99::201', pool: 'range-global' }, 'loaded, not dropped as malformed');
});

t.test('setSoon: the claims of one turn in memory at once, on disk in one write', async (t) => {
  const store = tmpStore(t);
  let writes = 0;
  const counting = Object.create(store) as StateStore;
  counting.write = (name: string, value: unknown): void => { writes++; store.write(name, value); };
  const c = new ClaimStore({ store: counting });
  const before = c.all();
  const done = Array.from({ length: 50 }, (_, i) => c.setSoon(`default/s${i}`, { address: `10.0.0.${i + 1}`, pool: 'range-global' }, T0));
  t.equal(c.get('default/s7')?.address, '10.0.0.8', 'in memory before it is written');
  t.equal(before.size, 0, 'a snapshot handed out earlier does not move');
  t.equal(writes, 0, 'nothing written in the turn that asked');
  const claims = await Promise.all(done);
  t.equal(writes, 1, 'fifty claims, one write');
  t.equal(claims[49]?.address, '10.0.0.50');
  t.equal([...new ClaimStore({ store }).all().keys()].length, 50, 'all of them on disk');
  t.equal(await c.setSoon('default/s3', { address: '10.0.0.4', pool: 'range-global' }, T0 + 5000).then((x) => x.claimedAt), '2026-01-01T00:00:00.000Z', 'the same claim again: nothing to write');
  t.equal(writes, 1);
});

t.test('setSoon: a failed write takes the batch\'s claims back and rejects each', async (t) => {
  const store = tmpStore(t);
  const c = new ClaimStore({ store });
  c.set('default/kept', { address: '10.0.0.1', pool: 'range-global' }, T0);
  const failing = Object.create(store) as StateStore;
  failing.write = (): void => { throw Object.assign(new Error('disk full'), { code: 'LB_ERR_STATE_WRITE' }); };
  const f = new ClaimStore({ store: failing });
  const moved = f.setSoon('default/kept', { address: '10.0.0.9', pool: 'range-global' }, T0 + 1000);
  const fresh = f.setSoon('default/new', { address: '10.0.0.2', pool: 'range-global' }, T0 + 1000);
  await t.rejects(moved, { code: 'LB_ERR_STATE_WRITE' });
  await t.rejects(fresh, { code: 'LB_ERR_STATE_WRITE' });
  t.equal(f.get('default/kept')?.address, '10.0.0.1', 'a moved claim is back where it was');
  t.equal(f.get('default/new'), undefined, 'a new claim is gone');
});
