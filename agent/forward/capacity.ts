// forward/ layer: how many connections the userspace proxy may hold, from
// the process's descriptor limit (RLIMIT_NOFILE, read from /proc/self/limits:
// Node has no getrlimit). One home for the rule: the proxy (via wiring) and
// `lb-agent check` both use it. Each proxied connection takes two
// descriptors (client, backend); the rest of the agent (netlink, packet
// sockets, health probes, metrics, control, files) keeps a reserve.
import * as fs from 'node:fs';

export { localExhaustionCode, LOCAL_EXHAUSTION_CODES, type LocalExhaustionCode } from '../errors';

/** Soft "Max open files" from a /proc/<pid>/limits text; undefined when absent or unlimited. */
export function parseNofile(limitsText: string): number | undefined {
  const m = /^Max open files\s+(\S+)/m.exec(limitsText);
  if (!m || m[1] === 'unlimited') return undefined;
  const n = Number(m[1]);
  return Number.isInteger(n) && n > 0 ? n : undefined;
}

/** This process's descriptor limit (Node raises the soft limit to the hard one at start-up). */
export function readNofile(file = '/proc/self/limits'): number | undefined {
  try { return parseNofile(fs.readFileSync(file, 'utf8')); } catch { return undefined; }
}

/**
 * Descriptors kept for everything but proxied connections: a quarter of the
 * limit, 128 to 1024. The agent itself holds ~30 when idle (measured: 28 with
 * one proxied service); the rest is for health probes and for refused clients
 * while their clean close completes (at most REFUSALS_DRAINING_MAX, proxy.ts).
 */
export function reservedDescriptors(nofile: number): number {
  return Math.min(1024, Math.max(128, Math.floor(nofile / 4)));
}

/** Refused clients whose clean close may be in progress at once; past it, they are closed without waiting for their FIN. */
export const REFUSALS_DRAINING_MAX = 32;

/** The default proxy.maxConnections: what the descriptors left after the reserve allow, two per connection. */
export function defaultMaxConnections(nofile: number | undefined): number {
  if (nofile === undefined) return 1 << 20;
  return Math.max(1, Math.floor((nofile - reservedDescriptors(nofile)) / 2));
}

/** proxy.maxConnections as configured, else the default for this limit. */
export function effectiveMaxConnections(configured: number | undefined, nofile: number | undefined): number {
  return configured ?? defaultMaxConnections(nofile);
}
