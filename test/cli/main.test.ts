// The lb-agent binary's contract: commands, exit codes (0 ok, 1 runtime
// failure, 2 usage or invalid config) and messages, run as a real process.
import t, { Test } from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawn } from 'node:child_process';
import { AGENT_BIN, agentCli } from '../../lab/agent';
import { ControlServer } from '../../agent/control/server';
import { silentLogger } from '../../agent/log';

const REPO = path.resolve(__dirname, '..', '..', '..');
const FIX = path.join(REPO, 'test', 'config', 'fixtures');

t.test('validate accepts the shipped examples', async (t) => {
  for (const f of [path.join(REPO, 'examples', 'config.yaml'), ...fs.readdirSync(path.join(FIX, 'good')).map((x) => path.join(FIX, 'good', x))]) {
    const r = await agentCli(undefined, undefined, ['validate', '--config', f]);
    t.equal(r.code, 0, `${f}: ${r.stderr}`);
    t.match(r.stdout, /: valid \(\d+ services?\)/);
  }
});

t.test('validate rejects bad fixtures with exit 2 and the field path', async (t) => {
  // Every fixture's message is checked in-process by test/config/load.test.ts
  // through loadConfigFile, which is what validate runs (readConfigText, then
  // parseConfigText). Here the process contract - exit 2, stderr naming the
  // file, line and message - over every sixth fixture in name order: a node
  // start each, ~0.4 s of CPU, and 58 of them were a minute of the suite.
  const all = fs.readdirSync(path.join(FIX, 'bad')).filter((f) => f.endsWith('.yaml')).sort();
  t.ok(all.length >= 20);
  const files = all.filter((_, i) => i % 6 === 0);
  // Four at a time: each is a node process start.
  const queue = [...files];
  const worker = async (): Promise<void> => { for (let f = queue.shift(); f; f = queue.shift()) await one(f); };
  const one = async (f: string): Promise<void> => {
    const file = path.join(FIX, 'bad', f);
    const expect = /^# expect: (.*)$/m.exec(fs.readFileSync(file, 'utf8'))![1]!;
    const r = await agentCli(undefined, undefined, ['validate', '--config', file]);
    t.equal(r.code, 2, `${f} exits 2`);
    t.ok(r.stderr.includes(expect), `${f}: stderr names ${JSON.stringify(expect)}; got ${r.stderr}`);
    t.ok(r.stderr.includes(`${file}:`), `${f}: stderr names the file and line`);
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
});

t.test('validate --json', async (t) => {
  const r = await agentCli(undefined, undefined, ['validate', '--json', '--config', path.join(FIX, 'bad', 'port-too-big.yaml')]);
  t.equal(r.code, 2);
  const doc = JSON.parse(r.stdout) as { ok: boolean; errors: { path: string; message: string; line: number }[] };
  t.equal(doc.ok, false);
  t.same(doc.errors[0], { path: 'services[0].ports[0].port', message: '70000 is not a port (1-65535)', line: 5 });
});

t.test('a missing config file is exit 2 naming the path', async (t) => {
  const r = await agentCli(undefined, undefined, ['validate', '--config', '/nonexistent/x.yaml']);
  t.equal(r.code, 2);
  t.match(r.stderr, 'cannot read /nonexistent/x.yaml: no such file');
});

t.test('bad usage is exit 2', async (t) => {
  for (const args of [['frobnicate'], ['validate', '--no-such-flag'], ['run', '--log-level', 'loud'], ['status', '--socket']]) {
    const r = await agentCli(undefined, undefined, args);
    t.equal(r.code, 2, `${args.join(' ')} exits 2`);
    t.ok(r.stderr.length > 0, 'and says why');
  }
});

t.test('run with an invalid config is exit 2 and says why', async (t) => {
  const r = await agentCli(undefined, undefined, ['run', '--config', path.join(FIX, 'bad', 'bad-dataplane.yaml')]);
  t.equal(r.code, 2);
  t.match(r.stderr, /dataplane: "ebpf" is not one of auto, kernel, proxy/);
});

t.test('version and help', async (t) => {
  const v = await agentCli(undefined, undefined, ['version']);
  t.equal(v.code, 0);
  const pkg = JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string };
  t.match(v.stdout, `lb-agent ${pkg.version}`);
  const j = await agentCli(undefined, undefined, ['version', '--json']);
  t.equal((JSON.parse(j.stdout) as { version: string }).version, pkg.version);
  const h = await agentCli(undefined, undefined, ['--help']);
  t.equal(h.code, 0);
  for (const c of ['run', 'validate', 'check', 'status', 'reload', 'version']) t.match(h.stdout, new RegExp(`\\b${c}\\b`));
});

// `lb-agent reload` against a control socket that answers as the daemon does
// (Daemon.reload's verdict); the real daemon behind systemd's ExecReload= is
// test/privileged/service-systemd.test.ts.
async function fakeDaemon(t: Test, verdict: () => unknown): Promise<{ socket: string; ops: string[] }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-reload-'));
  const socket = path.join(dir, 'agent.sock');
  const ops: string[] = [];
  const server = new ControlServer({
    socketPath: socket, log: silentLogger(),
    handler: async (op) => {
      ops.push(op);
      if (op === 'status') return { config: { path: '/etc/lb-agent/config.yaml' } };
      if (op !== 'reload') throw new Error(`unknown op ${op}`);
      await new Promise((r) => setTimeout(r, 50)); // the verdict comes later than the request
      return verdict();
    },
  });
  await server.start();
  t.teardown(async () => { await server.stop(); fs.rmSync(dir, { recursive: true, force: true }); });
  return { socket, ops };
}

t.test('reload: applied is exit 0 with the summary', async (t) => {
  const d = await fakeDaemon(t, () => ({ ok: true, message: 'reloaded: 1 added, 0 removed, 0 changed, 1 unchanged' }));
  const r = await agentCli(undefined, undefined, ['reload', '--socket', d.socket]);
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, 'lb-agent reloaded: 1 added, 0 removed, 0 changed, 1 unchanged\n');
  t.same(d.ops, ['reload']);
});

t.test('reload: refused is exit 2 with every error, its file, line and field path', async (t) => {
  const errors = [{ path: 'services[0].ports[0].port', message: '70000 is not a port (1-65535)', line: 5 }, { path: 'dataplane', message: '"ebpf" is not one of auto, kernel, proxy', line: 9 }];
  const message = 'reload rejected, running config kept:\n/etc/lb-agent/config.yaml:5: services[0].ports[0].port: 70000 is not a port (1-65535)\n/etc/lb-agent/config.yaml:9: dataplane: "ebpf" is not one of auto, kernel, proxy';
  const d = await fakeDaemon(t, () => ({ ok: false, message, errors }));
  const r = await agentCli(undefined, undefined, ['reload', '--socket', d.socket]);
  t.equal(r.code, 2);
  t.match(r.stderr, '/etc/lb-agent/config.yaml:5: services[0].ports[0].port: 70000 is not a port (1-65535)');
  t.match(r.stderr, '/etc/lb-agent/config.yaml:9: dataplane: "ebpf" is not one of auto, kernel, proxy');
  t.match(r.stderr, /running config kept/);
  t.match(r.stderr, /2 errors/);
  const j = await agentCli(undefined, undefined, ['reload', '--json', '--socket', d.socket]);
  t.equal(j.code, 2);
  t.same(JSON.parse(j.stdout), { ok: false, file: '/etc/lb-agent/config.yaml', message: 'reload rejected, running config kept:', errors });
});

t.test('reload: no daemon is exit 1 naming the socket', async (t) => {
  const r = await agentCli(undefined, undefined, ['reload', '--socket', '/nonexistent/agent.sock']);
  t.equal(r.code, 1);
  t.match(r.stderr, /cannot reach the agent at \/nonexistent\/agent\.sock: ENOENT/);
});

t.test('reload finds the socket in the config file, even in one that does not validate', async (t) => {
  const d = await fakeDaemon(t, () => ({ ok: false, message: 'reload rejected, running config kept:\nx:1: dataplane: bad', errors: [{ path: 'dataplane', message: 'bad', line: 1 }] }));
  const file = path.join(path.dirname(d.socket), 'config.yaml');
  // Invalid (dataplane), yet control.socket is readable: the daemon is reached and refuses.
  fs.writeFileSync(file, `control:\n  socket: ${d.socket}\ndataplane: ebpf\n`);
  const r = await agentCli(undefined, undefined, ['reload', '-c', file]);
  t.equal(r.code, 2, r.stderr);
  t.same(d.ops, ['reload']);
});

t.test('status --watch: a bad interval and --json are usage errors (exit 2)', async (t) => {
  const a = await agentCli(undefined, undefined, ['status', '--watch', '--interval', '0', '--socket', '/nonexistent.sock']);
  t.equal(a.code, 2);
  t.match(a.stderr, /seconds between 0\.1 and 3600/);
  const b = await agentCli(undefined, undefined, ['status', '--watch', '--json', '--socket', '/nonexistent.sock']);
  t.equal(b.code, 2);
  t.match(b.stderr, /--watch and --json do not go together.*\[LB_ERR_CLI_USAGE\]/);
});

/**
 * Runs the real bin with its stdout piped to a reader that takes `lines`
 * lines (0: none) and then closes its end, as `| head -n lines` does.
 */
function intoClosingReader(args: string[], lines: number): Promise<{ code: number | null; signal: string | null; stderr: string; read: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [AGENT_BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    let read = '';
    child.stderr.on('data', (d) => { stderr += d; });
    child.stdout.on('error', () => undefined);
    if (lines === 0) child.stdout.destroy();
    else {
      child.stdout.on('data', (d) => {
        read += d;
        if (read.split('\n').length > lines) { read = read.split('\n').slice(0, lines).join('\n'); child.stdout.destroy(); }
      });
    }
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`${args.join(' ')} did not end; stderr: ${stderr}`)); }, 20_000);
    child.on('error', reject);
    child.on('close', (code, signal) => { clearTimeout(timer); resolve({ code, signal, stderr, read }); });
  });
}

t.test('a reader that closes the pipe early: the command ends quietly with 0 (`status --json | head -1`)', async (t) => {
  // A status far larger than a pipe's buffer (64 KiB): the CLI is still writing when the reader goes.
  const services = Array.from({ length: 4000 }, (_, i) => ({ key: `default/svc-${i}`, vip: `10.0.${i >> 8}.${i & 255}`, backends: ['10.99.0.11', '10.99.0.12'] }));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-epipe-'));
  const socket = path.join(dir, 'agent.sock');
  const server = new ControlServer({ socketPath: socket, log: silentLogger(), handler: async () => ({ config: { path: '/etc/lb-agent/config.yaml' }, services }) });
  await server.start();
  t.teardown(async () => { await server.stop(); fs.rmSync(dir, { recursive: true, force: true }); });
  const r = await intoClosingReader(['status', '--json', '--socket', socket], 0);
  t.same([r.code, r.signal], [0, null], 'exit 0');
  t.equal(r.stderr, '', 'nothing on stderr: no EPIPE, no stack trace');
  const whole = await intoClosingReader(['status', '--json', '--socket', socket], 1);
  t.same(JSON.parse(whole.read), { config: { path: '/etc/lb-agent/config.yaml' }, services }, 'the document on one line, as the daemon sent it');
  // A reader gone before the first byte; and commands that print the generated pages.
  for (const args of [['man'], ['completion', 'bash'], ['--help'], ['version', '--json']]) {
    const g = await intoClosingReader(args, 0);
    t.same([g.code, g.signal, g.stderr], [0, null, ''], `${args.join(' ')} into a closed pipe: exit 0, stderr empty`);
  }
});
