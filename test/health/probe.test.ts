// Tests of the TCP and HTTP probes against real listeners on loopback (port 0):
// success closed with a FIN (no RST at the backend), refused, HTTP status
// ranges, HTTP timeout and reset, abort, and the errno -> reason table.
// A TCP connect timeout needs dropped SYNs: see test/privileged/health-tcp.test.ts.
import t from 'tap';
import * as net from 'node:net';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tcpProbe, httpProbe, defaultProbe, reasonOf, type ProbeResult, type ProbeTarget } from '../../agent/health/probe';

const tcp = (port: number): ProbeTarget => ({ address: '127.0.0.1', port, type: 'tcp', http: undefined });
const httpT = (port: number, path = '/healthz', expectStatus: [number, number] = [200, 299]): ProbeTarget =>
  ({ address: '127.0.0.1', port, type: 'http', http: { path, expectStatus } });

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return (server.address() as AddressInfo).port;
}

/** A port nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const s = net.createServer();
  const port = await listen(s);
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

t.test('tcp: a listening port is ok, and the probe closes with a FIN, not a RST', async (t) => {
  const seen: string[] = [];
  const server = net.createServer((sock) => {
    sock.on('end', () => seen.push('fin'));
    sock.on('error', (e: NodeJS.ErrnoException) => seen.push(`error ${e.code}`));
    sock.on('close', () => seen.push('close'));
    // A banner, as SSH or SMTP would send: unread data is what turns a close into a RST.
    sock.write('hello\r\n');
  });
  const port = await listen(server);
  t.teardown(() => server.close());
  for (let i = 0; i < 5; i++) {
    const r = await tcpProbe(tcp(port), { timeoutMs: 1000 });
    t.ok(r.ok, `probe ${i} ok`);
    t.ok(r.durationMs >= 0 && r.durationMs < 1000);
  }
  await new Promise((r) => setTimeout(r, 200));
  t.equal(seen.filter((s) => s === 'fin').length, 5, 'backend saw 5 FINs');
  t.same(seen.filter((s) => s.startsWith('error')), [], 'backend saw no reset');
});

t.test('tcp: a closed port is refused at once', async (t) => {
  const port = await closedPort();
  const r = await tcpProbe(tcp(port), { timeoutMs: 3000 });
  t.notOk(r.ok);
  if (!r.ok) {
    t.equal(r.reason, 'refused');
    t.equal(r.detail, 'ECONNREFUSED');
    t.ok(r.durationMs < 1000, 'long before the timeout');
  }
});

t.test('tcp: an aborted probe resolves as error "aborted"', async (t) => {
  const port = await closedPort();
  const ac = new AbortController();
  ac.abort();
  const r = await tcpProbe(tcp(port), { timeoutMs: 1000, signal: ac.signal });
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['error', 'aborted']);
});

t.test('http: status inside the range is ok, outside is bad-status; path and Host are sent', async (t) => {
  const reqs: { url: string | undefined; host: string | undefined }[] = [];
  let status = 200;
  const server = http.createServer((req, res) => {
    reqs.push({ url: req.url, host: req.headers.host });
    res.writeHead(status, { 'content-type': 'text/plain' });
    res.end('x'.repeat(10_000));
  });
  const port = await listen(server);
  t.teardown(() => server.close());
  let r = await httpProbe(httpT(port), { timeoutMs: 1000 });
  t.ok(r.ok);
  t.equal(r.detail, 'HTTP 200');
  status = 503;
  r = await httpProbe(httpT(port), { timeoutMs: 1000 });
  t.notOk(r.ok);
  if (!r.ok) { t.equal(r.reason, 'bad-status'); t.match(r.detail, /503/); }
  r = await httpProbe(httpT(port, '/ready', [500, 599]), { timeoutMs: 1000 });
  t.ok(r.ok, 'range is inclusive and configurable');
  t.same(reqs.map((x) => x.url), ['/healthz', '/healthz', '/ready']);
  t.equal(reqs[0]!.host, `127.0.0.1:${port}`);
  r = await defaultProbe(httpT(port, '/x', [503, 503]), { timeoutMs: 1000 });
  t.ok(r.ok, 'defaultProbe dispatches on type');
});

t.test('http: no answer within the timeout is a timeout', async (t) => {
  const held: net.Socket[] = [];
  const server = net.createServer((s) => { held.push(s); s.on('error', () => {}); });
  const port = await listen(server);
  t.teardown(() => { for (const s of held) s.destroy(); server.close(); });
  const r = await httpProbe(httpT(port), { timeoutMs: 300 });
  t.notOk(r.ok);
  if (!r.ok) {
    t.equal(r.reason, 'timeout');
    t.ok(r.durationMs >= 290, `took ${Math.round(r.durationMs)} ms`);
  }
});

t.test('http: an abort while the backend is silent resolves at once and closes the connection', async (t) => {
  let backendSaw: Promise<void> | undefined;
  const connected = new Promise<void>((resolve) => {
    const server = net.createServer((s) => {
      // Reads (so it sees the close) but never answers.
      backendSaw = new Promise((r) => s.on('close', () => r()));
      s.on('error', () => {});
      s.resume();
      resolve();
    });
    t.teardown(() => server.close());
    void listen(server).then((port) => { probe = httpProbe(httpT(port), { timeoutMs: 10_000, signal: ac.signal }); });
  });
  const ac = new AbortController();
  let probe: Promise<ProbeResult> | undefined;
  await connected;
  ac.abort();
  const r = await probe!;
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['error', 'aborted']);
  await backendSaw;
  t.pass('the backend saw the connection close');
});

t.test('http: a connection reset before the answer is a reset', async (t) => {
  const server = net.createServer((s) => { s.once('data', () => s.resetAndDestroy()); });
  const port = await listen(server);
  t.teardown(() => server.close());
  const r = await httpProbe(httpT(port), { timeoutMs: 1000 });
  t.notOk(r.ok);
  if (!r.ok) t.equal(r.reason, 'reset');
});

t.test('http: a closed port is refused', async (t) => {
  const r = await httpProbe(httpT(await closedPort()), { timeoutMs: 1000 });
  t.same(r.ok ? 'ok' : r.reason, 'refused');
});

t.test('invalid input is reported, never thrown', async (t) => {
  const a = await tcpProbe(tcp(70_000), { timeoutMs: 500 });
  t.same(a.ok ? 'ok' : a.reason, 'error');
  const b = await httpProbe(httpT(1, '/bad path'), { timeoutMs: 500 });
  t.same(b.ok ? 'ok' : b.reason, 'error');
});

t.test('errno -> reason', async (t) => {
  const table: [string | undefined, string][] = [
    ['ECONNREFUSED', 'refused'], ['ETIMEDOUT', 'timeout'], ['ECONNRESET', 'reset'], ['EPIPE', 'reset'],
    ['EHOSTUNREACH', 'unreachable'], ['ENETUNREACH', 'unreachable'], ['EHOSTDOWN', 'unreachable'],
    ['EMFILE', 'error'], ['EADDRNOTAVAIL', 'error'], [undefined, 'error'],
  ];
  for (const [code, reason] of table) t.equal(reasonOf(Object.assign(new Error('x'), { code })), reason, String(code));
  t.equal(reasonOf(null), 'error');
});
