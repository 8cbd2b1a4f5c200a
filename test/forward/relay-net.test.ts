// The fallback relay path (relay-net.ts, public net API only): chosen when
// asked, it relays, passes a half-close on, and resets the backend when the
// client resets. The behaviours every relay must have run in proxy.test.ts
// with this path too.
import t from 'tap';
import * as net from 'node:net';
import { ProxyDataplane } from '../../agent/forward/proxy';
import { parseIPv4 } from '../../agent/ipv4';

const cfg = { algorithm: 'round-robin' as const, idleTimeout: 60, connectTimeout: 2 };
const backend = (address: string) => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

t.test('streams: half-close passes through and a client reset resets the backend', async (t) => {
  const seen: string[] = [];
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', (e: NodeJS.ErrnoException) => seen.push(e.code ?? 'error'));
    let got = '';
    s.on('data', (d) => { got += d.toString(); });
    s.on('end', () => { seen.push('fin'); s.end(`echo:${got}`); });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const p = new ProxyDataplane({ config: cfg, inline: true, relay: 'streams' });
  t.teardown(() => p.stop());
  await p.apply({ services: [{ key: 'default/web', vip: '127.0.0.42', ports: [{ name: 'p', port: 0, protocol: 'TCP', targetPort: (server.address() as net.AddressInfo).port }], healthy: [backend('127.0.0.1')], backends: [backend('127.0.0.1')] }] });
  const port = ((await p.stats()).details['listeners'] as { boundPort: number }[])[0]!.boundPort;
  const answer = await new Promise<string>((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.42', allowHalfOpen: true });
    let d = '';
    s.on('data', (x) => { d += x.toString(); });
    s.on('end', () => resolve(d));
    s.on('error', reject);
    s.end('ping');
  });
  t.equal(answer, 'echo:ping', 'the backend answered after our FIN reached it');
  t.same(seen, ['fin']);
  seen.length = 0;
  await new Promise<void>((resolve) => {
    const s = net.connect(port, '127.0.0.42', () => { s.write('x'); setTimeout(() => { s.resetAndDestroy(); resolve(); }, 50); });
  });
  for (let i = 0; i < 50 && seen.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
  t.same(seen, ['ECONNRESET'], 'a client reset resets the backend');
  t.same((await p.stats()).details['relayed'], { native: 0, raw: 0, streams: 2 });
});
