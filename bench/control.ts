// Bench area "control": the agent's control plane, through the real binary.
//   first VIP served   spawn of `lb-agent run` -> a client in another
//                      namespace gets its first HTTP 200 through the VIP, for
//                      a pool service (RFC 5227 probe of the pool address) and
//                      a DHCP service (start jitter, DHCP, probe of the offer),
//                      default timings; also spawn -> "control socket
//                      listening" (`lb-agent status` answers; issue 18) and
//                      spawn -> "lb-agent started" (the first reconcile ran)
//   reload             100 pool services, one changed: SIGHUP -> the reload's
//                      log line, and SIGHUP -> `status` shows generation + 1
//   memory             VmRSS/VmHWM of the agent with 1 service and with 100,
//                      and with 100 after each of the reloads (issue 18: flat
//                      within 5% over 20); the start's and the last reload's
//                      figures 3 s after the event, each reload's 300 ms;
//                      one service's also apart for pool and DHCP runs
// Metrics stay on (the default endpoint, inside the node's namespace): the
// memory and start measured are those of the default config.
// dnsmasq runs with --no-ping here, so the DHCP time is the agent's, not
// the server's ping check (bench/dhcp.ts measures that).
import * as fs from 'node:fs';
import { Lab, waitFor } from '../lab/netns';
import { startBackend, startDnsmasq } from '../lab/services';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, logTime, FAST_ARP, type AgentHandle } from './lib/agent';
import { startPoller } from './lib/poller';
import { memoryOf } from './lib/procfs';
import { median, round, rotate } from './lib/stats';

const SERVER = '10.99.0.1';
const NODE = '10.99.0.2';
const CLIENT = '10.99.0.3';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];
const POOL_VIP = '10.99.0.200';
const DHCP_VIP = '10.99.0.150';

export interface ControlOptions {
  rounds: number;
  /** Reloads of the 100-service config. */
  reloads: number;
  services: number;
  log: (msg: string) => void;
}

/** rssMiB: the agent's RSS 3 s after the first answer through the VIP. */
export interface FirstVipRun { round: number; ipam: 'pool' | 'dhcp'; socketMs: number; startedMs: number; servedMs: number; boundMs: number; rssMiB: number; error?: string }
/** rssMiB: the agent's RSS once the reload was applied and 300 ms passed. */
export interface ReloadRun { index: number; logMs: number; statusMs: number; generation: number; ok: boolean; rssMiB: number }

export interface ControlResult {
  config: Omit<ControlOptions, 'log'>;
  summary: {
    firstVip: { pool: FirstVipSummary; dhcp: FirstVipSummary };
    /** spawn -> control socket listening, median over every first-VIP run (pool and DHCP). */
    socketMs: number;
    rssOneServiceMiB: number;
    /** The same, pool runs and DHCP runs apart: the target holds for each (issue 18); absent from results before it. */
    rssOneServiceByIpamMiB?: { pool: number; dhcp: number };
    many: { services: number; allReadyMs: number; rssMiB: number; peakRssMiB: number; rssAfterReloadsMiB: number; reloadLogMs: number; reloadStatusMs: number; reloadsOk: number; reloads: number };
  };
  raw: { firstVip: FirstVipRun[]; reloads: ReloadRun[] };
}

export interface FirstVipSummary { servedMs: number; boundMs: number; socketMs: number; startedMs: number }

const rssMiB = (a: AgentHandle): number => (memoryOf(a.proc.pid)?.rssKiB ?? NaN) / 1024;

async function firstVip(lab: Lab, node: string, client: string, server: string, ipam: 'pool' | 'dhcp', tag: string): Promise<Omit<FirstVipRun, 'round' | 'ipam'>> {
  const vip = ipam === 'pool' ? POOL_VIP : DHCP_VIP;
  const dns = ipam === 'dhcp' ? await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.190', noPing: true, name: `dnsmasq-${tag}` }) : undefined;
  const stateDir = lab.file(`first-${tag}-state`);
  try {
    const poller = await startPoller(lab, client, vip, 80, 60_000);
    const cfg = {
      node: { name: 'bench', interface: 'eth0' },
      pools: { 'range-global': '10.99.0.200-10.99.0.210' },
      services: [{ name: `f${tag}`, ipam, loadBalancerIP: vip, ports: [{ port: 80, targetPort: 8080 }], backends: BACKENDS }],
    };
    const t0 = Date.now();
    const agent = await runAgent(lab, node, cfg, { name: `first-${tag}`, waitReady: false, stateDir });
    try {
      const servedAt = await poller.served;
      // RSS as the service runs, not at the instant of its first answer: the
      // daemon collects the start's garbage once the VIP is in place (the
      // 100-service case waits 3 s too).
      await new Promise((r) => setTimeout(r, 3000));
      const socket = agent.logs.find((l) => l.msg === 'control socket listening');
      const started = agent.logs.find((l) => l.msg === 'lb-agent started');
      const bound = agent.logs.find((l) => l.op === 'bind' || l.op === 'bound');
      const boundAddress = bound ? String(bound.address) : undefined;
      return {
        socketMs: logTime(socket) - t0,
        startedMs: logTime(started) - t0,
        servedMs: servedAt - t0,
        boundMs: logTime(bound) - t0,
        rssMiB: rssMiB(agent),
        error: Number.isNaN(servedAt) ? `not served within 60 s (bound: ${boundAddress ?? 'no'})` : boundAddress !== undefined && boundAddress !== vip ? `bound ${boundAddress}, not ${vip}` : undefined,
      };
    } finally {
      await stopAgent(agent);
    }
  } finally {
    await dns?.stop();
    fs.rmSync(stateDir, { recursive: true, force: true });
  }
}

function manyConfig(n: number, changed: number, variant: number): Record<string, unknown> {
  return {
    node: { name: 'bench', interface: 'eth0' },
    pools: { 'range-global': '10.99.0.20-10.99.0.250' },
    arp: FAST_ARP,
    services: Array.from({ length: n }, (_, i) => ({
      name: `s${i}`, ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }],
      // The one changed service swaps its third backend's weight: a backend
      // change, which a reload applies without touching the address.
      backends: i === changed && variant % 2 === 1
        ? [BACKENDS[0], BACKENDS[1], { address: BACKENDS[2], weight: 2 }]
        : BACKENDS,
    })),
  };
}

export async function benchControl(o: ControlOptions): Promise<ControlResult> {
  const lab = await Lab.create();
  const first: FirstVipRun[] = [];
  const reloads: ReloadRun[] = [];
  try {
    const server = await lab.addHost('dhcp', { address: `${SERVER}/24` });
    const node = await lab.addHost('node', { address: `${NODE}/24` });
    const client = await lab.addHost('client', { address: `${CLIENT}/24` });
    for (let i = 0; i < BACKENDS.length; i++) {
      const ns = await lab.addHost(`b${i + 1}`, { address: `${BACKENDS[i]}/24` });
      await startBackend(lab, ns, `b${i + 1}`, [8080]);
    }
    let seq = 0;
    for (let round = 0; round < o.rounds; round++) {
      for (const ipam of rotate(['pool', 'dhcp'] as const, round)) {
        const r = await firstVip(lab, node, client, server, ipam, (seq++).toString(36));
        first.push({ round, ipam, ...r });
        o.log(`round ${round + 1}/${o.rounds} first VIP ${ipam.padEnd(4)}: control socket ${r.socketMs.toFixed(0)} ms, started ${r.startedMs.toFixed(0)} ms, bound ${r.boundMs.toFixed(0)} ms, served ${r.servedMs.toFixed(0)} ms, rss ${r.rssMiB.toFixed(1)} MiB${r.error ? ` (${r.error})` : ''}`);
      }
    }

    const byIpam = (ipam: 'pool' | 'dhcp') => first.filter((r) => r.ipam === ipam).map((r) => r.rssMiB.toFixed(1)).join(', ');
    o.log(`one service, rss: pool ${byIpam('pool')} MiB; DHCP ${byIpam('dhcp')} MiB`);

    // 100 services: start (pool claims with short RFC 5227 timings: the start
    // is set-up here), settle, then reload with one service changed.
    const n = o.services;
    let changed = 0;
    let variant = 0;
    const t0 = Date.now();
    const agent = await runAgent(lab, node, manyConfig(n, changed, variant), { name: 'many' });
    let many: ControlResult['summary']['many'];
    try {
      await waitStatus(agent, `${n} services ready`, (s) => s.services.length === n && s.services.every((x) => x.ready), 120_000);
      const allReadyMs = Date.now() - t0;
      await new Promise((r) => setTimeout(r, 3000));
      const rss = rssMiB(agent);
      o.log(`${n} services ready in ${allReadyMs} ms; rss ${rss.toFixed(1)} MiB`);
      for (let k = 0; k < o.reloads; k++) {
        const before = await agent.status();
        changed = (k * 37 + 11) % n;
        variant = k + 1;
        agent.writeConfig(manyConfig(n, changed, variant));
        const logsBefore = agent.logs.length;
        const s0 = Date.now();
        agent.signal('SIGHUP');
        let statusAt = NaN;
        let generation = before.config.generation;
        await waitFor('reload in status', async () => {
          const s = await agent.status();
          if (s.config.generation >= before.config.generation + 1) { statusAt = Date.now(); generation = s.config.generation; return true; }
          return false;
        }, 20_000, 5).catch(() => undefined);
        const line = agent.logs.slice(logsBefore).find((l) => l.op === 'reload' && typeof l.msg === 'string' && l.msg.startsWith('reloaded'));
        const ok = line !== undefined && Array.isArray(line.changed) && (line.changed as string[]).length === 1 && generation === before.config.generation + 1;
        await new Promise((res) => setTimeout(res, 300));
        const r: ReloadRun = { index: k, logMs: logTime(line) - s0, statusMs: statusAt - s0, generation, ok, rssMiB: round(rssMiB(agent), 1) };
        reloads.push(r);
        o.log(`reload ${k + 1}/${o.reloads} (default/s${changed} changed): logged after ${r.logMs} ms, status generation ${generation} after ${r.statusMs} ms, rss ${r.rssMiB} MiB${ok ? '' : ` (unexpected: ${String(line?.msg)})`}`);
      }
      // The after-reloads figure is sampled as the after-start one is, 3 s
      // after the event: the ratio compares like with like. The per-reload
      // series above is read 300 ms after each reload, when V8's background
      // thread may still be sweeping (its arena held 1-1.4 MiB more at 300 ms
      // than 2 s later in a smaps trace; issue 18).
      await new Promise((res) => setTimeout(res, 3000));
      const mem = memoryOf(agent.proc.pid);
      many = {
        services: n, allReadyMs, rssMiB: round(rss, 1), peakRssMiB: round((mem?.hwmKiB ?? NaN) / 1024, 1), rssAfterReloadsMiB: round((mem?.rssKiB ?? NaN) / 1024, 1),
        reloadLogMs: round(median(reloads.map((r) => r.logMs)), 0),
        reloadStatusMs: round(median(reloads.map((r) => r.statusMs)), 0),
        reloadsOk: reloads.filter((r) => r.ok).length, reloads: reloads.length,
      };
    } finally {
      await stopAgent(agent);
    }
    const fv = (ipam: 'pool' | 'dhcp') => {
      const rs = first.filter((r) => r.ipam === ipam && !r.error);
      return { servedMs: round(median(rs.map((r) => r.servedMs)), 0), boundMs: round(median(rs.map((r) => r.boundMs)), 0), socketMs: round(median(rs.map((r) => r.socketMs)), 0), startedMs: round(median(rs.map((r) => r.startedMs)), 0) };
    };
    const rssOf = (ipam: 'pool' | 'dhcp') => round(median(first.filter((r) => r.ipam === ipam).map((r) => r.rssMiB)), 1);
    return {
      config: { rounds: o.rounds, reloads: o.reloads, services: o.services },
      summary: { firstVip: { pool: fv('pool'), dhcp: fv('dhcp') }, socketMs: round(median(first.map((r) => r.socketMs)), 0), rssOneServiceMiB: round(median(first.map((r) => r.rssMiB)), 1), rssOneServiceByIpamMiB: { pool: rssOf('pool'), dhcp: rssOf('dhcp') }, many },
      raw: { firstVip: first, reloads },
    };
  } finally {
    await lab.destroy();
  }
}
