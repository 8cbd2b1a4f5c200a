// Test helper: listeners on loopback (port 0) for the probe tests, and a port
// nothing listens on. Not a test file itself.
import * as net from 'node:net';
import type { AddressInfo } from 'node:net';

/** Listen on 127.0.0.1, port 0; the port. */
export async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return (server.address() as AddressInfo).port;
}

/** A port nothing listens on (bound, then closed). */
export async function closedPort(): Promise<number> {
  const s = net.createServer();
  const port = await listen(s);
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}
