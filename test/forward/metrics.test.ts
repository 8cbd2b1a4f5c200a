// Unit tests of the forward metrics: values come from the stats source at
// scrape time, one read per scrape, last good values on a failed read (with
// the failure counted, logged and aged), and nothing left on the registry
// after unregister().
import t from 'tap';
import { Counter, Gauge, Registry } from 'prom-client';
import { ForwardMetrics, StatsReadFailure } from '../../agent/forward/metrics';
import { createLogger } from '../../agent/log';
import type { ForwardStats } from '../../agent/forward/dataplane';

const stats = (conns: number): ForwardStats => ({
  kind: 'kernel',
  services: [{ key: 'shop/web', vip: '10.0.0.1', healthy: 0, backends: 1, noHealthyBackend: true }],
  flows: [{ service: 'shop/web', port: 'http', protocol: 'TCP', backend: '10.0.0.11', connections: conns, active: undefined, bytesToBackend: 100, bytesToClient: 2000, connectFailures: undefined }],
  problems: [],
  udpFlowsEnded: [{ service: 'shop/web', port: 'dns', ended: 4 }],
  handedBack: [{ service: 'shop/web', packets: 2 }],
  details: {},
});

t.test('scrape reads stats once and exports every metric', async (t) => {
  const registry = new Registry();
  let reads = 0;
  let now = 0;
  const m = new ForwardMetrics({ registry, kind: 'kernel', reason: 'auto: nftables probe passed', stats: async () => { reads++; return stats(7); }, now: () => now });
  const text = await registry.metrics();
  t.equal(reads, 1, 'one stats() read serves the whole scrape');
  t.match(text, /lbagent_forward_connections_total\{service="web",namespace="shop",backend="10\.0\.0\.11",port="http"\} 7/);
  t.match(text, /lbagent_forward_bytes_total\{service="web",namespace="shop",backend="10\.0\.0\.11",direction="to_backend"\} 100/);
  t.match(text, /lbagent_forward_bytes_total\{service="web",namespace="shop",backend="10\.0\.0\.11",direction="to_client"\} 2000/);
  t.match(text, /lbagent_forward_dataplane_info\{kind="kernel",reason="auto: nftables probe passed"\} 1/);
  t.match(text, /lbagent_forward_no_healthy_backend\{service="web",namespace="shop"\} 1/);
  t.match(text, /lbagent_forward_udp_flows_ended_total\{service="web",namespace="shop",port="dns"\} 4/);
  t.match(text, /lbagent_forward_handed_back_packets_total\{service="web",namespace="shop"\} 2/);
  t.notMatch(text, /lbagent_forward_active_connections\{/, 'no active gauge values from the kernel path');
  t.notMatch(text, /lbagent_forward_connect_failures_total\{/, 'nor connect failures');
  now += 1000;
  await registry.metrics();
  t.equal(reads, 2, 'a later scrape reads again');
  m.unregister();
  t.equal(await registry.metrics(), '\n', 'nothing left after unregister');
});

t.test('a failed read serves the last good values, and says so: counted by step, logged (rate-limited), aged; a later good read clears it', async (t) => {
  const registry = new Registry();
  let fail: Error | undefined;
  let conns = 3;
  let now = 0;
  const logged: Record<string, unknown>[] = [];
  const log = createLogger('info', { write: (line: string) => { logged.push(JSON.parse(line) as Record<string, unknown>); } });
  const m = new ForwardMetrics({ registry, kind: 'kernel', reason: 'x', log, logEveryMs: 60_000, now: () => now, stats: async () => { if (fail) throw fail; return stats(conns); } });
  const value = (text: string, re: RegExp): number | undefined => { const x = re.exec(text); return x ? Number(x[1]) : undefined; };
  const conn = /lbagent_forward_connections_total\{[^}]*\} (\d+)/;
  const age = /^lbagent_forward_stats_age_seconds (\S+)$/m;
  const failures = (step: string): RegExp => new RegExp(`lbagent_forward_stats_read_failures_total\\{step="${step}"\\} (\\d+)`);

  let text = await registry.metrics();
  t.equal(value(text, age), 0, 'a fresh read: 0 s old');
  t.notMatch(text, /lbagent_forward_stats_read_failures_total\{/, 'no failure yet');
  t.equal(m.readProblem(), undefined);

  fail = new StatsReadFailure('derive', new Error('nft gone'));
  conns = 9;
  now += 1000;
  text = await registry.metrics();
  t.equal(value(text, conn), 3, 'the last good values');
  t.equal(value(text, failures('derive')), 1, 'counted under the step that failed');
  t.equal(value(text, age), 1, 'and 1 s old');
  t.equal(logged.length, 1, 'logged at once');
  t.match(logged[0], { level: 'warn', op: 'stats', step: 'derive', err: 'nft gone', inARow: 1, ageSeconds: 1 });
  t.match(m.readProblem(), /could not be read 1 time\(s\) in a row over 0\.0 s \(derive: nft gone\); \/metrics shows values from 1\.0 s ago/);

  fail = new Error('socket closed');
  for (let i = 0; i < 3; i++) { now += 1000; text = await registry.metrics(); }
  t.equal(value(text, failures('read')), 3, 'an error without a step: step "read"');
  t.equal(value(text, failures('derive')), 1);
  t.equal(value(text, age), 4, 'the values age');
  t.equal(logged.length, 1, 'no line more within the minute');
  now += 60_000;
  await registry.metrics();
  t.equal(logged.length, 2, 'a minute later, one line');
  t.match(logged[1], { step: 'read', err: 'socket closed', inARow: 5, notLogged: 3 });
  t.match(m.readProblem(), /5 time\(s\) in a row over 63\.0 s \(read: socket closed\)/);

  fail = undefined;
  now += 1000;
  text = await registry.metrics();
  t.equal(value(text, conn), 9, 'a good read: fresh values');
  t.equal(value(text, age), 0, 'read just now');
  t.equal(value(text, failures('read')), 4, 'the failures stay counted');
  t.equal(m.readProblem(), undefined, 'no problem once a read works');
  t.match(logged[2], { level: 'info', failures: 5 }, 'the recovery is logged');
  fail = new Error('again');
  now += 1000;
  await registry.metrics();
  t.equal(logged.length, 4, 'a new run of failures is logged at once');
});

t.test('a read whose counters failed: the rest is fresh, the failure counted under "counters", the age is the counters\' own', async (t) => {
  const registry = new Registry();
  let now = 10_000;
  let st: ForwardStats = { ...stats(5), readAt: 9_000 };
  const m = new ForwardMetrics({ registry, kind: 'kernel', reason: 'x', now: () => now, stats: async () => st });
  let text = await registry.metrics();
  t.match(text, /lbagent_forward_stats_age_seconds 1\n/, 'the values were read 1 s before the scrape');
  st = { ...stats(5), readAt: 9_000, services: [{ key: 'shop/web', vip: '10.0.0.1', healthy: 1, backends: 1, noHealthyBackend: false }], countersFailure: { step: 'counters', error: 'nft: No such file or directory' } };
  now += 2000;
  text = await registry.metrics();
  t.match(text, /lbagent_forward_no_healthy_backend\{service="web",namespace="shop"\} 0/, 'the service\'s health as it is now');
  t.match(text, /lbagent_forward_stats_read_failures_total\{step="counters"\} 1/);
  t.match(text, /lbagent_forward_stats_age_seconds 3\n/, 'the counters are 3 s old');
  t.match(m.readProblem(), /\(counters: nft: No such file or directory\)/);
  now += 1000;
  text = await registry.metrics();
  t.match(text, /lbagent_forward_stats_read_failures_total\{step="counters"\} 1/, 'the same values served again are not a second failure');
});

t.test('the cache window is on the injected monotonic clock: a read per window, never an old one after it', async (t) => {
  const registry = new Registry();
  let reads = 0;
  let now = 0;
  new ForwardMetrics({ registry, kind: 'kernel', reason: 'x', cacheMs: 250, now: () => now, stats: async () => { reads++; return stats(reads); } });
  await Promise.all([registry.metrics(), registry.metrics()]);
  t.equal(reads, 1, 'two scrapes at once share one read');
  now += 249;
  await registry.metrics();
  t.equal(reads, 1, 'within the window');
  now += 1;
  t.match(await registry.metrics(), /lbagent_forward_connections_total\{[^}]*\} 2/, 'past it: a new read, its values');
});

t.test('a backend that has carried nothing has no traffic series; one that failed no connect, no failure series', async (t) => {
  const registry = new Registry();
  const idle: ForwardStats = {
    ...stats(0),
    flows: [
      { service: 'shop/web', port: 'http', protocol: 'TCP', backend: '10.0.0.11', connections: 0, active: 0, bytesToBackend: 0, bytesToClient: 0, connectFailures: 0 },
      { service: 'shop/web', port: 'http', protocol: 'TCP', backend: '10.0.0.12', connections: 2, active: 1, bytesToBackend: 10, bytesToClient: 20, connectFailures: 1 },
    ],
  };
  new ForwardMetrics({ registry, kind: 'proxy', reason: 'x', stats: async () => idle });
  const text = await registry.metrics();
  t.notMatch(text, /backend="10\.0\.0\.11"/, 'the idle backend: no series at all');
  t.match(text, /lbagent_forward_connections_total\{service="web",namespace="shop",backend="10\.0\.0\.12",port="http"\} 2/);
  t.match(text, /lbagent_forward_active_connections\{service="web",namespace="shop",backend="10\.0\.0\.12",port="http"\} 1/);
  t.match(text, /lbagent_forward_bytes_total\{service="web",namespace="shop",backend="10\.0\.0\.12",direction="to_client"\} 20/);
  t.match(text, /lbagent_forward_connect_failures_total\{service="web",namespace="shop",backend="10\.0\.0\.12"\} 1/);
  t.match(text, /lbagent_forward_no_healthy_backend\{service="web",namespace="shop"\} 1/, 'the service gauge stays');
});

// The families per service and per backend were prom-client Counters and
// Gauges, reset and filled again by every scrape; they are kept texts
// (metrics/series.ts). The page for one state is the same text either way:
// the dashboards and docs/operations.md read these names and labels.
const PER_BACKEND = [
  'lbagent_forward_connections_total',
  'lbagent_forward_active_connections',
  'lbagent_forward_bytes_total',
  'lbagent_forward_connect_failures_total',
  'lbagent_forward_udp_flows_ended_total',
  'lbagent_forward_handed_back_packets_total',
  'lbagent_forward_no_healthy_backend',
];

/** The page as prom-client renders those families from these stats (each family's collect as a reset and a refill). */
async function promClientText(st: ForwardStats): Promise<Map<string, string>> {
  const registry = new Registry();
  const registers = [registry];
  const sl = (key: string): { service: string; namespace: string } => {
    const i = key.indexOf('/');
    return i < 0 ? { service: key, namespace: 'default' } : { service: key.slice(i + 1), namespace: key.slice(0, i) };
  };
  const carried = (f: ForwardStats['flows'][number]): boolean => f.connections > 0 || f.bytesToBackend > 0 || f.bytesToClient > 0;
  const help = new Map<string, string>();
  // HELP texts are the agent's own, taken from its page: this reference checks the series, not the wording.
  const agent = new Registry();
  new ForwardMetrics({ registry: agent, kind: st.kind, reason: 'x', stats: async () => st });
  for (const m of await agent.getMetricsAsJSON()) help.set(m.name, m.help);
  const h = (name: string): string => help.get(name)!;
  const c1 = new Counter({ name: 'lbagent_forward_connections_total', help: h('lbagent_forward_connections_total'), labelNames: ['service', 'namespace', 'backend', 'port'], registers });
  const c2 = new Counter({ name: 'lbagent_forward_udp_flows_ended_total', help: h('lbagent_forward_udp_flows_ended_total'), labelNames: ['service', 'namespace', 'port'], registers });
  const c3 = new Counter({ name: 'lbagent_forward_handed_back_packets_total', help: h('lbagent_forward_handed_back_packets_total'), labelNames: ['service', 'namespace'], registers });
  const g1 = new Gauge({ name: 'lbagent_forward_active_connections', help: h('lbagent_forward_active_connections'), labelNames: ['service', 'namespace', 'backend', 'port'], registers });
  const c4 = new Counter({ name: 'lbagent_forward_bytes_total', help: h('lbagent_forward_bytes_total'), labelNames: ['service', 'namespace', 'backend', 'direction'], registers });
  const c5 = new Counter({ name: 'lbagent_forward_connect_failures_total', help: h('lbagent_forward_connect_failures_total'), labelNames: ['service', 'namespace', 'backend'], registers });
  const g2 = new Gauge({ name: 'lbagent_forward_no_healthy_backend', help: h('lbagent_forward_no_healthy_backend'), labelNames: ['service', 'namespace'], registers });
  for (const f of st.flows) if (carried(f)) c1.inc({ ...sl(f.service), backend: f.backend, port: f.port }, f.connections);
  for (const u of st.udpFlowsEnded ?? []) c2.inc({ ...sl(u.service), port: u.port }, u.ended);
  for (const x of st.handedBack ?? []) c3.inc(sl(x.service), x.packets);
  for (const f of st.flows) if (f.active !== undefined && carried(f)) g1.set({ ...sl(f.service), backend: f.backend, port: f.port }, f.active);
  for (const f of st.flows) {
    if (!carried(f)) continue;
    c4.inc({ ...sl(f.service), backend: f.backend, direction: 'to_backend' }, f.bytesToBackend);
    c4.inc({ ...sl(f.service), backend: f.backend, direction: 'to_client' }, f.bytesToClient);
  }
  for (const f of st.flows) if (f.connectFailures) c5.inc({ ...sl(f.service), backend: f.backend }, f.connectFailures);
  for (const s of st.services) g2.set(sl(s.key), s.noHealthyBackend ? 1 : 0);
  return families(await registry.metrics());
}

/** A page's text by family name (HELP, TYPE and the family's lines). */
function families(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const block of text.trim().split('\n\n')) {
    const name = /^# HELP (\S+)/.exec(block)?.[1];
    if (name !== undefined) out.set(name, block);
  }
  return out;
}

const manyStats = (n: number, traffic: (i: number) => number): ForwardStats => {
  const services: ForwardStats['services'][number][] = [];
  const flows: ForwardStats['flows'][number][] = [];
  for (let i = 0; i < n; i++) {
    const key = i % 3 === 0 ? `svc-${i}` : `ns-${i % 7}/svc-${i}`;
    services.push({ key, vip: `10.1.${i >> 8}.${i & 255}`, healthy: 2, backends: 3, noHealthyBackend: i % 5 === 0 });
    for (let b = 0; b < 3; b++) {
      for (const port of ['http', '8443']) {
        const k = traffic(i) * (b + 1);
        flows.push({ service: key, port, protocol: 'TCP', backend: `10.2.${i & 255}.${b}`, connections: k, active: b === 2 ? undefined : k % 4, bytesToBackend: k * 100, bytesToClient: k * 1.5e9, connectFailures: b === 1 ? k % 3 : undefined });
      }
    }
  }
  return { kind: 'proxy', services, flows, problems: [], udpFlowsEnded: [{ service: 'ns-1/svc-1', port: 'dns', ended: 3 }, { service: 'ns-1/svc-1', port: 'dns', ended: 4 }], handedBack: [{ service: 'svc-0', packets: 9 }, { service: 'ns-2/svc-2', packets: 0 }], details: {} };
};

t.test('the per-service and per-backend families: the same text as prom-client renders for the same state, before and after the numbers change; an unchanged line is not rendered again', async (t) => {
  const registry = new Registry();
  let st = manyStats(40, (i) => (i % 4 === 0 ? 0 : i));
  let now = 0;
  new ForwardMetrics({ registry, kind: 'proxy', reason: 'x', now: () => now, cacheMs: 0, stats: async () => st });
  const ours = families(await registry.metrics());
  const ref = await promClientText(st);
  for (const name of PER_BACKEND) {
    t.ok((ref.get(name) ?? '').split('\n').length > 2 || name === 'lbagent_forward_handed_back_packets_total', `${name}: the state has series`);
    t.equal(ours.get(name), ref.get(name), `${name}: the same text`);
  }
  t.match(ours.get('lbagent_forward_bytes_total'), /backend="10\.2\.1\.0",direction="to_client"\} 3000000000\n/, 'two ports of one backend sum, as prom-client\'s inc()');
  t.match(ours.get('lbagent_forward_udp_flows_ended_total'), /port="dns"\} 7$/, 'two entries of one series sum');

  const fams = (registry.getMetricsAsArray() as unknown as { name: string; rendered?: number }[]).filter((m) => m.rendered !== undefined);
  const rendered = (): number => fams.reduce((a, m) => a + m.rendered!, 0);
  const before = rendered();
  now += 10;
  await registry.metrics();
  t.equal(rendered(), before, 'the same numbers again: no line rendered');

  // Service 5's numbers change, service 8 goes idle (its series go), service 4 carries its first traffic (its series come).
  st = manyStats(40, (i) => (i === 5 ? 50 : i === 8 ? 0 : i === 4 ? 3 : i % 4 === 0 ? 0 : i));
  now += 10;
  const after = families(await registry.metrics());
  const ref2 = await promClientText(st);
  const sorted = (s: string | undefined): string[] => (s ?? '').split('\n').sort();
  for (const name of PER_BACKEND) t.same(sorted(after.get(name)), sorted(ref2.get(name)), `${name}: after a change, the same lines`);
  const changed = rendered() - before;
  t.ok(changed > 0 && changed <= 2 * 6 * 4, `only service 4's and 5's lines rendered again (${changed})`);
});
