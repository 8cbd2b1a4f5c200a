// The loop both peer resolvers share, over a toy protocol (a frame is
// "ip=mac" text): what it asks and when, what it learns and from whom, and
// that a failing send or a frame the protocol cannot read stops nothing.
// A fake packet socket and a ManualClock; ARP and neighbour discovery have
// their own files (arp-resolver, ndp-resolver).
import t from 'tap';
import { EventEmitter } from 'node:events';
import { ManualClock } from '../../../agent/clock';
import { silentLogger } from '../../../agent/log';
import { PeerResolver, type PeerProtocol } from '../../../agent/net/neighbour/peer-resolver';
import type { PacketSocket } from '../../../agent/net/packet/packet';

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly sent: string[] = [];
  failing = false;
  closed = false;
  constructor(readonly ifindex: number) { super(); }
  send(frame: Buffer): void {
    if (this.failing) throw Object.assign(new Error('send: ENOBUFS'), { code: 'ENOBUFS' });
    this.sent.push(frame.toString());
  }
  close(): void { this.closed = true; }
}

/** The sockets the toy protocol opened itself (those of resolvers given no openSocket). */
const opened: FakeSocket[] = [];
const toy: PeerProtocol<string> = {
  op: 'toy-resolve', speaks: 'toy',
  open: (ifindex) => { const s = new FakeSocket(ifindex); opened.push(s); return s; },
  request: (ip) => Buffer.from(`who-has ${ip}`),
  learn: (frame) => { const m = /^(\S+)=(\S+)$/.exec(frame.toString()); return m ? { ip: m[1]!, mac: m[2]! } : undefined; },
  text: (ip) => ip,
};

class ToyResolver extends PeerResolver<string> {
  macOf(ip: string): string | undefined { return this.lookup(ip)?.toString('hex'); }
}

function setup(): { clock: ManualClock; sock: () => FakeSocket; r: ToyResolver } {
  const clock = new ManualClock();
  const r = new ToyResolver(toy, ['a', 'b'], { ifindex: 7, log: silentLogger(), clock, retryMs: 500, refreshMs: 10_000 });
  r.start();
  const s = opened.at(-1)!;
  return { clock, sock: () => s, r };
}

t.test("the protocol's socket; asks each target until it answers, then every refresh", async (t) => {
  const { clock, sock, r } = setup();
  t.equal(sock().ifindex, 7, "the protocol's own socket, on the interface");
  t.same(sock().sent, ['who-has a', 'who-has b'], 'both asked at start');
  sock().emit('frame', Buffer.from('a=02:00:00:00:00:0a'));
  clock.advance(500);
  t.same(sock().sent.slice(2), ['who-has b'], 'after retryMs only the silent one again');
  clock.advance(10_000);
  t.ok(sock().sent.slice(3).includes('who-has a'), 'the known one after refreshMs');
  t.equal(r.macOf('a'), '02000000000a');
  r.close();
  t.ok(sock().closed, 'closed with the resolver');
  const n = sock().sent.length;
  clock.advance(60_000);
  t.equal(sock().sent.length, n, 'and asks nothing after close');
});

t.test('learns only targets, only well-formed MACs; forgets one silent for three refreshes', async (t) => {
  const { clock, sock, r } = setup();
  sock().emit('frame', Buffer.from('c=02:00:00:00:00:0c'));
  t.equal(r.macOf('c'), undefined, 'not a target');
  sock().emit('frame', Buffer.from('a=not-a-mac'));
  t.equal(r.macOf('a'), undefined, 'a MAC that does not parse');
  sock().emit('frame', Buffer.from('garbage'));
  t.equal(r.macOf('a'), undefined, 'a frame the protocol cannot read');
  sock().emit('frame', Buffer.from('a=02:00:00:00:00:0a'));
  t.equal(r.macOf('a'), '02000000000a');
  clock.advance(3 * 10_000 + 1000);
  t.equal(r.macOf('a'), undefined, 'forgotten after three refreshes without an answer');
  r.close();
});

t.test('a send that fails is tried again at the next turn', async (t) => {
  const { clock, sock, r } = setup();
  sock().failing = true;
  clock.advance(500);
  t.equal(sock().sent.length, 2, 'nothing sent while the socket fails');
  sock().failing = false;
  clock.advance(500);
  t.same(sock().sent.slice(2), ['who-has a', 'who-has b'], 'both asked again once it works');
  r.close();
});

t.test('onResolved: when a MAC is learnt, changes or is forgotten, not when it is only confirmed', async (t) => {
  const clock = new ManualClock();
  let s: FakeSocket | undefined;
  let calls = 0;
  const r = new ToyResolver(toy, ['a'], { ifindex: 7, log: silentLogger(), clock, retryMs: 500, refreshMs: 1000, openSocket: (ifindex) => { s = new FakeSocket(ifindex); return s; }, onResolved: () => { calls++; } });
  r.start();
  s!.emit('frame', Buffer.from('a=02:00:00:00:00:0a'));
  t.equal(calls, 1, 'learnt');
  s!.emit('frame', Buffer.from('a=02:00:00:00:00:0a'));
  t.equal(calls, 1, 'the same MAC again: no call');
  s!.emit('frame', Buffer.from('a=02:00:00:00:00:0b'));
  t.equal(calls, 2, 'another MAC');
  s!.emit('frame', Buffer.from('z=02:00:00:00:00:0c'));
  t.equal(calls, 2, 'not a target: no call');
  clock.advance(3 * 1000 + 600);
  t.equal(r.macOf('a'), undefined, 'forgotten after three silent refreshes');
  t.equal(calls, 3, 'and called for that');
  r.close();
});
