// Bench area "families": IPv6 beside IPv4 on the same testbed. One lab of a
// client, a node and three nginx backends, every host with an address of
// each family; the real `lb-agent run` serves one RequireDualStack pool
// service (port 80 to the backends' 8080), so both VIPs are held by the same
// process, forward to the same three nginx (each listens on both families)
// and are measured in the same slot. Each path (kernel: nftables; proxy:
// the userspace proxy, one worker per CPU; dsr: the kernel path with
// sourceIP: preserve, port 8080 straight to the backends, which hold both
// VIPs on lo for that slot only) gets a slot a round, in a rotated
// order; in a slot the families alternate, IPv4 first and last
// (4, 6, 4, 6, 4, ...), for keep-alive requests/s and for new connections/s
// (wrk with `Connection: close`), and each IPv6 run is judged against the
// mean of the IPv4 runs right before and right after it: the host's speed
// moves between slots by more than a family costs (forwarding.ts's
// pairing). The line is the median of those ratios over the slots' pairs.
// Two rows are floors, with no agent: direct, the client straight to one
// backend's nginx, what IPv6 costs the two end hosts' stacks alone; routed,
// the same backend reached through the node as a plain router (an address
// of its own on lo, host routes both ways through the node, no nft, no
// conntrack), what IPv6 costs the node's own forwarding on this kernel;
// nat, the node's own address port 80 translated by a hand-written table
// of each family (conntrack, a round-robin DNAT to the three backends'
// 8080, SNAT to the node: the agent's walk without its fib check, counters
// and maps), what IPv6 costs the kernel's conntrack and NAT; the kernel path
// beside it is what the agent's table adds. The kernel path is pinned to the nft table (kernel.engine: nft); the ebpf row
// is the same kernel path on the eBPF NAT engine (kernel.engine: ebpf, its
// own BPF file system), so the two engines' IPv6 costs stand side by side.
// Only lab namespaces are addressed.
import { Lab } from '../lab/netns';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, natEngineServing, FAST_ARP, OWN_BPFFS, type AgentHandle } from './lib/agent';
import { startNginxBackend } from './lib/peers';
import { runWrk, type WrkResult } from './lib/load';
import { median, round, rotate } from './lib/stats';

const CLIENT = { v4: '10.99.0.2', v6: 'fd00:99::2' };
export const NODE = { v4: '10.99.0.10', v6: 'fd00:99::10' };
export const VIP = { v4: '10.99.0.50', v6: 'fd00:99::50' };
/** The routed floor's address of the first backend, on its lo, reached through the node. */
const ROUTED = { v4: '10.98.0.11', v6: 'fd00:98::11' };
const BACKENDS = [{ v4: '10.99.0.11', v6: 'fd00:99::11' }, { v4: '10.99.0.12', v6: 'fd00:99::12' }, { v4: '10.99.0.13', v6: 'fd00:99::13' }];

export const FAMILY_PATHS = ['kernel', 'ebpf', 'proxy', 'dsr', 'direct', 'routed', 'nat'] as const;
export type FamilyPath = (typeof FAMILY_PATHS)[number];

export interface FamiliesOptions {
  rounds: number;
  /** Seconds per wrk measurement. */
  seconds: number;
  /** Seconds of wrk warm-up before a slot's first run of each kind (0: none). */
  warmup: number;
  connections: number;
  threads: number;
  /** IPv6 runs a slot per kind, each between two IPv4 runs. */
  pairs: number;
  /** The rows measured, in FAMILY_PATHS order (default: all). */
  paths?: readonly FamilyPath[];
  log: (msg: string) => void;
}

export interface FamilyPair {
  round: number; path: FamilyPath; kind: 'keepalive' | 'close';
  before: WrkResult; v6: WrkResult; after: WrkResult;
  /** v6 over the mean of before and after (requests/s). */
  ratio: number;
}

export interface FamilySummaryRow {
  path: FamilyPath;
  /** Medians over every run of each family. */
  keepalive: { v4: number; v6: number; xIPv4: number };
  newConnections: { v4: number; v6: number; xIPv4: number };
  /** Socket errors and non-2xx answers over all runs. */
  errors: number;
  pairs: number;
}

export interface FamiliesResult {
  config: Omit<FamiliesOptions, 'log'> & { wrk: string; backends: string; pairing: string };
  summary: FamilySummaryRow[];
  raw: FamilyPair[];
  errors: string[];
}

export function agentConfig(path: FamilyPath): Record<string, unknown> {
  const dsr = path === 'dsr';
  return {
    node: { interface: 'eth0' },
    metrics: { listen: '' },
    dataplane: dsr || path === 'ebpf' ? 'kernel' : path,
    kernel: { engine: path === 'ebpf' ? 'ebpf' : 'nft' },
    pools: { 'range-global': `${VIP.v4}-${VIP.v4},${VIP.v6}-${VIP.v6}` },
    arp: FAST_ARP,
    services: [{
      name: 'web', ipam: 'pool', ipFamilyPolicy: 'RequireDualStack',
      // Direct server return keeps the port: the backends' own.
      ...(dsr ? { sourceIP: 'preserve', ports: [{ port: 8080 }] } : { ports: [{ port: 80, targetPort: 8080 }] }),
      backends: [...BACKENDS.map((b) => b.v4), ...BACKENDS.map((b) => b.v6)],
    }],
  };
}

const url = (f: 'v4' | 'v6', path: FamilyPath): string => {
  if (path === 'routed') return f === 'v4' ? `http://${ROUTED.v4}:8080/` : `http://[${ROUTED.v6}]:8080/`;
  if (path === 'nat') return f === 'v4' ? `http://${NODE.v4}/` : `http://[${NODE.v6}]/`;
  if (path === 'direct') return f === 'v4' ? `http://${BACKENDS[0]!.v4}:8080/` : `http://[${BACKENDS[0]!.v6}]:8080/`;
  const port = path === 'dsr' ? 8080 : 80;
  return f === 'v4' ? `http://${VIP.v4}:${port}/` : `http://[${VIP.v6}]:${port}/`;
};

/** A DSR slot's backend side (docs/datapaths.md): both VIPs on lo, or off again (the SNAT paths send from the VIP). */
async function backendVips(lab: Lab, namespaces: readonly string[], on: boolean): Promise<void> {
  for (const ns of namespaces) {
    await lab.sh(ns, on
      ? `ip addr add ${VIP.v4}/32 dev lo && ip -6 addr add ${VIP.v6}/128 dev lo preferred_lft 0 && sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2`
      : `ip addr del ${VIP.v4}/32 dev lo; ip -6 addr del ${VIP.v6}/128 dev lo; true`);
  }
}

/**
 * The routed floor: the first backend's own address on lo, routed to and
 * from the client through the node (host routes on both ends, so the
 * answers come back through the node too), for one slot; redirects off, so
 * neither end learns the short way round.
 */
async function routedFloor(lab: Lab, node: string, client: string, backend: string, on: boolean): Promise<void> {
  const add = on ? 'add' : 'del';
  await lab.sh(node, `sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.eth0.send_redirects=0; ip route ${add} ${ROUTED.v4}/32 via ${BACKENDS[0]!.v4}; ip -6 route ${add} ${ROUTED.v6}/128 via ${BACKENDS[0]!.v6}; true`);
  await lab.sh(client, `sysctl -qw net.ipv4.conf.all.accept_redirects=0 net.ipv6.conf.all.accept_redirects=0 net.ipv6.conf.eth0.accept_redirects=0; ip route ${add} ${ROUTED.v4}/32 via ${NODE.v4}; ip -6 route ${add} ${ROUTED.v6}/128 via ${NODE.v6}; true`);
  await lab.sh(backend, `sysctl -qw net.ipv4.conf.all.accept_redirects=0 net.ipv6.conf.all.accept_redirects=0 net.ipv6.conf.eth0.accept_redirects=0; ip addr ${add} ${ROUTED.v4}/32 dev lo; ip -6 addr ${add} ${ROUTED.v6}/128 dev lo; ip route ${add} ${CLIENT.v4}/32 via ${NODE.v4} src ${ROUTED.v4}; ip -6 route ${add} ${CLIENT.v6}/128 via ${NODE.v6} src ${ROUTED.v6}; true`);
}

/**
 * The nat floor's tables (one per family, as the agent writes them): the
 * node's address port 80 to the three backends' 8080 in turn, answered
 * from the node's address; the agent's rule walk less its fib check, its
 * byte and connection counters and its dispatch maps.
 */
export function natFloorScript(on: boolean): string {
  const table = (family: 'ip' | 'ip6', f: 'v4' | 'v6'): string[] => {
    const at = (a: string): string => (f === 'v6' ? `[${a}]` : a);
    return [
      `table ${family} lb_floor {`,
      '  chain prerouting {',
      '    type nat hook prerouting priority dstnat; policy accept;',
      `    ${family} daddr ${NODE[f]} tcp dport 80 numgen inc mod ${BACKENDS.length} vmap { ${BACKENDS.map((_, i) => `${i} : goto b${i}`).join(', ')} }`,
      '  }',
      ...BACKENDS.map((b, i) => `  chain b${i} { meta l4proto tcp dnat to ${at(b[f])}:8080; }`),
      '  chain postrouting {',
      '    type nat hook postrouting priority srcnat; policy accept;',
      `    ct status dnat snat to ${NODE[f]}`,
      '  }',
      '}',
    ];
  };
  const gone = ['ip', 'ip6'].flatMap((family) => [`table ${family} lb_floor {}`, `delete table ${family} lb_floor`]);
  return [...gone, ...(on ? [...table('ip', 'v4'), ...table('ip6', 'v6')] : []), ''].join('\n');
}

async function natFloor(lab: Lab, node: string, on: boolean): Promise<void> {
  if (on) await lab.sh(node, 'sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1');
  await lab.exec(node, 'nft', ['-f', '-'], { input: natFloorScript(on) });
}

/** The lab: a client, a node and three nginx backends on one LAN, an address of each family on every host; the namespaces. */
export async function familiesLab(lab: Lab): Promise<{ client: string; node: string; backendNs: string[] }> {
  const tune = 'sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096';
  const client = await lab.addHost('client', { address: `${CLIENT.v4}/24`, ipv6: [`${CLIENT.v6}/64`] });
  const node = await lab.addHost('node', { address: `${NODE.v4}/24`, ipv6: [`${NODE.v6}/64`] });
  await lab.sh(client, tune);
  await lab.sh(node, tune);
  const backendNs: string[] = [];
  for (const [i, b] of BACKENDS.entries()) {
    const ns = await lab.addHost(`b${i + 1}`, { address: `${b.v4}/24`, ipv6: [`${b.v6}/64`] });
    backendNs.push(ns);
    await lab.sh(ns, tune);
    await startNginxBackend(lab, ns, `b${i + 1}`, 8080, undefined, true);
  }
  return { client, node, backendNs };
}

/** Wait until the agent serves both VIPs with every backend healthy. */
export function familiesServing(agent: AgentHandle): Promise<unknown> {
  return waitStatus(agent, 'both VIPs serving, every backend healthy', (s) => s.services.length === 2 && s.services.every((x) => x.ready && x.healthyBackends === 3), 30_000);
}

export async function benchFamilies(o: FamiliesOptions): Promise<FamiliesResult> {
  const lab = await Lab.create();
  const raw: FamilyPair[] = [];
  const errors: string[] = [];
  const errs = new Map<FamilyPath, number>();
  const runs = new Map<string, number[]>();
  const paths = FAMILY_PATHS.filter((p) => o.paths === undefined || o.paths.includes(p));
  try {
    const { client, node, backendNs } = await familiesLab(lab);
    o.log(`lab up; paths ${paths.join(',')}; ${o.rounds} round(s), ${o.pairs} IPv6 run(s) a slot per kind between IPv4 runs, ${o.seconds} s each`);
    const wrk = async (f: 'v4' | 'v6', close: boolean, path: FamilyPath): Promise<WrkResult> => {
      const r = await runWrk(lab, client, url(f, path), { seconds: o.seconds, connections: o.connections, threads: o.threads, close });
      errs.set(path, (errs.get(path) ?? 0) + r.socketErrors + r.non2xx + (Number.isFinite(r.rps) ? 0 : 1));
      const key = `${path}/${close ? 'close' : 'keepalive'}/${f}`;
      runs.set(key, [...(runs.get(key) ?? []), r.rps]);
      return r;
    };
    for (let round = 0; round < o.rounds; round++) {
      for (const path of rotate(paths, round)) {
        if (path === 'dsr') await backendVips(lab, backendNs, true);
        if (path === 'routed') await routedFloor(lab, node, client, backendNs[0]!, true);
        if (path === 'nat') await natFloor(lab, node, true);
        const agent = path === 'direct' || path === 'routed' || path === 'nat' ? undefined
          : await runAgent(lab, node, agentConfig(path), { name: `fam-${path}`, ...(path === 'ebpf' ? { command: OWN_BPFFS } : {}) });
        try {
          if (agent && path === 'ebpf') await natEngineServing(agent);
          if (agent) await familiesServing(agent);
          for (const close of [false, true]) {
            if (o.warmup > 0) for (const f of ['v4', 'v6'] as const) await runWrk(lab, client, url(f, path), { seconds: o.warmup, connections: o.connections, threads: o.threads, close });
            let before = await wrk('v4', close, path);
            for (let p = 0; p < o.pairs; p++) {
              const v6 = await wrk('v6', close, path);
              const after = await wrk('v4', close, path);
              const ratio = v6.rps / ((before.rps + after.rps) / 2);
              raw.push({ round, path, kind: close ? 'close' : 'keepalive', before, v6, after, ratio: round4(ratio) });
              before = after;
            }
          }
          o.log(`round ${round + 1} ${path}: ${raw.filter((x) => x.round === round && x.path === path).map((x) => `${x.kind} ${x.ratio.toFixed(3)}`).join(', ')}`);
        } catch (e) {
          errors.push(`round ${round + 1} ${path}: ${String((e as Error).message ?? e)}`);
        } finally {
          if (agent) await stopAgent(agent);
          if (path === 'dsr') await backendVips(lab, backendNs, false);
          if (path === 'routed') await routedFloor(lab, node, client, backendNs[0]!, false);
          if (path === 'nat') await natFloor(lab, node, false);
        }
      }
    }
  } finally {
    await lab.destroy();
  }
  const med = (key: string): number => round(median((runs.get(key) ?? []).filter(Number.isFinite)), 0);
  const ratioOf = (path: FamilyPath, kind: 'keepalive' | 'close'): number => round(median(raw.filter((x) => x.path === path && x.kind === kind && Number.isFinite(x.ratio)).map((x) => x.ratio)), 3);
  const summary = FAMILY_PATHS.filter((p) => raw.some((x) => x.path === p)).map((path): FamilySummaryRow => ({
    path,
    keepalive: { v4: med(`${path}/keepalive/v4`), v6: med(`${path}/keepalive/v6`), xIPv4: ratioOf(path, 'keepalive') },
    newConnections: { v4: med(`${path}/close/v4`), v6: med(`${path}/close/v6`), xIPv4: ratioOf(path, 'close') },
    errors: errs.get(path) ?? 0,
    pairs: raw.filter((x) => x.path === path).length,
  }));
  return {
    config: {
      rounds: o.rounds, seconds: o.seconds, warmup: o.warmup, connections: o.connections, threads: o.threads, pairs: o.pairs, paths,
      wrk: `wrk -t${o.threads} -c${o.connections} -d${o.seconds}s (new connections: -H 'Connection: close')`,
      backends: 'three nginx, one worker each, listening on both families',
      pairing: 'each IPv6 run between two IPv4 runs of the same kind in the same slot; x IPv4 is the median of IPv6 over the mean of its two neighbours',
    },
    summary, raw, errors,
  };
}

function round4(x: number): number {
  return round(x, 4);
}

/** The area's table (report.ts renders it under its heading). */
export function familiesTable(r: FamiliesResult): string {
  const head = '| path | keep-alive req/s IPv4 | IPv6 | IPv6 x IPv4 | new conn/s IPv4 | IPv6 | IPv6 x IPv4 | errors | pairs |\n| --- | --: | --: | --: | --: | --: | --: | --: | --: |';
  const rows = r.summary.map((s) => `| ${s.path} | ${s.keepalive.v4} | ${s.keepalive.v6} | ${s.keepalive.xIPv4.toFixed(3)}x | ${s.newConnections.v4} | ${s.newConnections.v6} | ${s.newConnections.xIPv4.toFixed(3)}x | ${s.errors} | ${s.pairs} |`);
  return [head, ...rows].join('\n');
}
