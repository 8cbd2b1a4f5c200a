// The relay in the addon (relay-native.ts, native/src/relay.cc): the proxy's
// one relay path, refused with a fix when the addon lacks it; half-close both ways, a reset on either side resets the other, backpressure
// against a slow reader without buffering in the proxy, the PROXY header, and
// nothing left open (descriptors, buffers) after 1,000 connections. The
// data path's other behaviours run in proxy.test.ts.
import t from 'tap';
import * as net from 'node:net';
import * as fs from 'node:fs';
import { createHash } from 'node:crypto';
import { ProxyDataplane } from '../../agent/forward/proxy';
import { nativeRelayStats } from '../../agent/forward/relay-native';
import { parseIPv4 } from '../../agent/address';
import { loadNative, socketInfo, type NativeSocketInfo } from '../../agent/native/native';
import { isLbError } from '../../agent/errors';
import { halfCloseBothWays, proxyHeaderTest } from '../../lab/relay-checks';
import { parseV1, parseV2 } from '../../lab/proxy-protocol';

const cfg = { algorithm: 'round-robin' as const, idleTimeout: 60, connectTimeout: 2 };
const backend = (address: string) => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

function oneBackend(key: string, vip: string, targetPort: number) {
  return { key, vip, ports: [{ name: 'p', port: 0, protocol: 'TCP' as const, targetPort }], healthy: [backend('127.0.0.1')], backends: [backend('127.0.0.1')] };
}

async function serve(t: tap.Test, onConn: (s: net.Socket) => void, allowHalfOpen = false): Promise<number> {
  const server = net.createServer({ allowHalfOpen }, (s) => { s.on('error', () => undefined); onConn(s); });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => { server.close(); (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.(); });
  return (server.address() as net.AddressInfo).port;
}

async function proxyTo(t: tap.Test, vip: string, port: number, opts: { inline?: boolean } = { inline: true }): Promise<{ p: ProxyDataplane; port: number }> {
  const p = new ProxyDataplane({ config: cfg, ...(opts.inline ? { inline: true } : { workers: 1 }) });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/web', vip, port)] });
  return { p, port: ((await p.stats()).details['listeners'] as { boundPort: number }[])[0]!.boundPort };
}

/** Connect, read to the end. */
function readAll(port: number, host: string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const s = net.connect(port, host);
    let d = '';
    s.on('data', (x) => { d += x.toString(); });
    s.on('end', () => resolve(d));
    s.on('error', reject);
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

// First in this file: the addon's relay is not created in this thread yet, so
// hiding the class shows what an install whose addon lacks it gets.
t.test('an addon without the relay: the proxy refuses to start and says how to fix it', async (t) => {
  const addon = loadNative() as { RelayHandle?: unknown };
  const saved = addon.RelayHandle;
  addon.RelayHandle = undefined;
  t.teardown(() => { addon.RelayHandle = saved; });
  let caught: unknown;
  try { new ProxyDataplane({ config: cfg, inline: true }); } catch (err) { caught = err; }
  t.ok(isLbError(caught, 'LB_ERR_NET_NATIVE_MISSING'), 'refused with a stable code');
  t.match((caught as Error).message, /the userspace proxy cannot relay: the native addon was built without the relay \(rebuild it: npm ci\)/);
});

t.test('by default a worker thread relays in the addon', async (t) => {
  const port = await serve(t, (s) => s.end('hello\n'));
  const { p, port: lp } = await proxyTo(t, '127.0.0.51', port, { inline: false });
  for (let i = 0; i < 5; i++) t.equal(await readAll(lp, '127.0.0.51'), 'hello\n');
  // Bytes are counted at each connection's end (and every 100 ms): wait for the last one's.
  let st = await p.stats();
  for (let i = 0; i < 50 && st.details['openConnections'] !== 0; i++) { await sleep(20); st = await p.stats(); }
  t.same((st.details['workers'] as { thread: boolean; accepted: number }[]).map((w) => [w.thread, w.accepted]), [[true, 5]], 'the worker thread relayed every connection');
  t.equal(st.flows.reduce((n, f) => n + f.bytesToClient, 0), 30, 'bytes counted at each end');
});

t.test('half-close both ways: each FIN passes once what came before it is written', async (t) => {
  const p = new ProxyDataplane({ config: cfg, inline: true });
  t.teardown(() => p.stop());
  t.equal(await halfCloseBothWays(t, p, '127.0.0.52'), 'got ping and your FIN');
});

t.test('a reset on either side resets the other', async (t) => {
  const seen: string[] = [];
  let mode: 'client' | 'backend' = 'client';
  const port = await serve(t, (s) => {
    s.on('error', (e: NodeJS.ErrnoException) => seen.push(e.code ?? 'error'));
    s.on('end', () => seen.push('fin'));
    if (mode === 'client') s.write('x');
    else s.once('data', () => s.resetAndDestroy());
  });
  const { port: lp } = await proxyTo(t, '127.0.0.53', port);
  await new Promise<void>((resolve) => {
    const s = net.connect(lp, '127.0.0.53');
    s.once('data', () => { s.resetAndDestroy(); resolve(); });
  });
  for (let i = 0; i < 50 && seen.length === 0; i++) await sleep(20);
  t.same(seen, ['ECONNRESET'], 'the client reset: the backend got a reset, not a clean end');
  mode = 'backend';
  const clientSaw = await new Promise<string>((resolve) => {
    const s = net.connect(lp, '127.0.0.53');
    s.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'));
    s.on('end', () => resolve('fin'));
    s.write('y');
  });
  t.equal(clientSaw, 'ECONNRESET', 'the backend reset: the client got a reset');
});

t.test('backpressure: a paused client holds the backend back; nothing is lost when it reads again', async (t) => {
  const SIZE = 48 * 1024 * 1024;
  const data = Buffer.alloc(SIZE);
  for (let i = 0; i < SIZE; i += 4) data.writeUInt32LE((i * 2654435761) >>> 0, i);
  let server: net.Socket | undefined;
  const port = await serve(t, (s) => { server = s; s.end(data); });
  const { port: lp } = await proxyTo(t, '127.0.0.54', port);
  const c = net.connect(lp, '127.0.0.54');
  t.teardown(() => c.destroy());
  c.pause();
  await new Promise((r) => c.once('connect', r));
  // Loopback socket buffers hold a few MiB at most; with the client not reading, the rest stays with the backend.
  let pending = 0;
  for (let i = 0; i < 50; i++) {
    await sleep(20);
    const now = server?.writableLength ?? 0;
    if (now > 0 && now === pending) break;
    pending = now;
  }
  t.ok(pending > SIZE / 2, `the backend still holds ${(pending / 2 ** 20).toFixed(1)} MiB of ${SIZE / 2 ** 20}: the proxy stopped reading`);
  const hash = createHash('sha256');
  let got = 0;
  c.on('data', (d: Buffer) => { got += d.length; hash.update(d); });
  c.resume();
  await new Promise((r) => c.once('end', r));
  t.equal(got, SIZE, 'every byte arrived');
  t.equal(hash.digest('hex'), createHash('sha256').update(data).digest('hex'), 'in order, unchanged');
});

t.test('1,000 connections leave no descriptor, connection or buffer behind', async (t) => {
  const port = await serve(t, (s) => s.on('data', (d) => s.end(d)));
  const { p, port: lp } = await proxyTo(t, '127.0.0.55', port);
  const fds = (): number => fs.readdirSync('/proc/self/fd').length;
  const one = (i: number): Promise<string> => new Promise((resolve, reject) => {
    const s = net.connect(lp, '127.0.0.55');
    let d = '';
    s.on('data', (x) => { d += x.toString(); });
    s.on('end', () => { s.destroy(); resolve(d); });
    s.on('error', reject);
    s.write(`c${i}`);
  });
  await one(-1);
  for (let i = 0; i < 50 && (nativeRelayStats()?.connections ?? 0) > 0; i++) await sleep(20);
  await sleep(50);
  const before = fds();
  const N = 1000;
  const CONCURRENT = 50;
  let next = 0;
  let ok = 0;
  await Promise.all(Array.from({ length: CONCURRENT }, async () => {
    while (next < N) {
      const i = next++;
      if ((await one(i)) === `c${i}`) ok++;
    }
  }));
  t.equal(ok, N, 'every connection relayed its bytes');
  for (let i = 0; i < 50 && (nativeRelayStats()?.connections ?? 0) > 0; i++) await sleep(20);
  t.has(nativeRelayStats(), { connections: 0, listeners: 1, buffers: 0 }, 'the addon holds only the listener');
  for (let i = 0; i < 50 && fds() > before; i++) await sleep(20);
  t.ok(fds() <= before, `no more descriptors open than before (${fds()}, ${before} before)`);
  const st = await p.stats();
  t.equal(st.details['openConnections'], 0);
  t.equal(st.flows.reduce((n, f) => n + f.connections, 0), N + 1);
});

t.test('a wake-up reads the epoll again: what its own writes made ready is relayed in the same wake-up', async (t) => {
  // Two services on one relay, one epoll: the client talks to A, A's backend
  // is B's listener, B's backend echoes. A write A makes to B's listener
  // arrives on loopback before send() returns, so B's socket is ready while
  // the wake-up that made it runs: a second read of the epoll relays it there
  // and then, without libuv's next turn (relay.cc Drain). Each message and
  // its echo cross two such hops.
  const echo = await serve(t, (s) => s.on('data', (d) => s.write(d)));
  const p = new ProxyDataplane({ config: cfg, inline: true });
  t.teardown(() => p.stop());
  const b = oneBackend('default/b', '127.0.0.57', echo);
  await p.apply({ services: [b] });
  const listeners = async (): Promise<{ service: string; boundPort: number }[]> => (await p.stats()).details['listeners'] as { service: string; boundPort: number }[];
  const bPort = (await listeners())[0]!.boundPort;
  const a = { key: 'default/a', vip: '127.0.0.56', ports: [{ name: 'p', port: 0, protocol: 'TCP' as const, targetPort: bPort }], healthy: [backend('127.0.0.57')], backends: [backend('127.0.0.57')] };
  await p.apply({ services: [b, a] });
  const ls = await listeners();
  t.equal(ls.find((l) => l.service === 'default/b')?.boundPort, bPort, "B's listener kept its port");
  const aPort = ls.find((l) => l.service === 'default/a')!.boundPort;
  const c = net.connect(aPort, '127.0.0.56');
  t.teardown(() => c.destroy());
  await new Promise<void>((r, j) => { c.once('connect', r); c.once('error', j); });
  const roundTrip = (m: string): Promise<string> => {
    const got = new Promise<string>((resolve) => c.once('data', (d) => resolve(String(d))));
    c.write(m);
    return got;
  };
  t.equal(await roundTrip('m0'), 'm0', 'relayed through A and B and back');
  const before = nativeRelayStats()!;
  let back = 0;
  for (let i = 1; i <= 20; i++) if ((await roundTrip(`m${i}`)) === `m${i}`) back++;
  t.equal(back, 20, 'every message came back');
  const after = nativeRelayStats()!;
  t.ok(after.wakes > before.wakes, `wake-ups counted (${after.wakes - before.wakes})`);
  t.ok(after.extraPasses - before.extraPasses >= 20, `${after.extraPasses - before.extraPasses} reads after a wake-up's first found the next hop ready (20 messages: one read on the way out, one on the way back)`);
});

t.test('idle timeout: traffic counted in C keeps a connection open; silence closes it', async (t) => {
  const port = await serve(t, (s) => s.on('data', (d) => s.write(d)));
  const p = new ProxyDataplane({ config: { ...cfg, idleTimeout: 0.3 }, inline: true });
  t.teardown(() => p.stop());
  await p.apply({ services: [oneBackend('default/web', '127.0.0.57', port)] });
  const lp = ((await p.stats()).details['listeners'] as { boundPort: number }[])[0]!.boundPort;
  const s = net.connect(lp, '127.0.0.57');
  t.teardown(() => s.destroy());
  let closedAt = 0;
  s.on('close', () => { closedAt = Date.now(); });
  s.on('error', () => undefined);
  let echoed = 0;
  s.on('data', (d) => { echoed += d.length; });
  await new Promise((r) => s.once('connect', r));
  const t0 = Date.now();
  // 1 s of a byte every 100 ms: three idle timeouts' worth, never 300 ms silent.
  for (let i = 0; i < 10 && closedAt === 0; i++) { s.write('.'); await sleep(100); }
  t.equal(closedAt, 0, 'still open after 1 s of steady traffic');
  for (let i = 0; i < 100 && closedAt === 0; i++) await sleep(20);
  const silent = closedAt - t0 - 1000;
  t.ok(closedAt > 0 && silent >= 250, `then closed after ${silent} ms of silence`);
  t.equal(echoed, 10, 'every byte relayed both ways');
  const st = await p.stats();
  t.same([st.flows[0]!.bytesToBackend, st.flows[0]!.bytesToClient], [10, 10], 'and counted');
});

t.test('a worker thread that ends frees what its relay held: descriptors of open connections, its epoll and listeners', async (t) => {
  const port = await serve(t, (s) => s.on('data', () => undefined));
  const fds = (): number => fs.readdirSync('/proc/self/fd').length;
  const before = fds();
  const { p, port: lp } = await proxyTo(t, '127.0.0.56', port, { inline: false });
  const held: net.Socket[] = [];
  t.teardown(() => held.forEach((s) => s.destroy()));
  for (let i = 0; i < 20; i++) {
    const s = net.connect(lp, '127.0.0.56');
    held.push(s);
    await new Promise((r) => s.once('connect', r));
    s.write('x');
  }
  for (let i = 0; i < 50 && (await p.stats()).details['openConnections'] !== 20; i++) await sleep(20);
  t.equal((await p.stats()).details['openConnections'], 20, 'twenty relayed connections open');
  t.ok(fds() >= before + 40, 'each holds its descriptors in this process');
  await p.stop();
  held.forEach((s) => s.destroy());
  // What stays: the backend's server sockets until they see the clients go.
  for (let i = 0; i < 100 && fds() > before; i++) await sleep(20);
  t.ok(fds() <= before, `back to the descriptors open before the worker started (${fds()}, ${before} before)`);
});

for (const version of ['v2', 'v1'] as const) proxyHeaderTest(t, version);

t.test('relayed client sockets have TCP_NODELAY from their listener (no setsockopt per connection)', async (t) => {
  const port = await serve(t, (s) => s.on('data', () => undefined));
  const { port: lp } = await proxyTo(t, '127.0.0.44', port);
  const c = net.connect(lp, '127.0.0.44');
  t.teardown(() => c.destroy());
  await new Promise((r) => c.once('connect', r));
  c.write('x');
  // The engine runs in this process: find its sockets bound to the VIP:port among our descriptors.
  const vip = parseIPv4('127.0.0.44')!;
  const mine = (): NativeSocketInfo[] => fs.readdirSync('/proc/self/fd').map(Number).flatMap((fd) => {
    try { const i = socketInfo(fd); return i.address === vip && i.port === lp ? [i] : []; } catch { return []; }
  });
  let found: NativeSocketInfo[] = [];
  for (let i = 0; i < 100 && !found.some((s) => !s.listening); i++) { await sleep(10); found = mine(); }
  const listening = found.filter((s) => s.listening);
  t.ok(listening.length > 0 && listening.every((s) => s.noDelay === true), 'the listener (each descriptor of it) has TCP_NODELAY');
  t.same(found.filter((s) => !s.listening).map((s) => s.noDelay), [true], 'and the accepted client socket inherited it');
});

t.test('IPv6: the proxy listens on an IPv6 VIP, connects IPv6 backends and sends TCP6 (v1) and AF_INET6 (v2) PROXY headers', async (t) => {
  // Backends on ::1 that log what each connection sent up to the client's "hello" (the header may
  // come in a read of its own) and answer it.
  const firsts: Buffer[] = [];
  const port = await new Promise<number>((resolve) => {
    const server = net.createServer((s) => {
      s.on('error', () => undefined);
      let got = Buffer.alloc(0);
      s.on('data', (d) => {
        got = Buffer.concat([got, d]);
        if (got.subarray(-5).toString() === 'hello') { firsts.push(got); s.end('ok'); }
      });
    });
    server.listen(0, '::1', () => resolve((server.address() as net.AddressInfo).port));
    t.teardown(() => server.close());
  });
  // ::1 is the one IPv6 loopback address: three VIP:ports need three ports (a listener is VIP:port).
  const free = async (): Promise<number> => {
    const s = net.createServer();
    await new Promise<void>((r) => s.listen(0, '::1', r));
    const n = (s.address() as net.AddressInfo).port;
    await new Promise((r) => s.close(r));
    return n;
  };
  const vipPorts = { plain: await free(), v1: await free(), v2: await free() };
  const six = (version: 'v1' | 'v2' | undefined) => ({
    key: `default/${version ?? 'plain'}@IPv6`, vip: '::1', proxyProtocol: version,
    ports: [{ name: 'p', port: vipPorts[version ?? 'plain'], protocol: 'TCP' as const, targetPort: port }],
    healthy: [{ address: '::1', addressNum: 0, weight: 1 }], backends: [{ address: '::1', addressNum: 0, weight: 1 }],
  });
  const p = new ProxyDataplane({ config: cfg, workers: 1 });
  t.teardown(() => p.stop());
  await p.apply({ services: [six(undefined), six('v1'), six('v2')] });
  const listeners = (await p.stats()).details['listeners'] as { service: string; vip: string; boundPort: number }[];
  const at = (v: string): number => listeners.find((l) => l.service === `default/${v}@IPv6`)!.boundPort;
  t.same(listeners.map((l) => l.vip), ['::1', '::1', '::1']);

  const ask = (lp: number): Promise<{ reply: string; local: number }> => new Promise((resolve, reject) => {
    const c = net.connect({ host: '::1', port: lp });
    let reply = '';
    c.on('connect', () => c.write('hello'));
    c.on('data', (d) => { reply += d.toString(); });
    c.on('end', () => resolve({ reply, local: c.localPort! }));
    c.on('error', reject);
  });
  const plain = await ask(at('plain'));
  t.equal(plain.reply, 'ok', 'relayed over IPv6 both ways');
  t.equal(firsts.at(-1)!.toString(), 'hello', 'no header unless asked');

  const v1 = await ask(at('v1'));
  t.equal(v1.reply, 'ok');
  const line = parseV1(firsts.at(-1)!);
  t.match(line, { header: { transport: 'TCP6', source: '::1', sourcePort: v1.local, destination: '::1', destinationPort: vipPorts.v1 } }, 'v1: a TCP6 line with the client and the VIP');

  const v2 = await ask(at('v2'));
  t.equal(v2.reply, 'ok');
  const bin = parseV2(firsts.at(-1)!);
  t.match(bin, { header: { transport: 'tcp6', command: 'PROXY', source: '0:0:0:0:0:0:0:1', sourcePort: v2.local, destination: '0:0:0:0:0:0:0:1', destinationPort: vipPorts.v2, length: 52 } }, 'v2: AF_INET6 with 36 address bytes');
  if ('header' in bin) t.equal(firsts.at(-1)!.subarray(bin.header.length).toString(), 'hello', 'the client\'s bytes right behind the header');

  // The listening sockets are IPv6-only: an IPv4 client of the same port finds nothing.
  const v4 = await new Promise<string>((resolve) => {
    const c = net.connect({ host: '127.0.0.1', port: at('plain') });
    c.on('connect', () => { c.destroy(); resolve('connected'); });
    c.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? 'error'));
  });
  t.equal(v4, 'ECONNREFUSED', 'IPV6_V6ONLY: no IPv4 client on an IPv6 VIP\'s socket');
  const info = fs.readdirSync('/proc/self/fd').map(Number).flatMap((fd) => {
    try { const i = socketInfo(fd); return i.family === 10 && i.listening && i.port === at('v2') ? [i] : []; } catch { return []; }
  });
  t.ok(info.length > 0 && info.every((i) => i.address6?.equals(Buffer.from('00000000000000000000000000000001', 'hex'))), 'socketInfo reports the IPv6 address a listener is bound to');
});
