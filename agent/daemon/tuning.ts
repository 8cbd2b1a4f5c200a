// Runtime tuning around the daemon's start and reloads: V8's optimizing
// compiler held off for the start's burst, the code cache written once the
// start has settled, and one compacting collection (plus malloc_trim) after
// the start and after each reload. The daemon says when; this file says how.
// Every hook is optional: without them (tests, an addon without the calls)
// each step is a no-op or falls back to gc().
import { setFlagsFromString } from 'node:v8';
import type { Logger } from '../log';
import type { CodeCacheHandle } from '../cli/code-cache';
import { START_HOLD_MAX_MS } from './tiering';

export interface TuningHooks {
  /** Holds the optimizing compiler off and returns what releases it (main.ts: tiering.ts holdOptimizer). */
  holdOptimizer?: (() => (() => void) | undefined) | undefined;
  /** V8's low-memory collection through the addon (the start's); false when not available. */
  collectAll?: (() => boolean) | undefined;
  /** V8's critical-memory-pressure collection through the addon (each reload's); false when not available. */
  collectAfterReload?: (() => boolean) | undefined;
  /** malloc_trim(3) through the addon. */
  trimMemory?: (() => void) | undefined;
  /** V8's code cache of this start (agent/cli/start.ts). */
  codeCache?: Pick<CodeCacheHandle, 'state' | 'reason' | 'save'> | undefined;
}

export class RuntimeTuning {
  private release: (() => void) | undefined;
  private releaseTimer: NodeJS.Timeout | undefined;

  constructor(private readonly hooks: TuningHooks, private readonly log: Logger) {}

  /** The start begins: the optimizer is held until settled(), START_HOLD_MAX_MS after started(), or stop(). */
  begin(): void {
    this.release = this.hooks.holdOptimizer?.();
  }

  /** "lb-agent started": the hold ends START_HOLD_MAX_MS from now at the latest. */
  started(): void {
    if (!this.release) return;
    this.releaseTimer = setTimeout(() => this.optimizerBack('time'), START_HOLD_MAX_MS);
    this.releaseTimer.unref();
  }

  /**
   * Every VIP of the start is in place: the start's work, and its garbage,
   * are done. The optimizer comes back; the code cache is written (before
   * the collection: its serialization's garbage goes with the start's); the
   * start's garbage is collected.
   */
  settled(): void {
    this.optimizerBack('settled');
    this.saveCodeCache();
    collectGarbage(this.hooks.collectAll, this.hooks.trimMemory);
  }

  /** A reload ended: its garbage goes, with the pressure collection (collectGarbage says why). */
  afterReload(): void {
    collectGarbage(this.hooks.collectAfterReload, this.hooks.trimMemory);
  }

  /** A stop (or a start that failed): the optimizer comes back. */
  stopping(): void {
    this.optimizerBack('stop');
  }

  /**
   * Write V8's code cache for the next start, once, with the optimizing
   * compiler back on: V8 refuses a cache made under other flags than the
   * reader's, and holdOptimizer changes one.
   */
  saveCodeCache(): void {
    const saved = this.hooks.codeCache?.save();
    if (saved && 'written' in saved) this.log.info({ op: 'code-cache', bytes: saved.written }, `V8 code cache written for the next start (${Math.round(saved.written / 1024)} KiB)`);
    else if (saved && 'error' in saved) this.log.warn({ op: 'code-cache', err: saved.error }, 'could not write the V8 code cache: the next start compiles from source');
  }

  private optimizerBack(why: 'settled' | 'time' | 'stop'): void {
    const release = this.release;
    if (!release) return;
    this.release = undefined;
    if (this.releaseTimer) { clearTimeout(this.releaseTimer); this.releaseTimer = undefined; }
    release();
    this.log.debug({ op: 'start', why }, 'optimizing compiler back on');
  }
}

/**
 * One full, compacting garbage collection when the unit exposes `gc`
 * (NODE_OPTIONS=--expose-gc), then `trim` (malloc_trim(3)), on the next
 * turn of the loop. A start's or a reload's garbage (the previous config,
 * the parse worker's answer, nft's output) lands in V8's old generation,
 * which V8 collects only once it has grown past its limit; a plain full
 * collection frees the objects but not the pages they were scattered over,
 * so the committed heap creeps up reload after reload. Compacting moves the
 * survivors together and returns the emptied pages; the flag is set for
 * this one collection only, so the collections V8 runs by itself under
 * proxy load do not pay for it.
 *
 * `collect`, when the addon offers it, runs instead of gc(): at the start
 * V8's low-memory collection (it also uncommits the young generation's idle
 * semi-space, but repeats itself and clears the compilation cache, too long
 * a block for a reload of many services); after a reload V8's answer to
 * critical memory pressure (one collection that also returns the young
 * generation, at gc()'s cost). The bench's memory lines measure both.
 */
export function collectGarbage(collect: (() => boolean) | undefined, trim: (() => void) | undefined): void {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc && !trim) return;
  setImmediate(() => {
    if (gc) {
      setFlagsFromString('--compact-on-every-full-gc');
      try { if (collect?.() !== true) gc(); } finally { setFlagsFromString('--no-compact-on-every-full-gc'); }
    }
    trim?.();
  });
}
