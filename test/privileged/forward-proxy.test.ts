// Privileged: the userspace proxy data path end to end in a lab: client ->
// VIP:port on the node (the proxy listens there) -> backends b1..b3. The
// common scenarios are in fixtures/forward-scenarios.ts; here also the proxy's
// own duties: a dead backend is retried around and reported (passive health),
// and stop() closes the listeners.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { applyWeb, HTTP_PORT, VIP, type Burst } from '../../lab/forward';
import { commonScenarios } from './fixtures/forward-scenarios';

if (requirePrivileged(t)) {
  t.test('proxy data path', async (t) => {
    const { fl, driver, client } = await commonScenarios(t, 'proxy', ['--report-connects']);
    const http = { host: VIP, port: HTTP_PORT };

    await t.test('a backend that died but is still "healthy": connects retried elsewhere, failures reported', async (t) => {
      await applyWeb(driver, { b1: 1, b2: 1, b3: 1 });
      await fl.backends[2]!.stop();
      const mark = driver.events.length;
      const r = await client.request<Burst>({ cmd: 'burst', ...http, n: 30, concurrency: 2 });
      t.same(r.errors, {}, 'no client saw the dead backend');
      t.equal(r.counts['b3'] ?? 0, 0);
      // Worker threads hand passive-health results over in batches (a failure at once, successes within 50 ms).
      await waitFor('30 successes reported', () => driver.events.slice(mark).filter((e) => e['event'] === 'connect' && e['ok'] === true).length >= 30, 5000);
      const reports = driver.events.slice(mark).filter((e) => e['event'] === 'connect');
      t.ok(reports.some((e) => e['backend'] === '10.99.0.13' && e['ok'] === false), 'connect failures to b3 reported (passive health)');
      t.ok(reports.filter((e) => e['ok'] === true).length >= 30, 'successes reported too');
    });

    await t.test('the worker threads accepted the connections (the addon relays them)', async (t) => {
      const st = await driver.request<{ details: { workers: { thread: boolean; accepted: number }[] } }>({ cmd: 'stats' });
      t.ok(st.details.workers.length > 0 && st.details.workers.every((w) => w.thread), 'every engine is a worker thread');
      t.ok(st.details.workers.reduce((n, w) => n + w.accepted, 0) > 0, `${st.details.workers.map((w) => w.accepted).join(' + ')} accepted`);
    });

    await t.test('stop closes the listeners', async (t) => {
      await driver.request({ cmd: 'stop' });
      const r = await client.request<{ result: string }>({ cmd: 'connect', ...http, timeoutMs: 3000 });
      t.equal(r.result, 'refused', 'nothing listens on VIP:80 any more');
    });
  });
}
