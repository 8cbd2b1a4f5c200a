// The DHCP probe's link handling through net/ (rtnetlink and net/sysctl.ts),
// with a fake rtnetlink client: stale probe links are swept, a failure after
// the macvlan exists still deletes it, and IPv6 is turned off on the link.
// The DISCOVER/OFFER exchange itself is test/privileged/preflight-dhcp.test.ts.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { NetlinkClient, LinkInfo, CreateMacvlanOptions } from '../../agent/net/netlink/netlink';
import { probeDhcp, PROBE_LINK_PREFIX } from '../../agent/preflight/dhcp-probe';

function fakeNetlink(links: { name: string; index: number }[], fail: { create?: boolean; up?: boolean }) {
  const calls: string[] = [];
  const nl = {
    async listLinks() { calls.push('list'); return links as unknown as LinkInfo[]; },
    async createMacvlan(o: CreateMacvlanOptions) {
      calls.push(`create ${o.name} on ${String(o.parent)} ${o.mode}`);
      if (fail.create) throw new Error('Operation not supported (is the macvlan module there?)');
      return { name: o.name, index: 77 } as unknown as LinkInfo;
    },
    async setLinkUp(index: number) { calls.push(`up ${index}`); if (fail.up) throw new Error('EPERM'); },
    async deleteLink(index: number) { calls.push(`delete ${index}`); return true; },
    close() { calls.push('close'); },
  };
  return { nl: nl as unknown as NetlinkClient, calls };
}

function sysctlRoot(t: { teardown(fn: () => void): void }, link: string): string {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-probe-'));
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  fs.mkdirSync(path.join(root, 'net/ipv6/conf', link), { recursive: true });
  fs.writeFileSync(path.join(root, 'net/ipv6/conf', link, 'disable_ipv6'), '0\n');
  return root;
}

t.test('a stale link of a dead probe is swept; a live one and other links are kept', async (t) => {
  const link = `${PROBE_LINK_PREFIX}${process.pid}`;
  const { nl, calls } = fakeNetlink([
    { name: 'eth0', index: 2 },
    { name: `${PROBE_LINK_PREFIX}999999999`, index: 40 }, // no such pid
    { name: `${PROBE_LINK_PREFIX}1`, index: 41 },          // init: alive
  ], { up: true });
  const root = sysctlRoot(t, link);
  const r = await probeDhcp('eth0', { netlink: nl, sysctl: { root } });
  t.match(r, { status: 'error', interface: 'eth0', error: new RegExp(`cannot bring ${link} up`) });
  t.same(calls, ['list', 'delete 40', `create ${link} on eth0 bridge`, 'up 77', 'delete 77'],
    'the stale link goes, the probe link is made in bridge mode and deleted after the failure');
  t.equal(fs.readFileSync(path.join(root, 'net/ipv6/conf', link, 'disable_ipv6'), 'utf8'), '1\n', 'IPv6 off on the probe link');
});

t.test('no macvlan: an error that says so, and nothing to delete', async (t) => {
  const link = `${PROBE_LINK_PREFIX}${process.pid}`;
  const { nl, calls } = fakeNetlink([], { create: true });
  const r = await probeDhcp('eth0', { netlink: nl, sysctl: { root: sysctlRoot(t, link) } });
  t.match(r, { status: 'error', error: /cannot create a macvlan on eth0: .*macvlan module/ });
  t.notOk(calls.some((c) => c.startsWith('delete')));
  t.notOk(calls.includes('close'), 'a client passed in is the caller\'s to close');
});
