// The eBPF NAT engine's own work for a health transition and a one-backend
// reload at a large plan: the real engine (program, maps, the record kept
// beside them) at lo of a namespace of its own, 1,000 services by default in
// the scale bench's mix (2, 3 or 4 of four backends each, one TCP port).
// What the data path does beyond the nft table at each change: the plan of
// the new state from the last one (natPlan) and its map writes
// (NatEngine.apply), wall and CPU time, the map entries written and the
// bpf(2) calls; then the record of the maps, kept a second after a burst
// (what a planned stop or the timer pays once). One backend of service 0
// and of service 1 (two and three backends) taken out and put back, and a
// reload that replaces one backend of service 2, in turn.
//
//   node dist/bench/nat-transition.js [--services 1000] [--rounds 20] [--out FILE]
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { NAT_DEFAULTS, NatEngine } from '../agent/net/ebpf/nat-attach';
import { natPlan, type NatPlan } from '../agent/forward/nat-plan';
import { natLayout } from '../agent/net/ebpf/nat-layout';
import { parseIPv4 } from '../agent/address';
import type { ForwardService } from '../agent/forward/dataplane';
import { median, round } from './lib/stats';
import { inOwnNetns } from './lib/netns-self';

const arg = (name: string, dflt: string): string => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1]! : dflt;
};

const POOL = ['10.96.0.11', '10.96.0.12', '10.96.0.13', '10.96.0.14', '10.96.0.15'];
const spec = (address: string): { address: string; addressNum: number; weight: number } => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

/** Service i as the scale bench has it: 2, 3 or 4 of four backends; `down` out of its healthy set, `swap` its last backend replaced by a fifth. */
function service(i: number, down = false, swap = false): ForwardService {
  const all = Array.from({ length: 2 + (i % 3) }, (_, j) => POOL[(i + j) % 4]!);
  if (swap) all[all.length - 1] = POOL[4]!;
  const backends = all.map(spec);
  return {
    key: `default/s${i}`, vip: `10.97.${i >> 8}.${i & 255}`, backends, healthy: down ? backends.slice(1) : backends, sourceIP: 'snat',
    ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
  };
}

interface Sample { kind: string; ms: number; cpuMs: number; writes: number; calls: number; mode: string }

function inner(): void {
  const n = Number(arg('--services', '1000'));
  const rounds = Number(arg('--rounds', '20'));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `lbnt-${process.pid}-`));
  execFileSync('mount', ['-t', 'bpf', 'bpf', dir]);
  execFileSync('ip', ['link', 'set', 'lo', 'up']);
  const samples: Sample[] = [];
  const records: number[] = [];
  try {
    const e = new NatEngine({ device: 'lo', pinDir: path.join(dir, 'pins'), settings: { ...NAT_DEFAULTS, flowEntries: 4096 } });
    const services = Array.from({ length: n }, (_, i) => service(i));
    let plan: NatPlan = natPlan({ services }, natLayout());
    e.apply(plan);
    const changes: Array<[string, number, (on: boolean) => ForwardService]> = [
      ['transition, 2 backends', 0, (on) => service(0, on)],
      ['transition, 3 backends', 1, (on) => service(1, on)],
      ['reload, 4 backends, one replaced', 2, (on) => service(2, false, on)],
    ];
    for (let r = 0; r < rounds; r++) {
      for (const [kind, i, make] of changes) {
        for (const on of [true, false]) {
          services[i] = make(on);
          const t0 = process.hrtime.bigint();
          const c0 = process.cpuUsage();
          plan = natPlan({ services }, natLayout(), plan);
          const done = e.apply(plan);
          const c = process.cpuUsage(c0);
          samples.push({ kind, ms: Number(process.hrtime.bigint() - t0) / 1e6, cpuMs: (c.user + c.system) / 1000, writes: done.writes, calls: done.calls, mode: done.mode });
        }
      }
      // The record a burst leaves due, kept (as release() and the timer do).
      const c0 = process.cpuUsage();
      (e as unknown as { flushRecord(): void }).flushRecord();
      const c = process.cpuUsage(c0);
      records.push((c.user + c.system) / 1000);
    }
    e.detach();
  } finally {
    execFileSync('umount', [dir]);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  const kinds = [...new Set(samples.map((s) => s.kind))];
  const out = {
    when: new Date().toISOString(), kernel: os.release(), cpus: os.cpus().length, loadavg: os.loadavg().map((x) => round(x, 2)),
    config: { services: n, rounds },
    changes: Object.fromEntries(kinds.map((k) => {
      const s = samples.filter((x) => x.kind === k);
      return [k, {
        wallMs: round(median(s.map((x) => x.ms)), 3), cpuMs: round(median(s.map((x) => x.cpuMs)), 3),
        writes: [...new Set(s.map((x) => x.writes))], calls: [...new Set(s.map((x) => x.calls))], modes: [...new Set(s.map((x) => x.mode))],
      }];
    })),
    /** CPU ms of the record kept after each round's burst. */
    recordCpuMs: round(median(records), 2),
  };
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
}

if (inOwnNetns(__filename, 'lbnt', 'LB_NAT_TRANSITION_INNER')) inner();
