// bench/failover6.ts (pure parts) and its lines in bench/lib/report.ts: the
// new Master's steps read from its log lines on the death's clock, medians
// and the agent / keepalived ratio per advert interval, the death's time
// read from the shell's output, and the "no slower" target (shown, never
// asserted).
import t from 'tap';
import { failover6Table, lastNumber, summariseFailover6, takeoverTimeline, type Failover6Result, type Failover6Run } from '../../bench/failover6';
import { evaluateTargets, renderResults, type BenchResults } from '../../bench/lib/report';

const at = Date.parse('2026-12-07T06:00:00.000Z');
const iso = (ms: number): string => new Date(at + ms).toISOString();

t.test('the takeover timeline: the first line of each step at or after the death', async (t) => {
  const logs = [
    { time: iso(-500), op: 'transition', to: 'master' }, // an earlier election: before the death
    { time: iso(-10), op: 'bound', msg: 'holds fd00:99::200/128' },
    { time: iso(316), op: 'transition', to: 'master', msg: 'VRRP state master' },
    { time: iso(317), op: 'failover', msg: 'this node is Master: taking the VIP' },
    { time: iso(330), op: 'bound', msg: 'holds fd00:99::200/128' },
    { time: iso(900), op: 'bound', msg: 'holds fd00:99::200/128' },
    { op: 'bound' }, // no time: ignored
  ];
  t.same(takeoverTimeline(logs, at), { masterMs: 316, takingMs: 317, boundMs: 330 });
  const none = takeoverTimeline([{ time: iso(5), op: 'transition', to: 'backup' }], at);
  t.ok(Number.isNaN(none.masterMs) && Number.isNaN(none.takingMs) && Number.isNaN(none.boundMs), 'a step never logged is missing, not 0');
});

t.test('the death time: the last number the shell printed', async (t) => {
  t.equal(lastNumber('1796623200123\n'), 1796623200123);
  t.equal(lastNumber('noise\n1796623200123\nmore noise\n'), 1796623200123);
  t.ok(Number.isNaN(lastNumber('tcpdump: listening\n')));
});

const run = (servedMs: number, masterMs?: number): Failover6Run => ({
  servedMs, neighbourMs: servedMs + 10, failedRequests: 3,
  ...(masterMs === undefined ? {} : { timeline: { masterMs, takingMs: masterMs + 1, boundMs: masterMs + 20 } }),
});

function result(): Failover6Result {
  const runs = new Map<string, Failover6Run[]>([
    ['agent 1', [run(3400, 3380), run(3500, 3390), run(NaN)]],
    ['keepalived 1', [run(3450), run(3460), run(3470)]],
    ['agent 0.1', [run(400, 320), run(380, 310), run(390, 330)]],
    ['keepalived 0.1', [run(330), run(340), run(350)]],
  ]);
  return { config: { intervals: [1, 0.1], runs: 3, backupPriority: 150, command: 'node dist/bench/failover6.js --intervals 1,0.1 --runs 3' }, points: summariseFailover6([1, 0.1], runs), load: { before: [1, 1, 1], after: [2, 2, 2] }, errors: [] };
}

t.test('medians, the failed run left out, and the ratio per interval', async (t) => {
  const [one, tenth] = result().points;
  t.equal(one!.advertInterval, 1);
  t.equal(one!.masterDownIntervalMs, 3414.1, 'RFC 5798 §6.1 for priority 150 at 1 s');
  t.equal(one!.agent.medianServedMs, 3450, 'median of the two measured runs');
  t.equal(one!.keepalived.medianServedMs, 3460);
  t.equal(one!.ratioServed, 1);
  t.same(one!.agent.medianTimeline, { masterMs: 3385, takingMs: 3386, boundMs: 3405 });
  t.equal(tenth!.masterDownIntervalMs, 341.4);
  t.equal(tenth!.ratioServed, 1.15);
});

t.test('the table and the targets: no slower than keepalived at each interval', async (t) => {
  const r = result();
  const lines = failover6Table(r).split('\n');
  t.equal(lines.length, 4);
  t.equal(lines[2], '| 1 s | 3,414.1 | 3,450 | 3,460 | 1.00x | 3,460 | 3,470 | 3,385 | 3,405 | 3 + 3 |');
  t.match(lines[3]!, /^\| 0\.1 s \| 341\.4 \| 390 \| 340 \| 1\.15x \|/);
  const rows = evaluateTargets({ failover6: r } as unknown as BenchResults).filter((x) => x.area === 'failover6');
  t.same(rows.map((x) => [x.target, x.met]), [
    ['IPv6 VIP failover at 1 s adverts no slower than keepalived', true],
    ['IPv6 VIP failover at 0.1 s adverts no slower than keepalived', false],
  ]);
  t.match(rows[1]!.measured, '1.15x (390 vs 340 ms)');
  const none = summariseFailover6([1], new Map());
  t.equal(evaluateTargets({ failover6: { ...r, points: none } } as unknown as BenchResults).find((x) => x.area === 'failover6')?.met, undefined, 'nothing measured: neither met nor missed');
});

t.test('the report has the section, its table and every run', async (t) => {
  const md = renderResults({
    bench: 'lb-agent', version: '0', date: '2026-12-07', startedAt: '', finishedAt: '', options: { rounds: 3, quick: false, only: ['failover6'] },
    machine: { cpus: 2, tools: {} }, load: { before: [1], after: [1], samples: [1], mean1m: 1, max1m: 1, otherCpuCores: 0 },
    areas: {}, targets: [], failover6: result(),
  } as unknown as BenchResults);
  t.match(md, '## Failover of an IPv6 VIP against keepalived');
  t.match(md, '| 0.1 s | 341.4 | 390 | 340 | 1.15x |');
  t.match(md, 'Runs (first answer ms): 1 s: agent 3,400, 3,500, n/a; keepalived 3,450, 3,460, 3,470');
});
