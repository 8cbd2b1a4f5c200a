// One measured run of HTTPS health checks (not a test; nothing is
// asserted), started by bench/https.ts inside the checkers' namespace:
// `agent` is lb-agent's HealthChecker (one https service per target, as the
// loader builds them), `haproxy` is HAProxy (one thread) with `check
// check-ssl` and `option httpchk GET /` on a server per target. Both check
// the same TLS backends (nginx in another namespace) at the same period,
// without verification (`verify none`) or with the lab CA and a server name
// (`--ca`, `--sni`: `ca-file`, `verify required`, `check-sni`). CPU is the
// checker's own process over the measured window (process.cpuUsage, or
// /proc for HAProxy); checks are counted by the backends' access log, two
// bytes a completed check, "r" when its TLS session was resumed.
//
//   node dist/bench/https-probe.js --who agent|haproxy --address A --first-port P --count N
//        --access-log FILE [--ca FILE --sni NAME] [--period 2] [--duration 10] [--warmup 4]
//        [--cpu-profile FILE]
// Prints one JSON object on stdout. With --cpu-profile (agent only) the
// measured window is also profiled (the inspector's sampling profiler, in
// this thread), the profile written to FILE and its summary
// (bench/lib/cpuprofile.ts) put in the line; the profiler's own cost is in
// that run's CPU.

import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Registry } from 'prom-client';
import { HealthChecker } from '../agent/health/checker';
import { checkCaPem } from '../agent/config/ca-file';
import { parseIPv4 } from '../agent/address';
import type { ServiceSpec, TlsCheckSpec } from '../agent/config/types';
import { cpuSecondsOf, memoryOf } from './lib/procfs';
import { startCheckingHaproxy } from './lib/haproxy-checks';
import { summariseProfile, type CpuProfile } from './lib/cpuprofile';

interface Args {
  who: 'agent' | 'haproxy'; address: string; firstPort: number; count: number; accessLog: string;
  ca: string | undefined; sni: string | undefined; period: number; duration: number; warmup: number; maxInFlight: number;
  cpuProfile: string | undefined;
}

function parseArgs(argv: string[]): Args {
  const a: Args = { who: 'agent', address: '', firstPort: 0, count: 0, accessLog: '', ca: undefined, sni: undefined, period: 2, duration: 10, warmup: 4, maxInFlight: 1024, cpuProfile: undefined };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[++i] ?? '';
    switch (argv[i - 1]) {
      case '--who': if (v !== 'agent' && v !== 'haproxy') throw new Error(`--who: agent or haproxy, not ${v}`); a.who = v; break;
      case '--address': a.address = v; break;
      case '--first-port': a.firstPort = Number(v); break;
      case '--count': a.count = Number(v); break;
      case '--access-log': a.accessLog = v; break;
      case '--ca': a.ca = v; break;
      case '--sni': a.sni = v; break;
      case '--period': a.period = Number(v); break;
      case '--duration': a.duration = Number(v); break;
      case '--warmup': a.warmup = Number(v); break;
      case '--max-in-flight': a.maxInFlight = Number(v); break;
      case '--cpu-profile': a.cpuProfile = v; break;
      default: throw new Error(`unknown argument ${argv[i - 1]}`);
    }
  }
  if (!a.address || !a.count || !a.accessLog) throw new Error('--address, --first-port, --count and --access-log are required');
  return a;
}

/** Checks completed so far and how many of them resumed a session, from the access log. */
function logged(file: string): { checks: number; resumed: number } {
  let size = 0;
  try { size = statSync(file).size; } catch { return { checks: 0, resumed: 0 }; }
  const text = readFileSync(file, 'latin1');
  let resumed = 0;
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) === 0x72 /* r */) resumed++;
  return { checks: Math.floor(size / 2), resumed };
}

const r2 = (x: number): number => Math.round(x * 100) / 100;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** The window both checkers are measured over: warm up, then `duration` seconds of CPU and logged checks. */
async function window(a: Args, cpu: () => number, hooks: { begin?: () => Promise<void>; end?: () => Promise<void> } = {}): Promise<{ wall: number; cpuSeconds: number; checks: number; resumed: number }> {
  await sleep(a.warmup * 1000);
  await hooks.begin?.();
  const l0 = logged(a.accessLog);
  const c0 = cpu();
  const m0 = performance.now();
  await sleep(a.duration * 1000);
  const cpuSeconds = cpu() - c0;
  const wall = (performance.now() - m0) / 1000;
  const l1 = logged(a.accessLog);
  await hooks.end?.();
  return { wall, cpuSeconds, checks: l1.checks - l0.checks, resumed: l1.resumed - l0.resumed };
}

function result(a: Args, w: Awaited<ReturnType<typeof window>>, extra: Record<string, unknown>): Record<string, unknown> {
  return {
    who: a.who, verify: a.ca !== undefined, targets: a.count, periodSeconds: a.period, measuredSeconds: r2(w.wall),
    checksPerSecond: Math.round(w.checks / w.wall), expectedPerSecond: Math.round(a.count / a.period),
    resumedFraction: w.checks ? r2(w.resumed / w.checks) : null,
    cpu: { percentOfOneCore: r2((w.cpuSeconds / w.wall) * 100) },
    cpuMicrosPerCheck: w.checks ? r2((w.cpuSeconds * 1e6) / w.checks) : null,
    ...extra,
  };
}

async function runAgent(a: Args): Promise<Record<string, unknown>> {
  let tls: TlsCheckSpec = { sni: a.sni, caFile: undefined, ca: undefined, caSha256: undefined };
  if (a.ca !== undefined) {
    const r = checkCaPem(a.ca, readFileSync(a.ca, 'utf8'));
    if (!r.ok) throw new Error(r.message);
    tls = { sni: a.sni, caFile: a.ca, ca: r.pem, caSha256: r.sha256 };
  }
  const addressNum = parseIPv4(a.address)!;
  const services: ServiceSpec[] = Array.from({ length: a.count }, (_, i) => ({
    key: `bench/s${i}`, name: `s${i}`, namespace: 'bench', ipam: 'pool', primaryService: undefined, loadBalancerIP: undefined,
    vrid: undefined, priority: undefined, ports: [{ name: 'https', port: 443, protocol: 'TCP', targetPort: a.firstPort + i }],
    backends: [{ address: a.address, addressNum, weight: 1 }], sourceIP: 'snat', topology: 'any',
    healthCheck: {
      enabled: true, type: 'https', port: a.firstPort + i, successThreshold: 1, failureThreshold: 3,
      periodSeconds: a.period, timeoutSeconds: Math.min(3, a.period), http: { path: '/', expectStatus: [200, 399] }, tls, passiveFailures: 3,
    },
  }));
  const hc = new HealthChecker({ registry: new Registry(), maxInFlight: a.maxInFlight });
  const failures: Record<string, number> = {};
  let probes = 0;
  hc.on('probe', (_report, r) => {
    probes++;
    if (!r.ok) failures[`${r.reason}: ${r.detail}`] = (failures[`${r.reason}: ${r.detail}`] ?? 0) + 1;
  });
  hc.update(services);
  hc.start();
  const eld = monitorEventLoopDelay({ resolution: 10 });
  eld.enable();
  const usage = (): number => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
  const prof = a.cpuProfile !== undefined ? new Profiler() : undefined;
  const w = await window(a, usage, prof ? { begin: () => prof.start(), end: () => prof.stop(a.cpuProfile!) } : {});
  eld.disable();
  const up = services.reduce((k, s) => k + hc.healthy(s.key).length, 0);
  const contexts = hc.tlsContexts();
  const sched = hc.schedulerStats();
  hc.stop();
  return result(a, w, {
    healthy: up, tlsContexts: contexts, probesStartedTotal: probes, failures, skippedBusy: sched.skippedBusy,
    eventLoopDelayMs: { p50: r2(eld.percentile(50) / 1e6), p99: r2(eld.percentile(99) / 1e6), max: r2(eld.max / 1e6) },
    rssMiB: Math.round(process.memoryUsage().rss / 2 ** 20),
    ...(prof?.summary ? { profile: prof.summary } : {}),
  });
}

/** The inspector's sampling profiler on this thread, around the measured window. */
class Profiler {
  private readonly session = new Session();
  summary: ReturnType<typeof summariseProfile> | undefined;

  private post(method: string, params: object = {}): Promise<unknown> {
    return new Promise((resolve, reject) => this.session.post(method, params, (err, res) => (err ? reject(err) : resolve(res))));
  }

  async start(): Promise<void> {
    this.session.connect();
    await this.post('Profiler.enable');
    // 1 ms, node --cpu-prof's default interval.
    await this.post('Profiler.setSamplingInterval', { interval: 1000 });
    await this.post('Profiler.start');
  }

  async stop(file: string): Promise<void> {
    const { profile } = (await this.post('Profiler.stop')) as { profile: CpuProfile };
    this.session.disconnect();
    writeFileSync(file, JSON.stringify(profile));
    this.summary = summariseProfile(profile);
  }
}

async function runHaproxy(a: Args): Promise<Record<string, unknown>> {
  const ssl = a.ca !== undefined ? `verify required ca-file ${a.ca}${a.sni ? ` check-sni ${a.sni} verifyhost ${a.sni}` : ''}` : 'verify none';
  const hap = startCheckingHaproxy({
    mode: 'http', timeoutCheckMs: Math.round(Math.min(3, a.period) * 1000),
    backend: ['option httpchk GET /', `default-server check check-ssl ${ssl} inter ${Math.round(a.period * 1000)}ms fall 3 rise 1`],
    servers: Array.from({ length: a.count }, (_, i) => `${a.address}:${a.firstPort + i}`),
  });
  try {
    const w = await window(a, () => cpuSecondsOf(hap.proc.pid));
    hap.assertRunning();
    // HAProxy logs a server going DOWN on stderr: any such line is a failed check.
    const down = hap.stderr().split('\n').filter((l) => /is DOWN/.test(l)).length;
    const rss = memoryOf(hap.proc.pid)?.rssKiB;
    return result(a, w, { serversReportedDown: down, rssMiB: rss !== undefined ? Math.round(rss / 1024) : null });
  } finally {
    await hap.stop();
  }
}

async function main(): Promise<void> {
  const a = parseArgs(process.argv.slice(2));
  const res = a.who === 'haproxy' ? await runHaproxy(a) : await runAgent(a);
  process.stdout.write(`${JSON.stringify(res)}\n`);
}

main().catch((err) => { process.stderr.write(`${String(err)}\n`); process.exit(1); });
