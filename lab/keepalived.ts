// lab/keepalived.ts: Debian's keepalived (VRRPv3) in a lab namespace, the
// peer the agent's VRRP is measured against (bench/failover.ts) and must
// interoperate with (failover-keepalived and vrrp-agent-keepalived tests):
// its config written from options, its console log, and a notify script that
// records every state it enters in a file.
import type { ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import { waitFor, type Lab } from './netns';

export interface Keepalived {
  proc: ChildProcess;
  /** keepalived's own log lines (console). */
  log(): string;
  /** Lines written by the notify script: "INSTANCE VI_lb MASTER 200". */
  notified(): string[];
  /** The last state the notify script wrote. */
  state(): string | undefined;
  stop(): Promise<void>;
}

export interface KeepalivedOptions {
  vrid: number;
  priority: number;
  advertInt: number;
  vips: string[];
  iface?: string;
  state?: 'MASTER' | 'BACKUP';
  preempt?: boolean;
  /** Blocks before the instance (vrrp_script ...), as keepalived.conf lines. */
  preamble?: string[];
  /** Lines inside the instance (track_interface, track_script ...). */
  instance?: string[];
  /** The device the VIPs go on (`dev`), when not the VRRP interface. */
  vipDev?: string;
}

/** Start Debian's keepalived (VRRPv3) in a lab namespace, with a notify script that records its states in a file. */
export async function startKeepalived(lab: Lab, ns: string, name: string, o: KeepalivedOptions): Promise<Keepalived> {
  const conf = lab.file(`${name}.conf`);
  const notifyFile = lab.file(`${name}.states`);
  const script = lab.file(`${name}-notify.sh`);
  fs.writeFileSync(script, `#!/bin/sh\necho "$1 $2 $3 $4" >> ${notifyFile}\n`, { mode: 0o755 });
  fs.writeFileSync(notifyFile, '');
  fs.writeFileSync(conf, [
    'global_defs {',
    `  router_id ${name}`,
    '  vrrp_version 3',
    '  script_user root',
    '}',
    ...(o.preamble ?? []),
    'vrrp_instance VI_lb {',
    `  state ${o.state ?? 'BACKUP'}`,
    `  interface ${o.iface ?? 'eth0'}`,
    `  virtual_router_id ${o.vrid}`,
    `  priority ${o.priority}`,
    `  advert_int ${o.advertInt}`,
    o.preempt === false ? '  nopreempt' : '',
    `  notify ${script}`,
    ...(o.instance ?? []).map((l) => `  ${l}`),
    '  virtual_ipaddress {',
    // An IPv6 address makes the instance an IPv6 one (RFC 5798 §5.1: one family per instance).
    ...o.vips.map((v) => `    ${v}/${v.includes(':') ? 64 : 24}${o.vipDev ? ` dev ${o.vipDev}` : ''}`),
    '  }',
    '}',
    '',
  ].join('\n'));
  const args = ['-n', '-l', '-D', '-f', conf, '-p', lab.file(`${name}.pid`), '-r', lab.file(`${name}-vrrp.pid`), '-c', lab.file(`${name}-check.pid`)];
  const proc = lab.spawn(ns, 'keepalived', args);
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => { out = (out + d.toString()).slice(-200_000); });
  proc.stderr?.on('data', (d: Buffer) => { out = (out + d.toString()).slice(-200_000); });
  await waitFor(`keepalived ${name} to start`, () => {
    if (proc.exitCode !== null) throw new Error(`keepalived exited ${proc.exitCode}: ${out}`);
    return /Entering (BACKUP|MASTER) STATE/.test(out);
  }, 10_000);
  const notified = (): string[] => fs.readFileSync(notifyFile, 'utf8').split('\n').filter(Boolean);
  return {
    proc,
    log: () => out,
    notified,
    state: () => notified().at(-1)?.split(' ')[2],
    stop: () => new Promise<void>((resolve) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
      const timer = setTimeout(() => { proc.kill('SIGKILL'); }, 5000);
      proc.once('exit', () => { clearTimeout(timer); resolve(); });
      proc.kill('SIGTERM');
    }),
  };
}
