// The PROXY protocol header codec, byte for byte against HAProxy's
// doc/proxy-protocol.txt (2020/03/05): the expected bytes below are written
// out field by field from the spec's text, not produced by the code under test.
import t from 'tap';
import {
  PROXY_V1_MAX_LENGTH, PROXY_V2_IPV4_LENGTH, PROXY_V2_IPV6_LENGTH, PROXY_V2_SIGNATURE, healthCheckHeader, proxyHeader, proxyHeaderV1, proxyHeaderV2,
  proxyHeaderV2Local, proxyHeaderV2Template6, writeV2Into, writeV2Source6,
} from '../../agent/forward/proxy-protocol';

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

t.test('v1: the spec\'s example line (2.1)', async (t) => {
  t.equal(
    proxyHeaderV1({ source: '192.168.0.1', sourcePort: 56324, destination: '192.168.0.11', destinationPort: 443 }),
    'PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n',
  );
  const longest = proxyHeaderV1({ source: '255.255.255.255', sourcePort: 65535, destination: '255.255.255.255', destinationPort: 65535 });
  t.equal(longest.length, 56, '"the maximum line length ... TCP/IPv4 ... 56 chars"');
  t.same(proxyHeader('v1', { source: '10.0.0.1', sourcePort: 1, destination: '10.0.0.2', destinationPort: 0 }), Buffer.from('PROXY TCP4 10.0.0.1 10.0.0.2 1 0\r\n', 'latin1'), 'port 0 is a port; no leading zeros');
});

t.test('v2: TCP over IPv4, the 16-byte header and 12 address bytes (2.2)', async (t) => {
  // sig(12) ver_cmd=0x21 (version 2, PROXY) fam=0x11 (AF_INET, STREAM) len=0x000c
  // src 172.19.0.1, dst 172.19.0.3, sport 42578 (0xa652), dport 80 (0x0050), all network order.
  const expected = hex('0d0a0d0a000d0a515549540a 21 11 000c ac130001 ac130003 a652 0050');
  const got = proxyHeaderV2({ source: '172.19.0.1', sourcePort: 42578, destination: '172.19.0.3', destinationPort: 80 });
  t.same(got, expected);
  t.equal(got.length, PROXY_V2_IPV4_LENGTH);
  t.equal(PROXY_V2_IPV4_LENGTH, 28);
  t.same(proxyHeader('v2', { source: '172.19.0.1', sourcePort: 42578, destination: '172.19.0.3', destinationPort: 80 }), expected);
  t.equal(PROXY_V2_SIGNATURE[4], 0x00, 'the signature holds a NUL at its 5th byte');
});

t.test('v2: UDP over IPv4 is 0x12', async (t) => {
  const got = proxyHeaderV2({ source: '10.99.0.2', sourcePort: 5353, destination: '10.99.0.50', destinationPort: 53 }, 'udp');
  t.same(got, hex('0d0a0d0a000d0a515549540a 21 12 000c 0a630002 0a630032 14e9 0035'));
});

t.test('v2 LOCAL for health checks: no addresses, AF_UNSPEC (2.2)', async (t) => {
  t.same(proxyHeaderV2Local(), hex('0d0a0d0a000d0a515549540a 20 00 0000'));
  t.same(healthCheckHeader('v2', { source: '10.0.0.1', sourcePort: 1, destination: '10.0.0.2', destinationPort: 2 }), proxyHeaderV2Local());
  t.same(
    healthCheckHeader('v1', { source: '10.0.0.1', sourcePort: 40000, destination: '10.0.0.2', destinationPort: 8080 }),
    Buffer.from('PROXY TCP4 10.0.0.1 10.0.0.2 40000 8080\r\n', 'latin1'),
    'v1 checks send a valid line with the probe\'s own endpoints ("not UNKNOWN")',
  );
});

t.test('writeV2Into fills a buffer at an offset from numbers (the proxy\'s hot path)', async (t) => {
  const b = Buffer.alloc(4 + PROXY_V2_IPV4_LENGTH, 0xee);
  writeV2Into(b, 4, 0xac130001, 42578, 0xac130003, 80, 'tcp');
  t.same(b.subarray(0, 4), Buffer.alloc(4, 0xee), 'nothing before the offset touched');
  t.same(b.subarray(4), proxyHeaderV2({ source: '172.19.0.1', sourcePort: 42578, destination: '172.19.0.3', destinationPort: 80 }));
});

t.test('v1: TCP6 with IPv6 addresses in canonical form (2.1)', async (t) => {
  t.equal(
    proxyHeaderV1({ source: '2001:db8::1', sourcePort: 56324, destination: 'fd00:99::200', destinationPort: 443 }),
    'PROXY TCP6 2001:db8::1 fd00:99::200 56324 443\r\n',
  );
  t.equal(
    proxyHeaderV1({ source: '2001:DB8:0:0:0:0:0:0001', sourcePort: 1, destination: 'FD00:0099::0200', destinationPort: 2 }),
    'PROXY TCP6 2001:db8::1 fd00:99::200 1 2\r\n',
    'leading zeros and upper case rendered canonically (RFC 5952)',
  );
  const longest = proxyHeaderV1({ source: 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', sourcePort: 65535, destination: 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', destinationPort: 65535 });
  t.equal(longest.length, 104, '"TCP/IPv6 ... 104 chars"');
  t.ok(longest.length <= PROXY_V1_MAX_LENGTH);
  t.same(
    healthCheckHeader('v1', { source: 'fd00:99::1', sourcePort: 40000, destination: 'fd00:99::11', destinationPort: 8080 }),
    Buffer.from('PROXY TCP6 fd00:99::1 fd00:99::11 40000 8080\r\n', 'latin1'),
  );
});

t.test('v2: TCP over IPv6 is 0x21 with 36 address bytes; UDP 0x22 (2.2)', async (t) => {
  // sig(12) ver_cmd=0x21 fam=0x21 (AF_INET6, STREAM) len=0x0024 (36)
  // src 2001:db8::1, dst fd00:99::200 (16 bytes each), sport 42578 (0xa652), dport 80.
  const src = '20010db8000000000000000000000001';
  const dst = 'fd000099000000000000000000000200';
  const expected = hex(`0d0a0d0a000d0a515549540a 21 21 0024 ${src} ${dst} a652 0050`);
  const c = { source: '2001:db8::1', sourcePort: 42578, destination: 'fd00:99::200', destinationPort: 80 };
  t.same(proxyHeaderV2(c), expected);
  t.same(proxyHeader('v2', c), expected);
  t.equal(PROXY_V2_IPV6_LENGTH, 52);
  t.same(proxyHeaderV2(c, 'udp'), hex(`0d0a0d0a000d0a515549540a 21 22 0024 ${src} ${dst} a652 0050`));
  // The proxy's per-route template, then the client filled in at an offset.
  const b = Buffer.alloc(3 + PROXY_V2_IPV6_LENGTH, 0xee);
  proxyHeaderV2Template6(hex(dst), 80, 'tcp').copy(b, 3);
  writeV2Source6(b, 3, hex(src), 42578);
  t.same(b.subarray(0, 3), Buffer.alloc(3, 0xee), 'nothing before the offset touched');
  t.same(b.subarray(3), expected);
  t.throws(() => proxyHeaderV2Template6(hex('0a000001'), 80, 'tcp'), /16 bytes, not 4/);
});

t.test('one family per header; an IPv4-mapped IPv6 address is unwrapped; bad input throws', async (t) => {
  t.equal(proxyHeaderV1({ source: '::ffff:10.1.2.3', sourcePort: 9, destination: '10.0.0.1', destinationPort: 80 }), 'PROXY TCP4 10.1.2.3 10.0.0.1 9 80\r\n');
  t.throws(() => proxyHeaderV1({ source: '2001:db8::1', sourcePort: 9, destination: '10.0.0.1', destinationPort: 80 }), /source 2001:db8::1 is IPv6 and destination 10.0.0.1 is IPv4/);
  t.throws(() => proxyHeaderV2({ source: '10.0.0.1', sourcePort: 9, destination: 'fd00::1', destinationPort: 80 }), /a header carries one family/);
  t.throws(() => proxyHeaderV2({ source: '10.0.0.1', sourcePort: 70000, destination: '10.0.0.1', destinationPort: 80 }), /source port 70000 is not a port/);
  t.throws(() => proxyHeaderV1({ source: '010.0.0.1', sourcePort: 9, destination: '10.0.0.1', destinationPort: 80 }), /"010.0.0.1" is not an IPv4 or IPv6 address/, 'leading zeros are refused, never passed on');
  t.throws(() => proxyHeaderV1({ source: 'fe80::1%eth0', sourcePort: 9, destination: 'fe80::2', destinationPort: 80 }), /not an IPv4 or IPv6 address/, 'a zone is refused');
});
