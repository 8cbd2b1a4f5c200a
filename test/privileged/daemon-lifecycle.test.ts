// The daemon's life cycle on the real kernel: start, status (table and
// JSON), /metrics /healthz /readyz, SIGHUP with a broken file (nothing
// changes) and with a changed file (only the changed service is touched),
// the single-instance lock, and SIGTERM (exits within 10 s, leaves nothing).
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startBackend, startDnsmasq, httpGetFrom } from '../../lab/services';
import { startAgent, agentCli, waitStatus, AGENT_BIN } from '../../lab/agent';
import { within, TIMED_OUT } from '../../lab/within';
import * as fs from 'node:fs';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };

/** `ip -o addr show; ip -o link show` reduced to what must not change: each address or link, without lifetimes and counters. */
function strip(s: { stdout: string }): string[] {
  return s.stdout.split('\n').map((l: string) => l.replace(/\s+valid_lft.*$/, '').replace(/\\\s+.*$/, '').trim()).filter(Boolean).map((l: string) => l.replace(/^\d+:\s*/, '').split(' ').slice(0, 4).join(' ')).sort();
}

function config(extraBackend = false): Record<string, unknown> {
  return {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '10.99.0.2:9477' },
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    arp: FAST_ARP,
    dhcp: { retransmitInitial: 0.5, retransmitMax: 2 },
    services: [
      { name: 'web', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'],
        healthCheck: { periodSeconds: 0.5, timeoutSeconds: 0.5 } },
      { name: 'api', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }],
        backends: extraBackend ? ['10.99.0.11', '10.99.0.12'] : ['10.99.0.11'],
        healthCheck: { periodSeconds: 0.5, timeoutSeconds: 0.5 } },
    ],
  };
}

t.test('daemon life cycle', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await lab.addHost('b2', { address: '10.99.0.12/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  await startDnsmasq(lab, lab.ns('dhcp'), { range: '10.99.0.100,10.99.0.150', noPing: true });
  await startBackend(lab, lab.ns('b1'), 'b1');
  await startBackend(lab, lab.ns('b2'), 'b2');
  const before = await lab.sh(node, 'ip -o addr show; ip -o link show');

  const agent = await startAgent(lab, node, config());
  const ready = await waitStatus(agent, 'both services serving', (s) => s.services.length === 2 && s.services.every((x) => x.ready), 30_000);
  const web = ready.services.find((s) => s.name === 'web')!;
  const api = ready.services.find((s) => s.name === 'api')!;
  t.match(web.vip, /^10\.99\.0\.1\d\d$/, 'web has a DHCP address');
  t.equal(api.vip, '10.99.0.200', 'api has the lowest pool address');

  t.test('status as a table and as JSON', async (t) => {
    const table = await agentCli(lab, node, ['status', '--socket', agent.socket]);
    t.equal(table.code, 0, table.stderr);
    t.match(table.stdout, /SERVICE\s+IPAM\s+VIP/);
    t.match(table.stdout, new RegExp(`default/web\\s+dhcp\\s+${web.vip!.replace(/\./g, '\\.')}`));
    t.match(table.stdout, /default\/api\s+pool\s+10\.99\.0\.200/);
    t.match(table.stdout, /10\.99\.0\.11:8080\s+up/);
    const json = await agentCli(lab, node, ['status', '--socket', agent.socket, '--json']);
    t.equal(json.code, 0);
    const doc = JSON.parse(json.stdout) as { services: { key: string; vip: string; mac: string; interface: string }[] };
    t.same(doc.services.map((s) => s.key), ['default/web', 'default/api']);
    t.match(doc.services[0]!.mac, /^02:/, 'the DHCP service has a locally administered MAC');
    t.match(doc.services[0]!.interface, /^lbv/, 'on its own macvlan');
    // The daemon's document as it sends it: the CLI's bytes are curl's over
    // HTTP on the same socket (docs/operations.md), asked before and after
    // (a health transition between them changes the document: asked again).
    let viaCurl: [string, string] = ['', ''];
    let viaCli = '';
    for (let attempt = 0; attempt < 3 && (attempt === 0 || viaCurl[0] !== viaCurl[1]); attempt++) {
      const a = await lab.exec(node, 'curl', ['-fsS', '--max-time', '5', '--unix-socket', agent.socket, 'http://lb-agent/status']);
      viaCli = (await agentCli(lab, node, ['status', '--json', '--socket', agent.socket])).stdout;
      const c = await lab.exec(node, 'curl', ['-fsS', '--max-time', '5', '--unix-socket', agent.socket, 'http://lb-agent/status']);
      viaCurl = [a.stdout, c.stdout];
    }
    t.equal(viaCurl[0], viaCurl[1], 'one document across the requests');
    t.equal(viaCli, viaCurl[0], 'status --json prints the daemon\'s document byte for byte, as curl gets it');
    t.same(JSON.parse(viaCli), JSON.parse(json.stdout), 'the document');
    const refused = await lab.exec(node, 'curl', ['-sS', '--max-time', '5', '-o', '/dev/null', '-w', '%{http_code}', '-X', 'POST', '--unix-socket', agent.socket, 'http://lb-agent/status'], { allowFail: true });
    t.equal(refused.stdout, '405', 'a POST changes nothing and is refused');
    const noDaemon = await agentCli(lab, node, ['status', '--socket', lab.file('nothing.sock')]);
    t.equal(noDaemon.code, 1, 'status without a daemon fails');
    t.match(noDaemon.stderr, /cannot reach the agent at .*nothing\.sock/);
  });

  t.test('/metrics, /healthz and /readyz answer', async (t) => {
    const m = await httpGetFrom(lab, client, 'http://10.99.0.2:9477/metrics');
    t.ok(m.ok);
    t.match(m.body, /lbagent_health_backend_up\{[^}]*service="web"[^}]*\} 1/);
    t.match(m.body, /lbagent_service_ready\{service="api",namespace="default"\} 1/);
    const h = await httpGetFrom(lab, client, 'http://10.99.0.2:9477/healthz');
    t.equal(h.body, 'ok\n');
    const r = await httpGetFrom(lab, client, 'http://10.99.0.2:9477/readyz');
    t.equal(r.body, 'ready\n');
  });

  t.test('a second run against the same state dir refuses to start', async (t) => {
    const second = await lab.exec(node, process.execPath, [AGENT_BIN, 'run', '--config', agent.configPath], { allowFail: true, timeoutMs: 20_000 });
    t.equal(second.code, 1);
    // `ip netns exec` execs the agent: the pid we started is the agent's.
    t.match(second.stderr, `another lb-agent (pid ${agent.proc.pid}) is running`);
  });

  t.test('SIGHUP with a broken file changes nothing', async (t) => {
    const before = await agent.status();
    fs.writeFileSync(agent.configPath, 'services:\n  - name: web\n    ports: [{ port: 70000 }]\n');
    agent.signal('SIGHUP');
    const after = await waitStatus(agent, 'the reload to be rejected', (s) => s.config.lastReload?.ok === false, 10_000);
    t.equal(after.config.generation, before.config.generation, 'running config kept');
    t.match(after.config.lastReload!.message, /services\[0\]\.ports\[0\]\.port: 70000 is not a port/);
    t.same(after.services.map((s) => [s.key, s.vip, s.startedAt]), before.services.map((s) => [s.key, s.vip, s.startedAt]));
    t.equal(agent.proc.exitCode, null, 'still running');
    const r = await httpGetFrom(lab, client, `http://${api.vip}/`);
    t.ok(r.ok, 'still forwarding');
  });

  t.test('SIGHUP with a changed file touches only the changed service', async (t) => {
    const before = await agent.status();
    const since = before.events.length;
    agent.writeConfig(config(true));
    agent.signal('SIGHUP');
    const after = await waitStatus(agent, 'the reload to apply', (s) => s.config.generation === before.config.generation + 1, 10_000);
    t.equal(after.config.lastReload?.ok, true);
    t.equal(after.config.lastReload?.message, 'reloaded: 0 added, 0 removed, 1 changed, 1 unchanged', 'one service changed, the other not');
    const b = (s: typeof before, k: string) => s.services.find((x) => x.key === k)!;
    t.equal(b(after, 'default/web').startedAt, b(before, 'default/web').startedAt, 'web untouched');
    t.equal(b(after, 'default/web').vip, web.vip, 'web keeps its lease');
    t.equal(b(after, 'default/api').vip, api.vip, 'api keeps its address');
    // A backend added is an update in place: the VIP is never withdrawn.
    const vipEvents = after.events.slice(since).filter((e) => e.kind === 'vip-lost' || e.kind === 'vip-gained');
    t.same(vipEvents, [], 'no VIP was lost or gained by the reload');
    t.same([b(after, 'default/api').interruptions, b(after, 'default/web').interruptions], [0, 0], 'no interruption counted');
    await waitStatus(agent, 'api to see its new backend', (s) => b(s, 'default/api').backends.length === 2 && b(s, 'default/api').healthyBackends === 2, 10_000);
    // And traffic reaches it: b2 answers through api's VIP.
    const seen = new Set<string>();
    for (let i = 0; i < 20 && seen.size < 2; i++) {
      const r = await httpGetFrom(lab, client, `http://${api.vip}/`);
      if (r.ok) seen.add(r.body.trim());
    }
    t.same([...seen].sort(), ['b1', 'b2'], 'api forwards to both backends');
  });

  t.test('SIGTERM stops within 10 s and leaves nothing behind', async (t) => {
    const t0 = Date.now();
    agent.signal('SIGTERM');
    const res = await within(agent.exited, 12_000);
    t.not(res, TIMED_OUT, 'exited');
    t.same(res, { code: 0, signal: null }, 'exit code 0');
    t.comment(`stopped in ${Date.now() - t0} ms`);
    const after = await lab.sh(node, 'ip -o addr show; ip -o link show');
    t.same(strip(after), strip(before), 'no address or link left behind');
    const nft = await lab.sh(node, 'nft list tables', { allowFail: true });
    t.notMatch(nft.stdout, /lb_agent/, 'no nftables table left behind');
    t.notOk(fs.existsSync(agent.socket), 'control socket removed');
    t.ok(fs.readdirSync(agent.stateDir).some((f) => f.startsWith('dhcp-')), 'the DHCP lease is kept for next time');
  });

  t.test('SIGTERM in the middle of the start: stops once started, exit 0, leaves nothing', async (t) => {
    // The control socket is up before the subsystems load (the start goes on
    // for a few hundred ms after it): a stop sent then used to meet SIGTERM's
    // default action and kill the agent on the spot.
    const early = await startAgent(lab, node, config(), { name: 'early', waitReady: false });
    await waitFor('the control socket', () => fs.existsSync(early.socket) || early.proc.exitCode !== null, 15_000, 2);
    const startedBefore = early.logs.some((l) => l.msg === 'lb-agent started');
    early.signal('SIGTERM');
    const res = await within(early.exited, 15_000);
    t.same(res, { code: 0, signal: null }, 'exit code 0, not killed by the signal');
    if (!startedBefore) t.ok(early.logs.some((l) => l.op === 'stop' && /during the start/.test(String(l.msg))), 'the stop waited for the start');
    else t.comment('the start was already done when SIGTERM was sent');
    const after = await lab.sh(node, 'ip -o addr show; ip -o link show');
    t.same(strip(after), strip(before), 'no address or link left behind');
    t.notMatch((await lab.sh(node, 'nft list tables', { allowFail: true })).stdout, /lb_agent/, 'no nftables table left behind');
  });
});
