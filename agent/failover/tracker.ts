// Driver of priority tracking for one network's virtual routers (the
// default network's failover.track, or networks.<name>.failover.track):
// feeds failover/tracking.ts what this node observes of its tracked
// interfaces (rtnetlink link notifications, and a read of each link at
// start and after lost notifications) and services (the health checker's
// verdicts), arms the one timer that lets a pending observation count, and
// reports each change of a track ('change'). A reload hands it the
// network's new tracks (reconfigure). The gates (gate.ts) of that network
// turn the tracks into each virtual router's priority.
// Link and health access come in as functions: this file opens nothing.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import type { TrackConfig } from '../config/types';
import type { Clock, TimerHandle } from '../clock';
import { realClock, isoTime } from '../clock';
import type { Logger } from '../log';
import { errorMessage } from '../errors';
import { DEFAULT_NETWORK } from '../config/networks';
import {
  createTracks, effectivePriority, interfaceObservation, nextChangeAt, observe, serviceObservation, settle,
  type EffectivePriority, type Track, type TrackDef,
} from './tracking';
import { vrrpMetrics, type VrrpMetrics } from './metrics';

/** A link as tracking sees it. */
export interface TrackedLink { readonly up: boolean; readonly carrier: boolean }

/** The verdicts of a tracked service's backends, every family together. */
export interface TrackedBackends { readonly up: number; readonly unknown: number; readonly total: number }

export interface PriorityTrackerOptions {
  readonly track: TrackConfig;
  /** The network whose routers these tracks lower; default DEFAULT_NETWORK. Named ones label the metric with it. */
  readonly network?: string | undefined;
  /** The link now; undefined when there is no such interface. */
  readonly readLink: (name: string) => Promise<TrackedLink | undefined>;
  /** The verdicts of a service's backends now (key "namespace/name"). */
  readonly backends: (serviceKey: string) => TrackedBackends;
  readonly log: Logger;
  readonly registry: Registry;
  readonly clock?: Clock | undefined;
}

/** One track as `lb-agent status` shows it. */
export interface TrackStatus {
  readonly track: string;
  /** The network whose virtual routers it lowers ("default": node.interface's, failover.track). */
  readonly network: string;
  readonly kind: string;
  readonly name: string;
  /** undefined: fault when failing. */
  readonly weight: number | undefined;
  /** Counts for the priority. */
  readonly failing: boolean;
  /** The last observation differs and counts at this ISO time, unless it changes first. */
  readonly pendingUntil: string | undefined;
  readonly detail: string;
  /** ISO time since when `failing` has had its value. */
  readonly since: string;
}

/** The base of a family service key: "ns/name@IPv6" -> "ns/name". */
export function trackedServiceOf(familyKey: string): string {
  const at = familyKey.indexOf('@');
  return at < 0 ? familyKey : familyKey.slice(0, at);
}

export function trackDefs(track: TrackConfig): TrackDef[] {
  return [
    ...track.interfaces.map((i): TrackDef => ({
      key: `interface ${i.name}`, kind: 'interface', name: i.name, weight: i.weight, failAfterMs: i.failAfter * 1000, recoverAfterMs: i.recoverAfter * 1000,
    })),
    ...track.services.map((s): TrackDef => ({
      key: `service ${s.service}`, kind: 'service', name: s.service, weight: s.weight, failAfterMs: s.failAfter * 1000, recoverAfterMs: s.recoverAfter * 1000,
    })),
  ];
}

export class PriorityTracker extends EventEmitter {
  private readonly opts: PriorityTrackerOptions;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly metrics: VrrpMetrics;
  private tracks: Track[];
  /** The tracks as configured: opts.track, then each reload's (reconfigure). */
  private track: TrackConfig;
  readonly network: string;
  private timer: TimerHandle | undefined;
  private stopped = false;
  /** Link reads in flight, per interface, so that an older read never overwrites a newer notification. */
  private readonly linkEpoch = new Map<string, number>();

  constructor(opts: PriorityTrackerOptions) {
    super();
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'failover', op: 'track' });
    this.metrics = vrrpMetrics(opts.registry);
    this.track = opts.track;
    this.network = opts.network ?? DEFAULT_NETWORK;
    this.tracks = createTracks(trackDefs(opts.track), this.clock.now());
  }

  /** The gauge's labels of a track: `network` on a named network's only (the default's series read as they always did). */
  private labels(key: string): { track: string; network?: string } {
    return this.network === DEFAULT_NETWORK ? { track: key } : { track: key, network: this.network };
  }

  /** The interface names tracked now. */
  get interfaces(): readonly string[] { return this.track.interfaces.map((i) => i.name); }

  get empty(): boolean { return this.tracks.length === 0; }

  /** Observe every track once (links read, verdicts counted); what fails with no delay counts at once. */
  async start(): Promise<void> {
    await Promise.all(this.track.interfaces.map((i) => this.readLink(i.name)));
    for (const s of this.track.services) this.observeService(s.service);
    this.settleNow();
  }

  /**
   * A reload's tracks for this network. A track that stays (same key) keeps
   * what it has observed and whether it counts as failing, under its new
   * weight and delays (a changed delay applies to an observation still
   * pending); a new one is observed at once, and what fails with no delay
   * counts at once; a removed one is forgotten, its gauge with it. Always
   * ends with a 'change', so every router recomputes its priority: a
   * removed failing track, or a new weight, moves it with no track changing.
   */
  async reconfigure(track: TrackConfig): Promise<void> {
    if (this.stopped) return;
    const now = this.clock.now();
    const defs = trackDefs(track);
    const before = new Map(this.tracks.map((t) => [t.def.key, t]));
    const keep = new Set(defs.map((d) => d.key));
    for (const t of this.tracks) if (!keep.has(t.def.key)) this.metrics.trackFailing.remove(this.labels(t.def.key));
    this.track = track;
    this.tracks = defs.map((def) => {
      const old = before.get(def.key);
      return old ? { ...old, def } : createTracks([def], now)[0]!;
    });
    const added = defs.filter((d) => !before.has(d.key));
    this.log.info({ added: added.map((d) => d.key), removed: [...before.keys()].filter((k) => !keep.has(k)), tracks: defs.map((d) => d.key) }, `tracks of network ${this.network} reloaded`);
    await Promise.all(added.filter((d) => d.kind === 'interface').map((d) => this.readLink(d.name)));
    for (const d of added) if (d.kind === 'service') this.observeService(d.name);
    for (const d of added) this.metrics.trackFailing.set(this.labels(d.key), 0);
    this.settleNow();
    this.emit('change', []);
  }

  /** A link notification (or its deletion: undefined) for an interface by name. */
  linkChanged(name: string, link: TrackedLink | undefined): void {
    if (!this.track.interfaces.some((i) => i.name === name)) return;
    this.linkEpoch.set(name, (this.linkEpoch.get(name) ?? 0) + 1);
    this.observeLink(name, link);
    this.settleNow();
  }

  /** Notifications may have been lost: read every tracked link again. */
  async resync(): Promise<void> {
    await Promise.all(this.track.interfaces.map((i) => this.readLink(i.name)));
    this.settleNow();
  }

  /** A backend verdict of a (family) service changed. */
  serviceChanged(familyKey: string): void {
    const key = trackedServiceOf(familyKey);
    if (!this.track.services.some((s) => s.service === key)) return;
    this.observeService(key);
    this.settleNow();
  }

  /**
   * Count every tracked service's verdicts again: after the health
   * checker's update, whose starting verdicts (seeded from an earlier run)
   * come with no event.
   */
  refreshServices(): void {
    for (const s of this.track.services) this.observeService(s.service);
    this.settleNow();
  }

  /** The priority in use for a router of this base priority, and why. */
  effective(base: number): EffectivePriority {
    return effectivePriority(base, this.tracks);
  }

  status(): TrackStatus[] {
    const wall = (ms: number): string => isoTime(ms - this.clock.now() + this.clock.wallNow());
    return this.tracks.map((t) => ({
      track: t.def.key, network: this.network, kind: t.def.kind, name: t.def.name, weight: t.def.weight, failing: t.failing,
      pendingUntil: t.observed === t.failing ? undefined : wall(t.observedSince + (t.observed ? t.def.failAfterMs : t.def.recoverAfterMs)),
      detail: t.detail, since: wall(t.failingSince),
    }));
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async readLink(name: string): Promise<void> {
    const epoch = this.linkEpoch.get(name) ?? 0;
    let link: TrackedLink | undefined;
    try {
      link = await this.opts.readLink(name);
    } catch (e) {
      // Unreadable is not "down": keep the last observation, say so.
      this.log.warn({ interface: name, err: errorMessage(e) }, `cannot read tracked interface ${name}; its last state stands`);
      return;
    }
    // A notification arrived meanwhile: it is newer than this read.
    if (this.stopped || (this.linkEpoch.get(name) ?? 0) !== epoch) return;
    this.observeLink(name, link);
  }

  private observeLink(name: string, link: TrackedLink | undefined): void {
    const o = interfaceObservation(link);
    this.record(`interface ${name}`, o.failing, o.detail);
  }

  private observeService(key: string): void {
    const spec = this.track.services.find((s) => s.service === key);
    if (!spec) return;
    const b = this.opts.backends(key);
    const o = serviceObservation(b.up, b.unknown, b.total, spec.minHealthy);
    this.record(`service ${key}`, o.failing, o.detail);
  }

  private record(key: string, failing: boolean, detail: string): void {
    if (this.stopped) return;
    const before = this.tracks.find((t) => t.def.key === key);
    this.tracks = observe(this.tracks, key, failing, detail, this.clock.now());
    const after = this.tracks.find((t) => t.def.key === key);
    if (before && after && before.observed !== after.observed && after.observed !== after.failing) {
      const wait = after.observed ? after.def.failAfterMs : after.def.recoverAfterMs;
      if (wait > 0) this.log.info({ track: key, observed: failing ? 'failing' : 'ok', detail, waitMs: wait }, `${key}: ${detail}; counts if it holds ${wait / 1000} s`);
    }
  }

  private settleNow(): void {
    if (this.stopped) return;
    const now = this.clock.now();
    const { tracks, changed } = settle(this.tracks, now);
    this.tracks = tracks;
    for (const t of changed) {
      this.metrics.trackFailing.set(this.labels(t.def.key), t.failing ? 1 : 0);
      const what = t.failing ? (t.def.weight === undefined ? 'fault' : `priority -${t.def.weight}`) : 'recovered';
      this.log[t.failing ? 'warn' : 'info']({ track: t.def.key, network: this.network, failing: t.failing, detail: t.detail, weight: t.def.weight }, `${t.def.key}: ${t.detail}: ${what}`);
    }
    if (changed.length > 0) this.emit('change', changed);
    this.arm();
  }

  private arm(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    const at = nextChangeAt(this.tracks);
    if (at === undefined || this.stopped) return;
    this.timer = this.clock.setTimeout(() => {
      this.timer = undefined;
      this.settleNow();
    }, Math.max(0, at - this.clock.now()));
  }

  /** Set every track's gauge (at start: the metric exists before the first change). */
  publish(): void {
    for (const t of this.tracks) this.metrics.trackFailing.set(this.labels(t.def.key), t.failing ? 1 : 0);
  }
}
