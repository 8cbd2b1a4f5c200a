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
  /** 1 for the client's current RFC 2131 state, 0 for the others. */
  readonly state: Gauge<'service' | 'namespace' | 'state'>;
  /** DISCOVER (or INIT-REBOOT REQUEST) to the ACK that bound the address. */
  readonly acquireDuration: Histogram<'service' | 'namespace'>;
  readonly renewals: Counter<'service' | 'namespace'>;
  readonly rebinds: Counter<'service' | 'namespace'>;
  readonly naks: Counter<'service' | 'namespace'>;
  readonly declines: Counter<'service' | 'namespace'>;
  readonly expiries: Counter<'service' | 'namespace'>;
  readonly dropped: Counter<'reason'>;
}

function once<T>(registry: Registry, name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

const SERVICE = ['service', 'namespace'] as const;

export function dhcpMetrics(registry: Registry): DhcpMetrics {
  const registers = [registry];
  const counter = (name: string, help: string): Counter<'service' | 'namespace'> =>
    once(registry, name, () => new Counter({ name, help, labelNames: SERVICE, registers }));
  return {
    leaseExpiry: once(registry, 'lbagent_dhcp_lease_expiry_timestamp_seconds', () => new Gauge({
      name: 'lbagent_dhcp_lease_expiry_timestamp_seconds',
      help: 'When the DHCP lease of the service VIP expires (seconds since the epoch)',
      labelNames: SERVICE,
      registers,
    })),
    state: once(registry, 'lbagent_dhcp_state', () => new Gauge({
      name: 'lbagent_dhcp_state',
      help: 'RFC 2131 state of the DHCP client of the service (1 for the current state)',
      labelNames: [...SERVICE, 'state'],
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
export function setDhcpState(m: DhcpMetrics, labels: { service: string; namespace: string }, current: DhcpStateName, previous?: DhcpStateName): void {
  // From a state this function set: only the two series that change (issue 18:
  // eight labelled sets per step, five steps per service at start).
  if (previous !== undefined) {
    if (previous === current) return;
    m.state.set({ ...labels, state: previous }, 0);
    m.state.set({ ...labels, state: current }, 1);
    return;
  }
  for (const s of DHCP_STATES) m.state.set({ ...labels, state: s }, s === current ? 1 : 0);
}

/** Drop every per-service series (the service was removed). */
export function removeServiceSeries(m: DhcpMetrics, labels: { service: string; namespace: string }): void {
  for (const s of DHCP_STATES) m.state.remove({ ...labels, state: s });
  for (const c of [m.leaseExpiry, m.renewals, m.rebinds, m.naks, m.declines, m.expiries, m.acquireDuration] as const) {
    c.remove(labels);
  }
}

export type { DropReason };
