// What the daemon needs from the modules it wires together, as narrow
// interfaces: the reconciler talks to these, wiring.ts builds the real ones.
import type { EventEmitter } from 'node:events';
import type { AddressSource } from '../source';
import type { BackendSpec, ServiceSpec } from '../config/types';
import type { ForwardService } from '../forward/dataplane';

export interface ParentLink {
  readonly name: string;
  readonly index: number;
  readonly mac: string;
  /** The node's primary IPv4 address on the parent (VRRP source, status). */
  readonly address: string | undefined;
}

export interface BackendHealth {
  readonly address: string;
  readonly port: number;
  readonly state: string;
  readonly since: number | undefined;
  readonly reason: string | undefined;
  readonly takenOutBy: string | undefined;
  /** The last failure, with what the probe saw ("certificate has expired", "HTTP 503, expected 200-399"). */
  readonly lastFailure?: { readonly detail: string | undefined } | undefined;
}

export interface HealthLike extends EventEmitter {
  /** Starting verdicts from an earlier run (crash-only start); before update(). */
  seed?(states: Iterable<readonly [serviceKey: string, address: string, state: 'up' | 'down']>): void;
  update(services: readonly ServiceSpec[]): void;
  start(): void;
  stop(): void | Promise<void>;
  /** The service's backends that may receive traffic (the checker keeps the array until one of them changes state: a scrape's readiness reads its length for every service). */
  healthy(serviceKey: string): readonly BackendSpec[];
  status(serviceKey: string): readonly BackendHealth[];
  reportConnectFailure?(serviceKey: string, address: string): void;
  reportConnectSuccess?(serviceKey: string, address: string): void;
  // 'change' (serviceKey, address, up)
}

export type { ForwardService };

export interface DataplaneLike {
  readonly kind: 'kernel' | 'proxy';
  readonly reason: string;
  apply(services: readonly ForwardService[]): Promise<void>;
  /** New proxy: settings (the userspace path; the kernel path has none). */
  reconfigure?(proxy: import('../config/types').ProxyConfig): void;
  /** `keep`: leave forwarding in place for the next process (a planned restart). */
  stop(opts?: { keep?: boolean }): Promise<void>;
  /** A VIP came onto this node, serving these ports: the kernel path forgets its untranslated conntrack entries (forward/dataplane.ts). Never throws. */
  vipArrived?(vip: string, ports: readonly import('../config/types').PortSpec[]): Promise<void>;
  /** Can this node do direct server return? Probed once, when first asked. */
  dsr?(): Promise<import('../forward/dataplane').ProbeResult>;
  /** What forwards DSR frames now - the BPF program or the nft table alone, and why (undefined: no DSR port forwarded); for `lb-agent status`. */
  dsrEngine?(): import('../forward/nft').DsrEngineState | undefined;
  /** What forwards the snat flows now - the eBPF NAT engine or the nft table, and why (undefined: the engine is not configured); for `lb-agent status`. */
  natEngine?(): import('../forward/ebpf-nat').NatEngineState | undefined;
  /** While the reads of the forwarding stats for /metrics keep failing: what and since when (forward/metrics.ts readProblem); for `lb-agent status`. */
  statsProblem?(): string | undefined;
  /** The kernel path's placement of new SNAT connections (forward/nft.ts Placement); for `lb-agent status`. */
  readonly placement?: import('../forward/dataplane').Placement;
}

export interface BackendRoleLike {
  /** Put exactly these VIPs on lo (adopting ours already there) with the ARP sysctls. */
  apply(vips: readonly string[]): Promise<void>;
  /** Take our VIPs off lo. */
  withdraw(): Promise<void>;
  status(): import('../net/host/dsr-backend').BackendStatus;
}

export interface FailoverLike extends EventEmitter {
  /** Recompute virtual routers for this set of primary services. */
  update(services: readonly ServiceSpec[], vips: (serviceKey: string) => string | undefined): void;
  /** Does this node hold the VIP of this (primary) service now? */
  isMaster(serviceKey: string): boolean;
  status(serviceKey: string): Record<string, unknown> | undefined;
  /** The address the service's VIP has or is about to have, if known (to arm the data path before it comes up). */
  knownVip?(serviceKey: string): string | undefined;
  /** After this node took the service's VIP over: the previous Master's address, for a few seconds (forward/nft.ts "Hand-back"). */
  handBack?(serviceKey: string): string | undefined;
  stop(): Promise<void>;
  /** A VRRP interface's own address changed: that network's adverts (default: the default network's) are sent from it from now on. */
  setSourceAddress?(address: string, network?: string): void;
  // 'change' (serviceKey[]) when mastership changes; 'hand-back' (serviceKey[]) when a hand-back ends;
  // 'heard' (serviceKey[]) when another router's advert changes its sender, priority or addresses (status shows them)
}

/** What the drift guard needs from the daemon: the held VIPs, the sources' repairs, and where to report. */
export type KernelWatchHooks = Pick<import('./drift').DriftGuardOptions, 'held' | 'repairSource' | 'onRepair' | 'onParentAddress' | 'onNetworkAddress' | 'resyncMs'> & {
  /** The services of the configuration in force (read at every check): what they account for is not a leftover. */
  readonly configured: () => readonly ServiceSpec[];
};

/** What the daemon hands buildSubsystems. */
export interface SubsystemContext {
  readonly log: import('../log').Logger;
  readonly registry: import('prom-client').Registry;
  readonly store: import('../state/store').StateStore;
  readonly clock: import('../clock').Clock;
  /** Listening sockets that outlive the process (the proxy keeps its listeners there). */
  readonly listenerStore?: import('../forward/dataplane').ListenerStore | undefined;
}

export interface Subsystems {
  /** The default network's NIC (node.interface, or the default route's). */
  readonly parent: ParentLink;
  /** The NIC of a service's network (config/networks.ts); absent: every service is on `parent`. */
  parentOf?(spec: Pick<ServiceSpec, 'network'>): ParentLink;
  /** Every network with its NIC, the default first; absent: the default only. */
  readonly networks?: readonly { readonly name: string; readonly parent: ParentLink }[];
  /** The address source of a service, with the timings and guard of `now`, the config in force (a reload's for the services it adds). */
  createSource(spec: ServiceSpec, now: import('../config/types').Desired): AddressSource;
  /**
   * Watch the kernel for changes to what the agent put there and repair them
   * (daemon/drift.ts); the daemon starts and stops it. Absent: no watch.
   */
  watchKernel?(hooks: KernelWatchHooks): import('./drift').DriftGuard;
  /**
   * Crash-only start: the VIPs an earlier run left serving that the
   * persisted state still explains (a DHCP service's unexpired saved lease
   * whose address is on its macvlan; a pool claim whose address is on the
   * parent), by service key. Read-only; empty under VRRP, where this node
   * starts as Backup.
   */
  observeHeld(services: readonly ServiceSpec[]): Promise<Map<string, string>>;
  /** Remove links/addresses owned by the agent that these services do not want (start-up adoption). */
  adoptOwned(services: readonly ServiceSpec[]): Promise<{ adopted: string[]; removed: string[] }>;
  readonly health: HealthLike;
  readonly dataplane: DataplaneLike;
  /** The backend side of direct server return: `backend.vips` on lo (net/dsr-backend.ts). */
  readonly backend: BackendRoleLike;
  readonly failover: FailoverLike | undefined;
  /** A reload was accepted: shared settings that apply without a restart (pools, the DHCP start limiter) take effect. */
  reconfigure(config: import('../config/types').Desired): void;
  /** A reload's tracks (every network's failover.track) to the running routers; nothing without VRRP. Never rejects. */
  retrack?(config: import('../config/types').Desired): Promise<void>;
  /** What the rtnetlink client has sent so far (a stop logs what it sent). */
  netlinkCounts?(): import('../net/netlink/netlink').NetlinkCounts;
  close(): Promise<void>;
}
