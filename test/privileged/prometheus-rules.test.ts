// examples/prometheus: the alerting rules are valid (`promtool check rules`)
// and their unit tests pass (`promtool test rules`), and those unit tests
// show every alert both firing and silent. Needs no privileges (no network):
// it lives beside prometheus-scrape.test.ts, which checks the same rules
// against a live agent and a real Prometheus server.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { load as parse } from 'js-yaml';
import { run } from '../../lab/netns';

const DIR = path.resolve(__dirname, '..', '..', '..', 'examples', 'prometheus');
const RULES = path.join(DIR, 'lb-agent.rules.yml');
const TESTS = path.join(DIR, 'lb-agent.rules.test.yml');

interface RuleFile { groups: { name: string; rules: { alert?: string; expr: string; for?: string; labels?: Record<string, string>; annotations?: Record<string, string> }[] }[] }
interface TestFile { rule_files: string[]; tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[] }

async function havePromtool(t: { fail(msg: string): unknown; plan(n: number, comment?: string): void }): Promise<boolean> {
  const r = await run('sh', ['-c', 'command -v promtool'], { allowFail: true });
  if (r.code === 0) return true;
  if (process.env.LB_AGENT_REQUIRE_PRIVILEGED === '1') t.fail('promtool is not installed (scripts/setup.sh installs prometheus)');
  else t.plan(0, 'skip: promtool is not installed (apt-get install prometheus)');
  return false;
}

t.test('promtool check rules accepts the rules', async (t) => {
  if (!(await havePromtool(t))) return;
  const r = await run('promtool', ['check', 'rules', RULES], { allowFail: true });
  t.equal(r.code, 0, `${r.stdout}${r.stderr}`);
  t.match(r.stdout, /SUCCESS: 7 rules found/);
});

t.test('promtool test rules passes', async (t) => {
  if (!(await havePromtool(t))) return;
  // promtool resolves rule_files against the test file's directory.
  const r = await run('promtool', ['test', 'rules', TESTS], { allowFail: true });
  t.equal(r.code, 0, `${r.stdout}${r.stderr}`);
  t.match(r.stdout, /SUCCESS/);
});

t.test('every alert is tested firing and silent, and says what to do', async (t) => {
  const rules = (parse(fs.readFileSync(RULES, 'utf8')) as RuleFile).groups.flatMap((g) => g.rules);
  const tests = (parse(fs.readFileSync(TESTS, 'utf8')) as TestFile).tests.flatMap((x) => x.alert_rule_test ?? []);
  const names = rules.map((r) => r.alert).filter((n): n is string => n !== undefined);
  t.same(names.sort(), ['LbAgentBackendDown', 'LbAgentDhcpLeaseExpiringSoon', 'LbAgentDown', 'LbAgentNoHealthyBackend', 'LbAgentPoolNearlyExhausted', 'LbAgentTrafficLeavesZone', 'LbAgentVipMissing']);
  for (const r of rules) {
    const n = r.alert!;
    t.ok(tests.some((x) => x.alertname === n && x.exp_alerts.length > 0), `${n}: a test where it fires`);
    t.ok(tests.some((x) => x.alertname === n && x.exp_alerts.length === 0), `${n}: a test where it does not`);
    t.ok(r.for, `${n} has a for: (no page on a single bad scrape)`);
    t.match(r.labels?.severity, /^(warning|critical)$/, `${n} has a severity`);
    t.ok(r.annotations?.summary && r.annotations.description, `${n} has a summary and a description`);
  }
});
