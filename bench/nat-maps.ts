// The eBPF NAT engine's map work at a large plan, batch calls beside one call
// an entry in one run: a full load (program, maps and every entry: 1,000
// services of two ports and five backends, about a million slot entries),
// a read of every counter, and a restart (a new engine on the pins) with
// the same plan. Wall time, bpf(2) calls and entries written, and the ratio
// of the two ways. The engine attaches at lo of a namespace of its own on a
// BPF file system of its own (this process re-runs itself under
// `ip netns exec`, whose mount namespace takes the mount with it).
//
//   node dist/bench/nat-maps.js [--services 1000] [--backends 5] [--rounds 3] [--out FILE]
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { NAT_DEFAULTS, NatEngine } from '../agent/net/ebpf/nat-attach';
import { natPlan } from '../agent/forward/nat-plan';
import { natLayout } from '../agent/net/ebpf/nat-layout';
import { parseIPv4 } from '../agent/address';
import type { ForwardState } from '../agent/forward/dataplane';
import { median, round } from './lib/stats';
import { inOwnNetns } from './lib/netns-self';

const arg = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : dflt;
};

function state(services: number, backends: number): ForwardState {
  return {
    services: Array.from({ length: services }, (_, i) => {
      const all = Array.from({ length: backends }, (_, j) => {
        const address = `10.${3 + j}.${i >> 8}.${i & 255}`;
        return { address, addressNum: parseIPv4(address)!, weight: 1 };
      });
      return {
        key: `bench/s${i}`, vip: `10.1.${i >> 8}.${i & 255}`, backends: all, healthy: all, sourceIP: 'snat' as const,
        ports: [{ name: 'http', port: 80, protocol: 'TCP' as const, targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' as const, targetPort: 5353 }],
      };
    }),
  };
}

interface Row { load: { ms: number; calls: number; writes: number }; counters: { ms: number; calls: number }; restart: { ms: number; mode: string; calls: number; writes: number } }

function measure(batch: boolean, pinDir: string, services: number, backends: number): Row {
  const s = state(services, backends);
  const settings = { ...NAT_DEFAULTS, flowEntries: 4096 };
  const e = new NatEngine({ device: 'lo', pinDir, batch, settings });
  const plan = natPlan(s, natLayout());
  let t0 = process.hrtime.bigint();
  const r = e.apply(plan);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;
  t0 = process.hrtime.bigint();
  const c = e.counters();
  const countersMs = Number(process.hrtime.bigint() - t0) / 1e6;
  if (c.size !== services * 2 * backends) throw new Error(`counters: ${c.size}`);
  e.release();
  const next = new NatEngine({ device: 'lo', pinDir, batch, settings });
  const plan2 = natPlan(s, natLayout());
  t0 = process.hrtime.bigint();
  const r2 = next.apply(plan2);
  const restartMs = Number(process.hrtime.bigint() - t0) / 1e6;
  next.detach();
  return { load: { ms: loadMs, calls: r.calls, writes: r.writes }, counters: { ms: countersMs, calls: e.counterCalls }, restart: { ms: restartMs, mode: r2.mode, calls: r2.calls, writes: r2.writes } };
}

function inner(): void {
  const services = Number(arg('--services', '1000'));
  const backends = Number(arg('--backends', '5'));
  const rounds = Number(arg('--rounds', '3'));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `lbnm-${process.pid}-`));
  execFileSync('mount', ['-t', 'bpf', 'bpf', dir]);
  execFileSync('ip', ['link', 'set', 'lo', 'up']);
  const rows: Record<'batch' | 'single', Row[]> = { batch: [], single: [] };
  try {
    for (let i = 0; i < rounds; i++) {
      // Side by side, alternating, so the machine's load falls on both alike.
      rows.batch.push(measure(true, path.join(dir, `b${i}`), services, backends));
      rows.single.push(measure(false, path.join(dir, `s${i}`), services, backends));
    }
  } finally {
    execFileSync('umount', [dir]);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const sum = (rs: Row[]): Record<string, unknown> => ({
    loadMs: round(median(rs.map((r) => r.load.ms)), 1), loadCalls: rs[0]!.load.calls, loadWrites: rs[0]!.load.writes,
    countersMs: round(median(rs.map((r) => r.counters.ms)), 2), countersCalls: rs[0]!.counters.calls,
    restartMs: round(median(rs.map((r) => r.restart.ms)), 1), restartMode: rs[0]!.restart.mode, restartCalls: rs[0]!.restart.calls, restartWrites: rs[0]!.restart.writes,
  });
  const b = sum(rows.batch);
  const s = sum(rows.single);
  const out = {
    when: new Date().toISOString(), kernel: os.release(), cpus: os.cpus().length, loadavg: os.loadavg().map((x) => round(x, 2)),
    config: { services, backends, ports: 2, rounds },
    batch: b, single: s,
    ratios: { load: round((b['loadMs'] as number) / (s['loadMs'] as number), 3), counters: round((b['countersMs'] as number) / (s['countersMs'] as number), 3) },
    rounds: rows,
  };
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
}

if (inOwnNetns(__filename, 'lbnm', 'LB_NAT_MAPS_INNER')) inner();
