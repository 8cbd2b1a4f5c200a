// Ownership reconcile: the plan (pure) and its application through a
// recording netlink (the kernel run is in test/privileged/net-macvlan.test.ts).
import t from 'tap';
import { Registry } from 'prom-client';
import { netMetrics } from '../../../agent/net/metrics';
import type { CreateMacvlanOptions, LinkInfo } from '../../../agent/net/netlink/netlink';
import { linkNameForService, macForService } from '../../../agent/net/ownership/ownership';
import { planOwnedLinks, reconcileOwnedLinks, type NetlinkForReconcile, type WantedLink } from '../../../agent/net/ownership/reconcile';

const eth0: LinkInfo = { index: 2, name: 'eth0', mac: '52:54:00:12:34:56', kind: 'veth', up: true, carrier: true, operState: 'up' };
function ours(key: string, index: number, over: Partial<LinkInfo> = {}): LinkInfo {
  return {
    index, name: linkNameForService(key), mac: macForService(key), kind: 'macvlan', up: true, carrier: true,
    operState: 'up', parentIndex: 2, macvlanMode: 'bridge', ...over,
  };
}
const want = (key: string, over: Partial<WantedLink> = {}): [string, WantedLink] =>
  [linkNameForService(key), { mac: macForService(key), parent: 'eth0', ...over }];

t.test('plan: adopt, remove, recreate, missing, foreign', async (t) => {
  const existing = [
    eth0,
    ours('default/keep', 10),
    ours('default/stale', 11),
    ours('default/moved', 12, { mac: '02:00:00:00:00:99' }),
    ours('default/private', 13, { macvlanMode: 'private' }),
    ours('default/parent', 14, { parentIndex: 99 }),
    { ...ours('default/foreign', 15), mac: '52:54:00:00:00:01' },
    { ...ours('default/unwanted-foreign', 16), mac: '52:54:00:00:00:02' },
    { ...eth0, index: 17, name: 'lbv-operator' },
  ];
  const wanted = new Map([
    want('default/keep'), want('default/moved'), want('default/private'), want('default/parent'),
    want('default/foreign'), want('default/new'),
  ]);
  const plan = planOwnedLinks(existing, wanted);
  t.same(plan.adopt.map((l) => l.index), [10]);
  t.same(plan.remove.map((l) => l.index), [11], 'only links with both marks are removed');
  t.same(plan.recreate.map((r) => [r.link.index, r.reason]), [[12, 'wrong-mac'], [13, 'wrong-mode'], [14, 'wrong-parent']]);
  t.same(plan.missing, [linkNameForService('default/new')]);
  t.same(plan.foreign.map((l) => l.index), [15]);
});

t.test('plan: parent by index, non-macvlan kind', async (t) => {
  const plan = planOwnedLinks([eth0, ours('a/b', 10), ours('a/c', 11, { kind: 'veth' })], new Map([want('a/b', { parent: 2 }), want('a/c')]));
  t.same(plan.adopt.map((l) => l.index), [10]);
  t.same(plan.recreate.map((r) => r.reason), ['not-macvlan']);
});

t.test('reconcileOwnedLinks applies the plan and sets the gauge', async (t) => {
  const calls: string[] = [];
  const nl: NetlinkForReconcile = {
    listLinks: async () => [eth0, ours('a/keep', 10), ours('a/stale', 11), ours('a/moved', 12, { mac: '02:00:00:00:00:99' })],
    deleteLink: async (index: number) => { calls.push(`del ${index}`); return true; },
    createMacvlan: async (o: CreateMacvlanOptions) => { calls.push(`create ${o.name} ${o.mac} ${o.mode}`); return ours('a/moved', 20, { up: false }); },
  };
  const registry = new Registry();
  const r = await reconcileOwnedLinks(nl, new Map([want('a/keep'), want('a/moved')]), { metrics: netMetrics(registry) });
  t.same(calls, ['del 11', 'del 12', `create ${linkNameForService('a/moved')} ${macForService('a/moved')} bridge`]);
  t.same(r.adopted.map((l) => l.index), [10]);
  t.same(r.removed.map((l) => l.index), [11]);
  t.same(r.recreated.map((l) => l.index), [20]);
  t.match(await registry.metrics(), /lbagent_net_links_owned 2/);
});

t.test('a failing kernel call stops and throws', async (t) => {
  const nl: NetlinkForReconcile = {
    listLinks: async () => [ours('a/stale', 11)],
    deleteLink: async () => { throw new Error('Request rejected: EPERM'); },
    createMacvlan: async () => { throw new Error('unreachable'); },
  };
  await t.rejects(reconcileOwnedLinks(nl, new Map()), /EPERM/);
});
