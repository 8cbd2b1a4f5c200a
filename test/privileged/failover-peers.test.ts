// Issue 15, VRRP without authentication, asserted the other way with
// failover.peers: a valid forged advert at priority 254 from a host that is
// not a peer changes nothing and is counted (reason not-a-peer); and with
// multicast dropped on the LAN by an nft rule on the lab bridge, unicast
// adverts to the peers keep one Master, fail over when it dies, and let it
// preempt again when it comes back.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { encodeAdvertisement } from '../../agent/failover/codec';
import { masterDownIntervalMs } from '../../agent/failover/machine';
import { parseIPv4 } from '../../agent/address';
import { RouterProc, forge, masters } from './fixtures/failover-client';

const INTERVAL = 0.2;
const R1 = '10.99.0.11';
const R2 = '10.99.0.12';
const EVIL = '10.99.0.66';
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

t.test('with failover.peers, a forged advert from another host changes nothing and is counted', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const n1 = await lab.addHost('r1', { address: `${R1}/24` });
  const n2 = await lab.addHost('r2', { address: `${R2}/24` });
  const evil = await lab.addHost('evil', { address: `${EVIL}/24` });
  const r1 = await RouterProc.start(lab, n1, 'r1', { srcIp: R1, priority: 150, interval: INTERVAL, peers: [R2] });
  await r1.waitEvent('master', (e) => e.event === 'master');
  const r2 = await RouterProc.start(lab, n2, 'r2', { srcIp: R2, priority: 100, interval: INTERVAL, peers: [R1] });
  await r2.waitEvent('follows r1', (e) => e.event === 'master-changed' && e.master === R1);
  const from1 = r1.events.length;
  const from2 = r2.events.length;
  const REPEAT = 20;
  const forged = encodeAdvertisement({ vrid: 51, priority: 254, maxAdverIntCs: 20, addresses: [parseIPv4('10.99.0.100')!], srcIp: parseIPv4(EVIL)! });
  const sent = await forge(lab, evil, [forged], { repeat: REPEAT, gapMs: 50 });
  t.equal(sent, REPEAT);
  await sleep(1500); // several Master_Down_Intervals: a forged 254 that got through would show
  t.equal(r1.state, 'master', 'r1 is still Master');
  t.equal(r2.state, 'backup', 'r2 is still Backup');
  t.equal(r2.master, R1, 'r2 still follows r1');
  for (const [r, from] of [[r1, from1], [r2, from2]] as const) {
    t.same(r.events.slice(from).filter((e) => e.event !== 'dropped').map((e) => e.event), [], `${r.name}: no transition, no master change`);
    t.equal(await r.metric('lbagent_vrrp_dropped_total{reason="not-a-peer"}'), REPEAT, `${r.name}: ${REPEAT} forged adverts counted as not-a-peer`);
  }

  // Control: the same advert from a peer's address would be obeyed (the drop was the peer check, not the path).
  const r3 = await RouterProc.start(lab, evil, 'r3', { srcIp: EVIL, priority: 100, interval: INTERVAL });
  await r3.waitEvent('r3, without peers, follows r1', (e) => e.event === 'master-changed' && e.master === R1);
  const OTHER = '10.99.0.77';
  await forge(lab, n2, [encodeAdvertisement({ vrid: 51, priority: 254, maxAdverIntCs: 20, addresses: [parseIPv4('10.99.0.100')!], srcIp: parseIPv4(OTHER)! })]);
  await r3.waitEvent('r3 follows a forged 254', (e) => e.event === 'master-changed' && e.master === OTHER, 3000);
  t.pass('a router without peers obeys the same forged advert');
});

t.test('with failover.peers, failover works where the LAN drops multicast', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const n1 = await lab.addHost('r1', { address: `${R1}/24` });
  const n2 = await lab.addHost('r2', { address: `${R2}/24` });
  // The LAN filters multicast: the bridge drops every frame to the VRRP group MAC, and counts them.
  await lab.sh(lab.lan, [
    'nft add table bridge lbt_mcast',
    "nft add chain bridge lbt_mcast filter_fwd '{ type filter hook forward priority 0; }'",
    'nft add rule bridge lbt_mcast filter_fwd ether daddr 01:00:5e:00:00:12 counter drop',
  ].join(' && '));
  const dropped = async (): Promise<number> => Number(/packets (\d+)/.exec((await lab.sh(lab.lan, 'nft list chain bridge lbt_mcast filter_fwd')).stdout)?.[1] ?? -1);

  const r1 = await RouterProc.start(lab, n1, 'r1', { srcIp: R1, priority: 150, interval: INTERVAL, peers: [R2] });
  await r1.waitEvent('r1 master', (e) => e.event === 'master');
  const r2 = await RouterProc.start(lab, n2, 'r2', { srcIp: R2, priority: 100, interval: INTERVAL, peers: [R1] });
  await r2.waitEvent('r2 follows r1 over unicast', (e) => e.event === 'master-changed' && e.master === R1, 10_000);
  await sleep(2000); // ten adverts: r2 would have taken over after 0.6 s without them
  t.equal(r2.state, 'backup', 'r2 stays Backup');
  t.same(masters([r1, r2]).map((r) => r.name), ['r1'], 'one Master');
  t.ok(await dropped() > 5, `the bridge dropped ${await dropped()} multicast adverts`);
  t.ok(await r2.metric('lbagent_vrrp_adverts_received_total{vrid="51"}') >= 8, 'r2 hears r1 by unicast');

  // r1 dies without a word (no priority-0 advert): r2 takes over after Master_Down_Interval.
  const t0 = Date.now();
  await r1.kill('SIGKILL');
  const took = await r2.waitEvent('r2 takes over', (e) => e.event === 'master', 5000);
  const mdi = masterDownIntervalMs(100, INTERVAL * 100);
  t.ok(took.t - t0 < mdi + 500, `r2 Master ${took.t - t0} ms after r1 died (Master_Down_Interval ${mdi} ms)`);

  // r1 comes back at 150 and preempts, heard by unicast alone.
  const from2 = r2.events.length;
  const r1b = await RouterProc.start(lab, n1, 'r1b', { srcIp: R1, priority: 150, interval: INTERVAL, peers: [R2] });
  await r1b.waitEvent('r1 master again', (e) => e.event === 'master', 5000);
  await r2.waitEvent('r2 yields to r1', (e) => e.event === 'backup', 5000, from2);
  await sleep(1000);
  t.same(masters([r1b, r2]).map((r) => r.name), ['r1b'], 'one Master after preemption');
});
