// The config file cut at its service entries (split.ts) and the parse by
// entries it serves (load.ts parseConfigText): every file, valid or not,
// gives what the whole parse gives (config, errors, their paths and lines),
// and an edit of one entry among many parses and validates that entry only.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { splitServiceEntries } from '../../agent/config/split';
import { parseConfigText, parseWhole, type ConfigReuse, type LoadResult } from '../../agent/config/load';

const FIX = path.resolve(__dirname, '..', '..', '..', 'test', 'config', 'fixtures');
const HOST = 'split-test';

/** What a caller sees of a result: the config or the errors, not the reuse. */
function shown(r: LoadResult): unknown {
  return r.ok ? { ok: true, config: r.config } : { ok: false, errors: r.errors };
}

t.test('a plain file is cut at its entries, each its exact text', async (t) => {
  const text = 'node: { name: a }\nservices:\n  - name: s0\n    backends: [10.0.0.1]\n\n  # between\n  - name: s1\n    backends: [10.0.0.2]\nmetrics: { listen: "" }\n';
  const cut = splitServiceEntries(text);
  t.ok(cut, 'cut');
  t.same(cut?.entries, ['  - name: s0\n    backends: [10.0.0.1]\n\n  # between\n', '  - name: s1\n    backends: [10.0.0.2]\n']);
  t.equal(cut?.head, 'node: { name: a }\nservices: []\nmetrics: { listen: "" }\n');
  t.equal(cut?.entries.join(''), text.slice(text.indexOf('  - name: s0'), text.indexOf('metrics:')), 'the entries are the file\'s lines, nothing dropped');
  t.same(splitServiceEntries('services:\n- name: a\n- name: b\n')?.entries, ['- name: a\n', '- name: b\n'], 'items at the key\'s own column');
});

t.test('any other layout is not cut (the whole parse takes it)', async (t) => {
  const notCut: [string, string][] = [
    ['flow at the top', '{ services: [ { name: a } ] }\n'],
    ['a flow list', 'services: [ { name: a } ]\n'],
    ['an indented top level', '  services:\n    - name: a\n'],
    ['a tab', 'services:\n\t- name: a\n'],
    ['CR line ends', 'services:\r\n  - name: a\r\n'],
    ['a byte-order mark', '\uFEFFservices:\n  - name: a\n'],
    ['an alias', 'x: &b [10.0.0.1]\nservices:\n  - name: a\n    backends: *b\n'],
    ['a document marker', '---\nservices:\n  - name: a\n'],
    ['a directive', '%YAML 1.2\n---\nservices:\n  - name: a\n'],
    ['two services keys', 'services:\n  - name: a\nservices:\n  - name: b\n'],
    ['a line less indented than the items', 'services:\n  - name: a\n x: 1\n'],
    ['a mapping under services', 'services:\n  name: a\n'],
    ['no services key', 'node: { name: a }\n'],
  ];
  for (const [why, text] of notCut) t.equal(splitServiceEntries(text), undefined, why);
});

/** A file of n services in the layouts people write: block and flow entries, comments, quoted and block scalars. */
function base(n: number): string {
  const out = ['# lb-agent', 'node:', '  name: vm-1', '  interface: eth0', 'pools:', '  range-global: 10.0.0.10-10.0.0.250', 'services:'];
  for (let i = 0; i < n; i++) {
    if (i % 3 === 0) out.push(`  - { name: s${i}, ipam: pool, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.1.${i + 1}, 10.0.2.${i + 1}] }`);
    else if (i % 3 === 1) out.push(`  - name: "s${i}"   # quoted`, '    ipam: pool', '    ports:', '      - port: 80', '        targetPort: 8080', '    backends:', `      - 10.0.1.${i + 1}`, `      - { address: 10.0.2.${i + 1}, weight: 2 }`, '');
    else out.push(`  - name: s${i}`, '    namespace: team-a', '    ipam: pool', '    annotations:', '      note: |', '        kept as written', '    ports: [{ port: 443, targetPort: 8443 }]', `    backends: [10.0.1.${i + 1}]`);
  }
  out.push('metrics:', '  listen: ""', '');
  return out.join('\n');
}

/** Edits of a file, each a function of its text: valid and invalid, in one entry, in several, in the other sections, in the layout. */
const EDITS: [string, (s: string) => string][] = [
  ['one backend changed', (s) => s.replace('10.0.1.2\n', '10.0.1.99\n')],
  ['and back', (s) => s.replace('10.0.1.99\n', '10.0.1.2\n')],
  ['a flow entry changed', (s) => s.replace('backends: [10.0.1.1,', 'backends: [10.0.1.77,')],
  ['a port out of range (schema error in one entry)', (s) => s.replace('port: 443, targetPort: 8443 }]\n    backends: [10.0.1.3]', 'port: 70000, targetPort: 8443 }]\n    backends: [10.0.1.3]')],
  ['fixed', (s) => s.replace('port: 70000', 'port: 443')],
  ['a backend that is not an address', (s) => s.replace('10.0.2.5, weight', 'ten.0.2.5, weight')],
  ['fixed again', (s) => s.replace('ten.0.2.5', '10.0.2.5')],
  ['a duplicate name', (s) => s.replace('name: s3,', 'name: s0,')],
  ['names apart', (s) => s.replace('name: s0, ipam: pool, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.1.4,', 'name: s3, ipam: pool, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.1.4,')],
  ['a YAML syntax error inside an entry', (s) => s.replace('name: "s4"', 'name: "s4')],
  ['closed', (s) => s.replace('name: "s4   #', 'name: "s4"   #')],
  ['a quoted scalar cut at an item line', (s) => s.replace('    ipam: pool\n    ports:\n      - port: 80\n        targetPort: 8080\n    backends:\n      - 10.0.1.8\n', '    ipam: pool\n    ports:\n      - port: 80\n        targetPort: 8080\n    backends:\n      - 10.0.1.8\n    annotations: { note: "a\n  - b" }\n')],
  ['uncut', (s) => s.replace('    annotations: { note: "a\n  - b" }\n', '')],
  ['a duplicate key in an entry', (s) => s.replace('    namespace: team-a\n    ipam: pool\n    annotations:\n      note: |\n        kept as written\n    ports: [{ port: 443, targetPort: 8443 }]\n    backends: [10.0.1.6]', '    namespace: team-a\n    namespace: team-b\n    ipam: pool\n    annotations:\n      note: |\n        kept as written\n    ports: [{ port: 443, targetPort: 8443 }]\n    backends: [10.0.1.6]')],
  ['no duplicate', (s) => s.replace('    namespace: team-b\n', '')],
  ['an unknown key in an entry', (s) => s.replace('  - name: s5\n', '  - name: s5\n    colour: blue\n')],
  ['known keys', (s) => s.replace('    colour: blue\n', '')],
  ['a pool narrowed (another section: unchanged entries now out of it)', (s) => s.replace('10.0.0.10-10.0.0.250', '10.0.0.10-10.0.0.12')],
  ['a pool wide again', (s) => s.replace('10.0.0.10-10.0.0.12', '10.0.0.10-10.0.0.250')],
  ['an explicit IP in the pool', (s) => s.replace('name: s6, ipam: pool,', 'name: s6, ipam: pool, loadBalancerIP: 10.0.0.40,')],
  ['the same IP asked for by a second service', (s) => s.replace('name: s9, ipam: pool,', 'name: s9, ipam: pool, loadBalancerIP: 10.0.0.40,')],
  ['one IP each', (s) => s.replace('name: s9, ipam: pool, loadBalancerIP: 10.0.0.40,', 'name: s9, ipam: pool,')],
  ['entries reordered', (s) => {
    const cut = splitServiceEntries(s)!;
    const e = [...cut.entries];
    [e[0], e[e.length - 1]] = [e[e.length - 1]!.endsWith('\n') ? e[e.length - 1]! : `${e[e.length - 1]!}\n`, e[0]!];
    return s.replace(cut.entries.join(''), e.join(''));
  }],
  ['an entry removed', (s) => s.replace(/ {2}- name: s11\n( {4}.*\n)*/, '')],
  ['an entry added', (s) => s.replace('metrics:\n', '  - { name: extra, ipam: pool, ports: [{ port: 80 }], backends: [10.0.9.1] }\nmetrics:\n')],
  ['a block scalar last in its entry (its last line break is its value\'s)', (s) => s.replace('    annotations:\n      note: |\n        kept as written\n    ports: [{ port: 443, targetPort: 8443 }]\n    backends: [10.0.1.9]\n', '    ports: [{ port: 443, targetPort: 8443 }]\n    backends: [10.0.1.9]\n    annotations:\n      cloudprovider.harvesterhci.io/healthcheck-port: |\n        8443\n')],
  ['the services key at the end of the file, with no last line break', (s) => `${s.replace(/services:\n[\s\S]*?metrics:\n {2}listen: ""\n/, 'metrics:\n  listen: ""\n')}${s.slice(s.indexOf('services:\n'), s.indexOf('metrics:\n')).trimEnd()}`],
  ['an alias (not cut)', (s) => s.replace('node:\n', 'x: &b 10.0.5.5\nnode:\n').replace('backends: [10.0.1.1,', 'backends: [*b,')],
  ['no alias', (s) => s.replace('x: &b 10.0.5.5\n', '').replace('backends: [*b,', 'backends: [10.0.1.1,')],
  ['a second services key', (s) => `${s}services: []\n`],
  ['one key', (s) => s.replace(/services: \[\]\n$/, '')],
  ['the file emptied', () => ''],
  ['refilled', () => base(14)],
  ['a services line inside another section\'s quoted scalar', (s) => s.replace('  name: vm-1\n', '  name: "vm-1\nservices:\n- x"\n')],
  ['a plain name', (s) => s.replace('  name: "vm-1\nservices:\n- x"\n', '  name: vm-1\n')],
  ['the only services line inside a quoted scalar, a valid entry after it', () => 'pools:\n  range-global: 10.0.0.10-10.0.0.250\nnode:\n  name: "vm-1\nservices:\n- { name: q, ipam: pool, ports: [{ port: 80 }], backends: [10.0.9.1] }\nend"\n'],
  ['a file again', () => base(14)],
];

t.test('a chain of edits, each parsed by entries with the last parse\'s reuse, gives the whole parse\'s result', async (t) => {
  let text = base(14);
  const start = parseConfigText(text, HOST);
  t.ok(start.ok, 'the base file loads');
  let reuse: ConfigReuse | undefined = start.ok ? start.reuse : undefined;
  let takenOnOneEdit = 0;
  for (const [what, edit] of EDITS) {
    const next = edit(text);
    t.not(next, text, `${what}: the edit changes the file`);
    text = next;
    const r = parseConfigText(text, HOST, reuse);
    const whole = parseWhole(text, HOST);
    t.same(shown(r), shown(whole), `${what}: the same result as the whole parse`);
    if (r.ok) {
      if (what === 'one backend changed' || what === 'and back' || what === 'a flow entry changed') takenOnOneEdit += r.reuse?.taken ?? 0;
      reuse = r.reuse;
    }
  }
  t.equal(takenOnOneEdit, 3 * 13, 'an edit of one entry of 14 validates that entry only: the other 13 are taken again');
});

t.test('every fixture, good and bad, parses by entries as it parses whole', async (t) => {
  let n = 0;
  for (const dir of ['good', 'bad']) {
    if (!fs.existsSync(path.join(FIX, dir))) continue;
    for (const f of fs.readdirSync(path.join(FIX, dir)).filter((x) => x.endsWith('.yaml'))) {
      const text = fs.readFileSync(path.join(FIX, dir, f), 'utf8');
      t.same(shown(parseConfigText(text, HOST)), shown(parseWhole(text, HOST)), `${dir}/${f}`);
      n++;
    }
  }
  t.ok(n >= 20, `fixtures compared: ${n}`);
});

t.test('an entry taken again is not parsed again: its config objects are the last parse\'s', async (t) => {
  const a = base(30);
  const first = parseConfigText(a, HOST);
  if (!first.ok) throw new Error(JSON.stringify(first.errors));
  const b = a.replace('10.0.1.2\n', '10.0.1.99\n');
  const second = parseConfigText(b, HOST, first.reuse);
  if (!second.ok) throw new Error(JSON.stringify(second.errors));
  t.equal(second.reuse?.taken, 29, '29 of 30 taken again');
  const changed = second.config.services.filter((s, i) => s !== first.config.services[i]).map((s) => s.name);
  t.same(changed, ['s1'], 'only the edited service is a new object');
});

/** A file of n DHCP services of two backends each; `edited`: service s(n/2)'s second backend another. */
function many(n: number, edited = false): string {
  const out = ['node:', '  name: vm-1', 'services:'];
  for (let i = 0; i < n; i++) {
    const second = edited && i === n >> 1 ? '10.2.0.1' : `10.1.${i >> 8}.${i & 255}`;
    out.push(`  - name: s${i}`, '    ipam: dhcp', '    ports: [{ port: 80, targetPort: 8080 }]', `    backends: [10.0.${i >> 8}.${i & 255}, ${second}]`);
  }
  out.push('metrics:', '  listen: ""', '');
  return out.join('\n');
}

/** What a reload's parse of a one-backend edit among n services does: entries parsed as YAML, handed to the validator, taken again. */
function oneEdit(n: number): { parsed: number | undefined; validated: number; taken: number } {
  const first = parseConfigText(many(n), HOST);
  if (!first.ok) throw new Error('the file does not load');
  const swap = parseConfigText(many(n, true), HOST, first.reuse);
  const back = swap.ok ? parseConfigText(many(n), HOST, swap.reuse) : swap;
  if (!back.ok || back.reuse === undefined) throw new Error('the edit does not load');
  return { parsed: back.reuse.parsed, validated: back.reuse.validated, taken: back.reuse.taken };
}

t.test('a one-backend edit among 1,000 entries parses and validates what one among 10 does', async (t) => {
  const ten = oneEdit(10);
  const thousand = oneEdit(1000);
  t.same(ten, { parsed: 1, validated: 1, taken: 9 }, 'among 10: the edited entry parsed and validated, 9 taken again');
  t.same({ parsed: thousand.parsed, validated: thousand.validated }, { parsed: ten.parsed, validated: ten.validated }, `the same at 1,000 (${JSON.stringify(thousand)})`);
  t.equal(thousand.taken, 999, 'the other 999 taken again');
});
