// The error-code list holds only codes the agent raises (issue 16: 18 of 40
// were never raised). A code in ERROR_CODES must be constructed somewhere in
// agent/ (`new LbError('LB_ERR_...'`), so a code added and never raised fails
// here first; the raise sites of each are listed. And a test must reach it:
// some test file other than this one names the code it expects.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ERROR_CODES, ERROR_HELP } from '../agent/errors';

const ROOT = path.resolve(__dirname, '..', '..');

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...sources(p));
    else if (e.name.endsWith('.ts')) out.push(p);
  }
  return out;
}

/** Where each code is constructed: "file:line" of every `new LbError('CODE'`. */
function raiseSites(): Map<string, string[]> {
  const sites = new Map<string, string[]>();
  for (const f of sources(path.join(ROOT, 'agent'))) {
    if (f.endsWith(`${path.sep}errors.ts`)) continue;
    const text = fs.readFileSync(f, 'utf8');
    for (const m of text.matchAll(/new LbError\(\s*'(LB_ERR_[A-Z_]+)'/g)) {
      const line = text.slice(0, m.index).split('\n').length;
      const list = sites.get(m[1]!) ?? [];
      list.push(`${path.relative(ROOT, f)}:${line}`);
      sites.set(m[1]!, list);
    }
  }
  return sites;
}

t.test('every code is raised in agent/, and nothing raises a code the list lacks', async (t) => {
  const sites = raiseSites();
  for (const code of ERROR_CODES) {
    const where = sites.get(code) ?? [];
    t.ok(where.length > 0, `${code} is raised${where.length > 0 ? ` at ${where.join(', ')}` : ' nowhere'}`);
  }
  // tsc already refuses an unknown literal; this keeps the scan honest.
  t.same([...sites.keys()].filter((c) => !(ERROR_CODES as readonly string[]).includes(c)), [], 'every raised code is in the list');
  t.ok(sites.size >= 20, `the scan found raise sites (${sites.size} codes)`);
});

t.test('a test expects each code', async (t) => {
  const tests = sources(path.join(ROOT, 'test')).filter((f) => f !== path.join(ROOT, 'test', 'errors.test.ts') && /\.test\.ts$/.test(f));
  const text = new Map(tests.map((f) => [f, fs.readFileSync(f, 'utf8')]));
  for (const code of ERROR_CODES) {
    const by = [...text].filter(([, s]) => s.includes(code)).map(([f]) => path.relative(ROOT, f));
    t.ok(by.length > 0, `${code} is expected by ${by.length > 0 ? by.join(', ') : 'no test'}`);
  }
});

t.test('every code has a cause and a fix (docs/troubleshooting.md is made of them)', async (t) => {
  t.same(Object.keys(ERROR_HELP).sort(), [...ERROR_CODES].sort(), 'one entry per code, none for a code that is gone');
  for (const code of ERROR_CODES) t.ok(ERROR_HELP[code].cause.length > 15 && ERROR_HELP[code].fix.length > 15, code);
});
