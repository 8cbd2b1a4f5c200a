// The lb-agent binary's contract: commands, exit codes (0 ok, 1 runtime
// failure, 2 usage or invalid config) and messages, run as a real process.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { agentCli } from '../helpers/agent';

const REPO = path.resolve(__dirname, '..', '..', '..');
const FIX = path.join(REPO, 'test', 'config', 'fixtures');

t.test('validate accepts the shipped examples', async (t) => {
  for (const f of [path.join(REPO, 'examples', 'config.yaml'), ...fs.readdirSync(path.join(FIX, 'good')).map((x) => path.join(FIX, 'good', x))]) {
    const r = await agentCli(undefined, undefined, ['validate', '--config', f]);
    t.equal(r.code, 0, `${f}: ${r.stderr}`);
    t.match(r.stdout, /: valid \(\d+ services?\)/);
  }
});

t.test('validate rejects every bad fixture with exit 2 and the field path', async (t) => {
  const files = fs.readdirSync(path.join(FIX, 'bad')).filter((f) => f.endsWith('.yaml'));
  t.ok(files.length >= 20);
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
  for (const c of ['run', 'validate', 'check', 'status', 'version']) t.match(h.stdout, new RegExp(`\\b${c}\\b`));
});
