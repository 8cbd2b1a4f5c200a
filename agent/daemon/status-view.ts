// Status derivation: each service's status, readiness, systemd's STATUS=
// line and the whole status document, as pure functions of what the
// daemon's parts hold; StatusView reads those parts (the runtimes, the
// subsystems, the applied table, the drift guard, the zone) through narrow
// views and hands what it read to the pure functions.
import type { Desired, ServiceSpec } from '../config/types';
import type { NodeTopology } from '../config/labels';
import type { TopologySelection } from '../forward/topology';
import type { Readiness } from '../metrics/server';
import type { SourceStatus } from '../source';
import type { DriftGuard } from './drift';
import type { StatusEvent } from './events';
import type { ServiceRuntime, ServiceRuntimes } from './services';
import type { BackendHealth, Subsystems } from './subsystems';
import { VERSION } from '../version';
import { isoTime } from '../clock';
import { DEFAULT_NETWORK } from '../config/networks';
import { dsrEngineOf, natEngineOf, statsProblemOf, familyStatus, portsText, serviceReady, serviceVerdict, startingStatus, type ReadyReader, type ServiceStatus, type StatusDocument, type Verdict } from './status';

/** A started service's verdict, and what it was decided from. */
export type ServiceState = Verdict & { src: SourceStatus | undefined; failover: Record<string, unknown> | undefined; topology: TopologySelection; healthyCount: number; vip: string | undefined };

/** What a started service's status shows beyond its verdict. */
export interface ServiceDetails {
  readonly spec: ServiceSpec;
  readonly startedAt: number;
  /** The runtime of the service that gives the VIP (the primary's, for Share IP): adoption and interruptions are the VIP's. */
  readonly primary: Pick<ServiceRuntime, 'adopted' | 'interruptions' | 'lastInterruption'> | undefined;
  /** The parent's MAC: a pool VIP answers ARP with it. */
  readonly parentMac: string;
  readonly backends: readonly BackendHealth[];
  readonly zone: string | undefined;
}

/** A started service's status. Pure. */
export function serviceStatusOf(st: ServiceState, d: ServiceDetails): ServiceStatus {
  const { spec } = d;
  const { src, failover, topology, healthyCount, vip, state, reason, ready } = st;
  return {
    key: spec.key, name: spec.name, namespace: spec.namespace, ipam: spec.ipam,
    primaryService: spec.primaryService, vip: vip ?? src?.vip?.address, interface: src?.ifname,
    // A pool VIP answers ARP with the parent's MAC; an adopted one is served before its source has read the parent.
    mac: src?.mac ?? (spec.ipam === 'pool' ? d.parentMac : undefined),
    network: spec.network ?? DEFAULT_NETWORK,
    state, reason, ready, startedAt: d.startedAt,
    adopted: d.primary?.adopted ?? false, interruptions: d.primary?.interruptions ?? 0,
    lastInterruption: d.primary?.lastInterruption,
    ports: portsText(spec),
    source: src ? { state: src.state, reason: src.reason, ...src.details } : undefined,
    failover,
    healthyBackends: healthyCount,
    backends: d.backends,
    sourceIP: spec.sourceIP,
    ...familyStatus(spec),
    topology: { policy: spec.topology, zone: d.zone, set: topology.set, reason: topology.reason, detail: topology.detail, inUse: topology.backends.map((b) => b.address) },
  };
}

/** What readiness reads of a service's status. */
export type ReadyState = Pick<ServiceStatus, 'key' | 'name' | 'namespace' | 'ready' | 'reason' | 'state'>;

/** Ready: the agent runs (started, not stopping) and every service is ready; else each one that is not, and why. Pure. */
export function readinessOf(statuses: readonly ReadyState[], running: boolean): Readiness {
  const notReady = statuses.filter((s) => !s.ready).map((s) => `${s.key}: ${s.reason ?? s.state}`);
  return { ready: notReady.length === 0 && running, notReady };
}

/** Before the first reconcile: every configured service, "starting", nothing claimed yet. Pure. */
export function startingStatuses(services: readonly ServiceSpec[], stopping: boolean, loadedAt: number): ServiceStatus[] {
  const reason = stopping ? 'the agent stopped while starting' : 'the agent is starting: address sources, health checks and forwarding are being set up';
  return services.map((spec) => startingStatus(spec, reason, loadedAt));
}

/**
 * systemd's STATUS= line: the VIPs served and the services by state. Before
 * the first reconcile `states` is undefined and `configured` counts the
 * services. Pure.
 */
export function statusLine(dataplane: string, configured: number, states: Iterable<Pick<ServiceState, 'state' | 'ready' | 'vip' | 'src'>> | undefined): string {
  let services = 0, serving = 0, ready = 0;
  const vips = new Set<string>();
  if (states === undefined) services = configured;
  else {
    for (const st of states) {
      services++;
      if (st.ready) ready++;
      if (st.state !== 'serving') continue;
      serving++;
      const vip = st.vip ?? st.src?.vip?.address;
      if (vip) vips.add(vip);
    }
  }
  return `STATUS=${vips.size} VIP${vips.size === 1 ? '' : 's'} served; ${services} services, ${serving} serving, ${ready} ready; dataplane ${dataplane}`;
}

/** The config in force, and what reloads made of it. */
export interface ConfigState {
  readonly path: string;
  /** Undefined before the start has read the file. */
  readonly desired: Desired | undefined;
  readonly loadedAt: number;
  readonly generation: number;
  readonly lastReload: { at: number; ok: boolean; message: string } | undefined;
}

/** What status reads of the subsystems. */
export type StatusSubsystems = Pick<Subsystems, 'parent' | 'parentOf' | 'networks' | 'health' | 'failover' | 'dataplane' | 'backend'>;

export interface StatusViewOptions {
  config(): ConfigState;
  /** The first reconcile has run (start() finished); until then every service shows "starting". */
  started(): boolean;
  stopping(): boolean;
  subs(): StatusSubsystems | undefined;
  readonly services: Pick<ServiceRuntimes, 'values' | 'get' | 'holds' | 'vipOf'>;
  /** The backends a service may send new connections to now, under its topology policy. */
  topologyOf(spec: ServiceSpec): TopologySelection;
  /** Does the applied table forward this service to a healthy backend (ApplyLoop.serves)? */
  serves(key: string): boolean;
  drift(): Pick<DriftGuard, 'damage' | 'status'> | undefined;
  zone(): NodeTopology;
  /** The parent's address as last observed, once it changed after the start. */
  parentAddress(): string | undefined;
  events(): StatusEvent[];
}

export class StatusView {
  constructor(private readonly opts: StatusViewOptions) {}

  /**
   * Readiness from each service's verdict alone (/readyz, the ready gauge):
   * not serviceStatuses(), which builds every service's whole document.
   */
  readiness(): Readiness {
    return readinessOf(this.readyStates(), !this.opts.stopping() && this.opts.started());
  }

  /** Every configured service's key, name, namespace, readiness and why not: its verdict, without the rest of its status. */
  readyStates(): ReadyState[] {
    const subs = this.opts.subs();
    if (!this.opts.started() || !subs) return this.serviceStatuses();
    return [...this.opts.services.values()].map((rt) => {
      const v = this.serviceState(rt, subs);
      return { key: rt.spec.key, name: rt.spec.name, namespace: rt.spec.namespace, ready: v.ready, reason: v.reason, state: v.state };
    });
  }

  /**
   * Every configured service's readiness, for the ready gauge: each
   * service's verdict read only as far as its readiness needs
   * (status.ts serviceReady), with no object made per service - not
   * readyStates(), whose reasons a scrape never shows.
   */
  eachReady(visit: (name: string, namespace: string, ready: boolean) => void): void {
    const subs = this.opts.subs();
    if (!this.opts.started() || !subs) {
      for (const s of this.serviceStatuses()) visit(s.name, s.namespace, s.ready);
      return;
    }
    const reader = this.readyReader(subs);
    for (const rt of this.opts.services.values()) {
      reader.rt = rt;
      visit(rt.spec.name, rt.spec.namespace, serviceReady(reader));
    }
  }

  /** One reader for a pass over every service, pointed at each in turn. */
  private readyReader(subs: StatusSubsystems): ReadyReader & { rt: ServiceRuntime | undefined } {
    const o = this.opts;
    const primary = (rt: ServiceRuntime): string => rt.spec.primaryService ?? rt.spec.key;
    return {
      rt: undefined,
      holds() { return o.services.holds(primary(this.rt!)); },
      hasVip() { return o.services.vipOf(this.rt!.spec) !== undefined; },
      damaged() { return o.drift()?.damage(primary(this.rt!)) !== undefined; },
      backends() { return this.rt!.spec.backends.length; },
      healthyCount() { return subs.health.healthy(this.rt!.spec.key).length; },
      // Policy any sends to every healthy backend: it leaves none only when
      // none is healthy, which healthyCount() has said (forward/topology.ts).
      topologyNone() { return this.rt!.spec.topology !== 'any' && o.topologyOf(this.rt!.spec).set === 'none'; },
      applied() { return o.serves(this.rt!.spec.key); },
    };
  }

  serviceStatuses(): ServiceStatus[] {
    const subs = this.opts.subs();
    if (!this.opts.started() || !subs) {
      const c = this.opts.config();
      return startingStatuses(c.desired?.services ?? [], this.opts.stopping(), c.loadedAt);
    }
    return [...this.opts.services.values()].map((rt) => {
      const primaryKey = rt.spec.primaryService ?? rt.spec.key;
      return serviceStatusOf(this.serviceState(rt, subs), {
        spec: rt.spec, startedAt: rt.startedAt, primary: this.opts.services.get(primaryKey), parentMac: (subs.parentOf?.(rt.spec) ?? subs.parent).mac,
        backends: subs.health.status(rt.spec.key), zone: this.opts.zone().zone,
      });
    });
  }

  /** A started service's verdict (status.ts serviceVerdict), and what it was decided from: serviceStatuses and statusLine. */
  private serviceState(rt: ServiceRuntime, subs: StatusSubsystems): ServiceState {
    const spec = rt.spec;
    const primaryKey = spec.primaryService ?? spec.key;
    const src = this.opts.services.get(primaryKey)?.source?.status();
    const topology = this.opts.topologyOf(spec);
    const failover = subs.failover?.status(primaryKey);
    const vip = this.opts.services.vipOf(spec);
    const healthyCount = subs.health.healthy(spec.key).length;
    const verdict = serviceVerdict({
      spec, holds: this.opts.services.holds(primaryKey), failover, vip, src, healthyCount, topology,
      applied: this.opts.serves(spec.key), damage: this.opts.drift()?.damage(primaryKey),
    });
    return { ...verdict, src, failover, topology, healthyCount, vip };
  }

  /**
   * systemd's STATUS= line, or undefined before the subsystems are built.
   * The counts only: not serviceStatuses(), which builds every service's
   * whole document (its source's details, its backends) for each line.
   */
  statusLine(): string | undefined {
    const subs = this.opts.subs();
    if (!subs) return undefined;
    const services = this.opts.services;
    const states = this.opts.started() ? [...services.values()].map((rt) => this.serviceState(rt, subs)) : undefined;
    return statusLine(subs.dataplane.kind, this.opts.config().desired?.services.length ?? 0, states);
  }

  statusDocument(): StatusDocument {
    const cs = this.opts.config();
    const c = cs.desired!;
    const subs = this.opts.subs();
    const zone = this.opts.zone();
    const services = this.serviceStatuses();
    return {
      version: VERSION,
      pid: process.pid,
      node: {
        name: c.node.name, interface: subs?.parent.name, address: this.opts.parentAddress() ?? subs?.parent.address, priority: c.node.priority,
        zone: zone.zone, region: zone.region, zoneFrom: zone.zoneFrom, labelsProblem: zone.problem,
      },
      config: { path: cs.path, loadedAt: isoTime(cs.loadedAt), generation: cs.generation, lastReload: cs.lastReload },
      dataplane: subs ? {
        kind: subs.dataplane.kind, reason: subs.dataplane.reason,
        ...(subs.dataplane.placement ? { placement: subs.dataplane.placement } : {}),
        ...dsrEngineOf(subs.dataplane),
        ...natEngineOf(subs.dataplane),
        ...statsProblemOf(subs.dataplane),
      } : undefined,
      failover: { mode: c.failover.mode },
      ...(subs?.networks ? { networks: subs.networks.map((n) => ({ name: n.name, interface: n.parent.name, address: n.parent.address })) } : {}),
      // Every service's status built once, readiness read from it.
      ready: readinessOf(services, !this.opts.stopping() && this.opts.started()).ready,
      services,
      backend: subs?.backend.status(),
      events: this.opts.events(),
      drift: this.opts.drift()?.status(),
    };
  }
}

/** Runs `fn` once after `ms`, without keeping the process alive. */
export type Later = (ms: number, fn: () => void) => void;

const realLater: Later = (ms, fn) => { setTimeout(fn, ms).unref(); };

/**
 * The status document serialised once and served to every request until it
 * changes. A change is what has an event of its own: a health transition, a
 * VIP gained or lost, a VRRP or ownership change, a drift repair, a reload,
 * the start's end and the stop (the daemon calls changed() for each, with
 * the event history or the STATUS= line); requests with no change between
 * them are served the same text, however many and however close together.
 * What moves without an event - the readings: each backend's last probe and
 * its streak, the drift guard's last resync, the age of a stats problem -
 * is read when the document is built, and a copy whose readings are older
 * than `readingsMs` is built again for the next request: the one bound on
 * how stale a reading in it is, far apart from how often requests come. A
 * copy past that age is also let go (at a thousand services it is 1.4 MiB
 * of JSON text, which an agent asked for its status once an hour would
 * otherwise hold all the time).
 */
export class StatusCache<T> {
  private cached: { value: T; at: number; version: number } | undefined;
  private version = 0;
  /** Builds since start (tests read it). */
  builds = 0;

  constructor(private readonly build: () => T, private readonly now: () => number, private readonly readingsMs = STATUS_READINGS_MS, private readonly later: Later = realLater) {}

  /** Something the document shows changed: the next request builds it again. */
  changed(): void { this.version++; }

  get(): T {
    const c = this.cached;
    const now = this.now();
    if (c && c.version === this.version && now - c.at < this.readingsMs) return c.value;
    this.builds++;
    const value = this.build();
    const cached = { value, at: now, version: this.version };
    this.cached = cached;
    this.later(this.readingsMs, () => { if (this.cached === cached) this.cached = undefined; });
    return value;
  }
}

/**
 * How old the readings of a served status document may be (ms): a backend's
 * last probe, at the default 5 s check period, is itself up to a period old.
 */
export const STATUS_READINGS_MS = 5000;
