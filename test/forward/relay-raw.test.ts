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
import { halfCloseBothWays, proxyHeaderTest } from '../../lab/relay-checks';
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
  const p = new ProxyDataplane({ config: cfg, inline: true, relay: 'raw', log: log as never });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/web', '127.0.0.40', (server.address() as net.AddressInfo).port)] });
  const got = await new Promise<string>((resolve, reject) => {
    void listenerPort(p).then((port) => {
      const s = net.connect(port, '127.0.0.40');
      let d = '';
      s.on('data', (x) => { d += x.toString(); });
      s.on('end', () => resolve(d));
      s.on('error', reject);
    });
  });
  t.equal(got, 'hello\n', 'served');
  t.same((await p.stats()).details['relayed'], { native: 0, raw: 0, streams: 1 }, 'through net streams');
  t.match(warnings.join('\n'), /a faster relay path is not available \(process\.binding is not available\); relaying through net streams/);
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
  t.same((await p.stats()).details['relayed'], { native: 0, raw: 1, streams: 0 });
});

t.test('half-close both ways through the fast path: each FIN is shutdown(2) from the addon, not a uv_shutdown round trip', async (t) => {
  const p = new ProxyDataplane({ config: cfg, inline: true, relay: 'raw' });
  t.teardown(() => p.stop());
  const got = await halfCloseBothWays(t, p, '127.0.0.42');
  t.equal(got, 'got ping and your FIN');
  t.equal(rawShutdownPath(), 'direct', 'the relay shuts sockets with the addon\'s shutdownWrite');
  t.same((await p.stats()).details['relayed'], { native: 0, raw: 1, streams: 0 });
});

for (const version of ['v2', 'v1'] as const) proxyHeaderTest(t, 'raw', version);

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
