// examples/cloud-init/user-data.yaml, the install side (the config, sysctls
// and the check gate are covered by test/preflight/cloud-init-example.test.ts):
// nothing is downloaded but distribution packages, lb-agent comes from the
// image's /opt/lb-agent through systemd/install.sh without enabling the
// service (the gate does that after `lb-agent check`), and the install step
// as written runs (against this checkout, into a scratch root).
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { load as parse } from 'js-yaml';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const FILE = path.join(ROOT, 'examples', 'cloud-init', 'user-data.yaml');
const doc = parse(fs.readFileSync(FILE, 'utf8')) as { packages: string[]; runcmd: (string | string[])[]; write_files: { path: string; content: string }[] };
const commands = doc.runcmd.map((c) => (Array.isArray(c) ? c.join(' ') : c));
const installStep = doc.runcmd.find((c) => Array.isArray(c) && c.join(' ').includes('systemd/install.sh')) as string[] | undefined;

t.test('nothing is fetched from the network but packages', async (t) => {
  const executed = [...commands, ...doc.write_files.map((f) => f.content.split('\n').filter((l) => !l.trim().startsWith('#')).join('\n'))].join('\n');
  t.notMatch(executed, /\b(curl|wget)\b/, 'no curl or wget');
  t.notMatch(executed, /https?:\/\//, 'no URL in a command or a written file');
  t.ok(doc.packages.includes('nodejs'), 'Node.js from the distribution');
  t.ok(doc.packages.includes('qemu-guest-agent'));
});

t.test('install from /opt/lb-agent, without enabling', async (t) => {
  t.ok(installStep, 'an install step');
  const cmd = installStep!.join(' ');
  t.match(cmd, /bash \/opt\/lb-agent\/systemd\/install\.sh --no-enable/, 'the image\'s copy, --no-enable (the gate enables)');
  t.notMatch(cmd, /--no-start\b/, 'not --no-start, which enables the unit before the check');
  const last = commands[commands.length - 1]!;
  t.match(last, /lb-agent-enable\.sh/, 'the gate is the last runcmd entry: its status is cloud-init\'s');
});

t.test('the install step runs as written', { skip: !fs.existsSync(path.join(ROOT, 'dist', 'bundle', 'lb-agent.js')) && 'build first' }, async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-agent-ci-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  // The step's shell, with /opt/lb-agent pointing at this checkout and the
  // install going into a scratch root instead of /.
  const script = installStep![installStep!.length - 1]!;
  const asIs = (opt: string): string => `${script.replaceAll('/opt/lb-agent', opt)} --root ${dir}`;
  const ok = spawnSync('sh', ['-c', asIs(ROOT)], { encoding: 'utf8', timeout: 60_000 });
  t.equal(ok.status, 0, `${ok.stdout}${ok.stderr}`);
  t.ok(fs.existsSync(path.join(dir, 'usr', 'bin', 'lb-agent')), 'installed');
  const missing = spawnSync('sh', ['-c', asIs(path.join(dir, 'nothing'))], { encoding: 'utf8', timeout: 60_000 });
  t.equal(missing.status, 1, 'an image without /opt/lb-agent fails the step');
  t.match(missing.stderr, /is missing from this image/);
});
