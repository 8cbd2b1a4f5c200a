// Crash-only start through the real agent (issue 14): a client loop through
// a DHCP VIP and a pool VIP sees zero failed requests across SIGKILL and a
// new start; the new process adopts both VIPs (no ARP probe, no address
// taken off) and says so in status. After a SIGKILL with the DHCP server's
// range changed, the NAK withdraws the adopted address, a new lease is
// served, and status names the reason.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../helpers/netns';
import { httpGetFrom } from '../helpers/services';
import { startAgent, waitStatus, type AgentHandle } from '../helpers/agent';
import { buildContinuityLab, continuityConfig, describeReport, Loops } from './fixtures/continuity-lab';

const SERVICES = [{ name: 'web', ipam: 'dhcp' as const }, { name: 'api', ipam: 'pool' as const }];

async function serving(agent: AgentHandle): Promise<Record<string, string>> {
  const st = await waitStatus(agent, 'both services serving', (s) => ['web', 'api'].every((n) => s.services.find((x) => x.name === n)?.ready), 30_000);
  return Object.fromEntries(st.services.map((s) => [s.name, s.vip!]));
}

t.test('SIGKILL and start: zero failed requests through a DHCP VIP and a pool VIP', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const cfg = continuityConfig(SERVICES);
  const first = await startAgent(cl.lab, cl.node, cfg, { name: 'a' });
  const vips = await serving(first);
  const loops = await Loops.start(cl, vips);
  t.teardown(() => loops.stopQuietly());
  await new Promise((r) => setTimeout(r, 1000));

  const at = Date.now();
  first.signal('SIGKILL');
  await first.exited;
  const second = await startAgent(cl.lab, cl.node, cfg, { name: 'a', stateDir: first.stateDir });
  const st = await waitStatus(second, 'both VIPs adopted and confirmed', (s) => s.services.every((x) => x.ready && x.adopted), 20_000);
  // The DHCP confirmation (a unicast REQUEST) and the pool announcement are done; keep measuring a little.
  await waitFor('the DHCP lease confirmed', async () => ((await second.status()).services.find((s) => s.name === 'web')?.source?.state === 'BOUND'), 10_000);
  await new Promise((r) => setTimeout(r, 1500));
  const reports = await loops.stop(at);
  second.signal('SIGTERM');
  await second.exited;

  for (const [name, r] of Object.entries(reports)) {
    t.ok(r.count >= 100, `${name}: the loop ran (${r.count} requests)`);
    t.equal(r.failures.length, 0, `${name}: no failed request across SIGKILL and start: ${describeReport(r)}`);
    t.equal(r.wrongBodies.length, 0, `${name}: every answer came from a backend`);
  }
  t.same(Object.fromEntries(st.services.map((s) => [s.name, s.vip])), vips, 'the same VIPs after the restart');
  const probes = second.logs.filter((l) => l.op === 'probe' || (typeof l.msg === 'string' && /^probing /.test(l.msg)));
  t.same(probes.map((l) => l.msg), [], 'no ARP probe of an address that never left');
  t.notOk(second.logs.some((l) => typeof l.msg === 'string' && l.msg.startsWith('removed an address left on the adopted macvlan')), 'the DHCP VIP was never taken off its macvlan');
  t.ok(second.logs.some((l) => l.msg === 'nftables table lb_agent already matches the desired state; adopted as is'), 'the kernel table was adopted as it was, not rewritten');
});

t.test('SIGKILL, the DHCP range changes, start: the NAK withdraws the adopted VIP, a new lease is served, status says why', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const cfg = continuityConfig(SERVICES);
  const first = await startAgent(cl.lab, cl.node, cfg, { name: 'a' });
  const vips = await serving(first);
  first.signal('SIGKILL');
  await first.exited;
  await cl.restartDhcp('10.99.0.160,10.99.0.180');

  const second = await startAgent(cl.lab, cl.node, cfg, { name: 'a', stateDir: first.stateDir });
  const st = await waitStatus(second, 'web served on a new lease from the new range', (s) => {
    const web = s.services.find((x) => x.name === 'web');
    return web?.ready === true && web.vip !== vips.web && /^10\.99\.0\.1[678]\d$/.test(web.vip ?? '');
  }, 30_000);
  const web = st.services.find((x) => x.name === 'web')!;
  t.equal(web.interruptions, 1, 'one interruption counted');
  t.match(web.lastInterruption?.reason ?? '', /DHCPNAK/, `status names the NAK: ${web.lastInterruption?.reason}`);
  const table = await second.status();
  t.ok(table.services.find((x) => x.name === 'api')?.adopted, 'the pool VIP was adopted meanwhile');
  const r = await httpGetFrom(cl.lab, cl.client, `http://${web.vip}/`);
  t.ok(r.ok, 'the new VIP answers');
  const old = await httpGetFrom(cl.lab, cl.client, `http://${vips.web}/`, 500);
  t.notOk(old.ok, 'the NAKed address is no longer served');
  const lines = await cl.lab.sh(cl.node, 'ip -4 -o addr show');
  t.notMatch(lines.stdout, new RegExp(`inet ${vips.web!.replace(/\./g, '\\.')}/`), 'and it is off every interface');
  second.signal('SIGTERM');
  await second.exited;
});
