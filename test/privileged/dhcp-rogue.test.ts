// Issue 15, a rogue DHCP server, asserted the other way: offers of the VM's
// own address, a multicast address and an off-subnet address are each dropped
// and counted by reason before the state machine sees them, logged at warn,
// and nothing is bound: no address on the service macvlan, no VIP in status.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { distPath, httpGetFrom } from '../../lab/services';
import { startAgent } from '../../lab/agent';
import { linkNameForService } from '../../agent/net/ownership/ownership';

t.test('a rogue server offering the VM\'s own, a multicast and an off-subnet address gets nothing bound', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const rogueNs = await lab.addHost('rogue', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  const rogue = lab.spawn(rogueNs, process.execPath, [distPath('test', 'privileged', 'fixtures', 'dhcp-rogue.js'),
    '--server', '10.99.0.1', '--bcast', '10.99.0.255', '--offer', '10.99.0.2', '--offer', '224.0.0.5', '--offer', '192.168.77.10']);
  let out = '';
  rogue.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
  await waitFor('rogue server', () => out.includes('listening'), 10_000);

  const agent = await startAgent(lab, node, {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '10.99.0.2:9477' },
    dhcp: { retransmitInitial: 0.3, retransmitMax: 1, retransmitJitter: 0.05 },
    services: [{ name: 'web', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'] }],
  });
  await waitFor('three offers sent', () => out.split('\n').filter((l) => l.includes('offered')).length === 3, 20_000);
  const metric = async (): Promise<string> => (await httpGetFrom(lab, client, 'http://10.99.0.2:9477/metrics')).body;
  const reasons = ['yiaddr-local', 'yiaddr-multicast', 'yiaddr-off-subnet'];
  const body = await waitFor('three counted drops', async () => {
    const m = await metric();
    return reasons.every((r) => m.includes(`lbagent_dhcp_dropped_packets_total{reason="${r}"}`)) ? m : undefined;
  }, 10_000);
  // Two more retransmissions (silence from the rogue): nothing else arrives, nothing changes.
  await new Promise((r) => setTimeout(r, 2500));
  const final = await metric();
  for (const r of reasons) t.match(final, new RegExp(`lbagent_dhcp_dropped_packets_total\\{reason="${r}"\\} 1\\n`), `one drop counted as ${r}`);
  t.notMatch(body, /lbagent_dhcp_dropped_packets_total\{reason="yiaddr-(zero|loopback|broadcast|network|subnet-broadcast|server|router)"\}/, 'no other guard reason');

  const ifname = linkNameForService('default/web');
  const addrs = await lab.sh(node, 'ip -o -4 addr show');
  t.notMatch(addrs.stdout, new RegExp(`${ifname}\\s+inet`), `no address on ${ifname}`);
  t.equal(addrs.stdout.split('\n').filter((l) => l.includes('10.99.0.2/')).length, 1, '10.99.0.2 only on eth0');
  const st = await agent.status();
  t.equal(st.services[0]!.vip, undefined, 'no VIP');
  t.match(st.services[0]!.state, /acquiring|pending/, `still looking for a lease (${st.services[0]!.state})`);
  const warns = agent.logs.filter((l) => l.level === 'warn' && l.op === 'recv' && typeof l.reason === 'string');
  t.same(warns.map((l) => l.reason).sort(), [...reasons].sort(), 'one warn line per refused offer');
  t.match(String(warns[0]?.msg), /refused a DHCP OFFER/);
});
