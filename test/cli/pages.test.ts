// agent/cli/pages.ts: the generated pages committed in docs/ are what the
// generators print now (run `npm run docs` after a change to the schema, an
// error code or a check), and `lb-agent man config` prints lb-agent.yaml(5)
// while `lb-agent man` still prints lb-agent(8).
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { generatedPages, configManPage, troubleshootingPage } from '../../agent/cli/pages';
import { ERROR_CODES } from '../../agent/errors';
import { CHECK_IDS } from '../../agent/preflight/help';
import { VERSION } from '../../agent/version';

const ROOT = path.resolve(__dirname, '..', '..', '..');

t.test('every generated page in the repository matches its generator (else: npm run docs)', async (t) => {
  const pages = generatedPages();
  t.same(Object.keys(pages).sort(), ['docs/configuration.md', 'docs/troubleshooting.md']);
  for (const [rel, text] of Object.entries(pages)) {
    const file = path.join(ROOT, rel);
    t.ok(fs.existsSync(file), `${rel} exists`);
    t.ok(fs.existsSync(file) && fs.readFileSync(file, 'utf8') === text, `${rel} is up to date (run npm run docs)`);
  }
});

t.test('troubleshooting: every code and check id, in definition order', async (t) => {
  const page = troubleshootingPage();
  let at = 0;
  for (const id of CHECK_IDS) { const i = page.indexOf(`### \`${id}\``); t.ok(i > at, `${id} after the one before`); at = i; }
  for (const code of ERROR_CODES) t.match(page, `| \`${code}\` |`);
});

t.test('lb-agent man config prints lb-agent.yaml(5); lb-agent man still prints lb-agent(8)', async (t) => {
  const cli = path.join(ROOT, 'dist', 'bundle', 'lb-agent.js');
  const env = { ...process.env, LB_AGENT_CODE_CACHE: 'off' };
  const five = spawnSync(process.execPath, [cli, 'man', 'config'], { encoding: 'utf8', env, timeout: 30_000 });
  t.equal(five.status, 0, five.stderr);
  t.equal(five.stdout, configManPage(VERSION));
  const eight = spawnSync(process.execPath, [cli, 'man'], { encoding: 'utf8', env, timeout: 30_000 });
  t.equal(eight.status, 0, eight.stderr);
  t.match(eight.stdout, /^\.TH LB(\\-|-)AGENT 8 /m);
  t.match(eight.stdout, /^\.SS "lb-agent man .*\[page\]"$/m, 'lists the man command and its page argument');
  const bad = spawnSync(process.execPath, [cli, 'man', 'nope'], { encoding: 'utf8', env, timeout: 30_000 });
  t.equal(bad.status, 2, 'an unknown page is a usage error');
});
