// Shared neighbour sockets (driver layer over packet.ts): one ARP socket and
// one NDP socket per interface, opened with the first address that needs it
// and closed with the last, for every VIP owner and prober on that
// interface. Each address gets a port that looks like a PacketSocket of its
// own (arp-probe.ts, vip-owner.ts and ndp-driver.ts take it as they took a
// socket each): a frame is decoded once, here, and reaches the ports of its
// sender and target addresses only (RFC 5227 §2.1.1 and §2.4 act on nothing
// else; RFC 4861's target and source for NDP). A malformed frame is dropped
// and counted once, here.
//
// ARP's kernel filter passes only frames about the addresses attached
// (packet/bpf.ts bpfArpAboutAny), so the agent wakes for its own addresses,
// not for every ARP frame on the LAN. The filter never decides correctness:
// an address joining first widens the filter to every ARP frame at once (no
// frame about it can be missed), and the exact set is compiled once the
// attachments of this turn of the event loop are done; a set past
// BPF_ARP_SET_MAX stays on every ARP frame. NDP's socket is ndp-socket.ts's
// (a raw ICMPv6 socket, which the kernel consults for locally delivered
// ICMPv6 only, and a packet socket that only sends); the solicited-node
// groups an owner joins through its port are counted per group by that
// socket, and a port that closes leaves the ones it still holds.
//
// The owners of these addresses share one refresh wheel too (`refresh`,
// refresh-wheel.ts): their periodic announcements go out in one batch per
// slot from one timer. A port's sendSoon inside a slot queues its frame on
// the shared socket, and the slot's frames leave by one sendmmsg per socket
// when the slot's refreshes are done (100 VIPs a slot: one syscall, not 100).
//
// Why: a socket per VIP held 1,000 descriptors at 1,000 pool services, and
// the kernel ran 1,000 filters on each ARP frame.
import { EventEmitter } from 'node:events';
import { LbError } from '../../errors';
import type { Logger } from '../../log';
import type { NetMetrics } from '../metrics';
import { BPF_ARP_SET_MAX, bpfArp, bpfArpAboutAny, type BpfProgram } from '../packet/bpf';
import { ETH_P_ARP, openPacketSocket, type FrameInfo, type PacketSocket, type PacketSocketOptions } from '../packet/packet';
import { decodeArp } from './arp';
import { decodeNdp, NDP_NOT_MINE } from './ndp';
import { openNdpSocket, type NdpSocket, type NdpSocketOptions } from './ndp-socket';
import { RefreshWheel } from './refresh-wheel';
import type { Clock } from '../../clock';

export type NeighbourProtocol = 'arp' | 'ndp';

export interface NeighbourPortOptions {
  /** The interface the address lives on. */
  ifindex: number;
  /** The address the port is for: IPv4 as u32 (arp), IPv6 as its value (ndp). */
  address: number | bigint;
  /** For the shared socket, when this port opens it. */
  log?: Logger;
  metrics?: NetMetrics;
}

export interface NeighbourSocketsOptions {
  /** Opens the shared ARP sockets; default packet.ts's. */
  open?: (opts: PacketSocketOptions) => PacketSocket;
  /** Opens the shared NDP sockets; default ndp-socket.ts's. */
  openNdp?: (opts: NdpSocketOptions) => NdpSocket;
  /** Runs the filter's recompilation after this turn's attachments; default setImmediate. */
  defer?: (fn: () => void) => void;
  /** The refresh wheel's clock. */
  clock?: Clock;
}

export interface NeighbourSocketCounts {
  /** Shared sockets open now. */
  open: number;
  /** Shared sockets opened so far. */
  opened: number;
  /** Ports attached now. */
  ports: number;
  /** Kernel filters attached after a socket's first (widened or recompiled). */
  filters: number;
  /** Frames delivered to at least one port; frames about no attached address. */
  delivered: number;
  unclaimed: number;
  /** Batches of a refresh slot's frames sent together (one sendmmsg per socket), and the frames in them. */
  batches: number;
  batchedFrames: number;
}

type Key = number | bigint;

interface Shared {
  readonly protocol: NeighbourProtocol;
  readonly ifindex: number;
  readonly socket: PacketSocket | NdpSocket;
  readonly byAddress: Map<Key, Set<NeighbourPort>>;
  readonly metrics: NetMetrics | undefined;
  readonly log: Logger | undefined;
  /** The addresses the ARP filter passes now; undefined: every ARP frame. */
  filtered: ReadonlySet<Key> | undefined;
  recompile: boolean;
  /** Frames of the refresh slot being run, sent at its end. */
  queued: { frame: Buffer; done: (err?: LbError) => void }[];
}

/** One address's view of a shared socket. */
class NeighbourPort extends EventEmitter implements NdpSocket {
  private closed = false;
  /** Groups this port joined and has not left, with how many times. */
  private readonly joined = new Map<bigint, number>();

  constructor(
    readonly ifindex: number,
    readonly address: Key,
    private readonly shared: Shared,
    private readonly release: (p: NeighbourPort) => void,
    private readonly batching: () => boolean,
  ) {
    super();
  }

  send(frame: Buffer): void {
    if (this.closed) throw new LbError('LB_ERR_NET_SOCKET', `neighbour socket port on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    this.shared.socket.send(frame);
  }

  /** In a refresh slot: queued, sent with the slot's other frames at its end; otherwise sent now. `done` gets the outcome. */
  sendSoon(frame: Buffer, done: (err?: LbError) => void): void {
    if (!this.closed && this.batching() && 'sendMany' in this.shared.socket && this.shared.socket.sendMany) {
      this.shared.queued.push({ frame, done });
      return;
    }
    try {
      this.send(frame);
    } catch (err) {
      done(err as LbError);
      return;
    }
    done();
  }

  joinGroup(group: bigint): void {
    if (this.closed) throw new LbError('LB_ERR_NET_SOCKET', `neighbour socket port on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    const s = this.shared.socket;
    if (!('joinGroup' in s)) throw new LbError('LB_ERR_NET_SOCKET', `the ${this.shared.protocol} socket on ifindex ${this.ifindex} joins no IPv6 group`, { ifindex: this.ifindex });
    s.joinGroup(group);
    this.joined.set(group, (this.joined.get(group) ?? 0) + 1);
  }

  leaveGroup(group: bigint): void {
    const n = this.joined.get(group);
    if (n === undefined) return;
    if (n <= 1) this.joined.delete(group);
    else this.joined.set(group, n - 1);
    const s = this.shared.socket;
    if ('leaveGroup' in s) s.leaveGroup(group);
  }

  close(): void {
    if (this.closed) return;
    // The kernel counts a group per socket: what this port still holds goes with it.
    const s = this.shared.socket;
    for (const [group, n] of this.joined) {
      for (let i = 0; i < n; i++) {
        try { if ('leaveGroup' in s) s.leaveGroup(group); } catch { /* the socket is closing or the link is gone */ }
      }
    }
    this.joined.clear();
    this.closed = true;
    this.release(this);
    this.emit('close');
  }
}

/** The addresses a frame is about, decoded once; undefined when it is dropped (counted) or not ours to read. */
function addressesOf(protocol: NeighbourProtocol, frame: Buffer, metrics: NetMetrics | undefined): Key[] | undefined {
  if (protocol === 'arp') {
    const r = decodeArp(frame);
    if (!r.ok) {
      if (r.reason !== 'not-arp') metrics?.framesDropped.inc({ reason: r.reason });
      return undefined;
    }
    return r.packet.senderIp === r.packet.targetIp ? [r.packet.senderIp] : [r.packet.senderIp, r.packet.targetIp];
  }
  const r = decodeNdp(frame);
  if (!r.ok) {
    if (!NDP_NOT_MINE.has(r.reason)) metrics?.framesDropped.inc({ reason: r.reason });
    return undefined;
  }
  const p = r.packet;
  return p.src === p.target ? [p.src] : [p.src, p.target];
}

/**
 * Ports on shared ARP and NDP sockets, one socket per interface and
 * protocol. The daemon holds one for every address source.
 */
export class NeighbourSockets {
  private readonly shared = new Map<string, Shared>();
  private readonly count = { opened: 0, filters: 0, delivered: 0, unclaimed: 0, batches: 0, batchedFrames: 0 };
  /** Inside a refresh slot: ports' sendSoon queue their frames. */
  private batching = false;
  /** Times the periodic announcement of every VIP owner on these sockets. */
  readonly refresh: RefreshWheel;

  constructor(private readonly opts: NeighbourSocketsOptions = {}) {
    this.refresh = new RefreshWheel({ clock: opts.clock, batch: (run) => this.batch(run) });
  }

  /** Runs a refresh slot: the frames its owners send by sendSoon leave at its end, one sendmmsg per socket. */
  private batch(run: () => void): void {
    this.batching = true;
    try {
      run();
    } finally {
      this.batching = false;
      for (const s of this.shared.values()) this.flush(s);
    }
  }

  private flush(s: Shared): void {
    if (s.queued.length === 0) return;
    const queued = s.queued;
    s.queued = [];
    const results = s.socket.sendMany!(queued.map((q) => q.frame));
    this.count.batches++;
    this.count.batchedFrames += queued.length;
    queued.forEach((q, i) => q.done(results[i]));
  }

  /** A port for ARP frames about one IPv4 address (u32). Throws what opening the socket throws (LbError). */
  arp(o: NeighbourPortOptions): PacketSocket {
    if (typeof o.address !== 'number') throw new TypeError('an ARP port is for an IPv4 address (a number)');
    return this.attach('arp', o);
  }

  /** A port for neighbour discovery about one IPv6 address (its value). Throws what opening the socket throws (LbError). */
  ndp(o: NeighbourPortOptions): NdpSocket {
    if (typeof o.address !== 'bigint') throw new TypeError('an NDP port is for an IPv6 address (a bigint)');
    return this.attach('ndp', o);
  }

  counts(): NeighbourSocketCounts {
    let ports = 0;
    for (const s of this.shared.values()) for (const set of s.byAddress.values()) ports += set.size;
    return { open: this.shared.size, ports, ...this.count };
  }

  private attach(protocol: NeighbourProtocol, o: NeighbourPortOptions): NeighbourPort {
    const id = `${protocol}:${o.ifindex}`;
    let s = this.shared.get(id);
    if (s === undefined) {
      s = this.openShared(protocol, o);
      this.shared.set(id, s);
    }
    const shared = s;
    const port = new NeighbourPort(o.ifindex, o.address, shared, (p) => this.detach(id, shared, p), () => this.batching);
    let set = shared.byAddress.get(o.address);
    if (set === undefined) {
      if (protocol === 'arp') {
        try {
          this.addressJoined(shared, o.address);
        } catch (err) {
          if (shared.byAddress.size === 0) { this.shared.delete(id); shared.socket.close(); }
          throw err;
        }
      }
      set = new Set();
      shared.byAddress.set(o.address, set);
    }
    set.add(port);
    return port;
  }

  private openShared(protocol: NeighbourProtocol, o: NeighbourPortOptions): Shared {
    const first = new Set<Key>([o.address]);
    const socket = protocol === 'arp'
      ? (this.opts.open ?? openPacketSocket)({ ifindex: o.ifindex, protocol: ETH_P_ARP, filter: bpfArpAboutAny([o.address as number]), log: o.log, metrics: o.metrics })
      : (this.opts.openNdp ?? openNdpSocket)({ ifindex: o.ifindex, log: o.log, metrics: o.metrics });
    const s: Shared = { protocol, ifindex: o.ifindex, socket, byAddress: new Map(), metrics: o.metrics, log: o.log, filtered: protocol === 'arp' ? first : undefined, recompile: false, queued: [] };
    socket.on('frame', (frame: Buffer, info: FrameInfo) => this.deliver(s, frame, info));
    // ENETDOWN and the like concern every port on the interface.
    socket.on('error', (err: Error) => {
      for (const set of s.byAddress.values()) for (const p of set) if (p.listenerCount('error') > 0) p.emit('error', err);
    });
    this.count.opened++;
    return s;
  }

  private deliver(s: Shared, frame: Buffer, info: FrameInfo): void {
    const keys = addressesOf(s.protocol, frame, s.metrics);
    let reached = false;
    for (const k of keys ?? []) {
      const set = s.byAddress.get(k);
      if (set === undefined) continue;
      // A copy: a listener may close its port (a probe that found a conflict).
      for (const p of [...set]) { reached = true; p.emit('frame', frame, info); }
    }
    if (reached) this.count.delivered++;
    else if (keys !== undefined) this.count.unclaimed++;
  }

  /**
   * A new address on an ARP socket: if the filter does not pass it yet, every
   * ARP frame is passed from now (nothing about it can be missed), and the
   * exact set follows after this turn's other attachments.
   */
  private addressJoined(s: Shared, address: Key): void {
    if (s.filtered !== undefined && !s.filtered.has(address)) {
      if (!s.socket.setFilter) throw new LbError('LB_ERR_NET_SOCKET', `the ARP socket on ifindex ${s.ifindex} cannot change its kernel filter`, { ifindex: s.ifindex });
      s.socket.setFilter(bpfArp());
      s.filtered = undefined;
      this.count.filters++;
    }
    this.scheduleRecompile(s);
  }

  private scheduleRecompile(s: Shared): void {
    if (s.recompile) return;
    s.recompile = true;
    (this.opts.defer ?? setImmediate)(() => {
      s.recompile = false;
      if (this.shared.get(`${s.protocol}:${s.ifindex}`) !== s || s.byAddress.size === 0) return;
      const addresses = [...s.byAddress.keys()];
      const same = s.filtered !== undefined && s.filtered.size === addresses.length && addresses.every((a) => s.filtered!.has(a));
      if (same) return;
      // Past the set's limit the filter is every ARP frame, which an address joining already made it.
      if (addresses.length > BPF_ARP_SET_MAX) return;
      if (this.setFilter(s, bpfArpAboutAny(addresses as number[]))) s.filtered = new Set(addresses);
    });
  }

  /** Attach a narrower filter; on failure the socket keeps the wider one it has, which only costs wake-ups. */
  private setFilter(s: Shared, program: BpfProgram): boolean {
    if (!s.socket.setFilter) return false;
    try {
      s.socket.setFilter(program);
      this.count.filters++;
      return true;
    } catch (err) {
      s.log?.warn({ module: 'net/neighbour-sockets', op: 'filter', ifindex: s.ifindex, addresses: s.byAddress.size, err: (err as Error).message }, 'could not narrow the ARP socket\'s kernel filter; it passes every ARP frame');
      return false;
    }
  }

  private detach(id: string, s: Shared, p: NeighbourPort): void {
    const set = s.byAddress.get(p.address);
    if (set?.delete(p) && set.size === 0) {
      s.byAddress.delete(p.address);
      // A narrower filter later: passing a departed address meanwhile only costs wake-ups.
      if (s.protocol === 'arp' && s.byAddress.size > 0) this.scheduleRecompile(s);
    }
    if (s.byAddress.size === 0 && this.shared.get(id) === s) {
      this.shared.delete(id);
      // Queued in a slot by owners that have all left since: not sent.
      s.queued = [];
      s.socket.close();
    }
  }
}
