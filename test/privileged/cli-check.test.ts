// `lb-agent check` as cloud-init runs it: the real binary, in a lab
// namespace whose eth0 is the parent. Root passes; without CAP_NET_ADMIN and
// CAP_NET_RAW it fails and names both. Another table dropping on the forward
// hook is named; with no daemon running, the drift fight is not checked.
import t from 'tap';
import * as fs from 'node:fs';
import { stringify } from '../../lab/yaml';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { AGENT_BIN } from '../../lab/agent';

t.test('lb-agent check', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const ns = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.sh(ns, 'sysctl -qw net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2 net.ipv4.ip_forward=1');
  const cfg = lab.file('config.yaml');
  fs.writeFileSync(cfg, stringify({
    node: { interface: 'eth0' }, stateDir: lab.file('state'), control: { socket: lab.file('a.sock') },
    dataplane: 'kernel', pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    services: [{ name: 'web', ipam: 'dhcp', ports: [{ name: 'http', port: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }] }],
  }));

  const ok = await lab.exec(ns, process.execPath, [AGENT_BIN, 'check', '--config', cfg, '--json'], { allowFail: true, timeoutMs: 30_000 });
  const doc = JSON.parse(ok.stdout) as { ok: boolean; checks: { id: string; status: string; detail: string; remedy: string | null }[] };
  const failed = doc.checks.filter((c) => c.status === 'fail');
  t.equal(ok.code, 0, `exit 0; failed: ${JSON.stringify(failed)}`);
  t.equal(doc.checks.find((c) => c.id === 'macvlan')?.status, 'pass', 'the macvlan check passes');
  t.equal(doc.checks.find((c) => c.id === 'capabilities')?.status, 'pass');
  t.match(doc.checks.find((c) => c.id === 'udp-flows'), { status: 'pass', detail: /ctnetlink answers.*default\/web 53\/UDP/ }, 'a UDP port on the kernel path: ctnetlink answers in this namespace');

  t.match(doc.checks.find((c) => c.id === 'firewall'), { status: 'pass', detail: 'no other table hooks prerouting, forward or the parent\'s ingress' }, 'no other table: the firewall check passes');
  t.match(doc.checks.find((c) => c.id === 'drift-fight'), { status: 'pass', detail: `not checked: no daemon answers on ${lab.file('a.sock')} (ENOENT)` }, 'no daemon: the fight is not checked, and says why');

  // A firewall whose forward hook drops by policy: every connection the kernel path DNATs would die there.
  const fw = lab.file('fw.nft');
  fs.writeFileSync(fw, 'table inet fw {\n\tchain forward {\n\t\ttype filter hook forward priority 0; policy drop;\n\t}\n}\n');
  await lab.sh(ns, `nft -f ${fw}`);
  const fwRun = await lab.exec(ns, process.execPath, [AGENT_BIN, 'check', '--config', cfg, '--json'], { allowFail: true, timeoutMs: 30_000 });
  const fwDoc = JSON.parse(fwRun.stdout) as typeof doc;
  t.equal(fwRun.code, 0, 'a warning, not a failure');
  t.match(fwDoc.checks.find((c) => c.id === 'firewall'), {
    status: 'warn',
    detail: 'another table would drop the VIP traffic the kernel path forwards: table inet fw, chain forward (hook forward, priority 0): policy drop',
    remedy: /nft insert rule inet fw forward ct status dnat accept/,
  }, 'the foreign forward drop is named, with the command that opens it');
  await lab.sh(ns, 'nft insert rule inet fw forward ct status dnat accept');
  const opened = JSON.parse((await lab.exec(ns, process.execPath, [AGENT_BIN, 'check', '--config', cfg, '--json'], { allowFail: true, timeoutMs: 30_000 })).stdout) as typeof doc;
  t.match(opened.checks.find((c) => c.id === 'firewall'), { status: 'pass', detail: /1 base chain\(s\) of other tables.*none drops the VIP traffic/ }, 'after the printed fix it passes');
  await lab.sh(ns, 'nft delete table inet fw');

  const human = await lab.exec(ns, process.execPath, [AGENT_BIN, 'check', '--config', cfg], { allowFail: true, timeoutMs: 30_000 });
  t.equal(human.code, 0);
  t.match(human.stdout, /macvlan/);

  const dropped = await lab.exec(ns, 'capsh', ['--drop=cap_net_admin,cap_net_raw', '--', '-c', `${process.execPath} ${AGENT_BIN} check --config ${cfg}`], { allowFail: true, timeoutMs: 30_000 });
  t.equal(dropped.code, 1, 'exit 1 without the capabilities');
  t.match(dropped.stdout, /CAP_NET_ADMIN/);
  t.match(dropped.stdout, /CAP_NET_RAW/);
  t.match(dropped.stdout, /udp-flows.*ctnetlink does not answer here \(Request rejected: EPERM\)/, 'and ctnetlink, which needs CAP_NET_ADMIN, is said not to answer');

  // VRRP on the kernel path, TCP only: ctnetlink is asked for the flows a failback ends (stale-flows), not for UDP.
  const vrrpCfg = lab.file('vrrp.yaml');
  fs.writeFileSync(vrrpCfg, stringify({
    node: { interface: 'eth0' }, stateDir: lab.file('state-vrrp'), control: { socket: lab.file('v.sock') },
    dataplane: 'kernel', failover: { mode: 'vrrp', vrid: 51 }, pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    services: [{ name: 'api', ipam: 'pool', loadBalancerIP: '10.99.0.200', ports: [{ name: 'http', port: 80 }] }],
  }));
  const vrrp = JSON.parse((await lab.exec(ns, process.execPath, [AGENT_BIN, 'check', '--config', vrrpCfg, '--json'], { allowFail: true, timeoutMs: 30_000 })).stdout) as typeof doc;
  t.match(vrrp.checks.find((c) => c.id === 'stale-flows'), { status: 'pass', detail: /ctnetlink answers/ }, 'VRRP on the kernel path: ctnetlink answers for the failback sweep');
  t.notOk(vrrp.checks.some((c) => c.id === 'udp-flows'), 'no UDP port: no udp-flows line');
  const vrrpDropped = await lab.exec(ns, 'capsh', ['--drop=cap_net_admin,cap_net_raw', '--', '-c', `${process.execPath} ${AGENT_BIN} check --config ${vrrpCfg}`], { allowFail: true, timeoutMs: 30_000 });
  t.match(vrrpDropped.stdout, /stale-flows.*ctnetlink does not answer here \(Request rejected: EPERM\)/, 'and without CAP_NET_ADMIN it is said not to answer');

  const usage = await lab.exec(ns, process.execPath, [AGENT_BIN, 'check', '--bogus'], { allowFail: true });
  t.equal(usage.code, 2, 'bad usage is exit 2');
});
