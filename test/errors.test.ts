// The error-code list holds only codes the agent raises (issue 16: 18 of 40
// were never raised). A code in ERROR_CODES must be constructed somewhere in
// agent/ (`new LbError('LB_ERR_...'`), so a code added and never raised fails
// here first.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ERROR_CODES } from '../agent/errors';

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

t.test('every code is raised in agent/', async (t) => {
  const text = sources(path.join(ROOT, 'agent')).filter((f) => !f.endsWith(`${path.sep}errors.ts`)).map((f) => fs.readFileSync(f, 'utf8')).join('\n');
  for (const code of ERROR_CODES) {
    const raised = new RegExp(`new LbError\\(\\s*'${code}'`).test(text);
    t.ok(raised, `${code} is raised (new LbError('${code}', ...))`);
  }
});
