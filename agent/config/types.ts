// The validated, typed configuration ("Desired"): what config/load.ts produces
// from YAML and every other module consumes. Frozen after load; downstream code
// never re-checks a string. Addresses are kept both as text (for humans, logs,
// nft) and as u32 where arithmetic is done.
import type { Family } from '../address';

export type IpamMode = 'dhcp' | 'pool';
export type Protocol = 'TCP' | 'UDP';
export type DataplaneMode = 'auto' | 'kernel' | 'proxy';
/** What forwards the kernel path's snat flows: the nft table alone, the eBPF NAT engine in front of it, or the engine where it loads. */
export type KernelEngine = 'nft' | 'ebpf' | 'auto';
export type FailoverMode = 'none' | 'vrrp';
export type BalanceAlgorithm = 'round-robin' | 'least-connections';
/** snat: replies come back through the agent (source rewritten to the VIP); preserve: direct server return. */
export type SourceIpMode = 'snat' | 'preserve';
/** Which backends a service's connections may go to, by zone. */
export type TopologyPolicy = 'any' | 'prefer-zone' | 'zone-only';
/** PROXY protocol versions (HAProxy's doc/proxy-protocol.txt): v1 text, v2 binary. */
export type ProxyProtocolVersion = 'v1' | 'v2';

export interface NodeConfig {
  /** Node name (default: hostname). */
  readonly name: string;
  /** Parent NIC; undefined means "the default route's NIC", resolved at run time. */
  readonly interface: string | undefined;
  /** VRRP priority 1-254. */
  readonly priority: number;
  /** topology.kubernetes.io/zone of this VM as configured; undefined: from labelsFile at run time. */
  readonly zone: string | undefined;
  /** topology.kubernetes.io/region as configured; undefined: from labelsFile at run time. */
  readonly region: string | undefined;
  /** The node labels file (key=value lines, config/labels.ts) read when zone or region is not set. */
  readonly labelsFile: string;
}

export interface FailoverConfig {
  readonly mode: FailoverMode;
  readonly vrid: number;
  /** Seconds (0.01 .. 40.95, RFC 5798 centiseconds). */
  readonly advertInterval: number;
  readonly preempt: boolean;
  /** Seconds a higher-priority backup waits before preempting. */
  readonly preemptDelay: number;
  /** Interface VRRP runs on; undefined = the parent. */
  readonly interface: string | undefined;
  /** The other agents' IPv4 addresses (u32): only their adverts are heard; adverts also go to each unicast. Empty: multicast, anyone heard. */
  readonly peers: readonly number[];
  /**
   * The first VRID of the IPv6 instance (RFC 5798 §5.1: one instance per
   * family; an IPv6 VRID is another router than the same IPv4 VRID).
   * undefined: the same number as vrid.
   */
  readonly vrid6?: number | undefined;
  /** failover.peers' IPv6 addresses (RFC 5952 text; link-local ones on the VRRP interface), the IPv6 instance's peers. Absent: none. */
  readonly peers6?: readonly string[] | undefined;
  /**
   * What lowers this node's priority on the default network's virtual
   * routers (failover/tracking.ts); a named network's routers follow its own
   * networks.<name>.failover.track instead.
   */
  readonly track: TrackConfig;
}

/**
 * A tracked interface (keepalived's track_interface): link down or carrier
 * lost lowers the priority by `weight`, or puts the virtual routers in
 * fault when no weight is given.
 */
export interface TrackInterfaceSpec {
  readonly name: string;
  /** 1-254; undefined: fault. */
  readonly weight: number | undefined;
  /** Seconds the link must stay down before the priority drops. */
  readonly failAfter: number;
  /** Seconds the link must stay up before the priority comes back. */
  readonly recoverAfter: number;
}

/**
 * A tracked service: fewer healthy backends than `minHealthy` (as this
 * node's health checks see them) lowers the priority by `weight`, or puts
 * the virtual routers in fault when no weight is given.
 */
export interface TrackServiceSpec {
  /** "namespace/name": every family of the service counts. */
  readonly service: string;
  readonly minHealthy: number;
  /** 1-254; undefined: fault. */
  readonly weight: number | undefined;
  /** Seconds the shortage must last before the priority drops. */
  readonly failAfter: number;
  /** Seconds the service must stay healthy enough before the priority comes back. */
  readonly recoverAfter: number;
}

export interface TrackConfig {
  readonly interfaces: readonly TrackInterfaceSpec[];
  readonly services: readonly TrackServiceSpec[];
}

export interface PortSpec {
  readonly name: string;
  readonly port: number;
  readonly protocol: Protocol;
  readonly targetPort: number;
}

export interface BackendSpec {
  readonly address: string;
  /** The IPv4 address as u32; 0 for an IPv6 backend (its family says so). */
  readonly addressNum: number;
  /** The backend's family; absent means IPv4. */
  readonly family?: Family | undefined;
  readonly weight: number;
  /** The backend's topology.kubernetes.io/zone, when configured (topology: prefer-zone | zone-only). */
  readonly zone?: string | undefined;
}

export interface HttpCheckSpec {
  readonly path: string;
  /** Inclusive status range accepted as healthy. */
  readonly expectStatus: readonly [number, number];
}

/** What a health probe does: connect, GET over plain HTTP, or GET over TLS. */
export type CheckType = 'tcp' | 'http' | 'https';

/**
 * The TLS side of an HTTPS check. Without a CA the backend's certificate is
 * not verified (HAProxy's `check-ssl verify none`); with one it is verified
 * against it, and its name against `sni` when that is set.
 */
export interface TlsCheckSpec {
  /** The server name sent in the ClientHello; undefined: none is sent. */
  readonly sni: string | undefined;
  /** The CA file as configured (for messages and status). */
  readonly caFile: string | undefined;
  /** Its PEM text, read and checked when the config was loaded. */
  readonly ca: string | undefined;
  /** SHA-256 of that text, hex: what makes two checks' CAs the same. */
  readonly caSha256: string | undefined;
}

export interface HealthCheckSpec {
  readonly enabled: boolean;
  readonly type: CheckType;
  readonly port: number;
  readonly successThreshold: number;
  readonly failureThreshold: number;
  readonly periodSeconds: number;
  readonly timeoutSeconds: number;
  /** The request and accepted statuses of an `http` or `https` check. */
  readonly http: HttpCheckSpec | undefined;
  /** The TLS settings of an `https` check; undefined for the others. */
  readonly tls?: TlsCheckSpec | undefined;
  /** Passive checks: consecutive failed connects on the forwarding path that mark a backend down. 0 = off. */
  readonly passiveFailures: number;
  /**
   * The PROXY protocol header each probe sends first: the
   * service's version when `healthCheck.proxyProtocol: true`, else undefined.
   */
  readonly proxyProtocol?: ProxyProtocolVersion | undefined;
}

/** Kubernetes' spec.ipFamilyPolicy. */
export type IpFamilyPolicy = 'SingleStack' | 'PreferDualStack' | 'RequireDualStack';

/**
 * One VIP of a service ("a family service"). A Kubernetes service with
 * ipFamilies [IPv4, IPv6] is two of these, sharing name, namespace, ports and
 * health check, each with the backends of its own family: the IPv4 one keyed
 * "namespace/name", the IPv6 one "namespace/name@IPv6" (familyServiceKey).
 * Everything downstream (sources, health, data path, status) works on these
 * and never sees a family it does not serve.
 */
export interface ServiceSpec {
  /** "namespace/name" (IPv4) or "namespace/name@IPv6": the identity used for MACs, client ids, state files and labels. */
  readonly key: string;
  /** The family of this VIP; absent means IPv4. */
  readonly family?: Family | undefined;
  /** The families the Kubernetes service gets, first the primary one (after PreferDualStack dropped what cannot be served); absent means [family]. */
  readonly ipFamilies?: readonly Family[] | undefined;
  /** As written or defaulted (SingleStack). */
  readonly ipFamilyPolicy?: IpFamilyPolicy | undefined;
  /** Why a family that PreferDualStack asked for is not served (no pool of it, DHCPv6 or VRRP over IPv6 unsupported): shown by status. */
  readonly familyNotes?: readonly string[] | undefined;
  readonly name: string;
  readonly namespace: string;
  /** The IPAM mode; for a secondary (primaryService set) this is the primary's mode. */
  readonly ipam: IpamMode;
  /** "ns/name" of the service whose VIP this one shares; undefined for a primary/standalone. */
  readonly primaryService: string | undefined;
  /** The address asked for in this VIP's family (loadBalancerIP, or this family's entry of loadBalancerIPs). */
  readonly loadBalancerIP: string | undefined;
  readonly vrid: number | undefined;
  readonly priority: number | undefined;
  readonly ports: readonly PortSpec[];
  readonly backends: readonly BackendSpec[];
  readonly healthCheck: HealthCheckSpec;
  /** snat (default) or preserve: direct server return on the kernel path (targetPort = port). */
  readonly sourceIP: SourceIpMode;
  /** Zone-aware balancing over the healthy backends (forward/topology.ts). */
  readonly topology: TopologyPolicy;
  /** PROXY protocol header to every backend connection (the proxy data path only); undefined: none. */
  readonly proxyProtocol?: ProxyProtocolVersion | undefined;
  /** The network (`networks:` key) the VIP lives on; absent: the default network (config/networks.ts). A secondary has its primary's. */
  readonly network?: string | undefined;
}

export interface PoolRange {
  /** The family of both ends (a range never mixes them). */
  readonly family: Family;
  /** Inclusive first and last usable addresses as Address values (network/broadcast already excluded for CIDRs). */
  readonly start: bigint;
  readonly end: bigint;
  /** As written, for messages: "10.0.0.0/28", "10.0.0.5-10.0.0.9", "fd00::/120". */
  readonly text: string;
  readonly kind: 'cidr' | 'range';
}

export interface Pool {
  /** The kube-vip key: "cidr-default", "range-global", ... */
  readonly key: string;
  /** The network whose interface its addresses go on; absent: the default network (top-level `pools:`). */
  readonly network?: string | undefined;
  /** Ranges of either family, as the key lists them. */
  readonly ranges: readonly PoolRange[];
}

export interface ArpTimings {
  /** RFC 5227 §1.1 defaults: PROBE_WAIT 1 s, PROBE_NUM 3, PROBE_MIN 1 s, PROBE_MAX 2 s, ANNOUNCE_WAIT 2 s, ANNOUNCE_NUM 2, ANNOUNCE_INTERVAL 2 s. Seconds. */
  readonly probeWait: number;
  readonly probeNum: number;
  readonly probeMin: number;
  readonly probeMax: number;
  readonly announceWait: number;
  readonly announceNum: number;
  readonly announceInterval: number;
}

/** The `arp:` section: the RFC 5227 timings and the refresh of held VIPs. */
export interface ArpConfig extends ArpTimings {
  /**
   * Seconds between gratuitous ARPs for every held VIP (keepalived's
   * garp_master_refresh); 0 turns the refresh off. Bounds how long a
   * neighbour that learnt another MAC for a VIP (a VRRP split brain that the
   * loser resolved by yielding) keeps sending to it.
   */
  readonly refreshInterval: number;
}

export interface DhcpTimings {
  /** RFC 2131 §4.1: first retransmission 4 s, doubling to 64 s, ±1 s jitter. Seconds. */
  readonly retransmitInitial: number;
  readonly retransmitMax: number;
  readonly retransmitJitter: number;
  /** RFC 2131 §3.1.5: wait after a DHCPDECLINE before starting over (10 s). */
  readonly declineWait: number;
  /** DHCP exchanges (first DISCOVER to ACK) in flight at once; link set-up and the ARP probe of the ACKed address do not count. */
  readonly maxConcurrentStarts: number;
  /** ARP-probe the address the server ACKed before binding it, and DECLINE it on a conflict (RFC 2131 §4.4.1, RFC 5227 §2.1; default true). Nothing is probed at OFFER time, whatever the key's name says. Under VRRP the wiring turns it off: the election decided. */
  readonly probeOffer: boolean;
}

/** What the DHCP driver accepts from servers (dhcp/guard.ts). */
export interface DhcpGuardConfig {
  /** Accept a yiaddr outside the parent's subnets (a relay serving another subnet). */
  readonly allowOtherSubnets: boolean;
  /** Server identifiers accepted, as u32; empty: any server. */
  readonly servers: readonly number[];
  /** DHCPv6 server DUIDs accepted (SERVERID, dhcp/guard6.ts), lowercase colon-separated hex; empty: any server. */
  readonly servers6: readonly string[];
}

export type DhcpConfig = DhcpTimings & DhcpGuardConfig;

export interface ProxyConfig {
  readonly algorithm: BalanceAlgorithm;
  /** Seconds of inactivity before a proxied connection is closed. */
  readonly idleTimeout: number;
  readonly connectTimeout: number;
  /** Proxied connections at once, all listeners; undefined: derived from the descriptor limit (forward/capacity.ts). */
  readonly maxConnections?: number | undefined;
  /** Worker threads that relay; undefined: one per CPU (forward/proxy.ts defaultWorkers). */
  readonly workers?: number | undefined;
}

/**
 * The `backend:` section: this VM is a backend of direct-server-return
 * services. The agent puts each VIP on lo as a /32 (ownership-marked) and
 * sets the ARP sysctls that keep the VM from answering ARP for it.
 */
export interface BackendRoleConfig {
  /** The VIPs of the DSR services this VM serves, dotted quads. */
  readonly vips: readonly string[];
}

/**
 * One network the VM is on (`networks:`, config/networks.ts): the NIC its
 * VIPs, macvlans, announcements and VRRP adverts use, the pools that hand
 * out its addresses, and where its virtual routers run. The default network
 * is node.interface with the top-level pools and failover settings.
 */
export interface NetworkSpec {
  /** The `networks:` key; DEFAULT_NETWORK for the implicit one. */
  readonly name: string;
  /** The NIC; undefined only for the default network without node.interface (the default route's NIC, resolved at run time). */
  readonly interface: string | undefined;
  /** This network's pools (each Pool's `network` is this name, absent for the default). */
  readonly pools: readonly Pool[];
  /**
   * Where this network's virtual routers run, whom they hear (peers, and
   * peers6 for the IPv6 instance) and what lowers their priority (track):
   * mode, timers and preemption are the top-level failover's.
   */
  readonly failover: Pick<FailoverConfig, 'interface' | 'vrid' | 'peers' | 'peers6' | 'track'>;
}

/** The `kernel:` section: the kernel data path's engine for `sourceIP: snat` (forward/ebpf-nat.ts). */
export interface KernelConfig {
  readonly engine: KernelEngine;
  /** Entries of each of the eBPF engine's two flow maps (one per direction of a flow). */
  readonly flowEntries: number;
  /** The source ports the engine takes towards a backend when the client's own is held by another flow, [low, high]. */
  readonly natPorts: readonly [number, number];
}

export interface Desired {
  readonly node: NodeConfig;
  readonly failover: FailoverConfig;
  readonly stateDir: string;
  readonly metrics: { readonly listen: string };
  readonly control: { readonly socket: string };
  /**
   * How the agent keeps the kernel holding its VIPs, links, tables and
   * sysctls: notifications trigger a check at once; every resyncInterval
   * seconds the whole kernel state is read again.
   */
  readonly reconcile: { readonly resyncInterval: number };
  readonly dataplane: DataplaneMode;
  /** The default network's pools (top-level `pools:`). */
  readonly pools: readonly Pool[];
  /** The named networks (`networks:`), in file order; absent or empty: the default network only. networksOf() adds the default. */
  readonly networks?: readonly NetworkSpec[] | undefined;
  readonly arp: ArpConfig;
  readonly dhcp: DhcpConfig;
  readonly proxy: ProxyConfig;
  readonly kernel: KernelConfig;
  readonly backend: BackendRoleConfig;
  readonly services: readonly ServiceSpec[];
}
