// Address removals in batches (net/netlink/address-removals.ts) over a
// recording netlink: the removals of one turn go as one removeAddresses
// call, run inside the caller's queue; each caller gets its own address's
// result; a batch that fails as a whole rejects every one of its callers.
// The kernel side (one datagram, an ACK each) is
// test/privileged/ipam-scale.test.ts's.
import t from 'tap';
import { LbError } from '../../../agent/errors';
import { AddressRemovals } from '../../../agent/net/netlink/address-removals';
import type { AddressRef } from '../../../agent/net/netlink/netlink';

function setup(answer: (list: readonly AddressRef[]) => Promise<Array<boolean | LbError>>): { r: AddressRemovals; calls: AddressRef[][]; queued: number[]; flush: () => void } {
  const calls: AddressRef[][] = [];
  const queued: number[] = [];
  const deferred: Array<() => void> = [];
  const r = new AddressRemovals({
    netlink: { removeAddresses: (list) => { calls.push(list.map((a) => ({ index: a.index, address: a.address, prefix: a.prefix }))); return answer(list); } },
    run: (fn) => { queued.push(1); return fn(); },
    defer: (fn) => deferred.push(fn),
  });
  return { r, calls, queued, flush: () => { while (deferred.length > 0) deferred.shift()!(); } };
}

t.test('the removals of one turn are one batch, in the queue; each caller gets its own result', async (t) => {
  const { r, calls, queued, flush } = setup(async (list) => list.map((a) => (a.address.endsWith('.2') ? false : a.address.endsWith('.3') ? new LbError('LB_ERR_NET_NETLINK', 'removing 10.0.0.3/32 from ifindex 2 failed: EPERM') : true)));
  const ps = ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4'].map((a) => r.remove(2, a, 32).then((v) => v, (e: Error) => e.message));
  flush();
  t.same(await Promise.all(ps), [true, false, 'removing 10.0.0.3/32 from ifindex 2 failed: EPERM', true]);
  t.equal(calls.length, 1, 'one removeAddresses call');
  t.equal(calls[0]!.length, 4);
  t.equal(queued.length, 1, 'run once in the queue');
  const later = r.remove(2, '10.0.0.9', 32);
  flush();
  t.equal(await later, true);
  t.equal(calls.length, 2, 'a later turn is a batch of its own');
});

t.test('a batch that fails as a whole rejects each of its callers', async (t) => {
  const { r, flush } = setup(async () => { throw new LbError('LB_ERR_NET_NETLINK', 'rtnetlink client is closed'); });
  const ps = [r.remove(2, '10.0.0.1', 32), r.remove(2, '10.0.0.2', 32)].map((p) => p.then(() => 'resolved', (e: Error) => e.message));
  flush();
  t.same(await Promise.all(ps), ['rtnetlink client is closed', 'rtnetlink client is closed']);
});

t.test('a result missing for an address is an error, not a silent success', async (t) => {
  const { r, flush } = setup(async () => [true]);
  const ps = [r.remove(2, '10.0.0.1', 32), r.remove(2, '10.0.0.2', 32)].map((p) => p.then((v) => v, (e: Error) => e.message));
  flush();
  t.same(await Promise.all(ps), [true, 'no result for 10.0.0.2']);
});

t.test('the batch holds its place in the queue from the first removal: what is queued after it runs after it', async (t) => {
  const order: string[] = [];
  let chain: Promise<unknown> = Promise.resolve();
  const run = <T>(fn: () => Promise<T>): Promise<T> => { const p = chain.then(fn); chain = p.then(() => undefined, () => undefined); return p; };
  const r = new AddressRemovals({ netlink: { removeAddresses: async (list) => { order.push(`remove ${list.map((a) => a.address).join(',')}`); return list.map(() => true); } }, run });
  const first = r.remove(2, '10.0.0.1', 32);
  // A source that released its claim, then another reading the parent to take the address.
  const read = run(async () => { order.push('read the parent'); });
  const second = r.remove(2, '10.0.0.2', 32); // later in the same turn: joins the first batch
  await Promise.all([first, read, second]);
  t.same(order, ['remove 10.0.0.1,10.0.0.2', 'read the parent']);
});
