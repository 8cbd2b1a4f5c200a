// forward/ layer: the entry of one proxy worker thread. It runs a
// ProxyEngine on this thread's event loop and speaks to the main thread
// (proxy.ts) by message: apply / reconfigure / stop in; applied, stopped,
// passive-health results (batched), log records out. Counters go straight
// into the shared tallies, never through a message. The message shapes
// live here, beside the one thread that answers them.
import { parentPort, workerData } from 'node:worker_threads';
import type { ProxyConfig } from '../config/types';
import { realClock } from '../clock';
import { LbError, errorMessage } from '../errors';
import { ProxyEngine, type EngineApply, type EngineLog, type RelayPath } from './proxy-engine';
import { nativeRelayPath } from './relay-native';
import type { TallyBuffers } from './tallies';

/** What the main thread hands a worker at start. */
export interface WorkerStart {
  readonly index: number;
  readonly buffers: TallyBuffers;
  readonly config: ProxyConfig;
  readonly maxConnections: number;
  readonly backlog: number;
  readonly udpIdleMs: number;
  readonly maxUdpSessions: number;
  /** pino's numeric level: records below it are not sent. */
  readonly logLevel: number;
}

export type ToWorker =
  | { readonly t: 'apply'; readonly seq: number; readonly apply: EngineApply }
  | { readonly t: 'reconfigure'; readonly config: ProxyConfig }
  | { readonly t: 'stop'; readonly seq: number; readonly keep: boolean; readonly drainMs: number };

export type FromWorker =
  | { readonly t: 'ready' }
  | { readonly t: 'applied'; readonly seq: number; readonly failures: string[]; readonly generation: number; readonly udpPorts: Record<string, number> }
  | { readonly t: 'stopped'; readonly seq: number; readonly open: number; readonly unfinished: number }
  /** Passive health the ring had no room for, in order: service, backend, ok, ... (after what the ring holds). */
  | { readonly t: 'connects'; readonly list: (string | boolean)[] }
  /** A failure is in the ring: drain it now (it may take a backend out). */
  | { readonly t: 'drain' }
  | { readonly t: 'log'; readonly level: 'debug' | 'info' | 'warn' | 'error'; readonly obj: object; readonly msg: string };


/** pino's numeric levels. */
export const LEVELS = { debug: 20, info: 30, warn: 40, error: 50 } as const;

/**
 * This thread's relay path: the addon's. An addon without it is a broken
 * install (the addon ships with the agent), refused with how to fix it.
 */
export function relayPath(): RelayPath {
  const path = nativeRelayPath();
  if (typeof path === 'string') throw new LbError('LB_ERR_NET_NATIVE_MISSING', `the proxy cannot relay: ${path}`, {});
  return path;
}

function main(): void {
  const port = parentPort;
  if (!port) throw new Error('proxy-worker.js runs as a worker thread of the proxy');
  const start = workerData as WorkerStart;
  const post = (m: FromWorker): void => port.postMessage(m);
  const logAt = (level: keyof typeof LEVELS) => (obj: object, msg: string): void => {
    if (LEVELS[level] >= start.logLevel) post({ t: 'log', level, obj, msg });
  };
  const log: EngineLog = { debug: logAt('debug'), info: logAt('info'), warn: logAt('warn'), error: logAt('error') };
  const engine = new ProxyEngine({
    index: start.index, buffers: start.buffers, config: start.config, log, clock: realClock, relay: relayPath(),
    maxConnections: start.maxConnections, backlog: start.backlog, udpIdleMs: start.udpIdleMs, maxUdpSessions: start.maxUdpSessions,
    // Passive health through the shared ring (tallies.ts), no message per
    // connect; a failure wakes the main thread at once (it may take a backend
    // out) before the client learns of it (a reset follows).
    onConnectResult: (service, backend, slot, ok) => {
      if (!engine.tallies.report(slot, ok)) { post({ t: 'connects', list: [service, backend, ok] }); return; }
      if (!ok) post({ t: 'drain' });
    },
  });
  port.on('message', (m: ToWorker) => {
    switch (m.t) {
      case 'apply':
        engine.apply(m.apply).then(
          (failures) => {
            const udpPorts: Record<string, number> = {};
            for (const l of m.apply.listeners) {
              const p = l.udp ? engine.udpPort(l.id) : undefined;
              if (p !== undefined) udpPorts[l.id] = p;
            }
            post({ t: 'applied', seq: m.seq, failures, generation: m.apply.slots?.generation ?? -1, udpPorts });
          },
          (err: unknown) => post({ t: 'applied', seq: m.seq, failures: [errorMessage(err)], generation: -1, udpPorts: {} }),
        );
        break;
      case 'reconfigure':
        engine.reconfigure(m.config);
        break;
      case 'stop':
        engine.stop({ keep: m.keep, drainMs: m.drainMs }).then(
          (r) => post({ t: 'stopped', seq: m.seq, open: r.open, unfinished: r.unfinished }),
          (err: unknown) => {
            log.error({ op: 'stop', err: errorMessage(err) }, `proxy worker stop failed: ${errorMessage(err)}`);
            post({ t: 'stopped', seq: m.seq, open: 0, unfinished: 0 });
          },
        );
        break;
    }
  });
  post({ t: 'ready' });
}

if (workerData && (workerData as Partial<WorkerStart>).buffers) main();
