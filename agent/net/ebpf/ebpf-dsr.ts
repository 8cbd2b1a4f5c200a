// Direct server return as an eBPF program at tc ingress, PURE:
// the maps' contents and the program's instructions for a DSR plan. The
// driver (ebpf-attach.ts) creates the maps, loads and attaches; nothing here
// touches the kernel.
//
// It is an accelerator in front of `table netdev lb_agent` (nft-dsr.ts) and
// does exactly what that table does, from the same per-port plan:
//   frame to (dst MAC, VIP, protocol, port) of a forwarded DSR port
//     -> jhash(client address . client port, seed) mod M  (nft's own jhash:
//        the same 8 bytes - address, port, two zero pad bytes - the same
//        initval and the same reciprocal_scale as nft_jhash_eval, so a flow
//        lands in the same slot of the same maglev table whichever engine
//        serves it, and a switch between them moves no flow)
//     -> slot -> backend -> counters (SYNs, packets, bytes)
//     -> bpf_redirect_neigh(ingress device, nexthop = backend): the kernel's
//        neighbour table fills in the backend's MAC and ours and the frame
//        leaves by the device it came in on, IP header untouched, as nft's
//        `fwd ip to B device <parent>` does (minus the TTL decrement).
// Anything else - another MAC or VIP or port, not IPv4, IP options, a
// fragment, a frame too short - returns TCX_NEXT: on to any later tc program,
// the nft table and the stack, which decide as before (the nft table handles what we pass on,
// e.g. an IP header with options, with the same hash and table).
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
// A TCP frame that opens a connection (SYN without ACK) takes the hash's
// pick, which is recorded; any other TCP frame goes where its flow was
// placed if that backend is still among the port's healthy ones, else to the
// hash's pick, which is recorded. So new connections follow the current
// weights, open ones stay, and one whose backend left moves as before. UDP
// has no opening frame to re-place a flow on, so it stays with the hash.
import { ipv4ToBytes, parseIPv4, parseMac } from '../../address';
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
/** The kernel's JHASH_INITVAL (include/linux/jhash.h). */
const JHASH_INITVAL = 0xdeadbeef;
/** nft hashes `ip saddr . th sport` as 8 bytes: the port is padded to a 4-byte register. */
const JHASH_LEN = 8;

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
  /** Slot map entries, in key order (key = index). */
  readonly slots: Buffer[];
  /** Counter map size, and the nft counter names each entry adds to. */
  readonly counters: readonly { readonly conns: string; readonly toBackend: string }[];
  /** The first slot key of each port. */
  readonly bases: readonly number[];
  /** Backend map entries: (port's first slot key, backend address) -> its slot entry. */
  readonly backends: readonly { readonly key: Buffer; readonly value: Buffer }[];
}

const rol = (x: number, k: number): number => ((x << k) | (x >>> (32 - k))) >>> 0;

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
  let a = (init + w0) >>> 0;
  let b = (init + w1) >>> 0;
  let c = init;
  // __jhash_final
  c = ((c ^ b) - rol(b, 14)) >>> 0;
  a = ((a ^ c) - rol(c, 11)) >>> 0;
  b = ((b ^ a) - rol(a, 25)) >>> 0;
  c = ((c ^ b) - rol(b, 16)) >>> 0;
  a = ((a ^ c) - rol(c, 4)) >>> 0;
  b = ((b ^ a) - rol(a, 14)) >>> 0;
  c = ((c ^ b) - rol(b, 24)) >>> 0;
  return Number((BigInt(c) * BigInt(mod)) >> 32n);
}

function macBytes(mac: string): Buffer {
  const b = parseMac(mac);
  if (b === undefined) throw new Error(`not a MAC address: ${mac}`);
  return b;
}

function ipBytes(address: string): Buffer {
  const n = parseIPv4(address);
  if (n === undefined) throw new Error(`not an IPv4 address: ${address}`);
  return ipv4ToBytes(n);
}

/** The maps' contents for these ports. */
export function dsrMaps(ports: readonly DsrBpfPort[]): DsrMaps {
  const slots: Buffer[] = [];
  const counters: { conns: string; toBackend: string }[] = [];
  const bases: number[] = [];
  const backends: { key: Buffer; value: Buffer }[] = [];
  for (const p of ports) {
    if (p.slots.length === 0) throw new Error(`${p.vip} ${p.protocol}/${p.port}: an empty slot table is not forwarded`);
    const first = counters.length;
    // One slot entry per backend ({ address, counter index }): the value of
    // each of its slots and of its entry in the backend map.
    const entries = p.backends.map((b, i) => {
      counters.push({ conns: b.conns, toBackend: b.toBackend });
      const address = ipBytes(b.address);
      const key = Buffer.alloc(BACKEND_KEY_SIZE);
      key.writeUInt32LE(slots.length, 0);
      address.copy(key, 4);
      const value = Buffer.alloc(SLOT_VALUE_SIZE);
      address.copy(value, 0);
      value.writeUInt32LE(first + i, 4);
      backends.push({ key, value });
      return value;
    });
    bases.push(slots.length);
    for (const i of p.slots) {
      const v = entries[i];
      if (v === undefined) throw new Error(`${p.vip} ${p.protocol}/${p.port}: slot names backend ${i} of ${p.backends.length}`);
      slots.push(v);
    }
  }
  return { slots, counters, bases, backends };
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
}

// Stack: the flow key at fp-40 (12 bytes), a flow value at fp-48, a backend
// key at fp-56; the redirect's struct at fp-24, map keys at fp-4 / fp-8.
const FP_FLOW_KEY = -40;
const FP_FLOW_VALUE = -48;
const FP_BACKEND_KEY = -56;

/**
 * The program for these ports, given the maps' descriptors. Registers:
 * r6 = ctx, r7 = frame start, r8/r9 = per-port slot count and first key
 * (then the slot entry), r1-r5 scratch (clobbered by helper calls).
 */
export function dsrProgram(ports: readonly DsrBpfPort[], fds: DsrProgramMaps): Buffer {
  const { bases } = dsrMaps(ports);
  const a = new EbpfAsm();
  a.mov64r(6, 1)
    .ldx('w', 7, 6, SKB_DATA)
    .ldx('w', 8, 6, SKB_DATA_END)
    .mov64r(2, 7).alu64('add', 2, L4_DPORT + 2)
    .jmpr('jgt', 2, 8, 'pass') // too short for Ethernet + IPv4 + ports
    .ldx('h', 2, 7, ETH_TYPE).jmp('jne', 2, le16(Buffer.from([0x08, 0x00])), 'pass')
    .ldx('b', 2, 7, IP_VHL).jmp('jne', 2, 0x45, 'pass') // IPv4 without options
    .ldx('h', 2, 7, IP_FRAG).jmp('jset', 2, le16(Buffer.from([0x3f, 0xff])), 'pass') // MF or an offset: a fragment
    .ldx('w', 2, 7, IP_DADDR)
    .ldx('h', 3, 7, L4_DPORT)
    .ldx('b', 4, 7, IP_PROTO)
    .ldx('w', 5, 7, 0); // destination MAC, first four bytes
  ports.forEach((p, i) => {
    const next = `port${i + 1}`;
    const mac = macBytes(p.mac);
    const port = Buffer.alloc(2);
    port.writeUInt16BE(p.port);
    a.jmp32('jne', 2, le32(ipBytes(p.vip)), next)
      .jmp('jne', 3, le16(port), next)
      .jmp('jne', 4, p.protocol === 'TCP' ? 6 : 17, next)
      .jmp32('jne', 5, le32(mac), next)
      .ldx('h', 1, 7, 4).jmp('jne', 1, le16(mac, 4), next)
      .mov32(1, (JHASH_INITVAL + JHASH_LEN + p.seed) | 0)
      .mov64(8, p.slots.length)
      .mov64(9, bases[i]!)
      .ja('hash')
      .label(next);
  });
  a.label('pass').mov64(0, TCX_NEXT).exit();

  // jhash(saddr . sport . 0 0, 8, seed): a = b = c = initval (r1); a += word 0, b += word 1.
  a.label('hash')
    .mov32r(2, 1).mov32r(3, 1)
    .ldx('w', 4, 7, IP_SADDR).alu32r('add', 1, 4)
    .ldx('h', 4, 7, L4_SPORT).alu32r('add', 2, 4);
  // __jhash_final(a = r1, b = r2, c = r3), r4/r5 scratch: x ^= y; x -= rol32(y, k).
  const step = (x: 1 | 2 | 3, y: 1 | 2 | 3, k: number): void => {
    a.alu32r('xor', x, y).rol32(4, y, k, 5).alu32r('sub', x, 4);
  };
  step(3, 2, 14); step(1, 3, 11); step(2, 1, 25); step(3, 2, 16); step(1, 3, 4); step(2, 1, 14); step(3, 2, 24);
  // reciprocal_scale(c, M) = (u64)c * M >> 32, then the port's first key.
  a.alu64r('mul', 3, 8).alu64('rsh', 3, 32).alu64r('add', 3, 9)
    .stx('w', 10, -4, 3)
    .ldMapFd(1, fds.slots).mov64r(2, 10).alu64('add', 2, -4)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'pass') // cannot happen (key < entries); the verifier wants the check
    .mov64r(8, 0);
  // Per-flow state, TCP only: r8 = the hash's slot entry, r9 = the port's first key.
  a.ldx('b', 1, 7, IP_PROTO).jmp('jne', 1, 6, 'count')
    .mov64r(2, 7).alu64('add', 2, TCP_FLAGS + 1).ldx('w', 3, 6, SKB_DATA_END)
    .jmpr('jgt', 2, 3, 'count')
    .ldx('w', 1, 7, IP_SADDR).stx('w', 10, FP_FLOW_KEY, 1)
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
  // Counters: packets and bytes always, SYNs (a SYN without ACK) on TCP.
  a.label('count')
    .ldx('w', 2, 8, 4).stx('w', 10, -8, 2)
    .ldMapFd(1, fds.counters).mov64r(2, 10).alu64('add', 2, -8)
    .call(BPF_FUNC_MAP_LOOKUP_ELEM)
    .jmp('jeq', 0, 0, 'redirect')
    .mov64(1, 1).atomicAdd64(0, 8, 1)
    .ldx('w', 1, 6, SKB_LEN).alu64('add', 1, -ETH_HLEN).atomicAdd64(0, 16, 1)
    .ldx('b', 1, 7, IP_PROTO).jmp('jne', 1, 6, 'redirect')
    .mov64r(2, 7).alu64('add', 2, TCP_FLAGS + 1).ldx('w', 3, 6, SKB_DATA_END)
    .jmpr('jgt', 2, 3, 'redirect')
    .ldx('b', 1, 7, TCP_FLAGS).alu64('and', 1, 0x12).jmp('jne', 1, 0x02, 'redirect')
    .mov64(1, 1).atomicAdd64(0, 0, 1);
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
  return a.assemble();
}
