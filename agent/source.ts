// The contract between the reconciler and an address source (DHCP lease,
// pool claim): the source acquires a VIP for one service, puts it on the LAN
// (address on an interface, ARP), keeps it, and says when it has or loses it.
// The reconciler only gates (start/stop) and reads status; it never touches
// addresses itself.
import type { EventEmitter } from 'node:events';
import type { ArpConfig, DhcpConfig } from './config/types';

export interface Vip {
  /** Dotted quad. */
  readonly address: string;
  readonly prefix: number;
  /** The interface the address is on (the service's macvlan, or the parent for pool VIPs). */
  readonly ifname: string;
  readonly ifindex: number;
  /** MAC that answers ARP for the VIP. */
  readonly mac: string;
}

export type SourceState =
  | 'idle'        // not started, or stopped
  | 'acquiring'   // DHCP INIT/SELECTING/REQUESTING/INIT-REBOOT, or pool probing
  | 'bound'       // VIP held and on the LAN
  | 'renewing'    // DHCP RENEWING/REBINDING: VIP still held
  | 'pending'     // cannot acquire now (pool exhausted, no offer); reason says why
  | 'failed';     // a fault that needs the operator (parent missing, EPERM)

export interface SourceStatus {
  readonly state: SourceState;
  readonly reason: string | undefined;
  readonly vip: Vip | undefined;
  /** Interface and MAC the source uses (macvlan for DHCP, parent for pool). */
  readonly ifname: string | undefined;
  readonly mac: string | undefined;
  /** Source-specific details for status output: lease times, server, pool, ... */
  readonly details: Record<string, unknown>;
}

/**
 * Why a held VIP was withdrawn: the second argument of 'lost', and the
 * reason label of lbagent_service_vip_interruptions_total. 'stopped' and
 * 'released' are the agent's own doing (a stop, a removal, VRRP Backup).
 */
export type LostCause = 'nak' | 'lease-expired' | 'address-changed' | 'conflict' | 'stopped' | 'released' | 'other';

/** What the kernel no longer holds of a held VIP (daemon/drift-plan.ts finds it). */
export type SourceDamage = 'address' | 'link' | 'link-down';

export interface AddressSource extends EventEmitter {
  /**
   * Begin acquiring (idempotent). `known`: on a VRRP takeover, the address
   * the previous Master advertised for this VIP (a DHCP source without a
   * lease of its own serves it at once while a server confirms it).
   */
  start(opts?: { known?: string }): void;
  /**
   * Withdraw the VIP from the LAN and stop. `release` is true only when the
   * service is removed from the config (DHCPRELEASE, pool claim deleted);
   * shutdown and failover keep the lease/claim for next time. `keep` (a
   * planned restart) leaves the VIP on the LAN, and its macvlan, for the
   * next process to adopt: only this process's sockets and timers go.
   */
  stop(opts: { release: boolean; keep?: boolean }): Promise<void>;
  status(): SourceStatus;
  /**
   * Send gratuitous ARPs for the held VIP again, if one is held. After a VRRP
   * split brain the LAN may have learnt the other Master's MAC for it
   * (keepalived does the same: garp_lower_prio_repeat).
   */
  reannounce?(): void;
  /**
   * New arp: / dhcp: timings from a reload: used from the next exchange,
   * probe or announcement on; the held VIP is not touched.
   */
  reconfigure?(settings: { arp: ArpConfig; dhcp: DhcpConfig }): void;
  /**
   * The kernel lost what this source put there while it holds its VIP
   * (someone deleted the address, the service macvlan, or set it down):
   * put it back as it was - same link name and MAC, same address - and
   * announce the VIP again. Resolves with what was done, undefined when
   * there was nothing to do (not holding a VIP, or already in place).
   * Never rejects: a failure is logged and the next check tries again.
   */
  repair?(damage: SourceDamage): Promise<string | undefined>;
  /**
   * VRRP Backup: withdraw the VIP like stop({ release: false }) but keep what
   * a takeover needs ready (a DHCP service's macvlan, down). Sources without
   * it are simply stopped.
   */
  standby?(): Promise<void>;
  // Events: 'vip' (vip: Vip) when the VIP is up on the LAN; 'lost' (reason: string,
  // cause: LostCause) when it was withdrawn; 'status' () on any status change.
}
