// Unit tests of the lease model: RFC 2131 §4.4.5 timers, the on-disk form
// across a restart (different monotonic clock), and rejection of files that
// do not hold a usable lease.
import t from 'tap';
import { decodeDhcp, encodeDhcp, type DhcpOption } from '../../agent/dhcp/codec';
import { INFINITE_LEASE, fromStored, leaseDetails, leaseFileName, leaseFromAck, leaseTimes, toStored, type Lease, type StoredLease } from '../../agent/dhcp/lease';
import { parseIPv4 } from '../../agent/address';

const ip = (s: string): number => parseIPv4(s)!;

function fields(opts: DhcpOption[]): NonNullable<ReturnType<typeof decodeDhcp> & { ok: true }>['value']['fields'] {
  const d = decodeDhcp(encodeDhcp({ op: 2, xid: 1, chaddr: '02:00:00:00:00:01', options: [{ code: 53, data: Buffer.from([5]) }, ...opts] }));
  if (!d.ok) throw new Error(d.reason);
  return d.value.fields;
}
const u32 = (code: number, v: number): DhcpOption => { const d = Buffer.alloc(4); d.writeUInt32BE(v >>> 0); return { code, data: d }; };

t.test('leaseTimes: RFC 2131 §4.4.5 defaults and server values', async (t) => {
  t.same(leaseTimes(3600, undefined, undefined), { t1: 1800, t2: 3150 });
  t.same(leaseTimes(3600, 1000, 2000), { t1: 1000, t2: 2000 });
  t.same(leaseTimes(3600, undefined, 1000), { t1: 1000, t2: 1000 }, 'T1 never after T2');
  t.same(leaseTimes(3600, 3000, 2000), { t1: 1800, t2: 2000 }, 'T1 beyond T2: default');
  t.same(leaseTimes(3600, 100, 3600), { t1: 100, t2: 3150 }, 'T2 not before expiry: default');
  t.same(leaseTimes(INFINITE_LEASE, 1, 2), { t1: INFINITE_LEASE, t2: INFINITE_LEASE });
});

t.test('leaseFromAck', async (t) => {
  const f = fields([u32(54, ip('10.99.0.2')), u32(51, 600), u32(1, 0xffffff00), u32(3, ip('10.99.0.1')), u32(6, ip('10.99.0.53'))]);
  const l = leaseFromAck(ip('10.99.0.101'), f, '52:54:00:aa:00:01', undefined, 5000)!;
  t.equal(l.obtainedAt, 5000);
  t.equal(l.renewAt, 5000 + 300_000);
  t.equal(l.rebindAt, 5000 + 525_000);
  t.equal(l.expiresAt, 5000 + 600_000);
  t.equal(l.prefix, 24);
  t.same(l.routers, [ip('10.99.0.1')]);
  t.equal(leaseFromAck(ip('10.99.0.101'), fields([u32(54, 1)]), undefined, undefined, 0), undefined, 'no lease time');
  t.equal(leaseFromAck(0, f, undefined, undefined, 0), undefined, 'no address');
  t.equal(leaseFromAck(1, fields([u32(51, 60)]), undefined, 7, 0)!.serverId, 7, 'server id from the exchange when the ACK lacks one');
  t.equal(leaseFromAck(1, fields([u32(51, 60)]), undefined, undefined, 0), undefined, 'no server id at all');
});

const lease: Lease = {
  address: ip('10.99.0.101'), prefix: 24, serverId: ip('10.99.0.2'), serverMac: '52:54:00:aa:00:01',
  routers: [ip('10.99.0.1')], dns: [], leaseSeconds: 600, t1Seconds: 300, t2Seconds: 525,
  obtainedAt: 1000, renewAt: 301_000, rebindAt: 526_000, expiresAt: 601_000,
};
const KEY = 'default/web';
const MAC = '02:aa:bb:cc:dd:ee';

t.test('stored form survives a restart with another monotonic clock', async (t) => {
  const wallA = Date.UTC(2026, 0, 1) - 1000; // process A: now()=1000 is 2026-01-01T00:00:00Z
  const doc = JSON.parse(JSON.stringify(toStored(lease, KEY, MAC, wallA))) as StoredLease;
  t.equal(doc.obtained, '2026-01-01T00:00:00.000Z');
  t.equal(doc.address, '10.99.0.101');
  t.equal(doc.expiresAtMs, Date.UTC(2026, 0, 1) + 600_000);
  const wallB = Date.UTC(2026, 0, 1) - 50; // process B started later: its now() runs on another base
  const back = fromStored(doc, KEY, MAC, wallB)!;
  t.equal(back.expiresAt + wallB, lease.expiresAt + wallA, 'same wall-clock expiry');
  t.equal(back.renewAt - back.obtainedAt, 300_000);
  t.same(back.routers, lease.routers);
  t.equal(back.serverMac, lease.serverMac);
  const inf = { ...lease, leaseSeconds: INFINITE_LEASE, renewAt: Infinity, rebindAt: Infinity, expiresAt: Infinity };
  const infDoc = JSON.parse(JSON.stringify(toStored(inf, KEY, MAC, 0))) as StoredLease;
  t.equal(infDoc.expiresAtMs, null);
  t.equal(fromStored(infDoc, KEY, MAC, 0)!.expiresAt, Infinity);
});

t.test('files that are not a usable lease of this service are no lease', async (t) => {
  const good = JSON.parse(JSON.stringify(toStored(lease, KEY, MAC, 0))) as StoredLease;
  t.ok(fromStored(good, KEY, MAC, 0));
  const bad: unknown[] = [
    null, 42, 'x', [], {},
    { ...good, version: 2 },
    { ...good, service: 'other/web' },
    { ...good, mac: '02:00:00:00:00:00' },
    { ...good, address: '10.99.0.300' },
    { ...good, address: '0.0.0.0' },
    { ...good, serverId: 5 },
    { ...good, leaseSeconds: -1 },
    { ...good, renewAtMs: 'soon' },
    { ...good, routers: ['x'] },
    { ...good, serverMac: 'nope' },
    { ...good, prefix: 33 },
    { ...good, renewAtMs: good.expiresAtMs! + 1 },
  ];
  for (const b of bad) t.equal(fromStored(b, KEY, MAC, 0), undefined, JSON.stringify(b)?.slice(0, 80));
});

t.test('file names and status details', async (t) => {
  t.equal(leaseFileName('default/web'), 'dhcp-default_web.json');
  t.equal(leaseFileName('kube-system/a.b_c'), 'dhcp-kube-system_a.b_c.json');
  t.match(leaseFileName('x'.repeat(400)), /^dhcp-x{180}\.json$/);
  const d = leaseDetails(lease, Date.UTC(2026, 0, 1) - 1000);
  t.same(d, {
    address: '10.99.0.101', prefix: 24, server: '10.99.0.2', leaseSeconds: 600,
    obtained: '2026-01-01T00:00:00.000Z', renewAt: '2026-01-01T00:05:00.000Z', rebindAt: '2026-01-01T00:08:45.000Z',
    expiresAt: '2026-01-01T00:10:00.000Z', routers: ['10.99.0.1'], dns: [],
  });
});
