// Listener hand-over between two agent processes outside systemd, as
// HAProxy's seamless reload does it (`-x` takes the listening sockets from
// the running process, `-sf` tells it to finish). `lb-agent run --replace`
// asks the running daemon, over its control socket, to send every listening
// socket its proxy keeps to a unix datagram socket of ours (SCM_RIGHTS). The
// old process then stops as a planned restart does (VIPs, macvlans and the
// nftables table stay) but keeps accepting on those sockets until this one
// serves from them and tells it to go (SIGTERM): no new connection is
// refused, none waits for a process to start. Under systemd the fd store
// (daemon/systemd.ts) does the same job across `systemctl restart`.
//
// The wire format is ours and local: datagrams of JSON {ids, pid, end} whose
// SCM_RIGHTS carry one descriptor per id, in order, at most 253 per datagram
// (SCM_MAX_FD). Descriptor transport is net/native.ts.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ListenerStore } from '../forward/dataplane';
import type { Logger } from '../log';
import { LbError, errorMessage, isLbError } from '../errors';
import { controlRequest } from '../control/server';
import { bindUnixDatagram, recvUnixDatagram, sendUnixDatagram } from '../native/native';

/** SCM_MAX_FD (include/net/scm.h). */
const MAX_FDS_PER_DATAGRAM = 253;

/** One hand-over datagram: the listener ids of the descriptors it carries, in order. */
export interface HandoverMessage {
  readonly ids: readonly string[];
  /** The sender's pid (the process to tell to finish). */
  readonly pid: number;
  /** The last datagram of the hand-over. */
  readonly end: boolean;
}

/** The datagrams that hand `listeners` over. Pure. */
export function handoverMessages(listeners: readonly (readonly [id: string, fd: number])[], pid: number): { msg: HandoverMessage; fds: number[] }[] {
  const out: { msg: HandoverMessage; fds: number[] }[] = [];
  for (let i = 0; i < listeners.length || out.length === 0; i += MAX_FDS_PER_DATAGRAM) {
    const chunk = listeners.slice(i, i + MAX_FDS_PER_DATAGRAM);
    out.push({ msg: { ids: chunk.map(([id]) => id), pid, end: i + MAX_FDS_PER_DATAGRAM >= listeners.length }, fds: chunk.map(([, fd]) => fd) });
  }
  return out;
}

/** A received datagram as a HandoverMessage, or why not. Pure. */
export function parseHandoverMessage(data: Buffer, fds: number): HandoverMessage | string {
  let v: unknown;
  try { v = JSON.parse(data.toString('utf8')); } catch { return 'not JSON'; }
  if (typeof v !== 'object' || v === null) return 'not an object';
  const m = v as Record<string, unknown>;
  if (!Array.isArray(m.ids) || !m.ids.every((x) => typeof x === 'string')) return 'ids is not a list of strings';
  if (!Number.isInteger(m.pid) || (m.pid as number) <= 0) return 'pid is not a process id';
  if (typeof m.end !== 'boolean') return 'end is not a boolean';
  if (m.ids.length !== fds) return `${m.ids.length} ids for ${fds} descriptors`;
  return { ids: m.ids, pid: m.pid as number, end: m.end };
}

/**
 * ListenerStore outside systemd: remembers the listening descriptors the
 * proxy keeps (to hand them over when a successor asks) and holds the ones a
 * predecessor handed to this process until the proxy takes them.
 */
export class HandoverStore implements ListenerStore {
  private readonly inherited = new Map<string, number[]>();
  private readonly kept = new Map<string, number[]>();

  /** A descriptor a predecessor handed over, for take(). */
  adopt(id: string, fd: number): void {
    this.inherited.set(id, [...(this.inherited.get(id) ?? []), fd]);
  }

  /** Descriptors handed over that nobody has taken yet. */
  get pending(): number { let n = 0; for (const fds of this.inherited.values()) n += fds.length; return n; }

  take(id: string): number | undefined {
    const fds = this.inherited.get(id);
    const fd = fds?.shift();
    if (fds && fds.length === 0) this.inherited.delete(id);
    return fd;
  }

  keep(id: string, fd: number): void {
    const fds = this.kept.get(id) ?? [];
    if (!fds.includes(fd)) fds.push(fd);
    this.kept.set(id, fds);
  }

  drop(id: string): void {
    this.kept.delete(id);
  }

  /** Close what a predecessor handed over that no service of this process wants. */
  release(): void {
    for (const fds of this.inherited.values()) for (const fd of fds) { try { fs.closeSync(fd); } catch { /* closed */ } }
    this.inherited.clear();
  }

  /** What a successor gets: every kept listening descriptor with its listener id. */
  listeners(): [string, number][] {
    const out: [string, number][] = [];
    for (const [id, fds] of this.kept) for (const fd of fds) out.push([id, fd]);
    return out;
  }
}

/** The running daemon's side: send every kept listener to `to` (a successor's datagram socket). Returns how many. */
export function sendListeners(to: string, store: HandoverStore, pid = process.pid): number {
  const listeners = store.listeners();
  for (const { msg, fds } of handoverMessages(listeners, pid)) sendUnixDatagram(to, Buffer.from(JSON.stringify(msg)), fds);
  return listeners.length;
}

/**
 * The successor's side (`lb-agent run --replace`): ask the daemon on
 * `controlSocket` for its listeners and put them in `store`. Resolves with
 * the old process's pid, or undefined when no daemon answers there (nothing
 * to replace: an ordinary start). Rejects when a daemon answered but the
 * hand-over failed; descriptors received by then are closed.
 */
export async function takeListeners(opts: { controlSocket: string; stateDir: string; store: HandoverStore; log: Logger; timeoutMs?: number }): Promise<number | undefined> {
  const { store, log } = opts;
  const sockPath = path.join(opts.stateDir, `handover-${process.pid}.sock`);
  fs.mkdirSync(opts.stateDir, { recursive: true, mode: 0o750 });
  try { fs.unlinkSync(sockPath); } catch { /* absent */ }
  const fd = bindUnixDatagram(sockPath);
  const received: [string, number][] = [];
  try {
    fs.chmodSync(sockPath, 0o600);
    let reply: unknown;
    try {
      reply = await controlRequest(opts.controlSocket, 'handover', opts.timeoutMs ?? 5000, { path: sockPath });
    } catch (e) {
      if (isLbError(e) && e.code === 'LB_ERR_CONTROL_UNREACHABLE') {
        log.info({ op: 'handover', socket: opts.controlSocket, err: errorMessage(e) }, 'no running agent to take over from; starting afresh');
        return undefined;
      }
      throw e;
    }
    // The daemon sends every datagram before it answers: all are queued now.
    let pid: number | undefined;
    let end = false;
    for (let m = recvUnixDatagram(fd); m !== null; m = recvUnixDatagram(fd)) {
      const parsed = parseHandoverMessage(m.data, m.fds.length);
      if (typeof parsed === 'string') {
        for (const d of m.fds) { try { fs.closeSync(d); } catch { /* closed */ } }
        throw new LbError('LB_ERR_DAEMON_START', `listener hand-over from the running agent is unreadable (${parsed}); it was asked to stop anyway, so start it again if this process does not come up`);
      }
      parsed.ids.forEach((id, i) => received.push([id, m.fds[i]!]));
      pid = parsed.pid;
      end = parsed.end;
    }
    const answered = (reply as { pid?: unknown } | undefined)?.pid;
    if (!end || pid === undefined || pid !== answered) {
      throw new LbError('LB_ERR_DAEMON_START', `listener hand-over from the running agent (pid ${String(answered)}) was incomplete`);
    }
    for (const [id, d] of received) store.adopt(id, d);
    log.info({ op: 'handover', from: pid, listeners: received.length }, `took ${received.length} listening socket(s) over from pid ${pid}`);
    return pid;
  } catch (e) {
    for (const [, d] of received) { try { fs.closeSync(d); } catch { /* closed */ } }
    throw e;
  } finally {
    try { fs.closeSync(fd); } catch { /* closed */ }
    try { fs.unlinkSync(sockPath); } catch { /* gone */ }
  }
}
