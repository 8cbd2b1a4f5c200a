// The PROXY protocol header codec, byte for byte against HAProxy's
// doc/proxy-protocol.txt (2020/03/05): the expected bytes below are written
// out field by field from the spec's text, not produced by the code under test.
import t from 'tap';
import {
  PROXY_V2_IPV4_LENGTH, PROXY_V2_SIGNATURE, healthCheckHeader, proxyHeader, proxyHeaderV1, proxyHeaderV2, proxyHeaderV2Local, writeV2Into,
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

t.test('IPv4 only; an IPv4-mapped IPv6 address is unwrapped; bad input throws', async (t) => {
  t.equal(proxyHeaderV1({ source: '::ffff:10.1.2.3', sourcePort: 9, destination: '10.0.0.1', destinationPort: 80 }), 'PROXY TCP4 10.1.2.3 10.0.0.1 9 80\r\n');
  t.throws(() => proxyHeaderV1({ source: '2001:db8::1', sourcePort: 9, destination: '10.0.0.1', destinationPort: 80 }), /source "2001:db8::1" is not an IPv4 address/);
  t.throws(() => proxyHeaderV2({ source: '10.0.0.1', sourcePort: 70000, destination: '10.0.0.1', destinationPort: 80 }), /source port 70000 is not a port/);
  t.throws(() => proxyHeaderV1({ source: '010.0.0.1', sourcePort: 9, destination: '10.0.0.1', destinationPort: 80 }), /not an IPv4 address/, 'leading zeros are refused, never passed on');
});
