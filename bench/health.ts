// Micro-bench of the health checker (not a test; nothing is asserted): real
// TCP probes against real listeners on loopback, 1,000 and 10,000 backends at
// a 1 s period. Measures sustained probes/s, how late probes start against
// their schedule, and the checker process's CPU (process.cpuUsage). The
// listeners run in a child process so their accept work is not counted.
// Loopback only: one address (127.0.0.1), one port per backend.
//
// Paths (issue 18), each in the same run: `native`, the addon's batch prober
// (the default; the checker is told not to fall back), which closes as
// HAProxy does (SYN, SYN-ACK, RST); `native-fin`, the same with the FIN close
// it made before (the before/after of that change); `native-rst`, a RST after
// the full handshake; `node`, one Node
// socket per probe (the fallback, and the only path before issue 18); `own`,
// the native path with a stand-in addon that answers every connect at once
// without a socket: the checker's own cost per probe (scheduler, thresholds,
// metrics, the prober's TypeScript side), the kernel's TCP work left out;
// `haproxy`, HAProxy (one thread) checking the same listeners with `check
// inter <period>`, its CPU from /proc. Every path's rate is also counted by
// the kernel: TCP ActiveOpens of the namespace (/proc/net/snmp), i.e. SYNs
// sent, since HAProxy's L4 check never completes a connection the listeners
// could count (SYN, SYN-ACK, then its RST instead of the ACK: TCP_QUICKACK
// off and an abortive close), and neither does our default.
//
//   node dist/bench/health.js [--backends 1000,10000] [--period 1] [--duration 10]
//                             [--warmup 3] [--max-in-flight 1024] [--paths native,native-fin,native-rst,node,own,haproxy]
// Prints one JSON object per backend count and path on stdout.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Registry } from 'prom-client';
import { constants as osConstants } from 'node:os';
import { HealthChecker, type TcpProberFactory } from '../agent/health/checker';
import { NativeTcpProber, type ProbeClose } from '../agent/health/native-probe';
import { NodeTcpProber } from '../agent/health/probe';
import type { ServiceSpec } from '../agent/config/types';
import type { NativeAddon, NativeTcpProbeHandle } from '../agent/native/native';
import { startCheckingHaproxy } from './lib/haproxy-checks';

// The listeners: prints the ports as one JSON line, then answers each
// "count" line on stdin with the connections accepted so far.
const LISTENER = `
const net = require('net');
const n = Number(process.argv[1]);
const ports = [];
let accepted = 0;
const onConn = (s) => { accepted++; s.on('error', () => {}); s.resume(); };
function next() {
  if (ports.length === n) { process.stdout.write(JSON.stringify(ports) + '\\n'); return; }
  const srv = net.createServer(onConn);
  srv.on('error', (e) => { process.stderr.write(String(e) + '\\n'); process.exit(1); });
  srv.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => { ports.push(srv.address().port); next(); });
}
next();
let buf = '';
process.stdin.on('data', (d) => {
  buf += d;
  let nl;
  while ((nl = buf.indexOf('\\n')) >= 0) { buf = buf.slice(nl + 1); process.stdout.write(JSON.stringify({ accepted }) + '\\n'); }
});
process.stdin.on('end', () => process.exit(0));
`;

type Path = 'native' | 'native-fin' | 'native-rst' | 'node' | 'own' | 'haproxy';
const PATHS: readonly Path[] = ['native', 'native-fin', 'native-rst', 'node', 'own', 'haproxy'];
interface Args { backends: number[]; period: number; duration: number; warmup: number; maxInFlight: number; paths: Path[] }

function parseArgs(argv: string[]): Args {
  const a: Args = { backends: [1000, 10_000], period: 1, duration: 10, warmup: 3, maxInFlight: 1024, paths: ['native', 'node'] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--backends': a.backends = String(v).split(',').map(Number); i++; break;
      case '--period': a.period = Number(v); i++; break;
      case '--duration': a.duration = Number(v); i++; break;
      case '--warmup': a.warmup = Number(v); i++; break;
      case '--max-in-flight': a.maxInFlight = Number(v); i++; break;
      case '--paths': a.paths = String(v).split(',').map((p) => { if (!(PATHS as readonly string[]).includes(p)) throw new Error(`--paths: ${PATHS.join(', ')}, not ${p}`); return p as Path; }); i++; break;
      default: throw new Error(`unknown argument ${argv[i]}`);
    }
  }
  return a;
}

interface Listeners {
  ports: number[];
  child: ChildProcess;
  /** Connections accepted so far, across all listeners. */
  accepted(): Promise<number>;
  close(): Promise<void>;
}

async function startListeners(n: number): Promise<Listeners> {
  const child = spawn(process.execPath, ['-e', LISTENER, String(n)], { stdio: ['pipe', 'pipe', 'inherit'] });
  let buf = '';
  const lines: string[] = [];
  let wake: (() => void) | undefined;
  child.stdout.on('data', (d: Buffer) => {
    buf += d.toString();
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) { lines.push(buf.slice(0, nl)); buf = buf.slice(nl + 1); }
    wake?.();
  });
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const nextLine = async (): Promise<string> => {
    while (lines.length === 0) {
      if (child.exitCode !== null) throw new Error(`listener exited ${child.exitCode}`);
      await Promise.race([new Promise<void>((r) => { wake = r; }), exited]);
    }
    return lines.shift()!;
  };
  const ports = JSON.parse(await nextLine()) as number[];
  return {
    ports, child,
    accepted: async () => {
      child.stdin.write('count\n');
      return (JSON.parse(await nextLine()) as { accepted: number }).accepted;
    },
    close: async () => { child.stdin.end(); await exited; },
  };
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

/**
 * For the `own` path: an addon whose TcpProbeHandle opens no socket and
 * reports every connect as made on the next turn of the event loop, in
 * batches, as the real one does.
 */
function instantAddon(): NativeAddon {
  class InstantHandle implements NativeTcpProbeHandle {
    private pending: number[] = [];
    private armed = false;
    constructor(private readonly cb: (count: number) => void, private readonly ids: Uint32Array, private readonly errnos: Int32Array) {}
    connect(ids: Uint32Array, _addrs: Uint32Array, _ports: Uint16Array, count: number, out: Int32Array): void {
      for (let i = 0; i < count; i++) { this.pending.push(ids[i]!); out[i] = osConstants.errno.EINPROGRESS; }
      if (!this.armed) { this.armed = true; setImmediate(() => this.report()); }
    }
    private report(): void {
      this.armed = false;
      const all = this.pending;
      this.pending = [];
      for (let k = 0; k < all.length; k += this.ids.length) {
        const n = Math.min(this.ids.length, all.length - k);
        for (let i = 0; i < n; i++) { this.ids[i] = all[k + i]!; this.errnos[i] = 0; }
        this.cb(n);
      }
    }
    cancel(): boolean { return false; }
    sweep(): number { return 0; }
    trim(): number { return 0; }
    stats(): ReturnType<NativeTcpProbeHandle['stats']> { return { connecting: this.pending.length, closing: 0, swept: 0, idle: 0, reused: 0, trimmed: 0 }; }
    close(): void { this.pending = []; }
  }
  return { TcpProbeHandle: InstantHandle } as unknown as NativeAddon;
}

async function runChecker(n: number, path: Exclude<Path, 'haproxy'>, a: Args): Promise<Record<string, unknown>> {
  const listeners = await startListeners(path === 'own' ? 0 : n);
  const { ports, child } = listeners;
  // Each path is injected as the checker's TCP prober: a native one that cannot start throws, never falls back silently.
  const native = (close: ProbeClose | undefined, addon?: () => NativeAddon): TcpProberFactory => (onOutcome, clock) =>
    new NativeTcpProber({ onOutcome, clock, ...(close ? { close } : {}), ...(addon ? { addon } : {}) });
  const tcpProber: TcpProberFactory = path === 'own' ? native(undefined, instantAddon)
    : path === 'native-fin' ? native('fin')
    : path === 'native-rst' ? native('reset')
    : path === 'node' ? (onOutcome) => new NodeTcpProber(onOutcome)
    : native(undefined);
  const hc = new HealthChecker({ registry: new Registry(), maxInFlight: a.maxInFlight, tcpProber });
  if (path === 'own') for (let i = 0; i < n; i++) ports.push(1024 + (i % 60_000));
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
  const acc0 = await listeners.accepted();
  const open0 = activeOpens();
  const cpu0 = process.cpuUsage();
  const lcpu0 = procCpuSeconds(child.pid);
  const m0 = performance.now();
  await new Promise((r) => setTimeout(r, a.duration * 1000));
  const cpu = process.cpuUsage(cpu0);
  const lcpu1 = procCpuSeconds(child.pid);
  const open1 = activeOpens();
  const wall = (performance.now() - m0) / 1000;
  measuring = false;
  eld.disable();
  const acc1 = await listeners.accepted();
  const after = hc.schedulerStats();
  const prober = hc.proberStats();
  hc.stop();
  await listeners.close();
  lags.sort((x, y) => x - y);
  durations.sort((x, y) => x - y);
  return {
    backends: n,
    path: path === 'own' || path.startsWith('native-') ? path : hc.probePath(),
    periodSeconds: a.period,
    maxInFlight: a.maxInFlight,
    measuredSeconds: r2(wall),
    probesPerSecond: Math.round(probes / wall),
    expectedPerSecond: Math.round(n / a.period),
    connectsPerSecond: Math.round((open1 - open0) / wall),
    acceptedPerSecond: Math.round((acc1 - acc0) / wall),
    healthyAfterWarmup: upAfterWarmup,
    failures,
    startLagMs: { p50: r2(pct(lags, 0.5)), p99: r2(pct(lags, 0.99)), max: r2(lags[lags.length - 1] ?? 0) },
    probeDurationMs: { p50: r2(pct(durations, 0.5)), p99: r2(pct(durations, 0.99)) },
    skipped: { busy: after.skippedBusy - before.skippedBusy, overrun: after.skippedOverrun - before.skippedOverrun },
    // Native path, whole run: connect() calls into the addon, and sockets closed
    // by the grace sweep because the backend had not closed its side in time
    // (a listener that falls behind shows here first); in the reset modes, probes
    // that took a kept socket instead of a new one, and the sockets kept at the end.
    prober: path.startsWith('native') && prober ? { started: prober.started, batches: prober.batches, sweptWithoutBackendFin: prober.swept, reusedSockets: prober.reused, keptSockets: prober.idle } : undefined,
    cpu: { userSeconds: r2(cpu.user / 1e6), systemSeconds: r2(cpu.system / 1e6), percentOfOneCore: r2(((cpu.user + cpu.system) / 1e6 / wall) * 100) },
    listenerCpuPercentOfOneCore: lcpu0 !== undefined && lcpu1 !== undefined ? r2(((lcpu1 - lcpu0) / wall) * 100) : null,
    cpuMicrosPerProbe: probes ? r2((cpu.user + cpu.system) / probes) : null,
    eventLoopDelayMs: { p50: r2(eld.percentile(50) / 1e6), p99: r2(eld.percentile(99) / 1e6), max: r2(eld.max / 1e6) },
    rssMB: Math.round(process.memoryUsage().rss / 2 ** 20),
    startToMeasureSeconds: r2((m0 - t0) / 1000),
  };
}

/** TCP connections this namespace opened so far (Tcp ActiveOpens, /proc/net/snmp): SYNs sent. */
function activeOpens(): number {
  const lines = readFileSync('/proc/net/snmp', 'utf8').split('\n').filter((l) => l.startsWith('Tcp:'));
  const names = lines[0]!.split(/\s+/);
  const values = lines[1]!.split(/\s+/);
  return Number(values[names.indexOf('ActiveOpens')]);
}

/** RSS of a process in MiB, from /proc (Linux). */
function procRssMiB(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Math.round(Number(m[1]) / 1024) : null;
  } catch { return null; }
}

/**
 * HAProxy (one thread) checking every listener, `check inter <period>` with
 * the checker's own fall/rise/timeout: one backend, one server per listener.
 * Its rate is what the listeners accept; its CPU is /proc's.
 */
async function runHaproxy(n: number, a: Args): Promise<Record<string, unknown>> {
  const listeners = await startListeners(n);
  const hap = startCheckingHaproxy({
    mode: 'tcp', timeoutCheckMs: Math.round(Math.min(3, a.period) * 1000),
    backend: [`default-server check inter ${Math.round(a.period * 1000)}ms fall 3 rise 1`],
    servers: listeners.ports.map((p) => `127.0.0.1:${p}`),
  });
  try {
    await new Promise((r) => setTimeout(r, a.warmup * 1000));
    hap.assertRunning();
    const acc0 = await listeners.accepted();
    const open0 = activeOpens();
    const c0 = procCpuSeconds(hap.proc.pid);
    const m0 = performance.now();
    await new Promise((r) => setTimeout(r, a.duration * 1000));
    const c1 = procCpuSeconds(hap.proc.pid);
    const open1 = activeOpens();
    const wall = (performance.now() - m0) / 1000;
    const acc1 = await listeners.accepted();
    const rss = procRssMiB(hap.proc.pid);
    const checks = open1 - open0;
    const cpuSec = c0 !== undefined && c1 !== undefined ? c1 - c0 : NaN;
    return {
      backends: n, path: 'haproxy', periodSeconds: a.period, measuredSeconds: r2(wall),
      probesPerSecond: Math.round(checks / wall), expectedPerSecond: Math.round(n / a.period),
      connectsPerSecond: Math.round(checks / wall), acceptedPerSecond: Math.round((acc1 - acc0) / wall),
      cpu: { percentOfOneCore: r2((cpuSec / wall) * 100) },
      cpuMicrosPerProbe: checks ? r2((cpuSec * 1e6) / checks) : null,
      rssMB: rss,
    };
  } finally {
    await hap.stop();
    await listeners.close();
  }
}

async function main(): Promise<void> {
  const a = parseArgs(process.argv.slice(2));
  for (const n of a.backends) {
    for (const path of a.paths) {
      const res = path === 'haproxy' ? await runHaproxy(n, a) : await runChecker(n, path, a);
      process.stdout.write(`${JSON.stringify(res)}\n`);
      // Let TIME_WAIT sockets of the previous run age a little.
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

main().catch((err) => { process.stderr.write(`${String(err)}\n`); process.exit(1); });
