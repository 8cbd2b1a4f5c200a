// Unit tests of the health metrics: names, labels and values in the Registry
// passed in, series removed with their backend, transitions counted
// agent-wide, and never the global registry.
import t from 'tap';
import { Registry, register as globalRegistry } from 'prom-client';
import { HealthMetrics } from '../../agent/health/metrics';

const L = { service: 'web', namespace: 'shop', backend: '10.0.0.1:8080' };

t.test('series live in the registry passed in, with bounded labels', async (t) => {
  const reg = new Registry();
  const m = new HealthMetrics(reg);
  m.addBackend(L, false);
  m.probe('ok', 2);
  m.probe('timeout', 3000);
  m.transition('up');
  m.setUp(L, true);
  const text = await reg.metrics();
  t.match(text, 'lbagent_health_backend_up{service="web",namespace="shop",backend="10.0.0.1:8080"} 1');
  t.match(text, 'lbagent_health_transitions_total{to="up"} 1');
  t.match(text, 'lbagent_health_transitions_total{to="down"} 0');
  t.equal(text.match(/^lbagent_health[a-z_]*\{[^}]*backend=/gm)?.length, 1, 'the up gauge is the only series per backend');
  t.match(text, 'lbagent_health_probe_duration_seconds_count{result="ok"} 1');
  t.match(text, 'lbagent_health_probe_duration_seconds_bucket{le="5",result="timeout"} 1');
  t.match(text, 'lbagent_health_probe_duration_seconds_bucket{le="2.5",result="timeout"} 0');
  t.notMatch(await globalRegistry.metrics(), 'lbagent_health', 'nothing in the global registry');
  // A second checker (another registry) does not collide.
  t.doesNotThrow(() => new HealthMetrics(new Registry()));
});

t.test('removing a backend removes its series', async (t) => {
  const reg = new Registry();
  const m = new HealthMetrics(reg);
  m.addBackend(L, true);
  m.addBackend({ ...L, backend: '10.0.0.2:8080' }, true);
  m.removeBackend(L);
  const text = await reg.metrics();
  t.notMatch(text, 'backend="10.0.0.1:8080"');
  t.match(text, 'backend="10.0.0.2:8080"');
});
