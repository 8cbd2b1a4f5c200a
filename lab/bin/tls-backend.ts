// lab/bin/tls-backend.ts: an HTTPS backend for HTTPS health-check tests
// (lab/tls.ts makes its certificates). Every request is answered with
// --status (default 200), and one JSON line per request goes to stdout with
// the server name the client sent (false: none) and its Host header, so a
// test sees what a probe sent. --stall instead accepts TCP connections and
// never answers a byte: a backend whose handshake never finishes.
// Run it inside a namespace:
//   node dist/lab/bin/tls-backend.js --cert c.pem --key k.pem --port 8443 [--status 503] [--host 0.0.0.0]
//   node dist/lab/bin/tls-backend.js --stall --port 8443
import * as fs from 'node:fs';
import * as https from 'node:https';
import * as net from 'node:net';
import type { TLSSocket } from 'node:tls';

function main(): void {
  const args = process.argv.slice(2);
  let cert = '';
  let key = '';
  let host = '0.0.0.0';
  let status = 200;
  let stall = false;
  const ports: number[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '--cert') cert = args[++i]!;
    else if (a === '--key') key = args[++i]!;
    else if (a === '--host') host = args[++i]!;
    else if (a === '--status') status = Number(args[++i]);
    else if (a === '--port') ports.push(Number(args[++i]));
    else if (a === '--stall') stall = true;
    else throw new Error(`unknown argument ${a}`);
  }
  if (ports.length === 0) ports.push(8443);
  let listening = 0;
  const ready = (): void => {
    if (++listening === ports.length) process.stdout.write(`${JSON.stringify({ listening: ports })}\n`);
  };
  for (const port of ports) {
    if (stall) {
      // Accept, read, never write: the client's ClientHello is never answered.
      const held: net.Socket[] = [];
      net.createServer((s) => { held.push(s); s.on('error', () => undefined); s.resume(); }).listen(port, host, ready);
      continue;
    }
    const server = https.createServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, (req, res) => {
      const sock = req.socket as TLSSocket;
      const servername = sock.servername ?? false;
      process.stdout.write(`${JSON.stringify({ servername, host: req.headers.host, url: req.url, reused: sock.isSessionReused() })}\n`);
      res.writeHead(status, { 'content-type': 'text/plain', connection: 'close' });
      res.end(`${status}\n`);
    });
    server.on('tlsClientError', () => undefined);
    server.listen(port, host, ready);
  }
}

main();
