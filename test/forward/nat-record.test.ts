// nat-record.ts: a record of what the maps hold, through JSON (as it is kept
// beside them), and a new process's plan: the writes natDelta then makes are
// those an in-process delta of the same change makes, and none for the same
// plan.
import t from 'tap';
import { parseIPv4 } from '../../agent/address';
import type { BackendSpec } from '../../agent/config/types';
import type { ForwardService } from '../../agent/forward/dataplane';
import { emptyNatMaps, natCapacity, natDelta, natPlan, type NatOp, type NatPlan } from '../../agent/forward/nat-plan';
import { natPortDigest, natRecord, natRecordText, natRecordedMaps, type NatRecord } from '../../agent/forward/nat-record';
import { natLayout } from '../../agent/net/ebpf/nat-layout';

const l = natLayout();
const b = (address: string): BackendSpec => (address.includes(':') ? { address, addressNum: 0, family: 'IPv6', weight: 1 } : { address, addressNum: parseIPv4(address)!, weight: 1 });
const all = [b('10.0.0.11'), b('10.0.0.12'), b('10.0.0.13')];
const all6 = [b('fd00::11'), b('fd00::12')];
function services(n: number, change: (i: number) => Partial<ForwardService> = () => ({})): ForwardService[] {
  return [
    ...Array.from({ length: n }, (_, i): ForwardService => ({
      key: `ns/s${i}`, vip: `10.1.0.${i + 1}`, backends: all, healthy: all,
      ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }], ...change(i),
    })),
    { key: 'ns/six', vip: 'fd00::50', backends: all6, healthy: all6, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }] },
  ];
}
const plan = (s: ForwardService[], prev?: NatPlan): NatPlan => natPlan({ services: s }, l, prev);
/** A record as the next process reads it: through JSON. */
const kept = (r: NatRecord): NatRecord => JSON.parse(JSON.stringify(r)) as NatRecord;
const keys = (ops: readonly NatOp[]): string[] => ops.map((o) => ('key' in o ? `${o.map} ${o.op} ${o.key.toString('hex')}` : 'base' in o ? `${o.map} ${o.op} ${o.table.length}` : `${o.map} ${o.op} ${o.index}`));

/** Not a slot table's write, nor the svc entry that points at a new one. */
const notTable = (o: NatOp): boolean => !('base' in o) && !(o.map.startsWith('lbn_svcs') && o.op === 'put');

const a = plan(services(10));
const first = natDelta(emptyNatMaps(natCapacity(a)), a, l)!;
const record = kept(natRecord(first.maps, { prog: 7 }));

t.test('the same plan from a new process: no write', async (t) => {
  const fresh = plan(services(10));
  t.not(fresh.services[0], a.services[0], 'a new process\'s plan objects are its own');
  const d = natDelta(natRecordedMaps(record, fresh), fresh, l)!;
  t.same(d.ops, [], 'nothing written');
  t.equal(d.changed, 0);
  t.equal(record.ports.length, 21, 'every port recorded (20 IPv4, one IPv6)');
  t.same(record.identity, { prog: 7 }, 'with the identity the driver checks');
});

t.test('one backend out of one service: the writes an in-process delta of that change makes', async (t) => {
  const out = (i: number): Partial<ForwardService> => (i === 3 ? { healthy: all.slice(0, 2) } : {});
  const inProcess = natDelta(first.maps, plan(services(10, out), a), l)!;
  const fresh = plan(services(10, out));
  const d = natDelta(natRecordedMaps(record, fresh), fresh, l)!;
  t.equal(d.changed, 2, 'the service\'s two ports');
  t.same(keys(d.ops.filter(notTable)), keys(inProcess.ops.filter(notTable)), 'the same member writes, in the same order');
  // A record holds no slot table: the changed ports' tables are written whole in new ranges (in process: the moved slots, in place).
  t.same(keys(d.ops.filter((o) => !notTable(o))), ['lbn_slots put 1021', 'lbn_slots put 1021', 'lbn_svcs put 0a01000400500600', 'lbn_svcs put 0a01000400351100']);
  t.same(keys(inProcess.ops.filter((o) => !notTable(o))), ['lbn_slots patch 1021', 'lbn_slots patch 1021']);
  t.same([...d.maps.ports.keys()].sort(), [...inProcess.maps.ports.keys()].sort());
  for (const [id, p] of inProcess.maps.ports) {
    if (!id.startsWith('ns/s3\n')) t.equal(d.maps.ports.get(id)!.base, p.base, `${id.replace('\n', ' ')}: its slots at the same base`);
    t.same(d.maps.ports.get(id)!.counters, p.counters, `${id.replace('\n', ' ')}: the same counters`);
  }
});

t.test('a backend replaced and a service removed: its entries deleted, its counters retired', async (t) => {
  const next = (s: ForwardService[]): ForwardService[] => s.filter((x) => x.key !== 'ns/s9').map((x) => (x.key === 'ns/s0' ? { ...x, backends: [all[0]!, all[1]!, b('10.0.0.14')], healthy: [all[0]!, all[1]!, b('10.0.0.14')] } : x));
  const inProcess = natDelta(first.maps, plan(next(services(10)), a), l)!;
  const fresh = plan(next(services(10)));
  const d = natDelta(natRecordedMaps(record, fresh), fresh, l)!;
  t.equal(d.changed, 4, 'two ports changed, two removed');
  t.same(keys(d.ops.filter(notTable)), keys(inProcess.ops.filter(notTable)), 'the same member writes, deletes and retirements, in order');
  t.ok(d.ops.some((o) => o.op === 'delete' && o.map === 'lbn_svcs'), 'the removed service\'s svc entries deleted');
  t.ok(d.ops.some((o) => o.op === 'retire'), 'counters retired');
  t.equal(d.maps.nextCounter, inProcess.maps.nextCounter);
  t.same(d.maps.freeCounters, inProcess.maps.freeCounters);
});

t.test('a port\'s digest changes with what its entries are made of, and only with that', async (t) => {
  const [p] = plan(services(1)).services[0]!.ports;
  t.equal(natPortDigest(p!), natPortDigest(plan(services(1)).services[0]!.ports[0]!), 'the same inputs: the same digest');
  for (const [what, change] of [
    ['health', { healthy: all.slice(1) }], ['target port', { ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 9090 }] }],
    ['backends', { backends: [...all, b('10.0.0.14')] }], ['VIP', { vip: '10.1.0.99' }],
  ] as const) {
    t.not(natPortDigest(plan(services(1, () => change)).services[0]!.ports[0]!), natPortDigest(p!), `${what} changes it`);
  }
});

t.test('a port\'s digest is the same whichever array width holds its slot table', async (t) => {
  const [p] = plan(services(1)).services[0]!.ports;
  t.ok(p!.table instanceof Uint8Array);
  t.equal(natPortDigest({ ...p!, table: Uint32Array.from(p!.table) }), natPortDigest(p!), 'the same indices in a Uint32Array: the same digest');
  t.equal(natPortDigest({ ...p!, table: Uint16Array.from(p!.table) }), natPortDigest(p!), 'in a Uint16Array: the same digest');
});

t.test('the record as text reads back as the record, after a load and after a change of one port\'s service', async (t) => {
  const id = { prog: 7, maps: { lbn_svcs: 3 } };
  t.same(JSON.parse(natRecordText(first.maps, id)), kept(natRecord(first.maps, id)), 'after a load');
  const out = natDelta(first.maps, plan(services(10, (i) => (i === 3 ? { healthy: all.slice(0, 2) } : {})), a), l)!;
  const text = natRecordText(out.maps, id);
  t.same(JSON.parse(text), kept(natRecord(out.maps, id)), 'after a delta: the changed ports\' text made again, the others\' kept');
  const port = JSON.parse(text) as NatRecord;
  t.same(port.ports.find((p) => p.id === 'ns/s3\nTCP/80')!.healthy, [true, true, false], 'the changed port as it is now');
});
