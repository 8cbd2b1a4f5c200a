// bench/https.ts (pure part): medians per checker and mode, and lb-agent's
// CPU per check over HAProxy's only when both kept pace with the checks due.
import t from 'tap';
import { summariseHttps, KEPT_PACE, type HttpsLine } from '../../bench/https';

const line = (who: 'agent' | 'haproxy', verify: boolean, checksPerSecond: number, us: number | null): HttpsLine => ({
  who, verify, targets: 1000, checksPerSecond, expectedPerSecond: 200, resumedFraction: 1, cpu: { percentOfOneCore: 30 }, cpuMicrosPerCheck: us, rssMiB: 100,
});

t.test('both kept pace: medians and the ratio of CPU per check', async (t) => {
  const s = summariseHttps([
    line('agent', false, 201, 1600), line('agent', false, 199, 1700), line('agent', false, 200, 1650),
    line('haproxy', false, 173, 900), line('haproxy', false, 180, 800), line('haproxy', false, 175, 850),
  ], 1000, 5);
  t.equal(s.length, 2, 'no verify lines measured, none made up');
  const a = s.find((x) => x.who === 'agent')!;
  t.equal(a.cpuMicrosPerCheck, 1650);
  t.equal(a.checksPerSecond, 200);
  t.equal(a.expectedPerSecond, 200);
  t.equal(a.xHaproxy, 1.94);
  t.equal(s.find((x) => x.who === 'haproxy')!.xHaproxy, undefined, 'HAProxy is the base');
});

t.test('a checker under the pace: no ratio (it would compare timed-out handshakes)', async (t) => {
  t.equal(KEPT_PACE, 0.8);
  const s = summariseHttps([line('agent', true, 49, 2062), line('haproxy', true, 1, 24870)], 1000, 5);
  t.ok(Number.isNaN(s.find((x) => x.who === 'agent')!.xHaproxy!), 'HAProxy at 1 of 200 checks/s');
  const s2 = summariseHttps([line('agent', true, 150, 2062), line('haproxy', true, 190, 900)], 1000, 5);
  t.ok(Number.isNaN(s2[0]!.xHaproxy!), 'lb-agent at 150 of 200 (under 160)');
  const s3 = summariseHttps([line('agent', true, 160, 1800), line('haproxy', true, 160, 900)], 1000, 5);
  t.equal(s3[0]!.xHaproxy, 2, 'at the pace exactly: compared');
});
