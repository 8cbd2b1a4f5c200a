// Preflight, pure layer: each check is a function of the gathered Facts that
// returns what it saw and, when it is not a pass, the one thing to do about
// it. No I/O, no clock: every verdict is replayed from a fixture in
// test/preflight/fixtures/.
import { parseIPv4, familyOf, formatNetwork, networkContains, parseAddress, parseNetwork, type Network } from '../address';
import { udpSnatPorts, type Facts, type MacvlanFacts } from './facts';
import { wantedSysctl, type VipRole } from '../net/sysctl/sysctl';
import { defaultMaxConnections, effectiveMaxConnections, reservedDescriptors } from '../forward/capacity';
import { BACKEND_SYSCTLS, BACKEND_VIP_INTERFACE } from '../net/host/dsr-backend';
import { ZONE_LABEL } from '../config/labels';
import { proxyNeededReason } from '../forward/dataplane';
import { NFT_FAMILY, NFT_TABLE } from '../forward/nft';
import { DSR_FAMILY, DSR_TABLE } from '../forward/nft-dsr';

export type CheckStatus = 'pass' | 'warn' | 'fail';

export interface CheckResult {
  /** Stable id: config, state-dir, capabilities, macvlan, interface, pools, arp-sysctls, rp-filter, ip-forward, dataplane, guest-agent, descriptors, dsr, dsr-backend, topology, conntrack-pickup, udp-flows, stale-flows, firewall, drift-fight, dhcp-probe, dhcp6-probe, ipv6, vrrp-track. */
  readonly id: string;
  readonly status: CheckStatus;
  /** What the check saw. */
  readonly detail: string;
  /** What to do; undefined for a pass. */
  readonly remedy: string | undefined;
}

const SYSCTL_FILE = '/etc/sysctl.d/90-lb-agent.conf';

/** The sysctl(8) spelling of an interface in net.ipv4.conf.<if>: dots become slashes. */
export function sysctlIfName(ifname: string): string {
  return ifname.replace(/\./g, '/');
}

function pass(id: string, detail: string): CheckResult { return { id, status: 'pass', detail, remedy: undefined }; }
function warn(id: string, detail: string, remedy: string): CheckResult { return { id, status: 'warn', detail, remedy }; }
function fail(id: string, detail: string, remedy: string): CheckResult { return { id, status: 'fail', detail, remedy }; }

// --- derived facts ---------------------------------------------------------

/** nftables is there and the kernel accepted the probe table. */
export function nftUsable(f: Facts): boolean {
  return f.nft.binary !== undefined && f.nft.probe.status === 'ok';
}

/** The data path the daemon will pick: auto means kernel when nftables works and no service needs the proxy. */
export function effectiveDataplane(f: Facts): 'kernel' | 'proxy' {
  if (f.config.dataplane === 'auto') return nftUsable(f) && (f.config.proxyOnly ?? []).length === 0 ? 'kernel' : 'proxy';
  return f.config.dataplane;
}

/** Whether macvlans are needed now: DHCP services exist, or we cannot tell. */
function macvlanNeeded(f: Facts): boolean {
  return f.config.status !== 'ok' || f.config.dhcpServices.length > 0;
}

type Family = 'suse' | 'ubuntu' | 'debian' | 'rhel' | 'other';
export function osFamily(f: Facts): Family {
  const ids = [f.host.osId, ...f.host.osIdLike].map((s) => s.toLowerCase());
  if (ids.some((i) => i === 'suse' || i.startsWith('sles') || i.startsWith('opensuse') || i === 'sle-micro')) return 'suse';
  if (ids.includes('ubuntu')) return 'ubuntu';
  if (ids.includes('debian')) return 'debian';
  if (ids.some((i) => ['rhel', 'fedora', 'centos', 'rocky', 'almalinux'].includes(i))) return 'rhel';
  return 'other';
}

function installCmd(f: Facts, pkg: string): string {
  switch (osFamily(f)) {
    case 'suse': return `zypper in ${pkg}`;
    case 'ubuntu': case 'debian': return `apt-get install ${pkg}`;
    case 'rhel': return `dnf install ${pkg}`;
    default: return `install ${pkg}`;
  }
}

function sysctlRemedy(settings: string[]): string {
  return `sysctl -w ${settings.join(' ')}; persist them in ${SYSCTL_FILE} (one name=value per line)`;
}

// --- config ----------------------------------------------------------------

export function checkConfig(f: Facts): CheckResult {
  const c = f.config;
  if (c.status === 'missing') {
    return fail('config', `${c.path} does not exist`,
      `write the configuration to ${c.path} (see examples/cloud-init/user-data.yaml) or pass --config PATH`);
  }
  if (c.status === 'invalid') {
    return fail('config', `${c.path} does not validate: ${c.errors.join('; ')}`,
      'fix the fields named above; nothing is applied from a file that does not validate');
  }
  const parent = c.interface ? `interface ${c.interface}` : 'interface of the default route';
  return pass('config', `${c.path}: ${c.services} service(s), ${c.dhcpServices.length} by DHCP, ${c.pools.length} pool(s), dataplane ${c.dataplane}, ${parent}`);
}

export function checkStateDir(f: Facts): CheckResult {
  const s = f.stateDir;
  if (s.exists && !s.isDirectory) {
    return fail('state-dir', `${s.path} exists and is not a directory`, `remove ${s.path} or set stateDir to a directory`);
  }
  if (s.exists && s.writable) return pass('state-dir', `${s.path} is writable`);
  if (s.exists) {
    return fail('state-dir', `${s.path} is not writable${s.error ? ` (${s.error})` : ''}`,
      `make ${s.path} writable by the agent (a read-only filesystem?) or set stateDir to a writable directory`);
  }
  if (s.ancestor && s.ancestorWritable) return pass('state-dir', `${s.path} does not exist yet; it will be created under ${s.ancestor}`);
  return fail('state-dir', `${s.path} does not exist and cannot be created${s.ancestor ? `: ${s.ancestor} is not writable` : ''}${s.error ? ` (${s.error})` : ''}`,
    `create ${s.path} (mkdir -p ${s.path}) or set stateDir to a writable directory`);
}

// --- capabilities ----------------------------------------------------------

// linux/capability.h
export const CAP = { NET_BIND_SERVICE: 10, NET_ADMIN: 12, NET_RAW: 13 } as const;

/** Ports below 1024 that the userspace proxy would have to bind. */
function privilegedProxyPorts(f: Facts): number[] {
  if (effectiveDataplane(f) !== 'proxy') return [];
  return [...new Set(f.config.ports.filter((p) => p.port < 1024).map((p) => p.port))].sort((a, b) => a - b);
}

export function checkCapabilities(f: Facts): CheckResult {
  const hex = f.caps.effective;
  if (hex === undefined || !/^[0-9a-fA-F]+$/.test(hex)) {
    return warn('capabilities', 'cannot read CapEff from /proc/self/status', 'run the check as the user the agent runs as (root, or with CAP_NET_ADMIN and CAP_NET_RAW)');
  }
  const eff = BigInt(`0x${hex}`);
  const has = (bit: number): boolean => ((eff >> BigInt(bit)) & 1n) === 1n;
  const lowPorts = privilegedProxyPorts(f);
  const needed: [string, string][] = [
    ['CAP_NET_ADMIN', 'links, addresses, nftables'],
    ['CAP_NET_RAW', 'packet sockets for DHCP, ARP and VRRP'],
  ];
  if (lowPorts.length > 0) needed.push(['CAP_NET_BIND_SERVICE', `the userspace proxy listens on port ${lowPorts.join(', ')}`]);
  const missing = needed.filter(([name]) => !has(CAP[name.slice(4) as keyof typeof CAP]));
  if (missing.length === 0) {
    return pass('capabilities', `${needed.map(([n]) => n).join(', ')} in the effective set (CapEff ${hex})`);
  }
  const names = missing.map(([n]) => n);
  return fail('capabilities',
    `missing ${names.join(' and ')} from the effective set (CapEff ${hex}); needed for ${missing.map(([, why]) => why).join('; ')}`,
    `run lb-agent as root, or grant them in its systemd unit: AmbientCapabilities=${needed.map(([n]) => n).join(' ')}`);
}

// --- macvlan -----------------------------------------------------------------

type Refusal = 'unsupported' | 'permission' | 'other';

/** What kind of refusal an `ip`/`nft`/`unshare` complaint is. */
export function classifyRefusal(err: string | undefined): Refusal {
  if (!err) return 'other';
  if (/Unknown device type|Operation not supported|not supported/i.test(err)) return 'unsupported';
  if (/not permitted|Permission denied|EPERM|EACCES/i.test(err)) return 'permission';
  return 'other';
}

/** Where the driver comes from, as far as the module files tell. */
function driverSource(m: MacvlanFacts): string {
  if (m.builtin) return 'built into the kernel (modules.builtin)';
  if (m.kernelConfig === 'y') return 'built into the kernel (CONFIG_MACVLAN=y)';
  if (m.procModules === 'loaded' || m.sysModule) return 'module loaded';
  if (m.modulesDep) return 'module, loaded on demand';
  return 'built into the kernel (listed in no module list)';
}

/** The module files' evidence, one phrase each. */
function evidence(f: Facts): string {
  const m = f.macvlan;
  const rel = f.host.kernelRelease;
  const parts: string[] = [];
  parts.push(m.procModules === 'absent' ? 'no /proc/modules' : `/proc/modules: ${m.procModules === 'loaded' ? 'loaded' : 'not loaded'}`);
  if (!m.modulesDir) parts.push(`no /lib/modules/${rel}`);
  else {
    if (m.builtin !== undefined) parts.push(`modules.builtin: ${m.builtin ? 'listed' : 'not listed'}`);
    if (m.modulesDep !== undefined) parts.push(`modules.dep: ${m.modulesDep ? 'listed' : 'not listed (no macvlan.ko installed)'}`);
  }
  if (m.kernelConfig) parts.push(`CONFIG_MACVLAN=${m.kernelConfig}`);
  if (m.modprobe.status === 'failed') parts.push(`modprobe macvlan: ${(m.modprobe.error ?? '').replace(/^modprobe:\s*/, '')}`);
  if (m.modprobe.status === 'ok') parts.push('modprobe macvlan: loaded');
  if (m.packages.installed.length > 0) parts.push(`kernel packages: ${m.packages.installed.map((p) => `${p.name} ${p.version}`).join(', ')}`);
  return parts.join('; ');
}

/** Do the module files show the driver cannot be there? */
function definitelyMissing(m: MacvlanFacts): boolean {
  if (m.procModules === 'loaded' || m.sysModule || m.builtin || m.kernelConfig === 'y') return false;
  return m.kernelConfig === 'n' || (m.modulesDir && m.builtin === false && m.modulesDep === false);
}

function presentByEvidence(m: MacvlanFacts): boolean {
  return m.procModules === 'loaded' || m.sysModule || m.builtin === true || m.kernelConfig === 'y';
}

function debArch(arch: string): string {
  return ({ x64: 'amd64', arm64: 'arm64', ia32: 'i386', arm: 'armhf', ppc64: 'ppc64el', s390x: 's390x' } as Record<string, string>)[arch] ?? arch;
}

/** Why the driver is missing and the fix, from the distribution's packages and the module files. */
export function macvlanDiagnosis(f: Facts): { why: string; remedy: string } {
  const m = f.macvlan;
  const rel = f.host.kernelRelease;
  const pkgs = new Map(m.packages.installed.map((p) => [p.name, p.version]));
  const family = osFamily(f);
  const noModulesDir = !m.modulesDir;

  if (family === 'suse' || pkgs.has('kernel-default-base') || pkgs.has('kernel-default')) {
    // Harvester docs / harvester/harvester#6418: SLES minimal cloud images
    // ship kernel-default-base (base modules only, no macvlan).
    if (pkgs.has('kernel-default-base') && !pkgs.has('kernel-default')) {
      return {
        why: `kernel-default-base ${pkgs.get('kernel-default-base')} is installed: the minimal kernel package, without macvlan`,
        remedy: 'install kernel-default (zypper in kernel-default) and reboot',
      };
    }
    if (pkgs.has('kernel-default')) {
      return {
        why: `kernel-default ${pkgs.get('kernel-default')} is installed but the running kernel ${rel} has no macvlan${noModulesDir ? ` (no /lib/modules/${rel})` : ''}`,
        remedy: 'reboot into the installed kernel-default',
      };
    }
    return { why: 'no kernel-default package found', remedy: 'install kernel-default (zypper in kernel-default) and reboot' };
  }

  if (family === 'ubuntu') {
    if (noModulesDir) {
      return { why: `the modules of the running kernel ${rel} are not installed (a kernel upgrade without a reboot?)`, remedy: 'reboot into the installed kernel' };
    }
    // Ubuntu splits a kernel's modules into linux-modules-<rel> and
    // linux-modules-extra-<rel> by per-flavour inclusion lists: generic and
    // aws list drivers/net/macvlan.ko in the base package
    // (debian.master/control.d/generic.inclusion-list), other flavours (raspi)
    // leave it to -extra. So: the base package first, then -extra.
    const base = `linux-modules-${rel}`;
    const extra = `linux-modules-extra-${rel}`;
    if (pkgs.size > 0 && !pkgs.has(base) && !pkgs.has(`linux-image-${rel}`)) {
      return { why: `no package of the running kernel ${rel} is installed`, remedy: `apt-get install ${base} ${extra}, or reboot into an installed kernel` };
    }
    if (!pkgs.has(base)) {
      return { why: `${base} is not installed`, remedy: `apt-get install ${base} (no reboot needed for the running kernel)` };
    }
    if (/-kvm$/.test(rel)) {
      return {
        why: `the running kernel ${rel} is the -kvm flavour, which has no linux-modules-extra`,
        remedy: 'install the generic kernel (apt-get install linux-image-virtual) and reboot into it',
      };
    }
    if (!pkgs.has(extra)) {
      return {
        why: `${base} has no macvlan and ${extra}, where this flavour leaves it, is not installed`,
        remedy: `apt-get install ${extra} (no reboot needed for the running kernel)`,
      };
    }
    return { why: `${base} and ${extra} are installed and neither has macvlan`, remedy: `reinstall them (apt-get install --reinstall ${base} ${extra}) or use a kernel with CONFIG_MACVLAN` };
  }

  if (family === 'debian') {
    // Debian builds macvlan as a module in every flavour: the cloud flavour's
    // config (debian/config/config.cloud) leaves drivers/net/Kconfig's
    // MACVLAN=m alone. A missing driver is a custom kernel or missing files.
    const arch = debArch(f.host.arch);
    if (noModulesDir) {
      return { why: `the modules of the running kernel ${rel} are not installed (a kernel upgrade without a reboot?)`, remedy: 'reboot into the installed kernel' };
    }
    if (m.kernelConfig === 'n') {
      return {
        why: `the running kernel ${rel} is built without macvlan (CONFIG_MACVLAN is not set)`,
        remedy: `install a Debian kernel, which builds macvlan as a module (apt-get install linux-image-cloud-${arch} or linux-image-${arch}), and reboot`,
      };
    }
    if (m.modulesDep === false) {
      return {
        why: `macvlan.ko is missing from /lib/modules/${rel}`,
        remedy: `reinstall the running kernel's package (apt-get install --reinstall linux-image-${rel})`,
      };
    }
  }

  if (noModulesDir) {
    return { why: `no /lib/modules/${rel}: the running kernel's modules are not installed`, remedy: 'install the modules of the running kernel, or reboot into an installed kernel' };
  }
  if (m.kernelConfig === 'n') {
    return { why: `the running kernel ${rel} is built without CONFIG_MACVLAN`, remedy: 'use a kernel built with CONFIG_MACVLAN=m or =y and reboot' };
  }
  return { why: 'the kernel has no usable macvlan driver', remedy: 'install a kernel with the macvlan driver (CONFIG_MACVLAN) and reboot' };
}

export function checkMacvlan(f: Facts): CheckResult {
  const m = f.macvlan;
  const id = 'macvlan';
  if (m.create.status === 'ok') {
    const how = m.create.parent === 'loopback'
      ? 'no veth driver for the usual test; the kernel recognised the macvlan type on a loopback parent'
      : 'created and deleted a macvlan (mode bridge) in a throwaway namespace';
    return pass(id, `${how}; driver: ${driverSource(m)}`);
  }
  const needed = macvlanNeeded(f);
  const consequence = 'LoadBalancer services with ipam dhcp would stay Pending ("operation not supported")';
  const kind = m.create.status === 'not-run' ? 'not-run' : classifyRefusal(m.create.error);
  const untestable = kind === 'not-run' || kind === 'permission';

  if (untestable && !definitelyMissing(m)) {
    const why = kind === 'not-run' ? `could not test (${m.create.error})` : `could not test: ${m.create.error} (see capabilities)`;
    if (presentByEvidence(m)) return pass(id, `${why}; driver: ${driverSource(m)}`);
    return warn(id, `${why}; ${evidence(f)}`,
      kind === 'not-run' ? 'install util-linux (unshare) and iproute2 (ip) so the preflight can create a test macvlan' : 'run the check as root');
  }
  if (m.retry.status === 'ok') {
    // Loadable, but the kernel did not load it on demand: after a reboot the
    // agent's first macvlan would fail again.
    return warn(id, `creating a macvlan failed (${m.create.error}) until modprobe macvlan loaded the module; the kernel did not load it on demand`,
      'load it at boot: echo macvlan > /etc/modules-load.d/lb-agent.conf');
  }
  const { why, remedy } = macvlanDiagnosis(f);
  const what = m.create.status === 'failed' ? `cannot create a macvlan: ${m.create.error}` : `macvlan driver missing`;
  const detail = `${what}; ${why}; ${evidence(f)}`;
  if (!needed) return warn(id, `${detail}; no service uses ipam dhcp now, but one that does would stay Pending`, remedy);
  return fail(id, `${detail}; ${consequence}`, remedy);
}

// --- parent interface ----------------------------------------------------------

// linux/if.h
const IFF_UP = 0x1;

export function checkInterface(f: Facts): CheckResult {
  const p = f.parent;
  const id = 'interface';
  const others = p.available.length > 0 ? p.available.join(', ') : 'none';
  if (!p.name) {
    return fail(id, 'node.interface is not set and there is no default route to take it from',
      `set node.interface in ${f.config.path} to the NIC on the VM network (present: ${others})`);
  }
  const from = p.source === 'config' ? 'node.interface' : p.source === 'network' ? `networks.${p.network ?? '?'}.interface` : 'default route';
  if (!p.exists) {
    return fail(id, `${p.name} (${from}) does not exist; interfaces present: ${others}`,
      `set node.interface in ${f.config.path} to one of: ${others}`);
  }
  // Administratively down (IFF_UP clear) is one fix; up without carrier
  // (operstate "down" too, RFC 2863) is another.
  const adminUp = p.flags !== undefined ? (p.flags & IFF_UP) !== 0 : p.operstate === 'up';
  if (!adminUp) {
    return fail(id, `${p.name} (${from}) is down (operstate ${p.operstate ?? '?'})`,
      `bring it up (ip link set dev ${p.name} up) and fix the VM's network configuration so it comes up at boot`);
  }
  if (p.carrier === false || p.operstate === 'lowerlayerdown') {
    return fail(id, `${p.name} (${from}) has no carrier (operstate ${p.operstate ?? '?'})`,
      `the NIC has no link: check that the VM's network interface is attached to a VM network in Harvester`);
  }
  if (p.operstate !== undefined && p.operstate !== 'up' && p.operstate !== 'unknown') {
    return fail(id, `${p.name} (${from}) is not operational (operstate ${p.operstate})`,
      `check the link state of ${p.name} (ip link show ${p.name})`);
  }
  if (p.addresses.length === 0) {
    return fail(id, `${p.name} (${from}) is up but has no IPv4 address`,
      `configure an IPv4 address on ${p.name} (DHCP or static) before starting lb-agent, or set node.interface to the NIC that has one`);
  }
  return pass(id, `${p.name} (${from}): up, carrier, ${p.addresses.join(', ')}`);
}

/** The parent's subnets as CIDRs. */
/** The parent's subnets of both families (IPv6: of global scope), as networks. */
function parentSubnets(f: Facts): Network[] {
  return [...f.parent.addresses, ...f.parent.addresses6 ?? []].flatMap((a) => {
    const n = parseNetwork(a, true);
    return n ? [n] : [];
  });
}

export function checkPools(f: Facts): CheckResult {
  const id = 'pools';
  const pools = f.config.pools;
  if (f.config.status !== 'ok' || pools.length === 0) return pass(id, f.config.status === 'ok' ? 'no pools configured' : 'not checked: the config did not load');
  const nets = parentSubnets(f);
  if (!nets.some((n) => n.family === 'IPv4') && pools.some((p) => p.ranges.some((r) => familyOf(r.first) === 'IPv4'))) {
    return warn(id, `cannot check ${pools.length} pool(s): ${f.parent.name ?? 'the parent interface'} has no IPv4 subnet`, 'fix the interface check first');
  }
  // Each range against the subnets of its own family: an IPv6 range lies in
  // a global IPv6 subnet of the NIC, or clients do not solicit it there.
  const outside: string[] = [];
  for (const pool of pools) {
    for (const r of pool.ranges) {
      const a = parseAddress(r.first);
      const b = parseAddress(r.last);
      const inside = a !== undefined && b !== undefined && nets.some((n) => networkContains(n, a) && networkContains(n, b));
      if (!inside) outside.push(`${pool.key}: ${r.text}`);
    }
  }
  const subnets = nets.map(formatNetwork).join(', ');
  if (outside.length === 0) return pass(id, `every pool range lies in ${f.parent.name}'s subnet ${subnets}`);
  return warn(id, `pool range(s) outside ${f.parent.name}'s subnet ${subnets}: ${outside.join('; ')}; LAN clients would not ARP (or, for IPv6, solicit) for these VIPs on ${f.parent.name}`,
    `use ranges within ${subnets}, or set node.interface to the NIC on the pools' subnet`);
}

// --- sysctls -----------------------------------------------------------------

function sysctlNum(f: Facts, name: string): number | undefined {
  const v = f.sysctls[name];
  if (v === undefined || !/^-?\d+$/.test(v)) return undefined;
  return Number(v);
}

/** The kernel uses max(all, <if>) for arp_ignore, arp_announce and rp_filter (ip-sysctl.rst). */
function effectiveConf(f: Facts, scope: string, key: string): { value: number | undefined } {
  const all = sysctlNum(f, `net.ipv4.conf.all.${key}`);
  const dev = sysctlNum(f, `net.ipv4.conf.${scope}.${key}`);
  if (all === undefined && dev === undefined) return { value: undefined };
  return { value: Math.max(all ?? 0, dev ?? 0) };
}

export function checkArpSysctls(f: Facts): CheckResult {
  const id = 'arp-sysctls';
  const parent = f.parent.name;
  if (!parent || !f.parent.exists) return pass(id, 'not checked: no parent interface');
  // ARP flux (DESIGN "Networking facts"): the wanted values are the ones the
  // daemon writes, from net/sysctl.ts; net.ipv4.conf.default is what a new
  // macvlan starts with.
  const scopes: [string, string, VipRole][] = [[sysctlIfName(parent), parent, 'parent']];
  if (macvlanNeeded(f)) scopes.push(['default', 'new macvlans (default)', 'macvlan']);
  const keys = ['arp_ignore', 'arp_announce'] as const;
  const seen: string[] = [];
  const fixes: string[] = [];
  const wants = new Set<string>();
  for (const [scope, label, role] of scopes) {
    const eff = keys.map((key) => effectiveConf(f, scope, key));
    if (eff.some((e) => e.value === undefined)) continue;
    seen.push(`${label}: ${keys.map((key, i) => `${key}=${eff[i]!.value}`).join(' ')}`);
    keys.forEach((key, i) => {
      const want = wantedSysctl(role, key);
      if (want === undefined) return;
      wants.add(`${key}=${want}`);
      if (eff[i]!.value === want) return;
      // The kernel takes max(all, <if>): a value too high in `all` wins over
      // any interface value, so lower it too.
      const all = sysctlNum(f, `net.ipv4.conf.all.${key}`);
      if (all !== undefined && all > want) fixes.push(`net.ipv4.conf.all.${key}=${want}`);
      fixes.push(`net.ipv4.conf.${scope}.${key}=${want}`);
    });
  }
  if (seen.length === 0) return warn(id, `cannot read net.ipv4.conf.${sysctlIfName(parent)}.arp_ignore/arp_announce`, 'run the check on the VM itself (with /proc/sys mounted)');
  const detail = `${seen.join('; ')} (effective = max of all and the interface)`;
  if (fixes.length === 0) return pass(id, detail);
  return warn(id, `${detail}; want ${[...wants].join(' and ')} (as the daemon sets them), or the VM answers ARP for VIPs from the wrong MAC (ARP flux) or, with arp_ignore=2, ignores ARP from senders outside the VIP's subnet`,
    sysctlRemedy([...new Set(fixes)]));
}

export function checkRpFilter(f: Facts): CheckResult {
  const id = 'rp-filter';
  if (!macvlanNeeded(f)) return pass(id, 'not relevant: no service takes its VIP on a macvlan');
  const eff = effectiveConf(f, 'default', 'rp_filter');
  if (eff.value === undefined) return warn(id, 'cannot read net.ipv4.conf.{all,default}.rp_filter', 'run the check on the VM itself (with /proc/sys mounted)');
  const detail = `rp_filter for new macvlans = max(all ${f.sysctls['net.ipv4.conf.all.rp_filter'] ?? '?'}, default ${f.sysctls['net.ipv4.conf.default.rp_filter'] ?? '?'}) = ${eff.value}`;
  // RFC 3704 strict mode: a packet to a macvlan VIP whose reply route leaves
  // by the parent (same subnet) is dropped. Loose (2) or off (0) is fine.
  if (eff.value !== 1) return pass(id, `${detail} (${eff.value === 2 ? 'loose' : 'off'})`);
  return warn(id, `${detail} (strict): traffic to a VIP on a macvlan is dropped when the reply route leaves by the parent`,
    sysctlRemedy([`net.ipv4.conf.all.rp_filter=${wantedSysctl('macvlan', 'rp_filter')}`, `net.ipv4.conf.default.rp_filter=${wantedSysctl('macvlan', 'rp_filter')}`]));
}

export function checkIpForward(f: Facts): CheckResult {
  const id = 'ip-forward';
  const plane = effectiveDataplane(f);
  if (plane !== 'kernel') return pass(id, `not needed: the userspace proxy forwards (dataplane ${f.config.dataplane})`);
  const v = f.sysctls['net.ipv4.ip_forward'];
  if (v === '1') return pass(id, 'net.ipv4.ip_forward=1 (the kernel data path forwards DNATed connections)');
  // The daemon writes ip_forward=1 itself when the kernel path starts
  // (forward/nft.ts ensureSysctls), on this path only: a warning about what
  // it will change, never a failure that stops the unit from starting.
  const why = f.config.dataplane === 'kernel' ? 'dataplane kernel' : 'dataplane auto picks the kernel path here';
  return warn(id, `net.ipv4.ip_forward=${v ?? '?'} (${why}): the agent sets it to 1 when the kernel data path starts, because that path forwards VIP connections to backends on other hosts`,
    `nothing, if the agent may turn forwarding on; to have it from boot, ${sysctlRemedy(['net.ipv4.ip_forward=1'])}; or set dataplane: proxy, which does not forward`);
}

/**
 * With VRRP on the kernel path, a connection outlives a failover only if the
 * new Master's conntrack picks it up mid-flow (forward/nft.ts, "Why a hash
 * with VRRP"): nf_conntrack_tcp_loose=0, a hardening some hosts apply, turns
 * that off, and every connection open at a failover is reset. Said, not
 * changed: it is the host's policy. Undefined when not relevant.
 */
export function checkConntrackPickup(f: Facts): CheckResult | undefined {
  const id = 'conntrack-pickup';
  if (f.config.placement !== 'flow-hash' || effectiveDataplane(f) !== 'kernel') return undefined;
  const v = f.sysctls['net.netfilter.nf_conntrack_tcp_loose'];
  if (v === undefined) return pass(id, 'conntrack is not loaded yet; its default, nf_conntrack_tcp_loose=1, lets a new VRRP Master pick up connections opened through the old one');
  if (v !== '0') return pass(id, `net.netfilter.nf_conntrack_tcp_loose=${v}: a new VRRP Master picks up connections opened through the old one, so they outlive a failover`);
  return warn(id, 'net.netfilter.nf_conntrack_tcp_loose=0: a new VRRP Master cannot pick up connections opened through the old one; every connection open at a failover is reset',
    `${sysctlRemedy(['net.netfilter.nf_conntrack_tcp_loose=1'])}, if the host's policy allows it`);
}

/** What makes ctnetlink answer (udp-flows, stale-flows). */
const CTNETLINK_REMEDY = 'load nf_conntrack_netlink (CONFIG_NF_CT_NETLINK) and run lb-agent with CAP_NET_ADMIN, or set dataplane: proxy';

/**
 * The kernel path ends the UDP flows of a backend that leaves a port's
 * healthy set by deleting their conntrack entries through ctnetlink
 * (forward/nft.ts): without it a client that keeps sending from one port
 * stays on that backend. Undefined when not relevant (no UDP port the kernel
 * path NATs, or the proxy path).
 */
export function checkUdpFlows(f: Facts): CheckResult | undefined {
  const id = 'udp-flows';
  const a = f.conntrackNetlink;
  const ports = udpSnatPorts(f.config);
  if (!a || a.status === 'not-run' || effectiveDataplane(f) !== 'kernel' || ports.length === 0) return undefined;
  if (a.status === 'ok') return pass(id, `ctnetlink answers: a UDP flow whose backend leaves its port's healthy set is placed again at its next datagram (${ports.join(', ')})`);
  return warn(id, `ctnetlink does not answer here (${a.error ?? 'no reason given'}): a client that keeps sending to ${ports.join(', ')} from one port stays on a backend that left the healthy set until it pauses for nf_conntrack_udp_timeout_stream (120 s)`,
    CTNETLINK_REMEDY);
}

/**
 * With VRRP on the kernel path, a node that takes a VIP (back) deletes the
 * untranslated conntrack entries of flows it routed on to the old holder
 * (net/conntrack.ts untranslatedFlows) through ctnetlink: without it a
 * client that reuses such a source port within 120 s of the failback is
 * reset. Undefined when not relevant (no VRRP, or the proxy path).
 */
export function checkStaleFlows(f: Facts): CheckResult | undefined {
  const id = 'stale-flows';
  const a = f.conntrackNetlink;
  if (!a || a.status === 'not-run' || f.config.placement !== 'flow-hash' || effectiveDataplane(f) !== 'kernel') return undefined;
  if (a.status === 'ok') return pass(id, 'ctnetlink answers: a node that takes a VIP over ends the untranslated flows it routed on while the VIP was elsewhere');
  return warn(id, `ctnetlink does not answer here (${a.error ?? 'no reason given'}): after a failback, a client that reuses a source port the node routed on while Backup is reset, for up to 120 s`,
    CTNETLINK_REMEDY);
}

// --- data path ---------------------------------------------------------------

export function checkDataplane(f: Facts): CheckResult {
  const id = 'dataplane';
  const mode = f.config.dataplane;
  if (mode === 'proxy') return pass(id, 'dataplane proxy: nftables not needed');
  const needed = proxyNeededReason(f.config.proxyOnly ?? []);
  if (mode === 'auto' && needed !== undefined) return pass(id, `dataplane auto: ${needed}: the userspace proxy will be used, nftables not needed`);
  const probe = f.nft.probe;
  let problem: string | undefined;
  let remedy = '';
  if (!f.nft.binary) {
    problem = 'nft not found';
    remedy = `install nftables (${installCmd(f, 'nftables')})`;
  } else if (probe.status !== 'ok' && classifyRefusal(probe.error) === 'permission') {
    problem = `could not test nftables: ${probe.error} (see capabilities)`;
    remedy = 'run the check as root';
  } else if (probe.status !== 'ok') {
    problem = `the kernel refused an nftables nat table in a throwaway namespace: ${probe.error ?? probe.status}`;
    remedy = `use a kernel with nf_tables and nft_nat (CONFIG_NF_TABLES, CONFIG_NFT_NAT${f.config.placement === 'flow-hash' ? ', and CONFIG_NFT_HASH: with VRRP connections are placed by a hash' : ''})`;
  }
  if (!problem) return pass(id, `${f.nft.binary} present; the kernel accepts an nftables nat table (dnat, numgen map${f.config.placement === 'flow-hash' ? ', jhash map (VRRP)' : ''}, masquerade)${mode === 'auto' ? '; auto will use the kernel data path' : ''}`);
  if (mode === 'kernel') return fail(id, `dataplane kernel: ${problem}`, `${remedy}, or set dataplane: proxy`);
  return warn(id, `dataplane auto: ${problem}; the userspace proxy will be used`, `${remedy} for the kernel data path, or set dataplane: proxy to make the choice explicit`);
}

/**
 * The descriptor limit against the proxy's connection limit: the
 * proxy holds two descriptors per connection plus a reserve
 * (forward/capacity.ts, the rule the daemon uses). Informational on the
 * kernel data path, where connections never reach the agent.
 */
export function checkDescriptors(f: Facts): CheckResult | undefined {
  if (!f.limits) return undefined;
  const id = 'descriptors';
  const nofile = f.limits.nofile;
  const configured = f.config.maxConnections;
  const eff = effectiveMaxConnections(configured, nofile);
  const how = configured === undefined ? 'derived from the limit' : 'proxy.maxConnections';
  if (nofile === undefined) return pass(id, `descriptor limit: unlimited or unreadable; proxy holds up to ${eff} connections (${how})`);
  const need = 2 * eff + reservedDescriptors(nofile);
  const path = effectiveDataplane(f);
  const detail = `descriptor limit ${nofile}: the proxy holds up to ${eff} connections (${how}), needing about ${need} descriptors`;
  if (path === 'kernel') return pass(id, `${detail}; the kernel data path is in use, connections do not take the agent's descriptors`);
  if (need > nofile) {
    return warn(id, `${detail}, more than the limit: past ${defaultMaxConnections(nofile)} connections the agent runs out of descriptors (it refuses clients, it does not blame backends)`,
      `raise LimitNOFILE= (systemctl edit lb-agent) to at least ${need}, or lower proxy.maxConnections to ${defaultMaxConnections(nofile)}`);
  }
  return pass(id, detail);
}

// --- the eBPF NAT engine ---------------------------------------------

/**
 * Which engine forwards the kernel path's snat flows (kernel.engine), and
 * whether the eBPF one can run here: its probe loads the clang-built object
 * through libbpf, pins its maps and attaches at tcx ingress, as the daemon
 * does at start. Its NAT ports must not overlap the VM's ephemeral range, or
 * a VM's own connection from the VIP could meet a NAT flow's tuple.
 */
export function checkNatEngine(f: Facts): CheckResult | undefined {
  const k = f.config.kernel;
  if (!f.natEngine || !k) return undefined;
  const id = 'nat-engine';
  const probe = f.natEngine.probe;
  const why = probe.error ?? probe.status;
  const range = f.natEngine.localPortRange;
  const [lo, hi] = k.natPorts;
  const overlap = range !== undefined && lo <= range[1] && hi >= range[0];
  const ports = overlap ? `; kernel.natPorts ${lo}-${hi} overlap the VM's ephemeral ports ${range[0]}-${range[1]} (net.ipv4.ip_local_port_range)` : '';
  const portsFix = 'set kernel.natPorts outside net.ipv4.ip_local_port_range (or narrow that range)';
  if (k.engine === 'nft') {
    const could = probe.status === 'ok' ? 'the eBPF NAT engine could run here' : `the eBPF NAT engine could not run here (${why})`;
    return pass(id, `kernel.engine: nft: the nft table with conntrack forwards the snat flows; ${could}`);
  }
  if (probe.status !== 'ok') {
    const detail = `kernel.engine: ${k.engine}, and the eBPF NAT engine cannot run here: ${why}`;
    const fix = 'see the cause (kernel 6.6+ for tcx, CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, libbpf 1.x, a bpffs at /sys/fs/bpf, the object built by npm ci with clang and libbpf-dev); or set kernel.engine: nft';
    return k.engine === 'ebpf' ? fail(id, `${detail}: the agent would refuse to start`, fix) : warn(id, `${detail}; the nft table forwards alone`, fix);
  }
  // With DSR services the probe attached the DSR program's beside it (forward/index.ts probeNatEngine).
  const beside = (f.config.dsrServices ?? []).length > 0 ? ', beside the DSR program at the same hook (each passes on what is not its own)' : '';
  const b = f.natEngine.batch;
  const batch = b === undefined ? '' : b.status === 'ok'
    ? '; its maps are written and its counters read a few thousand entries a bpf(2) call (BPF_MAP_UPDATE_BATCH, BPF_MAP_LOOKUP_BATCH)'
    : `; its maps are written and read one entry a bpf(2) call (${b.error ?? b.status}), so a large plan loads slower`;
  const ok = `kernel.engine: ${k.engine}: the eBPF NAT engine loads and attaches at tc ingress (tcx)${beside}; it forwards the IPv4 and IPv6 snat flows (its probe's program, both halves, passed the verifier), the nft table the rest${batch}`;
  return overlap ? warn(id, `${ok}${ports}`, portsFix) : pass(id, ok);
}

// --- direct server return --------------------------------------------

/**
 * Can this kernel do direct server return, and does the config need it? The
 * probe loads the daemon's own DSR table (nft-dsr.ts) in a throwaway
 * namespace; a refusal is explained by the kernel options it needs.
 */
export function checkDsr(f: Facts): CheckResult | undefined {
  if (!f.dsr) return undefined;
  const id = 'dsr';
  const wanted = f.config.dsrServices ?? [];
  const probe = f.dsr.probe;
  const missing = Object.entries(f.dsr.kernelConfig).filter(([, v]) => v === 'n').map(([k]) => `CONFIG_${k}`);
  const services = wanted.length > 0 ? `services ${wanted.join(', ')} use sourceIP: preserve` : 'no service uses sourceIP: preserve';
  if (probe.status === 'ok') {
    if (wanted.length > 0 && effectiveDataplane(f) !== 'kernel') {
      return fail(id, `${services}, but the data path will be the userspace proxy, which cannot keep the clients' addresses`, 'fix the dataplane check (nftables), or set sourceIP: snat on those services');
    }
    const table = `the kernel accepts the direct-server-return table (netdev ingress, jhash, fwd); ${services}`;
    const bpf = f.dsr.bpf;
    if (bpf === undefined) return pass(id, table);
    // The program matches frames on the parent; the table forwards the rest (nft-dsr.ts).
    const tableOnly = f.config.dsrTableServices ?? [];
    const rest = tableOnly.length > 0 ? `; ${tableOnly.join(', ')} (another network's NIC) go by the table, which the program passes them on to` : '';
    if (bpf.status === 'ok') return pass(id, `${table}; the BPF program in front of it loads and attaches at tc ingress (tcx): DSR runs on it for IPv4 and IPv6 VIPs on the parent${rest}`);
    const bpfWhy = `the BPF program in front of it cannot run here (${bpf.error ?? bpf.status})${/EPERM|not permitted/i.test(bpf.error ?? '') ? ': it needs CAP_BPF and CAP_NET_ADMIN, and bpf() allowed by the seccomp filter' : ''}; DSR falls back to the table alone (correct, at about twice the CPU per frame)`;
    if (wanted.length === 0) return pass(id, `${table}; ${bpfWhy}`);
    return warn(id, `${table}; ${bpfWhy}`, /EPERM|not permitted/i.test(bpf.error ?? '')
      ? 'run the check as the agent runs (the unit grants CAP_BPF and allows bpf()); a kernel without CONFIG_BPF_SYSCALL or CONFIG_NET_XGRESS (6.6+) cannot run it'
      : 'a kernel with CONFIG_BPF_SYSCALL and CONFIG_NET_XGRESS (6.6+) runs it; the table alone is correct');
  }
  const why = probe.status === 'not-run' ? `could not test (${probe.error ?? 'not run'})`
    : `the kernel refused the direct-server-return table in a throwaway namespace: ${probe.error ?? 'failed'}${missing.length > 0 ? ` (kernel config: ${missing.join(', ')} not set)` : ''}`;
  const remedy = missing.length > 0
    ? `use a kernel built with ${missing.join(', ')}, or set sourceIP: snat`
    : 'use a kernel with nftables netdev support (CONFIG_NF_TABLES_NETDEV, CONFIG_NETFILTER_INGRESS, CONFIG_NFT_HASH, CONFIG_NFT_FWD_NETDEV), or set sourceIP: snat';
  if (wanted.length === 0) return pass(id, `direct server return unavailable here: ${why}; ${services}`);
  if (classifyRefusal(probe.error) === 'permission') return warn(id, `${why} (see capabilities); ${services}`, 'run the check as root');
  return fail(id, `${why}; ${services}: the agent refuses to start with them`, remedy);
}

/** IPv6 on the parent, when a service has an IPv6 VIP. Absent (the check skipped) without one. */
export function checkIpv6(f: Facts): CheckResult | undefined {
  const services = f.config.ipv6Services ?? [];
  const parent = f.parent.name;
  if (services.length === 0 || !parent) return undefined;
  const id = 'ipv6';
  const names = ['all', sysctlIfName(parent)].map((scope) => `net.ipv6.conf.${scope}.disable_ipv6`);
  const off = names.filter((n) => sysctlNum(f, n) === 1);
  const unreadable = names.filter((n) => f.sysctls[n] === undefined);
  const what = `${services.length} service(s) with an IPv6 VIP (${services.join(', ')})`;
  if (off.length > 0) {
    return fail(id, `IPv6 is disabled on ${parent} (${off.map((n) => `${n}=1`).join(', ')}): ${what} cannot be served, the kernel refuses an IPv6 address there`,
      sysctlRemedy(names.map((n) => `${n}=0`)));
  }
  if (unreadable.length === names.length) {
    return fail(id, `IPv6 is not available on ${parent} (no net.ipv6.conf.${sysctlIfName(parent)}.disable_ipv6: the kernel runs without IPv6, ipv6.disable=1 on its command line?): ${what} cannot be served`,
      'boot the kernel without ipv6.disable=1 (or load the ipv6 module), or serve IPv4 only');
  }
  return pass(id, `IPv6 is on for ${parent} (${names.map((n) => `${n}=${f.sysctls[n] ?? '?'}`).join(', ')}) for ${what}`);
}

/**
 * The backend side of direct server return (`backend.vips`): each VIP must be
 * on a non-ARPing interface (the agent puts it on lo) and never on one that
 * answers ARP or NDP, and with an IPv4 VIP the VM must not answer ARP for it
 * (arp_ignore=1, arp_announce=2; the daemon sets them at start). An IPv6
 * VIP on lo needs no sysctl (net/host/dsr-backend.ts).
 */
export function checkDsrBackend(f: Facts): CheckResult | undefined {
  const vips = f.config.backendVips ?? [];
  if (vips.length === 0) return undefined;
  const id = 'dsr-backend';
  const addrs = f.addresses ?? [];
  const arping = vips.flatMap((v) => addrs.filter((a) => a.address === v && !a.noarp).map((a) => `${v} on ${a.interface}`));
  if (arping.length > 0) {
    return fail(id, `backend VIP(s) on an interface that answers ARP: ${arping.join(', ')}: this VM would answer ARP for the VIP and take the clients' traffic from the load balancer`,
      `remove them there (ip addr del VIP/32 dev IFACE, VIP/128 for IPv6); the agent puts backend VIPs on ${BACKEND_VIP_INTERFACE}`);
  }
  const onLo = vips.filter((v) => addrs.some((a) => a.address === v && a.noarp));
  const v4 = vips.some((v) => !v.includes(':'));
  const wrong = v4 ? BACKEND_SYSCTLS.filter(([key, min]) => (sysctlNum(f, `net.ipv4.conf.all.${key}`) ?? 0) < min) : [];
  const seen = BACKEND_SYSCTLS.map(([key]) => `all.${key}=${f.sysctls[`net.ipv4.conf.all.${key}`] ?? '?'}`).join(' ');
  const where = `${onLo.length}/${vips.length} VIP(s) on a non-ARPing interface${onLo.length < vips.length ? ` (the daemon adds the rest to ${BACKEND_VIP_INTERFACE} at start)` : ''}`;
  if (wrong.length > 0 && onLo.length > 0) {
    return warn(id, `${where}; ${seen}: with a VIP on ${BACKEND_VIP_INTERFACE} this VM answers ARP for it or announces it`,
      sysctlRemedy(wrong.map(([key, min]) => `net.ipv4.conf.all.${key}=${min}`)));
  }
  return pass(id, `${where}; ${seen}${wrong.length > 0 ? ' (the daemon raises them to arp_ignore=1 arp_announce=2 before adding a VIP)' : ''}`);
}

/**
 * Zone-aware balancing: is this node's zone known where a policy
 * needs it, are there backends in it, and are zones written where no policy
 * reads them (allowed: ignored, noted here).
 */
export function checkTopology(f: Facts): CheckResult | undefined {
  const svcs = f.config.topology ?? [];
  const zoned = svcs.filter((s) => s.policy !== 'any');
  const ignored = svcs.filter((s) => s.policy === 'any' && s.zones.length > 0);
  if (zoned.length === 0 && ignored.length === 0) return undefined;
  const id = 'topology';
  const zone = f.node?.zone;
  const from = f.node?.zoneFrom === 'config' ? 'node.zone' : f.node?.labelsFile ?? 'the labels file';
  const notes: string[] = [];
  if (ignored.length > 0) notes.push(`note: ${ignored.map((s) => s.service).join(', ')} give backends a zone but use topology any: the zones are ignored`);
  if (zoned.length > 0 && zone === undefined) {
    const only = zoned.filter((s) => s.policy === 'zone-only').map((s) => s.service);
    const prefer = zoned.filter((s) => s.policy === 'prefer-zone').map((s) => s.service);
    const detail = `this node's zone is unknown (${f.node?.problem ?? `no node.zone and no ${ZONE_LABEL} label`})`;
    const remedy = `set node.zone, or write ${ZONE_LABEL}=<zone> to ${f.node?.labelsFile ?? 'node.labelsFile'}`;
    if (only.length > 0) return fail(id, `${detail}: zone-only service(s) ${only.join(', ')} would refuse every connection${notes.length ? `; ${notes.join('; ')}` : ''}`, remedy);
    return warn(id, `${detail}: prefer-zone service(s) ${prefer.join(', ')} use every healthy backend${notes.length ? `; ${notes.join('; ')}` : ''}`, remedy);
  }
  const empty = zoned.filter((s) => zone !== undefined && !s.zones.includes(zone));
  if (empty.some((s) => s.policy === 'zone-only')) {
    const names = empty.filter((s) => s.policy === 'zone-only').map((s) => s.service);
    return fail(id, `zone ${zone} (from ${from}): zone-only service(s) ${names.join(', ')} have no backend in it and would refuse every connection`,
      `give those services backends with zone: ${zone}, or use topology: prefer-zone`);
  }
  if (empty.length > 0) {
    return warn(id, `zone ${zone} (from ${from}): prefer-zone service(s) ${empty.map((s) => s.service).join(', ')} have no backend in it and always spill to other zones${notes.length ? `; ${notes.join('; ')}` : ''}`,
      `give those services backends with zone: ${zone}, or use topology: any`);
  }
  if (ignored.length > 0 && zoned.length === 0) {
    return warn(id, notes.join('; '), 'set topology: prefer-zone or zone-only on those services to use the zones, or remove them');
  }
  return pass(id, `zone ${zone} (from ${from}): ${zoned.map((s) => `${s.service} ${s.policy}`).join(', ')}${notes.length ? `; ${notes.join('; ')}` : ''}`);
}

// --- other programs on the packet path -----------------------------------------

/** A base chain of the ruleset, as `nft -j list ruleset` lists it. */
interface NftChain { family: string; table: string; name: string; type?: string; hook?: string; prio?: number; policy?: string; dev?: string | string[] }
interface NftRule { family: string; table: string; chain: string; handle?: number; expr?: Record<string, unknown>[] }

/** The tables the agent writes itself (forward/nft.ts, forward/nft-dsr.ts): the drift guard keeps them, this check does not judge them. */
const OWN_TABLES = new Set([`${NFT_FAMILY} ${NFT_TABLE}`, `${DSR_FAMILY} ${DSR_TABLE}`]);

/** NF_IP_PRI_NAT_DST: the kernel path's DNAT runs at prerouting priority dstnat. */
const PRIORITY_DSTNAT = -100;

/** Statements that do not decide whether a rule applies (every other non-verdict expression is taken as a condition). */
const NEUTRAL = new Set(['counter', 'log', 'mangle', 'notrack']);

/** Nesting the reading follows through jump and goto (the kernel stops at 16). */
const MAX_JUMPS = 16;

type RuleVerdict =
  | { kind: 'accept' | 'return' | 'none' | 'other' }
  | { kind: 'drop'; what: string }
  | { kind: 'jump' | 'goto'; target: string };

/** A rule's conditions and its verdict: the first verdict statement, or 'none' when it only counts or logs. */
function readRule(expr: readonly Record<string, unknown>[]): { conditions: Record<string, unknown>[]; verdict: RuleVerdict } {
  const conditions: Record<string, unknown>[] = [];
  for (const e of expr) {
    const key = Object.keys(e)[0] ?? '';
    const v = e[key] as Record<string, unknown> | null;
    if (key === 'accept' || key === 'return') return { conditions, verdict: { kind: key } };
    if (key === 'drop') return { conditions, verdict: { kind: 'drop', what: 'drop' } };
    if (key === 'reject') return { conditions, verdict: { kind: 'drop', what: `reject${v && typeof v.type === 'string' ? ` with ${v.type}${typeof v.expr === 'string' ? ` ${v.expr}` : ''}` : ''}` } };
    if ((key === 'jump' || key === 'goto') && v && typeof v.target === 'string') return { conditions, verdict: { kind: key, target: v.target } };
    if (key === 'xt' && v?.type === 'target') {
      return { conditions, verdict: v.name === 'REJECT' || v.name === 'DROP' ? { kind: 'drop', what: String(v.name) } : { kind: 'other' } };
    }
    if (key === 'queue' || key === 'vmap') return { conditions: [...conditions, e], verdict: { kind: 'other' } };
    if (key === 'continue' || NEUTRAL.has(key)) continue;
    conditions.push(e);
  }
  return { conditions, verdict: { kind: 'none' } };
}

/** Where a chain sits: whether conntrack already marks DNATed packets there, and whether the destination is still the VIP. */
interface HookPlace { hook: string; prio: number; family: string }

/** `ct status dnat` is set for a connection's first packet only once the nat hook has run: after dstnat in prerouting, and in forward. */
function dnatMarked(p: HookPlace): boolean {
  return p.family !== 'netdev' && (p.hook === 'forward' || (p.hook === 'prerouting' && p.prio > PRIORITY_DSTNAT));
}

/** Before DNAT (ingress, prerouting up to dstnat) both directions are addressed to the VIP: client to VIP, and the backend's reply to the VIP it was SNATed to. */
function seesVipAddress(p: HookPlace): boolean {
  return p.hook === 'ingress' || (p.hook === 'prerouting' && p.prio <= PRIORITY_DSTNAT);
}

/** [first, last] of each IPv4 value of an nft match's right side (address, prefix, range, anonymous set); others are skipped. */
function addressSpans(right: unknown): [number, number][] {
  if (typeof right === 'string') {
    const a = parseIPv4(right);
    return a === undefined ? [] : [[a, a]];
  }
  if (right === null || typeof right !== 'object') return [];
  const r = right as { prefix?: { addr?: unknown; len?: unknown }; range?: unknown; set?: unknown };
  if (r.prefix && typeof r.prefix.addr === 'string' && typeof r.prefix.len === 'number') {
    const a = parseIPv4(r.prefix.addr);
    if (a === undefined) return [];
    const size = 2 ** (32 - r.prefix.len);
    const first = Math.floor(a / size) * size;
    return [[first, first + size - 1]];
  }
  if (Array.isArray(r.range) && r.range.length === 2) {
    const [a, b] = [addressSpans(r.range[0])[0], addressSpans(r.range[1])[0]];
    return a && b ? [[a[0], b[1]]] : [];
  }
  if (Array.isArray(r.set)) return r.set.flatMap((x) => addressSpans(x));
  return [];
}

/** Does this accept rule let the VIP traffic through before a drop further down? */
function opensVipTraffic(p: HookPlace, conditions: readonly Record<string, unknown>[], vipRanges: readonly [number, number][]): boolean {
  return conditions.every((c) => {
    const m = c.match as { op?: string; left?: Record<string, { key?: string; protocol?: string; field?: string }>; right?: unknown } | undefined;
    if (!m || (m.op !== '==' && m.op !== 'in')) return false;
    // ct status dnat: every connection the kernel path DNATed, both directions (firewalld's own forward chain has it).
    if (m.left?.ct?.key === 'status' && dnatMarked(p)) {
      return m.right === 'dnat' || (Array.isArray((m.right as { set?: unknown })?.set) && ((m.right as { set: unknown[] }).set).includes('dnat'));
    }
    // ip daddr covering the configured pools, where the packets still carry the VIP.
    if (m.left?.payload?.protocol === 'ip' && m.left.payload.field === 'daddr' && seesVipAddress(p)) {
      const spans = addressSpans(m.right);
      return spans.length > 0 && vipRanges.every(([a, b]) => spans.some(([x, y]) => x <= a && b <= y));
    }
    return false;
  });
}

interface ChainDrop { chain: NftChain; what: string; opening: 'ct-dnat' | 'daddr' }

/**
 * Would this base chain drop the VIP traffic? Read in order as the kernel
 * runs it, following unconditional jumps and gotos: the first rule without a
 * condition that accepts or drops decides, else the policy. A conditional
 * rule is passed over (`ct state invalid drop` drops no packet of a working
 * connection), except an accept of exactly the VIP traffic (`ct status
 * dnat`, or `ip daddr` over the pools before DNAT), which ends the reading.
 */
function chainDropsVipTraffic(chain: NftChain, rules: ReadonlyMap<string, NftRule[]>, vipRanges: readonly [number, number][]): ChainDrop | undefined {
  const place: HookPlace = { hook: chain.hook ?? '', prio: chain.prio ?? 0, family: chain.family };
  const opening = dnatMarked(place) ? 'ct-dnat' : 'daddr';
  type Outcome = { kind: 'accept' | 'other' } | { kind: 'drop'; what: string } | undefined;
  const walk = (name: string, depth: number): Outcome => {
    for (const rule of rules.get(name) ?? []) {
      const { conditions, verdict } = readRule(rule.expr ?? []);
      if (conditions.length > 0) {
        if (verdict.kind === 'accept' && opensVipTraffic(place, conditions, vipRanges)) return { kind: 'accept' };
        continue;
      }
      switch (verdict.kind) {
        case 'accept': case 'other': return { kind: verdict.kind };
        case 'return': return undefined;
        case 'drop': return { kind: 'drop', what: `${verdict.what} with no condition (rule handle ${rule.handle ?? '?'}${name === chain.name ? '' : ` in chain ${name}`})` };
        case 'jump': {
          const r = depth < MAX_JUMPS ? walk(verdict.target, depth + 1) : { kind: 'other' as const };
          if (r) return r;
          break;
        }
        case 'goto': return depth < MAX_JUMPS ? walk(verdict.target, depth + 1) : { kind: 'other' };
        case 'none': break;
      }
    }
    return undefined;
  };
  const r = walk(chain.name, 0) ?? (chain.policy === 'drop' ? { kind: 'drop' as const, what: 'policy drop' } : undefined);
  return r?.kind === 'drop' ? { chain, what: r.what, opening } : undefined;
}

/** Base chains of other tables that VIP traffic passes on the kernel path, and every table's rules by chain, from `nft -j list ruleset`. */
function vipPathChains(nftables: readonly unknown[], parent: string | undefined): { chains: NftChain[]; tables: Map<string, Map<string, NftRule[]>> } {
  const chains: NftChain[] = [];
  const tables = new Map<string, Map<string, NftRule[]>>();
  for (const o of nftables) {
    const { chain: c, rule } = (o ?? {}) as { chain?: NftChain; rule?: NftRule };
    if (rule && typeof rule.chain === 'string') {
      const t = tables.get(`${rule.family} ${rule.table}`) ?? new Map<string, NftRule[]>();
      tables.set(`${rule.family} ${rule.table}`, t.set(rule.chain, [...(t.get(rule.chain) ?? []), rule]));
    }
    if (!c || c.hook === undefined || OWN_TABLES.has(`${c.family} ${c.table}`)) continue;
    // Only the hooks the kernel path's packets take: DNAT in prerouting,
    // then forward, both directions. A DNATed connection never reaches
    // input (what does, a VIP port without a healthy backend, the agent
    // refuses itself), so a firewall that closes input is no finding here.
    const ip = (c.family === 'ip' || c.family === 'inet') && (c.hook === 'prerouting' || c.hook === 'forward');
    // Ingress on the parent sees every frame of the VIPs. nft 1.0.6 does not
    // list a netdev chain's device in JSON: a chain without one counts.
    const devs = c.dev === undefined ? undefined : Array.isArray(c.dev) ? c.dev : [c.dev];
    const ingress = (c.family === 'netdev' || c.family === 'inet') && c.hook === 'ingress' && (devs === undefined || (parent !== undefined && devs.includes(parent)));
    if (ip || ingress) chains.push(c);
  }
  return { chains, tables };
}

function describeChain(c: NftChain): string {
  const dev = c.dev === undefined ? '' : ` on ${Array.isArray(c.dev) ? c.dev.join(', ') : c.dev}`;
  return `table ${c.family} ${c.table}, chain ${c.name} (hook ${c.hook}${dev}, priority ${c.prio ?? 0})`;
}

/** The pools' ranges as numbers (the VIPs known before the agent runs; DHCP VIPs come from the LAN's server). */
function poolSpans(f: Facts): [number, number][] {
  return f.config.pools.flatMap((p) => p.ranges.flatMap((r) => {
    const a = parseIPv4(r.first);
    const b = parseIPv4(r.last);
    return a === undefined || b === undefined ? [] : [[a, b] as [number, number]];
  }));
}

/**
 * Another table on the kernel path's hooks that would drop the VIP traffic:
 * netfilter runs every base chain of a hook, and a drop in any one is final,
 * whatever the agent's own table accepts, at whatever priority. So a
 * firewall's forward chain with policy drop (a hardened nftables.conf,
 * Docker's FORWARD, ufw's default) stops every connection the agent DNATs.
 * Undefined in facts from before the ruleset was read.
 */
export function checkFirewall(f: Facts): CheckResult | undefined {
  const rs = f.ruleset;
  if (!rs) return undefined;
  const id = 'firewall';
  if (effectiveDataplane(f) !== 'kernel') return pass(id, 'not checked: the data path is the userspace proxy (the check reads the hooks the kernel path forwards through)');
  if (rs.status === 'not-run') return pass(id, `not checked: ${rs.error ?? 'the ruleset was not read'}`);
  if (rs.status === 'failed' || !rs.nftables) {
    if (classifyRefusal(rs.error) === 'permission') return warn(id, `could not read the ruleset: ${rs.error} (see capabilities)`, 'run the check as root');
    return warn(id, `could not read the ruleset (nft -j list ruleset): ${rs.error ?? 'no ruleset'}`, 'run nft -j list ruleset to see why; other tables on the forward path are not checked meanwhile');
  }
  const { chains, tables } = vipPathChains(rs.nftables, f.parent.name);
  const pools = poolSpans(f);
  const drops = chains.flatMap((c) => chainDropsVipTraffic(c, tables.get(`${c.family} ${c.table}`) ?? new Map(), pools) ?? []);
  if (drops.length === 0) {
    return pass(id, chains.length === 0
      ? 'no other table hooks prerouting, forward or the parent\'s ingress'
      : `${chains.length} base chain(s) of other tables on prerouting, forward or the parent's ingress; none drops the VIP traffic`);
  }
  const vips = pools.length > 0 ? f.config.pools.flatMap((p) => p.ranges.map((r) => (r.first === r.last ? r.first : `${r.first}-${r.last}`))).join(', ') : '<the VIPs>';
  const fixes = drops.map(({ chain: c, opening }) => `nft insert rule ${c.family} ${c.table} ${c.name} ${opening === 'ct-dnat' ? 'ct status dnat accept' : `ip daddr { ${vips} } accept`}`);
  return warn(id, `another table would drop the VIP traffic the kernel path forwards: ${drops.map((d) => `${describeChain(d.chain)}: ${d.what}`).join('; ')}`,
    `accept the VIP traffic ahead of the drop, through the program that owns the table (it may write the table again): ${fixes.join('; ')}; or remove the drop`);
}

/**
 * The running daemon's drift guard: another program that keeps undoing
 * what the agent wrote (a loop flushing the ruleset, a configuration
 * manager removing addresses) makes the guard back off, and status names
 * the fight. Asked only of a daemon that answers on the control socket.
 */
export function checkDriftFight(f: Facts): CheckResult | undefined {
  const d = f.daemon;
  if (!d) return undefined;
  const id = 'drift-fight';
  if (d.status !== 'ok') return pass(id, `not checked: ${d.error ?? 'no daemon answered'}`);
  const who = `the daemon${d.pid !== undefined ? ` (pid ${d.pid})` : ''} on ${d.socket}`;
  if (!d.drift) return pass(id, `${who} answers; its drift guard is not running`);
  if (d.drift.fights.length === 0) return pass(id, `${who} answers: no fight (${d.drift.repairs} repair(s) since it started)`);
  return warn(id, `another program keeps undoing the agent's work, and ${who} backs off: ${d.drift.fights.join('; ')}`,
    'find that program and stop it, or have it leave the agent\'s tables, VIPs and 02: macvlans alone: the drift-repaired and drift-backoff events of lb-agent status say what was undone and, for a table, by which process (pid); journalctl -u lb-agent -g drift lists every repair');
}

// --- guest agent ---------------------------------------------------------------

export function checkGuestAgent(f: Facts): CheckResult {
  const id = 'guest-agent';
  const g = f.guestAgent;
  if (g.running) return pass(id, `qemu-guest-agent is running${g.binary ? ` (${g.binary})` : ''}`);
  const why = 'Harvester reads the VM\'s addresses through it';
  if (g.binary) return warn(id, `qemu-guest-agent is installed (${g.binary}) but not running; ${why}`, 'systemctl enable --now qemu-guest-agent');
  return warn(id, `qemu-guest-agent is not installed; ${why}`, `${installCmd(f, 'qemu-guest-agent')} && systemctl enable --now qemu-guest-agent`);
}

// --- DHCP probe ------------------------------------------------------------------

export function checkDhcpProbe(f: Facts): CheckResult | undefined {
  const d = f.dhcpProbe;
  if (!d) return undefined;
  const id = 'dhcp-probe';
  const how = `DISCOVER from ${d.mac || 'a throwaway MAC'} on a temporary macvlan of ${d.interface}; no REQUEST sent, no lease taken`;
  if (d.status === 'offer') return pass(id, `OFFER of ${d.offeredIp} from ${d.serverId ?? 'a server'} in ${d.ms} ms (${how})`);
  if (d.status === 'error') {
    return fail(id, `the probe could not run: ${d.error ?? 'unknown error'}`, 'fix the checks above (macvlan, capabilities, interface) and probe again');
  }
  const detail = `no offer within ${d.timeoutSeconds} s (${how})`;
  const remedy = `make sure the VM network of ${d.interface} has a DHCP server with free addresses, or use ipam: pool`;
  return f.config.status === 'ok' && f.config.dhcpServices.length === 0 ? warn(id, `${detail}; no service uses ipam dhcp now`, remedy) : fail(id, detail, remedy);
}

/** The DHCPv6 probe (dhcp6-probe.ts): an ADVERTISE with an address for a SOLICIT, for a config with IPv6 DHCP services. */
export function checkDhcp6Probe(f: Facts): CheckResult | undefined {
  const d = f.dhcpProbe6;
  if (!d) return undefined;
  const id = 'dhcp6-probe';
  const how = `SOLICIT from DUID-LL ${d.mac || 'of a throwaway MAC'} on a temporary macvlan of ${d.interface}; no REQUEST sent, no lease taken`;
  if (d.status === 'offer') return pass(id, `ADVERTISE of ${d.offeredIp} from ${d.serverId ?? 'a server'} in ${d.ms} ms (${how})`);
  if (d.status === 'error') {
    return fail(id, `the probe could not run: ${d.error ?? 'unknown error'}`, 'fix the checks above (macvlan, capabilities, interface, ipv6) and probe again');
  }
  return fail(id, `no ADVERTISE with an address within ${d.timeoutSeconds} s (${how})`,
    `make sure the VM network of ${d.interface} has a DHCPv6 server (stateful, IA_NA) with free addresses, or give the IPv6 VIPs a pool (ipam: pool)`);
}

/**
 * failover.track.interfaces (every network's): each exists on this VM, and is up with carrier
 * now. A missing one counts as down for good (a typo, or a NIC the VM does
 * not have): the routers start lowered or in fault. Warnings, not failures:
 * the daemon runs, and a NIC plugged later is picked up.
 */
export function checkVrrpTrack(f: Facts): CheckResult | undefined {
  const links = f.trackedLinks;
  if (!links || links.length === 0) return undefined;
  const id = 'vrrp-track';
  const missing = links.filter((l) => !l.exists).map((l) => l.name);
  const down = links.filter((l) => l.exists && (!l.up || !l.carrier)).map((l) => `${l.name} (${l.up ? 'no carrier' : 'down'})`);
  if (missing.length > 0) {
    return warn(id, `failover.track names ${missing.join(', ')}, which this VM does not have: ${missing.length === 1 ? 'it counts' : 'they count'} as down, so the VRRP priority is lowered (or the routers are in fault) for as long as that lasts${down.length ? `; also down now: ${down.join(', ')}` : ''}`,
      `fix the name in failover.track.interfaces (or networks.<name>.failover.track.interfaces) (ip -br link lists this VM's interfaces), or remove the track`);
  }
  if (down.length > 0) {
    return warn(id, `tracked interface${down.length === 1 ? '' : 's'} ${down.join(', ')} ${down.length === 1 ? 'is' : 'are'} not up with carrier now: the VRRP priority is lowered (or the routers are in fault) until ${down.length === 1 ? 'it comes' : 'they come'} back`,
      'bring the link up (ip link set NAME up) and check its cable or virtual NIC');
  }
  return pass(id, `tracked interfaces up with carrier: ${links.map((l) => l.name).join(', ')}`);
}

/** Every check, in report order. */
/**
 * Every network's NIC, by the same rules as the default one's (interface,
 * arp-sysctls, pools) and a macvlan made on it: one finding, as bad as the
 * worst network, one clause per network.
 */
export function checkNetworks(f: Facts): CheckResult | undefined {
  const id = 'networks';
  const nets = f.networks;
  if (!nets || nets.length === 0) return undefined;
  const rank = { pass: 0, warn: 1, fail: 2 } as const;
  let worst: CheckResult['status'] = 'pass';
  const details: string[] = [];
  const remedies: string[] = [];
  for (const n of nets) {
    const conf = f.config.networks?.find((c) => c.name === n.name);
    const g: Facts = { ...f, parent: n.parent, sysctls: { ...f.sysctls, ...n.sysctls }, config: { ...f.config, pools: conf?.pools ?? [], dhcpServices: [] } };
    // The NIC's own sysctls: those of new macvlans are the arp-sysctls finding's.
    const parts: CheckResult[] = [checkInterface(g)];
    if (n.parent.exists) {
      parts.push(checkArpSysctls(g), checkPools(g));
      const dhcp = conf?.dhcpServices ?? 0;
      if (n.macvlan.status === 'ok') parts.push(pass(id, `a macvlan can hang off ${n.parent.name}`));
      else if (n.macvlan.status === 'failed') {
        const busy = /busy/i.test(n.macvlan.error ?? '');
        const why = `cannot make a macvlan on ${n.parent.name}: ${n.macvlan.error ?? '?'}${busy ? ' (the NIC belongs to a bridge, bond or team)' : ''}`;
        const fix = busy ? `set networks.${n.name}.interface to the bridge or bond ${n.parent.name} belongs to, not to the port` : 'see the macvlan finding';
        parts.push(dhcp > 0 ? fail(id, `${why}; ${dhcp} DHCP service(s) on this network would stay Pending`, fix) : warn(id, `${why}; no DHCP service is on this network now`, fix));
      } else parts.push(warn(id, `macvlan on ${n.parent.name} not tried: ${n.macvlan.error ?? '?'}`, 'run the check as root with unshare and ip installed'));
    }
    const bad = parts.filter((p) => p.status !== 'pass');
    const st = bad.reduce<CheckResult['status']>((w, p) => (rank[p.status] > rank[w] ? p.status : w), 'pass');
    if (rank[st] > rank[worst]) worst = st;
    const head = `${n.name} (${n.parent.name ?? '?'}, ${conf?.services ?? 0} service(s))`;
    details.push(bad.length === 0 ? `${head}: up, carrier, ${[...n.parent.addresses.filter((x) => !x.endsWith('/32')), ...(n.parent.addresses6 ?? []).filter((x) => !x.endsWith('/128'))].join(', ')}, arp_ignore/arp_announce as wanted, macvlan ok` : `${head}: ${bad.map((p) => p.detail).join('; ')}`);
    for (const p of bad) if (p.remedy) remedies.push(`${n.name}: ${p.remedy}`);
  }
  const detail = details.join(' | ');
  if (worst === 'pass') return pass(id, detail);
  return worst === 'fail' ? fail(id, detail, remedies.join('; ')) : warn(id, detail, remedies.join('; '));
}

export function runChecks(f: Facts): CheckResult[] {
  const out = [
    checkConfig(f),
    checkStateDir(f),
    checkCapabilities(f),
    checkMacvlan(f),
    checkInterface(f),
    checkPools(f),
    checkArpSysctls(f),
    checkRpFilter(f),
    checkIpForward(f),
    checkDataplane(f),
    checkGuestAgent(f),
  ];
  const fds = checkDescriptors(f);
  if (fds) out.push(fds);
  for (const c of [checkNetworks(f), checkDsr(f), checkDsrBackend(f), checkNatEngine(f), checkIpv6(f), checkTopology(f), checkConntrackPickup(f), checkUdpFlows(f), checkStaleFlows(f), checkFirewall(f), checkDriftFight(f), checkVrrpTrack(f)]) if (c) out.push(c);
  for (const c of [checkDhcpProbe(f), checkDhcp6Probe(f)]) if (c) out.push(c);
  return out;
}
