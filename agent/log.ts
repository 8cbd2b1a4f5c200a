// Logging: one pino root logger writing JSON to stdout (journald collects it);
// modules take a child with { module } and add { op } per operation; an
// object there is one of per service takes a lazy child (lazyChild), made
// for each of its lines and not kept.
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

const LAZY_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace'] as const;
const kBindings = Symbol('lb-agent.lazy.bindings');

interface LazyState {
  readonly [kBindings]: pino.Bindings;
}

/** One prototype per parent: the lazy methods, shared by all of its lazy children. */
const lazyPrototypes = new WeakMap<Logger, object>();

function lazyPrototype(parent: Logger): object {
  let proto = lazyPrototypes.get(parent);
  if (proto !== undefined) return proto;
  const methods: Record<string, unknown> = {
    child(this: LazyState, bindings: pino.Bindings, options?: pino.ChildLoggerOptions) { return parent.child(this[kBindings]).child(bindings, options); },
    bindings(this: LazyState) { return parent.child(this[kBindings]).bindings(); },
  };
  for (const level of LAZY_LEVELS) {
    methods[level] = function (this: LazyState, ...args: Parameters<pino.LogFn>): void {
      // A line the level drops makes no child.
      if (!parent.isLevelEnabled(level)) return;
      parent.child(this[kBindings])[level](...args);
    };
  }
  proto = Object.assign(Object.create(parent) as object, methods);
  lazyPrototypes.set(parent, proto);
  return proto;
}

/**
 * parent.child(bindings) for an object there is one of per service: the
 * child is made for each line the level lets through and not kept. A kept
 * pino child is a copy of its parent's level methods and bindings text
 * (about 1 KiB and six closures): one for each of a thousand services'
 * sources and VIP owners, which log a line or two at their start and then
 * seldom, is 2 MiB of heap held for good; making one is about 3 µs on a
 * line that costs about as much to write. The lines are the child's own,
 * field for field (the bindings are taken now). Anything else (level,
 * isLevelEnabled, flush) is the parent's.
 */
export function lazyChild(parent: Logger, bindings: pino.Bindings): Logger {
  const lazy = Object.create(lazyPrototype(parent)) as { [kBindings]: pino.Bindings };
  lazy[kBindings] = bindings;
  return lazy as unknown as Logger;
}
