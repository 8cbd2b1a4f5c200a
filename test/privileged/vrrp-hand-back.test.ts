// Privileged, through the real agent (kernel data path, SNAT): an answer in
// flight when the VIP moves. A client's request went through the Master to a
// backend that takes a second to answer; meanwhile the Master's agent is
// SIGKILLed (its VM lives on: the kernel keeps the VIP, the rules and the
// connection's conntrack entry) and a Backup takes the VIP over. The
// backend's answer, addressed to the VIP, now reaches the new Master, which
// never saw the connection: without the hand-back its kernel answered it with
// a reset and the client got nothing (the in-flight loss the vrrp-systemd
// test measured). With it the new Master hands the answer back to the
// previous Master (forward/nft.ts "Hand-back"), whose conntrack maps it to
// the client. Also: the rule is armed on a Backup (aimed at the Master it
// follows), counts what it handed back (table and /metrics), and is gone
// HAND_BACK_MS after the takeover. The same for an IPv6 VIP: the rule in
// `table ip6 lb_agent` by hop limit, aimed at the Master's link-local
// address (the source of its IPv6 adverts) on the parent. In both families
// a client loop (a request every 20 ms on a new connection, 300 ms each)
// runs across the takeover and loses none; in a lab of its own, one
// through the tied IPv6 VIP loses none either (dhcp/shared-link.ts: the
// /128 is on the macvlan before the link comes up), but for at most one
// connection that opens as the service MAC moves; there n1 resolves its IPv6
// peers (n3's MAC found) on the raw ICMPv6 socket, with no packet socket of
// ETH_P_IPV6 or ETH_P_ALL on the parent. And for the IPv6 VIP of a
// dual-stack DHCP service, tied to the IPv4 router (failover/dual.ts): the
// copy goes to the IPv6 entry of failover.peers that answers neighbour
// discovery with the MAC the previous Master's IPv4 address answers ARP
// with (a global address here, listed before the link-local one); forged
// IPv4 adverts from outside the peers, or claiming the Master's address
// from off-link, move neither the election nor the copy's target.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { httpGetFrom } from '../../lab/services';
import { buildVrrpLab, metricValue, waitMaster, POOL_VIP, BACKENDS } from '../../lab/vrrp';
import { HAND_BACK_MS } from '../../agent/failover/gate';
import { createLab } from '../../lab/netns';
import { startBackend } from '../../lab/services';
import { startAgent, waitStatus } from '../../lab/agent';
import { ClientLoop, gapReport } from '../../lab/client-loop';
import type { Lab } from '../../lab/netns';

/** The IPv6 lab: VMs n1 and n3, an IPv6 backend, a client, dnsmasq for both families, and "dd": a dual-stack DHCP service whose IPv6 VIP rides the IPv4 router VRID_DUAL. */
async function dualLab(t: tap.Test) {
  const lab = await createLab(t);
  const n1 = await addVm6(lab, 'n1', 2);
  const n3 = await addVm6(lab, 'n3', 4);
  const b6 = await lab.addHost('b6', { address: '10.99.0.12/24', ipv6: [`${BACKEND6}/64`] });
  const client = await lab.addHost('client', { address: '10.99.0.80/24', ipv6: ['fd00:99::50/64'] });
  await startBackend(lab, b6, 'b6', [8080], '::');
  const server = await lab.addHost('dhcp', { address: '10.99.0.1/24', ipv6: ['fd00:99::1/64'] });
  const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', noPing: true, extra: ['--dhcp-range=fd00:99::100,fd00:99::1ff,64,1h'] });
  t.teardown(() => dnsmasq.stop());
  const dd = {
    name: 'dd', ipFamilyPolicy: 'RequireDualStack', ipam: 'dhcp', vrid: VRID_DUAL, loadBalancerIPs: [DD4, DD6], ports: [{ port: 80, targetPort: 8080 }],
    backends: ['10.99.0.12', BACKEND6], healthCheck: { periodSeconds: 0.2, timeoutSeconds: 0.2, failureThreshold: 2 },
  };
  return { lab, n1, n3, client, dd };
}

/** A client loop across the takeover: none of its requests may fail (at most `allowed`, where a caller says why). */
async function loopAcross(t: tap.Test, lab: Lab, client: string, url: string, allowed = 0): Promise<{ done(at: number, bodies: readonly string[]): Promise<void> }> {
  const loop = await ClientLoop.start(lab, client, url, { intervalMs: 20, timeoutMs: 300, maxMs: 20_000 });
  t.teardown(() => loop.stop().then(() => undefined));
  return {
    async done(at, bodies) {
      await loop.waitServed('an answer after the takeover', at, 5000);
      await new Promise((r) => setTimeout(r, 300));
      const g = gapReport(await loop.stop(), at, bodies);
      t.comment(`client loop across the takeover: ${g.count} requests, ${g.failures.length} failed, slowest ${g.slowest} ms, errors ${JSON.stringify(g.errors)}`);
      if (allowed === 0) t.equal(g.failures.length, 0, `no request failed (${g.count} every 20 ms across the takeover)`);
      else t.ok(g.failures.length <= allowed, `at most ${allowed} of ${g.count} requests every 20 ms across the takeover failed (${g.failures.length})`);
      t.same(g.wrongBodies, [], 'every answer from a backend');
    },
  };
}
import { addVm6, agentConfig6, BACKEND6, VIP6 } from '../../lab/vrrp6';
import { startDnsmasq } from '../../lab/services';
import { encodeAdvertisement } from '../../agent/failover/codec';
import { parseIPv4 } from '../../agent/address';
import { masterDownIntervalMs } from '../../agent/failover/machine';
import { forge } from './fixtures/failover-client';

/** The dual-stack DHCP service's IPv4 router, which its IPv6 VIP follows; and its two addresses (in dnsmasq's ranges). */
const VRID_DUAL = 53;
const DD4 = '10.99.0.120';
const DD6 = 'fd00:99::120';

if (requirePrivileged(t)) {
  t.test('a backend answer in flight at a takeover reaches the client through the previous Master', async (t) => {
    const { lab, nodes, client } = await buildVrrpLab(t);
    const [, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all([n2, n3].map((n) => n.start()));
    await waitMaster([n2, n3], n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP && (s.backends ?? []).every((b) => b.state === 'up'));
    const table = async (ns: string): Promise<string> => (await lab.sh(ns, 'nft list table ip lb_agent')).stdout;
    await waitFor("n2's hand-back armed, aimed at n3", async () => /dup to 10\.99\.0\.4 device "eth0"/.test(await table(n2.ns)), 5000);
    t.match(await table(n2.ns), new RegExp(`ip daddr ${POOL_VIP.replace(/\./g, '\\.')} ip saddr \\{ ${BACKENDS.join(', ').replace(/\./g, '\\.')} \\} tcp sport 8080 ip ttl \\{ 64, 128, 255 \\} ct state (new,invalid|invalid,new) goto hand_back_s0`), 'for the backends\' target port to the VIP, straight from them, connections n2 never saw');
    // n3 may have preempted n2 at start (then it hands back to n2 for a while): that window closes first.
    await waitFor("the Master's own hand-back, if any, over", async () => !/hand_back/.test(await table(n3.ns)), HAND_BACK_MS + 5000);

    const loop = await loopAcross(t, lab, client, `http://${POOL_VIP}/`);
    // The request goes through n3 now; the backend answers in 1.5 s.
    const answer = httpGetFrom(lab, client, `http://${POOL_VIP}/slow/1500`, 8000);
    await new Promise((r) => setTimeout(r, 300));
    const killedAt = Date.now();
    n3.agent!.signal('SIGKILL');
    await n3.agent!.exited;
    await n2.waitService('VRRP Master', 'api', (s) => s.failover?.state === 'master', 5000);
    const tookOverMs = Date.now() - killedAt;
    t.ok(tookOverMs < 1200, `n2 took the VIP over (${tookOverMs} ms after the kill) before the backend answered`);
    const r = await answer;
    t.ok(r.ok, `the client got the answer (${r.ok ? r.body.trim() : r.error})`);
    t.match(r.body, /^b[12]\n$/, 'from a backend');
    const handed = /counter s0_handed_back \{\s*packets (\d+)/.exec(await table(n2.ns));
    t.ok(Number(handed?.[1]) >= 1, `n2 handed ${handed?.[1]} packet(s) back to n3`);

    // The window closes: the rule goes with the next table.
    await waitFor('the hand-back rule gone after HAND_BACK_MS', async () => !/hand_back/.test(await table(n2.ns)), HAND_BACK_MS + 5000);
    t.pass(`gone within ${HAND_BACK_MS} ms + an apply`);
    // And in the metrics, after the table that ended it (the count stays with the service).
    const sample = 'lbagent_forward_handed_back_packets_total{service="api",namespace="default"}';
    const counted = await waitFor('the handed-back packets in /metrics', async () => { const v = metricValue(await n2.metrics(), sample); return v !== undefined && v >= 1 ? v : undefined; }, 5000);
    t.ok(counted >= Number(handed?.[1]), `${sample} ${counted}`);
    await loop.done(killedAt, ['b1', 'b2']);
  });

  t.test('an IPv6 VIP: the answer in flight at a takeover is handed back to the previous Master by its link-local address; a tied IPv6 VIP to its IPv6 peer address', async (t) => {
    const { lab, n1, n3, client, dd } = await dualLab(t);
    // Peers of both families: n1 lists n3's global IPv6 address before its link-local one (which its IPv6 router needs: adverts come from it).
    const cfg = (v: typeof n1, priority: number, peers: string[]): Record<string, unknown> => {
      const c = agentConfig6(v, priority, { advertInterval: 0.1, vrid: 51 });
      return { ...c, failover: { ...(c.failover as Record<string, unknown>), peers }, services: [...(c.services as unknown[]), dd] };
    };
    const a3 = await startAgent(lab, n3.ns, cfg(n3, 200, [n1.ip, n1.linkLocal]), { name: 'n3' });
    const a1 = await startAgent(lab, n1.ns, cfg(n1, 100, [n3.ip, n3.ip6, n3.linkLocal]), { name: 'n1' });
    type Status = Awaited<ReturnType<typeof a1.status>>;
    const api = (d: Status): Status['services'][number] | undefined => d.services.find((s) => s.name === 'api');
    const dd6 = (d: Status): Status['services'][number] | undefined => d.services.find((s) => s.name === 'dd' && s.family === 'IPv6');
    await waitStatus(a3, 'n3 serves the IPv6 VIP and both of dd', (d) => api(d)?.state === 'serving' && api(d)?.vip === VIP6 && (api(d)?.backends ?? []).every((b) => b.state === 'up')
      && d.services.filter((s) => s.name === 'dd' && s.state === 'serving').length === 2 && dd6(d)?.vip === DD6, 15_000);
    const table = async (ns: string): Promise<string> => (await lab.sh(ns, 'nft list table ip6 lb_agent')).stdout;
    const tied = new RegExp(`ip6 daddr ${DD6} ip6 saddr ${BACKEND6} tcp sport 8080 ip6 hoplimit \\{ 64, 128, 255 \\} ct state (new,invalid|invalid,new) goto hand_back_(v6s\\d+)`);
    await waitFor("n1's IPv6 hand-back armed, aimed at n3's link-local address", async () => (await table(n1.ns)).includes(`dup to ${n3.linkLocal} device "eth0"`), 5000);
    t.match(await table(n1.ns), new RegExp(`ip6 daddr ${VIP6} ip6 saddr ${BACKEND6} tcp sport 8080 ip6 hoplimit \\{ 64, 128, 255 \\} ct state (new,invalid|invalid,new) goto hand_back_v6s0`),
      "for the backend's target port to the VIP, straight from it, connections n1 never saw");
    const tiedChain = await waitFor("n1's hand-back of the tied IPv6 VIP armed", async () => tied.exec(await table(n1.ns))?.[2], 5000);
    const aimedAt = (text: string): string | undefined => new RegExp(`chain hand_back_${tiedChain} \\{[^}]*dup to (\\S+) device "eth0"`).exec(text)?.[1];
    t.equal(aimedAt(await table(n1.ns)), n3.ip6, "the tied VIP's copy aimed at n3's IPv6 peer with the MAC of its IPv4 one: the global address, listed first");
    t.match(dd6(await a1.status())?.failover, { family: 'IPv4', state: 'backup', master: n3.ip }, 'while its router names n3 by its IPv4 address');

    // Forged IPv4 adverts for the tied router at priority 254: from the client (not a peer), and with n3's address but a TTL that crossed a router.
    const forged = (srcIp: string, ttl?: number): Buffer => encodeAdvertisement({ vrid: VRID_DUAL, priority: 254, maxAdverIntCs: 10, addresses: [parseIPv4(DD4)!], srcIp: parseIPv4(srcIp)!, ttl });
    const dropped = async (reason: string): Promise<number> => metricValue((await httpGetFrom(lab, client, `http://${n1.ip}:9477/metrics`, 2000)).body, `lbagent_vrrp_dropped_total{reason="${reason}",family="IPv4"}`) ?? 0;
    const before = [await dropped('not-a-peer'), await dropped('bad-ttl')];
    t.equal(await forge(lab, client, [forged('10.99.0.80'), forged(n3.ip, 64)], { repeat: 5, gapMs: 20 }), 10, 'ten forged adverts sent');
    await new Promise((r) => setTimeout(r, 3 * masterDownIntervalMs(100, 10)));
    t.same([await dropped('not-a-peer') - before[0]!, await dropped('bad-ttl') - before[1]!], [5, 5], 'dropped and counted: 5 not-a-peer, 5 bad-ttl');
    t.match(dd6(await a1.status())?.failover, { state: 'backup', master: n3.ip }, 'n1 still follows n3');
    t.equal(aimedAt(await table(n1.ns)), n3.ip6, 'and the copy still goes to n3');
    await waitFor("the Master's own hand-back, if any, over", async () => !/hand_back/.test(await table(n3.ns)), HAND_BACK_MS + 5000);

    // The loop runs through the pool VIP only: through the tied VIP, a takeover loses the requests sent between the
    // macvlan coming up (its DHCPv4 frames move the service MAC to n1) and the IPv6 address added a moment later.
    const loop = await loopAcross(t, lab, client, `http://[${VIP6}]/`);
    // Through n3; the backend answers in 1.5 s; n3's agent dies (its VM, kernel and conntrack live on).
    const answer = httpGetFrom(lab, client, `http://[${VIP6}]/slow/1500`, 8000);
    const answerTied = httpGetFrom(lab, client, `http://[${DD6}]/slow/1500`, 8000);
    await new Promise((r) => setTimeout(r, 300));
    const killedAt = Date.now();
    a3.signal('SIGKILL');
    await a3.exited;
    await waitStatus(a1, 'n1 VRRP Master of both routers', (d) => api(d)?.failover?.state === 'master' && dd6(d)?.failover?.state === 'master', 5000);
    const tookOverMs = Date.now() - killedAt;
    t.ok(tookOverMs < 1200, `n1 took the IPv6 VIPs over (${tookOverMs} ms after the kill) before the backend answered`);
    const [r, rt] = [await answer, await answerTied];
    t.ok(r.ok, `the client got the answer (${r.ok ? r.body.trim() : r.error})`);
    t.equal(r.body, 'b6\n', 'from the backend');
    t.ok(rt.ok, `through the tied IPv6 VIP too (${rt.ok ? rt.body.trim() : rt.error})`);
    t.equal(rt.body, 'b6\n', 'from the backend');
    const text = await table(n1.ns);
    const handed = /counter v6s0_handed_back \{\s*packets (\d+)/.exec(text);
    t.ok(Number(handed?.[1]) >= 1, `n1 handed ${handed?.[1]} packet(s) back to n3`);
    const handedTied = new RegExp(`counter ${tiedChain}_handed_back \\{\\s*packets (\\d+)`).exec(text);
    t.ok(Number(handedTied?.[1]) >= 1, `and ${handedTied?.[1]} of the tied VIP's to n3's global address`);
    t.equal(aimedAt(text), n3.ip6, 'after the takeover, to the previous Master');
    await loop.done(killedAt, ['b6']);
  });

  // Apart from the hand-back above: a lab with the tied VIP alone (no IPv6 router), where n1 still resolves
  // its IPv6 peers. Why one request may fail, from captures on the client, n1 and n3 of runs that lost one:
  // its SYN left the client within a millisecond of n1's macvlan coming up (the link's first frame, an MLD
  // report from ::, moves the bridge's entry for the service MAC to n1), reached n1's macvlan and got nothing
  // back (no DNAT to the backend, no RST, no ICMPv6, no neighbour solicitation for the client), while the
  // next SYN 24 ms later was forwarded. Not the client's neighbour cache (it holds the service MAC
  // throughout) and not n3's kernel (it answers from its parent's MAC). Where n1 drops it is not found.
  t.test('the tied IPv6 VIP of a dual-stack DHCP service across a SIGKILL takeover: a client loop loses at most the one connection that straddles the MAC move', async (t) => {
    const { lab, n1, n3, client, dd } = await dualLab(t);
    const cfg = (v: typeof n1, priority: number, peers: string[]): Record<string, unknown> => {
      const c = agentConfig6(v, priority, { advertInterval: 0.1, vrid: 51 });
      return { ...c, failover: { ...(c.failover as Record<string, unknown>), peers }, services: [dd] };
    };
    const a3 = await startAgent(lab, n3.ns, cfg(n3, 200, [n1.ip, n1.linkLocal]), { name: 'n3' });
    const a1 = await startAgent(lab, n1.ns, cfg(n1, 100, [n3.ip, n3.ip6, n3.linkLocal]), { name: 'n1' });
    type Status = Awaited<ReturnType<typeof a1.status>>;
    const dd6 = (d: Status): Status['services'][number] | undefined => d.services.find((s) => s.name === 'dd' && s.family === 'IPv6');
    await waitStatus(a3, 'n3 serves both VIPs of dd', (d) => d.services.filter((s) => s.name === 'dd' && s.state === 'serving').length === 2 && dd6(d)?.vip === DD6, 15_000);
    await waitStatus(a1, 'n1 follows n3', (d) => dd6(d)?.failover?.state === 'backup', 5000);
    // n1 resolves its IPv6 peers (the tied VIP's hand-back aims at one) on the raw ICMPv6 socket, advertisements
    // only: no packet socket of ETH_P_IPV6 or ETH_P_ALL on the parent (or on every interface) taps its IPv6 traffic.
    const resolved = await waitFor("n1 resolved n3's global IPv6 address", async () => a1.logs.find((l) => l.op === 'ndp-resolve' && l.msg === 'peer resolved' && l.ip === n3.ip6), 5000);
    t.equal(resolved.mac, n3.mac, "to n3's MAC, from its advertisement");
    const parentIndex = Number((await lab.exec(n1.ns, 'cat', ['/sys/class/net/eth0/ifindex'])).stdout.trim());
    const packets = (await lab.exec(n1.ns, 'cat', ['/proc/net/packet'])).stdout.trim().split('\n').slice(1).map((l) => l.trim().split(/\s+/));
    t.ok(packets.length > 0, `n1's agent holds packet sockets (${packets.length}: ARP, VRRP, DHCP)`);
    const taps = packets.filter((f) => ['86dd', '3'].includes(f[3]!.replace(/^0+(?=.)/, '')) && [0, parentIndex].includes(Number(f[4])));
    t.same(taps.map((f) => `proto ${f[3]} iface ${f[4]}`), [], 'no packet socket sees every IPv6 frame of the parent');
    const raw6 = (await lab.exec(n1.ns, 'cat', ['/proc/net/raw6'])).stdout.trim().split('\n').slice(1);
    t.ok(raw6.some((l) => /^\s*\d+: 0{32}:003A /.test(l)), 'a raw ICMPv6 socket hears the advertisements');
    // One request whose SYN reaches n1 as its macvlan comes up may still fail (above).
    const loop = await loopAcross(t, lab, client, `http://[${DD6}]/`, 1);
    await new Promise((r) => setTimeout(r, 200));
    const killedAt = Date.now();
    a3.signal('SIGKILL');
    await a3.exited;
    await waitStatus(a1, 'n1 serves the tied IPv6 VIP', (d) => dd6(d)?.failover?.state === 'master' && dd6(d)?.state === 'serving' && dd6(d)?.vip === DD6, 5000);
    await loop.done(killedAt, ['b6']);
  });
}
