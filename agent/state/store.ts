// Persistent state under stateDir (leases, pool claims): JSON files written
// atomically - temp file in the same directory, fsync, rename, fsync the
// directory - so a crash leaves either the old or the new file, never half.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbError } from '../errors';

const NAME = /^[A-Za-z0-9._-]{1,200}$/;

export class StateStore {
  readonly dir: string;

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
