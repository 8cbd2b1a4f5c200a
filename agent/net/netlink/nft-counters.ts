// nftables named counters over nfnetlink: the codec of a dump request and
// of its replies (pure), and a reader that dumps the counters of one table
// on a NETLINK_NETFILTER socket of its own. The kernel path reads its
// counters here instead of spawning `nft -j list counters` (a fork of the
// whole agent and a JSON document of every counter) on every read.
//
// A dump is NFT_MSG_GETOBJ with NLM_F_DUMP, filtered in the kernel by
// NFTA_OBJ_TABLE and NFTA_OBJ_TYPE (nf_tables_dump_obj); each counter comes
// back as an NFT_MSG_NEWOBJ with its name and, nested in NFTA_OBJ_DATA,
// NFTA_COUNTER_BYTES and NFTA_COUNTER_PACKETS (big-endian u64), until
// NLMSG_DONE. A dump that spans several datagrams while a commit changes the
// table comes back flagged NLM_F_DUMP_INTR (nf_tables_dump_obj checks the
// ruleset generation, nl_dump_check_consistent): its counters may miss or
// repeat objects, so it is dumped again, as nft(8) does when libmnl reports
// EINTR for it (here at most COUNTER_DUMP_TRIES times: a table rewritten
// without pause fails the read rather than hold it forever).
import * as os from 'node:os';
import { RawNetlinkSocket } from './netlink-socket';
import { NETLINK_NETFILTER } from './nft-watch';

const NFNL_SUBSYS_NFTABLES = 10;
const NFT_MSG_NEWOBJ = 18;
const NFT_MSG_GETOBJ = 19;
const NLMSG_HDRLEN = 16;
const NFGENMSG_LEN = 4;
const NLM_F_REQUEST = 0x1;
const NLM_F_DUMP = 0x300;
const NLM_F_DUMP_INTR = 0x10;
/** errnos of a dump refused for the moment: tried again (EINTR, EAGAIN, EBUSY). */
const RETRY_ERRNOS: ReadonlySet<number> = new Set([4, 11, 16]);
/** Dumps of one read at most: one interrupted (or refused for the moment) is done again. */
export const COUNTER_DUMP_TRIES = 10;
const NLMSG_ERROR = 2;
const NLMSG_DONE = 3;
const NFTA_OBJ_TABLE = 1;
const NFTA_OBJ_NAME = 2;
const NFTA_OBJ_TYPE = 3;
const NFTA_OBJ_DATA = 4;
const NFT_OBJECT_COUNTER = 1;
const NFTA_COUNTER_BYTES = 1;
const NFTA_COUNTER_PACKETS = 2;

/** NFPROTO_* (linux/netfilter.h) by the names nft(8) gives the families the agent uses. */
export const NFPROTO: Readonly<Record<string, number>> = { ip: 2, netdev: 5, ip6: 10 };

const HOST_LE = os.endianness() === 'LE';
const u16 = (b: Buffer, o: number): number => (HOST_LE ? b.readUInt16LE(o) : b.readUInt16BE(o));
const u32 = (b: Buffer, o: number): number => (HOST_LE ? b.readUInt32LE(o) : b.readUInt32BE(o));
const i32 = (b: Buffer, o: number): number => (HOST_LE ? b.readInt32LE(o) : b.readInt32BE(o));

/** A counter's values. */
export interface NlCounter { readonly packets: number; readonly bytes: number }

/** One netlink attribute, padded to 4 bytes. */
export function attr(type: number, payload: Buffer): Buffer {
  const len = 4 + payload.length;
  const b = Buffer.alloc((len + 3) & ~3);
  if (HOST_LE) { b.writeUInt16LE(len, 0); b.writeUInt16LE(type, 2); } else { b.writeUInt16BE(len, 0); b.writeUInt16BE(type, 2); }
  payload.copy(b, 4);
  return b;
}

/** The nlmsg that dumps the named counters of table `family name`. Pure. */
export function counterDumpRequest(family: number, table: string, seq: number): Buffer {
  const type = Buffer.alloc(4);
  type.writeUInt32BE(NFT_OBJECT_COUNTER, 0);
  const attrs = Buffer.concat([attr(NFTA_OBJ_TABLE, Buffer.from(`${table}\0`)), attr(NFTA_OBJ_TYPE, type)]);
  const b = Buffer.alloc(NLMSG_HDRLEN + NFGENMSG_LEN + attrs.length);
  if (HOST_LE) {
    b.writeUInt32LE(b.length, 0); b.writeUInt16LE((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ, 4);
    b.writeUInt16LE(NLM_F_REQUEST | NLM_F_DUMP, 6); b.writeUInt32LE(seq, 8);
  } else {
    b.writeUInt32BE(b.length, 0); b.writeUInt16BE((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ, 4);
    b.writeUInt16BE(NLM_F_REQUEST | NLM_F_DUMP, 6); b.writeUInt32BE(seq, 8);
  }
  // nfgenmsg: the family, NFNETLINK_V0, res_id 0.
  b[NLMSG_HDRLEN] = family;
  attrs.copy(b, NLMSG_HDRLEN + NFGENMSG_LEN);
  return b;
}


/** What one datagram of a dump's replies holds. */
export interface CounterDumpPart {
  readonly counters: ReadonlyMap<string, NlCounter>;
  /** NLMSG_DONE seen: the dump is complete. */
  readonly done: boolean;
  /** A negative errno from NLMSG_ERROR (ENOENT: no such table). */
  readonly errno: number | undefined;
  readonly malformed: boolean;
  /** A message of the dump carried NLM_F_DUMP_INTR: the table changed while it was dumped. */
  readonly interrupted: boolean;
}

/** A table's name as the kernel sends it (UTF-8, before its NUL), kept per name. */
const tableNames = new Map<string, Buffer>();
function tableName(table: string): Buffer {
  let b = tableNames.get(table);
  if (b === undefined) {
    b = Buffer.from(table, 'utf8');
    if (tableNames.size < 16) tableNames.set(table, b);
  }
  return b;
}

/** Where a NUL-terminated string in buf[o, o + len) ends (its NUL, or the attribute's end). */
function cEnd(buf: Buffer, o: number, len: number): number {
  let e = o;
  const end = o + len;
  while (e < end && buf[e] !== 0) e++;
  return e;
}

/** A big-endian u64 at `o` as a number (two u32 reads: exact up to 2^53, rounded as Number() of the BigInt above it). */
function u64beAt(buf: Buffer, o: number): number {
  return buf.readUInt32BE(o) * 0x100000000 + buf.readUInt32BE(o + 4);
}

/**
 * The counters of table `table` in one datagram of replies to the dump
 * numbered `seq`, put into `into` (a new map if none). Pure. The attributes
 * are walked in place, the first of each type taken (as attributes() does):
 * no map or buffer view per counter, only its name; a dump of thousands of
 * counters is decoded at every read the metrics ask for.
 */
export function parseCounterDump(buf: Buffer, table: string, seq: number, into?: Map<string, NlCounter>): CounterDumpPart {
  const counters = into ?? new Map<string, NlCounter>();
  const want = tableName(table);
  let interrupted = false;
  let o = 0;
  while (o + NLMSG_HDRLEN <= buf.length) {
    const len = u32(buf, o);
    if (len < NLMSG_HDRLEN || o + len > buf.length) return { counters, done: false, errno: undefined, malformed: true, interrupted };
    const type = u16(buf, o + 4);
    if (u32(buf, o + 8) === seq) {
      if ((u16(buf, o + 6) & NLM_F_DUMP_INTR) !== 0) interrupted = true;
      if (type === NLMSG_DONE) return { counters, done: true, errno: undefined, malformed: false, interrupted };
      if (type === NLMSG_ERROR) {
        const errno = len >= NLMSG_HDRLEN + 4 ? i32(buf, o + NLMSG_HDRLEN) : -1;
        return { counters, done: true, errno: errno === 0 ? undefined : errno, malformed: false, interrupted };
      }
      if (type === ((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ) && len >= NLMSG_HDRLEN + NFGENMSG_LEN) {
        // The payloads' offsets and lengths (-1: absent) of the table, name, type and data attributes.
        let tO = -1; let tL = 0; let nO = -1; let nL = 0; let yO = -1; let yL = 0; let dO = -1; let dL = 0;
        const end = o + len;
        let a = o + NLMSG_HDRLEN + NFGENMSG_LEN;
        while (a + 4 <= end) {
          const al = u16(buf, a);
          if (al < 4 || a + al > end) return { counters, done: false, errno: undefined, malformed: true, interrupted };
          const at = u16(buf, a + 2) & 0x3fff;
          if (at === NFTA_OBJ_TABLE) { if (tO < 0) { tO = a + 4; tL = al - 4; } } else if (at === NFTA_OBJ_NAME) { if (nO < 0) { nO = a + 4; nL = al - 4; } } else if (at === NFTA_OBJ_TYPE) { if (yO < 0) { yO = a + 4; yL = al - 4; } } else if (at === NFTA_OBJ_DATA && dO < 0) { dO = a + 4; dL = al - 4; }
          a += (al + 3) & ~3;
        }
        if (tO >= 0 && nO >= 0 && yO >= 0 && yL >= 4 && buf.readUInt32BE(yO) === NFT_OBJECT_COUNTER && dO >= 0) {
          const tEnd = cEnd(buf, tO, tL);
          if (tEnd - tO === want.length && buf.compare(want, 0, want.length, tO, tEnd) === 0) {
            let pO = -1; let pL = 0; let bO = -1; let bL = 0;
            const dEnd = dO + dL;
            let c = dO;
            while (c + 4 <= dEnd) {
              const cl = u16(buf, c);
              if (cl < 4 || c + cl > dEnd) return { counters, done: false, errno: undefined, malformed: true, interrupted };
              const ct = u16(buf, c + 2) & 0x3fff;
              if (ct === NFTA_COUNTER_PACKETS) { if (pO < 0) { pO = c + 4; pL = cl - 4; } } else if (ct === NFTA_COUNTER_BYTES && bO < 0) { bO = c + 4; bL = cl - 4; }
              c += (cl + 3) & ~3;
            }
            counters.set(buf.toString('utf8', nO, cEnd(buf, nO, nL)), { packets: pO >= 0 && pL >= 8 ? u64beAt(buf, pO) : 0, bytes: bO >= 0 && bL >= 8 ? u64beAt(buf, bO) : 0 });
          }
        }
      }
    }
    o += (len + 3) & ~3;
  }
  return { counters, done: false, errno: undefined, malformed: false, interrupted };
}

/** Reads named counters of one table at a time; one socket for the reader's life, dumps one after another. */
export class NftCounterReader {
  private readonly sock: RawNetlinkSocket;
  private seq = 1;
  private pending: { seq: number; table: string; out: Map<string, NlCounter>; interrupted: boolean; settle(err?: Error, again?: string): void } | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  private closed = false;
  /** Dumps done again since the reader was made (interrupted by a commit, or refused for the moment). */
  retries = 0;

  constructor(opts: { timeoutMs?: number } = {}) {
    this.timeoutMs = opts.timeoutMs ?? 5000;
    this.sock = new RawNetlinkSocket(NETLINK_NETFILTER, { recvBufferSize: 1 << 20 });
    this.sock.unref();
    this.sock.on('message', (d: Buffer) => this.onDatagram(d));
    this.sock.on('error', (err: Error) => this.pending?.settle(err));
  }

  private readonly timeoutMs: number;

  /**
   * The named counters of table `family name`: an empty map when the table is
   * not there (ENOENT). Rejects on any other error, a malformed reply or no
   * complete answer within the timeout.
   */
  read(family: string, table: string): Promise<Map<string, NlCounter>> {
    const run = async (): Promise<Map<string, NlCounter>> => {
      for (let tries = 1; ; tries++) {
        const r = await this.dumpOnce(family, table);
        if (!r.again) return r.counters;
        if (tries >= COUNTER_DUMP_TRIES) {
          throw new Error(`the counter dump of table ${family} ${table} was ${r.again} ${tries} times in a row (the table changes without pause)`);
        }
        this.retries++;
      }
    };
    const p = this.chain.then(run, run);
    this.chain = p.catch(() => undefined);
    return p;
  }

  /** One dump; `again` says why it must be done again (interrupted by a commit, or refused for the moment). */
  private dumpOnce(family: string, table: string): Promise<{ counters: Map<string, NlCounter>; again?: string }> {
    return new Promise((resolve, reject) => {
      if (this.closed) { reject(new Error('the nftables counter reader is closed')); return; }
      const nfproto = NFPROTO[family];
      if (nfproto === undefined) { reject(new Error(`no NFPROTO for family ${family}`)); return; }
      const seq = this.seq++;
      const out = new Map<string, NlCounter>();
      const timer = setTimeout(() => settle(new Error(`no complete answer to the counter dump of table ${family} ${table} within ${this.timeoutMs} ms`)), this.timeoutMs);
      timer.unref();
      const settle = (err?: Error, again?: string): void => {
        if (this.pending?.seq !== seq) return;
        const interrupted = this.pending.interrupted;
        this.pending = undefined;
        clearTimeout(timer);
        if (err) reject(err);
        else if (again !== undefined) resolve({ counters: out, again });
        else if (interrupted) resolve({ counters: out, again: 'interrupted by a change to the table' });
        else resolve({ counters: out });
      };
      this.pending = { seq, table, out, interrupted: false, settle };
      this.sock.send(counterDumpRequest(nfproto, table, seq), undefined, (err) => { if (err) settle(err); });
    });
  }

  private onDatagram(d: Buffer): void {
    const p = this.pending;
    if (!p) return;
    const part = parseCounterDump(d, p.table, p.seq, p.out);
    if (part.interrupted) p.interrupted = true;
    if (part.malformed) { p.settle(new Error('malformed nftables counter dump')); return; }
    if (!part.done) return;
    if (part.errno === undefined || part.errno === -2) {
      if (part.errno === -2) p.out.clear();
      p.settle();
    } else if (RETRY_ERRNOS.has(-part.errno)) {
      p.settle(undefined, `refused for the moment (errno ${-part.errno})`);
    } else {
      p.settle(Object.assign(new Error(`nftables counter dump failed: errno ${-part.errno}`), { errno: -part.errno }));
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.pending?.settle(new Error('the nftables counter reader is closed'));
    this.sock.close();
  }
}
