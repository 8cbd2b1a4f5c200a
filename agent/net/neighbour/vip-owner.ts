// VIP ownership on the wire (RFC 5227 §2.3 and §2.4): one address held on
// one interface, at one MAC. A pure core, vipStep (state, event, now) ->
// (state, actions), decides when to announce (the burst when the address
// comes up, the defence, the periodic refresh, a re-announcement after a VRRP
// split brain) and when to give the address up; VipOwner, a thin driver,
// performs the actions on an ARP packet socket with an injected clock. The
// periodic refresh is timed by a RefreshWheel that the owners of one
// process share (refresh-wheel.ts): one timer for every VIP, not one each.
// It knows addresses and MACs, never services: what losing the address means
// (DHCPDECLINE, another pool address) is the owner's decision.
import { EventEmitter } from 'node:events';
import type { Clock, TimerHandle } from '../../clock';
import { realClock } from '../../clock';
import { formatIPv4 } from '../../address';
import type { Logger } from '../../log';
import { lazyChild, silentLogger } from '../../log';
import { arpAnnouncement, encodeArp, type ArpPacket } from './arp';
import { acquireSocket, arpFromFrame, defenseVerdict, DEFEND_INTERVAL_MS, ipNumber, macString, type SocketSource } from './arp-probe';
import type { NetMetrics } from '../metrics';
import type { PacketSocket } from '../packet/packet';
import { RefreshWheel, type RefreshMember } from './refresh-wheel';

// ---------------------------------------------------------------------------
// Pure core

export interface VipOwnerConfig {
  /** RFC 5227 ANNOUNCE_NUM: announcements in the burst when the address comes up (2). */
  readonly announceNum: number;
  /** RFC 5227 ANNOUNCE_INTERVAL in ms (2000). */
  readonly announceIntervalMs: number;
  /**
   * A gratuitous ARP every refreshMs while the address is held (keepalived's
   * garp_master_refresh), timed by the refresh wheel, which sends the
   * 'refresh' event; 0 turns the refresh off.
   */
  readonly refreshMs: number;
  /** RFC 5227 DEFEND_INTERVAL in ms (10 000). */
  readonly defendIntervalMs: number;
  /**
   * RFC 5227 §2.4 (b), true: defend once, give the address up on a second
   * conflict within DEFEND_INTERVAL. (c), false: never give it up, defend at
   * most once per DEFEND_INTERVAL: for a VIP whose holder an election
   * decides (VRRP), where another agent's announcement is the election's
   * business and giving up would leave the VIP with nobody.
   */
  readonly giveUp: boolean;
}

export type VipPhase = 'idle' | 'held' | 'lost';

export interface VipState {
  readonly phase: VipPhase;
  /** The held address (u32). */
  readonly ip: number;
  /** Our hardware address, lower-case. */
  readonly mac: string;
  /** Announcements of the current burst still to send. */
  readonly burstLeft: number;
  /** When the burst's next announcement is due, if any. */
  readonly nextAnnounceAt: number | undefined;
  /** When the last announcement (of any reason) went out. */
  readonly lastAnnounceAt: number | undefined;
  /** When the last conflicting ARP packet was seen (§2.4). */
  readonly lastConflictAt: number | undefined;
  /** When we last defended (§2.4 (c) rate limit). */
  readonly lastDefendAt: number | undefined;
  readonly conflictingMac: string | undefined;
}

export type VipEvent =
  | { readonly type: 'start' }
  /** The burst's timer. */
  | { readonly type: 'timer' }
  /** The refresh wheel's turn for this VIP (every refreshMs while held). */
  | { readonly type: 'refresh' }
  | { readonly type: 'arp'; readonly packet: ArpPacket }
  /** Announce again at once, with a full burst (after a VRRP split brain). */
  | { readonly type: 'reannounce' }
  | { readonly type: 'stop' };

/** Why an announcement goes out: also the label of lbagent_net_vip_announcements_total. */
export type AnnounceReason = 'burst' | 'defend' | 'refresh' | 'reannounce';

export type VipAction =
  | { readonly type: 'announce'; readonly reason: AnnounceReason }
  | { readonly type: 'arm-timer'; readonly at: number }
  | { readonly type: 'clear-timer' }
  /** A conflicting ARP packet that we answered with one announcement: the address is kept. */
  | { readonly type: 'defended'; readonly mac: string }
  /** A conflict not answered: §2.4 (c), a defence already sent within DEFEND_INTERVAL. The address is kept. */
  | { readonly type: 'conflict'; readonly mac: string }
  /** A second conflict within DEFEND_INTERVAL: the address must not be used any more (§2.4 (b)). */
  | { readonly type: 'lost'; readonly mac: string };

export type VipReason =
  | 'started' | 'not-held' | 'already-held' | 'early-timer' | 'burst' | 'refresh' | 'no-announcement-due' | 'in-burst'
  | 'own-frame' | 'unrelated' | 'probe-for-held' | 'defended' | 'defence-rate-limited' | 'lost' | 'reannounced' | 'stopped';

export interface VipStep {
  readonly state: VipState;
  readonly actions: readonly VipAction[];
  readonly reason: VipReason;
}

export function initialVipState(ip: number, mac: string): VipState {
  return { phase: 'idle', ip, mac: mac.toLowerCase(), burstLeft: 0, nextAnnounceAt: undefined, lastAnnounceAt: undefined, lastConflictAt: undefined, lastDefendAt: undefined, conflictingMac: undefined };
}

/** After an announcement at `now`: the rest of the burst, if any (the refresh is the wheel's). */
function schedule(s: VipState, now: number, cfg: VipOwnerConfig, actions: VipAction[]): VipState {
  const at = s.burstLeft > 0 ? now + cfg.announceIntervalMs : undefined;
  actions.push(at === undefined ? { type: 'clear-timer' } : { type: 'arm-timer', at });
  return { ...s, nextAnnounceAt: at };
}

/** Send one announcement of a new burst of ANNOUNCE_NUM (at least one) now. */
function burst(s: VipState, now: number, cfg: VipOwnerConfig, reason: AnnounceReason, actions: VipAction[]): VipState {
  actions.push({ type: 'announce', reason });
  return schedule({ ...s, burstLeft: Math.max(1, Math.floor(cfg.announceNum)) - 1, lastAnnounceAt: now }, now, cfg, actions);
}

export function vipStep(state: VipState, event: VipEvent, now: number, cfg: VipOwnerConfig): VipStep {
  const actions: VipAction[] = [];
  const same = (reason: VipReason): VipStep => ({ state, actions, reason });
  switch (event.type) {
    case 'start': {
      if (state.phase === 'held') return same('already-held');
      // §2.3: the address is ours now: tell the LAN, ANNOUNCE_NUM times.
      return { state: burst({ ...state, phase: 'held', lastConflictAt: undefined, lastDefendAt: undefined, conflictingMac: undefined }, now, cfg, 'burst', actions), actions, reason: 'started' };
    }
    case 'timer': {
      if (state.phase !== 'held') return same('not-held');
      if (state.nextAnnounceAt === undefined) return same('no-announcement-due');
      // A timer may fire a little early (libuv caches loop time): re-arm.
      if (now < state.nextAnnounceAt) {
        actions.push({ type: 'arm-timer', at: state.nextAnnounceAt });
        return { state, actions, reason: 'early-timer' };
      }
      actions.push({ type: 'announce', reason: 'burst' });
      const next = schedule({ ...state, burstLeft: Math.max(0, state.burstLeft - 1), lastAnnounceAt: now }, now, cfg, actions);
      return { state: next, actions, reason: 'burst' };
    }
    case 'refresh': {
      if (state.phase !== 'held') return same('not-held');
      // A burst under way announces already; the refresh is for the quiet time after it.
      if (state.burstLeft > 0) return same('in-burst');
      // Announced at every turn of its slot, even one just after a defence:
      // a neighbour that took another MAC since waits one interval at most.
      actions.push({ type: 'announce', reason: 'refresh' });
      return { state: { ...state, lastAnnounceAt: now }, actions, reason: 'refresh' };
    }
    case 'arp': {
      if (state.phase !== 'held') return same('not-held');
      // (b) counts conflicts within DEFEND_INTERVAL; (c) counts defences.
      const since = cfg.giveUp ? state.lastConflictAt : state.lastDefendAt;
      const v = defenseVerdict(new Set([state.ip]), state.mac, event.packet, since, now, { defend: true, defendIntervalMs: cfg.defendIntervalMs });
      // defenseVerdict's 'not-held' means another address: unrelated to this VIP.
      if (v.verdict === 'ignore') return same(v.reason === 'not-held' ? 'unrelated' : v.reason);
      if (v.defend) {
        // §2.4 (b)/(c): record the conflict and defend with one announcement.
        actions.push({ type: 'announce', reason: 'defend' }, { type: 'defended', mac: v.mac });
        const next = schedule({ ...state, lastConflictAt: now, lastDefendAt: now, lastAnnounceAt: now, conflictingMac: v.mac, burstLeft: 0 }, now, cfg, actions);
        return { state: next, actions, reason: 'defended' };
      }
      if (!cfg.giveUp) {
        // §2.4 (c): keep the address; no more than one announcement per DEFEND_INTERVAL.
        actions.push({ type: 'conflict', mac: v.mac });
        return { state: { ...state, lastConflictAt: now, conflictingMac: v.mac }, actions, reason: 'defence-rate-limited' };
      }
      // §2.4 (b): a second conflict within DEFEND_INTERVAL: cease using the
      // address. Fighting on would flap every ARP cache on the LAN.
      actions.push({ type: 'clear-timer' }, { type: 'lost', mac: v.mac });
      return { state: { ...state, phase: 'lost', lastConflictAt: now, conflictingMac: v.mac, burstLeft: 0, nextAnnounceAt: undefined }, actions, reason: 'lost' };
    }
    case 'reannounce': {
      if (state.phase !== 'held') return same('not-held');
      return { state: burst(state, now, cfg, 'reannounce', actions), actions, reason: 'reannounced' };
    }
    case 'stop': {
      if (state.phase === 'idle') return same('not-held');
      actions.push({ type: 'clear-timer' });
      return { state: { ...state, phase: 'idle', burstLeft: 0, nextAnnounceAt: undefined }, actions, reason: 'stopped' };
    }
  }
}

// ---------------------------------------------------------------------------
// Driver

export interface VipOwnerOptions extends SocketSource {
  /** The hardware address the VIP lives at (the macvlan's, or the parent's). */
  mac: string;
  ip: string | number;
  announceNum: number;
  announceIntervalMs: number;
  /** 0: no refresh. */
  refreshMs: number;
  defendIntervalMs?: number;
  /** RFC 5227 §2.4 (b) (default true) or (c) (false): see VipOwnerConfig.giveUp. */
  giveUp?: boolean;
  /** Times the refresh; the owners of a process share one (default: a wheel of this owner's own). */
  wheel?: RefreshWheel;
  clock?: Clock;
  log?: Logger;
  metrics?: NetMetrics;
}

/** What a held VIP saw: for the owner's status. */
export interface VipConflict {
  /** The contested address, dotted. */
  readonly ip: string;
  /** The other host's hardware address. */
  readonly mac: string;
  /** True: answered with one announcement. On 'conflict' false: not answered (§2.4 (c) rate limit), kept. On 'lost': given up. */
  readonly defended: boolean;
}

/**
 * Holds one VIP on the wire: start() sends the first announcement at once
 * (and throws if it cannot be sent), the rest follow on the clock. Events:
 * 'conflict' (VipConflict) for a conflicting ARP packet the address is kept
 * through (defended: whether it was answered); 'lost'
 * (VipConflict, defended: false) once the address must be given up: the
 * owner takes it off the interface. close() stops everything.
 */
export class VipOwner extends EventEmitter implements RefreshMember {
  readonly ip: string;
  private cfg: VipOwnerConfig;
  private readonly clock: Clock;
  private readonly wheel: RefreshWheel;
  private readonly log: Logger;
  private readonly metrics: NetMetrics | undefined;
  private state: VipState;
  private timer: TimerHandle | undefined;
  private sock: { socket: PacketSocket; owned: boolean } | undefined;
  /** The gratuitous ARP of this address and MAC, encoded once: a refresh sends the same frame every time. */
  private readonly announcement: Buffer;
  private readonly onFrame = (frame: Buffer): void => {
    const packet = arpFromFrame(frame, this.metrics);
    if (packet) this.feed({ type: 'arp', packet });
  };

  constructor(opts: VipOwnerOptions) {
    super();
    const ip = ipNumber(opts.ip);
    this.ip = formatIPv4(ip);
    this.cfg = {
      announceNum: opts.announceNum,
      announceIntervalMs: opts.announceIntervalMs,
      refreshMs: opts.refreshMs,
      defendIntervalMs: opts.defendIntervalMs ?? DEFEND_INTERVAL_MS,
      giveUp: opts.giveUp ?? true,
    };
    this.clock = opts.clock ?? realClock;
    this.wheel = opts.wheel ?? new RefreshWheel({ clock: this.clock });
    this.metrics = opts.metrics;
    this.state = initialVipState(ip, macString(opts.mac));
    this.announcement = encodeArp(arpAnnouncement(this.state.mac, this.state.ip));
    this.log = lazyChild(opts.log ?? silentLogger(), { module: 'net/vip-owner', ip: this.ip, mac: this.state.mac });
    this.sock = acquireSocket(opts, this.metrics, this.log, ip);
    this.sock.socket.on('frame', this.onFrame);
  }

  get held(): boolean { return this.state.phase === 'held'; }

  /** Announce the address (RFC 5227 §2.3) and defend it from now on. Throws when the first announcement cannot be sent. */
  start(): void {
    this.feed({ type: 'start' }, true);
  }

  /** New announcement timings (a reload): the refresh follows the new interval from now on; a burst under way keeps its spacing. */
  retime(t: { announceNum: number; announceIntervalMs: number; refreshMs: number }): void {
    const moved = t.refreshMs !== this.cfg.refreshMs;
    this.cfg = { ...this.cfg, ...t };
    if (moved) this.wheel.remove(this);
    this.syncWheel();
  }

  /** The refresh wheel's turn (RefreshMember). */
  refreshDue(): void {
    this.feed({ type: 'refresh' });
  }

  /** A full burst again now (VRRP split brain: the LAN may point at the other Master). */
  reannounce(): void {
    this.feed({ type: 'reannounce' });
  }

  /** Stop announcing and defending; closes the socket if this owner opened it. */
  close(): void {
    this.feed({ type: 'stop' });
    this.clearTimer();
    this.wheel.remove(this);
    const s = this.sock;
    if (!s) return;
    this.sock = undefined;
    s.socket.off('frame', this.onFrame);
    if (s.owned) s.socket.close();
  }

  private clearTimer(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** In the wheel exactly while the address is held with a refresh. */
  private syncWheel(): void {
    const want = this.sock !== undefined && this.state.phase === 'held' && this.cfg.refreshMs > 0;
    if (want && !this.wheel.has(this)) this.wheel.add(this, this.cfg.refreshMs);
    else if (!want) this.wheel.remove(this);
  }

  /** An announcement sent, or not (err). */
  private announced(reason: AnnounceReason, err?: Error): void {
    if (err !== undefined) {
      this.log.warn({ op: 'announce', reason, err: err.message }, 'could not send a gratuitous ARP');
      return;
    }
    this.metrics?.gratuitousArpsSent.inc();
    this.metrics?.vipAnnouncements.inc({ reason });
    this.log.debug({ op: 'announce', reason }, 'gratuitous ARP sent');
  }

  private feed(event: VipEvent, throwOnSendError = false): void {
    if (!this.sock) return;
    const step = vipStep(this.state, event, this.clock.now(), this.cfg);
    this.state = step.state;
    for (const a of step.actions) {
      switch (a.type) {
        case 'announce': {
          const socket = this.sock?.socket;
          if (socket === undefined) break;
          if (!throwOnSendError && socket.sendSoon) {
            // In a refresh slot of the shared sockets: sent with the slot's other frames.
            socket.sendSoon(this.announcement, (err) => this.announced(a.reason, err));
            break;
          }
          try {
            socket.send(this.announcement);
          } catch (err) {
            if (throwOnSendError) {
              this.feed({ type: 'stop' });
              throw err;
            }
            this.announced(a.reason, err as Error);
            break;
          }
          this.announced(a.reason);
          break;
        }
        case 'arm-timer':
          this.clearTimer();
          this.timer = this.clock.setTimeout(() => { this.timer = undefined; this.feed({ type: 'timer' }); }, Math.max(0, Math.ceil(a.at - this.clock.now())));
          break;
        case 'clear-timer':
          this.clearTimer();
          break;
        case 'defended':
          this.metrics?.arpConflicts.inc({ phase: 'defend' });
          this.log.warn({ op: 'defend', conflictingMac: a.mac }, `${a.mac} claims ${this.ip}; defended with one gratuitous ARP (RFC 5227 §2.4)`);
          this.emit('conflict', { ip: this.ip, mac: a.mac, defended: true } satisfies VipConflict);
          break;
        case 'conflict':
          this.metrics?.arpConflicts.inc({ phase: 'defend' });
          this.log.warn({ op: 'defend', conflictingMac: a.mac }, `${a.mac} claims ${this.ip} again; keeping it (RFC 5227 §2.4 (c)), next defence at most one defend interval after the last`);
          this.emit('conflict', { ip: this.ip, mac: a.mac, defended: false } satisfies VipConflict);
          break;
        case 'lost':
          this.metrics?.arpConflicts.inc({ phase: 'defend' });
          this.log.warn({ op: 'give-up', conflictingMac: a.mac }, `${a.mac} claims ${this.ip} again within the defend interval; the address must be given up (RFC 5227 §2.4)`);
          this.emit('lost', { ip: this.ip, mac: a.mac, defended: false } satisfies VipConflict);
          break;
      }
    }
    this.syncWheel();
  }
}
