// The kernel calls that wait for RCU grace periods run on the addon's
// background threads (native/src/background.cc): a packet socket's close(2)
// and RTM_DELLINK. Against the real kernel in a lab namespace: 16 macvlans,
// each with a packet socket, torn down at once as a stop does. The counters
// fail this test if either call silently ran on the event loop's thread
// (an addon without them, or a code path that bypasses them).
import t from 'tap';
import { createLab } from '../../lab/netns';
import { requirePrivileged } from '../helpers/privileged';
import type { BackgroundStats } from '../../agent/native/native';
import { driver } from './fixtures/net-driver-run';

interface Teardown {
  heldBefore: number; heldAfterClose: number; heldAtEnd: number;
  deleted: boolean[]; again: boolean; before: BackgroundStats; after: BackgroundStats;
  fastPath: boolean; remaining: number; tookMs: number; longestGapMs: number;
}

if (requirePrivileged(t)) {
  t.test('packet sockets close and links are deleted on background threads, all of them, and nothing is left', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const count = 16;
    const r = await driver<Teardown>(lab, node, 'background-teardown', { parent: 'eth0', count }, { timeoutMs: 60_000 });
    t.ok(r.ok, JSON.stringify(r.error));
    const x = r.result!;
    t.ok(x.fastPath, 'the addon deletes links in the background');
    t.equal(x.heldBefore, count, 'a packet socket per link while they serve');
    t.equal(x.after.closes - x.before.closes, count, 'each close went to a background thread');
    t.equal(x.after.deletions - x.before.deletions, count + 1, 'each deletion too (the one of a link already gone included)');
    t.equal(x.after.inline - x.before.inline, 0, 'no job ran on the caller for want of a thread');
    t.same(x.deleted, Array(count).fill(true), 'every deletion reported done');
    t.equal(x.again, false, 'deleting a link already gone: false (ENODEV), not an error');
    t.equal(x.remaining, 0, 'no link left');
    t.equal(x.heldAtEnd, 0, 'no packet socket left open once the threads are done');
    t.equal(x.after.threads, 0, 'the threads end with their queue');
    t.ok(x.after.peakThreads > 1, `the waits overlapped on several threads (peak ${x.after.peakThreads})`);
    t.comment(`teardown of ${count}: ${x.tookMs} ms; longest stretch without a 1 ms timer ${x.longestGapMs} ms; packet sockets still held right after close(): ${x.heldAfterClose}`);
  });
}
