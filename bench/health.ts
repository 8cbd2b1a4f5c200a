// Micro-bench of the health checker (not a test; nothing is asserted): real
// TCP probes against real listeners on loopback, 1,000 and 10,000 backends at
// a 1 s period. Measures sustained probes/s, how late probes start against
// their schedule, and the checker process's CPU (process.cpuUsage). The
// listeners run in a child process so their accept work is not counted.
// Loopback only: one address (127.0.0.1), one port per backend.
//
//   node dist/bench/health.js [--backends 1000,10000] [--period 1] [--duration 10]
//                             [--warmup 3] [--max-in-flight 256]
// Prints one JSON object per backend count on stdout.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Registry } from 'prom-client';
import { HealthChecker } from '../agent/health/checker';
import type { ServiceSpec } from '../agent/config/types';

const LISTENER = `
const net = require('net');
const n = Number(process.argv[1]);
const ports = [];
let open = 0;
const onConn = (s) => { s.on('error', () => {}); s.resume(); };
function next() {
  if (ports.length === n) { process.stdout.write(JSON.stringify(ports) + '\\n'); return; }
  const srv = net.createServer(onConn);
  srv.on('error', (e) => { process.stderr.write(String(e) + '\\n'); process.exit(1); });
  srv.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => { ports.push(srv.address().port); next(); });
}
next();
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

interface Args { backends: number[]; period: number; duration: number; warmup: number; maxInFlight: number }

function parseArgs(argv: string[]): Args {
  const a: Args = { backends: [1000, 10_000], period: 1, duration: 10, warmup: 3, maxInFlight: 256 };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--backends': a.backends = String(v).split(',').map(Number); i++; break;
      case '--period': a.period = Number(v); i++; break;
      case '--duration': a.duration = Number(v); i++; break;
      case '--warmup': a.warmup = Number(v); i++; break;
      case '--max-in-flight': a.maxInFlight = Number(v); i++; break;
      default: throw new Error(`unknown argument ${argv[i]}`);
    }
  }
  return a;
}

async function startListeners(n: number): Promise<{ ports: number[]; child: ChildProcess }> {
  const child = spawn(process.execPath, ['-e', LISTENER, String(n)], { stdio: ['pipe', 'pipe', 'inherit'] });
  let buf = '';
  const ports = await new Promise<number[]>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      const nl = buf.indexOf('\n');
      if (nl >= 0) resolve(JSON.parse(buf.slice(0, nl)) as number[]);
    });
    child.once('exit', (code) => reject(new Error(`listener exited ${code}`)));
  });
  return { ports, child };
}

function services(ports: number[], period: number): ServiceSpec[] {
  return ports.map((port, i) => ({
    key: `bench/s${i}`, name: `s${i}`, namespace: 'bench', ipam: 'pool', primaryService: undefined, loadBalancerIP: undefined,
    vrid: undefined, priority: undefined,
    ports: [{ name: 'tcp', port: 80, protocol: 'TCP', targetPort: port }],
    backends: [{ address: '127.0.0.1', addressNum: 0x7f000001, weight: 1 }],
    sourceIP: 'snat', topology: 'any',
    healthCheck: {
      enabled: true, type: 'tcp', port, successThreshold: 1, failureThreshold: 3,
      periodSeconds: period, timeoutSeconds: Math.min(3, period), http: undefined, passiveFailures: 3,
    },
  }));
}

/** CPU seconds (user + system) of a process, from /proc (Linux); undefined elsewhere. */
function procCpuSeconds(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
  } catch { return undefined; }
}

const pct = (sorted: number[], p: number): number => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]! : 0);
const r2 = (x: number): number => Math.round(x * 100) / 100;

async function runOne(n: number, a: Args): Promise<Record<string, unknown>> {
  const { ports, child } = await startListeners(n);
  const hc = new HealthChecker({ registry: new Registry(), maxInFlight: a.maxInFlight });
  let measuring = false;
  let probes = 0;
  const failures: Record<string, number> = {};
  const lags: number[] = [];
  const durations: number[] = [];
  hc.on('probe', (report, result) => {
    if (!measuring) return;
    probes++;
    if (!result.ok) failures[result.reason] = (failures[result.reason] ?? 0) + 1;
    lags.push(report.slot.started - report.slot.due);
    durations.push(result.durationMs);
  });
  hc.update(services(ports, a.period));
  const t0 = performance.now();
  hc.start();
  await new Promise((r) => setTimeout(r, a.warmup * 1000));
  const upAfterWarmup = ports.reduce((k, _p, i) => k + hc.healthy(`bench/s${i}`).length, 0);
  const before = hc.schedulerStats();
  const eld = monitorEventLoopDelay({ resolution: 10 });
  eld.enable();
  measuring = true;
  const cpu0 = process.cpuUsage();
  const lcpu0 = procCpuSeconds(child.pid);
  const m0 = performance.now();
  await new Promise((r) => setTimeout(r, a.duration * 1000));
  const cpu = process.cpuUsage(cpu0);
  const lcpu1 = procCpuSeconds(child.pid);
  const wall = (performance.now() - m0) / 1000;
  measuring = false;
  eld.disable();
  const after = hc.schedulerStats();
  hc.stop();
  child.stdin!.end();
  await new Promise((r) => child.once('exit', r));
  lags.sort((x, y) => x - y);
  durations.sort((x, y) => x - y);
  return {
    backends: n,
    periodSeconds: a.period,
    maxInFlight: a.maxInFlight,
    measuredSeconds: r2(wall),
    probesPerSecond: Math.round(probes / wall),
    expectedPerSecond: Math.round(n / a.period),
    healthyAfterWarmup: upAfterWarmup,
    failures,
    startLagMs: { p50: r2(pct(lags, 0.5)), p99: r2(pct(lags, 0.99)), max: r2(lags[lags.length - 1] ?? 0) },
    probeDurationMs: { p50: r2(pct(durations, 0.5)), p99: r2(pct(durations, 0.99)) },
    skipped: { busy: after.skippedBusy - before.skippedBusy, overrun: after.skippedOverrun - before.skippedOverrun },
    cpu: { userSeconds: r2(cpu.user / 1e6), systemSeconds: r2(cpu.system / 1e6), percentOfOneCore: r2(((cpu.user + cpu.system) / 1e6 / wall) * 100) },
    listenerCpuPercentOfOneCore: lcpu0 !== undefined && lcpu1 !== undefined ? r2(((lcpu1 - lcpu0) / wall) * 100) : null,
    cpuMicrosPerProbe: probes ? r2((cpu.user + cpu.system) / probes) : null,
    eventLoopDelayMs: { p50: r2(eld.percentile(50) / 1e6), p99: r2(eld.percentile(99) / 1e6), max: r2(eld.max / 1e6) },
    rssMB: Math.round(process.memoryUsage().rss / 2 ** 20),
    startToMeasureSeconds: r2((m0 - t0) / 1000),
  };
}

async function main(): Promise<void> {
  const a = parseArgs(process.argv.slice(2));
  for (const n of a.backends) {
    const res = await runOne(n, a);
    process.stdout.write(`${JSON.stringify(res)}\n`);
    // Let TIME_WAIT sockets of the previous run age a little.
    await new Promise((r) => setTimeout(r, 1000));
  }
}

main().catch((err) => { process.stderr.write(`${String(err)}\n`); process.exit(1); });
