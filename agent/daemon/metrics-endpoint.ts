// The life cycle of the metrics endpoint (`metrics.listen`): bound at start,
// bound again when a reload changes the address, stopped with the daemon,
// and moved with the parent's address when it is bound to it. The HTTP
// server itself is metrics/server.ts.
import { parseListen } from '../config/load';
import { errorMessage } from '../errors';
import type { Logger } from '../log';

/** What the endpoint needs of an HTTP server (metrics/server.ts MetricsServer). */
export interface EndpointServer {
  start(): Promise<unknown>;
  stop(): Promise<void>;
}

export interface MetricsEndpointOptions {
  readonly log: Logger;
  /** A server for this address and port, not yet listening. */
  create(host: string, port: number): EndpointServer;
  /** The daemon is stopping: the endpoint does not move any more. */
  stopping(): boolean;
}

export class MetricsEndpoint {
  private server: EndpointServer | undefined;
  /** Where the endpoint listens now (it follows the parent's address when bound to it). */
  private bound: { host: string; port: number } | undefined;

  constructor(private readonly opts: MetricsEndpointOptions) {}

  /** Where it listens, if it does. */
  get address(): { host: string; port: number } | undefined { return this.bound; }

  /** Listen on `metrics.listen` (host:port, validated with the config). */
  async start(listen: string): Promise<void> {
    const l = parseListen(listen)!;
    await this.bind(l.host, l.port);
  }

  /** A reload's new `metrics.listen`: the old endpoint goes (a failure is logged), the new one comes ("" turns it off). */
  async restart(listen: string): Promise<void> {
    await this.server?.stop().catch((e) => this.opts.log.error({ op: 'reload', err: errorMessage(e) }, 'stopping the old metrics endpoint failed'));
    this.server = undefined;
    this.bound = undefined;
    if (listen !== '') await this.start(listen);
  }

  /** Stop listening; rejects with the server's error. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    this.bound = undefined;
    await server?.stop();
  }

  private async bind(host: string, port: number): Promise<void> {
    const server = this.opts.create(host, port);
    await server.start();
    this.server = server;
    this.bound = { host, port };
  }

  /**
   * The metrics endpoint bound to the parent's own address moves with it: a
   * scraper that follows the VM's address (DHCP on the parent, an operator's
   * re-addressing) finds it there. A wildcard or another address stays.
   */
  async followParentAddress(before: string | undefined, after: string | undefined): Promise<void> {
    const bound = this.bound;
    if (!bound || before === undefined || after === undefined || bound.host !== before || after === before || this.opts.stopping()) return;
    const moving = this.server;
    this.server = undefined;
    this.bound = undefined;
    await moving?.stop().catch(() => undefined);
    try {
      await this.bind(after, bound.port);
      this.opts.log.warn({ op: 'metrics', from: before, to: after, port: bound.port }, `metrics endpoint moved to ${after}:${bound.port} with the parent's address`);
    } catch (e) {
      this.opts.log.error({ op: 'metrics', address: after, port: bound.port, err: errorMessage(e) }, 'the metrics endpoint could not follow the parent\'s address');
    }
  }
}
