// An in-memory PacketSocket for unit tests of net/ drivers: records what is
// sent, lets the test inject ARP frames, and can be told to fail sends.
import { EventEmitter } from 'node:events';
import { encodeArp, type ArpPacket } from '../../agent/net/neighbour/arp';
import type { PacketSocket } from '../../agent/net/packet/packet';

export class MemorySocket extends EventEmitter {
  readonly ifindex = 7;
  readonly sent: Buffer[] = [];
  closed = false;
  failSends = false;
  send(frame: Buffer): void {
    if (this.failSends) throw Object.assign(new Error('send: ENETDOWN'), { code: 'ENETDOWN' });
    this.sent.push(frame);
  }
  close(): void { this.closed = true; }
  inject(p: ArpPacket): void { this.emit('frame', encodeArp(p), { csumNotReady: false, pktType: 0 }); }
  get asSocket(): PacketSocket { return this; }
}
