// forward/ layer: the userspace data path (`dataplane: proxy`): the fallback
// where nftables is unavailable, and the place for what the kernel path
// cannot do (connect retries, passive health reports, per-connection
// timeouts). It owns its listening sockets on VIP:port and the connections
// it relays; it never runs health checks (it reports connect results to a
// callback) and never touches addresses or routes.
//
// TCP: one net.Server per VIP:port. An accepted connection is held paused
// (pauseOnConnect: its bytes wait in the kernel, not in our memory) while we
// connect to a backend picked by the balancer; a failed or timed-out connect
// is retried once on another healthy backend, after which the client is
// reset. Bytes are relayed with write()/pause()/resume() both ways
// (backpressure: a slow side stops the other from reading), half-close is
// passed through (allowHalfOpen on both sockets, a FIN becomes end() on the
// other side), and an error on one side resets the other. No healthy backend
// means the client is reset at once (RST, never a hang).
//
// UDP: a simple relay. The first datagram of a client address:port opens a
// session: a connected UDP socket to a picked backend; replies go back to the
// client from the VIP:port socket, so the client sees the VIP as the source.
// Sessions close after udpIdleTimeout without traffic (conntrack's UDP
// timeout is 30 s, hence the default). With no healthy backend a new client's
// datagrams are dropped and counted (userspace cannot send the ICMP port
// unreachable the kernel path does).
//
// Draining: a backend that leaves the healthy set gets no new connections or
// sessions; the ones it has run to their end.
//
// Own exhaustion is own fault (issue 15): EMFILE, ENFILE or ENOBUFS on
// accept or on a backend connect is this process (or host) out of
// descriptors or buffers, never a backend's failure: no passive-health
// report, no retry elsewhere, the client is closed, a counter and one warn
// line per interval say so, and new connections are refused for a backoff
// (50 ms doubling to 2 s) before accepting resumes. maxConnections (global,
// default from the descriptor limit, capacity.ts) refuses beyond it the same
// way, before a descriptor runs out. Those clients get a clean close (FIN),
// not the RST of "no healthy backend": the service is up, we are full.
//
// Hot path: reads land in reusable 16 KiB buffers (socket `onread`, see
// adopt()) instead of a fresh Buffer per read; no timers touched per chunk
// (idle timeouts are a coarse sweep over an "active" flag set by the relay,
// instead of socket.setTimeout's timer refresh on every read and write); no
// prom-client calls (bytes are read from socket.bytesRead when the
// connection ends or a scrape asks); TCP_NODELAY on both sides.
import * as dgram from 'node:dgram';
import * as net from 'node:net';
import type { Registry } from 'prom-client';
import type { BackendSpec, PortSpec, ProxyConfig } from '../config/types';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { LbError, errorMessage } from '../errors';
import { silentLogger, type Logger } from '../log';
import { createBalancer, type Balancer } from './balancer';
import {
  flowId, normalizeState, portLabel,
  type ConnectResultCallback, type Dataplane, type ListenerStore, type FlowStats, type ForwardState, type ForwardStats,
} from './dataplane';
import { ForwardMetrics } from './metrics';
import { SerialQueue } from '../serial';
import { REFUSALS_DRAINING_MAX, effectiveMaxConnections, localExhaustionCode, readNofile } from './capacity';

export interface ProxyDataplaneOptions {
  readonly config: ProxyConfig;
  readonly registry?: Registry;
  readonly log?: Logger;
  /** Why this path was chosen (selectDataplane's reason), for the info metric. */
  readonly reason?: string;
  /** Passive health: every connect to a backend reports here. */
  readonly onConnectResult?: ConnectResultCallback;
  readonly clock?: Clock;
  /** Seconds without traffic before a UDP session is closed (default 30). */
  readonly udpIdleTimeout?: number;
  /** Bound on concurrent UDP sessions per VIP:port (default 16384); past it new clients are dropped. */
  readonly maxUdpSessions?: number;
  /** Listen backlog (default 1024). */
  readonly backlog?: number;
  /**
   * Relay through reusable read buffers (socket `onread`) instead of stream
   * 'data' events (default true). See the note on the user-buffer path below.
   */
  readonly userBuffers?: boolean;
  /** Listening sockets that outlive the process (systemd's fd store); none by default. */
  readonly listenerStore?: ListenerStore;
  /** With stop({ keep }): how long open connections may take to finish before the process lets go (default 5 s). */
  readonly drainTimeoutMs?: number;
  /** Proxied TCP connections at once, over all listeners; beyond it new clients are reset. Default: capacity.ts from the descriptor limit. */
  readonly maxConnections?: number;
}

/** One warn line per this interval about refusals for our own limits; the counters have every one. */
const EXHAUSTION_WARN_MS = 10_000;
const BACKOFF_MIN_MS = 50;
const BACKOFF_MAX_MS = 2000;

/** Counters of one (service, port, backend); plain numbers, bumped on the hot path. */
class Tally {
  connections = 0;
  active = 0;
  bytesToBackend = 0;
  bytesToClient = 0;
  connectFailures = 0;
}

/** What a listener forwards to right now; replaced (not mutated) on apply, so in-flight picks see one consistent set. */
interface Route {
  readonly serviceKey: string;
  readonly port: PortSpec;
  readonly healthy: readonly BackendSpec[];
  readonly balancer: Balancer;
  readonly algorithm: ProxyConfig['algorithm'];
  readonly tallies: Map<string, Tally>;
  /** Clients refused (TCP reset / UDP dropped) because no backend was healthy or all connects failed. */
  refused: number;
}

interface Listener {
  readonly id: string;
  readonly vip: string;
  readonly port: PortSpec;
  route: Route;
  tcp: net.Server | undefined;
  udp: dgram.Socket | undefined;
  boundPort: number | undefined;
  readonly sessions: Map<string, UdpSession>;
}

interface UdpSession {
  readonly socket: dgram.Socket;
  readonly tally: Tally;
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly key: string;
  ready: boolean;
  queue: Buffer[] | undefined;
  seen: boolean;
  idleTicks: number;
}

const IDLE_SWEEPS = 4;

/**
 * Read buffers for the user-buffer relay: 16 KiB per direction (HAProxy's and
 * nginx's default buffer size), reused across connections through a small
 * free list.
 */
const RELAY_BUFFER = 16 * 1024;
const FREE_BUFFERS_MAX = 256;

/** One relayed TCP connection. */
class Relay {
  /** The backend socket, connecting or connected; undefined between attempts. */
  upstream: net.Socket | undefined;
  upstreamConnected = false;
  tally: Tally | undefined;
  clientClosed = false;
  seen = false;
  idleTicks = 0;
  reportedToBackend = 0;
  reportedToClient = 0;
  /**
   * User-buffer relay: the buffer each side reads into, and whether a write
   * still references it (a write that did not complete at once keeps a
   * pointer into the buffer until it does, so the next read must use another).
   */
  fromClient: Buffer | undefined;
  fromClientLent = false;
  fromBackend: Buffer | undefined;
  fromBackendLent = false;
  constructor(
    /** The socket we relay for the client (the adopted one on the user-buffer path). */
    public client: net.Socket,
    readonly route: Route,
    /** The socket net.Server handed us; differs from client when its handle was adopted. */
    readonly accepted: net.Socket,
  ) {}
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
  private readonly userBuffers: boolean;
  private readonly store: ListenerStore | undefined;
  private readonly drainTimeoutMs: number;
  private readonly freeBuffers: Buffer[] = [];
  /** Connections relayed per path (user buffers vs streams), for stats. */
  private readonly relayed = { userBuffers: 0, streams: 0 };
  private readonly metrics: ForwardMetrics | undefined;
  private readonly listeners = new Map<string, Listener>();
  /** Tallies per flow id; they outlive listeners so counters stay monotonic across applies. */
  private readonly tallies = new Map<string, Tally>();
  private readonly relays = new Set<Relay>();
  private readonly draining = new Set<Listener>();
  private state: ForwardState = { services: [] };
  private problems: string[] = [];
  private readonly queue = new SerialQueue();
  private sweepTimer: TimerHandle | undefined;
  private stopped = false;
  readonly maxConnections: number;
  /** Refusals for our own limits, by "op/code" (accept/EMFILE, connect/ENFILE, limit/max-connections). */
  private readonly exhaustion = new Map<string, number>();
  private exhaustionSinceWarn = 0;
  private lastExhaustionWarn = -Infinity;
  private backoffMs = 0;
  private backoffUntil = -Infinity;
  private refusalsDraining = 0;

  constructor(opts: ProxyDataplaneOptions) {
    this.log = (opts.log ?? silentLogger()).child({ module: 'forward', dataplane: 'proxy' });
    this.clock = opts.clock ?? realClock;
    this.cfg = opts.config;
    this.onConnectResult = opts.onConnectResult ?? (() => undefined);
    this.udpIdleMs = (opts.udpIdleTimeout ?? 30) * 1000;
    this.maxUdpSessions = opts.maxUdpSessions ?? 16384;
    this.backlog = opts.backlog ?? 1024;
    this.userBuffers = opts.userBuffers ?? true;
    this.store = opts.listenerStore;
    this.drainTimeoutMs = opts.drainTimeoutMs ?? 5000;
    const nofile = readNofile();
    this.maxConnections = opts.maxConnections ?? effectiveMaxConnections(opts.config.maxConnections, nofile);
    this.log.info({ op: 'limits', maxConnections: this.maxConnections, configured: opts.config.maxConnections ?? null, nofile: nofile ?? null }, `proxy holds at most ${this.maxConnections} connections (descriptor limit ${nofile ?? 'unknown'})`);
    this.metrics = opts.registry
      ? new ForwardMetrics({ registry: opts.registry, kind: 'proxy', reason: opts.reason ?? 'configured', stats: () => this.stats() })
      : undefined;
  }

  apply(state: ForwardState): Promise<void> {
    return this.queue.run(() => this.applyNow(state));
  }

  /**
   * A reload's proxy: settings. Timeouts apply to the next connect and idle
   * sweep; a new algorithm takes over at the next apply (each route builds a
   * new balancer when its algorithm differs). Open connections are kept.
   */
  reconfigure(cfg: ProxyConfig): void {
    this.cfg = cfg;
  }

  private async applyNow(state: ForwardState): Promise<void> {
    if (this.stopped) throw new LbError('LB_ERR_FORWARD_LISTEN', 'the proxy data path was stopped; create a new one');
    const { services, problems } = normalizeState(state);
    const wanted = new Map<string, { key: string; vip: string; port: PortSpec; healthy: readonly BackendSpec[] }>();
    for (const s of services) {
      if (s.vip === undefined) continue;
      for (const { spec } of s.ports) wanted.set(listenerId(s.vip, spec), { key: s.key, vip: s.vip, port: spec, healthy: s.healthy });
    }
    // Listeners no longer wanted stop accepting; their connections drain.
    for (const [id, l] of this.listeners) {
      if (wanted.has(id)) continue;
      this.listeners.delete(id);
      this.closeListener(l);
    }
    const failures: string[] = [];
    for (const [id, w] of wanted) {
      const existing = this.listeners.get(id) ?? [...this.draining].find((d) => d.id === id);
      if (existing) {
        // A UDP listener still draining is taken back into service rather than rebound.
        this.draining.delete(existing);
        this.listeners.set(id, existing);
        existing.route = this.routeFor(w.key, w.port, w.healthy, existing.route);
        continue;
      }
      const l: Listener = {
        id, vip: w.vip, port: w.port, route: this.routeFor(w.key, w.port, w.healthy, undefined),
        tcp: undefined, udp: undefined, boundPort: undefined, sessions: new Map(),
      };
      try {
        await this.open(l);
        this.listeners.set(id, l);
      } catch (err) {
        failures.push(`${w.key}: cannot listen on ${w.vip}:${w.port.port}/${w.port.protocol}: ${errorMessage(err)}`);
      }
    }
    this.state = state;
    this.pruneTallies(services);
    this.problems = [...problems, ...failures];
    for (const p of problems) this.log.warn({ op: 'apply', problem: p }, p);
    this.ensureSweep();
    if (failures.length > 0) {
      for (const f of failures) this.log.error({ op: 'listen', problem: f }, f);
      // Everything else is applied; the failed ports are retried on the next apply.
      throw new LbError('LB_ERR_FORWARD_LISTEN', failures.join('; '), { failures });
    }
  }

  private routeFor(serviceKey: string, port: PortSpec, healthy: readonly BackendSpec[], previous: Route | undefined): Route {
    const tallies = new Map<string, Tally>();
    for (const b of healthy) tallies.set(b.address, this.tally(serviceKey, port, b.address));
    const same = previous !== undefined && previous.serviceKey === serviceKey && previous.port.targetPort === port.targetPort && previous.algorithm === this.cfg.algorithm;
    // Keep the balancer (its round-robin position and stability) and, when
    // nothing changed, the very same array, so the balancer's fast path holds.
    const unchanged = same && sameBackends(previous.healthy, healthy);
    return {
      serviceKey, port, tallies,
      healthy: unchanged ? previous.healthy : healthy,
      balancer: same ? previous.balancer : createBalancer(this.cfg.algorithm),
      algorithm: this.cfg.algorithm,
      refused: same ? previous.refused : 0,
    };
  }

  private tally(serviceKey: string, port: PortSpec, backend: string): Tally {
    const id = flowId(serviceKey, port, backend);
    let t = this.tallies.get(id);
    if (!t) { t = new Tally(); this.tallies.set(id, t); }
    return t;
  }

  private pruneTallies(services: ReturnType<typeof normalizeState>['services']): void {
    const keep = new Set<string>();
    for (const s of services) for (const { spec } of s.ports) for (const b of s.all) keep.add(flowId(s.key, spec, b.address));
    for (const [id, t] of this.tallies) if (!keep.has(id) && t.active === 0) this.tallies.delete(id);
  }

  private open(l: Listener): Promise<void> {
    return l.port.protocol === 'UDP' ? this.openUdp(l) : this.openTcp(l);
  }

  private openTcp(l: Listener): Promise<void> {
    const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true });
    server.on('connection', (client) => this.accept(l, client));
    const inherited = this.store?.take(l.id);
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => { server.close(); reject(err); };
      server.once('error', onError);
      const listening = (): void => {
        server.off('error', onError);
        server.on('error', (err) => this.onListenerError(l, err));
        const addr = server.address() as net.AddressInfo | null;
        if (inherited !== undefined && (addr?.address !== l.vip || addr.port !== l.port.port)) {
          // Not the socket this listener had: let it go and bind afresh.
          this.log.warn({ op: 'listen', listener: l.id, found: addr }, 'an inherited listening socket is bound elsewhere; binding a new one');
          server.close();
          this.store?.drop(l.id);
          this.openTcpFresh(l, server).then(resolve, reject);
          return;
        }
        this.listened(l, server, inherited !== undefined);
        resolve();
      };
      if (inherited !== undefined) server.listen({ fd: inherited, backlog: this.backlog }, listening);
      else server.listen({ host: l.vip, port: l.port.port, backlog: this.backlog, exclusive: true }, listening);
    });
  }

  private openTcpFresh(l: Listener, old: net.Server): Promise<void> {
    old.removeAllListeners('connection');
    const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true });
    server.on('connection', (client) => this.accept(l, client));
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => { server.close(); reject(err); };
      server.once('error', onError);
      server.listen({ host: l.vip, port: l.port.port, backlog: this.backlog, exclusive: true }, () => {
        server.off('error', onError);
        server.on('error', (err) => this.onListenerError(l, err));
        this.listened(l, server, false);
        resolve();
      });
    });
  }

  private onListenerError(l: Listener, err: Error): void {
    // libuv has already closed what was pending (its EMFILE reserve-fd trick): those clients saw a close.
    const code = localExhaustionCode(err);
    if (code) this.ownLimit('accept', code, l.route.serviceKey);
    else this.log.error({ op: 'listen', listener: l.id, err: errorMessage(err) }, 'listener error');
  }

  private listened(l: Listener, server: net.Server, inherited: boolean): void {
    l.tcp = server;
    l.boundPort = (server.address() as net.AddressInfo).port;
    // Node keeps the descriptor on its handle; a listener without one (never on Linux) simply is not stored.
    const fd = (server as unknown as { _handle?: { fd?: number } })._handle?.fd;
    if (this.store && typeof fd === 'number' && fd >= 0) this.store.keep(l.id, fd);
    this.log.info({ op: 'listen', service: l.route.serviceKey, vip: l.vip, port: l.boundPort, protocol: 'TCP', inherited },
      inherited ? 'proxy listening on the socket an earlier process left' : 'proxy listening');
  }

  private closeListener(l: Listener): void {
    this.log.info({ op: 'unlisten', listener: l.id }, 'proxy listener closed; open connections drain');
    if (l.tcp) this.store?.drop(l.id);
    l.tcp?.close();
    l.tcp = undefined;
    if (l.udp) {
      // A UDP "listener" cannot drain without its socket: replies need it. Keep
      // it for existing sessions and drop new clients, until the sessions idle out.
      l.route = { ...l.route, healthy: [] };
      this.draining.add(l);
      if (l.sessions.size === 0) this.closeUdp(l);
    }
  }

  // --- TCP ------------------------------------------------------------------

  // The user-buffer path. With stream 'data' events every read allocates a
  // fresh Buffer and walks the Readable machinery (push, addChunk, emit); a
  // socket created with `onread` reads into a buffer we supply and calls us
  // directly, which measured ~20% less CPU per relayed request (wrk
  // keep-alive, loopback). net.connect() takes `onread` (public API);
  // net.Server offers no such option for accepted sockets, so the accepted
  // socket's handle is moved into a new net.Socket built with `onread`
  // (`new net.Socket({ handle })`, the constructor net.Server itself uses).
  // That leans on the undocumented `_handle`, so it is guarded: anything
  // unexpected falls back to the stream path for that connection, and
  // `userBuffers: false` turns the path off. The price is one more Socket
  // object per accepted connection (a few percent of the CPU a new
  // connection costs), repaid after a couple of requests on it.
  // Buffer ownership: a write that does not complete at once keeps a pointer
  // into the buffer the bytes were read into, so that buffer is then "lent"
  // and the socket's next read gets another (the buffer callback runs after
  // every read); buffers no write references return to a free list.
  private adopt(relay: Relay): void {
    const accepted = relay.accepted as net.Socket & { _handle?: unknown };
    const handle = accepted._handle;
    if (!handle || typeof handle !== 'object') return;
    let client: net.Socket;
    try {
      accepted._handle = null;
      client = new net.Socket({
        handle, allowHalfOpen: true, readable: true, writable: true,
        onread: { buffer: () => this.clientReadBuffer(relay), callback: (n: number, buf: Buffer) => this.relayToBackend(relay, n, buf) },
      } as net.SocketConstructorOpts);
    } catch (err) {
      accepted._handle = handle;
      this.log.debug({ op: 'accept', err: errorMessage(err) }, 'cannot adopt the accepted socket; using the stream relay');
      return;
    }
    // Not before the backend is connected (resumed in wire()).
    client.pause();
    relay.client = client;
  }

  private clientReadBuffer(relay: Relay): Buffer {
    if (!relay.fromClient || relay.fromClientLent) {
      relay.fromClient = this.freeBuffers.pop() ?? Buffer.allocUnsafe(RELAY_BUFFER);
      relay.fromClientLent = false;
    }
    return relay.fromClient;
  }

  private backendReadBuffer(relay: Relay): Buffer {
    if (!relay.fromBackend || relay.fromBackendLent) {
      relay.fromBackend = this.freeBuffers.pop() ?? Buffer.allocUnsafe(RELAY_BUFFER);
      relay.fromBackendLent = false;
    }
    return relay.fromBackend;
  }

  /** onread callback of the client socket: returning false pauses it until the backend drains. */
  private relayToBackend(relay: Relay, n: number, buf: Buffer): boolean {
    relay.seen = true;
    const up = relay.upstream;
    if (!up) return true; // refused (closeCleanly): what the client still sends is discarded
    const ok = up.write(buf.subarray(0, n));
    if (up.writableLength > 0) relay.fromClientLent = true;
    return ok;
  }

  private relayToClient(relay: Relay, n: number, buf: Buffer): boolean {
    relay.seen = true;
    const client = relay.client;
    const ok = client.write(buf.subarray(0, n));
    if (client.writableLength > 0) relay.fromBackendLent = true;
    return ok;
  }

  /** Buffers no write still references go back to the free list. */
  private releaseBuffers(relay: Relay): void {
    const free = this.freeBuffers;
    if (relay.fromClient && !relay.fromClientLent && free.length < FREE_BUFFERS_MAX) free.push(relay.fromClient);
    if (relay.fromBackend && !relay.fromBackendLent && free.length < FREE_BUFFERS_MAX) free.push(relay.fromBackend);
    relay.fromClient = undefined;
    relay.fromBackend = undefined;
  }

  private accept(l: Listener, accepted: net.Socket): void {
    const route = l.route;
    if (route.healthy.length === 0) {
      route.refused++;
      accepted.on('error', noop);
      accepted.resetAndDestroy();
      return;
    }
    const full = this.relays.size >= this.maxConnections;
    if (full || this.clock.now() < this.backoffUntil) {
      route.refused++;
      if (full) this.ownLimit('limit', 'max-connections', route.serviceKey);
      this.closeCleanly(accepted);
      return;
    }
    const relay = new Relay(accepted, route, accepted);
    if (this.userBuffers) this.adopt(relay);
    const client = relay.client;
    if (client !== accepted) this.relayed.userBuffers++;
    else this.relayed.streams++;
    this.relays.add(relay);
    client.on('error', (err) => this.onSideError(relay, 'client', err));
    client.on('close', () => {
      relay.clientClosed = true;
      // The server counts the socket it accepted; let it go with ours.
      if (relay.accepted !== client) relay.accepted.destroy();
      // A client gone while we connect: abandon the attempt (its 'close' handler finishes the bookkeeping).
      // Gone after: nothing more will come from it, so the backend gets its FIN (the idle sweep is the backstop).
      const up = relay.upstream;
      if (up && !relay.upstreamConnected) up.destroy();
      else if (up && !up.destroyed && !up.writableEnded) up.end();
      this.maybeDone(relay);
    });
    this.connect(relay, undefined);
  }

  /** Connect to a picked backend; on failure retry once elsewhere (exclude = the failed one), then reset the client. */
  private connect(relay: Relay, exclude: string | undefined): void {
    const route = relay.route;
    const tallies = route.tallies;
    const backend = route.balancer.pick(route.healthy, {
      exclude,
      // Only least-connections looks at the load; round-robin is spared the closure.
      active: route.balancer.algorithm === 'least-connections' ? (address: string) => tallies.get(address)?.active ?? 0 : undefined,
    });
    if (!backend) {
      route.refused++;
      relay.client.resetAndDestroy();
      return;
    }
    const tally = tallies.get(backend.address) ?? this.tally(route.serviceKey, route.port, backend.address);
    tally.active++;
    relay.tally = tally;
    const userBuffers = relay.client !== relay.accepted;
    const up = net.connect({
      host: backend.address, port: route.port.targetPort, allowHalfOpen: true, noDelay: true,
      onread: userBuffers ? { buffer: () => this.backendReadBuffer(relay), callback: (n: number, buf: Buffer) => this.relayToClient(relay, n, buf) } : undefined,
    });
    relay.upstream = up;
    relay.upstreamConnected = false;
    let failure: Error | undefined;
    const timer = this.clock.setTimeout(() => {
      up.destroy(Object.assign(new Error(`connect to ${backend.address}:${route.port.targetPort} timed out after ${this.cfg.connectTimeout} s`), { code: 'ETIMEDOUT' }));
    }, this.cfg.connectTimeout * 1000);
    up.on('error', (err) => {
      if (relay.upstreamConnected) this.onSideError(relay, 'backend', err);
      else failure = err;
    });
    up.once('connect', () => {
      this.clock.clearTimeout(timer);
      this.backoffMs = 0;
      relay.upstreamConnected = true;
      tally.connections++;
      this.onConnectResult(route.serviceKey, backend.address, true);
      if (relay.clientClosed) up.destroy();
      else this.wire(relay, up, userBuffers);
    });
    // 'close' comes once whatever happened (connect error, timeout, abort, normal end): the one place an attempt is accounted.
    up.once('close', () => {
      this.clock.clearTimeout(timer);
      tally.active--;
      if (relay.upstreamConnected) { this.maybeDone(relay); return; }
      relay.upstream = undefined;
      relay.tally = undefined;
      relay.fromBackend = undefined;
      if (relay.clientClosed) { this.maybeDone(relay); return; } // aborted by the client: not the backend's fault
      const own = localExhaustionCode(failure);
      if (own) {
        // Our descriptors, not the backend: no report, no retry (it would fail the same way).
        this.ownLimit('connect', own, route.serviceKey);
        route.refused++;
        this.closeCleanly(relay.client);
        return;
      }
      tally.connectFailures++;
      this.onConnectResult(route.serviceKey, backend.address, false);
      this.log.debug({ op: 'connect', service: route.serviceKey, backend: backend.address, err: errorMessage(failure), retry: exclude === undefined }, 'backend connect failed');
      if (exclude === undefined) this.connect(relay, backend.address);
      else { route.refused++; relay.client.resetAndDestroy(); }
    });
  }

  private wire(relay: Relay, up: net.Socket, userBuffers: boolean): void {
    const client = relay.client;
    if (!userBuffers) {
      // Manual relay rather than pipe(): the same backpressure (write() false
      // pauses the source, 'drain' resumes it) with less per-chunk bookkeeping.
      client.on('data', (chunk: Buffer) => {
        relay.seen = true;
        if (!up.write(chunk)) client.pause();
      });
      up.on('data', (chunk: Buffer) => {
        relay.seen = true;
        if (!client.write(chunk)) up.pause();
      });
    }
    // Backpressure: a write that returned false paused the reading side
    // (stream path: pause(); user-buffer path: the onread callback returned false).
    up.on('drain', () => client.resume());
    client.on('drain', () => up.resume());
    // Half-close: a FIN from one side becomes a FIN to the other once what
    // was read before it has been written.
    client.on('end', () => up.end());
    up.on('end', () => client.end());
    client.resume();
  }

  private onSideError(relay: Relay, side: 'client' | 'backend', err: Error): void {
    this.log.debug({ op: 'relay', side, service: relay.route.serviceKey, err: errorMessage(err) }, 'connection error; resetting the other side');
    const other = side === 'client' ? relay.upstream : relay.client;
    if (other && !other.destroyed) other.resetAndDestroy();
  }

  /**
   * Refuse a client for our own limits with a clean close: FIN at once, what
   * it sends is read and discarded (closing with unread bytes would turn the
   * FIN into a RST), and the socket goes when it closes too or after 1 s.
   * Unlike "no healthy backend" (a RST, as the kernel path), this is not the
   * service refusing: the client may retry.
   */
  private closeCleanly(sock: net.Socket): void {
    sock.on('error', noop);
    if (this.refusalsDraining >= REFUSALS_DRAINING_MAX) {
      // Under a flood, free the descriptor now: still a FIN unless the client already sent bytes.
      sock.end();
      sock.destroy();
      return;
    }
    this.refusalsDraining++;
    const timer = this.clock.setTimeout(() => sock.destroy(), 1000);
    sock.once('close', () => { this.refusalsDraining--; this.clock.clearTimeout(timer); });
    sock.on('end', () => sock.destroy());
    sock.end();
    sock.resume();
  }

  /**
   * A client refused for our own limits: counted; descriptor exhaustion also
   * starts (or doubles) the backoff during which new clients are refused at once.
   */
  private ownLimit(op: 'accept' | 'connect' | 'limit', code: string, service: string): void {
    const k = `${op}/${code}`;
    this.exhaustion.set(k, (this.exhaustion.get(k) ?? 0) + 1);
    this.exhaustionSinceWarn++;
    const now = this.clock.now();
    if (op !== 'limit') {
      this.backoffMs = Math.min(BACKOFF_MAX_MS, Math.max(BACKOFF_MIN_MS, this.backoffMs * 2));
      this.backoffUntil = now + this.backoffMs;
    }
    if (now - this.lastExhaustionWarn < EXHAUSTION_WARN_MS) return;
    this.lastExhaustionWarn = now;
    const refusedSince = this.exhaustionSinceWarn;
    this.exhaustionSinceWarn = 0;
    this.log.warn(
      { op: 'own-limit', what: k, service, refusedSince, open: this.relays.size, maxConnections: this.maxConnections, backoffMs: op === 'limit' ? 0 : this.backoffMs },
      op === 'limit'
        ? `proxy at maxConnections (${this.maxConnections}): new clients are reset; raise proxy.maxConnections and the unit's LimitNOFILE`
        : `proxy out of ${code === 'ENOBUFS' ? 'socket buffers' : 'file descriptors'} (${code} on ${op}): clients reset, backends not blamed; accepting again in ${this.backoffMs} ms (raise LimitNOFILE or lower proxy.maxConnections)`,
    );
  }

  /** The relay ends when the client socket and the backend socket (if any) are both closed. */
  private maybeDone(relay: Relay): void {
    if (!relay.clientClosed) return;
    if (relay.upstream && !relay.upstream.closed) return;
    if (!this.relays.delete(relay)) return;
    this.foldBytes(relay);
    this.releaseBuffers(relay);
  }

  private foldBytes(relay: Relay): void {
    const t = relay.tally;
    if (!t || !relay.upstream) return;
    const toBackend = relay.client.bytesRead;
    const toClient = relay.upstream.bytesRead;
    t.bytesToBackend += toBackend - relay.reportedToBackend;
    t.bytesToClient += toClient - relay.reportedToClient;
    relay.reportedToBackend = toBackend;
    relay.reportedToClient = toClient;
  }

  // --- UDP ------------------------------------------------------------------

  private openUdp(l: Listener): Promise<void> {
    const sock = dgram.createSocket({ type: 'udp4', reuseAddr: false });
    sock.on('message', (msg, rinfo) => this.onDatagram(l, msg, rinfo));
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => { sock.close(); reject(err); };
      sock.once('error', onError);
      sock.bind({ address: l.vip, port: l.port.port, exclusive: true }, () => {
        sock.off('error', onError);
        sock.on('error', (err) => this.log.error({ op: 'listen', listener: l.id, err: errorMessage(err) }, 'udp listener error'));
        l.udp = sock;
        l.boundPort = sock.address().port;
        this.log.info({ op: 'listen', service: l.route.serviceKey, vip: l.vip, port: l.boundPort, protocol: 'UDP' }, 'proxy listening');
        resolve();
      });
    });
  }

  private onDatagram(l: Listener, msg: Buffer, rinfo: dgram.RemoteInfo): void {
    const key = `${rinfo.address}:${rinfo.port}`;
    let s = l.sessions.get(key);
    if (!s) {
      const route = l.route;
      const backend = l.sessions.size < this.maxUdpSessions
        ? route.balancer.pick(route.healthy, { active: (a) => route.tallies.get(a)?.active ?? 0 })
        : undefined;
      if (!backend) { route.refused++; return; }
      const tally = route.tallies.get(backend.address) ?? this.tally(route.serviceKey, route.port, backend.address);
      const socket = dgram.createSocket('udp4');
      const session: UdpSession = { socket, tally, clientAddress: rinfo.address, clientPort: rinfo.port, key, ready: false, queue: [], seen: true, idleTicks: 0 };
      s = session;
      l.sessions.set(key, session);
      tally.connections++;
      tally.active++;
      socket.on('message', (reply) => {
        session.seen = true;
        tally.bytesToClient += reply.length;
        l.udp?.send(reply, session.clientPort, session.clientAddress);
      });
      socket.on('error', (err) => {
        // A connected UDP socket reports the backend's ICMP port unreachable as ECONNREFUSED.
        if ((err as NodeJS.ErrnoException).code === 'ECONNREFUSED') {
          tally.connectFailures++;
          this.onConnectResult(route.serviceKey, backend.address, false);
        }
        this.closeSession(l, session);
      });
      socket.connect(route.port.targetPort, backend.address, () => {
        session.ready = true;
        const q = session.queue ?? [];
        session.queue = undefined;
        for (const m of q) socket.send(m);
      });
    }
    s.seen = true;
    s.tally.bytesToBackend += msg.length;
    if (s.ready) s.socket.send(msg);
    else if (s.queue && s.queue.length < 64) s.queue.push(msg);
  }

  private closeSession(l: Listener, s: UdpSession): void {
    if (l.sessions.get(s.key) !== s) return;
    l.sessions.delete(s.key);
    s.tally.active--;
    try { s.socket.close(); } catch { /* already closed */ }
    if (this.draining.has(l) && l.sessions.size === 0) this.closeUdp(l);
  }

  private closeUdp(l: Listener): void {
    this.draining.delete(l);
    try { l.udp?.close(); } catch { /* already closed */ }
    l.udp = undefined;
  }

  // --- idle sweep -----------------------------------------------------------

  private ensureSweep(): void {
    if (this.sweepTimer !== undefined || this.stopped) return;
    const tcpMs = this.cfg.idleTimeout * 1000;
    const every = Math.max(50, Math.min(tcpMs, this.udpIdleMs) / IDLE_SWEEPS);
    const tick = (): void => {
      this.sweepTimer = undefined;
      if (this.stopped) return;
      this.sweep(every, tcpMs);
      this.sweepTimer = this.clock.setTimeout(tick, every);
      this.sweepTimer.unref?.();
    };
    this.sweepTimer = this.clock.setTimeout(tick, every);
    this.sweepTimer.unref?.();
  }

  /** Close what saw no traffic for its idle timeout (checked every `every` ms, so up to one period late). */
  private sweep(every: number, tcpMs: number): void {
    for (const r of this.relays) {
      if (r.seen) { r.seen = false; r.idleTicks = 0; continue; }
      if (++r.idleTicks * every < tcpMs) continue;
      this.log.debug({ op: 'idle', service: r.route.serviceKey }, 'closing idle connection');
      r.client.destroy();
      r.upstream?.destroy();
    }
    for (const l of [...this.listeners.values(), ...this.draining]) {
      for (const s of l.sessions.values()) {
        if (s.seen) { s.seen = false; s.idleTicks = 0; continue; }
        if (++s.idleTicks * every >= this.udpIdleMs) this.closeSession(l, s);
      }
    }
  }

  // --- lifecycle and stats --------------------------------------------------

  stop(opts: { keep?: boolean } = {}): Promise<void> {
    return this.queue.run(async () => {
      if (this.stopped) return;
      this.stopped = true;
      if (this.sweepTimer !== undefined) this.clock.clearTimeout(this.sweepTimer);
      this.metrics?.unregister();
      const closing: Promise<void>[] = [];
      for (const l of [...this.listeners.values(), ...this.draining]) {
        // With keep, the listening socket itself lives on in the store: closing our descriptor only stops accepting.
        if (l.tcp) { const s = l.tcp; closing.push(new Promise((r) => s.close(() => r()))); l.tcp = undefined; }
        for (const s of [...l.sessions.values()]) this.closeSession(l, s);
        this.closeUdp(l);
      }
      this.listeners.clear();
      if (opts.keep && this.relays.size > 0) {
        // A planned restart: connections already accepted finish (bounded) instead of being cut.
        const open = this.relays.size;
        const deadline = this.clock.now() + this.drainTimeoutMs;
        while (this.relays.size > 0 && this.clock.now() < deadline) await new Promise((r) => this.clock.setTimeout(() => r(undefined), 20));
        this.log.info({ op: 'stop', open, unfinished: this.relays.size }, `waited for ${open - this.relays.size} of ${open} open connections to finish`);
      }
      for (const r of [...this.relays]) { r.client.destroy(); r.upstream?.destroy(); r.accepted.destroy(); }
      await Promise.all(closing);
      this.log.info({ op: 'stop', keep: opts.keep === true }, opts.keep ? 'proxy stopped; its listening sockets stay with the service manager' : 'proxy stopped');
    });
  }

  async stats(): Promise<ForwardStats> {
    for (const r of this.relays) this.foldBytes(r);
    const { services } = normalizeState(this.state);
    const flows: FlowStats[] = [];
    for (const s of services) {
      for (const { spec } of s.ports) {
        for (const b of s.all) {
          const t = this.tallies.get(flowId(s.key, spec, b.address)) ?? new Tally();
          flows.push({
            service: s.key, port: portLabel(spec), protocol: spec.protocol, backend: b.address,
            connections: t.connections, active: t.active, bytesToBackend: t.bytesToBackend, bytesToClient: t.bytesToClient, connectFailures: t.connectFailures,
          });
        }
      }
    }
    const listeners = [...this.listeners.values()].map((l) => ({
      service: l.route.serviceKey, vip: l.vip, port: l.port.port, boundPort: l.boundPort, protocol: l.port.protocol,
      healthy: l.route.healthy.length, refused: l.route.refused, udpSessions: l.port.protocol === 'UDP' ? l.sessions.size : undefined,
    }));
    return {
      kind: 'proxy',
      services: services.map((s) => ({ key: s.key, vip: s.vip, healthy: s.healthy.length, backends: s.all.length, noHealthyBackend: s.healthy.length === 0 })),
      flows,
      problems: [...this.problems],
      details: { listeners, openConnections: this.relays.size, maxConnections: this.maxConnections, algorithm: this.cfg.algorithm, relayed: { ...this.relayed } },
      ownLimits: Object.fromEntries(this.exhaustion),
    };
  }
}

function listenerId(vip: string, p: PortSpec): string {
  return `${vip}|${p.protocol}|${p.port}`;
}

function sameBackends(a: readonly BackendSpec[], b: readonly BackendSpec[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i]!.address !== b[i]!.address || a[i]!.weight !== b[i]!.weight) return false;
  return true;
}

function noop(): void { /* errors after a deliberate reset are expected */ }
