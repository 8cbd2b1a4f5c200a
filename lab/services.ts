// lab/services.ts owns the real peers started inside lab namespaces: HTTP
// backends (lab/bin/backend.ts), dnsmasq as the LAN's DHCP server, and one-shot
// HTTP requests from a namespace; and distPath, the one place that knows where
// the built tree (dist/) is.
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as http from 'node:http';
import { ChildProcess } from 'node:child_process';
import { Lab, waitFor, waitListening } from './netns';

// This file runs as dist/lab/services.js: dist/ is one level up.
const DIST = path.resolve(__dirname, '..');

/** A path inside the built tree (dist/), e.g. distPath('agent', 'cli', 'main.js'). */
export function distPath(...p: string[]): string { return path.join(DIST, ...p); }

export interface Backend { proc: ChildProcess; id: string; ns: string; stop(): Promise<void> }

/** Start an HTTP backend answering with its id on the given ports inside ns (on `host`: 0.0.0.0, or :: for both families). */
export async function startBackend(lab: Lab, ns: string, id: string, ports: number[] = [8080], host?: string): Promise<Backend> {
  const args = [distPath('lab', 'bin', 'backend.js'), '--id', id];
  for (const p of ports) args.push('--port', String(p));
  if (host !== undefined) args.push('--host', host);
  const proc = lab.spawn(ns, process.execPath, args);
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => { out += d.toString(); });
  await waitFor(`backend ${id} to listen`, () => out.includes('listening'), 10_000);
  return {
    proc, id, ns,
    stop: () => new Promise<void>((resolve) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
      proc.once('exit', () => resolve());
      proc.kill('SIGKILL');
    }),
  };
}

export interface Dnsmasq { proc: ChildProcess; leaseFile: string; logFile: string; stop(): Promise<void>; leases(): DnsmasqLease[]; log(): string }
export interface DnsmasqLease { expiry: number; mac: string; ip: string; hostname: string; clientId: string }

export interface DnsmasqOptions {
  range: string;            // e.g. "10.99.0.100,10.99.0.150"
  leaseTime?: string;       // e.g. "2m", "1h"
  noPing?: boolean;         // dnsmasq pings an address before offering it unless told not to
  interface?: string;
  extra?: string[];
  name?: string;
}

/** Start dnsmasq as a DHCP server only (no DNS) in ns. */
export async function startDnsmasq(lab: Lab, ns: string, opts: DnsmasqOptions): Promise<Dnsmasq> {
  const name = opts.name ?? 'dnsmasq';
  const leaseFile = lab.file(`${name}.leases`);
  const logFile = lab.file(`${name}.log`);
  if (!fs.existsSync(leaseFile)) fs.writeFileSync(leaseFile, '');
  const args = [
    '--no-daemon', '--conf-file=/dev/null', '--port=0', `--interface=${opts.interface ?? 'eth0'}`, '--bind-interfaces',
    `--dhcp-range=${opts.range},${opts.leaseTime ?? '1h'}`, `--dhcp-leasefile=${leaseFile}`,
    '--log-dhcp', `--log-facility=${logFile}`, '--dhcp-authoritative', `--pid-file=${lab.file(`${name}.pid`)}`,
  ];
  if (opts.noPing) args.push('--no-ping');
  args.push(...(opts.extra ?? []));
  const proc = lab.spawn(ns, 'dnsmasq', args);
  let err = '';
  proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
  await waitListening(lab, ns, 67, 'dnsmasq', { proc, proto: 'udp' }).catch((e: Error) => { throw new Error(`${e.message}: ${err}`); });
  const leases = (): DnsmasqLease[] => fs.readFileSync(leaseFile, 'utf8').split('\n').filter(Boolean).map((l) => {
    const [expiry, mac, ip, hostname, clientId] = l.split(' ');
    return { expiry: Number(expiry), mac: mac!, ip: ip!, hostname: hostname!, clientId: clientId! };
  });
  return {
    proc, leaseFile, logFile, leases,
    log: () => (fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8') : ''),
    stop: () => new Promise<void>((resolve) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
      proc.once('exit', () => resolve());
      proc.kill('SIGTERM');
    }),
  };
}

/** One HTTP GET from inside ns (via a node one-shot), returning the body or the error. */
export async function httpGetFrom(lab: Lab, ns: string, url: string, timeoutMs = 3000): Promise<{ ok: boolean; body: string; error?: string }> {
  const script = `${getOneScript(timeoutMs)}one(${JSON.stringify(url)}).then((r)=>process.stdout.write(JSON.stringify(r)));`;
  const res = await lab.exec(ns, process.execPath, ['-e', script], { allowFail: true, timeoutMs: timeoutMs + 5000 });
  try { return JSON.parse(res.stdout) as { ok: boolean; body: string; error?: string }; } catch { return { ok: false, body: '', error: res.stderr || 'no output' }; }
}

/** The node one-shot's `one(url)`: a GET on a new connection, resolving to the body or the error. */
function getOneScript(timeoutMs: number): string {
  return `const h=require('http');const one=(u)=>new Promise((res)=>{const r=h.get(u,{agent:false,timeout:${timeoutMs}},(s)=>{let b='';s.on('data',d=>b+=d);s.on('end',()=>res({ok:true,body:b}))});r.on('timeout',()=>{r.destroy(new Error('timeout'))});r.on('error',e=>res({ok:false,body:'',error:e.code||e.message}))});`;
}

/**
 * n HTTP GETs in sequence from inside ns, each on a new connection, from one
 * node process (a process per request costs more than the requests on a
 * loaded machine): the body or the error of each.
 */
export async function httpGetManyFrom(lab: Lab, ns: string, url: string, n: number, timeoutMs = 3000): Promise<{ ok: boolean; body: string; error?: string }[]> {
  const script = `${getOneScript(timeoutMs)}const out=[];(async()=>{for(let i=0;i<${Math.max(0, Math.min(10_000, n))};i++)out.push(await one(${JSON.stringify(url)}));process.stdout.write(JSON.stringify(out))})();`;
  const res = await lab.exec(ns, process.execPath, ['-e', script], { allowFail: true, timeoutMs: n * timeoutMs + 5000 });
  try { return JSON.parse(res.stdout) as { ok: boolean; body: string; error?: string }[]; } catch { return [{ ok: false, body: '', error: res.stderr || 'no output' }]; }
}

/** A GET of each URL in turn from inside ns, from one node process (as httpGetManyFrom): the body or the error of each, in order. */
export async function httpGetEachFrom(lab: Lab, ns: string, urls: readonly string[], timeoutMs = 3000): Promise<{ ok: boolean; body: string; error?: string }[]> {
  const script = `${getOneScript(timeoutMs)}const out=[];(async()=>{for(const u of ${JSON.stringify(urls)})out.push(await one(u));process.stdout.write(JSON.stringify(out))})();`;
  const res = await lab.exec(ns, process.execPath, ['-e', script], { allowFail: true, timeoutMs: urls.length * timeoutMs + 5000 });
  try { return JSON.parse(res.stdout) as { ok: boolean; body: string; error?: string }[]; } catch { return urls.map(() => ({ ok: false, body: '', error: res.stderr || 'no output' })); }
}

/** HTTP GET from this process (loopback only). */
export function httpGetLocal(url: string, timeoutMs = 3000): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { timeout: timeoutMs }, (res) => {
      let b = '';
      res.on('data', (d: Buffer) => { b += d.toString(); });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: b }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}
