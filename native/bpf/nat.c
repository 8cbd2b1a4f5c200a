// SPDX-License-Identifier: GPL-2.0
/* The full-NAT engine of the kernel path's `sourceIP: snat` ports, at tc
 * (tcx) ingress of the parent NIC. Built with clang for the BPF target
 * (binding.gyp, beside the addon); loaded by the addon through libbpf
 * (native/src/bpf_object.cc); planned and attached by
 * agent/net/ebpf/nat-attach.ts. Map layouts: nat.h.
 *
 * Client C, VIP V on this node, backend B (the same L2), TCP and UDP (IPv4
 * here; IPv6, over maps of its own, in the second half of this file):
 *   C:cport -> V:port   the port's Maglev slot table (agent/forward/maglev.ts,
 *                       nft's seeded jhash of C . cport, as nft-dsr.ts and
 *                       ebpf-dsr.ts compute it) picks B; the flow is recorded
 *                       both ways and leaves as V:nport -> B:targetPort, where
 *                       nport is C's own port unless another flow holds it
 *                       towards B, else one of the reserved range; the frame
 *                       is redirected out of the NIC with B's MAC.
 *   B:targetPort -> V:nport   found in the replies map, leaves as
 *                       V:port -> C:cport.
 * This is what the nft table does with conntrack (nft.ts: DNAT to B, SNAT
 * to the VIP keeping the client's port), without conntrack: no entry in the
 * VM's table, no netfilter hook on the way. A flow's packet with no entry
 * (a TCP segment in the middle of a connection: an agent that lost its
 * maps, a VRRP Master that took the VIP over) is placed and translated the
 * same way, as conntrack's loose pickup is on the nft path, so the backend
 * sees the same connection go on.
 *
 * What is not ours goes on unchanged (TCX_NEXT) to the nft table and the
 * stack: another address, port or protocol, IP options, fragments, a
 * destination the FIB cannot reach directly, a packet larger than the way
 * out allows (the stack sends the ICMP fragmentation-needed), and a port
 * with no healthy backend (the nft table refuses it).
 *
 * An ICMP error (destination unreachable, time exceeded) about a packet
 * the engine sent is translated towards the flow's other end, as
 * conntrack's nf_nat_icmp_reply_translation does on the nft path: a
 * router's fragmentation-needed for V:nport -> B reaches C as one for
 * C:cport -> V:port, and one for V:port -> C reaches B as one for
 * B:targetPort -> V:nport, each from the VIP; so path MTU discovery
 * (RFC 1191) works through the VIP both ways. The quoted packet's
 * addresses, ports and IP checksum are rewritten; its L4 checksum is left
 * as quoted (a receiver matches an error by addresses and ports, RFC 1122
 * 4.2.3.9, and a router may quote only 8 bytes of it).
 *
 * Checksums are fixed incrementally: the L4 one through bpf_l4_csum_replace
 * (the pseudo-header flag for the addresses; it knows the skb's checksum
 * state), the IP header's in the program (RFC 1624); the TTL drops by one,
 * as through any router, and a packet whose TTL would reach zero goes to the
 * stack, which answers it.
 *
 * The way out (device, MACs, the segment length the route's MTU was checked
 * for) is bpf_fib_lookup's, cached in each direction's flow entry: a flow's
 * later packets are rewritten and sent with bpf_redirect and no lookup
 * while the cache is younger than LBN_FIB_REFRESH_NS and the packet no
 * longer than it was checked for; a next hop the FIB has no neighbour for
 * is sent with bpf_redirect_neigh and not cached. So an established
 * packet takes no FIB lookup and, besides the lookups of its flow (a
 * reply: its entry and the flow's) and no helper for the addresses'
 * checksum change (summed in the program), one or two
 * bpf_l4_csum_replace (two when a port changes).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "nat.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
/* TC_ACT_UNSPEC: no verdict; later tcx programs, nft and the stack decide. */
#define TCX_NEXT -1
#define JHASH_INITVAL 0xdeadbeef

/* Per plan: replaced with every program (the driver fills them before it attaches). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lbn_svc_key);
	__type(value, struct lbn_svc);
	__uint(max_entries, 1);
} lbn_svcs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lbn_slot);
	__uint(max_entries, 1);
} lbn_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lbn_member_key);
	__type(value, struct lbn_member);
	__uint(max_entries, 1);
} lbn_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lbn_counter);
	__uint(max_entries, 1);
} lbn_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lbn_config);
	__uint(max_entries, 1);
} lbn_config SEC(".maps");

/* Pinned: outlive every program and every agent process. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, LBN_EV_COUNT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lbn_events SEC(".maps");

/* The flows, one map per direction: lbn_flows by the client's packets,
 * lbn_replies by the backend's. One type for both (libbpf reads each
 * variable's type for its definition). */
struct lbn_flow_map {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lbn_flow_key);
	__type(value, struct lbn_flow);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
};
struct lbn_flow_map lbn_flows SEC(".maps");
struct lbn_flow_map lbn_replies SEC(".maps");

static __always_inline void event(__u32 ev)
{
	__u64 *v = bpf_map_lookup_elem(&lbn_events, &ev);
	if (v)
		*v += 1;
}

/* The time flows are stamped and their ways out cached with: the coarse
 * monotonic clock (the timekeeper's last tick, no clocksource read: a
 * paravirtual or TSC read is a tenth of an established packet's cost),
 * which is fine enough for idle timeouts of seconds and a FIB refresh of
 * one. */
static __always_inline __u64 clock_ns(void)
{
	return bpf_ktime_get_coarse_ns();
}

#define COPY6(d, s) do { (d)[0] = (s)[0]; (d)[1] = (s)[1]; (d)[2] = (s)[2]; (d)[3] = (s)[3]; } while (0)

static __always_inline int eq6(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline __u32 rol32(__u32 x, int k)
{
	return (x << k) | (x >> (32 - k));
}

/* nft_jhash_eval over `ip saddr . th sport` (8 bytes: address, port, two
 * zero bytes; jhash reads them little-endian, as this load does on x86 and
 * arm64), then reciprocal_scale into `mod` slots. */
static __always_inline __u32 nft_jhash_slot(__u32 saddr, __u16 sport, __u32 seed, __u32 mod)
{
	__u32 init = JHASH_INITVAL + 8 + seed;
	__u32 a = init + saddr, b = init + (__u32)sport, c = init;

	c ^= b; c -= rol32(b, 14);
	a ^= c; a -= rol32(c, 11);
	b ^= a; b -= rol32(a, 25);
	c ^= b; c -= rol32(b, 16);
	a ^= c; a -= rol32(c, 4);
	b ^= a; b -= rol32(a, 14);
	c ^= b; c -= rol32(b, 24);
	return (__u32)(((__u64)c * mod) >> 32);
}

struct ip6h;

/* What a family's parser read of a packet, handed to the helpers both
 * families share (and to nat6's subprograms, each verified with what it can
 * prove from this: the TCP header's length is read here, once, not again
 * through `ports`, whose proven range is the UDP header's). */
struct parsed {
	union {
		struct iphdr *ip;	/* IPv4 */
		struct ip6h *ip6;	/* IPv6 */
	};
	__u16 *ports; /* source, destination */
	__u32 csum_off;
	__u8 proto;
	__u8 tcp_flags;
	__u8 tcp_hlen;
};

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* The TCP or UDP header at `l4`, `l4_off` bytes into the frame, of
 * either family: -1 for another protocol or a header past the packet. */
static __always_inline int parse_l4(struct parsed *p, void *l4, void *end, __u8 proto, __u32 l4_off)
{
	p->proto = proto;
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;
		if ((void *)(th + 1) > end)
			return -1;
		p->ports = (__u16 *)th;
		p->csum_off = l4_off + offsetof(struct tcphdr, check);
		p->tcp_flags = ((__u8 *)th)[13];
		p->tcp_hlen = (((__u8 *)th)[12] >> 4) * 4;
		return 0;
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return -1;
		p->ports = (__u16 *)uh;
		p->csum_off = l4_off + offsetof(struct udphdr, check);
		p->tcp_flags = 0;
		return 0;
	}
	return -1;
}

static __always_inline int parse(struct __sk_buff *skb, struct parsed *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	/* Options and fragments are the stack's (and nft's) to handle. */
	if (ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)) != 0)
		return -1;
	p->ip = ip;
	return parse_l4(p, ip + 1, end, ip->protocol, sizeof(*eth) + sizeof(*ip));
}

static __always_inline __u64 idle_ns(const struct lbn_config *cfg, __u8 proto, __u32 closing)
{
	if (proto == IPPROTO_UDP)
		return cfg->udp_idle_ns;
	return closing ? cfg->tcp_closing_ns : cfg->tcp_idle_ns;
}

/* Whether a flow (either family's) last seen at `seen_ns` has been idle too
 * long (signed: another CPU may have stamped it after this one read the
 * clock). */
static __always_inline int expired(const struct lbn_config *cfg, __u8 proto, __u32 closing, __u64 seen_ns, __u64 now)
{
	return (__s64)(now - seen_ns) > (__s64)idle_ns(cfg, proto, closing);
}

/* A packet of a held flow (either family's): stamped, and closing from its
 * first FIN or RST on. Both only when they change: a flow's client side
 * and its backend side are handled on different CPUs, and an entry that
 * both write on every packet bounces its cache line between them (every
 * lookup of it then misses). The stamp moves on once the clock has gone
 * LBN_SEEN_GRAIN_NS past it, so an idle timeout runs out at most that
 * much early. */
#define LBN_SEEN_GRAIN_NS (1ULL << 24)
static __always_inline void flow_seen(__u32 *closing, __u64 *seen_ns, const struct parsed *p, __u64 now)
{
	if ((p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) && !*closing)
		*closing = 1;
	if ((__s64)(now - *seen_ns) >= (__s64)LBN_SEEN_GRAIN_NS)
		*seen_ns = now;
}

/* Whether a held flow still stands for its tuple (either family's; `m` its
 * backend's member entry): not when it idled out, its backend left the
 * port (TCP), or its healthy set (UDP, as the nft path ends such flows'
 * conntrack entries), or the tuple opens a new connection. Counted. */
static __always_inline int flow_stands(const struct lbn_config *cfg, const struct lbn_svc *svc, const struct lbn_member *m,
				       __u16 port, __u32 closing, __u64 seen_ns, const struct parsed *p, int syn, __u64 now)
{
	if (expired(cfg, p->proto, closing, seen_ns, now)) {
		event(LBN_EV_EXPIRED);
		return 0;
	}
	if (!m || port != svc->target_port || (p->proto == IPPROTO_UDP && !m->healthy) || (syn && closing)) {
		event(LBN_EV_REPLACED);
		return 0;
	}
	return 1;
}

/* The route to `dst` out of this node (no FIB: the packet is not ours to send). */
static __always_inline int route(struct __sk_buff *skb, struct bpf_fib_lookup *fib, __u32 src, __u32 dst, __u8 proto, __u16 tot_len)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->l4_protocol = proto;
	fib->tot_len = tot_len;
	fib->ipv4_src = src;
	fib->ipv4_dst = dst;
	fib->ifindex = skb->ingress_ifindex;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/* One's complement sum of a 32-bit word's two halves, as they lie in memory. */
static __always_inline __u32 csum_word(__u32 w)
{
	return (w >> 16) + (w & 0xffff);
}

/* The source and destination ports as the one 32-bit word they are in the header. */
static __always_inline __u32 ports_word(__u16 sport, __u16 dport)
{
	__u16 w[2] = { sport, dport };
	return *(__u32 *)w;
}

/* The L4 checksum of a translated packet (either family): `diff`, the
 * pseudo-header's change (the one's complement sum of the old addresses,
 * complemented, and the new), then the ports word `oports` -> `nports`.
 * Through the helpers, two calls at most: they know the skb's checksum
 * state (a CHECKSUM_PARTIAL packet from a local socket takes the
 * pseudo-header change only). */
static __always_inline int l4_csum(struct __sk_buff *skb, const struct parsed *p, __u32 diff, __u32 oports, __u32 nports)
{
	__u64 l4flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (bpf_l4_csum_replace(skb, p->csum_off, 0, diff, l4flags | BPF_F_PSEUDO_HDR))
		return -1;
	if (oports != nports && bpf_l4_csum_replace(skb, p->csum_off, oports, nports, l4flags | 4))
		return -1;
	return 0;
}

/* Rewrite addresses, ports, TTL and checksums and, with `dmac` and `smac`, the frame's
 * MACs: (src:sport -> dst:dport) becomes (nsrc:nsport -> ndst:ndport). The L4
 * checksum through l4_csum; the IP header's own checksum, which no offload
 * computes, and every stored field are written straight into the packet. */
static __always_inline int rewrite(struct __sk_buff *skb, struct parsed *p, __u32 nsrc, __u32 ndst, __u16 nsport, __u16 ndport,
				   const __u8 *dmac, const __u8 *smac)
{
	__u32 oaddr[2] = { p->ip->saddr, p->ip->daddr };
	__u32 naddr[2] = { nsrc, ndst };
	__u32 oports = *(__u32 *)p->ports;
	__u32 nports = ports_word(nsport, ndport);
	/* The TTL shares a 16-bit checksum word with the protocol. */
	__u16 ottl = *(__u16 *)&p->ip->ttl;
	__u16 nttl = ottl - bpf_htons(0x0100);
	__u16 ocheck = p->ip->check;
	/* The addresses' change, as bpf_csum_diff would sum it (~old + new),
	 * without the helper call: the pseudo-header's for the L4 checksum and
	 * a part of the IP header's. */
	__u32 addr_diff = csum_word(~oaddr[0]) + csum_word(~oaddr[1]) + csum_word(naddr[0]) + csum_word(naddr[1]);

	/* A UDP checksum of zero: none (RFC 768), left so. */
	if (!(p->proto == IPPROTO_UDP && p->ports[3] == 0) && l4_csum(skb, p, addr_diff, oports, nports))
		return -1;
	/* RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'). */
	__u32 sum = (__u16)~ocheck;
	sum += addr_diff + (__u16)~ottl + nttl;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);

	/* The helpers above may have moved the packet: its pointers again. */
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	__u32 *ports = (void *)(ip + 1);
	if ((void *)(ports + 1) > end)
		return -1;
	ip->saddr = nsrc;
	ip->daddr = ndst;
	*(__u16 *)&ip->ttl = nttl;
	ip->check = (__u16)~sum;
	*ports = nports;
	if (dmac) {
		__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, smac, ETH_ALEN);
	}
	return 0;
}

/* Send the rewritten frame out towards the FIB's next hop (either family:
 * with no neighbour entry yet, bpf_redirect_neigh resolves it by ARP or
 * NDP). */
static __always_inline int send(struct __sk_buff *skb, struct bpf_fib_lookup *fib, int rc)
{
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = fib->family };
		if (fib->family == AF_INET6)
			COPY6(nh.ipv6_nh, fib->ipv6_dst);
		else
			nh.ipv4_nh = fib->ipv4_dst;
		return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
	}
	if (bpf_skb_store_bytes(skb, 0, fib->dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, fib->smac, ETH_ALEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(fib->ifindex, 0);
}

static __always_inline void count(__u32 idx, int to_backend, __u32 len, int flow)
{
	struct lbn_counter *c = bpf_map_lookup_elem(&lbn_counters, &idx);
	if (!c)
		return;
	if (to_backend) {
		c->packets_to_backend += 1;
		c->bytes_to_backend += len;
	} else {
		c->packets_to_client += 1;
		c->bytes_to_client += len;
	}
	if (flow)
		c->flows += 1;
}

static __always_inline int fib_usable(int rc)
{
	return rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH;
}

/* Claim a new flow's entry `rk` in `replies` (either family's map; `dport`,
 * the key's port, is the client's): that port when `free` (no entry, or
 * this flow's with another counter: a new plan), else one of the reserved
 * range. 0 when none is free. An added key is counted as `ev`. */
static __always_inline __u16 claim_in(void *replies, void *rk, __u16 *dport, const void *back, int free, int added, const struct lbn_config *cfg, __u32 hash, __u32 ev)
{
	if (free && bpf_map_update_elem(replies, rk, back, BPF_ANY) == 0) {
		if (added)
			event(ev);
		return *dport;
	}
	if (cfg->port_count == 0)
		return 0;
	for (int i = 0; i < LBN_PORT_TRIES; i++) {
		*dport = bpf_htons(cfg->port_min + (__u16)((hash + i * 2654435761u) % cfg->port_count));
		if (bpf_map_update_elem(replies, rk, back, BPF_NOEXIST) == 0) {
			event(ev);
			return *dport;
		}
	}
	return 0;
}

/* Claim the replies entry of a new flow: the client's own port when free
 * towards the backend, else one of the reserved range. 0 when none is free. */
static __always_inline __u16 claim_port(struct lbn_flow_key *rk, const struct lbn_flow *back, const struct lbn_config *cfg, __u32 hash)
{
	struct lbn_flow *held = bpf_map_lookup_elem(&lbn_replies, rk);
	/* A client port that is also a service port of the VIP would send the
	 * backend's replies into that service as a client's packets: such a
	 * flow takes a port of the reserved range (and is not picked up
	 * mid-way by another node). */
	struct lbn_svc_key as_svc = { .vip = rk->daddr, .port = rk->dport, .proto = rk->proto };
	int taken = bpf_map_lookup_elem(&lbn_svcs, &as_svc) != 0;
	int same = held && held->addr == back->addr && held->port == back->port && held->nat_port == back->nat_port;

	/* Already this flow's (a flow placed again, a client's port reused
	 * towards the same backend): kept as it is, with its cached way out. */
	if (!taken && same && held->counter == back->counter)
		return rk->dport;
	return claim_in(&lbn_replies, rk, &rk->dport, back, !taken && (!held || same), !held, cfg, hash, LBN_EV_REPLY_INSERT);
}

/* The length the way out's MTU is checked against (`ip_hlen`: the
 * family's IP header): a GRO or TSO aggregate (a veth or a NIC with GRO
 * hands these over whole) leaves as segments of gso_size, so the check is
 * for one segment, as the stack's forwarding does (ip_forward's and
 * ip6_forward's skb_gso_validate_network_len). */
static __always_inline __u32 segment_len(struct __sk_buff *skb, const struct parsed *p, __u32 ip_hlen, __u32 len)
{
	if (!skb->gso_size)
		return len;
	return ip_hlen + (p->proto == IPPROTO_TCP ? p->tcp_hlen : sizeof(struct udphdr)) + skb->gso_size;
}

/* Keep the FIB's way out in a flow's entry (a map value, or the new entry
 * before it is stored): the set time last, so a reader on another CPU that
 * sees it sees the fields it covers. */
static __always_inline void cache_way(struct lbn_way *w, const struct bpf_fib_lookup *fib, __u32 seg, __u64 now)
{
	w->ifindex = fib->ifindex;
	w->fib_len = seg > 0xffff ? 0xffff : seg;
	__builtin_memcpy(w->dmac, fib->dmac, ETH_ALEN);
	__builtin_memcpy(w->smac, fib->smac, ETH_ALEN);
	asm volatile("" ::: "memory");
	w->fib_ns = now;
}

/* Whether a packet of `seg` bytes may leave by the cached way `w`, with no lookup. */
static __always_inline int way_fresh(const struct lbn_way *w, __u32 seg, __u64 now)
{
	return w->fib_ns != 0 && now - w->fib_ns < LBN_FIB_REFRESH_NS && seg <= w->fib_len;
}

/* Send a packet of flow `f` on, from the VIP: (C or B) -> VIP becomes
 * VIP:nsport -> f->addr:ndport, out of the way cached in `f` while it is
 * fresh and the packet no longer than what it was checked for, else out of
 * a new FIB lookup (which the flow then caches). */
static __always_inline int forward(struct __sk_buff *skb, struct parsed *p, struct lbn_flow *f, __u16 nsport, __u16 ndport, int to_backend, int placed, __u64 now)
{
	struct iphdr *ip = p->ip;
	__u32 vip = ip->daddr;
	__u32 ndst = f->addr;
	__u32 counter = f->counter;
	__u32 len = bpf_ntohs(ip->tot_len);
	__u32 seg = segment_len(skb, p, sizeof(struct iphdr), len);

	if (ip->ttl <= 1)
		return TCX_NEXT;
	if (way_fresh(&f->way, seg, now)) {
		__u32 ifindex = f->way.ifindex;
		if (rewrite(skb, p, vip, ndst, nsport, ndport, f->way.dmac, f->way.smac))
			return TC_ACT_SHOT;
		count(counter, to_backend, len, placed);
		return bpf_redirect(ifindex, 0);
	}
	struct bpf_fib_lookup fib;
	/* With the packet's (a segment's) length: one larger than the way out allows is the
	 * stack's, which answers with ICMP fragmentation-needed. */
	int rc = route(skb, &fib, vip, ndst, p->proto, seg);
	if (!fib_usable(rc)) {
		event(LBN_EV_NO_ROUTE);
		return TCX_NEXT;
	}
	if (rc == BPF_FIB_LKUP_RET_SUCCESS)
		cache_way(&f->way, &fib, seg, now);
	else
		f->way.fib_ns = 0;
	if (rewrite(skb, p, vip, ndst, nsport, ndport, 0, 0))
		return TC_ACT_SHOT;
	count(counter, to_backend, len, placed);
	return send(skb, &fib, rc);
}

static __always_inline int from_client(struct __sk_buff *skb, struct parsed *p, struct lbn_svc_key *sk, struct lbn_svc *svc, const struct lbn_config *cfg)
{
	struct iphdr *ip = p->ip;
	__u64 now = clock_ns();
	struct lbn_flow_key fk = { .saddr = ip->saddr, .daddr = ip->daddr, .sport = p->ports[0], .dport = p->ports[1], .proto = p->proto };
	struct lbn_flow *f = bpf_map_lookup_elem(&lbn_flows, &fk);
	/* The tuple's entry, expired or to be placed again: rewritten in place. */
	struct lbn_flow *old = f;
	struct lbn_flow flow;
	int placed = 0;
	int syn = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;

	if (f) {
		struct lbn_member_key mk = { .svc = *sk, .backend = f->addr };
		if (!flow_stands(cfg, svc, bpf_map_lookup_elem(&lbn_members, &mk), f->port, f->closing, f->seen_ns, p, syn, now))
			f = 0;
	}
	if (!f) {
		if (svc->slots == 0)
			return TCX_NEXT;
		__u32 slot = nft_jhash_slot(fk.saddr, fk.sport, svc->seed, svc->slots);
		__u32 key = svc->base + slot;
		struct lbn_slot *sp = bpf_map_lookup_elem(&lbn_slots, &key);
		if (!sp)
			return TCX_NEXT;
		/* The agent rewrites a slot in place when a backend's health
		 * changes (nat-plan.ts). The slot is read once, as one aligned
		 * 64-bit load, so the backend and counter used below are one
		 * write's; and its backend must be a member of the port, so a
		 * slot read while the kernel copied it (the copy is not
		 * guaranteed whole) is passed on to the nft path, never sent to
		 * an address no one configured. */
		_Static_assert(sizeof(struct lbn_slot) == sizeof(__u64), "an IPv4 slot is one 64-bit word");
		union {
			__u64 word;
			struct lbn_slot slot;
		} u = { .word = *(const volatile __u64 *)sp };
		const struct lbn_slot *s = &u.slot;
		if (s->backend == 0)
			return TCX_NEXT;
		struct lbn_member_key smk = { .svc = *sk, .backend = s->backend };
		if (!bpf_map_lookup_elem(&lbn_members, &smk))
			return TCX_NEXT;
		if (ip->ttl <= 1)
			return TCX_NEXT;
		/* Only while the VIP is this node's (the nft path's `fib daddr
		 * type local`): a VRRP Backup routes a client's packet that still
		 * reaches it on to the Master untranslated, as the stack does. */
		struct bpf_fib_lookup fib;
		if (route(skb, &fib, ip->saddr, ip->daddr, p->proto, 0) != BPF_FIB_LKUP_RET_NOT_FWDED)
			return TCX_NEXT;
		/* The way to the backend, once: checked before anything is
		 * recorded, and cached in the new entry for this packet and the
		 * flow's next ones; the tuple's old entry's, where it names the
		 * same backend and is fresh. */
		__u32 len = bpf_ntohs(ip->tot_len);
		__u32 seg = segment_len(skb, p, sizeof(struct iphdr), len);
		int rc = BPF_FIB_LKUP_RET_SUCCESS;
		int cached = old && old->addr == s->backend && way_fresh(&old->way, seg, now);
		if (!cached) {
			rc = route(skb, &fib, ip->daddr, s->backend, p->proto, seg);
			if (!fib_usable(rc)) {
				event(LBN_EV_NO_ROUTE);
				return TCX_NEXT;
			}
		}
		struct lbn_flow_key rk = { .saddr = s->backend, .daddr = ip->daddr, .sport = svc->target_port, .dport = fk.sport, .proto = p->proto };
		struct lbn_flow back = { .addr = fk.saddr, .port = fk.sport, .nat_port = fk.dport, .counter = s->counter, .seen_ns = now };
		__u16 nport = claim_port(&rk, &back, cfg, nft_jhash_slot(fk.saddr, fk.sport, fk.daddr, 0xffffffffu));
		if (nport == 0) {
			event(LBN_EV_PORTS_EXHAUSTED);
			return TC_ACT_SHOT;
		}
		/* Whole at once: one update of the map a new flow (a tuple's
		 * entry that is there already is written over in place: a reader on
		 * another CPU may see it half-written for the instant, a packet of
		 * a connection the client is only now opening again). */
		flow = (struct lbn_flow){ .addr = s->backend, .port = svc->target_port, .nat_port = nport, .counter = s->counter,
					  .closing = (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) != 0, .seen_ns = now };
		if (cached)
			flow.way = old->way;
		else if (rc == BPF_FIB_LKUP_RET_SUCCESS)
			cache_way(&flow.way, &fib, seg, now);
		if (old)
			*old = flow;
		else if (bpf_map_update_elem(&lbn_flows, &fk, &flow, BPF_ANY))
			return TC_ACT_SHOT;
		else
			event(LBN_EV_FLOW_INSERT);
		event(syn || p->proto == IPPROTO_UDP ? LBN_EV_NEW_FLOW : LBN_EV_MIDFLOW);
		if (rc != BPF_FIB_LKUP_RET_SUCCESS) {
			if (rewrite(skb, p, ip->daddr, flow.addr, nport, flow.port, 0, 0))
				return TC_ACT_SHOT;
			count(flow.counter, 1, len, 1);
			return send(skb, &fib, rc);
		}
		f = &flow;
		placed = 1;
	} else {
		flow_seen(&f->closing, &f->seen_ns, p, now);
	}
	return forward(skb, p, f, f->nat_port, f->port, 1, placed, now);
}

static __always_inline int from_backend(struct __sk_buff *skb, struct parsed *p, const struct lbn_config *cfg)
{
	struct iphdr *ip = p->ip;
	struct lbn_flow_key rk = { .saddr = ip->saddr, .daddr = ip->daddr, .sport = p->ports[0], .dport = p->ports[1], .proto = p->proto };
	struct lbn_flow *r = bpf_map_lookup_elem(&lbn_replies, &rk);
	__u64 now = clock_ns();

	if (!r)
		return TCX_NEXT;
	struct lbn_flow_key fk = { .saddr = r->addr, .daddr = ip->daddr, .sport = r->port, .dport = r->nat_port, .proto = p->proto };
	struct lbn_flow *f = bpf_map_lookup_elem(&lbn_flows, &fk);
	/* A reply is the flow's only while the client's side still sends it there. */
	if (!f || f->addr != rk.saddr || f->port != rk.sport || f->nat_port != rk.dport || expired(cfg, p->proto, f->closing, f->seen_ns, now))
		return TCX_NEXT;
	flow_seen(&f->closing, &f->seen_ns, p, now);
	return forward(skb, p, r, r->nat_port, r->port, 0, 0, now);
}

/* linux/icmp.h pulls in libc's socket headers, which the BPF target lacks.
 * ICMPv6's header is the same four fields (RFC 4443 2.1). */
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
struct icmphdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u32 rest;
};

/* The quoted packet of an ICMP error: an IPv4 header without options, then
 * the first 8 bytes of its TCP or UDP header (RFC 792: at least those). */
struct icmp_quote {
	struct iphdr ip;
	__u16 sport;
	__u16 dport;
	__u32 rest;
};

#define ICMP_OFF (sizeof(struct ethhdr) + sizeof(struct iphdr))
#define QUOTE_OFF (ICMP_OFF + sizeof(struct icmphdr))

/* Translate an ICMP error about a packet this engine sent (its source the
 * VIP) towards the flow's other end; TCX_NEXT for every other ICMP packet. */
static __always_inline int icmp_error(struct __sk_buff *skb, const struct lbn_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct icmphdr *ic = data + ICMP_OFF;
	struct icmp_quote *q = data + QUOTE_OFF;

	if ((void *)(q + 1) > end)
		return TCX_NEXT;
	if (ic->type != ICMP_DEST_UNREACH && ic->type != ICMP_TIME_EXCEEDED)
		return TCX_NEXT;
	if (q->ip.ihl != 5 || (q->ip.protocol != IPPROTO_TCP && q->ip.protocol != IPPROTO_UDP) || q->ip.saddr != ip->daddr)
		return TCX_NEXT;

	__u32 vip = q->ip.saddr;
	int to_backend = 0;
	struct lbn_flow_key k = { .proto = q->ip.protocol };
	/* A packet towards the backend (V:nport -> B:port): the replies map names the client. */
	k.saddr = q->ip.daddr;
	k.daddr = vip;
	k.sport = q->dport;
	k.dport = q->sport;
	struct lbn_flow *other = bpf_map_lookup_elem(&lbn_replies, &k);
	if (other) {
		/* The reply entry is the flow's only while the client's side still sends it there (from_backend). */
		struct lbn_flow_key fk = { .saddr = other->addr, .daddr = vip, .sport = other->port, .dport = other->nat_port, .proto = k.proto };
		struct lbn_flow *f = bpf_map_lookup_elem(&lbn_flows, &fk);
		if (!f || f->addr != k.saddr || f->port != k.sport || f->nat_port != k.dport || expired(cfg, k.proto, f->closing, f->seen_ns, clock_ns()))
			return TCX_NEXT;
	} else {
		/* A packet towards the client (V:port -> C:cport): the flows map names the backend. */
		other = bpf_map_lookup_elem(&lbn_flows, &k);
		if (!other || expired(cfg, k.proto, other->closing, other->seen_ns, clock_ns()))
			return TCX_NEXT;
		to_backend = 1;
	}
	/* To the other end (C, or B), quoting its own packet: C:cport -> V:port, or B:targetPort -> V:nport. */
	__u32 nsrc = vip, ndst = other->addr, qsrc = other->addr, qdst = vip;
	__u16 qsport = other->port, qdport = other->nat_port;
	__u32 counter = other->counter;

	__u32 osrc = ip->saddr, odst = ip->daddr;
	__u32 oqsrc = q->ip.saddr, oqdst = q->ip.daddr;
	__u16 oqsport = q->sport, oqdport = q->dport;
	__u16 oqcheck = q->ip.check;
	__u16 ottl = *(__u16 *)&ip->ttl;
	__u16 nttl = ottl - bpf_htons(0x0100);
	__u32 len = bpf_ntohs(ip->tot_len);
	if (ip->ttl <= 1)
		return TCX_NEXT;
	struct bpf_fib_lookup fib;
	int rc = route(skb, &fib, nsrc, ndst, IPPROTO_ICMP, len);
	if (!fib_usable(rc)) {
		event(LBN_EV_NO_ROUTE);
		return TCX_NEXT;
	}

	__u32 qcheck_off = QUOTE_OFF + offsetof(struct iphdr, check);
	__u32 icmp_csum = ICMP_OFF + offsetof(struct icmphdr, checksum);
	__u16 nqcheck;
	/* The quoted header's checksum first, then the ICMP checksum over every quoted change. */
	if (bpf_l3_csum_replace(skb, qcheck_off, oqsrc, qsrc, 4) ||
	    bpf_l3_csum_replace(skb, qcheck_off, oqdst, qdst, 4) ||
	    bpf_skb_load_bytes(skb, qcheck_off, &nqcheck, 2) ||
	    bpf_l4_csum_replace(skb, icmp_csum, oqsrc, qsrc, 4) ||
	    bpf_l4_csum_replace(skb, icmp_csum, oqdst, qdst, 4) ||
	    bpf_l4_csum_replace(skb, icmp_csum, oqsport, qsport, 2) ||
	    bpf_l4_csum_replace(skb, icmp_csum, oqdport, qdport, 2) ||
	    bpf_l4_csum_replace(skb, icmp_csum, oqcheck, nqcheck, 2))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, QUOTE_OFF + offsetof(struct iphdr, saddr), &qsrc, 4, 0) ||
	    bpf_skb_store_bytes(skb, QUOTE_OFF + offsetof(struct iphdr, daddr), &qdst, 4, 0) ||
	    bpf_skb_store_bytes(skb, QUOTE_OFF + sizeof(struct iphdr), &qsport, 2, 0) ||
	    bpf_skb_store_bytes(skb, QUOTE_OFF + sizeof(struct iphdr) + 2, &qdport, 2, 0))
		return TC_ACT_SHOT;
	/* The outer header: from the VIP to the flow's other end, one hop less. */
	__u32 l3 = sizeof(struct ethhdr) + offsetof(struct iphdr, check);
	if (bpf_l3_csum_replace(skb, l3, osrc, nsrc, 4) ||
	    bpf_l3_csum_replace(skb, l3, odst, ndst, 4) ||
	    bpf_l3_csum_replace(skb, l3, ottl, nttl, 2) ||
	    bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, saddr), &nsrc, 4, 0) ||
	    bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, daddr), &ndst, 4, 0) ||
	    bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, ttl), &nttl, 2, 0))
		return TC_ACT_SHOT;
	event(LBN_EV_ICMP_ERROR);
	count(counter, to_backend, len, 0);
	return send(skb, &fib, rc);
}

/* ------------------------------------------------------------------------
 * IPv6: the same engine over its own maps (nat.h's *6 structs), for the
 * kernel path's `sourceIP: snat` ports of IPv6 VIPs:
 *   C:cport -> [V]:port   placed by the port's slot table and nft's seeded
 *                       jhash of `ip6 saddr . th sport` (20 bytes: the
 *                       address, the port, two zero bytes), which the nft
 *                       table's IPv6 flow-hash placement computes
 *                       (ebpf-dsr.ts nftJhashSlot6 is its twin); leaves as
 *                       [V]:nport -> B:targetPort.
 *   B:targetPort -> [V]:nport   leaves as [V]:port -> C:cport.
 * No IP header checksum (RFC 8200); the L4 checksum covers the
 * pseudo-header's 128-bit addresses, fixed by their sum's change (addr_diff6)
 * and bpf_l4_csum_replace; the hop limit drops by one. The way out is
 * bpf_fib_lookup's (AF_INET6), sent with bpf_redirect, or
 * bpf_redirect_neigh (the IPv6 nexthop: NDP fills in the MAC) where the FIB
 * has no neighbour yet. A packet whose next header is an extension header
 * (hop-by-hop, routing, fragment, destination options, ...) is passed on
 * unread, and counted (LBN_EV_IPV6_EXT_HEADER): nft parses those. ICMPv6
 * errors (destination unreachable, packet too big, time exceeded) about a
 * packet the engine sent are translated towards the flow's other end as
 * the IPv4 ones are; ICMPv6's checksum covers the pseudo-header, so the
 * outer addresses go into it too (RFC 4443 2.3). So a Packet Too Big from a
 * router towards a backend reaches the client about its own packet, and
 * path MTU discovery (RFC 8201) works through the VIP.
 *
 * What does not depend on the family is the first half's, called from both:
 * parse_l4, l4_csum, segment_len, the flow's stamps and expiry (flow_seen,
 * expired, flow_stands), the reserved-port claim (claim_in), the cached way
 * (struct lbn_way: cache_way, way_fresh), send, count and event. What
 * follows is the IPv6 header's own: its maps, its hash, its addresses.
 */

#define IPV6_HLEN 40
#define NEXTHDR_ICMPV6 58
#define ICMPV6_DEST_UNREACH 1
#define ICMPV6_PKT_TOOBIG 2
#define ICMPV6_TIME_EXCEED 3

struct ip6h {
	__u8 vtc;
	__u8 flow[3];
	__u16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u32 saddr[4];
	__u32 daddr[4];
};

struct lbn_flow_map6 {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lbn_flow_key6);
	__type(value, struct lbn_flow6);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
};
struct lbn_flow_map6 lbn_flows6 SEC(".maps");
struct lbn_flow_map6 lbn_replies6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lbn_svc_key6);
	__type(value, struct lbn_svc);
	__uint(max_entries, 1);
} lbn_svcs6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lbn_slot6);
	__uint(max_entries, 1);
} lbn_slots6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lbn_member_key6);
	__type(value, struct lbn_member);
	__uint(max_entries, 1);
} lbn_members6 SEC(".maps");

/* nft_jhash_eval over `ip6 saddr . th sport` (20 bytes): one __jhash_mix
 * round over the first 12, the last 8 added, __jhash_final; then
 * reciprocal_scale into `mod` slots. */
static __always_inline __u32 nft_jhash_slot6(const __u32 *s, __u16 sport, __u32 seed, __u32 mod)
{
	__u32 init = JHASH_INITVAL + 20 + seed;
	__u32 a = init + s[0], b = init + s[1], c = init + s[2];

	a -= c; a ^= rol32(c, 4); c += b;
	b -= a; b ^= rol32(a, 6); a += c;
	c -= b; c ^= rol32(b, 8); b += a;
	a -= c; a ^= rol32(c, 16); c += b;
	b -= a; b ^= rol32(a, 19); a += c;
	c -= b; c ^= rol32(b, 4); b += a;
	a += s[3];
	b += (__u32)sport;
	c ^= b; c -= rol32(b, 14);
	a ^= c; a -= rol32(c, 11);
	b ^= a; b -= rol32(a, 25);
	c ^= b; c -= rol32(b, 16);
	a ^= c; a -= rol32(c, 4);
	b ^= a; b -= rol32(a, 14);
	c ^= b; c -= rol32(b, 24);
	return (__u32)(((__u64)c * mod) >> 32);
}

#define L4_OFF6 (sizeof(struct ethhdr) + IPV6_HLEN)

/* An address's change in the L4 checksum (~old + new over its eight
 * 16-bit words), as bpf_csum_diff would sum it, without the call. */
static __always_inline __u32 addr_diff6(const __u32 *o, const __u32 *n)
{
	return csum_word(~o[0]) + csum_word(~o[1]) + csum_word(~o[2]) + csum_word(~o[3]) +
	       csum_word(n[0]) + csum_word(n[1]) + csum_word(n[2]) + csum_word(n[3]);
}

static __always_inline int route6(struct __sk_buff *skb, struct bpf_fib_lookup *fib, const __u32 *src, const __u32 *dst, __u8 proto, __u16 tot_len)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET6;
	fib->l4_protocol = proto;
	fib->tot_len = tot_len;
	COPY6(fib->ipv6_src, src);
	COPY6(fib->ipv6_dst, dst);
	fib->ifindex = skb->ingress_ifindex;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/* (src:sport -> dst:dport) becomes (nsrc:nsport -> ndst:ndport), the hop
 * limit one less, and with `macs`, the frame's MACs from the way `f` caches
 * (a flag, not a pointer that may be null: clang turns that choice into a
 * mask of the pointer, which the verifier refuses). */
static __always_inline int rewrite6(struct __sk_buff *skb, struct parsed *p, const __u32 *nsrc, const __u32 *ndst, __u16 nsport, __u16 ndport,
				    const struct lbn_flow6 *f, int macs)
{
	__u32 oports = *(__u32 *)p->ports;
	__u32 nports = ports_word(nsport, ndport);
	__u8 hop = p->ip6->hop_limit - 1;

	/* The old addresses read where they lie in the packet (no copy on the stack). */
	__u32 diff = addr_diff6(p->ip6->saddr, nsrc) + addr_diff6(p->ip6->daddr, ndst);
	if (l4_csum(skb, p, diff, oports, nports))
		return -1;

	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ip6h *ip = data + sizeof(*eth);
	__u32 *ports = (void *)(ip + 1);
	if ((void *)(ports + 1) > end)
		return -1;
	COPY6(ip->saddr, nsrc);
	COPY6(ip->daddr, ndst);
	ip->hop_limit = hop;
	*ports = nports;
	if (macs) {
		__builtin_memcpy(eth->h_dest, f->way.dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, f->way.smac, ETH_ALEN);
	}
	return 0;
}

/* claim_port over the IPv6 replies map. */
static __always_inline __u16 claim_port6(struct lbn_flow_key6 *rk, const struct lbn_flow6 *back, const struct lbn_config *cfg, __u32 hash)
{
	struct lbn_flow6 *held = bpf_map_lookup_elem(&lbn_replies6, rk);
	struct lbn_svc_key6 as_svc = { .port = rk->dport, .proto = rk->proto };
	COPY6(as_svc.vip, rk->daddr);
	int taken = bpf_map_lookup_elem(&lbn_svcs6, &as_svc) != 0;
	int same = held && eq6(held->addr, back->addr) && held->port == back->port && held->nat_port == back->nat_port;

	if (!taken && same && held->counter == back->counter)
		return rk->dport;
	return claim_in(&lbn_replies6, rk, &rk->dport, back, !taken && (!held || same), !held, cfg, hash, LBN_EV_REPLY6_INSERT);
}

/* Send a packet of flow `f` on from the VIP (forward()'s twin): one
 * rewrite, with the cached way's MACs while it is fresh, else with a new
 * FIB lookup's (which the flow then caches). */
static __always_inline int forward6(struct __sk_buff *skb, struct parsed *p, struct lbn_flow6 *f, __u16 nsport, __u16 ndport, int to_backend, int placed, __u64 now,
				    struct bpf_fib_lookup *fib)
{
	__u32 vip[4], ndst[4];
	COPY6(vip, p->ip6->daddr);
	COPY6(ndst, f->addr);
	__u32 counter = f->counter;
	__u32 ifindex = f->way.ifindex;
	__u32 len = IPV6_HLEN + bpf_ntohs(p->ip6->payload_len);
	__u32 seg = segment_len(skb, p, IPV6_HLEN, len);
	/* -1: the flow's cached way. */
	int rc = -1;

	if (p->ip6->hop_limit <= 1)
		return TCX_NEXT;
	if (!way_fresh(&f->way, seg, now)) {
		rc = route6(skb, fib, vip, ndst, p->proto, seg);
		if (!fib_usable(rc)) {
			event(LBN_EV_NO_ROUTE);
			return TCX_NEXT;
		}
		if (rc == BPF_FIB_LKUP_RET_SUCCESS)
			cache_way(&f->way, fib, seg, now);
		else
			f->way.fib_ns = 0;
	}
	if (rewrite6(skb, p, vip, ndst, nsport, ndport, f, rc < 0))
		return TC_ACT_SHOT;
	count(counter, to_backend, len, placed);
	if (rc < 0)
		return bpf_redirect(ifindex, 0);
	return send(skb, fib, rc);
}

static __noinline int from_client6(struct __sk_buff *skb, struct parsed *p, struct lbn_svc_key6 *sk, struct lbn_svc *svc, const struct lbn_config *cfg)
{
	struct ip6h *ip = p->ip6;
	__u64 now = clock_ns();
	struct lbn_flow_key6 fk = { .sport = p->ports[0], .dport = p->ports[1], .proto = p->proto };
	COPY6(fk.saddr, ip->saddr);
	COPY6(fk.daddr, ip->daddr);
	struct lbn_flow6 *f = bpf_map_lookup_elem(&lbn_flows6, &fk);
	struct lbn_flow6 *old = f;
	struct lbn_flow6 flow;
	struct bpf_fib_lookup fib;
	int placed = 0;
	int syn = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;

	if (f) {
		struct lbn_member_key6 mk = { .svc = *sk };
		COPY6(mk.backend, f->addr);
		if (!flow_stands(cfg, svc, bpf_map_lookup_elem(&lbn_members6, &mk), f->port, f->closing, f->seen_ns, p, syn, now))
			f = 0;
	}
	if (!f) {
		if (svc->slots == 0)
			return TCX_NEXT;
		__u32 key = svc->base + nft_jhash_slot6(fk.saddr, fk.sport, svc->seed, svc->slots);
		struct lbn_slot6 *s = bpf_map_lookup_elem(&lbn_slots6, &key);
		if (!s || (s->backend[0] | s->backend[1] | s->backend[2] | s->backend[3]) == 0)
			return TCX_NEXT;
		if (ip->hop_limit <= 1)
			return TCX_NEXT;
		/* Only while the VIP is this node's (a local route). */
		if (route6(skb, &fib, fk.saddr, fk.daddr, p->proto, 0) != BPF_FIB_LKUP_RET_NOT_FWDED)
			return TCX_NEXT;
		__u32 len = IPV6_HLEN + bpf_ntohs(ip->payload_len);
		__u32 seg = segment_len(skb, p, IPV6_HLEN, len);
		int rc = BPF_FIB_LKUP_RET_SUCCESS;
		int cached = old && eq6(old->addr, s->backend) && way_fresh(&old->way, seg, now);
		if (!cached) {
			rc = route6(skb, &fib, fk.daddr, s->backend, p->proto, seg);
			if (!fib_usable(rc)) {
				event(LBN_EV_NO_ROUTE);
				return TCX_NEXT;
			}
		}
		struct lbn_flow_key6 rk = { .sport = svc->target_port, .dport = fk.sport, .proto = p->proto };
		COPY6(rk.saddr, s->backend);
		COPY6(rk.daddr, fk.daddr);
		/* `flow` holds the backend side's entry first (one 72-byte value on the stack, not two). */
		flow = (struct lbn_flow6){ .port = fk.sport, .nat_port = fk.dport, .counter = s->counter, .seen_ns = now };
		COPY6(flow.addr, fk.saddr);
		__u16 nport = claim_port6(&rk, &flow, cfg, nft_jhash_slot6(fk.saddr, fk.sport, fk.daddr[3], 0xffffffffu));
		if (nport == 0) {
			event(LBN_EV_PORTS_EXHAUSTED);
			return TC_ACT_SHOT;
		}
		flow = (struct lbn_flow6){ .port = svc->target_port, .nat_port = nport, .counter = s->counter,
					   .closing = (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) != 0, .seen_ns = now };
		COPY6(flow.addr, s->backend);
		if (cached)
			flow.way = old->way;
		else if (rc == BPF_FIB_LKUP_RET_SUCCESS)
			cache_way(&flow.way, &fib, seg, now);
		if (old)
			*old = flow;
		else if (bpf_map_update_elem(&lbn_flows6, &fk, &flow, BPF_ANY))
			return TC_ACT_SHOT;
		else
			event(LBN_EV_FLOW6_INSERT);
		event(syn || p->proto == IPPROTO_UDP ? LBN_EV_NEW_FLOW : LBN_EV_MIDFLOW);
		/* No way cached (a neighbour NDP has not resolved yet): forward6 looks it up again. */
		f = &flow;
		placed = 1;
	} else {
		flow_seen(&f->closing, &f->seen_ns, p, now);
	}
	return forward6(skb, p, f, f->nat_port, f->port, 1, placed, now, &fib);
}

static __noinline int from_backend6(struct __sk_buff *skb, struct parsed *p, const struct lbn_config *cfg)
{
	struct ip6h *ip = p->ip6;
	struct lbn_flow_key6 rk = { .sport = p->ports[0], .dport = p->ports[1], .proto = p->proto };
	COPY6(rk.saddr, ip->saddr);
	COPY6(rk.daddr, ip->daddr);
	struct lbn_flow6 *r = bpf_map_lookup_elem(&lbn_replies6, &rk);
	__u64 now = clock_ns();

	if (!r)
		return TCX_NEXT;
	struct lbn_flow_key6 fk = { .sport = r->port, .dport = r->nat_port, .proto = p->proto };
	COPY6(fk.saddr, r->addr);
	COPY6(fk.daddr, rk.daddr);
	struct lbn_flow6 *f = bpf_map_lookup_elem(&lbn_flows6, &fk);
	if (!f || !eq6(f->addr, rk.saddr) || f->port != rk.sport || f->nat_port != rk.dport || expired(cfg, p->proto, f->closing, f->seen_ns, now))
		return TCX_NEXT;
	flow_seen(&f->closing, &f->seen_ns, p, now);
	struct bpf_fib_lookup fib;
	return forward6(skb, p, r, r->nat_port, r->port, 0, 0, now, &fib);
}

/* The quoted packet of an ICMPv6 error: the fixed header, then the first
 * 8 bytes of its TCP or UDP header (an error quotes as much as fits in
 * the minimum MTU, RFC 4443 2.4 (c)). */
struct icmp6_quote {
	struct ip6h ip;
	__u16 sport;
	__u16 dport;
	__u32 rest;
};

#define ICMP6_OFF (sizeof(struct ethhdr) + IPV6_HLEN)
#define QUOTE6_OFF (ICMP6_OFF + sizeof(struct icmphdr))

static __noinline int icmp6_error(struct __sk_buff *skb, const struct lbn_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ip6h *ip = data + sizeof(struct ethhdr);
	struct icmphdr *ic = data + ICMP6_OFF;
	struct icmp6_quote *q = data + QUOTE6_OFF;

	if ((void *)(q + 1) > end)
		return TCX_NEXT;
	if (ic->type != ICMPV6_DEST_UNREACH && ic->type != ICMPV6_PKT_TOOBIG && ic->type != ICMPV6_TIME_EXCEED)
		return TCX_NEXT;
	if ((q->ip.nexthdr != IPPROTO_TCP && q->ip.nexthdr != IPPROTO_UDP) || !eq6(q->ip.saddr, ip->daddr))
		return TCX_NEXT;

	__u32 vip[4];
	COPY6(vip, q->ip.saddr);
	int to_backend = 0;
	struct lbn_flow_key6 k = { .sport = q->dport, .dport = q->sport, .proto = q->ip.nexthdr };
	COPY6(k.saddr, q->ip.daddr);
	COPY6(k.daddr, vip);
	struct lbn_flow6 *other = bpf_map_lookup_elem(&lbn_replies6, &k);
	__u64 now = clock_ns();
	if (other) {
		struct lbn_flow_key6 fk = { .sport = other->port, .dport = other->nat_port, .proto = k.proto };
		COPY6(fk.saddr, other->addr);
		COPY6(fk.daddr, vip);
		struct lbn_flow6 *f = bpf_map_lookup_elem(&lbn_flows6, &fk);
		if (!f || !eq6(f->addr, k.saddr) || f->port != k.sport || f->nat_port != k.dport || expired(cfg, k.proto, f->closing, f->seen_ns, now))
			return TCX_NEXT;
	} else {
		other = bpf_map_lookup_elem(&lbn_flows6, &k);
		if (!other || expired(cfg, k.proto, other->closing, other->seen_ns, now))
			return TCX_NEXT;
		to_backend = 1;
	}
	if (ip->hop_limit <= 1)
		return TCX_NEXT;
	/* Outer: (router -> V) becomes (V -> other); quoted: (V:a -> X:b) becomes (other:port -> V:nat_port). */
	__u32 o[16], n[16];
	COPY6(o, ip->saddr);
	COPY6(o + 4, ip->daddr);
	COPY6(n, vip);
	COPY6(n + 4, other->addr);
	COPY6(o + 8, q->ip.saddr);
	COPY6(o + 12, q->ip.daddr);
	COPY6(n + 8, other->addr);
	COPY6(n + 12, vip);
	__u16 qports[2] = { other->port, other->nat_port };
	__u32 oqports = *(__u32 *)&q->sport;
	__u32 nqports = *(__u32 *)qports;
	__u32 counter = other->counter;
	__u8 hop = ip->hop_limit - 1;
	__u32 len = IPV6_HLEN + bpf_ntohs(ip->payload_len);

	struct bpf_fib_lookup fib;
	int rc = route6(skb, &fib, n, n + 4, NEXTHDR_ICMPV6, len);
	if (!fib_usable(rc)) {
		event(LBN_EV_NO_ROUTE);
		return TCX_NEXT;
	}
	__u32 csum = ICMP6_OFF + offsetof(struct icmphdr, checksum);
	__s64 pseudo = bpf_csum_diff(o, 32, n, 32, 0);
	__s64 quoted = bpf_csum_diff(o + 8, 32, n + 8, 32, 0);
	if (pseudo < 0 || quoted < 0 ||
	    bpf_l4_csum_replace(skb, csum, 0, (__u32)pseudo, BPF_F_PSEUDO_HDR) ||
	    bpf_l4_csum_replace(skb, csum, 0, (__u32)quoted, 0) ||
	    bpf_l4_csum_replace(skb, csum, oqports, nqports, 4))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + offsetof(struct ip6h, saddr), n, 32, 0) ||
	    bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + offsetof(struct ip6h, hop_limit), &hop, 1, 0) ||
	    bpf_skb_store_bytes(skb, QUOTE6_OFF + offsetof(struct ip6h, saddr), n + 8, 32, 0) ||
	    bpf_skb_store_bytes(skb, QUOTE6_OFF + sizeof(struct ip6h), &nqports, 4, 0))
		return TC_ACT_SHOT;
	event(LBN_EV_ICMP_ERROR);
	count(counter, to_backend, len, 0);
	return send(skb, &fib, rc);
}

/* An IPv6 frame: translated when it is a VIP flow's, an ICMPv6 error about
 * one, else passed on. */
static __noinline int nat6(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ip6h *ip = data + sizeof(struct ethhdr);
	struct parsed p = {};
	__u32 zero = 0;

	if ((void *)(ip + 1) > end)
		return TCX_NEXT;
	struct lbn_config *cfg = bpf_map_lookup_elem(&lbn_config, &zero);
	if (!cfg)
		return TCX_NEXT;
	if (ip->nexthdr == NEXTHDR_ICMPV6)
		return icmp6_error(skb, cfg);
	if (ip->nexthdr != IPPROTO_TCP && ip->nexthdr != IPPROTO_UDP) {
		/* Not counted for multicast (MLD reports carry a hop-by-hop header) or no next header (59). */
		if ((ip->daddr[0] & bpf_htonl(0xff000000)) != bpf_htonl(0xff000000) && ip->nexthdr != 59)
			event(LBN_EV_IPV6_EXT_HEADER);
		return TCX_NEXT;
	}
	p.ip6 = ip;
	if (parse_l4(&p, ip + 1, end, ip->nexthdr, L4_OFF6))
		return TCX_NEXT;
	/* A zero UDP checksum is invalid over IPv6 (RFC 8200 8.1): the stack's to drop. */
	if (p.proto == IPPROTO_UDP && p.ports[3] == 0)
		return TCX_NEXT;
	struct lbn_svc_key6 sk = { .port = p.ports[1], .proto = p.proto };
	COPY6(sk.vip, ip->daddr);
	struct lbn_svc *svc = bpf_map_lookup_elem(&lbn_svcs6, &sk);
	if (svc)
		return from_client6(skb, &p, &sk, svc, cfg);
	return from_backend6(skb, &p, cfg);
}

/* IPv4: a subprogram of its own, as nat6 is: each has its own stack frame
 * (the verifier's 512 bytes are per call chain, and clang lays one
 * function's inlined halves side by side). */
static __noinline int nat4(struct __sk_buff *skb)
{
	struct parsed p = {};
	__u32 zero = 0;
	struct lbn_config *cfg;

	if (parse(skb, &p)) {
		void *data = (void *)(long)skb->data;
		void *end = (void *)(long)skb->data_end;
		struct iphdr *ip = data + sizeof(struct ethhdr);
		if ((void *)(ip + 1) > end || ((struct ethhdr *)data)->h_proto != bpf_htons(ETH_P_IP) ||
		    ip->protocol != IPPROTO_ICMP || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)) != 0)
			return TCX_NEXT;
		cfg = bpf_map_lookup_elem(&lbn_config, &zero);
		return cfg ? icmp_error(skb, cfg) : TCX_NEXT;
	}
	cfg = bpf_map_lookup_elem(&lbn_config, &zero);
	if (!cfg)
		return TCX_NEXT;
	struct lbn_svc_key sk = { .vip = p.ip->daddr, .port = p.ports[1], .proto = p.proto };
	struct lbn_svc *svc = bpf_map_lookup_elem(&lbn_svcs, &sk);
	if (svc)
		return from_client(skb, &p, &sk, svc, cfg);
	return from_backend(skb, &p, cfg);
}

SEC("tc")
int lb_agent_nat(struct __sk_buff *skb)
{
	struct ethhdr *eth = (void *)(long)skb->data;

	if ((void *)(eth + 1) <= (void *)(long)skb->data_end && eth->h_proto == bpf_htons(ETH_P_IPV6))
		return nat6(skb);
	return nat4(skb);
}

char LICENSE[] SEC("license") = "GPL";
