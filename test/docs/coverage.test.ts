// What the documentation must cover, held against the definitions: every
// config key in docs/configuration.md and lb-agent.yaml(5), every error code
// and check finding in docs/troubleshooting.md with a cause and a fix, every
// alert of the Prometheus rules in docs/operations.md, and the answers a
// newcomer looks for first.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { schemaKeys } from '../../agent/config/reference';
import { configManPage } from '../../agent/cli/pages';
import { ERROR_CODES } from '../../agent/errors';
import { CHECK_IDS } from '../../agent/preflight/help';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const read = (rel: string): string => fs.readFileSync(path.join(ROOT, rel), 'utf8');

t.test('every key of the schema is in docs/configuration.md and in lb-agent.yaml(5)', async (t) => {
  const keys = schemaKeys().map((k) => k.path);
  t.ok(keys.includes('services[].healthCheck.http.expectStatus') && keys.includes('services[].backends[].zone') && keys.includes('pools.<key>'), 'nested objects, array items and open maps are walked');
  const page = read('docs/configuration.md');
  const man = configManPage('test').replace(/\\-/g, '-');
  for (const k of keys) {
    t.ok(page.includes(`\`${k}\``) || page.includes(`## \`${k}\``), `${k} in docs/configuration.md`);
    t.ok(man.includes(`.B ${k}\n`), `${k} in lb-agent.yaml(5)`);
  }
});

t.test('every error code and every check finding is in docs/troubleshooting.md, each with a cause and a fix', async (t) => {
  const page = read('docs/troubleshooting.md');
  for (const code of ERROR_CODES) {
    const row = page.split('\n').find((l) => l.startsWith(`| \`${code}\` |`));
    const cells = row?.split(/(?<!\\)\|/).map((c) => c.trim()).filter(Boolean) ?? [];
    t.ok(cells.length === 3 && cells[1]!.length > 10 && cells[2]!.length > 10, `${code}: a row with a cause and a fix`);
  }
  for (const id of CHECK_IDS) {
    const section = page.split(/^### /m).find((s) => s.startsWith(`\`${id}\`\n`));
    t.ok(section && /\*\*Cause:\*\* \S/.test(section) && /\*\*Fix:\*\* \S/.test(section), `check ${id}: a section with a cause and a fix`);
  }
});

t.test('every alert of the Prometheus rules is explained in docs/operations.md', async (t) => {
  const rules = read('examples/prometheus/lb-agent.rules.yml');
  const alerts = [...rules.matchAll(/^\s*- alert:\s*(\S+)/gm)].map((m) => m[1]!);
  t.ok(alerts.length >= 7, `alerts read: ${alerts.join(', ')}`);
  const ops = read('docs/operations.md');
  for (const a of alerts) t.match(ops, new RegExp(`^\\| \`${a}\` \\| \\w+ \\| .{20,} \\| .{10,} \\|$`, 'm'), `${a}: a row with when it fires and what to do`);
});

t.test('a newcomer finds the first answers in docs/', async (t) => {
  const docs = Object.fromEntries(fs.readdirSync(path.join(ROOT, 'docs')).map((f) => [f, read(`docs/${f}`)]));
  t.match(docs['datapaths.md'], /## Where a VIP lives[\s\S]*node:\n {2}interface: eth1/, 'a VIP on a given NIC: node.interface, with an example');
  t.match(docs['operations.md'], /## Restart[\s\S]*make a restart hitless/, 'how to make a restart hitless');
  t.match(docs['troubleshooting.md'], /### `macvlan`[\s\S]*?\*\*Fix:\*\*.*kernel-default/, 'what to do when check says the macvlan driver is missing');
  t.match(docs['install.md'], /sets `net\.ipv4\.ip_forward=1`/, 'who sets ip_forward, as the check says');
});
