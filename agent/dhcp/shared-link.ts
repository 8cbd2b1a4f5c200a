// The one macvlan a dual-stack DHCP service's two sources share
// (dhcp/driver.ts owns it, dhcp/driver6.ts rides it): the owner's link
// events, told to the rider directly instead of the rider polling netlink.
//
// Before the owner brings the link up it asks the rider for what must be on
// it by then (the IPv6 VIP a VRRP takeover serves at once): the link's
// first frames move the service MAC to this VM, and from that frame on a
// client of the IPv6 VIP reaches this VM, which must already hold the
// address. After it is up the owner says so, and the rider goes on (its
// DHCPv6 socket, its confirmation with a server, its advertisements).
import { EventEmitter } from 'node:events';

/** How long the owner waits for the rider's addresses before bringing the link up without them. */
export const BEFORE_UP_WAIT_MS = 250;

export type BeforeUp = (index: number) => Promise<void>;

export class SharedLink extends EventEmitter {
  private beforeUpHook: BeforeUp | undefined;

  /** The rider's work before the link goes up; undefined clears it. */
  setBeforeUp(hook: BeforeUp | undefined): void {
    this.beforeUpHook = hook;
  }

  /**
   * The owner, just before it sets the link up: the rider's work, bounded by
   * `waitMs` and never failing the owner (without it the rider adds its
   * address after the link is up, as on a cold start). Resolves whether the
   * rider finished in time.
   */
  async beforeUp(index: number, opts: { waitMs?: number; setTimeout?: (fn: () => void, ms: number) => unknown } = {}): Promise<boolean> {
    const hook = this.beforeUpHook;
    if (!hook) return false;
    const wait = opts.waitMs ?? BEFORE_UP_WAIT_MS;
    const later = opts.setTimeout ?? ((fn: () => void, ms: number) => setTimeout(fn, ms).unref());
    return await Promise.race([
      hook(index).then(() => true, () => false),
      new Promise<boolean>((r) => { later(() => r(false), wait); }),
    ]);
  }

  /** The owner: the link is up (set up now, or adopted up). */
  up(index: number): void {
    this.emit('up', index);
  }

  /** The owner failed to set the link up: what the rider put on it goes. */
  failed(index: number | undefined): void {
    this.emit('failed', index);
  }
}

/** One SharedLink per service macvlan (config/families.ts linkKeyOf), for the daemon's wiring. */
export class SharedLinks {
  private readonly links = new Map<string, SharedLink>();

  of(linkKey: string): SharedLink {
    let l = this.links.get(linkKey);
    if (!l) {
      l = new SharedLink();
      this.links.set(linkKey, l);
    }
    return l;
  }
}
