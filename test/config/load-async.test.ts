// The daemon's loader: async read with limits, parse in a worker thread. The
// event loop keeps its pace while a large file is parsed.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { loadConfigFileAsync, parseConfigTextOffThread, INLINE_PARSE_MAX_BYTES, RELOAD_INLINE_MAX_BYTES } from '../../agent/config/load-async';
import { formatConfigErrors } from '../../agent/config/load';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-load-async-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
const f = (name: string): string => path.join(dir, name);

t.test('a good file loads, frozen as the sync loader freezes it', async (t) => {
  fs.writeFileSync(f('good.yaml'), 'services:\n  - { name: web, ipam: dhcp, ports: [{ port: 80 }], backends: [10.0.0.1] }\n');
  const r = await loadConfigFileAsync(f('good.yaml'), { hostname: 'h' });
  t.ok(r.ok);
  if (!r.ok) return;
  t.equal(r.config.node.name, 'h');
  t.equal(r.config.services[0]!.key, 'default/web');
  t.ok(Object.isFrozen(r.config) && Object.isFrozen(r.config.services[0]!.ports[0]), 'deeply frozen');
});

t.test('refusals come back as errors, never as exceptions', async (t) => {
  fs.symlinkSync('/dev/zero', f('zero.yaml'));
  const zero = await loadConfigFileAsync(f('zero.yaml'));
  t.equal(zero.ok, false);
  if (!zero.ok) t.match(zero.errors[0]!.message, 'not a regular file');
  fs.writeFileSync(f('bomb.yaml'), 'a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\nservices: []\n');
  const bomb = await loadConfigFileAsync(f('bomb.yaml'));
  t.equal(bomb.ok, false);
  if (!bomb.ok) { t.match(bomb.errors[0]!.message, 'aliases expand too far'); t.equal(bomb.errors[0]!.line, 2); }
  fs.writeFileSync(f('empty.yaml'), '');
  const empty = await loadConfigFileAsync(f('empty.yaml'));
  t.equal(empty.ok, false);
});

t.test('the answer comes once the worker\'s thread has ended', async (t) => {
  // A reload is over when its parse is: the daemon's collection after it
  // must not find the worker's heap still there (issue 18).
  const ended: boolean[] = [];
  const onWorker = (w: import('node:worker_threads').Worker): void => {
    const i = ended.push(false) - 1;
    w.once('exit', () => { ended[i] = true; });
  };
  process.on('worker', onWorker);
  t.teardown(() => { process.off('worker', onWorker); });
  const good = await parseConfigTextOffThread('services: []\n', 'a.yaml');
  t.equal(good.ok, true);
  t.same(ended, [true], 'a good parse: the thread had exited');
  const slow = await parseConfigTextOffThread(`services:\n${Array.from({ length: 3000 }, (_, i) => `  - { name: s${i}, ipam: dhcp, ports: [{ port: 80 }] }`).join('\n')}\n`, 'slow.yaml', { deadlineMs: 1 });
  t.equal(slow.ok, false);
  t.same(ended, [true, true], 'a parse stopped at its deadline: the thread had exited');
});

t.test('a parse past the deadline is refused', async (t) => {
  const text = `services:\n${Array.from({ length: 3000 }, (_, i) => `  - { name: s${i}, ipam: dhcp, ports: [{ port: 80 }] }`).join('\n')}\n`;
  const r = await parseConfigTextOffThread(text, 'slow.yaml', { deadlineMs: 1 });
  t.equal(r.ok, false);
  if (!r.ok) t.match(r.errors[0]!.message, 'parsing took more than');
});

t.test('the event loop stays free while a large file is parsed', async (t) => {
  // ~1 MiB of services: seconds of yaml parsing, all of it in the worker.
  const lines: string[] = ['services:'];
  let size = 10;
  for (let i = 0; size < 1024 * 1024; i++) {
    const l = `  - { name: s${i}, ipam: dhcp, ports: [{ port: 80 }], backends: [10.0.${(i >> 8) & 255}.${i & 255}] }`;
    lines.push(l);
    size += l.length + 1;
  }
  fs.writeFileSync(f('large.yaml'), `${lines.join('\n')}\n`);
  let maxLag = 0;
  let ticks = 0;
  let last = Date.now();
  const timer = setInterval(() => {
    const now = Date.now();
    maxLag = Math.max(maxLag, now - last - 20);
    last = now;
    ticks++;
  }, 20);
  const started = Date.now();
  const elu0 = performance.eventLoopUtilization();
  const r = await loadConfigFileAsync(f('large.yaml'));
  // The share of the parse's wall time this thread's event loop spent
  // running code, not waiting: ~1 if the parse ran here, near 0 when it runs
  // in a worker. Time the machine took from an idle loop counts as idle, so
  // unlike a timer's lag this does not move with the machine's load.
  const elu = performance.eventLoopUtilization(elu0);
  clearInterval(timer);
  const took = Date.now() - started;
  t.equal(r.ok, false, 'over the 10,000-service schema limit, refused after parsing');
  t.ok(took > 100, `the parse took ${took} ms (long enough to matter)`);
  t.ok(elu.utilization < 0.5, `the event loop was busy for ${(elu.utilization * 100).toFixed(1)}% of the parse (${took} ms; largest timer lag ${maxLag} ms over ${ticks} ticks)`);
});

t.test('a small file is parsed inline (64 KiB at start, 16 KiB on a reload), a larger one in a worker', async (t) => {
  // process 'worker' fires for every Worker created in this process.
  let workers = 0;
  const onWorker = (): void => { workers++; };
  process.on('worker', onWorker);
  t.teardown(() => { process.off('worker', onWorker); });
  fs.writeFileSync(f('small.yaml'), 'services:\n  - { name: web, ipam: dhcp, ports: [{ port: 80 }], backends: [10.0.0.1] }\n');
  const small = await loadConfigFileAsync(f('small.yaml'), { inlineUpTo: INLINE_PARSE_MAX_BYTES });
  t.ok(small.ok);
  t.equal(small.via, 'inline');
  t.equal(workers, 0, 'no worker for a small file at start');
  if (small.ok) t.ok(Object.isFrozen(small.config.services[0]!.ports[0]), 'deeply frozen, as from the worker');
  const bad = await loadConfigFileAsync(f('small.yaml'), { inlineUpTo: 10 });
  t.equal(bad.via, 'worker', 'above the limit: the worker');
  t.equal(workers, 1);
  const reload = await loadConfigFileAsync(f('small.yaml'));
  t.equal(reload.via, 'inline', 'without inlineUpTo (a reload): a small file inline (issue 18)');
  t.equal(workers, 1);
  // Just over the reload's limit (comments count: the limit is on the bytes the loop would parse).
  const over = fs.readFileSync(f('small.yaml'), 'utf8');
  fs.writeFileSync(f('over.yaml'), over + '#'.repeat(RELOAD_INLINE_MAX_BYTES + 1 - Buffer.byteLength(over) - 1) + '\n');
  t.equal(fs.statSync(f('over.yaml')).size, RELOAD_INLINE_MAX_BYTES + 1);
  const big = await loadConfigFileAsync(f('over.yaml'));
  t.equal(big.via, 'worker', 'a reload of a file over RELOAD_INLINE_MAX_BYTES: the worker');
  t.ok(big.ok && Object.isFrozen(big.config.services[0]!.ports[0]));
  t.equal(workers, 2);
  fs.writeFileSync(f('at.yaml'), over + '#'.repeat(RELOAD_INLINE_MAX_BYTES - Buffer.byteLength(over) - 1) + '\n');
  t.equal((await loadConfigFileAsync(f('at.yaml'))).via, 'inline', 'exactly at the limit: inline');
  t.equal(workers, 2);
  fs.writeFileSync(f('small-bad.yaml'), 'services:\n  - { name: web, bogus: 1 }\n');
  const refused = await loadConfigFileAsync(f('small-bad.yaml'), { inlineUpTo: INLINE_PARSE_MAX_BYTES });
  t.equal(refused.ok, false, 'errors come back inline as they do from the worker');
  if (!refused.ok) t.ok(refused.errors.some((e) => /unknown key "bogus"/.test(e.message) && e.line === 2));
});

t.test('a file parsed in a worker hands back what the next parse takes again, its specs the config\'s own objects', async (t) => {
  const svc = (i: number, b = `10.0.2.${i}`): string => `  - { name: s${i}, ipam: pool, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.1.${i}, ${b}] }`;
  const text = (second: string): string => `pools: { range-global: 10.0.0.10-10.0.0.40 }\nservices:\n${[svc(0), svc(1, second), svc(2)].join('\n')}\n`;
  fs.writeFileSync(f('seed.yaml'), text('10.0.2.1'));
  const start = await loadConfigFileAsync(f('seed.yaml'), { inlineUpTo: 10 });
  t.equal(start.via, 'worker');
  if (!start.ok) throw new Error(formatConfigErrors(start.errors));
  t.ok(start.reuse, 'the worker\'s parse hands its reuse back');
  t.ok(Object.isFrozen(start.config.services[0]), 'the config frozen');
  // The first reload: one backend of s1 changed.
  fs.writeFileSync(f('seed.yaml'), text('10.0.3.1'));
  const next = await loadConfigFileAsync(f('seed.yaml'), { reuse: start.reuse });
  t.equal(next.via, 'inline');
  if (!next.ok) throw new Error(formatConfigErrors(next.errors));
  t.equal(next.reuse?.taken, 2, 'the two unchanged services taken again');
  t.equal(next.config.services[0], start.config.services[0], 's0 is the start\'s object');
  t.equal(next.config.services[2], start.config.services[2], 's2 is the start\'s object');
  t.same(next.config.services[1]!.backends.map((b) => b.address), ['10.0.1.1', '10.0.3.1'], 's1 built anew with its new backend');
  // The same entry refused in the reload still names its path and line.
  fs.writeFileSync(f('seed.yaml'), text('10.0.3.1').replace('name: s2, ipam: pool, ports: [{ port: 80,', 'name: s2, ipam: pool, ports: [{ port: 80000,'));
  const bad = await loadConfigFileAsync(f('seed.yaml'), { reuse: start.reuse });
  t.notOk(bad.ok);
  if (!bad.ok) t.match(formatConfigErrors(bad.errors), /^5: services\[2\]\.ports\[0\]\.port: 80000/m);
});
