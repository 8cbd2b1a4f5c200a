// Bench area "forward": the data paths on the same traffic in the same run.
// A lab of a client, a node and three nginx backends (b1 also runs an iperf3
// server). Each target runs only during its own slot, so nothing idle taxes
// the others (the kernel path's nat hooks would turn conntrack on for every
// connection in the node namespace):
//   direct     wrk -> b1 itself: no balancer, the limit of one backend
//   kernel     the real `lb-agent run` with dataplane: kernel (nftables)
//   proxy      the real `lb-agent run` with dataplane: proxy (userspace)
//   haproxy1   HAProxy mode tcp, nbthread 1
//   haproxy    HAProxy mode tcp, its default threads (one per CPU)
//   nginx      nginx stream, one worker
// Per slot: keep-alive requests/s with p50/p99 (wrk), new connections/s (wrk
// with `Connection: close`), bulk throughput of one TCP stream (iperf3; the
// bulk port has b1 only, as iperf3's control and data connections must reach
// the same server), and the balancer's memory after the load. Rounds visit
// every target in a rotated order; the summary is the median per target.
// Only lab namespaces are addressed.
import { Lab, run, waitFor } from '../lab/netns';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, FAST_ARP, type AgentHandle } from './lib/agent';
import { startNginxBackend, startIperfServer, startHaproxy, startNginxStream, type Peer } from './lib/peers';
import { runWrk, runIperf, type WrkResult, type IperfResult } from './lib/load';
import { treeMemoryMiB } from './lib/procfs';
import { median, round, rotate } from './lib/stats';

const CLIENT = '10.99.0.2';
const NODE = '10.99.0.10';
const AGENT_VIP = '10.99.0.50';
const PEER_VIP = '10.99.0.60';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];

export const FORWARD_TARGETS = ['direct', 'kernel', 'proxy', 'proxy-v8defaults', 'haproxy1', 'haproxy', 'nginx'] as const;
export type ForwardTarget = (typeof FORWARD_TARGETS)[number];

export const FORWARD_LABELS: Record<ForwardTarget, string> = {
  direct: 'direct to one backend (the limit)',
  kernel: 'lb-agent, kernel path (nftables)',
  proxy: 'lb-agent, proxy path (userspace)',
  'proxy-v8defaults': 'lb-agent, proxy path, without the unit\'s V8 flags (what they cost)',
  haproxy1: 'HAProxy, 1 thread',
  haproxy: 'HAProxy, default threads',
  nginx: 'nginx stream, 1 worker',
};

/** HTTP port and iperf3 port of each target. */
const ENDPOINT: Record<ForwardTarget, { host: string; http: number; bulk: number }> = {
  direct: { host: BACKENDS[0]!, http: 8080, bulk: 5201 },
  kernel: { host: AGENT_VIP, http: 80, bulk: 5201 },
  proxy: { host: AGENT_VIP, http: 80, bulk: 5201 },
  'proxy-v8defaults': { host: AGENT_VIP, http: 80, bulk: 5201 },
  haproxy1: { host: PEER_VIP, http: 82, bulk: 5202 },
  haproxy: { host: PEER_VIP, http: 84, bulk: 5204 },
  nginx: { host: PEER_VIP, http: 83, bulk: 5203 },
};

export interface ForwardOptions {
  rounds: number;
  /** Seconds per wrk and iperf3 measurement. */
  seconds: number;
  /** Seconds of wrk warm-up before each wrk measurement (0: none). */
  warmup: number;
  connections: number;
  threads: number;
  targets: ForwardTarget[];
  log: (msg: string) => void;
}

export interface ForwardSample {
  round: number; target: ForwardTarget;
  keepalive: WrkResult; close: WrkResult; bulk: IperfResult;
  memory: { rssMiB: number; hwmMiB: number; processes: number } | undefined;
}

export interface ForwardTargetSummary {
  label: string;
  keepalive: { requestsPerSec: number; p50ms: number; p99ms: number };
  newConnections: { connectionsPerSec: number; p50ms: number; p99ms: number };
  bulkGbps: number;
  /** Balancer memory after the load (the agent's whole process for kernel and proxy). */
  rssMiB: number;
  peakRssMiB: number;
  errors: number;
  samples: number;
}

export interface ForwardResult {
  config: Omit<ForwardOptions, 'log'> & { wrk: string; iperf3: string; backends: string; threadsDefaultHaproxy: string };
  summary: Partial<Record<ForwardTarget, ForwardTargetSummary>>;
  raw: ForwardSample[];
  /** Targets that could not be measured in a round, and why. */
  errors: string[];
}

function agentConfig(dataplane: 'kernel' | 'proxy'): Record<string, unknown> {
  return {
    node: { name: 'bench', interface: 'eth0' },
    metrics: { listen: '' },
    dataplane,
    pools: { 'range-global': `${AGENT_VIP}-10.99.0.51` },
    arp: FAST_ARP,
    services: [
      { name: 'web', ipam: 'pool', loadBalancerIP: AGENT_VIP, ports: [{ name: 'http', port: 80, targetPort: 8080 }], backends: BACKENDS },
      { name: 'bulk', primaryService: 'web', ports: [{ name: 'iperf', port: 5201, targetPort: 5201 }], backends: [BACKENDS[0]!], healthCheck: { port: 8080 } },
    ],
  };
}

interface Running { pid: number | undefined; stop(): Promise<void> }

/** Start what serves a target; undefined for direct (nothing in between). */
async function startTarget(lab: Lab, node: string, target: ForwardTarget, slot: number): Promise<Running | undefined> {
  const servers = BACKENDS.map((b, i) => ({ name: `b${i + 1}`, address: `${b}:8080` }));
  const bulkServer = [{ name: 'b1', address: `${BACKENDS[0]}:5201` }];
  const ep = ENDPOINT[target];
  const peer = (p: Peer): Running => ({ pid: p.proc.pid, stop: () => p.stop() });
  switch (target) {
    case 'direct':
      return undefined;
    case 'kernel':
    case 'proxy':
    case 'proxy-v8defaults': {
      // Every agent runs with the unit's V8 flags (NODE_OPTIONS, issue 18) but
      // proxy-v8defaults, which shows what they cost the proxy path.
      const dataplane = target === 'kernel' ? 'kernel' : 'proxy';
      const agent: AgentHandle = await runAgent(lab, node, agentConfig(dataplane), { name: `fwd-${target}-${slot}`, ...(target === 'proxy-v8defaults' ? { nodeOptions: '' } : {}) });
      await waitStatus(agent, `${target} agent serving`, (s) => s.services.length === 2 && s.services.every((x) => x.ready) && s.services[0]!.healthyBackends === BACKENDS.length, 30_000);
      return {
        pid: agent.proc.pid,
        stop: async () => {
          await stopAgent(agent);
          // The kernel path's connections linger in conntrack; the next slot starts clean.
          await run('ip', ['netns', 'exec', node, 'conntrack', '-F'], { allowFail: true });
        },
      };
    }
    case 'haproxy1':
    case 'haproxy':
      return peer(await startHaproxy(lab, node, `${target}-${slot}`, {
        threads: target === 'haproxy1' ? 1 : undefined,
        bind: `${ep.host}:${ep.http}`, servers,
        extra: [{ name: 'bulk', bind: `${ep.host}:${ep.bulk}`, servers: bulkServer }],
      }));
    case 'nginx':
      return peer(await startNginxStream(lab, node, `nginx-lb-${slot}`, {
        workers: 1,
        frontends: [
          { listen: `${ep.host}:${ep.http}`, servers: servers.map((s) => s.address) },
          { listen: `${ep.host}:${ep.bulk}`, servers: bulkServer.map((s) => s.address) },
        ],
      }));
  }
}

export async function benchForward(o: ForwardOptions): Promise<ForwardResult> {
  const lab = await Lab.create();
  const raw: ForwardSample[] = [];
  const errors: string[] = [];
  try {
    const tune = 'sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096';
    const client = await lab.addHost('client', { address: `${CLIENT}/24` });
    const node = await lab.addHost('node', { address: `${NODE}/24`, extraAddresses: [`${PEER_VIP}/24`] });
    await lab.sh(client, tune);
    await lab.sh(node, tune);
    for (let i = 0; i < BACKENDS.length; i++) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${BACKENDS[i]}/24` });
      await lab.sh(ns, tune);
      await startNginxBackend(lab, ns, `b${i + 1}`);
      if (i === 0) await startIperfServer(lab, ns, 5201);
    }
    o.log(`lab up; targets ${o.targets.join(',')}; ${o.rounds} round(s) of ${o.seconds} s measurements`);

    let slot = 0;
    for (let round = 0; round < o.rounds; round++) {
      for (const target of rotate(o.targets, round)) {
        const ep = ENDPOINT[target];
        const url = `http://${ep.host}:${ep.http}/`;
        let running: Running | undefined;
        try {
          running = await startTarget(lab, node, target, slot++);
          // Reachable before measuring: one request must get through.
          await waitFor(`${target} to answer`, async () => (await runWrk(lab, client, url, { seconds: 1, connections: 1, threads: 1, close: false })).requests > 0, 15_000, 200);
          const wrk = async (close: boolean): Promise<WrkResult> => {
            if (o.warmup > 0) await runWrk(lab, client, url, { seconds: o.warmup, connections: o.connections, threads: o.threads, close });
            return runWrk(lab, client, url, { seconds: o.seconds, connections: o.connections, threads: o.threads, close });
          };
          const keepalive = await wrk(false);
          const close = await wrk(true);
          const bulk = await runIperf(lab, client, ep.host, ep.bulk, o.seconds + 1);
          const memory = running ? treeMemoryMiB(running.pid) : undefined;
          raw.push({ round, target, keepalive, close, bulk, memory });
          o.log(`round ${round + 1}/${o.rounds} ${target.padEnd(8)} keep-alive ${keepalive.rps.toFixed(0).padStart(6)} req/s (p50 ${keepalive.p50ms.toFixed(2)} ms, p99 ${keepalive.p99ms.toFixed(2)} ms)  new conn ${close.rps.toFixed(0).padStart(6)}/s  bulk ${(bulk.bitsPerSecond / 1e9).toFixed(2)} Gbit/s${bulk.error ? ` (${bulk.error})` : ''}${memory ? `  rss ${memory.rssMiB.toFixed(1)} MiB` : ''}`);
        } catch (e) {
          // One target failing (a peer that will not start, say) costs its own numbers only.
          const error = String((e as Error).message ?? e).split('\n')[0]!.slice(0, 300);
          errors.push(`round ${round + 1} ${target}: ${error}`);
          o.log(`round ${round + 1}/${o.rounds} ${target}: FAILED: ${error}`);
        } finally {
          await running?.stop().catch(() => undefined);
        }
      }
    }

    const summary: Partial<Record<ForwardTarget, ForwardTargetSummary>> = {};
    for (const target of o.targets) {
      const s = raw.filter((r) => r.target === target);
      if (s.length === 0) continue;
      summary[target] = {
        label: FORWARD_LABELS[target],
        keepalive: { requestsPerSec: round(median(s.map((r) => r.keepalive.rps)), 0), p50ms: round(median(s.map((r) => r.keepalive.p50ms)), 3), p99ms: round(median(s.map((r) => r.keepalive.p99ms)), 3) },
        newConnections: { connectionsPerSec: round(median(s.map((r) => r.close.rps)), 0), p50ms: round(median(s.map((r) => r.close.p50ms)), 3), p99ms: round(median(s.map((r) => r.close.p99ms)), 3) },
        bulkGbps: round(median(s.map((r) => r.bulk.bitsPerSecond / 1e9)), 2),
        rssMiB: round(median(s.map((r) => r.memory?.rssMiB ?? NaN)), 1),
        peakRssMiB: round(median(s.map((r) => r.memory?.hwmMiB ?? NaN)), 1),
        errors: s.reduce((n, r) => n + r.keepalive.socketErrors + r.keepalive.non2xx + r.close.socketErrors + r.close.non2xx + (r.bulk.error ? 1 : 0), 0),
        samples: s.length,
      };
    }
    return {
      config: {
        rounds: o.rounds, seconds: o.seconds, warmup: o.warmup, connections: o.connections, threads: o.threads, targets: o.targets,
        wrk: `wrk -t${o.threads} -c${o.connections} -d${o.seconds}s --latency (new connections: -H 'Connection: close')`,
        iperf3: `iperf3 -c HOST -t ${o.seconds + 1} -O 1 (one stream)`,
        backends: 'nginx 1 worker each, 3 backends (bulk: iperf3 on b1 only)',
        threadsDefaultHaproxy: 'no nbthread: HAProxy starts one thread per CPU it may run on',
      },
      summary,
      raw,
      errors,
    };
  } finally {
    await lab.destroy();
  }
}
