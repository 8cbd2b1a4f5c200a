// forward/ layer: the entry point the daemon wires. Chooses and builds the
// data path; the modules behind it are dataplane.ts (the contract),
// balancer.ts (pure picks), nft.ts (kernel path) and proxy.ts (userspace path).
import type { Registry } from 'prom-client';
import type { ProxyConfig } from '../config/types';
import type { Clock } from '../clock';
import type { Logger } from '../log';
import { LbError } from '../errors';
import type { ConnectResultCallback, Dataplane, DataplaneSelection, ListenerStore, Placement, ProbeResult } from './dataplane';

export * from './dataplane';

// The path a config does not use is never loaded: nft.ts spawns
// nft, proxy.ts brings dgram and the connection machinery.
const nft = (): typeof import('./nft') => require('./nft') as typeof import('./nft');
const proxy = (): typeof import('./proxy') => require('./proxy') as typeof import('./proxy');

/** nft.ts's probe (dataplane: auto and kernel ask it; proxy does not). */
export function probeNftables(placement?: Placement): Promise<ProbeResult> {
  return nft().probeNftables({ placement });
}

/** nft.ts's probe of the netdev family with fwd (direct server return). */
export function probeDsr(): Promise<ProbeResult> {
  return nft().probeDsr();
}

export interface CreateDataplaneOptions {
  readonly proxy: ProxyConfig;
  readonly registry?: Registry;
  readonly log?: Logger;
  readonly clock?: Clock;
  /** The proxy's passive health reports (the kernel path has none). */
  readonly onConnectResult?: ConnectResultCallback;
  /** Where the proxy keeps its listening sockets, and the DSR program its descriptors, across restarts (systemd's fd store). */
  readonly listenerStore?: ListenerStore | undefined;
  /** The parent NIC, for direct server return on the kernel path. */
  readonly dsrDevice?: string | undefined;
  /** LB_AGENT_DSR_ENGINE: auto (the BPF program in front of the nft table, default) or nft (the table alone). */
  readonly dsrEngine?: string | undefined;
  /** The kernel path's placement of new SNAT connections (forward/nft.ts Placement). */
  readonly placement?: Placement;
}

/** LB_AGENT_DSR_ENGINE's value: unset or auto, or nft; anything else is refused at start. */
export function parseDsrEngine(value: string | undefined): 'auto' | 'nft' {
  if (value === undefined || value === '' || value === 'auto') return 'auto';
  if (value === 'nft') return 'nft';
  throw new LbError('LB_ERR_CONFIG_INVALID', `LB_AGENT_DSR_ENGINE=${JSON.stringify(value)}: expected auto or nft`, { env: 'LB_AGENT_DSR_ENGINE' });
}

/** Build the data path selectDataplane() chose; its reason goes to the info metric. */
export function createDataplane(selection: DataplaneSelection, opts: CreateDataplaneOptions): Dataplane {
  if (selection.kind === 'kernel') {
    return new (nft().NftDataplane)({ registry: opts.registry, log: opts.log, reason: selection.reason, dsrDevice: opts.dsrDevice, dsrEngine: parseDsrEngine(opts.dsrEngine), placement: opts.placement,
      dsrStore: opts.listenerStore });
  }
  return new (proxy().ProxyDataplane)({
    config: opts.proxy, registry: opts.registry, log: opts.log, reason: selection.reason,
    onConnectResult: opts.onConnectResult, clock: opts.clock, listenerStore: opts.listenerStore,
  });
}
