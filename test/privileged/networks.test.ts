// A VM on two networks, through the real agent: eth0 on one bridge (the
// default network, pools) and eth1 on another (a named network, DHCP from
// dnsmasq there and pools). Services on each serve the clients of each; a
// VIP of one network is not answered for by ARP on the other (ARP flux),
// which a host with the kernel's default sysctls shows it would be; the
// drift guard keeps the second NIC's sysctls and addresses; `lb-agent
// check` reports both networks. An IPv6 pool VIP on the named network is
// placed by DAD and resolved by NDP on its NIC.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { startBackend, startDnsmasq, httpGetFrom } from '../../lab/services';
import { startAgent, waitStatus, agentCli } from '../../lab/agent';
import { linkNameForService } from '../../agent/net/ownership/ownership';
import { markedAddressAdd } from './fixtures/marked-address';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.5, timeoutSeconds: 0.5 };
/** The first address of vmnet's IPv6 range, which another host on br1 holds. */
const TAKEN6 = 'fd00:98::200';

/** Who answers an ARP request for `target` sent on `ifname` of `ns`: the MACs of the replies (busybox arping: one request, a second for the replies). */
async function arpReplies(lab: Lab, ns: string, target: string, ifname = 'eth0'): Promise<string[]> {
  const r = await lab.exec(ns, 'busybox', ['arping', '-c', '1', '-w', '1', '-I', ifname, target], { allowFail: true, timeoutMs: 5000 });
  return [...new Set([...r.stdout.matchAll(/reply from \S+ \[([0-9a-fA-F:]+)\]/g)].map((m) => m[1]!.toLowerCase()))];
}

async function macOf(lab: Lab, ns: string, ifname: string): Promise<string> {
  const r = await lab.exec(ns, 'ip', ['-j', 'link', 'show', ifname]);
  return (JSON.parse(r.stdout) as { address: string }[])[0]!.address.toLowerCase();
}

async function addrsOn(lab: Lab, ns: string, ifname: string, family: '-4' | '-6' = '-4'): Promise<string[]> {
  const r = await lab.exec(ns, 'ip', [family, '-j', 'addr', 'show', 'dev', ifname]);
  return (JSON.parse(r.stdout) as { addr_info: { local: string; prefixlen: number }[] }[]).flatMap((l) => l.addr_info.map((a) => `${a.local}/${a.prefixlen}`));
}

async function sysctl(lab: Lab, ns: string, name: string): Promise<string> {
  return (await lab.exec(ns, 'sysctl', ['-n', name])).stdout.trim();
}

t.test('two NICs on two bridges: each network\'s services serve its clients; no ARP answer on the wrong NIC', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  await lab.addBridge('br1');
  // The default network (br0): the VM's eth0, a client, a backend.
  const vm = await lab.addHost('vm', { address: '10.99.0.2/24' });
  const clientA = await lab.addHost('client-a', { address: '10.99.0.50/24' });
  await lab.addHost('ba', { address: '10.99.0.11/24' });
  // The VM network (br1): the VM's eth1, a DHCP server, a client, a backend.
  // IPv6 on the VM network only: eth1, its client and backend, and a host
  // holding the IPv6 pool's first address (DAD must skip it).
  await lab.addNic('vm', 'eth1', { bridge: 'br1', address: '10.98.0.2/24' });
  await lab.sh(vm, 'sysctl -qw net.ipv6.conf.eth1.accept_dad=0 net.ipv6.conf.eth1.disable_ipv6=0 && ip -6 addr add fd00:98::2/64 dev eth1 nodad');
  const dhcp = await lab.addHost('dhcp-b', { address: '10.98.0.1/24', bridge: 'br1' });
  const clientB = await lab.addHost('client-b', { address: '10.98.0.50/24', ipv6: ['fd00:98::50/64'], bridge: 'br1' });
  await lab.addHost('bb', { address: '10.98.0.11/24', ipv6: ['fd00:98::11/64'], bridge: 'br1' });
  const taken6 = await lab.addHost('taken6', { ipv6: [`${TAKEN6}/64`], bridge: 'br1' });
  // The control: a host on both bridges with the kernel's default ARP sysctls.
  const plain = await lab.addHost('plain', { address: '10.99.0.3/24' });
  await lab.addNic('plain', 'eth1', { bridge: 'br1', address: '10.98.0.3/24' });
  const dnsmasq = await startDnsmasq(lab, dhcp, { range: '10.98.0.100,10.98.0.150', noPing: true });
  await startBackend(lab, lab.ns('ba'), 'ba', [8080]);
  await startBackend(lab, lab.ns('bb'), 'bb', [8080], '::');

  const cfg = {
    node: { interface: 'eth0' },
    metrics: { listen: '10.99.0.2:9477' },
    pools: { 'range-global': '10.99.0.200-10.99.0.201' },
    networks: { vmnet: { interface: 'eth1', pools: { 'range-global': `10.98.0.200-10.98.0.201,${TAKEN6}-fd00:98::20f` } } },
    arp: FAST_ARP,
    dhcp: { retransmitInitial: 0.5, retransmitMax: 2 },
    services: [
      { name: 'a-pool', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
      { name: 'b-pool', network: 'vmnet', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.98.0.11'], healthCheck: HC },
      { name: 'b-dhcp', network: 'vmnet', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.98.0.11'], healthCheck: HC },
      { name: 'b-pool6', network: 'vmnet', ipam: 'pool', ipFamilies: ['IPv6'], ports: [{ port: 80, targetPort: 8080 }], backends: ['fd00:98::11'], healthCheck: HC },
    ],
  };
  const agent = await startAgent(lab, vm, cfg);
  const st = await waitStatus(agent, 'every service serving', (s) => s.services.length === 4 && s.services.every((x) => x.ready), 30_000);
  const by = (n: string) => st.services.find((s) => s.name === n)!;
  const [aPool, bPool, bDhcp, bPool6] = [by('a-pool').vip!, by('b-pool').vip!, by('b-dhcp').vip!, by('b-pool6').vip!];
  const [eth0Mac, eth1Mac] = [await macOf(lab, vm, 'eth0'), await macOf(lab, vm, 'eth1')];

  t.test('each VIP lives on its network\'s NIC; status names the network', async (t) => {
    t.same(st.networks, [{ name: 'default', interface: 'eth0', address: '10.99.0.2' }, { name: 'vmnet', interface: 'eth1', address: '10.98.0.2' }]);
    t.same(st.services.map((s) => [s.name, s.network]), [['a-pool', 'default'], ['b-pool', 'vmnet'], ['b-dhcp', 'vmnet'], ['b-pool6', 'vmnet']]);
    t.equal(aPool, '10.99.0.200', 'a-pool from the default network\'s range-global');
    t.equal(bPool, '10.98.0.200', 'b-pool from vmnet\'s own range-global');
    t.ok(/^10\.98\.0\.1\d\d$/.test(bDhcp), `b-dhcp leased ${bDhcp} by the VM network's server`);
    t.equal(dnsmasq.leases().find((l) => l.ip === bDhcp)?.mac, by('b-dhcp').mac, 'dnsmasq on br1 leased it to the service\'s MAC');
    t.ok((await addrsOn(lab, vm, 'eth0')).includes(`${aPool}/32`), 'a-pool on eth0');
    t.notOk((await addrsOn(lab, vm, 'eth0')).includes(`${bPool}/32`), 'b-pool not on eth0');
    t.ok((await addrsOn(lab, vm, 'eth1')).includes(`${bPool}/32`), 'b-pool on eth1');
    t.equal(by('b-pool').mac, eth1Mac, 'status: b-pool answers with eth1\'s MAC');
    const link = JSON.parse((await lab.exec(vm, 'ip', ['-d', '-j', 'link', 'show', linkNameForService('default/b-dhcp')])).stdout) as { link: string }[];
    t.equal(link[0]!.link, 'eth1', 'b-dhcp\'s macvlan hangs off eth1');
  });

  t.test('an IPv6 pool VIP on the named network: DAD and NDP on its NIC', async (t) => {
    t.match(bPool6, /^fd00:98::20[1-9a-f]$/, `b-pool6 ${bPool6} from vmnet's IPv6 range, past the taken ${TAKEN6}`);
    t.match(agent.logs.find((l) => l.op === 'dad' && l.address === TAKEN6), { mac: await macOf(lab, taken6, 'eth0'), reason: 'advertised' }, 'DAD on eth1 found the host holding the first address');
    t.ok((await addrsOn(lab, vm, 'eth1', '-6')).includes(`${bPool6}/128`), 'b-pool6 on eth1 as a /128');
    t.notOk((await addrsOn(lab, vm, 'eth0', '-6')).includes(`${bPool6}/128`), 'b-pool6 not on eth0');
    t.match(by('b-pool6'), { family: 'IPv6', mac: eth1Mac, state: 'serving' });
    t.equal((await httpGetFrom(lab, clientB, `http://[${bPool6}]/`)).body, 'bb\n', 'client B -> b-pool6 -> its backend over IPv6');
    const neigh = JSON.parse((await lab.exec(clientB, 'ip', ['-j', '-6', 'neigh', 'show', bPool6, 'dev', 'eth0'])).stdout || '[]') as { lladdr?: string }[];
    t.equal(neigh[0]?.lladdr, eth1Mac, 'client B resolved the VIP by NDP to eth1\'s MAC');
  });

  t.test('metrics name the network of a VIP and of a pool', async (t) => {
    const m = await httpGetFrom(lab, clientA, 'http://10.99.0.2:9477/metrics', 5000);
    t.match(m.body, new RegExp(`lbagent_service_vip_info\\{service="b-pool",namespace="default",vip="${bPool.replace(/\./g, '\\.')}",ipam="pool",network="vmnet"\\} 1`));
    t.match(m.body, new RegExp(`lbagent_service_vip_info\\{service="a-pool",namespace="default",vip="${aPool.replace(/\./g, '\\.')}",ipam="pool"\\} 1`), 'no network label on the default network');
    t.match(m.body, /lbagent_pool_in_use\{pool="vmnet\/range-global"\} 2/, 'vmnet\'s pool by its own name: b-pool\'s IPv4 and b-pool6\'s IPv6 address');
    t.match(m.body, /lbagent_pool_in_use\{pool="range-global"\} 1/);
  });

  t.test('clients of each network reach their services', async (t) => {
    t.equal((await httpGetFrom(lab, clientA, `http://${aPool}/`)).body, 'ba\n', 'client A -> a-pool -> its backend');
    t.equal((await httpGetFrom(lab, clientB, `http://${bPool}/`)).body, 'bb\n', 'client B -> b-pool -> its backend');
    t.equal((await httpGetFrom(lab, clientB, `http://${bDhcp}/`)).body, 'bb\n', 'client B -> b-dhcp -> its backend');
  });

  t.test('ARP flux: a VIP is answered for on its own network only', async (t) => {
    // The control: the kernel's defaults answer for an address of eth1 on eth0.
    await lab.sh(plain, 'ip addr add 10.98.0.99/32 dev eth1');
    t.same(await arpReplies(lab, clientA, '10.98.0.99'), [await macOf(lab, plain, 'eth0')], 'control: with default sysctls a host answers on the wrong NIC');
    // One request each, all at once: a second of waiting for the lot.
    const [ownA, ownB, ownDhcp, wrongB, wrongDhcp, wrongA] = await Promise.all([
      arpReplies(lab, clientA, aPool), arpReplies(lab, clientB, bPool), arpReplies(lab, clientB, bDhcp),
      arpReplies(lab, clientA, bPool), arpReplies(lab, clientA, bDhcp), arpReplies(lab, clientB, aPool),
    ]);
    t.same(ownA, [eth0Mac], 'a-pool answered on its network, with eth0\'s MAC');
    t.same(ownB, [eth1Mac], 'b-pool answered on its network, with eth1\'s MAC');
    t.same(ownDhcp, [by('b-dhcp').mac!.toLowerCase()], 'b-dhcp answered on its network, with its macvlan\'s MAC');
    t.same(wrongB, [], 'no answer for vmnet\'s pool VIP on the default network');
    t.same(wrongDhcp, [], 'no answer for vmnet\'s DHCP VIP on the default network');
    t.same(wrongA, [], 'no answer for the default network\'s VIP on vmnet');
    t.equal(await sysctl(lab, vm, 'net.ipv4.conf.eth1.arp_ignore'), '1');
    t.equal(await sysctl(lab, vm, 'net.ipv4.conf.eth1.arp_announce'), '2');
  });

  t.test('the drift guard keeps the second NIC: its sysctls and its addresses', async (t) => {
    await lab.sh(vm, 'sysctl -qw net.ipv4.conf.eth1.arp_ignore=0');
    await waitFor('eth1 arp_ignore put back', async () => (await sysctl(lab, vm, 'net.ipv4.conf.eth1.arp_ignore')) === '1', 5000);
    t.pass('net.ipv4.conf.eth1.arp_ignore put back to 1');
    await lab.sh(vm, markedAddressAdd('10.98.0.240', 'eth1'));
    t.ok((await addrsOn(lab, vm, 'eth1')).includes('10.98.0.240/32'), 'the marked address is there');
    await waitFor('the stray marked address on eth1 removed', async () => !(await addrsOn(lab, vm, 'eth1')).includes('10.98.0.240/32'), 8000);
    t.pass('a marked address on eth1 that no service holds is removed');
    // vmnet's claim marked on the default network's NIC: claimed, but not there.
    await lab.sh(vm, markedAddressAdd(bPool, 'eth0'));
    await waitFor('vmnet\'s claim marked on eth0 removed', async () => !(await addrsOn(lab, vm, 'eth0')).includes(`${bPool}/32`), 8000);
    t.pass('a claim of vmnet marked on eth0 is removed while running');
    t.ok((await addrsOn(lab, vm, 'eth1')).includes(`${bPool}/32`), 'and stays on its own NIC, eth1');
    await lab.sh(vm, `ip addr del ${bPool}/32 dev eth1`);
    await waitFor('b-pool put back on eth1', async () => (await addrsOn(lab, vm, 'eth1')).includes(`${bPool}/32`), 5000);
    t.notOk((await addrsOn(lab, vm, 'eth0')).includes(`${bPool}/32`), 'b-pool back on eth1, not on eth0');
  });

  t.test('lb-agent check reports both networks', async (t) => {
    const r = await agentCli(lab, vm, ['check', '--config', agent.configPath, '--json'], 30_000);
    const doc = JSON.parse(r.stdout) as { checks: { id: string; status: string; detail: string }[] };
    const nets = doc.checks.find((c) => c.id === 'networks');
    t.match(nets, { status: 'pass', detail: /default \(eth0, 1 service\(s\)\): up, carrier, 10\.99\.0\.2\/24.*macvlan ok \| vmnet \(eth1, 3 service\(s\)\): up, carrier, 10\.98\.0\.2\/24, fd00:98::2\/64, arp_ignore\/arp_announce as wanted, macvlan ok/ });
    t.same((await lab.exec(vm, 'ip', ['-j', 'link', 'show'])).stdout.match(/lbchk\d/g), null, 'the macvlan probe left nothing in the VM\'s namespace');
  });

  t.test('SIGTERM withdraws the VIPs of both NICs', async (t) => {
    agent.signal('SIGTERM');
    t.same(await agent.exited, { code: 0, signal: null });
    t.notOk((await addrsOn(lab, vm, 'eth0')).some((a) => a.endsWith('/32')), 'nothing left on eth0');
    t.notOk((await addrsOn(lab, vm, 'eth1')).some((a) => a.endsWith('/32')), 'nothing left on eth1');
    t.notOk((await addrsOn(lab, vm, 'eth1', '-6')).some((a) => a.endsWith('/128')), 'no IPv6 VIP left on eth1');
  });

  t.test('VRRP: each network\'s virtual router adverts on its own NIC with its own VRID, and to its own peers of both families', async (t) => {
    // Client B stands in for vmnet's other agent: its IPv4 address and its
    // link-local one (scoped by vmnet's NIC) are vmnet's peers.
    const llB = await waitFor('client B\'s link-local address', async () => /inet6 (fe80::[0-9a-f:]+)\/64/.exec((await lab.exec(clientB, 'ip', ['-6', '-o', 'addr', 'show', 'dev', 'eth0', 'scope', 'link'])).stdout)?.[1], 5000, 100);
    const vrrpCfg = { ...cfg, failover: { mode: 'vrrp', vrid: 51, advertInterval: 0.1 }, networks: { vmnet: { ...cfg.networks.vmnet, failover: { vrid: 61, peers: ['10.98.0.50', llB] } } } };
    const vrrp = await startAgent(lab, vm, vrrpCfg, { name: 'vrrp' });
    t.teardown(() => { vrrp.signal('SIGKILL'); });
    const s = await waitStatus(vrrp, 'Master of both networks\' routers, every service serving', (x) => x.services.length === 4 && x.services.every((y) => y.ready && y.state === 'serving' && (y.failover as { state?: string } | undefined)?.state === 'master'), 30_000);
    const fo = (n: string) => s.services.find((x) => x.name === n)!.failover as { vrid: number; state: string; network: string } | undefined;
    t.match(fo('a-pool'), { vrid: 51, state: 'master', network: 'default' });
    t.match(fo('b-pool'), { vrid: 61, state: 'master', network: 'vmnet' });
    t.match(fo('b-dhcp'), { vrid: 61, state: 'master', network: 'vmnet' });
    t.match(fo('b-pool6'), { vrid: 61, state: 'master', network: 'vmnet' }, 'the IPv6 VIP rides vmnet\'s router too (its IPv6 instance)');
    // What each LAN hears: 0.1 s adverts, so a second shows several.
    const heard = async (ns: string): Promise<number[]> => {
      const r = await lab.exec(ns, 'timeout', ['1', 'tcpdump', '-i', 'eth0', '-nn', '-l', 'ip proto 112'], { allowFail: true, timeoutMs: 5000 });
      return [...new Set([...r.stdout.matchAll(/vrid (\d+)/g)].map((m) => Number(m[1])))].sort();
    };
    const [onA, onB] = await Promise.all([heard(clientA), heard(clientB)]);
    t.same(onA, [51], 'the default network hears VRID 51 only');
    t.same(onB, [61], 'vmnet hears VRID 61 only, from eth1');
    // vmnet's IPv6 router sends a unicast copy of each advert to its IPv6 peer (its MAC found by NDP on eth1).
    const uni6 = await lab.exec(clientB, 'timeout', ['1', 'tcpdump', '-i', 'eth0', '-nn', '-l', 'ip6 proto 112 and not dst ff02::12'], { allowFail: true, timeoutMs: 5000 });
    const to6 = [...new Set([...uni6.stdout.matchAll(/IP6 (\S+) > (\S+): VRRPv3.*vrid (\d+)/g)].map((m) => `${m[2]!.replace(/:$/, '')} vrid ${m[3]!}`))];
    t.same(to6, [`${llB} vrid 61`], 'vmnet\'s IPv6 adverts reach its link-local peer unicast');
    t.match(vrrp.logs.find((l) => l.op === 'peers' && l.family === 'IPv6' && l.network === 'vmnet'), { peers: [llB] }, 'vmnet\'s IPv6 router hears only its IPv6 peer');
    // eth1's own address changes (the old one goes): vmnet's adverts follow it.
    await lab.sh(vm, 'sysctl -qw net.ipv4.conf.eth1.promote_secondaries=1 && ip addr add 10.98.0.4/24 dev eth1 && ip addr del 10.98.0.2/24 dev eth1');
    const sources = async (): Promise<string[]> => {
      const r = await lab.exec(clientB, 'timeout', ['0.5', 'tcpdump', '-i', 'eth0', '-nn', '-l', 'ip proto 112'], { allowFail: true, timeoutMs: 5000 });
      return [...new Set([...r.stdout.matchAll(/IP (\S+) > 224\.0\.0\.18: VRRPv3.*vrid 61/g)].map((m) => m[1]!))];
    };
    const after = await waitFor('vmnet\'s adverts from eth1\'s new address', async () => { const x = await sources(); return x.length === 1 && x[0] === '10.98.0.4' ? x : undefined; }, 5000, 0);
    t.same(after, ['10.98.0.4'], 'vmnet\'s adverts leave from eth1\'s new address');
    t.match(vrrp.logs.find((l) => l.op === 'parent-address' && l.ifname === 'eth1'), { from: '10.98.0.2', to: '10.98.0.4' }, 'the change is logged with the NIC');
    t.same(await arpReplies(lab, clientA, bPool), [], 'as Master too, no answer for vmnet\'s VIP on the default network');
    vrrp.signal('SIGTERM');
    t.same(await vrrp.exited, { code: 0, signal: null });
  });
});
