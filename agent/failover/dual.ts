// The daemon's VRRP with both families: RFC 5798 §5.1 runs one instance per
// family - an IPv4 advert never lists an IPv6 address - so each family has a
// VrrpGate of its own (gate.ts: IPv4 adverts from the primary address to
// 224.0.0.18, IPv6 ones from the link-local address to ff02::12), and this
// puts them behind the one face the daemon uses (daemon/subsystems.ts
// FailoverLike). A family service ("ns/name" or "ns/name@IPv6",
// config/types.ts) goes to the gate of its family; the two elect
// independently, so each family's VIP can be Master on another VM.
//
// Except the IPv6 VIP of a dual-stack DHCP service: its DHCPv6 lease rides
// the macvlan its DHCPv4 source owns, with the same MAC on every VM, and
// one link is either up (Master) or down (Backup) on a VM. Two elections
// for it could put the IPv4 VIP on one VM and the DHCPv6 client of the same
// MAC on another. So that VIP is tied to its IPv4 twin's router: it has no
// IPv6 router, isMaster, status and events are the IPv4 router's, and both
// VIPs move together in the same 'change' event. A tie by priority
// (keepalived's vrrp_sync_group) would still leave the two routers apart
// for up to a Master_Down_Interval whenever one times out before the other.
import { EventEmitter } from 'node:events';
import type { Family } from '../address';
import type { ServiceSpec } from '../config/types';
import type { Logger } from '../log';
import type { GateStatus, VrrpGate } from './gate';
import { tiedToIpv4 } from '../config/families';

/**
 * The events a gate emits that the daemon listens for: 'change', 'hand-back',
 * 'reannounce', 'heard' (service keys: another router's advert changed its
 * sender, priority or addresses), 'priority' (gate.ts PriorityEvent). Every
 * wrapper of gates (this one, networks.ts) forwards exactly these.
 */
export const GATE_EVENTS = ['change', 'hand-back', 'reannounce', 'heard', 'priority'] as const;

export interface DualGateOptions {
  readonly ipv4: VrrpGate;
  /** Absent when the VRRP interface has no IPv6 link-local address: IPv6 services are then not served (logged once per update). */
  readonly ipv6: VrrpGate | undefined;
  readonly log: Logger;
}

/** What status shows of a tie, on both VIPs' failover block. */
export interface TieStatus {
  /** The router that decides for both VIPs. */
  readonly router: 'IPv4';
  /** The two family services, IPv4 first. */
  readonly services: readonly [string, string];
  readonly reason: string;
}

const TIE_REASON = 'both leases ride one macvlan with one MAC: the IPv6 VIP follows the IPv4 router';

export class DualGate extends EventEmitter {
  private readonly gates: Readonly<Record<Family, VrrpGate | undefined>>;
  private readonly log: Logger;
  private familyOf = new Map<string, Family>();
  /** A tied IPv6 VIP's key -> its IPv4 twin's key (tiedToIpv4). */
  private tiedTo = new Map<string, string>();
  /** The IPv4 twin's key -> the tied IPv6 VIP's key. */
  private twinOf = new Map<string, string>();
  private specs = new Map<string, ServiceSpec>();
  private vips: (serviceKey: string) => string | undefined = () => undefined;
  /** A tied IPv6 VIP's address last held here: what a new Master asks for again without a saved lease (gate.ts knownVip). */
  private lastHeld = new Map<string, string>();

  constructor(opts: DualGateOptions) {
    super();
    this.gates = { IPv4: opts.ipv4, IPv6: opts.ipv6 };
    this.log = opts.log.child({ module: 'failover' });
    for (const g of [opts.ipv4, opts.ipv6]) {
      for (const ev of GATE_EVENTS) g?.on(ev, (arg: unknown) => this.emit(ev, this.withTwins(arg)));
      // A peer's MAC learnt or changed moves where a tied IPv6 VIP hands back to (tiedHandBack).
      g?.on('peers-resolved', () => { if (this.tiedTo.size > 0) this.emit('hand-back', [...this.tiedTo.keys()]); });
    }
  }

  /** An event's service keys with the tied IPv6 VIPs of those that have one: both move together. */
  private withTwins(arg: unknown): unknown {
    const expand = (keys: readonly string[]): string[] => keys.flatMap((k) => { const t = this.twinOf.get(k); return t === undefined ? [k] : [k, t]; });
    if (Array.isArray(arg)) return expand(arg as string[]);
    if (arg !== null && typeof arg === 'object' && Array.isArray((arg as { services?: unknown }).services)) {
      return { ...arg, services: expand((arg as { services: string[] }).services) };
    }
    return arg;
  }

  /** Each family's services to its own gate; a tied IPv6 VIP to none (its IPv4 twin's router decides). */
  update(services: readonly ServiceSpec[], vips: (serviceKey: string) => string | undefined): void {
    this.familyOf = new Map(services.map((s) => [s.key, s.family ?? 'IPv4']));
    this.specs = new Map(services.map((s) => [s.key, s]));
    this.vips = vips;
    this.tiedTo = new Map();
    for (const s of services) {
      const twin = tiedToIpv4(s);
      if (twin !== undefined) this.tiedTo.set(s.key, twin);
    }
    this.twinOf = new Map([...this.tiedTo].map(([v6, v4]) => [v4, v6]));
    for (const key of [...this.lastHeld.keys()]) if (!this.tiedTo.has(key)) this.lastHeld.delete(key);
    // The IPv6 peers' MACs name a tied VIP's hand-back target, with or without an IPv6 router here.
    if (this.tiedTo.size > 0) this.gates.IPv6?.resolvePeers();
    for (const family of ['IPv4', 'IPv6'] as const) {
      const mine = services.filter((s) => (s.family ?? 'IPv4') === family && !this.tiedTo.has(s.key));
      const gate = this.gates[family];
      if (gate) gate.update(mine, vips);
      else if (mine.length > 0) {
        this.log.error({ op: 'assign', family, services: mine.map((s) => s.key) }, 'the VRRP interface has no IPv6 link-local address to send IPv6 adverts from (RFC 5798 §5.1.2.1); these IPv6 VIPs are not served');
      }
    }
  }

  isMaster(serviceKey: string): boolean {
    const twin = this.tiedTo.get(serviceKey);
    if (twin !== undefined) return this.gates.IPv4?.isMaster(twin) ?? false;
    return this.gateOf(serviceKey)?.isMaster(serviceKey) ?? false;
  }

  status(serviceKey: string): (GateStatus & Record<string, unknown>) | undefined {
    const twin = this.tiedTo.get(serviceKey);
    const v6 = this.twinOf.get(serviceKey);
    if (twin === undefined && v6 === undefined) return this.gateOf(serviceKey)?.status(serviceKey);
    const v4key = twin ?? serviceKey;
    const s = this.gates.IPv4?.status(v4key);
    if (s === undefined) return undefined;
    const tie: TieStatus = { router: 'IPv4', services: [v4key, v6 ?? serviceKey], reason: TIE_REASON };
    return { ...s, tie };
  }

  /**
   * A tied IPv6 VIP: the one held here, its loadBalancerIPs entry, or the
   * last one held here. An IPv4 advert lists IPv4 addresses only (RFC 5798
   * §5.2.9), so a VM that never held it learns it from no advert: its new
   * Master asks the server, under the same DUID, for the same binding.
   */
  knownVip(serviceKey: string): string | undefined {
    if (this.tiedTo.has(serviceKey)) {
      const held = this.vips(serviceKey);
      if (held !== undefined) {
        this.lastHeld.set(serviceKey, held);
        return held;
      }
      return this.specs.get(serviceKey)?.loadBalancerIP ?? this.lastHeld.get(serviceKey);
    }
    return this.gateOf(serviceKey)?.knownVip(serviceKey);
  }

  /**
   * Where the kernel path (forward/nft.ts "Hand-back") hands a backend's
   * answers back after a takeover: the previous Master as the gate of the
   * service's family knows it - its IPv4 address, or for an IPv6 VIP the
   * link-local address of its IPv6 adverts. A tied IPv6 VIP: tiedHandBack.
   */
  handBack(serviceKey: string): string | undefined {
    const twin = this.tiedTo.get(serviceKey);
    if (twin !== undefined) return this.tiedHandBack(twin);
    return this.gateOf(serviceKey)?.handBack(serviceKey);
  }

  /**
   * A tied IPv6 VIP's hand-back: the ip6 table's copy needs an IPv6 next
   * hop, and its router (the IPv4 twin's) knows the previous Master by its
   * IPv4 address only; adverts leave from the virtual router MAC (RFC 5798
   * §7.3), so no advert ties that address to one of the VM's IPv6 ones.
   * The machine is what both families share: its MAC. The previous Master
   * must be an IPv4 entry of failover.peers, and the copy goes to the
   * IPv6 entry of failover.peers that answers neighbour discovery with the
   * MAC that entry answers ARP with (the first such, in the config's
   * order; global or link-local, the copy leaves the parent NIC either
   * way). So the target is always a configured peer: an advert from any
   * other address was dropped before it could name a Master, and a forged
   * ARP or neighbour answer can move the copy only to another peer or
   * stop it. Without peers of both families, nothing is handed back.
   */
  private tiedHandBack(twin: string): string | undefined {
    const previous = this.gates.IPv4?.handBack(twin);
    if (previous === undefined) return undefined;
    const mac = this.gates.IPv4?.peerMacOf(previous);
    return mac === undefined ? undefined : this.gates.IPv6?.peerWithMac(mac);
  }

  /** An address of the VRRP interface changed: the gate of its family sends from it (the other ignores it). */
  setSourceAddress(address: string): void {
    for (const g of Object.values(this.gates)) g?.setSourceAddress(address);
  }

  async stop(): Promise<void> {
    for (const g of Object.values(this.gates)) if (g) await g.stop();
  }

  private gateOf(serviceKey: string): VrrpGate | undefined {
    return this.gates[this.familyOf.get(serviceKey) ?? 'IPv4'];
  }
}
