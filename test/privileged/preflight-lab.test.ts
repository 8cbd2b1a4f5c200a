// `lb-agent check` on a real kernel: inside a lab namespace whose eth0 is the
// parent, the macvlan test really creates (and deletes) a macvlan and the
// check passes; without CAP_NET_ADMIN and CAP_NET_RAW it fails and names
// both; and nothing in the namespace is left changed.
import t from 'tap';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, run, type Lab } from '../../lab/netns';
import { distPath } from '../../lab/services';

const SCRIPT = distPath('test', 'privileged', 'fixtures', 'preflight-run.js');

interface Report { ok: boolean; checks: { id: string; status: string; detail: string; remedy: string | null }[] }

function writeConfig(lab: Lab, extra = ''): string {
  const file = lab.file('config.yaml');
  fs.writeFileSync(file, `node:
  interface: eth0
stateDir: ${lab.file('state')}
pools:
  range-global: 10.99.0.200-10.99.0.220
services:
  - name: web
    ipam: dhcp
    ports: [{ port: 8080 }]
    backends: [10.99.0.11]
${extra}`);
  return file;
}

async function check(lab: Lab, ns: string, args: string[], prefix: string[] = []): Promise<{ code: number; report: Report; stdout: string; stderr: string }> {
  const cmd = [...prefix, process.execPath, SCRIPT, ...args];
  const r = await lab.exec(ns, cmd[0]!, cmd.slice(1), { allowFail: true, timeoutMs: 30_000 });
  let report: Report = { ok: false, checks: [] };
  try { report = JSON.parse(r.stdout) as Report; } catch { /* human output or nothing */ }
  return { code: r.code, report, stdout: r.stdout, stderr: r.stderr };
}

const status = (r: Report, id: string): string | undefined => r.checks.find((c) => c.id === id)?.status;

t.test('in a lab namespace, eth0 as parent: exit 0, macvlan created and deleted', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const ns = await lab.addHost('node', { address: '10.99.0.2/24' });
  const cfg = writeConfig(lab);
  const linksBefore = (await lab.exec(ns, 'ip', ['-o', 'link'])).stdout;
  const r = await check(lab, ns, ['--config', cfg, '--json']);
  t.equal(r.code, 0, `exit 0 (stderr: ${r.stderr})`);
  t.equal(r.report.ok, true);
  t.equal(status(r.report, 'macvlan'), 'pass');
  t.match(r.report.checks.find((c) => c.id === 'macvlan')!.detail, /created and deleted a macvlan/);
  t.equal(status(r.report, 'config'), 'pass');
  t.equal(status(r.report, 'capabilities'), 'pass');
  t.equal(status(r.report, 'interface'), 'pass');
  t.match(r.report.checks.find((c) => c.id === 'interface')!.detail, /eth0 \(node\.interface\): up, carrier, 10\.99\.0\.2\/24/);
  t.equal(status(r.report, 'pools'), 'pass');
  t.equal(status(r.report, 'state-dir'), 'pass');
  // A fresh namespace has arp_ignore=0 and arp_announce=0: warned, with the exact sysctls.
  t.equal(status(r.report, 'arp-sysctls'), 'warn');
  t.match(r.report.checks.find((c) => c.id === 'arp-sysctls')!.remedy, /net\.ipv4\.conf\.eth0\.arp_ignore=1/);
  t.equal((await lab.exec(ns, 'ip', ['-o', 'link'])).stdout, linksBefore, 'no link added or left behind in the namespace');
  t.notOk(fs.existsSync(lab.file('state')), 'the state directory is not created by the check');

  // Fix the sysctls the check named, and it stops warning about them.
  await lab.sh(ns, 'sysctl -qw net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2 net.ipv4.conf.default.arp_ignore=1 net.ipv4.conf.default.arp_announce=2');
  const fixed = await check(lab, ns, ['--config', cfg, '--json']);
  t.equal(status(fixed.report, 'arp-sysctls'), 'pass');

  // Human output: a table and a verdict.
  const human = await check(lab, ns, ['--config', cfg]);
  t.equal(human.code, 0);
  t.match(human.stdout, /^ok\s+macvlan\s+created and deleted/m);
  t.match(human.stdout, /^verdict: OK/m);
});

t.test('a missing parent, a down parent, a bad config: exit 1 with the reason', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const ns = await lab.addHost('node', { address: '10.99.0.2/24' });
  const cfg = writeConfig(lab);

  const badIf = lab.file('badif.yaml');
  fs.writeFileSync(badIf, fs.readFileSync(cfg, 'utf8').replace('interface: eth0', 'interface: ens7'));
  const missing = await check(lab, ns, ['--config', badIf, '--json']);
  t.equal(missing.code, 1);
  t.equal(status(missing.report, 'interface'), 'fail');
  t.match(missing.report.checks.find((c) => c.id === 'interface')!.remedy, /eth0/);

  await lab.sh(ns, 'ip link set eth0 down');
  const down = await check(lab, ns, ['--config', cfg, '--json']);
  t.equal(down.code, 1);
  t.match(down.report.checks.find((c) => c.id === 'interface')!.detail, /eth0 \(node\.interface\) is down/);
  await lab.sh(ns, 'ip link set eth0 up');

  const bad = lab.file('bad.yaml');
  fs.writeFileSync(bad, 'services:\n  - name: web\n    ports: [{ port: 70000 }]\n    backends: [10.99.0.11]\nbogus: 1\n');
  const invalid = await check(lab, ns, ['--config', bad, '--json']);
  t.equal(invalid.code, 1);
  t.equal(status(invalid.report, 'config'), 'fail');
  t.match(invalid.report.checks.find((c) => c.id === 'config')!.detail, /bogus/);

  const usage = await check(lab, ns, ['--no-such-flag']);
  t.equal(usage.code, 2, 'bad usage exits 2');
});

t.test('without CAP_NET_ADMIN and CAP_NET_RAW: exit 1, both named', async (t) => {
  if (!requirePrivileged(t)) return;
  const capsh = await run('sh', ['-c', 'command -v capsh'], { allowFail: true });
  if (capsh.code !== 0) { t.plan(0, 'skip: capsh not installed'); return; }
  const lab = await createLab(t);
  const ns = await lab.addHost('node', { address: '10.99.0.2/24' });
  const cfg = writeConfig(lab);
  const quoted = [process.execPath, SCRIPT, '--config', cfg, '--json'].map((a) => `'${a}'`).join(' ');
  const r = await check(lab, ns, [], ['capsh', '--drop=cap_net_admin,cap_net_raw', '--', '-c', quoted]);
  // capsh passes everything after -- to bash: the command is the quoted string.
  t.equal(r.code, 1, `exit 1 (stderr: ${r.stderr})`);
  const caps = r.report.checks.find((c) => c.id === 'capabilities');
  t.equal(caps?.status, 'fail');
  t.match(caps?.detail, /CAP_NET_ADMIN/);
  t.match(caps?.detail, /CAP_NET_RAW/);
  t.match(caps?.remedy, /AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW/);
  // The macvlan test could not run; it says so instead of blaming the kernel.
  t.notMatch(r.report.checks.find((c) => c.id === 'macvlan')?.detail ?? '', /kernel-default|Unknown device type/);
  t.match(r.report.checks.find((c) => c.id === 'macvlan')?.detail ?? '', /could not test/);
});
