// The thin driver of the DSR program at tc ingress: creates its
// maps, loads it (ebpf-dsr.ts builds it), attaches it with tcx to the parent
// NIC's ingress, swaps it atomically for the next plan (BPF_F_REPLACE), reads
// its counters, and detaches it. It owns exactly the tcx attachments named
// DSR_PROG_NAME on its device: a program another tool attached there is
// never touched.
//
// Lifetime: a tcx attachment made without a link descriptor stays until it
// is detached (it holds the program, the program holds its maps), like the
// nft table: a restart or a crash does not stop forwarding, and the next
// process finds ours by name (BPF_PROG_QUERY, then each id's name) and
// replaces it in one step. The flow map (per-flow state) is the one map that
// outlives a plan: every program this process loads uses the same one, and a
// later process adopts it from the program it replaces (by its id, name and
// layout), so neither a reload nor a restart forgets where a flow went.
import * as fs from 'node:fs';
import { LbError, errorMessage } from '../../errors';
import {
  BACKEND6_KEY_SIZE, BACKEND_KEY_SIZE, BPF_F_REPLACE, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_PROG_TYPE_SCHED_CLS, BPF_TCX_INGRESS,
  COUNTER_VALUE_SIZE, DSR_FLOW6_MAP_NAME, DSR_FLOW_ENTRIES, DSR_FLOW_MAP_NAME, DSR_PROG_NAME, FLOW6_KEY_SIZE, FLOW6_VALUE_SIZE, FLOW_KEY_SIZE, FLOW_VALUE_SIZE,
  SLOT6_VALUE_SIZE, SLOT_VALUE_SIZE, dsrMaps, dsrPortFamily, dsrProgram, type DsrBpfPort,
} from './ebpf-dsr';
import { ifNameToIndex, nativeBpf, type BpfMapInfo, type NativeBpf } from '../../native/native';

/** Packets and bytes of one nft counter name, as the program counted them. */
export interface BpfCounter { readonly packets: number; readonly bytes: number }

interface Loaded {
  readonly prog: number;
  readonly slots: number;
  readonly counters: number;
  readonly backends: number;
  /** The IPv6 slot and backend maps, when the plan has an IPv6 port. */
  readonly slots6: number | undefined;
  readonly backends6: number | undefined;
  readonly names: readonly { readonly conns: string; readonly toBackend: string }[];
}

const VERIFIER_LOG = 1 << 20;

function closeFd(fd: number | undefined): void {
  if (fd === undefined) return;
  try { fs.closeSync(fd); } catch { /* already closed */ }
}

/** A bpf(2) call failed because the program or attachment is no longer there. */
const isGone = (err: unknown): boolean => (err as { code?: string }).code === 'ENOENT';

function key(k: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(k);
  return b;
}

/**
 * A new, empty flow map (ebpf-dsr.ts: per-flow state). The kernel
 * preallocates an LRU map: 18-51 ms for the full size here (once per
 * process, at its first DSR apply); the probe asks for a small one, which
 * shows the same thing (that the kernel and the capabilities allow it).
 */
/** A flow map's layout per family: IPv4's, or IPv6's (ebpf-dsr.ts). */
const FLOW_LAYOUT = {
  4: { name: DSR_FLOW_MAP_NAME, keySize: FLOW_KEY_SIZE, valueSize: FLOW_VALUE_SIZE },
  6: { name: DSR_FLOW6_MAP_NAME, keySize: FLOW6_KEY_SIZE, valueSize: FLOW6_VALUE_SIZE },
} as const;

function createFlowMap(bpf: NativeBpf, entries = DSR_FLOW_ENTRIES, family: 4 | 6 = 4): number {
  const l = FLOW_LAYOUT[family];
  try {
    return bpf.bpfMapCreate(BPF_MAP_TYPE_LRU_HASH, l.keySize, l.valueSize, entries, l.name);
  } catch (err) {
    throw new LbError('LB_ERR_FORWARD_DSR_BPF', `cannot create the DSR ${family === 4 ? 'IPv4' : 'IPv6'} flow map (an LRU hash of ${entries} entries): ${errorMessage(err)}`, undefined, { cause: err });
  }
}

/** Whether a map is a flow map of this build's layout for `family`. */
function isFlowMap(m: BpfMapInfo, family: 4 | 6 = 4): boolean {
  const l = FLOW_LAYOUT[family];
  return m.name === l.name && m.type === BPF_MAP_TYPE_LRU_HASH && m.keySize === l.keySize && m.valueSize === l.valueSize
    && m.maxEntries === DSR_FLOW_ENTRIES;
}

/**
 * The flow map of `family` behind the program of ours attached now (an
 * earlier process's), if it has the layout this build uses: a restart keeps
 * the flows it placed. Undefined when there is none to adopt.
 */
function adoptFlowMap(bpf: NativeBpf, progIds: readonly number[], family: 4 | 6 = 4): number | undefined {
  for (const id of progIds) {
    let prog: number | undefined;
    try {
      prog = bpf.bpfProgGetFdById(id);
      for (const mapId of bpf.bpfProgInfo(prog).mapIds) {
        const fd = bpf.bpfMapGetFdById(mapId);
        if (isFlowMap(bpf.bpfMapInfo(fd), family)) return fd;
        closeFd(fd);
      }
    } catch { /* gone meanwhile: nothing to adopt */ } finally { closeFd(prog); }
  }
  return undefined;
}

/**
 * Create the plan's maps, fill them, load the program on `flows` (and
 * `flows6`, needed when the plan has an IPv6 port); nothing left open on
 * failure.
 */
function load(bpf: NativeBpf, ports: readonly DsrBpfPort[], flows: number, flows6?: number): Loaded {
  let slots: number | undefined;
  let counters: number | undefined;
  let backends: number | undefined;
  let slots6: number | undefined;
  let backends6: number | undefined;
  try {
    const maps = dsrMaps(ports);
    slots = bpf.bpfMapCreate(BPF_MAP_TYPE_ARRAY, 4, SLOT_VALUE_SIZE, Math.max(1, maps.slots.length), 'lb_dsr_slots');
    counters = bpf.bpfMapCreate(BPF_MAP_TYPE_ARRAY, 4, COUNTER_VALUE_SIZE, Math.max(1, maps.counters.length), 'lb_dsr_counters');
    backends = bpf.bpfMapCreate(BPF_MAP_TYPE_HASH, BACKEND_KEY_SIZE, SLOT_VALUE_SIZE, Math.max(1, maps.backends.length), 'lb_dsr_backends');
    maps.slots.forEach((v, k) => bpf.bpfMapUpdate(slots!, key(k), v, 0));
    for (const b of maps.backends) bpf.bpfMapUpdate(backends, b.key, b.value, 0);
    if (maps.slots6.length > 0) {
      slots6 = bpf.bpfMapCreate(BPF_MAP_TYPE_ARRAY, 4, SLOT6_VALUE_SIZE, maps.slots6.length, 'lb_dsr_slots6');
      backends6 = bpf.bpfMapCreate(BPF_MAP_TYPE_HASH, BACKEND6_KEY_SIZE, SLOT6_VALUE_SIZE, maps.backends6.length, 'lb_dsr_backends6');
      maps.slots6.forEach((v, k) => bpf.bpfMapUpdate(slots6!, key(k), v, 0));
      for (const b of maps.backends6) bpf.bpfMapUpdate(backends6, b.key, b.value, 0);
    }
    const insns = dsrProgram(ports, { slots, counters, flows, backends, slots6, flows6, backends6 });
    const prog = bpf.bpfProgLoad(BPF_PROG_TYPE_SCHED_CLS, insns, 'GPL', DSR_PROG_NAME, VERIFIER_LOG);
    return { prog, slots, counters, backends, slots6, backends6, names: maps.counters };
  } catch (err) {
    closeFd(slots);
    closeFd(counters);
    closeFd(backends);
    closeFd(slots6);
    closeFd(backends6);
    const log = (err as { log?: unknown }).log;
    throw new LbError('LB_ERR_FORWARD_DSR_BPF', `cannot load the DSR program: ${errorMessage(err)}${typeof log === 'string' && log !== '' ? `; verifier: ${log.trim().split('\n').slice(-3).join(' | ')}` : ''}`,
      undefined, { cause: err });
  }
}

function closeLoaded(l: Loaded | undefined): void {
  if (!l) return;
  closeFd(l.prog);
  closeFd(l.slots);
  closeFd(l.counters);
  closeFd(l.backends);
  closeFd(l.slots6);
  closeFd(l.backends6);
}

/**
 * The programs attached at tcx ingress of `ifindex`: the ids of ours
 * (recognised by name), and how many this process may not open by id
 * (BPF_PROG_GET_FD_BY_ID needs CAP_SYS_ADMIN, which the unit does not grant:
 * there the daemon knows its programs by the descriptors it holds or was
 * handed, not by id).
 */
export function dsrProgramsAt(bpf: NativeBpf, ifindex: number): { ours: number[]; unreadable: number } {
  const ours: number[] = [];
  let unreadable = 0;
  for (const id of bpf.bpfProgQuery(ifindex, BPF_TCX_INGRESS)) {
    if (otherOwnPrograms.has(id)) continue;
    let fd: number | undefined;
    try {
      fd = bpf.bpfProgGetFdById(id);
      if (bpf.bpfProgInfo(fd).name === DSR_PROG_NAME) ours.push(id);
    } catch (err) {
      if ((err as { code?: string }).code === 'EPERM') unreadable++; // else gone meanwhile
    } finally { closeFd(fd); }
  }
  return { ours, unreadable };
}

/**
 * The ids of the agent's other programs at the same hook (the eBPF NAT
 * engine's, net/ebpf/nat-attach.ts, which registers its own and the one
 * it inherits by its pin): known to be no DSR program without opening them
 * by id, which needs CAP_SYS_ADMIN.
 */
export const otherOwnPrograms = new Set<number>();

/** The ids of our programs attached at tcx ingress of `ifindex` (recognised by name; needs CAP_SYS_ADMIN, see dsrProgramsAt). */
export function attachedDsrPrograms(bpf: NativeBpf, ifindex: number): number[] {
  return dsrProgramsAt(bpf, ifindex).ours;
}

/**
 * Where the program and the flow map are kept across a restart: systemd's
 * file descriptor store under the unit (forward/dataplane.ts ListenerStore;
 * the same store keeps the proxy's listening sockets). Without CAP_SYS_ADMIN
 * a new process cannot open an earlier process's program by id, so the
 * descriptors handed back are how it finds the one to replace.
 */
export interface DsrFdStore {
  take(id: string): number | undefined;
  keep(id: string, fd: number): void;
  drop(id: string): void;
}

export interface DsrBpfOptions {
  readonly device: string;
  /** The addon's bpf(2) calls (tests may pass their own); default: the addon's. */
  readonly bpf?: NativeBpf;
  /** Keeps the program's and the flow map's descriptors for the next process (systemd's fd store). */
  readonly store?: DsrFdStore | undefined;
}

/** What an apply replaced, and how many programs at the hook this process could not open by id. */
export interface DsrApplied {
  /** this process's program, one the store handed back, one of ours found by id, or none (attached as the first). */
  readonly replaced: 'own' | 'handed-over' | 'by-id' | 'none';
  readonly unreadable: number;
}

/** The store's ids for a device's program and flow map. */
export const dsrStoreIds = (device: string): { prog: string; flows: string; flows6: string } => ({ prog: `dsr-prog-${device}`, flows: `dsr-flows-${device}`, flows6: `dsr-flows6-${device}` });

/** Our DSR program on one device. Not re-entrant: the data path calls it from its serial queue. */
export class DsrBpf {
  readonly device: string;
  private readonly bpf: NativeBpf;
  private readonly store: DsrFdStore | undefined;
  private readonly ids: { prog: string; flows: string; flows6: string };
  private current: Loaded | undefined;
  /** The flow map every program of this process uses (adopted from an earlier process's, or new). */
  private flows: number | undefined;
  /** The same for IPv6 flows: made (or adopted) at the first plan with an IPv6 port. */
  private flows6: number | undefined;
  /** An earlier process's program, handed back by the store, until this process replaces or detaches it. */
  private inheritedProg: number | undefined;
  private tookStore = false;

  constructor(opts: DsrBpfOptions) {
    this.device = opts.device;
    const bpf = opts.bpf ?? nativeBpf();
    if (typeof bpf === 'string') throw new LbError('LB_ERR_FORWARD_DSR_BPF', bpf);
    this.bpf = bpf;
    this.store = opts.store;
    this.ids = dsrStoreIds(opts.device);
  }

  /** Once: what the store handed back, if it is ours (the program by name, the flow map by name and layout). */
  private takeFromStore(): void {
    if (this.tookStore || !this.store) return;
    this.tookStore = true;
    const prog = this.store.take(this.ids.prog);
    if (prog !== undefined) {
      let ok = false;
      try { ok = this.bpf.bpfProgInfo(prog).name === DSR_PROG_NAME; } catch { /* not a program */ }
      if (ok) this.inheritedProg = prog;
      else { closeFd(prog); this.store.drop(this.ids.prog); }
    }
    for (const family of [4, 6] as const) {
      const id = family === 4 ? this.ids.flows : this.ids.flows6;
      const flows = this.store.take(id);
      if (flows === undefined) continue;
      let ok = false;
      try { ok = isFlowMap(this.bpf.bpfMapInfo(flows), family); } catch { /* not a map */ }
      if (ok && family === 4 && this.flows === undefined) this.flows = flows;
      else if (ok && family === 6 && this.flows6 === undefined) this.flows6 = flows;
      else { closeFd(flows); this.store.drop(id); }
    }
  }

  private ifindex(): number {
    return ifNameToIndex(this.device);
  }

  /** Whether a program of ours is attached to the device now (ours or an earlier process's). */
  attached(): number[] {
    return attachedDsrPrograms(this.bpf, this.ifindex());
  }

  /**
   * Load the program for `ports` and put it in place of ours (this process's
   * or an earlier one's) in one step; the first one is appended. Throws with
   * nothing changed when the new one cannot be loaded or attached.
   */
  apply(ports: readonly DsrBpfPort[]): DsrApplied {
    const ifindex = this.ifindex();
    this.takeFromStore();
    const seen = dsrProgramsAt(this.bpf, ifindex);
    let flows = this.flows;
    const fresh = flows === undefined;
    if (flows === undefined) flows = adoptFlowMap(this.bpf, seen.ours) ?? createFlowMap(this.bpf);
    let flows6 = this.flows6;
    let fresh6 = false;
    let next: Loaded;
    try {
      if (flows6 === undefined && ports.some((p) => dsrPortFamily(p) === 6)) {
        fresh6 = true;
        flows6 = adoptFlowMap(this.bpf, seen.ours, 6) ?? createFlowMap(this.bpf, DSR_FLOW_ENTRIES, 6);
      }
      next = load(this.bpf, ports, flows, flows6);
    } catch (err) {
      if (fresh) closeFd(flows);
      if (fresh6) closeFd(flows6);
      throw err instanceof LbError ? err : new LbError('LB_ERR_FORWARD_DSR_BPF', `cannot load the DSR program: ${errorMessage(err)}`, undefined, { cause: err });
    }
    let replaced: DsrApplied['replaced'] = 'none';
    try {
      // The one to replace: this process's program, else the one an earlier
      // process handed over, else the first of ours found by id.
      let byId: number | undefined;
      try {
        let replaceFd = this.current?.prog ?? this.inheritedProg;
        replaced = this.current ? 'own' : this.inheritedProg !== undefined ? 'handed-over' : 'none';
        if (replaceFd === undefined && seen.ours.length > 0) { replaceFd = byId = this.bpf.bpfProgGetFdById(seen.ours[0]!); replaced = 'by-id'; }
        let replacedId: number | undefined;
        if (replaceFd !== undefined) {
          try {
            replacedId = this.bpf.bpfProgInfo(replaceFd).id;
            this.bpf.bpfProgAttach(ifindex, next.prog, BPF_TCX_INGRESS, BPF_F_REPLACE, replaceFd);
          } catch (err) {
            // Detached meanwhile (e.g. `lb-agent withdraw` by hand): attach as the first one, below.
            if (!isGone(err)) throw err;
            replacedId = undefined;
            replaced = 'none';
          }
        }
        if (replaced === 'none') this.bpf.bpfProgAttach(ifindex, next.prog, BPF_TCX_INGRESS, 0, 0);
        // More than one of ours (not expected: two agents on one device) would forward twice over: keep the new one only.
        for (const id of seen.ours) if (id !== replacedId) this.detachId(ifindex, id);
      } finally {
        closeFd(byId);
      }
    } catch (err) {
      closeLoaded(next);
      if (fresh) closeFd(flows);
      if (fresh6) closeFd(flows6);
      throw new LbError('LB_ERR_FORWARD_DSR_BPF', `cannot attach the DSR program at tcx ingress of ${this.device}: ${errorMessage(err)}`, undefined, { cause: err });
    }
    closeLoaded(this.current);
    closeFd(this.inheritedProg);
    this.inheritedProg = undefined;
    this.current = next;
    this.flows = flows;
    this.flows6 = flows6;
    if (this.store) {
      // The store holds copies: drop the replaced program's, keep the new one's (and each flow map, once).
      this.store.drop(this.ids.prog);
      this.store.keep(this.ids.prog, next.prog);
      if (fresh) this.store.keep(this.ids.flows, flows);
      if (fresh6 && flows6 !== undefined) this.store.keep(this.ids.flows6, flows6);
    }
    return { replaced, unreadable: seen.unreadable };
  }

  /** Detach the program behind `fd`; one already gone is no error. */
  private detachFd(ifindex: number, fd: number): void {
    try {
      this.bpf.bpfProgDetach(ifindex, fd, BPF_TCX_INGRESS);
    } catch (err) {
      if (!isGone(err)) throw err;
    }
  }

  private detachId(ifindex: number, id: number): void {
    let fd: number | undefined;
    try {
      fd = this.bpf.bpfProgGetFdById(id);
      this.detachFd(ifindex, fd);
    } catch (err) {
      if (!isGone(err)) throw err;
    } finally {
      closeFd(fd);
    }
  }

  /** Detach every program of ours from the device (this process's, one handed over, and any found by id). */
  detach(): void {
    let ifindex: number;
    try { ifindex = this.ifindex(); } catch { this.forget(); return; /* the device is gone, and with it the attachment */ }
    this.takeFromStore();
    for (const fd of [this.current?.prog, this.inheritedProg]) if (fd !== undefined) this.detachFd(ifindex, fd);
    for (const id of dsrProgramsAt(this.bpf, ifindex).ours) this.detachId(ifindex, id);
    this.forget();
  }

  /** Detached for good: nothing for a next process to take over. */
  private forget(): void {
    this.release();
    if (this.store) {
      this.store.drop(this.ids.prog);
      this.store.drop(this.ids.flows);
      this.store.drop(this.ids.flows6);
    }
  }

  /** Let go of the descriptors and leave the attachment in place (a planned restart: the next process replaces it; the store keeps its copies). */
  release(): void {
    closeLoaded(this.current);
    this.current = undefined;
    closeFd(this.inheritedProg);
    this.inheritedProg = undefined;
    closeFd(this.flows);
    this.flows = undefined;
    closeFd(this.flows6);
    this.flows6 = undefined;
  }

  /** Whether this process's program is the one in place. */
  get active(): boolean {
    return this.current !== undefined;
  }

  /** The program's counters by nft counter name: `<chain>_conns` (packets = SYNs) and `<chain>_to_backend`. */
  counters(): Map<string, BpfCounter> {
    const out = new Map<string, BpfCounter>();
    const l = this.current;
    if (!l) return out;
    const v = Buffer.alloc(COUNTER_VALUE_SIZE);
    l.names.forEach((n, k) => {
      if (!this.bpf.bpfMapLookup(l.counters, key(k), v)) return;
      out.set(n.conns, { packets: Number(v.readBigUInt64LE(0)), bytes: 0 });
      out.set(n.toBackend, { packets: Number(v.readBigUInt64LE(8)), bytes: Number(v.readBigUInt64LE(16)) });
    });
    return out;
  }
}

/**
 * Can this node run the DSR program? Loads a program with a port of each
 * family and attaches it at tcx ingress of a veth in a throwaway network
 * namespace (the probe runs in a child: `unshare -n` needs a new process).
 * Returns why not, or undefined. Used by the start-up probe and `lb-agent
 * check`.
 */
export function probeDsrBpfHere(bpf: NativeBpf | string = nativeBpf(), device = 'lo'): string | undefined {
  if (typeof bpf === 'string') return bpf;
  const ports: DsrBpfPort[] = [{
    mac: '02:00:00:00:00:01', vip: '192.0.2.10', protocol: 'TCP', port: 80, seed: 1, slots: [0],
    backends: [{ address: '192.0.2.11', conns: 'c', toBackend: 't' }],
  }, {
    mac: '02:00:00:00:00:01', vip: '2001:db8::10', protocol: 'TCP', port: 80, seed: 1, slots: [0],
    backends: [{ address: '2001:db8::11', conns: 'c6', toBackend: 't6' }],
  }];
  let loaded: Loaded | undefined;
  let flows: number | undefined;
  let flows6: number | undefined;
  try {
    flows = createFlowMap(bpf, 16);
    flows6 = createFlowMap(bpf, 16, 6);
    loaded = load(bpf, ports, flows, flows6);
    const ifindex = ifNameToIndex(device);
    bpf.bpfProgAttach(ifindex, loaded.prog, BPF_TCX_INGRESS, 0, 0);
    bpf.bpfProgDetach(ifindex, loaded.prog, BPF_TCX_INGRESS);
    return undefined;
  } catch (err) {
    return errorMessage(err);
  } finally {
    closeLoaded(loaded);
    closeFd(flows);
    closeFd(flows6);
  }
}
