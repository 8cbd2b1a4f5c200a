// The control socket's protocol: one JSON request line, one JSON answer line.
// Handlers may answer later (a reload answers once applied or refused), and
// an answer that takes longer than the 5 s idle limit still arrives.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ControlServer, ControlHandler, JsonText, controlRequest, controlStream, httpRequestOf } from '../../agent/control/server';
import { silentLogger } from '../../agent/log';

// Two subtests wait out 5 s idle limits on their own sockets; nothing is
// shared between subtests, so they run side by side (the file's wall time
// was their sum).
t.jobs = 2;

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

t.test('an answer already serialised is sent as it is', async (t) => {
  const doc = new JsonText(JSON.stringify({ services: [{ name: 'web', vip: '10.99.0.200' }] }));
  const socket = await serve(t, () => doc);
  t.same(await controlRequest(socket, 'status'), { services: [{ name: 'web', vip: '10.99.0.200' }] });
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

/** Send raw bytes to the socket; the text that comes back before the server closes. */
async function raw(socket: string, text: string): Promise<string> {
  const net = await import('node:net');
  return new Promise((resolve) => {
    let out = '';
    const s = net.createConnection(socket, () => s.write(text));
    s.setEncoding('utf8');
    s.on('data', (d: string) => { out += d; });
    s.on('close', () => resolve(out));
    s.on('error', () => undefined);
  });
}

t.test('the socket is 0600, replaces a stale file, and is removed at stop', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-control-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const socket = path.join(dir, 'run', 'agent.sock');
  fs.mkdirSync(path.dirname(socket));
  fs.writeFileSync(socket, 'left by a dead daemon');
  const server = new ControlServer({ socketPath: socket, handler: () => 'pong', log: silentLogger() });
  await server.start();
  t.ok(fs.statSync(socket).isSocket(), 'the stale file was replaced by the socket');
  t.equal(fs.statSync(socket).mode & 0o777, 0o600, 'only root may ask (status shows backends, reload changes state)');
  t.equal(await controlRequest(socket, 'ping'), 'pong');
  await server.stop();
  t.notOk(fs.existsSync(socket), 'removed at stop');
  await server.stop();
});

t.test('malformed requests get an error answer; an oversized one is cut off', async (t) => {
  const asked: string[] = [];
  const socket = await serve(t, (op) => { asked.push(op); return 'x'; });
  t.match(JSON.parse(await raw(socket, 'status\n')), { ok: false, error: /JSON/ }, 'not JSON');
  t.same(JSON.parse(await raw(socket, '{"cmd":"status"}\n')), { ok: false, error: 'request has no "op"' });
  t.same(JSON.parse(await raw(socket, '{"op":7}\n')), { ok: false, error: 'request has no "op"' }, 'op must be a string');
  t.equal(await raw(socket, 'x'.repeat(70_000)), '', 'a request over 64 KiB without a newline: closed, no answer');
  t.same(asked, [], 'the handler never saw any of them');
});

t.test('a client is told when no daemon listens, or the answer is unreadable', async (t) => {
  const net = await import('node:net');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-control-'));
  const liar = net.createServer((s) => { s.resume(); s.end('not json\n'); });
  // Reads (so it sees the client go) but never answers.
  const quiet = net.createServer((s) => { s.resume(); s.on('error', () => undefined); });
  t.teardown(async () => {
    for (const srv of [liar, quiet]) await new Promise((r) => srv.close(r));
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const none = path.join(dir, 'none.sock');
  await t.rejects(controlRequest(none, 'status'), { code: 'LB_ERR_CONTROL_UNREACHABLE', message: `cannot reach the agent at ${none}: ENOENT (is lb-agent running? \`systemctl status lb-agent\`)` });
  const liarSock = path.join(dir, 'liar.sock');
  await new Promise<void>((r) => liar.listen(liarSock, r));
  await t.rejects(controlRequest(liarSock, 'status'), { code: 'LB_ERR_CONTROL_PROTOCOL', message: `unreadable answer from ${liarSock}` });
  const muteSock = path.join(dir, 'mute.sock');
  await new Promise<void>((r) => quiet.listen(muteSock, r));
  await t.rejects(controlRequest(muteSock, 'status', 300), { code: 'LB_ERR_CONTROL_UNREACHABLE', message: `no answer from ${muteSock} within 300 ms` });
});

t.test('controlStream: the answer\'s data as the daemon sent it, chunk by chunk, never parsed', async (t) => {
  // Larger than a socket's buffer: it arrives in many chunks.
  const text = JSON.stringify({ services: Array.from({ length: 5000 }, (_, i) => ({ key: `default/s${i}`, vip: `10.0.${i >> 8}.${i & 255}`, reason: 'a "quoted" }\n reason' })) });
  const socket = await serve(t, (op) => (op === 'status' ? new JsonText(text) : op === 'ping' ? 'pong' : Promise.reject(new Error('not now'))));
  const chunks: Buffer[] = [];
  await controlStream(socket, 'status', (c) => chunks.push(c));
  t.ok(chunks.length > 1, `in ${chunks.length} chunks`);
  t.equal(Buffer.concat(chunks).toString('utf8'), text, 'byte for byte the document, without the answer\'s envelope');
  let plain = '';
  await controlStream(socket, 'ping', (c) => { plain += c.toString('utf8'); });
  t.equal(plain, '"pong"', 'an answer not serialised beforehand streams as its JSON');
  let refused = '';
  await t.rejects(controlStream(socket, 'reload', (c) => { refused += c.toString('utf8'); }), { code: 'LB_ERR_CONTROL_PROTOCOL', message: 'the daemon refused "reload": not now' });
  t.equal(refused, '', 'nothing written for a refusal');
  const net = await import('node:net');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-control-'));
  // Dies mid-answer: what came is written, and the cut is an error.
  const cut = net.createServer((s) => { s.resume(); s.end('{"ok":true,"data":{"services":[1,2'); });
  const cutSock = path.join(dir, 'cut.sock');
  await new Promise<void>((r) => cut.listen(cutSock, r));
  t.teardown(async () => { await new Promise((r) => cut.close(r)); fs.rmSync(dir, { recursive: true, force: true }); });
  let partial = '';
  await t.rejects(controlStream(cutSock, 'status', (c) => { partial += c.toString('utf8'); }), { code: 'LB_ERR_CONTROL_PROTOCOL', message: `the answer from ${cutSock} was cut short` });
  t.equal(partial, '{"services":[1', 'all but the last two bytes, held back as the tail they might be');
  await t.rejects(controlStream(path.join(dir, 'none.sock'), 'status', () => undefined), { code: 'LB_ERR_CONTROL_UNREACHABLE' });
});

t.test('httpRequestOf: GET of a view is its op; another method or path is refused; anything else is the line protocol', async (t) => {
  t.same(httpRequestOf('GET /status HTTP/1.1\r'), { op: 'status' });
  t.same(httpRequestOf('GET /status?pretty HTTP/1.0'), { op: 'status' }, 'a query is not part of the path');
  t.same(httpRequestOf('GET /ping HTTP/1.1'), { op: 'ping' });
  t.match(httpRequestOf('GET /reload HTTP/1.1'), { status: 404, error: 'no view at /reload: GET /status or GET /ping' });
  t.match(httpRequestOf('POST /status HTTP/1.1'), { status: 405, error: /^POST is not answered here: the control socket's HTTP views are read-only/ });
  for (const line of ['{"op":"status"}', 'GET /status', 'GET /status HTTP/2', 'get /status HTTP/1.1', 'GET  /status HTTP/1.1']) t.equal(httpRequestOf(line), undefined, line);
});

/** One raw exchange on a unix socket: what is sent, and everything answered until the daemon closes. */
async function exchange(socket: string, request: string): Promise<string> {
  const net = await import('node:net');
  return new Promise((resolve, reject) => {
    const s = net.createConnection(socket);
    const got: Buffer[] = [];
    s.on('connect', () => s.write(request));
    s.on('data', (d: Buffer) => got.push(d));
    s.on('end', () => resolve(Buffer.concat(got).toString('utf8')));
    s.on('error', reject);
  });
}

t.test('an HTTP GET of /status: the document as the body, a newline after it, the connection closed', async (t) => {
  const text = JSON.stringify({ services: Array.from({ length: 3000 }, (_, i) => ({ key: `default/s${i}`, note: 'é → \u{1F600}' })) });
  const ops: string[] = [];
  const socket = await serve(t, (op) => { ops.push(op); if (op === 'status') return new JsonText(text); if (op === 'ping') return 'pong'; throw new Error(`op ${op} must not be reached over HTTP`); });
  // Sent in two writes: the answer waits for the end of the header section.
  const net = await import('node:net');
  const split = await new Promise<string>((resolve, reject) => {
    const s = net.createConnection(socket);
    const got: Buffer[] = [];
    s.on('connect', () => { s.write('GET /status HTTP/1.1\r\nHost: lb-agent\r\n'); setTimeout(() => s.write('Accept: */*\r\n\r\n'), 50); });
    s.on('data', (d: Buffer) => got.push(d));
    s.on('end', () => resolve(Buffer.concat(got).toString('utf8')));
    s.on('error', reject);
  });
  const [head, ...rest] = split.split('\r\n\r\n');
  t.match(head, /^HTTP\/1\.1 200 OK\r\nContent-Type: application\/json\r\n/);
  t.notMatch(head, /Content-Length/i, 'the body ends with the connection');
  t.equal(rest.join('\r\n\r\n'), `${text}\n`, 'the document byte for byte, then a newline');
  t.equal((await exchange(socket, 'GET /ping HTTP/1.0\r\n\r\n')).split('\r\n\r\n')[1], '"pong"\n', 'a view not serialised beforehand: its JSON');
  const post = await exchange(socket, 'POST /status HTTP/1.1\r\nContent-Length: 0\r\n\r\n');
  t.match(post, /^HTTP\/1\.1 405 Method Not Allowed\r\n/);
  t.match(JSON.parse(post.split('\r\n\r\n')[1]!), { error: /^POST is not answered here/ });
  const reload = await exchange(socket, 'GET /reload HTTP/1.1\r\n\r\n');
  t.match(reload, /^HTTP\/1\.1 404 Not Found\r\n/);
  t.same(JSON.parse(reload.split('\r\n\r\n')[1]!), { error: 'no view at /reload: GET /status or GET /ping' });
  t.same(ops, ['status', 'ping'], 'a refused request reaches no op');
  // The line protocol on the same socket is unchanged.
  t.same(await controlRequest(socket, 'ping'), 'pong');
});

t.test('a socket path that cannot be bound is LB_ERR_DAEMON_START naming it', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-control-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  // A directory with something in it where the socket should go: not a stale socket to replace.
  const socket = path.join(dir, 'agent.sock');
  fs.mkdirSync(socket);
  fs.writeFileSync(path.join(socket, 'keep'), '');
  const server = new ControlServer({ socketPath: socket, handler: () => 'x', log: silentLogger() });
  await t.rejects(server.start(), { code: 'LB_ERR_DAEMON_START', message: `cannot listen on control socket ${socket}: listen EADDRINUSE: address already in use ${socket}` });
  t.ok(fs.existsSync(path.join(socket, 'keep')), 'what was there is left alone');
});
