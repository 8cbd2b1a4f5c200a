// The agent as Prometheus sees it: the live /metrics exposition of a running
// agent (a DHCP service and a pool service on the real kernel) passes
// `promtool check metrics`, carries every series examples/prometheus's rules
// use, and a real Prometheus server in another namespace scrapes it and sees
// a backend go from up (1) to down (0) when the backend dies.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, run, waitFor, Lab } from '../../lab/netns';
import { startBackend, startDnsmasq, httpGetFrom } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import { startPrometheus, promQuery } from '../../lab/prometheus';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const RULES = path.join(ROOT, 'examples', 'prometheus', 'lb-agent.rules.yml');
const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.3, timeoutSeconds: 0.3, failureThreshold: 2 };

function config(): Record<string, unknown> {
  return {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '10.99.0.2:9477' },
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    arp: FAST_ARP,
    dhcp: { retransmitInitial: 0.5, retransmitMax: 2 },
    services: [
      { name: 'web', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      { name: 'api', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11', '10.99.0.12'], healthCheck: HC },
    ],
  };
}

/** The metric family names an exposition declares (# TYPE lines). */
function families(exposition: string): Set<string> {
  const out = new Set<string>();
  for (const m of exposition.matchAll(/^# TYPE (\S+) \S+$/gm)) out.add(m[1]!);
  return out;
}

interface RulesDoc { data: { groups: { rules: { name: string; health: string; lastError?: string; lastEvaluation?: string }[] }[] } }
interface Alert { labels: Record<string, string>; state: string; value: string }

/** The server's pending and firing alerts. */
async function alerts(lab: Lab, ns: string, base: string): Promise<Alert[]> {
  const r = await httpGetFrom(lab, ns, `${base}/api/v1/alerts`);
  if (!r.ok) throw new Error(`alerts: ${r.error}`);
  return (JSON.parse(r.body) as { data: { alerts: Alert[] } }).data.alerts;
}

t.test('Prometheus and the agent', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await lab.addHost('b2', { address: '10.99.0.12/24' });
  const mon = await lab.addHost('mon', { address: '10.99.0.60/24' });
  await startDnsmasq(lab, lab.ns('dhcp'), { range: '10.99.0.100,10.99.0.150', noPing: true });
  await startBackend(lab, lab.ns('b1'), 'b1');
  const b2 = await startBackend(lab, lab.ns('b2'), 'b2');

  const agent = await startAgent(lab, node, config(), { logLevel: 'info' });
  await waitStatus(agent, 'both services serving with all backends up',
    (s) => s.services.length === 2 && s.services.every((x) => x.ready && x.healthyBackends === x.backends.length), 30_000);
  const scrape = await httpGetFrom(lab, mon, 'http://10.99.0.2:9477/metrics');
  t.ok(scrape.ok, `scraped /metrics ${scrape.error ?? ''}`);
  const body = scrape.body;

  t.test('promtool check metrics finds no problem in the live exposition', async (t) => {
    const r = await run('promtool', ['check', 'metrics'], { input: body, allowFail: true });
    const findings = `${r.stdout}${r.stderr}`.trim();
    t.equal(r.code, 0, 'promtool check metrics exits 0');
    t.equal(findings, '', 'no lint findings');
    t.comment(`${families(body).size} metric families exported`);
  });

  t.test('every series the alerting rules use is exported', async (t) => {
    const exported = families(body);
    const used = new Set([...fs.readFileSync(RULES, 'utf8').matchAll(/\blbagent_[a-z0-9_]+/g)].map((m) => m[0]));
    t.ok(used.size >= 5, `the rules use ${[...used].join(', ')}`);
    for (const name of used) t.ok(exported.has(name), `${name} is exported`);
    // The label values the rules match on, as the agent spells them.
    t.match(body, /^lbagent_dhcp_state\{[^}]*state="BOUND"[^}]*\} 1$/m, 'lbagent_dhcp_state{state="BOUND"} (LbAgentDhcpLeaseExpiringSoon)');
    t.match(body, /^lbagent_pool_size\{pool="range-global"\} \d+$/m, 'pools labelled by their config key');
  });

  t.test('a real Prometheus server scrapes it and sees a backend die', async (t) => {
    const { proc: prom, base } = await startPrometheus(lab, mon, { listen: '10.99.0.60:9090', targets: ['10.99.0.2:9477'], rules: RULES });

    const up = (v: string) => async () => {
      const res = await promQuery(lab, mon, base, 'lbagent_health_backend_up{service="api",backend=~"10.99.0.12.*"}');
      return res.length === 1 && res[0]!.value[1] === v ? res : undefined;
    };
    const first = await waitFor('Prometheus to see b2 up', up('1'), 20_000, 300);
    t.match(first[0]!.metric, { namespace: 'default', job: 'lb-agent', instance: '10.99.0.2:9477' }, 'lbagent_health_backend_up for b2 is 1, with the scrape labels');
    const target = await promQuery(lab, mon, base, 'up{job="lb-agent"}');
    t.equal(target[0]?.value[1], '1', 'the scrape target is up');

    // A few evaluation rounds (1 s each) on scraped data before judging the rules.
    await new Promise((r) => setTimeout(r, 3000));
    const rules = await waitFor('every rule evaluated without error', async () => {
      const r = await httpGetFrom(lab, mon, `${base}/api/v1/rules`);
      const rs = (JSON.parse(r.body) as RulesDoc).data.groups.flatMap((g) => g.rules);
      return rs.length > 0 && rs.every((x) => x.health === 'ok' && x.lastEvaluation !== undefined && !x.lastEvaluation.startsWith('0001')) ? rs : undefined;
    }, 10_000, 300);
    t.same(rules.map((r) => r.name).sort(), ['LbAgentBackendDown', 'LbAgentDhcpLeaseExpiringSoon', 'LbAgentDown', 'LbAgentNoHealthyBackend', 'LbAgentPoolNearlyExhausted', 'LbAgentVipMissing'],
      'the server loaded every rule and each evaluates against the live series');

    // All healthy: no alert may even be pending (every rule has a `for`, so
    // pending is the first thing a wrong expression would show).
    const quiet = await alerts(lab, mon, base);
    t.same(quiet.map((a) => a.labels), [], 'no alert pending while everything is healthy (the DHCP service exports its VIP too)');

    await b2.stop();
    await waitFor('Prometheus to see b2 down', up('0'), 20_000, 300);
    t.pass('lbagent_health_backend_up went from 1 to 0 after the backend was killed');
    const down = await waitFor('LbAgentBackendDown to be pending for b2', async () => {
      const a = await alerts(lab, mon, base);
      return a.find((x) => x.labels.alertname === 'LbAgentBackendDown');
    }, 10_000, 300);
    t.match(down, { state: 'pending', labels: { service: 'api', namespace: 'default', backend: '10.99.0.12:8080', severity: 'warning', instance: '10.99.0.2:9477' } },
      'the backend-down alert is pending (it fires after its `for: 1m`)');
    prom.kill('SIGTERM');
  });
});
