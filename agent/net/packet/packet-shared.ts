// Shared packet sockets (driver layer over packet.ts): one AF_PACKET socket
// on a parent NIC serves every macvlan on it that asks for the same frames
// (DHCP client replies: UDP to port 68). Each macvlan gets a port that looks
// like its own PacketSocket; a frame reaches exactly one port, never another's.
//
// Why it works (kernel fact, checked on this kernel with 50 bridge-mode
// macvlans): __netif_receive_skb_core delivers a frame to the protocol
// sockets of the device it arrived on (orig_dev) even after macvlan's rx
// handler moved it to a macvlan, and packet_rcv reports skb->dev, so a
// unicast frame for a macvlan's MAC comes up once, with that macvlan's
// sll_ifindex. A broadcast comes up once with the parent's index (the copies
// macvlan makes for each macvlan are not the parent's); its owner is found
// in the frame itself (DHCP: chaddr).
// Why: 50 DHCP services opened 50 sockets (socket, BPF JIT, epoll
// registration, ~0.2-0.6 ms each). A port's frames are sent through the
// shared socket with the port's ifindex in sendto's address, so they leave
// from the macvlan, as before (docs/design.md: every DHCP frame leaves from the
// macvlan). Sending from the parent instead would be cheaper still: a
// broadcast from a bridge-mode macvlan is cloned to every other macvlan
// inside the send (~60 us of CPU against ~7 us from the parent, 50
// macvlans, measured), but it would change where frames come from.
import { EventEmitter } from 'node:events';
import { LbError } from '../../errors';
import type { Logger } from '../../log';
import type { BpfProgram } from './bpf';
import type { NetMetrics } from '../metrics';
import { openPacketSocket, type FrameInfo, type PacketSocket, type PacketSocketOptions } from './packet';

export interface SharedPortOptions {
  /** The parent NIC the shared socket is bound to. */
  parentIfindex: number;
  /** The macvlan this port is for: frames the kernel handed to it. */
  ifindex: number;
  /** Its MAC (lower case, colon form): frames received on the parent itself whose owner() is this MAC. */
  mac: string;
  /** For the shared socket, when this port opens it. */
  log?: Logger;
  metrics?: NetMetrics;
}

export interface PacketSocketGroupOptions {
  protocol: number;
  filter?: BpfProgram;
  /** For a frame received on the parent itself (a broadcast): the MAC of the port it is for, or undefined. */
  owner: (frame: Buffer) => string | undefined;
  /** Opens the shared sockets; default packet.ts's. */
  open?: (opts: PacketSocketOptions) => PacketSocket;
}

export interface PacketSocketGroupCounts {
  /** Shared sockets opened so far. */
  opened: number;
  /** Ports attached so far. */
  attached: number;
  /** Frames delivered to a port. */
  delivered: number;
  /** Frames no port claimed (e.g. the VM's own DHCP client's, on the parent's MAC). */
  unclaimed: number;
}

interface Shared {
  readonly parentIfindex: number;
  readonly socket: PacketSocket;
  readonly byIfindex: Map<number, SharedPort>;
  readonly byMac: Map<string, SharedPort>;
}

/** One macvlan's view of the shared socket: a PacketSocket whose frames are its own. */
class SharedPort extends EventEmitter implements PacketSocket {
  private closed = false;

  constructor(readonly ifindex: number, readonly mac: string, private readonly shared: Shared, private readonly release: (p: SharedPort) => void) {
    super();
  }

  send(frame: Buffer): void {
    if (this.closed) throw new LbError('LB_ERR_NET_SOCKET', `packet socket port for ifindex ${this.ifindex} is closed`, { ifindex: this.ifindex });
    this.shared.socket.send(frame, this.ifindex);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.release(this);
    this.emit('close');
  }
}

/**
 * Ports on shared packet sockets, one socket per parent NIC, opened with the
 * first port and closed with the last.
 */
export class PacketSocketGroup {
  private readonly shared = new Map<number, Shared>();
  private readonly count: PacketSocketGroupCounts = { opened: 0, attached: 0, delivered: 0, unclaimed: 0 };

  constructor(private readonly opts: PacketSocketGroupOptions) {}

  /** A port for one macvlan. Throws what opening the shared socket throws (LbError). */
  attach(o: SharedPortOptions): PacketSocket {
    let s = this.shared.get(o.parentIfindex);
    if (s === undefined) {
      const open = this.opts.open ?? openPacketSocket;
      const socket = open({ ifindex: o.parentIfindex, protocol: this.opts.protocol, filter: this.opts.filter, log: o.log, metrics: o.metrics });
      const made: Shared = { parentIfindex: o.parentIfindex, socket, byIfindex: new Map(), byMac: new Map() };
      socket.on('frame', (frame: Buffer, info: FrameInfo) => this.deliver(made, frame, info));
      // ENETDOWN and the like concern every port on the parent.
      socket.on('error', (err: Error) => { for (const p of made.byIfindex.values()) if (p.listenerCount('error') > 0) p.emit('error', err); });
      this.shared.set(o.parentIfindex, made);
      this.count.opened++;
      s = made;
    }
    const mac = o.mac.toLowerCase();
    if (s.byIfindex.has(o.ifindex) || s.byMac.has(mac)) throw new RangeError(`a port for ifindex ${o.ifindex} / ${mac} is already open`);
    const shared = s;
    const port = new SharedPort(o.ifindex, mac, shared, (p) => this.detach(shared, p));
    shared.byIfindex.set(o.ifindex, port);
    shared.byMac.set(mac, port);
    this.count.attached++;
    return port;
  }

  counts(): PacketSocketGroupCounts {
    return { ...this.count };
  }

  private deliver(s: Shared, frame: Buffer, info: FrameInfo): void {
    const ix = info.ifindex;
    let port = ix !== undefined ? s.byIfindex.get(ix) : undefined;
    if (port === undefined && (ix === undefined || ix === s.parentIfindex)) {
      const mac = this.opts.owner(frame);
      port = mac !== undefined ? s.byMac.get(mac) : undefined;
    }
    if (port === undefined) { this.count.unclaimed++; return; }
    this.count.delivered++;
    port.emit('frame', frame, info);
  }

  private detach(s: Shared, p: SharedPort): void {
    if (s.byIfindex.get(p.ifindex) === p) s.byIfindex.delete(p.ifindex);
    if (s.byMac.get(p.mac) === p) s.byMac.delete(p.mac);
    if (s.byIfindex.size === 0 && this.shared.get(s.parentIfindex) === s) {
      this.shared.delete(s.parentIfindex);
      s.socket.close();
    }
  }
}
