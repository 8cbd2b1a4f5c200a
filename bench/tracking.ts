// The tracking area: ownership that follows health, the agent against
// keepalived's track_interface and track_script, like for like. One
// throwaway lab (lab/tracking.ts: VMs with a management NIC for VRRP and a
// VM-network NIC for the VIP, backends and client), and side by side in
// the same run:
//   agent       two agents (n3 200 Master, n2 150), advertInterval 0.1,
//               eth1 tracked without a weight (fault), the service tracked
//               with weight 60 below one healthy backend, with keepalived's
//               script settings: a TCP check of each backend every 1 s
//               (timeout 0.2 s), down on the first failure and up on the
//               first success, no hold of its own (failAfter and
//               recoverAfter 0);
//   keepalived  two keepalived (VRRPv3, 200 and 150, advert_int 0.1) with
//               `track_interface { eth1 }` and a `track_script` that
//               connects to the backends (0.2 s each; interval 1, fall 1,
//               rise 1, weight -60), an HTTP server on :80 in each namespace.
// Both sides probe once a second and act on the first failure. The cut of
// reach is placed in each side's own probe cycle: tcpdump in backend b1's
// namespace sees each side's checks arrive (their SYNs, by source address),
// and run i of n cuts (i + 0.5)/n of an interval after that side's last
// check of b1 (probePhaseMs, placeCut), the same points for both sides, so
// each side's line is its average over the cycle, not one random point of
// it. The agent checks b2 at a phase of its own; keepalived's script
// checks b2 right after b1.
// Two events on the Master, each followed by its repair and preemption back:
//   carrier   its VM-network NIC loses carrier (bridge port down);
//   service   it loses reach to every backend (unreachable routes).
// The event's time is read in the shell that makes it, just before. A
// client starts a request every 10 ms (300 ms deadline); we take the time
// from the event to the new Master's first answer. For the agent, its logs
// place the steps on the same clock: the old Master resigns (fault, or its
// priority lowered), the new one is VRRP Master, the VIP is bound.
// Medians over the runs, and agent/keepalived ratios. Only lab namespaces
// are addressed.
//
//   npm run bench -- --only tracking                  (an area of bench/run.ts)
//   node dist/bench/tracking.js [--runs 10]            (JSON on stdout)
import * as fs from 'node:fs';
import type { ChildProcess } from 'node:child_process';
import { waitFor, type Lab } from '../lab/netns';
import { startBackend } from '../lab/services';
import { startKeepalived, type Keepalived } from '../lab/keepalived';
import { buildTrackingLab, trackingConfig, vmNetAddress, VM_NET_VIP, VM_NET_BACKENDS, type TrackingLab, type TrackingNode, type TrackingOptions } from '../lab/tracking';
import { BACKEND_IDS } from '../lab/vrrp';
import { gapReport, ClientLoop } from '../lab/client-loop';
import { lastNumber, takeoverTimeline, type TakeoverTimeline } from './failover6';
import { loadAverage } from './lib/procfs';
import { median, ratio, round } from './lib/stats';

const KA_VIP = '10.98.0.201';
const KA = [{ role: 'ka1', ip: '10.99.0.41', priority: 200 }, { role: 'ka2', ip: '10.99.0.42', priority: 150 }] as const;
export const TRACKING_EVENTS = ['carrier', 'service'] as const;
export type TrackingEvent = (typeof TRACKING_EVENTS)[number];

/** The hysteresis both sides run with: keepalived's script settings, the agent's health check and track the same. */
export const LIKE_FOR_LIKE = { intervalS: 1, timeoutS: 0.2, fall: 1, rise: 1, weight: 60, advertInterval: 0.1 } as const;

/** The agent's side of LIKE_FOR_LIKE (lab/tracking.ts trackingConfig options). */
export function agentTracking(l: typeof LIKE_FOR_LIKE = LIKE_FOR_LIKE): TrackingOptions {
  return {
    advertInterval: l.advertInterval,
    track: {
      interfaces: [{ name: 'eth1' }],
      // keepalived's script succeeds while any backend answers: down below one healthy backend.
      services: [{ service: 'api', minHealthy: 1, weight: l.weight, failAfter: 0, recoverAfter: 0 }],
    },
    healthCheck: { periodSeconds: l.intervalS, timeoutSeconds: l.timeoutS, failureThreshold: l.fall, successThreshold: l.rise },
  };
}

/** keepalived's side: the vrrp_script block and the instance's track lines, and the script's body. */
export function keepalivedTracking(backends: readonly string[], scriptPath: string, l: typeof LIKE_FOR_LIKE = LIKE_FOR_LIKE): { preamble: string[]; instance: string[]; script: string } {
  return {
    preamble: ['vrrp_script reach {', `  script "${scriptPath}"`, `  interval ${l.intervalS}`, `  fall ${l.fall}`, `  rise ${l.rise}`, `  weight -${l.weight}`, '}'],
    instance: ['track_interface {', '  eth1', '}', 'track_script {', '  reach', '}'],
    // Can this VM still reach a backend? One TCP connect each, the agent's timeout.
    script: `#!/bin/bash\n${backends.map((b) => `timeout ${l.timeoutS} bash -c '</dev/tcp/${b}/8080' 2>/dev/null`).join(' || ')}\n`,
  };
}

/** The agent's steps, ms after the event: the old Master resigning (fault or priority) and the new one's takeover. */
export interface TrackingTimeline extends TakeoverTimeline { resignMs: number }

export interface TrackingRun {
  servedMs: number;
  failed: number;
  timeline?: TrackingTimeline;
  /** Reach: ms from a grid point of the side's checks of b1 to the cut, modulo the interval (where in its probe cycle the cut fell). */
  cycleMs?: number;
}

export interface TrackingSummary {
  event: TrackingEvent;
  agent: { runs: TrackingRun[]; medianServedMs: number; spreadMs: [number, number]; medianTimeline: TrackingTimeline };
  keepalived: { runs: TrackingRun[]; medianServedMs: number; spreadMs: [number, number] };
  /** agent / keepalived medians; below 1 the agent serves again sooner. */
  ratioServed: number;
}

export interface TrackingResult {
  config: { runs: number; likeForLike: typeof LIKE_FOR_LIKE; command: string };
  summary: TrackingSummary[];
  load: { before: number[]; after: number[] };
  errors: string[];
}

/** The old Master's first resignation at or after `at`: fault (carrier) or a lowered priority (service). */
export function resignMs(logs: readonly Record<string, unknown>[], at: number): number {
  for (const l of logs) {
    const t = typeof l.time === 'string' ? Date.parse(l.time) : NaN;
    if (t >= at && ((l.op === 'transition' && l.to === 'fault') || l.op === 'priority')) return t - at;
  }
  return NaN;
}

/** Medians and ratios per event (pure). */
export function summariseTracking(runs: Readonly<Record<TrackingEvent, { agent: readonly TrackingRun[]; keepalived: readonly TrackingRun[] }>>): TrackingSummary[] {
  return TRACKING_EVENTS.filter((ev) => runs[ev] !== undefined).map((event) => {
    const r = runs[event];
    const tl = r.agent.map((x) => x.timeline).filter((x): x is TrackingTimeline => x !== undefined);
    const a = median(r.agent.map((x) => x.servedMs));
    const k = median(r.keepalived.map((x) => x.servedMs));
    return {
      event,
      agent: {
        runs: [...r.agent], medianServedMs: a, spreadMs: spread(r.agent),
        medianTimeline: { resignMs: median(tl.map((x) => x.resignMs)), masterMs: median(tl.map((x) => x.masterMs)), takingMs: median(tl.map((x) => x.takingMs)), boundMs: median(tl.map((x) => x.boundMs)) },
      },
      keepalived: { runs: [...r.keepalived], medianServedMs: k, spreadMs: spread(r.keepalived) },
      ratioServed: round(ratio(a, k), 2),
    };
  });
}

/** The fastest and the slowest run (NaN, NaN when none measured). */
function spread(runs: readonly TrackingRun[]): [number, number] {
  const ok = runs.map((x) => x.servedMs).filter((x) => Number.isFinite(x));
  return ok.length === 0 ? [NaN, NaN] : [Math.min(...ok), Math.max(...ok)];
}

const cell = (x: number): string => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
const EVENT_TEXT: Record<TrackingEvent, string> = {
  carrier: 'carrier lost on the VM-network NIC (track_interface)',
  service: 'reach lost to every backend (tracked service / track_script)',
};

/** The area's table: one line per event, agent beside keepalived, and where the agent's time went. */
export function trackingTable(r: TrackingResult): string {
  const head = '| event | agent: first answer ms (spread) | keepalived: first answer ms (spread) | agent / keepalived | agent: old Master resigned ms | agent: new Master ms | agent: VIP bound ms | runs: agent; keepalived (ms, with the cut\'s place in the side\'s probe cycle @ms) |\n| --- | --: | --: | --: | --: | --: | --: | --- |';
  const runs = (rs: readonly TrackingRun[]): string => rs.map((x) => `${cell(x.servedMs)}${x.cycleMs !== undefined ? ` @${cell(x.cycleMs)}` : ''}`).join(', ');
  const med = (m: number, sp: [number, number]): string => `${cell(m)} (${cell(sp[0])}-${cell(sp[1])})`;
  const rows = r.summary.map((s) => `| ${EVENT_TEXT[s.event]} | ${med(s.agent.medianServedMs, s.agent.spreadMs)} | ${med(s.keepalived.medianServedMs, s.keepalived.spreadMs)} | ${Number.isFinite(s.ratioServed) ? `${s.ratioServed.toFixed(2)}x` : 'n/a'} | ${cell(s.agent.medianTimeline.resignMs)} | ${cell(s.agent.medianTimeline.masterMs)} | ${cell(s.agent.medianTimeline.boundMs)} | ${runs(s.agent.runs)}; ${runs(s.keepalived.runs)} |`);
  return [head, ...rows].join('\n');
}

/**
 * Where in its probe cycle run `i` of `runs` cuts reach, ms after the
 * side's last check: spread evenly over one probe interval, the same points
 * for both sides. Without it the sequence of a run (wait until serving,
 * start the client, cut) lands the cut wherever it happens to in each
 * side's cycle, and a few runs measure those points rather than the
 * average over the cycle.
 */
export function probePhaseMs(i: number, runs: number, intervalS: number = LIKE_FOR_LIKE.intervalS): number {
  return Math.round(((i + 0.5) / runs) * intervalS * 1000);
}

/**
 * When to cut (wall ms, pure): `phaseMs` after a check of the cycle that
 * began at `lastCheck`, the first such time at least `leadMs` after `now`.
 */
export function placeCut(lastCheck: number, phaseMs: number, intervalMs: number, now: number, leadMs: number): number {
  let at = lastCheck + phaseMs;
  if (at < now + leadMs) at += Math.ceil((now + leadMs - at) / intervalMs) * intervalMs;
  return at;
}

/** Where `at` fell in the cycle of checks that began at `lastCheck` (pure). */
export function cycleOffset(lastCheck: number, at: number, intervalMs: number): number {
  return (((at - lastCheck) % intervalMs) + intervalMs) % intervalMs;
}

/**
 * The SYNs of health checks arriving at a backend, by source address, as
 * tcpdump in its namespace sees them (-tt: epoch seconds, on the clock the
 * cut's `date` reads).
 */
export class CheckWatch {
  /** The last CHECKS_KEPT checks' times (wall ms) by source address. */
  private readonly last = new Map<string, number[]>();
  private buf = '';
  private constructor(private readonly proc: ChildProcess) {
    proc.stdout?.on('data', (d: Buffer) => {
      this.buf += d.toString();
      let nl: number;
      while ((nl = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        // "1765100000.123456 IP 10.98.0.4.41234 > 10.98.0.11.8080: Flags [S], ..."
        const m = /^(\d+\.\d+) IP (\d+\.\d+\.\d+\.\d+)\.\d+ > /.exec(line);
        if (m) {
          const times = this.last.get(m[2]!) ?? [];
          times.push(Number(m[1]) * 1000);
          if (times.length > CHECKS_KEPT) times.shift();
          this.last.set(m[2]!, times);
        }
      }
    });
  }

  static async start(lab: Lab, ns: string, port: number): Promise<CheckWatch> {
    const proc = lab.spawn(ns, 'tcpdump', ['-i', 'eth1', '-n', '-l', '-tt', '-Q', 'in', `tcp dst port ${port} and tcp[tcpflags] & (tcp-syn|tcp-ack) == tcp-syn`]);
    let err = '';
    proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
    await waitFor('tcpdump listening', () => /listening on/.test(err), 10_000);
    return new CheckWatch(proc);
  }

  /** The checks seen from the address of these that sent the latest one (wall ms, oldest first). */
  checksFrom(sources: readonly string[]): number[] {
    let best: number[] = [];
    for (const s of sources) {
      const t = this.last.get(s) ?? [];
      if (t.length > 0 && (best.length === 0 || t.at(-1)! > best.at(-1)!)) best = t;
    }
    return [...best];
  }

  stop(): void { this.proc.kill('SIGKILL'); }
}

/** Checks a CheckWatch keeps per source, for gridPoint. */
const CHECKS_KEPT = 6;

/**
 * A point of the grid a side checks on, from its last checks (pure): the
 * circular mean of their times modulo the interval, placed at the grid
 * point nearest the last check. The agent moves each check by up to 5% of
 * the interval around its grid point (jitter); the mean takes that out.
 */
export function gridPoint(checks: readonly number[], intervalMs: number): number {
  let x = 0;
  let y = 0;
  for (const c of checks) {
    const a = (2 * Math.PI * (((c % intervalMs) + intervalMs) % intervalMs)) / intervalMs;
    x += Math.cos(a);
    y += Math.sin(a);
  }
  const phase = ((Math.atan2(y, x) / (2 * Math.PI)) * intervalMs + intervalMs) % intervalMs;
  const last = checks.at(-1)!;
  const base = last - ((((last - phase) % intervalMs) + intervalMs) % intervalMs);
  return last - base > intervalMs / 2 ? base + intervalMs : base;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** How a run places its cut: at once after the client's warm-up (carrier), or at a point of the side's probe cycle (reach). */
type Placement = { kind: 'now' } | { kind: 'cycle'; watch: CheckWatch; sources: readonly string[]; phaseMs: number };

/** The side's grid of checks before the client starts (the agent forwards the client's requests to b1 too); undefined: cut at once. */
function gridOf(p: Placement): number | undefined {
  if (p.kind === 'now') return undefined;
  const checks = p.watch.checksFrom(p.sources);
  if (checks.length < 2) throw new Error(`fewer than two health checks from ${p.sources.join(', ')} seen at the backend`);
  return gridPoint(checks, LIKE_FOR_LIKE.intervalS * 1000);
}

/** When to cut, once the client runs: 300 ms on (its warm-up), at the placement's phase of the grid when there is one. */
function cutTime(p: Placement, grid: number | undefined): number {
  const lead = 300;
  if (p.kind === 'now' || grid === undefined) return Date.now() + lead;
  return placeCut(grid, p.phaseMs, LIKE_FOR_LIKE.intervalS * 1000, Date.now(), lead);
}

/**
 * Client loop around one event on a VIP, until the new Master serves
 * (`tookOver`). The agent: ms from the event to the first answer after the
 * last failure (the old Master fails every request once it lost its NIC or
 * its backends). keepalived answers from a local server, which a lost
 * backend does not stop: ms to the first answer from the new Master (body).
 */
async function measure(tl: TrackingLab, vip: string, placement: Placement, event: () => Promise<number>, tookOver: () => Promise<unknown>, newMasterBody?: string): Promise<{ servedMs: number; failed: number; at: number; cycleMs: number | undefined }> {
  const grid = gridOf(placement);
  const loop = await ClientLoop.start(tl.lab, tl.client, `http://${vip}/`, { intervalMs: 10, timeoutMs: 300, maxInFlight: 50, maxMs: 60_000 });
  await sleep(Math.max(0, cutTime(placement, grid) - Date.now()));
  const at = await event();
  const cycleMs = grid === undefined ? undefined : cycleOffset(grid, at, LIKE_FOR_LIKE.intervalS * 1000);
  await tookOver();
  await sleep(500);
  const results = await loop.stop();
  const g = gapReport(results, at, ['b1', 'b2', 'ka1', 'ka2']);
  if (newMasterBody !== undefined) {
    const first = results.filter((r) => r.ok && r.t >= at && r.body === newMasterBody).sort((a, b) => a.t - b.t)[0];
    return { servedMs: first ? first.t + first.ms - at : Number.NaN, failed: g.failures.length, at, cycleMs };
  }
  return { servedMs: g.servedAfterMs ?? Number.NaN, failed: g.failures.length, at, cycleMs };
}

/** Make (on) or repair the event; the time just before it, read in the same shell. */
async function cut(tl: TrackingLab, ns: string, port: string, ev: TrackingEvent, on: boolean): Promise<number> {
  const cmd = ev === 'carrier'
    ? `date +%s%3N; ip link set ${port} ${on ? 'down' : 'up'}`
    : `date +%s%3N; ${VM_NET_BACKENDS.map((b) => `ip route ${on ? 'replace' : 'del'} unreachable ${b}/32`).join('; ')}`;
  const res = await tl.lab.sh(ev === 'carrier' ? tl.lab.lan : ns, cmd, { allowFail: !on });
  const at = lastNumber(res.stdout);
  return Number.isFinite(at) ? at : Date.now();
}

/** The run's result, with where the cut fell in the side's probe cycle when it was placed there. */
function runOf(m: Awaited<ReturnType<typeof measure>>, timeline?: TrackingTimeline): TrackingRun {
  return { servedMs: m.servedMs, failed: m.failed, ...(timeline ? { timeline } : {}), ...(m.cycleMs !== undefined ? { cycleMs: Math.round(m.cycleMs) } : {}) };
}

async function agentRun(tl: TrackingLab, ev: TrackingEvent, placement: (sources: readonly string[]) => Placement): Promise<TrackingRun> {
  const [n2, n3] = tl.nodes;
  const serving = (n: TrackingNode) => n.waitService('Master serving', 'api', (s) => s.state === 'serving' && (s.failover as { state?: string } | undefined)?.state === 'master', 20_000);
  await serving(n3);
  const m = await measure(tl, VM_NET_VIP, placement([vmNetAddress(n3.def.ip), VM_NET_VIP]), () => cut(tl, n3.ns, n3.vmPort, ev, true), () => serving(n2));
  await cut(tl, n3.ns, n3.vmPort, ev, false);
  await serving(n3); // preempt back
  return runOf(m, { resignMs: resignMs(n3.logs(), m.at), ...takeoverTimeline(n2.logs(), m.at) });
}

async function keepalivedRun(tl: TrackingLab, k1: Keepalived, k2: Keepalived, ev: TrackingEvent, placement: (sources: readonly string[]) => Placement): Promise<TrackingRun> {
  const ns1 = tl.lab.ns('ka1');
  await waitFor('ka1 MASTER', () => k1.state() === 'MASTER', 20_000);
  const m = await measure(tl, KA_VIP, placement([vmNetAddress(KA[0].ip), KA_VIP]), () => cut(tl, ns1, 'wka1', ev, true), () => waitFor('ka2 MASTER', () => k2.state() === 'MASTER', 20_000), 'ka2');
  await cut(tl, ns1, 'wka1', ev, false);
  await waitFor('ka1 MASTER again', () => k1.state() === 'MASTER', 20_000);
  await sleep(500);
  return runOf(m);
}

export async function benchTracking(o: { runs: number; log: (msg: string) => void }): Promise<TrackingResult> {
  const teardowns: (() => unknown)[] = [];
  const loadBefore = loadAverage();
  const errors: string[] = [];
  const out = Object.fromEntries(TRACKING_EVENTS.map((ev) => [ev, { agent: [] as TrackingRun[], keepalived: [] as TrackingRun[] }])) as Record<TrackingEvent, { agent: TrackingRun[]; keepalived: TrackingRun[] }>;
  try {
    const tl = await buildTrackingLab({ teardown: (fn) => teardowns.push(fn) }, KA);
    const [n2, n3] = tl.nodes;
    const watch = await CheckWatch.start(tl.lab, tl.lab.ns(BACKEND_IDS[0]), 8080);
    teardowns.push(() => watch.stop());
    // info: the takeover's own lines, without the cost of debug logging in the measured path.
    await n3.startWith(trackingConfig(n3.def, agentTracking()), { logLevel: 'info' });
    await n2.startWith(trackingConfig(n2.def, agentTracking()), { logLevel: 'info' });
    const kas: Keepalived[] = [];
    for (const k of KA) {
      const ns = tl.lab.ns(k.role);
      await startBackend(tl.lab, ns, k.role, [80]);
      const check = tl.lab.file('reach.sh');
      const kt = keepalivedTracking(VM_NET_BACKENDS, check);
      fs.writeFileSync(check, kt.script, { mode: 0o755 });
      kas.push(await startKeepalived(tl.lab, ns, k.role, {
        vrid: 61, priority: k.priority, advertInt: LIKE_FOR_LIKE.advertInterval, vips: [KA_VIP], vipDev: 'eth1', state: k.role === 'ka1' ? 'MASTER' : 'BACKUP',
        preamble: kt.preamble, instance: kt.instance,
      }));
    }
    for (const ev of TRACKING_EVENTS) {
      for (let i = 0; i < o.runs; i++) {
        // Interleaved, the order rotated per run.
        const order = i % 2 === 0 ? ['agent', 'keepalived'] as const : ['keepalived', 'agent'] as const;
        for (const who of order) {
          try {
            const placement = (sources: readonly string[]): Placement => (ev === 'service' ? { kind: 'cycle', watch, sources, phaseMs: probePhaseMs(i, o.runs) } : { kind: 'now' });
            const r = who === 'agent' ? await agentRun(tl, ev, placement) : await keepalivedRun(tl, kas[0]!, kas[1]!, ev, placement);
            out[ev][who].push(r);
            const t = `${r.cycleMs !== undefined ? `; cut ${r.cycleMs} ms into the probe cycle` : ''}${r.timeline ? `; resigned at ${r.timeline.resignMs} ms, new Master at ${r.timeline.masterMs} ms, bound at ${r.timeline.boundMs} ms` : ''}`;
            o.log(`${ev} run ${i + 1}/${o.runs} ${who}: ${r.servedMs} ms (${r.failed} failed requests)${t}`);
          } catch (e) {
            const msg = `${ev} run ${i + 1} ${who}: ${(e as Error).message.split('\n')[0]}`;
            o.log(`  run failed: ${msg}`);
            errors.push(msg);
            out[ev][who].push({ servedMs: NaN, failed: NaN });
          }
        }
      }
    }
  } finally {
    for (const fn of teardowns.reverse()) await fn();
  }
  return {
    config: { runs: o.runs, likeForLike: LIKE_FOR_LIKE, command: `node dist/bench/tracking.js --runs ${o.runs}` },
    summary: summariseTracking(out),
    load: { before: loadBefore, after: loadAverage() },
    errors,
  };
}

if (require.main === module) {
  const i = process.argv.indexOf('--runs');
  const runs = Math.max(1, Math.min(20, (i >= 0 ? Number(process.argv[i + 1]) : 10) || 10));
  benchTracking({ runs, log: (msg) => process.stderr.write(`[bench/tracking] ${msg}\n`) })
    .then((r) => process.stdout.write(`${JSON.stringify({ bench: 'tracking', ...r }, null, 2)}\n`))
    .catch((e: unknown) => { process.stderr.write(`${e instanceof Error ? e.stack ?? e.message : String(e)}\n`); process.exit(1); });
}
