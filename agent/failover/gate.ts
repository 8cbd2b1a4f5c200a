// The daemon's view of VRRP for one family: which virtual router carries each
// service's VIP (assignVrids), one VirtualRouter per VRID on the VRRP
// interface (dual.ts puts an IPv4 gate and an IPv6 gate side by side), and the
// answer to "does this node hold service X now?". Mastership changes become
// one 'change' event listing the services whose VIP must move; the daemon
// starts or stops their address sources. Addresses are never touched here.
//
// It also decides what a Master's adverts list (see advertisedVips) and keeps
// per-router counts for `lb-agent status` (the same facts as the
// lbagent_vrrp_* metrics, which are only readable asynchronously).
// The priority each router advertises is its configured one as the
// tracker (tracker.ts, failover.track) lowers it; every change is a
// 'priority' event.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import type { FailoverConfig, ServiceSpec } from '../config/types';
import type { Clock, TimerHandle } from '../clock';
import { realClock, isoTime } from '../clock';
import type { Logger } from '../log';
import { formatIPv4, formatMac, parseIPv4, type Family } from '../address';
import { PACKET_OUTGOING, openPacketSocket, type FrameInfo, type PacketSocket, type PacketSocketOptions } from '../net/packet/packet';
import { VirtualRouter, assignVrids, type VirtualRouterStatus, type SplitBrainEvent } from './driver';
import { acceptsAdvertFrom } from './peers';
import { vrrpWire, type VrrpWire } from './wire';
import { ArpResolver } from '../net/neighbour/arp-resolver';
import { NdpResolver } from '../net/neighbour/ndp-resolver';
import type { PriorityTracker, TrackStatus } from './tracker';
import type { EffectivePriority } from './tracking';
import { vrrpMetrics, type VrrpMetrics } from './metrics';
import { DEFAULT_NETWORK } from '../config/networks';

/**
 * The time a VIP's withdrawal is given: an event loop and a netlink call.
 * A node that preempted a live Master waits this long before it takes the
 * VIP (see VrrpGate.update): the preempted Master withdraws as soon as it
 * hears our first advert. A Master whose tracking lowered its priority
 * below a router it has heard steps down instead (machine.ts stepDownMs):
 * it withdraws first and resigns with priority 0 this long after, so the
 * router taking over needs no wait.
 */
export const PREEMPT_HANDOVER_MS = 200;

/**
 * After a takeover, how long the data path hands a backend's answers to
 * connections this node never saw back to the previous Master (forward/nft.ts
 * "Hand-back"). An answer in flight at the takeover arrives within a round
 * trip; the client's next packet moves the connection here (pick-up). A few
 * seconds also cover a backend that retransmits into the takeover.
 */
export const HAND_BACK_MS = 5_000;

export interface VrrpGateOptions {
  readonly config: FailoverConfig;
  readonly nodePriority: number;
  readonly ifindex: number;
  readonly ifname: string;
  /** The family of every router of this gate; default IPv4. IPv6: VRIDs from failover.vrid6, peers from failover.peers6. */
  readonly family?: Family;
  /** The address adverts are sent from: the interface's primary IPv4 address, or its IPv6 link-local address. */
  readonly srcIp: string;
  readonly log: Logger;
  readonly registry: Registry;
  readonly clock?: Clock;
  /** Opens each router's socket; default agent/net's openPacketSocket (tests pass an in-memory LAN). */
  readonly openSocket?: (opts: PacketSocketOptions) => PacketSocket;
  /** Default PREEMPT_HANDOVER_MS. */
  readonly preemptHandoverMs?: number;
  /** Default HAND_BACK_MS. */
  readonly handBackMs?: number;
  /** The VRRP interface's own MAC: the source of ARP requests (neighbour solicitations) for failover.peers. */
  readonly ifMac?: string;
  /** Resolves failover.peers' MACs for unicast adverts; default an ArpResolver (NdpResolver) on the interface (tests pass their own). */
  readonly peerMac?: (ip: string) => Uint8Array | undefined;
  /** This network's tracks, observed (tracker.ts); absent: every router advertises its configured priority. */
  readonly tracker?: PriorityTracker | undefined;
  /** The network whose routers these are (config/networks.ts); default DEFAULT_NETWORK. */
  readonly network?: string | undefined;
}

/** A router's priority in use changed (tracking): the daemon's event history and log. */
export interface PriorityEvent {
  /** The network whose router it is ("default": node.interface's). */
  readonly network: string;
  readonly vrid: number;
  /** The services riding the router. */
  readonly services: readonly string[];
  readonly from: number;
  readonly to: number;
  readonly base: number;
  /** Why (failing tracks), empty when back at the configured priority. */
  readonly reasons: readonly string[];
}

/** What `lb-agent status` shows of a service's virtual router. */
export interface GateStatus extends VirtualRouterStatus {
  readonly preempt: boolean;
  /** The addresses this node's adverts list for the router (when Master). */
  readonly advertisedVips: readonly string[];
  /** The addresses the current (or last) other Master listed, if any. */
  readonly heardVips: readonly string[];
  readonly transitions: { readonly master: number; readonly backup: number };
  /** ISO time of the last Master/Backup transition, undefined before the first. */
  readonly lastTransition: string | undefined;
  readonly advertsSent: number;
  readonly advertsReceived: number;
  readonly splitBrains: number;
  readonly lastSplitBrain: (Omit<SplitBrainEvent, 'vrid'> & { readonly at: string }) | undefined;
  /** Master by preemption, waiting until this ISO time for the preempted Master to withdraw the VIP. */
  readonly handoverUntil: string | undefined;
  /** The configured priority (node.priority or the service's); `priority` is the one in use. */
  readonly basePriority: number;
  /** Why `priority` differs from basePriority: one line per failing track. */
  readonly priorityReasons: readonly string[];
  /** Every track of this router's network (failover.track, or networks.<name>.failover.track), failing or not. */
  readonly tracks: readonly TrackStatus[];
}

/** Resolves failover.peers' MACs for unicast adverts: ARP for IPv4, neighbour discovery for IPv6. */
interface PeerResolver {
  start(): void;
  close(): void;
  macOf(ip: string): Uint8Array | undefined;
}

/** Per-router facts the gate keeps for status. */
interface RouterInfo {
  transitions: { master: number; backup: number; fault: number };
  /** The configured priority; `effective` is what tracking made of it. */
  basePriority: number;
  effective: EffectivePriority;
  lastTransition: number | undefined;
  advertsSent: number;
  advertsReceived: number;
  splitBrains: number;
  lastSplitBrain: (Omit<SplitBrainEvent, 'vrid'> & { at: number }) | undefined;
  /** The address list of the last advert from another router with priority > 0. */
  heard: readonly string[];
  /** Priority of the other Master this router last followed (undefined: none known, or it resigned). */
  otherMasterPriority: number | undefined;
  /** While Master by preemption: when the VIP may be taken (clock.now() ms). */
  handoverUntil: number | undefined;
  handoverTimer: TimerHandle | undefined;
  /** The other Master this router last followed (its address), whoever it was. */
  otherMaster: string | undefined;
  /** After a takeover from otherMaster: hand back to it until (clock.now() ms) (HAND_BACK_MS). */
  handBack: { readonly to: string; readonly until: number } | undefined;
  handBackTimer: TimerHandle | undefined;
}

function newInfo(basePriority: number, effective: EffectivePriority): RouterInfo {
  return {
    basePriority, effective,
    transitions: { master: 0, backup: 0, fault: 0 }, lastTransition: undefined, advertsSent: 0, advertsReceived: 0, splitBrains: 0,
    lastSplitBrain: undefined, heard: [], otherMasterPriority: undefined, handoverUntil: undefined, handoverTimer: undefined,
    otherMaster: undefined, handBack: undefined, handBackTimer: undefined,
  };
}

function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * A packet socket that counts what the router sends and the valid adverts of
 * other routers it receives, and remembers the addresses they list. The
 * router reads the same frames through it; nothing is changed or dropped.
 */
class CountingSocket extends EventEmitter implements PacketSocket {
  readonly ifindex: number;
  private lastSrc: string | undefined;
  private lastPriority: number | undefined;
  constructor(private readonly inner: PacketSocket, private readonly info: RouterInfo, wire: VrrpWire, vrid: number, srcIp: () => string, peers: readonly string[], onHeard: () => void) {
    super();
    this.ifindex = inner.ifindex;
    inner.on('frame', (frame: Buffer, fi: FrameInfo) => {
      if (fi.pktType !== PACKET_OUTGOING) {
        // The driver's own checks (RFC 5798 §7.1) decide; this only counts what passes them.
        const r = wire.decode(frame);
        if (r.ok && r.advert.vrid === vrid && r.advert.src !== srcIp() && acceptsAdvertFrom(r.advert.src, peers)) {
          info.advertsReceived++;
          // Status shows who advertises, at what priority and which
          // addresses (the Backup's Master, heardVips): a change to any of
          // them is said at once; the same advert again is not.
          let changed = r.advert.src !== this.lastSrc || r.advert.priority !== this.lastPriority;
          this.lastSrc = r.advert.src;
          this.lastPriority = r.advert.priority;
          if (r.advert.priority > 0 && !sameList(info.heard, r.advert.addresses)) {
            info.heard = r.advert.addresses;
            changed = true;
          }
          if (changed) onHeard();
        }
      }
      this.emit('frame', frame, fi);
    });
    inner.on('error', (err: unknown) => this.emit('error', err));
    inner.on('close', () => this.emit('close'));
  }

  send(frame: Buffer): void {
    this.inner.send(frame);
    this.info.advertsSent++;
  }

  close(): void { this.inner.close(); }
}

export class VrrpGate extends EventEmitter {
  private readonly opts: VrrpGateOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly routers = new Map<number, VirtualRouter>();
  private readonly info = new Map<number, RouterInfo>();
  private vridOf = new Map<string, number>();
  private servicesOn = new Map<number, string[]>();
  private specs = new Map<string, ServiceSpec>();
  /** The last VIP each service held on this node (survives Backup periods, not restarts). */
  private readonly lastHeld = new Map<string, string>();
  private vips: (key: string) => string | undefined = () => undefined;
  private resolver: PeerResolver | undefined;
  /** Whether the resolver was started (a router runs, or resolvePeers): a new one after an address change starts too. */
  private resolving = false;
  /** The address adverts are sent from; follows the interface (setSourceAddress). */
  private srcIp: string;
  private readonly peerMac: ((ip: string) => Uint8Array | undefined) | undefined;
  readonly family: Family;
  private readonly wire: VrrpWire;
  /** failover.peers of this gate's family, canonical text. */
  private readonly peers: readonly string[];
  private readonly baseVrid: number;
  private readonly metrics: VrrpMetrics;
  private readonly onTrackChange = (): void => this.applyPriorities();

  constructor(opts: VrrpGateOptions) {
    super();
    this.opts = opts;
    this.family = opts.family ?? 'IPv4';
    this.wire = vrrpWire(this.family);
    this.srcIp = this.wire.parse(opts.srcIp) ?? opts.srcIp;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'failover', family: this.family });
    this.peers = this.family === 'IPv6' ? opts.config.peers6 ?? [] : opts.config.peers.map((p) => formatIPv4(p));
    this.baseVrid = this.family === 'IPv6' ? opts.config.vrid6 ?? opts.config.vrid : opts.config.vrid;
    this.metrics = vrrpMetrics(opts.registry);
    opts.tracker?.on('change', this.onTrackChange);
    if (opts.peerMac) this.peerMac = opts.peerMac;
    else if (this.peers.length > 0 && opts.ifMac) {
      this.resolver = this.newResolver();
      this.peerMac = (ip) => this.resolver?.macOf(ip);
    }
    if (this.peers.length > 0) this.log.info({ op: 'peers', peers: this.peers }, 'VRRP adverts heard only from failover.peers, and sent to them unicast as well as multicast');
  }

  private newResolver(): PeerResolver | undefined {
    if (this.peers.length === 0 || !this.opts.ifMac) return undefined;
    // A peer's MAC learnt or changed: a tied IPv6 VIP's hand-back may follow (dual.ts tiedHandBack).
    const onResolved = (): void => { this.emit('peers-resolved'); };
    if (this.family === 'IPv6') {
      return new NdpResolver({ ifindex: this.opts.ifindex, mac: this.opts.ifMac, src: this.srcIp, targets: this.peers, log: this.opts.log, clock: this.opts.clock, onResolved });
    }
    const arp = new ArpResolver({ ifindex: this.opts.ifindex, mac: this.opts.ifMac, srcIp: parseIPv4(this.srcIp) ?? 0, targets: this.opts.config.peers, log: this.opts.log, clock: this.opts.clock, onResolved });
    return { start: () => arp.start(), close: () => arp.close(), macOf: (ip) => { const n = parseIPv4(ip); return n === undefined ? undefined : arp.macOf(n); } };
  }

  /** The VRRP interface's own address of this gate's family changed: every router sends from it from now on, and peers are resolved from it. */
  setSourceAddress(address: string): void {
    const text = this.wire.parse(address);
    if (text === undefined || text === this.srcIp) return;
    address = text;
    this.srcIp = address;
    for (const r of this.routers.values()) r.setSource(address);
    if (this.resolver) {
      this.resolver.close();
      this.resolver = this.newResolver();
      if (this.resolving) this.resolver?.start();
    }
  }

  update(services: readonly ServiceSpec[], vips: (serviceKey: string) => string | undefined): void {
    this.vips = vips;
    this.specs = new Map(services.map((s) => [s.key, s]));
    // The health checker was updated first (the daemon's order): what it
    // starts from counts before any router is made.
    this.opts.tracker?.refreshServices();
    const a = assignVrids(services, this.baseVrid);
    for (const key of a.overflow) this.log.error({ op: 'assign', service: key }, 'no VRRP virtual router has room for this VIP (255 per VRID); it is not served');
    this.vridOf = new Map(a.vrids);
    const on = new Map<number, string[]>();
    for (const [key, vrid] of a.vrids) on.set(vrid, [...(on.get(vrid) ?? []), key]);
    this.servicesOn = on;
    for (const key of [...this.lastHeld.keys()]) if (!this.specs.has(key)) this.lastHeld.delete(key);
    // A router's priority: the node's, unless a service pinned to that VRID names its own.
    const priorityOf = (vrid: number): number => {
      const pinned = services.find((s) => a.vrids.get(s.key) === vrid && s.priority !== undefined);
      return pinned?.priority ?? this.opts.nodePriority;
    };
    for (const [vrid, router] of this.routers) {
      if (!on.has(vrid) || this.info.get(vrid)?.basePriority !== priorityOf(vrid)) {
        router.removeAllListeners();
        router.stop({ priorityZero: true });
        const info = this.info.get(vrid);
        if (info) { this.clearHandover(info); this.clearHandBack(info); }
        this.routers.delete(vrid);
        this.info.delete(vrid);
        this.metrics.priority.remove({ vrid: String(vrid), family: this.family });
        this.metrics.basePriority.remove({ vrid: String(vrid), family: this.family });
        this.emit('change', [...(on.get(vrid) ?? [])]);
      }
    }
    for (const vrid of on.keys()) {
      if (this.routers.has(vrid)) continue;
      const base = priorityOf(vrid);
      const info = newInfo(base, this.effectiveOf(base));
      const open = this.opts.openSocket ?? openPacketSocket;
      const router = new VirtualRouter({
        vrid, family: this.family, priority: priorityOf(vrid), advertInterval: this.opts.config.advertInterval,
        preempt: this.opts.config.preempt, preemptDelay: this.opts.config.preemptDelay,
        ifindex: this.opts.ifindex, ifname: this.opts.ifname, srcIp: this.srcIp,
        vips: () => this.advertisedVips(vrid),
        openSocket: (o) => new CountingSocket(open(o), info, this.wire, vrid, () => this.srcIp, this.peers, () => this.emit('heard', [...(this.servicesOn.get(vrid) ?? [])])),
        peers: this.peers, peerMac: this.peerMac,
        stepDownMs: this.opts.preemptHandoverMs ?? PREEMPT_HANDOVER_MS,
        clock: this.opts.clock, log: this.opts.log, registry: this.opts.registry,
      });
      const emitChange = (): void => { this.emit('change', [...(this.servicesOn.get(vrid) ?? [])]); };
      const changed = (to: 'master' | 'backup' | 'fault', reason?: string): void => {
        info.transitions[to]++;
        info.lastTransition = this.clock.wallNow();
        this.clearHandover(info);
        this.clearHandBack(info);
        if (to === 'master' && info.otherMaster !== undefined) {
          // A takeover: what the other Master's connections get answered with meanwhile goes back to it.
          const handBackMs = this.opts.handBackMs ?? HAND_BACK_MS;
          info.handBack = { to: info.otherMaster, until: this.clock.now() + handBackMs };
          info.handBackTimer = this.clock.setTimeout(() => {
            info.handBackTimer = undefined;
            info.handBack = undefined;
            this.emit('hand-back', [...(this.servicesOn.get(vrid) ?? [])]);
          }, handBackMs);
        }
        // Preemption (RFC 5798 §6.4.2: we outrank a live Master and took
        // over): the preempted Master is still holding the VIP until it hears
        // our first advert and withdraws. Our address source probes the VIP
        // (RFC 5227) before claiming it; a probe that still meets the old
        // holder is a "conflict" that backs off for a minute. So the VIP is
        // taken a moment later. A takeover from a dead or resigned Master
        // (nobody holds the VIP) is not delayed.
        const grace = this.opts.preemptHandoverMs ?? PREEMPT_HANDOVER_MS;
        // The machine's reason says so: with preempt on, or a Master whose
        // tracking lowered its priority below ours (machine.ts, also with
        // preempt off).
        const preempted = to === 'master' && reason === 'preempt' && info.otherMasterPriority !== undefined && info.otherMasterPriority > 0;
        if (preempted && grace > 0) {
          info.handoverUntil = this.clock.now() + grace;
          info.handoverTimer = this.clock.setTimeout(() => {
            info.handoverTimer = undefined;
            info.handoverUntil = undefined;
            emitChange();
          }, grace);
          this.log.info({ op: 'handover', vrid, waitMs: grace, services: this.servicesOn.get(vrid) ?? [] }, `preempted a lower-priority Master; taking the VIPs in ${grace} ms, once it has withdrawn them`);
        }
        emitChange();
      };
      router.on('master', (e) => changed('master', e.reason));
      router.on('backup', () => changed('backup'));
      router.on('fault', () => changed('fault'));
      router.on('master-changed', (e) => {
        // Remember whom we followed and how it ranked, for the preemption check above.
        if (e.master === undefined) info.otherMasterPriority = undefined;
        else if (e.master !== this.srcIp) {
          info.otherMasterPriority = router.status().masterPriority;
          info.otherMaster = e.master;
        }
        // A Backup's hand-back (handBack) follows the Master it follows.
        if (router.state === 'backup') this.emit('hand-back', [...(this.servicesOn.get(vrid) ?? [])]);
      });
      router.on('split-brain', (e) => {
        info.splitBrains++;
        // The driver logs it; 'yielded' is followed by 'backup' and the daemon's withdrawal.
        info.lastSplitBrain = { peer: e.peer, peerPriority: e.peerPriority, resolution: e.resolution, at: this.clock.wallNow() };
        // We stay Master: the LAN may have learnt the other Master's MAC for
        // our VIPs while it held them, so tell it again where they live.
        if (e.resolution === 'kept') this.emit('reannounce', [...(this.servicesOn.get(vrid) ?? [])]);
      });
      this.routers.set(vrid, router);
      this.info.set(vrid, info);
      this.publishPriority(vrid, info);
      // Before start(): a router whose tracks fail without a weight starts in fault.
      if (info.effective.priority !== base) router.setPriority(info.effective.priority);
      this.resolvePeers();
      router.start();
    }
  }

  private effectiveOf(base: number): EffectivePriority {
    return this.opts.tracker?.effective(base) ?? { priority: base, base, reasons: [] };
  }

  private publishPriority(vrid: number, info: RouterInfo): void {
    this.metrics.priority.set({ vrid: String(vrid), family: this.family }, info.effective.priority);
    this.metrics.basePriority.set({ vrid: String(vrid), family: this.family }, info.basePriority);
  }

  /** A track changed: every router advertises what its configured priority becomes. */
  private applyPriorities(): void {
    for (const [vrid, router] of this.routers) {
      const info = this.info.get(vrid);
      if (!info) continue;
      const was = info.effective;
      const now = this.effectiveOf(info.basePriority);
      info.effective = now;
      if (now.priority === was.priority) continue;
      this.metrics.priorityChanges.inc({ vrid: String(vrid), family: this.family });
      this.publishPriority(vrid, info);
      const services = [...(this.servicesOn.get(vrid) ?? [])];
      this.log.info({ op: 'priority', vrid, from: was.priority, to: now.priority, base: now.base, reasons: now.reasons, services },
        `VRRP VRID ${vrid} priority ${was.priority} -> ${now.priority}${now.reasons.length > 0 ? `: ${now.reasons.join('; ')}` : ' (configured)'}`);
      router.setPriority(now.priority);
      this.emit('priority', { network: this.opts.network ?? DEFAULT_NETWORK, vrid, services, from: was.priority, to: now.priority, base: now.base, reasons: now.reasons } satisfies PriorityEvent);
    }
  }

  /** Does this node hold the service's VIP: Master of its router (and past a preemption handover)? */
  isMaster(serviceKey: string): boolean {
    const vrid = this.vridOf.get(serviceKey);
    return vrid !== undefined && this.routers.get(vrid)?.state === 'master' && this.info.get(vrid)?.handoverUntil === undefined;
  }

  /**
   * The address a service's VIP has or is about to have, as far as this node
   * knows: the one it holds; else its loadBalancerIP; else the last one it
   * held here; else the one the other Master of its router lists that no
   * other service of the router accounts for (when that leaves exactly one).
   * undefined for a DHCP service nobody has told us about yet.
   */
  knownVip(serviceKey: string): string | undefined {
    const held = this.vips(serviceKey);
    if (held !== undefined) {
      this.lastHeld.set(serviceKey, held);
      return held;
    }
    const direct = this.specs.get(serviceKey)?.loadBalancerIP ?? this.lastHeld.get(serviceKey);
    if (direct !== undefined) return direct;
    // From the other Master's advert: the addresses it lists, less those the
    // router's other services are known to have; when exactly one service is
    // left without an address and exactly one listed address is left, that
    // is its VIP (a router with one pool service and one DHCP service, say).
    const vrid = this.vridOf.get(serviceKey);
    if (vrid === undefined) return undefined;
    const heard = this.info.get(vrid)?.heard ?? [];
    const others = (this.servicesOn.get(vrid) ?? []).filter((k) => k !== serviceKey);
    const unknown = others.filter((k) => this.directVip(k) === undefined);
    const left = heard.filter((a) => !others.some((k) => this.directVip(k) === a));
    return unknown.length === 0 && left.length === 1 ? left[0] : undefined;
  }

  /** What this node knows of a VIP by itself: held, loadBalancerIP, or the last one held here. */
  private directVip(serviceKey: string): string | undefined {
    return this.vips(serviceKey) ?? this.specs.get(serviceKey)?.loadBalancerIP ?? this.lastHeld.get(serviceKey);
  }

  /**
   * What the adverts of a router list (RFC 5798 §5.2.9: "the IPvX addresses
   * associated with the virtual router"): each of its services' knownVip,
   * in config order. A Master lists a VIP it is still acquiring (a DHCP
   * lease, a pool probe) because receivers that check the list - keepalived
   * drops adverts whose count or addresses differ from its
   * virtual_ipaddress - would otherwise ignore us for that time and take
   * over. When no address is known at all (a DHCP service whose lease nobody
   * has heard of yet) the advert carries count 0. RFC 5798 §5.2.5 says the
   * minimum is 1; we keep advertising anyway, because falling silent makes
   * every Backup take over after Master_Down_Interval (a flap per Backup),
   * and listing an address that is not a VIP (the primary address) would be
   * a false statement that keepalived drops just the same. keepalived itself
   * sends count 0 for an instance without virtual_ipaddress.
   */
  advertisedVips(vrid: number): string[] {
    const out: string[] = [];
    for (const key of this.servicesOn.get(vrid) ?? []) {
      const v = this.knownVip(key);
      if (v !== undefined && !out.includes(v)) out.push(v);
    }
    return out;
  }

  status(serviceKey: string): (GateStatus & Record<string, unknown>) | undefined {
    const vrid = this.vridOf.get(serviceKey);
    const r = vrid === undefined ? undefined : this.routers.get(vrid);
    const info = vrid === undefined ? undefined : this.info.get(vrid);
    if (!r || !info || vrid === undefined) return undefined;
    const iso = (ms: number | undefined): string | undefined => (ms === undefined ? undefined : isoTime(ms));
    return {
      ...r.status(),
      priority: info.effective.priority,
      basePriority: info.basePriority,
      priorityReasons: info.effective.reasons,
      tracks: this.opts.tracker?.status() ?? [],
      preempt: this.opts.config.preempt,
      advertisedVips: this.advertisedVips(vrid),
      heardVips: [...info.heard],
      transitions: { ...info.transitions },
      lastTransition: iso(info.lastTransition),
      advertsSent: info.advertsSent,
      advertsReceived: info.advertsReceived,
      splitBrains: info.splitBrains,
      lastSplitBrain: info.lastSplitBrain ? { ...info.lastSplitBrain, at: iso(info.lastSplitBrain.at)! } : undefined,
      handoverUntil: info.handoverUntil === undefined ? undefined : iso(info.handoverUntil - this.clock.now() + this.clock.wallNow()),
    };
  }

  /**
   * Where the data path hands back a backend's answers to connections this
   * node never saw (forward/nft.ts "Hand-back"): as a Backup, to the Master
   * it follows - the rule is armed with the rest, so it is in place the
   * instant a takeover moves the VIP here; after a takeover, to the
   * previous Master for HAND_BACK_MS. undefined otherwise.
   */
  handBack(serviceKey: string): string | undefined {
    const vrid = this.vridOf.get(serviceKey);
    if (vrid === undefined) return undefined;
    const router = this.routers.get(vrid);
    const info = this.info.get(vrid);
    if (!router || !info) return undefined;
    if (router.state === 'backup') {
      const m = router.status().master;
      return m !== undefined && m !== this.srcIp ? m : undefined;
    }
    const hb = info.handBack;
    return router.state === 'master' && hb !== undefined && this.clock.now() < hb.until ? hb.to : undefined;
  }

  /**
   * The MAC a failover.peers entry answered with (ARP or neighbour
   * discovery, peer-resolver.ts), or undefined: `ip` is not a configured
   * peer, or it has not answered.
   */
  peerMacOf(ip: string): string | undefined {
    const text = this.wire.parse(ip);
    if (text === undefined || !this.peers.includes(text)) return undefined;
    const mac = this.peerMac?.(text);
    return mac === undefined ? undefined : formatMac(mac);
  }

  /** The first failover.peers entry (in the config's order) that answered with `mac`, or undefined. */
  peerWithMac(mac: string): string | undefined {
    return this.peers.find((p) => this.peerMacOf(p) === mac);
  }

  /** Resolve failover.peers' MACs whether or not a router runs here (a tied IPv6 VIP's hand-back, dual.ts). */
  resolvePeers(): void {
    this.resolving = true;
    this.resolver?.start();
  }

  private clearHandBack(info: RouterInfo): void {
    if (info.handBackTimer !== undefined) this.clock.clearTimeout(info.handBackTimer);
    info.handBackTimer = undefined;
    info.handBack = undefined;
  }

  private clearHandover(info: RouterInfo): void {
    if (info.handoverTimer !== undefined) this.clock.clearTimeout(info.handoverTimer);
    info.handoverTimer = undefined;
    info.handoverUntil = undefined;
  }

  async stop(): Promise<void> {
    // Priority 0 (RFC 5798 §6.4.3): a Backup takes over at once instead of
    // waiting out Master_Down_Interval.
    for (const r of this.routers.values()) { r.removeAllListeners(); r.stop({ priorityZero: true }); }
    this.opts.tracker?.off('change', this.onTrackChange);
    this.opts.tracker?.stop();
    this.resolver?.close();
    this.resolver = undefined;
    this.resolving = false;
    for (const info of this.info.values()) { this.clearHandover(info); this.clearHandBack(info); }
    this.routers.clear();
    this.info.clear();
  }
}
