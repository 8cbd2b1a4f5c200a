// agent/config/reference.ts: every key of the schema has its help and no
// help outlives its key; defaults and ranges come from the schema; the reload
// column is what the reload rules say about a change of the key.
import t from 'tap';
import { configReference, configMarkdown, configMan, schemaKeys, KEY_HELP, referenceCaReader, type ReferenceEntry } from '../../agent/config/reference';
import { buildConfig } from '../../agent/config/load';
import { refusals } from '../../agent/daemon/reconciler';

const entries = configReference({ load: (d) => buildConfig(d, undefined, 'test', referenceCaReader), refusals });
const by = (p: string): ReferenceEntry => entries.find((e) => e.path === p)!;

t.test('every schema key has a help text, and every help text a key', async (t) => {
  const keys = schemaKeys().map((k) => k.path);
  for (const k of keys) t.ok(KEY_HELP[k]?.text, `${k} has a help text`);
  for (const k of Object.keys(KEY_HELP)) t.ok(keys.includes(k), `${k} is a key of the schema`);
});

t.test('the walk reaches nested objects, array items, anyOf branches and open maps', async (t) => {
  const keys = schemaKeys({ type: 'object', properties: {
    a: { type: 'array', items: { anyOf: [{ type: 'string' }, { type: 'object', properties: { b: { type: 'integer' } } }] } },
    m: { type: 'object', additionalProperties: { type: 'string' } },
  } }).map((k) => k.path);
  t.same(keys, ['a', 'a[].b', 'm', 'm.<key>']);
});

t.test('type, default and values come from the schema', async (t) => {
  t.same(by('node.priority'), { ...by('node.priority'), type: 'integer', default: '`100`', values: '1–254' });
  t.equal(by('failover.advertInterval').type, 'seconds');
  t.equal(by('failover.advertInterval').values, '0.01–40.95');
  t.equal(by('dataplane').values, '`auto`, `kernel`, `proxy`');
  t.match(by('proxy.workers').default, /unset: one per CPU/, 'a run-time default is said in words');
});

t.test('the reload column is asked of the reload rules', async (t) => {
  t.equal(by('metrics.listen').reload, 'yes');
  t.equal(by('services[].backends').reload, 'yes');
  t.equal(by('node.interface').reload, 'no');
  t.equal(by('stateDir').reload, 'no');
  t.equal(by('services[].ipam').reload, 'no');
  t.equal(by('failover.vrid').reload, 'no, with failover.mode vrrp');
  t.equal(by('node.priority').reload, 'no, with failover.mode vrrp');
  t.equal(by('proxy.workers').reload, 'no, on the proxy path');
  // The tracks reach the running routers; the rest of VRRP's settings are made at start.
  t.equal(by('failover.track.services[].weight').reload, 'yes');
  t.equal(by('networks.<key>.failover.track.interfaces[].weight').reload, 'yes');
  t.equal(by('networks.<key>.failover.peers').reload, 'no');
  t.equal(by('services[].proxyProtocol').reload, 'no, on the kernel path');
  for (const e of entries) t.not(e.reload, '?', `${e.path}: the probe could change it`);
  // Sections have no reload of their own: their keys do.
  t.equal(by('arp').reload, '');
  // A rule that refuses everything shows as "no" everywhere.
  const strict = configReference({ load: (d) => buildConfig(d, undefined, 'test', referenceCaReader), refusals: () => [{ path: '', message: 'no' }] });
  t.ok(strict.filter((e) => !e.section).every((e) => e.reload === 'no'));
});

t.test('the Markdown and the man page list every key', async (t) => {
  const md = configMarkdown(entries);
  const man = configMan(entries, '1.2.3');
  t.match(man, /^\.TH LB\\-AGENT\.YAML 5 "" "lb-agent 1\.2\.3"/m);
  for (const e of entries) {
    t.ok(md.includes(`\`${e.path}\``), `${e.path} in the Markdown`);
    t.ok(man.includes(`.B ${e.path.replace(/-/g, '\\-')}\n`), `${e.path} in the man page`);
  }
  t.notMatch(md, /undefined|NaN/);
  t.notMatch(man, /undefined|NaN|^'/m);
});
