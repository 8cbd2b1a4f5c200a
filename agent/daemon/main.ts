// `lb-agent run`: the process around the Daemon - logger, signals (SIGTERM
// and SIGINT stop within 10 s - withdrawing, or with --on-stop keep leaving
// the data path serving for the next process - SIGHUP and the control socket
// reload), the systemd fd store for the proxy's listeners, the notify protocol
// (READY=1, STATUS=, STOPPING=1, WATCHDOG=1 from the event loop itself, so a
// blocked loop stops the pings), and a last-chance withdraw on a crash.
import { createLogger, LogLevel } from '../log';
import { Daemon } from './daemon';
import { buildSubsystems } from './wiring';
import { errorMessage, isLbError } from '../errors';
import { makeNotifier, parseListenFds, SystemdFdStore } from './systemd';

const STOP_TIMEOUT_MS = 10_000;

/** What SIGTERM does: withdraw everything (the default), or leave it serving for the next process (the unit: a restart keeps, ExecStopPost withdraws on a real stop). */
export type OnStop = 'withdraw' | 'keep';

export async function runDaemon(opts: { configPath: string; logLevel: LogLevel; onStop?: OnStop }): Promise<number> {
  const log = createLogger(opts.logLevel);
  const notify = makeNotifier(log);
  // Listening sockets the service manager kept for us (a restart or a crash
  // that Restart= recovered), and the store for ours; only under systemd.
  const inherited = parseListenFds(process.env, process.pid);
  for (const k of ['LISTEN_PID', 'LISTEN_FDS', 'LISTEN_FDNAMES']) delete process.env[k];
  const listenerStore = notify ? new SystemdFdStore(notify, inherited, log.child({ module: 'systemd' })) : undefined;
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
  const daemon = new Daemon({ configPath: opts.configPath, log, buildSubsystems, notify, reload, ...(listenerStore ? { listenerStore } : {}) });

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

  try {
    await daemon.start();
  } catch (e) {
    if (watchdog) clearInterval(watchdog);
    const code = isLbError(e) ? e.code : undefined;
    log.fatal({ op: 'start', code, err: errorMessage(e) }, 'lb-agent could not start');
    process.stderr.write(`lb-agent: ${errorMessage(e)}${code ? ` [${code}]` : ''}\n`);
    return code === 'LB_ERR_CONFIG_INVALID' ? 2 : 1;
  }

  return new Promise<number>((resolve) => {
    let stopping = false;
    const shutdown = (why: string, exitCode: number): void => {
      if (stopping) return;
      stopping = true;
      log.info({ op: 'stop', why }, 'stopping');
      const force = setTimeout(() => {
        log.error({ op: 'stop' }, `stop took longer than ${STOP_TIMEOUT_MS} ms; exiting anyway`);
        resolve(1);
      }, STOP_TIMEOUT_MS);
      force.unref();
      daemon.stop({ keep: keepOnStop }).then(() => {
        clearTimeout(force);
        if (watchdog) clearInterval(watchdog);
        resolve(exitCode);
      }, () => resolve(1));
    };
    process.on('SIGTERM', () => shutdown('SIGTERM', 0));
    process.on('SIGINT', () => shutdown('SIGINT', 0));
    process.on('SIGHUP', () => { void reload(); });
    crashed = () => shutdown('crash', 1);
  });
}
