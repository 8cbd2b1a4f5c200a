// Framing layer (pure, no I/O): the Internet checksum (RFC 1071), the IPv4
// and IPv6 pseudo-header sums (RFC 768, RFC 8200 §8.1), and the Ethernet II +
// IPv4 or IPv6 header that the packet-socket codecs (dhcp/codec.ts,
// failover/codec.ts, neighbour/ndp.ts) wrap around their payloads and read
// back. The one home of these bytes; codecs own only what follows the IP header.
import { addressFromBytes, addressToBytes, ipv4FromBytes } from '../../address';

export const ETHERTYPE_IPV4 = 0x0800;
export const ETHERTYPE_ARP = 0x0806;
export const ETHERTYPE_IPV6 = 0x86dd;
export const IPPROTO_UDP = 17;
/** VRRP (RFC 5798 §5.1.1.4). */
export const IPPROTO_VRRP = 112;
/** ICMPv6 (RFC 4443), the next header of neighbour discovery. */
export const IPPROTO_ICMPV6 = 58;
export const ETH_HEADER_LEN = 14;
/** An IPv4 header without options (IHL 5), which is all we send. */
export const IPV4_HEADER_LEN = 20;
export const UDP_HEADER_LEN = 8;
/** The fixed IPv6 header (RFC 8200 §3); extension headers follow it. */
export const IPV6_HEADER_LEN = 40;

/** Fold carries back into 16 bits (RFC 1071 §2(B)). */
function fold(s: number): number {
  let x = s;
  while (x > 0xffff) x = (x & 0xffff) + Math.floor(x / 0x10000);
  return x;
}

/** RFC 1071 one's-complement sum of 16-bit words, folded; not yet complemented. */
function sum16(buf: Uint8Array, start: number, end: number, acc: number): number {
  let s = acc;
  let i = start;
  for (; i + 1 < end; i += 2) s += (buf[i]! << 8) | buf[i + 1]!;
  if (i < end) s += buf[i]! << 8; // odd length: pad with a zero octet
  return fold(s);
}

/**
 * The Internet checksum (RFC 1071) of buf[start, end), plus an initial
 * partial sum (a pseudo-header). Over data that holds a correct checksum it
 * is 0, which is how receivers verify.
 */
export function internetChecksum(buf: Uint8Array, start = 0, end = buf.length, initial = 0): number {
  return ~sum16(buf, start, end, initial) & 0xffff;
}

/** The IPv4 pseudo-header (RFC 768 layout) that UDP, and VRRPv3 (RFC 5798 §5.2.8), sum first. */
export function pseudoHeaderSum(srcIp: number, dstIp: number, protocol: number, length: number): number {
  const s = srcIp >>> 0;
  const d = dstIp >>> 0;
  return fold((s >>> 16) + (s & 0xffff) + (d >>> 16) + (d & 0xffff) + protocol + length);
}

/** The UDP checksum (RFC 768) of a segment (header and data) as it is; 0 over a correct one. */
export function udpChecksum(srcIp: number, dstIp: number, segment: Uint8Array): number {
  return internetChecksum(segment, 0, segment.length, pseudoHeaderSum(srcIp, dstIp, IPPROTO_UDP, segment.length));
}

export interface Ipv4FrameHeader {
  readonly dstMac: Uint8Array;
  readonly srcMac: Uint8Array;
  readonly tos: number;
  /** IPv4 identification. */
  readonly id: number;
  /** The 3 flag bits (DF = 2, MF = 1); the fragment offset is always 0. */
  readonly flags: number;
  readonly ttl: number;
  readonly protocol: number;
  readonly srcIp: number;
  readonly dstIp: number;
}

/** A zeroed Ethernet II frame of `length` octets after its header, the header written. */
function ethernetFrame(h: { readonly dstMac: Uint8Array; readonly srcMac: Uint8Array }, etherType: number, length: number): Buffer {
  const frame = Buffer.alloc(ETH_HEADER_LEN + length);
  frame.set(h.dstMac, 0);
  frame.set(h.srcMac, 6);
  frame.writeUInt16BE(etherType, 12);
  return frame;
}

/**
 * An Ethernet II frame with an IPv4 header (IHL 5, header checksum filled in)
 * and `payloadLength` octets after it; the caller writes its payload at
 * ETH_HEADER_LEN + IPV4_HEADER_LEN.
 */
export function encodeIpv4Frame(h: Ipv4FrameHeader, payloadLength: number): Buffer {
  const frame = ethernetFrame(h, ETHERTYPE_IPV4, IPV4_HEADER_LEN + payloadLength);
  const ip = ETH_HEADER_LEN;
  frame[ip] = 0x45; // version 4, IHL 5: no options
  frame[ip + 1] = h.tos & 0xff;
  frame.writeUInt16BE(IPV4_HEADER_LEN + payloadLength, ip + 2);
  frame.writeUInt16BE(h.id & 0xffff, ip + 4);
  frame.writeUInt16BE((h.flags & 0x7) << 13, ip + 6);
  frame[ip + 8] = h.ttl & 0xff;
  frame[ip + 9] = h.protocol & 0xff;
  frame.writeUInt32BE(h.srcIp >>> 0, ip + 12);
  frame.writeUInt32BE(h.dstIp >>> 0, ip + 16);
  frame.writeUInt16BE(internetChecksum(frame, ip, ip + IPV4_HEADER_LEN), ip + 10);
  return frame;
}

export interface Ipv4FrameView {
  readonly tos: number;
  readonly id: number;
  /** The 16-bit flags + fragment offset field. */
  readonly flagsFrag: number;
  readonly ttl: number;
  readonly protocol: number;
  readonly srcIp: number;
  readonly dstIp: number;
  /** Offsets in the frame: the IPv4 payload is frame[payloadStart, payloadEnd) (Ethernet padding excluded). */
  readonly payloadStart: number;
  readonly payloadEnd: number;
}

/** Why a frame is not a well-formed IPv4 packet; each codec maps these onto its own drop reasons. */
export type Ipv4FrameProblem = 'truncated' | 'not-ipv4' | 'bad-header-length' | 'bad-total-length' | 'bad-ip-checksum';

/**
 * Read the Ethernet II + IPv4 header of a frame: EtherType and version 4,
 * header length, header checksum, total length within the frame. Never
 * throws; what the payload is (protocol, fragments, TTL) is the caller's to judge.
 */
export function decodeIpv4Frame(frame: Uint8Array): { ok: true; packet: Ipv4FrameView } | { ok: false; reason: Ipv4FrameProblem } {
  if (frame.length < ETH_HEADER_LEN) return { ok: false, reason: 'truncated' };
  if (((frame[12]! << 8) | frame[13]!) !== ETHERTYPE_IPV4) return { ok: false, reason: 'not-ipv4' };
  const ip = ETH_HEADER_LEN;
  const avail = frame.length - ip;
  if (avail < IPV4_HEADER_LEN) return { ok: false, reason: 'truncated' };
  if (frame[ip]! >> 4 !== 4) return { ok: false, reason: 'not-ipv4' };
  const ihl = (frame[ip]! & 0x0f) * 4;
  if (ihl < IPV4_HEADER_LEN) return { ok: false, reason: 'bad-header-length' };
  if (avail < ihl) return { ok: false, reason: 'truncated' };
  if (internetChecksum(frame, ip, ip + ihl) !== 0) return { ok: false, reason: 'bad-ip-checksum' };
  const totalLen = (frame[ip + 2]! << 8) | frame[ip + 3]!;
  if (totalLen < ihl) return { ok: false, reason: 'bad-total-length' };
  // Ethernet pads short frames to 60 octets: the IP total length, not the frame, says where the packet ends.
  if (totalLen > avail) return { ok: false, reason: 'truncated' };
  return {
    ok: true,
    packet: {
      tos: frame[ip + 1]!,
      id: (frame[ip + 4]! << 8) | frame[ip + 5]!,
      flagsFrag: (frame[ip + 6]! << 8) | frame[ip + 7]!,
      ttl: frame[ip + 8]!,
      protocol: frame[ip + 9]!,
      srcIp: ipv4FromBytes(frame, ip + 12),
      dstIp: ipv4FromBytes(frame, ip + 16),
      payloadStart: ip + ihl,
      payloadEnd: ip + totalLen,
    },
  };
}

/**
 * The IPv6 pseudo-header (RFC 8200 §8.1) that ICMPv6 (RFC 4443 §2.3) and UDP
 * over IPv6 sum first: source and destination addresses (16 octets each,
 * network order), the upper-layer packet length as 32 bits, three zero
 * octets and the next header.
 */
export function ipv6PseudoHeaderSum(src: Uint8Array, dst: Uint8Array, nextHeader: number, length: number): number {
  let s = 0;
  for (const a of [src, dst]) for (let i = 0; i < 16; i += 2) s += (a[i]! << 8) | a[i + 1]!;
  s += Math.floor(length / 0x10000) + (length & 0xffff) + (nextHeader & 0xff);
  return fold(s);
}

export interface Ipv6FrameHeader {
  readonly dstMac: Uint8Array;
  readonly srcMac: Uint8Array;
  readonly trafficClass: number;
  /** 20 bits. */
  readonly flowLabel: number;
  readonly nextHeader: number;
  readonly hopLimit: number;
  /** Addresses as unsigned 128-bit integers (Address.value of agent/address.ts). */
  readonly src: bigint;
  readonly dst: bigint;
}

/**
 * An Ethernet II frame with a fixed IPv6 header (no extension headers) and
 * `payloadLength` octets after it; the caller writes its payload at
 * ETH_HEADER_LEN + IPV6_HEADER_LEN.
 */
export function encodeIpv6Frame(h: Ipv6FrameHeader, payloadLength: number): Buffer {
  const frame = ethernetFrame(h, ETHERTYPE_IPV6, IPV6_HEADER_LEN + payloadLength);
  const ip = ETH_HEADER_LEN;
  // version 6, traffic class (8 bits), flow label (20 bits)
  frame.writeUInt32BE(((6 << 28) | ((h.trafficClass & 0xff) << 20) | (h.flowLabel & 0xfffff)) >>> 0, ip);
  frame.writeUInt16BE(payloadLength, ip + 4);
  frame[ip + 6] = h.nextHeader & 0xff;
  frame[ip + 7] = h.hopLimit & 0xff;
  addressToBytes({ family: 'IPv6', value: h.src }).copy(frame, ip + 8);
  addressToBytes({ family: 'IPv6', value: h.dst }).copy(frame, ip + 24);
  return frame;
}

export interface Ipv6FrameView {
  readonly trafficClass: number;
  readonly flowLabel: number;
  readonly nextHeader: number;
  readonly hopLimit: number;
  readonly src: bigint;
  readonly dst: bigint;
  /** Offsets in the frame: the IPv6 payload is frame[payloadStart, payloadEnd) (Ethernet padding excluded). */
  readonly payloadStart: number;
  readonly payloadEnd: number;
}

/** Why a frame is not a well-formed IPv6 packet; each codec maps these onto its own drop reasons. */
export type Ipv6FrameProblem = 'truncated' | 'not-ipv6' | 'bad-ip-version';

/**
 * Read the Ethernet II + fixed IPv6 header of a frame: EtherType, version 6,
 * payload length within the frame. Never throws; what follows (next header,
 * hop limit) is the caller's to judge.
 */
export function decodeIpv6Frame(frame: Uint8Array): { ok: true; packet: Ipv6FrameView } | { ok: false; reason: Ipv6FrameProblem } {
  if (frame.length < ETH_HEADER_LEN) return { ok: false, reason: 'truncated' };
  if (((frame[12]! << 8) | frame[13]!) !== ETHERTYPE_IPV6) return { ok: false, reason: 'not-ipv6' };
  const ip = ETH_HEADER_LEN;
  if (frame.length - ip < IPV6_HEADER_LEN) return { ok: false, reason: 'truncated' };
  if (frame[ip]! >> 4 !== 6) return { ok: false, reason: 'bad-ip-version' };
  const payloadLen = (frame[ip + 4]! << 8) | frame[ip + 5]!;
  const payloadStart = ip + IPV6_HEADER_LEN;
  // Ethernet pads short frames to 60 octets: the payload length, not the frame, says where the packet ends.
  if (payloadStart + payloadLen > frame.length) return { ok: false, reason: 'truncated' };
  return {
    ok: true,
    packet: {
      trafficClass: ((frame[ip]! & 0x0f) << 4) | (frame[ip + 1]! >> 4),
      flowLabel: ((frame[ip + 1]! & 0x0f) << 16) | (frame[ip + 2]! << 8) | frame[ip + 3]!,
      nextHeader: frame[ip + 6]!,
      hopLimit: frame[ip + 7]!,
      src: addressFromBytes('IPv6', frame, ip + 8).value,
      dst: addressFromBytes('IPv6', frame, ip + 24).value,
      payloadStart,
      payloadEnd: payloadStart + payloadLen,
    },
  };
}
