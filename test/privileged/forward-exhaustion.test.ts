// Issue 15, "the agent blames backends for its own exhaustion", asserted the
// other way: the real agent on the proxy path under a 256-descriptor limit,
// 1,000 clients at once against three healthy backends. No backend is marked
// down (passive or active health), no client hangs; with the default
// proxy.maxConnections (derived from the limit) every refused client gets a
// clean close (FIN, no bytes, never a reset or an empty hang); with
// maxConnections set beyond what the descriptors allow, the agent runs into
// EMFILE itself and still blames no backend, counting and logging it.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, type Lab } from '../../lab/netns';
import { startBackend, httpGetFrom } from '../../lab/services';
import { startAgent, waitStatus, type AgentHandle } from '../../lab/agent';

const VIP = '10.99.0.200';
const CLIENTS = 1000;

/**
 * 1,000 connections at once from ns, each sending an HTTP/1.0 request 2 s
 * after connecting (so the proxy holds them all at once, as slow clients
 * would); each outcome classified. Bounded: 20 s per client.
 */
const CLIENT_SCRIPT = `
const net = require('net');
const N = ${CLIENTS};
const out = { served: 0, fin: 0, reset: 0, resetAfterData: 0, other: 0, hung: 0, partial: 0, maxMs: 0 };
let left = N;
const t0 = Date.now();
for (let i = 0; i < N; i++) {
  const s = net.connect({ host: '${VIP}', port: 80 });
  let data = '';
  let done = false;
  const finish = (kind) => {
    if (done) return; done = true; clearTimeout(timer); s.destroy();
    out[kind]++; out.maxMs = Math.max(out.maxMs, Date.now() - t0);
    if (--left === 0) process.stdout.write(JSON.stringify(out));
  };
  const timer = setTimeout(() => finish('hung'), 20000);
  s.on('connect', () => setTimeout(() => { if (!done) s.write('GET / HTTP/1.0\\r\\n\\r\\n'); }, 2000));
  s.on('data', (d) => { data += d; });
  s.on('end', () => finish(data.startsWith('HTTP/1.') && /\\r\\n\\r\\nb[123]\\n$/.test(data) ? 'served' : data === '' ? 'fin' : 'partial'));
  s.on('error', (e) => { if (e.code !== 'ECONNRESET') out.errors = { ...out.errors, [e.code]: 1 }; finish(e.code === 'ECONNRESET' ? (data ? 'resetAfterData' : 'reset') : 'other'); });
}
`;

interface Outcome { served: number; fin: number; reset: number; resetAfterData: number; other: number; hung: number; partial: number; maxMs: number }

async function lab3(t: { teardown(fn: () => unknown): void }): Promise<{ lab: Lab; node: string; client: string }> {
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  for (const [i, id] of ['b1', 'b2', 'b3'].entries()) {
    const ns = await lab.addHost(id, { address: `10.99.0.1${i + 1}/24` });
    await startBackend(lab, ns, id);
  }
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  return { lab, node, client };
}

function config(maxConnections?: number): Record<string, unknown> {
  return {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '10.99.0.2:9477' },
    dataplane: 'proxy',
    ...(maxConnections ? { proxy: { maxConnections } } : {}),
    pools: { 'range-global': `${VIP}-${VIP}` },
    arp: { probeWait: 0.05, probeNum: 1, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 1, announceInterval: 0.1 },
    services: [{ name: 'web', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11', '10.99.0.12', '10.99.0.13'],
      healthCheck: { periodSeconds: 0.5, timeoutSeconds: 1, failureThreshold: 2, passiveFailures: 3 } }],
  };
}

/** Run the burst while sampling the healthy count; returns the outcome and the lowest healthy count seen. */
async function burst(lab: Lab, client: string, agent: AgentHandle): Promise<{ o: Outcome; minHealthy: number }> {
  let minHealthy = 3;
  let sampling = true;
  const sampler = (async () => {
    for (let i = 0; i < 400 && sampling; i++) {
      const st = await agent.status().catch(() => undefined);
      if (st) minHealthy = Math.min(minHealthy, st.services[0]!.healthyBackends);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  const r = await lab.exec(client, process.execPath, ['-e', CLIENT_SCRIPT], { timeoutMs: 60_000, allowFail: true });
  await new Promise((res) => setTimeout(res, 1500)); // a failure threshold's worth of probes after the burst
  sampling = false;
  await sampler;
  const st = await agent.status();
  minHealthy = Math.min(minHealthy, st.services[0]!.healthyBackends);
  return { o: JSON.parse(r.stdout || '{}') as Outcome, minHealthy };
}

t.test('256 descriptors, 1,000 clients, default maxConnections: no backend down, every refused client a clean close', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, node, client } = await lab3(t);
  const agent = await startAgent(lab, node, config(), { nofile: 256, logLevel: 'info' });
  await waitStatus(agent, 'web ready with 3 backends', (s) => s.services[0]?.ready === true && s.services[0].healthyBackends === 3, 30_000);
  const fds = (await lab.sh(node, `ls /proc/${agent.proc.pid}/fd | wc -l`)).stdout.trim();
  t.comment(`agent descriptors in use when ready, before any client: ${fds}`);
  const limits = agent.logs.find((l) => l.op === 'limits');
  t.equal(limits?.maxConnections, 64, 'maxConnections derived from 256 descriptors: (256 - 128) / 2');
  const { o, minHealthy } = await burst(lab, client, agent);
  t.comment(`outcomes: ${JSON.stringify(o)}`);
  t.equal(o.served + o.fin + o.reset + o.resetAfterData + o.other + o.hung + o.partial, CLIENTS, 'every client accounted for');
  t.equal(minHealthy, 3, 'no backend was marked down during or after the burst');
  t.equal(o.hung, 0, 'no client hung');
  t.equal(o.partial, 0, 'no truncated reply');
  t.equal(o.reset + o.resetAfterData + o.other, 0, 'no refused client was reset: each got a clean close');
  t.ok(o.served > 0, `${o.served} served`);
  const m = await httpGetFrom(lab, client, 'http://10.99.0.2:9477/metrics');
  const refused = Number(/lbagent_forward_own_limit_refused_total\{op="limit",code="max-connections"\} (\d+)/.exec(m.body)?.[1] ?? 0);
  t.equal(refused, o.fin, `each clean close counted (${refused})`);
  t.notMatch(m.body, /lbagent_forward_connect_failures_total\{[^}]*\} [1-9]/, 'no connect failure counted against a backend');
  if (o.fin > 0) t.ok(agent.logs.some((l) => l.level === 'warn' && l.op === 'own-limit'), 'a warn line said so');
});

t.test('256 descriptors, maxConnections above what they allow: EMFILE is the agent\'s own, no backend blamed', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, node, client } = await lab3(t);
  const agent = await startAgent(lab, node, config(1000), { nofile: 256, logLevel: 'info' });
  await waitStatus(agent, 'web ready with 3 backends', (s) => s.services[0]?.ready === true && s.services[0].healthyBackends === 3, 30_000);
  const { o, minHealthy } = await burst(lab, client, agent);
  t.comment(`outcomes: ${JSON.stringify(o)}`);
  t.equal(minHealthy, 3, 'no backend was marked down');
  t.equal(o.hung, 0, 'no client hung');
  const m = await httpGetFrom(lab, client, 'http://10.99.0.2:9477/metrics');
  const own = [...m.body.matchAll(/lbagent_forward_own_limit_refused_total\{op="(accept|connect)",code="(\w+)"\} (\d+)/g)].map((x) => `${x[1]}/${x[2]}=${x[3]}`);
  // EMFILE on accept() itself is invisible to Node: libuv closes the pending
  // connections with its reserve descriptor and reports nothing. What the
  // agent can see (connect EMFILE, skipped probes) is counted; none of it
  // reaches a backend's health.
  t.comment(`own-limit refusals seen by the proxy: ${own.join(', ') || 'none'}`);
  const skipped = /lbagent_health_probes_skipped_total\{reason="own-exhaustion"\} (\d+)/.exec(m.body)?.[1] ?? '0';
  t.comment(`health probes skipped for want of a descriptor: ${skipped}`);
  t.equal(o.served + o.fin + o.reset + o.resetAfterData + o.other + o.hung + o.partial, CLIENTS, 'every client accounted for');
  t.notMatch(m.body, /lbagent_forward_connect_failures_total\{[^}]*\} [1-9]/, 'no connect failure counted against a backend');
  // The agent is still whole: served again once the burst is over.
  const after = await httpGetFrom(lab, client, `http://${VIP}/`);
  t.ok(after.ok && /^b[123]\n$/.test(after.body), `served after the burst (${after.body.trim() || after.error})`);
});
