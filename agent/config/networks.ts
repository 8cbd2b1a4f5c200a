// The networks a VM is on (`networks:`), resolved: the one home of "which
// NIC, which pools, which virtual routers" for a service. Every config has
// the default network (node.interface with the top-level pools and failover
// settings); the named ones come from `networks:`. Downstream code reads a
// service's network from here in place of node.interface and the top-level
// settings. Pure.
import type { Desired, NetworkSpec, Pool, ServiceSpec } from './types';

/** The name of the implicit network: node.interface, top-level pools and failover. */
export const DEFAULT_NETWORK = 'default';

/** The default network of a config. */
export function defaultNetwork(config: Pick<Desired, 'node' | 'pools' | 'failover'>): NetworkSpec {
  return {
    name: DEFAULT_NETWORK, interface: config.node.interface, pools: config.pools,
    failover: {
      interface: config.failover.interface, vrid: config.failover.vrid, peers: config.failover.peers,
      peers6: config.failover.peers6 ?? [], track: config.failover.track,
    },
  };
}

/** Every network of a config, the default first, then `networks:` in file order. */
export function networksOf(config: Pick<Desired, 'node' | 'pools' | 'failover' | 'networks'>): NetworkSpec[] {
  return [defaultNetwork(config), ...(config.networks ?? [])];
}

/** The network of a service (load.ts refuses a name it does not define). */
export function networkOf(config: Pick<Desired, 'node' | 'pools' | 'failover' | 'networks'>, spec: Pick<ServiceSpec, 'network'>): NetworkSpec {
  const name = spec.network ?? DEFAULT_NETWORK;
  if (name === DEFAULT_NETWORK) return defaultNetwork(config);
  const n = config.networks?.find((x) => x.name === name);
  if (!n) throw new Error(`service network ${JSON.stringify(name)} is not defined under networks`);
  return n;
}

/** Every pool of every network. */
export function allPools(config: Pick<Desired, 'node' | 'pools' | 'failover' | 'networks'>): Pool[] {
  return networksOf(config).flatMap((n) => n.pools);
}

/** The pools one network hands addresses out of. */
export function poolsOfNetwork(pools: readonly Pool[], network: string | undefined): Pool[] {
  const want = network ?? DEFAULT_NETWORK;
  return pools.filter((p) => (p.network ?? DEFAULT_NETWORK) === want);
}

/**
 * A pool's name in metrics, status and messages: the kube-vip key on the
 * default network ("cidr-global"), "<network>/<key>" on a named one, so two
 * networks' "cidr-global" stay apart.
 */
export function poolLabel(pool: Pick<Pool, 'key' | 'network'>): string {
  return pool.network === undefined || pool.network === DEFAULT_NETWORK ? pool.key : `${pool.network}/${pool.key}`;
}
