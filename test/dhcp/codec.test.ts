// Unit tests of the DHCP codec: byte-for-byte against frames captured from
// dnsmasq, udhcpc and dhclient, every drop reason, option overload and
// RFC 3396 concatenation, the BPF filter run on the same frames, and a
// bounded, seeded fuzz of the decoders.
import t from 'tap';
import { prng } from '../helpers/random';
import {
  BROADCAST_IP, BROADCAST_MAC, DHCP_CLIENT_FILTER, DROP_REASONS, MessageType, Opt,
  buildClientMessage, decodeDhcp, decodeReply, decodeUdpFrame, describePacket, encodeDhcp, encodeUdpFrame,
  prefixFromMask, replyClientMac, type DhcpOption, type DropReason,
} from '../../agent/dhcp/codec';
import { internetChecksum, udpChecksum } from '../../agent/net/packet/inet';
import { formatIPv4, parseIPv4 } from '../../agent/address';
import * as golden from './fixtures/golden';

const hex = (g: golden.GoldenFrame): Buffer => Buffer.from(g.hex, 'hex');
const ip = (s: string): number => parseIPv4(s)!;
const CLIENT_MAC = '52:54:00:bb:00:02';
const SERVER_MAC = '52:54:00:aa:00:01';
const NOT_READY = { csumNotReady: true };
const READY = { csumNotReady: false };

/** Copy of a golden server frame with tcpdump's full UDP checksum in place of the partial one. */
function completed(g: golden.GoldenFrame): Buffer {
  const b = hex(g);
  b.writeUInt16BE(g.fullChecksum!, 14 + 20 + 6);
  return b;
}

/** Re-encode a decoded frame from its parts: the inverse of decode. */
function reencode(frame: Buffer, port: number): Buffer {
  const f = decodeUdpFrame(frame, NOT_READY, port);
  if (!f.ok) throw new Error(`golden frame did not decode: ${f.reason}`);
  const d = decodeDhcp(f.value.payload);
  if (!d.ok) throw new Error(`golden payload did not decode: ${d.reason}`);
  const m = d.value.message;
  const payload = encodeDhcp({ ...m, options: m.options });
  return encodeUdpFrame({ ...f.value, payload });
}

t.test('client frames from udhcpc and dhclient re-encode byte for byte', async (t) => {
  for (const g of [golden.udhcpcDiscover, golden.udhcpcRequest, golden.dhclientDiscover, golden.dhclientInitRebootRequest]) {
    t.ok(g.checksumComplete);
    t.equal(reencode(hex(g), 67).toString('hex'), g.hex, g.about);
  }
});

t.test('server frames re-encode byte for byte with the UDP checksum tcpdump computed', async (t) => {
  for (const g of [golden.dnsmasqOffer, golden.dnsmasqAck, golden.dnsmasqNak]) {
    t.equal(reencode(hex(g), 68).toString('hex'), completed(g).toString('hex'), g.about);
  }
});

t.test('encoding the udhcpc DISCOVER from its parts gives its exact bytes', async (t) => {
  const options: DhcpOption[] = [
    { code: Opt.MESSAGE_TYPE, data: Buffer.from([MessageType.DISCOVER]) },
    { code: Opt.MAX_MESSAGE_SIZE, data: Buffer.from([0x02, 0x40]) },
    { code: Opt.PARAM_LIST, data: Buffer.from([1, 3, 6, 12, 15, 28, 42]) },
    { code: Opt.HOSTNAME, data: Buffer.from('lab-client') },
    { code: Opt.VENDOR_CLASS, data: Buffer.from('udhcp 1.35.0') },
    { code: Opt.CLIENT_ID, data: Buffer.from('01525400bb0002', 'hex') },
  ];
  const payload = encodeDhcp({ op: 1, xid: 0xf52fe95a, chaddr: CLIENT_MAC, options });
  t.equal(payload.length, 300, 'padded to the BOOTP minimum of 300 octets');
  const frame = encodeUdpFrame({ dstMac: BROADCAST_MAC, srcMac: CLIENT_MAC, srcIp: 0, dstIp: BROADCAST_IP, payload });
  t.equal(frame.toString('hex'), golden.udhcpcDiscover.hex);
});

t.test('dnsmasq OFFER and ACK decode to the lease udhcpc was given', async (t) => {
  for (const [g, kind] of [[golden.dnsmasqOffer, 'OFFER'], [golden.dnsmasqAck, 'ACK']] as const) {
    const r = decodeReply(hex(g), NOT_READY, { xid: 0xf52fe95a, mac: CLIENT_MAC });
    if (!r.ok) { t.fail(`dropped: ${r.reason}`); continue; }
    const { message: m, fields: f } = r.value.packet;
    t.equal(f.kind, kind);
    t.equal(formatIPv4(m.yiaddr), '10.99.0.101');
    t.equal(formatIPv4(f.serverId!), '10.99.0.2');
    t.equal(f.leaseSeconds, 3600);
    t.equal(f.t1Seconds, 1800);
    t.equal(f.t2Seconds, 3150);
    t.equal(f.prefix, 24);
    t.same(f.routers.map(formatIPv4), ['10.99.0.1']);
    t.same(f.dns.map(formatIPv4), ['10.99.0.53']);
    t.equal(r.value.frame.srcMac, SERVER_MAC, 'the server MAC is what a RENEWING unicast is sent to');
    t.ok(m.options.some((o) => o.code === 28 && o.data.equals(Buffer.from([10, 99, 0, 255]))), 'unknown option 28 kept raw');
    t.match(describePacket(r.value.packet), new RegExp(`^${kind} 10\\.99\\.0\\.101 from 10\\.99\\.0\\.2 xid 0xf52fe95a$`));
  }
  const ack = decodeReply(hex(golden.dnsmasqAck), NOT_READY, { xid: 0xf52fe95a, mac: CLIENT_MAC });
  t.equal(ack.ok && ack.value.packet.fields.hostname, 'lab-client');
});

t.test('dnsmasq NAK decodes with its message', async (t) => {
  const r = decodeReply(hex(golden.dnsmasqNak), NOT_READY, { xid: 0x58663f17, mac: CLIENT_MAC });
  t.ok(r.ok);
  if (!r.ok) return;
  t.equal(r.value.packet.fields.kind, 'NAK');
  t.equal(r.value.packet.fields.message, 'wrong network');
  t.equal(r.value.packet.message.flags, 0x8000);
  t.equal(r.value.frame.dstIp, BROADCAST_IP);
});

t.test('client requests decode with the options their clients sent', async (t) => {
  const f = decodeUdpFrame(hex(golden.dhclientInitRebootRequest), READY, 67);
  t.ok(f.ok);
  if (!f.ok) return;
  const d = decodeDhcp(f.value.payload);
  t.ok(d.ok);
  if (!d.ok) return;
  t.equal(d.value.fields.kind, 'REQUEST');
  t.equal(formatIPv4(d.value.fields.requestedIp!), '10.99.5.5', 'INIT-REBOOT asks for the saved address');
  t.equal(d.value.fields.serverId, undefined, 'and names no server (RFC 2131 table 5)');
  t.equal(f.value.tos, 0x10);
  t.equal(f.value.ttl, 128);
  const u = decodeDhcp(decodeUdpFrame(hex(golden.udhcpcDiscover), READY, 67).ok ? hex(golden.udhcpcDiscover).subarray(42) : Buffer.alloc(0));
  t.ok(u.ok && u.value.fields.clientId?.equals(Buffer.from('01525400bb0002', 'hex')));
  t.same(u.ok && u.value.fields.paramList, [1, 3, 6, 12, 15, 28, 42]);
  t.equal(u.ok && u.value.fields.maxMessageSize, 576);
});

t.test('UDP checksums: partial sums are skipped only when the kernel says so', async (t) => {
  const expect = { xid: 0xf52fe95a, mac: CLIENT_MAC };
  t.same(decodeReply(hex(golden.dnsmasqOffer), READY, expect), { ok: false, reason: 'bad-udp-checksum' },
    'a partial checksum on a frame not flagged csumNotReady is a bad checksum');
  t.ok(decodeReply(completed(golden.dnsmasqOffer), READY, expect).ok, 'the completed checksum verifies');
  const zero = hex(golden.dnsmasqOffer);
  zero.writeUInt16BE(0, 40);
  t.ok(decodeReply(zero, READY, expect).ok, 'checksum 0 means none was sent (RFC 768)');
  // Our own checksum function agrees with tcpdump on all three server frames.
  for (const g of [golden.dnsmasqOffer, golden.dnsmasqAck, golden.dnsmasqNak]) {
    const b = hex(g);
    const seg = Buffer.from(b.subarray(34, 34 + b.readUInt16BE(38)));
    seg.writeUInt16BE(0, 6);
    t.equal(udpChecksum(b.readUInt32BE(26), b.readUInt32BE(30), seg), g.fullChecksum);
    t.equal(internetChecksum(b, 14, 34), 0, 'IP header checksum verifies');
  }
});

t.test('every drop reason', async (t) => {
  const expect = { xid: 0xf52fe95a, mac: CLIENT_MAC };
  const good = completed(golden.dnsmasqOffer);
  const reason = (b: Buffer, info = READY, e = expect): string => {
    const r = decodeReply(b, info, e);
    return r.ok ? 'ok' : r.reason;
  };
  const fixIp = (b: Buffer): Buffer => { b.writeUInt16BE(0, 24); b.writeUInt16BE(internetChecksum(b, 14, 34), 24); return b; };
  const seen = new Set<DropReason>();
  const check = (b: Buffer, want: DropReason, what: string, info = READY, e = expect): void => {
    t.equal(reason(b, info, e), want, what);
    seen.add(want);
  };
  t.equal(reason(good), 'ok');
  check(good.subarray(0, 10), 'truncated', 'shorter than Ethernet');
  check(good.subarray(0, 30), 'truncated', 'shorter than IP');
  check(good.subarray(0, 300), 'truncated', 'shorter than the IP total length');
  { const b = Buffer.from(good); b.writeUInt16BE(0x86dd, 12); check(b, 'not-ipv4', 'IPv6 ethertype'); }
  { const b = Buffer.from(good); b[14] = 0x65; check(fixIp(b), 'not-ipv4', 'IP version 6 in the header'); }
  { const b = Buffer.from(good); b[22] = 63; check(b, 'bad-ip-checksum', 'TTL changed, checksum not'); }
  { const b = Buffer.from(good); b.writeUInt16BE(0x2000, 20); check(fixIp(b), 'fragment', 'more-fragments set'); }
  { const b = Buffer.from(good); b[23] = 6; check(fixIp(b), 'not-udp-68', 'TCP'); }
  check(hex(golden.udhcpcDiscover), 'not-udp-68', 'a client request (to port 67)');
  { const b = Buffer.from(good); b.writeUInt16BE(400, 38); check(b, 'bad-udp-length', 'UDP length beyond IP'); }
  { const b = Buffer.from(good); b.writeUInt16BE(4, 38); check(b, 'bad-udp-length', 'UDP length below its header'); }
  { const b = Buffer.from(good); b[100]! ^= 1; check(b, 'bad-udp-checksum', 'payload changed, checksum not'); }
  { const b = Buffer.from(hex(golden.dnsmasqOffer)); b[42 + 236] = 0; check(b, 'bad-cookie', 'cookie damaged', NOT_READY); }
  { const b = Buffer.from(hex(golden.dnsmasqOffer)); b[42 + 244] = 200; check(b, 'bad-option', 'server id length runs past the field', NOT_READY); }
  { const b = Buffer.from(hex(golden.dnsmasqOffer)); b[42 + 240] = 60; check(b, 'no-message-type', 'option 53 renamed to 60', NOT_READY); }
  { const b = Buffer.from(hex(golden.dnsmasqOffer)); b[42] = 1; check(b, 'not-reply', 'op BOOTREQUEST', NOT_READY); }
  check(hex(golden.dnsmasqOffer), 'wrong-chaddr', 'another client', NOT_READY, { xid: expect.xid, mac: '02:00:00:00:00:01' });
  check(hex(golden.dnsmasqOffer), 'wrong-xid', 'another transaction', NOT_READY, { xid: 1, mac: CLIENT_MAC });
  { // a server never sends a client a DISCOVER
    const payload = encodeDhcp({ op: 2, xid: expect.xid, chaddr: CLIENT_MAC, options: [{ code: 53, data: Buffer.from([1]) }] });
    check(encodeUdpFrame({ srcMac: SERVER_MAC, dstMac: CLIENT_MAC, srcIp: ip('10.99.0.2'), dstIp: BROADCAST_IP, srcPort: 67, dstPort: 68, payload }), 'not-reply', 'DISCOVER sent to port 68');
  }
  t.same([...seen].sort(), [...DROP_REASONS].sort(), 'each reason reachable');
});

t.test('known options with bad lengths or values are bad options', async (t) => {
  const base: DhcpOption[] = [{ code: 53, data: Buffer.from([5]) }];
  const decode = (extra: DhcpOption[]): string => {
    const r = decodeDhcp(encodeDhcp({ op: 2, xid: 1, chaddr: CLIENT_MAC, options: [...base, ...extra] }));
    return r.ok ? 'ok' : r.reason;
  };
  t.equal(decode([]), 'ok');
  t.equal(decode([{ code: 54, data: Buffer.from([1, 2, 3]) }]), 'bad-option', 'server id of 3 octets');
  t.equal(decode([{ code: 51, data: Buffer.alloc(5) }]), 'bad-option', 'lease time of 5 octets');
  t.equal(decode([{ code: 1, data: Buffer.from([255, 0, 255, 0]) }]), 'bad-option', 'non-contiguous netmask');
  t.equal(decode([{ code: 3, data: Buffer.alloc(6) }]), 'bad-option', 'router list not a multiple of 4');
  t.equal(decode([{ code: 57, data: Buffer.from([1, 0]) }]), 'bad-option', 'max size below 576');
  t.equal(decode([{ code: 61, data: Buffer.from([1]) }]), 'bad-option', 'client id of 1 octet');
  t.equal(decode([{ code: 12, data: Buffer.alloc(0) }]), 'bad-option', 'empty hostname');
  const zeroType = decodeDhcp(encodeDhcp({ op: 2, xid: 1, chaddr: CLIENT_MAC, options: [{ code: 53, data: Buffer.from([0]) }] }));
  t.same(zeroType, { ok: false, reason: 'bad-option' });
  const future = decodeDhcp(encodeDhcp({ op: 2, xid: 1, chaddr: CLIENT_MAC, options: [{ code: 53, data: Buffer.from([13]) }] }));
  t.ok(future.ok && future.value.fields.kind === undefined && future.value.fields.type === 13, 'a later RFC type is kept by number');
  const noEnd = encodeDhcp({ op: 2, xid: 1, chaddr: CLIENT_MAC, options: base }, 0).subarray(0, 240 + 3);
  t.ok(decodeDhcp(noEnd).ok, 'a missing end option is tolerated');
});

t.test('RFC 3396: a long option is split on encode and concatenated on decode', async (t) => {
  const long = Buffer.alloc(600, 0);
  for (let i = 0; i < long.length; i += 4) long.writeUInt32BE(0x0a000000 + i, i);
  const enc = encodeDhcp({ op: 2, xid: 7, chaddr: CLIENT_MAC, options: [{ code: 53, data: Buffer.from([5]) }, { code: Opt.DNS, data: long }] });
  const d = decodeDhcp(enc);
  t.ok(d.ok);
  if (!d.ok) return;
  t.equal(d.value.message.options.filter((o) => o.code === Opt.DNS).length, 3, 'three instances on the wire (255+255+90)');
  t.equal(d.value.fields.dns.length, 150);
  t.equal(d.value.fields.dns[149], 0x0a000000 + 596);
});

t.test('option overload (52): options in file and sname are read, file first', async (t) => {
  const file = Buffer.alloc(128);
  Buffer.from([51, 4, 0, 0, 0x0e, 0x10, 255]).copy(file);            // lease time 3600 in file
  const sname = Buffer.alloc(64);
  Buffer.from([3, 4, 10, 99, 0, 1, 58, 4, 0, 0, 0x07, 0x08, 255]).copy(sname); // router, T1 in sname
  const opts = (ov: number): DhcpOption[] => [{ code: 53, data: Buffer.from([2]) }, { code: 52, data: Buffer.from([ov]) }, { code: 54, data: Buffer.from([10, 99, 0, 2]) }];
  const d = decodeDhcp(encodeDhcp({ op: 2, xid: 7, chaddr: CLIENT_MAC, file, sname, options: opts(3) }));
  t.ok(d.ok);
  if (!d.ok) return;
  t.equal(d.value.fields.leaseSeconds, 3600);
  t.equal(d.value.fields.t1Seconds, 1800);
  t.same(d.value.fields.routers, [ip('10.99.0.1')]);
  t.same(d.value.message.options.map((o) => o.code), [53, 52, 54, 51, 3, 58], 'file before sname');
  const onlyFile = decodeDhcp(encodeDhcp({ op: 2, xid: 7, chaddr: CLIENT_MAC, file, sname, options: opts(1) }));
  t.ok(onlyFile.ok && onlyFile.value.fields.t1Seconds === undefined, 'value 1: sname is a server name, not options');
  t.same(decodeDhcp(encodeDhcp({ op: 2, xid: 7, chaddr: CLIENT_MAC, file, sname, options: opts(4) })), { ok: false, reason: 'bad-option' }, 'value 4 rejected');
  const nested = Buffer.alloc(128);
  Buffer.from([52, 1, 2, 255]).copy(nested);
  t.same(decodeDhcp(encodeDhcp({ op: 2, xid: 7, chaddr: CLIENT_MAC, file: nested, options: opts(1) })), { ok: false, reason: 'bad-option' }, '52 inside file rejected');
  const runaway = Buffer.alloc(128);
  Buffer.from([51, 200]).copy(runaway);
  t.same(decodeDhcp(encodeDhcp({ op: 2, xid: 7, chaddr: CLIENT_MAC, file: runaway, options: opts(1) })), { ok: false, reason: 'bad-option' }, 'option running past file rejected');
});

t.test('client messages follow RFC 2131 table 5', async (t) => {
  const id = { mac: '02:aa:bb:cc:dd:ee', clientId: Buffer.from('ff0102030405', 'hex'), hostname: 'web' };
  const build = (spec: Parameters<typeof buildClientMessage>[0]): Map<number, Buffer> & { ciaddr: number; secs: number } => {
    const m = buildClientMessage(spec, id);
    const d = decodeDhcp(encodeDhcp(m));
    if (!d.ok) throw new Error(d.reason);
    const map = new Map(d.value.message.options.map((o) => [o.code, o.data])) as Map<number, Buffer> & { ciaddr: number; secs: number };
    map.ciaddr = d.value.message.ciaddr;
    map.secs = d.value.message.secs;
    return map;
  };
  const A = ip('10.99.0.101');
  const S = ip('10.99.0.2');
  const disc = build({ kind: 'DISCOVER', xid: 1, secs: 3, ciaddr: 0, requestedIp: A, serverId: S });
  t.same([...disc.keys()], [53, 61, 50, 12, 55, 57]);
  t.equal(disc.secs, 3);
  t.notOk(disc.has(54), 'DISCOVER: no server id');
  const sel = build({ kind: 'REQUEST', xid: 1, secs: 4, ciaddr: 0, requestedIp: A, serverId: S });
  t.ok(sel.has(50) && sel.has(54) && sel.ciaddr === 0, 'SELECTING: 50 and 54, ciaddr 0');
  const reboot = build({ kind: 'REQUEST', xid: 1, secs: 0, ciaddr: 0, requestedIp: A, serverId: undefined });
  t.ok(reboot.has(50) && !reboot.has(54), 'INIT-REBOOT: 50, no 54');
  const renew = build({ kind: 'REQUEST', xid: 1, secs: 0, ciaddr: A, requestedIp: A, serverId: undefined });
  t.ok(!renew.has(50) && !renew.has(54) && renew.ciaddr === A, 'RENEWING: ciaddr, no 50/54');
  const decline = build({ kind: 'DECLINE', xid: 1, secs: 9, ciaddr: 0, requestedIp: A, serverId: S, message: 'address in use by 02:00:00:00:00:09' });
  t.same([...decline.keys()], [53, 61, 50, 54, 56], 'DECLINE: 50, 54, message; no 12/55/57');
  t.equal(decline.secs, 0);
  const release = build({ kind: 'RELEASE', xid: 1, secs: 9, ciaddr: A, requestedIp: A, serverId: S });
  t.same([...release.keys()], [53, 61, 54], 'RELEASE: ciaddr and 54 only');
  t.equal(release.ciaddr, A);
  t.equal(disc.get(61)!.toString('hex'), 'ff0102030405');
  t.equal(disc.get(12)!.toString(), 'web');
  const frame = encodeUdpFrame({ srcMac: id.mac, dstMac: BROADCAST_MAC, srcIp: 0, dstIp: BROADCAST_IP, payload: encodeDhcp(buildClientMessage({ kind: 'DISCOVER', xid: 0xdeadbeef, secs: 0, ciaddr: 0, requestedIp: undefined, serverId: undefined }, id)) });
  const back = decodeUdpFrame(frame, READY, 67);
  t.ok(back.ok && back.value.srcMac === id.mac && back.value.srcPort === 68, 'our DISCOVER frame verifies (IP and UDP checksums)');
});

t.test('prefixFromMask', async (t) => {
  t.equal(prefixFromMask(0xffffff00), 24);
  t.equal(prefixFromMask(0xffffffff), 32);
  t.equal(prefixFromMask(0), 0);
  t.equal(prefixFromMask(0xfffffffe), 31);
  t.equal(prefixFromMask(0xff00ff00), undefined);
});

/** A classic BPF interpreter for the opcodes the filter uses: run the filter the kernel will run. */
function runBpf(prog: ReadonlyArray<readonly [number, number, number, number]>, pkt: Buffer): number {
  let A = 0;
  let X = 0;
  for (let pc = 0; pc < prog.length; pc++) {
    const [code, jt, jf, k] = prog[pc]!;
    const ld = (off: number, size: number): number | undefined => (off + size > pkt.length ? undefined : size === 2 ? pkt.readUInt16BE(off) : pkt[off]!);
    switch (code) {
      case 0x28: { const v = ld(k, 2); if (v === undefined) return 0; A = v; break; }
      case 0x30: { const v = ld(k, 1); if (v === undefined) return 0; A = v; break; }
      case 0x48: { const v = ld(X + k, 2); if (v === undefined) return 0; A = v; break; }
      case 0xb1: { const v = ld(k, 1); if (v === undefined) return 0; X = (v & 0xf) * 4; break; }
      case 0x15: pc += A === k ? jt : jf; break;
      case 0x45: pc += (A & k) !== 0 ? jt : jf; break;
      case 0x06: return k;
      default: throw new Error(`opcode ${code} not interpreted`);
    }
  }
  return 0;
}

t.test('the BPF filter passes replies to port 68 and nothing else', async (t) => {
  for (const g of [golden.dnsmasqOffer, golden.dnsmasqAck, golden.dnsmasqNak]) t.ok(runBpf(DHCP_CLIENT_FILTER, hex(g)) > 0, g.about);
  for (const g of [golden.udhcpcDiscover, golden.dhclientDiscover, golden.udhcpcRequest]) t.equal(runBpf(DHCP_CLIENT_FILTER, hex(g)), 0, g.about);
  const frag = hex(golden.dnsmasqOffer);
  frag.writeUInt16BE(0x0010, 20); // offset 16*8: a later fragment, its "port" bytes are data
  t.equal(runBpf(DHCP_CLIENT_FILTER, frag), 0, 'non-first fragment');
  const v6 = hex(golden.dnsmasqOffer);
  v6.writeUInt16BE(0x86dd, 12);
  t.equal(runBpf(DHCP_CLIENT_FILTER, v6), 0, 'IPv6');
  const opts = hex(golden.dnsmasqOffer);
  // an IPv4 header with options (IHL 6) moves the UDP header: insert 4 octets
  const withOpts = Buffer.concat([opts.subarray(0, 34), Buffer.from([1, 1, 1, 0]), opts.subarray(34)]);
  withOpts[14] = 0x46;
  t.ok(runBpf(DHCP_CLIENT_FILTER, withOpts) > 0, 'IHL honoured');
});

t.test('fuzz: decoders never throw and only return known reasons (bounded, seeded)', async (t) => {
  const rnd = prng(0x5eed);
  const known = new Set<string>(DROP_REASONS);
  let bad = 0;
  let runs = 0;
  const expect = { xid: 0xf52fe95a, mac: CLIENT_MAC };
  const judge = (b: Buffer, info: { csumNotReady: boolean }): void => {
    runs++;
    try {
      const r = decodeReply(b, info, expect);
      if (!r.ok && !known.has(r.reason)) bad++;
      const d = decodeDhcp(b.subarray(Math.min(b.length, 42)));
      if (!d.ok && !known.has(d.reason)) bad++;
    } catch (e) {
      bad++;
      t.fail(`threw on ${b.toString('hex')}: ${String(e)}`);
    }
  };
  for (let i = 0; i < 3000; i++) {
    const b = Buffer.alloc(Math.floor(rnd() * 600));
    for (let j = 0; j < b.length; j++) b[j] = Math.floor(rnd() * 256);
    if (b.length > 14 && rnd() < 0.5) { b.writeUInt16BE(0x0800, 12); if (b.length > 15) b[14] = 0x45; }
    judge(b, { csumNotReady: rnd() < 0.5 });
  }
  const seeds = [golden.dnsmasqOffer, golden.dnsmasqAck, golden.dnsmasqNak, golden.udhcpcDiscover];
  for (const g of seeds) {
    const base = hex(g);
    for (let i = 0; i < 1500; i++) {
      const b = Buffer.from(base);
      const flips = 1 + Math.floor(rnd() * 8);
      for (let f = 0; f < flips; f++) {
        // bias half the flips into the options, where parsers break
        const pos = rnd() < 0.5 ? 42 + 240 + Math.floor(rnd() * (b.length - 282)) : Math.floor(rnd() * b.length);
        b[pos]! ^= 1 << Math.floor(rnd() * 8);
      }
      judge(b, NOT_READY);
    }
    for (let len = 0; len <= base.length; len++) judge(base.subarray(0, len), NOT_READY);
  }
  t.equal(bad, 0, `${runs} inputs, none threw or returned an unknown reason`);
});

t.test('replyClientMac: the client a reply is for, read in place; nothing for what is not an Ethernet BOOTP reply', async (t) => {
  t.equal(replyClientMac(hex(golden.dnsmasqOffer)), CLIENT_MAC, 'dnsmasq OFFER: udhcpc\'s MAC');
  t.equal(replyClientMac(hex(golden.dnsmasqAck)), CLIENT_MAC, 'dnsmasq ACK');
  t.equal(replyClientMac(hex(golden.udhcpcDiscover)), undefined, 'a request (op 1) is no reply');
  const offer = hex(golden.dnsmasqOffer);
  t.equal(replyClientMac(offer.subarray(0, 14 + 20 + 8 + 33)), undefined, 'cut inside chaddr');
  const arp = Buffer.from(offer); arp.writeUInt16BE(0x0806, 12);
  t.equal(replyClientMac(arp), undefined, 'not IPv4');
  const hlen = Buffer.from(offer); hlen[14 + 20 + 8 + 2] = 16;
  t.equal(replyClientMac(hlen), undefined, 'not an Ethernet chaddr');
  const options = Buffer.from(offer); options[14] = 0x46; // IHL 6: chaddr four bytes further on
  t.notOk(replyClientMac(options) === CLIENT_MAC, 'the IP header length is honoured');
});
