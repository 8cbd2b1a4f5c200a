// Privileged: IPv6 pool VIPs served end to end by the real agent on the
// kernel path, with the real kernel's neighbour discovery on a bridged LAN.
// Another host holds the pool's first IPv6 address: duplicate address
// detection skips it and status says so. An IPv6-only service serves a
// client's 20 ms loop with no failure once serving; the client's neighbour
// entry for the VIP is the agent's MAC, and after another host forges an
// advertisement for the VIP, the agent's defence puts it back. The agent
// hears neighbour discovery on a raw ICMPv6 socket and holds no packet
// socket that sees every IPv6 frame of the parent. A
// RequireDualStack service serves both VIPs, each to the backend of its own
// family. PreferDualStack in a namespace without an IPv6 pool serves IPv4
// and status says why. A SIGKILL and a new start adopt the IPv6 VIP and its
// table with no failed request; `lb-agent check` names IPv6 disabled on the
// parent with the fix. The VIP's solicited-node group on the parent is the
// kernel's join only, before and after the drift guard puts back a removed VIP.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { distPath, httpGetFrom, startBackend } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import { ClientLoop, gapReport } from '../../lab/client-loop';
import { parseAddress } from '../../agent/address';
import { solicitedNodeAddress } from '../../agent/net/neighbour/ndp';

const TAKEN = 'fd00:99::200';
const POOL6 = 'fd00:99::200-fd00:99::20f';
const POOL4 = '10.99.0.200-10.99.0.209';

async function macOf(lab: Lab, ns: string): Promise<string> {
  const r = await lab.exec(ns, 'ip', ['-j', 'link', 'show', 'eth0']);
  return (JSON.parse(r.stdout) as { address: string }[])[0]!.address;
}

/** The link-layer address of the client's neighbour entry for `ip`, undefined when there is none (or it is unresolved). */
async function neighbourMac(lab: Lab, ns: string, ip: string): Promise<string | undefined> {
  const r = await lab.exec(ns, 'ip', ['-j', '-6', 'neigh', 'show', ip, 'dev', 'eth0'], { allowFail: true });
  const entries = JSON.parse(r.stdout || '[]') as { lladdr?: string }[];
  return entries[0]?.lladdr;
}

/** The client loop's per-request timeout. */
const LOOP_TIMEOUT_MS = 500;

/**
 * Send one unsolicited advertisement with override for `target`, claiming it
 * for this host's MAC: a forgery of the VIP. Returns when it was sent, by
 * the sending process's clock (the process starts hundreds of ms after the
 * call on a loaded machine).
 */
async function forgeAdvertisement(lab: Lab, ns: string, mac: string, target: string): Promise<number> {
  const script = `
    const { openPacketSocket, interfaceIndex } = require(${JSON.stringify(distPath('agent', 'net', 'packet', 'packet.js'))});
    const { encodeNdp, ndpUnsolicitedAdvertisement } = require(${JSON.stringify(distPath('agent', 'net', 'neighbour', 'ndp.js'))});
    const { parseAddress } = require(${JSON.stringify(distPath('agent', 'address.js'))});
    const sock = openPacketSocket({ ifindex: interfaceIndex('eth0'), protocol: 0x86dd, ref: false });
    sock.send(encodeNdp(ndpUnsolicitedAdvertisement(${JSON.stringify(mac)}, parseAddress(${JSON.stringify(target)}).value)));
    process.stdout.write(String(Date.now()));
    sock.close();
  `;
  const sentAt = Number((await lab.exec(ns, process.execPath, ['-e', script])).stdout.trim());
  if (!Number.isFinite(sentAt) || sentAt <= 0) throw new Error(`the forger printed no send time`);
  return sentAt;
}

if (requirePrivileged(t)) {
  t.test('IPv6 pool VIPs: DAD skips a taken address, the kernel path serves, the neighbour entry is defended; dual stack', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24', ipv6: ['fd00:99::2/64'] });
    // The host that already holds the pool's first IPv6 address (configured, as any host's own address).
    const other = await lab.addHost('other', { address: '10.99.0.3/24', ipv6: [`${TAKEN}/64`] });
    const b4 = await lab.addHost('b4', { address: '10.99.0.11/24' });
    const b6 = await lab.addHost('b6', { address: '10.99.0.12/24', ipv6: ['fd00:99::12/64'] });
    const client = await lab.addHost('client', { address: '10.99.0.50/24', ipv6: ['fd00:99::50/64'] });
    await Promise.all([startBackend(lab, b4, 'b4', [8080]), startBackend(lab, b6, 'b6', [8080], '::')]);
    const agentMac = await macOf(lab, node);
    const otherMac = await macOf(lab, other);

    const hc = { periodSeconds: 0.5, timeoutSeconds: 0.4 };
    const port = (p: number): Record<string, unknown>[] => [{ port: p, targetPort: 8080 }];
    const cfg = {
      node: { interface: 'eth0' },
      metrics: { listen: '' },
      dataplane: 'kernel',
      // IPv4 for every namespace; IPv6 for the default namespace only.
      pools: { 'range-global': POOL4, 'range-default': POOL6 },
      arp: { probeWait: 0.1, probeNum: 1, probeMin: 0.2, probeMax: 0.3, announceWait: 0.2, announceNum: 2, announceInterval: 0.2 },
      services: [
        { name: 'web6', ipFamilies: ['IPv6'], ports: port(80), backends: ['fd00:99::12'], healthCheck: hc },
        { name: 'dual', ipFamilyPolicy: 'RequireDualStack', ports: port(81), backends: ['10.99.0.11', 'fd00:99::12'], healthCheck: hc },
        { name: 'legacy', namespace: 'legacy', ipFamilyPolicy: 'PreferDualStack', ports: port(82), backends: ['10.99.0.11'], healthCheck: hc },
      ],
    };
    const agent = await startAgent(lab, node, cfg, { name: 'v6' });

    const keys = ['default/web6@IPv6', 'default/dual', 'default/dual@IPv6', 'legacy/legacy'];
    const st = await waitStatus(agent, 'every family service serving', (s) => keys.every((k) => s.services.find((x) => x.key === k)?.ready), 30_000);
    const by = new Map(st.services.map((s) => [s.key, s]));
    t.same(st.services.map((s) => s.key).sort(), [...keys].sort(), 'one entry per family service, nothing else');

    // DAD: the address another host holds is skipped, and why is recorded.
    const vip6 = by.get('default/web6@IPv6')!.vip!;
    const dual6 = by.get('default/dual@IPv6')!.vip!;
    t.notOk([vip6, dual6].includes(TAKEN), `${TAKEN}, held by another host, is handed to nobody (${vip6}, ${dual6})`);
    t.ok([vip6, dual6].every((v) => /^fd00:99::20[1-9a-f]$/.test(v)), 'both IPv6 VIPs come from the IPv6 pool');
    const skipped = agent.logs.find((l) => l.op === 'dad' && l.address === TAKEN);
    t.match(skipped, { mac: otherMac, reason: 'advertised' }, 'the skip is logged with the holder\'s MAC and why');
    t.ok(agent.logs.some((l) => l.op === 'conflict' && l.address === TAKEN), 'and the address is held back as a conflict');
    t.match(by.get('default/web6@IPv6'), { family: 'IPv6', mac: agentMac, state: 'serving' });
    t.equal(by.get('default/dual')!.family, 'IPv4');
    t.match(by.get('default/dual')!.vip, /^10\.99\.0\.20\d$/);
    const addrs = (await lab.exec(node, 'ip', ['-6', 'addr', 'show', 'dev', 'eth0'])).stdout;
    t.match(addrs, new RegExp(`inet6 ${vip6}/128 scope global nodad`), 'the VIP is on the parent as a /128, without the kernel\'s DAD');

    // Neighbour discovery without a tap on the parent's IPv6 traffic: no
    // packet socket of ETH_P_IPV6 or ETH_P_ALL on the parent (or on every
    // interface), and the raw ICMPv6 socket that hears NDP instead.
    const parentIndex = Number((await lab.exec(node, 'cat', ['/sys/class/net/eth0/ifindex'])).stdout.trim());
    const packets = (await lab.exec(node, 'cat', ['/proc/net/packet'])).stdout.trim().split('\n').slice(1).map((l) => l.trim().split(/\s+/));
    t.ok(packets.length > 0, `the agent holds packet sockets (${packets.length})`);
    const taps = packets.filter((f) => ['86dd', '3'].includes(f[3]!.replace(/^0+(?=.)/, '')) && [0, parentIndex].includes(Number(f[4])));
    t.same(taps.map((f) => `proto ${f[3]} iface ${f[4]}`), [], 'no packet socket sees every IPv6 frame of the parent');
    const raw6 = (await lab.exec(node, 'cat', ['/proc/net/raw6'])).stdout.trim().split('\n').slice(1);
    t.ok(raw6.some((l) => /^\s*\d+: 0{32}:003A /.test(l)), 'a raw ICMPv6 socket hears neighbour discovery');

    // PreferDualStack without an IPv6 pool: IPv4, and why not IPv6.
    t.match(by.get('legacy/legacy'), { family: 'IPv4', familyNotes: [/IPv6 not served \(PreferDualStack\): no pool lists IPv6 addresses for namespace legacy/] });
    const text = (await lab.exec(node, process.execPath, [distPath('bundle', 'lb-agent.js'), 'status', '--socket', agent.socket], { allowFail: true })).stdout;
    t.match(text, /SERVICE\s+IPAM\s+VIP\s+FAMILY/, 'the status table has the family column');
    t.match(text, /default\/web6@IPv6\s+pool\s+fd00:99::20\S+\s+IPv6/, 'each VIP with its family');

    // Dual stack: each VIP to the backend of its own family.
    const v4 = await httpGetFrom(lab, client, `http://${by.get('default/dual')!.vip!}:81/`);
    const v6 = await httpGetFrom(lab, client, `http://[${dual6}]:81/`);
    t.match(v4, { ok: true, body: 'b4\n' }, 'the IPv4 VIP forwards to the IPv4 backend');
    t.match(v6, { ok: true, body: 'b6\n' }, 'the IPv6 VIP forwards to the IPv6 backend');
    const legacy = await httpGetFrom(lab, client, `http://${by.get('legacy/legacy')!.vip!}:82/`);
    t.match(legacy, { ok: true, body: 'b4\n' });

    // A client on the LAN through the kernel path: a request every 20 ms.
    const loop = await ClientLoop.start(lab, client, `http://[${vip6}]:80/`, { intervalMs: 20, timeoutMs: LOOP_TIMEOUT_MS });
    t.teardown(() => loop.stop());
    const servedAt = Date.now();
    await new Promise((r) => setTimeout(r, 1500));
    t.equal(await neighbourMac(lab, client, vip6), agentMac, 'the client\'s neighbour entry for the VIP is the agent\'s MAC');

    // Another host forges an advertisement for the VIP: the agent answers it.
    const forgedAt = await forgeAdvertisement(lab, other, otherMac, vip6);
    const back = await waitFor('the client\'s neighbour entry back at the agent\'s MAC', async () => {
      const defended = agent.logs.some((l) => l.op === 'defend' && l.conflictingMac === otherMac);
      const mac = await neighbourMac(lab, client, vip6);
      return defended && mac === agentMac ? mac : undefined;
    }, 5000, 20);
    t.equal(back, agentMac, 'defended: the client\'s entry names the agent again');
    await new Promise((r) => setTimeout(r, 1500));
    const results = await loop.stop();
    // A request started less than its timeout before the forgery was sent can
    // still be caught by it: it is judged with the requests after.
    const caughtFrom = forgedAt - LOOP_TIMEOUT_MS;
    const serving = gapReport(results.filter((r) => r.t >= servedAt && r.t < caughtFrom), servedAt, ['b6']);
    t.ok(serving.count >= 50, `the loop ran (${serving.count} requests before the forgery)`);
    t.equal(serving.failures.length, 0, 'no failed request once serving');
    // A request sent between the forged advertisement reaching the client and
    // the defence reaching it goes to the forger: at most that one, in the
    // moment after the forgery; none later.
    const across = gapReport(results.filter((r) => r.t >= caughtFrom), caughtFrom, ['b6']);
    t.ok(across.count >= 50, `the loop ran on (${across.count} requests after the forgery)`);
    t.ok(across.failures.every((f) => f.t - forgedAt < 100) && across.failures.length <= 1,
      `after the forgery at most one failed request, in the defence's first 100 ms (${across.failures.map((f) => `${f.t - forgedAt} ms after: ${f.error ?? ''}`).join('; ') || 'none'})`);
    t.equal(serving.wrongBodies.length + across.wrongBodies.length, 0, 'every answer from the IPv6 backend');
    const now = await agent.status();
    t.match(now.services.find((s) => s.key === 'default/web6@IPv6'), { vip: vip6, state: 'serving', source: { defences: 1 } }, 'the VIP kept, one defence counted');

    // The VIP's solicited-node group on the parent: the kernel's join for the address, and none of the agent's
    // socket on top (the group limit counts only VIPs not on the parent). Someone removes the address: the
    // drift guard puts it back, and the group is back at the kernel's one join.
    const groupUsers = async (): Promise<number | undefined> => {
      const hex = solicitedNodeAddress(parseAddress(vip6)!.value).toString(16).padStart(32, '0');
      const line = (await lab.exec(node, 'cat', ['/proc/net/igmp6'])).stdout.split('\n').map((l) => l.trim().split(/\s+/)).find((f) => f[1] === 'eth0' && f[2] === hex);
      return line === undefined ? undefined : Number(line[3]);
    };
    t.equal(await groupUsers(), 1, "the VIP's solicited-node group: one join on eth0 (the kernel's), none of the agent's socket");
    const delAt = Date.now();
    await lab.exec(node, 'ip', ['-6', 'addr', 'del', `${vip6}/128`, 'dev', 'eth0']);
    const readded = await waitFor('a drift-repaired event for the IPv6 VIP', async () => (await agent.status()).events
      .find((e) => e.kind === 'drift-repaired' && Date.parse(e.at) >= delAt - 5 && e.reason.includes(`added ${vip6}/128 to eth0 again`)), 10_000);
    t.ok(readded, readded.reason);
    // Read at once after the repair event, one run found another count: the owner's join and the kernel's
    // may overlap for a moment (a repair run again on the same removal joins while it adds, for one). The
    // count must come back to the kernel's one join.
    const settled = await waitFor('one join of the group again', async () => ((await groupUsers()) === 1 ? 1 : undefined), 3000, 20).catch(async () => groupUsers());
    t.equal(settled, 1, 'repaired: one join again, the agent\'s own left with the address back');
    await waitFor('the IPv6 VIP answers after the repair', async () => (await httpGetFrom(lab, client, `http://[${vip6}]:80/`)).ok, 10_000);

    // IPv6 forwarding turned off by someone else: put back by the drift guard, and the IPv6 VIP serves again.
    const offAt = Date.now();
    await lab.exec(node, 'sysctl', ['-qw', 'net.ipv6.conf.all.forwarding=0']);
    const fixed = await waitFor('a drift-repaired event for IPv6 forwarding', async () => (await agent.status()).events
      .find((e) => e.kind === 'drift-repaired' && Date.parse(e.at) >= offAt - 5 && /net\.ipv6\.conf\.all\.forwarding is 0/.test(e.reason)), 10_000);
    t.match(fixed.reason, /set net\.ipv6\.conf\.all\.forwarding=1/, fixed.reason);
    t.equal((await lab.exec(node, 'sysctl', ['-n', 'net.ipv6.conf.all.forwarding'])).stdout.trim(), '1', 'IPv6 forwarding is on again');
    await waitFor('the IPv6 VIP answers again', async () => (await httpGetFrom(lab, client, `http://[${vip6}]:80/`)).ok, 10_000);

    // Crash-only restart: the IPv6 VIP is adopted (no DAD of an address that never left) and the client sees nothing.
    const loop2 = await ClientLoop.start(lab, client, `http://[${vip6}]:80/`, { intervalMs: 20, timeoutMs: 500 });
    t.teardown(() => loop2.stop());
    const killedAt = Date.now();
    agent.signal('SIGKILL');
    await agent.exited;
    const second = await startAgent(lab, node, cfg, { name: 'v6', stateDir: agent.stateDir });
    const st2 = await waitStatus(second, 'the IPv6 VIP adopted and serving', (x) => x.services.find((y) => y.key === 'default/web6@IPv6')?.ready === true, 20_000);
    t.match(st2.services.find((y) => y.key === 'default/web6@IPv6'), { vip: vip6, adopted: true }, 'the same IPv6 VIP, adopted');
    t.notOk(second.logs.some((l) => l.op === 'dad' && l.address === vip6), 'no DAD of the held address');
    t.ok(second.logs.some((l) => l.msg === 'nftables table lb_agent already matches the desired state; adopted as is'), 'both tables adopted as they were');
    await new Promise((r) => setTimeout(r, 1000));
    const restart = gapReport((await loop2.stop()).filter((r) => r.t >= killedAt), killedAt, ['b6']);
    t.ok(restart.count >= 50, `the loop ran across the restart (${restart.count} requests)`);
    t.equal(restart.failures.length, 0, 'no failed request across SIGKILL and start');

    second.signal('SIGTERM');
    await second.exited;
    t.notMatch((await lab.exec(node, 'ip', ['-6', 'addr', 'show', 'dev', 'eth0'])).stdout, /fd00:99::20/, 'a stop withdraws the IPv6 VIPs');
    t.equal((await lab.exec(node, 'nft', ['list', 'tables'])).stdout.includes('ip6 lb_agent'), false, 'and the IPv6 table');

    // `lb-agent check` on a VM whose parent has IPv6 disabled: the IPv6 VIPs cannot be served, and the fix.
    const check = async (): Promise<{ id: string; status: string; detail: string; remedy?: string } | undefined> => {
      const r = await lab.exec(node, process.execPath, [distPath('bundle', 'lb-agent.js'), 'check', '--config', agent.configPath, '--json'], { allowFail: true, timeoutMs: 30_000 });
      return (JSON.parse(r.stdout) as { checks: { id: string; status: string; detail: string; remedy?: string }[] }).checks.find((c) => c.id === 'ipv6');
    };
    t.match(await check(), { status: 'pass' }, 'check: IPv6 on for eth0');
    await lab.exec(node, 'sysctl', ['-qw', 'net.ipv6.conf.eth0.disable_ipv6=1']);
    t.match(await check(), {
      status: 'fail', detail: /IPv6 is disabled on eth0 \(net\.ipv6\.conf\.eth0\.disable_ipv6=1\)/,
      remedy: /sysctl -w net\.ipv6\.conf\.all\.disable_ipv6=0 net\.ipv6\.conf\.eth0\.disable_ipv6=0/,
    }, 'check: IPv6 disabled on the parent, with the fix');
  });
}
