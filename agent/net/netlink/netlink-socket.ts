// Raw netlink socket layer: the `netlink` package's RawNetlinkSocket (the
// layer its framing, NetlinkSocket, sits on) over our addon's NetlinkHandle
// (native/src/netlink_socket.cc) instead of the package's own .node file.
// That second addon cost every agent ~0.25 MiB of RSS for one
// socket class. The package's framing (sequence numbers, multipart dumps,
// ACKs and errors) and its rtnetlink codecs are used unchanged above this.
//
// The production bundle (agent/bundle-build.ts) also resolves the package's
// own `./raw` to this file, so its loader (node-gyp-build and the prebuilt
// binary) is never run; agent/net/netlink.ts constructs this class directly.
import { EventEmitter } from 'node:events';
import { loadNative, type NativeNetlinkHandle } from '../../native/native';

/** The options of the package's RawNetlinkSocket that the agent passes. */
export interface RawNetlinkSocketOptions {
  recvBufferSize?: number;
}

/**
 * The package's RawNetlinkSocket interface (events 'message' (msg, rinfo),
 * 'error', 'close'), for its NetlinkSocket. Messages come from the kernel
 * (port 0): the socket is bound to the port the kernel chose for it.
 */
export class RawNetlinkSocket extends EventEmitter {
  private readonly handle: NativeNetlinkHandle;
  private closed = false;

  constructor(protocol: number, options?: RawNetlinkSocketOptions) {
    super();
    const Handle = loadNative().NetlinkHandle;
    if (typeof Handle !== 'function') throw new Error('the native addon was built without its netlink socket (rebuild it: npm ci)');
    this.handle = new Handle(protocol);
    try {
      if (options?.recvBufferSize) this.handle.setRecvBufferSize(options.recvBufferSize);
      this.handle.start((err, datagrams) => {
        for (const d of datagrams) this.emit('message', d, KERNEL);
        if (err) this.emit('error', err);
      });
    } catch (err) {
      this.handle.close();
      throw err;
    }
  }

  /**
   * One datagram (a Buffer or its parts). The kernel handles a request inside
   * sendmsg(2), so the result is known at once; the callback still runs
   * later, as with the package's socket.
   */
  send(msg: Buffer | readonly Buffer[], options?: { port?: number; groups?: number }, callback?: (error?: Error) => void): void {
    let error: Error | undefined;
    try {
      this.handle.send(msg, options?.port ?? 0, options?.groups ?? 0);
    } catch (err) {
      error = err as Error;
    }
    process.nextTick(() => {
      if (callback) callback(error);
      else if (error) this.emit('error', error);
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.handle.close();
    this.emit('close');
  }

  address(): { port: number; groups: number } {
    return this.handle.address();
  }

  ref(): void {
    this.handle.setRef(true);
  }

  unref(): void {
    this.handle.setRef(false);
  }

  addMembership(group: number): void {
    this.handle.addMembership(group);
  }

  dropMembership(group: number): void {
    this.handle.dropMembership(group);
  }

  setRecvBufferSize(size: number): void {
    this.handle.setRecvBufferSize(size);
  }
}

/** What the package's receive callback gets as rinfo: the sender, the kernel. */
const KERNEL = Object.freeze({ port: 0, groups: 0 });
