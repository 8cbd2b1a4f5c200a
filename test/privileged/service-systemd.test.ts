// lb-agent.service under a real systemd: a Debian bookworm container
// (systemd 252, lab/systemd-container.ts) is "the VM" on a lab
// LAN with two real backends and a client; lb-agent is installed into it by
// systemd/install.sh and runs from the unit as on a VM. Proven in order:
// a failing ExecStartPre= preflight blocks the start; Type=notify goes
// active on READY=1 and STATUS= counts the VIPs served; the daemon runs as
// lb-agent with exactly its four capabilities; ExecReload= applies a good
// file and fails visibly on a bad one, serving on; the watchdog replaces a
// hung agent; restart and a SIGKILL bring a new agent; direct server
// return's program is replaced, never doubled, across reloads, a restart and
// a crash (the fd store carries it: the unit grants no CAP_SYS_ADMIN); stop
// leaves no address, link, nftables table or program behind.
import t from 'tap';
import { stringify } from '../../lab/yaml';
import { requireSystemdContainer } from '../helpers/privileged';
import { createLab, waitFor, Lab } from '../../lab/netns';
import { startBackend, httpGetFrom } from '../../lab/services';
import { dsrBackendByHand, dsrProgramsIn, natProgramsIn } from '../../lab/forward';
import { bootSystemdContainer, decodeCapabilities, SystemdContainer } from '../../lab/systemd-container';
import type { StatusDocument } from '../../agent/daemon/daemon';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.3, timeoutSeconds: 0.3 };
const VIP1 = '10.99.0.200';
const VIP2 = '10.99.0.201';
const VIP3 = '10.99.0.202';
const UNIT_CAPS = ['CAP_BPF', 'CAP_NET_ADMIN', 'CAP_NET_BIND_SERVICE', 'CAP_NET_RAW', 'CAP_PERFMON'];

const api = { name: 'api', ipam: 'pool', loadBalancerIP: VIP1, ports: [{ name: 'http', port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: HC };
const web = { name: 'web', ipam: 'pool', loadBalancerIP: VIP2, ports: [{ name: 'http', port: 80, targetPort: 8080 }], backends: ['10.99.0.12'], healthCheck: HC };
function config(services: unknown[], iface = 'eth0'): Record<string, unknown> {
  return {
    node: { name: 'vm1', interface: iface },
    metrics: { listen: '' },
    dataplane: 'auto',
    // The eBPF NAT engine where it loads, under the unit's sandbox.
    kernel: { engine: 'auto' },
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    arp: FAST_ARP,
    services,
  };
}

/** What the VM namespace holds, as the host sees it: addresses, links, nftables tables. */
async function netState(lab: Lab, ns: string): Promise<{ addrs: string[]; links: string[]; tables: string[] }> {
  const addrs = (await lab.sh(ns, "ip -o -4 addr show | awk '{print $2, $4}'")).stdout.trim().split('\n').filter(Boolean).sort();
  const links = (await lab.sh(ns, "ip -o link show | awk -F': ' '{print $2}'")).stdout.trim().split('\n').filter(Boolean).sort();
  const tables = (await lab.sh(ns, 'nft list tables')).stdout.trim().split('\n').filter(Boolean).sort();
  return { addrs, links, tables };
}

async function get(lab: Lab, client: string, vip: string): Promise<string> {
  const r = await httpGetFrom(lab, client, `http://${vip}/`, 2000);
  return r.ok ? r.body.trim() : `error: ${r.error ?? r.body}`;
}

async function agentStatus(vm: SystemdContainer): Promise<StatusDocument> {
  const r = await vm.lbAgent('status', '--json');
  if (r.code !== 0) throw new Error(`lb-agent status: ${r.stderr}`);
  return JSON.parse(r.stdout) as StatusDocument;
}

t.test('lb-agent.service under systemd 252 in a lab VM', async (t) => {
  if (!requireSystemdContainer(t)) return;
  const lab = await createLab(t);
  const vmNs = await lab.addHost('vm', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await lab.addHost('b2', { address: '10.99.0.12/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  await startBackend(lab, lab.ns('b1'), 'b1');
  await startBackend(lab, lab.ns('b2'), 'b2');
  const baseline = await netState(lab, vmNs);

  const bootStart = Date.now();
  // First with a NIC that does not exist: the preflight must refuse it.
  const vm = await bootSystemdContainer(t, lab, { ns: vmNs, config: config([api], 'eth9') });
  t.comment(`container ${vm.name}: install + overlay + boot ${Date.now() - bootStart} ms (boot alone ${vm.bootMs} ms)`);

  await t.test('ExecStartPre= preflight failing blocks the start: no daemon runs', async (t) => {
    const cursor = await vm.cursor();
    const r = await vm.systemctl('start', 'lb-agent');
    t.not(r.code, 0, `systemctl start fails: ${r.stderr.trim()}`);
    const journal = await vm.journal('lb-agent', { after: cursor });
    t.match(journal, /FAIL\s+interface\s+eth9 \(node\.interface\) does not exist/, 'the journal gives the check\'s reason');
    t.match(journal, /ExecStartPre=|Control process exited, code=exited, status=1/, 'systemd says the start-pre step failed');
    t.notMatch(journal, /lb-agent started/, 'the daemon never started');
    const p = await vm.show('lb-agent', 'ExecMainPID', 'ActiveState');
    t.equal(p.ExecMainPID, '0', 'ExecStart= never ran');
    t.not(p.ActiveState, 'active');
    // Restart=on-failure retries the preflight; end that before the next step.
    await vm.systemctl('stop', 'lb-agent');
    await vm.systemctl('reset-failed', 'lb-agent');
    t.same((await netState(lab, vmNs)).addrs, baseline.addrs, 'no VIP was added');
  });

  let pid1 = 0;
  await t.test('active only on READY=1, with STATUS= counting the VIPs served', async (t) => {
    vm.writeConfig(config([api]));
    const cursor = await vm.cursor();
    const r = await vm.systemctl('start', '--no-block', 'lb-agent');
    t.equal(r.code, 0, r.stderr);
    // Sample the unit while the agent starts: its main process runs for a
    // while (node, netlink, nft probes) before it says READY=1.
    const samples: Record<string, string>[] = [];
    const running = await waitFor('lb-agent active', async () => {
      const s = await vm.show('lb-agent', 'ActiveState', 'SubState', 'MainPID', 'StatusText');
      samples.push(s);
      return s.ActiveState === 'active' ? s : s.ActiveState === 'failed' ? Promise.reject(new Error(`failed: ${await vm.journal()}`)) : undefined;
    }, 30_000, 20);
    const waiting = samples.filter((s) => s.ActiveState === 'activating' && s.SubState === 'start' && Number(s.MainPID) > 0);
    t.ok(waiting.length > 0, `seen "activating (start)" with the main process running (${waiting.length} of ${samples.length} samples): systemd waited for READY=1`);
    pid1 = Number(running.MainPID);
    const journal = await vm.journal('lb-agent', { after: cursor });
    const started = journal.indexOf('"msg":"lb-agent started"');
    const active = journal.indexOf('Started lb-agent.service');
    t.ok(started >= 0 && active > started, 'systemd calls it started after the daemon logged "lb-agent started" (and sent READY=1)');
    const st = await vm.waitRunning('lb-agent', 20_000, (p) => / 1 ready;/.test(p.StatusText ?? ''));
    t.match(st.StatusText, /^1 VIP served; 1 services, 1 serving, 1 ready; dataplane kernel$/, `StatusText: ${st.StatusText}`);
    t.equal(await waitFor('traffic through the VIP', async () => ((await get(lab, client, VIP1)) === 'b1' ? 'b1' : undefined), 10_000, 200), 'b1', 'a client reaches b1 through the VIP');
    // kernel.engine auto under the unit's sandbox: its ExecStartPre mounted the BPF file system, the daemon (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN) loaded, pinned and attached the engine.
    const ne = (await agentStatus(vm)).dataplane?.natEngine;
    t.equal(ne?.engine, 'ebpf', `status: the eBPF NAT engine forwards the snat flows (${ne?.reason})`);
    t.equal((await natProgramsIn(lab, vmNs)).length, 1, 'one NAT program at tcx ingress of eth0');
    t.match((await vm.sh('ls /sys/fs/bpf/lb-agent/nat-eth0')).stdout, /lb_agent_nat_prog/, 'its program pinned under /sys/fs/bpf/lb-agent');
  });

  await t.test('runs as lb-agent with exactly CAP_NET_ADMIN CAP_NET_RAW CAP_NET_BIND_SERVICE CAP_BPF CAP_PERFMON', async (t) => {
    const status = (await vm.exec('cat', [`/proc/${pid1}/status`])).stdout;
    const field = (k: string): string => new RegExp(`^${k}:\\s*(.*)$`, 'm').exec(status)?.[1]?.trim() ?? '';
    const pw = (await vm.exec('getent', ['passwd', 'lb-agent'])).stdout.split(':');
    t.same(field('Uid').split(/\s+/), [pw[2], pw[2], pw[2], pw[2]], `real, effective, saved and fs uid are lb-agent's (${pw[2]})`);
    t.same(field('Gid').split(/\s+/), [pw[3], pw[3], pw[3], pw[3]], 'and the gids its group');
    for (const set of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'CapInh']) {
      t.same(decodeCapabilities(field(set)).sort(), UNIT_CAPS, `${set} ${field(set)} = ${UNIT_CAPS.join(' ')}`);
    }
    t.equal(field('NoNewPrivs'), '1', 'no new privileges');
    t.match(field('Seccomp'), /^2$/, 'a seccomp filter (SystemCallFilter=)');
  });

  await t.test('systemctl reload applies a changed good config', async (t) => {
    vm.writeConfig(config([api, web]));
    const cursor = await vm.cursor();
    const r = await vm.systemctl('reload', 'lb-agent');
    t.equal(r.code, 0, `systemctl reload exits 0 ${r.stderr}`);
    const journal = await vm.journal('lb-agent', { after: cursor });
    t.match(journal, /lb-agent reloaded: 1 added, 0 removed, 0 changed, 1 unchanged/, 'ExecReload= printed the verdict into the journal');
    t.match(journal, /Reloaded lb-agent\.service/);
    t.equal(await vm.mainPid(), pid1, 'the same process: a reload, not a restart');
    const doc = await agentStatus(vm);
    t.equal(doc.config.generation, 2, 'lb-agent status: config generation 2');
    // In the container's PID namespace only the commit's netlink port names the agent's nft child: its own writes are never drift.
    t.same(doc.drift?.repairs.table, 0, 'no table repair: the agent knows its own nftables commits inside the container');
    t.same(doc.services.map((s) => s.key), ['default/api', 'default/web']);
    t.equal(await waitFor('traffic through the new VIP', async () => ((await get(lab, client, VIP2)) === 'b2' ? 'b2' : undefined), 10_000, 200), 'b2', 'the added service serves');
    const st = await vm.waitRunning('lb-agent', 10_000, (p) => /^2 VIPs served; .* 2 ready;/.test(p.StatusText ?? ''));
    t.match(st.StatusText, /^2 VIPs served/, `StatusText: ${st.StatusText}`);
  });

  await t.test('systemctl reload with a bad config fails visibly and keeps serving the old one', async (t) => {
    const good = stringify(config([api, web]));
    const bad = good.replace('targetPort: 8080\n    backends:\n      - 10.99.0.12', 'targetPort: 70000\n    backends:\n      - 10.99.0.12');
    t.not(bad, good, 'the bad file differs in web\'s targetPort');
    const line = bad.split('\n').findIndex((l) => l.includes('70000')) + 1;
    vm.writeConfig(bad);
    // Whatever fails below, the restarts that follow start from the good file.
    t.teardown(() => vm.writeConfig(good));
    const cursor = await vm.cursor();
    const r = await vm.systemctl('reload', 'lb-agent');
    t.not(r.code, 0, `systemctl reload fails: ${r.stderr.trim()}`);
    const want = `/etc/lb-agent/config.yaml:${line}: services[1].ports[0].targetPort:`;
    t.match(await vm.journal('lb-agent', { after: cursor }), want, `the journal names file, line and field (${want})`);
    const status = await vm.systemctl('status', 'lb-agent', '-n', '20', '-l');
    t.match(status.stdout, want, 'so does systemctl status');
    t.match(status.stdout, /Active: active \(running\)/, 'the unit stays active');
    t.equal(await vm.mainPid(), pid1, 'the same process');
    const doc = await agentStatus(vm);
    t.equal(doc.config.generation, 2, 'the running config is kept');
    t.equal(doc.config.lastReload?.ok, false, 'and the refusal is in lb-agent status');
    t.equal(await get(lab, client, VIP1), 'b1', 'api still serves');
    t.equal(await get(lab, client, VIP2), 'b2', 'web still serves');
  });

  await t.test('the watchdog replaces a hung agent', async (t) => {
    const before = await vm.show('lb-agent', 'MainPID', 'NRestarts', 'WatchdogUSec');
    t.equal(before.WatchdogUSec, '10s');
    const cursor = await vm.cursor();
    const stoppedAt = Date.now();
    await vm.kill(pid1, 'STOP');
    // WatchdogSec=10s, then SIGABRT, RestartSec=2s, a start: well under 40 s.
    const after = await vm.waitRunning('lb-agent', 40_000, (p) => Number(p.MainPID) !== pid1 && /^2 VIPs served; .* 2 ready;/.test(p.StatusText ?? ''));
    t.comment(`hung to active again: ${Date.now() - stoppedAt} ms`);
    t.not(Number(after.MainPID), pid1, `a new main pid (${pid1} -> ${after.MainPID})`);
    t.equal(Number(after.NRestarts), Number(before.NRestarts) + 1, 'one restart');
    t.match(await vm.journal('lb-agent', { after: cursor }), /Watchdog timeout/, 'the journal says why');
    t.equal(await get(lab, client, VIP1), 'b1', 'api serves again');
    t.equal(await get(lab, client, VIP2), 'b2', 'web serves again');
  });

  // What the restart tests build on (what a restart keeps is theirs to
  // assert): systemctl restart and a SIGKILL of the main process each bring
  // up a new agent that serves.
  await t.test('systemctl restart, and Restart=on-failure after kill -KILL', async (t) => {
    const before = Number((await vm.show('lb-agent', 'MainPID')).MainPID);
    const atRestart = await vm.cursor();
    const r = await vm.systemctl('restart', 'lb-agent');
    t.equal(r.code, 0, r.stderr);
    const restarted = await vm.waitRunning('lb-agent', 30_000, (p) => /^2 VIPs served; .* 2 ready;/.test(p.StatusText ?? ''));
    t.not(Number(restarted.MainPID), before, `restart: a new main pid (${before} -> ${restarted.MainPID})`);
    // Issue 18: the unit's CacheDirectory= holds V8's code cache, which an earlier start wrote and this one took.
    t.match(await vm.journal('lb-agent', { after: atRestart }), /"msg":"lb-agent started"/);
    t.match(await vm.journal('lb-agent', { after: atRestart }), /"codeCache":"accepted"/, 'the restarted agent took the code cache');
    t.match(await vm.journal('lb-agent', { after: atRestart }), /"ports":0,"writes":0,.*"msg":"the eBPF NAT engine kept the program and maps an earlier process left/,
      'under the unit (no CAP_SYS_ADMIN) the restarted agent kept the pinned engine and wrote no map entry');
    const cacheDir = (await vm.sh('stat -c "%U %a" /var/cache/lb-agent && ls /var/cache/lb-agent')).stdout;
    t.match(cacheDir, /^lb-agent 700\n/, 'in /var/cache/lb-agent, the agent\'s own and private');
    t.match(cacheDir, /^run-[0-9a-f]{12}-[0-9a-f]{8}\.v8cache$/m, `the daemon's cache file is there (${cacheDir.trim().replace(/\n/g, ', ')})`);
    const cursor = await vm.cursor();
    const killed = await vm.killMain('KILL');
    const back = await vm.waitRunning('lb-agent', 30_000, (p) => Number(p.MainPID) !== killed && /^2 VIPs served; .* 2 ready;/.test(p.StatusText ?? ''));
    t.not(Number(back.MainPID), killed, `kill -KILL ${killed}: back as ${back.MainPID}`);
    t.match(await vm.journal('lb-agent', { after: cursor }), /Main process exited, code=killed, status=9\/KILL/);
    t.equal(await waitFor('traffic after the crash', async () => ((await get(lab, client, VIP1)) === 'b1' ? 'b1' : undefined), 10_000, 200), 'b1', 'api serves');
    t.equal((await natProgramsIn(lab, vmNs)).length, 1, 'one NAT program after the restart and the crash (each start replaced the pinned one)');
    t.equal((await agentStatus(vm)).dataplane?.natEngine?.engine, 'ebpf', 'the eBPF NAT engine forwards');
  });

  await t.test('direct server return under the unit: reloads, a restart and a crash leave one program, serving the current plan', async (t) => {
    // The unit grants no CAP_SYS_ADMIN, so the agent cannot open a program by
    // id: it replaces its own by the descriptor it holds, and after a restart
    // or a crash the one the fd store handed back.
    for (const b of ['b1', 'b2']) await dsrBackendByHand(lab, lab.ns(b), [VIP3]);
    // The steps above used 4 of the unit's 5 starts in 120 s (StartLimitBurst=); this step adds two.
    await vm.systemctl('reset-failed', 'lb-agent');
    const dsr = (backends: string[]): Record<string, unknown> => ({
      name: 'dsr', ipam: 'pool', loadBalancerIP: VIP3, sourceIP: 'preserve', ports: [{ name: 'http', port: 8080 }], backends, healthCheck: HC,
    });
    /** Who answers 10 requests through the DSR VIP. */
    const answers = async (): Promise<string[]> => { const seen = new Set<string>(); for (let i = 0; i < 10; i++) seen.add(await get(lab, client, `${VIP3}:8080`)); return [...seen].sort(); };
    const reloadTo = async (backends: string[], what: string): Promise<void> => {
      vm.writeConfig(config([api, web, dsr(backends)]));
      const r = await vm.systemctl('reload', 'lb-agent');
      t.equal(r.code, 0, `reload (${what}): ${r.stderr}`);
      await vm.waitRunning('lb-agent', 20_000, (p) => /^3 VIPs served; .* 3 ready;/.test(p.StatusText ?? ''));
    };
    await reloadTo(['10.99.0.11', '10.99.0.12'], 'the DSR service added');
    t.same(await waitFor('both backends through the DSR VIP', async () => { const a = await answers(); return a.length === 2 ? a : undefined; }, 10_000, 200), ['b1', 'b2'], 'b1 and b2 answer through the DSR VIP');
    t.equal((await dsrProgramsIn(lab, vmNs)).length, 1, 'one program at tcx ingress of eth0');
    t.match(await vm.journal('lb-agent'), /"op":"dsr-engine","engine":"bpf"/, 'the BPF program serves (not the nft table alone)');
    await reloadTo(['10.99.0.12'], 'b1 out');
    t.same(await answers(), ['b2'], 'after a reload that takes b1 out, only b2 answers: the new plan\'s program replaced the old one');
    t.equal((await dsrProgramsIn(lab, vmNs)).length, 1, 'still one program');
    const r = await vm.systemctl('restart', 'lb-agent');
    t.equal(r.code, 0, r.stderr);
    await vm.waitRunning('lb-agent', 30_000, (p) => /^3 VIPs served; .* 3 ready;/.test(p.StatusText ?? ''));
    t.equal((await dsrProgramsIn(lab, vmNs)).length, 1, 'after systemctl restart: one program (the fd store handed the old one back to be replaced)');
    await reloadTo(['10.99.0.11'], 'b1 back, b2 out');
    t.same(await answers(), ['b1'], 'and the restarted agent\'s plan is the one serving');
    const killed = await vm.killMain('KILL');
    await vm.waitRunning('lb-agent', 30_000, (p) => Number(p.MainPID) !== killed && /^3 VIPs served; .* 3 ready;/.test(p.StatusText ?? ''));
    t.equal((await dsrProgramsIn(lab, vmNs)).length, 1, 'after kill -KILL and Restart=: one program');
    t.same(await answers(), ['b1'], 'serving the same plan');
    t.notMatch(await vm.journal('lb-agent'), /may not open by id/, 'the agent never had to attach beside a program it could not identify');
  });

  await t.test('systemctl stop leaves no address, link or nftables table behind', async (t) => {
    const during = await netState(lab, vmNs);
    t.ok(during.addrs.some((a) => a.includes(VIP1)) && during.tables.length > baseline.tables.length, `serving: ${during.addrs.join(', ')}; ${during.tables.join(', ')}`);
    const r = await vm.systemctl('stop', 'lb-agent');
    t.equal(r.code, 0, r.stderr);
    t.equal((await vm.show('lb-agent', 'ActiveState')).ActiveState, 'inactive');
    t.same(await netState(lab, vmNs), baseline, 'addresses, links and tables as before the first start');
    t.same(await dsrProgramsIn(lab, vmNs), [], 'and no DSR program (ExecStopPost\'s withdraw, as root, took it off)');
    t.same(await natProgramsIn(lab, vmNs), [], 'and no NAT program');
  });
});
