// The https area: HTTPS health checks of 1,000 TLS targets, lb-agent's
// checker against HAProxy's `check-ssl`, in the same run on the same
// backends. One nginx in a namespace of its own serves 1,000 TLS ports
// (lab CA, EC P-256, TLS 1.3, session tickets and a session cache as nginx
// has them by default); each run is bench/https-probe.js in the checkers'
// namespace, one process per run, both modes (no verification; the CA with a
// server name), the order of the checkers rotated each round. The line is
// the median over rounds of CPU per completed check, and the ratio of
// lb-agent's to HAProxy's.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Lab } from '../lab/netns';
import { createTestCa } from '../lab/tls';
import { startNginxTlsBackends } from './lib/peers';
import { parseJsonOutput } from './wrapped';
import { median, round } from './lib/stats';
import type { ProfileSummary } from './lib/cpuprofile';

export type HttpsWho = 'agent' | 'haproxy';

export interface HttpsOptions {
  rounds: number; targets: number; period: number; duration: number; warmup: number; log: (msg: string) => void;
  /** Profile lb-agent's measured windows into this directory (https-probe.ts --cpu-profile); default LB_BENCH_CPU_PROF from the environment. */
  profileDir?: string | undefined;
}

export interface HttpsLine {
  who: HttpsWho; verify: boolean; targets: number; checksPerSecond: number; expectedPerSecond: number; resumedFraction: number | null;
  cpu: { percentOfOneCore: number }; cpuMicrosPerCheck: number | null; rssMiB: number | null;
  healthy?: number; tlsContexts?: number; failures?: Record<string, number>; serversReportedDown?: number; eventLoopDelayMs?: { p99: number };
  profile?: ProfileSummary;
}

export interface HttpsSummary {
  who: HttpsWho; verify: boolean; targets: number; periodSeconds: number; checksPerSecond: number; expectedPerSecond: number;
  cpuPercentOfOneCore: number; cpuMicrosPerCheck: number; resumedFraction: number; rssMiB: number;
  /** lb-agent's CPU per check over HAProxy's, same mode; undefined on HAProxy's own line; NaN when either kept under KEPT_PACE of the checks due. */
  xHaproxy: number | undefined;
  runs: number;
}

export interface HttpsResult { config: Omit<HttpsOptions, 'log'> & { command: string }; summary: HttpsSummary[]; raw: unknown[]; errors: string[] }

const BACKEND = '10.99.0.20';
const FIRST_PORT = 20_000;
const SNI = 'backends.lab';

/**
 * The share of the checks due that a checker must complete for its CPU per
 * check to be compared: a checker (or the TLS server behind it, on a
 * machine short of CPU) that completes far fewer spends its CPU on
 * handshakes that time out, and a ratio of the two would compare failures.
 */
export const KEPT_PACE = 0.8;

/** Medians per checker and mode, and lb-agent's CPU per check over HAProxy's (pure). */
export function summariseHttps(raw: readonly HttpsLine[], targets: number, period: number): HttpsSummary[] {
  const summary: HttpsSummary[] = [];
  const expected = targets / period;
  for (const verify of [false, true]) {
    const medianOf = (w: HttpsWho, f: (l: HttpsLine) => number): number => median(raw.filter((l) => l.who === w && l.verify === verify).map(f));
    const keptPace = (w: HttpsWho): boolean => medianOf(w, (l) => l.checksPerSecond) >= KEPT_PACE * expected;
    const hapUs = medianOf('haproxy', (l) => l.cpuMicrosPerCheck ?? NaN);
    for (const w of ['agent', 'haproxy'] as const) {
      const rs = raw.filter((l) => l.who === w && l.verify === verify);
      if (rs.length === 0) continue;
      const us = median(rs.map((l) => l.cpuMicrosPerCheck ?? NaN));
      summary.push({
        who: w, verify, targets, periodSeconds: period,
        checksPerSecond: round(median(rs.map((l) => l.checksPerSecond)), 0), expectedPerSecond: Math.round(expected),
        cpuPercentOfOneCore: round(median(rs.map((l) => l.cpu.percentOfOneCore)), 1),
        cpuMicrosPerCheck: round(us, 1),
        resumedFraction: round(median(rs.map((l) => l.resumedFraction ?? NaN)), 2),
        rssMiB: round(median(rs.map((l) => l.rssMiB ?? NaN)), 0),
        xHaproxy: w === 'agent' ? (keptPace('agent') && keptPace('haproxy') ? round(us / hapUs, 2) : NaN) : undefined,
        runs: rs.length,
      });
    }
  }
  return summary;
}

export async function benchHttps(o: HttpsOptions): Promise<HttpsResult> {
  const script = path.join(__dirname, 'https-probe.js');
  const lab = await Lab.create();
  const ca = await createTestCa(lab.dir);
  const raw: HttpsLine[] = [];
  const errors: string[] = [];
  const profileDir = o.profileDir ?? process.env.LB_BENCH_CPU_PROF;
  if (profileDir !== undefined) fs.mkdirSync(profileDir, { recursive: true });
  const common = ['--address', BACKEND, '--first-port', String(FIRST_PORT), '--count', String(o.targets),
    '--period', String(o.period), '--duration', String(o.duration), '--warmup', String(o.warmup)];
  try {
    const leaf = await ca.issue('backends', { dns: [SNI] });
    const tlsNs = await lab.addHost('tls', { address: `${BACKEND}/24` });
    const checkers = await lab.addHost('checkers', { address: '10.99.0.2/24' });
    const accessLog = lab.file('tls-access.log');
    const nginx = await startNginxTlsBackends(lab, tlsNs, { address: BACKEND, firstPort: FIRST_PORT, count: o.targets, cert: leaf.cert, key: leaf.key, accessLog });
    try {
      const who: HttpsWho[] = ['agent', 'haproxy'];
      for (let r = 0; r < o.rounds; r++) {
        for (const verify of [false, true]) {
          for (const w of who.map((_, i) => who[(i + r) % who.length]!)) {
            const prof = profileDir !== undefined && w === 'agent' ? ['--cpu-profile', path.join(profileDir, `agent-${verify ? 'verify' : 'no-verify'}-${r + 1}.cpuprofile`)] : [];
            const args = [...common, '--who', w, '--access-log', accessLog, ...(verify ? ['--ca', ca.caFile, '--sni', SNI] : []), ...prof];
            const res = await lab.sh(checkers, `ulimit -n 20000 2>/dev/null; exec ${process.execPath} ${script} ${args.join(' ')}`, { allowFail: true, timeoutMs: (o.duration + o.warmup + 60) * 1000 });
            const [line] = parseJsonOutput(res.stdout) as HttpsLine[];
            if (res.code !== 0 || !line) { errors.push(`round ${r + 1}, ${w}${verify ? ' verify' : ''}: exit ${res.code}: ${res.stderr.slice(-300)}`); continue; }
            raw.push(line);
            o.log(`round ${r + 1}/${o.rounds} ${w.padEnd(7)} ${verify ? 'verify' : 'no-verify'}: ${line.checksPerSecond} checks/s of ${line.expectedPerSecond}, cpu ${line.cpu.percentOfOneCore}% of a core, ${line.cpuMicrosPerCheck ?? '-'} us/check, resumed ${line.resumedFraction ?? '-'}`);
            // Sessions in nginx's cache and TIME_WAIT sockets of one run must not favour the next.
            fs.truncateSync(accessLog, 0);
            await new Promise((res2) => setTimeout(res2, 1000));
          }
        }
      }
    } finally {
      await nginx.stop();
    }
  } finally {
    ca.remove();
    await lab.destroy();
  }
  const summary = summariseHttps(raw, o.targets, o.period);
  for (const a of summary.filter((x) => x.who === 'agent' && x.xHaproxy !== undefined && Number.isNaN(x.xHaproxy))) {
    const hap = summary.find((x) => x.who === 'haproxy' && x.verify === a.verify);
    errors.push(`${a.verify ? 'verify' : 'no-verify'}: CPU per check not compared, a checker completed under ${KEPT_PACE * 100}% of the ${a.expectedPerSecond} checks/s due (lb-agent ${a.checksPerSecond}, HAProxy ${hap?.checksPerSecond ?? 'n/a'})`);
  }
  const command = `node dist/bench/https-probe.js --who agent|haproxy ${common.join(' ')} --access-log FILE [--ca FILE --sni ${SNI}]`;
  return { config: { rounds: o.rounds, targets: o.targets, period: o.period, duration: o.duration, warmup: o.warmup, command }, summary, raw, errors };
}
