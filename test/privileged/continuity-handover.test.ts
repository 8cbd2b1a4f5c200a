// `lb-agent run --replace` outside systemd (issue 14: "a hand-over on the
// control socket as HAProxy does"): on the proxy path a new process takes the
// listening sockets over from the running one, which goes on accepting until
// the new one serves; a client loop of new connections every 20 ms through a
// DHCP VIP and a pool VIP sees zero failed requests (a restart without the
// hand-over failed 36: bench/results/2026-11-23-restart-failover.md). The
// old process ran with the default --on-stop withdraw: a hand-over keeps the
// data path whatever the old process was told. The proxy runs two workers,
// so each listener is a SO_REUSEPORT group of two sockets (issue 18): every
// socket of every group goes over (closing one would reset the connections
// queued on it), and the new process serves the groups it was handed. One
// pool VIP is IPv6: its IPv6 listening sockets go over the same way.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { startAgent, waitStatus, agentCli } from '../../lab/agent';
import { buildContinuityLab, continuityConfig, describeReport, Loops } from '../../lab/continuity';

const WORKERS = 2;
const SERVICES = [{ name: 'web', ipam: 'dhcp' as const }, { name: 'api', ipam: 'pool' as const }, { name: 'api6', ipam: 'pool' as const, family: 'IPv6' as const }];

t.test('proxy path: --replace takes the listeners over, no request fails', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t, { ipv6: true });
  const cfg = continuityConfig(SERVICES, { dataplane: 'proxy', proxy: { workers: WORKERS } });
  const first = await startAgent(cl.lab, cl.node, cfg, { name: 'a' });
  const st1 = await waitStatus(first, 'every service serving', (s) => s.services.every((x) => x.ready), 30_000);
  const vips = Object.fromEntries(st1.services.map((s) => [s.name, s.vip!]));
  const loops = await Loops.start(cl, vips);
  t.teardown(() => loops.stopQuietly());
  await new Promise((r) => setTimeout(r, 1000));

  const at = Date.now();
  const second = await startAgent(cl.lab, cl.node, cfg, { name: 'a', stateDir: first.stateDir, args: ['--replace'] });
  t.same(await first.exited, { code: 0, signal: null }, 'the old process finished cleanly');
  const st2 = await waitStatus(second, 'every VIP adopted', (s) => s.services.every((x) => x.ready && x.adopted), 20_000);
  await new Promise((r) => setTimeout(r, 1000));
  const reports = await loops.stop(at);

  for (const [name, r] of Object.entries(reports)) {
    t.ok(r.count >= 80, `${name}: the loop ran (${r.count} requests)`);
    t.equal(r.failures.length, 0, `${name}: no failed request across the hand-over: ${describeReport(r)}`);
    t.equal(r.wrongBodies.length, 0, `${name}: every answer came from a backend`);
    t.comment(`${name}: slowest request ${r.slowest} ms (the loop's deadline is 500 ms)`);
  }
  t.same(Object.fromEntries(st2.services.map((s) => [s.name, s.vip])), vips, 'the same VIPs');
  const took = second.logs.find((l) => l.op === 'handover' && typeof l.listeners === 'number');
  t.equal(took?.listeners, SERVICES.length * WORKERS, 'the new process took every socket of both listeners\' groups over');
  const listens = second.logs.filter((l) => l.op === 'listen' && l.module === 'forward');
  t.equal(listens.length, SERVICES.length, 'one listener per service');
  t.ok(listens.every((l) => l.inherited === true && l.sockets === WORKERS && l.reusePort === true), 'each on the whole group it was handed, none bound anew');
  t.ok(first.logs.some((l) => l.op === 'handover' && l.listeners === SERVICES.length * WORKERS), 'the old process says what it handed over');
  const order = [first.logs.find((l) => /handing over: the successor may start/.test(String(l.msg))), second.logs.find((l) => l.msg === 'lb-agent started')];
  t.ok(order.every(Boolean), 'the old process let go before the new one started');

  const again = await agentCli(cl.lab, cl.node, ['status', '--socket', second.socket, '--json']);
  t.equal(again.code, 0, 'the new process answers on the same control socket');
  second.signal('SIGTERM');
  t.same(await second.exited, { code: 0, signal: null });
});

t.test('--replace with nothing running starts as usual', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const cfg = continuityConfig([{ name: 'api', ipam: 'pool' }], { dataplane: 'proxy' });
  const alone = await startAgent(cl.lab, cl.node, cfg, { name: 'b', args: ['--replace'] });
  t.ok(alone.logs.some((l) => l.op === 'handover' && /no running agent to take over from/.test(String(l.msg))), 'it says there was nobody to replace');
  await waitStatus(alone, 'serving', (s) => s.services.every((x) => x.ready), 20_000);
  alone.signal('SIGTERM');
  t.same(await alone.exited, { code: 0, signal: null });
});
