// Bench: how long `lb-agent check` takes without the DHCP probe (the issue
// asks for under a second). Times runCheck in this process (the first run
// pays module loading and schema compilation), then whole fresh processes
// running `lb-agent check --json`, the way cloud-init runs it. Prints JSON; asserts
// nothing.
//   node dist/bench/preflight.js [--runs N] [--config PATH]
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { AGENT_BIN } from '../lab/agent';
import { defaultRouteInterface } from '../agent/net/host/route';
import { max, median, min, round } from './lib/stats';

const CONFIG = `node: { interface: IFACE }
stateDir: STATE
pools:
  range-global: 10.99.0.200-10.99.0.220
services:
  - { name: web, ipam: dhcp, ports: [{ port: 80, targetPort: 8080 }], backends: [10.99.0.11, 10.99.0.12] }
  - { name: api, ports: [{ port: 443, targetPort: 8443 }], backends: [10.99.0.11] }
`;

function stats(ms: number[]): { runs: number; minMs: number; medianMs: number; maxMs: number } {
  return { runs: ms.length, minMs: round(min(ms), 1), medianMs: round(median(ms), 1), maxMs: round(max(ms), 1) };
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  let runs = 10;
  let config: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--runs') runs = Math.max(1, Math.min(1000, Number(argv[++i]) || 10));
    else if (argv[i] === '--config') config = argv[++i];
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbchk-bench-'));
  try {
    if (!config) {
      config = path.join(dir, 'config.yaml');
      fs.writeFileSync(config, CONFIG.replace('IFACE', defaultRouteInterface() ?? 'eth0').replace('STATE', path.join(dir, 'state')));
    }
    const t0 = performance.now();
    const { runCheck } = await import('../agent/preflight');
    const importMs = performance.now() - t0;

    const inProcess: number[] = [];
    let lastCode = -1;
    for (let i = 0; i < runs; i++) {
      const s = performance.now();
      lastCode = await runCheck({ configPath: config, json: true, strict: false, dhcpProbe: false, stdout: () => undefined });
      inProcess.push(performance.now() - s);
    }

    // A fresh node process per run: what `lb-agent check` costs from cloud-init.
    const fresh: number[] = [];
    for (let i = 0; i < runs; i++) {
      const s = performance.now();
      await new Promise<void>((resolve) => {
        execFile(process.execPath, [AGENT_BIN, 'check', '--config', config!, '--json'], { timeout: 30_000 }, () => resolve());
      });
      fresh.push(performance.now() - s);
    }

    process.stdout.write(`${JSON.stringify({
      bench: 'preflight',
      note: 'lb-agent check without --dhcp-probe; target < 1000 ms',
      cpus: os.cpus().length,
      kernel: os.release(),
      exitCode: lastCode,
      importMs: Math.round(importMs * 10) / 10,
      firstRunMs: Math.round(inProcess[0]! * 10) / 10,
      inProcess: stats(inProcess),
      freshProcess: stats(fresh),
    }, null, 2)}\n`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e: unknown) => { process.stderr.write(`bench/preflight: ${String(e)}\n`); process.exitCode = 1; });
