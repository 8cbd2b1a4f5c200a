// The worker thread entry (proxy-worker.ts) spoken to as the main thread does:
// it says it is ready, serves the descriptors an apply hands it, and answers
// a stop.
import t from 'tap';
import * as net from 'node:net';
import * as path from 'node:path';
import { closeSync } from 'node:fs';
import { Worker } from 'node:worker_threads';
import { type FromWorker, type WorkerStart } from '../../agent/forward/proxy-worker';
import { ENGINE_OPEN, TallyTable } from '../../agent/forward/tallies';
import { dupFd, listenTcp4 } from '../../agent/native/native';
import { parseIPv4 } from '../../agent/address';

t.test('a worker thread: ready, serves what it is given, stops', async (t) => {
  const server = net.createServer((s) => s.end('from backend\n'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const table = new TallyTable(1);
  const start: WorkerStart = {
    index: 0, buffers: table.buffers(), config: { algorithm: 'round-robin', idleTimeout: 60, connectTimeout: 2 },
    maxConnections: 100, backlog: 64, udpIdleMs: 30_000, maxUdpSessions: 16, logLevel: 30,
  };
  const w = new Worker(path.resolve(__dirname, '../../agent/forward/proxy-worker.js'), { workerData: start });
  t.teardown(() => w.terminate());
  const messages: FromWorker[] = [];
  const next = (pred: (m: FromWorker) => boolean): Promise<FromWorker> => new Promise((resolve) => {
    const found = messages.find(pred);
    if (found) { resolve(found); return; }
    const on = (m: FromWorker): void => { if (pred(m)) { w.off('message', on); resolve(m); } };
    w.on('message', on);
  });
  w.on('message', (m: FromWorker) => messages.push(m));
  t.same(await next((m) => m.t === 'ready'), { t: 'ready' });
  const vip = '127.0.0.60';
  const l = listenTcp4(parseIPv4(vip)!, 0, 64, true);
  const flow = table.slot('flow');
  w.postMessage({
    t: 'apply', seq: 1, apply: {
      config: start.config, slots: table.slots, listeners: [{
        id: 'l', serviceKey: 'default/web', vip, port: { name: 'p', port: l.port, protocol: 'TCP', targetPort: (server.address() as net.AddressInfo).port },
        healthy: [{ address: '127.0.0.1', weight: 1, slot: flow }], flows: { '127.0.0.1': flow }, slot: table.slot('listener'), proxyProtocol: undefined, fds: [dupFd(l.fd)],
      }],
    },
  });
  t.match(await next((m) => m.t === 'applied'), { t: 'applied', seq: 1, failures: [], generation: 0 });
  const got = await new Promise<string>((resolve, reject) => {
    const s = net.connect(l.port, vip);
    let d = '';
    s.on('data', (x) => { d += x.toString(); });
    s.on('end', () => resolve(d));
    s.on('error', reject);
  });
  t.equal(got, 'from backend\n', 'the worker accepted on its duplicate and relayed');
  let reported = 0;
  table.drain(0, (key, ok) => { if (key === 'flow' && ok) reported++; });
  t.equal(reported, 1, 'its passive-health result is in the shared ring, not a message');
  // The client's FIN reaches the worker a moment after the client saw the end: then the relay is over.
  for (let i = 0; i < 100 && table.engineField(0, ENGINE_OPEN) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(table.engineField(0, ENGINE_OPEN), 0, 'the relay ended when both sides had');
  w.postMessage({ t: 'stop', seq: 2, keep: false, drainMs: 0 });
  t.same(await next((m) => m.t === 'stopped'), { t: 'stopped', seq: 2, open: 0, unfinished: 0 });
  closeSync(l.fd);
});
