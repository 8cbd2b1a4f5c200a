// Preflight checks, replayed from recorded Facts (test/preflight/fixtures):
// one fixture per way a VM can stop lb-agent, asserting the status a user
// sees and that the remedy names the fix.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { udpSnatPorts, type Facts } from '../../agent/preflight/facts';
import { vipSysctls } from '../../agent/net/sysctl/sysctl';
import {
  runChecks, checkDescriptors, checkMacvlan, checkCapabilities, checkInterface, checkArpSysctls, checkRpFilter, checkIpForward,
  checkConfig, checkDataplane, checkPools, checkStateDir, checkGuestAgent, checkDhcpProbe, checkDhcp6Probe, classifyRefusal,
  effectiveDataplane, osFamily, checkDsr, checkDsrBackend, checkTopology, checkConntrackPickup, checkUdpFlows, checkStaleFlows, checkFirewall, checkDriftFight, checkIpv6, checkNetworks, checkVrrpTrack, checkNatEngine, type CheckResult,
} from '../../agent/preflight/checks';

const FIX = path.resolve(__dirname, '..', '..', '..', 'test', 'preflight', 'fixtures');

function fixture(name: string): Facts {
  return JSON.parse(fs.readFileSync(path.join(FIX, `${name}.json`), 'utf8')) as Facts;
}

/** A fixture with a change applied (for variants of one machine). */
function variant(name: string, edit: (f: Facts) => void): Facts {
  const f = fixture(name);
  edit(f);
  return f;
}

function byId(results: CheckResult[], id: string): CheckResult {
  const r = results.find((x) => x.id === id);
  if (!r) throw new Error(`no check ${id}`);
  return r;
}

t.test('every fixture parses and yields one result per check, remedies exactly on non-passes', async (t) => {
  const files = fs.readdirSync(FIX).filter((f) => f.endsWith('.json'));
  t.ok(files.length >= 15, `fixtures present (${files.length})`);
  for (const file of files) {
    const results = runChecks(fixture(file.replace(/\.json$/, '')));
    const ids = results.map((r) => r.id);
    t.same(ids.slice(0, 11), ['config', 'state-dir', 'capabilities', 'macvlan', 'interface', 'pools', 'arp-sysctls', 'rp-filter', 'ip-forward', 'dataplane', 'guest-agent'], file);
    for (const r of results) {
      t.ok(r.detail.length > 0, `${file} ${r.id} has a detail`);
      if (r.status === 'pass') t.equal(r.remedy, undefined, `${file} ${r.id}: no remedy on a pass`);
      else t.ok(r.remedy && r.remedy.length > 0, `${file} ${r.id}: a remedy on ${r.status}`);
    }
  }
});

t.test('a healthy VM passes everything', async (t) => {
  const results = runChecks(fixture('healthy'));
  t.same(results.filter((r) => r.status !== 'pass'), []);
  t.match(byId(results, 'macvlan').detail, /created and deleted a macvlan/);
  t.match(byId(results, 'macvlan').detail, /module loaded/);
});

t.test('macvlan: SLES with kernel-default-base fails and names kernel-default', async (t) => {
  const r = checkMacvlan(fixture('sles-kernel-default-base'));
  t.equal(r.status, 'fail');
  t.equal(r.remedy, 'install kernel-default (zypper in kernel-default) and reboot');
  t.match(r.detail, /Unknown device type/);
  t.match(r.detail, /kernel-default-base 5\.14\.21/);
  t.match(r.detail, /Module macvlan not found in directory \/lib\/modules\/5\.14\.21-150500\.55\.19-default/);
  t.match(r.detail, /modules\.dep: not listed/);
  t.match(r.detail, /Pending/, 'says what the user would otherwise see');
});

t.test('macvlan: kernel-default installed but not booted: reboot', async (t) => {
  const r = checkMacvlan(fixture('sles-kernel-default-not-rebooted'));
  t.equal(r.status, 'fail');
  t.match(r.remedy, /^reboot into the installed kernel-default/);
  t.match(r.detail, /no \/lib\/modules\/5\.14\.21-150500\.55\.19-default/);
});

t.test('macvlan: a built-in driver is in no module list and passes', async (t) => {
  const r = checkMacvlan(fixture('builtin-no-modules'));
  t.equal(r.status, 'pass');
  t.match(r.detail, /built into the kernel \(listed in no module list\)/);
  const withConfig = checkMacvlan(variant('builtin-no-modules', (f) => { f.macvlan.kernelConfig = 'y'; }));
  t.match(withConfig.detail, /CONFIG_MACVLAN=y/);
  const withBuiltin = checkMacvlan(variant('builtin-no-modules', (f) => { f.macvlan.modulesDir = true; f.macvlan.builtin = true; }));
  t.match(withBuiltin.detail, /modules\.builtin/);
});

t.test('macvlan: loadable but not loaded, and not loaded on demand: warn, load at boot', async (t) => {
  const r = checkMacvlan(fixture('loadable-not-loaded'));
  t.equal(r.status, 'warn');
  t.match(r.detail, /until modprobe macvlan loaded the module/);
  t.match(r.remedy, /\/etc\/modules-load\.d\/lb-agent\.conf/);
});

t.test('macvlan: Ubuntu without linux-modules-extra names the package for the running kernel', async (t) => {
  const r = checkMacvlan(fixture('ubuntu-no-modules-extra'));
  t.equal(r.status, 'fail');
  t.match(r.remedy, /apt-get install linux-modules-extra-5\.15\.0-91-generic/);
  const kvm = checkMacvlan(variant('ubuntu-no-modules-extra', (f) => {
    f.host.kernelRelease = '5.15.0-1050-kvm';
    for (const p of f.macvlan.packages.installed) p.name = p.name.replace('5.15.0-91-generic', '5.15.0-1050-kvm');
  }));
  t.match(kvm.detail, /-kvm flavour/);
  t.match(kvm.remedy, /linux-image-virtual/);
  const gone = checkMacvlan(variant('ubuntu-no-modules-extra', (f) => { f.macvlan.modulesDir = false; }));
  t.match(gone.remedy, /reboot/);
  // generic and aws ship macvlan.ko in the base linux-modules package: that one first.
  const noBase = checkMacvlan(variant('ubuntu-no-modules-extra', (f) => {
    f.macvlan.packages.installed = f.macvlan.packages.installed.filter((p) => !p.name.startsWith('linux-modules-'));
  }));
  t.equal(noBase.remedy, 'apt-get install linux-modules-5.15.0-91-generic (no reboot needed for the running kernel)');
  const both = checkMacvlan(variant('ubuntu-no-modules-extra', (f) => {
    f.macvlan.packages.installed.push({ name: 'linux-modules-extra-5.15.0-91-generic', version: '5.15.0-91.101' });
  }));
  t.match(both.remedy, /--reinstall/);
});

t.test('macvlan: Debian kernel built without CONFIG_MACVLAN names a Debian kernel for this arch', async (t) => {
  const r = checkMacvlan(fixture('debian-no-config-macvlan'));
  t.equal(r.status, 'fail');
  t.match(r.detail, /CONFIG_MACVLAN is not set/);
  t.match(r.remedy, /linux-image-cloud-amd64/);
  const arm = checkMacvlan(variant('debian-no-config-macvlan', (f) => { f.host.arch = 'arm64'; }));
  t.match(arm.remedy, /linux-image-cloud-arm64/);
  const missingKo = checkMacvlan(variant('debian-no-config-macvlan', (f) => { f.macvlan.kernelConfig = 'm'; }));
  t.match(missingKo.remedy, /--reinstall linux-image-6\.1\.0-custom/);
});

t.test('macvlan: no service by DHCP turns the failure into a warning', async (t) => {
  const r = checkMacvlan(variant('sles-kernel-default-base', (f) => { f.config.dhcpServices = []; }));
  t.equal(r.status, 'warn');
  t.equal(r.remedy, 'install kernel-default (zypper in kernel-default) and reboot');
});

t.test('macvlan: untestable without privileges falls back to the module files', async (t) => {
  const f = fixture('no-capabilities');
  const r = checkMacvlan(f);
  t.equal(r.status, 'pass', 'CONFIG_MACVLAN=y: present');
  t.match(r.detail, /could not test: RTNETLINK answers: Operation not permitted/);
  const unknown = checkMacvlan(variant('no-capabilities', (x) => { delete x.macvlan.kernelConfig; }));
  t.equal(unknown.status, 'warn');
  const missing = checkMacvlan(variant('sles-kernel-default-base', (x) => { x.macvlan.create = { status: 'failed', error: 'RTNETLINK answers: Operation not permitted' }; }));
  t.equal(missing.status, 'fail', 'module files prove it missing even when the test could not run');
  const noTools = checkMacvlan(variant('healthy', (x) => { x.macvlan.create = { status: 'not-run', error: 'unshare not found' }; x.macvlan.procModules = 'not-loaded'; x.macvlan.sysModule = false; }));
  t.equal(noTools.status, 'warn');
  t.match(noTools.remedy, /util-linux/);
});

t.test('macvlan: loopback fallback when the kernel has no veth', async (t) => {
  const r = checkMacvlan(variant('builtin-no-modules', (f) => { f.macvlan.create = { status: 'ok', ms: 3, parent: 'loopback' }; }));
  t.equal(r.status, 'pass');
  t.match(r.detail, /loopback parent/);
});

t.test('classifyRefusal', async (t) => {
  t.equal(classifyRefusal('Error: Unknown device type.'), 'unsupported');
  t.equal(classifyRefusal('RTNETLINK answers: Operation not supported'), 'unsupported');
  t.equal(classifyRefusal('RTNETLINK answers: Operation not permitted'), 'permission');
  t.equal(classifyRefusal('unshare: unshare failed: Operation not permitted'), 'permission');
  t.equal(classifyRefusal('something else'), 'other');
  t.equal(classifyRefusal(undefined), 'other');
});

t.test('capabilities: both network capabilities missing are named', async (t) => {
  const r = checkCapabilities(fixture('no-capabilities'));
  t.equal(r.status, 'fail');
  t.match(r.detail, /missing CAP_NET_ADMIN and CAP_NET_RAW/);
  t.match(r.remedy, /AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW/);
  t.equal(checkCapabilities(fixture('healthy')).status, 'pass');
  t.equal(checkCapabilities(variant('healthy', (f) => { delete f.caps.effective; })).status, 'warn');
});

t.test('capabilities: CAP_NET_BIND_SERVICE only when the proxy serves a port below 1024', async (t) => {
  const r = checkCapabilities(fixture('proxy-no-bind-service'));
  t.equal(r.status, 'fail');
  t.match(r.detail, /CAP_NET_BIND_SERVICE/);
  t.match(r.detail, /port 80\b/);
  t.notMatch(r.detail, /5432/);
  // auto with nftables working: the kernel path forwards, nothing to bind.
  t.equal(checkCapabilities(variant('proxy-no-bind-service', (f) => { f.config.dataplane = 'auto'; })).status, 'pass');
  // auto without nftables: the proxy binds.
  t.equal(checkCapabilities(variant('proxy-no-bind-service', (f) => { f.config.dataplane = 'auto'; f.nft.probe = { status: 'failed', error: 'x' }; })).status, 'fail');
  // only high ports: nothing to bind below 1024.
  t.equal(checkCapabilities(variant('proxy-no-bind-service', (f) => { f.config.ports = [{ service: 'a/b', port: 8080, protocol: 'TCP' }]; })).status, 'pass');
});

t.test('interface: missing NIC lists the ones present', async (t) => {
  const r = checkInterface(fixture('interface-missing'));
  t.equal(r.status, 'fail');
  t.match(r.detail, /ens7 \(node\.interface\) does not exist/);
  t.match(r.remedy, /enp1s0, enp2s0/);
  const none = checkInterface(variant('interface-missing', (f) => { f.parent = { ...f.parent, source: 'none' }; delete f.parent.name; }));
  t.match(none.detail, /no default route/);
});

t.test('interface: no carrier, administratively down, no address', async (t) => {
  const r = checkInterface(fixture('no-carrier'));
  t.equal(r.status, 'fail');
  t.match(r.detail, /no carrier/);
  t.match(r.remedy, /attached to a VM network/);
  const down = checkInterface(variant('no-carrier', (f) => { f.parent.flags = 0x1002; }));
  t.match(down.detail, /is down/);
  t.match(down.remedy, /ip link set dev eth0 up/);
  const noAddr = checkInterface(variant('healthy', (f) => { f.parent.addresses = []; }));
  t.equal(noAddr.status, 'fail');
  t.match(noAddr.detail, /no IPv4 address/);
  const unknownOk = checkInterface(variant('healthy', (f) => { f.parent.operstate = 'unknown'; }));
  t.equal(unknownOk.status, 'pass', 'operstate unknown with carrier is fine (virtual NICs)');
});

t.test('sysctls: ARP flux and strict rp_filter warn with the exact sysctls', async (t) => {
  const f = fixture('bad-sysctls');
  const arp = checkArpSysctls(f);
  t.equal(arp.status, 'warn');
  t.match(arp.remedy, /net\.ipv4\.conf\.eth0\.arp_ignore=1/);
  t.match(arp.remedy, /net\.ipv4\.conf\.eth0\.arp_announce=2/);
  t.match(arp.remedy, /net\.ipv4\.conf\.default\.arp_ignore=1/);
  t.match(arp.remedy, /\/etc\/sysctl\.d\/90-lb-agent\.conf/);
  const rp = checkRpFilter(f);
  t.equal(rp.status, 'warn');
  t.match(rp.detail, /strict/);
  t.match(rp.remedy, /net\.ipv4\.conf\.all\.rp_filter=2/);
  // all wins: arp_announce=2 in all fixes every interface (the kernel takes the max).
  const allWins = checkArpSysctls(variant('bad-sysctls', (x) => {
    x.sysctls['net.ipv4.conf.all.arp_announce'] = '2';
    x.sysctls['net.ipv4.conf.all.arp_ignore'] = '1';
  }));
  t.equal(allWins.status, 'pass');
  // arp_ignore=8 in all (never answer) cannot be fixed per interface.
  const eight = checkArpSysctls(variant('healthy', (x) => { x.sysctls['net.ipv4.conf.all.arp_ignore'] = '8'; }));
  t.equal(eight.status, 'warn');
  t.match(eight.remedy, /net\.ipv4\.conf\.all\.arp_ignore=1/);
  // An interface with a dot in its name is spelled with a slash by sysctl(8).
  const vlan = checkArpSysctls(variant('bad-sysctls', (x) => {
    x.parent.name = 'eth0.100';
    x.sysctls['net.ipv4.conf.eth0/100.arp_ignore'] = '0';
    x.sysctls['net.ipv4.conf.eth0/100.arp_announce'] = '0';
  }));
  t.match(vlan.remedy, /net\.ipv4\.conf\.eth0\/100\.arp_ignore=1/);
  // rp_filter only matters for macvlan VIPs.
  t.equal(checkRpFilter(variant('bad-sysctls', (x) => { x.config.dhcpServices = []; })).status, 'pass');
});

t.test('ARP sysctls: the preflight wants exactly what the daemon writes (net/sysctl.ts)', async (t) => {
  // Set every scope to the values applyVipSysctls writes: the check passes.
  const asDaemon = variant('bad-sysctls', (x) => {
    for (const k of ['arp_ignore', 'arp_announce', 'rp_filter']) x.sysctls[`net.ipv4.conf.all.${k}`] = '0';
    for (const [k, v] of vipSysctls('parent')) x.sysctls[`net.ipv4.conf.eth0.${k}`] = String(v);
    for (const [k, v] of vipSysctls('macvlan')) x.sysctls[`net.ipv4.conf.default.${k}`] = String(v);
  });
  t.equal(checkArpSysctls(asDaemon).status, 'pass');
  t.equal(checkRpFilter(asDaemon).status, 'pass');
  // arp_ignore=2 ignores ARP from senders outside a subnet holding the VIP
  // (pool VIPs are /32s); the daemon writes 1 and the preflight used to pass 2.
  const two = checkArpSysctls(variant('healthy', (x) => { x.sysctls['net.ipv4.conf.eth0.arp_ignore'] = '2'; }));
  t.equal(two.status, 'warn');
  t.match(two.remedy, /net\.ipv4\.conf\.eth0\.arp_ignore=1/);
  t.match(two.detail, /arp_ignore=1/);
  const allTwo = checkArpSysctls(variant('healthy', (x) => { x.sysctls['net.ipv4.conf.all.arp_ignore'] = '2'; }));
  t.equal(allTwo.status, 'warn');
  t.match(allTwo.remedy, /net\.ipv4\.conf\.all\.arp_ignore=1/, 'all=2 outranks the interface: lower it too');
});

t.test('ip_forward=0 warns on the kernel path (the daemon sets it at start), irrelevant for the proxy', async (t) => {
  const auto = checkIpForward(fixture('bad-sysctls'));
  t.equal(auto.status, 'warn');
  t.match(auto.detail, /the agent sets it to 1 when the kernel data path starts/);
  t.match(auto.detail, /dataplane auto picks the kernel path/);
  t.match(auto.remedy, /net\.ipv4\.ip_forward=1/);
  t.match(auto.remedy, /dataplane: proxy/);
  // Never a failure: the unit's ExecStartPre must not refuse what the daemon fixes itself.
  const kernel = checkIpForward(variant('bad-sysctls', (f) => { f.config.dataplane = 'kernel'; }));
  t.equal(kernel.status, 'warn');
  t.match(kernel.detail, /dataplane kernel\)/);
  t.match(kernel.detail, /the agent sets it to 1/);
  t.equal(checkIpForward(variant('bad-sysctls', (f) => { f.config.dataplane = 'proxy'; })).status, 'pass');
  t.equal(checkIpForward(fixture('healthy')).status, 'pass');
});

t.test('config: invalid file fails with every error, and the other checks run on defaults', async (t) => {
  const f = fixture('invalid-config');
  const r = checkConfig(f);
  t.equal(r.status, 'fail');
  t.match(r.detail, /services\[0\]\.ports\[0\]\.port: must be <= 65535/);
  t.match(r.detail, /node\.interfce: unknown key/);
  const results = runChecks(f);
  t.equal(byId(results, 'interface').status, 'pass', 'default route NIC still checked');
  t.equal(byId(results, 'pools').detail, 'not checked: the config did not load');
  const missing = checkConfig(variant('invalid-config', (x) => { x.config.status = 'missing'; }));
  t.match(missing.detail, /does not exist/);
  t.match(missing.remedy, /--config PATH/);
});

t.test('dataplane: nft missing fails for kernel, warns for auto, passes for proxy', async (t) => {
  const f = fixture('nft-missing');
  const r = checkDataplane(f);
  t.equal(r.status, 'fail');
  t.match(r.detail, /nft not found/);
  t.match(r.remedy, /apt-get install nftables/);
  t.match(r.remedy, /dataplane: proxy/);
  const auto = checkDataplane(variant('nft-missing', (x) => { x.config.dataplane = 'auto'; }));
  t.equal(auto.status, 'warn');
  t.match(auto.detail, /userspace proxy will be used/);
  t.equal(checkDataplane(variant('nft-missing', (x) => { x.config.dataplane = 'proxy'; })).status, 'pass');
  const refused = checkDataplane(variant('healthy', (x) => { x.config.dataplane = 'kernel'; x.nft.probe = { status: 'failed', error: 'Error: Could not process rule: No such file or directory' }; }));
  t.equal(refused.status, 'fail');
  t.match(refused.detail, /Could not process rule/);
  t.equal(effectiveDataplane(variant('nft-missing', (x) => { x.config.dataplane = 'auto'; })), 'proxy');
});

t.test('dataplane with VRRP: the probe also takes the jhash placement, and a refusal names CONFIG_NFT_HASH', async (t) => {
  const ok = checkDataplane(variant('healthy', (x) => { x.config.dataplane = 'kernel'; x.config.placement = 'flow-hash'; }));
  t.equal(ok.status, 'pass');
  t.match(ok.detail, /jhash map \(VRRP\)/);
  const refused = checkDataplane(variant('healthy', (x) => { x.config.dataplane = 'kernel'; x.config.placement = 'flow-hash'; x.nft.probe = { status: 'failed', error: 'Error: Could not process rule: No such file or directory' }; }));
  t.equal(refused.status, 'fail');
  t.match(refused.remedy, /CONFIG_NFT_HASH/);
  t.notMatch(checkDataplane(variant('healthy', (x) => { x.config.dataplane = 'kernel'; })).detail, /jhash/, 'without VRRP no hash is asked of the kernel');
});

t.test('udp-flows: on the kernel path with a UDP port, ctnetlink must answer, or flows stay on a backend that left', async (t) => {
  const udp = (ct: Facts['conntrackNetlink'], dataplane: 'kernel' | 'proxy' | 'auto' = 'kernel', dsr = false) => variant('healthy', (x) => {
    x.config.dataplane = dataplane;
    x.config.ports = [{ service: 'default/dns', port: 53, protocol: 'UDP' }, { service: 'default/web', port: 80, protocol: 'TCP' }];
    if (dsr) x.config.dsrServices = ['default/dns'];
    if (ct) x.conntrackNetlink = ct; else delete x.conntrackNetlink;
  });
  const ok = checkUdpFlows(udp({ status: 'ok', ms: 1 }))!;
  t.equal(ok.status, 'pass');
  t.match(ok.detail, /default\/dns 53\/UDP/);
  const no = checkUdpFlows(udp({ status: 'failed', error: 'Request rejected: EOPNOTSUPP' }))!;
  t.equal(no.status, 'warn', 'said, not failed: everything else forwards');
  t.match(no.detail, /EOPNOTSUPP.*default\/dns 53\/UDP.*stays on a backend that left/);
  t.match(no.remedy, /nf_conntrack_netlink .*dataplane: proxy/);
  t.equal(checkUdpFlows(udp(undefined)), undefined, 'not gathered (no UDP port the kernel path NATs): not relevant');
  t.equal(checkUdpFlows(udp({ status: 'failed', error: 'x' }, 'proxy')), undefined, 'the proxy path ends its sessions itself');
  t.same(udpSnatPorts(udp(undefined, 'kernel', true).config), [], 'a DSR service\'s UDP port never goes through conntrack');
  t.same(udpSnatPorts(udp(undefined).config), ['default/dns 53/UDP']);
  t.ok(runChecks(udp({ status: 'failed', error: 'EPERM' })).some((c) => c.id === 'udp-flows' && c.status === 'warn'), 'runChecks includes it');
});

t.test('stale-flows: with VRRP on the kernel path, ctnetlink must answer, or a failback resets clients reusing a port the node routed on', async (t) => {
  const vrrp = (ct: Facts['conntrackNetlink'], o: { dataplane?: 'kernel' | 'proxy'; vrrp?: boolean } = {}) => variant('healthy', (x) => {
    x.config.dataplane = o.dataplane ?? 'kernel';
    if (o.vrrp !== false) x.config.placement = 'flow-hash';
    if (ct) x.conntrackNetlink = ct; else delete x.conntrackNetlink;
  });
  const ok = checkStaleFlows(vrrp({ status: 'ok', ms: 1 }))!;
  t.equal(ok.status, 'pass');
  t.match(ok.detail, /ctnetlink answers: a node that takes a VIP over ends the untranslated flows/);
  const no = checkStaleFlows(vrrp({ status: 'failed', error: 'Request rejected: EPERM' }))!;
  t.equal(no.status, 'warn', 'said, not failed: everything else forwards');
  t.match(no.detail, /EPERM.*after a failback, a client that reuses a source port .* is reset, for up to 120 s/);
  t.match(no.remedy, /nf_conntrack_netlink .*dataplane: proxy/);
  t.equal(checkStaleFlows(vrrp({ status: 'failed', error: 'x' }, { vrrp: false })), undefined, 'without VRRP: not relevant');
  t.equal(checkStaleFlows(vrrp({ status: 'failed', error: 'x' }, { dataplane: 'proxy' })), undefined, 'the proxy path NATs nothing');
  t.equal(checkStaleFlows(vrrp(undefined)), undefined, 'not gathered: not relevant');
  t.equal(checkUdpFlows(vrrp({ status: 'ok', ms: 1 })), undefined, 'gathered for VRRP alone: udp-flows, with no UDP port, says nothing');
  t.ok(runChecks(vrrp({ status: 'failed', error: 'EPERM' })).some((c) => c.id === 'stale-flows' && c.status === 'warn'), 'runChecks includes it');
});

t.test('conntrack-pickup: with VRRP on the kernel path, nf_conntrack_tcp_loose=0 is said, since open connections would not outlive a failover', async (t) => {
  const vrrp = (loose: string | undefined, dataplane: 'kernel' | 'proxy' = 'kernel') => variant('healthy', (x) => {
    x.config.dataplane = dataplane; x.config.placement = 'flow-hash';
    if (loose === undefined) delete x.sysctls['net.netfilter.nf_conntrack_tcp_loose']; else x.sysctls['net.netfilter.nf_conntrack_tcp_loose'] = loose;
  });
  const off = checkConntrackPickup(vrrp('0'))!;
  t.equal(off.status, 'warn');
  t.match(off.detail, /nf_conntrack_tcp_loose=0: .*every connection open at a failover is reset/);
  t.match(off.remedy, /sysctl -w net\.netfilter\.nf_conntrack_tcp_loose=1/);
  t.equal(checkConntrackPickup(vrrp('1'))!.status, 'pass');
  t.match(checkConntrackPickup(vrrp(undefined))!.detail, /not loaded yet/);
  t.equal(checkConntrackPickup(vrrp('0', 'proxy')), undefined, 'the proxy path: not relevant');
  t.equal(checkConntrackPickup(variant('healthy', (x) => { x.config.dataplane = 'kernel'; x.sysctls['net.netfilter.nf_conntrack_tcp_loose'] = '0'; })), undefined, 'without VRRP: not relevant');
  t.ok(runChecks(vrrp('0')).some((c) => c.id === 'conntrack-pickup' && c.status === 'warn'), 'runChecks includes it');
});

t.test('dataplane auto with a service that asks for the PROXY protocol: the proxy, said plainly (issue 17)', async (t) => {
  const f = variant('healthy', (x) => { x.config.dataplane = 'auto'; x.config.proxyOnly = ['default/web']; });
  t.equal(effectiveDataplane(f), 'proxy', 'even where nftables works');
  const r = checkDataplane(f);
  t.equal(r.status, 'pass');
  t.match(r.detail, /dataplane auto: default\/web asks for the PROXY protocol, which only the userspace proxy sends: the userspace proxy will be used/);
  t.equal(effectiveDataplane(variant('healthy', (x) => { x.config.dataplane = 'auto'; })), 'kernel', 'without one, auto keeps the kernel path');
});

t.test('pools outside the parent subnet warn', async (t) => {
  const r = checkPools(fixture('pools-outside-subnet'));
  t.equal(r.status, 'warn');
  t.match(r.detail, /cidr-default: 10\.99\.0\.96\/28/);
  t.match(r.detail, /range-global: 10\.99\.0\.200-10\.99\.0\.220/);
  t.match(r.remedy, /192\.168\.50\.0\/24/);
  t.equal(checkPools(fixture('healthy')).status, 'pass');
  // A range straddling the subnet's end is outside.
  const straddle = checkPools(variant('healthy', (f) => { f.config.pools = [{ key: 'range-global', ranges: [{ text: '10.99.0.250-10.99.1.5', first: '10.99.0.250', last: '10.99.1.5' }] }]; }));
  t.equal(straddle.status, 'warn');
});

t.test('IPv6 pool ranges are checked against the NIC\'s global IPv6 subnets', async (t) => {
  const six = (addresses6: string[], text: string, first: string, last: string) => checkPools(variant('healthy', (f) => {
    f.parent.addresses6 = addresses6;
    f.config.pools = [{ key: 'range-global', ranges: [{ text: '10.99.0.200-10.99.0.201', first: '10.99.0.200', last: '10.99.0.201' }, { text, first, last }] }];
  }));
  const inside = six(['fd00:99::2/64'], 'fd00:99::200-fd00:99::20f', 'fd00:99::200', 'fd00:99::20f');
  t.equal(inside.status, 'pass', inside.detail);
  t.match(inside.detail, /fd00:99::\/64/);
  const outside = six(['fd00:99::2/64'], 'fd00:98::200-fd00:98::20f', 'fd00:98::200', 'fd00:98::20f');
  t.equal(outside.status, 'warn');
  t.match(outside.detail, /range-global: fd00:98::200-fd00:98::20f; LAN clients would not ARP \(or, for IPv6, solicit\)/);
  t.notMatch(outside.detail, /10\.99\.0\.200-10\.99\.0\.201/, 'the IPv4 range of the same key is inside');
  t.equal(six([], 'fd00:99::200-fd00:99::20f', 'fd00:99::200', 'fd00:99::20f').status, 'warn', 'no IPv6 subnet on the NIC: an IPv6 range is outside');
});

t.test('state dir: read-only fails, creatable passes', async (t) => {
  const r = checkStateDir(fixture('state-dir-readonly'));
  t.equal(r.status, 'fail');
  t.match(r.detail, /EROFS/);
  const creatable = checkStateDir(variant('healthy', (f) => { f.stateDir = { path: '/var/lib/lb-agent', exists: false, isDirectory: false, writable: false, ancestor: '/var/lib', ancestorWritable: true, error: undefined }; }));
  t.equal(creatable.status, 'pass');
  t.match(creatable.detail, /will be created under \/var\/lib/);
  const file = checkStateDir(variant('healthy', (f) => { f.stateDir.isDirectory = false; }));
  t.equal(file.status, 'fail');
});

t.test('guest agent: missing on SLES names zypper; installed but stopped names systemctl', async (t) => {
  const r = checkGuestAgent(fixture('sles-no-guest-agent'));
  t.equal(r.status, 'warn');
  t.equal(r.remedy, 'zypper in qemu-guest-agent && systemctl enable --now qemu-guest-agent');
  const stopped = checkGuestAgent(variant('healthy', (f) => { f.guestAgent.running = false; }));
  t.equal(stopped.remedy, 'systemctl enable --now qemu-guest-agent');
  t.equal(osFamily(fixture('sles-no-guest-agent')), 'suse');
  t.equal(osFamily(fixture('ubuntu-no-modules-extra')), 'ubuntu');
  t.equal(osFamily(fixture('healthy')), 'debian');
});

t.test('DHCP probe: offer passes, no offer fails when services use DHCP', async (t) => {
  t.equal(checkDhcpProbe(fixture('healthy')), undefined, 'absent unless asked');
  const offer = checkDhcpProbe(fixture('dhcp-offer'))!;
  t.equal(offer.status, 'pass');
  t.match(offer.detail, /OFFER of 10\.99\.0\.123 from 10\.99\.0\.1 in 14 ms/);
  t.match(offer.detail, /no lease taken/);
  const none = checkDhcpProbe(fixture('dhcp-no-offer'))!;
  t.equal(none.status, 'fail');
  t.match(none.detail, /no offer within 5 s/);
  t.equal(checkDhcpProbe(variant('dhcp-no-offer', (f) => { f.config.dhcpServices = []; }))!.status, 'warn');
  const err = checkDhcpProbe(variant('dhcp-no-offer', (f) => { f.dhcpProbe = { status: 'error', interface: 'eth0', mac: '', timeoutSeconds: 5, ms: 2, error: 'cannot create a macvlan on eth0: Error: Unknown device type.' }; }))!;
  t.equal(err.status, 'fail');
  t.match(err.detail, /Unknown device type/);
  t.equal(runChecks(fixture('dhcp-offer')).at(-1)!.id, 'dhcp-probe');
});

t.test('DHCPv6 probe: an ADVERTISE passes; none, or a probe that could not run, fails; last, after the DHCPv4 probe', async (t) => {
  t.equal(checkDhcp6Probe(fixture('dhcp-offer')), undefined, 'absent without IPv6 DHCP services');
  const probe6 = (d: Partial<NonNullable<Facts['dhcpProbe6']>>): Facts => variant('dhcp-offer', (f) => {
    f.dhcpProbe6 = { status: 'offer', interface: 'eth0', mac: '02:74:77:59:25:b9', timeoutSeconds: 5, ms: 110, offeredIp: 'fd00:99::10c', serverId: 'llt 9a:f9:de:76:84:a1', ...d };
  });
  const ok = checkDhcp6Probe(probe6({}))!;
  t.match(ok, { id: 'dhcp6-probe', status: 'pass', detail: /^ADVERTISE of fd00:99::10c from llt 9a:f9:de:76:84:a1 in 110 ms \(SOLICIT from DUID-LL 02:74:77:59:25:b9 .*no lease taken\)/ });
  const none = checkDhcp6Probe(probe6({ status: 'no-offer', offeredIp: undefined, serverId: undefined }))!;
  t.match(none, { status: 'fail', detail: /^no ADVERTISE with an address within 5 s/, remedy: /DHCPv6 server \(stateful, IA_NA\)/ });
  t.match(checkDhcp6Probe(probe6({ status: 'error', error: 'eth0 got no IPv6 link-local address' }))!, { status: 'fail', detail: /could not run: eth0 got no IPv6 link-local/ });
  t.same(runChecks(probe6({})).slice(-2).map((r) => r.id), ['dhcp-probe', 'dhcp6-probe']);
});

t.test('descriptors: the limit against proxy.maxConnections (the daemon\'s own rule)', async (t) => {
  const base = fixture('proxy-no-bind-service');
  const at = (nofile: number | undefined, maxConnections?: number, dataplane: Facts['config']['dataplane'] = 'proxy'): ReturnType<typeof checkDescriptors> =>
    checkDescriptors({ ...base, limits: { nofile }, config: { ...base.config, dataplane, ...(maxConnections !== undefined ? { maxConnections } : {}) } });
  t.equal(checkDescriptors(base), undefined, 'facts from before the limit was gathered: no check');
  t.match(at(256), { status: 'pass', detail: /descriptor limit 256: the proxy holds up to 64 connections \(derived from the limit\)/ });
  const over = at(256, 1000);
  t.equal(over?.status, 'warn');
  t.match(over?.detail, /up to 1000 connections \(proxy.maxConnections\), needing about 2128 descriptors, more than the limit/);
  t.match(over?.remedy, /raise LimitNOFILE= .* to at least 2128, or lower proxy.maxConnections to 64/);
  t.match(at(65536, 20000), { status: 'pass' });
  t.match(at(256, 1000, 'kernel'), { status: 'pass', detail: /kernel data path/ });
  t.match(at(undefined), { status: 'pass', detail: /unlimited or unreadable/ });
  const ids = runChecks({ ...base, limits: { nofile: 1024 } }).map((r) => r.id);
  t.equal(ids.at(-1), 'descriptors', 'reported after the other checks');
});

// --- issue 17: direct server return, its backend side, zones -------------------

const DSR_OK = { probe: { status: 'ok' as const, ms: 12 }, kernelConfig: { NF_TABLES_NETDEV: 'y' as const, NETFILTER_INGRESS: 'y' as const, NFT_HASH: 'y' as const, NFT_FWD_NETDEV: 'y' as const } };

t.test('dsr: only in the report when gathered; a pass says whether a service needs it', async (t) => {
  t.equal(checkDsr(fixture('healthy')), undefined, 'facts from before issue 17: no dsr check');
  const r = checkDsr(variant('healthy', (f) => { f.dsr = DSR_OK; f.config.dsrServices = ['default/web']; }))!;
  t.equal(r.status, 'pass');
  t.match(r.detail, /accepts the direct-server-return table.*services default\/web use sourceIP: preserve/);
});

t.test('dsr: a kernel without nft_fwd_netdev fails a config that uses it, and names the option', async (t) => {
  const noFwd = (f: Facts): void => {
    f.dsr = { probe: { status: 'failed', error: 'Error: Could not process rule: No such file or directory fwd ip to 192.0.2.11 device "lo"' }, kernelConfig: { ...DSR_OK.kernelConfig, NFT_FWD_NETDEV: 'n' } };
  };
  const r = checkDsr(variant('healthy', (f) => { noFwd(f); f.config.dsrServices = ['default/web']; }))!;
  t.equal(r.status, 'fail');
  t.match(r.detail, /refused the direct-server-return table.*CONFIG_NFT_FWD_NETDEV not set.*refuses to start/);
  t.match(r.remedy, /CONFIG_NFT_FWD_NETDEV, or set sourceIP: snat/);
  const unused = checkDsr(variant('healthy', (f) => { noFwd(f); f.config.dsrServices = []; }))!;
  t.equal(unused.status, 'pass', 'not used: informational');
  t.match(unused.detail, /unavailable here.*no service uses sourceIP: preserve/);
});

t.test('dsr: the BPF program in front of the table: said when it runs, a warning with the fallback when it cannot', async (t) => {
  const withBpf = (bpf: { status: 'ok' | 'failed' | 'not-run'; error?: string }, services: string[]): ReturnType<typeof checkDsr> =>
    checkDsr(variant('healthy', (f) => { f.dsr = { ...DSR_OK, bpf }; f.config.dsrServices = services; }));
  const ok = withBpf({ status: 'ok' }, ['default/web'])!;
  t.equal(ok.status, 'pass');
  t.match(ok.detail, /BPF program in front of it loads and attaches at tc ingress \(tcx\): DSR runs on it/);
  t.notMatch(ok.detail, /go by the table/, 'IPv4 on the parent only: nothing for the table alone');
  const mixed = checkDsr(variant('healthy', (f) => { f.dsr = { ...DSR_OK, bpf: { status: 'ok' } }; f.config.dsrServices = ['default/web', 'default/web@IPv6', 'vm/b']; f.config.dsrTableServices = ['vm/b']; }))!;
  t.equal(mixed.status, 'pass');
  t.match(mixed.detail, /DSR runs on it for IPv4 and IPv6 VIPs on the parent; vm\/b \(another network's NIC\) go by the table/);
  const denied = withBpf({ status: 'failed', error: "EPERM: operation not permitted, bpf 'BPF_MAP_CREATE'" }, ['default/web'])!;
  t.equal(denied.status, 'warn', 'a service would run on the slower table');
  t.match(denied.detail, /cannot run here \(EPERM.*needs CAP_BPF and CAP_NET_ADMIN.*DSR falls back to the table alone/);
  t.match(denied.remedy, /unit grants CAP_BPF/);
  const old = withBpf({ status: 'failed', error: "EINVAL: invalid argument, bpf 'BPF_PROG_ATTACH'" }, ['default/web'])!;
  t.match(old.remedy, /CONFIG_NET_XGRESS \(6\.6\+\)/);
  t.equal(withBpf({ status: 'failed', error: 'x' }, [])!.status, 'pass', 'no service needs it: informational');
});

t.test('dsr: needed but the data path will be the proxy', async (t) => {
  const r = checkDsr(variant('nft-missing', (f) => { f.dsr = DSR_OK; f.config.dataplane = 'auto'; f.config.dsrServices = ['default/web']; }))!;
  t.equal(r.status, 'fail');
  t.match(r.detail, /userspace proxy/);
});

t.test('dsr-backend: a VIP on an ARPing interface fails; on lo with the sysctls passes; wrong sysctls warn', async (t) => {
  t.equal(checkDsrBackend(fixture('healthy')), undefined, 'no backend.vips: no check');
  const base = (f: Facts): void => {
    f.config.backendVips = ['10.99.0.250'];
    f.addresses = [{ interface: 'lo', address: '127.0.0.1', prefix: 8, noarp: true }, { interface: 'eth0', address: '10.99.0.5', prefix: 24, noarp: false }];
  };
  const notYet = checkDsrBackend(variant('healthy', (f) => { base(f); f.sysctls['net.ipv4.conf.all.arp_ignore'] = '0'; }))!;
  t.equal(notYet.status, 'pass', 'before the daemon started: it adds the VIP and raises the sysctls itself');
  t.match(notYet.detail, /0\/1 VIP\(s\).*the daemon adds the rest to lo/);
  const onEth = checkDsrBackend(variant('healthy', (f) => { base(f); f.addresses!.push({ interface: 'eth0', address: '10.99.0.250', prefix: 32, noarp: false }); }))!;
  t.equal(onEth.status, 'fail');
  t.match(onEth.detail, /10\.99\.0\.250 on eth0.*answer ARP for the VIP/);
  const good = variant('healthy', (f) => {
    base(f);
    f.addresses!.push({ interface: 'lo', address: '10.99.0.250', prefix: 32, noarp: true });
    f.sysctls['net.ipv4.conf.all.arp_ignore'] = '1';
    f.sysctls['net.ipv4.conf.all.arp_announce'] = '2';
  });
  t.equal(checkDsrBackend(good)!.status, 'pass');
  const flux = checkDsrBackend(variant('healthy', (f) => {
    base(f);
    f.addresses!.push({ interface: 'lo', address: '10.99.0.250', prefix: 32, noarp: true });
    f.sysctls['net.ipv4.conf.all.arp_ignore'] = '0';
    f.sysctls['net.ipv4.conf.all.arp_announce'] = '0';
  }))!;
  t.equal(flux.status, 'warn');
  t.match(flux.remedy, /sysctl -w net\.ipv4\.conf\.all\.arp_ignore=1 net\.ipv4\.conf\.all\.arp_announce=2/);
  // An IPv6 VIP on lo needs no ARP sysctl; on a NIC it is answered for (NDP) and fails.
  const six = (f: Facts): void => {
    base(f);
    f.config.backendVips = ['fd00:99::250'];
    f.sysctls['net.ipv4.conf.all.arp_ignore'] = '0';
    f.sysctls['net.ipv4.conf.all.arp_announce'] = '0';
  };
  const six0 = checkDsrBackend(variant('healthy', (f) => { six(f); f.addresses!.push({ interface: 'lo', address: 'fd00:99::250', prefix: 128, noarp: true }); }))!;
  t.equal(six0.status, 'pass', `IPv6 alone: the ARP sysctls do not matter (${six0.detail})`);
  const sixEth = checkDsrBackend(variant('healthy', (f) => { six(f); f.addresses!.push({ interface: 'eth0', address: 'fd00:99::250', prefix: 64, noarp: false }); }))!;
  t.equal(sixEth.status, 'fail');
  t.match(sixEth.remedy, /VIP\/128 for IPv6/);
});

t.test('topology: unknown zone, no backend in the zone, zones that no policy reads', async (t) => {
  t.equal(checkTopology(fixture('healthy')), undefined, 'no zones anywhere: no check');
  const svc = (policy: string, zones: string[]) => ({ service: 'default/web', policy, zones, unzoned: 0 });
  const known = { zone: 'zone-a', region: undefined, zoneFrom: 'labels-file' as const, regionFrom: 'unknown' as const, labelsFile: '/etc/lb-agent/node-labels', problem: undefined };
  const unknown = { ...known, zone: undefined, zoneFrom: 'unknown' as const, problem: '/etc/lb-agent/node-labels does not exist' };
  const only = checkTopology(variant('healthy', (f) => { f.config.topology = [svc('zone-only', ['zone-a'])]; f.node = unknown; }))!;
  t.equal(only.status, 'fail');
  t.match(only.detail, /zone is unknown \(\/etc\/lb-agent\/node-labels does not exist\).*refuse every connection/);
  t.match(only.remedy, /topology\.kubernetes\.io\/zone=<zone>/);
  t.equal(checkTopology(variant('healthy', (f) => { f.config.topology = [svc('prefer-zone', ['zone-a'])]; f.node = unknown; }))!.status, 'warn');
  t.equal(checkTopology(variant('healthy', (f) => { f.config.topology = [svc('zone-only', ['zone-b'])]; f.node = known; }))!.status, 'fail', 'zone-only with no backend in the zone');
  t.equal(checkTopology(variant('healthy', (f) => { f.config.topology = [svc('prefer-zone', ['zone-b'])]; f.node = known; }))!.status, 'warn', 'prefer-zone that always spills');
  const ok = checkTopology(variant('healthy', (f) => { f.config.topology = [svc('prefer-zone', ['zone-a', 'zone-b'])]; f.node = known; }))!;
  t.equal(ok.status, 'pass');
  t.match(ok.detail, /zone zone-a \(from \/etc\/lb-agent\/node-labels\): default\/web prefer-zone/);
  const ignored = checkTopology(variant('healthy', (f) => { f.config.topology = [svc('any', ['zone-a'])]; f.node = known; }))!;
  t.equal(ignored.status, 'warn');
  t.match(ignored.detail, /note: default\/web give backends a zone but use topology any: the zones are ignored/);
});

// --- firewall: other tables on the kernel path's hooks, over captured `nft -j list ruleset` (fixtures/rulesets) ---

/** The healthy VM (dataplane auto, kernel path, parent eth0, two pools) with a captured ruleset. */
function withRuleset(name: string, edit: (f: Facts) => void = () => {}): Facts {
  const doc = JSON.parse(fs.readFileSync(path.join(FIX, 'rulesets', `${name}.json`), 'utf8')) as { nftables: unknown[] };
  return variant('healthy', (f) => { f.ruleset = { status: 'ok', ms: 3, nftables: doc.nftables }; edit(f); });
}

t.test('firewall: a hardened inet filter with forward policy drop is named, with the command that opens it', async (t) => {
  const r = checkFirewall(withRuleset('inet-filter-forward-drop'))!;
  t.equal(r.status, 'warn');
  t.equal(r.detail, 'another table would drop the VIP traffic the kernel path forwards: table inet filter, chain forward (hook forward, priority 0): policy drop');
  t.equal(r.remedy, 'accept the VIP traffic ahead of the drop, through the program that owns the table (it may write the table again): nft insert rule inet filter forward ct status dnat accept; or remove the drop');
  t.notMatch(r.detail, /chain input/, 'its input policy drop is not a finding: DNATed connections never reach input');
  t.ok(runChecks(withRuleset('inet-filter-forward-drop')).some((x) => x.id === 'firewall' && x.status === 'warn'), 'the finding is in the report');
});

t.test('firewall: after the printed fix (ct status dnat accept) the same table passes', async (t) => {
  const r = checkFirewall(withRuleset('inet-filter-forward-drop-fixed'))!;
  t.equal(r.status, 'pass');
  t.match(r.detail, /1 base chain\(s\) of other tables .*none drops the VIP traffic/);
});

t.test('firewall: Docker\'s ip filter FORWARD policy drop warns, through its unconditional jumps; its DOCKER-USER opening passes', async (t) => {
  const r = checkFirewall(withRuleset('docker'))!;
  t.equal(r.status, 'warn');
  t.match(r.detail, 'table ip filter, chain FORWARD (hook forward, priority 0): policy drop');
  t.notMatch(r.detail, /table ip nat/, 'Docker\'s nat PREROUTING drops nothing');
  t.match(r.remedy, 'nft insert rule ip filter FORWARD ct status dnat accept');
  t.equal(checkFirewall(withRuleset('docker-user-dnat-accept'))!.status, 'pass', 'ct status dnat accept in DOCKER-USER, reached by FORWARD\'s jump');
});

t.test('firewall: firewalld accepts DNATed connections before its final reject; without that rule the reject is named', async (t) => {
  t.equal(checkFirewall(withRuleset('firewalld'))!.status, 'pass');
  const r = checkFirewall(withRuleset('firewalld-no-dnat-accept'))!;
  t.equal(r.status, 'warn');
  t.match(r.detail, /table inet firewalld, chain filter_FORWARD \(hook forward, priority 10\): reject with icmpx admin-prohibited with no condition \(rule handle \d+\)$/);
  t.notMatch(r.detail, /filter_PREROUTING|filter_INPUT/, 'a conditional drop (rpfilter) and the input chain are not findings');
});

t.test('firewall: ct state invalid drop alone is harmless; the agent\'s own tables are not judged', async (t) => {
  t.match(checkFirewall(withRuleset('invalid-only')), { status: 'pass', detail: /2 base chain\(s\) .*none drops/ });
  t.match(checkFirewall(withRuleset('lb-agent-own')), { status: 'pass', detail: 'no other table hooks prerouting, forward or the parent\'s ingress' });
});

t.test('firewall: an ingress filter dropping on the parent is named, and the fix there is the VIPs\' addresses (before DNAT)', async (t) => {
  const r = checkFirewall(withRuleset('netdev-ingress-drop'))!;
  t.equal(r.status, 'warn');
  t.match(r.detail, /table netdev filter, chain ingress \(hook ingress, priority -500\): drop with no condition \(rule handle \d+\)/);
  t.match(r.remedy, 'nft insert rule netdev filter ingress ip daddr { 10.99.0.97-10.99.0.110, 10.99.0.200-10.99.0.220 } accept');
  t.equal(checkFirewall(withRuleset('netdev-ingress-drop-fixed'))!.status, 'pass', 'that rule, ahead of the drop, passes');
  // A device listed and not the parent: not on the VIPs' path.
  const other = withRuleset('netdev-ingress-drop', (f) => {
    for (const o of f.ruleset!.nftables! as { chain?: { dev?: string } }[]) if (o.chain) o.chain.dev = 'eth9';
  });
  t.equal(checkFirewall(other)!.status, 'pass', 'an ingress chain on another NIC');
});

t.test('firewall: not checked on the proxy path or without nft; an unreadable ruleset is said', async (t) => {
  t.match(checkFirewall(withRuleset('docker', (f) => { f.config.dataplane = 'proxy'; })), { status: 'pass', detail: /^not checked: the data path is the userspace proxy/ });
  t.match(checkFirewall(variant('healthy', (f) => { f.ruleset = { status: 'not-run', error: 'nft not found' }; })), { status: 'pass', detail: 'not checked: nft not found' });
  t.match(checkFirewall(variant('healthy', (f) => { f.ruleset = { status: 'failed', error: 'Operation not permitted' }; })), { status: 'warn', remedy: 'run the check as root' });
  t.equal(checkFirewall(fixture('healthy')), undefined, 'facts from before the ruleset was read: no line');
});

// --- drift-fight: the running daemon's drift guard ---

t.test('drift-fight: a fight is named with where to look; no fight passes; no daemon is not checked', async (t) => {
  const fight = 'table ip lb_agent: 12 repairs in 60 s; repairs wait, doubling, while it goes on';
  const r = checkDriftFight(variant('healthy', (f) => { f.daemon = { status: 'ok', socket: '/run/lb-agent/agent.sock', pid: 4242, drift: { repairs: 14, fights: [fight] } }; }))!;
  t.equal(r.status, 'warn');
  t.equal(r.detail, `another program keeps undoing the agent's work, and the daemon (pid 4242) on /run/lb-agent/agent.sock backs off: ${fight}`);
  t.match(r.remedy, /drift-repaired and drift-backoff events of lb-agent status .*\(pid\); journalctl -u lb-agent -g drift/);
  t.match(checkDriftFight(variant('healthy', (f) => { f.daemon = { status: 'ok', socket: '/s', pid: 7, drift: { repairs: 2, fights: [] } }; })),
    { status: 'pass', detail: 'the daemon (pid 7) on /s answers: no fight (2 repair(s) since it started)' });
  t.match(checkDriftFight(variant('healthy', (f) => { f.daemon = { status: 'not-run', socket: '/s', error: 'no daemon answers on /s (ENOENT)' }; })),
    { status: 'pass', detail: 'not checked: no daemon answers on /s (ENOENT)' });
  t.equal(checkDriftFight(fixture('healthy')), undefined);
});

t.test('ipv6: IPv6 disabled on the parent fails with the sysctl fix, only when a service has an IPv6 VIP', async (t) => {
  t.equal(checkIpv6(fixture('healthy')), undefined, 'no IPv6 VIP: no check');
  const parent = fixture('healthy').parent.name!;
  const six = (f: Facts): void => { f.config.ipv6Services = ['default/web@IPv6']; };
  const on = checkIpv6(variant('healthy', (f) => { six(f); f.sysctls['net.ipv6.conf.all.disable_ipv6'] = '0'; f.sysctls[`net.ipv6.conf.${parent}.disable_ipv6`] = '0'; }))!;
  t.match(on, { id: 'ipv6', status: 'pass' });
  const off = checkIpv6(variant('healthy', (f) => { six(f); f.sysctls['net.ipv6.conf.all.disable_ipv6'] = '0'; f.sysctls[`net.ipv6.conf.${parent}.disable_ipv6`] = '1'; }))!;
  t.match(off, { id: 'ipv6', status: 'fail', detail: new RegExp(`IPv6 is disabled on ${parent} \\(net\\.ipv6\\.conf\\.${parent}\\.disable_ipv6=1\\).*default/web@IPv6`) });
  t.match(off.remedy, new RegExp(`sysctl -w net\\.ipv6\\.conf\\.all\\.disable_ipv6=0 net\\.ipv6\\.conf\\.${parent}\\.disable_ipv6=0; persist`));
  const gone = checkIpv6(variant('healthy', (f) => { six(f); delete f.sysctls['net.ipv6.conf.all.disable_ipv6']; delete f.sysctls[`net.ipv6.conf.${parent}.disable_ipv6`]; }))!;
  t.match(gone, { status: 'fail', detail: /ipv6\.disable=1/ });
});

t.test('networks: every network\'s NIC, sysctls, pools and a macvlan on it; as bad as the worst', async (t) => {
  const nic = (f: Facts, name: string, address: string) => ({ ...f.parent, name, source: 'network' as const, network: 'vmnet', addresses: [address] });
  const withNets = (edit: (n: NonNullable<Facts['networks']>, f: Facts) => void = () => {}): Facts => variant('healthy', (f) => {
    f.config.networks = [
      { name: 'default', interface: f.parent.name!, pools: [], services: 1, dhcpServices: 0 },
      { name: 'vmnet', interface: 'eth1', pools: [{ key: 'range-global', ranges: [{ text: '10.98.0.200-10.98.0.210', first: '10.98.0.200', last: '10.98.0.210' }] }], services: 2, dhcpServices: 1 },
    ];
    f.networks = [
      { name: 'default', parent: f.parent, sysctls: {}, macvlan: { status: 'ok' } },
      { name: 'vmnet', parent: nic(f, 'eth1', '10.98.0.2/24'), sysctls: { 'net.ipv4.conf.eth1.arp_ignore': '1', 'net.ipv4.conf.eth1.arp_announce': '2' }, macvlan: { status: 'ok' } },
    ];
    edit(f.networks, f);
  });
  t.equal(checkNetworks(fixture('healthy')), undefined, 'no finding without networks:');
  const ok = checkNetworks(withNets())!;
  t.equal(ok.status, 'pass', ok.detail);
  t.match(ok.detail, /vmnet \(eth1, 2 service\(s\)\): up, carrier, 10\.98\.0\.2\/24, arp_ignore\/arp_announce as wanted, macvlan ok/);
  t.ok(runChecks(withNets()).some((r) => r.id === 'networks'), 'runChecks reports it');

  const flux = checkNetworks(withNets((n) => { n[1]!.sysctls['net.ipv4.conf.eth1.arp_ignore'] = '0'; }))!;
  t.equal(flux.status, 'warn', 'a NIC that would answer ARP for another NIC\'s VIPs warns');
  t.match(flux.detail, /vmnet \(eth1.*arp_ignore=0/);
  t.match(flux.remedy, /vmnet: .*net\.ipv4\.conf\.eth1\.arp_ignore=1/);

  const busy = checkNetworks(withNets((n) => { n[1]!.macvlan = { status: 'failed', error: 'RTNETLINK answers: Device or resource busy' }; }))!;
  t.equal(busy.status, 'fail', 'a DHCP service on a NIC that cannot take a macvlan fails');
  t.match(busy.detail, /cannot make a macvlan on eth1: .*busy \(the NIC belongs to a bridge, bond or team\); 1 DHCP service\(s\) on this network would stay Pending/);
  t.match(busy.remedy, /networks\.vmnet\.interface to the bridge or bond/);

  const gone = checkNetworks(withNets((n) => { n[1]!.parent = { ...n[1]!.parent, exists: false }; }))!;
  t.equal(gone.status, 'fail');
  t.match(gone.detail, /eth1 \(networks\.vmnet\.interface\) does not exist/);

  const nocarrier = checkNetworks(withNets((n) => { n[1]!.parent = { ...n[1]!.parent, carrier: false, operstate: 'down' }; }))!;
  t.equal(nocarrier.status, 'fail');
  t.match(nocarrier.detail, /eth1 \(networks\.vmnet\.interface\) has no carrier/);

  const noaddr = checkNetworks(withNets((n) => { n[1]!.parent = { ...n[1]!.parent, addresses: [] }; }))!;
  t.equal(noaddr.status, 'fail', 'no address to send ARP and VRRP from');
  t.match(noaddr.detail, /eth1 \(networks\.vmnet\.interface\) is up but has no IPv4 address/);

  const outside = checkNetworks(withNets((n) => { n[1]!.parent = { ...n[1]!.parent, addresses: ['10.97.0.2/24'] }; }))!;
  t.equal(outside.status, 'warn', 'a pool outside its NIC\'s subnet warns');
  t.match(outside.detail, /range-global: 10\.98\.0\.200-10\.98\.0\.210/);
});

t.test('vrrp-track: a tracked interface the VM lacks, or one down now, is a warning naming it', async (t) => {
  t.equal(checkVrrpTrack(fixture('healthy')), undefined, 'nothing tracked: no check');
  const link = (name: string, exists: boolean, up: boolean, carrier: boolean): { name: string; exists: boolean; up: boolean; carrier: boolean } => ({ name, exists, up, carrier });
  const ok = checkVrrpTrack(variant('healthy', (f) => { f.trackedLinks = [link('eth1', true, true, true)]; }))!;
  t.equal(ok.status, 'pass');
  t.match(ok.detail, 'eth1');
  const missing = checkVrrpTrack(variant('healthy', (f) => { f.trackedLinks = [link('eht1', false, false, false), link('eth2', true, true, false)]; }))!;
  t.equal(missing.status, 'warn');
  t.match(missing.detail, /failover\.track names eht1, which this VM does not have.*also down now: eth2 \(no carrier\)/);
  t.match(missing.remedy ?? '', /ip -br link/);
  const down = checkVrrpTrack(variant('healthy', (f) => { f.trackedLinks = [link('eth1', true, false, false)]; }))!;
  t.equal(down.status, 'warn');
  t.match(down.detail, 'tracked interface eth1 (down) is not up with carrier now');
  t.equal(byId(runChecks(variant('healthy', (f) => { f.trackedLinks = [link('eth1', false, false, false)]; })), 'vrrp-track').status, 'warn', 'in the report');
});

t.test('nat-engine: which engine forwards snat flows, whether the eBPF one loads, and its NAT ports', async (t) => {
  const k = (engine: 'nft' | 'ebpf' | 'auto', probe: NonNullable<Facts['natEngine']>['probe'], natPorts: [number, number] = [61001, 65535]): Facts =>
    variant('healthy', (f) => {
      f.config.kernel = { engine, natPorts, parent: 'eth0' };
      f.natEngine = { probe, localPortRange: [32768, 60999] };
    });
  t.equal(checkNatEngine(fixture('healthy')), undefined, 'facts from before the engine: no finding');
  const nft = checkNatEngine(k('nft', { status: 'failed', error: 'libbpf is not installed' }))!;
  t.equal(nft.status, 'pass');
  t.match(nft.detail, /nft table with conntrack .*could not run here \(libbpf is not installed\)/);
  const bad = checkNatEngine(k('ebpf', { status: 'failed', error: '/sys/fs/bpf is not on a BPF file system' }))!;
  t.equal(bad.status, 'fail', 'ebpf that cannot load: the agent would refuse to start');
  t.match(bad.detail, /not on a BPF file system: the agent would refuse to start/);
  t.equal(checkNatEngine(k('auto', { status: 'failed', error: 'EPERM' }))!.status, 'warn', 'auto falls back: a warning');
  t.equal(checkNatEngine(k('auto', { status: 'ok' }))!.status, 'pass');
  t.notMatch(checkNatEngine(k('auto', { status: 'ok' }))!.detail, /DSR program/, 'no DSR service: nothing said of the DSR program');
  const withDsr = variant('healthy', (f) => {
    f.config.kernel = { engine: 'auto', natPorts: [61001, 65535], parent: 'eth0' };
    f.config.dsrServices = ['default/web-dsr'];
    f.natEngine = { probe: { status: 'ok' }, localPortRange: [32768, 60999] };
  });
  t.match(checkNatEngine(withDsr)!.detail, /attaches at tc ingress \(tcx\), beside the DSR program at the same hook/, 'with DSR services: the probe attached both, and says so');
  const refused = variant('healthy', (f) => {
    f.config.kernel = { engine: 'auto', natPorts: [61001, 65535], parent: 'eth0' };
    f.config.dsrServices = ['default/web-dsr'];
    f.natEngine = { probe: { status: 'failed', error: 'the DSR program cannot be attached beside it at tcx ingress (EEXIST); the DSR program keeps the hook' }, localPortRange: [32768, 60999] };
  });
  const r = checkNatEngine(refused)!;
  t.equal(r.status, 'warn', 'the two cannot share the hook: auto falls back to the nft table');
  t.match(r.detail, /cannot run here: the DSR program cannot be attached beside it.*the nft table forwards alone/);
  const batched = variant('healthy', (f) => {
    f.config.kernel = { engine: 'auto', natPorts: [61001, 65535], parent: 'eth0' };
    f.natEngine = { probe: { status: 'ok' }, localPortRange: [32768, 60999], batch: { status: 'ok' } };
  });
  t.match(checkNatEngine(batched)!.detail, /a few thousand entries a bpf\(2\) call/, 'batch calls: said');
  const single = variant('healthy', (f) => {
    f.config.kernel = { engine: 'auto', natPorts: [61001, 65535], parent: 'eth0' };
    f.natEngine = { probe: { status: 'ok' }, localPortRange: [32768, 60999], batch: { status: 'failed', error: 'the kernel refuses BPF_MAP_UPDATE_BATCH (EINVAL)' } };
  });
  const sr = checkNatEngine(single)!;
  t.equal(sr.status, 'pass', 'no batch calls: slower loads, still a pass');
  t.match(sr.detail, /one entry a bpf\(2\) call \(the kernel refuses BPF_MAP_UPDATE_BATCH \(EINVAL\)\)/, 'and why');
  const overlap = checkNatEngine(k('ebpf', { status: 'ok' }, [50000, 52000]))!;
  t.equal(overlap.status, 'warn');
  t.match(overlap.detail, /50000-52000 overlap the VM's ephemeral ports 32768-60999/);
});
