// What the daemon reports: the status document's shape (the one definition
// `lb-agent status --json` prints; fields are added, never renamed or
// removed), each service's state, reason and readiness as a pure function
// of what was observed, and the bounded label of the interruption metric.
import type { ConfigError } from '../config/load';
import type { ServiceSpec } from '../config/types';
import type { Family } from '../address';
import { DEFAULT_NETWORK } from '../config/networks';
import type { Placement } from '../forward/dataplane';
import type { TopologySelection } from '../forward/topology';
import type { BackendStatus } from '../net/host/dsr-backend';
import type { LostCause, SourceStatus } from '../source';
import type { DriftStatus } from './drift';
import type { StatusEvent } from './events';
import type { ReloadSummary } from './reconciler';
import type { DataplaneLike } from './subsystems';

export interface ReloadResult {
  ok: boolean;
  message: string;
  /** Why the file was refused (empty when applied). */
  errors: readonly ConfigError[];
  summary?: ReloadSummary;
}

export interface ServiceStatus {
  key: string; name: string; namespace: string; ipam: string; primaryService: string | undefined;
  vip: string | undefined; interface: string | undefined; mac: string | undefined;
  /** The network the VIP lives on (config/networks.ts; "default": node.interface). */
  network?: string;
  /** backup, serving, repairing, or the address source's state (acquiring, pending, failed, ...); starting before the first reconcile. */
  state: string; reason: string | undefined; ready: boolean; startedAt: number;
  /** The VIP was adopted from an earlier run at start (crash-only start). */
  adopted: boolean;
  /** Times the VIP was withdrawn while the service stayed configured, and the last time and reason. */
  interruptions: number;
  lastInterruption: { at: string; reason: string } | undefined;
  ports: string[]; source: Record<string, unknown> | undefined; failover: Record<string, unknown> | undefined;
  healthyBackends: number;
  backends: readonly { address: string; port: number; state: string; since: number | undefined; reason: string | undefined; takenOutBy: string | undefined; lastFailure?: { detail: string | undefined } | undefined }[];
  /** snat, or preserve (direct server return). */
  sourceIP?: string;
  /** The VIP's family (a dual-stack service is one entry per family: `namespace/name`, `namespace/name@IPv6`). */
  family?: Family;
  /** Why a family the service asked for (PreferDualStack) is not served. */
  familyNotes?: readonly string[];
  /** The backend set in use under the service's topology policy, and why. */
  topology?: { policy: string; zone: string | undefined; set: string; reason: string; detail: string; inUse: string[] };
}

export interface StatusDocument {
  version: string; pid: number;
  node: {
    name: string; interface: string | undefined; address: string | undefined; priority: number;
    /** topology.kubernetes.io/zone and /region of this node, where the zone came from, and why the labels file did not give it. */
    zone?: string | undefined; region?: string | undefined; zoneFrom?: string; labelsProblem?: string | undefined;
  };
  config: { path: string; loadedAt: string; generation: number; lastReload: { at: number; ok: boolean; message: string } | undefined };
  dataplane: {
    kind: string; reason: string;
    /** Kernel path: how new SNAT connections are placed (round-robin, or flow-hash with VRRP). */
    placement?: Placement;
    /** What forwards direct server return now, while a DSR port is forwarded. */
    dsr?: { engine: 'bpf' | 'nft'; cause: string; reason: string };
    /** What forwards the kernel path's snat flows, where the eBPF NAT engine is configured. */
    natEngine?: { engine: 'ebpf' | 'nft'; reason: string };
    /** While the forwarding stats for /metrics cannot be read: how often, since when, why, and how old the values served are. */
    statsProblem?: string;
  } | undefined;
  failover: { mode: string };
  /** Every network of the VM and its NIC, the default first. */
  networks?: { name: string; interface: string; address: string | undefined }[];
  ready: boolean;
  services: ServiceStatus[];
  /** The backend side of direct server return (`backend.vips` on lo, ARP sysctls). */
  backend?: BackendStatus | undefined;
  /** The last events (at most EVENT_HISTORY), oldest first. */
  events: StatusEvent[];
  /** What others changed in the kernel and the agent put back; fights it backs off from. */
  drift?: DriftStatus | undefined;
}

/** What a started service's verdict is decided from. */
export interface VerdictInput {
  readonly spec: ServiceSpec;
  /** This node holds the VIP (always, without VRRP). */
  readonly holds: boolean;
  /** VRRP's view of the service (status of its virtual router), if any. */
  readonly failover: Record<string, unknown> | undefined;
  /** The VIP served, if any. */
  readonly vip: string | undefined;
  /** The address source's status (the primary's, for a Share IP service). */
  readonly src: SourceStatus | undefined;
  readonly healthyCount: number;
  readonly topology: TopologySelection;
  /** The table (or the proxy) last applied forwards this service to a healthy backend. */
  readonly applied: boolean;
  /** What the kernel lost of this VIP and is not yet put back (the drift guard), if anything. */
  readonly damage: string | undefined;
}

export interface Verdict { readonly state: string; readonly reason: string | undefined; readonly ready: boolean }

/**
 * A started service's state, reason and readiness. Pure. A VIP is serving
 * only while the kernel holds it: address, link and rules; ready only while
 * connections to it reach a healthy backend.
 */
export function serviceVerdict(i: VerdictInput): Verdict {
  if (!i.holds) {
    const f = i.failover;
    return {
      state: 'backup', ready: true,
      reason: f?.handoverUntil !== undefined
        ? `VRRP Master by preemption: taking the VIP once the previous Master has withdrawn it (by ${String(f.handoverUntil)})`
        : f?.state === 'fault'
          ? `VRRP fault, out of the election: ${Array.isArray(f.priorityReasons) ? f.priorityReasons.join('; ') : 'a tracked interface or service failed'}`
          : `VIP held by the VRRP Master${f?.master ? ` ${String(f.master)}` : ''}`,
    };
  }
  if (!i.vip) {
    return { state: i.src?.state ?? 'pending', ready: false, reason: i.src?.reason ?? (i.spec.primaryService ? `waiting for the VIP of ${i.spec.primaryService}` : 'no VIP yet') };
  }
  if (i.damage !== undefined) return { state: 'repairing', reason: i.damage, ready: false };
  const serving = (reason: string | undefined): Verdict => ({ state: 'serving', reason, ready: reason === undefined });
  if (i.spec.backends.length === 0) return serving('no backends configured');
  if (i.healthyCount === 0) return serving('no healthy backend: new connections are refused');
  if (i.topology.set === 'none') return serving(i.topology.detail);
  if (!i.applied) return serving('forwarding to the healthy backends is being put in place');
  return serving(undefined);
}

/**
 * What readiness alone is read from: serviceVerdict's inputs, each read
 * only when the verdict gets that far (a reader, not a record: a scrape
 * asks it of every service, and the inputs further down cost the most).
 */
export interface ReadyReader {
  holds(): boolean;
  hasVip(): boolean;
  damaged(): boolean;
  backends(): number;
  healthyCount(): number;
  /** The topology policy leaves no backend to send new connections to (asked only with a healthy backend). */
  topologyNone(): boolean;
  applied(): boolean;
}

/**
 * serviceVerdict(...).ready without the state and reason it builds: the
 * same checks in the same order (test/daemon/status.test.ts holds the two
 * together over every combination). Pure.
 */
export function serviceReady(r: ReadyReader): boolean {
  if (!r.holds()) return true;
  if (!r.hasVip() || r.damaged()) return false;
  if (r.backends() === 0 || r.healthyCount() === 0) return false;
  if (r.topologyNone()) return false;
  return r.applied();
}

/** A service's ports as status shows them: 80/TCP->8080. */
export function portsText(spec: ServiceSpec): string[] {
  return spec.ports.map((p) => `${p.port}/${p.protocol}->${p.targetPort}`);
}

/** status' dataplane.statsProblem: while the forwarding stats for /metrics keep failing. */
export function statsProblemOf(dp: DataplaneLike): { statsProblem?: string } {
  const p = dp.statsProblem?.();
  return p === undefined ? {} : { statsProblem: p };
}

/** status' dataplane.natEngine: what forwards the snat flows, where the eBPF NAT engine is configured. */
export function natEngineOf(dp: DataplaneLike): { natEngine?: { engine: 'ebpf' | 'nft'; reason: string } } {
  const e = dp.natEngine?.();
  return e ? { natEngine: { engine: e.engine, reason: e.reason } } : {};
}

/** status' dataplane.dsr: the engine serving direct server return, when a DSR port is forwarded. */
export function dsrEngineOf(dp: DataplaneLike): { dsr?: { engine: 'bpf' | 'nft'; cause: string; reason: string } } {
  const e = dp.dsrEngine?.();
  return e ? { dsr: { engine: e.engine, cause: e.cause, reason: e.reason } } : {};
}

/** The family fields of a service's status. */
export function familyStatus(spec: ServiceSpec): Pick<ServiceStatus, 'family' | 'familyNotes'> {
  return { family: spec.family ?? 'IPv4', ...(spec.familyNotes ? { familyNotes: spec.familyNotes } : {}) };
}

/** A configured service before the first reconcile: "starting", nothing claimed yet. */
export function startingStatus(spec: ServiceSpec, reason: string, startedAt: number): ServiceStatus {
  return {
    key: spec.key, name: spec.name, namespace: spec.namespace, ipam: spec.ipam, primaryService: spec.primaryService,
    vip: undefined, interface: undefined, mac: undefined, network: spec.network ?? DEFAULT_NETWORK, state: 'starting', reason, ready: false, startedAt,
    adopted: false, interruptions: 0, lastInterruption: undefined,
    ports: portsText(spec),
    source: undefined, failover: undefined, healthyBackends: 0, backends: [],
    ...familyStatus(spec),
  };
}

/** The reason label values of lbagent_service_vip_interruptions_total. */
export const INTERRUPTION_KINDS = ['nak', 'lease-expired', 'address-changed', 'conflict', 'other'] as const;

/** The label of lbagent_service_vip_interruptions_total for why a source gave its VIP up. */
export function interruptionKind(cause: LostCause): (typeof INTERRUPTION_KINDS)[number] {
  return (INTERRUPTION_KINDS as readonly string[]).includes(cause) ? cause as (typeof INTERRUPTION_KINDS)[number] : 'other';
}
