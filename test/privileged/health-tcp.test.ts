// Privileged: the health checker against real TCP backends in lab namespaces,
// running inside the lab's node namespace (fixtures/health-driver.ts).
// - a backend that stops listening is down after exactly failureThreshold
//   refused probes and up after exactly successThreshold good ones, for three
//   threshold settings sharing ONE probe stream (the backend is probed once);
// - a backend whose packets are dropped (nft) fails by timeout, in about
//   timeoutSeconds; one that refuses fails at once; an unreachable route says so;
// - HTTP checks: status inside / outside the expected range.
// Timing is only checked loosely (order of magnitude), never tightly.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, type Lab } from '../../lab/netns';
import { startBackend } from '../../lab/services';
import { HealthDriver, type ProbeEvent } from './fixtures/health-client';

if (requirePrivileged(t)) {
  const B1 = '10.99.0.11';
  const B2 = '10.99.0.12';
  const B3 = '10.99.0.13';

  async function lab3(t: { teardown(fn: () => unknown): void }): Promise<{ lab: Lab; node: string; b1: string; b2: string; b3: string }> {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const b1 = await lab.addHost('b1', { address: `${B1}/24` });
    const b2 = await lab.addHost('b2', { address: `${B2}/24` });
    const b3 = await lab.addHost('b3', { address: `${B3}/24` });
    return { lab, node, b1, b2, b3 };
  }

  t.test('stop listening: down after exactly failureThreshold probes, up after exactly successThreshold, one probe stream for three services', async (t) => {
    const { lab, node, b1 } = await lab3(t);
    let backend = await startBackend(lab, b1, 'b1', [8080]);
    const d = await HealthDriver.start(lab, node, ['--jitter', '0.05']);
    t.teardown(() => d.close());
    const settings = [[1, 3], [2, 2], [3, 1]] as const;
    const name = (s: number, f: number): string => `s${s}f${f}`;
    await d.update(settings.map(([s, f]) => ({
      name: name(s, f), backends: [B1],
      healthCheck: { port: 8080, successThreshold: s, failureThreshold: f, periodSeconds: 0.3, timeoutSeconds: 1 },
    })));
    d.send({ cmd: 'start' });
    for (const [s, f] of settings) {
      await d.waitEvent(`${name(s, f)} up`, (e) => e.event === 'change' && e.service === `default/${name(s, f)}` && e.up === true, 5000);
    }
    t.pass('all three up after the first probe');

    // Stop the backend: the port refuses (the host is still there).
    const mark = d.events.length;
    await backend.stop();
    for (const [s, f] of settings) {
      const tr = await d.transition(`default/${name(s, f)}`, 'down', mark)();
      const streak = d.streakBefore(B1, d.indexOf(tr), false);
      t.equal(streak.length, f, `${name(s, f)}: down after exactly ${f} failed probe(s)`);
      t.ok(streak.every((p) => p.reason === 'refused'), 'each failure is "refused"');
      t.equal(tr.status.reason, 'refused');
      t.equal(tr.status.takenOutBy, 'active');
    }
    const st = await d.status('default/s1f3');
    t.same(st.healthy, []);

    // Bring it back.
    const mark2 = d.events.length;
    backend = await startBackend(lab, b1, 'b1', [8080]);
    t.teardown(() => backend.stop());
    for (const [s, f] of settings) {
      const tr = await d.transition(`default/${name(s, f)}`, 'up', mark2)();
      const streak = d.streakBefore(B1, d.indexOf(tr), true);
      t.equal(streak.length, s, `${name(s, f)}: up after exactly ${s} good probe(s)`);
    }

    // One probe stream: every probe of the backend served all three services,
    // and consecutive probes are about a period apart (never three per period).
    const probes = d.probes(B1);
    t.ok(probes.every((p) => p.subscribers === 3), 'each probe feeds all three subscribers');
    const gaps = probes.slice(2).map((p, i) => p.t - probes[i + 1]!.t);
    // Per-service probes would come in threes, milliseconds apart; a loaded
    // machine may delay one probe, so the bound is loose.
    t.ok(gaps.every((g) => g >= 50), `no duplicate probes (smallest gap ${Math.min(...gaps)} ms at a 300 ms period)`);
    t.equal(new Set(probes.map((p) => p.target)).size, 1, 'one target key');
  });

  t.test('dropped packets fail by timeout in about timeoutSeconds; refused fails at once', async (t) => {
    const { lab, node, b2 } = await lab3(t);
    const backend = await startBackend(lab, b2, 'b2', [8080]);
    t.teardown(() => backend.stop());
    const d = await HealthDriver.start(lab, node);
    t.teardown(() => d.close());
    await d.update([
      { name: 'drop', backends: [B2], healthCheck: { port: 8080, failureThreshold: 2, periodSeconds: 1.5, timeoutSeconds: 1 } },
      { name: 'refuse', backends: [B3], healthCheck: { port: 8080, failureThreshold: 2, periodSeconds: 0.5, timeoutSeconds: 3 } },
    ]);
    d.send({ cmd: 'start' });
    await d.waitEvent('drop up', (e) => e.event === 'change' && e.service === 'default/drop' && e.up === true, 5000);

    // Refused: nothing listens on B3:8080; the kernel answers the SYN with a RST.
    const refTr = await d.transition('default/refuse', 'down')();
    const refProbes = d.probes(B3).slice(0, 2);
    t.ok(refProbes.every((p) => !p.ok && p.reason === 'refused'), 'refused');
    t.ok(refProbes.every((p) => p.durationMs < 1000), `at once, not after the 3 s timeout (${refProbes.map((p) => Math.round(p.durationMs)).join(', ')} ms)`);
    t.equal(refTr.status.reason, 'refused');
    t.notOk(d.events.some((e) => e.event === 'change' && e.service === 'default/refuse'), 'unknown -> down: never in the healthy set, so no change event');

    // Drop: SYNs to B2:8080 vanish.
    await lab.sh(b2, "nft add table inet lbthc && nft add chain inet lbthc in '{ type filter hook input priority 0; }' && nft add rule inet lbthc in tcp dport 8080 drop");
    const mark = d.events.length;
    const tr = await d.transition('default/drop', 'down', mark)();
    const fails = d.streakBefore(B2, d.indexOf(tr), false);
    t.equal(fails.length, 2);
    for (const p of fails) {
      t.equal(p.reason, 'timeout');
      t.ok(p.durationMs >= 900 && p.durationMs < 2500, `timed out after about 1 s (${Math.round(p.durationMs)} ms)`);
    }
    t.equal(tr.status.reason, 'timeout');
    await lab.sh(b2, 'nft delete table inet lbthc');
    await d.transition('default/drop', 'up', mark)();
    t.pass('back up once packets flow again');
  });

  t.test('an unreachable route fails with reason unreachable', async (t) => {
    const { lab, node } = await lab3(t);
    await lab.sh(node, 'ip route add unreachable 10.98.0.0/24');
    const d = await HealthDriver.start(lab, node);
    t.teardown(() => d.close());
    await d.update([{ name: 'gone', backends: ['10.98.0.5'], healthCheck: { port: 8080, failureThreshold: 1, periodSeconds: 0.5, timeoutSeconds: 2 } }]);
    d.send({ cmd: 'start' });
    const tr = await d.transition('default/gone', 'down')();
    t.equal(tr.status.reason, 'unreachable');
    const p = d.probes('10.98.0.5')[0] as ProbeEvent;
    t.equal(p.detail, 'EHOSTUNREACH');
  });

  t.test('HTTP checks: status inside the range is up, outside is down with bad-status', async (t) => {
    const { lab, node, b1 } = await lab3(t);
    const backend = await startBackend(lab, b1, 'b1', [8080]);
    t.teardown(() => backend.stop());
    const d = await HealthDriver.start(lab, node);
    t.teardown(() => d.close());
    await d.update([
      { name: 'good', backends: [B1], healthCheck: { port: 8080, type: 'http', http: { path: '/healthz', expectStatus: [200, 299] }, periodSeconds: 0.5, failureThreshold: 1 } },
      { name: 'picky', backends: [B1], healthCheck: { port: 8080, type: 'http', http: { path: '/healthz', expectStatus: [500, 599] }, periodSeconds: 0.5, failureThreshold: 1 } },
      { name: 'plain', backends: [B1], healthCheck: { port: 8080, periodSeconds: 0.5 } },
    ]);
    d.send({ cmd: 'start' });
    await d.waitEvent('good up', (e) => e.event === 'change' && e.service === 'default/good' && e.up === true, 5000);
    const tr = await d.transition('default/picky', 'down')();
    t.equal(tr.status.reason, 'bad-status');
    await d.waitEvent('plain up', (e) => e.event === 'change' && e.service === 'default/plain' && e.up === true, 5000);
    const targets = new Set(d.probes(B1).map((p) => p.target));
    t.equal(targets.size, 3, 'different checks of one backend are different probes');
  });
}
