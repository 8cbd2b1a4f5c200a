// Drift: what the kernel no longer holds of what the agent put there, as a
// pure function of the held VIPs and a snapshot of the kernel, and the
// back-off that keeps the agent from fighting another program that undoes
// its work. No I/O: daemon/drift.ts observes the kernel and repairs.
//
// Level-triggered (controller-runtime's reconcilers, Calico Felix's
// refresh): every notification and every resync runs the same comparison,
// so a lost notification costs one resync period, never a wrong state.
import { isOwnedLink } from '../net/ownership/ownership';
import type { IfSysctlKey, VipRole } from '../net/sysctl/sysctl';
import type { SourceDamage } from '../source';

/** A VIP this node holds now, as its address source reports it. */
export interface HeldVip {
  readonly key: string;
  readonly address: string;
  readonly prefix: number;
  readonly ifindex: number;
  readonly ifname: string;
  /** A DHCP service's own macvlan (name and MAC it must have); undefined for pool VIPs, which live on the parent. */
  readonly link?: { readonly name: string; readonly mac: string } | undefined;
}

export interface ObservedLink {
  readonly index: number;
  readonly name: string;
  readonly mac: string;
  readonly up: boolean;
}

/** What the kernel holds, as the watch last saw it. */
export interface KernelSnapshot {
  /** Links by name. */
  readonly links: ReadonlyMap<string, ObservedLink>;
  /** "address/prefix" on each ifindex. */
  readonly addresses: ReadonlyMap<number, ReadonlySet<string>>;
  /** Tables the agent owns ("ip lb_agent") that another program changed since the last write, with what it did. */
  readonly tablesChanged: ReadonlyMap<string, string>;
  /** Sysctls the agent set, with the value it wants and the value read now. */
  readonly sysctls: readonly { readonly ifname: string; readonly key: IfSysctlKey; readonly role: VipRole; readonly want: number; readonly got: number | undefined }[];
  /** Addresses on each network's NIC that carry the agent's mark ("address/prefix"), by ifindex. */
  readonly marked?: ReadonlyMap<number, ReadonlySet<string>> | undefined;
}

/**
 * What the agent may have in the kernel besides the held VIPs: the macvlans
 * of its configured DHCP services (whatever their state) and the pool
 * addresses a configured service holds, claims or is about to use. An agent
 * link or marked address outside it is a leftover.
 */
export interface Wanted {
  readonly links: ReadonlySet<string>;
  /**
   * The pool addresses configured services claim, by the ifindex of their
   * network's NIC: a claim is wanted on that NIC only, and a copy of it
   * marked on another NIC is a leftover.
   */
  readonly addresses: ReadonlyMap<number, ReadonlySet<string>>;
}

/** A network's NIC, as the leftover decision names it. */
export interface Nic {
  readonly index: number;
  readonly name: string;
}

/** A marked address nothing explains on its NIC. */
export interface StrayAddress {
  readonly ifindex: number;
  readonly ifname: string;
  readonly cidr: string;
  readonly address: string;
  readonly prefix: number;
}

/** How a leftover goes. */
export type Removal =
  | { readonly link: number }
  | { readonly ifindex: number; readonly address: string; readonly prefix: number };

export type DriftKind = 'address' | 'link' | 'link-down' | 'table' | 'sysctl' | 'forwarding' | 'leftover';
/** Every kind, for metrics that list each from the start. */
export const DRIFT_KINDS: readonly DriftKind[] = ['address', 'link', 'link-down', 'table', 'sysctl', 'forwarding', 'leftover'];

export type Drift =
  | { readonly kind: SourceDamage; readonly key: string; readonly subject: string; readonly found: string }
  | { readonly kind: 'table'; readonly subject: string; readonly found: string }
  | { readonly kind: 'sysctl'; readonly subject: string; readonly ifname: string; readonly role: VipRole; readonly found: string }
  /** A forwarding sysctl, which the kernel path keeps itself (forward/nft.ts keepForwarding). */
  | { readonly kind: 'forwarding'; readonly subject: string; readonly found: string }
  /** An agent link or marked address that nothing configured wants (a reload's removal cut short, a copy of the agent's address put back by hand). */
  | { readonly kind: 'leftover'; readonly subject: string; readonly found: string; readonly remove: Removal };

/**
 * What differs between what the agent holds and the kernel. Pure. A DHCP
 * VIP's macvlan deleted (or replaced by another link of that name) is one
 * 'link' drift, its address with it; a macvlan down is 'link-down', and its
 * address is checked too; a pool VIP's parent is not the agent's, so only
 * the address counts there.
 */
export function planDrift(held: readonly HeldVip[], k: KernelSnapshot, wanted?: Wanted, parents: readonly Nic[] = []): Drift[] {
  const out: Drift[] = [];
  for (const v of held) {
    const cidr = `${v.address}/${v.prefix}`;
    if (v.link) {
      const l = k.links.get(v.link.name);
      if (!l || l.mac !== v.link.mac.toLowerCase()) {
        out.push({ kind: 'link', key: v.key, subject: v.link.name, found: l ? `${v.link.name} has MAC ${l.mac}, not ${v.link.mac}: replaced by another link` : `service macvlan ${v.link.name} of ${v.key} was deleted` });
        continue;
      }
      if (l.index !== v.ifindex) {
        out.push({ kind: 'link', key: v.key, subject: v.link.name, found: `service macvlan ${v.link.name} of ${v.key} was deleted and made again by someone else (ifindex ${v.ifindex} -> ${l.index})` });
        continue;
      }
      if (!l.up) {
        out.push({ kind: 'link-down', key: v.key, subject: v.link.name, found: `service macvlan ${v.link.name} of ${v.key} was set down` });
        continue;
      }
    }
    if (!k.addresses.get(v.ifindex)?.has(cidr)) {
      out.push({ kind: 'address', key: v.key, subject: cidr, found: `VIP ${cidr} of ${v.key} was removed from ${v.ifname}` });
    }
  }
  // A program the path owns beside its tables is named 'bpf <name>' (forward/ebpf-nat.ts).
  for (const [table, what] of k.tablesChanged) out.push({ kind: 'table', subject: table, found: `${table.startsWith('bpf ') ? 'program' : 'table'} ${table}: ${what}` });
  // One drift an interface: one write puts back every value of its role.
  const wrong = new Map<string, { role: VipRole; found: string[] }>();
  for (const s of k.sysctls) {
    if (s.got === undefined || s.got === s.want) continue;
    let w = wrong.get(s.ifname);
    if (!w) wrong.set(s.ifname, w = { role: s.role, found: [] });
    w.found.push(`net.ipv4.conf.${s.ifname}.${s.key} is ${s.got}, the agent needs ${s.want}`);
  }
  for (const [ifname, w] of wrong) out.push({ kind: 'sysctl', subject: `net.ipv4.conf.${ifname}`, ifname, role: w.role, found: `${w.found.join('; ')} (ARP flux)` });
  if (wanted) out.push(...planLeftovers(held, k, wanted, parents));
  return out;
}

/**
 * The agent's own objects nothing wants: a macvlan with the agent's name
 * and MAC marks that no configured DHCP service has, an address with the
 * agent's mark on a network's NIC that no VIP held there and no claim of
 * that network explains (strayMarkedAddresses). Objects without both marks
 * are never touched.
 */
export function planLeftovers(held: readonly HeldVip[], k: KernelSnapshot, wanted: Wanted, parents: readonly Nic[] = []): Drift[] {
  const out: Drift[] = [];
  const heldLinks = new Set(held.flatMap((v) => (v.link ? [v.link.name] : [])));
  for (const l of k.links.values()) {
    if (!isOwnedLink(l) || wanted.links.has(l.name) || heldLinks.has(l.name)) continue;
    out.push({ kind: 'leftover', subject: `link ${l.name}`, found: `agent macvlan ${l.name} (${l.mac}) belongs to no configured service`, remove: { link: l.index } });
  }
  // A VIP a source holds explains its address on the NIC it holds it on.
  const explained = new Map<number, Set<string>>();
  for (const p of parents) explained.set(p.index, new Set([...wanted.addresses.get(p.index) ?? [], ...held.filter((v) => v.ifindex === p.index).map((v) => v.address)]));
  for (const a of strayMarkedAddresses(parents, k.marked ?? new Map(), explained)) {
    out.push({ kind: 'leftover', subject: `address ${a.cidr}`, found: `address ${a.cidr} on ${a.ifname} carries the agent's mark and no service holds or claims it there`, remove: { ifindex: a.ifindex, address: a.address, prefix: a.prefix } });
  }
  return out;
}

/**
 * The marked addresses ("address/prefix") on each network's NIC that no
 * address explained on that same NIC accounts for: the one decision of the
 * start's adoption (daemon/wiring.ts adoptOwned) and the running drift
 * guard, so what a start would remove is removed while running too. A NIC
 * not listed is not looked at.
 */
export function strayMarkedAddresses(nics: readonly Nic[], marked: ReadonlyMap<number, Iterable<string>>, explained: ReadonlyMap<number, ReadonlySet<string>>): StrayAddress[] {
  const out: StrayAddress[] = [];
  for (const nic of nics) {
    const here = explained.get(nic.index);
    for (const cidr of marked.get(nic.index) ?? []) {
      const slash = cidr.indexOf('/');
      const address = cidr.slice(0, slash);
      if (!here?.has(address)) out.push({ ifindex: nic.index, ifname: nic.name, cidr, address, prefix: Number(cidr.slice(slash + 1)) });
    }
  }
  return out;
}

/** The identity of a drift: one back-off and one count per subject. */
export function driftSubject(d: Drift): string {
  return `${d.kind} ${d.subject}`;
}

/** How the back-off behaves. */
export interface FightConfig {
  /** The window repairs are counted over (ms). */
  readonly windowMs: number;
  /** Repairs of one subject within the window past which it is a fight. */
  readonly threshold: number;
  /** The first wait once fighting (ms); doubles with every further repair, up to maxDelayMs. */
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
}

export const DEFAULT_FIGHT: FightConfig = { windowMs: 60_000, threshold: 5, baseDelayMs: 1_000, maxDelayMs: 30_000 };

/**
 * Repairs per subject over a sliding window. Pure apart from its own
 * memory: time is passed in. While a subject has been repaired more than
 * `threshold` times within the window, each further repair waits, twice as
 * long as the one before: another program that keeps undoing the agent's
 * work gets a bounded share of the CPU, and the agent says who is fighting.
 */
export class FightTracker {
  private readonly repairs = new Map<string, number[]>();
  constructor(private readonly cfg: FightConfig = DEFAULT_FIGHT) {}

  private recent(subject: string, now: number): number[] {
    const list = (this.repairs.get(subject) ?? []).filter((t) => now - t < this.cfg.windowMs);
    if (list.length > 0) this.repairs.set(subject, list);
    else this.repairs.delete(subject);
    return list;
  }

  /** How long the next repair of this subject must wait (0: now). */
  delay(subject: string, now: number): number {
    const list = this.recent(subject, now);
    const over = list.length - this.cfg.threshold;
    if (over < 0) return 0;
    const wait = Math.min(this.cfg.maxDelayMs, this.cfg.baseDelayMs * 2 ** Math.min(over, 20));
    return Math.max(0, list[list.length - 1]! + wait - now);
  }

  record(subject: string, now: number): void {
    const list = this.recent(subject, now);
    list.push(now);
    this.repairs.set(subject, list);
  }

  /** Subjects repaired more than the threshold within the window, with their counts: the fights. */
  fights(now: number): { subject: string; repairs: number; windowSeconds: number }[] {
    const out: { subject: string; repairs: number; windowSeconds: number }[] = [];
    for (const s of [...this.repairs.keys()]) {
      const n = this.recent(s, now).length;
      if (n > this.cfg.threshold) out.push({ subject: s, repairs: n, windowSeconds: this.cfg.windowMs / 1000 });
    }
    return out;
  }
}

/**
 * The owned tables another program changed since they were last written,
 * with what it did. A repair writes every table at once, but a change heard
 * while that write is under way may have landed after it: `mark()` before
 * the write and `written(mark)` after forget only what was heard before the
 * write began, so such a change is repaired by the next check instead of
 * being lost (at worst one write more than needed).
 */
export class TableChanges {
  private readonly changes = new Map<string, { what: string; seq: number }>();
  private seq = 0;

  note(table: string, what: string): void {
    this.changes.set(table, { what, seq: ++this.seq });
  }

  has(table: string): boolean {
    return this.changes.has(table);
  }

  get size(): number {
    return this.changes.size;
  }

  /** Every change heard so far, by table: the snapshot a check plans from. */
  current(): ReadonlyMap<string, string> {
    return new Map([...this.changes].map(([t, c]) => [t, c.what]));
  }

  /** Taken before a write of every table. */
  mark(): number {
    return this.seq;
  }

  /** The write that began at `mark` is in the kernel: the changes heard before it, to `subjects` (all when absent), are repaired. */
  written(mark: number, subjects?: readonly string[]): void {
    for (const [t, c] of [...this.changes]) if (c.seq <= mark && (subjects === undefined || subjects.includes(t))) this.changes.delete(t);
  }
}
