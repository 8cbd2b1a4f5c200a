// Privileged: a dual-stack DHCP service against the real dnsmasq, with DHCPv6
// and router advertisements (enable-ra) on the LAN, by the real agent on
// the kernel path. Both leases ride one macvlan with the service's MAC; the
// DHCPv6 lease is the service's DUID-LL and the IPv6 VIP is a /128 on the
// macvlan, next to its link-local address and nothing else (no SLAAC from
// the advertisements). A client on the LAN is served through the IPv6 VIP;
// a deleted VIP is put back by the drift guard; a SIGKILL and a new start
// keep the same address (the saved lease resumed
// and confirmed) with no failed request in a 20 ms loop, and so does a
// planned restart (SIGTERM with --on-stop keep, then start); removing the
// service releases the lease (dnsmasq logs the RELEASE) and takes the
// macvlan away.
import t from 'tap';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { httpGetFrom, startBackend, startDnsmasq } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import { ClientLoop, gapReport } from '../../lab/client-loop';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';

const RANGE6 = /^fd00:99::1[0-9a-f]{2}$/;

async function addrsOf(lab: Lab, ns: string, ifname: string): Promise<string[]> {
  const r = await lab.exec(ns, 'ip', ['-j', '-6', 'addr', 'show', 'dev', ifname], { allowFail: true });
  const links = JSON.parse(r.stdout || '[]') as { addr_info: { local: string; prefixlen: number; scope: string }[] }[];
  return (links[0]?.addr_info ?? []).map((a) => `${a.local}/${a.prefixlen} ${a.scope}`);
}

if (requirePrivileged(t)) {
  t.test('dual-stack DHCP service: DHCPv6 lease from dnsmasq on the shared macvlan, served, put back after a deletion, kept across SIGKILL, released on removal', async (t) => {
    const lab = await createLab(t);
    const server = await lab.addHost('server', { address: '10.99.0.1/24', ipv6: ['fd00:99::1/64'] });
    const node = await lab.addHost('node', { address: '10.99.0.2/24', ipv6: ['fd00:99::2/64'] });
    const b = await lab.addHost('b', { address: '10.99.0.11/24', ipv6: ['fd00:99::11/64'] });
    const client = await lab.addHost('client', { address: '10.99.0.50/24', ipv6: ['fd00:99::50/64'] });
    await startBackend(lab, b, 'b', [8080], '::');
    const dnsmasq = await startDnsmasq(lab, server, {
      range: '10.99.0.100,10.99.0.150', noPing: true,
      extra: ['--dhcp-range=fd00:99::100,fd00:99::1ff,64,1h', '--enable-ra'],
    });

    const mac = macForService('default/web');
    const ifname = linkNameForService('default/web');
    const duid = `00:03:00:01:${mac}`;
    const hc = { periodSeconds: 0.5, timeoutSeconds: 0.4 };
    const cfg = {
      node: { interface: 'eth0' },
      metrics: { listen: '10.99.0.2:9477' },
      dataplane: 'kernel',
      arp: { probeWait: 0.1, probeNum: 1, probeMin: 0.2, probeMax: 0.3, announceWait: 0.2, announceNum: 2, announceInterval: 0.2 },
      dhcp: { retransmitInitial: 0.5, retransmitMax: 2, retransmitJitter: 0.1 },
      services: [{ name: 'web', ipam: 'dhcp', ipFamilyPolicy: 'RequireDualStack', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11', 'fd00:99::11'], healthCheck: hc }],
    };
    const agent = await startAgent(lab, node, cfg, { name: 'd6' });
    const st = await waitStatus(agent, 'both VIPs serving', (s) => ['default/web', 'default/web@IPv6'].every((k) => s.services.find((x) => x.key === k)?.ready), 30_000);
    const v6 = st.services.find((s) => s.key === 'default/web@IPv6')!;
    const v4 = st.services.find((s) => s.key === 'default/web')!;
    const vip6 = v6.vip!;
    t.match(vip6, RANGE6, `the IPv6 VIP ${vip6} comes from dnsmasq's DHCPv6 range`);
    t.match(v6, { family: 'IPv6', mac, state: 'serving' }, 'served from the service MAC');
    t.match(v4, { family: 'IPv4', mac }, 'the IPv4 VIP from the same MAC');
    t.same((await addrsOf(lab, node, ifname)).filter((a) => !a.endsWith(' link')), [`${vip6}/128 global`],
      `on ${ifname}, the one macvlan of both leases, the IPv6 VIP is the only global address: a /128, no SLAAC from the advertisements`);
    t.ok((await addrsOf(lab, node, ifname)).some((a) => /^fe80::.*\/64 link$/.test(a)), 'and its link-local address, the DHCPv6 source');
    const log = dnsmasq.log();
    t.match(log, new RegExp(`DHCPREPLY\\(eth0\\) ${vip6} ${duid}`), 'dnsmasq granted it to the service\'s DUID-LL');
    t.match(fs.readFileSync(dnsmasq.leaseFile, 'utf8'), new RegExp(`${vip6} \\S+ ${duid}`), 'and keeps the lease under it');

    const got = await httpGetFrom(lab, client, `http://[${vip6}]:80/`);
    t.match(got, { ok: true, body: 'b\n' }, 'a client on the LAN is served through the IPv6 VIP');
    const m = (await httpGetFrom(lab, client, 'http://10.99.0.2:9477/metrics')).body;
    t.match(m, /lbagent_dhcp6_acquire_duration_seconds_count\{service="web",namespace="default"\} 1/, 'the acquisition is measured');
    t.match(m, /lbagent_dhcp6_lease_expiry_timestamp_seconds\{service="web",namespace="default"\} \d/, 'the lease expiry is exported');

    // Someone deletes the IPv6 VIP: the drift guard has the source put it back.
    const deletedAt = Date.now();
    await lab.exec(node, 'ip', ['-6', 'addr', 'del', `${vip6}/128`, 'dev', ifname]);
    const repaired = await waitFor('a drift-repaired event for the IPv6 VIP', async () => (await agent.status()).events
      .find((e) => e.kind === 'drift-repaired' && Date.parse(e.at) >= deletedAt - 5 && e.reason.includes(vip6)), 10_000);
    t.match(repaired.reason, new RegExp(`added ${vip6}/128 to ${ifname} again`), repaired.reason);
    t.match((await addrsOf(lab, node, ifname)), [`${vip6}/128 global`], 'the /128 is back on the macvlan');
    await waitFor('served again', async () => (await httpGetFrom(lab, client, `http://[${vip6}]:80/`)).ok, 5_000);

    // SIGKILL and start: the saved lease resumes at once and a RENEW confirms it; the client sees nothing.
    const loop = await ClientLoop.start(lab, client, `http://[${vip6}]:80/`, { intervalMs: 20, timeoutMs: 500 });
    t.teardown(() => loop.stop());
    await new Promise((r) => setTimeout(r, 500));
    const killedAt = Date.now();
    agent.signal('SIGKILL');
    await agent.exited;
    const second = await startAgent(lab, node, cfg, { name: 'd6', stateDir: agent.stateDir, args: ['--on-stop', 'keep'] });
    const st2 = await waitStatus(second, 'the IPv6 VIP adopted and serving', (s) => s.services.find((x) => x.key === 'default/web@IPv6')?.ready === true, 20_000);
    t.match(st2.services.find((x) => x.key === 'default/web@IPv6'), { vip: vip6, adopted: true }, 'the same IPv6 VIP after the restart (stable DUID), adopted');
    await second.waitLog('the resumed lease confirmed by a RENEW', (l) => l.module === 'dhcp6' && l.op === 'state' && l.from === 'RENEWING' && l.to === 'BOUND', 10_000);
    t.notOk(second.logs.some((l) => l.module === 'dhcp6' && l.op === 'dad'), 'no DAD of the address the macvlan kept');
    await new Promise((r) => setTimeout(r, 800));
    const restart = gapReport((await loop.stop()).filter((r) => r.t >= killedAt), killedAt, ['b']);
    t.ok(restart.count >= 50, `the loop ran across the restart (${restart.count} requests)`);
    t.equal(restart.failures.length, 0, `no failed request across SIGKILL and start (${restart.failures.map((f) => f.error).join('; ')})`);
    t.match(dnsmasq.log().slice(log.length), new RegExp(`(\\d+) DHCPRENEW\\(eth0\\) ${duid} *\\n.*\\1 DHCPREPLY\\(eth0\\) ${vip6} ${duid}`), 'dnsmasq saw the RENEW and renewed the same address');

    // A planned restart: SIGTERM keeps the address and the lease, the next process serves the saved lease at once.
    const planned = await ClientLoop.start(lab, client, `http://[${vip6}]:80/`, { intervalMs: 20, timeoutMs: 500 });
    t.teardown(() => planned.stop());
    await new Promise((r) => setTimeout(r, 300));
    const stoppedAt = Date.now();
    second.signal('SIGTERM');
    t.equal((await second.exited).code, 0, 'SIGTERM with --on-stop keep exits cleanly');
    t.match((await addrsOf(lab, node, ifname)), [`${vip6}/128 global`], 'the IPv6 VIP stays on the macvlan between the processes');
    const third = await startAgent(lab, node, cfg, { name: 'd6', stateDir: agent.stateDir });
    await waitStatus(third, 'the IPv6 VIP serving again', (s) => s.services.find((x) => x.key === 'default/web@IPv6')?.ready === true, 20_000);
    t.match((await third.status()).services.find((x) => x.key === 'default/web@IPv6'), { vip: vip6, adopted: true }, 'the same IPv6 VIP, adopted');
    t.notOk(third.logs.some((l) => l.module === 'dhcp6' && (l.op === 'dad' || (l.op === 'state' && l.to === 'SELECTING'))), 'no DAD and no SOLICIT: the saved lease serves');
    await new Promise((r) => setTimeout(r, 500));
    const plannedReport = gapReport((await planned.stop()).filter((r) => r.t >= stoppedAt), stoppedAt, ['b']);
    t.ok(plannedReport.count >= 30, `the loop ran across the planned restart (${plannedReport.count} requests)`);
    t.equal(plannedReport.failures.length, 0, `no failed request across the planned restart (${plannedReport.failures.map((f) => f.error).join('; ')})`);

    // The service removed: RELEASE to the server, the VIP and the macvlan gone.
    const before = dnsmasq.log().length;
    third.writeConfig({ ...cfg, services: [] });
    third.signal('SIGHUP');
    await waitFor('dnsmasq logs the RELEASE', () => new RegExp(`DHCPRELEASE\\(eth0\\) ${duid}`).test(dnsmasq.log().slice(before)), 10_000);
    t.pass('dnsmasq saw the RELEASE of the IPv6 lease');
    await waitFor('dnsmasq forgets the IPv6 lease', () => !fs.readFileSync(dnsmasq.leaseFile, 'utf8').includes(vip6), 5_000);
    t.pass('and removed it from its lease file');
    await waitFor('the macvlan gone', async () => (await lab.exec(node, 'ip', ['link', 'show', ifname], { allowFail: true })).code !== 0, 10_000);
    t.notOk(fs.readdirSync(third.stateDir).some((f) => f.startsWith('dhcp6-')), 'the saved DHCPv6 lease is removed with the service');
    third.signal('SIGTERM');
    t.equal((await third.exited).code, 0, 'the agent stops cleanly');
    await dnsmasq.stop();
  });
}
