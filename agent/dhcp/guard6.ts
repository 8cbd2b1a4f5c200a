// DHCPv6 addresses checked before they are used (pure): may this VM put an
// address a server offered in IA_NA on a service macvlan and announce it?
// The IPv6 twin of guard.ts: every refusal has a reason that is also the
// metric label of the drop. No I/O: the host's addresses and the parent's
// prefixes come in as a Host6View.
//
// A rogue server offering the VM's own address would have the agent answer
// neighbour solicitations for it from the macvlan: DAD cannot catch that,
// since the parent never hears its own macvlan's probes.
import { networkContains, type Network } from '../address';

export const GUARD6_REASONS = [
  'server-not-allowed',  // SERVERID not among dhcp.servers6
  'addr-unspecified',    // :: (RFC 4291 §2.5.2)
  'addr-loopback',       // ::1 (RFC 4291 §2.5.3)
  'addr-multicast',      // ff00::/8 (RFC 4291 §2.7)
  'addr-link-local',     // fe80::/10 (RFC 4291 §2.5.6): never a VIP, every link has its own
  'addr-ipv4-mapped',    // ::ffff:0:0/96 (RFC 4291 §2.5.5.2): not an address on the wire
  'addr-local',          // an address already on this VM (any interface)
  'addr-off-prefix',     // outside the parent's on-link prefixes (dhcp.allowOtherSubnets: false)
] as const;
export type Guard6Reason = (typeof GUARD6_REASONS)[number];

export interface Guard6Policy {
  /** Accept an address outside the parent's prefixes (servers behind a relay). */
  readonly allowOtherSubnets: boolean;
  /** Server DUIDs accepted; empty: any server. */
  readonly servers: readonly Buffer[];
}

export interface Host6View {
  /** The parent NIC's global and unique-local prefixes (its addresses with prefix < 128). */
  readonly prefixes: readonly Network[];
  /** Every IPv6 address on the VM, all interfaces, except the service's own macvlan (its lease is renewed). */
  readonly local: readonly bigint[];
}

const inPrefix = (ip: bigint, net: bigint, prefix: number): boolean =>
  networkContains({ family: 'IPv6', network: net, prefix }, { family: 'IPv6', value: ip });

/** 'ok', or why an offered address must be dropped before the state machine sees it. */
export function judgeAddress6(address: bigint, serverId: Buffer | undefined, host: Host6View, policy: Guard6Policy): 'ok' | Guard6Reason {
  if (policy.servers.length > 0 && (serverId === undefined || !policy.servers.some((s) => s.equals(serverId)))) return 'server-not-allowed';
  if (address === 0n) return 'addr-unspecified';
  if (address === 1n) return 'addr-loopback';
  if (inPrefix(address, 0xffn << 120n, 8)) return 'addr-multicast';
  if (inPrefix(address, 0xfe80n << 112n, 10)) return 'addr-link-local';
  if (inPrefix(address, 0xffffn << 32n, 96)) return 'addr-ipv4-mapped';
  if (host.local.includes(address)) return 'addr-local';
  if (!policy.allowOtherSubnets && !host.prefixes.some((p) => p.family === 'IPv6' && inPrefix(address, p.network, p.prefix))) return 'addr-off-prefix';
  return 'ok';
}
