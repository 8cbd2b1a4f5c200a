// The real agent binary under the bench: start `lb-agent run` in a lab
// namespace (through lab/agent.ts), stop it within a bound, read the
// wall-clock time of its log lines, and scrape its /metrics from inside the
// namespace. Nothing here changes how the agent runs; the bench only watches.
import { startAgent, type AgentHandle } from '../../lab/agent';
import { httpGetFrom } from '../../lab/services';
import type { Lab } from '../../lab/netns';
import { within, TIMED_OUT } from '../../lab/within';

export type { AgentHandle };

/** RFC 5227 timings cut short, for runs where the pool claim is set-up rather than what is measured. */
export const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };

/**
 * Start the agent; log level info by default (debug would log per packet and
 * tax what is measured). It runs with the unit's environment - NODE_OPTIONS
 * and GLIBC_TUNABLES (startAgent's default, which replaces this process's) -
 * or, given `nodeOptions`, with those V8 flags and glibc's own malloc
 * settings ('' for the defaults of both); `env`: more variables on top (LB_AGENT_DSR_ENGINE).
 */
export async function runAgent(lab: Lab, ns: string, cfg: Record<string, unknown>, opts: { name?: string; waitReady?: boolean; logLevel?: string; stateDir?: string; args?: string[]; nodeOptions?: string; env?: Record<string, string>; command?: string[] } = {}): Promise<AgentHandle> {
  const { nodeOptions, env, ...rest } = opts;
  const merged = { ...(nodeOptions !== undefined ? { NODE_OPTIONS: nodeOptions, GLIBC_TUNABLES: '' } : {}), ...env };
  return startAgent(lab, ns, cfg, { logLevel: 'info', ...rest, ...(Object.keys(merged).length > 0 ? { env: merged } : {}) });
}

/** SIGTERM, then SIGKILL after `graceMs`: the bench never waits on a stuck agent for long. */
export async function stopAgent(agent: AgentHandle, graceMs = 15_000): Promise<{ code: number | null; signal: NodeJS.Signals | null; killed: boolean }> {
  if (agent.proc.exitCode !== null || agent.proc.signalCode !== null) return { code: agent.proc.exitCode, signal: agent.proc.signalCode, killed: false };
  agent.signal('SIGTERM');
  const res = await within(agent.exited, graceMs);
  if (res !== TIMED_OUT) return { ...res, killed: false };
  agent.signal('SIGKILL');
  const after = await within(agent.exited, 3000);
  return { ...(after === TIMED_OUT ? { code: null, signal: null } : after), killed: true };
}

/** Epoch ms of a pino log line (its ISO `time`); NaN when absent. */
export function logTime(line: Record<string, unknown> | undefined): number {
  const t = line?.time;
  if (typeof t === 'number') return t;
  if (typeof t === 'string') return Date.parse(t);
  return NaN;
}

/** The agent's /metrics text, fetched from inside ns (the endpoint listens on a lab address or the namespace's loopback). */
export async function scrapeMetrics(lab: Lab, ns: string, listen: string): Promise<string> {
  const r = await httpGetFrom(lab, ns, `http://${listen}/metrics`, 5000);
  if (!r.ok) throw new Error(`cannot scrape http://${listen}/metrics in ${ns}: ${r.error ?? 'no answer'}`);
  return r.body;
}

/** Sum and count of a histogram over every label set, from Prometheus text. */
export function histogramTotals(text: string, name: string): { sum: number; count: number } {
  let sum = 0;
  let count = 0;
  for (const line of text.split('\n')) {
    const m = /^(\S+?)(\{[^}]*\})?\s+(\S+)$/.exec(line.trim());
    if (!m) continue;
    if (m[1] === `${name}_sum`) sum += Number(m[3]);
    else if (m[1] === `${name}_count`) count += Number(m[3]);
  }
  return { sum, count };
}
