// The kernel's side of a health transition on the nft table, apart from the
// agent: what one commit that changes one service's backends costs the
// kernel at 1,000 services (and at 10, the floor), for the table in the
// agent's shape and in candidate shapes, in a network namespace of its own.
//
// Each transition (one backend of a three-backend service out, then back)
// is written by `nft -f` of the delta under `strace -T -e sendmsg`: nf_tables
// runs a batch (its checks, the commit, the validation of the table's chain
// graph that a jump, goto or NAT rule or a jump/goto map element asks for)
// inside the sendmsg(2) that carries it, so the longest sendmsg of the run
// is the kernel's work on the commit, whatever nft did before it (its cache,
// parsing). The nft child's own user and system CPU (clock ticks of the
// reaped children, averaged over the runs) is given beside it. For the
// agent's shape the same transition is also written as the agent writes it,
// one nfnetlink batch from this process (net/netlink/nft-batch.ts), and this
// process's system CPU around the write is reported.
//
// Shapes (one TCP port a service, 2-4 of four backends, three named
// counters a backend, the byte-counter maps, as the scale bench has them):
// - agent, agent-hash: the agent's own render (renderNft), round-robin and
//   flow hash: the slot pick as a data map a port (slot -> address . port)
//   and one DNAT rule by it; round-robin over a fixed modulus, so a
//   transition among healthy sets whose tables divide it is elements only.
// - slotmap-rr, slotmap-hash: the slot pick as a data map, no backend
//   chains: `meta l4proto tcp dnat ip to numgen inc mod N map @<sp>` (or
//   jhash mod M, M the maglev table's fixed size) over a named map slot ->
//   address . port; connections counted after the DNAT, in postrouting (a
//   connection's first packet only), by a counter map keyed by VIP, backend,
//   protocol and port. A round-robin transition rewrites the rule (N
//   follows the healthy weights) and the map's elements; a hashed one
//   changes only the slots that moved.
// - slotmap-rr-fixed: round-robin over a fixed modulus (12, which every
//   healthy count of 1-4 equal weights divides): elements only, as hashed.
//
// With perf (unless --no-perf), the nft runs of each shape are sampled
// again, and the share of the samples in the kernel's validation functions
// (nft_chain_validate, nft_table_validate, the expressions' validate
// hooks) is reported: what of the commit is the validation.
//
//   node dist/bench/nft-commit.js [--services 1000] [--runs 30] [--no-perf] [--out FILE]
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { execFileSync, spawnSync } from 'node:child_process';
import { renderNft, renderNftDelta, type NftPlan } from '../agent/forward/nft';
import { dsrSlotTable } from '../agent/forward/maglev';
import { dsrSeed } from '../agent/forward/nft-dsr';
import { NftBatchWriter } from '../agent/net/netlink/nft-batch';
import type { ForwardService, ForwardState, Placement } from '../agent/forward/dataplane';
import { parseIPv4 } from '../agent/address';
import { median, round } from './lib/stats';
import { inOwnNetns } from './lib/netns-self';

const arg = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : dflt;
};

const POOL = ['10.96.0.11', '10.96.0.12', '10.96.0.13', '10.96.0.14'];
const TABLE = 'lb_agent';
/** Sample the nft runs with perf for the validation's share (--no-perf: not). */
const perf = !process.argv.includes('--no-perf');
/** The service whose backend goes and comes: index 1 has three backends. */
const CHANGED = 1;

/** Service i as the scale bench has it: 2, 3 or 4 of four backends; `down`: its first backend out of the healthy set. */
function service(i: number, down: boolean): ForwardService {
  const backends = Array.from({ length: 2 + (i % 3) }, (_, j) => ({ address: POOL[(i + j) % 4]!, addressNum: parseIPv4(POOL[(i + j) % 4]!)!, weight: 1 }));
  return {
    key: `default/s${i}`, vip: `10.97.${i >> 8}.${i & 255}`, backends, healthy: down ? backends.slice(1) : backends, sourceIP: 'snat',
    ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
  };
}

function state(n: number, down: boolean): ForwardState {
  return { services: Array.from({ length: n }, (_, i) => service(i, down && i === CHANGED)) };
}

/** A backend's part of an object name, as the agent writes it. */
const bid = (a: string): string => a.replace(/\./g, '_');

/**
 * The slot-map table: a service chain with one DNAT rule whose address and
 * port come from the slot map; connections counted in postrouting.
 */
function slotmapTable(n: number, hashed: boolean, slotsOf: (svc: ForwardService) => string[]): string {
  const counters: string[] = [];
  const maps: string[] = [];
  const chains: string[] = [];
  const dispatch: string[] = [];
  const conns: string[] = [];
  const toBackend: string[] = [];
  const toClient: string[] = [];
  for (let i = 0; i < n; i++) {
    const svc = service(i, false);
    const sp = `s${i}p0`;
    for (const b of svc.backends) {
      for (const k of ['conns', 'to_backend', 'to_client']) counters.push(`\tcounter ${sp}b${bid(b.address)}_${k} {}`);
      const key = `${svc.vip} . ${b.address} . tcp . 8080`;
      conns.push(`${key} : "${sp}b${bid(b.address)}_conns"`);
      toBackend.push(`${key} : "${sp}b${bid(b.address)}_to_backend"`);
      toClient.push(`${key} : "${sp}b${bid(b.address)}_to_client"`);
    }
    dispatch.push(`${svc.vip} . tcp . 80 : jump ${sp}`);
    const slots = slotsOf(svc);
    maps.push(`\tmap ${sp} {`, `\t\ttypeof numgen inc mod 2 : ip daddr . tcp dport`, `\t\telements = { ${slots.map((a, s) => `${s} : ${a} . 8080`).join(', ')} }`, '\t}');
    chains.push(`\tchain ${sp} {`, `\t\tmeta l4proto tcp dnat ip to ${pick(svc, slots.length, hashed)} map @${sp}`, '\t}');
  }
  const cmap = (name: string, elems: string[]): string[] => [`\tmap ${name} {`, '\t\ttype ipv4_addr . ipv4_addr . inet_proto . inet_service : counter', `\t\telements = { ${elems.join(', ')} }`, '\t}'];
  return [
    `table ip ${TABLE} {}`, `delete table ip ${TABLE}`, `table ip ${TABLE} {`,
    ...counters, ...maps,
    '\tmap services {', '\t\ttype ipv4_addr . inet_proto . inet_service : verdict', `\t\telements = { ${dispatch.join(', ')} }`, '\t}',
    ...cmap('conns', conns), ...cmap('to_backend', toBackend), ...cmap('to_client', toClient),
    '\tchain prerouting {', '\t\ttype nat hook prerouting priority dstnat; policy accept;', '\t\tfib daddr type local ip daddr . meta l4proto . th dport vmap @services', '\t}',
    '\tchain postrouting {', '\t\ttype nat hook postrouting priority srcnat; policy accept;',
    '\t\tct status dnat counter name ct original ip daddr . ip daddr . meta l4proto . th dport map @conns',
    '\t\tct status dnat ct original ip daddr 10.97.0.0/16 snat to ct original ip daddr', '\t}',
    '\tchain forward {', '\t\ttype filter hook forward priority filter; policy accept;',
    '\t\tct direction original counter name ct original ip daddr . ip daddr . meta l4proto . th dport map @to_backend',
    '\t\tct direction reply counter name ct original ip daddr . ip saddr . meta l4proto . th sport map @to_client', '\t}',
    ...chains, '}', '',
  ].join('\n');
}

const pick = (svc: ForwardService, slots: number, hashed: boolean): string =>
  (hashed ? `jhash ip saddr . th sport mod ${slots} seed ${dsrSeed(svc.key)}` : `numgen inc mod ${slots}`);

const rrSlots = (svc: ForwardService): string[] => svc.healthy.map((b) => b.address);
/** Round-robin over a fixed modulus of 12 slots (every healthy count of 1-4 equal weights divides it): a transition changes elements only. */
const FIXED = 12;
const rrFixedSlots = (svc: ForwardService): string[] => Array.from({ length: FIXED }, (_, s) => svc.healthy[s % svc.healthy.length]!.address);
const hashSlots = (svc: ForwardService): string[] => dsrSlotTable(svc.backends, svc.healthy).map((b) => b.address);

/** The slot-map transition of service CHANGED from `from` to `to` (down or up). */
function slotmapDelta(hashed: boolean, down: boolean, fixed = false): string {
  const before = service(CHANGED, !down);
  const after = service(CHANGED, down);
  const sp = `s${CHANGED}p0`;
  const slotsOf = hashed ? hashSlots : fixed ? rrFixedSlots : rrSlots;
  const a = slotsOf(before);
  const b = slotsOf(after);
  if (hashed || fixed) {
    // The same table size: only the slots that moved.
    const moved = b.map((x, s) => (x !== a[s] ? s : -1)).filter((s) => s >= 0);
    return [
      `delete element ip ${TABLE} ${sp} { ${moved.map((s) => `${s}`).join(', ')} }`,
      `add element ip ${TABLE} ${sp} { ${moved.map((s) => `${s} : ${b[s]} . 8080`).join(', ')} }`, '',
    ].join('\n');
  }
  return [
    `flush map ip ${TABLE} ${sp}`,
    `add element ip ${TABLE} ${sp} { ${b.map((x, s) => `${s} : ${x} . 8080`).join(', ')} }`,
    `flush chain ip ${TABLE} ${sp}`,
    `add rule ip ${TABLE} ${sp} meta l4proto tcp dnat ip to ${pick(after, b.length, false)} map @${sp}`, '',
  ].join('\n');
}

/** A table shape: its text at n services, and the delta of one transition. */
export interface Shape {
  readonly name: string;
  table(n: number): string;
  /** The delta taking the changed service down (true) or up (false). */
  delta(n: number, down: boolean): string;
  /** The agent's own plans, for the batch writer. */
  plans?(n: number): { up: NftPlan; down: NftPlan };
}

const agentShape = (name: string, placement: Placement): Shape => {
  const cache = new Map<number, { up: NftPlan; down: NftPlan }>();
  const plans = (n: number): { up: NftPlan; down: NftPlan } => {
    let p = cache.get(n);
    if (!p) { p = { up: renderNft(state(n, false), { placement }), down: renderNft(state(n, true), { placement }) }; cache.set(n, p); }
    return p;
  };
  return {
    name, plans,
    table: (n) => plans(n).up.script,
    delta: (n, down) => { const p = plans(n); return renderNftDelta(down ? p.up : p.down, down ? p.down : p.up)!.script; },
  };
};

export const SHAPES: readonly Shape[] = [
  agentShape('agent', 'round-robin'),
  agentShape('agent-hash', 'flow-hash'),
  { name: 'slotmap-rr', table: (n) => slotmapTable(n, false, rrSlots), delta: (_n, down) => slotmapDelta(false, down) },
  { name: 'slotmap-rr-fixed', table: (n) => slotmapTable(n, false, rrFixedSlots), delta: (_n, down) => slotmapDelta(false, down, true) },
  { name: 'slotmap-hash', table: (n) => slotmapTable(n, true, hashSlots), delta: (_n, down) => slotmapDelta(true, down) },
];

/** Reaped children's user and system CPU so far, in ms (/proc/self/stat cutime, cstime: clock ticks). */
function childCpu(): { user: number; sys: number } {
  const stat = fs.readFileSync('/proc/self/stat', 'utf8');
  // After the command's `)`: state is field 3, so cutime (16) and cstime (17) are at 13 and 14.
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const tick = 1000 / 100;
  return { user: Number(f[13]) * tick, sys: Number(f[14]) * tick };
}

function nftFile(file: string): void {
  const r = spawnSync('nft', ['-f', file], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`nft -f ${file}: ${r.stderr}`);
}

/** The longest sendmsg(2) of `nft -f file` in µs (the batch), by strace -T. */
function straceBatch(file: string, log: string): number {
  const r = spawnSync('strace', ['-T', '-e', 'trace=sendmsg', '-o', log, 'nft', '-f', file], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`nft -f ${file} under strace: ${r.stderr}`);
  let longest = 0;
  for (const line of fs.readFileSync(log, 'utf8').split('\n')) {
    const m = /<(\d+\.\d+)>$/.exec(line);
    if (m && line.startsWith('sendmsg')) longest = Math.max(longest, Number(m[1]) * 1e6);
  }
  return longest;
}

interface ShapeResult {
  shape: string;
  services: number;
  ruleset_lines: number;
  /** The batch's sendmsg, µs: median and quartiles. */
  commit_us: number;
  commit_us_q1: number;
  commit_us_q3: number;
  /** The nft child's CPU a run, ms (strace's own runs excluded). */
  nft_user_ms: number;
  nft_sys_ms: number;
  /** The agent's batch writer (agent shapes): this process's system and user CPU a write, µs, median. */
  batch_sys_us?: number;
  batch_user_us?: number;
  delta_lines: number;
  /** perf's samples of the nft runs: the share in nf_tables' validation (nft_*validate*), %, and its three largest symbols. */
  validate_pct?: number;
  validate_top?: string[];
}

/**
 * The share of perf's samples of `runs` nft -f runs (down and up in turn)
 * that fall in the kernel's validation functions (nft_chain_validate,
 * nft_table_validate, the expressions' own validate hooks): what of nft's
 * time is the validation of the chain graph.
 */
function validateShare(down: string, up: string, runs: number, dir: string): { pct: number; top: string[] } {
  const data = path.join(dir, 'perf.data');
  const loop = `i=0; while [ $i -lt ${runs} ]; do nft -f ${down} && nft -f ${up} || exit 1; i=$((i+2)); done`;
  const rec = spawnSync('perf', ['record', '-q', '-F', '2000', '-o', data, '--', 'sh', '-c', loop], { encoding: 'utf8' });
  if (rec.status !== 0) throw new Error(`perf record: ${rec.stderr}`);
  const rep = spawnSync('perf', ['report', '-i', data, '--stdio', '--no-children', '--sort', 'sym', '-q'], { encoding: 'utf8', maxBuffer: 1 << 26 });
  if (rep.status !== 0) throw new Error(`perf report: ${rep.stderr}`);
  let pct = 0;
  const top: string[] = [];
  for (const line of rep.stdout.split('\n')) {
    const m = /^\s*([\d.]+)%\s+\[k\]\s+(\S+)/.exec(line);
    // nf_tables' own (nft_chain_validate, nft_<expr>_validate), not netlink's attribute parsing (__nla_validate_parse).
    if (!m || !/^nft_\w*validate/.test(m[2]!)) continue;
    pct += Number(m[1]);
    if (top.length < 3) top.push(`${m[2]} ${m[1]}%`);
  }
  return { pct: round(pct, 1), top };
}

const quartile = (xs: number[], q: number): number => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(q * s.length))]!; };

async function measure(shape: Shape, n: number, runs: number, dir: string): Promise<ShapeResult> {
  const table = path.join(dir, `${shape.name}-${n}.nft`);
  fs.writeFileSync(table, shape.table(n));
  nftFile(table);
  const lines = execFileSync('nft', ['list', 'ruleset'], { encoding: 'utf8', maxBuffer: 1 << 28 }).split('\n').length;
  const down = path.join(dir, `${shape.name}-${n}-down.nft`);
  const up = path.join(dir, `${shape.name}-${n}-up.nft`);
  fs.writeFileSync(down, shape.delta(n, true));
  fs.writeFileSync(up, shape.delta(n, false));
  const commits: number[] = [];
  for (let r = 0; r < runs; r++) commits.push(straceBatch(r % 2 === 0 ? down : up, path.join(dir, 'strace.log')));
  const c0 = childCpu();
  for (let r = 0; r < runs; r++) nftFile(r % 2 === 0 ? down : up);
  const c1 = childCpu();
  const out: ShapeResult = {
    shape: shape.name, services: n, ruleset_lines: lines,
    commit_us: round(median(commits), 0), commit_us_q1: round(quartile(commits, 0.25), 0), commit_us_q3: round(quartile(commits, 0.75), 0),
    nft_user_ms: round((c1.user - c0.user) / runs, 2), nft_sys_ms: round((c1.sys - c0.sys) / runs, 2),
    delta_lines: fs.readFileSync(down, 'utf8').split('\n').filter((l) => l.trim() !== '').length,
  };
  if (perf) {
    const v = validateShare(down, up, runs, dir);
    out.validate_pct = v.pct;
    out.validate_top = v.top;
  }
  if (shape.plans) {
    const p = shape.plans(n);
    const dDown = renderNftDelta(p.up, p.down)!;
    const dUp = renderNftDelta(p.down, p.up)!;
    if (!dDown.ops || !dUp.ops) throw new Error(`the ${shape.name} transition has no typed form for the batch writer`);
    const w = new NftBatchWriter();
    const sys: number[] = [];
    const user: number[] = [];
    try {
      for (let r = 0; r < runs; r++) {
        const t = process.cpuUsage();
        await w.write(TABLE, r % 2 === 0 ? dDown.ops : dUp.ops);
        const d = process.cpuUsage(t);
        sys.push(d.system);
        user.push(d.user);
      }
    } finally { w.close(); }
    out.batch_sys_us = round(median(sys), 0);
    out.batch_user_us = round(median(user), 0);
  }
  execFileSync('nft', ['delete', 'table', 'ip', TABLE]);
  return out;
}

async function inner(): Promise<void> {
  const services = Number(arg('--services', '1000'));
  const runs = Number(arg('--runs', '30'));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-nft-commit-'));
  const results: ShapeResult[] = [];
  try {
    for (const n of [10, services]) {
      for (const shape of SHAPES) results.push(await measure(shape, n, runs, dir));
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const load = os.loadavg();
  const out = { kernel: os.release(), nft: execFileSync('nft', ['--version'], { encoding: 'utf8' }).trim(), load_1m_at_end: round(load[0]!, 2), runs, results };
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
}

if (require.main === module && inOwnNetns(__filename, 'lbnc', 'LB_NFT_COMMIT_INNER')) {
  // The batch writer's socket and timer do not hold the process up: this does, until the run ends.
  const alive = setInterval(() => undefined, 1000);
  void inner().then(() => clearInterval(alive), (err: unknown) => { process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`); process.exit(1); });
}
