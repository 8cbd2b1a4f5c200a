// The framing both packet codecs share (dhcp/codec.ts, failover/codec.ts):
// the Internet checksum against RFC 1071's worked example, an IPv4 header
// byte for byte against a well-known capture, and the decoder's reasons.
import t from 'tap';
import {
  decodeIpv4Frame, encodeIpv4Frame, internetChecksum, pseudoHeaderSum, udpChecksum, IPPROTO_UDP,
} from '../../../agent/net/packet/inet';
import { parseIPv4 } from '../../../agent/address';

const ip = (s: string): number => parseIPv4(s)!;

t.test('RFC 1071 §3 example: sum ddf2, checksum 220d; odd length pads a zero', async (t) => {
  const b = Buffer.from('0001f203f4f5f6f7', 'hex');
  t.equal(internetChecksum(b), 0x220d);
  t.equal(internetChecksum(Buffer.from('01', 'hex')), ~0x0100 & 0xffff);
  // Verifying: the sum over data that holds its own checksum is 0.
  t.equal(internetChecksum(Buffer.concat([b, Buffer.from('220d', 'hex')])), 0);
});

t.test('IPv4 header byte for byte (192.168.0.1 -> 192.168.0.199, UDP, DF, TTL 64: checksum b861)', async (t) => {
  const f = encodeIpv4Frame({
    dstMac: Buffer.from('ffffffffffff', 'hex'), srcMac: Buffer.from('020000000001', 'hex'),
    tos: 0, id: 0, flags: 2, ttl: 64, protocol: IPPROTO_UDP, srcIp: ip('192.168.0.1'), dstIp: ip('192.168.0.199'),
  }, 0x73 - 20);
  t.equal(f.subarray(0, 14).toString('hex'), 'ffffffffffff0200000000010800');
  t.equal(f.subarray(14, 34).toString('hex'), '450000730000400040 11b861c0a80001c0a800c7'.replace(/ /g, ''));
  t.equal(f.length, 14 + 0x73);
  const d = decodeIpv4Frame(f);
  t.match(d, { ok: true, packet: { protocol: 17, ttl: 64, flagsFrag: 0x4000, srcIp: ip('192.168.0.1'), dstIp: ip('192.168.0.199'), payloadStart: 34, payloadEnd: 14 + 0x73 } });
});

t.test('UDP checksum is the pseudo-header sum plus the segment', async (t) => {
  const seg = Buffer.from('0044004300080000', 'hex');
  const c = udpChecksum(ip('10.0.0.1'), ip('10.0.0.2'), seg);
  t.equal(c, internetChecksum(seg, 0, seg.length, pseudoHeaderSum(ip('10.0.0.1'), ip('10.0.0.2'), IPPROTO_UDP, seg.length)));
  seg.writeUInt16BE(c, 6);
  t.equal(udpChecksum(ip('10.0.0.1'), ip('10.0.0.2'), seg), 0, 'verifies once filled in');
});

t.test('decode: every malformed header is a reason, never a throw', async (t) => {
  const good = encodeIpv4Frame({
    dstMac: Buffer.alloc(6), srcMac: Buffer.alloc(6), tos: 0, id: 1, flags: 0, ttl: 255, protocol: 112, srcIp: 1, dstIp: 2,
  }, 8);
  const bad = (edit: (b: Buffer) => void, fixSum = true): Buffer => {
    const b = Buffer.from(good);
    edit(b);
    if (fixSum) { b.writeUInt16BE(0, 24); b.writeUInt16BE(internetChecksum(b, 14, 34), 24); }
    return b;
  };
  t.match(decodeIpv4Frame(good.subarray(0, 10)), { ok: false, reason: 'truncated' });
  t.match(decodeIpv4Frame(bad((b) => b.writeUInt16BE(0x86dd, 12))), { ok: false, reason: 'not-ipv4' });
  t.match(decodeIpv4Frame(good.subarray(0, 30)), { ok: false, reason: 'truncated' });
  t.match(decodeIpv4Frame(bad((b) => { b[14] = 0x65; })), { ok: false, reason: 'not-ipv4' });
  t.match(decodeIpv4Frame(bad((b) => { b[14] = 0x44; })), { ok: false, reason: 'bad-header-length' });
  t.match(decodeIpv4Frame(bad((b) => { b[15] = 1; }, false)), { ok: false, reason: 'bad-ip-checksum' });
  t.match(decodeIpv4Frame(bad((b) => b.writeUInt16BE(19, 16))), { ok: false, reason: 'bad-total-length' });
  t.match(decodeIpv4Frame(bad((b) => b.writeUInt16BE(29, 16))), { ok: false, reason: 'truncated' });
  // Ethernet padding past the total length is not payload.
  t.match(decodeIpv4Frame(Buffer.concat([good, Buffer.alloc(18)])), { ok: true, packet: { payloadEnd: good.length } });
});
