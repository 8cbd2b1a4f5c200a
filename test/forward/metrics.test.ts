// Unit tests of the forward metrics: values come from the stats source at
// scrape time, one read per scrape, last good values on a failed read (with
// the failure counted, logged and aged), and nothing left on the registry
// after unregister().
import t from 'tap';
import { Registry } from 'prom-client';
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
