// Privileged, through the real agent: the Master's agent crashes but its VM
// lives on (SIGKILL of the process only). Its kernel keeps the VIP address,
// the nftables rules and ip_forward, so the VIP goes on being answered by a
// node nobody manages, and the new VRRP Master's RFC 5227 probe meets it.
// - nothing a client notices: every request is answered by a backend;
// - the agent restarts (systemd would): it removes the VIP its earlier run
//   left, starts as Backup, preempts with its higher priority and serves;
//   the other node is Backup again; one holder of the VIP on the LAN.
// The new Master claims the VIP without an RFC 5227 probe (VRRP decided),
// so the stale holder does not hold it back.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { buildVrrpLab, waitMaster, logAfter, POOL_VIP, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';

if (requirePrivileged(t)) {
  t.test('the Master agent crashes, its VM lives on, the agent restarts', async (t) => {
    const { lab, nodes, client } = await buildVrrpLab(t);
    const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all(nodes.map((n) => n.start()));
    await waitMaster(nodes, n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
    const hasVip = async (n: typeof n1): Promise<boolean> => (await lab.sh(n.ns, 'ip -o -4 addr show dev eth0')).stdout.includes(`${POOL_VIP}/32`);
    const loop = await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { intervalMs: 10, timeoutMs: 300, maxMs: 30_000 });

    const crashAt = Date.now();
    n3.agent!.signal('SIGKILL');
    await n3.agent!.exited;
    await n2.waitService('VRRP Master', 'api', (s) => s.failover?.state === 'master', 5000);
    await new Promise((r) => setTimeout(r, 1000));
    t.ok(await hasVip(n3), "the crashed agent's VIP is still on its VM");
    const s2 = await n2.service('api');
    t.comment(`n2 as Master after the crash: ${s2.state}${s2.reason ? ` (${s2.reason})` : ''}`);
    t.equal(s2.state, 'serving', 'the new Master serves the VIP despite the stale holder');

    const restartAt = Date.now();
    await n3.start();
    const adopt = logAfter(n3, restartAt, (l) => l.op === 'adopt' && Array.isArray(l.removed));
    t.match(adopt?.removed, [new RegExp(`${POOL_VIP.replace(/\./g, '\\.')} \\(default/api`)], 'the restarted agent removed the VIP its earlier run left');
    await waitMaster(nodes, n3);
    await n3.waitService('serving again', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP, 10_000);
    t.equal((await n2.service('api')).state, 'backup');
    t.notOk(await hasVip(n2), 'n2 holds no VIP');
    t.notOk(await hasVip(n1), 'n1 holds no VIP');
    await new Promise((r) => setTimeout(r, 500));
    const g = gapReport(await loop.stop(), crashAt, BACKEND_IDS);
    t.comment(`client from the crash to the restarted agent serving: ${g.count} requests, ${g.gaps} gaps (${g.gapMs} ms), errors ${JSON.stringify(g.errors)}`);
    t.same(g.wrongBodies, [], 'every answer came from a backend');
    t.same(Object.keys(g.errors).filter((e) => e !== 'timeout'), [], 'no refusals');
    t.ok(g.gaps <= 1, 'at most one gap (the handover back to n3)');
  });
}
