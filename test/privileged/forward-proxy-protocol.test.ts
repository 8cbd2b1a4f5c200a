// Issue 17 end to end: the real agent (dataplane auto) on the proxy path sends
// the PROXY protocol header, and a backend that requires it - parsing it
// strictly, byte for byte against the spec (lab/bin/proxy-protocol-backend.ts)
// - sees the client's real address and port with v1 and with v2, for TCP and
// (v2) UDP; health checks send the header when asked (a v1 line naming the
// probe's own connection with an http check, the v2 LOCAL command with a tcp
// check) and nothing when not; and validate refuses PROXY protocol on the
// kernel path. About 15 s.
import t from 'tap';
import * as fs from 'node:fs';
import { stringify } from '../../lab/yaml';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { distPath } from '../../lab/services';
import { onJsonLines } from '../../lab/jsonlines';
import { agentCli, startAgent, waitStatus } from '../../lab/agent';

const VIP = '10.99.0.200';
const NODE = '10.99.0.2';
const CLIENT = '10.99.0.50';
const BACKENDS = ['10.99.0.11', '10.99.0.12'];

/** From the client: TCP requests (each reports its own local port and the backend's answer) and UDP datagrams. */
const CLIENT_SCRIPT = `
const net = require('net'); const dgram = require('dgram');
const plan = JSON.parse(process.argv[1]);
const tcp = (port) => new Promise((resolve) => {
  const s = net.connect({ host: '${VIP}', port });
  let data = ''; let local;
  s.on('connect', () => { local = s.localPort; s.write('GET / HTTP/1.0\\r\\n\\r\\n'); });
  s.on('data', (d) => { data += d; });
  s.on('end', () => { s.destroy(); const body = data.split('\\r\\n\\r\\n')[1]; resolve({ port, local, body: body ? JSON.parse(body) : undefined, raw: data.slice(0, 200) }); });
  s.on('error', (e) => resolve({ port, local, error: e.code }));
  setTimeout(() => { s.destroy(); resolve({ port, local, error: 'timeout' }); }, 5000);
});
const udp = (port) => new Promise((resolve) => {
  const s = dgram.createSocket('udp4');
  s.bind(0, () => {
    const local = s.address().port;
    const timer = setTimeout(() => { s.close(); resolve({ port, local, error: 'timeout' }); }, 3000);
    s.once('message', (m) => { clearTimeout(timer); s.close(); resolve({ port, local, body: JSON.parse(String(m)) }); });
    s.send('query', port, '${VIP}');
  });
});
(async () => {
  const out = [];
  for (const p of plan.tcp) out.push(await tcp(p));
  for (const p of plan.udp) out.push(await udp(p));
  process.stdout.write(JSON.stringify(out));
})();
`;

interface Seen { id: string; proto: string; port: number; peer: string; header?: { version: number; command: string; transport: string; source?: string; sourcePort?: number; destination?: string; destinationPort?: number }; error?: string; request?: string }
interface Reply { port: number; local: number; body?: Seen; error?: string; raw?: string }

function config(): Record<string, unknown> {
  const hc = { periodSeconds: 0.5, timeoutSeconds: 1, failureThreshold: 2 };
  return {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '' },
    dataplane: 'auto',
    proxy: { workers: 2 },
    pools: { 'range-global': `${VIP}-${VIP}` },
    arp: { probeWait: 0.05, probeNum: 1, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 1, announceInterval: 0.1 },
    services: [
      { name: 'web1', ipam: 'pool', proxyProtocol: 'v1', ports: [{ port: 80, targetPort: 8080 }], backends: BACKENDS,
        healthCheck: { ...hc, type: 'http', port: 8080, proxyProtocol: true } },
      { name: 'web2', primaryService: 'web1', proxyProtocol: 'v2', ports: [{ port: 81, targetPort: 8081 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }], backends: BACKENDS,
        healthCheck: { ...hc, type: 'tcp', port: 8081, proxyProtocol: true } },
      // The check is unaffected unless asked: a plain TCP connect to the same strict port.
      { name: 'web3', primaryService: 'web1', proxyProtocol: 'v2', ports: [{ port: 82, targetPort: 8081 }], backends: BACKENDS,
        healthCheck: { ...hc, type: 'tcp', port: 8081 } },
    ],
  };
}

t.test('PROXY protocol v1 and v2: the backend sees the client; checks send the header only when asked', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: `${NODE}/24` });
  const seen: Seen[] = [];
  for (const [i, address] of BACKENDS.entries()) {
    const ns = await lab.addHost(`b${i + 1}`, { address: `${address}/24` });
    const p = lab.spawn(ns, process.execPath, [distPath('lab', 'bin', 'proxy-protocol-backend.js'), '--id', `b${i + 1}`, '--tcp', '8080:1', '--tcp', '8081:2', '--udp', '5353:2']);
    let up = false;
    onJsonLines(p.stdout!, (o) => { if (o['event'] === 'listening') up = true; else seen.push(o as unknown as Seen); });
    await waitFor(`backend b${i + 1}`, () => up, 10_000);
  }
  const client = await lab.addHost('client', { address: `${CLIENT}/24` });
  const agent = await startAgent(lab, node, config(), { logLevel: 'info' });
  const st = await waitStatus(agent, 'three services ready, both backends healthy', (s) => s.services.length === 3 && s.services.every((x) => x.ready && x.healthyBackends === 2), 30_000);
  t.equal(st.dataplane?.kind, 'proxy', 'dataplane auto runs the proxy');
  t.match(st.dataplane?.reason, /auto: default\/web1, default\/web2, default\/web3 ask for the PROXY protocol, which only the userspace proxy sends/, 'and says why');

  const r = await lab.exec(client, process.execPath, ['-e', CLIENT_SCRIPT, JSON.stringify({ tcp: [80, 80, 80, 80, 81, 81, 81, 81], udp: [53, 53] })], { timeoutMs: 60_000 });
  const replies = JSON.parse(r.stdout) as Reply[];
  t.equal(replies.length, 10);
  const served = new Set<string>();
  for (const rep of replies) {
    const v = rep.port === 80 ? 1 : 2;
    const what = `${rep.port === 53 ? 'UDP' : 'TCP'} ${VIP}:${rep.port} (v${v})`;
    if (!rep.body) { t.fail(`${what}: no answer (${rep.error ?? rep.raw})`); continue; }
    served.add(`${rep.port}/${rep.body.id}`);
    t.notOk(rep.body.error, `${what}: the header parsed`);
    t.same(
      [rep.body.header?.version, rep.body.header?.command, rep.body.header?.transport],
      [v, 'PROXY', rep.port === 53 ? 'udp4' : v === 1 ? 'TCP4' : 'tcp4'], `${what}: version, command and transport`,
    );
    t.same(
      [rep.body.header?.source, rep.body.header?.sourcePort, rep.body.header?.destination, rep.body.header?.destinationPort],
      [CLIENT, rep.local, VIP, rep.port], `${what}: the client's address and port, the VIP's address and port`,
    );
    t.match(rep.body.peer, new RegExp(`^${NODE.replace(/\./g, '\\.')}:`), `${what}: the socket itself comes from the proxy`);
  }
  t.same([...served].filter((s) => s.startsWith('80/')).length, 2, 'v1 requests reached both backends');
  t.same([...served].filter((s) => s.startsWith('81/')).length, 2, 'v2 requests reached both backends');

  // Health checks, as the backends logged them (probes come from the node itself).
  const probes = seen.filter((s) => s.proto === 'tcp' && s.peer.startsWith(`${NODE}:`) && !s.request?.startsWith('GET / HTTP/1.0'));
  const v1Checks = probes.filter((s) => s.port === 8080);
  t.ok(v1Checks.length >= 2, `http checks on the v1 port (${v1Checks.length})`);
  t.ok(v1Checks.every((s) => !s.error && s.header?.transport === 'TCP4' && `${s.header.source}:${s.header.sourcePort}` === s.peer
    && s.header.destination === BACKENDS[Number(s.id.slice(1)) - 1] && s.header.destinationPort === 8080 && s.request === 'GET / HTTP/1.1'),
  'v1 checks: a valid TCP4 line naming the probe\'s own connection, then the GET');
  const v2Port = probes.filter((s) => s.port === 8081);
  const local = v2Port.filter((s) => s.header?.command === 'LOCAL');
  const bare = v2Port.filter((s) => s.error === 'no bytes');
  t.ok(local.length >= 2 && local.every((s) => s.header?.transport === 'unspec'), `tcp checks asked to send it: the v2 LOCAL command (${local.length})`);
  // web3's plain check is connect-only: SYN, SYN-ACK, RST (issue 18, as
  // HAProxy's), so the backend's application never accepts it, and it still
  // keeps both backends up (web3 healthy 2/2 in the status read above).
  t.equal(bare.length, 0, `the check not asked to send it never reaches the backend's application (${bare.length} bare connections)`);
  t.equal(st.services.find((x) => x.name === 'web3')?.healthyBackends, 2, 'and web3, whose check sends no header, has both backends up');
  t.same(v2Port.filter((s) => s.error && s.error !== 'no bytes'), [], 'no probe sent anything a strict receiver refuses');

  // validate refuses the header on the kernel path, naming the field.
  const kernelCfg = lab.file('kernel.yaml');
  fs.writeFileSync(kernelCfg, stringify({ ...config(), dataplane: 'kernel' }));
  const v = await agentCli(lab, node, ['validate', '--config', kernelCfg]);
  t.equal(v.code, 2, 'validate exits 2');
  t.match(v.stdout + v.stderr, /services\[0\]\.proxyProtocol: v1: the PROXY protocol header is sent by the userspace proxy only, and dataplane is kernel/);
});
