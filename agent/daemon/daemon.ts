// The daemon's life cycle: load and freeze the config, take the instance
// lock, start modules in order (state, metrics, subsystems, services,
// control socket), reconcile, and stop them in reverse. SIGHUP reloads by
// diff (only changed services are touched; a bad file changes nothing);
// SIGTERM withdraws everything the agent announced without releasing leases.
// A shell: the services and their VRRP gating (services.ts), reload
// (reload.ts), status (status-view.ts), the control ops (control-ops.ts)
// and the metrics endpoint (metrics-endpoint.ts) are parts of their own;
// this file starts, stops and passes events between them.
import { EventEmitter } from 'node:events';
import type { Registry } from '../metrics/prom';
import { formatConfigErrors } from '../config/load';
import { linkKeyOf } from '../config/families';
import { loadConfigFileAsync, INLINE_PARSE_MAX_BYTES } from '../config/load-async';
import type { BackendSpec, Desired, ServiceSpec } from '../config/types';
import { LbError, errorMessage } from '../errors';
import type { Logger } from '../log';
import { StateStore } from '../state/store';
import { InstanceLock } from './lock';
import type { Readiness } from '../metrics/server';
import { ControlServer, JsonText } from '../control/server';
import type { Subsystems, ForwardService, SubsystemContext } from './subsystems';
import type { ListenerStore } from '../forward/dataplane';
import type { Clock } from '../clock';
import { realClock, isoTime } from '../clock';
import { VERSION } from '../version';
import { EventRing, type StatusEvent, type StatusEventKind } from './events';
import type { TopologySelection } from '../forward/topology';
import type { CodeCacheHandle } from '../cli/code-cache';
import type { DriftGuard } from './drift';
import { HealthStore } from './health-store';
import { RuntimeTuning } from './tuning';
import { NodeZone, placeOf } from './zone';
import { ApplyLoop } from './apply-loop';
import { DEFAULT_NETWORK, networksOf } from '../config/networks';
import type { ReloadResult, ServiceStatus, StatusDocument } from './status';
import { lateModules } from './late-load';
import { ServiceRuntimes, type ServiceRuntime } from './services';
import { StatusCache, StatusView } from './status-view';
import { MetricsEndpoint } from './metrics-endpoint';
import { Reloader } from './reload';
import { controlOp, type ControlTarget } from './control-ops';

export interface DaemonOptions {
  configPath: string;
  log: Logger;
  clock?: Clock;
  /** Builds the real subsystems (wiring.ts); injected so the life cycle can be tested apart. */
  buildSubsystems: (config: Desired, ctx: SubsystemContext) => Promise<Subsystems>;
  /** Listening sockets kept by the service manager across restarts (main.ts passes systemd's fd store). */
  listenerStore?: ListenerStore & { release(): void };
  /** sd_notify-style hook: READY=1, STATUS=..., STOPPING=1. */
  notify?: (msg: string) => void;
  /** How the control socket's "reload" runs (main.ts: inside RELOADING=1/READY=1, as SIGHUP); default reload(). */
  reload?: () => Promise<ReloadResult>;
  /**
   * `lb-agent run --replace`: take over from the agent running with this
   * config (daemon/handover.ts) before the lock is taken; resolves with its
   * pid, undefined when none runs. The lock then waits for it to let go.
   */
  replace?: (config: Desired) => Promise<number | undefined>;
  /**
   * The control socket's "handover" (a successor's --replace): send the
   * listening sockets to `path` and begin a hand-over stop. Absent: refused
   * (under systemd the fd store keeps them across `systemctl restart`).
   */
  onHandover?: (path: string) => { pid: number; listeners: number };
  /**
   * After each reload's garbage collection: give freed native memory back to
   * the kernel (main.ts: malloc_trim(3) through the addon).
   */
  trimMemory?: () => void;
  /**
   * The start's collection, when the addon offers V8's low-memory one
   * (main.ts: lowMemoryNotification); false: not available, and
   * the daemon runs gc() instead.
   */
  collectAll?: () => boolean;
  /**
   * Each reload's collection, when the addon offers V8's memory-pressure one
   * (main.ts: collectUnderPressure); false: not available, and
   * the daemon runs gc() instead.
   */
  collectAfterReload?: () => boolean;
  /** During a start, the longest a change waits for sources still acquiring (ApplyLoop, acquiringForBatch); default START_APPLY_BATCH_MS. */
  startApplyBatchMs?: number;
  /**
   * Called as the start begins: holds V8's optimizing compiler off for the
   * start's burst and returns what releases it (main.ts: tiering.ts
   * holdOptimizer), or undefined. Released once the start has
   * settled, START_HOLD_MAX_MS after "lb-agent started" at the latest, or
   * on stop.
   */
  holdOptimizer?: () => (() => void) | undefined;
  /**
   * V8's code cache of this start (agent/cli/start.ts): its state
   * goes in the "lb-agent started" line, and when the start did not take a
   * cache, one is written once the start has settled (with every function
   * the start compiled), for the next start.
   */
  codeCache?: Pick<CodeCacheHandle, 'state' | 'reason' | 'save'> | undefined;
}

/** How long a successor waits for its predecessor to let go of the instance lock. */
const REPLACE_LOCK_WAIT_MS = 10_000;

/**
 * During a start, the longest a change waits for the table while address
 * sources are still acquiring (ApplyLoop, Daemon.acquiringForBatch).
 */
export const START_APPLY_BATCH_MS = 500;

export class Daemon extends EventEmitter {
  private readonly opts: DaemonOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private config: Desired | undefined;
  private configLoadedAt = 0;
  private lock: InstanceLock | undefined;
  /** The metrics endpoint (it follows the parent's address when bound to it). */
  private readonly metricsEndpoint: MetricsEndpoint;
  private control: ControlServer | undefined;
  private subs: Subsystems | undefined;
  /** Keeps the kernel true to what the agent holds (daemon/drift.ts); from the end of the start. */
  private drift: DriftGuard | undefined;
  /** The parent's address as last observed, once it changed after the start. */
  private parentAddress: string | undefined;
  /** Every configured service's runtime: its address source and its VRRP gating. */
  private readonly services: ServiceRuntimes;
  /**
   * One data path transaction at a time (apply-loop.ts). It knows the VIPs
   * whose rules are in place and the services forwarded to a healthy
   * backend: `ready` waits for the latter, so status never calls a service
   * ready while its first connections would still be refused.
   */
  private readonly applies: ApplyLoop;
  /** Status, readiness and the STATUS= line, read from the parts. */
  private readonly view: StatusView;
  /** The status document as `lb-agent status` is sent it, built once per change (StatusCache). */
  private readonly statusText: StatusCache<JsonText>;
  /** One reload at a time, and the verdict of the last. */
  private readonly reloader: Reloader;
  /** A STATUS= line asked for by notifyStatusSoon, not yet sent. */
  private statusNotice: NodeJS.Immediate | undefined;
  private stopping = false;
  private metrics: import('./metrics').DaemonMetrics | undefined;
  /** This node's zone and region, re-read at every reload and when the labels file is rewritten. */
  private readonly zone: NodeZone;
  private registry: Registry | undefined;
  private health: HealthStore | undefined;
  /** Each service's forwarding state at the last apply, kept while its inputs are unchanged (forwardState). */
  private readonly forwardKept = new WeakMap<object, ForwardService>();
  /** What each kept forwarding state was built from, by identity (forwardOf). */
  private readonly forwardFrom = new WeakMap<object, { readonly spec: ServiceSpec; readonly healthy: readonly BackendSpec[]; readonly zone: string | undefined }>();
  /** The last forwardState: its list, each service's position in it, and the runtimes' layout it was built at. */
  private forwardLast: { readonly list: readonly ForwardService[]; readonly at: ReadonlyMap<string, number>; readonly layout: number } | undefined;
  /**
   * What may have changed since the last forwardState: the keys of services
   * whose health verdicts moved or whose spec a reload replaced in place, or
   * 'all' (any other change: a VIP, a zone, a reload that adds, removes or
   * restarts a service or changes a section, a failover step; each comes
   * through scheduleApply or applyNow).
   */
  private forwardDirty: Set<string> | 'all' = 'all';
  private readonly tuning: RuntimeTuning;
  private predecessor: number | undefined;
  /** the last events, for status. */
  private readonly events = new EventRing();
  /** The first reconcile has run (start() finished); until then status shows services "starting". */
  private started = false;
  /** Set once the first apply has put every service's VIP in place: the start's work, and its garbage, are done. */
  private startSettled = false;
  /** When start() began (clock.now()), for the settled line. */
  private startBegan = 0;
  /** start() in flight or done: a reload that arrives while starting waits for it. */
  private starting: Promise<void> | undefined;

  constructor(opts: DaemonOptions) {
    super();
    this.opts = opts;
    this.log = opts.log.child({ module: 'daemon' });
    this.clock = opts.clock ?? realClock;
    this.tuning = new RuntimeTuning(opts, this.log);
    this.applies = new ApplyLoop({
      log: this.log, clock: this.clock, batchMs: opts.startApplyBatchMs ?? START_APPLY_BATCH_MS,
      state: () => this.forwardState(),
      apply: (state) => this.subs!.dataplane.apply(state),
      acquiring: () => this.acquiringForBatch(),
      // systemd's STATUS= line says so when readiness follows the applied table.
      onServingChanged: () => this.notifyStatus(),
      onIdle: () => this.settleStart(),
    });
    this.zone = new NodeZone({ log: this.log, read: (node) => lateModules().readNodeTopology(node), onRewrite: () => { void this.labelsRewritten(); } });
    this.services = new ServiceRuntimes({
      log: this.log, clock: this.clock,
      subs: () => this.subs, config: () => this.config, stopping: () => this.stopping, metrics: () => this.metrics,
      hasRules: (vip) => this.applies.hasVip(vip),
      scheduleApply: () => this.scheduleApply(), applyNow: () => this.applyNow(),
      noteEvent: (kind, ev) => this.noteEvent(kind, ev), notifyStatusSoon: () => this.notifyStatusSoon(),
      statusChanged: () => this.statusText.changed(),
    });
    this.metricsEndpoint = new MetricsEndpoint({
      log: this.log, stopping: () => this.stopping,
      create: (host, port) => new (lateModules().MetricsServer)({ host, port, registry: this.registry!, readiness: () => this.readiness(), log: this.log }),
    });
    this.reloader = new Reloader({
      configPath: opts.configPath, log: this.log, clock: this.clock,
      starting: () => this.starting, started: () => this.started, stopping: () => this.stopping,
      config: () => this.config, adopt: (next, at) => { this.config = next; this.configLoadedAt = at; },
      subs: () => this.subs, services: this.services, metricsEndpoint: this.metricsEndpoint, zone: this.zone, metrics: () => this.metrics,
      applyBackendVips: (vips) => this.applyBackendVips(vips), applyNow: (only) => this.applyNow(only),
      noteEvent: (kind, ev) => this.noteEvent(kind, ev), notifyStatus: () => this.notifyStatus(),
      afterReload: () => this.tuning.afterReload(),
    });
    this.view = new StatusView({
      config: () => ({ path: opts.configPath, desired: this.config, loadedAt: this.configLoadedAt, generation: this.reloader.generation, lastReload: this.reloader.lastReload }),
      started: () => this.started, stopping: () => this.stopping, subs: () => this.subs, services: this.services,
      topologyOf: (spec) => this.topologyOf(spec), serves: (key) => this.applies.serves(key), drift: () => this.drift,
      zone: () => this.zone.current, parentAddress: () => this.parentAddress, events: () => this.events.list(),
    });
    this.statusText = new StatusCache(() => new JsonText(JSON.stringify(this.statusDocument())), () => this.clock.now());
  }

  get currentConfig(): Desired | undefined { return this.config; }

  /** The agent this one took over from (--replace), to tell to finish once this one serves. */
  get replaced(): number | undefined { return this.predecessor; }

  /** Start once; a second call gets the same promise. */
  start(): Promise<void> {
    // A start that fails before its own clean-up (an invalid config, the lock) gives the compiler back too.
    this.starting ??= this.startOnce().catch((e: unknown) => { this.tuning.stopping(); throw e; });
    return this.starting;
  }

  private async startOnce(): Promise<void> {
    this.startBegan = this.clock.now();
    this.tuning.begin();
    // Nothing runs on the loop yet: a small file is parsed inline, without
    // the worker a reload uses (starting a worker costs the start more than the parse).
    const res = await loadConfigFileAsync(this.opts.configPath, { inlineUpTo: INLINE_PARSE_MAX_BYTES });
    if (!res.ok) {
      throw new LbError('LB_ERR_CONFIG_INVALID', `invalid configuration:\n${formatConfigErrors(res.errors, this.opts.configPath)}`);
    }
    const config = res.config;
    this.config = config;
    this.configLoadedAt = this.clock.wallNow();
    // The first reload takes the start's unchanged services again (their specs are the config's objects).
    this.reloader.seed(res.reuse);

    const store = new StateStore(config.stateDir);
    store.ensure();

    this.predecessor = await this.opts.replace?.(config);
    this.lock = new InstanceLock(config.stateDir);
    if (this.predecessor !== undefined) await this.lock.acquireWithin(REPLACE_LOCK_WAIT_MS);
    else this.lock.acquire();

    // The control socket answers from here on (a restart is part of every
    // upgrade): `status` shows every service "starting" until the
    // first reconcile has run, a reload waits for the start, a hand-over is
    // refused. After the lock: the socket path may be a running agent's.
    const ops: ControlTarget = {
      status: () => this.statusText.get(), reload: () => (this.opts.reload ?? (() => this.reload()))(),
      started: () => this.started, stopping: () => this.stopping, onHandover: this.opts.onHandover,
    };
    this.control = new ControlServer({ socketPath: config.control.socket, handler: (op, req) => controlOp(ops, op, req), log: this.log });
    try {
      await this.control.start();
    } catch (e) {
      this.control = undefined;
      this.lock.release();
      throw e;
    }

    const { Registry, processMetrics } = lateModules();
    const registry = new Registry();
    this.registry = registry;
    processMetrics(registry, 'lbagent_');
    // prom-client's *_total variants of these are gauges, which `promtool check
    // metrics` rejects ("non-counter metrics should not have _total suffix");
    // the per-type gauges without the suffix carry the same numbers.
    for (const n of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) registry.removeSingleMetric(`lbagent_${n}`);

    this.metrics = new (lateModules().DaemonMetrics)(registry, {
      serviceCount: () => this.services.size,
      eachReady: (visit) => this.view.eachReady(visit),
      eachVip: (visit) => {
        for (const rt of this.services.values()) {
          const vip = this.services.vipOf(rt.spec);
          if (vip) visit(rt.spec.name, rt.spec.namespace, vip, rt.spec.ipam, rt.spec.network ?? DEFAULT_NETWORK);
        }
      },
      // Policy any has no series: its selection is not made for a scrape.
      topology: () => (this.subs ? [...this.services.values()].filter((rt) => rt.spec.topology !== 'any').map((rt) => {
        const sel = this.topologyOf(rt.spec);
        return { name: rt.spec.name, namespace: rt.spec.namespace, policy: rt.spec.topology, set: sel.set, reason: sel.reason };
      }) : []),
    });

    try {
      if (config.metrics.listen !== '') await this.metricsEndpoint.start(config.metrics.listen);
      this.subs = await this.opts.buildSubsystems(config, { log: this.opts.log, registry, store, clock: this.clock, listenerStore: this.opts.listenerStore });
      await this.zone.read(config);
      this.subs.health.on('change', (key: string, address: string, up: boolean) => {
        this.noteEvent(up ? 'backend-up' : 'backend-down', { service: key, address, reason: this.backendReason(key, address, up) });
        this.health?.touch(key);
        this.scheduleHealthApply(key); this.health?.saveSoon();
      });
      // Every verdict, a first "down" too (no 'change': unknown was not healthy either), is in the next write.
      // A first "down" changes what status shows of the backend without a 'change'.
      this.subs.health.on('verdict', (key: string) => { this.health?.touch(key); this.statusText.changed(); });
      this.subs.failover?.on('change', (keys: string[]) => this.services.onFailoverChange(keys));
      this.subs.failover?.on('hand-back', () => this.scheduleApply());
      this.subs.failover?.on('reannounce', (keys: string[]) => this.services.reannounce(keys));
      // What other routers advertise is in status with no transition of this node's: the Master a Backup
      // follows, its priority, heardVips (the address a DHCP Backup would take over).
      this.subs.failover?.on('heard', () => this.statusText.changed());
      this.subs.failover?.on('priority', (e: import('../failover/gate').PriorityEvent) => {
        const why = e.to === 0 ? 'fault' : `priority ${e.to}${e.to === e.base ? ' (configured)' : ` (configured ${e.base})`}`;
        const router = e.network === DEFAULT_NETWORK ? `VRID ${e.vrid}` : `network ${e.network} VRID ${e.vrid}`;
        for (const service of e.services) this.noteEvent('vrrp-priority', { service, reason: `${router}: ${e.from === 0 ? 'fault' : `priority ${e.from}`} -> ${why}${e.reasons.length > 0 ? `: ${e.reasons.join('; ')}` : ''}` });
        this.notifyStatusSoon();
      });
      const owned = await this.subs.adoptOwned(config.services);
      if (owned.removed.length > 0) this.log.warn({ op: 'adopt', removed: owned.removed }, 'removed links/addresses left by an earlier run that the config does not want');
      if (owned.adopted.length > 0) this.log.info({ op: 'adopt', adopted: owned.adopted }, 'adopted links left by an earlier run');
      await this.applyBackendVips(config.backend.vips);

      // Crash-only start (docs/design.md "The data path outlives the process"): what an earlier run left
      // serving keeps serving. The VIPs still on the kernel and explained by
      // a lease or claim, and the health verdicts it reached, make the first
      // forwarding state - identical to the table the kernel already holds
      // after a restart, so nothing blinks - and only then do the sources
      // start, confirming (or disproving) each VIP in the background.
      const held = await this.subs.observeHeld(config.services);
      if (held.size > 0) this.log.info({ op: 'adopt', vips: Object.fromEntries(held) }, `serving ${held.size} VIP(s) left by an earlier run while they are confirmed`);
      this.health = new HealthStore(store, { services: () => this.configuredSpecs(), verdicts: (key) => this.verdictsOf(key) }, this.log);
      this.subs.health.seed?.(this.health.load());
      for (const s of config.services) this.services.add(s, held.get(s.key));
      this.subs.health.update(config.services);
      this.subs.health.start();
      this.services.updateFailover();
      await this.applyNow();
      // Listening sockets an earlier process kept that no service wants now.
      this.opts.listenerStore?.release();
      this.services.startSources();
      await this.watchKernel();
    } catch (e) {
      await this.stop().catch(() => undefined);
      throw e;
    }
    this.started = true;
    const cc = this.opts.codeCache;
    this.log.info({ op: 'start', services: config.services.length, dataplane: this.subs.dataplane.kind, parent: this.subs.parent.name, codeCache: cc?.state, ...(cc?.reason !== undefined ? { codeCacheReason: cc.reason } : {}) }, 'lb-agent started');
    this.tuning.started();
    this.opts.notify?.('READY=1');
    this.notifyStatus();
    // The start's garbage is collected once every VIP is in place: a
    // collection now would run in the middle of the sources' first steps (a
    // compacting gc() and malloc_trim, ~60 ms before 50 DHCP services could
    // create their links). With nothing to wait for, it runs now.
    this.settleStart();
  }

  /**
   * From here on, what someone else changes of the VIPs, links, tables and
   * sysctls the agent holds is put back (daemon/drift.ts). A watch that
   * cannot be opened is logged: the agent serves without it.
   */
  /**
   * A network's NIC has a new address: every network whose VRRP interface
   * it is sends its adverts from it (a failover.interface that is no
   * network's NIC keeps the address it had at start).
   */
  private followVrrpSource(ifname: string, address: string): void {
    if (!this.config || !this.subs) return;
    for (const n of networksOf(this.config)) {
      const vrrpIf = n.failover.interface ?? n.interface ?? (n.name === DEFAULT_NETWORK ? this.subs.parent.name : undefined);
      if (vrrpIf === ifname) this.subs.failover?.setSourceAddress?.(address, n.name);
    }
  }

  private async watchKernel(): Promise<void> {
    const guard = this.subs?.watchKernel?.({
      held: () => this.services.heldVips(),
      configured: () => this.config?.services ?? [],
      repairSource: (key, damage) => this.services.repairSource(key, damage),
      onRepair: (ev) => {
        const fight = ev.fight ? ` (${ev.fight.repairs} repairs in ${ev.fight.windowSeconds} s: another program keeps undoing it)` : '';
        this.noteEvent(ev.done !== undefined ? 'drift-repaired' : 'drift-backoff', { service: ev.service, reason: ev.done !== undefined ? `${ev.found}; ${ev.done}${fight}` : `${ev.found}; repair waits${fight}` });
        this.notifyStatusSoon();
      },
      onParentAddress: (address) => {
        this.noteEvent('parent-address', { address, reason: `${this.subs?.parent.name ?? 'the parent'} now has ${address ?? 'no IPv4 address'}` });
        const before = this.parentAddress ?? this.subs?.parent.address;
        this.parentAddress = address;
        void this.metricsEndpoint.followParentAddress(before, address);
        if (address !== undefined && this.subs) this.followVrrpSource(this.subs.parent.name, address);
        this.notifyStatusSoon();
      },
      onNetworkAddress: (ifname, address) => {
        this.noteEvent('parent-address', { address, reason: `${ifname} now has ${address ?? 'no IPv4 address'}` });
        if (address !== undefined) this.followVrrpSource(ifname, address);
        this.notifyStatusSoon();
      },
      resyncMs: () => (this.config?.reconcile.resyncInterval ?? 30) * 1000,
    });
    if (!guard) return;
    try {
      await guard.start();
      this.drift = guard;
    } catch (e) {
      guard.stop();
      this.log.error({ op: 'watch', err: errorMessage(e) }, 'cannot watch the kernel: changes made by others to the VIPs, links and tables are not repaired until a restart');
    }
  }

  private noteEvent(kind: StatusEventKind, ev: Omit<StatusEvent, 'at' | 'kind'>): void {
    this.statusText.changed();
    this.events.push({ at: isoTime(this.clock.wallNow()), kind, ...ev });
  }

  /** The checker's reason for a backend's new state, for the event history. */
  private backendReason(key: string, address: string, up: boolean): string {
    const b = this.subs?.health.status(key).find((x) => x.address === address);
    return [b?.reason ?? (up ? 'health check passed' : 'health check failed'), b?.takenOutBy ? `(${b.takenOutBy} check)` : undefined].filter(Boolean).join(' ');
  }

  /** Each configured service's spec, in config order (the health store's parts follow them). */
  private *configuredSpecs(): Iterable<ServiceSpec> {
    for (const rt of this.services.values()) yield rt.spec;
  }

  /** One service's backends that are up or down now, for the health store. */
  private verdictsOf(key: string): Record<string, 'up' | 'down'> {
    const states: Record<string, 'up' | 'down'> = {};
    for (const b of this.subs?.health.status(key) ?? []) if (b.state === 'up' || b.state === 'down') states[b.address] = b.state;
    return states;
  }

  /**
   * Every service's forwarding state, in config order. After a health
   * transition or a reload that replaced specs in place only (forwardDirty
   * holds keys; the runtimes' layout unchanged) only those services are
   * asked for theirs; every other position is the last list's object, which
   * is what the whole walk would hand over for it, as nothing it is built
   * from moved (normalizeStateFrom and the nft render find the changed ones
   * by identity).
   */
  private forwardState(): ForwardService[] {
    const subs = this.subs!;
    const zone = this.zone.current.zone;
    const dirty = this.forwardDirty;
    this.forwardDirty = new Set();
    const last = this.forwardLast;
    if (dirty !== 'all' && last !== undefined && last.layout === this.services.layout) {
      const out = last.list.slice();
      for (const key of dirty) {
        const i = last.at.get(key);
        const rt = this.services.get(key);
        if (i !== undefined && rt !== undefined) out[i] = this.forwardOf(rt, subs, zone);
      }
      this.forwardLast = { list: out, at: last.at, layout: last.layout };
      return out;
    }
    const out: ForwardService[] = [];
    const at = new Map<string, number>();
    for (const rt of this.services.values()) { at.set(rt.spec.key, out.length); out.push(this.forwardOf(rt, subs, zone)); }
    this.forwardLast = { list: out, at, layout: this.services.layout };
    return out;
  }

  /**
   * One service's forwarding state. A service whose inputs are the objects
   * of the last apply (its spec, the checker's healthy list, the zone, its
   * VIP, MAC, device and hand-back) keeps its object without anything being
   * built: a health transition among a thousand services builds one.
   */
  private forwardOf(rt: ServiceRuntime, subs: Subsystems, zone: string | undefined): ForwardService {
    const healthy = subs.health.healthy(rt.spec.key);
    const kept = this.forwardKept.get(rt);
    const from = this.forwardFrom.get(rt);
    if (kept !== undefined && from !== undefined && from.spec === rt.spec && from.healthy === healthy && from.zone === zone) {
      const primaryKey = rt.spec.primaryService ?? rt.spec.key;
      const parent = subs.parentOf?.(rt.spec) ?? subs.parent;
      if (kept.vip === (this.services.vipOf(rt.spec) ?? this.services.armedVip(rt.spec))
        && kept.handBack === subs.failover?.handBack?.(primaryKey)
        && kept.device === parent.name
        && (rt.spec.ipam === 'dhcp' || kept.vipMac === parent.mac)) return kept;
    }
    this.forwardFrom.set(rt, { spec: rt.spec, healthy, zone });
    const sel = lateModules().selectBackends(rt.spec.topology, zone, healthy);
    // a spill out of the zone (or back) is worth a line in the
    // journal; under topology any the set only follows health, which the
    // health checker already logs.
    const moved = rt.topology === undefined || rt.topology.set !== sel.set || rt.topology.reason !== sel.reason;
    if (moved && rt.spec.topology !== 'any' && (rt.topology !== undefined || sel.set !== 'none')) {
      this.log.info({ op: 'topology', service: rt.spec.key, policy: rt.spec.topology, set: sel.set, reason: sel.reason, zone }, sel.detail);
    }
    rt.topology = sel;
    const primaryKey = rt.spec.primaryService ?? rt.spec.key;
    const next: ForwardService & { readonly name: string; readonly namespace: string } = {
      key: rt.spec.key, name: rt.spec.name, namespace: rt.spec.namespace,
      vip: this.services.vipOf(rt.spec) ?? this.services.armedVip(rt.spec), ports: rt.spec.ports,
      // Zone-aware balancing happens here, once for both data paths: they
      // balance (by weight) over the set the policy chose.
      healthy: sel.backends, backends: rt.spec.backends,
      sourceIP: rt.spec.sourceIP, proxyProtocol: rt.spec.proxyProtocol,
      // The MAC frames for the VIP carry: a DHCP VIP's macvlan (derived from
      // the primary's key, one for both families), else its network's NIC's (pool VIPs live there).
      vipMac: rt.spec.ipam === 'dhcp' ? lateModules().macForService(linkKeyOf(primaryKey)) : (subs.parentOf?.(rt.spec) ?? subs.parent).mac,
      // Direct server return takes the VIP's frames in and sends them on by its network's NIC.
      device: (subs.parentOf?.(rt.spec) ?? subs.parent).name,
      handBack: subs.failover?.handBack?.(primaryKey),
    };
    // A service whose inputs are unchanged keeps its object: the data
    // path's caches (normalizeState, the nft render's parts) are keyed by
    // it, so a change costs the services that changed.
    if (kept !== undefined && lateModules().sameForwardService(kept, next)) return kept;
    this.forwardKept.set(rt, next);
    return next;
  }

  /** The backends a service may send new connections to now, under its topology policy. */
  private topologyOf(spec: ServiceSpec): TopologySelection {
    return lateModules().selectBackends(spec.topology, this.zone.current.zone, this.subs!.health.healthy(spec.key));
  }

  /** The labels file was rewritten: re-read the zone; a new one re-balances every zoned service at once. */
  private async labelsRewritten(): Promise<void> {
    // A reload in flight reads the file itself, with its own config.
    if (this.stopping || this.reloader.inFlight || !this.config || !this.subs) return;
    const before = await this.zone.read(this.config);
    const t = this.zone.current;
    if (t.zone === before.zone && t.region === before.region) return;
    this.noteEvent('zone-changed', { reason: `${placeOf(before)} -> ${placeOf(t)}: ${t.labelsFile} was rewritten${t.problem ? `; ${t.problem}` : ''}` });
    this.scheduleApply();
    this.notifyStatus();
  }

  /** The backend side of DSR: the `backend.vips` on lo. A failure is logged and shown in status, never fatal. */
  private async applyBackendVips(vips: readonly string[]): Promise<void> {
    try {
      await this.subs!.backend.apply(vips);
    } catch (e) {
      this.log.error({ op: 'backend', err: errorMessage(e) }, 'backend VIPs for direct server return could not be put in place');
    }
  }

  /** Coalesce bursts of changes into one dataplane transaction at a time (apply-loop.ts). */
  scheduleApply(): void {
    this.forwardDirty = 'all';
    if (this.stopping || !this.subs) return;
    this.applies.schedule();
  }

  /** An apply for a health transition of one service: the next forwarding state asks that service only (forwardState). */
  private scheduleHealthApply(key: string): void {
    if (this.forwardDirty !== 'all') this.forwardDirty.add(key);
    if (this.stopping || !this.subs) return;
    this.applies.schedule();
  }

  /**
   * Whether the next apply should wait for a start's address source still
   * acquiring (ApplyLoop batches up to START_APPLY_BATCH_MS): each table
   * write is an `nft` run, a fork of the agent and the child's CPU on the
   * cores the exchanges still under way need, so a start of many services
   * writes the table once after the last bind rather than once per bind.
   * Nothing waits once every VIP of the start is in the table
   * (startSettled), nor under VRRP, where sources start on an election and
   * a takeover's rules must not wait for another service.
   */
  private acquiringForBatch(): boolean {
    if (!this.started || this.startSettled || this.subs?.failover !== undefined) return false;
    return this.services.acquiring();
  }

  /**
   * Once, after the first apply that has every service's VIP in place: one
   * more collection (collectGarbage). The ARP probes or DHCP exchanges and
   * the applies of a start run after "lb-agent started", and their garbage
   * would otherwise stay committed until V8 next reaches its limit, maybe
   * never.
   */
  private settleStart(): void {
    if (this.startSettled || !this.started || this.stopping || !this.services.everyVipInPlace()) return;
    this.startSettled = true;
    // What a start cost, for the operator and the scale tests: its time
    // and what it sent to rtnetlink (reads of the parent are shared, so
    // the dumps do not grow with the services).
    this.log.info({ op: 'settled', services: this.services.size, ms: this.clock.now() - this.startBegan, netlink: this.subs?.netlinkCounts?.() }, 'every VIP of the start is in place');
    this.tuning.settled();
  }

  /** A data path transaction now, not batched: for every service, or for `only` these (a reload that replaced their specs in place). */
  private async applyNow(only?: Iterable<string>): Promise<void> {
    if (only === undefined) this.forwardDirty = 'all';
    else if (this.forwardDirty !== 'all') for (const key of only) this.forwardDirty.add(key);
    if (this.stopping || !this.subs) return;
    await this.applies.now();
  }

  /** SIGHUP (or `lb-agent reload`): one reload at a time, folded as reload.ts says. Never throws. */
  reload(): Promise<ReloadResult> {
    return this.reloader.reload();
  }

  /**
   * SIGTERM: withdraw everything announced, keep leases and claims, release
   * the lock. With `keep` (a planned restart: `lb-agent run --on-stop keep`,
   * as the unit runs it), the VIPs, macvlans and forwarding stay in place for
   * the next process and only this process goes; under VRRP a stop always
   * hands the VIPs over (another node takes them within Skew_Time).
   */
  async stop(opts: { keep?: boolean; linger?: Promise<unknown> } = {}): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.statusText.changed();
    this.opts.notify?.('STOPPING=1');
    this.drift?.stop();
    this.tuning.stopping();
    // A reload in flight finishes its current step (each checks `stopping`) before anything is withdrawn.
    if (this.reloader.inFlight) await this.reloader.inFlight.catch(() => undefined);
    // Where a stop's time goes, logged with the last line: each step's wall
    // ms (every service's source stop counted under "sources", the longest of them).
    const stepMs: Record<string, number> = {};
    const stopStart = this.clock.now();
    const step = async (what: string, fn: () => unknown): Promise<void> => {
      const t = this.clock.now();
      try { await fn(); } catch (e) { this.log.error({ op: 'stop', step: what, err: errorMessage(e) }, `stop: ${what} failed`); }
      const k = what.startsWith('service ') ? 'sources' : what;
      stepMs[k] = Math.max(stepMs[k] ?? 0, this.clock.now() - t);
    };
    await step('apply loop', () => this.applies.stop());
    const netlinkBefore = this.subs?.netlinkCounts?.();
    let netlinkSent: Record<string, number> | undefined;
    // What the stop sent to rtnetlink: batches, not a round trip per VIP (logged with the last line).
    const noteNetlink = (): void => {
      const now = this.subs?.netlinkCounts?.();
      if (netlinkBefore && now) netlinkSent = Object.fromEntries(Object.entries(now).map(([k, v]) => [k, v - netlinkBefore[k as keyof typeof now]]));
    };

    this.zone.stop();
    await this.health?.flush();
    await step('control socket', () => this.control?.stop());
    const keep = opts.keep === true && this.subs !== undefined && this.subs.failover === undefined;
    if (opts.keep && !keep && this.subs?.failover) this.log.info({ op: 'stop' }, 'VRRP: a stop hands the VIPs over to another node (not kept)');
    if (keep && this.subs) {
      const subs = this.subs;
      await this.services.stopSources({ release: false, keep: true }, step);
      await step('health', () => subs.health.stop());
      if (opts.linger) {
        // A hand-over (a successor's --replace): the successor may start
        // now - lock, metrics port and control socket are free, the sources
        // stopped - while the proxy goes on accepting on the sockets both
        // processes hold, until the successor serves from them.
        await step('metrics', () => this.metricsEndpoint.stop());
        this.lock?.release();
        this.log.info({ op: 'stop' }, 'handing over: the successor may start; still accepting until it serves');
        await opts.linger;
      }
      await step('dataplane', () => subs.dataplane.stop({ keep: true }));
      // The backend VIPs on lo stay too: a restart must not refuse a DSR flow.
      noteNetlink();
      await step('subsystems', () => subs.close());
    } else if (this.subs) {
      const subs = this.subs;
      const stopSources = (): Promise<void> => this.services.stopSources({ release: false }, step);
      if (subs.failover) {
        // Withdraw the VIPs first, then resign with priority 0: the Backup
        // that takes over after Skew_Time probes each VIP (RFC 5227) and
        // must find it free, or it would pick another address.
        await stopSources();
        await step('failover', () => subs.failover?.stop());
        await step('dataplane', () => subs.dataplane.stop());
      } else {
        await step('dataplane', () => subs.dataplane.stop());
        await stopSources();
      }
      await step('health', () => subs.health.stop());
      await step('backend VIPs', () => subs.backend.withdraw());
      noteNetlink();
      await step('subsystems', () => subs.close());
    }
    await step('metrics', () => this.metricsEndpoint.stop());
    this.lock?.release();
    this.log.info({ op: 'stop', keep, ms: this.clock.now() - stopStart, steps: stepMs, vipsWithdrawn: this.services.withdrawnAtStop, ...(netlinkSent ? { netlink: netlinkSent } : {}) }, keep ? 'lb-agent stopped; VIPs, links and forwarding left serving for the next start' : 'lb-agent stopped');
    // A start that never settled (a VIP never came) has not written it yet; after the lock, off the next start's path.
    this.tuning.saveCodeCache();
  }

  readiness(): Readiness {
    return this.view.readiness();
  }

  serviceStatuses(): ServiceStatus[] {
    return this.view.serviceStatuses();
  }

  statusDocument(): StatusDocument {
    return this.view.statusDocument();
  }

  /**
   * notifyStatus() once the events of this turn of the loop are handled: a
   * source's VIP gained or lost. Each line reads every service's status:
   * many services binding in one turn send one line, not one each.
   */
  private notifyStatusSoon(): void {
    this.statusText.changed();
    if (!this.opts.notify || this.statusNotice !== undefined) return;
    this.statusNotice = setImmediate(() => { this.statusNotice = undefined; this.notifyStatus(); });
  }

  private notifyStatus(): void {
    this.statusText.changed();
    if (this.statusNotice !== undefined) { clearImmediate(this.statusNotice); this.statusNotice = undefined; }
    if (!this.opts.notify) return;
    const line = this.view.statusLine();
    if (line !== undefined) this.opts.notify(line);
  }
}

export { VERSION };
export type { StatusEvent, StatusEventKind } from './events';
export type { ReloadResult, ServiceStatus, StatusDocument } from './status';
export { INTERRUPTION_KINDS, interruptionKind } from './status';
