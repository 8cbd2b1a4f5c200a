// Bench of ownership that follows health (not a test; nothing is asserted).
// One throwaway lab (lab/tracking.ts: VMs with a management NIC for VRRP
// and a VM-network NIC for the VIP, backends and client), and side by side
// in the same run:
//   agent       two agents (n3 200 Master, n2 150), advertInterval 0.1,
//               eth1 tracked without a weight (fault), the service tracked
//               with weight 60 below two healthy backends, failAfter 1 s;
//   keepalived  two keepalived (VRRPv3, 200 and 150, advert_int 0.1) with
//               `track_interface { eth1 }` and a `track_script` that
//               connects to the backends (interval 1, fall 1, weight -60),
//               an HTTP server on :80 in each namespace.
// Two events on the Master, each followed by its repair and preemption back:
//   carrier   its VM-network NIC loses carrier (bridge port down);
//   service   it loses reach to every backend (unreachable routes).
// A client starts a request every 10 ms (300 ms deadline); we take the time
// from the event to the end of the first answer after the last failure.
// Medians over the runs, and agent/keepalived ratios. Only lab namespaces
// are addressed.
//
//   node dist/bench/tracking.js [--runs 3]
// Prints one JSON object on stdout; progress on stderr.
import * as fs from 'node:fs';
import * as os from 'node:os';
import { waitFor } from '../lab/netns';
import { startBackend } from '../lab/services';
import { startKeepalived, type Keepalived } from '../lab/keepalived';
import { buildTrackingLab, VM_NET_VIP, VM_NET_BACKENDS, type TrackingLab } from '../lab/tracking';
import { gapReport, ClientLoop } from '../lab/client-loop';
import { median } from './lib/stats';

const KA_VIP = '10.98.0.201';
const KA = [{ role: 'ka1', ip: '10.99.0.41', priority: 200 }, { role: 'ka2', ip: '10.99.0.42', priority: 150 }] as const;
type Event = 'carrier' | 'service';

function log(msg: string): void { process.stderr.write(`[bench/tracking] ${msg}\n`); }
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Client loop around one event on a VIP, until the new Master serves
 * (`tookOver`). The agent: ms from the event to the first answer after the
 * last failure (the old Master fails every request once it lost its NIC or
 * its backends). keepalived answers from a local server, which a lost
 * backend does not stop: ms to the first answer from the new Master (body).
 */
async function measure(tl: TrackingLab, vip: string, event: () => Promise<number>, tookOver: () => Promise<unknown>, newMasterBody?: string): Promise<{ servedMs: number; failed: number }> {
  const loop = await ClientLoop.start(tl.lab, tl.client, `http://${vip}/`, { intervalMs: 10, timeoutMs: 300, maxInFlight: 50, maxMs: 60_000 });
  await sleep(300);
  const at = await event();
  await tookOver();
  await sleep(500);
  const results = await loop.stop();
  const g = gapReport(results, at, ['b1', 'b2', 'ka1', 'ka2']);
  if (newMasterBody !== undefined) {
    const first = results.filter((r) => r.ok && r.t >= at && r.body === newMasterBody).sort((a, b) => a.t - b.t)[0];
    return { servedMs: first ? first.t + first.ms - at : Number.NaN, failed: g.failures.length };
  }
  return { servedMs: g.servedAfterMs ?? Number.NaN, failed: g.failures.length };
}

async function cut(tl: TrackingLab, ns: string, port: string, ev: Event, on: boolean): Promise<number> {
  const at = Date.now();
  if (ev === 'carrier') await tl.lab.sh(tl.lab.lan, `ip link set ${port} ${on ? 'down' : 'up'}`);
  else await tl.lab.sh(ns, VM_NET_BACKENDS.map((b) => `ip route ${on ? 'replace' : 'del'} unreachable ${b}/32`).join('; '), { allowFail: !on });
  return at;
}

async function agentRun(tl: TrackingLab, ev: Event): Promise<number> {
  const [n2, n3] = tl.nodes;
  const serving = (n: typeof n2) => n.waitService('Master serving', 'api', (s) => s.state === 'serving' && (s.failover as { state?: string } | undefined)?.state === 'master', 20_000);
  await serving(n3);
  const m = await measure(tl, VM_NET_VIP, () => cut(tl, n3.ns, n3.vmPort, ev, true), () => serving(n2));
  await cut(tl, n3.ns, n3.vmPort, ev, false);
  await serving(n3); // preempt back
  log(`agent ${ev}: ${m.servedMs} ms (${m.failed} failed requests)`);
  return m.servedMs;
}

async function keepalivedRun(tl: TrackingLab, k1: Keepalived, k2: Keepalived, ev: Event): Promise<number> {
  const ns1 = tl.lab.ns('ka1');
  await waitFor('ka1 MASTER', () => k1.state() === 'MASTER', 20_000);
  const m = await measure(tl, KA_VIP, () => cut(tl, ns1, 'wka1', ev, true), () => waitFor('ka2 MASTER', () => k2.state() === 'MASTER', 20_000), 'ka2');
  await cut(tl, ns1, 'wka1', ev, false);
  await waitFor('ka1 MASTER again', () => k1.state() === 'MASTER', 20_000);
  await sleep(500);
  log(`keepalived ${ev}: ${m.servedMs} ms (${m.failed} failed requests)`);
  return m.servedMs;
}

async function main(): Promise<void> {
  const runs = Math.max(1, Math.min(20, Number(process.argv[process.argv.indexOf('--runs') + 1] ?? 3) || 3));
  const teardowns: (() => unknown)[] = [];
  const started = Date.now();
  try {
    const tl = await buildTrackingLab({ teardown: (fn) => teardowns.push(fn) }, KA);
    const [n2, n3] = tl.nodes;
    await n3.startTracking();
    await n2.startTracking();
    const kas: Keepalived[] = [];
    for (const k of KA) {
      const ns = tl.lab.ns(k.role);
      await startBackend(tl.lab, ns, k.role, [80]);
      // The script keepalived runs: can this VM still reach a backend?
      const check = tl.lab.file('reach.sh');
      fs.writeFileSync(check, `#!/bin/bash\n${VM_NET_BACKENDS.map((b) => `timeout 0.2 bash -c '</dev/tcp/${b}/8080' 2>/dev/null`).join(' || ')}\n`, { mode: 0o755 });
      kas.push(await startKeepalived(tl.lab, ns, k.role, {
        vrid: 61, priority: k.priority, advertInt: 0.1, vips: [KA_VIP], vipDev: 'eth1', state: k.role === 'ka1' ? 'MASTER' : 'BACKUP',
        preamble: ['vrrp_script reach {', `  script "${check}"`, '  interval 1', '  fall 1', '  rise 1', '  weight -60', '}'],
        instance: ['track_interface {', '  eth1', '}', 'track_script {', '  reach', '}'],
      }));
    }
    const out: Record<string, { agentMs: number[]; keepalivedMs: number[] }> = {};
    const load0 = os.loadavg()[0]!;
    for (const ev of ['carrier', 'service'] as const) {
      out[ev] = { agentMs: [], keepalivedMs: [] };
      for (let i = 0; i < runs; i++) {
        out[ev].agentMs.push(await agentRun(tl, ev));
        out[ev].keepalivedMs.push(await keepalivedRun(tl, kas[0]!, kas[1]!, ev));
      }
    }
    const summary = Object.fromEntries(Object.entries(out).map(([ev, r]) => {
      const a = median(r.agentMs);
      const k = median(r.keepalivedMs);
      return [ev, { ...r, agentMedianMs: a, keepalivedMedianMs: k, ratio: Math.round((a / k) * 100) / 100 }];
    }));
    process.stdout.write(`${JSON.stringify({
      bench: 'tracking', at: new Date().toISOString(), runs, cpus: os.cpus().length, loadavg1: [load0, os.loadavg()[0]], seconds: Math.round((Date.now() - started) / 1000), events: summary,
    }, null, 2)}\n`);
  } finally {
    for (const fn of teardowns.reverse()) await fn();
  }
}

main().catch((e: unknown) => { process.stderr.write(`${e instanceof Error ? e.stack ?? e.message : String(e)}\n`); process.exit(1); });
