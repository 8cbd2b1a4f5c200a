// Direct server return as an eBPF program at tc ingress, PURE:
// the maps' contents and the program's instructions for a DSR plan. The
// driver (ebpf-attach.ts) creates the maps, loads and attaches; nothing here
// touches the kernel.
//
// It is an accelerator in front of `table netdev lb_agent` (nft-dsr.ts) and
// does exactly what that table does, from the same per-port plan:
//   frame to (dst MAC, VIP, protocol, port) of a forwarded DSR port
//     -> jhash(client address . client port, seed) mod M  (nft's own jhash:
//        the same bytes - address, port, two zero pad bytes: 8 for IPv4,
//        20 for IPv6 - the same initval and the same reciprocal_scale as
//        nft_jhash_eval, so a flow lands in the same slot of the same
//        maglev table whichever engine serves it, and a switch between them
//        moves no flow)
//     -> slot -> backend -> counters (SYNs, packets, bytes)
//     -> bpf_redirect_neigh(ingress device, nexthop = backend, AF_INET or
//        AF_INET6): the kernel's neighbour table (ARP, or NDP's nd_tbl)
//        fills in the backend's MAC and ours and the frame leaves by the
//        device it came in on, IP header untouched, as nft's `fwd ip to B
//        device <parent>` (`fwd ip6 to`) does (minus the TTL or hop limit
//        decrement).
// Both families in one program: the ethertype picks the half, each with
// its own slot, backend and flow maps (16-byte addresses for IPv6); the
// counters are one map. Anything else - another MAC or VIP or port,
// neither IPv4 nor IPv6, IP options, an IPv6 extension header (a fragment
// header among them), an IPv4 fragment, a frame too short - returns
// TCX_NEXT: on to any later tc program, the nft table and the stack, which
// decide as before (the nft table handles what we pass on, e.g. an IP
// header with options or an IPv6 hop-by-hop header, with the same hash and
// table).
//
// Why at tc ingress (tcx) and not XDP: generic XDP on the parent linearises
// every GRO'd skb of all the VM's traffic, and native XDP needs the NIC's
// driver; tc with bpf_redirect_neigh costs about half the nft table's time
// per request. tcx (kernel 6.6+) attaches
// without qdisc or filter objects, keeps the program attached after the
// process exits (a restart does not blink), and swaps atomically
// (BPF_F_REPLACE).
//
// Maps (BPF_MAP_TYPE_ARRAY, u32 keys):
//   slots    one entry per slot of every port, port after port:
//            { u32 backend address (network order), u32 counter index }
//   counters one entry per (port, healthy backend):
//            { u64 SYNs (TCP connections), u64 packets, u64 bytes (from the IP header, as nft counts at netdev ingress) }
// and, for TCP, the flows the program has placed (per-flow state), so that a
// change of the backend set moves no open connection whose backend is still
// healthy (the hash alone moves some of them: the maglev table's extra
// disruption, and every flow a new backend's slots take over):
//   flows    BPF_MAP_TYPE_LRU_HASH, { u32 client address, u32 VIP, u16
//            client port, u16 VIP port } (as the wire has them) ->
//            { u32 backend address, u32 0 }; it outlives every program
//            swap (the driver hands the same map to each plan), the kernel
//            evicts the least recently used entry when it is full
//   backends BPF_MAP_TYPE_HASH, { u32 the port's first slot key, u32 backend
//            address } -> the slot entry of that backend ({ address, counter
//            index }): which backends of a port are healthy now, per plan
// and their IPv6 twins, made only for a plan with an IPv6 port: slots6
// { u8 backend[16], u32 counter index }, flows6 (lb_dsr_flows6) { u8
// client[16], u8 VIP[16], u16 client port, u16 VIP port } -> { u8
// backend[16], u32 0 }, backends6 { u32 first slot key, u8 backend[16] } ->
// its slots6 entry.
// A TCP frame that opens a connection (SYN without ACK) takes the hash's
// pick, which is recorded; any other TCP frame goes where its flow was
// placed if that backend is still among the port's healthy ones, else to the
// hash's pick, which is recorded. So new connections follow the current
// weights, open ones stay, and one whose backend left moves as before. UDP
// has no opening frame to re-place a flow on, so it stays with the hash.
import { addressToBytes, ipv4ToBytes, parseAddress, parseIPv4, parseMac } from '../../address';
import { EbpfAsm } from './ebpf';

export const BPF_MAP_TYPE_HASH = 1;
export const BPF_MAP_TYPE_ARRAY = 2;
export const BPF_MAP_TYPE_LRU_HASH = 9;
export const BPF_PROG_TYPE_SCHED_CLS = 3;
/** enum bpf_attach_type (kernel 6.6+; newer than this build host's uapi headers). */
export const BPF_TCX_INGRESS = 46;
export const BPF_F_REPLACE = 1 << 2;
export const BPF_FUNC_MAP_LOOKUP_ELEM = 1;
export const BPF_FUNC_MAP_UPDATE_ELEM = 2;
export const BPF_FUNC_REDIRECT_NEIGH = 152;
export const TC_ACT_OK = 0;
/**
 * What the program returns for a frame that is not its own: TCX_NEXT
 * (TC_ACT_UNSPEC), "no verdict" - any tcx program attached after ours and
 * the classic tc filters still run, then nft's netdev ingress and the stack.
 * TC_ACT_OK would end the tc layer for the frame (tcx_run stops at the first
 * verdict), skipping another tool's programs behind ours.
 */
export const TCX_NEXT = -1;
/** What bpf_redirect_neigh returns on success (the verdict the program hands back). */
export const TC_ACT_REDIRECT = 7;
/** The program's name (BPF_OBJ_NAME_LEN 16): how a later process recognises ours among a device's attachments. */
export const DSR_PROG_NAME = 'lb_agent_dsr';
export const SLOT_VALUE_SIZE = 8;
export const COUNTER_VALUE_SIZE = 24;
export const FLOW_KEY_SIZE = 12;
export const FLOW_VALUE_SIZE = 8;
export const BACKEND_KEY_SIZE = 8;
/** The IPv6 maps' layouts: the same entries with 16-byte addresses (see the header). */
export const SLOT6_VALUE_SIZE = 20;
export const FLOW6_KEY_SIZE = 36;
export const FLOW6_VALUE_SIZE = 20;
export const BACKEND6_KEY_SIZE = 20;
/**
 * Entries of the flow map: open TCP connections through the node's DSR VIPs
 * it remembers. The kernel preallocates an LRU map: 88 bytes an entry,
 * 5.5 MiB of kernel memory (its memlock; charged to the agent's cgroup, not its RSS).
 * When more connections are open, the least recently used lose their entry
 * and go by the hash again, which only moves them if the backend set changed
 * since they were placed.
 */
export const DSR_FLOW_ENTRIES = 65536;
/** The flow map's name: how a later process finds it behind an earlier process's program. */
export const DSR_FLOW_MAP_NAME = 'lb_dsr_flows';
/** The IPv6 flow map's name (DSR_FLOW_ENTRIES entries of FLOW6_KEY_SIZE and FLOW6_VALUE_SIZE: about 7 MiB, made only when an IPv6 port is forwarded). */
export const DSR_FLOW6_MAP_NAME = 'lb_dsr_flows6';
/** The kernel's JHASH_INITVAL (include/linux/jhash.h). */
const JHASH_INITVAL = 0xdeadbeef;
/** nft hashes `ip saddr . th sport` as 8 bytes: the port is padded to a 4-byte register. */
const JHASH_LEN = 8;
/** ... and `ip6 saddr . th sport` as 20: 16 address bytes, the port padded to 4. */
const JHASH6_LEN = 20;

/** One forwarded DSR port, as nft-dsr.ts plans it. */
export interface DsrBpfPort {
  /** Lower-case MAC frames for the VIP arrive with. */
  readonly mac: string;
  readonly vip: string;
  readonly protocol: 'TCP' | 'UDP';
  readonly port: number;
  /** nft's jhash seed for this service (dsrSeed). */
  readonly seed: number;
  /** The slot table: slot -> index into `backends` (its length is nft's `mod M`). */
  readonly slots: readonly number[];
  /** The healthy backends, with the names of the nft counters their BPF counters add to. */
  readonly backends: readonly { readonly address: string; readonly conns: string; readonly toBackend: string }[];
}

/** What the maps hold for a plan. */
export interface DsrMaps {
  /** Slot map entries of the IPv4 ports, in key order (key = index). */
  readonly slots: Buffer[];
  /** The same for the IPv6 ports, in their own map (SLOT6_VALUE_SIZE). */
  readonly slots6: Buffer[];
  /** Counter map size, and the nft counter names each entry adds to (both families, one map). */
  readonly counters: readonly { readonly conns: string; readonly toBackend: string }[];
  /** The first slot key of each port, in its family's slot map. */
  readonly bases: readonly number[];
  /** Backend map entries: (port's first slot key, backend address) -> its slot entry. */
  readonly backends: readonly { readonly key: Buffer; readonly value: Buffer }[];
  /** The same for the IPv6 ports (BACKEND6_KEY_SIZE -> SLOT6_VALUE_SIZE). */
  readonly backends6: readonly { readonly key: Buffer; readonly value: Buffer }[];
}

const rol = (x: number, k: number): number => ((x << k) | (x >>> (32 - k))) >>> 0;

/** __jhash_final(a, b, c), then reciprocal_scale(c, mod): the slot. */
function finalScaled(a: number, b: number, c: number, mod: number): number {
  c = ((c ^ b) - rol(b, 14)) >>> 0;
  a = ((a ^ c) - rol(c, 11)) >>> 0;
  b = ((b ^ a) - rol(a, 25)) >>> 0;
  c = ((c ^ b) - rol(b, 16)) >>> 0;
  a = ((a ^ c) - rol(c, 4)) >>> 0;
  b = ((b ^ a) - rol(a, 14)) >>> 0;
  c = ((c ^ b) - rol(b, 24)) >>> 0;
  return Number((BigInt(c) * BigInt(mod)) >> 32n);
}

/**
 * The kernel's jhash() of nft's `ip saddr . th sport` key (8 bytes: the
 * address and the port in network order, two zero bytes), then
 * reciprocal_scale into `mod` slots: nft_jhash_eval, which the program below
 * computes too. `saddr` and `sport` as the wire has them (host numbers here).
 */
export function nftJhashSlot(saddr: number, sport: number, seed: number, mod: number): number {
  // jhash reads the bytes little-endian into its words (k[0] | k[1] << 8 ...).
  const w0 = (((saddr >>> 24) & 0xff) | (((saddr >>> 16) & 0xff) << 8) | (((saddr >>> 8) & 0xff) << 16) | ((saddr & 0xff) << 24)) >>> 0;
  const w1 = (((sport >>> 8) & 0xff) | ((sport & 0xff) << 8)) >>> 0;
  const init = (JHASH_INITVAL + JHASH_LEN + seed) >>> 0;
  return finalScaled((init + w0) >>> 0, (init + w1) >>> 0, init, mod);
}

/** A 4-byte little-endian word of `b` at `off` (how jhash reads its input on a little-endian CPU). */
const word = (b: Uint8Array, off: number): number => ((b[off]! | (b[off + 1]! << 8) | (b[off + 2]! << 16) | (b[off + 3]! << 24)) >>> 0);

/**
 * nftJhashSlot for IPv6: the kernel's jhash() of nft's `ip6 saddr . th
 * sport` key (20 bytes: the 16 address bytes, the port in network order, two
 * zero bytes): one 12-byte round (__jhash_mix), the last 8 bytes, then
 * __jhash_final and reciprocal_scale. `saddr` as the wire has it.
 */
export function nftJhashSlot6(saddr: Uint8Array, sport: number, seed: number, mod: number): number {
  if (saddr.length !== 16) throw new RangeError(`an IPv6 address is 16 bytes, not ${saddr.length}`);
  const init = (JHASH_INITVAL + JHASH6_LEN + seed) >>> 0;
  let a = (init + word(saddr, 0)) >>> 0;
  let b = (init + word(saddr, 4)) >>> 0;
  let c = (init + word(saddr, 8)) >>> 0;
  // __jhash_mix
  a = ((a - c) ^ rol(c, 4)) >>> 0; c = (c + b) >>> 0;
  b = ((b - a) ^ rol(a, 6)) >>> 0; a = (a + c) >>> 0;
  c = ((c - b) ^ rol(b, 8)) >>> 0; b = (b + a) >>> 0;
  a = ((a - c) ^ rol(c, 16)) >>> 0; c = (c + b) >>> 0;
  b = ((b - a) ^ rol(a, 19)) >>> 0; a = (a + c) >>> 0;
  c = ((c - b) ^ rol(b, 4)) >>> 0; b = (b + a) >>> 0;
  a = (a + word(saddr, 12)) >>> 0;
  b = (b + (((sport >>> 8) & 0xff) | ((sport & 0xff) << 8))) >>> 0;
  return finalScaled(a, b, c, mod);
}

function macBytes(mac: string): Buffer {
  const b = parseMac(mac);
  if (b === undefined) throw new Error(`not a MAC address: ${mac}`);
  return b;
}

/** The family of a port's VIP: 4 or 6. */
export function dsrPortFamily(p: Pick<DsrBpfPort, 'vip'>): 4 | 6 {
  if (parseIPv4(p.vip) !== undefined) return 4;
  if (parseAddress(p.vip)?.family === 'IPv6') return 6;
  throw new Error(`not an IP address: VIP ${p.vip}`);
}

/** An address of `family` as the wire has it (4 or 16 bytes). */
function ipBytes(address: string, family: 4 | 6, what: string): Buffer {
  if (family === 4) {
    const n = parseIPv4(address);
    if (n === undefined) throw new Error(`not an IPv4 address: ${what} ${address}`);
    return ipv4ToBytes(n);
  }
  const a = parseAddress(address);
  if (a?.family !== 'IPv6') throw new Error(`not an IPv6 address: ${what} ${address}`);
  return addressToBytes(a);
}

/** The maps' contents for these ports. */
export function dsrMaps(ports: readonly DsrBpfPort[]): DsrMaps {
  const slots: Buffer[] = [];
  const slots6: Buffer[] = [];
  const counters: { conns: string; toBackend: string }[] = [];
  const bases: number[] = [];
  const backends: { key: Buffer; value: Buffer }[] = [];
  const backends6: { key: Buffer; value: Buffer }[] = [];
  for (const p of ports) {
    const family = dsrPortFamily(p);
    const where = `${p.vip} ${p.protocol}/${p.port}`;
    if (p.slots.length === 0) throw new Error(`${where}: an empty slot table is not forwarded`);
    const [table, list, size] = family === 4 ? [slots, backends, SLOT_VALUE_SIZE] : [slots6, backends6, SLOT6_VALUE_SIZE];
    const alen = family === 4 ? 4 : 16;
    const first = counters.length;
    // One slot entry per backend ({ address, counter index }): the value of
    // each of its slots and of its entry in the backend map.
    const entries = p.backends.map((b, i) => {
      counters.push({ conns: b.conns, toBackend: b.toBackend });
      const address = ipBytes(b.address, family, `backend of ${where}:`);
      const key = Buffer.alloc(4 + alen);
      key.writeUInt32LE(table.length, 0);
      address.copy(key, 4);
      const value = Buffer.alloc(size);
      address.copy(value, 0);
      value.writeUInt32LE(first + i, alen);
      list.push({ key, value });
      return value;
    });
    bases.push(table.length);
    for (const i of p.slots) {
      const v = entries[i];
      if (v === undefined) throw new Error(`${where}: slot names backend ${i} of ${p.backends.length}`);
      table.push(v);
    }
  }
  return { slots, slots6, counters, bases, backends, backends6 };
}

// struct __sk_buff offsets (include/uapi/linux/bpf.h).
const SKB_LEN = 0;
const SKB_IFINDEX = 40;
const SKB_DATA = 76;
const SKB_DATA_END = 80;
// Frame offsets (Ethernet, then an IPv4 header without options).
const ETH_TYPE = 12;
const IP_VHL = 14;
const IP_FRAG = 20;
const IP_PROTO = 23;
const IP_SADDR = 26;
const IP_DADDR = 30;
const L4_SPORT = 34;
const L4_DPORT = 36;
const TCP_FLAGS = 47;
const ETH_HLEN = 14;
const AF_INET = 2;
// An IPv6 frame: Ethernet, then the fixed 40-byte header, then TCP or UDP
// directly (an extension header or a fragment header is not ours).
const IP6_VER = 14;
const IP6_NEXT = 20;
const IP6_SADDR = 22;
const IP6_DADDR = 38;
const L4_SPORT6 = 54;
const L4_DPORT6 = 56;
const TCP_FLAGS6 = 67;
const AF_INET6 = 10;

/** A 32-bit value as the program loads those bytes (a little-endian load of network-order bytes), as a signed immediate. */
function le32(bytes: Buffer, off = 0): number {
  return bytes.readInt32LE(off);
}
function le16(bytes: Buffer, off = 0): number {
  return bytes.readUInt16LE(off);
}

/** The descriptors of the maps a program refers to. */
export interface DsrProgramMaps {
  readonly slots: number;
  readonly counters: number;
  readonly flows: number;
  readonly backends: number;
  /** The IPv6 maps: needed when a port's VIP is IPv6. */
  readonly slots6?: number | undefined;
  readonly flows6?: number | undefined;
  readonly backends6?: number | undefined;
}

// Stack: the flow key at fp-40 (12 bytes), a flow value at fp-48, a backend
// key at fp-56; the redirect's struct at fp-24, map keys at fp-4 / fp-8.
// IPv6: the flow key at fp-96 (36 bytes), a flow value at fp-120 (20), a
// backend key at fp-144 (20).
const FP_FLOW_KEY = -40;
const FP_FLOW_VALUE = -48;
const FP_BACKEND_KEY = -56;
const FP6_FLOW_KEY = -96;
const FP6_FLOW_VALUE = -120;
const FP6_BACKEND_KEY = -144;

/**
 * The program for these ports, given the maps' descriptors. Registers:
 * r6 = ctx, r7 = frame start, r8/r9 = per-port slot count and first key
 * (then the slot entry), r1-r5 scratch (clobbered by helper calls).
 */
export function dsrProgram(ports: readonly DsrBpfPort[], fds: DsrProgramMaps): Buffer {
  const { bases } = dsrMaps(ports);
  const v4 = ports.flatMap((p, i) => (dsrPortFamily(p) === 4 ? [{ p, base: bases[i]! }] : []));
  const v6 = ports.flatMap((p, i) => (dsrPortFamily(p) === 6 ? [{ p, base: bases[i]! }] : []));
  const a = new EbpfAsm();
  a.mov64r(6, 1)
    .ldx('w', 7, 6, SKB_DATA)
    .ldx('w', 8, 6, SKB_DATA_END)
    .mov64r(2, 7).alu64('add', 2, L4_DPORT + 2)
    .jmpr('jgt', 2, 8, 'pass') // too short for Ethernet + IPv4 + ports
    .ldx('h', 2, 7, ETH_TYPE);
  if (v6.length > 0) a.jmp('jeq', 2, le16(Buffer.from([0x86, 0xdd])), 'ip6');
  a.jmp('jne', 2, le16(Buffer.from([0x08, 0x00])), 'pass')
    .ldx('b', 2, 7, IP_VHL).jmp('jne', 2, 0x45, 'pass') // IPv4 without options
    .ldx('h', 2, 7, IP_FRAG).jmp('jset', 2, le16(Buffer.from([0x3f, 0xff])), 'pass') // MF or an offset: a fragment
    .ldx('w', 2, 7, IP_DADDR)
    .ldx('h', 3, 7, L4_DPORT)
    .ldx('b', 4, 7, IP_PROTO)
    .ldx('w', 5, 7, 0); // destination MAC, first four bytes
  v4.forEach(({ p, base }, i) => {
    const next = `port${i + 1}`;
    const mac = macBytes(p.mac);
    const port = Buffer.alloc(2);
    port.writeUInt16BE(p.port);
    a.jmp32('jne', 2, le32(ipBytes(p.vip, 4, 'VIP')), next)
      .jmp('jne', 3, le16(port), next)
      .jmp('jne', 4, p.protocol === 'TCP' ? 6 : 17, next)
      .jmp32('jne', 5, le32(mac), next)
      .ldx('h', 1, 7, 4).jmp('jne', 1, le16(mac, 4), next)
      .mov32(1, (JHASH_INITVAL + JHASH_LEN + p.seed) | 0)
      .mov64(8, p.slots.length)
      .mov64(9, base)
      .ja('hash')
      .label(next);
  });
  a.label('pass').mov64(0, TCX_NEXT).exit();
  // A half with no port would be unreachable code, which the verifier refuses.
  if (v4.length > 0 || v6.length === 0) ip4(a, fds);
  if (v6.length > 0) ip6(a, v6, fds);
  return a.assemble();
}

/**
 * __jhash_final(a = r1, b = r2, c = r3), r4/r5 scratch (x ^= y; x -= rol32(y, k)),
 * then reciprocal_scale(c, M = r8) = (u64)c * M >> 32 plus the port's first
 * key (r9): r8 = that slot's entry in `slots`.
 */
function finalToSlot(a: EbpfAsm, slots: number): void {
  const step = (x: 1 | 2 | 3, y: 1 | 2 | 3, k: number): void => {
    a.alu32r('xor', x, y).rol32(4, y, k, 5).alu32r('sub', x, 4);
  };
  step(3, 2, 14); step(1, 3, 11); step(2, 1, 25); step(3, 2, 16); step(1, 3, 4); step(2, 1, 14); step(3, 2, 24);
  a.alu64r('mul', 3, 8).alu64('rsh', 3, 32).alu64r('add', 3, 9)
    .stx('w', 10, -4, 3)
    .ldMapFd(1, slots).mov64r(2, 10).alu64('add', 2, -4)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'pass') // cannot happen (key < entries); the verifier wants the check
    .mov64r(8, 0);
}

/** On to `otherwise` unless the frame is TCP (protocol byte at `proto`) with its flags byte (at `flags`) inside the frame. */
function tcpOnly(a: EbpfAsm, proto: number, flags: number, otherwise: string): void {
  a.ldx('b', 1, 7, proto).jmp('jne', 1, 6, otherwise)
    .mov64r(2, 7).alu64('add', 2, flags + 1).ldx('w', 3, 6, SKB_DATA_END)
    .jmpr('jgt', 2, 3, otherwise);
}

/**
 * Counters, at `label`: packets and bytes always, SYNs (a SYN without ACK)
 * on TCP, into the entry whose index the slot entry (r8) holds at `index`;
 * then on to `next`.
 */
function count(a: EbpfAsm, o: { label: string; next: string; index: number; proto: number; flags: number; counters: number }): void {
  a.label(o.label)
    .ldx('w', 2, 8, o.index).stx('w', 10, -8, 2)
    .ldMapFd(1, o.counters).mov64r(2, 10).alu64('add', 2, -8)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, o.next)
    .mov64(1, 1).atomicAdd64(0, 8, 1)
    .ldx('w', 1, 6, SKB_LEN).alu64('add', 1, -ETH_HLEN).atomicAdd64(0, 16, 1);
  tcpOnly(a, o.proto, o.flags, o.next);
  a.ldx('b', 1, 7, o.flags).alu64('and', 1, 0x12).jmp('jne', 1, 0x02, o.next)
    .mov64(1, 1).atomicAdd64(0, 0, 1);
}

/** The IPv4 half, from the hash on (the port's match set r1, r8 and r9). */
function ip4(a: EbpfAsm, fds: DsrProgramMaps): void {
  // jhash(saddr . sport . 0 0, 8, seed): a = b = c = initval (r1); a += word 0, b += word 1.
  a.label('hash')
    .mov32r(2, 1).mov32r(3, 1)
    .ldx('w', 4, 7, IP_SADDR).alu32r('add', 1, 4)
    .ldx('h', 4, 7, L4_SPORT).alu32r('add', 2, 4);
  finalToSlot(a, fds.slots);
  // Per-flow state, TCP only: r8 = the hash's slot entry, r9 = the port's first key.
  tcpOnly(a, IP_PROTO, TCP_FLAGS, 'count');
  a.ldx('w', 1, 7, IP_SADDR).stx('w', 10, FP_FLOW_KEY, 1)
    .ldx('w', 1, 7, IP_DADDR).stx('w', 10, FP_FLOW_KEY + 4, 1)
    .ldx('w', 1, 7, L4_SPORT).stx('w', 10, FP_FLOW_KEY + 8, 1)
    .ldx('b', 1, 7, TCP_FLAGS).alu64('and', 1, 0x12).jmp('jeq', 1, 0x02, 'record') // opens a connection: the hash places it
    .ldMapFd(1, fds.flows).mov64r(2, 10).alu64('add', 2, FP_FLOW_KEY)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'record') // not placed yet (or evicted): the hash places it
    .ldx('w', 1, 0, 0).ldx('w', 2, 8, 0)
    .jmpr('jeq', 1, 2, 'count') // placed where the hash points now
    .stx('w', 10, FP_BACKEND_KEY, 9).stx('w', 10, FP_BACKEND_KEY + 4, 1)
    .ldMapFd(1, fds.backends).mov64r(2, 10).alu64('add', 2, FP_BACKEND_KEY)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'record') // its backend left the healthy set: the hash places it again
    .mov64r(8, 0)
    .ja('count')
    .label('record')
    .ldx('w', 1, 8, 0).stx('w', 10, FP_FLOW_VALUE, 1).st('w', 10, FP_FLOW_VALUE + 4, 0)
    .ldMapFd(1, fds.flows).mov64r(2, 10).alu64('add', 2, FP_FLOW_KEY)
    .mov64r(3, 10).alu64('add', 3, FP_FLOW_VALUE).mov64(4, 0)
    .call(BPF_FUNC_MAP_UPDATE_ELEM); // full: the kernel evicts the least recently used; a failure only leaves the flow to the hash
  count(a, { label: 'count', next: 'redirect', index: 4, proto: IP_PROTO, flags: TCP_FLAGS, counters: fds.counters });
  // bpf_redirect_neigh(ifindex, &{ AF_INET, backend }, 20, 0): struct bpf_redir_neigh at fp-24.
  a.label('redirect')
    .st('w', 10, -24, AF_INET)
    .ldx('w', 1, 8, 0).stx('w', 10, -20, 1)
    .st('w', 10, -16, 0).st('w', 10, -12, 0).st('w', 10, -8, 0)
    .ldx('w', 1, 6, SKB_IFINDEX)
    .mov64r(2, 10).alu64('add', 2, -24)
    .mov64(3, 20).mov64(4, 0)
    .call(BPF_FUNC_REDIRECT_NEIGH)
    .exit();
}

/**
 * The IPv6 half (the frame's ethertype is 0x86dd): the same steps as the
 * IPv4 half above over the IPv6 maps, with nft's jhash of `ip6 saddr . th
 * sport` (20 bytes) and a redirect with an IPv6 nexthop. Only a frame whose
 * next header is TCP or UDP is ours: an extension header (a fragment header
 * among them) passes to the table, whose `meta l4proto` and `th` walk the
 * extension headers, with the same hash and slots. Registers as above.
 */
function ip6(a: EbpfAsm, ports: readonly { p: DsrBpfPort; base: number }[], fds: DsrProgramMaps): void {
  const { slots6, flows6, backends6 } = fds;
  if (slots6 === undefined || flows6 === undefined || backends6 === undefined) throw new Error('an IPv6 port needs the IPv6 maps (slots6, flows6, backends6)');
  a.label('ip6')
    .mov64r(2, 7).alu64('add', 2, L4_DPORT6 + 2)
    .jmpr('jgt', 2, 8, 'pass') // too short for Ethernet + IPv6 + ports
    .ldx('b', 2, 7, IP6_VER).alu64('and', 2, 0xf0).jmp('jne', 2, 0x60, 'pass')
    .ldx('w', 2, 7, IP6_DADDR) // the VIP's first word; the other three are compared once it matches
    .ldx('h', 3, 7, L4_DPORT6)
    .ldx('b', 4, 7, IP6_NEXT)
    .ldx('w', 5, 7, 0);
  ports.forEach(({ p, base }, i) => {
    const next = `port6_${i + 1}`;
    const mac = macBytes(p.mac);
    const vip = ipBytes(p.vip, 6, 'VIP');
    const port = Buffer.alloc(2);
    port.writeUInt16BE(p.port);
    a.jmp32('jne', 2, le32(vip, 0), next)
      .jmp('jne', 3, le16(port), next)
      .jmp('jne', 4, p.protocol === 'TCP' ? 6 : 17, next)
      .jmp32('jne', 5, le32(mac), next)
      .ldx('h', 1, 7, 4).jmp('jne', 1, le16(mac, 4), next);
    for (const w of [4, 8, 12]) a.ldx('w', 1, 7, IP6_DADDR + w).jmp32('jne', 1, le32(vip, w), next);
    a.mov32(1, (JHASH_INITVAL + JHASH6_LEN + p.seed) | 0)
      .mov64(8, p.slots.length)
      .mov64(9, base)
      .ja('hash6')
      .label(next);
  });
  a.ja('pass');

  // jhash(saddr . sport . 0 0, 20, seed): a = b = c = initval (r1); one
  // 12-byte round (a, b, c += words 0-2; __jhash_mix), then a += word 3,
  // b += word 4 (the port), __jhash_final.
  a.label('hash6')
    .mov32r(2, 1).mov32r(3, 1)
    .ldx('w', 4, 7, IP6_SADDR).alu32r('add', 1, 4)
    .ldx('w', 4, 7, IP6_SADDR + 4).alu32r('add', 2, 4)
    .ldx('w', 4, 7, IP6_SADDR + 8).alu32r('add', 3, 4);
  // __jhash_mix: x -= z; x ^= rol32(z, k); z += y.
  const mix = (x: 1 | 2 | 3, z: 1 | 2 | 3, y: 1 | 2 | 3, k: number): void => {
    a.alu32r('sub', x, z).rol32(4, z, k, 5).alu32r('xor', x, 4).alu32r('add', z, y);
  };
  mix(1, 3, 2, 4); mix(2, 1, 3, 6); mix(3, 2, 1, 8); mix(1, 3, 2, 16); mix(2, 1, 3, 19); mix(3, 2, 1, 4);
  a.ldx('w', 4, 7, IP6_SADDR + 12).alu32r('add', 1, 4)
    .ldx('h', 4, 7, L4_SPORT6).alu32r('add', 2, 4);
  finalToSlot(a, slots6);
  // 16 bytes from (src + from) to the stack at fp + to, through r1.
  const copy16 = (src: 0 | 7 | 8, from: number, to: number): void => {
    for (let w = 0; w < 16; w += 4) a.ldx('w', 1, src, from + w).stx('w', 10, to + w, 1);
  };
  // Per-flow state, TCP only: r8 = the hash's slot entry, r9 = the port's first key.
  tcpOnly(a, IP6_NEXT, TCP_FLAGS6, 'count6');
  copy16(7, IP6_SADDR, FP6_FLOW_KEY);
  copy16(7, IP6_DADDR, FP6_FLOW_KEY + 16);
  a.ldx('w', 1, 7, L4_SPORT6).stx('w', 10, FP6_FLOW_KEY + 32, 1)
    .ldx('b', 1, 7, TCP_FLAGS6).alu64('and', 1, 0x12).jmp('jeq', 1, 0x02, 'record6') // opens a connection: the hash places it
    .ldMapFd(1, flows6).mov64r(2, 10).alu64('add', 2, FP6_FLOW_KEY)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'record6'); // not placed yet (or evicted): the hash places it
  for (let w = 0; w < 16; w += 4) a.ldx('w', 1, 0, w).ldx('w', 2, 8, w).jmpr('jne', 1, 2, 'moved6');
  a.ja('count6') // placed where the hash points now
    .label('moved6')
    .stx('w', 10, FP6_BACKEND_KEY, 9);
  copy16(0, 0, FP6_BACKEND_KEY + 4);
  a.ldMapFd(1, backends6).mov64r(2, 10).alu64('add', 2, FP6_BACKEND_KEY)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'record6') // its backend left the healthy set: the hash places it again
    .mov64r(8, 0)
    .ja('count6')
    .label('record6');
  copy16(8, 0, FP6_FLOW_VALUE);
  a.st('w', 10, FP6_FLOW_VALUE + 16, 0)
    .ldMapFd(1, flows6).mov64r(2, 10).alu64('add', 2, FP6_FLOW_KEY)
    .mov64r(3, 10).alu64('add', 3, FP6_FLOW_VALUE).mov64(4, 0)
    .call(BPF_FUNC_MAP_UPDATE_ELEM); // full: the kernel evicts the least recently used; a failure only leaves the flow to the hash
  count(a, { label: 'count6', next: 'redirect6', index: 16, proto: IP6_NEXT, flags: TCP_FLAGS6, counters: fds.counters });
  // bpf_redirect_neigh(ifindex, &{ AF_INET6, backend }, 20, 0): struct bpf_redir_neigh at fp-24.
  a.label('redirect6')
    .st('w', 10, -24, AF_INET6);
  copy16(8, 0, -20);
  a.ldx('w', 1, 6, SKB_IFINDEX)
    .mov64r(2, 10).alu64('add', 2, -24)
    .mov64(3, 20).mov64(4, 0)
    .call(BPF_FUNC_REDIRECT_NEIGH)
    .exit();
}
