// Unit tests of shared parent reads (ipam/parent-reads.ts) over a real SerialQueue.
import t from 'tap';
import { ParentReads } from '../../agent/ipam/parent-reads';
import { SerialQueue } from '../../agent/serial';

t.test('callers that ask before the read starts share it; later ones get the next', async (t) => {
  const q = new SerialQueue();
  const reads = new ParentReads<number>({ run: (fn) => q.run(fn) });
  let n = 0;
  const read = async (): Promise<number> => ++n;
  const order: string[] = [];
  const first = Array.from({ length: 100 }, (_, i) => reads.read('eth0|IPv4|', read, (p) => { order.push(`a${i}`); return p * 1000 + i; }));
  const other = reads.read('eth1|IPv4|', read, (p) => p);
  const got = await Promise.all(first);
  t.same(got.map((g) => g.p), Array<number>(100).fill(1), 'one read for the hundred callers of one key');
  t.equal(got[42]!.result, 1042, 'each caller\'s own follow-up');
  t.same(order.slice(0, 3), ['a0', 'a1', 'a2'], 'follow-ups in the order asked');
  t.equal((await other).p, 2, 'another key reads for itself');
  const later = await reads.read('eth0|IPv4|', read, (p) => p);
  t.equal(later.p, 3, 'a caller after the read started gets a read of its own');
  t.equal(reads.reads, 3);
});

t.test('a failed read rejects its batch; a failed follow-up only its caller', async (t) => {
  const q = new SerialQueue();
  const reads = new ParentReads<number>({ run: (fn) => q.run(fn) });
  const bad = [reads.read('k', () => Promise.reject(new Error('ENODEV')), () => 1), reads.read('k', () => Promise.resolve(5), () => 2)];
  for (const b of bad) await t.rejects(b, { message: 'ENODEV' });
  const one = reads.read('k', () => Promise.resolve(7), () => { throw new Error('state corrupt'); });
  const two = reads.read('k', () => Promise.resolve(8), (p) => p);
  await t.rejects(one, { message: 'state corrupt' });
  t.same(await two, { p: 7, result: 7 }, 'the other caller of the batch is served');
});
