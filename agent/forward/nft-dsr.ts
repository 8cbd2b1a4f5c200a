// forward/ layer: direct server return on the kernel path (`sourceIP:
// preserve`), PURE rendering of `table netdev lb_agent`, which
// nft.ts writes in the same `nft -f` transaction as `table ip lb_agent`.
//
// Packet path (client C, VIP V on this node, backend B with V on its lo):
//   netdev ingress of the parent NIC  frame to (MAC of V's interface, V, port)
//     -> jhash(C address . C port) mod M -> slot -> B (maglev.ts)
//     -> `fwd ip to B device <parent>`: the kernel's neighbour table puts B's
//        MAC as destination and the parent's as source, and the frame leaves
//        by the NIC it came in on, IP header untouched (destination still V,
//        source still C; only the TTL drops by one, as through any router).
//   B accepts it (V is local there), answers from V straight to C.
// An IPv6 VIP takes the same path with `fwd ip6 to B device <parent>`: the
// kernel's neighbour discovery table (NDP, nd_tbl) gives B's MAC as the ARP
// table does for IPv4, and the hop limit drops by one. Each family's VIP goes
// to its own family's backends (a dual-stack service is one service per
// family, config/families.ts), through its own dispatch map.
// A service on a named network (networks:) has that network's NIC as its
// parent: its frames arrive there and leave there, so the table hooks the
// ingress of every NIC that has a forwarded port, one chain each.
// Nothing of a DSR flow enters this node's IP stack: the frame is stolen at
// ingress, before conntrack, so no half-seen connection fills its table and
// no reply is expected back. The backend's conntrack sees both directions
// (it is an ordinary local connection there).
//
// Why nftables' netdev family underneath: kernels with CONFIG_NFT_FWD_NETDEV
// and CONFIG_NFT_HASH run the whole path as a few nft expressions in the
// table the agent already rewrites atomically, with named counters read like
// the others, where a BPF program cannot be loaded. What nftables' netdev family lacks is per-flow state, hence
// the consistent-hash slot table: a flow stays on its backend while the
// healthy set changes unless that backend itself leaves (maglev.ts).
//
// Why the hook is on the parent only: a DHCP VIP lives on a macvlan of the
// parent, but the parent's ingress hook runs before the macvlan receive
// handler (__netif_receive_skb_core: tc ingress, netfilter ingress, then
// rx_handler), so frames for every VIP pass here. The dispatch key includes
// the destination MAC - the parent's for a pool VIP, the service macvlan's
// for a DHCP VIP - so a frame the NIC sees for another host's MAC (a
// flooding switch, a VRRP Backup) is never forwarded.
//
// Why `fwd ip to` (`fwd ip6 to`) and not `ether daddr set ... fwd to`: the
// kernel resolves the backend's MAC in the same neighbour table (ARP, or
// NDP for IPv6) that the health checks' connects to the backend fill, keeps
// it fresh (NUD), and follows a backend whose MAC changes; a healthy backend
// has been resolved by its own health check. A frame for a backend whose
// entry is not yet resolved waits in the neighbour queue (unres_qlen) for
// the ARP reply or neighbour advertisement instead of going nowhere.
//
// What this table costs: one packet per request crosses the node, and the
// table plus `fwd ip to`'s neighbour step are a few percent of the CPU a DSR
// request takes there; counting only SYNs, or rewriting the MAC ourselves,
// would save too little to be worth state the agent would have to track.
// For the node's own CPU, net/ebpf-dsr.ts's program at tc ingress (a third
// to a quarter of this table's cost) runs in front of this table with the
// same match, jhash, slots and counter names (renderDsrPort plans each port,
// IPv4 and IPv6, for both); this table forwards what the program passes on
// (an IPv4 header with options, an IPv6 extension header, a fragment, a
// port on another network's NIC: the program is attached on the data path's
// own NIC only), and everything when the program cannot run here or
// LB_AGENT_DSR_ENGINE=nft.
//
// Why the jhash has an explicit seed: without one the kernel draws a random
// seed for each rule it loads, and every rewrite of the table would send
// every flow to a different slot. The seed is derived from the service key.
import type { BackendSpec, PortSpec } from '../config/types';
import type { DsrBpfPort } from '../net/ebpf/ebpf-dsr';
import type { NormalizedService } from './dataplane';
import { dsrSlotTable, hash32 } from './maglev';

export const DSR_FAMILY = 'netdev';
export const DSR_TABLE = 'lb_agent';
/** Before anything else on the device's ingress; nothing else of ours hooks there. */
export const DSR_PRIORITY = -500;

/** A named counter of the netdev table (nft.ts owns the type; duplicated shape to keep this module pure and import-free). */
export interface DsrCounterRef {
  readonly name: string;
  readonly kind: 'conns' | 'to_backend';
  readonly service: string;
  readonly port: PortSpec;
  readonly backend: string;
}

export interface DsrPortRender {
  readonly counterDecls: readonly string[];
  readonly counters: readonly DsrCounterRef[];
  /** The dispatch map element, or undefined when nothing is forwarded (no healthy backend, or a problem). */
  readonly dispatch: string | undefined;
  readonly chains: readonly string[];
  readonly problem: string | undefined;
  /** The same port for the BPF program in front of the table (net/ebpf-dsr.ts), when it is forwarded. */
  readonly bpf?: DsrBpfPort | undefined;
  /** The NIC the port's frames arrive on and leave by: its service's network's. */
  readonly device: string | undefined;
  /** The VIP's family in nft's words: which map of the device's chain dispatches the port. */
  readonly family: 'ip' | 'ip6';
}

const proto = (p: PortSpec): string => (p.protocol === 'UDP' ? 'udp' : 'tcp');

/** The jhash seed of a service: fixed across rewrites and restarts. */
export function dsrSeed(serviceKey: string): string {
  return `0x${dsrSeedValue(serviceKey).toString(16).padStart(8, '0')}`;
}

export function dsrSeedValue(serviceKey: string): number {
  return hash32(serviceKey, 0x64737221);
}

/**
 * The slot table a flow hash indexes: maglev over every configured backend,
 * the healthy ones filling it (maglev.ts). Direct server return always uses
 * it; the SNAT path does with VRRP (nft.ts, "Why a hash with VRRP").
 */
export function flowHashSlots(svc: NormalizedService): BackendSpec[] {
  return dsrSlotTable(svc.all, svc.healthy);
}

/** nft's pick of a slot: the seeded jhash of the client's address and port, mod the table's size. */
export function flowHashPick(serviceKey: string, slots: number, ip: 'ip' | 'ip6' = 'ip'): string {
  return `jhash ${ip} saddr . th sport mod ${slots} seed ${dsrSeed(serviceKey)}`;
}

/** A device name as an nft string (validated interface names never need escaping; refuse anything odd). */
function deviceString(device: string): string {
  if (!/^[^"\\\s/]{1,15}$/.test(device)) throw new Error(`not an interface name: ${JSON.stringify(device)}`);
  return `"${device}"`;
}

/**
 * One DSR port of a held service: counters for every configured backend
 * (SYNs as connections on TCP, bytes towards the backend), the slot chain
 * and one chain per healthy backend. `sp` is the positional name nft.ts uses.
 */
export function renderDsrPort(sp: string, svc: NormalizedService, spec: PortSpec, device: string | undefined): DsrPortRender {
  const p = proto(spec);
  const ip = svc.vip?.includes(':') === true ? 'ip6' : 'ip';
  const counterDecls: string[] = [];
  const counters: DsrCounterRef[] = [];
  svc.all.forEach((b, bi) => {
    for (const kind of ['conns', 'to_backend'] as const) {
      counterDecls.push(`\tcounter ${sp}b${bi}_${kind} {}`);
      counters.push({ name: `${sp}b${bi}_${kind}`, kind, service: svc.key, port: spec, backend: b.address });
    }
  });
  const refuse = (problem: string | undefined): DsrPortRender => ({ counterDecls, counters, dispatch: undefined, chains: [], problem, device, family: ip });
  if (svc.healthy.length === 0) return refuse(undefined);
  if (device === undefined) return refuse(`${svc.key}: ${spec.protocol} port ${spec.port}: direct server return needs the NIC of the service's network, which this data path was not given; refusing connections`);
  if (svc.vipMac === undefined) return refuse(`${svc.key}: ${spec.protocol} port ${spec.port}: direct server return needs the MAC the VIP ${svc.vip} answers with; refusing connections`);
  const dev = deviceString(device);
  const chainOf = (address: string): string => `${sp}b${svc.all.findIndex((b) => b.address === address)}`;
  const chains: string[] = [];
  const distinct = new Set(svc.healthy.map((b) => b.address));
  const healthyIndex = new Map(svc.healthy.map((b, i) => [b.address, i]));
  let bpfSlots: number[];
  if (distinct.size === 1) {
    chains.push(`\tchain ${sp} {`, `\t\tgoto ${chainOf(svc.healthy[0]!.address)}`, '\t}');
    bpfSlots = [0];
  } else {
    const slots = flowHashSlots(svc);
    const vm = slots.map((b, i) => `${i} : goto ${chainOf(b.address)}`).join(', ');
    chains.push(`\tchain ${sp} {`, `\t\t${flowHashPick(svc.key, slots.length, ip)} vmap { ${vm} }`, '\t}');
    bpfSlots = slots.map((b) => healthyIndex.get(b.address)!);
  }
  // The BPF program in front of this table forwards both families by the
  // same slot table and hash (net/ebpf-dsr.ts) and counts into the same
  // counter names.
  const bpf: DsrBpfPort = {
    mac: svc.vipMac, vip: svc.vip!, protocol: spec.protocol === 'UDP' ? 'UDP' : 'TCP', port: spec.port, seed: dsrSeedValue(svc.key), slots: bpfSlots,
    backends: svc.healthy.map((b) => ({ address: b.address, conns: `${chainOf(b.address)}_conns`, toBackend: `${chainOf(b.address)}_to_backend` })),
  };
  for (const b of svc.healthy) {
    const name = chainOf(b.address);
    const body = p === 'tcp'
      // A connection is its SYN (the netdev hook has no conntrack to ask).
      ? [`\t\ttcp flags & (syn | ack) == syn counter name "${name}_conns"`]
      : [];
    chains.push(`\tchain ${name} {`, ...body, `\t\tcounter name "${name}_to_backend" fwd ${ip} to ${b.address} device ${dev}`, '\t}');
  }
  return { counterDecls, counters, dispatch: `${svc.vipMac} . ${svc.vip} . ${p} . ${spec.port} : jump ${sp}`, chains, problem: undefined, bpf, device, family: ip };
}

/** Create-if-missing and delete: the start of every script, so the table never outlives a config without DSR. */
export function dsrRemovalLines(): string[] {
  return [`table ${DSR_FAMILY} ${DSR_TABLE} {}`, `delete table ${DSR_FAMILY} ${DSR_TABLE}`];
}

/**
 * The netdev table's definition, or nothing when no DSR port is forwarded (no
 * hook on a NIC for nothing). One ingress chain per NIC that has a forwarded
 * port (a service's network's NIC: its VIP's frames arrive there and leave
 * there for the backend), with a dispatch map per family that has one; the
 * data path's own NIC's are named `ingress`, `dsr` and `dsr6`, another NIC's
 * carry `_n<position>` in the NICs' sorted order.
 */
export function renderDsrTable(defaultDevice: string | undefined, ports: readonly DsrPortRender[]): string[] {
  const forwarded = ports.filter((p): p is DsrPortRender & { dispatch: string; device: string } => p.dispatch !== undefined && p.device !== undefined);
  if (forwarded.length === 0) return [];
  const devices = dsrDevices(defaultDevice, forwarded);
  const maps: string[] = [];
  const hooks: string[] = [];
  devices.forEach((device, k) => {
    const suffix = device === defaultDevice ? '' : `_n${k}`;
    const rules: string[] = [];
    for (const [family, name, addrType] of [['ip', `dsr${suffix}`, 'ipv4_addr'], ['ip6', `dsr6${suffix}`, 'ipv6_addr']] as const) {
      const dispatch = forwarded.filter((p) => p.device === device && p.family === family).map((p) => p.dispatch);
      if (dispatch.length === 0) continue;
      maps.push(
        `\tmap ${name} {`,
        `\t\ttype ether_addr . ${addrType} . inet_proto . inet_service : verdict`,
        '\t\telements = {', ...dispatch.map((l) => `\t\t\t${l},`), '\t\t}',
        '\t}',
      );
      rules.push(`\t\tether daddr . ${family} daddr . meta l4proto . th dport vmap @${name}`);
    }
    hooks.push(
      `\tchain ingress${suffix} {`,
      `\t\ttype filter hook ingress device ${deviceString(device)} priority ${DSR_PRIORITY}; policy accept;`,
      ...rules,
      '\t}',
    );
  });
  return [
    `table ${DSR_FAMILY} ${DSR_TABLE} {`,
    ...ports.flatMap((p) => p.counterDecls),
    ...maps,
    ...hooks,
    ...ports.flatMap((p) => p.chains),
    '}',
  ];
}

/** The NICs the netdev table hooks (renderDsrTable's chains), in its order. */
export function dsrDevices(defaultDevice: string | undefined, ports: readonly DsrPortRender[]): string[] {
  const used = new Set(ports.flatMap((p) => (p.dispatch !== undefined && p.device !== undefined ? [p.device] : [])));
  return [...used].sort((a, b) => (a === defaultDevice ? -1 : b === defaultDevice ? 1 : a < b ? -1 : a > b ? 1 : 0));
}

/**
 * What direct server return needs from the kernel, loaded in a throwaway
 * namespace (device lo): a netdev ingress chain, a concatenated verdict map
 * with an ether_addr key for each family, jhash with a seed, tcp flags,
 * named counters, `fwd ip to` and `fwd ip6 to`. CONFIG_NF_TABLES_NETDEV, CONFIG_NETFILTER_INGRESS,
 * CONFIG_NFT_HASH, CONFIG_NFT_FWD_NETDEV. The daemon's probe and the
 * preflight load this same text.
 */
export const DSR_PROBE_RULESET = `table netdev lbchk {
	counter c {}
	map dsr {
		type ether_addr . ipv4_addr . inet_proto . inet_service : verdict
		elements = { 02:00:00:00:00:01 . 192.0.2.10 . tcp . 80 : jump s }
	}
	map dsr6 {
		type ether_addr . ipv6_addr . inet_proto . inet_service : verdict
		elements = { 02:00:00:00:00:01 . 2001:db8::10 . tcp . 80 : jump s6 }
	}
	chain ingress {
		type filter hook ingress device "lo" priority ${DSR_PRIORITY}; policy accept;
		ether daddr . ip daddr . meta l4proto . th dport vmap @dsr
		ether daddr . ip6 daddr . meta l4proto . th dport vmap @dsr6
	}
	chain s {
		jhash ip saddr . th sport mod 2 seed 0x1 vmap { 0 : goto b, 1 : goto b }
	}
	chain b {
		tcp flags & (syn | ack) == syn counter name "c"
		fwd ip to 192.0.2.11 device "lo"
	}
	chain s6 {
		jhash ip6 saddr . th sport mod 2 seed 0x1 vmap { 0 : goto b6, 1 : goto b6 }
	}
	chain b6 {
		fwd ip6 to 2001:db8::11 device "lo"
	}
}
`;

/** The kernel options DSR_PROBE_RULESET exercises, for diagnosing a refusal (`lb-agent check`). */
export const DSR_KERNEL_OPTIONS = ['NF_TABLES_NETDEV', 'NETFILTER_INGRESS', 'NFT_HASH', 'NFT_FWD_NETDEV'] as const;
