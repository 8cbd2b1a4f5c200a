// The standalone benches other modules ship (bench/health.ts, preflight.ts,
// failover.ts), run as child processes and summarised for the report:
// health.js inside a fresh namespace of its own (its listeners and probes use
// that namespace's loopback), preflight.js on the host as cloud-init would
// run `lb-agent check`, failover.js when it exists. Each run is bounded.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Lab, run } from '../lab/netns';
import { median, round } from './lib/stats';

const DIST_BENCH = __dirname;

/** JSON objects printed by a script: the whole stdout if it parses, else each line that does. */
export function parseJsonOutput(stdout: string): unknown[] {
  const t = stdout.trim();
  if (!t) return [];
  try { return [JSON.parse(t)]; } catch { /* lines */ }
  const out: unknown[] = [];
  for (const line of t.split('\n')) {
    const l = line.trim();
    if (!l.startsWith('{')) continue;
    try { out.push(JSON.parse(l)); } catch { /* not JSON */ }
  }
  return out;
}

// --- health probes/s ---------------------------------------------------------

/** How the probes run: see bench/health.ts. */
export type ProbePath = 'native' | 'native-fin' | 'native-rst' | 'node' | 'own' | 'haproxy';
export const PROBE_PATHS: readonly ProbePath[] = ['native', 'native-fin', 'native-rst', 'node', 'own', 'haproxy'];

/** One backend count and the paths measured at it. */
export interface ProbeRun { backends: number; paths: ProbePath[] }

export interface ProbeRateOptions { rounds: number; runs: ProbeRun[]; period: number; duration: number; warmup: number; log: (msg: string) => void }

interface HealthLine {
  backends: number; path: ProbePath; probesPerSecond: number; expectedPerSecond: number; connectsPerSecond?: number;
  cpu: { percentOfOneCore: number }; cpuMicrosPerProbe: number | null; listenerCpuPercentOfOneCore?: number | null;
  startLagMs?: { p50: number; p99: number }; eventLoopDelayMs?: { p99: number }; rssMB: number | null;
  skipped?: { busy: number; overrun: number }; failures?: Record<string, number>;
}

export interface ProbeRateSummary {
  backends: number; path: ProbePath; periodSeconds: number; probesPerSecond: number; expectedPerSecond: number; sustainedFraction: number;
  cpuPercentOfOneCore: number; cpuMicrosPerProbe: number; listenerCpuPercentOfOneCore: number; startLagP99Ms: number; eventLoopDelayP99Ms: number;
  rssMiB: number; skippedBusy: number; runs: number;
}

export interface ProbeRateResult { config: Omit<ProbeRateOptions, 'log'> & { command: string }; summary: ProbeRateSummary[]; raw: unknown[]; errors: string[] }

/**
 * Every (backend count, path) in a process of its own, in a fresh namespace
 * of its own (so no run inherits another's TIME_WAIT sockets), paths in a
 * rotated order each round.
 */
export async function benchProbeRate(o: ProbeRateOptions): Promise<ProbeRateResult> {
  const script = path.join(DIST_BENCH, 'health.js');
  const common = ['--period', String(o.period), '--duration', String(o.duration), '--warmup', String(o.warmup)];
  const raw: HealthLine[] = [];
  const errors: string[] = [];
  const lab = await Lab.create();
  let k = 0;
  try {
    for (let r = 0; r < o.rounds; r++) {
      for (const run of o.runs) {
        const paths = run.paths.map((_, i) => run.paths[(i + r) % run.paths.length]!);
        for (const p of paths) {
          const ns = await lab.addHost(`probes${k++}`);
          const args = ['--backends', String(run.backends), '--paths', p, ...common];
          const res = await lab.sh(ns, `ulimit -n 20000 2>/dev/null; exec ${process.execPath} ${script} ${args.join(' ')}`, { allowFail: true, timeoutMs: (o.duration + o.warmup + 60) * 1000 });
          const lines = parseJsonOutput(res.stdout) as HealthLine[];
          if (res.code !== 0 || lines.length === 0) errors.push(`round ${r + 1}, ${run.backends} ${p}: exit ${res.code}: ${res.stderr.slice(-300)}`);
          for (const l of lines) {
            raw.push(l);
            o.log(`round ${r + 1}/${o.rounds} ${String(l.backends).padStart(6)} backends, ${l.path.padEnd(7)}: ${l.probesPerSecond} probes/s of ${l.expectedPerSecond}, cpu ${l.cpu.percentOfOneCore}% of a core, ${l.cpuMicrosPerProbe ?? '-'} us/probe${l.startLagMs ? `, start lag p99 ${l.startLagMs.p99} ms` : ''}`);
          }
        }
      }
    }
  } finally {
    await lab.destroy();
  }
  const summary: ProbeRateSummary[] = [];
  for (const run of o.runs) {
    for (const p of PROBE_PATHS) {
      if (!run.paths.includes(p)) continue;
      const rs = raw.filter((l) => l.backends === run.backends && l.path === p);
      const pps = median(rs.map((l) => l.probesPerSecond));
      summary.push({
        backends: run.backends, path: p, periodSeconds: o.period,
        probesPerSecond: round(pps, 0), expectedPerSecond: Math.round(run.backends / o.period),
        sustainedFraction: round(pps / (run.backends / o.period), 3),
        cpuPercentOfOneCore: round(median(rs.map((l) => l.cpu.percentOfOneCore)), 1),
        cpuMicrosPerProbe: round(median(rs.map((l) => l.cpuMicrosPerProbe ?? NaN)), 1),
        listenerCpuPercentOfOneCore: round(median(rs.map((l) => l.listenerCpuPercentOfOneCore ?? NaN)), 1),
        startLagP99Ms: round(median(rs.map((l) => l.startLagMs?.p99 ?? NaN)), 1),
        eventLoopDelayP99Ms: round(median(rs.map((l) => l.eventLoopDelayMs?.p99 ?? NaN)), 1),
        rssMiB: round(median(rs.map((l) => l.rssMB ?? NaN)), 0),
        skippedBusy: round(median(rs.map((l) => l.skipped?.busy ?? NaN)), 0),
        runs: rs.length,
      });
    }
  }
  const command = `node dist/bench/health.js --backends N --paths P ${common.join(' ')}`;
  return { config: { rounds: o.rounds, runs: o.runs, period: o.period, duration: o.duration, warmup: o.warmup, command }, summary, raw, errors };
}

// --- preflight -----------------------------------------------------------------

export interface PreflightSummary { freshProcessMedianMs: number; inProcessMedianMs: number; firstRunMs: number; exitCode: number; runs: number }
export interface PreflightResult { config: { runs: number; command: string }; summary: PreflightSummary | undefined; raw: unknown; error?: string }

export async function benchPreflight(o: { runs: number; log: (msg: string) => void }): Promise<PreflightResult> {
  const script = path.join(DIST_BENCH, 'preflight.js');
  const res = await run(process.execPath, [script, '--runs', String(o.runs)], { allowFail: true, timeoutMs: (o.runs * 2 * 30 + 30) * 1000 });
  const [doc] = parseJsonOutput(res.stdout) as ({ exitCode: number; firstRunMs: number; inProcess: { medianMs: number; runs: number }; freshProcess: { medianMs: number } } | undefined)[];
  const command = `node dist/bench/preflight.js --runs ${o.runs}`;
  if (!doc) return { config: { runs: o.runs, command }, summary: undefined, raw: res.stdout.slice(0, 2000), error: `exit ${res.code}: ${res.stderr.slice(-300)}` };
  o.log(`lb-agent check: fresh process ${doc.freshProcess.medianMs} ms, in process ${doc.inProcess.medianMs} ms (median of ${o.runs}), exit ${doc.exitCode}`);
  return {
    config: { runs: o.runs, command },
    summary: { freshProcessMedianMs: doc.freshProcess.medianMs, inProcessMedianMs: doc.inProcess.medianMs, firstRunMs: doc.firstRunMs, exitCode: doc.exitCode, runs: doc.inProcess.runs },
    raw: doc,
  };
}

// --- failover --------------------------------------------------------------------

export interface FailoverResult { present: boolean; command?: string; raw?: unknown[]; error?: string }

/** bench/failover.ts is another module's; its output is kept as printed (JSON), and summarised generically. */
export async function benchFailover(o: { quick: boolean; log: (msg: string) => void }): Promise<FailoverResult> {
  const script = path.join(DIST_BENCH, 'failover.js');
  if (!fs.existsSync(script)) {
    o.log('bench/failover.ts is not there (yet): skipped');
    return { present: false };
  }
  const res = await run(process.execPath, [script], { allowFail: true, timeoutMs: (o.quick ? 5 : 8) * 60_000 });
  const raw = parseJsonOutput(res.stdout);
  const command = 'node dist/bench/failover.js';
  if (res.code !== 0 || raw.length === 0) return { present: true, command, raw, error: `exit ${res.code}: ${(res.stderr || res.stdout).slice(-500)}` };
  o.log(`failover: ${raw.length} JSON document(s)`);
  return { present: true, command, raw };
}
