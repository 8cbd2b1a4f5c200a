// `lb-agent run`: the process around the Daemon - logger, signals (SIGTERM
// and SIGINT stop within 10 s, SIGHUP reloads), the systemd notify protocol
// (READY=1, STATUS=, STOPPING=1, WATCHDOG=1 from the event loop itself, so a
// blocked loop stops the pings), and a last-chance withdraw on a crash.
import { createLogger, LogLevel, Logger } from '../log';
import { Daemon } from './daemon';
import { buildSubsystems } from './wiring';
import { errorMessage, isLbError } from '../errors';

const STOP_TIMEOUT_MS = 10_000;

/** sd_notify through the native unix datagram send; a no-op outside systemd. */
export function makeNotifier(log: Logger): ((msg: string) => void) | undefined {
  const target = process.env.NOTIFY_SOCKET;
  if (!target) return undefined;
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const { sendUnixDatagram } = require('../net/native') as typeof import('../net/native');
  return (msg: string) => {
    try {
      sendUnixDatagram(target, Buffer.from(msg));
    } catch (e) {
      log.warn({ op: 'sd_notify', err: errorMessage(e) }, 'sd_notify failed');
    }
  };
}

export async function runDaemon(opts: { configPath: string; logLevel: LogLevel }): Promise<number> {
  const log = createLogger(opts.logLevel);
  const notify = makeNotifier(log);
  const daemon = new Daemon({ configPath: opts.configPath, log, buildSubsystems, notify });

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
      daemon.stop().then(() => {
        clearTimeout(force);
        if (watchdog) clearInterval(watchdog);
        resolve(exitCode);
      }, () => resolve(1));
    };
    process.on('SIGTERM', () => shutdown('SIGTERM', 0));
    process.on('SIGINT', () => shutdown('SIGINT', 0));
    process.on('SIGHUP', () => {
      notify?.('RELOADING=1');
      // Every RELOADING=1 is answered by READY=1, even if the reload throws:
      // otherwise systemd sees the unit reloading forever (issue 15).
      void daemon.reload().catch((e: unknown) => {
        log.error({ op: 'reload', err: errorMessage(e) }, 'reload failed; running config kept');
        return { ok: false, message: `reload failed:\n${errorMessage(e)}` };
      }).then((r) => {
        notify?.('READY=1');
        if (!r.ok) notify?.(`STATUS=reload rejected: ${r.message.split('\n')[1] ?? ''}`);
      });
    });
    crashed = () => shutdown('crash', 1);
  });
}
