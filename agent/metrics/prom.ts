// The parts of prom-client the agent uses, loaded one by one: the package's
// index also loads its Pushgateway (http, https, zlib), its cluster
// aggregator and, for the process-CPU default metric's exemplars,
// @opentelemetry/api - 88 modules, ~100 ms of every start and about 12 MiB
// of RSS for nothing the agent uses. Every module takes the metric
// classes from here; the types stay prom-client's own (the classes are the
// same objects the index exports).
// test/metrics/prom.test.ts holds processMetrics() against prom-client's own
// collectDefaultMetrics(), so an upgrade that adds or renames one fails there.
import type * as Prom from 'prom-client';

export const Registry = require('prom-client/lib/registry') as typeof Prom.Registry;
export const Counter = require('prom-client/lib/counter') as typeof Prom.Counter;
export const Gauge = require('prom-client/lib/gauge') as typeof Prom.Gauge;
export const Histogram = require('prom-client/lib/histogram') as typeof Prom.Histogram;
export type Registry = Prom.Registry;
export type Counter<T extends string = string> = Prom.Counter<T>;
export type Gauge<T extends string = string> = Prom.Gauge<T>;
export type Histogram<T extends string = string> = Prom.Histogram<T>;

/** prom-client's default metrics but the process CPU ones, by file under prom-client/lib/metrics. */
const DEFAULT_METRICS = [
  'processStartTime', 'osMemoryHeap', 'processOpenFileDescriptors', 'processMaxFileDescriptors',
  'eventLoopLag', 'processHandles', 'processRequests', 'processResources',
  'heapSizeAndUsed', 'heapSpacesSizeAndUsed', 'version', 'gc',
] as const;

type DefaultMetric = (registry: Prom.Registry, config: { prefix: string; eventLoopMonitoringPrecision: number }) => void;

/**
 * What prom-client's collectDefaultMetrics() registers, with the same names,
 * help and values: its modules, and the three process CPU counters written
 * here as it writes them (without exemplars, whose @opentelemetry/api this
 * leaves unloaded).
 */
export function processMetrics(registry: Prom.Registry, prefix: string): void {
  // The event loop delay monitor's timer: prom-client's default 10 ms woke an
  // idle agent's main thread ~90 times a second (of its ~114), ~0.5% of a
  // core. Every 100 ms it still takes ~150 samples per 15 s scrape, and a
  // stall shows in them as the lateness of the timer that spanned it.
  const config = { prefix, eventLoopMonitoringPrecision: 100 };
  for (const name of DEFAULT_METRICS) {
    (require(`prom-client/lib/metrics/${name}`) as DefaultMetric)(registry, config);
  }
  let last = process.cpuUsage();
  const user = new Counter({
    name: `${prefix}process_cpu_user_seconds_total`, help: 'Total user CPU time spent in seconds.', registers: [registry],
    // One collect sets all three, as prom-client's does.
    collect() {
      const now = process.cpuUsage();
      const u = (now.user - last.user) / 1e6;
      const s = (now.system - last.system) / 1e6;
      last = now;
      user.inc(u);
      system.inc(s);
      total.inc(u + s);
    },
  });
  const system = new Counter({ name: `${prefix}process_cpu_system_seconds_total`, help: 'Total system CPU time spent in seconds.', registers: [registry] });
  const total = new Counter({ name: `${prefix}process_cpu_seconds_total`, help: 'Total user and system CPU time spent in seconds.', registers: [registry] });
}
