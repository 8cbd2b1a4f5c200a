// Preflight fact parsers: what /proc, /sys, /lib/modules, rpm and dpkg say,
// read exactly (the I/O around them is covered by the privileged tests), and
// the daemon asked over a real unix socket.
import t from 'tap';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  parseCapEff, parseOsRelease, procModulesHas, moduleListHas, kernelConfigValue,
  parseRpmQuery, parseDpkgQuery, parseIpJsonAddrs, parseIpJsonAllAddrs, sysctlIfName, configSummary, findBinary, NFT_PROBE_RULESET, nftProbeRuleset, parseNftRuleset, askDaemon,
} from '../../agent/preflight/facts';
import { parseConfigText } from '../../agent/config/load';

t.test('CapEff', async (t) => {
  t.equal(parseCapEff('Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n'), '000001fffeffffff');
  t.equal(parseCapEff('Name: x\n'), undefined);
});

t.test('os-release', async (t) => {
  const o = parseOsRelease('NAME="SLES"\nVERSION_ID="15.5"\nID="sles"\nID_LIKE="suse"\nPRETTY_NAME="SUSE Linux Enterprise Server 15 SP5"\n# comment\n');
  t.equal(o.ID, 'sles');
  t.equal(o.ID_LIKE, 'suse');
  t.equal(o.PRETTY_NAME, 'SUSE Linux Enterprise Server 15 SP5');
  t.equal(parseOsRelease("ID=ubuntu\nID_LIKE=debian\n").ID_LIKE, 'debian');
});

t.test('module lists: /proc/modules, modules.builtin, modules.dep (compressed too)', async (t) => {
  t.ok(procModulesHas('macvlan 36864 0 - Live 0x0000000000000000\nveth 40960 0 - Live 0x0\n', 'macvlan'));
  t.notOk(procModulesHas('macvtap 1 0 - Live 0\n', 'macvlan'));
  t.ok(moduleListHas('kernel/drivers/net/veth.ko\nkernel/drivers/net/macvlan.ko\n', 'macvlan'));
  t.ok(moduleListHas('kernel/drivers/net/macvlan.ko.zst: \nkernel/drivers/net/macvtap.ko.zst: kernel/drivers/net/macvlan.ko.zst kernel/drivers/net/tap.ko.zst\n', 'macvlan'));
  t.ok(moduleListHas('kernel/drivers/net/macvlan.ko.xz:\n', 'macvlan'));
  t.notOk(moduleListHas('kernel/drivers/net/macvtap.ko.zst: kernel/drivers/net/macvlan.ko.zst\n', 'macvlan'), 'a dependency of another module is not an entry');
  t.notOk(moduleListHas('kernel/drivers/net/ipvlan/ipvlan.ko:\n', 'macvlan'));
});

t.test('kernel config', async (t) => {
  t.equal(kernelConfigValue('CONFIG_MACVTAP=m\nCONFIG_MACVLAN=m\n', 'MACVLAN'), 'm');
  t.equal(kernelConfigValue('CONFIG_MACVLAN=y\n', 'MACVLAN'), 'y');
  t.equal(kernelConfigValue('# CONFIG_MACVLAN is not set\n', 'MACVLAN'), 'n');
  t.equal(kernelConfigValue('CONFIG_VETH=y\n', 'MACVLAN'), undefined);
});

t.test('rpm and dpkg queries', async (t) => {
  t.same(parseRpmQuery('package kernel-default is not installed\nkernel-default-base\t5.14.21-150500.55.19.1\npackage kernel-default-extra is not installed\n'),
    [{ name: 'kernel-default-base', version: '5.14.21-150500.55.19.1' }]);
  t.same(parseDpkgQuery('linux-image-5.15.0-91-generic\t5.15.0-91.101\tii \nlinux-modules-extra-5.15.0-88-generic\t5.15.0-88.98\trc \nlinux-image-virtual\t5.15.0.91.88\tii \n'),
    [{ name: 'linux-image-5.15.0-91-generic', version: '5.15.0-91.101' }, { name: 'linux-image-virtual', version: '5.15.0.91.88' }],
    'removed packages (rc) are not installed');
});

t.test('ip -j addr', async (t) => {
  const json = JSON.stringify([{ ifname: 'eth0', addr_info: [{ family: 'inet', local: '10.99.0.2', prefixlen: 24 }, { family: 'inet', local: '10.99.0.9', prefixlen: 32 }, { family: 'inet6', local: 'fe80::1', prefixlen: 64 }] }]);
  t.same(parseIpJsonAddrs(json), ['10.99.0.2/24', '10.99.0.9/32']);
  const six = JSON.stringify([{ ifname: 'eth1', addr_info: [{ family: 'inet6', local: 'fd00:98::2', prefixlen: 64, scope: 'global' }, { family: 'inet6', local: 'fe80::1', prefixlen: 64, scope: 'link' }, { family: 'inet', local: '10.98.0.2', prefixlen: 24 }] }]);
  t.same(parseIpJsonAddrs(six, 'inet6'), ['fd00:98::2/64'], 'IPv6: global scope only, the link-local one is no LAN subnet');
  t.same(parseIpJsonAddrs('not json'), []);
  t.same(parseIpJsonAddrs('[]'), []);
});

t.test('sysctl spelling of interface names', async (t) => {
  t.equal(sysctlIfName('eth0'), 'eth0');
  t.equal(sysctlIfName('eth0.100'), 'eth0/100');
});

t.test('config summary: what the checks need, secondaries create no macvlan', async (t) => {
  const r = parseConfigText(`node: { interface: eth1 }
dataplane: proxy
stateDir: /srv/lb
pools: { cidr-default: 10.99.0.96/28 }
services:
  - { name: web, ipam: dhcp, ports: [{ port: 80 }], backends: [10.99.0.11] }
  - { name: web2, primaryService: default/web, ports: [{ port: 443 }], backends: [10.99.0.11] }
  - { name: db, proxyProtocol: v1, ports: [{ port: 5432 }], backends: [10.99.0.12] }
`, 'h');
  if (!r.ok) { t.fail(JSON.stringify(r.errors)); return; }
  const s = configSummary('/etc/x.yaml', r.config);
  t.equal(s.status, 'ok');
  t.equal(s.interface, 'eth1');
  t.equal(s.dataplane, 'proxy');
  t.equal(s.stateDir, '/srv/lb');
  t.same(s.pools, [{ key: 'cidr-default', ranges: [{ text: '10.99.0.96/28', first: '10.99.0.97', last: '10.99.0.110' }] }]);
  t.same(s.ports.map((p) => p.port), [80, 443, 5432]);
  t.same(s.dhcpServices, ['default/web']);
  t.equal(s.services, 3);
  t.same(s.proxyOnly, ['default/db'], 'services only the proxy path can serve (PROXY protocol)');
});

t.test('issue 17: the summary lists DSR services, backend VIPs and each service\'s zones', async (t) => {
  const r = parseConfigText(`pools: { range-global: 10.99.0.200-10.99.0.210 }
backend: { vips: [10.99.0.250] }
services:
  - name: web
    sourceIP: preserve
    topology: prefer-zone
    ports: [{ port: 80 }]
    backends: [{ address: 10.99.0.11, zone: b }, { address: 10.99.0.12, zone: a }, 10.99.0.13]
  - { name: db, ports: [{ port: 5432 }], backends: [10.99.0.12] }
`, 'h');
  if (!r.ok) { t.fail(JSON.stringify(r.errors)); return; }
  const s = configSummary('/etc/x.yaml', r.config);
  t.same(s.dsrServices, ['default/web']);
  t.same(s.backendVips, ['10.99.0.250']);
  t.same(s.topology, [{ service: 'default/web', policy: 'prefer-zone', zones: ['a', 'b'], unzoned: 1 }, { service: 'default/db', policy: 'any', zones: [], unzoned: 1 }]);
  t.same(s.dsrTableServices, [], 'IPv4 on the parent: the BPF program serves it');
});

t.test('the DSR services the BPF program does not serve: a named network\'s (it serves both families on the parent)', async (t) => {
  const r = parseConfigText(`node: { interface: eth0 }
pools: { range-global: '10.99.0.200-10.99.0.210,fd00:99::200-fd00:99::210' }
networks: { vmnet: { interface: eth1, pools: { range-global: 10.98.0.200-10.98.0.201 } } }
services:
  - { name: web, sourceIP: preserve, ipFamilyPolicy: RequireDualStack, ports: [{ port: 80 }], backends: [10.99.0.11, 'fd00:99::11'] }
  - { name: vm, network: vmnet, sourceIP: preserve, ports: [{ port: 80 }], backends: [10.98.0.11] }
`, 'h');
  if (!r.ok) { t.fail(JSON.stringify(r.errors)); return; }
  const s = configSummary('/etc/x.yaml', r.config);
  t.same(s.dsrServices, ['default/web', 'default/web@IPv6', 'default/vm']);
  t.same(s.dsrTableServices, ['default/vm']);
});

t.test('issue 17: every IPv4 address from `ip -j -4 addr`, and whether its interface answers ARP', async (t) => {
  const json = JSON.stringify([
    { ifindex: 1, ifname: 'lo', flags: ['LOOPBACK', 'UP', 'LOWER_UP'], addr_info: [{ family: 'inet', local: '127.0.0.1', prefixlen: 8 }, { family: 'inet', local: '10.99.0.250', prefixlen: 32 }] },
    { ifindex: 2, ifname: 'eth0', flags: ['BROADCAST', 'MULTICAST', 'UP'], addr_info: [{ family: 'inet', local: '10.99.0.5', prefixlen: 24 }] },
    { ifindex: 3, ifname: 'tun0', flags: ['POINTOPOINT', 'NOARP', 'UP'], addr_info: [{ family: 'inet', local: '10.8.0.1', prefixlen: 32 }] },
  ]);
  t.same(parseIpJsonAllAddrs(json), [
    { interface: 'lo', address: '127.0.0.1', prefix: 8, noarp: true },
    { interface: 'lo', address: '10.99.0.250', prefix: 32, noarp: true },
    { interface: 'eth0', address: '10.99.0.5', prefix: 24, noarp: false },
    { interface: 'tun0', address: '10.8.0.1', prefix: 32, noarp: true },
  ]);
  t.same(parseIpJsonAllAddrs('not json'), []);
});

t.test('findBinary searches PATH, then the sbin directories', async (t) => {
  t.ok(findBinary('sh', ''), 'sh found without PATH');
  t.equal(findBinary('no-such-binary-lbchk', '/nonexistent'), undefined);
  t.match(NFT_PROBE_RULESET, /type nat hook prerouting/);
});

t.test('the dataplane probe ruleset asks for jhash only with VRRP', async (t) => {
  t.notMatch(nftProbeRuleset('round-robin'), /jhash/);
  t.equal(nftProbeRuleset('round-robin'), NFT_PROBE_RULESET);
  t.match(nftProbeRuleset('flow-hash'), /dnat to jhash ip saddr \. tcp sport mod 2 seed 0x1 map/);
});

t.test('nft -j list ruleset: the nftables array, undefined for anything else', async (t) => {
  const text = fs.readFileSync(path.resolve(__dirname, '..', '..', '..', 'test', 'preflight', 'fixtures', 'rulesets', 'docker.json'), 'utf8');
  const rs = parseNftRuleset(text)!;
  t.ok(rs.some((o) => (o as { chain?: { name?: string } }).chain?.name === 'FORWARD'));
  t.equal(parseNftRuleset('Error: Could not process rule: Operation not permitted'), undefined);
  t.equal(parseNftRuleset('{"tables": []}'), undefined);
});

t.test('askDaemon: the drift part of a real control socket\'s status; no socket is not-run at once; silence is bounded', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbchk-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'agent.sock');
  const fights = ['table ip lb_agent: 12 repairs in 60 s; repairs wait, doubling, while it goes on'];
  const server = net.createServer((c) => {
    c.once('data', (d) => c.end(`${JSON.stringify({ ok: true, data: { pid: 4242, drift: { repairs: { table: 12, address: 1 }, fights, outstanding: [], lastResync: 1 } } })}\n`, () => void d));
  });
  await new Promise<void>((resolve) => server.listen(sock, resolve));
  t.teardown(() => server.close());
  t.match(await askDaemon(sock), { status: 'ok', socket: sock, pid: 4242, drift: { repairs: 13, fights } });

  const t0 = Date.now();
  t.match(await askDaemon(path.join(dir, 'none.sock')), { status: 'not-run', error: `no daemon answers on ${path.join(dir, 'none.sock')} (ENOENT)` });
  t.ok(Date.now() - t0 < 200, 'a missing socket costs no wait');

  const mute = path.join(dir, 'mute.sock');
  const silent = net.createServer(() => { /* accepts, never answers */ });
  await new Promise<void>((resolve) => silent.listen(mute, resolve));
  t.teardown(() => silent.close());
  t.match(await askDaemon(mute, 100), { status: 'failed', error: /no answer from .* within 100 ms/ });
});
