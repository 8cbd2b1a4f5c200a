// Privileged, through the real agent: SIGTERM on the Master. Three agent
// "VMs" (priorities 100/150/200) serve one pool VIP. The Master's agent gets
// SIGTERM: it withdraws the VIP, then resigns with a priority-0 advert (RFC
// 5798 §6.4.3), and exits 0; the next priority takes over after Skew_Time
// (not Master_Down_Interval) and serves the VIP; the client sees a gap and
// nothing else.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { masterDownIntervalMs, skewTimeMs } from '../../agent/failover/machine';
import { buildVrrpLab, waitMaster, logAfter, logTime, POOL_VIP, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';
import { within } from '../../lab/within';

if (requirePrivileged(t)) {
  t.test('SIGTERM on the Master: priority 0, a Backup takes over after about Skew_Time', async (t) => {
    const { lab, nodes, client } = await buildVrrpLab(t);
    const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all(nodes.map((n) => n.start()));
    await waitMaster(nodes, n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);

    const loop = await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { intervalMs: 10, timeoutMs: 300, maxMs: 30_000 });
    await new Promise((r) => setTimeout(r, 300));
    const agent3 = n3.agent!;
    const termAt = Date.now();
    agent3.signal('SIGTERM');
    const exit = await within(agent3.exited, 10_000);
    t.same(exit, { code: 0, signal: null }, 'the Master exited 0');
    await waitMaster(nodes, n2);
    await n2.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
    await new Promise((r) => setTimeout(r, 1000));
    const results = await loop.stop();

    const resigned = logAfter(n3, termAt, (l) => l.op === 'stop' && l.module === 'failover');
    const heard = logAfter(n1, termAt, (l) => l.op === 'master-changed' && l.master === null);
    const master = logAfter(n2, termAt, (l) => l.op === 'transition' && l.to === 'master');
    const withdrawn = logAfter(n3, termAt, (l) => l.op === 'remove-address' && l.module === 'net/netlink');
    t.ok(withdrawn, 'n3 took the VIP off its interface');
    t.ok(withdrawn && resigned && logTime(withdrawn) <= logTime(resigned), 'before it resigned (so the new Master finds the address free)');
    // Until n3 withdrew the VIP it served it: the gap (if any) starts there.
    const g = gapReport(results, withdrawn ? logTime(withdrawn) : termAt, BACKEND_IDS);
    t.ok(heard, 'a Backup heard the priority-0 advert (Master unknown at once, RFC 5798 §6.4.2)');
    t.equal(master?.reason, 'master-resigned', 'n2 took over because the Master resigned, not because it fell silent');
    const took = master ? logTime(master) - (resigned ? logTime(resigned) : termAt) : undefined;
    t.comment(`SIGTERM -> VIP withdrawn on n3: ${withdrawn ? logTime(withdrawn) - termAt : '?'} ms; -> priority 0 sent: ${resigned ? logTime(resigned) - termAt : '?'} ms; `
      + `priority 0 -> n2 Master: ${took ?? '?'} ms (Skew_Time ${skewTimeMs(150, 10).toFixed(1)} ms, Master_Down_Interval would be ${masterDownIntervalMs(150, 10).toFixed(1)} ms); `
      + `client: ${g.count} requests, gap ${g.gapMs} ms, errors ${JSON.stringify(g.errors)}`);
    t.ok(took !== undefined && took < 1000, `n2 Master within about one advert interval of the resignation (${took ?? '?'} ms; loose bound 1 s)`);
    t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 2000, `served again within 2 s of the withdrawal (${g.servedAfterMs ?? '?'} ms)`);
    t.same(g.wrongBodies, [], 'every answer came from a backend');
    t.ok(g.gaps <= 1, `one gap at most, answers on either side (${g.gaps} runs of failures, ${g.gapMs} ms)`);
    // The client enforces a 300 ms deadline itself; the slack is for its own
      // timers on a loaded machine, not for the agent.
      t.ok(g.slowest <= 300 + 1000, `no request hung past its deadline (slowest ${g.slowest} ms)`);
    t.same(Object.keys(g.errors).filter((e) => e !== 'timeout'), [], 'the gap is silence, not refusals');
    t.equal((await n1.service('api')).state, 'backup', 'n1 stays Backup');
    const addrs = await lab.sh(n3.ns, 'ip -o -4 addr show dev eth0');
    t.notMatch(addrs.stdout, /10\.99\.0\.200/, 'n3 left no VIP behind');
  });
}
