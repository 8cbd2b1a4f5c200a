// Bench of VRRP failover (not a test; nothing is asserted). One throwaway lab
// (lab/vrrp.ts: namespaces on one bridge,
// backends b1 b2, a client) and, for each advert interval and run:
//   agent       two real agents (n3 priority 200 Master, n2 150 Backup)
//               serving a pool VIP (loadBalancerIP) with the lab's shortened
//               RFC 5227 timings (a takeover probes the VIP for ~0.2 s);
//   agent-rfc   the same with RFC 5227's own timings (probe ~1-9 s), to show
//               what a takeover costs with the defaults (opt-in: --targets);
//   keepalived  two keepalived (VRRPv3, priorities 200 and 150) holding the
//               same VIP, an HTTP server on :80 in each namespace.
// The Master's "VM" dies: its port on the bridge goes down and its process is
// SIGKILLed (keepalived's too), as in vrrp-agent-failover.test.ts, right
// after the Master's advert passes its bridge port (seen by tcpdump), so
// that every peer dies at the same point of its advert cycle. A client
// starts a request every 10 ms (each on a new connection, 300 ms deadline)
// and we take the time from the death to the end of the first answered
// request after it. For the agent the new Master's own log also gives the
// VRRP transition and the moment the VIP was bound. Medians over the runs.
// Only lab namespaces are addressed.
//
//   node dist/bench/failover.js [--intervals 1,0.1,0.01] [--runs 3] [--targets agent,keepalived]
//        [--budget 420] [--trace FILE]
// Points run in order (targets interleaved per interval and run); once
// --budget seconds have passed the remaining ones are listed as skipped
// (bench/run.ts gives this script 8 minutes). Prints one JSON object on
// stdout; progress on stderr.
import * as fs from 'node:fs';
import { waitFor } from '../lab/netns';
import { startBackend } from '../lab/services';
import { startKeepalived } from '../lab/keepalived';
import { buildVrrpLab, vmDeath, bridgePort, logAfter, logTime, POOL_VIP, VRID, type VrrpLab } from '../lab/vrrp';
import { gapReport, ClientLoop } from '../lab/client-loop';
import { masterDownIntervalMs } from '../agent/failover/machine';
import { median } from './lib/stats';

const TARGETS = ['agent', 'agent-rfc', 'keepalived'] as const;
type Target = (typeof TARGETS)[number];
/** RFC 5227 §1.1 defaults (the agent's own defaults). */
const RFC_ARP = { probeWait: 1, probeNum: 3, probeMin: 1, probeMax: 2, announceWait: 2, announceNum: 2, announceInterval: 2 };
const KA = [{ role: 'ka1', ip: '10.99.0.41', priority: 200 }, { role: 'ka2', ip: '10.99.0.42', priority: 150 }] as const;

interface Args { intervals: number[]; runs: number; targets: Target[]; budgetS: number; trace?: string }

function parseArgs(argv: string[]): Args {
  const a: Args = { intervals: [1, 0.1, 0.01], runs: 3, targets: ['agent', 'keepalived'], budgetS: 420 };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1] ?? '';
    switch (argv[i]) {
      case '--intervals': a.intervals = v.split(',').map(Number).filter((x) => x >= 0.01 && x <= 40.95); i++; break;
      case '--runs': a.runs = Math.max(1, Math.min(20, Number(v))); i++; break;
      case '--targets': a.targets = v.split(',').filter((x): x is Target => (TARGETS as readonly string[]).includes(x)); i++; break;
      case '--budget': a.budgetS = Math.max(10, Math.min(3600, Number(v))); i++; break;
      case '--trace': a.trace = v; i++; break;
      default: throw new Error(`unknown argument ${argv[i]}`);
    }
  }
  return a;
}

function log(msg: string): void {
  process.stderr.write(`[bench/failover] ${msg}\n`);
}


interface Run {
  servedMs: number; vrrpMs: number; boundMs: number; failedRequests: number; wrongAnswers: number;
  /** Times the Backup became Master before the kill (a flap: adverts late on a busy machine). */
  spuriousTakeovers: number;
}

/** How long a death waits for the Master's next advert: tcpdump's start plus one interval, with slack. */
function afterAdvertWaitS(intervalS: number): number {
  return Math.ceil(intervalS * 2 + 1);
}

/** Client loop, death, first answer after it. */
async function measure(vl: VrrpLab, kill: () => Promise<number>, intervalS: number): Promise<{ killedAt: number; servedMs: number; failed: number; wrong: number }> {
  const loop = await ClientLoop.start(vl.lab, vl.client, `http://${POOL_VIP}/`, { intervalMs: 10, timeoutMs: 300, maxInFlight: 50, maxMs: 60_000 });
  await new Promise((r) => setTimeout(r, 300));
  const killedAt = await kill();
  await loop.waitServed('an answer after the Master died', killedAt, 10_000 + 5 * masterDownIntervalMs(150, intervalS * 100));
  await new Promise((r) => setTimeout(r, 300));
  const g = gapReport(await loop.stop(), killedAt, ['b1', 'b2', 'ka1', 'ka2']);
  return { killedAt, servedMs: g.servedAfterMs ?? NaN, failed: g.failures.length, wrong: g.wrongBodies.length };
}

async function agentRun(vl: VrrpLab, intervalS: number, rfcArp: boolean, trace?: string): Promise<Run> {
  const n2 = vl.nodes[1]!;
  const n3 = vl.nodes[2]!;
  // At the unit's log level: debug logs every advert heard (100 lines/s at
  // 0.01 s), which keepalived does not, and the bench reads only info lines.
  // A trace wants the debug lines (adverts left out of it): its timings are
  // for reading, not for the table.
  const o = { advertInterval: intervalS, logLevel: trace ? 'debug' : 'info', ...(rfcArp ? { arp: RFC_ARP } : {}) };
  let spurious = 0;
  await n3.start(o);
  await n3.waitService('Master and serving', 'api', (s) => s.failover?.state === 'master' && s.state === 'serving', 30_000);
  await n2.start(o);
  await n2.waitService('Backup', 'api', (s) => s.failover?.state === 'backup' && s.failover.master === n3.ip, 30_000);
  const m = await measure(vl, async () => {
    spurious = ((await n2.service('api')).failover as { transitions: { master: number } }).transitions.master;
    return n3.die({ afterAdvertS: afterAdvertWaitS(intervalS) });
  }, intervalS);
  // --trace FILE: the new Master's log lines from the death on, as offsets
  // from it, appended per run (where the takeover's milliseconds go).
  if (trace) {
    const lines = (n2.agent?.logs ?? []).filter((l) => logTime(l) >= m.killedAt - 5 && l.op !== 'advert')
      .map((l) => `${String(logTime(l) - m.killedAt).padStart(5)} ${String(l.op ?? '')} ${String(l.msg ?? '')}`);
    fs.appendFileSync(trace, `# advertInterval ${intervalS} s, served after ${m.servedMs} ms\n${lines.join('\n')}\n`);
  }
  const master = logAfter(n2, m.killedAt, (l) => l.op === 'transition' && l.to === 'master');
  const bound = logAfter(n2, m.killedAt, (l) => l.op === 'bound');
  const run: Run = {
    servedMs: m.servedMs, vrrpMs: master ? logTime(master) - m.killedAt : NaN, boundMs: bound ? logTime(bound) - m.killedAt : NaN,
    failedRequests: m.failed, wrongAnswers: m.wrong, spuriousTakeovers: spurious,
  };
  // Put the testbed back: n2 stops (SIGTERM), n3 "reboots".
  n2.agent!.signal('SIGTERM');
  await n2.agent!.exited;
  await n3.reboot();
  return run;
}

async function keepalivedRun(vl: VrrpLab, nss: string[], intervalS: number, runId: string): Promise<Run> {
  const [ns1, ns2] = nss as [string, string];
  // state MASTER: it need not wait out Master_Down_Interval alone first.
  const k1 = await startKeepalived(vl.lab, ns1, `ka1-${runId}`, { vrid: VRID, priority: KA[0].priority, advertInt: intervalS, vips: [POOL_VIP], state: 'MASTER' });
  await waitFor('ka1 MASTER', () => k1.state() === 'MASTER', 10_000 + 5 * masterDownIntervalMs(200, intervalS * 100));
  const k2 = await startKeepalived(vl.lab, ns2, `ka2-${runId}`, { vrid: VRID, priority: KA[1].priority, advertInt: intervalS, vips: [POOL_VIP] });
  await waitFor('ka2 BACKUP', () => k2.state() === 'BACKUP', 10_000);
  const port = await bridgePort(vl.lab, ns1);
  const m = await measure(vl, async () => {
    // keepalived forks (parent and VRRP child): every keepalived process of
    // the namespace dies. Found before the death and killed in the same shell
    // as the port goes down, so that the clock starts as the agent's does
    // (lab/vrrp.ts die()): finding them after the port went down started
    // keepalived's clock one spawn late and flattered it by ~10-20 ms.
    const pids = (await vl.lab.sh(vl.lab.lan, `ip netns pids ${ns1}`)).stdout.split(/\s+/).filter(Boolean)
      .filter((p) => { try { return fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'keepalived'; } catch { return false; } }).map(Number);
    return vmDeath(vl.lab, { port, pids, afterAdvertOf: { src: KA[0].ip, waitS: afterAdvertWaitS(intervalS) } });
  }, intervalS);
  await waitFor('ka2 MASTER', () => k2.state() === 'MASTER', 5000);
  // keepalived's notify file lists the BACKUP -> MASTER transitions of ka2.
  const run: Run = {
    servedMs: m.servedMs, vrrpMs: NaN, boundMs: NaN, failedRequests: m.failed, wrongAnswers: m.wrong,
    spuriousTakeovers: k2.notified().filter((l) => l.split(' ')[2] === 'MASTER').length - 1,
  };
  await k2.stop();
  await k1.stop();
  // The killed keepalived left its VIP: what a reboot clears.
  await vl.lab.sh(ns1, `ip addr del ${POOL_VIP}/24 dev eth0`, { allowFail: true });
  await vl.lab.sh(vl.lab.lan, `ip link set ${port} up`);
  return run;
}

/** Medians are NaN when no run measured them (JSON writes null). */
type Point = { runs: Run[]; medianServedMs: number; medianVrrpMs: number; medianBoundMs: number; masterDownIntervalMs: number };

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const started = Date.now();
  const cleanups: (() => unknown)[] = [];
  const vl = await buildVrrpLab({ teardown: (fn) => { cleanups.push(fn); } });
  const runs = new Map<string, Run[]>();
  const skipped: string[] = [];
  try {
    const kaNs: string[] = [];
    for (const k of KA) {
      const ns = await vl.lab.addHost(k.role, { address: `${k.ip}/24` });
      kaNs.push(ns);
      await startBackend(vl.lab, ns, k.role, [80]);
    }
    for (const interval of args.intervals) {
      for (let r = 0; r < args.runs; r++) {
        for (const target of args.targets) {
          const key = `${target} ${interval}`;
          if (Date.now() - started > args.budgetS * 1000) { skipped.push(`${key} run ${r + 1}`); continue; }
          log(`${target} advertInterval ${interval} s run ${r + 1}/${args.runs}`);
          let run: Run;
          try {
            run = target === 'keepalived'
              ? await keepalivedRun(vl, kaNs, interval, `${interval}-${r}`)
              : await agentRun(vl, interval, target === 'agent-rfc', args.trace);
            log(`  served after ${run.servedMs} ms (VRRP Master ${run.vrrpMs} ms, VIP bound ${run.boundMs} ms, ${run.failedRequests} failed requests, ${run.spuriousTakeovers} spurious takeovers before)`);
          } catch (e) {
            log(`  run failed: ${(e as Error).message.split('\n')[0]}`);
            run = { servedMs: NaN, vrrpMs: NaN, boundMs: NaN, failedRequests: NaN, wrongAnswers: NaN, spuriousTakeovers: NaN };
            // Leave a clean testbed for the next run.
            for (const n of vl.nodes) if (n.alive) { n.agent!.signal('SIGKILL'); await n.agent!.exited; }
            for (const n of vl.nodes) await n.reboot().catch(() => undefined);
          }
          runs.set(key, [...(runs.get(key) ?? []), run]);
        }
      }
    }
  } finally {
    for (const fn of cleanups.reverse()) await fn();
  }
  const results: Record<string, Record<string, Point>> = {};
  for (const target of args.targets) {
    results[target] = {};
    for (const interval of args.intervals) {
      const rs = runs.get(`${target} ${interval}`);
      if (!rs) continue;
      results[target][String(interval)] = {
        runs: rs,
        medianServedMs: median(rs.map((x) => x.servedMs)),
        medianVrrpMs: median(rs.map((x) => x.vrrpMs)),
        medianBoundMs: median(rs.map((x) => x.boundMs)),
        masterDownIntervalMs: Math.round(masterDownIntervalMs(150, interval * 100) * 10) / 10,
      };
    }
  }
  process.stdout.write(`${JSON.stringify({
    bench: 'failover',
    what: 'ms from the Master VM dying (port down + SIGKILL, right after one of its adverts) to the end of the first answered HTTP request to the VIP; client starts a request every 10 ms, 300 ms deadline each',
    runsPerPoint: args.runs,
    backupPriority: 150,
    wallSeconds: Math.round((Date.now() - started) / 1000),
    skipped,
    results,
  }, null, 2)}\n`);
}

main().catch((e: unknown) => {
  process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
  process.exit(1);
});
