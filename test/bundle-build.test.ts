// The production bundle (agent/bundle-build.ts, issue 18): what `npm run
// build` wrote to dist/bundle/ is what the sources bundle to now, each file
// stands alone (nothing of tsc's module tree is read when it runs), the CLI
// validates a config from it with the schema compiled in, and the worker
// bundles beside it do their work. The privileged tests run the agent itself
// from this bundle (lab/agent.ts AGENT_BIN); daemon-start holds its laziness.
import t from 'tap';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Worker } from 'node:worker_threads';
import { BUNDLE_DIR, BUNDLE_ENTRIES, buildBundles } from '../agent/bundle-build';

const ROOT = path.resolve(__dirname, '..', '..');
const CLI = path.join(BUNDLE_DIR, 'lb-agent.js');
const OBSERVER = path.join(__dirname, 'privileged', 'fixtures', 'start-observer.js');

t.test('the bundles the build wrote are what the sources bundle to now', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-bundle-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const files = await buildBundles(dir);
  t.same(files.map((f) => path.basename(f)).sort(), Object.keys(BUNDLE_ENTRIES).map((n) => `${n}.js`).sort());
  for (const f of files) {
    t.equal(fs.readFileSync(f, 'utf8'), fs.readFileSync(path.join(BUNDLE_DIR, path.basename(f)), 'utf8'), `${path.basename(f)}: dist/bundle is current (npm run build writes it)`);
  }
  t.ok(fs.statSync(CLI).mode & 0o111, 'lb-agent.js is executable');
  t.match(fs.readFileSync(CLI, 'utf8'), /^#!\/usr\/bin\/env node\n/, 'with its shebang');
});

t.test('the CLI runs from the bundle alone, with the compiled schema inside', async (t) => {
  const observed = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'lb-bundle-')), 'observed.json');
  t.teardown(() => fs.rmSync(path.dirname(observed), { recursive: true, force: true }));
  const ok = spawnSync(process.execPath, ['--require', OBSERVER, CLI, 'validate', '-c', path.join(ROOT, 'examples', 'config.yaml')],
    { encoding: 'utf8', timeout: 30_000, env: { ...process.env, NODE_OPTIONS: '', LB_TEST_OBSERVE: observed } });
  t.equal(ok.status, 0, ok.stderr);
  t.match(ok.stdout, /valid \(\d+ services\)/);
  const o = JSON.parse(fs.readFileSync(observed, 'utf8')) as { modules: string[] };
  t.ok(o.modules.includes(CLI), 'the bundle was loaded');
  t.same(o.modules.filter((m) => m !== CLI && m !== OBSERVER && !m.includes('/node_modules/')), [], 'no other file of the tree: the validator is inside the bundle');
  t.same(o.modules.filter((m) => /node_modules\/(yaml|pino|commander|ajv)\//.test(m)), [], 'yaml, pino, commander and ajv are inside it too');

  const bad = path.join(path.dirname(observed), 'bad.yaml');
  fs.writeFileSync(bad, 'services:\n  - name: a\n    ports: [{ port: 80 }]\n    backends: [10.0.0.300]\n');
  const r = spawnSync(process.execPath, [CLI, 'validate', '-c', bad], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, NODE_OPTIONS: '' } });
  t.equal(r.status, 2, 'an invalid config is a usage error');
  t.match(r.stdout + r.stderr, /bad\.yaml:4.*services\[0\]\.backends\[0\]/, 'the error names file, line and field');
});

t.test('the bin compiles cli.js with the code cache of the last run, and writes one when it has none to take', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-bundle-cc-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const cc = path.join(dir, 'cc');
  const validate = (): void => {
    const r = spawnSync(process.execPath, [CLI, 'validate', '-c', path.join(ROOT, 'examples', 'config.yaml')],
      { encoding: 'utf8', timeout: 30_000, env: { ...process.env, NODE_OPTIONS: '', LB_AGENT_CODE_CACHE: cc } });
    t.equal(r.status, 0, r.stderr);
    t.match(r.stdout, /valid \(\d+ services\)/, 'cli.js ran');
  };
  validate();
  const files = fs.readdirSync(cc);
  const sha = crypto.createHash('sha256').update(fs.readFileSync(path.join(BUNDLE_DIR, 'cli.js'))).digest('hex');
  t.equal(files.length, 1, `one cache file: ${files.join(', ')}`);
  const file = path.join(cc, files[0]!);
  t.match(files[0], new RegExp(`^cli-${sha.slice(0, 12)}-[0-9a-f]{8}\\.v8cache$`), 'named for the "cli" role and this build of cli.js');
  t.match(fs.readFileSync(file).subarray(0, 200).toString('latin1'), new RegExp(`^LBCC1 \\["${sha}"`), 'its header carries cli.js\'s whole hash');
  t.ok(fs.statSync(file).size > 100_000, `it holds what the run compiled (${fs.statSync(file).size} bytes)`);

  // Taken: the bin writes a cache only when V8 did not take the one it found
  // (a refused or missing one), so a file left as it was is one V8 took.
  const first = fs.statSync(file);
  validate();
  t.equal(fs.statSync(file).ino, first.ino, 'the second run took the cache (the file was not written again)');

  // V8 refuses data that is not its own; the bin runs from source and writes a good one.
  const header = fs.readFileSync(file).subarray(0, fs.readFileSync(file).indexOf(10) + 1);
  fs.writeFileSync(file + '.x', Buffer.concat([header, Buffer.alloc(first.size - header.length, 0x5a)]), { mode: 0o600 });
  fs.renameSync(file + '.x', file);
  const spoilt = fs.statSync(file).ino;
  validate();
  t.not(fs.statSync(file).ino, spoilt, 'a cache V8 refused was written again');
  const again = fs.statSync(file).ino;
  validate();
  t.equal(fs.statSync(file).ino, again, 'and the next run took the new one');
});

t.test('the parse worker bundle parses a config as the daemon\'s reload does', async (t) => {
  const text = 'pools: { cidr-global: 10.0.0.96/28 }\nservices: [{ name: a, ports: [{ port: 80 }], backends: [10.0.0.1] }]\n';
  const result = await new Promise<{ ok: boolean; config?: { services: { healthCheck: { periodSeconds: number } }[] } }>((resolve, reject) => {
    const w = new Worker(path.join(BUNDLE_DIR, 'parse-worker.js'), { workerData: { text } });
    w.once('message', resolve);
    w.once('error', reject);
  });
  t.equal(result.ok, true);
  t.equal(result.config?.services[0]?.healthCheck.periodSeconds, 5, 'defaults applied by the compiled schema');
});
