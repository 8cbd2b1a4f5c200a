// Privileged: an IPv6-only DHCP service (its own macvlan) by the real agent.
// First a rogue DHCPv6 server answers its SOLICIT with hostile grants - the
// VM's own address, a multicast, a link-local, the loopback and an
// off-prefix address: each is dropped and counted by reason, logged at warn,
// and nothing is bound. Then ISC Kea DHCPv6 (a subnet6 on its interface)
// grants an address: the service serves a client on the LAN through it,
// and Kea's lease is the service's DUID-LL. Kea's first address is held
// by another host: duplicate address detection finds it, the agent
// DECLINEs it and binds the next. Kea's lifetimes are seconds long (valid
// 5 s, T1 1 s, T2 2 s): the server goes and another Kea (another DUID, the
// same lease database) takes its place, so RENEWs to the first go
// unanswered and the lease is kept by a REBIND at T2 that the second
// answers, with no failed request in a 20 ms client loop; dhcp.servers6
// reloaded to the first server's DUID has the second's answers refused
// and counted; then no server
// at all, and the lease expires: the VIP is withdrawn. Kea back, a new
// lease serves; removing the service releases it (Kea logs the RELEASE)
// and deletes the macvlan.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { distPath, httpGetFrom, startBackend } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import * as fs from 'node:fs';
import { ClientLoop, gapReport } from '../../lab/client-loop';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';
import { startKea6 } from './fixtures/dhcp-harness';

const TAKEN = 'fd00:99::300';
const HOSTILE: Record<string, string> = {
  'fd00:99::2': 'addr-local',        // the VM's own address
  'ff02::5': 'addr-multicast',
  'fe80::1234': 'addr-link-local',
  '::1': 'addr-loopback',
  '2001:db8::5': 'addr-off-prefix',
};

if (requirePrivileged(t)) {
  t.test('IPv6-only DHCP service: a rogue server\'s hostile grants are refused and counted; a taken address is declined; Kea\'s lease serves; removal releases it', async (t) => {
    const lab = await createLab(t);
    const server = await lab.addHost('server', { address: '10.99.0.1/24', ipv6: ['fd00:99::1/64'] });
    const node = await lab.addHost('node', { address: '10.99.0.2/24', ipv6: ['fd00:99::2/64'] });
    const b = await lab.addHost('b', { address: '10.99.0.11/24', ipv6: ['fd00:99::11/64'] });
    const client = await lab.addHost('client', { address: '10.99.0.50/24', ipv6: ['fd00:99::50/64'] });
    // The rogue host also holds Kea's first pool address: duplicate address detection must find it.
    const rogueNs = await lab.addHost('rogue', { address: '10.99.0.66/24', ipv6: ['fd00:99::66/64', `${TAKEN}/64`] });
    await startBackend(lab, b, 'b', [8080], '::');
    const rogue = lab.spawn(rogueNs, process.execPath, [distPath('test', 'privileged', 'fixtures', 'dhcp6-rogue.js'),
      ...Object.keys(HOSTILE).flatMap((a) => ['--offer', a])]);
    let out = '';
    rogue.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
    await waitFor('rogue DHCPv6 server', () => out.includes('listening'), 10_000);

    const mac = macForService('default/web');
    const ifname = linkNameForService('default/web');
    const duid = `00:03:00:01:${mac}`;
    const cfg = {
      node: { interface: 'eth0' },
      metrics: { listen: '10.99.0.2:9477' },
      dataplane: 'kernel',
      arp: { probeWait: 0.1, probeNum: 1, probeMin: 0.2, probeMax: 0.3, announceWait: 0.2, announceNum: 2, announceInterval: 0.2 },
      services: [{ name: 'web', ipam: 'dhcp', ipFamilies: ['IPv6'], ports: [{ port: 80, targetPort: 8080 }], backends: ['fd00:99::11'], healthCheck: { periodSeconds: 0.5, timeoutSeconds: 0.4 } }],
    };
    const agent = await startAgent(lab, node, cfg, { name: 'k6' });

    // The rogue's grants: each refused by the guard, counted by its reason.
    await waitFor('five hostile ADVERTISEs sent', () => out.split('\n').filter((l) => l.includes('offered')).length === 5, 15_000);
    const metric = async (): Promise<string> => (await httpGetFrom(lab, client, 'http://10.99.0.2:9477/metrics')).body;
    const reasons = Object.values(HOSTILE);
    await waitFor('five counted drops', async () => {
      const m = await metric();
      return reasons.every((r) => m.includes(`lbagent_dhcp6_dropped_packets_total{reason="${r}"}`)) ? m : undefined;
    }, 10_000);
    const m = await metric();
    for (const r of reasons) t.match(m, new RegExp(`lbagent_dhcp6_dropped_packets_total\\{reason="${r}"\\} 1\\n`), `one drop counted as ${r}`);
    const addrs = (await lab.exec(node, 'ip', ['-6', '-o', 'addr', 'show'])).stdout;
    t.notMatch(addrs, new RegExp(`${ifname}\\s+inet6 (?!fe80)`), `no address but the link-local one on ${ifname}`);
    t.equal(addrs.split('\n').filter((l) => l.includes('fd00:99::2/')).length, 1, 'fd00:99::2 only on eth0');
    const st = (await agent.status()).services.find((s) => s.key === 'default/web@IPv6')!;
    t.equal(st.vip, undefined, 'no VIP from the rogue');
    t.match(st.state, /acquiring|pending/, `still looking for a lease (${st.state})`);
    const warns = agent.logs.filter((l) => l.level === 'warn' && l.module === 'dhcp6' && l.op === 'recv');
    t.same(warns.map((l) => l.reason).sort(), [...reasons].sort(), 'one warn line per refused grant');

    // A real server: Kea grants an address from its pool, and the VIP serves.
    rogue.kill('SIGKILL');
    const keaOpts = { subnet: 'fd00:99::/64', pool: 'fd00:99::300 - fd00:99::3ff', validLifetime: 5, renewTimer: 1, rebindTimer: 2 };
    let kea = await startKea6(lab, server, keaOpts);
    const bound = await waitStatus(agent, 'the IPv6 VIP from Kea serving', (s) => s.services.find((x) => x.key === 'default/web@IPv6')?.ready === true, 30_000);
    const vip6 = bound.services.find((x) => x.key === 'default/web@IPv6')!.vip!;
    t.match(vip6, /^fd00:99::3[0-9a-f]{2}$/, `the VIP ${vip6} comes from Kea's pool`);
    // Kea granted its first address, which another host holds: DAD found it, the agent declined it and got another.
    t.not(vip6, TAKEN, `${TAKEN}, held by another host, is not the VIP`);
    t.ok(agent.logs.some((l) => l.module === 'dhcp6' && l.op === 'dad' && l.address === TAKEN), 'duplicate address detection found it taken');
    t.match(kea.log(), new RegExp(`DHCP6_DECLINE\\w* .*${TAKEN}`), 'Kea saw the DECLINE');
    t.match(await metric(), /lbagent_dhcp6_declines_total\{service="web",namespace="default"\} 1\n/, 'one decline counted');
    t.match(await httpGetFrom(lab, client, `http://[${vip6}]:80/`), { ok: true, body: 'b\n' }, 'a client on the LAN is served through it');
    const rows = kea.rows(vip6);
    t.equal(rows[0]?.clientId, duid, 'Kea holds the lease under the service\'s DUID-LL');
    t.match((await lab.exec(node, 'ip', ['-6', '-o', 'addr', 'show', 'dev', ifname])).stdout, new RegExp(`inet6 ${vip6}/128 scope global`), 'a /128 on the service macvlan');

    // The server goes; another (DUID-EN, the same leases) comes: RENEWs to the first are dropped, REBIND at T2 keeps the lease.
    const details = async (): Promise<Record<string, unknown>> => (await agent.status()).services.find((x) => x.key === 'default/web@IPv6')?.source ?? {};
    const firstServer = (await details()).serverDuid;
    const loop = await ClientLoop.start(lab, client, `http://[${vip6}]:80/`, { intervalMs: 20, timeoutMs: 500 });
    t.teardown(() => loop.stop());
    const goneAt = Date.now();
    await kea.stop();
    fs.copyFileSync(kea.leaseFile, lab.file('kea6b.leases.csv'));
    const other = await startKea6(lab, server, { ...keaOpts, name: 'kea6b', enterpriseId: '0b0b0b0b' });
    await agent.waitLog('REBIND at T2', (l) => l.module === 'dhcp6' && l.op === 'rebind', 10_000);
    await agent.waitLog('the REBIND answered', (l) => l.module === 'dhcp6' && l.op === 'state' && l.from === 'REBINDING' && l.to === 'BOUND', 10_000);
    const rebound = await details();
    t.not(firstServer, undefined, `status names the first server's DUID (${String(firstServer)})`);
    t.equal(rebound.serverDuid, '00:02:00:00:09:bf:0b:0b:0b:0b', 'the lease is now the second server\'s (REBIND has no SERVERID: any server may answer)');
    t.equal(rebound.address, vip6, 'the same address, extended');
    t.match(await metric(), /lbagent_dhcp6_rebinds_total\{service="web",namespace="default"\} 1\n/, 'one REBIND counted');
    const across = gapReport((await loop.stop()).filter((r) => r.t >= goneAt), goneAt, ['b']);
    t.ok(across.count >= 50, `the loop ran across the server change (${across.count} requests)`);
    t.equal(across.failures.length, 0, `no failed request while the lease was rebound (${across.failures.map((f) => f.error).join('; ')})`);

    // dhcp.servers6 reloaded to the first server's DUID only: the second's answers to the RENEWs are refused and counted.
    agent.writeConfig({ ...cfg, dhcp: { servers6: [String(firstServer)] } });
    agent.signal('SIGHUP');
    await waitFor('a REPLY from the second server refused', async () => /lbagent_dhcp6_dropped_packets_total\{reason="server-not-allowed"\} [1-9]/.test(await metric()), 10_000);
    t.pass('with dhcp.servers6 naming the first server, the second server\'s REPLY is dropped as server-not-allowed');
    t.equal((await details()).serverDuid, '00:02:00:00:09:bf:0b:0b:0b:0b', 'and the lease is not extended by it (still the one it granted before)');

    // No server at all: RENEW, REBIND unanswered, and at the valid lifetime the VIP goes.
    await other.stop();
    const expired = await waitStatus(agent, 'the VIP withdrawn at expiry', (s) => s.services.find((x) => x.key === 'default/web@IPv6')?.vip === undefined, 15_000);
    t.match(expired.services.find((x) => x.key === 'default/web@IPv6'), { ready: false }, 'not serving once the lease expired');
    t.ok(agent.logs.some((l) => l.module === 'dhcp6' && l.op === 'unbind' && l.cause === 'expired' && l.address === vip6), 'the unbind says the lease expired');
    t.notMatch((await lab.exec(node, 'ip', ['-6', '-o', 'addr', 'show', 'dev', ifname])).stdout, new RegExp(`inet6 ${vip6}/`), `${vip6} is off the macvlan`);
    t.match(await metric(), /lbagent_dhcp6_expiries_total\{service="web",namespace="default"\} 1\n/, 'one expiry counted');

    // Kea back: a lease again, at once (no delay before the SOLICIT after expiry).
    kea = await startKea6(lab, server, keaOpts);
    const again = await waitStatus(agent, 'a lease again', (s) => s.services.find((x) => x.key === 'default/web@IPv6')?.ready === true, 15_000);
    const vipAgain = again.services.find((x) => x.key === 'default/web@IPv6')!.vip!;
    t.match(await httpGetFrom(lab, client, `http://[${vipAgain}]:80/`), { ok: true, body: 'b\n' }, `served again through ${vipAgain}`);

    // Removed from the config: RELEASE, and the macvlan (this service's own) goes.
    const before = kea.log().length;
    agent.writeConfig({ ...cfg, services: [] });
    agent.signal('SIGHUP');
    await waitFor('Kea logs the RELEASE', () => /DHCP6_RELEASE_NA /.test(kea.log().slice(before)), 10_000);
    t.match(kea.log().slice(before), new RegExp(`DHCP6_RELEASE_NA .*${vipAgain}`), `Kea released ${vipAgain}`);
    await waitFor('the macvlan gone', async () => (await lab.exec(node, 'ip', ['link', 'show', ifname], { allowFail: true })).code !== 0, 10_000);
    t.pass(`${ifname} deleted`);
    agent.signal('SIGTERM');
    t.equal((await agent.exited).code, 0, 'the agent stops cleanly');
    await kea.stop();
  });
}
