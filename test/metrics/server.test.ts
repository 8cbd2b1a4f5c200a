// The metrics endpoint (agent/metrics/server.ts) as Prometheus and a probe
// see it, on a real loopback listener on port 0: /metrics is the registry it
// was given, /healthz answers while the event loop does, /readyz is 200 or 503
// naming what is not ready; other paths and methods are refused, and a port
// that cannot be bound is an error that says which and why.
import t from 'tap';
import * as http from 'node:http';
import { Registry, Counter } from 'prom-client';
import { MetricsServer, type Readiness } from '../../agent/metrics/server';
import { silentLogger } from '../../agent/log';
import { within } from '../../lab/within';

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

async function serve(t: { teardown(fn: () => unknown): void }, registry: Registry, readiness: () => Readiness): Promise<{ server: MetricsServer; port: number }> {
  const server = new MetricsServer({ host: '127.0.0.1', port: 0, registry, readiness, log: silentLogger() });
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
