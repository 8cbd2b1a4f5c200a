// nftables change notifications (nfnetlink, NFNLGRP_NFTABLES): the codec of
// one notification (pure) and the watcher that groups a commit's
// notifications into one change and says who made it. The agent reads them
// to notice someone else deleting, flushing or editing the tables it owns;
// it never writes through this socket.
//
// A commit's notifications arrive together and end with NFT_MSG_NEWGEN, which
// names the committing process (NFTA_GEN_PROC_PID) and the ruleset's new
// generation; each object notification carries the committing socket's port
// in its header, which for nft(8) is its pid as its own PID namespace sees
// it (netlink's autobind). NFTA_GEN_PROC_PID is the pid in the initial
// namespace: in a container (systemd-nspawn, a pod) only the port matches
// the pid the agent knows its `nft` child by.
import { EventEmitter } from 'node:events';
import * as os from 'node:os';
import type { Logger } from '../../log';
import { silentLogger } from '../../log';
import { errorMessage } from '../../errors';
import { RawNetlinkSocket } from './netlink-socket';

/** NETLINK_NETFILTER (linux/netlink.h). */
export const NETLINK_NETFILTER = 12;
/** NFNLGRP_NFTABLES (linux/netfilter/nfnetlink.h). */
export const NFNLGRP_NFTABLES = 7;
/** NFNL_SUBSYS_NFTABLES: the high byte of an nftables message type. */
const NFNL_SUBSYS_NFTABLES = 10;
const NLMSG_HDRLEN = 16;
/** struct nfgenmsg: family, version, res_id. */
const NFGENMSG_LEN = 4;
const NFT_MSG_NEWGEN = 15;
const NFT_MSG_GETGEN = 16;
const NLM_F_REQUEST = 1;
const NLMSG_ERROR = 2;

/** enum nf_tables_msg_types (linux/netfilter/nf_tables.h): what each message is about, and whether it adds or deletes. */
const MESSAGES: Readonly<Record<number, readonly [NftObjectKind, 'new' | 'del']>> = {
  0: ['table', 'new'], 2: ['table', 'del'],
  3: ['chain', 'new'], 5: ['chain', 'del'],
  6: ['rule', 'new'], 8: ['rule', 'del'],
  9: ['set', 'new'], 11: ['set', 'del'],
  12: ['element', 'new'], 14: ['element', 'del'],
  18: ['object', 'new'], 20: ['object', 'del'],
  22: ['flowtable', 'new'], 24: ['flowtable', 'del'],
};

/** NFPROTO_* (linux/netfilter.h) by the names nft(8) gives the families. */
const FAMILIES: Readonly<Record<number, string>> = { 1: 'inet', 2: 'ip', 3: 'arp', 5: 'netdev', 7: 'bridge', 10: 'ip6' };

export type NftObjectKind = 'table' | 'chain' | 'rule' | 'set' | 'element' | 'object' | 'flowtable';

export type NftNotification =
  /** An object of a table changed: every such message's first attribute (NFTA_*_TABLE, type 1) names the table. */
  | { readonly type: 'object'; readonly kind: NftObjectKind; readonly op: 'new' | 'del'; readonly family: string; readonly table: string; readonly portid: number }
  /** The end of a commit: the ruleset's generation after it and who committed it. */
  | { readonly type: 'gen'; readonly gen: number; readonly pid: number | undefined; readonly proc: string | undefined };

const HOST_LE = os.endianness() === 'LE';
const u16 = (b: Buffer, o: number): number => (HOST_LE ? b.readUInt16LE(o) : b.readUInt16BE(o));
const u32 = (b: Buffer, o: number): number => (HOST_LE ? b.readUInt32LE(o) : b.readUInt32BE(o));

/** The netlink attributes between start and end (a message body after its nfgenmsg, or a nested attribute), by type (the first of each); undefined when malformed. */
export function attributes(buf: Buffer, start: number, end: number): Map<number, Buffer> | undefined {
  const out = new Map<number, Buffer>();
  let o = start;
  while (o + 4 <= end) {
    const len = u16(buf, o);
    if (len < 4 || o + len > end) return undefined;
    const type = u16(buf, o + 2) & 0x3fff;
    if (!out.has(type)) out.set(type, buf.subarray(o + 4, o + len));
    o += (len + 3) & ~3;
  }
  return out;
}

const cString = (b: Buffer | undefined): string | undefined => {
  if (!b) return undefined;
  const nul = b.indexOf(0);
  return b.toString('utf8', 0, nul < 0 ? b.length : nul);
};

/**
 * Every nftables notification in one datagram, in order. Messages of other
 * subsystems or types the agent has no use for are skipped; a malformed
 * message ends the datagram (counted by the caller as `malformed`). Pure.
 */
export function parseNftDatagram(buf: Buffer): { notifications: NftNotification[]; malformed: boolean } {
  const notifications: NftNotification[] = [];
  let o = 0;
  while (o + NLMSG_HDRLEN <= buf.length) {
    const len = u32(buf, o);
    if (len < NLMSG_HDRLEN || o + len > buf.length) return { notifications, malformed: true };
    const type = u16(buf, o + 4);
    const portid = u32(buf, o + 12);
    if (type >> 8 === NFNL_SUBSYS_NFTABLES && len >= NLMSG_HDRLEN + NFGENMSG_LEN) {
      const msg = type & 0xff;
      const body = o + NLMSG_HDRLEN;
      const attrs = attributes(buf, body + NFGENMSG_LEN, o + len);
      if (!attrs) return { notifications, malformed: true };
      if (msg === NFT_MSG_NEWGEN) {
        const gen = attrs.get(1);
        const pid = attrs.get(2);
        // NFTA_GEN_ID and NFTA_GEN_PROC_PID are big-endian u32s.
        if (gen && gen.length >= 4) {
          notifications.push({ type: 'gen', gen: gen.readUInt32BE(0), pid: pid && pid.length >= 4 ? pid.readUInt32BE(0) : undefined, proc: cString(attrs.get(3)) });
        }
      } else {
        const m = MESSAGES[msg];
        const table = cString(attrs.get(1));
        if (m && table !== undefined) {
          notifications.push({ type: 'object', kind: m[0], op: m[1], family: FAMILIES[buf[body]!] ?? String(buf[body]), table, portid });
        }
      }
    }
    o += (len + 3) & ~3;
  }
  return { notifications, malformed: false };
}

/** One commit as it touched some tables: what changed there, and who committed it. */
export interface NftCommit {
  /** The ruleset generation after the commit. */
  readonly gen: number;
  /** The committing process (NFTA_GEN_PROC_PID), or the port of its notifications. */
  readonly pid: number | undefined;
  /** The port of the commit's object notifications (the committing socket's; nft's pid in its own PID namespace). */
  readonly port: number | undefined;
  readonly proc: string | undefined;
  /** What the commit did, by "family name" of each table it touched. */
  readonly tables: ReadonlyMap<string, readonly { kind: NftObjectKind; op: 'new' | 'del' }[]>;
}

/**
 * Groups notifications into commits (pure): object notifications wait for
 * the NEWGEN that ends their commit. Returns the commits this batch ended.
 */
export class CommitAssembler {
  private pending = new Map<string, { kind: NftObjectKind; op: 'new' | 'del' }[]>();
  private pendingPort: number | undefined;

  push(ns: readonly NftNotification[]): NftCommit[] {
    const out: NftCommit[] = [];
    for (const n of ns) {
      if (n.type === 'object') {
        const key = `${n.family} ${n.table}`;
        let list = this.pending.get(key);
        if (!list) this.pending.set(key, list = []);
        list.push({ kind: n.kind, op: n.op });
        this.pendingPort = n.portid;
      } else {
        out.push({ gen: n.gen, pid: n.pid ?? this.pendingPort, port: this.pendingPort, proc: n.proc, tables: this.pending });
        this.pending = new Map();
        this.pendingPort = undefined;
      }
    }
    return out;
  }
}

/** The nlmsg of NFT_MSG_GETGEN (a request for the ruleset's generation). Pure. */
export function getGenRequest(seq: number): Buffer {
  const b = Buffer.alloc(NLMSG_HDRLEN + NFGENMSG_LEN);
  const w32 = HOST_LE ? b.writeUInt32LE.bind(b) : b.writeUInt32BE.bind(b);
  const w16 = HOST_LE ? b.writeUInt16LE.bind(b) : b.writeUInt16BE.bind(b);
  w32(b.length, 0);
  w16((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN, 4);
  w16(NLM_F_REQUEST, 6);
  w32(seq, 8);
  // nfgenmsg: AF_UNSPEC, NFNETLINK_V0, res_id 0.
  return b;
}

/**
 * Watches the ruleset. Events: 'commit' (NftCommit) for every commit that
 * touched a table; 'resync' (reason) when notifications may have been lost
 * (ENOBUFS) or could not be read: the owner must check its tables itself.
 */
export class NftWatcher extends EventEmitter {
  private readonly sock: RawNetlinkSocket;
  private readonly request: RawNetlinkSocket;
  private readonly assembler = new CommitAssembler();
  private readonly log: Logger;
  private closed = false;
  private seq = 1;
  private genWaiters: Array<(gen: number | undefined) => void> = [];
  /** The generation after the last commit notified, if any was. */
  lastGen: number | undefined;
  malformed = 0;

  constructor(opts: { log?: Logger } = {}) {
    super();
    this.log = opts.log ?? silentLogger();
    // A flush of a large ruleset notifies every object: room for bursts.
    this.sock = new RawNetlinkSocket(NETLINK_NETFILTER, { recvBufferSize: 4 << 20 });
    try {
      this.sock.addMembership(NFNLGRP_NFTABLES);
      this.request = new RawNetlinkSocket(NETLINK_NETFILTER);
    } catch (err) {
      this.sock.close();
      throw err;
    }
    this.sock.unref();
    this.request.unref();
    this.sock.on('message', (d: Buffer) => this.onDatagram(d));
    this.sock.on('error', (err: Error) => {
      this.log.warn({ op: 'nft-watch', err: err.message }, 'nftables notifications lost; the tables are checked again');
      this.emit('resync', `nftables notifications lost (${err.message})`);
    });
    this.request.on('message', (d: Buffer) => this.onReply(d));
    this.request.on('error', () => this.answerGen(undefined));
  }

  /** The ruleset's generation now (NFT_MSG_GETGEN); undefined when the kernel does not answer within a second. */
  generation(): Promise<number | undefined> {
    if (this.closed) return Promise.resolve(undefined);
    return new Promise((resolve) => {
      const timer = setTimeout(() => { this.genWaiters = this.genWaiters.filter((w) => w !== done); resolve(undefined); }, 1000);
      timer.unref();
      const done = (gen: number | undefined): void => { clearTimeout(timer); resolve(gen); };
      this.genWaiters.push(done);
      this.request.send(getGenRequest(this.seq++));
    });
  }

  private onReply(d: Buffer): void {
    const { notifications } = parseNftDatagram(d);
    const gen = notifications.find((n) => n.type === 'gen');
    if (gen?.type === 'gen') this.answerGen(gen.gen);
    else if (d.length >= NLMSG_HDRLEN + 4 && u16(d, 4) === NLMSG_ERROR && u32(d, NLMSG_HDRLEN) !== 0) this.answerGen(undefined);
  }

  private answerGen(gen: number | undefined): void {
    const w = this.genWaiters.shift();
    w?.(gen);
  }

  private onDatagram(d: Buffer): void {
    let parsed: ReturnType<typeof parseNftDatagram>;
    try {
      parsed = parseNftDatagram(d);
    } catch (err) {
      parsed = { notifications: [], malformed: true };
      this.log.debug({ op: 'nft-watch', err: errorMessage(err) }, 'unreadable nftables notification');
    }
    if (parsed.malformed) {
      this.malformed++;
      this.emit('resync', 'an nftables notification could not be read');
    }
    for (const c of this.assembler.push(parsed.notifications)) {
      this.lastGen = c.gen;
      this.emit('commit', c);
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const w of this.genWaiters.splice(0)) w(undefined);
    this.sock.close();
    this.request.close();
  }
}
