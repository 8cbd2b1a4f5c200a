// Interface sysctls: names validated like the kernel's dev_valid_name, paths
// confined to net/ipv4/conf, and applyVipSysctls all-or-nothing - against a
// temporary tree shaped like /proc/sys.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { isLbError } from '../../../agent/errors';
import {
  applyVipSysctls,
  PARENT_RECHECK_MS,
  ParentSysctls,
  ifSysctlPath,
  interfaceNameProblem,
  prepareIpv6Link,
  readIfSysctl,
  vipSysctls,
  writeIfSysctl,
} from '../../../agent/net/sysctl/sysctl';

function fakeRoot(t: { teardown(fn: () => void): void }, ifaces: Record<string, Record<string, number>>): string {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'lbsysctl-'));
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  for (const [ifname, keys] of Object.entries(ifaces)) {
    const dir = path.join(root, 'net', 'ipv4', 'conf', ifname);
    fs.mkdirSync(dir, { recursive: true });
    for (const [k, v] of Object.entries(keys)) fs.writeFileSync(path.join(dir, k), `${v}\n`);
  }
  return root;
}

t.test('interface names: the kernel rules', async (t) => {
  for (const ok of ['eth0', 'lbv0123456789ab', 'enp0s3', 'br-lan', 'all', 'default', 'a.b', 'x@y']) {
    t.equal(interfaceNameProblem(ok), undefined, ok);
  }
  for (const bad of ['', '.', '..', 'a/b', '../../etc', 'eth 0', 'eth0:1', 'x'.repeat(16), 'é'.repeat(8)]) {
    t.type(interfaceNameProblem(bad), 'string', JSON.stringify(bad));
  }
});

t.test('paths stay under net/ipv4/conf/<if>/<key>', async (t) => {
  t.equal(ifSysctlPath('eth0', 'arp_ignore'), '/proc/sys/net/ipv4/conf/eth0/arp_ignore');
  t.equal(ifSysctlPath('eth0', 'rp_filter', { root: '/tmp/x' }), '/tmp/x/net/ipv4/conf/eth0/rp_filter');
  t.throws(() => ifSysctlPath('../../../etc', 'arp_ignore'), { code: 'LB_ERR_NET_SYSCTL' });
  t.throws(() => ifSysctlPath('eth0', '../forwarding' as 'arp_ignore'), { code: 'LB_ERR_NET_SYSCTL' });
  t.throws(() => ifSysctlPath('eth0', 'accept_local' as 'arp_ignore'), { code: 'LB_ERR_NET_SYSCTL' }, 'only the keys the table uses');
});

t.test('read and write', async (t) => {
  const root = fakeRoot(t, { eth0: { arp_ignore: 0 } });
  t.equal(await readIfSysctl('eth0', 'arp_ignore', { root }), 0);
  await writeIfSysctl('eth0', 'arp_ignore', 1, { root });
  t.equal(await readIfSysctl('eth0', 'arp_ignore', { root }), 1);
  await t.rejects(readIfSysctl('nope0', 'arp_ignore', { root }), { code: 'LB_ERR_NET_NO_INTERFACE', message: /nope0/ });
  await t.rejects(writeIfSysctl('nope0', 'arp_ignore', 1, { root }), { code: 'LB_ERR_NET_NO_INTERFACE' });
  t.notOk(fs.existsSync(path.join(root, 'net/ipv4/conf/nope0')), 'a write never creates files');
  await t.rejects(writeIfSysctl('eth0', 'arp_ignore', -1, { root }), RangeError);
});

t.test('DESIGN.md settings per role', async (t) => {
  t.same(vipSysctls('parent'), [['arp_ignore', 1], ['arp_announce', 2]]);
  t.same(vipSysctls('macvlan'), [['arp_ignore', 1], ['arp_announce', 2], ['rp_filter', 2]]);
  const root = fakeRoot(t, {
    eth0: { arp_ignore: 0, arp_announce: 2, rp_filter: 1 },
    lbv1: { arp_ignore: 0, arp_announce: 0, rp_filter: 1 },
  });
  t.same(await applyVipSysctls('eth0', 'parent', { root }), [{ key: 'arp_ignore', from: 0, to: 1 }]);
  t.equal(await readIfSysctl('eth0', 'rp_filter', { root }), 1, 'parent rp_filter untouched');
  t.same(await applyVipSysctls('lbv1', 'macvlan', { root }), [
    { key: 'arp_ignore', from: 0, to: 1 },
    { key: 'arp_announce', from: 0, to: 2 },
    { key: 'rp_filter', from: 1, to: 2 },
  ]);
  t.same(await applyVipSysctls('lbv1', 'macvlan', { root }), [], 'idempotent');
});

t.test('nothing half-applied: a failing write restores earlier ones', async (t) => {
  // rp_filter missing: the third step fails after two writes.
  const root = fakeRoot(t, { lbv2: { arp_ignore: 0, arp_announce: 0 } });
  const err = await applyVipSysctls('lbv2', 'macvlan', { root }).catch((e: unknown) => e);
  t.ok(isLbError(err));
  t.equal(await readIfSysctl('lbv2', 'arp_ignore', { root }), 0);
  t.equal(await readIfSysctl('lbv2', 'arp_announce', { root }), 0);
});

t.test('garbage in a sysctl file is an error, not NaN', async (t) => {
  const root = fakeRoot(t, { eth0: {} });
  fs.writeFileSync(path.join(root, 'net/ipv4/conf/eth0/arp_ignore'), 'banana\n');
  await t.rejects(readIfSysctl('eth0', 'arp_ignore', { root }), { code: 'LB_ERR_NET_SYSCTL' });
});

t.test('the parent: applied at most once per PARENT_RECHECK_MS (issue 18)', async (t) => {
  const root = fakeRoot(t, { par0: { arp_ignore: 0, arp_announce: 0, rp_filter: 1 } });
  let now = 10_000;
  const parent = new ParentSysctls({ root, now: () => now });
  t.same(await parent.apply('par0'), [{ key: 'arp_ignore', from: 0, to: 1 }, { key: 'arp_announce', from: 0, to: 2 }]);
  await writeIfSysctl('par0', 'arp_ignore', 0, { root });
  now = 10_000 + PARENT_RECHECK_MS - 1;
  t.same(await parent.apply('par0'), [], 'within the window: not read again');
  t.equal(await readIfSysctl('par0', 'arp_ignore', { root }), 0);
  t.same(await new ParentSysctls({ root, now: () => now }).apply('par0'), [{ key: 'arp_ignore', from: 0, to: 1 }], 'another instance keeps its own window');
  await writeIfSysctl('par0', 'arp_ignore', 0, { root });
  now = 10_000 + PARENT_RECHECK_MS;
  t.same(await parent.apply('par0'), [{ key: 'arp_ignore', from: 0, to: 1 }], 'after it: read and put right');
  await writeIfSysctl('par0', 'arp_ignore', 0, { root });
  now = 5_000;
  t.same(await parent.apply('par0'), [{ key: 'arp_ignore', from: 0, to: 1 }], 'a clock that went back: applied');
  const real = new ParentSysctls({ root });
  await writeIfSysctl('par0', 'arp_ignore', 0, { root });
  t.same(await real.apply('par0'), [{ key: 'arp_ignore', from: 0, to: 1 }], 'the default clock (performance.now)');
  await writeIfSysctl('par0', 'arp_ignore', 0, { root });
  t.same(await real.apply('par0'), [], 'the default clock: within the window');
  // 50 services starting past the window at once: one apply, the others wait for it.
  now = 20_000;
  await writeIfSysctl('par0', 'arp_ignore', 0, { root });
  t.same(await Promise.all([parent.apply('par0'), parent.apply('par0'), parent.apply('par0')]),
    [[{ key: 'arp_ignore', from: 0, to: 1 }], [], []], 'concurrent calls: the first applies and reports, the rest share it');
  fs.rmSync(path.join(root, 'net/ipv4/conf/par0'), { recursive: true });
  now = 40_000;
  const failed = await Promise.allSettled([parent.apply('par0'), parent.apply('par0')]);
  t.same(failed.map((r) => r.status), ['rejected', 'rejected'], 'a failed apply fails the callers that waited for it');
});

t.test('prepareIpv6Link: no RA, no SLAAC, optimistic DAD, IPv6 on; false without IPv6; a bad name refused', async (t) => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'lbsysctl6-'));
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  const dir = path.join(root, 'net', 'ipv6', 'conf', 'lbv1');
  fs.mkdirSync(dir, { recursive: true });
  const keys = { accept_ra: 1, autoconf: 1, optimistic_dad: 0, use_optimistic: 0, disable_ipv6: 1 };
  for (const [k, v] of Object.entries(keys)) fs.writeFileSync(path.join(dir, k), `${v}\n`);
  t.equal(await prepareIpv6Link('lbv1', { root }), true);
  const read = (k: string): string => fs.readFileSync(path.join(dir, k), 'utf8').trim();
  t.same(Object.keys(keys).map((k) => [k, read(k)]), [['accept_ra', '0'], ['autoconf', '0'], ['optimistic_dad', '1'], ['use_optimistic', '1'], ['disable_ipv6', '0']]);
  t.equal(await prepareIpv6Link('nosuch', { root }), false, 'a kernel without IPv6 there');
  await t.rejects(prepareIpv6Link('a/b', { root }), { code: 'LB_ERR_NET_SYSCTL' });
});
