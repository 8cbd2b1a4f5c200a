// The README's first command: the demo runs to the end and leaves no
// namespace, link or process behind.
import t from 'tap';
import { spawn } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { requirePrivileged } from '../helpers/privileged';
import { distPath } from '../../lab/services';

t.test('the demo lab runs and cleans up', async (t) => {
  if (!requirePrivileged(t)) return;
  const proc = spawn(process.execPath, [distPath('lab', 'demo.js')], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => { out += d.toString(); });
  proc.stderr.on('data', (d: Buffer) => { out += d.toString(); });
  const code = await new Promise<number | null>((resolve) => {
    const timer = setTimeout(() => { proc.kill('SIGINT'); }, 90_000);
    proc.on('exit', (c) => { clearTimeout(timer); resolve(c); });
  });
  t.equal(code, 0, `demo exits 0\n${out}`);
  t.match(out, /DHCP lease 10\.99\.0\.\d+ on lbv/);
  t.match(out, /marked down after \d+ ms/);
  t.match(out, /overall: ready/);
  const left = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n').filter((l) => l.startsWith(`lbt${proc.pid}x`));
  t.same(left, [], 'no namespace of the demo is left');
});
