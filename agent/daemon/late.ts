// What the Daemon uses only once its control socket is up: the
// metric classes (prom-client), the metrics server, the reload planner, the
// topology selection, the forward-state comparison and the service MACs. The daemon loads this on first use
// (late-load.ts lateModules()), so the modules behind it are not read and compiled
// before `status` can answer; wiring.ts is loaded the same way by main.ts.
export { Registry, Gauge, Counter, processMetrics } from '../metrics/prom';
export { MetricsServer } from '../metrics/server';
export { planReload, describeSummary } from './reconciler';
export { dsrUnavailable, sameForwardService } from '../forward/dataplane';
export { readNodeTopology } from '../config/labels';
export { selectBackends } from '../forward/topology';
export { linkNameForService, macForService } from '../net/ownership/ownership';
export { DaemonMetrics } from './metrics';
