// SeriesFamily: the text it keeps is prom-client's text for the same
// series, a change renders again the series that changed and no other, and
// no change of any kind (value, a series come or gone, a label value, a
// label left out) is ever served from the kept text.
import t from 'tap';
import { Registry, Gauge, Counter } from '../../agent/metrics/prom';
import { SeriesFamily, exposition, expositionParts, pageBuffer, valueText } from '../../agent/metrics/series';

const HELP = 'A help text with a \\ backslash\nand a newline.';

t.test('the text is prom-client\'s for the same series, escapes and left-out labels included', async (t) => {
  const ours = new Registry();
  const theirs = new Registry();
  const f = new SeriesFamily({ name: 'x_info', help: HELP, type: 'gauge', labelNames: ['service', 'namespace', 'network'], registers: [ours] });
  const g = new Gauge({ name: 'x_info', help: HELP, labelNames: ['service', 'namespace', 'network'], registers: [theirs] });
  const rows: [string, string, string | undefined, number][] = [
    ['web', 'default', undefined, 1], ['a"quote', 'ns\\back', 'blue', 0], ['new\nline', 'x', '', 0.25],
    ['nan', 'x', undefined, NaN], ['inf', 'x', undefined, Infinity], ['-inf', 'x', undefined, -Infinity], ['big', 'x', undefined, 1e21],
  ];
  for (const [service, namespace, network, v] of rows) {
    f.set([service, namespace, network], v);
    g.set(network === undefined ? { service, namespace } : { service, namespace, network }, v);
  }
  const c = new Counter({ name: 'y_total', help: 'prom-client\'s own, beside it.', labelNames: ['to'], registers: [ours, theirs] });
  c.inc({ to: 'up' }, 3);
  t.equal(await exposition(ours), await theirs.metrics(), 'exposition() of a family and a prom-client counter');
  t.equal(await ours.metrics(), await theirs.metrics(), 'registry.metrics() reads the family through get()');
  t.equal(valueText(-0), '0');
});

t.test('the page as parts: each family\'s kept text itself, joined the registry\'s text, its bytes counted in UTF-8', async (t) => {
  const r = new Registry();
  const f = new SeriesFamily({ name: 'up', help: 'h', type: 'gauge', labelNames: ['service'], registers: [r] });
  for (let i = 0; i < 100; i++) f.set([i === 3 ? 'gr\u00fc\u00dfe' : `s${i}`], 1);
  new Counter({ name: 'y_total', help: 'prom-client\'s own.', registers: [r] }).inc(5);
  const page = await expositionParts(r);
  const text = page.parts.join('');
  t.equal(text, await r.metrics(), 'joined, the registry\'s text');
  t.equal(page.bytes, Buffer.byteLength(text), 'bytes: the UTF-8 length');
  t.ok(page.parts.includes(await f.exposition()), 'the family\'s kept text is a part as it is, not a copy in a page');
  const again = await expositionParts(r);
  t.equal(again.parts.join(''), text, 'the same state: the same page');
});

t.test('the page\'s Buffer is the registry\'s text in UTF-8, byte for byte, and a wrong count is an error', async (t) => {
  const r = new Registry();
  const f = new SeriesFamily({ name: 'up', help: 'h', type: 'gauge', labelNames: ['service'], registers: [r] });
  for (let i = 0; i < 100; i++) f.set([i === 3 ? 'gr\u00fc\u00dfe-\u6f22\u{1f600}' : `s${i}`], 1);
  new Counter({ name: 'y_total', help: 'prom-client\'s own.', registers: [r] }).inc(5);
  const page = await expositionParts(r);
  const buf = pageBuffer(page);
  t.ok(buf.equals(Buffer.from(await r.metrics(), 'utf8')), 'the registry\'s text, byte for byte');
  t.equal(buf.length, page.bytes, 'as long as counted');
  f.set(['s1'], 0);
  t.ok(pageBuffer(await expositionParts(r)).equals(Buffer.from(await r.metrics(), 'utf8')), 'a changed value: the registry\'s new text');
  t.throws(() => pageBuffer({ parts: page.parts, bytes: page.bytes - 1 }), /more than bytes written of the \d+ counted/, 'counted short: not a body cut short');
  t.throws(() => pageBuffer({ parts: page.parts, bytes: page.bytes + 1 }), /\d+ bytes written of the \d+ counted/, 'counted long: not a padded body');
  t.throws(() => pageBuffer({ parts: ['\u00e9'], bytes: 1 }), /more than/, 'a character past the count, cut at the Buffer\'s end, is caught');
  t.equal(pageBuffer({ parts: [], bytes: 0 }).length, 0);
});

t.test('a change renders that series again and no other; an unchanged family keeps its text', async (t) => {
  const r = new Registry();
  const f = new SeriesFamily({ name: 'up', help: 'h', type: 'gauge', labelNames: ['service', 'backend'], registers: [r] });
  for (let i = 0; i < 1000; i++) f.set([`s${i}`, '10.0.0.1:80'], 1);
  t.equal(f.rendered, 1000);
  const first = await f.exposition();
  for (let i = 0; i < 1000; i++) f.set([`s${i}`, '10.0.0.1:80'], 1);
  t.equal(f.rendered, 1000, 'the same values again: nothing rendered');
  t.equal(await f.exposition(), first, 'the same text');
  f.set(['s500', '10.0.0.1:80'], 0);
  t.equal(f.rendered, 1001, 'one value changed: one line rendered');
  const second = await f.exposition();
  t.not(second, first);
  t.match(second, /\nup\{service="s500",backend="10\.0\.0\.1:80"\} 0\n/);
  t.equal(second.split('\n').length, 1002, 'HELP, TYPE and 1000 lines');
  t.equal(f.value(['s500', '10.0.0.1:80']), 0);
});

t.test('a collecting family: every kind of change shows at the next scrape, never the kept text', async (t) => {
  const r = new Registry();
  let rows: [string, string, string | undefined, number][] = [['a', 'default', undefined, 1], ['b', 'default', undefined, 0]];
  let collects = 0;
  const f = new SeriesFamily({
    name: 'svc', help: 'h', type: 'gauge', labelNames: ['service', 'namespace', 'network'], registers: [r],
    collect: (fam) => { collects++; fam.begin(); for (const [s, n, net, v] of rows) fam.set([s, n, net], v); },
  });
  const lines = async (): Promise<string[]> => (await exposition(r)).trim().split('\n').slice(2);
  t.same(await lines(), ['svc{service="a",namespace="default"} 1', 'svc{service="b",namespace="default"} 0']);
  rows = [['a', 'default', undefined, 0], ['b', 'default', undefined, 0]];
  t.same(await lines(), ['svc{service="a",namespace="default"} 0', 'svc{service="b",namespace="default"} 0'], 'a value');
  rows = [['a', 'default', undefined, 0]];
  t.same(await lines(), ['svc{service="a",namespace="default"} 0'], 'a series gone');
  rows = [['a', 'default', undefined, 0], ['c', 'default', undefined, 1]];
  t.same(await lines(), ['svc{service="a",namespace="default"} 0', 'svc{service="c",namespace="default"} 1'], 'a series come');
  rows = [['a', 'shop', undefined, 0], ['c', 'default', undefined, 1]];
  t.same(await lines(), ['svc{service="a",namespace="shop"} 0', 'svc{service="c",namespace="default"} 1'], 'a label value (a series that came takes its place in the collect\'s order, as prom-client\'s after a reset)');
  rows = [['a', 'shop', 'blue', 0], ['c', 'default', undefined, 1]];
  t.same(await lines(), ['svc{service="a",namespace="shop",network="blue"} 0', 'svc{service="c",namespace="default"} 1'], 'a label that was left out');
  rows = [['a', 'shop', '', 0], ['c', 'default', undefined, 1]];
  t.same(await lines(), ['svc{service="a",namespace="shop",network=""} 0', 'svc{service="c",namespace="default"} 1'], 'an empty label value is not a left-out one');
  rows = [['c', 'default', undefined, 1], ['a', 'shop', '', 0]];
  t.same(await lines(), ['svc{service="a",namespace="shop",network=""} 0', 'svc{service="c",namespace="default"} 1'], 'the same series in another order: the kept order (nothing came)');
  t.equal(collects, 8, 'collected at every scrape');
  f.remove(['c', 'default', undefined]);
  t.equal(f.size, 1);
  f.reset();
  t.equal(f.size, 0);
});

t.test('a collect that fails keeps the series; label counts are checked', async (t) => {
  let fail = false;
  const f = new SeriesFamily({
    name: 'z', help: 'h', type: 'counter', labelNames: ['a'],
    collect: (fam) => { fam.begin(); if (fail) throw new Error('stats unavailable'); fam.set(['x'], 2); },
  });
  t.equal(await f.exposition(), '# HELP z h\n# TYPE z counter\nz{a="x"} 2');
  fail = true;
  await t.rejects(f.exposition(), /stats unavailable/);
  fail = false;
  t.equal(f.size, 1, 'the series stayed');
  t.throws(() => f.set(['x', 'y'], 1), /z: 2 label values for the 1 labels a/);
});

t.test('the kept text is prom-client\'s after any run of sets and removes: series of one service found among others, order kept', async (t) => {
  const ours = new Registry();
  const theirs = new Registry();
  const names = ['service', 'namespace', 'backend'];
  const f = new SeriesFamily({ name: 'b_up', help: 'h', type: 'gauge', labelNames: names, registers: [ours] });
  const g = new Gauge({ name: 'b_up', help: 'h', labelNames: names, registers: [theirs] });
  // A fixed pseudo-random run (a linear congruential generator): the same steps every time.
  let seed = 7;
  const rnd = (n: number): number => { seed = (seed * 1103515245 + 12345) % 2147483648; return Math.floor(seed / 65536) % n; };
  let differ = 0;
  for (let step = 0; step < 400; step++) {
    // Few services, several backends each: series share their first label value.
    const labels = [`s${rnd(6)}`, rnd(2) === 0 ? 'default' : 'shop', `10.0.0.${rnd(4)}:80`] as const;
    const obj = { service: labels[0], namespace: labels[1], backend: labels[2] };
    if (rnd(4) === 0) { f.remove(labels); g.remove(obj); } else { const v = rnd(2); f.set(labels, v); g.set(obj, v); }
    if (step % 20 === 19 && (await exposition(ours)) !== (await theirs.metrics())) differ++;
  }
  t.equal(differ, 0, 'the same page at every 20th step');
  t.equal(await exposition(ours), await theirs.metrics());
  t.ok(f.size > 5, `${f.size} series at the end`);
});

t.test('add() sums within a sync as prom-client\'s inc() after a reset(), renders a line only when the sum changed, and a label array may be filled again for every series', async (t) => {
  const ours = new Registry();
  const theirs = new Registry();
  const rows: [string, number][] = [['a', 1], ['b', 2], ['a', 3], ['c', 0], ['b', 5]];
  let sum = 0;
  const f = new SeriesFamily({
    name: 'x_total', help: 'h', type: 'counter', labelNames: ['service', 'dir'], registers: [ours],
    collect(fam) {
      fam.begin();
      const l: (string | undefined)[] = [undefined, 'in'];
      for (const [s, v] of rows) { l[0] = s; fam.add(l, v + sum); }
    },
  });
  const c = new Counter({ name: 'x_total', help: 'h', labelNames: ['service', 'dir'], registers: [theirs] });
  const fill = (): void => { c.reset(); for (const [s, v] of rows) c.inc({ service: s, dir: 'in' }, v + sum); };
  fill();
  t.equal(await ours.metrics(), await theirs.metrics(), 'the same text as prom-client');
  t.same(f.value(['a', 'in']), 4, 'a: 1 + 3');
  const n = f.rendered;
  await ours.metrics();
  t.equal(f.rendered, n, 'the same sums again: nothing rendered');
  sum = 1;
  fill();
  t.equal(await ours.metrics(), await theirs.metrics(), 'new sums: the same text as prom-client');
  t.equal(f.rendered, n + 3, 'each changed sum rendered once, not once per add');
  rows.splice(3, 1);
  fill();
  t.equal(await ours.metrics(), await theirs.metrics(), 'a series not put this sync is gone');
});

t.test('syncs in any order, with series coming, going, skipped and summed, give prom-client\'s page after a reset(); a sync in the last one\'s order looks nothing up', async (t) => {
  const ours = new Registry();
  const theirs = new Registry();
  const names = ['service', 'namespace', 'backend'];
  let rows: [string, string, string, number][] = [];
  const f = new SeriesFamily({
    name: 'b_up', help: 'h', type: 'gauge', labelNames: names, registers: [ours],
    collect(fam) { fam.begin(); const l: string[] = ['', '', '']; for (const [a, b, c, v] of rows) { l[0] = a; l[1] = b; l[2] = c; fam.add(l, v); } },
  });
  const g = new Gauge({ name: 'b_up', help: 'h', labelNames: names, registers: [theirs] });
  const fill = (): void => { g.reset(); for (const [a, b, c, v] of rows) g.inc({ service: a, namespace: b, backend: c }, v); };
  let seed = 11;
  const rnd = (n: number): number => { seed = (seed * 1103515245 + 12345) % 2147483648; return Math.floor(seed / 65536) % n; };
  const fresh = (): [string, string, string, number] => [`s${rnd(8)}`, rnd(2) === 0 ? 'default' : 'shop', `10.0.0.${rnd(4)}:80`, rnd(3)];
  // Distinct to begin with: a series put twice apart would have two places.
  for (let i = 0; i < 30; i++) { const r = fresh(); if (!rows.some((x) => x.slice(0, 3).join() === r.slice(0, 3).join())) rows.push(r); }
  let differ = 0;
  const kinds = new Set<number>();
  for (let step = 0; step < 300; step++) {
    const kind = rnd(6);
    kinds.add(kind);
    if (kind === 0) rows = rows.filter(() => rnd(5) !== 0); // some go
    else if (kind === 1) rows.splice(rnd(rows.length + 1), 0, [`c${step}`, 'shop', '10.0.0.2:80', rnd(3)]); // one comes, anywhere
    // Two swap places, and one comes: the page takes this sync's order (with none coming it keeps the kept order, as the test above holds).
    else if (kind === 2) { const i = rnd(rows.length); const j = rnd(rows.length); if (rows[i] && rows[j]) [rows[i], rows[j]] = [rows[j], rows[i]]; rows.push([`n${step}`, 'default', '10.0.0.1:80', 1]); }
    // One put twice in this sync alone (summed): a series put twice in
    // syncs to come would have its place where it is first put, in both.
    else if (kind === 3 && rows.length > 0) { const i = rnd(rows.length); const r = rows[i]!; rows.splice(i + 1 + rnd(rows.length - i), 0, [r[0], r[1], r[2], 1]); fill(); if ((await exposition(ours)) !== (await theirs.metrics())) differ++; rows.splice(rows.lastIndexOf(rows.find((x, k) => k > i && x[0] === r[0] && x[1] === r[1] && x[2] === r[2])!), 1); }
    else if (kind === 4) rows = rows.map((r) => (rnd(4) === 0 ? [r[0], r[1], r[2], rnd(3)] : r)); // values change
    // kind 5: the same rows again
    fill();
    if ((await exposition(ours)) !== (await theirs.metrics())) differ++;
  }
  t.equal(differ, 0, 'the same page after each of 300 syncs');
  t.equal(kinds.size, 6, 'every kind of change was made');
  // The same rows twice in a row, no series put twice: the second sync finds each at the cursor.
  const seen = new Set<string>();
  rows = rows.filter((r) => { const k = r.slice(0, 3).join(); if (seen.has(k)) return false; seen.add(k); return true; });
  fill();
  t.equal(await exposition(ours), await theirs.metrics());
  const before = f.lookups;
  await exposition(ours);
  t.equal(f.lookups, before, 'the last sync\'s order: no series looked up by its labels');
  rows.splice(1, 0, ['new', 'default', '10.0.0.9:80', 1]);
  fill();
  t.equal(await exposition(ours), await theirs.metrics(), 'one came second: the page as prom-client\'s');
  const after = f.lookups;
  await exposition(ours);
  t.equal(f.lookups, after, 'and the sync after it looks nothing up either');
});
