// forward/ layer: how many connections the userspace proxy may hold, from
// the process's descriptor limit (RLIMIT_NOFILE, read from /proc/self/limits:
// Node has no getrlimit). One home for the rule: the proxy (via wiring) and
// `lb-agent check` both use it. Each proxied connection takes two
// descriptors (client, backend); the rest of the agent (netlink, packet
// sockets, health probes, metrics, control, files) keeps a reserve.
import * as fs from 'node:fs';

/** Errors that say this process (or host) ran out of descriptors or buffers: never a backend's fault. */
export const LOCAL_EXHAUSTION_CODES = ['EMFILE', 'ENFILE', 'ENOBUFS'] as const;
export type LocalExhaustionCode = (typeof LOCAL_EXHAUSTION_CODES)[number];

export function localExhaustionCode(err: unknown): LocalExhaustionCode | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  return (LOCAL_EXHAUSTION_CODES as readonly unknown[]).includes(code) ? code as LocalExhaustionCode : undefined;
}

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

/** Descriptors kept for everything but proxied connections: a quarter of the limit, 64 to 1024. */
export function reservedDescriptors(nofile: number): number {
  return Math.min(1024, Math.max(64, Math.floor(nofile / 4)));
}

/** The default proxy.maxConnections: what the descriptors left after the reserve allow, two per connection. */
export function defaultMaxConnections(nofile: number | undefined): number {
  if (nofile === undefined) return 1 << 20;
  return Math.max(1, Math.floor((nofile - reservedDescriptors(nofile)) / 2));
}

/** proxy.maxConnections as configured, else the default for this limit. */
export function effectiveMaxConnections(configured: number | undefined, nofile: number | undefined): number {
  return configured ?? defaultMaxConnections(nofile);
}
