// HAProxy as a health checker only, for the health benches (bench/health.ts,
// bench/https-probe.ts): one thread, one backend whose servers it checks,
// and a frontend on a unix socket nobody uses (HAProxy refuses to run
// without a listener). Started in the caller's namespace, its config in a
// temporary directory removed at stop.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { within } from '../../lab/within';

export interface CheckingHaproxyOptions {
  /** `mode tcp` for L4 checks, `http` for httpchk. */
  readonly mode: 'tcp' | 'http';
  readonly timeoutCheckMs: number;
  /** Lines of the checks backend before its servers (options, default-server). */
  readonly backend: readonly string[];
  /** `address:port` of each server checked. */
  readonly servers: readonly string[];
}

export interface CheckingHaproxy {
  readonly proc: ChildProcess;
  /** The last 4 KiB it wrote on stderr (its warnings, "Server ... is DOWN"). */
  stderr(): string;
  /** Throws, with its stderr, when it has exited. */
  assertRunning(): void;
  stop(): Promise<void>;
}

export function startCheckingHaproxy(o: CheckingHaproxyOptions): CheckingHaproxy {
  const dir = mkdtempSync(join(tmpdir(), 'lbagent-bench-haproxy-'));
  const cfg = join(dir, 'haproxy.cfg');
  writeFileSync(cfg, [
    'global', '  nbthread 1', '  maxconn 4096',
    'defaults', `  mode ${o.mode}`, '  timeout connect 3s', '  timeout client 30s', '  timeout server 30s', `  timeout check ${o.timeoutCheckMs}ms`,
    'frontend idle', `  bind unix@${join(dir, 'idle.sock')}`, '  default_backend checks',
    'backend checks', ...o.backend.map((l) => `  ${l}`),
    ...o.servers.map((s, i) => `  server s${i} ${s}`),
    '',
  ].join('\n'));
  const proc = spawn('haproxy', ['-db', '-f', cfg], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d: Buffer) => { stderr = (stderr + d.toString()).slice(-4000); });
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  return {
    proc,
    stderr: () => stderr,
    assertRunning: () => { if (proc.exitCode !== null) throw new Error(`haproxy exited ${proc.exitCode}: ${stderr}`); },
    stop: async () => {
      proc.kill('SIGTERM');
      await within(exited, 3000);
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
