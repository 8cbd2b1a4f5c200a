// IPv6 VIP ownership on the wire, the driver: performs ndp-owner.ts's
// actions (ndpStep) on the interface's NDP socket (ndp-socket.ts: a raw
// ICMPv6 socket receiving solicitations and advertisements, a packet socket
// sending whole frames) with an injected clock. It joins the VIP's
// solicited-node group on the socket (IPV6_ADD_MEMBERSHIP), so a DAD probe
// or a solicitation for the VIP is heard before the address is on the
// interface, whatever other addresses the interface has and in whatever
// order. While the address is on the interface the kernel has joined the
// group itself (addrconf), which lets the group's messages up to every raw
// socket of the interface: the owner leaves its own join then, so a held VIP
// costs nothing of the socket's group limit (net.core.optmem_max), and
// joins again when the address leaves (setOnInterface).
// Every received frame is decoded and judged by ndp.ts (RFC 4861 §7.1)
// before the core sees it; a malformed one is dropped and counted. Two uses:
// dadProbe (RFC 4862 §5.4, then nothing more) and NdpVipOwner (burst,
// refresh, defence while held). It knows addresses and MACs, never services.
import { EventEmitter } from 'node:events';
import type { Clock, TimerHandle } from '../../clock';
import { realClock } from '../../clock';
import { formatAddress, parseAddress } from '../../address';
import type { Logger } from '../../log';
import { lazyChild, silentLogger } from '../../log';
import type { NetMetrics } from '../metrics';
import { openNdpSocket as openSocket, type NdpSocket } from './ndp-socket';
import { decodeNdp, encodeNdp, NDP_NOT_MINE, type NdpPacket } from './ndp';
import { initialNdpState, ndpStep, type NdpAction, type NdpDuplicateReason, type NdpEvent, type NdpOwnerConfig, type NdpState } from './ndp-owner';

/** The value of an IPv6 address text; throws on anything else (a programming error: callers pass addresses they hold). */
export function ipv6Value(text: string): bigint {
  const a = parseAddress(text);
  if (a?.family !== 'IPv6') throw new RangeError(`not an IPv6 address: ${text}`);
  return a.value;
}

/** The NDP socket of `ifindex` (ndp-socket.ts). */
export function openNdpSocket(ifindex: number, metrics: NetMetrics | undefined, log: Logger): NdpSocket {
  return openSocket({ ifindex, metrics, log });
}

export interface NdpDriverOptions {
  /** The parent's NDP socket (openNdpSocket). The driver joins and leaves the group on it, and never closes it. */
  readonly socket: NdpSocket;
  /** The parent's MAC: source of every frame, and never a conflict. */
  readonly mac: string;
  /** The IPv6 VIP. */
  readonly ip: string;
  /**
   * The IPv6 source of advertisements: the parent's link-local address when
   * it has one (always preferred, never tentative, whatever order the
   * parent's addresses are in); undefined: the VIP itself (RFC 4861 §7.2.6
   * allows any address of the interface).
   */
  readonly source?: bigint | undefined;
  readonly config: NdpOwnerConfig;
  /**
   * The address is on the socket's interface (the kernel joined its
   * solicited-node group): the owner does not join it too. Default false.
   */
  readonly onInterface?: boolean | undefined;
  readonly clock?: Clock;
  readonly log?: Logger;
  readonly metrics?: NetMetrics;
}

export interface NdpConflict { readonly ip: string; readonly mac: string; readonly defended: boolean }
export interface NdpDuplicate { readonly ip: string; readonly mac: string; readonly reason: NdpDuplicateReason }

/**
 * One IPv6 address on the wire. Events: 'unique' () when DAD found nobody,
 * 'duplicate' (NdpDuplicate), 'conflict' (NdpConflict) for a defended or
 * rate-limited conflict while held, 'lost' (NdpConflict) when a second
 * conflict within the defend interval takes the address (RFC 5227 §2.4 (b)).
 */
export class NdpVipOwner extends EventEmitter {
  readonly ip: string;
  private cfg: NdpOwnerConfig;
  private readonly socket: NdpSocket;
  private readonly source: bigint | undefined;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly metrics: NetMetrics | undefined;
  private state: NdpState;
  private timer: TimerHandle | undefined;
  /** The group the core asked to listen to (its 'join' until its 'leave'). */
  private wanted: bigint | undefined;
  /** The group joined on the socket: `wanted`, unless the address is on the interface. */
  private joined: bigint | undefined;
  private onInterface: boolean;
  private closed = false;
  /** Set by a 'unique' action when the owner is only probing: the rest of that step (the burst) is not performed. */
  private stopAtUnique = false;
  private readonly onFrame = (frame: Buffer): void => {
    const r = decodeNdp(frame);
    if (!r.ok) {
      if (!NDP_NOT_MINE.has(r.reason)) this.metrics?.framesDropped.inc({ reason: r.reason });
      return;
    }
    this.feed({ type: 'ndp', packet: r.packet });
  };

  constructor(opts: NdpDriverOptions) {
    super();
    const ip = ipv6Value(opts.ip);
    this.ip = formatAddress({ family: 'IPv6', value: ip });
    this.cfg = opts.config;
    this.socket = opts.socket;
    this.source = opts.source;
    this.onInterface = opts.onInterface ?? false;
    this.clock = opts.clock ?? realClock;
    this.metrics = opts.metrics;
    this.state = initialNdpState(ip, opts.mac);
    this.log = lazyChild(opts.log ?? silentLogger(), { module: 'net/ndp', ip: this.ip, mac: this.state.mac });
    this.socket.on('frame', this.onFrame);
  }

  get held(): boolean { return this.state.phase === 'held'; }

  /** DAD (when config.dadTransmits > 0), then the burst and the defence. Throws when the first frame cannot be sent. */
  start(): void {
    this.feed({ type: 'start' }, true);
  }

  /** Run DAD only: 'unique' or 'duplicate' ends it, and nothing is advertised. */
  startProbe(): void {
    this.stopAtUnique = true;
    this.feed({ type: 'start' }, true);
  }

  /** New timings (a reload): the refresh follows the new interval from now on. */
  retime(t: Pick<NdpOwnerConfig, 'announceNum' | 'announceIntervalMs' | 'refreshMs'>): void {
    this.cfg = { ...this.cfg, ...t };
    this.feed({ type: 'retime' });
  }

  /** A full burst again now (the address was put back on the parent). */
  reannounce(): void {
    this.feed({ type: 'reannounce' });
  }

  /**
   * Whether the address is on the socket's interface: on, the kernel's own
   * join of the solicited-node group lets its messages in and the owner
   * leaves its join; off (the address was removed), the owner joins again.
   */
  setOnInterface(on: boolean): void {
    this.onInterface = on;
    this.syncGroup();
  }

  /** Whether the owner holds a join of the solicited-node group on the socket (for status and tests). */
  get groupJoined(): boolean { return this.joined !== undefined; }

  /** Stop advertising and defending, leave the group; sends nothing (withdrawal never poisons a cache). */
  close(): void {
    if (this.closed) return;
    this.feed({ type: 'stop' });
    this.closed = true;
    this.clearTimer();
    this.wanted = undefined;
    this.syncGroup();
    this.socket.off('frame', this.onFrame);
  }

  private clearTimer(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Join or leave so that the socket holds `wanted` exactly when the address is not on the interface. */
  private syncGroup(): void {
    const desired = this.closed || this.onInterface ? undefined : this.wanted;
    if (desired === this.joined) return;
    const had = this.joined;
    if (had !== undefined) {
      this.joined = undefined;
      // The kernel drops the membership with the socket; a shared socket keeps it otherwise.
      try { this.socket.leaveGroup(had); } catch (err) {
        this.log.debug({ op: 'leave', err: (err as Error).message }, 'could not leave the solicited-node group');
      }
    }
    if (desired === undefined) return;
    try {
      this.socket.joinGroup(desired);
      this.joined = desired;
    } catch (err) {
      // Past the socket's group limit (net.core.optmem_max): the answer to
      // our probe (to all-nodes) is still heard, and once the address is
      // on the interface the kernel's own join of the group lets
      // solicitations in; only another node's simultaneous probe is missed.
      this.log.warn({ op: 'join', err: (err as Error).message }, 'could not join the solicited-node group; another node probing the same address at the same time goes unheard');
    }
  }

  private send(packet: NdpPacket, reason: string, throwOnError: boolean): void {
    // Advertisements leave from the link-local address when there is one;
    // a DAD probe stays from :: (RFC 4862 §5.4.2).
    const out = packet.kind === 'advertisement' && this.source !== undefined ? { ...packet, src: this.source } : packet;
    try {
      this.socket.send(encodeNdp(out));
    } catch (err) {
      if (throwOnError) throw err;
      this.log.warn({ op: 'send', reason, err: (err as Error).message }, 'could not send a neighbour discovery message');
      return;
    }
    this.metrics?.ndpSent.inc({ reason });
    this.log.debug({ op: 'send', reason, kind: packet.kind }, 'neighbour discovery message sent');
  }

  private feed(event: NdpEvent, throwOnSendError = false): void {
    if (this.closed) return;
    const step = ndpStep(this.state, event, this.clock.now(), this.cfg);
    this.state = step.state;
    try {
      for (const a of step.actions) {
        if (!this.perform(a, throwOnSendError)) break;
      }
    } catch (err) {
      this.close();
      throw err;
    }
  }

  /** Perform one action; false ends the step (a probe-only owner after 'unique'). */
  private perform(a: NdpAction, throwOnSendError: boolean): boolean {
    switch (a.type) {
      case 'join':
        this.wanted = a.group;
        this.syncGroup();
        return true;
      case 'leave':
        this.wanted = undefined;
        this.syncGroup();
        return true;
      case 'send':
        this.send(a.packet, a.reason, throwOnSendError);
        return true;
      case 'arm-timer':
        this.clearTimer();
        this.timer = this.clock.setTimeout(() => { this.timer = undefined; this.feed({ type: 'timer' }); }, Math.max(0, Math.ceil(a.at - this.clock.now())));
        return true;
      case 'clear-timer':
        this.clearTimer();
        return true;
      case 'unique':
        this.log.debug({ op: 'dad' }, 'duplicate address detection found nobody');
        if (this.stopAtUnique) {
          this.close();
          this.emit('unique');
          return false;
        }
        this.emit('unique');
        return true;
      case 'duplicate':
        this.metrics?.ndpConflicts.inc({ phase: 'dad' });
        this.log.warn({ op: 'dad', conflictingMac: a.mac, reason: a.reason }, `${this.ip} is in use on the LAN (${a.mac}, ${a.reason}); not using it (RFC 4862 §5.4.5)`);
        this.close();
        this.emit('duplicate', { ip: this.ip, mac: a.mac, reason: a.reason } satisfies NdpDuplicate);
        return false;
      case 'defended':
        this.metrics?.ndpConflicts.inc({ phase: 'defend' });
        this.log.warn({ op: 'defend', conflictingMac: a.mac }, `${a.mac} claims ${this.ip}; defended with one unsolicited advertisement (override)`);
        this.emit('conflict', { ip: this.ip, mac: a.mac, defended: true } satisfies NdpConflict);
        return true;
      case 'conflict':
        this.metrics?.ndpConflicts.inc({ phase: 'defend' });
        this.log.warn({ op: 'defend', conflictingMac: a.mac }, `${a.mac} claims ${this.ip} again; keeping it, next defence at most one defend interval after the last`);
        this.emit('conflict', { ip: this.ip, mac: a.mac, defended: false } satisfies NdpConflict);
        return true;
      case 'lost':
        this.metrics?.ndpConflicts.inc({ phase: 'defend' });
        this.log.warn({ op: 'give-up', conflictingMac: a.mac }, `${a.mac} claims ${this.ip} again within the defend interval; the address must be given up`);
        this.emit('lost', { ip: this.ip, mac: a.mac, defended: false } satisfies NdpConflict);
        return true;
    }
  }
}

export interface DadResult {
  readonly duplicate: boolean;
  readonly mac?: string | undefined;
  readonly reason?: NdpDuplicateReason | undefined;
}

/**
 * RFC 4862 §5.4 duplicate address detection of `opts.ip`: probes from ::,
 * RetransTimer apart, and the wait after the last; resolves with whether
 * another node holds (or is probing) the address. Advertises nothing.
 */
export function dadProbe(opts: NdpDriverOptions): Promise<DadResult> {
  return new Promise<DadResult>((resolve, reject) => {
    const owner = new NdpVipOwner(opts);
    owner.once('unique', () => resolve({ duplicate: false }));
    owner.once('duplicate', (d: NdpDuplicate) => resolve({ duplicate: true, mac: d.mac, reason: d.reason }));
    try {
      owner.startProbe();
    } catch (err) {
      reject(err instanceof Error ? err : new Error(String(err)));
    }
  });
}
