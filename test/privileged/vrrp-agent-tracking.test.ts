// Privileged, through the real agent: ownership that follows health
// (failover.track). Two agent "VMs" with two NICs each (lab/tracking.ts):
// VRRP adverts on the management bridge, the VIP, its backends and the
// client on the VM network; n3 (200) is Master, n2 (150) Backup. The VM
// network NIC is tracked without a weight (fault), the service with weight
// 60 below two healthy backends, failAfter 1 s, recoverAfter 1 s.
// - a backend flapping every 300 ms on the Master (its health checks see it
//   go down and up) moves nothing;
// - the Master loses reach to every backend while the Backup reaches them:
//   its priority drops to 140, the Backup takes the VIP; reach returns and
//   it takes it back (preempt on);
// - the Master's VM-network NIC loses carrier while adverts go on over the
//   management NIC: it resigns (fault) and the Backup serves the VIP within
//   the failover time (a client loop every 20 ms counts the gap);
// - preempt off: the VIP moves on the loss and stays where it went when
//   reach returns.
// - the VM network named in networks: (its router on the management NIC,
//   VRID 51, its tracks under networks.vmnet.failover.track) beside the
//   default network's router (VRID 50, untracked, the service mgmt): the
//   carrier loss moves api's VIP the same way, mgmt's stays;
// - a reload adds to vmnet a track that already fails: api's VIP moves with
//   no restart while mgmt's serves a client every 20 ms without a failure;
//   a reload removes it and the VIP comes back (preempt on).
// The priority in use and why, in status, metrics and the event history.
import t, { type Test } from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor, type Lab } from '../../lab/netns';
import { metricValue, logAfter, logTime, VRID, BACKEND_IDS } from '../../lab/vrrp';
import { buildTrackingLab, MGMT_VIP, VM_NET_VIP, VM_NET_BACKENDS, type TrackingNode } from '../../lab/tracking';
import { gapReport, ClientLoop } from '../../lab/client-loop';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

type F = { state?: string; master?: string; vrid?: number; network?: string; priority?: number; basePriority?: number; priorityReasons?: string[]; tracks?: { track: string; network: string; failing: boolean }[] };
async function failover(n: TrackingNode, service = 'api'): Promise<F> {
  const f: F = (await n.service(service)).failover ?? {};
  return f;
}

/** Wait until `who` is Master and serving the VIP, `other` not Master. */
async function waitServing(who: TrackingNode, other: TrackingNode, what: string, timeoutMs = 10_000): Promise<void> {
  const since = Date.now() - 2000;
  // On a timeout, what both elections did, for the report.
  const trail = (n: TrackingNode): string => JSON.stringify(n.logs().filter((l) => logTime(l) >= since && (l.module === 'failover' || l.op === 'failover'))
    .map((l) => ({ t: logTime(l) - since, op: l.op, to: l.to, reason: l.reason, from: l.from, master: l.master, msg: l.msg })));
  await waitFor(`${who.name} Master serving the VIP (${what})`, async () => {
    const s = await who.service('api');
    const o = await failover(other);
    return s.state === 'serving' && s.vip === VM_NET_VIP && (s.failover as F).state === 'master' && o.state !== 'master';
  }, timeoutMs, 20).catch((e: Error) => { throw new Error(`${e.message}\n${who.name}: ${trail(who)}\n${other.name}: ${trail(other)}`); });
}

/** Log lines of the gate's priority changes since `since`. */
const priorityChanges = (n: TrackingNode, since: number): Record<string, unknown>[] =>
  n.logs().filter((l) => l.op === 'priority' && Array.isArray(l.reasons) && logTime(l) >= since);

/**
 * n3, Master, loses its VM-network NIC's carrier while adverts go on over
 * the management NIC: it resigns (fault) and n2 serves the VIP within the
 * failover time, a client loop every 20 ms counting the gap; the carrier
 * comes back and n3 takes the VIP back (preempt on).
 */
async function carrierLoss(t: Test, n2: TrackingNode, n3: TrackingNode, lab: Lab, client: string, during?: () => Promise<void>): Promise<void> {
  const loop = await ClientLoop.start(lab, client, `http://${VM_NET_VIP}/`, { intervalMs: 20, timeoutMs: 300, maxMs: 40_000 });
  try {
    await sleep(300);
    const lostAt = await n3.cutCarrier(true);
    await loop.waitServed('an answer after the carrier loss', lostAt, 10_000);
    await sleep(1000);
    const g = gapReport(await loop.stop(), lostAt, BACKEND_IDS);
    const fault = logAfter(n3, lostAt, (l) => l.op === 'transition' && l.to === 'fault');
    const took = logAfter(n2, lostAt, (l) => l.op === 'transition' && l.to === 'master');
    t.comment(`failures: ${JSON.stringify(g.failures.map((f) => [f.t - lostAt, f.error]))}`);
    t.comment(`carrier lost -> n3 fault ${fault ? logTime(fault) - lostAt : '?'} ms -> n2 Master ${took ? logTime(took) - lostAt : '?'} ms -> first answer ${g.servedAfterMs ?? '?'} ms; client: ${g.count} requests, gap ${g.gapMs} ms, errors ${JSON.stringify(g.errors)}`);
    t.ok(fault, 'n3 went to fault (eth1 is tracked without a weight)');
    t.equal(took?.reason, 'master-resigned', 'n2 took over from a resignation (priority 0), not a timeout');
    t.equal((await failover(n3)).state, 'fault');
    t.match((await n3.service('api')).reason, /VRRP fault, out of the election: interface eth1: no carrier \(fault\)/);
    t.equal((await failover(n2)).master, n2.ip, 'adverts still cross the management NIC: n2 is the one Master');
    t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 1500, `served by n2 within 1.5 s (${g.servedAfterMs ?? '?'} ms)`);
    t.equal(g.gaps, 1, 'one gap, answers on either side');
    t.same(g.wrongBodies, []);
    t.equal((await n2.service('api')).state, 'serving');
    await during?.();
  } finally {
    await loop.stop().catch(() => undefined);
    await n3.cutCarrier(false);
  }
  await waitServing(n3, n2, 'carrier back, preempt on');
  t.equal((await failover(n3)).priority, 200);
}

if (requirePrivileged(t)) {
  t.test('ownership follows health: two agents, a management NIC and a VM-network NIC each', async (t) => {
    const { lab, nodes: [n2, n3], client } = await buildTrackingLab(t);
    t.teardown(async () => { for (const n of [n2, n3]) if (n.alive) { n.agent!.signal('SIGKILL'); await n.agent!.exited; } });
    await n3.startTracking();
    await n3.waitService('Master', 'api', (s) => (s.failover as F | undefined)?.state === 'master');
    await n2.startTracking();
    await waitServing(n3, n2, 'start');
    await n2.waitService('Backup following n3', 'api', (s) => (s.failover as F | undefined)?.master === n3.ip);

    t.test('status and metrics show the priority in use and the tracks', async (t) => {
      const f = await failover(n3);
      t.equal(f.priority, 200);
      t.equal(f.basePriority, 200);
      t.same(f.priorityReasons, []);
      t.same(f.tracks?.map((x) => [x.track, x.failing]), [['interface eth1', false], ['service default/api', false]]);
      const m = await n3.metrics();
      t.equal(metricValue(m, `lbagent_vrrp_priority{vrid="${VRID}"}`), 200);
      t.equal(metricValue(m, `lbagent_vrrp_base_priority{vrid="${VRID}"}`), 200);
      t.equal(metricValue(m, 'lbagent_vrrp_track_failing{track="interface eth1"}'), 0);
      t.equal(metricValue(m, 'lbagent_vrrp_track_failing{track="service default/api"}'), 0);
    });

    t.test('a backend flapping every 300 ms on the Master moves nothing', async (t) => {
      const since = Date.now();
      const m0 = await n3.metrics();
      try {
        for (let i = 0; i < 14; i++) {
          await n3.cutReach([VM_NET_BACKENDS[0]], i % 2 === 0);
          await sleep(300);
        }
      } finally {
        await n3.cutReach([VM_NET_BACKENDS[0]], false);
      }
      // Past recoverAfter, so that a change still pending would have shown.
      await sleep(1500);
      const downs = n3.logs().filter((l) => l.op === 'transition' && l.backend !== undefined && l.to === 'down' && logTime(l) >= since);
      const pending = n3.logs().filter((l) => l.track === 'service default/api' && l.waitMs !== undefined && l.observed === 'failing' && logTime(l) >= since);
      t.comment(`flap: b1 went down ${downs.length} times on n3; the track saw a shortage ${pending.length} times`);
      t.ok(downs.length >= 3, `the health checks saw the backend go down (${downs.length} times): the flap was real`);
      t.ok(pending.length >= 3, `and the track saw the shortage begin each time (${pending.length})`);
      t.same(priorityChanges(n3, since), [], 'the priority never changed');
      t.equal((await failover(n3)).state, 'master', 'n3 is still Master');
      t.equal((await failover(n2)).state, 'backup', 'n2 is still Backup');
      const m1 = await n3.metrics();
      const sample = `lbagent_vrrp_transitions_total{vrid="${VRID}",to="backup"}`;
      t.equal(metricValue(m1, sample) ?? 0, metricValue(m0, sample) ?? 0, 'no transition');
      t.equal(metricValue(m1, `lbagent_vrrp_priority_changes_total{vrid="${VRID}"}`) ?? 0, 0);
    });

    t.test('the Master loses reach to every backend: the VIP moves to the Backup, and back when reach returns (preempt on)', async (t) => {
      const loop = await ClientLoop.start(lab, client, `http://${VM_NET_VIP}/`, { intervalMs: 20, timeoutMs: 300, maxMs: 40_000 });
      t.teardown(() => n3.cutReach(VM_NET_BACKENDS, false));
      try {
        await sleep(300);
        const cutAt = await n3.cutReach(VM_NET_BACKENDS, true);
        await waitServing(n2, n3, 'after the Master lost its backends');
        const f3 = await failover(n3);
        t.equal(f3.priority, 140, 'n3 advertises 200 - 60');
        t.same(f3.priorityReasons, ['service default/api: 0 of 2 backends healthy, 2 needed (-60)']);
        t.equal(f3.state, 'backup');
        const lowered = priorityChanges(n3, cutAt)[0];
        const took = logAfter(n2, cutAt, (l) => l.op === 'transition' && l.to === 'master');
        t.equal(took?.reason, 'preempt', 'n2 preempted the lowered Master');
        await loop.waitServed('an answer through n2', cutAt, 10_000);
        const events = (await n3.status()).events.filter((e) => e.kind === 'vrrp-priority');
        t.match(events.at(-1)?.reason ?? '', /VRID 51: priority 200 -> priority 140 \(configured 200\): service default\/api/, 'the change is an event');
        t.equal(metricValue(await n3.metrics(), 'lbagent_vrrp_track_failing{track="service default/api"}'), 1);
        t.comment(`reach lost -> priority lowered ${lowered ? logTime(lowered) - cutAt : '?'} ms (failAfter 1 s) -> n2 Master ${took ? logTime(took) - cutAt : '?'} ms`);

        const backAt = await n3.cutReach(VM_NET_BACKENDS, false);
        await waitServing(n3, n2, 'reach returned, preempt on');
        t.equal((await failover(n3)).priority, 200, 'back at the configured priority');
        const restored = priorityChanges(n3, backAt)[0];
        t.same(restored?.reasons, [], 'with no reason left');

        // n3 preempted n2 back, so it has heard n2 (150): lowered to 140
        // again, it steps down, withdraws, and resigns with priority 0.
        const againAt = await n3.cutReach(VM_NET_BACKENDS, true);
        await waitServing(n2, n3, 'the Master lost its backends again');
        const down = logAfter(n3, againAt, (l) => l.op === 'transition' && l.to === 'backup');
        t.equal(down?.reason, 'stepped-down', 'n3 stepped down instead of waiting to be preempted');
        const took2 = logAfter(n2, againAt, (l) => l.op === 'transition' && l.to === 'master');
        t.equal(took2?.reason, 'master-resigned', 'n2 took over on its resignation');
        const withdrawn = logAfter(n3, againAt, (l) => l.op === 'remove-address');
        const bound = logAfter(n2, againAt, (l) => l.op === 'bound');
        t.ok(withdrawn && bound && logTime(withdrawn) < logTime(bound), 'n3 took the VIP off before n2 put it on');
        t.comment(`reach lost again -> n3 stepped down ${down ? logTime(down) - againAt : '?'} ms -> withdrawn ${withdrawn ? logTime(withdrawn) - againAt : '?'} ms -> n2 Master ${took2 ? logTime(took2) - againAt : '?'} ms -> bound ${bound ? logTime(bound) - againAt : '?'} ms`);
        await n3.cutReach(VM_NET_BACKENDS, false);
        await waitServing(n3, n2, 'reach returned again, preempt on');
        await sleep(500);
        const g = gapReport(await loop.stop(), backAt, BACKEND_IDS);
        t.same(g.wrongBodies, [], 'every answer came from a backend');
        t.comment(`reach back -> priority restored ${restored ? logTime(restored) - backAt : '?'} ms (recoverAfter 1 s); client: ${g.count} requests, errors ${JSON.stringify(g.errors)}`);
      } finally {
        await loop.stop().catch(() => undefined);
      }
    });

    t.test('the Master\'s VM-network NIC loses carrier: the Backup takes the VIP within the failover time', (t) => carrierLoss(t, n2, n3, lab, client));

    t.test('preempt off: the VIP moves on the loss, and stays where it went when reach returns', async (t) => {
      for (const n of [n2, n3]) { n.agent!.signal('SIGTERM'); await n.agent!.exited; }
      await n3.startTracking({ preempt: false });
      await n3.waitService('Master', 'api', (s) => (s.failover as F | undefined)?.state === 'master');
      await n2.startTracking({ preempt: false });
      await waitServing(n3, n2, 'start, preempt off');
      await n2.waitService('Backup following n3', 'api', (s) => (s.failover as F | undefined)?.master === n3.ip);
      t.teardown(() => n3.cutReach(VM_NET_BACKENDS, false));
      const cutAt = await n3.cutReach(VM_NET_BACKENDS, true);
      await waitServing(n2, n3, 'preempt off, the Master lost its backends');
      t.equal(logAfter(n2, cutAt, (l) => l.op === 'transition' && l.to === 'master')?.reason, 'preempt', 'n2 took over from a Master whose priority fell below its own');
      const backAt = await n3.cutReach(VM_NET_BACKENDS, false);
      await n3.waitService('priority restored', 'api', (s) => (s.failover as F | undefined)?.priority === 200);
      // Several Master_Down_Intervals at priority 200 behind n2 (150).
      await sleep(1500);
      t.equal((await failover(n3)).state, 'backup', 'n3 (200 again) stays Backup');
      t.equal((await failover(n3)).master, n2.ip);
      t.equal((await failover(n2)).state, 'master', 'n2 keeps the VIP');
      t.equal((await n2.service('api')).state, 'serving');
      t.notOk(logAfter(n3, backAt, (l) => l.op === 'transition' && l.to === 'master'), 'n3 never took it back');
    });

    t.test('on a named network (networks.vmnet, its router on the management NIC): its own track moves api\'s VIP on the carrier loss, the default network\'s VIP stays', async (t) => {
      for (const n of [n2, n3]) { n.agent!.signal('SIGTERM'); await n.agent!.exited; }
      await n3.startTracking({ network: 'vmnet' });
      await n3.waitService('Master', 'api', (s) => (s.failover as F | undefined)?.state === 'master');
      await n2.startTracking({ network: 'vmnet' });
      await waitServing(n3, n2, 'start on vmnet');
      await n2.waitService('Backup following n3', 'api', (s) => (s.failover as F | undefined)?.master === n3.ip);
      await n3.waitService('mgmt Master', 'mgmt', (s) => s.state === 'serving' && (s.failover as F | undefined)?.state === 'master');
      t.match(await failover(n3), { network: 'vmnet', vrid: VRID, state: 'master' }, 'api rides vmnet\'s router');
      t.same((await failover(n3)).tracks?.map((x) => [x.network, x.track]), [['vmnet', 'interface eth1'], ['vmnet', 'service default/api']], 'vmnet\'s tracks, each saying whose routers it lowers');
      t.match(await failover(n3, 'mgmt'), { network: 'default', vrid: 50, state: 'master', priority: 200, tracks: [] }, 'mgmt rides the default network\'s router, untracked');
      t.equal(metricValue(await n3.metrics(), 'lbagent_vrrp_track_failing{track="interface eth1",network="vmnet"}'), 0, 'the gauge names the network');
      const since = Date.now();
      await carrierLoss(t, n2, n3, lab, client, async () => {
        const m = await failover(n3, 'mgmt');
        t.match(m, { state: 'master', priority: 200 }, 'while vmnet\'s router is in fault, the default network\'s stays Master at its priority');
        t.equal((await n3.service('mgmt')).vip, MGMT_VIP, 'and n3 keeps mgmt\'s VIP');
        t.equal((await failover(n2, 'mgmt')).state, 'backup');
        t.equal(metricValue(await n3.metrics(), 'lbagent_vrrp_track_failing{track="interface eth1",network="vmnet"}'), 1);
      });
      const changes = priorityChanges(n3, since);
      t.ok(changes.length >= 2, `vmnet's router went to fault and back (${changes.length} changes)`);
      t.same([...new Set(changes.map((l) => l.vrid))], [VRID], 'and it alone changed priority: the default network\'s (VRID 50) never did');
    });

    t.test('a reload adds a track that already fails: api\'s VIP moves with no restart and mgmt\'s does not blink; removing it brings the VIP back', async (t) => {
      await n3.addDownLink('trk0');
      const pid = n3.agent!.proc.pid;
      const withTrk = { interfaces: [{ name: 'eth1' }, { name: 'trk0', weight: 60 }], services: [{ service: 'api', minHealthy: 2, weight: 60, failAfter: 1, recoverAfter: 1 }] };
      const loop = await ClientLoop.start(lab, client, `http://${MGMT_VIP}/`, { intervalMs: 20, timeoutMs: 300, maxMs: 30_000 });
      try {
        await sleep(300);
        const added = await n3.reloadTracking({ network: 'vmnet', track: withTrk });
        t.ok(added.ok, `the reload is applied: ${added.message}`);
        t.match(added.message, /applied sections: networks/);
        await waitServing(n2, n3, 'a reload added a failing track');
        const f3 = await failover(n3);
        t.equal(f3.priority, 140, 'n3 advertises 200 - 60 on vmnet\'s router');
        t.same(f3.priorityReasons, ['interface trk0: link down (-60)']);
        const took = logAfter(n2, added.at, (l) => l.op === 'transition' && l.to === 'master');
        t.ok(took, `n2 took over (${String(took?.reason)}) ${took ? logTime(took) - added.at : '?'} ms after the reload`);
        t.match((await n3.status()).events.filter((e) => e.kind === 'vrrp-priority').at(-1)?.reason ?? '', /^network vmnet VRID 51: priority 200 -> priority 140 \(configured 200\): interface trk0: link down \(-60\)$/, 'the event names the network');
        t.equal(metricValue(await n3.metrics(), 'lbagent_vrrp_track_failing{track="interface trk0",network="vmnet"}'), 1);
        t.match(await failover(n3, 'mgmt'), { state: 'master', priority: 200 }, 'the default network\'s router is untouched');

        const removed = await n3.reloadTracking({ network: 'vmnet' });
        t.ok(removed.ok, `the removal is applied: ${removed.message}`);
        await waitServing(n3, n2, 'the failing track removed, preempt on');
        t.equal((await failover(n3)).priority, 200, 'back at the configured priority');
        t.same((await failover(n3)).priorityReasons, []);
        // /metrics serves a page up to 1 s old (metrics/server.ts reuseMs).
        await waitFor('the removed track\'s gauge gone', async () => metricValue(await n3.metrics(), 'lbagent_vrrp_track_failing{track="interface trk0",network="vmnet"}') === undefined, 3000, 100);
        t.pass('the removed track\'s gauge is gone');
        const back = logAfter(n3, removed.at, (l) => l.op === 'transition' && l.to === 'master');
        t.comment(`track added -> n2 Master ${took ? logTime(took) - added.at : '?'} ms; removed -> n3 Master ${back ? logTime(back) - removed.at : '?'} ms`);
        await sleep(300);
        const g = gapReport(await loop.stop(), added.at, BACKEND_IDS);
        t.comment(`mgmt's VIP through both reloads: ${g.count} requests, errors ${JSON.stringify(g.errors)}`);
        t.ok(g.count > 50, `the client asked all along (${g.count} requests)`);
        t.same(g.failures.map((x) => [x.t - added.at, x.error]), [], 'not one failure on the VIP whose router\'s priority never changed');
        t.same(g.wrongBodies, []);
        t.equal(n3.agent!.proc.pid, pid, 'the same process: no restart');
        t.notOk(n3.logs().some((l) => l.op === 'priority' && l.vrid === 50), 'VRID 50 never changed priority');
      } finally {
        await loop.stop().catch(() => undefined);
      }
    });
  });
}
