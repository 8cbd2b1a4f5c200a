// `lb-agent status --json` on the bin's own path (agent/cli/status-json.ts):
// which argument forms it takes, and, as a real process against a control
// socket that answers as the daemon does, that its output, exit codes and
// messages are the full CLI's and that it needs nothing of the CLI bundle.
import t, { Test } from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { execFile } from 'node:child_process';
import { AGENT_BIN, agentCli } from '../../lab/agent';
import { ControlServer } from '../../agent/control/server';
import { silentLogger } from '../../agent/log';
import { statusJsonArgs } from '../../agent/cli/status-json';
import { DEFAULT_CONFIG_PATH } from '../../agent/config/defaults';

t.test('the forms taken here, and those left to the full CLI', async (t) => {
  t.same(statusJsonArgs(['status', '--json']), { socket: undefined, config: DEFAULT_CONFIG_PATH });
  t.same(statusJsonArgs(['status', '--json', '--socket', '/s.sock']), { socket: '/s.sock', config: DEFAULT_CONFIG_PATH });
  t.same(statusJsonArgs(['status', '-s', '/s.sock', '--json']), { socket: '/s.sock', config: DEFAULT_CONFIG_PATH });
  t.same(statusJsonArgs(['status', '--socket=/s.sock', '--json', '--config=/c.yaml']), { socket: '/s.sock', config: '/c.yaml' });
  t.same(statusJsonArgs(['status', '--json', '-c', '/c.yaml']), { socket: undefined, config: '/c.yaml' });
  for (const args of [
    ['status'], ['status', '--socket', '/s.sock'], ['version', '--json'], ['status', '--json', '--watch'],
    ['status', '--json', '--help'], ['status', '--json', '--socket'], ['status', '--json', '--socket', '--json'],
    ['status', '--json', '--socket='], ['status', '--json', '--json'], ['status', '--json', '-s', '/a', '-s', '/b'],
    ['status', '--json', '--interval', '2'], ['status', '--json', 'extra'], ['status', '--json', '-s/s.sock'],
  ]) t.equal(statusJsonArgs(args), undefined, `${args.join(' ')}: the full CLI's`);
});

/** Run a bin with node, asynchronously (the fake daemon answers from this process's loop). */
function runBin(bin: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { encoding: 'utf8', env, timeout: 20_000 }, (e, stdout, stderr) => {
      resolve({ code: e ? (typeof e.code === 'number' ? e.code : -1) : 0, stdout, stderr });
    });
  });
}

async function fakeDaemon(t: Test, doc: unknown): Promise<{ dir: string; socket: string; ops: string[] }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-status-json-'));
  const socket = path.join(dir, 'agent.sock');
  const ops: string[] = [];
  const server = new ControlServer({ socketPath: socket, log: silentLogger(), handler: (op) => { ops.push(op); if (op !== 'status') throw new Error(`unknown op ${op}`); return doc; } });
  await server.start();
  t.teardown(async () => { await server.stop(); fs.rmSync(dir, { recursive: true, force: true }); });
  return { dir, socket, ops };
}

const DOC = { version: '0.1.0', config: { path: '/etc/lb-agent/config.yaml', generation: 3 }, services: [{ key: 'default/web', name: 'web', vip: '10.0.0.5', note: 'quote " and \\ and é' }] };

t.test('the same output as the full CLI, in every form that reaches the daemon', async (t) => {
  const d = await fakeDaemon(t, DOC);
  // --interval without --watch is accepted and unused by the full CLI: the same request, answered there.
  const full = await agentCli(undefined, undefined, ['status', '--json', '--socket', d.socket, '--interval', '2']);
  t.equal(full.code, 0, full.stderr);
  t.same(JSON.parse(full.stdout), DOC);
  const named = path.join(d.dir, 'named.yaml');
  fs.writeFileSync(named, `control:\n  socket: ${d.socket}\n`);
  for (const args of [['--socket', d.socket], [`--socket=${d.socket}`], ['-s', d.socket], ['--config', named]]) {
    const r = await agentCli(undefined, undefined, ['status', '--json', ...args]);
    t.same([r.code, r.stderr], [0, ''], args.join(' '));
    t.equal(r.stdout, full.stdout, `${args.join(' ')}: byte for byte the full CLI's`);
  }
  t.equal(d.ops.length, 5, 'one status request each');
});

t.test('an unreachable daemon: the full CLI\'s message and exit 1, the socket from the config as the full CLI reads it', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-status-json-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const gone = path.join(dir, 'gone.sock');
  const a = await agentCli(undefined, undefined, ['status', '--json', '--socket', gone]);
  const b = await agentCli(undefined, undefined, ['status', '--json', '--socket', gone, '--interval', '2']);
  t.equal(a.code, 1);
  t.equal(a.stdout, '');
  t.equal(a.stderr, b.stderr, 'the full CLI\'s words');
  t.match(a.stderr, new RegExp(`cannot reach the agent at ${gone}: ENOENT.*\\[LB_ERR_CONTROL_UNREACHABLE\\]`));
  // A config that never says "control", and one that cannot be read: the default socket, as controlSocketOf decides.
  const plain = path.join(dir, 'plain.yaml');
  fs.writeFileSync(plain, 'node:\n  name: n1\n');
  for (const config of [plain, path.join(dir, 'absent.yaml'), dir]) {
    const r = await agentCli(undefined, undefined, ['status', '--json', '--config', config]);
    t.equal(r.code, 1, config);
    t.match(r.stderr, /cannot reach the agent at \/run\/lb-agent\/agent\.sock/, `${config}: the default socket`);
  }
});

t.test('status --json answers without the CLI bundle; every other form needs it', async (t) => {
  const d = await fakeDaemon(t, DOC);
  // The bin alone in a folder of its own: no cli.js beside it.
  const alone = path.join(d.dir, 'lb-agent.js');
  fs.copyFileSync(AGENT_BIN, alone);
  const env = { ...process.env, LB_AGENT_CODE_CACHE: 'off' };
  const fast = await runBin(alone, ['status', '--json', '--socket', d.socket], env);
  t.same([fast.code, fast.stderr], [0, ''], 'answered by the bin alone');
  t.same(JSON.parse(fast.stdout), DOC);
  const text = await runBin(alone, ['status', '--socket', d.socket], env);
  t.not(text.code, 0, 'the text form is the CLI bundle\'s');
  t.match(text.stderr, /cli\.js/, 'and it looked for it');
});
