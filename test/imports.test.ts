// The layers of the tree by what imports what (issue 16, DESIGN.md "lab/"):
// nothing outside test/ imports from test/ (or runs a file of it), and the
// agent imports neither lab/ nor bench/: the agent ships alone, and the lab
// the demo and the bench use is a library, not test code. Every relative
// import, export-from, require() and import() in agent/, bench/, lab/ and
// scripts/ is resolved against the tree, as are paths built to a file under
// dist/test/ (distPath('test', ...), path.join/resolve(..., 'test', ...)).
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..');

/** Top-level folders and what each may not reach. */
const FORBIDDEN: Record<string, readonly string[]> = {
  agent: ['test', 'lab', 'bench'],
  lab: ['test', 'bench'],
  bench: ['test'],
  scripts: ['test'],
};

interface Violation { file: string; target: string; how: string }

const SPECIFIERS = [
  /\b(?:import|export)\s+(?:type\s+)?(?:[^'";]*?\s+from\s+)?'([^']+)'/g,
  /\b(?:require|import)\(\s*'([^']+)'\s*\)/g,
];
/** A path into the built tests: distPath('test', ...) or path.join/resolve(..., 'test', ...). */
const TEST_PATH = /\b(?:distPath|path\.join|path\.resolve)\([^)]*'test'\s*[,)]/g;
/** Shell scripts: dist/test/ or a test/ file named by path. */
const SHELL_TEST_PATH = /(?:^|[\s"'=/])(?:dist\/)?test\/[\w./-]+\.(?:js|ts)\b/gm;

/** Where one file's text reaches a forbidden top-level folder; `file` is relative to the root. */
function violations(file: string, text: string): Violation[] {
  const top = file.split('/')[0]!;
  const forbidden = FORBIDDEN[top] ?? [];
  const out: Violation[] = [];
  // Comments may name test files (a README pointer); only code counts.
  const code = file.endsWith('.sh')
    ? text.split('\n').filter((l) => !/^\s*#/.test(l)).join('\n')
    : text.replace(/\/\*[\s\S]*?\*\//g, '').split('\n').map((l) => l.replace(/(^|[^:'"])\/\/.*$/, '$1')).join('\n');
  if (!file.endsWith('.sh')) {
    for (const re of SPECIFIERS) {
      for (const m of code.matchAll(re)) {
        const spec = m[1]!;
        if (!spec.startsWith('.')) continue;
        const target = path.posix.normalize(path.posix.join(path.posix.dirname(file), spec));
        const targetTop = target.split('/')[0]!;
        if (forbidden.includes(targetTop)) out.push({ file, target, how: `imports '${spec}'` });
      }
    }
    if (forbidden.includes('test')) {
      for (const m of code.matchAll(TEST_PATH)) out.push({ file, target: 'test', how: m[0] });
    }
  } else if (forbidden.includes('test')) {
    for (const m of code.matchAll(SHELL_TEST_PATH)) out.push({ file, target: 'test', how: m[0].trim() });
  }
  return out;
}

function files(dir: string): string[] {
  const out: string[] = [];
  if (!fs.existsSync(dir)) return out;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) { if (e.name !== 'results' && e.name !== '.work') out.push(...files(p)); }
    else if (/\.(ts|js|sh)$/.test(e.name)) out.push(p);
  }
  return out;
}

t.test('the checker sees each kind of reach it is meant to refuse', async (t) => {
  const cases: [string, string, boolean][] = [
    ['bench/x.ts', "import { Lab } from '../test/helpers/netns';", true],
    ['bench/lib/x.ts', "import type { Lab } from '../../test/helpers/netns';", true],
    ['bench/x.ts', "import {\n  a,\n  b,\n} from '../test/privileged/fixtures/y';", true],
    ['lab/x.ts', "const y = require('../test/z');", true],
    ['lab/x.ts', "export { a } from '../bench/lib/stats';", true],
    ['lab/x.ts', "const f = distPath('test', 'privileged', 'fixtures', 'a.js');", true],
    ['bench/x.ts', "const f = path.resolve(__dirname, '..', 'test', 'a.js');", true],
    ['agent/x/y.ts', "import { startAgent } from '../../lab/agent';", true],
    ['agent/x/y.ts', "const m = await import('../../bench/run');", true],
    ['scripts/x.sh', 'node dist/test/privileged/fixtures/a.js', true],
    ['lab/x.ts', "import { controlRequest } from '../agent/control/server';", false],
    ['bench/x.ts', "import { Lab } from '../lab/netns';", false],
    ['bench/x.ts', '// see test/privileged/continuity-systemd.test.ts', false],
    ['scripts/x.sh', '# test/privileged/service-systemd.test.ts boots it', false],
    ['agent/x/y.ts', "import pino from 'pino';", false],
  ];
  for (const [file, text, bad] of cases) {
    t.equal(violations(file, text).length > 0, bad, `${file}: ${JSON.stringify(text)} is ${bad ? 'refused' : 'allowed'}`);
  }
});

t.test('nothing outside test/ reaches into test/; agent/ reaches neither lab/ nor bench/', async (t) => {
  const found: Violation[] = [];
  let scanned = 0;
  let imports = 0;
  for (const top of Object.keys(FORBIDDEN)) {
    for (const f of files(path.join(ROOT, top))) {
      const rel = path.relative(ROOT, f).split(path.sep).join('/');
      const text = fs.readFileSync(f, 'utf8');
      scanned++;
      imports += (text.match(/ from '\./g) ?? []).length;
      found.push(...violations(rel, text));
    }
  }
  t.ok(scanned > 100 && imports > 300, `the scan read the tree (${scanned} files, ${imports} relative imports)`);
  t.same(found.map((v) => `${v.file} ${v.how}`), [], 'no file reaches a layer it must not');
});
