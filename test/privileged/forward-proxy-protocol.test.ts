// Issue 17 end to end: the real agent (dataplane auto) on the proxy path sends
// the PROXY protocol header, and a backend that requires it - parsing it
// strictly, byte for byte against the spec (lab/bin/proxy-protocol-backend.ts)
// - sees the client's real address and port with v1 and with v2, for TCP and
// (v2) UDP; health checks send the header when asked (a v1 line naming the
// probe's own connection with an http check, the v2 LOCAL command with a tcp
// check) and nothing when not; and validate refuses PROXY protocol on the
// kernel path. Every service is dual stack: the same holds for its IPv6 VIP
// (v1 TCP6, v2 with IPv6 addresses, TCP and UDP) and its IPv6 backends'
// checks. About 15 s.
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
const VIP6 = 'fd00:99::200';
const NODE6 = 'fd00:99::2';
const CLIENT6 = 'fd00:99::50';
const BACKENDS6 = ['fd00:99::11', 'fd00:99::12'];
/** The v2 receiver renders IPv6 as eight groups (lab/proxy-protocol.ts); these are the same addresses so written. */
const FULL6: Record<string, string> = {
  [VIP6]: 'fd00:99:0:0:0:0:0:200', [CLIENT6]: 'fd00:99:0:0:0:0:0:50', [NODE6]: 'fd00:99:0:0:0:0:0:2',
  [BACKENDS6[0]!]: 'fd00:99:0:0:0:0:0:11', [BACKENDS6[1]!]: 'fd00:99:0:0:0:0:0:12',
};

/** From the client: TCP requests (each reports its own local port and the backend's answer) and UDP datagrams. */
const CLIENT_SCRIPT = `
const net = require('net'); const dgram = require('dgram');
const plan = JSON.parse(process.argv[1]);
const host = plan.host; const v6 = host.includes(':');
const tcp = (port) => new Promise((resolve) => {
  const s = net.connect({ host, port });
  let data = ''; let local;
  s.on('connect', () => { local = s.localPort; s.write('GET / HTTP/1.0\\r\\n\\r\\n'); });
  s.on('data', (d) => { data += d; });
  s.on('end', () => { s.destroy(); const body = data.split('\\r\\n\\r\\n')[1]; resolve({ port, local, body: body ? JSON.parse(body) : undefined, raw: data.slice(0, 200) }); });
  s.on('error', (e) => resolve({ port, local, error: e.code }));
  setTimeout(() => { s.destroy(); resolve({ port, local, error: 'timeout' }); }, 5000);
});
const udp = (port) => new Promise((resolve) => {
  const s = dgram.createSocket(v6 ? 'udp6' : 'udp4');
  s.bind(0, () => {
    const local = s.address().port;
    const timer = setTimeout(() => { s.close(); resolve({ port, local, error: 'timeout' }); }, 3000);
    s.once('message', (m) => { clearTimeout(timer); s.close(); resolve({ port, local, body: JSON.parse(String(m)) }); });
    s.send('query', port, host);
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
    pools: { 'range-global': `${VIP}-${VIP},${VIP6}-${VIP6}` },
    arp: { probeWait: 0.05, probeNum: 1, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 1, announceInterval: 0.1 },
    services: [
      { name: 'web1', ipam: 'pool', ipFamilyPolicy: 'RequireDualStack', proxyProtocol: 'v1', ports: [{ port: 80, targetPort: 8080 }], backends: [...BACKENDS, ...BACKENDS6],
        healthCheck: { ...hc, type: 'http', port: 8080, proxyProtocol: true } },
      { name: 'web2', primaryService: 'web1', proxyProtocol: 'v2', ports: [{ port: 81, targetPort: 8081 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }], backends: [...BACKENDS, ...BACKENDS6],
        healthCheck: { ...hc, type: 'tcp', port: 8081, proxyProtocol: true } },
      // The check is unaffected unless asked: a plain TCP connect to the same strict port.
      { name: 'web3', primaryService: 'web1', proxyProtocol: 'v2', ports: [{ port: 82, targetPort: 8081 }], backends: [...BACKENDS, ...BACKENDS6],
        healthCheck: { ...hc, type: 'tcp', port: 8081 } },
    ],
  };
}

t.test('PROXY protocol v1 and v2: the backend sees the client; checks send the header only when asked', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: `${NODE}/24`, ipv6: [`${NODE6}/64`] });
  const seen: Seen[] = [];
  for (const [i, address] of BACKENDS.entries()) {
    const ns = await lab.addHost(`b${i + 1}`, { address: `${address}/24`, ipv6: [`${BACKENDS6[i]!}/64`] });
    const p = lab.spawn(ns, process.execPath, [distPath('lab', 'bin', 'proxy-protocol-backend.js'), '--id', `b${i + 1}`, '--tcp', '8080:1', '--tcp', '8081:2', '--udp', '5353:2']);
    let up = false;
    onJsonLines(p.stdout!, (o) => { if (o['event'] === 'listening') up = true; else seen.push(o as unknown as Seen); });
    await waitFor(`backend b${i + 1}`, () => up, 10_000);
  }
  const client = await lab.addHost('client', { address: `${CLIENT}/24`, ipv6: [`${CLIENT6}/64`] });
  const agent = await startAgent(lab, node, config(), { logLevel: 'info' });
  const st = await waitStatus(agent, 'three services in two families ready, both backends of each healthy', (s) => s.services.length === 6 && s.services.every((x) => x.ready && x.healthyBackends === 2), 30_000);
  t.same(st.services.map((x) => x.vip).sort(), [VIP, VIP, VIP, VIP6, VIP6, VIP6].sort(), 'each service holds both VIPs');
  t.equal(st.dataplane?.kind, 'proxy', 'dataplane auto runs the proxy');
  t.match(st.dataplane?.reason, /auto: default\/web1, default\/web1@IPv6, default\/web2 and 3 more ask for the PROXY protocol, which only the userspace proxy sends/, 'and says why');

  for (const [vip, from, node, six] of [[VIP, CLIENT, NODE, false], [VIP6, CLIENT6, NODE6, true]] as const) {
    const r = await lab.exec(client, process.execPath, ['-e', CLIENT_SCRIPT, JSON.stringify({ host: vip, tcp: [80, 80, 80, 80, 81, 81, 81, 81], udp: [53, 53] })], { timeoutMs: 60_000 });
    const replies = JSON.parse(r.stdout) as Reply[];
    t.equal(replies.length, 10);
    const served = new Set<string>();
    for (const rep of replies) {
      const v = rep.port === 80 ? 1 : 2;
      const what = `${rep.port === 53 ? 'UDP' : 'TCP'} ${six ? `[${vip}]` : vip}:${rep.port} (v${v})`;
      if (!rep.body) { t.fail(`${what}: no answer (${rep.error ?? rep.raw})`); continue; }
      served.add(`${rep.port}/${rep.body.id}`);
      t.notOk(rep.body.error, `${what}: the header parsed`);
      const transport = rep.port === 53 ? 'udp' : v === 1 ? 'TCP' : 'tcp';
      t.same(
        [rep.body.header?.version, rep.body.header?.command, rep.body.header?.transport],
        [v, 'PROXY', `${transport}${six ? 6 : 4}`], `${what}: version, command and transport`,
      );
      // v1 carries the agent's canonical text (RFC 5952 for IPv6); the v2 receiver renders the 16 bytes in full.
      const text = (a: string): string => (six && v === 2 ? FULL6[a]! : a);
      t.same(
        [rep.body.header?.source, rep.body.header?.sourcePort, rep.body.header?.destination, rep.body.header?.destinationPort],
        [text(from), rep.local, text(vip), rep.port], `${what}: the client's address and port, the VIP's address and port`,
      );
      // The proxy's own connection: from the node's address, never the VIP (an IPv6 VIP is deprecated: RFC 6724 rule 3).
      t.ok(rep.body.peer.startsWith(`${node}:`), `${what}: the socket itself comes from the node's address (${rep.body.peer})`);
    }
    t.same([...served].filter((s) => s.startsWith('80/')).length, 2, `${vip}: v1 requests reached both backends`);
    t.same([...served].filter((s) => s.startsWith('81/')).length, 2, `${vip}: v2 requests reached both backends`);
  }

  // Health checks, as the backends logged them (probes come from the node itself).
  const probes = seen.filter((s) => s.proto === 'tcp' && (s.peer.startsWith(`${NODE}:`) || s.peer.startsWith(`${NODE6}:`)) && !s.request?.startsWith('GET / HTTP/1.0'));
  const v1Checks = probes.filter((s) => s.port === 8080);
  for (const [six, backends, transport] of [[false, BACKENDS, 'TCP4'], [true, BACKENDS6, 'TCP6']] as const) {
    const checks = v1Checks.filter((s) => s.peer.startsWith(`${six ? NODE6 : NODE}:`));
    t.ok(checks.length >= 2, `http checks on the v1 port of the ${six ? 'IPv6' : 'IPv4'} backends (${checks.length})`);
    t.ok(checks.every((s) => !s.error && s.header?.transport === transport && `${s.header.source}:${s.header.sourcePort}` === s.peer
      && s.header.destination === backends[Number(s.id.slice(1)) - 1] && s.header.destinationPort === 8080 && s.request === 'GET / HTTP/1.1'),
    `v1 checks: a valid ${transport} line naming the probe's own connection, then the GET`);
  }
  const v2Port = probes.filter((s) => s.port === 8081);
  const local = v2Port.filter((s) => s.header?.command === 'LOCAL');
  const bare = v2Port.filter((s) => s.error === 'no bytes');
  t.ok(local.length >= 2 && local.every((s) => s.header?.transport === 'unspec'), `tcp checks asked to send it: the v2 LOCAL command (${local.length})`);
  // web3's plain check is connect-only: SYN, SYN-ACK, RST (issue 18, as
  // HAProxy's), so the backend's application never accepts it, and it still
  // keeps both backends up (web3 healthy 2/2 in the status read above).
  t.equal(bare.length, 0, `the check not asked to send it never reaches the backend's application (${bare.length} bare connections)`);
  t.same(st.services.filter((x) => x.name === 'web3').map((x) => x.healthyBackends), [2, 2], 'and web3, whose check sends no header, has both backends of each family up');
  t.same(v2Port.filter((s) => s.error && s.error !== 'no bytes'), [], 'no probe sent anything a strict receiver refuses');

  // validate refuses the header on the kernel path, naming the field.
  const kernelCfg = lab.file('kernel.yaml');
  fs.writeFileSync(kernelCfg, stringify({ ...config(), dataplane: 'kernel' }));
  const v = await agentCli(lab, node, ['validate', '--config', kernelCfg]);
  t.equal(v.code, 2, 'validate exits 2');
  t.match(v.stdout + v.stderr, /services\[0\]\.proxyProtocol: v1: the PROXY protocol header is sent by the userspace proxy only, and dataplane is kernel/);
});
