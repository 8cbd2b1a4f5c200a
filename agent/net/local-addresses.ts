// The VM's own IPv4 addresses, read live (getifaddrs through
// os.networkInterfaces(): one syscall, no netlink round trip), shaped as the
// DHCP guard's HostView. Read when a reply arrives, so addresses added since
// start (other services' VIPs, a renumbered parent) count - but at most once
// per event-loop turn (issue 18: with 50 services and their link-local
// addresses one read costs ~0.8 ms, and 100 replies arrive at start, many in
// the same turn). The agent's own address changes drop the read at once.
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

/** Addresses of the VM, `exclude` (a service's own macvlan) left out. */
export function localAddresses(parent: string, exclude: string, interfaces: Interfaces = currentInterfaces()): LocalAddresses {
  const subnets: Cidr[] = [];
  const local: number[] = [];
  for (const [name, list] of Object.entries(interfaces)) {
    for (const a of list ?? []) {
      if (a.family !== 'IPv4') continue;
      if (name !== exclude) {
        const n = parseIPv4(a.address);
        if (n !== undefined) local.push(n);
      }
      if (name === parent && a.cidr) {
        const c = parseCidr(a.cidr, true);
        if (c && c.prefix < 32) subnets.push(c);
      }
    }
  }
  return { subnets, local };
}
