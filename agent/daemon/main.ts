// `lb-agent run`: the process around the Daemon - logger, signals (SIGTERM
// and SIGINT stop within 10 s - withdrawing, or with --on-stop keep leaving
// the data path serving for the next process - SIGHUP and the control socket
// reload), the systemd fd store for the proxy's listeners, the notify protocol
// (READY=1, STATUS=, STOPPING=1, WATCHDOG=1 from the event loop itself, so a
// blocked loop stops the pings), and a last-chance withdraw on a crash.
import { createLogger, LogLevel } from '../log';
import { Daemon } from './daemon';
import type { Subsystems, SubsystemContext } from './subsystems';
import type { Desired } from '../config/types';
import { errorMessage, isLbError } from '../errors';
import { makeNotifier, parseListenFds, SystemdFdStore } from './systemd';
import { HandoverStore, sendListeners, takeListeners } from './handover';
import { mallocTrim, lowMemoryNotification, collectUnderPressure } from '../native/native';
import { holdOptimizer } from './tiering';
import { codeCacheHandle } from '../cli/code-cache';

const STOP_TIMEOUT_MS = 10_000;

/**
 * wiring.ts and the modules behind it (rtnetlink, address sources, health,
 * the data path) load once the control socket is up, not before.
 */
function buildSubsystems(config: Desired, ctx: SubsystemContext): Promise<Subsystems> {
   
  return (require('./wiring') as typeof import('./wiring')).buildSubsystems(config, ctx);
}
/**
 * After a reload: what the parse worker and the reload freed stays in glibc's
 * per-thread malloc arenas (fragmented, so free() cannot return it), ~0.3 MiB
 * a reload of 100 services; malloc_trim(3) gives it back.
 */
const trimMemory = (): void => { mallocTrim(); };
/** How long a process that handed its listeners over keeps accepting if its successor never says it serves. */
const HANDOVER_LINGER_MS = 8_000;
/** How long a stopped process may take to end by itself before it exits anyway (and logs what held it). */
const EXIT_GRACE_MS = 2_000;

/** What SIGTERM does: withdraw everything (the default), or leave it serving for the next process (the unit: a restart keeps, ExecStopPost withdraws on a real stop). */
export type OnStop = 'withdraw' | 'keep';

export async function runDaemon(opts: { configPath: string; logLevel: LogLevel; onStop?: OnStop; replace?: boolean }): Promise<number> {
  const log = createLogger(opts.logLevel);
  const notify = makeNotifier(log);
  // Listening sockets the service manager kept for us (a restart or a crash
  // that Restart= recovered), and the store for ours; only under systemd.
  const inherited = parseListenFds(process.env, process.pid);
  for (const k of ['LISTEN_PID', 'LISTEN_FDS', 'LISTEN_FDNAMES']) delete process.env[k];
  // Outside systemd the proxy's listeners are remembered for a successor's
  // `lb-agent run --replace` (daemon/handover.ts), as HAProxy's -x.
  const handover = notify ? undefined : new HandoverStore();
  const listenerStore = notify ? new SystemdFdStore(notify, inherited, log.child({ module: 'systemd' })) : handover!;
  if (inherited.size > 0) log.info({ op: 'fdstore', names: [...inherited.keys()] }, `the service manager handed back ${[...inherited.values()].flat().length} listening socket(s)`);
  const keepOnStop = opts.onStop === 'keep';
  // SIGHUP and the control socket's "reload" (`lb-agent reload`, the unit's
  // ExecReload=) run the same reload inside RELOADING=1 and READY=1
  // (sd_notify(3)): systemd shows the unit "reloading" meanwhile. The daemon
  // runs one reload at a time and folds requests that arrive meanwhile into
  // one more; every RELOADING=1 gets its READY=1 (reload() never throws).
  const reload = async (): ReturnType<Daemon['reload']> => {
    notify?.('RELOADING=1');
    const r = await daemon.reload();
    notify?.('READY=1');
    if (!r.ok) notify?.(`STATUS=reload rejected: ${r.message.split('\n')[1] ?? ''}`);
    return r;
  };
  // A successor asked for the listeners: they are sent, then this process
  // stops as a planned restart does but keeps accepting (linger) until the
  // successor serves and sends SIGTERM, or HANDOVER_LINGER_MS pass.
  let endLinger: (() => void) | undefined;
  let shutdown: ((why: string, exitCode: number, linger?: Promise<unknown>) => void) | undefined;
  const onHandover = handover && ((to: string): { pid: number; listeners: number } => {
    const listeners = sendListeners(to, handover);
    log.info({ op: 'handover', to, listeners }, `handed ${listeners} listening socket(s) over to a successor`);
    const linger = new Promise<void>((resolve) => {
      const timer = setTimeout(() => { log.warn({ op: 'handover' }, `the successor did not say it serves within ${HANDOVER_LINGER_MS} ms; stopping anyway`); resolve(); }, HANDOVER_LINGER_MS);
      endLinger = () => { clearTimeout(timer); resolve(); };
    });
    setImmediate(() => shutdown?.('handover', 0, linger));
    return { pid: process.pid, listeners };
  });
  const daemon = new Daemon({
    configPath: opts.configPath, log, buildSubsystems, notify, reload, listenerStore, trimMemory, collectAll: lowMemoryNotification, collectAfterReload: collectUnderPressure, holdOptimizer,
    codeCache: codeCacheHandle(),
    ...(onHandover ? { onHandover } : {}),
    ...(opts.replace ? {
      replace: (config) => (handover
        ? takeListeners({ controlSocket: config.control.socket, stateDir: config.stateDir, store: handover, log })
        : Promise.reject(new Error('--replace is for an agent outside systemd; under systemd use `systemctl restart lb-agent` (the fd store keeps the listening sockets)'))),
    } : {}),
  });

  let watchdog: NodeJS.Timeout | undefined;
  const usec = Number(process.env.WATCHDOG_USEC);
  const watchdogPid = process.env.WATCHDOG_PID ? Number(process.env.WATCHDOG_PID) : process.pid;
  if (notify && Number.isFinite(usec) && usec > 0 && watchdogPid === process.pid) {
    // Ping at half the deadline, from a timer: if the event loop is stuck, no ping.
    watchdog = setInterval(() => notify('WATCHDOG=1'), Math.max(50, usec / 2000));
  }

  // Installed before start: a crash half-way through start-up must still
  // withdraw what was already announced (Daemon.stop undoes partial starts).
  let crashed: ((e: unknown) => void) | undefined;
  const onCrash = (e: unknown): void => {
    log.fatal({ op: 'crash', err: errorMessage(e), stack: (e as Error)?.stack }, 'uncaught exception: withdrawing VIPs and exiting');
    if (crashed) { crashed(e); return; }
    void daemon.stop().finally(() => process.exit(1));
  };
  process.on('uncaughtException', onCrash);
  process.on('unhandledRejection', (e) => {
    log.error({ op: 'crash', err: errorMessage(e) }, 'unhandled promise rejection');
  });

  // Signals are ours from before the start: without a listener SIGTERM,
  // SIGINT and SIGHUP keep their default action, and a stop or reload sent
  // while the agent starts (systemd's stop, a quick restart) killed it on the
  // spot - nothing withdrawn, nothing kept cleanly. Until the start is done a
  // stop is remembered and carried out right after it (a start that fails
  // cleans up after itself), and reloads fold into one.
  let pendingStop: { why: string; exitCode: number } | undefined;
  let pendingReload = false;
  const stopOn = (why: string, exitCode: number): void => {
    if (shutdown) { shutdown(why, exitCode); return; }
    if (pendingStop) return;
    pendingStop = { why, exitCode };
    log.info({ op: 'stop', why }, 'stop asked for during the start: stopping as soon as the start is done');
  };
  process.on('SIGTERM', () => stopOn('SIGTERM', 0));
  process.on('SIGINT', () => stopOn('SIGINT', 0));
  process.on('SIGHUP', () => { if (shutdown) void reload(); else pendingReload = true; });

  try {
    await daemon.start();
  } catch (e) {
    if (watchdog) clearInterval(watchdog);
    const code = isLbError(e) ? e.code : undefined;
    log.fatal({ op: 'start', code, err: errorMessage(e) }, 'lb-agent could not start');
    process.stderr.write(`lb-agent: ${errorMessage(e)}${code ? ` [${code}]` : ''}\n`);
    return code === 'LB_ERR_CONFIG_INVALID' ? 2 : 1;
  }

  // Took over from a predecessor (--replace): now that this process serves
  // from the sockets both hold, the predecessor stops accepting and goes.
  const predecessor = daemon.replaced;
  if (predecessor !== undefined) {
    try { process.kill(predecessor, 'SIGTERM'); } catch (e) { log.warn({ op: 'handover', pid: predecessor, err: errorMessage(e) }, 'could not tell the predecessor to finish'); }
  }

  return new Promise<number>((resolve) => {
    let stopping = false;
    shutdown = (why: string, exitCode: number, linger?: Promise<unknown>): void => {
      if (stopping) { if (why !== 'handover') endLinger?.(); return; }
      stopping = true;
      log.info({ op: 'stop', why }, 'stopping');
      const done = (code: number): void => {
        // The stop is over (or gave up): the process should end by itself. If a
        // handle still holds the event loop, say which and end anyway, so a
        // stop never turns into systemd's SIGKILL after TimeoutStopSec.
        setTimeout(() => {
          log.error({ op: 'stop', resources: process.getActiveResourcesInfo() }, `still running ${EXIT_GRACE_MS} ms after the stop; exiting`);
          process.exit(code);
        }, EXIT_GRACE_MS).unref();
        resolve(code);
      };
      const limit = STOP_TIMEOUT_MS + (linger ? HANDOVER_LINGER_MS : 0);
      const force = setTimeout(() => {
        log.error({ op: 'stop' }, `stop took longer than ${limit} ms; exiting anyway`);
        done(1);
      }, limit);
      force.unref();
      daemon.stop({ keep: keepOnStop || linger !== undefined, ...(linger ? { linger } : {}) }).then(() => {
        clearTimeout(force);
        if (watchdog) clearInterval(watchdog);
        done(exitCode);
      }, () => done(1));
    };
    const stop = shutdown;
    crashed = () => stop('crash', 1);
    if (pendingStop) stop(pendingStop.why, pendingStop.exitCode);
    else if (pendingReload) void reload();
  });
}
