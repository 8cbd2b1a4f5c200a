// Health probes (driver, socket I/O): one TCP connect, one HTTP GET, or one
// HTTP GET over TLS, to a backend's health-check port with the timeout
// enforced by our own timer (for HTTPS it covers connect, handshake and
// response: a backend that accepts and never finishes the handshake fails
// within it, its sockets destroyed).
// A probe never throws and never rejects: it resolves to a result with a
// reason from a fixed set (also a metric label). No state, no scheduling.
// With `proxyProtocol` a probe sends the PROXY protocol header first, as a
// backend that requires it on every connection expects: v1 a
// TCP4 line with the probe's own addresses, v2 the LOCAL command
// (doc/proxy-protocol.txt, 2.1 and 2.2: what a proxy sends for its checks).
//
// Also the TcpProber contract the checker drives TCP probes through, and its
// Node-socket implementation: the fallback of the native batch prober
// (native-probe.ts) and the path it is measured against.
import * as net from 'node:net';
import * as http from 'node:http';
import type * as tls from 'node:tls';
import type { CheckType, HttpCheckSpec, ProxyProtocolVersion } from '../config/types';
import { healthCheckHeader } from '../forward/proxy-protocol';
import type { FailureReason } from './state';

/** The TLS side of an HTTPS probe, made once per target (health/tls.ts), never per probe. */
export interface TlsProbeSettings {
  /** The server name sent in the ClientHello; undefined sends none. */
  readonly servername: string | undefined;
  /** Shared by every target with the same CA (or none). */
  readonly context: tls.SecureContext;
  /** Verify the chain against the context's CAs, and the name against servername when set. */
  readonly verify: boolean;
  /** The target's TLS session, which its next probes resume; written by the probes. Undefined: every probe makes a full handshake. */
  readonly resume?: TlsResumption | undefined;
  /** node:tls's connect, looked up once with the context (health/tls.ts); undefined: each probe requires node:tls. */
  readonly connect?: typeof tls.connect | undefined;
}

/** A target's last TLS session, and when a full handshake (the certificate verified) last happened. */
export interface TlsResumption {
  session: Buffer | undefined;
  /** performance.now() of the last full handshake. */
  fullAt: number;
}

/**
 * How long probes resume a session after a full handshake. A resumed
 * handshake skips the certificate (its chain, its signature, its dates): the
 * larger part of a check's CPU, which is why HAProxy's checks resume too. A
 * full one comes at least this often, so a certificate that expires or is
 * replaced by one that does not verify is seen within it.
 */
export const TLS_RESUME_MS = 60_000;

export interface ProbeTarget {
  readonly address: string;
  readonly port: number;
  readonly type: CheckType;
  /** Required when type is 'http' or 'https'. */
  readonly http: HttpCheckSpec | undefined;
  /** Required when type is 'https'. */
  readonly tls?: TlsProbeSettings | undefined;
  /** Send this PROXY protocol header before anything else. */
  readonly proxyProtocol?: ProxyProtocolVersion | undefined;
}

export interface ProbeOptions {
  readonly timeoutMs: number;
  /** Aborts the probe (the checker stopping); resolves as an `error` "aborted". */
  readonly signal?: AbortSignal;
}

export type ProbeResult =
  | { readonly ok: true; readonly durationMs: number; readonly detail?: string }
  | { readonly ok: false; readonly durationMs: number; readonly reason: FailureReason; readonly detail: string };

export type Probe = (target: ProbeTarget, opts: ProbeOptions) => Promise<ProbeResult>;

/** An HTTP check without explicit settings: GET / answered with 2xx or 3xx (HAProxy's httpchk default). */
export const DEFAULT_HTTP_CHECK: HttpCheckSpec = Object.freeze({ path: '/', expectStatus: Object.freeze([200, 399] as const) });

/**
 * How long a closed probe socket may wait for the backend's FIN before we
 * drop it. The result is known by then; this only bounds file descriptors.
 */
export const CLOSE_GRACE_MS = 1000;

/** errno -> reason. Unknown codes are `error` so the label set stays bounded. */
export function reasonOf(err: unknown): FailureReason {
  const code = (err as { code?: unknown } | null)?.code;
  switch (code) {
    case 'ECONNREFUSED': return 'refused';
    case 'ETIMEDOUT': return 'timeout';
    case 'ECONNRESET':
    case 'EPIPE':
    case 'ECONNABORTED':
      return 'reset';
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
    case 'EHOSTDOWN':
    case 'ENETDOWN':
      return 'unreachable';
    default: return 'error';
  }
}

function detailOf(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown } | null;
  if (e && typeof e.code === 'string') return e.code;
  if (e && typeof e.message === 'string') return e.message;
  return String(err);
}

/**
 * Close a probe socket without a RST: send our FIN (end), keep reading so the
 * receive queue stays empty (close() with unread data sends a RST, RFC 2525
 * §2.17), and let the socket go when the backend closes its side, or after a
 * short grace. A RST-free close keeps backend logs free of "connection reset"
 * noise that HAProxy's RST-closing checks are known for.
 */
function politeClose(sock: net.Socket): void {
  sock.removeAllListeners('data');
  sock.on('error', () => { /* the result is known; a late error changes nothing */ });
  sock.resume();
  const t = setTimeout(() => sock.destroy(), CLOSE_GRACE_MS);
  t.unref();
  sock.once('close', () => clearTimeout(t));
  sock.end();
}

interface Verdict {
  /** Resolve with r, unless a verdict was given already. */
  finish(r: ProbeResult): void;
  /** Resolve as failed and tear the socket or request down. */
  fail(reason: FailureReason, detail: string): void;
  readonly done: boolean;
  /** Milliseconds since the probe began. */
  elapsed(): number;
}

/**
 * One verdict per probe: the first of an answer, an error, the timeout and
 * an abort wins; the timer and the abort listener go with it. `teardown`
 * destroys the probe's socket or request on a failure.
 */
function verdict(resolve: (r: ProbeResult) => void, opts: ProbeOptions, timeoutDetail: string | (() => string), teardown: () => void): Verdict {
  const start = performance.now();
  let done = false;
  const finish = (r: ProbeResult): void => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onAbort);
    resolve(r);
  };
  const fail = (reason: FailureReason, detail: string): void => {
    finish({ ok: false, reason, detail, durationMs: performance.now() - start });
    teardown();
  };
  const onAbort = (): void => fail('error', 'aborted');
  const timer = setTimeout(() => fail('timeout', typeof timeoutDetail === 'string' ? timeoutDetail : timeoutDetail()), opts.timeoutMs);
  if (opts.signal?.aborted) onAbort();
  else opts.signal?.addEventListener('abort', onAbort, { once: true });
  return { finish, fail, get done() { return done; }, elapsed: () => performance.now() - start };
}

/** A full TCP connect to address:port, closed right after with a FIN. */
export const tcpProbe: Probe = (target, opts) => new Promise<ProbeResult>((resolve) => {
  const sock = new net.Socket({ allowHalfOpen: false });
  const v = verdict(resolve, opts, `no connection within ${opts.timeoutMs} ms`, () => sock.destroy());
  if (v.done) return; // aborted before it began
  sock.once('connect', () => {
    if (target.proxyProtocol !== undefined) sock.write(probeHeader(target.proxyProtocol, sock));
    v.finish({ ok: true, durationMs: v.elapsed() });
    politeClose(sock);
  });
  sock.on('error', (err) => {
    if (!v.done) v.fail(reasonOf(err), detailOf(err));
  });
  try {
    sock.connect({ host: target.address, port: target.port });
  } catch (err) {
    // A bad port or address throws synchronously; a probe reports, never throws.
    v.fail('error', detailOf(err));
  }
});

/** The header a probe sends on its connected socket: the probe connection's own endpoints. */
function probeHeader(version: ProxyProtocolVersion, sock: net.Socket): Buffer {
  return healthCheckHeader(version, {
    source: sock.localAddress ?? '0.0.0.0', sourcePort: sock.localPort ?? 0,
    destination: sock.remoteAddress ?? '0.0.0.0', destinationPort: sock.remotePort ?? 0,
  });
}

/**
 * One HTTP/1.1 GET of target.http.path; healthy when the status is inside the
 * expected (inclusive) range. The timeout covers connect and response headers.
 * With a PROXY protocol header the probe connects first, writes the header,
 * and sends the request on that connection (the v1 line names the probe's
 * own address, known only once connected).
 */
export const httpProbe: Probe = (target, opts) => new Promise<ProbeResult>((resolve) => {
  let req: http.ClientRequest | undefined;
  let sock: net.Socket | undefined;
  const v = verdict(resolve, opts, `no response within ${opts.timeoutMs} ms`, () => { req?.destroy(); sock?.destroy(); });
  if (v.done) return; // aborted before it began
  const version = target.proxyProtocol;
  if (version === undefined) { req = httpGet(target, v, undefined); return; }
  sock = connectThen(target, v, (s) => { req = httpGet(target, v, s); });
});

/**
 * A TCP connection to the target whose socket errors fail the verdict; once
 * connected (and the verdict still open) it sends the PROXY protocol header
 * when the target asks for one, then hands the socket to `then`.
 */
function connectThen(target: ProbeTarget, v: Verdict, then: (s: net.Socket) => void): net.Socket {
  const s = new net.Socket();
  s.on('error', (err) => {
    if (!v.done) v.fail(reasonOf(err), detailOf(err));
  });
  s.once('connect', () => {
    if (v.done) return;
    if (target.proxyProtocol !== undefined) s.write(probeHeader(target.proxyProtocol, s));
    then(s);
  });
  try {
    s.connect({ host: target.address, port: target.port });
  } catch (err) {
    // A bad port or address throws synchronously; a probe reports, never throws.
    v.fail('error', detailOf(err));
  }
  return s;
}

/** Accepts any name: a check without `sni` verifies the chain only. */
const ANY_NAME = (): undefined => undefined;

/** Where an HTTPS probe is, for the text of its timeout. */
type HttpsPhase = 'connect' | 'handshake' | 'response';

/** What a probe that ran out of time in `phase` reports. */
export function httpsTimeoutDetail(phase: HttpsPhase, timeoutMs: number): string {
  switch (phase) {
    case 'connect': return `no connection within ${timeoutMs} ms`;
    case 'handshake': return `TLS handshake timed out after ${timeoutMs} ms`;
    case 'response': return `no response within ${timeoutMs} ms`;
  }
}

/**
 * A TLS error as a reason and a detail a user can act on: a certificate that
 * fails verification ("certificate has expired", a name mismatch) or a
 * handshake OpenSSL refused ("TLS handshake failed: wrong version number",
 * which is what a plain-HTTP port answers) is `tls`; a connection lost
 * during the handshake keeps its socket reason.
 */
export function tlsFailure(err: unknown): { reason: FailureReason; detail: string } {
  const e = (err ?? {}) as { code?: unknown; message?: unknown; reason?: unknown };
  const code = typeof e.code === 'string' ? e.code : '';
  const message = typeof e.message === 'string' ? e.message : String(err);
  const socketReason = reasonOf(err);
  if (socketReason !== 'error') return { reason: socketReason, detail: `${code}: ${message}` };
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') return { reason: 'tls', detail: message };
  if (code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_')) {
    return { reason: 'tls', detail: `TLS handshake failed: ${typeof e.reason === 'string' ? e.reason : message}` };
  }
  // OpenSSL's X509 verification codes (CERT_HAS_EXPIRED, UNABLE_TO_VERIFY_LEAF_SIGNATURE,
  // DEPTH_ZERO_SELF_SIGNED_CERT, ...) come with its own text ("certificate has expired").
  if (/^[A-Z0-9_]+$/.test(code)) return { reason: 'tls', detail: message };
  return { reason: 'error', detail: message };
}

/**
 * One HTTP/1.1 GET over TLS; healthy when the status is inside the range.
 * TCP connect, then the PROXY protocol header when asked for (before TLS,
 * as a proxy sends it), then the handshake with the target's shared
 * context (resuming the target's session while it is younger than
 * TLS_RESUME_MS), then the request, written by hand, and the status line
 * read from the answer (parseStatusLine): Node's http client on a TLS
 * socket cost a third of the probe's CPU for a request of one line and an
 * answer of which only the status counts. The one timer covers all three;
 * its detail names the phase it caught.
 */
export const httpsProbe: Probe = (target, opts) => new Promise<ProbeResult>((resolve) => {
  let raw: net.Socket | undefined;
  let sec: tls.TLSSocket | undefined;
  let phase: HttpsPhase = 'connect';
  const v = verdict(resolve, opts, () => httpsTimeoutDetail(phase, opts.timeoutMs), () => { sec?.destroy(); raw?.destroy(); });
  if (v.done) return; // aborted before it began
  const settings = target.tls;
  if (!settings) { v.fail('error', 'an https probe without TLS settings'); return; }
  // Not at the top: node:tls brings node:crypto, which an agent without HTTPS checks never loads.
  const connect = settings.connect ?? (require('node:tls') as typeof import('node:tls')).connect;
  const r = settings.resume;
  const session = r?.session !== undefined && performance.now() - r.fullAt < TLS_RESUME_MS ? r.session : undefined;
  const tlsOptions: tls.ConnectionOptions = {
    secureContext: settings.context,
    rejectUnauthorized: settings.verify,
    ...(settings.servername !== undefined ? { servername: settings.servername } : { checkServerIdentity: ANY_NAME }),
    ...(session !== undefined ? { session } : {}),
  };
  const handshake = (t: tls.TLSSocket): void => {
    sec = t;
    let secured = false;
    t.on('error', (err) => {
      // A session whose handshake failed is not offered again.
      if (r && !secured) r.session = undefined;
      if (v.done) return;
      const f = tlsFailure(err);
      v.fail(f.reason, f.detail);
    });
    t.once('secureConnect', () => {
      secured = true;
      if (r && !(session !== undefined && t.isSessionReused())) {
        // A full handshake (the certificate verified): its session is the
        // one the next probes offer until TLS_RESUME_MS. Only now does the
        // probe listen for it (Node serialises a session per ticket only
        // for a listener): TLS 1.3 tickets come after the handshake, a
        // TLS 1.2 session is there at its end. A resumed probe takes none.
        r.fullAt = performance.now();
        r.session = undefined;
        if (t.getProtocol() === 'TLSv1.3') t.once('session', (ticket: Buffer) => { r.session = ticket; });
        else r.session = t.getSession();
      }
      if (v.done) return;
      phase = 'response';
      getStatus(target, v, t);
    });
  };
  if (target.proxyProtocol === undefined) {
    let t: tls.TLSSocket;
    try {
      t = connect({ host: target.address, port: target.port, ...tlsOptions });
    } catch (err) {
      // A bad port or address throws synchronously; a probe reports, never throws.
      v.fail('error', detailOf(err));
      return;
    }
    t.once('connect', () => { phase = 'handshake'; });
    handshake(t);
    return;
  }
  raw = connectThen(target, v, (s) => {
    phase = 'handshake';
    handshake(connect({ socket: s, ...tlsOptions }));
  });
});

/** The request line and headers of a target's GET: Connection: close, so the backend ends the connection. */
export function httpRequestText(target: ProbeTarget): string {
  const spec = target.http ?? DEFAULT_HTTP_CHECK;
  // A named TLS backend (sni) is asked for by that name, as a virtual host picks its site by it.
  const host = target.tls?.servername ?? (target.address.includes(':') ? `[${target.address}]:${target.port}` : `${target.address}:${target.port}`);
  return `GET ${spec.path} HTTP/1.1\r\nHost: ${host}\r\nUser-Agent: lb-agent-health\r\nAccept: */*\r\nConnection: close\r\n\r\n`;
}

/** How much of an answer a probe reads for its status line at most (a hostile or broken backend's endless line). */
export const STATUS_LINE_MAX = 8192;

/**
 * The final status of an HTTP/1.x answer from its first bytes (pure):
 * a number, 'more' when the bytes so far do not hold it yet, or what is
 * wrong. Interim 1xx answers (RFC 9110 §15.2) are skipped, header block and
 * all, as Node's client skips them; 101 is final (nothing asked for it).
 */
export function parseStatusLine(text: string): number | 'more' | { error: string } {
  let at = 0;
  for (;;) {
    const eol = text.indexOf('\n', at);
    // The bound is on everything read, interim answers included: a backend sending them without end is cut off too.
    if (eol < 0) return text.length > STATUS_LINE_MAX ? { error: `no status line in the first ${STATUS_LINE_MAX} bytes` } : 'more';
    const line = text.slice(at, eol).replace(/\r$/, '');
    // RFC 9112 §4: HTTP-version SP 3DIGIT SP [reason-phrase]
    const m = /^HTTP\/1\.[01] ([1-5]\d\d)(?: |$)/.exec(line);
    if (!m) return { error: `not an HTTP/1.x status line: ${JSON.stringify(line.slice(0, 40))}` };
    const status = Number(m[1]);
    if (status >= 200 || status === 101) return status;
    const end = text.indexOf('\r\n\r\n', eol - 1);
    if (end < 0) return text.length > STATUS_LINE_MAX ? { error: `interim answers longer than ${STATUS_LINE_MAX} bytes` } : 'more';
    at = end + 4;
  }
}

/**
 * Writes the GET on a connected TLS socket and reads the status line; the
 * rest of the answer is drained until the backend closes (politeClose).
 */
function getStatus(target: ProbeTarget, v: Verdict, sock: tls.TLSSocket): void {
  const [lo, hi] = (target.http ?? DEFAULT_HTTP_CHECK).expectStatus;
  let text = '';
  const onData = (chunk: Buffer): void => {
    if (v.done) return;
    text += chunk.toString('latin1');
    const status = parseStatusLine(text);
    if (status === 'more') return;
    sock.removeListener('end', onEnd);
    if (typeof status !== 'number') { v.fail('error', status.error); return; }
    const durationMs = v.elapsed();
    if (status >= lo && status <= hi) v.finish({ ok: true, durationMs, detail: `HTTP ${status}` });
    else v.finish({ ok: false, reason: 'bad-status', detail: `HTTP ${status}, expected ${lo}-${hi}`, durationMs });
    politeClose(sock);
  };
  // Closed before a status line: what Node's client calls a hang-up.
  const onEnd = (): void => { if (!v.done) v.fail('reset', 'socket hang up: the connection ended before an HTTP status line'); };
  sock.on('data', onData);
  sock.once('end', onEnd);
  sock.write(httpRequestText(target));
}

/** The GET itself, on a connection of its own or on `sock` (connected, header sent); undefined when it could not start. */
function httpGet(target: ProbeTarget, v: Verdict, sock: net.Socket | undefined): http.ClientRequest | undefined {
  const spec = target.http ?? DEFAULT_HTTP_CHECK;
  let req: http.ClientRequest;
  try {
    req = http.request({
      host: target.address,
      port: target.port,
      path: spec.path,
      method: 'GET',
      // No agent: with one (even agent: false) Node opens its own connection and ignores createConnection.
      ...(sock ? { createConnection: () => sock } : { agent: false }),
      // A named TLS backend (sni) is asked for by that name, as a virtual host picks its site by it.
      headers: { host: target.tls?.servername ?? `${target.address}:${target.port}`, 'user-agent': 'lb-agent-health', accept: '*/*', connection: 'close' },
    });
  } catch (err) {
    // A bad path or port throws synchronously; a probe reports, never throws.
    v.fail('error', detailOf(err));
    return undefined;
  }
  const r = req;
  r.on('response', (res) => {
    const status = res.statusCode ?? 0;
    const durationMs = v.elapsed();
    const [lo, hi] = spec.expectStatus;
    if (status >= lo && status <= hi) v.finish({ ok: true, durationMs, detail: `HTTP ${status}` });
    else v.finish({ ok: false, reason: 'bad-status', detail: `HTTP ${status}, expected ${lo}-${hi}`, durationMs });
    // Drain the body so the socket closes with a FIN, not a RST.
    res.on('error', () => { /* result already known */ });
    res.resume();
    const t = setTimeout(() => r.destroy(), CLOSE_GRACE_MS);
    t.unref();
    res.once('close', () => clearTimeout(t));
  });
  r.on('error', (err) => {
    if (!v.done) v.fail(reasonOf(err), detailOf(err));
  });
  r.end();
  return r;
}

/** The default probe: by target type. */
export const defaultProbe: Probe = (target, opts) => (target.type === 'http' ? httpProbe(target, opts) : target.type === 'https' ? httpsProbe(target, opts) : tcpProbe(target, opts));

/** A TCP probe target with its address as a host-order integer (BackendSpec.addressNum; 0 for an IPv6 address, which `address` holds). */
export interface TcpTarget {
  readonly address: string;
  readonly addressNum: number;
  readonly port: number;
}

/**
 * A TCP probe's outcome, as arguments rather than an object: at 10,000
 * probes/s an object per probe is measurable. `detail` is the
 * errno's code ('ECONNREFUSED') or what our timer saw.
 */
export type TcpOutcome<C> = (ctx: C, ok: boolean, reason: FailureReason | undefined, detail: string | undefined, durationMs: number) => void;

/** Which implementation runs TCP probes: the addon's batch prober, or one Node socket per probe. */
export type TcpProbePath = 'native' | 'node';

/** Starts TCP connect probes and reports each outcome once to the callback it was made with. */
export interface TcpProber<C> {
  readonly path: TcpProbePath;
  /**
   * Starts one probe; its outcome comes later (never from within start()),
   * unless cancel() comes first. `now` is the caller's clock reading (the
   * probe's start, for its duration and deadline). Returns a handle.
   */
  start(target: TcpTarget, timeoutMs: number, ctx: C, now: number): number;
  /** Cancels a probe in flight (the handle and the ctx it was started with); no outcome follows. */
  cancel(handle: number, ctx: C): void;
  /** Closes every probe in flight, without outcomes. */
  close(): void;
}

/** TcpProber on Node sockets: tcpProbe() per probe, cancelled through its AbortSignal. */
export class NodeTcpProber<C> implements TcpProber<C> {
  readonly path = 'node' as const;
  private next = 1;
  private readonly live = new Map<number, AbortController>();

  constructor(private readonly onOutcome: TcpOutcome<C>) {}

  start(target: TcpTarget, timeoutMs: number, ctx: C): number {
    const id = this.next++;
    const ac = new AbortController();
    this.live.set(id, ac);
    void tcpProbe({ address: target.address, port: target.port, type: 'tcp', http: undefined }, { timeoutMs, signal: ac.signal }).then((r) => {
      if (!this.live.delete(id)) return; // cancelled or closed
      if (r.ok) this.onOutcome(ctx, true, undefined, undefined, r.durationMs);
      else this.onOutcome(ctx, false, r.reason, r.detail, r.durationMs);
    });
    return id;
  }

  cancel(handle: number): void {
    const ac = this.live.get(handle);
    if (!ac) return;
    this.live.delete(handle);
    ac.abort();
  }

  close(): void {
    const all = [...this.live.values()];
    this.live.clear();
    for (const ac of all) ac.abort();
  }
}
