// Bench of VRRP failover of an IPv6 VIP (not a test; nothing is asserted),
// the IPv6 twin of bench/failover.ts. One throwaway lab (lab/vrrp6.ts: IPv6
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
// every peer dies at the same point of its advert cycle. A client starts a
// request to http://[VIP]/ every 10 ms (new connection, 300 ms deadline);
// the number is the time from the death to the end of the first answered
// request after it, median over the runs, and agent / keepalived as a ratio.
// Only lab namespaces are addressed.
//
//   node dist/bench/failover6.js [--intervals 1,0.1] [--runs 3]
// Prints one JSON object on stdout; progress on stderr.
import * as fs from 'node:fs';
import { createLab, waitFor } from '../lab/netns';
import { startBackend } from '../lab/services';
import { startKeepalived } from '../lab/keepalived';
import { startAgent, waitStatus } from '../lab/agent';
import { addVm6, afterAdvert6, agentConfig6, neighbourMac, BACKEND6, VIP6, type Vm6 } from '../lab/vrrp6';
import { gapReport, ClientLoop } from '../lab/client-loop';
import { masterDownIntervalMs } from '../agent/failover/machine';
import { loadAverage } from './lib/procfs';
import { median } from './lib/stats';

const VRID = 51;

interface Run { servedMs: number; neighbourMs: number; failedRequests: number }

function log(msg: string): void {
  process.stderr.write(`[bench/failover6] ${msg}\n`);
}

function parseArgs(argv: string[]): { intervals: number[]; runs: number } {
  const a = { intervals: [1, 0.1], runs: 3 };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1] ?? '';
    if (argv[i] === '--intervals') { a.intervals = v.split(',').map(Number).filter((x) => x >= 0.01 && x <= 40.95); i++; } else if (argv[i] === '--runs') { a.runs = Math.max(1, Math.min(20, Number(v))); i++; } else throw new Error(`unknown argument ${argv[i]}`);
  }
  return a;
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const started = Date.now();
  const loadBefore = loadAverage();
  const cleanups: (() => unknown)[] = [];
  const lab = await createLab({ teardown: (fn) => { cleanups.push(fn); } });
  const runs = new Map<string, Run[]>();
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
    const measure = async (dying: Vm6, pids: number[], to: Vm6, intervalS: number): Promise<Run> => {
      const loop = await ClientLoop.start(lab, client, `http://[${VIP6}]/`, { intervalMs: 10, timeoutMs: 300, maxInFlight: 50, maxMs: 60_000 });
      await new Promise((r) => setTimeout(r, 300));
      // In one shell, as lab/vrrp.ts vmDeath does: the advert, then port down and SIGKILL.
      await lab.sh(lab.lan, `${afterAdvert6(dying.port, dying.linkLocal, Math.ceil(intervalS * 2 + 1))}ip link set ${dying.port} down && kill -KILL ${pids.join(' ')}`);
      const at = Date.now();
      let neighbourAt = NaN;
      await waitFor('the neighbour entry moved', async () => {
        if ((await neighbourMac(lab, client, VIP6)) !== to.mac) return false;
        neighbourAt = Date.now();
        return true;
      }, 10_000 + 5 * masterDownIntervalMs(150, intervalS * 100), 10).catch(() => undefined);
      await loop.waitServed('an answer after the Master died', at, 10_000 + 5 * masterDownIntervalMs(150, intervalS * 100));
      await new Promise((r) => setTimeout(r, 300));
      const g = gapReport(await loop.stop(), at, ['b6', 'ka1', 'ka2']);
      return { servedMs: g.servedAfterMs ?? NaN, neighbourMs: neighbourAt - at, failedRequests: g.failures.length };
    };

    const agentRun = async (intervalS: number): Promise<Run> => {
      const cfg = { advertInterval: intervalS, vrid: VRID };
      const a3 = await startAgent(lab, n3.ns, agentConfig6(n3, 200, cfg), { name: 'n3', logLevel: 'info' });
      await waitStatus(a3, 'n3 Master and serving', (d) => d.services.some((s) => s.state === 'serving' && s.vip === VIP6), 30_000);
      const a2 = await startAgent(lab, n2.ns, agentConfig6(n2, 150, cfg), { name: 'n2', logLevel: 'info' });
      await waitStatus(a2, 'n2 Backup', (d) => d.services.some((s) => s.failover?.state === 'backup' && s.failover.master === n3.linkLocal), 30_000);
      const run = await measure(n3, [a3.proc.pid!], n2, intervalS);
      await a3.exited;
      a2.signal('SIGTERM');
      await a2.exited;
      // What a reboot clears on n3, then back on the LAN.
      await lab.sh(n3.ns, `ip -6 addr del ${VIP6}/128 dev eth0 2>/dev/null; nft flush ruleset`, { allowFail: true });
      await lab.sh(lab.lan, `ip link set ${n3.port} up`);
      return run;
    };

    const keepalivedRun = async (intervalS: number, id: string): Promise<Run> => {
      const k1 = await startKeepalived(lab, ka1.ns, `ka1-${id}`, { vrid: VRID, priority: 200, advertInt: intervalS, vips: [VIP6], state: 'MASTER' });
      await waitFor('ka1 MASTER', () => k1.state() === 'MASTER', 10_000 + 5 * masterDownIntervalMs(200, intervalS * 100));
      const k2 = await startKeepalived(lab, ka2.ns, `ka2-${id}`, { vrid: VRID, priority: 150, advertInt: intervalS, vips: [VIP6] });
      await waitFor('ka2 BACKUP', () => k2.state() === 'BACKUP', 10_000);
      const pids = (await lab.sh(lab.lan, `ip netns pids ${ka1.ns}`)).stdout.split(/\s+/).filter(Boolean)
        .filter((p) => { try { return fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'keepalived'; } catch { return false; } }).map(Number);
      const run = await measure(ka1, pids, ka2, intervalS);
      await k2.stop();
      await k1.stop();
      await lab.sh(ka1.ns, `ip -6 addr del ${VIP6}/64 dev eth0`, { allowFail: true });
      await lab.sh(ka2.ns, `ip -6 addr del ${VIP6}/64 dev eth0`, { allowFail: true });
      await lab.sh(lab.lan, `ip link set ${ka1.port} up`);
      return run;
    };

    for (const interval of args.intervals) {
      for (let r = 0; r < args.runs; r++) {
        // Interleaved, the order rotated per run.
        const order = r % 2 === 0 ? ['agent', 'keepalived'] : ['keepalived', 'agent'];
        for (const target of order) {
          log(`${target} advertInterval ${interval} s run ${r + 1}/${args.runs}`);
          let run: Run;
          try {
            run = target === 'agent' ? await agentRun(interval) : await keepalivedRun(interval, `${interval}-${r}`);
            log(`  served after ${run.servedMs} ms, neighbour entry moved after ${run.neighbourMs} ms, ${run.failedRequests} failed requests`);
          } catch (e) {
            log(`  run failed: ${(e as Error).message.split('\n')[0]}`);
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
  const results: Record<string, unknown> = {};
  for (const interval of args.intervals) {
    const point = (target: string): { runs: Run[]; medianServedMs: number; medianNeighbourMs: number } => {
      const rs = runs.get(`${target} ${interval}`) ?? [];
      return { runs: rs, medianServedMs: median(rs.map((x) => x.servedMs)), medianNeighbourMs: median(rs.map((x) => x.neighbourMs)) };
    };
    const agent = point('agent');
    const keepalived = point('keepalived');
    results[String(interval)] = {
      agent, keepalived,
      masterDownIntervalMs: Math.round(masterDownIntervalMs(150, interval * 100) * 10) / 10,
      // < 1: the agent serves the VIP again sooner than keepalived.
      ratioServedAgentToKeepalived: Math.round((agent.medianServedMs / keepalived.medianServedMs) * 100) / 100,
    };
  }
  process.stdout.write(`${JSON.stringify({
    bench: 'failover6',
    what: 'ms from the Master VM dying (port down + SIGKILL, right after one of its IPv6 adverts) to the end of the first answered HTTP request to the IPv6 VIP; client starts a request every 10 ms, 300 ms deadline each; neighbourMs: when the client\'s neighbour entry for the VIP had the new Master\'s MAC (polled every ~10 ms)',
    runsPerPoint: args.runs,
    backupPriority: 150,
    load: { before: loadBefore, after: loadAverage() },
    wallSeconds: Math.round((Date.now() - started) / 1000),
    results,
  }, null, 2)}\n`);
}

main().catch((e: unknown) => {
  process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
  process.exit(1);
});
