// forward/ layer: the entry point the daemon wires. Chooses and builds the
// data path; the modules behind it are dataplane.ts (the contract),
// balancer.ts (pure picks), nft.ts (kernel path) and proxy.ts (userspace path).
import type { Registry } from 'prom-client';
import type { KernelConfig, ProxyConfig } from '../config/types';
import type { Clock } from '../clock';
import type { Logger } from '../log';
import * as fs from 'node:fs';
import { LbError, errorMessage } from '../errors';
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
  /**
   * The eBPF NAT engine in front of the nft table (forward/ebpf-nat.ts) on
   * this device with these settings; undefined: the nft table alone. The
   * daemon decides from `kernel.engine` and the engine's probe (natEngineChoice).
   */
  readonly natEngine?: { readonly device: string; readonly kernel: KernelConfig } | undefined;
}

/**
 * Whether the kernel path runs the eBPF NAT engine: `kernel.engine: nft`
 * never; `ebpf` always, and a node where it cannot load is an error at start
 * (as `dataplane: kernel` without nftables is); `auto` when its probe passes.
 * `probe` returns why it cannot run, or undefined. Returns the choice and why.
 */
export function natEngineChoice(engine: KernelConfig['engine'], probe: () => string | undefined): { readonly use: boolean; readonly reason: string } {
  if (engine === 'nft') return { use: false, reason: 'configured: kernel.engine: nft' };
  const why = probe();
  if (engine === 'ebpf') {
    if (why !== undefined) {
      throw new LbError('LB_ERR_FORWARD_NAT_BPF', `kernel.engine: ebpf, and the eBPF NAT engine cannot run on this node: ${why}. Set kernel.engine: auto or nft, or see lb-agent check (finding nat-engine)`, { reason: why });
    }
    return { use: true, reason: 'configured: kernel.engine: ebpf' };
  }
  return why === undefined ? { use: true, reason: 'auto: the eBPF NAT engine loads and attaches here' } : { use: false, reason: `auto: the eBPF NAT engine cannot run here (${why}); the nft table forwards alone` };
}

// The engine's modules load only where it runs.
const natAttach = (): typeof import('../net/ebpf/nat-attach') => require('../net/ebpf/nat-attach') as typeof import('../net/ebpf/nat-attach');
const dsrAttach = (): typeof import('../net/ebpf/ebpf-attach') => require('../net/ebpf/ebpf-attach') as typeof import('../net/ebpf/ebpf-attach');
const ebpfNat = (): typeof import('./ebpf-nat') => require('./ebpf-nat') as typeof import('./ebpf-nat');

/**
 * The engine's probe, in a pin directory of its own under the device's,
 * removed after. mount: first mount the BPF file system where there is none
 * (the daemon at start; `lb-agent check` only looks). withDsr (the config
 * forwards DSR ports, which the DSR program serves at the same hook): the
 * DSR program's probe is attached beside the engine's; where it attaches
 * alone but not beside it, the engine is what cannot run (the DSR program
 * keeps the hook, the nft table does the NAT), and the reason says so.
 * Where the DSR program cannot run at all, the nft table serves DSR and the
 * engine is not in its way.
 */
export function probeNatEngine(device: string, opts: { mount?: boolean; withDsr?: boolean } = {}): string | undefined {
  const a = natAttach();
  if (opts.mount) {
    const why = a.mountBpffs();
    if (why !== undefined) return why;
  }
  const dsr = opts.withDsr ? dsrAttach() : undefined;
  // Only where the DSR program attaches alone is a refusal beside the engine the engine's doing.
  const beside = dsr !== undefined && dsr.probeDsrBpfHere() === undefined
    ? (at: string): string | undefined => {
      const why = dsr.probeDsrBpfHere(undefined, at);
      return why === undefined ? undefined : `the DSR program cannot be attached beside it at tcx ingress (${why}); the DSR program keeps the hook`;
    }
    : undefined;
  return a.probeNatHere({ pinDir: `${a.natPinDir(device)}-probe-${process.pid}`, beside });
}

/**
 * The engine an earlier process left attached on `device` (and its pins),
 * detached where this one runs the nft table alone (`kernel.engine: nft`, or
 * `auto` falling back): a program serving an old plan in front of the table
 * would send new flows where the table no longer does. Returns how many
 * programs were detached, or why none could be (the addon without libbpf:
 * then none can be attached either).
 */
export function detachLeftoverNatEngine(device: string, opts: { pinnedOnly?: boolean } = {}): number | string {
  // pinnedOnly: only where its pin directory is there (net/ebpf/nat-attach.ts natPinDir), so a start that never ran the engine loads none of its code.
  if (opts.pinnedOnly && !fs.existsSync(`/sys/fs/bpf/lb-agent/nat-${device}`)) return 0;
  const a = natAttach();
  try {
    return new a.NatEngine({ device, pinDir: a.natPinDir(device) }).detach();
  } catch (err) {
    return errorMessage(err);
  }
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
    const nat = opts.natEngine;
    const table = new (nft().NftDataplane)({ registry: opts.registry, log: opts.log, reason: selection.reason, dsrDevice: opts.dsrDevice, dsrEngine: parseDsrEngine(opts.dsrEngine), placement: opts.placement,
      dsrStore: opts.listenerStore });
    if (nat === undefined) return table;
    const a = natAttach();
    const k = nat.kernel;
    const engine = new a.NatEngine({ device: nat.device, pinDir: a.natPinDir(nat.device), settings: { ...a.NAT_DEFAULTS, flowEntries: k.flowEntries, portMin: k.natPorts[0], portMax: k.natPorts[1] } });
    return new (ebpfNat().EbpfNatDataplane)({ nft: table, engine, registry: opts.registry, log: opts.log });
  }
  return new (proxy().ProxyDataplane)({
    config: opts.proxy, registry: opts.registry, log: opts.log, reason: selection.reason,
    onConnectResult: opts.onConnectResult, clock: opts.clock, listenerStore: opts.listenerStore,
  });
}
