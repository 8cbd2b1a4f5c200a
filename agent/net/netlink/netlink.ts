// rtnetlink typed verbs (driver over the `netlink` package): list/get links,
// create macvlans, set links up/down, delete links, add/remove/list IPv4
// addresses, and watch link and address changes. It acts on the network
// namespace of the calling process. Errors are LbErrors naming the interface
// and, for EPERM, the capability.
//
// Two sockets: dumps go one at a time through their own socket, single
// requests are pipelined on the other. The `netlink` package cuts a
// multipart dump short when another reply arrives between its parts, so only
// dumps need to wait for each other; serialising single requests too would
// make each of the many a DHCP start sends wait a turn of a busy event loop
// for the reply to the one before it. Many removals go as batches: up to
// BATCH_MAX requests in one datagram, each acknowledged on its own
// (removeAddresses).
import { EventEmitter } from 'node:events';
import * as os from 'node:os';
// The package's parts this file uses, not its index: that also loads its
// nl80211, WireGuard and generic-netlink code, resident for nothing.
// Its sockets are the addon's (./netlink-socket), not its own .node file.
import { FlagsGet, FlagsNew, Protocol } from 'netlink/dist/constants';
import { AttrStream, formatMessage, type NetlinkMessage } from 'netlink/dist/structs';
import { NetlinkSocket, checkError } from 'netlink/dist/netlink';
import type { RawNetlinkSocket as PackageRawSocket } from 'netlink/dist/raw';
import { RtNetlinkSocket } from 'netlink/dist/rt/rt';
import * as rt from 'netlink/dist/rt/structs';
import * as ifla from 'netlink/dist/rt/ifla';
import { LbError, errorMessage } from '../../errors';
import { addressFromBytes, addressToBytes, broadcastOf, familyBits, formatAddress, formatMac, ipv4ToBytes, parseAddress, parseIPv4, parseMac, type Family } from '../../address';
import type { Logger } from '../../log';
import { silentLogger } from '../../log';
import { IPV4_DEVCONF_ID, interfaceNameProblem, type IfSysctlKey } from '../sysctl/sysctl';
import { SerialQueue } from '../../serial';
import { RawNetlinkSocket } from './netlink-socket';
import { deleteLinkFn } from '../../native/native';

const AF_INET = 2;
const AF_INET6 = 10;
/** The rtnetlink address family of each Family. */
const AF_OF: Readonly<Record<Family, number>> = { IPv4: AF_INET, IPv6: AF_INET6 };
/** rtnetlink message types (linux/rtnetlink.h) as the plain numbers the framing hands over. */
const RTM_NEWLINK: number = rt.MessageType.NEWLINK;
const RTM_DELLINK: number = rt.MessageType.DELLINK;
const RTM_NEWADDR: number = rt.MessageType.NEWADDR;
const RTM_DELADDR: number = rt.MessageType.DELADDR;
const RTM_NEWNETCONF: number = rt.MessageType.NEWNETCONF;
const RTM_DELNEIGH: number = rt.MessageType.DELNEIGH;
const DEFAULT_TIMEOUT_MS = 5_000;
/** NLM_F_ECHO (linux/netlink.h): the kernel sends the new object back (RTM_NEWLINK honours it since Linux 6.1). */
const NLM_F_ECHO = 0x08;
/**
 * Single requests in flight at most. Each reply (and a GET's ACK) waits in
 * the socket's receive buffer until the event loop reads it; a reply that
 * does not fit is dropped by the kernel and its request would time out.
 */
export const MAX_IN_FLIGHT = 32;
/** Receive buffer of the request socket: MAX_IN_FLIGHT link replies (~1.5 KiB each, skb overhead included) with room to spare. */
const REQUEST_RCVBUF = 1 << 20;
/**
 * Requests in one batch datagram at most. The kernel answers each with an
 * ACK of its own (~1 KiB of receive buffer with skb overhead) before the
 * event loop reads any: a batch must fit REQUEST_RCVBUF beside the replies
 * of MAX_IN_FLIGHT single requests, or the kernel drops ACKs.
 */
export const BATCH_MAX = 256;

/** RFC 2863 ifOperStatus, as the kernel reports IF_OPER_* (linux/if.h). */
export type OperState = 'unknown' | 'notpresent' | 'down' | 'lowerlayerdown' | 'testing' | 'dormant' | 'up';
const OPER_STATES: readonly OperState[] = ['unknown', 'notpresent', 'down', 'lowerlayerdown', 'testing', 'dormant', 'up'];

export type MacvlanMode = 'private' | 'vepa' | 'bridge' | 'passthru' | 'source';

export interface LinkInfo {
  readonly index: number;
  readonly name: string;
  /** Lower-case "aa:bb:cc:dd:ee:ff"; '' for links without one (lo has zeros). */
  readonly mac: string;
  /** IFLA_INFO_KIND: 'macvlan', 'veth', 'bridge', ...; undefined for physical NICs. */
  readonly kind?: string;
  /** IFF_UP: administratively up. */
  readonly up: boolean;
  /** IFLA_CARRIER. */
  readonly carrier: boolean;
  readonly operState: OperState;
  /** IFLA_LINK: the lower device (macvlan parent, veth peer). */
  readonly parentIndex?: number;
  readonly macvlanMode?: MacvlanMode;
  readonly mtu?: number;
}

export interface AddressInfo {
  readonly index: number;
  /** Dotted quad, or canonical IPv6 text (RFC 5952) from a listing of IPv6 addresses. */
  readonly address: string;
  readonly prefix: number;
  readonly label?: string;
  /** IFA_PROTO (Linux 6.3+): who added the address; the agent marks its own (net/ownership.ts). */
  readonly proto?: number;
}

/** IFA_PROTO: the address's originator, a u8 attribute of RTM_NEWADDR (Linux 6.3). */
export const IFA_PROTO = 11;

/**
 * Calls fn(type, start, end) for each rtattr in buf[start, end) (the type
 * without NLA_F_NESTED / NLA_F_NET_BYTEORDER, the payload's bounds). Returns
 * false at a malformed attribute (length under 4 or past the end), after
 * the well-formed ones before it. Pure; never throws.
 */
export function forEachAttr(buf: Buffer, start: number, end: number, fn: (type: number, at: number, to: number) => void): boolean {
  let o = start;
  while (o + 4 <= end) {
    // struct nlattr is in host byte order (netlink(7)).
    const len = HOST_LE ? buf.readUInt16LE(o) : buf.readUInt16BE(o);
    if (len < 4 || o + len > end) return false;
    fn((HOST_LE ? buf.readUInt16LE(o + 2) : buf.readUInt16BE(o + 2)) & 0x3fff, o + 4, o + len);
    o += (len + 3) & ~3;
  }
  return true;
}

/**
 * The IFA_PROTO attribute of a raw RTM_NEWADDR payload (ifaddrmsg, then
 * rtattrs), if present. The netlink package drops attributes it does not
 * know when parsing, so this one is read here. Pure; never throws.
 */
export function addressProto(data: Buffer): number | undefined {
  let proto: number | undefined;
  const ok = forEachAttr(data, 8 /* struct ifaddrmsg */, data.length, (type, at, to) => {
    if (type === IFA_PROTO && to > at && proto === undefined) proto = data[at];
  });
  return ok ? proto : undefined;
}

export type LinkEvent = { type: 'new' | 'del'; link: LinkInfo };
export type AddressEvent = { type: 'new' | 'del'; address: AddressInfo };

export interface CreateMacvlanOptions {
  /** New link name (<= 15 bytes). */
  name: string;
  /** Parent link, by name or index, or as the caller already read it (no second lookup). */
  parent: string | number | LinkInfo;
  mac: string;
  /** Always explicit (docs/design.md): bridge lets macvlans on one parent reach each other. */
  mode: MacvlanMode;
}

/** Requests a client has sent to the kernel since it opened: what tests count instead of timing. */
export interface NetlinkCounts {
  /** Single requests (get, create, set, delete, add/remove address). */
  readonly requests: number;
  /** Dumps (list links, list addresses, list neighbours). */
  readonly dumps: number;
  /** Batch datagrams (removeAddresses), and the requests they carried. */
  readonly batches: number;
  readonly batched: number;
}

/** An address on a link, as removeAddresses takes it. */
export interface AddressRef {
  readonly index: number;
  readonly address: string;
  readonly prefix: number;
}

export interface NetlinkOptions {
  log?: Logger;
  /** Per-request timeout (default 5 s): a wedged kernel call must not hang a reconcile. */
  timeoutMs?: number;
}

// ---------------------------------------------------------------------------
// Pure helpers (exported for unit tests)

/** The errno name in an error from the netlink package ("Request rejected: EPERM"). */
export function netlinkErrno(err: unknown): string | undefined {
  if (!(err instanceof Error)) return undefined;
  const code = (err as { code?: unknown }).code;
  if (typeof code === 'string' && /^E[A-Z0-9]+$/.test(code)) return code;
  const m = /Request rejected: (E[A-Z0-9]+|-?\d+)/.exec(err.message);
  if (m) return m[1];
  if (/Timeout has been reached/.test(err.message)) return 'ETIMEDOUT';
  return undefined;
}

/**
 * Map a netlink failure to an LbError. `subject` names the interface(s) the
 * verb acted on, for the message.
 */
export function netlinkError(err: unknown, verb: string, subject: string, extra: { macvlan?: boolean; missing?: string } = {}): LbError {
  if (err instanceof LbError) return err;
  const errno = netlinkErrno(err);
  const details = { verb, subject, errno };
  const reason = err instanceof Error ? err.message : String(err);
  switch (errno) {
    case 'EPERM':
    case 'EACCES':
      return new LbError('LB_ERR_NET_NO_CAPABILITY', `${verb} ${subject}: permission denied (${errno}); needs CAP_NET_ADMIN - run lb-agent as root or grant CAP_NET_ADMIN`, { ...details, capability: 'CAP_NET_ADMIN' }, { cause: err });
    case 'ENODEV':
      return new LbError('LB_ERR_NET_NO_INTERFACE', `${verb} ${subject}: interface ${extra.missing ?? subject} does not exist (ENODEV)`, { ...details, interface: extra.missing ?? subject }, { cause: err });
    case 'EOPNOTSUPP':
      if (extra.macvlan) {
        return new LbError(
          'LB_ERR_NET_MACVLAN_UNSUPPORTED',
          `${verb} ${subject}: the kernel has no macvlan driver (EOPNOTSUPP); install a kernel with macvlan (on SLES: kernel-default instead of kernel-default-base) or load the macvlan module`,
          details,
          { cause: err },
        );
      }
      break;
    case 'EEXIST':
      return new LbError('LB_ERR_NET_NETLINK', `${verb} ${subject}: already exists (EEXIST)`, details, { cause: err });
    case 'ETIMEDOUT':
      return new LbError('LB_ERR_NET_NETLINK', `${verb} ${subject}: no answer from the kernel (timeout)`, details, { cause: err });
  }
  return new LbError('LB_ERR_NET_NETLINK', `${verb} ${subject} failed: ${reason}`, details, { cause: err });
}

function flatten(data: Parameters<AttrStream['emit']>[0]): Buffer {
  const s = new AttrStream();
  s.emit(data);
  return Buffer.concat(s.bufs);
}

const MACVLAN_MODE_FLAGS: Record<MacvlanMode, ifla.MacvlanMode> = {
  private: { private: true },
  vepa: { vepa: true },
  bridge: { bridge: true },
  passthru: { passthru: true },
  source: { source: true },
};

/** IFLA_LINKINFO for a macvlan in `mode`: { kind: 'macvlan', data: { IFLA_MACVLAN_MODE } }. */
export function macvlanLinkInfo(mode: MacvlanMode): Buffer {
  const data = flatten(ifla.formatMacvlan({ mode: ifla.formatMacvlanMode(MACVLAN_MODE_FLAGS[mode]) }));
  return flatten(ifla.formatInfo({ kind: 'macvlan', data }));
}

// Netlink attributes are in host byte order (netlink(7)).
const HOST_LE = os.endianness() === 'LE';

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  if (HOST_LE) b.writeUInt32LE(n >>> 0);
  else b.writeUInt32BE(n >>> 0);
  return b;
}

const NLA_HDRLEN = 4;
const NLA_F_NESTED = 0x8000;
/** linux/if_link.h: the one attribute of IFLA_AF_SPEC's AF_INET entry. */
const IFLA_INET_CONF = 1;

/**
 * IFLA_AF_SPEC's AF_INET entry that sets these IPv4 settings of a link:
 * IFLA_INET_CONF holding one u32 attribute per setting, typed by its
 * IPV4_DEVCONF_* id (net/ipv4/devinet.c: inet_validate_link_af refuses an
 * unknown id or a short value, so the request fails rather than half-applies).
 */
export function inetConfSpec(conf: ReadonlyArray<readonly [IfSysctlKey, number]>): Buffer {
  const body = Buffer.alloc(NLA_HDRLEN + conf.length * (NLA_HDRLEN + 4));
  const put16 = (v: number, at: number): void => { if (HOST_LE) body.writeUInt16LE(v, at); else body.writeUInt16BE(v, at); };
  put16(body.length, 0);
  put16(IFLA_INET_CONF | NLA_F_NESTED, 2);
  conf.forEach(([key, value], i) => {
    if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) throw new RangeError(`${key} must be a u32, got ${value}`);
    const at = NLA_HDRLEN + i * (NLA_HDRLEN + 4);
    put16(NLA_HDRLEN + 4, at);
    put16(IPV4_DEVCONF_ID[key], at + 2);
    u32(value).copy(body, at + NLA_HDRLEN);
  });
  return body;
}

function readU32(b: Buffer, at = 0): number {
  return HOST_LE ? b.readUInt32LE(at) : b.readUInt32BE(at);
}

// linux/if_link.h, linux/if.h: what LinkInfo holds.
const IFINFOMSG_LEN = 16; // family u8, pad u8, type u16, index s32, flags u32, change u32
const IFF_UP = 0x1;
const IFLA_ADDRESS = 1;
const IFLA_IFNAME = 3;
const IFLA_MTU = 4;
const IFLA_LINK = 5;
const IFLA_OPERSTATE = 16;
const IFLA_LINKINFO = 18;
const IFLA_CARRIER = 33;
const IFLA_INFO_KIND = 1;
const IFLA_INFO_DATA = 2;
const IFLA_MACVLAN_MODE = 1;
/** IFLA_MACVLAN_MODE's values, as the package encodes MACVLAN_MODE_FLAGS (linux/if_link.h: MACVLAN_MODE_*). */
const MACVLAN_MODE_VALUES: Readonly<Record<number, MacvlanMode>> = Object.fromEntries(
  (Object.entries(MACVLAN_MODE_FLAGS) as [MacvlanMode, ifla.MacvlanMode][]).map(([mode, flags]) => [ifla.formatMacvlanMode(flags), mode]),
);
/** IFLA_EXT_MASK: RTEXT_FILTER_SKIP_STATS (Linux 5.10; older kernels ignore the bit): no counters we would not read. */
const RTEXT_FILTER_SKIP_STATS = 1 << 3;

/** A NUL-terminated string attribute. */
function attrString(buf: Buffer, at: number, to: number): string {
  const nul = buf.indexOf(0, at);
  return buf.toString('utf8', at, nul >= at && nul < to ? nul : to);
}

/**
 * An RTM_NEWLINK / RTM_DELLINK payload (struct ifinfomsg, then rtattrs) as a
 * LinkInfo. Reads only the attributes a LinkInfo holds: the package's parser
 * decodes every attribute of a link (statistics, IPv6 settings, ...) into
 * objects, CPU and garbage per link that services starting at once would pay
 * on one event loop. Unknown or malformed attributes are
 * skipped; throws only on a payload shorter than ifinfomsg.
 */
export function parseLinkPayload(data: Buffer): LinkInfo {
  if (data.length < IFINFOMSG_LEN) throw new RangeError(`link message of ${data.length} bytes is shorter than struct ifinfomsg`);
  const index = HOST_LE ? data.readInt32LE(4) : data.readInt32BE(4);
  const flags = readU32(data, 8);
  let name = '';
  let mac = '';
  let mtu: number | undefined;
  let parentIndex: number | undefined;
  let operState: OperState = 'unknown';
  let carrier = false;
  let kind: string | undefined;
  let macvlanMode: MacvlanMode | undefined;
  forEachAttr(data, IFINFOMSG_LEN, data.length, (type, at, to) => {
    switch (type) {
      case IFLA_IFNAME: name = attrString(data, at, to); break;
      case IFLA_ADDRESS: if (to - at === 6) mac = formatMac(data.subarray(at, to)); break;
      case IFLA_MTU: if (to - at >= 4) mtu = readU32(data, at); break;
      case IFLA_LINK: if (to - at >= 4) { const p = readU32(data, at); if (p !== 0 && p !== index) parentIndex = p; } break;
      case IFLA_OPERSTATE: if (to > at && data[at]! < OPER_STATES.length) operState = OPER_STATES[data[at]!]!; break;
      case IFLA_CARRIER: carrier = to > at && data[at] === 1; break;
      case IFLA_LINKINFO:
        forEachAttr(data, at, to, (it, iat, ito) => {
          if (it === IFLA_INFO_KIND) kind = attrString(data, iat, ito);
          else if (it === IFLA_INFO_DATA) {
            forEachAttr(data, iat, ito, (dt, dat, dto) => {
              if (dt === IFLA_MACVLAN_MODE && dto - dat >= 4) macvlanMode = MACVLAN_MODE_VALUES[readU32(data, dat)];
            });
          }
        });
        break;
    }
  });
  // IFLA_INFO_DATA means the macvlan mode only on a macvlan.
  if (kind !== 'macvlan') macvlanMode = undefined;
  return {
    index,
    name,
    mac,
    ...(kind !== undefined ? { kind } : {}),
    up: (flags & IFF_UP) !== 0,
    carrier,
    operState,
    ...(parentIndex !== undefined ? { parentIndex } : {}),
    ...(macvlanMode !== undefined ? { macvlanMode } : {}),
    ...(mtu !== undefined ? { mtu } : {}),
  };
}

/** The RTM_GETLINK / RTM_NEWLINK request payload (the package's encoder). */
function linkRequest(data: rt.LinkMessage['data'], attrs: rt.LinkMessage['attrs']): Uint8Array[] {
  const out = new AttrStream();
  rt.formatLinkMessage({ kind: 'link', data, attrs }, out);
  return out.bufs;
}

/**
 * The link a create request's reply describes: the RTM_NEWLINK the kernel
 * echoes (NLM_F_ECHO) for `name`; undefined when the reply is only the ACK
 * (a kernel before 6.1 ignores the flag), so the caller reads the link back.
 */
export function createdLink(msgs: ReadonlyArray<{ type: number; data: Buffer }>, name: string): LinkInfo | undefined {
  for (const m of msgs) {
    if (m.type !== RTM_NEWLINK) continue;
    const link = parseLinkPayload(m.data);
    if (link.name === name && link.index > 0) return link;
  }
  return undefined;
}

/** A parsed RTM_NEWADDR message as an AddressInfo; undefined for another family than `family` (IPv4 unless said). */
export function addressInfoFromMessage(msg: rt.AddressMessage, family: Family = 'IPv4'): AddressInfo | undefined {
  const { data, attrs } = msg;
  if (data.family !== AF_OF[family]) return undefined;
  // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on
  // point-to-point links and equal to it elsewhere (an IPv6 address has IFA_ADDRESS only).
  const raw = attrs.local ?? attrs.address;
  const width = familyBits(family) / 8;
  if (!raw || raw.length !== width) return undefined;
  return {
    index: data.index ?? 0,
    address: formatAddress(addressFromBytes(family, raw)),
    prefix: data.prefixlen ?? familyBits(family),
    ...(attrs.label !== undefined ? { label: attrs.label } : {}),
  };
}

function checkIp(ip: string): Buffer {
  const n = parseIPv4(ip);
  if (n === undefined) throw new TypeError(`not an IPv4 address: ${ip}`);
  return ipv4ToBytes(n);
}

/** An address of either family in network order, with its family; throws TypeError on anything else. */
function checkAddress(ip: string): { family: Family; bytes: Buffer } {
  const a = parseAddress(ip);
  if (a === undefined) throw new TypeError(`not an IPv4 or IPv6 address: ${ip}`);
  return { family: a.family, bytes: addressToBytes(a) };
}

function checkPrefix(prefix: number, family: Family = 'IPv4'): void {
  const max = familyBits(family);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > max) throw new TypeError(`prefix must be 0..${max}, got ${prefix}`);
}

// ---------------------------------------------------------------------------
// Driver

export class NetlinkClient {
  /** Single requests, pipelined. */
  private readonly sock: RtNetlinkSocket;
  /** Dumps, one at a time (dumpQueue). */
  private readonly dumpSock: RtNetlinkSocket;
  private readonly log: Logger;
  private readonly timeoutMs: number;
  private closed = false;
  /**
   * One dump at a time: an rtnetlink socket answers one dump at a time (a
   * second concurrent dump gets EBUSY), and DHCP sources, pool sources and
   * reconcile share this client.
   */
  private readonly dumpQueue = new SerialQueue();
  private inFlight = 0;
  /** findLink's reads in flight, by index or `name:<name>` (cleared by every link change this client makes). */
  private readonly linkReads = new Map<string | number, Promise<LinkInfo | undefined>>();
  /** Callers waiting for a free request slot (MAX_IN_FLIGHT), first come first served. */
  private readonly waiting: Array<() => void> = [];
  private sent = { requests: 0, dumps: 0, batches: 0, batched: 0 };

  constructor(opts: NetlinkOptions = {}) {
    this.log = (opts.log ?? silentLogger()).child({ module: 'net/netlink' });
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    let sock: RtNetlinkSocket | undefined;
    try {
      sock = openRtNetlink({ recvBufferSize: REQUEST_RCVBUF });
      this.dumpSock = openRtNetlink({});
    } catch (err) {
      sock?.socket.close();
      throw netlinkError(err, 'opening', 'an rtnetlink socket');
    }
    this.sock = sock;
    // Socket-level errors would otherwise be an unhandled 'error' event.
    for (const s of [this.sock, this.dumpSock]) {
      s.socket.on('error', (err: Error) => this.log.warn({ op: 'socket', err: err.message }, 'rtnetlink socket error'));
    }
  }

  /** Requests sent so far (tests assert round trips per operation with it). */
  counts(): NetlinkCounts {
    return { ...this.sent };
  }

  /** A single request, pipelined with others up to MAX_IN_FLIGHT. */
  private async single<T>(fn: (sock: RtNetlinkSocket) => Promise<T>): Promise<T> {
    this.checkOpen(); // before taking a slot
    if (this.inFlight < MAX_IN_FLIGHT) this.inFlight++;
    else await new Promise<void>((resolve) => this.waiting.push(resolve)); // the finishing request hands its slot over
    try {
      this.sent.requests++;
      return await fn(this.sock);
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.inFlight--;
    }
  }

  private dump<T>(fn: (sock: RtNetlinkSocket) => Promise<T>): Promise<T> {
    return this.dumpQueue.run(() => {
      this.sent.dumps++;
      return fn(this.dumpSock);
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.sock.socket.close();
    this.dumpSock.socket.close();
  }

  private checkOpen(): void {
    if (this.closed) throw new LbError('LB_ERR_NET_NETLINK', 'rtnetlink client is closed');
  }

  /**
   * localPort 0: the header's nlmsg_pid is left to the kernel, as iproute2
   * does; otherwise the package asks the socket for its address
   * (getsockname) on every request.
   */
  private opts(flags = 0): { timeout: number; flags: number; localPort: number } {
    this.checkOpen();
    return { timeout: this.timeoutMs, flags, localPort: 0 };
  }

  async listLinks(): Promise<LinkInfo[]> {
    try {
      const req = linkRequest({}, { extMask: u32(RTEXT_FILTER_SKIP_STATS) });
      const [msgs] = await this.dump((sock) => sock.socket.request(rt.MessageType.GETLINK, req, this.opts(FlagsGet.DUMP)));
      return msgs.filter((m) => m.type === RTM_NEWLINK).map((m) => parseLinkPayload(m.data));
    } catch (err) {
      throw netlinkError(err, 'listing', 'links');
    }
  }

  /**
   * The link, or undefined when there is none by that name or index.
   * Concurrent reads of the same link share one request (DHCP services
   * starting together all read the parent in one turn of the loop);
   * a read asked for after a change made through this client (create,
   * up/down, delete) is never answered by one sent before it.
   */
  async findLink(nameOrIndex: string | number): Promise<LinkInfo | undefined> {
    const key = typeof nameOrIndex === 'number' ? nameOrIndex : `name:${nameOrIndex}`;
    let read = this.linkReads.get(key);
    if (!read) {
      const r = this.readLink(nameOrIndex);
      read = r;
      this.linkReads.set(key, r);
      const done = (): void => { if (this.linkReads.get(key) === r) this.linkReads.delete(key); };
      r.then(done, done);
    }
    return read; // LinkInfo is read-only: the readers share one
  }

  private async readLink(nameOrIndex: string | number): Promise<LinkInfo | undefined> {
    try {
      const extMask = u32(RTEXT_FILTER_SKIP_STATS);
      const req = typeof nameOrIndex === 'number' ? linkRequest({ index: nameOrIndex }, { extMask }) : linkRequest({}, { ifname: nameOrIndex, extMask });
      const [msgs] = await this.single((sock) => sock.socket.request(rt.MessageType.GETLINK, req, this.opts()));
      const reply = msgs.find((m) => m.type === RTM_NEWLINK);
      return reply ? parseLinkPayload(reply.data) : undefined;
    } catch (err) {
      if (netlinkErrno(err) === 'ENODEV') return undefined;
      throw netlinkError(err, 'reading link', describe(nameOrIndex));
    }
  }

  /** The link; LB_ERR_NET_NO_INTERFACE naming it when it does not exist. */
  async getLink(nameOrIndex: string | number): Promise<LinkInfo> {
    if (typeof nameOrIndex === 'string') {
      const problem = interfaceNameProblem(nameOrIndex);
      if (problem) throw new LbError('LB_ERR_NET_NO_INTERFACE', `interface ${JSON.stringify(nameOrIndex)} cannot exist: ${problem}`, { interface: nameOrIndex });
    }
    const link = await this.findLink(nameOrIndex);
    if (!link) throw new LbError('LB_ERR_NET_NO_INTERFACE', `interface ${describe(nameOrIndex)} does not exist`, { interface: nameOrIndex });
    return link;
  }

  /**
   * Create a macvlan (left down; see setLinkUp) and return it as the kernel
   * made it. Throws LB_ERR_NET_NO_INTERFACE naming the parent,
   * LB_ERR_NET_MACVLAN_UNSUPPORTED, LB_ERR_NET_NO_CAPABILITY (CAP_NET_ADMIN),
   * or LB_ERR_NET_NETLINK (e.g. the name exists). One RTM_NEWLINK: the kernel
   * either creates the link as asked or leaves none. With the parent as a
   * LinkInfo and a kernel that echoes the new link (NLM_F_ECHO, Linux 6.1+)
   * that is the only request; otherwise the parent is looked up first and the
   * link read back after.
   */
  async createMacvlan(opts: CreateMacvlanOptions): Promise<LinkInfo> {
    const problem = interfaceNameProblem(opts.name);
    if (problem) throw new TypeError(`macvlan name: ${problem}`);
    const mac = parseMac(opts.mac);
    if (!mac) throw new TypeError(`macvlan MAC is not a MAC address: ${opts.mac}`);
    if (!(opts.mode in MACVLAN_MODE_FLAGS)) throw new TypeError(`unknown macvlan mode ${String(opts.mode)}`);
    const parent = typeof opts.parent === 'object' ? opts.parent : await this.getLink(opts.parent);
    const subject = `macvlan ${opts.name} on ${parent.name}`;
    let echoed: LinkInfo | undefined;
    this.linkReads.clear();
    try {
      const req = linkRequest({}, { ifname: opts.name, address: mac, link: u32(parent.index), linkinfo: macvlanLinkInfo(opts.mode) });
      const [msgs] = await this.single((sock) => sock.socket.request(RTM_NEWLINK, req, this.opts(FlagsNew.CREATE | FlagsNew.EXCL | NLM_F_ECHO)));
      echoed = createdLink(msgs, opts.name);
    } catch (err) {
      throw netlinkError(err, 'creating', subject, { macvlan: true, missing: parent.name });
    }
    // debug, like 'address added' below: the callers say at info what the link or address is for
    // ("VIP ... bound", with its macvlan), so a start writes one line per service, not three.
    this.log.debug({ op: 'create-macvlan', name: opts.name, parent: parent.name, mac: opts.mac, mode: opts.mode }, 'macvlan created');
    return echoed ?? this.getLink(opts.name);
  }

  async setLinkUp(index: number, up: boolean): Promise<void> {
    await this.setLink(index, { up });
  }

  /**
   * One RTM_NEWLINK on an existing link: up or down (`up`; absent leaves it
   * as it is) and IPv4 settings (`inetConf`, what sysctl.ts writes under
   * /proc/sys/net/ipv4/conf/<link>/), which the kernel applies together
   * under one lock or refuses together. A new service macvlan's three
   * procfs writes ride on the request that brings the link up, instead of
   * going through the thread pool in front of a start's event loop.
   */
  async setLink(index: number, change: { up?: boolean; inetConf?: ReadonlyArray<readonly [IfSysctlKey, number]> }): Promise<void> {
    this.linkReads.clear();
    const attrs: ifla.LinkAttrs = {};
    if (change.inetConf !== undefined && change.inetConf.length > 0) attrs.afSpec = new Map([[AF_INET, inetConfSpec(change.inetConf)]]);
    const flagChange: { up?: true } = change.up === undefined ? {} : { up: true };
    const flags: { up?: true } = change.up === true ? { up: true } : {};
    try {
      await this.single((sock) => sock.setLink({ index, change: flagChange, flags }, attrs, this.opts()));
    } catch (err) {
      const verb = change.up === undefined ? 'setting IPv4 options of' : change.up ? 'bringing up' : 'bringing down';
      throw netlinkError(err, verb, describe(index));
    }
  }

  /**
   * Delete a link; false when it was already gone. The kernel answers an
   * RTM_DELLINK only after RCU grace periods (~15 ms a link here): the
   * addon sends it from a background thread (deleteLinkFn), so the event
   * loop runs on meanwhile and the deletions of a stop or a reload wait
   * together (stopping 100 DHCP services: 99 deletions, 2.2 s of the main
   * thread in sendmsg before). Counted as a request like the others.
   */
  async deleteLink(index: number): Promise<boolean> {
    this.checkOpen();
    this.linkReads.clear();
    const inBackground = deleteLinkFn();
    try {
      if (inBackground) {
        this.sent.requests++;
        await inBackground(index);
      } else {
        await this.single((sock) => sock.delLink({ index }, {}, this.opts()));
      }
      this.log.info({ op: 'delete-link', index }, 'link deleted');
      return true;
    } catch (err) {
      if (netlinkErrno(err) === 'ENODEV') return false;
      throw netlinkError(err, 'deleting', describe(index));
    }
  }

  /**
   * Add ip/prefix to a link, idempotently (NLM_F_REPLACE, like `ip addr
   * replace`). The broadcast address is set for prefixes up to /30.
   */
  async addAddress(index: number, ip: string, prefix: number, opts: { proto?: number } = {}): Promise<void> {
    const { family, bytes: local } = checkAddress(ip);
    checkPrefix(prefix, family);
    const attrs: rt.AddressAttrs = { local, address: local };
    if (family === 'IPv4' && prefix <= 30) attrs.broadcast = ipv4ToBytes(broadcastOf({ network: parseIPv4(ip)!, prefix }));
    // An IPv6 VIP is added without the kernel's own duplicate address
    // detection (IFA_F_NODAD): the agent runs DAD itself (before claiming a
    // pool VIP; while a DHCPv6 lease serves optimistically, RFC 4429), from
    // net/neighbour/ndp-driver.ts, and a tentative address would neither
    // answer solicitations nor take connections for a second.
    // And deprecated (preferred_lft 0, valid forever; `ip addr add ...
    // preferred_lft 0`): it still takes packets and connections, but the
    // node never picks it as the source of its own (RFC 6724 rule 3).
    // Otherwise a /128 VIP beats the parent's /64 address on rule 8 (Linux
    // caps the matched prefix at the address's prefix length), and the
    // node's health checks leave from the VIP: a direct server return
    // backend, which holds the VIP on lo, drops them as coming from itself.
    if (family === 'IPv6') {
      attrs.flags = { nodad: true };
      attrs.cacheInfo = { ifaPrefered: 0, ifaValid: 0xffffffff };
    }
    if (opts.proto !== undefined) {
      // The package's encoder appends __unparsed attributes as given, but
      // refuses unknown keys it enumerates: hence not enumerable.
      Object.defineProperty(attrs, '__unparsed', { value: [[IFA_PROTO, Buffer.from([opts.proto & 0xff])]], enumerable: false });
    }
    try {
      await this.single((sock) => sock.newAddress({ family: AF_OF[family], prefixlen: prefix, index, scope: 0 }, attrs, this.opts(FlagsNew.CREATE | FlagsNew.REPLACE)));
    } catch (err) {
      throw netlinkError(err, `adding ${ip}/${prefix} to`, describe(index));
    }
    this.log.debug({ op: 'add-address', index, address: `${ip}/${prefix}` }, 'address added');
  }

  /**
   * Remove ip/prefix from a link; false when it was not there.
   *
   * First, what the neighbour table learnt of the address before we held it
   * is forgotten. A VRRP Backup forwarding for the VIP during a hand-over
   * learns its holder of that time; a node that forwards (ip_forward=1) and
   * has just given the address up would send to that node at once, and if
   * it holds the address no longer either, the two forward to each other
   * until the TTL runs out: clients time out through a whole hand-over
   * (test/privileged/vrrp-systemd.test.ts: a Master crashed and back by
   * Restart=, 8-10 failed requests of a 20 ms loop). Forgotten, the address
   * is resolved afresh and packets wait in the ARP queue for whoever holds
   * it next. Before the removal, not after: while the address is ours no
   * packet is forwarded to it, so no entry is resolving with packets queued
   * (deleting one of those fails them with ICMP host unreachable).
   */
  async removeAddress(index: number, ip: string, prefix: number): Promise<boolean> {
    const { family, bytes: local } = checkAddress(ip);
    checkPrefix(prefix, family);
    if (family === 'IPv4') await this.forgetNeighbour(index, ip).catch((err: unknown) => this.log.warn({ op: 'forget-neighbour', index, address: ip, err: errorMessage(err) }, 'could not forget the neighbour entry of an address being removed'));
    try {
      await this.single((sock) => sock.delAddress({ family: AF_OF[family], prefixlen: prefix, index }, { local, address: local }, this.opts()));
    } catch (err) {
      const errno = netlinkErrno(err);
      if (errno === 'EADDRNOTAVAIL' || errno === 'ENODEV') return false;
      throw netlinkError(err, `removing ${ip}/${prefix} from`, describe(index));
    }
    this.log.info({ op: 'remove-address', index, address: `${ip}/${prefix}` }, 'address removed');
    return true;
  }

  /**
   * Remove many addresses at once, in batches: what the removal of each one
   * does (removeAddress), as one neighbour dump, one batch of neighbour
   * deletions and ceil(n / BATCH_MAX) batches of address deletions, instead
   * of up to three round trips an address. Each result is removeAddress's
   * for that address: true removed, false it was not there, or the LbError
   * of its own request; one failing does not stop the others (the kernel
   * acknowledges each request of a batch on its own). Never rejects for
   * one address; TypeError for one that is not an address.
   */
  async removeAddresses(list: readonly AddressRef[]): Promise<Array<boolean | LbError>> {
    if (list.length === 0) return [];
    const parsed = list.map((r) => {
      const { family, bytes } = checkAddress(r.address);
      checkPrefix(r.prefix, family);
      return { ...r, family, bytes };
    });
    // As removeAddress: the neighbour entries the VIPs had before they were ours go first.
    await this.forgetNeighbours(parsed.filter((r) => r.family === 'IPv4')).catch((err: unknown) => this.log.warn({ op: 'forget-neighbour', count: parsed.length, err: errorMessage(err) }, 'could not forget the neighbour entries of addresses being removed'));
    const out: Array<boolean | LbError> = [];
    for (let i = 0; i < parsed.length; i += BATCH_MAX) {
      const part = parsed.slice(i, i + BATCH_MAX);
      const results = await this.batch(part.map((r) => {
        const msg = new AttrStream();
        rt.formatAddressMessage({ kind: 'address', data: { family: AF_OF[r.family], prefixlen: r.prefix, index: r.index }, attrs: { local: r.bytes, address: r.bytes } }, msg);
        return { type: RTM_DELADDR, data: msg.bufs };
      }));
      const removed: Array<{ index: number; address: string }> = [];
      results.forEach((err, j) => {
        const r = part[j]!;
        if (err === undefined) {
          out.push(true);
          removed.push({ index: r.index, address: `${r.address}/${r.prefix}` });
          return;
        }
        const errno = netlinkErrno(err);
        out.push(errno === 'EADDRNOTAVAIL' || errno === 'ENODEV' ? false : netlinkError(err, `removing ${r.address}/${r.prefix} from`, describe(r.index)));
      });
      // One line a batch: a line per address is a thousand writes to journald in a stop of a thousand VIPs.
      if (removed.length === 1) this.log.info({ op: 'remove-address', ...removed[0] }, 'address removed');
      else if (removed.length > 1) this.log.info({ op: 'remove-address', count: removed.length, addresses: removed.map((r) => r.address) }, `${removed.length} addresses removed`);
    }
    return out;
  }

  /**
   * forgetNeighbour for many addresses: one dump of the IPv4 neighbour
   * table, then one batch deleting the learnt entries (not incomplete,
   * permanent or noarp ones) of these addresses on their links.
   */
  private async forgetNeighbours(list: ReadonlyArray<{ index: number; address: string }>): Promise<void> {
    if (list.length === 0) return;
    const wanted = new Set(list.map((r) => `${r.index} ${r.address}`));
    const entries = await this.dump((sock) => sock.getNeighbors({ family: AF_INET }, {}, this.opts()));
    const doomed = entries.filter((e) => {
      const st = e.data.state;
      if (!st || st.incomplete || st.permanent || st.noarp || !e.attrs.dst || e.attrs.dst.length !== 4) return false;
      return wanted.has(`${e.data.ifindex ?? 0} ${formatAddress(addressFromBytes('IPv4', e.attrs.dst))}`);
    });
    for (let i = 0; i < doomed.length; i += BATCH_MAX) {
      await this.batch(doomed.slice(i, i + BATCH_MAX).map((e) => {
        const msg = new AttrStream();
        rt.formatNeighborMessage({ kind: 'neighbor', data: { family: AF_INET, ifindex: e.data.ifindex }, attrs: { dst: e.attrs.dst } }, msg);
        return { type: RTM_DELNEIGH, data: msg.bufs };
      }));
    }
  }

  /**
   * Requests in one datagram on the request socket (one of its in-flight
   * slots), each with NLM_F_ACK and a sequence number of its own; resolves
   * with each one's error, undefined for those the kernel acknowledged.
   */
  private async batch(msgs: ReadonlyArray<{ type: number; data: Uint8Array[] }>): Promise<Array<Error | undefined>> {
    return this.single(async (sock) => {
      this.sent.requests--; // single() counted one request: this is a batch
      this.sent.batches++;
      this.sent.batched += msgs.length;
      return (sock.socket as BatchingNetlinkSocket).requestBatch(msgs, this.timeoutMs);
    });
  }

  /**
   * Delete the learnt neighbour (ARP) entry of ip on a link, like `ip neigh
   * del`; false when there was none to delete. An entry still resolving
   * (incomplete: packets wait on it, and a deletion fails them) and one set
   * by hand (permanent, noarp) are left alone.
   */
  async forgetNeighbour(index: number, ip: string): Promise<boolean> {
    const dst = checkIp(ip);
    try {
      const [found] = await this.single((sock) => sock.getNeighbor({ family: AF_INET, ifindex: index }, { dst }, this.opts()));
      const state = found?.data.state;
      if (!state || state.incomplete || state.permanent || state.noarp) return false;
      await this.single((sock) => sock.delNeighbor({ family: AF_INET, ifindex: index }, { dst }, this.opts()));
    } catch (err) {
      const errno = netlinkErrno(err);
      if (errno === 'ENOENT' || errno === 'ENODEV') return false;
      throw netlinkError(err, `forgetting the neighbour ${ip} of`, describe(index));
    }
    this.log.debug({ op: 'forget-neighbour', index, address: ip }, 'neighbour entry deleted');
    return true;
  }

  /** The addresses of a family (IPv4 unless said), of one link or of all, with their IFA_PROTO mark. */
  async listAddresses(index?: number, family: Family = 'IPv4'): Promise<AddressInfo[]> {
    try {
      const req = new AttrStream();
      rt.formatAddressMessage({ kind: 'address', data: { family: AF_OF[family] }, attrs: {} }, req);
      // Raw dump: the package's parser would drop IFA_PROTO (addressProto).
      const raw = await this.dump(async (sock) => (await sock.socket.request(rt.MessageType.GETADDR, req.bufs, this.opts(FlagsGet.DUMP)))[0]);
      const out: AddressInfo[] = [];
      for (const m of raw) {
        if (m.type !== RTM_NEWADDR) continue;
        const a = addressInfoFromMessage(rt.parseMessage(m.type, m.data) as rt.AddressMessage, family);
        if (!a || (index !== undefined && a.index !== index)) continue;
        const proto = addressProto(m.data);
        out.push(proto !== undefined ? { ...a, proto } : a);
      }
      return out;
    } catch (err) {
      throw netlinkError(err, 'listing addresses of', index === undefined ? 'all links' : describe(index));
    }
  }

  /** Subscribe to link and address changes (RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR). */
  watch(opts: { ref?: boolean } = {}): NetlinkWatcher {
    return new NetlinkWatcher(this.log, opts.ref ?? false);
  }
}

/** Turn one rtnetlink notification into an event; undefined for other message types. Throws on garbage. */
export function parseNotification(type: number, data: Buffer): ['link', LinkEvent] | ['address', AddressEvent] | undefined {
  switch (type) {
    case RTM_NEWLINK:
    case RTM_DELLINK: {
      const link = parseLinkPayload(data);
      return ['link', { type: type === RTM_NEWLINK ? 'new' : 'del', link }];
    }
    case RTM_NEWADDR:
    case RTM_DELADDR: {
      const msg = rt.parseMessage(type, data) as rt.AddressMessage;
      const address = addressInfoFromMessage(msg) ?? addressInfoFromMessage(msg, 'IPv6');
      if (!address) return undefined;
      // The ownership mark, as listAddresses reads it (the package's parser drops IFA_PROTO).
      const proto = addressProto(data);
      return ['address', { type: type === RTM_NEWADDR ? 'new' : 'del', address: proto !== undefined ? { ...address, proto } : address }];
    }
    default:
      return undefined;
  }
}

function describe(nameOrIndex: string | number): string {
  return typeof nameOrIndex === 'number' ? `ifindex ${nameOrIndex}` : nameOrIndex;
}

/**
 * Link and address change notifications on their own socket. Events:
 * 'link' (LinkEvent), 'address' (AddressEvent), 'netconf' () when an
 * interface's forwarding or rp_filter changed, and 'resync' (reason) when
 * notifications may have been lost (ENOBUFS: the owner should list again).
 */
export class NetlinkWatcher extends EventEmitter {
  private readonly sock: RtNetlinkSocket;
  private closed = false;

  constructor(private readonly log: Logger, ref: boolean) {
    super();
    try {
      // A larger receive buffer than the default so a burst of changes (a
      // parent going down takes every macvlan with it) is not lost to ENOBUFS.
      this.sock = openRtNetlink({ ref, recvBufferSize: 1 << 20 });
    } catch (err) {
      throw netlinkError(err, 'opening', 'an rtnetlink socket');
    }
    this.sock.addMembership('LINK');
    this.sock.addMembership('IPV4_IFADDR');
    // IPv6 pool VIPs are /128s on the parent: their removal is drift too.
    this.sock.addMembership('IPV6_IFADDR');
    // Forwarding and rp_filter changes (net.ipv4.ip_forward among them) are
    // announced here; arp_ignore and arp_announce are not, and are polled.
    this.sock.addMembership('IPV4_NETCONF');
    this.sock.socket.on('message', (msgs) => this.onMessages(msgs));
    this.sock.socket.on('error', (err: Error) => {
      // ENOBUFS: the kernel dropped notifications because we read too slowly.
      this.log.warn({ op: 'watch', err: err.message }, 'rtnetlink watch socket error; state must be re-read');
      this.emit('resync', err.message);
    });
  }

  private onMessages(msgs: Array<{ type: number; data: Buffer }>): void {
    for (const m of msgs) {
      let event: ['link', LinkEvent] | ['address', AddressEvent] | undefined;
      try {
        event = parseNotification(m.type, m.data);
      } catch (err) {
        // A notification this package cannot parse: dropped, not thrown.
        this.log.debug({ op: 'watch', type: m.type, err: (err as Error).message }, 'unparsable rtnetlink notification');
      }
      if (event) this.emit(event[0], event[1]);
      else if (m.type === RTM_NEWNETCONF) this.emit('netconf');
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.sock.socket.close();
  }
}

/**
 * The package's rtnetlink socket (its framing and codecs) on the addon's
 * netlink socket: what its createRtNetlink builds on its own .node file.
 * ref: keep the event loop alive while idle (by default only while a
 * request is in flight).
 */
function openRtNetlink(opts: { ref?: boolean; recvBufferSize?: number }): RtNetlinkSocket {
  const raw = new RawNetlinkSocket(Protocol.ROUTE, opts.recvBufferSize !== undefined ? { recvBufferSize: opts.recvBufferSize } : {});
  return new RtNetlinkSocket(new BatchingNetlinkSocket(raw as unknown as PackageRawSocket, { ref: opts.ref ?? false }));
}

/** NLM_F_REQUEST | NLM_F_ACK (linux/netlink.h). */
const NLM_F_REQUEST_ACK = 0x01 | 0x04;

/**
 * The package's framing with batches: several requests in one datagram,
 * matched to their ACKs by sequence number through the package's own table
 * of requests waiting (makeRef, dropRef). The kernel runs the requests of a
 * datagram one after the other and acknowledges each (netlink_rcv_skb), so
 * one failing does not stop the rest.
 */
export class BatchingNetlinkSocket extends NetlinkSocket {
  requestBatch(msgs: ReadonlyArray<{ type: number; data: Uint8Array[] }>, timeoutMs: number): Promise<Array<Error | undefined>> {
    const results: Array<Error | undefined> = new Array<Error | undefined>(msgs.length);
    const seqs: number[] = [];
    const done: boolean[] = msgs.map(() => false);
    const parts: Uint8Array[] = [];
    return new Promise<Array<Error | undefined>>((resolve) => {
      let left = msgs.length;
      let timer: NodeJS.Timeout | undefined;
      const settle = (i: number, err: Error | undefined): void => {
        if (done[i]) return;
        done[i] = true;
        this.dropRef(seqs[i]!);
        results[i] = err;
        if (--left === 0) { if (timer) clearTimeout(timer); resolve(results); }
      };
      msgs.forEach((m, i) => {
        const seq = this.generateSeq();
        seqs[i] = seq;
        this.makeRef(seq, (err: Error | null, reply?: NetlinkMessage[]) => {
          let e: Error | undefined = err ?? undefined;
          if (!e && reply && reply.length > 0) {
            try { checkError(reply[0]!); } catch (x) { e = x as Error; }
          }
          settle(i, e);
        });
        let len = 0;
        for (const b of formatMessage({ type: m.type, flags: NLM_F_REQUEST_ACK, seq, port: 0, data: m.data })) { parts.push(b); len += b.length; }
        // The next message starts on a 4-byte boundary (NLMSG_ALIGN).
        if (len % 4 !== 0) parts.push(new Uint8Array(4 - (len % 4)));
      });
      timer = setTimeout(() => { for (let i = 0; i < msgs.length; i++) settle(i, new Error('Timeout has been reached')); }, timeoutMs);
      // One buffer: a batch of iovecs could pass IOV_MAX.
      this.socket.send(Buffer.concat(parts), {}, (err?: Error) => {
        if (err) for (let i = 0; i < msgs.length; i++) settle(i, err);
      });
    });
  }
}

/** Open an rtnetlink client in the calling process's network namespace. */
export function openNetlink(opts: NetlinkOptions = {}): NetlinkClient {
  return new NetlinkClient(opts);
}
