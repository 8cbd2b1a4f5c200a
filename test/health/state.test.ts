// Unit tests of the pure health state machine: thresholds at several settings,
// unknown -> up on the first success, bounded flapping, passive checks.
import t from 'tap';
import { prng } from '../helpers/random';
import { initialHealth, isHealthy, step, type BackendHealth, type HealthEvent, type Thresholds } from '../../agent/health/state';

const OK: HealthEvent = { kind: 'probe-ok' };
const FAIL: HealthEvent = { kind: 'probe-fail', reason: 'refused', detail: 'ECONNREFUSED' };
const PFAIL: HealthEvent = { kind: 'passive-fail', reason: 'reset' };
const POK: HealthEvent = { kind: 'passive-ok' };

const th = (s: number, f: number, p = 3): Thresholds => ({ successThreshold: s, failureThreshold: f, passiveFailures: p });

/** Run events from `h`, returning the final state and the index of every change. */
function run(h: BackendHealth, events: HealthEvent[], thr: Thresholds, t0 = 0): { h: BackendHealth; changes: { i: number; to: string }[] } {
  const changes: { i: number; to: string }[] = [];
  events.forEach((ev, i) => {
    const r = step(h, ev, t0 + i, thr);
    if (r.changed) changes.push({ i, to: r.health.state });
    h = r.health;
  });
  return { h, changes };
}

const rep = <T>(x: T, n: number): T[] => Array.from({ length: n }, () => x);

t.test('a new backend is unknown and not healthy', async (t) => {
  const h = initialHealth(42);
  t.equal(h.state, 'unknown');
  t.equal(h.since, 42);
  t.notOk(isHealthy(h));
});

t.test('unknown -> up on the first success, whatever successThreshold says', async (t) => {
  for (const s of [1, 2, 5]) {
    const r = step(initialHealth(0), OK, 10, th(s, 3));
    t.ok(r.changed, `s=${s}`);
    t.equal(r.health.state, 'up');
    t.equal(r.health.since, 10);
    t.ok(isHealthy(r.health));
  }
});

t.test('unknown -> down needs failureThreshold consecutive failures', async (t) => {
  for (const f of [1, 2, 3, 7]) {
    const { h, changes } = run(initialHealth(0), rep(FAIL, f), th(1, f));
    t.same(changes, [{ i: f - 1, to: 'down' }], `f=${f}`);
    t.equal(h.state, 'down');
    t.equal(h.reason, 'refused');
    t.equal(h.takenOutBy, 'active');
    t.equal(h.consecutiveFailures, f);
  }
  // One failure short stays unknown (and out of rotation).
  const { h } = run(initialHealth(0), rep(FAIL, 2), th(1, 3));
  t.equal(h.state, 'unknown');
});

t.test('up -> down after exactly failureThreshold failures; down -> up after exactly successThreshold successes', async (t) => {
  for (const [s, f] of [[1, 3], [2, 2], [3, 1], [1, 1], [4, 5]] as const) {
    const up = step(initialHealth(0), OK, 0, th(s, f)).health;
    const a = run(up, [...rep(FAIL, f - 1), OK, ...rep(FAIL, f)], th(s, f));
    // The success in the middle resets the failure streak.
    t.same(a.changes, [{ i: 2 * f - 1, to: 'down' }], `s=${s} f=${f} down`);
    const b = run(a.h, [...rep(OK, s - 1), FAIL, ...rep(OK, s)], th(s, f));
    t.same(b.changes, [{ i: 2 * s - 1, to: 'up' }], `s=${s} f=${f} up`);
    t.equal(b.h.reason, undefined, 'reason cleared when back up');
    t.equal(b.h.takenOutBy, undefined);
    t.equal(b.h.lastFailure?.reason, 'refused', 'last failure is kept after recovery');
  }
});

t.test('counters: consecutive successes and failures reset each other', async (t) => {
  const thr = th(2, 3);
  let h = step(initialHealth(0), OK, 0, thr).health;
  h = step(h, OK, 1, thr).health;
  t.equal(h.consecutiveSuccesses, 2);
  h = step(h, FAIL, 2, thr).health;
  t.equal(h.consecutiveSuccesses, 0);
  t.equal(h.consecutiveFailures, 1);
  t.equal(h.lastFailure?.at, 2);
  h = step(h, OK, 3, thr).health;
  t.equal(h.consecutiveFailures, 0);
  t.equal(h.state, 'up');
  t.equal(h.since, 0, 'since is the time of the last change, not of the last probe');
});

t.test('flapping faster than the thresholds never changes state', async (t) => {
  for (const [s, f] of [[2, 2], [2, 3], [3, 2], [5, 5]] as const) {
    const up = step(initialHealth(0), OK, 0, th(s, f)).health;
    // Alternating, and runs one short of each threshold.
    const alt = run(up, Array.from({ length: 1000 }, (_, i) => (i % 2 ? OK : FAIL)), th(s, f));
    t.same(alt.changes, [], `alternating s=${s} f=${f}`);
    const pattern = [...rep(FAIL, f - 1), ...rep(OK, 1)];
    const burst = run(up, Array.from({ length: 100 }, () => pattern).flat(), th(s, f));
    t.same(burst.changes, [], `bursts of f-1 failures s=${s} f=${f}`);
  }
});

t.test('random probe streams: every change ends a full run of its threshold', async (t) => {
  // A deterministic LCG so a failure is reproducible.
  const rnd = prng(12345);
  for (const [s, f] of [[1, 1], [1, 3], [2, 2], [3, 1], [3, 4]] as const) {
    for (let trial = 0; trial < 20; trial++) {
      const p = 0.2 + 0.6 * rnd();
      const events = Array.from({ length: 500 }, () => (rnd() < p ? OK : FAIL));
      const { changes } = run(initialHealth(0), events, th(s, f));
      let ok = true;
      for (const c of changes) {
        const need = c.to === 'down' ? f : (c === changes[0] ? 1 : s);
        const want = c.to === 'down' ? FAIL : OK;
        if (c.i + 1 < need) { ok = false; break; }
        for (let k = c.i - need + 1; k <= c.i; k++) if (events[k] !== want) ok = false;
      }
      // No probe counts towards two changes: changes are at least min(s,f) probes apart.
      for (let k = 1; k < changes.length; k++) {
        if (changes[k]!.i - changes[k - 1]!.i < Math.min(s, f)) ok = false;
        if (changes[k]!.to === changes[k - 1]!.to) ok = false;
      }
      if (!ok) { t.fail(`s=${s} f=${f} trial ${trial}: ${JSON.stringify(changes)}`); break; }
      t.ok(changes.length <= Math.floor((events.length - 1) / Math.min(s, f)) + 1, `s=${s} f=${f} trial ${trial}: ${changes.length} changes bounded`);
    }
  }
});

t.test('passive: N consecutive connect failures mark an up backend down at once', async (t) => {
  const thr = th(2, 3, 3);
  const up = step(initialHealth(0), OK, 0, thr).health;
  const a = run(up, [PFAIL, PFAIL, POK, PFAIL, PFAIL, PFAIL], thr, 100);
  t.same(a.changes, [{ i: 5, to: 'down' }], 'a passive success resets the count');
  t.equal(a.h.takenOutBy, 'passive');
  t.equal(a.h.reason, 'reset');
  t.equal(a.h.lastFailure?.by, 'passive');
  t.equal(a.h.since, 105);
});

t.test('passive: only the active probe brings a backend back, after successThreshold', async (t) => {
  const thr = th(2, 3, 2);
  let h = step(initialHealth(0), OK, 0, thr).health;
  h = run(h, [PFAIL, PFAIL], thr).h;
  t.equal(h.state, 'down');
  // Passive successes (should the forwarding path still try) change nothing.
  const p = run(h, rep(POK, 10), thr);
  t.same(p.changes, []);
  t.equal(p.h.state, 'down');
  const a = run(p.h, [OK, OK], thr);
  t.same(a.changes, [{ i: 1, to: 'up' }]);
  t.equal(a.h.takenOutBy, undefined);
});

t.test('passive: off when passiveFailures is 0; active failures do not count as passive', async (t) => {
  const off = th(1, 3, 0);
  const up = step(initialHealth(0), OK, 0, off).health;
  const r = run(up, rep(PFAIL, 100), off);
  t.same(r.changes, []);
  t.equal(r.h.state, 'up');
  const on = th(1, 5, 2);
  const up2 = step(initialHealth(0), OK, 0, on).health;
  const r2 = run(up2, [PFAIL, FAIL, OK], on);
  t.equal(r2.h.passiveFailures, 1, 'active results leave the passive count alone');
  t.equal(r2.h.state, 'up');
});

t.test('passive failures on an unknown backend can mark it down', async (t) => {
  const thr = th(1, 3, 1);
  const r = step(initialHealth(0), PFAIL, 5, thr);
  t.ok(r.changed);
  t.equal(r.health.state, 'down');
  t.equal(r.health.takenOutBy, 'passive');
});

t.test('a down backend stays down under more failures (no repeated transitions)', async (t) => {
  const thr = th(1, 2, 2);
  const down = run(initialHealth(0), [FAIL, FAIL], thr).h;
  const r = run(down, [...rep(FAIL, 10), ...rep(PFAIL, 10)], thr);
  t.same(r.changes, []);
  t.equal(r.h.reason, 'refused', 'the reason stays the one that took it down');
  t.equal(r.h.takenOutBy, 'active');
  t.equal(r.h.lastFailure?.by, 'passive', 'lastFailure follows the newest failure');
});
