// Health verdicts that outlive the process (agent/daemon/health-store.ts),
// in a real state directory: saved shortly after a change (bursts make one
// write, off the event loop), read back by the next start, a damaged file
// read as none; only the services touched or replaced since the last write
// are read again.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import t from 'tap';
import { HealthStore, HEALTH_FILE, type HealthDocument, type HealthSource } from '../../agent/daemon/health-store';
import { StateStore } from '../../agent/state/store';
import { silentLogger } from '../../agent/log';

/** A source over a document, counting the services it is asked about. */
function source(doc: () => HealthDocument, specs: () => { key: string }[]): HealthSource & { reads: string[] } {
  const reads: string[] = [];
  return { reads, services: specs, verdicts: (key) => { reads.push(key); return doc()[key] ?? {}; } };
}

function tempStore(t: { teardown(fn: () => void): void }): StateStore {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbagent-health-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const store = new StateStore(dir);
  store.ensure();
  return store;
}

const specs = (...keys: string[]): { key: string }[] => keys.map((key) => ({ key }));

t.test('saved soon, once per burst, and read back', async (t) => {
  const store = tempStore(t);
  let doc: HealthDocument = { 'default/web': { '10.99.0.11': 'up', '10.99.0.12': 'down' } };
  let list = specs('default/web');
  const src = source(() => doc, () => list);
  const h = new HealthStore(store, src, silentLogger());
  t.same(h.load(), [], 'nothing saved yet');
  h.saveSoon(); h.saveSoon(); h.saveSoon();
  await new Promise((r) => setTimeout(r, 120));
  await store.settled(HEALTH_FILE);
  t.same(src.reads, ['default/web'], 'three changes, one write');
  t.same(new HealthStore(store, source(() => ({}), () => []), silentLogger()).load(), [['default/web', '10.99.0.11', 'up'], ['default/web', '10.99.0.12', 'down']]);
  doc = { 'default/api': { '10.99.0.13': 'up' } };
  list = specs('default/api');
  h.saveSoon();
  await h.flush();
  t.same(src.reads, ['default/web', 'default/api'], 'a flush folds the pending write in');
  await new Promise((r) => setTimeout(r, 120));
  t.same(src.reads.length, 2, 'and no write follows it');
  t.same(h.load(), [['default/api', '10.99.0.13', 'up']], 'a removed service is gone from the file');
  t.same(JSON.parse(fs.readFileSync(path.join(store.dir, HEALTH_FILE), 'utf8')), doc, 'the file is the document');
});

t.test('only a touched or replaced service is read again', async (t) => {
  const store = tempStore(t);
  const doc: HealthDocument = {};
  for (let i = 0; i < 100; i++) doc[`default/s${i}`] = { '10.0.0.1': 'up', '10.0.0.2': 'up' };
  let list = Object.keys(doc).map((key) => ({ key }));
  const src = source(() => doc, () => list);
  const h = new HealthStore(store, src, silentLogger());
  await h.flush();
  t.equal(src.reads.length, 100, 'the first write reads every service');
  src.reads.length = 0;
  doc['default/s7'] = { '10.0.0.1': 'down', '10.0.0.2': 'up' };
  h.touch('default/s7');
  await h.flush();
  t.same(src.reads, ['default/s7'], 'a verdict reads its service only');
  t.same(JSON.parse(fs.readFileSync(path.join(store.dir, HEALTH_FILE), 'utf8')), doc, 'and the file holds every service');
  src.reads.length = 0;
  // A reload replaces a service's spec (another backend list): read again without a touch.
  doc['default/s9'] = { '10.0.0.3': 'up' };
  list = list.map((s) => (s.key === 'default/s9' ? { key: s.key } : s));
  await h.flush();
  t.same(src.reads, ['default/s9'], 'a replaced spec reads its service only');
  t.same(JSON.parse(fs.readFileSync(path.join(store.dir, HEALTH_FILE), 'utf8')), doc);
  // Unknown backends only: the service is left out of the file.
  doc['default/s3'] = {};
  h.touch('default/s3');
  await h.flush();
  t.notOk('default/s3' in JSON.parse(fs.readFileSync(path.join(store.dir, HEALTH_FILE), 'utf8')), 'a service with no verdict is left out');
});

t.test('a write that fails is logged, and the next one is whole', async (t) => {
  const store = tempStore(t);
  const doc: HealthDocument = { 'default/web': { '10.99.0.11': 'up' } };
  const warnings: string[] = [];
  const log = silentLogger();
  log.warn = ((_o: unknown, m: string) => { warnings.push(m); }) as typeof log.warn;
  const h = new HealthStore(store, source(() => doc, () => specs('default/web')), log);
  // Root may write a read-only directory: the file's name taken by a directory makes the rename fail.
  fs.mkdirSync(path.join(store.dir, HEALTH_FILE, 'x'), { recursive: true });
  await h.flush();
  t.match(warnings, [/could not save health verdicts/], 'the failure is logged, not thrown');
  fs.rmSync(path.join(store.dir, HEALTH_FILE), { recursive: true });
  await h.flush();
  t.same(h.load(), [['default/web', '10.99.0.11', 'up']], 'the next write holds the document');
  t.same(fs.readdirSync(store.dir).filter((f) => f.includes('.tmp-')), [], 'no temp file is left');
});

t.test('a damaged file or unknown states start the backends unknown', async (t) => {
  const store = tempStore(t);
  const none = source(() => ({}), () => []);
  fs.writeFileSync(path.join(store.dir, HEALTH_FILE), '{"default/web": {"10.99.0.11": "maybe", "10.99.0.12": "up"}, "x": 3}');
  t.same(new HealthStore(store, none, silentLogger()).load(), [['default/web', '10.99.0.12', 'up']]);
  fs.writeFileSync(path.join(store.dir, HEALTH_FILE), '{not json');
  t.same(new HealthStore(store, none, silentLogger()).load(), []);
});
