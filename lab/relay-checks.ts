// Checks the proxy's TCP relay must pass (test/forward/relay-native.test.ts):
// half-close both ways, and how the PROXY protocol header goes out.
import * as net from 'node:net';
import { ProxyDataplane } from '../agent/forward/proxy';
import { parseIPv4 } from '../agent/address';

const cfg = { algorithm: 'round-robin' as const, idleTimeout: 60, connectTimeout: 2 };
const backend = (address: string) => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

function oneBackend(key: string, vip: string, targetPort: number, proxyProtocol: 'v1' | 'v2' | undefined) {
  return { key, vip, proxyProtocol, ports: [{ name: 'p', port: 0, protocol: 'TCP' as const, targetPort }], healthy: [backend('127.0.0.1')], backends: [backend('127.0.0.1')] };
}

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
    s.on('data', (x) => { d += x.toString(); if (send === undefined && d.endsWith('\r\n')) s.end(); });
    s.on('end', () => { s.destroy(); resolve(d); });
    s.on('error', reject);
    s.setTimeout(3000, () => { s.destroy(); reject(new Error(`timeout, got ${JSON.stringify(d)}`)); });
  });
}

/**
 * The PROXY header goes in one write with the client's first bytes; a client
 * silent one loop turn after the backend connected (server speaks first)
 * gets its header sent alone, and the backend's greeting through.
 */
export function proxyHeaderTest(t: tap.Test, version: 'v1' | 'v2'): void {
  t.test(`PROXY ${version}: the header goes in one write with the client's first bytes; a silent client still gets a server-first greeting`, async (t) => {
    const hdrLen = version === 'v2'
      ? (b: Buffer): number => (b.length >= 28 ? 28 : 0)
      : (b: Buffer): number => { const i = b.indexOf('\r\n'); return i < 0 ? 0 : i + 2; };
    const echo = await headerBackend(t, 'echo', hdrLen);
    const greet = await headerBackend(t, 'greet', hdrLen);
    // Inline: the engine shares the test's event loop, so each client's request is surely in the kernel
    // before its backend connect completes (a worker thread could outrun the client and send the header alone).
    const p = new ProxyDataplane({ config: cfg, inline: true });
    t.teardown(() => p.stop());
    await p.apply({ services: [oneBackend('default/echo', '127.0.0.42', echo.port, version), oneBackend('default/greet', '127.0.0.43', greet.port, version)] });
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
  });
}

/**
 * Half-close both ways through one proxy: the backend answers only once the
 * client's FIN came through (our shutdown of the backend side), then ends
 * (our shutdown of the client side); the client reads the answer and the end
 * while its own side is shut. Resolves with what the client read.
 */
export async function halfCloseBothWays(t: tap.Test, p: ProxyDataplane, vip: string): Promise<string> {
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    let got = '';
    s.on('data', (d) => { got += d.toString(); });
    s.on('end', () => s.end(`got ${got} and your FIN`));
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  await p.apply({ services: [oneBackend('default/web', vip, (server.address() as net.AddressInfo).port, undefined)] });
  const port = ((await p.stats()).details['listeners'] as { boundPort: number }[])[0]!.boundPort;
  return new Promise<string>((resolve, reject) => {
    const s = net.connect({ port, host: vip, allowHalfOpen: true });
    let d = '';
    s.on('data', (x) => { d += x.toString(); });
    s.on('end', () => { s.destroy(); resolve(d); });
    s.on('error', reject);
    s.setTimeout(3000, () => { s.destroy(); reject(new Error(`timeout, got ${JSON.stringify(d)}`)); });
    s.end('ping');
  });
}
