// The DSR program's plan, pure: nft's jhash reproduced (vectors the kernel
// computed: an nft rule `jhash ip saddr . th sport mod 1021 seed 0x1a2b3c4d
// == N counter` matched connections from 127.0.0.1 with those source ports;
// test/privileged/net-ebpf-attach.test.ts repeats that against nft and the
// loaded program on every run), the maps' layout, and the program's shape.
// The verifier is the real check of the program (the privileged test loads it).
import t from 'tap';
import { BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_MAP_UPDATE_ELEM, BPF_FUNC_REDIRECT_NEIGH, dsrMaps, dsrProgram, nftJhashSlot, nftJhashSlot6, type DsrBpfPort } from '../../../agent/net/ebpf/ebpf-dsr';

const port = (over: Partial<DsrBpfPort> = {}): DsrBpfPort => ({
  mac: '02:00:00:00:00:01', vip: '10.0.0.100', protocol: 'TCP', port: 80, seed: 0x12345678,
  slots: [0, 1, 1, 0, 2], backends: ['10.0.0.11', '10.0.0.12', '10.0.0.13'].map((address, i) => ({ address, conns: `s0p0b${i}_conns`, toBackend: `s0p0b${i}_to_backend` })),
  ...over,
});

const FDS = { slots: 11, counters: 12, flows: 13, backends: 14 };
const FDS6 = { ...FDS, slots6: 21, flows6: 22, backends6: 23 };
const port6 = (over: Partial<DsrBpfPort> = {}): DsrBpfPort => port({
  vip: 'fd00:99::200', backends: ['fd00:99::11', 'fd00:99::12', 'fd00:99::13'].map((address, i) => ({ address, conns: `v6s0p0b${i}_conns`, toBackend: `v6s0p0b${i}_to_backend` })),
  ...over,
});

/** The program as [code, dst, src, off, imm] rows. */
function rows(b: Buffer): number[][] {
  return Array.from({ length: b.length / 8 }, (_, i) => [b[i * 8]!, b[i * 8 + 1]! & 0xf, b[i * 8 + 1]! >> 4, b.readInt16LE(i * 8 + 2), b.readInt32LE(i * 8 + 4)]);
}

t.test('nft\'s jhash of address . port, then reciprocal_scale', async (t) => {
  t.same([41000, 41001, 41019].map((p) => nftJhashSlot(0x7f000001, p, 0x1a2b3c4d, 1021)), [924, 570, 895], 'what the kernel computed');
  const slots = Array.from({ length: 2000 }, (_, i) => nftJhashSlot(0x0a000003, 30000 + i, 7, 1021));
  t.ok(slots.every((s) => Number.isInteger(s) && s >= 0 && s < 1021), 'every slot in range');
  t.ok(new Set(slots).size > 800, `2,000 ports spread over ${new Set(slots).size} of 1021 slots`);
  t.equal(nftJhashSlot(0x0a000003, 30000, 7, 1), 0, 'one slot: always slot 0');
});

t.test('maps: slots port after port (backend address in network order, counter index), one counter per backend', async (t) => {
  const m = dsrMaps([port(), port({ vip: '10.0.0.101', slots: [0], backends: [{ address: '10.0.0.21', conns: 's1p0b0_conns', toBackend: 's1p0b0_to_backend' }] })]);
  t.same(m.bases, [0, 5]);
  t.same(m.slots.map((v) => v.toString('hex')), [
    '0a00000b00000000', '0a00000c01000000', '0a00000c01000000', '0a00000b00000000', '0a00000d02000000',
    '0a00001503000000',
  ]);
  t.same(m.counters.map((c) => c.conns), ['s0p0b0_conns', 's0p0b1_conns', 's0p0b2_conns', 's1p0b0_conns']);
  t.same(m.backends.map((b) => `${b.key.toString('hex')}=${b.value.toString('hex')}`), [
    '000000000a00000b=0a00000b00000000', '000000000a00000c=0a00000c01000000', '000000000a00000d=0a00000d02000000',
    '050000000a000015=0a00001503000000',
  ], 'backends: (port\'s first slot key LE, address) -> the slot entry of that backend');
  t.throws(() => dsrMaps([port({ slots: [] })]), /empty slot table/);
  t.throws(() => dsrMaps([port({ slots: [3] })]), /slot names backend 3 of 3/);
});

t.test('the program: one match block per port on MAC, VIP, port and protocol; the maps (slots, flows, backends, counters); redirect_neigh', async (t) => {
  const one = rows(dsrProgram([port()], FDS));
  const two = rows(dsrProgram([port(), port({ vip: '10.0.0.101', protocol: 'UDP', port: 53 })], FDS));
  t.equal(two.length - one.length, one.length - rows(dsrProgram([], FDS)).length, 'each port adds the same block');
  const vipCompare = one.find((r) => r[0] === 0x56 && r[1] === 2)!; // jmp32 jne r2 (the destination address)
  t.equal(vipCompare[4], Buffer.from([10, 0, 0, 100]).readInt32LE(0), 'the VIP as a little-endian load of its bytes');
  t.ok(one.some((r) => r[0] === 0x55 && r[1] === 3 && r[4] === 0x5000), 'port 80 as loaded (0x5000)');
  t.ok(two.some((r) => r[0] === 0x55 && r[1] === 4 && r[4] === 17), 'UDP compares protocol 17');
  t.same(one.filter((r) => r[0] === 0x18).map((r) => [r[2], r[4]]), [[1, 11], [1, 13], [1, 14], [1, 13], [1, 12]],
    'maps by descriptor: slots, flows (lookup), backends, flows (record), counters');
  t.same(one.filter((r) => r[0] === 0x85).map((r) => r[4]), [
    BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_MAP_UPDATE_ELEM, BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_REDIRECT_NEIGH,
  ]);
  t.same(one[one.length - 1], [0x95, 0, 0, 0, 0], 'ends in exit');
  t.ok(one.some((r, i) => r[0] === 0xb7 && r[1] === 0 && r[4] === -1 && one[i + 1]![0] === 0x95), 'a frame not its own: r0 = TCX_NEXT (-1), exit');
  t.ok(one.some((r) => r[0] === 0xb4 && r[1] === 1 && r[4] === ((0xdeadbeef + 8 + 0x12345678) | 0)), 'jhash initval = JHASH_INITVAL + 8 + seed');
  t.ok(one.some((r) => r[0] === 0xb7 && r[1] === 8 && r[4] === 5), 'the slot count (mod M)');
  // Every jump lands inside the program.
  one.forEach((r, pc) => {
    const cls = r[0]! & 7;
    if ((cls === 5 || cls === 6) && r[0] !== 0x85 && r[0] !== 0x95) {
      const to = pc + 1 + r[3]!;
      if (!(to >= 0 && to < one.length)) t.fail(`jump at ${pc} to ${to}`);
    }
  });
  t.ok(one.length < 200, `${one.length} instructions`);
});

t.test('nft\'s jhash of ip6 saddr . th sport (20 bytes), then reciprocal_scale', async (t) => {
  const lo6 = Buffer.alloc(16);
  lo6[15] = 1;
  // The kernel's: `jhash ip6 saddr . th sport mod 1021 seed 0x1a2b3c4d` for connections from ::1 (the privileged test repeats it).
  t.same([42000, 42007, 42273].map((p) => nftJhashSlot6(lo6, p, 0x1a2b3c4d, 1021)), [243, 265, 56], 'what the kernel computed');
  const client = Buffer.from('fd000099000000000000000000000003', 'hex');
  const slots = Array.from({ length: 2000 }, (_, i) => nftJhashSlot6(client, 30000 + i, 7, 1021));
  t.ok(slots.every((s) => Number.isInteger(s) && s >= 0 && s < 1021), 'every slot in range');
  t.ok(new Set(slots).size > 800, `2,000 ports spread over ${new Set(slots).size} of 1021 slots`);
  const other = Buffer.from(client);
  other[0] = 0xfe;
  t.not(slots.slice(0, 50).join(), Array.from({ length: 50 }, (_, i) => nftJhashSlot6(other, 30000 + i, 7, 1021)).join(), 'every address byte counts (the first word too)');
  t.throws(() => nftJhashSlot6(Buffer.alloc(4), 1, 7, 1021), /16 bytes, not 4/);
});

t.test('maps, IPv6: its own slot and backend maps (16-byte addresses), counters shared with IPv4, bases per family', async (t) => {
  const m = dsrMaps([port({ slots: [0, 1] }), port6({ slots: [2, 0, 1] }), port({ vip: '10.0.0.101', slots: [2] })]);
  t.same(m.bases, [0, 0, 2], 'each port\'s first key in its own family\'s slot map');
  t.same(m.slots.length, 3);
  t.same(m.slots6.map((v) => v.toString('hex')), [
    'fd00009900000000000000000000001305000000', 'fd00009900000000000000000000001103000000', 'fd00009900000000000000000000001204000000',
  ], 'slot entries: { 16-byte backend address, u32 counter index }');
  t.same(m.counters.map((c) => c.conns), ['s0p0b0_conns', 's0p0b1_conns', 's0p0b2_conns', 'v6s0p0b0_conns', 'v6s0p0b1_conns', 'v6s0p0b2_conns', 's0p0b0_conns', 's0p0b1_conns', 's0p0b2_conns']);
  t.same(m.backends6.map((b) => `${b.key.toString('hex')}=${b.value.toString('hex').slice(32)}`), [
    '00000000fd000099000000000000000000000011=03000000', '00000000fd000099000000000000000000000012=04000000', '00000000fd000099000000000000000000000013=05000000',
  ], 'backends: (port\'s first slot key LE, 16-byte address) -> its slot entry');
  t.throws(() => dsrMaps([port6({ backends: [{ address: '10.0.0.11', conns: 'c', toBackend: 't' }], slots: [0] })]), /not an IPv6 address: backend of fd00:99::200 TCP\/80: 10\.0\.0\.11/);
  t.throws(() => dsrMaps([port({ backends: [{ address: 'fd00::11', conns: 'c', toBackend: 't' }], slots: [0] })]), /not an IPv4 address: backend of 10\.0\.0\.100 TCP\/80: fd00::11/);
  t.throws(() => dsrMaps([port({ vip: 'nope' })]), /not an IP address: VIP nope/);
});

t.test('the program with an IPv6 port: an IPv4-only plan is unchanged; IPv6 frames dispatch to their own half, on the IPv6 maps', async (t) => {
  const v4 = rows(dsrProgram([port()], FDS));
  t.same(rows(dsrProgram([port()], FDS6)), v4, 'the IPv6 maps change nothing for an IPv4-only plan');
  t.notOk(v4.some((r) => r[0] === 0x15 && r[4] === 0xdd86), 'and it has no IPv6 dispatch');
  const dual = rows(dsrProgram([port(), port6()], FDS6));
  t.ok(dual.some((r) => r[0] === 0x15 && r[1] === 2 && r[4] === 0xdd86), 'ethertype 0x86dd (as loaded) jumps to the IPv6 half');
  t.same(dual.filter((r) => r[0] === 0x18).map((r) => r[4]), [11, 13, 14, 13, 12, 21, 22, 23, 22, 12],
    'IPv4: slots, flows, backends, flows, counters; IPv6: slots6, flows6, backends6, flows6, the same counters');
  t.ok(dual.some((r) => r[0] === 0xb4 && r[1] === 1 && r[4] === ((0xdeadbeef + 20 + 0x12345678) | 0)), 'jhash initval = JHASH_INITVAL + 20 + seed');
  t.ok(dual.some((r) => r[0] === 0x62 && r[4] === 10), 'the nexthop family AF_INET6 (10)');
  const vip = Buffer.from('fd000099000000000000000000000200', 'hex');
  for (const w of [0, 4, 8, 12]) t.ok(dual.some((r) => r[0] === 0x56 && r[4] === vip.readInt32LE(w)), `the VIP's word ${w / 4} compared`);
  t.ok(dual.some((r) => r[0] === 0x71 && r[1] === 4 && r[2] === 7 && r[3] === 20), 'the next header (offset 20) is the protocol compared: an extension header matches no port');
  const only6 = rows(dsrProgram([port6()], FDS6));
  t.equal(only6.filter((r) => r[0] === 0x85 && r[4] === BPF_FUNC_REDIRECT_NEIGH).length, 1, 'an IPv6-only plan has no IPv4 half (unreachable code the verifier would refuse)');
  for (const prog of [dual, only6]) {
    prog.forEach((r, pc) => {
      const cls = r[0]! & 7;
      if ((cls === 5 || cls === 6) && r[0] !== 0x85 && r[0] !== 0x95) {
        const to = pc + 1 + r[3]!;
        if (!(to >= 0 && to < prog.length)) t.fail(`jump at ${pc} to ${to}`);
      }
    });
  }
  t.throws(() => dsrProgram([port6()], FDS), /an IPv6 port needs the IPv6 maps/);
});
