/* The full-NAT engine's map layouts (native/bpf/nat.c), the one
 * definition both sides use: the program includes this header, and the
 * TypeScript driver (agent/net/ebpf/nat-layout.ts) reads it at run time and
 * encodes and decodes the maps' entries from the fields it finds here, so a
 * change here cannot leave the two disagreeing. Every struct is made of
 * fixed-width fields with explicit padding (no implicit holes); addresses
 * and ports are in network order, as the wire has them.
 */
#ifndef LB_AGENT_NAT_H
#define LB_AGENT_NAT_H

#include <linux/types.h>

/* One forwarded (VIP, port, protocol): the services map's key. */
struct lbn_svc_key {
	__u32 vip;
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* What the program needs of a forwarded port. `base` is the key of its
 * first slot in the slots map; `slots` is the slot table's size (0: no
 * healthy backend, the packet goes on to the nft table, which refuses it). */
struct lbn_svc {
	__u32 base;
	__u32 slots;
	__u32 seed;
	__u16 target_port;
	__u16 pad;
};

/* One slot of a port's Maglev table: the backend and its counters' index. */
struct lbn_slot {
	__u32 backend;
	__u32 counter;
};

/* A backend of a port (every configured one): whether it is healthy now. */
struct lbn_member_key {
	struct lbn_svc_key svc;
	__u32 backend;
};

struct lbn_member {
	__u32 counter;
	__u32 healthy;
};

/* A flow in one direction, as its packets carry it. */
struct lbn_flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* The way out towards a flow's other end, as bpf_fib_lookup last gave it:
 * the device, the frame's MACs, and `fib_len`, the segment length that
 * lookup checked against the route's MTU. A packet of the flow no longer
 * than `fib_len`, within LBN_FIB_REFRESH_NS of `fib_ns`, is sent with these
 * and no lookup; `fib_ns` 0: none cached (a flow's first packet, or a
 * neighbour the FIB had not resolved). The same in both families. */
struct lbn_way {
	__u64 fib_ns;
	__u32 ifindex;
	__u16 fib_len;
	__u8 dmac[6];
	__u8 smac[6];
	__u8 pad[6];
};

/* The other end of a flow: the client side for the backend's packets
 * (addr, port = the client, nat_port = the VIP's port), the backend side for
 * the client's (addr, port = the backend, nat_port = the source port towards
 * it). `seen_ns` is bpf_ktime_get_ns() of the flow's last packet; `closing`
 * is set by a TCP FIN or RST; `way` is the way out towards `addr`. */
struct lbn_flow {
	__u32 addr;
	__u16 port;
	__u16 nat_port;
	__u32 counter;
	__u32 closing;
	__u64 seen_ns;
	struct lbn_way way;
};

/* The IPv6 twins of the keys and entries above, in maps of their own
 * (lbn_svcs6, lbn_slots6, lbn_members6, lbn_flows6, lbn_replies6): the same
 * fields with 16-byte addresses (network order, as four words), so an IPv4
 * flow keeps its 16-byte key and 56-byte entry. The service and member
 * values (struct lbn_svc, struct lbn_member) and the counters are shared. */
struct lbn_svc_key6 {
	__u32 vip[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

struct lbn_slot6 {
	__u32 backend[4];
	__u32 counter;
};

struct lbn_member_key6 {
	struct lbn_svc_key6 svc;
	__u32 backend[4];
};

struct lbn_flow_key6 {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct lbn_flow6 {
	__u32 addr[4];
	__u16 port;
	__u16 nat_port;
	__u32 counter;
	__u32 closing;
	__u32 pad0;
	__u64 seen_ns;
	struct lbn_way way;
};

/* Per (port, backend): what went each way, and the flows placed. */
struct lbn_counter {
	__u64 packets_to_backend;
	__u64 bytes_to_backend;
	__u64 packets_to_client;
	__u64 bytes_to_client;
	__u64 flows;
};

/* The engine's settings (the config map's one entry). */
struct lbn_config {
	__u64 tcp_idle_ns;
	__u64 tcp_closing_ns;
	__u64 udp_idle_ns;
	__u16 port_min;
	__u16 port_count;
	__u32 pad;
};

/* Indices of the engine-wide counters (the events map). */
enum lbn_event {
	LBN_EV_NEW_FLOW = 0,
	LBN_EV_MIDFLOW = 1,
	LBN_EV_EXPIRED = 2,
	LBN_EV_REPLACED = 3,
	LBN_EV_PORTS_EXHAUSTED = 4,
	LBN_EV_NO_ROUTE = 5,
	LBN_EV_PASSED = 6,
	LBN_EV_ICMP_ERROR = 7,
	/* Keys added to lbn_flows and lbn_replies (an entry written over is
	 * not counted): the program never deletes one, so what was added and is
	 * no longer there was evicted (the driver's `evicted`). */
	LBN_EV_FLOW_INSERT = 8,
	LBN_EV_REPLY_INSERT = 9,
	/* A unicast IPv6 packet whose next header is neither TCP, UDP nor
	 * ICMPv6 (an extension header): passed on to the nft table unread. */
	LBN_EV_IPV6_EXT_HEADER = 10,
	/* The IPv6 twins of LBN_EV_FLOW_INSERT and LBN_EV_REPLY_INSERT. */
	LBN_EV_FLOW6_INSERT = 11,
	LBN_EV_REPLY6_INSERT = 12,
	LBN_EV_COUNT = 13,
};

/* How many source ports of the reserved range a new flow tries when the
 * client's own port is taken towards its backend. */
#define LBN_PORT_TRIES 8

/* How long a flow's cached way out (struct lbn_way) is used before
 * the next packet looks it up again: a route, MTU or neighbour MAC that
 * changes reaches an open flow within this (1 s). */
#define LBN_FIB_REFRESH_NS 1000000000

#endif
