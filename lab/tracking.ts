// lab/tracking.ts owns the lab of ownership that follows health
// (failover.track), for test/privileged/vrrp-agent-tracking.test.ts and
// bench/tracking.ts: VMs with two NICs, as on Harvester.
//   br0 (management, 10.99.0.0/24): VRRP adverts (failover.interface eth0)
//   br1 (VM network, 10.98.0.0/24): the VIPs (node.interface eth1), the
//        backends b1 b2 (10.98.0.11-12, replies to the VIP go to whoever
//        holds it) and the client (10.98.0.50); b1 b2 are on br0 too
//        (10.99.0.11-12), the backends of the management network's service
//   n2, n3: agent "VMs", eth0 10.99.0.3/.4, eth1 10.98.0.3/.4, priorities 150/200
// With the VM network named in networks: (TrackingOptions.network), the
// default network is the management one and carries a service of its own,
// "mgmt" (MGMT_VIP on eth0, the same backends), so that what a track does to
// one network's router can be told from the other's.
// The Master's VM-network NIC loses carrier when its bridge port goes down
// (cutCarrier); it loses reach to a backend through an unreachable route in
// its own namespace (cutReach), so its health checks and its forwarding fail
// while the other VM still reaches the backend. Only lab namespaces are
// addressed.
import { createLab, waitFor, type Lab } from './netns';
import { startBackend } from './services';
import { AgentNode, NODES, BACKEND_IDS, FAST_ARP } from './vrrp';

/** The backends, on the VM network. */
export const VM_NET_BACKENDS = ['10.98.0.11', '10.98.0.12'] as const;
/** The same backends on the management network (mgmt's: the kernel path SNATs to the VIP, so a backend answers it on its own network). */
export const MGMT_BACKENDS = ['10.99.0.11', '10.99.0.12'] as const;

export const VM_NET_VIP = '10.98.0.200';
export const VM_NET_CLIENT = '10.98.0.50';
export const VM_NET_RANGE = '10.98.0.200-10.98.0.210';
/** The default (management) network's VIP when the VM network is named. */
export const MGMT_VIP = '10.99.0.200';
/** A VM's address on the VM network: 10.98.0.x for the management 10.99.0.x. */
export function vmNetAddress(mgmtIp: string): string { return mgmtIp.replace(/^10\.99\./, '10.98.'); }

export interface TrackingOptions {
  readonly preempt?: boolean;
  readonly advertInterval?: number;
  /**
   * The VM network's tracks (failover.track, or networks.<network>.failover.track
   * when it is named); default: eth1 tracked without a weight (fault),
   * service api with weight 60.
   */
  readonly track?: Record<string, unknown>;
  /** The pool service's health check. */
  readonly healthCheck?: Record<string, unknown>;
  /**
   * Put the VM network in `networks:` under this name (eth1, its pool, its
   * router on eth0 with VRID 51, its tracks) and the node on the management
   * NIC (its own router, VRID 50, untracked, with the service mgmt): the
   * layout of a Harvester VM with a VM network named.
   */
  readonly network?: string;
}

/** The config of an agent VM in the tracking lab: the pool service "api" on the VM network. */
export function trackingConfig(node: { role: string; ip: string; priority: number }, o: TrackingOptions = {}): Record<string, unknown> {
  const flat = trackingConfigFlat(node, o);
  if (o.network === undefined) return flat;
  const { node: n, failover: f, pools, services } = flat as { node: Record<string, unknown>; failover: Record<string, unknown>; pools: Record<string, string>; services: Record<string, unknown>[] };
  const { track, ...untracked } = f;
  return {
    ...flat,
    node: { ...n, interface: 'eth0' },
    failover: { ...untracked, vrid: 50 },
    pools: { 'range-global': `${MGMT_VIP}-${MGMT_VIP}` },
    networks: { [o.network]: { interface: 'eth1', pools, failover: { interface: 'eth0', vrid: 51, track } } },
    services: [
      ...services.map((x) => ({ ...x, network: o.network })),
      { ...services[0]!, name: 'mgmt', loadBalancerIP: MGMT_VIP, backends: [...MGMT_BACKENDS] },
    ],
  };
}

function trackingConfigFlat(node: { role: string; ip: string; priority: number }, o: TrackingOptions): Record<string, unknown> {
  return {
    node: { name: node.role, interface: 'eth1', priority: node.priority },
    failover: {
      mode: 'vrrp', vrid: 51, interface: 'eth0', advertInterval: o.advertInterval ?? 0.1, preempt: o.preempt ?? true, preemptDelay: 0,
      track: o.track ?? {
        interfaces: [{ name: 'eth1' }],
        services: [{ service: 'api', minHealthy: 2, weight: 60, failAfter: 1, recoverAfter: 1 }],
      },
    },
    metrics: { listen: `${node.ip}:9477` },
    pools: { 'range-global': VM_NET_RANGE },
    arp: FAST_ARP,
    services: [{
      name: 'api', ipam: 'pool', loadBalancerIP: VM_NET_VIP, ports: [{ port: 80, targetPort: 8080 }], backends: [...VM_NET_BACKENDS],
      healthCheck: o.healthCheck ?? { periodSeconds: 0.1, timeoutSeconds: 0.1, failureThreshold: 1, successThreshold: 1 },
    }],
  };
}

export interface TrackingLab {
  readonly lab: Lab;
  /** n2 (150) and n3 (200). */
  readonly nodes: readonly [TrackingNode, TrackingNode];
  /** The client namespace, on both bridges (requests to the VIP leave by eth1). */
  readonly client: string;
}

export class TrackingNode extends AgentNode {
  /** The bridge port (in the LAN namespace) of this node's eth1. */
  vmPort = '';

  async startTracking(o: TrackingOptions = {}): Promise<void> {
    await this.startWith(trackingConfig(this.def, o));
  }

  /** Reload the running agent with this layout's config for `o` (SIGHUP); resolves with the verdict. */
  async reloadTracking(o: TrackingOptions): Promise<{ ok: boolean; message: string; at: number }> {
    const a = this.agent!;
    const before = (await a.status()).config.generation;
    const rejected = a.logs.filter((l) => l.op === 'reload' && l.level === 50).length;
    a.writeConfig(trackingConfig(this.def, o));
    const at = Date.now();
    a.signal('SIGHUP');
    await waitFor(`${this.name}: the reload verdict`, async () => (await a.status()).config.generation > before || a.logs.filter((l) => l.op === 'reload' && l.level === 50).length > rejected, 10_000, 20);
    const r = (await a.status()).config.lastReload!;
    return { ok: r.ok, message: r.message, at };
  }

  /** A link of this VM that is down (a veth pair left down): a tracked interface that fails. */
  async addDownLink(name: string): Promise<void> {
    await this.lab.sh(this.ns, `ip link add ${name} type veth peer name ${name}p`);
  }

  /** Carrier of eth1: its bridge port down (lost) or up. */
  async cutCarrier(on: boolean): Promise<number> {
    // The time the change was asked for: the VM may react (fault in a few
    // ms) before the spawned `ip` has returned.
    const at = Date.now();
    await this.lab.sh(this.lab.lan, `ip link set ${this.vmPort} ${on ? 'down' : 'up'}`);
    return at;
  }

  /** Reach from this VM to backends: an unreachable route each (on) or none (off). */
  async cutReach(backends: readonly string[], on: boolean): Promise<number> {
    const at = Date.now();
    await this.lab.sh(this.ns, backends.map((b) => `ip route ${on ? 'replace' : 'del'} unreachable ${b}/32`).join('; '), { allowFail: !on });
    return at;
  }
}

/** A host's second NIC, eth1, on br1 (made on first use) with this address. */
export async function addVmNic(lab: Lab, ns: string, address: string, peer: string): Promise<void> {
  await lab.sh(lab.lan, `ip link show br1 >/dev/null 2>&1 || { ip link add br1 type bridge && ip link set br1 up; }; ip link add ${peer} type veth peer name eth1 netns ${ns} && ip link set ${peer} master br1 up`);
  await lab.sh(ns, `ip link set eth1 up && ip addr add ${address} dev eth1`);
}

export async function buildTrackingLab(t: { teardown(fn: () => unknown): void }, extraHosts: readonly { role: string; ip: string }[] = []): Promise<TrackingLab> {
  const lab = await createLab(t);
  const defs = [NODES[1]!, NODES[2]!];
  const nodes: TrackingNode[] = [];
  for (const d of defs) {
    const ns = await lab.addHost(d.role, { address: `${d.ip}/24` });
    const n = new TrackingNode(lab, d, ns);
    n.vmPort = `w${d.role}`;
    await addVmNic(lab, ns, `${vmNetAddress(d.ip)}/24`, n.vmPort);
    nodes.push(n);
  }
  for (const h of extraHosts) {
    const ns = await lab.addHost(h.role, { address: `${h.ip}/24` });
    await addVmNic(lab, ns, `${vmNetAddress(h.ip)}/24`, `w${h.role}`);
  }
  // Backends on both networks: the VM network's services' and the management network's.
  for (let i = 0; i < VM_NET_BACKENDS.length; i++) await addVmNic(lab, await lab.addHost(BACKEND_IDS[i]!, { address: `${MGMT_BACKENDS[i]!}/24` }), `${VM_NET_BACKENDS[i]!}/24`, `w${BACKEND_IDS[i]!}`);
  // The client also sits on the management network, where the agents' /metrics listen.
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  await addVmNic(lab, client, `${VM_NET_CLIENT}/24`, 'wclient');
  await Promise.all(VM_NET_BACKENDS.map((_, i) => startBackend(lab, lab.ns(BACKEND_IDS[i]!), BACKEND_IDS[i]!)));
  return { lab, nodes: nodes as [TrackingNode, TrackingNode], client };
}
