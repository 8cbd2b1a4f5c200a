// lab/netns.ts owns the throwaway topology the demo, the bench and the
// privileged tests build: a "LAN" namespace holding a bridge, and host
// namespaces (the agent's node, backends, a DHCP server, a client) each wired
// to it by a veth pair. Only these namespaces (10.99.0.0/24 exists only
// inside them) and loopback are ever addressed.
// Every lab is torn down by its owner's teardown, by process exit, and - if a
// process was killed - by the next lab, which removes namespaces whose owning
// pid is dead (the pid is part of the name).
import { execFile, spawn, ChildProcess, SpawnOptions, execFileSync } from 'node:child_process';
import { promisify } from 'node:util';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const execFileP = promisify(execFile);
const PREFIX = 'lbt';
let labCounter = 0;
const liveLabs = new Set<Lab>();

/** Why a lab cannot be built here (not root, no `ip netns`), or undefined. */
export function labUnavailableReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (network namespaces, macvlan, packet sockets)';
  try {
    execFileSync('ip', ['netns', 'list'], { stdio: 'ignore' });
  } catch {
    return 'needs iproute2 (`ip netns`)';
  }
  return undefined;
}

export interface ExecResult { stdout: string; stderr: string; code: number }

/**
 * The environment of a lab's child processes: this process's, without the
 * module loaders a test runner put in NODE_OPTIONS (tap adds its own
 * `--import` hooks there, quoted, for every child). An agent, a CLI or a
 * driver in a lab runs as it would outside the test: with the hooks, every
 * process and every worker thread of it loaded its modules through a hooks
 * thread (a 2-worker proxy start took ~1.2 s instead of ~0.2 s; one
 * daemon-lifecycle run 11.5-14.8 s of CPU instead of 7.7-8.3 s).
 */
export function childEnv(base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const opts = (base.NODE_OPTIONS ?? '').split(/\s+/).filter((o) => o !== '' && !/^"?--(import|loader|experimental-loader)=.*@tapjs\//.test(o));
  const env = { ...base };
  if (opts.length) env.NODE_OPTIONS = opts.join(' ');
  else delete env.NODE_OPTIONS;
  return env;
}

/** env(1) by its path: a test may give a child a PATH that holds only what it wants found (forward-dsr: `ip`, no nft). */
const ENV_BIN = ['/usr/bin/env', '/bin/env'].find((p) => fs.existsSync(p)) ?? 'env';

/**
 * cmd and args as a lab starts them: through env(1), which sets the child's
 * NODE_OPTIONS to childEnv's (or unsets it). A cleaned environment alone is
 * not enough under tap: its spawn hook (@tapjs/processinfo) puts its loader
 * back into the NODE_OPTIONS of every process this one spawns, `ip` included,
 * and `ip netns exec` hands that on.
 */
export function childCommand(cmd: string, args: readonly string[], base: NodeJS.ProcessEnv = process.env): { cmd: string; args: string[]; env: NodeJS.ProcessEnv } {
  const env = childEnv(base);
  const pin = env.NODE_OPTIONS !== undefined ? [`NODE_OPTIONS=${env.NODE_OPTIONS}`] : ['-u', 'NODE_OPTIONS'];
  return { cmd: ENV_BIN, args: [...pin, cmd, ...args], env };
}

export async function run(cmd: string, args: string[], opts: { input?: string; allowFail?: boolean; timeoutMs?: number } = {}): Promise<ExecResult> {
  try {
    const c = childCommand(cmd, args);
    const p = execFileP(c.cmd, c.args, { timeout: opts.timeoutMs ?? 30_000, maxBuffer: 64 << 20, env: c.env });
    if (opts.input !== undefined) { p.child.stdin?.end(opts.input); }
    const { stdout, stderr } = await p;
    return { stdout, stderr, code: 0 };
  } catch (e) {
    const err = e as { stdout?: string; stderr?: string; code?: number | string };
    const res = { stdout: err.stdout ?? '', stderr: err.stderr ?? '', code: typeof err.code === 'number' ? err.code : 1 };
    if (opts.allowFail) return res;
    throw new Error(`${cmd} ${args.join(' ')} failed (${err.code}): ${res.stderr || res.stdout}`);
  }
}

/** Remove namespaces left by test processes that no longer exist. */
export function sweepStaleNamespaces(): void {
  let names: string[] = [];
  try {
    names = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n').map((l) => l.split(' ')[0]!).filter(Boolean);
  } catch { return; }
  for (const n of names) {
    const m = /^lbt(\d+)x/.exec(n);
    if (!m) continue;
    const pid = Number(m[1]);
    let alive = true;
    try { process.kill(pid, 0); } catch { alive = false; }
    if (!alive) { try { execFileSync('ip', ['netns', 'del', n], { stdio: 'ignore' }); } catch { /* gone already */ } }
  }
}

export interface HostOptions {
  /** IPv4 address with prefix on the host's LAN interface (eth0), e.g. 10.99.0.2/24. */
  address?: string;
  /** Default gateway, if any. */
  gateway?: string;
  /** Extra addresses on eth0. */
  extraAddresses?: string[];
  /**
   * IPv6 addresses with prefix on eth0 (fd00:99::11/64). With any, IPv6 is
   * on in the host (the lab turns it off elsewhere), with its link-local
   * address, and without duplicate address detection
   * (accept_dad=0, `nodad`): nothing waits a second for its own addresses.
   */
  ipv6?: string[];
  /** The LAN bridge eth0 is a port of (addBridge); default br0. */
  bridge?: string;
  /**
   * The host's ephemeral port range (net.ipv4.ip_local_port_range, which
   * IPv6 shares). A client that binds chosen source ports (peer-client's
   * burst and holdOpen) keeps them out of this range, or a connection of
   * its own with a kernel-chosen port may hold one first (EADDRINUSE).
   */
  ephemeralPorts?: [number, number];
}

export class Lab {
  readonly id: string;
  readonly lan: string;
  readonly dir: string;
  private readonly hosts = new Map<string, string>();
  private readonly procs = new Set<ChildProcess>();
  private destroyed = false;
  /** Veth peers of extra NICs (addNic), numbered apart from the hosts' v<n>. */
  private extraNics = 0;

  private constructor(id: string) {
    this.id = id;
    this.lan = `${id}-lan`;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), `${id}-`));
  }

  static async create(): Promise<Lab> {
    sweepStaleNamespaces();
    const id = `${PREFIX}${process.pid}x${(labCounter++).toString(36)}`;
    const lab = new Lab(id);
    liveLabs.add(lab);
    await run('ip', ['netns', 'add', lab.lan]);
    // br0 stands for the L2 switch. br_netfilter is built into these kernels
    // and on in every new namespace, so without the sysctls each bridged IPv4
    // frame runs the bridge's netfilter glue (br_nf_pre_routing, _forward_ip,
    // _post_routing) with no rule behind it, and drops a datagram shorter than
    // its total length, which a switch forwards. In the forward lab that was
    // 1.6% of the load generator's CPU per request direct and 3.8% through DSR,
    // whose requests cross the bridge twice. nft's bridge family,
    // which tests use to filter the LAN, does not depend on them.
    await lab.sh(lab.lan, 'ip link set lo up && ip link add br0 type bridge && ip link set br0 up && sysctl -qw net.ipv6.conf.all.disable_ipv6=1'
      + ' net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0');
    return lab;
  }

  /** The namespace name of a host role. */
  ns(role: string): string {
    const n = this.hosts.get(role);
    if (!n) throw new Error(`lab ${this.id} has no host ${role}`);
    return n;
  }

  /** Add a host namespace with eth0 bridged onto the LAN. */
  async addHost(role: string, opts: HostOptions = {}): Promise<string> {
    if (this.hosts.has(role)) throw new Error(`host ${role} exists`);
    const ns = `${this.id}-${role}`;
    const idx = this.hosts.size;
    const peer = `v${idx}`;
    await run('ip', ['netns', 'add', ns]);
    this.hosts.set(role, ns);
    const cmds = [
      `ip link add eth0 netns ${ns} type veth peer name ${peer}`,
      `ip link set ${peer} master ${opts.bridge ?? 'br0'} up`,
    ];
    await this.sh(this.lan, cmds.join(' && '));
    const six = (opts.ipv6 ?? []).length > 0;
    const hostCmds = six
      ? ['sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.eth0.accept_dad=0', 'ip link set lo up', 'ip link set eth0 up',
        ...(opts.ipv6 ?? []).map((a) => `ip -6 addr add ${a} dev eth0 nodad`)]
      : ['ip link set lo up', 'ip link set eth0 up', 'sysctl -qw net.ipv6.conf.all.disable_ipv6=1'];
    if (opts.address) hostCmds.push(`ip addr add ${opts.address} dev eth0`);
    for (const a of opts.extraAddresses ?? []) hostCmds.push(`ip addr add ${a} dev eth0`);
    if (opts.gateway) hostCmds.push(`ip route add default via ${opts.gateway}`);
    if (opts.ephemeralPorts) hostCmds.push(`sysctl -qw net.ipv4.ip_local_port_range="${opts.ephemeralPorts[0]} ${opts.ephemeralPorts[1]}"`);
    await this.sh(ns, hostCmds.join(' && '));
    return ns;
  }

  /** Another L2 segment: a bridge in the LAN namespace, for hosts on a second network. */
  async addBridge(name: string): Promise<void> {
    await this.sh(this.lan, `ip link add ${name} type bridge && ip link set ${name} up`);
  }

  /** Another NIC of a host (a VM on two networks): `ifname` in the host, its veth peer a port of `bridge`. */
  async addNic(role: string, ifname: string, opts: { bridge: string; address?: string }): Promise<void> {
    const ns = this.ns(role);
    const peer = `x${this.extraNics++}`;
    await this.sh(this.lan, `ip link add ${ifname} netns ${ns} type veth peer name ${peer} && ip link set ${peer} master ${opts.bridge} up`);
    await this.sh(ns, [`ip link set ${ifname} up`, ...(opts.address ? [`ip addr add ${opts.address} dev ${ifname}`] : [])].join(' && '));
  }

  /** Run a shell command inside a namespace. */
  async sh(ns: string, script: string, opts: { allowFail?: boolean; timeoutMs?: number } = {}): Promise<ExecResult> {
    return run('ip', ['netns', 'exec', ns, 'sh', '-c', script], opts);
  }

  /** Run a command inside a namespace. */
  async exec(ns: string, cmd: string, args: string[], opts: { allowFail?: boolean; timeoutMs?: number; input?: string } = {}): Promise<ExecResult> {
    return run('ip', ['netns', 'exec', ns, cmd, ...args], opts);
  }

  /** Start a long-running process in a namespace; killed at teardown. */
  spawn(ns: string, cmd: string, args: string[], opts: SpawnOptions = {}): ChildProcess {
    const c = childCommand('ip', ['netns', 'exec', ns, cmd, ...args], opts.env ?? process.env);
    const child = spawn(c.cmd, c.args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts, env: c.env });
    this.procs.add(child);
    child.on('exit', () => this.procs.delete(child));
    return child;
  }

  /** A path inside the lab's scratch directory. */
  file(name: string): string { return path.join(this.dir, name); }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    liveLabs.delete(this);
    for (const p of this.procs) {
      try { p.kill('SIGKILL'); } catch { /* exited */ }
    }
    await Promise.all([...this.procs].map((p) => new Promise<void>((resolve) => {
      if (p.exitCode !== null || p.signalCode !== null) return resolve();
      const timer = setTimeout(resolve, 2000);
      p.once('exit', () => { clearTimeout(timer); resolve(); });
    })));
    for (const ns of [...this.hosts.values(), this.lan]) {
      // Kill anything still running in the namespace (daemonised dnsmasq etc.).
      const pids = await run('ip', ['netns', 'pids', ns], { allowFail: true });
      for (const pid of pids.stdout.split(/\s+/).filter(Boolean)) {
        try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ }
      }
      await run('ip', ['netns', 'del', ns], { allowFail: true });
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }

  destroySync(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const p of this.procs) { try { p.kill('SIGKILL'); } catch { /* exited */ } }
    for (const ns of [...this.hosts.values(), this.lan]) {
      try {
        const pids = execFileSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' });
        for (const pid of pids.split(/\s+/).filter(Boolean)) { try { process.kill(Number(pid), 'SIGKILL'); } catch { /* gone */ } }
      } catch { /* ns gone */ }
      try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* gone */ }
    }
    try { fs.rmSync(this.dir, { recursive: true, force: true }); } catch { /* ignore */ }
  }
}

process.on('exit', () => { for (const lab of liveLabs) lab.destroySync(); });
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => { for (const lab of liveLabs) lab.destroySync(); process.exit(130); });
}

/** Create a lab that is destroyed when its owner (a test, a bench area) tears down, pass or fail. */
export async function createLab(t: { teardown(fn: () => unknown): void }): Promise<Lab> {
  const lab = await Lab.create();
  t.teardown(() => lab.destroy());
  return lab;
}

/**
 * True once something listens on TCP `port` in ns, or (udp) has UDP `port`
 * bound, on any address: read from /proc/net/{tcp,tcp6} or {udp,udp6}, the
 * local address field and, for TCP, state 0A (LISTEN).
 */
export async function listening(lab: Lab, ns: string, port: number, proto: 'tcp' | 'udp' = 'tcp'): Promise<boolean> {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const r = await lab.sh(ns, `cat /proc/net/${proto} /proc/net/${proto}6`, { allowFail: true });
  return r.stdout.split('\n').some((l) => {
    const f = l.trim().split(/\s+/);
    return f[1]?.endsWith(`:${hex}`) === true && (proto === 'udp' || f[3] === '0A');
  });
}

/** Wait until `what` listens on `port` in ns; fails at once when its process `proc` exits first. */
export async function waitListening(lab: Lab, ns: string, port: number, what: string, o: { proc?: ChildProcess; timeoutMs?: number; proto?: 'tcp' | 'udp' } = {}): Promise<void> {
  const r = await waitFor(`${what} to listen on ${o.proto ?? 'tcp'} port ${port}`, async () => {
    if (o.proc && o.proc.exitCode !== null) return 'exited';
    return (await listening(lab, ns, port, o.proto)) ? 'listening' : undefined;
  }, o.timeoutMs ?? 10_000, 50);
  if (r === 'exited') throw new Error(`${what} exited with ${o.proc!.exitCode} before it listened on port ${port}`);
}

/** Poll until fn returns a truthy value; bounded in time. */
export async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false | null> | T | undefined | false | null, timeoutMs = 10_000, intervalMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastErr: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) { lastErr = e; }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${lastErr ? `: ${String(lastErr)}` : ''}`);
}
