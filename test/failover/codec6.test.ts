// Unit tests of the IPv6 VRRPv3 codec: against a frame keepalived 2.2.7
// (Debian) sent in a lab namespace, every refusal reason an IPv6 advert can
// earn, the kernel filter against tcpdump's, and a bounded fuzz of the
// decoder (it never throws).
import t from 'tap';
import { prng } from '../helpers/random';
import { DROP_REASONS } from '../../agent/failover/codec';
import {
  VRRP6_MULTICAST_IP,
  decodeAdvertisement6,
  encodeAdvertisement6,
  encodeMessage6,
  isLinkLocal6,
  virtualRouterMac6,
  vrrpFilter6,
  type Advertisement6Frame,
} from '../../agent/failover/codec6';
import { internetChecksum, ipv6PseudoHeaderSum } from '../../agent/net/packet/inet';
import { formatAddress, parseAddress } from '../../agent/address';

const v6 = (s: string): bigint => { const a = parseAddress(s); if (a?.family !== 'IPv6') throw new Error(s); return a.value; };
const text = (v: bigint): string => formatAddress({ family: 'IPv6', value: v });
const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

// Captured with `tcpdump -i veth-b -n -xx 'ip6 and ip6[6] = 112'` on the peer
// end of a veth pair while keepalived 2.2.7 (vrrp_version 3, one instance
// with virtual_ipaddress fd00:99::200/64, vrid 51, priority 150, advert_int 1)
// ran on an interface with MAC 02:00:0a:63:00:02. It sends from the interface
// MAC and its link-local address, traffic class 0xc0, a flow label the kernel
// chose, hop limit 255.
const KEEPALIVED = hex(`
  333300000012 02000a630002 86dd
  6c0fdb0e 0018 70 ff
  fe80000000000000 0000 0aff fe63 0002
  ff02000000000000 0000 0000 0000 0012
  3133 9601 0064 314a fd000099000000000000000000000200`);

function ok(t: { fail(m: string): unknown }, frame: Uint8Array): Advertisement6Frame {
  const r = decodeAdvertisement6(frame);
  if (!r.ok) { t.fail(`decode failed: ${r.reason}`); throw new Error(r.reason); }
  return r.frame;
}

/** Recompute the VRRP checksum over the IPv6 pseudo-header (to reach the checks behind it). */
function fixSum(b: Buffer): Buffer {
  const len = b.readUInt16BE(18);
  const v = 54;
  if (len < 8 || v + len > b.length) return b;
  b.writeUInt16BE(0, v + 6);
  b.writeUInt16BE(internetChecksum(b, v, v + len, ipv6PseudoHeaderSum(b.subarray(22, 38), b.subarray(38, 54), 112, len)), v + 6);
  return b;
}

t.test("keepalived's IPv6 advert decodes, and ours carries the same message", async (t) => {
  const f = ok(t, KEEPALIVED);
  t.same(
    { vrid: f.vrid, priority: f.priority, cs: f.maxAdverIntCs, src: text(f.src), dst: text(f.dst), hop: f.hopLimit, tc: f.trafficClass, addresses: f.addresses.map(text) },
    { vrid: 51, priority: 150, cs: 100, src: 'fe80::aff:fe63:2', dst: 'ff02::12', hop: 255, tc: 0xc0, addresses: ['fd00:99::200'] },
  );
  t.equal(f.checksum, 0x314a);
  const ours = encodeAdvertisement6({
    vrid: 51, priority: 150, maxAdverIntCs: 100, addresses: [v6('fd00:99::200')], src: v6('fe80::aff:fe63:2'),
    srcMac: Buffer.from('02000a630002', 'hex'),
  });
  // Byte for byte but the flow label (keepalived's kernel picks one; ours is 0, RFC 6437 allows either).
  const masked = Buffer.from(KEEPALIVED);
  masked.writeUInt32BE(0x6c000000, 14);
  t.same(ours.toString('hex'), masked.toString('hex'), 'the same frame, flow label aside');
  t.same(encodeMessage6(f, f.src, f.dst).toString('hex'), KEEPALIVED.subarray(54).toString('hex'), 'the message and its pseudo-header checksum');
});

t.test('defaults: the IPv6 virtual router MAC, ff02::12 and its group MAC, hop limit 255', async (t) => {
  const fr = encodeAdvertisement6({ vrid: 7, priority: 100, maxAdverIntCs: 10, addresses: [v6('fd00::1'), v6('fd00::2')], src: v6('fe80::1') });
  const f = ok(t, fr);
  t.equal(f.srcMac.toString('hex'), '00005e000207', '00:00:5e:00:02:<vrid> (RFC 5798 §7.3)');
  t.equal(f.dstMac.toString('hex'), '333300000012');
  t.equal(f.dst, VRRP6_MULTICAST_IP);
  t.equal(f.hopLimit, 255);
  t.same(f.addresses.map(text), ['fd00::1', 'fd00::2']);
  t.equal(fr.length, 14 + 40 + 8 + 32, 'no padding: 16 octets per address');
  t.same(virtualRouterMac6(255), Buffer.from('00005e0002ff', 'hex'));
  t.throws(() => virtualRouterMac6(0), /out of range/);
  t.throws(() => encodeAdvertisement6({ vrid: 1, priority: 300, maxAdverIntCs: 1, addresses: [], src: 1n }), /priority 300/);
});

t.test('unicast: a peer may be a global address; to ff02::12 only link-local is from this link', async (t) => {
  const uni = encodeAdvertisement6({ vrid: 9, priority: 50, maxAdverIntCs: 100, addresses: [], src: v6('fd00::3'), dst: v6('fd00::4'), dstMac: Buffer.from('020000000004', 'hex') });
  t.equal(text(ok(t, uni).src), 'fd00::3', 'a unicast advert from a global address is accepted (keepalived unicast_peer)');
  const multi = encodeAdvertisement6({ vrid: 9, priority: 50, maxAdverIntCs: 100, addresses: [], src: v6('fd00::3') });
  t.same(decodeAdvertisement6(multi), { ok: false, reason: 'bad-source' }, 'to ff02::12 from a global address (§5.1.2.1)');
  t.ok(isLinkLocal6(v6('fe80::1')) && isLinkLocal6(v6('febf::1')) && !isLinkLocal6(v6('fec0::1')) && !isLinkLocal6(v6('fd00::1')), 'fe80::/10');
});

t.test('every refusal reason', async (t) => {
  const good = encodeAdvertisement6({ vrid: 51, priority: 100, maxAdverIntCs: 100, addresses: [v6('fd00::1'), v6('fd00::2')], src: v6('fe80::2') });
  const mutate = (f: (b: Buffer) => void): Buffer => { const b = Buffer.from(good); f(b); return b; };
  const src = (a: string): Buffer => encodeAdvertisement6({ vrid: 51, priority: 100, maxAdverIntCs: 100, addresses: [], src: v6(a) });
  const cases: [string, Buffer, string][] = [
    ['empty', Buffer.alloc(0), 'truncated'],
    ['half an IPv6 header', good.subarray(0, 40), 'truncated'],
    ['payload length past the frame', good.subarray(0, good.length - 1), 'truncated'],
    ['VRRP header cut', fixSum(mutate((b) => b.writeUInt16BE(4, 18))).subarray(0, 58), 'truncated'],
    ['IPv4 ethertype', mutate((b) => b.writeUInt16BE(0x0800, 12)), 'not-vrrp'],
    ['version nibble 4', mutate((b) => { b[14] = 0x4c; }), 'not-vrrp'],
    ['next header 58 (ICMPv6)', mutate((b) => { b[20] = 58; }), 'not-vrrp'],
    ['next header 0 (a hop-by-hop extension header)', mutate((b) => { b[20] = 0; }), 'not-vrrp'],
    ['VRID 0', fixSum(mutate((b) => { b[55] = 0; })), 'not-vrrp'],
    ['hop limit 254: crossed a router (§7.1)', mutate((b) => { b[21] = 254; }), 'bad-hop-limit'],
    ['hop limit 1', mutate((b) => { b[21] = 1; }), 'bad-hop-limit'],
    ['VRRPv2', fixSum(mutate((b) => { b[54] = 0x21; })), 'bad-version'],
    ['type 2', fixSum(mutate((b) => { b[54] = 0x32; })), 'bad-type'],
    ['count says 3, 2 present', fixSum(mutate((b) => { b[57] = 3; })), 'bad-length'],
    ['count says 1, 2 present', fixSum(mutate((b) => { b[57] = 1; })), 'bad-length'],
    ['IPv4-sized addresses', fixSum(mutate((b) => { b[57] = 8; })), 'bad-length'],
    ['checksum flipped', mutate((b) => { b[61]! ^= 0xff; }), 'bad-checksum'],
    ['an address changed after checksumming', mutate((b) => { b[70]! ^= 1; }), 'bad-checksum'],
    ['the source changed after checksumming (pseudo-header)', mutate((b) => { b[37]! ^= 1; }), 'bad-checksum'],
    ['to ff02::12 from a global address', src('fd00::2'), 'bad-source'],
    ['from the unspecified address', src('::'), 'bad-source'],
    ['from a multicast address', encodeAdvertisement6({ vrid: 51, priority: 100, maxAdverIntCs: 100, addresses: [], src: v6('ff02::1'), dst: v6('fe80::9') }), 'bad-source'],
  ];
  for (const [name, frame, want] of cases) {
    const r = decodeAdvertisement6(frame);
    t.equal(r.ok ? 'ok' : r.reason, want, name);
  }
  const covered = new Set(cases.map((c) => c[2]));
  // bad-ttl and bad-ip-checksum are IPv4's (codec.test.ts).
  for (const reason of DROP_REASONS.filter((r) => r !== 'bad-ttl' && r !== 'bad-ip-checksum')) t.ok(covered.has(reason), `reason ${reason} is exercised`);
});

t.test("the kernel filter is tcpdump's for the same expression", async (t) => {
  // tcpdump -dd 'ip6 and ip6[6] = 112 and ip6[41] = 51'
  t.same(vrrpFilter6(51), [
    [0x28, 0, 0, 0x0c], [0x15, 0, 5, 0x86dd], [0x30, 0, 0, 0x14], [0x15, 0, 3, 0x70],
    [0x30, 0, 0, 0x37], [0x15, 0, 1, 0x33], [0x06, 0, 0, 0x40000], [0x06, 0, 0, 0],
  ]);
  t.throws(() => vrrpFilter6(256), /out of range/);
});

t.test('fuzz: decode never throws, refuses with a known reason, and what it accepts re-encodes exactly', async (t) => {
  const rnd = prng(0x5798_6);
  const reasons = new Set<string>(DROP_REASONS);
  const base = [KEEPALIVED, encodeAdvertisement6({ vrid: 3, priority: 9, maxAdverIntCs: 7, addresses: [v6('fd00::1'), v6('2001:db8::5')], src: v6('fe80::77') })];
  let bad = 0;
  let accepted = 0;
  const ITER = 20_000;
  for (let i = 0; i < ITER && bad < 5; i++) {
    const b = Buffer.from(base[i % 2]!);
    const flips = 1 + Math.floor(rnd() * 3);
    for (let j = 0; j < flips; j++) b[Math.floor(rnd() * b.length)] = Math.floor(rnd() * 256);
    const frame = i % 5 === 0 ? b.subarray(0, Math.floor(rnd() * b.length)) : i % 5 === 1 ? fixSum(b) : b;
    let r;
    try { r = decodeAdvertisement6(frame); } catch (e) { bad++; t.fail(`threw on ${frame.toString('hex')}: ${String(e)}`); continue; }
    if (!r.ok) { if (!reasons.has(r.reason)) { bad++; t.fail(`unknown reason ${r.reason}`); } continue; }
    accepted++;
    const f = r.frame;
    // An interval of 0 decodes (the machine reads it as 1 cs) but is never sent.
    if (f.maxAdverIntCs === 0) continue;
    const again = encodeMessage6(f, f.src, f.dst);
    const start = 54;
    if (!again.equals(frame.subarray(start, start + again.length)) && (frame[start + 4]! & 0xf0) === 0) {
      bad++;
      t.fail(`accepted frame does not re-encode: ${frame.toString('hex')}`);
    }
  }
  t.equal(bad, 0, `${ITER} mutated frames: no throw, known reasons, exact re-encoding (${accepted} accepted)`);
});
