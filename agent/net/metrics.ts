// net/ metrics: lbagent_net_* series on the Registry the daemon passes in
// (never the global one). Getting them twice from one registry returns the
// same objects, so every net/ driver can ask for them without coordination.
import { Counter, Gauge, Registry } from '../metrics/prom';

/**
 * Why a received neighbour discovery frame was not used (neighbour/ndp.ts):
 * not IPv6, ICMPv6 or NDP at all, or one of RFC 4861 §7.1.1 and §7.1.2's rules broken.
 */
export type NdpDropReason =
  | 'not-ipv6'
  | 'bad-ip-version'
  | 'not-icmpv6'
  | 'not-ndp'
  | 'bad-hop-limit'
  | 'bad-icmp-checksum'
  | 'bad-icmp-code'
  | 'bad-icmp-length'
  | 'multicast-target'
  | 'bad-option-length'
  | 'bad-link-layer-option'
  | 'dad-with-link-layer-option'
  | 'dad-not-to-solicited-node'
  | 'solicited-to-multicast';

/** Why a received frame was not used: a bounded label set. */
export type FrameDropReason =
  | 'truncated'
  | 'short'
  | 'not-arp'
  | 'bad-hardware-type'
  | 'bad-protocol-type'
  | 'bad-address-length'
  | 'bad-operation'
  | NdpDropReason;

export interface NetMetrics {
  /** Links recognised as the agent's (name and MAC prefix) and kept. */
  readonly linksOwned: Gauge;
  readonly arpProbes: Counter;
  /** label phase: 'probe' (RFC 5227 §2.1.1) | 'defend' (§2.4). */
  readonly arpConflicts: Counter<'phase'>;
  readonly gratuitousArpsSent: Counter;
  /** Announcements of held VIPs (net/vip-owner.ts), label reason: burst | defend | refresh | reannounce. */
  readonly vipAnnouncements: Counter<'reason'>;
  readonly framesDropped: Counter<'reason'>;
  /** Neighbour discovery messages sent for IPv6 VIPs (net/neighbour/ndp-driver.ts), label reason: dad-probe | burst | refresh | defend | reannounce | answer. */
  readonly ndpSent: Counter<'reason'>;
  /** IPv6 address conflicts, label phase: 'dad' (RFC 4862 §5.4) | 'defend'. */
  readonly ndpConflicts: Counter<'phase'>;
}

function getOrCreate<T>(registry: Registry, name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

export function netMetrics(registry: Registry): NetMetrics {
  const registers = [registry];
  return {
    linksOwned: getOrCreate(registry, 'lbagent_net_links_owned', () => new Gauge({
      name: 'lbagent_net_links_owned',
      help: 'Network links (macvlans) owned by the agent',
      registers,
    })),
    arpProbes: getOrCreate(registry, 'lbagent_net_arp_probes_total', () => new Counter({
      name: 'lbagent_net_arp_probes_total',
      help: 'ARP probes sent (RFC 5227 §2.1.1)',
      registers,
    })),
    arpConflicts: getOrCreate(registry, 'lbagent_net_arp_conflicts_total', () => new Counter<'phase'>({
      name: 'lbagent_net_arp_conflicts_total',
      help: 'ARP address conflicts seen, while probing or while holding an address',
      labelNames: ['phase'],
      registers,
    })),
    gratuitousArpsSent: getOrCreate(registry, 'lbagent_net_gratuitous_arps_sent_total', () => new Counter({
      name: 'lbagent_net_gratuitous_arps_sent_total',
      help: 'Gratuitous ARP announcements sent (RFC 5227 §2.3)',
      registers,
    })),
    vipAnnouncements: getOrCreate(registry, 'lbagent_net_vip_announcements_total', () => new Counter<'reason'>({
      name: 'lbagent_net_vip_announcements_total',
      help: 'Gratuitous ARPs for held VIPs, by why they were sent (RFC 5227 §2.3 burst, §2.4 defence, periodic refresh, re-announcement)',
      labelNames: ['reason'],
      registers,
    })),
    framesDropped: getOrCreate(registry, 'lbagent_net_frames_dropped_total', () => new Counter<'reason'>({
      name: 'lbagent_net_frames_dropped_total',
      help: 'Received frames dropped by net/, by reason',
      labelNames: ['reason'],
      registers,
    })),
    ndpSent: getOrCreate(registry, 'lbagent_net_ndp_sent_total', () => new Counter<'reason'>({
      name: 'lbagent_net_ndp_sent_total',
      help: 'Neighbour discovery messages sent for IPv6 VIPs, by why (RFC 4862 DAD probe, RFC 4861 §7.2.6 burst, refresh, defence, re-announcement, answer)',
      labelNames: ['reason'],
      registers,
    })),
    ndpConflicts: getOrCreate(registry, 'lbagent_net_ndp_conflicts_total', () => new Counter<'phase'>({
      name: 'lbagent_net_ndp_conflicts_total',
      help: 'IPv6 address conflicts seen, during duplicate address detection or while holding an address',
      labelNames: ['phase'],
      registers,
    })),
  };
}

/** For whoever owns links: publish how many the agent holds now. */
export function setLinksOwned(metrics: NetMetrics | undefined, count: number): void {
  metrics?.linksOwned.set(count);
}
