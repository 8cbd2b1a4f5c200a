// What the agent's nft table costs each address family, in kernel CPU per
// request: the families lab (bench/families.ts: a client, a node, three
// nginx backends, both families everywhere), the real agent started once
// to serve its RequireDualStack service, and its own table (`nft list
// table ip lb_agent`, `... ip6 lb_agent`) taken from the node. The agent
// is then stopped and that table loaded by hand with the VIPs replaced by
// the node's own addresses, whole and in variants, each a small diff of
// it, beside the families bench's nat floor and the running agent:
//   live        the agent itself serving its VIPs (its table, and its
//               sockets on the node's NIC: ARP's packet socket, NDP's raw
//               ICMPv6 socket and the packet socket it sends by);
//   agent       the table as the agent writes it, with no agent running;
//   no-forward  without the forward chain's two byte-counter rules (the
//               only rules every packet of a flow walks; the nat chains see
//               a flow's first packet only);
//   no-fib      without `fib daddr type local` in front of the dispatch map;
//   floor       the hand-written conntrack + round-robin DNAT + SNAT table.
// Each variant, family and kind (keep-alive, new connections) gets a wrk
// run under `perf record -a -g`; the number is the CPU time per request in
// the netfilter hooks (nf_hook_slow, callees included), in the filter
// chains (nft_do_chain_ipv4/6) and in packet sockets' receive (packet_rcv),
// counted in the lab's own processes by pid (wrk and the nginx: a veth's
// softirq runs in the sender's context; what the softirq threads do is
// left out, as they serve every other lab on the machine too). Sampled CPU time per request does not move with
// what else the machine runs, which throughput on a shared 2-CPU host does
// by more than a family costs. Only lab namespaces are addressed.
//
//   node dist/bench/families-cost.js [--rounds 4] [--seconds 3] [--out FILE.md]
//     [--variants live,floor] [--keep-perf DIR]   (some variants only; keep
//     each run's perf.data in DIR for `perf report` beside another's)
import * as fs from 'node:fs';
import * as path from 'node:path';
import { spawn } from 'node:child_process';
import { Lab, run } from '../lab/netns';
import { runAgent, stopAgent } from './lib/agent';
import { runWrk } from './lib/load';
import { loadAverage, machineFacts } from './lib/procfs';
import { median, round, rotate } from './lib/stats';
import { agentConfig, familiesLab, familiesServing, natFloorScript, NODE, VIP } from './families';

export const COST_VARIANTS = ['live', 'agent', 'no-forward', 'no-fib', 'floor'] as const;
export type CostVariant = (typeof COST_VARIANTS)[number];
type Family = 'v4' | 'v6';
type Kind = 'keepalive' | 'close';

const PERF_HZ = 2000;

export interface CostRun {
  round: number; variant: CostVariant; kind: Kind; family: Family;
  rps: number; requests: number;
  /** µs of CPU per request in the netfilter hooks, callees included. */
  hooksUs: number;
  /** µs of CPU per request in the filter chains (forward, input). */
  filterUs: number;
  /** µs of CPU per request in packet sockets' receive (packet_rcv and its filter). */
  tapUs: number;
}

/**
 * The variants of the agent's table (as `nft list` prints it), its VIPs
 * replaced by the node's addresses; `floor` is the families bench's.
 */
export function costVariants(agentTable: string): Record<Exclude<CostVariant, 'live'>, string> {
  const base = agentTable.split(VIP.v6).join(NODE.v6).split(VIP.v4).join(NODE.v4);
  const forward = /^\s*ct direction (original|reply) counter name .*$/gm;
  const fib = 'fib daddr type local ';
  if (base.match(forward)?.length !== 4) throw new Error('families-cost: the agent\'s table has not the two forward rules per family this bench removes');
  if (base.split(fib).length !== 5) throw new Error('families-cost: the agent\'s table has not the two fib checks per family this bench removes');
  return { agent: base, 'no-forward': base.replace(forward, ''), 'no-fib': base.split(fib).join(''), floor: natFloorScript(true) };
}

/** Inclusive sample share (absolute %, of every sample) of each symbol, from `perf report --children`. */
export function childrenShares(report: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of report.split('\n')) {
    const m = /^\s*([\d.]+)%\s+[\d.]+%\s+(?:\d+\s+)?\[[k.]\]\s+(\S+)/.exec(line);
    if (m && !out.has(m[2]!)) out.set(m[2]!, Number(m[1]));
  }
  return out;
}

async function perfShares(file: string, pids: readonly number[]): Promise<{ total: number; shares: Map<string, number> }> {
  const byComm = await run('perf', ['report', '-i', file, '--no-children', '--sort', 'comm', '--stdio', '-g', 'none', '-n']);
  let total = 0;
  for (const line of byComm.stdout.split('\n')) {
    const m = /^\s*[\d.]+%\s+(\d+)\s/.exec(line);
    if (m) total += Number(m[1]);
  }
  const r = await run('perf', ['report', '-i', file, '--children', '--pid', pids.join(','), '--sort', 'sym', '--stdio', '-g', 'none']);
  return { total, shares: childrenShares(r.stdout) };
}

export async function benchFamiliesCost(o: { rounds: number; seconds: number; variants?: readonly CostVariant[]; keepPerf?: string; log: (m: string) => void }): Promise<{ runs: CostRun[]; load: number[] }> {
  const lab = await Lab.create();
  const runs: CostRun[] = [];
  const load: number[] = [];
  try {
    const { client, node, backendNs } = await familiesLab(lab);
    const agent = await runAgent(lab, node, agentConfig('kernel'), { name: 'fam-cost' });
    let table: string;
    try {
      await familiesServing(agent);
      table = (await lab.exec(node, 'nft', ['list', 'table', 'ip', 'lb_agent'])).stdout + (await lab.exec(node, 'nft', ['list', 'table', 'ip6', 'lb_agent'])).stdout;
    } finally {
      await stopAgent(agent);
    }
    const variants = costVariants(table);
    const nsPids = async (ns: string): Promise<number[]> => (await lab.exec(ns, 'ip', ['netns', 'pids', ns])).stdout.split('\n').filter((l) => /^\d+$/.test(l.trim())).map(Number);
    const backendPids = (await Promise.all(backendNs.map(nsPids))).flat();
    for (let r = 0; r < o.rounds; r++) {
      for (const variant of rotate(o.variants ?? COST_VARIANTS, r)) {
        await lab.exec(node, 'nft', ['flush', 'ruleset']);
        const live = variant === 'live' ? await runAgent(lab, node, agentConfig('kernel'), { name: `fam-cost-${r}` }) : undefined;
        try {
          if (live) await familiesServing(live);
          else {
            await lab.sh(node, 'sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1');
            await lab.exec(node, 'nft', ['-f', '-'], { input: variants[variant as Exclude<CostVariant, 'live'>] });
          }
          const url = (f: Family): string => {
            const a = live ? VIP : NODE;
            return f === 'v4' ? `http://${a.v4}/` : `http://[${a.v6}]/`;
          };
          for (const kind of ['keepalive', 'close'] as const) {
            for (const family of rotate(['v4', 'v6'] as const, r)) {
              const close = kind === 'close';
              await runWrk(lab, client, url(family), { seconds: 1, connections: 50, threads: 1, close });
              const file = path.join(lab.dir, `perf-${r}-${variant}-${kind}-${family}.data`);
              const perf = spawn('perf', ['record', '-q', '-a', '-g', '-F', String(PERF_HZ), '-o', file, '--', 'sleep', String(o.seconds + 0.6)], { stdio: 'ignore' });
              const perfDone = new Promise<void>((resolve) => perf.on('exit', () => resolve()));
              await new Promise((resolve) => setTimeout(resolve, 300));
              const wrk = runWrk(lab, client, url(family), { seconds: o.seconds, connections: 50, threads: 1, close });
              await new Promise((resolve) => setTimeout(resolve, 300));
              const clientPids = await nsPids(client);
              const w = await wrk;
              await perfDone;
              const { total, shares } = await perfShares(file, [...clientPids, ...backendPids]);
              if (o.keepPerf) fs.renameSync(file, path.join(o.keepPerf, path.basename(file)));
              else fs.rmSync(file, { force: true });
              // A run perf read no sample of the lab in (it lost the race with wrk's start): NaN, left out of the medians.
            const read = total > 0 && shares.has('nf_hook_slow') && w.requests > 0;
            const us = (sym: string): number => (read ? round(((shares.get(sym) ?? 0) / 100) * total / PERF_HZ * 1e6 / w.requests, 3) : NaN);
              runs.push({ round: r, variant, kind, family, rps: w.rps, requests: w.requests, hooksUs: us('nf_hook_slow'), filterUs: us(family === 'v4' ? 'nft_do_chain_ipv4' : 'nft_do_chain_ipv6'), tapUs: us('packet_rcv') });
            }
          }
        } finally {
          if (live) await stopAgent(live);
        }
        load.push(loadAverage()[0]);
        o.log(`round ${r + 1} ${variant}: ${runs.filter((x) => x.round === r && x.variant === variant).map((x) => `${x.kind} ${x.family} ${x.hooksUs} us`).join(', ')}`);
      }
    }
  } finally {
    await lab.destroy();
  }
  return { runs, load };
}

/** The report: per variant and kind, medians over rounds; runs: the IPv6 runs read. */
export function costTable(runs: readonly CostRun[]): string {
  const rows = ['| variant | kind | netfilter µs/req IPv4 | IPv6 | IPv6 − IPv4 | filter chains µs/req IPv4 | IPv6 | packet sockets µs/req IPv4 | IPv6 | req/s IPv4 | IPv6 | runs |', '| --- | --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |'];
  for (const variant of COST_VARIANTS) {
    for (const kind of ['keepalive', 'close'] as const) {
      const of = (f: Family): CostRun[] => runs.filter((x) => x.variant === variant && x.kind === kind && x.family === f);
      const m = (f: Family, k: 'hooksUs' | 'filterUs' | 'tapUs' | 'rps'): number => median(of(f).map((x) => x[k]).filter(Number.isFinite));
      const diffs = of('v6').map((x) => x.hooksUs - (of('v4').find((y) => y.round === x.round)?.hooksUs ?? NaN)).filter(Number.isFinite);
      if (of('v4').length === 0) continue;
      rows.push(`| ${variant} | ${kind === 'close' ? 'new connections' : 'keep-alive'} | ${m('v4', 'hooksUs').toFixed(2)} | ${m('v6', 'hooksUs').toFixed(2)} | ${median(diffs).toFixed(2)} | ${m('v4', 'filterUs').toFixed(2)} | ${m('v6', 'filterUs').toFixed(2)} | ${m('v4', 'tapUs').toFixed(2)} | ${m('v6', 'tapUs').toFixed(2)} | ${round(m('v4', 'rps'), 0)} | ${round(m('v6', 'rps'), 0)} | ${of('v6').filter((x) => Number.isFinite(x.hooksUs)).length} |`);
    }
  }
  return rows.join('\n');
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const opt = (name: string, def: string): string => { const i = args.indexOf(name); return i >= 0 && args[i + 1] !== undefined ? args[i + 1]! : def; };
  const rounds = Number(opt('--rounds', '4'));
  const seconds = Number(opt('--seconds', '3'));
  const out = opt('--out', '');
  const variants = opt('--variants', COST_VARIANTS.join(',')).split(',') as CostVariant[];
  const keepPerf = opt('--keep-perf', '');
  if (variants.some((v) => !COST_VARIANTS.includes(v))) throw new Error(`families-cost: --variants takes some of ${COST_VARIANTS.join(',')}`);
  if (!Number.isInteger(rounds) || rounds < 1 || !(seconds > 0)) throw new Error('families-cost: --rounds takes a whole number >= 1, --seconds a number > 0');
  const started = new Date();
  const loadBefore = loadAverage();
  if (keepPerf) fs.mkdirSync(keepPerf, { recursive: true });
  const r = await benchFamiliesCost({ rounds, seconds, variants, keepPerf: keepPerf ? path.resolve(keepPerf) : undefined, log: (m) => process.stderr.write(`${m}\n`) });
  const m = machineFacts();
  const text = [
    `# families-cost, ${started.toISOString().slice(0, 10)}`, '',
    `Machine: ${m.cpus} vCPU (${m.cpuModel}), Linux ${m.kernel}, ${m.os}, Node ${m.node}.  `,
    `Load average (1 min): ${loadBefore[0]} at the start, mean ${round(r.load.reduce((a, b) => a + b, 0) / Math.max(1, r.load.length), 2)} and max ${round(Math.max(...r.load), 2)} over the variants' slots.  `,
    `Run: \`node dist/bench/families-cost.js --rounds ${rounds} --seconds ${seconds}${variants.length < COST_VARIANTS.length ? ` --variants ${variants.join(',')}` : ''}\`, ${started.toISOString()} to ${new Date().toISOString()}.`, '',
    'CPU per request from `perf record -a -g -F 2000` around each wrk run (wrk -t1 -c50; new connections: `Connection: close`), samples of the lab\'s own processes (wrk and the nginx, by pid); netfilter: nf_hook_slow with its callees (conntrack, NAT, the chains); filter chains: nft_do_chain_ipv4/6 (the forward and input chains; the nat chains run from the NAT hooks and count under netfilter only); packet sockets: packet_rcv (the running agent\'s ARP socket; NDP is heard on a raw ICMPv6 socket, which IPv6 frames of other protocols never reach). IPv6 − IPv4: median over rounds of the two families\' runs in the same slot. Medians over rounds.', '',
    costTable(r.runs), '',
  ].join('\n');
  if (out) fs.writeFileSync(out, text);
  process.stdout.write(text);
  if (out) fs.writeFileSync(out.replace(/\.md$/, '.json'), `${JSON.stringify(r, null, 1)}\n`);
}

if (require.main === module) main().catch((e: unknown) => { process.stderr.write(`${String((e as Error).stack ?? e)}\n`); process.exit(1); });
