// The drift guard (driver): keeps the kernel holding what the agent put
// there while others change it. It observes - rtnetlink link and address
// notifications, nftables commit notifications, the sysctls the agent set,
// and a periodic full re-read as the safety net for a lost notification -
// runs the pure comparison of daemon/drift-plan.ts over the held VIPs and
// that snapshot, and has each difference repaired by its owner: the address
// source for its address and macvlan, the data path for its tables, the
// sysctl table for the values. Every repair is logged, counted and reported;
// a subject repaired too often backs off (FightTracker).
//
// It touches only what the agent owns: the VIPs its sources hold, its
// 02: macvlans, its tables, the sysctls it sets.
import { closeSync, openSync, readSync } from 'node:fs';
import type { Registry } from 'prom-client';
import { Counter, Gauge } from '../metrics/prom';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { errorMessage } from '../errors';
import type { Logger } from '../log';
import type { AddressInfo, LinkInfo, NetlinkClient, NetlinkWatcher } from '../net/netlink/netlink';
import type { NftCommit, NftWatcher } from '../net/netlink/nft-watch';
import { OWNED_ADDRESS_PROTO } from '../net/ownership/ownership';
import { applyVipSysctls, ifSysctlPath, readIfSysctl, vipSysctls, type VipRole } from '../net/sysctl/sysctl';
import type { SourceDamage } from '../source';
import {
  DEFAULT_FIGHT, DRIFT_KINDS, FightTracker, TableChanges, driftSubject, planDrift,
  type Drift, type DriftKind, type FightConfig, type HeldVip, type KernelSnapshot, type ObservedLink, type Wanted,
} from './drift-plan';

/** The data path's part: its tables (kernel path only). */
export interface TableOwner {
  /** "family name" of every table the path owns now. */
  ownedTables(): string[];
  /** Was the commit of this pid (the initial namespace's), or of a socket with this port (nft's pid in its own namespace), the path's own write? */
  ownsCommit(pid: number | undefined, port?: number): boolean;
  /** Write the tables again, whole; true when written. */
  repair(): Promise<boolean>;
  /** The forwarding sysctls back to 1 where someone turned one off: each one put back, with the value found. */
  keepForwarding(): Promise<ReadonlyArray<{ readonly sysctl: string; readonly found: number }>>;
  /**
   * A program the path owns beside its tables (the eBPF NAT engine's), where
   * someone undid it: read at every resync, repaired by repairProgram() (its
   * subject is a drift of kind 'table', its table left alone).
   */
  programsUndone?(): ReadonlyArray<{ readonly subject: string; readonly found: string }>;
  /**
   * Put back the program named `subject` (one programsUndone() reported),
   * its maps and its plan. Resolves with what was done (also when the
   * program could not be put back and the path serves without it), or
   * undefined to be tried again.
   */
  repairProgram?(subject: string): Promise<string | undefined>;
}

export interface DriftGuardOptions {
  readonly netlink: Pick<NetlinkClient, 'listLinks' | 'listAddresses' | 'watch' | 'deleteLink' | 'removeAddress'>;
  /** Opens the nftables watch (kernel path); undefined: no tables to keep. */
  readonly nftWatch?: (() => NftWatcher) | undefined;
  readonly tables?: TableOwner | undefined;
  /** The parent NIC: its sysctls are kept and its own address followed. */
  readonly parent: { readonly name: string; readonly index: number };
  /** The other networks' NICs (config/networks.ts): their sysctls are kept and their marked addresses accounted for, as the parent's. */
  readonly networkParents?: readonly { readonly name: string; readonly index: number }[] | undefined;
  /** The VIPs held now (read at every check: never a copy). */
  held(): HeldVip[];
  /**
   * The links and pool addresses the configuration in force accounts for
   * (read at every check). Absent, or undefined: leftovers are not looked for.
   */
  wanted?(): Wanted | undefined;
  /** Has the service's source put back what it lost; what it did, or undefined when nothing was done. */
  repairSource(key: string, damage: SourceDamage): Promise<string | undefined>;
  /** A repair, or a back-off, happened: for the status events. */
  onRepair?(ev: DriftEvent): void;
  /** The parent's own IPv4 address changed (undefined: it has none now). */
  onParentAddress?(address: string | undefined): void;
  /** Another network's NIC (networkParents) changed its own IPv4 address (undefined: it has none now). */
  onNetworkAddress?(ifname: string, address: string | undefined): void;
  readonly log: Logger;
  readonly registry?: Registry | undefined;
  readonly clock?: Clock;
  /** The full re-read's period (ms), read at every period: a reload changes it. */
  resyncMs(): number;
  /** How often the parent's ARP sysctls are read (ms; they have no notification); macvlans' at every resync. */
  readonly sysctlPollMs?: number;
  /** Notifications settle this long before a check (ms): a change the agent makes itself lands first. */
  readonly settleMs?: number;
  readonly fight?: FightConfig;
}

export interface DriftEvent {
  readonly kind: DriftKind;
  readonly subject: string;
  /** The service, for drift of a VIP. */
  readonly service?: string | undefined;
  readonly found: string;
  /** What was done; undefined while backing off. */
  readonly done?: string | undefined;
  /** Set while the subject is fought over: the repairs in the window. */
  readonly fight?: { readonly repairs: number; readonly windowSeconds: number } | undefined;
}

export interface DriftStatus {
  readonly repairs: Readonly<Record<DriftKind, number>>;
  /** Subjects another program keeps undoing, e.g. "table ip lb_agent: 12 repairs in 60 s". */
  readonly fights: readonly string[];
  /** Drift found and not yet repaired (backing off, or the repair failed). */
  readonly outstanding: readonly string[];
  readonly lastResync: number | undefined;
}

/**
 * The parent's arp_ignore / arp_announce are read this often: the kernel
 * announces no change to them, and a parent answering ARP for a macvlan's
 * VIP with its own MAC breaks that VIP's connections. Two small procfs
 * reads; a full check runs only when one is off.
 */
const SYSCTL_POLL_MS = 250;

const IPV6_FORWARDING = '/proc/sys/net/ipv6/conf/all/forwarding';

/**
 * Small integer files read again and again (the polled sysctls), each kept
 * open and read from offset 0: one pread(2) a read, where opening it each
 * time walks /proc/sys and costs open, fstat, two reads and a close - at
 * four polls a second, the largest part of the guard's idle cost. A file
 * that fails or holds no integer (its interface renamed or gone) is closed
 * and opened again at the next read; a value is parsed from the bytes, without a string.
 * Exported for its unit test.
 */
export class KeptReads {
  private readonly fds = new Map<string, number>();
  private readonly buf = Buffer.alloc(32);

  /** The file's value as an integer; undefined when it cannot be opened or read, or holds no integer. */
  read(file: string): number | undefined {
    let fd = this.fds.get(file);
    try {
      if (fd === undefined) this.fds.set(file, fd = openSync(file, 'r'));
      const v = parseInteger(this.buf, readSync(fd, this.buf, 0, this.buf.length, 0));
      // Not a value: opened again at the next read, in case the file was replaced.
      if (v === undefined) this.forget(file);
      return v;
    } catch {
      this.forget(file);
      return undefined;
    }
  }

  close(): void {
    for (const file of [...this.fds.keys()]) this.forget(file);
  }

  private forget(file: string): void {
    const fd = this.fds.get(file);
    this.fds.delete(file);
    if (fd !== undefined) try { closeSync(fd); } catch { /* already gone */ }
  }
}

/** A non-negative decimal integer and its line end, from the first n bytes; undefined for anything else. Pure. */
export function parseInteger(buf: Buffer, n: number): number | undefined {
  let v = 0;
  let digits = 0;
  let i = 0;
  for (; i < n; i++) {
    const c = buf[i]!;
    if (c < 48 || c > 57) break;
    v = v * 10 + (c - 48);
    digits++;
  }
  if (digits === 0 || digits > 15) return undefined;
  for (; i < n; i++) if (buf[i] !== 10 && buf[i] !== 32 && buf[i] !== 9) return undefined;
  return v;
}

/** A repair that did not take is tried again this much later (ms). */
const RETRY_MS = 1000;

/**
 * A leftover is removed only once it has been one for this long (ms): a
 * source that is adding its address or link, or a reload that is removing
 * a service, is never raced.
 */
const LEFTOVER_GRACE_MS = 2000;

export class DriftGuard {
  private readonly opts: DriftGuardOptions;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly fights: FightTracker;
  private readonly links = new Map<string, ObservedLink>();
  private readonly linkNames = new Map<number, string>();
  private readonly addresses = new Map<number, Set<string>>();
  /** Addresses with the agent's mark on each network's NIC ("address/prefix"), by ifindex. */
  private readonly marked = new Map<number, Set<string>>();
  /** Source repairs under way, by subject. */
  private readonly sourceRepairs = new Map<string, Promise<void>>();
  /** When each leftover was first seen, by subject. */
  private readonly leftoverSince = new Map<string, number>();
  /** Owned tables others changed since they were last written, with what they did. */
  private readonly tablesChanged = new TableChanges();
  private watch: NetlinkWatcher | undefined;
  private nft: NftWatcher | undefined;
  private timers: { resync?: TimerHandle; poll?: TimerHandle } = {};
  /** The polled sysctl files, kept open. */
  private readonly polled = new KeptReads();
  /** Each network NIC's polled sysctl files and their wanted values (made at the first poll). */
  private pollFiles: { readonly file: string; readonly want: number }[] | undefined;
  private checkTimer: TimerHandle | undefined;
  private checkAt = Infinity;
  private checking: Promise<void> | undefined;
  private checkAgain = false;
  private stopped = false;
  private parentAddress: string | undefined;
  /** The other networks' NICs' own addresses, by ifindex, as last followed. */
  private readonly nicAddresses = new Map<number, string | undefined>();
  private lastResync: number | undefined;
  private readonly counts = Object.fromEntries(DRIFT_KINDS.map((k) => [k, 0])) as Record<DriftKind, number>;
  /** The drift of the last check not repaired (backing off, failed), by subject. */
  private outstanding = new Map<string, Drift>();
  private readonly metrics: { repairs: Counter; fights: Gauge } | undefined;

  constructor(opts: DriftGuardOptions) {
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'drift' });
    this.fights = new FightTracker(opts.fight ?? DEFAULT_FIGHT);
    if (opts.registry) {
      const repairs = new Counter({ name: 'lbagent_drift_repairs_total', help: 'Things someone else changed in the kernel that the agent put back, by kind.', labelNames: ['kind'], registers: [opts.registry] });
      for (const k of DRIFT_KINDS) repairs.inc({ kind: k }, 0);
      const fights = new Gauge({
        name: 'lbagent_drift_fights', help: 'Subjects another program keeps undoing (more repairs within a minute than the agent makes at once), by kind; the agent backs off on them.',
        labelNames: ['kind'], registers: [opts.registry],
        collect: () => {
          fights.reset();
          const now = this.clock.now();
          const by = new Map<string, number>(DRIFT_KINDS.map((k) => [k, 0]));
          for (const f of this.fights.fights(now)) { const k = f.subject.split(' ')[0]!; by.set(k, (by.get(k) ?? 0) + 1); }
          for (const [k, n] of by) fights.set({ kind: k }, n);
        },
      });
      this.metrics = { repairs, fights };
    }
  }

  /** Read the kernel once, subscribe to its changes, and start the timers. */
  async start(): Promise<void> {
    this.watch = this.opts.netlink.watch();
    this.watch.on('link', (e: { type: 'new' | 'del'; link: LinkInfo }) => this.onLink(e.type, e.link));
    this.watch.on('address', (e: { type: 'new' | 'del'; address: AddressInfo }) => this.onAddress(e.type, e.address));
    this.watch.on('netconf', () => this.requestCheck(0));
    this.watch.on('resync', () => { void this.resync('rtnetlink notifications were lost'); });
    if (this.opts.nftWatch && this.opts.tables) {
      try {
        this.nft = this.opts.nftWatch();
        this.nft.on('commit', (c: NftCommit) => this.onCommit(c));
        this.nft.on('resync', (why: string) => this.tablesMayHaveChanged(why));
      } catch (err) {
        this.log.warn({ op: 'watch', err: errorMessage(err) }, 'cannot watch nftables for changes to the agent\'s tables; they are checked at every resync only');
      }
    }
    await this.readAll();
    this.parentAddress = this.primaryOf(this.opts.parent.index);
    for (const p of this.opts.networkParents ?? []) this.nicAddresses.set(p.index, this.primaryOf(p.index));
    const every = (slot: 'resync' | 'poll', ms: () => number, fn: () => void): void => {
      const arm = (): void => {
        this.timers[slot] = this.clock.setTimeout(() => { if (!this.stopped) { fn(); arm(); } }, ms());
        this.timers[slot].unref?.();
      };
      arm();
    };
    every('resync', () => this.opts.resyncMs(), () => { void this.resync('periodic resync'); });
    every('poll', () => this.opts.sysctlPollMs ?? SYSCTL_POLL_MS, () => this.pollSysctls());
  }

  stop(): void {
    this.stopped = true;
    for (const t of Object.values(this.timers)) if (t) this.clock.clearTimeout(t);
    this.timers = {};
    if (this.checkTimer) this.clock.clearTimeout(this.checkTimer);
    this.checkTimer = undefined;
    this.watch?.close();
    this.nft?.close();
    this.polled.close();
  }

  /** For status: repairs so far, fights, what is still wrong. */
  status(): DriftStatus {
    const now = this.clock.now();
    return {
      repairs: { ...this.counts },
      fights: this.fights.fights(now).map((f) => `${f.subject}: ${f.repairs} repairs in ${f.windowSeconds} s; repairs wait, doubling, while it goes on`),
      outstanding: [...this.outstanding.values()].map((d) => d.found),
      lastResync: this.lastResync,
    };
  }

  /** What the last check found wrong with this service's VIP and is not yet repaired, or with the tables every VIP needs. */
  damage(key: string): string | undefined {
    for (const d of this.outstanding.values()) {
      if (d.kind === 'table') return d.found;
      if ('key' in d && d.key === key) return d.found;
    }
    return undefined;
  }

  // --- observing ----------------------------------------------------------

  private async readAll(): Promise<void> {
    const [links, addrs4, addrs6] = await Promise.all([this.opts.netlink.listLinks(), this.opts.netlink.listAddresses(), this.opts.netlink.listAddresses(undefined, 'IPv6')]);
    const addrs = [...addrs4, ...addrs6];
    this.links.clear();
    this.linkNames.clear();
    this.addresses.clear();
    this.marked.clear();
    for (const l of links) this.noteLink(l);
    for (const a of addrs) {
      this.addressSet(a.index).add(`${a.address}/${a.prefix}`);
      if (this.isMarked(a)) this.markedOn(a.index).add(`${a.address}/${a.prefix}`);
    }
    this.lastResync = this.clock.wallNow();
  }

  private noteLink(l: LinkInfo): void {
    const before = this.linkNames.get(l.index);
    if (before !== undefined && before !== l.name) this.links.delete(before);
    this.links.set(l.name, { index: l.index, name: l.name, mac: l.mac, up: l.up });
    this.linkNames.set(l.index, l.name);
  }

  /** Every network's NIC, the parent first. */
  private parents(): ReadonlyArray<{ readonly name: string; readonly index: number }> {
    return [this.opts.parent, ...(this.opts.networkParents ?? [])];
  }

  private markedOn(index: number): Set<string> {
    let s = this.marked.get(index);
    if (!s) this.marked.set(index, s = new Set());
    return s;
  }

  private addressSet(index: number): Set<string> {
    let s = this.addresses.get(index);
    if (!s) this.addresses.set(index, s = new Set());
    return s;
  }

  private onLink(type: 'new' | 'del', l: LinkInfo): void {
    if (type === 'new') this.noteLink(l);
    else {
      const name = this.linkNames.get(l.index) ?? l.name;
      if (this.links.get(name)?.index === l.index) this.links.delete(name);
      this.linkNames.delete(l.index);
      this.addresses.delete(l.index);
    }
    this.requestCheck();
  }

  private onAddress(type: 'new' | 'del', a: AddressInfo): void {
    const cidr = `${a.address}/${a.prefix}`;
    if (type === 'new') this.addressSet(a.index).add(cidr);
    else this.addresses.get(a.index)?.delete(cidr);
    if (type === 'new' && this.isMarked(a)) this.markedOn(a.index).add(cidr);
    else this.marked.get(a.index)?.delete(cidr);
    // The parent's primary is IPv4 (VRRP's source, status): its IPv6 addresses (link-local, SLAAC) do not move it.
    if (a.proto !== OWNED_ADDRESS_PROTO && !a.address.includes(':') && this.parents().some((p) => p.index === a.index)) this.followParent();
    this.requestCheck();
  }

  private isMarked(a: AddressInfo): boolean {
    return a.proto === OWNED_ADDRESS_PROTO && this.parents().some((p) => p.index === a.index);
  }

  private onCommit(c: NftCommit): void {
    const tables = this.opts.tables;
    if (!tables || tables.ownsCommit(c.pid, c.port)) return;
    for (const t of tables.ownedTables()) {
      const what = c.tables.get(t);
      if (!what) continue;
      const ops = summarise(what);
      this.tablesChanged.note(t, `${ops} by ${c.proc ?? 'another process'}${c.pid !== undefined ? ` (pid ${c.pid})` : ''}`);
    }
    if (this.tablesChanged.size > 0) this.requestCheck();
  }

  private tablesMayHaveChanged(why: string): void {
    for (const t of this.opts.tables?.ownedTables() ?? []) if (!this.tablesChanged.has(t)) this.tablesChanged.note(t, `${why}; written again to be sure`);
    this.requestCheck();
  }

  private async resync(why: string): Promise<void> {
    if (this.stopped) return;
    try {
      await this.readAll();
      this.followParent();
      const nft = this.nft;
      if (nft && nft.lastGen !== undefined) {
        const gen = await nft.generation();
        // A commit the watch did not hear of: it may have been to our tables.
        if (gen !== undefined && gen !== nft.lastGen) this.tablesMayHaveChanged(`the ruleset is at generation ${gen}, notifications stopped at ${nft.lastGen}`);
      }
      for (const p of this.opts.tables?.programsUndone?.() ?? []) if (!this.tablesChanged.has(p.subject)) this.tablesChanged.note(p.subject, p.found);
    } catch (err) {
      this.log.warn({ op: 'resync', why, err: errorMessage(err) }, 'could not read the kernel\'s links and addresses');
      return;
    }
    this.requestCheck(0, true);
  }

  /** The parent's own address: its first IPv4 address that is not a VIP (a /32 marked as the agent's). */
  private primaryOf(index: number): string | undefined {
    const set = this.addresses.get(index);
    if (!set) return undefined;
    for (const cidr of set) if (!cidr.endsWith('/32') && !cidr.includes(':')) return cidr.slice(0, cidr.indexOf('/'));
    return undefined;
  }

  /** Every network's NIC's own address: a change is logged and reported (VRRP sends from it). */
  private followParent(): void {
    const now = this.primaryOf(this.opts.parent.index);
    if (now !== this.parentAddress) {
      const before = this.parentAddress;
      this.parentAddress = now;
      this.log.info({ op: 'parent-address', from: before, to: now }, `the address of ${this.opts.parent.name} changed: ${before ?? 'none'} -> ${now ?? 'none'}`);
      this.opts.onParentAddress?.(now);
    }
    for (const p of this.opts.networkParents ?? []) {
      const addr = this.primaryOf(p.index);
      const before = this.nicAddresses.get(p.index);
      if (addr === before) continue;
      this.nicAddresses.set(p.index, addr);
      this.log.info({ op: 'parent-address', ifname: p.name, from: before, to: addr }, `the address of ${p.name} changed: ${before ?? 'none'} -> ${addr ?? 'none'}`);
      this.opts.onNetworkAddress?.(p.name, addr);
    }
  }

  // --- checking and repairing -----------------------------------------------

  /** A check in `delayMs` (default: once notifications settle); `full` also reads every macvlan's sysctls. */
  private requestCheck(delayMs = this.opts.settleMs ?? 30, full = false): void {
    if (this.stopped) return;
    if (full) this.fullNext = true;
    const at = this.clock.now() + delayMs;
    if (this.checkTimer && at >= this.checkAt) return;
    if (this.checkTimer) this.clock.clearTimeout(this.checkTimer);
    this.checkAt = at;
    this.checkTimer = this.clock.setTimeout(() => {
      this.checkTimer = undefined;
      this.checkAt = Infinity;
      this.runCheck();
    }, delayMs);
    this.checkTimer.unref?.();
  }

  private fullNext = true;

  private runCheck(): void {
    if (this.checking) { this.checkAgain = true; return; }
    this.checking = this.check().catch((err) => this.log.error({ op: 'check', err: errorMessage(err) }, 'drift check failed'))
      .finally(() => {
        this.checking = undefined;
        if (this.checkAgain && !this.stopped) { this.checkAgain = false; this.runCheck(); }
      });
  }

  /** One comparison of the held VIPs, tables and sysctls with the kernel, and the repairs it calls for. */
  async check(): Promise<void> {
    if (this.stopped) return;
    const full = this.fullNext;
    this.fullNext = false;
    const held = this.opts.held();
    const snapshot: KernelSnapshot = {
      links: this.links, addresses: this.addresses, tablesChanged: this.tablesChanged.current(),
      sysctls: await this.readSysctls(held, full),
      marked: this.marked,
    };
    const { drifts, ripeningMs } = this.ripeLeftovers(planDrift(held, snapshot, this.opts.wanted?.(), this.parents()));
    const forwarding = await this.opts.tables?.keepForwarding().catch((err: unknown) => {
      this.log.warn({ op: 'sysctl', err: errorMessage(err) }, 'cannot set the forwarding sysctls to 1');
      return [];
    });
    for (const f of forwarding ?? []) this.repaired({ kind: 'forwarding', subject: f.sysctl, found: `${f.sysctl} is ${f.found}, the kernel path needs 1` }, `set ${f.sysctl}=1`);
    const still = new Map<string, Drift>();
    let wake = Infinity;
    if (ripeningMs !== undefined) wake = ripeningMs;
    for (const d of drifts) {
      if (this.stopped) return;
      const subject = driftSubject(d);
      const now = this.clock.now();
      const wait = this.fights.delay(subject, now);
      if (wait > 0) {
        still.set(subject, d);
        wake = Math.min(wake, wait);
        if (!this.outstanding.has(subject)) this.report(d, undefined);
        continue;
      }
      if ('key' in d) {
        // A source's repair waits its turn in that source's own work (a
        // lease exchange under way, a VRRP step): it runs beside the check,
        // never in it, so one busy source holds up no other repair and no
        // leftover's removal. The drift stays outstanding until it ends.
        still.set(subject, d);
        if (!this.sourceRepairs.has(subject)) this.repairSourceAside(subject, d);
        continue;
      }
      const done = await this.repair(d);
      if (done === undefined) { still.set(subject, d); wake = Math.min(wake, RETRY_MS); continue; }
      this.repaired(d, done);
    }
    this.outstanding = still;
    // Backing off, or a repair that did not take (nft failed, the source was
    // busy): check again when the first wait is over.
    if (wake < Infinity) this.requestCheck(wake);
  }

  /** A source's repair, off the check; when it ends, a check sees what is left (and a repair that did not take is tried again after RETRY_MS). */
  private repairSourceAside(subject: string, d: Drift): void {
    const run = this.repair(d).then((done) => {
      this.sourceRepairs.delete(subject);
      if (this.stopped) return;
      if (done === undefined) { this.requestCheck(RETRY_MS); return; }
      this.repaired(d, done);
      this.requestCheck();
    });
    this.sourceRepairs.set(subject, run);
  }

  /**
   * The drift list without the leftovers that have not been leftovers for
   * LEFTOVER_GRACE_MS yet, and how long until the first of those is due
   * (decided at one instant, so a leftover is either removed now or has a
   * check coming); a leftover that went away is forgotten.
   */
  private ripeLeftovers(drifts: Drift[]): { drifts: Drift[]; ripeningMs: number | undefined } {
    const now = this.clock.now();
    const seen = new Set<string>();
    let ripeningMs: number | undefined;
    const out = drifts.filter((d) => {
      if (d.kind !== 'leftover') return true;
      const subject = driftSubject(d);
      seen.add(subject);
      let since = this.leftoverSince.get(subject);
      if (since === undefined) {
        since = now;
        this.leftoverSince.set(subject, now);
        this.log.debug({ op: 'check', subject, found: d.found }, `${d.found}: removed if still so in ${LEFTOVER_GRACE_MS} ms`);
      }
      const left = since + LEFTOVER_GRACE_MS - now;
      if (left <= 0) return true;
      // A timer may fire a little before its time by this clock: a margin, so the check it starts finds the leftover due.
      ripeningMs = Math.min(ripeningMs ?? Infinity, left + 5);
      return false;
    });
    for (const s of [...this.leftoverSince.keys()]) if (!seen.has(s)) this.leftoverSince.delete(s);
    return { drifts: out, ripeningMs };
  }

  private async repair(d: Drift): Promise<string | undefined> {
    try {
      switch (d.kind) {
        case 'leftover': {
          const r = d.remove;
          if ('link' in r) return (await this.opts.netlink.deleteLink(r.link)) ? 'deleted it' : 'it was gone already';
          return (await this.opts.netlink.removeAddress(r.ifindex, r.address, r.prefix)) ? 'removed it' : 'it was gone already';
        }
        case 'table': {
          const tables = this.opts.tables;
          if (!tables) return undefined;
          const mark = this.tablesChanged.mark();
          if (tables.repairProgram && !tables.ownedTables().includes(d.subject)) {
            // A program beside the tables: it alone is put back (the tables are not written).
            const done = await tables.repairProgram(d.subject);
            if (done === undefined) return undefined;
            this.tablesChanged.written(mark, [d.subject]);
            return done;
          }
          if (!await tables.repair()) return undefined;
          // One write puts back every table the path owns, as changed before it began
          // (a change heard meanwhile asked for its own check: onCommit).
          this.tablesChanged.written(mark, tables.ownedTables());
          return 'wrote the tables again in one transaction';
        }
        case 'sysctl': {
          const changes = await applyVipSysctls(d.ifname, d.role);
          return changes.length > 0 ? changes.map((c) => `set net.ipv4.conf.${d.ifname}.${c.key}=${c.to}`).join(', ') : `${d.subject} was right again`;
        }
        case 'forwarding': {
          const put = await this.opts.tables?.keepForwarding() ?? [];
          return put.length > 0 ? put.map((f) => `set ${f.sysctl}=1`).join(', ') : undefined;
        }
        default:
          return await this.opts.repairSource(d.key, d.kind);
      }
    } catch (err) {
      this.log.warn({ op: 'repair', kind: d.kind, subject: d.subject, err: errorMessage(err) }, `could not repair: ${d.found}`);
      return undefined;
    }
  }

  private repaired(d: Drift, done: string): void {
    const now = this.clock.now();
    const subject = driftSubject(d);
    this.fights.record(subject, now);
    this.counts[d.kind]++;
    this.metrics?.repairs.inc({ kind: d.kind });
    this.report(d, done);
  }

  private report(d: Drift, done: string | undefined): void {
    const fight = this.fights.fights(this.clock.now()).find((f) => f.subject === driftSubject(d));
    const service = 'key' in d ? d.key : undefined;
    const fields = { op: 'repair', kind: d.kind, subject: d.subject, service, found: d.found, done, ...(fight ? { fight: `${fight.repairs} repairs in ${fight.windowSeconds} s` } : {}) };
    if (done !== undefined) this.log.warn(fields, `drift repaired: ${d.found}; ${done}`);
    else this.log.warn(fields, `drift: ${d.found}; another program keeps undoing this, so the repair waits (${fight?.repairs ?? 0} repairs in ${fight?.windowSeconds ?? 60} s)`);
    this.opts.onRepair?.({ kind: d.kind, subject: d.subject, service, found: d.found, done, fight });
  }

  /**
   * The parent's ARP sysctls as wanted, and IPv6 forwarding on while the
   * path owns a table of IPv6 VIPs? If not, a check now (the IPv6 one is
   * read here rather than heard: its netconf group would wake the guard for
   * every link any program adds).
   */
  private pollSysctls(): void {
    this.pollFiles ??= this.parents().flatMap((p) => vipSysctls('parent').map(([key, want]) => ({ file: ifSysctlPath(p.name, key), want })));
    for (const { file, want } of this.pollFiles) {
      const got = this.polled.read(file);
      if (got !== undefined && got !== want) { this.requestCheck(0); return; }
    }
    if (this.opts.tables?.ownedTables().includes('ip6 lb_agent')) {
      const six = this.polled.read(IPV6_FORWARDING);
      if (six !== undefined && six !== 1) this.requestCheck(0);
    }
  }

  /** The sysctls the agent set: the parent's every poll, each held macvlan's on a full check. */
  private async readSysctls(held: readonly HeldVip[], full: boolean): Promise<KernelSnapshot['sysctls']> {
    const ifs: Array<[string, VipRole]> = this.parents().map((p) => [p.name, 'parent']);
    if (full) for (const v of held) if (v.link) ifs.push([v.link.name, 'macvlan']);
    const out: Array<KernelSnapshot['sysctls'][number]> = [];
    for (const [ifname, role] of ifs) {
      for (const [key, want] of vipSysctls(role)) {
        const got = await readIfSysctl(ifname, key).catch(() => undefined);
        out.push({ ifname, key, role, want, got });
      }
    }
    return out;
  }
}

/** "deleted", or "deleted 2 chains, added 1 rule": what a commit did to one table. */
function summarise(ops: readonly { kind: string; op: 'new' | 'del' }[]): string {
  if (ops.some((o) => o.kind === 'table' && o.op === 'del')) return 'deleted';
  const counts = new Map<string, number>();
  for (const o of ops) {
    const k = `${o.op === 'del' ? 'deleted' : 'added'} ${o.kind}`;
    counts.set(k, (counts.get(k) ?? 0) + 1);
  }
  return [...counts].map(([k, n]) => { const [verb, kind] = k.split(' '); return `${verb} ${n} ${kind}${n === 1 ? '' : 's'}`; }).join(', ');
}
