// Driver layer: one VRRPv3 virtual router (one VRID of one family on one
// interface) on an AF_PACKET socket. The family is data (wire.ts): IPv4
// adverts from the primary address to 224.0.0.18, IPv6 ones from the
// link-local address to ff02::12 (RFC 5798 §5.1.2), the rest is one path. It performs what machine.ts decides - sends adverts,
// arms the one timer, keeps the metrics - and reports the outcome as events
// ('master', 'backup', 'master-changed'). It never touches an address: the
// daemon gates the VIP's address source on these events.
//
// Why a packet socket and not an IP raw socket (or the raw-socket npm
// package): RFC 5798 §7.3 wants adverts to leave with the virtual router MAC
// 00:00:5e:00:01:<VRID> as Ethernet source, which only a frame we build
// ourselves can carry; and the checksums stay here, in tested TypeScript,
// not in untested C.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { LbError, errorMessage } from '../errors';
import type { Clock, TimerHandle } from '../clock';
import { realClock } from '../clock';
import type { Logger } from '../log';
import { parseMac, type Family } from '../address';
import { PACKET_OUTGOING, openPacketSocket, type FrameInfo, type PacketSocket, type PacketSocketOptions } from '../net/packet/packet';
import { MAX_ADDRESSES, MAX_ADVER_INT_CS } from './codec';
import { MachineKeys, vrrpWire, type VrrpWire, type WireEncode } from './wire';
import { type Action, type BecomeMasterReason, type Machine, type VrrpState, VRRP_STATES, createMachine, masterDownIntervalMs, step } from './machine';
import { vrrpMetrics, type VrrpMetrics } from './metrics';
import { NOT_A_PEER, acceptsAdvertFrom } from './peers';

export { assignVrids, type VridAssignment, type VridCandidate } from './assign';
export type { VrrpState } from './machine';

export interface VirtualRouterOptions {
  /** 1-255. */
  readonly vrid: number;
  /** 1-255 (255 only for the owner of the addresses, which we never are). */
  readonly priority: number;
  /** Seconds, 0.01-40.95 (centisecond resolution, RFC 5798 §5.2.7). */
  readonly advertInterval: number;
  readonly preempt: boolean;
  /** Seconds a higher-priority Backup tolerates a lower-priority Master (0 = RFC behaviour). */
  readonly preemptDelay: number;
  readonly ifindex: number;
  /** For logs and status. */
  readonly ifname: string;
  /** The instance's family (RFC 5798 §5.1: one instance per family); default IPv4. */
  readonly family?: Family | undefined;
  /**
   * Source of adverts and the tie-breaker: the node's primary IPv4 address on
   * the interface, or for IPv6 its link-local address (§5.1.2.1).
   */
  readonly srcIp: string;
  /** Ethernet source of adverts; default the virtual router MAC 00:00:5e:00:01:<vrid>, 00:00:5e:00:02:<vrid> for IPv6 (§7.3). */
  readonly srcMac?: string | undefined;
  /** The VIPs this router protects, read at every advert (first 255 listed; those of another family are left out). */
  readonly vips: () => readonly string[];
  readonly clock?: Clock | undefined;
  readonly log: Logger;
  readonly registry: Registry;
  /** Opens the socket; default agent/net's openPacketSocket. */
  readonly openSocket?: ((opts: PacketSocketOptions) => PacketSocket) | undefined;
  /** failover.peers of this family (canonical text): only their adverts are heard, and each advert also goes to each of them unicast. Empty: multicast only, anyone heard. */
  readonly peers?: readonly string[] | undefined;
  /** The MAC of a peer, when resolved (net/neighbour arp-resolver.ts, ndp-resolver.ts); a peer without one gets no unicast copy yet. */
  readonly peerMac?: ((ip: string) => Uint8Array | undefined) | undefined;
  /** A Master whose priority falls below a router it has heard steps down, and resigns this many ms later (machine.ts MachineConfig.stepDownMs); undefined: it does not. */
  readonly stepDownMs?: number | undefined;
}

export interface MasterEvent { readonly vrid: number; readonly master: string; readonly reason?: BecomeMasterReason | undefined }
export interface BackupEvent { readonly vrid: number; readonly master: string | undefined }
export interface MasterChangedEvent { readonly vrid: number; readonly master: string | undefined }
export interface SplitBrainEvent { readonly vrid: number; readonly peer: string; readonly peerPriority: number; readonly resolution: 'kept' | 'yielded' }
export interface DroppedEvent { readonly vrid: number; readonly reason: string }

export interface VirtualRouterStatus {
  readonly vrid: number;
  readonly family: Family;
  readonly ifname: string;
  readonly state: VrrpState;
  readonly priority: number;
  /** Address of the current Master, ours when Master; undefined when unknown. */
  readonly master: string | undefined;
  readonly masterPriority: number | undefined;
  /** Seconds, as learnt from the Master (§6.4.2). */
  readonly masterAdverInterval: number;
  /** Seconds without adverts after which a Backup takes over. */
  readonly masterDownInterval: number;
}

export interface VirtualRouterEvents {
  master: [e: MasterEvent];
  backup: [e: BackupEvent];
  /** Out of the election: a tracked interface or service without a weight failed (setPriority(0)). */
  fault: [e: { vrid: number }];
  'master-changed': [e: MasterChangedEvent];
  'split-brain': [e: SplitBrainEvent];
  /** A received frame refused by the codec (also counted in lbagent_vrrp_dropped_total). */
  dropped: [e: DroppedEvent];
  stopped: [e: { vrid: number }];
}

function invalid(message: string, details: Record<string, unknown>): LbError {
  return new LbError('LB_ERR_VRRP_INVALID', message, details);
}

export class VirtualRouter extends EventEmitter<VirtualRouterEvents> {
  readonly vrid: number;
  readonly ifname: string;
  readonly family: Family;
  private readonly opts: VirtualRouterOptions;
  private readonly wire: VrrpWire;
  private readonly keys: MachineKeys;
  private readonly peers: readonly string[];
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly metrics: VrrpMetrics;
  /** The machine's key for srcIp (MachineKeys). */
  private srcKey: number;
  /** The source address adverts carry (primary IPv4 or link-local IPv6); setSource() follows a change. */
  private srcIp: string;
  private readonly srcMac: Buffer;
  private readonly labels: { readonly vrid: string; readonly family: Family };
  private machine: Machine;
  private socket: PacketSocket | undefined;
  private timer: TimerHandle | undefined;
  private ipId = 0;
  private masterLabel: string | undefined;
  private warnedTooMany = false;
  private stopped = false;
  /** A priority set before start(): 0 starts the router in fault. */
  private pendingPriority: number | undefined;

  constructor(opts: VirtualRouterOptions) {
    super();
    const { vrid, priority, advertInterval, preemptDelay } = opts;
    if (!Number.isInteger(vrid) || vrid < 1 || vrid > 255) throw invalid(`VRRP virtual router id ${vrid} is out of range: use 1-255`, { vrid });
    if (!Number.isInteger(priority) || priority < 1 || priority > 255) {
      throw invalid(`VRRP priority ${priority} for VRID ${vrid} is out of range: use 1-254 (0 is reserved for resigning, RFC 5798 §5.2.4)`, { vrid, priority });
    }
    const cs = Math.round(advertInterval * 100);
    if (!Number.isFinite(advertInterval) || cs < 1 || cs > MAX_ADVER_INT_CS) {
      throw invalid(`VRRP advertisement interval ${advertInterval} s for VRID ${vrid} is out of range: use 0.01-40.95 s`, { vrid, advertInterval });
    }
    if (!Number.isFinite(preemptDelay) || preemptDelay < 0) throw invalid(`VRRP preempt delay ${preemptDelay} s for VRID ${vrid} must be >= 0`, { vrid, preemptDelay });
    const family = opts.family ?? 'IPv4';
    const wire = vrrpWire(family);
    const src = wire.parse(opts.srcIp);
    if (src === undefined) throw invalid(`VRRP source address "${opts.srcIp}" for VRID ${vrid} on ${opts.ifname} is not an ${family} address`, { vrid, srcIp: opts.srcIp });
    let mac = wire.virtualMac(vrid);
    if (opts.srcMac !== undefined) {
      const m = parseMac(opts.srcMac);
      if (!m) throw invalid(`VRRP source MAC "${opts.srcMac}" for VRID ${vrid} is not a MAC address`, { vrid, srcMac: opts.srcMac });
      mac = m;
    }
    this.opts = opts;
    this.vrid = vrid;
    this.family = family;
    this.wire = wire;
    this.labels = { vrid: String(vrid), family };
    this.ifname = opts.ifname;
    this.keys = new MachineKeys(family, src);
    this.srcKey = this.keys.key(src);
    this.srcIp = src;
    this.srcMac = mac;
    this.peers = (opts.peers ?? []).map((p) => wire.parse(p) ?? p);
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'failover', vrid, family, interface: opts.ifname });
    this.metrics = vrrpMetrics(opts.registry);
    this.machine = createMachine({
      priority,
      advertIntervalCs: cs,
      preempt: opts.preempt,
      preemptDelayMs: preemptDelay * 1000,
      primaryIp: this.srcKey,
      stepDownMs: opts.stepDownMs,
    });
    this.setStateGauge('initialize');
  }

  /**
   * The interface's address changed: adverts carry the new one from the next
   * on (RFC 5798 §5.1.1.1: the primary IPv4 address of the interface;
   * §5.1.2.1: the IPv6 link-local one), and our own adverts are told from
   * others' by it. An equal-priority tie is broken by the new address, as it
   * would be after a restart. An address of the other family is ignored.
   */
  setSource(address: string): void {
    const text = this.wire.parse(address);
    if (text === undefined || text === this.srcIp) return;
    this.log.info({ op: 'source', from: this.srcIp, to: text }, `VRRP adverts now sent from ${text}`);
    const m = this.machine;
    const master = m.master === undefined || m.master === this.srcKey ? undefined : this.keys.address(m.master);
    const wasOurs = m.master !== undefined && m.master === this.srcKey;
    this.srcIp = text;
    this.srcKey = this.keys.setOwn(text);
    const masterKey = wasOurs ? this.srcKey : master === undefined ? undefined : this.keys.key(master);
    this.machine = { ...m, config: { ...m.config, primaryIp: this.srcKey }, master: masterKey };
  }

  get state(): VrrpState { return this.machine.state; }

  /**
   * The priority in use (failover/tracking.ts): 1-254, or 0 for fault. As
   * Master the new priority is advertised at once; 0 resigns (RFC 5798
   * §6.4.3) and keeps the router out of the election until a priority
   * above 0 puts it back in Backup. Before start() it only sets the
   * priority start() begins with (0: start() begins in fault).
   */
  setPriority(priority: number): void {
    if (!Number.isInteger(priority) || priority < 0 || priority > 254) throw invalid(`VRRP priority ${priority} is not 0-254`, { vrid: this.vrid, priority });
    if (this.stopped) return;
    if (!this.socket) {
      this.pendingPriority = priority;
      if (priority > 0) this.machine = { ...this.machine, config: { ...this.machine.config, priority } };
      return;
    }
    if (priority === (this.machine.state === 'fault' ? 0 : this.machine.config.priority)) return;
    this.log.info({ op: 'priority', from: this.machine.state === 'fault' ? 0 : this.machine.config.priority, to: priority, state: this.machine.state }, priority === 0 ? 'VRRP priority 0: fault, out of the election' : `VRRP priority ${priority}`);
    this.run({ kind: 'priority', priority });
  }

  /** Address of the current Master (ours when Master), undefined when unknown. */
  get master(): string | undefined {
    return this.machine.master === undefined ? undefined : this.keys.address(this.machine.master);
  }

  status(): VirtualRouterStatus {
    const m = this.machine;
    return {
      vrid: this.vrid,
      family: this.family,
      ifname: this.ifname,
      state: m.state,
      priority: m.config.priority,
      master: this.master,
      masterPriority: m.masterPriority,
      masterAdverInterval: m.masterAdverIntervalCs / 100,
      masterDownInterval: masterDownIntervalMs(m.config.priority, m.masterAdverIntervalCs) / 1000,
    };
  }

  /**
   * Open the socket and enter Backup (or Master for an owner). Throws the
   * socket's LbError (LB_ERR_NET_NO_CAPABILITY, LB_ERR_NET_NO_INTERFACE, ...)
   * with nothing started.
   */
  start(): void {
    if (this.socket || this.stopped) throw new LbError('LB_ERR_VRRP_SOCKET', `VRRP VRID ${this.vrid} on ${this.ifname} was already started`, { vrid: this.vrid });
    const open = this.opts.openSocket ?? openPacketSocket;
    const sock = open({
      ifindex: this.opts.ifindex,
      protocol: this.wire.ethertype,
      filter: this.wire.filter(this.vrid),
      // The NIC must pass the group MAC of 224.0.0.18 or ff02::12 up (RFC 5798 §5.1.1.2, §5.1.2.2).
      multicast: [Buffer.from(this.wire.multicastMac)],
      log: this.log,
    });
    sock.on('frame', (frame: Buffer, info: FrameInfo) => this.onFrame(frame, info));
    sock.on('error', (err: unknown) => this.log.warn({ op: 'receive', err: errorMessage(err) }, 'VRRP socket error'));
    this.socket = sock;
    this.log.info({ op: 'start', priority: this.machine.config.priority, advertInterval: this.machine.config.advertIntervalCs / 100, preempt: this.machine.config.preempt, srcIp: this.srcIp }, 'VRRP virtual router starting');
    this.run({ kind: 'startup' });
    if (this.pendingPriority === 0) this.run({ kind: 'priority', priority: 0 });
    this.pendingPriority = undefined;
  }

  /**
   * Leave the election. As Master, a priority-0 advert goes out first (RFC
   * 5798 §6.4.3) unless priorityZero is false, so a Backup takes over after
   * Skew_Time rather than Master_Down_Interval. Idempotent.
   */
  stop(opts: { priorityZero?: boolean } = {}): void {
    if (this.stopped) return;
    this.stopped = true;
    this.run({ kind: 'shutdown', priorityZero: opts.priorityZero ?? true });
    this.disarm();
    this.socket?.close();
    this.socket = undefined;
    this.log.info({ op: 'stop' }, 'VRRP virtual router stopped');
    this.emit('stopped', { vrid: this.vrid });
  }

  private onFrame(frame: Buffer, info: FrameInfo): void {
    if (this.stopped) return;
    if (info.pktType === PACKET_OUTGOING) return; // our own, seen on the way out
    const r = this.wire.decode(frame);
    if (!r.ok) {
      this.metrics.dropped.inc({ reason: r.reason, family: this.family });
      this.log.debug({ op: 'receive', reason: r.reason, length: frame.length }, 'dropped VRRP packet');
      this.emit('dropped', { vrid: this.vrid, reason: r.reason });
      return;
    }
    const a = r.advert;
    // The kernel filter already keeps other VRIDs out; a looped-back copy
    // of our own advert is not a peer.
    if (a.vrid !== this.vrid || a.src === this.srcIp) return;
    if (!acceptsAdvertFrom(a.src, this.peers)) {
      this.metrics.dropped.inc({ reason: NOT_A_PEER, family: this.family });
      this.log.debug({ op: 'receive', reason: NOT_A_PEER, srcIp: a.src, priority: a.priority }, 'dropped a VRRP advert from outside failover.peers');
      this.emit('dropped', { vrid: this.vrid, reason: NOT_A_PEER });
      return;
    }
    this.metrics.advertsReceived.inc(this.labels);
    this.run({ kind: 'advert', srcIp: this.keys.key(a.src, this.machine.master), priority: a.priority, maxAdverIntCs: a.maxAdverIntCs });
  }

  private run(ev: Parameters<typeof step>[1]): void {
    const { machine, actions } = step(this.machine, ev, this.clock.now());
    this.machine = machine;
    // Perform every action first, then tell listeners: a listener that
    // stops the router sees it in a consistent state.
    const events: (() => void)[] = [];
    for (const a of actions) this.perform(a, events);
    for (const emit of events) emit();
  }

  private perform(a: Action, events: (() => void)[]): void {
    switch (a.kind) {
      case 'sendAdvert':
        this.send(a.priority);
        return;
      case 'setTimer':
        this.arm(a.at);
        return;
      case 'clearTimer':
        this.disarm();
        return;
      case 'becomeMaster':
        this.transitioned('master', { reason: a.reason });
        events.push(() => this.emit('master', { vrid: this.vrid, master: this.srcIp, reason: a.reason } satisfies MasterEvent));
        return;
      case 'becomeFault':
        this.transitioned('fault', { reason: 'tracking' });
        events.push(() => this.emit('fault', { vrid: this.vrid }));
        return;
      case 'becomeBackup': {
        const master = a.master === undefined ? undefined : this.keys.address(a.master);
        this.transitioned('backup', { reason: a.reason, master });
        events.push(() => this.emit('backup', { vrid: this.vrid, master } satisfies BackupEvent));
        return;
      }
      case 'becomeInitialize':
        this.transitioned('initialize', { reason: 'shutdown' });
        return;
      case 'masterChanged': {
        const master = a.master === undefined ? undefined : this.keys.address(a.master);
        if (this.masterLabel !== undefined) this.metrics.masterInfo.remove({ ...this.labels, master: this.masterLabel });
        this.masterLabel = master;
        if (master !== undefined) this.metrics.masterInfo.set({ ...this.labels, master }, 1);
        this.log.info({ op: 'master-changed', master: master ?? null }, master ? `VRRP master is ${master}` : 'VRRP master unknown');
        events.push(() => this.emit('master-changed', { vrid: this.vrid, master } satisfies MasterChangedEvent));
        return;
      }
      case 'splitBrain': {
        const peer = this.keys.address(a.peer);
        this.metrics.splitBrain.inc(this.labels);
        this.log.warn(
          { op: 'split-brain', peer, peerPriority: a.peerPriority, priority: this.machine.config.priority, resolution: a.resolution },
          a.resolution === 'kept'
            ? `another VRRP master ${peer} (priority ${a.peerPriority}) was heard; keeping master, it yields to our adverts`
            : `another VRRP master ${peer} (priority ${a.peerPriority}) outranks us; yielding`,
        );
        events.push(() => this.emit('split-brain', { vrid: this.vrid, peer, peerPriority: a.peerPriority, resolution: a.resolution } satisfies SplitBrainEvent));
        return;
      }
    }
  }

  private transitioned(to: VrrpState, fields: Record<string, unknown>): void {
    this.metrics.transitions.inc({ ...this.labels, to });
    this.metrics.lastTransition.set(this.labels, this.clock.wallNow() / 1000);
    this.setStateGauge(to);
    this.log.info({ op: 'transition', to, ...fields }, `VRRP state ${to}`);
  }

  private setStateGauge(current: VrrpState): void {
    for (const s of VRRP_STATES) this.metrics.state.set({ ...this.labels, state: s }, s === current ? 1 : 0);
  }

  private send(priority: number): void {
    const sock = this.socket;
    if (!sock) return;
    // §5.1: an instance lists addresses of its own family only.
    const addresses: string[] = [];
    for (const v of this.opts.vips()) {
      const n = this.wire.parse(v);
      if (n !== undefined && !addresses.includes(n)) addresses.push(n);
    }
    if (addresses.length > MAX_ADDRESSES) {
      if (!this.warnedTooMany) {
        this.warnedTooMany = true;
        this.log.warn({ op: 'send', count: addresses.length }, `VRID ${this.vrid} protects ${addresses.length} VIPs; an advert lists 255, the rest are left out (assignVrids spreads services over VRIDs)`);
      }
      addresses.length = MAX_ADDRESSES;
    }
    const advert: WireEncode = {
      vrid: this.vrid, priority, maxAdverIntCs: this.machine.config.advertIntervalCs, addresses, src: this.srcIp, srcMac: this.srcMac,
    };
    this.sendFrame(advert, undefined);
    // keepalived's unicast_peer: the same advert to each peer, for LANs that
    // filter multicast. Peers whose MAC is not resolved yet get the next one.
    for (const peer of this.peers) {
      const mac = this.opts.peerMac?.(peer);
      if (mac) this.sendFrame(advert, { dst: peer, dstMac: mac });
    }
  }

  private sendFrame(advert: WireEncode, to: { dst: string; dstMac: Uint8Array } | undefined): void {
    this.ipId = (this.ipId + 1) & 0xffff;
    try {
      this.socket!.send(this.wire.encode({ ...advert, ...to, ipId: this.ipId }));
      this.metrics.advertsSent.inc(this.labels);
    } catch (err) {
      // A failed send (interface down) is not fatal: Backups take over if it
      // lasts, and the next timer tries again.
      this.log.warn({ op: 'send', priority: advert.priority, to: to ? to.dst : this.wire.group, err: errorMessage(err) }, 'sending a VRRP advert failed');
    }
  }

  private arm(at: number): void {
    this.disarm();
    const fire = (): void => {
      this.timer = undefined;
      const now = this.clock.now();
      // Timers may fire a fraction of a millisecond early: wait out the rest.
      if (now < at) {
        this.timer = this.clock.setTimeout(fire, at - now);
        return;
      }
      // Judged one turn later: frames that came while the event loop was
      // busy (a start under load) are read in this turn's poll phase, after
      // the timers. A peer's advert already queued then counts before a
      // Backup calls Master_Down_Interval run out and takes the VIPs from a
      // live Master; one that re-arms the timer cancels this.
      this.timer = this.clock.setTimeout(() => {
        this.timer = undefined;
        this.run({ kind: 'timer' });
      }, 0);
    };
    this.timer = this.clock.setTimeout(fire, Math.max(0, at - this.clock.now()));
  }

  private disarm(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }
}
