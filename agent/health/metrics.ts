// Health metrics: the Prometheus series of the health checker, registered on
// the Registry passed in (never the global one). Labels are bounded: service,
// namespace, backend ("address:port" of the checked port), result/reason,
// probe path and check type. Only the up gauge is per backend; transitions
// and probe durations are agent-wide, so a thousand services of a few
// backends keep the page small (the backend that changed, and when, is in
// the transition's log line and in `lb-agent status`).
// Per probe, only the duration histogram is written, through label children
// made once; in-flight and per-path counts are read at scrape time from the
// checker's own counters (metric label lookups were part of the
// per-probe cost at 10,000 probes/s).
import { Counter, Gauge, Histogram, Registry } from '../metrics/prom';
import { SeriesFamily } from '../metrics/series';
import type { FailureReason } from './state';
import type { CheckType } from '../config/types';

export type ProbeOutcome = 'ok' | FailureReason;

/** How a probe ran: the native batch prober, a Node socket, or a probe injected by the caller (tests). */
export type ProbePath = 'native' | 'node' | 'injected';

/** Counts the checker keeps in plain numbers, read when Prometheus scrapes. */
export interface HealthCounts {
  readonly inFlight: () => number;
  /** Probes started so far, by path and check type. */
  readonly probes: () => ReadonlyArray<{ readonly path: ProbePath; readonly type: CheckType; readonly count: number }>;
}

export interface BackendLabels {
  readonly service: string;
  readonly namespace: string;
  readonly backend: string;
}

export class HealthMetrics {
  /** Per backend: its line kept and rendered again only when it changes (metrics/series.ts). */
  readonly up: SeriesFamily;
  readonly probeDuration: Histogram<'result'>;
  readonly transitions: Counter<'to'>;
  readonly inFlight: Gauge;
  readonly skipped: Counter<'reason'>;
  readonly probePath: Gauge<'path'>;
  readonly probesStarted: Counter<'path' | 'type'>;
  private readonly durationBy = new Map<ProbeOutcome, { observe(v: number): void }>();
  private readonly skippedBy = new Map<string, { inc(v?: number): void }>();

  constructor(registry: Registry, counts?: HealthCounts) {
    const registers = [registry];
    this.up = new SeriesFamily({
      name: 'lbagent_health_backend_up',
      help: 'Whether the backend receives traffic for the service (1) or not (0); unknown counts as 0, unchecked as 1.',
      type: 'gauge',
      labelNames: ['service', 'namespace', 'backend'],
      registers,
    });
    this.probeDuration = new Histogram({
      name: 'lbagent_health_probe_duration_seconds',
      help: 'Duration of health probes (connect, or HTTP response headers), by result.',
      labelNames: ['result'] as const,
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.transitions = new Counter({
      name: 'lbagent_health_transitions_total',
      help: 'Health state changes of backends, over every service, by the state entered.',
      labelNames: ['to'] as const,
      registers,
    });
    // Both at 0 from the start, so increase() sees the first (Prometheus' "avoid missing metrics").
    this.transitions.inc({ to: 'up' }, 0);
    this.transitions.inc({ to: 'down' }, 0);
    this.inFlight = new Gauge({
      name: 'lbagent_health_probes_in_flight',
      help: 'Health probes currently running.',
      registers,
      ...(counts ? { collect(this: Gauge) { this.set(counts.inFlight()); } } : {}),
    });
    this.probePath = new Gauge({
      name: 'lbagent_health_probe_path_info',
      help: 'How TCP health probes run (1 on the running path): native, the batch prober of the native addon; node, one Node socket per probe (the fallback when the addon has no prober, logged at start).',
      labelNames: ['path'] as const,
      registers,
    });
    const reported = new Map<string, number>();
    this.probesStarted = new Counter({
      name: 'lbagent_health_probes_total',
      help: 'Health probes started, by the path they ran on (native, node) and check type (tcp, http).',
      labelNames: ['path', 'type'] as const,
      registers,
      ...(counts ? {
        collect(this: Counter<'path' | 'type'>) {
          for (const { path, type, count } of counts.probes()) {
            const k = `${path}|${type}`;
            const delta = count - (reported.get(k) ?? 0);
            if (delta > 0) this.inc({ path, type }, delta);
            reported.set(k, count);
          }
        },
      } : {}),
    });
    this.skipped = new Counter({
      name: 'lbagent_health_probes_skipped_total',
      help: 'Scheduled probes not run: busy (the previous probe of that backend still running or waiting for a slot) or overrun (the scheduler fell a period behind).',
      labelNames: ['reason'] as const,
      registers,
    });
  }

  /** A backend entered a service's view: its up gauge. */
  addBackend(l: BackendLabels, up: boolean): void {
    this.up.set([l.service, l.namespace, l.backend], up ? 1 : 0);
  }

  setUp(l: BackendLabels, up: boolean): void {
    this.up.set([l.service, l.namespace, l.backend], up ? 1 : 0);
  }

  transition(to: 'up' | 'down'): void {
    this.transitions.inc({ to });
  }

  removeBackend(l: BackendLabels): void {
    this.up.remove([l.service, l.namespace, l.backend]);
  }

  probe(result: ProbeOutcome, durationMs: number): void {
    let child = this.durationBy.get(result);
    if (!child) {
      child = this.probeDuration.labels(result);
      this.durationBy.set(result, child);
    }
    child.observe(durationMs / 1000);
  }

  skip(reason: string, count = 1): void {
    let child = this.skippedBy.get(reason);
    if (!child) {
      child = this.skipped.labels(reason);
      this.skippedBy.set(reason, child);
    }
    child.inc(count);
  }

  /** The path TCP probes take from now on. */
  setProbePath(path: ProbePath): void {
    this.probePath.reset();
    this.probePath.set({ path }, 1);
  }
}
