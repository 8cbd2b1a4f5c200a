// lab/bin/backend.ts: a real TCP backend for the demo, tests and benches, an
// HTTP/1.1 server that answers every request with its own id, so a client can
// tell which backend served it (lab/services.ts startBackend starts it);
// /slow/<ms> answers after that long, /bulk/<n> with n bytes.
// Run it inside a namespace: node dist/lab/bin/backend.js --id b1 --port 8080 [--port 8081]
import * as http from 'node:http';

function main(): void {
  const args = process.argv.slice(2);
  let id = 'backend';
  const ports: number[] = [];
  let host = '0.0.0.0';
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === '--id') id = args[++i]!;
    else if (a === '--port') ports.push(Number(args[++i]));
    else if (a === '--host') host = args[++i]!;
  }
  if (ports.length === 0) ports.push(8080);
  const body = Buffer.from(`${id}\n`);
  let listening = 0;
  for (const port of ports) {
    const server = http.createServer((req, res) => {
      if (req.url?.startsWith('/slow/')) {
        // An answer that takes this long (ms, at most 30 s): one in flight while the test moves the VIP.
        const ms = Math.min(Number(req.url.slice(6)) || 0, 30_000);
        setTimeout(() => {
          res.writeHead(200, { 'content-type': 'text/plain', 'content-length': body.length, 'x-backend': id });
          res.end(body);
        }, ms);
        return;
      }
      if (req.url?.startsWith('/bulk/')) {
        const n = Math.min(Number(req.url.slice(6)) || 0, 1 << 30);
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': n, 'x-backend': id });
        const chunk = Buffer.alloc(64 * 1024, 0x61);
        let left = n;
        const pump = (): void => {
          while (left > 0) {
            const c = left >= chunk.length ? chunk : chunk.subarray(0, left);
            left -= c.length;
            if (!res.write(c)) { res.once('drain', pump); return; }
          }
          res.end();
        };
        pump();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': body.length, 'x-backend': id });
      res.end(body);
    });
    server.keepAliveTimeout = 60_000;
    server.listen(port, host, () => {
      listening++;
      if (listening === ports.length) process.stdout.write(`listening ${id} ${ports.join(',')}\n`);
    });
  }
  process.on('SIGTERM', () => process.exit(0));
}

main();
