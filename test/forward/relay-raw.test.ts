// The fast relay path (relay-raw.ts): Node's own tcp_wrap/stream_wrap bindings
// are there and have the shape it needs; without them the proxy falls back to
// net streams and says so; an error on one side resets both. The behaviours
// every relay must have run in proxy.test.ts with this path on.
import t from 'tap';
import * as net from 'node:net';
import { loadRawBinding, rawShutdownPath } from '../../agent/forward/relay-raw';
import { ProxyDataplane } from '../../agent/forward/proxy';
import { parseIPv4 } from '../../agent/ipv4';
import { socketInfo, type NativeSocketInfo } from '../../agent/net/native';
import * as fs from 'node:fs';

const cfg = { algorithm: 'round-robin' as const, idleTimeout: 60, connectTimeout: 2 };
const backend = (address: string) => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

/** One service on VIP:0 (the kernel picks the port) with one backend, 127.0.0.1:targetPort. */
function oneBackend(key: string, vip: string, targetPort: number, extra: { proxyProtocol?: 'v1' | 'v2' } = {}) {
  return { key, vip, ...extra, ports: [{ name: 'p', port: 0, protocol: 'TCP' as const, targetPort }], healthy: [backend('127.0.0.1')], backends: [backend('127.0.0.1')] };
}

async function listenerPort(p: ProxyDataplane): Promise<number> {
  return ((await p.stats()).details['listeners'] as { boundPort: number }[])[0]!.boundPort;
}

t.test('this Node has the bindings the fast path needs', async (t) => {
  const b = loadRawBinding();
  t.type(b, 'object', typeof b === 'string' ? b : 'tcp_wrap, stream_wrap and uv as expected');
});

t.test('without them: a reason, and the proxy relays through net streams and says why', async (t) => {
  const saved = Object.getOwnPropertyDescriptor(process, 'binding')!;
  Object.defineProperty(process, 'binding', { value: undefined, configurable: true, writable: true });
  t.teardown(() => Object.defineProperty(process, 'binding', saved));
  t.equal(loadRawBinding(), 'process.binding is not available');
  const server = net.createServer((s) => s.end('hello\n'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const warnings: string[] = [];
  const log = { child: () => log, info: () => undefined, debug: () => undefined, error: () => undefined, fatal: () => undefined, warn: (_o: object, m: string) => warnings.push(m), levelVal: 30 };
  const p = new ProxyDataplane({ config: cfg, inline: true, log: log as never });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/web', '127.0.0.40', (server.address() as net.AddressInfo).port)] });
  const got = await new Promise<string>((resolve, reject) => {
    void listenerPort(p).then((port) => {
      const s = net.connect(port, '127.0.0.40');
      let d = '';
      s.on('data', (x) => { d += x; });
      s.on('end', () => resolve(d));
      s.on('error', reject);
    });
  });
  t.equal(got, 'hello\n', 'served');
  t.same((await p.stats()).details['relayed'], { raw: 0, streams: 1 }, 'through net streams');
  t.match(warnings.join('\n'), /the fast relay path is not available in this Node \(process\.binding is not available\)/);
});

t.test('an error on one side resets both: a client that resets, the backend sees the reset', async (t) => {
  const seen: string[] = [];
  const server = net.createServer((s) => {
    s.on('error', (e: NodeJS.ErrnoException) => seen.push(e.code ?? 'error'));
    s.on('end', () => seen.push('fin'));
    s.write('x');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const p = new ProxyDataplane({ config: cfg, workers: 1, relay: 'raw' });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/web', '127.0.0.41', (server.address() as net.AddressInfo).port)] });
  const port = await listenerPort(p);
  await new Promise<void>((resolve) => {
    const s = net.connect(port, '127.0.0.41');
    s.once('data', () => { s.resetAndDestroy(); resolve(); });
  });
  for (let i = 0; i < 50 && seen.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
  t.same(seen, ['ECONNRESET'], 'the backend got a reset, not a clean end');
  t.same((await p.stats()).details['relayed'], { raw: 1, streams: 0 });
});

t.test('half-close both ways through the fast path: each FIN is shutdown(2) from the addon, not a uv_shutdown round trip', async (t) => {
  // The backend answers only once the client's FIN came through (our shutdown
  // of the backend side), then ends (our shutdown of the client side); the
  // client reads the answer and the end while its own side is shut.
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    let got = '';
    s.on('data', (d) => { got += d; });
    s.on('end', () => s.end(`got ${got} and your FIN`));
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const p = new ProxyDataplane({ config: cfg, inline: true, relay: 'raw' });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/web', '127.0.0.42', (server.address() as net.AddressInfo).port)] });
  const port = await listenerPort(p);
  const got = await new Promise<string>((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.42', allowHalfOpen: true });
    let d = '';
    s.on('data', (x) => { d += x; });
    s.on('end', () => { s.destroy(); resolve(d); });
    s.on('error', reject);
    s.setTimeout(3000, () => { s.destroy(); reject(new Error(`timeout, got ${JSON.stringify(d)}`)); });
    s.end('ping');
  });
  t.equal(got, 'got ping and your FIN');
  t.equal(rawShutdownPath(), 'direct', 'the relay shuts sockets with the addon\'s shutdownWrite');
  t.same((await p.stats()).details['relayed'], { raw: 1, streams: 0 });
});

/**
 * A backend that requires the PROXY header and records each connection's
 * first read: `echo` answers the request that follows the header; `greet`
 * speaks first (SMTP-like) once the header is in.
 */
async function headerBackend(t: tap.Test, mode: 'echo' | 'greet', hdrLen: (b: Buffer) => number): Promise<{ port: number; firsts: Buffer[] }> {
  const firsts: Buffer[] = [];
  const server = net.createServer((s) => {
    let got = Buffer.alloc(0);
    let greeted = false;
    s.on('data', (d: Buffer) => {
      if (got.length === 0) firsts.push(Buffer.from(d));
      got = Buffer.concat([got, d]);
      const n = hdrLen(got);
      if (n === 0 || got.length < n) return;
      const rest = got.subarray(n).toString();
      if (mode === 'greet' && !greeted) { greeted = true; s.write('220 greeting\r\n'); }
      if (mode === 'echo' && rest.endsWith('\r\n')) s.end(`echo ${rest}`);
    });
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  return { port: (server.address() as net.AddressInfo).port, firsts };
}

function talk(port: number, host: string, send: string | undefined): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, host);
    let d = '';
    if (send !== undefined) s.write(send);
    s.on('data', (x) => { d += x; if (send === undefined && d.endsWith('\r\n')) s.end(); });
    s.on('end', () => { s.destroy(); resolve(d); });
    s.on('error', reject);
    s.setTimeout(3000, () => { s.destroy(); reject(new Error(`timeout, got ${JSON.stringify(d)}`)); });
  });
}

for (const version of ['v2', 'v1'] as const) {
  t.test(`PROXY ${version}: the header goes in one write with the client's first bytes; a silent client still gets a server-first greeting`, async (t) => {
    const hdrLen = version === 'v2'
      ? (b: Buffer): number => (b.length >= 28 ? 28 : 0)
      : (b: Buffer): number => { const i = b.indexOf('\r\n'); return i < 0 ? 0 : i + 2; };
    const echo = await headerBackend(t, 'echo', hdrLen);
    const greet = await headerBackend(t, 'greet', hdrLen);
    // Inline: the engine shares the test's event loop, so each client's request is surely in the kernel
    // before its backend connect completes (a worker thread could outrun the client and send the header alone).
    const p = new ProxyDataplane({ config: cfg, inline: true, relay: 'raw' });
    t.teardown(() => p.stop());
    await p.apply({ services: [oneBackend('default/echo', '127.0.0.42', echo.port, { proxyProtocol: version }), oneBackend('default/greet', '127.0.0.43', greet.port, { proxyProtocol: version })] });
    const ports = ((await p.stats()).details['listeners'] as { service: string; boundPort: number }[]).map((l) => l.boundPort);
    const N = 20;
    for (let i = 0; i < N; i++) t.equal(await talk(ports[0]!, '127.0.0.42', `hello ${i}\r\n`), `echo hello ${i}\r\n`, `client-first ${i}: relayed behind the header`);
    t.equal(echo.firsts.length, N);
    let together = 0;
    for (const [i, f] of echo.firsts.entries()) {
      const n = hdrLen(f);
      if (n === 0) { t.fail(`connection ${i}: the first read does not start with a whole header`); continue; }
      if (f.length > n) { together++; t.equal(f.subarray(n).toString(), `hello ${i}\r\n`, `connection ${i}: the request right behind the header`); }
      if (version === 'v1') t.match(f.subarray(0, n).toString(), /^PROXY TCP4 127\.0\.0\.1 127\.0\.0\.42 \d+ 0\r\n$/, 'v1: client and VIP (port 0 as configured here)');
      else t.same([f.readUInt32BE(16), f.readUInt32BE(20)], [0x7f000001, 0x7f00002a], 'v2: client and VIP');
    }
    t.equal(together, N, 'the header and the request reached the backend in one read every time');
    t.same((await p.stats()).details['proxyHeaders'], { withData: N, alone: 0 }, 'the status counts them as sent with the client\'s bytes');
    t.equal(await talk(ports[1]!, '127.0.0.43', undefined), '220 greeting\r\n', 'a client that waits for the server is greeted');
    t.equal(greet.firsts.length, 1);
    t.equal(hdrLen(greet.firsts[0]!), greet.firsts[0]!.length, 'that backend\'s first read is the header alone');
    t.same((await p.stats()).details['proxyHeaders'], { withData: N, alone: 1 }, 'and that header as sent alone');
    t.same((await p.stats()).details['relayed'], { raw: N + 1, streams: 0 }, 'all on the fast path');
  });
}

t.test('relayed client sockets have TCP_NODELAY from their listener (no setsockopt per connection)', async (t) => {
  const server = net.createServer((s) => { s.on('data', () => undefined); s.on('error', () => undefined); });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const p = new ProxyDataplane({ config: cfg, inline: true, relay: 'raw' });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/nd', '127.0.0.44', (server.address() as net.AddressInfo).port)] });
  const port = await listenerPort(p);
  const c = net.connect(port, '127.0.0.44');
  t.teardown(() => c.destroy());
  await new Promise((r) => c.once('connect', r));
  c.write('x');
  // The engine runs in this process: find its sockets bound to the VIP:port among our descriptors.
  const vip = parseIPv4('127.0.0.44')!;
  const mine = (): NativeSocketInfo[] => fs.readdirSync('/proc/self/fd').map(Number).flatMap((fd) => {
    try { const i = socketInfo(fd); return i.address === vip && i.port === port ? [i] : []; } catch { return []; }
  });
  let found: NativeSocketInfo[] = [];
  for (let i = 0; i < 100 && !found.some((s) => !s.listening); i++) { await new Promise((r) => setTimeout(r, 10)); found = mine(); }
  const listening = found.filter((s) => s.listening);
  t.ok(listening.length > 0 && listening.every((s) => s.noDelay === true), 'the listener (each descriptor of it) has TCP_NODELAY');
  t.same(found.filter((s) => !s.listening).map((s) => s.noDelay), [true], 'and the accepted client socket inherited it');
});
