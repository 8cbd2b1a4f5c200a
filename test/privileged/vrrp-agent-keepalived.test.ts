// Privileged, through the real agent: interoperability with keepalived
// (Debian's, VRRPv3) on the same virtual router. Three agent "VMs"
// (priorities 100/150/200) serve a pool VIP with a loadBalancerIP; keepalived
// in a fourth namespace runs the same VRID with priority 190 and the same
// VIP in virtual_ipaddress (it drops adverts whose address list differs from
// its own, so the agents must list the VIP from the first advert on - see
// VrrpGate.advertisedVips). The election follows priorities both ways:
// - n3 (200) is Master: keepalived (190) stays BACKUP;
// - n3's VM dies: keepalived (190) outranks n2 (150) and becomes MASTER; the
//   agents follow it as Backups;
// - n3 comes back (preempt): keepalived yields to it and n3 serves again;
// - keepalived never logs a malformed or mismatching advert from us.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { startKeepalived } from '../../lab/keepalived';
import { buildVrrpLab, waitMaster, logAfter, logTime, metricValue, POOL_VIP, VRID, KEEPALIVED } from '../../lab/vrrp';

if (requirePrivileged(t)) {
  t.test('agents and keepalived on one virtual router elect by priority, both ways', async (t) => {
    const { lab, nodes, ka } = await buildVrrpLab(t, { keepalived: true });
    const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all(nodes.map((n) => n.start()));
    await waitMaster(nodes, n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
    const k = await startKeepalived(lab, ka!, 'ka', { vrid: VRID, priority: 190, advertInt: 0.1, vips: [POOL_VIP] });
    t.teardown(() => k.stop());

    t.test('n3 (200) Master, keepalived (190) BACKUP', async (t) => {
      await waitFor('keepalived BACKUP', () => k.state() === 'BACKUP', 5000);
      await new Promise((r) => setTimeout(r, 1000));
      t.equal(k.state(), 'BACKUP', 'keepalived stays BACKUP behind n3');
      t.same(k.notified().map((l) => l.split(' ')[2]), ['BACKUP'], 'and never went MASTER');
      await waitMaster(nodes, n3, 'api', 2000);
      t.pass('the agents still agree n3 is Master');
    });

    t.test("n3's VM dies: keepalived (190) outranks n2 (150) and the agents follow it", async (t) => {
      const killedAt = await n3.die();
      await waitFor('keepalived MASTER', () => k.state() === 'MASTER', 5000);
      const kaAt = Date.now();
      await waitFor('n1 and n2 follow keepalived', async () => {
        for (const n of [n1, n2]) {
          const f = (await n.service('api')).failover as { state: string; master?: string };
          if (f.state !== 'backup' || f.master !== KEEPALIVED) return false;
        }
        return true;
      }, 5000);
      const n2Master = logAfter(n2, killedAt, (l) => l.op === 'transition' && l.to === 'master');
      t.comment(`SIGKILL -> keepalived MASTER seen by polling its notify file within ${kaAt - killedAt} ms${n2Master ? `; n2 was briefly Master at ${logTime(n2Master) - killedAt} ms (Master_Down_Intervals 325.8 vs 341.4 ms)` : ''}`);
      await new Promise((r) => setTimeout(r, 1000));
      t.equal(k.state(), 'MASTER', 'keepalived stays MASTER');
      for (const n of [n1, n2]) {
        const s = await n.service('api');
        t.equal(s.state, 'backup', `${n.name} is Backup`);
        t.equal((s.failover as Record<string, unknown>).master, KEEPALIVED, `${n.name} names keepalived as Master`);
        t.equal((s.failover as Record<string, unknown>).masterPriority, 190);
      }
      const m2 = await n2.metrics();
      t.equal(metricValue(m2, `lbagent_vrrp_master_info{vrid="${VRID}",master="${KEEPALIVED}"}`), 1, 'metrics name keepalived');
      t.equal(metricValue(m2, 'lbagent_vrrp_dropped_total{reason="bad-checksum"}') ?? 0, 0, "keepalived's adverts verify");
      t.same((await n2.service('api')).failover?.heardVips, [POOL_VIP], "keepalived's adverts list the VIP");
      t.notOk((await lab.sh(n2.ns, 'ip -o -4 addr show dev eth0')).stdout.includes(POOL_VIP), 'n2 does not hold the VIP');
    });

    t.test('n3 comes back (preempt): keepalived yields to it, n3 serves again', async (t) => {
      await n3.reboot();
      const backAt = Date.now();
      await n3.start();
      await waitFor('keepalived BACKUP again', () => k.state() === 'BACKUP', 5000);
      await waitMaster(nodes, n3, 'api', 5000);
      await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
      const took = logAfter(n3, backAt, (l) => l.op === 'transition' && l.to === 'master');
      t.equal(took?.reason, 'preempt', 'n3 preempted keepalived');
      t.match(k.log(), /received advert from 10\.99\.0\.4 with higher priority 200, ours 190/, "keepalived's log names n3 and its priority");
      t.same(k.notified().map((l) => l.split(' ')[2]), ['BACKUP', 'MASTER', 'BACKUP'], "keepalived's states");
      t.notOk((await lab.sh(ka!, 'ip -o -4 addr show dev eth0')).stdout.includes(POOL_VIP), 'keepalived withdrew the VIP');
    });

    t.test('keepalived found nothing wrong with our adverts', async (t) => {
      // keepalived 2.2: "received an unexpected ip number count 0, expected 1!" (older: "invalid ip number count"),
      // "ip address associated with VRID ... not present in MASTER advert", checksum/TTL/length complaints.
      t.notMatch(k.log(), /ip number count|not present in (the )?MASTER advert|bogus VRRP packet|invalid (ttl|checksum|version|type)|Invalid VRRPv3 checksum|length mismatch/i);
    });
  });
}
