// bench/lib/agent.ts, its pure half: histogram totals from Prometheus text
// and the wall-clock time of a pino log line.
import t from 'tap';
import { histogramTotals, logTime } from '../../../bench/lib/agent';

t.test('histogram sum and count over every label set', async (t) => {
  const text = [
    '# HELP lbagent_dhcp_acquire_duration_seconds Time from ...',
    '# TYPE lbagent_dhcp_acquire_duration_seconds histogram',
    'lbagent_dhcp_acquire_duration_seconds_bucket{le="0.1",service="a",namespace="default"} 1',
    'lbagent_dhcp_acquire_duration_seconds_sum{service="a",namespace="default"} 0.012',
    'lbagent_dhcp_acquire_duration_seconds_count{service="a",namespace="default"} 1',
    'lbagent_dhcp_acquire_duration_seconds_sum{service="b",namespace="default"} 0.5',
    'lbagent_dhcp_acquire_duration_seconds_count{service="b",namespace="default"} 2',
    'lbagent_dhcp_acquire_duration_seconds_sumx 99',
    'other_sum 7',
  ].join('\n');
  const h = histogramTotals(text, 'lbagent_dhcp_acquire_duration_seconds');
  t.equal(h.count, 3);
  t.ok(Math.abs(h.sum - 0.512) < 1e-9);
  t.same(histogramTotals('', 'x'), { sum: 0, count: 0 });
});

t.test('log time from pino ISO or epoch stamps', async (t) => {
  t.equal(logTime({ time: '2026-11-21T14:54:44.852Z' }), Date.parse('2026-11-21T14:54:44.852Z'));
  t.equal(logTime({ time: 1700000000123 }), 1700000000123);
  t.ok(Number.isNaN(logTime({})));
  t.ok(Number.isNaN(logTime(undefined)));
});
