// prom-client loaded piece by piece (issue 18): the agent's process metrics
// are exactly what prom-client's collectDefaultMetrics() registers, and
// loading the metric classes leaves prom-client's index, its Pushgateway
// (http, https, zlib) and @opentelemetry/api unloaded.
import t from 'tap';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import * as promClient from 'prom-client';
import { Registry, Counter, Gauge, Histogram, processMetrics } from '../../agent/metrics/prom';

async function shape(r: promClient.Registry): Promise<string[]> {
  return (await r.getMetricsAsJSON()).map((m) => `${m.name} ${m.type} ${m.help}`).sort();
}

t.test('the process metrics are prom-client\'s default metrics, name for name', async (t) => {
  const ours = new Registry();
  processMetrics(ours, 'lbagent_');
  const theirs = new promClient.Registry();
  promClient.collectDefaultMetrics({ register: theirs, prefix: 'lbagent_' });
  t.same(await shape(ours), await shape(theirs));
});

t.test('the process CPU counters count this process\'s CPU time', async (t) => {
  const r = new Registry();
  processMetrics(r, 'x_');
  const value = async (name: string): Promise<number> => Number((await r.getSingleMetric(name)!.get()).values[0]?.value ?? NaN);
  const before = await value('x_process_cpu_seconds_total');
  const c0 = process.cpuUsage();
  // Spin until this process has used 30 ms of CPU (wall time says nothing on a busy machine).
  let used = 0;
  while (used < 30_000) { const c = process.cpuUsage(c0); used = c.user + c.system; }
  const [user, system, total] = [await value('x_process_cpu_user_seconds_total'), await value('x_process_cpu_system_seconds_total'), await value('x_process_cpu_seconds_total')];
  t.ok(total - before >= used / 1e6, `the counter grew by at least the ${used / 1000} ms spent (${total - before} s)`);
  t.ok(Math.abs(total - (user + system)) < 1e-9, 'total = user + system');
});

t.test('the classes are prom-client\'s own', async (t) => {
  t.equal(Registry, promClient.Registry);
  t.equal(Counter, promClient.Counter);
  t.equal(Gauge, promClient.Gauge);
  t.equal(Histogram, promClient.Histogram);
});

t.test('loading the metrics classes leaves prom-client\'s index and its extras unloaded', async (t) => {
  const script = `
    const p = require(${JSON.stringify(path.resolve(__dirname, '..', '..', 'agent', 'metrics', 'prom.js'))});
    const r = new p.Registry(); p.processMetrics(r, 'lbagent_');
    new p.Counter({ name: 'a_total', help: 'a', registers: [r] }); new p.Histogram({ name: 'b_seconds', help: 'b', registers: [r] });
    r.metrics().then(() => {
      const mods = Object.keys(require.cache);
      process.stdout.write(JSON.stringify({
        index: mods.filter((m) => /prom-client\\/index\\.js$/.test(m)),
        otel: mods.filter((m) => m.includes('@opentelemetry')).length,
        builtins: ['https', 'zlib', 'cluster'].filter((b) => process.moduleLoadList.includes('NativeModule ' + b)),
      }));
    });
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 0, r.stderr);
  t.same(JSON.parse(r.stdout), { index: [], otel: 0, builtins: [] });
});
