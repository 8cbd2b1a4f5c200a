// lb-agent.service runs the agent as User=lb-agent with exactly the
// capabilities of AmbientCapabilities= (bounding set the same, no new
// privileges). This runs the real agent that way - an unprivileged uid,
// those capabilities read from the unit file, nothing else - in a lab
// namespace, and shows it does the whole job: a DHCP VIP on its own macvlan
// (AF_PACKET, rtnetlink), a pool VIP with ARP (RFC 5227), the sysctls on the
// parent, forwarding through nftables as `dataplane: auto` chooses it (an
// `nft` child inheriting the ambient set) and through the userspace proxy on
// port 80 (CAP_NET_BIND_SERVICE), and a clean stop. systemd's other sandboxing (seccomp, ProtectSystem=) is
// not reproduced here; systemd-analyze verifies it (test/systemd/unit.test.ts).
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { stringify } from '../../lab/yaml';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, Lab } from '../../lab/netns';
import { startBackend, startDnsmasq, httpGetFrom } from '../../lab/services';
import { AGENT_BIN } from '../../lab/agent';
import { within } from '../../lab/within';
import { controlRequest } from '../../agent/control/server';
import type { StatusDocument } from '../../agent/daemon/daemon';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const UNIT = fs.readFileSync(path.join(ROOT, 'systemd', 'lb-agent.service'), 'utf8');
const NOBODY = 65534;
const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.3, timeoutSeconds: 0.3 };

/** The unit's AmbientCapabilities= as setpriv capability names (net_admin, ...). */
function unitCapabilities(): string[] {
  const m = /^AmbientCapabilities=(.+)$/m.exec(UNIT);
  if (!m) throw new Error('lb-agent.service has no AmbientCapabilities=');
  return m[1]!.trim().split(/\s+/).map((c) => c.replace(/^CAP_/, '').toLowerCase());
}

interface Run { exited: Promise<number | null>; logs: Record<string, unknown>[]; stderr(): string; socket: string; kill(sig: NodeJS.Signals): void }

/** `lb-agent run` in ns as uid/gid nobody with only the unit's capabilities. */
function runUnprivileged(lab: Lab, ns: string, name: string, cfg: Record<string, unknown>): Run {
  const dir = lab.file(name);
  fs.mkdirSync(dir, { mode: 0o700 });
  fs.chownSync(dir, NOBODY, NOBODY);
  const socket = path.join(dir, 'agent.sock');
  const configPath = lab.file(`${name}.yaml`);
  fs.writeFileSync(configPath, stringify({ ...cfg, stateDir: path.join(dir, 'state'), control: { socket } }), { mode: 0o644 });
  const caps = unitCapabilities().map((c) => `+${c}`).join(',');
  const proc = lab.spawn(ns, 'setpriv', [
    `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups',
    `--inh-caps=-all,${caps}`, `--ambient-caps=-all,${caps}`, `--bounding-set=-all,${caps}`, '--no-new-privs',
    process.execPath, AGENT_BIN, 'run', '--config', configPath, '--log-level', 'info',
  ], {
    // A minimal environment, as systemd gives a service (and none of tap's
    // NODE_OPTIONS hooks, which write into the repository as this uid).
    env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', HOME: dir, LANG: 'C.UTF-8' },
  });
  const logs: Record<string, unknown>[] = [];
  let partial = '';
  let err = '';
  proc.stdout?.on('data', (d: Buffer) => {
    partial += d.toString();
    let nl: number;
    while ((nl = partial.indexOf('\n')) >= 0) {
      const line = partial.slice(0, nl);
      partial = partial.slice(nl + 1);
      try { logs.push(JSON.parse(line) as Record<string, unknown>); } catch { logs.push({ raw: line }); }
    }
  });
  proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  return { exited, logs, stderr: () => err, socket, kill: (sig) => { proc.kill(sig); } };
}

t.test('the agent does its job with only the unit\'s capabilities, as an unprivileged user', async (t) => {
  if (!requirePrivileged(t)) return;
  const caps = unitCapabilities();
  t.same([...caps].sort(), ['bpf', 'net_admin', 'net_bind_service', 'net_raw', 'perfmon'], 'the unit grants NET_ADMIN, NET_RAW, NET_BIND_SERVICE, BPF, PERFMON (the verifier refuses the NAT engine without it)');
  const lab = await createLab(t);
  // The lab's scratch dir is 0700 root; the unprivileged agent must reach its config.
  fs.chmodSync(lab.dir, 0o755);
  await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  await startDnsmasq(lab, lab.ns('dhcp'), { range: '10.99.0.100,10.99.0.150', noPing: true });
  await startBackend(lab, lab.ns('b1'), 'b1');

  // The kernel path matters most here: its nftables probe must not need
  // more than CAP_NET_ADMIN (a throwaway namespace needs CAP_SYS_ADMIN, which
  // the unit withholds and RestrictNamespaces=yes forbids; agent/forward/nft.ts
  // falls back to `nft --check`, which the kernel validates and aborts).
  for (const [dataplane, expected] of [['auto', 'kernel'], ['proxy', 'proxy']] as const) {
    t.test(`dataplane ${dataplane}`, async (t) => {
      const agent = runUnprivileged(lab, node, `agent-${dataplane}`, {
        node: { name: 'vm1', interface: 'eth0' },
        metrics: { listen: '10.99.0.2:9477' },
        dataplane,
        pools: { 'range-global': '10.99.0.200-10.99.0.210' },
        arp: FAST_ARP,
        dhcp: { retransmitInitial: 0.5, retransmitMax: 2 },
        services: [
          { name: 'web', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
          { name: 'api', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC },
          // The kernel path's direct server return: its BPF program needs CAP_BPF (issue 17).
          ...(dataplane === 'auto' ? [{ name: 'dsr', ipam: 'pool', loadBalancerIP: '10.99.0.205', sourceIP: 'preserve', ports: [{ port: 8080 }], backends: ['10.99.0.11'], healthCheck: HC }] : []),
        ],
      });
      const count = dataplane === 'auto' ? 3 : 2;
      let last: StatusDocument | undefined;
      try {
        last = await Promise.race([
          waitFor('every service ready', async () => {
            const s = (await controlRequest(agent.socket, 'status', 2000)) as StatusDocument;
            last = s;
            return s.services.length === count && s.services.every((x) => x.ready) ? s : undefined;
          }, 30_000, 200),
          agent.exited.then((code) => { throw new Error(`the agent exited with ${code}`); }),
        ]);
      } catch (e) {
        const why = `${(e as Error).message}\nstderr: ${agent.stderr()}\nlogs: ${agent.logs.filter((l) => (l.level as number) >= 40).map((l) => JSON.stringify(l)).join('\n')}\nstatus: ${JSON.stringify(last?.services)}`;
        t.fail(`serves every service: ${why}`);
        agent.kill('SIGKILL');
        return;
      }
      t.equal(last.dataplane?.kind, expected, `data path ${expected}`);
      if (expected === 'kernel') t.equal(last.dataplane?.placement, 'round-robin', 'without VRRP the kernel path places by round-robin');
      t.comment(`data path reason: ${last.dataplane?.reason}`);
      const pid = last.pid;
      const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
      t.match(st, new RegExp(`^Uid:\\s+${NOBODY}\\s+${NOBODY}\\s+${NOBODY}\\s+${NOBODY}$`, 'm'), 'running as an unprivileged uid');
      t.match(st, /^CapEff:\s+000000c000003400$/m, 'effective capabilities: exactly NET_BIND_SERVICE, NET_ADMIN, NET_RAW, PERFMON, BPF');
      if (dataplane === 'auto') {
        const engine = agent.logs.find((l) => l.op === 'dsr-engine');
        t.equal(engine?.engine, 'bpf', `direct server return runs on the BPF program with these capabilities: ${JSON.stringify(engine)}`);
      }
      const web = last.services.find((s) => s.name === 'web')!;
      const api = last.services.find((s) => s.name === 'api')!;
      t.match(web.interface, /^lbv/, 'DHCP VIP on its own macvlan');
      t.match(web.vip, /^10\.99\.0\.1\d\d$/, `DHCP lease ${web.vip}`);
      t.equal(api.vip, '10.99.0.200', 'pool VIP claimed');
      for (const vip of [web.vip, api.vip]) {
        const r = await httpGetFrom(lab, client, `http://${vip}/`);
        t.ok(r.ok && r.body.includes('b1'), `http://${vip}/ reaches the backend ${r.error ?? ''}`);
      }
      const sysctl = await lab.sh(node, 'cat /proc/sys/net/ipv4/conf/eth0/arp_ignore /proc/sys/net/ipv4/conf/eth0/arp_announce');
      t.same(sysctl.stdout.split('\n').filter(Boolean), ['1', '2'], 'ARP sysctls set on the parent');
      // Warnings and errors only: the data path choice (info) may quote the
      // refused `unshare` that made it fall back to `nft --check`.
      const denied = agent.logs.filter((l) => (l.level as number) >= 40 && /EPERM|EACCES|not permitted|permission denied/i.test(JSON.stringify(l)));
      t.same(denied, [], 'no permission error in a warning or error');

      agent.kill('SIGTERM');
      const code = await within(agent.exited, 12_000);
      t.equal(code, 0, 'stops cleanly');
      const left = await lab.sh(node, 'ip -o link show; ip -o addr show eth0; nft list tables', { allowFail: true });
      t.notMatch(left.stdout, /lbv|10\.99\.0\.200|lb_agent/, 'and withdraws what it made');
    });
  }
});
