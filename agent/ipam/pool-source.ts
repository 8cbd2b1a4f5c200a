// ipam/ driver: the AddressSource of one pool service. Every decision is
// pool-machine.ts's (pure); this file performs its actions: reserve in the
// shared PoolManager, RFC 5227 probe (net/arp-probe), persist the claim, put
// the address on the parent (netlink), hold it on the wire (net/vip-owner:
// announce, defend, refresh), and feed the outcomes back as events. It
// sends no packet itself, and keeps the service's status and metrics.
//
// Why /32 on the parent interface: the VIP is added as ADDR/32, not with the
// LAN's prefix. A /32 creates no connected route (nothing changes in the
// main routing table, and a pool outside the node's subnet does not make the
// node claim that whole subnet), it never becomes a "secondary" of the
// node's own subnet address (secondaries are flushed when the primary goes,
// e.g. when dhclient renews the node address, unless promote_secondaries),
// and it is never picked as a source address for the subnet route. The
// kernel still answers ARP for it on the parent (arp_ignore=1 answers for
// addresses configured on the receiving interface), which is all a VIP needs.
//
// An IPv6 VIP is the same with neighbour discovery for ARP: ADDR/128 added
// with IFA_F_NODAD after the agent's own duplicate address detection
// (net/neighbour/ndp-driver.ts dadProbe: RFC 4862 §5.4 probes from :: to
// the VIP's solicited-node group, which the probe joins through its port on
// the parent's shared NDP socket), and held by an NdpVipOwner (override
// advertisements to all-nodes on gain and every refresh interval, the
// defence). The kernel answers
// solicitations for the address itself: it is on the parent and the kernel
// joined its solicited-node group (docs/design.md, IPv6).
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { ownerTimings } from '../config/defaults';
import type { ArpConfig, ArpTimings, ServiceSpec } from '../config/types';
import { lazyChild, type Logger } from '../log';
import { realClock, isoTime, type Clock, type TimerHandle } from '../clock';
import { LbError, errorMessage, isLbError } from '../errors';
import { familyBits, parseAddress, parseIPv4, type Family } from '../address';
import type { AddressSource, SourceDamage, SourceStatus, Vip } from '../source';
import { probeAddress } from '../net/neighbour/arp-probe';
import { netMetrics, type NetMetrics } from '../net/metrics';
import { OWNED_ADDRESS_PROTO } from '../net/ownership/ownership';
import type { PacketSocket } from '../net/packet/packet';
import type { NdpSocket } from '../net/neighbour/ndp-socket';
import { NeighbourSockets } from '../net/neighbour/neighbour-sockets';
import { AddressRemovals } from '../net/netlink/address-removals';
import type { NetlinkClient, LinkInfo } from '../net/netlink/netlink';
import { VipOwner, type VipConflict } from '../net/neighbour/vip-owner';
import { dadProbe, ipv6Value, NdpVipOwner } from '../net/neighbour/ndp-driver';
import { DEFEND_INTERVAL_MS, DUP_ADDR_DETECT_TRANSMITS, RETRANS_TIMER_MS, type NdpOwnerConfig } from '../net/neighbour/ndp-owner';
import { addressesChanged } from '../net/host/local-addresses';
import { addressKey, reservedFromInterface } from './allocator';
import type { PoolManager } from './manager';
import { initialPoolState, poolStep, type PoolAction, type PoolEvent, type PoolMachineConfig, type PoolState } from './pool-machine';

/** The prefix of every IPv4 pool VIP on the parent (see the header comment). */
export const POOL_VIP_PREFIX = 32;

/** The prefix of a pool VIP of a family on the parent: a host address, /32 or /128. */
export function poolVipPrefix(family: Family): number {
  return familyBits(family);
}

/**
 * The NDP owner's timings from the `arp:` section: the burst, its interval
 * and the refresh are the same keys as for IPv4; DAD is RFC 4862's one probe
 * and RetransTimer (none when arp.probeNum is 0, as the ARP probe is off).
 */
export function ndpTimings(arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>>, probe: boolean): Omit<NdpOwnerConfig, 'giveUp' | 'answerSolicitations'> {
  return {
    dadTransmits: probe && arp.probeNum > 0 ? DUP_ADDR_DETECT_TRANSMITS : 0,
    retransTimerMs: RETRANS_TIMER_MS,
    ...ownerTimings(arp),
    defendIntervalMs: DEFEND_INTERVAL_MS,
  };
}

export type PoolNetlink = Pick<NetlinkClient, 'getLink' | 'listAddresses' | 'addAddress' | 'removeAddresses'>;

export interface PoolSourceOptions {
  /** The service (key, name, namespace, loadBalancerIP, family are used). */
  service: Pick<ServiceSpec, 'key' | 'name' | 'namespace' | 'loadBalancerIP' | 'family' | 'network'>;
  /** The parent NIC the VIP goes on. */
  parentIfname: string;
  /** Shared by every pool source of the agent: owns claims, pools, conflicts. */
  manager: PoolManager;
  /** RFC 5227 timings; refreshInterval (default DEFAULT_ARP's) for the held VIP. */
  arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>>;
  netlink: PoolNetlink;
  log: Logger;
  registry: Registry;
  clock?: Clock;
  /** [0, 1), for the probe's random waits (RFC 5227 §2.1.1). */
  random?: () => number;
  /** Retry interval after a fault (parent missing, EPERM, state write) in ms. Default 30 s. */
  faultRetryMs?: number;
  /**
   * RFC 5227 §2.4 when another host insists on the held VIP: true (b), give
   * it up and allocate another; false (c), keep defending it at most once
   * per DEFEND_INTERVAL. Default: (b), or (c) when `probe` is false (VRRP:
   * the election, not ARP, decides which node holds the VIP; a peer that
   * still announces it after a split brain must not make the winner drop
   * it, leaving it with nobody).
   */
  giveUpOnConflict?: boolean;
  /**
   * RFC 5227 probe before claiming (default true). Off under VRRP: the
   * election already decided which node holds the VIP, and probing would
   * meet the previous Master's stale ARP entries and delay a takeover by
   * seconds (pool VIPs move without a probe, with an immediate gratuitous
   * ARP burst). The ARP defence while held stays on.
   */
  probe?: boolean;
  /**
   * The interfaces' shared ARP and NDP sockets (one of each per interface for
   * every pool source: the daemon passes one instance to all). Default: a set
   * of this source's own.
   */
  sockets?: NeighbourSockets;
  /**
   * Where the VIP's removal goes: with the other removals of the same turn
   * of the event loop, in one netlink batch (a stop of every service at
   * once). The daemon passes one for every pool source, run in the
   * manager's queue. Default: this source's own, in the manager's queue.
   */
  removals?: AddressRemovals;
}

/** A parent interface as a pool source reads it: the link, its host addresses (of the source's prefix), its link-local address (IPv6). */
interface ParentRead {
  readonly link: LinkInfo;
  readonly onParent: ReadonlySet<string>;
  readonly linkLocal: bigint | undefined;
}

/** How often a ready Backup re-reads its parent (addresses and reservations can change while it waits). */
const STANDBY_REFRESH_MS = 10_000;

export class PoolSource extends EventEmitter implements AddressSource {
  private opts: PoolSourceOptions;
  private readonly key: string;
  private readonly manager: PoolManager;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly netMetrics: NetMetrics;
  private readonly cfg: PoolMachineConfig;
  private readonly sockets: NeighbourSockets;
  private readonly removalBatch: AddressRemovals;

  private m: PoolState = initialPoolState();
  /** Bumped by stop(): an async result of an earlier generation is dropped (and undoes what it did). */
  private gen = 0;
  private vip: Vip | undefined;
  private parent: LinkInfo | undefined;
  private socket: PacketSocket | NdpSocket | undefined;
  /** The address the port is for (another takes another port). */
  private socketAddress: string | undefined;
  private owner: VipOwner | NdpVipOwner | undefined;
  /** The VIP's family, its prefix on the parent, and (IPv6) the parent's link-local address, the source of advertisements. */
  private readonly family: Family;
  private readonly prefix: number;
  private linkLocal: bigint | undefined;
  private timer: TimerHandle | undefined;
  private readonly onChanged = (): void => { this.clearWait(); this.feedLater(this.gen, { type: 'changed' }); };
  /** Address removals under way, for stop() to await. */
  private removals: Promise<void>[] = [];
  private releaseError: unknown;
  /** A ready Backup's parent, read while standing by; used by the next allocation once. */
  private ready: ParentRead | undefined;
  private standbyTimer: TimerHandle | undefined;

  constructor(opts: PoolSourceOptions) {
    super();
    this.opts = opts;
    this.key = opts.service.key;
    this.manager = opts.manager;
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
    this.log = lazyChild(opts.log, { module: 'ipam.pool-source', service: this.key });
    this.netMetrics = netMetrics(opts.registry);
    this.sockets = opts.sockets ?? new NeighbourSockets({ clock: this.clock });
    this.removalBatch = opts.removals ?? new AddressRemovals({ netlink: opts.netlink, run: (fn) => opts.manager.serialize(fn) });
    this.cfg = { probe: opts.probe !== false, faultRetryMs: opts.faultRetryMs ?? 30_000 };
    this.family = opts.service.family ?? 'IPv4';
    this.prefix = poolVipPrefix(this.family);
  }

  /** A reload's arp: timings, used from the next probe or announcement on; a held VIP stays. */
  reconfigure(settings: { arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>> }): void {
    this.opts = { ...this.opts, arp: settings.arp };
    this.owner?.retime(ownerTimings(settings.arp));
  }

  start(): void {
    this.clearStandby();
    this.feed({ type: 'start' });
  }

  /**
   * A ready VRRP Backup: withdraw the VIP like
   * stop({ release: false }), then keep ready what a takeover needs - the
   * parent link and its addresses read, the ARP port open - so that
   * taking over is the address and a gratuitous ARP, with no rtnetlink dump
   * and no socket set-up between the election and the address. Re-read
   * every STANDBY_REFRESH_MS while standing by; a takeover uses the copy
   * once and a fault re-reads, so a stale copy costs one retry, not a VIP.
   */
  async standby(): Promise<void> {
    await this.stop({ release: false });
    await this.prepare(this.gen);
  }

  private async prepare(gen: number): Promise<void> {
    this.clearStandby();
    try {
      const { p } = await this.readParentQueued(() => undefined);
      if (gen !== this.gen || this.m.phase !== 'stopped') return;
      // The address a takeover will most likely claim: its own claim, else
      // the configured one. Anything else opens its socket when it probes.
      const likely = this.safeClaim()?.address ?? this.opts.service.loadBalancerIP;
      if (likely !== undefined) this.ensureSocket(p.link.index, likely);
      this.ready = p;
    } catch (err) {
      this.ready = undefined;
      this.log.debug({ op: 'standby', err: errorMessage(err) }, 'could not ready the takeover; a takeover reads the parent itself');
    }
    if (gen !== this.gen || this.m.phase !== 'stopped') return;
    this.standbyTimer = this.clock.setTimeout(() => { this.standbyTimer = undefined; void this.prepare(gen); }, STANDBY_REFRESH_MS);
    this.standbyTimer.unref?.();
  }

  private clearStandby(): void {
    if (this.standbyTimer !== undefined) this.clock.clearTimeout(this.standbyTimer);
    this.standbyTimer = undefined;
  }

  /**
   * Withdraw the VIP (address off the parent) and stop. The claim is kept
   * unless `release`. Await it before start() again. Rejects only when the
   * claim could not be deleted (LB_ERR_STATE_WRITE); the VIP is gone anyway.
   */
  async stop(opts: { release: boolean; keep?: boolean }): Promise<void> {
    if (opts.keep && !opts.release) return this.stopKeeping();
    this.gen++;
    this.clearStandby();
    this.ready = undefined;
    this.clearWait();
    this.releaseError = undefined;
    const wasRunning = this.m.phase !== 'stopped';
    this.feed({ type: 'stop', release: opts.release });
    const removals = this.removals;
    this.removals = [];
    await Promise.all(removals);
    this.closeSocket();
    if (opts.release && wasRunning) this.log.info({ op: 'release' }, 'service removed: pool claim released');
    this.emit('status');
    // The VIP is withdrawn either way; a claim that could not be deleted is
    // the caller's to report (LB_ERR_STATE_WRITE), not to be hidden.
    const err = this.releaseError;
    this.releaseError = undefined;
    if (err !== undefined) throw err instanceof Error ? err : new Error(String(err));
  }

  /**
   * A planned restart: the address stays on the parent and the claim on
   * disk; the next process adopts both (crash-only start, no probe). Only
   * this process's socket, timers and defence go.
   */
  private async stopKeeping(): Promise<void> {
    this.gen++;
    this.clearStandby();
    this.ready = undefined;
    this.clearWait();
    const kept = this.vip?.address;
    this.owner?.close();
    this.owner = undefined;
    this.closeSocket();
    this.setVip(undefined);
    this.manager.release(this.key, { deleteClaim: false });
    this.m = initialPoolState();
    this.log.info({ op: 'stop', kept }, kept ? `stopped; ${kept} stays on ${this.opts.parentIfname} for the next process` : 'stopped');
    this.emit('status');
  }

  status(): SourceStatus {
    const m = this.m;
    const details: Record<string, unknown> = {
      ipam: 'pool',
      pool: m.pool,
      via: m.via,
      adopted: m.adopted,
      conflicts: m.conflicts,
      defences: m.defences,
    };
    if (m.lastConflict) {
      const { at, ...rest } = m.lastConflict;
      details.lastConflict = { ...rest, at: isoTime(at + this.clock.wallNow() - this.clock.now()) };
    }
    const claim = this.safeClaim();
    if (claim) details.claim = { ...claim };
    return {
      state: m.source,
      reason: m.reason,
      vip: this.vip,
      ifname: this.opts.parentIfname,
      mac: this.parent?.mac,
      details,
    };
  }

  /**
   * The address of the held VIP left the parent (someone else removed it):
   * add it again, with the ownership mark, and announce it again. Pool VIPs
   * live on the parent, which the agent does not own: 'link' and
   * 'link-down' are not this source's to repair.
   */
  async repair(damage: SourceDamage): Promise<string | undefined> {
    const vip = this.vip;
    if (damage !== 'address' || this.m.phase !== 'bound' || !vip) return undefined;
    const gen = this.gen;
    // Off the parent, the kernel left the VIP's solicited-node group: the owner joins it until the address is back.
    const ndpOwner = this.owner instanceof NdpVipOwner ? this.owner : undefined;
    ndpOwner?.setOnInterface(false);
    try {
      await this.manager.serialize(() => this.opts.netlink.addAddress(vip.ifindex, vip.address, this.prefix, { proto: OWNED_ADDRESS_PROTO }));
      addressesChanged();
    } catch (err) {
      if (!(isLbError(err) && err.details?.errno === 'EEXIST')) {
        this.log.warn({ op: 'repair', address: vip.address, err: errorMessage(err) }, `could not add ${vip.address} to ${vip.ifname} again`);
        return undefined;
      }
    }
    // stop() ran meanwhile: the address goes again with it.
    if (gen !== this.gen || this.vip !== vip) { await this.removeQuietly(vip.ifindex, vip.address); return undefined; }
    ndpOwner?.setOnInterface(true);
    this.owner?.reannounce();
    return `added ${vip.address}/${this.prefix} to ${vip.ifname} again and announced it`;
  }

  /** A full burst of gratuitous ARPs again (VRRP split brain), through the VIP's owner. */
  reannounce(): void {
    if (this.m.phase === 'bound') this.owner?.reannounce();
  }

  // -------------------------------------------------------------------------
  // The machine and its actions

  private feed(ev: PoolEvent): void {
    const before = this.m;
    const step = poolStep(before, ev, this.clock.now(), this.cfg);
    this.m = step.state;
    const gen = this.gen;
    for (const a of step.actions) this.perform(a, gen);
    if (step.state !== before && ev.type !== 'stop') this.emit('status');
  }

  /** Results come back as events on a later tick, never inside the step that asked for them. */
  private feedLater(gen: number, ev: PoolEvent): void {
    void Promise.resolve().then(() => { if (gen === this.gen) this.feed(ev); });
  }

  private perform(a: PoolAction, gen: number): void {
    switch (a.type) {
      case 'allocate': return void this.allocate(gen);
      case 'wait': return this.wait(gen, a.until, a.onChange);
      case 'probe': return void this.probe(gen, a.address);
      case 'commit': {
        // Written with the other claims of this turn (a start commits many at once).
        const fault = (err: unknown): void => this.feedLater(gen, { type: 'fault', what: `persisting the claim on ${a.address}`, error: errorMessage(err) });
        try {
          this.manager.commitSoon(this.key, a.address).then(() => this.feedLater(gen, { type: 'committed' }), fault);
        } catch (err) {
          fault(err);
        }
        return;
      }
      case 'add-address': return void this.addAddress(gen, a.address);
      case 'hold': return this.hold(gen, a.address);
      case 'unhold':
        this.owner?.close();
        this.owner = undefined;
        return;
      case 'remove-address': {
        const link = this.parent;
        if (link) this.removals.push(this.removeQuietly(link.index, a.address));
        return;
      }
      case 'unreserve': return this.manager.release(this.key, { deleteClaim: false });
      case 'release':
        try {
          this.manager.release(this.key, { deleteClaim: a.deleteClaim });
        } catch (err) {
          this.releaseError = err;
          this.log.error({ op: 'release', err: errorMessage(err) }, 'could not delete the pool claim');
        }
        return;
      case 'mark-conflict':
        this.manager.markConflict(this.key, a.address, a.mac, { counted: a.counted });
        return;
      case 'note-conflict': return this.manager.noteConflict(a.address);
      case 'reset-socket': return this.closeSocket();
      case 'up': {
        const link = this.parent!;
        const vip: Vip = { address: a.address, prefix: this.prefix, ifname: link.name, ifindex: link.index, mac: link.mac };
        this.setVip(vip);
        this.emit('vip', vip);
        return;
      }
      case 'down':
        this.setVip(undefined);
        this.emit('lost', a.reason, a.cause);
        return;
      case 'log':
        this.log[a.log.level]({ op: a.log.op, ...a.log.fields }, a.log.msg);
        return;
    }
  }

  private async allocate(gen: number): Promise<void> {
    const delay = this.manager.attemptDelay();
    if (delay > 0) { this.feedLater(gen, { type: 'rate-limited', delayMs: delay }); return; }
    // A ready Backup read the parent already: reserve now, in this turn
    // (reserve() is synchronous, so no other service can slip in).
    const ready = this.ready;
    this.ready = undefined;
    if (ready) {
      this.log.debug({ op: 'takeover', ready: true, parent: ready.link.name }, 'the parent was read while standing by: straight to the address');
      this.parent = ready.link;
      const result = this.reserve();
      this.feedLater(gen, { type: 'allocation', result, onParent: result.ok && ready.onParent.has(result.address) });
      return;
    }
    try {
      // Read the parent and reserve in one turn of the manager's queue.
      const r = await this.readParentQueued(() => (gen === this.gen ? this.reserve() : undefined));
      if (r.result === undefined || gen !== this.gen) return; // stop() released any hold
      this.parent = r.p.link;
      this.feedLater(gen, { type: 'allocation', result: r.result, onParent: r.result.ok && r.p.onParent.has(r.result.address) });
    } catch (err) {
      this.feedLater(gen, { type: 'fault', what: 'reading the parent interface or the pool claims', error: errorMessage(err) });
    }
  }

  private reserve(): ReturnType<PoolManager['reserve']> {
    return this.manager.reserve({ service: this.key, namespace: this.opts.service.namespace, family: this.family, loadBalancerIP: this.opts.service.loadBalancerIP, network: this.opts.service.network });
  }

  private wait(gen: number, until: number | undefined, onChange: boolean): void {
    this.clearWait();
    if (until !== undefined) {
      this.timer = this.clock.setTimeout(() => {
        this.timer = undefined;
        this.clearWait();
        if (gen === this.gen) this.feed({ type: 'timer' });
      }, Math.max(0, until - this.clock.now()));
    }
    if (onChange) this.manager.on('changed', this.onChanged);
  }

  private clearWait(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.manager.off('changed', this.onChanged);
  }

  private async probe(gen: number, address: string): Promise<void> {
    if (this.family === 'IPv6') return this.probe6(gen, address);
    try {
      const link = this.parent!;
      const res = await probeAddress({
        socket: this.ensureSocket(link.index, address), mac: link.mac, ip: address, timings: this.opts.arp,
        clock: this.clock, random: this.random, log: this.opts.log, metrics: this.netMetrics,
      });
      this.feedLater(gen, res.conflict ? { type: 'probe-conflict', mac: res.conflictingMac } : { type: 'probe-free' });
    } catch (err) {
      this.feedLater(gen, { type: 'fault', what: `probing ${address}`, error: errorMessage(err) });
    }
  }

  /** RFC 4862 §5.4 duplicate address detection of an IPv6 pool address; a duplicate is a conflict like an ARP one. */
  private async probe6(gen: number, address: string): Promise<void> {
    try {
      const link = this.parent!;
      const res = await dadProbe({
        socket: this.ensureNdpSocket(link.index, address), mac: link.mac, ip: address, source: this.linkLocal,
        config: { ...ndpTimings(this.opts.arp, true), dadTransmits: DUP_ADDR_DETECT_TRANSMITS, giveUp: true, answerSolicitations: false },
        clock: this.clock, log: this.opts.log, metrics: this.netMetrics,
      });
      if (res.duplicate) this.log.info({ op: 'dad', address, mac: res.mac, reason: res.reason }, `${address} is taken on the LAN (${res.reason} by ${res.mac ?? 'another node'}); skipping it`);
      this.feedLater(gen, res.duplicate ? { type: 'probe-conflict', mac: res.mac } : { type: 'probe-free' });
    } catch (err) {
      this.feedLater(gen, { type: 'fault', what: `probing ${address}`, error: errorMessage(err) });
    }
  }

  /** The NDP port of an IPv6 address (ensureSocket). */
  private ensureNdpSocket(ifindex: number, address: string): NdpSocket {
    const sock = this.ensureSocket(ifindex, address);
    if (!('joinGroup' in sock)) throw new RangeError(`${address}: an IPv6 owner needs an NDP socket`);
    return sock;
  }

  private async addAddress(gen: number, address: string): Promise<void> {
    const link = this.parent!;
    try {
      // NetlinkClient.addAddress replaces, so an address left by a killed
      // run is adopted as is; EEXIST from another implementation means the same.
      await this.manager.serialize(() => this.opts.netlink.addAddress(link.index, address, this.prefix, { proto: OWNED_ADDRESS_PROTO }));
      // A DHCP reply from now on must see it (dhcp/guard.ts 'yiaddr-local').
      addressesChanged();
    } catch (err) {
      if (!(isLbError(err) && err.details?.errno === 'EEXIST')) {
        this.feedLater(gen, { type: 'fault', what: `adding ${address}/${this.prefix} to ${this.opts.parentIfname}`, error: errorMessage(err) });
        return;
      }
    }
    // stop() ran while the address was being added: take it off again.
    if (gen !== this.gen) { await this.removeQuietly(link.index, address); return; }
    this.feedLater(gen, { type: 'added' });
  }

  /** RFC 5227 §2.3 burst, §2.4 defence and the periodic refresh, by one VipOwner on the parent. */
  private hold(gen: number, address: string): void {
    const link = this.parent!;
    this.owner?.close();
    let owner: VipOwner | NdpVipOwner;
    const giveUp = this.opts.giveUpOnConflict ?? this.opts.probe !== false;
    try {
      owner = this.family === 'IPv6'
        ? new NdpVipOwner({
          // DAD ran already (probe6), or an election decided: straight to the burst.
          socket: this.ensureNdpSocket(link.index, address), mac: link.mac, ip: address, source: this.linkLocal,
          config: { ...ndpTimings(this.opts.arp, false), giveUp, answerSolicitations: false },
          // On the parent already ('added'): the kernel's join of its solicited-node group stands for the owner's.
          onInterface: true,
          clock: this.clock, log: this.opts.log, metrics: this.netMetrics,
        })
        : new VipOwner({
          socket: this.ensureSocket(link.index, address), mac: link.mac, ip: address,
          ...ownerTimings(this.opts.arp),
          giveUp,
          wheel: this.sockets.refresh,
          clock: this.clock, log: this.opts.log, metrics: this.netMetrics,
        });
      owner.start();
    } catch (err) {
      this.feedLater(gen, { type: 'fault', what: `announcing ${address}`, error: errorMessage(err) });
      return;
    }
    this.owner = owner;
    owner.on('conflict', (c: Pick<VipConflict, 'mac' | 'defended'>) => { if (this.owner === owner) this.feed({ type: 'conflict', mac: c.mac, defended: c.defended }); });
    owner.on('lost', (c: Pick<VipConflict, 'mac'>) => { if (this.owner === owner) this.feed({ type: 'lost', mac: c.mac }); });
    this.feedLater(gen, { type: 'held' });
  }

  // -------------------------------------------------------------------------

  private safeClaim(): ReturnType<PoolManager['claimOf']> {
    try { return this.manager.claimOf(this.key); } catch { return undefined; }
  }

  /** lbagent_service_vip_info has one writer, the daemon's collect over every service's VIP; this only records it. */
  private setVip(vip: Vip | undefined): void {
    this.vip = vip;
  }

  private closeSocket(): void {
    this.socket?.close();
    this.socket = undefined;
    this.socketAddress = undefined;
  }

  /**
   * Parent link and the reserved addresses derived from its addresses, read
   * in one turn of the manager's queue, and `then` in the same turn: a
   * reserve() there sees the parent's addresses and no other service's
   * reservation can slip in between. The pool sources of one parent, family
   * and network that ask together (a start) share one read
   * (ipam/parent-reads.ts): one link request and one address dump for all.
   */
  private async readParentQueued<T>(then: () => T): Promise<{ p: ParentRead; result: T }> {
    const { parentIfname, service } = this.opts;
    const key = `${parentIfname}|${this.family}|${service.network ?? ''}`;
    return this.manager.readParent<ParentRead, T>(key, async () => {
      const link = await this.opts.netlink.getLink(parentIfname);
      const addrs = await this.opts.netlink.listAddresses(link.index, this.family);
      return this.noteParentAddresses(link, addrs);
    }, (p) => {
      if (this.family === 'IPv6') this.linkLocal = p.linkLocal;
      return then();
    });
  }

  private noteParentAddresses(link: LinkInfo, addrs: readonly { address: string; prefix: number }[]): ParentRead {
    const claimed = new Set<string>();
    for (const c of this.manager.allClaims().values()) {
      const k = addressKey(c.address);
      if (k !== undefined) claimed.add(k);
    }
    this.manager.setReserved(reservedFromInterface(addrs, claimed), this.opts.service.network);
    return {
      link,
      onParent: new Set(addrs.filter((a) => a.prefix === this.prefix).map((a) => a.address)),
      linkLocal: this.family === 'IPv6' ? linkLocalOf(addrs) : undefined,
    };
  }

  /**
   * This source's port for `address` on the parent's shared ARP (or NDP)
   * socket (net/neighbour/neighbour-sockets.ts): it hears only frames whose
   * sender or target is that address (RFC 5227 §2.1.1, §2.4: all a probe or
   * a defence acts on), so a pool service, and a ready Backup holding its
   * port while it stands by, does not wake for every ARP frame on the LAN.
   * Another address (a conflict moved the claim) takes another port. An
   * NDP owner joins the address's solicited-node group through its port,
   * and the group goes with it.
   */
  private ensureSocket(ifindex: number, address: string): PacketSocket | NdpSocket {
    if (this.socket && this.socket.ifindex === ifindex && this.socketAddress === address) return this.socket;
    this.closeSocket();
    const o = { ifindex, metrics: this.netMetrics, log: this.opts.log };
    let sock: PacketSocket | NdpSocket;
    if (this.family === 'IPv6') {
      sock = this.sockets.ndp({ ...o, address: ipv6Value(address) });
    } else {
      const ip = parseIPv4(address);
      if (ip === undefined) throw new RangeError(`not an IPv4 address: ${address}`);
      sock = this.sockets.arp({ ...o, address: ip });
    }
    const what = this.family === 'IPv6' ? 'ndp-socket' : 'arp-socket';
    sock.on('error', (err: LbError) => this.log.warn({ op: what, err: err.message }, `${this.family === 'IPv6' ? 'NDP' : 'ARP'} socket error`));
    this.socket = sock;
    this.socketAddress = address;
    return sock;
  }

  private async removeQuietly(ifindex: number, address: string): Promise<void> {
    try {
      await this.removalBatch.remove(ifindex, address, this.prefix);
    } catch (err) {
      // The address keeps its ownership mark: the next start's adoption removes it.
      this.log.warn({ op: 'remove-address', address, err: errorMessage(err) }, `could not remove ${address} from ${this.opts.parentIfname}`);
    }
  }
}

/** fe80::/10 (RFC 4291 §2.5.6). */
const LINK_LOCAL_PREFIX = 0xfe80n >> 6n;

/** The first link-local address among a parent's IPv6 addresses, wherever it is listed; undefined when it has none. */
export function linkLocalOf(addrs: readonly { readonly address: string }[]): bigint | undefined {
  for (const a of addrs) {
    const v = parseAddress(a.address);
    if (v?.family === 'IPv6' && v.value >> 118n === LINK_LOCAL_PREFIX) return v.value;
  }
  return undefined;
}
