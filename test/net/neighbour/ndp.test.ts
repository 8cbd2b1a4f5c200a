// Neighbour discovery codec: byte for byte against frames the Linux kernel
// sent on a veth pair between two throwaway namespaces (52:54:00:12:34:56 =
// fd00:99::5 in A, 52:54:00:ab:cd:ef = fd00:99::6 in B), and fuzzed: decode
// never throws. Captured with, as root:
//   ip netns add A; ip netns add B
//   ip -n A link add veth0 address 52:54:00:12:34:56 type veth \
//     peer name veth1 address 52:54:00:ab:cd:ef netns B
//   ip netns exec A sysctl -w net.ipv6.conf.veth0.ndisc_notify=1
//   ip -n B link set veth1 up
//   ip netns exec B tcpdump -i veth1 -nn -e -vv -xx -U \
//     'icmp6 and (ip6[40] == 135 or ip6[40] == 136)' &
//   ip -n A link set veth0 up
//   ip -n B -6 addr add fd00:99::6/64 dev veth1
//   ip -n A -6 addr add fd00:99::5/64 dev veth0
//   ip netns exec A ping -6 -c 2 fd00:99::6
// (Linux 6.18; enhanced_dad=1, so its DAD probes carry an RFC 7527 nonce.)
import t from 'tap';
import { prng } from '../../helpers/random';
import { parseAddress } from '../../../agent/address';
import { encodeIpv6Frame, internetChecksum, IPPROTO_ICMPV6, ipv6PseudoHeaderSum } from '../../../agent/net/packet/inet';
import {
  ALL_NODES_ADDRESS,
  decodeNdp,
  encodeNdp,
  ipv6MulticastMac,
  isDadProbe,
  isSolicitedNodeAddress,
  ndpDadProbe,
  ndpFrameFromIcmp6,
  ndpSolicitation,
  ndpSolicitedAdvertisement,
  ndpUnsolicitedAdvertisement,
  NDP_NOT_MINE,
  solicitedNodeAddress,
  type NdpPacket,
  type NeighbourSolicitation,
} from '../../../agent/net/neighbour/ndp';

function hex(s: string): Buffer {
  return Buffer.from(s.replace(/\s+/g, ''), 'hex');
}
const v6 = (s: string): bigint => parseAddress(s)!.value;

const MAC_A = '52:54:00:12:34:56';
const MAC_B = '52:54:00:ab:cd:ef';
const LL_A = v6('fe80::5054:ff:fe12:3456');
const LL_B = v6('fe80::5054:ff:feab:cdef');
const IP_A = v6('fd00:99::5');
const IP_B = v6('fd00:99::6');

// B's DAD probe for its link-local address when the link came up.
const KERNEL_DAD_LL = hex(`3333 ffab cdef 5254 00ab cdef 86dd 6000
  0000 0020 3aff 0000 0000 0000 0000 0000
  0000 0000 0000 ff02 0000 0000 0000 0000
  0001 ffab cdef 8700 caf3 0000 0000 fe80
  0000 0000 0000 5054 00ff feab cdef 0e01
  a5e1 a0ce 6ff0`);
// A's unsolicited advertisement of its link-local address after DAD (ndisc_notify).
const KERNEL_UNSOLICITED_LL = hex(`3333 0000 0001 5254 0012 3456 86dd 6000
  0000 0020 3aff fe80 0000 0000 0000 5054
  00ff fe12 3456 ff02 0000 0000 0000 0000
  0000 0000 0001 8800 cb68 2000 0000 fe80
  0000 0000 0000 5054 00ff fe12 3456 0201
  5254 0012 3456`);
// `ip -6 addr add fd00:99::5/64 dev veth0` in A: the DAD probe, from :: to
// ff02::1:ff00:5 at 33:33:ff:00:00:05, no source link-layer option, a nonce.
const KERNEL_DAD = hex(`3333 ff00 0005 5254 0012 3456 86dd 6000
  0000 0020 3aff 0000 0000 0000 0000 0000
  0000 0000 0000 ff02 0000 0000 0000 0000
  0001 ff00 0005 8700 acb4 0000 0000 fd00
  0099 0000 0000 0000 0000 0000 0005 0e01
  9661 087b 236a`);
// ... and after DAD the unsolicited advertisement to ff02::1: override set, solicited clear.
const KERNEL_UNSOLICITED = hex(`3333 0000 0001 5254 0012 3456 86dd 6000
  0000 0020 3aff fd00 0099 0000 0000 0000
  0000 0000 0005 ff02 0000 0000 0000 0000
  0000 0000 0001 8800 d4a5 2000 0000 fd00
  0099 0000 0000 0000 0000 0000 0005 0201
  5254 0012 3456`);
// `ping -6 fd00:99::6` from A: address resolution, to B's solicited-node group.
const KERNEL_NS = hex(`3333 ff00 0006 5254 0012 3456 86dd 6000
  0000 0020 3aff fd00 0099 0000 0000 0000
  0000 0000 0005 ff02 0000 0000 0000 0000
  0001 ff00 0006 8700 f79d 0000 0000 fd00
  0099 0000 0000 0000 0000 0000 0006 0101
  5254 0012 3456`);
// B's answer: unicast, solicited and override set, target link-layer option.
const KERNEL_NA = hex(`5254 0012 3456 5254 00ab cdef 86dd 6000
  0000 0020 3aff fd00 0099 0000 0000 0000
  0000 0000 0006 fd00 0099 0000 0000 0000
  0000 0000 0005 8800 fbd5 6000 0000 fd00
  0099 0000 0000 0000 0000 0000 0006 0201
  5254 00ab cdef`);
// B's unicast reachability probe (RFC 4861 §7.3) from its link-local address.
const KERNEL_NUD_NS = hex(`5254 0012 3456 5254 00ab cdef 86dd 6000
  0000 0020 3aff fe80 0000 0000 0000 5054
  00ff feab cdef fd00 0099 0000 0000 0000
  0000 0000 0005 8700 3f07 0000 0000 fd00
  0099 0000 0000 0000 0000 0000 0005 0101
  5254 00ab cdef`);
// A's answer: solicited only, no override, no option (§7.2.4 allows leaving it out for a unicast solicitation).
const KERNEL_NUD_NA = hex(`5254 00ab cdef 5254 0012 3456 86dd 6000
  0000 0018 3aff fd00 0099 0000 0000 0000
  0000 0000 0005 fe80 0000 0000 0000 5054
  00ff feab cdef 8800 1fff 4000 0000 fd00
  0099 0000 0000 0000 0000 0000 0005`);

const GOLDEN = { KERNEL_DAD_LL, KERNEL_UNSOLICITED_LL, KERNEL_DAD, KERNEL_UNSOLICITED, KERNEL_NS, KERNEL_NA, KERNEL_NUD_NS, KERNEL_NUD_NA };

function decoded(frame: Buffer): NdpPacket {
  const r = decodeNdp(frame);
  if (!r.ok) throw new Error(`golden frame refused: ${r.reason}`);
  return r.packet;
}

t.test('decodes what the kernel sends', async (t) => {
  t.same(decoded(KERNEL_DAD), {
    kind: 'solicitation', ethDst: '33:33:ff:00:00:05', ethSrc: MAC_A, src: 0n, dst: v6('ff02::1:ff00:5'), target: IP_A,
    sourceMac: undefined, nonce: '9661087b236a',
  });
  t.same(decoded(KERNEL_UNSOLICITED), {
    kind: 'advertisement', ethDst: '33:33:00:00:00:01', ethSrc: MAC_A, src: IP_A, dst: ALL_NODES_ADDRESS, target: IP_A,
    router: false, solicited: false, override: true, targetMac: MAC_A,
  });
  t.same(decoded(KERNEL_NS), {
    kind: 'solicitation', ethDst: '33:33:ff:00:00:06', ethSrc: MAC_A, src: IP_A, dst: v6('ff02::1:ff00:6'), target: IP_B,
    sourceMac: MAC_A, nonce: undefined,
  });
  t.same(decoded(KERNEL_NA), {
    kind: 'advertisement', ethDst: MAC_A, ethSrc: MAC_B, src: IP_B, dst: IP_A, target: IP_B,
    router: false, solicited: true, override: true, targetMac: MAC_B,
  });
  t.same(decoded(KERNEL_NUD_NA), {
    kind: 'advertisement', ethDst: MAC_B, ethSrc: MAC_A, src: IP_A, dst: LL_B, target: IP_A,
    router: false, solicited: true, override: false, targetMac: undefined,
  });
  t.ok(isDadProbe(decoded(KERNEL_DAD)));
  t.ok(isDadProbe(decoded(KERNEL_DAD_LL)));
  t.notOk(isDadProbe(decoded(KERNEL_NS)));
  t.notOk(isDadProbe(decoded(KERNEL_NUD_NS)));
});

t.test('encodes exactly what the kernel put on the wire, checksum included', async (t) => {
  for (const [name, frame] of Object.entries(GOLDEN)) {
    t.equal(encodeNdp(decoded(frame)).toString('hex'), frame.toString('hex'), name);
  }
});

t.test('the builders make the kernel frames', async (t) => {
  t.equal(encodeNdp(ndpDadProbe(MAC_A, IP_A, '9661087b236a')).toString('hex'), KERNEL_DAD.toString('hex'), 'DAD probe');
  t.equal(encodeNdp(ndpDadProbe(MAC_B, LL_B, 'a5e1a0ce6ff0')).toString('hex'), KERNEL_DAD_LL.toString('hex'), 'link-local DAD probe');
  t.equal(encodeNdp(ndpUnsolicitedAdvertisement(MAC_A, IP_A)).toString('hex'), KERNEL_UNSOLICITED.toString('hex'), 'unsolicited NA');
  t.equal(encodeNdp(ndpUnsolicitedAdvertisement(MAC_A, LL_A)).toString('hex'), KERNEL_UNSOLICITED_LL.toString('hex'), 'link-local unsolicited NA');
  t.equal(encodeNdp(ndpSolicitation(MAC_A, IP_A, IP_B)).toString('hex'), KERNEL_NS.toString('hex'), 'address resolution');
  const ns = decoded(KERNEL_NS) as NeighbourSolicitation;
  t.equal(encodeNdp(ndpSolicitedAdvertisement(MAC_B, IP_B, ns)).toString('hex'), KERNEL_NA.toString('hex'), 'answer');
});

t.test('a DAD probe without a nonce: the kernel probe less its option', async (t) => {
  const probe = encodeNdp(ndpDadProbe(MAC_A, IP_A));
  t.equal(probe.length, KERNEL_DAD.length - 8);
  t.equal(probe.subarray(0, 18).toString('hex'), hex('3333 ff00 0005 5254 0012 3456 86dd 6000 0000').toString('hex'));
  t.equal(probe.readUInt16BE(18), 24, 'payload length: the bare message');
  t.equal(probe[21], 255, 'hop limit');
  t.equal(probe.subarray(22, 54).toString('hex'), KERNEL_DAD.subarray(22, 54).toString('hex'), 'from :: to ff02::1:ff00:5');
  t.same(decoded(probe), { ...decoded(KERNEL_DAD), nonce: undefined });
});

t.test('an answer to a DAD probe goes to all-nodes, solicited clear (RFC 4861 §7.2.4)', async (t) => {
  const a = ndpSolicitedAdvertisement(MAC_A, IP_A, decoded(KERNEL_DAD) as NeighbourSolicitation);
  t.same(a, ndpUnsolicitedAdvertisement(MAC_A, IP_A));
  // A solicitation without a source link-layer option is answered at its Ethernet source.
  const bare: NeighbourSolicitation = { ...(decoded(KERNEL_NS) as NeighbourSolicitation), sourceMac: undefined };
  t.equal(ndpSolicitedAdvertisement(MAC_B, IP_B, bare).ethDst, MAC_A);
});

t.test('solicited-node groups and their MACs (RFC 4291 §2.7.1, RFC 2464 §7)', async (t) => {
  t.equal(solicitedNodeAddress(IP_A), v6('ff02::1:ff00:5'));
  t.equal(solicitedNodeAddress(LL_B), v6('ff02::1:ffab:cdef'));
  t.equal(solicitedNodeAddress(v6('2001:db8::1234:5678:9abc')), v6('ff02::1:ff78:9abc'));
  t.equal(ipv6MulticastMac(v6('ff02::1:ff78:9abc')), '33:33:ff:78:9a:bc');
  t.equal(ipv6MulticastMac(ALL_NODES_ADDRESS), '33:33:00:00:00:01');
  t.ok(isSolicitedNodeAddress(v6('ff02::1:ff00:5')));
  t.notOk(isSolicitedNodeAddress(v6('ff02::1')));
  t.notOk(isSolicitedNodeAddress(v6('ff02::2:ff00:5')));
  t.notOk(isSolicitedNodeAddress(v6('fd00:99::1:ff00:5')));
});

t.test('Ethernet padding is ignored', async (t) => {
  const padded = Buffer.concat([KERNEL_NUD_NA, Buffer.alloc(18, 0xee)]);
  t.same(decodeNdp(padded), decodeNdp(KERNEL_NUD_NA));
});

/** An Ethernet + IPv6 frame around an ICMPv6 body, its checksum computed unless `keepSum`. */
function frameWith(body: Buffer, o: { src?: bigint; dst?: bigint; hop?: number; nextHeader?: number; keepSum?: boolean } = {}): Buffer {
  const src = o.src ?? IP_B;
  const dst = o.dst ?? IP_A;
  const f = encodeIpv6Frame({
    dstMac: Buffer.from([0x52, 0x54, 0, 0x12, 0x34, 0x56]), srcMac: Buffer.from([0x52, 0x54, 0, 0xab, 0xcd, 0xef]),
    trafficClass: 0, flowLabel: 0, nextHeader: o.nextHeader ?? IPPROTO_ICMPV6, hopLimit: o.hop ?? 255, src, dst,
  }, body.length);
  body.copy(f, 54);
  if (!o.keepSum && body.length >= 4) {
    f.writeUInt16BE(0, 56);
    const pseudo = ipv6PseudoHeaderSum(f.subarray(22, 38), f.subarray(38, 54), IPPROTO_ICMPV6, body.length);
    f.writeUInt16BE(internetChecksum(f, 54, f.length, pseudo), 56);
  }
  return f;
}
/** The ICMPv6 message of a golden frame, to mutate. */
const body = (frame: Buffer): Buffer => Buffer.from(frame.subarray(54));

t.test('every RFC 4861 §7.1.1 and §7.1.2 rule drops with its reason', async (t) => {
  const reason = (f: Uint8Array): string => { const r = decodeNdp(f); return r.ok ? 'accepted' : r.reason; };
  const ns = body(KERNEL_NS);
  t.equal(reason(frameWith(ns, { src: IP_A, dst: v6('ff02::1:ff00:6') })), 'accepted', 'the helper builds valid frames');

  t.equal(reason(Buffer.alloc(0)), 'truncated');
  t.equal(reason(KERNEL_NS.subarray(0, 50)), 'truncated');
  t.equal(reason(KERNEL_NS.subarray(0, KERNEL_NS.length - 1)), 'truncated', 'payload length beyond the frame');
  const arp = Buffer.from(KERNEL_NS); arp[13] = 0x06; arp[12] = 0x08;
  t.equal(reason(arp), 'not-ipv6');
  const v4 = Buffer.from(KERNEL_NS); v4[14] = 0x40;
  t.equal(reason(v4), 'bad-ip-version');
  t.equal(reason(frameWith(ns, { nextHeader: 17 })), 'not-icmpv6');
  t.equal(reason(frameWith(ns, { nextHeader: 0 })), 'not-icmpv6', 'hop-by-hop header: not NDP we read');
  const echo = Buffer.from(ns); echo[0] = 128;
  t.equal(reason(frameWith(echo)), 'not-ndp');
  const rs = Buffer.from(ns); rs[0] = 133;
  t.equal(reason(frameWith(rs)), 'not-ndp', 'router solicitation');
  t.equal(reason(frameWith(Buffer.from([135, 0]))), 'bad-icmp-length');

  // Hop limit 255: the one proof the packet was not forwarded from off-link.
  const hop = Buffer.from(KERNEL_NS); hop[21] = 254;
  t.equal(reason(hop), 'bad-hop-limit');
  t.equal(reason(frameWith(body(KERNEL_NA), { hop: 64 })), 'bad-hop-limit');
  const sum = Buffer.from(KERNEL_NS); sum[60] = sum[60]! ^ 0x01;
  t.equal(reason(sum), 'bad-icmp-checksum');
  const target = Buffer.from(KERNEL_NA); target[77] = target[77]! ^ 0x01;
  t.equal(reason(target), 'bad-icmp-checksum', 'a target changed in flight');
  const code = Buffer.from(ns); code[1] = 1;
  t.equal(reason(frameWith(code)), 'bad-icmp-code');
  t.equal(reason(frameWith(ns.subarray(0, 23))), 'bad-icmp-length', 'length < 24');
  t.equal(reason(frameWith(body(KERNEL_NUD_NA).subarray(0, 20))), 'bad-icmp-length');

  const mcast = Buffer.from(ns); mcast[8] = 0xff; mcast[9] = 0x02;
  t.equal(reason(frameWith(mcast)), 'multicast-target');
  const mcastNa = Buffer.from(body(KERNEL_NA)); mcastNa[8] = 0xff;
  t.equal(reason(frameWith(mcastNa)), 'multicast-target');

  const zeroLen = Buffer.from(ns); zeroLen[25] = 0;
  t.equal(reason(frameWith(zeroLen)), 'bad-option-length', 'an option of length 0');
  const overrun = Buffer.from(ns); overrun[25] = 2;
  t.equal(reason(frameWith(overrun)), 'bad-option-length', 'an option past the end');
  t.equal(reason(frameWith(Buffer.concat([ns, Buffer.from([1])]))), 'bad-option-length', 'one stray octet');
  const longLl = Buffer.concat([ns, Buffer.alloc(8)]); longLl[25] = 2;
  t.equal(reason(frameWith(longLl)), 'bad-link-layer-option', 'a 16-octet link-layer option on Ethernet');

  // From ::, only a DAD probe: no link-layer option, to a solicited-node group.
  t.equal(reason(frameWith(ns, { src: 0n, dst: v6('ff02::1:ff00:6') })), 'dad-with-link-layer-option');
  t.equal(reason(frameWith(body(KERNEL_DAD), { src: 0n, dst: ALL_NODES_ADDRESS })), 'dad-not-to-solicited-node');
  t.equal(reason(frameWith(body(KERNEL_DAD), { src: 0n, dst: IP_A })), 'dad-not-to-solicited-node');
  t.equal(reason(frameWith(body(KERNEL_DAD), { src: 0n, dst: v6('ff02::1:ff00:5') })), 'accepted');

  t.equal(reason(frameWith(body(KERNEL_NA), { dst: ALL_NODES_ADDRESS })), 'solicited-to-multicast');
  t.equal(reason(frameWith(body(KERNEL_UNSOLICITED), { dst: ALL_NODES_ADDRESS })), 'accepted');

  t.ok(NDP_NOT_MINE.has('not-ndp') && NDP_NOT_MINE.has('not-ipv6') && !NDP_NOT_MINE.has('bad-hop-limit'));
});

t.test('options: unknown ones are skipped, misplaced link-layer ones ignored (RFC 4861 §4.6)', async (t) => {
  const unknown = Buffer.concat([body(KERNEL_NS), Buffer.from([99, 1, 1, 2, 3, 4, 5, 6])]);
  const r = decodeNdp(frameWith(unknown, { src: IP_A, dst: v6('ff02::1:ff00:6') }));
  t.ok(r.ok && r.packet.kind === 'solicitation' && r.packet.sourceMac === MAC_A);
  // A target link-layer option in a solicitation, a source one in an advertisement.
  const nsTll = Buffer.from(body(KERNEL_NS)); nsTll[24] = 2;
  const a = decodeNdp(frameWith(nsTll, { src: IP_A, dst: v6('ff02::1:ff00:6') }));
  t.ok(a.ok && a.packet.kind === 'solicitation' && a.packet.sourceMac === undefined);
  const naSll = Buffer.from(body(KERNEL_NA)); naSll[24] = 1;
  const b = decodeNdp(frameWith(naSll));
  t.ok(b.ok && b.packet.kind === 'advertisement' && b.packet.targetMac === undefined);
  // Reserved bits are ignored on receipt (§4.3, §4.4).
  const reserved = Buffer.from(body(KERNEL_NA)); reserved[4] = reserved[4]! | 0x1f; reserved[7] = 0xff;
  const c = decodeNdp(frameWith(reserved, { src: IP_B, dst: IP_A }));
  t.ok(c.ok && c.packet.kind === 'advertisement' && c.packet.solicited && c.packet.override && !c.packet.router);
});

t.test('encode refuses what a receiver must drop, and malformed arguments', async (t) => {
  const probe = ndpDadProbe(MAC_A, IP_A);
  t.throws(() => encodeNdp({ ...probe, sourceMac: MAC_A }), TypeError);
  t.throws(() => encodeNdp({ ...probe, dst: ALL_NODES_ADDRESS }), TypeError);
  t.throws(() => encodeNdp({ ...probe, target: ALL_NODES_ADDRESS }), TypeError);
  t.throws(() => encodeNdp({ ...probe, nonce: '0102' }), TypeError);
  t.throws(() => encodeNdp({ ...probe, ethSrc: 'nope' }), TypeError);
  t.throws(() => encodeNdp({ ...probe, target: 1n << 128n }), TypeError);
  t.throws(() => encodeNdp({ ...probe, target: -1n }), TypeError);
  const na = ndpUnsolicitedAdvertisement(MAC_A, IP_A);
  t.throws(() => encodeNdp({ ...na, solicited: true }), TypeError);
  t.doesNotThrow(() => encodeNdp({ ...na, router: true }));
  const r = decodeNdp(encodeNdp({ ...na, router: true }));
  t.ok(r.ok && r.packet.kind === 'advertisement' && r.packet.router);
});

t.test('fuzz: decode never throws, and what it accepts round-trips', async (t) => {
  const rnd = prng(0x4861);
  const goldens = Object.values(GOLDEN);
  let accepted = 0;
  let total = 0;
  const mismatches: string[] = [];
  const big = (_k: string, v: unknown): unknown => (typeof v === 'bigint' ? v.toString(16) : v);
  const check = (b: Buffer): void => {
    total++;
    const r = decodeNdp(b);
    if (!r.ok) return;
    accepted++;
    const again = decodeNdp(encodeNdp(r.packet));
    if (!again.ok || JSON.stringify(again.packet, big) !== JSON.stringify(r.packet, big)) mismatches.push(b.toString('hex'));
  };
  // Every truncation of every golden frame.
  for (const g of goldens) for (let n = 0; n < g.length; n++) check(g.subarray(0, n));
  for (let i = 0; i < 20_000; i++) {
    let b: Buffer;
    if (i % 3 === 0) {
      b = Buffer.alloc(Math.floor(rnd() * 120));
      for (let j = 0; j < b.length; j++) b[j] = Math.floor(rnd() * 256);
      // Often a plausible Ethernet + IPv6 + ICMPv6 start, so the deep branches are reached.
      if (b.length > 60 && rnd() < 0.7) { b[12] = 0x86; b[13] = 0xdd; b[14] = 0x60; b[20] = 58; b[21] = 255; b[54] = 135 + (i & 1); }
    } else if (i % 3 === 1) {
      // A golden frame mutated a little, its checksum mended half the time.
      const g = goldens[Math.floor(rnd() * goldens.length)]!;
      const m = Buffer.from(g.subarray(54));
      const n = 1 + Math.floor(rnd() * 3);
      for (let k = 0; k < n; k++) m[Math.floor(rnd() * m.length)] = Math.floor(rnd() * 256);
      const src = rnd() < 0.2 ? 0n : g.readBigUInt64BE(22) << 64n | g.readBigUInt64BE(30);
      const dst = g.readBigUInt64BE(38) << 64n | g.readBigUInt64BE(46);
      b = frameWith(m, { src, dst, keepSum: rnd() < 0.5 });
    } else {
      // Random option areas after a valid message head.
      const g = goldens[Math.floor(rnd() * goldens.length)]!;
      const opts = Buffer.alloc(Math.floor(rnd() * 40));
      for (let j = 0; j < opts.length; j++) opts[j] = rnd() < 0.3 ? Math.floor(rnd() * 4) : Math.floor(rnd() * 256);
      b = frameWith(Buffer.concat([g.subarray(54, 78), opts]), { src: IP_B, dst: IP_A });
    }
    check(b);
  }
  t.same(mismatches, [], 'every accepted frame re-encodes to the same packet');
  t.ok(accepted > 500, `accepted ${accepted} of ${total}`);
});

/** What a raw ICMPv6 socket gives of a frame: the message, the addresses, the hop limit. */
const received = (frame: Buffer, hopLimit = frame[21]!): { message: Buffer; src: Buffer; dst: Buffer; hopLimit: number } =>
  ({ message: frame.subarray(54), src: frame.subarray(22, 38), dst: frame.subarray(38, 54), hopLimit });

t.test('a message from a raw ICMPv6 socket becomes the frame it came in (ndpFrameFromIcmp6)', async (t) => {
  // Multicast, with the sender's own link-layer option: every byte as on the wire.
  for (const [name, f] of Object.entries({ KERNEL_NS, KERNEL_UNSOLICITED, KERNEL_UNSOLICITED_LL })) {
    t.same(ndpFrameFromIcmp6(received(f)), f, `${name} byte for byte`);
  }
  for (const [name, f] of Object.entries(GOLDEN)) {
    const r = decodeNdp(ndpFrameFromIcmp6(received(f)));
    t.ok(r.ok, `${name} decodes`);
    if (!r.ok) continue;
    const p = decoded(f);
    const own = p.kind === 'solicitation' ? p.sourceMac : p.targetMac;
    t.same(r.packet, { ...p, ethSrc: own ?? '00:00:00:00:00:00', ethDst: p.dst >> 120n === 0xffn ? p.ethDst : '00:00:00:00:00:00' },
      `${name}: the same message; the source MAC is the one it gives for its sender (${own ?? 'none'})`);
  }
  const forwarded = decodeNdp(ndpFrameFromIcmp6(received(KERNEL_NA, 254)));
  t.same(forwarded, { ok: false, reason: 'bad-hop-limit' }, 'the hop limit the kernel saw is judged (RFC 4861 §7.1.2)');
  const bad = Buffer.from(KERNEL_NA);
  bad[bad.length - 1]! ^= 1;
  t.same(decodeNdp(ndpFrameFromIcmp6(received(bad))), { ok: false, reason: 'bad-icmp-checksum' });
  const cut = received(KERNEL_NS);
  t.same(decodeNdp(ndpFrameFromIcmp6({ ...cut, message: cut.message.subarray(0, 30) })), { ok: false, reason: 'bad-icmp-checksum' }, 'a cut message is refused');
  t.throws(() => ndpFrameFromIcmp6({ ...cut, src: Buffer.alloc(4) }), RangeError);
});
