// ctnetlink (NETLINK_NETFILTER, subsystem CTNETLINK): the codec of the two
// messages the kernel path needs - a dump of the conntrack table of one
// family (IPv4 or IPv6, the nfgenmsg's family) and the deletion of one entry
// by its original tuple - and a driver that ends
// the UDP flows a forwarded VIP:port no longer sends to a backend of its
// healthy set, and the untranslated flows to a VIP that has just come onto
// this node (untranslatedFlows says why). Framing (sequence numbers,
// multipart dumps, ACKs) is the `netlink` package's, on the addon's socket
// (./netlink-socket), as for rtnetlink in ./netlink.ts.
//
// Why (the kernel path, agent/forward/nft.ts): conntrack keeps a UDP flow's
// NAT binding while packets keep coming (nf_conntrack_udp_timeout_stream,
// 120 s, restarted by every packet), so a client that sends steadily from one
// port stays on the backend it first got - after that backend failed its
// health checks, after a reload removed it, after the service was deleted -
// for as long as it keeps sending. kube-proxy deletes those entries for the
// same reason (its conntrack reconciler, kubernetes#126130); without it a DNS
// or syslog client blackholes behind a dead backend. TCP is left alone: a TCP connection ends,
// and a draining one may finish.
import { FlagsGet } from 'netlink/dist/constants';
import { NetlinkSocket } from 'netlink/dist/netlink';
import type { RawNetlinkSocket as PackageRawSocket } from 'netlink/dist/raw';
import { addressFromBytes, addressToBytes, formatAddress, parseAddress, type Family } from '../../address';
import { LbError, errorMessage } from '../../errors';
import { RawNetlinkSocket } from '../netlink/netlink-socket';

const NETLINK_NETFILTER = 12;
const AF_INET = 2;
const AF_INET6 = 10;
const NFNL_SUBSYS_CTNETLINK = 1;
const IPCTNL_MSG_CT_NEW = 0;
const IPCTNL_MSG_CT_GET = 1;
const IPCTNL_MSG_CT_DELETE = 2;
const IPCTNL_MSG_CT_GET_STATS_CPU = 4;
/** nlmsg_type of ctnetlink messages: subsystem in the high byte. */
export const CT_GET = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
export const CT_DELETE = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE;
const CT_NEW = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
const CT_GET_STATS_CPU = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET_STATS_CPU;

// linux/netfilter/nfnetlink_conntrack.h
const CTA_TUPLE_ORIG = 1;
const CTA_TUPLE_REPLY = 2;
const CTA_ZONE = 18;
const CTA_FILTER = 25;
const CTA_FILTER_ORIG_FLAGS = 1;
const CTA_FILTER_REPLY_FLAGS = 2;
const CTA_FILTER_FLAG_IP_SRC = 1 << 0;
const CTA_FILTER_FLAG_IP_DST = 1 << 1;
const CTA_FILTER_FLAG_PROTO_NUM = 1 << 3;
const CTA_FILTER_FLAG_PROTO_DST_PORT = 1 << 5;
const CTA_TUPLE_IP = 1;
const CTA_TUPLE_PROTO = 2;
const CTA_IP_V4_SRC = 1;
const CTA_IP_V4_DST = 2;
const CTA_IP_V6_SRC = 3;
const CTA_IP_V6_DST = 4;
const CTA_PROTO_NUM = 1;
const CTA_PROTO_SRC_PORT = 2;
const CTA_PROTO_DST_PORT = 3;
const NLA_F_NESTED = 0x8000;
const NLA_TYPE_MASK = 0x3fff;
export const IPPROTO_TCP = 6;
export const IPPROTO_UDP = 17;

/** One direction of a conntrack entry. */
export interface CtTuple {
  readonly src: string;
  readonly dst: string;
  readonly proto: number;
  readonly sport: number;
  readonly dport: number;
}

export interface CtEntry {
  readonly orig: CtTuple;
  readonly reply: CtTuple;
  /** CTA_ZONE when the entry is not in the default zone. */
  readonly zone?: number;
}

/** A forwarded UDP VIP:port and the backends (address:port) its flows may go to; none: the port is no longer forwarded. */
export interface UdpFlowRule {
  readonly vip: string;
  readonly port: number;
  /** "address:port" of each healthy backend. */
  readonly allowed: ReadonlySet<string>;
}

/** The nfgenmsg header: family, version 0, resource id 0. */
function nfgenmsg(family: Family = 'IPv4'): Buffer {
  const b = Buffer.alloc(4);
  b[0] = family === 'IPv6' ? AF_INET6 : AF_INET;
  return b;
}

/** An address of either family as ctnetlink's attributes carry it: the type of each end and the bytes. */
function ipOf(text: string, what: string): { family: Family; bytes: Buffer; src: number; dst: number } {
  const a = parseAddress(text);
  if (a === undefined) throw new LbError('LB_ERR_NET_CONNTRACK', `conntrack ${what} ${text}: not an IPv4 or IPv6 address`);
  const six = a.family === 'IPv6';
  return { family: a.family, bytes: addressToBytes(a), src: six ? CTA_IP_V6_SRC : CTA_IP_V4_SRC, dst: six ? CTA_IP_V6_DST : CTA_IP_V4_DST };
}

function attr(type: number, value: Buffer): Buffer {
  const len = 4 + value.length;
  const b = Buffer.alloc((len + 3) & ~3);
  b.writeUInt16LE(len, 0);
  b.writeUInt16LE(type, 2);
  value.copy(b, 4);
  return b;
}

const nested = (type: number, parts: Buffer[]): Buffer => attr(type | NLA_F_NESTED, Buffer.concat(parts));
const u8 = (v: number): Buffer => Buffer.from([v]);
function be16(v: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(v, 0);
  return b;
}

function tupleAttr(type: number, t: CtTuple): Buffer {
  const src = ipOf(t.src, 'tuple source');
  const dst = ipOf(t.dst, 'tuple destination');
  if (src.family !== dst.family) throw new LbError('LB_ERR_NET_CONNTRACK', `conntrack tuple ${t.src} -> ${t.dst}: two families`);
  return nested(type, [
    nested(CTA_TUPLE_IP, [attr(src.src, src.bytes), attr(dst.dst, dst.bytes)]),
    nested(CTA_TUPLE_PROTO, [attr(CTA_PROTO_NUM, u8(t.proto)), attr(CTA_PROTO_SRC_PORT, be16(t.sport)), attr(CTA_PROTO_DST_PORT, be16(t.dport))]),
  ]);
}

/**
 * A filtered dump: the entries whose original tuple goes to dport over proto
 * (default UDP), at dst when given; with untranslated (and dst), only those
 * whose reply still comes from dst (no DNAT was applied).
 */
export interface DumpFilter {
  readonly dst?: string;
  /** The table dumped without dst (with dst: dst's family); default IPv4. */
  readonly family?: Family;
  readonly dport: number;
  readonly proto?: number;
  readonly untranslated?: boolean;
}

/**
 * The payload of a dump of one family's table (CT_GET with NLM_F_DUMP); with
 * `only`, the kernel (5.9+, CTA_FILTER) returns just the entries to that
 * VIP:port (and, untranslated, only those answered from the VIP itself), so
 * a table of many connections is walked in C, not sent up and decoded. A
 * kernel before the filter returns everything (the caller matches anyway).
 */
export function encodeDump(only?: DumpFilter, family: Family = 'IPv4'): Buffer {
  if (!only) return nfgenmsg(family);
  const asked = only.dst === undefined ? undefined : ipOf(only.dst, 'dump filter');
  // An IPv6 address in CTA_FILTER matched no entry on the kernels here (Linux
  // 6.18: a dump filtered to an IPv6 VIP returned nothing while the port alone
  // returned its entries), so for IPv6 the kernel filters by protocol and
  // port and the callers match the VIP (they do anyway).
  const dst = asked?.family === 'IPv6' ? undefined : asked;
  const u32 = (v: number): Buffer => { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0, 0); return b; };
  const reply = only.untranslated === true && dst !== undefined;
  return Buffer.concat([
    nfgenmsg(asked?.family ?? only.family),
    nested(CTA_TUPLE_ORIG, [
      ...(dst !== undefined ? [nested(CTA_TUPLE_IP, [attr(dst.dst, dst.bytes)])] : []),
      nested(CTA_TUPLE_PROTO, [attr(CTA_PROTO_NUM, u8(only.proto ?? IPPROTO_UDP)), attr(CTA_PROTO_DST_PORT, be16(only.dport))]),
    ]),
    ...(reply ? [nested(CTA_TUPLE_REPLY, [nested(CTA_TUPLE_IP, [attr(dst.src, dst.bytes)])])] : []),
    nested(CTA_FILTER, [
      attr(CTA_FILTER_ORIG_FLAGS, u32((dst !== undefined ? CTA_FILTER_FLAG_IP_DST : 0) | CTA_FILTER_FLAG_PROTO_NUM | CTA_FILTER_FLAG_PROTO_DST_PORT)),
      attr(CTA_FILTER_REPLY_FLAGS, u32(reply ? CTA_FILTER_FLAG_IP_SRC : 0)),
    ]),
  ]);
}

/** The payload of CT_DELETE for one entry: its original tuple (and zone), which is how the kernel finds it. */
export function encodeDelete(e: CtEntry): Buffer {
  const zone = e.zone !== undefined && e.zone !== 0 ? [attr(CTA_ZONE, be16(e.zone))] : [];
  const orig = tupleAttr(CTA_TUPLE_ORIG, e.orig);
  return Buffer.concat([nfgenmsg(parseAddress(e.orig.src)?.family), orig, ...zone]);
}

/** The attributes in b[off, end), type (flags masked off) to value; a truncated or malformed one ends the walk. */
function attrs(b: Buffer, off: number, end: number): Map<number, Buffer> {
  const out = new Map<number, Buffer>();
  while (off + 4 <= end) {
    const len = b.readUInt16LE(off);
    if (len < 4 || off + len > end) break;
    out.set(b.readUInt16LE(off + 2) & NLA_TYPE_MASK, b.subarray(off + 4, off + len));
    off += (len + 3) & ~3;
  }
  return out;
}

function decodeTuple(v: Buffer | undefined, family: Family): CtTuple | undefined {
  if (!v) return undefined;
  const t = attrs(v, 0, v.length);
  const ipb = t.get(CTA_TUPLE_IP);
  const pb = t.get(CTA_TUPLE_PROTO);
  if (!ipb || !pb) return undefined;
  const ip = attrs(ipb, 0, ipb.length);
  const p = attrs(pb, 0, pb.length);
  const six = family === 'IPv6';
  const src = ip.get(six ? CTA_IP_V6_SRC : CTA_IP_V4_SRC);
  const dst = ip.get(six ? CTA_IP_V6_DST : CTA_IP_V4_DST);
  const num = p.get(CTA_PROTO_NUM);
  const n = six ? 16 : 4;
  if (src?.length !== n || dst?.length !== n || num?.length !== 1) return undefined;
  const port = (x: Buffer | undefined): number => (x?.length === 2 ? x.readUInt16BE(0) : 0);
  const text = (b: Buffer): string => formatAddress(addressFromBytes(family, b));
  return { src: text(src), dst: text(dst), proto: num[0]!, sport: port(p.get(CTA_PROTO_SRC_PORT)), dport: port(p.get(CTA_PROTO_DST_PORT)) };
}

/** One entry of a dump (nfgenmsg, then attributes), IPv4 or IPv6 (addresses in canonical text); undefined for anything else. */
export function decodeEntry(type: number, data: Buffer): CtEntry | undefined {
  if (type !== CT_NEW || data.length < 4 || (data[0] !== AF_INET && data[0] !== AF_INET6)) return undefined;
  const family: Family = data[0] === AF_INET6 ? 'IPv6' : 'IPv4';
  const a = attrs(data, 4, data.length);
  const orig = decodeTuple(a.get(CTA_TUPLE_ORIG), family);
  const reply = decodeTuple(a.get(CTA_TUPLE_REPLY), family);
  if (!orig || !reply) return undefined;
  const z = a.get(CTA_ZONE);
  return { orig, reply, ...(z?.length === 2 && z.readUInt16BE(0) !== 0 ? { zone: z.readUInt16BE(0) } : {}) };
}

/** A UDP VIP:port as staleUdpFlows matches entries to rules and EndedFlows.byPort counts them. */
export function udpFlowKey(vip: string, port: number): string {
  return `${vip}:${port}`;
}

/**
 * The entries the rules end: UDP to a rule's VIP:port answered by anything
 * outside the rule's allowed backends. That includes an untranslated entry
 * (the reply from the VIP itself): a flow conntrack saw while the port had
 * no DNAT would keep skipping it once backends exist (kubernetes#48370).
 */
export function staleUdpFlows(entries: Iterable<CtEntry>, rules: readonly UdpFlowRule[]): CtEntry[] {
  // Entries carry canonical text (decodeEntry); the rules' addresses are made so too ("fd00:0::1" is "fd00::1").
  const byDst = new Map(rules.map((r) => [udpFlowKey(canonical(r.vip), r.port), new Set([...r.allowed].map(canonicalEndpoint))]));
  const out: CtEntry[] = [];
  for (const e of entries) {
    if (e.orig.proto !== IPPROTO_UDP) continue;
    const allowed = byDst.get(udpFlowKey(e.orig.dst, e.orig.dport));
    if (allowed && !allowed.has(`${e.reply.src}:${e.reply.sport}`)) out.push(e);
  }
  return out;
}

function canonical(address: string): string {
  const a = parseAddress(address);
  return a === undefined ? address : formatAddress(a);
}

/** "address:port" (the port after the last colon, IPv6 written bare) with the address canonical. */
function canonicalEndpoint(endpoint: string): string {
  const i = endpoint.lastIndexOf(':');
  return i < 0 ? endpoint : `${canonical(endpoint.slice(0, i))}${endpoint.slice(i)}`;
}

/** A forwarded VIP port (SNAT path) whose untranslated entries end when the VIP comes onto this node. */
export interface ForwardedPort {
  readonly vip: string;
  readonly proto: number;
  readonly port: number;
}

/**
 * The entries that would shadow new connections to a VIP that has just come
 * onto this node: to one of its forwarded ports, answered from the VIP
 * itself (not translated). conntrack makes one when this node routes a
 * client's packets on to the node that held the VIP (its ARP entry still
 * named us after the VIP moved): the nat hook dispatches only a local VIP,
 * so the flow is recorded without DNAT and, never seeing the answer, kept in
 * SYN_SENT for 120 s (a UDP flow as long as the client keeps sending). Once
 * the VIP is ours, a client reusing that source port matches the old entry:
 * no DNAT (NAT is decided on a flow's first packet), delivered to our own
 * stack, and reset. A translated entry (the reply from a backend) is a
 * connection we forward and is left alone.
 */
export function untranslatedFlows(entries: Iterable<CtEntry>, ports: readonly ForwardedPort[]): CtEntry[] {
  const want = new Set(ports.map((p) => `${canonical(p.vip)}|${p.proto}|${p.port}`));
  const out: CtEntry[] = [];
  for (const e of entries) {
    if (e.reply.src === e.orig.dst && want.has(`${e.orig.dst}|${e.orig.proto}|${e.orig.dport}`)) out.push(e);
  }
  return out;
}

/**
 * The dumps that find untranslatedFlows(ports): one per protocol and port,
 * because each dump walks conntrack's whole hash table in the kernel (~7 ms
 * here with 262,144 buckets, whatever the filter) and a takeover brings
 * every VIP of a virtual router at once, mostly on the same ports. A port
 * of one VIP is asked for just its untranslated entries; a port several
 * VIPs share, for every entry to the port (matched here).
 */
export function untranslatedDumps(ports: readonly ForwardedPort[]): DumpFilter[] {
  const vipsOf = new Map<string, { proto: number; port: number; family: Family; vips: Set<string> }>();
  for (const p of ports) {
    // One table per family: a port both families forward is two dumps.
    const family: Family = p.vip.includes(':') ? 'IPv6' : 'IPv4';
    const k = `${family}/${p.proto}/${p.port}`;
    const g = vipsOf.get(k) ?? { proto: p.proto, port: p.port, family, vips: new Set<string>() };
    g.vips.add(p.vip);
    vipsOf.set(k, g);
  }
  return [...vipsOf.values()].map((g) => (g.vips.size === 1
    ? { dst: [...g.vips][0]!, dport: g.port, proto: g.proto, untranslated: true }
    : { dport: g.port, proto: g.proto, family: g.family }));
}

/** One entry's identity in the kernel's table: its original tuple and zone (what CT_DELETE names). */
function entryKey(e: CtEntry): string {
  const o = e.orig;
  return `${e.zone ?? 0}|${o.proto}|${o.src}:${o.sport}>${o.dst}:${o.dport}`;
}

/**
 * The entries the filters ask for, read through `dump` (one ctnetlink dump
 * of the payload given): one filtered dump per filter, or, when the kernel
 * refuses the filter, the whole table once (the callers match anyway).
 * Each entry once: a kernel that ignores CTA_FILTER answers every filtered
 * dump with the whole table, and an entry seen twice would be deleted twice
 * (the second an ENOENT counted as gone). Throws LB_ERR_NET_CONNTRACK when
 * even the unfiltered dump fails.
 */
export async function readEntries(dump: (payload: Buffer) => Promise<CtEntry[]>, filters: readonly DumpFilter[]): Promise<{ entries: CtEntry[]; filtered: boolean }> {
  let entries: CtEntry[] = [];
  let filtered = true;
  try {
    for (const f of filters) entries.push(...await dump(encodeDump(f)));
  } catch {
    filtered = false;
    try {
      // Each family's whole table once, for the families the filters name.
      const families = new Set<Family>(filters.map((f) => (f.dst !== undefined ? (parseAddress(f.dst)?.family ?? 'IPv4') : f.family ?? 'IPv4')));
      entries = [];
      for (const family of families.size > 0 ? families : new Set<Family>(['IPv4'])) entries.push(...await dump(encodeDump(undefined, family)));
    } catch (err) {
      throw new LbError('LB_ERR_NET_CONNTRACK', `cannot read the conntrack table (ctnetlink dump): ${errorMessage(err)}`, undefined, { cause: err });
    }
  }
  const seen = new Set<string>();
  return { entries: entries.filter((e) => { const k = entryKey(e); if (seen.has(k)) return false; seen.add(k); return true; }), filtered };
}

/** The UDP entries the sweep judges (readEntries): one filtered dump per rule's VIP:port. */
export function readUdpEntries(dump: (payload: Buffer) => Promise<CtEntry[]>, rules: readonly UdpFlowRule[]): Promise<{ entries: CtEntry[]; filtered: boolean }> {
  return readEntries(dump, rules.map((r) => ({ dst: r.vip, dport: r.port })));
}

/**
 * What ending flows did: entries deleted, and those already gone when their
 * turn came; `byPort`, the deleted ones by their rule's udpFlowKey.
 */
export interface EndedFlows { readonly ended: number; readonly gone: number; readonly byPort: ReadonlyMap<string, number> }

export interface ConntrackClient {
  endUdpFlows(rules: readonly UdpFlowRule[]): Promise<EndedFlows>;
  /** End the untranslated entries to these ports (untranslatedFlows): a VIP has come onto this node. */
  endUntranslatedFlows(ports: readonly ForwardedPort[]): Promise<EndedFlows>;
  close(): void;
}

const NOTHING_ENDED: EndedFlows = { ended: 0, gone: 0, byPort: new Map() };

/** Deletions in flight at most: each ACK waits in the socket's receive buffer until the event loop reads it. */
const MAX_IN_FLIGHT = 32;

/** ctnetlink in the calling process's network namespace (CAP_NET_ADMIN). The socket is opened per call and closed after. */
export class Conntrack implements ConntrackClient {
  private readonly timeoutMs: number;
  private closed = false;

  constructor(opts: { timeoutMs?: number } = {}) {
    this.timeoutMs = opts.timeoutMs ?? 5000;
  }

  endUdpFlows(rules: readonly UdpFlowRule[]): Promise<EndedFlows> {
    if (rules.length === 0) return Promise.resolve(NOTHING_ENDED);
    return this.end((dump) => readUdpEntries(dump, rules).then(({ entries }) => staleUdpFlows(entries, rules)));
  }

  endUntranslatedFlows(ports: readonly ForwardedPort[]): Promise<EndedFlows> {
    if (ports.length === 0) return Promise.resolve(NOTHING_ENDED);
    return this.end((dump) => readEntries(dump, untranslatedDumps(ports)).then(({ entries }) => untranslatedFlows(entries, ports)));
  }

  /** Dump what `select` reads and delete what it returns, on one socket opened for the call. */
  private async end(select: (dump: (payload: Buffer) => Promise<CtEntry[]>) => Promise<CtEntry[]>): Promise<EndedFlows> {
    if (this.closed) return NOTHING_ENDED;
    const sock = new NetlinkSocket(new RawNetlinkSocket(NETLINK_NETFILTER) as unknown as PackageRawSocket, { ref: false });
    try {
      const dump = async (payload: Buffer): Promise<CtEntry[]> => {
        const [msgs] = await sock.request(CT_GET, payload, { flags: FlagsGet.DUMP, timeout: this.timeoutMs, localPort: 0 });
        return msgs.flatMap((m) => { const e = decodeEntry(m.type, m.data); return e ? [e] : []; });
      };
      const stale = await select(dump);
      let ended = 0;
      let gone = 0;
      const byPort = new Map<string, number>();
      for (let i = 0; i < stale.length; i += MAX_IN_FLIGHT) {
        await Promise.all(stale.slice(i, i + MAX_IN_FLIGHT).map(async (e) => {
          try {
            await sock.request(CT_DELETE, encodeDelete(e), { timeout: this.timeoutMs, localPort: 0 });
            ended++;
            const at = udpFlowKey(e.orig.dst, e.orig.dport);
            byPort.set(at, (byPort.get(at) ?? 0) + 1);
          } catch (err) {
            // Expired or deleted since the dump: what was wanted.
            if (/ENOENT/.test(errorMessage(err))) { gone++; return; }
            throw new LbError('LB_ERR_NET_CONNTRACK', `cannot delete the conntrack entry ${e.orig.src}:${e.orig.sport} -> ${e.orig.dst}:${e.orig.dport}/${e.orig.proto === IPPROTO_UDP ? 'UDP' : e.orig.proto === IPPROTO_TCP ? 'TCP' : e.orig.proto} (ctnetlink): ${errorMessage(err)}`, undefined, { cause: err });
          }
        }));
      }
      return { ended, gone, byPort };
    } finally {
      sock.close();
    }
  }

  close(): void {
    this.closed = true;
  }
}

/**
 * Does ctnetlink answer here (`lb-agent check`)? Dumps the table's per-CPU
 * statistics (one short message per CPU), which changes nothing. undefined: yes; else what the kernel
 * said (EPERM: no CAP_NET_ADMIN; EOPNOTSUPP or EPROTONOSUPPORT: no
 * CONFIG_NF_CT_NETLINK, or its module cannot be loaded). Never throws.
 */
export async function probeConntrackNetlink(timeoutMs = 2000): Promise<string | undefined> {
  let sock: NetlinkSocket | undefined;
  try {
    sock = new NetlinkSocket(new RawNetlinkSocket(NETLINK_NETFILTER) as unknown as PackageRawSocket, { ref: false });
    await sock.request(CT_GET_STATS_CPU, nfgenmsg(), { flags: FlagsGet.DUMP, timeout: timeoutMs, localPort: 0 });
    return undefined;
  } catch (err) {
    return errorMessage(err);
  } finally {
    sock?.close();
  }
}
