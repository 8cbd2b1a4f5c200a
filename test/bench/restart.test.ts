// bench/restart.ts, its pure half: an event's window of the client loop
// counts only the requests started in it (failures, longest request, first
// answer after the event), and the medians and the all-rounds failure count
// leave out the rounds whose event itself went wrong (say a rejected reload).
import t from 'tap';
import { measureWindow, summarizeRestart, type EventRun } from '../../bench/restart';
import type { ClientResult } from '../../lab/client-loop';

const ok = (at: number, ms = 5, body = 'b1'): ClientResult => ({ t: at, ms, ok: true, body });
const bad = (at: number, ms = 1, error = 'ECONNREFUSED'): ClientResult => ({ t: at, ms, ok: false, error });

t.test('a window without failures: the first answer after the event, the longest request', async (t) => {
  const results = [ok(1000), ok(1020, 40), ok(1040), ok(1060, 7), ok(1080)];
  const m = measureWindow(results, { from: 1000, at: 1050, to: 1100 });
  t.same(m, { requests: 5, failures: 0, longestMs: 40, firstAnswerAfterMs: 17, gapMs: 0, errors: {}, wrongBodies: 0 });
});

t.test('a gap: failures counted by error, the gap runs to the end of the first answer after it', async (t) => {
  const results = [ok(1000), bad(1020), bad(1040, 500, 'timeout'), bad(1060), ok(1080, 10, 'b2'), ok(1100)];
  const m = measureWindow(results, { from: 1000, at: 1015, to: 1200 });
  t.equal(m.failures, 3);
  t.same(m.errors, { ECONNREFUSED: 2, timeout: 1 });
  t.equal(m.longestMs, 500, 'a timed-out request lasts its deadline');
  t.equal(m.gapMs, 1090 - 1020);
  t.equal(m.firstAnswerAfterMs, 1090 - 1015);
});

t.test('requests outside the window belong to other events', async (t) => {
  const results = [bad(900), ok(1000), ok(1020), bad(1100), ok(1120)];
  const m = measureWindow(results, { from: 1000, at: 1010, to: 1100 });
  t.equal(m.requests, 2);
  t.equal(m.failures, 0, 'the failures before and after the window are not this event\'s');
});

t.test('an answer from something not a backend is counted', async (t) => {
  const m = measureWindow([ok(1000, 5, 'b1'), ok(1020, 5, 'default backend page')], { from: 1000, at: 1000, to: 1100 });
  t.equal(m.wrongBodies, 1);
});

t.test('no answer after the event: first answer unknown, not 0', async (t) => {
  const m = measureWindow([ok(1000), bad(1020), bad(1040)], { from: 1000, at: 1010, to: 1100 });
  t.ok(Number.isNaN(m.firstAnswerAfterMs));
});

t.test('medians per event and failures summed, over the rounds whose event went as planned', async (t) => {
  const run = (who: EventRun['who'], event: EventRun['event'], round: number, failures: number, longestMs: number, error?: string): EventRun => ({
    who, event, round, requests: 50, failures, longestMs, firstAnswerAfterMs: 20 + failures * 20, gapMs: failures * 20, errors: {}, wrongBodies: 0, ...(error ? { error } : {}),
  });
  const rows = summarizeRestart([
    run('proxy', 'planned', 0, 40, 20), run('haproxy', 'seamless-reload', 0, 0, 30),
    run('proxy', 'planned', 1, 50, 25), run('haproxy', 'seamless-reload', 1, 0, 60),
    run('proxy', 'planned', 2, 60, 30, 'reload rejected'), run('haproxy', 'seamless-reload', 2, 1, 45),
  ]);
  t.same(rows.map((r) => `${r.who}/${r.event}`), ['proxy/planned', 'haproxy/seamless-reload'], 'in the order first seen');
  t.match(rows[0], { failures: 45, longestMs: 23, totalFailures: 90, runs: 3, runsOk: 2 });
  t.match(rows[1], { failures: 0, longestMs: 45, firstAnswerAfterMs: 20, totalFailures: 1, runs: 3, runsOk: 3 });
});
