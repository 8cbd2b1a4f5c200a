// The failover6 area: VRRP failover of an IPv6 VIP against keepalived, the
// IPv6 twin of bench/failover.ts. One throwaway lab (lab/vrrp6.ts: IPv6
// hosts on one bridge, an IPv6 backend, a client) and, for each advert
// interval and run:
//   agent       two real agents (n3 priority 200 Master, n2 150 Backup)
//               serving an IPv6 pool VIP (loadBalancerIP) under VRRPv3 over
//               IPv6: the new Master announces with unsolicited neighbour
//               advertisements (override) at once;
//   keepalived  two keepalived (VRRPv3, IPv6 instance, priorities 200 and
//               150) holding the same VIP, an HTTP server on :80 in each.
// The Master's "VM" dies (bridge port down + SIGKILL in one shell, as lab/vrrp.ts
// vmDeath) right after its IPv6 advert passes its bridge port (tcpdump), so
// every peer dies at the same point of its advert cycle; the death's time is
// read in that shell just before the port goes down, not when the shell has
// returned. A client starts a request to http://[VIP]/ every 10 ms (new
// connection, 300 ms deadline); the number is the time from the death to the
// end of the first answered request after it, median over the runs, and
// agent / keepalived as a ratio. For the agent, the new Master's own log
// lines place its steps on the same clock (VRRP Master, the source told to
// take the VIP, the VIP bound: address added and the first unsolicited
// neighbour advertisement sent). Only lab namespaces are addressed.
//
//   npm run bench -- --only failover6            (an area of bench/run.ts)
//   node dist/bench/failover6.js [--intervals 1,0.1] [--runs 3]   (JSON on stdout)
import * as fs from 'node:fs';
import { createLab, waitFor } from '../lab/netns';
import { startBackend } from '../lab/services';
import { startKeepalived } from '../lab/keepalived';
import { startAgent, waitStatus } from '../lab/agent';
import { addVm6, afterAdvert6, agentConfig6, neighbourMac, BACKEND6, VIP6, type Vm6 } from '../lab/vrrp6';
import { gapReport, ClientLoop } from '../lab/client-loop';
import { masterDownIntervalMs } from '../agent/failover/machine';
import { loadAverage } from './lib/procfs';
import { median, ratio, round } from './lib/stats';

const VRID = 51;
const BACKUP_PRIORITY = 150;

/** Where the new Master's takeover stood, ms after the death, from its own log lines. */
export interface TakeoverTimeline {
  /** VRRP state master (driver.ts 'transition'). */
  masterMs: number;
  /** The daemon starts the service's source ('failover': taking the VIP). */
  takingMs: number;
  /** The VIP bound: address added and the first unsolicited advertisement sent (pool-machine 'bound'). */
  boundMs: number;
}

export interface Failover6Run { servedMs: number; neighbourMs: number; failedRequests: number; timeline?: TakeoverTimeline }

export interface Failover6Side { runs: Failover6Run[]; medianServedMs: number; medianNeighbourMs: number }

export interface Failover6Point {
  advertInterval: number;
  /** The Backup's (priority 150) Master_Down_Interval, RFC 5798 §6.1. */
  masterDownIntervalMs: number;
  agent: Failover6Side & { medianTimeline: TakeoverTimeline };
  keepalived: Failover6Side;
  /** agent / keepalived, medians of "served"; below 1 the agent serves again sooner. */
  ratioServed: number;
}

export interface Failover6Options { intervals: readonly number[]; runs: number; log: (msg: string) => void }

export interface Failover6Result {
  config: { intervals: number[]; runs: number; backupPriority: number; command: string };
  points: Failover6Point[];
  load: { before: number[]; after: number[] };
  errors: string[];
}

/** The log line's time (pino's ISO "time"), ms since the epoch; NaN without one. */
function logTime(l: Record<string, unknown>): number {
  return typeof l.time === 'string' ? Date.parse(l.time) : NaN;
}

/**
 * The new Master's steps from its JSON log lines, ms after `at` (the death).
 * The first of each at or after `at`; NaN for a step it never logged.
 */
export function takeoverTimeline(logs: readonly Record<string, unknown>[], at: number): TakeoverTimeline {
  const first = (pred: (l: Record<string, unknown>) => boolean): number => {
    for (const l of logs) {
      const t = logTime(l);
      if (t >= at && pred(l)) return t - at;
    }
    return NaN;
  };
  return {
    masterMs: first((l) => l.op === 'transition' && l.to === 'master'),
    takingMs: first((l) => l.op === 'failover' && typeof l.msg === 'string' && l.msg.includes('taking the VIP')),
    boundMs: first((l) => l.op === 'bound'),
  };
}

/** Medians and the ratio per advert interval (pure). */
export function summariseFailover6(intervals: readonly number[], runs: ReadonlyMap<string, readonly Failover6Run[]>): Failover6Point[] {
  return intervals.map((interval) => {
    const side = (target: string): Failover6Side => {
      const rs = [...(runs.get(`${target} ${interval}`) ?? [])];
      return { runs: rs, medianServedMs: median(rs.map((x) => x.servedMs)), medianNeighbourMs: median(rs.map((x) => x.neighbourMs)) };
    };
    const agent = side('agent');
    const keepalived = side('keepalived');
    const tl = agent.runs.map((r) => r.timeline).filter((x): x is TakeoverTimeline => x !== undefined);
    return {
      advertInterval: interval,
      masterDownIntervalMs: round(masterDownIntervalMs(BACKUP_PRIORITY, interval * 100), 1),
      agent: {
        ...agent,
        medianTimeline: { masterMs: median(tl.map((x) => x.masterMs)), takingMs: median(tl.map((x) => x.takingMs)), boundMs: median(tl.map((x) => x.boundMs)) },
      },
      keepalived,
      ratioServed: round(ratio(agent.medianServedMs, keepalived.medianServedMs), 2),
    };
  });
}

/** The last line of a shell's stdout that is a number: `date +%s%3N` printed there. */
export function lastNumber(stdout: string): number {
  const n = stdout.trim().split('\n').map((l) => l.trim()).filter((l) => /^\d+$/.test(l)).pop();
  return n === undefined ? NaN : Number(n);
}

export async function benchFailover6(o: Failover6Options): Promise<Failover6Result> {
  const loadBefore = loadAverage();
  const cleanups: (() => unknown)[] = [];
  const lab = await createLab({ teardown: (fn) => { cleanups.push(fn); } });
  const runs = new Map<string, Failover6Run[]>();
  const errors: string[] = [];
  try {
    const n2 = await addVm6(lab, 'n2', 3);
    const n3 = await addVm6(lab, 'n3', 4);
    const ka1 = await addVm6(lab, 'ka1', 0x41);
    const ka2 = await addVm6(lab, 'ka2', 0x42);
    const b6 = await lab.addHost('b6', { address: '10.99.0.12/24', ipv6: [`${BACKEND6}/64`] });
    const client = await lab.addHost('client', { address: '10.99.0.80/24', ipv6: ['fd00:99::50/64'] });
    await startBackend(lab, b6, 'b6', [8080], '::');
    for (const k of [ka1, ka2]) await startBackend(lab, k.ns, k.name, [80], '::');

    /** Client loop around a death; the first answer after it and when the client's neighbour entry reached `to`. */
    const measure = async (dying: Vm6, pids: number[], to: Vm6, intervalS: number): Promise<Failover6Run & { at: number }> => {
      const loop = await ClientLoop.start(lab, client, `http://[${VIP6}]/`, { intervalMs: 10, timeoutMs: 300, maxInFlight: 50, maxMs: 60_000 });
      await new Promise((r) => setTimeout(r, 300));
      // In one shell, as lab/vrrp.ts vmDeath does: the advert, the time, then port down and SIGKILL.
      const res = await lab.sh(lab.lan, `${afterAdvert6(dying.port, dying.linkLocal, Math.ceil(intervalS * 2 + 1))}date +%s%3N; ip link set ${dying.port} down && kill -KILL ${pids.join(' ')}`);
      const at = Number.isFinite(lastNumber(res.stdout)) ? lastNumber(res.stdout) : Date.now();
      let neighbourAt = NaN;
      await waitFor('the neighbour entry moved', async () => {
        if ((await neighbourMac(lab, client, VIP6)) !== to.mac) return false;
        neighbourAt = Date.now();
        return true;
      }, 10_000 + 5 * masterDownIntervalMs(BACKUP_PRIORITY, intervalS * 100), 10).catch(() => undefined);
      await loop.waitServed('an answer after the Master died', at, 10_000 + 5 * masterDownIntervalMs(BACKUP_PRIORITY, intervalS * 100));
      await new Promise((r) => setTimeout(r, 300));
      const g = gapReport(await loop.stop(), at, ['b6', 'ka1', 'ka2']);
      return { servedMs: g.servedAfterMs ?? NaN, neighbourMs: neighbourAt - at, failedRequests: g.failures.length, at };
    };

    const agentRun = async (intervalS: number): Promise<Failover6Run> => {
      const cfg = { advertInterval: intervalS, vrid: VRID };
      const a3 = await startAgent(lab, n3.ns, agentConfig6(n3, 200, cfg), { name: 'n3', logLevel: 'info' });
      await waitStatus(a3, 'n3 Master and serving', (d) => d.services.some((s) => s.state === 'serving' && s.vip === VIP6), 30_000);
      const a2 = await startAgent(lab, n2.ns, agentConfig6(n2, BACKUP_PRIORITY, cfg), { name: 'n2', logLevel: 'info' });
      await waitStatus(a2, 'n2 Backup', (d) => d.services.some((s) => s.failover?.state === 'backup' && s.failover.master === n3.linkLocal), 30_000);
      const { at, ...run } = await measure(n3, [a3.proc.pid!], n2, intervalS);
      await a3.exited;
      a2.signal('SIGTERM');
      await a2.exited;
      // What a reboot clears on n3, then back on the LAN.
      await lab.sh(n3.ns, `ip -6 addr del ${VIP6}/128 dev eth0 2>/dev/null; nft flush ruleset`, { allowFail: true });
      await lab.sh(lab.lan, `ip link set ${n3.port} up`);
      return { ...run, timeline: takeoverTimeline(a2.logs, at) };
    };

    const keepalivedRun = async (intervalS: number, id: string): Promise<Failover6Run> => {
      const k1 = await startKeepalived(lab, ka1.ns, `ka1-${id}`, { vrid: VRID, priority: 200, advertInt: intervalS, vips: [VIP6], state: 'MASTER' });
      await waitFor('ka1 MASTER', () => k1.state() === 'MASTER', 10_000 + 5 * masterDownIntervalMs(200, intervalS * 100));
      const k2 = await startKeepalived(lab, ka2.ns, `ka2-${id}`, { vrid: VRID, priority: BACKUP_PRIORITY, advertInt: intervalS, vips: [VIP6] });
      await waitFor('ka2 BACKUP', () => k2.state() === 'BACKUP', 10_000);
      const pids = (await lab.sh(lab.lan, `ip netns pids ${ka1.ns}`)).stdout.split(/\s+/).filter(Boolean)
        .filter((p) => { try { return fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'keepalived'; } catch { return false; } }).map(Number);
      const { at: _at, ...run } = await measure(ka1, pids, ka2, intervalS);
      await k2.stop();
      await k1.stop();
      await lab.sh(ka1.ns, `ip -6 addr del ${VIP6}/64 dev eth0`, { allowFail: true });
      await lab.sh(ka2.ns, `ip -6 addr del ${VIP6}/64 dev eth0`, { allowFail: true });
      await lab.sh(lab.lan, `ip link set ${ka1.port} up`);
      return run;
    };

    for (const interval of o.intervals) {
      for (let r = 0; r < o.runs; r++) {
        // Interleaved, the order rotated per run.
        const order = r % 2 === 0 ? ['agent', 'keepalived'] : ['keepalived', 'agent'];
        for (const target of order) {
          let run: Failover6Run;
          try {
            run = target === 'agent' ? await agentRun(interval) : await keepalivedRun(interval, `${interval}-${r}`);
            const tl = run.timeline ? `; Master at ${run.timeline.masterMs} ms, taking at ${run.timeline.takingMs} ms, bound at ${run.timeline.boundMs} ms` : '';
            o.log(`${target} advertInterval ${interval} s run ${r + 1}/${o.runs}: served after ${run.servedMs} ms, neighbour entry moved after ${run.neighbourMs} ms, ${run.failedRequests} failed requests${tl}`);
          } catch (e) {
            const msg = `${target} advertInterval ${interval} s run ${r + 1}: ${(e as Error).message.split('\n')[0]}`;
            o.log(`  run failed: ${msg}`);
            errors.push(msg);
            run = { servedMs: NaN, neighbourMs: NaN, failedRequests: NaN };
          }
          const key = `${target} ${interval}`;
          runs.set(key, [...(runs.get(key) ?? []), run]);
        }
      }
    }
  } finally {
    for (const fn of cleanups.reverse()) await fn();
  }
  return {
    config: { intervals: [...o.intervals], runs: o.runs, backupPriority: BACKUP_PRIORITY, command: `node dist/bench/failover6.js --intervals ${o.intervals.join(',')} --runs ${o.runs}` },
    points: summariseFailover6(o.intervals, runs),
    load: { before: loadBefore, after: loadAverage() },
    errors,
  };
}

const cell = (x: number): string => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
const x2 = (x: number): string => (Number.isFinite(x) ? `${x.toFixed(2)}x` : 'n/a');

/** The area's table: one line per advert interval, agent beside keepalived. */
export function failover6Table(r: Failover6Result): string {
  const head = '| advert interval | Master_Down_Interval ms (priority 150) | agent: first answer ms | keepalived: first answer ms | agent / keepalived | agent: neighbour entry ms | keepalived: neighbour entry ms | agent: VRRP Master ms | agent: VIP bound ms | runs |\n| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: |';
  const rows = r.points.map((p) => `| ${p.advertInterval} s | ${p.masterDownIntervalMs.toLocaleString('en-US')} | ${cell(p.agent.medianServedMs)} | ${cell(p.keepalived.medianServedMs)} | ${x2(p.ratioServed)} | ${cell(p.agent.medianNeighbourMs)} | ${cell(p.keepalived.medianNeighbourMs)} | ${cell(p.agent.medianTimeline.masterMs)} | ${cell(p.agent.medianTimeline.boundMs)} | ${p.agent.runs.length} + ${p.keepalived.runs.length} |`);
  return [head, ...rows].join('\n');
}

/** Every run's "first answer" ms, for the report's line under the table. */
export function failover6Runs(r: Failover6Result): string {
  return r.points.map((p) => `${p.advertInterval} s: agent ${p.agent.runs.map((x) => cell(x.servedMs)).join(', ')}; keepalived ${p.keepalived.runs.map((x) => cell(x.servedMs)).join(', ')}`).join('. ');
}

function parseArgs(argv: string[]): { intervals: number[]; runs: number } {
  const a = { intervals: [1, 0.1], runs: 3 };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1] ?? '';
    if (argv[i] === '--intervals') { a.intervals = v.split(',').map(Number).filter((x) => x >= 0.01 && x <= 40.95); i++; } else if (argv[i] === '--runs') { a.runs = Math.max(1, Math.min(20, Number(v))); i++; } else throw new Error(`unknown argument ${argv[i]}`);
  }
  return a;
}

if (require.main === module) {
  const args = parseArgs(process.argv.slice(2));
  benchFailover6({ ...args, log: (msg) => process.stderr.write(`[bench/failover6] ${msg}\n`) })
    .then((r) => process.stdout.write(`${JSON.stringify({ bench: 'failover6', ...r }, null, 2)}\n`))
    .catch((e: unknown) => {
      process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
      process.exit(1);
    });
}
