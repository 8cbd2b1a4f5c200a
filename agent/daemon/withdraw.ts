// `lb-agent withdraw`: take off the LAN everything lb-agent put there, with
// no daemon running - what `systemctl stop lb-agent` runs after the daemon
// exited (ExecStopPost=, with --unless-restarting), since the daemon itself
// leaves the data path serving on SIGTERM under the unit (a restart must not
// blink). Removes the DSR program in front of the netdev table (first: the
// daemon relies on never finding one without the table, forward/nft.ts),
// the nftables tables, every link the agent owns (name and
// MAC prefix) and every address it marked (IFA_PROTO) or claimed; keeps
// leases and claims on disk, so the next start asks for the same addresses.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import { loadConfigFile } from '../config/load';
import { DEFAULTS } from '../config/defaults';
import { errorMessage } from '../errors';
import type { Logger } from '../log';
import { openNetlink } from '../net/netlink/netlink';
import { OWNED_ADDRESS_PROTO, isOwnedLink } from '../net/ownership/ownership';
import { execProgram, renderRemoval, type Exec } from '../forward/nft';
import { CLAIMS_FILE } from '../ipam/claims';
import { StateStore } from '../state/store';
import { InstanceLock } from './lock';
import { ownUnit, stopJobPending } from './systemd';

export interface WithdrawResult {
  /** Set when nothing was withdrawn on purpose, with why. */
  readonly kept?: string;
  readonly removed: readonly string[];
  readonly problems: readonly string[];
}

export interface WithdrawOptions {
  configPath: string;
  /** Withdraw only when the service manager is stopping the unit (not restarting it, nor recovering a crash). */
  unlessRestarting?: boolean;
  log: Logger;
  /** Injected for tests: `systemctl list-jobs` output, and the nft runner. */
  listJobs?: () => string;
  exec?: Exec;
}

function systemctlJobs(): string {
  return execFileSync('systemctl', ['list-jobs', '--no-legend', '--plain', '--no-pager'], { encoding: 'utf8', timeout: 5000 });
}

/**
 * Why a withdrawal should not happen now - a restart, or a crash that
 * Restart= recovers: no stop job for our unit - if so. When the jobs cannot
 * be read, the stop is honoured (`error` says why) rather than leaving VIPs
 * that nothing serves.
 */
export function restartPending(listJobs: () => string, cgroup: string | undefined): { keep?: string; error?: string } {
  const unit = (cgroup !== undefined ? ownUnit(cgroup) : undefined) ?? 'lb-agent.service';
  let jobs: string;
  try { jobs = listJobs(); } catch (e) { return { error: `cannot read systemd's jobs (${errorMessage(e)}); withdrawing` }; }
  return stopJobPending(jobs, unit) ? {} : { keep: `no stop of ${unit} is under way (a restart, or a crash that Restart= recovers): the data path is left serving for the next start` };
}

/**
 * Detach our DSR programs (net/ebpf-attach.ts) from every device that has
 * one, before the table behind them goes. Without bpf(2) here (no addon
 * support, EPERM) nothing of ours can be attached: nothing to report.
 */
function detachDsrPrograms(devices: readonly string[]): { device: string; error?: string }[] {
   
  const { DsrBpf } = require('../net/ebpf/ebpf-attach') as typeof import('../net/ebpf/ebpf-attach');
  const out: { device: string; error?: string }[] = [];
  for (const device of devices) {
    let bpf: InstanceType<typeof DsrBpf>;
    let found: number;
    try { bpf = new DsrBpf({ device }); found = bpf.attached().length; } catch { continue; }
    if (found === 0) continue;
    try { bpf.detach(); out.push({ device }); } catch (e) { out.push({ device, error: errorMessage(e) }); }
  }
  return out;
}

/**
 * Detach the eBPF NAT engine (net/ebpf/nat-attach.ts) from every device
 * that has it, and remove its pins, before the table behind it goes. Without
 * the addon's libbpf loading nothing of it can have been attached here.
 */
function detachNatEngines(devices: readonly string[]): { device: string; error?: string }[] {
  const { NatEngine, natPinDir } = require('../net/ebpf/nat-attach') as typeof import('../net/ebpf/nat-attach');
  const out: { device: string; error?: string }[] = [];
  for (const device of devices) {
    let engine: InstanceType<typeof NatEngine>;
    try { engine = new NatEngine({ device, pinDir: natPinDir(device) }); } catch { return out; }
    try { if (engine.detach() > 0) out.push({ device }); } catch (e) { out.push({ device, error: errorMessage(e) }); }
  }
  return out;
}

export async function withdrawAll(opts: WithdrawOptions): Promise<WithdrawResult> {
  const log = opts.log.child({ module: 'withdraw' });
  if (opts.unlessRestarting) {
    let cgroup: string | undefined;
    try { cgroup = fs.readFileSync('/proc/self/cgroup', 'utf8'); } catch { cgroup = undefined; }
    const verdict = restartPending(opts.listJobs ?? systemctlJobs, cgroup);
    if (verdict.error) log.warn({ op: 'withdraw' }, verdict.error);
    if (verdict.keep) {
      log.info({ op: 'withdraw' }, verdict.keep);
      return { kept: verdict.keep, removed: [], problems: [] };
    }
  }
  // A broken config must not keep a stop from withdrawing: links, marked
  // addresses and the table need no config; only the state directory (the
  // lock, the claims of addresses added before marks existed) and the parent do.
  const res = loadConfigFile(opts.configPath);
  const stateDir = res.ok ? res.config.stateDir : DEFAULTS.stateDir;
  const removed: string[] = [];
  const problems: string[] = [];
  let lock: InstanceLock | undefined;
  if (fs.existsSync(stateDir)) {
    lock = new InstanceLock(stateDir);
    lock.acquire(); // a running daemon owns what it announced: refuse (LB_ERR_DAEMON_LOCKED)
  }
  const netlink = openNetlink({ log });
  try {
    const exec = opts.exec ?? execProgram;
    const links = await netlink.listLinks();
    for (const d of detachDsrPrograms(links.filter((l) => !isOwnedLink(l)).map((l) => l.name))) {
      if (d.error !== undefined) problems.push(`DSR program on ${d.device}: ${d.error}`);
      else removed.push(`DSR program on ${d.device}`);
    }
    for (const d of detachNatEngines(links.filter((l) => !isOwnedLink(l)).map((l) => l.name))) {
      if (d.error !== undefined) problems.push(`eBPF NAT engine on ${d.device}: ${d.error}`);
      else removed.push(`eBPF NAT engine on ${d.device}`);
    }
    try {
      await exec('nft', ['-f', '-'], renderRemoval());
      removed.push('nftables table ip lb_agent');
    } catch (e) {
      problems.push(`nftables table: ${errorMessage(e)}`);
    }
    // All at once: each deletion waits for RCU grace periods in the kernel
    // (~15 ms), and the waits of concurrent ones overlap (README, "Kernel
    // calls that wait run off the event loop").
    const owned = links.filter(isOwnedLink);
    const deletions = await Promise.allSettled(owned.map((link) => netlink.deleteLink(link.index)));
    deletions.forEach((d, i) => {
      const name = owned[i]!.name;
      if (d.status === 'fulfilled') removed.push(`link ${name}`);
      else problems.push(`link ${name}: ${errorMessage(d.reason)}`);
    });
    let claimed = new Set<string>();
    try {
      const doc = new StateStore(stateDir).read<{ claims?: Record<string, { address?: unknown }> }>(CLAIMS_FILE);
      claimed = new Set(Object.values(doc?.claims ?? {}).map((c) => c.address).filter((a): a is string => typeof a === 'string'));
    } catch (e) {
      problems.push(`pool claims unreadable (${errorMessage(e)}): only marked addresses are removed`);
    }
    // In netlink batches: a thousand VIPs are a few datagrams, not a thousand round trips.
    const ours = [...await netlink.listAddresses(), ...await netlink.listAddresses(undefined, 'IPv6')]
      .filter((a) => a.proto === OWNED_ADDRESS_PROTO || ((a.prefix === 32 || a.prefix === 128) && claimed.has(a.address)));
    (await netlink.removeAddresses(ours).catch((e: unknown) => ours.map(() => e as Error))).forEach((r, i) => {
      const a = ours[i]!;
      if (r === true) removed.push(`address ${a.address}/${a.prefix}`);
      else if (r !== false) problems.push(`address ${a.address}/${a.prefix}: ${errorMessage(r)}`);
    });
  } finally {
    netlink.close();
    lock?.release();
  }
  log.info({ op: 'withdraw', removed, problems }, `withdrew ${removed.length} item(s)${problems.length ? `; ${problems.length} problem(s)` : ''}`);
  return { removed, problems };
}
