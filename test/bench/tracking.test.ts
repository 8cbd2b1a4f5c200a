// bench/tracking.ts (pure parts) and its lines in bench/lib/report.ts: both
// sides get the same hysteresis (keepalived's script settings are the
// agent's health check and track), the cut's phase is spread over one probe
// interval and placed in each side's own probe cycle, the old Master's
// resignation is read from its logs, the spread of the runs, and the
// "no slower" targets per event (shown, never asserted).
import t from 'tap';
import {
  agentTracking, keepalivedTracking, probePhaseMs, placeCut, cycleOffset, gridPoint, resignMs, summariseTracking, trackingTable, parseGarp, firstLoggedAfter, LIKE_FOR_LIKE,
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
  t.notMatch(k.script, 'date', 'no log of its failures unless asked for');
  const logged = keepalivedTracking(['10.98.0.11'], '/lab/reach.sh', LIKE_FOR_LIKE, '/lab/reach.failed').script;
  t.match(logged, /&& exit 0\ndate \+%s%3N >> \/lab\/reach\.failed\nexit 1\n$/, 'a failing run logs its end, then fails');
});

t.test('detection: keepalived\'s script\'s first logged failure after the event; the new Master\'s gratuitous ARP from tcpdump', async (t) => {
  t.equal(firstLoggedAfter('1000\n1950\n2250\n3250\n', 2000), 250, 'the first failure at or after the event');
  t.ok(Number.isNaN(firstLoggedAfter('1000\n', 2000)), 'none after it');
  t.ok(Number.isNaN(firstLoggedAfter('', 2000)));
  t.same(parseGarp('1765100000.123456 ARP, Request who-has 10.98.0.201 tell 10.98.0.201, length 28'), { t: 1765100000123.456, ip: '10.98.0.201' });
  t.same(parseGarp('1765100000.5 ARP, Request who-has 10.98.0.200 (ff:ff:ff:ff:ff:ff) tell 10.98.0.200, length 28'), { t: 1765100000500, ip: '10.98.0.200' });
  t.same(parseGarp('1765100000.5 ARP, Reply 10.98.0.200 is-at 02:00:00:00:00:01, length 28'), { t: 1765100000500, ip: '10.98.0.200' });
  t.equal(parseGarp('tcpdump: listening on wn2, link-type EN10MB'), undefined);
  t.equal(parseGarp('1765100000.5 IP 10.98.0.4.41234 > 10.98.0.11.8080: Flags [S]'), undefined);
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
  servedMs, failed: 5, ...(resign === undefined ? {} : { timeline: { resignMs: resign, masterMs: resign + 80, takingMs: resign + 81, boundMs: resign + 100 }, detectedMs: resign, garpMs: resign + 98 }),
});
const ka = (servedMs: number, detectedMs: number): TrackingRun => ({ servedMs, failed: 1, detectedMs, garpMs: servedMs - 10 });

t.test('medians, ratios, the table and the targets per event', async (t) => {
  const summary = summariseTracking({
    carrier: { agent: [run(150, 10), run(130, 20), run(NaN)], keepalived: [run(100), run(120), run(110)] },
    service: { agent: [run(800, 500), run(900, 600), run(700, 400)], keepalived: [run(900), run(1000), run(950)] },
  });
  t.same(summary.map((s) => [s.event, s.agent.medianServedMs, s.keepalived.medianServedMs, s.ratioServed]), [['carrier', 140, 110, 1.27], ['service', 800, 950, 0.84]]);
  t.same(summary[0]!.agent.medianTimeline, { resignMs: 15, masterMs: 95, takingMs: 96, boundMs: 115 });
  const r: TrackingResult = { config: { runs: 3, likeForLike: LIKE_FOR_LIKE, command: 'node dist/bench/tracking.js --runs 3' }, summary, load: { before: [1], after: [1] }, errors: [] };
  const lines = trackingTable(r).split('\n');
  t.equal(lines.length, 9, 'two tables');
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

t.test('from detection on: each run\'s time after its own detection, medians, the ratio, and the second table', async (t) => {
  const summary = summariseTracking({
    carrier: { agent: [run(60, 3), run(70, 5)], keepalived: [run(80), run(90)] },
    service: { agent: [run(900, 650), run(500, 250), run(760, 500)], keepalived: [ka(1100, 760), ka(600, 250), ka(900, 560)] },
  });
  const s = summary[1]!;
  t.equal(s.agent.medianDetectedMs, 500);
  t.equal(s.keepalived.medianDetectedMs, 560);
  t.equal(s.agent.medianAfterDetectMs, 250, 'each run less its own detection: 250, 250, 260');
  t.same(s.agent.afterDetectSpreadMs, [250, 260]);
  t.equal(s.keepalived.medianAfterDetectMs, 340, '340, 350, 340');
  t.equal(s.ratioAfterDetect, 0.74);
  t.equal(s.agent.medianDetectToGarpMs, 98);
  t.equal(s.keepalived.medianDetectToGarpMs, 330);
  t.ok(Number.isNaN(summary[0]!.keepalived.medianAfterDetectMs), 'keepalived\'s carrier detection is not read');
  t.ok(Number.isNaN(summary[0]!.ratioAfterDetect));
  const r: TrackingResult = { config: { runs: 3, likeForLike: LIKE_FOR_LIKE, command: 'node dist/bench/tracking.js --runs 3' }, summary, load: { before: [1], after: [1] }, errors: [] };
  const lines = trackingTable(r).split('\n');
  t.equal(lines[4], '');
  t.match(lines[5], /^\| event \| agent: detected ms \| keepalived: detected ms \| agent: detection to first answer ms/);
  t.equal(lines[7], '| carrier lost on the VM-network NIC (track_interface) | 4 | n/a | 61 (57-65) | n/a (n/a-n/a) | n/a | 98 | n/a | 57, 65; n/a, n/a |');
  t.equal(lines[8], '| reach lost to every backend (tracked service / track_script) | 500 | 560 | 250 (250-260) | 340 (340-350) | 0.74x | 98 | 330 | 250, 250, 260; 340, 350, 340 |');
  const rows = evaluateTargets({ tracking: r } as unknown as BenchResults).filter((x) => x.area === 'tracking');
  t.same(rows.map((x) => [x.target, x.met]), [
    ['failover on carrier loss no slower than keepalived (track_interface)', true],
    ['failover on tracked-service loss no slower than keepalived (track_script)', true],
    ['failover on tracked-service loss, from detection to first answer, no slower than keepalived (track_script)', true],
  ]);
});
