// lab/client-loop.ts owns what a client sees across an event (a failover, a
// restart, a reload): ClientLoop runs lab/bin/client-loop.js in a lab
// namespace - a request every interval, each on a new connection with its own
// deadline - and gapReport summarises the results around the event (runs of
// failures, how long until served again, wrong answers). The VRRP, continuity
// and restart tests and bench/restart.ts, bench/failover.ts use it.
import type { ChildProcess } from 'node:child_process';
import { waitFor, type Lab } from './netns';
import { distPath } from './services';
import { onJsonLines } from './jsonlines';
import { within } from './within';

export interface ClientResult { t: number; ms: number; ok: boolean; body?: string; error?: string }

export class ClientLoop {
  readonly results: ClientResult[] = [];
  private done = false;
  private stderr = '';

  private constructor(readonly proc: ChildProcess) {
    onJsonLines(proc.stdout!, (m) => {
      if (m.done) this.done = true;
      else if (typeof m.t === 'number') this.results.push(m as unknown as ClientResult);
    });
    proc.stderr!.on('data', (d: Buffer) => { this.stderr = (this.stderr + d.toString()).slice(-5000); });
  }

  /** Start the loop in ns; resolves once the first request has succeeded (or after the timeout, throwing). */
  static async start(lab: Lab, ns: string, url: string, o: { intervalMs?: number; timeoutMs?: number; maxInFlight?: number; maxMs?: number; maxCount?: number } = {}): Promise<ClientLoop> {
    const args = [distPath('lab', 'bin', 'client-loop.js'), '--url', url,
      '--interval-ms', String(o.intervalMs ?? 20), '--timeout-ms', String(o.timeoutMs ?? 300), '--max-in-flight', String(o.maxInFlight ?? 20),
      '--max-ms', String(o.maxMs ?? 60_000), '--max-count', String(o.maxCount ?? 5000)];
    const proc = lab.spawn(ns, process.execPath, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const c = new ClientLoop(proc);
    await waitFor(`client loop on ${url} to get a first answer`, () => {
      if (proc.exitCode !== null && !c.done) throw new Error(`client loop exited ${proc.exitCode}: ${c.stderr}`);
      return c.results.some((r) => r.ok);
    }, 10_000);
    return c;
  }

  /** Stop the loop and wait for it to exit. */
  async stop(): Promise<ClientResult[]> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      const exited = new Promise<void>((r) => this.proc.once('exit', () => r()));
      this.proc.stdin!.write('stop\n');
      await within(exited, 3000);
      if (this.proc.exitCode === null) this.proc.kill('SIGKILL');
    }
    return this.results;
  }

  /** Wait until some request started after `after` succeeded. */
  waitServed(what: string, after: number, timeoutMs = 10_000): Promise<ClientResult> {
    return waitFor(what, () => this.results.find((r) => r.ok && r.t >= after), timeoutMs, 10);
  }
}

export interface GapReport {
  /**
   * Runs of consecutive failed requests (in start order). "A gap and nothing
   * else" is at most one: answers, then failures, then answers again. Near
   * the edges the old holder may still answer for a few ms after the event
   * (its forwarding rules outlive the address), which is not a second gap.
   */
  gaps: number;
  /** From the start of the first failed request to the end of the first answer after the last one (ms). */
  gapMs: number;
  /** From the event to the end of the first answer that started after it and after the last failure (ms). */
  servedAfterMs: number | undefined;
  failures: ClientResult[];
  /** Successful answers whose body is not one of the backends. */
  wrongBodies: ClientResult[];
  /** The longest request (bounded by the client's own deadline: nothing hangs). */
  slowest: number;
  errors: Record<string, number>;
  count: number;
}

/** Summarise a client loop around an event at `at` (ms, Date.now()); `bodies` are the answers backends give. */
export function gapReport(unsorted: readonly ClientResult[], at: number, bodies: readonly string[]): GapReport {
  const results = [...unsorted].sort((a, b) => a.t - b.t);
  const errors: Record<string, number> = {};
  let gaps = 0;
  let firstFail = -1;
  let lastFail = -1;
  results.forEach((r, i) => {
    if (r.ok) return;
    errors[r.error ?? '?'] = (errors[r.error ?? '?'] ?? 0) + 1;
    if (i === 0 || results[i - 1]!.ok) gaps++;
    if (firstFail < 0) firstFail = i;
    lastFail = i;
  });
  const servedIdx = results.findIndex((r, i) => r.ok && r.t >= at && i > lastFail);
  const served = servedIdx >= 0 ? results[servedIdx] : undefined;
  const afterGap = results.find((r, i) => r.ok && i > lastFail);
  return {
    gaps,
    gapMs: firstFail >= 0 && afterGap ? afterGap.t + afterGap.ms - results[firstFail]!.t : 0,
    servedAfterMs: served ? served.t + served.ms - at : undefined,
    failures: results.filter((r) => !r.ok),
    wrongBodies: results.filter((r) => r.ok && !bodies.includes(r.body ?? '')),
    slowest: results.reduce((m, r) => Math.max(m, r.ms), 0),
    errors,
    count: results.length,
  };
}
