// Unit tests of priority tracking (pure): hysteresis both ways, a flap
// shorter than failAfter never counting, weights summed and floored at 1,
// fault for a track without a weight, and the observations of links and
// backends in words.
import t from 'tap';
import {
  createTracks, effectivePriority, interfaceObservation, nextChangeAt, observe, serviceObservation, settle,
  type Track, type TrackDef,
} from '../../agent/failover/tracking';

const IF: TrackDef = { key: 'interface eth1', kind: 'interface', name: 'eth1', weight: 50, failAfterMs: 0, recoverAfterMs: 0 };
const SVC: TrackDef = { key: 'service default/web', kind: 'service', name: 'default/web', weight: 60, failAfterMs: 1000, recoverAfterMs: 5000 };
const FAULT: TrackDef = { key: 'interface eth2', kind: 'interface', name: 'eth2', weight: undefined, failAfterMs: 0, recoverAfterMs: 0 };

/** Observe then settle, as the driver does. */
function at(tracks: Track[], key: string, failing: boolean, now: number, detail = failing ? 'bad' : 'good'): { tracks: Track[]; changed: string[] } {
  const s = settle(observe(tracks, key, failing, detail, now), now);
  return { tracks: s.tracks, changed: s.changed.map((c) => `${c.def.key}=${c.failing}`) };
}

t.test('a track without delay counts at once, both ways', async (t) => {
  let tr = createTracks([IF], 0);
  t.equal(effectivePriority(200, tr).priority, 200, 'nothing failing: the base');
  const down = at(tr, IF.key, true, 10, 'no carrier');
  t.same(down.changed, ['interface eth1=true']);
  tr = down.tracks;
  t.same(effectivePriority(200, tr), { priority: 150, base: 200, reasons: ['interface eth1: no carrier (-50)'] });
  t.equal(nextChangeAt(tr), undefined, 'nothing pending');
  const up = at(tr, IF.key, false, 20);
  t.same(up.changed, ['interface eth1=false']);
  t.equal(effectivePriority(200, up.tracks).priority, 200);
});

t.test('failAfter: the shortage counts only once it has held; recoverAfter likewise', async (t) => {
  let tr = createTracks([SVC], 0);
  let r = at(tr, SVC.key, true, 1000);
  t.same(r.changed, [], 'not yet');
  tr = r.tracks;
  t.equal(nextChangeAt(tr), 2000, 'counts at observedSince + failAfter');
  t.equal(effectivePriority(200, tr).priority, 200);
  // The same observation again does not restart the clock.
  tr = observe(tr, SVC.key, true, 'still bad', 1500);
  t.equal(nextChangeAt(tr), 2000);
  t.equal(tr[0]!.detail, 'still bad', 'the words follow the latest observation');
  t.same(settle(tr, 1999).changed, [], '1 ms early');
  r = { tracks: settle(tr, 2000).tracks, changed: [] };
  tr = r.tracks;
  t.equal(tr[0]!.failing, true);
  t.equal(effectivePriority(200, tr).priority, 140);
  // Recovery waits recoverAfter.
  tr = at(tr, SVC.key, false, 3000).tracks;
  t.equal(tr[0]!.failing, true, 'still counts as failing');
  t.equal(nextChangeAt(tr), 8000);
  t.equal(settle(tr, 8000).tracks[0]!.failing, false, 'recovered after 5 s of health');
});

t.test('a backend flapping every 300 ms never reaches failAfter', async (t) => {
  let tr = createTracks([SVC], 0);
  let changes = 0;
  for (let now = 0, failing = true; now < 20_000; now += 300, failing = !failing) {
    const r = at(tr, SVC.key, failing, now);
    changes += r.changed.length;
    tr = r.tracks;
    const next = nextChangeAt(tr);
    if (next !== undefined && next < now + 300) changes += settle(tr, next).changed.length;
  }
  t.equal(changes, 0, '67 flips, no change of the priority');
  t.equal(effectivePriority(200, tr).priority, 200);
});

t.test('a flap longer than failAfter counts, and recovery is held back', async (t) => {
  let tr = createTracks([SVC], 0);
  tr = at(tr, SVC.key, true, 0).tracks;
  tr = settle(tr, 1000).tracks;
  t.equal(tr[0]!.failing, true);
  // Good for 2 s, bad again: recovery (5 s) never completes.
  tr = at(tr, SVC.key, false, 1100).tracks;
  tr = at(tr, SVC.key, true, 3100).tracks;
  t.equal(nextChangeAt(tr), undefined, 'observed and counted agree again');
  t.equal(settle(tr, 10_000).tracks[0]!.failing, true);
});

t.test('weights add up, the priority never falls below 1, and a track without weight is fault', async (t) => {
  let tr = createTracks([IF, SVC, FAULT], 0);
  tr = at(tr, IF.key, true, 0, 'no carrier').tracks;
  tr = settle(at(tr, SVC.key, true, 0, '0 of 2 backends healthy, 1 needed').tracks, 1000).tracks;
  t.same(effectivePriority(200, tr), {
    priority: 90, base: 200,
    reasons: ['interface eth1: no carrier (-50)', 'service default/web: 0 of 2 backends healthy, 1 needed (-60)'],
  }, 'in config order');
  t.equal(effectivePriority(100, tr).priority, 1, 'floored at 1: 0 is resigning');
  tr = at(tr, FAULT.key, true, 2000, 'link down').tracks;
  const f = effectivePriority(200, tr);
  t.equal(f.priority, 0, 'fault');
  t.match(f.reasons, ['interface eth1: no carrier (-50)', /service default\/web/, 'interface eth2: link down (fault)']);
  t.equal(effectivePriority(254, createTracks([IF], 0)).priority, 254, 'never above 254');
});

t.test('observations in words', async (t) => {
  t.same(interfaceObservation(undefined), { failing: true, detail: 'no such interface' });
  t.same(interfaceObservation({ up: false, carrier: false }), { failing: true, detail: 'link down' });
  t.same(interfaceObservation({ up: true, carrier: false }), { failing: true, detail: 'no carrier' });
  t.same(interfaceObservation({ up: true, carrier: true }), { failing: false, detail: 'up, carrier' });
  t.same(serviceObservation(0, 0, 2, 1), { failing: true, detail: '0 of 2 backends healthy, 1 needed' });
  t.same(serviceObservation(1, 0, 2, 2), { failing: true, detail: '1 of 2 backends healthy, 2 needed' });
  t.same(serviceObservation(0, 2, 2, 1), { failing: false, detail: '0 of 2 backends healthy, 2 not checked yet, 1 needed' }, 'not checked yet is not down');
  t.same(serviceObservation(2, 0, 2, 2), { failing: false, detail: '2 of 2 backends healthy, 2 needed' });
  t.same(serviceObservation(0, 0, 0, 1), { failing: false, detail: 'backends not known to the health checker yet' }, 'a service the checker has not been told of yet');
});
