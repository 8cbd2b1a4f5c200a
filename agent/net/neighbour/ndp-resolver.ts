// Neighbour discovery as the IPv6 peer resolver's protocol
// (peer-resolver.ts): a solicitation to each target's solicited-node group
// (RFC 4861 §7.2.2), and learning from a target's advertisements: the
// solicited answer, unicast to the link-local address it was asked from,
// and an unsolicited one to all-nodes (a peer that moved).
//
// It hears on the NDP socket the VIP owners use (ndp-socket.ts): a raw
// ICMPv6 socket bound to the interface, passing advertisements (type 136)
// only, which the kernel consults for ICMPv6 it delivers locally; a packet
// socket of ETH_P_IPV6 ran its filter on every IPv6 frame of the parent. The
// targets' solicited-node groups are not joined: the answer comes unicast.
// Each advertisement is judged by ndp.ts as any other (hop limit 255 and the
// rest of RFC 4861 §7.1.2), and one without a target link-layer option
// teaches nothing: a raw socket gives no Ethernet source to stand for it
// (§7.2.4 puts the option in every answer to a multicast solicitation).
import { formatAddress } from '../../address';
import { decodeNdp, encodeNdp, ICMPV6_NEIGHBOUR_ADVERTISEMENT, ndpSolicitation } from './ndp';
import { ipv6Value } from './ndp-driver';
import { openNdpSocket } from './ndp-socket';
import { PeerResolver, type PeerProtocol, type PeerResolverOptions } from './peer-resolver';

export interface NdpResolverOptions extends PeerResolverOptions {
  /** Our hardware address on the interface: the solicitations' source and link-layer option. */
  readonly mac: string;
  /** Our IPv6 address on the interface (the link-local one): the solicitations' source. */
  readonly src: string;
  /** The neighbours to resolve, IPv6 text. */
  readonly targets: readonly string[];
}

function ndpProtocol(mac: string, src: string, texts: ReadonlyMap<bigint, string>): PeerProtocol<bigint> {
  return {
    op: 'ndp-resolve', speaks: 'neighbour solicitations',
    open: (ifindex, log) => openNdpSocket({ ifindex, log, types: [ICMPV6_NEIGHBOUR_ADVERTISEMENT] }),
    request: (ip) => encodeNdp(ndpSolicitation(mac, ipv6Value(src), ip)),
    learn: (frame) => {
      const r = decodeNdp(frame);
      if (!r.ok || r.packet.kind !== 'advertisement' || r.packet.targetMac === undefined) return undefined;
      return { ip: r.packet.target, mac: r.packet.targetMac };
    },
    text: (ip) => texts.get(ip) ?? formatAddress({ family: 'IPv6', value: ip }),
  };
}

export class NdpResolver extends PeerResolver<bigint> {
  constructor(opts: NdpResolverOptions) {
    const texts = new Map(opts.targets.map((t) => [ipv6Value(t), t]));
    super(ndpProtocol(opts.mac, opts.src, texts), [...texts.keys()], opts);
  }

  /** The target's MAC, when known (any IPv6 text of it). */
  macOf(ip: string): Buffer | undefined {
    try { return this.lookup(ipv6Value(ip)); } catch { return undefined; }
  }
}
