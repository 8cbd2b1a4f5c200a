// agent/net/conntrack/conntrack.ts, the pure parts: the ctnetlink messages byte for
// byte (linux/netfilter/nfnetlink_conntrack.h), the decoding of dump entries
// (nested flags, extra attributes, truncation, IPv6), and which entries a
// sweep ends. The kernel's side is test/privileged/forward-kernel.test.ts
// (a flow moved off a backend that left, through real conntrack).
import t from 'tap';
import { CT_DELETE, CT_GET, IPPROTO_TCP, IPPROTO_UDP, decodeEntry, encodeDelete, encodeDump, readEntries, readUdpEntries, staleUdpFlows, untranslatedDumps, untranslatedFlows, type CtEntry } from '../../../agent/net/conntrack/conntrack';

const CT_NEW = 0x100;
const entry = (o: Partial<CtEntry['orig']> = {}, r: Partial<CtEntry['reply']> = {}): CtEntry => ({
  orig: { src: '10.99.0.2', dst: '10.99.0.50', proto: IPPROTO_UDP, sport: 40000, dport: 53, ...o },
  reply: { src: '10.99.0.11', dst: '10.99.0.10', proto: IPPROTO_UDP, sport: 5353, dport: 40000, ...r },
});

t.test('message types: subsystem CTNETLINK (1) in the high byte', async (t) => {
  t.equal(CT_GET, 0x0101);
  t.equal(CT_DELETE, 0x0102);
});

t.test('a dump asks for the IPv4 table: nfgenmsg AF_INET, version 0, res_id 0', async (t) => {
  t.same([...encodeDump()], [2, 0, 0, 0]);
});

t.test('a filtered dump asks the kernel (CTA_FILTER, Linux 5.9) for one VIP:port\'s UDP entries only, byte for byte', async (t) => {
  t.equal(encodeDump({ dst: '10.99.0.50', dport: 53 }).toString('hex'), [
    '02000000',
    '2400', '0180', // CTA_TUPLE_ORIG, nested
    '0c00', '0180', '0800', '0200', '0a630032', // CTA_TUPLE_IP { CTA_IP_V4_DST 10.99.0.50 }
    '1400', '0280', '0500', '0100', '11000000', '0600', '0300', '00350000', // CTA_TUPLE_PROTO { NUM 17, DST_PORT 53 }
    '1400', '1980', // CTA_FILTER (25), nested
    '0800', '0100', '2a000000', // ORIG_FLAGS: IP_DST | PROTO_NUM | PROTO_DST_PORT (host order)
    '0800', '0200', '00000000', // REPLY_FLAGS: none
  ].join(''));
  t.throws(() => encodeDump({ dst: 'x', dport: 53 }), { code: 'LB_ERR_NET_CONNTRACK' });
});

t.test('an untranslated dump also asks that the reply come from the VIP itself (no DNAT), byte for byte', async (t) => {
  t.equal(encodeDump({ dst: '10.99.0.200', dport: 80, proto: IPPROTO_TCP, untranslated: true }).toString('hex'), [
    '02000000',
    '2400', '0180', // CTA_TUPLE_ORIG, nested
    '0c00', '0180', '0800', '0200', '0a6300c8', // CTA_TUPLE_IP { CTA_IP_V4_DST 10.99.0.200 }
    '1400', '0280', '0500', '0100', '06000000', '0600', '0300', '00500000', // CTA_TUPLE_PROTO { NUM 6, DST_PORT 80 }
    '1000', '0280', // CTA_TUPLE_REPLY, nested
    '0c00', '0180', '0800', '0100', '0a6300c8', // CTA_TUPLE_IP { CTA_IP_V4_SRC 10.99.0.200 }
    '1400', '1980', // CTA_FILTER
    '0800', '0100', '2a000000', // ORIG_FLAGS: IP_DST | PROTO_NUM | PROTO_DST_PORT
    '0800', '0200', '01000000', // REPLY_FLAGS: IP_SRC
  ].join(''));
});

t.test('untranslated flows: to a forwarded VIP port, answered from the VIP itself', async (t) => {
  const vip = '10.99.0.200';
  const tcp = (o: Partial<CtEntry['orig']> = {}, r: Partial<CtEntry['reply']> = {}): CtEntry => entry(
    { src: '10.99.0.50', dst: vip, proto: IPPROTO_TCP, sport: 47311, dport: 80, ...o },
    { src: vip, dst: '10.99.0.50', proto: IPPROTO_TCP, sport: 80, dport: 47311, ...r },
  );
  const ports = [{ vip, proto: IPPROTO_TCP, port: 80 }, { vip, proto: IPPROTO_UDP, port: 53 }];
  const forwarded = tcp();
  const translated = tcp({ sport: 47312 }, { src: '10.99.0.11', dst: vip, sport: 8080, dport: 47312 });
  const otherPort = tcp({ dport: 22 }, { sport: 22 }); // not a forwarded port (ssh to the VIP): left alone
  const otherVip = tcp({ dst: '10.99.0.201' }, { src: '10.99.0.201' });
  const udp = entry({ src: '10.99.0.50', dst: vip, dport: 53 }, { src: vip, sport: 53, dst: '10.99.0.50' });
  const udpOnTcpPort = entry({ src: '10.99.0.50', dst: vip, dport: 80 }, { src: vip, sport: 80, dst: '10.99.0.50' });
  t.same(untranslatedFlows([forwarded, translated, otherPort, otherVip, udp, udpOnTcpPort], ports), [forwarded, udp],
    'the TCP and the UDP flow seen without DNAT; not a translated one, another port, another VIP, or another protocol on the port');
  t.same(untranslatedFlows([forwarded], []), [], 'no port, nothing');
});

t.test('untranslated dumps: one per protocol and port; a port of one VIP filtered to its untranslated entries, a shared port to the port', async (t) => {
  t.same(untranslatedDumps([
    { vip: '10.99.0.200', proto: IPPROTO_TCP, port: 80 },
    { vip: '10.99.0.201', proto: IPPROTO_TCP, port: 80 },
    { vip: '10.99.0.200', proto: IPPROTO_UDP, port: 53 },
    { vip: '10.99.0.200', proto: IPPROTO_TCP, port: 80 },
  ]), [
    { dport: 80, proto: IPPROTO_TCP, family: 'IPv4' },
    { dst: '10.99.0.200', dport: 53, proto: IPPROTO_UDP, untranslated: true },
  ]);
  t.equal(encodeDump({ dport: 80, proto: IPPROTO_TCP }).toString('hex'), [
    '02000000',
    '1800', '0180', // CTA_TUPLE_ORIG: no CTA_TUPLE_IP
    '1400', '0280', '0500', '0100', '06000000', '0600', '0300', '00500000', // CTA_TUPLE_PROTO { NUM 6, DST_PORT 80 }
    '1400', '1980',
    '0800', '0100', '28000000', // ORIG_FLAGS: PROTO_NUM | PROTO_DST_PORT
    '0800', '0200', '00000000',
  ].join(''), 'no address: the port on every address, byte for byte');
});

t.test('reading entries with several filters: one dump each, every entry once', async (t) => {
  const asked: string[] = [];
  const filters = [{ dst: '10.99.0.200', dport: 80, proto: IPPROTO_TCP, untranslated: true }, { dst: '10.99.0.200', dport: 53, untranslated: true }];
  const e1 = entry({ dst: '10.99.0.200', proto: IPPROTO_TCP, dport: 80 });
  const r = await readEntries(async (p) => { asked.push(p.toString('hex')); return [e1]; }, filters);
  t.same(asked, filters.map((f) => encodeDump(f).toString('hex')));
  t.same(r.entries, [e1], 'the same entry from two dumps once');
});

t.test('a delete names the entry by its original tuple, byte for byte', async (t) => {
  const hex = encodeDelete(entry()).toString('hex');
  t.equal(hex, [
    '02000000', // nfgenmsg
    '3400', '0180', // CTA_TUPLE_ORIG, nested, 52 bytes
    '1400', '0180', // CTA_TUPLE_IP, nested, 20
    '0800', '0100', '0a630002', // CTA_IP_V4_SRC 10.99.0.2
    '0800', '0200', '0a630032', // CTA_IP_V4_DST 10.99.0.50
    '1c00', '0280', // CTA_TUPLE_PROTO, nested, 28
    '0500', '0100', '11000000', // CTA_PROTO_NUM 17, padded
    '0600', '0200', '9c400000', // CTA_PROTO_SRC_PORT 40000 (big-endian), padded
    '0600', '0300', '00350000', // CTA_PROTO_DST_PORT 53
  ].join(''));
  const zoned = encodeDelete({ ...entry(), zone: 7 });
  t.equal(zoned.subarray(-8).toString('hex'), '0600120000070000', 'CTA_ZONE (18) when the entry is not in the default zone');
  t.throws(() => encodeDelete(entry({ src: 'fe80::1' })), { code: 'LB_ERR_NET_CONNTRACK' });
});

/** A dump entry as the kernel sends it: both tuples, then attributes the decoder skips. */
function dumpEntry(e: CtEntry, family = 2): Buffer {
  const reply = encodeDelete({ orig: e.reply, reply: e.orig }).subarray(4);
  reply.writeUInt16LE(0x8002, 2); // CTA_TUPLE_REPLY, nested
  const status = Buffer.from('0800030000000188', 'hex'); // CTA_STATUS
  const timeout = Buffer.from('080007000000001e', 'hex'); // CTA_TIMEOUT
  const m = Buffer.concat([encodeDelete(e), reply, status, timeout]);
  m[0] = family;
  return m;
}

t.test('a dump entry decodes to both tuples; other attributes are skipped', async (t) => {
  t.same(decodeEntry(CT_NEW, dumpEntry(entry())), entry());
  t.equal(decodeEntry(CT_NEW, dumpEntry(entry(), 10)), undefined, 'IPv4 attributes under AF_INET6 are no entry');
  t.equal(decodeEntry(0x0103, dumpEntry(entry())), undefined, 'another message type');
  t.equal(decodeEntry(CT_NEW, Buffer.from([2, 0])), undefined, 'shorter than nfgenmsg');
});

t.test('a malformed entry decodes to nothing and never throws', async (t) => {
  const good = dumpEntry(entry());
  for (let cut = 0; cut < good.length; cut++) {
    const d = decodeEntry(CT_NEW, good.subarray(0, cut));
    // Cut inside the reply tuple or earlier, an entry cannot be whole.
    if (cut < 4 + 52 + 52) t.equal(d, undefined, `cut at ${cut}`);
  }
  let seed = 1;
  const rand = (): number => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed; };
  for (let i = 0; i < 2000; i++) {
    const b = Buffer.from(good);
    for (let k = 0; k < 4; k++) b[4 + (rand() % (b.length - 4))] = rand() & 0xff;
    decodeEntry(CT_NEW, b);
  }
  t.pass('2,000 corrupted entries decoded without a throw');
});

t.test('a sweep ends the UDP flows of its VIP:port answered by anything outside the allowed backends', async (t) => {
  const rules = [{ vip: '10.99.0.50', port: 53, allowed: new Set(['10.99.0.12:5353']) }, { vip: '10.99.0.60', port: 514, allowed: new Set<string>() }];
  const gone = entry();
  const kept = entry({ sport: 40001 }, { src: '10.99.0.12', dport: 40001 });
  const oldPort = entry({ sport: 40002 }, { src: '10.99.0.12', sport: 5354, dport: 40002 });
  const otherVip = entry({ dst: '10.99.0.70' });
  const otherPort = entry({ dport: 54 });
  const tcp = entry({ proto: 6 }, { proto: 6 });
  const untranslated = entry({ sport: 40003 }, { src: '10.99.0.50', sport: 53, dport: 40003 });
  const removedPort = entry({ dst: '10.99.0.60', dport: 514 }, { src: '10.99.0.12', sport: 514 });
  t.same(staleUdpFlows([gone, kept, oldPort, otherVip, otherPort, tcp, untranslated, removedPort], rules), [gone, oldPort, untranslated, removedPort],
    'the backend that left, the old targetPort, a flow seen without DNAT, the port that went; not the backend kept, other VIPs, ports or TCP');
  t.same(staleUdpFlows([gone], []), [], 'no rule, nothing ended');
});

t.test('reading the entries: one filtered dump per VIP:port, the whole table once when the kernel refuses the filter', async (t) => {
  const rules = [
    { vip: '10.99.0.50', port: 53, allowed: new Set(['10.99.0.11:5353']) },
    { vip: '10.99.0.51', port: 123, allowed: new Set(['10.99.0.12:123']) },
  ];
  const table = [
    entry(),
    entry({ dst: '10.99.0.51', dport: 123 }, { src: '10.99.0.13', sport: 123 }),
    entry({ proto: 6, dport: 80 }), // TCP: never a UDP sweep's
  ];
  const UNFILTERED = encodeDump().toString('hex');
  // A kernel with CTA_FILTER (5.9+): each dump answers with its VIP:port's UDP entries.
  const asked: string[] = [];
  const filtering = async (p: Buffer): Promise<CtEntry[]> => {
    asked.push(p.toString('hex'));
    if (p.toString('hex') === UNFILTERED) return table;
    return table.filter((e) => e.orig.proto === IPPROTO_UDP && p.toString('hex') === encodeDump({ dst: e.orig.dst, dport: e.orig.dport }).toString('hex'));
  };
  let r = await readUdpEntries(filtering, rules);
  t.ok(r.filtered);
  t.same(asked, rules.map((x) => encodeDump({ dst: x.vip, dport: x.port }).toString('hex')), 'one filtered dump per rule, no whole-table dump');
  t.same(r.entries, table.slice(0, 2));

  // A kernel that refuses CTA_FILTER (EINVAL / EOPNOTSUPP): the whole table, once; the sweep still finds its entries.
  asked.length = 0;
  const refusing = async (p: Buffer): Promise<CtEntry[]> => {
    asked.push(p.toString('hex'));
    if (p.toString('hex') !== UNFILTERED) throw new Error('Request rejected: EINVAL');
    return table;
  };
  r = await readUdpEntries(refusing, rules);
  t.notOk(r.filtered, 'fell back to the unfiltered dump');
  t.equal(asked.filter((h) => h === UNFILTERED).length, 1, 'the whole table once');
  t.same(r.entries, table);
  t.same(staleUdpFlows(r.entries, rules), [table[1]], 'and the stale flow is found in it');

  // A kernel that ignores CTA_FILTER answers each filtered dump with the whole table: every entry once.
  r = await readUdpEntries(async () => table, rules);
  t.ok(r.filtered);
  t.equal(r.entries.length, table.length, 'no entry twice, so none is deleted twice');
  t.same(staleUdpFlows(r.entries, rules), [table[1]]);
  // The same tuple in another zone is another entry.
  r = await readUdpEntries(async () => [entry(), { ...entry(), zone: 7 }], rules);
  t.equal(r.entries.length, 2);

  // Nothing answers: the sweep's error names the dump.
  await t.rejects(readUdpEntries(async () => { throw new Error('Request rejected: EPERM'); }, rules), { code: 'LB_ERR_NET_CONNTRACK', message: /cannot read the conntrack table \(ctnetlink dump\): .*EPERM/ });
});

const entry6 = (o: Partial<CtEntry['orig']> = {}, r: Partial<CtEntry['reply']> = {}): CtEntry => entry(
  { src: 'fd00:99::2', dst: 'fd00:99::50', ...o },
  { src: 'fd00:99::11', dst: 'fd00:99::10', ...r },
);

t.test('IPv6: a filtered dump asks the AF_INET6 table for the port (the VIP is matched here), byte for byte', async (t) => {
  const port = [
    '0a000000', // nfgenmsg AF_INET6
    '1800', '0180', // CTA_TUPLE_ORIG, nested
    '1400', '0280', '0500', '0100', '11000000', '0600', '0300', '00350000', // CTA_TUPLE_PROTO { NUM 17, DST_PORT 53 }
    '1400', '1980', '0800', '0100', '28000000', '0800', '0200', '00000000', // CTA_FILTER: PROTO_NUM | PROTO_DST_PORT
  ].join('');
  t.equal(encodeDump({ dst: 'fd00:99::50', dport: 53 }).toString('hex'), port, 'an IPv6 VIP: no address in the filter (the kernel matched none with one)');
  t.equal(encodeDump({ dport: 53, family: 'IPv6' }).toString('hex'), port, 'a port of several IPv6 VIPs: the same');
  t.same([...encodeDump(undefined, 'IPv6')], [10, 0, 0, 0], 'the whole IPv6 table');
  t.equal(encodeDump({ dst: 'fd00:99::50', dport: 53, untranslated: true }).toString('hex'), port, 'untranslated: matched here too');
});

t.test('IPv6: a delete names the entry with CTA_IP_V6_SRC and _DST; an entry decodes to canonical text', async (t) => {
  const hex = encodeDelete(entry6()).toString('hex');
  t.equal(hex.slice(0, 8), '0a000000', 'nfgenmsg AF_INET6');
  t.match(hex, '2c000180' + '14000300' + 'fd000099000000000000000000000002' + '14000400' + 'fd000099000000000000000000000050', 'CTA_TUPLE_IP { V6_SRC, V6_DST }');
  t.same(decodeEntry(CT_NEW, dumpEntry(entry6(), 10)), entry6(), 'round trip');
  t.equal(decodeEntry(CT_NEW, dumpEntry(entry6(), 2)), undefined, 'IPv6 attributes under AF_INET are no entry');
  t.same(decodeEntry(CT_NEW, dumpEntry(entry6({ src: 'fd00:99:0:0:0:0:0:2' }), 10))?.orig.src, 'fd00:99::2', 'addresses come back in RFC 5952 form');
  t.throws(() => encodeDelete(entry6({ dst: '10.99.0.50' })), /two families/);
  const good = dumpEntry(entry6(), 10);
  for (let cut = 0; cut < good.length; cut += 7) decodeEntry(CT_NEW, good.subarray(0, cut));
  t.pass('truncated IPv6 entries decode without a throw');
});

t.test('IPv6: a sweep ends the flows of an IPv6 VIP:port off its backends, however the rule writes the addresses', async (t) => {
  const rules = [{ vip: 'fd00:99:0::50', port: 53, allowed: new Set(['fd00:99:0:0::12:5353']) }];
  const gone = entry6();
  const kept = entry6({ sport: 40001 }, { src: 'fd00:99::12', dport: 40001 });
  const v4 = entry();
  t.same(staleUdpFlows([gone, kept, v4], rules), [gone], 'the backend that left; not the one kept, nor an IPv4 flow');
  t.same(untranslatedDumps([{ vip: '10.99.0.50', proto: IPPROTO_UDP, port: 53 }, { vip: '10.99.0.51', proto: IPPROTO_UDP, port: 53 }, { vip: 'fd00:99::50', proto: IPPROTO_UDP, port: 53 }, { vip: 'fd00:99::51', proto: IPPROTO_UDP, port: 53 }]),
    [{ dport: 53, proto: IPPROTO_UDP, family: 'IPv4' }, { dport: 53, proto: IPPROTO_UDP, family: 'IPv6' }], 'a port both families share: one dump per family');
  const seen: number[] = [];
  const r = await readEntries(async (payload) => { seen.push(payload[0]!); if (payload.length > 4) throw new Error('EINVAL'); return payload[0] === 10 ? [gone] : [v4]; },
    [{ dst: '10.99.0.50', dport: 53 }, { dst: 'fd00:99::50', dport: 53 }]);
  t.same(seen, [2, 2, 10], 'a kernel refusing the filter (the first filtered dump fails): each family\'s whole table once');
  t.same(r.entries, [v4, gone]);
});
