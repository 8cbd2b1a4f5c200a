// Health probes (driver, socket I/O): one TCP connect, or one HTTP GET, to a
// backend's health-check port with the timeout enforced by our own timer.
// A probe never throws and never rejects: it resolves to a result with a
// reason from a fixed set (also a metric label). No state, no scheduling.
import * as net from 'node:net';
import * as http from 'node:http';
import type { HttpCheckSpec } from '../config/types';
import type { FailureReason } from './state';

export interface ProbeTarget {
  readonly address: string;
  readonly port: number;
  readonly type: 'tcp' | 'http';
  /** Required when type is 'http'. */
  readonly http: HttpCheckSpec | undefined;
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
const CLOSE_GRACE_MS = 1000;

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
function verdict(resolve: (r: ProbeResult) => void, opts: ProbeOptions, timeoutDetail: string, teardown: () => void): Verdict {
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
  const timer = setTimeout(() => fail('timeout', timeoutDetail), opts.timeoutMs);
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

/**
 * One HTTP/1.1 GET of target.http.path; healthy when the status is inside the
 * expected (inclusive) range. The timeout covers connect and response headers.
 */
export const httpProbe: Probe = (target, opts) => new Promise<ProbeResult>((resolve) => {
  const spec = target.http ?? DEFAULT_HTTP_CHECK;
  let req: http.ClientRequest | undefined;
  const v = verdict(resolve, opts, `no response within ${opts.timeoutMs} ms`, () => req?.destroy());
  if (v.done) return; // aborted before it began
  try {
    req = http.request({
      host: target.address,
      port: target.port,
      path: spec.path,
      method: 'GET',
      agent: false,
      headers: { host: `${target.address}:${target.port}`, 'user-agent': 'lb-agent-health', accept: '*/*', connection: 'close' },
    });
  } catch (err) {
    // A bad path or port throws synchronously; a probe reports, never throws.
    v.fail('error', detailOf(err));
    return;
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
});

/** The default probe: by target type. */
export const defaultProbe: Probe = (target, opts) => (target.type === 'http' ? httpProbe(target, opts) : tcpProbe(target, opts));
