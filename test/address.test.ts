// agent/address.ts: IPv4 as it always read and wrote (dotted quads, u32
// numbers, CIDRs), IPv6 read as RFC 4291 §2.2 allows and written in RFC
// 5952's canonical form, and the family-generic layer over both.
import t from 'tap';
import * as net from 'node:net';
import {
  FAMILIES, addressFromBytes, addressToBytes, broadcastOf, cidrContains, familyBits, familyOf, formatAddress, formatIPv4, formatMac,
  formatNetwork, ipv4Address, ipv4FromBytes, ipv4Number, ipv4ToBytes, isIPv4Mapped, lastAddressOf, mapIPv4, maskOf, networkContains,
  parseAddress, parseCidr, parseIPv4, parseMac, parseNetwork, prefixMask, sameAddress, unmapIPv4, type Address,
} from '../agent/address';
import { prng } from './helpers/random';

const v6 = (text: string): Address => {
  const a = parseAddress(text);
  if (a?.family !== 'IPv6') throw new Error(`not IPv6: ${text}`);
  return a;
};

t.test('IPv4 dotted quads: strict parse, format, bytes', async (t) => {
  t.equal(parseIPv4('10.0.0.1'), 0x0a000001);
  t.equal(parseIPv4('255.255.255.255'), 0xffffffff);
  t.equal(parseIPv4('0.0.0.0'), 0);
  for (const bad of ['256.0.0.1', '01.2.3.4', '1.2.3', '1.2.3.4.5', '1.2.3.4 ', '', 'a.b.c.d', '1.2.3.-4', '::1', '1.2.3.4/32']) {
    t.equal(parseIPv4(bad), undefined, `refused: ${JSON.stringify(bad)}`);
  }
  t.equal(formatIPv4(0xc0000201), '192.0.2.1');
  t.same([...ipv4ToBytes(0xc0000201)], [192, 0, 2, 1]);
  t.equal(ipv4FromBytes(Buffer.from([9, 192, 0, 2, 1]), 1), 0xc0000201);
});

t.test('IPv4 CIDRs: strict host bits, prefix bounds, containment, broadcast', async (t) => {
  t.same(parseCidr('10.99.0.96/28'), { network: 0x0a630060, prefix: 28 });
  t.equal(parseCidr('10.99.0.97/28'), undefined, 'host bits set');
  t.same(parseCidr('10.99.0.97/28', true), { network: 0x0a630060, prefix: 28 }, 'host bits allowed and cleared');
  t.same(parseCidr('0.0.0.0/0'), { network: 0, prefix: 0 });
  t.same(parseCidr('10.0.0.0/08'), { network: 0x0a000000, prefix: 8 }, 'two prefix digits, as always');
  for (const bad of ['10.0.0.0/33', '10.0.0.0/', '10.0.0.0', '10.0.0.0/008', '10.0.0.0/8/8', '10.0.0.0/-1', 'fd00::/8', '1.2.3/8']) {
    t.equal(parseCidr(bad), undefined, `refused: ${bad}`);
  }
  const c = parseCidr('192.0.2.0/24')!;
  t.ok(cidrContains(c, parseIPv4('192.0.2.200')!));
  t.notOk(cidrContains(c, parseIPv4('192.0.3.1')!));
  t.equal(formatIPv4(broadcastOf(c)), '192.0.2.255');
  t.equal(maskOf(0), 0);
  t.equal(maskOf(32), 0xffffffff);
  t.equal(maskOf(20), 0xfffff000);
});

t.test('MAC addresses', async (t) => {
  t.same([...parseMac('02:AB:cd:00:01:ff')!], [2, 0xab, 0xcd, 0, 1, 0xff]);
  t.equal(parseMac('02:ab:cd:00:01'), undefined);
  t.equal(formatMac(Buffer.from([2, 0xab, 0xcd, 0, 1, 0xff, 9])), '02:ab:cd:00:01:ff', 'the first six bytes');
});

t.test('IPv6 text is written in RFC 5952 canonical form', async (t) => {
  const cases: [string, string][] = [
    // §4.1 leading zeros; §4.3 lower case
    ['2001:0db8:0000:0000:0000:0000:0002:0001', '2001:db8::2:1'],
    ['2001:0DB8::00AB', '2001:db8::ab'],
    // §4.2.1 the longest run, as short as it goes
    ['2001:db8:0:0:0:0:2:1', '2001:db8::2:1'],
    ['2001:db8::0:1', '2001:db8::1'],
    // §4.2.2 never one group alone
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'],
    ['1:2:3:4:5:6:7::', '1:2:3:4:5:6:7:0'],
    ['::2:3:4:5:6:7:8', '0:2:3:4:5:6:7:8'],
    // §4.2.3 the longest run; of equal runs the first
    ['2001:0:0:1:0:0:0:1', '2001:0:0:1::1'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'],
    // the edges
    ['0:0:0:0:0:0:0:0', '::'],
    ['0:0:0:0:0:0:0:1', '::1'],
    ['1:0:0:0:0:0:0:0', '1::'],
    ['fe80:0:0:0:0:0:0:1', 'fe80::1'],
    ['ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'],
    ['fd00:99::200', 'fd00:99::200'],
    // §5: an IPv4-mapped address ends in its dotted quad, other embeddings do not
    ['::ffff:192.0.2.1', '::ffff:192.0.2.1'],
    ['::FFFF:c000:0201', '::ffff:192.0.2.1'],
    ['0:0:0:0:0:ffff:0:0', '::ffff:0.0.0.0'],
    ['::192.0.2.1', '::c000:201'],
    ['64:ff9b::192.0.2.1', '64:ff9b::c000:201'],
    ['1:2:3:4:5:6:10.0.0.1', '1:2:3:4:5:6:a00:1'],
  ];
  for (const [text, canonical] of cases) {
    const a = parseAddress(text);
    t.equal(a?.family, 'IPv6', `${text} is IPv6`);
    t.equal(a && formatAddress(a), canonical, `${text} -> ${canonical}`);
    t.equal(a && formatAddress(parseAddress(canonical)!), canonical, `${canonical} is stable`);
  }
});

t.test('malformed IPv6 text is refused', async (t) => {
  const bad = [
    '', ':', ':::', '1:2:3:4:5:6:7', '1:2:3:4:5:6:7:8:9', // too few, too many groups
    '1:2:3:4:5:6:7:8::', '::1:2:3:4:5:6:7:8', '1:2:3:4::5:6:7:8', // "::" must stand for at least one group
    '1::2::3', '::1::', '1:::2', // two "::"
    '12345::', '::10000', 'g::1', '1:2:3:4:5:6:7:-8', '+1::', // groups out of range or not hex
    ':1::2', '1::2:', ':1:2:3:4:5:6:7:8', '1:2:3:4:5:6:7:8:', // a lone colon at an end
    '::1.2.3', '::256.1.1.1', '::01.2.3.4', '1.2.3.4::', '::1.2.3.4:5', '1:2:3:4:5:6:7:1.2.3.4', // bad or misplaced IPv4 tails
    'fe80::1%eth0', 'fe80::1%1', // zone ids (RFC 4007 §11)
    ' ::1', '::1 ', '[::1]', '::1/128',
  ];
  for (const text of bad) {
    t.equal(parseAddress(text), undefined, `refused: ${JSON.stringify(text)}`);
    t.equal(familyOf(text), text === '::1/128' ? 'IPv6' : undefined, `no family: ${JSON.stringify(text)}`);
  }
});

t.test("canonical text agrees with Node's parser and WHATWG's serializer on random addresses", async (t) => {
  const rnd = prng(5952);
  let checked = 0;
  const wrong: string[] = [];
  for (let i = 0; i < 5_000; i++) {
    // Zero groups often, so that runs of every length and position occur.
    let value = 0n;
    for (let g = 0; g < 8; g++) value = (value << 16n) | BigInt(rnd() < 0.5 ? 0 : Math.floor(rnd() * 0x10000));
    const a: Address = { family: 'IPv6', value };
    const text = formatAddress(a);
    const back = parseAddress(text);
    if (!back || !sameAddress(back, a) || !net.isIPv6(text)) wrong.push(`${value.toString(16)} -> ${text}`);
    // WHATWG's host serializer compresses the same way but writes mapped addresses in hex.
    if (!isIPv4Mapped(a) && new URL(`http://[${text}]/`).hostname !== `[${text}]`) wrong.push(`${text} (URL: ${new URL(`http://[${text}]/`).hostname})`);
    // The long spelling, upper case with leading zeros, reads as the same address.
    const long = addressToBytes(a).toString('hex').toUpperCase().match(/.{4}/g)!.join(':');
    const read = parseAddress(long);
    if (!read || !sameAddress(read, a) || !net.isIPv6(long)) wrong.push(`${long} read as ${read && formatAddress(read)}`);
    checked++;
  }
  t.equal(checked, 5_000);
  t.same(wrong, [], '5,000 random addresses');
});

t.test('the family is data: familyOf, widths, bytes, IPv4 as an Address', async (t) => {
  t.same(FAMILIES, ['IPv4', 'IPv6']);
  t.equal(familyBits('IPv4'), 32);
  t.equal(familyBits('IPv6'), 128);
  t.equal(familyOf('10.0.0.1'), 'IPv4');
  t.equal(familyOf('10.0.0.0/8'), 'IPv4');
  t.equal(familyOf('fd00::1'), 'IPv6');
  t.equal(familyOf('fd00:99::/64'), 'IPv6');
  t.equal(familyOf('::ffff:10.0.0.1'), 'IPv6', 'by syntax: mapped text is IPv6');
  t.equal(familyOf('10.0.0.1.2'), undefined);
  t.equal(familyOf('web'), undefined);

  const four = parseAddress('192.0.2.1')!;
  t.same(four, { family: 'IPv4', value: 0xc0000201n });
  t.same(four, ipv4Address(parseIPv4('192.0.2.1')!));
  t.equal(ipv4Number(four), 0xc0000201);
  t.equal(ipv4Number(v6('::1')), undefined);
  t.same(addressToBytes(four), ipv4ToBytes(0xc0000201));
  t.same(addressFromBytes('IPv4', Buffer.from([0, 192, 0, 2, 1]), 1), four);

  const six = v6('2001:db8::1:2');
  const bytes = addressToBytes(six);
  t.equal(bytes.length, 16);
  t.same([...bytes], [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2]);
  t.same(addressFromBytes('IPv6', Buffer.concat([Buffer.from([7]), bytes]), 1), six);
  t.throws(() => addressFromBytes('IPv6', bytes, 1), RangeError, 'too few bytes');
  t.notOk(sameAddress(v6('::ffff:192.0.2.1'), four), 'a mapped address is not its IPv4 address');
});

t.test('IPv4-mapped addresses map and unmap', async (t) => {
  const four = parseAddress('192.0.2.1')!;
  const mapped = v6('::ffff:192.0.2.1');
  t.ok(isIPv4Mapped(mapped));
  t.notOk(isIPv4Mapped(v6('::192.0.2.1')), 'IPv4-compatible is not mapped');
  t.notOk(isIPv4Mapped(four));
  t.same(unmapIPv4(mapped), four);
  t.same(unmapIPv4(v6('2001:db8::1')), v6('2001:db8::1'), 'other addresses unchanged');
  t.same(mapIPv4(four), mapped);
  t.same(mapIPv4(mapped), mapped);
});

t.test('networks of both families: parse, format, contain, last address', async (t) => {
  const pool = parseNetwork('fd00:99::200/120')!;
  t.same(pool, { family: 'IPv6', network: v6('fd00:99::200').value, prefix: 120 });
  t.equal(formatNetwork(pool), 'fd00:99::200/120');
  t.equal(formatAddress(lastAddressOf(pool)), 'fd00:99::2ff');
  t.ok(networkContains(pool, v6('fd00:99::2aa')));
  t.notOk(networkContains(pool, v6('fd00:99::300')));
  t.notOk(networkContains(parseNetwork('::/0')!, parseAddress('10.0.0.1')!), 'never across families');
  t.ok(networkContains(parseNetwork('::/0')!, v6('ffff::1')));
  t.equal(parseNetwork('fd00:99::201/120'), undefined, 'host bits set');
  t.equal(formatNetwork(parseNetwork('FD00:99::201/120', true)!), 'fd00:99::200/120', 'host bits cleared when allowed');
  t.same(parseNetwork('2001:db8::/128', false)?.prefix, 128);
  for (const bad of ['fd00::/129', 'fd00::/', 'fd00::', 'fd00::/1280', 'fd00::/-1', 'fe80::%eth0/64', 'fd00::/64/1']) {
    t.equal(parseNetwork(bad), undefined, `refused: ${bad}`);
  }
  t.equal(prefixMask('IPv6', 0), 0n);
  t.equal(prefixMask('IPv6', 128), (1n << 128n) - 1n);
  t.equal(prefixMask('IPv6', 64), ((1n << 64n) - 1n) << 64n);

  const v4 = parseNetwork('192.0.2.0/24')!;
  t.same(v4, { family: 'IPv4', network: 0xc0000200n, prefix: 24 });
  t.equal(formatAddress(lastAddressOf(v4)), formatIPv4(broadcastOf(parseCidr('192.0.2.0/24')!)), "IPv4's last address is its broadcast");
  t.equal(prefixMask('IPv4', 20), BigInt(maskOf(20)));
});
