// DHCP answers checked before they are used (pure): does this OFFER/ACK/NAK
// come from a server we accept, and is its yiaddr an address this VM may
// put on a service macvlan and announce? Every refusal has a reason that is
// also the metric label of the drop. No I/O: the host's addresses come in as
// a HostView (net/local-addresses.ts gathers them).
//
// A rogue server handed the agent the VM's own address; the agent
// bound it on the macvlan and its gratuitous ARPs poisoned the LAN's
// neighbour tables for the VM's IP. The ARP probe of the offer cannot catch
// that: the parent never hears probes from its own macvlan.
import { broadcastOf, cidrContains, maskOf, type Cidr } from '../address';

export const GUARD_REASONS = [
  'server-not-allowed',     // server identifier not in dhcp.servers
  'yiaddr-zero',            // 0.0.0.0/8: "this network" (RFC 1122 §3.2.1.3)
  'yiaddr-loopback',        // 127.0.0.0/8
  'yiaddr-multicast',       // 224.0.0.0/4
  'yiaddr-broadcast',       // 255.255.255.255, the limited broadcast
  'yiaddr-network',         // the subnet's network address
  'yiaddr-subnet-broadcast', // the subnet's broadcast address
  'yiaddr-local',           // an address already on this VM (any interface)
  'yiaddr-server',          // the DHCP server's own address
  'yiaddr-router',          // a router the reply itself names
  'yiaddr-off-subnet',      // outside the parent's subnets (dhcp.allowOtherSubnets: false)
] as const;
export type GuardReason = (typeof GUARD_REASONS)[number];

export interface GuardPolicy {
  /** Accept a yiaddr outside the parent's subnets (DHCP relays serving another subnet). */
  readonly allowOtherSubnets: boolean;
  /** Server identifiers accepted; empty: any server. */
  readonly servers: readonly number[];
}

export interface HostView {
  /** The parent NIC's subnets (its addresses with prefix < 32). */
  readonly subnets: readonly Cidr[];
  /** Every IPv4 address on the VM, all interfaces, except the service's own macvlan (its lease is renewed). */
  readonly local: readonly number[];
}

export interface ReplyFacts {
  readonly kind: 'OFFER' | 'ACK' | 'NAK';
  readonly yiaddr: number;
  /** Option 54, else undefined. */
  readonly serverId: number | undefined;
  /** The IP source address of the frame. */
  readonly srcIp: number;
  /** Option 3. */
  readonly routers: readonly number[];
  /** Option 1 as a prefix length. */
  readonly prefix: number | undefined;
}

const inNet = (ip: number, net: number, prefix: number): boolean => cidrContains({ network: net, prefix }, ip);

/** 'ok', or why the reply must be dropped before the state machine sees it. */
export function judgeReply(r: ReplyFacts, host: HostView, policy: GuardPolicy): 'ok' | GuardReason {
  // RFC 2131 §4.3.1: the server identifier is the address the server is known by; a NAK carries one too.
  if (policy.servers.length > 0 && (r.serverId === undefined || !policy.servers.includes(r.serverId))) return 'server-not-allowed';
  if (r.kind === 'NAK') return 'ok';
  return judgeAddress(r.yiaddr, host, policy, { servers: [r.serverId, r.srcIp], routers: r.routers, prefix: r.prefix });
}

/**
 * Whether this VM may put `ip` on a service macvlan and announce it, whoever
 * named it (a server's yiaddr; on a VRRP takeover, the previous Master's
 * advert). `named`: what a server's reply says of itself - its addresses,
 * the routers, and the prefix (for an address outside the parent's subnets).
 */
export function judgeAddress(
  yiaddr: number, host: HostView, policy: GuardPolicy,
  named: { readonly servers?: readonly (number | undefined)[]; readonly routers?: readonly number[]; readonly prefix?: number | undefined } = {},
): 'ok' | GuardReason {
  const ip = yiaddr >>> 0;
  if (inNet(ip, 0x00000000, 8)) return 'yiaddr-zero';
  if (inNet(ip, 0x7f000000, 8)) return 'yiaddr-loopback';
  if (inNet(ip, 0xe0000000, 4)) return 'yiaddr-multicast';
  if (ip === 0xffffffff) return 'yiaddr-broadcast';
  if (host.local.includes(ip)) return 'yiaddr-local';
  if (named.servers?.includes(ip)) return 'yiaddr-server';
  if (named.routers?.includes(ip)) return 'yiaddr-router';
  // Network and broadcast of the parent's subnet that holds it, else (another
  // subnet, allowed) of the subnet the reply names. /31 and /32 have neither (RFC 3021).
  const nets: Cidr[] = host.subnets.filter((c) => cidrContains(c, ip));
  if (nets.length === 0) {
    if (!policy.allowOtherSubnets) return 'yiaddr-off-subnet';
    if (named.prefix !== undefined) nets.push({ network: (ip & maskOf(named.prefix)) >>> 0, prefix: named.prefix });
  }
  for (const c of nets) {
    if (c.prefix > 30) continue;
    if (ip === c.network) return 'yiaddr-network';
    if (ip === broadcastOf(c)) return 'yiaddr-subnet-broadcast';
  }
  return 'ok';
}
