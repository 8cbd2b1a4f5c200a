// The daemon's config loader: read with limits (read.ts) without blocking,
// then parse and validate in a worker thread with its own heap limit and a
// deadline. Parsing is CPU-bound: the yaml package takes ~14 s for a dense
// 4 MiB file on a busy 2-core VM, and in the event loop that would stop
// health checks, DHCP and VRRP adverts (issue 15). The result is frozen here,
// as parseConfigText freezes it (structured clone drops the freeze).
// The first start may parse a small file inline instead (issue 18): nothing
// runs on the loop yet, and a worker costs a Node environment and a second
// copy of the yaml package, ~100 ms of the start.
import * as path from 'node:path';
import { Worker } from 'node:worker_threads';
import { readConfigTextAsync } from './read';
import { deepFreeze, parseConfigText, type LoadResult } from './load';
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
 * start, for its heap limit and deadline; reloads always do.
 */
export const INLINE_PARSE_MAX_BYTES = 64 * 1024;

/** How a file was parsed: on the event loop or in a worker thread. */
export type ParsedVia = 'inline' | 'worker';

/** Parse config text in a worker thread; never throws. */
export function parseConfigTextOffThread(text: string, file: string, opts: { hostname?: string; deadlineMs?: number } = {}): Promise<LoadResult> {
  return new Promise<LoadResult>((resolve) => {
    let done = false;
    const worker = new Worker(path.join(__dirname, 'parse-worker.js'), {
      workerData: { text, hostname: opts.hostname },
      resourceLimits: { maxOldGenerationSizeMb: PARSE_HEAP_MB },
      stdout: false, stderr: false,
    });
    const finish = (r: LoadResult): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      void worker.terminate();
      resolve(r.ok ? { ok: true, config: deepFreeze(r.config) } : r);
    };
    const deadline = opts.deadlineMs ?? PARSE_DEADLINE_MS;
    const timer = setTimeout(() => finish(refused(file, `parsing took more than ${deadline / 1000} s; is the file that large on purpose?`)), deadline);
    worker.once('message', (r: LoadResult) => finish(r));
    worker.once('error', (e) => finish(refused(file, (e as NodeJS.ErrnoException).code === 'ERR_WORKER_OUT_OF_MEMORY'
      ? `parsing needed more than ${PARSE_HEAP_MB} MB of memory` : errorMessage(e))));
    worker.once('exit', (code) => finish(refused(file, `the parser stopped (exit ${code}) without a result`)));
  });
}

/**
 * Read (regular file, at most 4 MiB, async) and validate a config file off
 * the event loop; with `inlineUpTo` (the first start, before anything else
 * runs on the loop) a file of at most that many bytes is parsed inline.
 * Never throws.
 */
export async function loadConfigFileAsync(file: string, opts: { hostname?: string; deadlineMs?: number; inlineUpTo?: number } = {}): Promise<LoadResult & { via?: ParsedVia }> {
  const read = await readConfigTextAsync(file);
  if (!read.ok) return read;
  if (opts.inlineUpTo !== undefined && Buffer.byteLength(read.text) <= opts.inlineUpTo) {
    try {
      return { ...parseConfigText(read.text, opts.hostname), via: 'inline' };
    } catch (e) {
      return { ...refused(file, errorMessage(e)), via: 'inline' };
    }
  }
  return { ...await parseConfigTextOffThread(read.text, file, opts), via: 'worker' };
}
