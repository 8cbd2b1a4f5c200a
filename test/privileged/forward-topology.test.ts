// Privileged: zone-aware balancing (issue 17) on both data paths, with the
// real agent. Three HTTP backends in two zones (b1, b2 in zone-a; b3 in
// zone-b); the VM learns that it is in zone-a from a labels file written as
// the Kubernetes downward API writes one. A prefer-zone service keeps every
// connection in zone-a while a backend there is healthy, moves to zone-b
// when both die (within the health thresholds) and comes back when one
// revives; a zone-only service refuses instead of spilling; a rewrite of
// the labels file (the VM migrated) moves both to the new zone without a
// reload. The same scenario runs on the kernel path and on the userspace
// proxy.
import t from 'tap';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { startBackend, httpGetFrom, type Backend } from '../../lab/services';
import { startAgent, waitStatus, type AgentHandle } from '../../lab/agent';
import { JsonLinesProc, type Burst } from '../../lab/forward';

const NEAR = '10.99.0.200';
const ONLY = '10.99.0.201';
const BACKENDS = [['b1', '10.99.0.11', 'zone-a'], ['b2', '10.99.0.12', 'zone-a'], ['b3', '10.99.0.13', 'zone-b']] as const;
const FAST_ARP = { probeWait: 0.05, probeNum: 1, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 1, announceInterval: 0.1 };
/** Down after failureThreshold x (period + timeout) = 0.8 s at most; up after one success. */
const HC = { periodSeconds: 0.2, timeoutSeconds: 0.2, failureThreshold: 2 };

/** The labels file as the downward API writes it, replaced in one rename. */
function writeLabels(file: string, zone: string): void {
  fs.writeFileSync(`${file}.tmp`, `kubernetes.io/hostname="worker-1"\ntopology.kubernetes.io/region="region-1"\ntopology.kubernetes.io/zone="${zone}"\n`);
  fs.renameSync(`${file}.tmp`, file);
}

async function scenario(t: tap.Test, lab: Lab, node: string, client: JsonLinesProc, backends: Backend[], kind: 'kernel' | 'proxy', labelsFile: string): Promise<void> {
  const service = (name: string, loadBalancerIP: string, topology: string) => ({
    name, ipam: 'pool', loadBalancerIP, topology, ports: [{ port: 80, targetPort: 8080 }], healthCheck: HC,
    backends: BACKENDS.map(([, address, zone]) => ({ address, zone })),
  });
  const agent: AgentHandle = await startAgent(lab, node, {
    node: { interface: 'eth0', labelsFile }, metrics: { listen: '127.0.0.1:9477' }, dataplane: kind,
    pools: { 'range-global': '10.99.0.200-10.99.0.209' }, arp: FAST_ARP,
    services: [service('near', NEAR, 'prefer-zone'), service('only', ONLY, 'zone-only')],
  }, { name: `node-${kind}` });
  t.teardown(() => { agent.signal('SIGKILL'); });
  const setOf = async (name: string): Promise<string | undefined> => (await agent.status()).services.find((s) => s.name === name)?.topology?.set;
  const st = await waitStatus(agent, 'both services on zone-a', (s) => s.services.every((x) => x.ready && x.topology?.set === 'zone'), 30_000);
  t.same([st.node.zone, st.node.zoneFrom], ['zone-a', 'labels-file'], 'the node\'s zone came from the labels file');

  const burst = (host: string, n = 30): Promise<Burst> => client.request<Burst>({ cmd: 'burst', host, port: 80, n, concurrency: 4 }, 60_000);
  // Status turns ready with the health verdicts; the data path follows a moment later (one nft transaction).
  for (const vip of [NEAR, ONLY]) await waitFor(`${vip} answers`, async () => Object.keys((await burst(vip, 1)).counts).length === 1, 10_000, 50);
  let r = await burst(NEAR);
  t.same(r.errors, {}, 'prefer-zone: no request failed');
  t.same(Object.keys(r.counts).sort(), ['b1', 'b2'], `prefer-zone: every connection stays in zone-a (${JSON.stringify(r.counts)})`);
  r = await burst(ONLY);
  t.same(Object.keys(r.counts).sort(), ['b1', 'b2'], 'zone-only: the same');

  // Both zone-a backends die: prefer-zone spills to zone-b within the health thresholds.
  const died = Date.now();
  await Promise.all([backends[0]!.stop(), backends[1]!.stop()]);
  const first = await waitFor('a connection served from zone-b', async () => {
    const one = await burst(NEAR, 1);
    return one.counts['b3'] === 1 ? Date.now() : undefined;
  }, 10_000, 20);
  t.ok(first - died < 3000, `${kind}: traffic moved to zone-b ${first - died} ms after zone-a died (thresholds 2 x (0.2 + 0.2) s; slow-machine allowance)`);
  r = await burst(NEAR);
  t.same(r, { counts: { b3: 30 }, errors: {} }, 'prefer-zone: every connection to zone-b now');
  const spill = (await agent.status()).services.find((s) => s.name === 'near')!;
  t.same([spill.topology?.set, spill.topology?.reason, spill.ready], ['all', 'zone-unhealthy-spill', true]);

  // zone-only refuses instead of spilling, and says so. Its health checks run
  // on their own schedule (not in step with near's), so wait for its own
  // verdict, within the same thresholds, before asking: only then could it spill.
  const refusing = await waitFor('zone-only sees zone-a down', async () => {
    const x = (await agent.status()).services.find((s) => s.name === 'only');
    return x?.topology?.reason === 'zone-unhealthy-refuse' ? Date.now() : undefined;
  }, 10_000, 20);
  t.ok(refusing - died < 3000, `${kind}: zone-only saw zone-a down ${refusing - died} ms after it died`);
  const only = await client.request<{ result: string }>({ cmd: 'connect', host: ONLY, port: 80, timeoutMs: 3000 });
  t.not(only.result, 'answered', `zone-only: refused (${only.result}), not sent to zone-b`);
  const onlySt = (await agent.status()).services.find((s) => s.name === 'only')!;
  t.same([onlySt.ready, onlySt.topology?.set, onlySt.topology?.reason], [false, 'none', 'zone-unhealthy-refuse']);
  t.match(onlySt.reason, /zone-only: no healthy backend in zone zone-a: new connections are refused/);
  const metrics = (await httpGetFrom(lab, node, 'http://127.0.0.1:9477/metrics')).body;
  t.match(metrics, /lbagent_service_topology_info\{service="near",namespace="default",policy="prefer-zone",set="all",reason="zone-unhealthy-spill"\} 1/);
  t.match(metrics, /lbagent_service_topology_info\{service="only",namespace="default",policy="zone-only",set="none",reason="zone-unhealthy-refuse"\} 1/);

  // One zone-a backend comes back: traffic returns to the zone.
  backends[0] = await startBackend(lab, lab.ns('b1'), 'b1');
  await waitFor('prefer-zone back on zone-a', async () => (await setOf('near')) === 'zone', 10_000, 50);
  await waitFor('a connection served from zone-a again', async () => (await burst(NEAR, 1)).counts['b1'] === 1, 5000, 20);
  r = await burst(NEAR);
  t.same(r, { counts: { b1: 30 }, errors: {} }, 'prefer-zone: back in zone-a, weights over the zone\'s healthy set');
  r = await burst(ONLY, 10);
  t.same(r, { counts: { b1: 10 }, errors: {} }, 'zone-only serves again');
  backends[1] = await startBackend(lab, lab.ns('b2'), 'b2');

  // The VM migrates to a zone-b host: whatever syncs the labels rewrites the
  // file (a rename, as the downward API swaps its files). No reload: the agent
  // notices the rewrite by itself and balances in zone-b.
  const moved = Date.now();
  t.teardown(() => writeLabels(labelsFile, 'zone-a'));
  writeLabels(labelsFile, 'zone-b');
  const inB = await waitStatus(agent, 'the node in zone-b', (s) => s.node.zone === 'zone-b', 10_000);
  t.ok(Date.now() - moved < 6000, `${kind}: the rewritten labels file took effect ${Date.now() - moved} ms later (polled every 2 s), without a reload`);
  t.match(inB.events?.filter((e) => e.kind === 'zone-changed').map((e) => e.reason), [/^zone-a \(region region-1\) -> zone-b \(region region-1\): .*node-labels was rewritten$/]);
  await waitFor('prefer-zone on zone-b', async () => (await burst(NEAR, 1)).counts['b3'] === 1, 5000, 20);
  r = await burst(NEAR);
  t.same(r, { counts: { b3: 30 }, errors: {} }, 'prefer-zone: every connection in the new zone, zone-b, though zone-a is healthy');
  r = await burst(ONLY, 10);
  t.same(r, { counts: { b3: 10 }, errors: {} }, 'zone-only: zone-b only');
  agent.signal('SIGTERM');
  await agent.exited;
}

if (requirePrivileged(t)) {
  t.test('zone-aware balancing on both data paths', async (t) => {
    const t0 = Date.now();
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const clientNs = await lab.addHost('client', { address: '10.99.0.3/24' });
    const backends: Backend[] = [];
    for (const [id, address] of BACKENDS) {
      await lab.addHost(id, { address: `${address}/24` });
      backends.push(await startBackend(lab, lab.ns(id), id));
    }
    // As the downward API writes metadata.labels (harvester-node-driver.md: Harvester syncs these to the guest node).
    const labelsFile = lab.file('node-labels');
    writeLabels(labelsFile, 'zone-a');
    const client = await JsonLinesProc.start(lab, clientNs, 'forward-client.js', [], 'client');
    t.teardown(() => client.close());
    for (const kind of ['kernel', 'proxy'] as const) {
      await t.test(`${kind} data path`, (t) => scenario(t, lab, node, client, backends, kind, labelsFile));
    }
    t.comment(`whole test ${Date.now() - t0} ms`);
  });
}
