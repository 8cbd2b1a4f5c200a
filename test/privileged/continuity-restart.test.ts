// Crash-only start through the real agent (issue 14): a client loop through
// a DHCP VIP and a pool VIP sees zero failed requests across SIGKILL and a
// new start; the new process adopts both VIPs (no ARP probe, no address
// taken off) and says so in status. After a SIGKILL with the DHCP server's
// range changed, the NAK withdraws the adopted address, a new lease is
// served, and status names the reason.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { httpGetFrom } from '../../lab/services';
import { agentCli, startAgent, waitStatus, type AgentHandle } from '../../lab/agent';
import { buildContinuityLab, continuityConfig, describeReport, Loops } from '../../lab/continuity';

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

async function leftovers(cl: { lab: { sh(ns: string, s: string, o?: { allowFail?: boolean }): Promise<{ stdout: string }> }; node: string }): Promise<{ links: string[]; pool: string[]; table: boolean }> {
  const links = (await cl.lab.sh(cl.node, 'ip -o link show')).stdout.split('\n').filter((l) => / lbv/.test(l)).map((l) => l.split(':')[1]!.trim().split('@')[0]!);
  const pool = (await cl.lab.sh(cl.node, 'ip -4 -o addr show dev eth0')).stdout.split('\n').map((l) => /inet (\S+\/32)/.exec(l)?.[1]).filter((x): x is string => x !== undefined);
  const table = (await cl.lab.sh(cl.node, 'nft list tables', { allowFail: true })).stdout.includes('lb_agent');
  return { links, pool, table };
}

t.test('--on-stop keep: SIGTERM and start without a failed request; `lb-agent withdraw` then takes everything off', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const cfg = continuityConfig(SERVICES);
  const first = await startAgent(cl.lab, cl.node, cfg, { name: 'a', args: ['--on-stop', 'keep'] });
  const vips = await serving(first);
  const loops = await Loops.start(cl, vips);
  t.teardown(() => loops.stopQuietly());
  await new Promise((r) => setTimeout(r, 500));
  const at = Date.now();
  first.signal('SIGTERM');
  t.same(await first.exited, { code: 0, signal: null }, 'the old process exits cleanly');
  t.ok(first.logs.some((l) => l.msg === 'lb-agent stopped; VIPs, links and forwarding left serving for the next start'), 'and says what it left');
  const kept = await leftovers(cl);
  t.same({ links: kept.links.length, pool: kept.pool, table: kept.table }, { links: 1, pool: [`${vips.api}/32`], table: true }, 'the data path outlives the process');
  const second = await startAgent(cl.lab, cl.node, cfg, { name: 'a', stateDir: first.stateDir, args: ['--on-stop', 'keep'] });
  await waitStatus(second, 'both VIPs adopted', (s) => s.services.every((x) => x.ready && x.adopted), 20_000);
  await new Promise((r) => setTimeout(r, 1000));
  const reports = await loops.stop(at);
  for (const [name, r] of Object.entries(reports)) {
    t.ok(r.count >= 50, `${name}: the loop ran (${r.count})`);
    t.equal(r.failures.length, 0, `${name}: no failed request across SIGTERM and start: ${describeReport(r)}`);
  }
  const refused = await agentCli(cl.lab, cl.node, ['withdraw', '--config', second.configPath]);
  t.equal(refused.code, 1, 'withdraw refuses while a daemon runs');
  t.match(refused.stderr, /another lb-agent \(pid \d+\) is running/);
  second.signal('SIGTERM');
  await second.exited;
  const w = await agentCli(cl.lab, cl.node, ['withdraw', '--config', second.configPath, '--json']);
  t.equal(w.code, 0, w.stderr);
  const res = JSON.parse(w.stdout) as { removed: string[] };
  t.ok(res.removed.includes('nftables table ip lb_agent') && res.removed.some((r) => r.startsWith('link lbv')) && res.removed.includes(`address ${vips.api}/32`), `withdraw says what it removed: ${res.removed.join(', ')}`);
  t.same(await leftovers(cl), { links: [], pool: [], table: false }, 'no address, link or table left');
  t.ok(fs.existsSync(path.join(second.stateDir, 'pool-claims.json')), 'claims kept for the next start');
  t.ok(fs.readdirSync(second.stateDir).some((f) => f.startsWith('dhcp-')), 'and the lease');
});

t.test('an address the agent marked that no claim explains is removed at start', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const cfg = continuityConfig([...SERVICES, { name: 'gone', ipam: 'pool', port: 81 }]);
  const first = await startAgent(cl.lab, cl.node, cfg, { name: 'a' });
  const st = await waitStatus(first, 'serving', (s) => s.services.every((x) => x.ready), 30_000);
  const gone = st.services.find((s) => s.name === 'gone')!.vip!;
  first.signal('SIGKILL');
  await first.exited;
  // The claim is lost (say a crash between the address going on and the claim file): only the mark says whose it is.
  const file = path.join(first.stateDir, 'pool-claims.json');
  const doc = JSON.parse(fs.readFileSync(file, 'utf8')) as { claims: Record<string, unknown> };
  delete doc.claims['default/gone'];
  fs.writeFileSync(file, JSON.stringify(doc));
  const second = await startAgent(cl.lab, cl.node, continuityConfig(SERVICES), { name: 'a', stateDir: first.stateDir });
  await waitStatus(second, 'serving', (s) => s.services.every((x) => x.ready), 20_000);
  t.notOk((await leftovers(cl)).pool.includes(`${gone}/32`), `${gone} (marked, unclaimed) was removed`);
  t.ok(second.logs.some((l) => Array.isArray(l.removed) && (l.removed as string[]).some((r) => r.startsWith(`${gone}/32 (marked as the agent's`))), 'and the log says why');
  second.signal('SIGTERM');
  await second.exited;
});
