// Where the eBPF NAT engine's time goes, by workload: the kernel's own
// account of the program (kernel.bpf_stats_enabled: run_cnt and
// run_time_ns in the agent's fdinfo of the attached program) over wrk runs
// through the VIP of a lab of one client, the node and three nginx
// backends: keep-alive requests (two packets a request, both on the
// established path) and `Connection: close` requests (every packet of a
// connection: SYN, SYN-ACK, ACK, request, response, FINs and ACKs), each
// with the runs per request, ns per run and engine µs per request. Beside
// them, what of the VIP's traffic went past the engine: the node stack's
// forwarded datagrams (IpForwDatagrams: a packet the engine passes on is
// forwarded by nft's DNAT) and the node's conntrack entries of the client.
// Then bulk, one iperf3 stream each way through the VIP to b1: the runs per
// frame the node's NIC received and the bytes per run, which say whether
// the program runs once per GRO/TSO aggregate (a veth hands a local
// sender's TSO frames over whole) or once per wire-sized segment, and the
// aggregate sizes the node's NIC allows (ip -d link).
//
//   node dist/bench/nat-profile.js [--seconds 3] [--rounds 3]
//
// bpf_stats_enabled is machine-wide; it is set for the run and put back.
// Only lab namespaces and their loopback are addressed.
import * as fs from 'node:fs';
import { Lab } from '../lab/netns';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, natEngineServing, FAST_ARP, OWN_BPFFS } from './lib/agent';
import { startNginxBackend, startIperfServer } from './lib/peers';
import { runWrk, runIperf } from './lib/load';
import { median, round } from './lib/stats';

const CLIENT = '10.99.0.2';
const NODE = '10.99.0.10';
const VIP = '10.99.0.50';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];
const STATS = '/proc/sys/kernel/bpf_stats_enabled';

/** One program's counters from /proc/<pid>/fdinfo/<fd> (sched_cls programs only). */
export function parseProgFdinfo(text: string): { id: number; runCnt: number; runTimeNs: number } | undefined {
  const field = (k: string): number => Number(new RegExp(`^${k}:\\s+(\\S+)`, 'm').exec(text)?.[1] ?? NaN);
  // BPF_PROG_TYPE_SCHED_CLS
  if (field('prog_type') !== 3) return undefined;
  return { id: field('prog_id'), runCnt: field('run_cnt'), runTimeNs: field('run_time_ns') };
}

function progStats(pid: number): Map<number, { runCnt: number; runTimeNs: number }> {
  const out = new Map<number, { runCnt: number; runTimeNs: number }>();
  for (const fd of fs.readdirSync(`/proc/${pid}/fdinfo`)) {
    try {
      const p = parseProgFdinfo(fs.readFileSync(`/proc/${pid}/fdinfo/${fd}`, 'utf8'));
      if (p) out.set(p.id, p);
    } catch { /* closed meanwhile */ }
  }
  return out;
}

/** The runs and run time the programs took between two reads of progStats. */
function progDelta(s0: Map<number, { runCnt: number; runTimeNs: number }>, s1: Map<number, { runCnt: number; runTimeNs: number }>): { cnt: number; ns: number } {
  let cnt = 0;
  let ns = 0;
  for (const [id, a] of s1) {
    const b = s0.get(id) ?? { runCnt: 0, runTimeNs: 0 };
    cnt += a.runCnt - b.runCnt;
    ns += a.runTimeNs - b.runTimeNs;
  }
  return { cnt, ns };
}

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}

async function main(): Promise<void> {
  const seconds = arg('--seconds', 3);
  const rounds = arg('--rounds', 3);
  const statsBefore = fs.readFileSync(STATS, 'utf8').trim();
  const lab = await Lab.create();
  try {
    fs.writeFileSync(STATS, '1');
    const tune = 'sysctl -qw net.ipv4.ip_local_port_range="1024 65535" net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096';
    const client = await lab.addHost('client', { address: `${CLIENT}/24` });
    const node = await lab.addHost('node', { address: `${NODE}/24` });
    await lab.sh(client, tune);
    await lab.sh(node, tune);
    for (let i = 0; i < BACKENDS.length; i++) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${BACKENDS[i]}/24` });
      await lab.sh(ns, tune);
      await startNginxBackend(lab, ns, `b${i + 1}`, 8080);
      if (i === 0) await startIperfServer(lab, ns, 5201);
    }
    const agent = await runAgent(lab, node, {
      node: { name: 'bench', interface: 'eth0' }, metrics: { listen: '' }, dataplane: 'kernel', kernel: { engine: 'ebpf' },
      pools: { 'range-global': `${VIP}-${VIP}` }, arp: FAST_ARP,
      services: [
        { name: 'web', ipam: 'pool', loadBalancerIP: VIP, ports: [{ name: 'http', port: 80, targetPort: 8080 }], backends: BACKENDS },
        // iperf3's control and data connections must reach the same server: b1 alone.
        { name: 'bulk', primaryService: 'web', ports: [{ name: 'iperf', port: 5201, targetPort: 5201 }], backends: [BACKENDS[0]!], healthCheck: { port: 8080 } },
      ],
    }, { name: 'nat-profile', command: OWN_BPFFS });
    try {
      await waitStatus(agent, 'the agent serving', (s) => s.services.length === 2 && s.services.every((x) => x.ready) && s.services[0]!.healthyBackends + s.services[1]!.healthyBackends === 4, 30_000);
      await natEngineServing(agent);
      const pid = agent.proc.pid!;
      const forwarded = async (): Promise<number> => Number(/IpForwDatagrams\s+(\d+)/.exec((await lab.exec(node, 'nstat', ['-az', 'IpForwDatagrams'])).stdout)?.[1] ?? NaN);
      const conntrack = async (): Promise<number> => (await lab.exec(node, 'conntrack', ['-L', '-s', CLIENT], { allowFail: true })).stdout.split('\n').filter((l) => l.trim() !== '').length;
      const rows: Record<string, { runsPerReq: number[]; nsPerRun: number[]; usPerReq: number[]; rps: number[]; forwarded: number[]; conntrack: number[] }> = {};
      for (let r = 0; r < rounds; r++) {
        for (const close of [false, true]) {
          const kind = close ? 'new connections' : 'keep-alive';
          const row = (rows[kind] ??= { runsPerReq: [], nsPerRun: [], usPerReq: [], rps: [], forwarded: [], conntrack: [] });
          const s0 = progStats(pid);
          const f0 = await forwarded();
          const w = await runWrk(lab, client, `http://${VIP}/`, { seconds, connections: 50, threads: 1, close });
          const f1 = await forwarded();
          const s1 = progStats(pid);
          const { cnt, ns } = progDelta(s0, s1);
          row.runsPerReq.push(cnt / w.requests);
          row.nsPerRun.push(ns / cnt);
          row.usPerReq.push(ns / w.requests / 1000);
          row.rps.push(w.rps);
          row.forwarded.push(f1 - f0);
          row.conntrack.push(await conntrack());
        }
      }
      const nic = async (field: string): Promise<number> => Number((await lab.exec(node, 'cat', [`/sys/class/net/eth0/statistics/${field}`])).stdout.trim());
      const bulk: Record<string, { runsPerFrame: number[]; bytesPerRun: number[]; nsPerRun: number[]; gbps: number[] }> = {};
      for (let r = 0; r < rounds; r++) {
        for (const reverse of [false, true]) {
          const row = (bulk[reverse ? 'bulk replies (iperf3 -R)' : 'bulk (iperf3)'] ??= { runsPerFrame: [], bytesPerRun: [], nsPerRun: [], gbps: [] });
          const s0 = progStats(pid);
          const p0 = await nic('rx_packets');
          const b0 = await nic('rx_bytes');
          const w = await runIperf(lab, client, VIP, 5201, seconds, { reverse });
          const p1 = await nic('rx_packets');
          const b1 = await nic('rx_bytes');
          const s1 = progStats(pid);
          const { cnt, ns } = progDelta(s0, s1);
          row.runsPerFrame.push(cnt / (p1 - p0));
          row.bytesPerRun.push((b1 - b0) / cnt);
          row.nsPerRun.push(ns / cnt);
          row.gbps.push(w.bitsPerSecond / 1e9);
        }
      }
      // The aggregate sizes the NIC allows (ip -d link: gso_max_size, gro_max_size; ethtool is not among the lab's tools).
      const offloads = ((await lab.exec(node, 'ip', ['-d', 'link', 'show', 'eth0'])).stdout.match(/\b(gso_max_size|gso_max_segs|gro_max_size) \d+/g) ?? []).join(', ');
      const load = fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
      console.log(`load ${load}; ${rounds} round(s) of ${seconds} s, wrk -t1 -c50; medians (min-max)`);
      console.log('| workload | program runs per request | ns per run | engine µs per request | req/s | stack-forwarded packets | conntrack entries of the client |');
      console.log('| --- | --- | --- | --- | --- | --- | --- |');
      const m = (xs: number[], d = 0): string => `${round(median(xs), d)} (${round(Math.min(...xs), d)}-${round(Math.max(...xs), d)})`;
      for (const [kind, x] of Object.entries(rows)) {
        console.log(`| ${kind} | ${m(x.runsPerReq, 2)} | ${m(x.nsPerRun)} | ${m(x.usPerReq, 2)} | ${m(x.rps)} | ${x.forwarded.join(' / ')} | ${x.conntrack.join(' / ')} |`);
      }
      console.log('');
      console.log(`iperf3 -t ${seconds} -O 1 through the VIP to b1; the node's eth0 (a veth): ${offloads}`);
      console.log('| workload | program runs per frame the node received | bytes per run | ns per run | Gbit/s |');
      console.log('| --- | --- | --- | --- | --- |');
      for (const [kind, x] of Object.entries(bulk)) {
        console.log(`| ${kind} | ${m(x.runsPerFrame, 2)} | ${m(x.bytesPerRun)} | ${m(x.nsPerRun)} | ${m(x.gbps, 2)} |`);
      }
    } finally {
      await stopAgent(agent);
    }
  } finally {
    fs.writeFileSync(STATS, statsBefore);
    await lab.destroy();
  }
}

if (require.main === module) {
  main().catch((e) => { console.error(e); process.exit(1); });
}
