// bench/forwarding.ts (pure parts): keep-alive "x direct" from the direct run
// paired with each slot is the median of the per-pair ratios (issue 17), not
// a ratio of medians that one swinging direct round can move.
import t from 'tap';
import { clientShape, DEFAULT_FORWARD_TARGETS, FORWARD_TARGETS, headerCost, pairedCpu, pairedRatio, pairedReplies, peerOf, peerRatio, referenceOf } from '../../bench/forwarding';
import type { IperfResult, WrkResult } from '../../bench/lib/load';

const wrk = (rps: number): WrkResult => ({ rps } as WrkResult);
const iperf = (gbps: number, error?: string): IperfResult => ({ bitsPerSecond: gbps * 1e9, ...(error ? { error } : {}) } as IperfResult);

t.test('the median of per-pair ratios follows each pair, whatever direct did in other rounds', async (t) => {
  // Direct swings 95k / 73k / 53k; the target tracks it at 0.8 / 0.9 / 0.85 in its own pairs.
  const samples = [
    { keepalive: wrk(76_000), directKeepalive: wrk(95_000) },
    { keepalive: wrk(65_700), directKeepalive: wrk(73_000) },
    { keepalive: wrk(45_050), directKeepalive: wrk(53_000) },
  ];
  t.same(pairedRatio(samples), { xDirect: 0.85 });
  // The ratio of medians would have said 65,700 / 73,000 = 0.9: a different number from the same runs.
});

t.test('no pairs (direct itself, direct not in the run, older results): no paired ratio', async (t) => {
  t.same(pairedRatio([{ keepalive: wrk(50_000) }]), {});
  t.same(pairedRatio([]), {});
  t.same(pairedRatio([{ keepalive: wrk(50_000), directKeepalive: wrk(0) }]), {}, 'a direct run that served nothing is no pair');
});

t.test('with direct measured after the slot too, the reference is the mean of before and after (A-B-A)', async (t) => {
  // The host speeds up through each slot: direct before alone (50k) would credit the target with the drift.
  const samples = [
    { keepalive: wrk(48_000), directKeepalive: wrk(50_000), directKeepaliveAfter: wrk(70_000) },
    { keepalive: wrk(40_000), directKeepalive: wrk(45_000), directKeepaliveAfter: wrk(55_000) },
    { keepalive: wrk(52_000), directKeepalive: wrk(60_000), directKeepaliveAfter: wrk(70_000) },
  ];
  t.same(pairedRatio(samples), { xDirect: 0.8 }, 'median of 0.8, 0.8, 0.8');
  t.same(pairedRatio([{ keepalive: wrk(48_000), directKeepalive: wrk(50_000), directKeepaliveAfter: wrk(0) }]), {}, 'an after run that served nothing spoils the pair');
  t.same(pairedRatio([{ keepalive: wrk(48_000), directKeepaliveAfter: wrk(60_000) }]), {}, 'no pair without the run before');
});

t.test('DSR replies: the median of per-round ratios to direct\'s iperf3 -R before and after the slot', async (t) => {
  const samples = [
    { bulkReverse: iperf(9.5), directBulkReverse: { before: iperf(9), after: iperf(11) } },
    { bulkReverse: iperf(7.2), directBulkReverse: { before: iperf(8), after: iperf(8) } },
    { bulkReverse: iperf(12), directBulkReverse: { before: iperf(12), after: iperf(13) } },
  ];
  t.same(pairedReplies(samples), { bulkReverseXDirect: 0.95 }, 'per round 0.95, 0.9, 0.96');
  t.same(pairedReplies([{ bulkReverse: iperf(9) }]), {}, 'older results: no pair');
  t.same(pairedReplies([{ bulkReverse: iperf(9), directBulkReverse: { before: iperf(9), after: iperf(0, 'connection refused') } }]), {}, 'a failed direct run is no pair');
  t.same(pairedReplies([{ bulkReverse: iperf(0, 'timeout'), directBulkReverse: { before: iperf(9), after: iperf(9) } }]), {}, 'a failed DSR run is no pair');
});

t.test('the PROXY header\'s cost is the median of per-round ratios to the same process without it', async (t) => {
  // The host slows from round to round; each pair is measured back to back (here the same before and after), so the ratio holds at ~0.97.
  const samples = [
    { keepalive: wrk(29_100), close: wrk(7_760), withoutHeader: { keepalive: wrk(30_000), close: wrk(8_000), after: { keepalive: wrk(30_000), close: wrk(8_000) } } },
    { keepalive: wrk(23_040), close: wrk(5_880), withoutHeader: { keepalive: wrk(24_000), close: wrk(6_000), after: { keepalive: wrk(24_000), close: wrk(6_000) } } },
    { keepalive: wrk(38_800), close: wrk(9_000), withoutHeader: { keepalive: wrk(40_000), close: wrk(9_400), after: { keepalive: wrk(40_000), close: wrk(9_400) } } },
  ];
  t.same(headerCost(samples), { xWithoutHeader: { keepalive: 0.97, newConnections: 0.97 } });
});

t.test('the header\'s reference is the mean of the runs right before and right after it (A-B-A)', async (t) => {
  // The host speeds up during each slot: the run before alone would make the header look free.
  const samples = [
    { keepalive: wrk(30_000), close: wrk(8_000), withoutHeader: { keepalive: wrk(29_000), close: wrk(7_600), after: { keepalive: wrk(33_000), close: wrk(9_000) } } },
  ];
  t.same(headerCost(samples), { xWithoutHeader: { keepalive: 0.968, newConnections: 0.964 } });
});

t.test('no header pairs (a plain target, older results, a pair that served nothing): no header cost', async (t) => {
  t.same(headerCost([{ keepalive: wrk(50_000), close: wrk(5_000) }]), {});
  t.same(headerCost([]), {});
  t.same(headerCost([{ keepalive: wrk(50_000), close: wrk(5_000), withoutHeader: { keepalive: wrk(0), close: wrk(5_000), after: { keepalive: wrk(0), close: wrk(5_000) } } }]), {});
});

t.test('lab CPU per request: the median, and the median excess over direct\'s runs before and after the slot', async (t) => {
  const cpu = (us: number | undefined): WrkResult & { labCpuUsPerRequest?: number } => ({ rps: 1, ...(us !== undefined ? { labCpuUsPerRequest: us } : {}) } as WrkResult);
  // The host's contention inflates every run of a round alike (direct 25 / 31 / 28): the excess stays near 4.
  const samples = [
    { keepalive: cpu(29), directKeepalive: cpu(24), directKeepaliveAfter: cpu(26) },
    { keepalive: cpu(35.5), directKeepalive: cpu(30), directKeepaliveAfter: cpu(32) },
    { keepalive: cpu(31), directKeepalive: cpu(27), directKeepaliveAfter: cpu(29) },
  ];
  t.same(pairedCpu(samples), { cpuUsPerRequest: 31, cpuOverDirectUs: 4 }, 'excess per round 4, 4.5, 3');
  t.same(pairedCpu([{ keepalive: cpu(20) }]), { cpuUsPerRequest: 20 }, 'direct itself: its own CPU, no excess');
  t.same(pairedCpu([{ keepalive: cpu(30), directKeepalive: cpu(25) }]), { cpuUsPerRequest: 30 }, 'no excess without the run after');
  t.same(pairedCpu([{ keepalive: cpu(undefined), directKeepalive: cpu(25), directKeepaliveAfter: cpu(25) }]), {}, 'older results, or a run that served nothing: nothing');
});

t.test('issue 48: the engine\'s breakdown rows are paired with direct, with its client, and run in the forward area only when named', async (t) => {
  t.equal(referenceOf('ebpf1'), 'direct', 'b1 alone against direct to b1');
  t.equal(referenceOf('ebpf-xdp'), 'direct');
  t.same(clientShape('ebpf1', { threads: 1, connections: 50 }), { threads: 1, connections: 50 }, 'the same wrk as direct and ebpf');
  t.same(FORWARD_TARGETS.filter((x) => !DEFAULT_FORWARD_TARGETS.includes(x)), ['ebpf1', 'ebpf-xdp'], 'the forward area\'s default leaves out these two alone');
});

t.test('issue 17, like for like: dsr3 and kernel3 are paired with direct3, and all three share one client shape', async (t) => {
  t.equal(referenceOf('dsr'), 'direct', 'the existing rows keep direct as their reference');
  t.equal(referenceOf('dsr1'), 'direct');
  t.equal(referenceOf('direct3'), 'direct', 'direct3 itself is measured against direct');
  t.equal(referenceOf('dsr3'), 'direct3');
  t.equal(referenceOf('kernel3'), 'direct3');
  t.equal(referenceOf('direct'), undefined);
  const o = { threads: 1, connections: 50 };
  t.same(clientShape('dsr', o), { threads: 1, connections: 50 }, 'the existing rows keep wrk -t1 -c50');
  t.same(clientShape('direct3', o), { threads: 3, connections: 51, addresses: ['10.99.0.11', '10.99.0.12', '10.99.0.13'] }, 'one thread per backend, 17 connections each');
  t.same(clientShape('dsr3', o), { threads: 3, connections: 51, addresses: ['10.99.0.52'] }, 'the same wrk, every thread to the DSR VIP');
  t.same(clientShape('kernel3', o), { threads: 3, connections: 51, addresses: ['10.99.0.50'] });
});

t.test('issue 18: the proxy rows are judged against the HAProxy measured beside them, A-B-A in their own slot', async (t) => {
  t.equal(peerOf('proxy1'), 'haproxy1', 'one worker against one thread');
  t.equal(peerOf('proxy'), 'haproxy', 'one worker per CPU against HAProxy\'s default threads');
  t.equal(peerOf('kernel'), undefined, 'no other row starts a peer');
  t.equal(peerOf('haproxy1'), undefined);
  // The lab's two states: the slots' medians would read 30,000 / 36,000 = 0.83x; each pair reads ~1.03x.
  const ab = (ka: number, before: number, after: number, nc: number, cBefore: number, cAfter: number) => ({
    keepalive: wrk(ka), close: wrk(nc),
    peerRuns: { peer: 'haproxy1' as const, keepalive: { before: wrk(before), after: wrk(after) }, close: { before: wrk(cBefore), after: wrk(cAfter) } },
  });
  const samples = [ab(37_080, 35_000, 37_000, 7_000, 7_200, 6_800), ab(28_840, 27_000, 29_000, 5_400, 5_800, 6_200), ab(30_000, 31_000, 29_000, 6_300, 7_000, 7_000)];
  t.same(peerRatio(samples), { xPeer: { peer: 'haproxy1', keepalive: 1.03, newConnections: 0.9, rounds: { keepalive: [1.03, 1.03, 1], newConnections: [1, 0.9, 0.9] } } },
    'keep-alive per round 1.03, 1.03, 1.0; new connections 1.0, 0.9, 0.9');
  // The host speeds up through the slot: the run before alone would credit the target with the drift.
  t.same(peerRatio([ab(33_000, 30_000, 36_000, 6_000, 5_000, 7_000)]).xPeer?.rounds, { keepalive: [1], newConnections: [1] }, 'the reference is the mean of before and after');
  t.same(peerRatio([{ keepalive: wrk(30_000), close: wrk(6_000) }]), {}, 'older results: no pair');
  t.same(peerRatio([]), {});
  t.same(peerRatio([ab(30_000, 30_000, 0, 6_000, 6_000, 6_000)]), {}, 'a peer run that served nothing spoils the pair');
});

t.test('issue 18: a slot\'s further pairs chain on its last peer run, every pair in the median', async (t) => {
  // Peer 30k, target 33k, peer 36k, target 36k, peer 36k, target 30k, peer 24k: pairs 1.0, 1.0, 1.0;
  // another slot of one pair at 0.9: the median over all four pairs is 1.0.
  const chained = {
    keepalive: wrk(33_000), close: wrk(6_000),
    peerRuns: {
      peer: 'haproxy' as const,
      keepalive: { before: wrk(30_000), after: wrk(36_000) },
      close: { before: wrk(6_000), after: wrk(6_000) },
      more: {
        keepalive: [{ target: wrk(36_000), after: wrk(36_000) }, { target: wrk(30_000), after: wrk(24_000) }],
        close: [{ target: wrk(5_400), after: wrk(6_000) }, { target: wrk(6_600), after: wrk(6_000) }],
      },
    },
  };
  const single = { keepalive: wrk(27_000), close: wrk(6_000), peerRuns: { peer: 'haproxy' as const, keepalive: { before: wrk(30_000), after: wrk(30_000) }, close: { before: wrk(6_000), after: wrk(6_000) } } };
  t.same(peerRatio([chained, single]), { xPeer: { peer: 'haproxy', keepalive: 1, newConnections: 1, rounds: { keepalive: [1, 1, 1, 0.9], newConnections: [1, 0.9, 1.1, 1] } } },
    'each target run against the peer runs on either side of it');
  const spoiled = { ...chained, peerRuns: { ...chained.peerRuns, more: { ...chained.peerRuns.more, close: [{ target: wrk(5_400), after: wrk(0) }] } } };
  t.same(peerRatio([spoiled, single]).xPeer?.rounds, { keepalive: [0.9], newConnections: [1] }, 'a chained peer run that served nothing spoils its slot');
});
