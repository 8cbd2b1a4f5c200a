// Build time only (`npm run build` runs this file last, after tsc and the
// schema build): bundles the production entry points of dist/ with esbuild
// into dist/bundle/, one file each, so that `lb-agent` reads and compiles one
// file instead of resolving, reading and wrapping ~130 modules before its
// control socket listens (issue 18: ~100 ms of CPU of every start).
//   lb-agent.js      the CLI and the daemon (agent/cli/main.ts)
//   parse-worker.js  the reload's config parser (agent/config/load-async.ts
//                    starts it by path, beside the file that starts it)
//   proxy-worker.js  a proxy thread (agent/forward/proxy.ts, likewise)
// All three sit in one folder, so `path.join(__dirname, '<worker>.js')`
// finds the worker's bundle, and native.ts finds the addon two folders up,
// as it does from dist/agent/net. Module bodies stay lazy: esbuild wraps
// each CommonJS module in a function run on its first require(), so what
// daemon.ts and wiring.ts load on first use still runs only then.
// Not bundled: the addon (a .node file) and `netlink`, whose loader finds
// its prebuilt binary relative to its own package folder.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { buildSync } from 'esbuild';

/** dist/, from dist/agent (where this file runs). */
const DIST = path.resolve(__dirname, '..');
export const BUNDLE_DIR = path.join(DIST, 'bundle');

/** Bundle name -> its entry in dist/. */
export const BUNDLE_ENTRIES: Readonly<Record<string, string>> = {
  'lb-agent': 'agent/cli/main.js',
  'parse-worker': 'agent/config/parse-worker.js',
  'proxy-worker': 'agent/forward/proxy-worker.js',
};

export function buildBundles(outDir = BUNDLE_DIR): string[] {
  fs.rmSync(outDir, { recursive: true, force: true });
  const r = buildSync({
    entryPoints: Object.fromEntries(Object.entries(BUNDLE_ENTRIES).map(([name, entry]) => [name, path.join(DIST, entry)])),
    outdir: outDir,
    // Module keys in the output are relative to the checkout: the same bundle from any cwd.
    absWorkingDir: path.resolve(DIST, '..'),
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'cjs',
    external: ['*.node', 'netlink'],
    // tsc's source maps are not bundled (Node reads none without
    // --enable-source-maps); identifiers are kept, so stack traces in the
    // journal still name functions.
    loader: { '.map': 'empty' },
    minifyWhitespace: true,
    minifySyntax: true,
    legalComments: 'none',
    logLevel: 'warning',
    metafile: true,
  });
  if (r.errors.length > 0) throw new Error(`esbuild: ${r.errors.map((e) => e.text).join('; ')}`);
  return Object.keys(BUNDLE_ENTRIES).map((n) => path.join(outDir, `${n}.js`));
}

if (require.main === module) {
  const files = buildBundles();
  fs.chmodSync(files[0]!, 0o755);
}
