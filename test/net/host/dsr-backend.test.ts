// The backend side of direct server return (net/host/dsr-backend.ts): the plan
// over lo's addresses (add ours, adopt what is there, remove only marked
// leftovers, never the operator's), and the driver against an in-memory
// netlink and a temporary sysctl tree: sysctls before any VIP, raised and
// never lowered, nothing added when they cannot be set. The real kernel is
// test/privileged/forward-dsr.test.ts (a backend VM running the agent).
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { silentLogger } from '../../../agent/log';
import type { AddressInfo, LinkInfo } from '../../../agent/net/netlink/netlink';
import { OWNED_ADDRESS_PROTO } from '../../../agent/net/ownership/ownership';
import { BackendVips, planBackendVips } from '../../../agent/net/host/dsr-backend';

const lo = (address: string, proto?: number, prefix = 32): AddressInfo => ({ index: 1, address, prefix, ...(proto !== undefined ? { proto } : {}) });

t.test('plan: add the missing, keep what is there, remove only our marked leftovers', async (t) => {
  const p = planBackendVips(['10.0.0.50', '10.0.0.51'], [lo('127.0.0.1', undefined, 8), lo('10.0.0.51', OWNED_ADDRESS_PROTO), lo('10.0.0.60', OWNED_ADDRESS_PROTO), lo('10.0.0.61')]);
  t.same(p.add, ['10.0.0.50']);
  t.same(p.keep.map((a) => a.address), ['10.0.0.51']);
  t.same(p.remove.map((a) => a.address), ['10.0.0.60'], 'the unmarked 10.0.0.61 is the operator\'s: left alone');
  t.same(planBackendVips([], [lo('127.0.0.1', undefined, 8)]), { add: [], remove: [], keep: [] });
  t.same(planBackendVips(['10.0.0.61'], [lo('10.0.0.61')]).keep.map((a) => a.address), ['10.0.0.61'], 'a VIP put there by hand is adopted as is');
});

class FakeNetlink {
  addrs: AddressInfo[] = [lo('127.0.0.1', undefined, 8)];
  calls: string[] = [];
  async getLink(): Promise<LinkInfo> { return { index: 1, name: 'lo', mac: '00:00:00:00:00:00', up: true, carrier: true, operState: 'unknown' }; }
  async listAddresses(): Promise<AddressInfo[]> { return [...this.addrs]; }
  async addAddress(index: number, ip: string, prefix: number, opts: { proto?: number } = {}): Promise<void> {
    this.calls.push(`add ${ip}/${prefix} proto ${opts.proto}`);
    this.addrs.push({ index, address: ip, prefix, ...(opts.proto !== undefined ? { proto: opts.proto } : {}) });
  }
  async removeAddress(_index: number, ip: string, prefix: number): Promise<boolean> {
    this.calls.push(`del ${ip}/${prefix}`);
    const before = this.addrs.length;
    this.addrs = this.addrs.filter((a) => a.address !== ip);
    return this.addrs.length < before;
  }
}

function sysctlRoot(t: { teardown(fn: () => void): void }, values: Record<string, number>): string {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-dsrb-'));
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  const dir = path.join(root, 'net', 'ipv4', 'conf', 'all');
  fs.mkdirSync(dir, { recursive: true });
  for (const [k, v] of Object.entries(values)) fs.writeFileSync(path.join(dir, k), `${v}\n`);
  return root;
}
const read = (root: string, key: string): string => fs.readFileSync(path.join(root, 'net', 'ipv4', 'conf', 'all', key), 'utf8').trim();

t.test('apply: the sysctls are raised, then the VIPs go on lo marked; a restart adopts them; withdraw takes ours off', async (t) => {
  const root = sysctlRoot(t, { arp_ignore: 0, arp_announce: 0 });
  const nl = new FakeNetlink();
  const b = new BackendVips({ netlink: nl, log: silentLogger(), sysctl: { root } });
  await b.apply(['10.0.0.50', '10.0.0.51']);
  t.same([read(root, 'arp_ignore'), read(root, 'arp_announce')], ['1', '2']);
  t.same(nl.calls, [`add 10.0.0.50/32 proto ${OWNED_ADDRESS_PROTO}`, `add 10.0.0.51/32 proto ${OWNED_ADDRESS_PROTO}`]);
  t.same(b.status().vips.map((v) => [v.address, v.state, v.owned]), [['10.0.0.50', 'on-lo', true], ['10.0.0.51', 'on-lo', true]]);
  t.same(b.status().sysctls, { arp_ignore: 1, arp_announce: 2 });

  // Another process (a restart) with one VIP fewer: adopts one, removes the other, adds nothing.
  nl.calls = [];
  const again = new BackendVips({ netlink: nl, log: silentLogger(), sysctl: { root } });
  await again.apply(['10.0.0.51']);
  t.same(nl.calls, ['del 10.0.0.50/32']);
  t.same(again.status().vips.map((v) => [v.address, v.state, v.owned]), [['10.0.0.51', 'on-lo', true]]);

  nl.addrs.push(lo('10.0.0.99'));
  await again.withdraw();
  t.same(nl.addrs.map((a) => a.address).sort(), ['10.0.0.99', '127.0.0.1'], 'only marked addresses are withdrawn');
  t.same([read(root, 'arp_ignore'), read(root, 'arp_announce')], ['1', '2'], 'the sysctls stay');
});

t.test('apply: a stricter arp_ignore is kept (raised only, never lowered)', async (t) => {
  const root = sysctlRoot(t, { arp_ignore: 2, arp_announce: 2 });
  await new BackendVips({ netlink: new FakeNetlink(), log: silentLogger(), sysctl: { root } }).apply(['10.0.0.50']);
  t.equal(read(root, 'arp_ignore'), '2');
});

t.test('apply: when the sysctls cannot be set, no VIP goes on lo (it would be answered for on the LAN)', async (t) => {
  const root = sysctlRoot(t, {}); // no arp_ignore file: like a /proc/sys that refuses
  const nl = new FakeNetlink();
  const b = new BackendVips({ netlink: nl, log: silentLogger(), sysctl: { root } });
  await t.rejects(b.apply(['10.0.0.50']), /the backend VIPs were not added: net\.ipv4\.conf\.all\.arp_ignore/);
  t.same(nl.calls, []);
  t.same(b.status().vips.map((v) => v.state), ['missing']);
  t.ok(b.status().problems.length > 0);
});

t.test('apply with no VIPs leaves the sysctls alone and removes our leftovers', async (t) => {
  const root = sysctlRoot(t, { arp_ignore: 0, arp_announce: 0 });
  const nl = new FakeNetlink();
  nl.addrs.push(lo('10.0.0.70', OWNED_ADDRESS_PROTO));
  await new BackendVips({ netlink: nl, log: silentLogger(), sysctl: { root } }).apply([]);
  t.same(nl.calls, ['del 10.0.0.70/32']);
  t.same([read(root, 'arp_ignore'), read(root, 'arp_announce')], ['0', '0']);
});

t.test('an IPv6 VIP goes on lo as a /128 and needs no ARP sysctl; a mixed list raises them for its IPv4 VIP', async (t) => {
  t.same(planBackendVips(['fd00::50'], [lo('::1', undefined, 128), lo('fd00::50', OWNED_ADDRESS_PROTO, 128)]).keep.map((a) => a.address), ['fd00::50'], 'a /128 on lo is the VIP in place');
  t.same(planBackendVips(['fd00::50'], [lo('fd00::50', undefined, 64)]).add, ['fd00::50'], 'a /64 is not');
  const root = sysctlRoot(t, {}); // no arp_ignore file: IPv6 alone never reads it
  const nl = new FakeNetlink();
  const b = new BackendVips({ netlink: nl, log: silentLogger(), sysctl: { root } });
  await b.apply(['fd00::50']);
  t.same(nl.calls, [`add fd00::50/128 proto ${OWNED_ADDRESS_PROTO}`]);
  t.same([b.status().vips.map((v) => [v.address, v.state, v.owned]), b.status().sysctls, b.status().problems], [[['fd00::50', 'on-lo', true]], {}, []]);
  await t.rejects(b.apply(['fd00::50', '10.0.0.50']), /net\.ipv4\.conf\.all\.arp_ignore/, 'with an IPv4 VIP too, the sysctls are needed again');
  const root2 = sysctlRoot(t, { arp_ignore: 0, arp_announce: 0 });
  const nl2 = new FakeNetlink();
  await new BackendVips({ netlink: nl2, log: silentLogger(), sysctl: { root: root2 } }).apply(['10.0.0.50', 'fd00::50']);
  t.same(nl2.calls, [`add 10.0.0.50/32 proto ${OWNED_ADDRESS_PROTO}`, `add fd00::50/128 proto ${OWNED_ADDRESS_PROTO}`]);
  t.same([read(root2, 'arp_ignore'), read(root2, 'arp_announce')], ['1', '2']);
});
