// nat-plan.ts: the engine's plan of a forwarding state, and the map writes
// (natDelta) that take its maps from one plan to the next. The writes are
// played into a model of the maps (pure), and after every single write the
// model is checked as the program would read it: every port's slot range
// written, every slot naming a backend with a member entry of that port and
// the slot's counter.
import t from 'tap';
import { addressFromBytes, formatAddress, parseIPv4 } from '../../agent/address';
import type { BackendSpec } from '../../agent/config/types';
import { normalizeState, type ForwardService } from '../../agent/forward/dataplane';
import { emptyNatMaps, natCapacity, natDelta, natOpWrites, natPlan, natSlotTable, type NatMaps, type NatOp, type NatPlan } from '../../agent/forward/nat-plan';
import { flowHashSlots } from '../../agent/forward/nft-dsr';
import { natLayout } from '../../agent/net/ebpf/nat-layout';

const b = (address: string, weight = 1): BackendSpec => (address.includes(':') ? { address, addressNum: 0, family: 'IPv6', weight } : { address, addressNum: parseIPv4(address)!, weight });
const all = [b('10.0.0.11'), b('10.0.0.12'), b('10.0.0.13', 2)];
const web = (healthy: BackendSpec[], extra: Partial<ForwardService> = {}): ForwardService => ({
  key: 'default/web', vip: '10.0.0.50', backends: all, healthy,
  ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }], ...extra,
});
const l = natLayout();
/** A network-order address field as decoded (a little-endian read of its bytes), dotted. */
const ip = (n: unknown): string => [0, 8, 16, 24].map((s) => ((n as number) >>> s) & 0xff).join('.');
const hex = (k: Buffer): string => k.toString('hex');

/** A backend address field as decoded: a number (IPv4, a little-endian read of its bytes) or 16 bytes (IPv6). */
const backendText = (v: unknown): string => (Buffer.isBuffer(v) ? formatAddress(addressFromBytes('IPv6', v)) : ip(v));
const backendBytes = (v: unknown): Buffer => (Buffer.isBuffer(v) ? v : Buffer.from([0, 8, 16, 24].map((sh) => ((v as number) >>> sh) & 0xff)));
/** Struct names of a family: lbn_svc_key or lbn_svc_key6. */
const of = (name: string, six: boolean): string => (six ? `${name}6` : name);
/** Is this an IPv6 port's key (lbn_svc_key6)? */
const isSix = (key: Buffer): boolean => key.length === l.size('lbn_svc_key6');

/** The per-plan maps as the program sees them: IPv4's, and IPv6's apart. */
class Model {
  readonly svcs = new Map<string, Buffer>();
  readonly members = new Map<string, Buffer>();
  readonly slots = new Map<number, Buffer>();
  readonly svcs6 = new Map<string, Buffer>();
  readonly members6 = new Map<string, Buffer>();
  readonly slots6 = new Map<number, Buffer>();
  readonly counters = new Map<number, string>();
  /** Each port's slot range, [base, size], as its lbn_svcs entry says. */
  readonly ranges = new Map<string, [number, number]>();
  readonly ranges6 = new Map<string, [number, number]>();
  retired: string[] = [];
  writes = 0;
  /** Slots rewritten in place (patches), each checked as the program could read it right after. */
  patches = 0;
  /** A slot's counter must be its member's (off where a port's key passes to another service: a packet then may count to the old one's). */
  checkCounters = true;

  play(ops: readonly NatOp[]): void {
    for (const op of ops) {
      this.writes += natOpWrites(op);
      // The ports this write can change for the program: checked after it.
      let touched: string[] = [];
      if ('table' in op) {
        const six = op.map === 'lbn_slots6';
        const n = op.table.length;
        const size = l.size(of('lbn_slot', six));
        const slots = six ? this.slots6 : this.slots;
        touched = [...(six ? this.ranges6 : this.ranges)].filter(([, [base, size]]) => base < op.base + n && op.base < base + size).map(([k]) => k);
        if (op.op === 'put') {
          // A whole table goes into a range no port reads.
          if (touched.length > 0) throw new Error(`a new table written over slots ${op.base}..${op.base + n - 1}, which port ${touched[0]} reads`);
          for (let i = 0; i < n; i++) slots.set(op.base + i, op.values.subarray(op.table[i]! * size, (op.table[i]! + 1) * size));
        } else {
          // Rewritten where it is: the range is exactly one port's, and the program may read it between any two slots.
          const own = touched.filter((k) => {
            const [base, size] = (six ? this.ranges6 : this.ranges).get(k)!;
            return base === op.base && size === n;
          });
          if (own.length !== 1 || touched.length !== 1) throw new Error(`slots ${op.base}..${op.base + n - 1} patched, which are not one port's table (${touched.length} ports read them)`);
          for (const i of op.slots) {
            if (i >= n) throw new Error(`slot ${i} patched, beyond the table's ${n}`);
            slots.set(op.base + i, op.values.subarray(op.table[i]! * size, (op.table[i]! + 1) * size));
            this.patches++;
            this.slotConsistent(own[0]!, i);
          }
        }
      } else if (op.map === 'lbn_counters') {
        this.retired.push(`${op.index}:${op.ref.service}:${op.ref.port.protocol}/${op.ref.port.port}:${op.ref.backend}`);
      } else if ('key' in op) {
        const six = op.map.endsWith('6');
        const m = op.map.startsWith('lbn_svcs') ? (six ? this.svcs6 : this.svcs) : (six ? this.members6 : this.members);
        if (op.op === 'put') m.set(hex(op.key), op.value);
        else if (!m.delete(hex(op.key))) throw new Error(`deleted ${op.map} ${hex(op.key)}, which is not there`);
        if (op.map.startsWith('lbn_svcs')) {
          const ranges = six ? this.ranges6 : this.ranges;
          if (op.op === 'put') {
            const svc = l.decode('lbn_svc', op.value);
            ranges.set(hex(op.key), [svc['base'] as number, svc['slots'] as number]);
          } else {
            ranges.delete(hex(op.key));
          }
        }
        // A member key begins with its port's key.
        touched = [hex(op.key.subarray(0, l.size(of('lbn_svc_key', six))))];
      }
      for (const k of touched) this.consistent(k);
    }
  }

  /** Every slot of the port `k` names a member of that port with the slot's counter. */
  consistent(k: string): void {
    const six = isSix(Buffer.from(k, 'hex'));
    const v = (six ? this.svcs6 : this.svcs).get(k);
    if (!v) return;
    const svc = l.decode('lbn_svc', v);
    for (let s = 0; s < (svc['slots'] as number); s++) this.slotConsistent(k, s);
  }

  /** Slot `s` of the port `k`'s table names a member of that port with the slot's counter. */
  slotConsistent(k: string, s: number): void {
    const six = isSix(Buffer.from(k, 'hex'));
    const svc = l.decode('lbn_svc', (six ? this.svcs6 : this.svcs).get(k)!);
    const key = l.decode(of('lbn_svc_key', six), Buffer.from(k, 'hex'));
    const raw = (six ? this.slots6 : this.slots).get((svc['base'] as number) + s);
    if (!raw) throw new Error(`port ${k}: slot ${s} not written`);
    const slot = l.decode(of('lbn_slot', six), raw);
    const mk = l.encode(of('lbn_member_key', six), { svc: key, backend: backendBytes(slot['backend']) });
    const m = (six ? this.members6 : this.members).get(hex(mk));
    if (!m) throw new Error(`port ${k}: slot ${s} names ${backendText(slot['backend'])}, which has no member entry`);
    if (this.checkCounters && l.decode('lbn_member', m)['counter'] !== slot['counter']) throw new Error(`port ${k}: slot ${s}'s counter differs from its member's`);
  }

  /** A port's slot table as backend addresses. */
  table(key: Buffer): string[] {
    const six = isSix(key);
    const v = (six ? this.svcs6 : this.svcs).get(hex(key));
    if (!v) return [];
    const svc = l.decode('lbn_svc', v);
    const slots = six ? this.slots6 : this.slots;
    return Array.from({ length: svc['slots'] as number }, (_, s) => backendText(l.decode(of('lbn_slot', six), slots.get((svc['base'] as number) + s)!)['backend']));
  }
}

/** Maps filled from empty with `plan`, as a load does. */
function loaded(plan: NatPlan, model = new Model()): { maps: NatMaps; model: Model } {
  const d = natDelta(emptyNatMaps(natCapacity(plan)), plan, l)!;
  model.play(d.ops);
  return { maps: d.maps, model };
}

t.test('a service with three healthy backends: both ports, the whole slot table, every member', async (t) => {
  const plan = natPlan({ services: [web(all)] }, l);
  t.same(plan.services.map((s) => s.key), ['default/web']);
  const ports = plan.services[0]!.ports;
  t.equal(ports.length, 2);
  const { model } = loaded(plan);
  t.equal(model.members.size, 6, 'every configured backend of each port');
  const slots = flowHashSlots(normalizeState({ services: [web(all)] }).services[0]!);
  t.equal(model.slots.size, 2 * slots.length);
  // Ports are in normalizeState's order: TCP 80 first.
  const key = l.decode('lbn_svc_key', ports[0]!.key);
  t.same([ip(key['vip']), key['proto']], ['10.0.0.50', 6]);
  t.equal(key['port'], 0x5000, 'port 80 in network order (read little-endian)');
  const v = l.decode('lbn_svc', model.svcs.get(hex(ports[0]!.key))!);
  t.equal(v['slots'], slots.length);
  t.equal(v['target_port'], 0x901f, '8080 in network order');
  t.same(model.table(ports[0]!.key), slots.map((s) => s.address), 'every slot names the backend nft\'s flow-hash table names');
  t.same(model.table(ports[1]!.key), slots.map((s) => s.address), 'the UDP port too');
  const counters = new Set([...model.members.values()].map((m) => l.decode('lbn_member', m)['counter']));
  t.equal(counters.size, 6, 'a counter of its own for each (port, backend)');
});

t.test('health: one healthy backend of three fills the whole table, one configured backend is one slot, none is zero slots; members say who is healthy', async (t) => {
  const one = natPlan({ services: [web([all[1]!])] }, l);
  const { model, maps } = loaded(one);
  const tcp = one.services[0]!.ports[0]!;
  const size = flowHashSlots(normalizeState({ services: [web(all)] }).services[0]!).length;
  t.same(model.table(tcp.key), Array(size).fill('10.0.0.12'), `every one of the ${size} slots names the one healthy backend: the table keeps its size`);
  const back = natDelta(maps, natPlan({ services: [web(all)] }, l, one), l)!;
  t.notOk(back.ops.some((o) => o.map === 'lbn_svcs' || o.op === 'put' && o.map === 'lbn_slots'), 'the others back: slots rewritten in place, no new range');
  const single = natPlan({ services: [web([all[1]!], { backends: [all[1]!] })] }, l);
  t.same(loaded(single).model.table(single.services[0]!.ports[0]!.key), ['10.0.0.12'], 'one configured backend: one slot');
  const healthy = tcp.backends.map((a) => [a, l.decode('lbn_member', model.members.get(hex(l.encode('lbn_member_key', { svc: l.decode('lbn_svc_key', tcp.key), backend: Buffer.from(a.split('.').map(Number)) })))!)['healthy']]);
  t.same(healthy, [['10.0.0.11', 0], ['10.0.0.12', 1], ['10.0.0.13', 0]]);
  const none = natPlan({ services: [web([])] }, l);
  const m2 = loaded(none).model;
  t.same(none.services[0]!.ports.map((p) => l.decode('lbn_svc', m2.svcs.get(hex(p.key))!)['slots']), [0, 0], 'no slot: the program passes such a port to the nft table, which refuses it');
  t.equal(m2.slots.size, 0);
});

t.test('VIPs held in snat mode, of either family', async (t) => {
  const plan = natPlan({
    services: [
      web(all, { key: 'a/dsr', vip: '10.0.0.51', sourceIP: 'preserve' }),
      web(all6, { key: 'a/v6', vip: 'fd00::50', backends: all6 }),
      web(all, { key: 'a/none', vip: undefined }),
      web(all, { key: 'a/web' }),
    ],
  }, l);
  t.same(plan.services.map((s) => s.key), ['a/v6', 'a/web']);
  t.same(plan.services.map((s) => s.ports[0]!.family), [6, 4]);
  t.throws(() => natPlan({ services: [web(all, { key: 'a/mixed', vip: 'fd00::50' })] }, l), /backend 10\.0\.0\.11 is not of the VIP fd00::50's family/);
});

const all6 = [b('fd00::11'), b('fd00::12'), b('fd00::13', 2)];
const web6 = (healthy: BackendSpec[], extra: Partial<ForwardService> = {}): ForwardService => web(healthy, { key: 'default/web6', vip: 'fd00::50', backends: all6, ...extra });

t.test('an IPv6 VIP: its ports, slot tables and members in the IPv6 maps, beside an IPv4 service', async (t) => {
  const plan = natPlan({ services: [web(all), web6(all6)] }, l);
  const cap = natCapacity(plan);
  t.ok(cap.six && cap.svcs6 >= 2 && cap.slots6 > 0 && cap.members6 >= 6, `IPv6 maps sized for the plan (${JSON.stringify(cap)})`);
  const { model, maps } = loaded(plan);
  t.equal(model.svcs.size, 2, 'the IPv4 service\'s two ports in lbn_svcs');
  t.equal(model.svcs6.size, 2, 'the IPv6 service\'s two ports in lbn_svcs6');
  t.equal(model.members6.size, 6, 'every configured IPv6 backend of each port in lbn_members6');
  const v6 = plan.services.find((s) => s.key === 'default/web6')!;
  const key = l.decode('lbn_svc_key6', v6.ports[0]!.key);
  t.same([formatAddress(addressFromBytes('IPv6', key['vip'] as Buffer)), key['port'], key['proto']], ['fd00::50', 0x5000, 6], 'the key: 16 address bytes, port in network order, protocol');
  const slots = flowHashSlots(normalizeState({ services: [web6(all6)] }).services[0]!);
  t.same(model.table(v6.ports[0]!.key), slots.map((x) => x.address), 'the IPv6 port\'s slots name the backends nft\'s IPv6 flow-hash table names');
  t.same(model.table(v6.ports[1]!.key), slots.map((x) => x.address), 'the UDP port too');
  t.equal(model.slots6.size, 2 * slots.length);
  const counters = [...model.members.values(), ...model.members6.values()].map((m) => l.decode('lbn_member', m)['counter']);
  t.equal(new Set(counters).size, 12, 'one counter index space for both families: no two (port, backend) share one');
  t.equal(maps.svcs6, 2);
  t.equal(maps.members6, 6);
});

t.test('IPv6 health and removal: the same write order, checked after every write', async (t) => {
  const up = natPlan({ services: [web(all), web6(all6)] }, l);
  const { maps, model } = loaded(up);
  const down = natPlan({ services: [web(all), web6(all6.slice(0, 2))] }, l, up);
  const d1 = natDelta(maps, down, l)!;
  t.same(d1.ops.map((o) => `${o.map}:${o.op}`), ['lbn_slots6:put', 'lbn_slots6:put', 'lbn_svcs6:put', 'lbn_svcs6:put', 'lbn_members6:put', 'lbn_members6:put'], 'taken out: the IPv6 maps only, each table whole in a new range (an IPv6 slot is never rewritten where it is read), the ports pointed at them, then the members');
  model.play(d1.ops);
  const port = down.services.find((s) => s.key === 'default/web6')!.ports[0]!;
  t.notOk(model.table(port.key).includes('fd00::13'), 'no slot names the backend taken out');
  const back = natPlan({ services: [web(all), web6(all6)] }, l, down);
  const d2 = natDelta(d1.maps, back, l)!;
  t.same(d2.ops.map((o) => `${o.map}:${o.op}`), ['lbn_members6:put', 'lbn_members6:put', 'lbn_slots6:put', 'lbn_slots6:put', 'lbn_svcs6:put', 'lbn_svcs6:put'], 'back: members first');
  model.play(d2.ops);
  // Removed from the config, then the service gone: deletes after the tables stop naming them, counters retired last.
  const removed = natPlan({ services: [web(all), web6(all6.slice(0, 2), { backends: all6.slice(0, 2) })] }, l, back);
  const d3 = natDelta(d2.maps, removed, l)!;
  model.play(d3.ops);
  t.equal(model.members6.size, 4);
  t.match(model.retired, [/:default\/web6:TCP\/80:fd00::13$/, /:default\/web6:UDP\/53:fd00::13$/]);
  const gone = natPlan({ services: [web(all)] }, l, removed);
  const d4 = natDelta(d3.maps, gone, l)!;
  model.play(d4.ops);
  t.same([model.svcs6.size, model.members6.size, model.svcs.size, model.members.size], [0, 0, 2, 6], 'the IPv6 service gone whole, the IPv4 one untouched');
  t.equal(d4.maps.freeSlots6.reduce((n, [, k]) => n + k, 0), d4.maps.capacity.slots6, 'every IPv6 slot range given back');
  // Bad orders of IPv6 writes are caught as IPv4's are.
  const fresh = loaded(up);
  // Eleven backends: a table of another size (4093 slots), in a new range.
  const eleven = Array.from({ length: 11 }, (_, i) => b(`fd00::${(0x11 + i).toString(16)}`));
  const shrunk = natDelta(fresh.maps, natPlan({ services: [web(all), web6(eleven, { backends: eleven })] }, l, up), l)!.ops;
  t.ok(shrunk.some((o) => o.map === 'lbn_svcs6'), 'a table that changes size: a new range and the port pointed at it');
  const svcFirst = [...shrunk.filter((o) => o.map === 'lbn_svcs6'), ...shrunk.filter((o) => o.map !== 'lbn_svcs6')];
  t.throws(() => fresh.model.play(svcFirst), /slot \d+ names|not written/, 'an IPv6 port pointed at its new range before its slots are there');
  const rm = natDelta(loaded(up).maps, removed, l)!.ops;
  const other = loaded(up);
  t.throws(() => other.model.play([...rm.filter((o) => o.op === 'delete'), ...rm.filter((o) => o.op !== 'delete')]), /has no member entry/, 'an IPv6 member deleted while a table still names it');
});

t.test('a VIP that changes family moves its ports between the maps; IPv6 maps a plan never sized refuse an IPv6 port', async (t) => {
  const v4 = natPlan({ services: [web(all)] }, l);
  t.equal(natCapacity(v4).six, false, 'no IPv6 port: the IPv6 maps are not sized for flows');
  const { maps } = loaded(v4);
  const withSix = natPlan({ services: [web(all), web6(all6)] }, l, v4);
  t.equal(natDelta(maps, withSix, l), undefined, 'the first IPv6 port: no room (the driver loads maps sized for it)');
  const both = natPlan({ services: [web(all), web6(all6)] }, l);
  const big = loaded(both, new Model());
  const moved = natPlan({ services: [web(all), web6(all, { vip: '10.0.0.60', backends: all })] }, l, both);
  const d = natDelta(big.maps, moved, l)!;
  big.model.play(d.ops);
  t.same([big.model.svcs.size, big.model.svcs6.size, big.model.members6.size], [4, 0, 0], 'its ports now in lbn_svcs, nothing left in the IPv6 maps');
  t.ok(d.ops.findIndex((o) => o.map === 'lbn_svcs' && o.op === 'put') < d.ops.findIndex((o) => o.map === 'lbn_svcs6' && o.op === 'delete'), 'the new keys written before the old ones go');
});

/** The slots whose backend differs between two states' nft flow-hash tables of a service (the flows a change moves). */
function movedSlots(a: ForwardService, b: ForwardService): number {
  const ta = flowHashSlots(normalizeState({ services: [a] }).services[0]!);
  const tb = flowHashSlots(normalizeState({ services: [b] }).services[0]!);
  if (ta.length !== tb.length) throw new Error('tables of two sizes');
  return ta.filter((x, i) => x.address !== tb[i]!.address).length;
}

/** n services on VIPs 10.1.x.y, each with the three backends; `down`: the services whose 10.0.0.13 is unhealthy. */
function many(n: number, down: ReadonlySet<number> = new Set()): ForwardService[] {
  return Array.from({ length: n }, (_, i) => web(down.has(i) ? all.slice(0, 2) : all, {
    key: `ns/s${String(i).padStart(4, '0')}`, vip: `10.1.${i >> 8}.${i & 255}`,
  }));
}

t.test('a health transition among many services writes the same few entries whatever their number', async (t) => {
  const writes: number[] = [];
  for (const n of [3, 300]) {
    const before = natPlan({ services: many(n) }, l);
    const { maps, model } = loaded(before);
    const after = natPlan({ services: many(n, new Set([1])) }, l, before);
    t.equal(after.services.filter((s, i) => s !== before.services[i]).length, 1, `${n} services: one service's plan is new, the others are kept as they were`);
    const d = natDelta(maps, after, l)!;
    t.equal(d.changed, 2, `${n} services: the two ports of the one service`);
    model.writes = 0;
    model.play(d.ops);
    writes.push(model.writes);
    const port = after.services[1]!.ports[0]!;
    t.notOk(model.table(port.key).includes('10.0.0.13'), `${n} services: no slot names the backend taken out`);
    t.same(model.table(port.key), flowHashSlots(normalizeState({ services: [many(n, new Set([1]))[1]!] }).services[0]!).map((s) => s.address), `${n} services: the port's table is nft's`);
    // Nothing of any other service was written: its entries are the ones the load wrote.
    const other = after.services[0]!.ports[0]!;
    t.same(model.table(other.key), flowHashSlots(normalizeState({ services: [many(n)[0]!] }).services[0]!).map((s) => s.address));
    t.same(natDelta(d.maps, after, l)!.ops, [], `${n} services: the same plan again writes nothing`);
  }
  t.equal(writes[0], writes[1], `the same entries written at 3 and at 300 services (${writes.join(', ')})`);
  // On each port: the slots 10.0.0.13 held, rewritten where they are, and its member entry (unhealthy); no svc entry.
  const slots = flowHashSlots(normalizeState({ services: [many(1, new Set([0]))[0]!] }).services[0]!).length;
  const moved = movedSlots(many(1)[0]!, many(1, new Set([0]))[0]!);
  t.equal(writes[0], 2 * moved + 2, `two ports: ${moved} moved slots of ${slots} and a member entry each`);
  const held = flowHashSlots(normalizeState({ services: [many(1)[0]!] }).services[0]!).filter((x) => x.address === '10.0.0.13').length;
  t.equal(moved, held, `only the slots 10.0.0.13 held move (${held} of ${slots}: weight 2 of 4)`);
});

t.test('slot tables: a byte a slot up to 256 backends, wider past that', async (t) => {
  const indices = [0, 255, 7, 1];
  for (const [backends, kind] of [[2, Uint8Array], [256, Uint8Array], [257, Uint16Array], [0x10000, Uint16Array], [0x10001, Uint32Array]] as const) {
    const table = natSlotTable(indices, backends);
    t.ok(table instanceof kind, `${backends} backends: a ${kind.name}`);
    t.same([...table], indices, `${backends} backends: every index kept`);
  }
  t.same([...natSlotTable([0, 300, 65535], 0x10000)], [0, 300, 65535], 'the largest index of a Uint16Array kept');
  const plan = natPlan({ services: [web(all)] }, l);
  const table = plan.services[0]!.ports[0]!.table;
  t.ok(table instanceof Uint8Array, 'a service of three backends keeps a byte a slot');
  t.equal(table.byteLength, flowHashSlots(normalizeState({ services: [web(all)] }).services[0]!).length);
  // 257 backends: 65,521 slots of two bytes, each naming the backend nft's table names.
  const wide = Array.from({ length: 257 }, (_, i) => b(`10.2.${i >> 8}.${i & 255}`));
  const big = natPlan({ services: [web(wide, { backends: wide, ports: [web(all).ports[0]!] })] }, l);
  const port = big.services[0]!.ports[0]!;
  t.ok(port.table instanceof Uint16Array, '257 backends: two bytes a slot');
  const { model } = loaded(big);
  t.same(model.table(port.key), flowHashSlots(normalizeState({ services: [web(wide, { backends: wide })] }).services[0]!).map((x) => x.address), 'every slot names the backend nft\'s flow-hash table names');
});

t.test('services of the same backends and health share one slot table, within a plan and from the plan before', async (t) => {
  const before = natPlan({ services: many(30, new Set([1])) }, l);
  const table = (p: NatPlan, i: number): unknown => p.services[i]!.ports[0]!.table;
  t.equal(table(before, 0), table(before, 2), 'two services of the same backends and health: one table');
  t.equal(before.services[0]!.ports[1]!.table, table(before, 0), 'a service\'s ports: one table');
  t.not(table(before, 1), table(before, 0), 'a backend down: a table of its own');
  t.equal(new Set(before.services.map((s) => s.ports[0]!.table)).size, 2, '30 services of two shapes: two tables');
  const { maps, model } = loaded(before);
  // Service 2 goes to service 1's shape: it takes that table, from the plan before.
  const after = natPlan({ services: many(30, new Set([1, 2])) }, l, before);
  t.equal(table(after, 2), table(before, 1), 'a service turned to the shape of another takes the table the plan before holds');
  t.equal(table(after, 0), table(before, 0), 'the others keep theirs');
  const d = natDelta(maps, after, l)!;
  model.play(d.ops);
  for (const i of [0, 1, 2]) {
    t.same(model.table(after.services[i]!.ports[0]!.key), flowHashSlots(normalizeState({ services: [many(30, new Set([1, 2]))[i]!] }).services[0]!).map((x) => x.address), `service ${i}: every slot is nft's`);
  }
  t.ok(d.ops.every((o) => !('base' in o) || o.op === 'patch'), 'the service whose table is shared still has its slots rewritten where they are');
  const weighted = natPlan({ services: [web(all), web(all.map((x) => b(x.address, 3)), { key: 'ns/heavy', vip: '10.0.0.51' })] }, l);
  t.not(weighted.services[0]!.ports[0]!.table, weighted.services[1]!.ports[0]!.table, 'the same addresses of other weights: another table');
  const reordered = natPlan({ services: [web(all), web([...all].reverse(), { key: 'ns/rev', vip: '10.0.0.52', backends: [...all].reverse() })] }, l);
  t.equal(reordered.services[0]!.ports[0]!.table, reordered.services[1]!.ports[0]!.table, 'the same backends given in another order: one table (the plan takes them sorted)');
  const fewer = natPlan({ services: [web(all), web(all.slice(0, 2), { key: 'ns/two', vip: '10.0.0.53', backends: all.slice(0, 2) })] }, l);
  t.not(fewer.services[0]!.ports[0]!.table, fewer.services[1]!.ports[0]!.table, 'other backends: another table');
});

t.test('a backend comes back healthy: member first, then slots; goes: slots first, then member', async (t) => {
  const up = natPlan({ services: [web(all)] }, l);
  const down = natPlan({ services: [web(all.slice(0, 2))] }, l, up);
  const { maps } = loaded(up);
  const d1 = natDelta(maps, down, l)!;
  t.same(d1.ops.map((o) => `${o.map}:${o.op}`), ['lbn_slots:patch', 'lbn_slots:patch', 'lbn_members:put', 'lbn_members:put'], 'taken out: the slots that named it rewritten where they are, then the members marked');
  const back = natPlan({ services: [web(all)] }, l, down);
  const d2 = natDelta(d1.maps, back, l)!;
  t.same(d2.ops.map((o) => `${o.map}:${o.op}`), ['lbn_members:put', 'lbn_members:put', 'lbn_slots:patch', 'lbn_slots:patch'], 'back: the members marked, then the tables');
  const moved = movedSlots(web(all), web(all.slice(0, 2)));
  t.same([d1.ops[0]!, d2.ops[2]!].map((o) => natOpWrites(o)), [moved, moved], `out and back: the ${moved} slots 10.0.0.13 held, each way`);
  const counters = (m: NatMaps): number[][] => [...m.ports.values()].map((p) => [...p.counters]);
  t.same(counters(d2.maps), counters(maps), 'every (port, backend) keeps its counter index through both');
  t.notOk(d2.ops.some((o) => o.map === 'lbn_counters'), 'no counter retired by a health change');
});

t.test('a backend removed: its member entries and counters go after the tables no longer name it; a service removed: all of it', async (t) => {
  const before = natPlan({ services: [web(all), web(all, { key: 'default/other', vip: '10.0.0.60' })] }, l);
  const { maps, model } = loaded(before);
  const slotsBefore = model.slots.size;
  const after = natPlan({ services: [web(all.slice(0, 2), { backends: all.slice(0, 2) })] }, l, before);
  const d = natDelta(maps, after, l)!;
  model.play(d.ops);
  t.equal(model.svcs.size, 2, 'the other service\'s two ports deleted');
  t.equal(model.members.size, 4, 'two backends on each of web\'s ports');
  t.equal(model.retired.length, 2 + 6, 'counters retired: 10.0.0.13 on two ports, and the other service\'s six');
  t.match(model.retired, [/:default\/web:TCP\/80:10\.0\.0\.13$/]);
  const kinds = d.ops.map((o) => o.map + ':' + o.op);
  t.ok(kinds.lastIndexOf('lbn_svcs:put') < kinds.indexOf('lbn_svcs:delete') && kinds.indexOf('lbn_svcs:delete') < kinds.indexOf('lbn_members:delete')
    && kinds.lastIndexOf('lbn_members:delete') < kinds.indexOf('lbn_counters:retire'), `in order: ${[...new Set(kinds)].join(' ')}`);
  const total = d.maps.freeSlots.reduce((s, [, n]) => s + n, 0);
  t.equal(total + [...d.maps.ports.values()].reduce((s, p) => s + p.plan.table.length, 0), d.maps.capacity.slots, 'every slot either a port\'s or free: old ranges given back');
  t.ok(slotsBefore > 0);
  // Retired indices are reused last, after the never-used ones.
  const again = natPlan({ services: [web(all)] }, l, after);
  const d2 = natDelta(d.maps, again, l)!;
  const tcp = d2.maps.ports.get('default/web\nTCP/80')!;
  t.ok(tcp.counters[2]! >= maps.nextCounter, `10.0.0.13 back on web: a counter never used (${tcp.counters[2]}), not a retired one`);
});

t.test('another service takes a removed service\'s VIP and port in the same change: its entries are not deleted', async (t) => {
  const before = natPlan({ services: [web(all)] }, l);
  const { maps, model } = loaded(before);
  const after = natPlan({ services: [web(all, { key: 'default/new' })] }, l, before);
  const d = natDelta(maps, after, l)!;
  // The port's member entries take the new service's counters before its table does: for that instant a new flow counts to the old service.
  model.checkCounters = false;
  model.play(d.ops);
  model.checkCounters = true;
  for (const k of model.svcs.keys()) model.consistent(k);
  t.equal(model.svcs.size, 2, 'both ports forwarded, for the new service');
  t.equal(model.members.size, 6);
  t.equal(model.retired.length, 6, 'the old service\'s counters retired');
  // A service whose VIP changes: its old keys go, its new ones come.
  const moved = natPlan({ services: [web(all, { key: 'default/new', vip: '10.0.0.70' })] }, l, after);
  const d2 = natDelta(d.maps, moved, l)!;
  model.play(d2.ops);
  t.same([...model.svcs.keys()].sort(), moved.services[0]!.ports.map((p) => hex(p.key)).sort(), 'only the new VIP\'s ports');
  t.equal(model.members.size, 6);
});

t.test('a plan the maps have no room for is refused whole (the driver loads maps sized for it)', async (t) => {
  const small = natPlan({ services: many(2) }, l);
  const { maps } = loaded(small);
  const big = natPlan({ services: many(200) }, l, small);
  t.equal(natDelta(maps, big, l), undefined, 'no room: undefined, nothing to write');
  const cap = natCapacity(big);
  t.ok(cap.slots >= 2 * big.services.reduce((s, x) => s + x.ports.reduce((a, p) => a + p.table.length, 0), 0), 'capacity: twice the slots');
  // Every one of the 200 services flapping one at a time fits the maps sized for them.
  let m = natDelta(emptyNatMaps(cap), big, l)!.maps;
  let plan = big;
  for (let i = 0; i < 200; i++) {
    const next = natPlan({ services: many(200, new Set([i])) }, l, plan);
    const d = natDelta(m, next, l);
    if (!d) { t.fail(`no room at flap ${i}`); break; }
    m = d.maps;
    plan = next;
  }
  t.equal(m.ports.size, 400);
});

t.test('the model catches a write order the program could see half-done', async (t) => {
  const up = natPlan({ services: [web(all)] }, l);
  const down = natPlan({ services: [web(all.slice(0, 2))] }, l, up);
  const { maps } = loaded(up);
  // Eleven backends: a table of another size (4093 slots), which goes into a new range.
  const eleven = Array.from({ length: 11 }, (_, i) => b(`10.0.0.${11 + i}`));
  const ops = natDelta(maps, natPlan({ services: [web(eleven, { backends: eleven })] }, l, up), l)!.ops;
  const svcFirst = [...ops.filter((o) => o.map === 'lbn_svcs'), ...ops.filter((o) => o.map !== 'lbn_svcs')];
  t.throws(() => loaded(up).model.play(svcFirst), /slot \d+ names|not written/, 'a port pointed at its new range before the slots are there');
  // A backend added within the same table size: its slots rewritten in place, after its member entries.
  const more = [...all, b('10.0.0.14')];
  const added = natDelta(maps, natPlan({ services: [web(more, { backends: more })] }, l, up), l)!.ops;
  t.same([...new Set(added.map((o) => `${o.map}:${o.op}`))], ['lbn_members:put', 'lbn_slots:patch'], 'a backend added: its member entries, then the slots it takes, in place');
  const patchFirst = [...added.filter((o) => o.op === 'patch'), ...added.filter((o) => o.op !== 'patch')];
  t.throws(() => loaded(up).model.play(patchFirst), /has no member entry/, 'a slot rewritten in place to a backend whose member entry is not there yet');
  const whole = added.map((o) => (o.op === 'patch' ? { map: o.map, op: 'put' as const, base: o.base, table: o.table, values: o.values } : o));
  t.throws(() => loaded(up).model.play(whole), /a new table written over slots/, 'a table written whole over the range its port reads');
  const back = natPlan({ services: [web(all)] }, l, down);
  const d1 = natDelta(maps, down, l)!;
  const m = loaded(up).model;
  m.play(d1.ops);
  const backOps = natDelta(d1.maps, back, l)!.ops;
  const membersLast = [...backOps.filter((o) => o.map !== 'lbn_members'), ...backOps.filter((o) => o.map === 'lbn_members')];
  // Every member is still there (marked unhealthy), so only a missing entry would fail: a member deleted first must.
  t.doesNotThrow(() => m.play(membersLast), 'marking healthy late leaves no slot without its member');
  const removed = natPlan({ services: [web(all.slice(0, 2), { backends: all.slice(0, 2) })] }, l);
  const fresh = loaded(up);
  const rm = natDelta(fresh.maps, removed, l)!.ops;
  const deletesFirst = [...rm.filter((o) => o.op === 'delete'), ...rm.filter((o) => o.op !== 'delete')];
  t.throws(() => fresh.model.play(deletesFirst), /has no member entry/, 'a member deleted while the old table still names it');
});

/** A seeded PRNG (mulberry32): the same transitions on every run. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/** What the program reads for each port of the model: target port, seed, slot table by address, members and their health. */
function view(model: Model): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const six of [false, true]) {
    const members = six ? model.members6 : model.members;
    for (const [k, v] of six ? model.svcs6 : model.svcs) {
      const svc = l.decode('lbn_svc', v);
      const own = [...members].filter(([mk]) => mk.startsWith(k)).map(([mk, mv]) => `${backendText(l.decode(of('lbn_member_key', six), Buffer.from(mk, 'hex'))['backend'])}:${String(l.decode('lbn_member', mv)['healthy'])}`).sort();
      out[k] = { target: svc['target_port'], seed: svc['seed'], table: model.table(Buffer.from(k, 'hex')), members: own };
    }
    const ports = new Set((six ? model.svcs6 : model.svcs).keys());
    for (const mk of members.keys()) if (![...ports].some((k) => mk.startsWith(k))) out[`stray ${mk}`] = true;
  }
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

t.test('random transitions: every write leaves the maps consistent, and each state is what a full load of its plan holds', async (t) => {
  const pool = ['10.0.0.11', '10.0.0.12', '10.0.0.13', '10.0.0.14', '10.0.0.15'];
  const pool6 = ['fd00::11', 'fd00::12', 'fd00::13', 'fd00::14'];
  const portsOf = [
    { name: 'http', port: 80, protocol: 'TCP' as const, targetPort: 8080 },
    { name: 'dns', port: 53, protocol: 'UDP' as const, targetPort: 5353 },
    { name: 'alt', port: 8443, protocol: 'TCP' as const, targetPort: 443 },
  ];
  for (const seed of [1, 2, 3]) {
    const r = rng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    // Each service's VIPs are its own (10.2.i.x, fd00:2:i::x): no two services ever claim one port.
    type Svc = { key: string; six: boolean; vip: number; configured: Map<string, number>; down: Set<string>; ports: typeof portsOf; target: number };
    const svcs: Svc[] = Array.from({ length: 5 }, (_, i) => ({
      key: `r/s${i}`, six: i === 4, vip: 1, configured: new Map((i === 4 ? pool6 : pool).slice(0, 2 + (i % 3)).map((a) => [a, 1])), down: new Set<string>(), ports: portsOf.slice(0, 1 + (i % 2)), target: 0,
    }));
    const state = (): ForwardService[] => svcs.filter((s) => s.configured.size > 0).map((s, i) => {
      const backends = [...s.configured].map(([a, w]) => b(a, w));
      return {
        key: s.key, vip: s.six ? `fd00:2:${i}::${s.vip}` : `10.2.${i}.${s.vip}`, backends, healthy: backends.filter((x) => !s.down.has(x.address)),
        ports: s.ports.map((p) => ({ ...p, targetPort: p.targetPort + s.target })),
      };
    });
    const moves: Array<[string, (s: Svc) => void]> = [
      ['health', (s) => { const a = pick([...s.configured.keys()]); if (s.down.has(a)) s.down.delete(a); else s.down.add(a); }],
      ['health', (s) => { const a = pick([...s.configured.keys()]); if (s.down.has(a)) s.down.delete(a); else s.down.add(a); }],
      ['health', (s) => { const a = pick([...s.configured.keys()]); if (s.down.has(a)) s.down.delete(a); else s.down.add(a); }],
      ['backend added', (s) => { const a = pick(s.six ? pool6 : pool); if (!s.configured.has(a)) s.configured.set(a, 1); }],
      ['backend removed', (s) => { if (s.configured.size > 1) { const a = pick([...s.configured.keys()]); s.configured.delete(a); s.down.delete(a); } }],
      ['weight', (s) => { const a = pick([...s.configured.keys()]); s.configured.set(a, 1 + Math.floor(r() * 3)); }],
      ['ports', (s) => { s.ports = portsOf.slice(0, 1 + Math.floor(r() * 3)); }],
      ['target port', (s) => { s.target = s.target === 0 ? 1 : 0; }],
      ['VIP', (s) => { s.vip = s.vip === 1 ? 2 : 1; }],
    ];
    let plan = natPlan({ services: state() }, l);
    let { maps, model } = loaded(plan);
    const seen = new Set<string>();
    let patched = 0;
    let reloads = 0;
    let steps = 0;
    for (let step = 0; step < 60; step++, steps++) {
      const [what, move] = pick(moves);
      seen.add(what);
      move(pick(svcs));
      const next = natPlan({ services: state() }, l, plan);
      const d = natDelta(maps, next, l);
      if (d !== undefined && d.ops.length > 0 && natDelta(d.maps, next, l)?.ops.length !== 0) {
        t.fail(`seed ${seed}, step ${step} (${what}): the same plan again writes something`);
        break;
      }
      if (d === undefined) {
        // No room: the driver loads maps sized for the plan.
        ({ maps, model } = loaded(next));
        reloads++;
      } else {
        const before = model.patches;
        try {
          model.play(d.ops);
        } catch (err) {
          t.fail(`seed ${seed}, step ${step} (${what}): ${(err as Error).message}`);
          break;
        }
        patched += model.patches - before;
        maps = d.maps;
      }
      plan = next;
      // Against a full load of the same plan every tenth step and at the end (a load is most of the test's time).
      if (step % 10 !== 9) continue;
      const full = loaded(natPlan({ services: state() }, l)).model;
      const [got, want] = [view(model), view(full)];
      if (JSON.stringify(got) !== JSON.stringify(want)) {
        t.same(got, want, `seed ${seed}, step ${step} (${what}): the maps read as a full load of the plan`);
        break;
      }
    }
    const used = [...maps.ports.values()].reduce((n, p) => n + p.plan.table.length, 0);
    t.equal(maps.freeSlots.reduce((n, [, k]) => n + k, 0) + maps.freeSlots6.reduce((n, [, k]) => n + k, 0) + used, maps.capacity.slots + maps.capacity.slots6, `seed ${seed}: every slot either a port's or free`);
    t.equal(steps, 60, `seed ${seed}: every step taken`);
    t.ok(patched > 0, `seed ${seed}: slots rewritten in place (${patched}), each checked; ${reloads} reload(s) for room; moves: ${[...seen].join(', ')}`);
  }
});
