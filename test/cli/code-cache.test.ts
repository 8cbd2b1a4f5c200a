// V8's code cache for the CLI bundle (agent/cli/code-cache.ts, issue 18):
// where it lives, the key that ties a cache to one bundle, Node and flag
// set, and a driver that uses nothing it did not write itself. The bin
// taking the cache for real is test/bundle-build.test.ts's; the daemon's
// start taking it, test/privileged/daemon-start.test.ts's.
import t, { type Test } from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  DEFAULT_CACHE_DIR, cacheDirFrom, cacheFileName, cacheHeader, cachePayload, headerProblem, notOurs, readCodeCache, staleCacheFiles, writeCodeCache,
  type CacheTerms,
} from '../../agent/cli/code-cache';

const SHA = 'ab'.repeat(32);
const terms = (over: Partial<CacheTerms> = {}): CacheTerms => ({ bundleSha256: SHA, node: 'v20.20.2', arch: 'x64', flags: '|--expose-gc', role: 'run', ...over });
const euid = process.geteuid!();

function tmpdir(t: Test): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-cc-'));
  t.teardown(() => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

t.test('the directory: LB_AGENT_CODE_CACHE, then systemd\'s CACHE_DIRECTORY, then /var/cache/lb-agent for root only', async (t) => {
  t.same(cacheDirFrom({ LB_AGENT_CODE_CACHE: '/srv/cc', CACHE_DIRECTORY: '/var/cache/x' }, 0), { dir: '/srv/cc' });
  t.same(cacheDirFrom({ LB_AGENT_CODE_CACHE: 'off', CACHE_DIRECTORY: '/var/cache/x' }, 0), { off: 'LB_AGENT_CODE_CACHE=off' });
  t.match(cacheDirFrom({ LB_AGENT_CODE_CACHE: 'cc' }, 0), { off: /not an absolute path/ }, 'a relative directory is refused, not resolved against a cwd');
  t.same(cacheDirFrom({ CACHE_DIRECTORY: '/var/cache/lb-agent:/var/cache/other' }, 998), { dir: '/var/cache/lb-agent' }, 'the first of systemd\'s directories');
  t.same(cacheDirFrom({}, 0), { dir: DEFAULT_CACHE_DIR });
  t.match(cacheDirFrom({}, 1000), { off: /not root/ }, 'another user gets none by default');
});

t.test('the key: a cache belongs to one bundle, Node, architecture, flag set and role', async (t) => {
  const base = cacheFileName(terms());
  t.match(base, /^run-abababababab-[0-9a-f]{8}\.v8cache$/);
  t.not(cacheFileName(terms({ flags: '|' })), base, 'other flags (V8 refuses a cache made under others): another file');
  t.not(cacheFileName(terms({ node: 'v20.20.3' })), base, 'another Node: another file');
  t.not(cacheFileName(terms({ role: 'cli' })), base, 'the daemon and the other commands keep one each');
  t.not(cacheFileName(terms({ bundleSha256: 'cd'.repeat(32) })), base, 'another build: another file');

  const data = Buffer.from('v8 data');
  const file = Buffer.concat([cacheHeader(terms()), data]);
  t.same(cachePayload(file, terms()), data, 'the payload after our header');
  // Same length, another content: V8 compares only the source's length, the header the hash.
  t.equal(cachePayload(file, terms({ bundleSha256: 'cd'.repeat(32) })), undefined, 'a cache of another bundle of the same length is not used');
  t.equal(cachePayload(file, terms({ flags: '|--expose-gc ' })), undefined, 'nor one whose terms differ in any way (a file name collision)');
  t.equal(cachePayload(cacheHeader(terms()), terms()), undefined, 'a header without a payload is nothing');
  t.equal(cachePayload(file.subarray(0, 10), terms()), undefined, 'a cut header is nothing');
  t.equal(cachePayload(Buffer.from('garbage\n'), terms()), undefined);
});

t.test('other builds\' files are the stale ones; files not named like ours are left alone', async (t) => {
  const ours = cacheFileName(terms());
  const cli = cacheFileName(terms({ role: 'cli' }));
  const old = cacheFileName(terms({ bundleSha256: 'cd'.repeat(32) }));
  t.same(staleCacheFiles([ours, cli, old, 'notes.txt', `${ours}.123.tmp`, 'run-cdcdcdcdcdcd-zz.v8cache'], terms()), [old]);
});

t.test('only a directory or file of our own that no one else may write', async (t) => {
  t.equal(notOurs({ uid: 0, mode: 0o40700 }, 0, 'directory'), undefined);
  t.equal(notOurs({ uid: 0, mode: 0o40755 }, 0, 'directory'), undefined, 'others may read (systemd makes CacheDirectory= 0755 unless told)');
  t.match(notOurs({ uid: 1000, mode: 0o40700 }, 0, 'directory'), /belongs to uid 1000, not 0/, 'root does not run code another user wrote');
  t.match(notOurs({ uid: 0, mode: 0o40775 }, 0, 'directory'), /writable by group or others \(mode 775\)/);
  t.match(notOurs({ uid: 0, mode: 0o100602 }, 0, 'file'), /file is writable by group or others/);
});

t.test('write then read: atomic, private, and the same bytes back', async (t) => {
  const dir = path.join(tmpdir(t), 'cache');
  t.same(readCodeCache(dir, terms(), euid), { state: 'absent' }, 'the directory is created, empty');
  t.equal(fs.statSync(dir).mode & 0o777, 0o700, 'created 0700');
  const data = Buffer.alloc(64 * 1024, 7);
  const w = writeCodeCache(dir, terms(), data);
  t.same(w, { bytes: cacheHeader(terms()).length + data.length });
  const file = path.join(dir, cacheFileName(terms()));
  t.equal(fs.statSync(file).mode & 0o777, 0o600, 'the file is 0600');
  t.same(fs.readdirSync(dir), [cacheFileName(terms())], 'no temporary file left');
  const r = readCodeCache(dir, terms(), euid);
  t.equal(r.state, 'found');
  t.ok(r.data?.equals(data), 'the payload read is the payload written');
  t.match(readCodeCache(dir, terms({ flags: '|' }), euid), { state: 'absent' }, 'another key reads nothing');

  // A cache of another build is removed when this build writes one of its own.
  const other = terms({ bundleSha256: 'cd'.repeat(32) });
  writeCodeCache(dir, other, data);
  t.same(fs.readdirSync(dir), [cacheFileName(other)], 'the other build\'s write removed ours');
  writeCodeCache(dir, terms(), data);
  writeCodeCache(dir, terms({ role: 'cli' }), data);
  t.same(fs.readdirSync(dir).sort(), [cacheFileName(terms({ role: 'cli' })), cacheFileName(terms())].sort(), 'and ours removed it: one build\'s files at a time');
});

t.test('anything not ours is not read', async (t) => {
  const root = tmpdir(t);
  const open = path.join(root, 'open');
  fs.mkdirSync(open);
  fs.chmodSync(open, 0o777);
  t.match(readCodeCache(open, terms(), euid), { state: 'off', reason: /open: the directory is writable by group or others \(mode 777\)/ });

  const dir = path.join(root, 'cache');
  readCodeCache(dir, terms(), euid);
  const file = path.join(dir, cacheFileName(terms()));
  const elsewhere = path.join(root, 'elsewhere');
  fs.writeFileSync(elsewhere, Buffer.concat([cacheHeader(terms()), Buffer.from('x')]));
  fs.symlinkSync(elsewhere, file);
  t.match(readCodeCache(dir, terms(), euid), { state: 'absent', reason: /ELOOP/ }, 'a symbolic link in place of the file is not followed');
  fs.rmSync(file);
  fs.writeFileSync(file, Buffer.concat([cacheHeader(terms()), Buffer.from('x')]), { mode: 0o644 });
  fs.chmodSync(file, 0o666);
  t.match(readCodeCache(dir, terms(), euid), { state: 'absent', reason: /writable by group or others/ });
  fs.chmodSync(file, 0o600);
  t.equal(readCodeCache(dir, terms(), euid).state, 'found');
  t.match(readCodeCache(dir, terms(), euid + 1), { state: 'off', reason: /belongs to uid/ }, 'another user\'s directory');

  const notDir = path.join(root, 'plain');
  fs.writeFileSync(notDir, '');
  t.match(readCodeCache(notDir, terms(), euid), { state: 'off', reason: /is not a directory/ });
  t.match(readCodeCache(path.join(notDir, 'sub'), terms(), euid), { state: 'off', reason: /cannot create/ });
});

t.test('a write that fails leaves nothing behind and says why', async (t) => {
  const dir = path.join(tmpdir(t), 'gone');
  const w = writeCodeCache(dir, terms(), Buffer.from('x'));
  t.match(w, { error: /ENOENT/ });
  t.notOk(fs.existsSync(dir));
});

t.test('flags too long for a header: no cache, said why, and nothing written at every start', async (t) => {
  const dir = tmpdir(t);
  const long = terms({ flags: `|${'--require=/opt/hooks/x.js '.repeat(90)}` });
  t.equal(headerProblem(terms()), undefined, 'ordinary flags fit');
  t.match(headerProblem(long), /runs to \d+ bytes, over the 2048/);
  t.match(readCodeCache(dir, long, euid), { state: 'off', reason: /over the 2048 a cache file's header may hold/ }, 'off with a reason, not a silent absent');
  t.match(writeCodeCache(dir, long, Buffer.from('v8 data')), { error: /over the 2048/ });
  t.same(fs.readdirSync(dir), [], 'no file: such a cache could never be read back');
});
