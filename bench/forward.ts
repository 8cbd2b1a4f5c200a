// Bench of the forwarding data paths (not a test; nothing is asserted). In a
// throwaway lab (client, node holding the VIP, backends b1..b3, all network
// namespaces on one bridge; see lab/netns.ts) wrk in the client
// namespace measures, for each target:
//   direct   wrk -> b1 itself (no balancer; the ceiling of one backend)
//   kernel   lb-agent's nftables data path      VIP:80
//   proxy    lb-agent's userspace proxy          VIP:81
//   haproxy  HAProxy, mode tcp, nbthread 1       VIP:82
//   nginx    nginx stream, worker_processes 1    VIP:83
//   proxy-streams (only when asked) the proxy relaying with stream 'data'
//            events instead of user buffers      VIP:84
// keep-alive requests/s with p50/p99 latency, and new connections/s (wrk
// with `Connection: close`: every request is a new TCP connection through the
// balancer). Rounds are interleaved (each round visits every target, the
// order rotating per round) and the summary gives per-target medians, so a
// noisy moment on this small machine does not favour one target.
// Only lab namespaces are addressed.
//
//   node dist/bench/forward.js [--rounds 3] [--duration 5] [--warmup 1] [--connections 50]
//        [--threads 1] [--backend nginx|node] [--targets direct,kernel,proxy,haproxy,nginx]
//        (add proxy-streams to --targets to compare the proxy's two relay paths)
// Prints one JSON object on stdout; progress on stderr.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Lab, run, waitFor } from '../lab/netns';
import { startBackend } from '../lab/services';
import { startNginxBackend } from './lib/peers';
import { JsonLinesProc } from '../lab/forward';
import type { DriverService } from '../lab/bin/forward-driver';

const VIP = '10.99.0.50';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];
const TARGETS = ['direct', 'kernel', 'proxy', 'haproxy', 'nginx', 'proxy-streams'] as const;
const DEFAULT_TARGETS = ['direct', 'kernel', 'proxy', 'haproxy', 'nginx'] as const;
type Target = (typeof TARGETS)[number];
const PORT: Record<Target, number> = { direct: 8080, kernel: 80, proxy: 81, haproxy: 82, nginx: 83, 'proxy-streams': 84 };

interface Args { rounds: number; duration: number; warmup: number; connections: number; threads: number; backend: 'nginx' | 'node'; targets: Target[] }

function parseArgs(argv: string[]): Args {
  const a: Args = { rounds: 3, duration: 5, warmup: 1, connections: 50, threads: 1, backend: 'nginx', targets: [...DEFAULT_TARGETS] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1] ?? '';
    switch (argv[i]) {
      case '--rounds': a.rounds = Math.max(1, Math.min(20, Number(v))); i++; break;
      case '--duration': a.duration = Math.max(1, Math.min(60, Number(v))); i++; break;
      case '--warmup': a.warmup = Math.max(0, Math.min(10, Number(v))); i++; break;
      case '--connections': a.connections = Math.max(1, Math.min(1000, Number(v))); i++; break;
      case '--threads': a.threads = Math.max(1, Math.min(8, Number(v))); i++; break;
      case '--backend': a.backend = v === 'node' ? 'node' : 'nginx'; i++; break;
      case '--targets': a.targets = v.split(',').filter((x): x is Target => (TARGETS as readonly string[]).includes(x)); i++; break;
      default: throw new Error(`unknown argument ${argv[i]}`);
    }
  }
  return a;
}

function log(msg: string): void {
  process.stderr.write(`[bench/forward] ${msg}\n`);
}

export interface WrkResult { rps: number; p50ms: number; p99ms: number; requests: number; socketErrors: number; non2xx: number; cpuUsPerRequest?: number }

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

function median(xs: number[]): number {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

const round2 = (x: number): number => Math.round(x * 100) / 100;

async function startHaproxy(lab: Lab, ns: string): Promise<number> {
  const conf = lab.file('haproxy.cfg');
  fs.writeFileSync(conf, `
global
  nbthread 1
  maxconn 9000
defaults
  mode tcp
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend vip
  bind ${VIP}:${PORT.haproxy}
  default_backend web
backend web
  balance roundrobin
${BACKENDS.map((b, i) => `  server b${i + 1} ${b}:8080`).join('\n')}
`);
  const p = lab.spawn(ns, 'haproxy', ['-db', '-f', conf]);
  await waitFor('haproxy', async () => (await lab.sh(ns, 'cat /proc/net/tcp', { allowFail: true })).stdout.includes(`:${PORT.haproxy.toString(16).toUpperCase().padStart(4, '0')} 00000000:0000 0A`), 10_000);
  return p.pid!;
}

async function startNginxStream(lab: Lab, ns: string): Promise<number> {
  const dir = lab.file('nginx-lb');
  fs.mkdirSync(dir, { recursive: true });
  const conf = path.join(dir, 'nginx.conf');
  fs.writeFileSync(conf, `
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
user root;
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 8192; multi_accept on; }
stream {
  upstream web {
${BACKENDS.map((b) => `    server ${b}:8080;`).join('\n')}
  }
  server {
    listen ${VIP}:${PORT.nginx} backlog=4096;
    proxy_pass web;
    proxy_connect_timeout 2s;
  }
}
`);
  const master = lab.spawn(ns, 'nginx', ['-p', dir, '-e', `${dir}/error.log`, '-c', conf]);
  await waitFor('nginx stream', async () => (await lab.sh(ns, 'cat /proc/net/tcp', { allowFail: true })).stdout.includes(`:${PORT.nginx.toString(16).toUpperCase().padStart(4, '0')} 00000000:0000 0A`), 10_000);
  // The one worker does the forwarding; the master only supervises.
  const worker = await waitFor('nginx worker', async () => {
    const kids = fs.readFileSync(`/proc/${master.pid}/task/${master.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
    return kids.length > 0 ? Number(kids[0]) : undefined;
  }, 10_000);
  return worker;
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
    if (args.targets.includes('proxy')) {
      proxy = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'proxy', '--log-level', 'warn'], 'proxy');
      await proxy.request({ cmd: 'apply', state: { services: [service(PORT.proxy)] } });
      pids.proxy = proxy.proc.pid;
    }
    let proxyStreams: JsonLinesProc | undefined;
    if (args.targets.includes('proxy-streams')) {
      proxyStreams = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'proxy', '--log-level', 'warn', '--stream-relay'], 'proxy-streams');
      await proxyStreams.request({ cmd: 'apply', state: { services: [service(PORT['proxy-streams'])] } });
      pids['proxy-streams'] = proxyStreams.proc.pid;
    }
    if (args.targets.includes('haproxy')) pids.haproxy = await startHaproxy(lab, node);
    if (args.targets.includes('nginx')) pids.nginx = await startNginxStream(lab, node);

    const url = (target: Target): string => `http://${target === 'direct' ? BACKENDS[0] : VIP}:${PORT[target]}/`;
    const wrk = async (target: Target, close: boolean, seconds: number): Promise<WrkResult> => {
      const a = [`-t${args.threads}`, `-c${args.connections}`, `-d${seconds}s`, '--latency', '--timeout', '5s'];
      if (close) a.push('-H', 'Connection: close');
      const pid = pids[target];
      const before = pid !== undefined ? cpuTicks(pid) : NaN;
      const r = await lab.exec(client, 'wrk', [...a, url(target)], { timeoutMs: (seconds + 30) * 1000 });
      const after = pid !== undefined ? cpuTicks(pid) : NaN;
      const res = parseWrk(r.stdout);
      if (pid !== undefined) res.cpuUsPerRequest = round2(((after - before) * 10_000) / res.requests);
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
    for (let round = 0; round < args.rounds; round++) {
      const order = args.targets.map((_, i) => args.targets[(i + round) % args.targets.length]!);
      for (const target of order) {
        await withTarget(target, async () => {
          for (const mode of ['keepalive', 'close'] as const) {
            if (args.warmup > 0) await wrk(target, mode === 'close', args.warmup);
            const result = await wrk(target, mode === 'close', args.duration);
            raw.push({ round, target, mode, result });
            log(`round ${round + 1}/${args.rounds} ${target.padEnd(7)} ${mode.padEnd(9)} ${result.rps.toFixed(0).padStart(7)} req/s p50 ${result.p50ms.toFixed(3)} ms p99 ${result.p99ms.toFixed(3)} ms${result.cpuUsPerRequest !== undefined ? ` cpu ${result.cpuUsPerRequest} us/req` : ''}${result.socketErrors || result.non2xx ? ` errors ${result.socketErrors} non2xx ${result.non2xx}` : ''}`);
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
      const cpu = (xs: WrkResult[]): number | null => (pids[target] !== undefined ? round2(median(xs.map((r) => r.cpuUsPerRequest ?? NaN))) : null);
      summary[target] = {
        keepalive: { requestsPerSec: round2(median(ka.map((r) => r.rps))), p50ms: ms(ka, 'p50ms'), p99ms: ms(ka, 'p99ms'), cpuUsPerRequest: cpu(ka) },
        newConnections: { connectionsPerSec: round2(median(nc.map((r) => r.rps))), p50ms: ms(nc, 'p50ms'), p99ms: ms(nc, 'p99ms'), cpuUsPerConnection: cpu(nc) },
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
    if (proxyStreams) await proxyStreams.close();
  } finally {
    await lab.destroy();
  }
}

if (require.main === module) {
  main().catch((e: unknown) => { process.stderr.write(`${String((e as Error).stack ?? e)}\n`); process.exitCode = 1; });
}

