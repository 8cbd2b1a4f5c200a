// bench/tracking.ts (pure parts) and its lines in bench/lib/report.ts: both
// sides get the same hysteresis (keepalived's script settings are the
// agent's health check and track), the cut's phase is spread over one probe
// interval and placed in each side's own probe cycle, the old Master's
// resignation is read from its logs, the spread of the runs, and the
// "no slower" targets per event (shown, never asserted).
import t from 'tap';
import {
  agentTracking, keepalivedTracking, probePhaseMs, placeCut, cycleOffset, gridPoint, resignMs, summariseTracking, trackingTable, LIKE_FOR_LIKE,
  type TrackingResult, type TrackingRun,
} from '../../bench/tracking';
import { evaluateTargets, type BenchResults } from '../../bench/lib/report';

t.test('like for like: the agent checks and acts as keepalived\'s script does', async (t) => {
  const a = agentTracking();
  const hc = a.healthCheck as Record<string, number>;
  const svc = (a.track as { services: Record<string, unknown>[] }).services[0]!;
  const k = keepalivedTracking(['10.98.0.11', '10.98.0.12'], '/lab/reach.sh');
  const setting = (name: string): string | undefined => k.preamble.find((l) => l.trim().startsWith(`${name} `))?.trim().split(/\s+/)[1];
  t.equal(Number(setting('interval')), hc.periodSeconds, 'the same probe interval');
  t.equal(Number(setting('fall')), hc.failureThreshold, 'down after as many failures');
  t.equal(Number(setting('rise')), hc.successThreshold, 'up after as many successes');
  t.equal(Number(setting('weight')), -Number(svc.weight), 'the same weight');
  t.equal(svc.failAfter, 0, 'no hold of the agent\'s own beyond the thresholds (the script has none)');
  t.equal(svc.recoverAfter, 0);
  t.equal(svc.minHealthy, 1, 'the script succeeds while any backend answers');
  t.equal(a.advertInterval, LIKE_FOR_LIKE.advertInterval);
  t.match(k.script, `timeout ${hc.timeoutSeconds} bash -c '</dev/tcp/10.98.0.11/8080'`, 'the same connect timeout');
  t.match(k.script, ' || ', 'any backend');
  t.same(k.instance, ['track_interface {', '  eth1', '}', 'track_script {', '  reach', '}']);
});

t.test('the cut\'s phase: evenly over one probe interval, inside it', async (t) => {
  t.same([0, 1, 2, 3, 4].map((i) => probePhaseMs(i, 5)), [100, 300, 500, 700, 900]);
  t.same([0].map((i) => probePhaseMs(i, 1)), [500]);
  t.equal(probePhaseMs(1, 2, 0.5), 375);
});

t.test('the cut placed in the side\'s probe cycle: phase ms after a check, the first such time after the lead', async (t) => {
  // Last check at 10,000; now 10,200; 300 ms lead: the first of 10,100 + k x 1,000 at or after 10,500.
  t.equal(placeCut(10_000, 100, 1000, 10_200, 300), 11_100);
  t.equal(placeCut(10_000, 900, 1000, 10_200, 300), 10_900, 'already far enough ahead');
  t.equal(placeCut(10_000, 500, 1000, 12_750, 300), 13_500, 'a check seen a while ago: whole cycles on');
  t.equal(cycleOffset(10_000, 11_100, 1000), 100);
  t.equal(cycleOffset(10_000, 13_499, 1000), 499);
  t.equal(cycleOffset(10_000, 9_900, 1000), 900, 'before the check: the previous cycle');
});

t.test('the grid a side checks on, from its last checks: jitter averaged out, across the wrap of the interval', async (t) => {
  const near = (a: number, b: number): boolean => Math.abs(a - b) < 0.5;
  t.ok(near(gridPoint([1_000, 2_000, 3_000], 1000), 3_000), 'no jitter: the last check');
  t.ok(near(gridPoint([1_230, 2_270, 3_250, 4_250], 1000), 4_250), 'jittered 230-270 around 250');
  t.ok(near(gridPoint([1_980, 3_020, 3_990, 5_010], 1000), 5_000), 'around the wrap: 980 and 20 average to 0, not 500');
  t.ok(near(gridPoint([1_020, 1_990], 1000), 2_005), 'the grid point nearest the last check');
});

t.test('the old Master resigned: fault or a lowered priority, after the event', async (t) => {
  const at = Date.parse('2026-12-07T06:00:00.000Z');
  const iso = (ms: number): string => new Date(at + ms).toISOString();
  t.equal(resignMs([{ time: iso(-5), op: 'priority' }, { time: iso(12), op: 'transition', to: 'backup' }, { time: iso(18), op: 'transition', to: 'fault' }], at), 18);
  t.equal(resignMs([{ time: iso(885), op: 'priority', msg: 'VRRP VRID 51 priority 200 -> 140' }], at), 885);
  t.ok(Number.isNaN(resignMs([], at)));
});

const run = (servedMs: number, resign?: number): TrackingRun => ({
  servedMs, failed: 5, ...(resign === undefined ? {} : { timeline: { resignMs: resign, masterMs: resign + 80, takingMs: resign + 81, boundMs: resign + 100 } }),
});

t.test('medians, ratios, the table and the targets per event', async (t) => {
  const summary = summariseTracking({
    carrier: { agent: [run(150, 10), run(130, 20), run(NaN)], keepalived: [run(100), run(120), run(110)] },
    service: { agent: [run(800, 500), run(900, 600), run(700, 400)], keepalived: [run(900), run(1000), run(950)] },
  });
  t.same(summary.map((s) => [s.event, s.agent.medianServedMs, s.keepalived.medianServedMs, s.ratioServed]), [['carrier', 140, 110, 1.27], ['service', 800, 950, 0.84]]);
  t.same(summary[0]!.agent.medianTimeline, { resignMs: 15, masterMs: 95, takingMs: 96, boundMs: 115 });
  const r: TrackingResult = { config: { runs: 3, likeForLike: LIKE_FOR_LIKE, command: 'node dist/bench/tracking.js --runs 3' }, summary, load: { before: [1], after: [1] }, errors: [] };
  const lines = trackingTable(r).split('\n');
  t.equal(lines.length, 4);
  t.equal(lines[2], '| carrier lost on the VM-network NIC (track_interface) | 140 (130-150) | 110 (100-120) | 1.27x | 15 | 95 | 115 | 150, 130, n/a; 100, 120, 110 |');
  t.same(summary[1]!.keepalived.spreadMs, [900, 1000]);
  const placed = summariseTracking({
    carrier: { agent: [run(100)], keepalived: [run(100)] },
    service: { agent: [{ ...run(700, 400), cycleMs: 250 }], keepalived: [{ ...run(900), cycleMs: 260 }] },
  });
  t.match(trackingTable({ ...r, summary: placed }).split('\n')[3], /\| 700 @250; 900 @260 \|$/, 'each run with where its cut fell in the side\'s probe cycle');
  const rows = evaluateTargets({ tracking: r } as unknown as BenchResults).filter((x) => x.area === 'tracking');
  t.same(rows.map((x) => x.met), [false, true]);
  t.match(rows[0]!.target, 'carrier loss no slower than keepalived (track_interface)');
  t.match(rows[1]!.target, 'tracked-service loss no slower than keepalived (track_script)');
});
