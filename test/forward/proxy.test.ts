// Tests of the userspace proxy against real sockets on loopback (127.0.0.0/8:
// every 127.x address is local on Linux, so three "backends" can share one
// port on three addresses). No namespaces needed; the namespaced end-to-end
// runs are test/privileged/forward-proxy.test.ts.
import t from 'tap';
import * as net from 'node:net';
import * as dgram from 'node:dgram';
import { spawn } from 'node:child_process';
import { Registry } from 'prom-client';
import type { BackendSpec, PortSpec, ProxyConfig } from '../../agent/config/types';
import { parseIPv4 } from '../../agent/address';
import { isLbError } from '../../agent/errors';
import type { ForwardState } from '../../agent/forward/dataplane';
import { ProxyDataplane, nextReportDrainMs } from '../../agent/forward/proxy';

const cfg = (over: Partial<ProxyConfig> = {}): ProxyConfig => ({ algorithm: 'round-robin', idleTimeout: 60, connectTimeout: 2, ...over });
const b = (address: string, weight = 1): BackendSpec => ({ address, addressNum: parseIPv4(address)!, weight });
const tcpPort = (targetPort: number): PortSpec => ({ name: 'p', port: 0, protocol: 'TCP', targetPort });

/** A TCP backend: says its id on connect, then echoes; passes half-close back. */
async function echoBackends(addresses: string[], t: tap.Test): Promise<number> {
  let port = 0;
  for (const host of addresses) {
    const server = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => undefined);
      s.write(`${host}\n`);
      s.pipe(s);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve());
    });
    port = (server.address() as net.AddressInfo).port;
    t.teardown(() => new Promise<void>((r) => { server.close(() => r()); (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.(); }));
  }
  return port;
}

/** Connect, read the first line (the backend's id), optionally keep the socket. */
function hello(port: number, host: string, keep = false): Promise<{ id: string; socket: net.Socket }> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host });
    let buf = '';
    s.setEncoding('utf8');
    const onData = (d: string): void => {
      buf += d;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      s.off('data', onData);
      if (!keep) s.end();
      resolve({ id: buf.slice(0, nl), socket: s });
    };
    s.on('data', onData);
    s.on('error', reject);
    s.on('close', () => reject(new Error(`closed before a reply (got ${JSON.stringify(buf)})`)));
  });
}

/** What a client sees when it connects: its first line, or the error/close. */
function attempt(port: number, host: string): Promise<{ ok: boolean; what: string; ms: number }> {
  const t0 = Date.now();
  return hello(port, host).then(
    (r) => ({ ok: true, what: r.id, ms: Date.now() - t0 }),
    (e: NodeJS.ErrnoException) => ({ ok: false, what: e.code ?? e.message, ms: Date.now() - t0 }),
  );
}

async function listenPort(p: ProxyDataplane, vip: string, protocol = 'TCP'): Promise<number> {
  const st = await p.stats();
  const l = (st.details['listeners'] as { vip: string; protocol: string; boundPort: number }[]).find((x) => x.vip === vip && x.protocol === protocol);
  if (!l) throw new Error(`no listener on ${vip}`);
  return l.boundPort;
}

function within10(t: tap.Test, counts: Map<string, number>, weights: Record<string, number>, n: number): void {
  const total = Object.values(weights).reduce((a, c) => a + c, 0);
  for (const [addr, w] of Object.entries(weights)) {
    const expected = (n * w) / total;
    const got = counts.get(addr) ?? 0;
    t.ok(Math.abs(got - expected) <= expected * 0.1, `${addr}: ${got} of ${n}, expected ${expected.toFixed(1)} ±10%`);
  }
}

function svc(vip: string, targetPort: number, healthy: BackendSpec[], backends = healthy, port = tcpPort(targetPort)): ForwardState['services'][number] {
  return { key: 'default/web', vip, ports: [port], healthy, backends };
}

// Two worker threads (the default on a multi-core VM), and one engine in this
// thread (`inline`: the engine shares the test's event loop).
const MODES = [
  { mode: 'workers', opts: { workers: 2 } },
  { mode: 'inline', opts: { inline: true } },
] as const;
for (const { mode, opts: modeOpts } of MODES) {
  t.test(`${mode}: weights honoured over 300 new connections (round-robin and least-connections)`, async (t) => {
    const addrs = ['127.0.0.1', '127.0.0.2', '127.0.0.3'];
    const port = await echoBackends(addrs, t);
    for (const algorithm of ['round-robin', 'least-connections'] as const) {
      const p = new ProxyDataplane({ ...modeOpts, config: cfg({ algorithm }) });
      t.teardown(() => p.stop());
      const vip = '127.0.0.10';
      await p.apply({ services: [svc(vip, port, [b(addrs[0]!, 1), b(addrs[1]!, 2), b(addrs[2]!, 3)])] });
      const lp = await listenPort(p, vip);
      const counts = new Map<string, number>();
      // Round-robin: one connection after the other. Least-connections: all
      // held open, so each pick sees the others' load (a closing connection
      // still counts for a moment, which would skew a sequential run).
      const held: net.Socket[] = [];
      for (let i = 0; i < 300; i++) {
        const { id, socket } = await hello(lp, vip, algorithm === 'least-connections');
        if (algorithm === 'least-connections') held.push(socket);
        counts.set(id, (counts.get(id) ?? 0) + 1);
      }
      held.forEach((s) => s.destroy());
      within10(t, counts, { [addrs[0]!]: 1, [addrs[1]!]: 2, [addrs[2]!]: 3 }, 300);
      const st = await p.stats();
      t.equal(st.flows.reduce((s, f) => s + f.connections, 0), 300, `${algorithm}: 300 connections counted`);
      t.equal((st.details['workers'] as { accepted: number }[]).reduce((n, w) => n + w.accepted, 0), 300, 'every one accepted by an engine');
      await p.stop();
    }
  });

  t.test(`${mode}: least-connections sends new connections to the backend holding fewest`, async (t) => {
    const addrs = ['127.0.0.1', '127.0.0.2'];
    const port = await echoBackends(addrs, t);
    const p = new ProxyDataplane({ ...modeOpts, config: cfg({ algorithm: 'least-connections' }) });
    t.teardown(() => p.stop());
    const vip = '127.0.0.11';
    await p.apply({ services: [svc(vip, port, addrs.map((a) => b(a)))] });
    const lp = await listenPort(p, vip);
    const held: net.Socket[] = [];
    t.teardown(() => held.forEach((s) => s.destroy()));
    // Hold 4 connections: 2 each. Then close both of .1's: the next 2 go to .1.
    const first = await Promise.all([0, 1, 2, 3].map(() => hello(lp, vip, true)));
    for (const f of first) held.push(f.socket);
    const on1 = first.filter((f) => f.id === addrs[0]);
    t.equal(on1.length, 2, 'spread 2/2');
    await Promise.all(on1.map((f) => new Promise((r) => { f.socket.once('close', r); f.socket.destroy(); })));
    await new Promise((r) => setTimeout(r, 50));
    const next = await Promise.all([0, 1].map(() => hello(lp, vip, true)));
    for (const n of next) held.push(n.socket);
    t.same(next.map((n) => n.id), [addrs[0], addrs[0]]);
    const st = await p.stats();
    t.same(st.flows.map((f) => [f.backend, f.active]), [[addrs[0], 2], [addrs[1], 2]], 'active connections per backend');
  });

  t.test(`${mode}: no healthy backend: the client is reset at once`, async (t) => {
    const p = new ProxyDataplane({ ...modeOpts, config: cfg() });
    t.teardown(() => p.stop());
    const vip = '127.0.0.12';
    await p.apply({ services: [svc(vip, 1, [], [b('127.0.0.1')])] });
    const lp = await listenPort(p, vip);
    const r = await attempt(lp, vip);
    t.equal(r.ok, false);
    t.equal(r.what, 'ECONNRESET', 'reset, not a hang or a clean close');
    t.comment(`reset after ${r.ms} ms`);
    const st = await p.stats();
    t.equal(st.services[0]!.noHealthyBackend, true);
  });

  t.test(`${mode}: beyond maxConnections a client gets a clean close; backends are not blamed`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    const results: boolean[] = [];
    const registry = new Registry();
    const p = new ProxyDataplane({ ...modeOpts, config: cfg(), maxConnections: 2, registry, onConnectResult: (_k, _a, ok) => results.push(ok) });
    t.teardown(() => p.stop());
    const vip = '127.0.0.19';
    await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
    const lp = await listenPort(p, vip);
    const held = [await hello(lp, vip, true), await hello(lp, vip, true)];
    const third = await new Promise<{ data: string; how: string; ms: number }>((resolve) => {
      const t0 = Date.now();
      const s = net.connect({ port: lp, host: vip });
      let data = '';
      s.on('data', (d) => { data += d.toString(); });
      s.on('error', (e: NodeJS.ErrnoException) => resolve({ data, how: e.code ?? 'error', ms: Date.now() - t0 }));
      s.on('end', () => { s.end(); resolve({ data, how: 'FIN', ms: Date.now() - t0 }); });
      s.write('GET / HTTP/1.0\r\n\r\n');
    });
    t.same([third.data, third.how], ['', 'FIN'], `the third client: a clean close after ${third.ms} ms, nothing relayed`);
    t.ok(third.ms < 1000, 'at once');
    await p.stats(); // a worker's passive-health results reach this thread by the time stats are read
    t.same(results, [true, true], 'two successes reported, no failure');
    t.match(await registry.metrics(), /lbagent_forward_own_limit_refused_total\{op="limit",code="max-connections"\} 1/);
    for (const h of held) h.socket.destroy();
    await new Promise((r) => setTimeout(r, 100));
    const again = await attempt(lp, vip);
    t.same([again.ok, again.what], [true, '127.0.0.1'], 'served again once below the limit');
  });

  t.test(`${mode}: a failed connect is retried once on another healthy backend; passive results reported`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    const results: [string, string, boolean][] = [];
    const p = new ProxyDataplane({ ...modeOpts, config: cfg(), onConnectResult: (k, a, ok) => results.push([k, a, ok]) });
    t.teardown(() => p.stop());
    const vip = '127.0.0.13';
    // 127.0.0.4 has nothing listening on the port: ECONNREFUSED.
    await p.apply({ services: [svc(vip, port, [b('127.0.0.1'), b('127.0.0.4')])] });
    const lp = await listenPort(p, vip);
    for (let i = 0; i < 6; i++) {
      const r = await attempt(lp, vip);
      t.same([r.ok, r.what], [true, '127.0.0.1'], `connection ${i} served despite the dead backend`);
    }
    await p.stats(); // passive-health results are in by now
    t.ok(results.some(([, a, ok]) => a === '127.0.0.4' && !ok), 'failures reported for the dead backend');
    t.ok(results.every(([k, a, ok]) => k === 'default/web' && ok === (a === '127.0.0.1')), 'successes reported for the live one');
    const st = await p.stats();
    const dead = st.flows.find((f) => f.backend === '127.0.0.4')!;
    t.equal(dead.connectFailures, 3, 'round-robin sent every other connection there first');
    t.equal(dead.active, 0, 'failed attempts do not stay active');
    // Both dead: after one retry the client is reset.
    await p.apply({ services: [svc(vip, port, [b('127.0.0.4'), b('127.0.0.5')])] });
    const r = await attempt(lp, vip);
    t.same([r.ok, r.what], [false, 'ECONNRESET']);
    await p.stats();
    const failures = results.filter(([, a, ok]) => !ok && (a === '127.0.0.4' || a === '127.0.0.5')).length;
    t.equal(failures, 3 + 2, 'the one retry tried the other backend');
  });

  t.test(`${mode}: connect timeout: a backend that never answers the SYN is given up and the other tried`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    // A listener whose process never accepts: once its accept queue is full the kernel drops SYNs.
    const stuck = spawn(process.execPath, ['-e',
      `const s=require('net').createServer();s.listen(${port},'127.0.0.6',1,()=>{process.send('up');setTimeout(()=>Atomics.wait(new Int32Array(new SharedArrayBuffer(4)),0,0,20000),10)})`,
    ], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    t.teardown(() => { stuck.kill('SIGKILL'); });
    await new Promise((r) => stuck.once('message', r));
    await new Promise((r) => setTimeout(r, 100));
    const fillers: net.Socket[] = [];
    t.teardown(() => fillers.forEach((s) => s.destroy()));
    for (let i = 0; i < 8; i++) {
      const s = net.connect(port, '127.0.0.6');
      s.on('error', () => undefined);
      fillers.push(s);
    }
    await new Promise((r) => setTimeout(r, 300));
    const results: [string, boolean][] = [];
    const p = new ProxyDataplane({ ...modeOpts, config: cfg({ connectTimeout: 0.3 }), onConnectResult: (_k, a, ok) => results.push([a, ok]) });
    t.teardown(() => p.stop());
    const vip = '127.0.0.14';
    await p.apply({ services: [svc(vip, port, [b('127.0.0.6'), b('127.0.0.1')])] });
    const lp = await listenPort(p, vip);
    // Round-robin over .1 and .6: one of two connections is sent to .6 first.
    const r1 = await attempt(lp, vip);
    const r2 = await attempt(lp, vip);
    t.same([r1.ok, r1.what, r2.ok, r2.what], [true, '127.0.0.1', true, '127.0.0.1'], 'both served');
    t.ok(Math.max(r1.ms, r2.ms) >= 250, `one waited for the connect timeout first (${r1.ms} ms, ${r2.ms} ms)`);
    await p.stats();
    t.same(results, [['127.0.0.1', true], ['127.0.0.6', false], ['127.0.0.1', true]]);
  });

  t.test(`${mode}: half-close, large transfers with backpressure, byte counters`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    const p = new ProxyDataplane({ ...modeOpts, config: cfg() });
    t.teardown(() => p.stop());
    const vip = '127.0.0.15';
    await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
    const lp = await listenPort(p, vip);
    const size = 16 << 20;
    const payload = Buffer.alloc(size);
    for (let i = 0; i < size; i += 4096) payload[i] = i & 0xff;
    const received = await new Promise<Buffer>((resolve, reject) => {
      const s = net.connect({ port: lp, host: vip, allowHalfOpen: true });
      const parts: Buffer[] = [];
      let paused = 0;
      s.on('data', (d: Buffer) => {
        parts.push(d);
        // A slow reader now and then: the proxy must hold the backend back, not buffer without bound.
        if (++paused % 50 === 0) { s.pause(); setTimeout(() => s.resume(), 5); }
      });
      s.on('end', () => resolve(Buffer.concat(parts)));
      s.on('error', reject);
      s.write(payload);
      s.end(); // half-close: we are done sending but still read the echo
    });
    const hdr = '127.0.0.1\n';
    t.equal(received.length, hdr.length + size, 'everything echoed back after our FIN');
    t.ok(received.subarray(hdr.length).equals(payload), 'intact');
    await new Promise((r) => setTimeout(r, 50));
    const f = (await p.stats()).flows[0]!;
    t.equal(f.bytesToBackend, size);
    t.equal(f.bytesToClient, size + hdr.length);
    t.equal(f.active, 0);
  });

  t.test(`${mode}: draining: a backend leaving the healthy set keeps its open connections and gets no new ones`, async (t) => {
    const addrs = ['127.0.0.1', '127.0.0.2'];
    const port = await echoBackends(addrs, t);
    const p = new ProxyDataplane({ ...modeOpts, config: cfg() });
    t.teardown(() => p.stop());
    const vip = '127.0.0.16';
    const all = addrs.map((a) => b(a));
    await p.apply({ services: [svc(vip, port, all)] });
    const lp = await listenPort(p, vip);
    const held = await hello(lp, vip, true);
    t.teardown(() => held.socket.destroy());
    const leaving = held.id;
    await p.apply({ services: [svc(vip, port, all.filter((x) => x.address !== leaving), all)] });
    for (let i = 0; i < 10; i++) t.not((await hello(lp, vip)).id, leaving, 'new connection avoids the drained backend');
    const echoed = await new Promise<string>((resolve) => {
      held.socket.once('data', (d) => resolve(String(d)));
      held.socket.write('still here\n');
    });
    t.equal(echoed, 'still here\n', 'the open connection still works');
    await p.apply({ services: [svc(vip, port, all)] });
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add((await hello(lp, vip)).id);
    t.ok(seen.has(leaving), 'back in rotation when healthy again');
  });

  t.test(`${mode}: idle timeout closes a silent connection`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    const p = new ProxyDataplane({ ...modeOpts, config: cfg({ idleTimeout: 0.3 }) });
    t.teardown(() => p.stop());
    const vip = '127.0.0.17';
    await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
    const lp = await listenPort(p, vip);
    const h = await hello(lp, vip, true);
    const t0 = Date.now();
    await new Promise((r) => h.socket.once('close', r));
    const ms = Date.now() - t0;
    t.ok(ms >= 250 && ms < 3000, `closed after ${ms} ms of silence`);
  });

  t.test(`${mode}: UDP relay: weighted sessions, replies from the VIP, no healthy backend drops`, async (t) => {
    const addrs = ['127.0.0.1', '127.0.0.2'];
    let port = 0;
    for (const a of addrs) {
      const s = dgram.createSocket('udp4');
      s.on('message', (m, r) => s.send(Buffer.concat([Buffer.from(`${a}:`), m]), r.port, r.address));
      await new Promise<void>((r) => s.bind(port, a, () => r()));
      port = s.address().port;
      t.teardown(() => s.close());
    }
    const p = new ProxyDataplane({ ...modeOpts, config: cfg() });
    t.teardown(() => p.stop());
    const vip = '127.0.0.18';
    const udp: PortSpec = { name: 'dns', port: 0, protocol: 'UDP', targetPort: port };
    await p.apply({ services: [{ key: 'default/dns', vip, ports: [udp], healthy: [b(addrs[0]!, 1), b(addrs[1]!, 2)], backends: [b(addrs[0]!), b(addrs[1]!)] }] });
    const lp = await listenPort(p, vip, 'UDP');
    const ask = (c: dgram.Socket, msg: string) => new Promise<{ text: string; from: string }>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no reply')), 2000);
      c.once('message', (m, r) => { clearTimeout(timer); resolve({ text: String(m), from: `${r.address}:${r.port}` }); });
      c.send(msg, lp, vip);
    });
    const counts = new Map<string, number>();
    for (let i = 0; i < 60; i++) {
      const c = dgram.createSocket('udp4');
      await new Promise<void>((r) => c.bind(0, '127.0.0.1', () => r()));
      const a = await ask(c, 'q1');
      const again = await ask(c, 'q2');
      t.equal(again.text.split(':')[0], a.text.split(':')[0], 'a session sticks to its backend');
      t.equal(a.from, `${vip}:${lp}`, 'the reply comes from the VIP:port');
      counts.set(a.text.split(':')[0]!, (counts.get(a.text.split(':')[0]!) ?? 0) + 1);
      c.close();
    }
    within10(t, counts, { [addrs[0]!]: 1, [addrs[1]!]: 2 }, 60);
    // A client that keeps its socket: its session ends with its backend's health, not at the idle timeout.
    const steady = dgram.createSocket('udp4');
    t.teardown(() => steady.close());
    await new Promise<void>((r) => steady.bind(0, '127.0.0.1', () => r()));
    const first = (await ask(steady, 'q1')).text.split(':')[0]!;
    const other = addrs.find((a) => a !== first)!;
    await p.apply({ services: [{ key: 'default/dns', vip, ports: [udp], healthy: [b(other, 1)], backends: [b(addrs[0]!), b(addrs[1]!)] }] });
    t.equal((await ask(steady, 'q2')).text, `${other}:q2`, 'its next datagram goes to the backend still healthy');
    await p.apply({ services: [{ key: 'default/dns', vip, ports: [udp], healthy: [], backends: [b(addrs[0]!)] }] });
    await t.rejects(ask(steady, 'q3'), /no reply/, 'nothing answers it once no backend is healthy');
    const c = dgram.createSocket('udp4');
    t.teardown(() => c.close());
    await new Promise<void>((r) => c.bind(0, '127.0.0.1', () => r()));
    await t.rejects(ask(c, 'q'), /no reply/, 'nor a new client');
    // Removed, then back: the port is bound again (a removed UDP port ends its sessions with its socket).
    await p.apply({ services: [] });
    t.equal(await listenPort(p, vip, 'UDP').catch(() => undefined), undefined, 'nothing listens once the port is removed');
    await p.apply({ services: [{ key: 'default/dns', vip, ports: [udp], healthy: [b(addrs[0]!, 1)], backends: [b(addrs[0]!)] }] });
    const lp2 = await listenPort(p, vip, 'UDP');
    const back = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no reply')), 2000);
      c.once('message', (m) => { clearTimeout(timer); resolve(String(m)); });
      c.send('again', lp2, vip);
    });
    t.equal(back, `${addrs[0]}:again`, 'served again after a remove and re-add');
  });

  t.test(`${mode}: a port that cannot be bound is reported; the others are applied`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    const squatter = net.createServer();
    await new Promise<void>((r) => squatter.listen(0, '127.0.0.19', () => r()));
    t.teardown(() => squatter.close());
    const taken = (squatter.address() as net.AddressInfo).port;
    const p = new ProxyDataplane({ ...modeOpts, config: cfg() });
    t.teardown(() => p.stop());
    const err = await p.apply({
      services: [
        { key: 'a/ok', vip: '127.0.0.20', ports: [tcpPort(port)], healthy: [b('127.0.0.1')], backends: [b('127.0.0.1')] },
        { key: 'b/clash', vip: '127.0.0.19', ports: [{ name: '', port: taken, protocol: 'TCP', targetPort: port }], healthy: [b('127.0.0.1')], backends: [b('127.0.0.1')] },
      ],
    }).then(() => undefined, (e: unknown) => e);
    t.ok(isLbError(err, 'LB_ERR_FORWARD_LISTEN'), 'apply reports LB_ERR_FORWARD_LISTEN');
    t.match((err as Error).message, /b\/clash: cannot listen on 127\.0\.0\.19/);
    t.equal((await attempt(await listenPort(p, '127.0.0.20'), '127.0.0.20')).what, '127.0.0.1', 'the other service forwards');
    t.match((await p.stats()).problems.join('\n'), /b\/clash/);
  });

  t.test(`${mode}: metrics on the registry passed in; stop closes listeners and unregisters`, async (t) => {
    const port = await echoBackends(['127.0.0.1'], t);
    const registry = new Registry();
    const p = new ProxyDataplane({ ...modeOpts, config: cfg(), registry, reason: 'auto: test' });
    const vip = '127.0.0.21';
    await p.apply({ services: [svc(vip, port, [b('127.0.0.1')], [b('127.0.0.1'), b('127.0.0.2')])] });
    const lp = await listenPort(p, vip);
    await hello(lp, vip);
    await new Promise((r) => setTimeout(r, 50));
    const text = await registry.metrics();
    t.match(text, /lbagent_forward_connections_total\{service="web",namespace="default",backend="127\.0\.0\.1",port="p"\} 1/);
    t.match(text, /lbagent_forward_bytes_total\{service="web",namespace="default",backend="127\.0\.0\.1",direction="to_client"\} 10/);
    t.match(text, /lbagent_forward_active_connections\{service="web",namespace="default",backend="127\.0\.0\.1",port="p"\} 0/);
    t.notMatch(text, /backend="127\.0\.0\.2"/, 'a backend that carried nothing and failed nothing has no series');
    t.match(text, /lbagent_forward_dataplane_info\{kind="proxy",reason="auto: test"\} 1/);
    t.match(text, /lbagent_forward_no_healthy_backend\{service="web",namespace="default"\} 0/);
    await p.stop();
    t.equal((await attempt(lp, vip)).what, 'ECONNREFUSED', 'listener closed');
    t.notMatch(await registry.metrics(), /lbagent_forward_/);
  });
}

// Own exhaustion (issue 15): the proxy runs in a child under `prlimit
// --nofile=64` with maxConnections far above what 64 descriptors allow;
// this process (no such limit) holds the backend and 150 silent clients.
// The child's connects fail with EMFILE: no passive-health failure may be
// reported, the clients are closed (never left hanging), and once they are
// gone it serves again. One worker: an engine accepts and then connects in
// one callback, so when the accept takes the last descriptor the connect
// is what fails; with two, the other worker's accept may hit EMFILE first
// (libuv then closes the pending clients itself, invisibly).
t.test('the passive-health rings are drained every 50 ms while they report, backing off to 500 ms while they stay empty', async (t) => {
  const delays: number[] = [];
  let d = 50;
  for (const drained of [0, 0, 0, 0, 0, 3, 0, 1, 1]) delays.push(d = nextReportDrainMs(d, drained));
  t.same(delays, [100, 200, 400, 500, 500, 50, 100, 50, 50]);
});

t.test('EMFILE on a backend connect is the proxy\'s own: no failure reported, clients closed, served again after', async (t) => {
  const port = await echoBackends(['127.0.0.1'], t);
  const script = `
    const { ProxyDataplane } = require(${JSON.stringify(require.resolve('../../agent/forward/proxy'))});
    const results = [];
    const p = new ProxyDataplane({ config: { algorithm: 'round-robin', idleTimeout: 60, connectTimeout: 2 }, maxConnections: 10000, workers: 1,
      onConnectResult: (k, a, ok) => results.push(ok) });
    p.apply({ services: [{ key: 'default/web', vip: '127.0.0.21', ports: [{ name: 'p', port: 0, protocol: 'TCP', targetPort: ${port} }],
      healthy: [{ address: '127.0.0.1', addressNum: 2130706433, weight: 1 }], backends: [{ address: '127.0.0.1', addressNum: 2130706433, weight: 1 }] }] })
      .then(() => p.stats()).then((st) => process.stdout.write(JSON.stringify({ port: st.details.listeners[0].boundPort }) + '\\n'));
    // "fill": hold every free descriptor but one, so the next client's accept takes the last one and
    // its backend connect meets EMFILE; "release": give them back; anything else: the stats.
    const fs = require('node:fs');
    const held = [];
    process.stdin.on('data', async (d) => {
      const cmd = d.toString().trim();
      if (cmd === 'fill') {
        for (;;) { try { held.push(fs.openSync('/dev/null', 'r')); } catch { break; } }
        fs.closeSync(held.pop());
      } else if (cmd === 'release') {
        while (held.length > 0) fs.closeSync(held.pop());
      }
      const st = await p.stats();
      process.stdout.write(JSON.stringify({ failures: results.filter((ok) => !ok).length, successes: results.filter((ok) => ok).length, own: st.ownLimits, held: held.length }) + '\\n');
    });
  `;
  const child = spawn('prlimit', ['--nofile=64:64', process.execPath, '-e', script], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.teardown(() => { child.kill('SIGKILL'); });
  const lines: Record<string, unknown>[] = [];
  let buf = '';
  child.stdout.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) { lines.push(JSON.parse(buf.slice(0, nl)) as Record<string, unknown>); buf = buf.slice(nl + 1); }
  });
  const next = async (n: number): Promise<Record<string, unknown>> => {
    for (let i = 0; i < 200 && lines.length < n; i++) await new Promise((r) => setTimeout(r, 50));
    if (lines.length < n) throw new Error('the proxy child did not answer');
    return lines[n - 1]!;
  };
  const lp = (await next(1)).port as number;
  // 150 clients connect and say nothing: each one the proxy takes needs two descriptors.
  const outcomes = await Promise.all(Array.from({ length: 150 }, () => new Promise<string>((resolve) => {
    const s = net.connect({ port: lp, host: '127.0.0.21' });
    let data = '';
    const timer = setTimeout(() => { s.destroy(); resolve('held'); }, 3000);
    s.on('data', (d) => { data += d.toString(); });
    s.on('end', () => { clearTimeout(timer); s.destroy(); resolve(data ? 'served' : 'closed'); });
    s.on('error', (e: NodeJS.ErrnoException) => { clearTimeout(timer); resolve(e.code ?? 'error'); });
  })));
  const tally: Record<string, number> = {};
  for (const o of outcomes) tally[o] = (tally[o] ?? 0) + 1;
  type Stats = { failures: number; successes: number; own: Record<string, number> | undefined; held: number };
  child.stdin.write('stats\n');
  const st = await next(2) as Stats;
  t.comment(`150 silent clients against 64 descriptors: ${JSON.stringify(tally)}; proxy: ${JSON.stringify(st)}`);
  t.equal(st.failures, 0, 'no connect failure reported against the backend');
  t.ok((tally['closed'] ?? 0) + (tally['ECONNRESET'] ?? 0) > 0, 'the clients beyond the descriptors were closed, not left hanging');
  // Whether the flood's exhaustion lands on an accept or on a connect depends on how the free
  // descriptors line up with the relay's accept batches (8 accepted, then 8 connects): either is own.
  const own = (o: Stats['own'], op: string): number => Object.entries(o ?? {}).filter(([k]) => k.startsWith(op)).reduce((n, [, v]) => n + v, 0);
  t.ok(own(st.own, 'accept/') + own(st.own, 'connect/') >= 1, 'the flood\'s exhaustion was counted as the proxy\'s own');
  // One descriptor left: the next client is accepted on it and its backend connect meets EMFILE.
  await new Promise((r) => setTimeout(r, 2500)); // everyone gone, past the longest backoff
  child.stdin.write('fill\n');
  const filled = await next(3) as Stats;
  const one = await attempt(lp, '127.0.0.21');
  child.stdin.write('stats\n');
  const after = await next(4) as Stats;
  t.comment(`one descriptor left (${filled.held} held): ${JSON.stringify(one)}; proxy: ${JSON.stringify(after)}`);
  t.equal(one.ok, false, 'the client on the last descriptor was not served');
  t.equal(own(after.own, 'connect/EMFILE') - own(filled.own, 'connect/EMFILE'), 1, 'its connect EMFILE was counted as the proxy\'s own');
  t.equal(own(after.own, 'accept/') - own(filled.own, 'accept/'), 0, 'its accept was not refused');
  t.equal(after.failures, 0, 'still no connect failure reported against the backend');
  // Descriptors back: a new client is served.
  child.stdin.write('release\n');
  await next(5);
  await new Promise((r) => setTimeout(r, 2500)); // past the longest backoff
  const again = await attempt(lp, '127.0.0.21');
  t.same([again.ok, again.what], [true, '127.0.0.1'], 'served again');
});

// --- the fast paths, each checked on its own (issue 18) ------------------------

t.test('fast paths on by default: two worker threads each accept from a SO_REUSEPORT group of two, through the addon\'s relay', async (t) => {
  const port = await echoBackends(['127.0.0.1'], t);
  const p = new ProxyDataplane({ config: cfg(), workers: 2 });
  t.teardown(() => p.stop());
  const vip = '127.0.0.30';
  await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
  const lp = await listenPort(p, vip);
  // The kernel hashes each connection's ports to one socket of the group: 60 connections reach both.
  for (let i = 0; i < 60; i++) t.equal((await hello(lp, vip)).id, '127.0.0.1');
  const st = await p.stats();
  const workers = st.details['workers'] as { index: number; thread: boolean; accepted: number }[];
  t.same(workers.map((w) => w.thread), [true, true], 'two worker threads');
  t.ok(workers.every((w) => w.accepted > 0), `both accepted (${workers.map((w) => w.accepted).join(' + ')})`);
  t.equal(workers.reduce((n, w) => n + w.accepted, 0), 60);
  const l = (st.details['listeners'] as { sockets: number; reusePort: boolean }[])[0]!;
  t.same([l.sockets, l.reusePort], [2, true], 'one SO_REUSEPORT socket per worker');
});

/** A ListenerStore in memory that records what the proxy does with it. */
class MemoryStore {
  readonly kept: [string, number][] = [];
  readonly dropped: string[] = [];
  constructor(private readonly left: Map<string, number[]>) {}
  take(id: string): number | undefined { return this.left.get(id)?.shift(); }
  keep(id: string, fd: number): void { this.kept.push([id, fd]); }
  drop(id: string): void { this.dropped.push(id); }
}

t.test('listener store: a SO_REUSEPORT group left by an earlier process is served whole, with more or fewer workers', async (t) => {
  const { listenTcp4, socketInfo } = await import('../../agent/native/native');
  const port = await echoBackends(['127.0.0.1'], t);
  const vip = '127.0.0.32';
  for (const workers of [1, 3]) {
    const a = listenTcp4(parseIPv4(vip)!, 0, 64, true);
    const b2 = listenTcp4(parseIPv4(vip)!, a.port, 64, true);
    const spec = tcpPort(port);
    const id = `${vip}|TCP|${spec.port}`;
    const store = new MemoryStore(new Map([[id, [a.fd, b2.fd]]]));
    const p = new ProxyDataplane({ config: cfg(), workers, listenerStore: store });
    await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
    t.equal(await listenPort(p, vip), a.port, `${workers} worker(s): the inherited port`);
    // Whichever socket of the group the kernel picks, someone accepts: no connection waits.
    for (let i = 0; i < 30; i++) t.equal((await attempt(a.port, vip)).what, '127.0.0.1');
    const l = ((await p.stats()).details['listeners'] as { sockets: number }[])[0]!;
    t.equal(l.sockets, Math.max(2, workers), `${workers} worker(s): both inherited sockets kept${workers > 2 ? ', one added' : ''}`);
    t.same(store.kept.filter(([k]) => k === id).length, l.sockets, 'every socket of the group is kept in the store');
    t.ok(socketInfo(a.fd).listening, 'the inherited descriptors are the ones in use');
    await p.stop({ keep: true });
    t.same(store.dropped, [], 'a planned stop drops nothing from the store');
  }
});

t.test('listener store: an older lb-agent\'s socket without SO_REUSEPORT is shared by every worker', async (t) => {
  const { listenTcp4 } = await import('../../agent/native/native');
  const port = await echoBackends(['127.0.0.1'], t);
  const vip = '127.0.0.33';
  const old = listenTcp4(parseIPv4(vip)!, 0, 64, false);
  const id = `${vip}|TCP|0`;
  const p = new ProxyDataplane({ config: cfg(), workers: 2, listenerStore: new MemoryStore(new Map([[id, [old.fd]]])) });
  t.teardown(() => p.stop());
  await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
  for (let i = 0; i < 20; i++) t.equal((await attempt(old.port, vip)).what, '127.0.0.1');
  const st = await p.stats();
  t.same(((st.details['listeners']) as { sockets: number; reusePort: boolean }[]).map((l) => [l.sockets, l.reusePort]), [[1, false]], 'one socket, no group');
});

t.test('a worker that ends is replaced and serves the same sockets; its connections leave the counts', async (t) => {
  const port = await echoBackends(['127.0.0.1'], t);
  const p = new ProxyDataplane({ config: cfg(), workers: 2 });
  t.teardown(() => p.stop());
  const vip = '127.0.0.34';
  await p.apply({ services: [svc(vip, port, [b('127.0.0.1')])] });
  const lp = await listenPort(p, vip);
  // 16: the kernel spreads them over the two workers by hash, so the one that
  // ends holds some of them but for a 2^-15 chance.
  const held = await Promise.all(Array.from({ length: 16 }, () => hello(lp, vip, true)));
  t.equal((await p.stats()).details['openConnections'], 16);
  let ended = 0;
  for (const h of held) h.socket.once('close', () => { ended++; });
  // As if the thread had died (an out-of-memory worker ends the same way): reach into the proxy for it.
  const hosts = (p as unknown as { hosts: { worker: import('node:worker_threads').Worker }[] }).hosts;
  await hosts[0]!.worker.terminate();
  await new Promise((r) => setTimeout(r, 300));
  for (let i = 0; i < 30; i++) t.equal((await attempt(lp, vip)).what, '127.0.0.1', `connection ${i} served after the worker ended`);
  const st = await p.stats();
  const workers = st.details['workers'] as { alive: boolean; accepted: number }[];
  t.same(workers.map((w) => w.alive), [true, true], 'replaced');
  t.ok(ended > 0 && ended < held.length, `the ended worker's held connections closed with it (${ended} of ${held.length})`);
  // The count is the surviving worker's held connections, once the attempts'
  // closes have reached it (a moment after the client's; bounded wait). A
  // count that kept the dead worker's would stay at 16.
  let open = NaN;
  for (let i = 0; i < 100; i++) {
    open = (await p.stats()).details['openConnections'] as number;
    if (open === held.length - ended) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  t.equal(open, held.length - ended, 'the dead worker\'s connections no longer count');
  for (const h of held) h.socket.destroy();
});
