// agent/config/yaml.ts: js-yaml with the node tree its parse listener gives -
// lines by path (block, flow, empty values, comments), aliases counted as
// expanded, and the core schema (no merge keys, no timestamps).
import t from 'tap';
import { parseYaml, MAX_ALIAS_COUNT } from '../../agent/config/yaml';

function ok(text: string): { data: unknown; locate: (segs: (string | number)[]) => number | undefined } {
  const r = parseYaml(text);
  if (!r.ok) throw new Error(`refused: ${r.message}`);
  return r;
}

t.test('the line of a node by its path (a collection: where its first entry is), or of its nearest ancestor', async (t) => {
  const y = ok([
    '# a comment', //                                     1
    'node:', //                                           2
    '  priority:', //                                     3 (empty value)
    'services:', //                                       4
    '  - name: web', //                                   5
    '    ports:', //                                      6
    '', //                                                7
    '      # the ports', //                               8
    '      - port: 80', //                                9
    '        targetPort: 8080', //                        10
    '  - { name: api, ports: [ { port: 81 }, { port: 82, bogus: 1 } ] }', // 11
    '  - name: "quoted: colon"', //                       12
    '    backends:', //                                   13
    '      - 10.0.0.1', //                                14
    '      - 10.0.0.2', //                                15
    '', ''].join('\n'));
  const cases: Array<[(string | number)[], number]> = [
    [[], 2], [['node'], 3], [['node', 'priority'], 3], [['services'], 5], [['services', 0], 5], [['services', 0, 'name'], 5],
    [['services', 0, 'ports'], 9], [['services', 0, 'ports', 0], 9], [['services', 0, 'ports', 0, 'targetPort'], 10],
    [['services', 1], 11], [['services', 1, 'ports', 1, 'bogus'], 11], [['services', 2, 'name'], 12],
    [['services', 2, 'backends', 1], 15], [['services', 2, 'nope'], 12], [['services', 9], 5], [['nope', 'deeper'], 2],
  ];
  for (const [segs, line] of cases) t.equal(y.locate(segs), line, JSON.stringify(segs));
  t.same((y.data as { node: unknown }).node, { priority: null });
});

t.test('a flow mapping entry without a value does not shift the pairs after it', async (t) => {
  const y = ok('a: { x, y: 1 }\nb:\n  c: 2\n');
  t.same(y.data, { a: { x: null, y: 1 }, b: { c: 2 } });
  t.equal(y.locate(['a', 'y']), 1);
  t.equal(y.locate(['b', 'c']), 3);
});

t.test('aliases: counted as expanded, refused past the limit at the first alias, before anything expands them', async (t) => {
  const use = (n: number): string => `a: &a [x]\nb: [${Array(n).fill('*a').join(', ')}]\n`;
  t.ok(parseYaml(use(MAX_ALIAS_COUNT)).ok, `${MAX_ALIAS_COUNT} uses are fine`);
  const over = parseYaml(use(MAX_ALIAS_COUNT + 1));
  t.match(over, { ok: false, kind: 'aliases', message: /aliases expand too far/, line: 2 });
  // 27 aliases in the text, 9 + 81 + 729 in the expansion.
  const nested = parseYaml('a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n');
  t.match(nested, { ok: false, message: /aliases expand too far/, line: 2 });
  const started = Date.now();
  const bomb = parseYaml(['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]', ...'bcdefghi'.split('').map((k, i) => `${k}: &${k} [${Array(9).fill(`*${'abcdefghi'[i]}`).join(',')}]`), ''].join('\n'));
  t.match(bomb, { ok: false, line: 2 });
  t.ok(Date.now() - started < 500, `a billion laughs refused in ${Date.now() - started} ms`);
  t.ok(parseYaml('a: &x 1\nb: *x\nc: *x\n').ok, 'scalar aliases');
  t.match(parseYaml('a: *nope\n'), { ok: false, message: /unidentified alias/, line: 1 });
});

t.test('core schema and the errors js-yaml gives', async (t) => {
  t.same(ok('a: &m { x: 1 }\nb: { <<: *m }\nwhen: 2001-12-14\nn: 0x10\nnull: ~\n').data, { a: { x: 1 }, b: { '<<': { x: 1 } }, when: '2001-12-14', n: 16, null: null },
    'no merge keys, no timestamps; hex integers and ~ as YAML 1.2 core');
  t.match(parseYaml('a: 1\nb: 2\na: 3\n'), { ok: false, kind: 'syntax', message: 'duplicated mapping key', line: 3, column: 1 });
  t.match(parseYaml('services:\n  - [a\n'), { ok: false, line: 3 });
  t.match(parseYaml('a:\n\t- b\n'), { ok: false, line: 2, message: /tab/ });
  t.equal(ok('').data, undefined);
  t.equal(ok('# nothing\n').locate([]), undefined, 'an empty document has no line');
});
