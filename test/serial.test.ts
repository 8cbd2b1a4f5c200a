// SerialQueue: work runs one at a time, in order; a failure rejects only its caller.
import t from 'tap';
import { SerialQueue } from '../agent/serial';

t.test('runs in order without overlap, failures isolated', async (t) => {
  const q = new SerialQueue();
  let running = 0;
  let maxRunning = 0;
  const order: number[] = [];
  const job = (n: number, fail = false) => q.run(async () => {
    running++;
    maxRunning = Math.max(maxRunning, running);
    await new Promise((r) => setTimeout(r, 5 - (n % 5)));
    order.push(n);
    running--;
    if (fail) throw new Error(`job ${n} failed`);
    return n;
  });
  const results = await Promise.allSettled([job(0), job(1, true), job(2), job(3), job(4, true), job(5)]);
  t.same(order, [0, 1, 2, 3, 4, 5], 'in submission order');
  t.equal(maxRunning, 1, 'never two at once');
  t.same(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
  t.equal((results[2] as PromiseFulfilledResult<number>).value, 2);
});
