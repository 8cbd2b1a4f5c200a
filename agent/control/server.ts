// The control socket: a unix stream socket (mode 0600) under control.socket
// that `lb-agent status` and `lb-agent reload` talk to. Protocol: one JSON
// request line ({"op":"status"}), one JSON response line, then close. Views of
// the daemon's state, and "reload", which asks for exactly what SIGHUP does
// and answers with the verdict. The read-only views also answer an HTTP GET
// (`curl --unix-socket SOCKET http://lb-agent/status`), so that a script
// gets the status document without starting Node (httpRequestOf).
import * as net from 'node:net';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbError } from '../errors';
import type { Logger } from '../log';

/**
 * A reply already serialised: a document built once and sent to every
 * client that asks before it changes (the status at many services is
 * megabytes of JSON; serialising it per request costs more than building it).
 */
export class JsonText {
  constructor(readonly text: string) {}
}

/** The ops an HTTP GET may ask for, by path: views only (a GET changes nothing). */
export const HTTP_GET_OPS: Readonly<Record<string, string>> = { '/status': 'status', '/ping': 'ping' };

/** An HTTP request line (RFC 9112 §3: method SP request-target SP HTTP-version). */
const HTTP_REQUEST_LINE = /^([A-Z]+) (\S+) HTTP\/1\.[01]\r?$/;

/**
 * What a request's first line asks over HTTP: undefined for the JSON line
 * protocol; else the op a GET of a known path names, or the status and
 * words of the refusal. Pure.
 */
export function httpRequestOf(line: string): { op: string } | { status: 404 | 405; error: string } | undefined {
  const m = HTTP_REQUEST_LINE.exec(line);
  if (m === null) return undefined;
  if (m[1] !== 'GET') return { status: 405, error: `${m[1]} is not answered here: the control socket's HTTP views are read-only, GET ${Object.keys(HTTP_GET_OPS).join(' or GET ')}` };
  const target = m[2]!.split('?')[0]!;
  const op = HTTP_GET_OPS[target];
  return op !== undefined ? { op } : { status: 404, error: `no view at ${target}: GET ${Object.keys(HTTP_GET_OPS).join(' or GET ')}` };
}

const HTTP_REASON: Readonly<Record<number, string>> = { 200: 'OK', 404: 'Not Found', 405: 'Method Not Allowed', 500: 'Internal Server Error' };

/**
 * An HTTP/1.1 answer's head. The body ends where the connection does
 * (RFC 9112 §6.3, item 8): no Content-Length, for which the daemon would
 * count the bytes of a megabyte document per request.
 */
function httpHead(status: number): string {
  return `HTTP/1.1 ${status} ${HTTP_REASON[status] ?? ''}\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n`;
}

/** The answer to one op (the whole request is passed for ops that take arguments); a promise is awaited (reload answers once applied or refused). */
export type ControlHandler = (op: string, request: Readonly<Record<string, unknown>>) => unknown;

export class ControlServer {
  private server: net.Server | undefined;
  private readonly socketPath: string;
  private readonly handler: ControlHandler;
  private readonly log: Logger;

  constructor(opts: { socketPath: string; handler: ControlHandler; log: Logger }) {
    this.socketPath = opts.socketPath;
    this.handler = opts.handler;
    this.log = opts.log;
  }

  async start(): Promise<void> {
    fs.mkdirSync(path.dirname(this.socketPath), { recursive: true, mode: 0o755 });
    // A socket file left by a dead daemon: the lock file already proved no
    // other daemon runs, so the stale file is ours to replace.
    try { fs.unlinkSync(this.socketPath); } catch { /* absent */ }
    const server = net.createServer((sock) => {
      let buf = '';
      let answering = false;
      sock.setEncoding('utf8');
      sock.setTimeout(5000, () => sock.destroy());
      sock.on('data', (d: string) => {
        buf += d;
        if (buf.length > 65536) { sock.destroy(); return; }
        const nl = buf.indexOf('\n');
        if (nl < 0 || answering) return;
        const http = httpRequestOf(buf.slice(0, nl));
        // An HTTP request is answered once its header section has ended (the empty line).
        if (http !== undefined && !/\r?\n\r?\n/.test(buf)) return;
        answering = true;
        // The 5 s limit is for a client that sends nothing; an op that takes
        // its time (a reload applies a whole config) is bounded by the client.
        sock.setTimeout(0);
        if (http !== undefined) {
          void this.answerHttp(sock, http);
          return;
        }
        void (async () => {
          let reply: unknown;
          try {
            const req = JSON.parse(buf.slice(0, nl)) as Record<string, unknown> | null;
            if (typeof req !== 'object' || req === null || typeof req.op !== 'string') throw new Error('request has no "op"');
            const data = await this.handler(req.op, req);
            reply = data instanceof JsonText ? data : { ok: true, data };
          } catch (e) {
            reply = { ok: false, error: (e as Error).message };
          }
          if (sock.destroyed) return;
          if (reply instanceof JsonText) {
            // The kept text written as it is, between its envelope's two
            // ends: a template around it would copy the whole document
            // (megabytes at a thousand services) for every request.
            sock.write(ANSWER_HEAD);
            sock.write(reply.text);
            sock.end(ANSWER_TAIL);
          } else {
            sock.end(`${JSON.stringify(reply)}\n`);
          }
        })();
      });
      sock.on('error', () => { /* client went away */ });
    });
    const oldUmask = process.umask(0o177);
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', (e) => reject(new LbError('LB_ERR_DAEMON_START', `cannot listen on control socket ${this.socketPath}: ${e.message}`, undefined, { cause: e })));
        server.listen(this.socketPath, () => resolve());
      });
    } finally {
      process.umask(oldUmask);
    }
    fs.chmodSync(this.socketPath, 0o600);
    this.server = server;
    this.log.info({ op: 'listen', socket: this.socketPath }, 'control socket listening');
  }

  /**
   * An HTTP GET: the view's document as the body (the JSON text and a
   * newline: what `lb-agent status --json` prints), or the refusal as
   * {"error": ...} with its status.
   */
  private async answerHttp(sock: net.Socket, req: { op: string } | { status: number; error: string }): Promise<void> {
    let status = 200;
    let body: string | JsonText;
    if ('op' in req) {
      try {
        const data = await this.handler(req.op, { op: req.op });
        body = data instanceof JsonText ? data : JSON.stringify(data);
      } catch (e) {
        status = 500;
        body = JSON.stringify({ error: (e as Error).message });
      }
    } else {
      status = req.status;
      body = JSON.stringify({ error: req.error });
    }
    if (sock.destroyed) return;
    sock.write(httpHead(status));
    sock.write(body instanceof JsonText ? body.text : body);
    sock.end('\n');
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (!s) return;
    await new Promise<void>((resolve) => s.close(() => resolve()));
    try { fs.unlinkSync(this.socketPath); } catch { /* gone */ }
  }
}

/** Ask a running daemon; rejects with LB_ERR_CONTROL_UNREACHABLE naming the socket. */
export function controlRequest(socketPath: string, op: string, timeoutMs = 5000, args: Readonly<Record<string, unknown>> = {}): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const sock = net.createConnection(socketPath);
    let buf = '';
    const timer = setTimeout(() => { sock.destroy(); reject(new LbError('LB_ERR_CONTROL_UNREACHABLE', `no answer from ${socketPath} within ${timeoutMs} ms`)); }, timeoutMs);
    sock.setEncoding('utf8');
    sock.on('connect', () => sock.write(`${JSON.stringify({ ...args, op })}\n`));
    sock.on('data', (d: string) => { buf += d; });
    sock.on('end', () => {
      clearTimeout(timer);
      try {
        const r = JSON.parse(buf) as { ok: boolean; data?: unknown; error?: string };
        if (!r.ok) reject(new LbError('LB_ERR_CONTROL_PROTOCOL', `the daemon refused "${op}": ${r.error}`));
        else resolve(r.data);
      } catch {
        reject(new LbError('LB_ERR_CONTROL_PROTOCOL', `unreadable answer from ${socketPath}`));
      }
    });
    sock.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(unreachable(socketPath, e));
    });
  });
}

/** LB_ERR_CONTROL_UNREACHABLE naming the socket, and what to do. */
function unreachable(socketPath: string, e: NodeJS.ErrnoException): LbError {
  const hint = e.code === 'ENOENT' || e.code === 'ECONNREFUSED' ? ' (is lb-agent running? `systemctl status lb-agent`)' : e.code === 'EACCES' ? ' (run as root)' : '';
  return new LbError('LB_ERR_CONTROL_UNREACHABLE', `cannot reach the agent at ${socketPath}: ${e.code ?? e.message}${hint}`, undefined, { cause: e });
}

/** How every successful answer begins (ControlServer writes it before the data). */
const ANSWER_HEAD = Buffer.from('{"ok":true,"data":');
/** And ends. */
const ANSWER_TAIL = Buffer.from('}\n');

/**
 * Ask a running daemon and hand its answer's data to `write` as it
 * arrives, the daemon's own bytes, never decoded or parsed (`lb-agent
 * status --json`: megabytes at a thousand services, which decoding,
 * parsing and writing out again cost more than the request). A refusal or
 * an answer cut short rejects as controlRequest does; what was written
 * before a cut stays written.
 */
export function controlStream(socketPath: string, op: string, write: (chunk: Buffer) => void, timeoutMs = 5000): Promise<void> {
  return new Promise((resolve, reject) => {
    const sock = net.createConnection(socketPath);
    let head: Buffer = Buffer.alloc(0);
    let streaming = false;
    /** The last bytes seen, held back: the answer's tail is not the data's. */
    let held: Buffer = Buffer.alloc(0);
    const timer = setTimeout(() => { sock.destroy(); reject(new LbError('LB_ERR_CONTROL_UNREACHABLE', `no answer from ${socketPath} within ${timeoutMs} ms`)); }, timeoutMs);
    sock.on('connect', () => sock.write(`${JSON.stringify({ op })}\n`));
    sock.on('data', (d: Buffer) => {
      if (!streaming) {
        head = Buffer.concat([head, d]);
        if (head.length < ANSWER_HEAD.length || !head.subarray(0, ANSWER_HEAD.length).equals(ANSWER_HEAD)) return;
        streaming = true;
        d = head.subarray(ANSWER_HEAD.length);
        head = Buffer.alloc(0);
      }
      const bytes = held.length > 0 ? Buffer.concat([held, d]) : d;
      const cut = Math.max(0, bytes.length - ANSWER_TAIL.length);
      if (cut > 0) write(bytes.subarray(0, cut));
      // A copy: the socket's chunk it would otherwise pin is up to 64 KiB.
      held = Buffer.from(bytes.subarray(cut));
    });
    sock.on('end', () => {
      clearTimeout(timer);
      if (streaming) {
        if (held.equals(ANSWER_TAIL)) resolve();
        else reject(new LbError('LB_ERR_CONTROL_PROTOCOL', `the answer from ${socketPath} was cut short`));
        return;
      }
      try {
        const r = JSON.parse(head.toString('utf8')) as { ok: boolean; error?: string };
        reject(new LbError('LB_ERR_CONTROL_PROTOCOL', r.ok ? `unreadable answer from ${socketPath}` : `the daemon refused "${op}": ${r.error}`));
      } catch {
        reject(new LbError('LB_ERR_CONTROL_PROTOCOL', `unreadable answer from ${socketPath}`));
      }
    });
    sock.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(unreachable(socketPath, e));
    });
  });
}
