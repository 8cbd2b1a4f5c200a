// agent/preflight/help.ts: every finding `lb-agent check` can report has its
// description (what, cause, fix), so docs/troubleshooting.md covers it.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Facts } from '../../agent/preflight/facts';
import { runChecks } from '../../agent/preflight/checks';
import { CHECK_HELP, CHECK_IDS } from '../../agent/preflight/help';

const FIX = path.resolve(__dirname, '..', '..', '..', 'test', 'preflight', 'fixtures');

t.test('every id a check can return is described', async (t) => {
  // From the compiled checks: every id a check names (`const id = '...'`, or pass/warn/fail('...')).
  const src = fs.readFileSync(require.resolve('../../agent/preflight/checks'), 'utf8');
  const named = new Set([...src.matchAll(/const id = '([a-z-]+)'|\b(?:pass|warn|fail)\('([a-z-]+)'/g)].map((m) => m[1] ?? m[2]!));
  t.ok(named.size >= 18, `ids named in checks.js: ${[...named].join(', ')}`);
  for (const id of named) t.ok((CHECK_IDS as readonly string[]).includes(id), `${id} is in CHECK_IDS`);
  // And from behaviour: every id the fixtures produce.
  for (const file of fs.readdirSync(FIX).filter((f) => f.endsWith('.json'))) {
    const facts = JSON.parse(fs.readFileSync(path.join(FIX, file), 'utf8')) as Facts;
    for (const r of runChecks(facts)) t.ok((CHECK_IDS as readonly string[]).includes(r.id), `${file}: ${r.id} is described`);
  }
});

t.test('each description says what it looks at, the cause and the fix', async (t) => {
  for (const id of CHECK_IDS) {
    const h = CHECK_HELP[id];
    t.ok(h.what.length > 15 && h.cause.length > 15 && h.fix.length > 10, id);
  }
  t.match(CHECK_HELP['ip-forward'].cause, /sets it to 1 itself/, 'ip-forward: the daemon sets it, as the check says');
});
