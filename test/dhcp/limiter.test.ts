// Unit tests of the start limiter on a ManualClock: bounded concurrency,
// the initial random delay, cancellation, and 50 services in waves.
import t from 'tap';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { StartLimiter, sharedStartLimiter, type ReleaseSlot } from '../../agent/dhcp/limiter';

const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('50 services: never more than max at once, each after its jitter', async (t) => {
  const clock = new ManualClock();
  let r = 0;
  const random = (): number => ((r = (r % 10) + 1) / 11); // 1/11 .. 10/11: delays 91..909 ms
  const limiter = new StartLimiter({ max: 8, jitterMs: 1000, clock, random });
  const granted: Array<{ i: number; release: ReleaseSlot }> = [];
  for (let i = 0; i < 50; i++) void limiter.acquire().then((release) => { granted.push({ i, release: release! }); });
  await tick();
  t.equal(granted.length, 0, 'nobody starts before their jitter');
  clock.advance(90);
  await tick();
  t.equal(granted.length, 0, 'still nobody after 90 ms');
  clock.advance(910);
  await tick();
  t.equal(granted.length, 8, 'eight slots granted within the 1 s jitter window');
  t.equal(limiter.active, 8);
  t.equal(limiter.waiting, 42);
  let maxActive = limiter.active;
  for (let round = 0; round < 20 && granted.length < 50; round++) {
    for (const g of granted.splice(0, 3)) { g.release(); g.release(); } // release twice: the second is a no-op
    await tick();
    maxActive = Math.max(maxActive, limiter.active);
    t.ok(limiter.active <= 8, `round ${round}: ${limiter.active} active`);
  }
  t.equal(maxActive, 8);
  for (const g of granted.splice(0)) g.release();
  await tick();
  t.equal(limiter.active, 0);
  t.equal(limiter.waiting, 0);
});

t.test('abort while in the jitter delay or in the queue', async (t) => {
  const clock = new ManualClock();
  const limiter = new StartLimiter({ max: 1, jitterMs: 500, clock, random: () => 0.5 });
  const first = limiter.acquire();
  clock.advance(500);
  const r1 = await first;
  t.type(r1, 'function');
  const a = new AbortController();
  const inJitter = limiter.acquire(a.signal);
  a.abort();
  t.equal(await inJitter, undefined, 'aborted during the jitter delay');
  const b = new AbortController();
  const queued = limiter.acquire(b.signal);
  clock.advance(500);
  await tick();
  t.equal(limiter.waiting, 1);
  b.abort();
  t.equal(await queued, undefined, 'aborted in the queue');
  t.equal(limiter.waiting, 0);
  const c = new AbortController();
  c.abort();
  t.equal(await limiter.acquire(c.signal), undefined, 'already aborted');
  const later = limiter.acquire();
  clock.advance(500);
  await tick();
  r1!();
  t.type(await later, 'function', 'the slot goes to the next waiter');
});

t.test('no jitter: immediate; one shared limiter per registry', async (t) => {
  const limiter = new StartLimiter({ max: 2, jitterMs: 0 });
  const r = await limiter.acquire();
  t.type(r, 'function');
  const reg = new Registry();
  const a = sharedStartLimiter(reg, { max: 3, jitterMs: 0 });
  t.equal(sharedStartLimiter(reg, { max: 9, jitterMs: 0 }), a);
  t.not(sharedStartLimiter(new Registry(), { max: 3, jitterMs: 0 }), a);
});
