// The thin driver of the full-NAT engine (native/bpf/nat.c) at tcx ingress
// of the parent NIC: loads the clang-built object through the addon's
// libbpf (native/src/bpf_object.cc), performs the map writes that take its
// maps to a plan (forward/nat-plan.ts natDelta: only the ports that
// changed, in an order the running program can read at any point), swaps a
// program in atomically (BPF_F_REPLACE) where one is loaded, reads its
// counters, and detaches it. Map layouts come from nat.h (nat-layout.ts).
//
// A program is loaded (and its per-plan maps created, sized by
// natCapacity) at the first plan, when a plan no longer fits the maps, when
// a write fails, and for a repair; every other plan is written into the
// maps of the program in place, as Cilium updates its service maps.
//
// Lifetime: the flow maps (lbn_flows, lbn_replies) and the engine's event
// counters are pinned under the pin directory, so every program of this
// process, and of the next one, uses the same flows: a reload or a restart
// forgets no flow. The attached program is pinned there too
// (`lb_agent_nat_prog`): a tcx attachment outlives the process that made it,
// and the next process opens the pin (needing only the file's permissions,
// not CAP_SYS_ADMIN as opening a program by id does) to replace it in one
// step. Where there is no pin to find (the earlier process's BPF file system
// was its own), its program is found at the hook by name and its flow maps
// are pinned here from it before the load, so a restart keeps the flows
// there too. A stop detaches the program and removes the pins.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { LbError, errorMessage } from '../../errors';
import { bpfObjectPath, ifNameToIndex, nativeBpfObject, type NativeBpfObject } from '../../native/native';
import { emptyNatMaps, natCapacity, natDelta, natOpWrites, EMPTY_NAT_PLAN, type NatMaps, type NatOp, type NatPlan } from '../../forward/nat-plan';
import { natRecordText, natRecordedMaps, type NatRecord } from '../../forward/nat-record';
import { natLayout, type CLayout } from './nat-layout';
import { BPF_F_REPLACE, BPF_TCX_INGRESS } from './ebpf-dsr';
import { otherOwnPrograms } from './ebpf-attach';
import { MapBatchWriter, probeMapBatch, readArrayBatch, sumPerCpu } from './map-batch';

/** The program's name (its function in nat.c): how ours is told apart at the hook. */
export const NAT_PROG_NAME = 'lb_agent_nat';
/** The object file binding.gyp builds beside the addon. */
export const NAT_OBJECT = 'nat.bpf.o';
const PROG_PIN = 'lb_agent_nat_prog';
/** The flow maps, both families (pinned by name, LIBBPF_PIN_BY_NAME in nat.c), and the IPv6 ones. */
const FLOW_MAPS = ['lbn_flows', 'lbn_replies', 'lbn_flows6', 'lbn_replies6'] as const;
const FLOW6_MAPS: readonly string[] = ['lbn_flows6', 'lbn_replies6'];
/** The maps pinned by name. */
const PINNED_MAPS = [...FLOW_MAPS, 'lbn_events'] as const;
/** The event counting the keys the program added to each flow map (nat.h). */
const INSERT_EVENT: Readonly<Record<(typeof FLOW_MAPS)[number], string>> = {
  lbn_flows: 'LBN_EV_FLOW_INSERT', lbn_replies: 'LBN_EV_REPLY_INSERT', lbn_flows6: 'LBN_EV_FLOW6_INSERT', lbn_replies6: 'LBN_EV_REPLY6_INSERT',
};
/** The per-plan maps the driver writes. */
const PLAN_MAPS = ['lbn_config', 'lbn_svcs', 'lbn_slots', 'lbn_members', 'lbn_svcs6', 'lbn_slots6', 'lbn_members6', 'lbn_counters', 'lbn_events'] as const;
/** The per-plan maps pinned beside the program (`plan_<name>`), so the next process can open them by path and keep them. */
const RECORDED_MAPS = ['lbn_config', 'lbn_svcs', 'lbn_slots', 'lbn_members', 'lbn_svcs6', 'lbn_slots6', 'lbn_members6', 'lbn_counters'] as const;
/** The record of what they hold (forward/nat-record.ts), an array map of JSON chunks pinned beside them. */
const RECORD_PIN = 'plan_record';
const RECORD_CHUNK = 65536;
/** How long after maps written in place their record is kept (keepRecordSoon). */
const RECORD_DELAY_MS = 1000;
/** Entries of an IPv6 flow map while the plan has no IPv6 port (an LRU map wants some). */
const FLOW6_TOKEN_ENTRIES = 16;
const EVENTS = ['LBN_EV_NEW_FLOW', 'LBN_EV_MIDFLOW', 'LBN_EV_EXPIRED', 'LBN_EV_REPLACED', 'LBN_EV_PORTS_EXHAUSTED', 'LBN_EV_NO_ROUTE', 'LBN_EV_ICMP_ERROR', 'LBN_EV_IPV6_EXT_HEADER'] as const;
/** `evicted`: entries the flow maps' LRU dropped (not an event of the program: inserts it counted less the maps' fill, see events()). */
export type NatEvent = 'new' | 'midflow' | 'expired' | 'replaced' | 'portsExhausted' | 'noRoute' | 'icmpError' | 'ipv6ExtHeader' | 'evicted';
const EVENT_NAMES: Readonly<Record<(typeof EVENTS)[number], NatEvent>> = {
  LBN_EV_NEW_FLOW: 'new', LBN_EV_MIDFLOW: 'midflow', LBN_EV_EXPIRED: 'expired', LBN_EV_REPLACED: 'replaced',
  LBN_EV_PORTS_EXHAUSTED: 'portsExhausted', LBN_EV_NO_ROUTE: 'noRoute', LBN_EV_ICMP_ERROR: 'icmpError', LBN_EV_IPV6_EXT_HEADER: 'ipv6ExtHeader',
};

/** The engine's settings (config `kernel:`). */
export interface NatSettings {
  /** Entries of each flow map (one per direction of a flow). */
  readonly flowEntries: number;
  readonly tcpIdleSeconds: number;
  readonly tcpClosingSeconds: number;
  readonly udpIdleSeconds: number;
  /** The reserved source-port range a flow takes when the client's own port is taken towards its backend. */
  readonly portMin: number;
  readonly portMax: number;
}

/**
 * Defaults: conntrack's own timeouts for established TCP (5 days is
 * nf_conntrack_tcp_timeout_established; the engine keeps an idle connection
 * 2 hours, as a NAT box per RFC 5382 REQ-5 must at least), TIME_WAIT's 120 s
 * after a FIN or RST, UDP's 120 s of a stream (nf_conntrack_udp_timeout_stream).
 */
export const NAT_DEFAULTS: NatSettings = {
  flowEntries: 65536, tcpIdleSeconds: 7200, tcpClosingSeconds: 120, udpIdleSeconds: 120, portMin: 61001, portMax: 65535,
};

export interface NatCounter {
  readonly packetsToBackend: number;
  readonly bytesToBackend: number;
  readonly packetsToClient: number;
  readonly bytesToClient: number;
  readonly flows: number;
}

/** The fields of lbn_counter, in the order a counters read sums them (NAT_COUNTER_WIDTH numbers per counter index). */
export const NAT_COUNTER_FIELDS = ['packets_to_backend', 'bytes_to_backend', 'packets_to_client', 'bytes_to_client', 'flows'] as const;
export const NAT_COUNTER_WIDTH = NAT_COUNTER_FIELDS.length;
export const NAT_PACKETS_TO_BACKEND = 0;
export const NAT_BYTES_TO_BACKEND = 1;
export const NAT_PACKETS_TO_CLIENT = 2;
export const NAT_BYTES_TO_CLIENT = 3;
export const NAT_FLOWS = 4;

/**
 * One read of the engine's counters, as numbers by counter index: no
 * object or key string per (port, backend). At `index * NAT_COUNTER_WIDTH +
 * field` of `totals`: the current program's counter summed over the CPUs,
 * plus the totals carried for the (service, port, backend) that index
 * counts in the plan in force (a retired counter's, the earlier programs').
 * Exact up to 2^53. Valid until the engine's next read (the arrays are
 * reused): read it in the turn it was taken.
 */
export interface NatCounterTotals {
  readonly totals: Float64Array;
  /** The counter index of each of a port's backends (NatPortPlan.backends), by the port's id in the plan in force; undefined for a port it does not hold. */
  readonly indices: (portId: string) => readonly number[] | undefined;
}

const NO_TOTALS: NatCounterTotals = { totals: new Float64Array(0), indices: () => undefined };

/** The carried totals, with a version bumped by every change (the per-index view of them is made again only then). */
class CarriedTotals extends Map<string, NatCounter> {
  version = 0;
  override set(k: string, v: NatCounter): this {
    this.version++;
    return super.set(k, v);
  }
  override delete(k: string): boolean {
    this.version++;
    return super.delete(k);
  }
  override clear(): void {
    this.version++;
    super.clear();
  }
}

export interface NatEngineOptions {
  readonly device: string;
  /** Where the flow maps and the program are pinned (on a bpffs). */
  readonly pinDir: string;
  readonly settings?: NatSettings;
  readonly bpf?: NativeBpfObject;
  readonly objectPath?: string;
  /** false: one bpf(2) call per map entry, as where the kernel refuses batch calls (the tests compare the two). */
  readonly batch?: boolean;
}

/** The default pin directory of a device's engine. */
export const natPinDir = (device: string): string => `/sys/fs/bpf/lb-agent/nat-${device}`;

interface Loaded {
  readonly prog: number;
  readonly maps: Readonly<Record<string, number>>;
  /** What its per-plan maps hold. */
  contents: NatMaps;
}

/** What the last apply did (status, and the tests' count of map writes). */
export interface NatApplyReport {
  /**
   * `delta`: written into the maps in place; `load`: a program loaded with
   * maps of its own and swapped in; `adopt`: the program and maps an earlier
   * process left, kept, and written only where their record differs from
   * the plan.
   */
  readonly mode: 'delta' | 'load' | 'adopt';
  /** Why a program was loaded (`load`). */
  readonly reason?: string;
  /** Ports whose entries were written (added, changed or removed). */
  readonly ports: number;
  /** Map entries written or deleted (a slot table: one per slot; a counter retired: its read and its reset as one). */
  readonly writes: number;
  /** The bpf(2) calls that wrote them (batched: a few thousand entries a call). */
  readonly calls: number;
}

function closeFd(fd: number | undefined): void {
  if (fd === undefined) return;
  try { fs.closeSync(fd); } catch { /* already closed */ }
}

function closeLoaded(l: Loaded | undefined): void {
  if (!l) return;
  closeFd(l.prog);
  for (const fd of Object.values(l.maps)) closeFd(fd);
}

const isGone = (err: unknown): boolean => (err as { code?: string }).code === 'ENOENT';

function u32(k: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(k);
  return b;
}

/** The CPUs a per-CPU map has a value for (/sys/devices/system/cpu/possible: "0-3" or "0,2-5"). */
export function possibleCpus(text: string = fs.readFileSync('/sys/devices/system/cpu/possible', 'utf8')): number {
  let n = 0;
  for (const part of text.trim().split(',')) {
    const [a, b] = part.split('-').map(Number);
    n = Math.max(n, (b ?? a!) + 1);
  }
  return n;
}

/** Is `dir` on a bpffs (statfs magic BPF_FS_MAGIC)? Undefined when it cannot be told. */
function bpffsProblem(dir: string): string | undefined {
  let d = dir;
  while (!fs.existsSync(d)) d = path.dirname(d);
  // Node has no statfs type check before 18.15 (fs.statfsSync); 20 has it.
  const st = fs.statfsSync(d);
  if (st.type !== BPF_FS_MAGIC) return `${d} is not on a BPF file system (mount -t bpf bpf /sys/fs/bpf)`;
  return undefined;
}

const BPF_FS_MAGIC = 0xcafe4a11;

/**
 * A BPF file system at `dir` (/sys/fs/bpf): there already (systemd mounts
 * it at boot, the unit's ExecStartPre where it did not), or mounted now
 * (mount(8); needs CAP_SYS_ADMIN, which a root agent outside the unit has
 * and the unit's daemon does not). Returns why there is none, or undefined.
 */
export function mountBpffs(dir = '/sys/fs/bpf', mount: (dir: string) => void = mountBpf): string | undefined {
  try {
    if (fs.statfsSync(dir).type === BPF_FS_MAGIC) return undefined;
  } catch (err) {
    return `${dir}: ${errorMessage(err)}`;
  }
  try {
    mount(dir);
  } catch (err) {
    return `no BPF file system at ${dir}, and mounting one failed (${errorMessage(err).split('\n')[0]}); mount -t bpf bpf ${dir}`;
  }
  return fs.statfsSync(dir).type === BPF_FS_MAGIC ? undefined : `no BPF file system at ${dir} after mounting one`;
}

function mountBpf(dir: string): void {
  execFileSync('mount', ['-t', 'bpf', '-o', 'mode=0700', 'bpf', dir], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 5000 });
}

/** The engine on one device. Not re-entrant: the data path calls it from its serial queue. */
export class NatEngine {
  readonly device: string;
  readonly pinDir: string;
  readonly settings: NatSettings;
  private readonly bpf: NativeBpfObject;
  private readonly objectPath: string;
  private readonly layout: CLayout;
  private current: Loaded | undefined;
  /** Counter totals of the programs this one replaced, by "service\0proto/port\0backend". */
  private readonly carried = new CarriedTotals();
  private readonly cpus: number;
  /** The highest eviction count reported (events()), and what of it was counted against flow maps since replaced. */
  private evicted = 0;
  private evictedBase = 0;
  /** The counters read in this turn of the event loop (totals(), counters()). */
  private countersRead: NatCounterTotals | undefined;
  /** What the counters of the current program are read into and summed into (reused read after read). */
  private readBuf: Buffer | undefined;
  private totalsBuf: Float64Array | undefined;
  /** The carried totals by counter index, for the contents and the carried version they were made for. */
  private carriedAt: { contents: NatMaps; version: number; at: Float64Array } | undefined;
  /** Maps written in place whose record is not kept yet, and the timer that keeps it. */
  private recordDue: Loaded | undefined;
  private recordTimer: NodeJS.Timeout | undefined;
  /** The record's map (keepRecord), its chunks, and the buffer its text is put together in. */
  private recordMap: { fd: number; chunks: number } | undefined;
  private counterBuf: Buffer | undefined;
  private counterOffsets: Uint32Array | undefined;
  /** What the last apply did. */
  lastApply: NatApplyReport | undefined;
  /** Why map entries are written and read one bpf(2) call each (undefined: batch calls), as the first refusal found. */
  batchProblem: string | undefined;
  /** The bpf(2) calls of the last counters read. */
  counterCalls = 0;
  /** Why the maps an earlier process left were not kept (a whole load followed), or undefined. */
  adoptMiss: string | undefined;
  private objectSha: string | undefined;

  constructor(opts: NatEngineOptions) {
    this.device = opts.device;
    this.pinDir = opts.pinDir;
    this.settings = opts.settings ?? NAT_DEFAULTS;
    const bpf = opts.bpf ?? nativeBpfObject();
    if (typeof bpf === 'string') throw new LbError('LB_ERR_FORWARD_NAT_BPF', bpf);
    this.bpf = bpf;
    this.objectPath = opts.objectPath ?? bpfObjectPath(NAT_OBJECT);
    this.layout = natLayout();
    this.cpus = possibleCpus();
    if (opts.batch === false) this.batchProblem = 'batch calls turned off (NatEngineOptions.batch)';
    // The program an earlier process left: the DSR engine at the same hook must not take it for an unknown one of its own.
    const inherited = this.pinnedProg();
    if (inherited !== undefined) {
      try { otherOwnPrograms.add(this.bpf.bpfProgInfo(inherited).id); } catch { /* gone meanwhile */ } finally { closeFd(inherited); }
    }
  }

  private load(plan: NatPlan): { next: Loaded; writes: number; calls: number; ports: number } {
    const problem = bpffsProblem(this.pinDir);
    if (problem) throw new LbError('LB_ERR_FORWARD_NAT_BPF', `cannot pin the NAT engine's flow maps: ${problem}`);
    fs.mkdirSync(this.pinDir, { recursive: true, mode: 0o700 });
    const s = this.settings;
    const cap = natCapacity(plan);
    const fill = natDelta(emptyNatMaps(cap), plan, this.layout);
    if (fill === undefined) throw new LbError('LB_ERR_FORWARD_NAT_BPF', 'the NAT engine\'s maps sized for a plan have no room for it (a bug: natCapacity and natDelta disagree)');
    // Flow maps this load creates (no pin yet, or one of another layout): their insert counts start again (events()).
    const created: string[] = FLOW_MAPS.filter((name) => !fs.existsSync(path.join(this.pinDir, name)));
    // The IPv6 flow maps take their full size with the first IPv6 port, and keep it (pinned) from then on.
    const flows6 = cap.six || this.flows6Sized() ? s.flowEntries : FLOW6_TOKEN_ENTRIES;
    let loaded;
    try {
      loaded = this.bpf.bpfObjectLoad(this.objectPath, this.pinDir, {
        lbn_svcs: Math.max(1, cap.svcs), lbn_slots: Math.max(1, cap.slots), lbn_members: Math.max(1, cap.members),
        lbn_svcs6: Math.max(1, cap.svcs6), lbn_slots6: Math.max(1, cap.slots6), lbn_members6: Math.max(1, cap.members6),
        lbn_counters: Math.max(1, cap.counters), lbn_flows: s.flowEntries, lbn_replies: s.flowEntries, lbn_flows6: flows6, lbn_replies6: flows6,
      });
    } catch (err) {
      const log = (err as { log?: unknown }).log;
      throw new LbError('LB_ERR_FORWARD_NAT_BPF', `cannot load the NAT engine (${this.objectPath}): ${errorMessage(err)}${typeof log === 'string' && log.trim() !== '' ? `; libbpf: ${log.trim().split('\n').slice(-3).join(' | ')}` : ''}`,
        undefined, { cause: err });
    }
    const prog = loaded.prog[NAT_PROG_NAME];
    const next: Loaded = { prog: prog!, maps: loaded.maps, contents: emptyNatMaps(cap) };
    let writes = { entries: 0, calls: 0 };
    try {
      if (prog === undefined) throw new Error(`the object has no program ${NAT_PROG_NAME}`);
      for (const name of PLAN_MAPS) {
        if (loaded.maps[name] === undefined) throw new Error(`the object has no map ${name}`);
      }
      const ns = (sec: number): bigint => BigInt(Math.round(sec * 1e9));
      this.bpf.bpfMapUpdate(loaded.maps['lbn_config']!, u32(0), this.layout.encode('lbn_config', {
        tcp_idle_ns: ns(s.tcpIdleSeconds), tcp_closing_ns: ns(s.tcpClosingSeconds), udp_idle_ns: ns(s.udpIdleSeconds),
        port_min: s.portMin, port_count: s.portMax - s.portMin + 1,
      }), 0);
      // Fresh maps: nothing to retire, nothing read.
      writes = this.write(next, fill.ops);
      next.contents = fill.maps;
      const fresh = FLOW_MAPS.filter((name) => created.includes(name) || loaded.unpinned.includes(name));
      if (fresh.length > 0) {
        // What the old maps lost stays counted; keys of maps that are gone no longer count as evicted.
        this.evictedBase = this.evicted;
        for (const name of fresh) this.bpf.bpfMapUpdate(loaded.maps['lbn_events']!, u32(this.layout.constant(INSERT_EVENT[name])), Buffer.alloc(8 * this.cpus), 0);
      }
    } catch (err) {
      closeLoaded(next);
      throw new LbError('LB_ERR_FORWARD_NAT_BPF', `cannot fill the NAT engine's maps: ${errorMessage(err)}`, undefined, { cause: err });
    }
    return { next, writes: writes.entries, calls: writes.calls + 1, ports: fill.changed };
  }

  /**
   * Perform `ops` on `l`'s maps, in order; returns the entries written and
   * the bpf(2) calls made. Puts go to the kernel a batch at a time
   * (MapBatchWriter: a batch holds one map's consecutive puts, in their
   * order, so the order natDelta gives is the order the kernel writes);
   * a delete or a counter's retirement sends what is gathered first. A
   * retired counter's totals are kept (carried) before it is zeroed.
   */
  private write(l: Loaded, ops: readonly NatOp[]): { entries: number; calls: number } {
    const fd = (name: string): number => l.maps[name]!;
    const w = new MapBatchWriter(this.bpf, { unsupported: this.batchProblem });
    const slotKey = Buffer.alloc(4);
    const zero = Buffer.alloc(this.layout.size('lbn_counter') * this.cpus);
    let writes = 0;
    let calls = 0;
    try {
      for (const op of ops) {
        writes += natOpWrites(op);
        switch (op.map) {
          case 'lbn_slots':
          case 'lbn_slots6': {
            const slotSize = this.layout.size(op.map === 'lbn_slots6' ? 'lbn_slot6' : 'lbn_slot');
            const slotFd = fd(op.map);
            const n = op.op === 'patch' ? op.slots.length : op.table.length;
            for (let k = 0; k < n; k++) {
              const i = op.op === 'patch' ? op.slots[k]! : k;
              slotKey.writeUInt32LE(op.base + i);
              const at = op.table[i]! * slotSize;
              w.put(slotFd, slotKey, op.values.subarray(at, at + slotSize));
            }
            break;
          }
          case 'lbn_counters': {
            w.flush();
            const k = natCounterKey(op.ref.service, `${op.ref.port.protocol}/${op.ref.port.port}`, op.ref.backend);
            const now = this.readCounter(fd('lbn_counters'), op.index);
            if (now) this.carried.set(k, addCounters(this.carried.get(k), now));
            this.bpf.bpfMapUpdate(fd('lbn_counters'), u32(op.index), zero, 0);
            calls += 2;
            break;
          }
          default:
            if (op.op === 'put') {
              w.put(fd(op.map), op.key, op.value);
            } else {
              w.flush();
              this.bpf.bpfMapDelete!(fd(op.map), op.key);
              calls++;
            }
        }
      }
      w.flush();
    } finally {
      this.batchProblem = w.unsupported;
      this.countersRead = undefined;
    }
    return { entries: writes, calls: calls + w.calls };
  }

  /** The program a previous plan or process left attached (by its pin), or undefined. */
  private pinnedProg(): number | undefined {
    try {
      return this.bpf.bpfObjGet(path.join(this.pinDir, PROG_PIN));
    } catch {
      return undefined;
    }
  }

  /**
   * Ours attached at the hook without a pin to find it by (a previous
   * process whose bpffs was private to it, as under `ip netns exec`, or
   * whose pins someone removed): recognised by name, opened by id (needs
   * CAP_SYS_ADMIN; without it, undefined, and the new program goes in
   * beside it as before).
   */
  private attachedUnpinned(ifindex: number): number | undefined {
    let ids: number[];
    try { ids = this.bpf.bpfProgQuery(ifindex, BPF_TCX_INGRESS); } catch { return undefined; }
    for (const id of ids) {
      let fd: number | undefined;
      try {
        fd = this.bpf.bpfProgGetFdById(id);
        if (this.bpf.bpfProgInfo(fd).name === NAT_PROG_NAME) return fd;
      } catch { /* gone meanwhile, or not ours to open */ }
      closeFd(fd);
    }
    return undefined;
  }

  /**
   * Take the engine to `plan`: written into the maps of the program in
   * place where it has room for it (natDelta), otherwise (no program yet,
   * no room, a write refused, `reload`) a program loaded for it put in place
   * of ours (this process's or the pinned one an earlier process attached)
   * in one step; the first one is appended after any other program at the
   * hook. Throws with the previous program in force when a new one cannot
   * be loaded or attached.
   */
  apply(plan: NatPlan, opts: { reload?: boolean } = {}): NatApplyReport {
    if (this.current === undefined && !opts.reload) {
      const kept = this.adopt(plan);
      if (kept !== undefined) return (this.lastApply = kept);
    }
    let why = opts.reload ? 'repair' : this.current === undefined ? 'first plan' : this.bpf.bpfMapDelete === undefined ? 'the native addon cannot delete map entries (rebuild it: npm ci)' : undefined;
    const cur = this.current;
    if (why === undefined && cur !== undefined) {
      const d = natDelta(cur.contents, plan, this.layout);
      if (d === undefined) {
        why = 'the maps have no room for the plan';
      } else {
        try {
          if (d.ops.length > 0) this.forgetRecord();
          const writes = this.write(cur, d.ops);
          cur.contents = d.maps;
          if (d.ops.length > 0) this.keepRecordSoon(cur);
          return (this.lastApply = { mode: 'delta', ports: d.changed, writes: writes.entries, calls: writes.calls });
        } catch (err) {
          // Part of the delta is in the maps: a program loaded for the plan replaces them whole.
          why = `a map write failed (${errorMessage(err)})`;
        }
      }
    }
    const ifindex = ifNameToIndex(this.device);
    const pinned = this.current ? undefined : this.pinnedProg();
    const inherited = this.current ? undefined : pinned ?? this.attachedUnpinned(ifindex);
    let loaded: ReturnType<NatEngine['load']>;
    try {
      if (pinned === undefined && inherited !== undefined) this.adoptFlowMaps(inherited);
      loaded = this.load(plan);
    } catch (err) {
      closeFd(inherited);
      throw err;
    }
    const { next, writes, calls, ports } = loaded;
    try {
      const old = this.current?.prog ?? inherited;
      let replaced = false;
      if (old !== undefined) {
        try {
          this.bpf.bpfProgAttach(ifindex, next.prog, BPF_TCX_INGRESS, BPF_F_REPLACE, old);
          replaced = true;
        } catch (err) {
          // Detached meanwhile (by hand, or its device was re-created): attach anew.
          if (!isGone(err)) throw err;
        }
      }
      if (!replaced) this.bpf.bpfProgAttach(ifindex, next.prog, BPF_TCX_INGRESS, 0, 0);
    } catch (err) {
      closeLoaded(next);
      closeFd(inherited);
      throw new LbError('LB_ERR_FORWARD_NAT_BPF', `cannot attach the NAT engine at tcx ingress of ${this.device}: ${errorMessage(err)}`, undefined, { cause: err });
    }
    closeFd(inherited);
    otherOwnPrograms.add(this.bpf.bpfProgInfo(next.prog).id);
    // In place of the previous pin: the program's pin is never missing.
    this.pinAt(next.prog, PROG_PIN);
    this.carryCounters();
    closeLoaded(this.current);
    this.current = next;
    this.countersRead = undefined;
    this.recordDue = undefined;
    this.keepRecord(next);
    return (this.lastApply = { mode: 'load', reason: why ?? 'first plan', ports, writes, calls });
  }

  /**
   * The pinned maps (flows, replies, events) of the program an earlier
   * process left attached without a pin here (its BPF file system was its
   * own: a mount namespace of its own, as under `ip netns exec`), pinned
   * here where they have no pin. The program loaded next then uses
   * the same flow maps, so the backends' replies of the flows it placed
   * still find their entries after the swap: a client side's packet without
   * an entry is picked up mid-way, a backend's is not, and a reply in flight
   * at the swap (a SYN-ACK, a response) would go to the stack, which resets
   * it. Opening a map by id needs CAP_SYS_ADMIN; without it nothing is
   * adopted and the maps start empty. A map of another layout is replaced
   * at the load (the addon unpins it).
   */
  private adoptFlowMaps(prog: number): void {
    const missing = PINNED_MAPS.filter((name) => !fs.existsSync(path.join(this.pinDir, name)));
    if (missing.length === 0 || bpffsProblem(this.pinDir) !== undefined) return;
    let ids: readonly number[];
    try { ids = this.bpf.bpfProgInfo(prog).mapIds; } catch { return; }
    fs.mkdirSync(this.pinDir, { recursive: true, mode: 0o700 });
    for (const id of ids) {
      let fd: number | undefined;
      try {
        fd = this.bpf.bpfMapGetFdById(id);
        const name = this.bpf.bpfMapInfo(fd).name;
        if ((missing as readonly string[]).includes(name)) this.bpf.bpfObjPin(fd, path.join(this.pinDir, name));
      } catch { /* gone meanwhile, or not ours to open: that map starts empty */ } finally { closeFd(fd); }
    }
  }

  /**
   * Keep the program and maps an earlier process left attached, where a
   * record of what they hold is pinned beside them and names exactly them
   * (the pinned program's id, each pinned map's id among the program's
   * maps, the object file's digest, the settings and CPUs): write only the
   * ports whose recorded digest differs from `plan`'s (natRecordedMaps,
   * natDelta), nothing when none does. Anything else (no record, another
   * program, a map not the program's, no room, the program not at the hook,
   * a write refused) leaves it to a whole load (undefined; adoptMiss says
   * why). The counters go on from what the earlier process's flows counted.
   */
  private adopt(plan: NatPlan): NatApplyReport | undefined {
    const prog = this.pinnedProg();
    if (prog === undefined) return undefined;
    const maps: Record<string, number> = {};
    let kept = false;
    try {
      const record = this.readRecord();
      if (record === undefined) return this.miss('no record of what the pinned maps hold');
      for (const name of RECORDED_MAPS) maps[name] = this.bpf.bpfObjGet(path.join(this.pinDir, `plan_${name}`));
      for (const name of PINNED_MAPS) maps[name] = this.bpf.bpfObjGet(path.join(this.pinDir, name));
      const l: Loaded = { prog, maps, contents: natRecordedMaps(record, plan) };
      const identity = this.identity(l);
      if (JSON.stringify(identity) !== JSON.stringify(record.identity)) return this.miss('the record names other maps, another program or other settings');
      const progInfo = this.bpf.bpfProgInfo(prog);
      if (!Object.values(maps).every((fd) => progInfo.mapIds.includes(this.bpf.bpfMapInfo(fd).id))) return this.miss('a pinned map is not the pinned program\'s');
      if (!this.bpf.bpfProgQuery(ifNameToIndex(this.device), BPF_TCX_INGRESS).includes(progInfo.id)) return this.miss(`the pinned program is not attached at tcx ingress of ${this.device}`);
      const d = natDelta(l.contents, plan, this.layout);
      if (d === undefined) return this.miss('the pinned maps have no room for the plan');
      if (d.ops.length > 0) this.forgetRecord();
      const writes = this.write(l, d.ops);
      l.contents = d.maps;
      if (d.ops.length > 0) this.keepRecord(l);
      this.current = l;
      this.countersRead = undefined;
      this.adoptMiss = undefined;
      kept = true;
      return { mode: 'adopt', ports: d.changed, writes: writes.entries, calls: writes.calls };
    } catch (err) {
      return this.miss(errorMessage(err));
    } finally {
      if (!kept) {
        closeFd(prog);
        for (const fd of Object.values(maps)) closeFd(fd);
      }
    }
  }

  private miss(why: string): undefined {
    this.adoptMiss = why;
    return undefined;
  }

  /** What a record must name to hold for `l`: the program's and maps' ids, the object file, the settings, the CPUs. */
  private identity(l: Loaded): Record<string, unknown> {
    this.objectSha ??= createHash('sha256').update(fs.readFileSync(this.objectPath)).digest('hex');
    const ids = Object.fromEntries(RECORDED_MAPS.map((name) => [name, this.bpf.bpfMapInfo(l.maps[name]!).id]));
    return { prog: this.bpf.bpfProgInfo(l.prog).id, maps: ids, object: this.objectSha, settings: this.settings, cpus: this.cpus };
  }

  /** The record pinned beside the maps, or undefined (none, or unreadable). */
  private readRecord(): NatRecord | undefined {
    let fd: number | undefined;
    try {
      fd = this.bpf.bpfObjGet(path.join(this.pinDir, RECORD_PIN));
      const info = this.bpf.bpfMapInfo(fd);
      if (info.valueSize !== RECORD_CHUNK) return undefined;
      const blob = readArrayBatch(this.bpf, fd, info.maxEntries, RECORD_CHUNK, { unsupported: this.batchProblem }).values;
      const record = JSON.parse(blob.subarray(4, 4 + blob.readUInt32LE(0)).toString('utf8')) as NatRecord;
      return record.version === 1 ? record : undefined;
    } catch {
      return undefined;
    } finally {
      closeFd(fd);
    }
  }

  /**
   * The record of maps written in place, kept RECORD_DELAY_MS after the
   * first write of a burst: its text joins every port's (natRecordText),
   * about a millisecond at 1,000 services, which a burst of transitions
   * pays once rather than at each. Until then there is
   * no record, and a process that dies meanwhile is followed by a whole
   * load; a planned stop (release) keeps it at once.
   */
  private keepRecordSoon(l: Loaded): void {
    this.recordDue = l;
    if (this.recordTimer !== undefined) return;
    this.recordTimer = setTimeout(() => {
      this.recordTimer = undefined;
      this.flushRecord();
    }, RECORD_DELAY_MS);
    this.recordTimer.unref();
  }

  /** Keep the record now if one is due for the current maps. */
  private flushRecord(): void {
    if (this.recordTimer !== undefined) clearTimeout(this.recordTimer);
    this.recordTimer = undefined;
    const due = this.recordDue;
    this.recordDue = undefined;
    if (due !== undefined && due === this.current) this.keepRecord(due, false);
  }

  /** The record removed before the maps are written: a process that stops mid-way leaves none, and the next loads whole. */
  private forgetRecord(): void {
    try { fs.unlinkSync(path.join(this.pinDir, RECORD_PIN)); } catch { /* none */ }
  }

  /**
   * The per-plan maps pinned (plan_<name>) and the record of what they hold
   * pinned beside them, each by a rename (never half there). The record's
   * map is this engine's own, kept open and written again for the next
   * record while it has room (a map created per record cost more than the
   * record's write); its pin goes first, so while it is written no record
   * is there to be read, and a failure leaves none: the next process loads
   * whole. The text is natRecordText's: only the ports changed since the
   * last record are encoded.
   */
  private keepRecord(l: Loaded, pinMaps = true): void {
    try {
      this.forgetRecord();
      // Maps written in place are the ones already pinned.
      if (pinMaps) for (const name of RECORDED_MAPS) this.pinAt(l.maps[name]!, `plan_${name}`);
      const text = natRecordText(l.contents, this.identity(l));
      const length = Buffer.byteLength(text, 'utf8');
      const chunks = Math.ceil((length + 4) / RECORD_CHUNK);
      let rec = this.recordMap;
      if (rec === undefined || rec.chunks < chunks) {
        this.closeRecordMap();
        // Room to grow by a quarter before another map is needed.
        const room = chunks + Math.ceil(chunks / 4);
        rec = this.recordMap = { fd: this.bpf.bpfMapCreate(2 /* BPF_MAP_TYPE_ARRAY */, 4, RECORD_CHUNK, room, 'lbn_record'), chunks: room };
      }
      // The chunks' bytes are made for this write and dropped after it: kept,
      // they would be a second copy of what the map holds (half a MiB at a
      // thousand ports). Zeroed, so the last chunk's tail carries no old text.
      const blob = Buffer.alloc(chunks * RECORD_CHUNK);
      blob.writeUInt32LE(length, 0);
      blob.write(text, 4, 'utf8');
      // The chunks past the text's are not read (the length says where it ends).
      // A writer sized for these chunks: its default batch (MAP_BATCH_ENTRIES values) would be 256 MiB of 64 KiB values.
      const w = new MapBatchWriter(this.bpf, { unsupported: this.batchProblem, chunk: chunks });
      for (let i = 0; i < chunks; i++) w.put(rec.fd, u32(i), blob.subarray(i * RECORD_CHUNK, (i + 1) * RECORD_CHUNK));
      w.flush();
      this.pinAt(rec.fd, RECORD_PIN);
    } catch {
      this.forgetRecord();
      this.closeRecordMap();
    }
  }

  private closeRecordMap(): void {
    closeFd(this.recordMap?.fd);
    this.recordMap = undefined;
  }

  /** Pin `fd` at `name` in place of the previous pin, by a rename (the pin is never missing; bpffs refuses a dot in a name). */
  private pinAt(fd: number, name: string): void {
    const tmp = path.join(this.pinDir, `${name}_new`);
    try { fs.unlinkSync(tmp); } catch { /* none */ }
    this.bpf.bpfObjPin(fd, tmp);
    fs.renameSync(tmp, path.join(this.pinDir, name));
  }

  /** Add the current program's counters to the carried totals (its maps go with it). */
  private carryCounters(): void {
    for (const [k, v] of this.readCounters()) this.carried.set(k, v);
  }

  /** One counter index summed over the CPUs, or undefined when the map has no such index. */
  private readCounter(fd: number, index: number): NatCounter | undefined {
    const size = this.layout.size('lbn_counter');
    const buf = this.counterBuf ??= Buffer.alloc(size * this.cpus);
    if (!this.bpf.bpfMapLookup(fd, u32(index), buf)) return undefined;
    return this.sumCounter(buf, 0);
  }

  /** The offsets of NAT_COUNTER_FIELDS in lbn_counter (nat.h). */
  private offsets(): Uint32Array {
    return this.counterOffsets ??= Uint32Array.from(NAT_COUNTER_FIELDS, (f) => this.layout.struct('lbn_counter').fields.find((x) => x.name === f)!.offset);
  }

  /** The per-CPU value of one counter at `at` in `buf`, summed over the CPUs. */
  private sumCounter(buf: Buffer, at: number): NatCounter {
    const out = new Float64Array(NAT_COUNTER_WIDTH);
    sumPerCpu(this.bpf, buf.subarray(at), 1, this.layout.size('lbn_counter'), this.cpus, this.offsets(), out);
    return counterAt(out, 0);
  }

  /**
   * The carried totals by counter index of the plan in force: made again
   * only when the plan's contents or the carried totals changed (a
   * retirement, a program replaced), never per read.
   */
  private carriedByIndex(contents: NatMaps, count: number): Float64Array | undefined {
    if (this.carried.size === 0) return undefined;
    const c = this.carriedAt;
    if (c !== undefined && c.contents === contents && c.version === this.carried.version && c.at.length >= count * NAT_COUNTER_WIDTH) return c.at;
    const at = new Float64Array(count * NAT_COUNTER_WIDTH);
    for (const placed of contents.ports.values()) {
      const p = placed.plan;
      const port = `${p.port.protocol}/${p.port.port}`;
      p.backends.forEach((b, i) => {
        const v = this.carried.get(natCounterKey(p.service, port, b));
        const idx = placed.counters[i]!;
        if (v === undefined || idx >= count) return;
        const o = idx * NAT_COUNTER_WIDTH;
        at[o + NAT_PACKETS_TO_BACKEND]! += v.packetsToBackend;
        at[o + NAT_BYTES_TO_BACKEND]! += v.bytesToBackend;
        at[o + NAT_PACKETS_TO_CLIENT]! += v.packetsToClient;
        at[o + NAT_BYTES_TO_CLIENT]! += v.bytesToClient;
        at[o + NAT_FLOWS]! += v.flows;
      });
    }
    this.carriedAt = { contents, version: this.carried.version, at };
    return at;
  }

  /**
   * The current program's counters, every index in use (0 .. the next one
   * never used), read in one pass over the per-CPU array, a few thousand
   * indices a bpf(2) call (readArrayBatch), summed over the CPUs by the
   * addon in one call, with the carried totals added by index.
   */
  private readTotals(): NatCounterTotals {
    const l = this.current;
    const fd = l?.maps['lbn_counters'];
    if (!l || fd === undefined) return NO_TOTALS;
    const contents = l.contents;
    const size = this.layout.size('lbn_counter');
    const count = Math.min(contents.nextCounter, contents.capacity.counters);
    const read = readArrayBatch(this.bpf, fd, count, size * this.cpus, { unsupported: this.batchProblem, into: this.readBuf });
    if (read.unsupported !== undefined) this.batchProblem ??= read.unsupported;
    this.counterCalls = read.calls;
    if (read.values.buffer !== this.readBuf?.buffer) this.readBuf = read.values;
    const n = count * NAT_COUNTER_WIDTH;
    // A plan of no counters yet (an engine with no port) reads as empty totals.
    if (this.totalsBuf === undefined || this.totalsBuf.length < n) this.totalsBuf = new Float64Array(n);
    const totals = this.totalsBuf.subarray(0, n);
    sumPerCpu(this.bpf, read.values, count, size, this.cpus, this.offsets(), totals);
    const carried = this.carriedByIndex(contents, count);
    if (carried !== undefined) for (let k = 0; k < n; k++) totals[k]! += carried[k]!;
    return { totals, indices: (id) => contents.ports.get(id)?.counters };
  }

  /**
   * The carried totals plus the current program's counters, by
   * natCounterKey (a retired counter's totals kept under its key).
   */
  private readCounters(): Map<string, NatCounter> {
    return this.countersOf(this.readTotals());
  }

  private countersOf(t: NatCounterTotals): Map<string, NatCounter> {
    const out = new Map<string, NatCounter>(this.carried);
    const l = this.current;
    if (!l || t === NO_TOTALS) return out;
    for (const placed of l.contents.ports.values()) {
      const p = placed.plan;
      const port = `${p.port.protocol}/${p.port.port}`;
      p.backends.forEach((b, i) => {
        const idx = placed.counters[i]!;
        if ((idx + 1) * NAT_COUNTER_WIDTH <= t.totals.length) out.set(natCounterKey(p.service, port, b), counterAt(t.totals, idx));
      });
    }
    return out;
  }

  /**
   * The counters by counter index (NatCounterTotals), since this process
   * started the engine. One read of the maps serves the callers of one
   * turn of the event loop (a scrape's series, which prom-client collects
   * in one turn, all from one snapshot) and none after it or after a
   * write: a read taken before traffic never answers for it. Scrapes back
   * to back are held off above (the metrics server reuses a gather).
   */
  totals(): NatCounterTotals {
    if (this.countersRead) return this.countersRead;
    const t = this.readTotals();
    this.countersRead = t;
    queueMicrotask(() => {
      if (this.countersRead === t) this.countersRead = undefined;
    });
    return t;
  }

  /**
   * Per (service, protocol/port, backend) totals since this process started
   * the engine (natCounterKey), a retired counter's included: totals() as a
   * map (an object and a key per counter: for status and tools, not for a
   * scrape).
   */
  counters(): Map<string, NatCounter> {
    return this.countersOf(this.totals());
  }

  /**
   * The engine-wide events (pinned: since the maps were created, across
   * restarts). `withEvictions` (a walk of both flow maps) adds `evicted`:
   * an LRU map drops an entry silently, but the program never deletes one
   * and counts every key it adds, so the keys added (read first) less the
   * keys there now (counted after) are the ones the kernel evicted. A flow
   * map created anew (its pin removed, or of another layout) starts its
   * count again at the load that creates it. Exact but for keys added
   * during the walk (the count then reads low for that scrape) and two
   * CPUs adding one key at once; never reported lower than before (a
   * counter).
   */
  events(withEvictions = false): Record<NatEvent, number> {
    const out = { new: 0, midflow: 0, expired: 0, replaced: 0, portsExhausted: 0, noRoute: 0, icmpError: 0, ipv6ExtHeader: 0 } as Record<NatEvent, number>;
    const fd = this.current?.maps['lbn_events'];
    if (fd === undefined) return out;
    const buf = Buffer.alloc(8 * this.cpus);
    const read = (name: string): number | undefined => {
      if (!this.bpf.bpfMapLookup(fd, u32(this.layout.constant(name)), buf)) return undefined;
      let n = 0;
      for (let c = 0; c < this.cpus; c++) n += Number(buf.readBigUInt64LE(c * 8));
      return n;
    };
    for (const e of EVENTS) {
      const n = read(e);
      if (n !== undefined) out[EVENT_NAMES[e]] = n;
    }
    if (withEvictions) {
      const added = Object.fromEntries(FLOW_MAPS.map((m) => [m, read(INSERT_EVENT[m]) ?? 0]));
      const fill = this.fill();
      const now: Record<string, number> = { lbn_flows: fill.flows, lbn_replies: fill.replies, lbn_flows6: fill.flows6, lbn_replies6: fill.replies6 };
      const lost = FLOW_MAPS.reduce((sum, m) => sum + Math.max(0, added[m]! - now[m]!), 0);
      this.evicted = Math.max(this.evicted, this.evictedBase + lost);
      out.evicted = this.evicted;
    }
    return out;
  }

  /** Entries in the flow maps now (client side, backend side; IPv4, and IPv6 apart) and their capacity (each map's). */
  fill(): { flows: number; replies: number; flows6: number; replies6: number; capacity: number } {
    const l = this.current;
    const count = (name: string): number => {
      const fd = l?.maps[name];
      return fd === undefined ? 0 : this.bpf.bpfMapCount(fd, this.layout.size(FLOW6_MAPS.includes(name) ? 'lbn_flow_key6' : 'lbn_flow_key'));
    };
    return { flows: count('lbn_flows'), replies: count('lbn_replies'), flows6: count('lbn_flows6'), replies6: count('lbn_replies6'), capacity: this.settings.flowEntries };
  }

  /** Whether the pinned IPv6 flow maps are there at their full size (kept so by a load whose plan has no IPv6 port). */
  private flows6Sized(): boolean {
    let fd: number | undefined;
    try {
      fd = this.bpf.bpfObjGet(path.join(this.pinDir, 'lbn_flows6'));
      return this.bpf.bpfMapInfo(fd).maxEntries === this.settings.flowEntries;
    } catch {
      return false;
    } finally {
      closeFd(fd);
    }
  }

  /**
   * Detach ours (this process's, the pinned one, and any other of ours at
   * the hook that can be opened by id) and remove the pins: nothing of the
   * engine is left. Returns how many programs were detached.
   */
  detach(): number {
    // Nothing is left to record: the pins go.
    this.recordDue = undefined;
    let ifindex: number | undefined;
    try { ifindex = ifNameToIndex(this.device); } catch { /* the device is gone, and with it the attachment */ }
    const pinned = this.pinnedProg();
    let detached = 0;
    const off = (fd: number | undefined): void => {
      if (fd === undefined || ifindex === undefined) return;
      try { this.bpf.bpfProgDetach(ifindex, fd, BPF_TCX_INGRESS); detached++; } catch (err) { if (!isGone(err)) throw err; }
    };
    off(this.current?.prog);
    off(pinned);
    closeFd(pinned);
    for (let i = 0; ifindex !== undefined && i < 16; i++) {
      const fd = this.attachedUnpinned(ifindex);
      if (fd === undefined) break;
      try { off(fd); } finally { closeFd(fd); }
    }
    for (const name of [PROG_PIN, ...PINNED_MAPS, RECORD_PIN, ...RECORDED_MAPS.map((m) => `plan_${m}`)]) {
      try { fs.unlinkSync(path.join(this.pinDir, name)); } catch { /* not there */ }
    }
    try { fs.rmdirSync(this.pinDir); } catch { /* not empty (not ours), or gone */ }
    this.release();
    return detached;
  }

  /** Let go of the descriptors and leave the program attached (a planned restart: the next process replaces it by its pin). */
  release(): void {
    this.flushRecord();
    this.closeRecordMap();
    closeLoaded(this.current);
    this.current = undefined;
    this.countersRead = undefined;
  }

  get active(): boolean {
    return this.current !== undefined;
  }

  /**
   * What someone else undid of the attached engine, or undefined: its program
   * detached from tcx ingress (bpftool net detach, another program's
   * detach), its pin or a pinned flow map removed. apply() with the same plan
   * repairs all of it (a removed flow map is created anew; its flows are
   * picked up mid-way).
   */
  drift(): string | undefined {
    const l = this.current;
    if (!l) return undefined;
    for (const name of [PROG_PIN, ...PINNED_MAPS]) {
      if (!fs.existsSync(path.join(this.pinDir, name))) return `${path.join(this.pinDir, name)} is gone`;
    }
    let ifindex: number;
    try { ifindex = ifNameToIndex(this.device); } catch { return `${this.device} is gone`; }
    const id = this.bpf.bpfProgInfo(l.prog).id;
    if (!this.bpf.bpfProgQuery(ifindex, BPF_TCX_INGRESS).includes(id)) return `the program is not attached at tcx ingress of ${this.device}`;
    return undefined;
  }

  /** The plan in force (drift repair applies it again). */
  get plan(): NatPlan | undefined {
    return this.current?.contents.plan;
  }
}

/** The NAT_COUNTER_WIDTH numbers of counter index `idx` as a NatCounter. */
function counterAt(t: Float64Array, idx: number): NatCounter {
  const o = idx * NAT_COUNTER_WIDTH;
  return {
    packetsToBackend: t[o + NAT_PACKETS_TO_BACKEND]!, bytesToBackend: t[o + NAT_BYTES_TO_BACKEND]!,
    packetsToClient: t[o + NAT_PACKETS_TO_CLIENT]!, bytesToClient: t[o + NAT_BYTES_TO_CLIENT]!, flows: t[o + NAT_FLOWS]!,
  };
}

function addCounters(a: NatCounter | undefined, b: NatCounter): NatCounter {
  return a ? {
    packetsToBackend: a.packetsToBackend + b.packetsToBackend, bytesToBackend: a.bytesToBackend + b.bytesToBackend,
    packetsToClient: a.packetsToClient + b.packetsToClient, bytesToClient: a.bytesToClient + b.bytesToClient, flows: a.flows + b.flows,
  } : b;
}

/** The key of one counter: service, "TCP/80", backend. */
export function natCounterKey(service: string, port: string, backend: string): string {
  return `${service}\u0000${port}\u0000${backend}`;
}

/** Does the kernel take the engine's batch map calls? Why not, or undefined (net/ebpf/map-batch.ts probeMapBatch). */
export function probeNatBatch(bpf: NativeBpfObject | string = nativeBpfObject()): string | undefined {
  if (typeof bpf === 'string') return bpf;
  return probeMapBatch(bpf, closeFd);
}

/**
 * Can this node run the engine? Loads the object with a one-port plan into a
 * pin directory of its own and attaches it at tcx ingress of `device` (a
 * throwaway namespace's lo, as the DSR probe does), then removes all of it.
 * `beside`, run while the probe's program is attached there, attaches
 * another program of ours at the same hook (the DSR program's probe, where
 * the config forwards DSR ports) and returns why it could not. Returns why
 * not, or undefined. The start-up probe and `lb-agent check` use it.
 */
export function probeNatHere(opts: { device?: string; pinDir: string; bpf?: NativeBpfObject | string; objectPath?: string; beside?: (device: string) => string | undefined }): string | undefined {
  const bpf = opts.bpf ?? nativeBpfObject();
  if (typeof bpf === 'string') return bpf;
  const objectPath = opts.objectPath ?? bpfObjectPath(NAT_OBJECT);
  if (!fs.existsSync(objectPath)) return `${objectPath} is not built (clang and libbpf-dev are needed when the addon is built: scripts/setup.sh, then npm ci)`;
  let engine: NatEngine | undefined;
  try {
    engine = new NatEngine({ device: opts.device ?? 'lo', pinDir: opts.pinDir, bpf, objectPath, settings: { ...NAT_DEFAULTS, flowEntries: 16 } });
    engine.apply(EMPTY_NAT_PLAN);
    return opts.beside?.(engine.device);
  } catch (err) {
    return errorMessage(err);
  } finally {
    try { engine?.detach(); } catch { /* best effort */ }
  }
}
