// The proxy's shared counters: each engine writes its own region, the main
// thread sums them; slots grow, are released only when idle, and a gone
// engine's open connections leave the count. Real worker threads write in
// one test, so the sharing is the real thing, not a same-thread stand-in.
import t from 'tap';
import * as path from 'node:path';
import { Worker } from 'node:worker_threads';
import {
  ENGINE_OPEN, FLOW_BYTES_TO_CLIENT, FLOW_CONNECTIONS, REPORT_RING, TallyTable, TallyWriter,
} from '../../agent/forward/tallies';

t.test('each engine writes its region; the table sums them; least-connections sees every engine', async (t) => {
  const table = new TallyTable(2);
  const a = table.slot('flow-a');
  const b = table.slot('flow-b');
  t.not(a, b);
  t.equal(table.slot('flow-a'), a, 'a key keeps its slot');
  const w0 = new TallyWriter(table.buffers(), 0);
  const w1 = new TallyWriter(table.buffers(), 1);
  w0.add(a, FLOW_CONNECTIONS, 3);
  w1.add(a, FLOW_CONNECTIONS, 4);
  w1.add(a, FLOW_BYTES_TO_CLIENT, 2 ** 40);
  t.equal(table.sum(a, FLOW_CONNECTIONS), 7);
  t.equal(table.sum(a, FLOW_BYTES_TO_CLIENT), 2 ** 40, 'byte counts beyond 32 bits are exact');
  t.equal(table.sum(b, FLOW_CONNECTIONS), 0);
  w0.activeAdd(a, 2);
  w1.activeAdd(a, 1);
  t.equal(w0.activeTotal(a), 3, 'an engine sees the other engine\'s open connections');
  t.equal(table.activeTotal(a), 3);
});

t.test('maxConnections is exact over engines; a gone engine\'s connections leave the count', async (t) => {
  const table = new TallyTable(2);
  const w0 = new TallyWriter(table.buffers(), 0);
  const w1 = new TallyWriter(table.buffers(), 1);
  t.ok(w0.tryOpen(3));
  t.ok(w1.tryOpen(3));
  t.ok(w1.tryOpen(3));
  t.notOk(w0.tryOpen(3), 'the fourth is refused, whoever asks');
  t.equal(table.open, 3);
  w0.closed();
  t.equal(table.open, 2);
  t.equal(table.engineField(1, ENGINE_OPEN), 2);
  table.resetEngine(1);
  t.equal(table.open, 0, 'engine 1 ended: its two connections are gone');
  t.ok(w0.tryOpen(1));
});

t.test('slots grow: engines move their regions over and keep counting; release waits for idle slots', async (t) => {
  const table = new TallyTable(2, 2);
  const s0 = table.slot('k0');
  const w0 = new TallyWriter(table.buffers(), 0);
  const w1 = new TallyWriter(table.buffers(), 1);
  w0.add(s0, FLOW_CONNECTIONS, 5);
  w1.add(s0, FLOW_CONNECTIONS, 1);
  table.slot('k1');
  const s2 = table.slot('k2'); // past capacity 2: new buffers
  t.equal(table.slots.capacity, 4);
  t.notOk(table.settled, 'engines still write the old buffers');
  t.equal(table.sum(s0, FLOW_CONNECTIONS), 6, 'read from where each engine writes');
  w0.adopt(table.slots);
  table.confirm(0, table.slots.generation);
  w0.add(s0, FLOW_CONNECTIONS, 1);
  w0.add(s2, FLOW_CONNECTIONS, 9);
  t.equal(table.sum(s0, FLOW_CONNECTIONS), 7, 'engine 0 moved (its 5 came along), engine 1 not yet');
  t.equal(table.sum(s2, FLOW_CONNECTIONS), 9);
  table.release(new Set(['k0', 'k2']));
  t.equal(table.slotOf('k1'), 1, 'nothing is released before every engine took the new buffers');
  w1.adopt(table.slots);
  table.confirm(1, table.slots.generation);
  t.equal(table.sum(s0, FLOW_CONNECTIONS), 7);
  w1.activeAdd(s2, 1);
  table.release(new Set(['k0']));
  t.equal(table.slotOf('k1'), undefined, 'an idle unwanted slot is released');
  t.equal(table.slotOf('k2'), s2, 'a slot with an open connection is kept');
  const again = table.slot('k3');
  t.equal(again, 1, 'the released slot is reused');
  t.equal(table.sum(again, FLOW_CONNECTIONS), 0, 'and starts from zero');
});

t.test('passive-health results: in order per engine, named by key; a full ring says so', async (t) => {
  const table = new TallyTable(1, 4);
  const a = table.slot('svc\u0000TCP/80\u000010.0.0.1');
  const b = table.slot('svc\u0000TCP/80\u000010.0.0.2');
  const w = new TallyWriter(table.buffers(), 0);
  w.report(a, true);
  w.report(b, false);
  w.report(a, true);
  const seen: [string, boolean][] = [];
  table.drain(0, (k, ok) => seen.push([k.split('\u0000')[2]!, ok]));
  t.same(seen, [['10.0.0.1', true], ['10.0.0.2', false], ['10.0.0.1', true]]);
  seen.length = 0;
  table.drain(0, (k, ok) => seen.push([k, ok]));
  t.same(seen, [], 'drained once');
  let n = 0;
  while (w.report(a, true)) n++;
  t.equal(n, REPORT_RING, 'the ring holds REPORT_RING results, then refuses');
  table.drain(0, () => undefined);
  t.ok(w.report(a, false), 'room again after a drain');
});

t.test('counters written by two real worker threads add up', async (t) => {
  const table = new TallyTable(2);
  const slot = table.slot('flow');
  const script = `
    const { workerData, parentPort } = require('node:worker_threads');
    const { TallyWriter, FLOW_CONNECTIONS } = require(${JSON.stringify(path.resolve(__dirname, '../../agent/forward/tallies.js'))});
    const w = new TallyWriter(workerData.buffers, workerData.index);
    for (let i = 0; i < 100000; i++) { w.add(workerData.slot, FLOW_CONNECTIONS, 1); if (w.tryOpen(1e9)) w.closed(); w.report(workerData.slot, true); }
    parentPort.postMessage('done');
  `;
  const run = (index: number): Promise<void> => new Promise((resolve, reject) => {
    const w = new Worker(script, { eval: true, workerData: { buffers: table.buffers(), index, slot } });
    w.once('message', () => { void w.terminate(); resolve(); });
    w.once('error', reject);
  });
  let reports = 0;
  const drainer = setInterval(() => { table.drain(0, () => reports++); table.drain(1, () => reports++); }, 1);
  await Promise.all([run(0), run(1)]);
  clearInterval(drainer);
  table.drain(0, () => reports++);
  table.drain(1, () => reports++);
  t.equal(table.sum(slot, FLOW_CONNECTIONS), 200000, 'no increment lost: each engine is the only writer of its region');
  t.equal(table.open, 0, 'the atomic open count balances');
  t.ok(reports > 0 && reports <= 200000, `reports drained while written (${reports}; a full ring refuses, never overwrites)`);
});
