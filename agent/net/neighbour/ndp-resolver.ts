// Neighbour discovery as the IPv6 peer resolver's protocol
// (peer-resolver.ts): a solicitation to each target's solicited-node group
// (RFC 4861 §7.2.2), and learning from what a target sends (its
// advertisements, and the source link-layer option of its solicitations).
// The targets' solicited-node groups are not joined: the answer to our
// solicitation comes unicast to our MAC.
import { formatAddress } from '../../address';
import { bpfNdp } from '../packet/bpf';
import { ETHERTYPE_IPV6 } from '../packet/inet';
import { decodeNdp, encodeNdp, ndpSolicitation } from './ndp';
import { ipv6Value } from './ndp-driver';
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
    op: 'ndp-resolve', speaks: 'neighbour solicitations', ethertype: ETHERTYPE_IPV6, filter: bpfNdp(),
    request: (ip) => encodeNdp(ndpSolicitation(mac, ipv6Value(src), ip)),
    learn: (frame) => {
      const r = decodeNdp(frame);
      if (!r.ok) return undefined;
      const p = r.packet;
      // RFC 4861 §7.2.5: an advertisement names its target and (usually) its MAC;
      // §7.2.3: a solicitation from the target carries its MAC in the source option.
      const [ip, mac] = p.kind === 'advertisement' ? [p.target, p.targetMac ?? p.ethSrc] : [p.src, p.sourceMac];
      return mac === undefined ? undefined : { ip, mac };
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
