// Privileged: RFC 5227 §2.4 defence of a held pool VIP. Another host claims
// the VIP with a gratuitous ARP: the agent defends once and keeps the
// address; a second claim within DEFEND_INTERVAL (10 s) makes it give the
// address up, mark it in conflict, and move the service to another address.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { addressesOf, ipamLab, linkMac, readClaims, startPoolDriver, ServiceStatus } from './fixtures/ipam-harness';

if (requirePrivileged(t)) {
  t.test('defend once, give up on a second conflict within 10 s, re-allocate', async (t) => {
    const lab = await createLab(t);
    const { node, other } = await ipamLab(lab);
    const otherMac = await linkMac(lab, other);
    const stateDir = lab.file('state');
    const d = startPoolDriver(lab, node, { stateDir, pools: { 'range-global': '10.99.0.200-10.99.0.210' }, services: [{ name: 'web' }] });
    const vip = await d.vip('default/web');
    t.equal(vip, '10.99.0.200');

    // One gratuitous ARP from another host claiming the VIP (busybox arping
    // binds to the sender address, which needs ip_nonlocal_bind there).
    await lab.sh(other, 'sysctl -qw net.ipv4.ip_nonlocal_bind=1');
    const garp = () => lab.exec(other, 'busybox', ['arping', '-U', '-c', '1', '-I', 'eth0', '-s', vip, vip], { allowFail: true });
    await garp();
    const defended = await waitFor('the defence', async () => {
      const st = (await d.statuses())['default/web']!;
      return (st.details.defences as number) >= 1 ? st : undefined;
    }, 5000);
    t.match(defended, { state: 'bound', vip: { address: vip }, details: { conflicts: 1, defences: 1, lastConflict: { address: vip, mac: otherMac, defended: true, phase: 'defend' } } },
      'defended once and kept the address');
    t.ok((await addressesOf(lab, node)).includes(`${vip}/32`), 'still on the parent');

    // A second claim within DEFEND_INTERVAL: give up and move.
    const from = d.events.length;
    await garp();
    const lost = await d.next((e) => e.ev === 'lost' && e.service === 'default/web', 5000, from, 'the VIP given up');
    t.match(lost.reason, new RegExp(`${otherMac}.*${vip.replace(/\./g, '\\.')}`), 'lost: names who took the address');
    const next = await d.vip('default/web', 10_000, from);
    t.equal(next, '10.99.0.201', 'moved to the next free address');
    const addrs = await addressesOf(lab, node);
    t.notOk(addrs.includes(`${vip}/32`), 'the contested address is off the parent');
    t.ok(addrs.includes(`${next}/32`));
    t.equal(readClaims(stateDir)?.['default/web']?.address, next, 'the claim moved');
    const st: ServiceStatus = (await d.statuses())['default/web']!;
    t.match(st.details, { conflicts: 2, defences: 1 });
    const m = await d.metrics();
    t.match(m, /lbagent_pool_conflicts_total\{pool="range-global"\} 2/, 'both conflicting ARPs counted once each');
    // The VIP the service is on (lbagent_service_vip_info is the daemon's, computed from this at each scrape).
    t.match(st.vip, { address: next }, 'the service moved to the next address');
    await d.kill('SIGTERM');
  });
}
