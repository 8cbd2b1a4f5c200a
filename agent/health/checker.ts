// Health checker (driver): decides which backends of each service are healthy.
// Owns the probe targets, one per distinct (address, port, check) shared by
// every service that names it, the per-service state machines fed by them,
// the scheduler, and the health metrics. Reads ServiceSpec; decides nothing
// about routing: the forwarding layer reads healthy() and listens to 'change'.
//
// Sharing (design decision): a backend named by several services with the same
// check (address, port, type, HTTP path/range) is probed ONCE, at the smallest
// period among them, with the largest timeout. Thresholds stay per service:
// each subscription runs its own state machine on that one probe stream and
// - judges a result against its own timeout (a 2 s answer is a success for a
//   service with timeoutSeconds 3 and a timeout for one with 1), and
// - takes a result only when at least its own period has passed since the last
//   one it took (by grid time), so failureThreshold x periodSeconds stays the
//   detection time that service asked for, even when a faster service shares
//   the probe.
//
// Reload: update() diffs by backend address and check target. A backend whose
// check did not change keeps its state, counters and schedule (keepalived
// carries health across reloads the same way); new thresholds apply from the
// next result. A backend whose check changed (port, type, path) starts over in
// `unknown`, i.e. out of rotation until its first good probe, which is run at
// once.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { realClock, type Clock } from '../clock';
import { silentLogger, type Logger } from '../log';
import { errorMessage, localExhaustionCode } from '../errors';
import type { BackendSpec, HealthCheckSpec, ServiceSpec } from '../config/types';
import { DEFAULT_HTTP_CHECK, defaultProbe, type Probe, type ProbeResult, type ProbeTarget } from './probe';
import { ProbeScheduler, type SchedulerStats, type Slot } from './scheduler';
import { HealthMetrics, type BackendLabels } from './metrics';
import {
  initialHealth, isHealthy, step,
  type BackendHealth, type CheckPath, type FailureReason, type FailureRecord, type HealthEvent, type HealthState, type Thresholds,
} from './state';

export interface HealthCheckerOptions {
  readonly registry: Registry;
  readonly clock?: Clock;
  readonly log?: Logger;
  /** The probe; defaults to TCP connect or HTTP GET by check type. Injectable for unit tests. */
  readonly probe?: Probe;
  /** Probes running at once at most (default 256). */
  readonly maxInFlight?: number;
  /** Scheduling jitter as a fraction of the period (default 0.05). */
  readonly jitter?: number;
  /** Uniform [0, 1) source for phase and jitter (default Math.random). */
  readonly random?: () => number;
}

export interface BackendStatus {
  readonly address: string;
  /** The checked port. */
  readonly port: number;
  readonly state: HealthState;
  /** False when the service's health check is disabled: the backend counts as healthy. */
  readonly checked: boolean;
  readonly healthy: boolean;
  /** Wall-clock ms of the last state change (or of when checking began). */
  readonly since: number;
  /** While down: the reason of the failure that took it down. */
  readonly reason: FailureReason | undefined;
  readonly lastFailure: FailureRecord | undefined;
  readonly takenOutBy: CheckPath | undefined;
  readonly consecutiveSuccesses: number;
  readonly consecutiveFailures: number;
  readonly passiveFailures: number;
  /** The last probe result this service took (wall-clock ms). */
  readonly lastProbe: { readonly at: number; readonly ok: boolean; readonly durationMs: number; readonly reason: FailureReason | undefined } | undefined;
}

/** What a 'probe' event reports: one probe of one shared target, emitted after its result reached every subscriber. */
export interface ProbeReport {
  readonly target: string;
  readonly address: string;
  readonly port: number;
  readonly type: 'tcp' | 'http';
  /** Services subscribed to the target. */
  readonly subscribers: number;
  readonly slot: Slot;
}

interface Target {
  readonly key: string;
  readonly spec: ProbeTarget;
  readonly subs: Set<Sub>;
  periodMs: number;
  timeoutMs: number;
}

interface Sub {
  readonly service: ServiceEntry;
  backend: BackendSpec;
  /** undefined when the service's checks are disabled. */
  readonly target: Target | undefined;
  readonly labels: BackendLabels;
  readonly port: number;
  thresholds: Thresholds;
  periodMs: number;
  timeoutMs: number;
  health: BackendHealth;
  lastAcceptedBase: number | undefined;
  lastProbe: BackendStatus['lastProbe'];
}

interface ServiceEntry {
  spec: ServiceSpec;
  /** By backend address. */
  readonly subs: Map<string, Sub>;
}

export declare interface HealthChecker {
  on(event: 'change', listener: (serviceKey: string, address: string, up: boolean) => void): this;
  on(event: 'probe', listener: (report: ProbeReport, result: ProbeResult) => void): this;
  once(event: 'change', listener: (serviceKey: string, address: string, up: boolean) => void): this;
  once(event: 'probe', listener: (report: ProbeReport, result: ProbeResult) => void): this;
  off(event: 'change', listener: (serviceKey: string, address: string, up: boolean) => void): this;
  off(event: 'probe', listener: (report: ProbeReport, result: ProbeResult) => void): this;
  emit(event: 'change', serviceKey: string, address: string, up: boolean): boolean;
  emit(event: 'probe', report: ProbeReport, result: ProbeResult): boolean;
}

/** The probe target key: what makes two checks the same probe. */
export function targetKey(hc: HealthCheckSpec, address: string): string {
  const base = `${hc.type}|${address}|${hc.port}${hc.proxyProtocol !== undefined ? `|proxy-${hc.proxyProtocol}` : ''}`;
  if (hc.type !== 'http') return base;
  const h = hc.http ?? DEFAULT_HTTP_CHECK;
  return `${base}|${h.path}|${h.expectStatus[0]}-${h.expectStatus[1]}`;
}

export class HealthChecker extends EventEmitter {
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly probe: Probe;
  private readonly metrics: HealthMetrics;
  private readonly scheduler: ProbeScheduler;
  private readonly services = new Map<string, ServiceEntry>();
  private readonly targets = new Map<string, Target>();
  private running = false;
  /** Verdicts of an earlier run, by service key and address, taken once by the backend's first subscription. */
  private seeded = new Map<string, 'up' | 'down'>();

  constructor(opts: HealthCheckerOptions) {
    super();
    this.clock = opts.clock ?? realClock;
    this.log = (opts.log ?? silentLogger()).child({ module: 'health' });
    this.probe = opts.probe ?? defaultProbe;
    this.metrics = new HealthMetrics(opts.registry);
    this.scheduler = new ProbeScheduler({
      clock: this.clock,
      maxInFlight: opts.maxInFlight ?? 256,
      jitter: opts.jitter ?? 0.05,
      random: opts.random ?? Math.random,
      run: (key, slot, signal) => this.runProbe(key, slot, signal),
      onSkip: (_key, reason, count) => this.metrics.skipped.inc({ reason }, count),
    });
  }

  /** Apply the desired services: diff by service key, backend address and check target. */
  update(services: readonly ServiceSpec[]): void {
    const wanted = new Map<string, ServiceSpec>();
    for (const s of services) wanted.set(s.key, s);
    const touched = new Set<Target>();
    const changes: Sub[] = [];
    for (const [key, svc] of this.services) {
      if (wanted.has(key)) continue;
      for (const sub of svc.subs.values()) this.dropSub(sub, touched);
      this.services.delete(key);
    }
    for (const spec of wanted.values()) {
      let svc = this.services.get(spec.key);
      if (!svc) {
        svc = { spec, subs: new Map() };
        this.services.set(spec.key, svc);
      }
      svc.spec = spec;
      const backends = new Map<string, BackendSpec>();
      for (const b of spec.backends) if (!backends.has(b.address)) backends.set(b.address, b);
      for (const [addr, sub] of svc.subs) {
        if (!backends.has(addr)) this.dropSub(sub, touched);
      }
      const hc = spec.healthCheck;
      const oldSubs = new Map(svc.subs);
      svc.subs.clear(); // refilled in config order
      for (const b of backends.values()) {
        const tkey = hc.enabled ? targetKey(hc, b.address) : undefined;
        const old = oldSubs.get(b.address);
        if (old && old.target?.key === tkey && old.port === hc.port) {
          old.backend = b;
          old.thresholds = thresholdsOf(hc);
          old.periodMs = hc.periodSeconds * 1000;
          old.timeoutMs = hc.timeoutSeconds * 1000;
          if (old.target) touched.add(old.target);
          svc.subs.set(b.address, old);
          continue;
        }
        const wasHealthy = old ? this.subHealthy(old) : undefined;
        if (old) this.dropSub(old, touched);
        const sub = this.addSub(svc, b, tkey, touched);
        svc.subs.set(b.address, sub);
        if (wasHealthy !== undefined && wasHealthy !== this.subHealthy(sub)) changes.push(sub);
      }
    }
    for (const t of touched) this.refreshTarget(t);
    // Listeners see the finished update.
    for (const sub of changes) this.emitChange(sub, this.subHealthy(sub));
    this.log.debug({ op: 'update', services: this.services.size, targets: this.targets.size }, 'health targets updated');
  }

  /**
   * Crash-only start: the verdicts an earlier run reached (persisted by the
   * daemon) become the starting state of those backends instead of
   * `unknown`, so a restart neither takes healthy backends out of rotation
   * until their first probe nor puts dead ones in. Thresholds then apply as
   * usual: an `up` backend goes down after failureThreshold failures. Call
   * before the update() that adds the services.
   */
  seed(states: Iterable<readonly [serviceKey: string, address: string, state: 'up' | 'down']>): void {
    for (const [key, address, state] of states) this.seeded.set(`${key}\u0000${address}`, state);
  }

  /** Start probing: every target is probed at once, then on its period. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.scheduler.start();
    this.log.info({ op: 'start', targets: this.targets.size }, 'health checks started');
  }

  /** Stop probing; in-flight probes are abandoned and their results ignored. State is kept. */
  stop(): void {
    if (!this.running) return;
    this.running = false;
    this.scheduler.stop();
    this.log.info({ op: 'stop' }, 'health checks stopped');
  }

  /** The backends of a service that may receive traffic, in config order. */
  healthy(serviceKey: string): BackendSpec[] {
    const svc = this.services.get(serviceKey);
    if (!svc) return [];
    const out: BackendSpec[] = [];
    for (const sub of svc.subs.values()) if (this.subHealthy(sub)) out.push(sub.backend);
    return out;
  }

  /** Per-backend health of a service, in config order; [] for an unknown service. */
  status(serviceKey: string): BackendStatus[] {
    const svc = this.services.get(serviceKey);
    if (!svc) return [];
    return [...svc.subs.values()].map((sub) => {
      const h = sub.health;
      return {
        address: sub.backend.address,
        port: sub.port,
        state: sub.target ? h.state : 'up',
        checked: sub.target !== undefined,
        healthy: this.subHealthy(sub),
        since: h.since,
        reason: h.reason,
        lastFailure: h.lastFailure,
        takenOutBy: h.takenOutBy,
        consecutiveSuccesses: h.consecutiveSuccesses,
        consecutiveFailures: h.consecutiveFailures,
        passiveFailures: h.passiveFailures,
        lastProbe: sub.lastProbe,
      };
    });
  }

  /**
   * Passive check: the forwarding path failed to connect to a backend of a
   * service. passiveFailures consecutive ones mark it down at once; only the
   * active probe brings it back. Returns false when the backend is unknown or
   * not checked.
   */
  reportConnectFailure(serviceKey: string, address: string, reason: FailureReason = 'error', detail?: string): boolean {
    const sub = this.services.get(serviceKey)?.subs.get(address);
    if (!sub || !sub.target) return false;
    this.apply(sub, { kind: 'passive-fail', reason, ...(detail !== undefined ? { detail } : {}) });
    return true;
  }

  /** Passive check: the forwarding path connected; resets the passive failure count. */
  reportConnectSuccess(serviceKey: string, address: string): boolean {
    const sub = this.services.get(serviceKey)?.subs.get(address);
    if (!sub || !sub.target) return false;
    this.apply(sub, { kind: 'passive-ok' });
    return true;
  }

  /** Scheduler counters, for benches and status. */
  schedulerStats(): SchedulerStats & { targets: number } {
    return { ...this.scheduler.stats(), targets: this.targets.size };
  }

  // --- internals -------------------------------------------------------------

  private subHealthy(sub: Sub): boolean {
    return sub.target === undefined || isHealthy(sub.health);
  }

  private addSub(svc: ServiceEntry, b: BackendSpec, tkey: string | undefined, touched: Set<Target>): Sub {
    const hc = svc.spec.healthCheck;
    let target: Target | undefined;
    if (tkey !== undefined) {
      target = this.targets.get(tkey);
      if (!target) {
        target = {
          key: tkey,
          spec: {
            address: b.address, port: hc.port, type: hc.type, http: hc.type === 'http' ? (hc.http ?? DEFAULT_HTTP_CHECK) : undefined,
            ...(hc.proxyProtocol !== undefined ? { proxyProtocol: hc.proxyProtocol } : {}),
          },
          subs: new Set(),
          periodMs: hc.periodSeconds * 1000,
          timeoutMs: hc.timeoutSeconds * 1000,
        };
        this.targets.set(tkey, target);
      } else if (this.running) {
        // A new subscriber to a running probe wants its first answer now.
        this.scheduler.runSoon(tkey);
      }
      touched.add(target);
    }
    const now = this.clock.wallNow();
    const seedKey = `${svc.spec.key}\u0000${b.address}`;
    const seeded = target ? this.seeded.get(seedKey) : undefined;
    this.seeded.delete(seedKey);
    const sub: Sub = {
      service: svc,
      backend: b,
      target,
      labels: { service: svc.spec.name, namespace: svc.spec.namespace, backend: `${b.address}:${hc.port}` },
      port: hc.port,
      thresholds: thresholdsOf(hc),
      periodMs: hc.periodSeconds * 1000,
      timeoutMs: hc.timeoutSeconds * 1000,
      health: seeded ? { ...initialHealth(now), state: seeded } : initialHealth(now),
      lastAcceptedBase: undefined,
      lastProbe: undefined,
    };
    target?.subs.add(sub);
    this.metrics.addBackend(sub.labels, this.subHealthy(sub), now);
    return sub;
  }

  private dropSub(sub: Sub, touched: Set<Target>): void {
    this.metrics.removeBackend(sub.labels);
    if (sub.target) {
      sub.target.subs.delete(sub);
      touched.add(sub.target);
    }
  }

  /** Period = smallest, timeout = largest among subscribers; no subscriber: gone. */
  private refreshTarget(t: Target): void {
    if (t.subs.size === 0) {
      this.targets.delete(t.key);
      this.scheduler.remove(t.key);
      return;
    }
    let period = Infinity;
    let timeout = 0;
    for (const s of t.subs) {
      period = Math.min(period, s.periodMs);
      timeout = Math.max(timeout, s.timeoutMs);
    }
    t.periodMs = period;
    t.timeoutMs = timeout;
    if (this.scheduler.has(t.key)) this.scheduler.setPeriod(t.key, period);
    else this.scheduler.add(t.key, period);
  }

  private async runProbe(key: string, slot: Slot, signal: AbortSignal): Promise<void> {
    const target = this.targets.get(key);
    if (!target) return;
    this.metrics.inFlight.inc();
    let r: ProbeResult;
    try {
      r = await this.probe(target.spec, { timeoutMs: target.timeoutMs, signal });
    } catch (err) {
      r = { ok: false, reason: 'error', detail: errorMessage(err), durationMs: 0 };
    } finally {
      this.metrics.inFlight.dec();
    }
    if (signal.aborted || !this.running || this.targets.get(key) !== target) return;
    // Issue 15: a probe that could not get a socket (EMFILE, ENFILE, ENOBUFS)
    // says nothing about the backend: no verdict, counted as skipped.
    if (!r.ok && localExhaustionCode({ code: r.detail })) {
      this.metrics.skipped.inc({ reason: 'own-exhaustion' });
      this.log.debug({ op: 'probe', target: key, detail: r.detail }, 'probe skipped: the agent is out of descriptors');
      return;
    }
    this.metrics.probe(r.ok ? 'ok' : r.reason, r.durationMs);
    for (const sub of [...target.subs]) this.deliver(sub, r, slot);
    // After delivery, so a listener reading status() sees this result applied.
    if (this.listenerCount('probe') > 0) {
      const report: ProbeReport = { target: key, address: target.spec.address, port: target.spec.port, type: target.spec.type, subscribers: target.subs.size, slot };
      this.safeEmit(() => this.emit('probe', report, r));
    }
  }

  /** One probe result to one subscription, at that subscription's period and timeout. */
  private deliver(sub: Sub, r: ProbeResult, slot: Slot): void {
    // Half a millisecond of slack for float grid arithmetic.
    if (sub.lastAcceptedBase !== undefined && slot.base - sub.lastAcceptedBase < sub.periodMs - 0.5) return;
    sub.lastAcceptedBase = slot.base;
    const ok = r.ok && r.durationMs <= sub.timeoutMs;
    const reason: FailureReason | undefined = r.ok ? (ok ? undefined : 'timeout') : r.reason;
    sub.lastProbe = { at: this.clock.wallNow(), ok, durationMs: r.durationMs, reason };
    const ev: HealthEvent = ok
      ? { kind: 'probe-ok' }
      : { kind: 'probe-fail', reason: reason ?? 'error', detail: r.ok ? `answered in ${Math.round(r.durationMs)} ms, over the ${sub.timeoutMs} ms timeout` : r.detail };
    this.apply(sub, ev);
  }

  private apply(sub: Sub, ev: HealthEvent): void {
    const before = this.subHealthy(sub);
    const from = sub.health.state;
    const now = this.clock.wallNow();
    const { health, changed } = step(sub.health, ev, now, sub.thresholds);
    sub.health = health;
    if (!changed) return;
    const to = health.state === 'up' ? 'up' : 'down';
    this.metrics.transition(sub.labels, to, now);
    this.metrics.setUp(sub.labels, this.subHealthy(sub));
    const fields = {
      op: 'transition', service: sub.service.spec.key, backend: sub.labels.backend, from, to,
      reason: health.reason, by: health.takenOutBy, detail: health.state === 'down' ? health.lastFailure?.detail : undefined,
    };
    if (to === 'down') this.log.warn(fields, `backend ${sub.labels.backend} of ${sub.service.spec.key} is down`);
    else this.log.info(fields, `backend ${sub.labels.backend} of ${sub.service.spec.key} is up`);
    const after = this.subHealthy(sub);
    if (after !== before) this.emitChange(sub, after);
  }

  private emitChange(sub: Sub, up: boolean): void {
    this.safeEmit(() => this.emit('change', sub.service.spec.key, sub.backend.address, up));
  }

  /** A throwing listener must not break the probe loop. */
  private safeEmit(fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.log.error({ op: 'emit', err: errorMessage(err) }, 'a health event listener threw');
    }
  }
}

function thresholdsOf(hc: HealthCheckSpec): Thresholds {
  return { successThreshold: hc.successThreshold, failureThreshold: hc.failureThreshold, passiveFailures: hc.passiveFailures };
}
