// Privileged: the health checker's Prometheus text, read from the real checker
// in a lab's node namespace while a real backend goes down and comes back:
// backend_up (per backend) and transitions_total (agent-wide, by the state
// entered) move as the transitions happen; probe durations are counted by
// result. Also the passive path on the
// real driver: connect failures take the backend out, only a probe brings it back.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { startBackend } from '../../lab/services';
import { HealthDriver } from './fixtures/health-client';

/** A sample's value from Prometheus text, by name and labels (all must match). */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

if (requirePrivileged(t)) {
  const B1 = '10.99.0.11';
  const L = { service: 'web', namespace: 'shop', backend: `${B1}:8080` };

  t.test('metrics follow a backend down and back up', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const b1 = await lab.addHost('b1', { address: `${B1}/24` });
    let backend = await startBackend(lab, b1, 'b1', [8080]);
    const d = await HealthDriver.start(lab, node);
    t.teardown(() => d.close());
    await d.update([{ name: 'web', namespace: 'shop', backends: [B1], healthCheck: { port: 8080, failureThreshold: 2, periodSeconds: 0.3, timeoutSeconds: 1 } }]);

    let m = await d.metrics();
    t.equal(sample(m, 'lbagent_health_backend_up', L), 0, 'before the first probe: 0 (unknown)');
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'up' }), 0);

    d.send({ cmd: 'start' });
    await d.waitEvent('up', (e) => e.event === 'change' && e.up === true, 5000);
    m = await d.metrics();
    t.equal(sample(m, 'lbagent_health_backend_up', L), 1);
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'up' }), 1);
    t.ok((sample(m, 'lbagent_health_probe_duration_seconds_count', { result: 'ok' }) ?? 0) >= 1);

    const mark = d.events.length;
    await backend.stop();
    await d.waitEvent('down', (e) => e.event === 'change' && e.up === false, 10_000, mark);
    m = await d.metrics();
    t.equal(sample(m, 'lbagent_health_backend_up', L), 0);
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'down' }), 1);
    t.ok((sample(m, 'lbagent_health_probe_duration_seconds_count', { result: 'refused' }) ?? 0) >= 2, 'refused probes counted');

    const mark2 = d.events.length;
    backend = await startBackend(lab, b1, 'b1', [8080]);
    t.teardown(() => backend.stop());
    await d.waitEvent('up again', (e) => e.event === 'change' && e.up === true, 10_000, mark2);
    m = await d.metrics();
    t.equal(sample(m, 'lbagent_health_backend_up', L), 1);
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'up' }), 2);
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'down' }), 1);

    // Passive: three reported connect failures take it out at once; the next
    // good probe (successThreshold 1) brings it back.
    const mark3 = d.events.length;
    for (let i = 0; i < 3; i++) d.send({ cmd: 'passive-fail', service: 'shop/web', address: B1, reason: 'reset' });
    const down = await d.waitEvent('passive down', (e) => e.event === 'change' && e.up === false, 5000, mark3);
    t.equal((down.status as { takenOutBy: string }).takenOutBy, 'passive');
    await d.waitEvent('active back up', (e) => e.event === 'change' && e.up === true, 5000, mark3);
    m = await d.metrics();
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'down' }), 2);
    t.equal(sample(m, 'lbagent_health_transitions_total', { to: 'up' }), 3);
  });
}
