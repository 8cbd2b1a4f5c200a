// Unit tests of the drift guard's reads (agent/daemon/drift.ts), with a fake
// netlink client and ManualClock: a periodic resync re-reads the links every
// time and every address at most every 5 minutes; a loss of notifications
// the watch reports brings a full re-read at once; an address a notification
// brought between full reads is in the snapshot a check sees.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { ManualClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import { DriftGuard } from '../../agent/daemon/drift';
import type { AddressInfo, LinkInfo } from '../../agent/net/netlink/netlink';

const flush = (): Promise<void> => new Promise((r) => setImmediate(r));

function fakeNetlink() {
  const watcher = Object.assign(new EventEmitter(), { close: () => undefined });
  const link: LinkInfo = { index: 2, name: 'eth0', mac: '52:54:00:00:00:01', up: true } as LinkInfo;
  const addrs: AddressInfo[] = [{ index: 2, address: '10.0.0.2', prefix: 24, family: 'IPv4' } as AddressInfo];
  const calls = { links: 0, addresses: 0 };
  const netlink = {
    listLinks: async () => { calls.links++; return [link]; },
    listAddresses: async (_index?: number, family?: string) => { if (family !== 'IPv6') calls.addresses++; return family === 'IPv6' ? [] : [...addrs]; },
    watch: () => watcher,
    deleteLink: async () => true,
    removeAddress: async () => true,
  };
  return { netlink, watcher, calls, addrs };
}

async function advance(clock: ManualClock, ms: number, stepMs = 1000): Promise<void> {
  for (let left = ms; left > 0; left -= stepMs) { clock.advance(Math.min(stepMs, left)); await flush(); await flush(); }
}

function guard(clock: ManualClock, netlink: ReturnType<typeof fakeNetlink>['netlink'], resyncMs = 30_000): DriftGuard {
  return new DriftGuard({
    netlink: netlink as never, parent: { name: 'eth0', index: 2 }, held: () => [], repairSource: async () => undefined,
    log: silentLogger(), clock, resyncMs: () => resyncMs, sysctlPollMs: 3_600_000,
  });
}

t.test('the periodic resync reads the links every time and every address every 5 minutes', async (t) => {
  const clock = new ManualClock(0);
  const { netlink, calls } = fakeNetlink();
  const g = guard(clock, netlink);
  await g.start();
  t.same(calls, { links: 1, addresses: 1 }, 'the start reads everything');
  await advance(clock, 270_000);
  t.same(calls, { links: 10, addresses: 1 }, 'nine resyncs in 4.5 minutes: links each time, no address dump');
  await advance(clock, 30_000);
  t.same(calls, { links: 11, addresses: 2 }, 'the tenth, 5 minutes after the last dump, reads every address');
  await advance(clock, 300_000);
  t.same(calls, { links: 21, addresses: 3 }, 'and so every 5 minutes');
  t.ok(g.status().lastResync !== undefined, 'a resync is reported');
  g.stop();
});

t.test('a resync interval of 5 minutes or more dumps the addresses at every resync', async (t) => {
  const clock = new ManualClock(0);
  const { netlink, calls } = fakeNetlink();
  const g = guard(clock, netlink, 600_000);
  await g.start();
  await advance(clock, 1_200_000, 10_000);
  t.same(calls, { links: 3, addresses: 3 });
  g.stop();
});

t.test('notifications lost (the watch says so): every address is read at once', async (t) => {
  const clock = new ManualClock(0);
  const { netlink, watcher, calls } = fakeNetlink();
  const g = guard(clock, netlink);
  await g.start();
  await advance(clock, 60_000);
  t.same(calls, { links: 3, addresses: 1 });
  watcher.emit('resync');
  await flush();
  await flush();
  t.same(calls, { links: 4, addresses: 2 }, 'a full re-read, not waiting for the timer');
  g.stop();
});
