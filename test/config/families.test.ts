// Kubernetes' dual-stack words on a service: every ipFamilies x ipFamilyPolicy
// combination with and without a pool of each family, the apiserver's
// defaulting, loadBalancerIPs, backends of either family, the refusals (an
// address outside its family's pool), and under VRRP the tie of a dual-stack
// DHCP service's IPv6 VIP to its IPv4 router. Through the whole loader, as a
// user's file.
import t from 'tap';
import { parseConfigText, formatConfigErrors } from '../../agent/config/load';
import { familyServiceKey, linkKeyOf, tiedToIpv4 } from '../../agent/config/families';
import { parsePools, selectPool } from '../../agent/config/pools';
import type { ServiceSpec } from '../../agent/config/types';

const DUAL_POOLS = 'pools: { range-global: "10.99.0.200-10.99.0.220,fd00:99::200-fd00:99::2ff" }';
const V4_POOLS = 'pools: { range-global: "10.99.0.200-10.99.0.220" }';

function load(service: string, head = DUAL_POOLS): { services: readonly ServiceSpec[]; errors: string } {
  const backends = service.includes('backends:') ? '' : 'backends: ["10.0.0.11", "fd00:99::11"], ';
  const res = parseConfigText(`${head}\nservices:\n  - { name: web, ports: [{ port: 80 }], ${backends}${service} }\n`, 'test');
  return res.ok ? { services: res.config.services, errors: '' } : { services: [], errors: formatConfigErrors(res.errors) };
}

const FAMILY_LISTS = [undefined, ['IPv4'], ['IPv6'], ['IPv4', 'IPv6'], ['IPv6', 'IPv4']] as const;
const POLICIES = [undefined, 'SingleStack', 'PreferDualStack', 'RequireDualStack'] as const;

/** Kubernetes' answer: the families served, or the field refused. */
function expected(fams: readonly string[] | undefined, policy: string | undefined, v6pool: boolean): { served: string[] } | { refused: string } {
  const pol = policy ?? (fams?.length === 2 ? 'RequireDualStack' : 'SingleStack');
  if (pol === 'SingleStack' && fams && fams.length === 2) return { refused: 'ipFamilies' };
  const primary = fams?.[0] ?? 'IPv4';
  const requested = pol === 'SingleStack' ? [primary] : [primary, fams?.[1] ?? (primary === 'IPv4' ? 'IPv6' : 'IPv4')];
  const field = fams ? 'ipFamilies' : policy ? 'ipFamilyPolicy' : 'ipam';
  if (!v6pool) {
    if (pol === 'PreferDualStack') return primary === 'IPv6' ? { refused: field } : { served: ['IPv4'] };
    if (requested.includes('IPv6')) return { refused: field };
  }
  return { served: requested };
}

t.test('every ipFamilies x ipFamilyPolicy, with and without an IPv6 pool', async (t) => {
  for (const v6pool of [true, false]) {
    for (const fams of FAMILY_LISTS) {
      for (const policy of POLICIES) {
        const parts = [fams ? `ipFamilies: [${fams.join(', ')}]` : '', policy ? `ipFamilyPolicy: ${policy}` : ''].filter(Boolean).join(', ');
        const name = `${parts || 'nothing'} (${v6pool ? 'dual-stack pools' : 'IPv4 pool only'})`;
        // Backends of the families asked for only, so that only the family rules speak.
        const { services, errors } = load(`backends: [], ${parts}`.replace(/, $/, ''), v6pool ? DUAL_POOLS : V4_POOLS);
        const want = expected(fams, policy, v6pool);
        if ('refused' in want) {
          t.match(errors, `services[0].${want.refused}:`, `${name}: refused at ${want.refused}`);
          continue;
        }
        t.equal(errors, '', `${name}: accepted`);
        t.same(services.map((s) => s.family), want.served, `${name}: serves ${want.served.join(', ')}`);
        t.same(services.map((s) => s.key), want.served.map((f) => familyServiceKey('default/web', f as 'IPv4' | 'IPv6')), `${name}: one family service per family`);
        for (const s of services) t.same(s.ipFamilies, want.served, `${name}: each knows the families served`);
      }
    }
  }
});

t.test('defaulting: no policy with two families is RequireDualStack; no ipFamilies is IPv4', async (t) => {
  const two = load('ipFamilies: [IPv6, IPv4]');
  t.same(two.services.map((s) => [s.key, s.family, s.ipFamilyPolicy]), [['default/web@IPv6', 'IPv6', 'RequireDualStack'], ['default/web', 'IPv4', 'RequireDualStack']], 'primary IPv6 first');
  const none = load('backends: ["10.0.0.11"]');
  t.same(none.services.map((s) => [s.key, s.family, s.ipFamilyPolicy]), [['default/web', 'IPv4', 'SingleStack']]);
  t.equal(none.services[0]!.familyNotes, undefined, 'nothing to say');
});

t.test('each family service forwards to the backends of its own family', async (t) => {
  const { services, errors } = load('ipFamilyPolicy: RequireDualStack');
  t.equal(errors, '');
  t.same(services.map((s) => [s.key, s.backends.map((b) => b.address)]), [['default/web', ['10.0.0.11']], ['default/web@IPv6', ['fd00:99::11']]]);
  t.equal(services[1]!.backends[0]!.family, 'IPv6');
  t.equal(services[0]!.backends[0]!.family, undefined, 'IPv4 backends keep their old shape');
  // A backend of a family the service never serves is a mistake worth saying.
  const single = load('ipFamilies: [IPv4]');
  t.match(single.errors, 'services[0].backends[1]: service default/web: "fd00:99::11" is IPv6, but the service asks for IPv4 only');
});

t.test('PreferDualStack without an IPv6 pool: IPv4, and why not IPv6', async (t) => {
  const { services, errors } = load('backends: ["10.0.0.11", "fd00:99::11"], ipFamilyPolicy: PreferDualStack', V4_POOLS);
  t.equal(errors, '');
  t.same(services.map((s) => s.key), ['default/web']);
  t.match(services[0]!.familyNotes, [/IPv6 not served \(PreferDualStack\): no pool lists IPv6 addresses for namespace default/]);
});

t.test('RequireDualStack without a pool of one family is refused, naming the field', async (t) => {
  const { errors } = load('ipFamilyPolicy: RequireDualStack', V4_POOLS);
  t.match(errors, 'services[0].ipFamilyPolicy: service default/web: RequireDualStack needs both families, and no pool lists IPv6 addresses for namespace default (looked for cidr-default, cidr-global, range-default, range-global under pools)');
});

t.test('loadBalancerIPs: one per family, inside its family\'s pool', async (t) => {
  const ok = load('ipFamilyPolicy: RequireDualStack, loadBalancerIPs: ["fd00:99::2aa", "10.99.0.210"]');
  t.equal(ok.errors, '');
  t.same(ok.services.map((s) => [s.key, s.loadBalancerIP]), [['default/web', '10.99.0.210'], ['default/web@IPv6', 'fd00:99::2aa']]);
  t.match(load('ipFamilyPolicy: RequireDualStack, loadBalancerIPs: ["fd00:99::2aa", "fd00:99::2ab"]').errors, 'services[0].loadBalancerIPs[1]: service default/web: fd00:99::2ab is a second IPv6 address (also fd00:99::2aa)');
  t.match(load('ipFamilyPolicy: RequireDualStack, loadBalancerIPs: ["fd00:98::1"]').errors, 'services[0].loadBalancerIPs[0]: service default/web: fd00:98::1 is not in pool range-global (fd00:99::200-fd00:99::2ff), the IPv6 pool of namespace default');
  t.match(load('backends: [], loadBalancerIP: "fd00:99::2aa"').errors, 'services[0].loadBalancerIP: service default/web: fd00:99::2aa is IPv6, but the service asks for IPv4 only');
  t.same(load('backends: [], ipFamilies: [IPv6], loadBalancerIP: "fd00:99::2aa"').services.map((s) => s.loadBalancerIP), ['fd00:99::2aa'], 'loadBalancerIP of the one family');
  t.match(load('ipFamilyPolicy: RequireDualStack, loadBalancerIP: "10.99.0.210", loadBalancerIPs: ["10.99.0.210"]').errors, 'services[0].loadBalancerIPs: service default/web: is set together with loadBalancerIP');
  // PreferDualStack: an address asked for outside every pool of its family is refused, not dropped.
  t.match(load('ipFamilyPolicy: PreferDualStack, loadBalancerIPs: ["10.99.0.210", "fd00:98::1"]').errors, 'services[0].loadBalancerIPs[1]:');
});

t.test('ipam: dhcp serves IPv6 (DHCPv6) in either stack, with no pool; one macvlan key for both families', async (t) => {
  const six = load('ipam: dhcp, ipFamilies: [IPv6], backends: ["fd00:99::11"]', 'pools: {}');
  t.equal(six.errors, '');
  t.same(six.services.map((s) => [s.key, s.family]), [['default/web@IPv6', 'IPv6']]);
  const dual = load('ipam: dhcp, ipFamilyPolicy: RequireDualStack', 'pools: {}');
  t.equal(dual.errors, '');
  t.same(dual.services.map((s) => [s.key, s.ipFamilies]), [['default/web', ['IPv4', 'IPv6']], ['default/web@IPv6', ['IPv4', 'IPv6']]]);
  const prefer = load('ipam: dhcp, ipFamilyPolicy: PreferDualStack');
  t.same(prefer.services.map((s) => s.key), ['default/web', 'default/web@IPv6'], 'PreferDualStack gets both');
  t.same(dual.services.map((s) => linkKeyOf(s.key)), ['default/web', 'default/web'], 'both families derive their macvlan and MAC from namespace/name');
});

t.test('VRRP serves IPv6 pool and DHCPv6 VIPs and dual-stack DHCP services, the IPv6 half tied to its IPv4 router; DSR serves either family', async (t) => {
  const dhcp6 = load('ipam: dhcp, ipFamilies: [IPv6], backends: ["fd00::11"]', `${DUAL_POOLS}\nfailover: { mode: vrrp }`);
  t.equal(dhcp6.errors, '', 'an IPv6-only DHCP service under VRRP');
  t.same(dhcp6.services.map((s) => [s.key, s.family, s.ipam]), [['default/web@IPv6', 'IPv6', 'dhcp']]);
  t.equal(tiedToIpv4(dhcp6.services[0]!), undefined, 'an IPv6-only DHCP service elects on its own IPv6 router');
  const req = load('ipam: dhcp, ipFamilyPolicy: RequireDualStack, backends: ["10.0.0.11", "fd00::11"]', `${DUAL_POOLS}\nfailover: { mode: vrrp }`);
  t.equal(req.errors, '', 'RequireDualStack with ipam: dhcp under VRRP');
  t.same(req.services.map((s) => [s.key, tiedToIpv4(s)]), [['default/web', undefined], ['default/web@IPv6', 'default/web']], 'its IPv6 VIP follows the IPv4 router');
  const v6first = load('ipam: dhcp, ipFamilies: [IPv6, IPv4], ipFamilyPolicy: PreferDualStack, backends: ["10.0.0.11", "fd00::11"]', `${DUAL_POOLS}\nfailover: { mode: vrrp }`);
  t.equal(v6first.errors, '', 'an IPv6-primary dual-stack DHCP service too');
  t.same(v6first.services.map((s) => [s.key, tiedToIpv4(s)]), [['default/web@IPv6', 'default/web'], ['default/web', undefined]], 'tied to the IPv4 router whichever family is primary (the DHCPv4 source owns the macvlan)');
  const dhcpPrefer = load('ipam: dhcp, ipFamilyPolicy: PreferDualStack', `${DUAL_POOLS}\nfailover: { mode: vrrp }`);
  t.same(dhcpPrefer.services.map((s) => s.key), ['default/web', 'default/web@IPv6'], 'PreferDualStack under VRRP serves both DHCP VIPs');
  t.same(dhcpPrefer.services[0]!.familyNotes ?? [], [], 'with no note');
  t.equal(tiedToIpv4(load('ipFamilyPolicy: RequireDualStack, backends: ["10.0.0.11", "fd00::11"]', `${DUAL_POOLS}\nfailover: { mode: vrrp }`).services[1]!), undefined, 'a dual-stack pool service elects per family');
  const v4peers = load('ipam: dhcp, ipFamilyPolicy: RequireDualStack, backends: ["10.0.0.11", "fd00::11"]', `${DUAL_POOLS}\nfailover: { mode: vrrp, peers: ["10.0.0.3"] }`);
  t.equal(v4peers.errors, '', 'IPv4 peers are enough: the tied IPv6 VIP has no IPv6 instance');
  const vrrp = `${DUAL_POOLS}\nfailover: { mode: vrrp }`;
  const v6 = load('ipFamilies: [IPv6], backends: ["fd00::11"]', vrrp);
  t.equal(v6.errors, '', 'an IPv6 VIP under VRRP');
  t.same(v6.services.map((s) => [s.key, s.family]), [['default/web@IPv6', 'IPv6']]);
  t.equal(load('backends: ["10.0.0.11"]', vrrp).errors, '', 'IPv4 under VRRP as before');
  // failover.peers: one instance per family, so peers for each family with VIPs.
  const peers = (p: string): string => `${DUAL_POOLS}\nfailover: { mode: vrrp, peers: ${p} }`;
  t.match(load('ipFamilyPolicy: RequireDualStack, backends: ["10.0.0.11", "fd00::11"]', peers('["10.0.0.3"]')).errors,
    'failover.peers: lists no IPv6 address, but service default/web@IPv6 has an IPv6 VIP: its IPv6 VRRP instance would hear adverts from any host');
  t.equal(load('ipFamilies: [IPv6], backends: ["fd00::11"]', peers('["fe80::3"]')).errors, '', 'IPv6 peers alone for an IPv6-only service');
  t.match(load('backends: ["10.0.0.11"]', peers('["fe80::3"]')).errors, 'failover.peers: lists no IPv4 address, but service default/web has an IPv4 VIP');
  t.match(load('ipFamilies: [IPv6], backends: ["fd00::11"]', peers('["ff02::12"]')).errors, 'failover.peers[0]: ff02::12 is not an address another agent sends VRRP adverts from');
  t.match(load('ipFamilies: [IPv6], backends: ["fd00::11"]', peers('["::1"]')).errors, 'failover.peers[0]: ::1 is not an address');
  t.match(load('backends: ["10.0.0.11"]', peers('["10.0.0.3", "not-an-address"]')).errors, 'failover.peers[1]');
  const both = parseConfigText(`${peers('["10.0.0.3", "FE80::0003", "fd00::3"]')}\nservices: []`);
  t.ok(both.ok, 'peers of both families');
  if (both.ok) t.same([both.config.failover.peers, both.config.failover.peers6], [[0x0a000003], ['fe80::3', 'fd00::3']], 'split by family, IPv6 in RFC 5952 text');
  const vrid6 = parseConfigText(`failover: { mode: vrrp, vrid6: 300 }\nservices: []`);
  t.match(vrid6.ok ? '' : vrid6.errors.map((e) => `${e.path}: ${e.message}`).join('\n'), 'failover.vrid6');
  // Direct server return serves each family's VIP from that family's backends.
  const dsr = load('sourceIP: preserve, ipFamilyPolicy: RequireDualStack');
  t.equal(dsr.errors, '', 'sourceIP: preserve with both families');
  t.same(dsr.services.map((s) => [s.key, s.family ?? 'IPv4', s.sourceIP, s.backends.map((b) => b.address)]),
    [['default/web', 'IPv4', 'preserve', ['10.0.0.11']], ['default/web@IPv6', 'IPv6', 'preserve', ['fd00:99::11']]]);
  const six = load('sourceIP: preserve, ipFamilies: [IPv6], backends: ["fd00:99::11", "fd00:99::12"]');
  t.equal(six.errors, '', 'IPv6 only with sourceIP: preserve');
  t.same(six.services.map((s) => [s.family, s.sourceIP]), [['IPv6', 'preserve']]);
});

t.test('SingleStack with two families is refused, as the apiserver does', async (t) => {
  t.match(load('ipFamilies: [IPv4, IPv6], ipFamilyPolicy: SingleStack').errors, 'services[0].ipFamilies: service default/web: [IPv4, IPv6] lists two families, but ipFamilyPolicy is SingleStack');
  t.match(load('ipFamilies: [IPv4, IPv4]').errors, 'services[0].ipFamilies:', 'a family twice');
  t.match(load('ipFamilies: [IPv5]').errors, 'services[0].ipFamilies[0]: "IPv5" is not one of IPv4, IPv6');
  t.match(load('ipFamilyPolicy: DualStack').errors, 'services[0].ipFamilyPolicy: "DualStack" is not one of SingleStack, PreferDualStack, RequireDualStack');
});

t.test('Share IP: a secondary rides each VIP of its primary, with backends of each family', async (t) => {
  const res = parseConfigText(`${DUAL_POOLS}
services:
  - { name: web, ports: [{ port: 80 }], ipFamilyPolicy: RequireDualStack, backends: ["10.0.0.11", "fd00:99::11"] }
  - { name: api, primaryService: web, ports: [{ port: 81 }], backends: ["fd00:99::12"] }
`, 'test');
  t.ok(res.ok, res.ok ? 'loads' : formatConfigErrors(res.errors));
  if (res.ok) {
    t.same(res.config.services.map((s) => [s.key, s.primaryService, s.backends.length]), [
      ['default/web', undefined, 1], ['default/web@IPv6', undefined, 1], ['default/api', 'default/web', 0], ['default/api@IPv6', 'default/web@IPv6', 1],
    ]);
  }
  const bad = parseConfigText(`${DUAL_POOLS}
services:
  - { name: web, ports: [{ port: 80 }] }
  - { name: api, primaryService: web, ports: [{ port: 81 }], ipFamilies: [IPv6], backends: ["fd00:99::12"] }
`, 'test');
  t.notOk(bad.ok);
  if (!bad.ok) {
    const text = formatConfigErrors(bad.errors);
    t.match(text, 'services[1].ipFamilies: service default/api shares the IPs of default/web; a secondary has the primary\'s families');
    t.match(text, 'services[1].backends[0]: service default/api: "fd00:99::12" is IPv6, but default/web, whose IPs it shares, is IPv4 only');
  }
});

t.test('pools: both families in one key; lookup by family', async (t) => {
  const { pools, errors } = parsePools({ 'cidr-prod': '10.0.0.0/29', 'range-global': '10.99.0.200-10.99.0.220,fd00:99::200-fd00:99::2ff', 'cidr-dev': 'fd00:1::/126' });
  t.same(errors, []);
  t.equal(selectPool(pools, 'prod', 'IPv4')?.key, 'cidr-prod');
  t.equal(selectPool(pools, 'prod', 'IPv6')?.key, 'range-global', 'an IPv4-only key does not shadow IPv6');
  t.same(pools.find((p) => p.key === 'cidr-dev')!.ranges.map((r) => [r.start, r.end]), [[(0xfd00n << 112n) | (1n << 96n) | 1n, (0xfd00n << 112n) | (1n << 96n) | 3n]], 'IPv6 CIDR: the subnet-router anycast address left out');
  const bad = parsePools({ 'range-global': '10.0.0.1-fd00::1', 'cidr-global': 'fd00::1/64', 'range-x': 'fd00::5-fd00::1' });
  const text = bad.errors.map((e) => `${e.key}: ${e.message}`).join('\n');
  t.match(text, 'range-global: "10.0.0.1-fd00::1" mixes families');
  t.match(text, 'cidr-global: "fd00::1/64" has host bits set; did you mean fd00::/64?');
  t.match(text, 'range-x: "fd00::5-fd00::1" is reversed');
  const overlap = parsePools({ 'range-a': 'fd00::1-fd00::9', 'cidr-b': 'fd00::/124' });
  t.match(overlap.errors.map((e) => e.message).join('\n'), 'overlaps');
  t.same(parsePools({ 'range-a': '10.0.0.1-10.0.0.9', 'range-b': '::a00:1-::a00:9' }).errors, [], 'the same numbers in two families do not overlap');
});

t.test('the userspace proxy serves IPv6 VIPs: dataplane proxy and proxyProtocol take both families', async (t) => {
  const proxy = `${DUAL_POOLS}\ndataplane: proxy`;
  t.equal(load('ipFamilies: [IPv6], backends: ["fd00:99::11"]', proxy).errors, '', 'an IPv6 VIP on the proxy');
  t.same(load('ipFamilies: [IPv6], backends: ["fd00:99::11"]', proxy).services.map((s) => s.key), ['default/web@IPv6']);
  t.same(load('ipFamilyPolicy: PreferDualStack', proxy).services.map((s) => s.key), ['default/web', 'default/web@IPv6'], 'PreferDualStack: both families on the proxy');
  const pp = load('ipFamilyPolicy: RequireDualStack, proxyProtocol: v2', DUAL_POOLS);
  t.equal(pp.errors, '', 'the PROXY protocol with IPv6');
  t.same(pp.services.map((s) => s.key), ['default/web', 'default/web@IPv6']);
});
