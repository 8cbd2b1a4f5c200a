// Privileged, through the real agent: the old Master comes back. Three agent
// "VMs" (priorities 100/150/200) serve one pool VIP; the Master's VM (n3, 200)
// dies, n2 (150) takes over; n3 reboots and its agent starts again with its
// higher priority:
// - preempt on: n3 takes the VIP back (n2 yields at n3's first advert and
//   withdraws it; n3 waits the handover time, probes and binds it); the
//   client sees one short gap and nothing else;
// - preempt off: n3 stays Backup behind n2, which keeps serving.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { masterDownIntervalMs } from '../../agent/failover/machine';
import { buildVrrpLab, waitMaster, logAfter, logTime, metricValue, POOL_VIP, VRID, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';
import { httpGetFrom } from '../../lab/services';

if (requirePrivileged(t)) {
  for (const preempt of [true, false]) {
    t.test(`the old Master comes back with a higher priority, preempt ${preempt ? 'on' : 'off'}`, async (t) => {
      const { lab, nodes, client } = await buildVrrpLab(t);
      const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
      // n3 first: without preemption whoever is Master first stays so.
      await n3.start({ preempt });
      await n3.waitService('Master', 'api', (s) => s.failover?.state === 'master');
      await Promise.all([n1, n2].map((n) => n.start({ preempt })));
      await waitMaster(nodes, n3);
      await n3.die();
      await waitMaster(nodes, n2);
      await n2.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
      await n3.reboot();

      const loop = await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { intervalMs: 10, timeoutMs: 300, maxMs: 30_000 });
      const backAt = Date.now();
      await n3.start({ preempt, priority: 200 });
      if (preempt) {
        await waitMaster(nodes, n3);
        await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
        const yielded = logAfter(n2, backAt, (l) => l.op === 'transition' && l.to === 'backup');
        const took = logAfter(n3, backAt, (l) => l.op === 'transition' && l.to === 'master');
        t.ok(yielded, 'n2 went Backup');
        t.equal(yielded?.reason, 'higher-priority', 'because it heard a higher priority');
        t.equal(took?.reason, 'preempt', 'n3 became Master by preempting');
        const withdrawn = logAfter(n2, backAt, (l) => l.op === 'remove-address');
        const bound = logAfter(n3, backAt, (l) => l.op === 'bound');
        t.ok(withdrawn, 'n2 took the VIP off its interface');
        t.ok(withdrawn && bound && logTime(withdrawn) < logTime(bound), 'before n3 put it on its own (the handover wait, then the RFC 5227 probe)');
        await new Promise((r) => setTimeout(r, 1000));
        // n2 served the VIP until it took the address off: the gap (if any) starts there.
        const g = gapReport(await loop.stop(), withdrawn ? logTime(withdrawn) : backAt, BACKEND_IDS);
        t.comment(`preemption: n2 went Backup ${yielded ? logTime(yielded) - backAt : '?'} ms after n3's agent was started and withdrew the VIP ${withdrawn && yielded ? logTime(withdrawn) - logTime(yielded) : '?'} ms later; `
          + `n3 bound it ${bound && withdrawn ? logTime(bound) - logTime(withdrawn) : '?'} ms after that; client: ${g.count} requests, gap ${g.gapMs} ms, errors ${JSON.stringify(g.errors)}`);
        t.same(g.wrongBodies, [], 'every answer came from a backend');
        t.ok(g.gaps <= 1, `one gap at most, answers on either side (${g.gaps} runs of failures, ${g.gapMs} ms)`);
        // The client enforces a 300 ms deadline itself; the slack is for its own
      // timers on a loaded machine, not for the agent.
      t.ok(g.slowest <= 300 + 1000, `no request hung past its deadline (slowest ${g.slowest} ms)`);
        t.same(Object.keys(g.errors).filter((e) => e !== 'timeout'), [], 'the gap is silence, not refusals');
        t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 2000, `served again within 2 s (${g.servedAfterMs ?? '?'} ms)`);
        t.equal((await n2.service('api')).state, 'backup');
      } else {
        // Several Master_Down_Intervals: it must stay Backup.
        await n3.waitService('Backup following n2', 'api', (s) => s.failover?.state === 'backup' && s.failover.master === n2.ip);
        await new Promise((r) => setTimeout(r, 5 * masterDownIntervalMs(200, 10)));
        const g = gapReport(await loop.stop(), backAt, BACKEND_IDS);
        const s3 = await n3.service('api');
        t.equal((s3.failover as Record<string, unknown>).state, 'backup', 'preempt off: the returning priority 200 stays Backup');
        t.equal((s3.failover as Record<string, unknown>).master, n2.ip, 'and follows n2');
        t.equal(s3.state, 'backup');
        const s2 = await n2.service('api');
        t.equal((s2.failover as Record<string, unknown>).state, 'master', 'n2 is still Master');
        t.equal(s2.state, 'serving');
        t.equal(metricValue(await n3.metrics(), `lbagent_vrrp_transitions_total{vrid="${VRID}",to="master"}`) ?? 0, 0, 'n3 never became Master');
        t.equal(g.count - Object.values(g.errors).reduce((a, b) => a + b, 0), g.count, `the client saw no failure at all (${g.count} requests)`);
        t.same(g.wrongBodies, []);

        // n3 is a ready Backup: its rules for the VIP are armed. A client
        // that still (or wrongly) sends to n3's MAC - as clients do right
        // after a Master yields, until their ARP entry moves - must not be
        // forwarded: that connection would be reset when the entry moves.
        const table = (await lab.exec(n3.ns, 'nft', ['list', 'map', 'ip', 'lb_agent', 'services'])).stdout;
        t.match(table, POOL_VIP, 'n3 (Backup) has the VIP\'s rules armed');
        const mac = (JSON.parse((await lab.exec(n3.ns, 'ip', ['-j', 'link', 'show', 'eth0'])).stdout) as { address: string }[])[0]!.address;
        await lab.exec(client, 'ip', ['neigh', 'replace', POOL_VIP, 'lladdr', mac, 'dev', 'eth0', 'nud', 'permanent']);
        try {
          // Not dispatched, the packet is routed (ip_forward) to whoever
          // answers ARP for the VIP: the Master, which serves it.
          const r = await httpGetFrom(lab, client, `http://${POOL_VIP}/`, 1000);
          t.comment(`a request sent to the Backup's MAC: ${r.ok ? `served (${r.body.trim()})` : r.error ?? 'failed'}`);
        } finally {
          await lab.exec(client, 'ip', ['neigh', 'del', POOL_VIP, 'dev', 'eth0'], { allowFail: true });
        }
        const counters = JSON.parse((await lab.exec(n3.ns, 'nft', ['-j', 'list', 'counters', 'table', 'ip', 'lb_agent'])).stdout) as { nftables: { counter?: { name: string; packets: number } }[] };
        const dispatched = counters.nftables.filter((o) => o.counter?.name.endsWith('_conns')).reduce((a, o) => a + (o.counter?.packets ?? 0), 0);
        t.equal(dispatched, 0, 'and nothing was dispatched to a backend by the Backup (its dispatch matches only a local VIP)');
        t.equal((await httpGetFrom(lab, client, `http://${POOL_VIP}/`, 2000)).ok, true, 'through the Master again once the client\'s entry is gone');
      }
    });
  }
}
