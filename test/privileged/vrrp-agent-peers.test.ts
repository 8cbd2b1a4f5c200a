// Privileged, through the real agent: three agents with failover.peers (each
// lists the other two) on a LAN whose bridge drops every frame to the VRRP
// multicast group (an nft rule in the lab). Unicast adverts elect one Master;
// a valid forged advert at priority 254 from a host that is not a peer
// changes nothing and is counted on every agent; the Master's VM dies and the
// next priority serves the VIP.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { encodeAdvertisement } from '../../agent/failover/codec';
import { parseIPv4 } from '../../agent/address';
import { forge } from './fixtures/failover-client';
import { buildVrrpLab, waitMaster, vrrpStates, metricValue, POOL_VIP, VRID, CLIENT, NODES, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';

t.test('three agents with failover.peers where multicast is dropped: elected by unicast, deaf to a non-peer', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, nodes, client } = await buildVrrpLab(t);
  const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
  await lab.sh(lab.lan, [
    'nft add table bridge lbt_mcast',
    "nft add chain bridge lbt_mcast filter_fwd '{ type filter hook forward priority 0; }'",
    'nft add rule bridge lbt_mcast filter_fwd ether daddr 01:00:5e:00:00:12 counter drop',
  ].join(' && '));
  await Promise.all(nodes.map((n) => n.start({ peers: NODES.filter((d) => d.ip !== n.ip).map((d) => d.ip) })));
  await waitMaster(nodes, n3);
  await n3.waitService('serving the VIP', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
  await new Promise((r) => setTimeout(r, 1000));
  t.same((await vrrpStates(nodes)).map((s) => [s.name, s.status]), [['n1', 'backup'], ['n2', 'backup'], ['n3', 'master']], 'one Master, by unicast alone');
  const dropped = Number(/packets (\d+)/.exec((await lab.sh(lab.lan, 'nft list chain bridge lbt_mcast filter_fwd')).stdout)?.[1] ?? 0);
  t.ok(dropped > 10, `the bridge dropped ${dropped} multicast adverts`);

  const forged = encodeAdvertisement({ vrid: VRID, priority: 254, maxAdverIntCs: 10, addresses: [parseIPv4(POOL_VIP)!], srcIp: parseIPv4(CLIENT)! });
  const REPEAT = 20;
  // Multicast would be dropped by the bridge: the forger sends to each agent's MAC, as a unicast advert would come.
  for (const n of nodes) {
    const mac = (await lab.sh(n.ns, 'cat /sys/class/net/eth0/address')).stdout.trim();
    const frame = encodeAdvertisement({ vrid: VRID, priority: 254, maxAdverIntCs: 10, addresses: [parseIPv4(POOL_VIP)!], srcIp: parseIPv4(CLIENT)!, dstIp: parseIPv4(n.ip)!, dstMac: Buffer.from(mac.replace(/:/g, ''), 'hex') });
    await forge(lab, client, [frame, forged], { repeat: REPEAT, gapMs: 30 });
  }
  await new Promise((r) => setTimeout(r, 1000));
  t.same((await vrrpStates(nodes)).map((s) => [s.name, s.status]), [['n1', 'backup'], ['n2', 'backup'], ['n3', 'master']], 'nothing changed');
  for (const n of nodes) {
    const v = metricValue(await n.metrics(), 'lbagent_vrrp_dropped_total{reason="not-a-peer"}') ?? 0;
    t.equal(v, REPEAT, `${n.name}: ${REPEAT} forged adverts counted as not-a-peer`);
  }
  t.equal((await n3.service('api')).vip, POOL_VIP, 'n3 still serves the VIP');

  const loop = await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { intervalMs: 10, timeoutMs: 300, maxMs: 30_000 });
  await new Promise((r) => setTimeout(r, 500));
  const killedAt = await n3.die();
  await loop.waitServed('an answer after the Master died', killedAt, 10_000);
  await new Promise((r) => setTimeout(r, 1000));
  const g = gapReport(await loop.stop(), killedAt, BACKEND_IDS);
  t.comment(`n3 died -> first answer from n2: ${g.servedAfterMs ?? '?'} ms; ${g.count} requests, gap ${g.gapMs} ms, errors ${JSON.stringify(g.errors)}`);
  t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 2000, 'served again within 2 s');
  t.same((await vrrpStates([n1, n2])).map((s) => [s.name, s.status]), [['n1', 'backup'], ['n2', 'master']], 'n2 took over, n1 follows it');
});
