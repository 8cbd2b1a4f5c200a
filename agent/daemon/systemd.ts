// The daemon's side of the service manager (systemd): sd_notify messages,
// the file descriptor store that keeps the proxy's listening sockets across
// a restart or a crash (sd_notify FDSTORE=1; handed back as LISTEN_FDS with
// LISTEN_FDNAMES), and telling a stop from a restart for the unit's
// ExecStopPost. Parsing is pure; the notify transport is net/native.ts.
import * as fs from 'node:fs';
import type { Logger } from '../log';
import type { ListenerStore } from '../forward/dataplane';
import { errorMessage } from '../errors';

export type Notify = (msg: string, fds?: readonly number[]) => void;

/** sd_notify through the native unix datagram send; undefined outside systemd. */
export function makeNotifier(log: Logger, env: NodeJS.ProcessEnv = process.env): Notify | undefined {
  const target = env.NOTIFY_SOCKET;
  if (!target) return undefined;
   
  const { sendUnixDatagram } = require('../native/native') as typeof import('../native/native');
  return (msg: string, fds?: readonly number[]) => {
    try {
      sendUnixDatagram(target, Buffer.from(msg), fds);
    } catch (e) {
      log.warn({ op: 'sd_notify', err: errorMessage(e) }, 'sd_notify failed');
    }
  };
}

/** sd_listen_fds(3): descriptors start at 3. */
export const LISTEN_FDS_START = 3;

/**
 * The descriptors the service manager passed (sd_listen_fds_with_names(3)),
 * by name; empty unless LISTEN_PID is this process. Pure.
 */
export function parseListenFds(env: NodeJS.ProcessEnv, pid: number): Map<string, number[]> {
  const out = new Map<string, number[]>();
  if (Number(env.LISTEN_PID) !== pid) return out;
  const n = Number(env.LISTEN_FDS);
  if (!Number.isInteger(n) || n <= 0 || n > 4096) return out;
  const names = (env.LISTEN_FDNAMES ?? '').split(':');
  for (let i = 0; i < n; i++) {
    const name = names[i] || 'unknown';
    out.set(name, [...(out.get(name) ?? []), LISTEN_FDS_START + i]);
  }
  return out;
}

/** FDNAME= may not hold ':' or control characters (sd_pid_notify_with_fds(3)); listener ids never do, this keeps it so. */
export function fdName(id: string): string {
  return [...`lb-${id}`].map((c) => { const n = c.charCodeAt(0); return c === ':' || n < 0x20 || n === 0x7f ? '_' : c; }).join('').slice(0, 255);
}

/**
 * ListenerStore on systemd's file descriptor store (the unit sets
 * FileDescriptorStoreMax=). The store keeps a listening socket open while no
 * process runs, across `systemctl restart` and a crash that Restart=
 * recovers; `systemctl stop` empties it.
 */
export class SystemdFdStore implements ListenerStore {
  private readonly inherited: Map<string, number[]>;
  private readonly kept = new Set<string>();

  constructor(private readonly notify: Notify, inherited: Map<string, number[]>, private readonly log: Logger) {
    this.inherited = new Map(inherited);
  }

  /** Descriptors the service manager passed that nobody has taken yet. */
  get pending(): number { let n = 0; for (const fds of this.inherited.values()) n += fds.length; return n; }

  take(id: string): number | undefined {
    const name = fdName(id);
    const fds = this.inherited.get(name);
    const fd = fds?.shift();
    if (fds && fds.length === 0) this.inherited.delete(name);
    if (fd !== undefined) this.kept.add(name); // already in the store
    return fd;
  }

  keep(id: string, fd: number): void {
    const name = fdName(id);
    // systemd ignores a descriptor already in the store (same socket), so keeping an inherited one again is harmless.
    this.notify(`FDSTORE=1\nFDNAME=${name}`, [fd]);
    this.kept.add(name);
  }

  drop(id: string): void {
    const name = fdName(id);
    if (!this.kept.delete(name)) return;
    this.notify(`FDSTOREREMOVE=1\nFDNAME=${name}`);
  }

  /** Close (and remove from the store) what an earlier process kept that this one does not want. */
  release(): void {
    for (const [name, fds] of this.inherited) {
      for (const fd of fds) { try { fs.closeSync(fd); } catch { /* already closed */ } }
      this.notify(`FDSTOREREMOVE=1\nFDNAME=${name}`);
      this.log.info({ op: 'fdstore', name }, 'released a listening socket no service wants any more');
    }
    this.inherited.clear();
  }
}

/** The unit this process runs in, from /proc/self/cgroup (".../lb-agent.service"); undefined outside a service. */
export function ownUnit(cgroup: string): string | undefined {
  for (const line of cgroup.split('\n')) {
    const m = /\/([^/]+\.service)(?:\/|$)/.exec(line.split(':')[2] ?? '');
    if (m) return m[1];
  }
  return undefined;
}

/**
 * From `systemctl list-jobs --no-legend --plain` output: is a stop of `unit`
 * under way (as opposed to a restart, or no job at all - a crash that
 * Restart= recovers)? Pure.
 */
export function stopJobPending(listJobs: string, unit: string): boolean {
  for (const line of listJobs.split('\n')) {
    const f = line.trim().split(/\s+/);
    // JOB UNIT TYPE STATE
    if (f.length >= 3 && f[1] === unit) return f[2] === 'stop';
  }
  return false;
}
