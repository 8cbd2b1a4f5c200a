// Classic BPF programs for packet sockets (pure): the kernel runs them on
// every frame of the interface before it is queued to us, so a DHCP or ARP
// socket wakes only for its own traffic. Offsets are from the start of the
// Ethernet header (SOCK_RAW). The programs are instruction for instruction
// what `tcpdump -dd` emits for the same expression (the tests compare them),
// so they can be checked with a tool every operator has.

import { ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPPROTO_ICMPV6, IPPROTO_UDP } from './inet';

/** One instruction: [code, jt, jf, k] as in struct sock_filter. */
export type BpfInstruction = readonly [number, number, number, number];
export type BpfProgram = ReadonlyArray<BpfInstruction>;

// Opcodes (linux/filter.h, linux/bpf_common.h).
export const BPF_LD_H_ABS = 0x28; // A = u16 at [k]
export const BPF_LD_B_ABS = 0x30; // A = u8 at [k]
export const BPF_LD_W_ABS = 0x20; // A = u32 at [k]
export const BPF_LD_H_IND = 0x48; // A = u16 at [X + k]
export const BPF_LD_B_IND = 0x50; // A = u8 at [X + k]
export const BPF_LDX_B_MSH = 0xb1; // X = 4 * ([k] & 0xf): the IPv4 header length
export const BPF_ALU_AND_K = 0x54; // A &= k
export const BPF_ALU_MUL_K = 0x24; // A *= k
export const BPF_MISC_TAX = 0x07; // X = A
export const BPF_JEQ_K = 0x15;
export const BPF_JA = 0x05; // pc += k: the one jump with a 32-bit offset
export const BPF_JSET_K = 0x45;
export const BPF_RET_K = 0x06;

/** Accept up to this many bytes: tcpdump's default snap length, i.e. the whole frame. */
export const BPF_ACCEPT = 0x40000;
/** BPF_MAXINSNS (linux/bpf_common.h). */
export const BPF_MAX_INSNS = 4096;


const ETH_TYPE_OFFSET = 12;
const IP_PROTO_OFFSET = 14 + 9;
const IP_FRAG_OFFSET = 14 + 6;
const IP_HEADER_START = 14;

function checkInt(name: string, v: number, max: number): void {
  if (!Number.isInteger(v) || v < 0 || v > max) throw new RangeError(`${name} must be an integer 0..${max}, got ${v}`);
}

/** Accept every frame of the given ethertype. `tcpdump -dd 'ether proto 0x0800'`. */
export function bpfEtherType(ethertype: number): BpfProgram {
  checkInt('ethertype', ethertype, 0xffff);
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 1, ethertype],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/** ARP frames only. `tcpdump -dd 'arp'`. */
export function bpfArp(): BpfProgram {
  return bpfEtherType(ETHERTYPE_ARP);
}

/** ARP sender and target protocol addresses in an Ethernet frame (RFC 826, Ethernet/IPv4 sizes). */
const ARP_SPA_OFFSET = 14 + 14;
const ARP_TPA_OFFSET = 14 + 24;

/**
 * ARP frames whose sender or target address is `ip`: what a prober or the
 * owner of that address acts on (RFC 5227 §2.1.1, §2.4); every other ARP
 * frame on the LAN stays in the kernel. With one socket per VIP,
 * each of 50 services otherwise decoded the announcements of all the others.
 * `tcpdump -dd 'arp and (arp[14:4] = IP or arp[24:4] = IP)'`.
 */
export function bpfArpAbout(ip: number): BpfProgram {
  checkInt('ip', ip, 0xffffffff);
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 5, ETHERTYPE_ARP],
    [BPF_LD_W_ABS, 0, 0, ARP_SPA_OFFSET],
    [BPF_JEQ_K, 2, 0, ip],
    [BPF_LD_W_ABS, 0, 0, ARP_TPA_OFFSET],
    [BPF_JEQ_K, 0, 1, ip],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/**
 * Compares in one run of bpfArpAboutAny before its own accept: a compare's
 * jump (an 8-bit jt) must reach it.
 */
const ARP_SET_RUN = 200;

/**
 * The most addresses bpfArpAboutAny takes: two runs of compares (sender and
 * target) within BPF_MAXINSNS. A set larger than this is passed by bpfArp()
 * and told apart in userspace.
 */
export const BPF_ARP_SET_MAX = 2000;

/**
 * ARP frames whose sender or target address is any of `ips`: bpfArpAbout for
 * a set, the kernel filter of an interface's shared ARP socket
 * (net/neighbour/neighbour-sockets.ts). The same expression as
 * `tcpdump -dd 'arp and (arp[14:4] = A or arp[14:4] = B ... or arp[24:4] = A ...)'`,
 * laid out for any size: a compare's jt is 8 bits, so compares come in runs
 * of ARP_SET_RUN, each run followed by a `ja` past its own accept, and the
 * end of the sender's runs falls through to the target's. At most 2 x
 * (n + 2 x ceil(n / 200)) + 4 instructions.
 */
export function bpfArpAboutAny(ips: readonly number[]): BpfProgram {
  const set = [...new Set(ips)];
  if (set.length === 0) throw new RangeError('bpfArpAboutAny needs at least one address');
  if (set.length > BPF_ARP_SET_MAX) throw new RangeError(`bpfArpAboutAny takes at most ${BPF_ARP_SET_MAX} addresses, got ${set.length}`);
  for (const ip of set) checkInt('ip', ip, 0xffffffff);
  const body: BpfInstruction[] = [];
  for (const offset of [ARP_SPA_OFFSET, ARP_TPA_OFFSET]) {
    body.push([BPF_LD_W_ABS, 0, 0, offset]);
    for (let i = 0; i < set.length; i += ARP_SET_RUN) {
      const run = set.slice(i, i + ARP_SET_RUN);
      // compare j jumps over the rest of the run and the ja to the accept after it.
      run.forEach((ip, j) => body.push([BPF_JEQ_K, run.length - j, 0, ip]));
      body.push([BPF_JA, 0, 0, 1]);
      body.push([BPF_RET_K, 0, 0, BPF_ACCEPT]);
    }
  }
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    // Not ARP: straight to the drop at the end (a ja: the body is longer than 255).
    [BPF_JEQ_K, 1, 0, ETHERTYPE_ARP],
    [BPF_JA, 0, 0, body.length],
    ...body,
    [BPF_RET_K, 0, 0, 0],
  ];
}

/** IPv4 with the given protocol (112 = VRRP). `tcpdump -dd 'ip proto 112'`. */
export function bpfIpProto(proto: number): BpfProgram {
  checkInt('IP protocol', proto, 0xff);
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 3, ETHERTYPE_IPV4],
    [BPF_LD_B_ABS, 0, 0, IP_PROTO_OFFSET],
    [BPF_JEQ_K, 0, 1, proto],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/**
 * IPv4 with the given protocol whose payload byte at `offset` (counted from
 * the end of the IP header, options included) is `value`: the VRRP socket's
 * VRID filter (failover/codec.ts vrrpFilter).
 * `tcpdump -dd 'ip proto 112 and ip[1 + (ip[0] & 0xf) * 4] = 51'`.
 */
export function bpfIpProtoPayloadByte(proto: number, offset: number, value: number): BpfProgram {
  checkInt('IP protocol', proto, 0xff);
  checkInt('payload offset', offset, 0xffff - IP_HEADER_START);
  checkInt('byte value', value, 0xff);
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 9, ETHERTYPE_IPV4],
    [BPF_LD_B_ABS, 0, 0, IP_PROTO_OFFSET],
    [BPF_JEQ_K, 0, 7, proto],
    [BPF_LD_B_ABS, 0, 0, IP_HEADER_START],
    [BPF_ALU_AND_K, 0, 0, 0x0f],
    [BPF_ALU_MUL_K, 0, 0, 4],
    [BPF_MISC_TAX, 0, 0, 4], // k is unused by TAX; tcpdump leaves the 4 of the multiply there
    [BPF_LD_B_IND, 0, 0, IP_HEADER_START + offset],
    [BPF_JEQ_K, 0, 1, value],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/** IPv6 next header and the first byte after a 40-byte IPv6 header (the ICMPv6 type). */
const IPV6_NEXT_HEADER_OFFSET = 14 + 6;
const ICMPV6_TYPE_OFFSET = 14 + 40;

/**
 * ICMPv6 neighbour solicitations and advertisements (types 135, 136)
 * directly after the IPv6 header: all an IPv6 VIP's owner acts on (RFC 4861
 * §7.1 drops NDP behind extension headers anyway). The owner's socket then
 * wakes for neighbour discovery, not for every IPv6 packet on the LAN.
 * `tcpdump -dd 'ip6 and ip6[6] = 58 and (ip6[40] = 135 or ip6[40] = 136)'`.
 */
export function bpfNdp(): BpfProgram {
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 6, ETHERTYPE_IPV6],
    [BPF_LD_B_ABS, 0, 0, IPV6_NEXT_HEADER_OFFSET],
    [BPF_JEQ_K, 0, 4, IPPROTO_ICMPV6],
    [BPF_LD_B_ABS, 0, 0, ICMPV6_TYPE_OFFSET],
    [BPF_JEQ_K, 1, 0, 135],
    [BPF_JEQ_K, 0, 1, 136],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/**
 * IPv6 whose next header (no extension headers) is `nextHeader` and whose
 * payload byte at `offset` is `value`: the IPv6 VRRP socket's VRID filter
 * (failover/codec6.ts vrrpFilter6).
 * `tcpdump -dd 'ip6 and ip6[6] = 112 and ip6[41] = 51'`.
 */
export function bpfIpv6NextHeaderPayloadByte(nextHeader: number, offset: number, value: number): BpfProgram {
  checkInt('next header', nextHeader, 0xff);
  checkInt('payload offset', offset, 0xffff - ICMPV6_TYPE_OFFSET);
  checkInt('byte value', value, 0xff);
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 5, ETHERTYPE_IPV6],
    [BPF_LD_B_ABS, 0, 0, IPV6_NEXT_HEADER_OFFSET],
    [BPF_JEQ_K, 0, 3, nextHeader],
    [BPF_LD_B_ABS, 0, 0, ICMPV6_TYPE_OFFSET + offset],
    [BPF_JEQ_K, 0, 1, value],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/**
 * IPv4 UDP to the given destination port, first fragments only (a later
 * fragment has no UDP header to match). `tcpdump -dd 'ip and udp dst port 68'`.
 */
export function bpfUdpDstPort(port: number): BpfProgram {
  checkInt('UDP port', port, 0xffff);
  return [
    [BPF_LD_H_ABS, 0, 0, ETH_TYPE_OFFSET],
    [BPF_JEQ_K, 0, 8, ETHERTYPE_IPV4],
    [BPF_LD_B_ABS, 0, 0, IP_PROTO_OFFSET],
    [BPF_JEQ_K, 0, 6, IPPROTO_UDP],
    [BPF_LD_H_ABS, 0, 0, IP_FRAG_OFFSET],
    [BPF_JSET_K, 4, 0, 0x1fff],
    [BPF_LDX_B_MSH, 0, 0, IP_HEADER_START],
    [BPF_LD_H_IND, 0, 0, IP_HEADER_START + 2],
    [BPF_JEQ_K, 0, 1, port],
    [BPF_RET_K, 0, 0, BPF_ACCEPT],
    [BPF_RET_K, 0, 0, 0],
  ];
}

/**
 * Structural check of a program before it reaches the kernel (which
 * verifies the semantics itself and answers EINVAL): returns the reason it is
 * malformed, or undefined when it is well formed.
 */
export function bpfProblem(program: BpfProgram): string | undefined {
  const isArray = (v: unknown): v is readonly unknown[] => Array.isArray(v);
  if (!isArray(program) || program.length === 0) return 'program is empty';
  if (program.length > BPF_MAX_INSNS) return `program has ${program.length} instructions (max ${BPF_MAX_INSNS})`;
  for (let i = 0; i < program.length; i++) {
    const insn = program[i];
    if (!isArray(insn) || insn.length !== 4) return `instruction ${i} is not [code, jt, jf, k]`;
    const [code, jt, jf, k] = insn;
    const ok = (v: unknown, max: number): boolean => typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= max;
    if (!ok(code, 0xffff) || !ok(jt, 0xff) || !ok(jf, 0xff) || !ok(k, 0xffffffff)) return `instruction ${i} has a field out of range`;
    // A jump may not leave the program (the kernel rejects it too).
    if ((code & 0x07) === 0x05) {
      const reach = code === 0x05 ? k : Math.max(jt, jf); // BPF_JA jumps by k
      if (i + 1 + reach >= program.length) return `instruction ${i} jumps past the end`;
    }
  }
  const last = program[program.length - 1]!;
  if ((last[0] & 0x07) !== 0x06) return 'program does not end with a return';
  return undefined;
}

/** Render like `tcpdump -dd`, for logs and golden tests. */
export function formatBpf(program: BpfProgram): string {
  return program
    .map(([c, jt, jf, k]) => `{ 0x${c.toString(16)}, ${jt}, ${jf}, 0x${k.toString(16).padStart(8, '0')} },`)
    .join('\n');
}
