// VRRP between two lb-agent.service units under a real systemd: two Debian
// bookworm containers (lab/systemd-container.ts) are two VMs on one lab LAN,
// each running the shipped unit (User=lb-agent, its four capabilities, its
// address families and system-call filter, --on-stop keep, ExecStopPost=
// withdraw). The vrrp-agent-*.test.ts tests run the agent as root; the DSR
// program bug of stop 30 showed what that can hide, so here the unit itself
// must be able to: open the AF_PACKET socket and send adverts from the
// virtual router MAC, hear the peer, take the VIP with its gratuitous ARP,
// resign with priority 0 on `systemctl stop`, preempt back on start, and
// recover from a crash (SIGKILL, Restart=on-failure) without two nodes
// answering for the VIP. A client polls the VIP every 20 ms throughout.
import t from 'tap';
import { requireSystemdContainer } from '../helpers/privileged';
import { createLab, waitFor, Lab } from '../../lab/netns';
import { startBackend, httpGetFrom } from '../../lab/services';
import { ClientLoop, gapReport, type GapReport } from '../../lab/client-loop';
import { bootSystemdContainer, SystemdContainer } from '../../lab/systemd-container';
import type { StatusDocument } from '../../agent/daemon/daemon';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const HC = { periodSeconds: 0.3, timeoutSeconds: 0.3 };
const VIP = '10.99.0.200';
const VRID = 61;
const BODIES = ['b1', 'b2'];
const VMS = [
  { name: 'vm1', ip: '10.99.0.2', priority: 200 },
  { name: 'vm2', ip: '10.99.0.3', priority: 100 },
] as const;

function config(vm: typeof VMS[number]): Record<string, unknown> {
  return {
    node: { name: vm.name, interface: 'eth0', priority: vm.priority },
    failover: { mode: 'vrrp', vrid: VRID, advertInterval: 0.1, preempt: true, preemptDelay: 0 },
    metrics: { listen: '' },
    dataplane: 'auto',
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    arp: FAST_ARP,
    services: [{ name: 'api', ipam: 'pool', loadBalancerIP: VIP, ports: [{ name: 'http', port: 80, targetPort: 8080 }], backends: ['10.99.0.11', '10.99.0.12'], healthCheck: HC }],
  };
}

async function status(vm: SystemdContainer): Promise<StatusDocument | undefined> {
  const r = await vm.lbAgent('status', '--json');
  if (r.code !== 0) return undefined;
  return JSON.parse(r.stdout) as StatusDocument;
}

/** The api service's VRRP state on a VM ('master', 'backup', ...) and the Master it names; undefined while its agent does not answer. */
async function vrrp(vm: SystemdContainer): Promise<{ state?: string; master?: string } | undefined> {
  const s = await status(vm);
  const api = s?.services.find((x) => x.name === 'api');
  return api?.failover;
}

/** Whether the VIP is on the VM namespace's eth0, as the host sees it. */
async function holdsVip(lab: Lab, ns: string): Promise<boolean> {
  return (await lab.sh(ns, 'ip -o -4 addr show dev eth0')).stdout.includes(` ${VIP}/`);
}

/**
 * When `vm` last took the VIP after `since` (ms since the epoch), from its
 * agent's own log lines in the journal: its VRRP transition to Master, and
 * "holds <VIP>/32", logged right after its gratuitous ARP.
 */
async function takeoverWindow(vm: SystemdContainer, since: number): Promise<{ masterAt: number; holdsAt: number } | undefined> {
  let masterAt: number | undefined;
  let holdsAt: number | undefined;
  for (const line of (await vm.journal('lb-agent', { output: 'cat', lines: 400 })).split('\n')) {
    let o: { time?: string | number; msg?: string; op?: string };
    try { o = JSON.parse(line) as typeof o; } catch { continue; }
    const at = typeof o.time === 'number' ? o.time : Date.parse(String(o.time));
    if (!(at >= since)) continue;
    if (o.op === 'transition' && o.msg === 'VRRP state master') { masterAt = at; holdsAt = undefined; }
    if (masterAt !== undefined && holdsAt === undefined && o.op === 'bound' && o.msg?.startsWith(`holds ${VIP}/32`)) holdsAt = at;
  }
  return masterAt !== undefined && holdsAt !== undefined ? { masterAt, holdsAt } : undefined;
}

/** Wait until `master` reports Master and serves the VIP, and every other running unit is Backup naming it. */
async function waitMaster(vms: SystemdContainer[], master: number, running: boolean[], timeoutMs = 20_000): Promise<void> {
  let last: unknown[] = [];
  try {
    await waitFor(`${VMS[master]!.name} the one VRRP Master`, async () => {
      last = await Promise.all(vms.map((vm, i) => (running[i] ? vrrp(vm) : Promise.resolve('stopped'))));
      return last.every((f, i) => {
        if (!running[i]) return true;
        const v = f as { state?: string; master?: string } | undefined;
        return i === master ? v?.state === 'master' : v?.state === 'backup' && v.master === VMS[master]!.ip;
      });
    }, timeoutMs, 100);
  } catch (e) {
    throw new Error(`${(e as Error).message}; last ${JSON.stringify(last)}\n${(await Promise.all(vms.map((vm) => vm.journal('lb-agent', { lines: 15 })))).join('\n')}`);
  }
}

t.test('VRRP between two lb-agent.service units under systemd 252', async (t) => {
  if (!requireSystemdContainer(t)) return;
  const lab = await createLab(t);
  const ns = [await lab.addHost('vm1', { address: `${VMS[0].ip}/24` }), await lab.addHost('vm2', { address: `${VMS[1].ip}/24` })];
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await lab.addHost('b2', { address: '10.99.0.12/24' });
  const client = await lab.addHost('client', { address: '10.99.0.50/24' });
  await startBackend(lab, lab.ns('b1'), 'b1');
  await startBackend(lab, lab.ns('b2'), 'b2');

  const bootStart = Date.now();
  // One after the other: two boots at once failed once (systemd-remount-fs in one of them).
  const vms: SystemdContainer[] = [];
  for (const [i, vm] of VMS.entries()) vms.push(await bootSystemdContainer(t, lab, { ns: ns[i]!, config: config(vm) }));
  t.comment(`two containers: install + overlay + boot ${Date.now() - bootStart} ms`);
  const [vm1, vm2] = vms as [SystemdContainer, SystemdContainer];
  const running = [true, true];

  /**
   * A client loop through the VIP every 20 ms around `event` (which returns
   * the time it counts from): 400 ms before it, until VMS[master] is the one
   * Master, and 800 ms after that.
   */
  async function loopAround(master: number, event: () => Promise<number>): Promise<GapReport & { at: number }> {
    const loop = await ClientLoop.start(lab, client, `http://${VIP}/`, { intervalMs: 20, timeoutMs: 300, maxMs: 30_000 });
    let at: number;
    try {
      await new Promise((r) => setTimeout(r, 400));
      at = await event();
      await waitMaster(vms, master, running);
      await new Promise((r) => setTimeout(r, 800));
    } catch (e) {
      await loop.stop();
      throw e;
    }
    return { ...gapReport(await loop.stop(), at, BODIES), at };
  }

  await t.test('both units start; the higher priority is Master and serves the VIP, the other is Backup', async (t) => {
    for (const vm of vms) {
      const r = await vm.systemctl('start', 'lb-agent');
      t.equal(r.code, 0, `systemctl start on ${vm.name}: ${r.stderr.trim()}`);
    }
    await waitMaster(vms, 0, running);
    t.ok(await holdsVip(lab, ns[0]!), 'vm1 holds the VIP');
    t.notOk(await holdsVip(lab, ns[1]!), 'vm2 does not');
    const body = await httpGetFrom(lab, client, `http://${VIP}/`, 2000);
    t.ok(body.ok && BODIES.includes(body.body.trim()), `the client is served through the VIP (${body.ok ? body.body.trim() : body.error})`);
    // Each unit's process is the unit's user with the unit's capabilities: the Master's adverts came from it.
    for (const vm of vms) {
      const pid = await vm.mainPid();
      const who = await vm.sh(`stat -c %U /proc/${pid}`);
      t.equal(who.stdout.trim(), 'lb-agent', `${vm.name}'s daemon runs as lb-agent`);
    }
    const journal = await vm2.journal('lb-agent');
    t.notMatch(journal, /EPERM|EACCES|operation not permitted/i, 'vm2\'s journal has no permission error');
  });

  await t.test('systemctl stop on the Master: priority 0, vm2 takes over at once, vm1 leaves no VIP', async (t) => {
    let cursor = '';
    const g = await loopAround(1, async () => {
      cursor = await vm2.cursor();
      const stopAt = Date.now();
      const r = await vm1.systemctl('stop', 'lb-agent');
      t.equal(r.code, 0, `systemctl stop: ${r.stderr.trim()}`);
      running[0] = false;
      return stopAt;
    });
    const journal = await vm2.journal('lb-agent', { after: cursor, output: 'cat' });
    t.match(journal, /"to":"master"[^\n]*"reason":"master-resigned"|"reason":"master-resigned"[^\n]*"to":"master"/, 'vm2 became Master because vm1 resigned (priority 0), not because it fell silent');
    t.comment(`stop -> served by vm2: ${g.servedAfterMs ?? '?'} ms; ${g.count} requests, ${g.failures.length} failed (${JSON.stringify(g.errors)}), gap ${g.gapMs} ms`);
    t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 3000, `served again within 3 s of the stop (${g.servedAfterMs ?? '?'} ms)`);
    t.same(g.wrongBodies, [], 'every answer came from a backend');
    // [ms after the event, ms taken, error] of each: a failure in CI says when and how.
    t.same(g.failures.map((f) => [f.t - g.at, f.ms, f.error]), [], 'no failed request');
    t.notOk(await holdsVip(lab, ns[0]!), 'vm1 left no VIP behind');
    t.ok(await holdsVip(lab, ns[1]!), 'vm2 holds the VIP');
    t.equal((await vm1.show('lb-agent', 'ActiveState')).ActiveState, 'inactive', 'vm1\'s unit is stopped, not failed');
  });

  await t.test('systemctl start on vm1: it preempts, vm2 gives the VIP back', async (t) => {
    const g = await loopAround(0, async () => {
      const startAt = Date.now();
      const r = await vm1.systemctl('start', 'lb-agent');
      t.equal(r.code, 0, `systemctl start: ${r.stderr.trim()}`);
      running[0] = true;
      return startAt;
    });
    t.comment(`start -> vm1 Master again; ${g.count} requests, ${g.failures.length} failed (${JSON.stringify(g.errors)}), gap ${g.gapMs} ms`);
    t.ok(await holdsVip(lab, ns[0]!), 'vm1 holds the VIP');
    t.notOk(await holdsVip(lab, ns[1]!), 'vm2 took its copy off');
    t.same(g.wrongBodies, [], 'every answer came from a backend');
    // Once 1 failed here in CI: a reset for a client port vm1 had routed on
    // to vm2 while Backup (vrrp-forwarded-flows.test.ts).
    t.same(g.failures.map((f) => [f.t - g.at, f.ms, f.error]), [], 'no failed request');
    t.ok(g.servedAfterMs !== undefined, 'served after the preemption');
  });

  await t.test('SIGKILL of the Master: systemd restarts it, one node answers for the VIP afterwards', async (t) => {
    let killAt = 0;
    const g = await loopAround(0, async () => {
      const before = Number((await vm1.show('lb-agent', 'NRestarts')).NRestarts);
      const old = await vm1.killMain('KILL');
      killAt = Date.now();
      await vm1.waitRunning('lb-agent', 30_000, (p) => Number(p.MainPID) !== old && Number(p.NRestarts) === before + 1);
      return killAt;
    });
    t.comment(`SIGKILL -> restarted and Master again; ${g.count} requests, ${g.failures.length} failed (${JSON.stringify(g.errors)}), gap ${g.gapMs} ms, served again ${g.servedAfterMs ?? '?'} ms after the kill`);
    t.ok(await holdsVip(lab, ns[0]!), 'vm1 holds the VIP');
    t.notOk(await holdsVip(lab, ns[1]!), 'vm2 does not: no duplicate address after the crash');
    t.same(g.wrongBodies, [], 'every answer came from a backend');
    // The dead agent's kernel state serves until the Backup takes over, the
    // Backup until the restarted vm1 preempts. The VIP's return to vm1 once
    // cost 8-10 failed requests in ~200 ms: vm2, giving the VIP up, still had
    // vm1's MAC for it from the earlier return and forwarded to vm1, which
    // (having removed its predecessor's VIP, not yet holding its own)
    // forwarded back. A request in flight when vm2 took the VIP after vm1 fell
    // silent failed in 4 of 14 runs beside a busy loop on one core (0 of 8
    // quiet; tcpdump at the client, b1 and both VMs): its answer, sent by the
    // backend after vm2's gratuitous ARP, went to vm2, which had no conntrack
    // entry for the flow (vm1 opened it) and reset it. vm2 now hands such an
    // answer back to vm1, whose kernel still maps it to the client
    // (forward/nft.ts "Hand-back"; vrrp-hand-back.test.ts makes one on
    // purpose): no request may fail.
    const takeover = await takeoverWindow(vm2, killAt);
    t.comment(`vm2 took over ${takeover ? `${takeover.masterAt - killAt}-${takeover.holdsAt - killAt} ms after the kill` : '(not found in its journal)'}; failed requests at ${JSON.stringify(g.failures.map((f) => [f.t - killAt, f.ms, f.error]))}`);
    t.same(g.failures.map((f) => [f.t - killAt, f.ms, f.error]), [], `no failed request (${JSON.stringify(g.errors)})`);
    t.ok(g.servedAfterMs !== undefined && g.servedAfterMs < 5000, `served again within 5 s of the kill (${g.servedAfterMs ?? '?'} ms)`);
    const after = await httpGetFrom(lab, client, `http://${VIP}/`, 2000);
    t.ok(after.ok && BODIES.includes(after.body.trim()), 'served at the end');
  });

  await t.test('stopping both units leaves neither VIP nor nftables table on either VM', async (t) => {
    for (const vm of vms) {
      const r = await vm.systemctl('stop', 'lb-agent');
      t.equal(r.code, 0, `systemctl stop on ${vm.name}: ${r.stderr.trim()}`);
    }
    for (let i = 0; i < 2; i++) {
      t.notOk(await holdsVip(lab, ns[i]!), `${VMS[i]!.name} holds no VIP`);
      t.equal((await lab.sh(ns[i]!, 'nft list tables')).stdout.trim(), '', `${VMS[i]!.name} has no nftables table`);
    }
  });
});
