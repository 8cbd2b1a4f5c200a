// Bench area "forward": the data paths on the same traffic in the same run.
// A lab of a client, a node and three nginx backends (b1 also runs an iperf3
// server). Each target runs only during its own slot, so nothing idle taxes
// the others (the kernel path's nat hooks would turn conntrack on for every
// connection in the node namespace):
//   direct     wrk -> b1 itself: no balancer, the limit of one backend
//   kernel     the real `lb-agent run` with dataplane: kernel (nftables)
//   ebpf       the same with `kernel.engine: ebpf`: the eBPF full-NAT engine
//              at tc ingress of the node's NIC forwards the snat flows
//              (native/bpf/nat.c), the nft table behind it; the agent runs
//              with a BPF file system of its own (the engine pins its maps)
//   ebpf1      the same engine with b1 alone behind the VIP, the backend
//              direct uses: what the engine and the node's hop cost, without
//              the spread over three nginx (as dsr1 is for DSR)
//   ebpf-xdp   ebpf with an XDP program that passes every frame attached
//              to the node's NIC (xdpdrv: veth's own XDP path): what the
//              XDP hook costs on this NIC before an XDP engine does any work
//   (ebpf1 and ebpf-xdp run in the nat area; the forward area runs them
//   only when --forward-targets names them)
//   dsr        the same with sourceIP: preserve: direct server return (issue
//              17); the backends hold its VIP on lo, so replies go from them
//              straight to the client
//   proxy      the real `lb-agent run` with dataplane: proxy (userspace),
//              its default workers (one per CPU; issue 18)
//   proxy1     the same with proxy.workers: 1
//   haproxy1   HAProxy mode tcp, nbthread 1
//   haproxy    HAProxy mode tcp, its default threads (one per CPU)
//   nginx      nginx stream, one worker
//   proxy-pp2 / haproxy-pp2   proxy and haproxy with a PROXY protocol v2
//              header to the backends (issue 17: `proxyProtocol: v2`, HAProxy
//              `send-proxy-v2`), to nginx backends' `listen 8081 proxy_protocol`
//   direct3 / dsr3 / kernel3   the like-for-like rows of issue 17: the
//              same three backends and the same client on both sides. wrk
//              runs one thread per backend (-t3, the connections rounded up
//              to a multiple: -c51); direct3 sends each thread to its own
//              backend (wrk's setup(): thread.addr), dsr3 and kernel3 send
//              all three to the VIP through the same script. Their "x direct"
//              is paired with direct3, not direct (see below); bulk is not
//              run for them (the bulk port has b1 only, as in dsr and kernel)
// Per slot: keep-alive requests/s with p50/p99 (wrk), new connections/s (wrk
// with `Connection: close`), bulk throughput of one TCP stream each way
// (iperf3, client -> server and -R server -> client, the replies' direction;
// the bulk port has b1 only, as iperf3's control and data connections must
// reach the same server), and the balancer's memory after the load. Also,
// computed rather than measured, the share of flows the DSR slot table moves
// when a backend fails, returns, or is added to or removed from the config. Rounds visit
// every target in a rotated order; the summary is the median per target.
// direct3 itself is paired with direct (the spread's own cost, client shape
// included), dsr3 and kernel3 with direct3.
// The direct path swings from round to round on this shared machine (one
// nginx worker; 95k/73k/53k req/s in one run), so keep-alive "x direct" is
// paired (issue 17): right before each target's slot, with nothing of it
// running yet, direct is measured the same way (same warm-up, duration,
// connections), and the column is the median of the per-pair ratios, for
// every target alike. The other "x direct" columns stay ratios of medians.
// What the PROXY header costs is measured the same way, closer still: the
// PROXY v2 slots (proxy-pp2, haproxy-pp2) also serve the same backends
// without the header on a second port of the same process, and each of the
// slot's keep-alive and new-connection runs is preceded and followed by the
// same run without the header; the cost is the median over rounds of the
// ratio to the mean of those two.
// Between two slots minutes apart this host's speed moved by more than the
// header costs (HAProxy's send-proxy-v2 row once came out 1.13x its plain
// one), so a ratio of two slots measured the host, not the header.
// Issue 18's proxy lines (proxy1 against haproxy1, proxy against haproxy)
// are judged the same way: the peer is started beside the target in the
// target's slot (idle while the target runs: no health checks, no timers),
// and each of the target's keep-alive and new-connection runs is preceded
// and followed by the peer's same run; the line is the median over rounds of
// the ratio to the mean of those two. Measured ~40 s apart in their own
// slots, either of the two read ~36k or ~27-30k req/s by the lab's state
// alone, so the ratio of medians moved 0.79-1.16x on the same code.
// A slot can chain more pairs (ForwardOptions.peerPairs): peer, target,
// peer, target, peer..., each target run judged against the peer runs on
// either side of it. With one pair a slot, three rounds gave three ratios
// whose spread (0.97-1.18x in one run) was wider than what the line asks
// to tell apart; the full run takes three a slot, nine a line.
// Only lab namespaces are addressed.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Lab, run, waitFor } from '../lab/netns';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, natEngineServing, FAST_ARP, OWN_BPFFS, type AgentHandle } from './lib/agent';
import { startNginxBackend, startIperfServer, startHaproxy, startNginxStream, type Peer } from './lib/peers';
import { runWrk, runIperf, wrkSpreadScript, type WrkResult, type IperfResult } from './lib/load';
import { selfTreeTicks, tcpPassiveOpens, treeContextSwitches, treeCpuSeconds, treeMemoryMiB } from './lib/procfs';
import { median, round, rotate } from './lib/stats';
import { dsrSlotTable, maglevSize, movedFraction } from '../agent/forward/maglev';

const CLIENT = '10.99.0.2';
const NODE = '10.99.0.10';
const AGENT_VIP = '10.99.0.50';
const PEER_VIP = '10.99.0.60';
/** The DSR service's VIP: on every backend's lo (never the SNAT VIP: a backend would answer its SNATed clients locally). */
const DSR_VIP = '10.99.0.52';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];

export const FORWARD_TARGETS = ['direct', 'kernel', 'ebpf', 'ebpf1', 'ebpf-xdp', 'dsr', 'dsr-nft', 'dsr1', 'direct3', 'dsr3', 'kernel3', 'proxy', 'proxy1', 'proxy-v8defaults', 'haproxy1', 'haproxy', 'nginx', 'proxy-pp2', 'haproxy-pp2'] as const;
export type ForwardTarget = (typeof FORWARD_TARGETS)[number];
/** The targets the forward area runs unless --forward-targets names others: all but the nat area's own breakdown of the engine. */
export const DEFAULT_FORWARD_TARGETS: readonly ForwardTarget[] = FORWARD_TARGETS.filter((t) => t !== 'ebpf1' && t !== 'ebpf-xdp');

export const FORWARD_LABELS: Record<ForwardTarget, string> = {
  direct: 'direct to one backend (the limit)',
  kernel: 'lb-agent, kernel path (nftables)',
  ebpf: 'lb-agent, kernel path, eBPF full-NAT engine (kernel.engine: ebpf)',
  ebpf1: 'lb-agent, kernel path, eBPF full-NAT engine to b1 alone, the backend direct uses (what the engine and the node\'s hop cost, without the spread over three nginx)',
  'ebpf-xdp': 'lb-agent, kernel path, eBPF full-NAT engine with an XDP program that passes every frame on the node\'s NIC (what the veth XDP hook alone costs)',
  dsr: 'lb-agent, kernel path, direct server return',
  'dsr-nft': 'lb-agent, kernel path, direct server return on the nft table alone (LB_AGENT_DSR_ENGINE=nft: what the BPF program saves)',
  dsr1: 'lb-agent, kernel path, direct server return to b1 alone, the backend direct uses (what forwarding costs, without the spread over three nginx)',
  direct3: 'direct to the three backends, one client thread to each (no balancer; x direct: against direct, a different client)',
  dsr3: 'lb-agent, kernel path, direct server return, the client of direct3 to the VIP (its x direct columns and CPU over: against direct3, like for like)',
  kernel3: 'lb-agent, kernel path (nftables), the client of direct3 to the VIP (its x direct columns and CPU over: against direct3, like for like)',
  proxy: 'lb-agent, proxy path (userspace), one worker per CPU',
  proxy1: 'lb-agent, proxy path, 1 worker',
  'proxy-v8defaults': 'lb-agent, proxy path, one worker per CPU, without the unit\'s V8 flags (what they cost)',
  haproxy1: 'HAProxy, 1 thread',
  haproxy: 'HAProxy, default threads',
  nginx: 'nginx stream, 1 worker',
  'proxy-pp2': 'lb-agent, proxy path, one worker per CPU, PROXY v2',
  'haproxy-pp2': 'HAProxy, default threads, send-proxy-v2',
};

/** HTTP port and iperf3 port of each target; `plain`: the same process's port without the PROXY header (pp2 targets). */
const ENDPOINT: Record<ForwardTarget, { host: string; http: number; bulk: number; plain?: number }> = {
  direct: { host: BACKENDS[0]!, http: 8080, bulk: 5201 },
  kernel: { host: AGENT_VIP, http: 80, bulk: 5201 },
  ebpf: { host: AGENT_VIP, http: 80, bulk: 5201 },
  ebpf1: { host: AGENT_VIP, http: 80, bulk: 5201 },
  'ebpf-xdp': { host: AGENT_VIP, http: 80, bulk: 5201 },
  // Direct server return cannot rewrite ports: the VIP serves the backends' own 8080.
  dsr: { host: DSR_VIP, http: 8080, bulk: 5201 },
  'dsr-nft': { host: DSR_VIP, http: 8080, bulk: 5201 },
  dsr1: { host: DSR_VIP, http: 8080, bulk: 5201 },
  direct3: { host: BACKENDS[0]!, http: 8080, bulk: 5201 },
  dsr3: { host: DSR_VIP, http: 8080, bulk: 5201 },
  kernel3: { host: AGENT_VIP, http: 80, bulk: 5201 },
  proxy: { host: AGENT_VIP, http: 80, bulk: 5201 },
  proxy1: { host: AGENT_VIP, http: 80, bulk: 5201 },
  'proxy-pp2': { host: AGENT_VIP, http: 80, bulk: 5201, plain: 81 },
  'haproxy-pp2': { host: PEER_VIP, http: 85, bulk: 5205, plain: 86 },
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
  /** Peer pairs a slot for the targets with a peer (peerOf), chained A-B-A-B-A (default 1). */
  peerPairs?: number;
  /**
   * Pair new connections and bulk (both ways) with direct as keep-alive is:
   * direct's same run right before and right after each slot (the eBPF NAT
   * area, whose targets are ratios to direct on all three). Off: those
   * columns stay ratios of medians, and DSR alone pairs its replies.
   */
  pairAll?: boolean;
  log: (msg: string) => void;
}

/**
 * A keep-alive run with the CPU the lab spent per request (µs): wrk (a reaped
 * child of the bench), the nginx backends, and the balancer's processes when
 * it is on the path. The kernel paths forward in softirq, which this kernel
 * charges to the task it interrupts (no IRQ_TIME_ACCOUNTING): wrk's and
 * nginx's sends, so their CPU includes it. Other work on the machine is
 * outside this count, unlike /proc/stat's busy time, which at 0.4-1 core of
 * other load here (s27) moved more than the paths differ.
 */
export type MeasuredWrk = WrkResult & {
  labCpuUsPerRequest?: number;
  /** TCP connections each backend (b1, b2, b3) accepted during the run: how a balancer spread them (wrk's check that the URL connects adds one, on the backend that answers it; the agent's health checks reset before a connection is accepted). */
  acceptedPerBackend?: number[];
  /** Context switches of the three nginx per request: how many requests a wake-up serves (fewer is more per wake-up). */
  backendSwitchesPerRequest?: number;
};

export interface ForwardSample {
  round: number; target: ForwardTarget;
  keepalive: MeasuredWrk; close: WrkResult; bulk: IperfResult;
  /** iperf3 -R: the server sends (replies' direction); absent in results from before issue 17. */
  bulkReverse?: IperfResult;
  memory: { rssMiB: number; hwmMiB: number; processes: number } | undefined;
  /** The target the direct* fields were measured on: direct3 for dsr3 and kernel3; absent: direct. */
  pairedWith?: ForwardTarget;
  /** Direct's keep-alive, measured right before this target's slot (absent for direct itself and in older results). */
  directKeepalive?: MeasuredWrk;
  /** The same, right after the slot's own runs, with the target still up and idle (absent before 2026-11-25). */
  directKeepaliveAfter?: MeasuredWrk;
  /** DSR: direct's replies (iperf3 -R) right before and right after the slot's own (absent before 2026-11-25); with pairAll, every target's. */
  directBulkReverse?: { before: IperfResult; after: IperfResult };
  /** With pairAll: direct's new connections and its bulk stream (client -> server) right before and right after the slot's own. */
  directClose?: { before: WrkResult; after: WrkResult };
  directBulk?: { before: IperfResult; after: IperfResult };
  /** PROXY v2 targets: the same process without the header, each run right before the slot's own and (`after`) right after it. */
  withoutHeader?: { keepalive: WrkResult; close: WrkResult; after: { keepalive: WrkResult; close: WrkResult } };
  /** The peer its target line judges it against (peerOf), up beside it in the same slot: each of the peer's runs right before and right after the target's own (absent before 2026-11-28's second run). */
  peerRuns?: PeerRuns;
}

export interface PeerRuns {
  peer: ForwardTarget;
  keepalive: { before: MeasuredWrk; after: MeasuredWrk };
  close: { before: WrkResult; after: WrkResult };
  /**
   * The slot's further pairs (ForwardOptions.peerPairs), chained: each
   * `target` run comes after the previous pair's `after` (its before) and is
   * followed by its own `after`. Absent with one pair a slot and before 2026-11-30's third run.
   */
  more?: { keepalive: { target: MeasuredWrk; after: MeasuredWrk }[]; close: { target: WrkResult; after: WrkResult }[] };
}

export interface ForwardTargetSummary {
  label: string;
  /** What keep-alive "x direct" and CPU over direct are measured against when not direct (dsr3, kernel3: direct3). */
  pairedWith?: ForwardTarget;
  /** xDirect: the median of per-round ratios to the direct measurement paired with each slot. */
  keepalive: {
    requestsPerSec: number; p50ms: number; p99ms: number; xDirect?: number;
    /** Median lab CPU per request (µs; see MeasuredWrk), and the median over rounds of its excess over direct's paired runs (their mean). */
    cpuUsPerRequest?: number; cpuOverDirectUs?: number;
  };
  /** xDirect (pairAll runs): the median of per-round ratios to direct's new connections before and after the slot. */
  newConnections: { connectionsPerSec: number; p50ms: number; p99ms: number; xDirect?: number };
  /** PROXY v2 targets: median over rounds of the ratio to the same process without the header, run just before. */
  xWithoutHeader?: { keepalive: number; newConnections: number };
  /** Targets with a peer (peerOf): the median over pairs of the ratio to the mean of the peer's runs right before and right after, and each pair's ratio (`rounds`: in round order, a slot's pairs together). */
  xPeer?: { peer: ForwardTarget; keepalive: number; newConnections: number; rounds: { keepalive: number[]; newConnections: number[] } };
  bulkGbps: number;
  /** pairAll runs: the median of per-round ratios of bulk (client -> server) to direct's around the same slot. */
  bulkXDirect?: number;
  /** One stream server -> client (iperf3 -R), the direction of replies. */
  bulkReverseGbps?: number;
  /** DSR: the median of per-round ratios of the replies to direct's around the same slot. */
  bulkReverseXDirect?: number;
  /** Balancer memory after the load (the agent's whole process for kernel and proxy). */
  rssMiB: number;
  peakRssMiB: number;
  errors: number;
  samples: number;
}

export interface ForwardResult {
  config: Omit<ForwardOptions, 'log'> & { wrk: string; iperf3: string; backends: string; threadsDefaultHaproxy: string; proxyWorkers: number; pairing?: string; headerPairing?: string; peerPairing?: string };
  summary: Partial<Record<ForwardTarget, ForwardTargetSummary>>;
  raw: ForwardSample[];
  /** Targets that could not be measured in a round, and why. */
  errors: string[];
  /** Issue 17: flows the DSR slot table moves, computed (maglev.ts), against the minimum possible. */
  dsrHashing?: DsrHashingRow[];
}

export interface DsrHashingRow {
  backends: number; slots: number;
  /** A backend leaves the healthy set / comes back: moved share, and the minimum (its own share). */
  healthOut: number; healthOutMinimum: number; healthBack: number;
  /** A reload adds or removes a configured backend: moved share, and the minimum. */
  configAdd: number; configAddMinimum: number; configRemove: number; configRemoveMinimum: number;
}

/** The DSR slot table's disruption for N equal backends (pure; no lab). */
export function dsrHashing(counts: readonly number[] = [3, 10, 100]): DsrHashingRow[] {
  return counts.map((n) => {
    const all = Array.from({ length: n }, (_, i) => ({ address: `10.${i >> 8}.${i & 255}.1`, weight: 1 }));
    const m = maglevSize(n);
    const full = dsrSlotTable(all, all, m);
    const gone = all[0]!;
    const out = dsrSlotTable(all, all.slice(1), m);
    const back = dsrSlotTable(all, all, m);
    const added = [...all, { address: '10.255.255.1', weight: 1 }];
    return {
      backends: n, slots: m,
      healthOut: round(movedFraction(full, out), 4), healthOutMinimum: round(full.filter((b) => b.address === gone.address).length / m, 4),
      healthBack: round(movedFraction(out, back), 4),
      configAdd: round(movedFraction(full, dsrSlotTable(added, added, m)), 4), configAddMinimum: round(1 / (n + 1), 4),
      configRemove: round(movedFraction(full, dsrSlotTable(all.slice(1), all.slice(1), m)), 4), configRemoveMinimum: round(1 / n, 4),
    };
  });
}

/** The backends' port that requires a PROXY protocol header (nginx `listen ... proxy_protocol`). */
const PP_PORT = 8081;

/**
 * The HTTP service's backends: all three, but for dsr1. Direct is wrk to b1's
 * one nginx; through a balancer the same 50 connections spread over three
 * nginx processes, which on this 2-core host cost more wakeups and context
 * switches per request than the forwarding itself (s27: DSR to the three,
 * lab CPU +8 us/request over direct; DSR to b1 alone, +0.1). dsr1 keeps the
 * server side as direct has it, so its "x direct" is what forwarding costs;
 * dsr stays the number issue 17's target is judged on.
 */
function webBackends(target: ForwardTarget): string[] {
  return target === 'dsr1' || target === 'ebpf1' ? [BACKENDS[0]!] : BACKENDS;
}

/** The targets that run the eBPF full-NAT engine (kernel.engine: ebpf). */
function isEngine(target: ForwardTarget): boolean {
  return target === 'ebpf' || target === 'ebpf1' || target === 'ebpf-xdp';
}

/**
 * An XDP program that passes every frame on (XDP_PASS), for ebpf-xdp: built
 * with the clang scripts/setup.sh installs for the engine, once a process.
 */
const XDP_PASS_SOURCE = `#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
SEC("xdp")
int lb_bench_xdp_pass(struct xdp_md *ctx) { return XDP_PASS; }
char LICENSE[] SEC("license") = "GPL";
`;
let xdpPassObject: string | undefined;

async function buildXdpPass(): Promise<string> {
  if (xdpPassObject) return xdpPassObject;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-bench-xdp-'));
  fs.writeFileSync(path.join(dir, 'pass.c'), XDP_PASS_SOURCE);
  const triple = (await run('clang', ['-print-multiarch'])).stdout.trim();
  await run('clang', ['-target', 'bpf', '-O2', '-Wall', '-Werror', `-I/usr/include/${triple}`, '-c', path.join(dir, 'pass.c'), '-o', path.join(dir, 'pass.o')]);
  xdpPassObject = path.join(dir, 'pass.o');
  return xdpPassObject;
}

/** The targets that run the agent with direct server return (sourceIP: preserve). */
function isDsr(target: ForwardTarget): boolean {
  return target === 'dsr' || target === 'dsr-nft' || target === 'dsr1' || target === 'dsr3';
}

/** The like-for-like targets: wrk with one thread per backend (see the head comment). */
const SPREAD: readonly ForwardTarget[] = ['direct3', 'dsr3', 'kernel3'];

/** The run a target's keep-alive is paired with: direct, or direct3 for the targets direct3 is the like-for-like reference of. */
export function referenceOf(target: ForwardTarget): ForwardTarget | undefined {
  if (target === 'direct') return undefined;
  return target === 'dsr3' || target === 'kernel3' ? 'direct3' : 'direct';
}

/** The peer a target's line judges it against (report.ts), measured in the target's slot (see the head comment); undefined: none. */
export function peerOf(target: ForwardTarget): ForwardTarget | undefined {
  if (target === 'proxy1') return 'haproxy1';
  if (target === 'proxy') return 'haproxy';
  return undefined;
}

/** wrk's threads and connections for a target, and the addresses its threads connect to (the spread targets only). */
export function clientShape(target: ForwardTarget, o: Pick<ForwardOptions, 'threads' | 'connections'>): { threads: number; connections: number; addresses?: string[] } {
  if (!SPREAD.includes(target)) return { threads: o.threads, connections: o.connections };
  const threads = BACKENDS.length;
  return { threads, connections: Math.ceil(o.connections / threads) * threads, addresses: target === 'direct3' ? BACKENDS : [ENDPOINT[target].host] };
}

function agentConfig(target: 'kernel' | 'kernel3' | 'ebpf' | 'ebpf1' | 'ebpf-xdp' | 'dsr' | 'dsr-nft' | 'dsr1' | 'dsr3' | 'proxy' | 'proxy1' | 'proxy-pp2' | 'proxy-v8defaults'): Record<string, unknown> {
  const dsr = isDsr(target);
  const preserve = dsr ? { sourceIP: 'preserve' } : {};
  const pp = target === 'proxy-pp2' ? { proxyProtocol: 'v2', healthCheck: { proxyProtocol: true } } : {};
  return {
    node: { name: 'bench', interface: 'eth0' },
    metrics: { listen: '' },
    dataplane: target === 'kernel' || target === 'kernel3' || isEngine(target) || dsr ? 'kernel' : 'proxy',
    ...(isEngine(target) ? { kernel: { engine: 'ebpf' } } : {}),
    ...(target === 'proxy1' ? { proxy: { workers: 1 } } : {}),
    pools: { 'range-global': `${AGENT_VIP}-${DSR_VIP}` },
    arp: FAST_ARP,
    services: [
      { name: 'web', ipam: 'pool', loadBalancerIP: dsr ? DSR_VIP : AGENT_VIP, ports: [{ name: 'http', port: ENDPOINT[target].http, targetPort: target === 'proxy-pp2' ? PP_PORT : 8080 }], backends: webBackends(target), ...preserve, ...pp },
      { name: 'bulk', primaryService: 'web', ports: [{ name: 'iperf', port: 5201, targetPort: 5201 }], backends: [BACKENDS[0]!], healthCheck: { port: 8080 }, ...preserve },
      // The same backends without the header, for the paired cost (see the head comment).
      ...(target === 'proxy-pp2' ? [{ name: 'plain', primaryService: 'web', ports: [{ name: 'http', port: ENDPOINT[target].plain, targetPort: 8080 }], backends: BACKENDS }] : []),
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
    case 'direct3':
      return undefined;
    case 'kernel':
    case 'kernel3':
    case 'ebpf':
    case 'ebpf1':
    case 'ebpf-xdp':
    case 'dsr':
    case 'dsr-nft':
    case 'dsr1':
    case 'dsr3':
    case 'proxy':
    case 'proxy1':
    case 'proxy-pp2':
    case 'proxy-v8defaults': {
      // Every agent runs with the unit's environment (V8 flags, malloc
      // tunable; issue 18) but proxy-v8defaults, which shows what they cost
      // the proxy path.
      const agent: AgentHandle = await runAgent(lab, node, agentConfig(target), {
        name: `fwd-${target}-${slot}`,
        ...(target === 'proxy-v8defaults' ? { nodeOptions: '' } : {}),
        ...(target === 'dsr-nft' ? { env: { LB_AGENT_DSR_ENGINE: 'nft' } } : {}),
        ...(isEngine(target) ? { command: OWN_BPFFS } : {}),
      });
      await waitStatus(agent, `${target} agent serving`, (s) => s.services.length === (target === 'proxy-pp2' ? 3 : 2) && s.services.every((x) => x.ready) && s.services[0]!.healthyBackends === webBackends(target).length, 30_000);
      // A row labelled eBPF must not measure the nft table it falls back to.
      if (isEngine(target)) await natEngineServing(agent);
      // veth's XDP path (native: the driver's own) in front of the engine's tc program.
      if (target === 'ebpf-xdp') await run('ip', ['-n', node, 'link', 'set', 'dev', 'eth0', 'xdpdrv', 'obj', await buildXdpPass(), 'sec', 'xdp']);
      return {
        pid: agent.proc.pid,
        stop: async () => {
          if (target === 'ebpf-xdp') await run('ip', ['-n', node, 'link', 'set', 'dev', 'eth0', 'xdpdrv', 'off'], { allowFail: true });
          await stopAgent(agent);
          // The kernel path's connections linger in conntrack; the next slot starts clean.
          await run('ip', ['netns', 'exec', node, 'conntrack', '-F'], { allowFail: true });
        },
      };
    }
    case 'haproxy1':
    case 'haproxy':
    case 'haproxy-pp2':
      return peer(await startHaproxy(lab, node, `${target}-${slot}`, {
        threads: target === 'haproxy1' ? 1 : undefined,
        bind: `${ep.host}:${ep.http}`,
        servers: target === 'haproxy-pp2' ? servers.map((s) => ({ ...s, address: s.address.replace(/:8080$/, `:${PP_PORT}`) })) : servers,
        ...(target === 'haproxy-pp2' ? { sendProxy: 'v2' as const } : {}),
        extra: [
          { name: 'bulk', bind: `${ep.host}:${ep.bulk}`, servers: bulkServer },
          ...(ep.plain !== undefined ? [{ name: 'plain', bind: `${ep.host}:${ep.plain}`, servers }] : []),
        ],
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

/**
 * Keep-alive against the direct runs paired with each slot: the median of the
 * per-round ratios (none without pairs). The reference is the mean of direct
 * right before and right after the slot's run where both exist (A-B-A: it
 * cancels a linear drift of the host), direct before alone in older results.
 */
export function pairedRatio(samples: readonly Pick<ForwardSample, 'keepalive' | 'directKeepalive' | 'directKeepaliveAfter'>[]): { xDirect?: number } {
  const ratios = samples.flatMap((r) => {
    const refs = [r.directKeepalive, r.directKeepaliveAfter].filter((w): w is WrkResult => w !== undefined && w.rps > 0);
    if (!r.directKeepalive || refs.length !== (r.directKeepaliveAfter ? 2 : 1)) return [];
    return [r.keepalive.rps / (refs.reduce((n, w) => n + w.rps, 0) / refs.length)];
  });
  return ratios.length ? { xDirect: round(median(ratios), 3) } : {};
}

/** Keep-alive lab CPU per request: the median, and the median over rounds of the excess over direct's runs before and after the slot. */
export function pairedCpu(samples: readonly Pick<ForwardSample, 'keepalive' | 'directKeepalive' | 'directKeepaliveAfter'>[]): { cpuUsPerRequest?: number; cpuOverDirectUs?: number } {
  const ok = (x: number | undefined): x is number => x !== undefined && Number.isFinite(x);
  const own = samples.map((r) => r.keepalive.labCpuUsPerRequest).filter(ok);
  const over = samples.flatMap((r) => {
    const [t, b, a] = [r.keepalive.labCpuUsPerRequest, r.directKeepalive?.labCpuUsPerRequest, r.directKeepaliveAfter?.labCpuUsPerRequest];
    return ok(t) && ok(b) && ok(a) ? [t - (b + a) / 2] : [];
  });
  return { ...(own.length ? { cpuUsPerRequest: round(median(own), 2) } : {}), ...(over.length ? { cpuOverDirectUs: round(median(over), 2) } : {}) };
}

/** DSR's replies against direct's before and after the same slot: the median of per-round ratios to their mean (none without pairs). */
export function pairedReplies(samples: readonly Pick<ForwardSample, 'bulkReverse' | 'directBulkReverse'>[]): { bulkReverseXDirect?: number } {
  const ok = (x: IperfResult | undefined): x is IperfResult => x !== undefined && !x.error && x.bitsPerSecond > 0;
  const ratios = samples.flatMap((r) => (ok(r.bulkReverse) && r.directBulkReverse && ok(r.directBulkReverse.before) && ok(r.directBulkReverse.after)
    ? [r.bulkReverse.bitsPerSecond / ((r.directBulkReverse.before.bitsPerSecond + r.directBulkReverse.after.bitsPerSecond) / 2)]
    : []));
  return ratios.length ? { bulkReverseXDirect: round(median(ratios), 3) } : {};
}

/** The median over slots of a run's ratio to the mean of the reference's runs right before and after it (A-B-A); undefined without a whole pair. */
export function medianAround(pairs: readonly { value: number; before: number; after: number }[]): number | undefined {
  const ok = (x: number): boolean => Number.isFinite(x) && x > 0;
  const ratios = pairs.filter((p) => ok(p.value) && ok(p.before) && ok(p.after)).map((p) => p.value / ((p.before + p.after) / 2));
  return ratios.length ? round(median(ratios), 3) : undefined;
}

/** pairAll runs: new connections against direct's around each slot (none without pairs). */
export function pairedClose(samples: readonly Pick<ForwardSample, 'close' | 'directClose'>[]): { xDirect?: number } {
  const x = medianAround(samples.flatMap((r) => (r.directClose ? [{ value: r.close.rps, before: r.directClose.before.rps, after: r.directClose.after.rps }] : [])));
  return x !== undefined ? { xDirect: x } : {};
}

/** pairAll runs: bulk (client -> server) against direct's around each slot (none without pairs; a run with an error is no pair). */
export function pairedBulk(samples: readonly Pick<ForwardSample, 'bulk' | 'directBulk'>[]): { bulkXDirect?: number } {
  const bps = (r: IperfResult): number => (r.error ? NaN : r.bitsPerSecond);
  const x = medianAround(samples.flatMap((r) => (r.directBulk ? [{ value: bps(r.bulk), before: bps(r.directBulk.before), after: bps(r.directBulk.after) }] : [])));
  return x !== undefined ? { bulkXDirect: x } : {};
}

/** PROXY v2 targets: the median of per-round ratios to the same process without the header (none without pairs). */
export function headerCost(samples: readonly Pick<ForwardSample, 'keepalive' | 'close' | 'withoutHeader'>[]): { xWithoutHeader?: { keepalive: number; newConnections: number } } {
  // The reference is the mean of the runs before and after.
  const reference = (before: WrkResult, after: WrkResult): number => (before.rps + after.rps) / 2;
  const pairs = samples.filter((r) => r.withoutHeader && r.withoutHeader.keepalive.rps > 0 && r.withoutHeader.close.rps > 0);
  if (pairs.length === 0) return {};
  return {
    xWithoutHeader: {
      keepalive: round(median(pairs.map((r) => r.keepalive.rps / reference(r.withoutHeader!.keepalive, r.withoutHeader!.after.keepalive))), 3),
      newConnections: round(median(pairs.map((r) => r.close.rps / reference(r.withoutHeader!.close, r.withoutHeader!.after.close))), 3),
    },
  };
}

/**
 * Targets with a peer: the median over pairs of the ratio to the mean of the
 * peer's runs before and after the target's (A-B-A, a slot's further pairs
 * chained on: PeerRuns.more); none without pairs. A peer run that served
 * nothing spoils its slot.
 */
export function peerRatio(samples: readonly Pick<ForwardSample, 'keepalive' | 'close' | 'peerRuns'>[]): { xPeer?: ForwardTargetSummary['xPeer'] } {
  type Triple = { before: WrkResult; target: WrkResult; after: WrkResult };
  const chain = (first: Triple, more: readonly { target: WrkResult; after: WrkResult }[] | undefined): Triple[] => {
    const out = [first];
    for (const m of more ?? []) out.push({ before: out[out.length - 1]!.after, target: m.target, after: m.after });
    return out;
  };
  const slots = samples.filter((r): r is typeof r & { peerRuns: PeerRuns } => r.peerRuns !== undefined).map((r) => ({
    peer: r.peerRuns.peer,
    keepalive: chain({ ...r.peerRuns.keepalive, target: r.keepalive }, r.peerRuns.more?.keepalive),
    close: chain({ ...r.peerRuns.close, target: r.close }, r.peerRuns.more?.close),
  })).filter((s) => [...s.keepalive, ...s.close].every((p) => p.before.rps > 0 && p.after.rps > 0));
  if (slots.length === 0) return {};
  const of = (p: Triple): number => round(p.target.rps / ((p.before.rps + p.after.rps) / 2), 3);
  const keepalive = slots.flatMap((s) => s.keepalive.map(of));
  const newConnections = slots.flatMap((s) => s.close.map(of));
  return { xPeer: { peer: slots[0]!.peer, keepalive: round(median(keepalive), 3), newConnections: round(median(newConnections), 3), rounds: { keepalive, newConnections } } };
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
    const nginxPids: (number | undefined)[] = [];
    for (let i = 0; i < BACKENDS.length; i++) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${BACKENDS[i]}/24` });
      await lab.sh(ns, tune);
      // The backend side of direct server return, as the README says for a backend without lb-agent.
      await lab.sh(ns, `ip addr add ${DSR_VIP}/32 dev lo && sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2`);
      nginxPids.push((await startNginxBackend(lab, ns, `b${i + 1}`, 8080, PP_PORT)).proc.pid);
      if (i === 0) await startIperfServer(lab, ns, 5201);
    }
    o.log(`lab up; targets ${o.targets.join(',')}; ${o.rounds} round(s) of ${o.seconds} s measurements`);

    let slot = 0;
    // The spread targets' wrk scripts, one file per client shape.
    const scripts = new Map<ForwardTarget, string>();
    for (const t of o.targets) {
      const addresses = clientShape(t, o).addresses;
      if (!addresses) continue;
      scripts.set(t, lab.file(`wrk-${t}.lua`));
      fs.writeFileSync(scripts.get(t)!, wrkSpreadScript(addresses, ENDPOINT[t].http));
    }
    const urlOf = (t: ForwardTarget): string => `http://${ENDPOINT[t].host}:${ENDPOINT[t].http}/`;
    for (let round = 0; round < o.rounds; round++) {
      for (const target of rotate(o.targets, round)) {
        const ep = ENDPOINT[target];
        const url = urlOf(target);
        let running: Running | undefined;
        let peerRunning: Running | undefined;
        // Keep-alive runs also take the lab's CPU per request; `via`: the balancer's process when the run crosses it.
        // `as`: the target whose client (wrk threads, connections, script) the run uses.
        const wrkAt = async (u: string, close: boolean, as: ForwardTarget, via?: Running): Promise<MeasuredWrk> => {
          const shape = clientShape(as, o);
          const w0 = { connections: shape.connections, threads: shape.threads, close, ...(scripts.has(as) ? { script: scripts.get(as)! } : {}) };
          if (o.warmup > 0) await runWrk(lab, client, u, { seconds: o.warmup, ...w0 });
          const labCpu = (): number => selfTreeTicks() / 100 + nginxPids.reduce<number>((n, p) => n + treeCpuSeconds(p), 0) + (via ? treeCpuSeconds(via.pid) : 0);
          // Read outside the CPU window (no process: /proc of each nginx master).
          const accepted = (): number[] => nginxPids.map((p) => tcpPassiveOpens(p));
          const switches = (): number => nginxPids.reduce<number>((n, p) => n + treeContextSwitches(p), 0);
          const a0 = close ? [] : accepted();
          const s0 = close ? 0 : switches();
          const c0 = close ? 0 : labCpu();
          const w = await runWrk(lab, client, u, { seconds: o.seconds, ...w0 });
          if (close || !(w.requests > 0)) return w;
          const labCpuUsPerRequest = Math.round(((labCpu() - c0) * 1e8) / w.requests) / 100;
          return { ...w, labCpuUsPerRequest, acceptedPerBackend: accepted().map((n, i) => n - a0[i]!), backendSwitchesPerRequest: Math.round(((switches() - s0) / w.requests) * 1000) / 1000 };
        };
        try {
          // The pair's reference half first (direct, or direct3), before anything of the target runs.
          const ref = referenceOf(target);
          const paired = ref !== undefined && o.targets.includes(ref);
          const directKeepalive = paired ? await wrkAt(urlOf(ref), false, ref) : undefined;
          // The spread targets skip bulk: its port has b1 only, so it would repeat dsr's and kernel's.
          const spread = SPREAD.includes(target);
          // DSR's replies are judged against direct's: iperf3 -R around the slot as well.
          const directIperf = (): Promise<IperfResult> => runIperf(lab, client, ENDPOINT.direct.host, ENDPOINT.direct.bulk, o.seconds + 1, { reverse: true });
          const directReverseBefore = paired && (isDsr(target) || o.pairAll) && !spread ? await directIperf() : undefined;
          // pairAll: direct's new connections and forward stream around the slot too.
          const directForward = (): Promise<IperfResult> => runIperf(lab, client, ENDPOINT.direct.host, ENDPOINT.direct.bulk, o.seconds + 1);
          const directCloseBefore = paired && o.pairAll ? await wrkAt(urlOf(ref), true, ref) : undefined;
          const directBulkBefore = paired && o.pairAll && !spread ? await directForward() : undefined;
          // The peer its line judges it against, up beside it (see the head comment).
          const peer = peerOf(target);
          if (peer !== undefined && o.targets.includes(peer)) {
            peerRunning = await startTarget(lab, node, peer, slot++);
            await waitFor(`${peer} to answer`, async () => (await runWrk(lab, client, urlOf(peer), { seconds: 1, connections: 1, threads: 1, close: false })).requests > 0, 15_000, 200);
          }
          running = await startTarget(lab, node, target, slot++);
          // Reachable before measuring: one request must get through.
          await waitFor(`${target} to answer`, async () => (await runWrk(lab, client, url, { seconds: 1, connections: 1, threads: 1, close: false })).requests > 0, 15_000, 200);
          const peerWrk = (close: boolean): Promise<MeasuredWrk | undefined> => (peer !== undefined && peerRunning ? wrkAt(urlOf(peer), close, peer, peerRunning) : Promise.resolve(undefined));
          const wrk = (close: boolean): Promise<MeasuredWrk> => wrkAt(url, close, target, running);
          const plainUrl = ep.plain !== undefined ? `http://${ep.host}:${ep.plain}/` : undefined;
          // Without the header before and after each run with it (A-B-A): the mean of the two cancels a
          // drift of the host and what a run leaves behind for the next (TIME_WAIT, caches) alike.
          const plainKeepalive = plainUrl ? await wrkAt(plainUrl, false, target) : undefined;
          const peerKeepalive = await peerWrk(false);
          const keepalive = await wrk(false);
          const peerKeepaliveAfter = await peerWrk(false);
          // The slot's further pairs, chained on the last peer run (see the head comment).
          const extraPairs = peer !== undefined && peerRunning ? Math.max(0, (o.peerPairs ?? 1) - 1) : 0;
          const moreKeepalive: { target: MeasuredWrk; after: MeasuredWrk }[] = [];
          for (let i = 0; i < extraPairs; i++) moreKeepalive.push({ target: await wrk(false), after: (await peerWrk(false))! });
          const plainKeepaliveAfter = plainUrl ? await wrkAt(plainUrl, false, target) : undefined;
          const plainClose = plainUrl ? await wrkAt(plainUrl, true, target) : undefined;
          const peerClose = await peerWrk(true);
          const close = await wrk(true);
          const peerCloseAfter = await peerWrk(true);
          const moreClose: { target: WrkResult; after: WrkResult }[] = [];
          for (let i = 0; i < extraPairs; i++) moreClose.push({ target: await wrk(true), after: (await peerWrk(true))! });
          const plainCloseAfter = plainUrl ? await wrkAt(plainUrl, true, target) : undefined;
          const peerRuns: PeerRuns | undefined = peer !== undefined && peerKeepalive && peerKeepaliveAfter && peerClose && peerCloseAfter
            ? { peer, keepalive: { before: peerKeepalive, after: peerKeepaliveAfter }, close: { before: peerClose, after: peerCloseAfter }, ...(extraPairs > 0 ? { more: { keepalive: moreKeepalive, close: moreClose } } : {}) }
            : undefined;
          // The peer's part is done: nothing of it stays up through the bulk runs.
          await peerRunning?.stop();
          peerRunning = undefined;
          const withoutHeader = plainKeepalive && plainClose && plainKeepaliveAfter && plainCloseAfter
            ? { keepalive: plainKeepalive, close: plainClose, after: { keepalive: plainKeepaliveAfter, close: plainCloseAfter } }
            : undefined;
          const notRun: IperfResult = { bitsPerSecond: NaN, retransmits: NaN };
          const bulk = spread ? notRun : await runIperf(lab, client, ep.host, ep.bulk, o.seconds + 1);
          const bulkReverse = spread ? undefined : await runIperf(lab, client, ep.host, ep.bulk, o.seconds + 1, { reverse: true });
          const memory = running ? treeMemoryMiB(running.pid) : undefined;
          // The pair's direct half after, with the target up and idle (the direct path does not cross it).
          const directReverseAfter = directReverseBefore ? await directIperf() : undefined;
          const directBulkAfter = directBulkBefore ? await directForward() : undefined;
          const directCloseAfter = directCloseBefore ? await wrkAt(urlOf(ref!), true, ref!) : undefined;
          const directKeepaliveAfter = paired ? await wrkAt(urlOf(ref), false, ref) : undefined;
          const directBulkReverse = directReverseBefore && directReverseAfter ? { before: directReverseBefore, after: directReverseAfter } : undefined;
          const directClose = directCloseBefore && directCloseAfter ? { before: directCloseBefore, after: directCloseAfter } : undefined;
          const directBulk = directBulkBefore && directBulkAfter ? { before: directBulkBefore, after: directBulkAfter } : undefined;
          raw.push({ round, target, ...(ref !== undefined && ref !== 'direct' && paired ? { pairedWith: ref } : {}), keepalive, close, bulk, bulkReverse, memory, ...(directKeepalive ? { directKeepalive } : {}), ...(directKeepaliveAfter ? { directKeepaliveAfter } : {}), ...(directBulkReverse ? { directBulkReverse } : {}), ...(directClose ? { directClose } : {}), ...(directBulk ? { directBulk } : {}), ...(withoutHeader ? { withoutHeader } : {}), ...(peerRuns ? { peerRuns } : {}) });
          const peerX = peerRuns ? peerRatio([{ keepalive, close, peerRuns }]).xPeer : undefined;
          const pairX = pairedRatio([{ keepalive, directKeepalive, directKeepaliveAfter }]).xDirect;
          const pairedText = (pairX !== undefined ? ` (${pairX.toFixed(2)}x ${ref}'s ${directKeepalive!.rps.toFixed(0)}/${directKeepaliveAfter!.rps.toFixed(0)} before/after)` : '')
            + (withoutHeader ? ` (without the header before/after: ${withoutHeader.keepalive.rps.toFixed(0)}/${withoutHeader.after.keepalive.rps.toFixed(0)} req/s, ${withoutHeader.close.rps.toFixed(0)}/${withoutHeader.after.close.rps.toFixed(0)} conn/s)` : '')
            + (peerRuns ? ` (${peerRuns.peer} before/after: ${peerRuns.keepalive.before.rps.toFixed(0)}/${peerRuns.keepalive.after.rps.toFixed(0)} req/s, ${peerRuns.close.before.rps.toFixed(0)}/${peerRuns.close.after.rps.toFixed(0)} conn/s${peerX ? `; x ${peerX.rounds.keepalive.map((v) => v.toFixed(2)).join(', ')} / ${peerX.rounds.newConnections.map((v) => v.toFixed(2)).join(', ')}` : ''})` : '');
          const spreadText = (keepalive.acceptedPerBackend && spread ? `, connections per backend ${keepalive.acceptedPerBackend.join('/')}` : '')
            + (keepalive.backendSwitchesPerRequest !== undefined ? `, nginx switches/req ${keepalive.backendSwitchesPerRequest.toFixed(3)}${directKeepalive?.backendSwitchesPerRequest !== undefined && directKeepaliveAfter?.backendSwitchesPerRequest !== undefined ? ` (${ref} ${directKeepalive.backendSwitchesPerRequest.toFixed(3)}/${directKeepaliveAfter.backendSwitchesPerRequest.toFixed(3)})` : ''}` : '');
          const cpuText = spreadText + (keepalive.labCpuUsPerRequest !== undefined ? `, lab CPU ${keepalive.labCpuUsPerRequest.toFixed(1)} µs/req${directKeepalive?.labCpuUsPerRequest !== undefined && directKeepaliveAfter?.labCpuUsPerRequest !== undefined ? ` (${ref} ${directKeepalive.labCpuUsPerRequest.toFixed(1)}/${directKeepaliveAfter.labCpuUsPerRequest.toFixed(1)})` : ''}` : '');
          o.log(`round ${round + 1}/${o.rounds} ${target.padEnd(8)} keep-alive ${keepalive.rps.toFixed(0).padStart(6)} req/s${pairedText}${cpuText} (p50 ${keepalive.p50ms.toFixed(2)} ms, p99 ${keepalive.p99ms.toFixed(2)} ms)  new conn ${close.rps.toFixed(0).padStart(6)}/s  ${bulkReverse ? `bulk ${(bulk.bitsPerSecond / 1e9).toFixed(2)} / replies ${(bulkReverse.bitsPerSecond / 1e9).toFixed(2)} Gbit/s${bulk.error ? ` (${bulk.error})` : ''}${bulkReverse.error ? ` (-R: ${bulkReverse.error})` : ''}` : 'no bulk'}${memory ? `  rss ${memory.rssMiB.toFixed(1)} MiB` : ''}`);
        } catch (e) {
          // One target failing (a peer that will not start, say) costs its own numbers only.
          const error = String((e as Error).message ?? e).split('\n')[0]!.slice(0, 300);
          errors.push(`round ${round + 1} ${target}: ${error}`);
          o.log(`round ${round + 1}/${o.rounds} ${target}: FAILED: ${error}`);
        } finally {
          await running?.stop().catch(() => undefined);
          await peerRunning?.stop().catch(() => undefined);
        }
      }
    }

    const summary: Partial<Record<ForwardTarget, ForwardTargetSummary>> = {};
    for (const target of o.targets) {
      const s = raw.filter((r) => r.target === target);
      if (s.length === 0) continue;
      const ref = referenceOf(target);
      summary[target] = {
        label: FORWARD_LABELS[target],
        ...(ref !== undefined && ref !== 'direct' ? { pairedWith: ref } : {}),
        keepalive: {
          requestsPerSec: round(median(s.map((r) => r.keepalive.rps)), 0), p50ms: round(median(s.map((r) => r.keepalive.p50ms)), 3), p99ms: round(median(s.map((r) => r.keepalive.p99ms)), 3),
          ...pairedRatio(s),
          ...pairedCpu(s),
        },
        newConnections: { connectionsPerSec: round(median(s.map((r) => r.close.rps)), 0), p50ms: round(median(s.map((r) => r.close.p50ms)), 3), p99ms: round(median(s.map((r) => r.close.p99ms)), 3), ...pairedClose(s) },
        ...headerCost(s),
        ...peerRatio(s),
        bulkGbps: round(median(s.map((r) => r.bulk.bitsPerSecond / 1e9)), 2),
        ...pairedBulk(s),
        bulkReverseGbps: round(median(s.map((r) => (r.bulkReverse?.bitsPerSecond ?? NaN) / 1e9)), 2),
        ...pairedReplies(s),
        rssMiB: round(median(s.map((r) => r.memory?.rssMiB ?? NaN)), 1),
        peakRssMiB: round(median(s.map((r) => r.memory?.hwmMiB ?? NaN)), 1),
        errors: s.reduce((n, r) => n + r.keepalive.socketErrors + r.keepalive.non2xx + r.close.socketErrors + r.close.non2xx + (r.bulk.error ? 1 : 0) + (r.bulkReverse?.error ? 1 : 0), 0),
        samples: s.length,
      };
    }
    const spreadShape = clientShape('direct3', o);
    const spreadIn = o.targets.filter((t) => SPREAD.includes(t));
    return {
      config: {
        rounds: o.rounds, seconds: o.seconds, warmup: o.warmup, connections: o.connections, threads: o.threads, targets: o.targets, ...(o.peerPairs !== undefined && o.peerPairs > 1 ? { peerPairs: o.peerPairs } : {}), ...(o.pairAll ? { pairAll: true } : {}),
        wrk: `wrk -t${o.threads} -c${o.connections} -d${o.seconds}s --latency (new connections: -H 'Connection: close')${spreadIn.length ? `; ${spreadIn.join(', ')}: wrk -t${spreadShape.threads} -c${spreadShape.connections} with a setup() that sends each thread to one address (direct3: b1, b2, b3; the others: all to the VIP), no bulk` : ''}`,
        iperf3: `iperf3 -c HOST -t ${o.seconds + 1} -O 1 (one stream; and with -R, server to client)`,
        backends: `nginx 1 worker each, 3 backends (bulk: iperf3 on b1 only; PROXY v2 targets to \`listen ${PP_PORT} proxy_protocol\`)`,
        threadsDefaultHaproxy: 'no nbthread: HAProxy starts one thread per CPU it may run on',
        proxyWorkers: os.availableParallelism(),
        ...(o.targets.includes('direct') || o.targets.includes('direct3') ? { pairing: `keep-alive x direct: median over rounds of the ratio to the mean of direct measured the same way right before and right after the target's runs (DSR replies likewise, iperf3 -R)${o.targets.includes('direct3') && spreadIn.length > 1 ? '; dsr3 and kernel3 are paired the same way with direct3, the same client on the same three backends' : ''}; ${o.pairAll ? 'new connections and bulk both ways (iperf3, and -R) are paired the same way' : 'other x direct columns: ratio of medians'}` } : {}),
        ...(o.targets.some((t) => { const p = peerOf(t); return p !== undefined && o.targets.includes(p); }) ? { peerPairing: `proxy x HAProxy (the target lines): median over pairs of the ratio to the mean of the same run of the HAProxy with as many threads right before and right after it, the HAProxy up beside lb-agent in its slot${(o.peerPairs ?? 1) > 1 ? `, ${o.peerPairs} pairs a slot chained (HAProxy, lb-agent, HAProxy, lb-agent, ... HAProxy)` : ''}; the table's x HAProxy 1t columns stay ratios of medians` } : {}),
        ...(o.targets.some((t) => ENDPOINT[t].plain !== undefined) ? { headerPairing: 'PROXY v2 x without: median over rounds of the ratio to the mean of the same run without the header right before and right after it (the same process, on a second port)' } : {}),
      },
      summary,
      raw,
      errors,
      dsrHashing: o.targets.includes('dsr') ? dsrHashing() : undefined,
    };
  } finally {
    await lab.destroy();
  }
}
