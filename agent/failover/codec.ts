// Codec layer (pure, no I/O): VRRPv3 advertisements for IPv4 (RFC 5798 §5),
// framed whole - Ethernet, IPv4 header, VRRP message - because the driver
// sends and receives them on an AF_PACKET socket. Owns the wire format, the
// checksums and the receive-side validation of §7.1; knows nothing of the
// state machine. Decode never throws: a malformed frame from the LAN comes
// back as { ok: false, reason }, and the reason becomes a metric label.
import { LbError } from '../errors';
import { ipv4FromBytes } from '../address';
import {
  ETH_HEADER_LEN, IPPROTO_VRRP, IPV4_HEADER_LEN, decodeIpv4Frame, encodeIpv4Frame, internetChecksum, pseudoHeaderSum,
} from '../net/packet/inet';
import { bpfIpProtoPayloadByte, type BpfProgram } from '../net/packet/bpf';

export const VRRP_VERSION = 3;
/** The only VRRP packet type (RFC 5798 §5.2.2). */
export const VRRP_TYPE_ADVERTISEMENT = 1;
/** RFC 5798 §5.1.1.3: sent with TTL 255, and §7.1: received ones MUST have it. */
export const VRRP_TTL = 255;
/** RFC 5798 §5.1.1.2: 224.0.0.18. */
export const VRRP_MULTICAST_IP = 0xe0000012;
/** The Ethernet group address of 224.0.0.18 (RFC 1112 §6.4 mapping). */
export const VRRP_MULTICAST_MAC: Readonly<Buffer> = Buffer.from([0x01, 0x00, 0x5e, 0x00, 0x00, 0x12]);
/** RFC 5798 §5.2.5: Count IPvX Addrs is one octet. */
export const MAX_ADDRESSES = 255;
/** RFC 5798 §5.2.7: Max Adver Int is 12 bits of centiseconds. */
export const MAX_ADVER_INT_CS = 0x0fff;
/**
 * IP TOS byte: precedence 6, "internetwork control" (DSCP CS6). RFC 5798 does
 * not set one; keepalived sends 0xc0 and so do we, so that a LAN that honours
 * DSCP queues adverts with routing protocols rather than behind bulk traffic.
 */
export const VRRP_TOS = 0xc0;

export const VRRP_HEADER_LEN = 8;

/**
 * Every reason the IPv4 (decodeAdvertisement) and IPv6 (codec6.ts) decoders
 * give for refusing a frame; also the `reason` label of
 * lbagent_vrrp_dropped_total. bad-ttl is IPv4's TTL, bad-hop-limit IPv6's;
 * bad-source is an IPv6 advert to ff02::12 from an address that is not
 * link-local (RFC 5798 §5.1.2.1), or from a multicast or unspecified one.
 */
export const DROP_REASONS = [
  'truncated',
  'not-vrrp',
  'bad-length',
  'bad-ip-checksum',
  'bad-ttl',
  'bad-hop-limit',
  'bad-source',
  'bad-version',
  'bad-type',
  'bad-checksum',
] as const;
export type DropReason = (typeof DROP_REASONS)[number];

/** The VRRP message proper (RFC 5798 §5.2). */
export interface Advertisement {
  /** Virtual Router Identifier, 1-255 (§5.2.3). */
  readonly vrid: number;
  /** 0 = the Master resigns (§5.2.4), 255 = address owner, 1-254 = backups. */
  readonly priority: number;
  /** Max Adver Int in centiseconds, 1-4095 (§5.2.7). */
  readonly maxAdverIntCs: number;
  /** IPv4 addresses as unsigned 32-bit numbers (§5.2.9). */
  readonly addresses: readonly number[];
}

/** A decoded frame: the advertisement and the headers it came in. */
export interface AdvertisementFrame extends Advertisement {
  readonly dstMac: Buffer;
  readonly srcMac: Buffer;
  readonly tos: number;
  readonly ipId: number;
  /** The 3 IP flag bits (bit 1 = DF); fragments are refused, so MF is always 0 here. */
  readonly ipFlags: number;
  readonly ttl: number;
  readonly srcIp: number;
  readonly dstIp: number;
  /** The VRRP checksum as received (already verified). */
  readonly checksum: number;
}

export type DecodeResult =
  | { readonly ok: true; readonly frame: AdvertisementFrame }
  | { readonly ok: false; readonly reason: DropReason };

export interface EncodeOptions extends Advertisement {
  /** Source IP: the sender's primary address on the interface (§5.1.1.1). */
  readonly srcIp: number;
  /** Default: the virtual router MAC 00:00:5e:00:01:<vrid> (§7.3). */
  readonly srcMac?: Uint8Array | undefined;
  /** Default 224.0.0.18 and its group MAC. */
  readonly dstIp?: number | undefined;
  readonly dstMac?: Uint8Array | undefined;
  /** Default 255; anything else is only for forging test frames. */
  readonly ttl?: number | undefined;
  readonly tos?: number | undefined;
  /** IP identification; the caller counts (an AF_PACKET frame gets no help from the kernel). */
  readonly ipId?: number | undefined;
  readonly ipFlags?: number | undefined;
  /** Default 3 and 1; other values only to forge frames that receivers must refuse. */
  readonly version?: number | undefined;
  readonly type?: number | undefined;
}

/** RFC 5798 §7.3: the virtual router MAC address 00-00-5E-00-01-{VRID}. */
export function virtualRouterMac(vrid: number): Buffer {
  checkVrid(vrid);
  return Buffer.from([0x00, 0x00, 0x5e, 0x00, 0x01, vrid]);
}

export function checkVrid(vrid: number): void {
  if (!Number.isInteger(vrid) || vrid < 1 || vrid > 255) {
    throw new LbError('LB_ERR_VRRP_INVALID', `VRRP virtual router id ${vrid} is out of range: use 1-255 (RFC 5798 §5.2.3)`, { vrid });
  }
}

/** The fields both families share, checked before encoding; the addresses only by count. */
export function checkAdvertisement(a: Omit<Advertisement, 'addresses'> & { readonly addresses: readonly unknown[] }): void {
  checkVrid(a.vrid);
  if (!Number.isInteger(a.priority) || a.priority < 0 || a.priority > 255) {
    throw new LbError('LB_ERR_VRRP_INVALID', `VRRP priority ${a.priority} is out of range: use 0-255`, { vrid: a.vrid, priority: a.priority });
  }
  if (!Number.isInteger(a.maxAdverIntCs) || a.maxAdverIntCs < 1 || a.maxAdverIntCs > MAX_ADVER_INT_CS) {
    throw new LbError('LB_ERR_VRRP_INVALID', `VRRP advertisement interval ${a.maxAdverIntCs} cs is out of range: use 1-4095 centiseconds (0.01-40.95 s)`, { vrid: a.vrid });
  }
  if (a.addresses.length > MAX_ADDRESSES) {
    throw new LbError('LB_ERR_VRRP_INVALID', `VRRP advertisement for VRID ${a.vrid} lists ${a.addresses.length} addresses; at most 255 fit (RFC 5798 §5.2.5): spread the services over more VRIDs`, { vrid: a.vrid });
  }
}

/**
 * The VRRP message alone (8 octets + 4 per address) with its checksum over
 * the pseudo-header of srcIp -> dstIp (RFC 5798 §5.2.8).
 */
export function encodeMessage(a: Advertisement, srcIp: number, dstIp: number, version = VRRP_VERSION, type = VRRP_TYPE_ADVERTISEMENT): Buffer {
  checkAdvertisement(a);
  const len = VRRP_HEADER_LEN + 4 * a.addresses.length;
  const b = Buffer.alloc(len);
  b[0] = ((version & 0x0f) << 4) | (type & 0x0f);
  b[1] = a.vrid;
  b[2] = a.priority;
  b[3] = a.addresses.length;
  // §5.2.6: the 4 reserved bits above Max Adver Int MUST be zero on send.
  b.writeUInt16BE(a.maxAdverIntCs & MAX_ADVER_INT_CS, 4);
  a.addresses.forEach((ip, i) => b.writeUInt32BE(ip >>> 0, VRRP_HEADER_LEN + 4 * i));
  b.writeUInt16BE(internetChecksum(b, 0, len, pseudoHeaderSum(srcIp, dstIp, IPPROTO_VRRP, len)), 6);
  return b;
}

/** A complete Ethernet frame carrying one advertisement, ready for a packet socket. */
export function encodeAdvertisement(o: EncodeOptions): Buffer {
  const dstIp = (o.dstIp ?? VRRP_MULTICAST_IP) >>> 0;
  const msg = encodeMessage(o, o.srcIp, dstIp, o.version ?? VRRP_VERSION, o.type ?? VRRP_TYPE_ADVERTISEMENT);
  const dstMac = o.dstMac ?? VRRP_MULTICAST_MAC;
  const srcMac = o.srcMac ?? virtualRouterMac(o.vrid);
  if (dstMac.length !== 6 || srcMac.length !== 6) {
    throw new LbError('LB_ERR_VRRP_INVALID', 'a MAC address has 6 octets', { vrid: o.vrid });
  }
  const frame = encodeIpv4Frame({
    dstMac, srcMac, tos: o.tos ?? VRRP_TOS, id: o.ipId ?? 0, flags: o.ipFlags ?? 0,
    ttl: o.ttl ?? VRRP_TTL, protocol: IPPROTO_VRRP, srcIp: o.srcIp, dstIp,
  }, msg.length);
  msg.copy(frame, ETH_HEADER_LEN + IPV4_HEADER_LEN);
  return frame;
}

/**
 * Decode and validate one Ethernet frame (RFC 5798 §7.1 receive checks that
 * need no configuration: TTL, version, type, length, checksum). Trailing
 * Ethernet padding past the IP total length is ignored. Never throws.
 */
export function decodeAdvertisement(frame: Uint8Array): DecodeResult {
  const fail = (reason: DropReason): DecodeResult => ({ ok: false, reason });
  const d = decodeIpv4Frame(frame);
  if (!d.ok) {
    return fail(d.reason === 'not-ipv4' ? 'not-vrrp'
      : d.reason === 'bad-header-length' || d.reason === 'bad-total-length' ? 'bad-length' : d.reason);
  }
  const p = d.packet;
  if (p.protocol !== IPPROTO_VRRP) return fail('not-vrrp');
  const flagsFrag = p.flagsFrag;
  // A fragment holds only part of a message; VRRP packets are never
  // fragmented in practice (at most 1028 octets), so none is reassembled.
  if ((flagsFrag & 0x2000) !== 0 || (flagsFrag & 0x1fff) !== 0) return fail('truncated');
  // §7.1: "MUST verify that the IP TTL is 255": a packet that crossed a
  // router did not come from this LAN.
  if (p.ttl !== VRRP_TTL) return fail('bad-ttl');
  const v = p.payloadStart;
  const vlen = p.payloadEnd - p.payloadStart;
  if (vlen < VRRP_HEADER_LEN) return fail('truncated');
  if (frame[v]! >> 4 !== VRRP_VERSION) return fail('bad-version');
  if ((frame[v]! & 0x0f) !== VRRP_TYPE_ADVERTISEMENT) return fail('bad-type');
  const count = frame[v + 3]!;
  // §7.1: the packet must hold exactly the fixed fields and Count addresses.
  if (vlen !== VRRP_HEADER_LEN + 4 * count) return fail('bad-length');
  const { srcIp, dstIp } = p;
  if (internetChecksum(frame, v, v + vlen, pseudoHeaderSum(srcIp, dstIp, IPPROTO_VRRP, vlen)) !== 0) return fail('bad-checksum');
  const vrid = frame[v + 1]!;
  // VRID 0 is not a virtual router (§5.2.3: 1-255); nothing can match it.
  if (vrid === 0) return fail('not-vrrp');
  const addresses: number[] = [];
  for (let i = 0; i < count; i++) addresses.push(ipv4FromBytes(frame, v + VRRP_HEADER_LEN + 4 * i));
  return {
    ok: true,
    frame: {
      dstMac: Buffer.from(frame.subarray(0, 6)),
      srcMac: Buffer.from(frame.subarray(6, 12)),
      tos: p.tos,
      ipId: p.id,
      ipFlags: flagsFrag >> 13,
      ttl: p.ttl,
      srcIp,
      dstIp,
      vrid,
      priority: frame[v + 2]!,
      // §5.2.6/§7.1: the reserved bits are ignored on receive.
      maxAdverIntCs: ((frame[v + 4]! << 8) | frame[v + 5]!) & MAX_ADVER_INT_CS,
      checksum: (frame[v + 6]! << 8) | frame[v + 7]!,
      addresses,
    },
  };
}

/** Seconds (config) to the centiseconds the wire carries, clamped to 1-4095. */
export function secondsToCentiseconds(seconds: number): number {
  const cs = Math.round(seconds * 100);
  return Math.min(MAX_ADVER_INT_CS, Math.max(1, cs));
}

/**
 * The kernel-side filter of one virtual router's socket: IPv4, protocol 112,
 * and this VRID in the VRRP header. Instruction for instruction what
 * `tcpdump -dd 'ip proto 112 and ip[1 + (ip[0] & 0xf) * 4] = <vrid>'` emits,
 * so an operator can check it with tcpdump. Filtering on the VRID in the
 * kernel means several routers on one interface each wake only for their own
 * adverts, and a malformed advert is counted once, by the router it names.
 */
export function vrrpFilter(vrid: number): BpfProgram {
  checkVrid(vrid);
  // The VRID is byte 1 of the VRRP header (RFC 5798 §5.2).
  return bpfIpProtoPayloadByte(IPPROTO_VRRP, 1, vrid);
}
