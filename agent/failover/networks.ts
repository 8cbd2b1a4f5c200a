// The virtual routers of a VM on several networks: one gate (failover/gate.ts)
// per network, each on that network's VRRP interface with its own VRIDs and
// peers, behind the one failover interface the daemon talks to. A service
// is asked about on the gate of its network; events of every gate come out
// of this one. Holds no election state of its own.
import { EventEmitter } from 'node:events';
import type { ServiceSpec } from '../config/types';
import type { FailoverLike } from '../daemon/subsystems';
import { DEFAULT_NETWORK } from '../config/networks';
import { GATE_EVENTS } from './dual';

/** One network's gate: what the daemon asks of failover (a VrrpGate). */
export type NetworkGate = FailoverLike;


export class NetworkGates extends EventEmitter implements FailoverLike {
  /** Network name -> its gate; the default network's, when it has VRRP services, under DEFAULT_NETWORK. */
  private readonly gates: ReadonlyMap<string, NetworkGate>;
  private networkOf = new Map<string, string>();

  constructor(gates: ReadonlyMap<string, NetworkGate>) {
    super();
    this.gates = gates;
    for (const g of gates.values()) for (const ev of GATE_EVENTS) g.on(ev, (arg: unknown) => this.emit(ev, arg));
  }

  private gateOf(serviceKey: string): NetworkGate | undefined {
    return this.gates.get(this.networkOf.get(serviceKey) ?? DEFAULT_NETWORK);
  }

  /** Each gate gets the primaries of its own network (none: its routers stop). */
  update(services: readonly ServiceSpec[], vips: (serviceKey: string) => string | undefined): void {
    this.networkOf = new Map(services.map((s) => [s.key, s.network ?? DEFAULT_NETWORK]));
    for (const [name, g] of this.gates) g.update(services.filter((s) => (s.network ?? DEFAULT_NETWORK) === name), vips);
  }

  isMaster(serviceKey: string): boolean { return this.gateOf(serviceKey)?.isMaster(serviceKey) ?? false; }

  status(serviceKey: string): Record<string, unknown> | undefined {
    const s = this.gateOf(serviceKey)?.status(serviceKey);
    return s === undefined ? undefined : { ...s, network: this.networkOf.get(serviceKey) ?? DEFAULT_NETWORK };
  }

  knownVip(serviceKey: string): string | undefined { return this.gateOf(serviceKey)?.knownVip?.(serviceKey); }

  handBack(serviceKey: string): string | undefined { return this.gateOf(serviceKey)?.handBack?.(serviceKey); }

  /** A network's VRRP interface changed its address: that network's gate sends from it (default: the default network's). */
  setSourceAddress(address: string, network = DEFAULT_NETWORK): void { this.gates.get(network)?.setSourceAddress?.(address); }

  async stop(): Promise<void> { await Promise.all([...this.gates.values()].map((g) => g.stop())); }
}
