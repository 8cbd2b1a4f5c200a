// forward/ layer: the eBPF NAT engine's counters as the metrics and the
// per-backend stats see them. Pure over what it is handed: the plan in
// force (nat-plan.ts) and one read of the engine's counters by counter index
// (net/ebpf/nat-attach.ts NatCounterTotals), so a scrape makes no object or
// key string per (port, backend): a backend's numbers are found by its
// port's counter indices and read where they are rendered. The per-backend
// families keep their text (metrics/series.ts): a scrape renders again
// only the lines whose numbers changed.
import type { Registry } from 'prom-client';
import { Counter, Gauge } from 'prom-client';
import { SeriesFamily } from '../metrics/series';
import {
  NAT_BYTES_TO_BACKEND, NAT_BYTES_TO_CLIENT, NAT_COUNTER_WIDTH, NAT_FLOWS, NAT_PACKETS_TO_BACKEND, NAT_PACKETS_TO_CLIENT,
  type NatCounterTotals, type NatEvent,
} from '../net/ebpf/nat-attach';
import { portLabel, serviceLabels, type FlowStats, type ForwardStats } from './dataplane';
import type { NatPlan, NatPortPlan, NatServicePlan } from './nat-plan';

/** What the engine's metrics read at a scrape. */
export interface NatMetricsView {
  /** The plan in force, or undefined while the engine forwards nothing. */
  plan(): NatPlan | undefined;
  /** One read of the counters (called only while there is a plan). */
  totals(): NatCounterTotals;
  fill(): { flows: number; replies: number; flows6: number; replies6: number; capacity: number };
  events(withEvictions: boolean): Record<NatEvent, number>;
}

/** A service's label values (service, namespace), split once per service plan. */
const serviceLabelCache = new WeakMap<NatServicePlan, readonly [string, string]>();
function labelsOf(s: NatServicePlan): readonly [string, string] {
  let l = serviceLabelCache.get(s);
  if (l === undefined) {
    const { service, namespace } = serviceLabels(s.key);
    l = [service, namespace];
    serviceLabelCache.set(s, l);
  }
  return l;
}

/** A port's label, made once per port plan. */
const portLabelCache = new WeakMap<NatPortPlan, string>();
function portLabelOf(p: NatPortPlan): string {
  let l = portLabelCache.get(p);
  if (l === undefined) { l = portLabel(p.port); portLabelCache.set(p, l); }
  return l;
}

/** The per-backend families: name, help, and the field of lbn_counter each shows. */
export const NAT_BACKEND_FAMILIES: readonly { readonly name: string; readonly help: string; readonly field: number }[] = [
  { name: 'lbagent_forward_nat_flows_total', help: 'Flows the eBPF NAT engine placed on a backend since the agent started it.', field: NAT_FLOWS },
  { name: 'lbagent_forward_nat_packets_to_backend_total', help: 'Packets the eBPF NAT engine sent to a backend.', field: NAT_PACKETS_TO_BACKEND },
  { name: 'lbagent_forward_nat_bytes_to_backend_total', help: 'Bytes (IP packets) the eBPF NAT engine sent to a backend.', field: NAT_BYTES_TO_BACKEND },
  { name: 'lbagent_forward_nat_packets_to_client_total', help: 'Packets the eBPF NAT engine sent back to clients from a backend.', field: NAT_PACKETS_TO_CLIENT },
  { name: 'lbagent_forward_nat_bytes_to_client_total', help: 'Bytes (IP packets) the eBPF NAT engine sent back to clients from a backend.', field: NAT_BYTES_TO_CLIENT },
];

/**
 * Register the engine's families on `registry`: per backend (a series once
 * its number is above 0), the flow maps' fill, and the engine's events.
 */
export function registerNatMetrics(registry: Registry, view: NatMetricsView): void {
  // One read of the counters serves the five families of one scrape (the
  // engine's totals() is kept for the turn of the event loop).
  for (const fam of NAT_BACKEND_FAMILIES) {
    const field = fam.field;
    new SeriesFamily({
      name: fam.name, help: fam.help, type: 'counter', labelNames: ['service', 'namespace', 'port', 'backend'], registers: [registry],
      collect(f) {
        f.begin();
        const plan = view.plan();
        if (plan === undefined) return;
        const { totals, indices } = view.totals();
        const l: string[] = ['', '', '', ''];
        for (const s of plan.services) {
          const [service, namespace] = labelsOf(s);
          for (const p of s.ports) {
            const idx = indices(p.id);
            if (idx === undefined) continue;
            for (let i = 0; i < p.backends.length; i++) {
              const at = idx[i];
              if (at === undefined) continue;
              const v = totals[at * NAT_COUNTER_WIDTH + field];
              if (v === undefined || !(v > 0)) continue;
              l[0] = service; l[1] = namespace; l[2] = portLabelOf(p); l[3] = p.backends[i]!;
              f.set(l, v);
            }
          }
        }
      },
    });
  }
  new Gauge({
    name: 'lbagent_forward_nat_flow_entries', help: 'Entries in the eBPF NAT engine\'s flow maps (one per direction of a flow; flows6 and replies6: IPv6) and the capacity of each.', registers: [registry],
    labelNames: ['map'],
    collect() {
      this.reset();
      if (!view.plan()) return;
      try {
        const f = view.fill();
        this.set({ map: 'flows' }, f.flows);
        this.set({ map: 'replies' }, f.replies);
        this.set({ map: 'flows6' }, f.flows6);
        this.set({ map: 'replies6' }, f.replies6);
        this.set({ map: 'capacity' }, f.capacity);
      } catch { /* no maps: no series */ }
    },
  });
  new Counter({
    name: 'lbagent_forward_nat_events_total',
    help: 'eBPF NAT engine events since its maps were created: new flows, mid-flow pickups, idle expiries, flows placed again, no free source port, no route, ICMP errors translated, IPv6 packets with an extension header passed to nft, flow map entries evicted.',
    registers: [registry], labelNames: ['event'],
    collect() {
      this.reset();
      if (!view.plan()) return;
      try {
        for (const [k, v] of Object.entries(view.events(true)) as [NatEvent, number][]) if (v > 0) this.inc({ event: k }, v);
      } catch { /* no maps: no series */ }
    },
  });
}

/** A plan's ports by service key and port label (the keys of FlowStats), made once per plan. */
const portIndexCache = new WeakMap<NatPlan, Map<string, Map<string, NatPortPlan>>>();
function portIndex(plan: NatPlan): Map<string, Map<string, NatPortPlan>> {
  let m = portIndexCache.get(plan);
  if (m === undefined) {
    m = new Map();
    for (const s of plan.services) {
      const ports = new Map<string, NatPortPlan>();
      for (const p of s.ports) ports.set(portLabelOf(p), p);
      m.set(s.key, ports);
    }
    portIndexCache.set(plan, m);
  }
  return m;
}

/**
 * The engine's flows never reach the nft counters: its own are added to the
 * same (service, port, backend) rows of the stats, for status and for the
 * metrics (lbagent_forward_connections_total, lbagent_forward_bytes_total).
 * A row the engine carried nothing for is handed on as it is.
 */
export function withEngineFlows(st: ForwardStats, plan: NatPlan | undefined, read: () => NatCounterTotals): ForwardStats {
  if (plan === undefined || plan.services.length === 0) return st;
  const { totals, indices } = read();
  if (totals.length === 0) return st;
  const index = portIndex(plan);
  const flows: FlowStats[] = st.flows.map((f) => {
    const p = index.get(f.service)?.get(f.port);
    if (p === undefined) return f;
    const idx = indices(p.id);
    const b = p.backends.indexOf(f.backend);
    const at = b < 0 || idx === undefined ? undefined : idx[b];
    if (at === undefined || (at + 1) * NAT_COUNTER_WIDTH > totals.length) return f;
    const o = at * NAT_COUNTER_WIDTH;
    const flowsN = totals[o + NAT_FLOWS]!;
    const toBackend = totals[o + NAT_BYTES_TO_BACKEND]!;
    const toClient = totals[o + NAT_BYTES_TO_CLIENT]!;
    if (flowsN === 0 && toBackend === 0 && toClient === 0) return f;
    return { ...f, connections: f.connections + flowsN, bytesToBackend: f.bytesToBackend + toBackend, bytesToClient: f.bytesToClient + toClient };
  });
  return { ...st, flows };
}
