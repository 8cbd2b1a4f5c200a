// The two families' VRRP wire formats behind one face (pure): the driver and
// the gate run one VRRPv3 instance per family (RFC 5798 §5.1: an IPv4
// instance lists only IPv4 addresses, an IPv6 one only IPv6) with the same
// code, and the family is data: which codec (codec.ts for IPv4, codec6.ts for
// IPv6), which EtherType, group MAC and kernel filter, and how an address is
// turned into the number the state machine compares (MachineKeys).
// Addresses cross this boundary as canonical text (dotted quad, RFC 5952).
import type { Family } from '../address';
import { formatAddress, formatIPv4, parseAddress, parseIPv4 } from '../address';
import type { BpfProgram } from '../net/packet/bpf';
import { ETHERTYPE_IPV4, ETHERTYPE_IPV6 } from '../net/packet/inet';
import { VRRP_MULTICAST_IP, VRRP_MULTICAST_MAC, decodeAdvertisement, encodeAdvertisement, virtualRouterMac, vrrpFilter, type DropReason } from './codec';
import { VRRP6_MULTICAST_IP, VRRP6_MULTICAST_MAC, decodeAdvertisement6, encodeAdvertisement6, virtualRouterMac6, vrrpFilter6 } from './codec6';

/** A valid advert of either family, as the driver and the gate read it. */
export interface WireAdvert {
  readonly vrid: number;
  readonly priority: number;
  readonly maxAdverIntCs: number;
  /** The sender's address (IPv4 primary address, IPv6 link-local or, unicast, a peer's global address). */
  readonly src: string;
  readonly addresses: readonly string[];
}

export type WireDecode = { readonly ok: true; readonly advert: WireAdvert } | { readonly ok: false; readonly reason: DropReason };

export interface WireEncode {
  readonly vrid: number;
  readonly priority: number;
  readonly maxAdverIntCs: number;
  readonly addresses: readonly string[];
  readonly src: string;
  readonly srcMac: Uint8Array;
  /** A unicast peer and its MAC; default the family's VRRP group. */
  readonly dst?: string | undefined;
  readonly dstMac?: Uint8Array | undefined;
  /** IPv4 identification (the caller counts); IPv6 has none. */
  readonly ipId?: number | undefined;
}

export interface VrrpWire {
  readonly family: Family;
  /** The EtherType the packet socket binds to. */
  readonly ethertype: number;
  /** The group MAC the NIC must pass up: 01:00:5e:00:00:12 or 33:33:00:00:00:12. */
  readonly multicastMac: Buffer;
  /** The group itself, for logs: 224.0.0.18 or ff02::12. */
  readonly group: string;
  /** §7.3: 00:00:5e:00:01:<vrid> for IPv4, 00:00:5e:00:02:<vrid> for IPv6. */
  virtualMac(vrid: number): Buffer;
  /** The kernel filter: this family, protocol 112, this VRID. */
  filter(vrid: number): BpfProgram;
  /** Canonical text of an address of this family; undefined for anything else. */
  parse(text: string): string | undefined;
  decode(frame: Uint8Array): WireDecode;
  encode(o: WireEncode): Buffer;
}

const ipv4Wire: VrrpWire = {
  family: 'IPv4',
  ethertype: ETHERTYPE_IPV4,
  multicastMac: Buffer.from(VRRP_MULTICAST_MAC),
  group: formatIPv4(VRRP_MULTICAST_IP),
  virtualMac: virtualRouterMac,
  filter: vrrpFilter,
  parse: (text) => { const n = parseIPv4(text); return n === undefined ? undefined : formatIPv4(n); },
  decode(frame) {
    const r = decodeAdvertisement(frame);
    if (!r.ok) return r;
    const f = r.frame;
    return { ok: true, advert: { vrid: f.vrid, priority: f.priority, maxAdverIntCs: f.maxAdverIntCs, src: formatIPv4(f.srcIp), addresses: f.addresses.map(formatIPv4) } };
  },
  encode(o) {
    return encodeAdvertisement({
      vrid: o.vrid, priority: o.priority, maxAdverIntCs: o.maxAdverIntCs,
      addresses: o.addresses.map((a) => parseIPv4(a)!),
      srcIp: parseIPv4(o.src)!, srcMac: o.srcMac,
      dstIp: o.dst === undefined ? undefined : parseIPv4(o.dst), dstMac: o.dstMac, ipId: o.ipId,
    });
  },
};

const v6 = (text: string): bigint | undefined => { const a = parseAddress(text); return a?.family === 'IPv6' ? a.value : undefined; };
const text6 = (value: bigint): string => formatAddress({ family: 'IPv6', value });

const ipv6Wire: VrrpWire = {
  family: 'IPv6',
  ethertype: ETHERTYPE_IPV6,
  multicastMac: Buffer.from(VRRP6_MULTICAST_MAC),
  group: text6(VRRP6_MULTICAST_IP),
  virtualMac: virtualRouterMac6,
  filter: vrrpFilter6,
  parse: (text) => { const n = v6(text); return n === undefined ? undefined : text6(n); },
  decode(frame) {
    const r = decodeAdvertisement6(frame);
    if (!r.ok) return r;
    const f = r.frame;
    return { ok: true, advert: { vrid: f.vrid, priority: f.priority, maxAdverIntCs: f.maxAdverIntCs, src: text6(f.src), addresses: f.addresses.map(text6) } };
  },
  encode(o) {
    return encodeAdvertisement6({
      vrid: o.vrid, priority: o.priority, maxAdverIntCs: o.maxAdverIntCs,
      addresses: o.addresses.map((a) => v6(a)!),
      src: v6(o.src)!, srcMac: o.srcMac,
      dst: o.dst === undefined ? undefined : v6(o.dst), dstMac: o.dstMac,
    });
  },
};

export function vrrpWire(family: Family): VrrpWire {
  return family === 'IPv6' ? ipv6Wire : ipv4Wire;
}

/**
 * The numbers machine.ts compares, for the addresses of one family. The
 * state machine knows a router by a u32 and breaks an equal-priority tie by
 * the higher one (§6.4.3: "the primary IP address of the sender is greater
 * than the local primary IP Address"). An IPv4 address is its own u32. An
 * IPv6 address does not fit, and the machine only ever compares a sender with
 * itself, so each IPv6 address gets a key on the right side of ours: ours is
 * 2^31, a greater address 2^31 + n, a smaller one 2^31 - n, n counting the
 * addresses met. Equal keys are equal addresses and the tie-break is the
 * RFC's. The table is bounded: a LAN that sends adverts from ever new
 * sources (forged ones, without failover.peers) fills it, and then every key
 * but ours and the one the caller keeps (the current Master's) is forgotten
 * and numbering starts again. A change of our own address starts it again
 * too (setOwn).
 */
export class MachineKeys {
  private own: string;
  private ownValue: bigint;
  private readonly byAddress = new Map<string, number>();
  private readonly byKey = new Map<number, string>();
  private next = 1;

  constructor(readonly family: Family, own: string, private readonly limit = 1024) {
    this.own = own;
    this.ownValue = this.value(own);
    this.reset();
  }

  /** The machine's key for an address of this family (text as VrrpWire.parse returns it); `keep` survives a full table. */
  key(address: string, keep?: number): number {
    if (this.family === 'IPv4') return parseIPv4(address)! >>> 0;
    const known = this.byAddress.get(address);
    if (known !== undefined) return known;
    const v = this.value(address);
    if (this.byAddress.size >= this.limit) {
      const kept = keep === undefined ? undefined : this.byKey.get(keep);
      this.forget();
      if (kept !== undefined && keep !== undefined) { this.byAddress.set(kept, keep); this.byKey.set(keep, kept); }
    }
    // n keeps counting across a full table, so a kept key is never handed
    // out again; it wraps after 2^31 - 1 senders, skipping keys still held.
    let n = this.next;
    while (this.byKey.has(OWN_KEY + n) || this.byKey.has(OWN_KEY - n)) n = n >= MAX_N ? 1 : n + 1;
    this.next = n >= MAX_N ? 1 : n + 1;
    const k = v > this.ownValue ? OWN_KEY + n : OWN_KEY - n;
    this.byAddress.set(address, k);
    this.byKey.set(k, address);
    return k;
  }

  /** The address a key stands for. */
  address(key: number): string {
    if (this.family === 'IPv4') return formatIPv4(key);
    return this.byKey.get(key) ?? this.own;
  }

  /** How many addresses have a key (ours included). */
  get size(): number { return this.byAddress.size; }

  /** Our own address changed: keys are handed out afresh; returns our new key. */
  setOwn(address: string): number {
    this.own = address;
    this.ownValue = this.value(address);
    this.reset();
    return this.key(address);
  }

  private reset(): void {
    this.next = 1;
    this.forget();
  }

  /** Every key but ours. */
  private forget(): void {
    this.byAddress.clear();
    this.byKey.clear();
    if (this.family === 'IPv6') {
      this.byAddress.set(this.own, OWN_KEY);
      this.byKey.set(OWN_KEY, this.own);
    }
  }

  private value(address: string): bigint {
    const a = parseAddress(address);
    if (a?.family !== this.family) throw new RangeError(`not an ${this.family} address: ${address}`);
    return a.value;
  }
}

const OWN_KEY = 0x80000000;
const MAX_N = 0x7fffffff;
