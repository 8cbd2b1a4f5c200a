// The VM's own IPv4 addresses, read live (getifaddrs through
// os.networkInterfaces(): one syscall, no netlink round trip), shaped as the
// DHCP guard's HostView. Read when a reply arrives, so addresses added since
// start (other services' VIPs, a renumbered parent) count - but at most once
// per event-loop turn (issue 18: with 50 services and their link-local
// addresses one read costs ~0.8 ms, and 100 replies arrive at start, many in
// the same turn), and each read is parsed once for every service that asks.
// The agent's own address changes drop the read at once.
import * as os from 'node:os';
import { parseCidr, parseIPv4, type Cidr } from '../ipv4';

export interface LocalAddresses {
  /** The parent NIC's subnets (addresses with prefix < 32). */
  readonly subnets: readonly Cidr[];
  /** Every IPv4 address on every interface except `exclude`. */
  readonly local: readonly number[];
}

type Interfaces = ReturnType<typeof os.networkInterfaces>;

let thisTurn: Interfaces | undefined;

/**
 * os.networkInterfaces(), read once per event-loop turn: replies handled in
 * the same turn see the same instant of the host; the next turn reads again.
 */
export function currentInterfaces(read: () => Interfaces = os.networkInterfaces): Interfaces {
  if (thisTurn === undefined) {
    thisTurn = read();
    setImmediate(() => { thisTurn = undefined; });
  }
  return thisTurn;
}

/** The agent changed an address itself: the next currentInterfaces() reads the kernel again. */
export function addressesChanged(): void {
  thisTurn = undefined;
}

/** One read's IPv4 addresses, parsed: by interface, and the parent's subnets by interface. */
interface ParsedRead {
  readonly v4: readonly { readonly name: string; readonly n: number }[];
  readonly subnets: ReadonlyMap<string, readonly Cidr[]>;
}

/**
 * Each read parsed once, however many replies ask within its turn (issue
 * 18: with 50 macvlans, walking every interface's entries and parsing each
 * address for every reply cost about as much as the read itself).
 */
const parsedReads = new WeakMap<Interfaces, ParsedRead>();

function parseRead(interfaces: Interfaces): ParsedRead {
  let parsed = parsedReads.get(interfaces);
  if (parsed !== undefined) return parsed;
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
  parsed = { v4, subnets };
  parsedReads.set(interfaces, parsed);
  return parsed;
}

/** Addresses of the VM, `exclude` (a service's own macvlan) left out. */
export function localAddresses(parent: string, exclude: string, interfaces: Interfaces = currentInterfaces()): LocalAddresses {
  const { v4, subnets } = parseRead(interfaces);
  const local: number[] = [];
  for (const a of v4) if (a.name !== exclude) local.push(a.n);
  return { subnets: subnets.get(parent) ?? [], local };
}
