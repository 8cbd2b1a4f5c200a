// The state store (agent/state/store.ts): leases, claims and health verdicts
// survive a crash at any moment. A write goes to a temp file, is fsynced,
// renamed over the old file, and the directory fsynced: a process killed
// between the write and the rename leaves the old file whole and readable.
// A file that cannot be read or parsed is an error naming the path.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { StateStore } from '../../agent/state/store';

const STORE_JS = require.resolve('../../agent/state/store');

function tmpdir(t: { teardown(fn: () => unknown): void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-store-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * Run a write of `value` in a child process with `prelude` run first (it may
 * wrap node:fs calls); returns how the child ended.
 */
function childWrite(dir: string, name: string, value: unknown, prelude: string): { status: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string } {
  const script = `
    const fs = require('node:fs');
    ${prelude}
    const { StateStore } = require(${JSON.stringify(STORE_JS)});
    new StateStore(${JSON.stringify(dir)}).write(${JSON.stringify(name)}, ${JSON.stringify(value)});
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

t.test('a document written is read back; absent is undefined; the file is private', async (t) => {
  const dir = path.join(tmpdir(t), 'state');
  const s = new StateStore(dir);
  s.ensure();
  t.equal(fs.statSync(dir).mode & 0o777, 0o700, 'the directory is 0700');
  t.equal(s.read('lease.json'), undefined, 'absent');
  s.write('lease.json', { address: '10.99.0.100', expires: 123 });
  t.same(s.read('lease.json'), { address: '10.99.0.100', expires: 123 });
  t.equal(fs.statSync(path.join(dir, 'lease.json')).mode & 0o777, 0o600, 'the file is 0600');
  s.write('lease.json', { address: '10.99.0.101' });
  t.same(s.read('lease.json'), { address: '10.99.0.101' }, 'overwritten whole');
  t.same(fs.readdirSync(dir), ['lease.json'], 'no temp file left after a write');
  s.remove('lease.json');
  s.remove('lease.json');
  t.equal(s.read('lease.json'), undefined, 'removed (twice is fine)');
});

t.test('a crash between the write and the rename leaves the old file readable', async (t) => {
  const dir = tmpdir(t);
  const s = new StateStore(dir);
  s.write('claim-default-api.json', { address: '10.99.0.200', generation: 1 });
  // The child writes the new document in full, fsyncs it, and is SIGKILLed
  // at the rename, as a crash at that instant would leave it.
  const r = childWrite(dir, 'claim-default-api.json', { address: '10.99.0.201', generation: 2 },
    "fs.renameSync = () => { process.kill(process.pid, 'SIGKILL'); };");
  t.equal(r.signal, 'SIGKILL', `the child died at the rename (${r.stderr})`);
  const temps = fs.readdirSync(dir).filter((f) => f.includes('.tmp-'));
  t.equal(temps.length, 1, 'the new document was written to a temp file');
  t.same(JSON.parse(fs.readFileSync(path.join(dir, temps[0]!), 'utf8')), { address: '10.99.0.201', generation: 2 }, 'in full');
  t.same(s.read('claim-default-api.json'), { address: '10.99.0.200', generation: 1 }, 'the old document is intact');
  t.same(s.list('claim-'), ['claim-default-api.json'], 'list() does not show the temp file');
  s.write('claim-default-api.json', { address: '10.99.0.202', generation: 3 });
  t.same(s.read('claim-default-api.json'), { address: '10.99.0.202', generation: 3 }, 'the next write succeeds');
});

t.test('a crash in the middle of writing the temp file leaves the old file readable', async (t) => {
  const dir = tmpdir(t);
  const s = new StateStore(dir);
  s.write('dhcp-default-web.json', { address: '10.99.0.100' });
  // Half the bytes reach the temp file, then the process dies.
  const r = childWrite(dir, 'dhcp-default-web.json', { address: '10.99.0.150', padding: 'x'.repeat(4096) }, `
    const write = fs.writeSync;
    fs.writeSync = (fd, data) => { write(fd, data.slice(0, data.length >> 1)); process.kill(process.pid, 'SIGKILL'); };`);
  t.equal(r.signal, 'SIGKILL', `the child died in the write (${r.stderr})`);
  t.same(s.read('dhcp-default-web.json'), { address: '10.99.0.100' }, 'the old document is intact');
});

t.test('the data is on disk before the rename, and the rename before the write returns', async (t) => {
  const dir = tmpdir(t);
  // The child records the order of the calls that make a write durable.
  const r = childWrite(dir, 'health.json', { 'default/web': { '10.99.0.11': 'up' } }, `
    const seen = [];
    const fds = new Map();
    const open = fs.openSync;
    fs.openSync = (p, ...rest) => { const fd = open(p, ...rest); fds.set(fd, require('node:path').basename(p).includes('.tmp-') ? 'temp' : p === ${JSON.stringify(dir)} ? 'dir' : p); return fd; };
    for (const name of ['writeSync', 'fsyncSync', 'closeSync']) {
      const f = fs[name];
      fs[name] = (fd, ...rest) => { seen.push(name + '(' + fds.get(fd) + ')'); return f(fd, ...rest); };
    }
    const rename = fs.renameSync;
    fs.renameSync = (a, b) => { seen.push('renameSync'); return rename(a, b); };
    process.on('exit', () => process.stdout.write(JSON.stringify(seen)));`);
  t.equal(r.status, 0, r.stderr);
  t.same(JSON.parse(r.stdout), [
    'writeSync(temp)', 'fsyncSync(temp)', 'closeSync(temp)', 'renameSync', 'fsyncSync(dir)', 'closeSync(dir)',
  ], 'write, fsync the file, rename, fsync the directory');
});

t.test('a corrupt file, an unreadable one and a bad name are errors that name the path', async (t) => {
  const dir = tmpdir(t);
  const s = new StateStore(dir);
  fs.writeFileSync(path.join(dir, 'claims.json'), '{"address": "10.99.0.2');
  t.throws(() => s.read<unknown>('claims.json'), { code: 'LB_ERR_STATE_CORRUPT', message: new RegExp(`state file ${path.join(dir, 'claims.json')} is not valid JSON; remove it`) });
  fs.mkdirSync(path.join(dir, 'lease.json'));
  t.throws(() => s.read<unknown>('lease.json'), { code: 'LB_ERR_STATE_READ', message: new RegExp(`cannot read ${path.join(dir, 'lease.json')}: .*EISDIR`) });
  t.throws(() => s.read<unknown>('../etc/passwd'), { code: 'LB_ERR_STATE_WRITE', message: /invalid state file name "\.\.\/etc\/passwd"/ });
  t.throws(() => s.write('a/b', {}), { code: 'LB_ERR_STATE_WRITE', message: /invalid state file name/ });
});

t.test('a write that cannot happen leaves nothing behind and names the file', async (t) => {
  const dir = tmpdir(t);
  const s = new StateStore(dir);
  s.write('health.json', { a: 1 });
  // A directory where the file should go: the rename fails after the temp file was written.
  fs.rmSync(path.join(dir, 'health.json'));
  fs.mkdirSync(path.join(dir, 'health.json'));
  fs.writeFileSync(path.join(dir, 'health.json', 'x'), '');
  t.throws(() => s.write('health.json', { a: 2 }), { code: 'LB_ERR_STATE_WRITE', message: new RegExp(`cannot write ${path.join(dir, 'health.json')}`) });
  t.same(fs.readdirSync(dir), ['health.json'], 'the temp file was removed');
});

t.test('ensure() refuses a state directory it cannot create', async (t) => {
  const dir = tmpdir(t);
  fs.writeFileSync(path.join(dir, 'file'), '');
  const s = new StateStore(path.join(dir, 'file', 'state'));
  t.throws(() => s.ensure(), { code: 'LB_ERR_STATE_WRITE', message: new RegExp(`state directory ${path.join(dir, 'file', 'state')} is not writable`) });
  t.same(new StateStore(path.join(dir, 'missing')).list(), [], 'list() of a missing directory is empty');
});

t.test('writeAsync: atomic like write(), and writes and removes of one name land in the order asked', async (t) => {
  const dir = tmpdir(t);
  const s = new StateStore(dir);
  s.write('dhcp-default-web.json', { address: '10.99.0.100' });
  // Asked for back to back without waiting: the last one wins, whatever the thread pool does first.
  const done = [
    s.writeAsync('dhcp-default-web.json', { address: '10.99.0.101', padding: 'x'.repeat(1 << 16) }),
    s.writeAsync('dhcp-default-web.json', { address: '10.99.0.102' }),
    s.removeAsync('dhcp-default-web.json'),
    s.writeAsync('dhcp-default-web.json', { address: '10.99.0.103' }),
    s.writeAsync('dhcp-default-api.json', { address: '10.99.0.110' }),
  ];
  await s.settled('dhcp-default-web.json');
  t.same(s.read('dhcp-default-web.json'), { address: '10.99.0.103' }, 'the last document asked for is the one on disk');
  await Promise.all(done);
  t.same(s.read('dhcp-default-api.json'), { address: '10.99.0.110' }, 'another name is written too');
  t.equal(fs.statSync(path.join(dir, 'dhcp-default-web.json')).mode & 0o777, 0o600, 'the file is 0600');
  await s.removeAsync('dhcp-default-web.json');
  await s.removeAsync('dhcp-default-web.json');
  t.equal(s.read('dhcp-default-web.json'), undefined, 'removed (twice is fine)');
  t.same(fs.readdirSync(dir), ['dhcp-default-api.json'], 'no temp file left');
  await t.resolves(s.settled('never-written.json'), 'settled() of a name never written resolves');
});

/**
 * A script for a child process: node:fs wrapped so that `seen` records the
 * store's file operations in order ('writeFile(temp)', 'sync(dir)',
 * 'renamed <name>' once a rename is done, ...), StateStore loaded, then `body`.
 */
function tracedStoreScript(dir: string, body: string): string {
  return `
    const fs = require('node:fs');
    const path = require('node:path');
    const seen = [];
    const what = new Map();
    const name = (p) => path.basename(p).includes('.tmp-') ? 'temp' : p === ${JSON.stringify(dir)} ? 'dir' : p;
    const openSync = fs.openSync;
    fs.openSync = (p, ...rest) => {
      const fd = openSync(p, ...rest);
      what.set(fd, name(p));
      return fd;
    };
    // The temp file is opened in the thread pool (fs.open with a callback).
    const open = fs.open;
    fs.open = (p, flags, mode, cb) => open(p, flags, mode, (err, fd) => { if (!err) what.set(fd, name(p)); cb(err, fd); });
    const writeFileSync = fs.writeFileSync;
    fs.writeFileSync = (f, ...rest) => { if (typeof f === 'number') seen.push('writeFile(' + what.get(f) + ')'); return writeFileSync(f, ...rest); };
    const fsync = fs.fsync;
    fs.fsync = (fd, cb) => { seen.push('sync(' + what.get(fd) + ')'); return fsync(fd, cb); };
    const closeSync = fs.closeSync;
    fs.closeSync = (fd) => { seen.push('close(' + what.get(fd) + ')'); return closeSync(fd); };
    const renameSync = fs.renameSync;
    fs.renameSync = (a, b) => { renameSync(a, b); seen.push('renamed ' + path.basename(b)); };
    const rename = fs.rename;
    fs.rename = (a, b, cb) => rename(a, b, (err) => { if (!err) seen.push('renamed ' + path.basename(b)); cb(err); });
    const { StateStore } = require(${JSON.stringify(STORE_JS)});
    ${body}`;
}

t.test('writeAsync: the data is synced before the rename, the directory after it; a failure names the file and leaves nothing', async (t) => {
  const dir = tmpdir(t);
  const script = tracedStoreScript(dir, `
    new StateStore(${JSON.stringify(dir)}).writeAsync('health.json', { a: 1 }).then(() => process.stdout.write(JSON.stringify(seen)));`);
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000 });
  t.equal(r.status, 0, r.stderr);
  t.same(JSON.parse(r.stdout), ['writeFile(temp)', 'sync(temp)', 'close(temp)', 'renamed health.json', 'sync(dir)', 'close(dir)'], 'write, fsync the file, rename, fsync the directory');

  const s = new StateStore(dir);
  fs.mkdirSync(path.join(dir, 'lease.json'));
  fs.writeFileSync(path.join(dir, 'lease.json', 'x'), '');
  await t.rejects(s.writeAsync('lease.json', { a: 2 }), { code: 'LB_ERR_STATE_WRITE', message: new RegExp(`cannot write ${path.join(dir, 'lease.json')}`) });
  t.same(fs.readdirSync(dir).sort(), ['health.json', 'lease.json'], 'the temp file was removed');
  await s.writeAsync('health.json', { a: 3 });
  t.same(s.read('health.json'), { a: 3 }, 'a failed write does not stop the next one');
  t.throws(() => s.writeAsync('../x', {}), { code: 'LB_ERR_STATE_WRITE', message: /invalid state file name/ });
});

t.test('writeAsync: writes that finish together share one directory fsync, and each resolves only after a sync begun after its rename', async (t) => {
  const dir = tmpdir(t);
  const script = tracedStoreScript(dir, `
    const s = new StateStore(${JSON.stringify(dir)});
    const names = Array.from({ length: 20 }, (_, i) => 'dhcp-default-s' + i + '.json');
    Promise.all(names.map((n, i) => s.writeAsync(n, { address: '10.99.0.' + (100 + i) }).then(() => seen.push('done ' + n))))
      .then(() => process.stdout.write(JSON.stringify({ seen, counts: s.syncCounts() })));`);
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000 });
  t.equal(r.status, 0, r.stderr);
  const { seen, counts } = JSON.parse(r.stdout) as { seen: string[]; counts: { fileSyncs: number; dirSyncs: number } };
  t.equal(counts.fileSyncs, 20, 'every temp file synced');
  t.equal(seen.filter((e) => e === 'sync(dir)').length, counts.dirSyncs, 'syncCounts counts the directory syncs');
  t.ok(counts.dirSyncs >= 1 && counts.dirSyncs < 20, `20 writes at once, ${counts.dirSyncs} directory syncs (one per write before)`);
  for (let i = 0; i < 20; i++) {
    const n = `dhcp-default-s${i}.json`;
    const renamed = seen.indexOf(`renamed ${n}`);
    const done = seen.indexOf(`done ${n}`);
    t.ok(renamed >= 0 && seen.slice(renamed, done).includes('sync(dir)'), `${n}: a directory sync begins between its rename and its resolve`);
  }
  const s = new StateStore(dir);
  t.same(s.read('dhcp-default-s7.json'), { address: '10.99.0.107' }, 'the files are there');
  t.same(fs.readdirSync(dir).filter((f) => f.includes('.tmp-')), [], 'no temp file left');
});
