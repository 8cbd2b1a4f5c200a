// forward/ layer: the userspace proxy's counters, in memory shared by its
// engines (one per worker thread) and the main thread. Each engine
// is the only writer of its own region - plain stores on the hot path, no
// locks, no messages - and the main thread reads every region when stats or
// a scrape ask, so a scrape never waits on a worker. The one exception is
// the count of open connections over all engines, which maxConnections
// bounds exactly: one Atomics.add per accepted connection.
//
// Layout. A slot is one (service, port, backend) flow or one listener; its
// fields are Float64 (exact integers up to 2^53, bytes included) in the
// engine's region of `counters`; its open connections (what
// least-connections compares, summed over engines) an Int32 in `active`.
// Per-engine fields (connections it holds, which relay served them, refusals
// for its own limits) sit in `engine`; the global open count in `control`.
//
// Slots are handed out by the main thread's TallyTable. When they run out it
// allocates bigger buffers and sends them with the next apply; each engine
// copies its own region over when it takes them (it is the only writer of
// it), and the main thread reads a region from the new buffers only after
// that engine confirmed. A slot is reused only once no engine routes to it
// and none of its connections is open.
//
// Passive-health results travel the same way: each engine appends
// (flow slot, ok) to a ring of its own and the main thread drains the rings
// on a short timer, at once when an engine signals a failure, and before it
// reads stats - no message, no wake-up of the main thread per connection
// (a message per connect cost 35-70 us of CPU per new connection on this VM).
// One ring per engine keeps that engine's results in order.
//
// Aligned 8-byte loads and stores are single instructions on x86-64 and
// arm64, so a reader never sees a torn counter; a reader may see one a few
// increments old, which metrics allow.

/** Fields of a flow slot (service, port, backend). */
export const FLOW_CONNECTIONS = 0;
export const FLOW_BYTES_TO_BACKEND = 1;
export const FLOW_BYTES_TO_CLIENT = 2;
export const FLOW_CONNECT_FAILURES = 3;
/** Fields of a listener slot. */
export const LISTENER_REFUSED = 0;
/** A gauge: UDP sessions open on the listener (only the engine serving UDP writes it). */
export const LISTENER_UDP_SESSIONS = 1;
/** A counter: UDP sessions ended because their backend left the route (endLeftSessions). */
export const LISTENER_UDP_ENDED = 2;
export const SLOT_FIELDS = 4;

/** Refusals for the proxy's own limits, by "op/code"; a fixed set, so each has an engine field. */
export const OWN_LIMIT_KEYS = [
  'accept/EMFILE', 'accept/ENFILE', 'accept/ENOBUFS',
  'connect/EMFILE', 'connect/ENFILE', 'connect/ENOBUFS',
  'limit/max-connections',
] as const;
export type OwnLimitKey = (typeof OWN_LIMIT_KEYS)[number];

/** Per-engine fields. */
export const ENGINE_OPEN = 0;
export const ENGINE_ACCEPTED = 1;
/** PROXY protocol headers sent in one write with the client's first bytes / alone (the client had sent nothing yet). */
export const ENGINE_PP_WITH_DATA = 2;
export const ENGINE_PP_ALONE = 3;
const ENGINE_OWN_LIMITS = 4;
export const ENGINE_FIELDS = ENGINE_OWN_LIMITS + OWN_LIMIT_KEYS.length;

export function ownLimitField(key: OwnLimitKey): number {
  return ENGINE_OWN_LIMITS + OWN_LIMIT_KEYS.indexOf(key);
}

const CONTROL_OPEN = 0;
const CONTROL_FIELDS = 4;

/** Entries per engine's ring of passive-health results; a full ring falls back to a message. */
export const REPORT_RING = 16384;
const RING_HEAD = 0;
const RING_TAIL = 1;
const RING_HEADER = 2;

/** The buffers that grow with the number of slots. */
export interface SlotBuffers {
  /** Bumped on every growth: a SharedArrayBuffer arrives in a worker as a new object, so identity cannot tell. */
  readonly generation: number;
  readonly capacity: number;
  /** Float64, engines x capacity x SLOT_FIELDS. */
  readonly counters: SharedArrayBuffer;
  /** Int32, engines x capacity. */
  readonly active: SharedArrayBuffer;
  /** Int32, capacity: per listener slot, the round-robin position every engine advances (Atomics). */
  readonly positions: SharedArrayBuffer;
}

/** Everything an engine needs to write its counters; sent once at start (slots also with each apply that grew them). */
export interface TallyBuffers {
  readonly engines: number;
  readonly slots: SlotBuffers;
  /** Float64, engines x ENGINE_FIELDS. */
  readonly engine: SharedArrayBuffer;
  /** Int32, CONTROL_FIELDS: the open connections of all engines (Atomics). */
  readonly control: SharedArrayBuffer;
  /** Int32, engines x (2 + REPORT_RING): head, tail, then entries slot * 2 + ok. */
  readonly reports: SharedArrayBuffer;
}

function newSlotBuffers(engines: number, capacity: number, generation: number): SlotBuffers {
  return {
    generation, capacity,
    counters: new SharedArrayBuffer(engines * capacity * SLOT_FIELDS * 8),
    active: new SharedArrayBuffer(engines * capacity * 4),
    positions: new SharedArrayBuffer(capacity * 4),
  };
}

/** One engine's writer: plain stores into its own region. */
export class TallyWriter {
  counters: Float64Array;
  active: Int32Array;
  positions: Int32Array;
  /** Offsets of this engine's region. */
  private base: number;
  private abase: number;
  private capacity: number;
  private slotsNow: SlotBuffers;
  readonly engine: Float64Array;
  private readonly ebase: number;
  private readonly control: Int32Array;
  private readonly engines: number;
  private readonly ring: Int32Array;

  constructor(buffers: TallyBuffers, readonly index: number) {
    this.engines = buffers.engines;
    this.slotsNow = buffers.slots;
    this.capacity = buffers.slots.capacity;
    this.counters = new Float64Array(buffers.slots.counters);
    this.active = new Int32Array(buffers.slots.active);
    this.positions = new Int32Array(buffers.slots.positions);
    this.base = index * this.capacity * SLOT_FIELDS;
    this.abase = index * this.capacity;
    this.engine = new Float64Array(buffers.engine);
    this.ebase = index * ENGINE_FIELDS;
    this.control = new Int32Array(buffers.control);
    this.ring = new Int32Array(buffers.reports, index * (RING_HEADER + REPORT_RING) * 4, RING_HEADER + REPORT_RING);
  }

  /** Append a passive-health result; false when the ring is full (the main thread is not draining). */
  report(slot: number, ok: boolean): boolean {
    const r = this.ring;
    const head = r[RING_HEAD]!;
    if (head - Atomics.load(r, RING_TAIL) >= REPORT_RING) return false;
    r[RING_HEADER + (head % REPORT_RING)] = slot * 2 + (ok ? 1 : 0);
    // The store of the head publishes the entry (Atomics: ordered after it).
    Atomics.store(r, RING_HEAD, head + 1);
    return true;
  }

  /** Take bigger slot buffers: this engine's region moves over (it is its only writer). */
  adopt(slots: SlotBuffers): void {
    if (slots.generation === this.slotsNow.generation) return;
    const counters = new Float64Array(slots.counters);
    const active = new Int32Array(slots.active);
    const base = this.index * slots.capacity * SLOT_FIELDS;
    const abase = this.index * slots.capacity;
    counters.set(this.counters.subarray(this.base, this.base + this.capacity * SLOT_FIELDS), base);
    active.set(this.active.subarray(this.abase, this.abase + this.capacity), abase);
    this.slotsNow = slots;
    this.counters = counters;
    this.active = active;
    this.positions = new Int32Array(slots.positions);
    this.base = base;
    this.abase = abase;
    this.capacity = slots.capacity;
  }

  add(slot: number, field: number, n: number): void {
    this.counters[this.base + slot * SLOT_FIELDS + field]! += n;
  }

  set(slot: number, field: number, v: number): void {
    this.counters[this.base + slot * SLOT_FIELDS + field] = v;
  }

  /** This engine's open connections to a flow's backend. */
  activeAdd(slot: number, d: number): void {
    this.active[this.abase + slot]! += d;
  }

  /** Open connections to a flow's backend over every engine (least-connections). */
  activeTotal(slot: number): number {
    let n = 0;
    const cap = this.capacity;
    const a = this.active;
    for (let e = 0; e < this.engines; e++) n += a[e * cap + slot]!;
    return n;
  }

  /** The next round-robin position of a listener, shared by every engine: one atomic add. */
  nextPosition(slot: number): number {
    return Atomics.add(this.positions, slot, 1) >>> 0;
  }

  /** The position the next pick will take, not taken. */
  peekPosition(slot: number): number {
    return Atomics.load(this.positions, slot) >>> 0;
  }

  engineAdd(field: number, n: number): void {
    this.engine[this.ebase + field]! += n;
  }

  /** Count one more open connection unless all engines together already hold `max`. */
  tryOpen(max: number): boolean {
    if (Atomics.add(this.control, CONTROL_OPEN, 1) >= max) {
      Atomics.sub(this.control, CONTROL_OPEN, 1);
      return false;
    }
    this.engine[this.ebase + ENGINE_OPEN]! += 1;
    return true;
  }

  closed(): void {
    Atomics.sub(this.control, CONTROL_OPEN, 1);
    this.engine[this.ebase + ENGINE_OPEN]! -= 1;
  }
}

/** The main thread's side: hands out slots, reads every engine's region. */
export class TallyTable {
  private readonly slotsByKey = new Map<string, number>();
  private readonly free: number[] = [];
  private next = 0;
  /** The newest slot buffers; engines move to them with the next apply. */
  private latest: SlotBuffers;
  /** The slot buffers each engine has confirmed taking: its region is read from there. */
  private readonly confirmed: SlotBuffers[];
  private readonly engineF: Float64Array;
  private readonly control: Int32Array;
  private readonly views = new WeakMap<SlotBuffers, { f: Float64Array; a: Int32Array }>();
  private readonly rings: Int32Array[];
  /** The key of every slot in use, by slot (passive-health results name a slot). */
  private readonly keys: (string | undefined)[] = [];
  readonly buffers: () => TallyBuffers;

  constructor(readonly engines: number, capacity = 256) {
    this.latest = newSlotBuffers(engines, capacity, 0);
    this.confirmed = Array.from({ length: engines }, () => this.latest);
    const engine = new SharedArrayBuffer(engines * ENGINE_FIELDS * 8);
    const control = new SharedArrayBuffer(CONTROL_FIELDS * 4);
    const reports = new SharedArrayBuffer(engines * (RING_HEADER + REPORT_RING) * 4);
    this.engineF = new Float64Array(engine);
    this.control = new Int32Array(control);
    this.rings = Array.from({ length: engines }, (_, e) => new Int32Array(reports, e * (RING_HEADER + REPORT_RING) * 4, RING_HEADER + REPORT_RING));
    this.buffers = () => ({ engines, slots: this.latest, engine, control, reports });
  }

  /**
   * Hand engine `e`'s passive-health results to `fn` in the order they were
   * made, with the key of their slot. Slots are released only after a drain
   * (release() drains first), so a key is never confused with a later one.
   */
  drain(e: number, fn: (key: string, ok: boolean) => void): void {
    const r = this.rings[e]!;
    const head = Atomics.load(r, RING_HEAD);
    let tail = r[RING_TAIL]!;
    while (tail !== head) {
      const v = r[RING_HEADER + (tail % REPORT_RING)]!;
      tail++;
      const key = this.keys[v >>> 1];
      if (key !== undefined) fn(key, (v & 1) === 1);
    }
    Atomics.store(r, RING_TAIL, tail);
  }

  get slots(): SlotBuffers { return this.latest; }

  /** The slot of a key, allocated (and the buffers grown) when new. */
  slot(key: string): number {
    let s = this.slotsByKey.get(key);
    if (s !== undefined) return s;
    s = this.free.pop();
    if (s === undefined) {
      if (this.next >= this.latest.capacity) this.grow(this.latest.capacity * 2);
      s = this.next++;
    }
    this.slotsByKey.set(key, s);
    this.keys[s] = key;
    return s;
  }

  slotOf(key: string): number | undefined {
    return this.slotsByKey.get(key);
  }

  /** Engine `e` now writes into the slot buffers of this generation (the newest, or an older one still confirmed). */
  confirm(e: number, generation: number): void {
    if (generation === this.latest.generation) this.confirmed[e] = this.latest;
  }

  /** Everyone writes into the newest buffers. */
  get settled(): boolean {
    return this.confirmed.every((c) => c === this.latest);
  }

  /** Regions of engines that have not taken the new buffers yet are read from the old ones until they confirm. */
  private grow(capacity: number): void {
    const old = this.latest;
    this.latest = newSlotBuffers(this.engines, capacity, old.generation + 1);
    // Round-robin positions carry over (a step taken meanwhile in the old buffer is lost: a position, not a count).
    new Int32Array(this.latest.positions).set(new Int32Array(old.positions));
  }

  private view(b: SlotBuffers): { f: Float64Array; a: Int32Array } {
    let v = this.views.get(b);
    if (!v) { v = { f: new Float64Array(b.counters), a: new Int32Array(b.active) }; this.views.set(b, v); }
    return v;
  }

  /** Sum of one field of a slot over every engine. */
  sum(slot: number, field: number): number {
    let n = 0;
    for (let e = 0; e < this.engines; e++) {
      const b = this.confirmed[e]!;
      if (slot >= b.capacity) continue;
      n += this.view(b).f[(e * b.capacity + slot) * SLOT_FIELDS + field]!;
    }
    return n;
  }

  /** Open connections of a flow over every engine. */
  activeTotal(slot: number): number {
    let n = 0;
    for (let e = 0; e < this.engines; e++) {
      const b = this.confirmed[e]!;
      if (slot >= b.capacity) continue;
      n += this.view(b).a[e * b.capacity + slot]!;
    }
    return n;
  }

  engineField(e: number, field: number): number {
    return this.engineF[e * ENGINE_FIELDS + field]!;
  }

  engineSum(field: number): number {
    let n = 0;
    for (let e = 0; e < this.engines; e++) n += this.engineF[e * ENGINE_FIELDS + field]!;
    return n;
  }

  /** Connections open over all engines right now. */
  get open(): number {
    return Atomics.load(this.control, CONTROL_OPEN);
  }

  /**
   * Free the slots of keys no longer wanted whose connections are all gone.
   * Only once every engine has confirmed the apply that stopped routing to
   * them (the caller's duty) and uses the newest buffers (else nothing is
   * freed this time).
   */
  release(wanted: ReadonlySet<string>): void {
    if (!this.settled) return;
    const counters = this.view(this.latest).f;
    const cap = this.latest.capacity;
    for (const [key, s] of this.slotsByKey) {
      if (wanted.has(key) || this.activeTotal(s) !== 0) continue;
      for (let e = 0; e < this.engines; e++) counters.fill(0, (e * cap + s) * SLOT_FIELDS, (e * cap + s + 1) * SLOT_FIELDS);
      this.slotsByKey.delete(key);
      this.keys[s] = undefined;
      this.free.push(s);
    }
  }

  /**
   * Engine `e` is gone (its thread ended): its connections went with it. Its
   * counters stay (totals never go backwards); its open connections leave
   * the global count, and its region moves to the newest buffers so that its
   * replacement writes where the rest do.
   */
  resetEngine(e: number): void {
    const b = this.confirmed[e]!;
    if (b !== this.latest) {
      const from = this.view(b).f.subarray(e * b.capacity * SLOT_FIELDS, (e + 1) * b.capacity * SLOT_FIELDS);
      this.view(this.latest).f.set(from, e * this.latest.capacity * SLOT_FIELDS);
      this.confirmed[e] = this.latest;
    }
    this.view(this.latest).a.fill(0, e * this.latest.capacity, (e + 1) * this.latest.capacity);
    const open = this.engineF[e * ENGINE_FIELDS + ENGINE_OPEN]!;
    Atomics.sub(this.control, CONTROL_OPEN, open);
    this.engineF[e * ENGINE_FIELDS + ENGINE_OPEN] = 0;
  }
}
