// DHCPv6 address source (driver): one service's IA_NA client on the wire.
// The IPv6 twin of driver.ts: all decisions are client6.ts's (pure); this
// file performs its actions - sends messages, arms the one timer, runs
// duplicate address detection on the leased address, adds and removes the
// VIP, holds it on the wire (neighbour advertisements, defence), persists
// the lease, counts metrics, and emits 'vip' / 'lost'.
//
// The wire: a UDP socket bound to port 546 on the service macvlan's
// link-local address (RFC 8415 §7.2: clients listen on 546 and send from a
// link-local address), multicast to All_DHCP_Relay_Agents_and_Servers
// (ff02::1:2, port 547) out of that macvlan. No packet socket is needed as
// for DHCPv4: the source address and the macvlan pick the MAC, and a server
// answers the link-local address unicast. Bound to the link-local address
// with SO_REUSEADDR, it coexists with a DHCPv6 client of the VM on [::]:546
// (the kernel hands a datagram to the most specific socket).
//
// The macvlan is the service's (net/ownership.ts: name and MAC from
// "namespace/name", config/families.ts linkKeyOf): for a dual-stack DHCP
// service the DHCPv4 source creates, adopts and deletes it, and this source
// uses it; for an IPv6-only one this source does all of that itself.
//
// The VIP is ADDR/128 on the macvlan, added without the kernel's DAD and
// used at once while the agent's own runs (optimistic, RFC 4429; bind()); a
// duplicate is withdrawn and declined (RFC 8415 §18.2.8). No prefix route: the on-link
// prefix is the parent's (from router advertisements or its own config),
// and traffic to the LAN keeps leaving by the parent (docs/design.md, IPv6).
import * as dgram from 'node:dgram';
import * as os from 'node:os';
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { isoTime, realClock, type Clock, type TimerHandle } from '../clock';
import { parseAddress, parseNetwork, type Network } from '../address';
import type { ArpConfig, ArpTimings, DhcpConfig, ServiceSpec } from '../config/types';
import { linkKeyOf } from '../config/families';
import { LbError, errorMessage } from '../errors';
import { lazyChild, type Logger } from '../log';
import { netMetrics, type NetMetrics } from '../net/metrics';
import type { NetlinkClient } from '../net/netlink/netlink';
import { OWNED_ADDRESS_PROTO, linkNameForService, macForService } from '../net/ownership/ownership';
import { planOwnedLinks } from '../net/ownership/reconcile';
import { prepareIpv6Link } from '../net/sysctl/sysctl';
import { addressesChanged } from '../net/host/local-addresses';
import { dadProbe, NdpVipOwner, openNdpSocket } from '../net/neighbour/ndp-driver';
import type { SharedLink } from './shared-link';
import { DUP_ADDR_DETECT_TRANSMITS } from '../net/neighbour/ndp-owner';
import type { NdpSocket } from '../net/neighbour/ndp-socket';
import { linkLocalOf, ndpTimings } from '../ipam/pool-source';
import type { AddressSource, LostCause, SourceDamage, SourceState, SourceStatus, Vip } from '../source';
import type { StateStore } from '../state/store';
import {
  DEFAULT_CLIENT6_CONFIG, initialState6, step6,
  type Client6Action, type Client6Config, type Client6Event, type Client6State, type Dhcp6StateName, type Unbind6Cause,
} from './client6';
import { DHCP6_CLIENT_PORT, DHCP6_SERVER_PORT, buildClient6Message, type Client6MessageSpec, decodeReplyPayload6, describeDuid, describePacket6, encodeDhcp6, formatDuid, formatIPv6, parseDuid, type Dhcp6Packet } from './codec6';
import { duidForService, iaidForService } from './duid';
import { judgeAddress6, type Guard6Policy, type Guard6Reason, type Host6View } from './guard6';
import { fromStored6, lease6FileName, toStored6, type Lease6 } from './lease6';
import { dhcp6Metrics, removeService6Series, type Dhcp6Metrics } from './metrics';

/** The VIP is a host address on the macvlan. */
export const VIP6_PREFIX = 128;

/** How long a shared macvlan (the DHCPv4 source's) may take to appear. */
const SHARED_LINK_WAIT_MS = 15_000;
/** Without the DHCPv4 source's 'up' event (a missed one), how often the shared macvlan is read again. */
const SHARED_LINK_POLL_MS = 1_000;
/** How long a RELEASE on removal waits for the server's REPLY before the macvlan goes (RFC 8415 §18.2.7 retransmits; a removal does not wait for all of them). */
const RELEASE_WAIT_MS = 1_500;
/** SOLICITs without an answer before status says pending. */
const STALLED_SOLICITS = 4;
/** A refused reply is logged at warn once per reason per interval; the counter has every one. */
const GUARD_WARN_INTERVAL_MS = 10_000;

const SOURCE_STATE: Record<Dhcp6StateName, SourceState> = {
  STOPPED: 'idle', INIT: 'acquiring', SELECTING: 'acquiring', REQUESTING: 'acquiring', BOUND: 'bound',
  RENEWING: 'renewing', REBINDING: 'renewing', DECLINING: 'acquiring', RELEASING: 'idle',
};

const LOST_CAUSE: Readonly<Record<Unbind6Cause, LostCause>> = {
  expired: 'lease-expired', 'no-binding': 'other', released: 'released', stopped: 'stopped',
  'address-changed': 'address-changed', 'dad-failed': 'conflict', refused: 'nak',
};

export type NetlinkForDhcp6 = Pick<NetlinkClient, 'findLink' | 'getLink' | 'createMacvlan' | 'setLink' | 'deleteLink' | 'addAddress' | 'removeAddress' | 'listAddresses'>;

export interface Dhcp6SourceOptions {
  /** The IPv6 family service ("namespace/name@IPv6"). */
  service: ServiceSpec;
  parent: string;
  /** Burst, refresh and DAD timings (the arp: section, as for IPv6 pool VIPs). */
  arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>>;
  store: StateStore;
  netlink: NetlinkForDhcp6;
  log: Logger;
  registry: Registry;
  clock?: Clock;
  random?: () => number;
  /** The service's DHCPv4 source owns the macvlan (a dual-stack DHCP service): wait for it, never create or delete it. */
  sharedLink: boolean;
  /**
   * That macvlan's events from the DHCPv4 source (dhcp/shared-link.ts): it
   * says when the link is up, and before it brings it up on a VRRP takeover
   * this source puts the VIP it resumes there. Without it the link is polled.
   */
  linkEvents?: SharedLink;
  /** Which servers and addresses are accepted (dhcp.allowOtherSubnets, dhcp.servers6; guard6Of); default: any server, the parent's prefixes only. */
  guard?: Guard6Policy;
  /** The VM's IPv6 addresses and the parent's prefixes; default: read live (os.networkInterfaces). */
  hostView?: () => Host6View;
  /** RFC 8415 §7.6 retransmission parameters; tests shorten them. */
  client?: Partial<Client6Config>;
  /**
   * VRRP (the election decided this node holds the VIP): an unexpired saved
   * lease is served at once and RENEWed even when its address is not on the
   * macvlan, and start()'s `known` address at once and REBOUND when no lease
   * was saved here; the leased address gets no duplicate address detection
   * (the previous holder is the same DUID, not a duplicate). Without it,
   * only an address found on the adopted macvlan resumes, and every other
   * one is probed.
   */
  resumeSaved?: boolean;
}

export class Dhcp6Source extends EventEmitter implements AddressSource {
  readonly key: string;
  readonly ifname: string;
  readonly mac: string;
  private readonly parent: string;
  private arp: Dhcp6SourceOptions['arp'];
  private readonly store: StateStore;
  private readonly netlink: NetlinkForDhcp6;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly sharedLink: boolean;
  private readonly resumeSaved: boolean;
  private readonly linkEvents: SharedLink | undefined;
  /** The address this run resumes (a saved lease or the previous Master's), once run() has read it. */
  private resuming: Promise<string | undefined> | undefined;
  /** The VIP put on the shared link before the DHCPv4 source brought it up: removed if this start fails. */
  private preAdded: { index: number; address: string } | undefined;
  private readonly duid: Buffer;
  private readonly iaid: number;
  private readonly leaseFile: string;
  /** "namespace/name": the lease file's service, the DUID's and the macvlan's key. */
  private readonly linkKey: string;
  private readonly labels: { service: string; namespace: string };
  private readonly metrics: Dhcp6Metrics;
  private readonly netM: NetMetrics;
  private config: Client6Config;
  private guard: Guard6Policy;
  private readonly hostView: () => Host6View;

  private state: Client6State;
  private running = false;
  private failed: string | undefined;
  private lastReason: string | undefined;
  private ifindex: number | undefined;
  private linkLocal: bigint | undefined;
  private socket: dgram.Socket | undefined;
  private ndpSocket: NdpSocket | undefined;
  private owner: NdpVipOwner | undefined;
  private timer: TimerHandle | undefined;
  private vip: Vip | undefined;
  private abort: AbortController | undefined;
  private startTask: Promise<void> = Promise.resolve();
  private chain: Promise<void> = Promise.resolve();
  private generation = 0;
  private readonly guardWarned = new Map<Guard6Reason, number>();
  /** start()'s `known` address, for the run it starts. */
  private known: string | undefined;
  /** Messages the machine sent while the start still opened the socket; sent when it is open. */
  private outbox: Client6MessageSpec[] | undefined;
  /** Resolves when a RELEASE exchange ends (its REPLY, or the retransmissions run out). */
  private released: (() => void) | undefined;

  constructor(opts: Dhcp6SourceOptions) {
    super();
    const linkKey = linkKeyOf(opts.service.key);
    this.key = opts.service.key;
    this.parent = opts.parent;
    this.arp = opts.arp;
    this.store = opts.store;
    this.netlink = opts.netlink;
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
    this.sharedLink = opts.sharedLink;
    this.resumeSaved = opts.resumeSaved ?? false;
    this.linkEvents = opts.linkEvents;
    this.ifname = linkNameForService(linkKey);
    this.mac = macForService(linkKey);
    this.duid = duidForService(linkKey);
    this.iaid = iaidForService(linkKey);
    this.linkKey = linkKey;
    this.leaseFile = lease6FileName(linkKey);
    this.labels = { service: opts.service.name, namespace: opts.service.namespace };
    this.log = lazyChild(opts.log, { module: 'dhcp6', service: this.key, ifname: this.ifname });
    this.metrics = dhcp6Metrics(opts.registry);
    this.netM = netMetrics(opts.registry);
    const wanted = opts.service.loadBalancerIP ? parseAddress(opts.service.loadBalancerIP) : undefined;
    this.config = { ...DEFAULT_CLIENT6_CONFIG, ...opts.client, requestedAddress: wanted?.family === 'IPv6' ? wanted.value : undefined };
    this.guard = opts.guard ?? { allowOtherSubnets: false, servers: [] };
    this.hostView = opts.hostView ?? (() => host6View(this.parent, this.ifname));
    this.state = initialState6(this.iaid);
  }

  // --- AddressSource ---------------------------------------------------------

  reconfigure(settings: { arp: ArpConfig; dhcp: DhcpConfig }): void {
    this.arp = settings.arp;
    this.guard = guard6Of(settings.dhcp);
  }

  /**
   * `known`: on a VRRP takeover, the VIP the previous Master advertised for
   * this service. With resumeSaved and no unexpired lease of our own it is
   * served at once and confirmed with a server (client6.ts 'start'), after
   * the same checks as a server's grant (dhcp/guard6.ts): an advert is a
   * value from the LAN, not a lease.
   */
  start(opts: { known?: string } = {}): void {
    if (this.running) return;
    this.known = opts.known;
    this.running = true;
    this.failed = undefined;
    this.lastReason = undefined;
    const abort = new AbortController();
    this.abort = abort;
    this.preAdded = undefined;
    let resumed: (address: string | undefined) => void = () => {};
    this.resuming = new Promise((r) => { resumed = r; });
    if (this.sharedLink && this.resumeSaved) this.linkEvents?.setBeforeUp((index) => this.addBeforeUp(index, abort.signal));
    this.emit('status');
    this.startTask = this.run(abort.signal, resumed).catch(async (err) => {
      // Nothing half-applied: a start that failed leaves no socket, no
      // timer, no macvlan of its own, and no VIP said to be held (a resumed
      // one is served before the socket opens).
      this.generation++;
      this.clearTimer();
      await this.chain;
      this.outbox = undefined;
      this.closeSockets();
      this.linkEvents?.setBeforeUp(undefined);
      if (!this.sharedLink) await this.deleteLink();
      else await this.removePreAdded();
      const vip = this.vip;
      this.vip = undefined;
      this.state = initialState6(this.iaid);
      if (vip) this.emit('lost', `DHCPv6 source failed while serving ${vip.address}`, 'other');
      this.fail(err);
    });
  }

  /** No more starting: the start under way aborted and awaited. Whether it was running. */
  private async halt(): Promise<boolean> {
    const wasRunning = this.running;
    this.running = false;
    this.linkEvents?.setBeforeUp(undefined);
    this.abort?.abort();
    await this.startTask;
    return wasRunning;
  }

  async stop(opts: { release: boolean; keep?: boolean }): Promise<void> {
    const wasRunning = await this.halt();
    if (opts.keep && !opts.release) {
      // A planned restart: address and lease stay for the next process.
      const kept = this.vip?.address;
      await this.quiesce();
      this.state = initialState6(this.iaid);
      this.vip = undefined;
      this.log.info({ op: 'stop', kept }, kept ? `stopped; ${kept} stays on ${this.ifname} for the next process` : 'stopped');
      this.emit('status');
      return;
    }
    if (wasRunning && this.state.name !== 'STOPPED') {
      if (opts.release && this.state.lease) {
        // RFC 8415 §18.2.7: RELEASE to the server; the removal waits briefly for its REPLY.
        const done = new Promise<void>((resolve) => { this.released = resolve; });
        this.dispatch({ type: 'release' });
        let t: TimerHandle | undefined;
        await Promise.race([done, new Promise<void>((r) => { t = this.clock.setTimeout(r, RELEASE_WAIT_MS); })]);
        if (t !== undefined) this.clock.clearTimeout(t);
        this.released = undefined;
      } else {
        this.dispatch({ type: 'stop' });
      }
    }
    await this.quiesce();
    if (!this.sharedLink) await this.deleteLink();
    if (opts.release) {
      await this.store.removeAsync(this.leaseFile).catch((err: unknown) => this.log.error({ op: 'forget', err: errorMessage(err) }, 'could not remove the saved DHCPv6 lease'));
      removeService6Series(this.metrics, this.labels);
    }
    this.state = initialState6(this.iaid);
    this.vip = undefined;
    this.failed = undefined;
    this.log.info({ op: 'stop', release: opts.release }, opts.release ? 'stopped and released' : 'stopped; lease kept');
    this.emit('status');
  }

  reannounce(): void {
    if (this.vip) this.owner?.reannounce();
  }

  /**
   * Put back what the kernel lost of the bound VIP (daemon/drift-plan.ts):
   * the /128 on the macvlan or the macvlan up, in place, announced again. A
   * deleted macvlan takes the address and the socket with it: the client
   * starts over on the new one (the DHCPv4 source recreates a shared one),
   * asking for the same address.
   */
  async repair(damage: SourceDamage): Promise<string | undefined> {
    const vip = this.vip;
    if (!this.running || !vip || !this.owner) return undefined;
    if (damage === 'link') {
      await this.stop({ release: false, keep: true });
      this.start();
      return `starting the DHCPv6 client over on ${this.ifname}, asking for ${vip.address} again`;
    }
    let out: string | undefined;
    this.enqueue(async () => {
      if (!this.running || this.vip !== vip) return;
      const done: string[] = [];
      if (damage === 'link-down' && !this.sharedLink) {
        await this.netlink.setLink(vip.ifindex, { up: true });
        done.push(`set ${vip.ifname} up`);
      }
      const on = (await this.netlink.listAddresses(vip.ifindex, 'IPv6')).some((a) => a.address === vip.address && a.prefix === vip.prefix);
      if (!on) {
        await this.netlink.addAddress(vip.ifindex, vip.address, vip.prefix, { proto: OWNED_ADDRESS_PROTO });
        addressesChanged();
        done.push(`added ${vip.address}/${vip.prefix} to ${vip.ifname} again`);
      }
      this.owner?.reannounce();
      out = done.length > 0 ? `${done.join(', ')} and announced it` : undefined;
    });
    await this.chain;
    return out;
  }

  status(): SourceStatus {
    const s = this.state;
    let state: SourceState = this.failed ? 'failed' : this.running ? SOURCE_STATE[s.name] : 'idle';
    let reason = this.failed ?? this.lastReason;
    if (!this.failed && this.running && s.name === 'SELECTING' && s.advert === undefined && s.attempts >= STALLED_SOLICITS) {
      state = 'pending';
      reason = `no DHCPv6 ADVERTISE after ${s.attempts} SOLICITs from ${this.ifname} (DUID ${describeDuid(this.duid)}, parent ${this.parent})`;
    }
    if (this.running && s.name === 'STOPPED' && !this.failed) state = 'acquiring';
    const wallOffset = this.clock.wallNow() - this.clock.now();
    const lease = s.lease;
    return {
      state, reason, vip: this.vip, ifname: this.ifname, mac: this.mac,
      get details(): Record<string, unknown> {
        const at = (t: number): string | null => (Number.isFinite(t) ? isoTime(t + wallOffset) : null);
        return {
          state: s.name,
          ...(lease ? {
            address: formatIPv6(lease.address), server: describeDuid(lease.serverId), serverDuid: formatDuid(lease.serverId), validSeconds: lease.validSeconds,
            renewAt: at(lease.renewAt), rebindAt: at(lease.rebindAt), expiresAt: at(lease.expiresAt),
          } : {}),
          ...(s.asking ? { requested: formatIPv6(s.asking.address) } : {}),
        };
      },
    };
  }

  // --- start-up ----------------------------------------------------------------

  private async run(signal: AbortSignal, resumed: (address: string | undefined) => void): Promise<void> {
    let saved: Lease6 | undefined;
    let unexpired: Lease6 | undefined;
    let known: bigint | undefined;
    // The address a VRRP takeover serves at once: the saved lease's, else the previous Master's.
    let keep: string | undefined;
    try {
      await this.store.settled(this.leaseFile);
      const wallOffset = this.clock.wallNow() - this.clock.now();
      saved = fromStored6(this.store.read(this.leaseFile), this.linkKey, this.duid, wallOffset);
      unexpired = saved && saved.expiresAt > this.clock.now() ? saved : undefined;
      known = unexpired || !this.resumeSaved ? undefined : this.knownAddress();
      keep = unexpired ? formatIPv6(unexpired.address) : known !== undefined ? formatIPv6(known) : undefined;
    } finally {
      // Whatever happens, addBeforeUp's wait for it ends.
      resumed(this.resumeSaved ? keep : undefined);
    }
    const { index, kept } = await this.ensureLink(keep, signal);
    if (signal.aborted) return;
    this.ifindex = index;
    const resume = (unexpired !== undefined && (kept || this.resumeSaved)) || known !== undefined;
    this.log.info({ op: 'start', mac: this.mac, duid: describeDuid(this.duid), saved: saved ? formatIPv6(saved.address) : undefined, known: known === undefined ? undefined : formatIPv6(known), resume, adopted: kept }, 'DHCPv6 client starting');
    // The machine starts before the socket is open: a resumed lease or a
    // takeover serves its address at once, while the link-local address
    // the socket sends from appears only once the kernel runs the link it
    // just brought up (linkwatch: up to a second). What it sends meanwhile
    // waits in the outbox.
    this.outbox = [];
    this.dispatch({ type: 'start', saved, resume, known });
    const sock = await this.openSocket(index, signal);
    if (signal.aborted) { this.outbox = undefined; this.closeSockets(); return; }
    this.socket = sock;
    const queued = this.outbox;
    this.outbox = undefined;
    for (const m of queued) this.send(m);
  }

  /** start()'s known address, when the guard would accept it as a server's grant (the server allow-list applies to the REBIND's answer). */
  private knownAddress(): bigint | undefined {
    if (this.known === undefined) return undefined;
    const a = parseAddress(this.known);
    if (a?.family !== 'IPv6') return undefined;
    const verdict = judgeAddress6(a.value, undefined, this.hostView(), { ...this.guard, servers: [] });
    if (verdict === 'ok') return a.value;
    this.metrics.dropped.inc({ reason: verdict });
    this.log.warn({ op: 'start', known: this.known, reason: verdict }, `the previous VRRP Master's address ${this.known} for this service is refused (${verdict}); asking a DHCPv6 server instead`);
    return undefined;
  }

  /**
   * VRRP Backup: withdraw the VIP (lease kept, nothing sent) and keep the
   * service macvlan ready - created, with its MAC, down and without a
   * global address - so a takeover is only: link up, the /128 on,
   * unsolicited neighbour advertisements. A down macvlan sends and answers
   * nothing: no DHCPv6, no neighbour discovery, and its link-local address
   * (the same on every VM, from the shared MAC) is on one VM's link at most.
   */
  async standby(): Promise<void> {
    if (await this.halt() && this.state.name !== 'STOPPED') this.dispatch({ type: 'stop' });
    await this.quiesce();
    this.state = initialState6(this.iaid);
    this.vip = undefined;
    this.failed = undefined;
    this.ifindex = undefined;
    if (!this.sharedLink) {
      try {
        await this.readyLink();
        this.log.info({ op: 'standby', ifname: this.ifname }, 'Backup: service macvlan ready (down, no address); lease kept');
      } catch (err) {
        // Not ready is only slower: the takeover creates the link as a cold start does.
        this.log.warn({ op: 'standby', err: errorMessage(err) }, 'could not keep the service macvlan ready');
      }
    }
    this.emit('status');
  }

  /** The Backup's macvlan: created or adopted, down, no global address (an earlier run's VIP withdrawn). */
  private async readyLink(): Promise<void> {
    let link = await this.netlink.findLink(this.ifname);
    const parent = await this.netlink.getLink(this.parent);
    if (link) {
      const plan = planOwnedLinks([link, parent], new Map([[this.ifname, { mac: this.mac, parent: parent.index, mode: 'bridge' as const }]]));
      if (plan.foreign.length > 0) throw new LbError('LB_ERR_NET_NETLINK', `interface ${this.ifname} exists but is not the agent's (MAC ${link.mac}); remove it so service ${this.key} can use the name`, { interface: this.ifname });
      if (plan.recreate[0]) {
        await this.netlink.deleteLink(link.index);
        link = undefined;
      }
    }
    if (!link) link = await this.netlink.createMacvlan({ name: this.ifname, parent, mac: this.mac, mode: 'bridge' });
    if (link.up) await this.netlink.setLink(link.index, { up: false });
    for (const a of await this.netlink.listAddresses(link.index, 'IPv6')) {
      if (linkLocalOf([a]) !== undefined) continue;
      await this.netlink.removeAddress(link.index, a.address, a.prefix);
      addressesChanged();
      this.log.info({ op: 'standby', address: `${a.address}/${a.prefix}` }, 'Backup: removed an IPv6 address left on the service macvlan');
    }
  }

  /**
   * The macvlan: the DHCPv4 source's (waited for) or this source's own
   * (created, or adopted from an earlier run). On an adopted one the saved
   * lease's address stays - clients are using it - and `kept` says so; any
   * other global IPv6 address there has no lease behind it and goes.
   */
  private async ensureLink(keep: string | undefined, signal: AbortSignal): Promise<{ index: number; kept: boolean }> {
    if (this.sharedLink) return await this.awaitSharedLink(keep, signal);
    let link = await this.netlink.findLink(this.ifname);
    const parent = await this.netlink.getLink(this.parent);
    if (link) {
      const plan = planOwnedLinks([link, parent], new Map([[this.ifname, { mac: this.mac, parent: parent.index, mode: 'bridge' as const }]]));
      if (plan.foreign.length > 0) {
        throw new LbError('LB_ERR_NET_NETLINK', `interface ${this.ifname} exists but is not the agent's (MAC ${link.mac}); remove it so service ${this.key} can use the name`, { interface: this.ifname });
      }
      if (plan.recreate[0]) {
        await this.netlink.deleteLink(link.index);
        link = undefined;
      }
    }
    if (!link) link = await this.netlink.createMacvlan({ name: this.ifname, parent, mac: this.mac, mode: 'bridge' });
    // Before the link goes up: no router solicitation or SLAAC address from the service MAC.
    await prepareIpv6Link(this.ifname);
    if (!link.up) await this.netlink.setLink(link.index, { up: true });
    return { index: link.index, kept: await this.sweepLink(link.index, keep) };
  }

  /** Every global IPv6 address on the macvlan but `keep` goes (no lease behind it); whether `keep` is there. */
  private async sweepLink(index: number, keep: string | undefined): Promise<boolean> {
    let kept = false;
    for (const a of await this.netlink.listAddresses(index, 'IPv6')) {
      if (linkLocalOf([a]) !== undefined) continue;
      if (a.address === keep && a.prefix === VIP6_PREFIX) { kept = true; continue; }
      await this.netlink.removeAddress(index, a.address, a.prefix);
      addressesChanged();
      this.log.info({ op: 'start', address: `${a.address}/${a.prefix}` }, 'removed an IPv6 address left on the service macvlan (no saved lease for it)');
    }
    return kept;
  }

  /**
   * The DHCPv4 source's macvlan, once it is up with the service MAC: told by
   * its 'up' event (dhcp/shared-link.ts), read again at most once a second
   * without one. The DHCPv4 source prepared IPv6 on it before it went up;
   * an adopted link found up is prepared here (idempotent).
   */
  private async awaitSharedLink(keep: string | undefined, signal: AbortSignal): Promise<{ index: number; kept: boolean }> {
    const events = this.linkEvents;
    let wake: (() => void) | undefined;
    let ownerFailed = false;
    const onUp = (): void => wake?.();
    const onFailed = (): void => { ownerFailed = true; wake?.(); };
    const onAbort = (): void => wake?.();
    events?.on('up', onUp);
    events?.on('failed', onFailed);
    signal.addEventListener('abort', onAbort);
    try {
      const until = this.clock.now() + SHARED_LINK_WAIT_MS;
      let link = await this.netlink.findLink(this.ifname);
      const upAtFirst = link?.up === true;
      while (!(link && link.mac === this.mac && link.up)) {
        if (signal.aborted) return { index: -1, kept: false };
        if (ownerFailed) throw new LbError('LB_ERR_NET_NO_INTERFACE', `the service's DHCPv4 source failed to set up the service macvlan ${this.ifname} (MAC ${this.mac}) this DHCPv6 lease rides; see that source's status`, { interface: this.ifname });
        if (this.clock.now() > until) throw new LbError('LB_ERR_NET_NO_INTERFACE', `the service macvlan ${this.ifname} (MAC ${this.mac}) that the service's DHCPv4 source sets up did not come up within ${SHARED_LINK_WAIT_MS / 1000} s; see that source's status`, { interface: this.ifname });
        let t: TimerHandle | undefined;
        await new Promise<void>((r) => { wake = r; t = this.clock.setTimeout(r, events ? SHARED_LINK_POLL_MS : 50); });
        if (t !== undefined) this.clock.clearTimeout(t);
        wake = undefined;
        link = await this.netlink.findLink(this.ifname);
      }
      this.linkEvents?.setBeforeUp(undefined);
      if (upAtFirst || !events) await prepareIpv6Link(this.ifname);
      return { index: link.index, kept: await this.sweepLink(link.index, keep) };
    } finally {
      events?.off('up', onUp);
      events?.off('failed', onFailed);
      signal.removeEventListener('abort', onAbort);
    }
  }

  /**
   * dhcp/shared-link.ts, on a VRRP takeover: the address this start resumes,
   * on the macvlan before the DHCPv4 source brings it up, without the
   * kernel's DAD (as every VIP; the election decided, and the previous
   * holder is this DUID). Its advertisements and the confirmation with a
   * server follow once the link is up (bind()).
   */
  private async addBeforeUp(index: number, signal: AbortSignal): Promise<void> {
    const address = await this.resuming;
    if (address === undefined || signal.aborted) return;
    const held = (await this.netlink.listAddresses(index, 'IPv6')).some((a) => a.address === address && a.prefix === VIP6_PREFIX);
    if (!held) {
      await this.netlink.addAddress(index, address, VIP6_PREFIX, { proto: OWNED_ADDRESS_PROTO });
      addressesChanged();
      this.preAdded = { index, address };
    }
    this.log.info({ op: 'start', address }, `VIP ${address} on ${this.ifname} before it comes up`);
  }

  /** A failed start: the address addBeforeUp put on the shared macvlan goes with it (the link may already be gone). */
  private async removePreAdded(): Promise<void> {
    const pre = this.preAdded;
    this.preAdded = undefined;
    if (!pre) return;
    try {
      await this.netlink.removeAddress(pre.index, pre.address, VIP6_PREFIX);
      addressesChanged();
    } catch (err) {
      this.log.debug({ op: 'start', err: errorMessage(err) }, `${pre.address} was no longer on ${this.ifname}`);
    }
  }

  /**
   * The UDP socket on the macvlan's link-local address, port 546. The
   * link-local address appears when IPv6 comes up on the link (optimistic:
   * usable at once); until then the bind is retried, bounded.
   */
  private async openSocket(index: number, signal: AbortSignal): Promise<dgram.Socket> {
    const until = this.clock.now() + 5_000;
    for (;;) {
      const ll = linkLocalOf(await this.netlink.listAddresses(index, 'IPv6'));
      if (ll !== undefined) {
        try {
          const sock = await bindUdp(`${formatIPv6(ll)}%${this.ifname}`);
          this.linkLocal = ll;
          sock.on('message', (msg: Buffer) => {
            // Nothing a datagram causes may throw out of the socket's callback.
            try { this.onMessage(msg); } catch (err) { this.log.error({ op: 'recv', err: errorMessage(err) }, 'handling a DHCPv6 message failed'); }
          });
          sock.on('error', (err: Error) => this.log.warn({ op: 'recv', err: err.message }, 'DHCPv6 socket error'));
          return sock;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EADDRNOTAVAIL') {
            throw new LbError('LB_ERR_NET_SOCKET', `cannot bind the DHCPv6 client socket to [${formatIPv6(ll)}%${this.ifname}]:${DHCP6_CLIENT_PORT}: ${errorMessage(err)}`, { interface: this.ifname }, { cause: err });
          }
        }
      }
      if (signal.aborted) throw new Error('stopped');
      if (this.clock.now() > until) throw new LbError('LB_ERR_NET_NO_INTERFACE', `${this.ifname} has no usable IPv6 link-local address to send DHCPv6 from (is IPv6 disabled on it or on ${this.parent}?)`, { interface: this.ifname });
      await new Promise<void>((r) => this.clock.setTimeout(r, 50));
    }
  }

  // --- the machine and its actions ---------------------------------------------

  private dispatch(ev: Client6Event): void {
    const before = this.state.name;
    const r = step6({ config: this.config, random: this.random }, this.state, ev, this.clock.now());
    this.state = r.state;
    for (const a of r.actions) this.perform(a);
    if (r.state.name !== before) {
      const quiet = before === 'STOPPED' || before === 'INIT' || (before === 'SELECTING' && r.state.name === 'REQUESTING') || (before === 'REQUESTING' && r.state.name === 'BOUND');
      this.log[quiet ? 'debug' : 'info']({ op: 'state', from: before, to: r.state.name, reason: r.reason }, `DHCPv6 ${before} -> ${r.state.name}`);
      if (before === 'RELEASING') this.released?.();
    }
    this.emit('status');
  }

  private perform(a: Client6Action): void {
    switch (a.type) {
      case 'send': return this.send(a.message);
      case 'setTimer': return this.arm(a.at);
      case 'clearTimer': return this.clearTimer();
      case 'bind': return this.enqueue(() => this.bind(a.lease));
      case 'unbind': return this.enqueue(() => this.unbind(a));
      case 'persist': return this.persist(a.lease);
      case 'forget':
        this.metrics.leaseExpiry.remove(this.labels);
        this.store.removeAsync(this.leaseFile).catch((err: unknown) => this.log.error({ op: 'forget', err: errorMessage(err) }, 'could not remove the saved DHCPv6 lease'));
        return;
      case 'note': return this.note(a);
    }
  }

  /**
   * The state machine's one timer. A timer may fire up to a millisecond
   * before `at` on the clock (libuv counts whole milliseconds of loop time):
   * it is armed again for the rest, never dispatched early - client6.ts
   * ignores an early 'timer' and would be left with no timer at all.
   */
  private arm(at: number): void {
    this.clearTimer();
    const gen = this.generation;
    this.timer = this.clock.setTimeout(() => {
      this.timer = undefined;
      if (gen !== this.generation || !(this.running || this.released)) return;
      if (this.clock.now() < at) { this.arm(at); return; }
      this.dispatch({ type: 'timer' });
    }, Math.max(0, Math.ceil(at - this.clock.now())));
  }

  private send(message: Client6MessageSpec): void {
    const sock = this.socket;
    if (!sock) {
      this.outbox?.push(message);
      return;
    }
    const payload = encodeDhcp6(buildClient6Message(message, { duid: this.duid, iaid: this.iaid }));
    sock.send(payload, DHCP6_SERVER_PORT, `ff02::1:2%${this.ifname}`, (err) => {
      // Not fatal: the retransmission schedule tries again.
      if (err) this.log.warn({ op: 'send', kind: message.kind, err: err.message }, 'DHCPv6 send failed');
    });
    this.log.debug({ op: 'send', kind: message.kind, xid: message.xid }, `DHCPv6 ${message.kind} sent`);
  }

  private onMessage(msg: Buffer): void {
    const r = decodeReplyPayload6(msg, { xid: this.state.xid, duid: this.duid });
    if (!r.ok) {
      this.metrics.dropped.inc({ reason: r.reason });
      if (r.reason !== 'wrong-xid') this.log.debug({ op: 'recv', reason: r.reason }, 'dropped a DHCPv6 message');
      return;
    }
    this.log.debug({ op: 'recv', packet: describePacket6(r.value) }, 'DHCPv6 reply');
    if (!this.acceptable(r.value)) return;
    this.dispatch({ type: 'reply', packet: r.value });
  }

  /** dhcp/guard6.ts: every address our IA_NA grants is judged; one refused address drops the whole reply, counted by reason. */
  private acceptable(p: Dhcp6Packet): boolean {
    const ia = p.fields.iaNa.find((x) => x.iaid === this.iaid >>> 0);
    const granted = ia?.addresses.filter((a) => a.valid > 0) ?? [];
    if (granted.length === 0) return true;
    const host = this.hostView();
    for (const a of granted) {
      const verdict = judgeAddress6(a.address, p.fields.serverId, host, this.guard);
      if (verdict === 'ok') continue;
      this.metrics.dropped.inc({ reason: verdict });
      const now = this.clock.now();
      const level = now - (this.guardWarned.get(verdict) ?? -Infinity) >= GUARD_WARN_INTERVAL_MS ? 'warn' : 'debug';
      if (level === 'warn') this.guardWarned.set(verdict, now);
      this.lastReason = `refused a DHCPv6 ${p.fields.kind ?? 'reply'} granting ${formatIPv6(a.address)} (${verdict})`;
      this.log[level]({ op: 'recv', reason: verdict, packet: describePacket6(p) }, `refused a DHCPv6 ${p.fields.kind ?? 'reply'} (${verdict}); not used`);
      return false;
    }
    return true;
  }

  /**
   * The leased address on the macvlan at once, optimistic (RFC 4429 §3.1:
   * an address a DHCPv6 server assigned may be used while duplicate address
   * detection runs), then DAD (net/neighbour/ndp-driver.ts dadProbe, RFC
   * 4862 §5.4) and only after it the unsolicited override advertisements
   * (RFC 4429 §3.3: none for an optimistic address, so a duplicate's
   * neighbours are never told to switch). A duplicate withdraws the address
   * and is declined (RFC 8415 §18.2.8). An address this macvlan already
   * holds (a resumed lease, a renewal that confirmed it) is not probed.
   */
  private async bind(lease: Lease6): Promise<void> {
    const ifindex = this.ifindex;
    if (ifindex === undefined) return;
    const address = formatIPv6(lease.address);
    const gen = this.generation;
    if (this.vip?.address === address && this.owner) {
      this.emit('status');
      return;
    }
    const held = (await this.netlink.listAddresses(ifindex, 'IPv6')).some((a) => a.address === address && a.prefix === VIP6_PREFIX);
    if (!held) {
      await this.netlink.addAddress(ifindex, address, VIP6_PREFIX, { proto: OWNED_ADDRESS_PROTO });
      addressesChanged();
    }
    await this.store.settled(this.leaseFile);
    if (gen !== this.generation) return;
    const vip: Vip = { address, prefix: VIP6_PREFIX, ifname: this.ifname, ifindex, mac: this.mac };
    this.vip = vip;
    this.lastReason = undefined;
    // Under VRRP the election decided, and the previous holder was this same DUID's binding: no probe.
    const dad = !held && this.arp.probeNum > 0 && !this.resumeSaved;
    this.log.info({ op: 'bind', address, server: describeDuid(lease.serverId), valid: lease.validSeconds, optimistic: dad }, `VIP ${address} bound`);
    this.emit('vip', vip);
    this.emit('status');
    if (dad) {
      const res = await dadProbe({
        socket: this.ndp(ifindex), mac: this.mac, ip: address,
        config: { ...ndpTimings(this.arp, true), dadTransmits: DUP_ADDR_DETECT_TRANSMITS, giveUp: true, answerSolicitations: false },
        clock: this.clock, log: this.log, metrics: this.netM,
      });
      if (gen !== this.generation || !this.running || this.vip !== vip) return;
      if (res.duplicate) {
        this.lastReason = `leased ${address} is in use by ${res.mac ?? 'another node'} (${res.reason}, RFC 4862 §5.4); declined`;
        this.log.warn({ op: 'dad', address, mac: res.mac, reason: res.reason }, 'leased address in use; withdrawn and declining');
        // After this bind in the queue: the unbind it causes withdraws the optimistic address.
        queueMicrotask(() => this.dispatch({ type: 'dad-failed', address: lease.address }));
        return;
      }
    }
    this.hold(ifindex, address);
  }

  /** Unsolicited override advertisements on gain, the refresh, the defence (net/neighbour/ndp-driver.ts). */
  private hold(ifindex: number, address: string): void {
    this.owner?.close();
    this.owner = undefined;
    try {
      const owner = new NdpVipOwner({
        socket: this.ndp(ifindex), mac: this.mac, ip: address, source: this.linkLocal,
        config: { ...ndpTimings(this.arp, false), giveUp: false, answerSolicitations: false },
        clock: this.clock, log: this.log, metrics: this.netM,
      });
      owner.start();
      this.owner = owner;
    } catch (err) {
      this.log.warn({ op: 'announce', err: errorMessage(err) }, 'could not open the NDP socket: the VIP is neither announced nor defended');
    }
  }

  private ndp(ifindex: number): NdpSocket {
    if (this.ndpSocket && this.ndpSocket.ifindex === ifindex) return this.ndpSocket;
    this.ndpSocket?.close();
    const sock = openNdpSocket(ifindex, this.netM, this.log);
    sock.on('error', (err: Error) => this.log.warn({ op: 'ndp-socket', err: err.message }, 'NDP socket error'));
    this.ndpSocket = sock;
    return sock;
  }

  private async unbind(a: Extract<Client6Action, { type: 'unbind' }>): Promise<void> {
    const address = formatIPv6(a.address);
    this.owner?.close();
    this.owner = undefined;
    this.metrics.leaseExpiry.remove(this.labels);
    if (this.ifindex !== undefined) {
      try {
        await this.netlink.removeAddress(this.ifindex, address, VIP6_PREFIX);
        addressesChanged();
      } catch (err) {
        this.log.error({ op: 'unbind', address, err: errorMessage(err) }, 'could not remove the VIP');
      }
    }
    const had = this.vip !== undefined;
    this.vip = undefined;
    const reason = `DHCPv6 lease of ${address}: ${a.cause}${a.detail ? ` (${a.detail})` : ''}`;
    if (a.cause !== 'stopped' && a.cause !== 'released') this.lastReason = reason;
    (a.cause === 'stopped' || a.cause === 'released' ? this.log.info.bind(this.log) : this.log.warn.bind(this.log))({ op: 'unbind', address, cause: a.cause }, reason);
    if (had) this.emit('lost', reason, LOST_CAUSE[a.cause]);
    this.emit('status');
  }

  private persist(lease: Lease6): void {
    const wallOffset = this.clock.wallNow() - this.clock.now();
    this.metrics.leaseExpiry.set(this.labels, Number.isFinite(lease.expiresAt) ? (lease.expiresAt + wallOffset) / 1000 : Infinity);
    this.store.writeAsync(this.leaseFile, toStored6(lease, this.linkKey, this.duid, wallOffset)).catch((err: unknown) => {
      this.log.error({ op: 'persist', err: errorMessage(err) }, 'could not save the DHCPv6 lease');
    });
  }

  private note(a: Extract<Client6Action, { type: 'note' }>): void {
    const m = this.metrics;
    switch (a.what) {
      case 'acquired': if (a.ms !== undefined) m.acquireDuration.observe(this.labels, a.ms / 1000); return;
      case 'renewed': m.renewals.inc(this.labels); return;
      case 'rebinding': m.rebinds.inc(this.labels); this.log.warn({ op: 'rebind' }, 'no renewal from the server by T2; asking any server (REBIND)'); return;
      case 'declined': m.declines.inc(this.labels); return;
      case 'expired': m.expiries.inc(this.labels); return;
      case 'refused':
        this.lastReason = `DHCPv6 server refused: ${a.detail ?? 'no address'}`;
        this.log.info({ op: 'recv', detail: a.detail }, this.lastReason);
        return;
      case 'no-binding': this.log.info({ op: 'renew', detail: a.detail }, 'the server has no binding for the lease: asking for the same address (REQUEST)'); return;
      case 'resumed':
        this.log.info({ op: 'resume', why: a.detail }, a.detail ? `serving ${a.detail} at once; confirming it with a REBIND` : 'serving the saved DHCPv6 lease at once; confirming it with a RENEW');
        return;
      case 'request-timeout': this.lastReason = 'no REPLY to REQUEST; starting over'; return;
      default: return;
    }
  }

  // --- helpers ------------------------------------------------------------------

  private enqueue(fn: () => Promise<void>): void {
    this.chain = this.chain.then(fn).catch((err) => this.fail(err));
  }

  private clearTimer(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private async quiesce(): Promise<void> {
    this.generation++;
    this.clearTimer();
    this.outbox = undefined;
    await this.chain;
    this.owner?.close();
    this.owner = undefined;
    this.closeSockets();
    await this.store.settled(this.leaseFile);
  }

  private closeSockets(): void {
    try { this.socket?.close(); } catch { /* closed already */ }
    this.socket = undefined;
    this.ndpSocket?.close();
    this.ndpSocket = undefined;
  }

  private fail(err: unknown): void {
    this.failed = errorMessage(err);
    this.log.error({ op: 'fail', err: this.failed, code: (err as LbError).code }, 'DHCPv6 address source failed');
    this.emit('status');
  }

  private async deleteLink(): Promise<void> {
    try {
      const link = await this.netlink.findLink(this.ifname);
      if (link && link.mac === this.mac) await this.netlink.deleteLink(link.index);
    } catch (err) {
      this.log.error({ op: 'stop', err: errorMessage(err) }, 'could not delete the service macvlan');
    }
    this.ifindex = undefined;
  }
}

/** A UDP socket on [address%ifname]:546, SO_REUSEADDR (see the header comment). */
function bindUdp(address: string): Promise<dgram.Socket> {
  return new Promise((resolve, reject) => {
    const sock = dgram.createSocket({ type: 'udp6', reuseAddr: true });
    const onError = (err: Error): void => { sock.close(); reject(err); };
    sock.once('error', onError);
    sock.bind({ address, port: DHCP6_CLIENT_PORT, exclusive: true }, () => {
      sock.off('error', onError);
      resolve(sock);
    });
  });
}

/** The VM's IPv6 addresses (every interface but the service's macvlan) and the parent's on-link prefixes, read live. */
export function host6View(parent: string, exclude: string, interfaces = os.networkInterfaces()): Host6View {
  const prefixes: Network[] = [];
  const local: bigint[] = [];
  for (const [name, list] of Object.entries(interfaces)) {
    if (name === exclude) continue;
    for (const a of list ?? []) {
      if (a.family !== 'IPv6') continue;
      const v = parseAddress(a.address.split('%')[0]!);
      if (v?.family !== 'IPv6') continue;
      local.push(v.value);
      if (name !== parent || !a.cidr) continue;
      const c = parseNetwork(a.cidr, true);
      if (c && c.family === 'IPv6' && c.prefix < 128 && linkLocalOf([{ address: formatIPv6(v.value) }]) === undefined) prefixes.push(c);
    }
  }
  return { prefixes, local };
}

/** The guard's policy from the config's dhcp section: the allow-list's DUIDs as bytes. */
export function guard6Of(dhcp: Pick<DhcpConfig, 'allowOtherSubnets' | 'servers6'>): Guard6Policy {
  return { allowOtherSubnets: dhcp.allowOtherSubnets, servers: dhcp.servers6.map(parseDuid) };
}

export function createDhcp6Source(opts: Dhcp6SourceOptions): Dhcp6Source {
  return new Dhcp6Source(opts);
}
