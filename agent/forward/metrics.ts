// forward/ layer: the Prometheus view of a data path. Every value comes from
// the `stats` callback the data path passes in, which only reads: the proxy
// hands its in-memory tallies, the kernel path the nftables counters, read
// over netlink when a scrape asks and its last read is older than its
// countersEveryMs (scrapes within it share that read). Nothing on the forwarding hot path ever touches prom-client. Registered on the Registry
// passed in, removed again by unregister() when the data path stops.
// A backend's traffic series exist once it has carried a connection (and a
// connect-failure series once it has failed one): a thousand idle services
// cost no traffic series at all (test/privileged/metrics-size.test.ts).
import { Counter, Gauge, Registry } from '../metrics/prom';
import { SeriesFamily } from '../metrics/series';
import type { DataplaneKind, FlowStats, ForwardStats } from './dataplane';
import { serviceLabels } from './dataplane';

export const FORWARD_METRIC_NAMES = [
  'lbagent_forward_connections_total',
  'lbagent_forward_active_connections',
  'lbagent_forward_bytes_total',
  'lbagent_forward_connect_failures_total',
  'lbagent_forward_dataplane_info',
  'lbagent_forward_no_healthy_backend',
  'lbagent_forward_own_limit_refused_total',
  'lbagent_forward_dsr_engine_info',
  'lbagent_forward_nft_delta_writes_total',
  'lbagent_forward_udp_flows_ended_total',
  'lbagent_forward_handed_back_packets_total',
] as const;

export interface ForwardMetricsOptions {
  readonly registry: Registry;
  readonly kind: DataplaneKind;
  readonly reason: string;
  readonly stats: () => Promise<ForwardStats>;
  /** A scrape collects six metrics; one stats() read serves them all within this window (ms). */
  readonly cacheMs?: number;
  /** Milliseconds, for the cache window (injected for tests). */
  readonly now?: () => number;
}

/** Whether a backend has carried anything on a port: its traffic series exist from then on. */
function carried(f: FlowStats): boolean {
  return f.connections > 0 || f.bytesToBackend > 0 || f.bytesToClient > 0;
}

export class ForwardMetrics {
  private readonly registry: Registry;
  private readonly read: () => Promise<ForwardStats>;
  private readonly cacheMs: number;
  private readonly now: () => number;
  private cached: { at: number; p: Promise<ForwardStats> } | undefined;
  private lastGood: ForwardStats | undefined;

  constructor(opts: ForwardMetricsOptions) {
    this.registry = opts.registry;
    this.read = opts.stats;
    this.cacheMs = opts.cacheMs ?? 250;
    this.now = opts.now ?? Date.now;
    const registers = [opts.registry];
    const snapshot = (): Promise<ForwardStats> => this.snapshot();

    new Counter({
      name: 'lbagent_forward_connections_total',
      help: 'Connections (TCP) or flows (UDP) forwarded to a backend since the data path started; a backend that has carried none has no series.',
      labelNames: ['service', 'namespace', 'backend', 'port'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const f of st.flows) if (carried(f)) this.inc({ ...serviceLabels(f.service), backend: f.backend, port: f.port }, f.connections);
      },
    });
    new Counter({
      name: 'lbagent_forward_udp_flows_ended_total',
      help: 'UDP flows (kernel path: conntrack entries; proxy: sessions) ended because their backend left the port\'s healthy set or the config, so that their next datagram is placed again. A port\'s series goes with the port.',
      labelNames: ['service', 'namespace', 'port'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const u of st.udpFlowsEnded ?? []) this.inc({ ...serviceLabels(u.service), port: u.port }, u.ended);
      },
    });
    new Counter({
      name: 'lbagent_forward_handed_back_packets_total',
      help: 'Kernel path under VRRP: packets of connections this node never saw (a backend\'s answer in flight when the VIP moved here) handed back to the previous Master, which holds their conntrack entry.',
      labelNames: ['service', 'namespace'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const h of st.handedBack ?? []) this.inc(serviceLabels(h.service), h.packets);
      },
    });
    new Gauge({
      name: 'lbagent_forward_active_connections',
      help: 'Open proxied connections per backend (userspace proxy only; the kernel path leaves them to conntrack); a backend that has carried no connection has no series.',
      labelNames: ['service', 'namespace', 'backend', 'port'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const f of st.flows) if (f.active !== undefined && carried(f)) this.set({ ...serviceLabels(f.service), backend: f.backend, port: f.port }, f.active);
      },
    });
    new Counter({
      name: 'lbagent_forward_bytes_total',
      help: 'Bytes forwarded per backend; direction="to_backend" is client to backend, "to_client" is backend to client; a backend that has carried no connection has no series.',
      labelNames: ['service', 'namespace', 'backend', 'direction'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const f of st.flows) {
          if (!carried(f)) continue;
          const l = { ...serviceLabels(f.service), backend: f.backend };
          this.inc({ ...l, direction: 'to_backend' }, f.bytesToBackend);
          this.inc({ ...l, direction: 'to_client' }, f.bytesToClient);
        }
      },
    });
    new Counter({
      name: 'lbagent_forward_connect_failures_total',
      help: 'Failed connects to a backend (userspace proxy only); a backend that has failed none has no series.',
      labelNames: ['service', 'namespace', 'backend'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const f of st.flows) {
          if (f.connectFailures === undefined || f.connectFailures === 0) continue;
          this.inc({ ...serviceLabels(f.service), backend: f.backend }, f.connectFailures);
        }
      },
    });
    const info = new Gauge({
      name: 'lbagent_forward_dataplane_info',
      help: 'The forwarding data path in use (kind) and why it was chosen (reason); always 1.',
      labelNames: ['kind', 'reason'] as const,
      registers,
    });
    info.set({ kind: opts.kind, reason: opts.reason }, 1);
    // A series per service: its line kept, rendered again when it changes (metrics/series.ts).
    new SeriesFamily({
      name: 'lbagent_forward_no_healthy_backend',
      help: '1 when a service has no healthy backend (new connections are refused), else 0.',
      type: 'gauge',
      labelNames: ['service', 'namespace'],
      registers,
      async collect(f) {
        const st = await snapshot();
        f.begin();
        for (const s of st.services) {
          const l = serviceLabels(s.key);
          f.set([l.service, l.namespace], s.noHealthyBackend ? 1 : 0);
        }
      },
    });
    new Gauge({
      name: 'lbagent_forward_dsr_engine_info',
      help: 'What forwards direct server return frames: engine="bpf" (the tc ingress program in front of the nft table) or "nft" (the table alone), and why (cause="tcx", "forced" by LB_AGENT_DSR_ENGINE=nft, "fallback" when the program cannot run here, or "table" when no port the program serves, IPv4 on the parent NIC, is forwarded and the table forwards the others: IPv6 VIPs, other networks\' NICs); absent while no DSR port is forwarded.',
      labelNames: ['engine', 'cause'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        const d = st.details['dsrEngine'] as { engine?: string; cause?: string } | undefined;
        if (d?.engine !== undefined && d.cause !== undefined) this.set({ engine: d.engine, cause: d.cause }, 1);
      },
    });
    new Counter({
      name: 'lbagent_forward_nft_delta_writes_total',
      help: 'Incremental updates of the kernel path\'s tables: via="netlink" (one nfnetlink batch, no process) or via="nft" (`nft -f`), with reason="unencoded" (the delta held a step the netlink writer does not encode), "netlink-failed" (the batch was refused or the socket failed; nothing of it applied) or "" (no netlink writer).',
      labelNames: ['via', 'reason'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        const d = st.details['deltaWrites'] as { netlink: number; nft: number; unencoded: number; netlinkFailed: number } | undefined;
        if (d === undefined) return;
        this.inc({ via: 'netlink', reason: '' }, d.netlink);
        this.inc({ via: 'nft', reason: 'unencoded' }, d.unencoded);
        this.inc({ via: 'nft', reason: 'netlink-failed' }, d.netlinkFailed);
        this.inc({ via: 'nft', reason: '' }, Math.max(0, d.nft - d.unencoded - d.netlinkFailed));
      },
    });
    new Counter({
      name: 'lbagent_forward_own_limit_refused_total',
      help: 'Clients the userspace proxy reset for its own limits, never counted against a backend: op="accept"|"connect" with code EMFILE, ENFILE or ENOBUFS, or op="limit" code="max-connections".',
      labelNames: ['op', 'code'] as const,
      registers,
      async collect() {
        const st = await snapshot();
        this.reset();
        for (const [k, n] of Object.entries(st.ownLimits ?? {})) {
          const [op, code] = k.split('/') as [string, string];
          this.inc({ op, code }, n);
        }
      },
    });
  }

  /**
   * One stats() read per scrape. A failed read (nft briefly unavailable)
   * serves the last good values rather than failing the whole /metrics page;
   * before any good read it serves nothing.
   */
  private snapshot(): Promise<ForwardStats> {
    const now = this.now();
    if (this.cached && now - this.cached.at < this.cacheMs) return this.cached.p;
    const p = this.read().then(
      (st) => { this.lastGood = st; return st; },
      () => this.lastGood ?? { kind: 'proxy' as const, services: [], flows: [], problems: [], details: {} },
    );
    this.cached = { at: now, p };
    return p;
  }

  unregister(): void {
    for (const name of FORWARD_METRIC_NAMES) this.registry.removeSingleMetric(name);
  }
}
