// dhcp/shared-link.ts, and the DHCPv6 source on a dual-stack service's
// shared macvlan (dhcp/driver6.ts) in the order a VRRP takeover needs: its
// VIP on the link before the DHCPv4 source brings it up, bound on the 'up'
// event (no polling), withdrawn when the start fails. Fake netlink and a
// manual clock; the wire parts (DHCPv6 socket, NDP) are the privileged
// tests' (vrrp-hand-back).
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import t from 'tap';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { parseNetwork } from '../../agent/address';
import type { ServiceSpec } from '../../agent/config/types';
import { DEFAULT_ARP } from '../../agent/config/defaults';
import { SharedLink } from '../../agent/dhcp/shared-link';
import { createDhcp6Source, type NetlinkForDhcp6 } from '../../agent/dhcp/driver6';
import { silentLogger } from '../../agent/log';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';
import { StateStore } from '../../agent/state/store';
import type { AddressInfo, LinkInfo } from '../../agent/net/netlink/netlink';

const flush = async (n = 20): Promise<void> => { for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r)); };

t.test('SharedLink.beforeUp: the rider\'s work, bounded, never failing the owner', async (t) => {
  const l = new SharedLink();
  t.equal(await l.beforeUp(3), false, 'no rider: nothing to wait for');
  const seen: number[] = [];
  l.setBeforeUp(async (i) => { seen.push(i); });
  t.equal(await l.beforeUp(3), true, 'a rider that finishes: done in time');
  t.same(seen, [3], 'given the link index');
  l.setBeforeUp(() => Promise.reject(new Error('netlink said no')));
  t.equal(await l.beforeUp(3), false, 'a rider that fails does not fail the owner');
  l.setBeforeUp(() => new Promise(() => {}));
  const t0 = Date.now();
  t.equal(await l.beforeUp(3, { waitMs: 30, setTimeout: (fn, ms) => setTimeout(fn, ms) }), false, 'a rider that hangs: the owner goes on after waitMs');
  t.ok(Date.now() - t0 < 1000, 'and does not wait longer');
  l.setBeforeUp(undefined);
  t.equal(await l.beforeUp(3), false, 'cleared');
});

const KEY = 'default/dd';
const IFNAME = linkNameForService(KEY);
const MAC = macForService(KEY);
const INDEX = 7;
const VIP6 = 'fd00:99::120';

/** The shared macvlan as the kernel would hold it, and every verb in order with the link's state at the time. */
function fakeNetlink(): { nl: NetlinkForDhcp6; link: { up: boolean; exists: boolean }; addrs: AddressInfo[]; ops: string[] } {
  const link = { up: false, exists: true };
  const addrs: AddressInfo[] = [];
  const ops: string[] = [];
  const info = (): LinkInfo => ({ index: INDEX, name: IFNAME, mac: MAC, kind: 'macvlan', up: link.up, carrier: link.up, operState: link.up ? 'up' : 'down' } as unknown as LinkInfo);
  const nl = {
    findLink: async (name: string) => (name === IFNAME && link.exists ? info() : undefined),
    getLink: async () => info(),
    createMacvlan: async () => { throw new Error('the DHCPv4 source owns the link'); },
    setLink: async () => { throw new Error('the DHCPv4 source owns the link'); },
    deleteLink: async () => { throw new Error('the DHCPv4 source owns the link'); },
    addAddress: async (index: number, address: string, prefix: number) => {
      ops.push(`add ${address}/${prefix} (link ${link.up ? 'up' : 'down'})`);
      addrs.push({ index, address, prefix });
    },
    removeAddress: async (index: number, address: string, prefix: number) => {
      ops.push(`remove ${address}/${prefix}`);
      const i = addrs.findIndex((a) => a.index === index && a.address === address && a.prefix === prefix);
      if (i >= 0) addrs.splice(i, 1);
    },
    listAddresses: async (index?: number) => addrs.filter((a) => index === undefined || a.index === index),
  } as unknown as NetlinkForDhcp6;
  return { nl, link, addrs, ops };
}

function source(t: tap.Test, nl: NetlinkForDhcp6, links: SharedLink, clock: ManualClock) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-shared-link-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return createDhcp6Source({
    service: { key: `${KEY}@IPv6`, name: 'dd', namespace: 'default', family: 'IPv6', ipFamilies: ['IPv4', 'IPv6'] } as unknown as ServiceSpec,
    parent: 'eth0', arp: DEFAULT_ARP, store: new StateStore(dir), netlink: nl, log: silentLogger(), registry: new Registry(), clock,
    sharedLink: true, linkEvents: links, resumeSaved: true,
    hostView: () => ({ prefixes: [parseNetwork('fd00:99::/64')!], local: [] }),
  });
}

t.test('a VRRP takeover: the known IPv6 VIP on the shared macvlan before it goes up, bound on the owner\'s up event', async (t) => {
  const clock = new ManualClock();
  const { nl, link, ops } = fakeNetlink();
  const links = new SharedLink();
  const src = source(t, nl, links, clock);
  const vips: string[] = [];
  const lost: string[] = [];
  src.on('vip', (v: { address: string }) => vips.push(v.address));
  src.on('lost', (r: string) => lost.push(r));
  src.start({ known: VIP6 });
  await flush();
  // The DHCPv4 source, about to set the link up (dhcp/driver.ts ensureLink).
  t.equal(await links.beforeUp(INDEX), true, 'the DHCPv6 source put its address on in time');
  t.same(ops, [`add ${VIP6}/128 (link down)`], 'the /128 added while the link is still down');
  t.same(vips, [], 'not said to be served before the link is up');
  link.up = true;
  links.up(INDEX);
  await flush();
  t.same(vips, [VIP6], "bound on the 'up' event, without a clock tick (no polling)");
  t.same(ops, [`add ${VIP6}/128 (link down)`], 'and not added a second time');
  // No link-local address ever appears (the fake): the socket cannot open, the start fails after its bound.
  clock.advance(6_000);
  await flush();
  t.equal(src.status().state, 'failed', 'a start that cannot open its socket fails');
  t.same(ops.slice(1), [`remove ${VIP6}/128`], 'and withdraws the address it put on before the link came up');
  t.equal(lost.length, 1, "and says the VIP is lost");
});

t.test('the DHCPv4 source fails to set the link up: the DHCPv6 source fails at once and leaves no address', async (t) => {
  const clock = new ManualClock();
  const { nl, addrs, ops } = fakeNetlink();
  const links = new SharedLink();
  const src = source(t, nl, links, clock);
  src.start({ known: VIP6 });
  await flush();
  await links.beforeUp(INDEX);
  t.equal(addrs.length, 1, 'the /128 on the down link');
  links.failed(INDEX);
  await flush();
  t.equal(src.status().state, 'failed', 'failed without waiting out the link timeout');
  t.match(src.status().reason, /DHCPv4 source failed to set up the service macvlan/, 'and says why');
  t.same(addrs, [], 'nothing left on the link');
  t.same(ops, [`add ${VIP6}/128 (link down)`, `remove ${VIP6}/128`], 'added, then removed');
});

t.test('no known address and no lease: nothing is added before up; the start goes on after the up event', async (t) => {
  const clock = new ManualClock();
  const { nl, link, ops } = fakeNetlink();
  const links = new SharedLink();
  const src = source(t, nl, links, clock);
  src.start();
  await flush();
  t.equal(await links.beforeUp(INDEX), true, 'answered at once');
  t.same(ops, [], 'nothing added: there is nothing to resume');
  link.up = true;
  links.up(INDEX);
  await flush();
  t.equal(src.status().state, 'acquiring', 'past the link, asking a server');
  const stopped = src.stop({ release: false });
  await flush();
  clock.advance(100);
  await stopped;
  t.same(ops, [], 'and stopped with nothing on the link');
});
