// Runtime tuning around a start and reloads (agent/daemon/tuning.ts): the
// optimizer hold is released once, by whichever comes first; the code cache
// is written when the start settles; a collection runs after a start and a
// reload through the hook offered, or gc().
import t from 'tap';
import { RuntimeTuning, collectGarbage } from '../../agent/daemon/tuning';
import { silentLogger } from '../../agent/log';

t.test('the hold is released once, on settled or stop, and the cache written on settled', async (t) => {
  let released = 0;
  let saved = 0;
  const tune = new RuntimeTuning({
    holdOptimizer: () => () => { released++; },
    codeCache: { state: 'written', reason: undefined, save: () => { saved++; return { written: 1024 }; } } as never,
  }, silentLogger());
  tune.begin();
  tune.started();
  tune.settled();
  tune.stopping();
  t.equal(released, 1, 'released once');
  t.equal(saved, 1, 'cache written when settled');
  const t2 = new RuntimeTuning({ holdOptimizer: () => () => { released++; } }, silentLogger());
  t2.begin();
  t2.stopping();
  t2.stopping();
  t.equal(released, 2, 'a stop releases it, once');
});

t.test('a collection runs the hook when offered, gc() when the hook says it could not', async (t) => {
  const g = globalThis as { gc?: () => void };
  const before = g.gc;
  let gcs = 0;
  let trims = 0;
  g.gc = () => { gcs++; };
  t.teardown(() => { g.gc = before; });
  let hooked = 0;
  collectGarbage(() => { hooked++; return true; }, () => { trims++; });
  await new Promise((r) => setImmediate(r));
  t.same([hooked, gcs, trims], [1, 0, 1], 'the hook ran instead of gc(), then the trim');
  collectGarbage(() => false, undefined);
  await new Promise((r) => setImmediate(r));
  t.equal(gcs, 1, 'no hook available: gc()');
});
