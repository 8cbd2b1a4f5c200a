// bench/scale.ts, its pure half: each service balances over 2-4 backends,
// the reload's config changes one backend of one service and nothing else,
// the kube-proxy-style reference replaces that same backend by one map
// element, nft's timing is read from bash `times`, an event's CPU is read
// between samples, the targets are judged at 1,000 services only, and the
// reloads and transitions are reported with their quartiles.
import t from 'tap';
import { backendsOf, scaleConfig, referenceTables, parseTimed, cpuBetween, scrapeWindows, spreadOf, summarizeScale, type ScaleRun } from '../../bench/scale';
import { scaleTable, scaleTargets } from '../../bench/lib/report';

interface Svc { name: string; backends: string[]; ports: { targetPort: number }[] }

t.test('2, 3 or 4 distinct backends a service', async (t) => {
  for (let i = 0; i < 12; i++) {
    const b = backendsOf(i);
    t.ok(b.length >= 2 && b.length <= 4, `s${i} has ${b.length}`);
    t.equal(new Set(b).size, b.length, `s${i}'s are distinct`);
  }
});

t.test('the changed config differs in one backend of one service', async (t) => {
  const a = scaleConfig(100).services as Svc[];
  const b = scaleConfig(100, true).services as Svc[];
  const diff = a.map((s, i) => [s, b[i]!] as const).filter(([x, y]) => JSON.stringify(x) !== JSON.stringify(y));
  t.equal(diff.length, 1);
  const [x, y] = diff[0]!;
  t.equal(x.name, 's1');
  t.equal(x.backends.length, y.backends.length);
  t.equal(x.backends.filter((v) => !y.backends.includes(v)).length, 1, 'one backend swapped');
  t.equal(a.filter((s) => s.ports[0]!.targetPort !== 8080).map((s) => s.name).join(), 's0', 'only s0 checks a port of its own');
});

t.test('the reference: a chain per endpoint, and a delta that swaps one map element', async (t) => {
  const r = referenceTables(3);
  t.equal((r.full.match(/^\tchain ep_/gm) ?? []).length, 2 + 3 + 4);
  t.equal(r.elements, 3 + 2 + 3 + 4);
  t.match(r.delta, /delete element ip kp svc_1_eps \{ 2 \}\nadd element ip kp svc_1_eps \{ 2 : goto ep_1_2x \}/);
  t.match(r.delta, /dnat to 10\.96\.0\.11:8080/, 'to the backend s1 did not use');
  t.match(r.undo, /add chain ip kp ep_1_2\nadd rule ip kp ep_1_2 meta l4proto tcp dnat to 10\.96\.0\.14:8080\n[^]*delete chain ip kp ep_1_2x\n$/, 'and back');
});

t.test('nft timing from the script: µs, then the shell\'s times (its own, then its children\'s)', async (t) => {
  t.same(parseTimed('2500\n0m0.001s 0m0.002s\n0m0.012s 0m0.030s\n'), { wallMs: 2.5, cpuMs: 42 });
});

t.test('an event\'s CPU between two instants, linear between samples', async (t) => {
  const s = [{ t: 0, cpuMs: 0 }, { t: 100, cpuMs: 10 }, { t: 200, cpuMs: 30 }];
  t.equal(cpuBetween(s, 50, 150), 15);
  t.ok(Number.isNaN(cpuBetween(s, 50, 250)), 'past the last sample: unknown');
});

t.test('each scrape from before its send to after its answer, less a control window of the same length before it', async (t) => {
  // Idle at 0.1 ms/ms throughout; a scrape sent at 1000 adds 20 ms between 1000 and 1050, another at 2250 adds 30 ms between 2250 and 2300.
  const samples: { t: number; cpuMs: number }[] = [];
  for (let x = 0; x <= 3000; x += 25) {
    const extra = (x >= 1050 ? 20 : x > 1000 ? (20 * (x - 1000)) / 50 : 0) + (x >= 2300 ? 30 : x > 2250 ? (30 * (x - 2250)) / 50 : 0);
    samples.push({ t: x, cpuMs: 0.1 * x + extra });
  }
  const o = { leadMs: 50, tailMs: 100, gapMs: 100, idleRate: 0.1 };
  const w = scrapeWindows(samples, [{ sent: 1000, done: 1040 }, { sent: 2250, done: 2400 }], o);
  t.same(w.cpuMs, [20, 30], 'the idle work in the window is taken away by the control, not by the mean rate');
  t.same(w.controlCpuMs, [0, 0], 'the controls hold the idle work alone');
  t.same(w.windowMs, [190, 300], 'a slower answer, a longer window (and control)');
  const busy = scrapeWindows(samples, [{ sent: 1000, done: 1040 }], { ...o, idleRate: 0.05 });
  t.same(busy.cpuMs, [20], 'a wrong mean idle rate moves the control, not the scrape');
  t.same(busy.controlCpuMs, [9.5]);
  const early = scrapeWindows(samples, [{ sent: 200, done: 300 }], o);
  t.ok(Number.isNaN(early.cpuMs[0]!) && Number.isNaN(early.controlCpuMs[0]!), 'a control before the first sample is unknown, not zero');
  const close = scrapeWindows(samples, [{ sent: 1000, done: 1040 }, { sent: 1300, done: 1400 }], o);
  t.ok(Number.isNaN(close.cpuMs[1]!), 'a control that would reach into the previous scrape\'s window is unknown');
  const lost = scrapeWindows(samples, [{ sent: 1000, done: NaN }], o);
  t.ok(Number.isNaN(lost.cpuMs[0]!), 'a scrape with no end is unknown');
});

t.test('readings: median and lowest-highest, missing readings left out', async (t) => {
  t.same(spreadOf([99.1, 97.2, NaN, 98.0, 101.5]), { median: 98.55, low: 97.2, high: 101.5 });
  const none = spreadOf([]);
  t.ok(Number.isNaN(none.median) && Number.isNaN(none.low) && Number.isNaN(none.high));
});

t.test('the windowed readings summarized and shown beside the span reading', async (t) => {
  const run = { services: 1000, backends: 3000, readyMs: 1, rssMiB: 98, rssAfterScrapesMiB: 99, rssReadingsMiB: [97, 98, 100], rssAfterScrapesReadingsMiB: [99, 99, 101], descriptors: 60, packetSockets: 3, idleWindowSeconds: 10, idleCpuMs: 50, idleCpuPercent: 0.5, nftLines: 10,
    reloadCpuMs: [40, 50, 60, 70], reloadControlCpuMs: [1, -2, 3, 0], reloadWallMs: [1], transitionCpuMs: [2], transitionKinds: ['down'], scrapeCpuMs: 38.8,
    scrapeWindowCpuMs: [18, 19, 20, 25], scrapeControlCpuMs: [-1, 0, 1, 2], scrapes: 4, metricsBytes: 1, metricsBytesPerService: 300,
    burst: { rate: 50, seconds: 10, sent: 500, ok: 500, failed: 0, p50Ms: 1, p99Ms: 2, errors: [] }, statusCliMs: [40], statusRequestMs: [5], statusBytes: 1, stopMs: 1500, stopKilled: false,
    reference: { lines: 1, elements: 1, fullWallMs: [1], fullCpuMs: [1], deltaWallMs: [1], deltaCpuMs: [1] } } satisfies ScaleRun;
  const [s] = summarizeScale([run]);
  t.equal(s!.rssLowMiB, 97);
  t.equal(s!.rssAfterScrapesHighMiB, 101);
  t.equal(s!.reloadNetCpuMs, 54.5, 'each reload less its own control: 39, 52, 57, 70');
  t.equal(s!.reloadNetP25Ms, 39);
  t.equal(s!.scrapeWindowCpuMs, 19.5);
  t.equal(s!.scrapeWindowP75Ms, 20);
  t.equal(s!.scrapeControlCpuMs, 0.5);
  t.equal(s!.scrapeWindowMeanMs, 20.5, 'the mean beside the median');
  const rows = scaleTargets({ config: {} as never, summary: [s!], raw: [], errors: [] });
  const scrape = rows.find((x) => /scrape under/.test(x.target))!;
  t.equal(scrape.met, true, 'judged on the windowed reading, not the span');
  t.match(scrape.measured, /^19\.5 ms, median of each scrape's window less its control \(quartiles 18\.0-20\.0, mean 20\.5; 38\.8 over the span/);
  const text = scaleTable({ scale: { config: {} as never, summary: [s!], raw: [], errors: [] } } as never) ?? '';
  t.match(text, /\| RSS MiB \(lowest-highest\) \|/);
  t.match(text, /\| 98\.0 \(97\.0-100\.0\) \|/);
  t.match(text, /\| 38\.8 \| 19\.5 \(18\.0-20\.0; 20\.5\) \| 0\.5 \(-1\.0-1\.0\) \|/);
});

t.test('targets at 1,000 services only', async (t) => {
  const run = (services: number): ScaleRun => ({
    services, backends: services * 3, readyMs: 1, rssMiB: 70, descriptors: 60, packetSockets: 3, idleWindowSeconds: 10, idleCpuMs: 50, idleCpuPercent: 0.5, nftLines: 10,
    reloadCpuMs: [40, 60], reloadWallMs: [1], transitionCpuMs: [2, 4], transitionKinds: ['down', 'up'], scrapeCpuMs: 10, scrapes: 4, metricsBytes: 1, metricsBytesPerService: 300,
    burst: { rate: 50, seconds: 10, sent: 500, ok: 500, failed: 0, p50Ms: 1, p99Ms: 2, errors: [] }, statusCliMs: [40], nodeStartMs: [30], statusRequestMs: [5], statusBytes: 1, stopMs: 1500, stopKilled: false,
    reference: { lines: 1, elements: 1, fullWallMs: [1], fullCpuMs: [1], deltaWallMs: [1], deltaCpuMs: [1] },
  });
  const none = scaleTargets({ config: {} as never, summary: summarizeScale([run(100)]), raw: [], errors: [] });
  t.ok(none.every((x) => x.met === undefined), 'a run without 1,000 services judges nothing');
  const rows = scaleTargets({ config: {} as never, summary: summarizeScale([run(1000)]), raw: [], errors: [] });
  t.equal(rows.length, 8);
  t.equal(rows.find((x) => /reload/.test(x.target))!.met, false, 'median 50 ms is not under 50');
  t.ok(rows.filter((x) => !/reload/.test(x.target)).every((x) => x.met === true));
  t.equal(rows.find((x) => /status/.test(x.target))!.measured, '40 ms as a process, of which Node\'s own start (`node -e 0`, the floor of any Node command) 30 ms, the CLI over it 10 ms; 5.0 ms the request alone', 'Node\'s own start beside the process');
  const withCurl = scaleTargets({ config: {} as never, summary: summarizeScale([{ ...run(1000), statusCurlMs: [9] }]), raw: [], errors: [] });
  t.equal(withCurl.find((x) => /status/.test(x.target))!.measured, '40 ms as a process, of which Node\'s own start (`node -e 0`, the floor of any Node command) 30 ms, the CLI over it 10 ms; 5.0 ms the request alone; `curl --unix-socket` (no Node) 9 ms', 'and curl, where the run measured it');
});

t.test('the table gives each size\'s start to ready in seconds', async (t) => {
  const run = { services: 1000, backends: 3000, readyMs: 21_650, rssMiB: 70, descriptors: 60, packetSockets: 3, idleWindowSeconds: 10, idleCpuMs: 50, idleCpuPercent: 0.5, nftLines: 10,
    reloadCpuMs: [40], reloadWallMs: [1], transitionCpuMs: [2], transitionKinds: ['down'], scrapeCpuMs: 10, scrapes: 4, metricsBytes: 1, metricsBytesPerService: 300,
    burst: { rate: 50, seconds: 10, sent: 500, ok: 500, failed: 0, p50Ms: 1, p99Ms: 2, errors: [] }, statusCliMs: [40], statusRequestMs: [5], statusBytes: 1, stopMs: 1500, stopKilled: false,
    reference: { lines: 1, elements: 1, fullWallMs: [1], fullCpuMs: [1], deltaWallMs: [1], deltaCpuMs: [1] } } satisfies ScaleRun;
  const text = scaleTable({ scale: { config: {} as never, summary: summarizeScale([run]), raw: [], errors: [] } } as never) ?? '';
  t.match(text, /^\| services \(backends\) \| start to ready s \| RSS MiB \|/);
  t.match(text, /\n\| 1,000 \(3,000\) \| 21\.7 \| 70\.0 \|/);
});

t.test('the RSS target judges the larger of the settled RSS and the RSS after 20 scrapes', async (t) => {
  const run = (rssAfterScrapesMiB?: number): ScaleRun => ({
    services: 1000, backends: 3000, readyMs: 1, rssMiB: 70, ...(rssAfterScrapesMiB !== undefined ? { rssAfterScrapesMiB } : {}), descriptors: 60, packetSockets: 3, idleWindowSeconds: 10, idleCpuMs: 50, idleCpuPercent: 0.5, nftLines: 10,
    reloadCpuMs: [40], reloadWallMs: [1], transitionCpuMs: [2], transitionKinds: ['down'], scrapeCpuMs: 10, scrapes: 20, metricsBytes: 1, metricsBytesPerService: 300,
    burst: { rate: 50, seconds: 10, sent: 500, ok: 500, failed: 0, p50Ms: 1, p99Ms: 2, errors: [] }, statusCliMs: [40], statusRequestMs: [5], statusBytes: 1, stopMs: 1500, stopKilled: false,
    reference: { lines: 1, elements: 1, fullWallMs: [1], fullCpuMs: [1], deltaWallMs: [1], deltaCpuMs: [1] },
  });
  const rss = (r: ScaleRun) => scaleTargets({ config: {} as never, summary: summarizeScale([r]), raw: [], errors: [] }).find((x) => /RSS/.test(x.target))!;
  t.equal(rss(run(120)).met, false, 'grown past 80 MiB by the scrapes');
  t.equal(rss(run(120)).measured, '70.0 MiB settled, 120.0 MiB after 20 scrapes');
  t.equal(rss(run(75)).met, true);
  t.equal(rss(run()).met, true, 'a result from before the column judges on the settled RSS');
  t.equal(rss(run()).measured, '70.0 MiB settled');
  const text = scaleTable({ scale: { config: {} as never, summary: summarizeScale([run(120)]), raw: [], errors: [] } } as never) ?? '';
  t.match(text, /\| RSS MiB \| RSS after 20 scrapes MiB \|/);
  t.match(text, /\n\| 1,000 \(3,000\) \| 0\.0 \| 70\.0 \| 120\.0 \|/);
});

t.test('reloads and transitions: the median with the quartiles, so a run shows its own spread', async (t) => {
  const run = { services: 1000, backends: 3000, readyMs: 1, rssMiB: 70, descriptors: 60, packetSockets: 3, idleWindowSeconds: 30, idleCpuMs: 50, idleCpuPercent: 0.5, nftLines: 10,
    reloadCpuMs: [70, 10, 20, 30, 40, 50, 60, 80, 90, 100], reloadWallMs: [1], transitionCpuMs: [8, 2, 4, 6], transitionKinds: ['down', 'up', 'down', 'up'], scrapeCpuMs: 10, scrapes: 4, metricsBytes: 1, metricsBytesPerService: 300,
    burst: { rate: 50, seconds: 10, sent: 500, ok: 500, failed: 0, p50Ms: 1, p99Ms: 2, errors: [] }, statusCliMs: [40], statusRequestMs: [5], statusBytes: 1, stopMs: 1500, stopKilled: false,
    reference: { lines: 1, elements: 1, fullWallMs: [1], fullCpuMs: [1], deltaWallMs: [1], deltaCpuMs: [1] } } satisfies ScaleRun;
  const [s] = summarizeScale([run]);
  t.same([s!.reloadCpuMs, s!.reloadCpuP25Ms, s!.reloadCpuP75Ms], [55, 30, 80], 'reloads: median 55, quartiles 30 and 80');
  t.same([s!.transitionCpuMs, s!.transitionCpuP25Ms, s!.transitionCpuP75Ms], [5, 2, 6], 'transitions: median 5, quartiles 2 and 6');
  const text = scaleTable({ scale: { config: {} as never, summary: [s!], raw: [], errors: [] } } as never) ?? '';
  t.match(text, /\| 55\.0 \(30\.0-80\.0\) \|/, 'the table gives the quartiles beside the median');
  t.match(text, /\| 5\.0 \(2\.0-6\.0\) \|/);
});
