// A process of the eBPF NAT area (bench/nat.ts), run with node inside a lab
// namespace: TCP connections and UDP flows held open in numbers, and the
// echo servers they go to. Plain node:net and node:dgram, no framing beyond
// one byte per check.
//
//   node hold-flows.js serve --port 9000
//       echoes every byte back on TCP and every datagram on UDP, both on
//       the port, and keeps every connection; prints {"event":"listening"},
//       and {"event":"count","connections":N,"udpPeers":M} for a `count`
//       line on stdin (M: the UDP sources it has heard from).
//   node hold-flows.js connect --to 10.99.0.50:9000 --from A,B,C --ports 1024-19999 --count N [--udp-count M] [--parallel 512]
//       opens N connections, the i-th from address i mod A and port
//       lo + floor(i / A) (bound explicitly: no two share a tuple, none
//       depends on the ephemeral range), at most `parallel` connecting at
//       once, then M UDP flows the same way (a socket each, bound alike,
//       open once its first datagram is echoed); prints
//       {"event":"opened",...}. Then, for each `check` line on stdin, writes
//       one byte on every open connection and flow and prints
//       {"event":"checked","alive":N,"udpAlive":K,...} once every echo is
//       back or 30 s have passed. `close` resets them all (no TIME_WAIT)
//       and exits.
// Lines on stdout are JSON, one per event; nothing else is printed there.
import * as dgram from 'node:dgram';
import * as net from 'node:net';
import * as readline from 'node:readline';

function arg(name: string, argv: readonly string[]): string {
  const i = argv.indexOf(`--${name}`);
  const v = i >= 0 ? argv[i + 1] : undefined;
  if (v === undefined) throw new Error(`hold-flows: --${name} is required`);
  return v;
}

function emit(o: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(o)}\n`);
}

function serve(argv: readonly string[]): void {
  const port = Number(arg('port', argv));
  let connections = 0;
  const server = net.createServer((s) => {
    connections++;
    s.on('data', (d) => s.write(d));
    s.on('error', () => undefined);
    s.on('close', () => { connections--; });
  });
  const peers = new Set<string>();
  const udp = dgram.createSocket('udp4');
  udp.on('message', (m, r) => { peers.add(`${r.address}:${r.port}`); udp.send(m, r.port, r.address); });
  udp.on('error', () => undefined);
  udp.bind(port, '0.0.0.0', () => server.listen({ port, host: '0.0.0.0', backlog: 8192 }, () => emit({ event: 'listening', port })));
  readline.createInterface({ input: process.stdin }).on('line', (l) => {
    if (l.trim() === 'count') emit({ event: 'count', connections, udpPeers: peers.size });
  });
}

function connect(argv: readonly string[]): void {
  const [host, portText] = arg('to', argv).split(':');
  const port = Number(portText);
  const from = arg('from', argv).split(',').filter(Boolean);
  const [lo, hi] = arg('ports', argv).split('-').map(Number) as [number, number];
  const count = Number(arg('count', argv));
  const parallel = argv.includes('--parallel') ? Number(arg('parallel', argv)) : 512;
  const udpCount = argv.includes('--udp-count') ? Number(arg('udp-count', argv)) : 0;
  if (!host || !Number.isInteger(port) || from.length === 0 || !(lo > 0 && hi >= lo && hi < 65536) || !(count > 0)) throw new Error(`hold-flows connect: bad arguments ${argv.join(' ')}`);
  if (!(udpCount >= 0) || Math.ceil(udpCount / from.length) > hi - lo + 1) throw new Error(`hold-flows connect: bad --udp-count ${udpCount}`);
  if (Math.ceil(count / from.length) > hi - lo + 1) throw new Error(`hold-flows connect: ${count} connections need ${Math.ceil(count / from.length)} ports an address; ${lo}-${hi} has ${hi - lo + 1}`);
  const open: net.Socket[] = [];
  const errors = new Map<string, number>();
  let failed = 0;
  let next = 0;
  let pending = 0;
  let echoed = 0;
  const t0 = Date.now();
  // UDP flows, after the connections: open once a datagram came back.
  const flows: dgram.Socket[] = [];
  const udpErrors = new Map<string, number>();
  let udpFailed = 0;
  // The flows answered since the last check began.
  let answered = new Set<dgram.Socket>();
  const openUdp = (then: () => void): void => {
    let nextU = 0;
    let pendingU = 0;
    const more = (): void => {
      if (nextU >= udpCount && pendingU === 0) { then(); return; }
      while (pendingU < parallel && nextU < udpCount) {
        const i = nextU++;
        pendingU++;
        const s = dgram.createSocket('udp4');
        let settled = false;
        const done = (ok: boolean, why?: string): void => {
          if (settled) return;
          settled = true;
          clearInterval(timer);
          pendingU--;
          if (ok) flows.push(s);
          else {
            udpFailed++;
            udpErrors.set(why ?? 'error', (udpErrors.get(why ?? 'error') ?? 0) + 1);
            s.close();
          }
          more();
        };
        // A datagram lost on the way (a socket buffer full in the burst) is
        // sent again each second, as a UDP client would, for 10 s at most.
        let sends = 0;
        const send = (): void => { if (sends++ >= 10) done(false, 'ETIMEDOUT'); else s.send('x', port, host); };
        const timer = setInterval(send, 1000);
        s.on('message', () => { if (settled) answered.add(s); else done(true); });
        s.on('error', (e: NodeJS.ErrnoException) => done(false, e.code));
        s.bind(lo + Math.floor(i / from.length), from[i % from.length], send);
      }
    };
    more();
  };
  const opened = (): void => openUdp(() => emit({
    event: 'opened', opened: open.length, failed, ms: Date.now() - t0, errors: Object.fromEntries(errors),
    udpOpened: flows.length, udpFailed, udpErrors: Object.fromEntries(udpErrors),
  }));
  const launch = (): void => {
    while (pending < parallel && next < count) {
      const i = next++;
      pending++;
      const s = net.connect({ host, port, localAddress: from[i % from.length]!, localPort: lo + Math.floor(i / from.length) });
      let settled = false;
      const done = (ok: boolean, why?: string): void => {
        if (settled) return;
        settled = true;
        pending--;
        if (ok) open.push(s);
        else {
          failed++;
          errors.set(why ?? 'error', (errors.get(why ?? 'error') ?? 0) + 1);
          s.destroy();
        }
        if (next < count) launch();
        else if (pending === 0) opened();
      };
      s.setTimeout(10_000, () => done(false, 'ETIMEDOUT'));
      s.once('connect', () => { s.setTimeout(0); done(true); });
      s.on('error', (e: NodeJS.ErrnoException) => done(false, e.code));
      s.on('data', (d) => { echoed += d.length; });
    }
  };
  launch();
  readline.createInterface({ input: process.stdin }).on('line', (l) => {
    const cmd = l.trim();
    if (cmd === 'check') {
      const live = open.filter((s) => !s.destroyed);
      const start = echoed;
      const c0 = Date.now();
      for (const s of live) s.write('x');
      // UDP is lossy on the way (socket buffers, the backlog): a datagram a
      // tick in batches, and one again every second to each flow not yet
      // answered. An answer proves the path, not that the flow's entry was
      // held: the nat area counts the engine's new flows over the check.
      answered = new Set<dgram.Socket>();
      let udpSent = 0;
      let batch = 0;
      let resent = 0;
      const sendSome = (): void => {
        for (const s of flows.slice(batch, batch + 256)) { s.send('x', port, host); udpSent++; }
        batch += 256;
      };
      let lastRetry = Date.now();
      const timer = setInterval(() => {
        if (batch < flows.length) sendSome();
        else if (Date.now() - lastRetry >= 1000) {
          lastRetry = Date.now();
          for (const s of flows) if (!answered.has(s)) { s.send('x', port, host); resent++; }
        }
        const alive = echoed - start;
        if ((alive >= live.length && answered.size >= flows.length) || Date.now() - c0 > 30_000) {
          clearInterval(timer);
          emit({ event: 'checked', sent: live.length, alive, udpSent, udpAlive: answered.size, udpResent: resent, ms: Date.now() - c0 });
        }
      }, 10);
    } else if (cmd === 'close') {
      for (const s of open) s.resetAndDestroy();
      for (const s of flows) s.close();
      setTimeout(() => process.exit(0), 200);
    }
  });
}

const [mode, ...rest] = process.argv.slice(2);
if (mode === 'serve') serve(rest);
else if (mode === 'connect') connect(rest);
else {
  process.stderr.write('usage: hold-flows.js serve --port P | connect --to HOST:PORT --from A,B --ports LO-HI --count N [--udp-count M] [--parallel K]\n');
  process.exitCode = 2;
}
