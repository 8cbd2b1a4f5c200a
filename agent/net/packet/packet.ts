// Packet sockets (driver layer over native.ts): an AF_PACKET socket bound to
// one interface and one ethertype, emitting whole Ethernet frames. It knows
// nothing of what the frames carry; DHCP, ARP and VRRP decode them above.
import { EventEmitter } from 'node:events';
import { LbError } from '../../errors';
import type { Logger } from '../../log';
import { silentLogger } from '../../log';
import { bpfProblem, type BpfProgram } from './bpf';
import type { NetMetrics } from '../metrics';
import {
  ifIndexToName,
  ifNameToIndex,
  isSystemError,
  loadNative,
  type NativeFrame,
  type NativePacketHandle,
  TP_STATUS_CSUMNOTREADY,
} from '../../native/native';

export { bpfArp, bpfEtherType, bpfIpProto, bpfUdpDstPort, bpfProblem, formatBpf, type BpfProgram, type BpfInstruction } from './bpf';
export { PACKET_HOST, PACKET_BROADCAST, PACKET_MULTICAST, PACKET_OTHERHOST, PACKET_OUTGOING } from '../../native/native';

/** ETH_P_ALL: every ethertype (and, on such a socket, our own outgoing frames too). */
export const ETH_P_ALL = 0x0003;
export const ETH_P_IP = 0x0800;
export const ETH_P_ARP = 0x0806;

export interface FrameInfo {
  /**
   * TP_STATUS_CSUMNOTREADY: the frame's L4 checksum is still to be filled in
   * by offload (veth, virtio, loopback). Its checksum field is not valid and
   * must not be verified; the frame is fine.
   */
  csumNotReady: boolean;
  /** sll_pkttype: PACKET_HOST 0, BROADCAST 1, MULTICAST 2, OTHERHOST 3, OUTGOING 4. */
  pktType: number;
  /** sll_ifindex: the interface the frame came in on (a macvlan's, on its parent's socket; packet-shared.ts). */
  ifindex?: number;
}

export interface PacketSocketOptions {
  ifindex: number;
  /** Ethertype in host order: 0x0800, 0x0806, 0x0003 (ETH_P_ALL). */
  protocol: number;
  /** Classic BPF run by the kernel before a frame is queued (see bpf.ts). */
  filter?: BpfProgram;
  /** Multicast MACs to receive (VRRP: 01:00:5e:00:00:12). Dropped by the kernel when the socket closes. */
  multicast?: Buffer[];
  promiscuous?: boolean;
  /** Optional: count dropped frames. */
  metrics?: NetMetrics;
  log?: Logger;
  /** Whether the open socket keeps the process alive (default true). */
  ref?: boolean;
}

export interface PacketSocket extends EventEmitter {
  readonly ifindex: number;
  /**
   * Send one whole Ethernet frame (destination MAC first). ifindex: the
   * interface it leaves by, when not the socket's own (a parent's shared
   * socket sending a macvlan's frame: packet-shared.ts). Throws LbError.
   */
  send(frame: Buffer, ifindex?: number): void;
  /**
   * Send whole frames from the socket's own interface with as few syscalls
   * as the kernel allows (sendmmsg(2): one for up to 1,024 frames). Never
   * throws for a frame: the outcome of each, in order, undefined where it
   * was sent. Sockets of a shared port do not offer it.
   */
  sendMany?(frames: readonly Buffer[]): (LbError | undefined)[];
  /**
   * Send a frame now, or (a port of the shared neighbour sockets inside a
   * refresh slot: neighbour-sockets.ts) with the slot's other frames at its
   * end. `done` gets the outcome either way. Only such ports offer it.
   */
  sendSoon?(frame: Buffer, done: (err?: LbError) => void): void;
  /**
   * Receive frames to this multicast MAC too (PACKET_ADD_MEMBERSHIP,
   * PACKET_MR_MULTICAST: the NIC's filter is opened for it); counted by the
   * kernel per socket and dropped with it. Sockets of the parent's shared
   * port do not offer it.
   */
  addMembership?(mac: Buffer): void;
  /** Undo one addMembership of the same MAC. */
  dropMembership?(mac: Buffer): void;
  /**
   * Replace the kernel filter (SO_ATTACH_FILTER: atomic, a frame meets the
   * old program or the new one). Throws RangeError for a malformed program,
   * LbError when the kernel refuses it. Ports of a shared socket do not offer it.
   */
  setFilter?(program: BpfProgram): void;
  /** Idempotent. */
  close(): void;
  // events: 'frame' (frame: Buffer, info: FrameInfo), 'error' (err: LbError), 'close'
}

/** How an interface is named in messages: its name when it still exists. */
function describeInterface(ifindex: number): string {
  try {
    return `${ifIndexToName(ifindex)} (ifindex ${ifindex})`;
  } catch {
    return `ifindex ${ifindex}`;
  }
}

/** Turn an addon system error into an LbError that says what to do. */
export function packetSocketError(err: unknown, what: string, ifindex: number): LbError {
  if (err instanceof LbError) return err;
  if (!isSystemError(err)) {
    return new LbError('LB_ERR_NET_SOCKET', `${what} on ${describeInterface(ifindex)} failed: ${String(err)}`, { ifindex }, { cause: err });
  }
  const details = { ifindex, syscall: err.syscall, errno: err.code };
  switch (err.code) {
    case 'EPERM':
    case 'EACCES':
      return new LbError(
        'LB_ERR_NET_NO_CAPABILITY',
        `${what} on ${describeInterface(ifindex)} needs CAP_NET_RAW (${err.syscall}: ${err.code}); run lb-agent as root or grant CAP_NET_RAW`,
        { ...details, capability: 'CAP_NET_RAW' },
        { cause: err },
      );
    case 'ENODEV':
    case 'ENXIO':
      return new LbError(
        'LB_ERR_NET_NO_INTERFACE',
        `${what}: interface ${describeInterface(ifindex)} does not exist (${err.syscall}: ${err.code})`,
        details,
        { cause: err },
      );
    case 'ENETDOWN': {
      // packet(7): the socket is unhooked while the interface is down and
      // hooked again when it comes back up; if it was deleted, it never will.
      let exists = true;
      try { ifIndexToName(ifindex); } catch { exists = false; }
      if (!exists) {
        return new LbError('LB_ERR_NET_NO_INTERFACE', `${what}: interface ifindex ${ifindex} no longer exists (ENETDOWN); the socket is useless and should be closed`, details, { cause: err });
      }
      return new LbError('LB_ERR_NET_SOCKET', `${what} on ${describeInterface(ifindex)}: the interface went down (ENETDOWN); frames resume when it is up again`, details, { cause: err });
    }
    default:
      return new LbError('LB_ERR_NET_SOCKET', `${what} on ${describeInterface(ifindex)} failed: ${err.message}`, details, { cause: err });
  }
}

/** Interface name to index, as an LbError naming the interface when it does not exist. */
export function interfaceIndex(name: string): number {
  try {
    return ifNameToIndex(name);
  } catch (err) {
    if (err instanceof LbError) throw err;
    throw new LbError('LB_ERR_NET_NO_INTERFACE', `interface ${name} does not exist`, { interface: name }, { cause: err });
  }
}

class PacketSocketImpl extends EventEmitter implements PacketSocket {
  readonly ifindex: number;
  private handle: NativePacketHandle | undefined;
  private readonly metrics: NetMetrics | undefined;
  private readonly parentLog: Logger | undefined;
  private childLog: Logger | undefined;

  constructor(handle: NativePacketHandle, opts: PacketSocketOptions) {
    super();
    this.ifindex = opts.ifindex;
    this.handle = handle;
    this.metrics = opts.metrics;
    this.parentLog = opts.log;
  }

  /**
   * Made on the first line logged (a truncated frame, a read error): a pino
   * child per socket cost ~70 us at open, 100 sockets when 50 DHCP services
   * start, for lines most sockets never write.
   */
  private get log(): Logger {
    this.childLog ??= (this.parentLog ?? silentLogger()).child({ module: 'net/packet', ifindex: this.ifindex });
    return this.childLog;
  }

  start(ref: boolean): void {
    this.handle!.setRef(ref);
    this.handle!.start((err, frames) => this.onFrames(err, frames));
  }

  private onFrames(err: Error | null, frames: NativeFrame[]): void {
    for (const f of frames) {
      if (this.handle === undefined) return; // closed by a listener mid-batch
      if (f.length > f.frame.length) {
        this.metrics?.framesDropped.inc({ reason: 'truncated' });
        this.log.debug({ op: 'recv', length: f.length }, 'dropped truncated frame');
        continue;
      }
      this.emit('frame', f.frame, { csumNotReady: (f.status & TP_STATUS_CSUMNOTREADY) !== 0, pktType: f.pktType, ifindex: f.ifindex } satisfies FrameInfo);
    }
    if (err && this.handle !== undefined) {
      // Typically ENETDOWN when the interface went down or away. The socket
      // stays open; the owner decides. An unheard 'error' would crash the
      // process, so without a listener it is only logged.
      const e = packetSocketError(err, 'reading frames', this.ifindex);
      if (this.listenerCount('error') > 0) this.emit('error', e);
      else this.log.warn({ op: 'recv', err: e.message }, 'packet socket read failed');
    }
  }

  send(frame: Buffer, ifindex?: number): void {
    if (!this.handle) throw new LbError('LB_ERR_NET_SOCKET', `packet socket on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    try {
      if (ifindex === undefined) this.handle.send(frame);
      else this.handle.send(frame, ifindex);
    } catch (err) {
      throw packetSocketError(err, 'sending a frame', ifindex ?? this.ifindex);
    }
  }

  sendMany(frames: readonly Buffer[]): (LbError | undefined)[] {
    const out: (LbError | undefined)[] = new Array<LbError | undefined>(frames.length).fill(undefined);
    if (frames.length === 0) return out;
    const h = this.handle;
    if (!h) return out.fill(new LbError('LB_ERR_NET_SOCKET', `packet socket on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex }));
    if (h.sendMany === undefined) {
      // An addon built before sendMany: one send each.
      frames.forEach((f, i) => { try { this.send(f); } catch (err) { out[i] = err as LbError; } });
      return out;
    }
    const lengths = Uint32Array.from(frames, (f) => f.length);
    const data = Buffer.concat(frames);
    // sendmmsg stops at a frame that fails and reports only the count before
    // it: the next call starts there and throws that frame's errno.
    for (let at = 0; at < frames.length;) {
      try {
        at += h.sendMany(data, lengths, at);
      } catch (err) {
        if (err instanceof RangeError || err instanceof TypeError) throw err;
        out[at] = packetSocketError(err, 'sending a frame', this.ifindex);
        at++;
      }
    }
    return out;
  }

  addMembership(mac: Buffer): void {
    this.membership(mac, 'add');
  }

  setFilter(program: BpfProgram): void {
    const problem = bpfProblem(program);
    if (problem) throw new RangeError(`invalid BPF filter: ${problem}`);
    if (!this.handle) throw new LbError('LB_ERR_NET_SOCKET', `packet socket on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    try {
      this.handle.attachFilter(program);
    } catch (err) {
      throw packetSocketError(err, 'replacing the kernel filter', this.ifindex);
    }
  }

  dropMembership(mac: Buffer): void {
    this.membership(mac, 'drop');
  }

  private membership(mac: Buffer, op: 'add' | 'drop'): void {
    if (mac.length !== 6) throw new RangeError('multicast MAC must be 6 bytes');
    if (!this.handle) throw new LbError('LB_ERR_NET_SOCKET', `packet socket on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    try {
      if (op === 'add') this.handle.addMembership('multicast', mac);
      else this.handle.dropMembership('multicast', mac);
    } catch (err) {
      throw packetSocketError(err, `${op === 'add' ? 'joining' : 'leaving'} a multicast group`, this.ifindex);
    }
  }

  close(): void {
    const h = this.handle;
    if (!h) return;
    this.handle = undefined;
    h.close();
    this.emit('close');
  }
}

/**
 * Open a packet socket. Throws LbError: LB_ERR_NET_NO_CAPABILITY (CAP_NET_RAW),
 * LB_ERR_NET_NO_INTERFACE, LB_ERR_NET_SOCKET, LB_ERR_NET_NATIVE_MISSING.
 * Nothing is half-applied: on any failure the descriptor is closed.
 */
export function openPacketSocket(opts: PacketSocketOptions): PacketSocket {
  if (!Number.isInteger(opts.ifindex) || opts.ifindex <= 0) throw new RangeError(`ifindex must be a positive integer, got ${opts.ifindex}`);
  if (!Number.isInteger(opts.protocol) || opts.protocol < 0 || opts.protocol > 0xffff) throw new RangeError(`protocol must be an ethertype, got ${opts.protocol}`);
  if (opts.filter) {
    const problem = bpfProblem(opts.filter);
    if (problem) throw new RangeError(`invalid BPF filter: ${problem}`);
  }
  const native = loadNative();
  let handle: NativePacketHandle;
  try {
    handle = new native.PacketHandle(opts.ifindex, opts.protocol, opts.filter);
  } catch (err) {
    throw packetSocketError(err, 'opening a packet socket', opts.ifindex);
  }
  try {
    for (const mac of opts.multicast ?? []) {
      if (mac.length !== 6) throw new RangeError('multicast MAC must be 6 bytes');
      handle.addMembership('multicast', mac);
    }
    if (opts.promiscuous) handle.addMembership('promisc');
    const sock = new PacketSocketImpl(handle, opts);
    sock.start(opts.ref ?? true);
    return sock;
  } catch (err) {
    handle.close();
    if (err instanceof RangeError) throw err;
    throw packetSocketError(err, 'configuring a packet socket', opts.ifindex);
  }
}
