// The native addon boundary: it loads, and its errors look like Node's.
// (Packet sockets need CAP_NET_RAW: see test/privileged/net-packet.test.ts.)
import t from 'tap';
import * as fs from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import * as net from 'node:net';
import * as v8 from 'node:v8';
import * as vm from 'node:vm';
import { parseIPv4 } from '../../agent/address';
import {
  CAP_NET_ADMIN,
  capabilities,
  hasCapability,
  ifIndexToName,
  ifNameToIndex,
  isSystemError,
  loadNative,
  nativeAddonPath,
  sendUnixDatagram,
  listenTcp4,
  socketInfo,
  dupFd,
  mallocTrim,
  lowMemoryNotification,
  collectUnderPressure,
  sha256Fn,
} from '../../agent/native/native';
import { endWorkersHolding } from '../helpers/worker-end';

t.test('the addon is built and loads', async (t) => {
  t.ok(fs.existsSync(nativeAddonPath()), nativeAddonPath());
  const n = loadNative();
  t.type(n.PacketHandle, 'function');
});

t.test('interface lookups', async (t) => {
  t.equal(ifNameToIndex('lo'), 1);
  t.equal(ifIndexToName(1), 'lo');
  try {
    ifNameToIndex('nosuchif0');
    t.fail('should throw');
  } catch (err) {
    t.ok(isSystemError(err));
    t.match(err, { code: 'ENODEV', errno: -19, syscall: 'if_nametoindex', message: /^ENODEV: .*nosuchif0/ });
  }
});

t.test('capabilities', async (t) => {
  const caps = capabilities();
  t.type(caps.effective, 'bigint');
  t.type(caps.permitted, 'bigint');
  t.equal(hasCapability(CAP_NET_ADMIN, { effective: 1n << 12n, permitted: 0n, inheritable: 0n }), true);
  t.equal(hasCapability(CAP_NET_ADMIN, { effective: 1n << 13n, permitted: 0n, inheritable: 0n }), false);
  if (process.getuid?.() !== 0) t.equal(caps.effective, 0n, 'an unprivileged user has none');
});

t.test('sendUnixDatagram: errors name the socket', async (t) => {
  try {
    sendUnixDatagram('/nonexistent/lb-agent-notify', Buffer.from('READY=1'));
    t.fail('should throw');
  } catch (err) {
    t.match(err, { code: 'ENOENT', syscall: 'sendto', path: '/nonexistent/lb-agent-notify' });
  }
  try {
    sendUnixDatagram(`@lb-agent-test-${process.pid}-nobody`, Buffer.from('READY=1'));
    t.fail('should throw');
  } catch (err) {
    t.match(err, { code: 'ECONNREFUSED', syscall: 'sendto' });
  }
  t.throws(() => sendUnixDatagram('x'.repeat(200), Buffer.alloc(1)), RangeError);
});

t.test('sendUnixDatagram delivers to path and abstract sockets', async (t) => {
  // Node has no unix datagram sockets; a tiny python3 receiver stands in for systemd.
  const { spawn, spawnSync } = await import('node:child_process');
  if (spawnSync('python3', ['-c', 'pass']).status !== 0) {
    t.plan(0, 'python3 is not available to receive the datagram');
    return;
  }
  const os = await import('node:os');
  const path = await import('node:path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbnotify-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  for (const name of [path.join(dir, 'notify.sock'), `@lb-agent-test-${process.pid}`]) {
    const bindName = name.startsWith('@') ? '\\0' + name.slice(1) : name;
    const py = spawn('python3', ['-c', [
      'import socket',
      's = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)',
      `s.bind("${bindName}")`,
      's.settimeout(10)',
      'print("ready", flush=True)',
      'print(s.recv(100).decode(), flush=True)',
    ].join('\n')], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    py.stdout.on('data', (d: Buffer) => { out += d.toString(); });
    const deadline = Date.now() + 10_000;
    while (!out.includes('ready') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    t.equal(sendUnixDatagram(name, Buffer.from('READY=1\nSTATUS=ok')), 17);
    await new Promise((r) => py.once('exit', r));
    t.match(out, /READY=1\nSTATUS=ok/, `received on ${name}`);
  }
});

t.test('sendUnixDatagram passes descriptors as SCM_RIGHTS (systemd\'s fd store)', async (t) => {
  const { spawn, spawnSync } = await import('node:child_process');
  if (spawnSync('python3', ['-c', 'pass']).status !== 0) {
    t.plan(0, 'python3 is not available to receive the datagram');
    return;
  }
  const os = await import('node:os');
  const path = await import('node:path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbnotify-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const sock = path.join(dir, 'notify.sock');
  const file = path.join(dir, 'passed');
  fs.writeFileSync(file, 'x');
  const py = spawn('python3', ['-c', [
    'import socket, os',
    's = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)',
    `s.bind("${sock}")`,
    's.settimeout(10)',
    'print("ready", flush=True)',
    'msg, fds, flags, addr = socket.recv_fds(s, 100, 4)',
    'print(msg.decode().replace("\\n", "|"), [os.fstat(f).st_ino for f in fds], flush=True)',
  ].join('\n')], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  py.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  const deadline = Date.now() + 10_000;
  while (!out.includes('ready') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  const fd = fs.openSync(file, 'r');
  t.teardown(() => fs.closeSync(fd));
  t.equal(sendUnixDatagram(sock, Buffer.from('FDSTORE=1\nFDNAME=x'), [fd, fd]), 18);
  await new Promise((r) => py.once('exit', r));
  const ino = fs.statSync(file).ino;
  t.match(out, `FDSTORE=1|FDNAME=x [${ino}, ${ino}]`, 'both descriptors arrive and name the same file');
  t.throws(() => sendUnixDatagram(sock, Buffer.alloc(1), [-1]), RangeError);
  t.throws(() => sendUnixDatagram(sock, Buffer.alloc(1), ['3' as unknown as number]), TypeError);
});

t.test('PacketHandle validates its arguments before any syscall', async (t) => {
  const { PacketHandle } = loadNative();
  t.throws(() => new PacketHandle(0, 0x0806), RangeError);
  t.throws(() => new PacketHandle(1, 0x10000), RangeError);
  t.throws(() => new PacketHandle(1, 0x0806, [[0x06, 0, 0, 2 ** 32]]), RangeError);
  t.throws(() => new PacketHandle(1, 0x0806, [[0x06, 0, 0]] as unknown as [number, number, number, number][]), TypeError);
});

t.test('listening sockets for the proxy: a SO_REUSEPORT group, inspected and duplicated', async (t) => {
  const lo = parseIPv4('127.0.0.1')!;
  const a = listenTcp4(lo, 0, 16, true);
  t.teardown(() => { for (const fd of [a.fd]) { try { fs.closeSync(fd); } catch { /* closed */ } } });
  t.ok(a.port > 0, `bound an ephemeral port (${a.port})`);
  const b = listenTcp4(lo, a.port, 16, true);
  t.teardown(() => { try { fs.closeSync(b.fd); } catch { /* closed */ } });
  t.equal(b.port, a.port, 'a second SO_REUSEPORT socket joins the same port');
  t.same(socketInfo(a.fd), { family: 2, type: 1, address: lo, port: a.port, listening: true, reusePort: true, noDelay: false });
  try {
    listenTcp4(lo, a.port, 16, false);
    t.fail('a socket without SO_REUSEPORT cannot join the group');
  } catch (err) {
    t.ok(isSystemError(err));
    t.match(err, { code: 'EADDRINUSE', errno: -98, syscall: 'bind' });
  }
  const d = dupFd(a.fd);
  t.not(d, a.fd);
  t.same(socketInfo(d), socketInfo(a.fd), 'the duplicate is the same socket');
  fs.closeSync(d);
  t.same(socketInfo(a.fd).listening, true, 'closing the duplicate leaves the socket listening');
  // The kernel accepts on the group: a connect to the port succeeds.
  await new Promise<void>((resolve, reject) => {
    const s = net.connect(a.port, '127.0.0.1', () => { s.destroy(); resolve(); });
    s.on('error', reject);
  });
  const plain = listenTcp4(lo, 0, 16, false);
  t.teardown(() => { try { fs.closeSync(plain.fd); } catch { /* closed */ } });
  t.equal(socketInfo(plain.fd).reusePort, false, 'an old-style socket says it has no SO_REUSEPORT');
  const notSocket = fs.openSync('/dev/null', 'r');
  t.teardown(() => fs.closeSync(notSocket));
  t.throws(() => socketInfo(notSocket), { code: 'ENOTSOCK', syscall: 'getsockname' }, 'a non-socket is refused like Node would');
});

t.test('an install without the built addon (or with a broken one) is LB_ERR_NET_NATIVE_MISSING saying what to run', async (t) => {
  // A copy of the two compiled files in a tree with no native/build: what a
  // checkout looks like when `npm ci` did not build the addon.
  const os = await import('node:os');
  const path = await import('node:path');
  const { spawnSync } = await import('node:child_process');
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-native-'));
  t.teardown(() => fs.rmSync(root, { recursive: true, force: true }));
  fs.mkdirSync(path.join(root, 'dist', 'agent', 'native'), { recursive: true });
  fs.copyFileSync(require.resolve('../../agent/native/native'), path.join(root, 'dist', 'agent', 'native', 'native.js'));
  fs.copyFileSync(require.resolve('../../agent/errors'), path.join(root, 'dist', 'agent', 'errors.js'));
  const load = (): { code?: string; message?: string; path?: string } => {
    const r = spawnSync(process.execPath, ['-e', `
      try { require(${JSON.stringify(path.join(root, 'dist', 'agent', 'native', 'native.js'))}).loadNative(); console.log('{}'); }
      catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message, path: e.details && e.details.path })); }`], { encoding: 'utf8' });
    return JSON.parse(r.stdout) as { code?: string; message?: string; path?: string };
  };
  const addon = path.join(root, 'native', 'build', 'Release', 'lbagent_native.node');
  t.same(load(), {
    code: 'LB_ERR_NET_NATIVE_MISSING', path: addon,
    message: `native addon not built: ${addon} is missing; run \`npm ci\` in the lb-agent directory (it builds native/ with node-gyp), then \`npm run build\``,
  }, 'missing');
  fs.mkdirSync(path.dirname(addon), { recursive: true });
  fs.writeFileSync(addon, 'not an ELF object');
  t.match(load(), { code: 'LB_ERR_NET_NATIVE_MISSING', message: /failed to load .*rebuild it for this Node version with `npm ci`/ }, 'not loadable');
  // Loaded once, kept (issue 18: finding the file cost stat calls on every
  // socket opened): the addon stays in use when its file goes away
  // afterwards (an upgrade replacing the tree under a running agent).
  fs.copyFileSync(nativeAddonPath(), addon);
  const r = spawnSync(process.execPath, ['-e', `
    const n = require(${JSON.stringify(path.join(root, 'dist', 'agent', 'native', 'native.js'))});
    const first = n.loadNative();
    require('node:fs').rmSync(${JSON.stringify(addon)});
    console.log(JSON.stringify({ same: n.loadNative() === first, lo: n.ifNameToIndex('lo') }));`], { encoding: 'utf8' });
  t.same(JSON.parse(r.stdout || '{}'), { same: true, lo: 1 }, `loaded once and kept ${r.stderr}`);
});

t.test('mallocTrim gives the free pages in the middle of the malloc heap back to the kernel (issue 18)', async (t) => {
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  const rssKiB = (): number => Number(/^VmRSS:\s+(\d+)/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))![1]);
  // 32 MiB in 8 KiB blocks from malloc (ArrayBuffer backing stores), every
  // block touched; the last one stays alive, so free() cannot shrink the
  // heap from its top and the pages stay resident until trimmed.
  let blocks: Buffer[] = Array.from({ length: 4096 }, () => Buffer.allocUnsafeSlow(8192).fill(1));
  const keep = Buffer.allocUnsafeSlow(8192).fill(2);
  blocks = [];
  gc();
  gc();
  const before = rssKiB();
  t.equal(mallocTrim(), true, 'something was released');
  const after = rssKiB();
  t.ok(before - after > 8 * 1024, `RSS ${before} -> ${after} KiB: more than 8 MiB returned`);
  t.equal(keep[0], 2);
  t.equal(blocks.length, 0);
});

// Both of V8's footprint-reducing collections return what gc() leaves
// committed: allocate fast enough for V8 to grow the young generation; gc()
// frees the objects but leaves its semi-spaces at the grown size (a high
// allocation rate tells V8's heuristic to keep them), as after the daemon's
// start or a reload. The start runs the low-memory one, each reload the
// pressure one (issue 18).
for (const [name, collect] of [['lowMemoryNotification', lowMemoryNotification], ['collectUnderPressure', collectUnderPressure]] as const) {
  t.test(`${name} returns what gc() leaves committed: the grown young generation (issue 18)`, async (t) => {
    v8.setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as () => void;
    const newSpace = (): number => v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space')!.space_size;
    let junk: { i: number; s: string }[] = [];
    for (let i = 0; i < 300_000; i++) junk.push({ i, s: `x${i}` });
    junk = junk.filter((_, i) => i % 50 === 0);
    gc();
    const before = newSpace();
    t.equal(collect(), true, 'the addon has it');
    const after = newSpace();
    t.ok(after * 2 <= before, `new space ${before} -> ${after} bytes: shrunk to half or less`);
    t.equal(junk.length, 6000, 'what is still referenced survives');
  });
}

t.test('RelayHandle (the proxy relay, issue 18): arguments checked, stale ids ignored, a destroyed handle says EBADF', async (t) => {
  const C = loadNative().RelayHandle;
  if (C === undefined) { t.fail('the addon has no RelayHandle'); return; }
  t.throws(() => new C(() => undefined, new Float64Array(4), new Float64Array(48)), /at least 16 records/);
  t.throws(() => new (C as unknown as new (...a: unknown[]) => unknown)(() => undefined, new Int32Array(80), new Float64Array(48)), TypeError);
  const events = new Float64Array(80);
  const activity = new Float64Array(48);
  const h = new C(() => undefined, events, activity);
  t.teardown(() => h.destroy());
  // Ids carry their slot's generation: one no connection has (or had) changes nothing.
  t.doesNotThrow(() => { h.close(12345); h.reset(7); h.refuse(0); });
  t.equal(h.abort(99), false);
  t.throws(() => h.start(4194304 + 1), /no connected relay/);
  t.equal(h.activity(), 0);
  t.same(h.stats(), { connections: 0, listeners: 0, buffers: 0, wakes: 0, extraPasses: 0 });
  const l = listenTcp4(parseIPv4('127.0.0.1')!, 0, 16, false);
  const lid = h.listen(l.fd, 16);
  t.same(h.stats(), { connections: 0, listeners: 1, buffers: 0, wakes: 0, extraPasses: 0 });
  h.unlisten(lid);
  t.throws(() => socketInfo(l.fd), { code: 'EBADF' }, 'unlisten closed the descriptor');
  h.destroy();
  t.throws(() => h.listen(0, 1), { code: 'EBADF', syscall: 'relay handle' });
});

t.test('a worker thread that ends with a TCP prober or a relay open takes them down without a crash (loop_handles.h)', async (t) => {
  const srv = net.createServer((c) => c.on('data', () => undefined));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  t.teardown(() => srv.close());
  const port = (srv.address() as net.AddressInfo).port;
  // Probes connected to a listener that never closes: their sockets and the poll are open at the end.
  const probing = endWorkersHolding(`
    const h = new addon.TcpProbeHandle(() => {}, new Uint32Array(16), new Int32Array(16), 0);
    const out = new Int32Array(3);
    h.connect(Uint32Array.of(1, 2, 3), Uint32Array.of(0x7f000001, 0x7f000001, 0x7f000001), Uint16Array.of(${port}, ${port}, ${port}), 3, out);
    if (![...out].every((e) => e === 0 || e === 115)) throw new Error('connect: ' + out.join(','));`);
  t.same([probing.signal, probing.status, probing.out], [null, 0, 'all ended'], 'TcpProbeHandle (SIGSEGV before: a plain cleanup hook)');
  const relaying = endWorkersHolding(`
    const h = new addon.RelayHandle(() => {}, new Float64Array(16 * 5), new Float64Array(16 * 3));
    const l = addon.listenTcp4(0x7f000001, 0, 16, false);
    h.listen(l.fd, 16);`);
  t.same([relaying.signal, relaying.status, relaying.out], [null, 0, 'all ended'], 'RelayHandle');
});

t.test('sha256 (the node binary\'s OpenSSL, issue 18) hashes as node:crypto does, at any length and offset', async (t) => {
  const sha256 = sha256Fn();
  if (sha256 === undefined) return t.fail('the addon has no sha256: rebuild it (npx node-gyp rebuild --directory=native)');
  t.equal(sha256(Buffer.alloc(0)).toString('hex'), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', 'empty input (FIPS 180-4 test vector)');
  t.equal(sha256(Buffer.from('abc')).toString('hex'), 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', '"abc" (FIPS 180-4 test vector)');
  const big = randomBytes(70_000);
  for (const len of [1, 55, 56, 63, 64, 65, 1000, 70_000]) {
    const slice = big.subarray(big.length - len);
    t.same(sha256(slice), createHash('sha256').update(slice).digest(), `${len} bytes`);
  }
  const inner = big.subarray(17, 17 + 200);
  t.same(sha256(new Uint8Array(inner.buffer, inner.byteOffset, inner.length)), createHash('sha256').update(inner).digest(), 'a view at an offset hashes its own bytes');
  t.equal(sha256(Buffer.from('x')).length, 32);
  t.throws(() => (sha256 as unknown as (x: unknown) => Buffer)('a string'), /sha256\(data: Uint8Array\)/, 'not bytes: a TypeError');
  t.throws(() => sha256(new Int32Array(4) as unknown as Uint8Array), /sha256\(data: Uint8Array\)/, 'another typed array: a TypeError, not its bytes read as if they were');
});
