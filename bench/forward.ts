// Bench of the forwarding data paths (not a test; nothing is asserted). In a
// throwaway lab (client, node holding the VIP, backends b1..b3, all network
// namespaces on one bridge; see lab/netns.ts) wrk in the client
// namespace measures, for each target:
//   direct   wrk -> b1 itself (no balancer; the ceiling of one backend)
//   kernel   lb-agent's nftables data path      VIP:80
//   proxy    lb-agent's userspace proxy          VIP:81
//   haproxy  HAProxy, mode tcp, nbthread 1       VIP:82
//   nginx    nginx stream, worker_processes 1    VIP:83
// keep-alive requests/s with p50/p99 latency, and new connections/s (wrk
// with `Connection: close`: every request is a new TCP connection through the
// balancer). Rounds are interleaved (each round visits every target, the
// order rotating per round) and the summary gives per-target medians, so a
// noisy moment on this small machine does not favour one target.
// Only lab namespaces are addressed.
//
//   node dist/bench/forward.js [--rounds 3] [--duration 5] [--warmup 1] [--connections 50]
//        [--threads 1] [--backend nginx|node] [--targets direct,kernel,proxy,haproxy,nginx]
//        [--workers N] (proxy threads; default one per CPU)
//        [--syscalls] (strace -c -f on each forwarding process during each measurement:
//        syscalls per request by name, to compare the work with HAProxy's; slows the
//        traced process, so its req/s and cpu are not comparable in such a run)
//        [--perf DIR] (perf record -g on each forwarding process during each
//        new-connection measurement, into DIR/<target>-r<round>.data; the proxy
//        runs with --perf-basic-prof so its JavaScript frames have names:
//        `perf report -i ...` splits its CPU like HAProxy's; issue 18)
// Prints one JSON object on stdout; progress on stderr.
import * as fs from 'node:fs';
import { spawn } from 'node:child_process';
import { Lab, run, waitFor } from '../lab/netns';
import { median, round } from './lib/stats';
import { startBackend } from '../lab/services';
import { startHaproxy, startNginxBackend, startNginxStream } from './lib/peers';
import { JsonLinesProc } from '../lab/forward';
import type { DriverService } from '../lab/bin/forward-driver';

const VIP = '10.99.0.50';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];
const TARGETS = ['direct', 'kernel', 'proxy', 'haproxy', 'nginx'] as const;
const DEFAULT_TARGETS = ['direct', 'kernel', 'proxy', 'haproxy', 'nginx'] as const;
type Target = (typeof TARGETS)[number];
const PORT: Record<Target, number> = { direct: 8080, kernel: 80, proxy: 81, haproxy: 82, nginx: 83 };

interface Args { rounds: number; duration: number; warmup: number; connections: number; threads: number; backend: 'nginx' | 'node'; targets: Target[]; workers: number | undefined; syscalls: boolean; perf: string | undefined }

function parseArgs(argv: string[]): Args {
  const a: Args = { rounds: 3, duration: 5, warmup: 1, connections: 50, threads: 1, backend: 'nginx', targets: [...DEFAULT_TARGETS], workers: undefined, syscalls: false, perf: undefined };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1] ?? '';
    switch (argv[i]) {
      case '--rounds': a.rounds = Math.max(1, Math.min(20, Number(v))); i++; break;
      case '--duration': a.duration = Math.max(1, Math.min(60, Number(v))); i++; break;
      case '--warmup': a.warmup = Math.max(0, Math.min(10, Number(v))); i++; break;
      case '--connections': a.connections = Math.max(1, Math.min(1000, Number(v))); i++; break;
      case '--threads': a.threads = Math.max(1, Math.min(8, Number(v))); i++; break;
      case '--backend': a.backend = v === 'node' ? 'node' : 'nginx'; i++; break;
      case '--workers': a.workers = Math.max(1, Math.min(8, Number(v))); i++; break;
      case '--syscalls': a.syscalls = true; break;
      case '--perf': a.perf = v; i++; break;
      case '--targets': a.targets = v.split(',').filter((x): x is Target => (TARGETS as readonly string[]).includes(x)); i++; break;
      default: throw new Error(`unknown argument ${argv[i]}`);
    }
  }
  return a;
}

function log(msg: string): void {
  process.stderr.write(`[bench/forward] ${msg}\n`);
}

export interface WrkResult { rps: number; p50ms: number; p99ms: number; requests: number; socketErrors: number; non2xx: number; cpuUsPerRequest?: number; syscallsPerRequest?: Record<string, number> }

/** `strace -c` summary: calls per syscall name (the total row left out). */
export function parseStraceSummary(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    // % time, seconds, usecs/call, calls, [errors], syscall
    const m = /^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?([a-z_0-9]+)\s*$/.exec(line);
    if (m && m[3] !== 'total') {
      out[m[3]!] = Number(m[1]);
      if (m[2] !== undefined) out[`${m[3]!} (errors)`] = Number(m[2]);
    }
  }
  return out;
}

/** utime+stime of a process and its children threads, in clock ticks (USER_HZ = 100). */
function cpuTicks(pid: number): number {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
    return Number(fields[11]) + Number(fields[12]);
  } catch {
    return NaN;
  }
}

function toMs(v: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(v.trim());
  if (!m) return NaN;
  const n = Number(m[1]);
  return m[2] === 'us' ? n / 1000 : m[2] === 'ms' ? n : m[2] === 's' ? n * 1000 : n * 60_000;
}

/** Parse `wrk --latency` output. */
export function parseWrk(text: string): WrkResult {
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(text)?.[1] ?? NaN);
  const p50 = /^\s+50%\s+(\S+)/m.exec(text)?.[1];
  const p99 = /^\s+99%\s+(\S+)/m.exec(text)?.[1];
  const requests = Number(/(\d+) requests in/.exec(text)?.[1] ?? NaN);
  const se = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(text);
  const socketErrors = se ? Number(se[1]) + Number(se[2]) + Number(se[3]) + Number(se[4]) : 0;
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(text)?.[1] ?? 0);
  return { rps, p50ms: p50 ? toMs(p50) : NaN, p99ms: p99 ? toMs(p99) : NaN, requests, socketErrors, non2xx };
}



/** HAProxy (one thread) balancing the backends on the VIP; the pid of the process that forwards. */
async function haproxyPid(lab: Lab, ns: string): Promise<number> {
  const p = await startHaproxy(lab, ns, 'haproxy', {
    threads: 1, bind: `${VIP}:${PORT.haproxy}`, servers: BACKENDS.map((b, i) => ({ name: `b${i + 1}`, address: `${b}:8080` })),
  });
  return p.proc.pid!;
}

/** nginx stream (one worker) balancing the backends on the VIP; the pid of its worker, which does the forwarding. */
async function nginxWorkerPid(lab: Lab, ns: string): Promise<number> {
  const master = (await startNginxStream(lab, ns, 'nginx-lb', { workers: 1, frontends: [{ listen: `${VIP}:${PORT.nginx}`, servers: BACKENDS.map((b) => `${b}:8080`) }] })).proc;
  // The one worker does the forwarding; the master only supervises.
  return waitFor('nginx worker', async () => {
    const kids = fs.readFileSync(`/proc/${master.pid}/task/${master.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
    return kids.length > 0 ? Number(kids[0]) : undefined;
  }, 10_000);
}

function service(port: number): DriverService {
  return {
    key: 'bench/web', vip: VIP,
    ports: [{ name: 'http', port, protocol: 'TCP', targetPort: 8080 }],
    healthy: BACKENDS.map((address) => ({ address, weight: 1 })),
    backends: BACKENDS.map((address) => ({ address, weight: 1 })),
  };
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  if (process.getuid?.() !== 0) throw new Error('needs root (network namespaces)');
  const loadAtStart = fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const lab = await Lab.create();
  try {
    const tune = 'sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096';
    const client = await lab.addHost('client', { address: '10.99.0.2/24' });
    const node = await lab.addHost('node', { address: '10.99.0.10/24', extraAddresses: [`${VIP}/24`] });
    await lab.sh(client, tune);
    await lab.sh(node, tune);
    for (let i = 0; i < BACKENDS.length; i++) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${BACKENDS[i]}/24` });
      await lab.sh(ns, tune);
      if (args.backend === 'nginx') await startNginxBackend(lab, ns, `b${i + 1}`);
      else await startBackend(lab, ns, `b${i + 1}`, [8080]);
    }
    log(`lab up: ${args.backend} backends; targets ${args.targets.join(',')}`);

    // The process doing the forwarding, per userspace target: its CPU time per request is
    // reported too (robust where throughput is not: this machine's other load).
    const pids: Partial<Record<Target, number>> = {};
    let proxy: JsonLinesProc | undefined;
    // perf names JavaScript frames from /tmp/perf-<pid>.map, which V8 writes with this flag.
    if (args.perf !== undefined) { fs.mkdirSync(args.perf, { recursive: true }); process.env['NODE_OPTIONS'] = `${process.env['NODE_OPTIONS'] ?? ''} --perf-basic-prof`.trim(); }
    if (args.targets.includes('proxy')) {
      proxy = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'proxy', '--log-level', 'warn', ...(args.workers !== undefined ? ['--workers', String(args.workers)] : [])], 'proxy');
      await proxy.request({ cmd: 'apply', state: { services: [service(PORT.proxy)] } });
      pids.proxy = proxy.proc.pid;
    }
    if (args.targets.includes('haproxy')) pids.haproxy = await haproxyPid(lab, node);
    if (args.targets.includes('nginx')) pids.nginx = await nginxWorkerPid(lab, node);

    const url = (target: Target): string => `http://${target === 'direct' ? BACKENDS[0] : VIP}:${PORT[target]}/`;
    const wrk = async (target: Target, close: boolean, seconds: number): Promise<WrkResult> => {
      const a = [`-t${args.threads}`, `-c${args.connections}`, `-d${seconds}s`, '--latency', '--timeout', '5s'];
      if (close) a.push('-H', 'Connection: close');
      const pid = pids[target];
      const before = pid !== undefined ? cpuTicks(pid) : NaN;
      const traceFile = `/tmp/lb-bench-strace-${process.pid}-${target}.txt`;
      const tracer = args.syscalls && pid !== undefined
        ? spawn('strace', ['-c', '-f', '-p', String(pid), '-o', traceFile], { stdio: 'ignore' })
        : undefined;
      const perf = args.perf !== undefined && close && pid !== undefined && seconds === args.duration
        ? spawn('perf', ['record', '-q', '-g', '-p', String(pid), '-o', `${args.perf}/${target}-r${perfRound}.data`], { stdio: 'ignore' })
        : undefined;
      if (tracer || perf) await new Promise((r) => setTimeout(r, 300)); // attached to every thread
      const r = await lab.exec(client, 'wrk', [...a, url(target)], { timeoutMs: (seconds + 30) * 1000 });
      const after = pid !== undefined ? cpuTicks(pid) : NaN;
      const res = parseWrk(r.stdout);
      if (pid !== undefined) res.cpuUsPerRequest = round(((after - before) * 10_000) / res.requests);
      if (perf) {
        const exited = new Promise((r) => perf.once('exit', r));
        perf.kill('SIGINT');
        await exited;
      }
      if (tracer) {
        const exited = new Promise((r) => tracer.once('exit', r));
        tracer.kill('SIGINT');
        await exited;
        const calls = parseStraceSummary(fs.readFileSync(traceFile, 'utf8'));
        fs.rmSync(traceFile, { force: true });
        res.syscallsPerRequest = Object.fromEntries(Object.entries(calls).map(([k, n]) => [k, round(n / res.requests, 2)]));
      }
      return res;
    };

    // The kernel path only exists while it is measured: its nat hooks turn on
    // conntrack for every connection in the node namespace, which would tax
    // the userspace targets' connections too.
    const withTarget = async <T>(target: Target, fn: () => Promise<T>): Promise<T> => {
      if (target !== 'kernel') return fn();
      const k = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'kernel', '--log-level', 'warn'], 'kernel');
      try {
        await k.request({ cmd: 'apply', state: { services: [service(PORT.kernel)] } });
        return await fn();
      } finally {
        await k.request({ cmd: 'stop' }).catch(() => undefined);
        await k.close();
        await run('ip', ['netns', 'exec', node, 'conntrack', '-F'], { allowFail: true });
      }
    };

    const raw: { round: number; target: Target; mode: 'keepalive' | 'close'; result: WrkResult }[] = [];
    let perfRound = 0;
    for (let round = 0; round < args.rounds; round++) {
      perfRound = round;
      const order = args.targets.map((_, i) => args.targets[(i + round) % args.targets.length]!);
      for (const target of order) {
        await withTarget(target, async () => {
          for (const mode of ['keepalive', 'close'] as const) {
            if (args.warmup > 0) await wrk(target, mode === 'close', args.warmup);
            const result = await wrk(target, mode === 'close', args.duration);
            raw.push({ round, target, mode, result });
            log(`round ${round + 1}/${args.rounds} ${target.padEnd(7)} ${mode.padEnd(9)} ${result.rps.toFixed(0).padStart(7)} req/s p50 ${result.p50ms.toFixed(3)} ms p99 ${result.p99ms.toFixed(3)} ms${result.cpuUsPerRequest !== undefined ? ` cpu ${result.cpuUsPerRequest} us/req` : ''}${result.socketErrors || result.non2xx ? ` errors ${result.socketErrors} non2xx ${result.non2xx}` : ''}`);
            if (result.syscallsPerRequest) log(`  syscalls/req ${Object.entries(result.syscallsPerRequest).filter(([, n]) => n >= 0.01).sort((x, y) => y[1] - x[1]).map(([k, n]) => `${k} ${n}`).join(', ')}`);
          }
        });
      }
    }

    const summary: Record<string, unknown> = {};
    for (const target of args.targets) {
      const pick = (mode: 'keepalive' | 'close') => raw.filter((r) => r.target === target && r.mode === mode).map((r) => r.result);
      const ka = pick('keepalive');
      const nc = pick('close');
      const ms = (xs: WrkResult[], k: 'p50ms' | 'p99ms'): number => Math.round(median(xs.map((r) => r[k])) * 1000) / 1000;
      const cpu = (xs: WrkResult[]): number | null => (pids[target] !== undefined ? round(median(xs.map((r) => r.cpuUsPerRequest ?? NaN))) : null);
      summary[target] = {
        keepalive: { requestsPerSec: round(median(ka.map((r) => r.rps))), p50ms: ms(ka, 'p50ms'), p99ms: ms(ka, 'p99ms'), cpuUsPerRequest: cpu(ka) },
        newConnections: { connectionsPerSec: round(median(nc.map((r) => r.rps))), p50ms: ms(nc, 'p50ms'), p99ms: ms(nc, 'p99ms'), cpuUsPerConnection: cpu(nc) },
        errors: [...ka, ...nc].reduce((s, r) => s + r.socketErrors + r.non2xx, 0),
      };
    }
    process.stdout.write(`${JSON.stringify({
      bench: 'forward',
      config: {
        ...args, cpus: (await run('nproc', [])).stdout.trim(), wrk: `-t${args.threads} -c${args.connections} -d${args.duration}s`,
        directTarget: 'b1 only', loadAverageAtStart: loadAtStart, loadAverageAtEnd: fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
        cpuNote: 'cpuUs*: utime+stime of the forwarding process (proxy: the agent driver; haproxy; the nginx worker) per request; the kernel path works in softirq, not attributable',
      },
      summary,
      raw,
    }, null, 2)}\n`);
    if (proxy) await proxy.close();
  } finally {
    await lab.destroy();
  }
}

if (require.main === module) {
  main().catch((e: unknown) => { process.stderr.write(`${String((e as Error).stack ?? e)}\n`); process.exitCode = 1; });
}

