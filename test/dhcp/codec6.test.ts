// Unit tests of the DHCPv6 codec: byte for byte against frames captured from
// dnsmasq, Kea and dhclient (test/dhcp/fixtures/golden6.ts says how), the
// UDP checksum over the IPv6 pseudo-header against tcpdump's, every drop
// reason, DUIDs, and a bounded, seeded fuzz of the decoders.
import t from 'tap';
import { prng } from '../helpers/random';
import {
  ALL_DHCP_MAC, ALL_DHCP_RELAY_AGENTS_AND_SERVERS, DROP6_REASONS, MsgType6, Opt6, Status6,
  buildClient6Message, decodeDhcp6, decodeReply6, decodeReplyPayload6, decodeUdp6Frame, describeDuid, describePacket6, duidLl, duidUuid,
  encodeDhcp6, encodeUdp6Frame, formatIPv6, iaAddrOption, iaNaOption, statusOption, type Dhcp6Option, type Reply6Expectation,
} from '../../agent/dhcp/codec6';
import { parseAddress } from '../../agent/address';
import * as golden from './fixtures/golden6';

const hex = (g: golden.Golden6Frame): Buffer => Buffer.from(g.hex, 'hex');
const ip6 = (s: string): bigint => parseAddress(s)!.value;
const UDP_CSUM = 14 + 40 + 6;
const NOT_READY = { csumNotReady: true };
const READY = { csumNotReady: false };
/** dhclient's DUID-LLT in the dnsmasq exchange, and the IAID it used (the MAC's low 32 bits). */
const DHCLIENT_DUID = Buffer.from('0001000132a89e0d02000000d601', 'hex');
const DNSMASQ_DUID = Buffer.from('0001000132a89e0c02000000d602', 'hex');
const UNBOUND_DUID = duidLl('02:00:00:00:d6:99');
const IAID = 0xd601;

/** A golden frame with tcpdump's full UDP checksum in place of the captured (partial) one. */
function completed(g: golden.Golden6Frame): Buffer {
  const b = hex(g);
  b.writeUInt16BE(g.fullChecksum, UDP_CSUM);
  return b;
}

const ALL = Object.entries(golden).filter((e): e is [string, golden.Golden6Frame] => typeof e[1] === 'object' && e[1] !== null && 'hex' in e[1]);

t.test('every captured frame re-encodes byte for byte, with the UDP checksum tcpdump computed', async (t) => {
  t.equal(ALL.length, 24);
  for (const [name, g] of ALL) {
    const b = hex(g);
    const f = decodeUdp6Frame(b, NOT_READY, b.readUInt16BE(14 + 40 + 2));
    if (!f.ok) { t.fail(`${name}: ${f.reason}`); continue; }
    const d = decodeDhcp6(f.value.payload);
    if (!d.ok) { t.fail(`${name}: ${d.reason}`); continue; }
    const again = encodeUdp6Frame({ ...f.value, payload: encodeDhcp6(d.value.message) });
    t.equal(again.toString('hex'), completed(g).toString('hex'), `${name}: ${g.about}`);
  }
});

t.test('our own frames went out with a complete checksum that tcpdump agreed with', async (t) => {
  for (const g of [golden.ourRenewDnsmasq, golden.ourRenewUnknown, golden.ourRebindUnknown, golden.ourConfirmUnknown, golden.ourRenewKea, golden.ourRenewUnknownKea]) {
    t.equal(hex(g).readUInt16BE(UDP_CSUM), g.fullChecksum, g.about);
    t.ok(decodeUdp6Frame(hex(g), READY, 547).ok, 'verifies with the pseudo-header sum');
  }
});

t.test('dhclient\'s SOLICIT encodes from its parts', async (t) => {
  const options: Dhcp6Option[] = [
    { code: Opt6.CLIENTID, data: DHCLIENT_DUID },
    { code: Opt6.ORO, data: Buffer.from('001700180027001f', 'hex') }, // 23, 24, 39, 31
    { code: Opt6.ELAPSED_TIME, data: Buffer.from('0000', 'hex') },
    iaNaOption({ iaid: IAID, t1: 3600, t2: 5400, options: [] }),
  ];
  const frame = encodeUdp6Frame({
    srcMac: '02:00:00:00:d6:01', dstMac: ALL_DHCP_MAC, srcIp: ip6('fe80::ff:fe00:d601'), dstIp: ALL_DHCP_RELAY_AGENTS_AND_SERVERS,
    flowLabel: 0xa7445, hopLimit: 1, payload: encodeDhcp6({ type: MsgType6.SOLICIT, xid: 0x1a3ebb, options }),
  });
  t.equal(frame.toString('hex'), completed(golden.dhclientSolicit).toString('hex'));
});

t.test('buildClient6Message: the RENEW that dnsmasq and Kea answered, and each kind\'s options', async (t) => {
  const renew = buildClient6Message(
    { kind: 'RENEW', xid: 0x123456, elapsedMs: 0, serverId: DNSMASQ_DUID, addresses: [{ address: ip6('fd00:99::191'), preferred: 0, valid: 0 }] },
    { duid: DHCLIENT_DUID, iaid: IAID },
  );
  const frame = encodeUdp6Frame({ srcMac: '02:00:00:00:d6:01', dstMac: ALL_DHCP_MAC, srcIp: ip6('fe80::ff:fe00:d601'), dstIp: ALL_DHCP_RELAY_AGENTS_AND_SERVERS, payload: encodeDhcp6(renew) });
  t.equal(frame.toString('hex'), golden.ourRenewDnsmasq.hex);
  const codes = (kind: Parameters<typeof buildClient6Message>[0]['kind']): number[] =>
    buildClient6Message({ kind, xid: 1, elapsedMs: 123_456_789, serverId: DNSMASQ_DUID, addresses: [] }, { duid: UNBOUND_DUID, iaid: 7 }).options.map((o) => o.code);
  t.same(codes('SOLICIT'), [1, 6, 8, 3], 'SOLICIT: no SERVERID (RFC 8415 appendix B)');
  t.same(codes('REQUEST'), [1, 2, 6, 8, 3]);
  t.same(codes('RENEW'), [1, 2, 6, 8, 3]);
  t.same(codes('REBIND'), [1, 6, 8, 3], 'REBIND: any server');
  t.same(codes('CONFIRM'), [1, 6, 8, 3]);
  t.same(codes('RELEASE'), [1, 2, 8, 3], 'RELEASE: no ORO');
  t.same(codes('DECLINE'), [1, 2, 8, 3]);
  const long = buildClient6Message({ kind: 'SOLICIT', xid: 0x1234567, elapsedMs: 123_456_789, serverId: undefined, addresses: [] }, { duid: UNBOUND_DUID, iaid: 7 });
  t.equal(long.options.find((o) => o.code === Opt6.ELAPSED_TIME)!.data.readUInt16BE(0), 0xffff, 'elapsed time saturates (RFC 8415 §21.9)');
  t.equal(long.xid, 0x234567, 'the transaction id is 24 bits');
  t.notOk(long.options.some((o) => o.code === Opt6.RAPID_COMMIT), 'no rapid commit: the ADVERTISE is judged first');
});

t.test('decoded fields of dnsmasq\'s and Kea\'s answers', async (t) => {
  const fields = (g: golden.Golden6Frame) => {
    const f = decodeUdp6Frame(hex(g), NOT_READY);
    t.ok(f.ok, g.about);
    const d = f.ok ? decodeDhcp6(f.value.payload) : undefined;
    return d?.ok ? d.value : undefined;
  };
  const adv = fields(golden.dnsmasqAdvertise)!;
  t.equal(adv.fields.kind, 'ADVERTISE');
  t.equal(adv.fields.preference, 0);
  t.equal(adv.fields.status?.code, Status6.Success);
  t.same(adv.fields.iaNa.map((ia) => [ia.iaid, ia.t1, ia.t2]), [[IAID, 21600, 37800]]);
  t.equal(formatIPv6(adv.fields.iaNa[0]!.addresses[0]!.address), 'fd00:99::191');
  const reply = fields(golden.dnsmasqReply)!;
  t.match(reply.fields.iaNa[0]!.addresses[0], { preferred: 7200, valid: 7500 });
  t.ok(reply.fields.clientId!.equals(DHCLIENT_DUID));
  t.equal(describePacket6(reply), 'REPLY fd00:99::191 from llt 02:00:00:00:d6:02 xid 0x77c5eb');
  const kea = fields(golden.keaReply)!;
  t.equal(describeDuid(kea.fields.serverId!), 'll 02:00:00:a0:d6:02');
  t.equal(kea.fields.status, undefined, 'Kea sends no STATUS_CODE on success');
  t.equal(kea.fields.preference, undefined);
  const nb = fields(golden.dnsmasqNoBinding)!;
  t.equal(nb.fields.iaNa[0]!.status?.code, Status6.NoBinding);
  t.same(nb.fields.iaNa[0]!.addresses, []);
  t.equal(fields(golden.dnsmasqConfirmUnknownReply)!.fields.status?.message, 'all addresses still on link');
});

t.test('DUIDs: DUID-LL from a MAC, DUID-UUID, any other type opaque', async (t) => {
  t.equal(duidLl('02:00:00:00:d6:99').toString('hex'), '0003000102000000d699');
  t.equal(duidUuid(Buffer.alloc(16, 0xab)).toString('hex'), `0004${'ab'.repeat(16)}`);
  t.equal(describeDuid(Buffer.from('0002000009bf0102', 'hex')), 'duid-2 000009bf0102');
  const payload = encodeDhcp6({ type: MsgType6.REPLY, xid: 1, options: [{ code: Opt6.CLIENTID, data: Buffer.from('0002000009bf0102', 'hex') }, { code: Opt6.SERVERID, data: Buffer.from('00ff01', 'hex') }] });
  const d = decodeDhcp6(payload);
  t.ok(d.ok && d.value.fields.serverId!.equals(Buffer.from('00ff01', 'hex')), 'an unknown DUID type is kept as bytes');
});

/** A REPLY frame to our client from dnsmasq's addresses, with `options`, complete checksum. */
function replyFrame(options: Dhcp6Option[], xid = 0x77c5eb, type: number = MsgType6.REPLY): Buffer {
  return encodeUdp6Frame({
    srcMac: '02:00:00:00:d6:02', dstMac: '02:00:00:00:d6:01', srcIp: ip6('fe80::ff:fe00:d602'), dstIp: ip6('fe80::ff:fe00:d601'),
    srcPort: 547, dstPort: 546, hopLimit: 64, payload: encodeDhcp6({ type, xid, options }),
  });
}
const good: Dhcp6Option[] = [
  { code: Opt6.CLIENTID, data: DHCLIENT_DUID }, { code: Opt6.SERVERID, data: DNSMASQ_DUID },
  iaNaOption({ iaid: IAID, t1: 0, t2: 0, options: [iaAddrOption({ address: ip6('fd00:99::191'), preferred: 100, valid: 200 }), statusOption(0, 'ok')] }),
];

t.test('decodeReply6: every drop reason', async (t) => {
  const expect: Reply6Expectation = { xid: 0x77c5eb, duid: DHCLIENT_DUID };
  const reason = (b: Uint8Array, info = READY, e = expect): string => { const r = decodeReply6(b, info, e); return r.ok ? 'ok' : r.reason; };
  t.equal(reason(hex(golden.dnsmasqReply), NOT_READY), 'ok', 'a partial checksum is the kernel\'s word');
  t.equal(reason(hex(golden.dnsmasqReply)), 'bad-udp-checksum', 'the partial checksum does not verify');
  t.equal(reason(completed(golden.dnsmasqReply)), 'ok');
  t.equal(reason(completed(golden.keaReply), READY, { xid: 0xcebeba, duid: Buffer.from('0001000132a89e4802000000d601', 'hex') }), 'ok');
  const zero = completed(golden.dnsmasqReply);
  zero.writeUInt16BE(0, UDP_CSUM);
  t.equal(reason(zero), 'bad-udp-checksum', 'a zero checksum is not allowed in IPv6');
  t.equal(reason(completed(golden.dnsmasqReply), READY, { xid: 0x77c5ec, duid: DHCLIENT_DUID }), 'wrong-xid');
  t.equal(reason(completed(golden.dnsmasqReply), READY, { xid: 0x77c5eb, duid: UNBOUND_DUID }), 'wrong-client-id');
  t.equal(reason(replyFrame(good.filter((o) => o.code !== Opt6.CLIENTID))), 'wrong-client-id');
  t.equal(reason(replyFrame(good.filter((o) => o.code !== Opt6.SERVERID))), 'no-server-id');
  t.equal(reason(replyFrame(good, 0x77c5eb, MsgType6.REQUEST)), 'not-reply');
  t.equal(reason(replyFrame(good, 0x77c5eb, MsgType6.RELAY_REPL)), 'not-reply');
  t.equal(reason(completed(golden.dhclientSolicit)), 'not-udp-546');
  t.equal(reason(completed(golden.dnsmasqReply).subarray(0, 50)), 'truncated');
  t.equal(reason(completed(golden.dnsmasqReply).subarray(0, 100)), 'truncated', 'shorter than the payload length says');
  const v4 = completed(golden.dnsmasqReply);
  v4.writeUInt16BE(0x0800, 12);
  t.equal(reason(v4), 'not-ipv6');
  const hbh = completed(golden.dnsmasqReply);
  hbh[14 + 6] = 0; // a hop-by-hop options header
  t.equal(reason(hbh), 'not-udp-546');
  const udpLen = completed(golden.dnsmasqReply);
  udpLen.writeUInt16BE(0xfff, 14 + 40 + 4);
  t.equal(reason(udpLen), 'bad-udp-length');
  const runOver = replyFrame(good);
  runOver.writeUInt16BE(0xff, 14 + 40 + 8 + 4 + 2); // CLIENTID's length past the end
  t.equal(reason(runOver, NOT_READY), 'bad-option');
  t.equal(reason(replyFrame([...good, { code: Opt6.SERVERID, data: DNSMASQ_DUID }])), 'bad-option', 'two SERVERIDs');
  t.equal(reason(replyFrame([...good, { code: Opt6.PREFERENCE, data: Buffer.from([1, 2]) }])), 'bad-option');
  t.equal(reason(replyFrame([...good, { code: Opt6.STATUS_CODE, data: Buffer.from([0]) }])), 'bad-option');
  t.equal(reason(replyFrame([...good.slice(0, 2), { code: Opt6.IA_NA, data: Buffer.alloc(11) }])), 'bad-option', 'IA_NA shorter than its fixed part');
  t.equal(reason(replyFrame([...good.slice(0, 2), iaNaOption({ iaid: 1, t1: 0, t2: 0, options: [{ code: Opt6.IAADDR, data: Buffer.alloc(23) }] })])), 'bad-option');
  t.equal(reason(replyFrame([{ code: Opt6.CLIENTID, data: Buffer.from([0, 3]) }, good[1]!])), 'bad-option', 'a DUID of a type and nothing else');
  t.equal(reason(encodeUdp6Frame({ srcMac: '02:00:00:00:00:01', dstMac: '02:00:00:00:00:02', srcIp: 1n, dstIp: 2n, srcPort: 547, dstPort: 546, payload: Buffer.from([7, 0, 0]) })), 'truncated');
});

t.test('decodeReplyPayload6: the checks of decodeReply6 on a datagram socket\'s payload', async (t) => {
  const payload = (b: Buffer): Buffer => b.subarray(14 + 40 + 8);
  const reason = (b: Uint8Array, e: Reply6Expectation): string => { const r = decodeReplyPayload6(b, e); return r.ok ? `ok ${r.value.fields.kind}` : r.reason; };
  const reply = completed(golden.dnsmasqReply);
  t.equal(reason(payload(reply), { xid: 0x77c5eb, duid: DHCLIENT_DUID }), 'ok REPLY');
  t.equal(reason(payload(reply), { xid: 0x77c5ec, duid: DHCLIENT_DUID }), 'wrong-xid');
  t.equal(reason(payload(reply), { xid: 0x77c5eb, duid: UNBOUND_DUID }), 'wrong-client-id');
  t.equal(reason(payload(replyFrame(good.filter((o) => o.code !== Opt6.SERVERID))), { xid: 0x77c5eb, duid: DHCLIENT_DUID }), 'no-server-id');
  t.equal(reason(payload(replyFrame(good, 0x77c5eb, MsgType6.REQUEST)), { xid: 0x77c5eb, duid: DHCLIENT_DUID }), 'not-reply');
  t.equal(reason(Buffer.from([7, 0]), { xid: 0, duid: DHCLIENT_DUID }), 'truncated');
});

t.test('fuzz: decoders never throw and only return known reasons (bounded, seeded)', async (t) => {
  const rnd = prng(0xd6c6);
  const known = new Set<string>(DROP6_REASONS);
  const seeds = ALL.map(([, g]) => completed(g));
  let bad = 0;
  for (let i = 0; i < 3000; i++) {
    const b = Buffer.from(seeds[i % seeds.length]!);
    const flips = 1 + Math.floor(rnd() * 6);
    for (let k = 0; k < flips; k++) b[Math.floor(rnd() * b.length)] = Math.floor(rnd() * 256);
    const cut = rnd() < 0.3 ? b.subarray(0, Math.floor(rnd() * b.length)) : b;
    try {
      const r = decodeReply6(cut, NOT_READY, { xid: 0x77c5eb, duid: DHCLIENT_DUID });
      if (!r.ok && !known.has(r.reason)) bad++;
      const d = decodeDhcp6(cut.subarray(Math.min(cut.length, 62)));
      if (!d.ok && !known.has(d.reason)) bad++;
    } catch (err) {
      t.fail(`threw on case ${i}: ${String(err)}`);
      return;
    }
  }
  t.equal(bad, 0);
});
