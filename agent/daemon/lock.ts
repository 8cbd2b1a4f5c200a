// Single-instance lock under stateDir: a second `run` against the same state
// refuses to start while the first is alive. The lock file holds the owner's
// pid; O_EXCL creation makes taking it atomic, and a lock whose pid is dead
// is stale (a crash) and taken over - a crash never has to be cleaned by hand.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { LbError } from '../errors';

function alive(pid: number): boolean {
  try { process.kill(pid, 0); return true; } catch (e) { return (e as NodeJS.ErrnoException).code === 'EPERM'; }
}

export class InstanceLock {
  readonly file: string;
  private held = false;

  constructor(stateDir: string) {
    this.file = path.join(stateDir, 'lb-agent.lock');
  }

  acquire(): void {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const fd = fs.openSync(this.file, 'wx', 0o600);
        fs.writeSync(fd, `${process.pid}\n`);
        fs.fsyncSync(fd);
        fs.closeSync(fd);
        this.held = true;
        return;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') {
          throw new LbError('LB_ERR_DAEMON_START', `cannot create lock file ${this.file}: ${(e as Error).message}`, undefined, { cause: e });
        }
      }
      let owner = NaN;
      try { owner = Number(fs.readFileSync(this.file, 'utf8').trim()); } catch { /* vanished: retry */ }
      if (Number.isInteger(owner) && owner > 0 && owner !== process.pid && alive(owner)) {
        throw new LbError('LB_ERR_DAEMON_LOCKED', `another lb-agent (pid ${owner}) is running with state directory ${path.dirname(this.file)}; stop it first (systemctl stop lb-agent) or use another stateDir`, { pid: owner });
      }
      // Stale: the owner is gone. Remove and retry the exclusive create.
      try { fs.unlinkSync(this.file); } catch { /* raced with another taker */ }
    }
    throw new LbError('LB_ERR_DAEMON_LOCKED', `could not take lock file ${this.file}`);
  }

  /**
   * acquire(), waiting up to `ms` for a live owner to let go: a predecessor
   * that is handing over (`lb-agent run --replace`) releases the lock once
   * its address sources have stopped, and exits later.
   */
  async acquireWithin(ms: number, pollMs = 20): Promise<void> {
    const deadline = Date.now() + ms;
    for (;;) {
      try { this.acquire(); return; } catch (e) {
        if (!(e instanceof LbError && e.code === 'LB_ERR_DAEMON_LOCKED') || Date.now() >= deadline) throw e;
      }
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  release(): void {
    if (!this.held) return;
    this.held = false;
    try {
      const owner = Number(fs.readFileSync(this.file, 'utf8').trim());
      if (owner === process.pid) fs.unlinkSync(this.file);
    } catch { /* gone */ }
  }
}
