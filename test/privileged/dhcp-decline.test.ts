// Privileged: an offered address already in use on the LAN is declined. A
// "squatter" namespace holds 10.99.0.120 without a lease; dnsmasq runs with
// --no-ping so it offers that address (asked for as loadBalancerIP); the ARP
// probe finds the squatter, the client sends DHCPDECLINE, waits declineWait,
// and binds a different address.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startDnsmasq } from '../../lab/services';
import { addressesOf, dhcpLab, linkMac, startDriver } from './fixtures/dhcp-harness';

if (requirePrivileged(t)) {
  t.test('an address in use is declined and another one bound', async (t) => {
    const lab = await createLab(t);
    const { server, agent } = await dhcpLab(lab);
    const squatter = await lab.addHost('squatter', { address: '10.99.0.120/24' });
    const squatterMac = await linkMac(lab, squatter, 'eth0');
    const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', leaseTime: '10m', noPing: true });

    const d = startDriver(lab, agent, { name: 'db', loadBalancerIP: '10.99.0.120' });
    const vip = ((await d.vip(20_000)).vip as { address: string }).address;
    t.not(vip, '10.99.0.120', `bound ${vip}, not the address in use`);
    t.match(vip, /^10\.99\.0\.\d+$/);

    await waitFor('DHCPDECLINE in the dnsmasq log', () => dnsmasq.log().includes(`DHCPDECLINE(eth0) 10.99.0.120 ${d.mac}`), 5000);
    t.pass('dnsmasq logged DHCPDECLINE of 10.99.0.120 from the service MAC');
    t.ok(d.stderr.includes(`"conflictingMac":"${squatterMac}"`), 'the probe named the squatter');
    t.same(await addressesOf(lab, agent, d.ifname), [`${vip}/32`], 'only the new address on the macvlan');
    t.notOk(d.events.some((e) => e.ev === 'vip' && (e.vip as { address: string }).address === '10.99.0.120'), 'the address in use was never bound');
    const declining = d.events.find((e) => e.ev === 'status' && /in use by/.test(String((e.status as { reason?: string }).reason)));
    t.ok(declining, 'status said why it declined');
    const leases = dnsmasq.leases().filter((l) => l.mac === d.mac);
    t.same(leases.map((l) => l.ip), [vip], 'dnsmasq holds one lease for the service: the new address');
    const metrics = await d.metrics();
    t.match(metrics, /lbagent_dhcp_declines_total\{service="db",namespace="default"\} 1/);

    d.proc.kill('SIGTERM');
    t.equal((await d.exited).code, 0);
  });
}
