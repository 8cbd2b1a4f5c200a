// The daemon's own series (agent/daemon/metrics.ts): gauges read from the
// view at scrape time, interruptions counted agent-wide by cause and listed
// at 0 from the start.
import t from 'tap';
import { Registry } from '../../agent/metrics/prom';
import { DaemonMetrics } from '../../agent/daemon/metrics';

t.test('scrape-time gauges and interruption counters', async (t) => {
  const registry = new Registry();
  let ready = true;
  const m = new DaemonMetrics(registry, {
    serviceCount: () => 1,
    eachReady: (visit) => visit('web', 'default', ready),
    eachVip: (visit) => { visit('web', 'default', '10.99.0.200', 'pool', undefined); visit('app', 'default', '10.98.0.200', 'pool', 'vmnet'); },
    topology: () => [{ name: 'web', namespace: 'default', policy: 'any', set: 'all', reason: 'any' }],
  });
  let text = await registry.metrics();
  t.match(text, /lbagent_services 1/);
  t.match(text, /lbagent_service_ready\{service="web",namespace="default"\} 1/);
  t.match(text, /lbagent_service_vip_info\{service="web",namespace="default",vip="10.99.0.200",ipam="pool"\} 1/, 'no network label on the default network');
  t.match(text, /lbagent_service_vip_info\{service="app",namespace="default",vip="10.98.0.200",ipam="pool",network="vmnet"\} 1/, 'a VIP on a named network says which');
  t.match(text, /lbagent_service_vip_interruptions_total\{reason="nak"\} 0/, 'every reason at 0 from the start, agent-wide');
  t.notMatch(text, /lbagent_service_topology_info\{/, 'a service of policy any has no topology series');
  ready = false;
  m.interrupted('web', 'default', 'lease-expired');
  m.interrupted('web', 'default', 'stopped');
  m.reload('applied');
  text = await registry.metrics();
  t.match(text, /lbagent_service_ready\{service="web",namespace="default"\} 0/, 'read at the scrape');
  t.match(text, /reason="lease-expired"\} 1/);
  t.match(text, /reason="other"\} 1/, 'a cause without a label of its own counts as other');
  t.match(text, /lbagent_config_reloads_total\{result="applied"\} 1/);
  t.match(await registry.metrics(), /lbagent_service_vip_interruptions_total\{reason="lease-expired"\} 1/, 'agent-wide: the count outlives the service');
});
