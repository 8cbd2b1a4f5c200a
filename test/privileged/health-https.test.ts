// Privileged: HTTPS health checks against real TLS backends in lab
// namespaces (lab/bin/tls-backend.ts), with a CA and certificates the
// openssl CLI makes at test time (lab/tls.ts; the expired one through
// `openssl ca -startdate/-enddate`, which OpenSSL 3.0 has and `x509 -req`
// has not). The checks come from the real config loader (caFile read there).
// - the checker in the node namespace (fixtures/health-driver.ts): with the
//   CA, a valid certificate is up and an expired one down ("certificate has
//   expired"); without it both are up and no server name is sent; a wrong
//   server name fails verification; a port that accepts TCP and never
//   finishes the handshake is down within its timeout, its connections
//   closed; a status outside the range is down ("HTTP 503"); each target's
//   first check makes a full handshake and the next ones resume its session;
// - the real agent: `lb-agent status` says why a backend is down; a reload
//   naming a missing caFile is refused with the field's path; reloads that
//   drop the CA or change it apply at once.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { createTestCa, startTlsBackend, type TestCa } from '../../lab/tls';
import { startAgent, waitStatus, agentCli } from '../../lab/agent';
import { parseConfigText, formatConfigErrors } from '../../agent/config/load';
import type { HealthCheckSpec } from '../../agent/config/types';
import { HealthDriver } from './fixtures/health-client';
import { FAST_ARP } from './fixtures/operator-lab';

if (requirePrivileged(t)) {
  const GOOD = '10.99.0.11';
  const EXPIRED = '10.99.0.12';
  const STALL = '10.99.0.13';
  const UNHAPPY = '10.99.0.14';
  const PORT = 8443;
  const DAY = 86400_000;

  /** The lab: node, four backends (valid, expired, stalled handshake, answering 503), and the CA. */
  async function httpsLab(t: Parameters<typeof createLab>[0]): Promise<{ lab: Lab; node: string; ca: TestCa; good: Awaited<ReturnType<typeof startTlsBackend>> }> {
    const lab = await createLab(t);
    const ca = await createTestCa();
    t.teardown(() => ca.remove());
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const valid = await ca.issue('web', { dns: ['web.lab'] });
    const expired = await ca.issue('expired', { dns: ['web.lab'], notBefore: new Date(Date.now() - 30 * DAY), notAfter: new Date(Date.now() - DAY) });
    const hosts: string[] = [];
    for (const [i, a] of [GOOD, EXPIRED, STALL, UNHAPPY].entries()) hosts.push(await lab.addHost(`b${i + 1}`, { address: `${a}/24` }));
    const good = await startTlsBackend(lab, hosts[0]!, { port: PORT, leaf: valid });
    const others = [
      await startTlsBackend(lab, hosts[1]!, { port: PORT, leaf: expired }),
      await startTlsBackend(lab, hosts[2]!, { port: PORT, stall: true }),
      await startTlsBackend(lab, hosts[3]!, { port: PORT, leaf: valid, status: 503 }),
    ];
    t.teardown(async () => { for (const b of [good, ...others]) await b.stop(); });
    return { lab, node, ca, good };
  }

  /** A service's health check as the real loader makes it from YAML (the CA file read there). */
  function loadedCheck(healthCheck: string): HealthCheckSpec {
    const res = parseConfigText(`services: [{ name: x, ipam: dhcp, ports: [{ port: ${PORT} }], healthCheck: ${healthCheck} }]`);
    if (!res.ok) throw new Error(formatConfigErrors(res.errors));
    return res.config.services[0]!.healthCheck;
  }

  t.test('verification on and off, a wrong name, a stalled handshake, a bad status', async (t) => {
    const { lab, node, ca, good } = await httpsLab(t);
    const timing = 'periodSeconds: 0.5, timeoutSeconds: 1, failureThreshold: 1';
    const verified = loadedCheck(`{ type: https, ${timing}, tls: { sni: web.lab, caFile: ${ca.caFile} } }`);
    const d = await HealthDriver.start(lab, node);
    t.teardown(() => d.close());
    await d.update([
      { name: 'verified', backends: [GOOD, EXPIRED], healthCheck: verified },
      { name: 'unverified', backends: [GOOD, EXPIRED], healthCheck: loadedCheck(`{ type: https, ${timing} }`) },
      { name: 'wrong-name', backends: [GOOD], healthCheck: loadedCheck(`{ type: https, ${timing}, tls: { sni: api.lab, caFile: ${ca.caFile} } }`) },
      { name: 'stalled', backends: [STALL], healthCheck: loadedCheck(`{ type: https, ${timing} }`) },
      { name: 'status', backends: [GOOD, UNHAPPY], healthCheck: loadedCheck(`{ type: https, ${timing}, http: { path: /healthz, expectStatus: [200, 299] } }`) },
    ]);
    d.send({ cmd: 'start' });
    const down = async (service: string, address: string) => {
      const tr = await d.transition(`default/${service}`, 'down')();
      t.equal(tr.address, address, `${service}: ${address} is the one down`);
      return tr.status;
    };

    await d.waitEvent('verified: the valid backend up', (e) => e.event === 'change' && e.service === 'default/verified' && e.address === GOOD && e.up === true, 10_000);
    const expired = await down('verified', EXPIRED);
    t.same([expired.reason, expired.lastFailure?.detail], ['tls', 'certificate has expired'], 'with the CA: the expired certificate is down, and says so');

    for (const a of [GOOD, EXPIRED]) {
      await d.waitEvent(`unverified: ${a} up`, (e) => e.event === 'change' && e.service === 'default/unverified' && e.address === a && e.up === true, 10_000);
    }
    t.pass('without the CA: the expired certificate is up (nothing verified, as check-ssl verify none)');

    const wrong = await down('wrong-name', GOOD);
    t.equal(wrong.reason, 'tls');
    t.match(wrong.lastFailure?.detail, /Host: api\.lab\. is not in the cert's altnames: DNS:web\.lab/, 'a name the certificate is not for fails verification');

    const stalled = await down('stalled', STALL);
    t.same([stalled.reason, stalled.lastFailure?.detail], ['timeout', 'TLS handshake timed out after 1000 ms']);
    const stalls = d.probes(STALL);
    t.ok(stalls.length >= 1 && stalls.every((p) => !p.ok && p.durationMs >= 950 && p.durationMs < 2000), `each handshake gave up at the 1 s timeout (${stalls.map((p) => Math.round(p.durationMs)).join(', ')} ms)`);

    const bad = await down('status', UNHAPPY);
    t.same([bad.reason, bad.lastFailure?.detail], ['bad-status', 'HTTP 503, expected 200-299']);
    const st = await d.status('default/status');
    t.same(st.healthy, [GOOD], 'the backend answering 200 stays in');

    // Probes go on; the stalled backend must not collect connections: each probe's socket is destroyed at its timeout.
    await new Promise((r) => setTimeout(r, 3000));
    const conns = await lab.sh(lab.ns('b3'), `ss -Htn state established '( sport = :${PORT} )' | wc -l`);
    const n = Number(conns.stdout.trim());
    const probed = d.probes(STALL).length;
    t.ok(probed >= 3 && n <= 2, `${probed} probes of the stalled port, ${n} connection(s) still open there (at most the one in flight)`);

    // What the probes sent: the server name only where sni is set, and that name as Host.
    const seen = good.requests();
    t.ok(seen.some((r) => r.servername === 'web.lab' && r.host === 'web.lab'), 'sni web.lab sent, and asked for as Host');
    t.ok(seen.some((r) => r.servername === false && r.host === `${GOOD}:${PORT}`), 'no server name without sni');
    t.ok(seen.every((r) => r.servername === false || r.servername === 'web.lab'), 'nothing else sent');

    // Sessions: each target's first check makes a full handshake, the next ones resume it (the verified and the unverified target each its own).
    for (const [what, sni] of [['verified', 'web.lab'], ['unverified', false]] as const) {
      const checks = seen.filter((r) => r.servername === sni && r.url === '/').map((r) => r.reused);
      t.ok(checks.length >= 4 && checks[0] === false && checks.slice(1).every((x) => x), `${what}: full handshake first, then resumed (${checks.map((x) => (x ? 'r' : 'F')).join('')})`);
    }
  });

  t.test('the real agent: status says why, a missing caFile is refused at reload, a changed caFile applies', async (t) => {
    const { lab, node, ca } = await httpsLab(t);
    const other = await createTestCa();
    t.teardown(() => other.remove());
    const caFile = path.join(lab.file('ca'), 'ca.pem');
    fs.mkdirSync(path.dirname(caFile), { recursive: true });
    fs.copyFileSync(ca.caFile, caFile);
    const config = (tls: Record<string, unknown> | undefined) => ({
      node: { interface: 'eth0' }, metrics: { listen: '' }, arp: FAST_ARP,
      pools: { 'range-global': '10.99.0.200-10.99.0.201' },
      services: [{
        name: 'web', ipam: 'pool', ports: [{ port: 443, targetPort: PORT }], backends: [GOOD, EXPIRED],
        healthCheck: { type: 'https', periodSeconds: 0.3, timeoutSeconds: 1, failureThreshold: 1, ...(tls ? { tls } : {}) },
      }],
    });
    const agent = await startAgent(lab, node, config({ sni: 'web.lab', caFile }));
    t.teardown(() => agent.signal('SIGKILL'));
    const backend = (s: Awaited<ReturnType<typeof agent.status>>, a: string) => s.services[0]?.backends.find((b) => b.address === a);
    await waitStatus(agent, 'the valid backend up, the expired one down', (s) => backend(s, GOOD)?.state === 'up' && backend(s, EXPIRED)?.state === 'down', 20_000);
    const text = await agentCli(lab, node, ['status', '--socket', agent.socket]);
    t.match(text.stdout, new RegExp(`${EXPIRED.replace(/\./g, '\\.')}:${PORT}\\s+down\\s+\\S+\\s+tls: certificate has expired \\(active check\\)`), '`lb-agent status` says why it is down');

    // A reload naming a CA file that is not there: refused with the field path, nothing applied.
    const gen = (await agent.status()).config.generation;
    agent.writeConfig(config({ sni: 'web.lab', caFile: '/nonexistent/ca.pem' }));
    agent.signal('SIGHUP');
    const refused = await waitStatus(agent, 'the reload refused', (s) => s.config.lastReload?.ok === false, 15_000);
    t.match(refused.config.lastReload?.message, /services\[0\]\.healthCheck\.tls\.caFile: cannot read \/nonexistent\/ca\.pem: no such file/);
    t.equal(refused.config.generation, gen, 'the running config kept');
    const v = await agentCli(lab, node, ['validate', '--config', agent.configPath]);
    t.not(v.code, 0, '`lb-agent validate` refuses the same file');
    t.match(v.stdout + v.stderr, /healthCheck\.tls\.caFile: cannot read \/nonexistent\/ca\.pem/);

    // Verification off: the expired backend comes in.
    agent.writeConfig(config(undefined));
    agent.signal('SIGHUP');
    await waitStatus(agent, 'both up without the CA', (s) => s.config.generation > gen && backend(s, GOOD)?.state === 'up' && backend(s, EXPIRED)?.state === 'up', 15_000);
    t.pass('a reload that drops caFile applies: the expired backend is up');

    // The CA file rewritten with another CA, same path: the reload reads it, and neither backend's certificate chains to it.
    fs.copyFileSync(other.caFile, caFile);
    const gen2 = (await agent.status()).config.generation;
    agent.writeConfig(config({ sni: 'web.lab', caFile }));
    agent.signal('SIGHUP');
    const st = await waitStatus(agent, 'both down under the other CA', (s) => s.config.generation > gen2 && backend(s, GOOD)?.state === 'down' && backend(s, EXPIRED)?.state === 'down', 15_000);
    t.match(st.services[0]!.backends.map((b) => b.lastFailure?.detail).join('; '), /unable to verify the first certificate/, 'verification fails against a CA that signed neither');

    // And back to the right CA, same path, same config text: a reload re-reads the file and applies.
    fs.copyFileSync(ca.caFile, caFile);
    const gen3 = (await agent.status()).config.generation;
    agent.signal('SIGHUP');
    await waitStatus(agent, 'the valid backend up again', (s) => s.config.generation > gen3 && backend(s, GOOD)?.state === 'up' && backend(s, EXPIRED)?.state === 'down', 15_000);
    t.pass('a CA file changed on disk applies at the next reload');
    await waitFor('agent still running', () => agent.proc.exitCode === null, 1000);
  });
}
