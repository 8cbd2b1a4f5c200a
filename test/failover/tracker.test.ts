// Unit tests of the tracking driver on a manual clock: links read at start
// and followed by notifications (a read overtaken by a notification is
// dropped), backend verdicts counted over a service's families, the one
// timer that lets a pending observation count, status rows and the
// lbagent_vrrp_track_failing gauge.
import t from 'tap';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import { PriorityTracker, trackedServiceOf, type TrackedBackends, type TrackedLink } from '../../agent/failover/tracker';
import type { TrackConfig } from '../../agent/config/types';

const TRACK: TrackConfig = {
  interfaces: [{ name: 'eth1', weight: 50, failAfter: 0, recoverAfter: 0 }, { name: 'eth2', weight: undefined, failAfter: 0, recoverAfter: 2 }],
  services: [{ service: 'default/web', minHealthy: 2, weight: 60, failAfter: 1, recoverAfter: 5 }],
};

function harness(track: TrackConfig = TRACK) {
  const clock = new ManualClock();
  const registry = new Registry();
  const links = new Map<string, TrackedLink>([['eth1', { up: true, carrier: true }], ['eth2', { up: true, carrier: true }]]);
  let backends: TrackedBackends = { up: 2, unknown: 0, total: 2 };
  const reads: { name: string; resolve: () => void }[] = [];
  let deferReads = false;
  const tracker = new PriorityTracker({
    track, clock, registry, log: silentLogger(),
    readLink: (name) => (deferReads
      ? new Promise((resolve) => { const snapshot = links.get(name); reads.push({ name, resolve: () => resolve(snapshot) }); })
      : Promise.resolve(links.get(name))),
    backends: (key) => (key === 'default/web' ? backends : { up: 0, unknown: 0, total: 0 }),
  });
  const changes: string[][] = [];
  tracker.on('change', (c: { def: { key: string }; failing: boolean }[]) => changes.push(c.map((x) => `${x.def.key}=${x.failing}`)));
  return {
    clock, registry, links, tracker, changes, reads,
    setBackends(b: TrackedBackends) { backends = b; },
    defer(on: boolean) { deferReads = on; },
  };
}

const gauge = async (r: Registry, track: string): Promise<number | undefined> => {
  const m = await r.getSingleMetric('lbagent_vrrp_track_failing')?.get();
  return m?.values.find((v) => v.labels.track === track)?.value;
};

t.test('trackedServiceOf: a family service key to its service', async (t) => {
  t.equal(trackedServiceOf('default/web'), 'default/web');
  t.equal(trackedServiceOf('default/web@IPv6'), 'default/web');
});

t.test('start reads every link; a link missing at start fails at once', async (t) => {
  const h = harness();
  h.links.delete('eth2');
  await h.tracker.start();
  h.tracker.publish();
  t.same(h.changes, [['interface eth2=true']]);
  t.same(h.tracker.effective(200), { priority: 0, base: 200, reasons: ['interface eth2: no such interface (fault)'] });
  t.equal(await gauge(h.registry, 'interface eth2'), 1);
  t.equal(await gauge(h.registry, 'interface eth1'), 0, 'every track has its gauge from the start');
});

t.test('link notifications: carrier lost lowers at once; recovery waits recoverAfter', async (t) => {
  const h = harness();
  await h.tracker.start();
  t.equal(h.tracker.effective(200).priority, 200);
  h.tracker.linkChanged('eth1', { up: true, carrier: false });
  t.same(h.tracker.effective(200).reasons, ['interface eth1: no carrier (-50)']);
  h.tracker.linkChanged('eth9', { up: false, carrier: false });
  t.equal(h.changes.length, 1, 'an untracked link is ignored');
  h.tracker.linkChanged('eth2', { up: false, carrier: false });
  t.equal(h.tracker.effective(200).priority, 0, 'eth2 has no weight: fault');
  h.tracker.linkChanged('eth2', { up: true, carrier: true });
  t.equal(h.tracker.effective(200).priority, 0, 'recoverAfter 2 s: still fault');
  const st = h.tracker.status().find((s) => s.name === 'eth2')!;
  t.equal(st.failing, true);
  t.equal(st.pendingUntil, new Date(h.clock.wallNow() + 2000).toISOString(), 'status says when it counts');
  h.clock.advance(1999);
  t.equal(h.tracker.effective(200).priority, 0);
  h.clock.advance(1);
  t.equal(h.tracker.effective(200).priority, 150, 'the timer let the recovery count');
  t.same(h.changes.at(-1), ['interface eth2=false']);
  h.tracker.linkChanged('eth1', undefined);
  t.same(h.tracker.effective(200).reasons, ['interface eth1: no such interface (-50)'], 'a deleted link');
});

t.test('a read overtaken by a notification does not overwrite it', async (t) => {
  const h = harness();
  await h.tracker.start();
  h.defer(true);
  h.links.set('eth1', { up: true, carrier: false });
  const resync = h.tracker.resync();
  // The link comes back (notification) while the older read is in flight.
  h.tracker.linkChanged('eth1', { up: true, carrier: true });
  for (const r of h.reads) r.resolve();
  await resync;
  t.equal(h.tracker.effective(200).priority, 200, 'the notification stands');
});

t.test('services: verdicts of every family; a shortage counts after failAfter', async (t) => {
  const h = harness();
  await h.tracker.start();
  h.setBackends({ up: 1, unknown: 0, total: 2 });
  h.tracker.serviceChanged('default/web@IPv6');
  t.equal(h.tracker.effective(200).priority, 200, 'pending');
  h.tracker.serviceChanged('default/other');
  h.clock.advance(1000);
  t.same(h.tracker.effective(200).reasons, ['service default/web: 1 of 2 backends healthy, 2 needed (-60)']);
  t.equal(await gauge(h.registry, 'service default/web'), 1);
  h.setBackends({ up: 2, unknown: 0, total: 2 });
  h.tracker.serviceChanged('default/web');
  h.clock.advance(4999);
  t.equal(h.tracker.effective(200).priority, 140);
  h.clock.advance(1);
  t.equal(h.tracker.effective(200).priority, 200);
  t.equal(await gauge(h.registry, 'service default/web'), 0);
});

t.test('a backend flapping every 300 ms for 10 s: no change', async (t) => {
  const h = harness();
  await h.tracker.start();
  for (let i = 0; i < 34; i++) {
    h.setBackends(i % 2 === 0 ? { up: 1, unknown: 0, total: 2 } : { up: 2, unknown: 0, total: 2 });
    h.tracker.serviceChanged('default/web');
    h.clock.advance(300);
  }
  t.same(h.changes, []);
  t.equal(h.tracker.effective(200).priority, 200);
});

t.test('stop: no timer fires, nothing changes any more', async (t) => {
  const h = harness();
  await h.tracker.start();
  h.setBackends({ up: 0, unknown: 0, total: 2 });
  h.tracker.serviceChanged('default/web');
  h.tracker.stop();
  h.clock.advance(10_000);
  t.same(h.changes, []);
});

t.test('refreshServices: verdicts that came with no event (seeded from an earlier run) count', async (t) => {
  const h = harness({ interfaces: [], services: [{ service: 'default/web', minHealthy: 1, weight: 10, failAfter: 0, recoverAfter: 0 }] });
  h.setBackends({ up: 0, unknown: 0, total: 0 });
  await h.tracker.start();
  t.equal(h.tracker.effective(200).priority, 200, 'a service the checker does not know yet is not failing');
  h.setBackends({ up: 0, unknown: 0, total: 2 }); // seeded down, no event
  h.tracker.refreshServices();
  t.same(h.tracker.effective(200).reasons, ['service default/web: 0 of 2 backends healthy, 1 needed (-10)']);
});

t.test('reconfigure: kept tracks keep their state under a new weight and delays; new ones are observed at once; removed ones and their gauges go', async (t) => {
  const h = harness();
  await h.tracker.start();
  h.tracker.linkChanged('eth1', { up: true, carrier: false });
  t.equal(h.tracker.effective(200).priority, 150);
  h.links.set('eth3', { up: true, carrier: false });
  h.changes.length = 0;
  await h.tracker.reconfigure({
    interfaces: [{ name: 'eth1', weight: 20, failAfter: 0, recoverAfter: 0 }, { name: 'eth3', weight: 30, failAfter: 0, recoverAfter: 0 }],
    services: [],
  });
  t.same(h.tracker.effective(200), { priority: 150, base: 200, reasons: ['interface eth1: no carrier (-20)', 'interface eth3: no carrier (-30)'] },
    'eth1 still failing with its new weight; eth3 new and failing at once');
  t.same(h.changes, [['interface eth3=true'], []], 'eth3\'s change, then the reload\'s own (every router recomputes)');
  t.equal(await gauge(h.registry, 'interface eth3'), 1);
  t.equal(await gauge(h.registry, 'interface eth2'), undefined, 'eth2 is not tracked any more: its gauge is gone');
  t.equal(await gauge(h.registry, 'service default/web'), undefined);
  h.tracker.linkChanged('eth2', { up: false, carrier: false });
  t.equal(h.tracker.effective(200).priority, 150, 'and its notifications are ignored');

  // The reloaded delays apply from then on.
  h.tracker.linkChanged('eth1', { up: true, carrier: true });
  t.equal(h.tracker.effective(200).priority, 170, 'recoverAfter 0: eth1 counts as recovered at once');
  await h.tracker.reconfigure({ interfaces: [{ name: 'eth3', weight: 30, failAfter: 0, recoverAfter: 3 }], services: [] });
  h.tracker.linkChanged('eth3', { up: true, carrier: true });
  t.equal(h.tracker.effective(200).priority, 170, 'eth3 back 0 s ago; its recoverAfter is 3 s now');
  h.clock.advance(3000);
  t.equal(h.tracker.effective(200).priority, 200, 'and counts after it');

  await h.tracker.reconfigure({ interfaces: [], services: [] });
  t.same(h.tracker.status(), [], 'every track removed');
  t.equal(h.tracker.effective(200).priority, 200);
});

t.test('a named network\'s tracker: its gauges carry network, its status rows say which network\'s routers they lower', async (t) => {
  const registry = new Registry();
  const clock = new ManualClock();
  const mk = (network: string | undefined) => new PriorityTracker({
    track: { interfaces: [{ name: 'eth1', weight: undefined, failAfter: 0, recoverAfter: 0 }], services: [] }, network,
    clock, registry, log: silentLogger(), readLink: () => Promise.resolve(network === 'vmnet' ? undefined : { up: true, carrier: true }), backends: () => ({ up: 0, unknown: 0, total: 0 }),
  });
  const def = mk(undefined);
  const vm = mk('vmnet');
  await def.start();
  await vm.start();
  def.publish();
  vm.publish();
  const m = await registry.getSingleMetric('lbagent_vrrp_track_failing')?.get();
  t.same(m?.values.map((v) => [v.labels, v.value]).sort((x, y) => Object.keys(x[0]!).length - Object.keys(y[0]!).length), [[{ track: 'interface eth1' }, 0], [{ track: 'interface eth1', network: 'vmnet' }, 1]],
    'one NIC tracked by two networks: two series, the default network\'s without a network label');
  t.same(def.status().map((s) => s.network), ['default']);
  t.same(vm.status().map((s) => [s.network, s.failing, s.detail]), [['vmnet', true, 'no such interface']]);
});
