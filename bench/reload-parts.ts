// Where a one-backend reload's CPU goes, by part, at N pool services (the
// scale area's lab and config, bench/scale.ts): the real `lb-agent run`,
// reloaded by SIGHUP RELOADS times (one backend of one service swapped, then
// back), each reload's window measured the scale area's way (the agent's
// CPU from the signal to EVENT_TAIL_MS after its log line, less the idle
// rate) beside the parts the reload's own log line gives (cpuMs: the
// process's CPU in each part, reload.ts Spans) and the collections V8
// reports in the window (--trace-gc). A tool for finding the cost, not an
// area of `npm run bench`:
//
//   node dist/bench/reload-parts.js [--services 1000] [--engine auto|nft|ebpf] [--reloads 20]
import { Lab } from '../lab/netns';
import { startBackend, type Backend } from '../lab/services';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, logTime, type AgentHandle } from './lib/agent';
import { cpuFineWithChildrenMs } from './lib/procfs';
import { median, percentile, round } from './lib/stats';
import { scaleConfig, backendsOf, cpuBetween, EVENT_TAIL_MS, type ScaleEngine } from './scale';

const NODE = '10.96.0.2';
const BACKENDS = ['10.96.0.11', '10.96.0.12', '10.96.0.13', '10.96.0.14'];
const LONE_PORT = 8081;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : dflt;
}

/** A V8 --trace-gc line: its kind, pause (ms) and heap after (MB), e.g. `[123:0x..]  4567 ms: Scavenge 20.1 (30.2) -> 18.0 (31.2) MB, 1.23 / 0.00 ms ...`. */
function gcOf(raw: string): { kind: string; ms: number; heap: number } | undefined {
  const m = /ms: ([A-Za-z-]+(?: \([a-z ]+\))?) .*?-> ([0-9.]+) \([0-9.]+\) MB, ([0-9.]+) \/ ([0-9.]+) ms/.exec(raw);
  return m ? { kind: m[1]!, ms: Number(m[3]), heap: Number(m[2]) } : undefined;
}

async function main(): Promise<void> {
  const n = Number(arg('services', '1000'));
  const engine = arg('engine', 'auto') as ScaleEngine;
  const reloads = Number(arg('reloads', '20'));
  const lab = await Lab.create();
  const backends: Backend[] = [];
  let agent: AgentHandle | undefined;
  try {
    const node = await lab.addHost('node', { address: `${NODE}/20` });
    for (const [i, a] of BACKENDS.entries()) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${a}/20` });
      backends.push(await startBackend(lab, ns, `b${i + 1}`));
    }
    backends.push(await startBackend(lab, lab.ns('b1'), 'b1-lone', [LONE_PORT]));
    backends.push(await startBackend(lab, lab.ns('b2'), 'b2-lone', [LONE_PORT]));
    // --trace-gc on node's command line (NODE_OPTIONS may not carry it); the unit's environment otherwise.
    // --cpu-prof DIR: a V8 CPU profile of the agent's run, written there at its exit (not with the eBPF engine: the profiler's SIGPROF fails its program load).
    const prof = arg('cpu-prof', '');
    const flags = `--trace-gc${prof ? ` --cpu-prof --cpu-prof-dir=${prof}` : ''}`;
    agent = await runAgent(lab, node, scaleConfig(n, false, engine), { name: `parts-${n}`, command: ['sh', '-c', `exec "$0" ${flags} "$@"`] });
    const a = agent;
    const pid = a.proc.pid;
    await waitStatus(a, `${n} services ready`, (s) => s.services.length === n && s.services.every((x) => x.ready && x.healthyBackends === x.backends.length), 300_000);
    await a.waitLog('the start settled', (l) => l.op === 'settled', 120_000);
    await sleep(20_000);
    const c0 = cpuFineWithChildrenMs(pid);
    const i0 = Date.now();
    await sleep(10_000);
    const idleRate = (cpuFineWithChildrenMs(pid) - c0) / (Date.now() - i0);
    process.stdout.write(`${n} services, engine ${engine}, ${backendsOf(1).length} backends on s1; idle ${round(idleRate * 100, 2)}% of a core\n`);
    const totals: number[] = [];
    const parts: Record<string, number[]> = {};
    for (let r = 0; r < reloads; r++) {
      a.writeConfig(scaleConfig(n, r % 2 === 0, engine));
      const logsBefore = a.logs.length;
      const samples: { t: number; cpuMs: number }[] = [];
      const take = (): void => { samples.push({ t: Date.now(), cpuMs: cpuFineWithChildrenMs(pid) }); };
      take();
      const timer = setInterval(take, 50);
      const t = Date.now();
      a.signal('SIGHUP');
      const line = await a.waitLog('reload logged', (l) => a.logs.indexOf(l) >= logsBefore && l.op === 'reload' && l.added !== undefined, 60_000);
      const applied = logTime(line);
      await sleep(Math.max(0, applied + EVENT_TAIL_MS - Date.now()) + 100);
      clearInterval(timer);
      take();
      const total = round(cpuBetween(samples, t, applied + EVENT_TAIL_MS) - idleRate * (applied + EVENT_TAIL_MS - t), 1);
      totals.push(total);
      // The part before the log line (the reload's own parts) and the tail after it (what the reload leaves to run: the state files, status).
      const before = round(cpuBetween(samples, t, applied) - idleRate * (applied - t), 1);
      const tail = round(cpuBetween(samples, applied, applied + EVENT_TAIL_MS) - idleRate * EVENT_TAIL_MS, 1);
      (parts['(window before the line)'] ??= []).push(before);
      (parts['(tail after the line)'] ??= []).push(tail);
      const cpu = (line.cpuMs ?? {}) as Record<string, number>;
      for (const [k, v] of Object.entries(cpu)) (parts[k] ??= []).push(v);
      const gcs = a.logs.slice(logsBefore).filter((l) => typeof l.raw === 'string').map((l) => gcOf(l.raw as string)).filter((g) => g !== undefined);
      const gcText = gcs.map((g) => `${g.kind} ${g.ms} (${g.heap})`).join(', ');
      process.stdout.write(`reload ${r + 1}: ${total} ms over idle in ${applied + EVENT_TAIL_MS - t} ms (before the line ${before}, tail ${tail}); parts ${JSON.stringify(cpu)}; wall ${JSON.stringify(line.ms)}; gc: ${gcText || 'none'}\n`);
      await sleep(1000);
    }
    const q = (xs: number[]): string => `${round(median(xs), 1)} (${round(percentile(xs, 0.25), 1)}-${round(percentile(xs, 0.75), 1)})`;
    process.stdout.write(`window: ${q(totals)} ms\n`);
    for (const [k, v] of Object.entries(parts)) process.stdout.write(`  ${k}: ${q(v)} ms\n`);
  } finally {
    if (agent) await stopAgent(agent);
    for (const b of backends) await b.stop();
    await lab.destroy();
  }
}

main().catch((e: unknown) => { process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`); process.exitCode = 1; });
