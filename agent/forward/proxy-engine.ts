// forward/ layer: one proxy engine - the relaying half of the userspace data
// path. Each worker thread runs one (proxy-worker.ts); with `inline` the main
// thread does. The main thread (proxy.ts) owns the listening sockets, the
// fd store, health and state; an engine accepts on the descriptors it is
// handed, picks a backend, connects, relays, and counts into its region of
// the shared tallies (tallies.ts). It never binds a TCP port itself and
// never decides health: every connect result goes to onConnectResult (the
// passive health path).
//
// TCP, per accepted connection: no healthy backend resets the client (RST,
// as the kernel path's `reject with tcp reset`); at maxConnections (over all
// engines) or during the back-off after our own descriptor exhaustion the
// client gets a clean close (FIN: the service is up, we are full). Otherwise
// a backend is picked (weighted round-robin or least-connections over every
// engine's open connections), connected (a failed or timed-out connect is
// retried once on another healthy backend, then the client is reset), the
// PROXY protocol header goes out first when the service asks for it, and
// bytes are relayed both ways with backpressure and half-close. How the
// bytes move is the relay path's business: relay-native.ts, where the addon
// moves them (tests may hand an engine another RelayPath).
//
// Own exhaustion is own fault: EMFILE, ENFILE or ENOBUFS on accept
// or connect is this process out of descriptors or buffers: no passive-health
// report, no retry, the client is closed cleanly, the refusal counted, one
// warn line per interval, and new clients are refused for a back-off (50 ms
// doubling to 2 s).
//
// Timers: none per connection. One coarse tick (every 100 ms, less when the
// connect timeout is shorter) checks the connects in flight against their
// deadlines, ends refused clients whose clean close lingers, and every
// quarter of the idle timeout sweeps for silent connections (a flag set by
// the relay on every read, cleared by the sweep).
//
// UDP: the engine that is told to serve a UDP port binds it itself (dgram has
// no descriptor adoption); the first datagram of a client address:port opens
// a session (a connected socket to a picked backend); replies go back from
// the VIP:port; sessions end after udpIdleTimeout without traffic, and at
// once when their backend leaves the port's healthy set or the port goes
// (endLeftSessions). With PROXY
// protocol v2 every datagram to the backend carries the header (UDP has no
// stream to put it in front of; v1 has no UDP and is refused at validate).
import * as dgram from 'node:dgram';
import { closeSync } from 'node:fs';
import type { PortSpec, ProxyConfig } from '../config/types';
import type { Clock, TimerHandle } from '../clock';
import { errorMessage, localExhaustionCode } from '../errors';
import { SharedPositionRoundRobin, WeightedLeastConnections, type Balancer } from './balancer';
import {
  PROXY_V1_MAX_LENGTH, PROXY_V2_IPV4_LENGTH, proxyHeaderV1, proxyHeaderV2Template, proxyHeaderV2Template6, writeV2Into, writeV2Source, writeV2Source6,
  type ProxyProtocolVersion,
} from './proxy-protocol';
import {
  ENGINE_ACCEPTED, ENGINE_PP_ALONE, ENGINE_PP_WITH_DATA, FLOW_BYTES_TO_BACKEND, FLOW_BYTES_TO_CLIENT, FLOW_CONNECTIONS,
  FLOW_CONNECT_FAILURES, LISTENER_REFUSED, LISTENER_UDP_ENDED, LISTENER_UDP_SESSIONS, TallyWriter, ownLimitField,
  type OwnLimitKey, type SlotBuffers, type TallyBuffers,
} from './tallies';
import { REFUSALS_DRAINING_MAX } from './capacity';
import { addressToBytes, parseAddress, parseIPv4, unmapIPv4 } from '../address';

/** The part of a logger an engine uses; in a worker it forwards to the main thread's logger. */
export interface EngineLog {
  debug(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** A backend as an engine needs it: with the slot of its (service, port, backend) flow. */
export interface EngineBackend {
  readonly address: string;
  readonly weight: number;
  readonly slot: number;
}

/** One VIP:port as the main thread hands it to an engine. */
export interface EngineListenerSpec {
  readonly id: string;
  readonly serviceKey: string;
  readonly vip: string;
  readonly port: PortSpec;
  /** The backends new connections may go to. */
  readonly healthy: readonly EngineBackend[];
  /** The slots of every configured backend (draining ones too), by address. */
  readonly flows: Readonly<Record<string, number>>;
  /** The listener's own slot (refusals, UDP sessions). */
  readonly slot: number;
  readonly proxyProtocol: ProxyProtocolVersion | undefined;
  /** TCP: listening descriptors this engine takes over and will close; only when the listener is new to it. */
  readonly fds?: readonly number[];
  /** UDP: this engine serves the port (binds it). */
  readonly udp?: boolean;
}

export interface EngineApply {
  readonly listeners: readonly EngineListenerSpec[];
  readonly config: ProxyConfig;
  /** Bigger tally slots, when the main thread grew them. */
  readonly slots?: SlotBuffers;
}

export interface EngineStats {
  /** Open relays held by this engine. */
  readonly open: number;
  readonly listeners: number;
}

export interface EngineOptions {
  readonly index: number;
  readonly buffers: TallyBuffers;
  readonly config: ProxyConfig;
  readonly log: EngineLog;
  readonly clock: Clock;
  /** Passive health: every backend connect (and UDP port unreachable), with the flow's slot. */
  readonly onConnectResult: (serviceKey: string, backend: string, slot: number, ok: boolean) => void;
  /** How TCP bytes move: the addon's relay (relay-native.ts nativeRelayPath). */
  readonly relay: RelayPath;
  /** Proxied TCP connections at once over every engine (exact: an atomic counter). */
  readonly maxConnections: number;
  readonly backlog: number;
  readonly udpIdleMs: number;
  readonly maxUdpSessions: number;
}

/** A TCP listening socket as a relay path serves it. */
export interface PathListener {
  close(): void;
}

/**
 * How a relay path plugs into the engine: it listens on a descriptor and
 * calls `accepted` with a Relay of its own kind for every connection (or the
 * error code of a failed accept).
 */
export interface RelayPath {
  listen(fd: number, backlog: number, accepted: (err: string | undefined, relay: Relay | undefined) => void): PathListener;
  /**
   * Paths that count traffic below JavaScript (relay-native.ts) bring each
   * relay's `seen` flag and bytes up to date here; called on every tick,
   * before the idle sweep.
   */
  refresh?(): void;
}

/** What a listener forwards to now; replaced (not mutated) on apply, so a connection in flight sees one set. */
export interface Route {
  readonly serviceKey: string;
  readonly port: PortSpec;
  readonly vip: string;
  /** An IPv4 VIP as a host-order u32 (0 for IPv6). */
  readonly vipNum: number;
  /** An IPv6 VIP's 16 bytes in network order; undefined for IPv4. */
  readonly vip6: Buffer | undefined;
  readonly healthy: readonly EngineBackend[];
  readonly flows: ReadonlyMap<string, number>;
  readonly balancer: Balancer;
  readonly algorithm: ProxyConfig['algorithm'];
  readonly slot: number;
  readonly proxyProtocol: ProxyProtocolVersion | undefined;
  /** v2: the header's constant part for this VIP:port, built once (per connection only the client is filled in). */
  readonly ppTemplate: Buffer | undefined;
  /** least-connections' view of a backend's load (over every engine); undefined for round-robin. */
  readonly active: ((address: string) => number) | undefined;
}

/**
 * One relayed TCP connection: the engine's bookkeeping. A relay path
 * subclasses it with the sockets and implements the I/O verbs; the engine
 * calls them and the path calls back connectDone(), read() counts and done().
 */
export abstract class Relay {
  engine!: ProxyEngine;
  route!: Route;
  backend: EngineBackend | undefined;
  /** The backend a failed first connect went to: the retry avoids it. */
  failedOnce: string | undefined;
  connectDeadline = 0;
  /** A connect to `backend` is in flight. */
  connecting = false;
  /** This relay counts in its backend's open connections (least-connections' load). */
  holding = false;
  /** Set by the relay on every read; the idle sweep clears it. */
  seen = true;
  idleTicks = 0;
  finished = false;

  /** Connect the backend side; the path calls engine.connectDone(this, undefined | code). */
  abstract connect(host: string, port: number): void;
  /** Give up the connect in flight (timeout); the path then calls connectDone with the code given. */
  abstract abortConnect(code: string): void;
  /**
   * Relay both ways; with `proxyHeader` the PROXY protocol header goes to the
   * backend first (the path gets it from engine.writeHeader and reports how
   * it went out with engine.headerSent).
   */
  abstract start(proxyHeader: boolean): void;
  /** The client address as the kernel reports it (for the PROXY header). */
  abstract peer(): { address: string; port: number } | undefined;
  /** RST to the client (no healthy backend, failed connects). */
  abstract reset(): void;
  /** Own limits: FIN to the client, read and drop what it sends, close within 1 s. */
  abstract refuse(): void;
  /** Close both sides now (idle, stop). */
  abstract destroy(): void;
}

/** One warn line per this interval about refusals for our own limits; the counters have every one. */
const EXHAUSTION_WARN_MS = 10_000;
const BACKOFF_MIN_MS = 50;
const BACKOFF_MAX_MS = 2000;
const IDLE_SWEEPS = 4;
const TICK_MS = 100;
const REFUSAL_LINGER_MS = 1000;

interface EngineListener {
  readonly id: string;
  spec: EngineListenerSpec;
  route: Route;
  tcp: PathListener[];
  udp: dgram.Socket | undefined;
  readonly sessions: Map<string, UdpSession>;
}

interface UdpSession {
  readonly socket: dgram.Socket;
  readonly slot: number;
  /** The backend's "address:targetPort": the session ends when its port no longer sends there. */
  readonly backend: string;
  readonly clientAddress: string;
  readonly clientPort: number;
  readonly key: string;
  /** PROXY v2 header for every datagram of the session, when asked. */
  readonly header: Buffer | undefined;
  ready: boolean;
  queue: Buffer[] | undefined;
  seen: boolean;
  idleTicks: number;
}

export class ProxyEngine {
  readonly tallies: TallyWriter;
  private cfg: ProxyConfig;
  private readonly log: EngineLog;
  private readonly clock: Clock;
  private readonly report: EngineOptions['onConnectResult'];
  readonly path: RelayPath;
  private readonly maxConnections: number;
  private readonly backlog: number;
  private readonly udpIdleMs: number;
  private readonly maxUdpSessions: number;
  private readonly listeners = new Map<string, EngineListener>();
  readonly relays = new Set<Relay>();
  private readonly connecting = new Set<Relay>();
  /** Refused clients whose clean close is under way, with their deadline. */
  private readonly refusing = new Map<{ destroy(): void }, number>();
  private tickTimer: TimerHandle | undefined;
  private lastSweep = 0;
  private stopped = false;
  private exhaustionSinceWarn = 0;
  private lastExhaustionWarn = -Infinity;
  private backoffMs = 0;
  private backoffUntil = -Infinity;

  constructor(opts: EngineOptions) {
    this.tallies = new TallyWriter(opts.buffers, opts.index);
    this.cfg = opts.config;
    this.log = opts.log;
    this.clock = opts.clock;
    this.report = opts.onConnectResult;
    this.path = opts.relay;
    this.maxConnections = opts.maxConnections;
    this.backlog = opts.backlog;
    this.udpIdleMs = opts.udpIdleMs;
    this.maxUdpSessions = opts.maxUdpSessions;
  }

  /** Make this engine serve exactly these listeners; returns what could not be served. */
  async apply(a: EngineApply): Promise<string[]> {
    if (a.slots) this.tallies.adopt(a.slots);
    this.cfg = a.config;
    const wanted = new Map(a.listeners.map((l) => [l.id, l]));
    for (const [id, l] of this.listeners) {
      if (wanted.has(id)) continue;
      this.listeners.delete(id);
      this.closeListener(l);
    }
    const failures: string[] = [];
    for (const spec of a.listeners) {
      const existing = this.listeners.get(spec.id);
      if (existing) {
        existing.spec = spec;
        existing.route = this.routeFor(spec, existing.route);
        this.endLeftSessions(existing);
        if (spec.fds) for (const fd of spec.fds) this.openTcp(existing, fd, failures);
        continue;
      }
      const l: EngineListener = { id: spec.id, spec, route: this.routeFor(spec, undefined), tcp: [], udp: undefined, sessions: new Map() };
      if (spec.port.protocol === 'UDP') {
        if (!spec.udp) continue;
        try {
          await this.openUdp(l);
        } catch (err) {
          failures.push(`${spec.serviceKey}: cannot listen on ${spec.vip}:${spec.port.port}/UDP: ${errorMessage(err)}`);
          continue;
        }
      } else {
        for (const fd of spec.fds ?? []) this.openTcp(l, fd, failures);
      }
      this.listeners.set(spec.id, l);
    }
    this.ensureTick();
    return failures;
  }

  reconfigure(cfg: ProxyConfig): void {
    this.cfg = cfg;
  }

  private routeFor(spec: EngineListenerSpec, previous: Route | undefined): Route {
    const algorithm = this.cfg.algorithm;
    const same = previous !== undefined && previous.serviceKey === spec.serviceKey && previous.port.targetPort === spec.port.targetPort && previous.algorithm === algorithm;
    const flows = new Map(Object.entries(spec.flows));
    const tallies = this.tallies;
    const active = algorithm === 'least-connections'
      ? (address: string): number => { const s = flows.get(address); return s === undefined ? 0 : tallies.activeTotal(s); }
      : undefined;
    // Keep the balancer (its round-robin position) and, when nothing changed, the very array (the balancer's fast path).
    const unchanged = same && sameBackends(previous.healthy, spec.healthy);
    const vip = parseAddress(spec.vip);
    const vip6 = vip?.family === 'IPv6' ? addressToBytes(vip) : undefined;
    return {
      serviceKey: spec.serviceKey, port: spec.port, vip: spec.vip, vipNum: parseIPv4(spec.vip) ?? 0, vip6,
      healthy: unchanged ? previous.healthy : spec.healthy,
      flows, balancer: same && previous.slot === spec.slot ? previous.balancer : this.balancer(algorithm, spec.slot), algorithm, slot: spec.slot,
      proxyProtocol: spec.proxyProtocol,
      ppTemplate: spec.proxyProtocol !== 'v2' ? undefined
        : vip6 ? proxyHeaderV2Template6(vip6, spec.port.port, 'tcp') : proxyHeaderV2Template(parseIPv4(spec.vip) ?? 0, spec.port.port, 'tcp'),
      active,
    };
  }

  /** Round-robin advances a position every engine shares (exact weights over all workers); least-connections reads every engine's load. */
  private balancer(algorithm: ProxyConfig['algorithm'], slot: number): Balancer {
    if (algorithm === 'least-connections') return new WeightedLeastConnections();
    const tallies = this.tallies;
    return new SharedPositionRoundRobin({ next: () => tallies.nextPosition(slot), peek: () => tallies.peekPosition(slot) });
  }

  private openTcp(l: EngineListener, fd: number, failures: string[]): void {
    try {
      l.tcp.push(this.path.listen(fd, this.backlog, (err, relay) => this.accepted(l, err, relay)));
    } catch (err) {
      try { closeSync(fd); } catch { /* not ours any more */ }
      failures.push(`${l.spec.serviceKey}: cannot serve ${l.spec.vip}:${l.spec.port.port}/TCP on descriptor ${fd}: ${errorMessage(err)}`);
    }
  }

  private closeListener(l: EngineListener): void {
    for (const t of l.tcp) t.close();
    l.tcp = [];
    if (l.udp) {
      // A UDP port that goes sends nowhere: its sessions end with it (endLeftSessions says why).
      l.route = { ...l.route, healthy: [] };
      this.endLeftSessions(l);
      this.closeUdp(l);
    }
  }

  // --- TCP ------------------------------------------------------------------

  private accepted(l: EngineListener, err: string | undefined, relay: Relay | undefined): void {
    if (err !== undefined || relay === undefined) {
      const own = localExhaustionCode({ code: err });
      // libuv has already closed what was pending (its EMFILE reserve-fd trick): those clients saw a close.
      if (own) this.ownLimit('accept', own, l.route.serviceKey);
      else this.log.error({ op: 'accept', listener: l.id, err }, 'accept failed');
      return;
    }
    const route = l.route;
    relay.engine = this;
    relay.route = route;
    const t = this.tallies;
    if (route.healthy.length === 0) {
      t.add(route.slot, LISTENER_REFUSED, 1);
      relay.finished = true;
      relay.reset();
      return;
    }
    if (this.clock.now() < this.backoffUntil) {
      t.add(route.slot, LISTENER_REFUSED, 1);
      this.refuse(relay);
      return;
    }
    if (!t.tryOpen(this.maxConnections)) {
      t.add(route.slot, LISTENER_REFUSED, 1);
      this.ownLimit('limit', 'max-connections', route.serviceKey);
      this.refuse(relay);
      return;
    }
    t.engineAdd(ENGINE_ACCEPTED, 1);
    this.relays.add(relay);
    this.connect(relay);
  }

  /** Pick a backend (avoiding the one a first connect failed on) and connect; none left: reset the client. */
  private connect(r: Relay): void {
    const route = r.route;
    const exclude = r.failedOnce;
    const b = route.balancer.pick(route.healthy, exclude === undefined && route.active === undefined ? undefined : { exclude, active: route.active });
    if (!b) {
      this.tallies.add(route.slot, LISTENER_REFUSED, 1);
      this.finish(r);
      r.reset();
      return;
    }
    r.backend = b;
    r.holding = true;
    this.tallies.activeAdd(b.slot, 1);
    r.connectDeadline = this.clock.now() + this.cfg.connectTimeout * 1000;
    r.connecting = true;
    this.connecting.add(r);
    this.ensureTick();
    r.connect(b.address, route.port.targetPort);
  }

  /** The path's report of a connect: undefined = connected, else the error code (ECONNREFUSED, ETIMEDOUT, EMFILE...). */
  connectDone(r: Relay, code: string | undefined): void {
    r.connecting = false;
    this.connecting.delete(r);
    const b = r.backend!;
    const route = r.route;
    const t = this.tallies;
    if (r.finished) { this.release(r); return; }
    if (code === undefined) {
      t.add(b.slot, FLOW_CONNECTIONS, 1);
      this.backoffMs = 0;
      this.report(route.serviceKey, b.address, b.slot, true);
      r.start(route.proxyProtocol !== undefined);
      return;
    }
    this.release(r);
    r.backend = undefined;
    const own = localExhaustionCode({ code });
    if (own) {
      // Our descriptors, not the backend: no report, no retry (it would fail the same way).
      this.ownLimit('connect', own, route.serviceKey);
      t.add(route.slot, LISTENER_REFUSED, 1);
      this.finish(r);
      r.refuse();
      return;
    }
    t.add(b.slot, FLOW_CONNECT_FAILURES, 1);
    this.report(route.serviceKey, b.address, b.slot, false);
    this.log.debug({ op: 'connect', service: route.serviceKey, backend: b.address, err: code, retry: r.failedOnce === undefined }, 'backend connect failed');
    if (r.failedOnce === undefined) {
      r.failedOnce = b.address;
      this.connect(r);
      return;
    }
    t.add(route.slot, LISTENER_REFUSED, 1);
    this.finish(r);
    r.reset();
  }

  /**
   * Write the PROXY protocol header of a relayed connection into `into` at
   * `at` (at least PROXY_V1_MAX_LENGTH bytes of room): the client as the
   * kernel saw it, the VIP:port it reached. Returns its length; 0 (no header)
   * when the client's address is gone (it left while the backend connected).
   * v2 copies the route's template and fills in the client: for IPv4 no
   * string and no allocation per connection.
   */
  writeHeader(r: Relay, into: Buffer, at: number): number {
    const route = r.route;
    const peer = r.peer();
    if (!peer) return 0;
    if (route.proxyProtocol === 'v1') {
      return into.write(proxyHeaderV1({ source: peer.address, sourcePort: peer.port, destination: route.vip, destinationPort: route.port.port }), at, 'latin1');
    }
    const tpl = route.ppTemplate;
    if (tpl === undefined) return 0;
    if (route.vip6 !== undefined) {
      const src = parseAddress(peer.address);
      if (src?.family !== 'IPv6') return 0;
      tpl.copy(into, at);
      writeV2Source6(into, at, addressToBytes(src), peer.port);
      return tpl.length;
    }
    const src = parseIPv4(peer.address.startsWith('::ffff:') ? peer.address.slice(7) : peer.address);
    if (src === undefined) return 0;
    tpl.copy(into, at);
    writeV2Source(into, at, src, peer.port);
    return tpl.length;
  }

  /** The header as a buffer of its own (the streams path), or undefined as writeHeader's 0. */
  header(r: Relay): Buffer | undefined {
    const b = Buffer.allocUnsafe(PROXY_V1_MAX_LENGTH);
    const n = this.writeHeader(r, b, 0);
    return n === 0 ? undefined : b.subarray(0, n);
  }

  /** A PROXY header went out: in the same write as the client's first bytes, or alone (the client had sent nothing yet). */
  headerSent(withData: boolean): void {
    this.tallies.engineAdd(withData ? ENGINE_PP_WITH_DATA : ENGINE_PP_ALONE, 1);
  }

  /** Bytes relayed, as they go (the path calls it per read). */
  bytes(r: Relay, toBackend: number, toClient: number): void {
    const b = r.backend;
    if (!b) return;
    if (toBackend) this.tallies.add(b.slot, FLOW_BYTES_TO_BACKEND, toBackend);
    if (toClient) this.tallies.add(b.slot, FLOW_BYTES_TO_CLIENT, toClient);
  }

  /** The relay is over (both sides closed or closing): its connection leaves the counts. */
  done(r: Relay): void {
    if (r.finished) return;
    this.finish(r);
    this.release(r);
  }

  /** The relay no longer counts in its backend's open connections. */
  private release(r: Relay): void {
    if (!r.holding) return;
    r.holding = false;
    this.tallies.activeAdd(r.backend!.slot, -1);
  }

  private finish(r: Relay): void {
    if (r.finished) return;
    r.finished = true;
    // A connect still in flight reports later (connectDone sees `finished`).
    this.connecting.delete(r);
    if (this.relays.delete(r)) this.tallies.closed();
  }

  /** A client refused for our own limits: FIN now, its bytes dropped, gone within 1 s (or at once under a flood). */
  private refuse(r: Relay): void {
    r.finished = true;
    r.refuse();
  }

  /** The path's clean-close bookkeeping: at most REFUSALS_DRAINING_MAX linger, each for 1 s at most. */
  lingerRefused(sock: { destroy(): void }): boolean {
    if (this.refusing.size >= REFUSALS_DRAINING_MAX) return false;
    this.refusing.set(sock, this.clock.now() + REFUSAL_LINGER_MS);
    this.ensureTick();
    return true;
  }

  refusedGone(sock: { destroy(): void }): void {
    this.refusing.delete(sock);
  }

  /** A refusal for our own limits: counted; descriptor exhaustion also starts (or doubles) the back-off. */
  private ownLimit(op: 'accept' | 'connect' | 'limit', code: string, service: string): void {
    const key = `${op}/${code}` as OwnLimitKey;
    this.tallies.engineAdd(ownLimitField(key), 1);
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
      { op: 'own-limit', what: key, service, refusedSince, open: this.relays.size, maxConnections: this.maxConnections, backoffMs: op === 'limit' ? 0 : this.backoffMs },
      op === 'limit'
        ? `proxy at maxConnections (${this.maxConnections}): new clients are closed; raise proxy.maxConnections and the unit's LimitNOFILE`
        : `proxy out of ${code === 'ENOBUFS' ? 'socket buffers' : 'file descriptors'} (${code} on ${op}): clients closed, backends not blamed; accepting again in ${this.backoffMs} ms (raise LimitNOFILE or lower proxy.maxConnections)`,
    );
  }

  // --- UDP ------------------------------------------------------------------

  private openUdp(l: EngineListener): Promise<void> {
    const v6 = parseAddress(l.spec.vip)?.family === 'IPv6';
    const sock = dgram.createSocket({ type: v6 ? 'udp6' : 'udp4', reuseAddr: false, ipv6Only: v6 });
    sock.on('message', (msg, rinfo) => this.onDatagram(l, msg, rinfo));
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => { sock.close(); reject(err); };
      sock.once('error', onError);
      sock.bind({ address: l.spec.vip, port: l.spec.port.port, exclusive: true }, () => {
        sock.off('error', onError);
        sock.on('error', (err) => this.log.error({ op: 'listen', listener: l.id, err: errorMessage(err) }, 'udp listener error'));
        l.udp = sock;
        this.log.info({ op: 'listen', service: l.spec.serviceKey, vip: l.spec.vip, port: sock.address().port, protocol: 'UDP' }, 'proxy listening');
        resolve();
      });
    });
  }

  /** The UDP port actually bound (port 0 in tests binds an ephemeral one). */
  udpPort(id: string): number | undefined {
    const l = this.listeners.get(id);
    return l?.udp ? l.udp.address().port : undefined;
  }

  private onDatagram(l: EngineListener, msg: Buffer, rinfo: dgram.RemoteInfo): void {
    const key = `${rinfo.address}:${rinfo.port}`;
    let s = l.sessions.get(key);
    if (!s) {
      const route = l.route;
      const backend = l.sessions.size < this.maxUdpSessions ? route.balancer.pick(route.healthy, route.active ? { active: route.active } : undefined) : undefined;
      if (!backend) { this.tallies.add(route.slot, LISTENER_REFUSED, 1); return; }
      // A VIP forwards to backends of its own family (config/families.ts).
      const socket = dgram.createSocket(route.vip6 ? 'udp6' : 'udp4');
      let header: Buffer | undefined;
      if (route.proxyProtocol === 'v2' && route.vip6) {
        const src = parseAddress(rinfo.address);
        header = proxyHeaderV2Template6(route.vip6, route.port.port, 'udp');
        if (src !== undefined) writeV2Source6(header, 0, addressToBytes(unmapIPv4(src)), rinfo.port);
      } else if (route.proxyProtocol === 'v2') {
        header = Buffer.allocUnsafe(PROXY_V2_IPV4_LENGTH);
        writeV2Into(header, 0, parseIPv4(rinfo.address) ?? 0, rinfo.port, route.vipNum, route.port.port, 'udp');
      }
      const session: UdpSession = { socket, slot: backend.slot, backend: `${backend.address}:${route.port.targetPort}`, clientAddress: rinfo.address, clientPort: rinfo.port, key, header, ready: false, queue: [], seen: true, idleTicks: 0 };
      s = session;
      l.sessions.set(key, session);
      this.tallies.set(route.slot, LISTENER_UDP_SESSIONS, l.sessions.size);
      this.tallies.add(backend.slot, FLOW_CONNECTIONS, 1);
      this.tallies.activeAdd(backend.slot, 1);
      socket.on('message', (reply) => {
        session.seen = true;
        this.tallies.add(session.slot, FLOW_BYTES_TO_CLIENT, reply.length);
        l.udp?.send(reply, session.clientPort, session.clientAddress);
      });
      socket.on('error', (err) => {
        // A connected UDP socket reports the backend's ICMP port unreachable as ECONNREFUSED.
        if ((err as NodeJS.ErrnoException).code === 'ECONNREFUSED') {
          this.tallies.add(session.slot, FLOW_CONNECT_FAILURES, 1);
          this.report(route.serviceKey, backend.address, backend.slot, false);
        }
        this.closeSession(l, session);
      });
      socket.connect(route.port.targetPort, backend.address, () => {
        session.ready = true;
        const q = session.queue ?? [];
        session.queue = undefined;
        for (const m of q) this.sendUdp(session, m);
      });
    }
    s.seen = true;
    this.tallies.add(s.slot, FLOW_BYTES_TO_BACKEND, msg.length);
    if (s.ready) this.sendUdp(s, msg);
    else if (s.queue && s.queue.length < 64) s.queue.push(msg);
  }

  private sendUdp(s: UdpSession, msg: Buffer): void {
    if (s.header) s.socket.send([s.header, msg]);
    else s.socket.send(msg);
  }

  private closeSession(l: EngineListener, s: UdpSession): void {
    if (l.sessions.get(s.key) !== s) return;
    l.sessions.delete(s.key);
    this.tallies.set(l.route.slot, LISTENER_UDP_SESSIONS, l.sessions.size);
    this.tallies.activeAdd(s.slot, -1);
    try { s.socket.close(); } catch { /* already closed */ }
  }

  /**
   * End the sessions whose backend the listener's route no longer sends to
   * (it left the healthy set, or the config): a UDP session has no end a
   * client would wait for, so kept on a dead backend it would blackhole a
   * steady sender for good (the kernel path deletes the same flows from
   * conntrack, forward/nft.ts). The client's next datagram opens a session on
   * a healthy backend.
   */
  private endLeftSessions(l: EngineListener): void {
    if (l.sessions.size === 0) return;
    const sends = new Set(l.route.healthy.map((b) => `${b.address}:${l.route.port.targetPort}`));
    let ended = 0;
    for (const s of [...l.sessions.values()]) {
      if (sends.has(s.backend)) continue;
      this.closeSession(l, s);
      ended++;
    }
    if (ended === 0) return;
    this.tallies.add(l.route.slot, LISTENER_UDP_ENDED, ended);
    this.log.info({ op: 'udp-sessions', service: l.route.serviceKey, port: l.route.port.port, ended }, `ended ${ended} UDP session(s) to backends the port no longer sends to; their next datagram is placed again`);
  }

  private closeUdp(l: EngineListener): void {
    try { l.udp?.close(); } catch { /* already closed */ }
    l.udp = undefined;
  }

  // --- the tick: connect deadlines, lingering refusals, idle sweep -----------

  private ensureTick(): void {
    if (this.tickTimer !== undefined || this.stopped) return;
    const every = Math.max(10, Math.min(TICK_MS, (this.cfg.connectTimeout * 1000) / 3));
    const tick = (): void => {
      this.tickTimer = undefined;
      if (this.stopped) return;
      this.tick();
      if (this.relays.size === 0 && this.refusing.size === 0 && this.udpSessions() === 0) return; // idle: no timer at all
      this.tickTimer = this.clock.setTimeout(tick, every);
      this.tickTimer.unref?.();
    };
    this.tickTimer = this.clock.setTimeout(tick, every);
    this.tickTimer.unref?.();
  }

  private udpSessions(): number {
    let n = 0;
    for (const l of this.listeners.values()) n += l.sessions.size;
    return n;
  }

  private tick(): void {
    this.path.refresh?.();
    const now = this.clock.now();
    for (const r of this.connecting) {
      if (now >= r.connectDeadline) r.abortConnect('ETIMEDOUT');
    }
    for (const [sock, deadline] of this.refusing) {
      if (now >= deadline) { this.refusing.delete(sock); sock.destroy(); }
    }
    const tcpMs = this.cfg.idleTimeout * 1000;
    const every = Math.max(50, Math.min(tcpMs, this.udpIdleMs) / IDLE_SWEEPS);
    if (now - this.lastSweep >= every) {
      this.lastSweep = now;
      this.sweep(every, tcpMs);
    }
  }

  /** Close what saw no traffic for its idle timeout (checked every `every` ms, so up to one period late). */
  private sweep(every: number, tcpMs: number): void {
    for (const r of this.relays) {
      if (r.seen) { r.seen = false; r.idleTicks = 0; continue; }
      if (++r.idleTicks * every < tcpMs) continue;
      this.log.debug({ op: 'idle', service: r.route.serviceKey }, 'closing idle connection');
      r.destroy();
    }
    for (const l of this.listeners.values()) {
      for (const s of l.sessions.values()) {
        if (s.seen) { s.seen = false; s.idleTicks = 0; continue; }
        if (++s.idleTicks * every >= this.udpIdleMs) this.closeSession(l, s);
      }
    }
  }

  // --- lifecycle --------------------------------------------------------------

  stats(): EngineStats {
    return { open: this.relays.size, listeners: this.listeners.size };
  }

  /**
   * Stop accepting (close this engine's listening descriptors: with `keep` the
   * sockets live on in the main thread and the fd store); with `keep`, let
   * open connections finish for up to drainMs; then close what is left.
   */
  async stop(opts: { keep?: boolean; drainMs?: number } = {}): Promise<{ open: number; unfinished: number }> {
    if (this.stopped) return { open: 0, unfinished: 0 };
    this.stopped = true;
    if (this.tickTimer !== undefined) this.clock.clearTimeout(this.tickTimer);
    for (const l of this.listeners.values()) {
      for (const t of l.tcp) t.close();
      l.tcp = [];
      for (const s of [...l.sessions.values()]) this.closeSession(l, s);
      this.closeUdp(l);
    }
    this.listeners.clear();
    const open = this.relays.size;
    if (opts.keep && open > 0) {
      // A planned restart: connections already accepted finish (bounded) instead of being cut.
      const deadline = this.clock.now() + (opts.drainMs ?? 5000);
      while (this.relays.size > 0 && this.clock.now() < deadline) {
        await new Promise((r) => this.clock.setTimeout(() => r(undefined), 20));
        // Connect deadlines still apply while draining.
        const now = this.clock.now();
        for (const r of this.connecting) if (now >= r.connectDeadline) r.abortConnect('ETIMEDOUT');
      }
    }
    const unfinished = this.relays.size;
    for (const r of [...this.relays]) r.destroy();
    for (const sock of this.refusing.keys()) sock.destroy();
    this.refusing.clear();
    return { open, unfinished };
  }
}

function sameBackends(a: readonly EngineBackend[], b: readonly EngineBackend[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i]!.address !== b[i]!.address || a[i]!.weight !== b[i]!.weight || a[i]!.slot !== b[i]!.slot) return false;
  return true;
}
