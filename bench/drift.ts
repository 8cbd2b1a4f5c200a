// Bench area "drift": how long a VIP stays down when another program undoes
// what the agent put in the kernel, and what the safety-net resync costs.
//   damage -> first answer   a client loop through a DHCP VIP and a pool VIP
//                            (the continuity lab's: a request every 20 ms, a
//                            new connection each, 300 ms deadline); each kind
//                            of damage is done in the node's namespace, and its
//                            time runs from the moment before the command to
//                            the end of the first answered request that started
//                            after the last failed one (lab/client-loop.ts
//                            gapReport), over the VIPs the damage reaches.
//                            A fresh agent per round: its fight back-off
//                            (daemon/drift-plan.ts) counts repairs of one
//                            subject over a minute, and one round repairs the
//                            table three times.
//   timer reference          Calico Felix-style repair on a timer alone: the
//                            agent is stopped with `--on-stop keep` (its table
//                            and VIPs stay), and a small repairer here - not
//                            the agent - checks the table and the pool VIP every
//                            TIMER_PERIOD_MS and restores what it saved. Each
//                            damage lands at a different phase of its period
//                            (spread evenly over the run), so the median
//                            approaches half the period, a timer design's mean.
//   resync cost              N pool services (health checks off, kernel path),
//                            the agent's CPU (utime + stime of it and its reaped
//                            children, /proc/PID/stat) over a window with
//                            reconcile.resyncInterval 1 s, then, after a reload
//                            to 3600 s, over a window without resyncs; the
//                            difference per resync.
// The pure half (windows, medians, the timer's script, the cost) is exported
// for tests.
import * as fs from 'node:fs';
import { Lab, waitFor } from '../lab/netns';
import { agentCli, waitStatus } from '../lab/agent';
import { buildContinuityLab, continuityConfig, type ContinuityLab } from '../lab/continuity';
import { ClientLoop, gapReport, type ClientResult } from '../lab/client-loop';
import { within, TIMED_OUT } from '../lab/within';
import { runAgent, stopAgent, logTime, FAST_ARP, type AgentHandle } from './lib/agent';
import { cpuWithChildrenMs } from './lib/procfs';
import { median, round } from './lib/stats';

export const DAMAGE_KINDS = ['flush-ruleset', 'delete-table', 'delete-chain', 'pool-address', 'dhcp-address', 'dhcp-link-down', 'dhcp-link-del', 'ip-forward', 'arp-ignore'] as const;
export type DamageKind = (typeof DAMAGE_KINDS)[number];

export const DAMAGE_LABEL: Record<DamageKind, string> = {
  'flush-ruleset': '`nft flush ruleset`',
  'delete-table': '`nft delete table ip lb_agent`',
  'delete-chain': 'one chain of `ip lb_agent` flushed and deleted',
  'pool-address': '`ip addr del` of the pool VIP',
  'dhcp-address': '`ip addr del` of the DHCP VIP',
  'dhcp-link-down': '`ip link set down` of the DHCP macvlan',
  'dhcp-link-del': '`ip link del` of the DHCP macvlan',
  'ip-forward': '`sysctl net.ipv4.ip_forward=0`',
  'arp-ignore': '`sysctl net.ipv4.conf.eth0.arp_ignore=0`',
};

/** The kinds the timer reference repairs, the ones a table-and-address timer can see; --quick runs the first two. */
export const TIMER_KINDS: readonly DamageKind[] = ['delete-table', 'pool-address', 'flush-ruleset', 'delete-chain'];

/** Which VIPs a kind of damage reaches. */
export function reaches(kind: DamageKind): readonly ('dhcp' | 'pool')[] {
  if (kind === 'pool-address') return ['pool'];
  if (kind.startsWith('dhcp-')) return ['dhcp'];
  return ['dhcp', 'pool'];
}

export type DriftWho = 'agent' | 'timer';
export const DRIFT_WHO_LABEL: Record<DriftWho, string> = {
  agent: 'lb-agent drift guard (notifications, resync 30 s)',
  timer: 'timer-only repair (Calico Felix-style), period 10 s',
};

/** Felix's default iptables refresh is 90 s; 10 s keeps the bench short and is kind to the reference. */
export const TIMER_PERIOD_MS = 10_000;
export const LOOP = { intervalMs: 20, timeoutMs: 300 } as const;

export interface DamageMeasure {
  /** Requests started in the window, over the VIPs reached. */
  requests: number;
  failures: number;
  /** From the damage to the start of the first failed request (NaN: none failed). */
  firstFailureMs: number;
  /** From the damage to the end of the first answer that started after it and after the last failure: the time down. */
  downMs: number;
}

export interface DamageRun extends DamageMeasure {
  who: DriftWho; kind: DamageKind; round: number;
  /** From the damage to the agent's "drift repaired" log line (agent rows). */
  repairLoggedMs?: number;
  /** Timer rows: how far into the repairer's period the damage landed (ms). */
  phaseMs?: number;
  error?: string;
}

/**
 * One damage's measure from the loops of the VIPs it reaches (pure): each
 * loop's requests started in [at, to) through gapReport; the VIP back last
 * sets the time down.
 */
export function measureDamage(loops: readonly (readonly ClientResult[])[], at: number, to: number): DamageMeasure {
  let requests = 0;
  let failures = 0;
  let firstFailureMs = NaN;
  let downMs = -Infinity;
  for (const results of loops) {
    const g = gapReport(results.filter((r) => r.t >= at && r.t < to), at, []);
    requests += g.count;
    failures += g.failures.length;
    const ff = g.failures[0];
    if (ff && (Number.isNaN(firstFailureMs) || ff.t - at < firstFailureMs)) firstFailureMs = ff.t - at;
    downMs = Math.max(downMs, g.servedAfterMs ?? NaN);
  }
  return { requests, failures, firstFailureMs, downMs: Number.isFinite(downMs) ? downMs : NaN };
}

export interface DriftSummaryRow {
  who: DriftWho; kind: DamageKind;
  /** Medians over the rounds without an error. */
  downMs: number; failures: number; repairLoggedMs: number;
  /** The longest time down of any round. */
  worstDownMs: number;
  runs: number; runsOk: number;
}

/** Medians per (who, kind), in DAMAGE_KINDS order, agent rows first (pure). */
export function summarizeDrift(runs: readonly DamageRun[]): DriftSummaryRow[] {
  const out: DriftSummaryRow[] = [];
  for (const who of ['agent', 'timer'] as const) {
    for (const kind of DAMAGE_KINDS) {
      const all = runs.filter((r) => r.who === who && r.kind === kind);
      if (all.length === 0) continue;
      const ok = all.filter((r) => r.error === undefined);
      const m = (f: (r: DamageRun) => number | undefined): number => round(median(ok.map((r) => f(r) ?? NaN)), 0);
      const downs = ok.map((r) => r.downMs).filter(Number.isFinite);
      out.push({ who, kind, downMs: m((r) => r.downMs), failures: m((r) => r.failures), repairLoggedMs: m((r) => r.repairLoggedMs), worstDownMs: downs.length ? Math.max(...downs) : NaN, runs: all.length, runsOk: ok.length });
    }
  }
  return out;
}

/** The timer reference against the agent over the kinds both repaired: medians of every run's time down (pure). */
export function timerVersusAgent(runs: readonly DamageRun[]): { timerMs: number; agentMs: number; kinds: DamageKind[] } {
  const ok = runs.filter((r) => r.error === undefined && Number.isFinite(r.downMs));
  const kinds = TIMER_KINDS.filter((k) => ok.some((r) => r.who === 'timer' && r.kind === k) && ok.some((r) => r.who === 'agent' && r.kind === k));
  const of = (who: DriftWho): number => round(median(ok.filter((r) => r.who === who && kinds.includes(r.kind)).map((r) => r.downMs)), 0);
  return { timerMs: of('timer'), agentMs: of('agent'), kinds };
}

/** The chains of an `nft list table` text, in order (pure). */
export function chainNames(tableText: string): string[] {
  return [...tableText.matchAll(/^\s*chain (\S+) \{/gm)].map((m) => m[1]!);
}

/**
 * The timer's restore (pure): one nft transaction that makes sure the table
 * exists, deletes it, and writes the saved text again (nft -f applies a
 * file atomically), as Felix rewrites its chains whole.
 */
export function restoreScript(family: string, table: string, saved: string): string {
  return `table ${family} ${table}\ndelete table ${family} ${table}\n${saved.trim()}\n`;
}

/** The phase of the j-th of n timer damages within the period: spread evenly, mid-slot (pure). */
export function damagePhase(j: number, n: number, periodMs = TIMER_PERIOD_MS): number {
  return Math.round(((j + 0.5) / Math.max(1, n)) * periodMs);
}

/** One pair of CPU windows: resyncing every second, and none (ms of CPU). */
export interface ResyncPair { withMs: number; withoutMs: number }

export interface ResyncCost {
  services: number;
  /** Wall time from `lb-agent run` to every service ready (ms). */
  startMs: number;
  windowSeconds: number;
  /** The resync interval of the windows without a resync (s): longer than a window and the wait before it. */
  quietInterval: number;
  pairs: ResyncPair[];
  /** Medians over the pairs of the agent's CPU in a window, ms. */
  cpuWithMs: number;
  cpuWithoutMs: number;
  /** Resyncs in a window with them (its seconds at one a second). */
  resyncs: number;
  /** Median over the pairs of (with - without) / resyncs. */
  cpuPerResyncMs: number;
}

/** CPU per resync from pairs of windows (pure): each pair's difference over the resyncs, median; a negative one (noise) stays visible. */
export function cpuPerResync(pairs: readonly ResyncPair[], resyncs: number): number {
  return resyncs > 0 ? round(median(pairs.map((p) => (p.withMs - p.withoutMs) / resyncs)), 1) : NaN;
}

export interface DriftOptions {
  rounds: number;
  /** Pool services of the resync-cost run. */
  services: number;
  /** Seconds of each CPU window, and pairs of windows (with resyncs, without). */
  cpuWindowSeconds: number;
  cpuPairs: number;
  /** Timer damages a round (the first of TIMER_KINDS). */
  timerKinds: number;
  log: (msg: string) => void;
}

export interface DriftResult {
  config: { rounds: number; intervalMs: number; timeoutMs: number; timerPeriodMs: number; timerKinds: DamageKind[]; services: number; cpuWindowSeconds: number; cpuPairs: number };
  summary: DriftSummaryRow[];
  timer: ReturnType<typeof timerVersusAgent>;
  resync?: ResyncCost;
  raw: DamageRun[];
  errors: string[];
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const msg = (e: unknown): string => String((e as Error).message ?? e).replace(/\s+/g, ' ').slice(0, 300);

function driftConfig(): Record<string, unknown> {
  return continuityConfig([{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }]);
}

interface Vips { web: string; api: string; link: string }

async function readyVips(agent: AgentHandle): Promise<Vips> {
  const st = await waitStatus(agent, 'both services ready', (s) => s.services.length === 2 && s.services.every((x) => x.ready && x.vip !== undefined), 30_000);
  const web = st.services.find((s) => s.name === 'web')!;
  const api = st.services.find((s) => s.name === 'api')!;
  return { web: web.vip!, api: api.vip!, link: web.interface! };
}

async function firstChain(cl: ContinuityLab): Promise<string> {
  const c = chainNames((await cl.lab.sh(cl.node, 'nft list table ip lb_agent')).stdout)[0];
  if (!c) throw new Error('table ip lb_agent has no chain');
  return c;
}

async function damageCommand(cl: ContinuityLab, kind: DamageKind, v: Vips): Promise<string> {
  switch (kind) {
    case 'flush-ruleset': return 'nft flush ruleset';
    case 'delete-table': return 'nft delete table ip lb_agent';
    // A base chain: no rule jumps to it, so it can be deleted once empty.
    case 'delete-chain': { const c = await firstChain(cl); return `nft flush chain ip lb_agent ${c} && nft delete chain ip lb_agent ${c}`; }
    case 'pool-address': return `ip addr del ${v.api}/32 dev eth0`;
    case 'dhcp-address': return `ip addr del ${v.web}/32 dev ${v.link}`;
    case 'dhcp-link-down': return `ip link set ${v.link} down`;
    case 'dhcp-link-del': return `ip link del ${v.link}`;
    case 'ip-forward': return 'sysctl -qw net.ipv4.ip_forward=0';
    case 'arp-ignore': return 'sysctl -qw net.ipv4.conf.eth0.arp_ignore=0';
  }
}

/** Served again: each loop answered a request started 200 ms or more after its last failure since `at`. */
function servedAgain(loops: readonly ClientLoop[], at: number): boolean {
  return loops.every((l) => {
    const since = l.results.filter((r) => r.t >= at);
    const lastFail = since.filter((r) => !r.ok).reduce((m, r) => Math.max(m, r.t), at);
    return since.some((r) => r.ok && r.t >= lastFail + 200);
  });
}

async function startLoops(cl: ContinuityLab, vips: readonly string[]): Promise<ClientLoop[]> {
  return Promise.all(vips.map((vip) => ClientLoop.start(cl.lab, cl.client, `http://${vip}/`, { ...LOOP, maxMs: 300_000, maxCount: 20_000 })));
}

async function agentRound(cl: ContinuityLab, round: number): Promise<DamageRun[]> {
  const agent = await runAgent(cl.lab, cl.node, driftConfig(), { name: `drift-r${round}` });
  let loops: ClientLoop[] = [];
  const marks: { kind: DamageKind; at: number; to: number; repairLoggedMs: number; error?: string }[] = [];
  try {
    let v = await readyVips(agent);
    loops = await startLoops(cl, [v.web, v.api]);
    await sleep(300);
    for (const kind of DAMAGE_KINDS) {
      let error: string | undefined;
      const cmd = await damageCommand(cl, kind, v);
      const logsBefore = agent.logs.length;
      const at = Date.now();
      const reached = reaches(kind).map((w) => loops[w === 'dhcp' ? 0 : 1]!);
      try {
        await cl.lab.sh(cl.node, cmd);
        await waitFor(`${kind} repaired and served`, () => Date.now() - at >= 500 && agent.logs.slice(logsBefore).some((l) => l.op === 'repair' && l.done !== undefined) && servedAgain(reached, at), 15_000, 20);
      } catch (e) { error = msg(e); }
      await sleep(200);
      const line = agent.logs.slice(logsBefore).find((l) => l.op === 'repair' && l.done !== undefined);
      marks.push({ kind, at, to: Date.now(), repairLoggedMs: logTime(line) - at, ...(error ? { error } : {}) });
      // The next damage names what is there now (the macvlan after its recreation).
      if (kind.startsWith('dhcp-')) v = await readyVips(agent).catch(() => v);
    }
    const results = await Promise.all(loops.map((l) => l.stop()));
    return marks.map((mk) => ({
      who: 'agent' as const, kind: mk.kind, round,
      ...measureDamage(reaches(mk.kind).map((w) => results[w === 'dhcp' ? 0 : 1]!), mk.at, mk.to),
      repairLoggedMs: mk.repairLoggedMs,
      ...(mk.error ? { error: mk.error } : {}),
    }));
  } finally {
    for (const l of loops) await l.stop().catch(() => undefined);
    await stopAgent(agent);
  }
}

/** The Calico-style reference: a repairer that looks every period and restores what it saved. */
class TimerRepairer {
  lastTick = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private busy = false;
  /** What failed in a tick (a repair the next tick tries again). */
  readonly errors: string[] = [];
  constructor(private readonly cl: ContinuityLab, private readonly savedFile: string, private readonly chains: readonly string[], private readonly vip: string, private readonly periodMs: number) {}

  start(): void {
    this.lastTick = Date.now();
    this.timer = setInterval(() => { this.lastTick = Date.now(); void this.tick(); }, this.periodMs);
  }

  stop(): void { clearInterval(this.timer); }

  private async tick(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const now = (await this.cl.lab.sh(this.cl.node, 'nft list table ip lb_agent 2>/dev/null', { allowFail: true })).stdout;
      const have = chainNames(now);
      if (this.chains.some((c) => !have.includes(c))) await this.cl.lab.sh(this.cl.node, `nft -f ${this.savedFile}`);
      const addrs = (await this.cl.lab.sh(this.cl.node, 'ip -o -4 addr show dev eth0')).stdout;
      if (!addrs.includes(` ${this.vip}/32 `)) await this.cl.lab.sh(this.cl.node, `ip addr add ${this.vip}/32 dev eth0`);
    } catch (e) {
      this.errors.push(msg(e));
    } finally {
      this.busy = false;
    }
  }
}

async function timerRound(cl: ContinuityLab, round: number, first: number, total: number, o: DriftOptions): Promise<DamageRun[]> {
  const kinds = TIMER_KINDS.slice(0, o.timerKinds);
  const agent = await runAgent(cl.lab, cl.node, driftConfig(), { name: `timer-r${round}`, args: ['--on-stop', 'keep'] });
  let loop: ClientLoop | undefined;
  let repairer: TimerRepairer | undefined;
  let vipOf: string | undefined;
  const runs: DamageRun[] = [];
  try {
    const v = await readyVips(agent);
    vipOf = v.api;
    const saved = (await cl.lab.sh(cl.node, 'nft list table ip lb_agent')).stdout;
    const savedFile = cl.lab.file(`timer-r${round}.nft`);
    fs.writeFileSync(savedFile, restoreScript('ip', 'lb_agent', saved));
    // Stopped with its data path kept: from here nothing but the repairer puts anything back.
    agent.signal('SIGTERM');
    if (await within(agent.exited, 15_000) === TIMED_OUT) throw new Error('the agent did not exit within 15 s of SIGTERM');
    const l = (await startLoops(cl, [v.api]))[0]!;
    loop = l;
    repairer = new TimerRepairer(cl, savedFile, chainNames(saved), v.api, TIMER_PERIOD_MS);
    repairer.start();
    const marks: { kind: DamageKind; at: number; to: number; phaseMs: number; error?: string }[] = [];
    for (const [i, kind] of kinds.entries()) {
      const phase = damagePhase(first + i, total);
      // Wait for the phase within the current period (or the next one).
      const wait = (repairer.lastTick + phase - Date.now() + TIMER_PERIOD_MS) % TIMER_PERIOD_MS;
      await sleep(wait);
      let error: string | undefined;
      const cmd = await damageCommand(cl, kind, { ...v, link: '' });
      const at = Date.now();
      const phaseMs = (at - repairer.lastTick) % TIMER_PERIOD_MS;
      try {
        await cl.lab.sh(cl.node, cmd);
        await waitFor(`${kind} repaired by the timer and served`, () => Date.now() - at >= 500 && servedAgain([l], at), TIMER_PERIOD_MS + 5000, 20);
      } catch (e) { error = msg(e); }
      await sleep(200);
      marks.push({ kind, at, to: Date.now(), phaseMs, ...(error ? { error } : {}) });
    }
    const results = await l.stop();
    for (const mk of marks) runs.push({ who: 'timer', kind: mk.kind, round, ...measureDamage([results], mk.at, mk.to), phaseMs: mk.phaseMs, ...(mk.error ? { error: mk.error } : {}) });
    return runs;
  } finally {
    repairer?.stop();
    await loop?.stop().catch(() => undefined);
    await stopAgent(agent);
    // Its data path was kept: withdraw it, so the next round starts clean.
    const w = await agentCli(cl.lab, cl.node, ['withdraw', '--config', agent.configPath]);
    if (w.code !== 0) o.log(`lb-agent withdraw failed (${w.code}): ${w.stderr.trim()}`);
    // What the repairer put back is not marked as the agent's, so withdraw leaves it.
    await cl.lab.sh(cl.node, `nft delete table ip lb_agent 2>/dev/null; ip addr del ${vipOf ?? '0.0.0.0'}/32 dev eth0 2>/dev/null; true`, { allowFail: true });
    if (repairer?.errors.length) o.log(`timer repairer: ${repairer.errors.slice(0, 3).join('; ')}`);
  }
}

/**
 * Pool services on a /20 of their own: no traffic, health checks, metrics
 * endpoint or ARP refresh (1,000 gratuitous ARPs every 10 s by default,
 * which would land in one window and not the other); the agent only holds
 * its VIPs and resyncs.
 */
function resyncConfig(n: number, resyncInterval: number): Record<string, unknown> {
  return {
    node: { name: 'bench', interface: 'eth0' },
    dataplane: 'kernel',
    metrics: { listen: '' },
    pools: { 'range-global': '10.96.1.0-10.96.8.255' },
    arp: { ...FAST_ARP, refreshInterval: 3600 },
    reconcile: { resyncInterval },
    services: Array.from({ length: n }, (_, i) => ({
      name: `s${i}`, ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }],
      backends: ['10.96.0.11', '10.96.0.12', '10.96.0.13'],
      healthCheck: { enabled: false },
    })),
  };
}

async function resyncCost(o: DriftOptions): Promise<ResyncCost> {
  const lab = await Lab.create();
  const n = o.services;
  const w = o.cpuWindowSeconds;
  // A reload does not re-arm the pending resync timer (daemon/drift.ts reads the
  // interval when it arms): the windows without a resync use an interval just
  // longer than the settle and the window, so no resync lands in them and the
  // switch back to 1 s takes effect one interval later.
  const settleMs = 3000;
  const quiet = Math.ceil(settleMs / 1000 + w + 2);
  try {
    const node = await lab.addHost('node', { address: '10.96.0.2/20' });
    const t0 = Date.now();
    const agent = await runAgent(lab, node, resyncConfig(n, 1), { name: 'resync' });
    try {
      await waitStatus(agent, `${n} services ready`, (s) => s.services.length === n && s.services.every((x) => x.ready), 240_000);
      const startMs = Date.now() - t0;
      o.log(`${n} services ready in ${startMs} ms`);
      const pid = agent.proc.pid;
      const reload = async (interval: number): Promise<number> => {
        const before = (await agent.status()).config.generation;
        agent.writeConfig(resyncConfig(n, interval));
        agent.signal('SIGHUP');
        await waitFor(`the reload to resyncInterval ${interval}`, async () => (await agent.status()).config.generation > before, 20_000, 50);
        return Date.now();
      };
      const window = async (): Promise<number> => {
        const c0 = cpuWithChildrenMs(pid);
        await sleep(w * 1000);
        return cpuWithChildrenMs(pid) - c0;
      };
      // The start's garbage collected, the first resyncs behind it.
      await sleep(2000);
      const pairs: ResyncPair[] = [];
      let quietSince: number | undefined;
      for (let i = 0; i < o.cpuPairs; i++) {
        if (quietSince !== undefined) {
          const back = await reload(1);
          // Every window follows a reload by at least the same wait, and this one also the quiet timer's last firing (then 1 s again).
          await sleep(Math.max(back + settleMs, quietSince + (quiet + 1) * 1000 + 500) - Date.now());
        } else {
          await sleep(settleMs);
        }
        const withMs = await window();
        quietSince = await reload(quiet);
        await sleep(settleMs);
        const withoutMs = await window();
        pairs.push({ withMs, withoutMs });
        o.log(`resync cost, pair ${i + 1}/${o.cpuPairs}: ${withMs} ms CPU in ${w} s resyncing every second, ${withoutMs} ms without`);
      }
      return {
        services: n, startMs, windowSeconds: w, quietInterval: quiet, pairs,
        cpuWithMs: round(median(pairs.map((p) => p.withMs)), 0), cpuWithoutMs: round(median(pairs.map((p) => p.withoutMs)), 0),
        resyncs: w, cpuPerResyncMs: cpuPerResync(pairs, w),
      };
    } finally {
      await stopAgent(agent);
    }
  } finally {
    await lab.destroy();
  }
}

export async function benchDrift(o: DriftOptions): Promise<DriftResult> {
  const teardowns: (() => unknown)[] = [];
  const raw: DamageRun[] = [];
  const errors: string[] = [];
  const show = (r: DamageRun): string => `${r.who.padEnd(5)} ${r.kind.padEnd(14)}: down ${Number.isFinite(r.downMs) ? r.downMs : 'n/a'} ms, ${r.failures}/${r.requests} failed${r.repairLoggedMs !== undefined ? `, repair logged at ${r.repairLoggedMs} ms` : ''}${r.phaseMs !== undefined ? `, phase ${r.phaseMs} ms` : ''}${r.error ? ` (error: ${r.error})` : ''}`;
  try {
    const cl = await buildContinuityLab({ teardown: (fn) => teardowns.push(fn) });
    for (let r = 0; r < o.rounds; r++) {
      for (const who of ['agent', 'timer'] as const) {
        try {
          const runs = who === 'agent' ? await agentRound(cl, r) : await timerRound(cl, r, r * o.timerKinds, o.rounds * o.timerKinds, o);
          raw.push(...runs);
          for (const x of runs) {
            o.log(`round ${r + 1}/${o.rounds} ${show(x)}`);
            if (x.error) errors.push(`round ${r + 1} ${who} ${x.kind}: ${x.error}`);
          }
        } catch (e) {
          const m = `round ${r + 1} ${who}: ${msg(e)}`;
          errors.push(m);
          o.log(m);
        }
      }
    }
  } finally {
    for (const fn of teardowns.reverse()) await fn();
  }
  let resync: ResyncCost | undefined;
  try {
    resync = await resyncCost(o);
    o.log(`resync of ${resync.services} services: ${resync.cpuWithMs} ms CPU in ${resync.windowSeconds} s resyncing every second, ${resync.cpuWithoutMs} ms without: ${resync.cpuPerResyncMs} ms a resync`);
  } catch (e) {
    errors.push(`resync cost: ${msg(e)}`);
    o.log(`resync cost: ${msg(e)}`);
  }
  return {
    config: { rounds: o.rounds, ...LOOP, timerPeriodMs: TIMER_PERIOD_MS, timerKinds: TIMER_KINDS.slice(0, o.timerKinds), services: o.services, cpuWindowSeconds: o.cpuWindowSeconds, cpuPairs: o.cpuPairs },
    summary: summarizeDrift(raw),
    timer: timerVersusAgent(raw),
    ...(resync ? { resync } : {}),
    raw,
    errors,
  };
}
