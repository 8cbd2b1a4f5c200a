// The daemon's VRRP with both families: RFC 5798 §5.1 runs one instance per
// family - an IPv4 advert never lists an IPv6 address - so each family has a
// VrrpGate of its own (gate.ts: IPv4 adverts from the primary address to
// 224.0.0.18, IPv6 ones from the link-local address to ff02::12), and this
// puts them behind the one face the daemon uses (daemon/subsystems.ts
// FailoverLike). A family service ("ns/name" or "ns/name@IPv6",
// config/types.ts) goes to the gate of its family; the two elect
// independently, so each family's VIP can be Master on another VM.
import { EventEmitter } from 'node:events';
import type { Family } from '../address';
import type { ServiceSpec } from '../config/types';
import type { Logger } from '../log';
import type { GateStatus, VrrpGate } from './gate';

/**
 * The events a gate emits that the daemon listens for: 'change', 'hand-back',
 * 'reannounce' (service keys), 'priority' (gate.ts PriorityEvent). Every
 * wrapper of gates (this one, networks.ts) forwards exactly these.
 */
export const GATE_EVENTS = ['change', 'hand-back', 'reannounce', 'priority'] as const;

export interface DualGateOptions {
  readonly ipv4: VrrpGate;
  /** Absent when the VRRP interface has no IPv6 link-local address: IPv6 services are then not served (logged once per update). */
  readonly ipv6: VrrpGate | undefined;
  readonly log: Logger;
}

export class DualGate extends EventEmitter {
  private readonly gates: Readonly<Record<Family, VrrpGate | undefined>>;
  private readonly log: Logger;
  private familyOf = new Map<string, Family>();

  constructor(opts: DualGateOptions) {
    super();
    this.gates = { IPv4: opts.ipv4, IPv6: opts.ipv6 };
    this.log = opts.log.child({ module: 'failover' });
    for (const g of [opts.ipv4, opts.ipv6]) {
      for (const ev of GATE_EVENTS) g?.on(ev, (arg: unknown) => this.emit(ev, arg));
    }
  }

  /** Each family's services to its own gate. */
  update(services: readonly ServiceSpec[], vips: (serviceKey: string) => string | undefined): void {
    this.familyOf = new Map(services.map((s) => [s.key, s.family ?? 'IPv4']));
    for (const family of ['IPv4', 'IPv6'] as const) {
      const mine = services.filter((s) => (s.family ?? 'IPv4') === family);
      const gate = this.gates[family];
      if (gate) gate.update(mine, vips);
      else if (mine.length > 0) {
        this.log.error({ op: 'assign', family, services: mine.map((s) => s.key) }, 'the VRRP interface has no IPv6 link-local address to send IPv6 adverts from (RFC 5798 §5.1.2.1); these IPv6 VIPs are not served');
      }
    }
  }

  isMaster(serviceKey: string): boolean {
    return this.gateOf(serviceKey)?.isMaster(serviceKey) ?? false;
  }

  status(serviceKey: string): (GateStatus & Record<string, unknown>) | undefined {
    return this.gateOf(serviceKey)?.status(serviceKey);
  }

  knownVip(serviceKey: string): string | undefined {
    return this.gateOf(serviceKey)?.knownVip(serviceKey);
  }

  /**
   * Where the kernel path (forward/nft.ts "Hand-back") hands a backend's
   * answers back after a takeover: the previous Master as the gate of the
   * service's family knows it - its IPv4 address, or for an IPv6 VIP the
   * link-local address of its IPv6 adverts.
   */
  handBack(serviceKey: string): string | undefined {
    return this.gateOf(serviceKey)?.handBack(serviceKey);
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
