// lab/demo.ts is the demo: what a new user sees first (`npm run demo`, as root).
// Builds a lab of network namespaces on one bridge - a DHCP server (dnsmasq),
// three HTTP backends, a client and a VM running lb-agent - then runs the
// agent with a DHCP service, a pool service and a service sharing the pool
// VIP, sends traffic, kills a backend to show it leave rotation, prints
// `lb-agent status` and a few metrics, and removes everything on exit or Ctrl-C.
import { Lab, labUnavailableReason, waitFor } from './netns';
import { startBackend, startDnsmasq, httpGetFrom, httpGetManyFrom } from './services';
import { startAgent, agentCli, AgentHandle } from './agent';
import { within } from './within';

const C = { bold: '\x1b[1m', dim: '\x1b[2m', green: '\x1b[32m', red: '\x1b[31m', off: '\x1b[0m' };
const tty = process.stdout.isTTY;
function say(s: string): void { process.stdout.write(`${tty ? C.bold : ''}==> ${s}${tty ? C.off : ''}\n`); }
function info(s: string): void { process.stdout.write(`    ${s}\n`); }

async function tally(lab: Lab, url: string, n: number): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const r of await httpGetManyFrom(lab, lab.ns('client'), url, n, 2000)) {
    const k = r.ok ? r.body.trim() : `error:${r.error}`;
    counts[k] = (counts[k] ?? 0) + 1;
  }
  return counts;
}

async function main(): Promise<void> {
  const why = labUnavailableReason();
  if (why) { process.stderr.write(`demo: ${why}; run it as root: sudo npm run demo\n`); process.exit(1); }
  const started = Date.now();
  const lab = await Lab.create();
  let agent: AgentHandle | undefined;
  const cleanup = async (): Promise<void> => {
    say('cleaning up: stopping the agent (SIGTERM) and removing every namespace');
    if (agent && agent.proc.exitCode === null) { agent.signal('SIGTERM'); await within(agent.exited, 10_000); }
    await lab.destroy();
  };
  process.once('SIGINT', () => { void cleanup().then(() => process.exit(130)); });
  try {
    say('building the lab: a bridge as the LAN, and namespaces for a DHCP server, 3 backends, a client and the VM');
    await lab.addHost('dhcp', { address: '10.99.0.1/24' });
    await lab.addHost('vm', { address: '10.99.0.2/24' });
    for (const [i, b] of ['b1', 'b2', 'b3'].entries()) await lab.addHost(b, { address: `10.99.0.${11 + i}/24` });
    await lab.addHost('client', { address: '10.99.0.50/24' });
    const dnsmasq = await startDnsmasq(lab, lab.ns('dhcp'), { range: '10.99.0.100,10.99.0.150', leaseTime: '1h', noPing: true });
    const backends = [];
    for (const [i, b] of ['b1', 'b2', 'b3'].entries()) backends.push(await startBackend(lab, lab.ns(b), `backend-${i + 1}`, [8080]));
    info('dnsmasq on 10.99.0.1 (range .100-.150); backends 10.99.0.11-13:8080 answer with their name');

    const config = {
      node: { name: 'demo-vm', interface: 'eth0' },
      metrics: { listen: '10.99.0.2:9477' },
      dataplane: 'auto',
      pools: { 'range-global': '10.99.0.200-10.99.0.220' },
      // Short RFC 5227 timings so the demo is quick; production keeps the RFC's.
      arp: { probeWait: 0.1, probeNum: 2, probeMin: 0.1, probeMax: 0.2, announceWait: 0.1, announceNum: 2, announceInterval: 0.2 },
      services: [
        { name: 'web', ipam: 'dhcp', ports: [{ name: 'http', port: 80, targetPort: 8080 }],
          backends: ['10.99.0.11', '10.99.0.12', '10.99.0.13'],
          healthCheck: { periodSeconds: 0.5, timeoutSeconds: 0.5, failureThreshold: 2 } },
        { name: 'api', ipam: 'pool', ports: [{ name: 'http', port: 80, targetPort: 8080 }],
          backends: ['10.99.0.11', { address: '10.99.0.12', weight: 3 }],
          healthCheck: { periodSeconds: 0.5, timeoutSeconds: 0.5, failureThreshold: 2 } },
        { name: 'api-admin', primaryService: 'default/api', ports: [{ name: 'admin', port: 8081, targetPort: 8080 }],
          backends: ['10.99.0.13'] },
      ],
    };
    say('starting lb-agent in the VM namespace with 3 services (DHCP, pool, shared VIP)');
    agent = await startAgent(lab, lab.ns('vm'), config, { name: 'demo', logLevel: 'info' });
    const st = await waitFor('every service to be served', async () => {
      const s = await agent!.status();
      return s.services.every((x) => x.ready) ? s : undefined;
    }, 40_000, 200);
    const web = st.services.find((s) => s.name === 'web')!;
    const api = st.services.find((s) => s.name === 'api')!;
    info(`web:       DHCP lease ${web.vip} on ${web.interface} (MAC ${web.mac})`);
    info(`api:       pool address ${api.vip}`);
    info(`api-admin: shares ${api.vip}, port 8081`);
    const lease = dnsmasq.leases().find((l) => l.ip === web.vip);
    info(`dnsmasq's lease file: ${lease ? `${lease.ip} -> ${lease.mac} (${lease.hostname})` : 'not found!'}`);

    say(`traffic from the client: 30 requests to http://${web.vip}/ (dataplane: ${st.dataplane?.kind}, ${st.dataplane?.reason})`);
    info(JSON.stringify(await tally(lab, `http://${web.vip}/`, 30)));
    say(`weighted: 40 requests to http://${api.vip}/ (backend-2 has weight 3)`);
    info(JSON.stringify(await tally(lab, `http://${api.vip}/`, 40)));
    say(`shared VIP: http://${api.vip}:8081/`);
    info(JSON.stringify(await tally(lab, `http://${api.vip}:8081/`, 3)));

    say('killing backend-2; the health check takes it out of rotation');
    await backends[1]!.stop();
    const t0 = Date.now();
    await waitFor('backend-2 marked down', async () => {
      const s = await agent!.status();
      return s.services.find((x) => x.name === 'web')!.backends.some((b) => b.address === '10.99.0.12' && b.state === 'down');
    }, 20_000, 100);
    info(`marked down after ${Date.now() - t0} ms (period 0.5 s, failureThreshold 2)`);
    info(`30 requests to web now: ${JSON.stringify(await tally(lab, `http://${web.vip}/`, 30))}`);

    say('lb-agent status');
    const stat = await agentCli(lab, lab.ns('vm'), ['status', '--socket', agent.socket]);
    process.stdout.write(stat.stdout.split('\n').map((l) => `    ${l}`).join('\n'));
    process.stdout.write('\n');
    say('a few metrics from http://10.99.0.2:9477/metrics');
    const m = await httpGetFrom(lab, lab.ns('client'), 'http://10.99.0.2:9477/metrics');
    const wanted = /^(lbagent_health_backend_up|lbagent_dhcp_lease_expiry_timestamp_seconds|lbagent_service_vip_info|lbagent_forward_dataplane_info|lbagent_service_ready)\{/;
    for (const line of m.body.split('\n').filter((l) => wanted.test(l)).slice(0, 14)) info(line);
    say(`done in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    await cleanup();
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`${tty ? C.red : ''}demo failed: ${(e as Error).stack ?? String(e)}${tty ? C.off : ''}\n`);
  process.exitCode = 1;
});
