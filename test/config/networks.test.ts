// config/networks.ts and the `networks:` section as load.ts builds it: every
// service resolves to one network (NIC, pools, virtual-router settings); a
// config without networks: resolves to the default one, as it always did.
// Each network's VRRP peers (both families) and tracks: failover.track is
// the default network's, networks.<name>.failover.track a named one's.
import t, { type Test } from 'tap';
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
  t.same(n.failover, { interface: undefined, vrid: 51, peers: [], peers6: [], track: { interfaces: [], services: [] } }, 'the top-level failover settings');
});

t.test('two networks: each service resolves to its network, a secondary to its primary\'s', async (t) => {
  const c = load(TWO);
  t.same(networksOf(c).map((n) => [n.name, n.interface]), [[DEFAULT_NETWORK, 'eth0'], ['vmnet', 'eth1']], 'the default first');
  const by = (n: string) => c.services.find((s) => s.name === n)!;
  t.same(['a', 'b', 'c', 'd', 'e'].map((n) => networkOf(c, by(n)).name), [DEFAULT_NETWORK, 'vmnet', 'vmnet', 'vmnet', DEFAULT_NETWORK]);
  t.equal(by('d').network, 'vmnet', 'the secondary takes its primary\'s network');
  t.notOk('network' in by('e'), 'network: default is the same as none');
  const vm = networkOf(c, by('b'));
  t.same(vm.failover, { interface: 'eth1', vrid: 61, peers: [0x0a630003], peers6: [], track: { interfaces: [], services: [] } }, 'its own VRID; the interface and peers default to its NIC and the top-level peers; no track of its own');
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

const VRRP = (net: string, top = '', svcs = ''): string => `
node: { interface: eth0 }
failover:
  mode: vrrp
  vrid: 51
${top}
pools: { range-global: 10.99.0.200-10.99.0.201 }
networks:
  vmnet:
    interface: eth1
    pools: { range-global: "10.98.0.200-10.98.0.201,fd00:98::200-fd00:98::201" }
    failover:
      vrid: 61
${net}
services:
  - { name: a, ports: [{ port: 80 }], backends: [10.99.0.11, 10.99.0.12] }
  - { name: b, network: vmnet, ports: [{ port: 80 }], backends: [10.98.0.11, 10.98.0.12] }
${svcs}`;

function refused(t: Test, text: string, path: string, message: RegExp): void {
  const r = parseConfigText(text, 'host');
  t.equal(r.ok, false, `refused at ${path}`);
  if (r.ok) return;
  const e = r.errors.find((x) => x.path === path);
  t.ok(e, `an error at ${path} (got ${r.errors.map((x) => x.path).join(', ')})`);
  t.match(e?.message ?? '', message);
}

t.test('networks.<name>.failover.track: that network\'s tracks, typed as failover.track, the top-level one the default network\'s', async (t) => {
  const c = load(VRRP(`      track:
        interfaces: [{ name: eth1 }]
        services: [{ service: b, minHealthy: 2, weight: 60 }]`, `  track: { interfaces: [{ name: eth0, weight: 10 }], services: [{ service: a, weight: 20 }] }`));
  const [def, vm] = networksOf(c);
  t.same(def!.failover.track, {
    interfaces: [{ name: 'eth0', weight: 10, failAfter: 0, recoverAfter: 0 }],
    services: [{ service: 'default/a', minHealthy: 1, weight: 20, failAfter: 1, recoverAfter: 5 }],
  }, 'the default network: failover.track');
  t.same(c.failover.track, def!.failover.track, 'one home: Desired.failover.track is the default network\'s');
  t.same(vm!.failover.track, {
    interfaces: [{ name: 'eth1', weight: undefined, failAfter: 0, recoverAfter: 0 }],
    services: [{ service: 'default/b', minHealthy: 2, weight: 60, failAfter: 1, recoverAfter: 5 }],
  }, 'vmnet: its own, with the same defaults');
  const only = load(VRRP('', `  track: { interfaces: [{ name: eth0 }] }`));
  t.same(networksOf(only)[1]!.failover.track, { interfaces: [], services: [] }, 'a network without a track of its own has none: the top-level one is not inherited');
});

t.test('a track names services of its own network: validate refuses any other with the field path and where it belongs', async (t) => {
  refused(t, VRRP(`      track: { services: [{ service: a }] }`), 'networks.vmnet.failover.track.services[0].service',
    /service default\/a is on network default, and networks\.vmnet\.failover\.track lowers the priority of network vmnet's virtual routers only, which do not carry its VIP: track it under failover\.track$/);
  refused(t, VRRP('', `  track: { services: [{ service: b }] }`), 'failover.track.services[0].service',
    /service default\/b is on network vmnet, .* track it under networks\.vmnet\.failover\.track$/);
  // A secondary rides its primary's VIP, so it is on its primary's network.
  refused(t, VRRP(`      track: { services: [{ service: c }] }`, '', '  - { name: c, primaryService: a, ports: [{ port: 81 }], backends: [10.99.0.11] }'),
    'networks.vmnet.failover.track.services[0].service', /service default\/c is on network default/);
  refused(t, VRRP(`      track: { interfaces: [{ name: eth1 }, { name: eth1, weight: 5 }] }`), 'networks.vmnet.failover.track.interfaces[1].name',
    /"eth1" is tracked twice \(also networks\.vmnet\.failover\.track\.interfaces\[0\]\)/);
  refused(t, VRRP(`      track: { services: [{ service: b, minHealthy: 3 }] }`), 'networks.vmnet.failover.track.services[0].minHealthy', /3 is more than the 2 backends of service default\/b/);
  refused(t, VRRP(`      track: { services: [{ service: b, weight: 0 }] }`), 'networks.vmnet.failover.track.services[0].weight', /0 is not an integer \(1-254\)/);
  // The same NIC tracked by two networks is two tracks, one per network's routers.
  const both = parseConfigText(VRRP(`      track: { interfaces: [{ name: eth1 }] }`, `  track: { interfaces: [{ name: eth1, weight: 10 }] }`), 'host');
  t.ok(both.ok, both.ok ? 'one NIC tracked by two networks' : formatConfigErrors(both.errors));
});

t.test('a top-level track in a file whose services all live on named networks would lower nothing: refused with where it belongs', async (t) => {
  const text = VRRP('', `  track: { interfaces: [{ name: eth1 }] }`).replace('  - { name: a, ports: [{ port: 80 }], backends: [10.99.0.11, 10.99.0.12] }\n', '');
  refused(t, text, 'failover.track', /lowers the default network's virtual routers only, and no service is on the default network \(every one is on vmnet\): move it under networks\.vmnet\.failover\.track/);
  const none = parseConfigText(text.replace('mode: vrrp', 'mode: none'), 'host');
  t.ok(none.ok, 'without VRRP a track lowers nothing anyway: accepted as before');
  const moved = parseConfigText(text.replace(`  track: { interfaces: [{ name: eth1 }] }`, '').replace('      vrid: 61\n', '      vrid: 61\n      track: { interfaces: [{ name: eth1 }] }\n'), 'host');
  t.ok(moved.ok, moved.ok ? 'moved under networks.vmnet: accepted' : formatConfigErrors(moved.errors));
});

t.test('networks.<name>.failover.peers: IPv4 ones for its IPv4 routers, IPv6 link-local or global ones for its IPv6 routers', async (t) => {
  const v6 = '  - { name: b6, network: vmnet, ipFamilies: [IPv6], loadBalancerIP: "fd00:98::200", ports: [{ port: 80 }], backends: ["fd00:98::11"] }';
  const c = load(VRRP(`      peers: [10.98.0.3, "FE80::3", "fd00:98::3"]`, '  peers: [10.99.0.3]', v6));
  const vm = networksOf(c)[1]!;
  t.same(vm.failover.peers, [0x0a620003], 'the IPv4 peer');
  t.same(vm.failover.peers6, ['fe80::3', 'fd00:98::3'], 'the IPv6 peers, RFC 5952 text');
  t.same(networksOf(c)[0]!.failover.peers6, [], 'the default network keeps its own (IPv4 only)');
  const inherited = load(VRRP('', '  peers: [10.99.0.3, "fe80::3"]', v6));
  t.same(networksOf(inherited)[1]!.failover.peers6, ['fe80::3'], 'unset: the top-level peers of both families');
  t.same(networksOf(inherited)[1]!.failover.peers, [0x0a630003]);
  refused(t, VRRP(`      peers: [10.98.0.3]`, '', v6), 'networks.vmnet.failover.peers',
    /lists no IPv6 address, but service default\/b6@IPv6 on network vmnet has an IPv6 VIP: its IPv6 VRRP instance would hear adverts from any host; add the other agents' IPv6 addresses \(link-local or global\)$/);
  refused(t, VRRP('', '  peers: [10.99.0.3]', v6), 'failover.peers', /lists no IPv6 address, but service default\/b6@IPv6 on network vmnet .*, or set networks\.vmnet\.failover\.peers$/);
  refused(t, VRRP(`      peers: [10.98.0.3, "::1"]`, '', v6), 'networks.vmnet.failover.peers[1]', /::1 is not an address another agent sends VRRP adverts from/);
  refused(t, VRRP(`      peers: [10.98.0.3, "fe80::3%eth1"]`, '', v6), 'networks.vmnet.failover.peers[1]', /is not an IPv4 or IPv6 address/);
});
