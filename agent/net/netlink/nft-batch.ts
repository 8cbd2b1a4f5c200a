// nftables transactions over nfnetlink: the codec of one batch (pure) and a
// writer that sends it on a NETLINK_NETFILTER socket of its own and reads
// every acknowledgement. The kernel path writes the small deltas of a
// health transition here instead of spawning `nft -f` (a fork of the whole
// agent, and an nft that loads its cache of the whole table first).
//
// A batch is NFNL_MSG_BATCH_BEGIN, the nf_tables messages, NFNL_MSG_BATCH_END
// in one datagram; the kernel runs it as one transaction
// (nfnetlink_rcv_batch): an error in any message aborts all of them, and
// the replies (one NLMSG_ERROR per message asking NLM_F_ACK, errno 0 for
// success) are delivered after the commit or the abort.
//
// It encodes exactly what the kernel path's incremental updates of a
// service hold, laid out as nft 1.0.6 (libnftnl) lays them out, checked
// byte for byte against frames nft sent (test/net/netlink/golden):
// - chains added, flushed (NFT_MSG_DELRULE with no handle) and deleted;
// - rules: `goto C`; `numgen inc mod N vmap { 0 : goto C0, ... }` and
//   `jhash ip saddr . th sport mod N seed S vmap { ... }` (an anonymous
//   constant map created in the batch and looked up by its transaction
//   id); `counter name "X" meta l4proto P dnat to A:port`;
// - elements of the dispatch maps (`ipvX_addr . inet_proto . inet_service
//   : verdict`): a concatenated key is each field padded to 4 bytes,
//   addresses and ports in network byte order;
// - named counters added and deleted (NFT_MSG_NEWOBJ, NFT_MSG_DELOBJ of
//   NFT_OBJECT_COUNTER), and elements of the byte-counter maps
//   (`ipvX_addr . ipvX_addr . inet_proto . inet_service : counter`), whose
//   value is the counter's name (NFTA_SET_ELEM_OBJREF);
// - addresses added to and deleted from a set of addresses (`vips`);
// - a port's slot map (`typeof numgen inc mod 2 : ipX daddr . P dport`,
//   slot -> address . port) added and deleted, its elements (the slot an
//   integer in host byte order, the data address and port each padded to
//   4 bytes), the rule that DNATs by it (`meta l4proto P dnat ipX to
//   numgen inc mod M map @m`, or the seeded jhash), and a DNAT rule with
//   no counter.
import * as net from 'node:net';
import * as os from 'node:os';
import { RawNetlinkSocket } from './netlink-socket';
import { NETLINK_NETFILTER } from './nft-watch';
import { NFPROTO, attr } from './nft-counters';

const NFNL_SUBSYS_NFTABLES = 10;
const NFNL_MSG_BATCH_BEGIN = 0x10;
const NFNL_MSG_BATCH_END = 0x11;
const NFT_MSG_NEWCHAIN = 3;
const NFT_MSG_DELCHAIN = 5;
const NFT_MSG_NEWRULE = 6;
const NFT_MSG_DELRULE = 8;
const NFT_MSG_NEWSET = 9;
const NFT_MSG_DELSET = 11;
const NFT_MSG_NEWSETELEM = 12;
const NFT_MSG_DELSETELEM = 14;
const NFT_MSG_NEWOBJ = 18;
const NFT_MSG_DELOBJ = 20;
const NLM_F_REQUEST = 0x1;
const NLM_F_ACK = 0x4;
const NLM_F_APPEND = 0x800;
const NLM_F_CREATE = 0x400;
const NLMSG_ERROR = 2;
const NLMSG_HDRLEN = 16;
const NLA_F_NESTED = 0x8000;

// linux/netfilter/nf_tables.h
const NFTA_TABLE = 1; // NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE, NFTA_SET_ELEM_LIST_TABLE
const NFTA_CHAIN_NAME = 3;
const NFTA_RULE_CHAIN = 2;
const NFTA_RULE_EXPRESSIONS = 4;
const NFTA_SET_NAME = 2;
const NFTA_SET_FLAGS = 3;
const NFTA_SET_KEY_TYPE = 4;
const NFTA_SET_KEY_LEN = 5;
const NFTA_SET_DATA_TYPE = 6;
const NFTA_SET_DATA_LEN = 7;
const NFTA_SET_DESC = 9;
const NFTA_SET_DESC_SIZE = 1;
const NFTA_SET_ID = 10;
const NFTA_SET_USERDATA = 13;
const NFTA_SET_ELEM_LIST_SET = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS = 3;
const NFTA_SET_ELEM_LIST_SET_ID = 4;
const NFTA_LIST_ELEM = 1;
const NFTA_SET_ELEM_KEY = 1;
const NFTA_SET_ELEM_DATA = 2;
const NFTA_SET_ELEM_OBJREF = 9;
const NFTA_OBJ_NAME = 2;
const NFTA_OBJ_TYPE = 3;
const NFTA_OBJ_DATA = 4;
const NFTA_COUNTER_BYTES = 1;
const NFTA_COUNTER_PACKETS = 2;
const NFTA_DATA_VALUE = 1;
const NFTA_DATA_VERDICT = 2;
const NFTA_VERDICT_CODE = 1;
const NFTA_VERDICT_CHAIN = 2;
const NFTA_EXPR_NAME = 1;
const NFTA_EXPR_DATA = 2;
const NFT_SET_ANONYMOUS = 0x1;
const NFT_SET_CONSTANT = 0x2;
const NFT_SET_MAP = 0x8;
/** nft's datatype of an integer key (TYPE_INTEGER) and the verdict data type (NFT_DATA_VERDICT). */
const TYPE_INTEGER = 4;
const NFT_DATA_VERDICT = 0xffffff00;
const NFT_REG_VERDICT = 0;
const NFT_REG_1 = 1;
const NFT_REG_2 = 2;
const NFT_META_L4PROTO = 16;
const NFT_CMP_EQ = 0;
const NFT_NG_INCREMENTAL = 0;
const NFT_NAT_DNAT = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED = 0x2;
const NFT_OBJECT_COUNTER = 1;
const VERDICT_CODE = { drop: 0, jump: -3, goto: -4 } as const;
const IPPROTO = { tcp: 6, udp: 17 } as const;
/**
 * The set userdata nft writes for the anonymous map of `numgen ... vmap`
 * (libnftnl's NFTNL_UDATA_SET_*: key byte order host, data byte order,
 * the key's typeof, merge flag): written as nft writes it, `nft list`
 * prints the map the agent wrote as it prints its own.
 */
const NUMGEN_MAP_USERDATA = Buffer.from('00040100000001040000000004080004010000000100060400000000', 'hex');

/**
 * The set userdata nft writes for a port's slot map (`typeof numgen inc mod
 * 2 : ip[6] daddr . tcp|udp dport`): key byte order host, data byte order
 * network, the key's typeof (numgen) and the data's (a concatenation of
 * two payload expressions: the network header's destination address, the
 * transport header's destination port). Two bytes depend on the family
 * (the network header's protocol and the address's field) and one on the
 * transport protocol.
 */
function slotMapUserdata(family: NftFamily, proto: NftProto): Buffer {
  const ip = family === 'ip' ? '0c00040c00000001040c' : '0c00040d000000010409';
  const tp = proto === 'tcp' ? '08' : '06';
  return Buffer.from(`000401000000010400000000031a0004170000000112000400000000010402000000020400000000043400040d000000012c001400040700000001${ip}000000011400040700000001`
    + `0c0004${tp}000000010402000000060400000000`, 'hex');
}
/** nft's concatenated data type `ipvX_addr . inet_service` (TYPE_IPADDR 7 or TYPE_IP6ADDR 8, then TYPE_INET_SERVICE 13, 6 bits each). */
const SLOT_DATA_TYPE = { ip: (7 << 6) | 13, ip6: (8 << 6) | 13 } as const;

export type NftFamily = 'ip' | 'ip6';
export type NftProto = 'tcp' | 'udp';

/** A verdict: `jump C`, `goto C` or `drop`. */
export type NftVerdict = { readonly kind: 'jump' | 'goto'; readonly chain: string } | { readonly kind: 'drop' };

/** An element of a dispatch map (`ipvX_addr . inet_proto . inet_service : verdict`); no verdict when deleted. */
export interface NftDispatchElement {
  readonly vip: string;
  readonly proto: NftProto;
  readonly port: number;
  readonly verdict?: NftVerdict;
}

/** An element of a byte-counter map (`ipvX_addr . ipvX_addr . inet_proto . inet_service : counter`); no counter when deleted. */
export interface NftCounterElement {
  readonly vip: string;
  readonly backend: string;
  readonly proto: NftProto;
  readonly port: number;
  /** The named counter the element refers to. */
  readonly counter?: string;
}

/** An element of a port's slot map (`slot : address . port`); no address when deleted. */
export interface NftSlotElement {
  readonly slot: number;
  readonly address?: string;
  readonly port?: number;
}

/** The pick of a slot: `numgen inc mod M`, or `jhash ip[6] saddr . th sport mod M seed S`. */
export type NftSlotPick = { readonly kind: 'numgen'; readonly modulus: number } | { readonly kind: 'jhash'; readonly seed: number; readonly modulus: number };

/** A rule of the forms the incremental path writes. */
export type NftRuleSpec =
  /** `goto C` */
  | { readonly kind: 'verdict'; readonly verdict: NftVerdict }
  /** `numgen inc mod N vmap { 0 : goto targets[0], ... }` (N = targets.length) */
  | { readonly kind: 'numgen'; readonly targets: readonly string[] }
  /** `jhash ip[6] saddr . th sport mod N seed S vmap { 0 : goto targets[0], ... }` (N = targets.length) */
  | { readonly kind: 'jhash'; readonly seed: number; readonly targets: readonly string[] }
  /** `[counter name "counter"] meta l4proto proto dnat to address:port` */
  | { readonly kind: 'dnat'; readonly counter?: string; readonly proto: NftProto; readonly address: string; readonly port: number }
  /** `meta l4proto proto dnat ip[6] to <pick> map @map` (the map's id when it is created in the same batch, as nft gives it) */
  | { readonly kind: 'dnat-map'; readonly proto: NftProto; readonly pick: NftSlotPick; readonly map: string; readonly setId?: number };

/** One step of an incremental update, in a table of `family`. */
export type NftOp =
  | { readonly op: 'add-chain' | 'flush-chain' | 'delete-chain'; readonly family: NftFamily; readonly chain: string }
  | { readonly op: 'add-rule'; readonly family: NftFamily; readonly chain: string; readonly rule: NftRuleSpec }
  | { readonly op: 'add-elements' | 'delete-elements'; readonly family: NftFamily; readonly set: string; readonly elements: readonly NftDispatchElement[]; readonly setId?: number }
  /** A named counter added (at zero) or deleted. */
  | { readonly op: 'add-counter' | 'delete-counter'; readonly family: NftFamily; readonly name: string }
  | { readonly op: 'add-counter-elements' | 'delete-counter-elements'; readonly family: NftFamily; readonly set: string; readonly elements: readonly NftCounterElement[]; readonly setId?: number }
  /** A port's slot map (`typeof numgen inc mod 2 : ip[6] daddr . proto dport`) added, or deleted. */
  | { readonly op: 'add-slot-map'; readonly family: NftFamily; readonly set: string; readonly proto: NftProto; readonly setId?: number }
  | { readonly op: 'delete-slot-map'; readonly family: NftFamily; readonly set: string }
  | { readonly op: 'add-slot-elements' | 'delete-slot-elements'; readonly family: NftFamily; readonly set: string; readonly elements: readonly NftSlotElement[]; readonly setId?: number }
  /** Addresses (of the table's family) added to or deleted from a set of addresses. */
  | { readonly op: 'add-addresses' | 'delete-addresses'; readonly family: NftFamily; readonly set: string; readonly addresses: readonly string[]; readonly setId?: number };

const HOST_LE = os.endianness() === 'LE';

function u32be(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0, 0);
  return b;
}

const nest = (type: number, ...children: Buffer[]): Buffer => attr(type | NLA_F_NESTED, Buffer.concat(children));
const str = (type: number, s: string): Buffer => attr(type, Buffer.from(`${s}\0`));
const u32 = (type: number, v: number): Buffer => attr(type, u32be(v));

function nlmsg(type: number, flags: number, seq: number, family: number, resId: number, body: Buffer): Buffer {
  const b = Buffer.alloc(NLMSG_HDRLEN + 4 + body.length);
  if (HOST_LE) {
    b.writeUInt32LE(b.length, 0); b.writeUInt16LE(type, 4); b.writeUInt16LE(flags, 6); b.writeUInt32LE(seq >>> 0, 8);
  } else {
    b.writeUInt32BE(b.length, 0); b.writeUInt16BE(type, 4); b.writeUInt16BE(flags, 6); b.writeUInt32BE(seq >>> 0, 8);
  }
  // nfgenmsg: family, NFNETLINK_V0, res_id (big-endian).
  b[NLMSG_HDRLEN] = family;
  b.writeUInt16BE(resId, NLMSG_HDRLEN + 2);
  body.copy(b, NLMSG_HDRLEN + 4);
  return b;
}

/** The bytes of an address of `family` (network byte order); throws naming the value when it is not one. */
function addressBytes(family: NftFamily, address: string): Buffer {
  if (family === 'ip' && net.isIPv4(address)) return Buffer.from(address.split('.').map(Number));
  if (family === 'ip6' && net.isIPv6(address)) return ipv6Bytes(address);
  throw new Error(`not an ${family === 'ip' ? 'IPv4' : 'IPv6'} address for table ${family}: ${JSON.stringify(address)}`);
}

function ipv6Bytes(address: string): Buffer {
  let text = address;
  const out = Buffer.alloc(16);
  // An embedded IPv4 tail (::ffff:1.2.3.4) becomes two groups.
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (v4) {
    const [a, b, c, d] = v4[1]!.split('.').map(Number) as [number, number, number, number];
    text = `${text.slice(0, -v4[1]!.length)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') as [string, string] : [text, undefined];
  const groups = (s: string): number[] => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const h = groups(head);
  const t = tail === undefined ? [] : groups(tail);
  const all = [...h, ...new Array<number>(8 - h.length - t.length).fill(0), ...t];
  all.forEach((g, i) => out.writeUInt16BE(g, i * 2));
  return out;
}

function port16(port: number): Buffer {
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`not a port: ${port}`);
  const b = Buffer.alloc(2);
  b.writeUInt16BE(port, 0);
  return b;
}

/** A dispatch map's key: address, protocol, port, each padded to 4 bytes (nft's concatenation layout). */
function dispatchKey(family: NftFamily, e: NftDispatchElement): Buffer {
  const proto = Buffer.alloc(4);
  proto[0] = IPPROTO[e.proto];
  const port = Buffer.alloc(4);
  port16(e.port).copy(port, 0);
  return Buffer.concat([addressBytes(family, e.vip), proto, port]);
}

/** A byte-counter map's key: VIP, backend, protocol, port, each padded to 4 bytes. */
function counterKey(family: NftFamily, e: NftCounterElement): Buffer {
  const proto = Buffer.alloc(4);
  proto[0] = IPPROTO[e.proto];
  const port = Buffer.alloc(4);
  port16(e.port).copy(port, 0);
  return Buffer.concat([addressBytes(family, e.vip), addressBytes(family, e.backend), proto, port]);
}

/** A slot's key: a 32-bit integer in host byte order (numgen and jhash write their register so). */
function slotKey(slot: number): Buffer {
  if (!Number.isInteger(slot) || slot < 0 || slot > 0xffffffff) throw new Error(`not a slot: ${slot}`);
  const b = Buffer.alloc(4);
  if (HOST_LE) b.writeUInt32LE(slot, 0); else b.writeUInt32BE(slot, 0);
  return b;
}

/** A slot's data: the backend's address and port, the port padded to 4 bytes (nft's concatenation layout). */
function slotData(family: NftFamily, set: string, e: NftSlotElement): Buffer {
  if (e.address === undefined || e.port === undefined) throw new Error(`slot ${e.slot} of map ${set} names no backend`);
  const port = Buffer.alloc(4);
  port16(e.port).copy(port, 0);
  return Buffer.concat([addressBytes(family, e.address), port]);
}

/** A u64 attribute of zero: a counter's start (nft writes both, libnftnl's NFTNL_OBJ_CTR_*). */
const ZERO64 = Buffer.alloc(8);

function verdictData(v: NftVerdict): Buffer {
  return nest(NFTA_DATA_VERDICT, u32(NFTA_VERDICT_CODE, VERDICT_CODE[v.kind]), ...(v.kind === 'drop' ? [] : [str(NFTA_VERDICT_CHAIN, v.chain)]));
}

const expr = (name: string, ...data: Buffer[]): Buffer => nest(NFTA_LIST_ELEM, str(NFTA_EXPR_NAME, name), nest(NFTA_EXPR_DATA, ...data));

/**
 * `jhash ip[6] saddr . th sport mod N seed S`: the source address and port
 * loaded side by side from register 2 (the port in the 32-bit register
 * after the address: NFT_REG32_05 after 4 bytes, NFT_REG_3 after 16, as
 * nft allocates them), hashed over both (each padded to 4 bytes) into
 * register 1.
 */
function flowHash(family: NftFamily, seed: number, modulus: number): Buffer[] {
  const six = family === 'ip6';
  const payload = (dreg: number, base: number, offset: number, len: number): Buffer =>
    expr('payload', u32(1 /* NFTA_PAYLOAD_DREG */, dreg), u32(2 /* NFTA_PAYLOAD_BASE */, base), u32(3 /* NFTA_PAYLOAD_OFFSET */, offset), u32(4 /* NFTA_PAYLOAD_LEN */, len));
  return [
    // NFT_PAYLOAD_NETWORK_HEADER: saddr at 12 (IPv4) or 8 (IPv6); NFT_PAYLOAD_TRANSPORT_HEADER: sport at 0.
    payload(NFT_REG_2, 1, six ? 8 : 12, six ? 16 : 4),
    payload(six ? 3 : 13, 2, 0, 2),
    expr('hash', u32(1 /* NFTA_HASH_SREG */, NFT_REG_2), u32(2 /* NFTA_HASH_DREG */, NFT_REG_1), u32(3 /* NFTA_HASH_LEN */, six ? 20 : 8),
      u32(4 /* NFTA_HASH_MODULUS */, modulus), u32(5 /* NFTA_HASH_SEED */, seed), u32(6 /* NFTA_HASH_OFFSET */, 0), u32(7 /* NFTA_HASH_TYPE: jenkins */, 0)),
  ];
}

/** The name nft gives an anonymous map it creates; the kernel numbers it. */
const ANON_MAP = '__map%d';

/**
 * The largest batch the writer sends: a netlink datagram must fit the
 * socket's send buffer (net.core.wmem_default, 208 KiB; nft raises its own
 * with SO_SNDBUFFORCE). A larger one, a rewrite of many flow-hash slot
 * maps, is refused before it is sent (NftBatchError, EMSGSIZE) and goes
 * to nft.
 */
export const MAX_BATCH_BYTES = 200 * 1024;
const EMSGSIZE = 90;

/** What encodeBatch is told besides the ops. */
export interface BatchOptions {
  /** The sequence number of NFNL_MSG_BATCH_BEGIN; the messages count up from it. */
  readonly seq: number;
  /** Ask an acknowledgement of every message between begin and end (NLM_F_ACK). */
  readonly ack: boolean;
  /** The transaction id of the first anonymous map a rule creates (they count up). */
  readonly firstSetId?: number;
}

/** An encoded batch: the datagram and the sequence numbers of the messages between begin and end. */
export interface EncodedBatch {
  readonly datagram: Buffer;
  readonly seqs: readonly number[];
}

/**
 * The batch of `ops` for table `table`: one datagram, a transaction in the
 * kernel. Pure. Throws (naming the value) when an op holds an address or
 * port that is not one, or a family the codec has no NFPROTO for.
 */
export function encodeBatch(table: string, ops: readonly NftOp[], opts: BatchOptions): EncodedBatch {
  let seq = opts.seq;
  let setId = opts.firstSetId ?? 1;
  const ack = opts.ack ? NLM_F_ACK : 0;
  const msgs: Buffer[] = [nlmsg(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq++, 0, NFNL_SUBSYS_NFTABLES, Buffer.alloc(0))];
  const seqs: number[] = [];
  const tableAttr = str(NFTA_TABLE, table);
  const add = (type: number, flags: number, family: NftFamily, ...attrs: Buffer[]): void => {
    const nfproto = NFPROTO[family];
    if (nfproto === undefined) throw new Error(`no NFPROTO for family ${family}`);
    seqs.push(seq);
    msgs.push(nlmsg((NFNL_SUBSYS_NFTABLES << 8) | type, NLM_F_REQUEST | flags | ack, seq++, nfproto, 0, Buffer.concat([tableAttr, ...attrs])));
  };
  for (const op of ops) {
    switch (op.op) {
      case 'add-chain': add(NFT_MSG_NEWCHAIN, NLM_F_CREATE, op.family, str(NFTA_CHAIN_NAME, op.chain)); break;
      case 'delete-chain': add(NFT_MSG_DELCHAIN, 0, op.family, str(NFTA_CHAIN_NAME, op.chain)); break;
      // A rule deletion with no handle deletes every rule of the chain (nf_tables_delrule).
      case 'flush-chain': add(NFT_MSG_DELRULE, 0, op.family, str(NFTA_RULE_CHAIN, op.chain)); break;
      case 'add-elements':
      case 'delete-elements': {
        // libnftnl numbers the element nests 1, 2, ... (the kernel reads any type there).
        const elems = op.elements.map((e, i) => {
          if (op.op === 'add-elements' && e.verdict === undefined) throw new Error(`element ${e.vip} . ${e.proto} . ${e.port} of map ${op.set} has no verdict`);
          return nest(i + 1, nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, dispatchKey(op.family, e))),
            ...(op.op === 'add-elements' ? [nest(NFTA_SET_ELEM_DATA, verdictData(e.verdict!))] : []));
        });
        add(op.op === 'add-elements' ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM, op.op === 'add-elements' ? NLM_F_CREATE : 0, op.family,
          str(NFTA_SET_ELEM_LIST_SET, op.set), ...(op.setId === undefined ? [] : [u32(NFTA_SET_ELEM_LIST_SET_ID, op.setId)]), nest(NFTA_SET_ELEM_LIST_ELEMENTS, ...elems));
        break;
      }
      // libnftnl: type and, for an addition, the counter's start; a deletion carries an empty data nest.
      case 'add-counter':
        add(NFT_MSG_NEWOBJ, NLM_F_CREATE, op.family, str(NFTA_OBJ_NAME, op.name), u32(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER),
          nest(NFTA_OBJ_DATA, attr(NFTA_COUNTER_BYTES, ZERO64), attr(NFTA_COUNTER_PACKETS, ZERO64)));
        break;
      case 'delete-counter':
        add(NFT_MSG_DELOBJ, 0, op.family, str(NFTA_OBJ_NAME, op.name), u32(NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER), nest(NFTA_OBJ_DATA));
        break;
      case 'add-counter-elements':
      case 'delete-counter-elements': {
        const adding = op.op === 'add-counter-elements';
        const elems = op.elements.map((e, i) => {
          if (adding && (e.counter === undefined || e.counter === '')) throw new Error(`element ${e.vip} . ${e.backend} . ${e.proto} . ${e.port} of map ${op.set} names no counter`);
          return nest(i + 1, nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, counterKey(op.family, e))), ...(adding ? [str(NFTA_SET_ELEM_OBJREF, e.counter!)] : []));
        });
        add(adding ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM, adding ? NLM_F_CREATE : 0, op.family,
          str(NFTA_SET_ELEM_LIST_SET, op.set), ...(op.setId === undefined ? [] : [u32(NFTA_SET_ELEM_LIST_SET_ID, op.setId)]), nest(NFTA_SET_ELEM_LIST_ELEMENTS, ...elems));
        break;
      }
      case 'add-slot-map': {
        const id = op.setId ?? setId++;
        add(NFT_MSG_NEWSET, NLM_F_CREATE, op.family, str(NFTA_SET_NAME, op.set), u32(NFTA_SET_FLAGS, NFT_SET_MAP),
          u32(NFTA_SET_KEY_TYPE, TYPE_INTEGER), u32(NFTA_SET_KEY_LEN, 4), u32(NFTA_SET_DATA_TYPE, SLOT_DATA_TYPE[op.family]), u32(NFTA_SET_DATA_LEN, op.family === 'ip' ? 8 : 20),
          u32(NFTA_SET_ID, id), attr(NFTA_SET_USERDATA, slotMapUserdata(op.family, op.proto)));
        break;
      }
      case 'delete-slot-map': add(NFT_MSG_DELSET, 0, op.family, str(NFTA_SET_NAME, op.set)); break;
      case 'add-slot-elements':
      case 'delete-slot-elements': {
        const adding = op.op === 'add-slot-elements';
        const elems = op.elements.map((e, i) => nest(i + 1, nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, slotKey(e.slot))),
          ...(adding ? [nest(NFTA_SET_ELEM_DATA, attr(NFTA_DATA_VALUE, slotData(op.family, op.set, e)))] : [])));
        add(adding ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM, adding ? NLM_F_CREATE : 0, op.family,
          str(NFTA_SET_ELEM_LIST_SET, op.set), ...(op.setId === undefined ? [] : [u32(NFTA_SET_ELEM_LIST_SET_ID, op.setId)]), nest(NFTA_SET_ELEM_LIST_ELEMENTS, ...elems));
        break;
      }
      case 'add-addresses':
      case 'delete-addresses': {
        const elems = op.addresses.map((a, i) => nest(i + 1, nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, addressBytes(op.family, a)))));
        add(op.op === 'add-addresses' ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM, op.op === 'add-addresses' ? NLM_F_CREATE : 0, op.family,
          str(NFTA_SET_ELEM_LIST_SET, op.set), ...(op.setId === undefined ? [] : [u32(NFTA_SET_ELEM_LIST_SET_ID, op.setId)]), nest(NFTA_SET_ELEM_LIST_ELEMENTS, ...elems));
        break;
      }
      case 'add-rule': {
        const r = op.rule;
        let exprs: Buffer[];
        if (r.kind === 'verdict') {
          exprs = [expr('immediate', u32(1 /* NFTA_IMMEDIATE_DREG */, NFT_REG_VERDICT), nest(2 /* NFTA_IMMEDIATE_DATA */, verdictData(r.verdict)))];
        } else if (r.kind === 'numgen' || r.kind === 'jhash') {
          if (r.targets.length === 0) throw new Error(`${r.kind} rule of chain ${op.chain} has no targets`);
          const id = setId++;
          // The anonymous map first (NEWSET, NEWSETELEM), then the rule that looks it up by id.
          add(NFT_MSG_NEWSET, NLM_F_CREATE, op.family, str(NFTA_SET_NAME, ANON_MAP), u32(NFTA_SET_FLAGS, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_MAP),
            u32(NFTA_SET_KEY_TYPE, TYPE_INTEGER), u32(NFTA_SET_KEY_LEN, 4), u32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT), u32(NFTA_SET_DATA_LEN, 0),
            u32(NFTA_SET_ID, id), nest(NFTA_SET_DESC, u32(NFTA_SET_DESC_SIZE, r.targets.length)), attr(NFTA_SET_USERDATA, NUMGEN_MAP_USERDATA));
          // numgen writes the register in host byte order: so is the key.
          const key = (i: number): Buffer => { const b = Buffer.alloc(4); if (HOST_LE) b.writeUInt32LE(i, 0); else b.writeUInt32BE(i, 0); return b; };
          add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, op.family, str(NFTA_SET_ELEM_LIST_SET, ANON_MAP), u32(NFTA_SET_ELEM_LIST_SET_ID, id),
            nest(NFTA_SET_ELEM_LIST_ELEMENTS, ...r.targets.map((chain, i) => nest(i + 1,
              nest(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, key(i))), nest(NFTA_SET_ELEM_DATA, verdictData({ kind: 'goto', chain }))))));
          exprs = [
            ...(r.kind === 'numgen'
              ? [expr('numgen', u32(1 /* NFTA_NG_DREG */, NFT_REG_1), u32(2 /* NFTA_NG_MODULUS */, r.targets.length), u32(3 /* NFTA_NG_TYPE */, NFT_NG_INCREMENTAL), u32(4 /* NFTA_NG_OFFSET */, 0))]
              : flowHash(op.family, r.seed, r.targets.length)),
            expr('lookup', u32(2 /* NFTA_LOOKUP_SREG */, NFT_REG_1), u32(3 /* NFTA_LOOKUP_DREG */, NFT_REG_VERDICT), str(1 /* NFTA_LOOKUP_SET */, ANON_MAP), u32(4 /* NFTA_LOOKUP_SET_ID */, id)),
          ];
        } else if (r.kind === 'dnat-map') {
          if (!Number.isInteger(r.pick.modulus) || r.pick.modulus < 1) throw new Error(`the slot pick of chain ${op.chain} has no modulus: ${r.pick.modulus}`);
          exprs = [
            expr('meta', u32(2 /* NFTA_META_KEY */, NFT_META_L4PROTO), u32(1 /* NFTA_META_DREG */, NFT_REG_1)),
            expr('cmp', u32(1 /* NFTA_CMP_SREG */, NFT_REG_1), u32(2 /* NFTA_CMP_OP */, NFT_CMP_EQ), nest(3 /* NFTA_CMP_DATA */, attr(NFTA_DATA_VALUE, Buffer.from([IPPROTO[r.proto]])))),
            ...(r.pick.kind === 'numgen'
              ? [expr('numgen', u32(1 /* NFTA_NG_DREG */, NFT_REG_1), u32(2 /* NFTA_NG_MODULUS */, r.pick.modulus), u32(3 /* NFTA_NG_TYPE */, NFT_NG_INCREMENTAL), u32(4 /* NFTA_NG_OFFSET */, 0))]
              : flowHash(op.family, r.pick.seed, r.pick.modulus)),
            expr('lookup', u32(2 /* NFTA_LOOKUP_SREG */, NFT_REG_1), u32(3 /* NFTA_LOOKUP_DREG */, NFT_REG_1), str(1 /* NFTA_LOOKUP_SET */, r.map), ...(r.setId === undefined ? [] : [u32(4 /* NFTA_LOOKUP_SET_ID */, r.setId)])),
            // The address in register 1; the port in the 32-bit register after it (NFT_REG32_01 = 9 after 4 bytes; NFT_REG_2 after 16).
            expr('nat', u32(1 /* NFTA_NAT_TYPE */, NFT_NAT_DNAT), u32(2 /* NFTA_NAT_FAMILY */, NFPROTO[op.family]!), u32(3 /* NFTA_NAT_REG_ADDR_MIN */, NFT_REG_1),
              u32(5 /* NFTA_NAT_REG_PROTO_MIN */, op.family === 'ip' ? 9 : NFT_REG_2)),
          ];
        } else {
          const proto = Buffer.from([IPPROTO[r.proto]]);
          exprs = [
            ...(r.counter === undefined ? [] : [expr('objref', u32(1 /* NFTA_OBJREF_IMM_TYPE */, NFT_OBJECT_COUNTER), // libnftnl puts the name without its NUL (mnl_attr_put_str).
              attr(2 /* NFTA_OBJREF_IMM_NAME */, Buffer.from(r.counter)))]),
            expr('meta', u32(2 /* NFTA_META_KEY */, NFT_META_L4PROTO), u32(1 /* NFTA_META_DREG */, NFT_REG_1)),
            expr('cmp', u32(1 /* NFTA_CMP_SREG */, NFT_REG_1), u32(2 /* NFTA_CMP_OP */, NFT_CMP_EQ), nest(3 /* NFTA_CMP_DATA */, attr(NFTA_DATA_VALUE, proto))),
            expr('immediate', u32(1, NFT_REG_1), nest(2, attr(NFTA_DATA_VALUE, addressBytes(op.family, r.address)))),
            expr('immediate', u32(1, NFT_REG_2), nest(2, attr(NFTA_DATA_VALUE, port16(r.port)))),
            expr('nat', u32(1 /* NFTA_NAT_TYPE */, NFT_NAT_DNAT), u32(2 /* NFTA_NAT_FAMILY */, NFPROTO[op.family]!), u32(3 /* NFTA_NAT_REG_ADDR_MIN */, NFT_REG_1),
              u32(5 /* NFTA_NAT_REG_PROTO_MIN */, NFT_REG_2), u32(7 /* NFTA_NAT_FLAGS */, NF_NAT_RANGE_PROTO_SPECIFIED)),
          ];
        }
        add(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, op.family, str(NFTA_RULE_CHAIN, op.chain), nest(NFTA_RULE_EXPRESSIONS, ...exprs));
        break;
      }
    }
  }
  msgs.push(nlmsg(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq++, 0, NFNL_SUBSYS_NFTABLES, Buffer.alloc(0)));
  return { datagram: Buffer.concat(msgs), seqs };
}

/** The replies to a batch found in one datagram: errno (0 for an acknowledgement) by sequence number. Pure. */
export function parseAcks(buf: Buffer): { acks: Map<number, number>; malformed: boolean } {
  const acks = new Map<number, number>();
  let o = 0;
  while (o + NLMSG_HDRLEN <= buf.length) {
    const len = HOST_LE ? buf.readUInt32LE(o) : buf.readUInt32BE(o);
    if (len < NLMSG_HDRLEN || o + len > buf.length) return { acks, malformed: true };
    const type = HOST_LE ? buf.readUInt16LE(o + 4) : buf.readUInt16BE(o + 4);
    const seq = HOST_LE ? buf.readUInt32LE(o + 8) : buf.readUInt32BE(o + 8);
    if (type === NLMSG_ERROR) {
      if (len < NLMSG_HDRLEN + 4) return { acks, malformed: true };
      acks.set(seq, HOST_LE ? buf.readInt32LE(o + NLMSG_HDRLEN) : buf.readInt32BE(o + NLMSG_HDRLEN));
    }
    o += (len + 3) & ~3;
  }
  return { acks, malformed: false };
}

/** A batch the kernel refused: nothing of it applied. */
export class NftBatchError extends Error {
  constructor(message: string, readonly errno: number | undefined, readonly op: NftOp | undefined) {
    super(message);
  }
}

/**
 * Writes batches on one NETLINK_NETFILTER socket, one at a time. Its port
 * (`port`) is what the kernel's commit notifications carry: the drift
 * guard knows the agent's own commits by it.
 */
export class NftBatchWriter {
  private readonly sock: RawNetlinkSocket;
  private seq: number;
  private chain: Promise<unknown> = Promise.resolve();
  private pending: { readonly want: Set<number>; onAcks(acks: Map<number, number>, malformed: boolean): void; fail(err: Error): void } | undefined;
  private closed = false;
  private readonly timeoutMs: number;

  constructor(opts: { timeoutMs?: number } = {}) {
    this.timeoutMs = opts.timeoutMs ?? 5000;
    this.sock = new RawNetlinkSocket(NETLINK_NETFILTER, { recvBufferSize: 1 << 20 });
    this.sock.unref();
    this.sock.on('message', (d: Buffer) => { const r = parseAcks(d); this.pending?.onAcks(r.acks, r.malformed); });
    this.sock.on('error', (err: Error) => this.pending?.fail(err));
    // Any start works; counting from the clock keeps a late reply to an earlier socket's batch from matching.
    this.seq = (Date.now() & 0x7fffffff) >>> 0;
  }

  /** The socket's netlink port (the kernel's notifications of our commits carry it). */
  get port(): number {
    return this.sock.address().port;
  }

  /**
   * Apply `ops` to table `table` as one transaction. Resolves once the
   * kernel acknowledged every message (committed); rejects with an
   * NftBatchError naming the refused op (nothing applied) or with the
   * socket's error, or when no complete answer came within the timeout.
   */
  write(table: string, ops: readonly NftOp[]): Promise<void> {
    const run = (): Promise<void> => new Promise((resolve, reject) => {
      if (this.closed) { reject(new Error('the nftables batch writer is closed')); return; }
      let batch: EncodedBatch;
      try {
        batch = encodeBatch(table, ops, { seq: this.seq, ack: true });
      } catch (err) { reject(err); return; }
      this.seq = (this.seq + batch.seqs.length + 2) >>> 0;
      if (batch.datagram.length > MAX_BATCH_BYTES) {
        reject(new NftBatchError(`an nftables batch of ${ops.length} op(s), ${batch.datagram.length} bytes, is larger than one netlink datagram may be (${MAX_BATCH_BYTES}); nothing of it sent`, EMSGSIZE, undefined));
        return;
      }
      const want = new Set(batch.seqs);
      const opOf = new Map<number, NftOp>();
      // The messages of an op: a numgen rule is three (its map, its elements, the rule); the others one.
      let i = 0;
      for (const op of ops) {
        const n = op.op === 'add-rule' && (op.rule.kind === 'numgen' || op.rule.kind === 'jhash') ? 3 : 1;
        for (let k = 0; k < n; k++) opOf.set(batch.seqs[i++]!, op);
      }
      const settle = (err?: Error): void => {
        if (this.pending !== p) return;
        this.pending = undefined;
        clearTimeout(timer);
        if (err) reject(err); else resolve();
      };
      const timer = setTimeout(() => settle(new Error(`no complete answer to an nftables batch of ${ops.length} op(s) on table ${table} within ${this.timeoutMs} ms`)), this.timeoutMs);
      timer.unref();
      const p = {
        want,
        onAcks: (acks: Map<number, number>, malformed: boolean): void => {
          if (malformed) { settle(new Error('malformed reply to an nftables batch')); return; }
          for (const [s, errno] of acks) {
            if (!want.has(s)) continue;
            if (errno !== 0) {
              const op = opOf.get(s);
              settle(new NftBatchError(`the kernel refused the nftables batch at ${op ? describeOp(op) : `message ${s}`}: errno ${-errno} (${errnoName(-errno)}); nothing of it applied`, -errno, op));
              return;
            }
            want.delete(s);
          }
          if (want.size === 0) settle();
        },
        fail: (err: Error): void => settle(err),
      };
      this.pending = p;
      this.sock.send(batch.datagram, undefined, (err) => { if (err) settle(err); });
    });
    const p = this.chain.then(run, run);
    this.chain = p.catch(() => undefined);
    return p;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.pending?.fail(new Error('the nftables batch writer is closed'));
    this.sock.close();
  }
}

/** An op as nft would say it (for errors and logs). */
export function describeOp(op: NftOp): string {
  switch (op.op) {
    case 'add-chain': return `add chain ${op.family} ${op.chain}`;
    case 'flush-chain': return `flush chain ${op.family} ${op.chain}`;
    case 'delete-chain': return `delete chain ${op.family} ${op.chain}`;
    case 'add-rule': return `add rule ${op.family} ${op.chain} (${op.rule.kind})`;
    case 'add-slot-map': return `add map ${op.family} ${op.set}`;
    case 'delete-slot-map': return `delete map ${op.family} ${op.set}`;
    case 'add-slot-elements':
    case 'delete-slot-elements':
      return `${op.op === 'add-slot-elements' ? 'add' : 'delete'} element ${op.family} ${op.set} { ${op.elements.map((e) => `${e.slot}`).join(', ')} }`;
    case 'add-counter': return `add counter ${op.family} ${op.name}`;
    case 'delete-counter': return `delete counter ${op.family} ${op.name}`;
    case 'add-addresses':
    case 'delete-addresses':
      return `${op.op === 'add-addresses' ? 'add' : 'delete'} element ${op.family} ${op.set} { ${op.addresses.join(', ')} }`;
    case 'add-counter-elements':
    case 'delete-counter-elements':
      return `${op.op === 'add-counter-elements' ? 'add' : 'delete'} element ${op.family} ${op.set} { ${op.elements.map((e) => `${e.vip} . ${e.backend} . ${e.proto} . ${e.port}`).join(', ')} }`;
    default: return `${op.op === 'add-elements' ? 'add' : 'delete'} element ${op.family} ${op.set} { ${op.elements.map((e) => `${e.vip} . ${e.proto} . ${e.port}`).join(', ')} }`;
  }
}

const ERRNO_NAMES: Readonly<Record<number, string>> = { 1: 'EPERM', 2: 'ENOENT', 16: 'EBUSY', 17: 'EEXIST', 22: 'EINVAL', 90: 'EMSGSIZE', 95: 'EOPNOTSUPP' };
const errnoName = (n: number): string => ERRNO_NAMES[n] ?? `errno ${n}`;
