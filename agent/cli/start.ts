#!/usr/bin/env node
// The `lb-agent` bin (dist/bundle/lb-agent.js): compiles the CLI
// bundle beside it (cli.js) with V8's code cache from the last start under
// the same terms (code-cache.ts), runs it as that file's CommonJS module
// would run, and writes the cache when there was none to take: the daemon
// once its start has settled, or at its stop (daemon.ts saveCodeCache: with
// the optimizing compiler back on, as V8 hashes its flags into the cache),
// any other command as the process exits. Everything else is the CLI's
// (agent/cli/main.ts), but for `status --json`, answered here without it
// (status-json.ts).
import * as fs from 'node:fs';
import * as path from 'node:path';
import type * as vmTypes from 'node:vm';
import type { CacheTerms, CodeCacheHandle, CodeCacheState } from './code-cache';
import { statusJsonFast } from './status-json';

/** Set by agent/bundle-build.ts: the SHA-256 of cli.js as built. Absent outside the bundle. */
declare const LB_CLI_SHA256: string | undefined;

/**
 * Compile and run the CLI bundle, with its code cache. The code cache's
 * module and `vm` are loaded here, not at the file's top: `status --json`
 * (status-json.ts) answers without either.
 */
async function runCli(): Promise<void> {
  const vm = await import('node:vm');
  const { CODE_CACHE_KEY, cacheDirFrom, readCodeCache, writeCodeCache } = await import('./code-cache');
  const cli = path.join(__dirname, 'cli.js');
  const euid = process.geteuid?.() ?? -1;
  const terms: CacheTerms = {
    bundleSha256: typeof LB_CLI_SHA256 === 'string' ? LB_CLI_SHA256 : '',
    node: process.version, arch: process.arch,
    flags: `${process.execArgv.join(' ')}|${process.env.NODE_OPTIONS ?? ''}`,
    role: process.argv[2] === 'run' ? 'run' : 'cli',
  };
  const where = terms.bundleSha256 === '' ? { off: 'no bundle hash (not the built bin)' } : cacheDirFrom(process.env, euid);

  /**
   * Compile cli.js, with the cache when there is one. In a function of its
   * own: neither the file's text (the Script keeps its wrapped copy) nor the
   * cache's bytes (V8 has made its objects from them) outlive the compile,
   * ~1.1 and ~0.9 MB that would otherwise stay in every agent's heap.
   */
  function compile(): { script: vmTypes.Script; state: CodeCacheState; reason: string | undefined; usable: boolean } {
    const read = 'dir' in where ? readCodeCache(where.dir, terms, euid) : { state: 'off' as const, reason: where.off, data: undefined };
    // The shebang line is kept as an empty line: line numbers in stack traces stay the file's.
    const source = fs.readFileSync(cli, 'utf8').replace(/^#!.*/, '');
    // Node's CommonJS wrapper, written out (require('module') would load the module API for one string).
    const script = new vm.Script(`(function (exports, require, module, __filename, __dirname) { ${source}\n})`, { filename: cli, cachedData: read.data });
    if (read.state === 'found') return { script, state: script.cachedDataRejected === true ? 'rejected' : 'accepted', reason: undefined, usable: true };
    return { script, state: read.state, reason: read.reason, usable: read.state !== 'off' };
  }
  const { script, state, reason, usable } = compile();

  let saved = false;
  const handle: CodeCacheHandle = {
    state, reason,
    save() {
      if (!('dir' in where) || !usable) return { skipped: 'off' };
      if (handle.state === 'accepted') return { skipped: 'accepted' };
      if (saved) return { skipped: 'written' };
      saved = true;
      try {
        const r = writeCodeCache(where.dir, terms, script.createCachedData());
        return 'bytes' in r ? { written: r.bytes } : r;
      } catch (e) {
        return { error: (e as Error).message };
      }
    },
  };
  (process as unknown as Record<symbol, CodeCacheHandle>)[CODE_CACHE_KEY] = handle;
  if (terms.role === 'cli') process.once('exit', () => { handle.save(); });

  // cli.js runs as this module: require.main === module there, and require() resolves beside it.
  (script.runInThisContext() as (...a: unknown[]) => void).call(module.exports, module.exports, require, module, cli, __dirname);
}

if (!statusJsonFast(process.argv.slice(2))) {
  runCli().catch((e: unknown) => {
    process.stderr.write(`lb-agent: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exitCode = 1;
  });
}
