// forward/ layer: the proxy's relay through libuv handles (issue 18): the
// fallback since the relay moved into the addon (relay-native.ts), used when
// the addon predates it. s25 (2026-11-24, bench/forward.ts --workers 1
// --targets proxy,proxy-raw,haproxy, 2 rounds, one run, load average ~3 on
// 2 vCPUs): this path 35.0 us of CPU per keep-alive request and 187 per new
// connection, the addon's relay 20.7 and 122, HAProxy 21.2 and 117.
//
// Each connection is
// held as two libuv TCP handles from Node's own tcp_wrap/stream_wrap
// bindings - the objects under every net.Socket - without the net.Socket,
// the Duplex, its two stream states, its event emitter, its timers and the
// closures each of them carries. Measured in the bench lab (wrk -c50,
// `Connection: close`, 3 nginx backends, this 2-vCPU VM): 310 us of CPU per
// new connection through net.Socket against 142 us here (HAProxy: 114 us);
// RSS under that load 94 MiB against 50 MiB (far fewer objects for the GC).
//
// What it does per connection: accept (libuv, the listener's descriptor),
// connect the backend (one TCPConnectWrap), read each side into a 16 KiB buffer of its own (useUserBuffer: no
// allocation per read) and write what was read to the other side. A write
// that completes at once (the common case) needs nothing more; one that
// does not keeps its buffer (the next read gets a fresh one) and stops the
// reading side until it completes: backpressure, one write in flight per
// direction. A FIN from one side becomes a FIN to the other once what was
// read before it is written (half-close): shutdown(2) from the addon one loop
// turn later (finTurn below), not uv_shutdown; both ends done closes both. An
// error on either side resets both.
//
// The PROXY protocol header (issue 17) goes out in the same write as the
// client's first bytes: it is written into the client's read buffer and the
// first read lands right behind it, so the backend gets one segment (one
// send, one packet, one read for it) instead of a header segment and then
// the request. HAProxy pays that extra segment (send-proxy-v2 cost it 11% of
// its new connections/s in the 2026-11-24 bench; the separate write cost
// lb-agent 16%). A client that has sent nothing one loop turn after the
// backend connected (a server-speaks-first protocol: SMTP, MySQL...) does
// not hold the backend's greeting back: its header then goes alone. The
// status counts both (details.proxyHeaders).
//
// Where the rest of the gap to HAProxy is (2026-11-24, bench/forward.ts
// --syscalls --workers 1, one thread each, load average 11-16 on 2 vCPUs):
// keep-alive costs both the same 2 reads and 2 writes a request, no
// epoll_ctl, no EAGAIN; a new connection costs us ~20 syscalls against
// HAProxy's ~18: 5 epoll_ctl against 3 (libuv's uv_close removes each
// descriptor from the epoll set before close(2), 2.3% of our CPU on new
// connections; HAProxy lets close(2) do it) and libuv's getsockopt(SO_ERROR)
// after the connect, against HAProxy's fcntl and second setsockopt. So the
// syscalls are not it: perf puts ~21% of our keep-alive CPU in the node
// binary (libuv and the glue of a JavaScript call per read: MakeCallback,
// callback scopes, trace/async-hook checks, a typed array per read),
// JavaScript itself ~2%, the kernel ~66% (TCP, as for HAProxy). UV_USE_IO_URING=1
// (libuv batches epoll_ctl through io_uring) measured worse: 40 against
// 27 us/request keep-alive, 221 against 172 us per new connection (medians of
// 3 rounds, same run). Closing that gap means moving bytes without a
// JavaScript call per read (a relay in the addon), not trimming this file.
//
// s24 (2026-11-24, perf record -g with --perf-basic-prof, bench/forward.ts
// --perf, wrk -c50 `Connection: close`, one thread each, load average 5-7 on
// 2 vCPUs from other work): 190 us of CPU per new connection against
// HAProxy's 134 in that run. Split: kernel 137 us against 110 (write 45
// against sendto 30, of which waking the peer - sock_def_readable, costly
// interrupt enabling on this paravirtualised guest - is 29 against 16 and
// grows when the peer sleeps, i.e. at a lower rate; epoll_ctl 7.2 against
// 2.6; connect 22 against 19), user space 52 us against 23: node and V8's
// glue 23 (MakeCallback/Function::Call per read or completion, the handle
// objects Node builds per accept and per connect), libc's side of the
// syscalls 13, libuv 6, GC 3, our JavaScript 4 (the balancer, tallies and
// relay logic together). strace: 6.9 epoll_ctl per connection (0.9 failing:
// libuv's uv_close DELs a descriptor its poll already dropped as stale after
// EOF) against HAProxy's 3.2, and 0.9 shutdown(2) (each a POLLOUT MOD, a loop
// turn and a JavaScript completion) against 0.35. What was cut: the FIN by
// shutdown(2) from the addon (no ShutdownWrap, no epoll_ctl MODs, no
// completion call), no readStop on EOF (libuv stops reading itself), no
// address/port on the connect request. Measured: epoll_ctl 6.9 -> 5.3-5.8
// per connection; the FIN sent at once, the backend's EOF read, cut the
// failing DELs to 0.1 but made us shut (and TIME_WAIT) nearly every client
// socket (1.05 shutdown per connection) where, one turn later, 0.7. CPU per
// new connection, A/B alternating the builds under load average 10-12 from
// other work: before 154-168 us (median 160) against HAProxy's 109-116, after
// 137-194 (median 150) against 103-112 - about 6% less, inside this shared
// machine's noise; the lead's quiet run decides. What is left is Node's: a
// JavaScript entry per read and completion (7 per connection), the handle
// objects, libuv's stale-descriptor DELs - a relay in the addon's territory.
//
// The price is leaning on bindings Node does not document (process.binding
// is deprecated, though still served for these modules in Node 20). So the
// binding is checked once, shape by shape, when the engine starts; anything
// missing makes the engine use relay-net.ts (public net API) instead, says
// so in a warn line and in `relay` of the stats, and the proxy tests fail
// when the fast path was expected and not taken.
import { getSystemErrorName } from 'node:util';
import { Relay, type PathListener, type RelayPath } from './proxy-engine';
import { shutdownWriteFn } from '../native/native';

/** A libuv TCP handle as Node's tcp_wrap exposes it (the subset used here). */
interface TcpHandle {
  open(fd: number): number;
  listen(backlog: number): number;
  connect(req: object, address: string, port: number): number;
  readStart(): number;
  readStop(): number;
  useUserBuffer(buf: Buffer): void;
  writeBuffer(req: object, buf: Buffer): number;
  shutdown(req: object): number;
  close(cb?: () => void): void;
  reset(cb?: () => void): number;
  setNoDelay(on: boolean): number;
  getpeername(out: Record<string, unknown>): number;
  /** The socket's descriptor (-1 before libuv made one). */
  readonly fd: number;
  onread: ((arrayBuffer?: ArrayBuffer) => Buffer | undefined) | null;
  onconnection: ((err: number, handle: TcpHandle | undefined) => void) | null;
  [OWNER]?: unknown;
}

interface RawBinding {
  TCP: new (type: number) => TcpHandle;
  TCPConnectWrap: new () => { oncomplete?: unknown; address?: string; port?: number };
  SOCKET: number;
  SERVER: number;
  WriteWrap: new () => Record<string, unknown>;
  ShutdownWrap: new () => Record<string, unknown>;
  state: Int32Array;
  kReadBytesOrError: number;
  kLastWriteWasAsync: number;
  UV_EOF: number;
}

const OWNER = Symbol('lb-agent relay');
const BUFFER_SIZE = 16 * 1024;
const FREE_BUFFERS_MAX = 256;
const TO_BACKEND = 0;
const TO_CLIENT = 1;

const HANDLE_METHODS = ['open', 'listen', 'connect', 'readStart', 'readStop', 'useUserBuffer', 'writeBuffer', 'shutdown', 'close', 'reset', 'setNoDelay', 'getpeername'] as const;

/** The bindings, checked: the binding or why it cannot be used. */
export function loadRawBinding(): RawBinding | string {
  try {
    const pb = (process as unknown as { binding?: (name: string) => Record<string, unknown> }).binding;
    if (typeof pb !== 'function') return 'process.binding is not available';
    const tcp = pb('tcp_wrap');
    const sw = pb('stream_wrap');
    const uv = pb('uv');
    const TCP = tcp['TCP'] as RawBinding['TCP'] | undefined;
    const constants = tcp['constants'] as { SOCKET?: unknown; SERVER?: unknown } | undefined;
    if (typeof TCP !== 'function' || typeof tcp['TCPConnectWrap'] !== 'function') return 'tcp_wrap has no TCP or TCPConnectWrap';
    if (typeof constants?.SOCKET !== 'number' || typeof constants.SERVER !== 'number') return 'tcp_wrap has no SOCKET/SERVER constants';
    for (const m of HANDLE_METHODS) {
      if (typeof (TCP.prototype as unknown as Record<string, unknown>)[m] !== 'function') return `TCP handles have no ${m}()`;
    }
    if (typeof sw['WriteWrap'] !== 'function' || typeof sw['ShutdownWrap'] !== 'function') return 'stream_wrap has no WriteWrap or ShutdownWrap';
    if (!(sw['streamBaseState'] instanceof Int32Array)) return 'stream_wrap has no streamBaseState';
    if (typeof sw['kReadBytesOrError'] !== 'number' || typeof sw['kLastWriteWasAsync'] !== 'number') return 'stream_wrap has no kReadBytesOrError/kLastWriteWasAsync';
    const eof = uv['UV_EOF'];
    return {
      TCP, TCPConnectWrap: tcp['TCPConnectWrap'] as RawBinding['TCPConnectWrap'], SOCKET: constants.SOCKET, SERVER: constants.SERVER,
      WriteWrap: sw['WriteWrap'] as RawBinding['WriteWrap'], ShutdownWrap: sw['ShutdownWrap'] as RawBinding['ShutdownWrap'],
      state: sw['streamBaseState'] as Int32Array, kReadBytesOrError: sw['kReadBytesOrError'] as number, kLastWriteWasAsync: sw['kLastWriteWasAsync'] as number,
      UV_EOF: typeof eof === 'number' ? eof : -4095,
    };
  } catch (err) {
    return `the bindings could not be loaded: ${(err as Error).message}`;
  }
}

let B: RawBinding;
/** Read buffers no relay holds, reused (per thread: each worker has its own module instance). */
const free: Buffer[] = [];
/** One buffer every refused client's bytes are read into and dropped. */
let discardBuffer: Buffer | undefined;
/** shutdown(2) SHUT_WR from the addon; undefined: libuv's uv_shutdown instead. */
let shutdownWrite: ((fd: number) => number) | undefined;
/** A write request kept for writes that complete at once (the native side keeps nothing of those). */
let spareWrite: Record<string, unknown> | undefined;

function getBuffer(): Buffer {
  return free.pop() ?? Buffer.allocUnsafe(BUFFER_SIZE);
}

function putBuffer(b: Buffer | undefined): void {
  if (b !== undefined && free.length < FREE_BUFFERS_MAX) free.push(b);
}

function newWriteReq(): Record<string, unknown> {
  const req = new B.WriteWrap();
  req['oncomplete'] = afterWrite;
  return req;
}

function errname(err: number): string {
  try { return getSystemErrorName(err); } catch { return `E${-err}`; }
}

class RawRelay extends Relay {
  u: TcpHandle | undefined;
  cBuf: Buffer | undefined;
  uBuf: Buffer | undefined;
  cEof = false;
  uEof = false;
  cShut = false;
  uShut = false;
  /** The PROXY header's length at the start of cBuf, the client's first read going right behind it; 0 once that read came. */
  hLen = 0;
  /** The header went out alone (the client was silent): the first read is written without it. */
  hSent = false;
  /** Writes in flight to the client / to the backend. */
  toC = 0;
  toU = 0;
  closing = false;
  abortCode: string | undefined;

  constructor(readonly c: TcpHandle) {
    super();
  }

  connect(host: string, port: number): void {
    const u = new B.TCP(B.SOCKET);
    u[OWNER] = this;
    u.setNoDelay(true); // applied when libuv creates the socket
    this.u = u;
    this.abortCode = undefined;
    const req = new B.TCPConnectWrap();
    req.oncomplete = afterConnect;
    let err = u.connect(req, host, port);
    if (err === 0) {
      // Read from the backend from the start: libuv then registers the socket
      // once for both the connect (POLLOUT) and reads (POLLIN), where a read
      // started after the connect costs an EPOLL_CTL_ADD that fails with
      // EEXIST and a MOD (issue 18). libuv reports the connect before any
      // read on the socket, so start() has run when the first read comes.
      this.uBuf ??= getBuffer();
      u.useUserBuffer(this.uBuf);
      u.onread = onBackendRead;
      err = u.readStart();
    }
    if (err !== 0) {
      // Refused before a packet left (EMFILE, EADDRNOTAVAIL...).
      this.u = undefined;
      u.close();
      this.engine.connectDone(this, errname(err));
    }
  }

  abortConnect(code: string): void {
    const u = this.u;
    if (!u || this.abortCode !== undefined) return;
    this.abortCode = code;
    // libuv calls the connect back with ECANCELED; afterConnect reports `code`.
    u.close();
  }

  connected(status: number, u: TcpHandle): void {
    if (u !== this.u) return; // an attempt already given up
    if (status !== 0) {
      const code = this.abortCode ?? errname(status);
      this.u = undefined;
      if (this.abortCode === undefined) u.close();
      this.engine.connectDone(this, code);
      return;
    }
    if (this.finished || this.closing) {
      this.u = undefined;
      u.close();
      this.engine.connectDone(this, undefined);
      return;
    }
    this.engine.connectDone(this, undefined);
  }

  start(proxyHeader: boolean): void {
    const c = this.c;
    const cBuf = getBuffer();
    this.cBuf = cBuf;
    const hLen = proxyHeader ? this.engine.writeHeader(this, cBuf, 0) : 0;
    if (hLen > 0) {
      // The client's first read lands behind the header; read() writes both at once.
      this.hLen = hLen;
      c.useUserBuffer(cBuf.subarray(hLen));
      awaitHeader(this);
    } else {
      c.useUserBuffer(cBuf);
    }
    c.onread = onClientRead;
    c.readStart();
  }

  /** The client was silent a loop turn after the backend connected: its PROXY header goes alone. */
  sendHeaderAlone(): void {
    if (this.closing || this.hLen === 0 || this.hSent) return;
    this.hSent = true;
    this.engine.headerSent(false);
    const header = this.cBuf!.subarray(0, this.hLen);
    const req = spareWrite ?? newWriteReq();
    spareWrite = undefined;
    const err = this.u!.writeBuffer(req, header);
    if (err !== 0) { spareWrite = req; this.fail(); return; }
    if (!B.state[B.kLastWriteWasAsync]) { spareWrite = req; return; }
    // With the header still queued the client waits (backpressure), as after any pending write.
    req['relay'] = this; req['dir'] = TO_BACKEND; req['buffer'] = header; req['full'] = undefined;
    this.toU++;
    this.c.readStop();
  }

  /** One read completed on `from`; returns the next buffer to read into when the current one is lent to a write. */
  read(dir: number): Buffer | undefined {
    const nread = B.state[B.kReadBytesOrError]!;
    if (nread > 0) {
      this.seen = true;
      const toBackend = dir === TO_BACKEND;
      const from = toBackend ? this.c : this.u!;
      const to = toBackend ? this.u! : this.c;
      const buf = toBackend ? this.cBuf! : this.uBuf!;
      this.engine.bytes(this, toBackend ? nread : 0, toBackend ? 0 : nread);
      // The client's first read sits behind the PROXY header: both in one write (unless the header went alone).
      const hLen = toBackend ? this.hLen : 0;
      let data: Buffer;
      if (hLen === 0) data = buf.subarray(0, nread);
      else {
        this.hLen = 0;
        if (this.hSent) data = buf.subarray(hLen, hLen + nread);
        else { this.hSent = true; this.engine.headerSent(true); data = buf.subarray(0, hLen + nread); }
      }
      const req = spareWrite ?? newWriteReq();
      spareWrite = undefined;
      const err = to.writeBuffer(req, data);
      if (err !== 0) { spareWrite = req; this.fail(); return undefined; }
      // After the first read behind the header, the next ones use the whole buffer again.
      if (!B.state[B.kLastWriteWasAsync]) { spareWrite = req; return hLen === 0 ? undefined : buf; }
      // Not all written: the request keeps the buffer; the reading side waits.
      req['relay'] = this; req['dir'] = dir; req['buffer'] = data; req['full'] = buf;
      from.readStop();
      const next = getBuffer();
      if (toBackend) { this.toU++; this.cBuf = next; } else { this.toC++; this.uBuf = next; }
      return next;
    }
    if (nread === 0) return undefined;
    if (nread !== B.UV_EOF) { this.fail(); return undefined; }
    // A client that ends without a byte: the backend still gets its header, then the FIN.
    if (dir === TO_BACKEND && this.hLen !== 0) { this.sendHeaderAlone(); this.hLen = 0; if (this.closing) return undefined; }
    // libuv stopped reading that side itself on EOF (uv__stream_eof): no readStop call.
    if (dir === TO_BACKEND) this.cEof = true; else this.uEof = true;
    this.maybeEnd();
    return undefined;
  }

  written(dir: number, status: number, full: Buffer | undefined): void {
    putBuffer(full);
    if (this.closing) return;
    if (status < 0) { this.fail(); return; }
    if (dir === TO_BACKEND) {
      if (--this.toU === 0 && !this.cEof) this.c.readStart();
    } else if (--this.toC === 0 && !this.uEof) {
      this.u!.readStart();
    }
    this.maybeEnd();
  }

  /** Half-close: a side that sent its FIN, all of it written on, gets the other side a FIN; both done closes both. */
  private maybeEnd(): void {
    if (this.closing) return;
    const cDone = this.cEof && this.toU === 0;
    const uDone = this.uEof && this.toC === 0;
    if (cDone && uDone) { this.close(); return; }
    if (cDone && !this.uShut) { this.uShut = true; this.shutdown(TO_BACKEND); }
    if (uDone && !this.cShut) { this.cShut = true; this.shutdown(TO_CLIENT); }
  }

  /** Send a FIN on the side bytes flow to in `dir` (the other side has ended and all it sent is written). */
  private shutdown(dir: number): void {
    if (shutdownWrite !== undefined) { awaitShutdown(this, dir); return; }
    this.uvShutdown(dir === TO_BACKEND ? this.u! : this.c);
  }

  /** The deferred FIN (see finTurn): unless the relay ended meanwhile, shutdown(2) on the socket. */
  shutdownNow(dir: number): void {
    if (this.closing) return;
    const h = dir === TO_BACKEND ? this.u : this.c;
    const fd = h === undefined ? -1 : h.fd;
    if (fd < 0) { this.uvShutdown(h!); return; }
    // An error is handled as uv_shutdown's completion would be: both reset.
    if (shutdownWrite!(fd) !== 0) this.fail();
  }

  private uvShutdown(h: TcpHandle): void {
    const req = new B.ShutdownWrap();
    req['oncomplete'] = afterShutdown;
    req['handle'] = h;
    req['relay'] = this;
    if (h.shutdown(req) !== 0) this.close();
  }

  shutdownDone(status: number): void {
    if (status < 0 && !this.closing) this.fail();
  }

  peer(): { address: string; port: number } | undefined {
    const out: Record<string, unknown> = {};
    if (this.c.getpeername(out) !== 0 || typeof out['address'] !== 'string' || typeof out['port'] !== 'number') return undefined;
    return { address: out['address'], port: out['port'] };
  }

  /** Close both sides (FIN when nothing is left unread, as close(2) does). */
  close(): void {
    if (this.closing) return;
    this.closing = true;
    this.c.close();
    const u = this.u;
    if (u) { this.u = undefined; u.close(); }
    this.release();
  }

  private release(): void {
    putBuffer(this.cBuf);
    putBuffer(this.uBuf);
    this.cBuf = undefined;
    this.uBuf = undefined;
    this.engine.done(this);
  }

  /** An error on either side: both are reset (RST), so neither end mistakes it for a clean end. */
  fail(): void {
    if (this.closing) return;
    this.closing = true;
    resetOrClose(this.c);
    const u = this.u;
    if (u) { this.u = undefined; resetOrClose(u); }
    this.release();
  }

  reset(): void {
    if (this.closing) return;
    this.closing = true;
    const u = this.u;
    if (u) { this.u = undefined; u.close(); }
    resetOrClose(this.c);
    this.release();
  }

  refuse(): void {
    if (this.closing) return;
    this.closing = true;
    const u = this.u;
    if (u) { this.u = undefined; u.close(); }
    const c = this.c;
    let closed = false;
    const gone = { destroy: (): void => { if (!closed) { closed = true; c.close(); } } };
    this.release();
    if (!this.engine.lingerRefused(gone)) {
      // Under a flood the descriptor goes now: still a FIN unless the client already sent bytes.
      gone.destroy();
      return;
    }
    discardBuffer ??= Buffer.allocUnsafe(BUFFER_SIZE);
    c.useUserBuffer(discardBuffer);
    c[OWNER] = { gone, engine: this.engine };
    c.onread = onDiscardRead;
    c.readStart();
    const req = new B.ShutdownWrap();
    req['oncomplete'] = noop;
    req['handle'] = c;
    if (c.shutdown(req) !== 0) { this.engine.refusedGone(gone); gone.destroy(); }
  }

  destroy(): void {
    if (this.closing) return;
    if (this.u && this.connecting) {
      // Connect in flight: give it up; its late report finds the relay finished and counts nothing.
      this.closing = true;
      const u = this.u;
      this.u = undefined;
      this.engine.done(this);
      u.close();
      this.c.close();
      putBuffer(this.uBuf);
      this.uBuf = undefined;
      return;
    }
    this.close();
  }
}

/**
 * Relays whose PROXY header waits for the client's first bytes. start() runs
 * in the poll phase (the connect's completion); the client's descriptor is
 * polled in the next turn's poll phase, so a header still unsent at the
 * second check phase (setImmediate) after start goes alone. One immediate per
 * loop turn for every relay started in it, no timer per connection.
 */
let headerWaiting: RawRelay[] = [];
let headerLast: RawRelay[] = [];
let headerTurnQueued = false;

function awaitHeader(r: RawRelay): void {
  headerWaiting.push(r);
  if (!headerTurnQueued) { headerTurnQueued = true; setImmediate(headerTurn); }
}

function headerTurn(): void {
  headerTurnQueued = false;
  const due = headerLast;
  headerLast = headerWaiting;
  headerWaiting = [];
  for (const r of due) r.sendHeaderAlone();
  if (headerLast.length > 0) { headerTurnQueued = true; setImmediate(headerTurn); }
}

/**
 * FINs waiting for their turn (issue 18). A side is shut (maybeEnd) only with
 * no write in flight, so libuv's queue for it is empty and shutdown(2) from
 * the addon does what uv_shutdown would, without its round trip: POLLOUT
 * armed and disarmed (two epoll_ctl), a ShutdownWrap and a JavaScript
 * completion. It goes out at the second check phase after the other side's
 * end was read - one loop turn later, as uv_shutdown's FIN did - so that a
 * client which closes as soon as it has its answer (an HTTP client on
 * `Connection: close`) is usually read to its end first: then both sockets
 * just close, with no shutdown(2) and no TIME_WAIT socket on our side.
 */
let finWaiting: RawRelay[] = [];
let finWaitingDir: number[] = [];
let finLast: RawRelay[] = [];
let finLastDir: number[] = [];
let finTurnQueued = false;

function awaitShutdown(r: RawRelay, dir: number): void {
  finWaiting.push(r);
  finWaitingDir.push(dir);
  if (!finTurnQueued) { finTurnQueued = true; setImmediate(finTurn); }
}

function finTurn(): void {
  finTurnQueued = false;
  const due = finLast;
  const dueDir = finLastDir;
  finLast = finWaiting;
  finLastDir = finWaitingDir;
  finWaiting = [];
  finWaitingDir = [];
  for (let i = 0; i < due.length; i++) due[i]!.shutdownNow(dueDir[i]!);
  if (finLast.length > 0) { finTurnQueued = true; setImmediate(finTurn); }
}

function resetOrClose(h: TcpHandle): void {
  // uv_tcp_close_reset refuses a socket that already sent its FIN; close() then.
  if (h.reset() !== 0) h.close();
}

function noop(): void { /* nothing to do */ }

function onClientRead(this: TcpHandle): Buffer | undefined {
  return (this[OWNER] as RawRelay).read(TO_BACKEND);
}

function onBackendRead(this: TcpHandle): Buffer | undefined {
  return (this[OWNER] as RawRelay).read(TO_CLIENT);
}

function afterConnect(this: unknown, status: number, handle: TcpHandle): void {
  (handle[OWNER] as RawRelay).connected(status, handle);
}

function afterWrite(this: Record<string, unknown>, status: number): void {
  const r = this['relay'] as RawRelay;
  r.written(this['dir'] as number, status, this['full'] as Buffer | undefined);
}

function afterShutdown(this: Record<string, unknown>, status: number): void {
  (this['relay'] as RawRelay).shutdownDone(status);
}

function onDiscardRead(this: TcpHandle): undefined {
  const nread = B.state[B.kReadBytesOrError]!;
  if (nread >= 0) return undefined;
  const o = this[OWNER] as { gone: { destroy(): void }; engine: { refusedGone(g: object): void } };
  o.engine.refusedGone(o.gone);
  o.gone.destroy();
  return undefined;
}

interface ListenerOwner {
  accepted: (err: string | undefined, relay: Relay | undefined) => void;
}

function onConnection(this: TcpHandle, err: number, handle: TcpHandle | undefined): void {
  const l = this[OWNER] as ListenerOwner;
  if (err !== 0 || handle === undefined) { l.accepted(errname(err), undefined); return; }
  const r = new RawRelay(handle);
  handle[OWNER] = r;
  l.accepted(undefined, r);
}

/** How this thread's relays send a half-close's FIN: shutdown(2) from the addon, or libuv's uv_shutdown (an addon without it). */
export function rawShutdownPath(): 'direct' | 'libuv' {
  return shutdownWrite !== undefined ? 'direct' : 'libuv';
}

/** The fast path, or why it cannot be had here. */
export function rawRelayPath(): RelayPath | string {
  const b = loadRawBinding();
  if (typeof b === 'string') return b;
  B = b;
  // The direct shutdown needs the handle's descriptor; without either, uv_shutdown.
  shutdownWrite = 'fd' in B.TCP.prototype ? shutdownWriteFn() : undefined;
  return {
    kind: 'raw',
    listen(fd: number, backlog: number, accepted: ListenerOwner['accepted']): PathListener {
      const h = new B.TCP(B.SERVER);
      let err = h.open(fd);
      if (err !== 0) { h.close(); throw Object.assign(new Error(`${errname(err)}: cannot use listening descriptor ${fd}`), { code: errname(err) }); }
      // Accepted sockets inherit TCP_NODELAY from the listener (Linux clones the
      // listener's tcp_sock): one setsockopt per listener instead of one per
      // connection (issue 18). Set here, not at bind, so that a socket an older
      // lb-agent left behind gets it too.
      err = h.setNoDelay(true);
      if (err !== 0) { h.close(); throw Object.assign(new Error(`${errname(err)}: TCP_NODELAY on listening descriptor ${fd}`), { code: errname(err) }); }
      h[OWNER] = { accepted } satisfies ListenerOwner;
      h.onconnection = onConnection;
      err = h.listen(backlog);
      if (err !== 0) { h.close(); throw Object.assign(new Error(`${errname(err)}: listen on descriptor ${fd}`), { code: errname(err) }); }
      return { close: () => h.close() };
    },
  };
}
