// Desired state has one home: a reload that sets dhcp.servers and
// arp.refreshInterval and adds services in the same file takes effect for
// the services it adds as for the running ones. The added DHCP service
// refuses the lab's server, which the new allow-list excludes; every pool
// VIP, old and new, refreshes at the new interval (gratuitous ARPs counted
// on the wire, from the client's side of the bridge).
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { startAgent, waitStatus } from '../../lab/agent';
import { buildContinuityLab, continuityConfig } from '../../lab/continuity';

t.test('a reload\'s dhcp.servers and arp.refreshInterval hold for the services it adds and the running ones', async (t) => {
  if (!requirePrivileged(t)) return;
  const cl = await buildContinuityLab(t);
  // A long refresh at start: a gratuitous ARP every 60 s.
  const base = continuityConfig([{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }], { arp: { ...continuityConfig([]).arp as object, refreshInterval: 60 } });
  const agent = await startAgent(cl.lab, cl.node, base, { name: 'a' });
  t.teardown(() => { agent.signal('SIGKILL'); });
  await waitStatus(agent, 'both ready', (s) => s.services.every((x) => x.ready), 30_000);

  const next = continuityConfig(
    [{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }, { name: 'web2', ipam: 'dhcp', port: 81 }, { name: 'api2', ipam: 'pool', port: 82 }],
    { arp: { ...continuityConfig([]).arp as object, refreshInterval: 1 }, dhcp: { retransmitInitial: 0.5, retransmitMax: 1, retransmitJitter: 0, servers: ['10.99.0.9'] } },
  );
  const gen = (await agent.status()).config.generation;
  agent.writeConfig(next);
  agent.signal('SIGHUP');
  await waitStatus(agent, 'the reload applied', (s) => s.config.generation > gen, 15_000);
  const st = await waitStatus(agent, 'api2 serving', (s) => s.services.find((x) => x.name === 'api2')?.vip !== undefined, 20_000);
  const vips = ['api', 'api2'].map((n) => st.services.find((x) => x.name === n)!.vip!);

  // 5 s of ARP on the wire, from the client.
  const cap = await cl.lab.sh(cl.client, `timeout 5 tcpdump -i eth0 -nn -l arp 2>/dev/null || true`, { timeoutMs: 10_000 });
  for (const vip of vips) {
    // A gratuitous ARP: who-has VIP tell VIP (a request whose sender is the target), or a reply announcing it.
    const n = cap.stdout.split('\n').filter((l) => new RegExp(`Request who-has ${vip.replace(/\./g, '\\.')} tell ${vip.replace(/\./g, '\\.')}|Reply ${vip.replace(/\./g, '\\.')} is-at`).test(l)).length;
    t.ok(n >= 3, `${vip}: ${n} gratuitous ARPs in 5 s at refreshInterval 1 (the running VIP's and the added one's)`);
  }

  // The added DHCP service hears the lab's server (10.99.0.1) and refuses it: the allow-list names 10.99.0.9 only.
  await waitFor('web2 refused an offer from a server outside dhcp.servers', async () => agent.logs.some((l) => l.service === 'default/web2' && /server-not-allowed/.test(JSON.stringify(l))), 10_000);
  const web2 = (await agent.status()).services.find((x) => x.name === 'web2')!;
  t.equal(web2.vip, undefined, `web2 took no lease from the excluded server (state ${web2.state}: ${web2.reason ?? ''})`);
  const web = (await agent.status()).services.find((x) => x.name === 'web')!;
  t.ok(web.vip !== undefined, 'the running DHCP service keeps the lease it holds');
});
