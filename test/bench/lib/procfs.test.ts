// bench/lib/procfs.ts threadsCpuMs against this process: the scheduler's
// time on a CPU, finer than /proc/<pid>/stat's 10 ms ticks.
import t from 'tap';
import { threadsCpuMs, cpuWithChildrenMs } from '../../../bench/lib/procfs';

t.test('threadsCpuMs: this process\'s CPU time grows with work, at sub-tick resolution', async (t) => {
  const before = threadsCpuMs(process.pid);
  t.ok(Number.isFinite(before) && before > 0, `read: ${before} ms`);
  // 30 ms of work by the kernel's own account (getrusage), not 30 ms of wall
  // clock: under a parallel test run the thread may wait for a core (a
  // wall-clock loop read 19.8 ms in CI). Bounded at 5 s of wall clock.
  const cpu0 = process.cpuUsage();
  const deadline = Date.now() + 5000;
  let x = 0;
  for (;;) {
    const used = process.cpuUsage(cpu0);
    if (used.user + used.system >= 30_000 || Date.now() > deadline) break;
    for (let i = 0; i < 1000; i++) x++;
  }
  const after = threadsCpuMs(process.pid);
  t.ok(after - before >= 25, `grew by ${(after - before).toFixed(1)} ms over 30 ms of busy work (${x} turns)`);
  t.not(after % 10, 0, 'not a multiple of a 10 ms tick');
});

t.test('threadsCpuMs: no process, NaN', async (t) => {
  t.ok(Number.isNaN(threadsCpuMs(undefined)));
  t.ok(Number.isNaN(threadsCpuMs(2 ** 22 + 1)), 'a pid above pid_max');
});

t.test('cpuWithChildrenMs: this process\'s CPU in whole ticks, NaN for no process', async (t) => {
  const spin = Date.now() + 50;
  while (Date.now() < spin) { /* burn a few ticks */ }
  const ms = cpuWithChildrenMs(process.pid);
  t.ok(ms > 0 && ms % 10 === 0, `${ms} ms, a multiple of the 10 ms tick`);
  t.ok(Number.isNaN(cpuWithChildrenMs(undefined)));
  t.ok(Number.isNaN(cpuWithChildrenMs(2 ** 30)), 'a pid that is not running');
});
