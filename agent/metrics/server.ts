// HTTP endpoints for Prometheus and probes: /metrics (the daemon's one
// prom-client Registry), /healthz (the event loop answers), /readyz (every
// configured service has a VIP and at least one healthy backend; the body
// names those that do not). Three routes: plain node:http, no framework.
//
// It cannot be overrun (Prometheus' guidance, node_exporter's practice):
// every scrape that arrives while a gather is under way, or within
// GATHER_REUSE_MS of the last one, is served from that one gather; a
// request whose client has gone is not answered; connections are capped
// and a client that is slow to send its headers is closed; /healthz and
// /readyz read state and never wait for a gather.
import * as http from 'node:http';
import type { Registry } from 'prom-client';
import { LbError } from '../errors';
import { expositionParts, pageBuffer } from './series';
import type { Logger } from '../log';

export interface Readiness {
  ready: boolean;
  /** One line per service that is not ready, "ns/name: why". */
  notReady: string[];
}

export interface MetricsServerOptions {
  host: string;
  port: number;
  registry: Registry;
  readiness: () => Readiness;
  log: Logger;
  /** Limits, for tests; the defaults below otherwise. */
  limits?: Partial<MetricsLimits>;
}

export interface MetricsLimits {
  /** A gather this recent answers a scrape (ms). */
  readonly reuseMs: number;
  /** Connections open at once; more are closed as they arrive. */
  readonly maxConnections: number;
  /** A client must have sent its request headers within this (ms). */
  readonly headersTimeoutMs: number;
  /** How often the server looks for clients past their timeouts (ms). */
  readonly checkEveryMs: number;
}

export const METRICS_LIMITS: MetricsLimits = { reuseMs: 1000, maxConnections: 256, headersTimeoutMs: 5000, checkEveryMs: 1000 };

export class MetricsServer {
  private server: http.Server | undefined;
  private readonly opts: MetricsServerOptions;

  constructor(opts: MetricsServerOptions) {
    this.opts = opts;
  }

  private gathering: Promise<Buffer> | undefined;
  private last: { page: Buffer; at: number } | undefined;
  /** Gathers run since start (tests read it). */
  gathers = 0;

  /** The metrics page's bytes: the last gather's if recent, the one under way if any, else a new one. */
  private gather(limits: MetricsLimits): Promise<Buffer> {
    const now = Date.now();
    if (this.last && now - this.last.at < limits.reuseMs) return Promise.resolve(this.last.page);
    if (this.gathering) return this.gathering;
    this.gathers++;
    const p = expositionParts(this.opts.registry).then((parts) => {
      const page = pageBuffer(parts);
      const last = { page, at: Date.now() };
      this.last = last;
      // Not kept past its reuse: a family's text it holds may have been replaced since.
      setTimeout(() => { if (this.last === last) this.last = undefined; }, limits.reuseMs).unref();
      return page;
    }).finally(() => { this.gathering = undefined; });
    this.gathering = p;
    return p;
  }

  async start(): Promise<{ host: string; port: number }> {
    const { registry, readiness } = this.opts;
    const limits: MetricsLimits = { ...METRICS_LIMITS, ...this.opts.limits };
    const server = http.createServer({ headersTimeout: limits.headersTimeoutMs, requestTimeout: limits.headersTimeoutMs * 2, connectionsCheckingInterval: limits.checkEveryMs }, (req, res) => {
      const url = (req.url ?? '/').split('?')[0];
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD' }).end();
        return;
      }
      if (url === '/metrics') {
        this.gather(limits).then((page) => {
          // The client went away while the gather ran: nothing to send.
          if (res.destroyed || req.socket.destroyed) return;
          res.writeHead(200, { 'content-type': registry.contentType, 'content-length': page.length });
          // One Buffer, one write: http sends the headers beside it (a
          // Buffer is not copied to be joined to them), and every scrape of
          // one gather writes the same bytes, encoded once.
          res.end(req.method === 'HEAD' ? undefined : page);
        }, (err: Error) => {
          if (res.destroyed) return;
          res.writeHead(500, { 'content-type': 'text/plain' }).end(`metrics collection failed: ${err.message}\n`);
        });
      } else if (url === '/healthz') {
        res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
      } else if (url === '/readyz') {
        const r = readiness();
        res.writeHead(r.ready ? 200 : 503, { 'content-type': 'text/plain' });
        res.end(r.ready ? 'ready\n' : `not ready:\n${r.notReady.map((l) => `  ${l}`).join('\n')}\n`);
      } else {
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /metrics, /healthz, /readyz\n');
      }
    });
    server.maxConnections = limits.maxConnections;
    server.keepAliveTimeout = 5000;
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e: NodeJS.ErrnoException) => reject(new LbError('LB_ERR_METRICS_LISTEN',
        `cannot listen for metrics on ${this.opts.host}:${this.opts.port}: ${e.code ?? e.message}${e.code === 'EADDRINUSE' ? ' (another process holds the port; change metrics.listen)' : ''}`, undefined, { cause: e })));
      server.listen(this.opts.port, this.opts.host, () => resolve());
    });
    const addr = server.address();
    const port = typeof addr === 'object' && addr ? addr.port : this.opts.port;
    this.opts.log.info({ op: 'listen', host: this.opts.host, port }, 'metrics endpoint listening');
    return { host: this.opts.host, port };
  }

  async stop(): Promise<void> {
    const s = this.server;
    this.server = undefined;
    if (!s) return;
    s.closeAllConnections();
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }
}
