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
import { silentLogger } from '../../agent/log';
import { statusJsonArgs } from '../../agent/cli/status-json';
import { DEFAULT_CONFIG_PATH } from '../../agent/config/defaults';
import { ControlServer, JsonText } from '../../agent/control/server';

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

/**
 * Run a bin with node (Node's own flags first), asynchronously (the fake
 * daemon answers from this process's loop). Through env(1), which takes
 * NODE_OPTIONS off: the test runner puts its own preloads there in every
 * child it spawns, whatever env it is given.
 */
function runBinBytes(bin: string, args: string[], env: NodeJS.ProcessEnv, nodeFlags: string[] = []): Promise<{ code: number; stdout: Buffer; stderr: string }> {
  return new Promise((resolve) => {
    execFile('env', ['-u', 'NODE_OPTIONS', process.execPath, ...nodeFlags, bin, ...args], { encoding: 'buffer', env, timeout: 20_000, maxBuffer: 64 << 20 }, (e, stdout, stderr) => {
      resolve({ code: e ? (typeof e.code === 'number' ? e.code : -1) : 0, stdout, stderr: stderr.toString('utf8') });
    });
  });
}

async function runBin(bin: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  const r = await runBinBytes(bin, args, env);
  return { ...r, stdout: r.stdout.toString('utf8') };
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

t.test('status --json prints the daemon\'s document byte for byte, over many chunks and characters of several bytes', async (t) => {
  // Built as the daemon keeps it (JsonText): ~0.4 MB (seven socket reads and more), characters of 2 to 4 UTF-8 bytes throughout, so that chunk edges fall inside them.
  const text = JSON.stringify({ services: Array.from({ length: 6000 }, (_, i) => ({ key: `default/s${i}`, note: `${'é→\u{1F600}'.repeat(i % 7)} "q" \\ }\n` })) });
  const d = await fakeDaemon(t, new JsonText(text));
  const r = await runBinBytes(AGENT_BIN, ['status', '--json', '--socket', d.socket], process.env);
  t.same([r.code, r.stderr], [0, '']);
  t.ok(r.stdout.equals(Buffer.from(`${text}\n`, 'utf8')), `the document and a newline, ${r.stdout.length} bytes`);
});

/**
 * A preload that reports, as the process exits, the built-in modules Node
 * loaded (process.moduleLoadList) and the files required (require.cache).
 */
const REPORT_MODULES = `process.on('exit', () => { require('fs').writeFileSync(process.env.LBT_MODULES_OUT, JSON.stringify({ builtins: process.moduleLoadList, files: Object.keys(require.cache) })); });`;

t.test('the status --json path loads the control client and nothing of the CLI, the daemon or the config', async (t) => {
  const d = await fakeDaemon(t, DOC);
  const preload = path.join(d.dir, 'report-modules.js');
  fs.writeFileSync(preload, REPORT_MODULES);
  const loaded = async (args: string[]): Promise<{ builtins: string[]; files: string[] }> => {
    const out = path.join(d.dir, `modules-${args.length}.json`);
    const r = await runBinBytes(AGENT_BIN, args, { ...process.env, LBT_MODULES_OUT: out, LB_AGENT_CODE_CACHE: 'off' }, ['--require', preload]);
    t.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
    return JSON.parse(fs.readFileSync(out, 'utf8')) as { builtins: string[]; files: string[] };
  };
  const fast = await loaded(['status', '--json', '--socket', d.socket]);
  t.same(fast.files.sort(), [AGENT_BIN, preload].sort(), 'no file but the bin is required (cli.js is not read)');
  t.ok(fast.builtins.includes('NativeModule net'), 'the control client (net) is loaded');
  // What the CLI, the daemon, the config loader, pino or the code cache bring in.
  const never = ['vm', 'crypto', 'zlib', 'http', 'worker_threads', 'dgram', 'dns', 'child_process', 'readline', 'os'].map((m) => `NativeModule ${m}`);
  t.same(fast.builtins.filter((m) => never.includes(m)), [], `none of ${never.length} built-ins the rest of the agent uses`);
  // The same check on a command the full CLI answers: there it fails.
  const full = await loaded(['version']);
  t.ok(full.builtins.includes('NativeModule vm'), 'another command compiles the CLI bundle (vm)');
  t.ok(full.builtins.length > fast.builtins.length, `and loads more built-ins (${full.builtins.length}, status --json ${fast.builtins.length})`);
});
