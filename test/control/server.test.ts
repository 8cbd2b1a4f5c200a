// The control socket's protocol: one JSON request line, one JSON answer line.
// Handlers may answer later (a reload answers once applied or refused), and
// an answer that takes longer than the 5 s idle limit still arrives.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ControlServer, ControlHandler, controlRequest } from '../../agent/control/server';
import { silentLogger } from '../../agent/log';

async function serve(t: { teardown(fn: () => unknown): void }, handler: ControlHandler): Promise<string> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-control-'));
  const socket = path.join(dir, 'agent.sock');
  const server = new ControlServer({ socketPath: socket, handler, log: silentLogger() });
  await server.start();
  t.teardown(async () => { await server.stop(); fs.rmSync(dir, { recursive: true, force: true }); });
  return socket;
}

t.test('a plain answer and an answer that comes later', async (t) => {
  const socket = await serve(t, (op) => (op === 'ping' ? 'pong' : new Promise((r) => setTimeout(() => r({ ok: true, message: `${op} done` }), 100))));
  t.equal(await controlRequest(socket, 'ping'), 'pong');
  t.same(await controlRequest(socket, 'reload'), { ok: true, message: 'reload done' });
});

t.test('a handler that throws or rejects is an error naming the op', async (t) => {
  const socket = await serve(t, (op) => {
    if (op === 'sync') throw new Error('unknown op "sync"');
    return Promise.reject(new Error('not now'));
  });
  await t.rejects(controlRequest(socket, 'sync'), { code: 'LB_ERR_CONTROL_PROTOCOL', message: /refused "sync": unknown op "sync"/ });
  await t.rejects(controlRequest(socket, 'reload'), { code: 'LB_ERR_CONTROL_PROTOCOL', message: /refused "reload": not now/ });
});

t.test('an answer later than the 5 s idle limit still arrives', async (t) => {
  const socket = await serve(t, () => new Promise((r) => setTimeout(() => r('slow'), 5600)));
  t.equal(await controlRequest(socket, 'reload', 10_000), 'slow');
});

t.test('a client that sends nothing is cut off', async (t) => {
  const socket = await serve(t, () => 'never asked');
  const net = await import('node:net');
  const closed = await new Promise<number>((resolve) => {
    const t0 = Date.now();
    const s = net.createConnection(socket);
    s.on('close', () => resolve(Date.now() - t0));
    s.on('error', () => undefined);
  });
  t.ok(closed >= 4500 && closed < 8000, `closed after ${closed} ms`);
});
