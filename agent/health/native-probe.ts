// Native batch TCP prober (driver): TCP connect probes through the
// addon's TcpProbeHandle (native/src/tcp_probe.cc) - raw non-blocking sockets,
// one epoll descriptor, results in batches - with every policy kept here:
// probes started in one tick go down in one call (flushed from a microtask),
// the timeout is ours (one deadline queue per timeout value, one timer), and
// so is how long a connected probe may wait for the backend's FIN before its
// socket is closed anyway (the sweep). errno numbers become Node's codes and
// the checker's reasons through the same table a Node socket's error goes
// through (reasonOf), so both probe paths report alike.
//
// Per probe there is no JavaScript object: ids index typed arrays, and the
// caller's context object travels through untouched.
import { constants as osConstants } from 'node:os';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { LbError } from '../errors';
import { addressToBytes, parseAddress } from '../address';
import { loadNative, type NativeAddon, type NativeTcpProbeHandle } from '../native/native';
import { CLOSE_GRACE_MS, reasonOf, type TcpOutcome, type TcpProber, type TcpTarget } from './probe';
import type { FailureReason } from './state';

const ERRNO = osConstants.errno;
const EINPROGRESS = ERRNO.EINPROGRESS;

/** errno -> Node's code ('ECONNREFUSED'), and -> the checker's reason. */
const CODE_BY_ERRNO: string[] = [];
const REASON_BY_ERRNO: FailureReason[] = [];
for (const [code, n] of Object.entries(ERRNO)) {
  if (CODE_BY_ERRNO[n] !== undefined) continue; // aliases (EWOULDBLOCK = EAGAIN): first name wins
  CODE_BY_ERRNO[n] = code;
  REASON_BY_ERRNO[n] = reasonOf({ code });
}

/** Node's code for an errno number ('errno 9999' for one Node does not name). */
export function errnoCode(errno: number): string {
  return CODE_BY_ERRNO[errno] ?? `errno ${errno}`;
}

/** Results the addon hands back per callback at most. */
const RESULT_BATCH = 1024;

/** Per-id state. */
const FREE = 0;
const QUEUED = 1;
const CONNECTING = 2;
/** Cancelled before its batch went down: skipped and freed by the flush. */
const DROPPED = 3;

/**
 * Probe deadlines of one timeout value: started in order, so they expire in
 * order (a FIFO ring of (id, gen, deadline) in typed arrays). Exported for
 * its unit test.
 */
export class DeadlineRing {
  ids = new Int32Array(256);
  gens = new Uint32Array(256);
  at = new Float64Array(256);
  head = 0;
  len = 0;
  push(id: number, gen: number, at: number): void {
    if (this.len === this.ids.length) this.grow();
    const i = (this.head + this.len) % this.ids.length;
    this.ids[i] = id;
    this.gens[i] = gen;
    this.at[i] = at;
    this.len++;
  }
  shift(): void {
    this.head = (this.head + 1) % this.ids.length;
    this.len--;
  }
  private grow(): void {
    const n = this.ids.length * 2;
    const ids = new Int32Array(n);
    const gens = new Uint32Array(n);
    const at = new Float64Array(n);
    for (let k = 0; k < this.len; k++) {
      const i = (this.head + k) % this.ids.length;
      ids[k] = this.ids[i]!;
      gens[k] = this.gens[i]!;
      at[k] = this.at[i]!;
    }
    this.ids = ids;
    this.gens = gens;
    this.at = at;
    this.head = 0;
  }
}

/**
 * How a connected probe socket ends. 'reset-before-ack', the
 * default: TCP_QUICKACK off before connect() and a disconnect at once (what
 * close() with SO_LINGER 0 does; the socket is kept, see TRIM_MS), so the
 * backend sees SYN, our SYN-ACK's answer is a RST, exactly HAProxy's L4
 * check - the backend's application never accepts a connection (nothing in
 * its log), no FIN exchange, no TIME_WAIT, no socket left waiting (the handshake's
 * ACK is delayed up to TCP_DELACK_MAX, 200 ms: a loop stalled longer makes it
 * 'reset'). 'reset': a full handshake, then the RST; the backend accepts a
 * connection that is reset. 'fin': our FIN, the socket kept until the
 * backend's FIN or the sweep; at 10,000 probes/s about 20% more CPU per
 * probe than a reset (bench/results, "Health checking").
 */
export type ProbeClose = 'fin' | 'reset' | 'reset-before-ack';
const CLOSE_MODE: Record<ProbeClose, number> = { fin: 0, reset: 1, 'reset-before-ack': 2 };

export interface NativeTcpProberOptions<C> {
  /** Gets each probe's outcome, never from within start(). */
  readonly onOutcome: TcpOutcome<C>;
  readonly clock?: Clock;
  /** The addon; injectable so tests can offer one without the prober. */
  readonly addon?: () => NativeAddon;
  /** How connected probes end (default 'reset-before-ack', as HAProxy's L4 check). */
  readonly close?: ProbeClose;
}

export interface NativeTcpProberStats {
  /** Probes started, and connect() calls they went down in. */
  readonly started: number;
  readonly batches: number;
  readonly inFlight: number;
  /** Sockets in the addon: connecting, waiting for the backend's FIN, closed by the sweep. */
  readonly connecting: number;
  readonly closing: number;
  readonly swept: number;
  /**
   * Reset modes: sockets kept disconnected for the next probe to the same
   * address, probes that took one instead of a new socket, and kept sockets
   * closed by the trim after TRIM_MS unused.
   */
  readonly idle: number;
  readonly reused: number;
  readonly trimmed: number;
}

/**
 * A kept probe socket no probe took for between TRIM_MS and twice that is
 * closed: a target's probe comes back every period (5 s by default; with a
 * period longer than TRIM_MS each probe may open a new socket, as before),
 * so a removed target's sockets are gone within one to two minutes.
 */
export const TRIM_MS = 60_000;

export class NativeTcpProber<C> implements TcpProber<C> {
  readonly path = 'native' as const;
  private readonly handle: NativeTcpProbeHandle;
  private readonly clock: Clock;
  private readonly onOutcome: TcpOutcome<C>;
  /** Only a FIN close leaves sockets for the sweep. */
  private readonly sweeps: boolean;
  // Per id (ids are dense: the lowest free ones are reused first).
  private ctx: (C | undefined)[] = [];
  private state = new Uint8Array(64);
  private gen = new Uint32Array(64);
  private startAt = new Float64Array(64);
  private readonly free: number[] = [];
  private nextId = 0;
  private inFlight = 0;
  // The batch being gathered in this tick.
  private qIds = new Uint32Array(256);
  private qAddrs = new Uint32Array(256);
  /** IPv6 addresses, 16 bytes a probe, for the entries whose qAddrs is 0. */
  private qAddrs6 = new Uint8Array(256 * 16);
  private qPorts = new Uint16Array(256);
  private qOut = new Int32Array(256);
  private qLen = 0;
  private flushQueued = false;
  private readonly flushFn = (): void => this.flush();
  // Lent to the addon for its results.
  private readonly rIds = new Uint32Array(RESULT_BATCH);
  private readonly rErrnos = new Int32Array(RESULT_BATCH);
  // Timeouts.
  private readonly rings = new Map<number, DeadlineRing>();
  private timer: TimerHandle | undefined;
  private timerAt = Infinity;
  private readonly onTimerFn = (): void => this.onTimer();
  // Closing sockets.
  private sweepTimer: TimerHandle | undefined;
  private successesSinceSweep = 0;
  // Kept sockets (reset modes).
  private trimTimer: TimerHandle | undefined;
  private readonly onTrimFn = (): void => this.onTrim();
  private started = 0;
  private batches = 0;
  private closed = false;

  /** Throws LB_ERR_NET_NATIVE_MISSING when the addon has no prober, or the addon's system error. */
  constructor(opts: NativeTcpProberOptions<C>) {
    this.clock = opts.clock ?? realClock;
    this.onOutcome = opts.onOutcome;
    const addon = (opts.addon ?? loadNative)();
    if (typeof addon.TcpProbeHandle !== 'function') {
      throw new LbError('LB_ERR_NET_NATIVE_MISSING', 'the native addon was built without TcpProbeHandle; rebuild it with `npm ci`', {});
    }
    const close = opts.close ?? 'reset-before-ack';
    this.sweeps = close === 'fin';
    this.handle = new addon.TcpProbeHandle((count) => this.onResults(count), this.rIds, this.rErrnos, CLOSE_MODE[close]);
  }

  start(target: TcpTarget, timeoutMs: number, ctx: C, now: number): number {
    if (this.closed) throw new Error('NativeTcpProber: start() after close()');
    const id = this.free.length > 0 ? this.free.pop()! : this.newId();
    this.ctx[id] = ctx;
    this.state[id] = QUEUED;
    this.startAt[id] = now;
    this.inFlight++;
    this.started++;
    if (this.qLen === this.qIds.length) this.growQueue();
    const q = this.qLen++;
    this.qIds[q] = id;
    this.qAddrs[q] = target.addressNum;
    if (target.addressNum === 0) this.qAddrs6.set(ipv6Bytes(target.address), q * 16);
    this.qPorts[q] = target.port;
    this.pushDeadline(id, now + timeoutMs, timeoutMs);
    if (!this.flushQueued) {
      this.flushQueued = true;
      queueMicrotask(this.flushFn);
    }
    return id;
  }

  cancel(handle: number, ctx: C): void {
    const id = handle;
    if (this.ctx[id] !== ctx || ctx === undefined) return;
    if (this.state[id] === QUEUED) {
      this.ctx[id] = undefined;
      this.state[id] = DROPPED;
      this.inFlight--;
    } else if (this.state[id] === CONNECTING) {
      this.handle.cancel(id);
      this.release(id);
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.handle.close();
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    if (this.sweepTimer !== undefined) this.clock.clearTimeout(this.sweepTimer);
    if (this.trimTimer !== undefined) this.clock.clearTimeout(this.trimTimer);
    this.timer = undefined;
    this.sweepTimer = undefined;
    this.trimTimer = undefined;
    this.rings.clear();
    this.ctx = [];
    this.state.fill(FREE);
    this.inFlight = 0;
    this.qLen = 0;
  }

  stats(): NativeTcpProberStats {
    const s = this.closed ? { connecting: 0, closing: 0, swept: 0, idle: 0, reused: 0, trimmed: 0 } : this.handle.stats();
    return { started: this.started, batches: this.batches, inFlight: this.inFlight, ...s };
  }

  // --- internals -------------------------------------------------------------

  private newId(): number {
    const id = this.nextId++;
    if (id >= this.state.length) {
      const n = this.state.length * 2;
      const grow = <T extends Uint8Array | Uint32Array | Float64Array>(a: T, make: (n: number) => T): T => { const b = make(n); b.set(a); return b; };
      this.state = grow(this.state, (k) => new Uint8Array(k));
      this.gen = grow(this.gen, (k) => new Uint32Array(k));
      this.startAt = grow(this.startAt, (k) => new Float64Array(k));
    }
    return id;
  }

  private growQueue(): void {
    const n = this.qIds.length * 2;
    const ids = new Uint32Array(n); ids.set(this.qIds);
    const addrs = new Uint32Array(n); addrs.set(this.qAddrs);
    const addrs6 = new Uint8Array(n * 16); addrs6.set(this.qAddrs6);
    this.qAddrs6 = addrs6;
    const ports = new Uint16Array(n); ports.set(this.qPorts);
    this.qIds = ids;
    this.qAddrs = addrs;
    this.qPorts = ports;
    this.qOut = new Int32Array(n);
  }

  /** The id is free for reuse; stale deadlines of it are recognised by gen. */
  private release(id: number): void {
    this.ctx[id] = undefined;
    this.state[id] = FREE;
    this.gen[id] = (this.gen[id]! + 1) >>> 0;
    this.free.push(id);
    this.inFlight--;
    // In a reset mode each ending (made, failed, timed out) may keep a socket.
    if (this.trimTimer === undefined && !this.sweeps && !this.closed) this.armTrim();
  }

  /** One connect() call for every probe started since the last flush. */
  private flush(): void {
    this.flushQueued = false;
    if (this.closed) return;
    let n = 0;
    for (let i = 0; i < this.qLen; i++) {
      const id = this.qIds[i]!;
      if (this.state[id] === DROPPED) {
        // Cancelled before it went down: nothing was opened.
        this.state[id] = FREE;
        this.gen[id] = (this.gen[id]! + 1) >>> 0;
        this.free.push(id);
        continue;
      }
      this.qIds[n] = id;
      this.qAddrs[n] = this.qAddrs[i]!;
      if (this.qAddrs[i] === 0 && n !== i) this.qAddrs6.copyWithin(n * 16, i * 16, i * 16 + 16);
      this.qPorts[n] = this.qPorts[i]!;
      n++;
    }
    this.qLen = 0;
    if (n === 0) return;
    this.batches++;
    let thrown: unknown;
    try {
      this.handle.connect(this.qIds, this.qAddrs, this.qPorts, n, this.qOut, this.qAddrs6);
    } catch (err) {
      thrown = err;
    }
    // Outcomes may start new probes (into the queue being read): take what is
    // needed first, report after.
    let settled: number[] | undefined;
    for (let i = 0; i < n; i++) {
      const id = this.qIds[i]!;
      const r = thrown === undefined ? this.qOut[i]! : -1;
      if (r === EINPROGRESS) {
        this.state[id] = CONNECTING;
      } else {
        (settled ??= []).push(id, r);
      }
    }
    if (!settled) return;
    const now = this.clock.now();
    const detail = thrown === undefined ? undefined : String((thrown as { code?: unknown }).code ?? (thrown as Error).message ?? thrown);
    for (let k = 0; k < settled.length; k += 2) {
      const id = settled[k]!;
      const r = settled[k + 1]!;
      if (this.state[id] !== QUEUED) continue;
      if (r >= 0) this.settle(id, r, now);
      else this.fail(id, 'error', detail ?? 'error', now);
    }
  }

  /** The addon's batch: rIds/rErrnos[0..count) hold (id, errno); 0 is connected. */
  private onResults(count: number): void {
    if (this.closed) return;
    const now = this.clock.now();
    for (let i = 0; i < count; i++) {
      const id = this.rIds[i]!;
      if (this.state[id] !== CONNECTING) continue;
      this.settle(id, this.rErrnos[i]!, now);
    }
  }

  private settle(id: number, errno: number, now: number): void {
    const ctx = this.ctx[id] as C;
    const durationMs = now - this.startAt[id]!;
    this.release(id);
    if (errno === 0) {
      if (this.sweeps) {
        this.successesSinceSweep++;
        if (this.sweepTimer === undefined) this.armSweep();
      }
      this.onOutcome(ctx, true, undefined, undefined, durationMs);
    } else {
      this.onOutcome(ctx, false, REASON_BY_ERRNO[errno] ?? 'error', errnoCode(errno), durationMs);
    }
  }

  private fail(id: number, reason: FailureReason, detail: string, now: number): void {
    const ctx = this.ctx[id] as C;
    const durationMs = now - this.startAt[id]!;
    this.release(id);
    this.onOutcome(ctx, false, reason, detail, durationMs);
  }

  private expire(id: number, timeoutMs: number, now: number): void {
    const detail = `no connection within ${timeoutMs} ms`;
    if (this.state[id] === CONNECTING) {
      this.handle.cancel(id);
      this.fail(id, 'timeout', detail, now);
      return;
    }
    // Still queued (only with a clock whose timers outrun microtasks): the
    // flush skips and frees it.
    const ctx = this.ctx[id] as C;
    this.ctx[id] = undefined;
    this.state[id] = DROPPED;
    this.inFlight--;
    this.onOutcome(ctx, false, 'timeout', detail, now - this.startAt[id]!);
  }

  private live(id: number, gen: number): boolean {
    const s = this.state[id];
    return this.gen[id] === gen && (s === QUEUED || s === CONNECTING);
  }

  private pushDeadline(id: number, at: number, timeoutMs: number): void {
    let ring = this.rings.get(timeoutMs);
    if (!ring) {
      ring = new DeadlineRing();
      this.rings.set(timeoutMs, ring);
    }
    // Finished probes leave their deadline behind; drop those at the head now
    // so the ring holds about one timeout's worth of probes.
    while (ring.len > 0 && !this.live(ring.ids[ring.head]!, ring.gens[ring.head]!)) ring.shift();
    ring.push(id, this.gen[id]!, at);
    if (at < this.timerAt) this.arm(at);
  }

  private arm(at: number): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = this.clock.setTimeout(this.onTimerFn, Math.max(0, Math.ceil(at - this.clock.now())));
  }

  /** Probes past their deadline are cancelled and fail as timeouts. */
  private onTimer(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    if (this.closed) return;
    const now = this.clock.now();
    let next = Infinity;
    for (const [timeoutMs, ring] of this.rings) {
      while (ring.len > 0) {
        const id = ring.ids[ring.head]!;
        if (!this.live(id, ring.gens[ring.head]!)) { ring.shift(); continue; }
        const at = ring.at[ring.head]!;
        if (at > now) { next = Math.min(next, at); break; }
        ring.shift();
        this.expire(id, timeoutMs, now);
      }
      if (ring.len === 0) this.rings.delete(timeoutMs);
    }
    // Outcomes may have armed the timer for probes they started.
    if (next < this.timerAt) this.arm(next);
  }

  private armTrim(): void {
    const t = this.clock.setTimeout(this.onTrimFn, TRIM_MS);
    t.unref?.();
    this.trimTimer = t;
  }

  private onTrim(): void {
    this.trimTimer = undefined;
    if (this.closed) return;
    if (this.handle.trim() > 0) this.armTrim();
  }

  /** Connected sockets wait between CLOSE_GRACE_MS / 2 and CLOSE_GRACE_MS for the backend's FIN. */
  private armSweep(): void {
    this.successesSinceSweep = 0;
    const t = this.clock.setTimeout(() => {
      this.sweepTimer = undefined;
      if (this.closed) return;
      const waiting = this.handle.sweep();
      if (waiting > 0 || this.successesSinceSweep > 0) this.armSweep();
    }, CLOSE_GRACE_MS / 2);
    t.unref?.();
    this.sweepTimer = t;
  }
}

/** The 16 bytes of an IPv6 target (network order). An addressNum of 0 with IPv4 text never comes from the config (0.0.0.0 is no backend). */
function ipv6Bytes(text: string): Uint8Array {
  const a = parseAddress(text);
  return a?.family === 'IPv6' ? addressToBytes(a) : new Uint8Array(16);
}
