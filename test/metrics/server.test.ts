// The metrics endpoint (agent/metrics/server.ts) as Prometheus and a probe
// see it, on a real loopback listener on port 0: /metrics is the registry it
// was given, /healthz answers while the event loop does, /readyz is 200 or 503
// naming what is not ready; other paths and methods are refused, and a port
// that cannot be bound is an error that says which and why.
import t from 'tap';
import * as http from 'node:http';
import { Registry, Counter } from 'prom-client';
import { MetricsServer, type MetricsLimits, type Readiness } from '../../agent/metrics/server';
import * as net from 'node:net';
import { silentLogger } from '../../agent/log';
import { within } from '../../lab/within';
import { SeriesFamily } from '../../agent/metrics/series';

interface Reply { status: number; headers: http.IncomingHttpHeaders; body: string }

function request(port: number, urlPath: string, method = 'GET'): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path: urlPath, method, agent: false, timeout: 5000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

async function serve(t: { teardown(fn: () => unknown): void }, registry: Registry, readiness: () => Readiness, limits: Partial<MetricsLimits> = { reuseMs: 0 }): Promise<{ server: MetricsServer; port: number }> {
  const server = new MetricsServer({ host: '127.0.0.1', port: 0, registry, readiness, log: silentLogger(), limits });
  const { port } = await server.start();
  t.teardown(() => server.stop());
  return { server, port };
}

t.test('/metrics is the registry it was given, in the text format', async (t) => {
  const registry = new Registry();
  const c = new Counter({ name: 'lbagent_test_things_total', help: 'Things.', labelNames: ['service'], registers: [registry] });
  c.inc({ service: 'web' }, 3);
  const { port } = await serve(t, registry, () => ({ ready: true, notReady: [] }));
  t.ok(port > 0, `listening on an ephemeral port (${port})`);
  const r = await request(port, '/metrics');
  t.equal(r.status, 200);
  t.equal(r.headers['content-type'], registry.contentType);
  t.match(r.body, /# HELP lbagent_test_things_total Things\.\n# TYPE lbagent_test_things_total counter\nlbagent_test_things_total\{service="web"\} 3\n/);
  c.inc({ service: 'web' });
  t.match((await request(port, '/metrics?x=1')).body, /lbagent_test_things_total\{service="web"\} 4/, 'read at every scrape; a query string is ignored');
  const head = await request(port, '/metrics', 'HEAD');
  t.equal(head.status, 200, 'HEAD is answered');
  t.equal(head.body, '', 'without a body');
});

t.test('a page of kept family texts is served byte for byte as registry.metrics() writes it, with its length', async (t) => {
  const registry = new Registry();
  const up = new SeriesFamily({ name: 'lbagent_test_up', help: 'Up.', type: 'gauge', labelNames: ['service', 'namespace'], registers: [registry] });
  // A name outside ASCII: the length is of the UTF-8 bytes, not of the characters.
  for (let i = 0; i < 1000; i++) up.set([i === 7 ? 'caf\u00e9-\u6f22' : `s${i}`, 'default'], i % 3 === 0 ? 0 : 1);
  const c = new Counter({ name: 'lbagent_test_things_total', help: 'Things.', registers: [registry] });
  c.inc(2);
  const { port } = await serve(t, registry, () => ({ ready: true, notReady: [] }));
  const want = await registry.metrics();
  const r = await request(port, '/metrics');
  t.equal(r.status, 200);
  t.equal(r.body, want, 'the body is the registry\'s text');
  t.equal(r.headers['content-length'], String(Buffer.byteLength(want)), 'content-length is its UTF-8 length');
  t.equal(r.headers['transfer-encoding'], undefined, 'not chunked');
  up.set(['s1', 'default'], 0);
  const again = await request(port, '/metrics');
  t.equal(again.body, await registry.metrics(), 'a changed value: the page is the registry\'s new text');
  const head = await request(port, '/metrics', 'HEAD');
  t.equal(head.headers['content-length'], String(Buffer.byteLength(again.body)), 'HEAD gives the length');
  t.equal(head.body, '', 'and no body');
});

t.test('a collect callback that fails is a 500 that says so, and the next scrape works', async (t) => {
  const registry = new Registry();
  let fail = true;
  new Counter({ name: 'lbagent_test_flaky_total', help: 'Flaky.', registers: [registry], collect() { if (fail) throw new Error('boom'); } });
  const { port } = await serve(t, registry, () => ({ ready: true, notReady: [] }));
  const r = await request(port, '/metrics');
  t.equal(r.status, 500);
  t.match(r.body, /metrics collection failed: boom/);
  fail = false;
  t.equal((await request(port, '/metrics')).status, 200);
});

t.test('/healthz and /readyz', async (t) => {
  let ready: Readiness = { ready: false, notReady: ['default/web: no VIP yet', 'default/api: no healthy backend: new connections are refused'] };
  const { port } = await serve(t, new Registry(), () => ready);
  const h = await request(port, '/healthz');
  t.same([h.status, h.body], [200, 'ok\n']);
  const nr = await request(port, '/readyz');
  t.equal(nr.status, 503, 'not ready: 503');
  t.equal(nr.body, 'not ready:\n  default/web: no VIP yet\n  default/api: no healthy backend: new connections are refused\n', 'naming every service that is not ready and why');
  ready = { ready: true, notReady: [] };
  const r = await request(port, '/readyz');
  t.same([r.status, r.body], [200, 'ready\n'], 'asked at each request');
});

t.test('other paths are 404 with the routes; other methods 405', async (t) => {
  const { port } = await serve(t, new Registry(), () => ({ ready: true, notReady: [] }));
  for (const p of ['/', '/metric', '/metrics/x', '/../etc/passwd']) {
    const r = await request(port, p);
    t.same([r.status, r.body], [404, 'not found: try /metrics, /healthz, /readyz\n'], `GET ${p}`);
  }
  for (const m of ['POST', 'PUT', 'DELETE']) {
    const r = await request(port, '/metrics', m);
    t.equal(r.status, 405, `${m} /metrics`);
    t.equal(r.headers.allow, 'GET, HEAD');
  }
});

t.test('a port in use is LB_ERR_METRICS_LISTEN naming the address and what to do', async (t) => {
  const { port } = await serve(t, new Registry(), () => ({ ready: true, notReady: [] }));
  const second = new MetricsServer({ host: '127.0.0.1', port, registry: new Registry(), readiness: () => ({ ready: true, notReady: [] }), log: silentLogger() });
  await t.rejects(second.start(), { code: 'LB_ERR_METRICS_LISTEN', message: `cannot listen for metrics on 127.0.0.1:${port}: EADDRINUSE (another process holds the port; change metrics.listen)` });
  const foreign = new MetricsServer({ host: '192.0.2.1', port: 0, registry: new Registry(), readiness: () => ({ ready: true, notReady: [] }), log: silentLogger() });
  await t.rejects(foreign.start(), { code: 'LB_ERR_METRICS_LISTEN', message: /cannot listen for metrics on 192\.0\.2\.1:0: EADDRNOTAVAIL$/ }, 'an address this host does not have');
});

t.test('stop() closes the listener and idle keep-alive connections, and may be called twice', async (t) => {
  const server = new MetricsServer({ host: '127.0.0.1', port: 0, registry: new Registry(), readiness: () => ({ ready: true, notReady: [] }), log: silentLogger() });
  const { port } = await server.start();
  // A scraper's keep-alive connection stays open between scrapes.
  const agent = new http.Agent({ keepAlive: true });
  await new Promise<void>((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/healthz', agent }, (res) => { res.resume(); res.on('end', resolve); }).on('error', reject);
  });
  // Without closing it, close() would wait for the server's 5 s keep-alive timeout.
  const stopped = await within(server.stop().then(() => 'stopped'), 4000);
  t.equal(stopped, 'stopped', 'stop() does not wait for an idle scraper connection');
  await server.stop();
  agent.destroy();
  await t.rejects(request(port, '/healthz'), { code: 'ECONNREFUSED' }, 'nothing listens after stop');
});

t.test('200 concurrent scrapes share one gather, all succeed, and /healthz answers throughout', async (t) => {
  const registry = new Registry();
  let collects = 0;
  // A collector that takes the event loop for 30 ms, as a large registry does.
  new Counter({ name: 'lbagent_test_slow_total', help: 'Slow.', registers: [registry], collect() { collects++; const end = Date.now() + 30; while (Date.now() < end) { /* busy */ } } });
  const { server, port } = await serve(t, registry, () => ({ ready: true, notReady: [] }), { reuseMs: 1000 });
  const scrapes = Array.from({ length: 200 }, () => request(port, '/metrics'));
  const health = (async () => { const out: number[] = []; for (let i = 0; i < 10; i++) { out.push((await request(port, '/healthz')).status); } return out; })();
  const replies = await Promise.all(scrapes);
  t.equal(replies.filter((r) => r.status === 200 && r.body.includes('lbagent_test_slow_total')).length, 200, 'every scrape answered in full');
  t.same(await health, Array(10).fill(200), '/healthz answered while they ran');
  t.ok(server.gathers <= 3 && collects <= 3, `${server.gathers} gather(s), ${collects} collect(s) for 200 scrapes`);
});

t.test('a scrape within the reuse interval is served from the last gather; after it, a new one', async (t) => {
  const registry = new Registry();
  const c = new Counter({ name: 'lbagent_test_n_total', help: 'N.', registers: [registry] });
  const { server, port } = await serve(t, registry, () => ({ ready: true, notReady: [] }), { reuseMs: 300 });
  t.match((await request(port, '/metrics')).body, /lbagent_test_n_total 0/);
  c.inc();
  t.match((await request(port, '/metrics')).body, /lbagent_test_n_total 0/, 'the same gather');
  await new Promise((r) => setTimeout(r, 350));
  t.match((await request(port, '/metrics')).body, /lbagent_test_n_total 1/, 'a new one after the interval');
  t.equal(server.gathers, 2);
});

t.test('clients that send their headers slowly are closed by the header timeout; the endpoint keeps answering', async (t) => {
  const { port } = await serve(t, new Registry(), () => ({ ready: true, notReady: [] }), { headersTimeoutMs: 1000, checkEveryMs: 250 });
  const slow: net.Socket[] = [];
  const closedAt: number[] = [];
  const t0 = Date.now();
  for (let i = 0; i < 300; i++) {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => undefined);
    s.on('close', () => closedAt.push(Date.now() - t0));
    s.write('G');
    slow.push(s);
  }
  t.teardown(() => { for (const s of slow) s.destroy(); });
  // One header byte a second, as a slowloris client sends.
  const drip = setInterval(() => { for (const s of slow) if (!s.destroyed) s.write('E'); }, 1000);
  t.teardown(() => clearInterval(drip));
  const deadline = Date.now() + 8000;
  while (closedAt.length < 300 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  clearInterval(drip);
  t.equal(closedAt.length, 300, 'every slow client closed');
  t.ok(Math.max(...closedAt) < 4000, `within the timeout and a check (${Math.max(...closedAt)} ms)`);
  t.equal((await request(port, '/healthz')).status, 200, 'the endpoint answers');
});
