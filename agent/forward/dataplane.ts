// forward/ layer: the contract between the reconciler and a data path. It
// owns the ForwardState type (what should be forwarded right now), the
// Dataplane interface both paths implement (kernel = nftables, proxy =
// userspace), the stats shape they report, and the choice between them for
// `dataplane: auto | kernel | proxy`. No I/O here beyond calling the probe it
// is given.
import type { BackendSpec, DataplaneMode, PortSpec, Protocol, ProxyProtocolVersion, SourceIpMode } from '../config/types';
import { LbError } from '../errors';

export type DataplaneKind = 'kernel' | 'proxy';

/** One service as the data path needs it. */
export interface ForwardService {
  /** "namespace/name". */
  readonly key: string;
  /** The VIP when this node holds it; undefined = forward nothing for this service (not held, or not yet known). */
  readonly vip: string | undefined;
  readonly ports: readonly PortSpec[];
  /** The backends new connections may go to, with their weights (the health checker's verdict). */
  readonly healthy: readonly BackendSpec[];
  /** Every configured backend: counters and draining connections are tracked for all of them. */
  readonly backends: readonly BackendSpec[];
  /** snat (default) or preserve = direct server return (kernel path only). */
  readonly sourceIP?: SourceIpMode | undefined;
  /** The MAC frames for the VIP arrive with: the parent's (pool VIP) or the service macvlan's (DHCP VIP). Needed for preserve. */
  readonly vipMac?: string | undefined;
  /** The NIC of the service's network, where direct server return takes its frames in and sends them on; default: the data path's own (the default network's). */
  readonly device?: string | undefined;
  /** PROXY protocol header before the first byte to a backend (the proxy path only). */
  readonly proxyProtocol?: ProxyProtocolVersion | undefined;
  /**
   * VRRP takeover (the kernel path's SNAT ports): the previous Master's
   * address, for a few seconds after this node took the VIP over. A
   * backend's answer to a connection that node opened, in flight at the
   * takeover, is handed back to it instead of being refused here (nft.ts
   * "Hand-back").
   */
  readonly handBack?: string | undefined;
}

/** The whole desired forwarding state; every apply() hands over all of it. */
export interface ForwardState {
  readonly services: readonly ForwardService[];
}

/** Counters of one (service, port, backend). */
export interface FlowStats {
  /** Service key "namespace/name". */
  readonly service: string;
  /** The port's label: its name, else its number. */
  readonly port: string;
  readonly protocol: Protocol;
  readonly backend: string;
  /** Connections (TCP) or flows (UDP) sent to this backend since the data path started. */
  readonly connections: number;
  /** Open connections (proxy only; the kernel path leaves it undefined). */
  readonly active: number | undefined;
  readonly bytesToBackend: number;
  readonly bytesToClient: number;
  /** Failed connects to this backend (proxy only). */
  readonly connectFailures: number | undefined;
}

export interface UdpFlowsEnded {
  /** Service key "namespace/name". */
  readonly service: string;
  /** The port's label: its name, else its number. */
  readonly port: string;
  readonly ended: number;
}

export interface ServiceForwardStats {
  readonly key: string;
  readonly vip: string | undefined;
  readonly healthy: number;
  readonly backends: number;
  /** True when the healthy set is empty: new connections are refused. */
  readonly noHealthyBackend: boolean;
}

export interface ForwardStats {
  readonly kind: DataplaneKind;
  readonly services: readonly ServiceForwardStats[];
  readonly flows: readonly FlowStats[];
  /** Problems a user should see in `lb-agent status` (a port that could not be bound, a skipped conflict...). */
  readonly problems: readonly string[];
  /** Path-specific facts (nftables start check, conntrack fill, proxy listeners). */
  readonly details: Readonly<Record<string, unknown>>;
  /**
   * UDP flows (kernel path: conntrack entries; proxy: sessions) ended because
   * their backend left the port's healthy set or the config, so that their
   * next datagram is placed again; by service and port, for the ports still
   * configured.
   */
  readonly udpFlowsEnded?: readonly UdpFlowsEnded[];
  /**
   * Kernel path, VRRP: packets handed back to the previous Master (a
   * backend's answer to a connection this node never saw; nft.ts
   * "Hand-back"), by service, since the data path started; a service's
   * count goes with the service.
   */
  readonly handedBack?: readonly { readonly service: string; readonly packets: number }[];
  /** Userspace proxy: clients refused for the agent's own limits, by "op/code" (accept/EMFILE, connect/ENFILE, limit/max-connections). */
  readonly ownLimits?: Readonly<Record<string, number>>;
  /**
   * Kernel path: when the counters behind these values were read (the data
   * path's clock, monotonic ms); values served from an earlier read keep its
   * time. Absent: read just now (the proxy's tallies are in memory).
   */
  readonly readAt?: number;
  /** Kernel path: the counters could not be read for these values, which hold the last read's (readAt). */
  readonly countersFailure?: { readonly step: 'counters'; readonly error: string };
}

export interface Dataplane {
  readonly kind: DataplaneKind;
  /** Make forwarding match `state`. Serialised: concurrent calls run one after the other. */
  apply(state: ForwardState): Promise<void>;
  /**
   * Stop forwarding and remove what this data path installed; with `keep`
   * (a planned restart), leave it serving for the next process: the kernel
   * table stays, and the proxy stops accepting (its listening sockets live on
   * in the ListenerStore) and lets open connections finish.
   */
  stop(opts?: { keep?: boolean }): Promise<void>;
  stats(): Promise<ForwardStats>;
  /**
   * A VIP has just come onto this node under VRRP (the daemon asks only
   * then: without VRRP a VIP is never on another node) and these are the
   * ports its services forward: forget what the kernel recorded of them
   * while the VIP was elsewhere (kernel path: the untranslated conntrack
   * entries of flows this node routed on to the old holder;
   * net/conntrack.ts untranslatedFlows). Never throws.
   */
  vipArrived?(vip: string, ports: readonly { readonly protocol: Protocol; readonly port: number }[]): Promise<void>;
}

/**
 * Where listening sockets outlive the process (systemd's file descriptor
 * store): a planned restart or a crash hands them to the next process, so
 * connections queue in the kernel's backlog instead of being refused.
 */
export interface ListenerStore {
  /** The listening descriptor an earlier process left for this listener id, taken once. */
  take(id: string): number | undefined;
  /** Keep this listening descriptor for the next process. */
  keep(id: string, fd: number): void;
  /** The listener is gone for good (service removed, VIP lost): forget its descriptor. */
  drop(id: string): void;
}

/** Called on every connect the proxy makes to a backend: the passive health path. */
export type ConnectResultCallback = (serviceKey: string, backendAddress: string, ok: boolean) => void;

export interface ProbeResult {
  readonly ok: boolean;
  readonly reason: string;
}

/**
 * How the kernel path's SNAT places a new connection on a backend
 * (forward/nft.ts, "Why `numgen inc`" and "Why a hash with VRRP"):
 * 'round-robin' walks the weighted slot table, 'flow-hash' hashes the
 * client's address and port onto the seeded maglev table direct server
 * return uses.
 */
export type Placement = 'round-robin' | 'flow-hash';

/**
 * With VRRP every peer must place a connection where the others would, so
 * that one moving to a new Master mid-flow reaches the backend it started on;
 * without it, round-robin's exact split. One home for the rule: the daemon
 * renders and probes by it, `lb-agent check` probes and says it.
 */
export function placementFor(failoverMode: string): Placement {
  return failoverMode === 'vrrp' ? 'flow-hash' : 'round-robin';
}

export interface DataplaneSelection {
  readonly kind: DataplaneKind;
  /** Why: logged at start, shown in status and in lbagent_forward_dataplane_info. */
  readonly reason: string;
}

/**
 * The services only the proxy path can serve as configured: those that ask
 * for the PROXY protocol header (nftables never writes into a connection). One home for the rule: validation refuses them with
 * `dataplane: kernel`, `auto` picks the proxy for them, a reload that adds
 * one to a running kernel path is refused, and `lb-agent check` says so.
 */
export function servicesNeedingProxy(services: readonly { readonly key: string; readonly proxyProtocol?: ProxyProtocolVersion | undefined }[]): string[] {
  return services.filter((s) => s.proxyProtocol !== undefined).map((s) => s.key);
}

/** Why `auto` runs the proxy path for these services (undefined when none needs it). */
export function proxyNeededReason(keys: readonly string[]): string | undefined {
  if (keys.length === 0) return undefined;
  const shown = keys.length > 3 ? `${keys.slice(0, 3).join(', ')} and ${keys.length - 3} more` : keys.join(', ');
  return `${shown} ${keys.length === 1 ? 'asks' : 'ask'} for the PROXY protocol, which only the userspace proxy sends`;
}

/**
 * Resolve `dataplane:` from the config. auto takes the kernel path when the
 * nftables probe passes and no service needs the proxy (the PROXY protocol),
 * the proxy otherwise; an explicit `kernel` that the probe rejects is an
 * error at start rather than a failure on first apply.
 */
export async function selectDataplane(mode: DataplaneMode, probe: () => Promise<ProbeResult>, needProxy: readonly string[] = []): Promise<DataplaneSelection> {
  if (mode === 'proxy') return { kind: 'proxy', reason: 'configured: dataplane: proxy' };
  const needed = proxyNeededReason(needProxy);
  if (mode === 'auto' && needed !== undefined) return { kind: 'proxy', reason: `auto: ${needed}` };
  const res = await probe();
  if (mode === 'kernel') {
    if (!res.ok) {
      throw new LbError('LB_ERR_FORWARD_NFT_MISSING',
        `dataplane: kernel needs nftables, which this node cannot use: ${res.reason}. Install nftables (and a kernel with nf_tables, nf_nat), or set dataplane: auto or proxy`,
        { reason: res.reason });
    }
    return { kind: 'kernel', reason: 'configured: dataplane: kernel' };
  }
  if (res.ok) return { kind: 'kernel', reason: 'auto: nftables probe passed' };
  return { kind: 'proxy', reason: `auto: nftables unavailable (${res.reason}); using the userspace proxy` };
}

/**
 * Direct server return needs the kernel path and a kernel that
 * passed probeDsr. A config with `sourceIP: preserve` on a node that cannot
 * do it is refused at start (and at reload) rather than served half: the
 * proxy would hide the clients' addresses the service asked to keep.
 * Returns why not, or undefined when it can.
 */
export function dsrUnavailable(kind: DataplaneKind, dsr: ProbeResult | undefined): string | undefined {
  if (kind !== 'kernel') return 'sourceIP: preserve (direct server return) needs the kernel data path, and this node uses the userspace proxy';
  if (!dsr) return 'direct server return was not probed on this node';
  if (!dsr.ok) return `this kernel cannot do direct server return: ${dsr.reason}`;
  return undefined;
}

/** Split "namespace/name" for metric labels. */
export function serviceLabels(key: string): { service: string; namespace: string } {
  const slash = key.indexOf('/');
  return slash < 0 ? { service: key, namespace: 'default' } : { service: key.slice(slash + 1), namespace: key.slice(0, slash) };
}

/** A port's label: its name when it has one (Kubernetes requires names on multi-port services), else its number. */
export function portLabel(p: PortSpec): string {
  return p.name !== '' ? p.name : String(p.port);
}

/** The identity of one (service, port, backend): counters are kept per flow id. */
export function flowId(service: string, port: PortSpec, backend: string): string {
  return `${service}\u0000${port.protocol}/${port.port}\u0000${backend}`;
}

function cmpAddr(a: BackendSpec, b: BackendSpec): number {
  return a.addressNum - b.addressNum || (a.address < b.address ? -1 : a.address > b.address ? 1 : 0);
}

export interface NormalizedPort {
  readonly spec: PortSpec;
  /** Index in the service's sorted port list: stable names in nft and in logs. */
  readonly index: number;
}

export interface NormalizedService {
  readonly key: string;
  readonly vip: string | undefined;
  /** Ports that this service may forward (conflicting ones removed), sorted by protocol then port. */
  readonly ports: readonly NormalizedPort[];
  /** Healthy backends with a positive weight, sorted by address. */
  readonly healthy: readonly BackendSpec[];
  /** Every backend (configured or healthy), sorted by address, deduplicated. */
  readonly all: readonly BackendSpec[];
  readonly sourceIP: SourceIpMode;
  /** Lower-case MAC of the interface holding the VIP (direct server return). */
  readonly vipMac: string | undefined;
  /** The NIC of the service's network (direct server return), when the state named one. */
  readonly device: string | undefined;
  readonly handBack: string | undefined;
}

/** Whether two values are equal field by field, one level down (an array's elements compared the same way). */
function sameShallow(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && (a as Record<string, unknown>)[k] === (b as Record<string, unknown>)[k]);
}

/**
 * Whether two forwarding states of one service are the same: every field
 * equal, an array's elements (ports, backends) equal field by field. The
 * daemon keeps a service's object while this holds, so the caches keyed by
 * it (normalizeState's, the nft render's parts) see an unchanged service.
 */
export function sameForwardService(a: ForwardService, b: ForwardService): boolean {
  const ka = Object.keys(a) as (keyof ForwardService)[];
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => {
    const x = a[k];
    const y = b[k];
    if (x === y) return true;
    if (!Array.isArray(x) || !Array.isArray(y) || x.length !== y.length) return false;
    return x.every((e, i) => sameShallow(e, y[i]));
  });
}

/**
 * The one canonical order both data paths use, so that the same state always
 * renders the same nft text (the start-up comparison relies on it). Two
 * services claiming the same VIP, protocol and port (config validation
 * forbids it; this is the last line of defence) keep the first by key; the
 * others' port is dropped with a problem message.
 */
export function normalizeState(state: ForwardState): { services: NormalizedService[]; problems: string[] } {
  const problems: string[] = [];
  const claimed = new Map<string, string>();
  const services = [...state.services].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)).map((s) => {
    const own = ownNormal(s);
    const ports: NormalizedPort[] = [];
    for (const p of own.service.ports) {
      if (s.vip !== undefined) {
        const k = `${s.vip}|${p.spec.protocol}|${p.spec.port}`;
        const owner = claimed.get(k);
        if (owner !== undefined && owner !== s.key) {
          problems.push(`${s.key}: ${p.spec.protocol} port ${p.spec.port} on ${s.vip} is already forwarded for ${owner}; not forwarding it`);
          continue;
        }
        claimed.set(k, s.key);
      }
      ports.push(p);
    }
    // Unless another service holds one of its ports, a service keeps the
    // object normalized from it (the nft render's input cache is keyed by it).
    return ports.length === own.service.ports.length ? own.service : { ...own.service, ports };
  });
  return { services, problems };
}

/**
 * normalizeState's result kept for the next one (normalizeStateFrom): the
 * state it was made from, and each service's position by key.
 */
export interface NormalizedState {
  readonly services: readonly NormalizedService[];
  readonly problems: readonly string[];
  /** The state's services as handed over (a copy of the array: the caller may reuse its own). */
  readonly from: readonly ForwardService[];
  /** Each service's position in `services` by key; the same object while the services, their order and their claims stay. */
  readonly index: ReadonlyMap<string, number>;
  /** Positions in `services` whose service object differs from `prev`'s; undefined when worked out whole. */
  readonly changed: readonly number[] | undefined;
}

/** Whether two normalized port lists claim the same protocol and port numbers, in order. */
function sameClaims(a: readonly NormalizedPort[], b: readonly NormalizedPort[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i]!.spec.protocol !== b[i]!.spec.protocol || a[i]!.spec.port !== b[i]!.spec.port) return false;
  return true;
}

/**
 * normalizeState, worked out from `prev` when the state differs from the
 * one `prev` was made from only in services that keep their key, position,
 * VIP and claimed ports (a health verdict, a backend changed by a reload):
 * those services are normalized, the others are `prev`'s objects, and no
 * sort or claim map is built. The result is normalizeState's, object for
 * object. Anything else (a service added, removed, moved or claiming other
 * ports, a conflict in `prev`) is worked out whole.
 */
export function normalizeStateFrom(state: ForwardState, prev?: NormalizedState): NormalizedState {
  const input = state.services;
  if (prev !== undefined && prev.problems.length === 0 && prev.index.size === prev.services.length && prev.from.length === input.length) {
    let services: NormalizedService[] | undefined;
    const changed: number[] = [];
    let same = true;
    for (let i = 0; i < input.length; i++) {
      const s = input[i]!;
      const o = prev.from[i]!;
      if (s === o) continue;
      const at = s.key === o.key && s.vip === o.vip ? prev.index.get(s.key) : undefined;
      const own = at === undefined ? undefined : ownNormal(s).service;
      if (at === undefined || own === undefined || !sameClaims(prev.services[at]!.ports, own.ports)) { same = false; break; }
      services ??= prev.services.slice();
      services[at] = own;
      changed.push(at);
    }
    if (same) return { services: services ?? prev.services, problems: prev.problems, from: input.slice(), index: prev.index, changed };
  }
  const whole = normalizeState(state);
  const index = new Map<string, number>();
  whole.services.forEach((s, i) => index.set(s.key, i));
  // Keys that are not unique (no config gives that) leave index short: the next is worked out whole too.
  return { ...whole, from: input.slice(), index, changed: undefined };
}

/** A service normalized alone (every port kept), by its object: the state handed over again holds the same object for a service that did not change. */
const ownNormals = new WeakMap<ForwardService, { readonly service: NormalizedService }>();

function ownNormal(s: ForwardService): { readonly service: NormalizedService } {
  const kept = ownNormals.get(s);
  if (kept !== undefined) return kept;
  const sorted = [...s.ports].sort((a, b) => (a.protocol < b.protocol ? -1 : a.protocol > b.protocol ? 1 : a.port - b.port));
  const ports: NormalizedPort[] = sorted.map((spec, index) => ({ spec, index }));
  const byAddr = new Map<string, BackendSpec>();
  for (const b of [...s.backends, ...s.healthy]) if (!byAddr.has(b.address)) byAddr.set(b.address, b);
  const all = [...byAddr.values()].sort(cmpAddr);
  const seen = new Set<string>();
  const healthy = s.healthy.filter((b) => b.weight > 0 && !seen.has(b.address) && (seen.add(b.address), true)).sort(cmpAddr);
  const out = { service: { key: s.key, vip: s.vip, ports, healthy, all, sourceIP: s.sourceIP ?? 'snat', vipMac: s.vipMac?.toLowerCase(), device: s.device, handBack: s.handBack } };
  ownNormals.set(s, out);
  return out;
}
