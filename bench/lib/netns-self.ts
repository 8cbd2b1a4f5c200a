// Runs this bench script again inside a network namespace of its own
// (`ip netns exec`, whose mount namespace also keeps a BPF file system
// mounted there private), writes its stdout to --out where given, and
// removes the namespace. The inner run is told by an environment variable.
import * as fs from 'node:fs';
import { execFileSync, spawnSync } from 'node:child_process';

/** True in the inner run; otherwise runs `script` again in a namespace named `${prefix}-<pid>` and returns false. */
export function inOwnNetns(script: string, prefix: string, flag: string): boolean {
  if (process.env[flag] === '1') return true;
  const ns = `${prefix}-${process.pid}`;
  execFileSync('ip', ['netns', 'add', ns]);
  try {
    const r = spawnSync('ip', ['netns', 'exec', ns, process.execPath, script, ...process.argv.slice(2)], { env: { ...process.env, [flag]: '1' }, encoding: 'utf8', timeout: 600_000 });
    if (r.status !== 0) throw new Error(`the measurement failed: ${r.stderr}`);
    const i = process.argv.indexOf('--out');
    if (i >= 0 && process.argv[i + 1]) fs.writeFileSync(process.argv[i + 1]!, r.stdout);
    process.stdout.write(r.stdout);
  } finally {
    execFileSync('ip', ['netns', 'del', ns]);
  }
  return false;
}
