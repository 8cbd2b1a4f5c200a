// One proxy engine driven directly in this thread (proxy-engine.ts): no timer
// per connection (one coarse tick, none at all when idle), and a planned stop
// that lets open connections finish for a bounded time. The data path's
// behaviours through the ProxyDataplane are in proxy.test.ts.
import t from 'tap';
import * as net from 'node:net';
import { realClock } from '../../agent/clock';
import { listenTcp4 } from '../../agent/native/native';
import { parseIPv4 } from '../../agent/address';
import { ProxyEngine, type EngineListenerSpec } from '../../agent/forward/proxy-engine';
import { nativeRelayPath } from '../../agent/forward/relay-native';
import { TallyTable, FLOW_CONNECTIONS } from '../../agent/forward/tallies';

const quiet = { debug: () => undefined, info: () => undefined, warn: () => undefined, error: () => undefined };

async function setup(t: tap.Test, vip: string): Promise<{ engine: ProxyEngine; table: TallyTable; port: number; flow: number }> {
  const server = net.createServer((s) => { s.on('error', () => undefined); s.on('data', (d) => s.write(d)); });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => { server.close(); (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.(); });
  const table = new TallyTable(1);
  const path = nativeRelayPath();
  if (typeof path === 'string') throw new Error(path);
  const engine = new ProxyEngine({
    index: 0, buffers: table.buffers(), config: { algorithm: 'round-robin', idleTimeout: 60, connectTimeout: 2 }, log: quiet, clock: realClock,
    relay: path, maxConnections: 1000, backlog: 64, udpIdleMs: 30_000, maxUdpSessions: 16, onConnectResult: () => undefined,
  });
  const l = listenTcp4(parseIPv4(vip)!, 0, 64, true);
  const flow = table.slot('flow');
  const spec: EngineListenerSpec = {
    id: 'l', serviceKey: 'default/web', vip, port: { name: 'p', port: l.port, protocol: 'TCP', targetPort: (server.address() as net.AddressInfo).port },
    healthy: [{ address: '127.0.0.1', weight: 1, slot: flow }], flows: { '127.0.0.1': flow }, slot: table.slot('listener'), proxyProtocol: undefined, fds: [l.fd],
  };
  t.same(await engine.apply({ listeners: [spec], config: { algorithm: 'round-robin', idleTimeout: 60, connectTimeout: 2 }, slots: table.slots }), []);
  return { engine, table, port: l.port, flow };
}

function open(port: number, host: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, host);
    s.once('data', () => resolve(s));
    s.on('error', reject);
    s.on('connect', () => s.write('hi'));
  });
}

const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

t.test('no timer per connection: one tick while connections are open, none when idle', async (t) => {
  const before = timers();
  const { engine, table, port, flow } = await setup(t, '127.0.0.50');
  const socks = await Promise.all(Array.from({ length: 20 }, () => open(port, '127.0.0.50')));
  t.equal(table.sum(flow, FLOW_CONNECTIONS), 20);
  t.ok(timers() - before <= 1, `20 open connections, ${timers() - before} timer(s) added`);
  for (const s of socks) s.destroy();
  await new Promise((r) => setTimeout(r, 300));
  t.equal(engine.stats().open, 0);
  t.equal(timers(), before, 'idle: the tick is gone too');
  await engine.stop();
});

t.test('a planned stop lets open connections finish, up to the drain time', async (t) => {
  const { engine, port } = await setup(t, '127.0.0.51');
  const quick = await open(port, '127.0.0.51');
  const slow = await open(port, '127.0.0.51');
  const slowClosed = new Promise<number>((r) => { const t0 = Date.now(); slow.on('close', () => r(Date.now() - t0)); });
  slow.on('error', () => undefined);
  setTimeout(() => quick.end(), 100);
  const res = await engine.stop({ keep: true, drainMs: 600 });
  t.same(res, { open: 2, unfinished: 1 }, 'one finished within the drain time, one did not');
  const ms = await slowClosed;
  t.ok(ms >= 500, `the unfinished one was closed when the drain time ran out (${ms} ms)`);
  const refused = await new Promise<string>((r) => { const s = net.connect(port, '127.0.0.51'); s.on('error', (e: NodeJS.ErrnoException) => r(e.code ?? 'error')); s.on('connect', () => { s.destroy(); r('connected'); }); });
  t.equal(refused, 'ECONNREFUSED', 'the engine let go of its listening descriptor (the only one here)');
});
