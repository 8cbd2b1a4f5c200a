// The neighbour-discovery resolver behind IPv6 failover.peers' unicast
// adverts: solicits each target at its solicited-node group until it
// answers, refreshes, learns from a target's advertisements (judged as any
// other, and only those with a target link-layer option), forgets a target
// that stops answering. A fake socket and a ManualClock.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { ManualClock } from '../../../agent/clock';
import { silentLogger } from '../../../agent/log';
import { parseAddress } from '../../../agent/address';
import { decodeNdp, encodeNdp, ndpSolicitation, ndpUnsolicitedAdvertisement } from '../../../agent/net/neighbour/ndp';
import { NdpResolver } from '../../../agent/net/neighbour/ndp-resolver';
import type { PacketSocket } from '../../../agent/net/packet/packet';

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly sent: Buffer[] = [];
  closed = false;
  constructor(readonly ifindex: number) { super(); }
  send(frame: Buffer): void { this.sent.push(frame); }
  close(): void { this.closed = true; }
}

const v6 = (s: string): bigint => parseAddress(s)!.value;
const ME = '02:00:00:00:00:01';
const PEER = 'fe80::12';
const GLOBAL_PEER = 'fd00:99::13';
const PEER_MAC = '02:00:00:00:00:12';

function setup(): { clock: ManualClock; sock: () => FakeSocket; r: NdpResolver } {
  const clock = new ManualClock();
  let s: FakeSocket | undefined;
  const r = new NdpResolver({
    ifindex: 3, mac: ME, src: 'fe80::11', targets: [PEER, GLOBAL_PEER], log: silentLogger(), clock,
    openSocket: (ifindex) => { s = new FakeSocket(ifindex); return s; },
  });
  r.start();
  return { clock, sock: () => s!, r };
}

/** A solicited advertisement from a target to us (RFC 4861 §7.2.4). */
const answer = (target: string, mac: string): Buffer => encodeNdp({
  kind: 'advertisement', ethDst: ME, ethSrc: mac, src: v6(target), dst: v6('fe80::11'), target: v6(target),
  router: false, solicited: true, override: true, targetMac: mac,
});

t.test('solicits every target at once at its solicited-node group, again every second until it answers, then every refresh', async (t) => {
  const { clock, sock, r } = setup();
  const asked = (): bigint[] => sock().sent.map((f) => decodeNdp(f)).map((d) => (d.ok && d.packet.kind === 'solicitation' ? d.packet.target : -1n));
  t.same(asked(), [v6(PEER), v6(GLOBAL_PEER)], 'a solicitation for each target at start');
  const first = decodeNdp(sock().sent[0]!);
  t.match(first.ok && first.packet, { ethDst: '33:33:ff:00:00:12', ethSrc: ME, src: v6('fe80::11'), dst: v6('ff02::1:ff00:12'), sourceMac: ME }, 'to the solicited-node group, from our link-local address, with our MAC');
  t.equal(r.macOf(PEER), undefined);
  sock().emit('frame', answer(PEER, PEER_MAC));
  t.equal(r.macOf('FE80::0012')?.toString('hex'), '020000000012', 'learnt from the advertisement, found by any spelling');
  clock.advance(1000);
  t.same(asked().slice(2), [v6(GLOBAL_PEER)], 'the unanswered target is asked again; the resolved one is not');
  clock.advance(30_000);
  t.ok(asked().slice(3).includes(v6(PEER)), 'the resolved one is refreshed after 30 s');
  r.close();
  t.ok(sock().closed);
});

t.test("learns from a target's advertisements only, judged as any other; ignores others; forgets a silent target", async (t) => {
  const { clock, sock, r } = setup();
  sock().emit('frame', encodeNdp(ndpSolicitation('02:00:00:00:00:13', v6(GLOBAL_PEER), v6('fd00:99::1'))));
  t.equal(r.macOf(GLOBAL_PEER), undefined, "a target's solicitation teaches nothing (the socket hears advertisements only)");
  const bare = answer(GLOBAL_PEER, '02:00:00:00:00:13');
  const noOption = encodeNdp({
    kind: 'advertisement', ethDst: ME, ethSrc: '00:00:00:00:00:00', src: v6(GLOBAL_PEER), dst: v6('fe80::11'), target: v6(GLOBAL_PEER),
    router: false, solicited: true, override: true, targetMac: undefined,
  });
  sock().emit('frame', noOption);
  t.equal(r.macOf(GLOBAL_PEER), undefined, 'an advertisement without a target link-layer option teaches nothing (the raw socket has no Ethernet source)');
  const hop64 = Buffer.from(bare);
  hop64[14 + 7] = 64;
  sock().emit('frame', hop64);
  t.equal(r.macOf(GLOBAL_PEER), undefined, 'one with hop limit 64 is not from the link (RFC 4861 §7.1.2): dropped');
  sock().emit('frame', bare);
  t.equal(r.macOf(GLOBAL_PEER)?.toString('hex'), '020000000013', 'the same answer with hop limit 255 is learnt');
  sock().emit('frame', encodeNdp(ndpUnsolicitedAdvertisement('02:00:00:00:00:99', v6('fe80::99'))));
  t.equal(r.macOf('fe80::99'), undefined, 'not a target');
  sock().emit('frame', encodeNdp(ndpUnsolicitedAdvertisement('02:00:00:00:00:77', v6(PEER))));
  t.equal(r.macOf(PEER)?.toString('hex'), '020000000077', 'an unsolicited advertisement (a moved peer) updates it');
  sock().emit('frame', Buffer.from('deadbeef', 'hex'));
  t.equal(r.macOf('not an address'), undefined, 'garbage in, nothing out');
  clock.advance(3 * 30_000 + 2000);
  t.equal(r.macOf(PEER), undefined, 'forgotten after three unanswered refreshes');
  r.close();
});
