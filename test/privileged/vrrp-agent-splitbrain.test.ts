// Privileged, through the real agent: split brain. Three agent "VMs"
// (priorities 100/150/200) serve one pool VIP. The Master (n3) is cut off
// the LAN (its bridge port taken out of the bridge: it hears nobody and
// nobody hears it); n2 becomes Master too and serves the VIP to the client.
// When the partition heals, n2 hears n3's higher priority while Master and
// yields at once (RFC 5798 §6.4.3): it withdraws the VIP; n3 keeps it. Both
// count the split brain (lbagent_vrrp_split_brain_total, status) and log it;
// afterwards exactly one node has the VIP and the client is served.
// Then the case no re-announcement on hearing a second Master covers: the
// loser yields before the winner ever hears it (here n3 is kept from
// hearing n2's adverts). Only the periodic refresh (arp.refreshInterval)
// brings the client's ARP entry back to the winner: measured with the
// refresh on and off.
import t, { type Test } from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { DEFAULT_ARP } from '../../agent/config/defaults';
import { waitFor } from '../../lab/netns';
import { neighbourMac } from './fixtures/ipam-harness';
import { buildVrrpLab, bridgePort, waitMaster, logAfter, logTime, metricValue, FAST_ARP, POOL_VIP, VRID, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';

/**
 * n2 and n3 only; n3 (the winner) never hears n2's adverts. Partition n3,
 * let n2 serve the client, heal: n2 yields at once, n3 never sees a second
 * Master. Returns when (ms after the heal) the client's ARP entry for the VIP
 * pointed at n3, or undefined if not within watchMs.
 */
async function loserYieldsFirst(t: Test, refreshInterval: number | undefined, watchMs: number): Promise<number | undefined> {
  const { lab, nodes, client } = await buildVrrpLab(t);
  const n2 = nodes[1]!;
  const n3 = nodes[2]!;
  // undefined: the default (DEFAULT_ARP.refreshInterval), as a user gets it.
  const arp = refreshInterval === undefined ? { ...FAST_ARP } : { ...FAST_ARP, refreshInterval };
  await n3.start({ arp });
  await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
  await n2.start({ arp });
  await waitMaster([n2, n3], n3);
  const mac = async (n: typeof n2): Promise<string> => (await lab.sh(n.ns, 'cat /sys/class/net/eth0/address')).stdout.trim();
  const [n2mac, n3mac] = [await mac(n2), await mac(n3)];
  // The bridge drops VRRP from n2 towards n3's port: n3 cannot hear n2 as Master.
  const port3 = await bridgePort(lab, n3.ns);
  await lab.sh(lab.lan, `nft add table bridge splitbrain && nft 'add chain bridge splitbrain out { type filter hook forward priority 0; }' `
    + `&& nft add rule bridge splitbrain out oifname ${port3} ip saddr ${n2.ip} ip protocol 112 drop`);

  await n3.partition(true);
  await n2.waitService('Master during the partition', 'api', (s) => s.failover?.state === 'master' && s.state === 'serving', 10_000);
  const loop = await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { intervalMs: 20, timeoutMs: 300, maxMs: 60_000 });
  await waitFor("the client's ARP entry at n2", async () => (await neighbourMac(lab, client, POOL_VIP)) === n2mac, 5000);

  const healAt = Date.now();
  await n3.partition(false);
  let reachedAt: number | undefined;
  for (let i = 0; i < 2000 && Date.now() < healAt + watchMs; i++) {
    if ((await neighbourMac(lab, client, POOL_VIP)) === n3mac) { reachedAt = Date.now(); break; }
    await new Promise((r) => setTimeout(r, 20));
  }
  await waitMaster([n2, n3], n3, 'api', 5000);
  t.ok(logAfter(n2, healAt, (l) => l.op === 'split-brain' && l.resolution === 'yielded'), 'n2 heard n3 and yielded');
  t.notOk(logAfter(n3, healAt, (l) => l.op === 'split-brain'), 'n3 never heard n2 as a second Master: no re-announcement on that account');
  t.notOk(logAfter(n3, healAt, (l) => l.op === 'give-up'), 'the winner never gave its VIP up over an ARP conflict (RFC 5227 §2.4 (c) under VRRP)');
  t.equal((await n3.service('api')).vip, POOL_VIP, 'the winner holds the VIP');
  const g = gapReport(await loop.stop(), healAt, BACKEND_IDS);
  t.same(g.wrongBodies, [], 'every answer came from a backend');
  t.comment(`refreshInterval ${refreshInterval ?? `default (${DEFAULT_ARP.refreshInterval})`} s: client's ARP entry at the winner ${reachedAt === undefined ? `not within ${watchMs} ms` : `${reachedAt - healAt} ms`} after the heal; `
    + `client: ${g.count} requests, errors ${JSON.stringify(g.errors)}`);
  return reachedAt === undefined ? undefined : reachedAt - healAt;
}

if (requirePrivileged(t)) {
  t.test('split brain: after the partition heals the lower priority yields at once and withdraws its VIP', async (t) => {
    const { lab, nodes, client } = await buildVrrpLab(t);
    const [n1, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all(nodes.map((n) => n.start()));
    await waitMaster(nodes, n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP);
    const hasVip = async (n: typeof n1): Promise<boolean> => (await lab.sh(n.ns, 'ip -o -4 addr show dev eth0')).stdout.includes(`${POOL_VIP}/32`);

    await n3.partition(true);
    await n2.waitService('Master during the partition', 'api', (s) => s.failover?.state === 'master' && s.state === 'serving', 10_000);
    const s3 = await n3.service('api');
    t.equal((s3.failover as Record<string, unknown>).state, 'master', 'n3, cut off, is still Master: two Masters');
    t.ok(await hasVip(n3) && await hasVip(n2), 'both hold the VIP');
    // The client (on n2's side) is served by n2.
    const loop = await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { intervalMs: 10, timeoutMs: 300, maxMs: 30_000 });
    await new Promise((r) => setTimeout(r, 300));

    const healAt = Date.now();
    await n3.partition(false);
    await waitMaster(nodes, n3, 'api', 5000);
    const yielded = logAfter(n2, healAt, (l) => l.op === 'split-brain' && l.resolution === 'yielded');
    const backup = logAfter(n2, healAt, (l) => l.op === 'transition' && l.to === 'backup');
    const removed = logAfter(n2, healAt, (l) => l.op === 'remove-address');
    const kept = logAfter(n3, healAt, (l) => l.op === 'split-brain' && l.resolution === 'kept');
    t.ok(yielded, 'n2 logged the split brain and that it yields');
    t.equal(backup?.reason, 'higher-priority', 'n2 went Backup on hearing the higher priority');
    t.ok(removed, 'n2 withdrew the VIP');
    t.comment(`heal -> n2 Backup: ${backup ? logTime(backup) - healAt : '?'} ms; -> n2 withdrew the VIP: ${removed ? logTime(removed) - healAt : '?'} ms`
      + `${kept ? `; n3 heard n2 as another Master too (kept) at ${logTime(kept) - healAt} ms` : ''}`);
    t.ok(backup && logTime(backup) - healAt < 1000, 'at once (well within a second of the heal)');
    t.notOk(await hasVip(n2), 'n2 no longer has the VIP');
    t.ok(await hasVip(n3), 'n3 kept it');
    t.notOk(await hasVip(n1), 'n1 never had it');

    const m2 = await n2.metrics();
    t.ok((metricValue(m2, `lbagent_vrrp_split_brain_total{vrid="${VRID}"}`) ?? 0) >= 1, 'lbagent_vrrp_split_brain_total counts it on n2');
    const f2 = (await n2.service('api')).failover as { splitBrains: number; lastSplitBrain?: { peer: string; resolution: string } };
    t.ok(f2.splitBrains >= 1, 'status counts it');
    t.same([f2.lastSplitBrain?.peer, f2.lastSplitBrain?.resolution], [n3.ip, 'yielded'], 'status names the peer and the resolution');
    t.equal((await n2.service('api')).state, 'backup');

    await new Promise((r) => setTimeout(r, 1000));
    const g = gapReport(await loop.stop(), healAt, BACKEND_IDS);
    const neigh = await lab.sh(client, `ip neigh show ${POOL_VIP}`);
    // Cut off, n3 saw every backend fail its health checks: until they pass
    // again after the heal, n3 (the Master) refuses new connections.
    const up = logAfter(n3, healAt, (l) => l.module === 'health' && l.op === 'transition' && /is up/.test(String(l.msg)));
    t.comment(`client across the heal: ${g.count} requests, errors ${JSON.stringify(g.errors)}; n3 saw a backend up again ${up ? logTime(up) - healAt : '?'} ms after the heal; `
      + `client's ARP entry for the VIP now: ${neigh.stdout.trim()} (n3 is ${(await lab.sh(n3.ns, 'cat /sys/class/net/eth0/address')).stdout.trim()})`);
    const n3mac = (await lab.sh(n3.ns, 'cat /sys/class/net/eth0/address')).stdout.trim();
    if (kept) {
      // n3 heard n2 as a second Master and kept its role: it re-announces its
      // VIP, so the client stops sending to n2's MAC.
      t.match(neigh.stdout, `lladdr ${n3mac}`, "after the split brain n3 re-announced: the client's ARP entry points at n3");
    } else {
      t.comment('n2 yielded before n3 heard it as Master: only the refresh (arp.refreshInterval, 10 s here) re-announces; the tests below measure that case');
    }
    t.same(g.wrongBodies, [], 'every answer came from a backend');
    const tail = (await loop.stop()).filter((r) => r.t >= healAt + 500);
    t.ok(tail.length > 0 && tail.every((r) => r.ok), 'half a second after the heal every request is answered');
  });
}

if (requirePrivileged(t)) {
  t.test('the loser yields first: with arp.refreshInterval 2 s the client reaches the winner within 2 s', async (t) => {
    const ms = await loserYieldsFirst(t, 2, 6000);
    // A refresh is due at most 2 s after the heal; 0.3 s of slack for the poll and a loaded machine.
    t.ok(ms !== undefined && ms <= 2300, `the client's ARP entry points at the winner ${ms ?? 'never'} ms after the heal`);
  });

  t.test('the loser yields first: with the default refresh the client reaches the winner within it', async (t) => {
    const ms = await loserYieldsFirst(t, undefined, DEFAULT_ARP.refreshInterval * 1000 + 3000);
    t.ok(ms !== undefined && ms <= DEFAULT_ARP.refreshInterval * 1000 + 300, `the client's ARP entry points at the winner ${ms ?? 'never'} ms after the heal (refresh ${DEFAULT_ARP.refreshInterval} s)`);
  });

  t.test('the loser yields first: without the refresh the client stays on the loser', async (t) => {
    const ms = await loserYieldsFirst(t, 0, 12_000);
    t.equal(ms, undefined, 'refresh off: 12 s after the heal the client still sends to the loser\'s MAC (known gap the refresh closes)');
  });
}
