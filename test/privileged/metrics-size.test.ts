// The /metrics page stays small with many services: 200 pool services of
// three backends each on the real kernel, every backend up, scraped from
// another namespace. The series that carry a service label are under 550
// bytes a service, the rest of the page (the agent's own series, the
// process', the data path's and the eBPF engine's) under 24 KiB, and the up
// gauge is the only series per backend while no traffic flowed. A per-backend histogram
// or counter that comes back fails here.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { startBackend, httpGetFrom } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';

const SERVICES = 200;
const BACKENDS = ['10.96.0.11', '10.96.0.12', '10.96.0.13'];
const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };

t.test(`/metrics with ${SERVICES} services of ${BACKENDS.length} backends`, async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.96.0.2/20' });
  const mon = await lab.addHost('mon', { address: '10.96.0.3/20' });
  for (const [i, a] of BACKENDS.entries()) await startBackend(lab, await lab.addHost(`b${i + 1}`, { address: `${a}/20` }), `b${i + 1}`);
  const agent = await startAgent(lab, node, {
    node: { name: 'vm1', interface: 'eth0' },
    dataplane: 'kernel',
    metrics: { listen: '10.96.0.2:9477' },
    pools: { 'range-global': '10.96.4.0-10.96.5.255' },
    arp: FAST_ARP,
    services: Array.from({ length: SERVICES }, (_, i) => ({
      name: `s${i}`, ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: BACKENDS,
      healthCheck: { periodSeconds: 1, timeoutSeconds: 1 },
    })),
  }, { logLevel: 'info' });
  await waitStatus(agent, `${SERVICES} services ready with every backend up`,
    (s) => s.services.length === SERVICES && s.services.every((x) => x.ready && x.healthyBackends === BACKENDS.length), 120_000);
  const r = await httpGetFrom(lab, mon, 'http://10.96.0.2:9477/metrics', 10_000);
  t.ok(r.ok, `scraped /metrics ${r.error ?? ''}`);
  const lines = r.body.split('\n').filter((l) => l !== '' && !l.startsWith('#'));
  const bytes = Buffer.byteLength(r.body);
  const serviceBytes = lines.filter((l) => l.includes('service="')).reduce((s, l) => s + Buffer.byteLength(l) + 1, 0) / SERVICES;
  const rest = bytes - serviceBytes * SERVICES;
  t.comment(`${bytes} bytes, ${(bytes / SERVICES).toFixed(0)} a service; series with a service label ${serviceBytes.toFixed(0)} a service; the rest ${rest} bytes`);
  t.ok(rest < 24 * 1024, `the page without the per-service series is ${rest} bytes, under 24 KiB`);
  t.ok(serviceBytes < 550, `the per-service series are ${serviceBytes.toFixed(0)} bytes a service, under 550`);
  const perBackend = new Set(lines.filter((l) => /[{,]backend="/.test(l)).map((l) => l.split('{')[0]));
  t.same([...perBackend], ['lbagent_health_backend_up'], 'the up gauge is the only series per backend without traffic');
  t.equal(lines.filter((l) => l.startsWith('lbagent_health_backend_up{')).length, SERVICES * BACKENDS.length, 'one up gauge a backend of a service');
});
