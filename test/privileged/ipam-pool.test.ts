// Privileged: pool IPAM on a real LAN of namespaces. The pool source takes
// the lowest free address of the pool that applies (kube-vip lookup order),
// honours loadBalancerIP, skips an address another host already answers
// for (RFC 5227 probe), puts the VIP on the parent as /32, and announces it
// so a client's neighbour table learns it without asking. An exhausted pool
// leaves only the extra service pending.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { addressesOf, ipamLab, linkMac, neighbourMac, ping, readClaims, startPoolDriver } from './fixtures/ipam-harness';

if (requirePrivileged(t)) {
  t.test('range-global when no namespace pool exists: lowest free address, /32 on the parent, reachable, announced', async (t) => {
    const lab = await createLab(t);
    const { node, client } = await ipamLab(lab);
    const stateDir = lab.file('state');
    const nodeMac = await linkMac(lab, node);
    const d = startPoolDriver(lab, node, { stateDir, pools: { 'range-global': '10.99.0.200-10.99.0.210', 'range-other': '10.99.0.50-10.99.0.60' }, services: [{ name: 'web' }] });
    const vip = await d.vip('default/web');
    t.equal(vip, '10.99.0.200', 'the lowest address of range-global');
    t.ok((await addressesOf(lab, node)).includes('10.99.0.200/32'), 'on the parent as /32');
    const routes = await lab.exec(node, 'ip', ['-4', 'route', 'show', 'table', 'main']);
    t.notMatch(routes.stdout, /10\.99\.0\.200/, 'no route added to the main table');

    // The gratuitous ARPs alone teach the client where the VIP lives: it has not sent a packet to it.
    const learned = await waitFor('client neighbour entry from gratuitous ARP', () => neighbourMac(lab, client, vip), 5000);
    t.equal(learned, nodeMac, 'the client learned the VIP at the node\'s MAC from the announcements');
    t.ok(await ping(lab, client, vip), 'the VIP answers pings from the client');

    const st = await d.statuses();
    t.match(st['default/web'], { state: 'bound', vip: { address: '10.99.0.200', prefix: 32, ifname: 'eth0', mac: nodeMac }, details: { pool: 'range-global', via: 'lowest-free' } });
    t.match(readClaims(stateDir), { 'default/web': { address: '10.99.0.200', pool: 'range-global' } }, 'claim persisted');
    const m = await d.metrics();
    t.match(m, /lbagent_pool_size\{pool="range-global"\} 11/);
    t.match(m, /lbagent_pool_in_use\{pool="range-global"\} 1/);
    // lbagent_service_vip_info is the daemon's (one writer, its collect over every VIP), not the pool source's.
    t.notMatch(m, /lbagent_service_vip_info/);
    await d.kill('SIGTERM');
  });

  t.test('lookup order per namespace, loadBalancerIP, and a loadBalancerIP outside the pool', async (t) => {
    const lab = await createLab(t);
    const { node } = await ipamLab(lab);
    const stateDir = lab.file('state');
    const d = startPoolDriver(lab, node, {
      stateDir,
      pools: { 'range-global': '10.99.0.200-10.99.0.210', 'range-web': '10.99.0.100-10.99.0.110', 'cidr-api': '10.99.0.96/30', 'range-api': '10.99.0.120-10.99.0.121' },
      services: [
        { name: 'site', namespace: 'web' },
        { name: 'gw', namespace: 'api' },
        { name: 'plain' },
        { name: 'fixed', loadBalancerIP: '10.99.0.205' },
        { name: 'astray', loadBalancerIP: '10.99.0.150' },
      ],
    });
    t.equal(await d.vip('web/site'), '10.99.0.100', 'range-<ns> when the namespace has one');
    t.equal(await d.vip('api/gw'), '10.99.0.97', 'cidr-<ns> before range-<ns>; the network address .96 is skipped');
    t.equal(await d.vip('default/plain'), '10.99.0.200', 'range-global for a namespace without a pool');
    t.equal(await d.vip('default/fixed'), '10.99.0.205', 'loadBalancerIP');
    const astray = await d.state('default/astray', 'failed');
    t.match(astray.reason, /default\/astray/, 'the reason names the service');
    t.match(astray.reason, /10\.99\.0\.150/, 'the IP');
    t.match(astray.reason, /range-global \(10\.99\.0\.200-10\.99\.0\.210\)/, 'and the pool');
    const addrs = await addressesOf(lab, node);
    for (const a of ['10.99.0.100', '10.99.0.97', '10.99.0.200', '10.99.0.205']) t.ok(addrs.includes(`${a}/32`), `${a}/32 on the parent`);
    t.notOk(addrs.some((a) => a.startsWith('10.99.0.150')), 'nothing added for the service in error');
    t.same(Object.keys(readClaims(stateDir) ?? {}).sort(), ['api/gw', 'default/fixed', 'default/plain', 'web/site'], 'no claim for the service in error');
    await d.kill('SIGTERM');
  });

  t.test('an address another host already holds is probed, skipped, and the next one claimed', async (t) => {
    const lab = await createLab(t);
    const { node, other, client } = await ipamLab(lab);
    await lab.sh(other, 'ip addr add 10.99.0.200/24 dev eth0');
    const otherMac = await linkMac(lab, other);
    const stateDir = lab.file('state');
    const d = startPoolDriver(lab, node, { stateDir, pools: { 'range-global': '10.99.0.200-10.99.0.210' }, services: [{ name: 'web' }] });
    t.equal(await d.vip('default/web'), '10.99.0.201', 'the second address of the range');
    t.notOk((await addressesOf(lab, node)).includes('10.99.0.200/32'), 'the taken address never went on the parent');
    const st = (await d.statuses())['default/web']!;
    t.match(st.details, { conflicts: 1, lastConflict: { address: '10.99.0.200', mac: otherMac, phase: 'probe' } }, 'status shows the conflict and who holds the address');
    t.match(await d.metrics(), /lbagent_pool_conflicts_total\{pool="range-global"\} 1/);
    // The other host still owns .200: the client reaches it there, and the VIP at the node.
    t.equal(await waitFor('client resolves .200', async () => (await ping(lab, client, '10.99.0.200')) && neighbourMac(lab, client, '10.99.0.200'), 5000), otherMac);
    t.ok(await ping(lab, client, '10.99.0.201'), 'the VIP answers');
    await d.kill('SIGTERM');
  });

  t.test('an exhausted pool: the extra service is pending with the reason while the others serve', async (t) => {
    const lab = await createLab(t);
    const { node, client } = await ipamLab(lab);
    const stateDir = lab.file('state');
    const d = startPoolDriver(lab, node, {
      stateDir,
      pools: { 'range-global': '10.99.0.200-10.99.0.201', 'range-web': '10.99.0.100-10.99.0.100' },
      services: [{ name: 'a' }, { name: 'b' }, { name: 'c' }, { name: 'site', namespace: 'web' }],
    });
    const pending = await d.state('default/c', 'pending');
    t.match(pending.reason, /default\/c/);
    t.match(pending.reason, /range-global \(10\.99\.0\.200-10\.99\.0\.201\) has no free address/);
    const a = await d.vip('default/a');
    const b = await d.vip('default/b');
    t.same([a, b].sort(), ['10.99.0.200', '10.99.0.201'], 'the others got the two addresses');
    t.equal(await d.vip('web/site'), '10.99.0.100', 'another pool is unaffected');
    for (const v of [a, b, '10.99.0.100']) t.ok(await ping(lab, client, v), `${v} serves`);
    const st = await d.statuses();
    t.equal(st['default/c']!.state, 'pending', 'still pending');
    t.equal(st['default/c']!.vip, undefined);
    const m = await d.metrics();
    t.match(m, /lbagent_pool_in_use\{pool="range-global"\} 2/);
    t.match(m, /lbagent_pool_size\{pool="range-global"\} 2/);

    // Removing a service frees its address for the pending one.
    const from = d.events.length;
    d.send({ cmd: 'stop', service: 'default/b', release: true });
    t.equal(await d.vip('default/c', 10_000, from), b, 'the pending service takes the released address');
    t.notOk(readClaims(stateDir)?.['default/b'], 'the removed service\'s claim is gone');
    t.equal(readClaims(stateDir)?.['default/c']?.address, b);
    await d.kill('SIGTERM');
  });
}
