// Bench area "restart" (issue 14): what a client sees across a restart or a
// reload, for lb-agent on each data path and for HAProxy on the same
// testbed. One client in another namespace starts an HTTP GET through the
// VIP every 20 ms, each on a new connection with a 500 ms deadline (the
// continuity tests' loop, lab/continuity.ts); each event gets a window of
// that loop (a little before it, until the process is serving again plus a
// tail), and the window's failed requests, longest
// request and first answer after the event are the measurements.
//   lb-agent (kernel, then proxy path; `run --on-stop keep`, as the unit runs it)
//     sigkill          SIGKILL, then a new `lb-agent run`
//     planned          SIGTERM (the data path is kept), then a new `lb-agent run`
//     replace          a new `lb-agent run --replace` beside the running one: the
//                      listeners are handed over on the control socket (HAProxy's -x)
//     reload-global    SIGHUP with other arp timings and pools
//     reload-services  SIGHUP with one service added and another removed
//   HAProxy (master-worker: -W -S, stats socket with expose-fd listeners)
//     seamless-reload  SIGUSR2 to the master: the new worker takes the listeners over
//     stop-start       SIGTERM, then a new haproxy
// The VIP is one pool-like /32 on the node's eth0, the same address for
// both: lb-agent claims it (loadBalancerIP), HAProxy binds it after this
// bench adds it. The pure half (windows, medians) is exported for tests.
import { waitFor } from '../lab/netns';
import { agentCli, waitStatus } from '../lab/agent';
import { buildContinuityLab, continuityConfig, BACKENDS, BACKEND_IDS, TEST_ARP, POOL, type ContinuityLab } from '../lab/continuity';
import { ClientLoop, gapReport, type ClientResult } from '../lab/client-loop';
import { runAgent, stopAgent, type AgentHandle } from './lib/agent';
import { within, TIMED_OUT } from '../lab/within';
import { startHaproxy, type HaproxyOptions, type Peer } from './lib/peers';
import { median, round, rotate } from './lib/stats';

export const VIP = '10.99.0.200';
export const LOOP = { intervalMs: 20, timeoutMs: 500 } as const;

export type RestartWho = 'kernel' | 'proxy' | 'haproxy';
export type RestartEvent = 'sigkill' | 'planned' | 'replace' | 'reload-global' | 'reload-services' | 'seamless-reload' | 'stop-start';

export const AGENT_EVENTS: readonly RestartEvent[] = ['sigkill', 'planned', 'replace', 'reload-global', 'reload-services'];
export const HAPROXY_EVENTS: readonly RestartEvent[] = ['seamless-reload', 'stop-start'];

export const WHO_LABEL: Record<RestartWho, string> = {
  kernel: 'lb-agent, kernel path',
  proxy: 'lb-agent, proxy path',
  haproxy: 'HAProxy, master-worker',
};
export const EVENT_LABEL: Record<RestartEvent, string> = {
  sigkill: 'SIGKILL, new `lb-agent run`',
  planned: 'planned restart: SIGTERM (`--on-stop keep`), new `lb-agent run`',
  replace: 'planned restart with hand-over: new `lb-agent run --replace`',
  'reload-global': 'reload (SIGHUP): arp timings and pools changed',
  'reload-services': 'reload (SIGHUP): one service added, one removed',
  'seamless-reload': 'seamless reload: SIGUSR2 to the master, listeners passed on',
  'stop-start': 'stop (SIGTERM) and start',
};

export interface RestartOptions {
  rounds: number;
  /** Loop time before each event, and after the process serves again (ms). */
  preMs: number;
  postMs: number;
  log: (msg: string) => void;
}

/** One event's window of the client loop: requests started in [from, to), the event at `at` (all Date.now() ms). */
export interface EventWindow { from: number; at: number; to: number }

export interface EventMeasure {
  requests: number;
  failures: number;
  /** The longest request in the window (a failed one lasts up to the deadline). */
  longestMs: number;
  /** From the event to the end of the first answer that started after it and after the last failure. */
  firstAnswerAfterMs: number;
  /** From the start of the first failed request to the end of the first answer after the last (0: none failed). */
  gapMs: number;
  errors: Record<string, number>;
  /** Answers whose body is not one of the backends'. */
  wrongBodies: number;
}

export interface EventRun extends EventMeasure { who: RestartWho; event: RestartEvent; round: number; error?: string }

export interface RestartSummaryRow {
  who: RestartWho;
  event: RestartEvent;
  /** Medians over the rounds that ran without an error. */
  failures: number;
  longestMs: number;
  firstAnswerAfterMs: number;
  gapMs: number;
  /** Failed requests summed over the rounds that ran without an error. */
  totalFailures: number;
  runs: number;
  runsOk: number;
}

export interface RestartResult {
  config: { rounds: number; preMs: number; postMs: number; intervalMs: number; timeoutMs: number; vip: string; haproxy: string };
  summary: RestartSummaryRow[];
  raw: EventRun[];
  errors: string[];
}

/** The measurements of one event from the loop's results (pure). */
export function measureWindow(results: readonly ClientResult[], w: EventWindow, bodies: readonly string[] = BACKEND_IDS): EventMeasure {
  const inside = results.filter((r) => r.t >= w.from && r.t < w.to);
  const g = gapReport(inside, w.at, bodies);
  return {
    requests: g.count,
    failures: g.failures.length,
    longestMs: g.slowest,
    firstAnswerAfterMs: g.servedAfterMs ?? NaN,
    gapMs: g.gapMs,
    errors: g.errors,
    wrongBodies: g.wrongBodies.length,
  };
}

/** Medians per (who, event), in the order the events first appear (pure). */
export function summarizeRestart(runs: readonly EventRun[]): RestartSummaryRow[] {
  const keys: string[] = [];
  for (const r of runs) if (!keys.includes(`${r.who}/${r.event}`)) keys.push(`${r.who}/${r.event}`);
  return keys.map((k) => {
    const all = runs.filter((r) => `${r.who}/${r.event}` === k);
    const ok = all.filter((r) => r.error === undefined);
    const m = (f: (r: EventRun) => number): number => round(median(ok.map(f)), 0);
    return {
      who: all[0]!.who, event: all[0]!.event,
      failures: m((r) => r.failures), longestMs: m((r) => r.longestMs), firstAnswerAfterMs: m((r) => r.firstAnswerAfterMs), gapMs: m((r) => r.gapMs),
      totalFailures: ok.reduce((s, r) => s + r.failures, 0),
      runs: all.length, runsOk: ok.length,
    };
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Two versions of the global sections a reload swaps between; both pools hold the VIP. */
const GLOBALS = [
  { arp: TEST_ARP, pools: { 'range-global': POOL } },
  {
    arp: { probeWait: 0.2, probeNum: 1, probeMin: 0.2, probeMax: 0.3, announceWait: 0.3, announceNum: 3, announceInterval: 0.2 },
    // A wider range: a cidr-* key would be looked up first (kube-vip's order) and would have to hold the VIP too.
    pools: { 'range-global': '10.99.0.200-10.99.0.219' },
  },
];

/** The agent's config: the measured service on the VIP, plus a side service the services reload swaps (a, b). */
function agentConfig(path: 'kernel' | 'proxy', globals: number, side: number): Record<string, unknown> {
  const cfg = continuityConfig([{ name: 'api', ipam: 'pool' }, { name: side % 2 ? 'side-b' : 'side-a', ipam: 'pool', port: 81 }], { dataplane: path, ...GLOBALS[globals % 2] });
  const services = (cfg.services as Record<string, unknown>[]).map((s) => (s.name === 'api' ? { ...s, loadBalancerIP: VIP } : s));
  return { ...cfg, services };
}

interface Step { event: RestartEvent; window: EventWindow; error?: string }

/** Run `fn` as the event of a window: preMs of loop, the event, then postMs after it returns. */
async function step(event: RestartEvent, o: RestartOptions, fn: () => Promise<void>): Promise<Step> {
  const from = Date.now();
  await sleep(o.preMs);
  const at = Date.now();
  let error: string | undefined;
  try { await fn(); } catch (e) { error = String((e as Error).message ?? e).replace(/\s+/g, ' ').slice(0, 300); }
  await sleep(o.postMs);
  return { event, window: { from, at, to: Date.now() }, error };
}

async function startLoop(cl: ContinuityLab): Promise<ClientLoop> {
  return ClientLoop.start(cl.lab, cl.client, `http://${VIP}/`, { ...LOOP, maxMs: 120_000, maxCount: 6000 });
}

function collect(who: RestartWho, round: number, results: readonly ClientResult[], steps: readonly Step[]): EventRun[] {
  return steps.map((s) => ({ who, event: s.event, round, ...measureWindow(results, s.window), ...(s.error ? { error: s.error } : {}) }));
}

async function agentPhase(cl: ContinuityLab, path: 'kernel' | 'proxy', round: number, o: RestartOptions): Promise<EventRun[]> {
  const name = `${path}-r${round}`;
  const stateDir = cl.lab.file(`${name}-state`);
  let globals = 0;
  let side = 0;
  const start = (extra: string[] = []): Promise<AgentHandle> => runAgent(cl.lab, cl.node, agentConfig(path, globals, side), { name, stateDir, args: ['--on-stop', 'keep', ...extra] });
  const ready = (a: AgentHandle, what: string): Promise<unknown> =>
    waitStatus(a, what, (s) => s.services.length === 2 && s.services.every((x) => x.ready) && s.services.find((x) => x.name === 'api')?.vip === VIP, 30_000);
  let agent = await start();
  let loop: ClientLoop | undefined;
  try {
    await ready(agent, `${path} path: both services serving`);
    loop = await startLoop(cl);
    // The verdict must say the reload did what the event is about, or the event did not happen as measured.
    const reload = async (expect: RegExp): Promise<void> => {
      const before = (await agent.status()).config.generation;
      agent.writeConfig(agentConfig(path, globals, side));
      agent.signal('SIGHUP');
      const st = await waitFor('the reload applied', async () => {
        const s = await agent.status();
        return s.config.generation > before || s.config.lastReload?.ok === false ? s : undefined;
      }, 15_000, 20);
      const verdict = st.config.lastReload;
      if (!verdict?.ok) throw new Error(`reload rejected: ${verdict?.message ?? '?'}`);
      if (!expect.test(verdict.message)) throw new Error(`reload applied, but not as expected (${String(expect)}): ${verdict.message}`);
      await ready(agent, 'serving after the reload');
    };
    const restart = async (sig: 'SIGKILL' | 'SIGTERM'): Promise<void> => {
      agent.signal(sig);
      if (await within(agent.exited, 15_000) === TIMED_OUT) throw new Error(`the agent did not exit within 15 s of ${sig}`);
      agent = await start();
      await ready(agent, 'serving after the restart');
    };
    const replace = async (): Promise<void> => {
      const old = agent;
      agent = await start(['--replace']);
      if (await within(old.exited, 15_000) === TIMED_OUT) throw new Error('the replaced agent did not exit within 15 s');
      await ready(agent, 'serving after the hand-over');
    };
    const steps: Step[] = [];
    for (const event of AGENT_EVENTS) {
      steps.push(await step(event, o, async () => {
        switch (event) {
          case 'sigkill': return restart('SIGKILL');
          case 'planned': return restart('SIGTERM');
          case 'replace': return replace();
          case 'reload-global': globals++; return reload(/applied sections: .*arp.*pools|applied sections: .*pools.*arp/);
          case 'reload-services': side++; return reload(/1 added, 1 removed/);
          default: throw new Error(`not an agent event: ${event}`);
        }
      }));
    }
    return collect(path, round, await loop.stop(), steps);
  } finally {
    await loop?.stop();
    // The agent keeps its data path on SIGTERM (--on-stop keep): withdraw it, so the next phase starts clean.
    await stopAgent(agent);
    const w = await agentCli(cl.lab, cl.node, ['withdraw', '--config', agent.configPath]);
    if (w.code !== 0) o.log(`lb-agent withdraw failed (${w.code}): ${w.stderr.trim()}`);
  }
}

function haproxyOptions(cl: ContinuityLab): HaproxyOptions {
  return {
    bind: `${VIP}:80`,
    servers: BACKENDS.map((b, i) => ({ name: BACKEND_IDS[i]!, address: `${b}:8080` })),
    statsSocket: cl.lab.file('haproxy-stats.sock'),
    exposeListeners: true,
    masterSocket: cl.lab.file('haproxy-master.sock'),
  };
}

async function haproxyPhase(cl: ContinuityLab, round: number, o: RestartOptions): Promise<EventRun[]> {
  const opts = haproxyOptions(cl);
  await cl.lab.sh(cl.node, `ip addr add ${VIP}/32 dev eth0`);
  let peer: Peer | undefined;
  let loop: ClientLoop | undefined;
  try {
    peer = await startHaproxy(cl.lab, cl.node, `haproxy-r${round}`, opts);
    loop = await startLoop(cl);
    const steps: Step[] = [];
    for (const event of HAPROXY_EVENTS) {
      steps.push(await step(event, o, async () => {
        if (event === 'seamless-reload') {
          const p = peer!;
          const seen = p.lines.length;
          p.proc.kill('SIGUSR2');
          // The master says so when the old worker, its last connection done, has left.
          await waitFor('the former HAProxy worker to exit', () => p.lines.slice(seen).some((l) => l.text.includes('Former worker')), 10_000, 10);
        } else {
          await peer!.stop();
          peer = undefined;
          peer = await startHaproxy(cl.lab, cl.node, `haproxy-r${round}b`, opts);
        }
      }));
    }
    return collect('haproxy', round, await loop.stop(), steps);
  } finally {
    await loop?.stop();
    await peer?.stop();
    await cl.lab.sh(cl.node, `ip addr del ${VIP}/32 dev eth0`, { allowFail: true });
  }
}

export async function benchRestart(o: RestartOptions): Promise<RestartResult> {
  const teardowns: (() => unknown)[] = [];
  const raw: EventRun[] = [];
  const errors: string[] = [];
  try {
    const cl = await buildContinuityLab({ teardown: (fn) => teardowns.push(fn) });
    for (let r = 0; r < o.rounds; r++) {
      for (const who of rotate(['kernel', 'proxy', 'haproxy'] as const, r)) {
        try {
          const runs = who === 'haproxy' ? await haproxyPhase(cl, r, o) : await agentPhase(cl, who, r, o);
          raw.push(...runs);
          for (const x of runs) {
            o.log(`round ${r + 1}/${o.rounds} ${who.padEnd(7)} ${x.event.padEnd(15)}: ${x.failures}/${x.requests} failed, longest ${x.longestMs} ms, first answer after ${Number.isFinite(x.firstAnswerAfterMs) ? x.firstAnswerAfterMs : 'n/a'} ms${Object.keys(x.errors).length ? ` ${JSON.stringify(x.errors)}` : ''}${x.error ? ` (error: ${x.error})` : ''}`);
            if (x.error) errors.push(`round ${r + 1} ${who} ${x.event}: ${x.error}`);
          }
        } catch (e) {
          const msg = `round ${r + 1} ${who}: ${String((e as Error).message ?? e).split('\n')[0]}`;
          errors.push(msg);
          o.log(msg);
        }
      }
    }
  } finally {
    for (const fn of teardowns.reverse()) await fn();
  }
  return {
    config: { rounds: o.rounds, preMs: o.preMs, postMs: o.postMs, ...LOOP, vip: `${VIP}/32 on the node's eth0`, haproxy: 'haproxy -W -S <master socket> -db; stats socket with expose-fd listeners; reload: SIGUSR2 to the master' },
    summary: summarizeRestart(raw),
    raw,
    errors,
  };
}
