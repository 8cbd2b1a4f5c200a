// Privileged: 50 DHCP services start together without a storm. One process
// runs them as the daemon would (one registry, one start limiter); at most
// maxConcurrentStarts acquire at once; every service ends up with its own
// macvlan, MAC and lease; removing them all releases every lease.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startDnsmasq } from '../../lab/services';
import { FAST_DHCP, dhcpLab, startDriver } from './fixtures/dhcp-harness';

const N = 50;
const MAX = 8;

if (requirePrivileged(t)) {
  t.test(`${N} services, at most ${MAX} acquiring at once`, async (t) => {
    const lab = await createLab(t);
    const { server, agent } = await dhcpLab(lab);
    const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.199', leaseTime: '10m', noPing: true });
    const services = Array.from({ length: N }, (_, i) => ({ name: `svc${i}`, namespace: 'bulk' }));
    const d = startDriver(lab, agent, { name: 'unused', services, timings: { ...FAST_DHCP, maxConcurrentStarts: MAX }, logLevel: 'info' });
    const started = Date.now();
    await waitFor(`${N} VIPs`, () => d.events.filter((e) => e.ev === 'vip').length >= N, 45_000, 100);
    t.comment(`${N} services bound in ${Date.now() - started} ms`);
    const vips = d.events.filter((e) => e.ev === 'vip');
    const addresses = new Set(vips.map((e) => (e.vip as { address: string }).address));
    const macs = new Set(vips.map((e) => (e.vip as { mac: string }).mac));
    t.equal(addresses.size, N, 'distinct addresses');
    t.equal(macs.size, N, 'distinct MACs');
    const maxActive = Math.max(0, ...d.events.filter((e) => e.ev === 'limiter').map((e) => e.maxActive as number));
    t.ok(maxActive <= MAX && maxActive >= 2, `concurrent acquisitions bounded: max ${maxActive} of ${MAX}`);
    const links = JSON.parse((await lab.exec(agent, 'ip', ['-j', 'link', 'show'])).stdout) as Array<{ ifname: string }>;
    t.equal(links.filter((l) => l.ifname.startsWith('lbv')).length, N, `${N} macvlans`);
    t.equal(dnsmasq.leases().length, N, `${N} leases in dnsmasq`);
    const metrics = await d.metrics();
    t.equal(metrics.split('\n').filter((l) => /^lbagent_dhcp_state\{.*state="BOUND"\} 1$/.test(l)).length, N, 'one registry, every service BOUND');

    d.command('release');
    await d.next((e) => e.ev === 'stopped', 30_000);
    await waitFor('every DHCPRELEASE', () => dnsmasq.log().split('\n').filter((l) => l.includes('DHCPRELEASE(eth0)')).length >= N, 10_000);
    t.pass(`${N} DHCPRELEASEs`);
    const after = JSON.parse((await lab.exec(agent, 'ip', ['-j', 'link', 'show'])).stdout) as Array<{ ifname: string }>;
    t.equal(after.filter((l) => l.ifname.startsWith('lbv')).length, 0, 'every macvlan removed');
  });
}
