// Persistent state under stateDir (leases, pool claims): JSON files written
// atomically - temp file in the same directory, fsync, rename, fsync the
// directory - so a crash leaves either the old or the new file, never half.
// writeAsync/removeAsync do the same off the event loop (what waits on the
// disk runs in libuv's thread pool: a synchronous save blocks the loop for
// milliseconds, once per DHCP lease at start), in order per file name, and the renames
// done by the time a directory fsync starts share it.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbError } from '../errors';

const NAME = /^[A-Za-z0-9._-]{1,200}$/;

export class StateStore {
  readonly dir: string;
  /** Per file name: the last asynchronous write or remove, so the next one starts after it. */
  private readonly pending = new Map<string, Promise<void>>();
  /** The directory fsync not yet started: renames done before it starts are made durable by it. */
  private nextDirSync: Promise<void> | undefined;
  private readonly count = { fileSyncs: 0, dirSyncs: 0 };

  constructor(dir: string) {
    this.dir = dir;
  }

  /** Create the directory (0700) if needed; throws LB_ERR_STATE_WRITE naming the path when it cannot. */
  ensure(): void {
    try {
      fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      fs.accessSync(this.dir, fs.constants.W_OK);
    } catch (e) {
      throw new LbError('LB_ERR_STATE_WRITE', `state directory ${this.dir} is not writable: ${(e as Error).message}`, { path: this.dir }, { cause: e });
    }
  }

  private file(name: string): string {
    if (!NAME.test(name)) throw new LbError('LB_ERR_STATE_WRITE', `invalid state file name ${JSON.stringify(name)}`);
    return path.join(this.dir, name);
  }

  /** Read a JSON document; undefined when absent. A corrupt file is reported, not thrown past the caller's choice. */
  read<T>(name: string): T | undefined {
    const p = this.file(name);
    let text: string;
    try {
      text = fs.readFileSync(p, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw new LbError('LB_ERR_STATE_READ', `cannot read ${p}: ${(e as Error).message}`, { path: p }, { cause: e });
    }
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new LbError('LB_ERR_STATE_CORRUPT', `state file ${p} is not valid JSON; remove it to start fresh`, { path: p }, { cause: e });
    }
  }

  /** Write a JSON document atomically. */
  write(name: string, value: unknown): void {
    const p = this.file(name);
    const tmp = `${p}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
    const data = `${JSON.stringify(value, null, 2)}\n`;
    let fd: number | undefined;
    try {
      fd = fs.openSync(tmp, 'w', 0o600);
      fs.writeSync(fd, data);
      fs.fsyncSync(fd);
      fs.closeSync(fd);
      fd = undefined;
      fs.renameSync(tmp, p);
      const dfd = fs.openSync(this.dir, 'r');
      try { fs.fsyncSync(dfd); } finally { fs.closeSync(dfd); }
    } catch (e) {
      if (fd !== undefined) { try { fs.closeSync(fd); } catch { /* already failing */ } }
      try { fs.unlinkSync(tmp); } catch { /* not created */ }
      throw new LbError('LB_ERR_STATE_WRITE', `cannot write ${p}: ${(e as Error).message}`, { path: p }, { cause: e });
    }
  }

  /**
   * write(), with its waits off the event loop: the same temp file, fsync,
   * rename and directory fsync. Writes and removes of one name happen in the
   * order they were asked for (a later document is never overtaken by an
   * earlier one); do not mix them with the synchronous write()/remove() of
   * the same name. Rejects with LB_ERR_STATE_WRITE.
   *
   * The steps that can wait on the disk go to libuv's thread pool, each as
   * one plain callback request: the fsyncs, and the temp file's creation and
   * rename, which wait for the filesystem's journal while the other services'
   * fsyncs commit it (ext4: 0.2-0.4 ms each with 50 leases saved at once; on
   * the event loop that was ~7% of a 50-service start). The write
   * and close of a small file are page-cache work, done in place. Through
   * fs.promises each step was a round trip and a FileHandle, ~1 ms of the
   * loop per lease.
   */
  writeAsync(name: string, value: unknown): Promise<void> {
    return this.writeTextAsync(name, `${JSON.stringify(value, null, 2)}\n`);
  }

  /**
   * writeAsync of a document already serialized (JSON text the caller
   * built, e.g. from parts it keeps between writes): the same steps, the
   * same order per name. Rejects with LB_ERR_STATE_WRITE.
   */
  writeTextAsync(name: string, data: string): Promise<void> {
    const p = this.file(name);
    return this.inOrder(name, async () => {
      const tmp = `${p}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
      let fd: number | undefined;
      try {
        fd = await openFd(tmp);
        fs.writeFileSync(fd, data);
        await fsyncFd(fd);
        this.count.fileSyncs++;
        fs.closeSync(fd);
        fd = undefined;
        await renamePath(tmp, p);
        await this.syncDir();
      } catch (e) {
        if (fd !== undefined) { try { fs.closeSync(fd); } catch { /* already failing */ } }
        try { fs.unlinkSync(tmp); } catch { /* not created */ }
        throw new LbError('LB_ERR_STATE_WRITE', `cannot write ${p}: ${(e as Error).message}`, { path: p }, { cause: e });
      }
    });
  }

  /**
   * fsync of the directory for every writeAsync whose rename is done: one
   * sync, started on the next turn, serves all the renames finished before it
   * starts (a rename after its start waits for the next). 50 DHCP leases
   * saved at start were 50 directory syncs in the thread pool, each a journal
   * commit, each delaying a VIP that is served only once its lease is on disk.
   * Durability is the same: a write resolves only after a
   * directory sync that began after its rename.
   */
  private syncDir(): Promise<void> {
    this.nextDirSync ??= new Promise<void>((resolve) => setImmediate(resolve)).then(async () => {
      this.nextDirSync = undefined;
      const dfd = fs.openSync(this.dir, 'r');
      try { await fsyncFd(dfd); } finally { fs.closeSync(dfd); }
      this.count.dirSyncs++;
    });
    return this.nextDirSync;
  }

  /** fsyncs done by writeAsync so far: temp files and directory (a test reads that directory syncs are shared). */
  syncCounts(): { fileSyncs: number; dirSyncs: number } {
    return { ...this.count };
  }

  /** remove(), in order after this name's pending writeAsync calls. */
  removeAsync(name: string): Promise<void> {
    const p = this.file(name);
    return this.inOrder(name, async () => {
      try {
        await fs.promises.unlink(p);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'ENOENT') {
          throw new LbError('LB_ERR_STATE_WRITE', `cannot remove ${p}: ${(e as Error).message}`, { cause: e });
        }
      }
    });
  }

  /** Resolves once every writeAsync/removeAsync of `name` asked for so far has finished (failed ones too). */
  settled(name: string): Promise<void> {
    return this.pending.get(name) ?? Promise.resolve();
  }

  private inOrder(name: string, fn: () => Promise<void>): Promise<void> {
    const run = (this.pending.get(name) ?? Promise.resolve()).then(fn);
    const tail = run.then(() => undefined, () => undefined);
    this.pending.set(name, tail);
    void tail.then(() => { if (this.pending.get(name) === tail) this.pending.delete(name); });
    return run;
  }

  remove(name: string): void {
    try {
      fs.unlinkSync(this.file(name));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') {
        throw new LbError('LB_ERR_STATE_WRITE', `cannot remove ${this.file(name)}: ${(e as Error).message}`, { cause: e });
      }
    }
  }

  list(prefix = ''): string[] {
    try {
      return fs.readdirSync(this.dir).filter((f) => f.startsWith(prefix) && !f.includes('.tmp-'));
    } catch {
      return [];
    }
  }
}

/** fsync(2) in libuv's thread pool. */
function fsyncFd(fd: number): Promise<void> {
  return new Promise((resolve, reject) => { fs.fsync(fd, (err) => (err ? reject(err) : resolve())); });
}

/** open(2) of a new temp file (0600) in libuv's thread pool. */
function openFd(file: string): Promise<number> {
  return new Promise((resolve, reject) => { fs.open(file, 'w', 0o600, (err, fd) => (err ? reject(err) : resolve(fd))); });
}

/** rename(2) in libuv's thread pool. */
function renamePath(from: string, to: string): Promise<void> {
  return new Promise((resolve, reject) => { fs.rename(from, to, (err) => (err ? reject(err) : resolve())); });
}
