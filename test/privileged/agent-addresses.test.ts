// Address sources through the real agent: DHCP and pool VIPs, Share IP,
// an exhausted pool, and recovery after SIGKILL (same MACs and addresses,
// no orphan links; a prefixed link the config does not want is removed).
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, Lab, waitFor } from '../../lab/netns';
import { startBackend, startDnsmasq, httpGetFrom, Dnsmasq } from '../../lab/services';
import { startAgent, waitStatus, agentCli } from '../../lab/agent';
import { macForService, linkNameForService } from '../../agent/net/ownership/ownership';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.5, timeoutSeconds: 0.5 };

async function lab3(t: Parameters<typeof createLab>[0]): Promise<{ lab: Lab; node: string; client: string; dnsmasq: Dnsmasq }> {
  const lab = await createLab(t);
  await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await lab.addHost('b2', { address: '10.99.0.12/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  const dnsmasq = await startDnsmasq(lab, lab.ns('dhcp'), { range: '10.99.0.100,10.99.0.150', noPing: true });
  await startBackend(lab, lab.ns('b1'), 'b1', [8080, 9090]);
  await startBackend(lab, lab.ns('b2'), 'b2', [8080, 9090]);
  return { lab, node, client, dnsmasq };
}

async function links(lab: Lab, ns: string): Promise<{ name: string; mac: string; mode?: string }[]> {
  const r = await lab.exec(ns, 'ip', ['-d', '-j', 'link', 'show']);
  return (JSON.parse(r.stdout) as { ifname: string; address: string; linkinfo?: { info_kind?: string; info_data?: { mode?: string } } }[])
    .filter((l) => l.ifname.startsWith('lbv'))
    .map((l) => ({ name: l.ifname, mac: l.address, mode: l.linkinfo?.info_data?.mode }));
}

t.test('DHCP, pool and Share IP through the agent; SIGKILL recovery', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, node, client, dnsmasq } = await lab3(t);
  const cfg = {
    node: { interface: 'eth0' },
    metrics: { listen: '' },
    pools: { 'range-global': '10.99.0.200-10.99.0.201' },
    arp: FAST_ARP,
    dhcp: { retransmitInitial: 0.5, retransmitMax: 2 },
    services: [
      { name: 'web', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11', '10.99.0.12'], healthCheck: HC },
      { name: 'db', ipam: 'dhcp', ports: [{ port: 5432, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      { name: 'api', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      { name: 'api-admin', primaryService: 'api', ports: [{ port: 81, targetPort: 9090 }], backends: ['10.99.0.12'], healthCheck: HC },
      { name: 'web-metrics', primaryService: 'default/web', ports: [{ port: 9100, targetPort: 9090 }], backends: ['10.99.0.12'], healthCheck: HC },
      { name: 'extra1', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      { name: 'extra2', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
    ],
  };
  // A link with the agent's prefix and MAC prefix that no service wants: a leftover to remove.
  await lab.sh(node, 'ip link add lbv000000000000 link eth0 address 02:00:00:00:00:01 type macvlan mode bridge');

  let agent = await startAgent(lab, node, cfg);
  const st = await waitStatus(agent, 'DHCP and pool services serving', (s) => ['web', 'db', 'api', 'api-admin', 'web-metrics'].every((n) => s.services.find((x) => x.name === n)?.ready), 30_000);
  const by = (n: string) => st.services.find((s) => s.name === n)!;

  t.test('DHCP: own macvlan, stable MAC, lease in dnsmasq, status shows the lease', async (t) => {
    const web = by('web');
    t.equal(web.mac, macForService('default/web'));
    t.equal(web.interface, linkNameForService('default/web'));
    const ls = await links(lab, node);
    const wl = ls.find((l) => l.name === web.interface);
    t.same(wl, { name: web.interface, mac: web.mac, mode: 'bridge' }, 'ip -d link agrees: name, MAC, bridge mode');
    const lease = dnsmasq.leases().find((l) => l.mac === web.mac);
    t.equal(lease?.ip, web.vip, 'dnsmasq leased the VIP to the service MAC');
    t.equal(lease?.hostname, 'web', 'hostname option from the service name');
    t.match(web.source, { server: '10.99.0.1' });
    t.ok(web.source?.renewAt && web.source?.expiresAt, 'renew and expiry times in status');
    const table = await agentCli(lab, node, ['status', '--socket', agent.socket]);
    t.match(table.stdout, /default\/web: server 10\.99\.0\.1, renewAt/);
    const r = await httpGetFrom(lab, client, `http://${web.vip}/`);
    t.ok(r.ok && /^b[12]$/.test(r.body.trim()), 'the DHCP VIP forwards to a backend');
  });

  t.test('Share IP: secondaries serve their ports on the primary\'s VIP', async (t) => {
    t.equal(by('api-admin').vip, by('api').vip);
    t.equal(by('web-metrics').vip, by('web').vip, 'a DHCP VIP can be shared too');
    const a = await httpGetFrom(lab, client, `http://${by('api').vip}:80/`);
    const b = await httpGetFrom(lab, client, `http://${by('api').vip}:81/`);
    t.equal(a.body, 'b1\n', 'api port 80 -> its backend');
    t.equal(b.body, 'b2\n', 'api-admin port 81 -> its own backend');
    const c = await httpGetFrom(lab, client, `http://${by('web').vip}:9100/`);
    t.equal(c.body, 'b2\n');
  });

  t.test('an exhausted pool leaves the extra service pending; the others serve', async (t) => {
    const s = await waitStatus(agent, 'one extra service pending', (x) => x.services.filter((y) => y.name.startsWith('extra') && !y.ready).length === 1, 15_000);
    const pending = s.services.find((y) => y.name.startsWith('extra') && !y.ready)!;
    t.equal(pending.state, 'pending');
    t.match(pending.reason, /exhausted|no free address/i);
    t.equal(s.services.filter((y) => y.name.startsWith('extra') && y.ready).length, 1);
  });

  t.test('the unwanted prefixed link was removed at start', async (t) => {
    const ls = await links(lab, node);
    t.notOk(ls.some((l) => l.name === 'lbv000000000000'));
    t.equal(ls.length, 2, 'exactly one macvlan per DHCP service');
  });

  t.test('SIGKILL then start again: same MACs and addresses, no orphans, one lease each', async (t) => {
    const before = await agent.status();
    const linksBefore = await links(lab, node);
    agent.signal('SIGKILL');
    await agent.exited;
    agent = await startAgent(lab, node, cfg, { name: 'again', stateDir: agent.stateDir });
    const after = await waitStatus(agent, 'served again', (s) => ['web', 'db', 'api'].every((n) => s.services.find((x) => x.name === n)?.ready), 30_000);
    for (const n of ['web', 'db', 'api', 'api-admin']) {
      const b = before.services.find((x) => x.name === n)!;
      const a = after.services.find((x) => x.name === n)!;
      t.equal(a.vip, b.vip, `${n}: same address`);
      t.equal(a.mac, b.mac, `${n}: same MAC`);
    }
    t.same((await links(lab, node)).sort((x, y) => x.name.localeCompare(y.name)), linksBefore.sort((x, y) => x.name.localeCompare(y.name)), 'the same two macvlans, no orphan');
    t.equal(dnsmasq.leases().length, 2, 'no second lease in dnsmasq');
    const addrs = await lab.exec(node, 'ip', ['-4', '-o', 'addr', 'show', 'dev', 'eth0']);
    t.equal((addrs.stdout.match(/10\.99\.0\.20[01]\/32/g) ?? []).length, 2, 'each pool VIP once on the parent');
  });

  t.test('removing a DHCP service by reload releases its lease and removes its macvlan', async (t) => {
    const db = (await agent.status()).services.find((x) => x.name === 'db')!;
    agent.writeConfig({ ...cfg, services: cfg.services.filter((x) => x.name !== 'db') });
    const gen = (await agent.status()).config.generation;
    agent.signal('SIGHUP');
    await waitStatus(agent, 'the reload', (s) => s.config.generation === gen + 1, 10_000);
    await waitFor('dnsmasq to log the DHCPRELEASE', () => dnsmasq.log().includes(`DHCPRELEASE(eth0) ${db.vip} ${db.mac}`), 10_000);
    t.pass(`DHCPRELEASE ${db.vip} ${db.mac} in dnsmasq's log`);
    t.notOk((await links(lab, node)).some((l) => l.name === db.interface), 'its macvlan is gone');
    t.ok((await links(lab, node)).some((l) => l.name === linkNameForService('default/web')), 'the other service keeps its macvlan');
    agent.signal('SIGTERM');
    t.same(await agent.exited, { code: 0, signal: null });
    t.notOk(dnsmasq.log().includes(`DHCPRELEASE(eth0) ${by('web').vip}`), 'a SIGTERM releases nothing');
  });
});
