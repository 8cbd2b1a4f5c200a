// lab/systemd-container.ts: a real systemd (PID 1, Debian bookworm's 252) booted with systemd-nspawn
// inside a lab's VM namespace, with lb-agent installed by systemd/install.sh:
// the unit runs as it runs on a VM (Type=notify, the watchdog, ExecStartPre=+,
// User=, capabilities, sandboxing, Restart=). Tests drive it through
// systemctl and journalctl inside the container and reach its VIPs from the
// other lab hosts.
//
// The root file system is built once (scripts/systemd-root.sh, debootstrap)
// at a cache path outside the checkout and never written: each container
// boots an overlay of it (kernel overlayfs, upper layer in a scratch
// directory), so per-test state costs the ~20 MB install.sh writes, not a
// copy of the root. The host's node binary is bind-mounted read-only.
// Everything is undone by stop(), registered with t.teardown, by process
// exit, and - when a test process was killed - by the next container, which
// unmounts and removes the scratch directories of dead pids.
import { spawn, ChildProcess, execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { stringify } from './yaml';
import { withTestEngine, withTestEngineText } from './agent';
import { Lab, run, waitFor, ExecResult } from './netns';
import { within, TIMED_OUT } from './within';

// This file runs as dist/lab/systemd-container.js: the checkout is two levels up.
const REPO = path.resolve(__dirname, '..', '..');
const ROOT_SCRIPT = path.join(REPO, 'scripts', 'systemd-root.sh');
const SCRATCH_PREFIX = 'lbt-sd-';
const CONTAINER_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const live = new Set<SystemdContainer>();
let counter = 0;

// CAP_BPF, CAP_PERFMON: the unit hands them to the agent (direct server return's program, the eBPF NAT engine), and nspawn's own default set lacks them; a VM's systemd has them.
export const DEFAULT_CONTAINER_CAPABILITIES = ['CAP_NET_ADMIN', 'CAP_NET_RAW', 'CAP_BPF', 'CAP_PERFMON'];

export interface ContainerOptions {
  /** Lab namespace the container joins as its network ("the VM"). */
  ns: string;
  /** /etc/lb-agent/config.yaml before boot: an object (written as YAML) or the file's text. */
  config?: Record<string, unknown> | string;
  /** Enable lb-agent.service, so the boot starts it (default false: tests start it). */
  enable?: boolean;
  /**
   * Capabilities nspawn keeps beyond its default set. A container that joins
   * an existing network namespace gets no CAP_NET_ADMIN or CAP_NET_RAW
   * otherwise, and the preflight then fails (rightly).
   */
  capabilities?: string[];
  /** How long boot may take until `systemctl is-system-running` settles. */
  bootTimeoutMs?: number;
}

/** The cached bookworm root; built (about 80 s, minutes on a loaded machine) only when missing. */
export async function ensureSystemdRoot(): Promise<string> {
  const r = await run(ROOT_SCRIPT, [], { timeoutMs: 20 * 60_000 });
  return r.stdout.trim().split('\n').pop()!;
}

/** Why the container cannot run here, or undefined (root, nspawn, overlayfs). */
export function systemdContainerUnavailableReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (systemd-nspawn, overlayfs)';
  for (const [bin, pkg] of [['systemd-nspawn', 'systemd-container'], ['nsenter', 'util-linux'], ['systemd-sysusers', 'systemd']] as const) {
    try { execFileSync('sh', ['-c', `command -v ${bin}`], { stdio: 'ignore' }); } catch { return `needs ${bin} (apt-get install ${pkg}; scripts/setup.sh does)`; }
  }
  try {
    if (!fs.readFileSync('/proc/filesystems', 'utf8').includes('\toverlay\n')) return 'needs overlayfs in the kernel';
  } catch { return 'cannot read /proc/filesystems'; }
  return undefined;
}

/** Unmount and remove scratch directories of test processes that no longer exist. */
export function sweepStaleContainers(): void {
  let names: string[] = [];
  try { names = fs.readdirSync(os.tmpdir()); } catch { return; }
  for (const n of names) {
    const m = new RegExp(`^${SCRATCH_PREFIX}(\\d+)-`).exec(n);
    if (!m) continue;
    try { process.kill(Number(m[1]), 0); continue; } catch { /* dead: ours to clean */ }
    removeScratch(path.join(os.tmpdir(), n));
  }
}

function removeScratch(dir: string): void {
  // A container whose test process was killed is still running: end it first.
  // The pids are only trusted while nspawn's command line names this root.
  try {
    const [nspawnPid, leaderPid] = fs.readFileSync(path.join(dir, 'pids'), 'utf8').trim().split(' ').map(Number);
    const cmdline = fs.readFileSync(`/proc/${nspawnPid}/cmdline`, 'utf8');
    if (cmdline.startsWith('systemd-nspawn\0') && cmdline.includes(`\0${path.join(dir, 'root')}\0`)) {
      if (leaderPid && readChildren(nspawnPid!).includes(leaderPid)) process.kill(leaderPid, 'SIGKILL');
      process.kill(nspawnPid!, 'SIGKILL');
    }
  } catch { /* no pids file, or nothing left running */ }
  try { execFileSync('umount', ['-l', path.join(dir, 'root')], { stdio: 'ignore' }); } catch { /* not mounted */ }
  try { fs.rmSync(dir, { recursive: true, force: true }); } catch { /* ignore */ }
}

export class SystemdContainer {
  /** Machine name (and hostname) of the container. */
  readonly name: string;
  /** The container's root as the host sees it (the overlay's merged view). */
  readonly root: string;
  /** The boot's wall time, ms from spawning nspawn to a settled system. */
  bootMs = 0;
  private readonly dir: string;
  private nspawn: ChildProcess | undefined;
  private leaderPid = 0;
  private stopped = false;

  private constructor(name: string, dir: string) {
    this.name = name;
    this.dir = dir;
    this.root = path.join(dir, 'root');
  }

  /**
   * Overlay the cached root, install the built agent into it, boot it in
   * opts.ns and wait until systemd has settled. stop() is registered on t.
   */
  static async boot(t: { teardown(fn: () => unknown): void }, lab: Lab, opts: ContainerOptions): Promise<SystemdContainer> {
    sweepStaleContainers();
    const lower = await ensureSystemdRoot();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), `${SCRATCH_PREFIX}${process.pid}-`));
    // Host names are at most 64 characters; lab ids are short.
    const c = new SystemdContainer(`${lab.id}-vm${(counter++).toString(36)}`.slice(0, 60), dir);
    live.add(c);
    t.teardown(() => c.stop());
    for (const d of ['upper', 'work', 'root']) fs.mkdirSync(path.join(dir, d));
    await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lower},upperdir=${dir}/upper,workdir=${dir}/work`, c.root]);
    // --no-enable: install only; the test decides when the unit starts.
    await run(path.join(REPO, 'systemd', 'install.sh'), ['--root', c.root, ...(opts.enable ? ['--no-start'] : ['--no-enable'])], { timeoutMs: 120_000 });
    if (opts.config !== undefined) c.writeConfig(opts.config);
    await c.start(opts);
    return c;
  }

  private async start(opts: ContainerOptions): Promise<void> {
    const caps = opts.capabilities ?? DEFAULT_CONTAINER_CAPABILITIES;
    const console = fs.openSync(path.join(this.dir, 'console.log'), 'a');
    const t0 = Date.now();
    // --register=no --keep-unit: the host has no systemd, so no system bus to
    // register a machine with (nspawn fails with "Failed to open system bus").
    this.nspawn = spawn('systemd-nspawn', [
      '-D', this.root, '-b', '--register=no', '--keep-unit', '-M', this.name, '--quiet',
      `--network-namespace-path=/run/netns/${opts.ns}`,
      `--bind-ro=${process.execPath}:/usr/bin/node`,
      `--capability=${caps.join(',')}`,
    ], {
      stdio: ['ignore', console, console],
      // nspawn's own seccomp filter fails every bpf(2) in the container with
      // EPERM (even root's), which no VM does: the unit's own filter, which
      // lets bpf through for direct server return's program, is the one to
      // test. SYSTEMD_SECCOMP=0 turns nspawn's off (systemd-nspawn(1)).
      env: { ...process.env, SYSTEMD_SECCOMP: '0' },
    });
    fs.closeSync(console);
    const nspawn = this.nspawn;
    this.leaderPid = await waitFor('systemd-nspawn to start the container\'s init', () => {
      if (nspawn.exitCode !== null) throw new Error(`systemd-nspawn exited with ${nspawn.exitCode}: ${this.console()}`);
      return containerInit(nspawn.pid!);
    }, 15_000, 50);
    fs.writeFileSync(path.join(this.dir, 'pids'), `${nspawn.pid} ${this.leaderPid}\n`);
    const settled = await waitFor('the container\'s systemd to settle', async () => {
      if (nspawn.exitCode !== null) throw new Error(`systemd-nspawn exited with ${nspawn.exitCode}: ${this.console()}`);
      const r = await this.exec('systemctl', ['is-system-running'], { allowFail: true, timeoutMs: 5000 });
      const state = r.stdout.trim();
      return state === 'running' || state === 'degraded' ? state : undefined;
    }, opts.bootTimeoutMs ?? 60_000, 100).catch((e: Error) => { throw new Error(`${e.message}\nconsole:\n${this.console()}`); });
    this.bootMs = Date.now() - t0;
    if (settled === 'degraded') {
      const failed = await this.systemctl('--failed', '--no-legend', '--plain');
      throw new Error(`the container booted degraded: ${failed.stdout}`);
    }
    // A VM's systemd mounts the BPF file system at boot (mode 0700); a
    // container's skips it, and the unit's own mount (ExecStartPre=+) is not
    // seen outside that command here (systemd 252 under nspawn).
    await this.exec('mount', ['-t', 'bpf', '-o', 'mode=0700', 'bpf', '/sys/fs/bpf']);
  }

  /** The container's PID 1 as the host sees it. */
  get leader(): number { return this.leaderPid; }

  /** A path inside the container, as the host sees it. */
  file(p: string): string { return path.join(this.root, p); }

  /** Write /etc/lb-agent/config.yaml (an object as YAML, or text), readable by the unit's user. */
  writeConfig(cfg: Record<string, unknown> | string): void {
    fs.writeFileSync(this.file('/etc/lb-agent/config.yaml'), typeof cfg === 'string' ? withTestEngineText(cfg) : stringify(withTestEngine(cfg)), { mode: 0o644 });
  }

  /** Run a command in all of the container's namespaces (as root, as `machinectl shell` would). */
  exec(cmd: string, args: string[], opts: { allowFail?: boolean; timeoutMs?: number; input?: string } = {}): Promise<ExecResult> {
    if (!this.leaderPid) throw new Error(`container ${this.name} is not running`);
    // A clean environment, as a login inside would have: none of the test
    // runner's NODE_OPTIONS (its loader hooks do not exist in the container).
    return run('env', ['-i', `PATH=${CONTAINER_PATH}`, 'LANG=C.UTF-8', 'nsenter', '-t', String(this.leaderPid), '-a', cmd, ...args], { timeoutMs: 30_000, ...opts });
  }

  /** bash -c inside: for signals (a minbase root has no /bin/kill, ps or pgrep). */
  sh(script: string, opts: { allowFail?: boolean; timeoutMs?: number } = {}): Promise<ExecResult> {
    return this.exec('bash', ['-c', script], opts);
  }

  /** systemctl inside; never throws on a non-zero exit (tests assert on it). */
  systemctl(...args: string[]): Promise<ExecResult> {
    return this.exec('systemctl', ['--no-pager', ...args], { allowFail: true, timeoutMs: 60_000 });
  }

  /** `lb-agent ...` inside, as root; never throws on a non-zero exit. */
  lbAgent(...args: string[]): Promise<ExecResult> {
    return this.exec('/usr/bin/lb-agent', args, { allowFail: true, timeoutMs: 60_000 });
  }

  /** Unit properties (`systemctl show -p`), e.g. ActiveState, SubState, MainPID, StatusText, NRestarts. */
  async show(unit: string, ...props: string[]): Promise<Record<string, string>> {
    const r = await this.exec('systemctl', ['show', unit, ...props.map((p) => `--property=${p}`)], { timeoutMs: 10_000 });
    const out: Record<string, string> = {};
    for (const line of r.stdout.split('\n')) {
      const eq = line.indexOf('=');
      if (eq > 0) out[line.slice(0, eq)] = line.slice(eq + 1);
    }
    return out;
  }

  /** The unit's main pid inside the container, or undefined when it has none. */
  async mainPid(unit = 'lb-agent'): Promise<number | undefined> {
    const pid = Number((await this.show(unit, 'MainPID')).MainPID);
    return pid > 0 ? pid : undefined;
  }

  /** Wait for active (running) with a main pid; returns its properties. */
  async waitRunning(unit = 'lb-agent', timeoutMs = 30_000, pred: (p: Record<string, string>) => boolean = () => true): Promise<Record<string, string>> {
    let last: Record<string, string> = {};
    try {
      return await waitFor(`${unit} active (running)`, async () => {
        last = await this.show(unit, 'ActiveState', 'SubState', 'MainPID', 'StatusText', 'NRestarts', 'Result');
        return last.ActiveState === 'active' && last.SubState === 'running' && Number(last.MainPID) > 0 && pred(last) ? last : undefined;
      }, timeoutMs, 200);
    } catch (e) {
      throw new Error(`${(e as Error).message}; last ${JSON.stringify(last)}\n${await this.journal(unit, { lines: 30 })}`);
    }
  }

  /** A journal position; pass it to journal() to read only what came after. */
  async cursor(): Promise<string> {
    const r = await this.exec('journalctl', ['--show-cursor', '-n', '0', '--no-pager'], { allowFail: true });
    return /-- cursor: (.+)/.exec(r.stdout)?.[1]?.trim() ?? '';
  }

  /** The unit's journal (systemd's lines about it and the unit's own output). */
  async journal(unit = 'lb-agent', opts: { after?: string; lines?: number; output?: 'short' | 'cat' | 'json' } = {}): Promise<string> {
    await this.exec('journalctl', ['--sync'], { allowFail: true });
    const args = ['-u', unit, '--no-pager', '-o', opts.output ?? 'short-precise'];
    if (opts.after) args.push(`--after-cursor=${opts.after}`);
    if (opts.lines) args.push('-n', String(opts.lines));
    return (await this.exec('journalctl', args, { allowFail: true })).stdout;
  }

  /** Signal a process inside (pid as the container sees it). */
  async kill(pid: number, signal: string): Promise<void> {
    await this.sh(`kill -${signal.replace(/^SIG/, '')} ${pid}`);
  }

  /** Signal the unit's main process (e.g. KILL, to crash it as the kernel's OOM killer would). */
  async killMain(signal: string, unit = 'lb-agent'): Promise<number> {
    const pid = await this.mainPid(unit);
    if (!pid) throw new Error(`${unit} has no main process`);
    await this.kill(pid, signal);
    return pid;
  }

  /** What the container printed on its console (boot messages), for failures. */
  console(): string {
    try { return fs.readFileSync(path.join(this.dir, 'console.log'), 'utf8').slice(-4000); } catch { return ''; }
  }

  /**
   * Power off (bounded), then kill whatever remains, unmount and remove the
   * scratch directory. Idempotent; registered with t.teardown by boot().
   */
  async stop(timeoutMs = 10_000): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    live.delete(this);
    const nspawn = this.nspawn;
    if (nspawn && nspawn.exitCode === null && nspawn.signalCode === null) {
      const exited = new Promise<void>((resolve) => nspawn.once('exit', () => resolve()));
      // SIGTERM makes nspawn ask the container's systemd for a clean poweroff.
      nspawn.kill('SIGTERM');
      if (await within(exited, timeoutMs) === TIMED_OUT) {
        // PID 1 of a pid namespace takes every process in it along.
        if (this.leaderPid) { try { process.kill(this.leaderPid, 'SIGKILL'); } catch { /* gone */ } }
        try { nspawn.kill('SIGKILL'); } catch { /* gone */ }
        await within(exited, 3000);
      }
    }
    this.leaderPid = 0;
    removeScratch(this.dir);
  }

  stopSync(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (this.leaderPid) { try { process.kill(this.leaderPid, 'SIGKILL'); } catch { /* gone */ } }
    try { this.nspawn?.kill('SIGKILL'); } catch { /* gone */ }
    removeScratch(this.dir);
  }
}

/**
 * nspawn's child that is the container's PID 1: in a pid namespace of its
 * own and already running systemd. nspawn forks helpers first (an outer
 * child that exits, the inner child before its exec), so the first child
 * seen is not necessarily the init; entering a dead one fails for good.
 */
function containerInit(nspawnPid: number): number | undefined {
  let ours: string;
  try { ours = fs.readlinkSync('/proc/self/ns/pid'); } catch { return undefined; }
  for (const pid of readChildren(nspawnPid)) {
    try {
      if (fs.readlinkSync(`/proc/${pid}/ns/pid`) !== ours && fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'systemd') return pid;
    } catch { /* exited meanwhile */ }
  }
  return undefined;
}

function readChildren(pid: number): number[] {
  try {
    return fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(/\s+/).filter(Boolean).map(Number);
  } catch { return []; }
}

process.on('exit', () => { for (const c of live) c.stopSync(); });

/** Boot a container in lab namespace opts.ns; it is stopped when the test ends, pass or fail. */
export function bootSystemdContainer(t: { teardown(fn: () => unknown): void }, lab: Lab, opts: ContainerOptions): Promise<SystemdContainer> {
  return SystemdContainer.boot(t, lab, opts);
}

/** Decode a /proc/PID/status capability mask (CapEff: 0000000000003000) into CAP_ names. */
export function decodeCapabilities(hex: string): string[] {
  const mask = BigInt(`0x${hex.trim()}`);
  const out: string[] = [];
  for (let bit = 0; bit < 64; bit++) {
    if (mask & (1n << BigInt(bit))) out.push(CAPABILITY_NAMES[bit] ?? `CAP_${bit}`);
  }
  return out;
}

// linux/capability.h, by bit number.
const CAPABILITY_NAMES = [
  'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_DAC_READ_SEARCH', 'CAP_FOWNER', 'CAP_FSETID', 'CAP_KILL', 'CAP_SETGID', 'CAP_SETUID',
  'CAP_SETPCAP', 'CAP_LINUX_IMMUTABLE', 'CAP_NET_BIND_SERVICE', 'CAP_NET_BROADCAST', 'CAP_NET_ADMIN', 'CAP_NET_RAW', 'CAP_IPC_LOCK', 'CAP_IPC_OWNER',
  'CAP_SYS_MODULE', 'CAP_SYS_RAWIO', 'CAP_SYS_CHROOT', 'CAP_SYS_PTRACE', 'CAP_SYS_PACCT', 'CAP_SYS_ADMIN', 'CAP_SYS_BOOT', 'CAP_SYS_NICE',
  'CAP_SYS_RESOURCE', 'CAP_SYS_TIME', 'CAP_SYS_TTY_CONFIG', 'CAP_MKNOD', 'CAP_LEASE', 'CAP_AUDIT_WRITE', 'CAP_AUDIT_CONTROL', 'CAP_SETFCAP',
  'CAP_MAC_OVERRIDE', 'CAP_MAC_ADMIN', 'CAP_SYSLOG', 'CAP_WAKE_ALARM', 'CAP_BLOCK_SUSPEND', 'CAP_AUDIT_READ', 'CAP_PERFMON', 'CAP_BPF',
  'CAP_CHECKPOINT_RESTORE',
];
