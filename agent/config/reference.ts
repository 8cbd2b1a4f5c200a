// The configuration reference, generated from the one definition of the file:
// the JSON schema (schema.ts: keys, types, ranges, defaults from defaults.ts)
// plus one sentence per key (KEY_HELP, below). Whether a reload applies a key
// is not written by hand either: it is found by asking the reload rules
// (passed in as `refusals`, daemon/reconciler.ts) about a change of that key.
// Pure: data in, text out. docs/configuration.md and lb-agent.yaml(5) are its
// two renderings; `npm run docs` and `lb-agent man config` print them.
import { isDeepStrictEqual } from 'node:util';
import { configSchema } from './schema';
import { DEFAULT_CONFIG_PATH } from './defaults';
import type { Desired } from './types';
import type { ConfigError, LoadResult } from './load';
import type { CaFileReader } from './ca-file';

type S = Record<string, unknown>;

export interface KeyHelp {
  /** What the key does, as a rule a user can act on. */
  readonly text: string;
  /** What an unset key means when the schema has no default (known only at run time). */
  readonly unset?: string;
  /** A valid value other than the default, for the reload probe (strings with a pattern, lists). */
  readonly probe?: unknown;
  /** For a key that cannot change alone: the edit of the probe's file that changes it. */
  readonly probeEdit?: (file: { services: Record<string, unknown>[] }) => void;
}

/**
 * A probe edit that tracks one item (a key inside an item needs the item's
 * required key beside it): in failover.track, or in the probe file's
 * network's (networks.vmnet.failover.track).
 */
function trackEdit(list: 'interfaces' | 'services', item: S, network?: string): (file: { services: Record<string, unknown>[] }) => void {
  return (f) => {
    const file = f as unknown as S;
    if (network === undefined) {
      file.failover = { ...(file.failover as S), track: { [list]: [item] } };
      return;
    }
    const nets = file.networks as Record<string, S>;
    const n = nets[network]!;
    nets[network] = { ...n, failover: { ...(n.failover as S), track: { [list]: [item] } } };
  };
}

/** One sentence (or three) per key. A key of the schema without one fails test/config/reference.test.ts. */
export const KEY_HELP: Readonly<Record<string, KeyHelp>> = {
  node: { text: 'This VM.' },
  'node.name': { text: 'The node name shown in status and metrics.', unset: 'the hostname', probe: 'worker-2' },
  'node.interface': { text: 'The parent NIC: DHCP services get their macvlan on it, pool VIPs go on it as /32 addresses, VRRP adverts leave by it. To put VIPs on another NIC (a second vNIC on another VLAN), name it here.', unset: 'the NIC of the default route', probe: 'eth1' },
  'node.priority': { text: 'This VM\'s VRRP priority for every virtual router (the highest priority becomes Master).', probe: 120 },
  'node.zone': { text: 'This VM\'s `topology.kubernetes.io/zone`, used by a service\'s `topology`.', unset: 'the label in `node.labelsFile`', probe: 'zone-b' },
  'node.region': { text: 'This VM\'s `topology.kubernetes.io/region`: shown, not used to choose backends.', unset: 'the label in `node.labelsFile`', probe: 'region-2' },
  'node.labelsFile': { text: 'A file of `key="value"` lines (the Kubernetes downward API\'s format) read at start, at every reload and whenever it is rewritten; the zone and region come from it when not set here.', probe: '/etc/lb-agent/labels' },
  failover: { text: 'Which VM holds which VIP.' },
  'failover.mode': { text: '`none`: this VM serves every VIP. `vrrp`: the agents elect with VRRPv3 (RFC 5798) which VM holds each VIP; the kernel path then places connections by a flow hash so that open ones outlive a failover.' },
  'failover.vrid': { text: 'The virtual router every service rides unless it sets its own `vrid`.', probe: 60 },
  'failover.vrid6': { text: 'The virtual router IPv6 VIPs ride (RFC 5798 runs one VRRP instance per family: IPv6 adverts go from the link-local address to ff02::12 and list IPv6 VIPs only). A service\'s own `vrid` applies to both families.', unset: '`failover.vrid`', probe: 61 },
  'failover.advertInterval': { text: 'Seconds between VRRP adverts (RFC 5798 centiseconds). A Backup takes over after about 3.6 intervals without one.', probe: 0.5 },
  'failover.preempt': { text: 'A VM with a higher priority takes the VIPs back when it returns.' },
  'failover.preemptDelay': { text: 'Seconds a returning higher-priority VM waits before it takes the VIPs back.', probe: 5 },
  'failover.interface': { text: 'The NIC VRRP adverts use. When it is a network\'s NIC, adverts leave from its IPv4 address as it is now (a change is followed without a restart).', unset: '`node.interface`', probe: 'eth1' },
  'failover.peers': { text: 'The other agents\' addresses. When set, adverts are heard only from them and each advert is also sent to each of them unicast (for networks that filter multicast). A check of the source address, not authentication. IPv6 addresses (link-local on the VRRP interface, or global) are the IPv6 instance\'s peers; with IPv6 VIPs, list them too.', probe: ['10.0.0.3'] },
  'failover.track': { text: 'What lowers this VM\'s priority on the default network\'s virtual routers (those of the services without `network`), so that a healthier VM takes the VIPs (docs/failover.md "Ownership that follows health"); a named network\'s routers follow its own `networks.<key>.failover.track`. A track with a `weight` lowers the priority by it while failing (never below 1); one without puts the virtual routers in fault: the Master resigns and the VM stays out of the election until the track recovers. A reload applies a change to the running routers.' },
  'failover.track.interfaces': { text: 'NICs of this VM to track (keepalived\'s `track_interface`): one that is missing, administratively down or without carrier fails.', probe: [{ name: 'eth1', weight: 50 }] },
  'failover.track.interfaces[].name': { text: 'The interface. One this VM does not have counts as down; `lb-agent check` warns about it.', probe: 'eth2' },
  'failover.track.interfaces[].weight': { text: 'How much the priority drops while the interface fails.', unset: 'fault', probe: 60, probeEdit: trackEdit('interfaces', { name: 'eth1', weight: 60 }) },
  'failover.track.interfaces[].failAfter': { text: 'Seconds the interface must stay down before it counts.', probe: 1, probeEdit: trackEdit('interfaces', { name: 'eth1', failAfter: 1 }) },
  'failover.track.interfaces[].recoverAfter': { text: 'Seconds the interface must stay up again before the priority comes back.', probe: 2, probeEdit: trackEdit('interfaces', { name: 'eth1', recoverAfter: 2 }) },
  'failover.track.services': { text: 'Services to track (keepalived\'s `track_script`, with this VM\'s own health checks as the script): fewer than `minHealthy` healthy backends fails. Backends not checked yet count as healthy.', probe: [{ service: 'web', weight: 50 }] },
  'failover.track.services[].service': { text: '"namespace/name" or "name" (namespace default) of a service of this file on the default network, with health checks on; every family of it counts.', probe: 'other' },
  'failover.track.services[].minHealthy': { text: 'The fewest healthy backends that keep the track from failing (at most the service\'s number of backends).', probe: 1, probeEdit: trackEdit('services', { service: 'other', minHealthy: 1 }) },
  'failover.track.services[].weight': { text: 'How much the priority drops while the service fails.', unset: 'fault', probe: 60, probeEdit: trackEdit('services', { service: 'web', weight: 60 }) },
  'failover.track.services[].failAfter': { text: 'Seconds the shortage must last before it counts: a backend flapping faster than that moves nothing.', probe: 2, probeEdit: trackEdit('services', { service: 'web', failAfter: 2 }) },
  'failover.track.services[].recoverAfter': { text: 'Seconds the service must stay healthy enough before the priority comes back.', probe: 10, probeEdit: trackEdit('services', { service: 'web', recoverAfter: 10 }) },
  stateDir: { text: 'Where leases, pool claims, health verdicts and the instance lock live.', probe: '/var/lib/lb-agent-2' },
  metrics: { text: 'The Prometheus endpoint.' },
  'metrics.listen': { text: '`host:port` of `/metrics`, `/healthz` and `/readyz`; `""` turns the endpoint off.', probe: '127.0.0.1:9478' },
  control: { text: 'The control socket.' },
  'control.socket': { text: 'The unix socket `lb-agent status`, `reload` and `withdraw` talk to.', probe: '/run/lb-agent/other.sock' },
  reconcile: { text: 'How the agent keeps the kernel holding its VIPs, macvlans, tables and sysctls while other programs change them (docs/operations.md, Drift).' },
  'reconcile.resyncInterval': { text: 'Seconds between full re-reads of the kernel\'s links, addresses, ruleset generation and sysctls: the safety net for a lost notification. Notifications trigger a repair at once.', probe: 10 },
  dataplane: { text: '`kernel`: nftables forwards (NAT, or direct server return). `proxy`: the userspace proxy relays connections. `auto`: the kernel path where nftables works and no service asks for the PROXY protocol, else the proxy.' },
  pools: { text: 'IP pools, with kube-vip\'s keys. A pool service takes its VIP from `cidr-<namespace>`, then `cidr-global`, `range-<namespace>`, `range-global`.', probe: { 'range-global': '10.0.0.200-10.0.0.230' } },
  'pools.<key>': { text: 'A key `cidr-<namespace|global>` (comma-separated CIDRs) or `range-<namespace|global>` (comma-separated `first-last` ranges).', probe: '10.0.0.230-10.0.0.239' },
  networks: { text: 'The other networks this VM is on, by name (a DNS label; `default` is the name of the node\'s own network: `node.interface` with the top-level `pools` and `failover` settings). A service on a network takes its VIP there: its macvlan, pool address, ARP and NDP announcements and VRRP adverts use that network\'s NIC, and every NIC answers ARP only for its own addresses (ARP flux: the agent sets `arp_ignore=1`, `arp_announce=2` on each).', probe: { vmnet: { interface: 'eth2', pools: { 'range-global': '10.0.1.200-10.0.1.220' }, failover: { vrid: 61 } }, storage: { interface: 'eth3' } } },
  'networks.<key>': { text: 'One network: a NIC of the VM, its pools and its virtual routers.' },
  'networks.<key>.interface': { text: 'The NIC on this network (a VLAN sub-interface the VM\'s own network config made is a NIC too). Two networks may not share one, nor share one with `node.interface`.', probe: 'eth3' },
  'networks.<key>.pools': { text: 'This network\'s pools, with the keys of the top-level `pools`; a pool service on the network takes its VIP from them by the same lookup order. An address range belongs to one network only.', probe: { 'range-global': '10.0.1.230-10.0.1.239' } },
  'networks.<key>.pools.<key>': { text: 'As `pools.<key>`.', probe: '10.0.1.230-10.0.1.239' },
  'networks.<key>.failover': { text: 'Where this network\'s virtual routers run; `failover.mode`, the timers and preemption are the top-level ones.' },
  'networks.<key>.failover.interface': { text: 'The NIC this network\'s VRRP adverts use; as `failover.interface`, its address is followed when it is a network\'s NIC.', unset: '`networks.<key>.interface`', probe: 'eth4' },
  'networks.<key>.failover.vrid': { text: 'The virtual router this network\'s services ride unless one sets its own `vrid`. Two networks\' services may not ride one VRID (status and metrics name a router by it).', unset: '`failover.vrid`', probe: 70 },
  'networks.<key>.failover.peers': { text: 'The other agents\' addresses on this network (as `failover.peers`): IPv4 ones for its IPv4 routers; IPv6 ones (link-local on this network\'s VRRP interface, or global) for its IPv6 routers. With VIPs of a family on this network, list peers of that family.', unset: '`failover.peers`', probe: ['10.0.1.3'] },
  'networks.<key>.failover.track': { text: 'What lowers this VM\'s priority on this network\'s virtual routers (IPv4 and IPv6), as `failover.track` does on the default network\'s; it is not inherited from `failover.track`. A reload applies a change to the running routers.' },
  'networks.<key>.failover.track.interfaces': { text: 'As `failover.track.interfaces`: NICs of this VM whose loss lowers this network\'s routers (its own NIC, typically).', probe: [{ name: 'eth2', weight: 50 }] },
  'networks.<key>.failover.track.interfaces[].name': { text: 'As `failover.track.interfaces[].name`.', probe: 'eth2' },
  'networks.<key>.failover.track.interfaces[].weight': { text: 'As `failover.track.interfaces[].weight`.', unset: 'fault', probe: 60, probeEdit: trackEdit('interfaces', { name: 'eth2', weight: 60 }, 'vmnet') },
  'networks.<key>.failover.track.interfaces[].failAfter': { text: 'As `failover.track.interfaces[].failAfter`.', probe: 1, probeEdit: trackEdit('interfaces', { name: 'eth2', failAfter: 1 }, 'vmnet') },
  'networks.<key>.failover.track.interfaces[].recoverAfter': { text: 'As `failover.track.interfaces[].recoverAfter`.', probe: 2, probeEdit: trackEdit('interfaces', { name: 'eth2', recoverAfter: 2 }, 'vmnet') },
  'networks.<key>.failover.track.services': { text: 'As `failover.track.services`, for services on this network only (`validate` refuses one on another network: its VIP rides other routers).', probe: [{ service: 'edge', weight: 50 }] },
  'networks.<key>.failover.track.services[].service': { text: '"namespace/name" or "name" of a service of this file whose `network` is this one, with health checks on.', probe: 'edge' },
  'networks.<key>.failover.track.services[].minHealthy': { text: 'As `failover.track.services[].minHealthy`.', probe: 1, probeEdit: trackEdit('services', { service: 'edge', minHealthy: 1 }, 'vmnet') },
  'networks.<key>.failover.track.services[].weight': { text: 'As `failover.track.services[].weight`.', unset: 'fault', probe: 60, probeEdit: trackEdit('services', { service: 'edge', weight: 60 }, 'vmnet') },
  'networks.<key>.failover.track.services[].failAfter': { text: 'As `failover.track.services[].failAfter`.', probe: 2, probeEdit: trackEdit('services', { service: 'edge', failAfter: 2 }, 'vmnet') },
  'networks.<key>.failover.track.services[].recoverAfter': { text: 'As `failover.track.services[].recoverAfter`.', probe: 10, probeEdit: trackEdit('services', { service: 'edge', recoverAfter: 10 }, 'vmnet') },
  arp: { text: 'RFC 5227 address conflict detection and announcements, in seconds.' },
  'arp.probeWait': { text: 'Random wait before the first probe of a pool address (PROBE_WAIT).', probe: 0.5 },
  'arp.probeNum': { text: 'Probes sent before a pool address is claimed (PROBE_NUM); 0 claims without probing.', probe: 2 },
  'arp.probeMin': { text: 'Least time between probes (PROBE_MIN); at most `arp.probeMax`.', probe: 0.5 },
  'arp.probeMax': { text: 'Most time between probes (PROBE_MAX).', probe: 3 },
  'arp.announceWait': { text: 'Wait after the last probe before the address is announced (ANNOUNCE_WAIT).', probe: 1 },
  'arp.announceNum': { text: 'Gratuitous ARPs sent when a VIP comes up (ANNOUNCE_NUM).', probe: 3 },
  'arp.announceInterval': { text: 'Time between those announcements (ANNOUNCE_INTERVAL).', probe: 1 },
  'arp.refreshInterval': { text: 'A gratuitous ARP for every held VIP this often, so that neighbours that cached the wrong MAC (a split brain, a lost announcement) learn the holder again; 0 turns it off, values between 0 and 0.1 are refused. 10 s is RFC 5227\'s DEFEND_INTERVAL, so an RFC 5227 host never counts the refresh as a conflict.', probe: 20 },
  dhcp: { text: 'The DHCP client of DHCP services (RFC 2131).' },
  'dhcp.retransmitInitial': { text: 'First retransmission wait; it doubles up to `dhcp.retransmitMax` (RFC 2131 §4.1).', probe: 2 },
  'dhcp.retransmitMax': { text: 'Longest retransmission wait.', probe: 32 },
  'dhcp.retransmitJitter': { text: 'Random ± added to each wait.', probe: 0.5 },
  'dhcp.declineWait': { text: 'Wait after a DHCPDECLINE before asking again (RFC 2131 §3.1.5).', probe: 5 },
  'dhcp.maxConcurrentStarts': { text: 'DHCP exchanges in flight at once, so that many services starting together do not flood the server.', probe: 16 },
  'dhcp.probeOffer': { text: 'ARP-probe an offered address before binding it and decline it on a conflict.' },
  'dhcp.allowOtherSubnets': { text: 'Accept a leased address outside the parent NIC\'s subnets (a DHCP relay serving another subnet).' },
  'dhcp.servers': { text: 'Accept answers only from these DHCP server identifiers; empty accepts any server.', probe: ['10.0.0.1'] },
  'dhcp.servers6': { text: 'Accept DHCPv6 answers only from servers with these DUIDs (their SERVERID option); empty accepts any server. A DHCPv6 service\'s status shows the DUID of the server that granted its lease (`serverDuid`), in this form.', probe: ['00:01:00:01:2c:5e:0a:11:02:00:00:00:aa:01'] },
  proxy: { text: 'The userspace proxy data path.' },
  'proxy.algorithm': { text: 'How the proxy picks a backend for a new connection; both honour weights.' },
  'proxy.idleTimeout': { text: 'Seconds an idle proxied connection (or UDP session) is kept.', probe: 60 },
  'proxy.connectTimeout': { text: 'Seconds to wait for a backend to accept; then one retry on another backend.', probe: 1 },
  'proxy.maxConnections': { text: 'Proxied connections at once, all services; beyond it a new client gets a clean close.', unset: '(LimitNOFILE − reserve) / 2, from the descriptor limit', probe: 1000 },
  'proxy.workers': { text: 'Relaying threads, each on its own listening socket of a SO_REUSEPORT group per VIP:port.', unset: 'one per CPU', probe: 3 },
  kernel: { text: 'The kernel data path\'s engine for `sourceIP: snat` flows (docs/datapaths.md "The eBPF NAT engine").' },
  'kernel.engine': { text: 'nft: the nft table with conntrack forwards them; ebpf: the eBPF NAT engine at tc ingress of the parent forwards IPv4 and IPv6 snat flows without conntrack, the nft table behind it everything else (start fails where it cannot load); auto: the engine where it loads (libbpf.so.1, the clang-built object, tcx, a BPF file system at /sys/fs/bpf, which the agent mounts where it may), else the table, the reason in status, the start-up log and `lb-agent check` (finding nat-engine).' },
  'kernel.flowEntries': { text: 'Entries of each of the engine\'s two flow maps (LRU hashes, one per direction of a flow, allocated whole when the engine loads). When full, the least recently used flow loses its entry and is placed again from its next packet.' },
  'kernel.natPorts': { text: 'Source ports the engine takes towards a backend when the client\'s own port is held there by another flow; keep them outside the VM\'s ephemeral range (`net.ipv4.ip_local_port_range`; `lb-agent check` compares).', probe: [62000, 63000] },
  backend: { text: 'This VM as a backend of direct-server-return services of other agents.' },
  'backend.vips': { text: 'Their VIPs: each goes on `lo`, an IPv4 one as a /32 (with `arp_ignore=1`, `arp_announce=2` raised first), an IPv6 one as a /128 (no sysctl: Linux answers neighbour solicitations only for addresses of the interface they arrive on, and `proxy_ndp` stays 0), is adopted on a restart and withdrawn on a stop. A backend-only agent needs no service: `services: []`.', probe: ['10.0.0.50', 'fd00::50'] },
  services: { text: 'The load-balanced services. Required: write `services: []` to run none, so that a truncated file never removes every service.', probe: [] },
  'services[].name': { text: 'The service name (a DNS-1123 label); with `namespace` it identifies the service, its DHCP MAC and client identifier.', probe: 'web2' },
  'services[].namespace': { text: 'The service namespace; it also picks the `cidr-<namespace>` and `range-<namespace>` pools.', probe: 'prod' },
  'services[].ipam': { text: '`dhcp`: a DHCP lease on a macvlan of its own with a stable MAC. `pool`: an address from `pools`. Fixed once the service exists: create a new service to change it.', unset: '`pool` (as in Harvester)' },
  'services[].primaryService': { text: '`namespace/name` or `name` of another service whose VIP this one shares (Share IP); such a service sets no `ipam`, `loadBalancerIP` or `vrid`, and the two may not use the same protocol and port.', probe: 'other' },
  'services[].loadBalancerIP': { text: 'Ask for this exact address, IPv4 or IPv6, of the service\'s family (DHCP option 50, or that pool address).', probe: '10.0.0.205' },
  'services[].loadBalancerIPs': { text: 'Ask for these exact addresses, one per family the service serves (Kubernetes\' words); not with `loadBalancerIP`.', probe: ['10.0.0.206'] },
  'services[].ipFamilies': { text: 'Kubernetes\' `spec.ipFamilies`: the families of the VIPs, the primary first. A dual-stack service is two VIPs, each forwarding to the backends of its own family; the IPv6 one shows in status as `namespace/name@IPv6`. An IPv6 VIP comes from a pool, or with `ipam: dhcp` from a DHCPv6 lease on the same macvlan as the IPv4 lease; under VRRP both VIPs of such a dual-stack DHCP service follow its IPv4 virtual router (see failover).', unset: '`[IPv4]`, or both with a dual-stack policy',
    probeEdit: (f) => { Object.assign(f.services[0]!, { ipFamilies: ['IPv4', 'IPv6'], ipFamilyPolicy: 'PreferDualStack' }); } },
  'services[].ipFamilyPolicy': { text: 'Kubernetes\' `spec.ipFamilyPolicy`. `SingleStack`: one family. `PreferDualStack`: both when a pool of the second family applies, else the first, and status says why. `RequireDualStack`: both, or the file is refused.', unset: '`SingleStack`, or `RequireDualStack` when `ipFamilies` lists two', probe: 'SingleStack' },
  'services[].vrid': { text: 'Another virtual router for this VIP, so that another VM can hold it.', unset: '`failover.vrid`', probe: 52 },
  'services[].priority': { text: 'This VM\'s priority for that virtual router.', unset: '`node.priority`', probe: 150 },
  'services[].annotations': { text: 'The Harvester cloud provider\'s annotations (`cloudprovider.harvesterhci.io/ipam`, `…/primary-service`, `…/healthcheck-port`, `…/healthcheck-success-threshold`, `…/healthcheck-failure-threshold`, `…/healthcheck-periodseconds`, `…/healthcheck-timeoutseconds`), mapped onto the typed keys; a value that disagrees with a typed key is an error.', probe: { 'cloudprovider.harvesterhci.io/healthcheck-periodseconds': '7' } },
  'services[].annotations.<key>': { text: 'One annotation; other keys are kept and ignored.', probe: '8081' },
  'services[].ports': { text: 'The ports the VIP serves; a protocol and port once per service.', probe: [{ port: 82 }] },
  'services[].ports[].name': { text: 'A name for status and metrics.', unset: '`<protocol>-<port>`', probe: 'web' },
  'services[].ports[].port': { text: 'The port on the VIP.', probe: 81 },
  'services[].ports[].protocol': { text: 'TCP or UDP.' },
  'services[].ports[].targetPort': { text: 'The backends\' port; with `sourceIP: preserve` it must equal `port`.', unset: '`port`', probe: 8080 },
  'services[].backends': { text: 'The backends: an IPv4 or IPv6 address, or `{ address, weight, zone }`. Each VIP forwards to the healthy backends of its own family.', probe: ['10.0.0.12'] },
  'services[].backends[].address': { text: 'The backend\'s IPv4 or IPv6 address.', probe: '10.0.0.13' },
  'services[].backends[].weight': { text: 'Its share of new connections relative to the others.', unset: '1', probe: 3 },
  'services[].backends[].zone': { text: 'Its `topology.kubernetes.io/zone`, read by `topology: prefer-zone` and `zone-only`.', probe: 'zone-c' },
  'services[].healthCheck': { text: 'The backends\' health check; the defaults are the Harvester cloud provider\'s.' },
  'services[].healthCheck.enabled': { text: 'Off: every backend counts as healthy.' },
  'services[].healthCheck.type': { text: '`tcp`: a connection attempt (closed with a reset once the backend accepts). `http`: a GET of `http.path`. `https`: the same GET over TLS (`tls`); the handshake counts in `timeoutSeconds`.',
    probeEdit: (f) => { f.services[0]!.healthCheck = { type: 'tcp' }; } },
  'services[].healthCheck.port': { text: 'The port probed.', unset: 'the first port\'s `targetPort`', probe: 9090 },
  'services[].healthCheck.successThreshold': { text: 'Successes in a row that bring a backend in.', probe: 2 },
  'services[].healthCheck.failureThreshold': { text: 'Failures in a row that take a backend out.', probe: 5 },
  'services[].healthCheck.periodSeconds': { text: 'Seconds between probes of a backend.', probe: 2 },
  'services[].healthCheck.timeoutSeconds': { text: 'Seconds a probe may take.', probe: 1 },
  'services[].healthCheck.passiveFailures': { text: 'On the proxy path, failed connects in a row that take a backend out at once (the probe brings it back); 0 turns it off.', probe: 5 },
  'services[].healthCheck.proxyProtocol': { text: 'Probes send the service\'s PROXY protocol header first (v2 LOCAL, or a v1 line with the probe\'s addresses), for a backend that requires it; needs `proxyProtocol` on the service.',
    probeEdit: (f) => { Object.assign(f.services[0]!, { proxyProtocol: 'v2', healthCheck: { proxyProtocol: true } }); } },
  'services[].healthCheck.http': { text: 'The HTTP request and the statuses that pass, with `type: http` or `https`.' },
  'services[].healthCheck.http.path': { text: 'The path requested.', probe: '/healthz' },
  'services[].healthCheck.http.expectStatus': { text: 'The `[low, high]` status range that counts as healthy.', probe: [200, 299] },
  'services[].healthCheck.tls': { text: 'The TLS side of `type: https`. Without `caFile` the backend\'s certificate is not verified (HAProxy\'s `check-ssl verify none`).' },
  'services[].healthCheck.tls.sni': { text: 'The server name sent in the TLS ClientHello (a host name, not an address); with `caFile`, the certificate must also be valid for this name.', unset: 'no server name is sent (as HAProxy\'s `check-ssl` without `check-sni`), and with `caFile` the name is not checked',
    probeEdit: (f) => { f.services[0]!.healthCheck = { type: 'https', tls: { sni: 'web.example' } }; } },
  'services[].healthCheck.tls.caFile': { text: 'A PEM file of CA certificates: the backend\'s certificate must chain to one of them and be within its validity dates. Read at start and at every reload; a missing, unreadable or certificate-less file is a config error.', unset: 'no verification',
    probeEdit: (f) => { f.services[0]!.healthCheck = { type: 'https', tls: { caFile: '/etc/lb-agent/backend-ca.pem' } }; } },
  'services[].sourceIP': { text: '`snat`: replies come back through the agent; backends see the VIP (kernel path) or the node (proxy). `preserve`: direct server return on the kernel path; backends see the client and answer it directly.' },
  'services[].topology': { text: '`any`: every healthy backend. `prefer-zone`: the healthy backends in this node\'s zone while there is one, else all. `zone-only`: only this node\'s zone, else refuse.' },
  'services[].network': { text: 'The network (a key of `networks`) the VIP lives on. A secondary (`primaryService`) is on its primary\'s. Changing it moves the VIP: the old lease or claim is released.', unset: 'the default network (`node.interface`)', probe: 'vmnet' },
  'services[].proxyProtocol': { text: 'Send the PROXY protocol header (`v1` text, TCP only; `v2` binary, TCP and UDP) to the backends first: proxy path only, so `dataplane: auto` then picks the proxy.', unset: 'off', probe: 'v2' },
};

export interface ReferenceEntry {
  readonly path: string;
  readonly type: string;
  /** The default as it would be written in the file, or what unset means; '' when there is none. */
  readonly default: string;
  /** Allowed values, from the schema's range, enum or description. */
  readonly values: string;
  /** 'yes', 'no', or 'no ' + when: from the reload rules. '' for sections. */
  readonly reload: string;
  readonly help: string;
  /** A mapping that holds other keys. */
  readonly section: boolean;
}

/**
 * The CA reader the reference's loader uses: it reads nothing and answers
 * for any path with that path as the digest, so a probe of `caFile` is a
 * change of the config without a file on the machine that builds the docs.
 */
export const referenceCaReader: CaFileReader = (file) => ({ ok: true, pem: '', sha256: file, certificates: 0 });

export interface ReferenceDeps {
  /** The real loader (load.ts buildConfig), reading CA files with referenceCaReader. */
  readonly load: (data: unknown) => LoadResult;
  /** The reload rules (daemon/reconciler.ts refusals). */
  readonly refusals: (running: { config: Desired; dataplane: 'kernel' | 'proxy' }, next: Desired) => ConfigError[];
}

interface Node { path: string; schema: S }

/** Every key of the schema, depth first, in schema order: objects, array items, anyOf branches and open maps (`<key>`). */
export function schemaKeys(schema: S = configSchema): Node[] {
  const out: Node[] = [];
  const seen = new Set<string>();
  const add = (path: string, s: S): void => { if (!seen.has(path)) { seen.add(path); out.push({ path, schema: s }); } };
  const walk = (s: S, path: string): void => {
    for (const b of (s.anyOf as S[] | undefined) ?? []) walk(b, path);
    for (const [k, v] of Object.entries((s.properties as Record<string, S> | undefined) ?? {})) {
      const p = path ? `${path}.${k}` : k;
      add(p, v);
      walk(v, p);
    }
    if (s.items && typeof s.items === 'object') walk(s.items as S, `${path}[]`);
    if (s.additionalProperties && typeof s.additionalProperties === 'object') {
      add(`${path}.<key>`, s.additionalProperties as S);
      walk(s.additionalProperties as S, `${path}.<key>`);
    }
  };
  walk(schema, '');
  return out;
}

const isSection = (s: S): boolean => s.type === 'object' && s.properties !== undefined;

function typeOf(s: S): string {
  if (s.anyOf) return [...new Set((s.anyOf as S[]).map(typeOf))].join(' or ');
  if (s.enum) return 'enum';
  const t = Array.isArray(s.type) ? (s.type as string[]).join(' | ') : String(s.type ?? 'any');
  if (t === 'array') {
    const it = s.items as S | undefined;
    return it ? `list of ${it.anyOf ? 'address or mapping' : typeOf(it)}` : 'list';
  }
  if (t === 'object') return s.properties ? 'mapping' : 'map';
  if (t === 'number' && String(s['x-what'] ?? '').includes('seconds')) return 'seconds';
  return t;
}

function valuesOf(s: S): string {
  if (s.enum) return (s.enum as unknown[]).map((v) => `\`${String(v)}\``).join(', ');
  const parts: string[] = [];
  if (s.minimum !== undefined || s.maximum !== undefined) parts.push(`${String(s.minimum ?? '')}–${String(s.maximum ?? '')}`);
  if (s.minItems !== undefined || s.maxItems !== undefined) {
    parts.push(s.minItems === s.maxItems ? `${String(s.minItems)} items` : `${String(s.minItems ?? 0)}–${String(s.maxItems ?? '')} items`);
  }
  const items = s.items as S | undefined;
  if (items && (items.minimum !== undefined)) parts.push(`each ${valuesOf(items)}`);
  if (s.maxLength !== undefined && s['x-what'] === undefined) parts.push(`at most ${String(s.maxLength)} characters`);
  if (typeof s['x-what'] === 'string' && !/^an? (integer|number of seconds) \(/.test(s['x-what'])) parts.push(s['x-what']);
  return parts.join('; ');
}

function showDefault(v: unknown): string {
  if (v === undefined) return '';
  if (typeof v === 'string') return v === '' ? '`""`' : `\`${v}\``;
  return `\`${JSON.stringify(v)}\``;
}

/** Set `path` (with `[]` meaning the first item) in `obj` to `value`. */
function setPath(obj: S, path: string, value: unknown): void {
  const segs = path.replace(/\[\]/g, '.0').split('.');
  let o: Record<string, unknown> = obj;
  for (const seg of segs.slice(0, -1)) {
    // An open map's key: the probe file's network, else a pool key.
    const key = seg === '<key>' ? (o === obj.networks ? 'vmnet' : 'cidr-prod') : seg;
    if (o[key] === undefined || typeof o[key] !== 'object') o[key] = /^\d+$/.test(segs[segs.indexOf(seg) + 1] ?? '') ? [] : {};
    o = o[key] as Record<string, unknown>;
  }
  const last = segs[segs.length - 1]!;
  o[last === '<key>' ? (path.startsWith('pools') || path.endsWith('pools.<key>') ? 'range-prod' : path === 'networks.<key>' ? 'vmnet' : 'cloudprovider.harvesterhci.io/healthcheck-port') : last] = value;
}

/** The file the reload probe starts from: one pool service with most keys set. */
function probeBase(mode: 'none' | 'vrrp'): S {
  return {
    node: { name: 'worker-1', interface: 'eth0' },
    failover: { mode },
    pools: { 'range-global': '10.0.0.200-10.0.0.220' },
    networks: { vmnet: { interface: 'eth2', pools: { 'range-global': '10.0.1.200-10.0.1.220' }, failover: { vrid: 61 } } },
    services: [{
      name: 'web',
      ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 80 }],
      backends: [{ address: '10.0.0.11', weight: 1, zone: 'zone-a' }],
      healthCheck: { type: 'http', http: { path: '/', expectStatus: [200, 399] } },
    }, { name: 'other', ipam: 'pool', ports: [{ port: 443 }], backends: ['10.0.0.11'] },
    { name: 'edge', network: 'vmnet', ipam: 'pool', ports: [{ port: 443 }], backends: ['10.0.1.11'] }],
  };
}

/** Values to change a key to: its probe, other enum values, the flipped boolean, the ends of its range. */
function candidates(s: S, help: KeyHelp | undefined): unknown[] {
  const out: unknown[] = [];
  if (help?.probe !== undefined) out.push(help.probe);
  if (s.enum) out.push(...(s.enum as unknown[]));
  if (s.type === 'boolean') out.push(true, false);
  if (typeof s.minimum === 'number') out.push(s.minimum);
  if (typeof s.maximum === 'number') out.push(s.maximum);
  return out;
}

const CONTEXTS = [
  { mode: 'none', plane: 'kernel' }, { mode: 'vrrp', plane: 'kernel' },
  { mode: 'none', plane: 'proxy' }, { mode: 'vrrp', plane: 'proxy' },
] as const;

/** Whether a reload applies a change of `path`, asked of the reload rules in every mode. */
function reloadOf(path: string, s: S, deps: ReferenceDeps): string {
  const refusedIn: (typeof CONTEXTS)[number][] = [];
  let probed = false;
  for (const ctx of CONTEXTS) {
    const base = probeBase(ctx.mode);
    const running = deps.load(structuredClone(base));
    if (!running.ok) throw new Error(`reference: the probe's base config does not load: ${running.errors.map((e) => `${e.path}: ${e.message}`).join('; ')}`);
    let refused = false;
    const help = KEY_HELP[path];
    const edits: ((f: S) => void)[] = candidates(s, help).map((v) => (f: S) => setPath(f, path, structuredClone(v)));
    if (help?.probeEdit) edits.push(help.probeEdit as (f: S) => void);
    for (const edit of edits) {
      const next = structuredClone(base);
      edit(next);
      const loaded = deps.load(next);
      if (!loaded.ok) continue;
      if (isDeepStrictEqual(loaded.config, running.config)) continue;
      probed = true;
      if (deps.refusals({ config: running.config, dataplane: ctx.plane }, loaded.config).length > 0) refused = true;
    }
    if (refused) refusedIn.push(ctx);
  }
  if (!probed) return '?';
  if (refusedIn.length === 0) return 'yes';
  if (refusedIn.length === CONTEXTS.length) return 'no';
  const all = (f: (c: (typeof CONTEXTS)[number]) => boolean): boolean => CONTEXTS.filter(f).every((c) => refusedIn.includes(c)) && refusedIn.every(f);
  if (all((c) => c.mode === 'vrrp')) return 'no, with failover.mode vrrp';
  if (all((c) => c.plane === 'kernel')) return 'no, on the kernel path';
  if (all((c) => c.plane === 'proxy')) return 'no, on the proxy path';
  return `no, in: ${refusedIn.map((c) => `${c.plane} path with failover.mode ${c.mode}`).join('; ')}`;
}

/** Every key of the file with its type, default, values, reload rule and help. */
export function configReference(deps: ReferenceDeps, schema: S = configSchema): ReferenceEntry[] {
  return schemaKeys(schema).map(({ path, schema: s }) => {
    const help = KEY_HELP[path];
    const section = isSection(s);
    const unset = help?.unset ? `unset: ${help.unset}` : '';
    return {
      path,
      type: typeOf(s),
      default: s.default !== undefined && !section ? showDefault(s.default) : unset,
      values: valuesOf(s),
      reload: section ? '' : reloadOf(path, s, deps),
      help: help?.text ?? '',
      section,
    };
  });
}

const cell = (s: string): string => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');

export const REFERENCE_HEADER = '<!-- Generated by `npm run docs` from agent/config/schema.ts, defaults.ts, reference.ts and the reload rules; do not edit. -->';

/** docs/configuration.md. */
export function configMarkdown(entries: readonly ReferenceEntry[]): string {
  const out: string[] = [
    REFERENCE_HEADER, '',
    '# Configuration reference', '',
    `The file is \`${DEFAULT_CONFIG_PATH}\` unless \`-c\` names another. It is YAML; unknown keys are errors, every error names the key's path and line, and all errors of a file are reported at once. A file that does not validate is never applied: \`lb-agent validate\` checks one, and a refused reload keeps the running config.`, '',
    'Limits: the file must be a regular file (a symlink to one is fine) of at most 4 MiB, and YAML aliases may be used at most 100 times. `services:` is required.', '',
    'Columns: **default** is what an absent key means; **reload** says whether `lb-agent reload` (or `systemctl reload lb-agent`) applies a change of the key. "no" means the reload is refused with the reason and the running config is kept; `systemctl restart lb-agent` applies it (a restart keeps every VIP serving, see [operations](operations.md#restart)). `services[].ipam` never changes: create a new service instead. Adding or removing a service, or changing its backends, ports or health check, always reloads.', '',
    'Paths: `services[].name` is `name` in each item of `services`; `<key>` is a key you choose.', '',
    'A complete example is [the README\'s](../README.md#a-first-configuration); every key at once is in `examples/config.yaml`.', '',
  ];
  let section = '';
  for (const e of entries) {
    const top = e.path.split(/[.[]/)[0]!;
    if (top !== section) {
      section = top;
      if (out[out.length - 1] !== '') out.push('');
      out.push(`## \`${top}\``, '');
      const topEntry = entries.find((x) => x.path === top);
      if (topEntry?.help) out.push(topEntry.help, '');
      if (!topEntry?.section && topEntry) {
        out.push('| type | default | values | reload |', '| --- | --- | --- | --- |', `| ${cell(topEntry.type)} | ${cell(topEntry.default)} | ${cell(topEntry.values)} | ${topEntry.reload} |`, '');
      }
      out.push('| key | type | default | values | reload | what it does |', '| --- | --- | --- | --- | --- | --- |');
    }
    if (e.path === top) continue;
    out.push(`| \`${e.path}\` | ${cell(e.type)} | ${cell(e.default)} | ${cell(e.values)} | ${e.reload} | ${cell(e.help)} |`);
  }
  // Drop empty tables left by a top-level key with no children.
  const text = out.join('\n').replace(/\| key \| type \| default \| values \| reload \| what it does \|\n\| --- \| --- \| --- \| --- \| --- \| --- \|\n(?=\n|## |$)/g, '');
  return `${text.replace(/\n+$/, '')}\n`;
}

/** Text for roff: backslashes and hyphens escaped, no line starting with a control character. */
function roff(s: string): string {
  return s.replace(/\\/g, '\\e').replace(/-/g, '\\-').replace(/`/g, '').split('\n').map((l) => (/^[.']/.test(l) ? `\\&${l}` : l)).join('\n');
}

/** lb-agent.yaml(5) in man(7) roff. */
export function configMan(entries: readonly ReferenceEntry[], version: string): string {
  const out: string[] = [
    '.\\" lb-agent.yaml(5): generated by `lb-agent man config` from the config schema; do not edit.',
    `.TH LB\\-AGENT.YAML 5 "" "lb-agent ${version}" "File Formats"`,
    '.SH NAME', 'lb\\-agent.yaml \\- configuration file of lb\\-agent(8)',
    '.SH SYNOPSIS', `.I ${roff(DEFAULT_CONFIG_PATH)}`,
    '.SH DESCRIPTION',
    roff('The configuration of the lb-agent daemon, in YAML. Unknown keys are errors; every error names the path of the key and its line; a file that does not validate is never applied (lb-agent validate checks one, and a refused reload keeps the running config). services: is required (services: [] runs none).'),
    '.PP',
    roff('Each key below shows its type, its default, its allowed values, and whether a reload (lb-agent reload, systemctl reload lb-agent) applies a change of it; where it does not, the reload is refused with the reason and a restart (systemctl restart lb-agent, which keeps the VIPs serving) applies it.'),
    '.SH KEYS',
  ];
  for (const e of entries) {
    if (!e.path.includes('.') && !e.path.includes('[')) out.push(`.SS ${roff(e.path)}`);
    const facts = [
      `type: ${e.type}`,
      e.default ? `default: ${e.default.replace(/`/g, '')}` : undefined,
      e.values ? `values: ${e.values.replace(/`/g, '')}` : undefined,
      e.reload ? `reload: ${e.reload}` : undefined,
    ].filter(Boolean).join('; ');
    out.push('.TP', `.B ${roff(e.path)}`, `${roff(e.help)}${e.help ? '\n.br\n' : ''}${roff(facts)}`);
  }
  out.push(
    '.SH EXAMPLE', '.nf',
    roff(['node:', '  interface: eth0', 'pools:', '  range-global: 10.99.0.200-10.99.0.220', 'services:', '  - name: web', '    ipam: pool', '    ports:', '      - { port: 80, targetPort: 8080 }', '    backends: [10.99.0.11, 10.99.0.12]'].join('\n')),
    '.fi',
    '.SH FILES', `.TP\n.I ${roff(DEFAULT_CONFIG_PATH)}\nthe default path`, '.TP\n.I /usr/share/doc/lb\\-agent/config.example.yaml\nevery key, with comments',
    '.SH SEE ALSO', '.BR lb\\-agent (8)', '',
  );
  return out.join('\n');
}
