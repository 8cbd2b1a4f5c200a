// Tests of the native batch TCP prober (agent/health/native-probe.ts on the
// addon's TcpProbeHandle) against real listeners on loopback: an open port
// is ok; by default the probe ends with a RST before the handshake's ACK (the
// backend's application sees no connection, nothing is left in TIME_WAIT),
// with close 'reset' after a full handshake, with close 'fin' with a FIN (no
// RST, even with a banner the probe never reads); a closed port is refused, probes started together go down in one
// call, a cancelled probe reports nothing, a backend that never closes does
// not keep our descriptor past the grace, EMFILE under a low descriptor limit
// (a child process under prlimit) comes back as EMFILE, and the errno table.
// A connect timeout needs dropped SYNs: test/privileged/health-native-probe.test.ts.
import t from 'tap';
import * as net from 'node:net';
import * as path from 'node:path';
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { DeadlineRing, NativeTcpProber, TRIM_MS, errnoCode, type ProbeClose } from '../../agent/health/native-probe';
import { realClock, type TimerHandle } from '../../agent/clock';
import { CLOSE_GRACE_MS, type TcpTarget } from '../../agent/health/probe';
import type { FailureReason } from '../../agent/health/state';
import { isLbError } from '../../agent/errors';
import type { NativeAddon } from '../../agent/native/native';
import { listen, closedPort } from './loopback';

interface Outcome { ctx: number; ok: boolean; reason: FailureReason | undefined; detail: string | undefined; durationMs: number }

function prober(close?: ProbeClose): { p: NativeTcpProber<number>; outcomes: Outcome[]; wait: (n: number, ms?: number) => Promise<Outcome[]> } {
  const outcomes: Outcome[] = [];
  const p = new NativeTcpProber<number>({
    onOutcome: (ctx, ok, reason, detail, durationMs) => outcomes.push({ ctx, ok, reason, detail, durationMs }),
    ...(close ? { close } : {}),
  });
  const wait = async (n: number, ms = 5000): Promise<Outcome[]> => {
    const end = Date.now() + ms;
    while (outcomes.length < n && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
    return outcomes;
  };
  return { p, outcomes, wait };
}

const target = (port: number): TcpTarget => ({ address: '127.0.0.1', addressNum: 0x7f000001, port });

/** Loopback sockets whose remote port is `port`, as [local address:port, TCP state] (/proc/net/tcp hex: 01 ESTABLISHED, 06 TIME_WAIT, ...). */
function socketsTo(port: number): [string, string][] {
  const rem = `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  return readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)
    .map((l) => l.trim().split(/\s+/)).filter((f) => f[2] === rem).map((f) => [f[1]!, f[3]!]);
}

/**
 * Before the probes: the sockets to `port` that are not ours. Parallel test
 * files share the host's ports, and an earlier listener's clients may sit in
 * TIME_WAIT toward the port number ours was given.
 */
function othersTo(port: number): Set<string> {
  return new Set(socketsTo(port).map(([local]) => local));
}

/** The states of our side of the probes to `port`: every socket to it but the others seen before. */
function ourSockets(port: number, others: Set<string>): string[] {
  return socketsTo(port).filter(([local]) => !others.has(local)).map(([, state]) => state);
}

const until = async (what: string, fn: () => boolean, ms = 5000): Promise<void> => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};

t.test('by default an open port is ok and the probe ends as HAProxy\'s: SYN, SYN-ACK, RST; the backend accepts nothing, nothing in TIME_WAIT', async (t) => {
  const seen: string[] = [];
  const server = net.createServer((sock) => { seen.push('accepted'); sock.on('error', () => {}); sock.resume(); });
  const port = await listen(server);
  const others = othersTo(port);
  t.teardown(() => server.close());
  const { p, wait } = prober();
  t.teardown(() => p.close());
  for (let i = 0; i < 20; i++) p.start(target(port), 1000, i, performance.timeOrigin + performance.now());
  const got = await wait(20);
  t.equal(got.length, 20, 'every probe answered');
  t.ok(got.every((o) => o.ok && o.reason === undefined), 'each connected');
  t.same(p.stats().connecting + p.stats().closing, 0, 'no socket kept after the result');
  t.same(ourSockets(port, others), [], 'no socket of ours left, none in TIME_WAIT (06)');
  // Longer than TCP_DELACK_MAX (200 ms): a handshake ACK still held back would have gone by now.
  await new Promise((r) => setTimeout(r, 300));
  t.same(seen, [], 'the backend\'s application saw no connection');
});

t.test('close \'reset\': a full handshake, then a RST; the backend accepts each connection and sees no FIN, nothing in TIME_WAIT', async (t) => {
  const seen: string[] = [];
  const server = net.createServer((sock) => {
    seen.push('accepted');
    sock.on('end', () => seen.push('fin'));
    sock.on('error', (e: NodeJS.ErrnoException) => seen.push(`error ${e.code}`));
    sock.resume();
  });
  const port = await listen(server);
  const others = othersTo(port);
  t.teardown(() => server.close());
  const { p, wait } = prober('reset');
  t.teardown(() => p.close());
  for (let i = 0; i < 20; i++) p.start(target(port), 1000, i, performance.timeOrigin + performance.now());
  const got = await wait(20);
  t.ok(got.length === 20 && got.every((o) => o.ok), 'each connected');
  t.same(p.stats().connecting + p.stats().closing, 0, 'no socket kept after the result');
  t.same(ourSockets(port, others), [], 'no socket of ours left, none in TIME_WAIT (06)');
  await until('20 connections at the backend', () => seen.filter((s) => s === 'accepted').length === 20);
  await until('each reset', () => seen.filter((s) => s === 'error ECONNRESET').length === 20);
  t.same(seen.filter((s) => s === 'fin'), [], 'no FIN');
});

t.test('close \'fin\': an open port is ok; the socket ends with a FIN, never a RST, and closes at the backend\'s FIN', async (t) => {
  const seen: string[] = [];
  const server = net.createServer((sock) => {
    sock.on('end', () => seen.push('fin'));
    sock.on('error', (e: NodeJS.ErrnoException) => seen.push(`error ${e.code}`));
    // A banner the probe never reads, as SSH or SMTP would send: unread data
    // is what turns a plain close() into a RST (RFC 2525 §2.17).
    sock.write('220 hello\r\n');
  });
  const port = await listen(server);
  t.teardown(() => server.close());
  const { p, wait } = prober('fin');
  t.teardown(() => p.close());
  for (let i = 0; i < 20; i++) p.start(target(port), 1000, i, performance.timeOrigin + performance.now());
  const got = await wait(20);
  t.equal(got.length, 20, 'every probe answered');
  t.ok(got.every((o) => o.ok && o.reason === undefined), 'each connected');
  t.same(got.map((o) => o.ctx).sort((a, b) => a - b), [...Array(20).keys()], 'each context back once');
  t.ok(got.every((o) => o.durationMs >= 0 && o.durationMs < 1000), 'durations within the timeout');
  await until('20 FINs at the backend', () => seen.filter((s) => s === 'fin').length === 20);
  await until('our sockets closed after the backend\'s FIN', () => p.stats().closing === 0 && p.stats().connecting === 0);
  t.same(seen.filter((s) => s.startsWith('error')), [], 'the backend saw no reset');
  t.equal(p.stats().swept, 0, 'none needed the sweep');
});

/** Descriptors of this process that are sockets. */
function socketFds(): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try { if (readlinkSync(`/proc/self/fd/${fd}`).startsWith('socket:')) n++; } catch { /* closed meanwhile */ }
  }
  return n;
}

t.test('reset modes keep a probe\'s socket for the next probe to the same address: one socket for ten probes in a row, another address its own, a refused socket works again, the trim closes unused ones', async (t) => {
  const accepted: string[] = [];
  const a = net.createServer((sock) => { accepted.push('a'); sock.destroy(); });
  const b = net.createServer((sock) => { accepted.push('b'); sock.destroy(); });
  const portA = await listen(a);
  await new Promise<void>((r) => b.listen(0, '127.0.0.2', r));
  const portB = (b.address() as net.AddressInfo).port;
  const refused = await closedPort();
  t.teardown(() => { a.close(); b.close(); });
  // The real clock, but the trim's timer is the test's to fire.
  let trim: (() => void) | undefined;
  const trimHandle: TimerHandle = {};
  const clock = { ...realClock, setTimeout: (fn: () => void, ms: number) => {
    if (ms === TRIM_MS) { trim = fn; return trimHandle; }
    return realClock.setTimeout(fn, ms);
  }, clearTimeout: (h: TimerHandle) => { if (h !== trimHandle) realClock.clearTimeout(h); } };
  const outcomes: Outcome[] = [];
  const p = new NativeTcpProber<number>({ clock, onOutcome: (ctx, ok, reason, detail, durationMs) => outcomes.push({ ctx, ok, reason, detail, durationMs }) });
  t.teardown(() => p.close());
  const probe = async (tg: TcpTarget): Promise<Outcome> => {
    const n = outcomes.length;
    p.start(tg, 1000, n, realClock.now());
    await until('the outcome', () => outcomes.length > n);
    return outcomes[n]!;
  };
  const fds0 = socketFds();
  const othersA = othersTo(portA);
  for (let i = 0; i < 10; i++) t.ok((await probe(target(portA))).ok, `probe ${i + 1} connected`);
  t.equal(p.stats().reused, 9, 'nine of ten probes took the first one\'s socket');
  t.equal(p.stats().idle, 1, 'one socket kept');
  t.equal(socketFds() - fds0, 1, 'one descriptor more in the process, not ten');
  const r = await probe(target(refused));
  t.equal(r.detail, 'ECONNREFUSED', 'a closed port on the same address is refused through the kept socket');
  t.equal(p.stats().reused, 10);
  t.ok((await probe(target(portA))).ok, 'the socket whose connect was refused connects again');
  t.equal(p.stats().reused, 11);
  t.ok((await probe({ address: '127.0.0.2', addressNum: 0x7f000002, port: portB })).ok, 'another address');
  t.equal(p.stats().reused, 11, 'another address does not take the first address\'s socket');
  t.equal(p.stats().idle, 2, 'each address keeps its own');
  t.same(ourSockets(portA, othersA), [], 'nothing of ours in /proc/net/tcp: a kept socket is disconnected, no port held, no TIME_WAIT');
  await new Promise((res) => setTimeout(res, 300));
  t.same(accepted, [], 'the backends\' applications saw no connection: still SYN, SYN-ACK, RST');
  t.ok(trim, 'the trim is armed');
  trim!();
  t.equal(p.stats().idle, 2, 'the first trim keeps the sockets kept since the start');
  t.ok((await probe(target(portA))).ok);
  trim!();
  t.equal(p.stats().idle, 1, 'the second closes the one no probe took since the first');
  t.equal(p.stats().trimmed, 1);
  t.equal(socketFds() - fds0, 1, 'and its descriptor');
  trim!();
  t.equal(p.stats().idle, 0, 'then the other');
  t.equal(socketFds() - fds0, 0, 'no descriptor left');
});

t.test('a closed port is refused at once, as ECONNREFUSED', async (t) => {
  const port = await closedPort();
  const { p, wait } = prober();
  t.teardown(() => p.close());
  p.start(target(port), 3000, 7, performance.timeOrigin + performance.now());
  const [o] = await wait(1);
  t.same(o && [o.ctx, o.ok, o.reason, o.detail], [7, false, 'refused', 'ECONNREFUSED']);
  t.ok(o!.durationMs < 1000, 'long before the timeout');
  t.same(p.stats().connecting + p.stats().closing, 0, 'nothing left open');
});

t.test('probes started in one tick go down in one call', async (t) => {
  const server = net.createServer((s) => s.resume());
  const port = await listen(server);
  t.teardown(() => server.close());
  const { p, wait } = prober();
  t.teardown(() => p.close());
  const now = performance.timeOrigin + performance.now();
  for (let i = 0; i < 300; i++) p.start(target(port), 2000, i, now);
  await wait(300);
  t.equal(p.stats().started, 300);
  t.equal(p.stats().batches, 1, '300 probes, one connect() call into the addon');
  // Ids are reused: a second round needs no more than the first.
  for (let i = 0; i < 300; i++) p.start(target(port), 2000, 1000 + i, performance.timeOrigin + performance.now());
  const all = await wait(600);
  t.equal(all.filter((o) => o.ok).length, 600);
  t.equal(p.stats().batches, 2);
});

t.test('a probe cancelled before its batch goes down reports nothing and opens nothing', async (t) => {
  const accepted: net.Socket[] = [];
  const server = net.createServer((s) => { accepted.push(s); s.resume(); });
  const port = await listen(server);
  t.teardown(() => server.close());
  // A FIN close, so the backend accepts (and counts) each connection made.
  const { p, outcomes, wait } = prober('fin');
  t.teardown(() => p.close());
  const now = performance.timeOrigin + performance.now();
  const a = p.start(target(port), 1000, 1, now);
  p.start(target(port), 1000, 2, now);
  p.cancel(a, 1);
  p.cancel(a, 99); // another context: ignored
  await wait(1);
  await new Promise((r) => setTimeout(r, 100));
  t.same(outcomes.map((o) => o.ctx), [2], 'only the probe not cancelled answered');
  t.equal(accepted.length, 1, 'the backend saw one connection');
  t.equal(p.stats().inFlight, 0);
});

t.test('a backend that keeps the connection open does not keep our descriptor past the grace', async (t) => {
  const held: net.Socket[] = [];
  // allowHalfOpen: our FIN does not make the backend close its side.
  const server = net.createServer({ allowHalfOpen: true }, (s) => { held.push(s); s.on('error', () => {}); s.resume(); });
  const port = await listen(server);
  t.teardown(() => { for (const s of held) s.destroy(); server.close(); });
  const { p, wait } = prober('fin');
  t.teardown(() => p.close());
  for (let i = 0; i < 5; i++) p.start(target(port), 1000, i, performance.timeOrigin + performance.now());
  t.equal((await wait(5)).filter((o) => o.ok).length, 5);
  t.equal(p.stats().closing, 5, 'waiting for the backend\'s FIN');
  await until('the sweep to close them', () => p.stats().closing === 0, CLOSE_GRACE_MS + 2000);
  t.equal(p.stats().swept, 5, 'closed by the sweep');
});

t.test('close() ends every probe in flight without outcomes', async (t) => {
  const server = net.createServer((s) => s.resume());
  const port = await listen(server);
  t.teardown(() => server.close());
  const { p, outcomes } = prober();
  p.start(target(port), 1000, 1, performance.timeOrigin + performance.now());
  p.close();
  await new Promise((r) => setTimeout(r, 100));
  t.same(outcomes, []);
  t.throws(() => p.start(target(port), 1000, 2, 0), /after close/);
  t.same(p.stats().connecting + p.stats().closing, 0);
});

t.test('an addon without the prober is refused with LB_ERR_NET_NATIVE_MISSING', async (t) => {
  const old = (): NativeAddon => ({}) as NativeAddon;
  let caught: unknown;
  try { new NativeTcpProber({ onOutcome: () => {}, addon: old }); } catch (err) { caught = err; }
  t.ok(isLbError(caught, 'LB_ERR_NET_NATIVE_MISSING'), `refused: ${String(caught)}`);
});

t.test('the deadline ring is a FIFO across wrap-around and growth', async (t) => {
  const r = new DeadlineRing();
  let torn = 0;
  const drain = (n: number): number[] => {
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      const id = r.ids[r.head]!;
      if (r.at[r.head] !== id * 10 || r.gens[r.head] !== id + 1) torn++;
      out.push(id);
      r.shift();
    }
    return out;
  };
  for (let id = 0; id < 200; id++) r.push(id, id + 1, id * 10);
  t.same(drain(150), [...Array(150).keys()]);
  // 50 left near the end of 256 slots: the next pushes wrap, then grow.
  for (let id = 200; id < 600; id++) r.push(id, id + 1, id * 10);
  t.equal(r.len, 450);
  t.same(drain(450), Array.from({ length: 450 }, (_, i) => 150 + i), 'every entry once, in order');
  t.equal(r.len, 0);
  t.equal(torn, 0, 'each id kept its own generation and deadline');
});

t.test('errno numbers read as Node\'s codes', async (t) => {
  t.equal(errnoCode(111), 'ECONNREFUSED');
  t.equal(errnoCode(110), 'ETIMEDOUT');
  t.equal(errnoCode(113), 'EHOSTUNREACH');
  t.equal(errnoCode(24), 'EMFILE');
  t.equal(errnoCode(11), 'EAGAIN', 'an alias (EWOULDBLOCK) takes the first name');
  t.equal(errnoCode(9999), 'errno 9999');
});

t.test('EMFILE under a low descriptor limit comes back as EMFILE, not as a backend failure', async (t) => {
  // A child process under prlimit (256 descriptors) that takes every free
  // descriptor but 10, then starts 100 probes at once to a listener of its
  // own (each accepted connection costs it a descriptor too).
  const dist = path.resolve(__dirname, '..', '..');
  const script = `
    const fs = require('fs');
    const net = require('net');
    const { NativeTcpProber } = require(${JSON.stringify(path.join(dist, 'agent', 'health', 'native-probe.js'))});
    const server = net.createServer((s) => s.resume());
    server.listen(0, '127.0.0.1', () => {
      const port = server.address().port;
      const out = [];
      const p = new NativeTcpProber({ onOutcome: (ctx, ok, reason, detail) => {
        out.push({ ok, reason, detail });
        if (out.length === 100) { for (const fd of filler) fs.closeSync(fd); process.stdout.write(JSON.stringify(out)); process.exit(0); }
      } });
      const filler = [];
      for (;;) { try { filler.push(fs.openSync('/dev/null', 'r')); } catch { break; } }
      for (const fd of filler.splice(0, 10)) fs.closeSync(fd);
      for (let i = 0; i < 100; i++) p.start({ address: '127.0.0.1', addressNum: 0x7f000001, port }, 2000, i, performance.timeOrigin + performance.now());
    });
    setTimeout(() => { process.stderr.write('no outcomes in 10 s'); process.exit(2); }, 10000).unref();
  `;
  const child = spawn('prlimit', ['--nofile=256:256', process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  t.equal(code, 0, `child exited cleanly ${stderr}`);
  const out = JSON.parse(stdout || '[]') as { ok: boolean; reason?: string; detail?: string }[];
  t.equal(out.length, 100);
  const emfile = out.filter((o) => !o.ok && o.detail === 'EMFILE');
  t.ok(emfile.length >= 90, `${emfile.length} probes found no descriptor and said EMFILE`);
  t.ok(out.some((o) => o.ok), 'the rest connected');
  t.same(out.filter((o) => !o.ok && o.detail !== 'EMFILE'), [], 'no other failure: nothing was blamed on the backend');
});

t.test('IPv6 targets connect over AF_INET6 in the same batch as IPv4 ones; reset modes never keep an IPv6 socket', async (t) => {
  const server = net.createServer((sock) => { sock.on('error', () => {}); sock.resume(); });
  await new Promise<void>((resolve) => server.listen(0, '::1', resolve));
  t.teardown(() => server.close());
  const port = (server.address() as net.AddressInfo).port;
  for (const close of [undefined, 'reset'] as const) {
    const { p, wait } = prober(close);
    t.teardown(() => p.close());
    const now = performance.timeOrigin + performance.now();
    p.start({ address: '::1', addressNum: 0, port }, 1000, 0, now);
    p.start({ address: '::1', addressNum: 0, port: 1 }, 1000, 1, now);
    p.start(target(1), 1000, 2, now);
    const got = await wait(3);
    const by = new Map(got.map((o) => [o.ctx, o]));
    t.equal(by.get(0)?.ok, true, `${close ?? 'default'}: an open IPv6 port is ok`);
    t.equal(by.get(1)?.reason, 'refused', `${close ?? 'default'}: a closed IPv6 port is refused`);
    t.equal(by.get(2)?.reason, 'refused', `${close ?? 'default'}: the IPv4 probe of the batch is unchanged`);
    await new Promise((r) => setTimeout(r, 50));
    t.equal(p.stats().idle, 1, `${close ?? 'default'}: only the IPv4 socket is kept for reuse`);
  }
});
