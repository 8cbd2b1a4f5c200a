// Preflight, I/O layer: gathers everything `lb-agent check` judges into ONE
// plain, JSON-serialisable Facts object. Nothing here decides pass or fail
// (checks.ts does, as pure functions of Facts), so every failure can be
// replayed from a fixture. Gathering is concurrent and every subprocess is
// bounded by a timeout: the whole preflight must stay under a second.
//
// Nothing on the VM changes: the macvlan and nftables probes run in a
// throwaway network namespace (`unshare --net`) that dies with the probe
// process. The only exception is `modprobe macvlan`, attempted when a macvlan
// could not be created and the module is not loaded: loading the driver the
// agent needs anyway is the point of the diagnosis.
import { execFile, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as zlib from 'node:zlib';
import { loadConfigFile, formatConfigErrors, controlSocketOf } from '../config/load';
import { DEFAULTS } from '../config/defaults';
import type { DataplaneMode, Desired } from '../config/types';
import { readNofile } from '../forward/capacity';
import { formatAddress } from '../address';
import { DEFAULT_NETWORK, networksOf } from '../config/networks';
import { placementFor, servicesNeedingProxy, type Placement } from '../forward/dataplane';
import { sysctlIfName } from './checks';
import { parseDefaultRoute } from '../net/host/route';
import { IF_SYSCTL_KEYS } from '../net/sysctl/sysctl';
import { DSR_KERNEL_OPTIONS, DSR_PROBE_RULESET } from '../forward/nft-dsr';
import { readNodeTopology, type NodeTopology } from '../config/labels';
import { controlRequest } from '../control/server';
import type { DriftStatus } from '../daemon/drift';
import { errorMessage } from '../errors';

export { sysctlIfName };

export const FACTS_SCHEMA = 1;

/** Outcome of something the gatherer tried (a probe, a command). */
export interface Attempt {
  status: 'ok' | 'failed' | 'not-run';
  /** What the machine said when it failed, or why it did not run. */
  error?: string;
  ms?: number;
}

export interface ConfigFacts {
  path: string;
  status: 'ok' | 'missing' | 'invalid';
  /** Loader errors, one line each ("file:line: path: message"). */
  errors: string[];
  /** What the checks need from the config; the defaults when it did not load. */
  interface: string | undefined;
  dataplane: DataplaneMode;
  stateDir: string;
  pools: { key: string; ranges: { text: string; first: string; last: string }[] }[];
  /** Every service port the data plane will serve ("ns/name"). */
  ports: { service: string; port: number; protocol: 'TCP' | 'UDP' }[];
  /** Services that take their VIP by DHCP on a macvlan of their own. */
  dhcpServices: string[];
  services: number;
  /** proxy.maxConnections as configured; undefined: derived from the descriptor limit. */
  maxConnections?: number;
  /** Services with sourceIP: preserve (direct server return). */
  dsrServices?: string[];
  /** Of those, the ones the BPF program does not serve (on a NIC other than the parent): the nft table forwards them. */
  dsrTableServices?: string[];
  /** kernel.engine and kernel.natPorts (the eBPF NAT engine). */
  kernel?: { engine: 'nft' | 'ebpf' | 'auto'; natPorts: [number, number]; parent: string | undefined };
  /** The family services with an IPv6 VIP ("ns/name@IPv6"). */
  ipv6Services?: string[];
  /** How the kernel path places new connections (flow-hash with VRRP: forward/dataplane.ts placementFor). */
  placement?: Placement;
  /** `backend.vips`: the DSR VIPs this VM serves as a backend. */
  backendVips?: string[];
  /** Each service's topology policy and its backends' zones. */
  topology?: { service: string; policy: string; zones: string[]; unzoned: number }[];
  /** Services only the proxy path can serve (they ask for the PROXY protocol). */
  proxyOnly?: string[];
  /** The named networks (`networks:`): each one's NIC, pools and services; absent: the default network only. */
  networks?: { name: string; interface: string; pools: ConfigFacts['pools']; services: number; dhcpServices: number }[];
  /** Every network's failover.track.interfaces by name, with failover.mode vrrp (tracks do nothing otherwise). */
  trackedInterfaces?: string[];
}

export interface MacvlanFacts {
  /** The definitive test: create a macvlan (mode bridge) in a throwaway namespace. */
  create: Attempt & { parent?: 'veth' | 'loopback' };
  /** /proc/modules: absent on kernels built without module support. */
  procModules: 'absent' | 'loaded' | 'not-loaded';
  /** /sys/module/macvlan exists (a loaded module, or a built-in with parameters). */
  sysModule: boolean;
  /** /lib/modules/$(uname -r) exists. */
  modulesDir: boolean;
  /** Listed in modules.builtin; undefined when the file is unreadable. */
  builtin: boolean | undefined;
  /** Listed in modules.dep (the .ko is installed); undefined when unreadable. */
  modulesDep: boolean | undefined;
  /** CONFIG_MACVLAN from /boot/config-$(uname -r) or /proc/config.gz. */
  kernelConfig: 'y' | 'm' | 'n' | undefined;
  /** `modprobe macvlan`, tried only when creation failed and the module is not loaded. */
  modprobe: Attempt;
  /** The create test again, after a successful modprobe. */
  retry: Attempt;
  /** Kernel packages installed (gathered only when creation failed). */
  packages: { manager: 'rpm' | 'dpkg' | 'none'; installed: { name: string; version: string }[] };
}

export interface ParentFacts {
  name: string | undefined;
  /** Where the name comes from: node.interface, the default route, or networks.<network>.interface. */
  source: 'config' | 'default-route' | 'none' | 'network';
  /** The network it is the NIC of, when source is network. */
  network?: string;
  exists: boolean;
  operstate: string | undefined;
  /** undefined when unreadable (the kernel refuses to read carrier of a down link). */
  carrier: boolean | undefined;
  /** IFF_* flags from /sys/class/net/<if>/flags. */
  flags: number | undefined;
  /** IPv4 addresses with prefix, "10.0.0.5/24". */
  addresses: string[];
  /** Global IPv6 addresses with prefix, "fd00::5/64": the subnets IPv6 pool ranges must lie in. */
  addresses6?: string[];
  /** Every interface present except lo, to suggest one. */
  available: string[];
}

export interface StateDirFacts {
  path: string;
  exists: boolean;
  isDirectory: boolean;
  writable: boolean;
  /** When it does not exist: the nearest existing ancestor, and whether it is writable. */
  ancestor: string | undefined;
  ancestorWritable: boolean;
  error: string | undefined;
}

export interface DhcpProbeFacts {
  status: 'offer' | 'no-offer' | 'error';
  interface: string;
  mac: string;
  timeoutSeconds: number;
  ms: number;
  offeredIp?: string;
  serverId?: string;
  error?: string;
}

export interface Facts {
  schema: number;
  /** arch is Node's process.arch (x64, arm64, ...). */
  host: { kernelRelease: string; arch: string; osId: string; osIdLike: string[]; osName: string; uid: number };
  config: ConfigFacts;
  stateDir: StateDirFacts;
  /** CapEff from /proc/self/status, hex as written there. */
  caps: { effective: string | undefined };
  macvlan: MacvlanFacts;
  parent: ParentFacts;
  /** sysctl name (sysctl(8) spelling) -> value; absent when unreadable. */
  sysctls: Record<string, string>;
  nft: { binary: string | undefined; probe: Attempt };
  guestAgent: { binary: string | undefined; running: boolean };
  dhcpProbe?: DhcpProbeFacts;
  /** The DHCPv6 probe's answer (serverId: the server's DUID); only with IPv6 DHCP services. */
  dhcpProbe6?: DhcpProbeFacts;
  /** RLIMIT_NOFILE of this process (the unit's LimitNOFILE= under systemd); absent in facts from before it was gathered. */
  limits?: { nofile: number | undefined };
  /** The direct-server-return probe (nft-dsr.ts DSR_PROBE_RULESET in a throwaway namespace) and the kernel options it needs. */
  dsr?: {
    probe: Attempt;
    kernelConfig: Record<string, 'y' | 'm' | 'n' | undefined>;
    /** The BPF program in front of the table (net/ebpf-attach.ts probeDsrBpfHere): load it, attach it at tcx ingress of lo, detach. Absent in facts from before it. */
    bpf?: Attempt;
  };
  /**
   * The eBPF NAT engine (net/ebpf/nat-attach.ts probeNatHere, on lo of this
   * namespace in a pin directory of its own, removed after), and the VM's
   * ephemeral port range its NAT ports must stay out of; `batch`: whether
   * the kernel takes its map writes and counter reads a few thousand
   * entries a bpf(2) call (net/ebpf/map-batch.ts probeMapBatch), else one
   * call each. Absent in facts from before it.
   */
  natEngine?: { probe: Attempt; localPortRange: [number, number] | undefined; batch?: Attempt };
  /** This node's zone (node.zone, else the labels file). */
  node?: NodeTopology;
  /** Every IPv4 address of the VM, with whether its interface answers ARP (for the DSR backend check). */
  addresses?: { interface: string; address: string; prefix: number; noarp: boolean }[];
  /** ctnetlink answering (net/conntrack.ts probeConntrackNetlink): the kernel path ends the UDP flows of a backend that left through it. Gathered only for a config with a UDP port the kernel path may NAT. */
  conntrackNetlink?: Attempt;
  /** `nft -j list ruleset`, read once where the kernel path may run: the document's `nftables` array, or why it was not read. Absent in facts from before it. */
  ruleset?: Attempt & { nftables?: unknown[] };
  /** The daemon running with this config, asked for its status on the control socket: what its drift guard reports, or why none answered. Absent in facts from before it. */
  daemon?: DaemonFacts;
  /** Each tracked interface (config.trackedInterfaces) as /sys/class/net shows it; absent without any. */
  trackedLinks?: { name: string; exists: boolean; up: boolean; carrier: boolean }[];
  /** With named networks: every network's NIC (the default first), its ARP sysctls and whether a macvlan can be made on it. */
  networks?: NetworkFacts[];
}

export interface NetworkFacts {
  name: string;
  parent: ParentFacts;
  /** net.ipv4.conf.<if>.{arp_ignore,arp_announce,rp_filter} in sysctl(8) spelling (net.ipv4.conf.all.* are in Facts.sysctls). */
  sysctls: Record<string, string>;
  /** A macvlan (mode bridge) made on this NIC straight into a throwaway namespace, so nothing appears beside the NIC. */
  macvlan: Attempt;
}

export interface DaemonFacts extends Attempt {
  socket: string;
  pid?: number;
  /** The drift guard's part of the status; absent while the daemon runs none. */
  drift?: { repairs: number; fights: string[] };
}

// ---------------------------------------------------------------------------
// Pure parsers of what the machine says (unit-tested in facts.test.ts).

/** CapEff from /proc/<pid>/status. */
export function parseCapEff(status: string): string | undefined {
  return /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(status)?.[1];
}

/** /etc/os-release KEY=value (quoted or not). */
export function parseOsRelease(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split('\n')) {
    const m = /^([A-Z0-9_]+)=(.*)$/.exec(line.trim());
    if (!m) continue;
    let v = m[2]!;
    if ((v.startsWith('"') && v.endsWith('"')) || (v.startsWith("'") && v.endsWith("'"))) v = v.slice(1, -1);
    out[m[1]!] = v.replace(/\\(.)/g, '$1');
  }
  return out;
}

/** Is `name` a line of /proc/modules? */
export function procModulesHas(text: string, name: string): boolean {
  return text.split('\n').some((l) => l.split(' ', 1)[0] === name);
}

/** Does modules.builtin / modules.dep list the module? (".ko", ".ko.xz", ".ko.zst", ".ko.gz") */
export function moduleListHas(text: string, name: string): boolean {
  const re = new RegExp(`(^|/)${name.replace(/[-_]/g, '[-_]')}\\.ko(\\.[a-z0-9]+)?(:|$)`);
  return text.split('\n').some((l) => re.test(l.split(/\s/, 1)[0] ?? ''));
}

/** CONFIG_<sym> from a kernel .config text. */
export function kernelConfigValue(text: string, sym: string): 'y' | 'm' | 'n' | undefined {
  for (const line of text.split('\n')) {
    if (line.startsWith(`CONFIG_${sym}=`)) {
      const v = line.slice(`CONFIG_${sym}=`.length).trim();
      return v === 'y' || v === 'm' ? v : 'n';
    }
    if (line.trim() === `# CONFIG_${sym} is not set`) return 'n';
  }
  return undefined;
}

/** `rpm -q --qf '%{NAME}\t%{VERSION}-%{RELEASE}\n' a b` (lines of missing packages ignored). */
export function parseRpmQuery(text: string): { name: string; version: string }[] {
  return text.split('\n').map((l) => l.split('\t')).filter((f) => f.length === 2 && f[0] && !f[0].includes(' '))
    .map(([name, version]) => ({ name: name!, version: version!.trim() }));
}

/** `dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n' ...`: installed ("ii") only. */
export function parseDpkgQuery(text: string): { name: string; version: string }[] {
  return text.split('\n').map((l) => l.split('\t'))
    .filter((f) => f.length >= 3 && f[2]!.trim().startsWith('ii'))
    .map(([name, version]) => ({ name: name!, version: version! }));
}

/** IPv4 addresses of `ip -j addr show dev X` (or IPv6 ones of global scope: the link-local one is no subnet of the LAN's). */
export function parseIpJsonAddrs(json: string, family: 'inet' | 'inet6' = 'inet'): string[] {
  try {
    const links = JSON.parse(json) as { addr_info?: { family?: string; local?: string; prefixlen?: number; scope?: string }[] }[];
    return links.flatMap((l) => (l.addr_info ?? []).filter((a) => a.family === family && a.local && (family === 'inet' || a.scope === 'global'))
      .map((a) => `${a.local}/${a.prefixlen ?? (family === 'inet' ? 32 : 128)}`));
  } catch {
    return [];
  }
}

/** The `nftables` array of `nft -j list ruleset`; undefined when the text is not such a document. */
export function parseNftRuleset(json: string): unknown[] | undefined {
  try {
    const doc = JSON.parse(json) as { nftables?: unknown } | null;
    return Array.isArray(doc?.nftables) ? doc.nftables : undefined;
  } catch {
    return undefined;
  }
}

/** What the checks need from a validated config. */
export function configSummary(path_: string, config: Desired): ConfigFacts {
  const byKey = new Map(config.services.map((s) => [s.key, s]));
  return {
    path: path_,
    status: 'ok',
    errors: [],
    interface: config.node.interface,
    dataplane: config.dataplane,
    stateDir: config.stateDir,
    pools: config.pools.map((p) => ({
      key: p.key,
      ranges: p.ranges.map((r) => ({ text: r.text, first: formatAddress({ family: r.family, value: r.start }), last: formatAddress({ family: r.family, value: r.end }) })),
    })),
    ports: config.services.flatMap((s) => s.ports.map((p) => ({ service: s.key, port: p.port, protocol: p.protocol }))),
    // A secondary rides its primary's VIP: only primaries create macvlans.
    dhcpServices: config.services.filter((s) => s.ipam === 'dhcp' && (s.primaryService === undefined || !byKey.has(s.primaryService)))
      .map((s) => s.key),
    services: config.services.length,
    ...(config.proxy.maxConnections !== undefined ? { maxConnections: config.proxy.maxConnections } : {}),
    dsrServices: config.services.filter((s) => s.sourceIP === 'preserve').map((s) => s.key),
    dsrTableServices: config.services.filter((s) => s.sourceIP === 'preserve' && (s.network ?? DEFAULT_NETWORK) !== DEFAULT_NETWORK).map((s) => s.key),
    kernel: { engine: config.kernel.engine, natPorts: [config.kernel.natPorts[0], config.kernel.natPorts[1]], parent: config.node.interface },
    ipv6Services: config.services.filter((s) => s.family === 'IPv6').map((s) => s.key),
    placement: placementFor(config.failover.mode),
    backendVips: [...config.backend.vips],
    topology: config.services.map((s) => ({
      service: s.key, policy: s.topology,
      zones: [...new Set(s.backends.map((b) => b.zone).filter((z): z is string => z !== undefined))].sort(),
      unzoned: s.backends.filter((b) => b.zone === undefined).length,
    })),
    ...(servicesNeedingProxy(config.services).length > 0 ? { proxyOnly: servicesNeedingProxy(config.services) } : {}),
    ...((config.networks ?? []).length > 0 ? {
      networks: networksOf(config).map((n) => {
        const on = config.services.filter((s) => (s.network ?? DEFAULT_NETWORK) === n.name);
        return {
          name: n.name, interface: n.interface ?? '',
          pools: n.pools.map((p) => ({ key: p.key, ranges: p.ranges.map((r) => ({ text: r.text, first: formatAddress({ family: r.family, value: r.start }), last: formatAddress({ family: r.family, value: r.end }) })) })),
          services: on.length, dhcpServices: on.filter((s) => s.ipam === 'dhcp' && s.primaryService === undefined).length,
        };
      }),
    } : {}),
    // Every network's tracked NICs (its failover.track), each named once.
    ...(config.failover.mode === 'vrrp' && networksOf(config).some((n) => n.failover.track.interfaces.length > 0)
      ? { trackedInterfaces: [...new Set(networksOf(config).flatMap((n) => n.failover.track.interfaces.map((i) => i.name)))] } : {}),
  };
}

/** A tracked interface as sysfs shows it: IFF_UP from flags, carrier (unreadable while down). */
async function gatherTrackedLink(name: string): Promise<{ name: string; exists: boolean; up: boolean; carrier: boolean }> {
  const flags = await readText(`/sys/class/net/${name}/flags`);
  if (flags === undefined) return { name, exists: false, up: false, carrier: false };
  const up = (Number.parseInt(flags.trim(), 16) & 0x1) !== 0;
  const carrier = up && (await readText(`/sys/class/net/${name}/carrier`))?.trim() === '1';
  return { name, exists: true, up, carrier };
}

function defaultConfigFacts(path_: string, status: 'missing' | 'invalid', errors: string[]): ConfigFacts {
  return {
    path: path_, status, errors,
    interface: undefined,
    dataplane: DEFAULTS.dataplane,
    stateDir: DEFAULTS.stateDir,
    pools: [], ports: [], dhcpServices: [], services: 0,
  };
}

// ---------------------------------------------------------------------------
// I/O.

interface RunResult { code: number | null; stdout: string; stderr: string; error?: string; ms: number }

const SEARCH_PATH = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];

/** Where a binary lives (PATH first, then the sbin directories cloud-init's PATH may lack). */
export function findBinary(name: string, envPath = process.env.PATH ?? ''): string | undefined {
  const dirs = [...envPath.split(':').filter(Boolean), ...SEARCH_PATH];
  for (const d of dirs) {
    const p = path.join(d, name);
    try { fs.accessSync(p, fs.constants.X_OK); if (fs.statSync(p).isFile()) return p; } catch { /* next */ }
  }
  return undefined;
}

function run(cmd: string, args: string[], opts: { input?: string; timeoutMs?: number } = {}): Promise<RunResult> {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const child = execFile(cmd, args, { timeout: opts.timeoutMs ?? 5000, maxBuffer: 16 << 20, env: { ...process.env, LC_ALL: 'C' } },
      (err, stdout, stderr) => {
        const ms = Math.round(performance.now() - t0);
        if (!err) return resolve({ code: 0, stdout, stderr, ms });
        const e = err as NodeJS.ErrnoException & { code?: unknown; killed?: boolean };
        const code = typeof e.code === 'number' ? e.code : null;
        const why = e.killed ? `timed out after ${opts.timeoutMs ?? 5000} ms` : typeof e.code === 'string' ? `${e.code}: ${e.message}` : undefined;
        resolve({ code, stdout, stderr, ms, ...(why !== undefined ? { error: why } : {}) });
      });
    child.stdin?.on('error', () => { /* the child may exit before reading */ });
    child.stdin?.end(opts.input ?? '');
  });
}

/** The last meaningful line of a command's complaint. */
function complaint(r: RunResult): string {
  const lines = `${r.stderr}\n${r.stdout}`.split('\n').map((l) => l.trim()).filter((l) => l && !/^Command failed/.test(l));
  return lines.join('; ') || r.error || `exit ${r.code}`;
}

async function readText(p: string): Promise<string | undefined> {
  try { return await fs.promises.readFile(p, 'utf8'); } catch { return undefined; }
}

async function exists(p: string): Promise<boolean> {
  try { await fs.promises.access(p); return true; } catch { return false; }
}

async function readKernelConfig(release: string): Promise<string | undefined> {
  const boot = await readText(`/boot/config-${release}`);
  if (boot !== undefined) return boot;
  try { return zlib.gunzipSync(await fs.promises.readFile('/proc/config.gz')).toString('utf8'); } catch { return undefined; }
}

const PROBE_LINK = 'lbchk';

/** Create a veth and a macvlan on it inside a namespace of its own; the namespace dies with `ip`. */
async function macvlanCreateTest(unshare: string | undefined, ip: string | undefined): Promise<MacvlanFacts['create']> {
  if (!unshare || !ip) return { status: 'not-run', error: `${!unshare ? 'unshare' : 'ip'} not found` };
  const batch = [
    `link add name ${PROBE_LINK}0 type veth peer name ${PROBE_LINK}1`,
    `link add link ${PROBE_LINK}0 name ${PROBE_LINK}2 type macvlan mode bridge`,
  ].join('\n');
  const r = await run(unshare, ['--net', ip, '-batch', '-'], { input: `${batch}\n` });
  if (r.code === 0) return { status: 'ok', ms: r.ms, parent: 'veth' };
  const err = complaint(r);
  // A kernel without veth cannot host the usual test. The kernel still tells
  // whether it knows the macvlan type: on a loopback parent, a present driver
  // refuses with EINVAL (macvlan_port_create wants an Ethernet parent), a
  // missing one with "Unknown device type" / EOPNOTSUPP before that.
  if (/Command failed -:1\b/.test(r.stderr) && !/not permitted/i.test(err)) {
    const lo = await run(unshare, ['--net', ip, 'link', 'add', 'link', 'lo', 'name', `${PROBE_LINK}2`, 'type', 'macvlan', 'mode', 'bridge']);
    const loErr = complaint(lo);
    if (/Invalid argument/i.test(loErr)) return { status: 'ok', ms: r.ms + lo.ms, parent: 'loopback' };
    return { status: 'failed', error: loErr, ms: r.ms + lo.ms, parent: 'loopback' };
  }
  return { status: 'failed', error: err, ms: r.ms, parent: 'veth' };
}

/** What the kernel dataplane needs from nftables: a nat table, a fib lookup (dispatch only to a local VIP), dnat through a numgen map, masquerade. */
export const NFT_PROBE_RULESET = nftProbeRuleset('round-robin');

/** The nat table the dataplane check loads; placed by flow hash (VRRP), the kernel path also hashes (CONFIG_NFT_HASH). */
export function nftProbeRuleset(placement: Placement): string {
  const hashed = placement === 'flow-hash' ? ' fib daddr type local tcp dport 81 dnat to jhash ip saddr . tcp sport mod 2 seed 0x1 map { 0 : 192.0.2.1, 1 : 192.0.2.2 };' : '';
  return `table ip lbchk {
  chain pre { type nat hook prerouting priority dstnat; policy accept; fib daddr type local tcp dport 80 dnat to numgen random mod 2 map { 0 : 192.0.2.1, 1 : 192.0.2.2 };${hashed} }
  chain post { type nat hook postrouting priority srcnat; policy accept; ip daddr 192.0.2.0/24 masquerade; }
}
`;
}

async function nftProbe(unshare: string | undefined, nft: string | undefined, ruleset = NFT_PROBE_RULESET): Promise<Attempt> {
  if (!nft) return { status: 'not-run', error: 'nft not found' };
  if (!unshare) return { status: 'not-run', error: 'unshare not found' };
  const r = await run(unshare, ['--net', nft, '-f', '-'], { input: ruleset });
  return r.code === 0 ? { status: 'ok', ms: r.ms } : { status: 'failed', error: complaint(r), ms: r.ms };
}

/** Can the kernel do direct server return (the daemon's own probe text), and its kernel options. */
async function gatherDsr(release: string, unshare: string | undefined, nft: string | undefined): Promise<NonNullable<Facts['dsr']>> {
  const [probe, configText] = await Promise.all([nftProbe(unshare, nft, DSR_PROBE_RULESET), readKernelConfig(release)]);
  const kernelConfig: Record<string, 'y' | 'm' | 'n' | undefined> = {};
  for (const o of DSR_KERNEL_OPTIONS) kernelConfig[o] = configText === undefined ? undefined : kernelConfigValue(configText, o);
  return { probe, kernelConfig, bpf: bpfProbe() };
}

/**
 * The BPF path of direct server return, probed in this process as the
 * daemon probes it at start: bpf() allowed (CAP_BPF and CAP_NET_ADMIN, or
 * root; a seccomp filter that refuses bpf shows as EPERM), the verifier takes
 * the program, tcx attaches it. On lo of this namespace rather than in a new
 * one: entering a namespace takes a new process, and the probe's program
 * matches only a TEST-NET VIP behind a locally administered MAC, which lo
 * never carries, for the two syscalls it is attached.
 */
function bpfProbe(): Attempt {
  const t0 = Date.now();
  try {
    const why = (require('../net/ebpf/ebpf-attach') as typeof import('../net/ebpf/ebpf-attach')).probeDsrBpfHere();
    return why === undefined ? { status: 'ok', ms: Date.now() - t0 } : { status: 'failed', error: why, ms: Date.now() - t0 };
  } catch (err) {
    return { status: 'not-run', error: (err as Error).message };
  }
}


/** The eBPF NAT engine's probe, as the daemon runs it at start (forward/index.ts probeNatEngine), and the ephemeral port range. */
async function gatherNatEngine(withDsr: boolean): Promise<NonNullable<Facts['natEngine']>> {
  const range = (await readText('/proc/sys/net/ipv4/ip_local_port_range'))?.trim().split(/\s+/).map(Number);
  const localPortRange: [number, number] | undefined = range && range.length === 2 && range.every((n) => Number.isInteger(n)) ? [range[0]!, range[1]!] : undefined;
  const t0 = Date.now();
  let batch: Attempt;
  try {
    const why = (require('../net/ebpf/nat-attach') as typeof import('../net/ebpf/nat-attach')).probeNatBatch();
    batch = why === undefined ? { status: 'ok' } : { status: 'failed', error: why };
  } catch (err) {
    batch = { status: 'not-run', error: (err as Error).message };
  }
  try {
    const why = (require('../forward/index') as typeof import('../forward/index')).probeNatEngine('check', { withDsr });
    return { probe: why === undefined ? { status: 'ok', ms: Date.now() - t0 } : { status: 'failed', error: why, ms: Date.now() - t0 }, localPortRange, batch };
  } catch (err) {
    return { probe: { status: 'not-run', error: (err as Error).message }, localPortRange, batch };
  }
}

/** Every IPv4 address and whether its interface does ARP (`ip -j -4 addr`). */
export function parseIpJsonAllAddrs(json: string): NonNullable<Facts['addresses']> {
  try {
    const links = JSON.parse(json) as { ifname?: string; flags?: string[]; addr_info?: { family?: string; local?: string; prefixlen?: number }[] }[];
    return links.flatMap((l) => (l.addr_info ?? []).filter((a) => a.family === 'inet' && a.local).map((a) => ({
      interface: l.ifname ?? '?', address: a.local!, prefix: a.prefixlen ?? 32,
      // lo carries LOOPBACK and never answers ARP on the LAN; NOARP links neither.
      noarp: (l.flags ?? []).includes('NOARP') || (l.flags ?? []).includes('LOOPBACK'),
    })));
  } catch {
    return [];
  }
}


async function kernelPackages(): Promise<MacvlanFacts['packages']> {
  const rpm = findBinary('rpm');
  const dpkg = findBinary('dpkg-query');
  if (dpkg) {
    const r = await run(dpkg, ['-W', '-f', '${Package}\t${Version}\t${db:Status-Abbrev}\n', 'linux-image-*', 'linux-modules-*']);
    const installed = parseDpkgQuery(r.stdout);
    if (installed.length > 0 || !rpm) return { manager: 'dpkg', installed };
  }
  if (rpm) {
    const r = await run(rpm, ['-q', '--qf', '%{NAME}\t%{VERSION}-%{RELEASE}\n', 'kernel-default', 'kernel-default-base', 'kernel-default-extra']);
    return { manager: 'rpm', installed: parseRpmQuery(r.stdout) };
  }
  return { manager: 'none', installed: [] };
}

async function gatherMacvlan(release: string, unshare: string | undefined, ip: string | undefined): Promise<MacvlanFacts> {
  const modDir = `/lib/modules/${release}`;
  const [create, procModules, sysModule, modulesDir, builtinText, depText, configText] = await Promise.all([
    macvlanCreateTest(unshare, ip),
    readText('/proc/modules'),
    exists('/sys/module/macvlan'),
    exists(modDir),
    readText(`${modDir}/modules.builtin`),
    readText(`${modDir}/modules.dep`),
    readKernelConfig(release),
  ]);
  const facts: MacvlanFacts = {
    create,
    procModules: procModules === undefined ? 'absent' : procModulesHas(procModules, 'macvlan') ? 'loaded' : 'not-loaded',
    sysModule,
    modulesDir,
    builtin: builtinText === undefined ? undefined : moduleListHas(builtinText, 'macvlan'),
    modulesDep: depText === undefined ? undefined : moduleListHas(depText, 'macvlan'),
    kernelConfig: configText === undefined ? undefined : kernelConfigValue(configText, 'MACVLAN'),
    modprobe: { status: 'not-run' },
    retry: { status: 'not-run' },
    packages: { manager: 'none', installed: [] },
  };
  if (create.status === 'ok') return facts;
  // Diagnosis, only on failure: keeps the good path fast. Without the
  // privilege to create links, modprobe (CAP_SYS_MODULE) would not tell more.
  const loaded = facts.procModules === 'loaded' || facts.sysModule;
  const unprivileged = /not permitted|Permission denied/i.test(create.error ?? '');
  const modprobe = findBinary('modprobe');
  const skip = loaded ? 'already loaded' : unprivileged ? 'not privileged' : !modprobe ? 'modprobe not found' : undefined;
  const [mp, packages] = await Promise.all([
    skip === undefined ? run(modprobe!, ['macvlan']) : Promise.resolve(undefined),
    kernelPackages(),
  ]);
  facts.packages = packages;
  if (mp) {
    facts.modprobe = mp.code === 0 ? { status: 'ok', ms: mp.ms } : { status: 'failed', error: complaint(mp), ms: mp.ms };
    if (mp.code === 0) facts.retry = await macvlanCreateTest(unshare, ip);
  } else {
    facts.modprobe = { status: 'not-run', error: skip ?? 'not run' };
  }
  return facts;
}

async function gatherParent(name: string | undefined, source: ParentFacts['source'], ip: string | undefined): Promise<ParentFacts> {
  let available: string[] = [];
  try { available = (await fs.promises.readdir('/sys/class/net')).filter((n) => n !== 'lo').sort(); } catch { /* no sysfs */ }
  const base: ParentFacts = { name, source, exists: false, operstate: undefined, carrier: undefined, flags: undefined, addresses: [], available };
  if (!name || name.includes('/')) return base;
  const dir = `/sys/class/net/${name}`;
  if (!(await exists(dir))) return base;
  const [operstate, carrier, flags, addrs] = await Promise.all([
    readText(`${dir}/operstate`),
    readText(`${dir}/carrier`),
    readText(`${dir}/flags`),
    ip ? run(ip, ['-j', 'addr', 'show', 'dev', name]) : Promise.resolve(undefined),
  ]);
  return {
    ...base,
    exists: true,
    operstate: operstate?.trim(),
    carrier: carrier === undefined ? undefined : carrier.trim() === '1',
    flags: flags === undefined ? undefined : parseInt(flags.trim(), 16),
    addresses: addrs ? parseIpJsonAddrs(addrs.stdout) : [],
    addresses6: addrs ? parseIpJsonAddrs(addrs.stdout, 'inet6') : [],
  };
}

/**
 * Can a macvlan hang off this NIC? Made with the NIC as its lower device but
 * straight inside a throwaway namespace (`ip link add link NIC netns PID`),
 * so nothing appears in the VM's own namespace, and gone with the namespace.
 * It fails where the agent's would: no driver, or a NIC already claimed by a
 * bridge, bond or team (EBUSY: one rx handler per device).
 */
async function macvlanOnParent(unshare: string | undefined, ip: string | undefined, parent: string): Promise<Attempt> {
  if (!unshare || !ip) return { status: 'not-run', error: !unshare ? 'unshare not found' : 'ip not found' };
  const t0 = performance.now();
  const holder = spawn(unshare, ['--net', 'sleep', '10'], { stdio: 'ignore' });
  try {
    const pid = holder.pid;
    if (pid === undefined) return { status: 'not-run', error: 'could not start unshare' };
    // The link must never land in this namespace: wait until the holder is in its own.
    const own = await fs.promises.readlink('/proc/self/ns/net');
    let theirs: string | undefined;
    for (let i = 0; i < 100 && (theirs === undefined || theirs === own); i++) {
      await new Promise((r) => setTimeout(r, 10));
      theirs = await fs.promises.readlink(`/proc/${pid}/ns/net`).catch(() => undefined);
    }
    if (theirs === undefined || theirs === own) return { status: 'not-run', error: 'the throwaway namespace did not come up', ms: Math.round(performance.now() - t0) };
    const r = await run(ip, ['link', 'add', 'link', parent, 'name', `${PROBE_LINK}3`, 'netns', String(pid), 'type', 'macvlan', 'mode', 'bridge']);
    const ms = Math.round(performance.now() - t0);
    return r.code === 0 ? { status: 'ok', ms } : { status: 'failed', error: complaint(r), ms };
  } finally {
    holder.kill('SIGKILL');
  }
}

/** One network's NIC as the daemon will use it: state, addresses, ARP sysctls, a macvlan on it. */
async function gatherNetwork(name: string, parentName: string | undefined, source: ParentFacts['source'], unshare: string | undefined, ip: string | undefined): Promise<NetworkFacts> {
  const [parent, sysctls] = await Promise.all([gatherParent(parentName, source, ip), parentName ? gatherIfSysctls(parentName) : Promise.resolve({})]);
  if (source === 'network') parent.network = name;
  const macvlan = parent.exists && parentName ? await macvlanOnParent(unshare, ip, parentName) : { status: 'not-run' as const, error: 'no such interface' };
  return { name, parent, sysctls, macvlan };
}

async function gatherIfSysctls(ifname: string): Promise<Record<string, string>> {
  const names = IF_SYSCTL_KEYS.map((key) => `net.ipv4.conf.${sysctlIfName(ifname)}.${key}`);
  const values = await Promise.all(names.map((n) => readText(`/proc/sys/${n.split('.').map((s) => s.replace(/\//g, '.')).join('/')}`)));
  const out: Record<string, string> = {};
  names.forEach((n, i) => { if (values[i] !== undefined) out[n] = values[i].trim(); });
  return out;
}

async function gatherSysctls(parent: string | undefined): Promise<Record<string, string>> {
  // nf_conntrack_tcp_loose exists once conntrack is loaded (the kernel path's nat table loads it).
  const names = ['net.ipv4.ip_forward', 'net.netfilter.nf_conntrack_tcp_loose'];
  for (const scope of ['all', 'default', ...(parent ? [sysctlIfName(parent)] : [])]) {
    for (const key of IF_SYSCTL_KEYS) names.push(`net.ipv4.conf.${scope}.${key}`);
    names.push(`net.ipv6.conf.${scope}.disable_ipv6`);
  }
  // sysctl(8) spelling to /proc/sys: dots are separators, slashes were dots.
  const values = await Promise.all(names.map((n) => readText(`/proc/sys/${n.split('.').map((s) => s.replace(/\//g, '.')).join('/')}`)));
  const out: Record<string, string> = {};
  names.forEach((n, i) => { if (values[i] !== undefined) out[n] = values[i].trim(); });
  return out;
}

async function gatherStateDir(dir: string): Promise<StateDirFacts> {
  const f: StateDirFacts = { path: dir, exists: false, isDirectory: false, writable: false, ancestor: undefined, ancestorWritable: false, error: undefined };
  try {
    const st = await fs.promises.stat(dir);
    f.exists = true;
    f.isDirectory = st.isDirectory();
    await fs.promises.access(dir, fs.constants.W_OK | fs.constants.X_OK);
    f.writable = f.isDirectory;
    return f;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (f.exists) { f.error = `${err.code ?? ''} ${err.message}`.trim(); return f; }
  }
  // Not there yet: the daemon creates it, so the question is whether it can.
  let up = path.dirname(path.resolve(dir));
  for (let i = 0; i < 64; i++) {
    try {
      const st = await fs.promises.stat(up);
      f.ancestor = up;
      if (!st.isDirectory()) { f.error = `${up} is not a directory`; return f; }
      try { await fs.promises.access(up, fs.constants.W_OK | fs.constants.X_OK); f.ancestorWritable = true; } catch (e) {
        f.error = `${(e as NodeJS.ErrnoException).code ?? ''} ${(e as Error).message}`.trim();
      }
      return f;
    } catch { /* keep climbing */ }
    const next = path.dirname(up);
    if (next === up) break;
    up = next;
  }
  return f;
}

async function guestAgentRunning(): Promise<boolean> {
  let pids: string[];
  try { pids = (await fs.promises.readdir('/proc')).filter((n) => /^\d+$/.test(n)); } catch { return false; }
  const comms = await Promise.all(pids.map((p) => readText(`/proc/${p}/comm`)));
  return comms.some((c) => c?.trim() === 'qemu-ga');
}

type NodePlace = Pick<Desired['node'], 'zone' | 'region' | 'labelsFile'>;

/** The config's facts, node.zone / region / labelsFile and the control socket (the defaults when it does not load). */
function loadConfigFacts(configPath: string): { facts: ConfigFacts; node: NodePlace; socket: string } {
  const noNode: NodePlace = { zone: undefined, region: undefined, labelsFile: DEFAULTS.node.labelsFile };
  if (!fs.existsSync(configPath)) return { facts: defaultConfigFacts(configPath, 'missing', [`${configPath}: no such file`]), node: noNode, socket: DEFAULTS.control.socket };
  const res = loadConfigFile(configPath);
  if (res.ok) return { facts: configSummary(configPath, res.config), node: res.config.node, socket: res.config.control.socket };
  // An invalid file may still name its socket, and a daemon may run with the file as it was.
  return { facts: defaultConfigFacts(configPath, 'invalid', formatConfigErrors(res.errors, configPath).split('\n').filter(Boolean)), node: noNode, socket: controlSocketOf(configPath) };
}

/** The VM's whole ruleset, one `nft -j list ruleset`; not read where the kernel path cannot run. */
async function gatherRuleset(nft: string | undefined, dataplane: DataplaneMode): Promise<NonNullable<Facts['ruleset']>> {
  if (dataplane === 'proxy') return { status: 'not-run', error: 'dataplane proxy' };
  if (!nft) return { status: 'not-run', error: 'nft not found' };
  const r = await run(nft, ['-j', 'list', 'ruleset']);
  if (r.code !== 0) return { status: 'failed', error: complaint(r), ms: r.ms };
  const nftables = parseNftRuleset(r.stdout);
  return nftables ? { status: 'ok', ms: r.ms, nftables } : { status: 'failed', error: 'nft -j list ruleset printed no JSON ruleset', ms: r.ms };
}

/**
 * How long the preflight waits for a daemon's status. A missing socket fails
 * at once (ENOENT, ECONNREFUSED); only a daemon that accepts and does not
 * answer costs this much.
 */
export const DAEMON_STATUS_TIMEOUT_MS = 1000;

/** Ask the daemon on `socket` for its status, as `lb-agent status` does: its drift guard's repairs and fights. */
export async function askDaemon(socket: string, timeoutMs = DAEMON_STATUS_TIMEOUT_MS): Promise<DaemonFacts> {
  const t0 = Date.now();
  try {
    const doc = (await controlRequest(socket, 'status', timeoutMs)) as { pid?: unknown; drift?: DriftStatus } | null;
    const drift = doc?.drift;
    return {
      status: 'ok', socket, ms: Date.now() - t0,
      ...(typeof doc?.pid === 'number' ? { pid: doc.pid } : {}),
      ...(drift ? { drift: { repairs: Object.values(drift.repairs).reduce((a, b) => a + b, 0), fights: [...drift.fights] } } : {}),
    };
  } catch (e) {
    const code = ((e as { cause?: NodeJS.ErrnoException }).cause)?.code;
    if (code === 'ENOENT' || code === 'ECONNREFUSED') {
      return { status: 'not-run', socket, error: `no daemon answers on ${socket} (${code})`, ms: Date.now() - t0 };
    }
    return { status: 'failed', socket, error: errorMessage(e), ms: Date.now() - t0 };
  }
}

export interface GatherOptions {
  configPath: string;
  /** Run the DHCP probe (sends a DISCOVER on the parent's LAN). */
  dhcpProbe?: (parent: string) => Promise<DhcpProbeFacts>;
  /** Run the DHCPv6 probe (a SOLICIT on the parent's LAN) when the config has IPv6 DHCP services. */
  dhcpProbe6?: (parent: string) => Promise<DhcpProbeFacts>;
}

/** The config's UDP ports the kernel path would NAT (not direct server return): "ns/name port/UDP". */
export function udpSnatPorts(config: ConfigFacts): string[] {
  const dsr = new Set(config.dsrServices ?? []);
  return config.ports.filter((p) => p.protocol === 'UDP' && !dsr.has(p.service)).map((p) => `${p.service} ${p.port}/UDP`);
}

async function gatherConntrackNetlink(): Promise<Attempt> {
  const t0 = Date.now();
  const why = await (require('../net/conntrack/conntrack') as typeof import('../net/conntrack/conntrack')).probeConntrackNetlink();
  return why === undefined ? { status: 'ok', ms: Date.now() - t0 } : { status: 'failed', error: why, ms: Date.now() - t0 };
}

/** Gather every fact the checks judge, concurrently. */
export async function gatherFacts(opts: GatherOptions): Promise<Facts> {
  const release = ((await readText('/proc/sys/kernel/osrelease')) ?? '').trim();
  const unshare = findBinary('unshare');
  const ip = findBinary('ip');
  const nft = findBinary('nft');

  const macvlanP = gatherMacvlan(release, unshare, ip);
  const { facts: config, node: nodePlace, socket } = loadConfigFacts(opts.configPath);
  const nftP = nftProbe(unshare, nft, nftProbeRuleset(config.placement ?? 'round-robin'));
  const rulesetP = gatherRuleset(nft, config.dataplane);
  const daemonP = askDaemon(socket);
  const osP = readText('/etc/os-release').then((t) => parseOsRelease(t ?? ''));
  const capsP = readText('/proc/self/status').then((t) => (t === undefined ? undefined : parseCapEff(t)));
  const qgaBin = findBinary('qemu-ga');
  const qgaP = guestAgentRunning();
  const routeP = readText('/proc/net/route').then((t) => (t === undefined ? undefined : parseDefaultRoute(t)));

  const dsrP = gatherDsr(release, unshare, nft);
  // ctnetlink: the UDP sweep (a UDP port the kernel path NATs) and, with VRRP, the untranslated flows a takeover ends.
  const ctP = config.dataplane !== 'proxy' && (udpSnatPorts(config).length > 0 || config.placement === 'flow-hash') ? gatherConntrackNetlink() : Promise.resolve(undefined);
  const nodeP = readNodeTopology(nodePlace);
  const addrsP = ip ? run(ip, ['-j', '-4', 'addr', 'show']).then((r) => parseIpJsonAllAddrs(r.stdout)) : Promise.resolve([]);
  const defaultRoute = await routeP;
  const parentName = config.interface ?? defaultRoute;
  const source: ParentFacts['source'] = config.interface ? 'config' : defaultRoute ? 'default-route' : 'none';

  const [parent, sysctls, stateDir, macvlan, nftProbeRes, os, caps, qgaRunning] = await Promise.all([
    gatherParent(parentName, source, ip),
    gatherSysctls(parentName),
    gatherStateDir(config.stateDir),
    macvlanP, nftP, osP, capsP, qgaP,
  ]);

  const facts: Facts = {
    schema: FACTS_SCHEMA,
    host: {
      kernelRelease: release,
      arch: process.arch,
      osId: os.ID ?? '',
      osIdLike: (os.ID_LIKE ?? '').split(/\s+/).filter(Boolean),
      osName: os.PRETTY_NAME ?? os.NAME ?? '',
      uid: process.getuid?.() ?? -1,
    },
    config,
    stateDir,
    caps: { effective: caps },
    macvlan,
    parent,
    sysctls,
    nft: { binary: nft, probe: nftProbeRes },
    guestAgent: { binary: qgaBin, running: qgaRunning },
    limits: { nofile: readNofile() },
    dsr: await dsrP,
    natEngine: config.dataplane !== 'proxy' ? await gatherNatEngine((config.dsrServices ?? []).length > 0) : undefined,
    node: await nodeP,
    addresses: await addrsP,
    ruleset: await rulesetP,
    daemon: await daemonP,
  };
  const ct = await ctP;
  if (ct) facts.conntrackNetlink = ct;
  if (config.networks) {
    facts.networks = [];
    for (const n of config.networks) {
      const isDefault = n.name === DEFAULT_NETWORK;
      facts.networks.push(await gatherNetwork(n.name, isDefault ? parentName : n.interface, isDefault ? source : 'network', unshare, ip));
    }
  }
  if (config.trackedInterfaces) facts.trackedLinks = await Promise.all(config.trackedInterfaces.map((n) => gatherTrackedLink(n)));
  if (opts.dhcpProbe) {
    facts.dhcpProbe = parent.exists && parentName
      ? await opts.dhcpProbe(parentName)
      : { status: 'error', interface: parentName ?? '', mac: '', timeoutSeconds: 0, ms: 0, error: 'no parent interface to probe on' };
  }
  if (opts.dhcpProbe6 && config.dhcpServices.some((k) => k.endsWith('@IPv6'))) {
    facts.dhcpProbe6 = parent.exists && parentName
      ? await opts.dhcpProbe6(parentName)
      : { status: 'error', interface: parentName ?? '', mac: '', timeoutSeconds: 0, ms: 0, error: 'no parent interface to probe on' };
  }
  return facts;
}
