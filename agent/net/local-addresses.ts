// The VM's own IPv4 addresses, read live (getifaddrs through
// os.networkInterfaces(): one syscall, no netlink round trip), shaped as the
// DHCP guard's HostView. Read when a reply arrives, so addresses added since
// start (other services' VIPs, a renumbered parent) count.
import * as os from 'node:os';
import { parseCidr, parseIPv4, type Cidr } from '../ipv4';

export interface LocalAddresses {
  /** The parent NIC's subnets (addresses with prefix < 32). */
  readonly subnets: readonly Cidr[];
  /** Every IPv4 address on every interface except `exclude`. */
  readonly local: readonly number[];
}

type Interfaces = ReturnType<typeof os.networkInterfaces>;

/** Addresses of the VM, `exclude` (a service's own macvlan) left out. */
export function localAddresses(parent: string, exclude: string, interfaces: Interfaces = os.networkInterfaces()): LocalAddresses {
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
