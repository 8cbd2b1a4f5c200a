// Privileged: the DHCP address source against a real dnsmasq. A lease is
// obtained from the service's own macvlan (its MAC and client id in
// dnsmasq's lease file), the VIP answers pings from another namespace,
// dnsmasq's default ping check (OFFER ~3 s late) is survived, and removing the
// service sends DHCPRELEASE, deletes the macvlan and forgets the parent's
// neighbour entry of the VIP.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startDnsmasq } from '../../lab/services';
import { clientIdForService, macForService } from '../../agent/net/ownership/ownership';
import { addressesOf, dhcpLab, linkMac, ping, startDriver } from './fixtures/dhcp-harness';

if (requirePrivileged(t)) {
  t.test('lease from dnsmasq (with its ping check), VIP reachable, release on removal', async (t) => {
    const lab = await createLab(t);
    const { server, agent, client } = await dhcpLab(lab);
    // No noPing: dnsmasq pings an address for ~3 s before offering it; our DISCOVERs are retransmitted meanwhile.
    const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', leaseTime: '2m' });
    // The lab turns IPv6 off in its namespaces; a VM has it on, so new links in the agent's get it here too.
    await lab.sh(agent, 'sysctl -qw net.ipv6.conf.default.disable_ipv6=0');
    // Every IPv6 frame from the service MAC that reaches the server, from before the macvlan exists.
    const v6 = lab.spawn(server, 'tcpdump', ['-i', 'eth0', '-nn', '-l', '-e', '--immediate-mode', `ether src ${macForService('default/web')} and ip6`], { stdio: ['ignore', 'pipe', 'pipe'] });
    t.teardown(() => { v6.kill('SIGKILL'); });
    let v6Frames = '';
    v6.stdout!.on('data', (b: Buffer) => { v6Frames += b.toString(); });
    let v6Err = '';
    v6.stderr!.on('data', (b: Buffer) => { v6Err += b.toString(); });
    await waitFor('tcpdump listening', () => v6Err.includes('listening on'), 5000);
    const d = startDriver(lab, agent, { name: 'web' });
    const started = Date.now();
    const vipEv = await d.vip(20_000);
    const vip = vipEv.vip as { address: string; prefix: number; ifname: string; mac: string };
    t.comment(`bound ${vip.address} after ${Date.now() - started} ms`);
    t.equal(vip.ifname, d.ifname);
    t.equal(vip.mac, d.mac);
    t.match(vip.address, /^10\.99\.0\.(1[0-4]\d|150)$/, 'an address from the range');

    const sends = d.stderr.split('\n').filter((l) => l.includes('DHCPDISCOVER sent')).length;
    t.ok(sends >= 2, `DISCOVER retransmitted while dnsmasq pinged (${sends} sent)`);

    // dnsmasq's view: the service's MAC and client id.
    const lease = await waitFor('dnsmasq lease', () => dnsmasq.leases().find((l) => l.ip === vip.address), 5000);
    t.equal(lease.mac, d.mac, 'lease under the service MAC');
    t.equal(lease.clientId, [...clientIdForService('default/web')].map((b) => b.toString(16).padStart(2, '0')).join(':'), 'and client id');
    t.equal(lease.hostname, 'web', 'hostname option = service name');
    t.equal(dnsmasq.leases().length, 1);

    // The kernel's view: the VIP on the macvlan, the macvlan has the service MAC.
    t.same(await addressesOf(lab, agent, d.ifname), [`${vip.address}/32`]);
    t.equal(await linkMac(lab, agent, d.ifname), d.mac);
    const mode = await lab.exec(agent, 'ip', ['-d', '-j', 'link', 'show', 'dev', d.ifname]);
    t.equal((JSON.parse(mode.stdout) as Array<{ linkinfo: { info_data: { mode: string } } }>)[0]!.linkinfo.info_data.mode, 'bridge');
    // IPv4 only: no link-local address, and not one IPv6 frame (DAD, MLD, router solicitation) from the
    // service MAC in the ~3 s since the link went up (dnsmasq's ping check): the kernel sends MLD at once.
    t.equal((await lab.exec(agent, 'cat', [`/proc/sys/net/ipv6/conf/${d.ifname}/disable_ipv6`])).stdout.trim(), '1', 'IPv6 off on the service macvlan');
    // DESIGN.md "ARP flux", set through netlink on the request that brought the new link up (the namespace's defaults are 0 0 0).
    const conf = await lab.sh(agent, ['arp_ignore', 'arp_announce', 'rp_filter'].map((k) => `cat /proc/sys/net/ipv4/conf/${d.ifname}/${k}`).join('; '));
    t.same(conf.stdout.split('\n').filter(Boolean), ['1', '2', '2'], 'arp_ignore, arp_announce, rp_filter on the service macvlan');
    t.same(JSON.parse((await lab.exec(agent, 'ip', ['-j', '-6', 'addr', 'show', 'dev', d.ifname])).stdout), [], 'no IPv6 address on it');
    t.equal(v6Frames, '', 'no IPv6 frame from the service MAC reached the LAN');

    // Reachable from another namespace (never from the parent: macvlan rule).
    t.ok(await waitFor('ping of the VIP', () => ping(lab, client, vip.address), 10_000), 'VIP answers pings from the client namespace');
    const neigh = await lab.exec(client, 'ip', ['-j', 'neigh', 'show', vip.address]);
    t.equal((JSON.parse(neigh.stdout) as Array<{ lladdr: string }>)[0]?.lladdr, d.mac, 'and ARP resolves it to the service MAC');

    const status = await d.next((e) => e.ev === 'status' && (e.status as { state: string }).state === 'bound', 2000);
    const details = (status.status as { details: Record<string, unknown> }).details;
    t.equal(details.state, 'BOUND');
    t.equal(details.address, vip.address);
    t.equal(details.server, '10.99.0.2');
    t.ok(details.renewAt && details.rebindAt && details.expiresAt && details.obtained, 'lease times in status');

    const metrics = await d.metrics();
    t.match(metrics, /lbagent_dhcp_state\{service="web",namespace="default",state="BOUND"\} 1/);
    t.match(metrics, /lbagent_dhcp_acquire_duration_seconds_count\{service="web",namespace="default"\} 1/);
    t.match(metrics, /lbagent_dhcp_lease_expiry_timestamp_seconds\{service="web",namespace="default"\} \d+/);

    // Service removed: DHCPRELEASE, VIP and macvlan gone, lease file gone.
    // What the parent could have learnt of the VIP while this node forwarded
    // for its holder of that time (VRRP): a stale MAC it would forward the
    // VIP's traffic to once the VIP is gone from here.
    await lab.sh(agent, `ip neigh replace ${vip.address} lladdr 02:00:00:00:00:61 dev eth0 nud stale`);
    const from = d.events.length;
    d.command('release');
    await d.next((e) => e.ev === 'stopped', 10_000, from);
    const lost = await d.next((e) => e.ev === 'lost', 1000, from);
    t.match(lost.reason, /released/);
    t.equal((await lab.sh(agent, `ip neigh show ${vip.address} dev eth0`)).stdout.trim(), '', "the parent's neighbour entry of the VIP went with it");
    await waitFor('DHCPRELEASE in the dnsmasq log', () => dnsmasq.log().includes(`DHCPRELEASE(eth0) ${vip.address} ${d.mac}`), 5000);
    t.pass('dnsmasq logged the DHCPRELEASE');
    t.equal(await addressesOf(lab, agent, d.ifname), undefined, 'macvlan deleted');
    await waitFor('lease removed from dnsmasq', () => !dnsmasq.leases().some((l) => l.ip === vip.address), 5000);
    t.pass('dnsmasq dropped the lease');
    const files = (await lab.sh(agent, `ls ${lab.file('state')}`)).stdout.trim();
    t.equal(files, '', 'saved lease deleted');
    t.equal((await d.exited).code, 0);
  });
}
