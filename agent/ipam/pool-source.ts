// ipam/ driver: the AddressSource of one pool service. It asks the shared
// PoolManager for an address, checks the LAN with an RFC 5227 probe, puts
// the address on the parent interface, announces it, and defends it while
// held. Packets and netlink calls go through agent/net (probeAddress,
// announce, ArpDefender, NetlinkClient); this file only sequences them and
// keeps the service's status.
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
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import type { ArpTimings, ServiceSpec } from '../config/types';
import type { Logger } from '../log';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { LbError, errorMessage, isLbError } from '../errors';
import { parseIPv4 } from '../ipv4';
import type { AddressSource, SourceState, SourceStatus, Vip } from '../source';
import { announce, probeAddress, ArpDefender, type ArpConflict } from '../net/arp-probe';
import { netMetrics, type NetMetrics } from '../net/metrics';
import { OWNED_ADDRESS_PROTO } from '../net/ownership';
import { bpfArp, ETH_P_ARP, openPacketSocket, type PacketSocket } from '../net/packet';
import type { NetlinkClient, LinkInfo } from '../net/netlink';
import { reservedFromInterface, type AllocationResult } from './allocator';
import type { PoolManager, PoolMetrics } from './manager';

/** The prefix of every pool VIP on the parent (see the header comment). */
export const POOL_VIP_PREFIX = 32;

export type PoolNetlink = Pick<NetlinkClient, 'getLink' | 'listAddresses' | 'addAddress' | 'removeAddress'>;

export interface PoolSourceOptions {
  /** The service (key, name, namespace, loadBalancerIP are used). */
  service: Pick<ServiceSpec, 'key' | 'name' | 'namespace' | 'loadBalancerIP'>;
  /** The parent NIC the VIP goes on. */
  parentIfname: string;
  /** Shared by every pool source of the agent: owns claims, pools, conflicts. */
  manager: PoolManager;
  arp: ArpTimings;
  netlink: PoolNetlink;
  log: Logger;
  registry: Registry;
  clock?: Clock;
  /** [0, 1), for the probe's random waits (RFC 5227 §2.1.1). */
  random?: () => number;
  /** Retry interval after a fault (parent missing, EPERM, state write) in ms. Default 30 s. */
  faultRetryMs?: number;
  /**
   * RFC 5227 probe before claiming (default true). Off under VRRP: the
   * election already decided which node holds the VIP, and probing would
   * meet the previous Master's stale ARP entries and delay a takeover by
   * seconds (issue 11: pool VIPs move without a probe, with an immediate
   * gratuitous ARP burst). The ARP defence while held stays on.
   */
  probe?: boolean;
}

interface LastConflict { address: string; mac: string; at: string; defended: boolean; phase: 'probe' | 'defend' }

/** Why a pending/failed allocation waits, as a state. */
function stateFor(r: Extract<AllocationResult, { ok: false }>): SourceState {
  // A pool that is full or an address held by someone else can free up:
  // wait. No pool / an address outside the pool needs a config change.
  return r.reason === 'exhausted' || r.reason === 'taken' ? 'pending' : 'failed';
}

export class PoolSource extends EventEmitter implements AddressSource {
  private opts: PoolSourceOptions;
  private readonly key: string;
  private readonly manager: PoolManager;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly netMetrics: NetMetrics;
  private readonly poolMetrics: PoolMetrics;
  private readonly faultRetryMs: number;

  /** Incremented by start/stop: an async step whose generation is stale stops and undoes itself. */
  private gen = 0;
  private running = false;
  private state: SourceState = 'idle';
  private reason: string | undefined;
  private vip: Vip | undefined;
  private parent: LinkInfo | undefined;
  private socket: PacketSocket | undefined;
  private defender: ArpDefender | undefined;
  /** The address we put on (or adopted on) the parent, to take it off again. */
  private onParent: string | undefined;
  private wake: (() => void) | undefined;
  private pool: string | undefined;
  private via: string | undefined;
  private adopted = false;
  private conflictsSeen = 0;
  private defences = 0;
  private lastConflict: LastConflict | undefined;

  constructor(opts: PoolSourceOptions) {
    super();
    this.opts = opts;
    this.key = opts.service.key;
    this.manager = opts.manager;
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
    this.log = opts.log.child({ module: 'ipam.pool-source', service: this.key });
    this.netMetrics = netMetrics(opts.registry);
    this.poolMetrics = opts.manager.metrics;
    this.faultRetryMs = opts.faultRetryMs ?? 30_000;
  }

  /** A reload's arp: timings, used from the next probe or announcement on; a held VIP stays. */
  reconfigure(settings: { arp: ArpTimings }): void {
    this.opts = { ...this.opts, arp: settings.arp };
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    const gen = ++this.gen;
    this.run(gen).catch((err) => {
      // run() handles its own faults; anything here is a bug, reported not thrown.
      this.log.error({ op: 'run', err: errorMessage(err) }, 'pool source stopped on an unexpected error');
      if (gen === this.gen) this.setState('failed', `internal error: ${errorMessage(err)}`);
    });
  }

  /**
   * Withdraw the VIP (address off the parent) and stop. The claim is kept
   * unless `release`. Await it before start() again. Rejects only when the
   * claim could not be deleted (LB_ERR_STATE_WRITE); the VIP is gone anyway.
   */
  async stop(opts: { release: boolean; keep?: boolean }): Promise<void> {
    const wasBound = this.vip;
    this.running = false;
    this.gen++;
    this.wake?.();
    this.closeDefender();
    if (opts.keep && !opts.release) {
      // A planned restart: the address stays on the parent and the claim on
      // disk; the next process adopts both (crash-only start).
      const kept = this.onParent;
      this.onParent = undefined;
      this.setVip(undefined);
      this.closeSocket();
      this.manager.release(this.key, { deleteClaim: false });
      this.state = 'idle';
      this.reason = undefined;
      this.log.info({ op: 'stop', kept }, kept ? `stopped; ${kept} stays on ${this.opts.parentIfname} for the next process` : 'stopped');
      this.emit('status');
      return;
    }
    const address = this.onParent;
    this.onParent = undefined;
    this.setVip(undefined);
    if (address !== undefined && this.parent) {
      try {
        const index = this.parent.index;
        await this.manager.serialize(() => this.opts.netlink.removeAddress(index, address, POOL_VIP_PREFIX));
      } catch (err) {
        this.log.warn({ op: 'stop', address, err: errorMessage(err) }, `could not remove ${address} from ${this.opts.parentIfname}`);
      }
    }
    this.closeSocket();
    let releaseError: unknown;
    try {
      this.manager.release(this.key, { deleteClaim: opts.release });
      if (opts.release) this.log.info({ op: 'release', address }, 'service removed: pool claim released');
    } catch (err) {
      releaseError = err;
      this.log.error({ op: 'release', err: errorMessage(err) }, 'could not delete the pool claim');
    }
    this.state = 'idle';
    this.reason = undefined;
    this.adopted = false;
    if (wasBound) this.emit('lost', opts.release ? 'released' : 'stopped');
    this.emit('status');
    // The VIP is withdrawn either way; a claim that could not be deleted is
    // the caller's to report (LB_ERR_STATE_WRITE), not to be hidden.
    if (releaseError !== undefined) throw releaseError;
  }

  status(): SourceStatus {
    const details: Record<string, unknown> = {
      ipam: 'pool',
      pool: this.pool,
      via: this.via,
      adopted: this.adopted,
      conflicts: this.conflictsSeen,
      defences: this.defences,
    };
    if (this.lastConflict) details.lastConflict = { ...this.lastConflict };
    const claim = this.safeClaim();
    if (claim) details.claim = { ...claim };
    return {
      state: this.state,
      reason: this.reason,
      vip: this.vip,
      ifname: this.opts.parentIfname,
      mac: this.parent?.mac,
      details,
    };
  }

  // -------------------------------------------------------------------------

  private safeClaim(): ReturnType<PoolManager['claimOf']> {
    try { return this.manager.claimOf(this.key); } catch { return undefined; }
  }

  private setState(state: SourceState, reason?: string): void {
    if (this.state === state && this.reason === reason) return;
    this.state = state;
    this.reason = reason;
    this.emit('status');
  }

  private setVip(vip: Vip | undefined): void {
    const labels = (v: Vip) => ({ service: this.opts.service.name, namespace: this.opts.service.namespace, vip: v.address, ipam: 'pool' });
    if (this.vip) this.poolMetrics.vipInfo.remove(labels(this.vip));
    this.vip = vip;
    if (vip) this.poolMetrics.vipInfo.set(labels(vip), 1);
  }

  /** Wait for a manager change, a timer, or stop(). */
  private waitForChange(ms: number | undefined): Promise<void> {
    return new Promise<void>((resolve) => {
      let timer: TimerHandle | undefined;
      const done = (): void => {
        if (timer !== undefined) this.clock.clearTimeout(timer);
        this.manager.off('changed', done);
        if (this.wake === done) this.wake = undefined;
        resolve();
      };
      if (ms !== undefined) timer = this.clock.setTimeout(done, Math.max(0, ms));
      this.manager.on('changed', done);
      this.wake = done;
    });
  }

  private sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = this.clock.setTimeout(() => { if (this.wake === done) this.wake = undefined; resolve(); }, ms);
      const done = (): void => { this.clock.clearTimeout(timer); this.wake = undefined; resolve(); };
      this.wake = done;
    });
  }

  private closeDefender(): void {
    this.defender?.close();
    this.defender = undefined;
  }

  private closeSocket(): void {
    this.socket?.close();
    this.socket = undefined;
  }

  /** Parent link and the reserved addresses derived from its addresses. */
  private async readParent(): Promise<{ link: LinkInfo; onParent: Set<string> }> {
    const link = await this.opts.netlink.getLink(this.opts.parentIfname);
    const addrs = await this.opts.netlink.listAddresses(link.index);
    return this.noteParentAddresses(link, addrs);
  }

  private noteParentAddresses(link: LinkInfo, addrs: readonly { address: string; prefix: number }[]): { link: LinkInfo; onParent: Set<string> } {
    const claimed = new Set<number>();
    for (const c of this.manager.allClaims().values()) {
      const n = parseIPv4(c.address);
      if (n !== undefined) claimed.add(n);
    }
    this.manager.setReserved(reservedFromInterface(addrs, claimed));
    return { link, onParent: new Set(addrs.filter((a) => a.prefix === POOL_VIP_PREFIX).map((a) => a.address)) };
  }

  private ensureSocket(ifindex: number): PacketSocket {
    if (this.socket && this.socket.ifindex === ifindex) return this.socket;
    this.closeSocket();
    const sock = openPacketSocket({ ifindex, protocol: ETH_P_ARP, filter: bpfArp(), metrics: this.netMetrics, log: this.opts.log });
    sock.on('error', (err: LbError) => this.log.warn({ op: 'arp-socket', err: err.message }, 'ARP socket error'));
    this.socket = sock;
    return sock;
  }

  /** The acquisition loop: runs until bound (then returns) or until stop(). */
  private async run(gen: number): Promise<void> {
    const live = (): boolean => gen === this.gen;
    this.setState('acquiring', undefined);
    for (let attempt = 0; live(); attempt++) {
      const delay = this.manager.attemptDelay();
      if (delay > 0) {
        this.setState('pending', `rate-limited after repeated address conflicts (RFC 5227 §2.1.1); next attempt in ${Math.ceil(delay / 1000)} s`);
        await this.sleep(delay);
        continue;
      }

      let parent: { link: LinkInfo; onParent: Set<string> };
      let result: AllocationResult;
      try {
        // Read the parent and reserve in one turn of the manager's queue.
        [parent, result] = await this.manager.serialize(async () => {
          const p = await this.readParent();
          if (!live()) return [p, { ok: false, reason: 'taken', message: 'stopped' } as AllocationResult] as const;
          return [p, this.manager.reserve({ service: this.key, namespace: this.opts.service.namespace, loadBalancerIP: this.opts.service.loadBalancerIP })] as const;
        });
        if (!live()) return; // stop() released any hold
        this.parent = parent.link;
      } catch (err) {
        await this.fault(gen, err, 'reading the parent interface or the pool claims');
        continue;
      }

      if (!result.ok) {
        const state = stateFor(result);
        if (this.state !== state || this.reason !== result.message) {
          this.log[state === 'failed' ? 'error' : 'warn']({ op: 'allocate', reason: result.reason, pool: result.pool }, result.message);
        }
        this.pool = result.pool;
        this.setState(state, result.message);
        const wait = result.retryAt !== undefined ? result.retryAt - this.clock.now() : state === 'failed' ? this.faultRetryMs : undefined;
        await this.waitForChange(wait);
        continue;
      }

      const address = result.address;
      this.pool = result.pool;
      this.via = result.via;
      const adopted = parent.onParent.has(address);
      // An address adopted from a killed run is ours to take off on stop(), even mid-probe.
      if (adopted) this.onParent = address;
      if (this.opts.probe !== false) {
        this.setState('acquiring', `probing ${address} (${result.via}, pool ${result.pool})`);
        this.log.info({ op: 'probe', address, pool: result.pool, via: result.via, adopted }, `probing ${address} before claiming it`);
      } else {
        this.log.info({ op: 'claim', address, pool: result.pool, via: result.via, adopted }, `claiming ${address} without a probe: VRRP decided this node holds it`);
      }

      // RFC 5227 §2.1: probe even an address we adopt from a previous run:
      // another host may have taken it while we were down.
      let probe: { conflict: boolean; conflictingMac?: string } = { conflict: false };
      try {
        const socket = this.ensureSocket(parent.link.index);
        if (this.opts.probe !== false) probe = await probeAddress({
          socket, mac: parent.link.mac, ip: address, timings: this.opts.arp,
          clock: this.clock, random: this.random, log: this.opts.log, metrics: this.netMetrics,
        });
      } catch (err) {
        if (!live()) return;
        this.manager.release(this.key, { deleteClaim: false });
        await this.fault(gen, err, `probing ${address}`);
        continue;
      }
      if (!live()) return;

      if (probe.conflict) {
        this.conflictsSeen++;
        this.lastConflict = { address, mac: probe.conflictingMac ?? '', at: new Date(this.clock.wallNow()).toISOString(), defended: false, phase: 'probe' };
        this.manager.markConflict(this.key, address, probe.conflictingMac);
        if (adopted) {
          this.onParent = undefined;
          await this.removeQuietly(parent.link.index, address);
        }
        if (!live()) return;
        this.setState('acquiring', `${address} is in use by ${probe.conflictingMac ?? 'another host'}; trying another address`);
        continue;
      }

      // Persist the claim before the address goes on the interface: after a
      // crash, every VIP /32 on the parent is then accounted for by a claim.
      try {
        this.manager.commit(this.key, address);
      } catch (err) {
        this.manager.release(this.key, { deleteClaim: false });
        await this.fault(gen, err, `persisting the claim on ${address}`);
        continue;
      }

      try {
        this.onParent = address;
        // NetlinkClient.addAddress replaces, so an address left by a killed
        // run is adopted as is; EEXIST from another implementation means the same.
        await this.manager.serialize(() => this.opts.netlink.addAddress(parent.link.index, address, POOL_VIP_PREFIX, { proto: OWNED_ADDRESS_PROTO }));
      } catch (err) {
        if (!(isLbError(err) && err.details?.errno === 'EEXIST')) {
          this.onParent = undefined;
          await this.fault(gen, err, `adding ${address}/${POOL_VIP_PREFIX} to ${this.opts.parentIfname}`);
          continue;
        }
      }
      if (!live()) {
        // stop() ran while the address was being added: take it off again.
        await this.removeQuietly(parent.link.index, address);
        return;
      }

      this.adopted = adopted;
      const defender = this.startDefender(gen, address, parent.link);
      const vip: Vip = { address, prefix: POOL_VIP_PREFIX, ifname: parent.link.name, ifindex: parent.link.index, mac: parent.link.mac };
      try {
        // RFC 5227 §2.3: the first announcement goes out before anyone is
        // told the VIP is up.
        await this.announceOnce(address, parent.link);
      } catch (err) {
        this.closeDefender();
        await this.removeQuietly(parent.link.index, address);
        this.onParent = undefined;
        await this.fault(gen, err, `announcing ${address}`);
        continue;
      }
      if (!live()) {
        defender.close();
        await this.removeQuietly(parent.link.index, address);
        return;
      }
      this.setVip(vip);
      this.setState('bound', undefined);
      this.log.info({ op: 'bound', address, pool: result.pool, via: result.via, adopted, attempts: attempt + 1 },
        `${this.key} holds ${address}/${POOL_VIP_PREFIX} on ${parent.link.name}${adopted ? ' (adopted from a previous run)' : ''}`);
      this.emit('vip', vip);
      // The rest of the RFC 5227 §2.3 burst, stopped as soon as the address is not ours.
      void this.announceRest(gen, address, parent.link);
      return;
    }
  }

  /** One gratuitous ARP now; rejects when it cannot be sent. */
  private async announceOnce(address: string, link: LinkInfo): Promise<void> {
    const socket = this.ensureSocket(link.index);
    await announce({ socket, mac: link.mac, ip: address, count: 1, intervalMs: 0, clock: this.clock, log: this.opts.log, metrics: this.netMetrics });
  }

  reannounce(): void {
    const vip = this.vip;
    const socket = this.socket;
    if (!vip || !socket) return;
    announce({ socket, mac: vip.mac, ip: vip.address, count: Math.max(1, this.opts.arp.announceNum), intervalMs: this.opts.arp.announceInterval * 1000, clock: this.clock, log: this.opts.log, metrics: this.netMetrics })
      .catch((err) => this.log.warn({ op: 'announce', address: vip.address, err: errorMessage(err) }, 'could not send a gratuitous ARP'));
  }

  /**
   * ANNOUNCE_NUM - 1 further announcements ANNOUNCE_INTERVAL apart, each
   * sent only while the address is still held by this generation: a
   * gratuitous ARP for an address we gave up would point the LAN at us.
   */
  private async announceRest(gen: number, address: string, link: LinkInfo): Promise<void> {
    const n = Math.max(0, Math.floor(this.opts.arp.announceNum) - 1);
    for (let i = 0; i < n; i++) {
      await new Promise<void>((resolve) => this.clock.setTimeout(resolve, this.opts.arp.announceInterval * 1000));
      if (gen !== this.gen || this.vip?.address !== address || !this.socket) return;
      try {
        await announce({ socket: this.socket, mac: link.mac, ip: address, count: 1, intervalMs: 0, clock: this.clock, log: this.opts.log, metrics: this.netMetrics });
      } catch (err) {
        this.log.warn({ op: 'announce', address, err: errorMessage(err) }, 'could not send a gratuitous ARP');
      }
    }
  }

  private startDefender(gen: number, address: string, link: LinkInfo): ArpDefender {
    this.closeDefender();
    const socket = this.ensureSocket(link.index);
    const defender = new ArpDefender({ socket, mac: link.mac, ips: [address], clock: this.clock, log: this.opts.log, metrics: this.netMetrics });
    defender.on('conflict', (c: ArpConflict) => { void this.onConflict(gen, c, link); });
    this.defender = defender;
    return defender;
  }

  /**
   * RFC 5227 §2.4 (b): the first conflicting ARP within DEFEND_INTERVAL is
   * answered with one announcement (ArpDefender sends it) and the address
   * kept; a second one within DEFEND_INTERVAL means another host insists:
   * we cease using the address, mark it in conflict, and allocate another.
   * Giving up rather than fighting keeps two hosts from flapping the LAN's
   * ARP caches between them; the conflict is logged, counted and shown.
   */
  private async onConflict(gen: number, c: ArpConflict, link: LinkInfo): Promise<void> {
    if (gen !== this.gen || this.vip?.address !== c.ip) return;
    this.conflictsSeen++;
    if (c.defended) this.defences++;
    this.lastConflict = { address: c.ip, mac: c.mac, at: new Date(this.clock.wallNow()).toISOString(), defended: c.defended, phase: 'defend' };
    this.manager.noteConflict(c.ip);
    if (!c.repeated) {
      this.log.warn({ op: 'defend', address: c.ip, conflictingMac: c.mac, defended: c.defended },
        `${c.mac} claims ${c.ip}; defended with one gratuitous ARP (RFC 5227 §2.4), keeping the address`);
      this.emit('status');
      return;
    }
    this.log.error({ op: 'give-up', address: c.ip, conflictingMac: c.mac },
      `${c.mac} claims ${c.ip} again within the defend interval; giving the address up and allocating another (RFC 5227 §2.4)`);
    this.closeDefender();
    this.setVip(undefined);
    this.onParent = undefined;
    this.manager.markConflict(this.key, c.ip, c.mac, { counted: true });
    this.setState('acquiring', `gave up ${c.ip}: ${c.mac} uses it too`);
    this.emit('lost', `address conflict: ${c.mac} uses ${c.ip}`);
    await this.removeQuietly(link.index, c.ip);
    if (gen !== this.gen) return;
    const next = ++this.gen;
    this.run(next).catch((err) => {
      this.log.error({ op: 'run', err: errorMessage(err) }, 'pool source stopped on an unexpected error');
      if (next === this.gen) this.setState('failed', `internal error: ${errorMessage(err)}`);
    });
  }

  private async removeQuietly(ifindex: number, address: string): Promise<void> {
    try {
      await this.manager.serialize(() => this.opts.netlink.removeAddress(ifindex, address, POOL_VIP_PREFIX));
    } catch (err) {
      this.log.warn({ op: 'remove-address', address, err: errorMessage(err) }, `could not remove ${address} from ${this.opts.parentIfname}`);
    }
  }

  /** A fault that may clear by itself (parent missing, state write failed): failed, retried later. */
  private async fault(gen: number, err: unknown, what: string): Promise<void> {
    if (gen !== this.gen) return;
    const message = `${what}: ${errorMessage(err)}`;
    if (this.state !== 'failed' || this.reason !== message) {
      this.log.error({ op: 'fault', code: isLbError(err) ? err.code : undefined, err: errorMessage(err) }, message);
    }
    this.closeSocket();
    this.setState('failed', message);
    await this.waitForChange(this.faultRetryMs);
  }
}
