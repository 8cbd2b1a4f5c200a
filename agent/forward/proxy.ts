// forward/ layer: the userspace data path (`dataplane: proxy`) as the main
// thread runs it: the fallback where nftables is unavailable, and the place
// for what the kernel path cannot do (connect retries, passive health
// reports, per-connection timeouts, the PROXY protocol). It owns the
// listening sockets on VIP:port, the file descriptor store they live in
// across restarts, the shared counters and the metrics; the relaying itself
// runs in engines (proxy-engine.ts), one per worker thread.
//
// Workers. `proxy.workers` (default: one per CPU) worker threads each run an
// engine on an event loop of its own; the main thread keeps control, health
// checks and state and never carries a byte. Threads, not processes: a
// worker thread costs ~10 MiB where a Node process costs ~40, counters are
// shared memory (tallies.ts: a scrape reads them without asking a worker),
// and descriptors are the process's, so a listening socket made here is
// served there by number.
//
// Listening sockets. Each TCP VIP:port is a SO_REUSEPORT group of one
// socket per worker (made by the addon: Node 20's net has no reusePort), so
// the kernel spreads new connections over the workers by hash. The main
// thread keeps one descriptor of every socket and gives each worker a
// duplicate of the sockets it serves (a worker closes its own freely; a
// replacement worker gets fresh duplicates). Every socket of a group goes
// into the ListenerStore (systemd's fd store) under the listener's name:
// closing one socket of a group resets the connections queued on it, so on
// a planned restart none is closed - all wait in the store, keep queueing,
// and the next process takes them all back (ListenerStore.take() returns
// them one by one) and adds sockets if it runs more workers, or serves
// several per worker if fewer. A socket an older lb-agent left without
// SO_REUSEPORT cannot be joined: it is served by every worker through
// duplicates (one accept queue, shared) until a stop empties the store.
// A reload touches only the listeners that change.
//
// UDP ports are served by one engine (the first worker): a client's session
// needs one home, and UDP is no throughput target here.
//
// Passive health: engines report every backend connect; a worker sends them
// in batches (one per turn of its event loop) and this thread hands them to onConnectResult in
// order. Draining: a new healthy set reaches every engine by message; a
// backend that left gets no new connections, its open ones run to their end.
import * as os from 'node:os';
import * as path from 'node:path';
import * as fs from 'node:fs';
import { Worker } from 'node:worker_threads';
import type { Registry } from 'prom-client';
import type { PortSpec, ProxyConfig } from '../config/types';
import { realClock, type Clock } from '../clock';
import { LbError, errorMessage } from '../errors';
import { silentLogger, type Logger } from '../log';
import { addressToBytes, parseAddress } from '../address';
import {
  flowId, normalizeState, portLabel,
  type ConnectResultCallback, type Dataplane, type ListenerStore, type FlowStats, type ForwardState, type ForwardStats, type UdpFlowsEnded,
} from './dataplane';
import { ForwardMetrics } from './metrics';
import { SerialQueue } from '../serial';
import { effectiveMaxConnections, readNofile } from './capacity';
import {
  ENGINE_ACCEPTED, ENGINE_OPEN, ENGINE_PP_ALONE, ENGINE_PP_WITH_DATA, FLOW_BYTES_TO_BACKEND, FLOW_BYTES_TO_CLIENT,
  FLOW_CONNECTIONS, FLOW_CONNECT_FAILURES, LISTENER_REFUSED, LISTENER_UDP_ENDED, LISTENER_UDP_SESSIONS, OWN_LIMIT_KEYS, TallyTable, ownLimitField,
} from './tallies';
import type { EngineApply, EngineBackend, EngineListenerSpec } from './proxy-engine';
import { LEVELS, type FromWorker, type ToWorker, type WorkerStart } from './proxy-worker';

export interface ProxyDataplaneOptions {
  readonly config: ProxyConfig;
  readonly registry?: Registry;
  readonly log?: Logger;
  /** Why this path was chosen (selectDataplane's reason), for the info metric. */
  readonly reason?: string;
  /** Passive health: every connect to a backend reports here. */
  readonly onConnectResult?: ConnectResultCallback;
  readonly clock?: Clock;
  /** Seconds without traffic before a UDP session is closed (default 30: conntrack's UDP timeout). */
  readonly udpIdleTimeout?: number;
  /** Bound on concurrent UDP sessions per VIP:port (default 16384); past it new clients are dropped. */
  readonly maxUdpSessions?: number;
  /** Listen backlog (default 1024). */
  readonly backlog?: number;
  /** Listening sockets that outlive the process (systemd's fd store); none by default. */
  readonly listenerStore?: ListenerStore;
  /** With stop({ keep }): how long open connections may take to finish before the process lets go (default 5 s). */
  readonly drainTimeoutMs?: number;
  /** Proxied TCP connections at once, over all listeners and workers. Default: capacity.ts from the descriptor limit. */
  readonly maxConnections?: number;
  /** Worker threads; default config.workers, else one per CPU. */
  readonly workers?: number;
  /** Run the one engine in this thread instead of worker threads (`workers` is then 1); tests use it to share their event loop with the engine. */
  readonly inline?: boolean;
}

/** How often the main thread drains the workers' passive-health rings while they report (a failure wakes it at once). */
const REPORT_DRAIN_MS = 50;
/**
 * How far apart the drains grow while the rings stay empty (doubling from
 * REPORT_DRAIN_MS): an idle agent's main thread woke 20 times a second for
 * them. A ring holds REPORT_RING (16,384) results, 0.5 s of 32k connections
 * a second on one worker, and a full ring sends its results by message.
 */
const REPORT_DRAIN_IDLE_MS = 500;

/** The delay before the next drain of the passive-health rings: REPORT_DRAIN_MS after one that found results, else twice the last, up to REPORT_DRAIN_IDLE_MS. */
export function nextReportDrainMs(lastMs: number, drained: number): number {
  return drained > 0 ? REPORT_DRAIN_MS : Math.min(Math.max(lastMs, REPORT_DRAIN_MS) * 2, REPORT_DRAIN_IDLE_MS);
}
/** Worker replacements allowed per minute before the proxy gives a dead worker's sockets to the others. */
const RESPAWNS_PER_MINUTE = 5;
/** How long a worker may take to answer an apply or a stop before it is counted as failed. */
const WORKER_REPLY_MS = 10_000;

/** One TCP VIP:port: the sockets of its SO_REUSEPORT group (or the one shared socket an older lb-agent left). */
interface Group {
  readonly id: string;
  readonly vip: string;
  readonly port: number;
  readonly fds: number[];
  /** A socket without SO_REUSEPORT: every engine serves it (through a duplicate). */
  readonly shared: boolean;
  boundPort: number;
  /** Socket indexes each engine has been given (and holds a duplicate of). */
  readonly given: Map<number, Set<number>>;
}

/** Where the relaying runs: an engine in this thread or in a worker. */
interface EngineHost {
  readonly index: number;
  alive: boolean;
  apply(a: EngineApply): Promise<{ failures: string[]; generation: number; udpPorts: Record<string, number> }>;
  reconfigure(cfg: ProxyConfig): void;
  stop(keep: boolean, drainMs: number): Promise<{ open: number; unfinished: number }>;
  terminate(): Promise<void>;
}

export class ProxyDataplane implements Dataplane {
  readonly kind = 'proxy' as const;
  private readonly log: Logger;
  private readonly clock: Clock;
  private cfg: ProxyConfig;
  private readonly onConnectResult: ConnectResultCallback;
  private readonly udpIdleMs: number;
  private readonly maxUdpSessions: number;
  private readonly backlog: number;
  private readonly store: ListenerStore | undefined;
  private readonly drainTimeoutMs: number;
  private readonly metrics: ForwardMetrics | undefined;
  private readonly tallies: TallyTable;
  private readonly hosts: EngineHost[] = [];
  private readonly started: Promise<void>;
  private readonly groups = new Map<string, Group>();
  /** The UDP port each UDP listener got (port 0 in tests binds an ephemeral one). */
  private readonly udpBound = new Map<string, number>();
  private readonly respawns: number[] = [];
  private lastApply: { listeners: Map<string, Omit<EngineListenerSpec, 'fds' | 'udp'>>; config: ProxyConfig } | undefined;
  private state: ForwardState = { services: [] };
  private problems: string[] = [];
  private readonly queue = new SerialQueue();
  private stopped = false;
  private drainTimer: NodeJS.Timeout | undefined;
  readonly maxConnections: number;
  readonly workers: number;
  readonly inline: boolean;

  constructor(opts: ProxyDataplaneOptions) {
    this.log = (opts.log ?? silentLogger()).child({ module: 'forward', dataplane: 'proxy' });
    this.clock = opts.clock ?? realClock;
    this.cfg = opts.config;
    this.onConnectResult = opts.onConnectResult ?? (() => undefined);
    this.udpIdleMs = (opts.udpIdleTimeout ?? 30) * 1000;
    this.maxUdpSessions = opts.maxUdpSessions ?? 16384;
    this.backlog = opts.backlog ?? 1024;
    this.store = opts.listenerStore;
    this.drainTimeoutMs = opts.drainTimeoutMs ?? 5000;
    this.inline = opts.inline === true;
    this.workers = this.inline ? 1 : Math.max(1, opts.workers ?? opts.config.workers ?? defaultWorkers());
    // The addon relays; an install without it serves nothing, so it is refused here, before any worker starts.
    const relay = native().relayHandleClass();
    if (typeof relay === 'string') throw new LbError('LB_ERR_NET_NATIVE_MISSING', `the userspace proxy cannot relay: ${relay}`, {});
    const nofile = readNofile();
    this.maxConnections = opts.maxConnections ?? effectiveMaxConnections(opts.config.maxConnections, nofile);
    this.tallies = new TallyTable(this.workers);
    this.log.info({ op: 'limits', maxConnections: this.maxConnections, configured: opts.config.maxConnections ?? null, nofile: nofile ?? null, workers: this.workers, inline: this.inline },
      `proxy holds at most ${this.maxConnections} connections (descriptor limit ${nofile ?? 'unknown'}) over ${this.inline ? 'the main thread' : `${this.workers} worker thread(s)`}`);
    for (let i = 0; i < this.workers; i++) this.hosts.push(this.newHost(i));
    this.started = this.waitReady();
    if (!this.inline) this.scheduleDrain(REPORT_DRAIN_MS);
    this.metrics = opts.registry
      ? new ForwardMetrics({ registry: opts.registry, kind: 'proxy', reason: opts.reason ?? 'configured', stats: () => this.stats() })
      : undefined;
  }

  private newHost(index: number): EngineHost {
    const onConnect = (service: string, backend: string, ok: boolean): void => this.onConnectResult(service, backend, ok);
    if (this.inline) return new InlineHost(index, this, onConnect);
    return new WorkerHost(index, this.engineStart(index), this.log, onConnect, () => this.drainReports(index), (code) => this.workerExited(index, code));
  }

  /**
   * Passive-health results the workers left in their rings, each ring in
   * order, to onConnectResult; how many. `last`: the worker whose failure
   * woke this thread (or that ended), drained after the others, so what they
   * reported before the failure counts before it (a success left in another
   * ring for up to REPORT_DRAIN_IDLE_MS must not count after a later failure).
   */
  private drainReports(last?: number): number {
    let drained = 0;
    const take = (e: number): void => this.tallies.drain(e, (key, ok) => {
      drained++;
      const [service, , backend] = key.split('\u0000') as [string, string, string];
      this.onConnectResult(service, backend, ok);
    });
    for (let e = 0; e < this.workers; e++) if (e !== last) take(e);
    if (last !== undefined && last < this.workers) take(last);
    return drained;
  }

  private scheduleDrain(delayMs: number): void {
    this.drainTimer = setTimeout(() => {
      this.drainTimer = undefined;
      if (this.stopped) return;
      this.scheduleDrain(nextReportDrainMs(delayMs, this.drainReports()));
    }, delayMs);
    this.drainTimer.unref();
  }

  /** The engine options an inline host needs (the same as a worker's start). */
  engineStart(index: number): WorkerStart {
    return {
      index, buffers: this.tallies.buffers(), config: this.cfg, maxConnections: this.maxConnections,
      backlog: this.backlog, udpIdleMs: this.udpIdleMs, maxUdpSessions: this.maxUdpSessions, logLevel: logLevelOf(this.log),
    };
  }

  get engineLog(): Logger { return this.log; }
  get engineClock(): Clock { return this.clock; }

  private async waitReady(): Promise<void> {
    await Promise.all(this.hosts.map((h) => (h instanceof WorkerHost ? h.ready : Promise.resolve())));
  }

  apply(state: ForwardState): Promise<void> {
    return this.queue.run(() => this.applyNow(state));
  }

  /**
   * A reload's proxy: settings. Timeouts apply to the next connect and idle
   * sweep; a new algorithm takes over at the next apply (each route builds a
   * new balancer when its algorithm differs). Open connections are kept.
   * proxy.workers needs a restart (the reconciler refuses it).
   */
  reconfigure(cfg: ProxyConfig): void {
    this.cfg = cfg;
    for (const h of this.hosts) if (h.alive) h.reconfigure(cfg);
  }

  private async applyNow(state: ForwardState): Promise<void> {
    if (this.stopped) throw new LbError('LB_ERR_FORWARD_LISTEN', 'the proxy data path was stopped; create a new one');
    await this.started;
    const { services, problems } = normalizeState(state);
    const failures: string[] = [];
    // What each listener forwards to, by listener id.
    const wanted = new Map<string, Omit<EngineListenerSpec, 'fds' | 'udp'>>();
    const slotKeys = new Set<string>();
    for (const s of services) {
      if (s.vip === undefined) continue;
      const pp = state.services.find((x) => x.key === s.key)?.proxyProtocol;
      for (const { spec } of s.ports) {
        const id = listenerId(s.vip, spec);
        const flows: Record<string, number> = {};
        for (const b of s.all) {
          const k = flowId(s.key, spec, b.address);
          slotKeys.add(k);
          flows[b.address] = this.tallies.slot(k);
        }
        const healthy: EngineBackend[] = s.healthy.map((b) => ({ address: b.address, weight: b.weight, slot: flows[b.address]! }));
        const lkey = `listener\u0000${id}`;
        slotKeys.add(lkey);
        wanted.set(id, { id, serviceKey: s.key, vip: s.vip, port: spec, healthy, flows, slot: this.tallies.slot(lkey), proxyProtocol: pp });
      }
    }
    // TCP listeners that are new: their socket groups (taken from the store, else bound).
    for (const [id, w] of wanted) {
      if (w.port.protocol !== 'TCP' || this.groups.has(id)) continue;
      try {
        this.groups.set(id, this.openGroup(id, w.vip, w.port));
      } catch (err) {
        failures.push(`${w.serviceKey}: cannot listen on ${w.vip}:${w.port.port}/TCP: ${errorMessage(err)}`);
        wanted.delete(id);
      }
    }
    const removed = [...this.groups.values()].filter((g) => !wanted.has(g.id));
    this.lastApply = { listeners: wanted, config: this.cfg };
    failures.push(...await this.pushToEngines());
    // Groups no longer wanted: every engine has closed its duplicates; ours go, and the store forgets them.
    for (const g of removed) this.closeGroup(g);
    for (const id of [...this.udpBound.keys()]) if (!wanted.has(id)) this.udpBound.delete(id);
    // Results that name a slot about to be reused go out first.
    this.drainReports();
    this.tallies.release(slotKeys);
    this.state = state;
    this.problems = [...problems, ...failures];
    for (const p of problems) this.log.warn({ op: 'apply', problem: p }, p);
    if (failures.length > 0) {
      for (const f of failures) this.log.error({ op: 'listen', problem: f }, f);
      // Everything else is applied; the failed ports are retried on the next apply.
      throw new LbError('LB_ERR_FORWARD_LISTEN', failures.join('; '), { failures });
    }
  }

  /** The live engines: dead ones whose respawns ran out hand their sockets to these. */
  private live(): EngineHost[] {
    return this.hosts.filter((h) => h.alive);
  }

  /** Send every engine its listeners (with duplicates of sockets new to it); returns the failures. */
  private async pushToEngines(): Promise<string[]> {
    const last = this.lastApply;
    if (!last) return [];
    const live = this.live();
    const udpHost = live[0];
    const slots = this.tallies.slots;
    const replies = live.map(async (h, hi) => {
      const listeners: EngineListenerSpec[] = [];
      for (const [id, w] of last.listeners) {
        if (w.port.protocol === 'UDP') { listeners.push({ ...w, udp: h === udpHost }); continue; }
        const g = this.groups.get(id);
        if (!g) continue;
        const mine = g.shared ? [0] : g.fds.map((_, j) => j).filter((j) => j % live.length === hi);
        const given = g.given.get(h.index) ?? new Set<number>();
        const fresh = mine.filter((j) => !given.has(j));
        let fds: number[] | undefined;
        if (fresh.length > 0) {
          fds = fresh.map((j) => dupFd(g.fds[j]!));
          for (const j of fresh) given.add(j);
          g.given.set(h.index, given);
        }
        listeners.push({ ...w, ...(fds ? { fds } : {}) });
      }
      try {
        const r = await h.apply({ listeners, config: last.config, slots });
        this.tallies.confirm(h.index, r.generation);
        for (const [id, p] of Object.entries(r.udpPorts)) this.udpBound.set(id, p);
        return r.failures;
      } catch (err) {
        return [`proxy worker ${h.index}: ${errorMessage(err)}`];
      }
    });
    return (await Promise.all(replies)).flat();
  }

  /** The socket group of a TCP listener: what the store kept for it when it still fits, else new sockets. */
  private openGroup(id: string, vip: string, port: PortSpec): Group {
    const a = parseAddress(vip);
    if (a === undefined) throw new Error(`${vip} is not an IPv4 or IPv6 address`);
    const v6 = a.family === 'IPv6';
    const vipBytes = addressToBytes(a);
    const vipNum = v6 ? 0 : vipBytes.readUInt32BE(0);
    // An inherited socket fits when it listens on this very VIP (and port).
    const bound = (info: import('../native/native').NativeSocketInfo): boolean => (v6
      ? info.family === AF_INET6 && info.address6 !== undefined && vipBytes.equals(info.address6)
      : info.family === AF_INET && info.address === vipNum);
    const inherited: number[] = [];
    const foreign: number[] = [];
    for (let fd = this.store?.take(id); fd !== undefined; fd = this.store?.take(id)) {
      const ok = (() => {
        try {
          const info = socketInfo(fd);
          return info.listening && bound(info) && (port.port === 0 || info.port === port.port) ? info : undefined;
        } catch { return undefined; }
      })();
      if (ok) inherited.push(fd);
      else foreign.push(fd);
    }
    if (foreign.length > 0) {
      // Not the sockets this listener had: let them go (the store forgets the name below when nothing fits).
      this.log.warn({ op: 'listen', listener: id, descriptors: foreign.length }, 'an inherited listening socket is bound elsewhere; binding a new one');
      for (const fd of foreign) closeFd(fd);
      if (inherited.length === 0) this.store?.drop(id);
    }
    const shared = inherited.length > 0 && !socketInfo(inherited[0]!).reusePort;
    const fds = [...inherited];
    let boundPort = inherited.length > 0 ? socketInfo(inherited[0]!).port! : port.port;
    const want = shared ? 1 : this.workers;
    try {
      while (fds.length < want) {
        const s = v6 ? listenTcp6(vipBytes, boundPort, this.backlog, true) : listenTcp4(vipNum, boundPort, this.backlog, true);
        boundPort = s.port;
        fds.push(s.fd);
        this.store?.keep(id, s.fd);
      }
    } catch (err) {
      // Nothing half-made: what was bound for this group goes (what was inherited too: we cannot serve it as a group).
      for (const fd of fds) if (!inherited.includes(fd)) closeFd(fd);
      for (const fd of inherited) closeFd(fd);
      if (inherited.length > 0) this.store?.drop(id);
      throw err;
    }
    for (const fd of inherited) this.store?.keep(id, fd);
    const g: Group = { id, vip, port: port.port, fds, shared, boundPort, given: new Map() };
    if (inherited.length > 0) {
      this.log.info({ op: 'listen', listener: id, vip, port: boundPort, protocol: 'TCP', inherited: true, sockets: fds.length, reusePort: !shared },
        `proxy listening on the socket an earlier process left (${inherited.length} of ${fds.length})${shared ? '; it has no SO_REUSEPORT, so every worker shares its one accept queue until a stop' : ''}`);
    } else {
      this.log.info({ op: 'listen', listener: id, vip, port: boundPort, protocol: 'TCP', inherited: false, sockets: fds.length }, 'proxy listening');
    }
    return g;
  }

  private closeGroup(g: Group): void {
    this.log.info({ op: 'unlisten', listener: g.id }, 'proxy listener closed; open connections drain');
    this.groups.delete(g.id);
    this.store?.drop(g.id);
    for (const fd of g.fds) closeFd(fd);
  }

  // --- workers that end ---------------------------------------------------------

  private workerExited(index: number, code: number): void {
    if (this.stopped) return;
    const host = this.hosts[index]!;
    host.alive = false;
    this.drainReports(index);
    this.tallies.resetEngine(index);
    // Its duplicates died with it.
    for (const g of this.groups.values()) g.given.delete(index);
    const now = this.clock.now();
    while (this.respawns.length > 0 && now - this.respawns[0]! > 60_000) this.respawns.shift();
    const respawn = this.respawns.length < RESPAWNS_PER_MINUTE;
    this.log.error({ op: 'worker', worker: index, code, respawn }, respawn
      ? `proxy worker ${index} ended (code ${code}); its connections are gone; starting a new one`
      : `proxy worker ${index} ended (code ${code}) for the ${RESPAWNS_PER_MINUTE + 1}th time in a minute; the other workers take its listening sockets`);
    if (respawn) {
      this.respawns.push(now);
      const h = this.newHost(index);
      this.hosts[index] = h;
    }
    if (this.live().length === 0 && !respawn) {
      this.log.fatal({ op: 'worker' }, 'no proxy worker is left: nothing accepts on the proxy\'s listening sockets');
      return;
    }
    // Give the new worker (or the survivors) their sockets; the queue keeps this apart from applies.
    void this.queue.run(async () => {
      if (this.stopped) return;
      const h = this.hosts[index]!;
      if (h instanceof WorkerHost) await h.ready.catch(() => undefined);
      // Sockets are re-dealt over the live engines: survivors may get more.
      for (const g of this.groups.values()) g.given.clear();
      const failures = await this.pushToEngines();
      for (const f of failures) this.log.error({ op: 'worker', problem: f }, f);
    });
  }

  // --- lifecycle and stats ------------------------------------------------------

  stop(opts: { keep?: boolean } = {}): Promise<void> {
    return this.queue.run(async () => {
      if (this.stopped) return;
      this.stopped = true;
      this.metrics?.unregister();
      await this.started.catch(() => undefined);
      if (this.drainTimer !== undefined) clearTimeout(this.drainTimer);
      const results = await Promise.all(this.hosts.map((h) => (h.alive ? h.stop(opts.keep === true, this.drainTimeoutMs).catch(() => ({ open: 0, unfinished: 0 })) : Promise.resolve({ open: 0, unfinished: 0 }))));
      this.drainReports();
      await Promise.all(this.hosts.map((h) => h.terminate()));
      // With keep, the listening sockets live on in the store: closing our descriptors only stops accepting.
      for (const g of this.groups.values()) for (const fd of g.fds) closeFd(fd);
      this.groups.clear();
      const open = results.reduce((n, r) => n + r.open, 0);
      const unfinished = results.reduce((n, r) => n + r.unfinished, 0);
      if (opts.keep && open > 0) this.log.info({ op: 'stop', open, unfinished }, `waited for ${open - unfinished} of ${open} open connections to finish`);
      this.log.info({ op: 'stop', keep: opts.keep === true }, opts.keep ? 'proxy stopped; its listening sockets stay with the service manager' : 'proxy stopped');
    });
  }

  async stats(): Promise<ForwardStats> {
    this.drainReports();
    const t = this.tallies;
    const { services } = normalizeState(this.state);
    const flows: FlowStats[] = [];
    for (const s of services) {
      for (const { spec } of s.ports) {
        for (const b of s.all) {
          const slot = t.slotOf(flowId(s.key, spec, b.address));
          const f = (field: number): number => (slot === undefined ? 0 : t.sum(slot, field));
          flows.push({
            service: s.key, port: portLabel(spec), protocol: spec.protocol, backend: b.address,
            connections: f(FLOW_CONNECTIONS), active: slot === undefined ? 0 : t.activeTotal(slot),
            bytesToBackend: f(FLOW_BYTES_TO_BACKEND), bytesToClient: f(FLOW_BYTES_TO_CLIENT), connectFailures: f(FLOW_CONNECT_FAILURES),
          });
        }
      }
    }
    const listeners = [];
    const udpFlowsEnded: UdpFlowsEnded[] = [];
    for (const s of services) {
      if (s.vip === undefined) continue;
      for (const { spec } of s.ports) {
        const id = listenerId(s.vip, spec);
        const g = this.groups.get(id);
        const boundPort = spec.protocol === 'TCP' ? g?.boundPort : this.udpBound.get(id);
        if (boundPort === undefined) continue;
        const slot = t.slotOf(`listener\u0000${id}`);
        if (spec.protocol === 'UDP' && slot !== undefined) {
          const ended = t.sum(slot, LISTENER_UDP_ENDED);
          if (ended > 0) udpFlowsEnded.push({ service: s.key, port: portLabel(spec), ended });
        }
        listeners.push({
          service: s.key, vip: s.vip, port: spec.port, boundPort, protocol: spec.protocol,
          healthy: s.healthy.length, refused: slot === undefined ? 0 : t.sum(slot, LISTENER_REFUSED),
          udpSessions: spec.protocol === 'UDP' && slot !== undefined ? t.sum(slot, LISTENER_UDP_SESSIONS) : undefined,
          sockets: g?.fds.length, reusePort: g ? !g.shared : undefined,
        });
      }
    }
    const ownLimits: Record<string, number> = {};
    for (const k of OWN_LIMIT_KEYS) {
      const n = t.engineSum(ownLimitField(k));
      if (n > 0) ownLimits[k] = n;
    }
    return {
      kind: 'proxy',
      services: services.map((s) => ({ key: s.key, vip: s.vip, healthy: s.healthy.length, backends: s.all.length, noHealthyBackend: s.healthy.length === 0 })),
      flows,
      problems: [...this.problems],
      details: {
        listeners, openConnections: t.open, maxConnections: this.maxConnections, algorithm: this.cfg.algorithm,
        proxyHeaders: { withData: t.engineSum(ENGINE_PP_WITH_DATA), alone: t.engineSum(ENGINE_PP_ALONE) },
        workers: this.hosts.map((h) => ({
          index: h.index, thread: !this.inline, alive: h.alive,
          accepted: t.engineField(h.index, ENGINE_ACCEPTED), open: t.engineField(h.index, ENGINE_OPEN),
        })),
      },
      ownLimits,
      udpFlowsEnded,
    };
  }
}

/** One worker per CPU the process may run on. */
export function defaultWorkers(): number {
  return typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length;
}

function listenerId(vip: string, p: PortSpec): string {
  return `${vip}|${p.protocol}|${p.port}`;
}

const AF_INET = 2;
const AF_INET6 = 10;

function closeFd(fd: number): void {
  try { fs.closeSync(fd); } catch { /* already closed */ }
}

function logLevelOf(log: Logger): number {
  const v = (log as unknown as { levelVal?: number }).levelVal;
  return typeof v === 'number' ? v : LEVELS.info;
}

// The addon is loaded on first use: `lb-agent validate` and the kernel path never need it here.
function native(): typeof import('../native/native') {
  return require('../native/native') as typeof import('../native/native');
}
const listenTcp4 = (a: number, p: number, backlog: number, reuse: boolean): { fd: number; port: number } => native().listenTcp4(a, p, backlog, reuse);
const listenTcp6 = (a: Uint8Array, p: number, backlog: number, reuse: boolean): { fd: number; port: number } => native().listenTcp6(a, p, backlog, reuse);
const socketInfo = (fd: number): import('../native/native').NativeSocketInfo => native().socketInfo(fd);
const dupFd = (fd: number): number => native().dupFd(fd);

/** The engine in this thread (`inline`): direct calls. */
class InlineHost implements EngineHost {
  alive = true;
  private readonly engine: import('./proxy-engine').ProxyEngine;

  constructor(readonly index: number, owner: ProxyDataplane, onConnect: (s: string, b: string, ok: boolean) => void) {
    const { ProxyEngine } = require('./proxy-engine') as typeof import('./proxy-engine');
    const { relayPath } = require('./proxy-worker') as typeof import('./proxy-worker');
    const start = owner.engineStart(index);
    this.engine = new ProxyEngine({
      index, buffers: start.buffers, config: start.config, log: owner.engineLog, clock: owner.engineClock, relay: relayPath(),
      maxConnections: start.maxConnections, backlog: start.backlog, udpIdleMs: start.udpIdleMs, maxUdpSessions: start.maxUdpSessions,
      onConnectResult: (service, backend, _slot, ok) => onConnect(service, backend, ok),
    });
  }

  async apply(a: EngineApply): Promise<{ failures: string[]; generation: number; udpPorts: Record<string, number> }> {
    const failures = await this.engine.apply(a);
    const udpPorts: Record<string, number> = {};
    for (const l of a.listeners) {
      const p = l.udp ? this.engine.udpPort(l.id) : undefined;
      if (p !== undefined) udpPorts[l.id] = p;
    }
    return { failures, generation: a.slots?.generation ?? -1, udpPorts };
  }

  reconfigure(cfg: ProxyConfig): void { this.engine.reconfigure(cfg); }

  stop(keep: boolean, drainMs: number): Promise<{ open: number; unfinished: number }> {
    return this.engine.stop({ keep, drainMs });
  }

  async terminate(): Promise<void> { this.alive = false; }
}

/** An engine in a worker thread: messages, with replies matched by sequence number. */
class WorkerHost implements EngineHost {
  alive = true;
  readonly ready: Promise<void>;
  private readonly worker: Worker;
  private seq = 0;
  private readonly pending = new Map<number, { resolve: (m: FromWorker) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  private exited = false;
  private terminating = false;

  constructor(
    readonly index: number,
    start: WorkerStart,
    private readonly log: Logger,
    private readonly onConnect: (s: string, b: string, ok: boolean) => void,
    private readonly drain: () => void,
    onExit: (code: number) => void,
  ) {
    this.worker = new Worker(path.join(__dirname, 'proxy-worker.js'), {
      workerData: start,
      name: `lb-proxy-${index}`,
      // Bounded heaps (RSS under load): the young generation is where
      // a relay's short-lived objects die; 8 MiB keeps scavenges cheap and the
      // memory flat. A worker that outgrows the old generation ends, and is replaced.
      resourceLimits: { maxYoungGenerationSizeMb: 8, maxOldGenerationSizeMb: 256 },
      stdout: false, stderr: false,
    });
    this.ready = new Promise((resolve, reject) => {
      const onReady = (m: FromWorker): void => {
        if (m.t !== 'ready') return;
        this.worker.off('message', onReady);
        resolve();
      };
      this.worker.on('message', onReady);
      this.worker.once('exit', (code) => reject(new Error(`proxy worker ${index} exited with ${code} before it was ready`)));
    });
    this.ready.catch(() => undefined);
    this.worker.on('message', (m: FromWorker) => this.onMessage(m));
    this.worker.on('error', (err) => this.log.error({ op: 'worker', worker: index, err: errorMessage(err) }, `proxy worker ${index} failed: ${errorMessage(err)}`));
    this.worker.once('exit', (code) => {
      this.exited = true;
      this.alive = false;
      for (const p of this.pending.values()) { clearTimeout(p.timer); p.reject(new Error(`proxy worker ${index} ended (code ${code})`)); }
      this.pending.clear();
      if (!this.terminating) onExit(code);
    });
  }

  private onMessage(m: FromWorker): void {
    switch (m.t) {
      case 'connects':
        // What the ring holds came first.
        this.drain();
        for (let i = 0; i + 2 < m.list.length; i += 3) this.onConnect(m.list[i] as string, m.list[i + 1] as string, m.list[i + 2] as boolean);
        break;
      case 'drain':
        this.drain();
        break;
      case 'log':
        this.log[m.level]({ ...m.obj, worker: this.index }, m.msg);
        break;
      case 'applied':
      case 'stopped': {
        const p = this.pending.get(m.seq);
        if (!p) return;
        this.pending.delete(m.seq);
        clearTimeout(p.timer);
        p.resolve(m);
        break;
      }
      default:
        break;
    }
  }

  private request(msg: ToWorker & { seq: number }): Promise<FromWorker> {
    if (this.exited) return Promise.reject(new Error(`proxy worker ${this.index} has ended`));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(msg.seq);
        reject(new Error(`proxy worker ${this.index} did not answer ${msg.t} within ${WORKER_REPLY_MS} ms`));
      }, WORKER_REPLY_MS);
      timer.unref();
      this.pending.set(msg.seq, { resolve, reject, timer });
      this.worker.postMessage(msg);
    });
  }

  async apply(a: EngineApply): Promise<{ failures: string[]; generation: number; udpPorts: Record<string, number> }> {
    const m = await this.request({ t: 'apply', seq: ++this.seq, apply: a });
    if (m.t !== 'applied') throw new Error('unexpected reply');
    return { failures: m.failures, generation: m.generation, udpPorts: m.udpPorts };
  }

  reconfigure(cfg: ProxyConfig): void {
    if (!this.exited) this.worker.postMessage({ t: 'reconfigure', config: cfg } satisfies ToWorker);
  }

  async stop(keep: boolean, drainMs: number): Promise<{ open: number; unfinished: number }> {
    const m = await this.request({ t: 'stop', seq: ++this.seq, keep, drainMs });
    if (m.t !== 'stopped') throw new Error('unexpected reply');
    return { open: m.open, unfinished: m.unfinished };
  }

  async terminate(): Promise<void> {
    this.terminating = true;
    this.alive = false;
    if (this.exited) return;
    await this.worker.terminate();
  }
}
