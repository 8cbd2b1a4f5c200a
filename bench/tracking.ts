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
// Each side's detection is read too: the agent's resignation (its tracker
// acts in the turn of the failed check that leaves too few healthy
// backends), keepalived's script's first failing run (the script logs its
// end), so the second table gives the time from detection to first answer
// and to the new Master's first gratuitous ARP (tcpdump on its bridge
// port, both sides): the time each side takes once it knows, with the phase of the cut
// in the probe cycle, which sets most of the spread of the first table, out.
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

/**
 * keepalived's side: the vrrp_script block and the instance's track lines,
 * and the script's body. With `failLog`, a failing run appends its end
 * (epoch ms) to that file: keepalived's detection, on the clock the cut's
 * `date` reads.
 */
export function keepalivedTracking(backends: readonly string[], scriptPath: string, l: typeof LIKE_FOR_LIKE = LIKE_FOR_LIKE, failLog?: string): { preamble: string[]; instance: string[]; script: string } {
  return {
    preamble: ['vrrp_script reach {', `  script "${scriptPath}"`, `  interval ${l.intervalS}`, `  fall ${l.fall}`, `  rise ${l.rise}`, `  weight -${l.weight}`, '}'],
    instance: ['track_interface {', '  eth1', '}', 'track_script {', '  reach', '}'],
    // Can this VM still reach a backend? One TCP connect each, the agent's timeout.
    script: `#!/bin/bash\n${backends.map((b) => `timeout ${l.timeoutS} bash -c '</dev/tcp/${b}/8080' 2>/dev/null`).join(' || ')} && exit 0\n${failLog === undefined ? '' : `date +%s%3N >> ${failLog}\n`}exit 1\n`,
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
  /**
   * ms from the event to the side's detection: the agent's resignation (its
   * tracker counts the track as failing at the failed check that leaves too
   * few healthy backends, and lowers the priority in the same turn; fault on
   * carrier loss); keepalived's script's first failing run (reach only:
   * keepalived sees carrier through netlink as the agent does, and logs it
   * to the second only).
   */
  detectedMs?: number;
  /** ms from the event to the new Master's first gratuitous ARP for the VIP after detection, captured on its bridge port. */
  garpMs?: number;
}

/** One side's medians over the runs of an event. */
export interface TrackingSide {
  runs: TrackingRun[];
  medianServedMs: number;
  spreadMs: [number, number];
  /** Median ms from the event to the side's detection (TrackingRun.detectedMs). */
  medianDetectedMs: number;
  /** Median of each run's ms from detection to first answer: the time the side takes once it knows, without the probe cycle's phase. */
  medianAfterDetectMs: number;
  afterDetectSpreadMs: [number, number];
  /** Median of each run's ms from detection to the new Master's first gratuitous ARP on the bridge. */
  medianDetectToGarpMs: number;
}

export interface TrackingSummary {
  event: TrackingEvent;
  agent: TrackingSide & { medianTimeline: TrackingTimeline };
  keepalived: TrackingSide;
  /** agent / keepalived medians; below 1 the agent serves again sooner. */
  ratioServed: number;
  /** agent / keepalived medians of detection to first answer (NaN where keepalived's detection is not read). */
  ratioAfterDetect: number;
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

/** A side's medians over its runs (pure). */
function sideOf(runs: readonly TrackingRun[]): TrackingSide {
  const since = (f: (x: TrackingRun) => number | undefined): number[] => runs.map((x) => (f(x) ?? NaN) - (x.detectedMs ?? NaN));
  const after = since((x) => x.servedMs);
  return {
    runs: [...runs], medianServedMs: median(runs.map((x) => x.servedMs)), spreadMs: spread(runs.map((x) => x.servedMs)),
    medianDetectedMs: median(runs.map((x) => x.detectedMs ?? NaN)),
    medianAfterDetectMs: median(after), afterDetectSpreadMs: spread(after),
    medianDetectToGarpMs: median(since((x) => x.garpMs)),
  };
}

/** Medians and ratios per event (pure). */
export function summariseTracking(runs: Readonly<Record<TrackingEvent, { agent: readonly TrackingRun[]; keepalived: readonly TrackingRun[] }>>): TrackingSummary[] {
  return TRACKING_EVENTS.filter((ev) => runs[ev] !== undefined).map((event) => {
    const r = runs[event];
    const tl = r.agent.map((x) => x.timeline).filter((x): x is TrackingTimeline => x !== undefined);
    const agent = sideOf(r.agent);
    const keepalived = sideOf(r.keepalived);
    return {
      event,
      agent: {
        ...agent,
        medianTimeline: { resignMs: median(tl.map((x) => x.resignMs)), masterMs: median(tl.map((x) => x.masterMs)), takingMs: median(tl.map((x) => x.takingMs)), boundMs: median(tl.map((x) => x.boundMs)) },
      },
      keepalived,
      ratioServed: round(ratio(agent.medianServedMs, keepalived.medianServedMs), 2),
      ratioAfterDetect: round(ratio(agent.medianAfterDetectMs, keepalived.medianAfterDetectMs), 2),
    };
  });
}

/** The fastest and the slowest of the measured values (NaN, NaN when none). */
function spread(values: readonly number[]): [number, number] {
  const ok = values.filter((x) => Number.isFinite(x));
  return ok.length === 0 ? [NaN, NaN] : [Math.min(...ok), Math.max(...ok)];
}

const cell = (x: number): string => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
const EVENT_TEXT: Record<TrackingEvent, string> = {
  carrier: 'carrier lost on the VM-network NIC (track_interface)',
  service: 'reach lost to every backend (tracked service / track_script)',
};

/**
 * The area's tables: one line per event, agent beside keepalived, and where
 * the agent's time went; then the same runs from each side's detection on.
 */
export function trackingTable(r: TrackingResult): string {
  const head = '| event | agent: first answer ms (spread) | keepalived: first answer ms (spread) | agent / keepalived | agent: old Master resigned ms | agent: new Master ms | agent: VIP bound ms | runs: agent; keepalived (ms, with the cut\'s place in the side\'s probe cycle @ms) |\n| --- | --: | --: | --: | --: | --: | --: | --- |';
  const runs = (rs: readonly TrackingRun[]): string => rs.map((x) => `${cell(x.servedMs)}${x.cycleMs !== undefined ? ` @${cell(x.cycleMs)}` : ''}`).join(', ');
  const med = (m: number, sp: [number, number]): string => `${cell(m)} (${cell(sp[0])}-${cell(sp[1])})`;
  const x = (v: number): string => (Number.isFinite(v) ? `${v.toFixed(2)}x` : 'n/a');
  const rows = r.summary.map((s) => `| ${EVENT_TEXT[s.event]} | ${med(s.agent.medianServedMs, s.agent.spreadMs)} | ${med(s.keepalived.medianServedMs, s.keepalived.spreadMs)} | ${x(s.ratioServed)} | ${cell(s.agent.medianTimeline.resignMs)} | ${cell(s.agent.medianTimeline.masterMs)} | ${cell(s.agent.medianTimeline.boundMs)} | ${runs(s.agent.runs)}; ${runs(s.keepalived.runs)} |`);
  const head2 = '| event | agent: detected ms | keepalived: detected ms | agent: detection to first answer ms (spread) | keepalived: detection to first answer ms (spread) | agent / keepalived | agent: detection to gratuitous ARP ms | keepalived: detection to gratuitous ARP ms | runs: agent; keepalived (detection to first answer ms) |\n| --- | --: | --: | --: | --: | --: | --: | --: | --- |';
  const after = (rs: readonly TrackingRun[]): string => rs.map((y) => cell(y.servedMs - (y.detectedMs ?? NaN))).join(', ');
  const rows2 = r.summary.map((s) => `| ${EVENT_TEXT[s.event]} | ${cell(s.agent.medianDetectedMs)} | ${cell(s.keepalived.medianDetectedMs)} | ${med(s.agent.medianAfterDetectMs, s.agent.afterDetectSpreadMs)} | ${med(s.keepalived.medianAfterDetectMs, s.keepalived.afterDetectSpreadMs)} | ${x(s.ratioAfterDetect)} | ${cell(s.agent.medianDetectToGarpMs)} | ${cell(s.keepalived.medianDetectToGarpMs)} | ${after(s.agent.runs)}; ${after(s.keepalived.runs)} |`);
  return [head, ...rows, '', head2, ...rows2].join('\n');
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
 * tcpdump in a namespace (-tt: epoch seconds, on the clock the cut's `date`
 * reads), each line it prints parsed into a key and a time (wall ms), the
 * last `keep` times kept per key.
 */
class TcpdumpTimes {
  private readonly times = new Map<string, number[]>();
  private buf = '';
  private constructor(private readonly proc: ChildProcess, parse: (line: string) => { key: string; t: number } | undefined, keep: number) {
    proc.stdout?.on('data', (d: Buffer) => {
      this.buf += d.toString();
      let nl: number;
      while ((nl = this.buf.indexOf('\n')) >= 0) {
        const p = parse(this.buf.slice(0, nl));
        this.buf = this.buf.slice(nl + 1);
        if (!p) continue;
        const times = this.times.get(p.key) ?? [];
        times.push(p.t);
        if (times.length > keep) times.shift();
        this.times.set(p.key, times);
      }
    });
  }

  static async start(lab: Lab, ns: string, args: readonly string[], parse: (line: string) => { key: string; t: number } | undefined, keep: number): Promise<TcpdumpTimes> {
    const proc = lab.spawn(ns, 'tcpdump', ['-n', '-l', '-tt', ...args]);
    let err = '';
    proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
    await waitFor('tcpdump listening', () => /listening on/.test(err), 10_000);
    return new TcpdumpTimes(proc, parse, keep);
  }

  /** The times kept for a key, oldest first. */
  of(key: string): readonly number[] { return this.times.get(key) ?? []; }

  stop(): void { this.proc.kill('SIGKILL'); }
}

/** The SYNs of health checks arriving at a backend, by source address, as tcpdump in its namespace sees them. */
export class CheckWatch {
  private constructor(private readonly dump: TcpdumpTimes) {}

  static async start(lab: Lab, ns: string, port: number): Promise<CheckWatch> {
    const parse = (line: string): { key: string; t: number } | undefined => {
      // "1765100000.123456 IP 10.98.0.4.41234 > 10.98.0.11.8080: Flags [S], ..."
      const m = /^(\d+\.\d+) IP (\d+\.\d+\.\d+\.\d+)\.\d+ > /.exec(line);
      return m ? { key: m[2]!, t: Number(m[1]) * 1000 } : undefined;
    };
    return new CheckWatch(await TcpdumpTimes.start(lab, ns, ['-i', 'eth1', '-Q', 'in', `tcp dst port ${port} and tcp[tcpflags] & (tcp-syn|tcp-ack) == tcp-syn`], parse, CHECKS_KEPT));
  }

  /** The checks seen from the address of these that sent the latest one (wall ms, oldest first). */
  checksFrom(sources: readonly string[]): number[] {
    let best: readonly number[] = [];
    for (const src of sources) {
      const t = this.dump.of(src);
      if (t.length > 0 && (best.length === 0 || t.at(-1)! > best.at(-1)!)) best = t;
    }
    return [...best];
  }

  stop(): void { this.dump.stop(); }
}

/**
 * A gratuitous ARP in a line of `tcpdump -n -tt` (pure): its time (wall ms)
 * and the address it announces. The capture's filter keeps only ARP whose
 * sender and target address are the same (RFC 5227 §2.3's announcement, or
 * keepalived's gratuitous ARP), so a client's request is never one.
 */
export function parseGarp(line: string): { t: number; ip: string } | undefined {
  // "1765100000.123456 ARP, Request who-has 10.98.0.201 tell 10.98.0.201, length 28"
  const m = /^(\d+\.\d+) ARP, (?:Request who-has|Reply) (\d+\.\d+\.\d+\.\d+)[ ,]/.exec(line);
  return m ? { t: Number(m[1]) * 1000, ip: m[2]! } : undefined;
}

/**
 * The gratuitous ARPs one VM sends on the VM network, by address: tcpdump on
 * its bridge port in the lab's LAN namespace, frames coming in from the VM
 * only, so the old Master's own (keepalived repeats its announcements
 * garp_master_delay after becoming Master) are never taken for the new one's.
 */
export class GarpWatch {
  private constructor(private readonly dump: TcpdumpTimes) {}

  static async start(lab: Lab, port: string): Promise<GarpWatch> {
    const parse = (line: string): { key: string; t: number } | undefined => {
      const g = parseGarp(line);
      return g ? { key: g.ip, t: g.t } : undefined;
    };
    // A run's announcements; older ones are never asked for again.
    return new GarpWatch(await TcpdumpTimes.start(lab, lab.lan, ['-i', port, '-Q', 'in', 'arp and arp[14:4] = arp[24:4]'], parse, 64));
  }

  /** The first gratuitous ARP for `ip` at or after `at` (wall ms), ms after `from`; NaN when none. */
  firstAfter(ip: string, at: number, from: number): number {
    const t = this.dump.of(ip).find((x) => x >= at);
    return t === undefined ? NaN : Math.round(t - from);
  }

  stop(): void { this.dump.stop(); }
}

/** The first time (epoch ms, one a line, as keepalivedTracking's failLog has them) at or after `at`, ms after it; NaN when none. */
export function firstLoggedAfter(text: string, at: number): number {
  const t = text.split('\n').map(Number).filter((x) => x > 0 && x >= at).sort((a, b) => a - b)[0];
  return t === undefined ? NaN : t - at;
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

async function agentRun(tl: TrackingLab, garp: GarpWatch, ev: TrackingEvent, placement: (sources: readonly string[]) => Placement): Promise<TrackingRun> {
  const [n2, n3] = tl.nodes;
  const serving = (n: TrackingNode) => n.waitService('Master serving', 'api', (s) => s.state === 'serving' && (s.failover as { state?: string } | undefined)?.state === 'master', 20_000);
  await serving(n3);
  const m = await measure(tl, VM_NET_VIP, placement([vmNetAddress(n3.def.ip), VM_NET_VIP]), () => cut(tl, n3.ns, n3.vmPort, ev, true), () => serving(n2));
  await cut(tl, n3.ns, n3.vmPort, ev, false);
  await serving(n3); // preempt back
  const detectedMs = resignMs(n3.logs(), m.at);
  return { ...runOf(m, { resignMs: detectedMs, ...takeoverTimeline(n2.logs(), m.at) }), detectedMs, garpMs: garp.firstAfter(VM_NET_VIP, m.at + (Number.isFinite(detectedMs) ? detectedMs : 0), m.at) };
}

async function keepalivedRun(tl: TrackingLab, garp: GarpWatch, k1: Keepalived, k2: Keepalived, failLog: string, ev: TrackingEvent, placement: (sources: readonly string[]) => Placement): Promise<TrackingRun> {
  const ns1 = tl.lab.ns('ka1');
  await waitFor('ka1 MASTER', () => k1.state() === 'MASTER', 20_000);
  const m = await measure(tl, KA_VIP, placement([vmNetAddress(KA[0].ip), KA_VIP]), () => cut(tl, ns1, 'wka1', ev, true), () => waitFor('ka2 MASTER', () => k2.state() === 'MASTER', 20_000), 'ka2');
  await cut(tl, ns1, 'wka1', ev, false);
  await waitFor('ka1 MASTER again', () => k1.state() === 'MASTER', 20_000);
  await sleep(500);
  const detectedMs = ev === 'service' ? firstLoggedAfter(fs.existsSync(failLog) ? fs.readFileSync(failLog, 'utf8') : '', m.at) : undefined;
  const from = m.at + (detectedMs !== undefined && Number.isFinite(detectedMs) ? detectedMs : 0);
  return { ...runOf(m), ...(detectedMs !== undefined ? { detectedMs } : {}), garpMs: garp.firstAfter(KA_VIP, from, m.at) };
}

export async function benchTracking(o: { runs: number; log: (msg: string) => void }): Promise<TrackingResult> {
  const teardowns: (() => unknown)[] = [];
  const loadBefore = loadAverage();
  const errors: string[] = [];
  const out = Object.fromEntries(TRACKING_EVENTS.map((ev) => [ev, { agent: [] as TrackingRun[], keepalived: [] as TrackingRun[] }])) as Record<TrackingEvent, { agent: TrackingRun[]; keepalived: TrackingRun[] }>;
  try {
    const tl = await buildTrackingLab({ teardown: (fn) => teardowns.push(fn) }, KA);
    const failLogOf = (role: string): string => tl.lab.file(`reach-${role}.failed`);
    const [n2, n3] = tl.nodes;
    const watch = await CheckWatch.start(tl.lab, tl.lab.ns(BACKEND_IDS[0]), 8080);
    teardowns.push(() => watch.stop());
    // The new Masters' bridge ports: n2's, ka2's.
    const garpAgent = await GarpWatch.start(tl.lab, n2.vmPort);
    const garpKa = await GarpWatch.start(tl.lab, 'wka2');
    teardowns.push(() => { garpAgent.stop(); garpKa.stop(); });
    // info: the takeover's own lines, without the cost of debug logging in the measured path.
    await n3.startWith(trackingConfig(n3.def, agentTracking()), { logLevel: 'info' });
    await n2.startWith(trackingConfig(n2.def, agentTracking()), { logLevel: 'info' });
    const kas: Keepalived[] = [];
    for (const k of KA) {
      const ns = tl.lab.ns(k.role);
      await startBackend(tl.lab, ns, k.role, [80]);
      const check = tl.lab.file(`reach-${k.role}.sh`);
      const kt = keepalivedTracking(VM_NET_BACKENDS, check, LIKE_FOR_LIKE, failLogOf(k.role));
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
            const r = who === 'agent' ? await agentRun(tl, garpAgent, ev, placement) : await keepalivedRun(tl, garpKa, kas[0]!, kas[1]!, failLogOf(KA[0].role), ev, placement);
            out[ev][who].push(r);
            const t = `${r.cycleMs !== undefined ? `; cut ${r.cycleMs} ms into the probe cycle` : ''}${r.detectedMs !== undefined ? `; detected at ${r.detectedMs} ms` : ''}${r.timeline ? `; new Master at ${r.timeline.masterMs} ms, bound at ${r.timeline.boundMs} ms` : ''}; gratuitous ARP at ${r.garpMs} ms`;
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
