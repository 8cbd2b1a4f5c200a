// lab/vrrp6.ts: the VRRP lab's IPv6 side, for vrrp-agent-ipv6.test.ts and
// bench/failover6.ts: "VMs" on the lab bridge with IPv6 on (their
// link-local address is the source of IPv6 adverts, RFC 5798 §5.1.2.1), an
// agent config serving one IPv6 pool VIP under VRRP, the client's neighbour
// entry for it, and a death timed right after a VM's IPv6 advert.
import type { Lab } from './netns';
import { waitFor } from './netns';
import { bridgePort, FAST_ARP } from './vrrp';

export const VIP6 = 'fd00:99::200';
export const BACKEND6 = 'fd00:99::12';
export const POOLS6 = { 'range-global': '10.99.0.200-10.99.0.210,fd00:99::200-fd00:99::20f' };

export interface Vm6 {
  readonly name: string;
  readonly ns: string;
  /** IPv4 address (metrics, and the IPv4 VRRP instance's source). */
  readonly ip: string;
  readonly ip6: string;
  readonly mac: string;
  readonly linkLocal: string;
  /** Its port on the lab bridge (lab/vrrp.ts vmDeath). */
  readonly port: string;
}

/** A host with 10.99.0.n and fd00:99::n (hex) on eth0, its MAC and link-local address. */
export async function addVm6(lab: Lab, name: string, n: number): Promise<Vm6> {
  const ip6 = `fd00:99::${n.toString(16)}`;
  const ns = await lab.addHost(name, { address: `10.99.0.${n}/24`, ipv6: [`${ip6}/64`] });
  const link = JSON.parse((await lab.exec(ns, 'ip', ['-j', 'link', 'show', 'eth0'])).stdout) as { address: string }[];
  const linkLocal = await waitFor(`${name}: link-local address`, async () => {
    const j = JSON.parse((await lab.exec(ns, 'ip', ['-j', '-6', 'addr', 'show', 'eth0', 'scope', 'link'])).stdout) as { addr_info: { local?: string }[] }[];
    return j[0]?.addr_info.find((a) => a.local !== undefined)?.local;
  }, 5000, 20);
  return { name, ns, ip: `10.99.0.${n}`, ip6, mac: link[0]!.address, linkLocal, port: await bridgePort(lab, ns) };
}

/** The agent config of a VM serving the IPv6 pool VIP (service "api", IPv6 only) to BACKEND6:8080 under VRRP. */
export function agentConfig6(v: Vm6, priority: number, o: { advertInterval: number; vrid: number }): Record<string, unknown> {
  return {
    node: { name: v.name, interface: 'eth0', priority },
    failover: { mode: 'vrrp', vrid: o.vrid, advertInterval: o.advertInterval, preempt: true, preemptDelay: 0 },
    metrics: { listen: `${v.ip}:9477` },
    pools: POOLS6,
    arp: FAST_ARP,
    services: [{
      name: 'api', ipFamilies: ['IPv6'], ipam: 'pool', loadBalancerIP: VIP6, ports: [{ port: 80, targetPort: 8080 }], backends: [BACKEND6],
      healthCheck: { periodSeconds: 0.2, timeoutSeconds: 0.2, failureThreshold: 2 },
    }],
  };
}

/** The link-layer address of a host's neighbour entry for `ip` on eth0; undefined without one. */
export async function neighbourMac(lab: Lab, ns: string, ip: string): Promise<string | undefined> {
  const r = await lab.exec(ns, 'ip', ['-j', '-6', 'neigh', 'show', ip, 'dev', 'eth0'], { allowFail: true });
  return (JSON.parse(r.stdout || '[]') as { lladdr?: string }[])[0]?.lladdr;
}

/** Shell text (LAN namespace) returning right after `src` sends an IPv6 VRRP advert through bridge port `port`, or after `waitS` s (lab/vrrp.ts afterAdvert). */
export function afterAdvert6(port: string, src: string, waitS: number): string {
  return `timeout ${waitS} tcpdump -i ${port} -c 1 -nn --immediate-mode 'ip6 and ip6[6] = 112 and src host ${src}' >/dev/null 2>&1; `;
}
