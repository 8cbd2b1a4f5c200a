// The nftables batch codec (agent/net/netlink/nft-batch.ts) against the
// datagrams nft 1.0.6 sent for the same deltas on this kernel (x86_64,
// little-endian), captured with `strace -xx -e trace=sendmsg -e write=3
// nft -f golden/nft-batch-*.nft`: chains added, flushed and deleted,
// `numgen ... vmap` and `jhash ... vmap` rules with their anonymous maps, a counted DNAT rule
// (IPv4 and IPv6), a `goto` rule, dispatch elements added (jump, goto,
// drop) and deleted, named counters added, redefined and deleted, and
// byte-counter map elements and addresses of a set added and deleted,
// slot maps added and deleted, their elements, the rules that DNAT by
// them and a DNAT rule with no counter. nft
// numbers from 0 without acknowledgements and gives
// named sets its cache's ids; the codec is told the same.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t from 'tap';
import { encodeBatch, parseAcks, type NftOp } from '../../../agent/net/netlink/nft-batch';

const golden = (name: string): Buffer => Buffer.from(fs.readFileSync(path.join(__dirname, '../../../../test/net/netlink/golden', name), 'utf8').replace(/\s+/g, ''), 'hex');

t.test('an IPv4 delta is the datagram nft sent, byte for byte', async (t) => {
  const ops: NftOp[] = [
    { op: 'add-chain', family: 'ip', chain: 's0p0b10_0_0_12' },
    { op: 'flush-chain', family: 'ip', chain: 's0p0' },
    { op: 'delete-elements', family: 'ip', set: 'services', elements: [{ vip: '10.0.0.102', proto: 'tcp', port: 443 }] },
    { op: 'add-rule', family: 'ip', chain: 's0p0', rule: { kind: 'numgen', targets: ['s0p0b10_0_0_11', 's0p0b10_0_0_12'] } },
    { op: 'add-rule', family: 'ip', chain: 's0p0b10_0_0_12', rule: { kind: 'dnat', counter: 's0p0b10_0_0_12_conns', proto: 'tcp', address: '10.0.0.12', port: 8080 } },
    { op: 'add-elements', family: 'ip', set: 'services', setId: 1, elements: [{ vip: '10.0.0.100', proto: 'tcp', port: 80, verdict: { kind: 'jump', chain: 's0p0' } }] },
    { op: 'add-elements', family: 'ip', set: 'refused', setId: 2, elements: [{ vip: '10.0.0.101', proto: 'udp', port: 53, verdict: { kind: 'goto', chain: 'refuse_tcp' } }] },
    { op: 'delete-chain', family: 'ip', chain: 'gone' },
  ];
  const b = encodeBatch('lb_agent', ops, { seq: 0, ack: false, firstSetId: 3 });
  const want = golden('nft-batch-delta.hex');
  t.equal(b.datagram.length, want.length, 'length');
  t.ok(b.datagram.equals(want), 'bytes');
  t.same(b.seqs, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 'the sequence numbers of the messages between begin (0) and end (11): the numgen rule is three');
});

t.test('an IPv6 delta is the datagram nft sent, byte for byte', async (t) => {
  const ops: NftOp[] = [
    { op: 'add-chain', family: 'ip6', chain: 'v6s0p0b2001_db8__11' },
    { op: 'add-rule', family: 'ip6', chain: 's', rule: { kind: 'verdict', verdict: { kind: 'goto', chain: 'v6s0p0b2001_db8__11' } } },
    { op: 'add-rule', family: 'ip6', chain: 'v6s0p0b2001_db8__11', rule: { kind: 'dnat', counter: 'v6s0p0b2001_db8__11_conns', proto: 'udp', address: '2001:db8::11', port: 5353 } },
    { op: 'add-elements', family: 'ip6', set: 'refused', setId: 1, elements: [{ vip: '2001:db8::100', proto: 'udp', port: 53, verdict: { kind: 'drop' } }] },
  ];
  const b = encodeBatch('lb_agent', ops, { seq: 0, ack: false });
  t.ok(b.datagram.equals(golden('nft-batch-delta6.hex')), 'bytes');
});

t.test('flow-hash rules (IPv4 and IPv6) are the datagram nft sent, byte for byte', async (t) => {
  const ops: NftOp[] = [
    { op: 'add-rule', family: 'ip', chain: 's', rule: { kind: 'jhash', seed: 0x725e57e8, targets: ['a', 'b', 'a'] } },
    { op: 'add-rule', family: 'ip6', chain: 's', rule: { kind: 'jhash', seed: 1, targets: ['a'] } },
  ];
  const b = encodeBatch('lb_agent', ops, { seq: 0, ack: false });
  t.ok(b.datagram.equals(golden('nft-batch-jhash.hex')), 'bytes');
  t.equal(b.seqs.length, 6, 'each rule is three messages: its map, the map\'s elements, the rule');
});

t.test('named counters added, redefined and deleted, and byte-counter map elements (IPv4 and IPv6), are the datagram nft sent, byte for byte', async (t) => {
  // golden/nft-batch-objects.nft applied over golden/nft-batch-objects-base.nft.
  const ops: NftOp[] = [
    { op: 'add-counter', family: 'ip', name: 's0p0b10_0_0_12_to_backend' },
    { op: 'delete-counter-elements', family: 'ip', set: 'to_backend', elements: [{ vip: '10.0.0.100', backend: '10.0.0.11', proto: 'tcp', port: 8080 }] },
    { op: 'delete-counter', family: 'ip', name: 'old_c' },
    { op: 'add-counter', family: 'ip', name: 'old_c' },
    {
      op: 'add-counter-elements', family: 'ip', set: 'to_backend', setId: 1, elements: [
        { vip: '10.0.0.100', backend: '10.0.0.12', proto: 'tcp', port: 8080, counter: 's0p0b10_0_0_12_to_backend' },
        { vip: '10.0.0.101', backend: '10.0.0.11', proto: 'udp', port: 5353, counter: 'old_c' },
      ],
    },
    { op: 'delete-counter', family: 'ip', name: 's0p0b10_0_0_11_to_backend' },
    { op: 'add-counter', family: 'ip6', name: 'v6c_new' },
    { op: 'add-counter-elements', family: 'ip6', set: 'to_client', setId: 2, elements: [{ vip: '2001:db8::100', backend: '2001:db8::11', proto: 'tcp', port: 8080, counter: 'v6c_new' }] },
    { op: 'delete-counter', family: 'ip6', name: 'v6c_old' },
  ];
  const b = encodeBatch('lb_agent', ops, { seq: 0, ack: false });
  const want = golden('nft-batch-objects.hex');
  t.equal(b.datagram.length, want.length, 'length');
  t.ok(b.datagram.equals(want), 'bytes');
  t.equal(b.seqs.length, ops.length, 'one message per step');
  t.throws(() => encodeBatch('lb_agent', [{ op: 'add-counter-elements', family: 'ip', set: 'to_backend', elements: [{ vip: '10.0.0.1', backend: '10.0.0.2', proto: 'tcp', port: 80 }] }], { seq: 0, ack: false }),
    /element 10\.0\.0\.1 \. 10\.0\.0\.2 \. tcp \. 80 of map to_backend names no counter/);
  t.throws(() => encodeBatch('lb_agent', [{ op: 'delete-counter-elements', family: 'ip6', set: 'to_client', elements: [{ vip: '2001:db8::1', backend: '10.0.0.2', proto: 'tcp', port: 80 }] }], { seq: 0, ack: false }),
    /not an IPv6 address for table ip6: "10\.0\.0\.2"/);
});

t.test('addresses added to and deleted from a set of addresses (IPv4 and IPv6) are the datagram nft sent, byte for byte', async (t) => {
  // golden/nft-batch-vips.nft applied over golden/nft-batch-vips-base.nft.
  const ops: NftOp[] = [
    { op: 'delete-addresses', family: 'ip', set: 'vips', addresses: ['10.0.0.100'] },
    { op: 'add-addresses', family: 'ip', set: 'vips', setId: 1, addresses: ['10.0.0.101', '10.0.0.102'] },
    { op: 'add-addresses', family: 'ip6', set: 'vips', setId: 2, addresses: ['2001:db8::100'] },
  ];
  const b = encodeBatch('lb_agent', ops, { seq: 0, ack: false });
  t.ok(b.datagram.equals(golden('nft-batch-vips.hex')), 'bytes');
  t.throws(() => encodeBatch('lb_agent', [{ op: 'add-addresses', family: 'ip', set: 'vips', addresses: ['fd00::1'] }], { seq: 0, ack: false }), /not an IPv4 address for table ip: "fd00::1"/);
});

t.test('slot maps added and deleted, their elements and the rules that DNAT by them (IPv4 and IPv6) are the datagram nft sent, byte for byte', async (t) => {
  // golden/nft-batch-slotmap.nft applied over golden/nft-batch-slotmap-base.nft (s0p0_slots is nft's cached set 3).
  const ops: NftOp[] = [
    { op: 'add-slot-map', family: 'ip', set: 's1p0_slots', proto: 'udp', setId: 1 },
    { op: 'delete-slot-elements', family: 'ip', set: 's0p0_slots', elements: [{ slot: 1 }] },
    { op: 'add-rule', family: 'ip', chain: 's0p0', rule: { kind: 'dnat-map', proto: 'tcp', pick: { kind: 'numgen', modulus: 12 }, map: 's0p0_slots', setId: 3 } },
    { op: 'add-rule', family: 'ip', chain: 's1p0', rule: { kind: 'dnat-map', proto: 'udp', pick: { kind: 'jhash', seed: 0x725e57e8, modulus: 1021 }, map: 's1p0_slots', setId: 1 } },
    { op: 'add-rule', family: 'ip', chain: 's1p0', rule: { kind: 'dnat', proto: 'tcp', address: '10.0.0.13', port: 8080 } },
    { op: 'add-slot-elements', family: 'ip', set: 's0p0_slots', setId: 3, elements: [{ slot: 1, address: '10.0.0.13', port: 8080 }, { slot: 2, address: '10.0.0.11', port: 8080 }] },
    { op: 'add-slot-elements', family: 'ip', set: 's1p0_slots', setId: 1, elements: [{ slot: 0, address: '10.0.0.13', port: 53 }] },
    { op: 'add-slot-map', family: 'ip6', set: 'v6s0p0_slots', proto: 'tcp', setId: 2 },
    { op: 'add-rule', family: 'ip6', chain: 'v6s0p0', rule: { kind: 'dnat-map', proto: 'tcp', pick: { kind: 'numgen', modulus: 12 }, map: 'v6s0p0_slots', setId: 2 } },
    { op: 'add-rule', family: 'ip6', chain: 'v6s0p0', rule: { kind: 'dnat-map', proto: 'tcp', pick: { kind: 'jhash', seed: 1, modulus: 1021 }, map: 'v6s0p0_slots', setId: 2 } },
    { op: 'add-rule', family: 'ip6', chain: 'v6s0p0', rule: { kind: 'dnat', proto: 'udp', address: '2001:db8::11', port: 5353 } },
    { op: 'add-slot-elements', family: 'ip6', set: 'v6s0p0_slots', setId: 2, elements: [{ slot: 0, address: '2001:db8::11', port: 8080 }] },
    { op: 'flush-chain', family: 'ip', chain: 's0p0' },
    { op: 'delete-slot-map', family: 'ip', set: 's0p0_slots' },
  ];
  const b = encodeBatch('lb_agent', ops, { seq: 0, ack: false });
  const want = golden('nft-batch-slotmap.hex');
  t.equal(b.datagram.length, want.length, 'length');
  t.ok(b.datagram.equals(want), 'bytes');
  t.equal(b.seqs.length, ops.length, 'one message per step');
  // The other two declarations: IPv4 over TCP, IPv6 over UDP (golden/nft-batch-slotmap-types.nft); ids from the batch's own count.
  const types = encodeBatch('lb_agent', [{ op: 'add-slot-map', family: 'ip', set: 'a', proto: 'tcp' }, { op: 'add-slot-map', family: 'ip6', set: 'b', proto: 'udp' }], { seq: 0, ack: false });
  t.ok(types.datagram.equals(golden('nft-batch-slotmap-types.hex')), 'bytes of the other declarations');
  t.throws(() => encodeBatch('lb_agent', [{ op: 'add-slot-elements', family: 'ip', set: 'm', elements: [{ slot: 0 }] }], { seq: 0, ack: false }), /slot 0 of map m names no backend/);
  t.throws(() => encodeBatch('lb_agent', [{ op: 'add-slot-elements', family: 'ip6', set: 'm', elements: [{ slot: 0, address: '10.0.0.1', port: 80 }] }], { seq: 0, ack: false }), /not an IPv6 address for table ip6: "10\.0\.0\.1"/);
  t.throws(() => encodeBatch('lb_agent', [{ op: 'add-rule', family: 'ip', chain: 'c', rule: { kind: 'dnat-map', proto: 'tcp', pick: { kind: 'numgen', modulus: 0 }, map: 'm' } }], { seq: 0, ack: false }), /slot pick of chain c has no modulus: 0/);
});

t.test('with acknowledgements every message between begin and end asks one, and none else', async (t) => {
  const b = encodeBatch('lb_agent', [{ op: 'flush-chain', family: 'ip', chain: 's0p0' }, { op: 'delete-chain', family: 'ip', chain: 's0p0' }], { seq: 100, ack: true });
  const flags: number[] = [];
  for (let o = 0; o < b.datagram.length; o += b.datagram.readUInt32LE(o)) flags.push(b.datagram.readUInt16LE(o + 6));
  t.same(flags, [0x1, 0x5, 0x5, 0x1]);
  t.same(b.seqs, [101, 102]);
});

t.test('bad values are refused naming them, before anything is sent', async (t) => {
  const enc = (op: NftOp): unknown => encodeBatch('lb_agent', [op], { seq: 1, ack: true });
  t.throws(() => enc({ op: 'add-rule', family: 'ip', chain: 'c', rule: { kind: 'dnat', counter: 'x', proto: 'tcp', address: '2001:db8::1', port: 80 } }), /not an IPv4 address for table ip: "2001:db8::1"/);
  t.throws(() => enc({ op: 'add-rule', family: 'ip6', chain: 'c', rule: { kind: 'dnat', counter: 'x', proto: 'tcp', address: '10.0.0.1', port: 80 } }), /not an IPv6 address/);
  t.throws(() => enc({ op: 'add-elements', family: 'ip', set: 's', elements: [{ vip: '10.0.0.1', proto: 'tcp', port: 70000, verdict: { kind: 'drop' } }] }), /not a port: 70000/);
  t.throws(() => enc({ op: 'add-elements', family: 'ip', set: 's', elements: [{ vip: '10.0.0.1', proto: 'tcp', port: 80 }] }), /has no verdict/);
  t.throws(() => enc({ op: 'add-rule', family: 'ip', chain: 'c', rule: { kind: 'numgen', targets: [] } }), /no targets/);
});

t.test('IPv6 addresses in every spelling encode to their 16 bytes', async (t) => {
  const key = (vip: string): string => {
    const b = encodeBatch('t', [{ op: 'delete-elements', family: 'ip6', set: 's', elements: [{ vip, proto: 'tcp', port: 1 }] }], { seq: 0, ack: false }).datagram;
    // The key's value attribute follows "…\x1c\x00\x01\x00": address, proto, port.
    const at = b.indexOf(Buffer.from('1c000100', 'hex'));
    return b.subarray(at + 4, at + 20).toString('hex');
  };
  t.equal(key('::1'), '00000000000000000000000000000001');
  t.equal(key('2001:db8::'), '20010db8000000000000000000000000');
  t.equal(key('fe80::1:2'), 'fe800000000000000000000000010002');
  t.equal(key('::ffff:10.1.2.3'), '00000000000000000000ffff0a010203');
  t.equal(key('1:2:3:4:5:6:7:8'), '00010002000300040005000600070008');
});

t.test('acknowledgements and errors are read by sequence number; a truncated reply is malformed', async (t) => {
  const msg = (seq: number, errno: number): Buffer => {
    const b = Buffer.alloc(36);
    b.writeUInt32LE(36, 0); b.writeUInt16LE(2, 4); b.writeUInt32LE(seq, 8); b.writeInt32LE(errno, 16);
    return b;
  };
  const r = parseAcks(Buffer.concat([msg(7, 0), msg(8, -2)]));
  t.same([...r.acks], [[7, 0], [8, -2]]);
  t.equal(r.malformed, false);
  t.equal(parseAcks(msg(7, 0).subarray(0, 30)).malformed, true);
  const bad = msg(7, 0);
  bad.writeUInt32LE(8, 0);
  t.equal(parseAcks(bad).malformed, true, 'a length shorter than a header');
});
