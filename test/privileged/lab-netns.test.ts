// lab/netns.ts: a lab's children run as they would outside the test runner.
// tap puts its module loaders into NODE_OPTIONS and, through its spawn hook,
// into every process a test spawns; an agent started that way loads every
// module (and every worker thread's) through a hooks thread. Both ways a lab
// starts a process (exec, spawn) must hand on the NODE_OPTIONS asked for and
// none of tap's.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';

const PRINT = 'process.stdout.write(JSON.stringify({ opts: process.env.NODE_OPTIONS ?? null, loaders: process.execArgv.filter((a) => /^--(import|loader|experimental-loader)/.test(a)) }))';

t.test('lab children get no test-runner loaders', async (t) => {
  if (!requirePrivileged(t)) return;
  t.match(process.env.NODE_OPTIONS ?? '', /@tapjs\//, 'this test runs under tap\'s loaders (else it proves nothing)');
  const lab = await createLab(t);
  const ns = await lab.addHost('h');

  const plain = JSON.parse((await lab.exec(ns, process.execPath, ['-e', PRINT])).stdout) as { opts: string | null; loaders: string[] };
  t.equal(plain.opts, null, `exec: no NODE_OPTIONS left (${plain.opts})`);
  t.same(plain.loaders, [], 'exec: no loader in execArgv');

  const child = lab.spawn(ns, process.execPath, ['-e', PRINT], { env: { ...process.env, NODE_OPTIONS: `${process.env.NODE_OPTIONS} --v8-pool-size=1` } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
  await new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const asked = JSON.parse(out) as { opts: string | null };
  t.equal(asked.opts, '--v8-pool-size=1', 'spawn: the NODE_OPTIONS asked for, without tap\'s');
});
