// DHCPv4 codec (pure, no I/O): the BOOTP message with its options (RFC 2131,
// RFC 2132, RFC 3396), and the Ethernet/IPv4/UDP framing around it, because
// the driver sends and receives whole frames on an AF_PACKET socket bound to
// the service's macvlan (so every frame carries the macvlan's MAC and port 68,
// which the VM's own DHCP client may hold, does not matter).
//
// Decoding never throws: a frame from the LAN is either accepted or dropped
// with one of a small fixed set of reasons (DropReason), which the driver
// counts as a metric label.
import { formatIPv4, formatMac } from '../address';
import { bpfUdpDstPort, type BpfProgram } from '../net/packet/bpf';
import {
  ETH_HEADER_LEN, IPPROTO_UDP, IPV4_HEADER_LEN, UDP_HEADER_LEN, decodeIpv4Frame, encodeIpv4Frame, udpChecksum,
} from '../net/packet/inet';

export const DHCP_SERVER_PORT = 67;
export const DHCP_CLIENT_PORT = 68;
const MAGIC_COOKIE = 0x63825363;
/** Fixed BOOTP header (RFC 2131 §2, figure 1) up to the options field. */
const BOOTP_FIXED = 236;
/**
 * RFC 951's fixed 64-octet vendor area makes a BOOTP message 300 octets; RFC
 * 1542 §2.1 notes relay agents that drop shorter ones, so every DHCP client in
 * use (dhclient, udhcpc) pads to 300. So do we.
 */
export const BOOTP_MIN_LENGTH = 300;

export const BROADCAST_MAC = 'ff:ff:ff:ff:ff:ff';
export const BROADCAST_IP = 0xffffffff;

/** Option codes we read or write (RFC 2132 section numbers in comments). */
export const Opt = {
  PAD: 0,
  SUBNET_MASK: 1,          // §3.3
  ROUTER: 3,               // §3.5
  DNS: 6,                  // §3.8
  HOSTNAME: 12,            // §3.14
  REQUESTED_IP: 50,        // §9.1
  LEASE_TIME: 51,          // §9.2
  OVERLOAD: 52,            // §9.3
  MESSAGE_TYPE: 53,        // §9.6
  SERVER_ID: 54,           // §9.7
  PARAM_LIST: 55,          // §9.8
  MESSAGE: 56,             // §9.9
  MAX_MESSAGE_SIZE: 57,    // §9.10
  RENEWAL_TIME: 58,        // §9.11 (T1)
  REBINDING_TIME: 59,      // §9.12 (T2)
  VENDOR_CLASS: 60,        // §9.13
  CLIENT_ID: 61,           // §9.14
  END: 255,
} as const;

/** DHCP message types (RFC 2132 §9.6). */
export const MessageType = {
  DISCOVER: 1, OFFER: 2, REQUEST: 3, DECLINE: 4, ACK: 5, NAK: 6, RELEASE: 7, INFORM: 8,
} as const;
export type MessageKind = keyof typeof MessageType;
const KIND_BY_CODE = new Map<number, MessageKind>(
  (Object.keys(MessageType) as MessageKind[]).map((k) => [MessageType[k], k]),
);
export function messageKindOf(code: number): MessageKind | undefined {
  return KIND_BY_CODE.get(code);
}

/** Why a received frame was dropped: bounded, used as a metric label. */
export const DROP_REASONS = [
  'truncated',        // shorter than a header or a length field says
  'not-ipv4',         // not Ethernet/IPv4 (other ethertype, IP version != 4)
  'bad-ip-checksum',  // IPv4 header checksum wrong
  'fragment',         // IP fragment: DHCP replies fit in 576 octets (RFC 2131 §2)
  'not-udp-68',       // not UDP to the DHCP client port
  'bad-udp-length',   // UDP length field inconsistent with the IP packet
  'bad-udp-checksum', // UDP checksum present, complete and wrong
  'bad-cookie',       // no DHCP magic cookie (RFC 2131 §3)
  'bad-option',       // an option runs past its field, or a known option has a bad length/value
  'no-message-type',  // BOOTP without option 53: not DHCP
  'not-reply',        // op is not BOOTREPLY, or a type a server never sends a client
  'wrong-chaddr',     // a reply for another client (other MAC)
  'wrong-xid',        // a reply to a transaction we are not running
] as const;
export type DropReason = (typeof DROP_REASONS)[number];

export type Decoded<T> = { ok: true; value: T } | { ok: false; reason: DropReason };

export interface DhcpOption {
  readonly code: number;
  readonly data: Buffer;
}

/** A BOOTP/DHCP message as on the wire, options in order and raw. */
export interface DhcpMessage {
  readonly op: number;        // 1 BOOTREQUEST, 2 BOOTREPLY
  readonly htype: number;
  readonly hlen: number;
  readonly hops: number;
  readonly xid: number;
  readonly secs: number;
  readonly flags: number;
  readonly ciaddr: number;
  readonly yiaddr: number;
  readonly siaddr: number;
  readonly giaddr: number;
  /** 16 octets. */
  readonly chaddr: Buffer;
  /** 64 octets. */
  readonly sname: Buffer;
  /** 128 octets. */
  readonly file: Buffer;
  /** Every option in wire order (pad and end excluded), unknown ones included, raw. */
  readonly options: readonly DhcpOption[];
}

/** The options a client acts on, typed and validated (RFC 3396 concatenation applied). */
export interface DhcpFields {
  readonly type: number;
  readonly kind: MessageKind | undefined;
  readonly serverId: number | undefined;
  readonly requestedIp: number | undefined;
  readonly leaseSeconds: number | undefined;
  readonly t1Seconds: number | undefined;
  readonly t2Seconds: number | undefined;
  /** Prefix length from option 1 (a non-contiguous mask is a bad option). */
  readonly prefix: number | undefined;
  readonly routers: readonly number[];
  readonly dns: readonly number[];
  readonly hostname: string | undefined;
  readonly paramList: readonly number[];
  readonly maxMessageSize: number | undefined;
  readonly clientId: Buffer | undefined;
  readonly message: string | undefined;
}

export interface DhcpPacket {
  readonly message: DhcpMessage;
  readonly fields: DhcpFields;
}

export interface FrameInfoLike {
  /** TP_STATUS_CSUMNOTREADY: the UDP checksum is a partial one the kernel has not completed. */
  readonly csumNotReady: boolean;
}

export interface UdpFrame {
  readonly dstMac: string;
  readonly srcMac: string;
  readonly srcIp: number;
  readonly dstIp: number;
  readonly tos: number;
  readonly ttl: number;
  readonly id: number;
  readonly srcPort: number;
  readonly dstPort: number;
  readonly payload: Buffer;
}

// ---------------------------------------------------------------------------
// Framing

function macBytes(mac: string): Buffer {
  const parts = mac.split(':');
  const b = Buffer.alloc(6);
  for (let i = 0; i < 6; i++) b[i] = parseInt(parts[i] ?? '0', 16) & 0xff;
  return b;
}

/** Encode an Ethernet II / IPv4 / UDP frame with both checksums filled in. */
export function encodeUdpFrame(f: Partial<UdpFrame> & Pick<UdpFrame, 'srcMac' | 'dstMac' | 'srcIp' | 'dstIp' | 'payload'>): Buffer {
  const udpLen = UDP_HEADER_LEN + f.payload.length;
  const frame = encodeIpv4Frame({
    dstMac: macBytes(f.dstMac), srcMac: macBytes(f.srcMac), tos: f.tos ?? 0, id: f.id ?? 0,
    flags: 0, // no DF: dhclient/udhcpc/dnsmasq leave it clear too
    ttl: f.ttl ?? 64, protocol: IPPROTO_UDP, srcIp: f.srcIp, dstIp: f.dstIp,
  }, udpLen);
  const udp = ETH_HEADER_LEN + IPV4_HEADER_LEN;
  frame.writeUInt16BE(f.srcPort ?? DHCP_CLIENT_PORT, udp);
  frame.writeUInt16BE(f.dstPort ?? DHCP_SERVER_PORT, udp + 2);
  frame.writeUInt16BE(udpLen, udp + 4);
  f.payload.copy(frame, udp + UDP_HEADER_LEN);
  const c = udpChecksum(f.srcIp >>> 0, f.dstIp >>> 0, frame.subarray(udp));
  // RFC 768: a computed checksum of zero is sent as all ones (zero means "none").
  frame.writeUInt16BE(c === 0 ? 0xffff : c, udp + 6);
  return frame;
}

/**
 * Decode an Ethernet/IPv4/UDP frame addressed to the DHCP client port.
 * The UDP checksum of a frame flagged csumNotReady is not verified: the
 * sender's stack left a partial checksum for offload that nobody completed
 * on a virtual path (veth, macvlan), and the kernel vouches for the data.
 */
export function decodeUdpFrame(frame: Uint8Array, info: FrameInfoLike = { csumNotReady: false }, wantPort = DHCP_CLIENT_PORT): Decoded<UdpFrame> {
  const b = Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength);
  const d = decodeIpv4Frame(b);
  if (!d.ok) {
    return { ok: false, reason: d.reason === 'not-ipv4' || d.reason === 'bad-ip-checksum' ? d.reason : 'truncated' };
  }
  const p = d.packet;
  if ((p.flagsFrag & 0x3fff) !== 0) return { ok: false, reason: 'fragment' }; // MF set or offset != 0
  if (p.protocol !== IPPROTO_UDP) return { ok: false, reason: 'not-udp-68' };
  const udp = p.payloadStart;
  const ipEnd = p.payloadEnd;
  if (ipEnd - udp < UDP_HEADER_LEN) return { ok: false, reason: 'truncated' };
  const dstPort = b.readUInt16BE(udp + 2);
  if (dstPort !== wantPort) return { ok: false, reason: 'not-udp-68' };
  const udpLen = b.readUInt16BE(udp + 4);
  if (udpLen < UDP_HEADER_LEN || udp + udpLen > ipEnd) return { ok: false, reason: 'bad-udp-length' };
  const csum = b.readUInt16BE(udp + 6);
  if (csum !== 0 && !info.csumNotReady) {
    if (udpChecksum(p.srcIp, p.dstIp, b.subarray(udp, udp + udpLen)) !== 0) return { ok: false, reason: 'bad-udp-checksum' };
  }
  return {
    ok: true,
    value: {
      dstMac: formatMac(b.subarray(0, 6)),
      srcMac: formatMac(b.subarray(6, 12)),
      srcIp: p.srcIp, dstIp: p.dstIp,
      tos: p.tos,
      ttl: p.ttl,
      id: p.id,
      srcPort: b.readUInt16BE(udp),
      dstPort,
      payload: Buffer.from(b.subarray(udp + UDP_HEADER_LEN, udp + udpLen)),
    },
  };
}

// ---------------------------------------------------------------------------
// DHCP message

/** Walk one option field; false when an option runs past the field. */
function walkOptions(field: Buffer, out: DhcpOption[]): boolean {
  let i = 0;
  while (i < field.length) {
    const code = field[i]!;
    if (code === Opt.PAD) { i++; continue; }
    if (code === Opt.END) return true;
    if (i + 1 >= field.length) return false;
    const len = field[i + 1]!;
    if (i + 2 + len > field.length) return false;
    out.push({ code, data: Buffer.from(field.subarray(i + 2, i + 2 + len)) });
    i += 2 + len;
  }
  // No end option: tolerated (the field simply ends), as dhclient and dnsmasq do.
  return true;
}

/** Decode a BOOTP/DHCP message (the UDP payload). */
export function decodeDhcp(payload: Uint8Array): Decoded<DhcpPacket> {
  const b = Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  if (b.length < BOOTP_FIXED + 4) return { ok: false, reason: 'truncated' };
  if (b.readUInt32BE(BOOTP_FIXED) !== MAGIC_COOKIE) return { ok: false, reason: 'bad-cookie' };
  const sname = Buffer.from(b.subarray(44, 108));
  const file = Buffer.from(b.subarray(108, 236));
  const options: DhcpOption[] = [];
  if (!walkOptions(b.subarray(BOOTP_FIXED + 4), options)) return { ok: false, reason: 'bad-option' };
  // RFC 2132 §9.3 option overload: more options in 'file' (1), 'sname' (2) or both (3);
  // RFC 2131 §4.1: read 'file' before 'sname'. Option 52 may only be in the options field.
  const overloads = options.filter((o) => o.code === Opt.OVERLOAD);
  if (overloads.length > 1) return { ok: false, reason: 'bad-option' };
  if (overloads.length === 1) {
    const ov = overloads[0]!.data;
    if (ov.length !== 1 || ov[0]! < 1 || ov[0]! > 3) return { ok: false, reason: 'bad-option' };
    const extra: DhcpOption[] = [];
    if (ov[0]! & 1 && !walkOptions(file, extra)) return { ok: false, reason: 'bad-option' };
    if (ov[0]! & 2 && !walkOptions(sname, extra)) return { ok: false, reason: 'bad-option' };
    if (extra.some((o) => o.code === Opt.OVERLOAD)) return { ok: false, reason: 'bad-option' };
    options.push(...extra);
  }
  const message: DhcpMessage = {
    op: b[0]!, htype: b[1]!, hlen: b[2]!, hops: b[3]!,
    xid: b.readUInt32BE(4), secs: b.readUInt16BE(8), flags: b.readUInt16BE(10),
    ciaddr: b.readUInt32BE(12), yiaddr: b.readUInt32BE(16), siaddr: b.readUInt32BE(20), giaddr: b.readUInt32BE(24),
    chaddr: Buffer.from(b.subarray(28, 44)), sname, file, options,
  };
  const fields = interpretOptions(options);
  if (!fields.ok) return fields;
  return { ok: true, value: { message, fields: fields.value } };
}

/** RFC 3396: options with the same code are concatenated in order before interpretation. */
function concatenated(options: readonly DhcpOption[]): Map<number, Buffer> {
  const parts = new Map<number, Buffer[]>();
  for (const o of options) {
    const list = parts.get(o.code);
    if (list) list.push(o.data); else parts.set(o.code, [o.data]);
  }
  const out = new Map<number, Buffer>();
  for (const [code, list] of parts) out.set(code, list.length === 1 ? list[0]! : Buffer.concat(list));
  return out;
}

export function prefixFromMask(mask: number): number | undefined {
  const m = mask >>> 0;
  const inv = ~m >>> 0;
  if ((inv & (inv + 1)) !== 0) return undefined; // ones then zeros, nothing else
  let p = 0;
  for (let v = m; v & 0x80000000; v = (v << 1) >>> 0) p++;
  return p;
}

function interpretOptions(options: readonly DhcpOption[]): Decoded<DhcpFields> {
  const o = concatenated(options);
  const bad = { ok: false, reason: 'bad-option' } as const;
  const u32 = (code: number): number | undefined | null => {
    const d = o.get(code);
    if (d === undefined) return undefined;
    return d.length === 4 ? d.readUInt32BE(0) : null;
  };
  const addrs = (code: number): number[] | null => {
    const d = o.get(code);
    if (d === undefined) return [];
    if (d.length === 0 || d.length % 4 !== 0) return null;
    const list: number[] = [];
    for (let i = 0; i < d.length; i += 4) list.push(d.readUInt32BE(i));
    return list;
  };
  const typeData = o.get(Opt.MESSAGE_TYPE);
  if (typeData === undefined) return { ok: false, reason: 'no-message-type' };
  if (typeData.length !== 1 || typeData[0] === 0) return bad;
  const serverId = u32(Opt.SERVER_ID);
  const requestedIp = u32(Opt.REQUESTED_IP);
  const leaseSeconds = u32(Opt.LEASE_TIME);
  const t1Seconds = u32(Opt.RENEWAL_TIME);
  const t2Seconds = u32(Opt.REBINDING_TIME);
  const mask = u32(Opt.SUBNET_MASK);
  if (serverId === null || requestedIp === null || leaseSeconds === null || t1Seconds === null || t2Seconds === null || mask === null) return bad;
  const prefix = mask === undefined ? undefined : prefixFromMask(mask);
  if (mask !== undefined && prefix === undefined) return bad;
  const routers = addrs(Opt.ROUTER);
  const dns = addrs(Opt.DNS);
  if (routers === null || dns === null) return bad;
  const hostnameData = o.get(Opt.HOSTNAME);
  if (hostnameData !== undefined && hostnameData.length === 0) return bad; // RFC 2132 §3.14: minimum length 1
  const mss = o.get(Opt.MAX_MESSAGE_SIZE);
  if (mss !== undefined && (mss.length !== 2 || mss.readUInt16BE(0) < 576)) return bad; // RFC 2132 §9.10
  const clientId = o.get(Opt.CLIENT_ID);
  if (clientId !== undefined && clientId.length < 2) return bad; // RFC 2132 §9.14: minimum length 2
  const messageData = o.get(Opt.MESSAGE);
  return {
    ok: true,
    value: {
      type: typeData[0]!,
      kind: messageKindOf(typeData[0]!),
      serverId, requestedIp, leaseSeconds, t1Seconds, t2Seconds, prefix, routers, dns,
      hostname: hostnameData?.toString('latin1'),
      paramList: [...(o.get(Opt.PARAM_LIST) ?? [])],
      maxMessageSize: mss?.readUInt16BE(0),
      clientId,
      message: messageData?.toString('latin1'),
    },
  };
}

export interface DhcpMessageInit {
  op: number;
  xid: number;
  chaddr: Buffer | string;
  options: readonly DhcpOption[];
  htype?: number;
  hlen?: number;
  hops?: number;
  secs?: number;
  flags?: number;
  ciaddr?: number;
  yiaddr?: number;
  siaddr?: number;
  giaddr?: number;
  sname?: Buffer;
  file?: Buffer;
}

/** Encode a BOOTP/DHCP message; options in the given order, split at 255 octets (RFC 3396), end option, padded to 300. */
export function encodeDhcp(m: DhcpMessageInit, minLength = BOOTP_MIN_LENGTH): Buffer {
  const opts: Buffer[] = [];
  for (const o of m.options) {
    if (o.data.length === 0) { opts.push(Buffer.from([o.code, 0])); continue; }
    for (let i = 0; i < o.data.length; i += 255) {
      const chunk = o.data.subarray(i, i + 255);
      opts.push(Buffer.from([o.code, chunk.length]), chunk);
    }
  }
  opts.push(Buffer.from([Opt.END]));
  const optBuf = Buffer.concat(opts);
  const len = Math.max(minLength, BOOTP_FIXED + 4 + optBuf.length);
  const b = Buffer.alloc(len);
  b[0] = m.op;
  b[1] = m.htype ?? 1;
  b[2] = m.hlen ?? 6;
  b[3] = m.hops ?? 0;
  b.writeUInt32BE(m.xid >>> 0, 4);
  b.writeUInt16BE(m.secs ?? 0, 8);
  b.writeUInt16BE(m.flags ?? 0, 10);
  b.writeUInt32BE((m.ciaddr ?? 0) >>> 0, 12);
  b.writeUInt32BE((m.yiaddr ?? 0) >>> 0, 16);
  b.writeUInt32BE((m.siaddr ?? 0) >>> 0, 20);
  b.writeUInt32BE((m.giaddr ?? 0) >>> 0, 24);
  const ch = typeof m.chaddr === 'string' ? macBytes(m.chaddr) : m.chaddr;
  ch.copy(b, 28, 0, Math.min(16, ch.length));
  m.sname?.copy(b, 44, 0, 64);
  m.file?.copy(b, 108, 0, 128);
  b.writeUInt32BE(MAGIC_COOKIE, BOOTP_FIXED);
  optBuf.copy(b, BOOTP_FIXED + 4);
  return b;
}

// ---------------------------------------------------------------------------
// Client side: building requests, accepting replies

export type ClientMessageKind = 'DISCOVER' | 'REQUEST' | 'DECLINE' | 'RELEASE';

export interface ClientIdentity {
  /** The macvlan's MAC (chaddr and Ethernet source). */
  readonly mac: string;
  /** Option 61, type octet included (RFC 2132 §9.14). */
  readonly clientId: Buffer | undefined;
  /** Option 12. */
  readonly hostname: string | undefined;
}

export interface ClientMessageSpec {
  readonly kind: ClientMessageKind;
  readonly xid: number;
  readonly secs: number;
  /** ciaddr: only in RENEWING/REBINDING requests and in RELEASE (RFC 2131 table 5). */
  readonly ciaddr: number;
  /** Option 50. */
  readonly requestedIp: number | undefined;
  /** Option 54. */
  readonly serverId: number | undefined;
  /** Option 56, for DECLINE. */
  readonly message?: string;
}

/** Parameters we ask for (option 55): mask for the VIP prefix; the rest feed status; T1/T2 drive renewal. */
export const PARAM_REQUEST_LIST = [Opt.SUBNET_MASK, Opt.ROUTER, Opt.DNS, Opt.LEASE_TIME, Opt.SERVER_ID, Opt.RENEWAL_TIME, Opt.REBINDING_TIME];
/** Option 57: the RFC 2131 §2 minimum every server honours; larger replies could fragment and fragments are dropped. */
export const MAX_MESSAGE_SIZE = 576;

function u32Opt(code: number, v: number): DhcpOption {
  const d = Buffer.alloc(4);
  d.writeUInt32BE(v >>> 0, 0);
  return { code, data: d };
}

/** A client message with the fields and options RFC 2131 table 5 allows for its kind. */
export function buildClientMessage(spec: ClientMessageSpec, id: ClientIdentity): DhcpMessageInit {
  const options: DhcpOption[] = [{ code: Opt.MESSAGE_TYPE, data: Buffer.from([MessageType[spec.kind]]) }];
  if (id.clientId) options.push({ code: Opt.CLIENT_ID, data: id.clientId });
  // Table 5: 50 MUST NOT appear with ciaddr set (RENEWING/REBINDING, RELEASE); MUST in DECLINE.
  if (spec.requestedIp !== undefined && spec.kind !== 'RELEASE' && spec.ciaddr === 0) options.push(u32Opt(Opt.REQUESTED_IP, spec.requestedIp));
  // Table 5: 54 MUST NOT in DISCOVER; MUST in DECLINE and RELEASE; in REQUEST only when SELECTING.
  if (spec.serverId !== undefined && spec.kind !== 'DISCOVER') options.push(u32Opt(Opt.SERVER_ID, spec.serverId));
  const full = spec.kind === 'DISCOVER' || spec.kind === 'REQUEST';
  if (full) {
    // Table 5: "all others MUST NOT" in DECLINE and RELEASE, so these go in DISCOVER/REQUEST only.
    if (id.hostname) options.push({ code: Opt.HOSTNAME, data: Buffer.from(id.hostname, 'latin1') });
    options.push({ code: Opt.PARAM_LIST, data: Buffer.from(PARAM_REQUEST_LIST) });
    const mss = Buffer.alloc(2);
    mss.writeUInt16BE(MAX_MESSAGE_SIZE, 0);
    options.push({ code: Opt.MAX_MESSAGE_SIZE, data: mss });
  }
  if (spec.message) options.push({ code: Opt.MESSAGE, data: Buffer.from(spec.message, 'latin1') });
  return {
    op: 1,
    xid: spec.xid,
    // secs is 16 bits; RFC 2131 table 5: 0 in DECLINE and RELEASE.
    secs: full ? Math.min(0xffff, Math.max(0, Math.floor(spec.secs))) : 0,
    flags: 0, // no broadcast bit: the packet socket receives unicast replies to our MAC before the address is configured
    ciaddr: spec.ciaddr,
    chaddr: id.mac,
    options,
  };
}

export interface ReplyExpectation {
  readonly xid: number;
  readonly mac: string;
}

export interface Reply {
  readonly frame: UdpFrame;
  readonly packet: DhcpPacket;
}

/**
 * The client a BOOTP reply in an Ethernet/IPv4/UDP frame is for: its chaddr
 * (RFC 2131 §2, offset 28, hlen 6) as a lower-case MAC, read in place and
 * nothing else judged (decodeReply does that for the client it reaches);
 * undefined when the frame is too short or not an Ethernet BOOTP reply.
 * net/packet-shared.ts uses it to hand a broadcast reply to its one client.
 */
export function replyClientMac(frame: Buffer): string | undefined {
  if (frame.length < ETH_HEADER_LEN + 20 || frame.readUInt16BE(12) !== 0x0800) return undefined;
  const bootp = ETH_HEADER_LEN + (frame[ETH_HEADER_LEN]! & 0x0f) * 4 + UDP_HEADER_LEN;
  if (frame.length < bootp + 34 || frame[bootp] !== 2 || frame[bootp + 1] !== 1 || frame[bootp + 2] !== 6) return undefined;
  return formatMac(frame.subarray(bootp + 28, bootp + 34));
}

/** A whole frame, judged as a reply to this client: every reason to drop it, or the decoded reply. */
export function decodeReply(frame: Uint8Array, info: FrameInfoLike, expect: ReplyExpectation): Decoded<Reply> {
  const f = decodeUdpFrame(frame, info);
  if (!f.ok) return f;
  const d = decodeDhcp(f.value.payload);
  if (!d.ok) return d;
  const m = d.value.message;
  if (m.op !== 2) return { ok: false, reason: 'not-reply' };
  if (m.hlen !== 6 || formatMac(m.chaddr.subarray(0, 6)) !== expect.mac.toLowerCase()) return { ok: false, reason: 'wrong-chaddr' };
  if (m.xid !== expect.xid >>> 0) return { ok: false, reason: 'wrong-xid' };
  const k = d.value.fields.kind;
  if (k !== 'OFFER' && k !== 'ACK' && k !== 'NAK') return { ok: false, reason: 'not-reply' };
  return { ok: true, value: { frame: f.value, packet: d.value } };
}

/**
 * Classic BPF for the packet socket: IPv4, UDP, first fragment only,
 * destination port 68 - `tcpdump -dd 'ip and udp dst port 68'` (net/bpf.ts).
 */
export const DHCP_CLIENT_FILTER: BpfProgram = bpfUdpDstPort(DHCP_CLIENT_PORT);

/** For logs: "OFFER 10.99.0.101 from 10.99.0.2 xid 0x1234abcd". */
export function describePacket(p: DhcpPacket): string {
  const k = p.fields.kind ?? `type-${p.fields.type}`;
  const server = p.fields.serverId !== undefined ? ` from ${formatIPv4(p.fields.serverId)}` : '';
  return `${k} ${formatIPv4(p.message.yiaddr)}${server} xid 0x${p.message.xid.toString(16).padStart(8, '0')}`;
}
