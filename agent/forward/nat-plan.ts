// forward/ layer: what the eBPF full-NAT engine (native/bpf/nat.c) is to
// hold for a forwarding state, PURE: the plan of every port it forwards
// (natPlan), and the map writes that take its maps from what they hold to a
// new plan (natDelta), touching only the ports whose plan changed. The
// driver (net/ebpf/nat-attach.ts) performs the writes in the order given.
//
// The engine takes the kernel path's `sourceIP: snat` ports of IPv4 and
// IPv6 VIPs, each family in maps of its own (lbn_svcs, lbn_slots,
// lbn_members and their *6 twins with 16-byte addresses; the counters are
// one index space); the nft table behind it (nft.ts) keeps everything else
// (direct server return) and whatever the program passes on.
//
// Placement: the same slot table and hash as the nft table's flow-hash
// placement (nft-dsr.ts flowHashSlots and flowHashPick: Maglev over every
// configured backend, the healthy ones filling it, nft's seeded jhash of the
// client's address and port: `ip saddr . th sport`, `ip6 saddr . th sport`
// for an IPv6 VIP), whatever the failover mode. So a flow lands
// where the nft table with VRRP puts it, and a VRRP peer running either
// engine picks it up mid-way on the same backend.
//
// Writes in place, as Cilium updates its service maps and Katran its
// consistent-hash rings under a running program: every write leaves the
// program a consistent view. An IPv4 port whose table keeps its size, seed,
// target port and key (a health change, a backend added or removed within
// the same table size) has only the slots whose backend changed rewritten
// where they are: Maglev moves a failed backend's slots and few others, so
// that is about a third of a three-backend table rather than all of it.
// Any other changed port's slot table goes into a range of lbn_slots no port
// uses, and its lbn_svcs entry (one atomic hash update) then points at it;
// the old range is free only after that. A backend's member entry is
// written before any slot names it, and deleted only after no slot and no
// port does, so each slot, whenever it is read, names a member of its
// port. A counter index keeps its (port, backend) for as long as the pair
// exists, so an unchanged port's counters are never moved or read again at
// an apply.
import { addressToBytes, parseAddress } from '../address';
import type { PortSpec } from '../config/types';
import type { CLayout } from '../net/ebpf/nat-layout';
import { normalizeState, type ForwardState, type NormalizedService } from './dataplane';
import { maglevSize } from './maglev';
import { dsrSeedValue, flowHashSlots } from './nft-dsr';

/** IPPROTO_TCP, IPPROTO_UDP. */
const IPPROTO = { TCP: 6, UDP: 17 } as const;

/** What one counter index of the engine counts. */
export interface NatCounterRef {
  readonly service: string;
  readonly port: PortSpec;
  readonly backend: string;
}

/** One forwarded (VIP, port, protocol) of a plan. */
export interface NatPortPlan {
  /** The port's identity from plan to plan: service key, protocol/port. */
  readonly id: string;
  /** The VIP's family: which maps hold the port (lbn_svcs or lbn_svcs6, ...). */
  readonly family: 4 | 6;
  readonly service: string;
  readonly port: PortSpec;
  /** lbn_svc_key (lbn_svc_key6 for an IPv6 VIP), encoded. */
  readonly key: Buffer;
  readonly seed: number;
  /** Every configured backend (lbn_members), and whether it is healthy. */
  readonly backends: readonly string[];
  readonly healthy: readonly boolean[];
  /** The slot table: an index into `backends` per slot (empty: no healthy backend). Shared by a service's ports, and by services of the same backends and health. */
  readonly table: NatSlotTable;
}

/**
 * A slot table, in the narrowest array that holds its indices: a byte a
 * slot up to 256 backends, so a table of 1,021 slots (2 to 10 backends)
 * keeps 1 KiB. The kernel's lbn_slots entries are apart: 8 bytes a slot.
 */
export type NatSlotTable = Uint8Array | Uint16Array | Uint32Array;

/** `indices` (each below `backends`) as a slot table. */
export function natSlotTable(indices: ArrayLike<number>, backends: number): NatSlotTable {
  if (backends <= 0x100) return Uint8Array.from(indices);
  if (backends <= 0x10000) return Uint16Array.from(indices);
  return Uint32Array.from(indices);
}

/**
 * What a port's slot table is made of: the configured backends with their
 * weights, in order, and the healthy ones. Services of the same shape share
 * one table object (the placement does not depend on the service: its seed
 * is apart), so a thousand services over a few backend sets keep a few
 * tables, and their Maglev population is computed once.
 */
function tableShape(svc: NormalizedService): string {
  let s = '';
  for (const b of svc.all) s += `${b.address}*${b.weight},`;
  s += '|';
  for (const b of svc.healthy) s += `${b.address}*${b.weight},`;
  return s;
}

/** A service's ports, kept as they are by the next plan while the service's inputs do not change. */
export interface NatServicePlan {
  readonly key: string;
  readonly input: NormalizedService;
  readonly ports: readonly NatPortPlan[];
  /** tableShape of the input, one string for every service of that shape (absent: described from a record). */
  readonly shape?: string;
}

export interface NatPlan {
  /** The services the engine forwards, in normalizeState's order. */
  readonly services: readonly NatServicePlan[];
  readonly byKey: ReadonlyMap<string, NatServicePlan>;
}

/** Does the engine take this service's ports? VIP held (either family), source NAT. */
export function natServes(svc: NormalizedService): boolean {
  return svc.vip !== undefined && svc.sourceIP === 'snat' && svc.ports.length > 0;
}

/** A map's name for a family: lbn_svcs, or lbn_svcs6 for IPv6. */
export function natMapName<M extends 'lbn_svcs' | 'lbn_slots' | 'lbn_members'>(map: M, family: 4 | 6): M | `${M}6` {
  return family === 6 ? `${map}6` : map;
}

/** A struct's name for a family (lbn_svc_key, lbn_svc_key6). */
const structName = (name: 'lbn_svc_key' | 'lbn_member_key' | 'lbn_slot', family: 4 | 6): string => (family === 6 ? `${name}6` : name);

function be16(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

/** An address as the wire has it: 4 bytes, or 16 for IPv6. */
function addr(a: string): Buffer {
  const parsed = parseAddress(a);
  if (parsed === undefined) throw new Error(`not an IP address: ${a}`);
  return addressToBytes(parsed);
}

const sameBackends = (a: NormalizedService['all'], b: NormalizedService['all']): boolean =>
  a.length === b.length && a.every((x, i) => x.address === b[i]!.address && x.weight === b[i]!.weight);

/** Would `a` and `b` give the same ports' plan? (The nft render keys its cache by the same inputs.) */
function sameInput(a: NormalizedService, b: NormalizedService): boolean {
  return a.vip === b.vip && a.sourceIP === b.sourceIP && sameBackends(a.all, b.all) && sameBackends(a.healthy, b.healthy)
    && a.ports.length === b.ports.length
    && a.ports.every((p, i) => p.spec.protocol === b.ports[i]!.spec.protocol && p.spec.port === b.ports[i]!.spec.port
      && p.spec.targetPort === b.ports[i]!.spec.targetPort && p.spec.name === b.ports[i]!.spec.name);
}

interface Shaped {
  readonly shape: string;
  readonly table: NatSlotTable;
}

/**
 * Slot tables by tableShape, gathered from the previous plan the first
 * time a service's plan is made anew. A plan keeps each service's shape as
 * the one string this map holds, so gathering is a map entry a service, not
 * a string built again.
 */
class SharedTables {
  private byShape: Map<string, Shaped> | undefined;

  constructor(private readonly prev: NatPlan | undefined) {}

  get(svc: NormalizedService, make: () => NatSlotTable): Shaped {
    if (this.byShape === undefined) {
      this.byShape = new Map();
      for (const s of this.prev?.services ?? []) {
        // A service described from a record has no shape, and its table's slots are not known.
        if (s.shape !== undefined && s.ports.length > 0) this.byShape.set(s.shape, { shape: s.shape, table: s.ports[0]!.table });
      }
    }
    const shape = tableShape(svc);
    let shaped = this.byShape.get(shape);
    if (shaped === undefined) {
      shaped = { shape, table: make() };
      this.byShape.set(shape, shaped);
    }
    return shaped;
  }
}

function servicePlan(svc: NormalizedService, layout: CLayout, tables: SharedTables): NatServicePlan {
  const backends = svc.all.map((b) => b.address);
  const healthySet = new Set(svc.healthy.map((b) => b.address));
  const healthy = backends.map((a) => healthySet.has(a));
  // One configured backend: one slot (the hash has one answer). A service
  // of several keeps its table's size while one of them is healthy (every
  // slot names it), so a health change rewrites slots in place rather than
  // a whole table in a new range; only none healthy empties it.
  const { shape, table } = tables.get(svc, () => {
    const index = new Map(backends.map((a, i) => [a, i]));
    const owners = healthySet.size === 0 ? [] : backends.length === 1 ? [svc.healthy[0]!] : flowHashSlots(svc);
    return natSlotTable(owners.map((b) => index.get(b.address)!), backends.length);
  });
  const seed = dsrSeedValue(svc.key);
  const vip = addr(svc.vip!);
  const family = vip.length === 16 ? 6 : 4;
  for (const b of backends) {
    if (addr(b).length !== vip.length) throw new Error(`${svc.key}: backend ${b} is not of the VIP ${svc.vip}'s family`);
  }
  const ports = svc.ports.map(({ spec }): NatPortPlan => ({
    id: `${svc.key}\n${spec.protocol}/${spec.port}`, family, service: svc.key, port: spec,
    key: layout.encode(structName('lbn_svc_key', family), { vip, port: be16(spec.port), proto: IPPROTO[spec.protocol] }),
    seed, backends, healthy, table,
  }));
  return { key: svc.key, input: svc, ports, shape };
}

/**
 * The plan of a forwarding state. With `prev`, a service whose inputs are
 * those it had there keeps its plan object (and its ports' objects), which
 * is how natDelta tells an unchanged port without looking into it.
 */
export function natPlan(state: ForwardState, layout: CLayout, prev?: NatPlan): NatPlan {
  const services: NatServicePlan[] = [];
  const tables = new SharedTables(prev);
  for (const svc of normalizeState(state).services) {
    if (!natServes(svc)) continue;
    const old = prev?.byKey.get(svc.key);
    services.push(old !== undefined && (old.input === svc || sameInput(old.input, svc)) ? old : servicePlan(svc, layout, tables));
  }
  return { services, byKey: new Map(services.map((s) => [s.key, s])) };
}

/** The empty plan (the probe's, and what a fresh set of maps holds). */
export const EMPTY_NAT_PLAN: NatPlan = { services: [], byKey: new Map() };

// ---------------------------------------------------------------------------
// The maps' contents and the delta between two plans.

/** Entries each per-plan map was created with. */
export interface NatCapacity {
  readonly svcs: number;
  readonly slots: number;
  readonly members: number;
  readonly counters: number;
  /** The IPv6 twins of svcs, slots and members. */
  readonly svcs6: number;
  readonly slots6: number;
  readonly members6: number;
  /** Whether the IPv6 flow maps are sized for flows (else a token few entries: a plan without an IPv6 port). */
  readonly six: boolean;
}

/** Where a port's entries are in the maps. */
export interface NatPlaced {
  readonly plan: NatPortPlan;
  /** Its slot table's first key in lbn_slots (its size is plan.table.length). */
  readonly base: number;
  /** The counter index of each of plan.backends. */
  readonly counters: readonly number[];
}

/** What the engine's per-plan maps hold (kept by the driver between applies). */
export interface NatMaps {
  readonly capacity: NatCapacity;
  readonly plan: NatPlan;
  readonly ports: ReadonlyMap<string, NatPlaced>;
  /** Unused ranges of lbn_slots, [base, size], by base, none adjacent. */
  readonly freeSlots: readonly (readonly [number, number])[];
  /** The same of lbn_slots6. */
  readonly freeSlots6: readonly (readonly [number, number])[];
  /** Counter indices released, oldest first: reused only when no index is left unused (a flow of a removed backend may count into its old index a while). */
  readonly freeCounters: readonly number[];
  /** The next counter index never used. */
  readonly nextCounter: number;
  /** Entries in lbn_members and lbn_svcs, and in their IPv6 twins. */
  readonly members: number;
  readonly svcs: number;
  readonly members6: number;
  readonly svcs6: number;
}

/** Maps of `capacity`, holding nothing. */
export function emptyNatMaps(capacity: NatCapacity): NatMaps {
  return {
    capacity, plan: EMPTY_NAT_PLAN, ports: new Map(),
    freeSlots: capacity.slots > 0 ? [[0, capacity.slots]] : [], freeSlots6: capacity.slots6 > 0 ? [[0, capacity.slots6]] : [],
    freeCounters: [], nextCounter: 0, members: 0, svcs: 0, members6: 0, svcs6: 0,
  };
}

/**
 * Room for `plan` and for changes after it: twice what it needs with every
 * backend healthy (a port's table is sized by its configured backends, so
 * health never grows it past that), and at least a few ports' worth more.
 */
export function natCapacity(plan: NatPlan): NatCapacity {
  const n = { 4: { svcs: 0, slots: 0, members: 0, largest: 0 }, 6: { svcs: 0, slots: 0, members: 0, largest: 0 } };
  for (const s of plan.services) {
    for (const p of s.ports) {
      const full = p.backends.length > 1 ? Math.max(p.table.length, maglevSize(p.backends.length)) : p.backends.length;
      const f = n[p.family];
      f.svcs++;
      f.slots += full;
      f.members += p.backends.length;
      f.largest = Math.max(f.largest, full);
    }
  }
  const room = (k: number, min: number): number => Math.max(2 * k, k + min);
  const six = n[6].svcs > 0;
  // A changed port's new table sits beside its old one until the swap: room for the largest twice over.
  // The IPv6 maps of a plan without an IPv6 port: room for a few (the first IPv6 port loads maps sized for it).
  return {
    svcs: room(n[4].svcs, 64), slots: room(n[4].slots, Math.max(4 * n[4].largest, 8192)), members: room(n[4].members, 256),
    counters: room(n[4].members + n[6].members, 256),
    svcs6: six ? room(n[6].svcs, 64) : 1, slots6: six ? room(n[6].slots, Math.max(4 * n[6].largest, 8192)) : 1, members6: six ? room(n[6].members, 256) : 1,
    six,
  };
}

/** One write to the engine's maps, in the order it must be made (an IPv6 port's go to the *6 maps). */
export type NatOp =
  | { readonly map: 'lbn_members' | 'lbn_members6'; readonly op: 'put'; readonly key: Buffer; readonly value: Buffer }
  | { readonly map: 'lbn_members' | 'lbn_members6'; readonly op: 'delete'; readonly key: Buffer }
  /**
   * Slots base .. base + table.length - 1: slot s is lbn_slot number
   * table[s] of `values` (one encoded lbn_slot per backend of the port: a
   * table is held once, as the plan has it, never as a buffer of slots).
   */
  | { readonly map: 'lbn_slots' | 'lbn_slots6'; readonly op: 'put'; readonly base: number; readonly table: NatSlotTable; readonly values: Buffer }
  /** Slot base + s, for each s of `slots` only (ascending), as `put` would write it: a table rewritten where it is. */
  | { readonly map: 'lbn_slots' | 'lbn_slots6'; readonly op: 'patch'; readonly base: number; readonly table: NatSlotTable; readonly values: Buffer; readonly slots: Uint32Array }
  | { readonly map: 'lbn_svcs' | 'lbn_svcs6'; readonly op: 'put'; readonly key: Buffer; readonly value: Buffer }
  | { readonly map: 'lbn_svcs' | 'lbn_svcs6'; readonly op: 'delete'; readonly key: Buffer }
  /** A counter whose (port, backend) is gone: its totals are kept (as `ref`'s), then it is zeroed for its next user. */
  | { readonly map: 'lbn_counters'; readonly op: 'retire'; readonly index: number; readonly ref: NatCounterRef };

/** The map entries an op writes (a slot range: one per slot). */
export function natOpWrites(op: NatOp): number {
  if (op.map === 'lbn_slots' || op.map === 'lbn_slots6') return op.op === 'patch' ? op.slots.length : op.table.length;
  return 1;
}

/** A slot whose backend is not known (a table natRecordedMaps describes from a record): never patched, always written whole. */
export const NAT_UNKNOWN_SLOT = 0xffffffff;

export interface NatDelta {
  readonly ops: readonly NatOp[];
  readonly maps: NatMaps;
  /** The ports whose entries were written (added, changed or removed). */
  readonly changed: number;
}

/** First fit in `free` (by base), or undefined; returns the base and the free list without it. */
function take(free: readonly (readonly [number, number])[], size: number): { base: number; free: (readonly [number, number])[] } | undefined {
  if (size === 0) return { base: 0, free: [...free] };
  const i = free.findIndex(([, n]) => n >= size);
  if (i < 0) return undefined;
  const [base, n] = free[i]!;
  const out = [...free];
  if (n === size) out.splice(i, 1);
  else out[i] = [base + size, n - size];
  return { base, free: out };
}

/** `free` with [base, size] given back, merged with its neighbours. */
function giveBack(free: (readonly [number, number])[], base: number, size: number): (readonly [number, number])[] {
  if (size === 0) return free;
  let i = 0;
  while (i < free.length && free[i]![0] < base) i++;
  const out = [...free.slice(0, i), [base, size] as const, ...free.slice(i)];
  // Merge with the next, then with the previous.
  if (i + 1 < out.length && out[i]![0] + out[i]![1] === out[i + 1]![0]) out.splice(i, 2, [out[i]![0], out[i]![1] + out[i + 1]![1]]);
  if (i > 0 && out[i - 1]![0] + out[i - 1]![1] === out[i]![0]) out.splice(i - 1, 2, [out[i - 1]![0], out[i - 1]![1] + out[i]![1]]);
  return out;
}

/**
 * The slots of `a`'s table (of `p`'s size) that name another backend or
 * counter in `p`'s, ascending; undefined when `a`'s table is not known
 * slot for slot (recorded: NAT_UNKNOWN_SLOT).
 */
function changedSlots(a: NatPlaced, p: NatPortPlan, counters: readonly number[]): Uint32Array | undefined {
  const ta = a.plan.table;
  const tp = p.table;
  // Each old backend's index in p (-1: gone), and whether its counter is p's: one compare of indices per slot.
  const map = new Int32Array(a.plan.backends.length).fill(-1);
  const at = new Map(p.backends.map((b, i) => [b, i]));
  a.plan.backends.forEach((b, i) => {
    const j = at.get(b);
    if (j !== undefined && counters[j] === a.counters[i]) map[i] = j;
  });
  const out: number[] = [];
  for (let i = 0; i < ta.length; i++) {
    const o = ta[i]!;
    if (o === NAT_UNKNOWN_SLOT) return undefined;
    if (map[o] !== tp[i]) out.push(i);
  }
  return Uint32Array.from(out);
}

/**
 * The writes that take `maps` to `plan`, and what the maps hold after
 * them; undefined when the maps have no room for it (the driver then loads
 * a program with maps sized anew, natCapacity, and writes the plan there
 * from empty maps). Only ports whose plan object differs from the one the
 * maps hold are looked at.
 *
 * Order: (1) member entries added, or turned healthy; (2) the changed
 * slots of tables rewritten where they are, and new slot tables, each in a
 * range no port uses; (3) each changed port's lbn_svcs entry,
 * pointing at its new range, and new ports'; (4) removed ports' lbn_svcs
 * entries deleted; (5) member entries turned unhealthy, then those of
 * removed backends and ports deleted; (6) counters of removed (port,
 * backend) pairs retired. Old ranges and counter indices are free for the
 * next delta, not this one. Each family's ports go to its own maps, with
 * its own ranges of slots, in the same order.
 */
export function natDelta(maps: NatMaps, plan: NatPlan, layout: CLayout): NatDelta | undefined {
  const cap = maps.capacity;
  if (!cap.six && plan.services.some((s) => s.ports.some((p) => p.family === 6))) return undefined;
  const memberUp: NatOp[] = [];
  const slotOps: NatOp[] = [];
  const svcOps: NatOp[] = [];
  const svcDeletes: NatOp[] = [];
  const memberDown: NatOp[] = [];
  const memberDeletes: NatOp[] = [];
  const retires: NatOp[] = [];
  const ports = new Map(maps.ports);
  /** Each family's slot ranges and entry counts (peaks: entries of a port moved to another key are there at once for a while). */
  const fam = {
    4: { free: [...maps.freeSlots], released: [] as Array<readonly [number, number]>, members: maps.members, peakMembers: maps.members, svcs: maps.svcs, peakSvcs: maps.svcs },
    6: { free: [...maps.freeSlots6], released: [] as Array<readonly [number, number]>, members: maps.members6, peakMembers: maps.members6, svcs: maps.svcs6, peakSvcs: maps.svcs6 },
  };
  const freeCounters = [...maps.freeCounters];
  let nextCounter = maps.nextCounter;
  const releasedCounters: number[] = [];
  let changed = 0;
  /** Keys of lbn_svcs and lbn_members this delta writes (hex), which no removal may then delete. */
  const written = new Set<string>();

  const memberKey = (p: NatPortPlan, backend: string): Buffer => {
    const svc = layout.decode(structName('lbn_svc_key', p.family), p.key);
    return layout.encode(structName('lbn_member_key', p.family), { svc, backend: addr(backend) });
  };
  const memberValue = (counter: number, healthy: boolean): Buffer => layout.encode('lbn_member', { counter, healthy: healthy ? 1 : 0 });
  /** One encoded lbn_slot per backend of the port (a slot op's values). */
  const slotValues = (p: NatPortPlan, counters: readonly number[]): Buffer => {
    const slot = structName('lbn_slot', p.family);
    const size = layout.size(slot);
    const values = Buffer.alloc(size * p.backends.length);
    p.backends.forEach((b, i) => layout.encode(slot, { backend: addr(b), counter: counters[i]! }, values, i * size));
    return values;
  };

  const place = (p: NatPortPlan, old: NatPlaced | undefined): boolean => {
    const f = fam[p.family];
    const members = natMapName('lbn_members', p.family);
    // Counters: kept by the backends the port keeps, new ones for the others.
    const had = new Map<string, number>();
    old?.plan.backends.forEach((b, i) => had.set(b, old.counters[i]!));
    const counters: number[] = [];
    for (const b of p.backends) {
      let c = had.get(b);
      if (c === undefined) {
        c = nextCounter < cap.counters ? nextCounter++ : freeCounters.shift();
        if (c === undefined) return false;
      }
      counters.push(c);
    }
    // Members added or turned healthy before the slots that name them; turned unhealthy after.
    const wasHealthy = new Map<string, boolean>();
    old?.plan.backends.forEach((b, i) => wasHealthy.set(b, old.plan.healthy[i]!));
    p.backends.forEach((b, i) => {
      const before = wasHealthy.get(b);
      if (before === p.healthy[i] && had.get(b) === counters[i]) return;
      const op: NatOp = { map: members, op: 'put', key: memberKey(p, b), value: memberValue(counters[i]!, p.healthy[i]!) };
      written.add(op.key.toString('hex'));
      if (before === undefined) f.members++;
      if (before === true && !p.healthy[i]) memberDown.push(op);
      else memberUp.push(op);
    });
    f.peakMembers = Math.max(f.peakMembers, f.members);
    const kept = new Set(p.backends);
    old?.plan.backends.forEach((b, i) => {
      if (kept.has(b)) return;
      memberDeletes.push({ map: members, op: 'delete', key: memberKey(old.plan, b) });
      f.members--;
      retires.push({ map: 'lbn_counters', op: 'retire', index: old.counters[i]!, ref: { service: old.plan.service, port: old.plan.port, backend: b } });
      releasedCounters.push(old.counters[i]!);
    });
    // The slot table: rewritten where it is, only the slots that changed,
    // where its size, seed and target port stay (the svc entry stays too);
    // else in a range of its own, which the svc entry then points at. Only
    // an IPv4 slot is rewritten where the program may read it: its 8 bytes
    // are written and read whole (one aligned 64-bit move each side), where
    // an IPv6 slot's 20 could be read half old, half new.
    let base = old?.base ?? 0;
    const diff = old !== undefined && old.plan.table.length === p.table.length ? changedSlots(old, p, counters) : undefined;
    const sameShape = old !== undefined && p.port.targetPort === old.plan.port.targetPort && p.seed === old.plan.seed;
    if (diff !== undefined && (diff.length === 0 || (sameShape && p.family === 4))) {
      if (diff.length > 0) slotOps.push({ map: natMapName('lbn_slots', p.family), op: 'patch', base, table: p.table, values: slotValues(p, counters), slots: diff });
    } else {
      const got = take(f.free, p.table.length);
      if (got === undefined) return false;
      f.free = got.free;
      base = got.base;
      if (p.table.length > 0) slotOps.push({ map: natMapName('lbn_slots', p.family), op: 'put', base, table: p.table, values: slotValues(p, counters) });
      if (old !== undefined) f.released.push([old.base, old.plan.table.length]);
    }
    if (old === undefined || base !== old.base || p.table.length !== old.plan.table.length || p.port.targetPort !== old.plan.port.targetPort || p.seed !== old.plan.seed) {
      svcOps.push({ map: natMapName('lbn_svcs', p.family), op: 'put', key: p.key, value: layout.encode('lbn_svc', { base, slots: p.table.length, seed: p.seed, target_port: be16(p.port.targetPort) }) });
      written.add(p.key.toString('hex'));
    }
    if (old === undefined) f.peakSvcs = Math.max(f.peakSvcs, ++f.svcs);
    ports.set(p.id, { plan: p, base, counters });
    return true;
  };

  // A port removed, or moved to another key (its service's VIP changed):
  // its entries go, but for keys this delta writes anew (another service
  // took its VIP and port in the same change).
  const removals: NatPlaced[] = [];
  const seen = new Set<string>();
  for (const s of plan.services) {
    const same = maps.plan.byKey.get(s.key) === s;
    for (const p of s.ports) {
      seen.add(p.id);
      if (same) continue;
      let old = maps.ports.get(p.id);
      if (old !== undefined && old.plan === p) continue;
      changed++;
      if (old !== undefined && (old.plan.family !== p.family || !old.plan.key.equals(p.key))) {
        removals.push(old);
        old = undefined;
      }
      if (!place(p, old)) return undefined;
    }
  }
  for (const s of maps.plan.services) {
    if (plan.byKey.get(s.key) === s) continue;
    for (const p of s.ports) {
      if (seen.has(p.id)) continue;
      changed++;
      removals.push(maps.ports.get(p.id)!);
      ports.delete(p.id);
    }
  }
  for (const old of removals) {
    const p = old.plan;
    const f = fam[p.family];
    if (!written.has(p.key.toString('hex'))) svcDeletes.push({ map: natMapName('lbn_svcs', p.family), op: 'delete', key: p.key });
    f.svcs--;
    p.backends.forEach((b, i) => {
      const key = memberKey(p, b);
      if (!written.has(key.toString('hex'))) memberDeletes.push({ map: natMapName('lbn_members', p.family), op: 'delete', key });
      f.members--;
      retires.push({ map: 'lbn_counters', op: 'retire', index: old.counters[i]!, ref: { service: p.service, port: p.port, backend: b } });
      releasedCounters.push(old.counters[i]!);
    });
    f.released.push([old.base, p.table.length]);
  }
  if (fam[4].peakMembers > cap.members || fam[4].peakSvcs > cap.svcs || fam[6].peakMembers > cap.members6 || fam[6].peakSvcs > cap.svcs6) return undefined;
  for (const f of [fam[4], fam[6]]) for (const [base, size] of f.released) f.free = giveBack(f.free, base, size);
  return {
    ops: [...memberUp, ...slotOps, ...svcOps, ...svcDeletes, ...memberDown, ...memberDeletes, ...retires],
    maps: {
      capacity: cap, plan, ports, freeSlots: fam[4].free, freeSlots6: fam[6].free, freeCounters: [...freeCounters, ...releasedCounters], nextCounter,
      members: fam[4].members, svcs: fam[4].svcs, members6: fam[6].members, svcs6: fam[6].svcs,
    },
    changed,
  };
}
