// net/ metrics: names, labels, and one set per registry.
import t from 'tap';
import { Registry } from 'prom-client';
import { netMetrics, setLinksOwned } from '../../agent/net/metrics';

t.test('series names and idempotent registration', async (t) => {
  const registry = new Registry();
  const a = netMetrics(registry);
  const b = netMetrics(registry);
  t.equal(a.arpProbes, b.arpProbes, 'same objects from the same registry');
  a.arpProbes.inc();
  a.arpConflicts.inc({ phase: 'probe' });
  a.gratuitousArpsSent.inc(2);
  a.framesDropped.inc({ reason: 'short' });
  setLinksOwned(a, 3);
  setLinksOwned(undefined, 4);
  const text = await registry.metrics();
  for (const line of [
    'lbagent_net_arp_probes_total 1',
    'lbagent_net_arp_conflicts_total{phase="probe"} 1',
    'lbagent_net_gratuitous_arps_sent_total 2',
    'lbagent_net_frames_dropped_total{reason="short"} 1',
    'lbagent_net_links_owned 3',
  ]) t.ok(text.includes(line), line);
  const other = new Registry();
  netMetrics(other);
  t.notMatch(await other.metrics(), /lbagent_net_arp_probes_total 1/, 'registries are independent');
});
