// The services' runtimes: for each configured service its address source,
// the VIP an earlier run left serving (crash-only start), its interruptions,
// and the VRRP gating that starts and stops the source as mastership moves.
// It owns the map of runtimes; the daemon gives it narrow callbacks (an
// apply, an event, a status line) and reads the VIPs this node serves from it.
import type { Desired, PortSpec, ServiceSpec } from '../config/types';
import type { AddressSource, LostCause, SourceDamage } from '../source';
import type { Clock } from '../clock';
import { isoTime } from '../clock';
import { errorMessage } from '../errors';
import type { Logger } from '../log';
import type { TopologySelection } from '../forward/topology';
import type { StatusEvent, StatusEventKind } from './events';
import type { DaemonMetrics } from './metrics';
import type { HeldVip } from './drift-plan';
import type { Subsystems } from './subsystems';
import { lateModules } from './late-load';
import { linkKeyOf } from '../config/families';

export interface ServiceRuntime {
  spec: ServiceSpec;
  source: AddressSource | undefined;
  /** When this runtime was (re)created: a reload that keeps a service keeps this. */
  startedAt: number;
  /** VRRP gating of the source, one start/stop at a time (gateSource). Never rejects. */
  gate: Promise<void>;
  gatePending: boolean;
  /**
   * Crash-only start: the VIP an earlier run left serving (observeHeld),
   * forwarded from the first moment until the source confirms it ('vip') or
   * disproves it ('lost', pending, failed).
   */
  held: string | undefined;
  /** The VIP was adopted from an earlier run at start. */
  adopted: boolean;
  interruptions: number;
  lastInterruption: { at: string; reason: string } | undefined;
  /** The backend set in use at the last apply, to log when it moves. */
  topology: TopologySelection | undefined;
}

/** What the runtimes need of the subsystems. */
export type ServiceSubsystems = Pick<Subsystems, 'createSource' | 'failover' | 'dataplane'>;

export interface ServiceRuntimesOptions {
  readonly log: Logger;
  readonly clock: Clock;
  /** The subsystems, once built. */
  subs(): ServiceSubsystems | undefined;
  /** The config in force: a source is built with its timings and guard. */
  config(): Desired | undefined;
  /** The daemon is stopping: no gating step and no repair runs any more. */
  stopping(): boolean;
  metrics(): DaemonMetrics | undefined;
  /** Are this VIP's rules in the kernel now (ApplyLoop.hasVip)? */
  hasRules(vip: string): boolean;
  /** A data path transaction soon (coalesced). */
  scheduleApply(): void;
  /** A data path transaction now, not batched. */
  applyNow(): Promise<void>;
  noteEvent(kind: StatusEventKind, ev: Omit<StatusEvent, 'at' | 'kind'>): void;
  /** A status line once this turn's events are handled. */
  notifyStatusSoon(): void;
  /** What status shows changed, with no line for systemd (a source's step: its state, a renewal's times). */
  statusChanged?(): void;
}

/**
 * Whether a service's address source is still acquiring for the start's
 * batch: acquiring, or bound but not yet on the interface (a DHCP ACK whose
 * address and lease are being put in place; a write there forked the agent
 * between the last ACK and the last bind).
 */
export function acquiringNow(rt: Pick<ServiceRuntime, 'source'>): boolean {
  const st = rt.source?.status();
  return st !== undefined && (st.state === 'acquiring' || (st.state === 'bound' && st.vip === undefined));
}

export class ServiceRuntimes {
  private readonly runtimes = new Map<string, ServiceRuntime>();
  /** VIPs withdrawn by the daemon's stop (their sources stopped), for its last line. */
  withdrawnAtStop = 0;
  /** The runtime acquiring() last found acquiring: asked first next time. */
  private lastAcquiring: ServiceRuntime | undefined;
  /**
   * Each primary runtime's VIP as vipOf last worked it out: forgotten at
   * every event of its source (the source emits 'status' on any change of
   * its status) and whenever held changes, so a scrape or a forwarding
   * state asks a source for its status once per change, not once per read.
   */
  private readonly vips = new WeakMap<ServiceRuntime, { readonly vip: string | undefined }>();
  /** Moves whenever a runtime is added, removed, reordered or given a new spec: a view kept by it is read again. */
  private generation_ = 0;

  constructor(private readonly opts: ServiceRuntimesOptions) {}

  get size(): number { return this.runtimes.size; }

  /** Unchanged while the runtimes, their order and their specs stay (a view built from them may be kept). */
  get generation(): number { return this.generation_; }

  get(key: string): ServiceRuntime | undefined { return this.runtimes.get(key); }

  /** In config order (reorder()). */
  values(): IterableIterator<ServiceRuntime> { return this.runtimes.values(); }

  add(spec: ServiceSpec, held?: string): void {
    const rt: ServiceRuntime = {
      spec, source: undefined, startedAt: this.opts.clock.wallNow(), gate: Promise.resolve(), gatePending: false,
      held, adopted: held !== undefined, interruptions: 0, lastInterruption: undefined, topology: undefined,
    };
    if (spec.primaryService === undefined) {
      const source = this.opts.subs()!.createSource(spec, this.opts.config()!);
      let lastVip: string | undefined; // for the event when it is lost
      source.on('vip', () => {
        this.vips.delete(rt);
        const adopted = rt.held;
        rt.held = undefined;
        const st = source.status();
        lastVip = st.vip?.address;
        this.opts.noteEvent('vip-gained', { service: spec.key, address: lastVip, reason: st.reason ?? `${spec.ipam} VIP ${st.state}` });
        // What the kernel recorded of this address while it was elsewhere
        // goes (forward/dataplane.ts vipArrived). Only VRRP moves a VIP
        // between nodes; not for a VIP an earlier run left on this node,
        // which never was elsewhere.
        const subs = this.opts.subs();
        if (subs?.failover && lastVip !== undefined && lastVip !== adopted) void subs.dataplane.vipArrived?.(lastVip, this.portsOf(spec.key));
        this.opts.scheduleApply(); this.opts.notifyStatusSoon();
      });
      source.on('lost', (reason: string, cause: LostCause = 'other') => {
        this.vips.delete(rt);
        // A stop withdraws every VIP: counted for the stop's last line, not a
        // warning each (a thousand lines to journald in a stop of a thousand services).
        if (cause === 'stopped' && this.opts.stopping()) this.withdrawnAtStop++;
        else this.opts.log.warn({ op: 'vip-lost', service: spec.key, reason, cause }, 'VIP withdrawn');
        rt.held = undefined;
        this.opts.noteEvent('vip-lost', { service: spec.key, address: lastVip, reason });
        if (!this.opts.stopping() && this.runtimes.get(spec.key) === rt && cause !== 'stopped' && cause !== 'released') this.noteInterruption(rt, reason, cause);
        this.opts.scheduleApply();
        this.opts.notifyStatusSoon();
      });
      source.on('status', () => {
        this.vips.delete(rt);
        // Every step of every source emits 'status': read it only when a held VIP could be lost by it.
        if (rt.held !== undefined) {
          const st = source.status();
          if (st.state === 'pending' || st.state === 'failed') {
            this.noteInterruption(rt, st.reason ?? st.state, 'other');
            rt.held = undefined;
          }
        }
        this.opts.scheduleApply();
        this.opts.statusChanged?.();
      });
      rt.source = source;
    }
    this.runtimes.set(spec.key, rt);
    this.generation_++;
  }

  /**
   * A reload's removal: the service leaves the runtimes before the first
   * await (a secondary is gone before its primary's source stops), then its
   * source releases the lease or claim.
   */
  async remove(key: string): Promise<void> {
    const rt = this.runtimes.get(key);
    this.runtimes.delete(key);
    this.generation_++;
    if (rt) await rt.gate; // a VRRP start/stop in flight finishes first
    if (rt?.source) await rt.source.stop({ release: true }).catch((e) => this.opts.log.error({ op: 'reload', service: key, err: errorMessage(e) }, 'release failed'));
  }

  /** A reload's restart of a source whose address changes: the old one stops, a new runtime takes its place. */
  async restart(key: string, spec: ServiceSpec, release: boolean): Promise<void> {
    const rt = this.runtimes.get(key);
    if (rt) {
      await rt.gate;
      if (rt.source) await rt.source.stop({ release }).catch((e) => this.opts.log.error({ op: 'reload', service: key, err: errorMessage(e) }, 'stopping the old address source failed'));
    }
    this.runtimes.delete(key);
    this.generation_++;
    this.add(spec);
  }

  /** A reload's update in place: the source stays. */
  update(key: string, spec: ServiceSpec): void {
    const rt = this.runtimes.get(key);
    if (rt) { rt.spec = spec; rt.startedAt = this.opts.clock.wallNow(); this.generation_++; }
  }

  /** New timings for every running source. */
  reconfigureSources(settings: Pick<Desired, 'arp' | 'dhcp'>): void {
    for (const rt of this.runtimes.values()) rt.source?.reconfigure?.({ arp: settings.arp, dhcp: settings.dhcp });
  }

  /** Put the runtimes in the order of these keys (the config's, for status). */
  reorder(keys: readonly string[]): void {
    // Already in that order (a reload that moved no service): nothing to rebuild.
    if (keys.length === this.runtimes.size) {
      let i = 0;
      let same = true;
      for (const k of this.runtimes.keys()) if (k !== keys[i++]) { same = false; break; }
      if (same) return;
    }
    const order = new Map(keys.map((k, i) => [k, i]));
    const sorted = [...this.runtimes.entries()].sort((a, b) => (order.get(a[0]) ?? 0) - (order.get(b[0]) ?? 0));
    this.runtimes.clear();
    for (const [k, v] of sorted) this.runtimes.set(k, v);
    this.generation_++;
  }

  /** Stop every source (each after its VRRP step in flight), all together; `step` logs each failure. */
  async stopSources(opts: { release: boolean; keep?: boolean }, step: (what: string, fn: () => unknown) => Promise<void>): Promise<void> {
    await Promise.all([...this.runtimes.values()].map((rt) => step(`service ${rt.spec.key}`, async () => {
      await rt.gate;
      await rt.source?.stop(opts);
    })));
  }

  /** The ports of a primary service and of every service sharing its VIP. */
  portsOf(primaryKey: string): PortSpec[] {
    return [...this.runtimes.values()].filter((r) => (r.spec.primaryService ?? r.spec.key) === primaryKey).flatMap((r) => r.spec.ports);
  }

  /** Start sources this node should hold (all, or the VRRP Master's). */
  startSources(): void {
    for (const rt of this.runtimes.values()) {
      if (!rt.source) continue;
      if (this.opts.subs()?.failover) this.gateSource(rt.spec.key);
      else rt.source.start();
    }
  }

  holds(key: string): boolean {
    const f = this.opts.subs()?.failover;
    return f ? f.isMaster(key) : true;
  }

  updateFailover(): void {
    const f = this.opts.subs()?.failover;
    if (!f) return;
    const primaries = [...this.runtimes.values()].filter((r) => r.source).map((r) => r.spec);
    f.update(primaries, (key) => this.runtimes.get(key)?.source?.status().vip?.address);
  }

  onFailoverChange(keys: string[]): void {
    for (const key of keys) {
      const master = this.holds(key);
      const f = this.opts.subs()?.failover?.status(key);
      const backup = f?.state === 'fault' ? 'VRRP fault (a tracked interface or service failed)' : `VRRP Backup${f?.master ? `, Master ${String(f.master)}` : ''}`;
      this.opts.noteEvent(master ? 'vrrp-master' : 'vrrp-backup', { service: key, reason: master ? 'this node is VRRP Master' : backup });
    }
    for (const key of keys) this.gateSource(key);
    this.opts.scheduleApply();
  }

  /** VRRP asks the Master to announce its VIPs again. */
  reannounce(keys: readonly string[]): void {
    for (const k of keys) if (this.holds(k)) this.runtimes.get(k)?.source?.reannounce?.();
  }

  /**
   * Start or stop a service's source to match VRRP mastership, one step at a
   * time per service: a withdrawal must finish before the next start (a
   * source's stop() is asynchronous, and a start during it races the link
   * and address it is removing). A step reads holds() when it runs, so a
   * flap that queues behind a running step collapses into one step.
   */
  gateSource(key: string): void {
    const rt = this.runtimes.get(key);
    if (!rt?.source || rt.gatePending) return;
    rt.gatePending = true;
    rt.gate = rt.gate.then(async () => {
      rt.gatePending = false;
      const source = rt.source;
      if (!source || this.opts.stopping() || this.runtimes.get(key) !== rt) return;
      const running = source.status().state !== 'idle';
      if (this.holds(key)) {
        if (!running) {
          this.opts.log.info({ op: 'failover', service: key }, 'this node is Master: taking the VIP');
          // Rules first (armedVip), then the address: a takeover claims the
          // VIP without an ARP probe, so it could otherwise come up before
          // the rules and refuse the first clients.
          // Rules a ready Backup armed are in place already (the apply loop
          // says so even while an apply that keeps them is under way): no
          // wait for the no-op apply this transition scheduled, nor for a
          // counter read it queues behind (tens of ms of a takeover).
          const armed = this.armedVip(rt.spec);
          if (armed !== undefined && !this.opts.hasRules(armed)) await this.opts.applyNow();
        }
        const known = this.opts.subs()?.failover?.knownVip?.(key);
        source.start(known === undefined ? {} : { known });
      } else {
        if (running) this.opts.log.info({ op: 'failover', service: key }, 'this node is Backup: withdrawing the VIP (lease and claim kept)');
        // Also when idle: the first Backup after a crash withdraws the VIP an
        // earlier run left; a ready Backup keeps the rest (standby).
        if (source.standby) await source.standby();
        else await source.stop({ release: false });
      }
    }).catch((e) => this.opts.log.error({ op: 'failover', service: key, err: errorMessage(e) }, 'starting or withdrawing the VIP failed'));
  }

  /**
   * With VRRP and the kernel data path, a ready Backup keeps the rules for
   * every VIP it knows of in place (forwarding rules waiting), so
   * a takeover is only the address and gratuitous ARPs: the first client a
   * gratuitous ARP sends our way is forwarded, not refused by a node that
   * holds the address but has no rules yet. The rules are inert until the
   * address is ours: the dispatch matches only a local destination, so a
   * client that still sends to a Backup after it yielded is not forwarded
   * into a connection the new Master would reset (forward/nft.ts). The proxy cannot
   * listen on an address it does not have, so it waits for the VIP.
   */
  armedVip(spec: ServiceSpec): string | undefined {
    const subs = this.opts.subs();
    const f = subs?.failover;
    if (!f?.knownVip || subs?.dataplane.kind !== 'kernel') return undefined;
    return f.knownVip(spec.primaryService ?? spec.key);
  }

  /** The VIP a service is served on by this node, if any. */
  vipOf(spec: ServiceSpec): string | undefined {
    const primaryKey = spec.primaryService ?? spec.key;
    const prt = this.runtimes.get(primaryKey);
    if (prt === undefined) return undefined;
    const kept = this.vips.get(prt);
    if (kept !== undefined) return kept.vip;
    const st = prt.source?.status();
    const vip = st && (st.state === 'bound' || st.state === 'renewing') && st.vip ? st.vip.address : prt.held;
    this.vips.set(prt, { vip });
    return vip;
  }

  /** The VIPs this node holds now, as their sources report them (the drift guard's view of what must be in the kernel). */
  heldVips(): HeldVip[] {
    const out: HeldVip[] = [];
    for (const rt of this.runtimes.values()) {
      if (!rt.source || !this.holds(rt.spec.key)) continue;
      const st = rt.source.status();
      if ((st.state !== 'bound' && st.state !== 'renewing') || !st.vip) continue;
      const v = st.vip;
      const { linkNameForService, macForService } = lateModules();
      out.push({
        key: rt.spec.key, address: v.address, prefix: v.prefix, ifindex: v.ifindex, ifname: v.ifname,
        link: rt.spec.ipam === 'dhcp' ? { name: linkNameForService(linkKeyOf(rt.spec.key)), mac: macForService(linkKeyOf(rt.spec.key)) } : undefined,
      });
    }
    return out;
  }

  /** A source's repair, in line with its VRRP start/stop steps (gateSource). */
  repairSource(key: string, damage: SourceDamage): Promise<string | undefined> {
    const rt = this.runtimes.get(key);
    if (!rt?.source?.repair) return Promise.resolve(undefined);
    const source = rt.source;
    const done = rt.gate.then(() => (this.runtimes.get(key) === rt && !this.opts.stopping() ? source.repair!(damage) : undefined));
    rt.gate = done.then(() => undefined, () => undefined);
    return done;
  }

  /** A served VIP went away while its service stays configured: counted by reason, kept for status. */
  noteInterruption(rt: ServiceRuntime, reason: string, cause: LostCause): void {
    rt.interruptions++;
    rt.lastInterruption = { at: isoTime(this.opts.clock.wallNow()), reason };
    this.opts.metrics()?.interrupted(rt.spec.name, rt.spec.namespace, cause);
  }

  /**
   * Is an address source still acquiring (acquiringNow)? The runtime found
   * acquiring last time is asked first: it usually still is, and a scan from
   * the start would walk the services already bound at every change: n x n
   * status() calls over a start of n services.
   */
  acquiring(): boolean {
    const still = this.lastAcquiring !== undefined && this.runtimes.get(this.lastAcquiring.spec.key) === this.lastAcquiring && acquiringNow(this.lastAcquiring);
    if (!still) {
      this.lastAcquiring = undefined;
      for (const rt of this.runtimes.values()) if (acquiringNow(rt)) { this.lastAcquiring = rt; break; }
    }
    return this.lastAcquiring !== undefined;
  }

  /** Does every source have its VIP, with that VIP's rules in place? */
  everyVipInPlace(): boolean {
    for (const rt of this.runtimes.values()) {
      if (!rt.source) continue;
      const vip = rt.source.status().vip?.address;
      if (vip === undefined || !this.opts.hasRules(vip)) return false;
    }
    return true;
  }
}
