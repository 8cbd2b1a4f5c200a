// The kernel stays true (agent/daemon/drift.ts): with a client loop on a
// DHCP VIP and a pool VIP (kernel path), each kind of damage another
// program does to what the agent holds - the ruleset flushed, its table or
// one chain deleted, a VIP's address removed, the DHCP macvlan set down or
// deleted, a sysctl reset - is repaired without a restart, the longest run
// of failed requests stays under a bound, and status shows the repair.
import * as fs from 'node:fs';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { startAgent, waitStatus, type AgentHandle } from '../../lab/agent';
import { buildContinuityLab, continuityConfig, type ContinuityLab } from '../../lab/continuity';
import { ClientLoop, type ClientResult } from '../../lab/client-loop';
import type { StatusDocument } from '../../agent/daemon/daemon';
import { markedAddressAdd } from './fixtures/marked-address';

/** The longest run of consecutive failed requests, from the first failure's start to the next answer's end (ms). */
function longestGap(results: readonly ClientResult[]): number {
  const rs = [...results].sort((a, b) => a.t - b.t);
  let longest = 0;
  let start: number | undefined;
  for (const r of rs) {
    if (!r.ok) { start ??= r.t; continue; }
    if (start !== undefined) { longest = Math.max(longest, r.t + r.ms - start); start = undefined; }
  }
  if (start !== undefined) longest = Infinity;
  return longest;
}

async function repaired(agent: AgentHandle, after: number, what: RegExp): Promise<StatusDocument['events'][number]> {
  let found: StatusDocument['events'][number] | undefined;
  await waitFor(`a drift-repaired event matching ${what}`, async () => {
    const st = await agent.status();
    found = st.events.find((e) => e.kind === 'drift-repaired' && Date.parse(e.at) >= after - 5 && what.test(e.reason));
    return found !== undefined;
  }, 10_000);
  return found!;
}

/**
 * A generous bound on a VIP's longest failing stretch per damage: each repair
 * is one nft or netlink write after the notification (a deleted macvlan's also
 * a DHCP INIT-REBOOT), the sysctls a poll; a resync-only design would take
 * tens of seconds.
 */
const GAP_BOUND_MS = 3000;

/** Each damage in turn: the command, the repair event that must follow, and both VIPs answering again. Returns when each began. */
async function damageEach(t: { pass(message: string): unknown }, cl: ContinuityLab, agent: AgentHandle, damages: ReadonlyArray<readonly [string, string, RegExp]>, vips: readonly string[]): Promise<Array<[string, number]>> {
  const marks: Array<[string, number]> = [];
  for (const [what, cmd, expect] of damages) {
    const at = Date.now();
    marks.push([what, at]);
    await cl.lab.sh(cl.node, cmd);
    const ev = await repaired(agent, at, expect);
    t.pass(`${what}: ${ev.reason}`);
    for (const vip of vips) await serving(cl, vip);
  }
  return marks;
}

/** Per damage, the longest failing stretch of the requests started between it and the next one (or `end`). */
function gapsPerDamage(results: readonly ClientResult[], marks: ReadonlyArray<readonly [string, number]>, end: number): Array<[string, number]> {
  return marks.map(([what, at], j) => {
    const until = marks[j + 1]?.[1] ?? end;
    return [what, longestGap(results.filter((x) => x.t >= at && x.t < until))];
  });
}

async function serving(cl: ContinuityLab, vip: string, port = 80): Promise<void> {
  await waitFor(`${vip} answers again`, async () => (await cl.lab.sh(cl.client, `curl -s -m 0.5 -o /dev/null -w '%{http_code}' http://${vip}:${port}/`).catch(() => ({ stdout: '' }))).stdout === '200', 10_000);
}

t.test('every kind of damage to what the agent holds is repaired without a restart', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const agent = await startAgent(cl.lab, cl.node, continuityConfig([{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }], { metrics: { listen: '127.0.0.1:19477' } }), { name: 'a' });
  t.teardown(() => { agent.signal('SIGKILL'); });
  const st = await waitStatus(agent, 'both services ready', (s) => s.services.length === 2 && s.services.every((x) => x.ready), 30_000);
  const web = st.services.find((s) => s.name === 'web')!;
  const api = st.services.find((s) => s.name === 'api')!;
  const link = web.interface!;
  const loops = await Promise.all([web.vip!, api.vip!].map((vip) => ClientLoop.start(cl.lab, cl.client, `http://${vip}/`, { intervalMs: 20, timeoutMs: 500, maxMs: 180_000, maxCount: 9000 })));
  t.teardown(async () => { for (const l of loops) await l.stop().catch(() => undefined); });
  const chain = /chain (\w+)/.exec((await cl.lab.sh(cl.node, 'nft list table ip lb_agent')).stdout)![1]!;

  const damages: Array<[string, string, RegExp]> = [
    ['nft flush ruleset', 'nft flush ruleset', /table ip lb_agent: deleted by nft/],
    ['nft delete table', 'nft delete table ip lb_agent', /table ip lb_agent: deleted by nft/],
    // One transaction: a repair landing between a separate flush and delete refills the chain, and the delete is refused.
    [`nft delete chain ${chain}`, `nft 'flush chain ip lb_agent ${chain}; delete chain ip lb_agent ${chain}'`, /table ip lb_agent: .*deleted 1 chain/],
    ['ip addr del of the pool VIP', `ip addr del ${api.vip}/32 dev eth0`, new RegExp(`VIP ${api.vip}/32 of default/api was removed.*added ${api.vip}/32 to eth0 again`)],
    ['ip addr del of the DHCP VIP', `ip addr del ${web.vip}/32 dev ${link}`, new RegExp(`VIP ${web.vip}/32 of default/web was removed`)],
    ['ip link set down of the DHCP macvlan', `ip link set ${link} down`, new RegExp(`${link} of default/web was set down.*set ${link} up`)],
    ['ip link del of the DHCP macvlan', `ip link del ${link}`, new RegExp(`${link} of default/web was deleted.*recreating ${link}`)],
    ['arp_ignore reset on the parent', 'sysctl -qw net.ipv4.conf.eth0.arp_ignore=0', /net.ipv4.conf.eth0.arp_ignore is 0.*set net.ipv4.conf.eth0.arp_ignore=1/],
    ['ip_forward turned off', 'sysctl -qw net.ipv4.ip_forward=0', /net.ipv4.ip_forward is 0.*set net.ipv4.ip_forward=1/],
    // What a start would remove as left by an earlier run is removed while running too.
    ['a stray agent macvlan', 'ip link add lbv0123456789ab link eth0 address 02:01:23:45:67:89 type macvlan mode bridge', /agent macvlan lbv0123456789ab \(02:01:23:45:67:89\) belongs to no configured service; deleted it/],
    ['a marked address no service claims', markedAddressAdd('10.99.0.230', 'eth0'), /address 10.99.0.230\/32 on eth0 carries the agent's mark and no service holds or claims it there; removed it/],
  ];
  const marks = await damageEach(t, cl, agent, damages, [web.vip!, api.vip!]);
  const after = await agent.status();
  t.same(after.services.map((s) => s.vip), [web.vip, api.vip], 'the same VIPs');
  t.equal(after.services.find((s) => s.name === 'web')!.mac, web.mac, 'the DHCP macvlan came back with its MAC');
  t.ok(after.services.every((s) => s.ready), 'both services ready again');
  t.ok(after.drift && after.drift.repairs.table >= 3 && after.drift.repairs.address >= 2 && after.drift.repairs.link >= 1, `repairs counted: ${JSON.stringify(after.drift?.repairs)}`);
  const links = (await cl.lab.sh(cl.node, 'ip -o link show')).stdout.split('\n').filter((l) => / lbv/.test(l));
  t.equal(links.length, 1, 'one service macvlan, no leftover');
  t.notMatch((await cl.lab.sh(cl.node, 'ip -o addr show dev eth0')).stdout, /10\.99\.0\.230/, 'the unclaimed marked address is gone');
  t.ok((after.drift?.repairs.leftover ?? 0) >= 2, 'leftovers counted');
  const metrics = (await cl.lab.sh(cl.node, 'curl -s -m 2 http://127.0.0.1:19477/metrics')).stdout;
  t.match(metrics, /lbagent_drift_repairs_total\{kind="table"\} [3-9]/, 'repairs in the metrics');
  const end = Date.now();
  const results = await Promise.all(loops.map((l) => l.stop()));
  for (const [i, r] of results.entries()) {
    // Each request waits for its answer or its 500 ms deadline before the next: a loaded machine runs fewer.
    t.ok(r.length >= 30, `the loop ran (${r.length} requests)`);
    for (const [what, gap] of gapsPerDamage(r, marks, end)) t.ok(gap < GAP_BOUND_MS, `${i === 0 ? 'DHCP' : 'pool'} VIP, ${what}: longest failing stretch ${gap} ms`);
    t.ok(longestGap(r) < GAP_BOUND_MS, `${i === 0 ? 'DHCP' : 'pool'} VIP: ${r.filter((x) => !x.ok).length} of ${r.length} requests failed in all`);
  }
});

t.test('an agent that keeps losing its table to another program backs off, says so, and repairs once it stops', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const agent = await startAgent(cl.lab, cl.node, continuityConfig([{ name: 'api', ipam: 'pool' }], { metrics: { listen: '127.0.0.1:19477' } }), { name: 'a' });
  t.teardown(() => { agent.signal('SIGKILL'); });
  const st = await waitStatus(agent, 'ready', (s) => s.services.every((x) => x.ready), 30_000);
  const vip = st.services[0]!.vip!;
  const pid = agent.proc.pid!;
  const cpu0 = cpuTicks(pid);
  const t0 = Date.now();
  // Every 0.5 s for 10 s, as a misbehaving configuration-management loop would.
  let notReadySeen = false;
  let fightSeen: string | undefined;
  for (let i = 0; i < 20; i++) {
    await cl.lab.sh(cl.node, 'nft delete table ip lb_agent 2>/dev/null || true');
    await new Promise((r) => setTimeout(r, 500));
    const s = await agent.status();
    if (!s.ready) notReadySeen = true;
    fightSeen ??= s.drift?.fights[0];
  }
  const cpuMs = (cpuTicks(pid) - cpu0) * 10;
  const wall = Date.now() - t0;
  t.ok(fightSeen !== undefined && /table ip lb_agent: \d+ repairs in 60 s/.test(fightSeen), `status names the fight: ${fightSeen}`);
  t.ok(notReadySeen, 'status said not ready while the table was gone and the agent waited');
  t.ok(cpuMs < wall * 0.25, `the agent's CPU stayed bounded: ${cpuMs} ms over ${wall} ms`);
  const metrics = (await cl.lab.sh(cl.node, 'curl -s -m 2 http://127.0.0.1:19477/metrics')).stdout;
  t.match(metrics, /lbagent_drift_fights\{kind="table"\} 1/, 'the metric names the fight');
  const ready = await waitFor('the table back once the loop stopped', async () => {
    const has = (await cl.lab.sh(cl.node, 'nft list table ip lb_agent >/dev/null 2>&1 && echo yes || echo no')).stdout.trim() === 'yes';
    return has && (await agent.status()).ready;
  }, 40_000);
  t.ok(ready, 'table back and ready');
  await serving(cl, vip);
});

t.test('the parent\'s address changes: status and the metrics endpoint follow, the VIPs keep serving', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  // Bound to the parent's own address, not the wildcard: it must move with it.
  const agent = await startAgent(cl.lab, cl.node, continuityConfig([{ name: 'api', ipam: 'pool' }], { metrics: { listen: '10.99.0.2:19477' } }), { name: 'a' });
  t.teardown(() => { agent.signal('SIGKILL'); });
  const st = await waitStatus(agent, 'ready', (s) => s.services.every((x) => x.ready), 30_000);
  t.equal(st.node.address, '10.99.0.2');
  const vip = st.services[0]!.vip!;
  await cl.lab.sh(cl.node, 'ip addr del 10.99.0.2/24 dev eth0 && ip addr add 10.99.0.4/24 dev eth0');
  const s2 = await waitStatus(agent, 'status shows the new address', (s) => s.node.address === '10.99.0.4', 10_000);
  t.ok(s2.events.some((e) => e.kind === 'parent-address' && e.address === '10.99.0.4'), 'an event says so');
  const m = await waitFor('the metrics endpoint answers on the new address', async () =>
    (await cl.lab.sh(cl.client, 'curl -s -m 2 -o /dev/null -w "%{http_code}" http://10.99.0.4:19477/metrics')).stdout === '200', 5_000);
  t.ok(m, 'the metrics endpoint answers on the new address');
  await serving(cl, vip);
});

function cpuTicks(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime, stime, and the children's (the nft runs) once waited for.
  return Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
}

t.test('the proxy path: a VIP whose address or macvlan is taken away is listened on again once repaired', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  const agent = await startAgent(cl.lab, cl.node, continuityConfig([{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }], { dataplane: 'proxy' }), { name: 'a' });
  t.teardown(() => { agent.signal('SIGKILL'); });
  const st = await waitStatus(agent, 'both services ready', (s) => s.services.length === 2 && s.services.every((x) => x.ready), 30_000);
  t.equal(st.dataplane?.kind, 'proxy');
  const web = st.services.find((s) => s.name === 'web')!;
  const api = st.services.find((s) => s.name === 'api')!;
  const link = web.interface!;
  const loops = await Promise.all([web.vip!, api.vip!].map((vip) => ClientLoop.start(cl.lab, cl.client, `http://${vip}/`, { intervalMs: 20, timeoutMs: 500, maxMs: 120_000, maxCount: 6000 })));
  t.teardown(async () => { for (const l of loops) await l.stop().catch(() => undefined); });
  const damages: Array<[string, string, RegExp]> = [
    ['ip addr del of the pool VIP', `ip addr del ${api.vip}/32 dev eth0`, new RegExp(`VIP ${api.vip}/32 of default/api was removed`)],
    ['ip addr del of the DHCP VIP', `ip addr del ${web.vip}/32 dev ${link}`, new RegExp(`VIP ${web.vip}/32 of default/web was removed`)],
    ['ip link del of the DHCP macvlan', `ip link del ${link}`, new RegExp(`${link} of default/web was deleted`)],
  ];
  const marks = await damageEach(t, cl, agent, damages, [web.vip!, api.vip!]);
  const end = Date.now();
  const results = await Promise.all(loops.map((l) => l.stop()));
  for (const [i, r] of results.entries()) {
    for (const [what, gap] of gapsPerDamage(r, marks, end)) t.ok(gap < GAP_BOUND_MS, `${i === 0 ? 'DHCP' : 'pool'} VIP, proxy path, ${what}: longest failing stretch ${gap} ms`);
  }
  t.ok((await agent.status()).services.every((s) => s.ready), 'both ready again');
});
