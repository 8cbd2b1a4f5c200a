// Privileged: direct server return on the kernel path (issue 17), end to end
// with the real agent. A client, "the VM" running `lb-agent run` with a pool
// VIP and a DHCP VIP (on its macvlan) in sourceIP: preserve and a pool VIP in
// snat, three peer-echo backends that report who they saw. Backend b1 gets
// its VIPs from the agent's `backend:` section (a second `lb-agent run`
// there); b2 and b3 are set up by hand exactly as the README says. Then:
// the backends see the client's address and port through both DSR VIPs and
// the VIP in snat mode; 1,000 connections spread by weight with nothing in
// the VM's conntrack; a backend's death takes it out within the health
// thresholds and moves no flow between the others; a crash-only restart
// adopts the tables untouched.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { distPath, startDnsmasq, httpGetFrom } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import { JsonLinesProc } from '../../lab/forward';

const CLIENT = '10.99.0.3';
const DSR_POOL = '10.99.0.200';
const SNAT_POOL = '10.99.0.201';
const DSR_DHCP = '10.99.0.120';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'] as const;
const IDS = ['b1', 'b2', 'b3'] as const;
const WEIGHTS = { b1: 1, b2: 1, b3: 2 } as const;
const FAST_ARP = { probeWait: 0.05, probeNum: 1, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 1, announceInterval: 0.1 };
/** Down after failureThreshold x (period + timeout) = 0.8 s at most. */
const HC = { periodSeconds: 0.2, timeoutSeconds: 0.2, failureThreshold: 2 };

interface Burst { counts: Record<string, number>; errors: Record<string, number>; peerIsClient: number }

if (requirePrivileged(t)) {
  t.test('direct server return', async (t) => {
    const t0 = Date.now();
    const lab = await createLab(t);
    const dhcpNs = await lab.addHost('dhcp', { address: '10.99.0.1/24' });
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const client = await lab.addHost('client', { address: `${CLIENT}/24` });
    const backendNs: string[] = [];
    for (let i = 0; i < BACKENDS.length; i++) backendNs.push(await lab.addHost(IDS[i]!, { address: `${BACKENDS[i]}/24` }));
    t.comment(`lab ${Date.now() - t0} ms`);
    await startDnsmasq(lab, dhcpNs, { range: '10.99.0.100,10.99.0.150', noPing: true });
    const echo = backendNs.map((ns, i) => {
      const p = lab.spawn(ns, process.execPath, [distPath('lab', 'bin', 'peer-echo.js'), '--id', IDS[i]!, '--port', '80']);
      let o = '';
      p.stdout?.on('data', (d: Buffer) => { o += d.toString(); });
      return { p, up: () => o.includes('listening') };
    });
    await waitFor('echo backends', () => echo.every((e) => e.up()), 10_000);
    t.comment(`backends ${Date.now() - t0} ms`);

    // b2, b3: the backend side by hand, as the README tells an operator without lb-agent there.
    for (const ns of backendNs.slice(1)) {
      await lab.sh(ns, `ip addr add ${DSR_POOL}/32 dev lo && ip addr add ${DSR_DHCP}/32 dev lo && sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2`);
    }
    // Connection tracking stays whole at both ends although the replies skip
    // the VM: b2 and the client drop every packet their conntrack calls
    // invalid (a reply to a connection it never saw open would be one).
    const strict = 'table ip strict {\n\tchain in {\n\t\ttype filter hook input priority 0; policy accept;\n\t\tct state invalid counter drop\n\t}\n}\n';
    for (const ns of [backendNs[1]!, client]) await lab.exec(ns, 'nft', ['-f', '-'], { input: strict });
    // b1: lb-agent's `backend:` section does it.
    const b1Agent = await startAgent(lab, backendNs[0]!, {
      node: { interface: 'eth0' }, metrics: { listen: '' }, dataplane: 'proxy', backend: { vips: [DSR_POOL, DSR_DHCP] }, services: [],
    }, { name: 'b1agent' });

    t.comment(`b1 agent ${Date.now() - t0} ms`);
    const service = (name: string, extra: Record<string, unknown>) => ({
      name, ports: [{ port: 80 }], healthCheck: HC,
      backends: BACKENDS.map((address, i) => ({ address, weight: WEIGHTS[IDS[i]!] })), ...extra,
    });
    const cfg = {
      node: { interface: 'eth0' }, metrics: { listen: '127.0.0.1:9477' }, dataplane: 'kernel',
      pools: { 'range-global': '10.99.0.200-10.99.0.209' }, arp: FAST_ARP,
      dhcp: { retransmitInitial: 0.5, retransmitMax: 2, retransmitJitter: 0, probeOffer: false },
      services: [
        service('web-dsr', { ipam: 'pool', loadBalancerIP: DSR_POOL, sourceIP: 'preserve' }),
        service('dhcp-dsr', { ipam: 'dhcp', loadBalancerIP: DSR_DHCP, sourceIP: 'preserve' }),
        { ...service('web-snat', { ipam: 'pool', loadBalancerIP: SNAT_POOL }), ports: [{ port: 8000, targetPort: 80 }] },
      ],
    };
    let agent = await startAgent(lab, node, cfg, { name: 'node' });
    t.comment(`node agent started ${Date.now() - t0} ms`);
    await waitStatus(agent, 'three services serving, every backend healthy', (s) => s.services.length === 3 && s.services.every((x) => x.ready && x.healthyBackends === 3), 30_000);
    const cl = await JsonLinesProc.start(lab, client, 'peer-client.js', [], 'peer-client');
    t.teardown(() => cl.close());
    t.comment(`lab and agents up in ${Date.now() - t0} ms`);

    await t.test('the backend side: b1\'s agent put the VIPs on lo, marked, with the ARP sysctls', async (t) => {
      const st = await b1Agent.status();
      t.same(st.backend?.vips.map((v) => [v.address, v.interface, v.state, v.owned]), [[DSR_POOL, 'lo', 'on-lo', true], [DSR_DHCP, 'lo', 'on-lo', true]]);
      t.same(st.backend?.sysctls, { arp_ignore: 1, arp_announce: 2 });
      const lo = (await lab.sh(backendNs[0]!, 'ip -4 -o addr show dev lo')).stdout;
      t.match(lo, new RegExp(`inet ${DSR_POOL.replace(/\./g, '\\.')}/32 `), 'on lo, as a /32');
      const sys = (await lab.sh(backendNs[0]!, 'cat /proc/sys/net/ipv4/conf/all/arp_ignore /proc/sys/net/ipv4/conf/all/arp_announce')).stdout.replace(/\s+/g, ' ').trim();
      t.equal(sys, '1 2');
    });

    await t.test('the backend sees the client\'s own address and port through both DSR VIPs, and the VIP through the snat one', async (t) => {
      for (const [vip, port] of [[DSR_POOL, 30001], [DSR_DHCP, 30002]] as const) {
        const a = await cl.request<{ backend: string; peer: string; local: string }>({ cmd: 'ask', host: vip, port: 80, localPort: port });
        t.equal(a.peer, `${CLIENT}:${port}`, `${vip}: ${a.backend} saw ${a.peer}`);
      }
      const s = await cl.request<{ backend: string; peer: string }>({ cmd: 'ask', host: SNAT_POOL, port: 8000, localPort: 30003 });
      t.match(s.peer, new RegExp(`^${SNAT_POOL.replace(/\./g, '\\.')}:\\d+$`), `snat: ${s.backend} saw the VIP (${s.peer}), as before`);
      // Replies came from the backends, not through the VM: the frames to the DHCP VIP went to its macvlan's MAC.
      const st = await agent.status();
      const dhcp = st.services.find((x) => x.name === 'dhcp-dsr')!;
      t.match(dhcp.interface, /^lbv/, `the DHCP VIP lives on its macvlan ${dhcp.interface}`);
      t.equal(dhcp.sourceIP, 'preserve');
    });

    await t.test('1,000 connections spread over the healthy backends by weight; none enters the VM\'s conntrack', async (t) => {
      const ctBefore = (await lab.sh(node, `grep -c 'dst=${DSR_POOL} ' /proc/net/nf_conntrack || true`)).stdout.trim();
      const n = 1000;
      const r = await cl.request<Burst>({ cmd: 'burst', host: DSR_POOL, port: 80, n, fromPort: 31000, concurrency: 16 }, 120_000);
      t.same(r.errors, {}, 'no connection failed');
      t.equal(r.peerIsClient, n, 'every backend saw the client\'s own address and port');
      const total = Object.values(WEIGHTS).reduce((a, b) => a + b, 0);
      for (const id of IDS) {
        const want = (n * WEIGHTS[id]) / total;
        // The kernel hashes address and port into 1021 slots held by weight: the
        // spread is a hash's, not a round robin's (binomial sd ~14 at 250).
        t.ok(Math.abs((r.counts[id] ?? 0) - want) <= want * 0.2, `${id} (weight ${WEIGHTS[id]}) got ${r.counts[id]} of ${n}, expected ${want} +-20%`);
      }
      const ctAfter = (await lab.sh(node, `grep -c 'dst=${DSR_POOL} ' /proc/net/nf_conntrack || true`)).stdout.trim();
      t.same([ctBefore, ctAfter], ['0', '0'], 'no conntrack entry for the DSR VIP on the VM: frames are stolen at ingress');
      for (const ns of [backendNs[1]!, client]) {
        const dropped = /counter packets (\d+)/.exec((await lab.exec(ns, 'nft', ['list', 'table', 'ip', 'strict'])).stdout)?.[1];
        t.equal(dropped, '0', `${ns === client ? 'the client' : 'b2'}: conntrack found no packet invalid`);
      }
      const metrics = (await httpGetFrom(lab, node, 'http://127.0.0.1:9477/metrics')).body;
      const conns = IDS.map((_, i) => Number(new RegExp(`lbagent_forward_connections_total\\{service="web-dsr",namespace="default",backend="${BACKENDS[i]!.replace(/\./g, '\\.')}",port="tcp-80"\\} (\\d+)`).exec(metrics)?.[1] ?? -1));
      t.ok(conns.every((c) => c >= 0), `connections counted per backend (SYNs): ${conns.join(', ')}`);
      t.match(metrics, /lbagent_service_topology_info\{service="web-dsr",namespace="default",policy="any",set="all",reason="policy-any"\} 1/);
    });

    await t.test('a backend\'s death takes it out within the health thresholds; flows on the others stay put', async (t) => {
      const held = await cl.request<{ backends: string[] }>({ cmd: 'holdOpen', host: DSR_POOL, port: 80, n: 40, fromPort: 33000 });
      t.ok(new Set(held.backends).size === 3, `40 long-lived connections on all three (${held.backends.join(',')})`);
      const died = Date.now();
      echo[2]!.p.kill('SIGKILL');
      await waitStatus(agent, 'b3 down', (s) => s.services.find((x) => x.name === 'web-dsr')!.healthyBackends === 2, 10_000);
      const down = Date.now() - died;
      // Out of the data path once the table without it is committed (status says down a moment before).
      const applied = await agent.waitLog('the table rewritten without b3', (l) => l.op === 'apply' && Date.parse(String(l.time)) >= died + down - 50, 10_000);
      const took = Date.parse(String(applied.time)) - died;
      t.ok(took < 3000, `b3 down after ${down} ms, out of the kernel table after ${took} ms (thresholds: 2 x (0.2 + 0.2) s; slow machine allowance)`);
      const again = await cl.request<{ backends: string[] }>({ cmd: 'holdAsk' });
      held.backends.forEach((b, i) => {
        if (b !== 'b3') t.equal(again.backends[i], b, `connection ${i} stays on ${b}`);
      });
      const after = await cl.request<Burst>({ cmd: 'burst', host: DSR_POOL, port: 80, n: 300, fromPort: 34000, concurrency: 8 }, 60_000);
      t.same(after.errors, {}, 'no new connection fails');
      t.equal(after.counts['b3'], undefined, 'none reaches the dead backend');
      t.ok((after.counts['b1'] ?? 0) > 0 && (after.counts['b2'] ?? 0) > 0, `b1 and b2 take them (${JSON.stringify(after.counts)})`);
      await cl.request({ cmd: 'holdClose' });
    });

    await t.test('a crash-only restart adopts both tables untouched', async (t) => {
      agent.signal('SIGKILL');
      await agent.exited;
      const mid = await cl.request<{ peer: string }>({ cmd: 'ask', host: DSR_POOL, port: 80, localPort: 35000 });
      t.equal(mid.peer, `${CLIENT}:35000`, 'served with no agent running');
      agent = await startAgent(lab, node, cfg, { name: 'node', stateDir: agent.stateDir });
      await agent.waitLog('start check', (l) => l.op === 'start-check');
      t.ok(agent.logs.some((l) => l.op === 'start-check' && l.result === 'matched'), `start check: ${JSON.stringify(agent.logs.find((l) => l.op === 'start-check'))}`);
      const a = await cl.request<{ peer: string }>({ cmd: 'ask', host: DSR_DHCP, port: 80, localPort: 35001 });
      t.equal(a.peer, `${CLIENT}:35001`);
    });
    await t.test('a node that cannot do DSR refuses to start with a service that asks for it', async (t) => {
      // No nft on PATH (only ip, which runs the namespace): dataplane auto falls
      // back to the proxy, which cannot keep the clients' addresses.
      const bin = lab.file('bin-without-nft');
      fs.mkdirSync(bin);
      const ip = (process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').map((d) => path.join(d, 'ip')).find((p) => fs.existsSync(p));
      if (ip === undefined) throw new Error('ip not found on PATH');
      fs.symlinkSync(ip, path.join(bin, 'ip'));
      const refused = await startAgent(lab, node, { ...cfg, metrics: { listen: '' }, dataplane: 'auto' }, { name: 'nodsr', waitReady: false, env: { PATH: bin } });
      const exit = await refused.exited;
      t.equal(exit.code, 1, 'exits with a runtime failure');
      t.ok(refused.logs.some((l) => l.code === 'LB_ERR_FORWARD_DSR_UNSUPPORTED'), 'with LB_ERR_FORWARD_DSR_UNSUPPORTED');
      t.match(refused.stderr(), /sourceIP: preserve \(direct server return\) needs the kernel data path.*set sourceIP: snat on them/, `and says why: ${refused.stderr().trim()}`);
    });
    t.comment(`whole test ${Date.now() - t0} ms`);
  });
}
