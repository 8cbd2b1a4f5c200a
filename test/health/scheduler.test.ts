// Unit tests of the probe scheduler in simulated time (ManualClock): first run
// at once, then spread over the period; jitter bounds; one timer for 10,000
// keys at 1 s without falling behind; periods down to 0.1 s; the in-flight
// bound keeps the schedule; busy and overrun skips; add/remove/setPeriod;
// runExtra outside the grid; 3,000 keys spread evenly over their period,
// and kept there across a reload.
import t from 'tap';
import { prng } from '../helpers/random';
import { ManualClock, type Clock, type TimerHandle } from '../../agent/clock';
import { ProbeScheduler, type Run, type Slot } from '../../agent/health/scheduler';

/** Let pending completions run. */
const flush = (): Promise<void> => new Promise((r) => setImmediate(r));

/** A deterministic uniform source (LCG), so failures reproduce. */
interface RunRec { key: string; slot: Slot; at: number; extra: boolean }

/** A harness: probes that finish after `latencyMs` of simulated time. */
function harness(opts: { maxInFlight?: number; jitter?: number; latencyMs?: number; clock?: Clock & { now(): number } } = {}) {
  const clock = (opts.clock ?? new ManualClock(0)) as ManualClock;
  const runs: RunRec[] = [];
  const pending: { at: number; resolve: () => void }[] = [];
  let inFlight = 0;
  let maxSeen = 0;
  const perKeyInFlight = new Map<string, number>();
  let overlap = false;
  const aborted: string[] = [];
  const sched = new ProbeScheduler({
    clock,
    maxInFlight: opts.maxInFlight ?? 64,
    jitter: opts.jitter ?? 0.05,
    random: prng(7),
    run: (run) => {
      const key = run.key;
      runs.push({ key, slot: { base: run.base, due: run.due, started: run.started }, at: clock.now(), extra: run.extra });
      inFlight++;
      maxSeen = Math.max(maxSeen, inFlight);
      const k = (perKeyInFlight.get(key) ?? 0) + 1;
      if (k > 1) overlap = true;
      perKeyInFlight.set(key, k);
      let over = false;
      const done = (): void => {
        if (over) return;
        over = true;
        inFlight--;
        perKeyInFlight.set(key, (perKeyInFlight.get(key) ?? 1) - 1);
        run.done();
      };
      run.token = done;
      if (!opts.latencyMs) done();
      else pending.push({ at: clock.now() + opts.latencyMs, resolve: done });
    },
    // An abandoned run's slot is free at once: the probe counts as over.
    onAbort: (run) => { aborted.push(run.key); (run.token as () => void)(); },
  });
  /** Advance simulated time in steps, completing probes whose latency elapsed. */
  const advance = async (ms: number, stepMs = 1): Promise<void> => {
    for (let left = ms; left > 0; left -= stepMs) {
      clock.advance(Math.min(stepMs, left));
      const now = clock.now();
      for (let i = 0; i < pending.length;) {
        if (pending[i]!.at <= now) { pending[i]!.resolve(); pending[i] = pending[pending.length - 1]!; pending.pop(); } else i++;
      }
      await flush();
    }
  };
  return { clock, sched, runs, advance, get maxSeen() { return maxSeen; }, get overlap() { return overlap; }, aborted };
}

const byKey = (runs: RunRec[]): Map<string, RunRec[]> => {
  const m = new Map<string, RunRec[]>();
  for (const r of runs) { const l = m.get(r.key) ?? []; l.push(r); m.set(r.key, l); }
  return m;
};

t.test('at start every key runs at once, then keys spread evenly over the period', async (t) => {
  const h = harness({ maxInFlight: 10_000, jitter: 0 });
  for (let i = 0; i < 1000; i++) h.sched.add(`k${i}`, 1000);
  t.equal(h.runs.length, 0, 'nothing runs before start');
  h.sched.start();
  await h.advance(0 + 1);
  const first = h.runs.filter((r) => r.at <= 1);
  t.equal(first.length, 1000, 'all 1000 probed at once');
  await h.advance(998);
  const second = h.runs.slice(1000);
  t.equal(second.length, 0, 'none again within the first period');
  await h.advance(1001);
  const spread = h.runs.slice(1000);
  t.equal(spread.length, 1000, 'each key once in the second period');
  // Ten buckets of 100 ms: uniform phase gives ~100 each.
  const buckets = new Array<number>(10).fill(0);
  for (const r of spread) buckets[Math.min(9, Math.floor((r.slot.base - 1000) / 100))]!++;
  t.ok(buckets.every((b) => b >= 50 && b <= 150), `spread over the period: ${buckets.join(',')}`);
  h.sched.stop();
});

t.test('jitter stays within ±jitter x period around a fixed grid', async (t) => {
  const h = harness({ jitter: 0.1, maxInFlight: 1000 });
  for (let i = 0; i < 200; i++) h.sched.add(`k${i}`, 1000);
  h.sched.start();
  await h.advance(10_000, 5);
  h.sched.stop();
  let checked = 0;
  let jittered = 0;
  for (const [key, list] of byKey(h.runs)) {
    for (let i = 1; i < list.length; i++) {
      const r = list[i]!;
      const off = r.slot.due - r.slot.base;
      if (Math.abs(off) > 100 + 1e-9) t.fail(`${key} run ${i} jitter ${off} ms`);
      if (Math.abs(off) > 1) jittered++;
      if (r.at < r.slot.due || r.at > r.slot.due + 5) t.fail(`${key} started at ${r.at}, due ${r.slot.due}`);
      if (i >= 2 && Math.abs(r.slot.base - list[i - 1]!.slot.base - 1000) > 1e-6) t.fail(`${key}: grid moved`);
      if (i >= 2) {
        const gap = r.slot.due - list[i - 1]!.slot.due;
        if (gap < 800 - 1e-9 || gap > 1200 + 1e-9) t.fail(`${key}: interval ${gap} ms outside [800, 1200]`);
      }
      checked++;
    }
  }
  t.ok(checked > 1500, `${checked} runs checked`);
  t.ok(jittered > checked / 2, 'jitter is actually applied');
});

t.test('10,000 keys at 1 s on one timer do not fall behind (simulated time)', async (t) => {
  const h = harness({ maxInFlight: 512, latencyMs: 20 });
  const realSetTimeout = h.clock.setTimeout.bind(h.clock);
  let armed = 0;
  h.clock.setTimeout = (fn: () => void, ms: number): TimerHandle => { armed++; return realSetTimeout(fn, ms); };
  for (let i = 0; i < 10_000; i++) h.sched.add(`k${i}`, 1000);
  h.sched.start();
  await h.advance(10_000, 2);
  h.sched.stop();
  const stats = h.sched.stats();
  const per = byKey(h.runs);
  t.equal(per.size, 10_000, 'every key ran');
  let min = Infinity;
  let max = 0;
  for (const l of per.values()) { min = Math.min(min, l.length); max = Math.max(max, l.length); }
  // First run at 0, then grid points 1000 + phase + k*1000 (±50 ms jitter) up to 10 s: 9 to 11 runs each.
  t.ok(min >= 9 && max <= 11, `runs per key in [${min}, ${max}]`);
  t.equal(stats.skippedBusy, 0, 'no run skipped for being busy');
  t.equal(stats.skippedOverrun, 0, 'no grid point missed');
  t.ok(h.maxSeen <= 512, `in flight never above the bound (${h.maxSeen})`);
  // After the start burst (10,000 x 20 ms / 512 slots ~ 400 ms), runs start on time.
  const late = h.runs.filter((r) => r.slot.base >= 1000 && r.at - r.slot.due > 2);
  t.equal(late.length, 0, `steady-state runs start within one step of due (${late.length} late)`);
  t.ok(armed < h.runs.length, `timers armed (${armed}) fewer than runs (${h.runs.length}): one timer, not one per key`);
  t.notOk(h.overlap, 'a key never runs twice at once');
});

t.test('the start burst beyond maxInFlight waits in order and keeps each key\'s grid', async (t) => {
  const h = harness({ maxInFlight: 10, latencyMs: 50 });
  for (let i = 0; i < 100; i++) h.sched.add(`k${i}`, 1000);
  h.sched.start();
  await h.advance(3000, 1);
  h.sched.stop();
  t.ok(h.maxSeen <= 10);
  const firsts = [...byKey(h.runs).values()].map((l) => l[0]!);
  t.equal(firsts.length, 100, 'every key had its first run');
  const lastFirst = Math.max(...firsts.map((r) => r.at));
  t.ok(lastFirst >= 450 && lastFirst <= 520, `100 runs x 50 ms / 10 slots: the last first run starts at ${lastFirst} ms`);
  for (const l of byKey(h.runs).values()) {
    if (l.length >= 3 && Math.abs(l[2]!.slot.base - l[1]!.slot.base - 1000) > 1e-6) t.fail('grid moved under load');
  }
});

t.test('periods down to 0.1 s', async (t) => {
  const h = harness({ jitter: 0.05 });
  h.sched.add('fast', 100);
  h.sched.add('slow', 5000);
  h.sched.start();
  await h.advance(10_000, 1);
  h.sched.stop();
  const per = byKey(h.runs);
  const fast = per.get('fast')!;
  t.ok(fast.length >= 99 && fast.length <= 101, `0.1 s period: ${fast.length} runs in 10 s`);
  for (let i = 2; i < fast.length; i++) {
    const gap = fast[i]!.at - fast[i - 1]!.at;
    if (gap < 89 || gap > 111) t.fail(`interval ${gap}`);
  }
  t.ok(per.get('slow')!.length >= 2 && per.get('slow')!.length <= 3);
});

t.test('a probe slower than the period is never run twice at once: the grid point is skipped', async (t) => {
  const h = harness({ latencyMs: 2500, jitter: 0 });
  h.sched.add('slow', 1000);
  h.sched.start();
  await h.advance(10_000, 5);
  h.sched.stop();
  t.notOk(h.overlap);
  const st = h.sched.stats();
  t.ok(st.skippedBusy >= 5, `busy skips counted (${st.skippedBusy})`);
  t.ok(h.runs.length >= 3 && h.runs.length <= 5, `${h.runs.length} runs of a 2.5 s probe in 10 s`);
});

t.test('a blocked event loop skips missed grid points instead of replaying them', async (t) => {
  // A clock whose timers fire late: time jumps, then due timers fire once.
  let now = 0;
  const timers: { at: number; fn: () => void; dead: boolean }[] = [];
  const lazy: Clock = {
    now: () => now,
    wallNow: () => now,
    setTimeout: (fn, ms) => { const x = { at: now + ms, fn, dead: false }; timers.push(x); return x as unknown as TimerHandle; },
    clearTimeout: (hd) => { (hd as unknown as { dead: boolean }).dead = true; },
  };
  const jump = (ms: number): void => {
    now += ms;
    for (const x of timers.splice(0)) if (!x.dead) { if (x.at <= now) x.fn(); else timers.push(x); }
  };
  const runs: number[] = [];
  const skips: [string, number][] = [];
  const s = new ProbeScheduler({ clock: lazy, jitter: 0, random: () => 0, run: (run) => { runs.push(now); run.done(); }, onSkip: (_k, r, n) => skips.push([r, n]) });
  s.add('a', 100);
  s.start();
  jump(0);
  await flush();
  t.same(runs, [0]);
  jump(1000); // the loop was blocked for ten periods
  await flush();
  jump(0);
  await flush();
  t.same(runs, [0, 1000], 'one run after the stall, not ten');
  t.ok(s.stats().skippedOverrun >= 8, `overrun skips counted (${s.stats().skippedOverrun})`);
  t.ok(skips.some(([r]) => r === 'overrun'));
  jump(100);
  await flush();
  t.same(runs, [0, 1000, 1100], 'then back on the period');
  s.stop();
});

t.test('add after start runs at once; remove stops runs and aborts the one in flight', async (t) => {
  const h = harness({ latencyMs: 300 });
  h.sched.add('a', 1000);
  h.sched.start();
  await h.advance(500);
  h.sched.add('b', 1000);
  await h.advance(1);
  t.same(h.runs.map((r) => r.key), ['a', 'b'], 'b runs at once when added');
  h.sched.remove('b');
  t.same(h.aborted, ['b'], 'in-flight run of a removed key is aborted');
  const before = h.runs.filter((r) => r.key === 'b').length;
  await h.advance(5000, 5);
  t.equal(h.runs.filter((r) => r.key === 'b').length, before, 'no run after remove');
  t.ok(h.runs.filter((r) => r.key === 'a').length >= 5);
  t.equal(h.sched.stats().keys, 1);
  h.sched.stop();
});

t.test('setPeriod: the next run is one new period after the last one', async (t) => {
  const h = harness({ jitter: 0 });
  h.sched.add('a', 1000);
  h.sched.start();
  await h.advance(2100, 5);
  const last = h.runs[h.runs.length - 1]!.slot.base;
  const setAt = h.clock.now();
  h.sched.setPeriod('a', 5000);
  await h.advance(12_000, 5);
  let after = h.runs.filter((r) => r.slot.base > last);
  t.equal(Math.round(after[0]!.slot.base), Math.round(last + 5000), 'longer period: one new period after the last run');
  t.equal(Math.round(after[1]!.slot.base - after[0]!.slot.base), 5000);
  const last2 = h.runs[h.runs.length - 1]!.slot.base;
  const setAt2 = h.clock.now();
  h.sched.setPeriod('a', 200);
  await h.advance(2000, 5);
  after = h.runs.filter((r) => r.slot.base > last2);
  t.equal(Math.round(after[0]!.slot.base), Math.round(Math.max(last2 + 200, setAt2)), 'shorter period: at once if a new period already passed');
  for (let i = 1; i < after.length; i++) t.equal(Math.round(after[i]!.slot.base - after[i - 1]!.slot.base), 200);
  t.ok(after.length >= 9);
  void setAt;
  h.sched.stop();
});

t.test('runSoon runs an idle key now; stop ends runs; start runs every key at once again', async (t) => {
  const h = harness({ jitter: 0 });
  h.sched.add('a', 10_000);
  h.sched.start();
  await h.advance(1);
  await h.advance(3000, 10);
  t.equal(h.runs.length, 1);
  h.sched.runSoon('a');
  await h.advance(1);
  t.equal(h.runs.length, 2, 'runSoon ran it');
  h.sched.stop();
  await h.advance(30_000, 100);
  t.equal(h.runs.length, 2, 'nothing while stopped');
  h.sched.start();
  await h.advance(1);
  t.equal(h.runs.length, 3, 'start probes at once');
  h.sched.stop();
});

t.test('a run that throws, or ends twice, does not stop the scheduler', async (t) => {
  const clock = new ManualClock(0);
  let n = 0;
  const s = new ProbeScheduler({ clock, jitter: 0, run: (run) => { n++; if (run.key === 'x') throw new Error('boom'); run.done(); run.done(); } });
  s.add('x', 100);
  s.add('y', 100);
  s.start();
  for (let i = 0; i < 100; i++) { clock.advance(10); await flush(); }
  s.stop();
  t.ok(n >= 18, `kept running (${n} runs)`);
  t.equal(s.stats().inFlight, 0);
});

t.test('coalescing: grid runs due within q start together, at most q late; runs wanted at once are not delayed', async (t) => {
  const clock = new ManualClock(0);
  const runs: { key: string; due: number; at: number }[] = [];
  let armed = 0;
  const realSetTimeout = clock.setTimeout.bind(clock);
  clock.setTimeout = (fn: () => void, ms: number): TimerHandle => { armed++; return realSetTimeout(fn, ms); };
  const s = new ProbeScheduler({ clock, jitter: 0.05, random: prng(3), coalesceMs: 10, maxInFlight: 10_000, run: (run) => { runs.push({ key: run.key, due: run.due, at: clock.now() }); run.done(); } });
  for (let i = 0; i < 1000; i++) s.add(`k${i}`, 1000);
  s.start();
  clock.advance(0);
  t.equal(runs.length, 1000, 'start runs every key at once, not on the next multiple of q');
  t.ok(runs.every((r) => r.at === 0));
  const armedAtStart = armed;
  for (let ms = 0; ms < 5000; ms++) clock.advance(1);
  const grid = runs.slice(1000);
  t.ok(grid.length >= 3900, `${grid.length} grid runs (phase in [1 s, 2 s), then every second)`);
  t.ok(grid.every((r) => r.at >= r.due && r.at - r.due <= 10 + 1e-9), 'each at most q late, never early');
  t.ok(grid.every((r) => r.at % 10 === 0), 'started on multiples of q');
  t.ok(armed - armedAtStart <= 5000 / 10 + 5, `about one wake-up per q (${armed - armedAtStart} timers for ${grid.length} runs)`);
  s.add('late', 1000);
  clock.advance(0);
  t.equal(runs[runs.length - 1]!.key, 'late', 'a key added later runs at once too');
  s.stop();
});

t.test('runs that end at once, with thousands waiting for a slot, neither recurse nor stall', async (t) => {
  const clock = new ManualClock(0);
  let n = 0;
  const s = new ProbeScheduler({ clock, jitter: 0, maxInFlight: 1, run: (run) => { n++; run.done(); } });
  for (let i = 0; i < 20_000; i++) s.add(`k${i}`, 60_000);
  s.start();
  clock.advance(0);
  t.equal(n, 20_000, 'every key ran once, through one slot');
  t.equal(s.stats().inFlight, 0);
  t.equal(s.stats().waiting, 0);
  s.stop();
});

t.test('an abandoned run frees its slot at once; its late done() ends nothing else', async (t) => {
  const clock = new ManualClock(0);
  const inFlight: Run[] = [];
  const s = new ProbeScheduler({ clock, jitter: 0, maxInFlight: 1, run: (run) => { inFlight.push(run); } });
  s.add('a', 1000);
  s.add('b', 1000);
  s.start();
  clock.advance(0);
  t.same(inFlight.map((r) => r.key), ['a'], 'one slot: a runs, b waits');
  const a = inFlight[0]!;
  s.remove('a');
  t.ok(a.aborted, 'a is abandoned');
  t.same(inFlight.map((r) => r.key), ['a', 'b'], 'its slot went to b at once');
  a.done(); // the runner of a, late
  t.equal(s.stats().inFlight, 1, 'b still in flight');
  const b = inFlight[1]!;
  t.notOk(b.aborted);
  b.done();
  t.equal(s.stats().inFlight, 0);
  clock.advance(2000); // the grid: phase in [1 s, 2 s) after the first run
  t.equal(inFlight[2]?.key, 'b', 'b runs again on its period');
  t.equal(inFlight[2], b, 'the same run object, reused once done');
  s.stop();
});

t.test('runExtra: one run now, flagged, outside the grid, which stays where it was', async (t) => {
  const h = harness({ maxInFlight: 64, jitter: 0, latencyMs: 5 });
  h.sched.add('a', 1000);
  h.sched.add('b', 1000);
  h.sched.start();
  await h.advance(3000);
  const gridBefore = h.runs.filter((r) => r.key === 'a').map((r) => r.slot.base);
  const phase = gridBefore.at(-1)! % 1000;
  // Halfway between two grid points of a.
  await h.advance(((phase + 500 - (h.clock.now() % 1000)) + 1000) % 1000);
  const at = h.clock.now();
  t.equal(h.sched.runExtra('a'), true, 'started');
  t.equal(h.sched.runExtra('a'), false, 'not twice while in flight');
  t.equal(h.sched.runExtra('nope'), false, 'an unknown key: nothing');
  const extra = h.runs.at(-1)!;
  t.same([extra.key, extra.extra, extra.slot.base, extra.at], ['a', true, at, at], 'flagged, its base the time it was asked for, run at once');
  await h.advance(3000);
  const after = h.runs.filter((r) => r.key === 'a' && !r.extra && r.at > at).map((r) => r.slot.base % 1000);
  t.ok(after.length >= 2 && after.every((b) => Math.abs(b - phase) < 1e-6), `the grid kept its phase (${phase} ms): ${after.join(', ')}`);
  t.equal(h.runs.filter((r) => r.extra).length, 1, 'grid runs are not flagged');
  t.equal(h.sched.stats().skippedBusy, 0, 'nothing skipped: the extra run ended before the next grid point');
});

t.test('runExtra waits for a free slot like a grid run, and keeps its flag', async (t) => {
  const h = harness({ maxInFlight: 1, jitter: 0, latencyMs: 50 });
  h.sched.add('a', 10_000);
  h.sched.add('b', 10_000);
  h.sched.start();
  await h.advance(200);
  t.equal(h.runs.length, 2, 'both first runs, one after the other');
  h.sched.runExtra('a');
  h.sched.runExtra('b');
  t.equal(h.sched.stats().waiting, 1, 'the second waits for the slot');
  await h.advance(200);
  t.same(h.runs.slice(2).map((r) => [r.key, r.extra]), [['a', true], ['b', true]], 'both ran, in order, flagged');
  h.sched.stop();
  t.equal(h.sched.runExtra('a'), false, 'nothing once stopped');
});

/** Grid runs per 100 ms bucket of [from, from + periodMs), by due time. */
function buckets(runs: readonly { due: number }[], from: number, periodMs: number): number[] {
  const out = new Array<number>(periodMs / 100).fill(0);
  for (const r of runs) if (r.due >= from && r.due < from + periodMs) out[Math.floor((r.due - from) / 100)]!++;
  return out;
}

t.test('3,000 keys over a 5 s period: about 1/period of them due at any moment, not bunched', async (t) => {
  const clock = new ManualClock(0);
  const runs: { key: string; base: number; due: number }[] = [];
  const s = new ProbeScheduler({ clock, jitter: 0, maxInFlight: 10_000, run: (run) => { runs.push({ key: run.key, base: run.base, due: run.due }); run.done(); } });
  for (let i = 0; i < 3000; i++) s.add(`svc${i % 1000}|10.0.${i % 4}.${i % 250}|8080|${i}`, 5000);
  s.start();
  for (let ms = 0; ms < 15_000; ms += 10) clock.advance(10);
  s.stop();
  t.equal(runs.filter((r) => r.due === 0).length, 3000, 'every key once at start');
  for (const from of [5000, 10_000]) {
    const b = buckets(runs, from, 5000);
    t.equal(b.reduce((x, y) => x + y, 0), 3000, `each key once in [${from}, ${from + 5000})`);
    // 3,000 over 50 buckets: 60 each. A uniformly random phase spreads them as
    // Poisson(60) (a bucket of 45 or 75 somewhere in most periods).
    t.ok(Math.min(...b) >= 58 && Math.max(...b) <= 62, `per 100 ms, ${Math.min(...b)} to ${Math.max(...b)} due`);
  }
});

t.test('with the default jitter, every 1 s window holds a fifth of a 5 s period\'s checks', async (t) => {
  const clock = new ManualClock(0);
  const due: number[] = [];
  const s = new ProbeScheduler({ clock, random: prng(11), maxInFlight: 10_000, run: (run) => { due.push(run.due); run.done(); } });
  for (let i = 0; i < 3000; i++) s.add(`k${i}`, 5000);
  s.start();
  for (let ms = 0; ms < 30_000; ms += 10) clock.advance(10);
  s.stop();
  const counts: number[] = [];
  for (let from = 6000; from + 1000 <= 29_000; from += 250) counts.push(due.filter((d) => d >= from && d < from + 1000).length);
  t.ok(counts.length > 80, `${counts.length} windows`);
  t.ok(Math.min(...counts) >= 570 && Math.max(...counts) <= 630, `checks a 1 s window: ${Math.min(...counts)} to ${Math.max(...counts)} (600 is a fifth)`);
});

t.test('phases survive restarts of a grid, removals and additions: a reload does not re-bunch', async (t) => {
  const clock = new ManualClock(0);
  const runs: { key: string; base: number; due: number; extra: boolean }[] = [];
  const s = new ProbeScheduler({ clock, jitter: 0, maxInFlight: 10_000, run: (run) => { runs.push({ key: run.key, base: run.base, due: run.due, extra: run.extra }); run.done(); } });
  for (let i = 0; i < 3000; i++) s.add(`k${i}`, 5000);
  s.start();
  for (let ms = 0; ms < 10_500; ms += 10) clock.advance(10);
  const phaseOf = (from: number): Map<string, number> => {
    const m = new Map<string, number>();
    for (const r of runs) if (!r.extra && r.base >= from && r.base > 0) m.set(r.key, r.base % 5000);
    return m;
  };
  const before = phaseOf(5000);
  t.equal(before.size, 3000, 'every key on its grid');
  // A reload: 300 keys go, 300 new ones come, 100 kept keys get a new
  // subscriber (runSoon), the rest are added again unchanged.
  for (let i = 0; i < 300; i++) s.remove(`k${i}`);
  for (let i = 0; i < 300; i++) s.add(`n${i}`, 5000);
  for (let i = 300; i < 400; i++) s.runSoon(`k${i}`);
  for (let i = 300; i < 3000; i++) s.add(`k${i}`, 5000);
  const at = clock.now();
  clock.advance(0);
  t.equal(runs.filter((r) => r.due === at).length, 400, 'new keys and those with a new subscriber run at once');
  for (let ms = 0; ms < 12_000; ms += 10) clock.advance(10);
  s.stop();
  const after = phaseOf(at + 5000);
  let moved = 0;
  for (let i = 300; i < 3000; i++) if (Math.abs(after.get(`k${i}`)! - before.get(`k${i}`)!) > 1e-6) moved++;
  t.equal(moved, 0, 'no kept key changed phase');
  const freed = new Set([...before].filter(([k]) => Number(k.slice(1)) < 300).map(([, p]) => Math.round(p * 1000)));
  t.ok([...after].filter(([k]) => k.startsWith('n')).every(([, p]) => freed.has(Math.round(p * 1000))), 'new keys took the phases the removed ones left');
  const b = buckets(runs.filter((r) => !r.extra), 16_000, 5000);
  t.ok(Math.min(...b) >= 58 && Math.max(...b) <= 62, `after the reload, per 100 ms: ${Math.min(...b)} to ${Math.max(...b)} due`);
});
