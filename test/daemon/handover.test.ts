// daemon/handover.ts: the datagram format (pure), the store, and a real
// hand-over of listening sockets between a ControlServer and takeListeners
// over unix sockets (no privileges: loopback listeners, temp directories).
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import t from 'tap';
import pino from 'pino';
import { HandoverStore, handoverMessages, parseHandoverMessage, sendListeners, takeListeners } from '../../agent/daemon/handover';
import { ControlServer } from '../../agent/control/server';

const log = pino({ level: 'silent' });

t.test('handoverMessages: one datagram per 253 descriptors, the last marked end; parse agrees', async (t) => {
  const none = handoverMessages([], 42);
  t.same(none, [{ msg: { ids: [], pid: 42, end: true }, fds: [] }], 'nothing to hand over is still one datagram that ends it');
  const many = Array.from({ length: 300 }, (_, i) => [`l${i}`, 100 + i] as const);
  const msgs = handoverMessages(many, 42);
  t.equal(msgs.length, 2);
  t.same(msgs.map((m) => [m.fds.length, m.msg.end]), [[253, false], [47, true]], 'SCM_MAX_FD per datagram');
  t.same(msgs.flatMap((m) => m.msg.ids), many.map(([id]) => id), 'ids in order');
  for (const m of msgs) t.same(parseHandoverMessage(Buffer.from(JSON.stringify(m.msg)), m.fds.length), m.msg);
});

t.test('parseHandoverMessage refuses what it cannot trust', async (t) => {
  const ok = { ids: ['a'], pid: 7, end: true };
  t.equal(parseHandoverMessage(Buffer.from('{'), 1), 'not JSON');
  t.equal(parseHandoverMessage(Buffer.from('3'), 0), 'not an object');
  t.equal(parseHandoverMessage(Buffer.from(JSON.stringify({ ...ok, ids: [1] })), 1), 'ids is not a list of strings');
  t.equal(parseHandoverMessage(Buffer.from(JSON.stringify({ ...ok, pid: -1 })), 1), 'pid is not a process id');
  t.equal(parseHandoverMessage(Buffer.from(JSON.stringify({ ...ok, end: 'yes' })), 1), 'end is not a boolean');
  t.equal(parseHandoverMessage(Buffer.from(JSON.stringify(ok)), 2), '1 ids for 2 descriptors', 'every descriptor must be named');
});

t.test('HandoverStore: take what was adopted once, keep and drop, release closes the rest', async (t) => {
  const s = new HandoverStore();
  const fdA = fs.openSync('/dev/null', 'r');
  const fdB = fs.openSync('/dev/null', 'r');
  s.adopt('a', fdA);
  s.adopt('b', fdB);
  t.equal(s.pending, 2);
  t.equal(s.take('a'), fdA);
  t.equal(s.take('a'), undefined, 'taken once');
  s.keep('a', fdA);
  s.keep('a', fdA);
  s.keep('c', 99);
  t.same(s.listeners(), [['a', fdA], ['c', 99]], 'kept once each');
  s.drop('c');
  t.same(s.listeners(), [['a', fdA]]);
  s.release();
  t.equal(s.pending, 0);
  t.throws(() => fs.fstatSync(fdB), { code: 'EBADF' }, 'an unwanted inherited descriptor is closed');
  fs.closeSync(fdA);
});

t.test('a real hand-over: the successor gets working listening sockets; nobody there is an ordinary start', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-handover-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const controlSocket = path.join(dir, 'agent.sock');
  t.equal(await takeListeners({ controlSocket, stateDir: dir, store: new HandoverStore(), log }), undefined, 'no daemon: undefined, no error');

  // The "old process": two listeners on loopback, kept in its store.
  const servers = await Promise.all([0, 1].map(() => new Promise<net.Server>((resolve) => {
    const srv = net.createServer((c) => c.end('old\n'));
    srv.listen({ host: '127.0.0.1', port: 0 }, () => resolve(srv));
  })));
  t.teardown(() => { for (const s of servers) s.close(); });
  const old = new HandoverStore();
  servers.forEach((srv, i) => old.keep(`l${i}`, (srv as unknown as { _handle: { fd: number } })._handle.fd));
  let asked: string | undefined;
  const control = new ControlServer({
    socketPath: controlSocket, log,
    handler: (op, req) => {
      if (op !== 'handover') throw new Error('unexpected');
      asked = req.path as string;
      return { pid: process.pid, listeners: sendListeners(asked, old) };
    },
  });
  await control.start();
  t.teardown(() => control.stop());

  const store = new HandoverStore();
  const pid = await takeListeners({ controlSocket, stateDir: dir, store, log });
  t.equal(pid, process.pid, 'the old process named itself');
  t.equal(store.pending, 2, 'both listeners received');
  t.notOk(fs.existsSync(asked!), 'the datagram socket file is gone afterwards');
  // The old process stops accepting; the new one serves from the same sockets.
  const ports = servers.map((s) => (s.address() as net.AddressInfo).port);
  for (const s of servers) s.close();
  for (let i = 0; i < 2; i++) {
    const fd = store.take(`l${i}`)!;
    const srv = net.createServer((c) => c.end('new\n'));
    await new Promise<void>((resolve) => srv.listen({ fd }, () => resolve()));
    t.equal((srv.address() as net.AddressInfo).port, ports[i], `l${i}: the same bound socket`);
    const reply = await new Promise<string>((resolve, reject) => {
      const c = net.connect(ports[i]!, '127.0.0.1');
      let b = '';
      c.on('data', (d) => { b += d.toString(); });
      c.on('end', () => resolve(b));
      c.on('error', reject);
    });
    t.equal(reply, 'new\n', `l${i}: served by the successor`);
    srv.close();
  }
});
