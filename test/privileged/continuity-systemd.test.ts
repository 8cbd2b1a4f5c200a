// A VIP never blinks under the real unit (issue 14): lb-agent.service in a
// systemd 252 container that is "the VM" on the continuity lab. A client
// loop through a DHCP VIP and a pool VIP sees zero failed requests across
// `systemctl restart`, an upgrade by systemd/install.sh, and a SIGKILL that Restart= recovers, on the
// kernel path; on the proxy path, zero failed new connections across a
// restart (the listeners wait in systemd's fd store) and, after a SIGKILL,
// failures only among requests that were open when it landed. `systemctl
// stop` still leaves no address, link or table.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t, { type Test } from 'tap';
import { requireSystemdContainer } from '../helpers/privileged';
import { run, waitFor, type Lab } from '../../lab/netns';
import { bootSystemdContainer, type SystemdContainer } from '../../lab/systemd-container';
import type { StatusDocument } from '../../agent/daemon/daemon';
import { buildContinuityLab, continuityConfig, describeReport, Loops } from '../../lab/continuity';
import type { GapReport } from '../../lab/client-loop';

const SERVICES = [{ name: 'web', ipam: 'dhcp' as const }, { name: 'api', ipam: 'pool' as const }];
const REPO = path.resolve(__dirname, '..', '..', '..');

async function status(vm: SystemdContainer): Promise<StatusDocument> {
  const r = await vm.lbAgent('status', '--json');
  if (r.code !== 0) throw new Error(`lb-agent status: ${r.stderr}`);
  return JSON.parse(r.stdout) as StatusDocument;
}

async function serving(vm: SystemdContainer, what: string, pred: (s: StatusDocument) => boolean = () => true): Promise<StatusDocument> {
  return waitFor(what, async () => {
    const p = await vm.show('lb-agent', 'ActiveState');
    if (p.ActiveState === 'failed') throw new Error(`lb-agent failed:\n${await vm.journal('lb-agent', { lines: 60 })}`);
    if (p.ActiveState !== 'active') return undefined;
    const s = await status(vm).catch(() => undefined);
    return s && s.services.every((x) => x.ready) && pred(s) ? s : undefined;
  }, 40_000, 100);
}

/** Wait for a new main pid that is active and serving. */
async function restarted(vm: SystemdContainer, oldPid: number): Promise<number> {
  await serving(vm, 'a new lb-agent serving', (s) => s.pid !== oldPid && s.services.every((x) => x.adopted));
  return (await vm.mainPid())!;
}

async function netState(lab: Lab, ns: string): Promise<{ links: string[]; vips: string[]; table: boolean }> {
  const links = (await lab.sh(ns, 'ip -o link show')).stdout.split('\n').filter((l) => / lbv/.test(l));
  const vips = (await lab.sh(ns, 'ip -4 -o addr show')).stdout.split('\n').map((l) => /inet (\S+\/32)/.exec(l)?.[1]).filter((x): x is string => x !== undefined);
  const table = (await lab.sh(ns, 'nft list tables', { allowFail: true })).stdout.includes('lb_agent');
  return { links, vips, table };
}

/**
 * Where a gap went, for whoever reads a failure: each failed request's
 * start (host clock, which the container shares) and how far from the
 * event at `at` (a request that failed before the event was lost to
 * something else: on a loaded machine, a client or backend process that
 * did not run in time), then the unit's journal from the event on
 * (Restart=, the preflight, Node's start, the first apply), timestamped
 * to the microsecond.
 */
async function commentGap(t: Test, vm: SystemdContainer, cursor: string, at: number, reports: Record<string, GapReport>): Promise<void> {
  for (const [name, rep] of Object.entries(reports)) {
    for (const f of rep.failures) t.comment(`${name}: ${new Date(f.t).toISOString()} (${f.t - at} ms from the event) +${f.ms} ms ${f.error ?? ''}`);
  }
  const lines = (await vm.journal('lb-agent', { after: cursor })).split('\n');
  t.comment(lines.filter((l) => !/"level":(20|10)/.test(l)).slice(0, 80).map((l) => l.slice(0, 260)).join('\n'));
}

for (const dataplane of ['kernel', 'proxy'] as const) {
  t.test(`${dataplane} path: systemctl restart and a SIGKILL that Restart= recovers`, async (t) => {
    if (!requireSystemdContainer(t)) return;
    const cl = await buildContinuityLab(t);
    const cfg = { ...continuityConfig(SERVICES), dataplane };
    delete (cfg as Record<string, unknown>).stateDir;
    // As an operator would after `lb-agent check` (the kernel path forwards; the check warns on ip_forward=0, and the daemon would set it).
    await cl.lab.sh(cl.node, 'sysctl -qw net.ipv4.ip_forward=1');
    const vm = await bootSystemdContainer(t, cl.lab, { ns: cl.node, config: cfg });
    t.equal((await vm.systemctl('start', 'lb-agent')).code, 0, 'started');
    const first = await serving(vm, 'lb-agent serving both VIPs');
    t.equal(first.dataplane?.kind, dataplane);
    const vips = Object.fromEntries(first.services.map((s) => [s.name, s.vip!]));
    // The proxy path's SIGKILL gap is the process's absence (RestartSec, the
    // preflight, Node's start): clients wait in the kept listener's backlog,
    // so their deadline must outlast it; the kernel path never waits.
    const loops = await Loops.start(cl, vips, dataplane === 'proxy' ? 5000 : 500);
    t.teardown(() => loops.stopQuietly());
    await new Promise((r) => setTimeout(r, 500));

    const at = Date.now();
    const cursor = await vm.cursor();
    const r = await vm.systemctl('restart', 'lb-agent');
    t.equal(r.code, 0, `systemctl restart: ${r.stderr}`);
    const pid2 = await restarted(vm, first.pid);
    const journal = await vm.journal('lb-agent', { after: cursor });
    t.match(journal, /left serving for the next start/, 'the old daemon left the data path serving');
    t.match(journal, /kept: no stop of lb-agent.service is under way|no stop of lb-agent.service is under way/, 'ExecStopPost saw a restart and withdrew nothing');
    if (dataplane === 'proxy') t.match(journal, /proxy listening on the socket an earlier process left/, 'the new proxy took its listeners from the fd store');
    await new Promise((r) => setTimeout(r, 1000));
    const afterRestart = await loops.stop(at);
    if (Object.values(afterRestart).some((rep) => rep.failures.length > 0)) await commentGap(t, vm, cursor, at, afterRestart);
    for (const [name, rep] of Object.entries(afterRestart)) {
      t.ok(rep.count >= 50, `${name}: the loop ran across the restart (${rep.count})`);
      t.equal(rep.failures.length, 0, `${name}: no failed request across systemctl restart: ${describeReport(rep)}`);
    }

    // An upgrade as systemd/install.sh does it on the VM: a new release
    // written beside the running agent and switched in one rename, then
    // daemon-reload and restart. (Written from the host into the container's
    // root, which is the same tree; the restart runs inside.)
    const loopsUp = await Loops.start(cl, vips, dataplane === 'proxy' ? 5000 : 500);
    t.teardown(() => loopsUp.stopQuietly());
    await new Promise((r) => setTimeout(r, 500));
    const upCursor = await vm.cursor();
    const upAt = Date.now();
    const before = fs.readlinkSync(vm.file('/usr/lib/lb-agent'));
    await run(path.join(REPO, 'systemd', 'install.sh'), ['--root', vm.root, '--no-enable'], { timeoutMs: 120_000 });
    const release = fs.readlinkSync(vm.file('/usr/lib/lb-agent'));
    t.not(release, before, 'install.sh switched /usr/lib/lb-agent to a new release');
    t.equal((await vm.systemctl('daemon-reload')).code, 0);
    t.equal((await vm.systemctl('restart', 'lb-agent')).code, 0, 'restarted after the install');
    const pid3 = await restarted(vm, pid2);
    const maps = (await vm.sh(`cat /proc/${pid3}/maps`)).stdout;
    t.match(maps, new RegExp(`${path.basename(release)}/native/build/Release/lbagent_native\\.node`), 'the new process runs the new release');
    await new Promise((r) => setTimeout(r, 1000));
    const afterUpgrade = await loopsUp.stop(upAt);
    if (Object.values(afterUpgrade).some((rep) => rep.failures.length > 0)) await commentGap(t, vm, upCursor, upAt, afterUpgrade);
    for (const [name, rep] of Object.entries(afterUpgrade)) {
      t.ok(rep.count >= 50, `${name}: the loop ran across the upgrade (${rep.count})`);
      t.equal(rep.failures.length, 0, `${name}: no failed request across install.sh and restart: ${describeReport(rep)}`);
    }

    const loops2 = await Loops.start(cl, vips, dataplane === 'proxy' ? 5000 : 500);
    t.teardown(() => loops2.stopQuietly());
    await new Promise((r) => setTimeout(r, 500));
    const killCursor = await vm.cursor();
    // The clock starts once the kill has been delivered: killMain looks the
    // pid up and runs kill inside the container (two spawns, ~0.1-0.3 s), and
    // a request started meanwhile may be on a connection the old process had
    // accepted, which its death resets (CI saw one such ECONNRESET).
    await vm.killMain('KILL');
    const killAt = Date.now();
    await restarted(vm, pid3);
    await new Promise((r) => setTimeout(r, 1000));
    const afterKill = await loops2.stop(killAt);
    if (Object.values(afterKill).some((rep) => rep.failures.length > 0)) await commentGap(t, vm, killCursor, killAt, afterKill);
    for (const [name, rep] of Object.entries(afterKill)) {
      t.ok(rep.count >= 50, `${name}: the loop ran across the SIGKILL (${rep.count})`);
      if (dataplane === 'kernel') {
        t.equal(rep.failures.length, 0, `${name}: no failed request across SIGKILL and Restart=: ${describeReport(rep)}`);
      } else {
        // Requests on connections the dead process had accepted may break; none started after it died.
        const late = rep.failures.filter((f) => f.t > killAt);
        t.same(late.map((f) => f.error), [], `${name}: no new connection failed after the SIGKILL: ${describeReport(rep)}`);
      }
    }

    const stopCursor = await vm.cursor();
    t.equal((await vm.systemctl('stop', 'lb-agent')).code, 0, 'systemctl stop');
    t.match(await vm.journal('lb-agent', { after: stopCursor }), /withdrew \d+ item/, 'ExecStopPost withdrew on a stop');
    t.same(await netState(cl.lab, cl.node), { links: [], vips: [], table: false }, 'no address, link or table left');
  });
}
