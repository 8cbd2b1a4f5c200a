// failover.peers (pure): which adverts a router listens to. RFC 5798 has no
// authentication (§9 leaves it to the network): without peers, any host on
// the LAN that sends a valid advert at a higher priority takes every VIP of
// its VRID (one forged advert at 254 withdrew every VIP in 0.5 s).
// With peers, only the listed addresses are other routers; adverts from any
// other source are dropped and counted (reason "not-a-peer"). This is a
// source-address check, not authentication: a host that can spoof a peer's
// address on the LAN still can (see docs/failover.md, "What VRRP trusts").

/** The drop reason label for adverts from outside failover.peers. */
export const NOT_A_PEER = 'not-a-peer';

/** Whether an advert from src (canonical text, wire.ts) may be heard: any source without peers, else only a listed peer. */
export function acceptsAdvertFrom(src: string, peers: readonly string[]): boolean {
  return peers.length === 0 || peers.includes(src);
}
