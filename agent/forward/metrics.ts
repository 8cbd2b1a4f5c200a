// forward/ layer: the Prometheus view of a data path. Every value comes from
// the `stats` callback the data path passes in, which only reads: the proxy
// hands its in-memory tallies, the kernel path the nftables counters, read
// over netlink when a scrape asks and its last read is older than its
// countersEveryMs (scrapes within it share that read). Nothing on the
// forwarding hot path ever touches prom-client. Registered on the Registry
// passed in, removed again by unregister() when the data path stops.
// A read that fails is never silent: the page keeps the last good values
// and says how old they are (lbagent_forward_stats_age_seconds), the failure
// is counted by the step that failed, logged (rate-limited) and, while reads
// keep failing, reported as a problem (readProblem()).
// A backend's traffic series exist once it has carried a connection (and a
// connect-failure series once it has failed one): a thousand idle services
// cost no traffic series at all (test/privileged/metrics-size.test.ts).
import { realClock } from '../clock';
import { errorMessage } from '../errors';
import { silentLogger, type Logger } from '../log';
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
  'lbagent_forward_stats_read_failures_total',
  'lbagent_forward_stats_age_seconds',
] as const;

/**
 * A read of the stats that failed at a named step ('counters': the kernel's
 * counters could not be read; 'derive': the stats could not be worked out
 * from them; 'view': an engine's view of them failed). The step is the
 * label of lbagent_forward_stats_read_failures_total; an error without one
 * counts as step "read".
 */
export class StatsReadFailure extends Error {
  readonly step: StatsReadStep;
  constructor(step: StatsReadStep, cause: unknown) {
    super(`${step}: ${errorMessage(cause)}`, { cause });
    this.name = 'StatsReadFailure';
    this.step = step;
  }
}

export type StatsReadStep = 'counters' | 'derive' | 'view' | 'read';

function stepOf(err: unknown): StatsReadStep {
  return err instanceof StatsReadFailure ? err.step : 'read';
}

function causeMessage(err: unknown): string {
  return err instanceof StatsReadFailure ? errorMessage(err.cause) : errorMessage(err);
}

export interface ForwardMetricsOptions {
  readonly registry: Registry;
  readonly kind: DataplaneKind;
  readonly reason: string;
  readonly stats: () => Promise<ForwardStats>;
  /** A scrape collects six metrics; one stats() read serves them all within this window (ms). */
  readonly cacheMs?: number;
  /**
   * Monotonic milliseconds, for the cache window and the age of the values
   * (injected for tests); the clock of the stats' `readAt`.
   */
  readonly now?: () => number;
  /** Where a failed read is logged (rate-limited: the first at once, then at most one line per logEveryMs). */
  readonly log?: Logger;
  readonly logEveryMs?: number;
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
  private readonly log: Logger;
  private readonly logEveryMs: number;
  private cached: { at: number; p: Promise<ForwardStats> } | undefined;
  private lastGood: ForwardStats | undefined;
  /** When the values served were read (the stats' readAt, else when the read resolved); undefined before any good read. */
  private goodAt: number | undefined;
  /** Failed reads since start, by step. */
  private readonly failures = new Map<StatsReadStep, number>();
  /** The failures in a row now: since when, how many, the last one's step and error (undefined once a read works). */
  private failing: { since: number; count: number; step: StatsReadStep; error: string } | undefined;
  /** A service key's label values (service, namespace), split once and kept while the service is in the stats. */
  private readonly labelPairs = new Map<string, readonly [string, string]>();
  /** When a failure was last logged, and how many have not been since. */
  private loggedAt = -Infinity;
  private unlogged = 0;

  constructor(opts: ForwardMetricsOptions) {
    this.registry = opts.registry;
    this.read = opts.stats;
    this.cacheMs = opts.cacheMs ?? 250;
    // Monotonic: a wall clock stepped back would keep serving one cached read.
    this.now = opts.now ?? ((): number => realClock.now());
    this.log = (opts.log ?? silentLogger()).child({ module: 'forward', op: 'stats' });
    this.logEveryMs = opts.logEveryMs ?? 60_000;
    const registers = [opts.registry];
    const snapshot = (): Promise<ForwardStats> => this.snapshot();
    const failures = this.failures;
    const age = (): number | undefined => (this.goodAt === undefined ? undefined : Math.max(0, this.now() - this.goodAt) / 1000);

    // The families with a series per service or per backend keep their
    // text (metrics/series.ts): a scrape puts each series' numbers, and only
    // a line whose number changed is rendered again. The label values come
    // from the service's kept pair (labelsOf) through one scratch array per
    // family, so an unchanged scrape builds no object per backend.
    const labelsOf = (key: string): readonly [string, string] => this.labelsOf(key);
    const perBackend = (name: string, help: string, type: 'counter' | 'gauge', last: 'port' | 'direction', put: (f: SeriesFamily, st: ForwardStats, l: (string | undefined)[]) => void): SeriesFamily =>
      new SeriesFamily({
        name, help, type, labelNames: ['service', 'namespace', 'backend', last], registers,
        async collect(fam) {
          const st = await snapshot();
          fam.begin();
          put(fam, st, [undefined, undefined, undefined, undefined]);
        },
      });
    const scratch = (l: (string | undefined)[], f: FlowStats, last: string): (string | undefined)[] => {
      const [service, namespace] = labelsOf(f.service);
      l[0] = service; l[1] = namespace; l[2] = f.backend; l[3] = last;
      return l;
    };
    perBackend('lbagent_forward_connections_total',
      'Connections (TCP) or flows (UDP) forwarded to a backend since the data path started; a backend that has carried none has no series.',
      'counter', 'port', (fam, st, l) => {
        for (const f of st.flows) if (carried(f)) fam.add(scratch(l, f, f.port), f.connections);
      });
    new SeriesFamily({
      name: 'lbagent_forward_udp_flows_ended_total',
      help: 'UDP flows (kernel path: conntrack entries; proxy: sessions) ended because their backend left the port\'s healthy set or the config, so that their next datagram is placed again. A port\'s series goes with the port.',
      type: 'counter',
      labelNames: ['service', 'namespace', 'port'],
      registers,
      async collect(fam) {
        const st = await snapshot();
        fam.begin();
        const l: (string | undefined)[] = [undefined, undefined, undefined];
        for (const u of st.udpFlowsEnded ?? []) {
          const [service, namespace] = labelsOf(u.service);
          l[0] = service; l[1] = namespace; l[2] = u.port;
          fam.add(l, u.ended);
        }
      },
    });
    new SeriesFamily({
      name: 'lbagent_forward_handed_back_packets_total',
      help: 'Kernel path under VRRP: packets of connections this node never saw (a backend\'s answer in flight when the VIP moved here) handed back to the previous Master, which holds their conntrack entry.',
      type: 'counter',
      labelNames: ['service', 'namespace'],
      registers,
      async collect(fam) {
        const st = await snapshot();
        fam.begin();
        for (const h of st.handedBack ?? []) fam.add(labelsOf(h.service), h.packets);
      },
    });
    perBackend('lbagent_forward_active_connections',
      'Open proxied connections per backend (userspace proxy only; the kernel path leaves them to conntrack); a backend that has carried no connection has no series.',
      'gauge', 'port', (fam, st, l) => {
        for (const f of st.flows) if (f.active !== undefined && carried(f)) fam.set(scratch(l, f, f.port), f.active);
      });
    perBackend('lbagent_forward_bytes_total',
      'Bytes forwarded per backend; direction="to_backend" is client to backend, "to_client" is backend to client; a backend that has carried no connection has no series.',
      'counter', 'direction', (fam, st, l) => {
        for (const f of st.flows) {
          if (!carried(f)) continue;
          fam.add(scratch(l, f, 'to_backend'), f.bytesToBackend);
          fam.add(scratch(l, f, 'to_client'), f.bytesToClient);
        }
      });
    new SeriesFamily({
      name: 'lbagent_forward_connect_failures_total',
      help: 'Failed connects to a backend (userspace proxy only); a backend that has failed none has no series.',
      type: 'counter',
      labelNames: ['service', 'namespace', 'backend'],
      registers,
      async collect(fam) {
        const st = await snapshot();
        fam.begin();
        const l: (string | undefined)[] = [undefined, undefined, undefined];
        for (const f of st.flows) {
          if (f.connectFailures === undefined || f.connectFailures === 0) continue;
          const [service, namespace] = labelsOf(f.service);
          l[0] = service; l[1] = namespace; l[2] = f.backend;
          fam.add(l, f.connectFailures);
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
        for (const s of st.services) f.set(labelsOf(s.key), s.noHealthyBackend ? 1 : 0);
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
    new Counter({
      name: 'lbagent_forward_stats_read_failures_total',
      help: 'Reads of the data path\'s stats for this page that failed, by the step that failed: step="counters" (the kernel path could not read its nftables counters), "derive" (the stats could not be worked out from them), "view" (the eBPF NAT engine\'s view of them failed) or "read"; the page then shows the last good values (lbagent_forward_stats_age_seconds says how old).',
      labelNames: ['step'] as const,
      registers,
      async collect() {
        await snapshot();
        this.reset();
        for (const [step, n] of failures) this.inc({ step }, n);
      },
    });
    new Gauge({
      name: 'lbagent_forward_stats_age_seconds',
      help: 'How old the forwarding values on this page are: seconds since the data path read them (the kernel path reads its counters at most once per countersEveryMs, 5 s, and a failed read leaves the last good values in place); absent before the first good read.',
      registers,
      async collect() {
        await snapshot();
        this.reset();
        const a = age();
        if (a !== undefined) this.set(a);
      },
    });
  }

  /**
   * While reads keep failing: what `lb-agent status` shows (how many in a
   * row, since when, the step and error, how old the values served are);
   * undefined once a read works.
   */
  readProblem(): string | undefined {
    const f = this.failing;
    if (f === undefined) return undefined;
    const now = this.now();
    const a = this.goodAt === undefined ? 'no values yet' : `values from ${fmtSeconds(now - this.goodAt)} ago`;
    return `the forwarding stats for /metrics could not be read ${f.count} time(s) in a row over ${fmtSeconds(now - f.since)} (${f.step}: ${f.error}); /metrics shows ${a}`;
  }

  /**
   * One stats() read per scrape. A failed read (nft briefly unavailable)
   * serves the last good values rather than failing the whole /metrics page;
   * before any good read it serves nothing. Either way the failure is
   * counted, logged and aged (failed()).
   */
  private snapshot(): Promise<ForwardStats> {
    const now = this.now();
    if (this.cached && now - this.cached.at < this.cacheMs) return this.cached.p;
    const p = this.read().then(
      (st) => { this.succeeded(st); return st; },
      (err: unknown) => { this.failed(err); return this.lastGood ?? { kind: 'proxy' as const, services: [], flows: [], problems: [], details: {} }; },
    );
    this.cached = { at: now, p };
    return p;
  }

  private succeeded(st: ForwardStats): void {
    // The data path served the values it served before (its own read is
    // not due yet): nothing new, neither a read nor a failure.
    if (st === this.lastGood) return;
    const now = this.now();
    this.lastGood = st;
    this.goodAt = st.readAt ?? now;
    this.pruneLabels(st);
    if (st.countersFailure !== undefined) {
      // The counters could not be read but the rest is fresh (the services'
      // health is in memory): served, with the counters as last read.
      this.failed(new StatsReadFailure(st.countersFailure.step, st.countersFailure.error));
    } else if (this.failing !== undefined) {
      this.log.info({ failures: this.failing.count, forSeconds: Math.round((now - this.failing.since) / 100) / 10 }, 'forwarding stats read again after failed reads');
      this.failing = undefined;
      this.loggedAt = -Infinity;
      this.unlogged = 0;
    }
  }

  private failed(err: unknown): void {
    const now = this.now();
    const step = stepOf(err);
    const error = causeMessage(err);
    this.failures.set(step, (this.failures.get(step) ?? 0) + 1);
    this.failing = { since: this.failing?.since ?? now, count: (this.failing?.count ?? 0) + 1, step, error };
    if (now - this.loggedAt < this.logEveryMs) { this.unlogged++; return; }
    const ageSeconds = this.goodAt === undefined ? undefined : Math.round((now - this.goodAt) / 100) / 10;
    this.log.warn({ step, err: error, inARow: this.failing.count, notLogged: this.unlogged, ageSeconds },
      `cannot read the forwarding stats (${step}: ${error}); /metrics shows the last good values${ageSeconds === undefined ? ' (none yet)' : `, ${ageSeconds} s old`}`);
    this.loggedAt = now;
    this.unlogged = 0;
  }

  private labelsOf(key: string): readonly [string, string] {
    let p = this.labelPairs.get(key);
    if (p === undefined) {
      const l = serviceLabels(key);
      p = [l.service, l.namespace];
      this.labelPairs.set(key, p);
    }
    return p;
  }

  /** The kept label pairs of services the stats no longer hold go. */
  private pruneLabels(st: ForwardStats): void {
    if (this.labelPairs.size <= st.services.length) return;
    const keep = new Set(st.services.map((s) => s.key));
    for (const k of this.labelPairs.keys()) if (!keep.has(k)) this.labelPairs.delete(k);
  }

  unregister(): void {
    for (const name of FORWARD_METRIC_NAMES) this.registry.removeSingleMetric(name);
  }
}

function fmtSeconds(ms: number): string {
  return `${(Math.max(0, ms) / 1000).toFixed(1)} s`;
}
