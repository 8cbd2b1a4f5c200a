// Unit tests of the forward metrics: values come from the stats source at
// scrape time, one read per scrape, last good values on a failed read, and
// nothing left on the registry after unregister().
import t from 'tap';
import { Registry } from 'prom-client';
import { ForwardMetrics } from '../../agent/forward/metrics';
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

t.test('a failed read serves the last good values', async (t) => {
  const registry = new Registry();
  let fail = false;
  let now = 0;
  new ForwardMetrics({ registry, kind: 'kernel', reason: 'x', stats: async () => { if (fail) throw new Error('nft gone'); return stats(3); }, now: () => now });
  await registry.metrics();
  fail = true;
  now += 1000;
  t.match(await registry.metrics(), /lbagent_forward_connections_total\{[^}]*\} 3/);
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
