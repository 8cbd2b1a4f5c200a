// Unit tests of the failover metrics: the series names the dashboards use,
// one set of collectors per registry, never the global registry.
import t from 'tap';
import { Registry, register as globalRegistry } from 'prom-client';
import { vrrpMetrics } from '../../agent/failover/metrics';

t.test('the lbagent_vrrp_* series, registered once per registry', async (t) => {
  const r = new Registry();
  const a = vrrpMetrics(r);
  const b = vrrpMetrics(r);
  t.equal(a.state, b.state, 'same collectors the second time');
  t.equal(a.dropped, b.dropped);
  a.state.set({ vrid: '51', family: 'IPv4', state: 'master' }, 1);
  a.state.set({ vrid: '51', family: 'IPv6', state: 'backup' }, 1);
  a.transitions.inc({ vrid: '51', family: 'IPv4', to: 'master' });
  a.advertsSent.inc({ vrid: '51', family: 'IPv4' });
  a.advertsReceived.inc({ vrid: '51', family: 'IPv6' });
  a.dropped.inc({ reason: 'bad-hop-limit', family: 'IPv6' });
  a.masterInfo.set({ vrid: '51', family: 'IPv6', master: 'fe80::2' }, 1);
  a.lastTransition.set({ vrid: '51', family: 'IPv4' }, 1_767_225_600);
  a.splitBrain.inc({ vrid: '51', family: 'IPv4' });
  const text = await r.metrics();
  // One instance per family (RFC 5798 §5.1): VRID 51 of each is its own series.
  for (const line of [
    'lbagent_vrrp_state{vrid="51",family="IPv4",state="master"} 1',
    'lbagent_vrrp_state{vrid="51",family="IPv6",state="backup"} 1',
    'lbagent_vrrp_transitions_total{vrid="51",family="IPv4",to="master"} 1',
    'lbagent_vrrp_adverts_sent_total{vrid="51",family="IPv4"} 1',
    'lbagent_vrrp_adverts_received_total{vrid="51",family="IPv6"} 1',
    'lbagent_vrrp_dropped_total{reason="bad-hop-limit",family="IPv6"} 1',
    'lbagent_vrrp_master_info{vrid="51",family="IPv6",master="fe80::2"} 1',
    'lbagent_vrrp_last_transition_timestamp_seconds{vrid="51",family="IPv4"} 1767225600',
    'lbagent_vrrp_split_brain_total{vrid="51",family="IPv4"} 1',
  ]) t.ok(text.includes(line), line);
  t.equal((await globalRegistry.metrics()).includes('lbagent_vrrp'), false, 'nothing on the global registry');
  const other = vrrpMetrics(new Registry());
  t.not(other.state, a.state, 'another registry, other collectors');
});
