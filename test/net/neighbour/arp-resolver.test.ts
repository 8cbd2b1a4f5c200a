// The ARP resolver behind failover.peers' unicast adverts: asks each target
// until it answers, refreshes, learns from anything a target sends, forgets
// a target that stops answering. A fake packet socket and a ManualClock.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { ManualClock } from '../../../agent/clock';
import { silentLogger } from '../../../agent/log';
import { parseIPv4 } from '../../../agent/address';
import { ARP_OP_REPLY, ARP_OP_REQUEST, decodeArp, encodeArp, arpAnnouncement } from '../../../agent/net/neighbour/arp';
import { ArpResolver } from '../../../agent/net/neighbour/arp-resolver';
import type { PacketSocket } from '../../../agent/net/packet/packet';

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly sent: Buffer[] = [];
  closed = false;
  constructor(readonly ifindex: number) { super(); }
  send(frame: Buffer): void { this.sent.push(frame); }
  close(): void { this.closed = true; }
}

const ME = '02:00:00:00:00:01';
const PEER = parseIPv4('10.99.0.12')!;
const OTHER = parseIPv4('10.99.0.13')!;
const PEER_MAC = '02:00:00:00:00:12';

function setup(): { clock: ManualClock; sock: () => FakeSocket; r: ArpResolver } {
  const clock = new ManualClock();
  let s: FakeSocket | undefined;
  const r = new ArpResolver({
    ifindex: 3, mac: ME, srcIp: parseIPv4('10.99.0.11')!, targets: [PEER, OTHER], log: silentLogger(), clock,
    openSocket: (ifindex) => { s = new FakeSocket(ifindex); return s; },
  });
  r.start();
  return { clock, sock: () => s!, r };
}

const reply = (senderMac: string, senderIp: number): Buffer => encodeArp({
  ethDst: ME, ethSrc: senderMac, op: ARP_OP_REPLY, senderMac, senderIp, targetMac: ME, targetIp: parseIPv4('10.99.0.11')!,
});

t.test('asks every target at once, again every second until it answers, then every refresh', async (t) => {
  const { clock, sock, r } = setup();
  const asked = (): number[] => sock().sent.map((f) => decodeArp(f)).map((d) => (d.ok && d.packet.op === ARP_OP_REQUEST ? d.packet.targetIp : -1));
  t.same(asked(), [PEER, OTHER], 'a who-has for each target at start');
  const first = decodeArp(sock().sent[0]!);
  t.match(first.ok && first.packet, { ethDst: 'ff:ff:ff:ff:ff:ff', senderMac: ME, senderIp: parseIPv4('10.99.0.11') }, 'broadcast, from our MAC and address');
  t.equal(r.macOf(PEER), undefined);
  sock().emit('frame', reply(PEER_MAC, PEER));
  t.equal(r.macOf(PEER)?.toString('hex'), '020000000012', 'learnt from the reply');
  clock.advance(1000);
  t.same(asked().slice(2), [OTHER], 'the unanswered target is asked again; the resolved one is not');
  clock.advance(30_000);
  t.ok(asked().slice(3).includes(PEER), 'the resolved one is refreshed after 30 s');
  r.close();
  t.ok(sock().closed);
});

t.test('learns from any ARP a target sends; ignores non-targets; forgets a silent target', async (t) => {
  const { clock, sock, r } = setup();
  sock().emit('frame', encodeArp(arpAnnouncement(PEER_MAC, PEER)));
  t.equal(r.macOf(PEER)?.toString('hex'), '020000000012', 'from a gratuitous ARP');
  sock().emit('frame', reply('02:00:00:00:00:99', parseIPv4('10.99.0.99')!));
  t.equal(r.macOf(parseIPv4('10.99.0.99')!), undefined, 'not a target');
  sock().emit('frame', Buffer.alloc(10));
  t.pass('a malformed frame is ignored');
  sock().emit('frame', reply('02:00:00:00:00:55', PEER));
  t.equal(r.macOf(PEER)?.toString('hex'), '020000000055', 'a new MAC replaces the old');
  clock.advance(3 * 30_000 + 2000);
  t.equal(r.macOf(PEER), undefined, 'no answer for three refreshes: forgotten');
  r.close();
});
