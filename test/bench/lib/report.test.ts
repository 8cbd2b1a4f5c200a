// bench/lib/report.ts: targets are judged honestly (met, not met, or not
// measured), the Markdown shows every area that ran and never "undefined" or
// "NaN", and the generated block of docs/benchmarks.md is appended once and then replaced.
import t from 'tap';
import { dhcpPairRatios, evaluateTargets, probesTable, renderResults, renderBenchSummary, updateBenchPage, latestFullRun, BENCH_BEGIN, BENCH_END, type BenchResults } from '../../../bench/lib/report';
import type { ForwardTargetSummary } from '../../../bench/forwarding';
import type { DhcpRun } from '../../../bench/dhcp';
import type { ProbeRateResult, ProbeRateSummary } from '../../../bench/wrapped';
import type { RestartResult, RestartSummaryRow } from '../../../bench/restart';
import { DAMAGE_KINDS, type DriftResult, type DriftSummaryRow } from '../../../bench/drift';

function fwd(label: string, ka: number, nc: number, bulk: number): ForwardTargetSummary {
  return { label, keepalive: { requestsPerSec: ka, p50ms: 0.5, p99ms: 2 }, newConnections: { connectionsPerSec: nc, p50ms: 1, p99ms: 5 }, bulkGbps: bulk, rssMiB: 70, peakRssMiB: 72, errors: 0, samples: 3 };
}

/** A probe-rate row: by default the native prober at 10,000 targets, 42% of a core, 99.9% sustained. */
function probe(over: Partial<ProbeRateSummary>): ProbeRateSummary {
  return {
    backends: 10_000, path: 'native', periodSeconds: 1, probesPerSecond: 9990, expectedPerSecond: 10_000, sustainedFraction: 0.999,
    cpuPercentOfOneCore: 42, cpuMicrosPerProbe: 42, listenerCpuPercentOfOneCore: 10, startLagP99Ms: 5, eventLoopDelayP99Ms: 20, rssMiB: 100, skippedBusy: 0, runs: 3, ...over,
  };
}

function probes(summary: ProbeRateSummary[]): ProbeRateResult {
  return { config: { rounds: 3, runs: [{ backends: 10_000, paths: ['native', 'node', 'own', 'haproxy'] }], period: 1, duration: 5, warmup: 3, command: 'x' }, summary, raw: [], errors: [] };
}

function results(): BenchResults {
  return {
    bench: 'lb-agent', version: '0.1.0', date: '2026-11-21', startedAt: 'a', finishedAt: 'b',
    options: { rounds: 3, quick: false, only: [] },
    machine: { cpus: 2, cpuModel: 'AMD EPYC', memoryMiB: 24105, kernel: '6.1', os: 'Debian 12', node: 'v20', tools: { wrk: 'wrk 4.1' } },
    load: { before: [1, 1, 1], after: [2, 2, 2], samples: [1, 2], mean1m: 1.5, max1m: 2, otherCpuCores: 0.1 },
    areas: { forward: { seconds: 100, loadBefore: [1, 1, 1], loadAfter: [2, 2, 2], otherCpuCores: 0.05 } },
    forward: {
      config: { rounds: 3, seconds: 3, warmup: 1, connections: 50, threads: 1, targets: ['direct', 'kernel', 'proxy', 'proxy1', 'haproxy1', 'haproxy'], wrk: 'wrk', iperf3: 'iperf3', backends: 'nginx', threadsDefaultHaproxy: 'n', proxyWorkers: 2 },
      summary: {
        direct: fwd('direct', 40_000, 8000, 10),
        kernel: fwd('kernel', 30_000, 5000, 9),
        proxy: fwd('proxy', 19_000, 1000, 2),
        proxy1: fwd('proxy 1 worker', 19_000, 1000, 2),
        haproxy1: fwd('haproxy 1t', 20_000, 2000, 2.5),
        haproxy: fwd('haproxy', 18_000, 1200, 2.5),
      },
      raw: [],
      errors: [],
    },
    targets: [],
  };
}

t.test('forwarding targets: ratios to HAProxy 1 thread and to direct', async (t) => {
  const rows = evaluateTargets(results());
  const by = (s: string) => rows.find((r) => r.target.startsWith(s))!;
  t.equal(by('kernel path keep-alive').measured, '1.50x');
  t.equal(by('kernel path keep-alive').met, true);
  t.equal(by('kernel path new connections').met, true, '2.5x >= 1.2x');
  t.equal(by('kernel path bulk').met, true, '0.9x >= 0.85x');
  t.equal(by('proxy path, 1 worker: keep-alive').met, false, '0.95x < 1.0x');
  t.equal(by('proxy path, 1 worker: new connections').met, false, '0.5x < 0.8x');
  t.equal(by('proxy path, one worker per CPU: keep-alive').measured, '1.06x', 'against HAProxy with its default threads');
  t.equal(by('proxy path, one worker per CPU: keep-alive').met, true);
  t.equal(by('proxy path, one worker per CPU: new connections').met, true, '0.83x >= 0.8x');
  t.same(by('proxy path RSS'), { area: 'forward', target: 'proxy path RSS under load < 100 MiB with 2 workers (the target names two)', measured: '70 MiB', met: true });
  t.equal(by('proxy path with PROXY v2: keep-alive').met, undefined, 'no PROXY v2 run: not measured');
  t.notOk(rows.some((r) => r.area === 'dhcp'), 'no DHCP run, no DHCP target');
});

t.test('PROXY v2 cost: the pair inside the slot where there is one, two slots\' medians for older results', async (t) => {
  const r = results();
  r.forward!.summary.proxy = fwd('proxy', 30_000, 8_000, 2);
  // Measured minutes after the plain slot on a slower host: the slots' medians would say 0.80x.
  r.forward!.summary['proxy-pp2'] = { ...fwd('proxy pp2', 24_000, 6_400, 2), xWithoutHeader: { keepalive: 0.97, newConnections: 0.93 } };
  r.forward!.summary['haproxy-pp2'] = { ...fwd('haproxy pp2', 24_000, 6_400, 2), xWithoutHeader: { keepalive: 0.99, newConnections: 0.9 } };
  r.forward!.config.headerPairing = 'PROXY v2 x without: paired';
  const by = (prefix: string): { measured: string; met: boolean | undefined } => evaluateTargets(r).find((x) => x.target.startsWith(prefix))!;
  t.has(by('proxy path with PROXY v2: keep-alive'), { measured: '0.97x', met: true }, 'the paired ratio, not 24,000 / 30,000');
  t.has(by('proxy path with PROXY v2: new connections'), { measured: '0.93x', met: false });
  const md = renderResults(r);
  t.match(md, /PROXY v2 x without: paired\. proxy pp2: keep-alive 0\.97x, new connections 0\.93x; haproxy pp2: keep-alive 0\.99x, new connections 0\.90x\./, 'both balancers\' header cost, side by side');
  delete r.forward!.summary['proxy-pp2'].xWithoutHeader;
  t.has(by('proxy path with PROXY v2: keep-alive'), { measured: '0.80x', met: false }, 'older results: the two slots\' medians');
});

t.test('issue 18: the proxy lines take the ratio paired inside the slot where there is one, two slots\' medians for older results', async (t) => {
  const r = results();
  // Slots minutes apart: the medians say 0.95x and 0.50x; the pairs beside each slot say otherwise.
  r.forward!.summary.proxy1 = { ...fwd('proxy 1 worker', 19_000, 1000, 2), xPeer: { peer: 'haproxy1', keepalive: 1.02, newConnections: 0.85, rounds: { keepalive: [1.02, 0.98, 1.05], newConnections: [0.85, 0.82, 0.9] } } };
  r.forward!.summary.proxy = { ...fwd('proxy', 19_000, 1000, 2), xPeer: { peer: 'haproxy', keepalive: 0.97, newConnections: 0.79, rounds: { keepalive: [0.97], newConnections: [0.79] } } };
  r.forward!.config.peerPairing = 'proxy x HAProxy: paired';
  const by = (prefix: string): { measured: string; met: boolean | undefined } => evaluateTargets(r).find((x) => x.target.startsWith(prefix))!;
  t.same(by('proxy path, 1 worker: keep-alive'), { area: 'forward', target: 'proxy path, 1 worker: keep-alive req/s >= 1.0x HAProxy 1 thread', measured: '1.02x paired (rounds 1.02x / 0.98x / 1.05x; ratio of medians 0.95x)', met: true });
  t.has(by('proxy path, 1 worker: new connections'), { measured: '0.85x paired (rounds 0.85x / 0.82x / 0.90x; ratio of medians 0.50x)', met: true });
  t.has(by('proxy path, one worker per CPU: keep-alive'), { measured: '0.97x paired (rounds 0.97x; ratio of medians 1.06x)', met: false }, 'a pair below the line is not met, whatever the medians say');
  t.has(by('proxy path, one worker per CPU: new connections'), { met: false }, '0.79x < 0.8x');
  const md = renderResults(r);
  t.match(md, /Proxy x HAProxy: paired\. proxy x haproxy: keep-alive 0\.97x \(rounds 0\.97x\), new connections 0\.79x \(rounds 0\.79x\); proxy 1 worker x haproxy 1t: keep-alive 1\.02x/, 'the pairs and their rounds under the table');
  t.match(renderBenchSummary(r, 'bench/results/x.md'), /Proxy x HAProxy: paired\./, 'and in the docs block');
  // Chained pairs (three a slot over three rounds): the line says how many.
  r.forward!.config.peerPairs = 3;
  r.forward!.summary.proxy.xPeer = { peer: 'haproxy', keepalive: 1.01, newConnections: 0.9, rounds: { keepalive: [1.01, 0.99, 1.04, 1.0, 1.02, 0.98, 1.05, 1.01, 0.97], newConnections: [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9] } };
  t.has(by('proxy path, one worker per CPU: keep-alive'), { measured: '1.01x paired (9 pairs 1.01x / 0.99x / 1.04x / 1.00x / 1.02x / 0.98x / 1.05x / 1.01x / 0.97x; ratio of medians 1.06x)', met: true });
  t.match(renderResults(r), /proxy x haproxy: keep-alive 1\.01x \(9 pairs 1\.01x \/ 0\.99x/);
  // A pair against another peer than the line's is not the line's.
  r.forward!.summary.proxy1.xPeer!.peer = 'haproxy';
  t.has(by('proxy path, 1 worker: keep-alive'), { measured: '0.95x', met: false }, 'the slots\' medians');
  delete r.forward!.summary.proxy.xPeer;
  t.has(by('proxy path, one worker per CPU: keep-alive'), { measured: '1.06x', met: true }, 'older results: the two slots\' medians');
});

t.test('a missing peer leaves the target not measured, not met', async (t) => {
  const r = results();
  delete r.forward!.summary.haproxy1;
  const rows = evaluateTargets(r);
  const ka = rows.find((x) => x.target.startsWith('kernel path keep-alive'))!;
  t.equal(ka.met, undefined);
  t.equal(ka.measured, 'n/a');
});

t.test('DHCP, health and memory targets', async (t) => {
  const r = results();
  const row = (client: 'udhcpc' | 'dhclient' | 'lbagent' | 'lbagent-like', count: number, medianMs: number, allMs: number, wireMs: number) => ({ label: client, client, count, ping: false, medianMs, allMs, wireMs, runs: 3, failures: 0 });
  r.dhcp = {
    config: { rounds: 3, counts: [1, 50], clients: [], ping: [false], manyPingRounds: 0, dnsmasq: 'dnsmasq' },
    summary: [row('udhcpc', 1, 80, 80, 30), row('dhclient', 1, 30, 30, 2), row('lbagent-like', 1, 600, 600, 5), row('lbagent', 1, 7000, 7000, 10), row('lbagent-like', 50, 700, 900, 20), row('lbagent', 50, 20_000, 40_000, 20)],
    raw: [],
  };
  r.probes = probes([probe({}), probe({ path: 'haproxy', cpuMicrosPerProbe: 40 })]);
  r.control = {
    config: { rounds: 3, reloads: 20, services: 100 },
    summary: { firstVip: { pool: { servedMs: 5000, boundMs: 4900, socketMs: 240, startedMs: 400 }, dhcp: { servedMs: 6000, boundMs: 5900, socketMs: 260, startedMs: 400 } }, socketMs: 250, rssOneServiceMiB: 54.9, many: { services: 100, allReadyMs: 2000, rssMiB: 60, peakRssMiB: 90, rssAfterReloadsMiB: 63.5, reloadLogMs: 200, reloadStatusMs: 210, reloadsOk: 20, reloads: 20 } },
    raw: { firstVip: [], reloads: [] },
  };
  const rows = evaluateTargets(r);
  const find = (s: string) => rows.find((x) => x.target.includes(s))!;
  t.equal(find('on the wire').met, false, '5 ms vs dhclient 2 ms');
  t.match(find('on the wire').target, /dhclient/);
  t.equal(find('start to bound no slower than the fastest peer (dhclient), like').met, false);
  t.equal(find('within 1.5x of one, like').met, true, '900 / 600 <= 1.5');
  t.equal(find('within 1.5x of one, defaults').met, false, '40000 / 7000 > 1.5');
  t.equal(find('10,000 TCP targets').met, true);
  t.equal(find('control socket up under 250 ms').met, false, '250 ms is not under 250 ms');
  t.equal(find('RSS under 55 MiB with one service').met, true);
  t.equal(find('RSS under 64 MiB').met, true, 'the larger of after start and after reloads counts');
  t.equal(find('RSS flat').met, false, '63.5 / 60 is more than 5% of growth');
  t.match(find('RSS flat').measured, /1\.06x after 20 reloads/);
  r.control.summary.many.reloads = 5;
  t.equal(evaluateTargets(r).find((x) => x.target.includes('RSS flat'))!.met, undefined, 'fewer than 20 reloads judge nothing');
});

t.test('DHCP 50 within 1.5x of one: judged pair by pair, extra pairs included', async (t) => {
  const r = results();
  const row = (client: 'lbagent' | 'lbagent-like', count: number, medianMs: number, allMs: number) => ({ label: client, client, count, ping: false, medianMs, allMs, wireMs: 5, runs: 3, failures: 0 });
  const run = (round: number, client: 'lbagent' | 'lbagent-like', count: number, allMs: number, extra = false): DhcpRun =>
    ({ round, client, count, ping: false, boundMs: [allMs], allMs, bound: count, wireMs: [5], ...(extra ? { extra } : {}) });
  // The rounds' medians: 450 / 300 = 1.5x (met). The pairs: 1.7, 1.4, 1.6, 1.55, 1.45 -> median 1.55 (not met).
  const raw = [
    run(0, 'lbagent-like', 1, 250), run(0, 'lbagent-like', 50, 425),
    run(1, 'lbagent-like', 1, 300), run(1, 'lbagent-like', 50, 420),
    run(2, 'lbagent-like', 1, 350), run(2, 'lbagent-like', 50, 560),
    run(3, 'lbagent-like', 1, 200, true), run(3, 'lbagent-like', 50, 310, true),
    run(4, 'lbagent-like', 50, 435, true), run(4, 'lbagent-like', 1, 300, true),
    // A pair whose many-run did not bind everything, and a one-run without its many: no ratio.
    run(5, 'lbagent-like', 1, 300, true), { ...run(5, 'lbagent-like', 50, NaN, true), bound: 49 },
    run(6, 'lbagent-like', 1, 100, true),
  ];
  t.same(dhcpPairRatios(raw, 'lbagent-like', 50).map((x) => Math.round(x * 100) / 100), [1.7, 1.4, 1.6, 1.55, 1.45]);
  t.same(dhcpPairRatios(raw, 'lbagent', 50), [], 'another client\'s runs are not paired');
  r.dhcp = {
    config: { rounds: 3, likePairs: 7, counts: [1, 50], clients: [], ping: [false], manyPingRounds: 0, dnsmasq: 'dnsmasq' },
    summary: [row('lbagent-like', 1, 300, 300), row('lbagent-like', 50, 400, 450)],
    raw,
  };
  const like = evaluateTargets(r).find((x) => x.target.includes('within 1.5x of one, like'))!;
  t.equal(like.met, false, 'the median pair, 1.55x, not the ratio of medians, 1.5x');
  t.match(like.measured, /^1\.55x paired, 5 pairs \(1\.70x \/ 1\.40x \/ 1\.60x \/ 1\.55x \/ 1\.45x\); ratio of medians 1\.50x \(450 ms vs 300 ms\)$/);
  r.dhcp.raw = [];
  t.equal(evaluateTargets(r).find((x) => x.target.includes('within 1.5x of one, like'))!.met, true, 'no raw runs (older results): the ratio of medians');
});

t.test('health target: the native prober at 10,000, >= 99% of the rate and under half a core', async (t) => {
  const health = (rows: ProbeRateSummary[]) => { const r = results(); r.probes = probes(rows); return evaluateTargets(r).find((x) => x.area === 'health'); };
  t.equal(health([probe({ probesPerSecond: 3600, sustainedFraction: 0.36 })])!.met, false, 'the CPU alone is not enough');
  t.equal(health([probe({ probesPerSecond: 9850, sustainedFraction: 0.985 })])!.met, false, '98.5% is not 99%');
  t.equal(health([probe({ cpuPercentOfOneCore: 50.5 })])!.met, false, 'half a core is the ceiling');
  const met = health([probe({}), probe({ path: 'node', cpuPercentOfOneCore: 103 }), probe({ path: 'haproxy', cpuMicrosPerProbe: 40 })])!;
  t.equal(met.met, true);
  t.match(met.measured, /42(\.0)?% of a core, 9,990 of 10,000 probes\/s \(99\.9%\); 42(\.0)? us CPU per probe, HAProxy 40(\.0)? us per check/);
  t.equal(health([probe({ path: 'node' })]), undefined, 'only the native path is judged');
});

t.test('health table: one row per path, CPU per probe against HAProxy', async (t) => {
  const r = results();
  r.probes = probes([probe({}), probe({ path: 'node', cpuMicrosPerProbe: 160 }), probe({ path: 'own', cpuMicrosPerProbe: 8 }), probe({ path: 'haproxy', cpuMicrosPerProbe: 40, startLagP99Ms: NaN, eventLoopDelayP99Ms: NaN })]);
  const md = probesTable(r)!;
  t.match(md, /\| 10,000 \| 1 s \| lb-agent, native batch prober \(default: SYN, SYN-ACK, RST\) \| 9,990 \(10,000\) \| 100% \| 42(\.0)? \| 42(\.0)? \| 1\.05x \|/);
  t.match(md, /a Node socket per probe \(fallback\) .* \| 4\.00x \|/);
  t.match(md, /HAProxy, 1 thread .* \| - \|/);
  t.notMatch(md, /undefined|NaN/);
});

t.test('Markdown: tables for what ran, no undefined or NaN', async (t) => {
  const r = results();
  r.targets = evaluateTargets(r);
  const md = renderResults(r);
  t.match(md, /^# lb-agent benchmark, 2026-11-21/);
  t.match(md, /## Forwarding, 3 backends/);
  t.match(md, /\| kernel \| 30,000 \| 1\.50x \| 0\.75x \|/);
  t.match(md, /\*\*not met\*\*/);
  t.notMatch(md, /undefined|NaN/);
  t.notMatch(md, /## DHCP/, 'areas that did not run are left out');
  const summary = renderBenchSummary(r, 'bench/results/2026-11-21.md');
  t.match(summary, /\[bench\/results\/2026-11-21\.md\]\(\.\.\/bench\/results\/2026-11-21\.md\)/, 'linked from docs/, one folder down');
  t.notMatch(summary, /undefined|NaN/);
});

t.test('docs/benchmarks.md: appended once at the end, then replaced in place', async (t) => {
  const page = '# Benchmarks\n\nintro\n\n## How to read them\n\ntext\n';
  const once = updateBenchPage(page, 'TABLE 1');
  t.ok(once.startsWith(page.trimEnd()), 'everything before is untouched');
  t.match(once, /## Latest results\n\n<!-- bench:begin/);
  t.ok(once.trimEnd().endsWith(BENCH_END));
  const prose = once.replace(BENCH_BEGIN, `Hand-written words.\n\n${BENCH_BEGIN}`);
  const twice = updateBenchPage(prose, 'TABLE 2');
  t.notMatch(twice, /TABLE 1/);
  t.match(twice, /TABLE 2/);
  t.match(twice, /Hand-written words\./, 'text outside the markers is kept');
  t.equal(twice.split('## Latest results').length, 2, 'one section');
});

t.test('the latest full run: by date, then the day\'s run number; quick and single-area runs are not one', async (t) => {
  t.equal(latestFullRun(['2026-11-30.json', '2026-11-30-3.json', '2026-11-30-2.json', '2026-11-29-8.json', '2026-11-30-3.md']), '2026-11-30-3.json');
  t.equal(latestFullRun(['2026-11-29-10.json', '2026-11-29-9.json']), '2026-11-29-10.json', 'run 10 after run 9');
  t.equal(latestFullRun(['2026-11-24.json', '2026-12-01-quick.json', '2026-12-01-restart-failover.json', '2026-11-25-dsr3-1.json']), '2026-11-24.json');
  t.equal(latestFullRun(['notes.txt']), undefined);
});

t.test('failover: bench/failover.ts results as a table with keepalived as the base', async (t) => {
  const r = results();
  r.failover = {
    present: true, command: 'node dist/bench/failover.js',
    raw: [{ bench: 'failover', what: 'ms from death to answer', results: {
      agent: { '1': { medianServedMs: 2974, medianVrrpMs: 2940, medianBoundMs: 2970, masterDownIntervalMs: 3414.1, runs: [{}, {}, {}] }, '0.1': { medianServedMs: 373, medianVrrpMs: 335, medianBoundMs: 366, masterDownIntervalMs: 341.4, runs: [{}] } },
      keepalived: { '1': { medianServedMs: 2961, medianVrrpMs: null, medianBoundMs: null, masterDownIntervalMs: 3414.1, runs: [{}, {}, {}] }, '0.1': { medianServedMs: 318, masterDownIntervalMs: 341.4, runs: [{}] } },
    } }],
  };
  const md = renderResults(r);
  t.match(md, /## Failover/);
  t.match(md, /\| 1 s \| agent \| 3,414\.1 \| 2,940 \| 2,970 \| 2,974 \| 1\.00x \| 3 \|/);
  t.match(md, /\| 0\.1 s \| agent \| 341\.4 \| 335 \| 366 \| 373 \| 1\.17x \| 1 \|/);
  t.match(md, /\| 1 s \| keepalived \| 3,414\.1 \| n\/a \| n\/a \| 2,961 \| 1\.00x \| 3 \|/);
  t.notMatch(md, /undefined|NaN/);
});

t.test('failover output of another shape falls back to its numbers', async (t) => {
  const r = results();
  r.failover = { present: true, raw: [{ takeoverMs: 120, nested: { a: 1 } }] };
  const md = renderResults(r);
  t.match(md, /\| takeoverMs \| 120 \|/);
  t.match(md, /\| nested\.a \| 1 \|/);
});

function restartResult(rows: Partial<RestartSummaryRow>[]): RestartResult {
  return {
    config: { rounds: 3, preMs: 400, postMs: 800, intervalMs: 20, timeoutMs: 500, vip: '10.99.0.200/32', haproxy: 'haproxy -W -S' },
    summary: rows.map((r) => ({ who: 'kernel', event: 'sigkill', failures: 0, longestMs: 20, firstAnswerAfterMs: 20, gapMs: 0, totalFailures: 0, runs: 3, runsOk: 3, ...r })),
    raw: [], errors: [],
  };
}

const restartRows = (over: Partial<RestartSummaryRow>[] = []): Partial<RestartSummaryRow>[] => [
  { who: 'kernel', event: 'sigkill' }, { who: 'kernel', event: 'planned' }, { who: 'kernel', event: 'replace' }, { who: 'kernel', event: 'reload-global' }, { who: 'kernel', event: 'reload-services' },
  { who: 'proxy', event: 'sigkill', failures: 35, totalFailures: 100, gapMs: 900, firstAnswerAfterMs: 910 }, { who: 'proxy', event: 'planned', failures: 55, longestMs: 30, totalFailures: 160 },
  { who: 'proxy', event: 'replace', failures: 1, longestMs: 70, totalFailures: 2 }, { who: 'proxy', event: 'reload-global' }, { who: 'proxy', event: 'reload-services' },
  { who: 'haproxy', event: 'seamless-reload', longestMs: 60 }, { who: 'haproxy', event: 'stop-start', failures: 12, totalFailures: 30 },
  ...over,
];

t.test('restart targets: zero failed requests in every round, the hand-over restart of the proxy against HAProxy\'s seamless reload', async (t) => {
  const r = results();
  r.restart = restartResult(restartRows());
  const rows = evaluateTargets(r).filter((x) => x.area === 'restart');
  t.same(rows.map((x) => x.met), [true, false, false], 'a failed request across --replace fails both proxy targets');
  t.match(rows[1]!.measured, /^2 failed requests: replace 2 \(3 rounds\)/);
  t.equal(rows[2]!.measured, '1 vs 0 failed requests, longest 70 ms vs 60 ms (medians)', 'compared: --replace, not SIGTERM and start');
  t.match(rows[2]!.target, /hand-over \(`--replace`\)/);
  r.restart = restartResult(restartRows().map((x) => (x.who === 'proxy' && x.event === 'replace' ? { ...x, failures: 0, totalFailures: 0 } : x)));
  t.same(evaluateTargets(r).filter((x) => x.area === 'restart').map((x) => x.met), [true, true, true]);

  r.restart = restartResult(restartRows().map((x) => (x.who === 'kernel' && x.event === 'reload-services' ? { ...x, totalFailures: 1 } : x)));
  const k = evaluateTargets(r).find((x) => x.target.startsWith('kernel path: 0 failed'))!;
  t.equal(k.met, false, 'one failed request in one round is not met, though the median is 0');
  t.match(k.measured, /^1 failed requests: .*reload-services 1 \(3 rounds\)/);

  r.restart = restartResult(restartRows().filter((x) => !(x.who === 'proxy' && x.event === 'reload-global'))
    .map((x) => (x.who === 'proxy' && x.event === 'replace' ? { ...x, failures: 0, totalFailures: 0 } : x)));
  t.equal(evaluateTargets(r).find((x) => x.target.startsWith('proxy path: 0 failed'))!.met, undefined, 'an event not measured leaves the target not measured');
});

t.test('restart table: every event with the ratio to HAProxy\'s seamless reload, and the systemd note', async (t) => {
  const r = results();
  r.restart = restartResult(restartRows());
  r.restart.errors = ['round 2 proxy reload-global: reload rejected'];
  const md = renderResults(r);
  t.match(md, /## Restart and reload, client loop every 20 ms/);
  t.match(md, /\| lb-agent, proxy path \| planned restart: SIGTERM \(`--on-stop keep`\), new `lb-agent run` \| 55 \| 30 \| 0\.50x \| 20 \| 0 \| 160 \| 3\/3 \|/);
  t.match(md, /\| HAProxy, master-worker \| stop \(SIGTERM\) and start \| 12 \| 20 \| - \|/);
  t.match(md, /fd store/);
  t.match(md, /Not measured: round 2 proxy reload-global: reload rejected\./);
  t.notMatch(md, /undefined|NaN/);
  t.match(renderBenchSummary(r, 'bench/results/x.md'), /Restart and reload, client loop every 20 ms/);
});

t.test('issue 17: DSR targets against direct (keep-alive, and bulk on the replies\' direction), its columns and the hashing table', async (t) => {
  const r = results();
  const f = r.forward!.summary;
  f.direct = { ...fwd('direct', 40_000, 8000, 10), bulkReverseGbps: 20 };
  f.dsr = { ...fwd('dsr', 36_000, 6000, 8), bulkReverseGbps: 19.5 };
  f.kernel = { ...fwd('kernel', 30_000, 5000, 9), bulkReverseGbps: 12 };
  r.forward!.dsrHashing = [{ backends: 3, slots: 1021, healthOut: 0.334, healthOutMinimum: 0.334, healthBack: 0.334, configAdd: 0.2547, configAddMinimum: 0.25, configRemove: 0.3408, configRemoveMinimum: 0.3333 }];
  const rows = evaluateTargets(r);
  const by = (s: string) => rows.find((x) => x.target.startsWith(s))!;
  t.same([by('kernel path DSR keep-alive').measured, by('kernel path DSR keep-alive').met], ['0.90x', true]);
  t.same([by('kernel path DSR bulk').measured, by('kernel path DSR bulk').met], ['0.97x', true], 'judged on the reverse stream (19.5 / 20)');
  const md = renderResults({ ...r, targets: rows });
  t.match(md, /\| bulk Gbit\/s \| x direct \| bulk replies Gbit\/s \| x direct \| RSS MiB \|/);
  t.match(md, /\| 3 \| 1,021 \| 33\.4% \(33\.4%\) \| 33\.4% \| 25\.5% \(25\.0%\) \| 34\.1% \(33\.3%\) \|/);
  t.notMatch(md, /NaN|undefined/);
  // Paired with a direct run before each slot: the per-pair median wins over the ratio of medians, in every row's keep-alive column.
  f.dsr.keepalive.xDirect = 0.86;
  f.kernel.keepalive.xDirect = 0.7;
  r.forward!.config.pairing = 'keep-alive x direct: median over rounds of the ratio to direct measured right before';
  const paired = evaluateTargets(r);
  t.same([paired.find((x) => x.target.startsWith('kernel path DSR keep-alive'))!.measured, paired.find((x) => x.target.startsWith('kernel path DSR keep-alive'))!.met], ['0.86x', true], 'the paired ratio, not 36,000 / 40,000');
  f.dsr.bulkReverseXDirect = 0.93;
  const pairedReplies = evaluateTargets(r).find((x) => x.target.startsWith('kernel path DSR bulk'))!;
  t.same([pairedReplies.measured, pairedReplies.met], ['0.93x', false], 'the replies\' paired ratio, not 19.5 / 20');
  t.match(renderResults({ ...r, targets: evaluateTargets(r) }), /\| dsr \| 36,000 \|[^\n]*\| 19\.50 \| 0\.93x \|/, 'and in the table\'s replies column');
  delete f.dsr.bulkReverseXDirect;
  const pmd = renderResults({ ...r, targets: paired });
  t.match(pmd, /\| kernel \| 30,000 \| 1\.50x \| 0\.70x \|/, 'the kernel row\'s keep-alive x direct is its paired ratio too');
  t.match(pmd, /\| dsr \| 36,000 \| [^|]+ \| 0\.86x \|/);
  t.match(pmd, /Keep-alive x direct: median over rounds/, 'the text says how the column is computed');
  t.match(renderBenchSummary(r, 'bench/results/x.md'), /\(keep-alive x direct: median over rounds/);
  const old = results();
  t.notOk(evaluateTargets(old).some((x) => x.target.includes('DSR')), 'no DSR target when DSR was not measured');
  t.notMatch(renderResults(old), /bulk replies/, 'no reverse columns for results from before issue 17');
});

t.test('forward table: a lab CPU column when the results have one, with the excess over direct, and none for older results', async (t) => {
  const r = results();
  t.notMatch(renderResults(r), /lab CPU/, 'older results: no empty column');
  r.forward!.summary.direct = { ...fwd('direct', 40_000, 8000, 10), keepalive: { requestsPerSec: 40_000, p50ms: 0.5, p99ms: 2, cpuUsPerRequest: 24.2 } };
  r.forward!.summary.dsr = { ...fwd('dsr', 36_000, 7000, 9), keepalive: { requestsPerSec: 36_000, p50ms: 0.5, p99ms: 2, xDirect: 0.9, cpuUsPerRequest: 30.1, cpuOverDirectUs: 6.65 } };
  const md = renderResults(r);
  t.match(md, /\| p50 \/ p99 ms \| lab CPU µs\/req \(over direct\) \| new conn\/s \|/);
  t.match(md, /\| direct \| 40,000 \| 2\.00x \| 1\.00x \| 0\.50 \/ 2\.00 \| 24\.2 \| 8,000 \|/);
  t.match(md, /\| dsr \| 36,000 \| 1\.80x \| 0\.90x \| 0\.50 \/ 2\.00 \| 30\.1 \(\+6\.7\) \| 7,000 \|/);
  t.notMatch(md, /undefined|NaN/);
});

t.test('issue 17, like for like: dsr3 is judged against direct3 on a line of its own; the line against direct stays', async (t) => {
  const r = results();
  const f = r.forward!.summary;
  f.direct = fwd('direct', 50_000, 15_000, 12);
  f.dsr = { ...fwd('dsr', 40_000, 14_000, 12), keepalive: { requestsPerSec: 40_000, p50ms: 0.5, p99ms: 2, xDirect: 0.78 } };
  // direct3 is faster than direct (three wrk threads, three nginx); dsr3's pair is direct3.
  f.direct3 = { ...fwd('direct3', 80_000, 20_000, NaN), keepalive: { requestsPerSec: 80_000, p50ms: 0.4, p99ms: 1.5, xDirect: 1.4 } };
  f.dsr3 = { ...fwd('dsr3', 70_000, 17_000, NaN), pairedWith: 'direct3', keepalive: { requestsPerSec: 70_000, p50ms: 0.5, p99ms: 3, xDirect: 0.88 } };
  const rows = evaluateTargets(r);
  const existing = rows.find((x) => x.target === 'kernel path DSR keep-alive req/s >= 0.85x direct')!;
  t.same([existing.measured, existing.met], ['0.78x', false], 'the line against direct to one backend is unchanged');
  const like = rows.find((x) => x.target.startsWith('kernel path DSR keep-alive req/s >= 0.85x direct to the same three backends'))!;
  t.same([like.measured, like.met], ['0.88x', true], 'dsr3\'s paired ratio to direct3');
  t.match(like.target, /dsr3 vs direct3/, 'the line names both rows');
  const md = renderResults({ ...r, targets: rows });
  // new connections 17,000 / 20,000: against direct3 too, not direct's 15,000 (which would say 1.13x).
  t.match(md, /\| dsr3 \| 70,000 \| [^|]+ \| 0\.88x \| [^|]+ \| 17,000 \| [^|]+ \| 0\.85x \| n\/a \| n\/a \|/, 'every x direct column of dsr3 is against direct3');
  delete f.dsr3.keepalive.xDirect;
  t.same(evaluateTargets(r).find((x) => x.target.includes('dsr3 vs direct3'))!.met, undefined, 'without pairs (direct3 not run): not measured, never a ratio to direct');
  t.match(renderResults(r), /\| dsr3 \| 70,000 \| [^|]+ \| 0\.88x \|/, 'the table falls back to the ratio of medians to direct3 (70,000 / 80,000)');
  delete f.dsr3;
  t.notOk(evaluateTargets(r).some((x) => x.target.includes('dsr3')), 'no like-for-like line when dsr3 did not run');
});

t.test('DHCP tables: the agent\'s and the server\'s CPU over the run, "-" where not measured', async (t) => {
  const r = results();
  const row = (client: 'udhcpc' | 'lbagent-like', count: number, medianMs: number, allMs: number, cpu: { agentCpuMs?: number; serverCpuMs?: number }) => ({ label: client, client, count, ping: false, medianMs, allMs, wireMs: 5, runs: 3, failures: 0, ...cpu });
  r.dhcp = {
    config: { rounds: 3, counts: [1, 50], clients: [], ping: [false], manyPingRounds: 0, dnsmasq: 'dnsmasq' },
    summary: [row('udhcpc', 1, 80, 80, { serverCpuMs: 2 }), row('lbagent-like', 1, 300, 300, { agentCpuMs: 190, serverCpuMs: 3 }), row('lbagent-like', 50, 400, 450, { agentCpuMs: 320, serverCpuMs: 61 }), row('udhcpc', 50, 200, 3000, {})],
    raw: [],
  };
  const md = renderResults(r);
  t.match(md, /\| lb-agent spawn -> first DISCOVER ms \| lb-agent CPU ms \| dnsmasq CPU ms \| runs ok \|/);
  t.match(md, /\| lbagent-like \| off \| 300 \| [^|]+ \| 5 \| - \| - \| 190 \| 3 \| 3\/3 \|/, 'one service: both CPUs');
  t.match(md, /\| udhcpc \| off \| 80 \| [^|]+ \| 5 \| - \| - \| - \| 2 \| 3\/3 \|/, 'a peer: the server\'s only');
  t.match(md, /\| lbagent-like \| 50 \| off \| 400 \| 450 \| 1\.50x \| 5 \| - \| 320 \| 61 \| 3\/3 \|/, '50 services');
  t.match(md, /\| udhcpc \| 50 \| off \| 200 \| 3,000 \| [^|]+ \| 5 \| - \| - \| - \| 3\/3 \|/, 'nothing measured: dashes');
  t.notMatch(md, /undefined|NaN/);
});

function driftResult(over: Partial<Record<string, number>> = {}): DriftResult {
  const agent: DriftSummaryRow[] = DAMAGE_KINDS.map((kind) => ({ who: 'agent', kind, downMs: over[kind] ?? 80, failures: 4, repairLoggedMs: 70, worstDownMs: 120, runs: 3, runsOk: 3 }));
  return {
    config: { rounds: 3, intervalMs: 20, timeoutMs: 300, timerPeriodMs: 10_000, timerKinds: ['delete-table', 'pool-address'], services: 1000, cpuWindowSeconds: 10, cpuPairs: 3 },
    summary: [...agent, { who: 'timer', kind: 'delete-table', downMs: 6200, failures: 300, repairLoggedMs: NaN, worstDownMs: 8700, runs: 3, runsOk: 3 }],
    timer: { timerMs: 5000, agentMs: 62, kinds: ['delete-table', 'pool-address'] },
    resync: { services: 1000, startMs: 15_000, windowSeconds: 10, quietInterval: 15, pairs: [{ withMs: 700, withoutMs: 500 }], cpuWithMs: 700, cpuWithoutMs: 500, resyncs: 10, cpuPerResyncMs: 20 },
    raw: [], errors: [],
  };
}

t.test('drift target: every kind\'s median under 1 s; one over is not met, one missing is not measured', async (t) => {
  const r = results();
  r.drift = driftResult({ 'dhcp-link-del': 150 });
  const row = (): { measured: string; met: boolean | undefined } => evaluateTargets(r).find((x) => x.area === 'drift')!;
  t.equal(evaluateTargets(r).find((x) => x.area === 'drift')!.target, 'drift: every kind repaired to the first answer under 1 s');
  t.same(row(), { area: 'drift', target: 'drift: every kind repaired to the first answer under 1 s', measured: 'longest 150 ms (dhcp-link-del)', met: true });
  r.drift = driftResult({ 'arp-ignore': 1200 });
  t.same([row().met, row().measured], [false, 'longest 1,200 ms (arp-ignore); over 1 s: arp-ignore 1,200 ms']);
  r.drift = driftResult();
  r.drift.summary = r.drift.summary.filter((s) => s.kind !== 'ip-forward');
  t.same([row().met, row().measured], [undefined, 'longest 80 ms (flush-ruleset); not measured: ip-forward'], 'the timer row does not stand in for the agent\'s');
});

t.test('drift section: the table with the timer row, the ratio, half the period, and the cost per resync', async (t) => {
  const r = results();
  r.drift = driftResult();
  const md = renderResults(r);
  t.match(md, /## Drift: damage by another program to the first answer/);
  t.match(md, /\| lb-agent drift guard \(notifications, resync 30 s\) \| `ip link del` of the DHCP macvlan \| 80 \| 120 \| 4 \| 70 \| 3\/3 \|/);
  t.match(md, /\| timer-only repair \(Calico Felix-style\), period 10 s \| `nft delete table ip lb_agent` \| 6,200 \| 8,700 \| 300 \| - \| 3\/3 \|/);
  t.match(md, /median 5,000 ms against 62 ms, 80\.65x as long down/);
  t.match(md, /T\/2 on average \(5,000 ms here/);
  t.match(md, /\*\*20\.0 ms of CPU per resync\*\*/);
  t.notMatch(md, /undefined|NaN/);
  t.match(renderBenchSummary(r, 'bench/results/x.md'), /Drift, damage by another program/);
});
