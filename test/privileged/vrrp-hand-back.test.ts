// Privileged, through the real agent (kernel data path, SNAT): an answer in
// flight when the VIP moves. A client's request went through the Master to a
// backend that takes a second to answer; meanwhile the Master's agent is
// SIGKILLed (its VM lives on: the kernel keeps the VIP, the rules and the
// connection's conntrack entry) and a Backup takes the VIP over. The
// backend's answer, addressed to the VIP, now reaches the new Master, which
// never saw the connection: without the hand-back its kernel answered it with
// a reset and the client got nothing (the in-flight loss the vrrp-systemd
// test measured). With it the new Master hands the answer back to the
// previous Master (forward/nft.ts "Hand-back"), whose conntrack maps it to
// the client. Also: the rule is armed on a Backup (aimed at the Master it
// follows), counts what it handed back (table and /metrics), and is gone
// HAND_BACK_MS after the takeover. The same for an IPv6 VIP: the rule in
// `table ip6 lb_agent` by hop limit, aimed at the Master's link-local
// address (the source of its IPv6 adverts) on the parent. In both families
// a client loop (a request every 20 ms on a new connection, 300 ms each)
// runs across the takeover and loses none.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { httpGetFrom } from '../../lab/services';
import { buildVrrpLab, metricValue, waitMaster, POOL_VIP, BACKENDS } from '../../lab/vrrp';
import { HAND_BACK_MS } from '../../agent/failover/gate';
import { createLab } from '../../lab/netns';
import { startBackend } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import { ClientLoop, gapReport } from '../../lab/client-loop';
import type { Lab } from '../../lab/netns';

/** A client loop across the takeover: none of its requests may fail. */
async function loopAcross(t: tap.Test, lab: Lab, client: string, url: string): Promise<{ done(at: number, bodies: readonly string[]): Promise<void> }> {
  const loop = await ClientLoop.start(lab, client, url, { intervalMs: 20, timeoutMs: 300, maxMs: 20_000 });
  t.teardown(() => loop.stop().then(() => undefined));
  return {
    async done(at, bodies) {
      await loop.waitServed('an answer after the takeover', at, 5000);
      await new Promise((r) => setTimeout(r, 300));
      const g = gapReport(await loop.stop(), at, bodies);
      t.comment(`client loop across the takeover: ${g.count} requests, ${g.failures.length} failed, slowest ${g.slowest} ms, errors ${JSON.stringify(g.errors)}`);
      t.equal(g.failures.length, 0, `no request failed (${g.count} every 20 ms across the takeover)`);
      t.same(g.wrongBodies, [], 'every answer from a backend');
    },
  };
}
import { addVm6, agentConfig6, BACKEND6, VIP6 } from '../../lab/vrrp6';

if (requirePrivileged(t)) {
  t.test('a backend answer in flight at a takeover reaches the client through the previous Master', async (t) => {
    const { lab, nodes, client } = await buildVrrpLab(t);
    const [, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all([n2, n3].map((n) => n.start()));
    await waitMaster([n2, n3], n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP && (s.backends ?? []).every((b) => b.state === 'up'));
    const table = async (ns: string): Promise<string> => (await lab.sh(ns, 'nft list table ip lb_agent')).stdout;
    await waitFor("n2's hand-back armed, aimed at n3", async () => /dup to 10\.99\.0\.4 device "eth0"/.test(await table(n2.ns)), 5000);
    t.match(await table(n2.ns), new RegExp(`ip daddr ${POOL_VIP.replace(/\./g, '\\.')} ip saddr \\{ ${BACKENDS.join(', ').replace(/\./g, '\\.')} \\} tcp sport 8080 ip ttl \\{ 64, 128, 255 \\} ct state (new,invalid|invalid,new) goto hand_back_s0`), 'for the backends\' target port to the VIP, straight from them, connections n2 never saw');
    // n3 may have preempted n2 at start (then it hands back to n2 for a while): that window closes first.
    await waitFor("the Master's own hand-back, if any, over", async () => !/hand_back/.test(await table(n3.ns)), HAND_BACK_MS + 5000);

    const loop = await loopAcross(t, lab, client, `http://${POOL_VIP}/`);
    // The request goes through n3 now; the backend answers in 1.5 s.
    const answer = httpGetFrom(lab, client, `http://${POOL_VIP}/slow/1500`, 8000);
    await new Promise((r) => setTimeout(r, 300));
    const killedAt = Date.now();
    n3.agent!.signal('SIGKILL');
    await n3.agent!.exited;
    await n2.waitService('VRRP Master', 'api', (s) => s.failover?.state === 'master', 5000);
    const tookOverMs = Date.now() - killedAt;
    t.ok(tookOverMs < 1200, `n2 took the VIP over (${tookOverMs} ms after the kill) before the backend answered`);
    const r = await answer;
    t.ok(r.ok, `the client got the answer (${r.ok ? r.body.trim() : r.error})`);
    t.match(r.body, /^b[12]\n$/, 'from a backend');
    const handed = /counter s0_handed_back \{\s*packets (\d+)/.exec(await table(n2.ns));
    t.ok(Number(handed?.[1]) >= 1, `n2 handed ${handed?.[1]} packet(s) back to n3`);

    // The window closes: the rule goes with the next table.
    await waitFor('the hand-back rule gone after HAND_BACK_MS', async () => !/hand_back/.test(await table(n2.ns)), HAND_BACK_MS + 5000);
    t.pass(`gone within ${HAND_BACK_MS} ms + an apply`);
    // And in the metrics, after the table that ended it (the count stays with the service).
    const sample = 'lbagent_forward_handed_back_packets_total{service="api",namespace="default"}';
    const counted = await waitFor('the handed-back packets in /metrics', async () => { const v = metricValue(await n2.metrics(), sample); return v !== undefined && v >= 1 ? v : undefined; }, 5000);
    t.ok(counted >= Number(handed?.[1]), `${sample} ${counted}`);
    await loop.done(killedAt, ['b1', 'b2']);
  });

  t.test('an IPv6 VIP: the answer in flight at a takeover is handed back to the previous Master by its link-local address', async (t) => {
    const lab = await createLab(t);
    const n1 = await addVm6(lab, 'n1', 2);
    const n3 = await addVm6(lab, 'n3', 4);
    const b6 = await lab.addHost('b6', { address: '10.99.0.12/24', ipv6: [`${BACKEND6}/64`] });
    const client = await lab.addHost('client', { address: '10.99.0.80/24', ipv6: ['fd00:99::50/64'] });
    await startBackend(lab, b6, 'b6', [8080], '::');
    const cfg = (v: typeof n1, priority: number): Record<string, unknown> => agentConfig6(v, priority, { advertInterval: 0.1, vrid: 51 });
    const a3 = await startAgent(lab, n3.ns, cfg(n3, 200), { name: 'n3' });
    const a1 = await startAgent(lab, n1.ns, cfg(n1, 100), { name: 'n1' });
    const api = (d: Awaited<ReturnType<typeof a1.status>>): (typeof d.services)[number] | undefined => d.services.find((s) => s.name === 'api');
    await waitStatus(a3, 'n3 serves the IPv6 VIP', (d) => api(d)?.state === 'serving' && api(d)?.vip === VIP6 && (api(d)?.backends ?? []).every((b) => b.state === 'up'), 15_000);
    const table = async (ns: string): Promise<string> => (await lab.sh(ns, 'nft list table ip6 lb_agent')).stdout;
    await waitFor("n1's IPv6 hand-back armed, aimed at n3's link-local address", async () => (await table(n1.ns)).includes(`dup to ${n3.linkLocal} device "eth0"`), 5000);
    t.match(await table(n1.ns), new RegExp(`ip6 daddr ${VIP6} ip6 saddr ${BACKEND6} tcp sport 8080 ip6 hoplimit \\{ 64, 128, 255 \\} ct state (new,invalid|invalid,new) goto hand_back_v6s0`),
      "for the backend's target port to the VIP, straight from it, connections n1 never saw");
    await waitFor("the Master's own hand-back, if any, over", async () => !/hand_back/.test(await table(n3.ns)), HAND_BACK_MS + 5000);

    const loop = await loopAcross(t, lab, client, `http://[${VIP6}]/`);
    // Through n3; the backend answers in 1.5 s; n3's agent dies (its VM, kernel and conntrack live on).
    const answer = httpGetFrom(lab, client, `http://[${VIP6}]/slow/1500`, 8000);
    await new Promise((r) => setTimeout(r, 300));
    const killedAt = Date.now();
    a3.signal('SIGKILL');
    await a3.exited;
    await waitStatus(a1, 'n1 VRRP Master', (d) => api(d)?.failover?.state === 'master', 5000);
    const tookOverMs = Date.now() - killedAt;
    t.ok(tookOverMs < 1200, `n1 took the IPv6 VIP over (${tookOverMs} ms after the kill) before the backend answered`);
    const r = await answer;
    t.ok(r.ok, `the client got the answer (${r.ok ? r.body.trim() : r.error})`);
    t.equal(r.body, 'b6\n', 'from the backend');
    const handed = /counter v6s0_handed_back \{\s*packets (\d+)/.exec(await table(n1.ns));
    t.ok(Number(handed?.[1]) >= 1, `n1 handed ${handed?.[1]} packet(s) back to n3`);
    await loop.done(killedAt, ['b6']);
  });
}
