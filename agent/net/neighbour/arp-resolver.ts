// ARP as the IPv4 peer resolver's protocol (peer-resolver.ts): who-has
// requests broadcast for each target, and learning from any ARP frame a
// target sends (its replies, its requests, its gratuitous ARPs).
import { formatIPv4 } from '../../address';
import { ARP_OP_REQUEST, BROADCAST_MAC, ZERO_MAC, decodeArp, encodeArp } from './arp';
import { bpfArp } from '../packet/bpf';
import { ETH_P_ARP, openPacketSocket } from '../packet/packet';
import { PeerResolver, type PeerProtocol, type PeerResolverOptions } from './peer-resolver';

export interface ArpResolverOptions extends PeerResolverOptions {
  /** Our hardware address on the interface: the requests' source, where replies come. */
  readonly mac: string;
  /** Our IPv4 address on the interface (u32): the requests' sender address. */
  readonly srcIp: number;
  /** The neighbours to resolve (u32). */
  readonly targets: readonly number[];
}

function arpProtocol(mac: string, srcIp: number): PeerProtocol<number> {
  return {
    op: 'arp-resolve', speaks: 'ARP',
    open: (ifindex, log) => openPacketSocket({ ifindex, protocol: ETH_P_ARP, filter: bpfArp(), log }),
    request: (ip) => encodeArp({ ethDst: BROADCAST_MAC, ethSrc: mac, op: ARP_OP_REQUEST, senderMac: mac, senderIp: srcIp, targetMac: ZERO_MAC, targetIp: ip }),
    learn: (frame) => {
      const r = decodeArp(frame);
      return r.ok ? { ip: r.packet.senderIp >>> 0, mac: r.packet.senderMac } : undefined;
    },
    text: formatIPv4,
  };
}

export class ArpResolver extends PeerResolver<number> {
  constructor(opts: ArpResolverOptions) {
    super(arpProtocol(opts.mac, opts.srcIp), opts.targets.map((ip) => ip >>> 0), opts);
  }

  /** The target's MAC, when known. */
  macOf(ip: number): Buffer | undefined {
    return this.lookup(ip >>> 0);
  }
}
