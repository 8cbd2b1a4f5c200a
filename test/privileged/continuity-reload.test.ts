// Reloads through the real agent (issue 14 item 4, issue 15 item 1): a
// client loop through a DHCP VIP, a pool VIP and an IPv6 pool VIP sees zero failed requests
// across a reload that changes every global section and across reloads that
// add and remove other services; 100 overlapping SIGHUPs over files swapped
// between versions end exactly where a fresh start with the last file would
// (addresses, claims, links), and SIGTERM still ends the process in time.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t from 'tap';
import { stringify } from '../../lab/yaml';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { httpGetFrom } from '../../lab/services';
import { startAgent, waitStatus, withTestEngine, type AgentHandle } from '../../lab/agent';
import { buildContinuityLab, continuityConfig, describeReport, Loops, POOL6, type ServiceDef } from '../../lab/continuity';

const BASE: ServiceDef[] = [{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }];

async function reload(agent: AgentHandle, cfg: Record<string, unknown>): Promise<{ ok: boolean; message: string }> {
  const before = (await agent.status()).config.generation;
  const rejectedBefore = agent.logs.filter((l) => l.op === 'reload' && l.level === 50).length;
  agent.writeConfig(cfg);
  agent.signal('SIGHUP');
  await waitFor('the reload verdict', async () => (await agent.status()).config.generation > before || agent.logs.filter((l) => l.op === 'reload' && l.level === 50).length > rejectedBefore, 15_000);
  const r = (await agent.status()).config.lastReload!;
  return { ok: r.ok, message: r.message };
}

t.test('reloads that change every global section, and add and remove other services, never blink a VIP', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t, { ipv6: true });
  const first: ServiceDef[] = [...BASE, { name: 'api6', ipam: 'pool', family: 'IPv6' }];
  const base = continuityConfig(first);
  const agent = await startAgent(cl.lab, cl.node, base, { name: 'a' });
  const st = await waitStatus(agent, 'every service serving', (s) => s.services.every((x) => x.ready), 30_000);
  const vips = Object.fromEntries(st.services.map((s) => [s.name, s.vip!]));
  const loops = await Loops.start(cl, vips);
  t.teardown(() => loops.stopQuietly());
  const at = Date.now();

  const everySection = continuityConfig(first, {
    node: { interface: 'eth0', name: 'renamed-node', priority: 150 },
    failover: { mode: 'none', advertInterval: 0.5, preempt: false },
    metrics: { listen: '127.0.0.1:19477' },
    dataplane: 'auto',
    pools: { 'range-global': `10.99.0.200-10.99.0.219,${POOL6}`, 'cidr-default': '10.99.0.224/28' },
    arp: { probeWait: 0.2, probeNum: 1, probeMin: 0.2, probeMax: 0.3, announceWait: 0.3, announceNum: 3, announceInterval: 0.2 },
    dhcp: { retransmitInitial: 1, retransmitMax: 4, retransmitJitter: 0, maxConcurrentStarts: 4 },
    proxy: { algorithm: 'least-connections', idleTimeout: 120, connectTimeout: 2 },
  });
  const r1 = await reload(agent, everySection);
  t.ok(r1.ok, `every global section reloads: ${r1.message}`);
  t.match(r1.message, /applied sections: .*pools/);
  t.match(r1.message, /accepted without effect: .*failover/);
  const s1 = await agent.status();
  t.equal(s1.node.name, 'renamed-node', 'node.name took effect');
  await waitFor('metrics on the new address', async () => (await cl.lab.sh(cl.node, 'ss -ltn')).stdout.includes('127.0.0.1:19477'), 5000);
  t.ok(agent.logs.some((l) => l.op === 'reconfigure' && l.module === 'dhcp'), 'the DHCP source took the new timings');

  const more = [...first, { name: 'extra-pool', ipam: 'pool' as const, port: 8081 }, { name: 'extra-dhcp', ipam: 'dhcp' as const, port: 8082 }];
  const r2 = await reload(agent, { ...everySection, services: continuityConfig(more).services });
  t.ok(r2.ok, r2.message);
  await waitStatus(agent, 'the added services serving', (s) => s.services.length === 5 && s.services.every((x) => x.ready), 20_000);
  const r3 = await reload(agent, everySection);
  t.ok(r3.ok, r3.message);
  t.match(r3.message, /0 added, 2 removed/);
  // At least 500 ms after the last reload, and the window long enough for the 100 requests a loop
  // must show (20 ms apart): since small reloads parse inline the three can be done in under 2 s.
  await new Promise((r) => setTimeout(r, Math.max(500, at + 2500 - Date.now())));
  const reports = await loops.stop(at);
  for (const [name, r] of Object.entries(reports)) {
    t.ok(r.count >= 100, `${name}: the loop ran`);
    t.equal(r.failures.length, 0, `${name}: no failed request across the reloads: ${describeReport(r)}`);
  }
  const final = await agent.status();
  t.same(Object.fromEntries(final.services.map((s) => [s.name, s.vip])), vips, 'the same VIPs throughout');
  t.same(final.services.map((s) => s.interruptions), [0, 0, 0], 'no interruption counted');
  agent.signal('SIGTERM');
  await agent.exited;
});

t.test('100 overlapping SIGHUPs end where a fresh start with the last file would', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const a = continuityConfig([...BASE, { name: 'pa', ipam: 'pool', port: 81 }]);
  const b = continuityConfig([...BASE, { name: 'pb', ipam: 'pool', port: 82 }, { name: 'pc', ipam: 'pool', port: 83 }]);
  const last = continuityConfig([...BASE, { name: 'pb', ipam: 'pool', port: 82 }, { name: 'late', ipam: 'pool', port: 84 }]);
  const agent = await startAgent(cl.lab, cl.node, a, { name: 'a' });
  await waitStatus(agent, 'serving', (s) => s.services.every((x) => x.ready), 30_000);
  // Atomic swaps (write a temp file, rename), a SIGHUP after each, 2 ms apart:
  // faster than a reload of this file completes, so signals arrive while one runs.
  const swap = (cfg: Record<string, unknown>): void => {
    const tmp = `${agent.configPath}.tmp`;
    fs.writeFileSync(tmp, stringify(withTestEngine({ ...cfg, stateDir: agent.stateDir, control: { socket: agent.socket } })));
    fs.renameSync(tmp, agent.configPath);
  };
  for (let i = 0; i < 100; i++) {
    swap(i === 99 ? last : i % 2 === 0 ? b : a);
    agent.signal('SIGHUP');
    await new Promise((r) => setTimeout(r, 2));
  }
  const st = await waitStatus(agent, 'the last file applied and served', (s) => s.services.map((x) => x.name).join() === 'web,api,pb,late' && s.services.every((x) => x.ready), 30_000);
  await new Promise((r) => setTimeout(r, 1000));
  const reloads = agent.logs.filter((l) => l.op === 'reload' && typeof l.msg === 'string' && l.msg.startsWith('reloaded:')).length;
  t.ok(reloads >= 1 && reloads < 100, `100 signals folded into ${reloads} reloads`);
  t.notOk(agent.logs.some((l) => typeof l.msg === 'string' && /without a matching reservation/.test(l.msg)), 'no claim committed without a reservation');

  const poolVips = st.services.filter((s) => s.ipam === 'pool').map((s) => s.vip!).sort();
  const onEth0 = (await cl.lab.sh(cl.node, 'ip -4 -o addr show dev eth0')).stdout.split('\n')
    .map((l) => /inet (\S+)\/32/.exec(l)?.[1]).filter((x): x is string => x !== undefined).sort();
  t.same(onEth0, poolVips, `exactly the last file's pool VIPs on eth0 (${poolVips.join(', ')})`);
  const claims = JSON.parse(fs.readFileSync(path.join(agent.stateDir, 'pool-claims.json'), 'utf8')) as Record<string, unknown>;
  const claimed = Object.keys((claims.claims as Record<string, unknown> | undefined) ?? claims).sort();
  t.same(claimed, ['default/api', 'default/late', 'default/pb'], 'exactly the last file\'s claims');
  const links = (await cl.lab.sh(cl.node, 'ip -o link show')).stdout.split('\n').filter((l) => / lbv/.test(l)).length;
  t.equal(links, 1, 'one service macvlan (web)');
  const late = st.services.find((s) => s.name === 'late')!;
  const r = await httpGetFrom(cl.lab, cl.client, `http://${late.vip}:84/`);
  t.ok(r.ok, 'the service the last file added serves traffic');

  const stopAt = Date.now();
  agent.signal('SIGTERM');
  const ex = await agent.exited;
  t.ok(Date.now() - stopAt < 10_000, `SIGTERM ended the process in ${Date.now() - stopAt} ms`);
  t.equal(ex.code, 0);
});
