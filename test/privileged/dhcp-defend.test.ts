// Privileged, through the real agent: RFC 5227 §2.4 defence of a DHCP VIP.
// Another host on the LAN claims the VIP with a gratuitous ARP: the agent
// answers with exactly one announcement from the service MAC and keeps the
// address. When the host insists (a second claim within DEFEND_INTERVAL), the
// agent gives the address up, sends DHCPDECLINE for it (dnsmasq logs it), gets
// another lease and serves the service there.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { startAgent, waitStatus } from '../../lab/agent';
import { httpGetFrom } from '../../lab/services';
import { ArpCapture, buildVipLab, isAnnouncement, vipAgentConfig } from './fixtures/vip-lab';

if (requirePrivileged(t)) {
  t.test('a host claiming the DHCP VIP: defended once; when it insists, declined and another lease served', async (t) => {
    const { lab, node, client, other, dnsmasq } = await buildVipLab(t);
    // Refresh off: every announcement after the start-up burst is then a defence.
    const agent = await startAgent(lab, node, vipAgentConfig({ refreshInterval: 0, services: ['dhcp'] }), { name: 'node' });
    const st0 = await waitStatus(agent, 'web serving', (d) => d.services[0]?.state === 'serving', 20_000);
    const web0 = st0.services[0]!;
    const vip = web0.vip!;
    const mac = web0.mac!;
    const otherMac = (await lab.sh(other, 'cat /sys/class/net/eth0/address')).stdout.trim();
    const served = async (ip: string): Promise<string> => (await httpGetFrom(lab, client, `http://${ip}/`, 2000)).body.trim();
    t.equal(await served(vip), 'b1', `served at ${vip}`);
    await new Promise((r) => setTimeout(r, 500)); // past the start-up burst

    const cap = await ArpCapture.start(lab, client, 60_000);
    const claim = () => lab.exec(other, 'busybox', ['arping', '-U', '-c', '1', '-I', 'eth0', '-s', vip, vip], { allowFail: true });
    const firstAt = Date.now();
    await claim();
    await waitStatus(agent, 'the defence', (d) => /defended/.test(String(d.services[0]?.source?.reason ?? d.services[0]?.reason)), 5000);
    await new Promise((r) => setTimeout(r, 1000));
    const st1 = (await agent.status()).services[0]!;
    t.same([st1.state, st1.vip], ['serving', vip], 'the VIP is kept');
    t.match(String(st1.source?.reason ?? st1.reason), new RegExp(`${otherMac} claimed ${vip.replace(/\./g, '\\.')}; defended`), 'status says who claimed it');
    const defences = cap.frames().filter((f) => f.t >= firstAt - 100 && isAnnouncement(f, vip) && f.srcMac === mac);
    t.equal(defences.length, 1, 'exactly one defending announcement, from the service MAC');
    const claims = cap.frames().filter((f) => f.srcMac === otherMac && f.senderIp === vip);
    t.equal(claims.length, 1, 'the claim was on the wire');
    if (defences[0] && claims[0]) t.comment(`claim -> defence: ${defences[0].t - claims[0].t} ms`);
    t.equal(await served(vip), 'b1', 'still served');

    // The host insists within DEFEND_INTERVAL (10 s).
    const secondAt = Date.now();
    await claim();
    await waitFor('DHCPDECLINE in the dnsmasq log', () => dnsmasq.log().includes(`DHCPDECLINE(eth0) ${vip} ${mac}`), 5000);
    const declineMs = Date.now() - secondAt;
    t.pass(`dnsmasq logged DHCPDECLINE of ${vip} from ${mac}`);
    const st2 = await waitStatus(agent, 'web serving another address', (d) => d.services[0]?.state === 'serving' && d.services[0]?.vip !== undefined && d.services[0]?.vip !== vip, 20_000);
    const next = st2.services[0]!.vip!;
    const servedMs = Date.now() - secondAt;
    t.not(next, vip, `moved to ${next}`);
    t.equal(await served(next), 'b1', `served at ${next}`);
    const addrs = (await lab.sh(node, 'ip -o -4 addr show')).stdout;
    t.notMatch(addrs, new RegExp(`${vip.replace(/\./g, '\\.')}/`), 'the contested address is on no interface of the node');
    const frames = await cap.stop();
    const after = frames.filter((f) => f.t > secondAt + 200 && f.srcMac === mac && f.senderIp === vip);
    t.same(after, [], 'nothing from the service MAC claims the old address after giving it up');
    t.ok(frames.some((f) => f.t > secondAt && isAnnouncement(f, next) && f.srcMac === mac), 'the new address was announced');
    t.same(dnsmasq.leases().filter((l) => l.mac === mac).map((l) => l.ip), [next], 'dnsmasq holds one lease for the service: the new one');
    const m = await lab.exec(client, 'curl', ['-s', '--max-time', '2', 'http://10.99.0.2:9477/metrics']);
    t.match(m.stdout, /lbagent_dhcp_declines_total\{service="web",namespace="default"\} 1/, 'one decline counted');
    t.match(m.stdout, /lbagent_net_arp_conflicts_total\{phase="defend"\} 2/, 'both claims counted');
    t.match(m.stdout, /lbagent_net_vip_announcements_total\{reason="defend"\} 1/, 'one defence counted');
    const lost = agent.logs.find((l) => l.op === 'unbind' && l.cause === 'conflict');
    t.ok(lost, 'the unbind was logged with cause conflict');
    t.comment(`second claim -> DHCPDECLINE logged by dnsmasq: ${declineMs} ms; -> new lease serving: ${servedMs} ms (declineWait 1 s)`);
    agent.signal('SIGTERM');
    t.equal((await agent.exited).code, 0, 'clean exit');
  });
}
