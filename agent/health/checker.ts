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
//
// Siblings (design decision): when a backend of a service goes down, the
// service's other backends that are up with no failure counted are probed
// at once, outside their grids (scheduler.runExtra), at most once per the
// service's period. A cause all of them share (this node lost its route or
// its NIC to them) is then seen one probe after the first backend saw it,
// not at the slowest of their phases: a tracked service (failover.track)
// that needs all its backends gone fails as soon as keepalived's
// track_script, which checks them all in one run. The extra result counts
// as a probe for such a backend only: a failure starts its streak (never
// shortens one under way), a success changes nothing; its grid and the
// results it takes from it stay as they were, so with failureThreshold n
// it is down at its (n-1)th grid failure after the extra one.
//
// Probe paths: TCP probes go through a TcpProber - by default the
// native addon's batch prober (raw non-blocking connects, one epoll, results
// in batches), falling back to one Node socket per probe when the addon has
// none; the path is logged at start and exported as
// lbagent_health_probe_path_info. HTTP probes stay on Node's http client: an
// HTTP check is a request and a response to parse, which the addon must not
// do. HTTPS probes write their GET on a node:tls socket and read its status
// line (probe.ts), each target with its TLS settings made once
// (health/tls.ts: one SecureContext per distinct CA) and its session resumed.
// Every probe, whatever its type, holds one of the scheduler's maxInFlight
// slots until it ends; HTTPS probes also wait for one of maxTlsInFlight
// places before they start (their timer with them), as a handshake is CPU
// on this thread. Per probe the checker allocates no Promise,
// AbortController or closure on the TCP path.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { realClock, type Clock } from '../clock';
import { silentLogger, type Logger } from '../log';
import { errorMessage, localExhaustionCode } from '../errors';
import type { BackendSpec, CheckType, HealthCheckSpec, ServiceSpec, TlsCheckSpec } from '../config/types';
import type { NativeAddon } from '../native/native';
import {
  DEFAULT_HTTP_CHECK, defaultProbe, NodeTcpProber,
  type Probe, type ProbeResult, type ProbeTarget, type TcpOutcome, type TcpProber, type TcpTarget,
} from './probe';
import { NativeTcpProber, type NativeTcpProberStats } from './native-probe';
import { ProbeScheduler, type Run, type SchedulerStats, type Slot } from './scheduler';
import { HealthMetrics, type BackendLabels, type ProbePath } from './metrics';
import { TlsContexts } from './tls';
import {
  initialHealth, isHealthy, step,
  type BackendHealth, type CheckPath, type FailureReason, type FailureRecord, type HealthEvent, type HealthState, type Thresholds,
} from './state';

/** Makes a TCP prober whose outcomes go to onOutcome (HealthCheckerOptions.tcpProber). */
export type TcpProberFactory = <C>(onOutcome: TcpOutcome<C>, clock: Clock) => TcpProber<C>;

export interface HealthCheckerOptions {
  readonly registry: Registry;
  readonly clock?: Clock;
  readonly log?: Logger;
  /** The probe for every check; by default TCP checks go through the TCP prober and HTTP checks through httpProbe. Injectable for unit tests. */
  readonly probe?: Probe;
  /**
   * Makes the TCP prober in place of the default (the addon's batch prober,
   * or one Node socket per probe when the addon has none, with a warn line
   * saying why). The daemon never sets it: tests and benches pick a path or a
   * close mode here, and a factory that throws makes start() throw.
   */
  readonly tcpProber?: TcpProberFactory;
  /** The addon loader for the default native prober; injectable for tests. */
  readonly nativeAddon?: () => NativeAddon;
  /**
   * Probes running at once at most (default 1024). The rate the checker can
   * sustain is at most maxInFlight / probe latency, and the latency includes
   * any stall of the event loop and every timeout: 10,000 targets at 1 s with
   * 25 ms stalls need 250 slots, and each dead target with a 3 s timeout
   * holds 3 more. A slot costs one descriptor while its connect is pending
   * (256 throttled 10,000 targets on a busy machine).
   */
  readonly maxInFlight?: number;
  /**
   * HTTPS probes running at once at most (default 64), within maxInFlight.
   * A TLS handshake costs this thread a millisecond or two of CPU: 1,000
   * started together would each wait for the others and time out together.
   * Beyond the bound a probe waits for a place before its timer starts; 64
   * keep a core busy even against backends tens of milliseconds away.
   */
  readonly maxTlsInFlight?: number;
  /** Scheduling jitter as a fraction of the period (default 0.05). */
  readonly jitter?: number;
  /**
   * Scheduler timer coalescing, ms. Default: 1% of the shortest period, at
   * most 10 ms (probes start up to that late, in larger batches and with far
   * fewer wake-ups; immaterial next to the 5% jitter).
   */
  readonly coalesceMs?: number;
  /**
   * Uniform [0, 1) source for jitter (default Math.random). When given,
   * each target's phase is drawn from it too, in the order targets are
   * added (tests pin phases so); by default phases are spread evenly over
   * the period (scheduler.ts, spreadPhase).
   */
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
  readonly lastProbe: LastProbe | undefined;
}

export interface LastProbe { readonly at: number; readonly ok: boolean; readonly durationMs: number; readonly reason: FailureReason | undefined }

/** Written in place on every probe a subscription takes; status() hands out copies. */
interface MutableLastProbe { at: number; ok: boolean; durationMs: number; reason: FailureReason | undefined }

const PROBE_OK: HealthEvent = Object.freeze({ kind: 'probe-ok' });

/** The token of an HTTPS run waiting for a place (HealthChecker.maxTlsInFlight). */
const TLS_WAITING = Symbol('waiting for a TLS place');

/** An https check without TLS settings (specs made by hand): no SNI, no verification. */
const NO_TLS: TlsCheckSpec = Object.freeze({ sni: undefined, caFile: undefined, ca: undefined, caSha256: undefined });

/** What a 'probe' event reports: one probe of one shared target, emitted after its result reached every subscriber. */
export interface ProbeReport {
  readonly target: string;
  readonly address: string;
  readonly port: number;
  readonly type: CheckType;
  /** Services subscribed to the target. */
  readonly subscribers: number;
  readonly slot: Slot;
}

/**
 * One shared probe target. It is its own TcpTarget (address, addressNum,
 * port): a probe reads the fields it needs here, with no further object to
 * load (at 10,000 targets every object a probe touches is a cache
 * miss).
 */
interface Target extends TcpTarget {
  readonly key: string;
  readonly type: CheckType;
  readonly spec: ProbeTarget;
  /** What spec.tls was acquired with (an https target), to release it when the target goes. */
  readonly tlsSpec: TlsCheckSpec | undefined;
  /** Subscribers, in the order they came; an array, not a Set: one load fewer per probe. */
  readonly subs: Sub[];
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
  lastProbe: MutableLastProbe | undefined;
}

interface ServiceEntry {
  spec: ServiceSpec;
  /** By backend address. */
  readonly subs: Map<string, Sub>;
  /** When (clock ms) its backends were last probed because one of them went down; see "Siblings". */
  siblingsAt: number | undefined;
  /** healthy()'s answer while no backend's state changed: the same array, so a caller can tell by identity that nothing did. */
  healthy?: readonly BackendSpec[] | undefined;
}

export interface HealthCheckerEvents {
  change: [serviceKey: string, address: string, up: boolean];
  /** Every verdict (up or down), a first one included: 'change' reports only what moves a backend in or out of rotation. */
  verdict: [serviceKey: string, address: string, state: 'up' | 'down'];
  probe: [report: ProbeReport, result: ProbeResult];
}

/** The probe target key: what makes two checks the same probe. */
export function targetKey(hc: HealthCheckSpec, address: string): string {
  const base = `${hc.type}|${address}|${hc.port}${hc.proxyProtocol !== undefined ? `|proxy-${hc.proxyProtocol}` : ''}`;
  if (hc.type === 'tcp') return base;
  const h = hc.http ?? DEFAULT_HTTP_CHECK;
  const http = `${base}|${h.path}|${h.expectStatus[0]}-${h.expectStatus[1]}`;
  if (hc.type === 'http') return http;
  // A changed CA file (its content) or server name is another check: it starts over.
  return `${http}|sni=${hc.tls?.sni ?? ''}|ca=${hc.tls?.caSha256 ?? ''}`;
}

export class HealthChecker extends EventEmitter<HealthCheckerEvents> {
  private readonly clock: Clock;
  private readonly log: Logger;
  /** The injected probe, when there is one: it then runs every check. */
  private readonly probe: Probe | undefined;
  private readonly tcpProber: TcpProberFactory | undefined;
  /** Fixed coalescing from the options, or undefined: from the shortest period. */
  private readonly coalesceMs: number | undefined;
  private readonly nativeAddon: (() => NativeAddon) | undefined;
  /** Open while running. */
  private tcp: TcpProber<Run<Target>> | undefined;
  private readonly onTcpOutcome: TcpOutcome<Run<Target>> = (run, ok, reason, detail, durationMs) => this.settle(run, ok, reason, detail, durationMs);
  /** Probes started, by path and type, for lbagent_health_probes_total. */
  private readonly started = { native: { tcp: 0, http: 0, https: 0 }, node: { tcp: 0, http: 0, https: 0 }, injected: { tcp: 0, http: 0, https: 0 } };
  /** The TLS contexts of the HTTPS targets, one per distinct CA. */
  private readonly tls = new TlsContexts();
  private readonly maxTlsInFlight: number;
  /** HTTPS probes running, and runs waiting for one of the maxTlsInFlight places (in the order they came). */
  private tlsInFlight = 0;
  private readonly tlsWaiting: Run<Target>[] = [];
  private tcpPath: ProbePath | undefined;
  private readonly metrics: HealthMetrics;
  private readonly scheduler: ProbeScheduler<Target>;
  private readonly services = new Map<string, ServiceEntry>();
  private readonly targets = new Map<string, Target>();
  private running = false;
  /** Verdicts of an earlier run, by service key and address, taken once by the backend's first subscription. */
  private seeded = new Map<string, 'up' | 'down'>();

  constructor(opts: HealthCheckerOptions) {
    super();
    this.clock = opts.clock ?? realClock;
    this.log = (opts.log ?? silentLogger()).child({ module: 'health' });
    this.probe = opts.probe;
    this.coalesceMs = opts.coalesceMs;
    this.tcpProber = opts.tcpProber;
    this.nativeAddon = opts.nativeAddon;
    this.maxTlsInFlight = opts.maxTlsInFlight ?? 64;
    this.metrics = new HealthMetrics(opts.registry, {
      inFlight: () => this.scheduler.stats().inFlight,
      probes: () => {
        const out: { path: ProbePath; type: CheckType; count: number }[] = [];
        for (const path of ['native', 'node', 'injected'] as const) {
          for (const type of ['tcp', 'http', 'https'] as const) if (this.started[path][type] > 0) out.push({ path, type, count: this.started[path][type] });
        }
        return out;
      },
    });
    this.scheduler = new ProbeScheduler<Target>({
      clock: this.clock,
      maxInFlight: opts.maxInFlight ?? 1024,
      jitter: opts.jitter ?? 0.05,
      coalesceMs: opts.coalesceMs ?? 0,
      random: opts.random ?? Math.random,
      ...(opts.random !== undefined ? { phase: opts.random } : {}),
      run: (run) => this.runProbe(run),
      onAbort: (run) => this.abortProbe(run),
      onSkip: (_key, reason, count) => this.metrics.skip(reason, count),
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
      // The same spec (a reload keeps an unchanged service's object): its backends and check are as they were.
      if (svc !== undefined && svc.spec === spec) continue;
      if (!svc) {
        svc = { spec, subs: new Map(), siblingsAt: undefined };
        this.services.set(spec.key, svc);
      }
      svc.spec = spec;
      svc.healthy = undefined;
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
    if (this.coalesceMs === undefined) {
      let shortest = Infinity;
      for (const t of this.targets.values()) if (t.periodMs < shortest) shortest = t.periodMs;
      this.scheduler.setCoalesce(Number.isFinite(shortest) ? Math.min(10, shortest / 100) : 0);
    }
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

  /**
   * Start probing: every target is probed at once, then on its period. Opens
   * the TCP prober; throws when an injected tcpProber factory throws.
   */
  start(): void {
    if (this.running) return;
    if (this.probe === undefined) this.tcp = this.openTcpProber();
    this.tcpPath = this.probe === undefined ? this.tcp!.path : 'injected';
    this.metrics.setProbePath(this.tcpPath);
    this.running = true;
    this.scheduler.start();
    const how = this.tcpPath === 'native' ? 'native batch prober' : this.tcpPath === 'node' ? 'one Node socket per probe' : 'injected probe';
    this.log.info({ op: 'start', targets: this.targets.size, probePath: this.tcpPath }, `health checks started (TCP probes: ${how})`);
  }

  /** Stop probing; in-flight probes are abandoned and their results ignored. State is kept. */
  stop(): void {
    if (!this.running) return;
    this.running = false;
    this.scheduler.stop();
    this.tcp?.close();
    this.tcp = undefined;
    this.log.info({ op: 'stop' }, 'health checks stopped');
  }

  /** How TCP probes run since start() ('native', 'node', or 'injected'); undefined before the first start. */
  probePath(): ProbePath | undefined {
    return this.tcpPath;
  }

  /**
   * The backends of a service that may receive traffic, in config order:
   * the same array until one of its backends changes state or the service
   * changes (the forwarding state keeps a service whose answer is the same
   * object without looking into it).
   */
  healthy(serviceKey: string): readonly BackendSpec[] {
    const svc = this.services.get(serviceKey);
    if (!svc) return [];
    if (svc.healthy !== undefined) return svc.healthy;
    const out: BackendSpec[] = [];
    for (const sub of svc.subs.values()) if (this.subHealthy(sub)) out.push(sub.backend);
    svc.healthy = out;
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
        lastProbe: sub.lastProbe ? { ...sub.lastProbe } : undefined,
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

  /** The native prober's counters while it runs (undefined on the Node path or when stopped), for benches. */
  proberStats(): NativeTcpProberStats | undefined {
    return this.tcp instanceof NativeTcpProber ? this.tcp.stats() : undefined;
  }

  /** TLS contexts alive (one per distinct CA of the HTTPS targets, one for those without), for tests and benches. */
  tlsContexts(): number {
    return this.tls.size;
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
          type: hc.type,
          address: b.address,
          addressNum: b.addressNum,
          port: hc.port,
          spec: {
            address: b.address, port: hc.port, type: hc.type, http: hc.type !== 'tcp' ? (hc.http ?? DEFAULT_HTTP_CHECK) : undefined,
            ...(hc.type === 'https' ? { tls: this.tls.acquire(hc.tls ?? NO_TLS) } : {}),
            ...(hc.proxyProtocol !== undefined ? { proxyProtocol: hc.proxyProtocol } : {}),
          },
          tlsSpec: hc.type === 'https' ? (hc.tls ?? NO_TLS) : undefined,
          subs: [],
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
    target?.subs.push(sub);
    this.metrics.addBackend(sub.labels, this.subHealthy(sub));
    return sub;
  }

  private dropSub(sub: Sub, touched: Set<Target>): void {
    this.metrics.removeBackend(sub.labels);
    if (sub.target) {
      const i = sub.target.subs.indexOf(sub);
      if (i >= 0) sub.target.subs.splice(i, 1);
      touched.add(sub.target);
    }
  }

  /** Period = smallest, timeout = largest among subscribers; no subscriber: gone. */
  private refreshTarget(t: Target): void {
    if (t.subs.length === 0) {
      this.targets.delete(t.key);
      this.scheduler.remove(t.key);
      if (t.tlsSpec) this.tls.release(t.tlsSpec);
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
    this.scheduler.add(t.key, period, t);
  }

  private openTcpProber(): TcpProber<Run<Target>> {
    if (this.tcpProber) return this.tcpProber(this.onTcpOutcome, this.clock);
    try {
      return new NativeTcpProber<Run<Target>>({ onOutcome: this.onTcpOutcome, clock: this.clock, ...(this.nativeAddon ? { addon: this.nativeAddon } : {}) });
    } catch (err) {
      this.log.warn({ op: 'probe-path', path: 'node', err: errorMessage(err) },
        `native TCP prober unavailable (${errorMessage(err)}): TCP health probes use one Node socket each, at several times the CPU per probe`);
      return new NodeTcpProber(this.onTcpOutcome);
    }
  }

  /** Starts one probe of the run's target; settle() ends the run. */
  private runProbe(run: Run<Target>): void {
    const target = run.data;
    const type = target.type;
    // A TCP check that sends a PROXY header first writes bytes:
    // the batch prober only connects, so those go through a Node socket.
    if (this.probe === undefined && type === 'tcp' && this.tcp && target.spec.proxyProtocol === undefined) {
      this.started[this.tcp.path].tcp++;
      run.token = this.tcp.start(target, target.timeoutMs, run, run.started);
      return;
    }
    if (type === 'https') {
      // A handshake is CPU on this thread: beyond the bound it waits its turn, its timer not yet started.
      if (this.tlsInFlight >= this.maxTlsInFlight) { run.token = TLS_WAITING; this.tlsWaiting.push(run); return; }
      this.tlsInFlight++;
    }
    this.startPromised(run);
  }

  /** HTTP and HTTPS checks (Node's http client) and injected probes: a Promise each. */
  private startPromised(run: Run<Target>): void {
    const target = run.data;
    const tls = target.type === 'https';
    this.started[this.probe === undefined ? 'node' : 'injected'][target.type]++;
    const ac = new AbortController();
    run.token = ac;
    let p: Promise<ProbeResult>;
    try {
      p = (this.probe ?? defaultProbe)(target.spec, { timeoutMs: target.timeoutMs, signal: ac.signal });
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then(
      (r) => { if (tls) this.tlsDone(); if (r.ok) this.settle(run, true, undefined, r.detail, r.durationMs); else this.settle(run, false, r.reason, r.detail, r.durationMs); },
      (err: unknown) => { if (tls) this.tlsDone(); this.settle(run, false, 'error', errorMessage(err), 0); },
    );
  }

  /** An HTTPS probe ended (or was aborted): the next waiting one starts. */
  private tlsDone(): void {
    this.tlsInFlight--;
    while (this.tlsInFlight < this.maxTlsInFlight && this.tlsWaiting.length > 0) {
      const next = this.tlsWaiting.shift()!;
      if (next.aborted) continue;
      this.tlsInFlight++;
      this.startPromised(next);
    }
  }

  /** The scheduler abandoned a run (target removed, checker stopped): cancel its probe. */
  private abortProbe(run: Run<Target>): void {
    const token = run.token;
    if (typeof token === 'number') this.tcp?.cancel(token, run);
    else if (token instanceof AbortController) token.abort();
    else if (token === TLS_WAITING) {
      const i = this.tlsWaiting.indexOf(run);
      if (i >= 0) this.tlsWaiting.splice(i, 1);
    }
  }

  /** A probe's outcome: to every subscriber of its target, then the run is over. */
  private settle(run: Run<Target>, ok: boolean, reason: FailureReason | undefined, detail: string | undefined, durationMs: number): void {
    try {
      // A target that went away took its run with it (scheduler.remove aborts).
      if (run.aborted || !this.running) return;
      const target = run.data;
      // A probe that could not get a socket (EMFILE, ENFILE, ENOBUFS)
      // says nothing about the backend: no verdict, counted as skipped.
      if (!ok && localExhaustionCode({ code: detail })) {
        this.metrics.skip('own-exhaustion');
        this.log.debug({ op: 'probe', target: run.key, detail }, 'probe skipped: the agent is out of descriptors');
        return;
      }
      this.metrics.probe(ok ? 'ok' : (reason ?? 'error'), durationMs);
      const wall = this.clock.wallNow();
      const subs = target.subs;
      if (subs.length === 1) {
        this.deliver(subs[0]!, ok, reason, detail, durationMs, run, wall);
      } else {
        // A 'change' listener may update() and so change the set while we deliver.
        for (const sub of [...subs]) this.deliver(sub, ok, reason, detail, durationMs, run, wall);
      }
      // After delivery, so a listener reading status() sees this result applied.
      if (this.listenerCount('probe') > 0) {
        const slot: Slot = { base: run.base, due: run.due, started: run.started };
        const report: ProbeReport = { target: run.key, address: target.address, port: target.port, type: target.type, subscribers: target.subs.length, slot };
        const result: ProbeResult = ok
          ? { ok: true, durationMs, ...(detail !== undefined ? { detail } : {}) }
          : { ok: false, reason: reason ?? 'error', detail: detail ?? '', durationMs };
        this.safeEmit(() => this.emit('probe', report, result));
      }
    } finally {
      run.done();
    }
  }

  /** One probe result to one subscription, at that subscription's period and timeout. */
  private deliver(sub: Sub, ok: boolean, reason: FailureReason | undefined, detail: string | undefined, durationMs: number, run: Run<Target>, wall: number): void {
    if (run.extra) {
      // A sibling went down: counts for a backend up with no failure
      // counted, and leaves its grid results as they were.
      if (!sibling(sub)) return;
    } else {
      // Half a millisecond of slack for float grid arithmetic.
      if (sub.lastAcceptedBase !== undefined && run.base - sub.lastAcceptedBase < sub.periodMs - 0.5) return;
      sub.lastAcceptedBase = run.base;
    }
    const good = ok && durationMs <= sub.timeoutMs;
    const why: FailureReason | undefined = ok ? (good ? undefined : 'timeout') : (reason ?? 'error');
    const lp = sub.lastProbe;
    if (lp) {
      lp.at = wall;
      lp.ok = good;
      lp.durationMs = durationMs;
      lp.reason = why;
    } else {
      sub.lastProbe = { at: wall, ok: good, durationMs, reason: why };
    }
    const ev: HealthEvent = good
      ? PROBE_OK
      : { kind: 'probe-fail', reason: why ?? 'error', detail: ok ? `answered in ${Math.round(durationMs)} ms, over the ${sub.timeoutMs} ms timeout` : (detail ?? '') };
    this.apply(sub, ev, wall);
  }

  private apply(sub: Sub, ev: HealthEvent, now = this.clock.wallNow()): void {
    const before = this.subHealthy(sub);
    const from = sub.health.state;
    const { health, changed } = step(sub.health, ev, now, sub.thresholds);
    sub.health = health;
    if (!changed) return;
    sub.service.healthy = undefined;
    const to = health.state === 'up' ? 'up' : 'down';
    this.metrics.transition(to);
    this.metrics.setUp(sub.labels, this.subHealthy(sub));
    const fields = {
      op: 'transition', service: sub.service.spec.key, backend: sub.labels.backend, from, to,
      reason: health.reason, by: health.takenOutBy, detail: health.state === 'down' ? health.lastFailure?.detail : undefined,
    };
    if (to === 'down') this.log.warn(fields, `backend ${sub.labels.backend} of ${sub.service.spec.key} is down`);
    else this.log.info(fields, `backend ${sub.labels.backend} of ${sub.service.spec.key} is up`);
    // Every verdict, also a first one that says down (which 'change' does
    // not report: unknown was not healthy either): VRRP tracking counts
    // backends not checked yet apart from those found down.
    this.safeEmit(() => this.emit('verdict', sub.service.spec.key, sub.backend.address, to));
    const after = this.subHealthy(sub);
    if (after !== before) this.emitChange(sub, after);
    if (to === 'down') this.probeSiblings(sub.service);
  }

  /** A backend of svc went down: its other backends that are up with no failure counted are probed now ("Siblings"). */
  private probeSiblings(svc: ServiceEntry): void {
    if (!this.running || svc.subs.size < 2) return;
    const now = this.clock.now();
    const period = svc.spec.healthCheck.periodSeconds * 1000;
    if (svc.siblingsAt !== undefined && now - svc.siblingsAt < period) return;
    svc.siblingsAt = now;
    for (const s of svc.subs.values()) {
      if (s.target !== undefined && sibling(s)) this.scheduler.runExtra(s.target.key);
    }
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

/** Up with no failure counted: a backend an extra run is for ("Siblings"). */
function sibling(sub: Sub): boolean {
  return sub.health.state === 'up' && sub.health.consecutiveFailures === 0;
}

function thresholdsOf(hc: HealthCheckSpec): Thresholds {
  return { successThreshold: hc.successThreshold, failureThreshold: hc.failureThreshold, passiveFailures: hc.passiveFailures };
}
