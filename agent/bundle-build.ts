// Build time only (`npm run build` runs this file last, after tsc and the
// schema build): bundles the production entry points of dist/ with esbuild
// into dist/bundle/, one file each, so that `lb-agent` reads and compiles one
// file instead of resolving, reading and wrapping ~130 modules before its
// control socket listens (~100 ms of CPU of every start).
//   lb-agent.js      the bin (agent/cli/start.ts): compiles cli.js with V8's
//                    code cache (agent/cli/code-cache.ts); built after the
//                    others, with cli.js's SHA-256 written into it
//   cli.js           the CLI and the daemon (agent/cli/main.ts)
//   parse-worker.js  the reload's config parser (agent/config/load-async.ts
//                    starts it by path, beside the file that starts it)
//   proxy-worker.js  a proxy thread (agent/forward/proxy.ts, likewise)
// All three sit in one folder, so `path.join(__dirname, '<worker>.js')`
// finds the worker's bundle, and native.ts finds the addon two folders up,
// as it does from dist/agent/net. Module bodies stay lazy: esbuild wraps
// each CommonJS module in a function run on its first require(), so what
// the daemon (late-load.ts) and main.ts (wiring.ts) load on first use
// still runs only then.
// Not bundled: the addon (a .node file). `netlink` is bundled without its
// raw socket layer, which loads the package's own prebuilt .node file: the
// addon's netlink socket stands in for it (NETLINK_RAW below).
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { build, type Plugin } from 'esbuild';

/** dist/, from dist/agent (where this file runs). */
const DIST = path.resolve(__dirname, '..');
export const BUNDLE_DIR = path.join(DIST, 'bundle');

/** Bundle name -> its entry in dist/ (the bin, lb-agent, is built last: BIN). */
export const BUNDLE_ENTRIES: Readonly<Record<string, string>> = {
  'lb-agent': 'agent/cli/start.js',
  cli: 'agent/cli/main.js',
  'parse-worker': 'agent/config/parse-worker.js',
  'proxy-worker': 'agent/forward/proxy-worker.js',
};

/**
 * Modules a dependency require()s at load time but calls only on a path the
 * agent never takes: each is replaced, for that importer only, by
 * a function that require()s the real one on its first call. pino's
 * transport (thread-stream, Node's `module` and `url`) serves
 * `pino({ transport })`, which the agent does not use (agent/log.ts writes
 * synchronously to fd 1); `assert` in sonic-boom guards one call when a
 * stream closes. Each was loaded by every start: ~0.5 MiB of built-ins'
 * sources and code for a kernel-path service. The shape is what the
 * importer does with the module - it calls it - so the forwarder behaves
 * the same if the path is ever taken.
 */
export const LAZY_CALLS: readonly { importer: RegExp; request: string }[] = [
  { importer: /node_modules\/pino\/(pino|lib\/tools)\.js$/, request: './lib/transport' },
  { importer: /node_modules\/pino\/(pino|lib\/tools)\.js$/, request: './transport' },
  { importer: /node_modules\/sonic-boom\/index\.js$/, request: 'assert' },
];

const lazyCalls: Plugin = {
  name: 'lazy-calls',
  setup(b) {
    b.onResolve({ filter: /^(\.\/(lib\/)?transport|assert)$/ }, async (args) => {
      if (args.pluginData === 'real' || !LAZY_CALLS.some((l) => l.request === args.path && l.importer.test(args.importer))) return undefined;
      const real = await b.resolve(args.path, { kind: args.kind, resolveDir: args.resolveDir, pluginData: 'real' });
      if (real.errors.length > 0) return { errors: real.errors };
      // A built-in stays require('assert'); a file is bundled, behind the forwarder.
      return { path: `${args.path} (lazy, from ${path.relative(b.initialOptions.absWorkingDir ?? '', args.importer)})`, namespace: 'lazy-call', pluginData: { request: real.external ? args.path : real.path, resolveDir: args.resolveDir } };
    });
    b.onLoad({ filter: /.*/, namespace: 'lazy-call' }, (args) => {
      const { request, resolveDir } = args.pluginData as { request: string; resolveDir: string };
      return { contents: `module.exports = function lazyCall(...a) { return require(${JSON.stringify(request)})(...a); };\n`, loader: 'js', resolveDir };
    });
  },
};

/**
 * The `netlink` package's raw socket layer (`dist/raw.js`, which dlopens the
 * package's prebuilt addon when it loads) is replaced, for its framing layer
 * `dist/netlink.js`, by agent/net/netlink-socket.ts: the same class on our
 * addon (a second .node file cost ~0.25 MiB of RSS). agent/net/
 * netlink.ts hands that class to the framing layer itself; this keeps the
 * package's own loader out of the bundle.
 */
export const NETLINK_RAW = { importer: /node_modules\/netlink\/dist\/netlink\.js$/, request: './raw', replacement: 'agent/net/netlink/netlink-socket.js' };

const netlinkRaw: Plugin = {
  name: 'netlink-raw',
  setup(b) {
    b.onResolve({ filter: /^\.\/raw$/ }, (args) => {
      if (!NETLINK_RAW.importer.test(args.importer)) return undefined;
      return { path: path.join(DIST, NETLINK_RAW.replacement) };
    });
  },
};

/** The bin's bundle name: built after the others, it carries cli.js's hash (start.ts LB_CLI_SHA256). */
const BIN = 'lb-agent';

/** Bundle the entries into outDir (esbuild's plugins need its asynchronous API). */
export async function buildBundles(outDir = BUNDLE_DIR): Promise<string[]> {
  fs.rmSync(outDir, { recursive: true, force: true });
  const entries = (names: string[]): Record<string, string> => Object.fromEntries(names.map((n) => [n, path.join(DIST, BUNDLE_ENTRIES[n]!)]));
  await bundle(entries(Object.keys(BUNDLE_ENTRIES).filter((n) => n !== BIN)), outDir, {});
  const cliSha = crypto.createHash('sha256').update(fs.readFileSync(path.join(outDir, 'cli.js'))).digest('hex');
  await bundle(entries([BIN]), outDir, { LB_CLI_SHA256: JSON.stringify(cliSha) });
  return Object.keys(BUNDLE_ENTRIES).map((n) => path.join(outDir, `${n}.js`));
}

async function bundle(entryPoints: Record<string, string>, outDir: string, define: Record<string, string>): Promise<void> {
  const r = await build({
    entryPoints,
    define,
    outdir: outDir,
    // Module keys in the output are relative to the checkout: the same bundle from any cwd.
    absWorkingDir: path.resolve(DIST, '..'),
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'cjs',
    external: ['*.node'],
    // tsc's source maps are not bundled (Node reads none without
    // --enable-source-maps); identifiers are kept, so stack traces in the
    // journal still name functions.
    loader: { '.map': 'empty' },
    minifyWhitespace: true,
    minifySyntax: true,
    legalComments: 'none',
    logLevel: 'warning',
    metafile: true,
    plugins: [lazyCalls, netlinkRaw],
  });
  if (r.errors.length > 0) throw new Error(`esbuild: ${r.errors.map((e) => e.text).join('; ')}`);
}

if (require.main === module) {
  buildBundles().then((files) => { fs.chmodSync(files[0]!, 0o755); }, (e: unknown) => {
    console.error(e);
    process.exitCode = 1;
  });
}
