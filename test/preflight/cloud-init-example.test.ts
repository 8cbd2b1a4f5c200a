// examples/cloud-init/user-data.yaml: valid for cloud-init's own schema, it
// installs and starts qemu-guest-agent (as Harvester's docs require), writes
// a config lb-agent accepts and the sysctls the preflight asks for, and
// enables lb-agent only when `lb-agent check` passes.
import t from 'tap';
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { load as parse } from 'js-yaml';
import { parseConfigText } from '../../agent/config/load';
import { checkArpSysctls, checkRpFilter, checkIpForward } from '../../agent/preflight/checks';
import type { Facts } from '../../agent/preflight/facts';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const FILE = path.join(ROOT, 'examples', 'cloud-init', 'user-data.yaml');
const text = fs.readFileSync(FILE, 'utf8');

interface WriteFile { path: string; content: string; permissions?: string }
interface UserData { packages: string[]; write_files: WriteFile[]; runcmd: (string | string[])[] }
const doc = parse(text) as UserData;
const written = (p: string): WriteFile => {
  const f = doc.write_files.find((w) => w.path === p);
  if (!f) throw new Error(`${p} is not written`);
  return f;
};
const ENABLE = '/var/lib/cloud/scripts/per-boot/lb-agent-enable.sh';

t.test('cloud-init schema --config-file accepts it', async (t) => {
  const which = spawnSync('sh', ['-c', 'command -v cloud-init']);
  if (which.status !== 0) { t.plan(0, 'skip: cloud-init is not installed'); return; }
  const r = spawnSync('cloud-init', ['schema', '--config-file', FILE], { encoding: 'utf8', timeout: 60_000 });
  t.equal(r.status, 0, `${r.stdout}${r.stderr}`);
  t.match(r.stdout, /Valid cloud-config/);
});

t.test('qemu-guest-agent installed and started, as Harvester documents', async (t) => {
  t.ok(text.startsWith('#cloud-config\n'));
  t.ok(doc.packages.includes('qemu-guest-agent'));
  t.ok(doc.runcmd.some((c) => Array.isArray(c) && c.join(' ') === 'systemctl enable --now qemu-guest-agent.service'));
});

t.test('installs lb-agent with systemd/install.sh, then the gate runs', async (t) => {
  const flat = doc.runcmd.map((c) => (Array.isArray(c) ? c.join(' ') : c));
  const install = flat.findIndex((c) => c.includes('systemd/install.sh'));
  const gate = flat.findIndex((c) => c.includes(ENABLE));
  t.ok(install >= 0, 'install step');
  t.ok(gate > install, 'check-and-enable after the install');
});

t.test('the written config loads', async (t) => {
  const r = parseConfigText(written('/etc/lb-agent/config.yaml').content, 'vm');
  t.ok(r.ok, r.ok ? 'valid' : JSON.stringify(r.errors));
});

t.test('the written sysctls satisfy the preflight', async (t) => {
  const sysctls: Record<string, string> = {};
  for (const line of written('/etc/sysctl.d/90-lb-agent.conf').content.split('\n')) {
    const m = /^\s*([\w.]+)\s*=\s*(\S+)\s*$/.exec(line);
    if (m) sysctls[m[1]!] = m[2]!;
  }
  // The per-interface values a fresh NIC has: 0 everywhere.
  for (const k of ['arp_ignore', 'arp_announce', 'rp_filter']) sysctls[`net.ipv4.conf.eth0.${k}`] = '0';
  const facts = JSON.parse(fs.readFileSync(path.join(ROOT, 'test', 'preflight', 'fixtures', 'healthy.json'), 'utf8')) as Facts;
  facts.sysctls = sysctls;
  t.equal(checkArpSysctls(facts).status, 'pass');
  t.equal(checkRpFilter(facts).status, 'pass');
  t.equal(checkIpForward(facts).status, 'pass');
});

t.test('the gate enables lb-agent only when the check passes', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbchk-ci-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const bin = path.join(dir, 'bin');
  fs.mkdirSync(bin);
  const script = path.join(dir, 'lb-agent-enable.sh');
  fs.writeFileSync(script, written(ENABLE).content, { mode: 0o755 });
  t.equal(written(ENABLE).permissions, '0755');
  const calls = path.join(dir, 'calls');
  // Stubs: lb-agent exits with $CHECK_EXIT; systemctl logs its arguments and says "not enabled".
  fs.writeFileSync(path.join(bin, 'lb-agent'), `#!/bin/sh\necho "lb-agent $*" >> ${calls}\necho "verdict: stub"\nexit $CHECK_EXIT\n`, { mode: 0o755 });
  fs.writeFileSync(path.join(bin, 'systemctl'), `#!/bin/sh\necho "systemctl $*" >> ${calls}\n[ "$1" = is-enabled ] && exit 1\nexit 0\n`, { mode: 0o755 });
  const env = (code: number): NodeJS.ProcessEnv => ({ PATH: `${bin}:/usr/bin:/bin`, CHECK_EXIT: String(code) });
  // The script logs to /var/log/lb-agent-check.log; point it at the scratch dir.
  const local = script.replace(/\.sh$/, '.local.sh');
  fs.writeFileSync(local, fs.readFileSync(script, 'utf8').replaceAll('/var/log/lb-agent-check.log', path.join(dir, 'check.log')), { mode: 0o755 });

  const failed = spawnSync('/bin/sh', [local], { env: env(1), encoding: 'utf8' });
  t.equal(failed.status, 1, 'a failed check fails the step (cloud-init status reports it)');
  t.match(failed.stderr, /lb-agent\.service left disabled/);
  t.match(failed.stdout, /verdict: stub/, 'the check output reaches cloud-init-output.log');
  t.notMatch(fs.readFileSync(calls, 'utf8'), /systemctl enable/);
  t.match(fs.readFileSync(calls, 'utf8'), /lb-agent check --config \/etc\/lb-agent\/config\.yaml/);

  fs.writeFileSync(calls, '');
  const passed = spawnSync('/bin/sh', [local], { env: env(0), encoding: 'utf8' });
  t.equal(passed.status, 0);
  t.match(fs.readFileSync(calls, 'utf8'), /systemctl enable --now lb-agent\.service/);

  // Not installed yet (per-boot, before runcmd on the first boot): a quiet no-op.
  fs.rmSync(path.join(bin, 'lb-agent'));
  fs.writeFileSync(calls, '');
  const absent = spawnSync('/bin/sh', [local], { env: { PATH: bin }, encoding: 'utf8' });
  t.equal(absent.status, 0);
  t.equal(fs.readFileSync(calls, 'utf8'), '');
  t.ok(execFileSync('sh', ['-n', script]).length === 0, 'the script parses');
});
