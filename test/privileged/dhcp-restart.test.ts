// Privileged: restarts keep the lease. After SIGTERM (shutdown: macvlan
// removed, lease kept, nothing sent) and after SIGKILL (macvlan left behind
// with the VIP on it), the next start uses the same MAC, asks for the same
// address with INIT-REBOOT, gets it, and dnsmasq still holds one lease.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startDnsmasq } from '../../lab/services';
import { addressesOf, dhcpLab, linkMac, ping, startDriver } from './fixtures/dhcp-harness';

if (requirePrivileged(t)) {
  t.test('SIGTERM and SIGKILL restarts: same MAC, same address, one lease', async (t) => {
    const lab = await createLab(t);
    const { server, agent, client } = await dhcpLab(lab);
    const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', leaseTime: '10m', noPing: true });
    const count = (what: string, mac: string): number => dnsmasq.log().split('\n').filter((l) => l.includes(`${what}(eth0)`) && l.includes(mac)).length;

    const first = startDriver(lab, agent, { name: 'api', namespace: 'shop' });
    const vip = ((await first.vip()).vip as { address: string }).address;
    t.equal(count('DHCPDISCOVER', first.mac), 1, 'first start: DISCOVER');

    // SIGTERM: shutdown. The macvlan goes, the lease stays (no DHCPRELEASE).
    first.proc.kill('SIGTERM');
    const exit1 = await first.exited;
    t.equal(exit1.code, 0, 'clean exit');
    t.ok(first.events.some((e) => e.ev === 'stopped' && e.release === false));
    t.equal(await addressesOf(lab, agent, first.ifname), undefined, 'macvlan removed on shutdown');
    t.notOk(dnsmasq.log().includes('DHCPRELEASE'), 'nothing released on shutdown');
    const saved = JSON.parse((await lab.sh(agent, `cat ${lab.file('state')}/dhcp-shop_api.json`)).stdout) as { address: string; mac: string };
    t.equal(saved.address, vip, 'lease saved');
    t.equal(saved.mac, first.mac);

    const second = startDriver(lab, agent, { name: 'api', namespace: 'shop' });
    t.equal(((await second.vip()).vip as { address: string }).address, vip, 'same address after SIGTERM');
    t.equal(second.mac, first.mac);
    t.equal(await linkMac(lab, agent, second.ifname), first.mac, 'same MAC on the recreated macvlan');
    t.equal(count('DHCPDISCOVER', first.mac), 1, 'no new DISCOVER: INIT-REBOOT');
    t.ok(second.stderr.includes('"from":"STOPPED","to":"INIT-REBOOT"'), 'started in INIT-REBOOT');
    t.equal(dnsmasq.leases().length, 1, 'one lease in dnsmasq');

    // SIGKILL: nothing is cleaned up; the macvlan stays with the VIP on it.
    second.proc.kill('SIGKILL');
    await second.exited;
    t.same(await addressesOf(lab, agent, second.ifname), [`${vip}/32`], 'after SIGKILL the macvlan and VIP are left behind');

    const third = startDriver(lab, agent, { name: 'api', namespace: 'shop' });
    t.equal(((await third.vip()).vip as { address: string }).address, vip, 'same address after SIGKILL');
    t.ok(third.stderr.includes('adopted the service macvlan'), 'the macvlan left behind was adopted');
    t.same(await addressesOf(lab, agent, third.ifname), [`${vip}/32`]);
    t.equal(await linkMac(lab, agent, third.ifname), first.mac);
    const links = await lab.exec(agent, 'ip', ['-j', 'link', 'show']);
    t.equal((JSON.parse(links.stdout) as Array<{ ifname: string }>).filter((l) => l.ifname.startsWith('lbv')).length, 1, 'exactly one service macvlan');
    t.equal(dnsmasq.leases().length, 1, 'still one lease in dnsmasq');
    t.equal(count('DHCPDISCOVER', first.mac), 1, 'still no new DISCOVER');
    t.ok(await waitFor('ping of the VIP', () => ping(lab, client, vip), 10_000), 'VIP reachable after the restarts');

    third.proc.kill('SIGTERM');
    t.equal((await third.exited).code, 0);
  });
}
