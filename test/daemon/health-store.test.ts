// Health verdicts that outlive the process (agent/daemon/health-store.ts),
// in a real state directory: saved shortly after a change (bursts make one
// write), read back by the next start, a damaged file read as none.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import t from 'tap';
import { HealthStore, HEALTH_FILE, type HealthDocument } from '../../agent/daemon/health-store';
import { StateStore } from '../../agent/state/store';
import { silentLogger } from '../../agent/log';

t.test('saved soon, once per burst, and read back', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbagent-health-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const store = new StateStore(dir);
  store.ensure();
  let doc: HealthDocument = { 'default/web': { '10.99.0.11': 'up', '10.99.0.12': 'down' } };
  let reads = 0;
  const h = new HealthStore(store, () => { reads++; return doc; }, silentLogger());
  t.same(h.load(), [], 'nothing saved yet');
  h.saveSoon(); h.saveSoon(); h.saveSoon();
  await new Promise((r) => setTimeout(r, 120));
  t.equal(reads, 1, 'three changes, one write');
  t.same(new HealthStore(store, () => ({}), silentLogger()).load(), [['default/web', '10.99.0.11', 'up'], ['default/web', '10.99.0.12', 'down']]);
  doc = { 'default/api': { '10.99.0.13': 'up' } };
  h.saveSoon();
  h.save();
  await new Promise((r) => setTimeout(r, 120));
  t.equal(reads, 2, 'a save now folds the pending one in');
  t.same(h.load(), [['default/api', '10.99.0.13', 'up']]);
});

t.test('a damaged file or unknown states start the backends unknown', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbagent-health-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const store = new StateStore(dir);
  store.ensure();
  fs.writeFileSync(path.join(dir, HEALTH_FILE), '{"default/web": {"10.99.0.11": "maybe", "10.99.0.12": "up"}, "x": 3}');
  t.same(new HealthStore(store, () => ({}), silentLogger()).load(), [['default/web', '10.99.0.12', 'up']]);
  fs.writeFileSync(path.join(dir, HEALTH_FILE), '{not json');
  t.same(new HealthStore(store, () => ({}), silentLogger()).load(), []);
});
