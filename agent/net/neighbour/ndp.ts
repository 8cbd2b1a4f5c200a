// Neighbour discovery codec (pure): ICMPv6 neighbour solicitation and
// advertisement (RFC 4861 §4.3, §4.4) with their options, inside an IPv6
// header and an Ethernet II frame; the solicited-node multicast group of an
// address and its Ethernet MAC; the DAD probe (RFC 4862 §5.4.2) and the
// unsolicited advertisement (RFC 4861 §7.2.6) built from them. No I/O.
// Decoding never throws: a frame a node must discard (§7.1.1, §7.1.2) yields
// a reason that becomes a metric label.
import { formatMac, parseMac } from '../../address';
import type { FrameDropReason, NdpDropReason } from '../metrics';
import {
  decodeIpv6Frame,
  encodeIpv6Frame,
  ETH_HEADER_LEN,
  internetChecksum,
  IPPROTO_ICMPV6,
  IPV6_HEADER_LEN,
  ipv6PseudoHeaderSum,
} from '../packet/inet';

export const ICMPV6_NEIGHBOUR_SOLICITATION = 135;
export const ICMPV6_NEIGHBOUR_ADVERTISEMENT = 136;
/** RFC 4861 §7.1.1: sent with hop limit 255, and a received packet with another is not from this link. */
export const NDP_HOP_LIMIT = 255;
/** ICMPv6 header (4) + reserved or flags (4) + target (16): the shortest valid message (§7.1.1). */
export const NDP_MIN_LENGTH = 24;

/** RFC 4861 §4.6: option types. */
export const NDP_OPT_SOURCE_LINK_LAYER = 1;
export const NDP_OPT_TARGET_LINK_LAYER = 2;
/** RFC 7527 §4.1: the nonce of enhanced DAD, which Linux puts in its probes. */
export const NDP_OPT_NONCE = 14;

const FLAG_ROUTER = 0x80;
const FLAG_SOLICITED = 0x40;
const FLAG_OVERRIDE = 0x20;

/** ::, the source of a DAD probe (RFC 4862 §5.4.2). */
export const UNSPECIFIED_ADDRESS = 0n;
/** ff02::1, link-local all-nodes (RFC 4291 §2.7.1). */
export const ALL_NODES_ADDRESS = (0xff02n << 112n) | 1n;
/** ff02::1:ff00:0/104, the solicited-node prefix (RFC 4291 §2.7.1). */
const SOLICITED_NODE_PREFIX = (0xff02n << 112n) | (0x1ffn << 24n);
const LOW_24 = 0xffffffn;
const ALL_128 = (1n << 128n) - 1n;

/** Multicast: ff00::/8 (RFC 4291 §2.7). */
export function isIpv6Multicast(a: bigint): boolean {
  return a >> 120n === 0xffn;
}

/** RFC 4291 §2.7.1: ff02::1:ffXX:XXXX, the low 24 bits of the address appended to the prefix. */
export function solicitedNodeAddress(a: bigint): bigint {
  return SOLICITED_NODE_PREFIX | (a & LOW_24);
}

export function isSolicitedNodeAddress(a: bigint): boolean {
  return (a & ~LOW_24 & ALL_128) === SOLICITED_NODE_PREFIX;
}

/** RFC 2464 §7: an IPv6 multicast group's Ethernet address is 33:33 and the group's low 32 bits. */
export function ipv6MulticastMac(group: bigint): string {
  const low = Number(group & 0xffffffffn);
  const b = Buffer.from([0x33, 0x33, 0, 0, 0, 0]);
  b.writeUInt32BE(low, 2);
  return formatMac(b);
}

interface NdpHeader {
  /** Ethernet destination and source, lower-case "aa:bb:cc:dd:ee:ff". */
  readonly ethDst: string;
  readonly ethSrc: string;
  /** IPv6 source and destination as unsigned 128-bit integers (Address.value of agent/address.ts). */
  readonly src: bigint;
  readonly dst: bigint;
  /** The address solicited or advertised. */
  readonly target: bigint;
}

export interface NeighbourSolicitation extends NdpHeader {
  readonly kind: 'solicitation';
  /** §4.6.1 source link-layer address option; never in a DAD probe (§4.3). */
  readonly sourceMac: string | undefined;
  /** RFC 7527 nonce as lower-case hex (6 octets from Linux), if any. */
  readonly nonce: string | undefined;
}

export interface NeighbourAdvertisement extends NdpHeader {
  readonly kind: 'advertisement';
  readonly router: boolean;
  readonly solicited: boolean;
  readonly override: boolean;
  /** §4.6.1 target link-layer address option; may be left out of an answer to a unicast solicitation (§7.2.4). */
  readonly targetMac: string | undefined;
}

export type NdpPacket = NeighbourSolicitation | NeighbourAdvertisement;

export type NdpDecodeFailure = Extract<FrameDropReason, 'truncated'> | NdpDropReason;

/** Not a drop: on a socket shared with other traffic most frames are simply not NDP. */
export const NDP_NOT_MINE: ReadonlySet<NdpDecodeFailure> = new Set(['not-ipv6', 'not-icmpv6', 'not-ndp']);

export type NdpDecodeResult = { ok: true; packet: NdpPacket } | { ok: false; reason: NdpDecodeFailure };

interface Options { sourceMac?: string; targetMac?: string; nonce?: string }

/** RFC 4861 §4.6: type, length in units of 8 octets (never 0), data. Unknown options are skipped. */
function readOptions(b: Uint8Array, start: number, end: number): Options | NdpDecodeFailure {
  const out: Options = {};
  let o = start;
  while (o < end) {
    if (end - o < 2) return 'bad-option-length';
    const type = b[o]!;
    const len = b[o + 1]! * 8;
    if (len === 0 || o + len > end) return 'bad-option-length';
    if (type === NDP_OPT_SOURCE_LINK_LAYER || type === NDP_OPT_TARGET_LINK_LAYER) {
      // RFC 2464 §6: on Ethernet the option is 8 octets, a 6-octet address.
      if (len !== 8) return 'bad-link-layer-option';
      const mac = formatMac(b.subarray(o + 2, o + 8));
      if (type === NDP_OPT_SOURCE_LINK_LAYER) out.sourceMac = mac;
      else out.targetMac = mac;
    } else if (type === NDP_OPT_NONCE) {
      out.nonce = Buffer.from(b.subarray(o + 2, o + len)).toString('hex');
    }
    o += len;
  }
  return out;
}

/**
 * Decode one Ethernet frame holding a neighbour solicitation or
 * advertisement, with every validity rule of RFC 4861 §7.1.1 (NS) and
 * §7.1.2 (NA). Trailing bytes (Ethernet padding) are ignored. Messages with
 * extension headers are not decoded ('not-icmpv6'): RFC 6980 has nodes drop
 * fragmented NDP, and hop-by-hop options have no business in it.
 */
export function decodeNdp(frame: Uint8Array): NdpDecodeResult {
  const ip = decodeIpv6Frame(frame);
  if (!ip.ok) return { ok: false, reason: ip.reason };
  const h = ip.packet;
  if (h.nextHeader !== IPPROTO_ICMPV6) return { ok: false, reason: 'not-icmpv6' };
  const start = h.payloadStart;
  const end = h.payloadEnd;
  const len = end - start;
  if (len < 4) return { ok: false, reason: 'bad-icmp-length' };
  const type = frame[start]!;
  if (type !== ICMPV6_NEIGHBOUR_SOLICITATION && type !== ICMPV6_NEIGHBOUR_ADVERTISEMENT) return { ok: false, reason: 'not-ndp' };
  // §7.1.1: a router cannot have forwarded it.
  if (h.hopLimit !== NDP_HOP_LIMIT) return { ok: false, reason: 'bad-hop-limit' };
  const pseudo = ipv6PseudoHeaderSum(frame.subarray(ETH_HEADER_LEN + 8, ETH_HEADER_LEN + 24), frame.subarray(ETH_HEADER_LEN + 24, ETH_HEADER_LEN + 40), IPPROTO_ICMPV6, len);
  if (internetChecksum(frame, start, end, pseudo) !== 0) return { ok: false, reason: 'bad-icmp-checksum' };
  if (frame[start + 1] !== 0) return { ok: false, reason: 'bad-icmp-code' };
  if (len < NDP_MIN_LENGTH) return { ok: false, reason: 'bad-icmp-length' };
  let target = 0n;
  for (let i = 0; i < 16; i++) target = (target << 8n) | BigInt(frame[start + 8 + i]!);
  if (isIpv6Multicast(target)) return { ok: false, reason: 'multicast-target' };
  const opts = readOptions(frame, start + NDP_MIN_LENGTH, end);
  if (typeof opts === 'string') return { ok: false, reason: opts };
  const base = { ethDst: formatMac(frame.subarray(0, 6)), ethSrc: formatMac(frame.subarray(6, 12)), src: h.src, dst: h.dst, target };
  if (type === ICMPV6_NEIGHBOUR_SOLICITATION) {
    if (h.src === UNSPECIFIED_ADDRESS) {
      // §7.1.1: a DAD probe has no address to bind a link-layer address to,
      // and goes to the solicited-node group of its target.
      if (opts.sourceMac !== undefined) return { ok: false, reason: 'dad-with-link-layer-option' };
      if (!isSolicitedNodeAddress(h.dst)) return { ok: false, reason: 'dad-not-to-solicited-node' };
    }
    // §4.6.1: a target link-layer option in a solicitation is ignored.
    return { ok: true, packet: { kind: 'solicitation', ...base, sourceMac: opts.sourceMac, nonce: opts.nonce } };
  }
  const flags = frame[start + 4]!;
  const solicited = (flags & FLAG_SOLICITED) !== 0;
  // §7.1.2: an answer to one node is never multicast.
  if (solicited && isIpv6Multicast(h.dst)) return { ok: false, reason: 'solicited-to-multicast' };
  return {
    ok: true,
    packet: {
      kind: 'advertisement',
      ...base,
      router: (flags & FLAG_ROUTER) !== 0,
      solicited,
      override: (flags & FLAG_OVERRIDE) !== 0,
      targetMac: opts.targetMac,
    },
  };
}

function macBytes(mac: string, field: string): Buffer {
  const b = parseMac(mac);
  if (!b) throw new TypeError(`${field} is not a MAC address: ${mac}`);
  return b;
}

function checkIpv6(a: bigint, field: string): bigint {
  if (typeof a !== 'bigint' || a < 0n || a > ALL_128) throw new TypeError(`${field} is not an IPv6 address value: ${String(a)}`);
  return a;
}

function nonceBytes(nonce: string): Buffer {
  // RFC 7527 §4.1: the option is a whole number of 8-octet units.
  if (!/^([0-9a-f]{2})+$/i.test(nonce) || (nonce.length / 2 + 2) % 8 !== 0) throw new TypeError(`nonce must be hex filling whole 8-octet option units (6, 14, ... octets): ${nonce}`);
  return Buffer.from(nonce, 'hex');
}

/**
 * Encode a frame with hop limit 255, traffic class and flow label 0, the
 * checksum filled in. Options in this order: source or target link-layer
 * address, then the nonce. Throws TypeError on malformed arguments or on a
 * message a receiver must drop (§7.1.1, §7.1.2): a programming error, not
 * input from the wire.
 */
export function encodeNdp(p: NdpPacket): Buffer {
  const src = checkIpv6(p.src, 'src');
  const dst = checkIpv6(p.dst, 'dst');
  const target = checkIpv6(p.target, 'target');
  if (isIpv6Multicast(target)) throw new TypeError('target must not be a multicast address (RFC 4861 §7.1.1)');
  const opts: Buffer[] = [];
  let type: number;
  let flags = 0;
  if (p.kind === 'solicitation') {
    type = ICMPV6_NEIGHBOUR_SOLICITATION;
    if (src === UNSPECIFIED_ADDRESS) {
      if (p.sourceMac !== undefined) throw new TypeError('a solicitation from :: carries no source link-layer address (RFC 4861 §7.1.1)');
      if (!isSolicitedNodeAddress(dst)) throw new TypeError('a solicitation from :: goes to a solicited-node group (RFC 4861 §7.1.1)');
    }
    if (p.sourceMac !== undefined) opts.push(Buffer.concat([Buffer.from([NDP_OPT_SOURCE_LINK_LAYER, 1]), macBytes(p.sourceMac, 'sourceMac')]));
    if (p.nonce !== undefined) {
      const n = nonceBytes(p.nonce);
      opts.push(Buffer.concat([Buffer.from([NDP_OPT_NONCE, (n.length + 2) / 8]), n]));
    }
  } else if (p.kind === 'advertisement') {
    type = ICMPV6_NEIGHBOUR_ADVERTISEMENT;
    if (p.solicited && isIpv6Multicast(dst)) throw new TypeError('a solicited advertisement is never multicast (RFC 4861 §7.1.2)');
    flags = (p.router ? FLAG_ROUTER : 0) | (p.solicited ? FLAG_SOLICITED : 0) | (p.override ? FLAG_OVERRIDE : 0);
    if (p.targetMac !== undefined) opts.push(Buffer.concat([Buffer.from([NDP_OPT_TARGET_LINK_LAYER, 1]), macBytes(p.targetMac, 'targetMac')]));
  } else {
    throw new TypeError(`unknown NDP message kind: ${String((p as { kind: unknown }).kind)}`);
  }
  const optBytes = Buffer.concat(opts);
  const len = NDP_MIN_LENGTH + optBytes.length;
  const frame = encodeIpv6Frame({
    dstMac: macBytes(p.ethDst, 'ethDst'),
    srcMac: macBytes(p.ethSrc, 'ethSrc'),
    trafficClass: 0,
    flowLabel: 0,
    nextHeader: IPPROTO_ICMPV6,
    hopLimit: NDP_HOP_LIMIT,
    src,
    dst,
  }, len);
  const o = ETH_HEADER_LEN + IPV6_HEADER_LEN;
  frame[o] = type;
  frame[o + 1] = 0;
  frame[o + 4] = flags;
  let t = target;
  for (let i = 15; i >= 0; i--) {
    frame[o + 8 + i] = Number(t & 0xffn);
    t >>= 8n;
  }
  optBytes.copy(frame, o + NDP_MIN_LENGTH);
  const pseudo = ipv6PseudoHeaderSum(frame.subarray(ETH_HEADER_LEN + 8, ETH_HEADER_LEN + 24), frame.subarray(ETH_HEADER_LEN + 24, ETH_HEADER_LEN + 40), IPPROTO_ICMPV6, len);
  frame.writeUInt16BE(internetChecksum(frame, o, o + len, pseudo), o + 2);
  return frame;
}

/**
 * RFC 4862 §5.4.2 DAD probe: a solicitation for the tentative address from
 * :: (so no neighbour's cache learns an address that may be taken) to its
 * solicited-node group, without a source link-layer option. With a nonce it
 * is RFC 7527's enhanced DAD probe, as Linux sends.
 */
export function ndpDadProbe(mac: string, target: bigint, nonce?: string): NeighbourSolicitation {
  const group = solicitedNodeAddress(target);
  return { kind: 'solicitation', ethDst: ipv6MulticastMac(group), ethSrc: mac, src: UNSPECIFIED_ADDRESS, dst: group, target, sourceMac: undefined, nonce };
}

/** RFC 4861 §7.2.2 address resolution: a solicitation from `src` to the target's solicited-node group, with our link-layer address. */
export function ndpSolicitation(mac: string, src: bigint, target: bigint): NeighbourSolicitation {
  const group = solicitedNodeAddress(target);
  return { kind: 'solicitation', ethDst: ipv6MulticastMac(group), ethSrc: mac, src, dst: group, target, sourceMac: mac, nonce: undefined };
}

/**
 * RFC 4861 §7.2.6 unsolicited advertisement: to all-nodes, from the address
 * itself, override set (so neighbours replace the old link-layer address),
 * solicited clear, with the target link-layer option.
 */
export function ndpUnsolicitedAdvertisement(mac: string, target: bigint): NeighbourAdvertisement {
  return {
    kind: 'advertisement', ethDst: ipv6MulticastMac(ALL_NODES_ADDRESS), ethSrc: mac, src: target, dst: ALL_NODES_ADDRESS, target,
    router: false, solicited: false, override: true, targetMac: mac,
  };
}

/**
 * RFC 4861 §7.2.4 the answer to a solicitation for `target`: to its sender,
 * solicited set; to all-nodes with solicited clear when the sender is ::
 * (a DAD probe, whose prober then knows the address is taken). Override set:
 * a VIP is not an anycast address.
 */
export function ndpSolicitedAdvertisement(mac: string, target: bigint, ns: NeighbourSolicitation): NeighbourAdvertisement {
  if (ns.src === UNSPECIFIED_ADDRESS) return ndpUnsolicitedAdvertisement(mac, target);
  return {
    kind: 'advertisement', ethDst: ns.sourceMac ?? ns.ethSrc, ethSrc: mac, src: target, dst: ns.src, target,
    router: false, solicited: true, override: true, targetMac: mac,
  };
}

/** True for a DAD probe (RFC 4862 §5.4.2): a solicitation from ::. */
export function isDadProbe(p: NdpPacket): p is NeighbourSolicitation {
  return p.kind === 'solicitation' && p.src === UNSPECIFIED_ADDRESS;
}

/** What a raw ICMPv6 socket gives of one received message (ndp-socket.ts). */
export interface ReceivedIcmp6 {
  /** From the ICMPv6 header on. */
  readonly message: Uint8Array;
  /** IPv6 source and destination, 16 bytes each. */
  readonly src: Uint8Array;
  readonly dst: Uint8Array;
  /** The IPv6 header's hop limit, as the kernel received it. */
  readonly hopLimit: number;
}

const ZERO_MAC = Buffer.alloc(6);

/** The link-layer address a solicitation (source option) or an advertisement (target option) gives, if it gives one well formed. */
function ownLinkLayerOption(m: Uint8Array): Uint8Array | undefined {
  const want = m[0] === ICMPV6_NEIGHBOUR_SOLICITATION ? NDP_OPT_SOURCE_LINK_LAYER : m[0] === ICMPV6_NEIGHBOUR_ADVERTISEMENT ? NDP_OPT_TARGET_LINK_LAYER : undefined;
  if (want === undefined) return undefined;
  for (let o = NDP_MIN_LENGTH; o + 2 <= m.length;) {
    const len = m[o + 1]! * 8;
    if (len === 0 || o + len > m.length) return undefined;
    if (m[o] === want) return len === 8 ? m.subarray(o + 2, o + 8) : undefined;
    o += len;
  }
  return undefined;
}

/**
 * The Ethernet frame decodeNdp judges, rebuilt from a message a raw ICMPv6
 * socket received: the IPv6 header from the kernel's facts (source,
 * destination, hop limit), the message as it came, so every rule of
 * RFC 4861 §7.1 (hop limit 255, checksum, lengths, options) is applied as to
 * a frame from a packet socket. A raw socket does not see the Ethernet
 * header: the destination MAC is the group's (RFC 2464 §7) for a multicast
 * destination, else 00:00:00:00:00:00, and the source MAC is the
 * link-layer address the message gives for its sender (a solicitation's
 * source option, an advertisement's target option), else
 * 00:00:00:00:00:00. Throws RangeError for addresses that are not 16 bytes
 * (a programming error, not input from the wire).
 */
export function ndpFrameFromIcmp6(r: ReceivedIcmp6): Buffer {
  if (r.src.length !== 16 || r.dst.length !== 16) throw new RangeError('IPv6 source and destination must be 16 bytes each');
  const frame = Buffer.alloc(ETH_HEADER_LEN + IPV6_HEADER_LEN + r.message.length);
  const dst = Buffer.from(r.dst.buffer, r.dst.byteOffset, 16);
  if (dst[0] === 0xff) frame.set([0x33, 0x33, dst[12]!, dst[13]!, dst[14]!, dst[15]!], 0);
  frame.set(ownLinkLayerOption(r.message) ?? ZERO_MAC, 6);
  frame.writeUInt16BE(0x86dd, 12);
  const ip = ETH_HEADER_LEN;
  frame.writeUInt32BE(0x60000000, ip);
  frame.writeUInt16BE(Math.min(r.message.length, 0xffff), ip + 4);
  frame[ip + 6] = IPPROTO_ICMPV6;
  frame[ip + 7] = r.hopLimit & 0xff;
  frame.set(r.src, ip + 8);
  frame.set(r.dst, ip + 24);
  frame.set(r.message, ip + IPV6_HEADER_LEN);
  return frame;
}
