// Per-interface sysctls (driver over /proc/sys/net/ipv4/conf/<if>/, and
// ipv6/conf/<if>/disable_ipv6): read and set the ARP-flux and reverse-path
// knobs docs/design.md requires on the parent NIC and on each macvlan. Values are small integers; paths are built
// only from validated interface names and a fixed set of keys.
//
// Reads and writes are synchronous: a procfs file is kernel memory, never a
// disk, and these keys take no lock that waits (unlike disable_ipv6, which
// takes the RTNL and stays asynchronous below). Through the thread pool each
// read is four round trips, and DHCP services starting at once would queue
// them in front of their first DISCOVER. The functions stay async for their
// callers.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { performance } from 'node:perf_hooks';
import { LbError } from '../../errors';

export const IF_SYSCTL_KEYS = ['arp_ignore', 'arp_announce', 'rp_filter'] as const;
export type IfSysctlKey = (typeof IF_SYSCTL_KEYS)[number];

/**
 * The same knobs as rtnetlink knows them (linux/ip.h IPV4_DEVCONF_*): the
 * attribute types of IFLA_INET_CONF, which sets them on a link through
 * netlink (NetlinkClient.setLink) instead of its procfs files.
 */
export const IPV4_DEVCONF_ID: Readonly<Record<IfSysctlKey, number>> = Object.freeze({ rp_filter: 8, arp_announce: 18, arp_ignore: 19 });

export interface SysctlOptions {
  /** Root of the sysctl tree; tests point it at a temporary directory. */
  root?: string;
}

const DEFAULT_ROOT = '/proc/sys';

/**
 * The kernel's dev_valid_name(): 1..15 bytes, not "." or "..", no '/',
 * ':' or whitespace. Also "all" and "default", which are conf directories.
 * Returns the reason the name is invalid, or undefined.
 */
export function interfaceNameProblem(name: string): string | undefined {
  if (typeof name !== 'string' || name.length === 0) return 'interface name is empty';
  if (Buffer.byteLength(name) > 15) return `interface name ${JSON.stringify(name)} is longer than 15 bytes`;
  if (name === '.' || name === '..') return `interface name ${JSON.stringify(name)} is reserved`;
  if (/[/:\s]/.test(name)) return `interface name ${JSON.stringify(name)} contains '/', ':' or whitespace`;
  return undefined;
}

/** /proc/sys/net/ipv4/conf/<ifname>/<key>, after validating both parts. */
export function ifSysctlPath(ifname: string, key: IfSysctlKey, opts: SysctlOptions = {}): string {
  const problem = interfaceNameProblem(ifname);
  if (problem) throw new LbError('LB_ERR_NET_SYSCTL', `cannot address sysctl ${key}: ${problem}`, { interface: ifname, key });
  if (!(IF_SYSCTL_KEYS as readonly string[]).includes(key)) {
    throw new LbError('LB_ERR_NET_SYSCTL', `unknown interface sysctl ${JSON.stringify(key)}`, { interface: ifname, key });
  }
  return path.join(opts.root ?? DEFAULT_ROOT, 'net', 'ipv4', 'conf', ifname, key);
}

function sysctlName(ifname: string, key: IfSysctlKey): string {
  return `net.ipv4.conf.${ifname}.${key}`;
}

function ioError(err: unknown, action: string, ifname: string, key: IfSysctlKey): LbError {
  const code = (err as NodeJS.ErrnoException).code;
  const name = sysctlName(ifname, key);
  if (code === 'ENOENT') {
    return new LbError('LB_ERR_NET_NO_INTERFACE', `cannot ${action} ${name}: interface ${ifname} has no IPv4 configuration (does it exist?)`, { interface: ifname, key }, { cause: err });
  }
  if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') {
    return new LbError(
      'LB_ERR_NET_NO_CAPABILITY',
      `cannot ${action} ${name}: permission denied (${code}); needs root with CAP_NET_ADMIN and a writable /proc/sys`,
      { interface: ifname, key, capability: 'CAP_NET_ADMIN' },
      { cause: err },
    );
  }
  return new LbError('LB_ERR_NET_SYSCTL', `cannot ${action} ${name}: ${(err as Error).message}`, { interface: ifname, key }, { cause: err });
}

export async function readIfSysctl(ifname: string, key: IfSysctlKey, opts: SysctlOptions = {}): Promise<number> {
  const file = ifSysctlPath(ifname, key, opts);
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw ioError(err, 'read', ifname, key);
  }
  const v = Number(text.trim());
  if (!Number.isInteger(v)) throw new LbError('LB_ERR_NET_SYSCTL', `${sysctlName(ifname, key)} holds ${JSON.stringify(text.trim())}, not an integer`, { interface: ifname, key });
  return v;
}

export async function writeIfSysctl(ifname: string, key: IfSysctlKey, value: number, opts: SysctlOptions = {}): Promise<void> {
  if (!Number.isInteger(value) || value < 0) throw new RangeError(`sysctl value must be a non-negative integer, got ${value}`);
  const file = ifSysctlPath(ifname, key, opts);
  try {
    // No O_CREAT: a missing interface must fail (ENOENT), not create a file.
    fs.writeFileSync(file, `${value}\n`, { flag: 'r+' });
  } catch (err) {
    throw ioError(err, 'set', ifname, key);
  }
}

/**
 * Turn IPv6 off on one interface (net.ipv6.conf.<if>.disable_ipv6=1): a link
 * that lives for seconds (the preflight's DHCP probe) must not send DAD,
 * router or MLD traffic from its MAC. False when the kernel has no IPv6 there.
 */
export async function disableIpv6(ifname: string, opts: SysctlOptions = {}): Promise<boolean> {
  const problem = interfaceNameProblem(ifname);
  if (problem) throw new LbError('LB_ERR_NET_SYSCTL', `cannot address sysctl disable_ipv6: ${problem}`, { interface: ifname, key: 'disable_ipv6' });
  const file = path.join(opts.root ?? DEFAULT_ROOT, 'net', 'ipv6', 'conf', ifname, 'disable_ipv6');
  try {
    await fs.promises.writeFile(file, '1\n', { flag: 'r+' });
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw new LbError('LB_ERR_NET_SYSCTL', `cannot set net.ipv6.conf.${ifname}.disable_ipv6: ${(err as Error).message}`, { interface: ifname, key: 'disable_ipv6' }, { cause: err });
  }
}

/**
 * The IPv6 settings of a service macvlan that carries a DHCPv6 VIP, before
 * it goes up (or at once on an adopted one): no router advertisements and
 * no SLAAC address on it (the VIP is its one global address, a /128; the
 * on-link prefix and the routes live on the parent), optimistic DAD for its
 * link-local address (RFC 4429: usable as the DHCPv6 source at once; it
 * derives from the service's own MAC), and IPv6 on. False when the kernel
 * has no IPv6 there.
 */
export const DHCP6_LINK_SYSCTLS: ReadonlyArray<readonly [string, number]> = Object.freeze([
  ['accept_ra', 0], ['autoconf', 0], ['optimistic_dad', 1], ['use_optimistic', 1], ['disable_ipv6', 0],
] as const);

export async function prepareIpv6Link(ifname: string, opts: SysctlOptions = {}): Promise<boolean> {
  const problem = interfaceNameProblem(ifname);
  if (problem) throw new LbError('LB_ERR_NET_SYSCTL', `cannot address the IPv6 sysctls: ${problem}`, { interface: ifname });
  for (const [key, value] of DHCP6_LINK_SYSCTLS) {
    const file = path.join(opts.root ?? DEFAULT_ROOT, 'net', 'ipv6', 'conf', ifname, key);
    try {
      await fs.promises.writeFile(file, `${value}\n`, { flag: 'r+' });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' && key === DHCP6_LINK_SYSCTLS[0]![0]) return false;
      throw new LbError('LB_ERR_NET_SYSCTL', `cannot set net.ipv6.conf.${ifname}.${key}=${value}: ${(err as Error).message}`, { interface: ifname, key }, { cause: err });
    }
  }
  return true;
}

export type VipRole = 'parent' | 'macvlan';

/**
 * The wanted values, by role: the one table. The daemon writes it
 * (applyVipSysctls) and the preflight checks against it (preflight/checks.ts).
 *
 * docs/design.md "ARP flux": with several addresses on one LAN the kernel answers
 * ARP for any local address on any NIC. arp_ignore=1 answers only for
 * addresses on the receiving interface; arp_announce=2 always uses the
 * outgoing interface's best address as the ARP source. Not arp_ignore=2: it
 * answers only a sender inside a subnet that also holds the VIP on the
 * receiving interface (ip-sysctl.rst), and pool VIPs are /32s on the parent,
 * so a pool outside the parent's subnet (preflight check "pools" only warns)
 * or a client on another subnet of the same L2 gets no ARP reply at all. On
 * macvlans, rp_filter=2 (loose, RFC 3704 §2.4) because replies may route via
 * the parent.
 */
export const VIP_SYSCTLS: Readonly<Record<VipRole, ReadonlyArray<readonly [IfSysctlKey, number]>>> = Object.freeze({
  parent: Object.freeze([['arp_ignore', 1], ['arp_announce', 2]] as const),
  macvlan: Object.freeze([['arp_ignore', 1], ['arp_announce', 2], ['rp_filter', 2]] as const),
});

/** The wanted sysctls of an interface in that role, in the order they are applied. */
export function vipSysctls(role: VipRole): ReadonlyArray<readonly [IfSysctlKey, number]> {
  return VIP_SYSCTLS[role];
}

/** The wanted value of one sysctl in that role; undefined when the role leaves it alone. */
export function wantedSysctl(role: VipRole, key: IfSysctlKey): number | undefined {
  return VIP_SYSCTLS[role].find(([k]) => k === key)?.[1];
}

export interface SysctlChange {
  key: IfSysctlKey;
  from: number;
  to: number;
}

/**
 * Apply vipSysctls(role) to an interface. Returns what changed (values
 * already right are left alone). All or nothing: if a write fails, the ones
 * already made are restored before the error is thrown.
 */
export async function applyVipSysctls(ifname: string, role: VipRole, opts: SysctlOptions = {}): Promise<SysctlChange[]> {
  const changes: SysctlChange[] = [];
  try {
    for (const [key, to] of vipSysctls(role)) {
      const from = await readIfSysctl(ifname, key, opts);
      if (from === to) continue;
      await writeIfSysctl(ifname, key, to, opts);
      changes.push({ key, from, to });
    }
  } catch (err) {
    for (const c of changes.reverse()) {
      try { await writeIfSysctl(ifname, c.key, c.from, opts); } catch { /* best effort: the original error is what matters */ }
    }
    throw err;
  }
  return changes;
}

/** How long a parent's sysctls, once applied, count as applied for ParentSysctls. */
export const PARENT_RECHECK_MS = 1_000;

/**
 * applyVipSysctls(parent, 'parent'), skipped when this instance applied them
 * within PARENT_RECHECK_MS: DHCP services starting together would otherwise
 * each read the parent's values again, right after the daemon set them. One
 * per daemon, shared by its start and its DHCP services. A value
 * changed by another program meanwhile is put right by the next service
 * start after that, and the preflight reports it.
 */
export class ParentSysctls {
  private readonly applied = new Map<string, number>();
  /** An apply under way: callers meanwhile wait for it instead of reading the values again. */
  private readonly applying = new Map<string, Promise<SysctlChange[]>>();

  constructor(private readonly opts: SysctlOptions & { now?: () => number } = {}) {}

  /** What this call changed: [] when the values were applied within the window, or by a call still under way (its failure is theirs too). */
  async apply(ifname: string): Promise<SysctlChange[]> {
    const pending = this.applying.get(ifname);
    if (pending) return pending.then(() => []);
    const now = this.opts.now ? this.opts.now() : performance.now();
    const at = this.applied.get(ifname);
    if (at !== undefined && now - at >= 0 && now - at < PARENT_RECHECK_MS) return [];
    const p = applyVipSysctls(ifname, 'parent', this.opts);
    this.applying.set(ifname, p);
    try {
      const changes = await p;
      this.applied.set(ifname, now);
      return changes;
    } finally {
      this.applying.delete(ifname);
    }
  }
}
