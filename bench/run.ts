// `npm run bench` (as root): builds the testbed of namespaces, runs lb-agent
// and its peers on the same traffic in the same run, and writes
// bench/results/<YYYY-MM-DD>.md with the raw numbers beside it as JSON.
// Orchestration only: each area lives in its own module (forwarding.ts,
// families.ts, dhcp.ts, detection.ts, https.ts, control.ts, restart.ts,
// drift.ts, scale.ts, nat.ts, failover6.ts, tracking.ts, wrapped.ts for the
// standalone benches other modules ship),
// statistics and rendering in lib/.
//
//   npm run bench -- [--only forward,families,dhcp,health,https,control,restart,drift,scale,nat,preflight,failover,failover6,tracking]
//                    [--rounds N] [--quick] [--out DIR] [--docs] [--dhcp-many-ping]
//                    [--dhcp-clients udhcpc,dhclient,lbagent,lbagent-like]
//                    [--forward-targets direct,dsr,direct3,dsr3,...] [--scale-sizes 10,100,500,1000] [--scale-engine auto]
//                    [--nat-flows 100000] [--nat-udp-flows 20000] [--families-paths kernel,routed]
//
// --dhcp-clients: only these DHCP clients (e.g. `lbagent-like,udhcpc` to
// look at one row and its peer while working on it; issue 18).
// --forward-targets: only these forwarding rows (e.g. `direct3,dsr3` for
// issue 17's like-for-like ratio); a row's paired reference (direct, or
// direct3) must be listed too for its "x direct".
// --scale-sizes: the service counts of the scale area (e.g. `10,100` for a
// short run). --scale-engine: the kernel path's engine the scale area's
// agent runs with (`kernel.engine`: auto, nft or ebpf; unset, the default).
// --nat-flows: the connections the nat area holds open through the eBPF
// engine (0 skips that part); --nat-udp-flows: the UDP flows it holds
// beside them (0: none).
// --families-paths: only these rows of the families area (e.g.
// `kernel,routed` to compare the kernel path with its floor in a third of
// the time).
// --quick: one round and short measurements (3-4 minutes), to check the
// harness, not to quote. --docs: also replace the generated summary in
// docs/benchmarks.md with this run's (`npm run docs` does the same from the
// latest full run committed in bench/results/). Only lab namespaces and loopback are traffic
// targets; every lab is torn down, also on Ctrl-C.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { benchForward, DEFAULT_FORWARD_TARGETS, FORWARD_TARGETS, type ForwardTarget } from './forwarding';
import { benchFamilies, FAMILY_PATHS, type FamilyPath } from './families';
import { benchDhcp, benchDhcp6, DHCP_CLIENTS, type DhcpClient } from './dhcp';
import { benchDetection, DETECTION_SETTINGS } from './detection';
import { benchHttps } from './https';
import { benchControl } from './control';
import { benchRestart } from './restart';
import { benchDrift } from './drift';
import { benchScale, SCALE_SIZES, type ScaleEngine } from './scale';
import { benchNat } from './nat';
import { benchProbeRate, benchPreflight, benchFailover } from './wrapped';
import { benchFailover6 } from './failover6';
import { benchTracking } from './tracking';
import { machineFacts, loadAverage, otherCpuMeter } from './lib/procfs';
import { evaluateTargets, renderResults, renderBenchSummary, updateBenchPage, BENCH_PAGE, type BenchResults } from './lib/report';
import { round } from './lib/stats';

const AREAS = ['forward', 'families', 'dhcp', 'health', 'https', 'control', 'restart', 'drift', 'scale', 'nat', 'preflight', 'failover', 'failover6', 'tracking'] as const;
type Area = (typeof AREAS)[number];

const TOOLS: Record<Area, string[]> = {
  forward: ['wrk', 'iperf3', 'haproxy', 'nginx', 'conntrack', 'nft'],
  families: ['wrk', 'nginx', 'nft'],
  dhcp: ['dnsmasq', 'busybox', 'dhclient', 'tcpdump'],
  health: ['haproxy'],
  // nginx serves the TLS targets, HAProxy is the peer, openssl makes the lab CA.
  https: ['haproxy', 'nginx', 'openssl'],
  control: ['dnsmasq'],
  // The continuity lab runs dnsmasq; the agent runs nft (kernel path) and ip/unshare; HAProxy is the peer.
  restart: ['haproxy', 'dnsmasq', 'nft', 'ip', 'unshare'],
  // The continuity lab again; the damage is done with nft, ip and sysctl in the node's namespace.
  drift: ['dnsmasq', 'nft', 'ip', 'unshare', 'sysctl'],
  // The agent runs nft; the reference table is written with nft -f.
  scale: ['nft', 'ip'],
  // The forwarding lab's tools; mount gives the agent its BPF file system.
  nat: ['wrk', 'iperf3', 'nginx', 'conntrack', 'nft', 'mount'],
  preflight: [],
  // keepalived is the peer; each death waits for an advert with tcpdump (lab/vrrp.ts afterAdvert).
  failover: ['keepalived', 'tcpdump', 'ip'],
  // keepalived is the peer; each death waits for an IPv6 advert with tcpdump (lab/vrrp6.ts afterAdvert6).
  failover6: ['keepalived', 'tcpdump', 'ip', 'nft'],
  // keepalived with track_interface and track_script (bash's /dev/tcp under timeout) is the peer.
  tracking: ['keepalived', 'ip', 'bash', 'timeout'],
};

interface Args { only: Area[]; rounds: number; quick: boolean; out: string; docs: boolean; dhcpManyPing: boolean; dhcpClients: DhcpClient[]; forwardTargets: ForwardTarget[]; scaleSizes: number[]; scaleEngine: ScaleEngine | undefined; natFlows: number; natUdpFlows: number; familiesPaths: FamilyPath[] }

const REPO = path.resolve(__dirname, '..', '..');

function usage(): string {
  return `usage: npm run bench -- [--only ${AREAS.join(',')}] [--rounds N] [--quick] [--out DIR] [--docs] [--dhcp-many-ping] [--dhcp-clients ${DHCP_CLIENTS.join(',')}] [--forward-targets ${FORWARD_TARGETS.join(',')}] [--scale-sizes ${SCALE_SIZES.join(',')}] [--scale-engine auto|nft|ebpf] [--nat-flows N] [--nat-udp-flows N] [--families-paths ${FAMILY_PATHS.join(',')}]\n`;
}

function parseArgs(argv: string[]): Args {
  const a: Args = { only: [], rounds: 0, quick: false, out: path.join(REPO, 'bench', 'results'), docs: false, dhcpManyPing: false, dhcpClients: [...DHCP_CLIENTS], forwardTargets: [...DEFAULT_FORWARD_TARGETS], scaleSizes: [...SCALE_SIZES], scaleEngine: undefined, natFlows: 100_000, natUdpFlows: 20_000, familiesPaths: [...FAMILY_PATHS] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case '--only': {
        const names = String(v ?? '').split(',').filter(Boolean);
        const bad = names.filter((n) => !(AREAS as readonly string[]).includes(n));
        if (bad.length || names.length === 0) throw new Error(`--only: unknown area ${bad.join(',') || '(none)'}; areas are ${AREAS.join(', ')}`);
        a.only = names as Area[]; i++; break;
      }
      case '--rounds': {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 1 || n > 20) throw new Error('--rounds: an integer from 1 to 20');
        a.rounds = n; i++; break;
      }
      case '--quick': a.quick = true; break;
      case '--docs': a.docs = true; break;
      case '--dhcp-many-ping': a.dhcpManyPing = true; break;
      case '--dhcp-clients': {
        const names = String(v ?? '').split(',').filter(Boolean);
        const bad = names.filter((n) => !(DHCP_CLIENTS as readonly string[]).includes(n));
        if (bad.length || names.length === 0) throw new Error(`--dhcp-clients: unknown client ${bad.join(',') || '(none)'}; clients are ${DHCP_CLIENTS.join(', ')}`);
        a.dhcpClients = names as DhcpClient[]; i++; break;
      }
      case '--forward-targets': {
        const names = String(v ?? '').split(',').filter(Boolean);
        const bad = names.filter((n) => !(FORWARD_TARGETS as readonly string[]).includes(n));
        if (bad.length || names.length === 0) throw new Error(`--forward-targets: unknown target ${bad.join(',') || '(none)'}; targets are ${FORWARD_TARGETS.join(', ')}`);
        // In the table's order, whatever the order given.
        a.forwardTargets = FORWARD_TARGETS.filter((t) => names.includes(t)); i++; break;
      }
      case '--families-paths': {
        const names = String(v ?? '').split(',').filter(Boolean);
        const bad = names.filter((n) => !(FAMILY_PATHS as readonly string[]).includes(n));
        if (bad.length || names.length === 0) throw new Error(`--families-paths: unknown path ${bad.join(',') || '(none)'}; paths are ${FAMILY_PATHS.join(', ')}`);
        a.familiesPaths = FAMILY_PATHS.filter((p) => names.includes(p)); i++; break;
      }
      case '--scale-sizes': {
        const sizes = String(v ?? '').split(',').filter(Boolean).map(Number);
        if (sizes.length === 0 || sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 2000)) throw new Error('--scale-sizes: service counts from 1 to 2000, comma-separated');
        a.scaleSizes = sizes; i++; break;
      }
      case '--scale-engine': {
        if (v !== 'auto' && v !== 'nft' && v !== 'ebpf') throw new Error(`--scale-engine: auto, nft or ebpf, not ${v ?? '(none)'}`);
        a.scaleEngine = v; i++; break;
      }
      case '--nat-flows': {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0 || n > 400_000) throw new Error('--nat-flows: connections from 0 to 400000');
        a.natFlows = n; i++; break;
      }
      case '--nat-udp-flows': {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0 || n > 100_000) throw new Error('--nat-udp-flows: UDP flows from 0 to 100000');
        a.natUdpFlows = n; i++; break;
      }
      case '--out': a.out = path.resolve(String(v)); i++; break;
      case '--help': case '-h': process.stdout.write(usage()); process.exit(0); break;
      default: throw new Error(`unknown argument ${argv[i]}\n${usage()}`);
    }
  }
  if (a.rounds === 0) a.rounds = a.quick ? 1 : 3;
  return a;
}

function missingTools(area: Area): string[] {
  return TOOLS[area].filter((t) => spawnSync('sh', ['-c', `command -v ${t}`], { stdio: 'ignore' }).status !== 0);
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  if (process.getuid?.() !== 0) {
    process.stderr.write('bench: needs root (it builds network namespaces); run it as root: sudo npm run bench\n');
    process.exitCode = 2;
    return;
  }
  const areas = args.only.length ? args.only : [...AREAS];
  const t0 = Date.now();
  const log = (area: string) => (msg: string): void => {
    process.stderr.write(`[bench ${((Date.now() - t0) / 1000).toFixed(0).padStart(4)} s] ${area}: ${msg}\n`);
  };
  const version = (JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
  const startedAt = new Date();
  const samples: number[] = [loadAverage()[0]];
  const otherAll = otherCpuMeter();
  const sampler = setInterval(() => samples.push(loadAverage()[0]), 10_000);
  sampler.unref();
  const results: BenchResults = {
    bench: 'lb-agent', version, date: startedAt.toISOString().slice(0, 10), startedAt: startedAt.toISOString(), finishedAt: '',
    options: { rounds: args.rounds, quick: args.quick, only: args.only, ...(args.forwardTargets.join(',') !== DEFAULT_FORWARD_TARGETS.join(',') ? { forwardTargets: args.forwardTargets } : {}), ...(args.scaleSizes.join(',') !== SCALE_SIZES.join(',') ? { scaleSizes: args.scaleSizes } : {}), ...(args.scaleEngine ? { scaleEngine: args.scaleEngine } : {}), ...(areas.includes('nat') ? { natFlows: args.natFlows, natUdpFlows: args.natUdpFlows } : {}) },
    machine: machineFacts(),
    load: { before: loadAverage(), after: [], samples, mean1m: NaN, max1m: NaN, otherCpuCores: NaN },
    areas: {}, targets: [],
  };
  log('bench')(`${results.machine.cpus} CPUs, load ${results.load.before.join(' ')}; areas ${areas.join(', ')}; ${args.rounds} round(s)${args.quick ? ', quick' : ''}`);

  const q = args.quick;
  const R = args.rounds;
  const runArea = async (area: Area, fn: () => Promise<void>): Promise<void> => {
    const loadBefore = loadAverage();
    const other = otherCpuMeter();
    const s = Date.now();
    let error: string | undefined;
    const missing = missingTools(area);
    if (missing.length) {
      error = `missing tools: ${missing.join(', ')} (scripts/setup.sh installs them)`;
    } else {
      try { await fn(); } catch (e) { error = String((e as Error).stack ?? e).slice(0, 2000); }
    }
    results.areas[area] = { seconds: round((Date.now() - s) / 1000, 1), loadBefore, loadAfter: loadAverage(), otherCpuCores: other.stop(), ...(error ? { error } : {}) };
    log(area)(error ? `FAILED: ${error.split('\n')[0]}` : `done in ${((Date.now() - s) / 1000).toFixed(0)} s`);
  };

  for (const area of areas) {
    switch (area) {
      case 'forward':
        await runArea(area, async () => {
          // Issue 18's proxy lines: 3 pairs a slot in a full run, 9 a line (forwarding.ts), one with --quick.
          results.forward = await benchForward({ rounds: R, seconds: q ? 2 : 3, warmup: q ? 0 : 1, connections: 50, threads: 1, targets: args.forwardTargets, peerPairs: q ? 1 : 3, log: log(area) });
        });
        break;
      case 'families':
        await runArea(area, async () => {
          // IPv6 beside IPv4: 3 pairs a slot a kind in a full run, one with --quick.
          results.families = await benchFamilies({ rounds: R, seconds: q ? 2 : 3, warmup: q ? 0 : 1, connections: 50, threads: 1, pairs: q ? 1 : 3, paths: args.familiesPaths, log: log(area) });
          if (results.families.summary.length === 0) throw new Error(results.families.errors.join('; ') || 'nothing measured');
        });
        break;
      case 'dhcp':
        await runArea(area, async () => {
          results.dhcp = await benchDhcp({
            rounds: R, counts: [1, 50], clients: args.dhcpClients,
            // lb-agent's defaults stay in the 50 even with --quick: issue 18's target covers them, and
            // with the ARP probes overlapping across services they take ~12 s, not the ~40 s of 8 at a time.
            manyClients: args.dhcpClients,
            ping: [false, true],
            manyPingRounds: args.dhcpManyPing ? 1 : 0,
            manyPingClients: args.dhcpClients.filter((c) => c !== 'lbagent'),
            // Issue 18's like-for-like line, judged pair by pair: 9 pairs in a
            // full run (its rounds' and 6 more, ~3.5 s each: 22 s in the 2026-11-29-3 run),
            // as many as rounds with --quick.
            likePairs: q ? R : Math.max(R, 9),
            log: log(area),
          });
          results.dhcp6 = await benchDhcp6({ rounds: Math.max(R, 3), log: log('dhcp/v6') });
        });
        break;
      case 'health':
        await runArea(area, async () => {
          results.detection = await benchDetection({ rounds: R, settings: DETECTION_SETTINGS, log: log('health/detection') });
          results.probes = await benchProbeRate({
            rounds: R, period: 1, duration: q ? 3 : 5, warmup: q ? 2 : 3, log: log('health/probes'),
            runs: [{ backends: 1000, paths: ['native', 'node'] }, { backends: 10_000, paths: ['native', 'native-fin', 'node', 'own', 'haproxy'] }],
          });
          if (results.probes.errors.length) throw new Error(results.probes.errors.join('; '));
        });
        break;
      case 'https':
        await runArea(area, async () => {
          // 1,000 TLS targets at Harvester's default 5 s period: 200 checks/s for each checker.
          results.https = await benchHttps({ rounds: R, targets: 1000, period: 5, duration: q ? 8 : 15, warmup: q ? 6 : 8, log: log(area) });
          if (results.https.errors.length) throw new Error(results.https.errors.join('; '));
        });
        break;
      case 'control':
        await runArea(area, async () => {
          // Issue 18: RSS flat within 5% across 20 reloads.
          results.control = await benchControl({ rounds: R, reloads: q ? 5 : 20, services: 100, log: log(area) });
        });
        break;
      case 'restart':
        await runArea(area, async () => {
          results.restart = await benchRestart({ rounds: R, preMs: q ? 300 : 400, postMs: q ? 500 : 800, log: log(area) });
          if (results.restart.summary.length === 0) throw new Error(results.restart.errors.join('; ') || 'no event measured');
        });
        break;
      case 'drift':
        await runArea(area, async () => {
          // 1,000 services for the resync's cost in a full run; --quick keeps the area near 90 s.
          results.drift = await benchDrift({ rounds: R, services: q ? 200 : 1000, cpuWindowSeconds: q ? 8 : 10, cpuPairs: q ? 1 : 3, timerKinds: q ? 2 : 4, log: log(area) });
          if (results.drift.summary.length === 0) throw new Error(results.drift.errors.join('; ') || 'no damage measured');
        });
        break;
      case 'scale':
        await runArea(area, async () => {
          // 30 s of idle: six health-check periods and one drift resync at their defaults, whole.
          results.scale = await benchScale({ sizes: args.scaleSizes, engine: args.scaleEngine, rounds: R, idleSeconds: q ? 5 : 30, log: log(area) });
          if (results.scale.summary.length === 0) throw new Error(results.scale.errors.join('; ') || 'no size measured');
        });
        break;
      case 'nat':
        await runArea(area, async () => {
          // The eBPF NAT engine beside nft, DSR and direct; then the flows held (--nat-flows).
          results.nat = await benchNat({ rounds: R, seconds: q ? 2 : 3, warmup: q ? 0 : 1, connections: 50, threads: 1, flows: args.natFlows, udpFlows: args.natFlows > 0 ? args.natUdpFlows : 0, flowAddresses: 6, log: log(area) });
          if (Object.keys(results.nat.forward.summary).length === 0) throw new Error(results.nat.forward.errors.join('; ') || 'nothing measured');
        });
        break;
      case 'preflight':
        await runArea(area, async () => {
          results.preflight = await benchPreflight({ runs: q ? 3 : 7, log: log(area) });
          if (results.preflight.error) throw new Error(results.preflight.error);
        });
        break;
      case 'failover':
        await runArea(area, async () => {
          results.failover = await benchFailover({ quick: q, log: log(area) });
          if (results.failover.error) throw new Error(results.failover.error);
        });
        break;
      case 'failover6':
        await runArea(area, async () => {
          // 1 s and 0.1 s adverts, 3 runs a side each (about 2 minutes); one with --quick.
          results.failover6 = await benchFailover6({ intervals: [1, 0.1], runs: q ? 1 : R, log: log(area) });
          if (results.failover6.errors.length) throw new Error(results.failover6.errors.join('; '));
        });
        break;
      case 'tracking':
        await runArea(area, async () => {
          // Both sides probe once a second: the probe's phase spreads the service line over 0-1 s, so more runs than rounds.
          results.tracking = await benchTracking({ runs: q ? 1 : Math.max(R, 10), log: log(area) });
          if (results.tracking.errors.length) throw new Error(results.tracking.errors.join('; '));
        });
        break;
    }
  }
  clearInterval(sampler);
  samples.push(loadAverage()[0]);
  results.finishedAt = new Date().toISOString();
  results.load.after = loadAverage();
  results.load.mean1m = round(samples.reduce((s, x) => s + x, 0) / samples.length, 2);
  results.load.max1m = Math.max(...samples);
  results.load.otherCpuCores = otherAll.stop();
  results.targets = evaluateTargets(results);

  fs.mkdirSync(args.out, { recursive: true });
  // A partial or quick run never overwrites the day's full results.
  // Nor does a second run of the same kind on the same day overwrite the first: it is <base>-2, -3...
  const stem = `${results.date}${q ? '-quick' : ''}${args.only.length ? `-${args.only.join('-')}` : ''}`;
  let base = stem;
  for (let n = 2; fs.existsSync(path.join(args.out, `${base}.md`)) || fs.existsSync(path.join(args.out, `${base}.json`)); n++) base = `${stem}-${n}`;
  const md = path.join(args.out, `${base}.md`);
  const json = path.join(args.out, `${base}.json`);
  fs.writeFileSync(json, `${JSON.stringify(results, null, 2)}\n`);
  const text = renderResults(results);
  fs.writeFileSync(md, text);
  process.stdout.write(text);
  log('bench')(`wrote ${path.relative(process.cwd(), md)} and ${path.relative(process.cwd(), json)} in ${((Date.now() - t0) / 60_000).toFixed(1)} min`);
  if (args.docs) {
    const page = path.join(REPO, BENCH_PAGE);
    const rel = path.relative(REPO, md);
    fs.writeFileSync(page, updateBenchPage(fs.readFileSync(page, 'utf8'), renderBenchSummary(results, rel)));
    log('bench')(`updated the summary of ${page}`);
  }
  if (Object.values(results.areas).some((a) => a.error)) process.exitCode = 1;
}

main().catch((e: unknown) => {
  process.stderr.write(`bench: ${String((e as Error).message ?? e)}\n`);
  process.exitCode = process.exitCode ?? 2;
});
