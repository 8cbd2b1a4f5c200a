// dhcp/ metrics: lbagent_dhcp_* series on the Registry the daemon passes in
// (never the global one). Every DHCP service of an agent shares one registry,
// and prom-client throws when a name is registered twice, so the series are
// looked up on the registry first and created only once per registry.
import { Counter, Gauge, Histogram, type Registry } from '../metrics/prom';
import { DHCP_STATES, type DhcpStateName } from './client';
import type { DropReason } from './codec';

export interface DhcpMetrics {
  /** Wall-clock expiry of the held lease, seconds since the epoch (+Inf: infinite lease). */
  readonly leaseExpiry: Gauge<'service' | 'namespace'>;
  /** 1 for the client's current RFC 2131 state, 0 for the others; set from `states` when scraped. */
  readonly state: Gauge<'service' | 'namespace' | 'state'>;
  /** Each client's current state, as the state gauge shows it at the next scrape. */
  readonly states: DhcpStates;
  /** DISCOVER (or INIT-REBOOT REQUEST) to the ACK that bound the address. */
  readonly acquireDuration: Histogram<'service' | 'namespace'>;
  readonly renewals: Counter<'service' | 'namespace'>;
  readonly rebinds: Counter<'service' | 'namespace'>;
  readonly naks: Counter<'service' | 'namespace'>;
  readonly declines: Counter<'service' | 'namespace'>;
  readonly expiries: Counter<'service' | 'namespace'>;
  readonly dropped: Counter<'reason'>;
}

/**
 * The clients' current states, written into lbagent_dhcp_state when the
 * registry is read (the gauge's collect), not at each step: a step records
 * a name. 50 services starting set 8 labelled series each at
 * construction and 2 more per step, ~800 prom-client label hashes (~8 ms)
 * on the event loop of a 50-service start, for a gauge read every 15 s.
 */
export class DhcpStates {
  private readonly clients = new Map<string, { labels: { service: string; namespace: string }; current: DhcpStateName; exported: DhcpStateName | undefined }>();

  constructor(private readonly gauge: Gauge<'service' | 'namespace' | 'state'>) {}

  /** `labels`' client is in state `name` from now on. */
  show(labels: { service: string; namespace: string }, name: DhcpStateName): void {
    const key = `${labels.namespace}/${labels.service}`;
    const c = this.clients.get(key);
    if (c) c.current = name;
    else this.clients.set(key, { labels, current: name, exported: undefined });
  }

  /** The client is gone (its service was removed): its series go, and no scrape brings them back. */
  forget(labels: { service: string; namespace: string }): void {
    this.clients.delete(`${labels.namespace}/${labels.service}`);
    for (const st of DHCP_STATES) this.gauge.remove({ ...labels, state: st });
  }

  /** Bring the gauge up to date: the gauge's collect(), before each read of the registry. */
  collect(): void {
    for (const c of this.clients.values()) {
      if (c.current === c.exported) continue;
      setDhcpState(this.gauge, c.labels, c.current, c.exported);
      c.exported = c.current;
    }
  }
}

function once<T>(registry: Registry, name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

const SERVICE = ['service', 'namespace'] as const;

/** One DhcpStates per state gauge (per registry), as the gauge is. */
const statesOf = new WeakMap<Gauge<'service' | 'namespace' | 'state'>, DhcpStates>();

export function dhcpMetrics(registry: Registry): DhcpMetrics {
  const registers = [registry];
  const counter = (name: string, help: string): Counter<'service' | 'namespace'> =>
    once(registry, name, () => new Counter({ name, help, labelNames: SERVICE, registers }));
  const state = once(registry, 'lbagent_dhcp_state', () => {
    const g: Gauge<'service' | 'namespace' | 'state'> = new Gauge({
      name: 'lbagent_dhcp_state',
      help: 'RFC 2131 state of the DHCP client of the service (1 for the current state)',
      labelNames: [...SERVICE, 'state'],
      registers,
      collect: () => statesOf.get(g)?.collect(),
    });
    statesOf.set(g, new DhcpStates(g));
    return g;
  });
  return {
    state,
    states: statesOf.get(state)!,
    leaseExpiry: once(registry, 'lbagent_dhcp_lease_expiry_timestamp_seconds', () => new Gauge({
      name: 'lbagent_dhcp_lease_expiry_timestamp_seconds',
      help: 'When the DHCP lease of the service VIP expires (seconds since the epoch)',
      labelNames: SERVICE,
      registers,
    })),
    acquireDuration: once(registry, 'lbagent_dhcp_acquire_duration_seconds', () => new Histogram({
      name: 'lbagent_dhcp_acquire_duration_seconds',
      help: 'Time from the first DISCOVER (or INIT-REBOOT REQUEST) to the bound address, ARP probe included',
      labelNames: SERVICE,
      buckets: [0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300],
      registers,
    })),
    renewals: counter('lbagent_dhcp_renewals_total', 'DHCP leases extended by a server (ACK while RENEWING or REBINDING)'),
    rebinds: counter('lbagent_dhcp_rebinds_total', 'Times T2 passed without a renewal and the client broadcast to any server (REBINDING)'),
    naks: counter('lbagent_dhcp_naks_total', 'DHCPNAKs received'),
    declines: counter('lbagent_dhcp_declines_total', 'Offered addresses found in use by an ARP probe (DHCPDECLINE sent)'),
    expiries: counter('lbagent_dhcp_expiries_total', 'Leases that expired: the VIP was withdrawn'),
    dropped: once(registry, 'lbagent_dhcp_dropped_packets_total', () => new Counter({
      name: 'lbagent_dhcp_dropped_packets_total',
      help: 'Frames received on DHCP client sockets and dropped, by reason',
      labelNames: ['reason'],
      registers,
    })),
  };
}

/** Set the state gauge: 1 for `current`, 0 for every other state; `previous`: what the gauge showed until now (the caller's record). */
function setDhcpState(gauge: Gauge<'service' | 'namespace' | 'state'>, labels: { service: string; namespace: string }, current: DhcpStateName, previous?: DhcpStateName): void {
  // From a state this function set: only the two series that change.
  if (previous !== undefined) {
    if (previous === current) return;
    gauge.set({ ...labels, state: previous }, 0);
    gauge.set({ ...labels, state: current }, 1);
    return;
  }
  for (const s of DHCP_STATES) gauge.set({ ...labels, state: s }, s === current ? 1 : 0);
}

/** Drop every per-service series (the service was removed). */
export function removeServiceSeries(m: DhcpMetrics, labels: { service: string; namespace: string }): void {
  m.states.forget(labels);
  for (const c of [m.leaseExpiry, m.renewals, m.rebinds, m.naks, m.declines, m.expiries, m.acquireDuration] as const) {
    c.remove(labels);
  }
}

export type { DropReason };
