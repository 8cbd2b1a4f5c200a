// forward/ layer: the record of what the eBPF NAT engine's per-plan maps
// hold, PURE: each port's digest and placement (natRecord), and from a
// record and a new plan the maps' contents as natDelta takes them
// (natRecordedMaps), so a process that adopts maps an earlier one wrote
// writes only the ports whose digest differs, and nothing when none does.
// The driver (net/ebpf/nat-attach.ts) keeps the record beside the maps and
// trusts it only for the very maps it names (their ids).
import { createHash } from 'node:crypto';
import { NAT_UNKNOWN_SLOT, type NatMaps, type NatPlaced, type NatPlan, type NatPortPlan, type NatServicePlan } from './nat-plan';

/** One port's entries as recorded: its plan but for the slot table (its digest and size stand for it), and where they are. */
export interface NatRecordPort extends Omit<NatPortPlan, 'key' | 'table'> {
  /** natPortDigest of the port's plan. */
  readonly digest: string;
  /** lbn_svc_key, hex. */
  readonly key: string;
  readonly slots: number;
  readonly base: number;
  readonly counters: readonly number[];
}

export interface NatRecord extends Omit<NatMaps, 'plan' | 'ports'> {
  readonly version: 1;
  /** What else must be the same for the record to hold: the program's and maps' ids, the object file's digest, the settings. */
  readonly identity: Readonly<Record<string, unknown>>;
  readonly ports: readonly NatRecordPort[];
}

const digests = new WeakMap<NatPortPlan, string>();

/** A digest of everything a port's entries are made from (its key, seed, target port, backends, health and slot table). */
export function natPortDigest(p: NatPortPlan): string {
  let d = digests.get(p);
  if (d === undefined) {
    const h = createHash('sha256');
    h.update(JSON.stringify([p.family, p.key.toString('hex'), p.seed, p.port.targetPort, p.backends, p.healthy]));
    // The table's indices as 32-bit words, whatever its width: a record
    // holds the same digest for the same table whichever array keeps it.
    const words = p.table instanceof Uint32Array ? p.table : Uint32Array.from(p.table);
    h.update(new Uint8Array(words.buffer, words.byteOffset, words.byteLength));
    d = h.digest('hex').slice(0, 32);
    digests.set(p, d);
  }
  return d;
}

function recordPort({ plan: p, base, counters }: NatPlaced): NatRecordPort {
  return {
    id: p.id, digest: natPortDigest(p), family: p.family, service: p.service, port: p.port, key: p.key.toString('hex'), seed: p.seed,
    backends: p.backends, healthy: p.healthy, slots: p.table.length, base, counters,
  };
}

/** The record of `maps` (what natDelta said they hold after its writes). */
export function natRecord(maps: NatMaps, identity: Readonly<Record<string, unknown>>): NatRecord {
  return { ...recordHead(maps, identity), ports: [...maps.ports.values()].map(recordPort) };
}

function recordHead(maps: NatMaps, identity: Readonly<Record<string, unknown>>): Omit<NatRecord, 'ports'> {
  return {
    version: 1, identity, capacity: maps.capacity, freeSlots: maps.freeSlots, freeSlots6: maps.freeSlots6,
    freeCounters: maps.freeCounters, nextCounter: maps.nextCounter, members: maps.members, svcs: maps.svcs, members6: maps.members6, svcs6: maps.svcs6,
  };
}

/** A placed port's JSON, kept with it: natDelta keeps an unchanged port's NatPlaced object from delta to delta. */
const portTexts = new WeakMap<NatPlaced, string>();

/**
 * natRecord(maps, identity) as JSON text, which JSON.parse reads back as
 * that record: each port's text is made once for its NatPlaced object and
 * kept, so a record after a change of a few ports encodes those ports
 * alone and joins the others' texts.
 */
export function natRecordText(maps: NatMaps, identity: Readonly<Record<string, unknown>>): string {
  const ports: string[] = [];
  for (const placed of maps.ports.values()) {
    let text = portTexts.get(placed);
    if (text === undefined) {
      text = JSON.stringify(recordPort(placed));
      portTexts.set(placed, text);
    }
    ports.push(text);
  }
  const head = JSON.stringify(recordHead(maps, identity));
  return `${head.slice(0, -1)},"ports":[${ports.join(',')}]}`;
}

/**
 * What maps holding `record` hold, in the terms of the new `plan`: a port
 * whose digest is the new plan's is that port of the plan (natDelta passes
 * it by), a service all of whose ports are so is that service of the plan;
 * any other port is described as recorded, with a slot table of unknown
 * slots (NAT_UNKNOWN_SLOT: natDelta writes its table anew in a free range,
 * never in place, and the members and svc entry from what was recorded).
 */
export function natRecordedMaps(record: NatRecord, plan: NatPlan): NatMaps {
  const planPorts = new Map<string, NatPortPlan>();
  for (const s of plan.services) for (const p of s.ports) planPorts.set(p.id, p);
  const ports = new Map<string, NatPlaced>();
  const byService = new Map<string, NatPortPlan[]>();
  for (const r of record.ports) {
    const now = planPorts.get(r.id);
    const p: NatPortPlan = now !== undefined && natPortDigest(now) === r.digest ? now : {
      id: r.id, family: r.family, service: r.service, port: r.port, key: Buffer.from(r.key, 'hex'), seed: r.seed,
      backends: r.backends, healthy: r.healthy, table: new Uint32Array(r.slots).fill(NAT_UNKNOWN_SLOT),
    };
    ports.set(r.id, { plan: p, base: r.base, counters: r.counters });
    byService.set(r.service, [...(byService.get(r.service) ?? []), p]);
  }
  const services: NatServicePlan[] = [];
  for (const [key, held] of byService) {
    const s = plan.byKey.get(key);
    const same = s !== undefined && s.ports.length === held.length && s.ports.every((p) => held.includes(p));
    services.push(same ? s : { key, input: undefined as never, ports: held });
  }
  return {
    capacity: record.capacity, plan: { services, byKey: new Map(services.map((s) => [s.key, s])) }, ports,
    freeSlots: record.freeSlots, freeSlots6: record.freeSlots6, freeCounters: record.freeCounters, nextCounter: record.nextCounter,
    members: record.members, svcs: record.svcs, members6: record.members6, svcs6: record.svcs6,
  };
}
