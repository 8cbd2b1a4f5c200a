// HTTP endpoints for Prometheus and probes: /metrics (the daemon's one
// prom-client Registry), /healthz (the event loop answers), /readyz (every
// configured service has a VIP and at least one healthy backend; the body
// names those that do not). Three routes: plain node:http, no framework.
import * as http from 'node:http';
import type { Registry } from 'prom-client';
import { LbError } from '../errors';
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
}

export class MetricsServer {
  private server: http.Server | undefined;
  private readonly opts: MetricsServerOptions;

  constructor(opts: MetricsServerOptions) {
    this.opts = opts;
  }

  async start(): Promise<{ host: string; port: number }> {
    const { registry, readiness } = this.opts;
    const server = http.createServer((req, res) => {
      const url = (req.url ?? '/').split('?')[0];
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD' }).end();
        return;
      }
      if (url === '/metrics') {
        registry.metrics().then((text) => {
          res.writeHead(200, { 'content-type': registry.contentType });
          res.end(text);
        }, (err: Error) => {
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
