// Privileged, through the real agent: a DHCP VIP under VRRP. Three agent
// "VMs" (priorities 100/150/200, each with its own stateDir) serve one DHCP
// service; dnsmasq is the LAN's server. Every node derives the same MAC and
// client id for the service (net/ownership.ts), so the server hands the same
// lease to whichever node is Master:
// - the Master's VM dies: the next Master, which has no saved lease, gets the
//   same address with a DISCOVER; dnsmasq keeps one lease; nothing sent a
//   DHCPRELEASE; the client sees a gap and nothing else;
// - the old Master comes back (preempt on, higher priority): it asks for its
//   saved lease (INIT-REBOOT) and takes the VIP back; the one it took it
//   from withdraws it without a DHCPRELEASE; still one lease.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { buildVrrpLab, waitMaster, logAfter, logTime, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';

if (requirePrivileged(t)) {
  t.test('a DHCP VIP keeps its address across failover and back, with one lease and no DHCPRELEASE', async (t) => {
    const { lab, nodes, client, dnsmasq } = await buildVrrpLab(t, { dhcp: true });
    const dhcp = dnsmasq!;
    const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    // n3 first, so that n1 and n2 never hold the lease (nor save it) before the failover.
    await n3.start({ services: ['dhcp'] });
    await n3.waitService('Master', 'web', (s) => s.failover?.state === 'master');
    await Promise.all([n1, n2].map((n) => n.start({ services: ['dhcp'] })));
    await waitMaster(nodes, n3, 'web');
    const first = await n3.waitService('bound to a lease', 'web', (s) => s.state === 'serving' && s.vip !== undefined, 20_000);
    const web = first.services.find((s) => s.name === 'web')!;
    const vip = web.vip!;
    const mac = web.mac!;
    t.match(vip, /^10\.99\.0\.1\d\d$/, `n3 holds ${vip}`);
    t.match(mac, /^02:/);
    const leases0 = dhcp.leases();
    t.equal(leases0.length, 1, 'one lease');
    t.equal(leases0[0]?.ip, vip);
    t.equal(leases0[0]?.mac, mac);
    const clientId = leases0[0]?.clientId;
    for (const n of [n1, n2]) {
      const links = (await lab.sh(n.ns, 'ip -o link show')).stdout.split('\n').filter((l) => / lbv/.test(l));
      t.ok(links.length === 1 && /state DOWN/.test(links[0]!) && !/[<,]UP[,>]/.test(links[0]!), `${n.name} (Backup) keeps the service macvlan ready but down: silent on the LAN (${links.join(' ')})`);
      t.notMatch((await lab.sh(n.ns, 'ip -4 -o addr show')).stdout, new RegExp(` lbv\\S+ +inet `), `${n.name}: no address on it`);
      // Set through netlink without bringing it up: ready for a takeover that only brings it up (DESIGN.md "ARP flux").
      const ifname = /^\d+: (lbv[^:@]+)/.exec(links[0]!)?.[1];
      const conf = await lab.sh(n.ns, ['arp_ignore', 'arp_announce', 'rp_filter'].map((k) => `cat /proc/sys/net/ipv4/conf/${ifname}/${k}`).join('; '));
      t.same(conf.stdout.split('\n').filter(Boolean), ['1', '2', '2'], `${n.name}: arp_ignore, arp_announce, rp_filter on the ready macvlan`);
      t.equal((await n.service('web')).mac, mac, `${n.name} derives the same MAC`);
    }

    t.test('the Master VM dies: n2 gets the same address from the server; one lease', async (t) => {
      const loop = await ClientLoop.start(lab, client, `http://${vip}/`, { intervalMs: 10, timeoutMs: 300, maxMs: 30_000 });
      await new Promise((r) => setTimeout(r, 300));
      const killedAt = await n3.die();
      await loop.waitServed('an answer after the Master died', killedAt, 15_000);
      await new Promise((r) => setTimeout(r, 1000));
      const g = gapReport(await loop.stop(), killedAt, BACKEND_IDS);
      const master = logAfter(n2, killedAt, (l) => l.op === 'transition' && l.to === 'master');
      const bound = logAfter(n2, killedAt, (l) => l.op === 'bind');
      t.comment(`SIGKILL -> n2 VRRP Master: ${master ? logTime(master) - killedAt : '?'} ms; -> lease bound: ${bound ? logTime(bound) - killedAt : '?'} ms; `
        + `-> first answer: ${g.servedAfterMs ?? '?'} ms; client: ${g.count} requests, gap ${g.gapMs} ms, errors ${JSON.stringify(g.errors)}`);
      const s2 = await n2.service('web');
      t.equal(s2.state, 'serving');
      t.equal(s2.vip, vip, 'the same address');
      t.equal(s2.mac, mac, 'from the same MAC');
      t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 3000, `served again within 3 s (${g.servedAfterMs ?? '?'} ms)`);
      t.same(g.wrongBodies, [], 'every answer came from a backend');
      t.ok(g.gaps <= 1, `one gap at most, answers on either side (${g.gaps} runs of failures, ${g.gapMs} ms)`);
      // The client enforces a 300 ms deadline itself; the slack is for its own
      // timers on a loaded machine, not for the agent.
      t.ok(g.slowest <= 300 + 1000, `no request hung past its deadline (slowest ${g.slowest} ms)`);
      t.same(Object.keys(g.errors).filter((e) => e !== 'timeout'), [], 'the gap is silence, not refusals');
      const leases = dhcp.leases();
      t.equal(leases.length, 1, 'still one lease');
      t.same([leases[0]?.ip, leases[0]?.mac, leases[0]?.clientId], [vip, mac, clientId], 'the same lease');
      const acquired = n2.logs().filter((l) => l.op === 'send' && logTime(l) >= killedAt).map((l) => l.kind);
      t.comment(`n2 sent: ${acquired.join(', ')}`);
      // n2 has no lease in its own stateDir: it serves the address n3's adverts
      // listed at once and asks the server to confirm it (INIT-REBOOT).
      t.same(acquired, ['REQUEST'], 'n2 (no saved lease of its own) sent one REQUEST for the advertised address, no DISCOVER');
      const held = logAfter(n2, killedAt, (l) => l.op === 'bind' && /VIP .* bound/.test(String(l.msg)));
      const confirmed = logAfter(n2, killedAt, (l) => l.op === 'bind' && /confirmed/.test(String(l.msg)));
      t.ok(held && confirmed && logTime(held) <= logTime(confirmed), 'the address was served before the server confirmed it, and then confirmed');
      t.match(String(held?.why), /previous VRRP Master/, 'n2 says where the address came from');
    });

    t.test('the old Master comes back (preempt on): resumes its saved lease, takes the VIP back; no DHCPRELEASE anywhere', async (t) => {
      await n3.reboot();
      const startedAt = Date.now();
      await n3.start({ services: ['dhcp'] });
      await waitMaster(nodes, n3, 'web');
      await n3.waitService('serving again', 'web', (s) => s.state === 'serving', 15_000);
      const s3 = await n3.service('web');
      t.equal(s3.vip, vip, 'the same address again');
      const sent = n3.logs().filter((l) => l.op === 'send' && logTime(l) >= startedAt).map((l) => l.kind);
      t.comment(`n3 sent: ${sent.join(', ')}`);
      t.ok(n3.logs().some((l) => l.op === 'resume' && logTime(l) >= startedAt), 'n3 served its saved lease at once (the election decided) and confirmed it');
      t.notOk(n3.logs().some((l) => l.op === 'probe' && logTime(l) >= startedAt), 'without an ARP probe of the offer');
      await waitFor('n2 to withdraw the VIP and put its macvlan down', async () => {
        const l = (await lab.sh(n2.ns, 'ip -o link show')).stdout.split('\n').find((x) => / lbv/.test(x));
        return l !== undefined && !/[<,]UP[,>]/.test(l) && !(await lab.sh(n2.ns, 'ip -4 -o addr show')).stdout.includes(`inet ${vip}/`);
      }, 5000);
      t.pass('n2 took the VIP off the LAN; its macvlan stays ready, down');
      t.equal((await n2.service('web')).state, 'backup');
      const leases = dhcp.leases();
      t.equal(leases.length, 1, 'one lease');
      t.equal(leases[0]?.ip, vip);
      t.notMatch(dhcp.log(), /DHCPRELEASE/, 'dnsmasq never saw a DHCPRELEASE');
      t.notMatch(dhcp.log(), /DHCPDECLINE/, 'nor a DHCPDECLINE');
      t.comment(dhcp.log().split('\n').filter((l) => /DHCP(DISCOVER|OFFER|REQUEST|ACK|NAK)/.test(l)).map((l) => l.replace(/^.*dnsmasq-dhcp\[\d+\]: /, '')).join('\n'));
    });
  });
}
