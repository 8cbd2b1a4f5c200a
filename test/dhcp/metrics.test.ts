// Unit tests of the DHCP metrics: created once per registry (several services
// share one), one state at 1, per-service series removed with the service.
import t from 'tap';
import { Registry } from 'prom-client';
import { dhcpMetrics, removeServiceSeries } from '../../agent/dhcp/metrics';

t.test('one set of series per registry, shared by services', async (t) => {
  const reg = new Registry();
  const a = dhcpMetrics(reg);
  const b = dhcpMetrics(reg);
  t.equal(a.state, b.state, 'the second call finds the first registration');
  t.equal(a.dropped, b.dropped);
  const other = dhcpMetrics(new Registry());
  t.not(other.state, a.state, 'another registry, other series');
  const names = (await reg.getMetricsAsJSON()).map((m) => m.name).sort();
  t.same(names, [
    'lbagent_dhcp_acquire_duration_seconds', 'lbagent_dhcp_declines_total', 'lbagent_dhcp_dropped_packets_total',
    'lbagent_dhcp_expiries_total', 'lbagent_dhcp_lease_expiry_timestamp_seconds', 'lbagent_dhcp_naks_total',
    'lbagent_dhcp_rebinds_total', 'lbagent_dhcp_renewals_total', 'lbagent_dhcp_state',
  ]);
});

t.test('state gauge and removal', async (t) => {
  const reg = new Registry();
  const m = dhcpMetrics(reg);
  const web = { service: 'web', namespace: 'default' };
  const db = { service: 'db', namespace: 'default' };
  m.states.show(web, 'SELECTING');
  m.states.show(web, 'BOUND');
  m.states.show(db, 'RENEWING');
  m.renewals.inc(web);
  m.dropped.inc({ reason: 'wrong-xid' });
  let text = await reg.metrics();
  t.match(text, /lbagent_dhcp_state\{service="web",namespace="default",state="BOUND"\} 1/);
  t.match(text, /lbagent_dhcp_state\{service="web",namespace="default",state="SELECTING"\} 0/);
  t.equal(text.split('\n').filter((l) => /^lbagent_dhcp_state\{service="web".*\} 1$/.test(l)).length, 1, 'exactly one state at 1');
  t.equal(text.split('\n').filter((l) => /^lbagent_dhcp_state\{service="web"/.test(l)).length, 8, 'every state of the client, 0 but one');
  t.match(text, /lbagent_dhcp_dropped_packets_total\{reason="wrong-xid"\} 1/);
  // A change after a scrape: the next scrape has it (only the two series that changed are set).
  m.states.show(web, 'RENEWING');
  text = await reg.metrics();
  t.match(text, /lbagent_dhcp_state\{service="web",namespace="default",state="RENEWING"\} 1/);
  t.match(text, /lbagent_dhcp_state\{service="web",namespace="default",state="BOUND"\} 0/);
  t.equal(text.split('\n').filter((l) => /^lbagent_dhcp_state\{service="web".*\} 1$/.test(l)).length, 1, 'still exactly one state at 1');
  removeServiceSeries(m, web);
  text = await reg.metrics();
  t.notMatch(text, /service="web"/, 'the removed service leaves no series, and the scrape does not bring them back');
  t.match(text, /lbagent_dhcp_state\{service="db",namespace="default",state="RENEWING"\} 1/, 'others untouched');
  // A service of that name added again starts afresh.
  m.states.show(web, 'SELECTING');
  text = await reg.metrics();
  t.equal(text.split('\n').filter((l) => /^lbagent_dhcp_state\{service="web"/.test(l)).length, 8);
  t.match(text, /lbagent_dhcp_state\{service="web",namespace="default",state="SELECTING"\} 1/);
});

t.test('a step records the state; the gauge is written when the registry is read (issue 18)', async (t) => {
  const reg = new Registry();
  const m = dhcpMetrics(reg);
  const web = { service: 'web', namespace: 'default' };
  let sets = 0;
  const set = m.state.set.bind(m.state);
  m.state.set = ((...a: Parameters<typeof set>) => { sets++; return set(...a); }) as typeof m.state.set;
  for (const s of ['STOPPED', 'SELECTING', 'REQUESTING', 'BOUND'] as const) m.states.show(web, s);
  t.equal(sets, 0, 'no labelled set while the client steps');
  await reg.metrics();
  t.equal(sets, 8, 'one scrape: its 8 series, once');
  await reg.metrics();
  t.equal(sets, 8, 'nothing changed, nothing set');
  t.equal(dhcpMetrics(reg).states, m.states, 'one record per registry, shared by its services');
});
