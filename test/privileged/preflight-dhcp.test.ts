// `lb-agent check --dhcp-probe` on a real LAN: a DISCOVER from a throwaway
// MAC on a temporary macvlan gets dnsmasq's OFFER, no lease is taken and the
// macvlan is gone afterwards; on a LAN without a DHCP server the probe says
// "no offer within N s". With an IPv6 DHCP service in the config it also
// sends a DHCPv6 SOLICIT from the macvlan's link-local address: dnsmasq
// ADVERTISEs an address and keeps no lease of it.
import t from 'tap';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, type Lab } from '../../lab/netns';
import { distPath, startDnsmasq } from '../../lab/services';

const SCRIPT = distPath('test', 'privileged', 'fixtures', 'preflight-run.js');

interface Report { ok: boolean; checks: { id: string; status: string; detail: string; remedy: string | null }[] }

function writeConfig(lab: Lab, ipv6 = false): string {
  const file = lab.file('config.yaml');
  fs.writeFileSync(file, `node: { interface: eth0 }
stateDir: ${lab.file('state')}
services:
  - { name: web, ipam: dhcp, ports: [{ port: 8080 }], backends: [10.99.0.11] }
${ipv6 ? '  - { name: web6, ipam: dhcp, ipFamilies: [IPv6], ports: [{ port: 8080 }], backends: ["fd00:99::11"] }\n' : ''}`);
  return file;
}

async function probe(lab: Lab, ns: string, cfg: string, timeout: number): Promise<{ code: number; report: Report; stderr: string }> {
  const r = await lab.exec(ns, process.execPath, [SCRIPT, '--config', cfg, '--json', '--dhcp-probe', '--dhcp-timeout', String(timeout)], { allowFail: true, timeoutMs: 30_000 });
  let report: Report = { ok: false, checks: [] };
  try { report = JSON.parse(r.stdout) as Report; } catch { /* reported below */ }
  return { code: r.code, report, stderr: r.stderr };
}

t.test('dnsmasq answers the DISCOVER with an OFFER and the SOLICIT with an ADVERTISE; no lease is taken', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const server = await lab.addHost('dhcp', { address: '10.99.0.1/24', ipv6: ['fd00:99::1/64'] });
  const node = await lab.addHost('node', { address: '10.99.0.2/24', ipv6: ['fd00:99::2/64'] });
  const dnsmasq = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', noPing: true, extra: ['--dhcp-range=fd00:99::100,fd00:99::1ff,64,1h'] });
  const cfg = writeConfig(lab, true);
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
  // dnsmasq with DHCPv6 writes its own DUID first ("duid ..."): the rest are leases.
  t.same(fs.readFileSync(dnsmasq.leaseFile, 'utf8').split('\n').filter((l) => l !== '' && !l.startsWith('duid ')), [], 'no lease taken, of either family');
  const d6 = r.report.checks.find((c) => c.id === 'dhcp6-probe');
  t.equal(d6?.status, 'pass', `the DHCPv6 probe passed: ${d6?.detail ?? r.stderr}`);
  t.match(d6?.detail, /^ADVERTISE of fd00:99::1[0-9a-f]{2} from (ll|llt) \S+ in \d+ ms \(SOLICIT from DUID-LL 02:/);
  t.match(dnsmasq.log(), /DHCPSOLICIT\(eth0\) 00:03:00:01:02:/, 'dnsmasq saw the SOLICIT from the DUID-LL');
  t.match(dnsmasq.log(), /DHCPADVERTISE\(eth0\) fd00:99::1/, 'and advertised an address');
  t.notMatch(dnsmasq.log(), /DHCPREQUEST|DHCPREPLY/, 'no REQUEST was sent, nothing granted');
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
  t.notOk(r.report.checks.some((c) => c.id === 'dhcp6-probe'), 'no DHCPv6 probe without an IPv6 DHCP service');
});
