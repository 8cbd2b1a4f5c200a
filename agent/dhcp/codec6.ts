// DHCPv6 codec (pure, no I/O): RFC 8415 client/server messages with the
// options an IA_NA client needs (§21), DUIDs (§11), and the Ethernet/IPv6/UDP
// framing around them, because the driver sends and receives whole frames on
// a packet socket bound to the service's macvlan, as the DHCPv4 driver does.
//
// Decoding never throws: a frame from the LAN is either accepted or dropped
// with one of a small fixed set of reasons (Drop6Reason), which the driver
// counts as a metric label. IPv6 addresses are 128-bit bigints (address.ts's
// Address value).
import { formatAddress, formatMac, parseMac } from '../address';
import { ETH_HEADER_LEN, UDP_HEADER_LEN, internetChecksum } from '../net/packet/inet';

export const DHCP6_CLIENT_PORT = 546;
export const DHCP6_SERVER_PORT = 547;
export const ETHERTYPE_IPV6 = 0x86dd;
export const IPV6_HEADER_LEN = 40;
const IPPROTO_UDP = 17;
/** RFC 8415 §7.1: All_DHCP_Relay_Agents_and_Servers, ff02::1:2. */
export const ALL_DHCP_RELAY_AGENTS_AND_SERVERS = 0xff020000000000000000000000010002n;
/** RFC 2464 §7: 33:33 and the low 32 bits of the multicast group. */
export const ALL_DHCP_MAC = '33:33:00:01:00:02';
/**
 * Hop limit of our messages. RFC 8415 §7.1's destination is link-scoped, so
 * 1 suffices and keeps a misrouted copy on the link; dhclient sends 1 too.
 */
export const DHCP6_HOP_LIMIT = 1;

/** Message types (RFC 8415 §7.3). */
export const MsgType6 = {
  SOLICIT: 1, ADVERTISE: 2, REQUEST: 3, CONFIRM: 4, RENEW: 5, REBIND: 6, REPLY: 7, RELEASE: 8, DECLINE: 9,
  RECONFIGURE: 10, INFORMATION_REQUEST: 11, RELAY_FORW: 12, RELAY_REPL: 13,
} as const;
export type Msg6Kind = keyof typeof MsgType6;
const KIND6_BY_CODE = new Map<number, Msg6Kind>((Object.keys(MsgType6) as Msg6Kind[]).map((k) => [MsgType6[k], k]));
export function msg6KindOf(code: number): Msg6Kind | undefined {
  return KIND6_BY_CODE.get(code);
}

/** Option codes we read or write (RFC 8415 §21 section numbers in comments). */
export const Opt6 = {
  CLIENTID: 1,       // §21.2
  SERVERID: 2,       // §21.3
  IA_NA: 3,          // §21.4
  IAADDR: 5,         // §21.6
  ORO: 6,            // §21.7
  PREFERENCE: 7,     // §21.8
  ELAPSED_TIME: 8,   // §21.9
  STATUS_CODE: 13,   // §21.13
  RAPID_COMMIT: 14,  // §21.14
  DNS_SERVERS: 23,   // RFC 3646 §3
  DOMAIN_LIST: 24,   // RFC 3646 §4
} as const;

/** Status codes (RFC 8415 §21.13). */
export const Status6 = {
  Success: 0, UnspecFail: 1, NoAddrsAvail: 2, NoBinding: 3, NotOnLink: 4, UseMulticast: 5, NoPrefixAvail: 6,
} as const;

/** RFC 8415 §7.7: a lifetime of 0xffffffff is infinity. */
export const INFINITE_LIFETIME = 0xffffffff;

/** Why a received frame was dropped: bounded, used as a metric label. */
export const DROP6_REASONS = [
  'truncated',          // shorter than a header or a length field says
  'not-ipv6',           // not Ethernet/IPv6 (other ethertype, IP version != 6)
  'not-udp-546',        // not UDP (an extension header included) to the DHCPv6 client port
  'bad-udp-length',     // UDP length inconsistent with the IPv6 payload length
  'bad-udp-checksum',   // UDP checksum wrong, or zero (RFC 8200 §8.1: mandatory in IPv6)
  'bad-option',         // an option runs past its field, or a known option has a bad length/value
  'not-reply',          // not ADVERTISE or REPLY
  'wrong-xid',          // a reply to a transaction we are not running
  'wrong-client-id',    // no CLIENTID, or another client's (RFC 8415 §16.3, §16.10)
  'no-server-id',       // no SERVERID (RFC 8415 §16.3, §16.10)
] as const;
export type Drop6Reason = (typeof DROP6_REASONS)[number];

export type Decoded6<T> = { ok: true; value: T } | { ok: false; reason: Drop6Reason };

export interface Dhcp6Option {
  readonly code: number;
  readonly data: Buffer;
}

/** A client/server message as on the wire (RFC 8415 §8): options in order and raw. */
export interface Dhcp6Message {
  readonly type: number;
  /** 24 bits. */
  readonly xid: number;
  readonly options: readonly Dhcp6Option[];
}

export interface StatusCode6 {
  readonly code: number;
  /** UTF-8 (RFC 8415 §21.13). */
  readonly message: string;
}

/** IAADDR (§21.6): lifetimes in seconds, its own status if any. */
export interface IaAddress {
  readonly address: bigint;
  readonly preferred: number;
  readonly valid: number;
  readonly status: StatusCode6 | undefined;
}

/** IA_NA (§21.4). */
export interface IaNa {
  readonly iaid: number;
  readonly t1: number;
  readonly t2: number;
  readonly addresses: readonly IaAddress[];
  readonly status: StatusCode6 | undefined;
}

/** The options a client acts on, typed and validated. */
export interface Dhcp6Fields {
  readonly kind: Msg6Kind | undefined;
  readonly clientId: Buffer | undefined;
  readonly serverId: Buffer | undefined;
  readonly iaNa: readonly IaNa[];
  /** Message-level status (§21.13); absent means Success (§18.2.10). */
  readonly status: StatusCode6 | undefined;
  /** §21.8; absent means 0 (§18.2.9). */
  readonly preference: number | undefined;
  /** §21.9, hundredths of a second. */
  readonly elapsed: number | undefined;
  readonly rapidCommit: boolean;
  readonly oro: readonly number[];
  /** RFC 3646 §3. */
  readonly dns: readonly bigint[];
}

export interface Dhcp6Packet {
  readonly message: Dhcp6Message;
  readonly fields: Dhcp6Fields;
}

export interface FrameInfoLike {
  /** TP_STATUS_CSUMNOTREADY: the UDP checksum is a partial one the kernel has not completed. */
  readonly csumNotReady: boolean;
}

export interface Udp6Frame {
  readonly dstMac: string;
  readonly srcMac: string;
  readonly srcIp: bigint;
  readonly dstIp: bigint;
  readonly trafficClass: number;
  readonly flowLabel: number;
  readonly hopLimit: number;
  readonly srcPort: number;
  readonly dstPort: number;
  readonly payload: Buffer;
}

// ---------------------------------------------------------------------------
// Addresses and DUIDs

export function ipv6ToBytes(v: bigint): Buffer {
  const b = Buffer.alloc(16);
  let x = v;
  for (let i = 15; i >= 0; i--) {
    b[i] = Number(x & 0xffn);
    x >>= 8n;
  }
  return b;
}

export function ipv6FromBytes(b: Uint8Array, off = 0): bigint {
  let v = 0n;
  for (let i = 0; i < 16; i++) v = (v << 8n) | BigInt(b[off + i] ?? 0);
  return v;
}

export const formatIPv6 = (v: bigint): string => formatAddress({ family: 'IPv6', value: v });

/** DUID types (RFC 8415 §11.1). */
export const DuidType = { LLT: 1, EN: 2, LL: 3, UUID: 4 } as const;
/** RFC 8415 §11.1: at most 128 octets after the 2-octet type. */
export const MAX_DUID_LENGTH = 130;

/** DUID-LL (RFC 8415 §11.4): type 3, hardware type 1 (Ethernet), the MAC. */
export function duidLl(mac: string): Buffer {
  const m = parseMac(mac) ?? Buffer.alloc(6);
  return Buffer.concat([Buffer.from([0, DuidType.LL, 0, 1]), m]);
}

/** DUID-UUID (RFC 6355 §4): type 4 and the 16 octets of the UUID. */
export function duidUuid(uuid: Uint8Array): Buffer {
  const u = Buffer.alloc(16);
  u.set(uuid.subarray(0, 16));
  return Buffer.concat([Buffer.from([0, DuidType.UUID]), u]);
}

/** For logs: "ll 02:00:00:a0:d6:02", "llt 02:...", else the type and hex. A DUID is otherwise opaque (§11). */
/** A DUID as dnsmasq and Kea print it and `dhcp.servers6` takes it: lowercase hex octets separated by colons. */
export function formatDuid(d: Buffer): string {
  return [...d].map((b) => b.toString(16).padStart(2, '0')).join(':');
}

/** The DUID of formatDuid's text (the config's validated form). */
export function parseDuid(text: string): Buffer {
  return Buffer.from(text.replace(/:/g, ''), 'hex');
}

export function describeDuid(d: Buffer): string {
  if (d.length < 2) return `duid ${d.toString('hex')}`;
  const type = d.readUInt16BE(0);
  if (type === DuidType.LL && d.length === 10 && d.readUInt16BE(2) === 1) return `ll ${formatMac(d.subarray(4))}`;
  if (type === DuidType.LLT && d.length === 14 && d.readUInt16BE(2) === 1) return `llt ${formatMac(d.subarray(8))}`;
  return `duid-${type} ${d.subarray(2).toString('hex')}`;
}

// ---------------------------------------------------------------------------
// Framing

/** The IPv6 pseudo-header sum (RFC 8200 §8.1) that UDP sums first. */
function pseudoHeader6Sum(src: bigint, dst: bigint, length: number): number {
  const ph = Buffer.alloc(40);
  ipv6ToBytes(src).copy(ph, 0);
  ipv6ToBytes(dst).copy(ph, 16);
  ph.writeUInt32BE(length, 32);
  ph[39] = IPPROTO_UDP;
  return ~internetChecksum(ph) & 0xffff;
}

/** The UDP checksum over the IPv6 pseudo-header of a segment as it is; 0 over a correct one. */
export function udp6Checksum(src: bigint, dst: bigint, segment: Uint8Array): number {
  return internetChecksum(segment, 0, segment.length, pseudoHeader6Sum(src, dst, segment.length));
}

export type Udp6FrameInit = Partial<Udp6Frame> & Pick<Udp6Frame, 'srcMac' | 'dstMac' | 'srcIp' | 'dstIp' | 'payload'>;

/** Encode an Ethernet II / IPv6 / UDP frame with the UDP checksum filled in. */
export function encodeUdp6Frame(f: Udp6FrameInit): Buffer {
  const udpLen = UDP_HEADER_LEN + f.payload.length;
  const frame = Buffer.alloc(ETH_HEADER_LEN + IPV6_HEADER_LEN + udpLen);
  (parseMac(f.dstMac) ?? Buffer.alloc(6)).copy(frame, 0);
  (parseMac(f.srcMac) ?? Buffer.alloc(6)).copy(frame, 6);
  frame.writeUInt16BE(ETHERTYPE_IPV6, 12);
  const ip = ETH_HEADER_LEN;
  frame.writeUInt32BE(((6 << 28) | (((f.trafficClass ?? 0) & 0xff) << 20) | ((f.flowLabel ?? 0) & 0xfffff)) >>> 0, ip);
  frame.writeUInt16BE(udpLen, ip + 4);
  frame[ip + 6] = IPPROTO_UDP;
  frame[ip + 7] = f.hopLimit ?? DHCP6_HOP_LIMIT;
  ipv6ToBytes(f.srcIp).copy(frame, ip + 8);
  ipv6ToBytes(f.dstIp).copy(frame, ip + 24);
  const udp = ip + IPV6_HEADER_LEN;
  frame.writeUInt16BE(f.srcPort ?? DHCP6_CLIENT_PORT, udp);
  frame.writeUInt16BE(f.dstPort ?? DHCP6_SERVER_PORT, udp + 2);
  frame.writeUInt16BE(udpLen, udp + 4);
  f.payload.copy(frame, udp + UDP_HEADER_LEN);
  const c = udp6Checksum(f.srcIp, f.dstIp, frame.subarray(udp));
  // RFC 8200 §8.1: a computed zero is sent as all ones; zero is not allowed in IPv6.
  frame.writeUInt16BE(c === 0 ? 0xffff : c, udp + 6);
  return frame;
}

/**
 * Decode an Ethernet/IPv6/UDP frame addressed to `wantPort`. A frame flagged
 * csumNotReady carries a partial checksum a virtual path (veth, macvlan) left
 * for offload; the kernel vouches for it, so it is not verified. Any
 * extension header is dropped as not-udp-546: servers send none.
 */
export function decodeUdp6Frame(frame: Uint8Array, info: FrameInfoLike = { csumNotReady: false }, wantPort = DHCP6_CLIENT_PORT): Decoded6<Udp6Frame> {
  const b = Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength);
  if (b.length < ETH_HEADER_LEN + IPV6_HEADER_LEN) return { ok: false, reason: b.length >= 14 && b.readUInt16BE(12) !== ETHERTYPE_IPV6 ? 'not-ipv6' : 'truncated' };
  if (b.readUInt16BE(12) !== ETHERTYPE_IPV6) return { ok: false, reason: 'not-ipv6' };
  const ip = ETH_HEADER_LEN;
  const first = b.readUInt32BE(ip);
  if (first >>> 28 !== 6) return { ok: false, reason: 'not-ipv6' };
  const payloadLen = b.readUInt16BE(ip + 4);
  const ipEnd = ip + IPV6_HEADER_LEN + payloadLen;
  if (ipEnd > b.length) return { ok: false, reason: 'truncated' };
  if (b[ip + 6] !== IPPROTO_UDP) return { ok: false, reason: 'not-udp-546' };
  const udp = ip + IPV6_HEADER_LEN;
  if (payloadLen < UDP_HEADER_LEN) return { ok: false, reason: 'truncated' };
  const dstPort = b.readUInt16BE(udp + 2);
  if (dstPort !== wantPort) return { ok: false, reason: 'not-udp-546' };
  const udpLen = b.readUInt16BE(udp + 4);
  if (udpLen < UDP_HEADER_LEN || udp + udpLen > ipEnd) return { ok: false, reason: 'bad-udp-length' };
  const srcIp = ipv6FromBytes(b, ip + 8);
  const dstIp = ipv6FromBytes(b, ip + 24);
  if (!info.csumNotReady) {
    if (b.readUInt16BE(udp + 6) === 0 || udp6Checksum(srcIp, dstIp, b.subarray(udp, udp + udpLen)) !== 0) return { ok: false, reason: 'bad-udp-checksum' };
  }
  return {
    ok: true,
    value: {
      dstMac: formatMac(b.subarray(0, 6)),
      srcMac: formatMac(b.subarray(6, 12)),
      srcIp, dstIp,
      trafficClass: (first >>> 20) & 0xff,
      flowLabel: first & 0xfffff,
      hopLimit: b[ip + 7]!,
      srcPort: b.readUInt16BE(udp),
      dstPort,
      payload: Buffer.from(b.subarray(udp + UDP_HEADER_LEN, udp + udpLen)),
    },
  };
}

// ---------------------------------------------------------------------------
// Messages and options

/** Walk an option area (§21.1: 16-bit code, 16-bit length); undefined when one runs past the end. */
function walkOptions6(field: Buffer): Dhcp6Option[] | undefined {
  const out: Dhcp6Option[] = [];
  let i = 0;
  while (i < field.length) {
    if (i + 4 > field.length) return undefined;
    const code = field.readUInt16BE(i);
    const len = field.readUInt16BE(i + 2);
    if (i + 4 + len > field.length) return undefined;
    out.push({ code, data: Buffer.from(field.subarray(i + 4, i + 4 + len)) });
    i += 4 + len;
  }
  return out;
}

/** Decode a client/server message (the UDP payload). Relay messages are not for a client: not-reply. */
export function decodeDhcp6(payload: Uint8Array): Decoded6<Dhcp6Packet> {
  const b = Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  if (b.length < 4) return { ok: false, reason: 'truncated' };
  const type = b[0]!;
  if (type === MsgType6.RELAY_FORW || type === MsgType6.RELAY_REPL) return { ok: false, reason: 'not-reply' };
  const options = walkOptions6(b.subarray(4));
  if (options === undefined) return { ok: false, reason: 'bad-option' };
  const message: Dhcp6Message = { type, xid: b.readUIntBE(1, 3), options };
  const fields = interpretOptions6(type, options);
  if (fields === undefined) return { ok: false, reason: 'bad-option' };
  return { ok: true, value: { message, fields } };
}

function decodeStatus(d: Buffer): StatusCode6 | undefined {
  if (d.length < 2) return undefined;
  return { code: d.readUInt16BE(0), message: d.subarray(2).toString('utf8') };
}

const validDuid = (d: Buffer): boolean => d.length >= 3 && d.length <= MAX_DUID_LENGTH;

/** IA_NA's body (§21.4): IAID, T1, T2, then options; undefined when malformed. */
function decodeIaNa(d: Buffer): IaNa | undefined {
  if (d.length < 12) return undefined;
  const inner = walkOptions6(d.subarray(12));
  if (inner === undefined) return undefined;
  const addresses: IaAddress[] = [];
  let status: StatusCode6 | undefined;
  for (const o of inner) {
    if (o.code === Opt6.IAADDR) {
      if (o.data.length < 24) return undefined;
      const sub = walkOptions6(o.data.subarray(24));
      if (sub === undefined) return undefined;
      let aStatus: StatusCode6 | undefined;
      for (const s of sub) {
        if (s.code !== Opt6.STATUS_CODE) continue;
        aStatus = decodeStatus(s.data);
        if (aStatus === undefined) return undefined;
      }
      addresses.push({ address: ipv6FromBytes(o.data), preferred: o.data.readUInt32BE(16), valid: o.data.readUInt32BE(20), status: aStatus });
    } else if (o.code === Opt6.STATUS_CODE) {
      status = decodeStatus(o.data);
      if (status === undefined) return undefined;
    }
  }
  return { iaid: d.readUInt32BE(0), t1: d.readUInt32BE(4), t2: d.readUInt32BE(8), addresses, status };
}

function interpretOptions6(type: number, options: readonly Dhcp6Option[]): Dhcp6Fields | undefined {
  const single = (code: number): Buffer | undefined | null => {
    const all = options.filter((o) => o.code === code);
    if (all.length > 1) return null; // §21: these may appear only once in a message
    return all[0]?.data;
  };
  const clientId = single(Opt6.CLIENTID);
  const serverId = single(Opt6.SERVERID);
  const statusData = single(Opt6.STATUS_CODE);
  const pref = single(Opt6.PREFERENCE);
  const elapsed = single(Opt6.ELAPSED_TIME);
  const rapid = single(Opt6.RAPID_COMMIT);
  const oro = single(Opt6.ORO);
  const dns = single(Opt6.DNS_SERVERS);
  if (clientId === null || serverId === null || statusData === null || pref === null || elapsed === null || rapid === null || oro === null || dns === null) return undefined;
  if ((clientId && !validDuid(clientId)) || (serverId && !validDuid(serverId))) return undefined;
  if ((pref && pref.length !== 1) || (elapsed && elapsed.length !== 2) || (rapid && rapid.length !== 0)) return undefined;
  if ((oro && oro.length % 2 !== 0) || (dns && dns.length % 16 !== 0)) return undefined;
  const status = statusData === undefined ? undefined : decodeStatus(statusData);
  if (statusData !== undefined && status === undefined) return undefined;
  const iaNa: IaNa[] = [];
  for (const o of options) {
    if (o.code !== Opt6.IA_NA) continue;
    const ia = decodeIaNa(o.data);
    if (ia === undefined) return undefined;
    iaNa.push(ia);
  }
  const oroList: number[] = [];
  for (let i = 0; oro && i < oro.length; i += 2) oroList.push(oro.readUInt16BE(i));
  const dnsList: bigint[] = [];
  for (let i = 0; dns && i < dns.length; i += 16) dnsList.push(ipv6FromBytes(dns, i));
  return {
    kind: msg6KindOf(type), clientId, serverId, iaNa, status,
    preference: pref?.[0], elapsed: elapsed?.readUInt16BE(0), rapidCommit: rapid !== undefined,
    oro: oroList, dns: dnsList,
  };
}

/** Encode options in the given order (§21.1). */
export function encodeOptions6(options: readonly Dhcp6Option[]): Buffer {
  const parts: Buffer[] = [];
  for (const o of options) {
    const h = Buffer.alloc(4);
    h.writeUInt16BE(o.code, 0);
    h.writeUInt16BE(o.data.length, 2);
    parts.push(h, o.data);
  }
  return Buffer.concat(parts);
}

/** Encode a client/server message (§8). */
export function encodeDhcp6(m: Dhcp6Message): Buffer {
  const head = Buffer.alloc(4);
  head[0] = m.type;
  head.writeUIntBE(m.xid & 0xffffff, 1, 3);
  return Buffer.concat([head, encodeOptions6(m.options)]);
}

export function statusOption(code: number, message: string): Dhcp6Option {
  const d = Buffer.alloc(2);
  d.writeUInt16BE(code, 0);
  return { code: Opt6.STATUS_CODE, data: Buffer.concat([d, Buffer.from(message, 'utf8')]) };
}

export function iaAddrOption(a: { address: bigint; preferred: number; valid: number; options?: readonly Dhcp6Option[] }): Dhcp6Option {
  const d = Buffer.alloc(24);
  ipv6ToBytes(a.address).copy(d, 0);
  d.writeUInt32BE(a.preferred >>> 0, 16);
  d.writeUInt32BE(a.valid >>> 0, 20);
  return { code: Opt6.IAADDR, data: Buffer.concat([d, encodeOptions6(a.options ?? [])]) };
}

export function iaNaOption(ia: { iaid: number; t1: number; t2: number; options: readonly Dhcp6Option[] }): Dhcp6Option {
  const d = Buffer.alloc(12);
  d.writeUInt32BE(ia.iaid >>> 0, 0);
  d.writeUInt32BE(ia.t1 >>> 0, 4);
  d.writeUInt32BE(ia.t2 >>> 0, 8);
  return { code: Opt6.IA_NA, data: Buffer.concat([d, encodeOptions6(ia.options)]) };
}

function u16Option(code: number, ...values: number[]): Dhcp6Option {
  const d = Buffer.alloc(2 * values.length);
  values.forEach((v, i) => d.writeUInt16BE(v & 0xffff, 2 * i));
  return { code, data: d };
}

// ---------------------------------------------------------------------------
// Client side: building requests, accepting replies

export type Client6MessageKind = 'SOLICIT' | 'REQUEST' | 'CONFIRM' | 'RENEW' | 'REBIND' | 'RELEASE' | 'DECLINE';

export interface Client6Identity {
  /** CLIENTID: the service's DUID (duidForService). */
  readonly duid: Buffer;
  /** The IA_NA's IAID: one IA per service, so any fixed value; the MAC's low 32 bits, as dhclient does. */
  readonly iaid: number;
}

export interface Client6MessageSpec {
  readonly kind: Client6MessageKind;
  /** 24 bits. */
  readonly xid: number;
  /** Since the first message of this exchange (§21.9). */
  readonly elapsedMs: number;
  /** SERVERID: in REQUEST, RENEW, RELEASE and DECLINE (§16); never in SOLICIT, CONFIRM or REBIND. */
  readonly serverId: Buffer | undefined;
  /** IAADDRs in the IA_NA: a hint in SOLICIT, the offered or held address otherwise. */
  readonly addresses: readonly { readonly address: bigint; readonly preferred: number; readonly valid: number }[];
}

/** ORO (§21.7): the DNS servers for status; T1/T2 and lifetimes come in IA_NA whatever we ask. */
export const ORO_REQUESTED = [Opt6.DNS_SERVERS];

/**
 * A client message with the options RFC 8415 appendix B allows for its kind.
 * T1/T2 in the IA_NA are 0 (§18.2: the client leaves them to the server);
 * lifetimes in IAADDR are 0 likewise (§18.2.1, §18.2.4: "ignored by the server").
 */
export function buildClient6Message(spec: Client6MessageSpec, id: Client6Identity): Dhcp6Message {
  const options: Dhcp6Option[] = [{ code: Opt6.CLIENTID, data: id.duid }];
  const withServer = spec.kind === 'REQUEST' || spec.kind === 'RENEW' || spec.kind === 'RELEASE' || spec.kind === 'DECLINE';
  if (withServer && spec.serverId) options.push({ code: Opt6.SERVERID, data: spec.serverId });
  // §21.7: ORO in SOLICIT, REQUEST, RENEW, REBIND (and CONFIRM may); not in RELEASE or DECLINE (appendix B).
  if (spec.kind !== 'RELEASE' && spec.kind !== 'DECLINE') options.push(u16Option(Opt6.ORO, ...ORO_REQUESTED));
  // §21.9: ELAPSED_TIME MUST be in every client message; hundredths of a second, 0xffff at most.
  options.push(u16Option(Opt6.ELAPSED_TIME, Math.min(0xffff, Math.max(0, Math.floor(spec.elapsedMs / 10)))));
  options.push(iaNaOption({
    iaid: id.iaid, t1: 0, t2: 0,
    options: spec.addresses.map((a) => iaAddrOption(a)),
  }));
  return { type: MsgType6[spec.kind], xid: spec.xid & 0xffffff, options };
}

export interface Reply6Expectation {
  readonly xid: number;
  readonly duid: Buffer;
}

export interface Reply6 {
  readonly frame: Udp6Frame;
  readonly packet: Dhcp6Packet;
}

/**
 * A whole frame judged as a reply to this client: every reason to drop it,
 * or the decoded ADVERTISE/REPLY. RFC 8415 §16.3 and §16.10: discard one
 * without SERVERID, without CLIENTID or with another client's, or for
 * another transaction.
 */
export function decodeReply6(frame: Uint8Array, info: FrameInfoLike, expect: Reply6Expectation): Decoded6<Reply6> {
  const f = decodeUdp6Frame(frame, info);
  if (!f.ok) return f;
  const d = decodeReplyPayload6(f.value.payload, expect);
  if (!d.ok) return d;
  return { ok: true, value: { frame: f.value, packet: d.value } };
}

/** decodeReply6 for a UDP payload (what a datagram socket on port 546 receives): the same checks from the DHCPv6 message on. */
export function decodeReplyPayload6(payload: Uint8Array, expect: Reply6Expectation): Decoded6<Dhcp6Packet> {
  const d = decodeDhcp6(payload);
  if (!d.ok) return d;
  const k = d.value.fields.kind;
  if (k !== 'ADVERTISE' && k !== 'REPLY') return { ok: false, reason: 'not-reply' };
  if (d.value.message.xid !== (expect.xid & 0xffffff)) return { ok: false, reason: 'wrong-xid' };
  const cid = d.value.fields.clientId;
  if (cid === undefined || !cid.equals(expect.duid)) return { ok: false, reason: 'wrong-client-id' };
  if (d.value.fields.serverId === undefined) return { ok: false, reason: 'no-server-id' };
  return d;
}

/** For logs: "REPLY fd00:99::191 from ll 02:00:00:a0:d6:02 xid 0x77c5eb". */
export function describePacket6(p: Dhcp6Packet): string {
  const k = p.fields.kind ?? `type-${p.message.type}`;
  const addr = p.fields.iaNa[0]?.addresses[0];
  const server = p.fields.serverId ? ` from ${describeDuid(p.fields.serverId)}` : '';
  return `${k}${addr ? ` ${formatIPv6(addr.address)}` : ''}${server} xid 0x${p.message.xid.toString(16).padStart(6, '0')}`;
}
