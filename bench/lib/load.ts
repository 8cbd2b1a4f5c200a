// Load generators run inside the client namespace: wrk for HTTP requests
// (keep-alive, or `Connection: close` so that every request is a new TCP
// connection through the balancer) and iperf3 for bulk TCP throughput.
// Each run is bounded by its duration plus a fixed margin.
import { parseWrk, type WrkResult } from '../forward';
import type { Lab } from '../../lab/netns';

export type { WrkResult };

export interface WrkOptions { seconds: number; connections: number; threads: number; close: boolean }

export async function runWrk(lab: Lab, ns: string, url: string, o: WrkOptions): Promise<WrkResult> {
  const args = [`-t${o.threads}`, `-c${o.connections}`, `-d${o.seconds}s`, '--latency', '--timeout', '5s'];
  if (o.close) args.push('-H', 'Connection: close');
  const r = await lab.exec(ns, 'wrk', [...args, url], { timeoutMs: (o.seconds + 30) * 1000, allowFail: true });
  if (r.code !== 0) return { rps: NaN, p50ms: NaN, p99ms: NaN, requests: 0, socketErrors: 0, non2xx: 0 };
  return parseWrk(r.stdout);
}

export interface IperfResult { bitsPerSecond: number; retransmits: number; error?: string }

/** One TCP stream for `seconds` (the first second omitted as slow start), received rate. */
export async function runIperf(lab: Lab, ns: string, host: string, port: number, seconds: number): Promise<IperfResult> {
  const r = await lab.exec(ns, 'iperf3', ['-c', host, '-p', String(port), '-t', String(seconds), '-O', '1', '-J', '--connect-timeout', '3000'], { timeoutMs: (seconds + 20) * 1000, allowFail: true });
  try {
    const j = JSON.parse(r.stdout) as { error?: string; end?: { sum_received?: { bits_per_second?: number }; sum_sent?: { retransmits?: number } } };
    if (j.error) return { bitsPerSecond: NaN, retransmits: NaN, error: j.error };
    return { bitsPerSecond: j.end?.sum_received?.bits_per_second ?? NaN, retransmits: j.end?.sum_sent?.retransmits ?? NaN };
  } catch {
    return { bitsPerSecond: NaN, retransmits: NaN, error: (r.stderr || r.stdout || 'no output').slice(0, 300) };
  }
}
