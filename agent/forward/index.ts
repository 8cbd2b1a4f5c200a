// forward/ layer: the entry point the daemon wires. Chooses and builds the
// data path; the modules behind it are dataplane.ts (the contract),
// balancer.ts (pure picks), nft.ts (kernel path) and proxy.ts (userspace path).
import type { Registry } from 'prom-client';
import type { ProxyConfig } from '../config/types';
import type { Clock } from '../clock';
import type { Logger } from '../log';
import type { ConnectResultCallback, Dataplane, DataplaneSelection, ListenerStore } from './dataplane';
import { NftDataplane } from './nft';
import { ProxyDataplane } from './proxy';

export * from './dataplane';
export { probeNftables, probeDsr, NftDataplane } from './nft';
export { ProxyDataplane } from './proxy';

export interface CreateDataplaneOptions {
  readonly proxy: ProxyConfig;
  readonly registry?: Registry;
  readonly log?: Logger;
  readonly clock?: Clock;
  /** The proxy's passive health reports (the kernel path has none). */
  readonly onConnectResult?: ConnectResultCallback;
  /** Where the proxy keeps its listening sockets across restarts (systemd's fd store). */
  readonly listenerStore?: ListenerStore | undefined;
  /** The parent NIC, for direct server return on the kernel path (issue 17). */
  readonly dsrDevice?: string | undefined;
}

/** Build the data path selectDataplane() chose; its reason goes to the info metric. */
export function createDataplane(selection: DataplaneSelection, opts: CreateDataplaneOptions): Dataplane {
  if (selection.kind === 'kernel') {
    return new NftDataplane({ registry: opts.registry, log: opts.log, reason: selection.reason, dsrDevice: opts.dsrDevice });
  }
  return new ProxyDataplane({
    config: opts.proxy, registry: opts.registry, log: opts.log, reason: selection.reason,
    onConnectResult: opts.onConnectResult, clock: opts.clock, listenerStore: opts.listenerStore,
  });
}
