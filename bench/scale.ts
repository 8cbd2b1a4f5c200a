// Bench area "scale": what the real `lb-agent run` costs as the service count
// grows, at 10, 100, 500 and 1,000 pool services by default (--scale-sizes).
// Each size gets a lab of its own: the node, four backend namespaces on the
// bridge (each service balances over 2-4 of them, health checks on with the
// defaults, kernel path, the unit's environment), and a monitoring namespace
// that scrapes /metrics from across the bridge. Per size:
//   RSS                  VmRSS of the agent once every service is ready and
//                        the start has settled: RSS_READINGS readings 1 s
//                        apart from 5 s after its "settled" line, their
//                        median and spread (lowest-highest)
//   descriptors          its open file descriptors then (/proc/PID/fd), and
//                        how many of them are packet sockets
//   idle CPU             the agent's CPU (its threads at the scheduler's
//                        resolution, its reaped children: nft) over a window
//                        that opens 20 s after the start has settled (its
//                        "settled" log line; V8's memory reducer done), % of
//                        a core
//   nft lines            `nft list ruleset | wc -l` in the node's namespace
//   reload               the agent's CPU from SIGHUP of a config that changes
//                        one backend of one service to EVENT_TAIL_MS after
//                        the reload is applied, less the idle rate over that
//                        time; RELOADS of them (the swap and the swap back),
//                        their median and quartiles; beside each a control
//                        window of the same length ending 100 ms before the
//                        signal (no event in it), less the idle rate, and
//                        the reload less its own control
//   health transition    one backend of one service (a listener of its own,
//                        on a port no other service checks) stopped, later
//                        started again: the agent's CPU from its transition log
//                        line to EVENT_TAIL_MS later, less the idle rate over
//                        that time; beside it the same window 1 s before the
//                        line (no event in it: how far the idle work alone
//                        spreads) and the 1 s window of earlier reports
//   /metrics             20 scrapes 1.25 s apart (past the 1 s the endpoint
//                        reuses a gather). Each scrape's CPU: the agent's CPU
//                        from SCRAPE_LEAD_MS before its request was sent to
//                        SCRAPE_TAIL_MS after its answer ended, less a
//                        control window of the same length just before it
//                        (no scrape in it): median and quartiles, the
//                        controls (less the idle rate) beside them. The span reading
//                        of earlier reports beside it: CPU over the 20
//                        scrapes' span less the idle rate, divided by 20.
//                        The body's bytes per service, the RSS after those
//                        scrapes (RSS_READINGS readings 1 s apart: a
//                        scrape's garbage that outlives the young generation
//                        shows there, not in the RSS before), and 50 scrapes
//                        a second for 10 s: failures
//   status --json        wall time of `lb-agent status --json` (a process),
//                        beside Node's own start (`node -e 0`, the same
//                        way, in the same round), of `curl --unix-socket`
//                        asking the socket's HTTP view (the same bytes: a
//                        client that is not Node), and of the control
//                        request alone (the answer streamed, not parsed)
//   stop                 SIGTERM to exit, wall time
// The reference is a kube-proxy-style (nftables mode) table of the same
// service and backend count in a namespace of its own: a verdict map from
// VIP and port to a service chain, a map per service from a random number
// to its endpoint chains, a chain per endpoint. `nft -f` of the delta that
// replaces one backend (one endpoint chain added, one map element changed,
// the old chain deleted) is timed and CPU-counted, beside the full table
// written with `nft -f` the way the agent writes its own; each is run many
// times (the change, then the change back) and divided, as the kernel counts
// a child's CPU in 10 ms ticks.
// CPU of the agent is counted at the scheduler's resolution for its live
// threads (schedstat) plus its reaped children in 10 ms ticks.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Lab } from '../lab/netns';
import { startBackend, type Backend } from '../lab/services';
import { agentCli, waitStatus, unitEnvironment } from '../lab/agent';
import { controlStream } from '../agent/control/server';
import { runAgent, stopAgent, logTime, FAST_ARP, type AgentHandle } from './lib/agent';
import { cpuFineWithChildrenMs, descriptorsOf, memoryOf } from './lib/procfs';
import { median, percentile, round } from './lib/stats';

export const SCALE_SIZES = [10, 100, 500, 1000] as const;

/**
 * Reloads per size, at least: one reload's CPU less the idle rate varies by
 * what else of the agent's fell in its window (a drift resync, a
 * collection), so a median of few moves between runs of the same code.
 */
export const RELOADS = 10;

/**
 * How long after a reload's or a transition's log line its CPU is counted
 * (ms). The apply, the health file's write (50 ms later) and the status
 * line fall within it; the idle work the agent does meanwhile (600 health
 * probes a second at 1,000 services, the ARP refresh wheel, a drift resync
 * every 30 s, collections) is subtracted at its mean rate, and its spread
 * grows with the window: a 1 s window put tens of ms of that spread on a
 * transition of a few.
 */
export const EVENT_TAIL_MS = 300;

/**
 * A scrape's window opens this long before its request is sent and closes
 * this long after its answer ended (ms): the CPU samples are 25 ms apart
 * and read linearly between.
 */
export const SCRAPE_LEAD_MS = 50;
export const SCRAPE_TAIL_MS = 100;
/** A scrape's control window ends this long before the scrape's own window opens (ms). */
export const SCRAPE_CONTROL_GAP_MS = 100;

/** RSS readings 1 s apart, settled and after the scrapes: VmRSS moves with each collection, so one reading is one draw. */
export const RSS_READINGS = 5;

const NODE = '10.96.0.2';
const MON = '10.96.0.3';
const BACKENDS = ['10.96.0.11', '10.96.0.12', '10.96.0.13', '10.96.0.14'];
const METRICS_LISTEN = `${NODE}:9477`;
/** The port of the one service whose backend is stopped for the health transition: no other service checks it. */
const LONE_PORT = 8081;

/** Backends of service i (pure): 2, 3 or 4 of the four, starting at a rotating one. */
export function backendsOf(i: number): string[] {
  const k = 2 + (i % 3);
  return Array.from({ length: k }, (_, j) => BACKENDS[(i + j) % BACKENDS.length]!);
}

/**
 * The config of n pool services (pure). Service s0 checks and forwards to
 * LONE_PORT; `changed`: service s1's last backend swapped for the one it
 * does not use, the reload's one change.
 */
export function scaleConfig(n: number, changed = false, engine?: ScaleEngine): Record<string, unknown> {
  return {
    node: { name: 'bench', interface: 'eth0' },
    dataplane: 'kernel',
    ...(engine !== undefined ? { kernel: { engine } } : {}),
    metrics: { listen: METRICS_LISTEN },
    pools: { 'range-global': '10.96.4.0-10.96.11.255' },
    arp: FAST_ARP,
    services: Array.from({ length: n }, (_, i) => {
      let backends = backendsOf(i);
      if (changed && i === 1) backends = [...backends.slice(0, -1), BACKENDS.find((b) => !backends.includes(b))!];
      return { name: `s${i}`, ipam: 'pool', ports: [{ port: 80, targetPort: i === 0 ? LONE_PORT : 8080 }], backends };
    }),
  };
}

/**
 * The kube-proxy-style reference table for n services (pure): the full
 * ruleset text, the delta that replaces service 1's last backend, and the
 * delta that puts it back (so that the change can be timed many times).
 */
export function referenceTables(n: number): { full: string; delta: string; undo: string; elements: number } {
  const lines: string[] = ['table ip kp {'];
  const vmap: string[] = [];
  let elements = 0;
  const svc: string[] = [];
  for (let i = 0; i < n; i++) {
    const bs = backendsOf(i);
    const vip = `10.97.${Math.floor(i / 250)}.${(i % 250) + 1}`;
    vmap.push(`${vip} . 80 : goto svc_${i}`);
    svc.push(`\tmap svc_${i}_eps {\n\t\ttypeof numgen random mod 2 : verdict\n\t\telements = { ${bs.map((_, j) => `${j} : goto ep_${i}_${j}`).join(', ')} }\n\t}`);
    svc.push(`\tchain svc_${i} {\n\t\tnumgen random mod ${bs.length} vmap @svc_${i}_eps\n\t}`);
    for (const [j, b] of bs.entries()) svc.push(`\tchain ep_${i}_${j} {\n\t\tmeta l4proto tcp dnat to ${b}:8080\n\t}`);
    elements += 1 + bs.length;
  }
  lines.push(`\tmap services {\n\t\ttype ipv4_addr . inet_service : verdict\n\t\telements = { ${vmap.join(',\n\t\t\t')} }\n\t}`);
  lines.push(...svc);
  lines.push('\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tip daddr . tcp dport vmap @services\n\t}');
  lines.push('}');
  const bs = backendsOf(1);
  const last = bs.length - 1;
  const other = BACKENDS.find((b) => !bs.includes(b))!;
  const swap = (from: string, to: string, backend: string): string => [
    `add chain ip kp ${to}`,
    `add rule ip kp ${to} meta l4proto tcp dnat to ${backend}:8080`,
    `delete element ip kp svc_1_eps { ${last} }`,
    `add element ip kp svc_1_eps { ${last} : goto ${to} }`,
    `flush chain ip kp ${from}`,
    `delete chain ip kp ${from}`,
  ].join('\n');
  return {
    full: `table ip kp\ndelete table ip kp\n${lines.join('\n')}\n`,
    delta: `${swap(`ep_1_${last}`, `ep_1_${last}x`, other)}\n`,
    undo: `${swap(`ep_1_${last}x`, `ep_1_${last}`, bs[last]!)}\n`,
    elements,
  };
}

/** Wall µs and children's CPU ms from the script timedNft runs (pure): its last lines are the µs and the shell's `times` (the shell's, then its children's). */
export function parseTimed(out: string): { wallMs: number; cpuMs: number } {
  const lines = out.trim().split('\n');
  const us = Number(lines.at(-3));
  const secs = (s: string): number => { const m = /^(\d+)m([\d.]+)s$/.exec(s); return m ? Number(m[1]) * 60 + Number(m[2]) : NaN; };
  const [u, s] = (lines.at(-1) ?? '').trim().split(/\s+/);
  return { wallMs: us / 1000, cpuMs: Math.round((secs(u ?? '') + secs(s ?? '')) * 1e6) / 1000 };
}

/**
 * Each scrape's CPU and its control (pure): the rise of the counter from
 * `leadMs` before its request was sent to `tailMs` after its answer ended
 * (a loaded machine stretches a scrape over hundreds of ms: a window of
 * fixed length would cut it), less the rise over a window of the same
 * length ending `gapMs` before that one opens, where no scrape falls; and
 * that control less the idle rate (how far the idle work alone spreads
 * over such a window). A control that would reach back into the previous
 * scrape's window, or before the first sample, is NaN, and so is that
 * scrape's reading.
 */
export function scrapeWindows(samples: readonly { t: number; cpuMs: number }[], scrapes: readonly { sent: number; done: number }[], o: { leadMs: number; tailMs: number; gapMs: number; idleRate: number }): { cpuMs: number[]; controlCpuMs: number[]; windowMs: number[] } {
  const cpuMs: number[] = [];
  const controlCpuMs: number[] = [];
  const windowMs: number[] = [];
  let prevEnd = samples[0]?.t ?? Infinity;
  for (const { sent, done } of scrapes) {
    const from = sent - o.leadMs;
    const to = done + o.tailMs;
    const len = to - from;
    const c = from - o.gapMs - len;
    const own = cpuBetween(samples, from, to);
    const control = c >= prevEnd ? cpuBetween(samples, c, c + len) : NaN;
    cpuMs.push(round(own - control, 2));
    controlCpuMs.push(round(control - o.idleRate * len, 2));
    windowMs.push(len);
    prevEnd = to;
  }
  return { cpuMs, controlCpuMs, windowMs };
}

/** The mean of the finite values; NaN when there are none (pure). */
export function meanOf(xs: readonly number[]): number {
  const f = xs.filter((x) => Number.isFinite(x));
  return f.length ? f.reduce((a, b) => a + b, 0) / f.length : NaN;
}

/** Median and spread (lowest, highest) of readings (pure). */
export function spreadOf(xs: readonly number[]): { median: number; low: number; high: number } {
  const f = xs.filter((x) => Number.isFinite(x));
  return { median: median(f), low: f.length ? Math.min(...f) : NaN, high: f.length ? Math.max(...f) : NaN };
}

/** CPU of an event: the counter's rise between two instants (linear between samples), less the idle rate over them (pure). */
export function cpuBetween(samples: readonly { t: number; cpuMs: number }[], from: number, to: number): number {
  const at = (t: number): number => {
    let prev = samples[0];
    for (const s of samples) {
      if (s.t >= t) {
        if (!prev || prev.t === s.t) return s.cpuMs;
        return prev.cpuMs + ((s.cpuMs - prev.cpuMs) * (t - prev.t)) / (s.t - prev.t);
      }
      prev = s;
    }
    return NaN;
  };
  return at(to) - at(from);
}

export interface ScaleRun {
  services: number;
  backends: number;
  /** `lb-agent run` to every service ready with every backend up (ms). */
  readyMs: number;
  rssMiB: number;
  /** VmRSS after SPACED_SCRAPES scrapes, each its own gather (absent from runs before it was measured). */
  rssAfterScrapesMiB?: number;
  /** The RSS_READINGS readings 1 s apart whose median rssMiB and rssAfterScrapesMiB are (absent from runs with one reading). */
  rssReadingsMiB?: number[];
  rssAfterScrapesReadingsMiB?: number[];
  /** Open file descriptors once settled, and of them packet sockets. */
  descriptors: number;
  packetSockets: number;
  idleWindowSeconds: number;
  idleCpuMs: number;
  idleCpuPercent: number;
  nftLines: number;
  /** Per reload and per transition: the agent's CPU less the idle rate (ms). */
  reloadCpuMs: number[];
  reloadWallMs: number[];
  /** Per reload, a window of its length ending 100 ms before its signal, less the idle rate: no event (absent from runs before it was measured). */
  reloadControlCpuMs?: number[];
  transitionCpuMs: number[];
  transitionKinds: string[];
  /** The same window 1 s before each transition's line, less the idle rate: no event (absent from runs before it was measured). */
  transitionControlCpuMs?: number[];
  /** Each transition over 1 s from its line, as runs before EVENT_TAIL_MS counted it. */
  transition1sCpuMs?: number[];
  /** CPU over the spaced scrapes' span less the idle rate, divided by the scrapes answered. */
  scrapeCpuMs: number;
  /** Per spaced scrape: its own window less its control window (absent from runs before it was measured). */
  scrapeWindowCpuMs?: number[];
  /** Per spaced scrape: its control window less the idle rate. */
  scrapeControlCpuMs?: number[];
  /** Per spaced scrape: its window's length (ms), from before the send to after the answer. */
  scrapeWindowMs?: number[];
  scrapes: number;
  metricsBytes: number;
  metricsBytesPerService: number;
  burst: { rate: number; seconds: number; sent: number; ok: number; failed: number; p50Ms: number; p99Ms: number; errors: string[] };
  statusCliMs: number[];
  /** `node -e 0` run the way the status CLI is, in the same rounds: what any Node process costs before its first line runs (absent from runs before it was measured). */
  nodeStartMs?: number[];
  statusRequestMs: number[];
  /** `curl --unix-socket SOCKET http://lb-agent/status`, run the way the status CLI is, in the same rounds: the floor of a client that is not Node (absent from runs before it was measured). */
  statusCurlMs?: number[];
  statusBytes: number;
  stopMs: number;
  stopKilled: boolean;
  reference: { lines: number; elements: number; fullWallMs: number[]; fullCpuMs: number[]; deltaWallMs: number[]; deltaCpuMs: number[] };
  error?: string;
}

export interface ScaleSummaryRow {
  services: number; backends: number; readyMs: number; rssMiB: number; rssAfterScrapesMiB: number; descriptors: number; packetSockets: number; idleCpuPercent: number; nftLines: number;
  reloadCpuMs: number; transitionCpuMs: number; scrapeCpuMs: number;
  /** Quartiles of the reloads' and the transitions' CPU: how far one run's events spread. */
  reloadCpuP25Ms: number; reloadCpuP75Ms: number; transitionCpuP25Ms: number; transitionCpuP75Ms: number; metricsBytesPerService: number; metricsBytes: number;
  /** Spread of the RSS readings (lowest, highest); NaN for runs with one reading. */
  rssLowMiB: number; rssHighMiB: number; rssAfterScrapesLowMiB: number; rssAfterScrapesHighMiB: number;
  /** The reloads' controls (median, quartiles) and each reload less its own control (median, quartiles). */
  reloadControlCpuMs: number; reloadControlP25Ms: number; reloadControlP75Ms: number; reloadNetCpuMs: number; reloadNetP25Ms: number; reloadNetP75Ms: number;
  /** Each scrape's own window less its control: median and quartiles; the controls less the idle rate: median and quartiles. */
  scrapeWindowCpuMs: number; scrapeWindowP25Ms: number; scrapeWindowP75Ms: number; scrapeControlCpuMs: number; scrapeControlP25Ms: number; scrapeControlP75Ms: number;
  /** The mean of the scrapes' windows less their controls: a scrape that finds the data path's counters due pays their read, one in four at 1.25 s apart. */
  scrapeWindowMeanMs: number;
  burstFailed: number; burstSent: number; burstP99Ms: number;
  statusCliMs: number; nodeStartMs: number; statusRequestMs: number; statusCurlMs: number; statusBytes: number; stopMs: number;
  refLines: number; refDeltaWallMs: number; refDeltaCpuMs: number; refFullWallMs: number; refFullCpuMs: number;
}

/** Medians of each size's run (pure). */
export function summarizeScale(runs: readonly ScaleRun[]): ScaleSummaryRow[] {
  const m = (xs: readonly number[]): number => round(median([...xs]), 1);
  const q = (xs: readonly number[] | undefined, p: number): number => round(percentile(xs ?? [], p), 1);
  return runs.filter((r) => r.error === undefined).map((r) => {
    const rss = spreadOf(r.rssReadingsMiB ?? []);
    const after = spreadOf(r.rssAfterScrapesReadingsMiB ?? []);
    const net = (r.reloadControlCpuMs ?? []).map((c, i) => (r.reloadCpuMs[i] ?? NaN) - c);
    return {
    services: r.services, backends: r.backends, readyMs: r.readyMs, rssMiB: round(r.rssMiB, 1), rssAfterScrapesMiB: round(r.rssAfterScrapesMiB ?? NaN, 1), descriptors: r.descriptors, packetSockets: r.packetSockets, idleCpuPercent: round(r.idleCpuPercent, 2), nftLines: r.nftLines,
    reloadCpuMs: m(r.reloadCpuMs), transitionCpuMs: m(r.transitionCpuMs), scrapeCpuMs: round(r.scrapeCpuMs, 1),
    reloadCpuP25Ms: round(percentile(r.reloadCpuMs, 0.25), 1), reloadCpuP75Ms: round(percentile(r.reloadCpuMs, 0.75), 1),
    transitionCpuP25Ms: round(percentile(r.transitionCpuMs, 0.25), 1), transitionCpuP75Ms: round(percentile(r.transitionCpuMs, 0.75), 1),
    metricsBytesPerService: Math.round(r.metricsBytesPerService), metricsBytes: r.metricsBytes,
    burstFailed: r.burst.failed, burstSent: r.burst.sent, burstP99Ms: r.burst.p99Ms,
    statusCliMs: m(r.statusCliMs), nodeStartMs: m(r.nodeStartMs ?? []), statusRequestMs: m(r.statusRequestMs), statusCurlMs: m(r.statusCurlMs ?? []), statusBytes: r.statusBytes, stopMs: r.stopMs,
    refLines: r.reference.lines, refDeltaWallMs: m(r.reference.deltaWallMs), refDeltaCpuMs: m(r.reference.deltaCpuMs),
    refFullWallMs: m(r.reference.fullWallMs), refFullCpuMs: m(r.reference.fullCpuMs),
    rssLowMiB: round(rss.low, 1), rssHighMiB: round(rss.high, 1), rssAfterScrapesLowMiB: round(after.low, 1), rssAfterScrapesHighMiB: round(after.high, 1),
    reloadControlCpuMs: m(r.reloadControlCpuMs ?? []), reloadControlP25Ms: q(r.reloadControlCpuMs, 0.25), reloadControlP75Ms: q(r.reloadControlCpuMs, 0.75),
    reloadNetCpuMs: m(net), reloadNetP25Ms: q(net, 0.25), reloadNetP75Ms: q(net, 0.75),
    scrapeWindowMeanMs: round(meanOf(r.scrapeWindowCpuMs ?? []), 1), scrapeWindowCpuMs: m(r.scrapeWindowCpuMs ?? []), scrapeWindowP25Ms: q(r.scrapeWindowCpuMs, 0.25), scrapeWindowP75Ms: q(r.scrapeWindowCpuMs, 0.75),
    scrapeControlCpuMs: m(r.scrapeControlCpuMs ?? []), scrapeControlP25Ms: q(r.scrapeControlCpuMs, 0.25), scrapeControlP75Ms: q(r.scrapeControlCpuMs, 0.75),
    };
  });
}

/** The kernel path's engine the agent runs with (config `kernel.engine`); unset: the config's default. */
export type ScaleEngine = 'auto' | 'nft' | 'ebpf';

export interface ScaleOptions {
  sizes: readonly number[];
  engine?: ScaleEngine | undefined;
  rounds: number;
  idleSeconds: number;
  log: (msg: string) => void;
}

export interface ScaleResult {
  config: { sizes: number[]; engine: string; rounds: number; idleSeconds: number; healthCheck: string; nodeOptions: string; scrapeSpacingMs: number; spacedScrapes: number; burst: string };
  summary: ScaleSummaryRow[];
  raw: ScaleRun[];
  errors: string[];
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const msg = (e: unknown): string => String((e as Error).message ?? e).replace(/\s+/g, ' ').slice(0, 300);
const SCRAPE_SPACING_MS = 1250;
/** The idle window opens this long after the start settled (the RSS is read at 5 s). */
const IDLE_AFTER_SETTLED_MS = 20_000;
/** Scrapes spaced past the reuse of a gather, before the RSS after scrapes is read. */
export const SPACED_SCRAPES = 20;
const BURST = { rate: 50, seconds: 10, timeoutMs: 2000 };

/**
 * A scraper run in the monitoring namespace: `count` GETs of url, one every
 * `intervalMs` whether or not the previous one answered (as Prometheus'
 * targets would be scraped), each on a new connection: sent, ok, failed,
 * latencies, the last body's length, when each was sent (Date.now(): the
 * bench's clock too).
 */
function scraperScript(url: string, count: number, intervalMs: number, timeoutMs: number): string {
  return `const h=require('http');const lat=[];let ok=0,failed=0,bytes=0;const errs=new Set();let done=0;
const sentAt=[],doneAt=[];const one=()=>{const k=sentAt.length;sentAt.push(Date.now());doneAt.push(NaN);const t=process.hrtime.bigint();const end=()=>{doneAt[k]=Date.now()};const r=h.get(${JSON.stringify(url)},{agent:false,timeout:${timeoutMs}},(s)=>{let n=0;s.on('data',d=>n+=d.length);s.on('end',()=>{end();if(s.statusCode===200){ok++;bytes=n;lat.push(Number(process.hrtime.bigint()-t)/1e6)}else{failed++;errs.add('HTTP '+s.statusCode)}fin()});s.on('error',e=>{end();failed++;errs.add(e.code||e.message);fin()})});
r.on('timeout',()=>r.destroy(new Error('timeout')));r.on('error',e=>{end();failed++;errs.add(e.code||e.message);fin()})};
const fin=()=>{if(++done===${count}){lat.sort((a,b)=>a-b);const q=(p)=>lat.length?lat[Math.min(lat.length-1,Math.floor(p*lat.length))]:NaN;process.stdout.write(JSON.stringify({sent:${count},ok,failed,p50Ms:q(0.5),p99Ms:q(0.99),bytes,sentAt,doneAt,errors:[...errs].slice(0,5)}))}};
let i=0;const tick=()=>{one();if(++i<${count})setTimeout(tick,${intervalMs}-((Date.now()-t0)%${intervalMs}))};const t0=Date.now();tick();`;
}

interface ScrapeResult { sent: number; ok: number; failed: number; p50Ms: number; p99Ms: number; bytes: number; sentAt: number[]; doneAt: number[]; errors: string[] }

async function scrapes(lab: Lab, mon: string, count: number, intervalMs: number, timeoutMs: number): Promise<ScrapeResult> {
  const r = await lab.exec(mon, process.execPath, ['-e', scraperScript(`http://${METRICS_LISTEN}/metrics`, count, intervalMs, timeoutMs)], { allowFail: true, timeoutMs: count * intervalMs + timeoutMs + 15_000 });
  try { return JSON.parse(r.stdout) as ScrapeResult; } catch { return { sent: count, ok: 0, failed: count, p50Ms: NaN, p99Ms: NaN, bytes: 0, sentAt: [], doneAt: [], errors: [r.stderr.trim().slice(0, 200) || 'no output'] }; }
}

/**
 * `nft -f` of each file in turn, `times` over: wall and CPU of one nft
 * process (the CPU of reaped children, which the kernel counts in 10 ms
 * ticks: many runs make one number). Each is its own transaction.
 */
async function timedNft(lab: Lab, ns: string, files: readonly string[], times: number): Promise<{ wallMs: number; cpuMs: number }> {
  const each = files.map((f) => `nft -f ${f} || exit 1`).join('; ');
  const r = await lab.sh(ns, `s=$(date +%s%N); for i in $(seq ${times}); do ${each}; done; e=$(date +%s%N); echo $(( (e - s) / 1000 )); times`, { timeoutMs: 300_000 });
  const t = parseTimed(r.stdout);
  const runs = files.length * times;
  return { wallMs: t.wallMs / runs, cpuMs: t.cpuMs / runs };
}

/** CPU samples of the agent every everyMs until stop() (for events located afterwards by their log line or send time). */
function cpuSampler(pid: number | undefined, everyMs = 50): { samples: { t: number; cpuMs: number }[]; stop(): void } {
  const samples: { t: number; cpuMs: number }[] = [];
  const take = (): void => { samples.push({ t: Date.now(), cpuMs: cpuFineWithChildrenMs(pid) }); };
  take();
  const timer = setInterval(take, everyMs);
  return { samples, stop: () => { clearInterval(timer); take(); } };
}

/** RSS_READINGS readings of VmRSS 1 s apart (MiB). */
async function rssReadings(pid: number | undefined): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < RSS_READINGS; i++) {
    if (i > 0) await sleep(1000);
    out.push(round((memoryOf(pid)?.rssKiB ?? NaN) / 1024, 1));
  }
  return out;
}

async function reference(lab: Lab, n: number, rounds: number): Promise<ScaleRun['reference']> {
  const ns = await lab.addHost('ref');
  const t = referenceTables(n);
  const full = lab.file(`ref-${n}.nft`);
  const delta = lab.file(`ref-${n}-delta.nft`);
  const undo = lab.file(`ref-${n}-undo.nft`);
  fs.writeFileSync(full, t.full);
  fs.writeFileSync(delta, t.delta);
  fs.writeFileSync(undo, t.undo);
  const out: ScaleRun['reference'] = { lines: 0, elements: t.elements, fullWallMs: [], fullCpuMs: [], deltaWallMs: [], deltaCpuMs: [] };
  // Enough runs that 10 ms ticks make a number, bounded for the big tables.
  const fullRuns = Math.max(3, Math.min(20, Math.round(2000 / n)));
  for (let i = 0; i < rounds; i++) {
    const f = await timedNft(lab, ns, [full], fullRuns);
    out.fullWallMs.push(round(f.wallMs, 2));
    out.fullCpuMs.push(round(f.cpuMs, 1));
    const d = await timedNft(lab, ns, [delta, undo], 25);
    out.deltaWallMs.push(round(d.wallMs, 2));
    out.deltaCpuMs.push(round(d.cpuMs, 1));
  }
  out.lines = Number((await lab.sh(ns, 'nft list ruleset | wc -l')).stdout.trim());
  await lab.sh(ns, 'nft delete table ip kp', { allowFail: true });
  return out;
}

/** SIGUSR2 to an agent run with --heapsnapshot-signal: the new snapshot's path once written (the agent answers status again). */
async function heapSnapshot(a: AgentHandle, dir: string): Promise<string> {
  const before = new Set(fs.readdirSync(dir));
  a.signal('SIGUSR2');
  const deadline = Date.now() + 120_000;
  for (;;) {
    const made = fs.readdirSync(dir).find((f) => f.endsWith('.heapsnapshot') && !before.has(f));
    if (made !== undefined) {
      // Written on the agent's main thread: it answers again once done.
      for (;;) {
        try { await a.status(); return path.join(dir, made); } catch (err) { if (Date.now() > deadline) throw err; }
      }
    }
    if (Date.now() > deadline) throw new Error(`no heap snapshot in ${dir} 120 s after SIGUSR2`);
    await sleep(200);
  }
}

async function measureSize(n: number, o: ScaleOptions): Promise<ScaleRun> {
  const lab = await Lab.create();
  const log = (s: string): void => o.log(`${n} services: ${s}`);
  const backends: Backend[] = [];
  let agent: AgentHandle | undefined;
  try {
    const node = await lab.addHost('node', { address: `${NODE}/20` });
    const mon = await lab.addHost('mon', { address: `${MON}/20` });
    for (const [i, a] of BACKENDS.entries()) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${a}/20` });
      backends.push(await startBackend(lab, ns, `b${i + 1}`));
    }
    // Service s0's backends (b1, b2) also listen on its port; b1's is the listener stopped for the transition.
    let lone = await startBackend(lab, lab.ns('b1'), 'b1-lone', [LONE_PORT]);
    backends.push(await startBackend(lab, lab.ns('b2'), 'b2-lone', [LONE_PORT]));
    const backendCount = Array.from({ length: n }, (_, i) => backendsOf(i).length).reduce((s, x) => s + x, 0);
    const t0 = Date.now();
    // LB_BENCH_CPU_PROF=DIR: the agent writes a V8 CPU profile there when it
    // exits (node --cpu-prof, which NODE_OPTIONS may not carry).
    const prof = process.env['LB_BENCH_CPU_PROF'];
    // LB_BENCH_HEAP_SNAPSHOT=DIR: the agent writes a V8 heap snapshot there
    // on SIGUSR2 (node --heapsnapshot-signal), sent once the settled RSS is
    // read and once the RSS after the scrapes is read. Writing one costs
    // seconds of CPU and a copy of the heap: the numbers read after the
    // first one (idle, reload, transition, scrapes) are not the agent's.
    const heapDir = process.env['LB_BENCH_HEAP_SNAPSHOT'];
    const flags = [...(prof ? [`--cpu-prof --cpu-prof-dir=${prof}`] : []), ...(heapDir ? [`--heapsnapshot-signal=SIGUSR2 --diagnostic-dir=${heapDir}`] : [])];
    const profiled = flags.length > 0 ? { command: ['sh', '-c', `exec "$0" ${flags.join(' ')} "$@"`] } : {};
    agent = await runAgent(lab, node, scaleConfig(n, false, o.engine), { name: `scale-${n}`, ...profiled });
    const a = agent;
    const pid = a.proc.pid;
    await waitStatus(a, `${n} services ready with every backend up`, (s) => s.services.length === n && s.services.every((x) => x.ready && x.healthyBackends === x.backends.length), 300_000);
    const readyMs = Date.now() - t0;
    log(`ready in ${readyMs} ms`);
    // The start's tail behind it: every service can be ready before the
    // last VIP's ARP probe is done, and the settling that follows (one
    // compacting collection, the code cache written, the optimizing
    // compiler back on) is the start's work, not the steady state's.
    await a.waitLog('the start settled', (l) => l.op === 'settled', 120_000);
    const settledAt = Date.now();
    await sleep(5000);
    const rssReadingsMiB = await rssReadings(pid);
    const rssMiB = median(rssReadingsMiB);
    const fds = descriptorsOf(pid);
    if (heapDir) log(`heap snapshot ${await heapSnapshot(a, heapDir)}`);
    // V8's memory reducer is the start's too: about 8 s after the
    // allocation rate falls it runs up to three compacting collections
    // (at 1,000 services some 400 ms of marking in all, in a second or
    // two), which an idle window opened earlier may or may not hold.
    await sleep(Math.max(0, settledAt + IDLE_AFTER_SETTLED_MS - Date.now()));
    const c0 = cpuFineWithChildrenMs(pid);
    const i0 = Date.now();
    await sleep(o.idleSeconds * 1000);
    const idleCpuMs = cpuFineWithChildrenMs(pid) - c0;
    const idleRate = idleCpuMs / (Date.now() - i0);
    const idleCpuPercent = idleRate * 100;
    const nftLines = Number((await lab.sh(node, 'nft list ruleset | wc -l')).stdout.trim());
    log(`RSS ${rssMiB.toFixed(1)} MiB (${rssReadingsMiB.map((x) => x.toFixed(1)).join(', ')}), ${fds.total} descriptors (${fds.packet} packet sockets), idle ${idleCpuPercent.toFixed(2)}% of a core, ${nftLines} nft lines`);

    // Reloads: s1's last backend swapped, then back.
    const reloadCpuMs: number[] = [];
    const reloadWallMs: number[] = [];
    const reloadControlCpuMs: number[] = [];
    for (let r = 0; r < Math.max(RELOADS, o.rounds * 2); r++) {
      const before = (await a.status()).config.generation;
      a.writeConfig(scaleConfig(n, r % 2 === 0, o.engine));
      const logsBefore = a.logs.length;
      const s = cpuSampler(pid);
      // The control window lies in this second, before the signal.
      await sleep(1000);
      const t = Date.now();
      a.signal('SIGHUP');
      // Told by the reload's log line, not by polling status: a status
      // request at 1,000 services costs the agent more than the reload.
      const line = await a.waitLog('reload logged', (l) => a.logs.indexOf(l) >= logsBefore && l.op === 'reload' && l.added !== undefined, 60_000);
      const applied = logTime(line);
      await sleep(Math.max(0, applied + EVENT_TAIL_MS - Date.now()) + 100);
      s.stop();
      if ((await a.status()).config.generation <= before) throw new Error('the reload was logged but not applied');
      const len = applied + EVENT_TAIL_MS - t;
      const raw = cpuBetween(s.samples, t, applied + EVENT_TAIL_MS);
      reloadCpuMs.push(round(raw - idleRate * len, 1));
      const c = t - 100 - len;
      reloadControlCpuMs.push(c >= s.samples[0]!.t ? round(cpuBetween(s.samples, c, c + len) - idleRate * len, 1) : NaN);
      reloadWallMs.push(applied - t);
    }
    log(`reload of one backend: ${reloadCpuMs.join(', ')} ms of CPU over idle; the same length before each: ${reloadControlCpuMs.join(', ')}`);

    // Health transitions: s0's backend b1 down (its listener stopped), then up again.
    const transitionCpuMs: number[] = [];
    const transitionKinds: string[] = [];
    const transitionControlCpuMs: number[] = [];
    const transition1sCpuMs: number[] = [];
    for (let r = 0; r < o.rounds; r++) {
      for (const to of ['down', 'up'] as const) {
        const logsBefore = a.logs.length;
        const s = cpuSampler(pid);
        if (to === 'down') await lone.stop();
        else lone = await startBackend(lab, lab.ns('b1'), 'b1-lone', [LONE_PORT]);
        const line = await a.waitLog(`s0's backend ${to}`, (l) => a.logs.indexOf(l) >= logsBefore && l.op === 'transition' && l.to === to && String(l.service).endsWith('/s0') && String(l.backend).startsWith(`${BACKENDS[0]}:`), 40_000);
        const at = logTime(line);
        await sleep(Math.max(0, at + 1000 - Date.now()) + 100);
        s.stop();
        const over = (from: number, ms: number): number => round(cpuBetween(s.samples, from, from + ms) - idleRate * ms, 1);
        transitionCpuMs.push(over(at, EVENT_TAIL_MS));
        transition1sCpuMs.push(over(at, 1000));
        // The sampler began when the listener was stopped or started, at least 1 s before the line for a down (three failed probes) but not always for an up.
        transitionControlCpuMs.push(at - 1000 - EVENT_TAIL_MS >= s.samples[0]!.t ? over(at - 1000 - EVENT_TAIL_MS, EVENT_TAIL_MS) : NaN);
        transitionKinds.push(to);
        await sleep(500);
      }
    }
    log(`health transitions: ${transitionCpuMs.join(', ')} ms of CPU over idle in ${EVENT_TAIL_MS} ms (${transitionKinds.join(', ')}); the same window 1 s before: ${transitionControlCpuMs.join(', ')}; over 1 s: ${transition1sCpuMs.join(', ')}`);

    // Scrapes, spaced past the endpoint's reuse of a gather.
    const count = SPACED_SCRAPES;
    const sc0 = cpuFineWithChildrenMs(pid);
    const st0 = Date.now();
    const ss = cpuSampler(pid, 25);
    const spaced = await scrapes(lab, mon, count, SCRAPE_SPACING_MS, 5000);
    const scrapeCpuMs = (cpuFineWithChildrenMs(pid) - sc0 - idleRate * (Date.now() - st0)) / Math.max(1, spaced.ok);
    ss.stop();
    const own = scrapeWindows(ss.samples, spaced.sentAt.map((sent, k) => ({ sent, done: spaced.doneAt[k] ?? NaN })), { leadMs: SCRAPE_LEAD_MS, tailMs: SCRAPE_TAIL_MS, gapMs: SCRAPE_CONTROL_GAP_MS, idleRate });
    const body = spaced.bytes;
    const rssAfterScrapesReadingsMiB = await rssReadings(pid);
    const rssAfterScrapesMiB = median(rssAfterScrapesReadingsMiB);
    if (heapDir) log(`heap snapshot after the scrapes ${await heapSnapshot(a, heapDir)}`);
    log(`/metrics: ${body} bytes (${(body / n).toFixed(0)} a service), ${scrapeCpuMs.toFixed(1)} ms of CPU a scrape over the span (${spaced.ok}/${spaced.sent} ok); each in its window less its control: ${own.cpuMs.join(', ')}; the controls less idle: ${own.controlCpuMs.join(', ')}; windows ${own.windowMs.join(', ')} ms; RSS ${rssAfterScrapesMiB.toFixed(1)} MiB after them (${rssAfterScrapesReadingsMiB.map((x) => x.toFixed(1)).join(', ')})`);
    const b = await scrapes(lab, mon, BURST.rate * BURST.seconds, 1000 / BURST.rate, BURST.timeoutMs);
    const burst = { rate: BURST.rate, seconds: BURST.seconds, sent: b.sent, ok: b.ok, failed: b.failed, p50Ms: round(b.p50Ms, 1), p99Ms: round(b.p99Ms, 1), errors: b.errors };
    log(`${BURST.rate} scrapes/s for ${BURST.seconds} s: ${b.failed} of ${b.sent} failed, p99 ${b.p99Ms.toFixed(1)} ms`);

    // status --json: a process, and the request alone; curl over the socket's HTTP view, the same bytes.
    const statusCliMs: number[] = [];
    const nodeStartMs: number[] = [];
    const statusRequestMs: number[] = [];
    const statusCurlMs: number[] = [];
    let statusBytes = 0;
    for (let r = 0; r < o.rounds; r++) {
      const n0 = Date.now();
      await lab.exec(node, process.execPath, ['-e', '0']);
      nodeStartMs.push(Date.now() - n0);
      const c0 = Date.now();
      const viaCurl = await lab.exec(node, 'curl', ['-fsS', '--max-time', '10', '--unix-socket', a.socket, 'http://lb-agent/status']);
      statusCurlMs.push(Date.now() - c0);
      const t = Date.now();
      const c = await agentCli(lab, node, ['status', '--json', '--socket', a.socket]);
      statusCliMs.push(Date.now() - t);
      if (c.code !== 0) throw new Error(`lb-agent status --json exited ${c.code}: ${c.stderr.trim().slice(0, 200)}`);
      statusBytes = Buffer.byteLength(c.stdout);
      if (Buffer.byteLength(viaCurl.stdout) !== statusBytes) throw new Error(`curl got ${Buffer.byteLength(viaCurl.stdout)} bytes of status, lb-agent status --json ${statusBytes}`);
      // The agent's answer as the CLI takes it: streamed, never parsed here.
      const q = performance.now();
      await controlStream(a.socket, 'status', () => undefined, 10_000);
      statusRequestMs.push(round(performance.now() - q, 1));
    }
    log(`status --json ${statusCliMs.join(', ')} ms (node -e 0 ${nodeStartMs.join(', ')} ms; curl ${statusCurlMs.join(', ')} ms; request alone ${statusRequestMs.join(', ')} ms), ${statusBytes} bytes`);

    const ts = Date.now();
    const stopped = await stopAgent(a, 60_000);
    const stopMs = Date.now() - ts;
    agent = undefined;
    log(`stop ${stopMs} ms${stopped.killed ? ' (killed)' : ''}`);

    const ref = await reference(lab, n, o.rounds);
    log(`reference: full table ${ref.fullWallMs.join(', ')} ms, delta of one backend ${ref.deltaWallMs.join(', ')} ms wall, ${ref.deltaCpuMs.join(', ')} ms CPU (${ref.lines} lines)`);
    return {
      services: n, backends: backendCount, readyMs, rssMiB, rssAfterScrapesMiB, rssReadingsMiB, rssAfterScrapesReadingsMiB, descriptors: fds.total, packetSockets: fds.packet, idleWindowSeconds: o.idleSeconds, idleCpuMs, idleCpuPercent, nftLines,
      reloadCpuMs, reloadWallMs, reloadControlCpuMs, transitionCpuMs, transitionKinds, transitionControlCpuMs, transition1sCpuMs, scrapeCpuMs, scrapeWindowCpuMs: own.cpuMs, scrapeControlCpuMs: own.controlCpuMs, scrapeWindowMs: own.windowMs, scrapes: spaced.ok, metricsBytes: body, metricsBytesPerService: body / n,
      burst, statusCliMs, nodeStartMs, statusRequestMs, statusCurlMs, statusBytes, stopMs, stopKilled: stopped.killed, reference: ref,
    };
  } finally {
    if (agent) await stopAgent(agent);
    for (const b of backends) await b.stop();
    await lab.destroy();
  }
}

export async function benchScale(o: ScaleOptions): Promise<ScaleResult> {
  const raw: ScaleRun[] = [];
  const errors: string[] = [];
  for (const n of o.sizes) {
    try {
      raw.push(await measureSize(n, o));
    } catch (e) {
      errors.push(`${n} services: ${msg(e)}`);
      o.log(`${n} services: ${msg(e)}`);
    }
  }
  return {
    config: {
      sizes: [...o.sizes], engine: o.engine ?? 'the default', rounds: o.rounds, idleSeconds: o.idleSeconds,
      healthCheck: 'defaults (TCP, period 5 s, timeout 3 s, failure threshold 3)',
      nodeOptions: unitEnvironment().NODE_OPTIONS ?? '',
      scrapeSpacingMs: SCRAPE_SPACING_MS,
      spacedScrapes: SPACED_SCRAPES,
      burst: `${BURST.rate} scrapes/s for ${BURST.seconds} s, a new connection each, ${BURST.timeoutMs} ms deadline`,
    },
    summary: summarizeScale(raw),
    raw,
    errors,
  };
}
