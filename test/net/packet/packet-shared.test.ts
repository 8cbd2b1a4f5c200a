// Shared packet sockets (net/packet/packet-shared.ts) over an in-memory socket: one
// socket per parent, opened with the first port and closed with the last; a
// frame reaches exactly one port - by the ifindex the kernel reported, or, for
// one received on the parent itself, by its owner's MAC - and sends go
// through the shared socket, out of the port's own macvlan. The kernel side (a parent's socket sees a macvlan's
// unicast frames with the macvlan's ifindex) is exercised by
// test/privileged/dhcp-many.test.ts.
import { EventEmitter } from 'node:events';
import t from 'tap';
import type { FrameInfo, PacketSocket, PacketSocketOptions } from '../../../agent/net/packet/packet';
import { PacketSocketGroup } from '../../../agent/net/packet/packet-shared';

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly sent: Array<[string, number | undefined]> = [];
  closed = false;
  constructor(readonly ifindex: number) { super(); }
  send(frame: Buffer, ifindex?: number): void { this.sent.push([String(frame), ifindex]); }
  close(): void { this.closed = true; }
}

function group(): { g: PacketSocketGroup; opened: FakeSocket[]; opts: PacketSocketOptions[] } {
  const opened: FakeSocket[] = [];
  const opts: PacketSocketOptions[] = [];
  // The owner of a frame received on the parent: here its first six bytes, as a MAC.
  const owner = (f: Buffer): string | undefined => (f.length >= 6 ? [...f.subarray(0, 6)].map((b) => b.toString(16).padStart(2, '0')).join(':') : undefined);
  const g = new PacketSocketGroup({ protocol: 0x0800, owner, open: (o) => { opts.push(o); const s = new FakeSocket(o.ifindex); opened.push(s); return s; } });
  return { g, opened, opts };
}

const info = (ifindex: number | undefined): FrameInfo => ({ csumNotReady: false, pktType: 0, ifindex });
const MAC_A = '02:00:00:00:00:0a';
const MAC_B = '02:00:00:00:00:0b';
const frameFor = (mac: string): Buffer => Buffer.concat([Buffer.from(mac.replace(/:/g, ''), 'hex'), Buffer.from('payload')]);

t.test('one socket per parent; each frame reaches exactly its port', async (t) => {
  const { g, opened, opts } = group();
  const a = g.attach({ parentIfindex: 2, ifindex: 10, mac: MAC_A });
  const b = g.attach({ parentIfindex: 2, ifindex: 11, mac: MAC_B.toUpperCase() });
  const other = g.attach({ parentIfindex: 3, ifindex: 20, mac: '02:00:00:00:00:0c' });
  t.equal(opened.length, 2, 'one socket for parent 2, one for parent 3');
  t.same(opts.map((o) => [o.ifindex, o.protocol]), [[2, 0x0800], [3, 0x0800]], 'bound to the parents');
  const got: Record<string, Buffer[]> = { a: [], b: [], other: [] };
  a.on('frame', (f: Buffer) => got.a!.push(f));
  b.on('frame', (f: Buffer) => got.b!.push(f));
  other.on('frame', (f: Buffer) => got.other!.push(f));

  const unicastB = frameFor(MAC_A); // the ifindex decides, not the bytes
  opened[0]!.emit('frame', unicastB, info(11));
  const broadcastA = frameFor(MAC_A);
  opened[0]!.emit('frame', broadcastA, info(2));
  opened[0]!.emit('frame', frameFor('02:00:00:00:00:99'), info(2)); // the parent's own, or a stranger's
  opened[0]!.emit('frame', frameFor(MAC_B), info(99)); // another macvlan of the parent, not ours
  opened[0]!.emit('frame', frameFor(MAC_B), info(undefined)); // an addon without ifindex: by owner
  t.same(got.a, [broadcastA], 'a: the broadcast whose owner it is');
  t.equal(got.b!.length, 2, 'b: the unicast the kernel handed to its ifindex, and the one found by owner');
  t.equal(got.b![0], unicastB);
  t.same(got.other, [], 'the other parent\'s port sees nothing of parent 2');
  t.same(g.counts(), { opened: 2, attached: 3, delivered: 3, unclaimed: 2 });

  a.send(Buffer.from('x'));
  b.send(Buffer.from('y'));
  t.same(opened[0]!.sent, [['x', 10], ['y', 11]], 'sends go through the shared socket, each out of its own macvlan');
  t.throws(() => g.attach({ parentIfindex: 2, ifindex: 10, mac: '02:00:00:00:00:0d' }), RangeError, 'one port per macvlan');
  t.throws(() => g.attach({ parentIfindex: 2, ifindex: 12, mac: MAC_A }), RangeError, 'one port per MAC');

  let closedEvents = 0;
  a.on('close', () => closedEvents++);
  a.close();
  a.close();
  t.equal(closedEvents, 1, 'close is idempotent');
  t.throws(() => a.send(Buffer.from('z')), { code: 'LB_ERR_NET_SOCKET' }, 'a closed port sends nothing');
  opened[0]!.emit('frame', frameFor(MAC_A), info(2));
  t.same(got.a, [broadcastA], 'a closed port gets no more frames');
  t.notOk(opened[0]!.closed, 'the socket stays while a port uses it');
  b.close();
  t.ok(opened[0]!.closed, 'closed with its last port');
  t.notOk(opened[1]!.closed, 'the other parent\'s socket is its own');

  const again = g.attach({ parentIfindex: 2, ifindex: 10, mac: MAC_A });
  t.equal(opened.length, 3, 'a port after the last closed opens a new socket');
  again.close();
  other.close();
});

t.test('a socket error reaches every port listening for errors', async (t) => {
  const { g, opened } = group();
  const a = g.attach({ parentIfindex: 2, ifindex: 10, mac: MAC_A });
  const b = g.attach({ parentIfindex: 2, ifindex: 11, mac: MAC_B });
  const errs: string[] = [];
  a.on('error', (e: Error) => errs.push(`a ${e.message}`));
  opened[0]!.emit('error', new Error('ENETDOWN'));
  t.same(errs, ['a ENETDOWN'], 'a listener gets it; a port without one is not made to throw');
  a.close();
  b.close();
});

t.test('a failed open attaches nothing', async (t) => {
  const g = new PacketSocketGroup({ protocol: 0x0800, owner: () => undefined, open: () => { throw Object.assign(new Error('no CAP_NET_RAW'), { code: 'LB_ERR_NET_NO_CAPABILITY' }); } });
  t.throws(() => g.attach({ parentIfindex: 2, ifindex: 10, mac: MAC_A }), { code: 'LB_ERR_NET_NO_CAPABILITY' });
  t.same(g.counts(), { opened: 0, attached: 0, delivered: 0, unclaimed: 0 });
});
