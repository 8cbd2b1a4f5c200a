// dhcp/ metrics: lbagent_dhcp_* series on the Registry the daemon passes in
// (never the global one). Every DHCP service of an agent shares one registry,
// and prom-client throws when a name is registered twice, so the series are
// looked up on the registry first and created only once per registry.
import { Counter, Gauge, Histogram, type Registry } from '../metrics/prom';
import { DHCP_STATES, type DhcpStateName } from './client';
import type { DropReason } from './codec';
import type { Drop6Reason } from './codec6';
import type { Guard6Reason } from './guard6';

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

/** The lease expiry gauge and the acquisition histogram of one family's client, `<prefix>_...`. */
function leaseSeries(registry: Registry, prefix: string, expiryHelp: string, acquireHelp: string): Pick<DhcpMetrics, 'leaseExpiry' | 'acquireDuration'> {
  const registers = [registry];
  return {
    leaseExpiry: once(registry, `${prefix}_lease_expiry_timestamp_seconds`, () => new Gauge({
      name: `${prefix}_lease_expiry_timestamp_seconds`, help: expiryHelp, labelNames: SERVICE, registers,
    })),
    acquireDuration: once(registry, `${prefix}_acquire_duration_seconds`, () => new Histogram({
      name: `${prefix}_acquire_duration_seconds`, help: acquireHelp, labelNames: SERVICE,
      buckets: [0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300], registers,
    })),
  };
}

function droppedCounter(registry: Registry, name: string, help: string): Counter<'reason'> {
  return once(registry, name, () => new Counter({ name, help, labelNames: ['reason'], registers: [registry] }));
}

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
    ...leaseSeries(registry, 'lbagent_dhcp',
      'When the DHCP lease of the service VIP expires (seconds since the epoch)',
      'Time from the first DISCOVER (or INIT-REBOOT REQUEST) to the bound address, ARP probe included'),
    renewals: counter('lbagent_dhcp_renewals_total', 'DHCP leases extended by a server (ACK while RENEWING or REBINDING)'),
    rebinds: counter('lbagent_dhcp_rebinds_total', 'Times T2 passed without a renewal and the client broadcast to any server (REBINDING)'),
    naks: counter('lbagent_dhcp_naks_total', 'DHCPNAKs received'),
    declines: counter('lbagent_dhcp_declines_total', 'Offered addresses found in use by an ARP probe (DHCPDECLINE sent)'),
    expiries: counter('lbagent_dhcp_expiries_total', 'Leases that expired: the VIP was withdrawn'),
    dropped: droppedCounter(registry, 'lbagent_dhcp_dropped_packets_total', 'Frames received on DHCP client sockets and dropped, by reason'),
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

/**
 * The DHCPv6 client's series (lbagent_dhcp6_*): a dual-stack DHCP service has
 * a DHCPv4 and a DHCPv6 lease under the same service and namespace labels,
 * so the two families are two sets of names rather than one label more on
 * series dashboards already read.
 */
export interface Dhcp6Metrics {
  readonly leaseExpiry: Gauge<'service' | 'namespace'>;
  /** First SOLICIT to the REPLY that bound the address, DAD included. */
  readonly acquireDuration: Histogram<'service' | 'namespace'>;
  readonly renewals: Counter<'service' | 'namespace'>;
  readonly rebinds: Counter<'service' | 'namespace'>;
  readonly declines: Counter<'service' | 'namespace'>;
  readonly expiries: Counter<'service' | 'namespace'>;
  /** Messages dropped by the decoder (codec6 DROP6_REASONS) or refused by the guard (guard6 GUARD6_REASONS). */
  readonly dropped: Counter<'reason'>;
}

export type Dhcp6DropReason = Drop6Reason | Guard6Reason;

export function dhcp6Metrics(registry: Registry): Dhcp6Metrics {
  const registers = [registry];
  const counter = (name: string, help: string): Counter<'service' | 'namespace'> =>
    once(registry, name, () => new Counter({ name, help, labelNames: SERVICE, registers }));
  return {
    ...leaseSeries(registry, 'lbagent_dhcp6',
      'When the valid lifetime of the DHCPv6 lease of the service VIP ends (seconds since the epoch)',
      'Time from the first SOLICIT to the bound address, duplicate address detection included'),
    renewals: counter('lbagent_dhcp6_renewals_total', 'DHCPv6 leases extended by a server (REPLY while RENEWING or REBINDING)'),
    rebinds: counter('lbagent_dhcp6_rebinds_total', 'Times T2 passed without a renewal and the client asked any server (REBIND)'),
    declines: counter('lbagent_dhcp6_declines_total', 'Leased addresses found in use by duplicate address detection (DECLINE sent)'),
    expiries: counter('lbagent_dhcp6_expiries_total', 'DHCPv6 leases whose valid lifetime ended: the VIP was withdrawn'),
    dropped: droppedCounter(registry, 'lbagent_dhcp6_dropped_packets_total', 'DHCPv6 messages received by the clients and dropped, by reason (malformed, not ours, or refused by the reply guard)'),
  };
}

/** Drop every per-service DHCPv6 series (the service was removed). */
export function removeService6Series(m: Dhcp6Metrics, labels: { service: string; namespace: string }): void {
  for (const c of [m.leaseExpiry, m.renewals, m.rebinds, m.declines, m.expiries, m.acquireDuration] as const) c.remove(labels);
}
