// DHCP address source (driver): one service's DHCP client on the wire. Owns
// the service's macvlan (deterministic name and MAC from net/ownership.ts,
// bridge mode), its port on the parent's shared AF_PACKET socket (net/
// packet-shared.ts: one socket for every service on a parent), the one timer of the state
// machine, the saved lease file, and the VIP address on the macvlan. All
// decisions are client.ts's (pure); this file performs its actions: sends
// frames, arms the timer, ARP-probes and announces, adds and removes the
// address, persists the lease, counts metrics, and emits 'vip' / 'lost'.
//
// Why a packet socket and not a UDP socket on port 68: the VM's own DHCP
// client may hold port 68, and every frame must leave with the macvlan's MAC
// as Ethernet source (a renewal from the parent's MAC is refused by servers).
// Why not the `dhcp` npm package: its client cannot be bound to an interface
// and hides the exchange we need to control (xids, INIT-REBOOT, DECLINE).
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { ownerTimings } from '../config/defaults';
import type { ArpConfig, ArpTimings, DhcpConfig, DhcpTimings, ServiceSpec } from '../config/types';
import { LbError, errorMessage } from '../errors';
import { formatIPv4, parseIPv4 } from '../address';
import { lazyChild, type Logger } from '../log';
import { probeAddress as arpProbe } from '../net/neighbour/arp-probe';
import { netMetrics, type NetMetrics } from '../net/metrics';
import type { NetlinkClient } from '../net/netlink/netlink';
import { OWNED_ADDRESS_PROTO, clientIdForService, linkNameForService, macForService } from '../net/ownership/ownership';
import { ETH_P_IP, PACKET_OUTGOING, type FrameInfo, type PacketSocket } from '../net/packet/packet';
import { PacketSocketGroup, type SharedPortOptions } from '../net/packet/packet-shared';
import { planOwnedLinks } from '../net/ownership/reconcile';
import type { SharedLink } from './shared-link';
import { ParentSysctls, applyVipSysctls, disableIpv6, prepareIpv6Link, vipSysctls, type VipRole } from '../net/sysctl/sysctl';
import { VipOwner, type VipConflict, type VipOwnerOptions } from '../net/neighbour/vip-owner';
import type { AddressSource, LostCause, SourceDamage, SourceState, SourceStatus, Vip } from '../source';
import type { StateStore } from '../state/store';
import {
  initialState, isStalled, step, unbindReason,
  type ClientAction, type ClientConfig, type UnbindCause, type ClientContext, type ClientEvent, type ClientState, type DhcpStateName,
} from './client';
import {
  BROADCAST_IP, BROADCAST_MAC, DHCP_CLIENT_FILTER, buildClientMessage, decodeReply, describePacket, encodeDhcp, encodeUdpFrame, replyClientMac,
  type ClientIdentity, type Reply,
} from './codec';
import { leaseDetails, leaseFileName, readSavedLease, toStored, type Lease } from './lease';
import { sharedStartLimiter, type ReleaseSlot, type StartLimiter } from './limiter';
import { judgeAddress, judgeReply, type GuardPolicy, type GuardReason, type HostView } from './guard';
import { addressAdded, addressRemoved, addressesChanged, localAddresses } from '../net/host/local-addresses';
import { dhcpMetrics, removeServiceSeries, type DhcpMetrics } from './metrics';

/** The VIP goes on the macvlan as a host address: no prefix route that would pull LAN traffic (health checks, proxying) onto the macvlan. */
export const VIP_PREFIX = 32;

/** The netlink verbs the driver uses (NetlinkClient has them all). */
export type NetlinkForDhcp = Pick<NetlinkClient, 'findLink' | 'getLink' | 'createMacvlan' | 'setLink' | 'deleteLink' | 'addAddress' | 'removeAddress' | 'listAddresses' | 'forgetNeighbour'>;

/**
 * Every DHCP service's frames, on one packet socket per parent NIC (UDP to
 * port 68; net/packet-shared.ts says why and how each frame finds its one
 * service). counts() tells a test the sharing is in use.
 */
export const dhcpSockets = new PacketSocketGroup({ protocol: ETH_P_IP, filter: DHCP_CLIENT_FILTER, owner: replyClientMac });

/** The packet-level verbs, injectable so another transport can stand in. Defaults: net/. */
export interface DhcpNetDeps {
  /** The service's DHCP frames: a port on its parent's shared socket (dhcpSockets). */
  dhcpSocket(opts: SharedPortOptions): PacketSocket;
  probeAddress: typeof arpProbe;
  /** Announces, defends and refreshes a bound VIP (net/vip-owner.ts). */
  vipOwner(opts: VipOwnerOptions): VipOwner;
  /**
   * arp_ignore / arp_announce (and rp_filter on macvlans): docs/design.md "ARP
   * flux". For the parent and an adopted macvlan; a macvlan this start
   * created gets them through netlink (NetlinkClient.setLink).
   */
  applySysctls(ifname: string, role: VipRole): Promise<unknown>;
  /** net.ipv6.conf.<macvlan>.disable_ipv6=1 before it goes up; false where the kernel has no IPv6. */
  disableIpv6?(ifname: string): Promise<boolean>;
  /** A dual-stack service's macvlan: IPv6 on for its DHCPv6 lease, no router advertisements or SLAAC (net/sysctl prepareIpv6Link). */
  prepareIpv6?(ifname: string): Promise<boolean>;
}

export interface DhcpSourceOptions {
  service: ServiceSpec;
  /** Parent NIC name. */
  parent: string;
  timings: DhcpTimings;
  /** RFC 5227 timings; refreshInterval (default DEFAULT_ARP's) for the bound VIP. */
  arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>>;
  store: StateStore;
  netlink: NetlinkForDhcp;
  log: Logger;
  registry: Registry;
  clock?: Clock;
  random?: () => number;
  /** Shared by every DHCP service of the agent; default: one per registry. */
  limiter?: StartLimiter;
  /** A dual-stack service: the macvlan's events for its DHCPv6 source (dhcp/shared-link.ts). */
  sharedLink?: SharedLink;
  /** The parent's ARP sysctls, shared by the daemon's start and every DHCP service; default: this source's own. */
  parentSysctls?: ParentSysctls;
  /**
   * Serve an unexpired saved lease at once, without a probe, and confirm it
   * in the background, even when its address is not on the macvlan (VRRP:
   * the election decided this node holds the VIP). Without it, only an
   * address found on the adopted macvlan resumes.
   */
  resumeSaved?: boolean;
  net?: Partial<DhcpNetDeps>;
  /** Which servers and addresses are accepted (dhcp.allowOtherSubnets, dhcp.servers); default: any server, parent's subnets only. */
  guard?: GuardPolicy;
  /** The VM's addresses when a reply arrives; default: read live (net/local-addresses.ts). */
  hostView?: () => HostView;
}

/**
 * The steps of an ordinary acquisition, logged at debug: "VIP ... bound" says
 * at info how it ended (address, server, lease time), and any other step
 * (NAK, decline, renewal, rebinding, expiry, stop) stays at info. Each
 * service's start would otherwise write three lines on the event loop.
 */
const ACQUIRING_STEPS: ReadonlySet<string> = new Set([
  'STOPPED>SELECTING', 'INIT>SELECTING', 'SELECTING>REQUESTING', 'REQUESTING>BOUND', 'STOPPED>INIT-REBOOT', 'INIT-REBOOT>BOUND',
] satisfies `${DhcpStateName}>${DhcpStateName}`[]);

/** A refused reply is logged at warn once per reason per interval; the counter has every one. */
const GUARD_WARN_INTERVAL_MS = 10_000;

const SOURCE_STATE: Record<DhcpStateName, SourceState> = {
  'STOPPED': 'idle',
  'INIT': 'acquiring',
  'SELECTING': 'acquiring',
  'REQUESTING': 'acquiring',
  'INIT-REBOOT': 'acquiring',
  'BOUND': 'bound',
  'RENEWING': 'renewing',
  'REBINDING': 'renewing',
};

export class DhcpSource extends EventEmitter implements AddressSource {
  readonly key: string;
  readonly ifname: string;
  readonly mac: string;
  private readonly parent: string;
  private arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>>;
  private readonly store: StateStore;
  private readonly netlink: NetlinkForDhcp;
  private readonly log: Logger;
  private readonly clock: Clock;
  private ctx: ClientContext;
  private readonly limiter: StartLimiter;
  private readonly metrics: DhcpMetrics;
  private readonly netM: NetMetrics;
  private readonly deps: Required<DhcpNetDeps>;
  private readonly identity: ClientIdentity;
  private readonly labels: { service: string; namespace: string };
  private readonly leaseFile: string;
  private readonly resumeSaved: boolean;
  /** The next start resumes an unexpired saved lease at once (a repair of a deleted macvlan). */
  private resumeNext = false;
  private readonly requestedIp: number | undefined;
  /** Whether offers are probed: the config's, or false under VRRP (wiring decides, a reload keeps it). */
  private readonly probeOffer: boolean;
  /** The service also has a DHCPv6 VIP on this macvlan (dual stack): IPv6 stays on. */
  private readonly withIpv6: boolean;
  private readonly sharedLink: SharedLink | undefined;

  private state: ClientState = initialState();
  private running = false;
  private failed: string | undefined;
  private lastReason: string | undefined;
  private ifindex: number | undefined;
  private socket: PacketSocket | undefined;
  private timer: TimerHandle | undefined;
  private vip: Vip | undefined;
  /** start()'s `known` address, for the run it starts. */
  private known: string | undefined;
  /** Announces, defends and refreshes the bound VIP; gone when unbound. */
  private owner: VipOwner | undefined;
  private slot: ReleaseSlot | undefined;
  private abort: AbortController | undefined;
  private startTask: Promise<void> = Promise.resolve();
  /** Address changes and link work, strictly in order. */
  private chain: Promise<void> = Promise.resolve();
  /** Bumped on stop: late probe verdicts of an earlier run are ignored. */
  private generation = 0;
  private guard: GuardPolicy;
  private readonly hostView: () => HostView;
  /** The parent NIC's index, from the last link set-up (the VIP's neighbour entry there is forgotten when it goes). */
  private parentIndex: number | undefined;
  private readonly guardWarned = new Map<GuardReason, number>();

  constructor(opts: DhcpSourceOptions) {
    super();
    this.key = opts.service.key;
    this.parent = opts.parent;
    this.arp = opts.arp;
    this.store = opts.store;
    this.netlink = opts.netlink;
    this.clock = opts.clock ?? realClock;
    this.ifname = linkNameForService(this.key);
    this.mac = macForService(this.key);
    this.labels = { service: opts.service.name, namespace: opts.service.namespace };
    this.log = lazyChild(opts.log, { module: 'dhcp', service: this.key, ifname: this.ifname });
    this.leaseFile = leaseFileName(this.key);
    this.resumeSaved = opts.resumeSaved ?? false;
    const t = opts.timings;
    this.requestedIp = opts.service.loadBalancerIP ? parseIPv4(opts.service.loadBalancerIP) : undefined;
    this.probeOffer = t.probeOffer;
    this.withIpv6 = opts.service.ipFamilies?.includes('IPv6') ?? false;
    this.sharedLink = opts.sharedLink;
    const random = opts.random ?? Math.random;
    this.ctx = { config: this.clientConfig(t), random };
    this.limiter = opts.limiter ?? sharedStartLimiter(opts.registry, { max: t.maxConcurrentStarts, jitterMs: t.retransmitJitter * 1000, clock: this.clock, random });
    this.metrics = dhcpMetrics(opts.registry);
    this.netM = netMetrics(opts.registry);
    const parentSysctls = opts.parentSysctls ?? new ParentSysctls();
    this.deps = {
      dhcpSocket: opts.net?.dhcpSocket ?? ((o: SharedPortOptions) => dhcpSockets.attach(o)),
      probeAddress: opts.net?.probeAddress ?? arpProbe,
      vipOwner: opts.net?.vipOwner ?? ((o: VipOwnerOptions) => new VipOwner(o)),
      applySysctls: opts.net?.applySysctls ?? ((ifname: string, role: VipRole) => (role === 'parent' ? parentSysctls.apply(ifname) : applyVipSysctls(ifname, role))),
      disableIpv6: opts.net?.disableIpv6 ?? ((ifname: string) => disableIpv6(ifname)),
      prepareIpv6: opts.net?.prepareIpv6 ?? ((ifname: string) => prepareIpv6Link(ifname)),
    };
    // RFC 2132 §3.14 hostname = the service name; §9.14 client id derived from the key (net/ownership.ts).
    this.identity = { mac: this.mac, clientId: clientIdForService(this.key), hostname: opts.service.name.slice(0, 63) };
    this.guard = opts.guard ?? { allowOtherSubnets: false, servers: [] };
    this.hostView = opts.hostView ?? (() => localAddresses(this.parent, this.ifname));
    this.showState('STOPPED');
  }

  private clientConfig(t: DhcpTimings): ClientConfig {
    return {
      requestedIp: this.requestedIp,
      probe: this.probeOffer && t.probeOffer,
      retransmitInitialMs: t.retransmitInitial * 1000,
      retransmitMaxMs: t.retransmitMax * 1000,
      retransmitJitterMs: t.retransmitJitter * 1000,
      declineWaitMs: t.declineWait * 1000,
    };
  }

  // --- AddressSource ---------------------------------------------------------

  /** A reload's arp: / dhcp: timings, used from the next exchange and probe on; the lease and the VIP stay. */
  reconfigure(settings: { arp: ArpTimings & Partial<Pick<ArpConfig, 'refreshInterval'>>; dhcp: DhcpConfig }): void {
    this.arp = settings.arp;
    this.owner?.retime(ownerTimings(settings.arp));
    this.ctx = { ...this.ctx, config: this.clientConfig(settings.dhcp) };
    this.guard = { allowOtherSubnets: settings.dhcp.allowOtherSubnets, servers: settings.dhcp.servers };
    this.log.info({ op: 'reconfigure' }, 'new DHCP and ARP timings in use from the next exchange');
  }

  /**
   * `known`: on a VRRP takeover, the VIP the previous Master advertised for
   * this service. With resumeSaved and no unexpired lease of our own it is
   * served at once and confirmed with the server (client.ts 'start'), after
   * the same checks as a server's answer (dhcp/guard.ts): an advert is a
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
    const gen = this.generation;
    this.emit('status');
    this.startTask = this.run(abort.signal, gen).catch(async (err) => {
      // Nothing half-applied: a start that failed leaves no macvlan or socket behind.
      this.socket?.close();
      this.socket = undefined;
      await this.deleteLink(this.log.child({ op: 'start' }));
      this.sharedLink?.failed(this.ifindex);
      this.fail(err);
    });
  }

  async stop(opts: { release: boolean; keep?: boolean }): Promise<void> {
    const log = this.log.child({ op: 'stop' });
    const wasRunning = this.running;
    this.running = false;
    this.abort?.abort();
    await this.startTask;
    if (opts.keep && !opts.release) {
      // A planned restart: the address stays on the macvlan and the lease on
      // disk; the next process resumes it (crash-only start) with no gap.
      await this.quiesce();
      const kept = this.vip?.address;
      this.state = initialState();
      this.vip = undefined;
      this.ifindex = undefined;
      log.info({ kept }, kept ? `stopped; ${kept} stays on ${this.ifname} for the next process` : 'stopped');
      this.emit('status');
      return;
    }
    if (wasRunning && this.state.name !== 'STOPPED') this.dispatch(opts.release ? { type: 'release' } : { type: 'stop' });
    await this.quiesce();
    // Shutdown, failover and removal all take the macvlan away: no stale MAC on the LAN.
    await this.deleteLink(log);
    if (opts.release) {
      // Removed from the config: nothing of the service may come back on the next start.
      this.forgetLease();
      await this.store.settled(this.leaseFile);
      removeServiceSeries(this.metrics, this.labels);
    } else {
      this.showState('STOPPED');
    }
    this.state = initialState();
    this.vip = undefined;
    this.failed = undefined;
    log.info({ release: opts.release }, opts.release ? 'stopped and released' : 'stopped; lease kept');
    this.emit('status');
  }

  /**
   * VRRP Backup: withdraw the VIP (lease kept, nothing sent) and keep the
   * service macvlan ready - created, with its MAC, down and without an
   * address - so a takeover is only: link up, address on, gratuitous ARPs.
   * A down macvlan sends and answers nothing on the LAN.
   */
  async standby(): Promise<void> {
    const log = this.log.child({ op: 'standby' });
    const wasRunning = this.running;
    this.running = false;
    this.abort?.abort();
    await this.startTask;
    if (wasRunning && this.state.name !== 'STOPPED') this.dispatch({ type: 'stop' });
    await this.quiesce();
    this.state = initialState();
    this.vip = undefined;
    this.failed = undefined;
    try {
      await this.ensureLink(log, undefined, false);
      log.info({ ifname: this.ifname }, 'Backup: service macvlan ready (down, no address); lease kept');
    } catch (err) {
      // Not ready is only slower: the takeover creates the link as a cold start does.
      log.warn({ err: errorMessage(err) }, 'could not keep the service macvlan ready');
    }
    this.ifindex = undefined;
    this.showState('STOPPED');
    this.emit('status');
  }

  /** No more timers, frames, owner or slot: late verdicts are ignored (generation), queued address work finishes. */
  private async quiesce(): Promise<void> {
    this.generation++;
    this.clearTimer();
    await this.chain;
    // The VIP's owner (announce, defence, refresh timer) goes with this process: the next one makes its own.
    this.closeOwner();
    this.socket?.close();
    this.socket = undefined;
    this.releaseSlot();
    await this.store.settled(this.leaseFile);
  }

  status(): SourceStatus {
    const s = this.state;
    let state: SourceState = this.failed ? 'failed' : this.running ? SOURCE_STATE[s.name] : 'idle';
    let reason = this.failed ?? this.lastReason;
    if (!this.failed && this.running && isStalled(s, this.ctx.config)) {
      state = 'pending';
      reason = `no DHCP offer after ${s.attempts} DISCOVERs from ${this.mac} on ${this.ifname} (parent ${this.parent})`;
    }
    if (this.running && s.name === 'STOPPED' && !this.failed) state = 'acquiring'; // link setup, or waiting for a start slot
    const wallOffset = this.clock.wallNow() - this.clock.now();
    const requestedIp = this.ctx.config.requestedIp;
    // The details (lease times as ISO strings, addresses as text) are built
    // when read, i.e. by the status API: the daemon reads status() for its
    // state and VIP on every step and every apply, and building them there
    // would be garbage nobody reads. `s` is the state of this call:
    // client.ts never mutates a state, it returns a new one.
    return {
      state, reason, vip: this.vip, ifname: this.ifname, mac: this.mac,
      get details(): Record<string, unknown> { return dhcpDetails(s, wallOffset, requestedIp); },
    };
  }

  // --- start-up ----------------------------------------------------------------

  private async run(signal: AbortSignal, gen: number): Promise<void> {
    const log = this.log.child({ op: 'start' });
    await this.store.settled(this.leaseFile);
    const saved = this.loadLease(log);
    const unexpired = saved !== undefined && saved.expiresAt > this.clock.now() ? saved : undefined;
    const known = unexpired || !this.resumeSaved ? undefined : this.knownAddress(log);
    // A lease that resumes sends one unicast REQUEST, no DISCOVER: it needs
    // no start slot (the slot and its jitter keep a boot from storming the
    // server) and must not wait behind one while clients use the VIP. The
    // macvlan is set up before the slot is asked for, whatever the start:
    // the slot bounds DHCP exchanges in flight, not link set-up, which sends
    // nothing to the server, so every service sets up its link while the
    // first ones exchange rather than a slot's worth at a time.
    const { index, kept, parentIndex } = await this.ensureLink(log, unexpired ? formatIPv4(unexpired.address) : undefined);
    this.ifindex = index;
    this.sharedLink?.up(index);
    if (signal.aborted) return;
    const resume = (unexpired !== undefined && (kept || this.resumeSaved || this.resumeNext)) || known !== undefined;
    this.resumeNext = false;
    if (!resume && !this.slot && !(await this.takeSlot(signal, gen))) return;
    const sock = this.deps.dhcpSocket({ parentIfindex: parentIndex, ifindex: index, mac: this.mac, log: this.log, metrics: this.netM });
    this.socket = sock;
    sock.on('frame', (frame: Buffer, info: FrameInfo) => {
      // Nothing a frame causes may throw into the socket's native callback.
      try {
        this.onFrame(frame, info);
      } catch (err) {
        this.log.error({ op: 'recv', err: errorMessage(err), stack: (err as Error).stack }, 'handling a DHCP frame failed');
      }
    });
    sock.on('error', (err: Error) => this.log.warn({ op: 'recv', err: err.message }, 'DHCP packet socket error'));
    log.info({ mac: this.mac, parent: this.parent, saved: saved ? formatIPv4(saved.address) : undefined, known: known === undefined ? undefined : formatIPv4(known), resume, adopted: kept }, 'DHCP client starting');
    this.dispatch({ type: 'start', saved, resume, known });
  }

  /** A start slot from the shared limiter; false when stopped while waiting. */
  private async takeSlot(signal: AbortSignal, gen: number): Promise<boolean> {
    const release = await this.limiter.acquire(signal);
    if (!release) return false;
    if (signal.aborted || gen !== this.generation) { release(); return false; }
    this.slot = release;
    return true;
  }

  /**
   * Create the macvlan, or adopt the one an earlier run left (SIGKILL, crash,
   * planned restart). On an adopted macvlan, `keep` (the saved lease's
   * address) stays where it is - clients are using it - and `kept` says so;
   * any other address there has no lease behind it and goes.
   */
  private async ensureLink(log: Logger, keep: string | undefined, up = true): Promise<{ index: number; kept: boolean; parentIndex: number }> {
    let kept = false;
    // Both at once (net/netlink.ts pipelines single requests): one wait for the
    // replies instead of two, with 50 services setting up on one event loop.
    const [parent, found] = await Promise.all([this.netlink.getLink(this.parent), this.netlink.findLink(this.ifname)]);
    let link = found;
    if (link) {
      const plan = planOwnedLinks([link, parent], new Map([[this.ifname, { mac: this.mac, parent: parent.index, mode: 'bridge' as const }]]));
      if (plan.foreign.length > 0) {
        throw new LbError('LB_ERR_NET_NETLINK', `interface ${this.ifname} exists but is not the agent's (MAC ${link.mac}); remove it so service ${this.key} can use the name`, { interface: this.ifname });
      }
      const recreate = plan.recreate[0];
      if (recreate) {
        log.info({ reason: recreate.reason }, 'recreating the service macvlan');
        await this.netlink.deleteLink(link.index);
        link = undefined;
      } else {
        for (const a of await this.netlink.listAddresses(link.index)) {
          if (a.address === keep && a.prefix === VIP_PREFIX) { kept = true; continue; }
          await this.netlink.removeAddress(link.index, a.address, a.prefix);
          addressesChanged();
          log.info({ address: `${a.address}/${a.prefix}` }, 'removed an address left on the adopted macvlan (no saved lease for it)');
        }
        log.info({ kept: kept ? keep : undefined }, kept ? `adopted the service macvlan with ${keep}: serving it while the lease is confirmed` : 'adopted the service macvlan');
      }
    }
    // The parent as just read: createMacvlan asks for it no second time, and takes the new link from the kernel's echo.
    const created = !link;
    if (!link) link = await this.netlink.createMacvlan({ name: this.ifname, parent, mac: this.mac, mode: 'bridge' });
    // docs/design.md "ARP flux": on the parent too, or the parent answers ARP for the VIP with its own MAC and
    // unicast replies to a RENEWING client (and every client connection) arrive where this socket cannot see them.
    await this.deps.applySysctls(parent.name, 'parent');
    // An adopted link's values are read and put right (and reported); a link
    // just created holds the kernel's defaults and gets the wanted values on
    // the request that brings it up (no procfs writes).
    if (!created) await this.deps.applySysctls(this.ifname, 'macvlan');
    // An IPv4-only service's macvlan exists for one IPv4 VIP and its DHCPv4
    // lease. With IPv6 on, each one came up with a link-local address and
    // sent DAD, MLD and router solicitations from the service MAC: a host
    // the LAN's routers learn for nothing, once per service, each multicast
    // cloned to every sibling macvlan (bridge mode) and the parent. Before
    // the link goes up, so not one frame of it leaves. A dual-stack DHCP
    // service's DHCPv6 lease rides the same macvlan (dhcp/driver6.ts): IPv6
    // stays on, without router advertisements or SLAAC.
    if (!link.up) await (this.withIpv6 ? this.deps.prepareIpv6(this.ifname) : this.deps.disableIpv6(this.ifname));
    // The DHCPv6 source's VIP on the link before its first frame moves the
    // service MAC here (a VRRP takeover): IPv6 clients follow the MAC.
    if (up && !link.up) await this.sharedLink?.beforeUp(link.index, { setTimeout: (fn, ms) => this.clock.setTimeout(fn, ms) });
    if (created || link.up !== up) {
      await this.netlink.setLink(link.index, { ...(link.up !== up ? { up } : {}), ...(created ? { inetConf: vipSysctls('macvlan') } : {}) });
    }
    this.parentIndex = parent.index;
    return { index: link.index, kept, parentIndex: parent.index };
  }

  /** start()'s known address as a number, when the guard would accept it as a server's yiaddr. */
  private knownAddress(log: Logger): number | undefined {
    if (this.known === undefined) return undefined;
    const ip = parseIPv4(this.known);
    if (ip === undefined) return undefined;
    const verdict = judgeAddress(ip, this.hostView(), this.guard);
    if (verdict === 'ok') return ip;
    this.metrics.dropped.inc({ reason: verdict });
    log.warn({ known: this.known, reason: verdict }, `the previous VRRP Master's address ${this.known} for this service is refused (${verdict}); asking a DHCP server instead`);
    return undefined;
  }

  private loadLease(log: Logger): Lease | undefined {
    const { lease, problem } = readSavedLease(this.store, this.key, this.mac, this.clock.wallNow() - this.clock.now());
    if (problem) log.warn({ file: this.leaseFile }, problem);
    return lease;
  }

  // --- the machine and its actions ---------------------------------------------

  private dispatch(ev: ClientEvent): void {
    const before = this.state.name;
    const r = step(this.ctx, this.state, ev, this.clock.now());
    this.state = r.state;
    if (r.reason === 'wrong-xid' || r.reason === 'unexpected-reply' || r.reason === 'wrong-server') {
      this.log.debug({ op: 'recv', reason: r.reason, state: before }, 'reply ignored');
    }
    for (const a of r.actions) this.perform(a);
    if (r.state.name !== before) {
      const to = r.state.name;
      this.log[ACQUIRING_STEPS.has(`${before}>${to}`) ? 'debug' : 'info']({ op: 'state', from: before, to, reason: r.reason }, `DHCP ${before} -> ${to}`);
      this.showState(to);
    }
    // The start slot bounds DHCP traffic to the server; once the ACK is in and
    // only the ARP probe of the address remains (seconds of waiting at the
    // RFC 5227 timings, no DHCP traffic), or once bound, stalled or stopped,
    // another service may go. Holding it through the probe made 50 services
    // take 5x as long as one.
    if (this.slot && (r.state.probing !== undefined || r.state.name === 'BOUND' || r.state.name === 'STOPPED' || isStalled(r.state, this.ctx.config))) this.releaseSlot();
    this.emit('status');
  }

  private perform(a: ClientAction): void {
    switch (a.type) {
      case 'send': return this.send(a);
      case 'setTimer': {
        this.clearTimer();
        const gen = this.generation;
        this.timer = this.clock.setTimeout(() => {
          this.timer = undefined;
          if (gen === this.generation && this.running) this.dispatch({ type: 'timer' });
        }, a.at - this.clock.now());
        return;
      }
      case 'clearTimer': return this.clearTimer();
      case 'probe': return this.probe(a.ip);
      case 'bind': return this.enqueue(async () => { await afterNextPoll(); await this.bind(a.lease); });
      case 'hold': return this.enqueue(() => this.putOn(a.address, 'the previous VRRP Master\'s VIP, confirming it with the DHCP server'));
      case 'unbind': return this.enqueue(() => this.unbind(a));
      case 'persist': return this.persist(a.lease);
      case 'forget': return this.forgetLease();
      case 'note': return this.note(a);
    }
  }

  private send(a: Extract<ClientAction, { type: 'send' }>): void {
    const sock = this.socket;
    if (!sock) return;
    const payload = encodeDhcp(buildClientMessage(a.message, this.identity));
    const broadcast = a.to.kind === 'broadcast';
    const frame = encodeUdpFrame({
      srcMac: this.mac,
      // Unicast to the server's (or relay router's) MAC learned from its ACK; if unknown, the IP alone addresses it.
      dstMac: broadcast ? BROADCAST_MAC : a.to.mac ?? BROADCAST_MAC,
      srcIp: a.srcIp,
      dstIp: broadcast ? BROADCAST_IP : a.to.ip,
      payload,
    });
    try {
      sock.send(frame);
      this.log.debug({ op: 'send', kind: a.message.kind, xid: a.message.xid, to: broadcast ? 'broadcast' : formatIPv4(a.to.kind === 'unicast' ? a.to.ip : 0) }, `DHCP${a.message.kind} sent`);
    } catch (err) {
      // Not fatal: the retransmission schedule tries again.
      this.log.warn({ op: 'send', kind: a.message.kind, err: errorMessage(err) }, 'DHCP send failed');
    }
  }

  private onFrame(frame: Buffer, info: FrameInfo): void {
    if (info.pktType === PACKET_OUTGOING) return;
    const r = decodeReply(frame, info, { xid: this.state.xid, mac: this.mac });
    if (!r.ok) {
      this.metrics.dropped.inc({ reason: r.reason });
      // Replies to other clients are everyday broadcast traffic; real damage is worth a debug line.
      if (r.reason !== 'wrong-chaddr' && r.reason !== 'wrong-xid') this.log.debug({ op: 'recv', reason: r.reason }, 'dropped a malformed DHCP frame');
      return;
    }
    this.log.debug({ op: 'recv', packet: describePacket(r.value.packet), from: r.value.frame.srcMac }, 'DHCP reply');
    if (!this.acceptable(r.value)) return;
    this.dispatch({ type: 'reply', packet: r.value.packet, serverMac: r.value.frame.srcMac });
  }

  /** dhcp/guard.ts: a reply the agent must not act on is dropped and counted before the state machine sees it. */
  private acceptable(r: Reply): boolean {
    const { message: m, fields: f } = r.packet;
    const verdict = judgeReply({
      kind: f.kind as 'OFFER' | 'ACK' | 'NAK', yiaddr: m.yiaddr, serverId: f.serverId, srcIp: r.frame.srcIp, routers: f.routers, prefix: f.prefix,
    }, this.hostView(), this.guard);
    if (verdict === 'ok') return true;
    this.metrics.dropped.inc({ reason: verdict });
    const now = this.clock.now();
    const level = now - (this.guardWarned.get(verdict) ?? -Infinity) >= GUARD_WARN_INTERVAL_MS ? 'warn' : 'debug';
    if (level === 'warn') this.guardWarned.set(verdict, now);
    this.log[level]({ op: 'recv', reason: verdict, packet: describePacket(r.packet), from: r.frame.srcMac }, `refused a DHCP ${f.kind} (${verdict}); not used`);
    return false;
  }

  private probe(ip: number): void {
    const gen = this.generation;
    const ifindex = this.ifindex;
    const verdict = (ev: ClientEvent): void => {
      if (gen !== this.generation || !this.running) return;
      if (this.state.probing?.address !== ip) return;
      this.dispatch(ev);
    };
    if (ifindex === undefined) { verdict({ type: 'probe-failed', error: 'no interface' }); return; }
    this.deps.probeAddress({ ifindex, mac: this.mac, ip, timings: this.arp, clock: this.clock, random: this.ctx.random, log: this.log, metrics: this.netM })
      .then((res) => {
        if (res.conflict) {
          this.lastReason = `offered ${formatIPv4(ip)} is in use by ${res.conflictingMac ?? 'another host'} (ARP probe); declined`;
          this.log.warn({ op: 'probe', ip: formatIPv4(ip), conflictingMac: res.conflictingMac }, 'offered address in use; declining');
          verdict({ type: 'probe-conflict', mac: res.conflictingMac });
        } else {
          verdict({ type: 'probe-ok' });
        }
      })
      .catch((err) => {
        this.log.warn({ op: 'probe', ip: formatIPv4(ip), err: errorMessage(err) }, 'ARP probe failed');
        verdict({ type: 'probe-failed', error: errorMessage(err) });
      });
  }

  private async bind(lease: Lease): Promise<void> {
    const address = formatIPv4(lease.address);
    const wanted = this.ctx.config.requestedIp;
    if (wanted !== undefined && wanted !== lease.address) {
      this.log.warn({ op: 'bind', loadBalancerIP: formatIPv4(wanted), address }, `loadBalancerIP ${formatIPv4(wanted)} was not granted; bound ${address}`);
    }
    // The lease's write ('persist', queued with this bind) runs while the
    // address goes on; the VIP is served only once the lease is on disk, so
    // a crash right after never leaves a served VIP the next start cannot
    // adopt (crash-only start).
    await this.putOn(lease.address, `lease from ${formatIPv4(lease.serverId)} for ${lease.leaseSeconds} s`, this.store.settled(this.leaseFile));
  }

  /**
   * The address on the macvlan, announced, defended and refreshed. An address
   * already held (a provisional one the server has now confirmed) stays as it
   * is: no second address change, burst or 'vip' event.
   */
  private async putOn(ip: number, why: string, saved: Promise<void> = Promise.resolve()): Promise<void> {
    const ifindex = this.ifindex;
    if (ifindex === undefined) return;
    const address = formatIPv4(ip);
    this.lastReason = undefined;
    if (this.vip?.address === address && this.vip.ifindex === ifindex && this.owner) {
      this.log.info({ op: 'bind', address, why }, `VIP ${address} confirmed`);
      this.emit('status');
      return;
    }
    await this.netlink.addAddress(ifindex, address, VIP_PREFIX, { proto: OWNED_ADDRESS_PROTO });
    addressAdded(this.ifname, ip);
    await saved;
    this.vip = { address, prefix: VIP_PREFIX, ifname: this.ifname, ifindex, mac: this.mac };
    this.log.info({ op: 'bind', address, why }, `VIP ${address} bound`);
    this.holdOnWire(ifindex, ip);
    this.emit('vip', this.vip);
    this.emit('status');
  }

  /**
   * RFC 5227 §2.3 announce, §2.4 defend and refresh the bound VIP on the
   * macvlan (net/vip-owner.ts). When another host insists on it, the client
   * gives it up with DHCPDECLINE (client.ts 'conflict').
   */
  private holdOnWire(ifindex: number, ip: number): void {
    this.closeOwner();
    const gen = this.generation;
    let owner: VipOwner;
    try {
      owner = this.deps.vipOwner({
        ifindex, mac: this.mac, ip, ...ownerTimings(this.arp), clock: this.clock, log: this.log, metrics: this.netM,
      });
    } catch (err) {
      this.log.warn({ op: 'announce', err: errorMessage(err) }, 'could not open the ARP socket: the VIP is neither announced nor defended');
      return;
    }
    this.owner = owner;
    owner.on('conflict', (c: VipConflict) => {
      this.lastReason = `${c.mac} claimed ${c.ip}; ${c.defended ? 'defended with one gratuitous ARP' : 'already defended within the defend interval'} (RFC 5227 §2.4)`;
      this.emit('status');
    });
    owner.on('lost', (c: VipConflict) => {
      if (gen !== this.generation || !this.running || this.owner !== owner) return;
      this.closeOwner();
      this.dispatch({ type: 'conflict', address: ip, mac: c.mac });
    });
    try {
      owner.start();
    } catch (err) {
      this.log.warn({ op: 'announce', err: errorMessage(err) }, 'gratuitous ARP failed');
    }
  }

  private closeOwner(): void {
    this.owner?.close();
    this.owner = undefined;
  }

  reannounce(): void {
    if (this.vip) this.owner?.reannounce();
  }

  /**
   * Put back what the kernel lost of the bound VIP: the address on the
   * macvlan, the macvlan up, or the macvlan itself. A deleted macvlan takes
   * its address and this client's socket port with it: the client starts
   * over on a new one - same name, same MAC - and resumes its saved lease at
   * once, confirming it with the server (INIT-REBOOT), as after a restart.
   */
  async repair(damage: SourceDamage): Promise<string | undefined> {
    const vip = this.vip;
    // No owner: an unbind is under way (it closes the owner first).
    if (!this.running || !vip || !this.owner) return undefined;
    if (damage !== 'link') {
      // In the address work's queue: after a bind or unbind in flight, never beside it.
      let out: string | undefined;
      this.enqueue(async () => { out = await this.repairInPlace(damage, vip); });
      await this.chain;
      return out;
    }
    try {
      await this.stop({ release: false, keep: true });
      this.resumeNext = true;
      this.start();
      return `recreating ${this.ifname} (MAC ${this.mac}) and resuming the lease on ${vip.address}`;
    } catch (err) {
      this.log.warn({ op: 'repair', damage, err: errorMessage(err) }, `could not repair ${this.ifname}`);
      return undefined;
    }
  }

  private async repairInPlace(damage: SourceDamage, vip: Vip): Promise<string | undefined> {
    if (!this.running || this.vip !== vip || !this.owner) return undefined;
    try {
      const done: string[] = [];
      if (damage === 'link-down') {
        await this.netlink.setLink(vip.ifindex, { up: true });
        done.push(`set ${vip.ifname} up`);
      }
      const on = (await this.netlink.listAddresses(vip.ifindex)).some((a) => a.address === vip.address && a.prefix === vip.prefix);
      if (!on) {
        await this.netlink.addAddress(vip.ifindex, vip.address, vip.prefix, { proto: OWNED_ADDRESS_PROTO });
        addressesChanged();
        done.push(`added ${vip.address}/${vip.prefix} to ${vip.ifname} again`);
      }
      // stop() ran meanwhile: it removes the macvlan, address and all.
      if (!this.running || this.vip !== vip) return undefined;
      this.owner?.reannounce();
      return done.length > 0 ? `${done.join(', ')} and announced it` : undefined;
    } catch (err) {
      this.log.warn({ op: 'repair', damage, err: errorMessage(err) }, `could not repair ${this.ifname}`);
      return undefined;
    }
  }

  private async unbind(a: Extract<ClientAction, { type: 'unbind' }>): Promise<void> {
    const reason = unbindReason(a, this.clock.wallNow() - this.clock.now());
    const address = formatIPv4(a.address);
    this.metrics.leaseExpiry.remove(this.labels);
    // No announcement, defence or refresh for an address we are giving up.
    this.closeOwner();
    // removeAddress forgets what the macvlan's neighbour table learnt of the
    // VIP. This node forwards the VIP's traffic out of the parent once it no
    // longer holds it (a VRRP Backup that clients still reach), and an entry
    // the parent learnt before (the holder of that time) would send it there,
    // maybe back and forth until the TTL runs out (pool VIPs, which live on
    // the parent, likewise). First, while the VIP is still local and the
    // entry unused: deleted after, it races the kernel's own resolution for
    // forwarded packets (docs/failover.md, "Connections across a failover").
    if (this.parentIndex !== undefined) {
      await this.netlink.forgetNeighbour(this.parentIndex, address).catch((err: unknown) => {
        this.log.warn({ op: 'unbind', address, err: errorMessage(err) }, 'could not forget the parent\'s neighbour entry of the VIP');
      });
    }
    if (this.ifindex !== undefined) {
      try {
        await this.netlink.removeAddress(this.ifindex, address, VIP_PREFIX);
        addressRemoved(this.ifname, a.address);
      } catch (err) {
        this.log.error({ op: 'unbind', address, err: errorMessage(err) }, 'could not remove the VIP');
      }
    }
    this.vip = undefined;
    if (a.cause !== 'stopped' && a.cause !== 'released') this.lastReason = reason;
    (a.cause === 'stopped' || a.cause === 'released' ? this.log.info.bind(this.log) : this.log.warn.bind(this.log))({ op: 'unbind', address, cause: a.cause }, reason);
    this.emit('lost', reason, LOST_CAUSE[a.cause]);
    this.emit('status');
  }

  /**
   * Save the lease off the event loop: a synchronous write and its two
   * fsyncs would block the loop once per service at start. The
   * store keeps this file's writes and removes in order; quiesce() and the
   * next start wait for them, so a restart never reads a stale file.
   */
  private persist(lease: Lease): void {
    const wallOffset = this.clock.wallNow() - this.clock.now();
    this.metrics.leaseExpiry.set(this.labels, Number.isFinite(lease.expiresAt) ? (lease.expiresAt + wallOffset) / 1000 : Infinity);
    this.store.writeAsync(this.leaseFile, toStored(lease, this.key, this.mac, wallOffset)).catch((err: unknown) => {
      // The lease still holds in memory; only a restart would start without it.
      this.log.error({ op: 'persist', err: errorMessage(err) }, 'could not save the lease');
    });
  }

  private forgetLease(): void {
    this.store.removeAsync(this.leaseFile).catch((err: unknown) => {
      this.log.error({ op: 'forget', err: errorMessage(err) }, 'could not remove the saved lease');
    });
  }

  private note(a: Extract<ClientAction, { type: 'note' }>): void {
    const m = this.metrics;
    switch (a.what) {
      case 'acquired':
        if (a.ms !== undefined) m.acquireDuration.observe(this.labels, a.ms / 1000);
        return;
      case 'renewed': m.renewals.inc(this.labels); return;
      case 'rebinding':
        m.rebinds.inc(this.labels);
        this.log.warn({ op: 'rebind' }, 'no renewal from the server by T2; asking any server (REBINDING)');
        return;
      case 'nak':
        m.naks.inc(this.labels);
        this.lastReason = `DHCPNAK${a.detail ? `: ${a.detail}` : ''}`;
        this.log.warn({ op: 'nak', message: a.detail }, 'DHCPNAK received');
        return;
      case 'declined': m.declines.inc(this.labels); return;
      case 'expired': m.expiries.inc(this.labels); return;
      case 'request-timeout':
        this.lastReason = 'no answer to DHCPREQUEST; starting over';
        return;
      case 'reboot-timeout':
        this.log.warn({ op: 'init-reboot' }, 'no server answered INIT-REBOOT; using the saved lease if it is still valid');
        return;
      case 'renewing': return;
      case 'resumed':
        this.log.info({ op: 'resume' }, 'serving the saved lease at once; confirming it with the server');
        return;
    }
  }

  // --- helpers ------------------------------------------------------------------

  /** The state lbagent_dhcp_state shows for this service from its next scrape on (DhcpStates). */
  private showState(name: DhcpStateName): void {
    this.metrics.states.show(this.labels, name);
  }

  private enqueue(fn: () => Promise<void>): void {
    this.chain = this.chain.then(fn).catch((err) => this.fail(err));
  }

  private clearTimer(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private releaseSlot(): void {
    const s = this.slot;
    this.slot = undefined;
    s?.();
  }

  private fail(err: unknown): void {
    this.failed = errorMessage(err);
    this.log.error({ op: 'fail', err: this.failed, code: (err as LbError).code }, 'DHCP address source failed');
    this.releaseSlot();
    this.emit('status');
  }

  private async deleteLink(log: Logger): Promise<void> {
    try {
      const link = this.ifindex !== undefined ? await this.netlink.findLink(this.ifindex) : await this.netlink.findLink(this.ifname);
      if (link && link.name === this.ifname && link.mac === this.mac) await this.netlink.deleteLink(link.index);
    } catch (err) {
      log.error({ err: errorMessage(err) }, 'could not delete the service macvlan');
    }
    this.ifindex = undefined;
  }
}

/**
 * Resolves in the check phase after the event loop's next poll for I/O: the
 * frames and replies already waiting are handled first. A bind (address on,
 * lease saved, VIP announced: netlink round trips, an ARP socket, log lines)
 * waits for it, so that with many services starting, the other services'
 * OFFERs and ACKs are answered before the binds of the ones already ACKed:
 * each limiter wave waits on those exchanges, and an OFFER left behind the
 * previous wave's binds delays the whole wave.
 * Alone, the bind waits two turns of an idle loop.
 */
function afterNextPoll(): Promise<void> {
  return new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
}

/** status()'s details of one client state: the lease (or the address being probed), the offer, the address asked for. */
function dhcpDetails(s: ClientState, wallOffset: number, requestedIp: number | undefined): Record<string, unknown> {
  const lease = s.lease ?? s.probing;
  return {
    state: s.name,
    ...(lease ? leaseDetails(lease, wallOffset) : {}),
    ...(s.probing ? { probing: formatIPv4(s.probing.address) } : {}),
    ...(s.offer ? { offered: formatIPv4(s.offer.address), offeredBy: formatIPv4(s.offer.serverId) } : {}),
    ...(s.name === 'INIT-REBOOT' && s.saved ? { requested: formatIPv4(s.saved.address) } : {}),
    ...(requestedIp !== undefined ? { loadBalancerIP: formatIPv4(requestedIp) } : {}),
  };
}

/** Construct the DHCP address source of one service. */
export function createDhcpSource(opts: DhcpSourceOptions): DhcpSource {
  return new DhcpSource(opts);
}

/** Why the client gave a VIP up, as the daemon counts interruptions. */
const LOST_CAUSE: Readonly<Record<UnbindCause, LostCause>> = {
  expired: 'lease-expired', nak: 'nak', 'address-changed': 'address-changed', conflict: 'conflict',
  released: 'released', stopped: 'stopped', unconfirmed: 'other',
};
