// The fast relay path (relay-raw.ts): Node's own tcp_wrap/stream_wrap bindings
// are there and have the shape it needs; without them the proxy falls back to
// net streams and says so; an error on one side resets both. The behaviours
// every relay must have run in proxy.test.ts with this path on.
import t from 'tap';
import * as net from 'node:net';
import { loadRawBinding } from '../../agent/forward/relay-raw';
import { ProxyDataplane } from '../../agent/forward/proxy';
import { parseIPv4 } from '../../agent/ipv4';

const cfg = { algorithm: 'round-robin' as const, idleTimeout: 60, connectTimeout: 2 };
const backend = (address: string) => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

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
  await p.apply({ services: [{ key: 'default/web', vip: '127.0.0.40', ports: [{ name: 'p', port: 0, protocol: 'TCP', targetPort: (server.address() as net.AddressInfo).port }], healthy: [backend('127.0.0.1')], backends: [backend('127.0.0.1')] }] });
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
  await p.apply({ services: [{ key: 'default/web', vip: '127.0.0.41', ports: [{ name: 'p', port: 0, protocol: 'TCP', targetPort: (server.address() as net.AddressInfo).port }], healthy: [backend('127.0.0.1')], backends: [backend('127.0.0.1')] }] });
  const port = await listenerPort(p);
  await new Promise<void>((resolve) => {
    const s = net.connect(port, '127.0.0.41');
    s.once('data', () => { s.resetAndDestroy(); resolve(); });
  });
  for (let i = 0; i < 50 && seen.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
  t.same(seen, ['ECONNRESET'], 'the backend got a reset, not a clean end');
  t.same((await p.stats()).details['relayed'], { raw: 1, streams: 0 });
});
