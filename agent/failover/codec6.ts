// Codec layer (pure, no I/O): VRRPv3 advertisements for IPv6 (RFC 5798
// §5.1.2), framed whole - Ethernet, fixed IPv6 header, VRRP message - for
// the driver's AF_PACKET socket. The IPv4 twin is codec.ts; the VRRP message
// is the same but for 16-octet addresses and the IPv6 pseudo-header in its
// checksum (§5.2.8, RFC 8200 §8.1). Decode never throws: a malformed frame
// comes back as { ok: false, reason } with a reason from DROP_REASONS.
import { LbError } from '../errors';
import { addressFromBytes, addressToBytes } from '../address';
import { ETH_HEADER_LEN, IPPROTO_VRRP, IPV6_HEADER_LEN, decodeIpv6Frame, encodeIpv6Frame, internetChecksum, ipv6PseudoHeaderSum } from '../net/packet/inet';
import { bpfIpv6NextHeaderPayloadByte, type BpfProgram } from '../net/packet/bpf';
import { MAX_ADVER_INT_CS, VRRP_HEADER_LEN, VRRP_TOS, VRRP_TYPE_ADVERTISEMENT, VRRP_VERSION, checkAdvertisement, checkVrid, type DropReason } from './codec';

/** RFC 5798 §5.1.2.2: ff02::12. */
export const VRRP6_MULTICAST_IP = (0xff02n << 112n) | 0x12n;
/** The Ethernet group address of ff02::12 (RFC 2464 §7). */
export const VRRP6_MULTICAST_MAC: Readonly<Buffer> = Buffer.from([0x33, 0x33, 0x00, 0x00, 0x00, 0x12]);
/** RFC 5798 §5.1.2.3: sent with hop limit 255, and §7.1: received ones MUST have it. */
export const VRRP6_HOP_LIMIT = 255;
/** Octets of one IPv6 address in the message (§5.2.9). */
const ADDRESS_LEN = 16;

const LINK_LOCAL_PREFIX = 0xfe80n >> 6n; // fe80::/10
/** fe80::/10 (RFC 4291 §2.5.6). */
export function isLinkLocal6(a: bigint): boolean {
  return a >> 118n === LINK_LOCAL_PREFIX;
}

/** The VRRP message proper (§5.2) with IPv6 addresses. */
export interface Advertisement6 {
  readonly vrid: number;
  readonly priority: number;
  readonly maxAdverIntCs: number;
  /** IPv6 addresses as unsigned 128-bit integers (§5.2.9). */
  readonly addresses: readonly bigint[];
}

export interface Advertisement6Frame extends Advertisement6 {
  readonly dstMac: Buffer;
  readonly srcMac: Buffer;
  readonly trafficClass: number;
  readonly hopLimit: number;
  readonly src: bigint;
  readonly dst: bigint;
  /** The VRRP checksum as received (already verified). */
  readonly checksum: number;
}

export type Decode6Result =
  | { readonly ok: true; readonly frame: Advertisement6Frame }
  | { readonly ok: false; readonly reason: DropReason };

export interface Encode6Options extends Advertisement6 {
  /** Source: the link-local address of the interface (§5.1.2.1); a global one only towards a unicast peer. */
  readonly src: bigint;
  /** Default the virtual router MAC 00:00:5e:00:02:<vrid> (§7.3). */
  readonly srcMac?: Uint8Array | undefined;
  /** Default ff02::12 and its group MAC. */
  readonly dst?: bigint | undefined;
  readonly dstMac?: Uint8Array | undefined;
  /** Default 255; anything else only to forge test frames. */
  readonly hopLimit?: number | undefined;
  readonly trafficClass?: number | undefined;
  /** Default 3 and 1; other values only to forge frames. */
  readonly version?: number | undefined;
  readonly type?: number | undefined;
}

/** RFC 5798 §7.3: the IPv6 virtual router MAC address 00-00-5E-00-02-{VRID}. */
export function virtualRouterMac6(vrid: number): Buffer {
  checkVrid(vrid);
  return Buffer.from([0x00, 0x00, 0x5e, 0x00, 0x02, vrid]);
}

/** The message alone (8 octets + 16 per address), checksummed over the IPv6 pseudo-header of src -> dst. */
export function encodeMessage6(a: Advertisement6, src: bigint, dst: bigint, version = VRRP_VERSION, type = VRRP_TYPE_ADVERTISEMENT): Buffer {
  checkAdvertisement(a);
  const len = VRRP_HEADER_LEN + ADDRESS_LEN * a.addresses.length;
  const b = Buffer.alloc(len);
  b[0] = ((version & 0x0f) << 4) | (type & 0x0f);
  b[1] = a.vrid;
  b[2] = a.priority;
  b[3] = a.addresses.length;
  b.writeUInt16BE(a.maxAdverIntCs & MAX_ADVER_INT_CS, 4);
  a.addresses.forEach((v, i) => addressToBytes({ family: 'IPv6', value: v }).copy(b, VRRP_HEADER_LEN + ADDRESS_LEN * i));
  const sum = ipv6PseudoHeaderSum(addressToBytes({ family: 'IPv6', value: src }), addressToBytes({ family: 'IPv6', value: dst }), IPPROTO_VRRP, len);
  b.writeUInt16BE(internetChecksum(b, 0, len, sum), 6);
  return b;
}

/** A complete Ethernet frame carrying one IPv6 advertisement. */
export function encodeAdvertisement6(o: Encode6Options): Buffer {
  const dst = o.dst ?? VRRP6_MULTICAST_IP;
  const msg = encodeMessage6(o, o.src, dst, o.version ?? VRRP_VERSION, o.type ?? VRRP_TYPE_ADVERTISEMENT);
  const dstMac = o.dstMac ?? VRRP6_MULTICAST_MAC;
  const srcMac = o.srcMac ?? virtualRouterMac6(o.vrid);
  if (dstMac.length !== 6 || srcMac.length !== 6) throw new LbError('LB_ERR_VRRP_INVALID', 'a MAC address has 6 octets', { vrid: o.vrid });
  const frame = encodeIpv6Frame({
    dstMac, srcMac, trafficClass: o.trafficClass ?? VRRP_TOS, flowLabel: 0,
    nextHeader: IPPROTO_VRRP, hopLimit: o.hopLimit ?? VRRP6_HOP_LIMIT, src: o.src, dst,
  }, msg.length);
  msg.copy(frame, ETH_HEADER_LEN + IPV6_HEADER_LEN);
  return frame;
}

/**
 * Decode and validate one Ethernet frame: RFC 5798 §7.1's checks that need
 * no configuration (hop limit, version, type, length, checksum) and the
 * source of §5.1.2.1 (link-local, for an advert to ff02::12; a unicast
 * advert may come from a peer's global address, as keepalived's
 * unicast_peer sends them). VRRP behind extension headers is not VRRP
 * here: no implementation sends it, and the kernel filter never passes it.
 */
export function decodeAdvertisement6(frame: Uint8Array): Decode6Result {
  const fail = (reason: DropReason): Decode6Result => ({ ok: false, reason });
  const d = decodeIpv6Frame(frame);
  if (!d.ok) return fail(d.reason === 'truncated' ? 'truncated' : 'not-vrrp');
  const p = d.packet;
  if (p.nextHeader !== IPPROTO_VRRP) return fail('not-vrrp');
  // §7.1: a packet that crossed a router did not come from this link.
  if (p.hopLimit !== VRRP6_HOP_LIMIT) return fail('bad-hop-limit');
  const v = p.payloadStart;
  const vlen = p.payloadEnd - p.payloadStart;
  if (vlen < VRRP_HEADER_LEN) return fail('truncated');
  if (frame[v]! >> 4 !== VRRP_VERSION) return fail('bad-version');
  if ((frame[v]! & 0x0f) !== VRRP_TYPE_ADVERTISEMENT) return fail('bad-type');
  const count = frame[v + 3]!;
  if (vlen !== VRRP_HEADER_LEN + ADDRESS_LEN * count) return fail('bad-length');
  const sum = ipv6PseudoHeaderSum(frame.subarray(ETH_HEADER_LEN + 8, ETH_HEADER_LEN + 24), frame.subarray(ETH_HEADER_LEN + 24, ETH_HEADER_LEN + 40), IPPROTO_VRRP, vlen);
  if (internetChecksum(frame, v, v + vlen, sum) !== 0) return fail('bad-checksum');
  const src = p.src;
  if (src === 0n || src >> 120n === 0xffn) return fail('bad-source');
  if (p.dst === VRRP6_MULTICAST_IP && !isLinkLocal6(src)) return fail('bad-source');
  const vrid = frame[v + 1]!;
  if (vrid === 0) return fail('not-vrrp');
  const addresses: bigint[] = [];
  for (let i = 0; i < count; i++) addresses.push(addressFromBytes('IPv6', frame, v + VRRP_HEADER_LEN + ADDRESS_LEN * i).value);
  return {
    ok: true,
    frame: {
      dstMac: Buffer.from(frame.subarray(0, 6)),
      srcMac: Buffer.from(frame.subarray(6, 12)),
      trafficClass: p.trafficClass,
      hopLimit: p.hopLimit,
      src,
      dst: p.dst,
      vrid,
      priority: frame[v + 2]!,
      maxAdverIntCs: ((frame[v + 4]! << 8) | frame[v + 5]!) & MAX_ADVER_INT_CS,
      checksum: (frame[v + 6]! << 8) | frame[v + 7]!,
      addresses,
    },
  };
}

/**
 * The kernel-side filter of one IPv6 virtual router's socket: IPv6, next
 * header 112, this VRID. `tcpdump -dd 'ip6 and ip6[6] = 112 and ip6[41] = <vrid>'`.
 */
export function vrrpFilter6(vrid: number): BpfProgram {
  checkVrid(vrid);
  return bpfIpv6NextHeaderPayloadByte(IPPROTO_VRRP, 1, vrid);
}
