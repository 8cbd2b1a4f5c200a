// config/networks.ts and the `networks:` section as load.ts builds it: every
// service resolves to one network (NIC, pools, virtual-router settings); a
// config without networks: resolves to the default one, as it always did.
import t from 'tap';
import { parseConfigText, formatConfigErrors } from '../../agent/config/load';
import { DEFAULT_NETWORK, allPools, networkOf, networksOf, poolLabel, poolsOfNetwork } from '../../agent/config/networks';
import type { Desired } from '../../agent/config/types';

function load(text: string): Desired {
  const r = parseConfigText(text, 'host');
  if (!r.ok) throw new Error(formatConfigErrors(r.errors));
  return r.config;
}

const TWO = `
node: { interface: eth0 }
failover: { vrid: 51, peers: [10.99.0.3] }
pools: { range-global: 10.99.0.200-10.99.0.201 }
networks:
  vmnet:
    interface: eth1
    pools: { range-global: 10.98.0.200-10.98.0.201, cidr-team: 10.98.0.64/30 }
    failover: { vrid: 61 }
services:
  - { name: a, ports: [{ port: 80 }] }
  - { name: b, network: vmnet, ports: [{ port: 80 }] }
  - { name: c, network: vmnet, ipam: dhcp, ports: [{ port: 80 }] }
  - { name: d, primaryService: b, ports: [{ port: 81 }] }
  - { name: e, network: default, ports: [{ port: 82 }] }
`;

t.test('a config without networks: has the default network only, and its services carry no network field', async (t) => {
  const c = load('node: { interface: eth0 }\npools: { range-global: 10.0.0.5-10.0.0.8 }\nservices: [{ name: a, ports: [{ port: 80 }] }]\n');
  t.equal(c.networks, undefined, 'no networks key in the typed config');
  t.notOk('network' in c.services[0]!, 'the service spec is what it always was');
  t.same(networksOf(c).map((n) => [n.name, n.interface]), [[DEFAULT_NETWORK, 'eth0']]);
  const n = networkOf(c, c.services[0]!);
  t.equal(n.name, DEFAULT_NETWORK);
  t.same(n.pools, c.pools, 'the top-level pools');
  t.same(n.failover, { interface: undefined, vrid: 51, peers: [] }, 'the top-level failover settings');
});

t.test('two networks: each service resolves to its network, a secondary to its primary\'s', async (t) => {
  const c = load(TWO);
  t.same(networksOf(c).map((n) => [n.name, n.interface]), [[DEFAULT_NETWORK, 'eth0'], ['vmnet', 'eth1']], 'the default first');
  const by = (n: string) => c.services.find((s) => s.name === n)!;
  t.same(['a', 'b', 'c', 'd', 'e'].map((n) => networkOf(c, by(n)).name), [DEFAULT_NETWORK, 'vmnet', 'vmnet', 'vmnet', DEFAULT_NETWORK]);
  t.equal(by('d').network, 'vmnet', 'the secondary takes its primary\'s network');
  t.notOk('network' in by('e'), 'network: default is the same as none');
  const vm = networkOf(c, by('b'));
  t.same(vm.failover, { interface: 'eth1', vrid: 61, peers: [0x0a630003] }, 'its own VRID; the interface and peers default to its NIC and the top-level peers');
  t.same(vm.pools.map((p) => [p.key, p.network]), [['range-global', 'vmnet'], ['cidr-team', 'vmnet']], 'its pools carry its name');
  t.same(allPools(c).map(poolLabel), ['range-global', 'vmnet/range-global', 'vmnet/cidr-team'], 'two networks\' range-global stay apart by label');
  t.same(poolsOfNetwork(allPools(c), undefined).map(poolLabel), ['range-global']);
  t.same(poolsOfNetwork(allPools(c), 'vmnet').map(poolLabel), ['vmnet/range-global', 'vmnet/cidr-team']);
  t.throws(() => networkOf(c, { network: 'nope' }), /"nope" is not defined under networks/);
});

t.test('a pool service takes an address of its own network\'s pools: loadBalancerIP is checked against them', async (t) => {
  const bad = parseConfigText(`${TWO}  - { name: f, network: vmnet, loadBalancerIP: 10.99.0.200, ports: [{ port: 80 }] }\n`, 'host');
  t.equal(bad.ok, false);
  if (!bad.ok) t.match(formatConfigErrors(bad.errors), /services\[5\]\.loadBalancerIP: service default\/f: 10\.99\.0\.200 is not in pool range-global \(10\.98\.0\.200-10\.98\.0\.201\)/);
  const ok = parseConfigText(`${TWO}  - { name: f, network: vmnet, loadBalancerIP: 10.98.0.201, ports: [{ port: 80 }] }\n`, 'host');
  t.ok(ok.ok, ok.ok ? 'an address of vmnet\'s pool is accepted' : formatConfigErrors(ok.errors));
});

t.test('sourceIP: preserve on a named network is served there (direct server return on its NIC)', async (t) => {
  const r = parseConfigText(`${TWO}  - { name: f, network: vmnet, sourceIP: preserve, ports: [{ port: 80 }], backends: [10.98.0.11] }\n`, 'host');
  t.ok(r.ok, r.ok ? 'accepted' : formatConfigErrors(r.errors));
  if (r.ok) t.match(r.config.services.find((s) => s.name === 'f'), { network: 'vmnet', sourceIP: 'preserve' });
  const proxy = parseConfigText(`${TWO.replace(/^services:/m, 'dataplane: proxy\nservices:')}  - { name: f, network: vmnet, sourceIP: preserve, ports: [{ port: 80 }] }\n`, 'host');
  t.equal(proxy.ok, false, 'still the kernel path only');
  if (!proxy.ok) t.match(formatConfigErrors(proxy.errors), /services\[5\]\.sourceIP: preserve needs the kernel data path/);
});
