// examples/grafana/lb-agent.json against the real thing: every PromQL
// expression in the dashboard (panel targets and template variables), with
// Grafana's variables and macros substituted as Grafana would
// (dashboardQueries), is run against a real Prometheus scraping a real agent
// in a lab and must return at least one series. The lab gives each panel its
// data: a DHCP service (dnsmasq), a pool service, VRRP, client traffic, a
// backend down, an applied and a rejected reload, a forged VRRP advert.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startBackend, startDnsmasq, httpGetManyFrom } from '../../lab/services';
import { startAgent, waitStatus, agentCli } from '../../lab/agent';
import { startPrometheus, promQueryEach, type PromVector } from '../../lab/prometheus';
import { forge } from './fixtures/failover-client';
import { encodeAdvertisement } from '../../agent/failover/codec';
import { parseIPv4 } from '../../agent/address';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const DASHBOARD = path.join(ROOT, 'examples', 'grafana', 'lb-agent.json');
const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.3, timeoutSeconds: 0.3, failureThreshold: 2 };
const SCRAPE_S = 1;
const VRID = 51;

interface Target { expr?: string; refId: string }
interface Panel { title: string; type: string; targets?: Target[]; panels?: Panel[] }
interface Dashboard { panels: Panel[]; templating: { list: { name: string; type: string; query?: string | { query: string }; allValue?: string }[] } }

/**
 * Every PromQL expression of the dashboard, as Grafana would send it with
 * every template variable at "All" (its allValue, `.*`), $__rate_interval at
 * four scrape intervals (Grafana's minimum), $__interval at one, $__range at
 * one minute. A variable's label_values(metric, label) becomes
 * `count by (label) (metric)`, the PromQL Grafana's own query amounts to.
 */
function dashboardQueries(d: Dashboard, scrapeSeconds: number): { what: string; expr: string }[] {
  const vars = new Map(d.templating.list.filter((v) => v.type === 'query').map((v) => [v.name, v.allValue ?? '.*']));
  const subst = (e: string): string => e
    .replace(/\$__rate_interval|\$\{__rate_interval\}/g, `${4 * scrapeSeconds}s`)
    .replace(/\$__interval|\$\{__interval\}/g, `${scrapeSeconds}s`)
    .replace(/\$__range|\$\{__range\}/g, '1m')
    .replace(/\$\{?([a-z_]+)\}?/g, (m, n: string) => vars.get(n) ?? m);
  const out: { what: string; expr: string }[] = [];
  const walk = (ps: Panel[]): void => {
    for (const p of ps) {
      for (const tg of p.targets ?? []) if (tg.expr) out.push({ what: `${p.title} (${tg.refId})`, expr: subst(tg.expr) });
      walk(p.panels ?? []);
    }
  };
  walk(d.panels);
  for (const v of d.templating.list.filter((x) => x.type === 'query')) {
    const q = typeof v.query === 'string' ? v.query : v.query!.query;
    const m = /^label_values\((.+),\s*([a-z_]+)\)$/.exec(q);
    if (!m) throw new Error(`variable ${v.name}: not label_values(metric, label): ${q}`);
    out.push({ what: `variable $${v.name}`, expr: subst(`count by (${m[2]}) (${m[1]})`) });
  }
  return out;
}

t.test('every query of the Grafana dashboard returns series from a real agent', async (t) => {
  if (!requirePrivileged(t)) return;
  const dashboard = JSON.parse(fs.readFileSync(DASHBOARD, 'utf8')) as Dashboard;
  const queries = dashboardQueries(dashboard, SCRAPE_S);
  const text = queries.map((q) => q.expr).join('\n');
  t.notMatch(text, /\$/, 'no Grafana variable or macro is left after substitution');
  // The areas the issue names, each on a panel.
  for (const m of ['lbagent_service_vip_info', 'lbagent_vrrp_state', 'lbagent_health_backend_up', 'lbagent_dhcp_lease_expiry_timestamp_seconds',
    'lbagent_forward_connections_total', 'lbagent_forward_bytes_total', 'lbagent_health_probe_duration_seconds_bucket', 'lbagent_pool_in_use',
    'lbagent_config_reloads_total', 'lbagent_dhcp_dropped_packets_total', 'lbagent_service_vip_interruptions_total']) t.match(text, m, `the dashboard shows ${m}`);

  const lab = await createLab(t);
  await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await lab.addHost('b2', { address: '10.99.0.12/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  const mon = await lab.addHost('mon', { address: '10.99.0.60/24' });
  await startDnsmasq(lab, lab.ns('dhcp'), { range: '10.99.0.100,10.99.0.150', noPing: true });
  await startBackend(lab, lab.ns('b1'), 'b1');
  const b2 = await startBackend(lab, lab.ns('b2'), 'b2');
  const cfg = {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '10.99.0.2:9477' },
    pools: { 'range-global': '10.99.0.200-10.99.0.203' },
    arp: FAST_ARP,
    dhcp: { retransmitInitial: 0.5, retransmitMax: 2 },
    failover: { mode: 'vrrp', vrid: VRID, advertInterval: 0.1, preemptDelay: 0 },
    services: [
      { name: 'web', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      { name: 'web2', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      // A topology policy: the backend-set panel shows services that have one.
      { name: 'api', ipam: 'pool', topology: 'prefer-zone', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11', '10.99.0.12'], healthCheck: HC },
    ],
  };
  const agent = await startAgent(lab, node, cfg, { logLevel: 'info' });
  const st = await waitStatus(agent, 'all services serving with all backends up',
    (s) => s.services.length === 3 && s.services.every((x) => x.state === 'serving' && x.ready && x.healthyBackends === x.backends.length), 30_000);
  const prom = await startPrometheus(lab, mon, { listen: '10.99.0.60:9090', targets: ['10.99.0.2:9477'], scrapeSeconds: SCRAPE_S });

  // Traffic through both VIPs (connections, bytes), then b2 down, then two reloads.
  for (const s of st.services) for (const r of await httpGetManyFrom(lab, client, `http://${s.vip}/`, 3)) t.ok(r.ok, `GET ${s.name} ${s.vip}`);
  // A VRRP advert with TTL 64 (RFC 5798 §7.1 wants 255) from another host: dropped and counted by reason.
  await lab.sh(lab.lan, 'ip link set br0 type bridge mcast_snooping 0');
  t.equal(await forge(lab, client, [encodeAdvertisement({ vrid: VRID, priority: 255, maxAdverIntCs: 10, addresses: [parseIPv4('10.99.0.200')!], srcIp: parseIPv4('10.99.0.50')!, ttl: 64 })], { repeat: 3 }), 3, 'forged adverts sent');
  await b2.stop();
  await waitStatus(agent, 'b2 down', (s) => s.services.find((x) => x.name === 'api')?.healthyBackends === 1, 10_000);
  agent.writeConfig({ ...cfg, services: cfg.services.map((s) => (s.name === 'web2' ? { ...s, ports: [{ port: 81, targetPort: 8080 }] } : s)) });
  t.equal((await agentCli(lab, node, ['reload', '--socket', agent.socket])).code, 0, 'a reload applied');
  fs.writeFileSync(agent.configPath, 'services:\n  - name: broken\n');
  t.equal((await agentCli(lab, node, ['reload', '--socket', agent.socket])).code, 2, 'a reload rejected');

  t.comment(`${queries.length} expressions`);
  const started = Date.now();
  // Each round asks every expression still without series, from one process
  // (a process per query was most of this test's time); each has 15 s from
  // here to return some (the first waits for a few scrapes: rate() needs two samples).
  const last = new Map<string, PromVector | Error>();
  let pending = queries;
  await waitFor('every expression to return series', async () => {
    const answers = await promQueryEach(lab, mon, prom.base, pending.map((q) => q.expr));
    pending = pending.filter((q, i) => {
      const r = answers[i]!;
      last.set(q.what, r);
      if (r instanceof Error || r.length === 0) return true;
      t.pass(`${q.what}: ${r.length} series`);
      return false;
    });
    return pending.length === 0;
  }, 15_000, 500).catch(() => undefined);
  for (const q of pending) {
    const r = last.get(q.what);
    t.fail(`${q.what}: no series within 15000 ms\n${q.expr}\nlast: ${r instanceof Error ? r.message : JSON.stringify(r)}`);
  }
  t.comment(`all expressions answered in ${Date.now() - started} ms`);
});
