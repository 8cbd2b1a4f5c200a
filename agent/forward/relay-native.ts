// forward/ layer: the proxy's relay, in the addon. The bytes move in C
// (native/src/relay.cc): accept4, the backend's connect, recv/send each way
// with backpressure and half-close, on the worker thread's own libuv loop
// through one epoll descriptor. This file is the TypeScript half: every
// decision stays in the engine (proxy-engine.ts) - backend choice, draining,
// limits, refusals, the one retry, the PROXY header's bytes, idle and connect
// timeouts - and this file turns the addon's batched records into the
// engine's Relay verbs and back.
//
// JavaScript is entered once per libuv wake-up with what needs a decision
// (accepted clients, connect results, ends, PROXY header outcomes), not per
// read or per write: a JavaScript call per read cost more CPU per request
// than HAProxy spends (bench/results/ has the runs). Bytes and the idle
// sweep's `seen` flag come from one activity() call per engine tick (every
// 100 ms while connections are open) and at each connection's end, so the
// flows' byte counters in status and metrics move in 100 ms steps and at ends.
//
// Accepted clients go to TypeScript 8 at a time within a wake-up (each holds
// a descriptor until the engine decides): a burst of 1,000 under a
// 256-descriptor limit is then refused over maxConnections, not dropped by
// EMFILE on accept (test/privileged/forward-exhaustion.test.ts).
//
// The price: C that must be right about descriptors. What it does not do:
// parse, choose, time anything out, or decide what an errno means.
import { getSystemErrorName } from 'node:util';
import { Relay, type PathListener, type RelayPath } from './proxy-engine';
import { addressFromBytes, addressToBytes, formatAddress, parseAddress, parseIPv4 } from '../address';
import {
  RELAY_ACCEPT, RELAY_ACCEPT_ERROR, RELAY_CONNECT, RELAY_END, RELAY_GONE, RELAY_HEADER, RELAY_RECORD,
  relayHandleClass, type NativeRelayHandle,
} from '../native/native';

/** Records per callback the addon may hand over before it calls again. */
const EVENT_RECORDS = 1024;
const ACTIVITY_ENTRIES = 1024;
/** Room for a PROXY header (v1's longest is 107 bytes, v2 IPv4 28, IPv6 52). */
const HEADER_ROOM = 128;

type Accepted = (err: string | undefined, relay: Relay | undefined) => void;

/** This thread's relay handle and its tables (each worker thread has its own module instance). */
let H: NativeRelayHandle | undefined;
let events: Float64Array;
let activity: Float64Array;
const relays = new Map<number, NativeRelay>();
const listeners = new Map<number, Accepted>();
const headerBuf = Buffer.allocUnsafe(HEADER_ROOM);
/** Backend addresses as the addon takes them: IPv4 a host-order number, IPv6 16 bytes (a handful per service; parsed once). */
const addresses = new Map<string, number | Uint8Array>();
const peer6Buf = new Uint8Array(16);

function errname(errno: number): string {
  try { return getSystemErrorName(-errno); } catch { return `E${errno}`; }
}

function backendAddress(host: string): number | Uint8Array | undefined {
  let n = addresses.get(host);
  if (n === undefined) {
    n = parseIPv4(host);
    if (n === undefined) {
      const a = parseAddress(host);
      if (a === undefined) return undefined;
      n = new Uint8Array(addressToBytes(a));
    }
    if (addresses.size > 4096) addresses.clear();
    addresses.set(host, n);
  }
  return n;
}

class NativeRelay extends Relay {
  /** Refused: what the engine's linger bookkeeping holds until the client is gone. */
  gone: { destroy(): void } | undefined;

  /** peerAt: IPv4 the client's address * 65536 + port; IPv6 (v6) its port alone. */
  constructor(readonly id: number, readonly peerAt: number, readonly v6: boolean) {
    super();
  }

  connect(host: string, port: number): void {
    const addr = backendAddress(host);
    const err = addr === undefined ? 22 /* EINVAL: not an address */
      : typeof addr === 'number' ? H!.connect(this.id, addr, port) : H!.connect(this.id, 0, port, addr);
    if (err !== 0) this.engine.connectDone(this, errname(err));
  }

  abortConnect(code: string): void {
    if (H!.abort(this.id)) this.engine.connectDone(this, code);
  }

  /** The addon's connect result (0: connected). */
  connectResult(errno: number): void {
    this.engine.connectDone(this, errno === 0 ? undefined : errname(errno));
  }

  start(proxyHeader: boolean): void {
    if (!proxyHeader) { H!.start(this.id); return; }
    const n = this.engine.writeHeader(this, headerBuf, 0);
    H!.start(this.id, headerBuf, n);
  }

  peer(): { address: string; port: number } | undefined {
    if (this.v6) {
      if (!H!.peer6(this.id, peer6Buf)) return undefined;
      return { address: formatAddress(addressFromBytes('IPv6', peer6Buf)), port: this.peerAt };
    }
    const a = Math.floor(this.peerAt / 65536);
    return { address: `${a >>> 24}.${(a >>> 16) & 255}.${(a >>> 8) & 255}.${a & 255}`, port: this.peerAt % 65536 };
  }

  /** The addon ended the connection (both sides done, or an error that reset both). */
  ended(toBackend: number, toClient: number): void {
    relays.delete(this.id);
    this.engine.bytes(this, toBackend, toClient);
    this.engine.done(this);
  }

  /** Closed from here (close/reset): the bytes not yet reported are in activity[0..1]. */
  private closedHere(): void {
    relays.delete(this.id);
    this.engine.bytes(this, activity[0]!, activity[1]!);
    this.engine.done(this);
  }

  reset(): void {
    if (!relays.has(this.id)) return;
    H!.reset(this.id);
    this.closedHere();
  }

  destroy(): void {
    if (!relays.has(this.id)) return;
    H!.close(this.id);
    this.closedHere();
  }

  refuse(): void {
    if (!relays.has(this.id) || this.gone !== undefined) return;
    const id = this.id;
    const gone = { destroy: (): void => { if (relays.get(id) === this) { relays.delete(id); H!.close(id); } } };
    this.gone = gone;
    this.engine.done(this);
    H!.refuse(id);
    // The client may already have closed (refuse read its end): then it is gone now.
    if (!relays.has(id)) return;
    if (!this.engine.lingerRefused(gone)) gone.destroy();
  }
}

function onEvents(count: number): void {
  const ev = events;
  for (let i = 0; i < count; i++) {
    const k = i * RELAY_RECORD;
    const kind = ev[k]!;
    const id = ev[k + 1]!;
    switch (kind) {
      case RELAY_ACCEPT: {
        const accepted = listeners.get(ev[k + 2]!);
        const r = new NativeRelay(id, ev[k + 3]!, ev[k + 4] === 6);
        relays.set(id, r);
        if (accepted) accepted(undefined, r);
        else { relays.delete(id); H!.close(id); }
        break;
      }
      case RELAY_ACCEPT_ERROR:
        listeners.get(ev[k + 2]!)?.(errname(ev[k + 3]!), undefined);
        break;
      case RELAY_CONNECT:
        relays.get(id)?.connectResult(ev[k + 2]!);
        break;
      case RELAY_END:
        relays.get(id)?.ended(ev[k + 3]!, ev[k + 4]!);
        break;
      case RELAY_HEADER: {
        const r = relays.get(id);
        if (r) r.engine.headerSent(ev[k + 2] === 1);
        break;
      }
      case RELAY_GONE: {
        const r = relays.get(id);
        if (r) { relays.delete(id); if (r.gone) r.engine.refusedGone(r.gone); }
        break;
      }
    }
  }
}

/** The engine's tick: traffic since the last one marks its relays seen and adds their bytes. */
function refresh(): void {
  for (;;) {
    const n = H!.activity();
    for (let i = 0; i < n; i++) {
      const r = relays.get(activity[i * 3]!);
      if (!r) continue;
      r.seen = true;
      r.engine.bytes(r, activity[i * 3 + 1]!, activity[i * 3 + 2]!);
    }
    if (n < ACTIVITY_ENTRIES) return;
  }
}

/**
 * This thread's addon relay: what it holds open (tests: nothing left behind),
 * the libuv wake-ups it handled and the reads of its epoll after a wake-up's
 * first that found something (relay.cc Drain).
 */
export function nativeRelayStats(): ReturnType<NativeRelayHandle['stats']> | undefined {
  return H?.stats();
}

/** The relay in the addon, or why it cannot be had (an addon built without it). */
export function nativeRelayPath(): RelayPath | string {
  if (H === undefined) {
    const C = relayHandleClass();
    if (typeof C === 'string') return C;
    events = new Float64Array(EVENT_RECORDS * RELAY_RECORD);
    activity = new Float64Array(ACTIVITY_ENTRIES * 3);
    H = new C(onEvents, events, activity);
  }
  const h = H;
  return {
    refresh,
    listen(fd: number, backlog: number, accepted: Accepted): PathListener {
      let lid: number;
      try {
        lid = h.listen(fd, backlog);
      } catch (err) {
        const code = (err as { code?: string }).code ?? 'EINVAL';
        throw Object.assign(new Error(`${code}: cannot listen on descriptor ${fd}: ${(err as Error).message}`), { code });
      }
      listeners.set(lid, accepted);
      return { close: () => { if (listeners.get(lid) === accepted) { listeners.delete(lid); h.unlisten(lid); } } };
    },
  };
}
