// forward/ layer: the proxy's fallback relay path, on Node's public net API
// only: a net.Server per listening descriptor (pauseOnConnect: a client's
// bytes wait in the kernel until its backend is connected), net.connect to
// the backend, 'data' events relayed with write()/pause()/resume() both ways
// (backpressure), a FIN passed on as end() (half-close, allowHalfOpen on both
// sides), an error on one side resetting the other. About twice the CPU per
// new connection of relay-raw.ts; used when neither the addon's relay
// (relay-native.ts) nor the Node bindings relay-raw.ts expects are there, or
// when asked (`relay: 'streams'`).
import * as net from 'node:net';
import { Relay, type PathListener, type RelayPath } from './proxy-engine';

class NetRelay extends Relay {
  up: net.Socket | undefined;
  abortCode: string | undefined;
  clientClosed = false;
  upClosed = true;

  constructor(readonly client: net.Socket) {
    super();
    client.on('error', noop);
    client.once('close', () => {
      this.clientClosed = true;
      const up = this.up;
      if (up && this.connecting) {
        // Gone while we connect: abandon the attempt (not the backend's fault; nothing is reported).
        this.abortCode = 'ECANCELED';
        this.engine.done(this);
        up.destroy();
      } else if (up && !up.destroyed && !up.writableEnded) {
        // Nothing more will come from it: the backend gets its FIN (the idle sweep is the backstop).
        up.end();
      }
      this.maybeDone();
    });
  }

  connect(host: string, port: number): void {
    const up = net.connect({ host, port, allowHalfOpen: true, noDelay: true });
    this.up = up;
    this.upClosed = false;
    this.abortCode = undefined;
    let failure: NodeJS.ErrnoException | undefined;
    let connected = false;
    up.on('error', (err: NodeJS.ErrnoException) => {
      if (connected) this.sideError(up);
      else failure = err;
    });
    up.once('connect', () => {
      connected = true;
      if (this.finished) { up.destroy(); this.engine.connectDone(this, undefined); return; }
      this.engine.connectDone(this, undefined);
    });
    // 'close' comes once whatever happened: the one place a failed attempt is reported.
    up.once('close', () => {
      this.upClosed = true;
      if (!connected) {
        if (this.up === up) this.up = undefined;
        this.engine.connectDone(this, this.abortCode ?? failure?.code ?? 'ECONNRESET');
        return;
      }
      this.maybeDone();
    });
  }

  abortConnect(code: string): void {
    if (!this.up || this.abortCode !== undefined) return;
    this.abortCode = code;
    this.up.destroy();
  }

  start(proxyHeader: boolean): void {
    const up = this.up!;
    const client = this.client;
    const header = proxyHeader ? this.engine.header(this) : undefined;
    if (header !== undefined) {
      // The fallback path does not coalesce it with the client's first bytes (relay-raw.ts does).
      up.write(header);
      this.engine.headerSent(false);
    }
    client.on('data', (chunk: Buffer) => {
      this.seen = true;
      this.engine.bytes(this, chunk.length, 0);
      if (!up.write(chunk)) client.pause();
    });
    up.on('data', (chunk: Buffer) => {
      this.seen = true;
      this.engine.bytes(this, 0, chunk.length);
      if (!client.write(chunk)) up.pause();
    });
    up.on('drain', () => client.resume());
    client.on('drain', () => up.resume());
    // Half-close: a FIN from one side becomes a FIN to the other once what was read before it is written.
    client.on('end', () => up.end());
    up.on('end', () => client.end());
    client.removeListener('error', noop);
    client.on('error', () => this.sideError(client));
    client.resume();
  }

  /** An error on one side resets the other. */
  private sideError(side: net.Socket): void {
    const other = side === this.client ? this.up : this.client;
    if (other && !other.destroyed) other.resetAndDestroy();
  }

  private maybeDone(): void {
    if (this.clientClosed && this.upClosed) this.engine.done(this);
  }

  peer(): { address: string; port: number } | undefined {
    const address = this.client.remoteAddress;
    const port = this.client.remotePort;
    return address !== undefined && port !== undefined ? { address, port } : undefined;
  }

  reset(): void {
    this.up?.destroy();
    this.client.resetAndDestroy();
  }

  refuse(): void {
    this.up?.destroy();
    const sock = this.client;
    if (!this.engine.lingerRefused(sock)) {
      // Under a flood the descriptor goes now: still a FIN unless the client already sent bytes.
      sock.end();
      sock.destroy();
      return;
    }
    sock.once('close', () => this.engine.refusedGone(sock));
    sock.on('end', () => sock.destroy());
    sock.end();
    sock.resume();
  }

  destroy(): void {
    this.client.destroy();
    this.up?.destroy();
    if (this.connecting) this.engine.done(this);
  }
}

function noop(): void { /* errors after a deliberate reset are expected */ }

export const netRelayPath: RelayPath = {
  kind: 'streams',
  listen(fd: number, backlog: number, accepted: (err: string | undefined, relay: Relay | undefined) => void): PathListener {
    const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true });
    server.on('connection', (client: net.Socket) => accepted(undefined, new NetRelay(client)));
    // libuv has closed what was pending (its EMFILE reserve-fd trick); the code says why.
    server.on('error', (err: NodeJS.ErrnoException) => accepted(err.code ?? 'error', undefined));
    server.listen({ fd, backlog });
    return { close: () => server.close() };
  },
};
