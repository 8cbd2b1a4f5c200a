// The daemon's life cycle: load and freeze the config, take the instance
// lock, start modules in order (state, metrics, subsystems, services,
// control socket), reconcile, and stop them in reverse. SIGHUP reloads by
// diff (only changed services are touched; a bad file changes nothing);
// SIGTERM withdraws everything the agent announced without releasing leases.
import { EventEmitter } from 'node:events';
import { Registry, Gauge, Counter, collectDefaultMetrics } from 'prom-client';
import { formatConfigErrors, parseListen } from '../config/load';
import { loadConfigFileAsync } from '../config/load-async';
import { diffConfigs, reloadErrors } from '../config/diff';
import type { Desired, ServiceSpec } from '../config/types';
import { LbError, errorMessage } from '../errors';
import type { Logger } from '../log';
import { StateStore } from '../state/store';
import { InstanceLock } from './lock';
import { MetricsServer, Readiness } from '../metrics/server';
import { ControlServer } from '../control/server';
import type { AddressSource } from '../source';
import type { Subsystems, ForwardService } from './subsystems';
import type { Clock } from '../clock';
import { realClock } from '../clock';
import { VERSION } from '../version';

export interface DaemonOptions {
  configPath: string;
  log: Logger;
  clock?: Clock;
  /** Builds the real subsystems (wiring.ts); injected so the life cycle can be tested apart. */
  buildSubsystems: (config: Desired, ctx: { log: Logger; registry: Registry; store: StateStore; clock: Clock }) => Promise<Subsystems>;
  /** sd_notify-style hook: READY=1, STATUS=..., STOPPING=1. */
  notify?: (msg: string) => void;
}

interface ServiceRuntime {
  spec: ServiceSpec;
  source: AddressSource | undefined;
  /** When this runtime was (re)created: a reload that keeps a service keeps this. */
  startedAt: number;
  /** VRRP gating of the source, one start/stop at a time (gateSource). Never rejects. */
  gate: Promise<void>;
  gatePending: boolean;
}

export class Daemon extends EventEmitter {
  private readonly opts: DaemonOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private config: Desired | undefined;
  private configLoadedAt = 0;
  private generation = 0;
  private lock: InstanceLock | undefined;
  private metricsServer: MetricsServer | undefined;
  private control: ControlServer | undefined;
  private subs: Subsystems | undefined;
  private readonly runtimes = new Map<string, ServiceRuntime>();
  private applying: Promise<void> | undefined;
  private applyAgain = false;
  private stopping = false;
  private lastReload: { at: number; ok: boolean; message: string } | undefined;
  private metrics: { reloads: Counter; services: Gauge; ready: Gauge; vipInfo: Gauge } | undefined;

  constructor(opts: DaemonOptions) {
    super();
    this.opts = opts;
    this.log = opts.log.child({ module: 'daemon' });
    this.clock = opts.clock ?? realClock;
  }

  get currentConfig(): Desired | undefined { return this.config; }

  async start(): Promise<void> {
    const res = await loadConfigFileAsync(this.opts.configPath);
    if (!res.ok) {
      throw new LbError('LB_ERR_CONFIG_INVALID', `invalid configuration:\n${formatConfigErrors(res.errors, this.opts.configPath)}`);
    }
    const config = res.config;
    this.config = config;
    this.configLoadedAt = this.clock.wallNow();
    this.generation = 1;

    const store = new StateStore(config.stateDir);
    store.ensure();
    this.lock = new InstanceLock(config.stateDir);
    this.lock.acquire();

    const registry = new Registry();
    collectDefaultMetrics({ register: registry, prefix: 'lbagent_' });
    // prom-client's *_total variants of these are gauges, which `promtool check
    // metrics` rejects ("non-counter metrics should not have _total suffix");
    // the per-type gauges without the suffix carry the same numbers.
    for (const n of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) registry.removeSingleMetric(`lbagent_${n}`);

    this.metrics = {
      reloads: new Counter({ name: 'lbagent_config_reloads_total', help: 'Config reloads by result.', labelNames: ['result'], registers: [registry] }),
      services: new Gauge({ name: 'lbagent_services', help: 'Configured services.', registers: [registry], collect: () => { this.metrics!.services.set(this.runtimes.size); } }),
      ready: new Gauge({ name: 'lbagent_service_ready', help: '1 when the service has a VIP and a healthy backend.', labelNames: ['service', 'namespace'], registers: [registry], collect: () => this.collectReady() }),
      // Every service this node serves, whatever gives its VIP (DHCP, pool,
      // or a primary's, for Share IP): set at scrape time from status, so a
      // pool source's own updates of the same series cannot go stale.
      vipInfo: new Gauge({ name: 'lbagent_service_vip_info', help: 'The VIP a service is served on by this node (1 while served).', labelNames: ['service', 'namespace', 'vip', 'ipam'], registers: [registry], collect: () => this.collectVipInfo() }),
    };

    try {
      if (config.metrics.listen !== '') {
        const l = parseListen(config.metrics.listen)!;
        this.metricsServer = new MetricsServer({ host: l.host, port: l.port, registry, readiness: () => this.readiness(), log: this.log });
        await this.metricsServer.start();
      }
      this.subs = await this.opts.buildSubsystems(config, { log: this.opts.log, registry, store, clock: this.clock });
      this.subs.health.on('change', () => this.scheduleApply());
      this.subs.failover?.on('change', (keys: string[]) => this.onFailoverChange(keys));
      this.subs.failover?.on('reannounce', (keys: string[]) => {
        for (const k of keys) if (this.holds(k)) this.runtimes.get(k)?.source?.reannounce?.();
      });
      const owned = await this.subs.adoptOwned(config.services);
      if (owned.removed.length > 0) this.log.warn({ op: 'adopt', removed: owned.removed }, 'removed links/addresses left by an earlier run that the config does not want');
      if (owned.adopted.length > 0) this.log.info({ op: 'adopt', adopted: owned.adopted }, 'adopted links left by an earlier run');

      for (const s of config.services) this.addService(s);
      this.subs.health.update(config.services);
      this.subs.health.start();
      this.updateFailover();
      this.startSources();
      await this.applyNow();

      this.control = new ControlServer({ socketPath: config.control.socket, handler: (op) => this.handleControl(op), log: this.log });
      await this.control.start();
    } catch (e) {
      await this.stop().catch(() => undefined);
      throw e;
    }
    this.log.info({ op: 'start', services: config.services.length, dataplane: this.subs.dataplane.kind, parent: this.subs.parent.name }, 'lb-agent started');
    this.opts.notify?.('READY=1');
    this.notifyStatus();
  }

  private addService(spec: ServiceSpec): void {
    const rt: ServiceRuntime = { spec, source: undefined, startedAt: this.clock.wallNow(), gate: Promise.resolve(), gatePending: false };
    if (spec.primaryService === undefined) {
      const source = this.subs!.createSource(spec);
      source.on('vip', () => { this.scheduleApply(); this.notifyStatus(); });
      source.on('lost', (reason: string) => { this.log.warn({ op: 'vip-lost', service: spec.key, reason }, 'VIP withdrawn'); this.scheduleApply(); this.notifyStatus(); });
      source.on('status', () => this.scheduleApply());
      rt.source = source;
    }
    this.runtimes.set(spec.key, rt);
  }

  /** Start sources this node should hold (all, or the VRRP Master's). */
  private startSources(): void {
    for (const rt of this.runtimes.values()) {
      if (!rt.source) continue;
      if (this.subs?.failover) this.gateSource(rt.spec.key);
      else rt.source.start();
    }
  }

  private holds(key: string): boolean {
    const f = this.subs?.failover;
    return f ? f.isMaster(key) : true;
  }

  private updateFailover(): void {
    const f = this.subs?.failover;
    if (!f) return;
    const primaries = [...this.runtimes.values()].filter((r) => r.source).map((r) => r.spec);
    f.update(primaries, (key) => this.runtimes.get(key)?.source?.status().vip?.address);
  }

  private onFailoverChange(keys: string[]): void {
    for (const key of keys) this.gateSource(key);
    this.scheduleApply();
  }

  /**
   * Start or stop a service's source to match VRRP mastership, one step at a
   * time per service: a withdrawal must finish before the next start (a
   * source's stop() is asynchronous, and a start during it races the link
   * and address it is removing). A step reads holds() when it runs, so a
   * flap that queues behind a running step collapses into one step.
   */
  private gateSource(key: string): void {
    const rt = this.runtimes.get(key);
    if (!rt?.source || rt.gatePending) return;
    rt.gatePending = true;
    rt.gate = rt.gate.then(async () => {
      rt.gatePending = false;
      const source = rt.source;
      if (!source || this.stopping || this.runtimes.get(key) !== rt) return;
      const running = source.status().state !== 'idle';
      if (this.holds(key)) {
        if (!running) {
          this.log.info({ op: 'failover', service: key }, 'this node is Master: taking the VIP');
          // Rules first (armedVip), then the address: a takeover claims the
          // VIP without an ARP probe, so it could otherwise come up before
          // the rules and refuse the first clients.
          if (this.armedVip(rt.spec)) await this.applyNow();
        }
        source.start();
      } else {
        if (running) this.log.info({ op: 'failover', service: key }, 'this node is Backup: withdrawing the VIP (lease and claim kept)');
        // Also when idle: the first Backup after a crash removes the service
        // macvlan an earlier run left (adopted at start) with its VIP.
        await source.stop({ release: false });
      }
    }).catch((e) => this.log.error({ op: 'failover', service: key, err: errorMessage(e) }, 'starting or withdrawing the VIP failed'));
  }

  /**
   * With VRRP and the kernel data path, a Master's rules for its VIP go in
   * before the address comes up, so the first client that a gratuitous ARP
   * sends our way is forwarded, not refused by a node that holds the address
   * but has no rules yet. The rules are inert until the address is ours (no
   * packet for it reaches us before). The proxy cannot listen on an address
   * it does not have, so it waits for the VIP.
   */
  private armedVip(spec: ServiceSpec): string | undefined {
    const f = this.subs?.failover;
    if (!f?.knownVip || this.subs?.dataplane.kind !== 'kernel') return undefined;
    const primaryKey = spec.primaryService ?? spec.key;
    return f.isMaster(primaryKey) ? f.knownVip(primaryKey) : undefined;
  }

  /** The VIP a service is served on by this node, if any. */
  private vipOf(spec: ServiceSpec): string | undefined {
    const primaryKey = spec.primaryService ?? spec.key;
    const prt = this.runtimes.get(primaryKey);
    const st = prt?.source?.status();
    if (!st || (st.state !== 'bound' && st.state !== 'renewing')) return undefined;
    return st.vip?.address;
  }

  private forwardState(): ForwardService[] {
    const subs = this.subs!;
    return [...this.runtimes.values()].map((rt) => ({
      key: rt.spec.key, name: rt.spec.name, namespace: rt.spec.namespace,
      vip: this.vipOf(rt.spec) ?? this.armedVip(rt.spec), ports: rt.spec.ports,
      healthy: subs.health.healthy(rt.spec.key), backends: rt.spec.backends,
    }));
  }

  /** Coalesce bursts of changes into one dataplane transaction at a time. */
  scheduleApply(): void {
    if (this.stopping || !this.subs) return;
    if (this.applying) { this.applyAgain = true; return; }
    this.applying = (async () => {
      do {
        this.applyAgain = false;
        await new Promise((r) => setImmediate(r));
        if (this.stopping) break;
        try {
          await this.subs!.dataplane.apply(this.forwardState());
        } catch (e) {
          this.log.error({ op: 'apply', err: errorMessage(e) }, 'dataplane update failed; will retry on the next change');
        }
      } while (this.applyAgain && !this.stopping);
    })().finally(() => { this.applying = undefined; });
  }

  private async applyNow(): Promise<void> {
    this.scheduleApply();
    while (this.applying) await this.applying;
  }

  /** SIGHUP: reload by diff. Returns what happened; never throws. */
  async reload(): Promise<{ ok: boolean; message: string }> {
    const old = this.config;
    if (!old || !this.subs || this.stopping) return { ok: false, message: 'not running' };
    const res = await loadConfigFileAsync(this.opts.configPath);
    const at = this.clock.wallNow();
    if (!res.ok) {
      const message = `reload rejected, running config kept:\n${formatConfigErrors(res.errors, this.opts.configPath)}`;
      this.log.error({ op: 'reload', errors: res.errors }, message);
      this.metrics?.reloads.inc({ result: 'rejected' });
      this.lastReload = { at, ok: false, message };
      return { ok: false, message };
    }
    const rules = reloadErrors(old, res.config);
    if (rules.length > 0) {
      const message = `reload rejected, running config kept:\n${formatConfigErrors(rules, this.opts.configPath)}`;
      this.log.error({ op: 'reload', errors: rules }, message);
      this.metrics?.reloads.inc({ result: 'rejected' });
      this.lastReload = { at, ok: false, message };
      return { ok: false, message };
    }
    const next = res.config;
    const d = diffConfigs(old, next);
    this.subs.reconfigure(next);
    this.config = next;
    this.configLoadedAt = at;
    // Removed: secondaries first (a primary never goes while one shares it),
    // then primaries, releasing their lease or claim.
    const removed = [...d.removed].sort((a, b) => Number(b.primaryService !== undefined) - Number(a.primaryService !== undefined));
    for (const s of removed) {
      const rt = this.runtimes.get(s.key);
      this.runtimes.delete(s.key);
      if (rt) await rt.gate; // a VRRP start/stop in flight finishes first
      if (rt?.source) await rt.source.stop({ release: true }).catch((e) => this.log.error({ op: 'reload', service: s.key, err: errorMessage(e) }, 'release failed'));
    }
    for (const [o, n] of d.changed) {
      const rt = this.runtimes.get(n.key)!;
      const addressChanged = o.ipam !== n.ipam || o.loadBalancerIP !== n.loadBalancerIP || o.primaryService !== n.primaryService || o.vrid !== n.vrid || o.priority !== n.priority;
      if (addressChanged) {
        await rt.gate;
        if (rt.source) await rt.source.stop({ release: o.loadBalancerIP !== n.loadBalancerIP }).catch(() => undefined);
        this.runtimes.delete(n.key);
        this.addService(n);
      } else {
        rt.spec = n;
        rt.startedAt = this.clock.wallNow();
      }
    }
    for (const s of d.added) this.addService(s);
    // Keep config order for status.
    const order = new Map(next.services.map((s, i) => [s.key, i]));
    const sorted = [...this.runtimes.entries()].sort((a, b) => (order.get(a[0]) ?? 0) - (order.get(b[0]) ?? 0));
    this.runtimes.clear();
    for (const [k, v] of sorted) this.runtimes.set(k, v);

    this.subs.health.update(next.services);
    this.updateFailover();
    this.startSources();
    await this.applyNow();
    const message = `reloaded: ${d.added.length} added, ${d.removed.length} removed, ${d.changed.length} changed, ${d.unchanged.length} unchanged${d.globals.length ? `; changed sections: ${d.globals.join(', ')}` : ''}`;
    this.log.info({ op: 'reload', added: d.added.map((s) => s.key), removed: d.removed.map((s) => s.key), changed: d.changed.map(([, n]) => n.key), globals: d.globals }, message);
    if (d.globals.some((g) => !['pools', 'arp', 'dhcp'].includes(g))) {
      this.log.warn({ op: 'reload', sections: d.globals }, 'some changed sections take effect at the next restart');
    }
    this.metrics?.reloads.inc({ result: 'applied' });
    // Published together, once the new config is applied: a reader never sees
    // the new generation with the previous reload's verdict.
    this.generation++;
    this.lastReload = { at, ok: true, message };
    this.notifyStatus();
    return { ok: true, message };
  }

  /** SIGTERM: withdraw everything announced, keep leases and claims, release the lock. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.opts.notify?.('STOPPING=1');
    const step = async (what: string, fn: () => Promise<unknown> | unknown): Promise<void> => {
      try { await fn(); } catch (e) { this.log.error({ op: 'stop', step: what, err: errorMessage(e) }, `stop: ${what} failed`); }
    };
    if (this.applying) await this.applying.catch(() => undefined);
    await step('control socket', () => this.control?.stop());
    if (this.subs) {
      const subs = this.subs;
      const stopSources = async (): Promise<void> => {
        await Promise.all([...this.runtimes.values()].map((rt) => step(`service ${rt.spec.key}`, async () => {
          await rt.gate;
          await rt.source?.stop({ release: false });
        })));
      };
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
      await step('subsystems', () => subs.close());
    }
    await step('metrics', () => this.metricsServer?.stop());
    this.lock?.release();
    this.log.info({ op: 'stop' }, 'lb-agent stopped');
  }

  private collectReady(): void {
    const g = this.metrics!.ready;
    g.reset();
    for (const s of this.serviceStatuses()) g.set({ service: s.name, namespace: s.namespace }, s.ready ? 1 : 0);
  }

  private collectVipInfo(): void {
    const g = this.metrics!.vipInfo;
    g.reset();
    for (const rt of this.runtimes.values()) {
      const vip = this.vipOf(rt.spec);
      if (vip) g.set({ service: rt.spec.name, namespace: rt.spec.namespace, vip, ipam: rt.spec.ipam }, 1);
    }
  }

  readiness(): Readiness {
    const notReady = this.serviceStatuses().filter((s) => !s.ready).map((s) => `${s.key}: ${s.reason ?? s.state}`);
    return { ready: notReady.length === 0 && !this.stopping && this.subs !== undefined, notReady };
  }

  serviceStatuses(): ServiceStatus[] {
    const subs = this.subs;
    if (!subs) return [];
    return [...this.runtimes.values()].map((rt) => {
      const spec = rt.spec;
      const primaryKey = spec.primaryService ?? spec.key;
      const src = this.runtimes.get(primaryKey)?.source?.status();
      const backends = subs.health.status(spec.key);
      const healthy = subs.health.healthy(spec.key);
      const failover = subs.failover?.status(primaryKey);
      const holds = this.holds(primaryKey);
      const vip = this.vipOf(spec);
      let state: string;
      let reason: string | undefined;
      let ready: boolean;
      if (!holds) {
        state = 'backup';
        reason = failover?.handoverUntil !== undefined
          ? `VRRP Master by preemption: taking the VIP once the previous Master has withdrawn it (by ${String(failover.handoverUntil)})`
          : `VIP held by the VRRP Master${failover?.master ? ` ${String(failover.master)}` : ''}`;
        ready = true;
      } else if (!vip) {
        state = src?.state ?? 'pending';
        reason = src?.reason ?? (spec.primaryService ? `waiting for the VIP of ${spec.primaryService}` : 'no VIP yet');
        ready = false;
      } else if (spec.backends.length === 0) {
        state = 'serving'; reason = 'no backends configured'; ready = false;
      } else if (healthy.length === 0) {
        state = 'serving'; reason = 'no healthy backend: new connections are refused'; ready = false;
      } else {
        state = 'serving'; reason = undefined; ready = true;
      }
      return {
        key: spec.key, name: spec.name, namespace: spec.namespace, ipam: spec.ipam,
        primaryService: spec.primaryService, vip: vip ?? src?.vip?.address, interface: src?.ifname, mac: src?.mac,
        state, reason, ready, startedAt: rt.startedAt,
        ports: spec.ports.map((p) => `${p.port}/${p.protocol}->${p.targetPort}`),
        source: src ? { state: src.state, reason: src.reason, ...src.details } : undefined,
        failover,
        healthyBackends: healthy.length,
        backends,
      };
    });
  }

  statusDocument(): StatusDocument {
    const c = this.config!;
    return {
      version: VERSION,
      pid: process.pid,
      node: { name: c.node.name, interface: this.subs?.parent.name, address: this.subs?.parent.address, priority: c.node.priority },
      config: { path: this.opts.configPath, loadedAt: new Date(this.configLoadedAt).toISOString(), generation: this.generation, lastReload: this.lastReload },
      dataplane: this.subs ? { kind: this.subs.dataplane.kind, reason: this.subs.dataplane.reason } : undefined,
      failover: { mode: c.failover.mode },
      ready: this.readiness().ready,
      services: this.serviceStatuses(),
    };
  }

  private handleControl(op: string): unknown {
    if (op === 'status') return this.statusDocument();
    if (op === 'ping') return 'pong';
    throw new Error(`unknown op ${JSON.stringify(op)} (known: status, ping)`);
  }

  private notifyStatus(): void {
    if (!this.opts.notify || !this.subs) return;
    const st = this.serviceStatuses();
    const serving = st.filter((s) => s.state === 'serving').length;
    const ready = st.filter((s) => s.ready).length;
    this.opts.notify(`STATUS=${st.length} services, ${serving} serving, ${ready} ready; dataplane ${this.subs.dataplane.kind}`);
  }
}

export { VERSION };

export interface ServiceStatus {
  key: string; name: string; namespace: string; ipam: string; primaryService: string | undefined;
  vip: string | undefined; interface: string | undefined; mac: string | undefined;
  state: string; reason: string | undefined; ready: boolean; startedAt: number;
  ports: string[]; source: Record<string, unknown> | undefined; failover: Record<string, unknown> | undefined;
  healthyBackends: number;
  backends: readonly { address: string; port: number; state: string; since: number | undefined; reason: string | undefined; takenOutBy: string | undefined }[];
}

export interface StatusDocument {
  version: string; pid: number;
  node: { name: string; interface: string | undefined; address: string | undefined; priority: number };
  config: { path: string; loadedAt: string; generation: number; lastReload: { at: number; ok: boolean; message: string } | undefined };
  dataplane: { kind: string; reason: string } | undefined;
  failover: { mode: string };
  ready: boolean;
  services: ServiceStatus[];
}
