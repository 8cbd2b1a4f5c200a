// Logging: one pino root logger writing JSON to stdout (journald collects it);
// modules take a child with { module } and add { op } per operation.
import pino from 'pino';
import { isoTime } from './clock';

export type Logger = pino.Logger;
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export function createLogger(level: LogLevel = 'info', destination?: pino.DestinationStream): Logger {
  const opts: pino.LoggerOptions = {
    level,
    base: { pid: process.pid },
    // pino's isoTime, without V8's Date#toISOString (clock.ts: isoTime).
    timestamp: () => `,"time":"${isoTime(Date.now())}"`,
    formatters: { level: (label) => ({ level: label }) },
  };
  return destination ? pino(opts, destination) : pino(opts, pino.destination({ fd: 1, sync: true }));
}

/** A logger that drops everything: the default for modules under unit test. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
