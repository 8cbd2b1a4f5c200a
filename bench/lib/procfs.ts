// /proc readers for the bench (Linux only): a process's memory (VmRSS,
// VmHWM), its CPU seconds, its descendants, and the machine's facts and load.
// Read-only; nothing here starts or stops anything.
import * as fs from 'node:fs';
import * as os from 'node:os';
import { spawnSync } from 'node:child_process';

export interface Memory { rssKiB: number; hwmKiB: number }

/** VmRSS and VmHWM of one process, in KiB; undefined when it is gone. */
export function memoryOf(pid: number | undefined): Memory | undefined {
  if (pid === undefined) return undefined;
  try {
    const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(s)?.[1] ?? NaN);
    return { rssKiB: field('VmRSS'), hwmKiB: field('VmHWM') };
  } catch { return undefined; }
}

/**
 * TCP connections accepted so far in the network namespace of a process
 * (/proc/PID/net/snmp, Tcp PassiveOpens: a per-namespace counter); NaN when
 * the process is gone.
 */
export function tcpPassiveOpens(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const [names, values] = fs.readFileSync(`/proc/${pid}/net/snmp`, 'utf8').split('\n').filter((l) => l.startsWith('Tcp:')).map((l) => l.trim().split(/\s+/));
    return Number(values?.[names?.indexOf('PassiveOpens') ?? -1] ?? NaN);
  } catch { return NaN; }
}

/**
 * A process's open file descriptors (/proc/PID/fd) and, of them, its packet
 * sockets (the inodes /proc/PID/net/packet lists: AF_PACKET sockets of its
 * network namespace); NaN when the process is gone.
 */
export function descriptorsOf(pid: number | undefined): { total: number; packet: number } {
  if (pid === undefined) return { total: NaN, packet: NaN };
  try {
    const fds = fs.readdirSync(`/proc/${pid}/fd`);
    const inodes = new Set(fs.readFileSync(`/proc/${pid}/net/packet`, 'utf8').split('\n').slice(1).map((l) => l.trim().split(/\s+/)[8]).filter((x): x is string => x !== undefined && x !== ''));
    let packet = 0;
    for (const fd of fds) {
      try {
        const m = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
        if (m && inodes.has(m[1]!)) packet++;
      } catch { /* closed meanwhile */ }
    }
    return { total: fds.length, packet };
  } catch { return { total: NaN, packet: NaN }; }
}

/** The parent pid of every live process. */
function parents(): Map<number, number> {
  const m = new Map<number, number>();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]);
      m.set(Number(d), ppid);
    } catch { /* exited meanwhile */ }
  }
  return m;
}

/** A process's start time (clock ticks since boot): with the pid, it names one process even after pid reuse. */
export function startTimeOf(pid: number): string | undefined {
  try {
    const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return st.slice(st.lastIndexOf(')') + 2).split(' ')[19];
  } catch { return undefined; }
}

/** pid and all its live descendants (nginx's master and workers, say). */
export function processTree(pid: number | undefined): number[] {
  if (pid === undefined) return [];
  const pp = parents();
  const out = [pid];
  for (let i = 0; i < out.length && out.length < 1000; i++) {
    for (const [child, parent] of pp) if (parent === out[i]) out.push(child);
  }
  return out.filter((p) => pp.has(p));
}

/** Summed memory of a process tree, in MiB (RSS counts shared pages once per process, as `ps` does). */
export function treeMemoryMiB(pid: number | undefined): { rssMiB: number; hwmMiB: number; processes: number } {
  const pids = processTree(pid);
  let rss = 0;
  let hwm = 0;
  for (const p of pids) {
    const m = memoryOf(p);
    if (m) { rss += m.rssKiB; hwm += m.hwmKiB; }
  }
  return { rssMiB: pids.length ? rss / 1024 : NaN, hwmMiB: pids.length ? hwm / 1024 : NaN, processes: pids.length };
}

/** User + system CPU seconds of one process and its threads (USER_HZ = 100). */
export function cpuSecondsOf(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch { return NaN; }
}

/** User + system CPU ms of one process and of the children it has reaped (an agent's nft runs), in 10 ms ticks; NaN when it is gone. */
export function cpuWithChildrenMs(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * 10;
  } catch { return NaN; }
}

/**
 * CPU time of a process's live threads, ms, at the scheduler's nanosecond
 * resolution (/proc/<pid>/task/<tid>/schedstat: time on a CPU), where
 * /proc/<pid>/stat counts 10 ms ticks. Threads that have exited are not in
 * it. NaN when the process is gone.
 */
export function threadsCpuMs(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    let ns = 0;
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      try { ns += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]); } catch { /* the thread ended */ }
    }
    return ns / 1e6;
  } catch { return NaN; }
}

/** Summed CPU seconds of a process tree. */
export function treeCpuSeconds(pid: number | undefined): number {
  return processTree(pid).reduce((s, p) => s + (cpuSecondsOf(p) || 0), 0);
}

/** Context switches (voluntary and not) of a process tree so far: an nginx that sleeps in epoll_wait switches once per wake-up. */
export function treeContextSwitches(pid: number | undefined): number {
  return processTree(pid).reduce((n, p) => {
    try {
      const st = fs.readFileSync(`/proc/${p}/status`, 'utf8');
      return n + Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(st)?.[1] ?? 0) + Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(st)?.[1] ?? 0);
    } catch { return n; }
  }, 0);
}

export function loadAverage(): [number, number, number] {
  const [a, b, c] = os.loadavg();
  return [Math.round(a! * 100) / 100, Math.round(b! * 100) / 100, Math.round(c! * 100) / 100];
}

/** The first non-empty line a tool prints about its version (some print it on stderr). */
function versionLine(cmd: string, args: string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 5000 });
  if (r.error) return 'missing';
  return `${r.stdout ?? ''}\n${r.stderr ?? ''}`.split('\n').find((l) => l.trim() !== '')?.trim() ?? 'unknown';
}

export interface Machine {
  cpus: number; cpuModel: string; memoryMiB: number; kernel: string; os: string; node: string;
  tools: Record<string, string>;
}

export function machineFacts(): Machine {
  let osName = os.type();
  try { osName = /^PRETTY_NAME="?([^"\n]+)/m.exec(fs.readFileSync('/etc/os-release', 'utf8'))?.[1] ?? osName; } catch { /* keep */ }
  return {
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memoryMiB: Math.round(os.totalmem() / 2 ** 20),
    kernel: os.release(),
    os: osName,
    node: process.version,
    tools: {
      haproxy: versionLine('haproxy', ['-v']),
      nginx: versionLine('nginx', ['-v']),
      wrk: versionLine('wrk', ['-v']),
      iperf3: versionLine('iperf3', ['-v']),
      dnsmasq: versionLine('dnsmasq', ['-v']),
      busybox: versionLine('busybox', []),
      dhclient: versionLine('dhclient', ['--version']),
    },
  };
}

/** CPU ticks (USER_HZ) the whole machine spent busy in processes (user, nice, system), from /proc/stat. */
export function machineBusyTicks(): number {
  try {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
    return (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0);
  } catch { return NaN; }
}

/** CPU ticks of this process and every child it has reaped (the bench's labs, agents, peers, load generators). */
export function selfTreeTicks(): number {
  try {
    const st = fs.readFileSync('/proc/self/stat', 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
  } catch { return NaN; }
}

/**
 * A meter of the CPU other processes on the machine used (other tests, other
 * helpers' work): machine busy time minus the bench's own tree, in cores.
 * Read `stop()` after the area's lab is gone, so its children are reaped and
 * counted as the bench's. Softirq time (packets forwarded by the kernel) is
 * in neither count.
 */
export function otherCpuMeter(): { stop(): number } {
  const m0 = machineBusyTicks();
  const s0 = selfTreeTicks();
  const t0 = Date.now();
  return {
    stop: () => {
      const secs = (Date.now() - t0) / 1000;
      const other = (machineBusyTicks() - m0 - (selfTreeTicks() - s0)) / 100;
      return secs > 0 ? Math.max(0, Math.round((other / secs) * 100) / 100) : NaN;
    },
  };
}

/**
 * CPU ms of a process at the scheduler's resolution for its live threads
 * (threadsCpuMs) plus the children it has reaped (an agent's nft runs), in
 * 10 ms ticks; NaN when it is gone.
 */
export function cpuFineWithChildrenMs(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return threadsCpuMs(pid) + (Number(f[13]) + Number(f[14])) * 10;
  } catch { return NaN; }
}
