// Native boundary: the ONLY file that loads native/build/Release/lbagent_native.node
// (built from native/ by `npm ci`) and declares its types. The addon is
// syscalls and file descriptors only; everything above it is TypeScript.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbError } from '../errors';

/** One frame as read by recvmsg(2) on a packet socket. */
export interface NativeFrame {
  /** The frame from the Ethernet header on (at most 64 KiB; see `length`). */
  frame: Buffer;
  /** tpacket_auxdata.tp_status (TP_STATUS_* bits). */
  status: number;
  /** sockaddr_ll.sll_pkttype (PACKET_HOST, PACKET_BROADCAST, ...). */
  pktType: number;
  /** The frame's real length; larger than frame.length when truncated. */
  length: number;
}

/** A Node-style system error thrown by the addon. */
export interface NativeSystemError extends Error {
  code: string;
  /** Negative errno, as Node reports it (-1 for EPERM). */
  errno: number;
  syscall: string;
  path?: string;
}

export interface NativePacketHandle {
  readonly fd: number;
  send(frame: Buffer): number;
  attachFilter(program: ReadonlyArray<readonly [number, number, number, number]>): void;
  addMembership(kind: 'multicast', mac: Buffer): void;
  addMembership(kind: 'promisc' | 'allmulti'): void;
  dropMembership(kind: 'multicast', mac: Buffer): void;
  dropMembership(kind: 'promisc' | 'allmulti'): void;
  /** Start reading: the callback gets every frame ready at each wake-up. */
  start(callback: (err: NativeSystemError | null, frames: NativeFrame[]) => void): void;
  stop(): void;
  /** Whether the active socket keeps the event loop alive (default true). */
  setRef(ref: boolean): void;
  close(): void;
}

/**
 * TCP connect probes on raw descriptors, readiness through one epoll
 * descriptor (native/src/tcp_probe.cc). Results are errno numbers, handed
 * back in batches through the two arrays given to the constructor: the
 * callback's `count` entries of each are valid until it returns.
 */
export interface NativeTcpProbeHandle {
  /**
   * Opens and connects `count` sockets (IPv4 as host-order integers). out[i]:
   * 0 connected at once, EINPROGRESS (result through the callback), or the
   * errno of socket()/connect()/epoll_ctl() (nothing left open for that id).
   */
  connect(ids: Uint32Array, addrs: Uint32Array, ports: Uint16Array, count: number, out: Int32Array): void;
  /** Closes a probe whose connect has not finished; no result follows. False when there was none. */
  cancel(id: number): boolean;
  /** Closes the connected sockets still waiting for the backend's FIN since the previous sweep; returns how many wait now. */
  sweep(): number;
  stats(): { connecting: number; closing: number; swept: number };
  close(): void;
}

export interface NativeAddon {
  /** Absent from an addon built before issue 18: the caller falls back to Node sockets. */
  /** closeMode: 0 our FIN, then wait for the backend's; 1 a RST (SO_LINGER 0); 2 a RST before the handshake's ACK (TCP_QUICKACK off). */
  TcpProbeHandle?: new (onResults: (count: number) => void, resultIds: Uint32Array, resultErrnos: Int32Array, closeMode?: number) => NativeTcpProbeHandle;
  PacketHandle: new (
    ifindex: number,
    protocol: number,
    filter?: ReadonlyArray<readonly [number, number, number, number]>,
  ) => NativePacketHandle;
  sendUnixDatagram(path: string, data: Buffer, fds?: readonly number[]): number;
  bindUnixDatagram(path: string): number;
  recvUnixDatagram(fd: number, maxBytes: number): { data: Buffer; fds: number[] } | null;
  capabilities(): { effective: bigint; permitted: bigint; inheritable: bigint };
  ifNameToIndex(name: string): number;
  ifIndexToName(index: number): string;
  mallocTrim(): boolean;
  listenTcp4(address: number, port: number, backlog: number, reusePort: boolean): { fd: number; port: number };
  socketInfo(fd: number): NativeSocketInfo;
  dupFd(fd: number): number;
  /** Absent from an addon built before it (the relay then uses libuv's shutdown). */
  shutdownWrite?(fd: number): number;
}

/** What a socket descriptor is (getsockname, SO_TYPE, SO_ACCEPTCONN, SO_REUSEPORT). */
export interface NativeSocketInfo {
  /** AF_INET = 2, AF_INET6 = 10, AF_UNIX = 1. */
  readonly family: number;
  /** SOCK_STREAM = 1, SOCK_DGRAM = 2. */
  readonly type: number;
  /** IPv4 only: the bound address as a host-order u32, and the port. */
  readonly address?: number;
  readonly port?: number;
  readonly listening: boolean;
  readonly reusePort: boolean;
  /** IPv4 TCP only: TCP_NODELAY (accepted sockets inherit it from their listener). */
  readonly noDelay?: boolean;
}

/** tp_status bits (linux/if_packet.h). */
export const TP_STATUS_CSUMNOTREADY = 1 << 3;
export const TP_STATUS_CSUM_VALID = 1 << 7;

/** sll_pkttype values (linux/if_packet.h). */
export const PACKET_HOST = 0;
export const PACKET_BROADCAST = 1;
export const PACKET_MULTICAST = 2;
export const PACKET_OTHERHOST = 3;
export const PACKET_OUTGOING = 4;

/** Where the addon lives: <repo>/native/build/Release, from dist/agent/net or agent/net. */
export function nativeAddonPath(): string {
  // Compiled code runs from <repo>/dist/agent/net; ts sources sit at <repo>/agent/net.
  const candidates = [
    path.resolve(__dirname, '..', '..', '..', 'native', 'build', 'Release', 'lbagent_native.node'),
    path.resolve(__dirname, '..', '..', 'native', 'build', 'Release', 'lbagent_native.node'),
  ];
  return candidates.find((p) => fs.existsSync(p)) ?? candidates[0]!;
}

/**
 * The addon. Node's require cache makes repeated calls cheap, so there is no
 * module-level cache here.
 */
export function loadNative(): NativeAddon {
  const file = nativeAddonPath();
  if (!fs.existsSync(file)) {
    throw new LbError(
      'LB_ERR_NET_NATIVE_MISSING',
      `native addon not built: ${file} is missing; run \`npm ci\` in the lb-agent directory (it builds native/ with node-gyp), then \`npm run build\``,
      { path: file },
    );
  }
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    return require(file) as NativeAddon;
  } catch (err) {
    throw new LbError(
      'LB_ERR_NET_NATIVE_MISSING',
      `native addon ${file} failed to load (${(err as Error).message}); rebuild it for this Node version with \`npm ci\``,
      { path: file },
      { cause: err },
    );
  }
}

/** True when a thrown value is a system error from the addon (or Node). */
export function isSystemError(err: unknown): err is NativeSystemError {
  return err instanceof Error && typeof (err as { code?: unknown }).code === 'string' && typeof (err as { syscall?: unknown }).syscall === 'string';
}

/** sd_notify(3) transport: one datagram to a unix socket ('@name' = abstract), with descriptors as SCM_RIGHTS if given. */
export function sendUnixDatagram(socketPath: string, data: Buffer, fds?: readonly number[]): number {
  return fds && fds.length > 0 ? loadNative().sendUnixDatagram(socketPath, data, fds) : loadNative().sendUnixDatagram(socketPath, data);
}

/** A non-blocking unix datagram socket bound to a filesystem path (the receiving end of a descriptor hand-over); close it with fs.closeSync. */
export function bindUnixDatagram(socketPath: string): number {
  return loadNative().bindUnixDatagram(socketPath);
}

/** One queued datagram and the descriptors it carried, or null when none is queued. */
export function recvUnixDatagram(fd: number, maxBytes = 65536): { data: Buffer; fds: number[] } | null {
  return loadNative().recvUnixDatagram(fd, maxBytes);
}

/** Linux capability numbers we care about (linux/capability.h). */
export const CAP_NET_BIND_SERVICE = 10;
export const CAP_NET_ADMIN = 12;
export const CAP_NET_RAW = 13;

export interface CapabilitySets { effective: bigint; permitted: bigint; inheritable: bigint }

/** The calling thread's capability sets (capget(2)). */
export function capabilities(): CapabilitySets {
  return loadNative().capabilities();
}

/** Whether capability `cap` is in the effective set. */
export function hasCapability(cap: number, sets: CapabilitySets = capabilities()): boolean {
  return ((sets.effective >> BigInt(cap)) & 1n) === 1n;
}

/** if_nametoindex(3); throws a system error (ENODEV) when there is no such interface. */
export function ifNameToIndex(name: string): number {
  return loadNative().ifNameToIndex(name);
}

export function ifIndexToName(index: number): string {
  return loadNative().ifIndexToName(index);
}

/**
 * malloc_trim(3): hand the free pages of every malloc arena back to the
 * kernel; true when some were. glibc keeps what a thread freed in that
 * thread's arena, so each reload's parse worker left ~0.3 MiB behind (issue 18).
 */
export function mallocTrim(): boolean {
  return loadNative().mallocTrim();
}

/**
 * A listening TCP/IPv4 socket bound to address:port (port 0: any), with
 * SO_REUSEADDR, and SO_REUSEPORT when asked so that several sockets - one per
 * proxy worker - share the port and the kernel spreads new connections over
 * them. Returns the non-blocking, close-on-exec descriptor and the bound port.
 */
export function listenTcp4(address: number, port: number, backlog: number, reusePort: boolean): { fd: number; port: number } {
  return loadNative().listenTcp4(address >>> 0, port, backlog, reusePort);
}

/** What a descriptor is: checks a listening socket inherited from the service manager before use. */
export function socketInfo(fd: number): NativeSocketInfo {
  return loadNative().socketInfo(fd);
}

/**
 * shutdown(2) SHUT_WR, for the proxy's fast relay (relay-raw.ts, issue 18):
 * the function itself (called per connection, so no wrapper), returning 0 or
 * the negative errno; undefined when the addon is missing or predates it.
 */
export function shutdownWriteFn(): ((fd: number) => number) | undefined {
  try {
    const f = loadNative().shutdownWrite;
    return typeof f === 'function' ? f : undefined;
  } catch {
    return undefined;
  }
}

/** fcntl(F_DUPFD_CLOEXEC): another descriptor of the same socket, for a worker to own and close. */
export function dupFd(fd: number): number {
  return loadNative().dupFd(fd);
}
