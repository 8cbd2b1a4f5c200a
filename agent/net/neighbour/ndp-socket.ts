// NDP sockets (driver layer over native.ts and packet.ts): neighbour
// solicitations and advertisements of one interface in, whole Ethernet
// frames out. Receiving is a raw ICMPv6 socket (native Icmp6Handle) bound to
// the interface with ICMP6_FILTER passing types 135 and 136 only (or 136
// alone, for the peer resolver: ndp-resolver.ts); it hears
// what the IPv6 stack delivers there: the interface's own addresses,
// all-nodes, and the solicited-node groups joined on it (joinGroup,
// IPV6_ADD_MEMBERSHIP, RFC 4862 §5.4.2: before a DAD probe, so another
// node's probe from :: is heard too). The kernel looks this socket up only
// for ICMPv6 delivered locally, where a packet socket of ETH_P_IPV6 ran its
// filter on every IPv6 frame of the interface, forwarded traffic included.
// Sending is a packet socket of protocol 0, which receives nothing: a DAD
// probe leaves from ::, and an advertisement from a VIP the interface may
// not hold yet, which no IPv6 socket can send from.
//
// Each message comes up as the Ethernet frame ndp.ts decodes
// (ndpFrameFromIcmp6), with the hop limit the kernel received, so hop
// limit, checksum and option rules are judged, dropped and counted where
// they always are. The kernel verifies the ICMPv6 checksum before queueing
// (raw(7)): a message with a bad one never arrives.
import { EventEmitter } from 'node:events';
import { LbError } from '../../errors';
import type { Logger } from '../../log';
import { silentLogger } from '../../log';
import type { NetMetrics } from '../metrics';
import { loadNative, PACKET_HOST, PACKET_MULTICAST, type NativeIcmp6Handle, type NativeIcmp6Message } from '../../native/native';
import { openPacketSocket, packetSocketError, type FrameInfo, type PacketSocket, type PacketSocketOptions } from '../packet/packet';
import { ICMPV6_NEIGHBOUR_ADVERTISEMENT, ICMPV6_NEIGHBOUR_SOLICITATION, ndpFrameFromIcmp6 } from './ndp';

/** A PacketSocket for neighbour discovery: frames as ever, and IPv6 groups instead of multicast MACs. */
export interface NdpSocket extends PacketSocket {
  /** Receive messages to this group on the interface (a solicited-node group); counted per group, left with the socket. Throws LbError. */
  joinGroup(group: bigint): void;
  /** Undo one joinGroup of the same group. */
  leaveGroup(group: bigint): void;
}

export interface NdpSocketOptions {
  readonly ifindex: number;
  readonly metrics?: NetMetrics | undefined;
  readonly log?: Logger | undefined;
  /** The ICMPv6 types heard; default solicitations and advertisements (135, 136). A peer resolver hears advertisements only. */
  readonly types?: readonly number[];
  /** The sending socket; default packet.ts's (protocol 0: it receives nothing). */
  readonly openPacket?: (opts: PacketSocketOptions) => PacketSocket;
}

/** The 16 bytes of an IPv6 address value. */
function addressBytes(a: bigint): Buffer {
  const b = Buffer.alloc(16);
  let v = a;
  for (let i = 15; i >= 0; i--) { b[i] = Number(v & 0xffn); v >>= 8n; }
  return b;
}

class NdpSocketImpl extends EventEmitter implements NdpSocket {
  private handle: NativeIcmp6Handle | undefined;
  /** Groups joined, with how many joins each: the kernel takes one per socket. */
  private readonly groups = new Map<bigint, number>();
  private childLog: Logger | undefined;

  constructor(readonly ifindex: number, handle: NativeIcmp6Handle, private readonly sender: PacketSocket, private readonly metrics: NetMetrics | undefined, private readonly parentLog: Logger | undefined) {
    super();
    this.handle = handle;
    sender.on('error', (err: Error) => this.fail(err));
    handle.start((err, messages) => this.onMessages(err, messages));
  }

  private get log(): Logger {
    this.childLog ??= (this.parentLog ?? silentLogger()).child({ module: 'net/ndp-socket', ifindex: this.ifindex });
    return this.childLog;
  }

  private onMessages(err: Error | null, messages: NativeIcmp6Message[]): void {
    for (const m of messages) {
      if (this.handle === undefined) return; // closed by a listener mid-batch
      if (m.length > m.message.length) {
        this.metrics?.framesDropped.inc({ reason: 'truncated' });
        continue;
      }
      const info: FrameInfo = { csumNotReady: false, pktType: m.dst[0] === 0xff ? PACKET_MULTICAST : PACKET_HOST, ifindex: this.ifindex };
      this.emit('frame', ndpFrameFromIcmp6(m), info);
    }
    if (err && this.handle !== undefined) this.fail(packetSocketError(err, 'reading neighbour discovery', this.ifindex));
  }

  private fail(err: Error): void {
    // An unheard 'error' would crash the process: without a listener it is only logged.
    if (this.listenerCount('error') > 0) this.emit('error', err);
    else this.log.warn({ op: 'recv', err: err.message }, 'NDP socket failed');
  }

  send(frame: Buffer, ifindex?: number): void {
    if (!this.handle) throw new LbError('LB_ERR_NET_SOCKET', `NDP socket on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    this.sender.send(frame, ifindex);
  }

  joinGroup(group: bigint): void {
    if (!this.handle) throw new LbError('LB_ERR_NET_SOCKET', `NDP socket on ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    const n = this.groups.get(group) ?? 0;
    if (n === 0) {
      try { this.handle.joinGroup(addressBytes(group)); } catch (err) {
        throw packetSocketError(err, 'joining a solicited-node group', this.ifindex);
      }
    }
    this.groups.set(group, n + 1);
  }

  leaveGroup(group: bigint): void {
    const n = this.groups.get(group);
    if (n === undefined || !this.handle) return;
    if (n > 1) { this.groups.set(group, n - 1); return; }
    this.groups.delete(group);
    try { this.handle.leaveGroup(addressBytes(group)); } catch (err) {
      throw packetSocketError(err, 'leaving a solicited-node group', this.ifindex);
    }
  }

  close(): void {
    const h = this.handle;
    if (!h) return;
    this.handle = undefined;
    // The kernel leaves the groups with the socket.
    this.groups.clear();
    h.close();
    this.sender.close();
    this.emit('close');
  }
}

/**
 * Open the NDP socket of `ifindex`. Throws LbError: LB_ERR_NET_NO_CAPABILITY
 * (CAP_NET_RAW), LB_ERR_NET_NO_INTERFACE, LB_ERR_NET_SOCKET,
 * LB_ERR_NET_NATIVE_MISSING. Nothing is half-open: on a failure both
 * descriptors are closed.
 */
export function openNdpSocket(opts: NdpSocketOptions): NdpSocket {
  if (!Number.isInteger(opts.ifindex) || opts.ifindex <= 0) throw new RangeError(`ifindex must be a positive integer, got ${opts.ifindex}`);
  const native = loadNative();
  if (native.Icmp6Handle === undefined) {
    throw new LbError('LB_ERR_NET_NATIVE_MISSING', 'the native addon has no ICMPv6 socket (built before it); rebuild it with `npm ci`', {});
  }
  let handle: NativeIcmp6Handle;
  try {
    handle = new native.Icmp6Handle(opts.ifindex, opts.types ?? [ICMPV6_NEIGHBOUR_SOLICITATION, ICMPV6_NEIGHBOUR_ADVERTISEMENT]);
  } catch (err) {
    throw packetSocketError(err, 'opening an ICMPv6 socket for neighbour discovery', opts.ifindex);
  }
  let sender: PacketSocket;
  try {
    sender = (opts.openPacket ?? openPacketSocket)({ ifindex: opts.ifindex, protocol: 0, metrics: opts.metrics, log: opts.log });
  } catch (err) {
    handle.close();
    throw err;
  }
  return new NdpSocketImpl(opts.ifindex, handle, sender, opts.metrics, opts.log);
}
