// V8's code cache for the CLI bundle (process start to control
// socket under 250 ms). Node 20 compiles dist/bundle/cli.js (1.1 MB) from
// source at every start, and then each function the start runs on its first
// call: ~30 ms of CPU before the control socket listens, of a start that is
// mostly Node's own bootstrap. V8 can serialize what it compiled
// (vm.Script#createCachedData) and take it back at the next compile
// (cachedData), which is what Node 22's module.enableCompileCache() does; on
// Node 20 the bin (start.ts) does it for the one file that matters.
//
// This file: the pure part (where the cache lives, the key that says which
// compile a cache belongs to, the header that carries the key) and the
// driver (read, write, prune), each refusing anything it did not write
// itself. V8 checks its version, the flags and the source's length, not the
// source's content: the key adds the bundle's SHA-256 (computed at build
// time), so a rebuilt bundle of the same length never runs stale code.
import * as fs from 'node:fs';
import * as path from 'node:path';

/** Where the unit's CacheDirectory=lb-agent points; the default for root outside systemd too. */
export const DEFAULT_CACHE_DIR = '/var/cache/lb-agent';
const MAGIC = 'LBCC1';
/** A header longer than this is not ours (headerProblem: such terms get no cache at all). */
const HEADER_MAX = 2048;

/** The start's use of the cache, for the daemon's start line and the tests. */
export type CodeCacheState =
  | 'accepted' // V8 took the cache: nothing of what it holds was compiled again
  | 'rejected' // a cache with our key that V8 refused (it is written again)
  | 'absent' // no cache for this key yet (or one for another key: written again)
  | 'off'; // no usable directory (reason says why)

export interface CodeCacheDir { dir: string }
export interface CodeCacheOff { off: string }

/**
 * The directory to use, from the environment: LB_AGENT_CODE_CACHE (a
 * directory, or "off"), else systemd's CACHE_DIRECTORY (CacheDirectory= in
 * the unit; the first of several), else DEFAULT_CACHE_DIR for root. Another
 * user gets none: a cache someone else could write is code they could run
 * as the agent.
 */
export function cacheDirFrom(env: Readonly<Record<string, string | undefined>>, euid: number): CodeCacheDir | CodeCacheOff {
  const asked = env.LB_AGENT_CODE_CACHE;
  if (asked !== undefined && asked !== '') {
    if (asked === 'off') return { off: 'LB_AGENT_CODE_CACHE=off' };
    if (!path.isAbsolute(asked)) return { off: `LB_AGENT_CODE_CACHE=${asked} is not an absolute path` };
    return { dir: asked };
  }
  const systemd = env.CACHE_DIRECTORY?.split(':')[0];
  if (systemd !== undefined && path.isAbsolute(systemd)) return { dir: systemd };
  return euid === 0 ? { dir: DEFAULT_CACHE_DIR } : { off: 'not root and no LB_AGENT_CODE_CACHE or CACHE_DIRECTORY' };
}

/** What a compile depends on besides the source: a cache made under other terms is another file. */
export interface CacheTerms {
  /** SHA-256 of the bundle, hex (the build puts it in the bin). */
  bundleSha256: string;
  /** process.version, process.arch: V8's own check would refuse another, this keeps each its own file. */
  node: string; arch: string;
  /** V8 refuses a cache made under other flags (--expose-gc is part of its flag hash): process.execArgv and NODE_OPTIONS. */
  flags: string;
  /** "run" (the daemon) or "cli" (every other command): each keeps the functions its own start ran. */
  role: 'run' | 'cli';
}

/** FNV-1a, 32 bits, hex: a short file name for the flags (the header holds them whole). */
function fnv1a(s: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, '0');
}

/** The cache's file name: role, the bundle's hash (12 digits) and the rest of the terms hashed. */
export function cacheFileName(t: CacheTerms): string {
  return `${t.role}-${t.bundleSha256.slice(0, 12)}-${fnv1a(`${t.node} ${t.arch} ${t.flags}`)}.v8cache`;
}

const FILE_RE = /^(run|cli)-([0-9a-f]{12})-[0-9a-f]{8}\.v8cache$/;

/** The header line: every term, so that a file name collision is caught. */
export function cacheHeader(t: CacheTerms): Buffer {
  return Buffer.from(`${MAGIC} ${JSON.stringify([t.bundleSha256, t.node, t.arch, t.role, t.flags])}\n`, 'utf8');
}

/**
 * Why terms cannot have a cache, or undefined: a header over HEADER_MAX (the
 * flags in execArgv and NODE_OPTIONS run to ~2 KiB). Such a process would
 * otherwise write a cache at every start that no start can read.
 */
export function headerProblem(t: CacheTerms): string | undefined {
  const n = cacheHeader(t).length;
  return n > HEADER_MAX ? `the cache key (Node's flags in execArgv and NODE_OPTIONS) runs to ${n} bytes, over the ${HEADER_MAX} a cache file's header may hold` : undefined;
}

/** The V8 data in a cache file, if its header is exactly ours; undefined for anything else. */
export function cachePayload(file: Buffer, t: CacheTerms): Buffer | undefined {
  const want = cacheHeader(t);
  if (want.length > HEADER_MAX || file.length <= want.length) return undefined;
  return file.subarray(0, want.length).equals(want) ? file.subarray(want.length) : undefined;
}

/**
 * Files in the directory that belong to another build of the bundle (their
 * name's hash is not ours): removed when a new cache is written, so that
 * upgrades do not pile them up. Files not named like ours are not touched.
 */
export function staleCacheFiles(names: readonly string[], t: CacheTerms): string[] {
  const ours = t.bundleSha256.slice(0, 12);
  return names.filter((n) => { const m = FILE_RE.exec(n); return m !== null && m[2] !== ours; });
}

/** Why a directory or file may not be used, or undefined when it may: ours, and no one else may write it. */
export function notOurs(st: { uid: number; mode: number }, euid: number, kind: 'directory' | 'file'): string | undefined {
  if (st.uid !== euid) return `the ${kind} belongs to uid ${st.uid}, not ${euid}`;
  if ((st.mode & 0o022) !== 0) return `the ${kind} is writable by group or others (mode ${(st.mode & 0o777).toString(8)})`;
  return undefined;
}

// ---- driver ----

export interface CacheRead { state: 'absent' | 'off'; reason?: string; data?: undefined }
export interface CacheHit { state: 'found'; data: Buffer }

/**
 * Open (creating, 0700) the cache directory and read this key's file.
 * Never throws: a cache that cannot be used is a slower start, not a failure.
 */
export function readCodeCache(dir: string, t: CacheTerms, euid: number): CacheRead | CacheHit {
  const tooLong = headerProblem(t);
  if (tooLong !== undefined) return { state: 'off', reason: tooLong };
  try {
    try {
      fs.mkdirSync(dir, { mode: 0o700 });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') return { state: 'off', reason: `cannot create ${dir}: ${(e as Error).message}` };
    }
    const ds = fs.lstatSync(dir);
    if (!ds.isDirectory()) return { state: 'off', reason: `${dir} is not a directory` };
    const bad = notOurs(ds, euid, 'directory');
    if (bad !== undefined) return { state: 'off', reason: `${dir}: ${bad}` };
    let fd: number;
    try {
      fd = fs.openSync(path.join(dir, cacheFileName(t)), fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      return code === 'ENOENT' ? { state: 'absent' } : { state: 'absent', reason: `cannot open the cache file: ${code ?? (e as Error).message}` };
    }
    try {
      const fst = fs.fstatSync(fd);
      const badFile = fst.isFile() ? notOurs(fst, euid, 'file') : 'not a regular file';
      if (badFile !== undefined) return { state: 'absent', reason: `${cacheFileName(t)}: ${badFile}` };
      const data = cachePayload(fs.readFileSync(fd), t);
      return data === undefined ? { state: 'absent', reason: 'the cache file is not for this bundle, Node or flags' } : { state: 'found', data };
    } finally {
      fs.closeSync(fd);
    }
  } catch (e) {
    return { state: 'off', reason: `cannot read the cache: ${(e as Error).message}` };
  }
}

/**
 * Write the cache atomically (a private temporary file, then rename: a
 * reader sees the old file or the whole new one, never part of one), and
 * remove other builds' files. Returns the bytes written, or why not.
 */
export function writeCodeCache(dir: string, t: CacheTerms, data: Buffer): { bytes: number } | { error: string } {
  const tooLong = headerProblem(t);
  if (tooLong !== undefined) return { error: tooLong };
  const file = path.join(dir, cacheFileName(t));
  const tmp = `${file}.${process.pid}.tmp`;
  const header = cacheHeader(t);
  try {
    const fd = fs.openSync(tmp, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600);
    try {
      fs.writeSync(fd, header);
      fs.writeSync(fd, data);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    return { error: (e as Error).message };
  }
  try {
    for (const n of staleCacheFiles(fs.readdirSync(dir), t)) fs.rmSync(path.join(dir, n), { force: true });
  } catch { /* another build's leftovers stay until the next write */ }
  return { bytes: header.length + data.length };
}

/** What start.ts leaves on `process` (under CODE_CACHE_KEY) for the daemon: the start's state, and the write. */
export interface CodeCacheHandle {
  state: CodeCacheState;
  reason?: string | undefined;
  /**
   * Write the cache now, with what V8 has compiled by now, unless the start
   * took it (accepted) or it is off or already written; for commands other
   * than the daemon the bin calls it as the process exits. Never throws.
   */
  save(): { written: number } | { skipped: string } | { error: string };
}

export const CODE_CACHE_KEY = Symbol.for('lb-agent.code-cache');

/** The handle start.ts left, if the process was started through it. */
export function codeCacheHandle(): CodeCacheHandle | undefined {
  return (process as unknown as Record<symbol, CodeCacheHandle | undefined>)[CODE_CACHE_KEY];
}
