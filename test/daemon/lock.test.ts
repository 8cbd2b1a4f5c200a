// The single-instance lock (agent/daemon/lock.ts): a second daemon on the
// same state directory is refused, naming the pid that holds it; a lock left
// by a dead process (a crash, a SIGKILL) is taken over without anyone
// cleaning up by hand. The holder is a real second process.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { InstanceLock } from '../../agent/daemon/lock';
import { isLbError } from '../../agent/errors';

const LOCK_JS = require.resolve('../../agent/daemon/lock');

function tmpdir(t: { teardown(fn: () => unknown): void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-lock-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Another process that takes the lock and holds it until killed. */
async function holder(t: { teardown(fn: () => unknown): void }, dir: string): Promise<ChildProcess> {
  const script = `
    const { InstanceLock } = require(${JSON.stringify(LOCK_JS)});
    new InstanceLock(${JSON.stringify(dir)}).acquire();
    process.stdout.write('held\\n');
    setTimeout(() => {}, 60000);
  `;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => { child.kill('SIGKILL'); });
  await new Promise<void>((resolve, reject) => {
    child.stdout.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`holder exited ${code}`)));
  });
  return child;
}

/** The pid of a process that has exited. */
function deadPid(): number {
  const r = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))'], { encoding: 'utf8' });
  return Number(r.stdout);
}

t.test('a second instance is refused, naming the pid that holds the lock', async (t) => {
  const dir = tmpdir(t);
  const first = await holder(t, dir);
  const lock = new InstanceLock(dir);
  let err: unknown;
  try { lock.acquire(); } catch (e) { err = e; }
  t.ok(isLbError(err), 'an LbError');
  t.match(err, {
    code: 'LB_ERR_DAEMON_LOCKED',
    message: `another lb-agent (pid ${first.pid}) is running with state directory ${dir}; stop it first`,
    details: { pid: first.pid },
  });
  t.equal(fs.readFileSync(lock.file, 'utf8'), `${first.pid}\n`, 'the holder keeps its lock');
  lock.release();
  t.ok(fs.existsSync(lock.file), "release() of a lock not taken leaves the holder's file");
});

t.test('a lock left by a dead process is taken over', async (t) => {
  const dir = tmpdir(t);
  const dead = deadPid();
  const lock = new InstanceLock(dir);
  fs.writeFileSync(lock.file, `${dead}\n`);
  lock.acquire();
  t.equal(fs.readFileSync(lock.file, 'utf8'), `${process.pid}\n`, `taken over from dead pid ${dead}`);
  t.equal(fs.statSync(lock.file).mode & 0o777, 0o600);
  lock.release();
  t.notOk(fs.existsSync(lock.file), 'released: the file is gone');
});

t.test('a holder that is killed leaves a lock the next start takes', async (t) => {
  const dir = tmpdir(t);
  const first = await holder(t, dir);
  const exited = new Promise((r) => first.once('exit', r));
  first.kill('SIGKILL');
  await exited;
  t.equal(fs.readFileSync(path.join(dir, 'lb-agent.lock'), 'utf8'), `${first.pid}\n`, 'the killed holder left its lock');
  const lock = new InstanceLock(dir);
  lock.acquire();
  t.equal(fs.readFileSync(lock.file, 'utf8'), `${process.pid}\n`);
  lock.release();
});

t.test('a lock file with garbage in it is stale', async (t) => {
  const dir = tmpdir(t);
  const lock = new InstanceLock(dir);
  for (const text of ['', 'not a pid\n', '-1\n', '0\n']) {
    fs.writeFileSync(lock.file, text);
    lock.acquire();
    t.equal(fs.readFileSync(lock.file, 'utf8'), `${process.pid}\n`, `taken over from ${JSON.stringify(text)}`);
    lock.release();
  }
});

t.test('release() leaves a lock another process took over', async (t) => {
  const dir = tmpdir(t);
  const lock = new InstanceLock(dir);
  lock.acquire();
  // Someone removed our file and another agent took the lock (an operator's rm).
  fs.writeFileSync(lock.file, `${process.ppid}\n`);
  lock.release();
  t.equal(fs.readFileSync(lock.file, 'utf8'), `${process.ppid}\n`, "the other agent's lock stays");
});

t.test('a missing state directory cannot be locked: the error names the lock file', async (t) => {
  const dir = tmpdir(t);
  const lock = new InstanceLock(path.join(dir, 'missing'));
  t.throws(() => lock.acquire(), { code: 'LB_ERR_DAEMON_START', message: new RegExp(`cannot create lock file ${path.join(dir, 'missing', 'lb-agent.lock')}`) });
});
