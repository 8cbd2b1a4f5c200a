// `lb-agent check --dhcp-probe` on a real LAN: a DISCOVER from a throwaway
// MAC on a temporary macvlan gets dnsmasq's OFFER, no lease is taken and the
// macvlan is gone afterwards; on a LAN without a DHCP server the probe says
// "no offer within N s".
import t from 'tap';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, type Lab } from '../../lab/netns';
import { distPath, startDnsmasq } from '../../lab/services';

const SCRIPT = distPath('test', 'privileged', 'fixtures', 'preflight-run.js');

interface Report { ok: boolean; checks: { id: string; status: string; detail: string; remedy: string | null }[] }

function writeConfig(lab: Lab): string {
  const file = lab.file('config.yaml');
  fs.writeFileSync(file, `node: { interface: eth0 }
stateDir: ${lab.file('state')}
services:
  - { name: web, ipam: dhcp, ports: [{ port: 8080 }], backends: [10.99.0.11] }
`);
  return file;
}

async function probe(lab: Lab, ns: string, cfg: string, timeout: number): Promise<{ code: number; report: Report; stderr: string }> {
  const r = await lab.exec(ns, process.execPath, [SCRIPT, '--config', cfg, '--json', '--dhcp-probe', '--dhcp-timeout', String(timeout)], { allowFail: true, timeoutMs: 30_000 });
  let report: Report = { ok: false, checks: [] };
  try { report = JSON.parse(r.stdout) as Report; } catch { /* reported below */ }
  return { code: r.code, report, stderr: r.stderr };
}

t.test('dnsmasq answers the DISCOVER with an OFFER; no lease is taken', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const server = await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', noPing: true });
  const cfg = writeConfig(lab);
  const linksBefore = (await lab.exec(node, 'ip', ['-o', 'link'])).stdout;

  const r = await probe(lab, node, cfg, 5);
  const d = r.report.checks.find((c) => c.id === 'dhcp-probe');
  t.equal(d?.status, 'pass', `probe passed: ${d?.detail ?? r.stderr}`);
  t.match(d?.detail, /^OFFER of 10\.99\.0\.(1[0-4]\d|150) from 10\.99\.0\.1 in \d+ ms/);
  t.match(d?.detail, /DISCOVER from 02:/);
  t.equal(r.code, 0);
  t.match(dnsmasq.log(), /DHCPDISCOVER\(eth0\) 02:/, 'dnsmasq saw the DISCOVER');
  t.match(dnsmasq.log(), /DHCPOFFER\(eth0\)/, 'and offered');
  t.notMatch(dnsmasq.log(), /DHCPREQUEST/, 'no REQUEST was sent');
  t.same(dnsmasq.leases(), [], 'no lease taken');
  t.equal((await lab.exec(node, 'ip', ['-o', 'link'])).stdout, linksBefore, 'the temporary macvlan is gone');
});

t.test('no DHCP server: "no offer within N s", exit 1', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const cfg = writeConfig(lab);
  const started = Date.now();
  const r = await probe(lab, node, cfg, 2);
  const d = r.report.checks.find((c) => c.id === 'dhcp-probe');
  t.equal(d?.status, 'fail');
  t.match(d?.detail, /^no offer within 2 s/);
  t.match(d?.remedy, /DHCP server/);
  t.equal(r.code, 1);
  t.ok(Date.now() - started < 20_000, 'bounded by the probe timeout');
  t.notMatch((await lab.exec(node, 'ip', ['-o', 'link'])).stdout, /lbchk/, 'the temporary macvlan is gone');
});
