// net/ layer: the backend side of direct server return, for an
// lb-agent that runs on a backend VM (`backend: { vips: [...] }`). With DSR
// the load balancer hands the client's frame to the backend unchanged -
// destination still the VIP - so the backend must accept packets for the VIP
// without ever claiming it on the LAN:
//   - the VIP as a /32 on lo (a non-ARPing interface), carrying the agent's
//     ownership mark (IFA_PROTO 76, ownership.ts) so a restart adopts it and
//     `lb-agent withdraw` finds it;
//   - net.ipv4.conf.all.arp_ignore=1: answer ARP only for addresses on the
//     interface the request came in on, so the VM never answers "VIP is at
//     my MAC" from its NIC (which would steal the VIP from the balancer);
//   - net.ipv4.conf.all.arp_announce=2: never use the VIP as the source of
//     its own ARP requests, which would poison the LAN's caches the same way.
// `all` because the kernel takes max(all, <if>) of both (ip-sysctl.rst), so
// every NIC of the VM is covered, including ones added later. The values are
// only ever raised, never lowered, and left in place on withdraw (other
// VIPs set up by hand may rely on them).
// An IPv6 VIP goes on lo as a /128 and needs no sysctl: IPv6 has no ARP
// flux. The kernel answers a neighbour solicitation only for an address on
// the interface it came in on (ndisc_recv_ns looks the target up strictly
// on that device, then in the proxy table, which stays empty while
// net.ipv6.conf.*.proxy_ndp is 0, the default), and its own solicitations
// take their source from the outgoing interface's addresses. No DAD runs on
// lo. So `ip -6 addr add VIP/128 dev lo` is the whole backend set-up.
// planBackendVips is pure; BackendVips is the driver.
import type { Logger } from '../../log';
import { familyBits, familyOf } from '../../address';
import { errorMessage } from '../../errors';
import { OWNED_ADDRESS_PROTO } from '../ownership/ownership';
import { readIfSysctl, writeIfSysctl, type IfSysctlKey, type SysctlOptions } from '../sysctl/sysctl';
import type { AddressInfo, NetlinkClient } from '../netlink/netlink';
import { addressesChanged } from './local-addresses';

/** Where a backend keeps the VIPs it serves: loopback never answers ARP on the LAN. */
export const BACKEND_VIP_INTERFACE = 'lo';

/** The prefix a VIP takes on lo: the whole address (/32, /128). */
export function backendVipPrefix(vip: string): number {
  return familyBits(familyOf(vip) ?? 'IPv4');
}

/** The minimum values of net.ipv4.conf.all.* a DSR backend with an IPv4 VIP needs (one home: the driver sets them, `lb-agent check` judges them). */
export const BACKEND_SYSCTLS: ReadonlyArray<readonly [IfSysctlKey, number]> = Object.freeze([['arp_ignore', 1], ['arp_announce', 2]] as const);

export interface BackendVipsPlan {
  /** Wanted and not on lo: add, marked. */
  readonly add: readonly string[];
  /** On lo with our mark, no longer wanted: remove. */
  readonly remove: readonly AddressInfo[];
  /** Wanted and already on lo (adopted as they are; an unmarked one is the operator's and never removed). */
  readonly keep: readonly AddressInfo[];
}

/** Pure: what to do with lo's addresses for this set of VIPs. */
export function planBackendVips(wanted: readonly string[], onLo: readonly AddressInfo[]): BackendVipsPlan {
  const want = new Set(wanted);
  const present = new Map(onLo.filter((a) => a.prefix === backendVipPrefix(a.address)).map((a) => [a.address, a]));
  return {
    add: wanted.filter((v) => !present.has(v)),
    remove: onLo.filter((a) => a.proto === OWNED_ADDRESS_PROTO && !want.has(a.address)),
    keep: [...present.values()].filter((a) => want.has(a.address)),
  };
}

export interface BackendVipStatus {
  readonly address: string;
  readonly interface: string;
  /** on-lo: in place; missing: could not be added (see problem). */
  readonly state: 'on-lo' | 'missing';
  /** Added by the agent (marked); false: it was there already, put by hand. */
  readonly owned: boolean;
}

export interface BackendStatus {
  readonly vips: readonly BackendVipStatus[];
  /** net.ipv4.conf.all.arp_ignore / arp_announce as last read. */
  readonly sysctls: Readonly<Record<string, number | undefined>>;
  readonly problems: readonly string[];
}

export interface BackendVipsOptions {
  readonly netlink: Pick<NetlinkClient, 'getLink' | 'listAddresses' | 'addAddress' | 'removeAddress'>;
  readonly log: Logger;
  readonly sysctl?: SysctlOptions;
}

export class BackendVips {
  private readonly opts: BackendVipsOptions;
  private readonly log: Logger;
  private last: BackendStatus = { vips: [], sysctls: {}, problems: [] };

  constructor(opts: BackendVipsOptions) {
    this.opts = opts;
    this.log = opts.log.child({ module: 'net', op: 'dsr-backend' });
  }

  /**
   * Make lo hold exactly these VIPs (of ours; the operator's are left alone)
   * and, when there are any, the ARP sysctls. Idempotent; a restart with the
   * same VIPs changes nothing (they are adopted).
   */
  async apply(vips: readonly string[]): Promise<void> {
    const nl = this.opts.netlink;
    const lo = await nl.getLink(BACKEND_VIP_INTERFACE);
    const problems: string[] = [];
    const sysctls: Record<string, number | undefined> = {};
    // Sysctls first: a VIP on lo with arp_ignore=0 would be answered for on
    // the LAN in the instant between the two. IPv6 VIPs need none (above).
    if (vips.some((v) => familyOf(v) !== 'IPv6')) {
      for (const [key, min] of BACKEND_SYSCTLS) {
        try {
          const v = await readIfSysctl('all', key, this.opts.sysctl);
          if (v < min) {
            await writeIfSysctl('all', key, min, this.opts.sysctl);
            this.log.info({ sysctl: `net.ipv4.conf.all.${key}`, from: v, to: min }, 'set for direct server return: the VIPs on lo must never be answered for on the LAN');
          }
          sysctls[key] = Math.max(v, min);
        } catch (e) {
          problems.push(`net.ipv4.conf.all.${key}: ${errorMessage(e)}`);
        }
      }
      if (problems.length > 0) {
        // Never put a VIP on lo of a VM that would answer ARP for it.
        this.last = { vips: vips.map((address) => ({ address, interface: BACKEND_VIP_INTERFACE, state: 'missing', owned: false })), sysctls, problems };
        throw new Error(`the backend VIPs were not added: ${problems.join('; ')}`);
      }
    }
    const plan = planBackendVips(vips, await nl.listAddresses(lo.index));
    for (const a of plan.remove) {
      if (await nl.removeAddress(lo.index, a.address, a.prefix).catch((e) => { problems.push(`removing ${a.address}: ${errorMessage(e)}`); return false; })) {
        this.log.info({ vip: a.address }, 'backend VIP removed from lo (no longer configured)');
      }
    }
    const added = new Set<string>();
    for (const v of plan.add) {
      try {
        await nl.addAddress(lo.index, v, backendVipPrefix(v), { proto: OWNED_ADDRESS_PROTO });
        addressesChanged(); // a local address for the DHCP guard (net/local-addresses.ts)
        added.add(v);
        this.log.info({ vip: v }, 'backend VIP added to lo for direct server return');
      } catch (e) {
        problems.push(`adding ${v}/${backendVipPrefix(v)} to lo: ${errorMessage(e)}`);
      }
    }
    const kept = new Map(plan.keep.map((a) => [a.address, a]));
    if (plan.keep.length > 0) this.log.info({ vips: plan.keep.map((a) => a.address) }, 'backend VIPs already on lo: adopted');
    this.last = {
      vips: vips.map((address) => ({
        address, interface: BACKEND_VIP_INTERFACE,
        state: added.has(address) || kept.has(address) ? 'on-lo' : 'missing',
        owned: added.has(address) || kept.get(address)?.proto === OWNED_ADDRESS_PROTO,
      })),
      sysctls, problems,
    };
    for (const p of problems) this.log.warn({ problem: p }, p);
  }

  /** Take our VIPs off lo (a stop); the sysctls stay. */
  async withdraw(): Promise<void> {
    const nl = this.opts.netlink;
    const lo = await nl.getLink(BACKEND_VIP_INTERFACE);
    for (const a of await nl.listAddresses(lo.index)) {
      if (a.proto !== OWNED_ADDRESS_PROTO) continue;
      if (await nl.removeAddress(lo.index, a.address, a.prefix).catch(() => false)) this.log.info({ vip: a.address }, 'backend VIP withdrawn from lo');
    }
    this.last = { ...this.last, vips: this.last.vips.map((v) => (v.owned ? { ...v, state: 'missing' } : v)) };
  }

  status(): BackendStatus {
    return this.last;
  }
}
