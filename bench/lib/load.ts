// Load generators run inside the client namespace: wrk for HTTP requests
// (keep-alive, or `Connection: close` so that every request is a new TCP
// connection through the balancer) and iperf3 for bulk TCP throughput.
// Each run is bounded by its duration plus a fixed margin.
import { parseWrk, type WrkResult } from '../forward';
import type { Lab } from '../../lab/netns';

export type { WrkResult };

/** `script`: a wrk Lua file (-s), e.g. wrkSpreadScript's. */
export interface WrkOptions { seconds: number; connections: number; threads: number; close: boolean; script?: string }

export async function runWrk(lab: Lab, ns: string, url: string, o: WrkOptions): Promise<WrkResult> {
  const args = [`-t${o.threads}`, `-c${o.connections}`, `-d${o.seconds}s`, '--latency', '--timeout', '5s', ...(o.script ? ['-s', o.script] : [])];
  if (o.close) args.push('-H', 'Connection: close');
  const r = await lab.exec(ns, 'wrk', [...args, url], { timeoutMs: (o.seconds + 30) * 1000, allowFail: true });
  if (r.code !== 0) return { rps: NaN, p50ms: NaN, p99ms: NaN, requests: 0, socketErrors: 0, non2xx: 0 };
  return parseWrk(r.stdout);
}

/**
 * A wrk script that sends each thread's connections to its own address,
 * the addresses in turn (thread 1 to the first, ...): a client that spreads
 * its load over several servers itself, without a balancer. wrk connects
 * every connection of a thread to `thread.addr`, which setup() may set
 * (wrk.lookup); the request (its Host header included) stays the URL's.
 * Only setup() is defined, so wrk keeps its static request and never enters
 * Lua per request or response: the same hot loop as without a script.
 */
export function wrkSpreadScript(addresses: readonly string[], port: number): string {
  if (addresses.length === 0) throw new Error('wrkSpreadScript: no address');
  return [
    `local addrs = { ${addresses.map((a) => JSON.stringify(a)).join(', ')} }`,
    'local n = 0',
    'function setup(thread)',
    '  local a = addrs[(n % #addrs) + 1]',
    '  n = n + 1',
    `  thread.addr = wrk.lookup(a, "${port}")[1]`,
    'end',
    '',
  ].join('\n');
}

export interface IperfResult { bitsPerSecond: number; retransmits: number; error?: string }

/**
 * One TCP stream for `seconds` (the first second omitted as slow start),
 * received rate. `reverse` (iperf3 -R): the server sends, as a backend's
 * replies do - the direction direct server return keeps off the balancer.
 */
export async function runIperf(lab: Lab, ns: string, host: string, port: number, seconds: number, opts: { reverse?: boolean } = {}): Promise<IperfResult> {
  const args = ['-c', host, '-p', String(port), '-t', String(seconds), '-O', '1', '-J', '--connect-timeout', '3000', ...(opts.reverse ? ['-R'] : [])];
  const r = await lab.exec(ns, 'iperf3', args, { timeoutMs: (seconds + 20) * 1000, allowFail: true });
  try {
    const j = JSON.parse(r.stdout) as { error?: string; end?: { sum_received?: { bits_per_second?: number }; sum_sent?: { retransmits?: number } } };
    if (j.error) return { bitsPerSecond: NaN, retransmits: NaN, error: j.error };
    return { bitsPerSecond: j.end?.sum_received?.bits_per_second ?? NaN, retransmits: j.end?.sum_sent?.retransmits ?? NaN };
  } catch {
    return { bitsPerSecond: NaN, retransmits: NaN, error: (r.stderr || r.stdout || 'no output').slice(0, 300) };
  }
}
