// The VM's own IPv4 addresses, read live (getifaddrs through
// os.networkInterfaces(): one syscall, no netlink round trip), shaped as the
// DHCP guard's HostView. Read when a reply arrives, so addresses added since
// start (other services' VIPs, a renumbered parent) count - but one read
// serves every reply for HOST_READ_MAX_AGE_MS, and the agent's own address
// changes are written into it rather than dropping it (with 50
// macvlans one read costs 0.3-0.8 ms of the event loop; each of 50 binds
// dropped the read, so a 50-service start read the host 20-22 times, 16-21
// ms, in the window where the next exchanges wait on the loop).
import * as os from 'node:os';
import { performance } from 'node:perf_hooks';
import { parseCidr, parseIPv4, type Cidr } from '../../address';

export interface LocalAddresses {
  /** The parent NIC's subnets (addresses with prefix < 32). */
  readonly subnets: readonly Cidr[];
  /** Every IPv4 address on every interface except `exclude`. */
  readonly local: readonly number[];
}

type Interfaces = ReturnType<typeof os.networkInterfaces>;

/**
 * How old a read of the host may be when a reply is judged against it. An
 * address another program adds is seen by the replies that arrive this long
 * after it at the latest; the agent's own changes are seen at once
 * (addressAdded, addressRemoved, addressesChanged). The guard's addresses
 * (the VM's own) live for hours, not milliseconds.
 */
export const HOST_READ_MAX_AGE_MS = 100;

interface HostRead {
  readonly parsed: ParsedRead;
  /** performance.now() of the read. */
  readonly at: number;
}

let current: HostRead | undefined;

/**
 * The host's addresses, parsed: the last read while it is younger than
 * HOST_READ_MAX_AGE_MS (with the agent's own changes since written in),
 * else a new one.
 */
export function currentHost(read: () => Interfaces = os.networkInterfaces, now: number = performance.now()): ParsedRead {
  if (current === undefined || now - current.at >= HOST_READ_MAX_AGE_MS || now < current.at) {
    current = { parsed: parseRead(read()), at: now };
  }
  return current.parsed;
}

/** The agent changed addresses in a way it does not describe: the next currentHost() reads the kernel again. */
export function addressesChanged(): void {
  current = undefined;
}

/** The agent put `ip` on `ifname` (a /32 VIP): the read in use has it from now on. */
export function addressAdded(ifname: string, ip: number): void {
  if (current === undefined) return;
  const { v4, subnets } = current.parsed;
  if (v4.some((a) => a.name === ifname && a.n === ip)) return;
  current = { ...current, parsed: { v4: [...v4, { name: ifname, n: ip }], subnets } };
}

/** The agent took `ip` off `ifname` (a /32 VIP): the read in use no longer has it. */
export function addressRemoved(ifname: string, ip: number): void {
  if (current === undefined) return;
  const { v4, subnets } = current.parsed;
  current = { ...current, parsed: { v4: v4.filter((a) => !(a.name === ifname && a.n === ip)), subnets } };
}

/** One read's IPv4 addresses, parsed: by interface, and the parent's subnets by interface. */
export interface ParsedRead {
  readonly v4: readonly { readonly name: string; readonly n: number }[];
  readonly subnets: ReadonlyMap<string, readonly Cidr[]>;
}

/**
 * A read parsed once, however many replies ask while it is in use (with 50
 * macvlans, walking every interface's entries and parsing each
 * address for every reply cost about as much as the read itself).
 */
export function parseRead(interfaces: Interfaces): ParsedRead {
  const v4: { name: string; n: number }[] = [];
  const subnets = new Map<string, Cidr[]>();
  for (const [name, list] of Object.entries(interfaces)) {
    for (const a of list ?? []) {
      if (a.family !== 'IPv4') continue;
      const n = parseIPv4(a.address);
      if (n !== undefined) v4.push({ name, n });
      const c = a.cidr ? parseCidr(a.cidr, true) : undefined;
      if (c && c.prefix < 32) subnets.set(name, [...(subnets.get(name) ?? []), c]);
    }
  }
  return { v4, subnets };
}

/** Addresses of the VM, `exclude` (a service's own macvlan) left out. */
export function localAddresses(parent: string, exclude: string, host: ParsedRead = currentHost()): LocalAddresses {
  const { v4, subnets } = host;
  const local: number[] = [];
  for (const a of v4) if (a.name !== exclude) local.push(a.n);
  return { subnets: subnets.get(parent) ?? [], local };
}
