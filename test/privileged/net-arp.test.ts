// RFC 5227 on the real kernel, inside lab namespaces: a gratuitous ARP burst
// teaches a neighbour the VIP's MAC, a probe finds the holder of a taken
// address (and none for a free one), and the VIP owner (net/vip-owner.ts)
// defends an address we hold against a host that claims it.
import t from 'tap';
import type { ArpTimings } from '../../agent/config/types';
import type { LinkInfo } from '../../agent/net/netlink/netlink';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { requirePrivileged } from '../helpers/privileged';
import { driver, driverStream } from './fixtures/net-driver-run';

// RFC 5227's shape with shorter waits, so a probe takes about a second.
const FAST: ArpTimings = { probeWait: 0.1, probeNum: 3, probeMin: 0.1, probeMax: 0.2, announceWait: 0.4, announceNum: 2, announceInterval: 0.1 };

async function macOf(lab: Lab, ns: string, ifname: string): Promise<string> {
  return (await lab.sh(ns, `cat /sys/class/net/${ifname}/address`)).stdout.trim();
}

async function vip(lab: Lab, ns: string, key: string, address: string): Promise<LinkInfo> {
  const r = await driver<{ link: LinkInfo }>(lab, ns, 'create-macvlan', {
    name: linkNameForService(key), parent: 'eth0', mac: macForService(key), mode: 'bridge', up: true, address, prefix: 24, sysctls: true,
  });
  if (!r.ok) throw new Error(`create-macvlan: ${JSON.stringify(r.error)}`);
  return r.result!.link;
}

if (requirePrivileged(t)) {
  t.test('a gratuitous ARP burst fills a neighbour table without traffic', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const observer = await lab.addHost('observer', { address: '10.99.0.3/24' });
    // Linux ignores gratuitous ARP for addresses it has no entry for unless
    // arp_accept is set (default 0, ip-sysctl.rst): a router or switch would
    // learn, a default Linux host only updates existing entries.
    await lab.exec(observer, 'sysctl', ['-qw', 'net.ipv4.conf.eth0.arp_accept=1']);

    const link = await vip(lab, node, 'default/garp', '10.99.0.60');
    const before = await lab.exec(observer, 'ip', ['neigh', 'show', '10.99.0.60', 'dev', 'eth0']);
    t.notMatch(before.stdout, /lladdr/, 'no entry before the announcement');

    const r = await driver<{ metrics: string }>(lab, node, 'announce', { ifname: link.name, mac: link.mac, ip: '10.99.0.60', count: 3, intervalMs: 100 });
    t.ok(r.ok, JSON.stringify(r.error));
    t.match(r.result!.metrics, /lbagent_net_gratuitous_arps_sent_total 3/);
    const neigh = await waitFor('the observer to learn 10.99.0.60', async () => {
      const out = (await lab.exec(observer, 'ip', ['neigh', 'show', '10.99.0.60', 'dev', 'eth0'])).stdout;
      return out.includes('lladdr') ? out : undefined;
    }, 5_000);
    t.match(neigh, new RegExp(`lladdr ${link.mac}`), 'the observer maps the VIP to the macvlan MAC');
  });

  t.test('a probe finds the holder of a taken address, and none for a free one', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const holder = await lab.addHost('holder', { address: '10.99.0.3/24', extraAddresses: ['10.99.0.70/24'] });
    const holderMac = await macOf(lab, holder, 'eth0');
    const link = await vip(lab, node, 'default/probe', '10.99.0.61');

    const taken = await driver<{ conflict: boolean; conflictingMac?: string; metrics: string }>(lab, node, 'probe', { ifname: link.name, mac: link.mac, ip: '10.99.0.70', timings: FAST });
    t.ok(taken.ok, JSON.stringify(taken.error));
    t.equal(taken.result!.conflict, true, '10.99.0.70 is in use');
    t.equal(taken.result!.conflictingMac, holderMac, 'by the holder');
    t.match(taken.result!.metrics, /lbagent_net_arp_conflicts_total\{phase="probe"\} 1/);

    const free = await driver<{ conflict: boolean; metrics: string }>(lab, node, 'probe', { ifname: link.name, mac: link.mac, ip: '10.99.0.71', timings: FAST });
    t.ok(free.ok, JSON.stringify(free.error));
    t.equal(free.result!.conflict, false, '10.99.0.71 is free');
    t.match(free.result!.metrics, /lbagent_net_arp_probes_total 3/, 'PROBE_NUM probes were sent');

    // From the parent too (pool VIPs are probed there), with the parent's MAC.
    const fromParent = await driver<{ conflict: boolean; conflictingMac?: string }>(lab, node, 'probe', { ifname: 'eth0', mac: await macOf(lab, node, 'eth0'), ip: '10.99.0.3', timings: FAST });
    t.match(fromParent.result, { conflict: true, conflictingMac: holderMac }, 'probing from the parent finds the holder too');
  });

  t.test('the VIP owner defends a held address against another host claiming it', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const rogue = await lab.addHost('rogue', { address: '10.99.0.3/24' });
    const rogueMac = await macOf(lab, rogue, 'eth0');
    const link = await vip(lab, node, 'default/defend', '10.99.0.62');

    const defender = await driverStream(lab, node, 'defend', { ifname: link.name, mac: link.mac, ip: '10.99.0.62', durationMs: 20_000 });
    t.teardown(() => defender.stop());
    // The rogue announces our VIP as its own.
    const r = await driver(lab, rogue, 'announce', { ifname: 'eth0', mac: rogueMac, ip: '10.99.0.62', count: 1, intervalMs: 0 });
    t.ok(r.ok, JSON.stringify(r.error));
    const c = await defender.next('a conflict', (e) => e.ev === 'conflict');
    t.match(c, { ip: '10.99.0.62', mac: rogueMac, defended: true });
    t.match(c.metrics, /lbagent_net_arp_conflicts_total\{phase="defend"\} 1/);
  });
}
