// bench/nat.ts, its pure half (and forwarding.ts's pairing of new
// connections and bulk that it asks for): ratios to direct are paired A-B-A
// where the run paired them, the targets are judged at their bounds, the
// flow maps' memory comes from the kernel's fdinfo of the two flow maps
// only, and the flows are spread under the descriptor limit.
import t from 'tap';
import { flowMapsMemory, flowsLayout, flowsLines, natRounds, natRows, natTable, natTargets, parseMapFdinfo, seriesByLabel, type FlowsResult, type NatResult } from '../../bench/nat';
import { medianAround, pairedBulk, pairedClose, type ForwardResult, type ForwardSample, type ForwardTargetSummary } from '../../bench/forwarding';
import type { IperfResult, WrkResult } from '../../bench/lib/load';

const wrk = (rps: number): WrkResult => ({ rps } as WrkResult);
const iperf = (gbps: number, error?: string): IperfResult => ({ bitsPerSecond: gbps * 1e9, retransmits: 0, ...(error ? { error } : {}) });

t.test('A-B-A: each run against the mean of the reference before and after it, the median over slots', async (t) => {
  t.equal(medianAround([{ value: 90, before: 100, after: 100 }, { value: 45, before: 40, after: 60 }, { value: 80, before: 100, after: 60 }]), 0.9);
  t.equal(medianAround([]), undefined);
  t.equal(medianAround([{ value: 90, before: 0, after: 100 }]), undefined, 'a reference run that served nothing is no pair');
  t.equal(medianAround([{ value: NaN, before: 100, after: 100 }]), undefined, 'a failed run is no pair');
});

t.test('new connections and bulk are paired only where the run measured direct around the slot', async (t) => {
  t.same(pairedClose([{ close: wrk(9_000), directClose: { before: wrk(10_000), after: wrk(10_000) } }, { close: wrk(4_000) }]), { xDirect: 0.9 });
  t.same(pairedClose([{ close: wrk(4_000) }]), {}, 'no pairs (a run without pairAll): no paired ratio');
  t.same(pairedBulk([{ bulk: iperf(3.8), directBulk: { before: iperf(4), after: iperf(4) } }]), { bulkXDirect: 0.95 });
  t.same(pairedBulk([{ bulk: iperf(3.8, 'the server is busy'), directBulk: { before: iperf(4), after: iperf(4) } }]), {}, 'an iperf3 error spoils the pair');
});

const summary = (o: { ka: number; kax?: number; nc: number; ncx?: number; bulk: number; bulkx?: number; rev: number; revx?: number; cpu?: number }, label = 'row'): ForwardTargetSummary => ({
  label,
  keepalive: { requestsPerSec: o.ka, p50ms: 0.5, p99ms: 5, ...(o.kax !== undefined ? { xDirect: o.kax } : {}), ...(o.cpu !== undefined ? { cpuOverDirectUs: o.cpu } : {}) },
  newConnections: { connectionsPerSec: o.nc, p50ms: 1, p99ms: 9, ...(o.ncx !== undefined ? { xDirect: o.ncx } : {}) },
  bulkGbps: o.bulk, ...(o.bulkx !== undefined ? { bulkXDirect: o.bulkx } : {}),
  bulkReverseGbps: o.rev, ...(o.revx !== undefined ? { bulkReverseXDirect: o.revx } : {}),
  rssMiB: 50, peakRssMiB: 60, errors: 0, samples: 3,
});

const forward = (summaries: ForwardResult['summary']): ForwardResult => ({ config: {} as ForwardResult['config'], summary: summaries, raw: [], errors: [] });

t.test('rows: paired ratios where present, ratios of medians where not; direct is the reference, not a row', async (t) => {
  const rows = natRows(forward({
    direct: summary({ ka: 40_000, nc: 10_000, bulk: 4, rev: 4 }, 'direct'),
    kernel: summary({ ka: 20_000, nc: 6_000, bulk: 3, rev: 3.6 }, 'nft'),
    ebpf: summary({ ka: 30_000, kax: 0.93, nc: 9_000, ncx: 0.91, bulk: 3.9, bulkx: 0.96, rev: 4, revx: 0.99, cpu: 1.5 }, 'ebpf'),
  }));
  t.same(rows.map((r) => r.target), ['kernel', 'ebpf']);
  const k = rows[0]!;
  t.same([k.keepalive, k.newConnections, k.bulk, k.bulkReplies], [0.5, 0.6, 0.75, 0.9], 'no pairs: ratios of medians');
  t.ok(Number.isNaN(k.cpuOverDirectUs), 'no CPU over direct when not measured');
  const e = rows[1]!;
  t.same([e.keepalive, e.newConnections, e.bulk, e.bulkReplies, e.cpuOverDirectUs], [0.93, 0.91, 0.96, 0.99, 1.5], 'paired ratios win over the medians (30k / 40k would be 0.75)');
});

t.test('like for like: ebpf1 (b1 alone, as direct) gets its own CPU line beside ebpf\'s, judged at the same bound', async (t) => {
  const at = (cpu: number, cpu1: number): NatResult => ({
    forward: forward({
      direct: summary({ ka: 1, nc: 1, bulk: 1, rev: 1 }),
      ebpf: summary({ ka: 1, kax: 1, nc: 1, ncx: 1, bulk: 1, bulkx: 1, rev: 1, revx: 1, cpu }),
      ebpf1: summary({ ka: 1, kax: 1, nc: 1, ncx: 1, bulk: 1, bulkx: 1, rev: 1, revx: 1, cpu: cpu1 }, 'b1 alone'),
      'ebpf-xdp': summary({ ka: 1, kax: 0.6, nc: 1, ncx: 0.7, bulk: 1, rev: 1, cpu: 4 }, 'xdp pass'),
    }),
  });
  t.same(natRows(at(2.5, 0.5).forward).map((r) => r.target), ['ebpf', 'ebpf1', 'ebpf-xdp'], 'the breakdown rows follow the engine\'s, in NAT_TARGETS order');
  const rows = natTargets(at(2.5, 0.5));
  t.equal(rows.length, 6, 'one line more than without ebpf1');
  t.same(rows.slice(4).map((r) => [r.measured, r.met]), [['+2.5 µs', false], ['+0.5 µs', true]], 'the spread over three nginx misses it, the engine itself meets it');
  t.match(rows[5]!.target, /like for like/);
  t.same(natTargets(at(1, 2.01)).slice(4).map((r) => r.met), [true, false], 'each line judged at its own bound');
  t.equal(natTargets(at(1, NaN))[5]!.measured, 'not measured');
});

const flows = (o: Partial<FlowsResult> = {}): FlowsResult => ({
  addresses: 6, backends: 7, asked: 100_000, opened: 100_000, failed: 0, openMs: 20_000, openErrors: {}, alive: 100_000, checkMs: 900,
  fill: { flows: 100_000, replies: 100_000, capacity: 262_144 }, events: { new: 100_000 }, conntrack: 3, perBackend: [14_000], maps: [], bytesPerFlow: 208.1, entryBytes: 40, agentRssMiB: 60, ...o,
});

t.test('targets: each judged at its bound, met exactly on it', async (t) => {
  const at = (kax: number, ncx: number, bulkx: number, revx: number, cpu: number): NatResult => ({
    forward: forward({ direct: summary({ ka: 1, nc: 1, bulk: 1, rev: 1 }), ebpf: summary({ ka: 1, kax, nc: 1, ncx, bulk: 1, bulkx, rev: 1, revx, cpu }) }),
  });
  t.same(natTargets(at(0.9, 0.9, 0.95, 0.95, 2)).map((r) => r.met), [true, true, true, true, true]);
  t.same(natTargets(at(0.89, 0.899, 0.949, 0.94, 2.01)).map((r) => r.met), [false, false, false, false, false]);
  const none = natTargets({ forward: forward({ direct: summary({ ka: 1, nc: 1, bulk: 1, rev: 1 }) }) });
  t.same(none.map((r) => r.met), [undefined, undefined, undefined, undefined, undefined], 'no eBPF row: not measured, not failed');
  t.equal(none.length, 5, 'no flows line when that part was not run');
});

t.test('flows held: met only when every connection echoed and the map holds them all', async (t) => {
  const base = { forward: forward({}) };
  t.same(natTargets({ ...base, flows: flows() }).slice(5).map((r) => r.met), [true, true]);
  t.equal(natTargets({ ...base, flows: flows({ alive: 99_999 }) })[5]!.met, false, 'one lost connection misses it');
  t.equal(natTargets({ ...base, flows: flows({ fill: { flows: 60_000, replies: 60_000, capacity: 65_536 } }) })[5]!.met, false, 'a map that holds fewer than the flows misses it');
  t.equal(natTargets({ ...base, flows: flows({ bytesPerFlow: NaN }) })[6]!.met, false, 'memory not found is not reported');
  const udp = { asked: 20_000, opened: 20_000, failed: 0, alive: 20_000, errors: {} };
  const both = { flows: 120_000, replies: 120_000, capacity: 262_144 };
  t.equal(natTargets({ ...base, flows: flows({ udp, fill: both }) })[5]!.met, true, 'UDP flows beside them: all answered again, all in the map');
  t.equal(natTargets({ ...base, flows: flows({ udp: { ...udp, alive: 19_999 }, fill: both }) })[5]!.met, false, 'one UDP flow unanswered misses it');
  t.equal(natTargets({ ...base, flows: flows({ udp }) })[5]!.met, false, 'a map that holds the TCP flows only misses it');
  t.equal(natTargets({ ...base, flows: flows({ udp, fill: both, placedDuringCheck: 3 }) })[5]!.met, false, 'flows placed anew while checked (entries lost) miss it');
  t.match(flowsLines({ ...base, flows: flows({ udp: { ...udp, failed: 2, opened: 19_998, errors: { ETIMEDOUT: 2 } }, fill: both }) })[0], /\| UDP flows asked \/ answered \/ failed \/ answered again after all were open \| 20,000 \/ 19,998 \/ 2 \(ETIMEDOUT 2\) \/ 20,000 \|/);
  const failed = natTargets({ ...base, flowsError: 'the agent would not start' });
  t.equal(failed[5]!.met, undefined);
  t.match(failed[5]!.measured, /not measured: the agent would not start/);
});

t.test('the table puts the targets under the rows', async (t) => {
  const text = natTable({ forward: forward({ direct: summary({ ka: 40_000, nc: 10_000, bulk: 4, rev: 4 }), ebpf: summary({ ka: 36_000, nc: 9_000, bulk: 4, rev: 4, cpu: -0.4 }, 'eBPF') }) });
  t.match(text, /\| eBPF \| 0\.90x \| 0\.90x \| 1\.00x \| 1\.00x \| -0\.4 \|/);
  t.match(text, /\| target \(the eBPF engine\) \| >= 0\.9x \| >= 0\.9x \| >= 0\.95x \| >= 0\.95x \| <= \+2 \|/);
});

t.test('the spread: each round\'s own pair beside the median, lowest and highest', async (t) => {
  const around = (v: number, a: number, b: number): Pick<ForwardSample, 'round' | 'target'> & Partial<ForwardSample> => ({
    keepalive: { ...wrk(v), labCpuUsPerRequest: v / 10_000 }, directKeepalive: { ...wrk(a), labCpuUsPerRequest: a / 10_000 }, directKeepaliveAfter: { ...wrk(b), labCpuUsPerRequest: b / 10_000 },
    close: wrk(v), directClose: { before: wrk(a), after: wrk(b) },
    bulk: iperf(v / 10_000), directBulk: { before: iperf(a / 10_000), after: iperf(b / 10_000) },
  } as Partial<ForwardSample> as ForwardSample);
  const raw = [
    { ...around(45_000, 50_000, 50_000), round: 0, target: 'ebpf' },
    { ...around(30_000, 20_000, 40_000), round: 1, target: 'ebpf' },
    { ...around(40_000, 40_000, 40_000), round: 2, target: 'ebpf' },
    { ...around(10_000, 40_000, 40_000), round: 0, target: 'kernel' },
  ] as ForwardSample[];
  const r = natRounds(raw, 'ebpf');
  t.same(r.keepalive, [0.9, 1, 1]);
  t.same(r.newConnections, [0.9, 1, 1]);
  t.same(r.bulk.map((x) => Math.round(x * 1000) / 1000), [0.9, 1, 1]);
  t.same(r.bulkReplies, [], 'no reverse pairs: none');
  t.same(r.cpuOverDirectUs.map((x) => Math.round(x * 10) / 10), [-0.5, 0, 0]);
  const text = natTable({ forward: { ...forward({ direct: summary({ ka: 40_000, nc: 10_000, bulk: 4, rev: 4 }), ebpf: summary({ ka: 36_000, kax: 1, nc: 9_000, ncx: 1, bulk: 4, rev: 4, cpu: 0 }, 'eBPF') }), raw } });
  t.match(text, /\| eBPF \| 1\.00x \(0\.90 to 1\.00\) \| 1\.00x \(0\.90 to 1\.00\) \| 1\.00x \(0\.90 to 1\.00\) \| 1\.00x \| \+0\.0 \(-0\.5 to \+0\.0\) \|/);
});

// Captured from /proc/<agent>/fdinfo on this kernel (6.18): an LRU hash flow map and the program.
const LRU_FDINFO = 'pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2077\nmap_type:\t9\nkey_size:\t16\nvalue_size:\t24\nmax_entries:\t262144\nmap_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t27263296\nmap_id:\t412\nfrozen:\t0\n';
const PROG_FDINFO = 'pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2077\nprog_type:\t3\nprog_jited:\t1\nprog_tag:\tb1e0d5a6c1f7c1d2\nmemlock:\t8192\nprog_id:\t901\nrun_time_ns:\t0\nrun_cnt:\t0\n';

t.test('fdinfo: a map is read, anything else is not a map', async (t) => {
  t.same(parseMapFdinfo(LRU_FDINFO), { mapType: 9, keySize: 16, valueSize: 24, maxEntries: 262_144, memlock: 27_263_296, mapId: 412 });
  t.equal(parseMapFdinfo(PROG_FDINFO), undefined);
  t.equal(parseMapFdinfo('pos:\t0\nflags:\t02\n'), undefined, 'a socket or a file');
});

t.test('memory per flow: the two flow maps, each once, over their entries', async (t) => {
  const flowsMap = parseMapFdinfo(LRU_FDINFO)!;
  const replies = { ...flowsMap, mapId: 413, memlock: 27_263_300 };
  const other = [{ ...flowsMap, mapId: 1, mapType: 1 }, { ...flowsMap, mapId: 2, maxEntries: 1 }, { ...flowsMap, mapId: 3, keySize: 8 }];
  // The agent holds a second fd of the flows map (its pin opened again): counted once.
  const got = flowMapsMemory([flowsMap, ...other, replies, { ...flowsMap }], 262_144, 16);
  t.same(got.maps.map((m) => m.mapId), [412, 413]);
  t.equal(got.bytesPerFlow, 208);
  t.ok(Number.isNaN(flowMapsMemory([flowsMap], 262_144, 16).bytesPerFlow), 'one map found: no number');
});

t.test('metrics: series summed by one label', async (t) => {
  const text = [
    '# HELP lbagent_forward_nat_flow_entries x',
    'lbagent_forward_nat_flow_entries{map="flows"} 100000',
    'lbagent_forward_nat_flow_entries{map="replies"} 99998',
    'lbagent_forward_nat_flow_entries{map="capacity"} 262144',
    'lbagent_forward_nat_events_total{event="new"} 7',
    'lbagent_forward_nat_events_total{event="new",extra="b"} 3',
  ].join('\n');
  t.same(seriesByLabel(text, 'lbagent_forward_nat_flow_entries', 'map'), { flows: 100_000, replies: 99_998, capacity: 262_144 });
  t.same(seriesByLabel(text, 'lbagent_forward_nat_events_total', 'event'), { new: 10 });
  t.same(seriesByLabel(text, 'lbagent_nothing', 'map'), {});
});

t.test('flows spread over processes and backends under the descriptor limit', async (t) => {
  const l = flowsLayout(100_000, 6, 20_000);
  t.equal(l.clients.length, 6);
  t.equal(l.clients.reduce((a, b) => a + b, 0), 100_000, 'every flow has a client');
  t.ok(l.clients.every((n) => n <= 20_000 - 512), `each client under the limit (${l.clients.join(', ')})`);
  t.ok((100_000 * 1.2) / l.backends <= 20_000 - 512, `${l.backends} backends hold a fifth over an even share`);
  t.equal(flowsLayout(300_000, 6, 20_000).clients.length, 16, 'more addresses when six cannot hold them');
  t.same(flowsLayout(10, 2, 20_000), { clients: [5, 5], backends: 3 });
  t.throws(() => flowsLayout(10, 2, 100), /leaves nothing/);
});
