// BPF builders: instruction for instruction what `tcpdump -dd` emits
// (tcpdump 4.99, captured with `tcpdump -i lo -dd '<expr>'`).
import t from 'tap';
import { BPF_ACCEPT, BPF_ARP_SET_MAX, BPF_MAX_INSNS, bpfArp, bpfArpAbout, bpfArpAboutAny, bpfEtherType, bpfIpProto, bpfIpProtoPayloadByte, bpfProblem, bpfUdpDstPort, formatBpf } from '../../../agent/net/packet/bpf';

const TCPDUMP_ARP = `{ 0x28, 0, 0, 0x0000000c },
{ 0x15, 0, 1, 0x00000806 },
{ 0x6, 0, 0, 0x00040000 },
{ 0x6, 0, 0, 0x00000000 },`;

const TCPDUMP_IP_PROTO_112 = `{ 0x28, 0, 0, 0x0000000c },
{ 0x15, 0, 3, 0x00000800 },
{ 0x30, 0, 0, 0x00000017 },
{ 0x15, 0, 1, 0x00000070 },
{ 0x6, 0, 0, 0x00040000 },
{ 0x6, 0, 0, 0x00000000 },`;

const TCPDUMP_IP_UDP_DST_68 = `{ 0x28, 0, 0, 0x0000000c },
{ 0x15, 0, 8, 0x00000800 },
{ 0x30, 0, 0, 0x00000017 },
{ 0x15, 0, 6, 0x00000011 },
{ 0x28, 0, 0, 0x00000014 },
{ 0x45, 4, 0, 0x00001fff },
{ 0xb1, 0, 0, 0x0000000e },
{ 0x48, 0, 0, 0x00000010 },
{ 0x15, 0, 1, 0x00000044 },
{ 0x6, 0, 0, 0x00040000 },
{ 0x6, 0, 0, 0x00000000 },`;

const TCPDUMP_ETHER_PROTO_0800 = `{ 0x28, 0, 0, 0x0000000c },
{ 0x15, 0, 1, 0x00000800 },
{ 0x6, 0, 0, 0x00040000 },
{ 0x6, 0, 0, 0x00000000 },`;

// tcpdump -dd 'arp and (arp[14:4] = 0x0a630064 or arp[24:4] = 0x0a630064)': ARP about 10.99.0.100.
const TCPDUMP_ARP_ABOUT_10_99_0_100 = `{ 0x28, 0, 0, 0x0000000c },
{ 0x15, 0, 5, 0x00000806 },
{ 0x20, 0, 0, 0x0000001c },
{ 0x15, 2, 0, 0x0a630064 },
{ 0x20, 0, 0, 0x00000026 },
{ 0x15, 0, 1, 0x0a630064 },
{ 0x6, 0, 0, 0x00040000 },
{ 0x6, 0, 0, 0x00000000 },`;

t.test('ARP about one address: sender or target, as tcpdump compiles it (issue 18)', async (t) => {
  t.equal(formatBpf(bpfArpAbout(0x0a630064)), TCPDUMP_ARP_ABOUT_10_99_0_100);
  t.equal(bpfProblem(bpfArpAbout(0xffffffff)), undefined);
  t.throws(() => bpfArpAbout(2 ** 32), RangeError);
});

t.test('programs equal tcpdump -dd output', async (t) => {
  t.equal(formatBpf(bpfArp()), TCPDUMP_ARP, "'arp'");
  t.equal(formatBpf(bpfIpProto(112)), TCPDUMP_IP_PROTO_112, "'ip proto 112' (VRRP)");
  t.equal(formatBpf(bpfUdpDstPort(68)), TCPDUMP_IP_UDP_DST_68, "'ip and udp dst port 68' (DHCP client)");
  t.equal(formatBpf(bpfEtherType(0x0800)), TCPDUMP_ETHER_PROTO_0800, "'ether proto 0x0800'");
  t.equal(formatBpf(bpfUdpDstPort(67)), TCPDUMP_IP_UDP_DST_68.replace('0x00000044', '0x00000043'), "'ip and udp dst port 67'");
});

t.test('builders reject out-of-range arguments', async (t) => {
  t.throws(() => bpfUdpDstPort(70000), RangeError);
  t.throws(() => bpfUdpDstPort(1.5), RangeError);
  t.throws(() => bpfIpProto(256), RangeError);
  t.throws(() => bpfEtherType(-1), RangeError);
  t.throws(() => bpfIpProtoPayloadByte(112, 1, 256), RangeError);
  t.throws(() => bpfIpProtoPayloadByte(112, -1, 51), RangeError);
});

t.test('a payload byte after an IP header of any length (the VRRP VRID filter)', async (t) => {
  const p = bpfIpProtoPayloadByte(112, 1, 51);
  t.equal(bpfProblem(p), undefined, 'well formed');
  t.same(p[8], [0x50, 0, 0, 15], 'X + 15: the IP header length from byte 0, then byte 1 of the payload');
  t.same(p[9], [0x15, 0, 1, 51], 'compared with the value');
});

t.test('bpfProblem: structural checks', async (t) => {
  t.equal(bpfProblem(bpfUdpDstPort(68)), undefined);
  t.equal(bpfProblem(bpfArp()), undefined);
  t.match(bpfProblem([]), /empty/);
  t.match(bpfProblem([[0x06, 0, 0, 2 ** 33]]), /out of range/);
  t.match(bpfProblem([[0x15, 0, 5, 1], [0x06, 0, 0, 0]]), /past the end/);
  t.match(bpfProblem([[0x28, 0, 0, 12]]), /return/);
  t.match(bpfProblem([[1, 2, 3]] as unknown as [number, number, number, number][]), /not \[code/);
  t.match(bpfProblem(Array.from({ length: 4097 }, () => [0x06, 0, 0, 0] as const)), /max 4096/);
});

/**
 * A classic BPF machine for the instructions the builders use (ld abs h/w,
 * jeq k, ja, ret k), as the kernel runs them (net/core/filter.c): a load
 * past the frame's end returns 0.
 */
function runBpf(program: ReturnType<typeof bpfArpAboutAny>, frame: Buffer): number {
  let a = 0;
  for (let pc = 0, steps = 0; pc < program.length && steps < 10_000; steps++) {
    const [code, jt, jf, k] = program[pc]!;
    switch (code) {
      case 0x28: if (k + 2 > frame.length) return 0; a = frame.readUInt16BE(k); pc++; break;
      case 0x20: if (k + 4 > frame.length) return 0; a = frame.readUInt32BE(k); pc++; break;
      case 0x15: pc += 1 + (a === k ? jt : jf); break;
      case 0x05: pc += 1 + k; break;
      case 0x06: return k;
      default: throw new Error(`instruction 0x${code.toString(16)} is not in this machine`);
    }
  }
  throw new Error('ran off the program');
}

function arpFrame(sender: number, target: number, ethertype = 0x0806): Buffer {
  const f = Buffer.alloc(42);
  f.writeUInt16BE(ethertype, 12);
  f.writeUInt32BE(sender, 28);
  f.writeUInt32BE(target, 38);
  return f;
}

t.test('ARP about a set of addresses: exactly the frames whose sender or target is in it', async (t) => {
  for (const n of [1, 2, 199, 200, 201, 401, BPF_ARP_SET_MAX]) {
    const ips = Array.from({ length: n }, (_, i) => 0x0a630000 + i * 3);
    const p = bpfArpAboutAny(ips);
    t.equal(bpfProblem(p), undefined, `${n} addresses: well formed`);
    t.ok(p.length <= BPF_MAX_INSNS, `${n} addresses: ${p.length} instructions`);
    const out = 0x0b000001;
    const probe = [0, Math.floor(n / 2), n - 1].map((i) => ips[i]!);
    for (const ip of probe) {
      t.equal(runBpf(p, arpFrame(ip, out)), BPF_ACCEPT, `${n}: sender ${ip.toString(16)} passes`);
      t.equal(runBpf(p, arpFrame(out, ip)), BPF_ACCEPT, `${n}: target ${ip.toString(16)} passes`);
      t.equal(runBpf(p, arpFrame(ip, ip, 0x0800)), 0, `${n}: not ARP, dropped`);
    }
    t.equal(runBpf(p, arpFrame(out, out + 1)), 0, `${n}: ARP about others, dropped`);
    t.equal(runBpf(p, arpFrame(ips[0]! + 1, 0)), 0, `${n}: a neighbour of a member, dropped`);
    t.equal(runBpf(p, Buffer.alloc(10)), 0, `${n}: a runt, dropped`);
  }
  t.equal(formatBpf(bpfArpAboutAny([0x0a630064])), formatBpf(bpfArpAboutAny([0x0a630064, 0x0a630064])), 'duplicates count once');
  t.throws(() => bpfArpAboutAny([]), RangeError);
  t.throws(() => bpfArpAboutAny(Array.from({ length: BPF_ARP_SET_MAX + 1 }, (_, i) => i)), RangeError);
  t.throws(() => bpfArpAboutAny([-1]), RangeError);
  // The single address's verdicts are bpfArpAbout's (tcpdump's program) on every frame shape.
  const one = bpfArpAboutAny([0x0a630064]);
  for (const f of [arpFrame(0x0a630064, 1), arpFrame(1, 0x0a630064), arpFrame(1, 2), arpFrame(0x0a630064, 1, 0x86dd)]) {
    t.equal(runBpf(one, f), runBpf(bpfArpAbout(0x0a630064), f));
  }
});
