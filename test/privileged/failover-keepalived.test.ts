// Privileged: interoperability with keepalived (Debian's, VRRPv3) on the same
// VRID in lab namespaces. Our VirtualRouter (fixtures/failover-router.ts) and
// keepalived elect by priority both ways, and each honours the other's
// priority-0 resignation. keepalived's view is read from its notify script's
// state file and its log. Both advertise the same VIP (keepalived drops
// adverts whose address list differs from its own).
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { masterDownIntervalMs } from '../../agent/failover/machine';
import { RouterProc } from './fixtures/failover-client';
import { startKeepalived, type Keepalived } from '../../lab/keepalived';

if (requirePrivileged(t)) {
  const INTERVAL = 0.2;
  const VRID = 51;
  const VIP = '10.99.0.100';
  const OURS = '10.99.0.11';
  const KA = '10.99.0.40';

  async function lab2(t: { teardown(fn: () => unknown): void }): Promise<{ lab: Lab; ours: string; ka: string }> {
    const lab = await createLab(t);
    const ours = await lab.addHost('ours', { address: `${OURS}/24` });
    const ka = await lab.addHost('ka', { address: `${KA}/24` });
    return { lab, ours, ka };
  }

  async function keepalived(t: { teardown(fn: () => unknown): void }, lab: Lab, ns: string, priority: number): Promise<Keepalived> {
    const k = await startKeepalived(lab, ns, 'ka', { vrid: VRID, priority, advertInt: INTERVAL, vips: [VIP] });
    t.teardown(() => k.stop());
    return k;
  }

  t.test('keepalived has the higher priority: ours stays Backup and follows it; its priority 0 hands over to us', async (t) => {
    const { lab, ours, ka } = await lab2(t);
    const k = await keepalived(t, lab, ka, 200);
    await waitFor('keepalived MASTER', () => k.state() === 'MASTER', 10_000);
    const r = await RouterProc.start(lab, ours, 'ours', { srcIp: OURS, priority: 100, interval: INTERVAL, vips: [VIP] });
    t.teardown(() => r.kill('SIGKILL'));
    await r.waitEvent('keepalived seen as Master', (e) => e.event === 'master-changed' && e.master === KA, 5000);
    await new Promise((res) => setTimeout(res, 5 * masterDownIntervalMs(100, INTERVAL * 100)));
    t.equal(r.state, 'backup', 'ours is Backup');
    t.equal(r.master, KA, 'and names keepalived as Master');
    t.equal(r.events.filter((e) => e.event === 'master').length, 0, 'ours never became Master');
    t.equal(k.state(), 'MASTER', 'keepalived stayed MASTER');
    t.equal(await r.metric('lbagent_vrrp_dropped_total{reason="bad-checksum"}'), 0, "keepalived's checksums verify");
    t.ok((await r.metric(`lbagent_vrrp_adverts_received_total{vrid="${VRID}"}`)) > 10, 'its adverts are counted');
    t.equal(await r.metric(`lbagent_vrrp_master_info{vrid="${VRID}",master="${KA}"}`), 1, 'master_info names keepalived');

    const from = r.events.length;
    const stopAt = Date.now();
    await k.stop(); // SIGTERM: keepalived sends priority 0
    const became = await r.waitEvent('Master after keepalived resigned', (e) => e.event === 'master', 5000, from);
    t.ok(r.events.slice(from).some((e) => e.event === 'master-changed' && e.master === undefined), 'its priority-0 advert was understood');
    t.comment(`keepalived SIGTERM -> ours Master: ${became.t - stopAt} ms (Skew_Time for priority 100 at ${INTERVAL} s: ${((156 * INTERVAL * 1000) / 256).toFixed(1)} ms)`);
  });

  t.test('ours has the higher priority: keepalived goes BACKUP; our priority 0 hands over to it', async (t) => {
    const { lab, ours, ka } = await lab2(t);
    const k = await keepalived(t, lab, ka, 100);
    await waitFor('keepalived MASTER alone', () => k.state() === 'MASTER', 10_000);
    const r = await RouterProc.start(lab, ours, 'ours', { srcIp: OURS, priority: 200, interval: INTERVAL, vips: [VIP] });
    t.teardown(() => r.kill('SIGKILL'));
    const startedAt = Date.now();
    const became = await r.waitEvent('ours Master (preempting keepalived)', (e) => e.event === 'master', 5000);
    t.comment(`ours preempted keepalived ${became.t - startedAt} ms after start`);
    await waitFor('keepalived BACKUP', () => k.state() === 'BACKUP', 5000);
    t.pass('keepalived went BACKUP (notify script)');
    t.match(k.log(), new RegExp(`received advert from ${OURS.replace(/\./g, '\\.')} with higher priority 200, ours 100`), "keepalived's log names us and our priority");
    await new Promise((res) => setTimeout(res, 1500));
    t.equal(k.state(), 'BACKUP', 'and stays BACKUP');
    t.equal(r.state, 'master');
    t.notMatch(k.log(), /bogus VRRP packet|invalid (ttl|checksum|version)|ip number count/i, 'keepalived found nothing wrong with our adverts');

    const stopAt = Date.now();
    await r.kill('SIGTERM'); // priority 0
    await waitFor('keepalived MASTER again', () => k.state() === 'MASTER', 5000);
    t.comment(`ours SIGTERM -> keepalived MASTER: ${Date.now() - stopAt} ms (as seen by polling its notify file)`);
    t.match(k.log(), /Backup received priority 0 advertisement/, 'keepalived logged our priority-0 advert');
  });
}
