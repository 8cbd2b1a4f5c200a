// A client in a lab namespace that waits for a VIP to serve: it connects to
// host:port every few milliseconds, sends one HTTP/1.0 request, and prints the
// wall-clock ms of the first 200 answer. Started (and ready) before the agent,
// so its own start-up is not counted. Bounded by its deadline.
import type { ChildProcess } from 'node:child_process';
import { Lab, waitFor } from '../../lab/netns';

const SCRIPT = `
const net = require('net');
const [host, port, deadlineMs] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3])];
let attempts = 0;
const give = setTimeout(() => { process.stdout.write(JSON.stringify({ at: null, attempts }) + '\\n'); process.exit(1); }, deadlineMs);
function attempt() {
  attempts++;
  const s = net.connect({ host, port, timeout: 250 });
  let got = '';
  let done = false;
  const next = () => { if (!done) { done = true; setTimeout(attempt, 10); } };
  s.on('connect', () => s.write('GET / HTTP/1.0\\r\\n\\r\\n'));
  s.on('data', (d) => {
    got += d;
    if (/^HTTP\\/1\\.[01] 200/.test(got)) { clearTimeout(give); process.stdout.write(JSON.stringify({ at: Date.now(), attempts }) + '\\n'); process.exit(0); }
  });
  s.on('timeout', () => s.destroy());
  s.on('error', () => {});
  s.on('close', next);
}
process.stdout.write('ready\\n');
attempt();
`;

export interface Poller { served: Promise<number> }

/** Start polling http://host:port/ from ns; `served` resolves with the epoch ms of the first 200 (NaN at the deadline). */
export async function startPoller(lab: Lab, ns: string, host: string, port: number, deadlineMs: number): Promise<Poller> {
  const proc: ChildProcess = lab.spawn(ns, process.execPath, ['-e', SCRIPT, host, String(port), String(deadlineMs)]);
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => { out += d.toString(); });
  await waitFor('poller to start', () => out.includes('ready'), 10_000, 20);
  const served = new Promise<number>((resolve) => {
    proc.once('exit', () => {
      const line = out.split('\n').find((l) => l.startsWith('{'));
      try { resolve((JSON.parse(line ?? '') as { at: number | null }).at ?? NaN); } catch { resolve(NaN); }
    });
  });
  return { served };
}
