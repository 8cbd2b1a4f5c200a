// Wiring: builds the real subsystems behind daemon/subsystems.ts from a
// validated config - the rtnetlink client, the parent NIC and its sysctls,
// address sources (DHCP on a macvlan, pool claims on the parent), the health
// checker, the data path chosen by `dataplane:`, and VRRP when enabled.
// The one place that knows every module; the modules know none of each other.
import type { Desired, NetworkSpec, PortSpec, ProxyConfig, ServiceSpec } from '../config/types';
import { DEFAULT_NETWORK, allPools, networksOf } from '../config/networks';
import type { ProxyDataplane } from '../forward/proxy';
import type { NftDataplane } from '../forward/nft';
import type { EbpfNatDataplane } from '../forward/ebpf-nat';
import { LbError, errorMessage } from '../errors';
import { openNetlink } from '../net/netlink/netlink';
import { ParentSysctls } from '../net/sysctl/sysctl';
import { defaultRouteInterface } from '../net/host/route';
import { OWNED_ADDRESS_PROTO, linkNameForService, macForService } from '../net/ownership/ownership';
import { reconcileOwnedLinks } from '../net/ownership/reconcile';
import type { StartLimiter } from '../dhcp/limiter';
import type { SharedLinks } from '../dhcp/shared-link';
import type { DualGate } from '../failover/dual';
import type { NetworkGates } from '../failover/networks';
import type { PriorityTracker } from '../failover/tracker';
import type { LinkEvent } from '../net/netlink/netlink';
import { PoolManager } from '../ipam/manager';
import { PoolSource, linkLocalOf, poolVipPrefix } from '../ipam/pool-source';
import { NeighbourSockets } from '../net/neighbour/neighbour-sockets';
import { AddressRemovals } from '../net/netlink/address-removals';
import { HealthChecker } from '../health/checker';
import { selectDataplane, createDataplane, natEngineChoice, probeNatEngine, detachLeftoverNatEngine, probeNftables, probeDsr, dsrUnavailable, parseDsrEngine, servicesNeedingProxy, placementFor, type ProbeResult } from '../forward/index';
import { familyOf, formatAddress, formatIPv4 } from '../address';
import { familyServiceKey, linkKeyOf, tiedToIpv4 } from '../config/families';
import { BackendVips } from '../net/host/dsr-backend';
import type { Subsystems, ParentLink, DataplaneLike, SubsystemContext } from './subsystems';
import { strayMarkedAddresses } from './drift-plan';

// DHCP and VRRP load when a config uses them, not before (a pool service on
// the kernel path never loads either); a reload that adds the
// first DHCP service loads DHCP then. test/privileged/daemon-start.test.ts
// holds which modules a start loads.
 
const dhcpDriver = (): typeof import('../dhcp/driver') => require('../dhcp/driver') as typeof import('../dhcp/driver');
const dhcpLimiter = (): typeof import('../dhcp/limiter') => require('../dhcp/limiter') as typeof import('../dhcp/limiter');
const dhcpLease = (): typeof import('../dhcp/lease') => require('../dhcp/lease') as typeof import('../dhcp/lease');
const dhcp6Driver = (): typeof import('../dhcp/driver6') => require('../dhcp/driver6') as typeof import('../dhcp/driver6');
const dhcpSharedLink = (): typeof import('../dhcp/shared-link') => require('../dhcp/shared-link') as typeof import('../dhcp/shared-link');
const dhcp6Lease = (): typeof import('../dhcp/lease6') => require('../dhcp/lease6') as typeof import('../dhcp/lease6');
const vrrpGate = (): typeof import('../failover/gate') => require('../failover/gate') as typeof import('../failover/gate');
const networkGates = (): typeof import('../failover/networks') => require('../failover/networks') as typeof import('../failover/networks');
const dualGate = (): typeof import('../failover/dual') => require('../failover/dual') as typeof import('../failover/dual');
const vrrpTracker = (): typeof import('../failover/tracker') => require('../failover/tracker') as typeof import('../failover/tracker');
const driftModule = (): typeof import('./drift') => require('./drift') as typeof import('./drift');
const nftWatchModule = (): typeof import('../net/netlink/nft-watch') => require('../net/netlink/nft-watch') as typeof import('../net/netlink/nft-watch');
 

export async function buildSubsystems(config: Desired, ctx: SubsystemContext): Promise<Subsystems> {
  const { registry, store, clock } = ctx;
  const log = ctx.log;
  const netlink = openNetlink({ log });
  try {
    // Every network's NIC (config/networks.ts), the default network's first:
    // found once, at start; each gets the ARP sysctls that keep it from
    // answering for another NIC's addresses (ARP flux: docs/design.md).
    const parentSysctls = new ParentSysctls();
    const pools = new PoolManager({ pools: allPools(config), store, log, registry, clock });
    // One ARP and one NDP socket per interface for every pool VIP on it, and one refresh timer for all of them.
    const neighbourSockets = new NeighbourSockets({ clock });
    // A stop (or a reload) of many pool services removes their VIPs in a few netlink batches.
    const poolRemovals = new AddressRemovals({ netlink, run: (fn) => pools.serialize(fn) });
    const nets: Array<{ network: NetworkSpec; parent: ParentLink; link: Awaited<ReturnType<typeof netlink.getLink>>; addrs: Awaited<ReturnType<typeof netlink.listAddresses>> }> = [];
    for (const network of networksOf(config)) {
      const parentName = network.interface ?? defaultRouteInterface();
      if (!parentName) {
        throw new LbError('LB_ERR_NET_NO_INTERFACE', 'no parent interface: node.interface is not set and there is no IPv4 default route to take it from; set node.interface in the config');
      }
      const same = nets.find((n) => n.parent.name === parentName);
      if (same) throw new LbError('LB_ERR_NET_NO_INTERFACE', `networks.${network.name} is on ${parentName}, which is also the interface of network ${same.network.name} (${same.network.name === DEFAULT_NETWORK ? 'node.interface, or the default route\'s NIC' : `networks.${same.network.name}`}); each network is a NIC of its own`);
      const link = await netlink.getLink(parentName).catch((e: unknown) => {
        throw network.name === DEFAULT_NETWORK ? e : new LbError('LB_ERR_NET_NO_INTERFACE', `networks.${network.name}.interface ${parentName}: ${errorMessage(e)}`);
      });
      const addrs = await netlink.listAddresses(link.index);
      const primary = addrs.find((a) => a.prefix < 32) ?? addrs[0];
      const parent: ParentLink = { name: link.name, index: link.index, mac: link.mac, address: primary?.address };
      const changes = await parentSysctls.apply(parent.name);
      if (changes.length > 0) log.info({ module: 'net', op: 'sysctl', ifname: parent.name, network: network.name, changes }, 'set ARP sysctls on the parent (ARP flux: docs/design.md)');
      // The node's own addresses are never handed out of a pool.
      pools.setReserved(addrs.filter((a) => a.prefix < (familyOf(a.address) === 'IPv6' ? 128 : 32)).map((a) => a.address), network.name);
      nets.push({ network, parent, link, addrs });
    }
    const { parent } = nets[0]!;
    const byNetwork = new Map(nets.map((n) => [n.network.name, n]));
    /** The NIC of a service's network (load.ts refuses an unknown one). */
    const netOf = (spec: Pick<ServiceSpec, 'network'>): (typeof nets)[number] => byNetwork.get(spec.network ?? DEFAULT_NETWORK) ?? nets[0]!;
    const parentOf = (spec: Pick<ServiceSpec, 'network'>): ParentLink => netOf(spec).parent;
    /**
     * What these services account for of the agent's own objects: the
     * macvlan of each DHCP service (its name, with the service key) and the
     * address each pool service claims, on its own network's NIC (by
     * ifindex). The start's adoption and the drift guard take anything else
     * of the agent's for a leftover. Throws when the claims cannot be read.
     */
    const accountedFor = (services: readonly ServiceSpec[]): { links: Map<string, string>; claims: Map<number, Set<string>> } => {
      const links = new Map<string, string>();
      const claims = new Map<number, Set<string>>(nets.map((n) => [n.parent.index, new Set<string>()]));
      for (const s of services) {
        if (s.primaryService !== undefined) continue;
        if (s.ipam === 'dhcp') links.set(linkNameForService(linkKeyOf(s.key)), linkKeyOf(s.key));
        else {
          const claim = pools.claimOf(s.key);
          if (claim) claims.get(parentOf(s).index)!.add(claim.address);
        }
      }
      return { links, claims };
    };
    const nics = nets.map((n) => ({ name: n.parent.name, index: n.parent.index }));
    const health = new HealthChecker({ registry, clock, log });
    // Under VRRP a takeover must not wait: the concurrency bound still keeps
    // many services from storming the server, but starts get no random delay.
    const vrrp = config.failover.mode === 'vrrp';
    // One limiter for every DHCP service of the agent, made with the first.
    let limiterSettings = { max: config.dhcp.maxConcurrentStarts, jitterMs: vrrp ? 0 : config.dhcp.retransmitJitter * 1000 };
    let limiter: StartLimiter | undefined;
    const startLimiter = (): StartLimiter => (limiter ??= new (dhcpLimiter().StartLimiter)({ ...limiterSettings, clock }));
    // A dual-stack DHCP service's two sources and their one macvlan: the DHCPv4 source tells the DHCPv6 one when it comes up.
    let links: SharedLinks | undefined;
    const sharedLinks = (): SharedLinks => (links ??= new (dhcpSharedLink().SharedLinks)());
    // How new connections are placed (forward/dataplane.ts placementFor); the probe loads that too.
    const placement = placementFor(config.failover.mode);
    const selection = await selectDataplane(config.dataplane, () => probeNftables(placement), servicesNeedingProxy(config.services));
    log.info({ module: 'forward', op: 'select', kind: selection.kind, reason: selection.reason }, `data path: ${selection.kind} (${selection.reason})`);
    // Direct server return: probed once, when a service first asks
    // for it; a config that asks on a node that cannot is refused at start.
    let dsrProbe: Promise<ProbeResult> | undefined;
    const dsr = (): Promise<ProbeResult> => (dsrProbe ??= probeDsr());
    if (config.services.some((sv) => sv.sourceIP === 'preserve')) {
      const why = dsrUnavailable(selection.kind, selection.kind === 'kernel' ? await dsr() : undefined);
      if (why) {
        throw new LbError('LB_ERR_FORWARD_DSR_UNSUPPORTED', `${why}; services with sourceIP: preserve cannot be served here: set sourceIP: snat on them, or run on a kernel with nftables netdev support (lb-agent check says what is missing)`);
      }
      log.info({ module: 'forward', op: 'select', dsr: 'ok' }, 'direct server return: the kernel passed the probe');
      // The BPF program in front of the table: whether it can run
      // here, said at start; the data path falls back to the table when not.
      if (parseDsrEngine(process.env['LB_AGENT_DSR_ENGINE']) === 'auto') {
         
        const why = (require('../net/ebpf/ebpf-attach') as typeof import('../net/ebpf/ebpf-attach')).probeDsrBpfHere();
        if (why === undefined) log.info({ module: 'forward', op: 'select', dsrEngine: 'bpf' }, 'direct server return: the BPF program loads and attaches at tc ingress (tcx); it forwards in front of the nft table');
        else log.warn({ module: 'forward', op: 'select', dsrEngine: 'nft', reason: why }, `direct server return: the BPF program cannot run here (${why}); the nft table forwards alone (correct, slower). lb-agent check says why`);
      }
    }
    // The eBPF NAT engine in front of the nft table (kernel.engine).
    // Beside the DSR program at the same hook where DSR ports are forwarded (and the program would serve them).
    const withDsr = config.services.some((sv) => sv.sourceIP === 'preserve') && parseDsrEngine(process.env['LB_AGENT_DSR_ENGINE']) === 'auto';
    const nat = selection.kind === 'kernel' ? natEngineChoice(config.kernel.engine, () => probeNatEngine(parent.name, { mount: true, withDsr })) : undefined;
    if (nat) log.info({ module: 'forward', op: 'select', natEngine: nat.use ? 'ebpf' : 'nft', reason: nat.reason }, `snat flows: ${nat.use ? 'the eBPF NAT engine' : 'the nft table'} (${nat.reason})`);
    if (nat && !nat.use) {
      const left = detachLeftoverNatEngine(parent.name, { pinnedOnly: config.kernel.engine === 'nft' });
      if (typeof left === 'number' && left > 0) log.warn({ module: 'forward', op: 'select', natEngine: 'nft', detached: left }, `detached the eBPF NAT engine an earlier run left on ${parent.name}: the nft table forwards alone`);
    }
    const dp = createDataplane(selection, {
      natEngine: nat?.use ? { device: parent.name, kernel: config.kernel } : undefined,
      proxy: config.proxy, registry, log, clock, listenerStore: ctx.listenerStore, dsrDevice: parent.name,
      dsrEngine: process.env['LB_AGENT_DSR_ENGINE'],
      placement,
      onConnectResult: (key, address, ok) => {
        if (ok) health.reportConnectSuccess(key, address);
        else health.reportConnectFailure(key, address, 'refused');
      },
    });
    const dataplane: DataplaneLike = {
      kind: selection.kind,
      reason: selection.reason,
      apply: (services) => dp.apply({ services }),
      ...(dp.kind === 'proxy' ? { reconfigure: (proxy: ProxyConfig) => (dp as ProxyDataplane).reconfigure(proxy) } : {}),
      ...(dp.kind === 'kernel' ? { dsrEngine: () => (dp as NftDataplane).dsr, statsProblem: () => (dp as Partial<NftDataplane>).statsProblem?.(), natEngine: () => (dp as Partial<EbpfNatDataplane>).engineState ?? (nat ? { engine: 'nft' as const, reason: nat.reason } : undefined), placement, vipArrived: (vip: string, ports: readonly PortSpec[]) => (dp as NftDataplane).vipArrived(vip, ports) } : {}),
      stop: (o) => dp.stop(o),
      dsr: () => (selection.kind === 'kernel' ? dsr() : Promise.resolve({ ok: false, reason: 'the userspace proxy is running' })),
    };

    let failover: DualGate | NetworkGates | undefined;
    let tracking: Tracking | undefined;
    if (config.failover.mode === 'vrrp') {
      // Each network's tracks lower that network's routers, both families': one tracker per network.
      tracking = await startTracking(config, { netlink, health, log, registry, clock });
      // One VRRP instance per network and family: each network's on its own
      // VRRP interface with its VRIDs and peers; IPv4 and IPv6 elect apart
      // (RFC 5798 §5.1).
      const ipv6Vips = config.services.some((s) => s.family === 'IPv6');
      const gates = new Map<string, DualGate>();
      for (const n of nets) {
        const ifname = n.network.failover.interface ?? n.parent.name;
        const vlink = ifname === n.parent.name ? n.link : await netlink.getLink(ifname);
        const vaddrs = ifname === n.parent.name ? n.addrs : await netlink.listAddresses(vlink.index);
        const src = vaddrs.find((a) => a.prefix < 32)?.address;
        const where = n.network.name === DEFAULT_NETWORK ? 'failover.interface' : `networks.${n.network.name}.failover.interface`;
        if (!src) throw new LbError('LB_ERR_NET_NO_INTERFACE', `VRRP interface ${ifname} has no IPv4 address to send advertisements from; give it one or set ${where}`);
        // RFC 5798 §5.1.2.1: IPv6 adverts leave from the interface's link-local address.
        const ll = linkLocalOf(await netlink.listAddresses(vlink.index, 'IPv6'));
        // A dual-stack DHCP service's IPv6 VIP rides its IPv4 router (failover/dual.ts): no IPv6 advert for it.
        const mineV6 = ipv6Vips && config.services.some((s) => s.family === 'IPv6' && (s.network ?? DEFAULT_NETWORK) === n.network.name && tiedToIpv4(s) === undefined);
        if (ll === undefined && mineV6) {
          throw new LbError('LB_ERR_NET_NO_INTERFACE', `VRRP interface ${ifname} has no IPv6 link-local address to send IPv6 advertisements from (RFC 5798 §5.1.2.1), and services have IPv6 VIPs; enable IPv6 on it (net.ipv6.conf.${ifname}.disable_ipv6=0, addr_gen_mode 0) or set ${where}`);
        }
        const netLog = nets.length > 1 ? log.child({ network: n.network.name }) : log;
        const gate = (family: 'IPv4' | 'IPv6', srcIp: string) => new (vrrpGate().VrrpGate)({
          config: { ...config.failover, ...n.network.failover }, nodePriority: config.node.priority, family, ifindex: vlink.index, ifname, ifMac: vlink.mac, srcIp, log: netLog, registry, clock,
          tracker: tracking?.of(n.network.name), network: n.network.name,
        });
        gates.set(n.network.name, new (dualGate().DualGate)({
          ipv4: gate('IPv4', src),
          ipv6: ll === undefined ? undefined : gate('IPv6', formatAddress({ family: 'IPv6', value: ll })),
          log: netLog,
        }));
      }
      failover = gates.size === 1 ? gates.get(DEFAULT_NETWORK)! : new (networkGates().NetworkGates)(gates);
    }

    return {
      parent,
      parentOf,
      networks: nets.map((n) => ({ name: n.network.name, parent: n.parent })),
      health,
      dataplane,
      failover,
      backend: new BackendVips({ netlink, log }),
      // Under VRRP the election decides who holds a VIP: a takeover serves
      // the saved lease (or the address the previous Master advertised) at
      // once and confirms it, and an offer is not ARP-probed, nor a DHCPv6
      // grant checked by duplicate address detection (the previous Master's stale ARP entries would only delay
      // it by seconds; the VIP owner still defends the address once held).
      // `now` is the config in force when the service is created (a reload's
      // new one for a service it adds): timings and the DHCP allow-list
      // come from it, never from the config read at start.
      createSource: (spec: ServiceSpec, now: Desired) => (spec.ipam === 'dhcp' && spec.family === 'IPv6'
        ? dhcp6Driver().createDhcp6Source({
          // A dual-stack DHCP service: its DHCPv4 source owns the one macvlan both leases ride.
          service: spec, parent: parentOf(spec).name, arp: now.arp, sharedLink: spec.ipFamilies?.includes('IPv4') ?? false,
          linkEvents: sharedLinks().of(linkKeyOf(spec.key)),
          store, netlink, log, registry, clock, guard: dhcp6Driver().guard6Of(now.dhcp), resumeSaved: vrrp,
        })
        : spec.ipam === 'dhcp'
        ? dhcpDriver().createDhcpSource({
          service: spec, parent: parentOf(spec).name, timings: vrrp ? { ...now.dhcp, probeOffer: false } : now.dhcp, arp: now.arp,
          store, netlink, log, registry, clock, limiter: startLimiter(), parentSysctls, resumeSaved: vrrp,
          ...(spec.ipFamilies?.includes('IPv6') ? { sharedLink: sharedLinks().of(linkKeyOf(spec.key)) } : {}),
          guard: { allowOtherSubnets: now.dhcp.allowOtherSubnets, servers: now.dhcp.servers },
        })
        : new PoolSource({ service: spec, parentIfname: parentOf(spec).name, manager: pools, arp: now.arp, netlink, log, registry, clock, probe: !vrrp, sockets: neighbourSockets, removals: poolRemovals })),
      watchKernel: ({ configured, ...hooks }) => new (driftModule().DriftGuard)({
        ...hooks, netlink, log, registry, clock,
        wanted: () => {
          // Claims that cannot be read: nothing is taken for a leftover.
          try {
            const a = accountedFor(configured());
            return { links: new Set(a.links.keys()), addresses: a.claims };
          } catch { return undefined; }
        },
        parent: nics[0]!,
        networkParents: nics.slice(1),
        ...(dp.kind === 'kernel' ? { tables: dp as NftDataplane | EbpfNatDataplane, nftWatch: () => new (nftWatchModule().NftWatcher)({ log }) } : {}),
      }),
      observeHeld: async (services) => {
        const held = new Map<string, string>();
        if (vrrp) return held;
        const all = [...await netlink.listAddresses(), ...await netlink.listAddresses(undefined, 'IPv6')];
        const on = (index: number, address: string): boolean => all.some((a) => a.index === index && a.address === address && a.prefix === poolVipPrefix(familyOf(address) ?? 'IPv4'));
        const wallOffset = clock.wallNow() - clock.now();
        for (const s of services) {
          if (s.primaryService !== undefined) continue;
          if (s.ipam === 'dhcp' && s.family === 'IPv6') {
            const linkKey = linkKeyOf(s.key);
            const { duidForService } = require('../dhcp/duid') as typeof import('../dhcp/duid');
            const lease6 = dhcp6Lease();
            const lease = lease6.fromStored6(store.read(lease6.lease6FileName(linkKey)), linkKey, duidForService(linkKey), wallOffset);
            const link = lease && lease.expiresAt > clock.now() ? await netlink.findLink(linkNameForService(linkKey)) : undefined;
            const address = lease ? formatAddress({ family: 'IPv6', value: lease.address }) : undefined;
            if (address && link && link.mac === macForService(linkKey) && on(link.index, address)) held.set(s.key, address);
          } else if (s.ipam === 'dhcp') {
            const { lease } = dhcpLease().readSavedLease(store, s.key, macForService(s.key), wallOffset);
            const link = lease && lease.expiresAt > clock.now() ? await netlink.findLink(linkNameForService(s.key)) : undefined;
            if (lease && link && link.mac === macForService(s.key) && on(link.index, formatIPv4(lease.address))) held.set(s.key, formatIPv4(lease.address));
          } else {
            const claim = pools.claimOf(s.key);
            if (claim && on(parentOf(s).index, claim.address)) held.set(s.key, claim.address);
          }
        }
        return held;
      },
      adoptOwned: async (services) => {
        const accounted = accountedFor(services);
        const specOf = new Map(services.map((s) => [s.key, s]));
        const wanted = new Map([...accounted.links].map(([name, key]) => [name, { mac: macForService(key), parent: parentOf(specOf.get(key) ?? {}).name }]));
        const res = await reconcileOwnedLinks(netlink, wanted, { log });
        // Pool VIPs of services no longer configured: their claims go, and
        // the address an earlier run left on the parent goes with them.
        const pruned = pools.pruneClaims(services.filter((s) => s.primaryService === undefined && s.ipam === 'pool').map((s) => s.key));
        const removedAddrs: string[] = [];
        const leftovers: Array<{ index: number; address: string; prefix: number; why: string }> = [];
        // A removed service's network is not known any more: its address goes from whichever NIC has it.
        for (const [svc, claim] of pruned) {
          for (const n of nets) leftovers.push({ index: n.parent.index, address: claim.address, prefix: poolVipPrefix(familyOf(claim.address) ?? 'IPv4'), why: `${claim.address} (${svc})` });
        }
        // Every address an earlier run added carries the ownership mark: one
        // on a NIC that no wanted claim explains is a leftover (a claim lost
        // to a crash, a reload that raced, a stop whose removal failed),
        // withdrawn now. A claim is wanted on its own network's NIC only: on
        // another it is a leftover too. The running drift guard decides the
        // same way (drift-plan.ts strayMarkedAddresses).
        const marked = new Map<number, string[]>();
        for (const n of nics) {
          marked.set(n.index, [...await netlink.listAddresses(n.index), ...await netlink.listAddresses(n.index, 'IPv6')]
            .filter((a) => a.proto === OWNED_ADDRESS_PROTO).map((a) => `${a.address}/${a.prefix}`));
        }
        const pruning = new Set(leftovers.map((l) => `${l.index} ${l.address}/${l.prefix}`));
        for (const a of strayMarkedAddresses(nics, marked, accounted.claims)) {
          if (!pruning.has(`${a.ifindex} ${a.cidr}`)) leftovers.push({ index: a.ifindex, address: a.address, prefix: a.prefix, why: `${a.cidr} (marked as the agent's, no claim wants it on ${a.ifname})` });
        }
        // In netlink batches: a crash under a thousand VIPs leaves a thousand to take back.
        (await netlink.removeAddresses(leftovers).catch(() => [])).forEach((r, i) => { if (r === true) removedAddrs.push(leftovers[i]!.why); });
        // With VRRP this node starts as Backup: a pool VIP an earlier run left
        // on the parent (a crash) would answer ARP for it - and refuse
        // connections - while another node is Master, and make that Master's
        // RFC 5227 probe see a conflict. The source puts it back when this
        // node becomes Master.
        if (config.failover.mode === 'vrrp') {
          const onParent = new Map<number, Set<string>>();
          for (const n of nets) {
            onParent.set(n.parent.index, new Set([...await netlink.listAddresses(n.parent.index), ...await netlink.listAddresses(n.parent.index, 'IPv6')]
              .filter((a) => a.prefix === poolVipPrefix(familyOf(a.address) ?? 'IPv4')).map((a) => a.address)));
          }
          for (const s of services) {
            const claim = s.primaryService === undefined && s.ipam === 'pool' ? pools.claimOf(s.key) : undefined;
            const p = parentOf(s);
            if (claim && onParent.get(p.index)?.has(claim.address) && await netlink.removeAddress(p.index, claim.address, poolVipPrefix(familyOf(claim.address) ?? 'IPv4')).catch(() => false)) {
              removedAddrs.push(`${claim.address} (${s.key}, VRRP Backup until elected)`);
            }
          }
        }
        return {
          adopted: res.adopted.map((l) => l.name),
          removed: [...res.removed.map((l) => l.name), ...removedAddrs],
        };
      },
      reconfigure: (next) => {
        pools.setPools(allPools(next));
        limiterSettings = { max: next.dhcp.maxConcurrentStarts, jitterMs: vrrp ? 0 : next.dhcp.retransmitJitter * 1000 };
        limiter?.reconfigure(limiterSettings);
      },
      retrack: async (next) => { await tracking?.reconfigure(next); },
      netlinkCounts: () => netlink.counts(),
      close: async () => { tracking?.close(); netlink.close(); },
    };
  } catch (e) {
    netlink.close();
    throw e;
  }
}

/** Every network's tracker, and what feeds them. */
interface Tracking {
  of(network: string): PriorityTracker | undefined;
  /** A reload's tracks, each network's to its tracker. */
  reconfigure(next: Desired): Promise<void>;
  close(): void;
}

/**
 * Each network's tracks observed (failover.track for the default network,
 * networks.<name>.failover.track for a named one): one tracker per network,
 * empty ones too, so a reload can add the first track. Tracked links
 * through one rtnetlink watch for all of them (opened once any network
 * tracks an interface; a read at start and after lost notifications),
 * tracked services through the health checker's verdicts.
 */
async function startTracking(config: Desired, o: {
  netlink: ReturnType<typeof openNetlink>; health: HealthChecker; log: import('../log').Logger;
  registry: import('prom-client').Registry; clock: import('../clock').Clock;
}): Promise<Tracking> {
  const { PriorityTracker } = vrrpTracker();
  const backends = (key: string): { up: number; unknown: number; total: number } => {
    let up = 0, unknown = 0, total = 0;
    for (const k of [key, familyServiceKey(key, 'IPv6')]) {
      for (const b of o.health.status(k)) {
        total++;
        if (b.state === 'up') up++;
        else if (b.state === 'unknown') unknown++;
      }
    }
    return { up, unknown, total };
  };
  const trackers = new Map(networksOf(config).map((n) => [n.name, new PriorityTracker({
    track: n.failover.track, network: n.name, log: n.name === DEFAULT_NETWORK ? o.log : o.log.child({ network: n.name }), registry: o.registry, clock: o.clock,
    readLink: (name) => o.netlink.findLink(name),
    backends,
  })]));
  const all = [...trackers.values()];
  const onVerdict = (key: string): void => { for (const t of all) t.serviceChanged(key); };
  o.health.on('verdict', onVerdict);
  o.health.on('change', onVerdict);
  let watch: ReturnType<typeof o.netlink.watch> | undefined;
  // Opened before the links are read, so that no change falls between a read and the watch.
  const watchLinks = (c: Desired): void => {
    if (watch || !networksOf(c).some((n) => n.failover.track.interfaces.length > 0)) return;
    watch = o.netlink.watch();
    watch.on('link', (ev: LinkEvent) => { for (const t of all) t.linkChanged(ev.link.name, ev.type === 'del' ? undefined : ev.link); });
    watch.on('resync', () => { for (const t of all) void t.resync(); });
  };
  watchLinks(config);
  await Promise.all(all.map((t) => t.start()));
  for (const t of all) t.publish();
  return {
    of: (network) => trackers.get(network),
    reconfigure: async (next) => {
      watchLinks(next);
      // Networks come and go only with a restart (daemon/reconciler.ts refuses it).
      await Promise.all(networksOf(next).map((n) => trackers.get(n.name)?.reconfigure(n.failover.track) ?? Promise.resolve()));
    },
    close: () => {
      watch?.close();
      o.health.off('verdict', onVerdict);
      o.health.off('change', onVerdict);
      for (const t of all) t.stop();
    },
  };
}
