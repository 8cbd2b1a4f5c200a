// Reload (agent/daemon/reload.ts): one run at a time, requests that arrive
// meanwhile folded into one more run (Coalesced); and a reload's course
// through the parts it acts on (fakes of their narrow views; the real
// config loader and planner on a scratch file): removals together, the
// order of the steps after them, the verdict published last, a bad file
// that changes nothing.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { stringify } from '../../lab/yaml';
import { Coalesced, Reloader, type ReloaderOptions } from '../../agent/daemon/reload';
import { loadConfigFileAsync, RELOAD_INLINE_MAX_BYTES } from '../../agent/config/load-async';
import type { Desired } from '../../agent/config/types';
import { realClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';

/** A promise the test resolves. */
function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve: (v: T) => void = () => undefined;
  const promise = new Promise<T>((r) => { resolve = r; });
  return { promise, resolve };
}

t.test('Coalesced: one run at a time; calls during a run share one more run', async (t) => {
  const runs: ReturnType<typeof deferred<number>>[] = [];
  const journal: string[] = [];
  const c = new Coalesced<number>(() => { const d = deferred<number>(); runs.push(d); journal.push(`run ${runs.length}`); return d.promise; }, () => journal.push('after'));
  t.equal(c.inFlight, undefined);
  const first = c.run();
  t.equal(c.inFlight, first, 'the run under way');
  const second = c.run();
  const third = c.run();
  t.equal(second, third, 'calls during a run share one promise');
  t.not(second, first);
  t.equal(runs.length, 1, 'the folded run waits for the one under way');
  runs[0]!.resolve(1);
  t.equal(await first, 1);
  await new Promise((r) => setImmediate(r));
  t.same(journal, ['run 1', 'after', 'run 2'], "the folded run begins once the first has ended and its 'after' ran");
  const fourth = c.run();
  t.not(fourth, second, 'a call during the folded run waits for a run after it');
  runs[1]!.resolve(2);
  t.equal(await second, 2);
  await new Promise((r) => setImmediate(r));
  runs[2]!.resolve(3);
  t.equal(await fourth, 3);
  t.same(journal, ['run 1', 'after', 'run 2', 'after', 'run 3', 'after'], 'three runs for four calls');
  t.equal(c.inFlight, undefined, 'idle again');
});

/** The node's place when no labels say it. */
const NO_ZONE = { zone: undefined, region: undefined, zoneFrom: 'unknown', regionFrom: 'unknown', labelsFile: undefined, problem: undefined } as const;

/** A config of pool services by name (the reloader reads nothing else of it); `backends` by name, for those that have others. */
function writeConfig(file: string, names: string[], backends: Record<string, string[]> = {}): void {
  const services = names.map((name) => ({ name, ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: backends[name] ?? ['10.99.0.11'] }));
  fs.writeFileSync(file, stringify({ node: { name: 'vm1', interface: 'eth0' }, pools: { 'range-global': '10.99.0.200-10.99.0.210' }, services }));
}

async function harness(t: { teardown(fn: () => unknown): void }, names: string[]): Promise<{ reloader: Reloader; opts: ReloaderOptions; journal: string[]; file: string; config: () => Desired | undefined; gates: Map<string, ReturnType<typeof deferred<void>>> }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-reload-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'config.yaml');
  writeConfig(file, names);
  const loaded = await loadConfigFileAsync(file);
  if (!loaded.ok) throw new Error('the first file does not load');
  let config: Desired | undefined = loaded.config;
  const journal: string[] = [];
  const gates = new Map<string, ReturnType<typeof deferred<void>>>();
  const opts: ReloaderOptions = {
    configPath: file, log: silentLogger(), clock: realClock,
    starting: () => undefined, started: () => true, stopping: () => false,
    config: () => config, adopt: (next) => { config = next; journal.push(`adopt ${next.services.map((s) => s.name).join(',')}`); },
    subs: () => ({
      reconfigure: () => { journal.push('reconfigure'); },
      dataplane: { kind: 'kernel', reason: '', apply: async () => {}, stop: async () => {} },
      health: { update: () => { journal.push('health update'); } },
    } as unknown as ReturnType<ReloaderOptions['subs']>),
    services: {
      remove: async (key) => {
        journal.push(`remove ${key}`);
        const g = deferred<void>();
        gates.set(key, g);
        await g.promise;
        journal.push(`removed ${key}`);
      },
      restart: async (key) => { journal.push(`restart ${key}`); },
      update: (key) => { journal.push(`update ${key}`); },
      add: (spec) => { journal.push(`add ${spec.key}`); },
      reconfigureSources: () => { journal.push('reconfigure sources'); },
      reorder: (keys) => { journal.push(`reorder ${keys.join(',')}`); },
      updateFailover: () => { journal.push('update failover'); },
      startSources: () => { journal.push('start sources'); },
    },
    metricsEndpoint: { restart: async (listen) => { journal.push(`metrics ${listen}`); } },
    zone: { current: NO_ZONE, read: async () => { journal.push('zone read'); return NO_ZONE; } },
    metrics: () => undefined,
    applyBackendVips: async () => { journal.push('backend vips'); },
    applyNow: async (only) => { journal.push(only === undefined ? 'apply' : `apply ${[...only].join(',') || 'nothing'}`); },
    noteEvent: (kind) => { journal.push(`event ${kind}`); },
    notifyStatus: () => { journal.push('status line'); },
    afterReload: () => { journal.push('after reload'); },
  };
  return { reloader: new Reloader(opts), opts, journal, file, config: () => config, gates };
}

t.test('a reload: removals together, then the rest in order, the verdict last', async (t) => {
  const h = await harness(t, ['a', 'b', 'c']);
  t.equal(h.reloader.generation, 1, 'the file the start read is generation 1');
  writeConfig(h.file, ['a', 'd']);
  const r = h.reloader.reload();
  while (h.gates.size < 2) await new Promise((res) => setImmediate(res));
  t.same(h.journal, ['adopt a,d', 'remove default/b', 'remove default/c'], 'the new config is in force first; both removals begin before either ends');
  h.gates.get('default/c')!.resolve();
  h.gates.get('default/b')!.resolve();
  const res = await r;
  t.match(res, { ok: true, errors: [], summary: { added: ['default/d'], removed: ['default/b', 'default/c'] } });
  t.same(h.journal.slice(3), [
    'removed default/c', 'removed default/b',
    'add default/d',
    'reorder default/a,default/d',
    'health update', 'update failover', 'start sources', 'zone read', 'apply',
    'event reload-applied', 'status line',
  ], 'the steps after the removals wait for all of them; the verdict is published after the apply; a file parsed inline leaves no collection');
  t.equal(h.reloader.generation, 2);
  t.match(h.reloader.lastReload, { ok: true, message: res.message });
});

t.test('a reload that replaces specs in place starts no source and asks the data path for those services only', async (t) => {
  const h = await harness(t, ['a', 'b', 'c']);
  writeConfig(h.file, ['a', 'b', 'c'], { b: ['10.99.0.12'] });
  const r = await h.reloader.reload();
  t.match(r, { ok: true, summary: { changed: ['default/b'], unchanged: 2 } });
  t.same(h.journal, [
    'adopt a,b,c', 'update default/b', 'reorder default/a,default/b,default/c',
    'health update', 'update failover', 'zone read', 'apply default/b',
    'event reload-applied', 'status line',
  ], 'no source is new, so none is started; the one changed service is what the apply asks for');
  h.journal.length = 0;
  t.match(await h.reloader.reload(), { ok: true, summary: { changed: [], unchanged: 3 } });
  t.same(h.journal.filter((l) => l.startsWith('apply') || l === 'start sources'), ['apply nothing'], 'the same file again: nothing to ask for');
  h.journal.length = 0;
  writeConfig(h.file, ['a', 'b', 'c', 'd'], { b: ['10.99.0.12'] });
  t.ok((await h.reloader.reload()).ok);
  t.same(h.journal.filter((l) => l.startsWith('apply') || l === 'start sources'), ['start sources', 'apply'], 'a service added: its source started, every service asked for');
});

t.test('a bad file changes nothing', async (t) => {
  const h = await harness(t, ['a']);
  const before = h.config();
  fs.writeFileSync(h.file, 'services: [ { name: web } ]\nunknown: 1\n');
  const r = await h.reloader.reload();
  t.equal(r.ok, false);
  t.match(r.message, /^reload rejected, running config kept:\n/);
  t.ok(r.errors.length > 0, 'the reasons are given');
  t.equal(h.config(), before, 'the running config is kept');
  t.same(h.journal, ['event reload-rejected'], 'no step was carried out');
  t.equal(h.reloader.generation, 1, 'the generation stays');
  t.match(h.reloader.lastReload, { ok: false, message: r.message });
});

t.test('a file parsed in a worker thread: its memory is collected after the reload', async (t) => {
  const h = await harness(t, ['a']);
  writeConfig(h.file, ['a', 'b']);
  fs.appendFileSync(h.file, `${'# padding\n'.repeat(Math.ceil(RELOAD_INLINE_MAX_BYTES / 10))}`);
  const r = await h.reloader.reload();
  t.equal(r.ok, true);
  t.same(h.journal.slice(-3), ['event reload-applied', 'status line', 'after reload'], 'the collection after the verdict');
  writeConfig(h.file, ['a', 'b', 'c']);
  h.journal.length = 0;
  t.equal((await h.reloader.reload()).ok, true);
  t.notOk(h.journal.includes('after reload'), 'the next reload, inline: none');
});

t.test('one backend of one service among many: one update, the others compared by their fingerprints', async (t) => {
  const names = Array.from({ length: 300 }, (_, i) => `s${i}`);
  const h = await harness(t, names);
  const first = h.config()!;
  const services = names.map((name, i) => ({ name, ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: [i === 7 ? '10.99.0.12' : '10.99.0.11'] }));
  fs.writeFileSync(h.file, stringify({ node: { name: 'vm1', interface: 'eth0' }, pools: { 'range-global': '10.99.0.200-10.99.0.210' }, services }));
  const r = await h.reloader.reload();
  t.match(r.summary, { added: [], removed: [], changed: ['default/s7'], unchanged: 299 });
  t.same(h.journal.filter((j) => /^(update|add|remove|restart) default\//.test(j)), ['update default/s7'], 'one step for the one service changed');
  t.not(h.config(), first, 'the new config is in force');
});

t.test('not running: nothing is read', async (t) => {
  const h = await harness(t, ['a']);
  const stopped = new Reloader({ ...h.opts, stopping: () => true });
  t.same(await stopped.reload(), { ok: false, message: 'not running', errors: [] });
  t.equal(stopped.lastReload, undefined, 'no verdict recorded');
});
