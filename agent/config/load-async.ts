// The daemon's config loader: read with limits (read.ts) without blocking,
// then parse and validate in a worker thread with its own heap limit and a
// deadline. Parsing is CPU-bound: js-yaml takes ~1 s for a dense 2 MiB
// file on a busy 2-core VM (the yaml package it replaced, ~14 s for 4 MiB),
// and in the event loop that would stop
// health checks, DHCP and VRRP adverts. The result is frozen here,
// as parseConfigText freezes it (structured clone drops the freeze).
// A file of up to a thousand-odd services is parsed inline instead: at the
// first start up to 64 KiB, and on a reload up to 256 KiB, where the parse
// blocks the loop for tens of milliseconds. A worker costs a Node
// environment and a second copy of the YAML parser: ~100 ms of the start,
// ~150 ms of CPU a reload, and ~2 MiB of RSS that stayed after the first reload.
import * as path from 'node:path';
import { Worker } from 'node:worker_threads';
import { readConfigTextAsync } from './read';
import { ConfigReuse, deepFreeze, parseConfigText, type ConfigError, type LoadResult } from './load';
import type { Desired } from './types';
import { errorMessage } from '../errors';

/** A parse that takes longer than this is refused (the file stays unapplied). */
export const PARSE_DEADLINE_MS = 60_000;
/** The worker's old-generation heap: a 4 MiB file parses in well under this. */
export const PARSE_HEAP_MB = 512;

function refused(file: string, why: string): LoadResult {
  return { ok: false, errors: [{ path: '', message: `cannot parse ${file}: ${why}` }] };
}

/**
 * The largest file the first start parses inline, on the event loop (about
 * 250 services; tens of milliseconds). Larger files go to the worker even at
 * start, for its heap limit and deadline (reloads: RELOAD_INLINE_MAX_BYTES).
 */
export const INLINE_PARSE_MAX_BYTES = 64 * 1024;

/**
 * The largest file a reload parses inline, on the event loop: a thousand
 * services (~150 KiB) parse and validate in ~25-35 ms of the loop, while
 * starting a worker costs ~150 ms of CPU (a Node environment, the parser's
 * bundle compiled again) before it parses anything, and its thread leaves
 * about 2 MiB of RSS behind (its malloc arena, the pages its bootstrap
 * touched). Health checks, DHCP and VRRP timers are in seconds and the
 * proxy runs in its own threads. Larger files keep the worker: its heap
 * limit and deadline, and a loop that stays free.
 */
export const RELOAD_INLINE_MAX_BYTES = 256 * 1024;

/** How a file was parsed: on the event loop or in a worker thread. */
export type ParsedVia = 'inline' | 'worker';

/** A worker's answer (parse-worker.ts): ConfigReuse's fields, its class lost in the clone. */
type WorkerResult = { readonly ok: true; readonly config: Desired; readonly reuse?: Pick<ConfigReuse, 'globals' | 'byText'> } | { readonly ok: false; readonly errors: readonly ConfigError[] };

function revive(r: Pick<ConfigReuse, 'globals' | 'byText'> | undefined): ConfigReuse | undefined {
  return r === undefined ? undefined : new ConfigReuse(r.globals, r.byText);
}

/** Parse config text in a worker thread; never throws. The result's reuse is the worker's, its specs the config's objects. */
export function parseConfigTextOffThread(text: string, file: string, opts: { hostname?: string; deadlineMs?: number } = {}): Promise<LoadResult> {
  return new Promise<LoadResult>((resolve) => {
    let done = false;
    const worker = new Worker(path.join(__dirname, 'parse-worker.js'), {
      workerData: { text, hostname: opts.hostname },
      resourceLimits: { maxOldGenerationSizeMb: PARSE_HEAP_MB },
      stdout: false, stderr: false,
    });
    // The answer is handed on once the worker's thread has ended, not when
    // its message arrives: the daemon's collection and malloc_trim after a
    // reload then find the thread's heap gone, and a reload is over when it
    // says so (RSS sampled 300 ms after a reload on a busy machine
    // still held the worker's isolate, +28 MiB). terminate() resolves after
    // the thread has joined; it is immediate if the thread has exited.
    const finish = (r: WorkerResult | LoadResult): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      const answer: LoadResult = r.ok ? { ok: true as const, config: deepFreeze(r.config), reuse: revive(r.reuse) } : { ok: false, errors: r.errors };
      worker.terminate().then(() => resolve(answer), () => resolve(answer));
    };
    const deadline = opts.deadlineMs ?? PARSE_DEADLINE_MS;
    const timer = setTimeout(() => finish(refused(file, `parsing took more than ${deadline / 1000} s; is the file that large on purpose?`)), deadline);
    worker.once('message', (r: WorkerResult) => finish(r));
    worker.once('error', (e) => finish(refused(file, (e as NodeJS.ErrnoException).code === 'ERR_WORKER_OUT_OF_MEMORY'
      ? `parsing needed more than ${PARSE_HEAP_MB} MB of memory` : errorMessage(e))));
    worker.once('exit', (code) => finish(refused(file, `the parser stopped (exit ${code}) without a result`)));
  });
}

/**
 * Read (regular file, at most 4 MiB, async) and validate a config file; a
 * file of at most `inlineUpTo` bytes (the first start, before anything else
 * runs on the loop: INLINE_PARSE_MAX_BYTES; by default, a reload:
 * RELOAD_INLINE_MAX_BYTES) is parsed inline, a larger one in a worker.
 * An inline parse takes again what `reuse` (the last accepted parse's)
 * built for entries whose text is unchanged (ConfigReuse). Never throws.
 */
export async function loadConfigFileAsync(file: string, opts: { hostname?: string; deadlineMs?: number; inlineUpTo?: number; reuse?: ConfigReuse } = {}): Promise<LoadResult & { via?: ParsedVia }> {
  const read = await readConfigTextAsync(file);
  if (!read.ok) return read;
  if (Buffer.byteLength(read.text) <= (opts.inlineUpTo ?? RELOAD_INLINE_MAX_BYTES)) {
    try {
      return { ...parseConfigText(read.text, opts.hostname, opts.reuse), via: 'inline' };
    } catch (e) {
      return { ...refused(file, errorMessage(e)), via: 'inline' };
    }
  }
  return { ...await parseConfigTextOffThread(read.text, file, opts), via: 'worker' };
}
