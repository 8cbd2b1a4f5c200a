// Shared neighbour sockets (net/neighbour/neighbour-sockets.ts) over an
// in-memory socket: one ARP and one NDP socket per interface, opened with the
// first port and closed with the last; a frame reaches the ports of its
// sender and target addresses only; a malformed one is counted once; the ARP
// kernel filter widens at once for a new address and narrows to the exact set
// after the turn's attachments; solicited-node groups are left with the port;
// a refresh slot's announcements leave in one batch per socket.
// The kernel side (the filter accepted, probes and defence on one socket) is
// exercised by test/privileged/ipam-scale.test.ts and the ipam-* tests.
import { EventEmitter } from 'node:events';
import t from 'tap';
import type { BpfProgram, FrameInfo, PacketSocket, PacketSocketOptions } from '../../../agent/net/packet/packet';
import { bpfArp, bpfArpAboutAny, BPF_ARP_SET_MAX, formatBpf } from '../../../agent/net/packet/bpf';
import { NeighbourSockets } from '../../../agent/net/neighbour/neighbour-sockets';
import { arpAnnouncement, arpProbe, encodeArp } from '../../../agent/net/neighbour/arp';
import { encodeNdp, ndpDadProbe, ndpUnsolicitedAdvertisement } from '../../../agent/net/neighbour/ndp';
import { netMetrics } from '../../../agent/net/metrics';
import type { NdpSocket, NdpSocketOptions } from '../../../agent/net/neighbour/ndp-socket';
import { Registry } from 'prom-client';
import { ManualClock } from '../../../agent/clock';
import { LbError } from '../../../agent/errors';
import { VipOwner } from '../../../agent/net/neighbour/vip-owner';

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly sent: Buffer[] = [];
  readonly filters: BpfProgram[] = [];
  closed = false;
  refuseFilter = false;
  constructor(readonly ifindex: number, filter: BpfProgram | undefined) { super(); if (filter) this.filters.push(filter); }
  send(frame: Buffer): void { this.sent.push(frame); }
  setFilter(p: BpfProgram): void { if (this.refuseFilter) throw new Error('EINVAL'); this.filters.push(p); }
  close(): void { this.closed = true; }
  inject(frame: Buffer): void { this.emit('frame', frame, { csumNotReady: false, pktType: 1, ifindex: this.ifindex } satisfies FrameInfo); }
}

class FakeNdpSocket extends FakeSocket implements NdpSocket {
  readonly members: bigint[] = [];
  constructor(ifindex: number) { super(ifindex, undefined); }
  joinGroup(group: bigint): void { this.members.push(group); }
  leaveGroup(group: bigint): void { const i = this.members.indexOf(group); if (i >= 0) this.members.splice(i, 1); }
}

function setup(): { s: NeighbourSockets; opened: FakeSocket[]; opts: PacketSocketOptions[]; ndpOpened: FakeNdpSocket[]; ndpOpts: NdpSocketOptions[]; flush: () => void } {
  const opened: FakeSocket[] = [];
  const opts: PacketSocketOptions[] = [];
  const ndpOpened: FakeNdpSocket[] = [];
  const ndpOpts: NdpSocketOptions[] = [];
  const deferred: Array<() => void> = [];
  const s = new NeighbourSockets({
    open: (o) => { opts.push(o); const f = new FakeSocket(o.ifindex, o.filter); opened.push(f); return f; },
    openNdp: (o) => { ndpOpts.push(o); const f = new FakeNdpSocket(o.ifindex); ndpOpened.push(f); return f; },
    defer: (fn) => deferred.push(fn),
  });
  return { s, opened, opts, ndpOpened, ndpOpts, flush: () => { while (deferred.length > 0) deferred.shift()!(); } };
}

const OTHER = '02:00:00:00:00:99';
const A = 0x0a630064; // 10.99.0.100
const B = 0x0a630065;
const C = 0x0a630066;
const frames = (sock: PacketSocket): Buffer[] => { const got: Buffer[] = []; sock.on('frame', (f: Buffer) => got.push(f)); return got; };

t.test('one ARP socket per interface; a frame reaches the ports of its sender and target only', async (t) => {
  const { s, opened, opts, flush } = setup();
  const a = s.arp({ ifindex: 2, address: A });
  const b = s.arp({ ifindex: 2, address: B });
  const b2 = s.arp({ ifindex: 2, address: B }); // a prober and an owner of one address
  const elsewhere = s.arp({ ifindex: 3, address: A });
  flush();
  t.equal(opened.length, 2, 'one socket for ifindex 2, one for ifindex 3');
  t.same(opts.map((o) => [o.ifindex, o.protocol]), [[2, 0x0806], [3, 0x0806]]);
  const got = { a: frames(a), b: frames(b), b2: frames(b2), elsewhere: frames(elsewhere) };

  const aboutA = encodeArp(arpAnnouncement(OTHER, A));
  const aToB = encodeArp({ ...arpAnnouncement(OTHER, A), targetIp: B });
  const probeForB = encodeArp(arpProbe(OTHER, B));
  const stranger = encodeArp(arpAnnouncement(OTHER, C));
  for (const f of [aboutA, aToB, probeForB, stranger]) opened[0]!.inject(f);
  t.same(got.a, [aboutA, aToB], 'a: its sender-IP frames');
  t.same(got.b, [aToB, probeForB], 'b: the frame whose target it is, and the probe for it');
  t.same(got.b2, got.b, 'both ports of one address hear the same');
  t.same(got.elsewhere, [], 'another interface hears nothing of this one');
  t.match(s.counts(), { open: 2, opened: 2, ports: 4, delivered: 3, unclaimed: 1 });

  a.send(Buffer.from('out'));
  t.same(opened[0]!.sent.map(String), ['out'], 'sends go through the interface\'s socket');
  b.close();
  t.notOk(opened[0]!.closed, 'open while ports remain');
  a.close(); b2.close();
  t.ok(opened[0]!.closed, 'closed with its last port');
  t.notOk(opened[1]!.closed, 'the other interface\'s stays');
  t.throws(() => a.send(Buffer.from('x')), /closed/);
  a.close(); // idempotent
  elsewhere.close();
  t.match(s.counts(), { open: 0, ports: 0 });
});

t.test('the ARP filter: widened at once for a new address, the exact set after the turn, none missed', async (t) => {
  const { s, opened, flush } = setup();
  const a = s.arp({ ifindex: 2, address: A });
  const sock = opened[0]!;
  t.equal(formatBpf(sock.filters[0]!), formatBpf(bpfArpAboutAny([A])), 'opened with the first address\'s filter');
  const b = s.arp({ ifindex: 2, address: B });
  t.equal(formatBpf(sock.filters.at(-1)!), formatBpf(bpfArp()), 'a new address: every ARP frame passes at once');
  const c = s.arp({ ifindex: 2, address: C });
  t.equal(sock.filters.length, 2, 'the rest of the turn needs no more filters');
  flush();
  t.equal(formatBpf(sock.filters.at(-1)!), formatBpf(bpfArpAboutAny([A, B, C])), 'then exactly the three');
  const again = s.arp({ ifindex: 2, address: B });
  flush();
  t.equal(sock.filters.length, 3, 'an address already passed changes nothing');
  b.close();
  flush();
  t.equal(sock.filters.length, 3, 'still attached through another port: kept');
  again.close();
  flush();
  t.equal(formatBpf(sock.filters.at(-1)!), formatBpf(bpfArpAboutAny([A, C])), 'an address gone: narrowed after the turn');
  t.equal(s.counts().filters, 3);
  // A recompile the kernel refuses leaves the wider filter: only wake-ups.
  sock.refuseFilter = true;
  c.close();
  flush();
  t.equal(formatBpf(sock.filters.at(-1)!), formatBpf(bpfArpAboutAny([A, C])), 'kept the wider filter');
  // Widening refused: the port is not attached (it would miss frames), and the error says so.
  t.throws(() => s.arp({ ifindex: 2, address: B }), /EINVAL/);
  t.match(s.counts(), { ports: 1 });
  a.close();
  t.ok(sock.closed);
});

t.test('past BPF_ARP_SET_MAX addresses the filter stays on every ARP frame', async (t) => {
  const { s, opened, flush } = setup();
  const ports = Array.from({ length: BPF_ARP_SET_MAX + 1 }, (_, i) => s.arp({ ifindex: 2, address: 0x0a000000 + i }));
  flush();
  const sock = opened[0]!;
  t.equal(formatBpf(sock.filters.at(-1)!), formatBpf(bpfArp()));
  ports.pop()!.close();
  flush();
  t.equal(formatBpf(sock.filters.at(-1)!), formatBpf(bpfArpAboutAny(ports.map((_, i) => 0x0a000000 + i))), 'back within the limit: exact again');
  for (const p of ports) p.close();
  t.ok(sock.closed);
});

t.test('malformed frames are dropped and counted once, not once per port', async (t) => {
  const registry = new Registry();
  const metrics = netMetrics(registry);
  const { s, opened } = setup();
  const ports = [A, B, C].map((address) => s.arp({ ifindex: 2, address, metrics }));
  const got = ports.map(frames);
  const bad = encodeArp(arpAnnouncement(OTHER, A));
  bad.writeUInt16BE(7, 20); // ARP operation 7
  opened[0]!.inject(bad);
  opened[0]!.inject(bad.subarray(0, 30));
  const notArp = Buffer.from(bad); notArp.writeUInt16BE(0x0800, 12);
  opened[0]!.inject(notArp);
  t.same(got.map((g) => g.length), [0, 0, 0], 'no port sees them');
  const drops = (await registry.getSingleMetric('lbagent_net_frames_dropped_total')!.get()).values;
  t.same(drops.map((v) => [v.labels.reason, v.value]).sort(), [['bad-operation', 1], ['short', 1]], 'each counted once; a frame that is not ARP is no drop');
});

const v6 = (tail: number): bigint => (0xfd00n << 112n) | BigInt(tail);

t.test('one NDP socket per interface: demultiplexed by target and source; groups left with the port', async (t) => {
  const { s, opened, ndpOpened: ndp, ndpOpts } = setup();
  const p1 = s.ndp({ ifindex: 2, address: v6(1) });
  const p2 = s.ndp({ ifindex: 2, address: v6(2) });
  t.equal(ndp.length, 1, 'one NDP socket');
  t.equal(opened.length, 0, 'no packet socket of its own');
  t.equal(ndpOpts[0]!.ifindex, 2);
  const got1 = frames(p1);
  const got2 = frames(p2);
  const dad2 = encodeNdp(ndpDadProbe(OTHER, v6(2)));
  const adv1 = encodeNdp(ndpUnsolicitedAdvertisement(OTHER, v6(1)));
  const adv3 = encodeNdp(ndpUnsolicitedAdvertisement(OTHER, v6(3)));
  for (const f of [dad2, adv1, adv3]) ndp[0]!.inject(f);
  t.same(got1, [adv1]);
  t.same(got2, [dad2]);
  t.throws(() => s.ndp({ ifindex: 2, address: 1 }), TypeError, 'an NDP port takes an IPv6 value');
  t.throws(() => s.arp({ ifindex: 2, address: v6(1) }), TypeError);

  const group = (0xff02n << 112n) | 0x1ff000001n;
  p1.joinGroup(group);
  p2.joinGroup(group); // two addresses in one solicited-node group
  p1.joinGroup(group);
  p1.leaveGroup(group);
  t.same(ndp[0]!.members, [group, group], 'the socket counts each join');
  p1.close();
  t.same(ndp[0]!.members, [group], 'a closing port leaves what it still held, not another port\'s');
  p2.leaveGroup(group);
  p2.leaveGroup(group); // one more than it joined: not passed on
  t.same(ndp[0]!.members, []);
  p2.close();
  t.ok(ndp[0]!.closed);
  const arp = s.arp({ ifindex: 2, address: A });
  t.throws(() => (arp as unknown as NdpSocket).joinGroup(group), /joins no IPv6 group/, 'an ARP port joins no IPv6 group');
});

t.test('an error on the shared socket reaches every port that listens', async (t) => {
  const { s, opened } = setup();
  const a = s.arp({ ifindex: 2, address: A });
  const b = s.arp({ ifindex: 2, address: B });
  const seen: string[] = [];
  a.on('error', (e: Error) => seen.push(`a ${e.message}`));
  b.on('error', (e: Error) => seen.push(`b ${e.message}`));
  opened[0]!.emit('error', new Error('ENETDOWN'));
  t.same(seen, ['a ENETDOWN', 'b ENETDOWN']);
});

t.test('a refresh slot\'s announcements leave in one sendMany per socket; a frame that fails is not counted as sent', async (t) => {
  const clock = new ManualClock();
  const batches: Buffer[][] = [];
  let fail: Buffer | undefined;
  const s = new NeighbourSockets({
    clock,
    defer: () => undefined,
    open: (o) => Object.assign(new FakeSocket(o.ifindex, o.filter), {
      sendMany: (fs: readonly Buffer[]) => { batches.push([...fs]); return fs.map((f) => (f === fail ? new LbError('LB_ERR_NET_SOCKET', 'sending a frame failed: ENOBUFS') : undefined)); },
    }),
  });
  const registry = new Registry();
  const metrics = netMetrics(registry);
  const mac = '02:00:00:00:00:01';
  const owners = [A, B, C].map((ip) => new VipOwner({ socket: s.arp({ ifindex: 3, address: ip, metrics }), mac, ip, announceNum: 1, announceIntervalMs: 0, refreshMs: 1000, wheel: s.refresh, metrics }));
  for (const o of owners) o.start();
  t.same(batches, [], 'the start\'s announcements are sent one by one (a start throws when it cannot send)');
  clock.advance(1000);
  const expected = [A, B, C].map((ip) => encodeArp(arpAnnouncement(mac, ip)));
  t.same(batches, [expected], 'the slot\'s three refreshes in one batch, each owner\'s own frame');
  t.match(s.counts(), { batches: 1, batchedFrames: 3 });
  fail = batches[0]![1];
  clock.advance(1000);
  t.equal(batches.length, 2, 'one batch a slot');
  const text = await registry.metrics();
  t.match(text, /lbagent_net_vip_announcements_total\{reason="refresh"\} 5\n/, 'the failed refresh is not counted');
  for (const o of owners) o.close();
  clock.advance(1000);
  t.equal(batches.length, 2, 'closed owners send nothing');
});
