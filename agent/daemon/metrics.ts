// The daemon's own series: configured services, readiness, the VIP each
// service is served on, interruptions by cause, the backend set of a service
// with a topology policy, reloads by result. A service costs three series
// (ready, VIP, and the topology one only when it has a policy); the
// interruptions are counted agent-wide by cause, the service is in the log
// line and in `lb-agent status`' events. The gauges are set at scrape time
// from the daemon's view, so no series can go stale (level-triggered: a
// value without an event of its own is never missed); a scrape reads each
// service's readiness only as far as it needs and makes no object per
// service, and a series whose value did not change is not rendered again
// (metrics/series.ts). The counters are counted where things happen. Loaded once the control socket is up
// (late.ts), with prom-client.
import { Counter, Gauge, type Registry } from '../metrics/prom';
import { SeriesFamily } from '../metrics/series';
import { INTERRUPTION_KINDS, interruptionKind } from './status';
import type { LostCause } from '../source';
import { DEFAULT_NETWORK } from '../config/networks';

/** What the gauges read at each scrape. */
export interface DaemonMetricsView {
  serviceCount(): number;
  /** Every configured service's readiness, handed to visit one by one (no list made for a scrape). */
  eachReady(visit: (name: string, namespace: string, ready: boolean) => void): void;
  /** Every service this node serves, whatever gives its VIP (DHCP, pool, or a primary's, for Share IP), handed to visit one by one. */
  eachVip(visit: (name: string, namespace: string, vip: string, ipam: string, network: string | undefined) => void): void;
  /** The backend set each service balances over, and why. */
  topology(): Iterable<{ readonly name: string; readonly namespace: string; readonly policy: string; readonly set: string; readonly reason: string }>;
}

export class DaemonMetrics {
  private readonly reloads: Counter;
  private readonly interruptions: Counter;

  constructor(registry: Registry, view: DaemonMetricsView) {
    this.reloads = new Counter({ name: 'lbagent_config_reloads_total', help: 'Config reloads by result.', labelNames: ['result'], registers: [registry] });
    this.interruptions = new Counter({ name: 'lbagent_service_vip_interruptions_total', help: 'Times a served VIP was withdrawn while its service stayed configured, over every service, by reason.', labelNames: ['reason'], registers: [registry] });
    // Every reason at 0 from the start, so increase() sees the first (Prometheus' "avoid missing metrics").
    for (const reason of INTERRUPTION_KINDS) this.interruptions.inc({ reason }, 0);
    const services: Gauge = new Gauge({ name: 'lbagent_services', help: 'Configured services.', registers: [registry], collect: () => { services.set(view.serviceCount()); } });
    // The per-service families keep each series' line (metrics/series.ts):
    // a scrape renders again only the services whose value changed.
    new SeriesFamily({
      name: 'lbagent_service_ready', help: '1 when the service has a VIP and a healthy backend.', type: 'gauge', labelNames: ['service', 'namespace'], registers: [registry],
      collect: (f) => { f.begin(); view.eachReady((name, namespace, ready) => f.set([name, namespace], ready ? 1 : 0)); },
    });
    new SeriesFamily({
      // network: the one series a service has per VIP carries it, for joins
      // (`group_left(network)`), and only for a named network: a config
      // without networks: pays nothing for it (metrics-size.test.ts).
      name: 'lbagent_service_vip_info', help: 'The VIP a service is served on by this node (1 while served); network: the named network (networks:) it lives on, absent on the default one.', type: 'gauge', labelNames: ['service', 'namespace', 'vip', 'ipam', 'network'], registers: [registry],
      collect: (f) => {
        f.begin();
        view.eachVip((name, namespace, vip, ipam, network) => f.set([name, namespace, vip, ipam, network === undefined || network === DEFAULT_NETWORK ? undefined : network], 1));
      },
    });
    new SeriesFamily({
      name: 'lbagent_service_topology_info', help: 'The backend set a service with a topology policy (prefer-zone, zone-only) balances over (zone, all or none), and why (1 for the current one); a service of policy any has no series.',
      type: 'gauge', labelNames: ['service', 'namespace', 'policy', 'set', 'reason'], registers: [registry],
      collect: (f) => {
        f.begin();
        for (const x of view.topology()) if (x.policy !== 'any') f.set([x.name, x.namespace, x.policy, x.set, x.reason], 1);
      },
    });
  }

  reload(result: 'applied' | 'rejected'): void {
    this.reloads.inc({ result });
  }

  interrupted(_name: string, _namespace: string, cause: LostCause): void {
    this.interruptions.inc({ reason: interruptionKind(cause) });
  }
}
