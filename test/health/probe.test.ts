// Tests of the TCP, HTTP and HTTPS probes against real listeners on loopback
// (port 0): success closed with a FIN (no RST at the backend), refused, HTTP
// status ranges, HTTP timeout and reset, abort, the errno -> reason table;
// HTTPS with and without verification against certificates the openssl CLI
// makes (lab/tls.ts), the server name sent, a stalled handshake.
// A TCP connect timeout needs dropped SYNs: see test/privileged/health-tcp.test.ts.
import t from 'tap';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import * as http from 'node:http';
import * as https from 'node:https';
import * as tls from 'node:tls';
import type { TLSSocket } from 'node:tls';
import { tcpProbe, httpProbe, httpsProbe, defaultProbe, reasonOf, tlsFailure, httpsTimeoutDetail, parseStatusLine, httpRequestText, STATUS_LINE_MAX, TLS_RESUME_MS, type ProbeResult, type ProbeTarget, type TlsResumption } from '../../agent/health/probe';
import { createTestCa, type Leaf, type TestCa } from '../../lab/tls';
import { parseProxyHeader, type ParsedProxyHeader } from '../../lab/proxy-protocol';
import { listen, closedPort } from './loopback';

const tcp = (port: number): ProbeTarget => ({ address: '127.0.0.1', port, type: 'tcp', http: undefined });
const httpT = (port: number, path = '/healthz', expectStatus: [number, number] = [200, 299]): ProbeTarget =>
  ({ address: '127.0.0.1', port, type: 'http', http: { path, expectStatus } });

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

/** A backend that requires the PROXY header of `version` (parsed strictly, test/helpers/proxy-protocol.ts) and records it. */
async function proxyProtocolBackend(t: tap.Test, version: 1 | 2, http = false): Promise<{ port: number; seen: { header?: ParsedProxyHeader; error?: string; peer: string; rest: string }[] }> {
  const seen: { header?: ParsedProxyHeader; error?: string; peer: string; rest: string }[] = [];
  const server = net.createServer((sock) => {
    let buf = Buffer.alloc(0);
    const peer = `${sock.remoteAddress}:${sock.remotePort}`;
    sock.on('error', () => undefined);
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const r = parseProxyHeader(version, buf);
      if ('more' in r) return;
      if ('error' in r) { sock.removeAllListeners('data'); seen.push({ error: r.error, peer, rest: '' }); sock.destroy(); return; }
      const rest = buf.subarray(r.header.length).toString('latin1');
      if (http && !rest.includes('\r\n\r\n')) return; // the whole request first
      sock.removeAllListeners('data');
      sock.resume();
      seen.push({ header: r.header, peer, rest });
      if (http) sock.end('HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok');
      else sock.end();
    });
  });
  const port = await listen(server);
  t.teardown(() => server.close());
  return { port, seen };
}

t.test('tcp and http probes with PROXY protocol v1: a valid TCP4 line with the probe\'s own endpoints (issue 17)', async (t) => {
  for (const type of ['tcp', 'http'] as const) {
    const b = await proxyProtocolBackend(t, 1, type === 'http');
    const target: ProbeTarget = { ...(type === 'tcp' ? tcp(b.port) : httpT(b.port, '/healthz', [200, 299])), proxyProtocol: 'v1' };
    const r = await defaultProbe(target, { timeoutMs: 2000 });
    t.ok(r.ok, `${type} probe ok (${r.ok ? '' : r.detail})`);
    await new Promise((res) => setTimeout(res, 50));
    t.equal(b.seen.length, 1);
    const s = b.seen[0]!;
    t.notOk(s.error, `${type}: the header parses (${s.error ?? ''})`);
    t.same([`${s.header?.source}:${s.header?.sourcePort}`, s.header?.destination, s.header?.destinationPort], [s.peer, '127.0.0.1', b.port],
      `${type}: it names the probe's own connection, as the spec asks of health checks`);
    if (type === 'http') t.match(s.rest, /^GET \/healthz HTTP\/1\.1\r\n/, 'the request follows the header');
  }
});

t.test('tcp and http probes with PROXY protocol v2: the LOCAL command (issue 17)', async (t) => {
  for (const type of ['tcp', 'http'] as const) {
    const b = await proxyProtocolBackend(t, 2, type === 'http');
    const r = await defaultProbe({ ...(type === 'tcp' ? tcp(b.port) : httpT(b.port, '/', [200, 299])), proxyProtocol: 'v2' }, { timeoutMs: 2000 });
    t.ok(r.ok, `${type} probe ok`);
    await new Promise((res) => setTimeout(res, 50));
    t.same(b.seen.map((s) => [s.error, s.header?.command, s.header?.transport, s.header?.length]), [[undefined, 'LOCAL', 'unspec', 16]], `${type}: LOCAL, no addresses`);
  }
  // Without the option the same backend sees no header, and refuses the connection.
  const b = await proxyProtocolBackend(t, 2, true);
  const plain = await httpProbe(httpT(b.port, '/', [200, 299]), { timeoutMs: 1000 });
  t.notOk(plain.ok, 'a probe without the header fails against a backend that requires it');
});

t.test('http probe with PROXY protocol: a refused connect and the timeout are reported as before', async (t) => {
  const port = await closedPort();
  const r = await httpProbe({ ...httpT(port), proxyProtocol: 'v2' }, { timeoutMs: 1000 });
  t.same(r.ok ? 'ok' : r.reason, 'refused');
  const silent = net.createServer(() => undefined);
  const sp = await listen(silent);
  t.teardown(() => silent.close());
  const slow = await httpProbe({ ...httpT(sp), proxyProtocol: 'v1' }, { timeoutMs: 300 });
  t.same(slow.ok ? 'ok' : slow.reason, 'timeout', 'connected, header sent, no response: a timeout');
});

// --- HTTPS -------------------------------------------------------------------

/** A lab CA (openssl CLI) for the HTTPS probe tests, made once, removed when the file's tests end. */
let caP: Promise<TestCa> | undefined;
function testCa(): Promise<TestCa> {
  if (!caP) {
    caP = createTestCa();
    void caP.then((ca) => t.teardown(() => ca.remove()));
  }
  return caP;
}

/** An HTTPS server on loopback with `leaf`, answering `status`; the server names and Host headers it saw. */
async function httpsBackend(t: { teardown(fn: () => unknown): void }, leaf: Leaf, status = 200): Promise<{ port: number; seen: { servername: string | false; host: string | undefined }[] }> {
  const seen: { servername: string | false; host: string | undefined }[] = [];
  const server = https.createServer({ cert: fs.readFileSync(leaf.cert), key: fs.readFileSync(leaf.key) }, (req, res) => {
    seen.push({ servername: (req.socket as TLSSocket).servername ?? false, host: req.headers.host });
    res.writeHead(status);
    res.end('ok');
  });
  server.on('tlsClientError', () => undefined);
  const port = await listen(server);
  t.teardown(() => server.close());
  return { port, seen };
}

const httpsT = (port: number, o: { sni?: string; ca?: string; expectStatus?: [number, number] } = {}): ProbeTarget => ({
  address: '127.0.0.1', port, type: 'https', http: { path: '/healthz', expectStatus: o.expectStatus ?? [200, 399] },
  tls: { servername: o.sni, verify: o.ca !== undefined, context: tls.createSecureContext(o.ca !== undefined ? { ca: o.ca } : {}) },
});

t.test('https without a CA: any certificate passes (expired, self-signed), no server name is sent, the status decides', async (t) => {
  const ca = await testCa();
  const expired = await ca.issue('old', { dns: ['web.lab'], notBefore: new Date(Date.now() - 20 * 86400_000), notAfter: new Date(Date.now() - 10 * 86400_000) });
  const self = await ca.selfSigned('self', 'web.lab');
  for (const leaf of [expired, self]) {
    const b = await httpsBackend(t, leaf);
    const r = await defaultProbe(httpsT(b.port), { timeoutMs: 2000 });
    t.ok(r.ok, `${path.basename(leaf.cert)}: up without verification (${r.ok ? r.detail ?? '' : r.detail})`);
    t.same(b.seen, [{ servername: false, host: `127.0.0.1:${b.port}` }], 'no SNI, as HAProxy\'s check-ssl without check-sni');
  }
  const down = await httpsBackend(t, self, 503);
  const r = await httpsProbe(httpsT(down.port), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['bad-status', 'HTTP 503, expected 200-399']);
});

t.test('https with a CA: a valid certificate passes; expired, another CA\'s, or another name fails with the reason', async (t) => {
  const ca = await testCa();
  const caPem = fs.readFileSync(ca.caFile, 'utf8');
  const good = await httpsBackend(t, await ca.issue('good', { dns: ['web.lab'] }));
  const expired = await httpsBackend(t, await ca.issue('expired', { dns: ['web.lab'], notBefore: new Date(Date.now() - 20 * 86400_000), notAfter: new Date(Date.now() - 86400_000) }));
  const stranger = await httpsBackend(t, await ca.selfSigned('stranger', 'web.lab'));

  let r = await httpsProbe(httpsT(good.port, { ca: caPem, sni: 'web.lab' }), { timeoutMs: 2000 });
  t.ok(r.ok, `valid, right name: up (${r.ok ? '' : r.detail})`);
  t.same(good.seen.at(-1), { servername: 'web.lab', host: 'web.lab' }, 'the server name is sent, and asked for as Host');
  r = await httpsProbe(httpsT(good.port, { ca: caPem }), { timeoutMs: 2000 });
  t.ok(r.ok, 'without sni the chain is verified, the name is not');
  r = await httpsProbe(httpsT(good.port, { ca: caPem, sni: 'other.lab' }), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : r.reason, 'tls', 'another name: down');
  t.match(r.ok ? '' : r.detail, /other\.lab.*is not in the cert's altnames: DNS:web\.lab/);
  r = await httpsProbe(httpsT(expired.port, { ca: caPem, sni: 'web.lab' }), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['tls', 'certificate has expired']);
  r = await httpsProbe(httpsT(stranger.port, { ca: caPem, sni: 'web.lab' }), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['tls', 'self-signed certificate']);
});

t.test('https: a port that never finishes the handshake times out as such, and its socket is closed', async (t) => {
  let open = 0;
  let closed = 0;
  const stall = net.createServer((s) => { open++; s.on('close', () => closed++); s.on('error', () => undefined); s.resume(); });
  const port = await listen(stall);
  t.teardown(() => stall.close());
  const r = await httpsProbe(httpsT(port), { timeoutMs: 300 });
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['timeout', 'TLS handshake timed out after 300 ms']);
  t.ok(r.durationMs >= 290 && r.durationMs < 1500, `within the timeout (${Math.round(r.durationMs)} ms)`);
  await new Promise((res) => setTimeout(res, 100));
  t.same([open, closed], [1, 1], 'the stalled connection is gone');
  const refused = await httpsProbe(httpsT(await closedPort()), { timeoutMs: 1000 });
  t.same(refused.ok ? 'ok' : refused.reason, 'refused');
});

t.test('https against a plain HTTP port: the handshake fails with OpenSSL\'s reason', async (t) => {
  const server = http.createServer((_req, res) => res.end('ok'));
  const port = await listen(server);
  t.teardown(() => server.close());
  const r = await httpsProbe(httpsT(port), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : r.reason, 'tls');
  t.match(r.ok ? '' : r.detail, /^TLS handshake failed: /);
});

t.test('tlsFailure and the timeout text: pure', async (t) => {
  t.same(tlsFailure(Object.assign(new Error('certificate has expired'), { code: 'CERT_HAS_EXPIRED' })), { reason: 'tls', detail: 'certificate has expired' });
  t.same(tlsFailure(Object.assign(new Error('x:error:0A00010B:SSL routines::wrong version number'), { code: 'ERR_SSL_WRONG_VERSION_NUMBER', reason: 'wrong version number' })),
    { reason: 'tls', detail: 'TLS handshake failed: wrong version number' });
  t.same(tlsFailure(Object.assign(new Error('Client network socket disconnected before secure TLS connection was established'), { code: 'ECONNRESET' })).reason, 'reset');
  t.same(tlsFailure(new Error('odd')), { reason: 'error', detail: 'odd' });
  t.same(['connect', 'handshake', 'response'].map((p) => httpsTimeoutDetail(p as 'connect', 2000)),
    ['no connection within 2000 ms', 'TLS handshake timed out after 2000 ms', 'no response within 2000 ms']);
});

t.test('https: a target resumes its TLS session, and makes a full handshake again after TLS_RESUME_MS or a failure', async (t) => {
  const ca = await testCa();
  const leaf = await ca.issue('resume', { dns: ['web.lab'] });
  const reused: boolean[] = [];
  const server = https.createServer({ cert: fs.readFileSync(leaf.cert), key: fs.readFileSync(leaf.key) }, (req, res) => {
    reused.push((req.socket as TLSSocket).isSessionReused());
    res.end('ok');
  });
  const port = await listen(server);
  t.teardown(() => server.close());
  const base = httpsT(port, { ca: fs.readFileSync(ca.caFile, 'utf8'), sni: 'web.lab' });
  const resume: TlsResumption = { session: undefined, fullAt: 0 };
  const target: ProbeTarget = { ...base, tls: { ...base.tls!, resume } };
  t.ok((await httpsProbe(target, { timeoutMs: 2000 })).ok);
  await new Promise((r) => setTimeout(r, 50));
  const first = resume.session;
  t.ok(first, 'the full handshake\'s session (its TLS 1.3 ticket, after the handshake) kept');
  for (let i = 0; i < 2; i++) t.ok((await httpsProbe(target, { timeoutMs: 2000 })).ok);
  t.same(reused, [false, true, true], 'the first probe makes a full handshake, the next ones resume');
  t.equal(resume.session, first, 'resumed probes offer that session again and take no new one');
  resume.fullAt -= TLS_RESUME_MS;
  t.ok((await httpsProbe(target, { timeoutMs: 2000 })).ok);
  t.equal(reused.at(-1), false, 'after TLS_RESUME_MS a full handshake again: the certificate is verified again');
  t.ok((await httpsProbe(target, { timeoutMs: 2000 })).ok);
  t.equal(reused.at(-1), true);
  const wrongName: ProbeTarget = { ...target, tls: { ...target.tls!, servername: 'other.lab' } };
  resume.fullAt -= TLS_RESUME_MS;
  const r = await httpsProbe(wrongName, { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : r.reason, 'tls', 'a full handshake verifies');
  t.equal(resume.session, undefined, 'a failed handshake drops the session');
  const plain = await httpsProbe(base, { timeoutMs: 2000 });
  t.ok(plain.ok);
  t.equal(reused.at(-1), false, 'settings without a resumption slot never resume');
});

t.test('parseStatusLine: the final status of an HTTP/1.x answer, interim answers skipped, anything else named (pure)', async (t) => {
  t.equal(parseStatusLine('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'), 200);
  t.equal(parseStatusLine('HTTP/1.0 503 Service Unavailable\r\n'), 503);
  t.equal(parseStatusLine('HTTP/1.1 204\r\n'), 204, 'no reason phrase');
  t.equal(parseStatusLine('HTTP/1.1 404 Not Found\n'), 404, 'a bare LF ends the line too');
  t.equal(parseStatusLine('HTTP/1.1 20'), 'more', 'a line cut in two: more');
  t.equal(parseStatusLine(''), 'more');
  t.equal(parseStatusLine('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 302 Found\r\nLocation: /\r\n\r\n'), 302, '1xx skipped, header block and all');
  t.equal(parseStatusLine('HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n'), 200);
  t.equal(parseStatusLine('HTTP/1.1 100 Continue\r\n\r\n'), 'more', 'the final answer still to come');
  t.equal(parseStatusLine('HTTP/1.1 101 Switching Protocols\r\n'), 101, '101 is final');
  t.same(parseStatusLine('SSH-2.0-OpenSSH_9.2\r\n'), { error: 'not an HTTP/1.x status line: "SSH-2.0-OpenSSH_9.2"' });
  t.same(parseStatusLine('HTTP/2 200\r\n'), { error: 'not an HTTP/1.x status line: "HTTP/2 200"' });
  t.same(parseStatusLine('HTTP/1.1 600 Odd\r\n'), { error: 'not an HTTP/1.x status line: "HTTP/1.1 600 Odd"' });
  t.same(parseStatusLine('HTTP/1.1 2000 OK\r\n'), { error: 'not an HTTP/1.x status line: "HTTP/1.1 2000 OK"' });
  t.same(parseStatusLine('x'.repeat(STATUS_LINE_MAX + 1)), { error: `no status line in the first ${STATUS_LINE_MAX} bytes` }, 'an endless line is bounded');
  t.same(parseStatusLine(`HTTP/1.1 100 Continue\r\n${'X-A: b\r\n'.repeat(STATUS_LINE_MAX / 8 + 1)}`), { error: `interim answers longer than ${STATUS_LINE_MAX} bytes` });
  t.same(parseStatusLine('HTTP/1.1 100 Continue\r\n\r\n'.repeat(STATUS_LINE_MAX / 25 + 1)), { error: `no status line in the first ${STATUS_LINE_MAX} bytes` }, 'interim answers without end are bounded in all');
});

t.test('httpRequestText: the path, Host as address:port (IPv6 in brackets) or the server name, Connection: close', async (t) => {
  const http = { path: '/healthz?x=1', expectStatus: [200, 399] as const };
  const ctx = tls.createSecureContext({});
  t.equal(httpRequestText({ address: '10.0.0.1', port: 8443, type: 'https', http, tls: { servername: undefined, verify: false, context: ctx } }),
    'GET /healthz?x=1 HTTP/1.1\r\nHost: 10.0.0.1:8443\r\nUser-Agent: lb-agent-health\r\nAccept: */*\r\nConnection: close\r\n\r\n');
  t.match(httpRequestText({ address: 'fd00::1', port: 443, type: 'https', http, tls: { servername: undefined, verify: false, context: ctx } }), /\r\nHost: \[fd00::1\]:443\r\n/);
  t.match(httpRequestText({ address: '10.0.0.1', port: 443, type: 'https', http, tls: { servername: 'web.lab', verify: false, context: ctx } }), /\r\nHost: web\.lab\r\n/);
});

t.test('https: answers that are not HTTP, that end before a status, that hold a 1xx first', async (t) => {
  const ca = await testCa();
  const leaf = await ca.issue('odd', { dns: ['web.lab'] });
  const opts = { cert: fs.readFileSync(leaf.cert), key: fs.readFileSync(leaf.key) };
  const serve = async (onRequest: (s: tls.TLSSocket) => void): Promise<number> => {
    const server = tls.createServer(opts, (s) => { s.on('error', () => {}); s.once('data', () => onRequest(s)); });
    const port = await listen(server);
    t.teardown(() => server.close());
    return port;
  };
  const garbage = await serve((s) => s.end('SSH-2.0-nope\r\n'));
  let r = await httpsProbe(httpsT(garbage), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : [r.reason, r.detail], ['error', 'not an HTTP/1.x status line: "SSH-2.0-nope"']);
  const hangup = await serve((s) => s.end());
  r = await httpsProbe(httpsT(hangup), { timeoutMs: 2000 });
  t.same(r.ok ? 'ok' : r.reason, 'reset', 'closed before a status line');
  const interim = await serve((s) => { s.write('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2'); setTimeout(() => s.end('04 No Content\r\n\r\n'), 20); });
  r = await httpsProbe(httpsT(interim), { timeoutMs: 2000 });
  t.same(r.ok ? r.detail : r.detail, 'HTTP 204', 'the final status, across two reads');
});
