// Refresh wheel (driver layer, injected clock): the periodic announcement of
// every held VIP (keepalived's garp_master_refresh) on one timer per refresh
// period, not one timer per VIP. A period is cut into slots about a second
// apart (at most MAX_SLOTS); each VIP sits in one slot and is told to
// refresh when its slot comes round, once per period, so the slot's VIPs
// send their announcements in one turn of the event loop on the shared
// neighbour socket. A VIP joins the slot with the fewest VIPs, so 1,000 VIPs
// that came up together refresh 100 a second at a 10 s period instead of
// 1,000 at once, and a VIP's first refresh comes within one period of its
// joining. Empty slots arm no timer.
//
// It knows members and periods, never addresses: what a refresh sends, and
// whether a member still holds its address, is the member's business
// (vip-owner.ts). A slot's refreshes run inside the `batch` hook, so whoever
// carries the sends can gather them (neighbour-sockets.ts sends a slot's
// frames on one socket with one sendmmsg).
import { realClock, type Clock, type TimerHandle } from '../../clock';

/** One holder of an address that announces it once per period. */
export interface RefreshMember {
  /** Its slot came round: send the refresh now. */
  refreshDue(): void;
}

export interface RefreshWheelOptions {
  clock?: Clock;
  /** Runs one slot's refreshes (`run`) at once; default: run(). */
  batch?: (run: () => void) => void;
}

/** The slot spacing aimed at (ms): about one batch of sends a second. */
export const REFRESH_SLOT_MS = 1000;
/** Slots a period is cut into at most: a long period gets wider slots, not more of them. */
export const MAX_SLOTS = 64;

/** The slots of one period; slot i fires at the instants k * slotMs with k mod slots.length = i (clock ms). */
interface Ring {
  readonly periodMs: number;
  readonly slotMs: number;
  readonly slots: Set<RefreshMember>[];
  members: number;
  timer: TimerHandle | undefined;
  /** The boundary index k the timer is armed for. */
  armed: number;
}

export interface RefreshWheelCounts {
  /** Members in the wheel now. */
  members: number;
  /** Timers armed now (one per period in use that has a member). */
  timers: number;
}

export class RefreshWheel {
  private readonly clock: Clock;
  private readonly batch: (run: () => void) => void;
  private readonly rings = new Map<number, Ring>();
  private readonly where = new Map<RefreshMember, { ring: Ring; slot: number }>();

  constructor(opts: RefreshWheelOptions = {}) {
    this.clock = opts.clock ?? realClock;
    this.batch = opts.batch ?? ((run) => run());
  }

  /** Refresh `member` once every periodMs (> 0) from now on; a member already in the wheel moves to the new period. */
  add(member: RefreshMember, periodMs: number): void {
    if (!(periodMs > 0) || !Number.isFinite(periodMs)) throw new RangeError(`a refresh period must be a positive number of ms, not ${periodMs}`);
    this.remove(member);
    let ring = this.rings.get(periodMs);
    if (ring === undefined) {
      const n = Math.min(MAX_SLOTS, Math.max(1, Math.round(periodMs / REFRESH_SLOT_MS)));
      ring = { periodMs, slotMs: periodMs / n, slots: Array.from({ length: n }, () => new Set<RefreshMember>()), members: 0, timer: undefined, armed: Infinity };
      this.rings.set(periodMs, ring);
    }
    const n = ring.slots.length;
    // The boundaries of the next period are k0+1 .. k0+n, one per slot: the
    // least loaded slot, and of equals the latest (a lone VIP refreshes
    // about one period after it joined).
    const k0 = Math.floor(this.clock.now() / ring.slotMs);
    let best = k0 + n;
    for (let k = k0 + n - 1; k > k0; k--) if (ring.slots[k % n]!.size < ring.slots[best % n]!.size) best = k;
    ring.slots[best % n]!.add(member);
    ring.members++;
    this.where.set(member, { ring, slot: best % n });
    if (best < ring.armed) this.arm(ring, best);
  }

  /** No more refreshes for `member` (a no-op when it is not in the wheel). */
  remove(member: RefreshMember): void {
    const w = this.where.get(member);
    if (w === undefined) return;
    this.where.delete(member);
    w.ring.slots[w.slot]!.delete(member);
    if (--w.ring.members === 0) {
      if (w.ring.timer !== undefined) this.clock.clearTimeout(w.ring.timer);
      this.rings.delete(w.ring.periodMs);
    }
  }

  has(member: RefreshMember): boolean {
    return this.where.has(member);
  }

  counts(): RefreshWheelCounts {
    let timers = 0;
    for (const r of this.rings.values()) if (r.timer !== undefined) timers++;
    return { members: this.where.size, timers };
  }

  /** Every member out, every timer cleared. */
  stop(): void {
    for (const r of this.rings.values()) if (r.timer !== undefined) this.clock.clearTimeout(r.timer);
    this.rings.clear();
    this.where.clear();
  }

  private arm(ring: Ring, k: number): void {
    if (ring.timer !== undefined) this.clock.clearTimeout(ring.timer);
    ring.armed = k;
    ring.timer = this.clock.setTimeout(() => this.fire(ring), Math.max(0, Math.ceil(k * ring.slotMs - this.clock.now())));
  }

  private fire(ring: Ring): void {
    ring.timer = undefined;
    if (this.rings.get(ring.periodMs) !== ring) return;
    const n = ring.slots.length;
    const k = ring.armed;
    // A copy: a member may leave (or another join) while it refreshes.
    const due = [...ring.slots[k % n]!];
    // The next non-empty slot; after a blocked event loop the boundaries
    // missed are served one after the other, each slot once.
    let next = Infinity;
    for (let j = k + 1; j <= k + n; j++) if (ring.slots[j % n]!.size > 0) { next = j; break; }
    ring.armed = Infinity;
    if (next !== Infinity) this.arm(ring, next);
    this.batch(() => {
      for (const m of due) if (this.where.get(m)?.ring === ring) m.refreshDue();
    });
  }
}
