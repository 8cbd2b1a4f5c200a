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
  /**
   * sockaddr_ll.sll_ifindex: the device the frame was received on. On a
   * socket bound to a macvlan's parent, a unicast frame for the macvlan's MAC
   * carries the macvlan's index (the kernel delivers it to the parent's
   * protocol sockets after macvlan's rx handler moved it); a broadcast the
   * parent's. Undefined from an addon built before this field.
   */
  ifindex?: number;
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
  /** ifindex: leave by this interface instead of the bound one (an addon built before it ignores it). */
  send(frame: Buffer, ifindex?: number): number;
  /**
   * The frames laid end to end in `frames` (lengths[i] bytes each), from
   * frame `first` on, by one sendmmsg(2): how many were sent (at least 1);
   * throws the errno of frame `first` when it fails. Absent from an addon
   * built before it.
   */
  sendMany?(frames: Buffer, lengths: Uint32Array, first: number): number;
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

/** One ICMPv6 message as read by recvmsg(2) on a raw ICMPv6 socket (native/src/icmp6_socket.cc). */
export interface NativeIcmp6Message {
  /** From the ICMPv6 header on (at most 64 KiB; see `length`). */
  message: Buffer;
  /** The IPv6 source and destination, 16 bytes each (IPV6_PKTINFO gives the destination). */
  src: Buffer;
  dst: Buffer;
  /** The IPv6 header's hop limit (IPV6_HOPLIMIT). */
  hopLimit: number;
  /** The message's real length; larger than message.length when truncated. */
  length: number;
}

/** A raw ICMPv6 socket bound to one interface: receives only, the types it was opened with. */
export interface NativeIcmp6Handle {
  /** IPV6_ADD_MEMBERSHIP of a 16-byte group on the bound interface; once per group (EADDRINUSE again). */
  joinGroup(group: Buffer): void;
  leaveGroup(group: Buffer): void;
  start(callback: (err: NativeSystemError | null, messages: NativeIcmp6Message[]) => void): void;
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
   * Opens and connects `count` sockets (IPv4 as host-order integers; with
   * addrs6, an entry whose addrs[i] is 0 is the IPv6 address at addrs6[16 i],
   * network order). out[i]: 0 connected at once, EINPROGRESS (result through
   * the callback), or the errno of socket()/connect()/epoll_ctl() (nothing
   * left open for that id).
   */
  connect(ids: Uint32Array, addrs: Uint32Array, ports: Uint16Array, count: number, out: Int32Array, addrs6?: Uint8Array): void;
  /** Closes a probe whose connect has not finished; no result follows. False when there was none. */
  cancel(id: number): boolean;
  /** Closes the connected sockets still waiting for the backend's FIN since the previous sweep; returns how many wait now. */
  sweep(): number;
  /**
   * Reset modes keep a probe's socket, disconnected, for the next probe to the
   * same address: closes the ones no probe took since the previous trim;
   * returns how many are kept now.
   */
  trim(): number;
  /** Socket counts: connecting, closing (FIN mode), swept; kept (idle), reused and trimmed in reset modes. */
  stats(): { connecting: number; closing: number; swept: number; idle: number; reused: number; trimmed: number };
  close(): void;
}

/**
 * The proxy's byte relay on raw descriptors (native/src/relay.cc):
 * one per proxy engine. Records come back through `events` (5 numbers each:
 * kind, id, a, b, c; see RELAY_* below), `count` of them per callback;
 * activity() and close()/reset() write into `activity`.
 */
export interface NativeRelayHandle {
  /** Takes over a listening descriptor (TCP_NODELAY, non-blocking, listen(backlog)); returns the listener id. */
  listen(fd: number, backlog: number): number;
  /** Stops accepting on a listener and closes its descriptor. */
  unlisten(listener: number): void;
  /**
   * Connects the backend side: IPv4 `address` in host order, or with
   * `address6` (16 bytes, network order) IPv6; 0 in progress (a RELAY_CONNECT
   * record follows), else the errno.
   */
  connect(id: number, address: number, port: number, address6?: Uint8Array): number;
  /** An IPv6 client's address (RELAY_ACCEPT's c is 6) into out[0..16]; false when the connection is gone. */
  peer6(id: number, out: Uint8Array): boolean;
  /** Gives up the backend connect in flight (the client stays, waiting for connect() or an end); false when there was none. */
  abort(id: number): boolean;
  /** Relays both ways; the first `headerLength` bytes of `header` go to the backend first. */
  start(id: number, header?: Buffer, headerLength?: number): void;
  /** Both sides closed now; the bytes not yet reported land in activity[0] (to backend), activity[1] (to client). */
  close(id: number): void;
  /** A RST to the client, the backend side closed; bytes as close(). */
  reset(id: number): void;
  /** Our FIN to the client, its bytes dropped until it closes (RELAY_GONE), the backend side closed. */
  refuse(id: number): void;
  /** Connections with traffic since the previous call: `count` [id, bytes to backend, bytes to client] triples in activity. */
  activity(): number;
  stats(): { connections: number; listeners: number; buffers: number; wakes: number; extraPasses: number };
  /** Closes everything (the engine stops; also done when the thread's environment ends). */
  destroy(): void;
}

/** Record kinds of NativeRelayHandle's events. */
export const RELAY_ACCEPT = 1;
export const RELAY_ACCEPT_ERROR = 2;
export const RELAY_CONNECT = 3;
export const RELAY_END = 4;
export const RELAY_HEADER = 5;
export const RELAY_GONE = 6;
export const RELAY_RECORD = 5;

/** The socket class of the addon (native/src/netlink_socket.cc). */
export interface NativeNetlinkHandle {
  send(data: Buffer | readonly Buffer[], port?: number, groups?: number): number;
  address(): { port: number; groups: number };
  addMembership(group: number): void;
  dropMembership(group: number): void;
  setRecvBufferSize(bytes: number): void;
  start(callback: (err: NativeSystemError | null, datagrams: Buffer[]) => void): void;
  setRef(ref: boolean): void;
  close(): void;
}

export interface NativeAddon {
  /** Absent from an addon built without it: the proxy refuses to start (forward/proxy.ts). */
  RelayHandle?: new (onEvents: (count: number) => void, events: Float64Array, activity: Float64Array) => NativeRelayHandle;
  /** Absent from an addon built without it: the health checker falls back to Node sockets. */
  /** closeMode: 0 our FIN, then wait for the backend's; 1 a RST (SO_LINGER 0); 2 a RST before the handshake's ACK (TCP_QUICKACK off). */
  TcpProbeHandle?: new (onResults: (count: number) => void, resultIds: Uint32Array, resultErrnos: Int32Array, closeMode?: number) => NativeTcpProbeHandle;
  /** Absent from an addon built before it: agent/net/netlink-socket.ts says to rebuild. */
  NetlinkHandle?: new (protocol: number) => NativeNetlinkHandle;
  /** Absent from an addon built before it: agent/net/neighbour/ndp-socket.ts says to rebuild. */
  Icmp6Handle?: new (ifindex: number, types: readonly number[]) => NativeIcmp6Handle;
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
  /** Absent from an addon built before it: the daemon then collects with gc() alone. */
  lowMemoryNotification?(): void;
  collectUnderPressure?(): void;
  listenTcp4(address: number, port: number, backlog: number, reusePort: boolean): { fd: number; port: number };
  listenTcp6(address: Uint8Array, port: number, backlog: number, reusePort: boolean): { fd: number; port: number };
  socketInfo(fd: number): NativeSocketInfo;
  dupFd(fd: number): number;
  /** SHA-256 by the node binary's OpenSSL (native/src/digest.cc); absent from an addon built before it. */
  sha256?(data: Uint8Array): Buffer;
  /** bpf(2) (native/src/bpf.cc); absent from an addon built before it. */
  bpfMapCreate?(type: number, keySize: number, valueSize: number, maxEntries: number, name: string): number;
  bpfMapUpdate?(fd: number, key: Buffer, value: Buffer, flags: number): void;
  bpfMapLookup?(fd: number, key: Buffer, out: Buffer): boolean;
  /** False when the key was not there; absent from an addon built before it (the NAT engine then loads its maps whole at every plan). */
  bpfMapDelete?(fd: number, key: Buffer): boolean;
  /**
   * BPF_MAP_UPDATE_BATCH of `count` entries packed back to back, written in
   * that order; returns the count. A refusal throws with `count`, the
   * entries written before it. Absent from an addon built before it.
   */
  bpfMapUpdateBatch?(fd: number, keys: Buffer, values: Buffer, count: number, flags: number): number;
  /** BPF_MAP_LOOKUP_BATCH of up to `count` entries from `inBatch` (null: the start); `more` false at the map's end. */
  bpfMapLookupBatch?(fd: number, inBatch: Buffer | null, outBatch: Buffer, keys: Buffer, values: Buffer, count: number): { count: number; more: boolean };
  /**
   * The per-CPU values of `count` entries (each `cpus` slots of `cpuSize`
   * bytes, as bpfMapLookupBatch packs them) summed over the CPUs: field j
   * (a u64 at offsets[j] of a slot) of entry i into out[i * offsets.length + j],
   * exact up to 2^53. No syscall.
   */
  bpfSumPerCpu?(values: Buffer, count: number, cpuSize: number, cpus: number, offsets: Uint32Array, out: Float64Array): void;
  bpfProgLoad?(type: number, insns: Buffer, license: string, name: string, logSize: number): number;
  bpfProgAttach?(ifindex: number, progFd: number, attachType: number, flags: number, replaceFd: number): void;
  bpfProgDetach?(ifindex: number, progFd: number, attachType: number): void;
  bpfProgQuery?(ifindex: number, attachType: number): number[];
  bpfProgGetFdById?(id: number): number;
  bpfProgInfo?(fd: number): BpfProgInfo;
  bpfProgTestRun?(fd: number, data: Buffer, out: Buffer, repeat: number): { retval: number; size: number; durationNs: number };
  bpfMapGetFdById?(id: number): number;
  bpfMapInfo?(fd: number): BpfMapInfo;
  /** libbpf (native/src/bpf_object.cc): open a clang-built object, create or re-use its pinned maps, load its programs. */
  bpfObjectLoad?(path: string, pinRoot: string, maxEntries: Readonly<Record<string, number>>): BpfObjectLoaded;
  /** How many keys a map holds now (BPF_MAP_GET_NEXT_KEY walk). */
  bpfMapCount?(fd: number, keySize: number): number;
  /** BPF_OBJ_PIN / BPF_OBJ_GET at a bpffs path. */
  bpfObjPin?(fd: number, path: string): void;
  bpfObjGet?(path: string): number;
  /** RTM_DELLINK from a background thread (native/src/background.cc); absent from an addon built before it. */
  deleteLink?(ifindex: number): Promise<void>;
  backgroundStats?(): BackgroundStats;
}

/**
 * What the addon's background threads have done (native/src/background.cc):
 * packet socket closes and link deletions, whose syscalls wait for RCU grace
 * periods (7-15 ms each) and so run off the event loop's thread.
 */
export interface BackgroundStats {
  readonly closes: number;
  readonly deletions: number;
  readonly threadsStarted: number;
  /** Jobs run on the caller's thread because no thread could be started. */
  readonly inline: number;
  /** Threads alive now (0 when idle: they end with the queue). */
  readonly threads: number;
  readonly queued: number;
  readonly peakThreads: number;
}

/** What BPF_OBJ_GET_INFO_BY_FD says about a map. */
export interface BpfMapInfo {
  readonly id: number;
  readonly type: number;
  readonly keySize: number;
  readonly valueSize: number;
  readonly maxEntries: number;
  readonly name: string;
}

/** What BPF_OBJ_GET_INFO_BY_FD says about a program. */
export interface BpfProgInfo {
  readonly id: number;
  readonly type: number;
  readonly name: string;
  readonly mapIds: readonly number[];
}

/** The bpf(2) calls of the addon, all present; close descriptors with fs.closeSync. */
export type NativeBpf = Required<Pick<NativeAddon, 'bpfMapCreate' | 'bpfMapUpdate' | 'bpfMapLookup' | 'bpfProgLoad' | 'bpfProgAttach' | 'bpfProgDetach' | 'bpfProgQuery' | 'bpfProgGetFdById' | 'bpfProgInfo' | 'bpfProgTestRun' | 'bpfMapGetFdById' | 'bpfMapInfo'>>;

/** What bpfObjectLoad hands back: descriptors by program and map name (the caller closes them), and the pinned maps it had to replace. */
export interface BpfObjectLoaded {
  readonly prog: Readonly<Record<string, number>>;
  readonly maps: Readonly<Record<string, number>>;
  /** Pinned maps of another layout or size, unpinned so that new ones were created (their entries are gone). */
  readonly unpinned: readonly string[];
}

/** The bpf(2) calls and libbpf's object loading, all present. */
export type NativeBpfObject = NativeBpf & Required<Pick<NativeAddon, 'bpfObjectLoad' | 'bpfMapCount' | 'bpfObjPin' | 'bpfObjGet'>> & Pick<NativeAddon, 'bpfMapDelete' | 'bpfMapUpdateBatch' | 'bpfMapLookupBatch' | 'bpfSumPerCpu'>;

/** The addon's libbpf object loading with its bpf(2) calls, or why there is none. */
export function nativeBpfObject(): NativeBpfObject | string {
  const b = nativeBpf();
  if (typeof b === 'string') return b;
  const n = b as Partial<NativeBpfObject>;
  if (typeof n.bpfObjectLoad !== 'function' || typeof n.bpfMapCount !== 'function' || typeof n.bpfObjGet !== 'function') return 'the native addon was built without libbpf object loading (rebuild it: npm ci)';
  return n as NativeBpfObject;
}

/** A BPF object built by clang beside the addon (binding.gyp): native/build/Release/<name>. */
export function bpfObjectPath(name: string): string {
  return path.join(path.dirname(nativeAddonPath()), name);
}

/** The addon's bpf(2) wrappers, or why there are none (not built, or built before them). */
export function nativeBpf(): NativeBpf | string {
  try {
    const n = loadNative();
    if (typeof n.bpfProgLoad !== 'function') return 'the native addon was built without bpf(2) support (rebuild it: npm ci)';
    if (typeof n.bpfMapInfo !== 'function') return 'the native addon predates the DSR flow map\'s calls (rebuild it: npm ci)';
    return n as NativeBpf;
  } catch (err) {
    return (err as Error).message;
  }
}

/** What a socket descriptor is (getsockname, SO_TYPE, SO_ACCEPTCONN, SO_REUSEPORT). */
export interface NativeSocketInfo {
  /** AF_INET = 2, AF_INET6 = 10, AF_UNIX = 1. */
  readonly family: number;
  /** SOCK_STREAM = 1, SOCK_DGRAM = 2. */
  readonly type: number;
  /** IPv4 only: the bound address as a host-order u32. */
  readonly address?: number;
  /** IPv6 only: the bound address, 16 bytes in network order. */
  readonly address6?: Buffer;
  /** IPv4 and IPv6: the bound port. */
  readonly port?: number;
  readonly listening: boolean;
  readonly reusePort: boolean;
  /** TCP only: TCP_NODELAY (accepted sockets inherit it from their listener). */
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

/** The addon once loaded: a process loads one .node file once and never unloads it. */
let loaded: NativeAddon | undefined;

/**
 * The addon, loaded on first use. Kept once loaded: finding the file and
 * require()'s resolution are stat(2) calls every time (~0.2 ms a
 * call, paid on every packet socket opened, 100 at a 50-service start). A
 * failure is not kept: the next call tries again and throws again.
 */
export function loadNative(): NativeAddon {
  return (loaded ??= loadNativeFile());
}

function loadNativeFile(): NativeAddon {
  const file = nativeAddonPath();
  if (!fs.existsSync(file)) {
    throw new LbError(
      'LB_ERR_NET_NATIVE_MISSING',
      `native addon not built: ${file} is missing; run \`npm ci\` in the lb-agent directory (it builds native/ with node-gyp), then \`npm run build\``,
      { path: file },
    );
  }
  try {
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
 * thread's arena, so each reload's parse worker left ~0.3 MiB behind.
 */
export function mallocTrim(): boolean {
  return loadNative().mallocTrim();
}

/**
 * V8's low-memory collection (v8::Isolate::LowMemoryNotification): full
 * collections that also shrink the young generation and free V8's pool of
 * emptied pages, which a plain gc() leaves resident or not depending on V8's
 * allocation-rate heuristics (the one-service RSS read 55.0 or
 * 56.0 MiB run to run). false when the addon is missing or predates it
 * (nothing was done).
 */
export function lowMemoryNotification(): boolean {
  const f = optionalFunction('lowMemoryNotification');
  if (f === undefined) return false;
  f();
  return true;
}

/**
 * V8's answer to critical memory pressure (v8::Isolate::
 * MemoryPressureNotification): one full collection flagged to reduce the
 * footprint, which shrinks the young generation and uncommits its idle
 * semi-space as lowMemoryNotification does, without its repeated
 * collections and cleared compilation cache: about gc()'s cost. After gc()
 * alone, each reload left the young generation's memory committed that the
 * start's collection had returned. false when the addon is missing or
 * predates it (nothing was done).
 */
export function collectUnderPressure(): boolean {
  const f = optionalFunction('collectUnderPressure');
  if (f === undefined) return false;
  f();
  return true;
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

/** listenTcp4's twin for an IPv6 address (16 bytes, network order); the socket is IPV6_V6ONLY. */
export function listenTcp6(address: Uint8Array, port: number, backlog: number, reusePort: boolean): { fd: number; port: number } {
  return loadNative().listenTcp6(address, port, backlog, reusePort);
}

/** What a descriptor is: checks a listening socket inherited from the service manager before use. */
export function socketInfo(fd: number): NativeSocketInfo {
  return loadNative().socketInfo(fd);
}

/** An addon function that older builds lack: undefined when the addon is missing or predates it. */
function optionalFunction<K extends 'sha256' | 'lowMemoryNotification' | 'collectUnderPressure' | 'deleteLink' | 'backgroundStats'>(name: K): NativeAddon[K] | undefined {
  try {
    const f = loadNative()[name];
    return typeof f === 'function' ? f : undefined;
  } catch {
    return undefined;
  }
}

/**
 * SHA-256 without node:crypto (native/src/digest.cc: loading node:crypto
 * for one hash per DHCP service costs ~0.55 MiB of RSS); undefined when
 * the addon is missing or predates it.
 */
export function sha256Fn(): ((data: Uint8Array) => Buffer) | undefined {
  return optionalFunction('sha256');
}

/**
 * Delete a link from a background thread (its own netlink socket, one
 * RTM_DELLINK, the kernel's answer): the kernel's wait for RCU grace periods
 * (~15 ms a link here) happens off the event loop, and several deletions
 * wait together. Rejects with the errno error (code ENODEV: no such link).
 * Undefined when the addon is missing or predates it.
 */
export function deleteLinkFn(): ((ifindex: number) => Promise<void>) | undefined {
  return optionalFunction('deleteLink');
}

/** What the addon's background threads have done; undefined when the addon is missing or predates them. */
export function backgroundStats(): BackgroundStats | undefined {
  return optionalFunction('backgroundStats')?.();
}

/** fcntl(F_DUPFD_CLOEXEC): another descriptor of the same socket, for a worker to own and close. */
export function dupFd(fd: number): number {
  return loadNative().dupFd(fd);
}

/** The addon's relay class, or why there is none (not built, or built before it). */
export function relayHandleClass(): NonNullable<NativeAddon['RelayHandle']> | string {
  try {
    const c = loadNative().RelayHandle;
    return typeof c === 'function' ? c : 'the native addon was built without the relay (rebuild it: npm ci)';
  } catch (err) {
    return (err as Error).message;
  }
}
