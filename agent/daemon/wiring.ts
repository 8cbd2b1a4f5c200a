// Wiring: builds the real subsystems behind daemon/subsystems.ts from a
// validated config - the rtnetlink client, the parent NIC and its sysctls,
// address sources (DHCP on a macvlan, pool claims on the parent), the health
// checker, the data path chosen by `dataplane:`, and VRRP when enabled.
// The one place that knows every module; the modules know none of each other.
import type { Desired, PortSpec, ProxyConfig, ServiceSpec } from '../config/types';
import type { ProxyDataplane } from '../forward/proxy';
import type { NftDataplane } from '../forward/nft';
import { LbError } from '../errors';
import { openNetlink } from '../net/netlink/netlink';
import { ParentSysctls } from '../net/sysctl/sysctl';
import { defaultRouteInterface } from '../net/host/route';
import { OWNED_ADDRESS_PROTO, linkNameForService, macForService } from '../net/ownership/ownership';
import { reconcileOwnedLinks } from '../net/ownership/reconcile';
import type { StartLimiter } from '../dhcp/limiter';
import type { VrrpGate } from '../failover/gate';
import { PoolManager } from '../ipam/manager';
import { PoolSource, poolVipPrefix } from '../ipam/pool-source';
import { HealthChecker } from '../health/checker';
import { selectDataplane, createDataplane, natEngineChoice, probeNatEngine, probeNftables, probeDsr, dsrUnavailable, parseDsrEngine, servicesNeedingProxy, placementFor, type ProbeResult } from '../forward/index';
import { familyOf, formatIPv4 } from '../address';
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
const vrrpGate = (): typeof import('../failover/gate') => require('../failover/gate') as typeof import('../failover/gate');
const driftModule = (): typeof import('./drift') => require('./drift') as typeof import('./drift');
const nftWatchModule = (): typeof import('../net/netlink/nft-watch') => require('../net/netlink/nft-watch') as typeof import('../net/netlink/nft-watch');
 

export async function buildSubsystems(config: Desired, ctx: SubsystemContext): Promise<Subsystems> {
  const { registry, store, clock } = ctx;
  const log = ctx.log;
  const netlink = openNetlink({ log });
  try {
    const parentName = config.node.interface ?? defaultRouteInterface();
    if (!parentName) {
      throw new LbError('LB_ERR_NET_NO_INTERFACE', 'no parent interface: node.interface is not set and there is no IPv4 default route to take it from; set node.interface in the config');
    }
    const link = await netlink.getLink(parentName);
    const addrs = await netlink.listAddresses(link.index);
    const primary = addrs.find((a) => a.prefix < 32) ?? addrs[0];
    const parent: ParentLink = { name: link.name, index: link.index, mac: link.mac, address: primary?.address };
    const parentSysctls = new ParentSysctls();
    const changes = await parentSysctls.apply(parent.name);
    if (changes.length > 0) log.info({ module: 'net', op: 'sysctl', ifname: parent.name, changes }, 'set ARP sysctls on the parent (ARP flux: docs/design.md)');

    const pools = new PoolManager({ pools: config.pools, store, log, registry, clock });
    // The node's own addresses are never handed out of a pool.
    pools.setReserved(addrs.filter((a) => a.prefix < (familyOf(a.address) === 'IPv6' ? 128 : 32)).map((a) => a.address));
    /**
     * What these services account for of the agent's own objects: the
     * macvlan of each DHCP service (its name, with the service key) and the
     * address each pool service claims. The start's adoption and the drift
     * guard take anything else of the agent's for a leftover. Throws when
     * the claims cannot be read.
     */
    const accountedFor = (services: readonly ServiceSpec[]): { links: Map<string, string>; claims: Set<string> } => {
      const links = new Map<string, string>();
      const claims = new Set<string>();
      for (const s of services) {
        if (s.primaryService !== undefined) continue;
        if (s.ipam === 'dhcp') links.set(linkNameForService(s.key), s.key);
        else {
          const claim = pools.claimOf(s.key);
          if (claim) claims.add(claim.address);
        }
      }
      return { links, claims };
    };
    const health = new HealthChecker({ registry, clock, log });
    // Under VRRP a takeover must not wait: the concurrency bound still keeps
    // many services from storming the server, but starts get no random delay.
    const vrrp = config.failover.mode === 'vrrp';
    // One limiter for every DHCP service of the agent, made with the first.
    let limiterSettings = { max: config.dhcp.maxConcurrentStarts, jitterMs: vrrp ? 0 : config.dhcp.retransmitJitter * 1000 };
    let limiter: StartLimiter | undefined;
    const startLimiter = (): StartLimiter => (limiter ??= new (dhcpLimiter().StartLimiter)({ ...limiterSettings, clock }));
    // How new connections are placed (forward/dataplane.ts placementFor); the probe loads that too.
    const placement = placementFor(config.failover.mode);
    const selection = await selectDataplane(config.dataplane, () => probeNftables(placement), servicesNeedingProxy(config.services));
    log.info({ module: 'forward', op: 'select', kind: selection.kind, reason: selection.reason }, `data path: ${selection.kind} (${selection.reason})`);
    const six = config.services.filter((sv) => sv.family === 'IPv6').map((sv) => sv.key);
    if (selection.kind === 'proxy' && six.length > 0) {
      throw new LbError('LB_ERR_FORWARD_PROXY_FAMILY', `${six.join(', ')} ${six.length === 1 ? 'has an IPv6 VIP' : 'have IPv6 VIPs'}, and the data path is the userspace proxy (${selection.reason}), which listens on IPv4 VIPs only: make the kernel path work (lb-agent check says what is missing), or serve ${six.length === 1 ? 'it' : 'them'} IPv4 only`);
    }
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
    const nat = selection.kind === 'kernel' ? natEngineChoice(config.kernel.engine, () => probeNatEngine(parent.name)) : undefined;
    if (nat) log.info({ module: 'forward', op: 'select', natEngine: nat.use ? 'ebpf' : 'nft', reason: nat.reason }, `snat flows: ${nat.use ? 'the eBPF NAT engine' : 'the nft table'} (${nat.reason})`);
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
      ...(dp.kind === 'kernel' ? { dsrEngine: () => (dp as NftDataplane).dsr, placement, vipArrived: (vip: string, ports: readonly PortSpec[]) => (dp as NftDataplane).vipArrived(vip, ports) } : {}),
      stop: (o) => dp.stop(o),
      dsr: () => (selection.kind === 'kernel' ? dsr() : Promise.resolve({ ok: false, reason: 'the userspace proxy is running' })),
    };

    let failover: VrrpGate | undefined;
    if (config.failover.mode === 'vrrp') {
      const ifname = config.failover.interface ?? parent.name;
      const vlink = ifname === parent.name ? link : await netlink.getLink(ifname);
      const vaddrs = ifname === parent.name ? addrs : await netlink.listAddresses(vlink.index);
      const src = vaddrs.find((a) => a.prefix < 32)?.address;
      if (!src) throw new LbError('LB_ERR_NET_NO_INTERFACE', `VRRP interface ${ifname} has no IPv4 address to send advertisements from; give it one or set failover.interface`);
      failover = new (vrrpGate().VrrpGate)({ config: config.failover, nodePriority: config.node.priority, ifindex: vlink.index, ifname, ifMac: vlink.mac, srcIp: src, log, registry, clock });
    }

    return {
      parent,
      health,
      dataplane,
      failover,
      backend: new BackendVips({ netlink, log }),
      // Under VRRP the election decides who holds a VIP: a takeover serves
      // the saved lease at once and confirms it, and an offer is not
      // ARP-probed (the previous Master's stale ARP entries would only delay
      // it by seconds; the VIP owner still defends the address once held).
      // `now` is the config in force when the service is created (a reload's
      // new one for a service it adds): timings and the DHCP allow-list
      // come from it, never from the config read at start.
      createSource: (spec: ServiceSpec, now: Desired) => (spec.ipam === 'dhcp'
        ? dhcpDriver().createDhcpSource({
          service: spec, parent: parent.name, timings: vrrp ? { ...now.dhcp, probeOffer: false } : now.dhcp, arp: now.arp,
          store, netlink, log, registry, clock, limiter: startLimiter(), parentSysctls, resumeSaved: vrrp,
          guard: { allowOtherSubnets: now.dhcp.allowOtherSubnets, servers: now.dhcp.servers },
        })
        : new PoolSource({ service: spec, parentIfname: parent.name, manager: pools, arp: now.arp, netlink, log, registry, clock, probe: !vrrp })),
      watchKernel: ({ configured, ...hooks }) => new (driftModule().DriftGuard)({
        ...hooks, netlink, log, registry, clock,
        wanted: () => {
          // Claims that cannot be read: nothing is taken for a leftover.
          try {
            const a = accountedFor(configured());
            return { links: new Set(a.links.keys()), addresses: a.claims };
          } catch { return undefined; }
        },
        parent: { name: parent.name, index: parent.index },
        ...(dp.kind === 'kernel' ? { tables: dp as NftDataplane, nftWatch: () => new (nftWatchModule().NftWatcher)({ log }) } : {}),
      }),
      observeHeld: async (services) => {
        const held = new Map<string, string>();
        if (vrrp) return held;
        const all = [...await netlink.listAddresses(), ...await netlink.listAddresses(undefined, 'IPv6')];
        const on = (index: number, address: string): boolean => all.some((a) => a.index === index && a.address === address && a.prefix === poolVipPrefix(familyOf(address) ?? 'IPv4'));
        const wallOffset = clock.wallNow() - clock.now();
        for (const s of services) {
          if (s.primaryService !== undefined) continue;
          if (s.ipam === 'dhcp') {
            const { lease } = dhcpLease().readSavedLease(store, s.key, macForService(s.key), wallOffset);
            const link = lease && lease.expiresAt > clock.now() ? await netlink.findLink(linkNameForService(s.key)) : undefined;
            if (lease && link && link.mac === macForService(s.key) && on(link.index, formatIPv4(lease.address))) held.set(s.key, formatIPv4(lease.address));
          } else {
            const claim = pools.claimOf(s.key);
            if (claim && on(parent.index, claim.address)) held.set(s.key, claim.address);
          }
        }
        return held;
      },
      adoptOwned: async (services) => {
        const accounted = accountedFor(services);
        const wanted = new Map([...accounted.links].map(([name, key]) => [name, { mac: macForService(key), parent: parent.name }]));
        const res = await reconcileOwnedLinks(netlink, wanted, { log });
        // Pool VIPs of services no longer configured: their claims go, and
        // the address an earlier run left on the parent goes with them.
        const pruned = pools.pruneClaims(services.filter((s) => s.primaryService === undefined && s.ipam === 'pool').map((s) => s.key));
        const removedAddrs: string[] = [];
        for (const [svc, claim] of pruned) {
          if (await netlink.removeAddress(parent.index, claim.address, poolVipPrefix(familyOf(claim.address) ?? 'IPv4')).catch(() => false)) removedAddrs.push(`${claim.address} (${svc})`);
        }
        // Every address an earlier run added carries the ownership mark: one
        // on the parent that no wanted claim explains is a leftover (a claim
        // lost to a crash, a reload that raced), withdrawn now.
        const wantedClaims = accounted.claims;
        const marked = [...await netlink.listAddresses(parent.index), ...await netlink.listAddresses(parent.index, 'IPv6')]
          .filter((a) => a.proto === OWNED_ADDRESS_PROTO).map((a) => `${a.address}/${a.prefix}`);
        for (const a of strayMarkedAddresses(marked, wantedClaims)) {
          if (await netlink.removeAddress(parent.index, a.address, a.prefix).catch(() => false)) removedAddrs.push(`${a.cidr} (marked as the agent's, no claim wants it)`);
        }
        // With VRRP this node starts as Backup: a pool VIP an earlier run left
        // on the parent (a crash) would answer ARP for it - and refuse
        // connections - while another node is Master, and make that Master's
        // RFC 5227 probe see a conflict. The source puts it back when this
        // node becomes Master.
        if (config.failover.mode === 'vrrp') {
          const onParent = new Set((await netlink.listAddresses(parent.index)).filter((a) => a.prefix === 32).map((a) => a.address));
          for (const s of services) {
            const claim = s.primaryService === undefined && s.ipam === 'pool' ? pools.claimOf(s.key) : undefined;
            if (claim && onParent.has(claim.address) && await netlink.removeAddress(parent.index, claim.address, 32).catch(() => false)) {
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
        pools.setPools(next.pools);
        limiterSettings = { max: next.dhcp.maxConcurrentStarts, jitterMs: vrrp ? 0 : next.dhcp.retransmitJitter * 1000 };
        limiter?.reconfigure(limiterSettings);
      },
      close: async () => { netlink.close(); },
    };
  } catch (e) {
    netlink.close();
    throw e;
  }
}

