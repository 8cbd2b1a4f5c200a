// lab/forward.ts owns the forwarding lab of the forward-*.test.ts tests and
// bench/forward.ts: a client, a node holding the VIP as an extra address on
// its eth0, and three backends b1..b3 (HTTP on 8080 via startBackend,
// optionally UDP echo on 5353), all on the lab bridge. The data path runs
// inside the node namespace through lab/bin/forward-driver.js; the client
// talks through lab/bin/forward-client.js; both speak JSON lines
// (JsonLinesProc). The scenarios both data paths must pass are tests:
// test/privileged/fixtures/forward-scenarios.ts.
import type { ChildProcess } from 'node:child_process';
import { createLab, waitFor, type Lab } from './netns';
import { distPath, startBackend, type Backend } from './services';
import { onJsonLines } from './jsonlines';
import type { DriverService } from './bin/forward-driver';

export const VIP = '10.99.0.50';
export const NODE = '10.99.0.10';
export const CLIENT = '10.99.0.2';
export const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'] as const;
export const IDS = ['b1', 'b2', 'b3'] as const;
export const HTTP_PORT = 80;
export const UDP_PORT = 53;
/**
 * The ephemeral port range of a host that runs peer-client: the source ports
 * its tests choose (burst, holdOpen, ask's localPort) are 30000 and up, so a
 * connection with a kernel-chosen port never holds one of them first.
 */
export const CLIENT_EPHEMERAL_PORTS: [number, number] = [20000, 29999];

/**
 * lab/bin/peer-echo.js (a backend that answers who it saw) in each namespace,
 * namespaces[i] with ids[i], on `port`; resolves once every one listens.
 */
export async function startPeerEchoes(lab: Lab, namespaces: readonly string[], ids: readonly string[], port = 80, family: 'IPv4' | 'IPv6' = 'IPv4'): Promise<ChildProcess[]> {
  const echoes = namespaces.map((ns, i) => {
    const p = lab.spawn(ns, process.execPath, [distPath('lab', 'bin', 'peer-echo.js'), '--id', ids[i]!, '--port', String(port), ...(family === 'IPv6' ? ['--ipv6'] : [])]);
    let out = '';
    p.stdout?.on('data', (d: Buffer) => { out += d.toString(); });
    return { p, up: () => out.includes('listening') };
  });
  await waitFor('echo backends', () => echoes.every((e) => e.up()), 10_000);
  return echoes.map((e) => e.p);
}

/**
 * An input chain in `ns` (table ip strict, and table ip6 strict with `ipv6`)
 * that drops, and counts, what its conntrack calls invalid: a reply to a
 * connection it never saw open, or a flow sent to a backend that never saw it
 * start, fails instead of passing unnoticed.
 */
export async function dropInvalid(lab: Lab, ns: string, o: { ipv6?: boolean } = {}): Promise<void> {
  const table = (family: string): string => `table ${family} strict {\n\tchain in {\n\t\ttype filter hook input priority 0; policy accept;\n\t\tct state invalid counter drop\n\t}\n}\n`;
  await lab.exec(ns, 'nft', ['-f', '-'], { input: table('ip') + (o.ipv6 === true ? table('ip6') : '') });
}

/** A child process speaking JSON lines: requests with ids, events kept in order. */
/** Our DSR programs attached at tcx ingress of `device` in `ns` (by the addon's bpf(2) calls, as root inside the namespace). */
export async function dsrProgramsIn(lab: Lab, ns: string, device = 'eth0'): Promise<number[]> {
  const script = `const a = require(${JSON.stringify(distPath('agent', 'net', 'ebpf', 'ebpf-attach.js'))}); const n = require(${JSON.stringify(distPath('agent', 'native', 'native.js'))});
process.stdout.write(JSON.stringify(a.attachedDsrPrograms(n.nativeBpf(), n.ifNameToIndex(${JSON.stringify(device)}))));`;
  return JSON.parse((await lab.exec(ns, process.execPath, ['-e', script])).stdout) as number[];
}

/** The eBPF NAT engine's programs attached at tcx ingress of `device` in `ns` (recognised by name, as root inside the namespace). */
export async function natProgramsIn(lab: Lab, ns: string, device = 'eth0'): Promise<number[]> {
  const script = `const n = require(${JSON.stringify(distPath('agent', 'native', 'native.js'))}); const fs = require('node:fs'); const b = n.nativeBpf();
const out = []; for (const id of b.bpfProgQuery(n.ifNameToIndex(${JSON.stringify(device)}), 46)) { const fd = b.bpfProgGetFdById(id); if (b.bpfProgInfo(fd).name === 'lb_agent_nat') out.push(id); fs.closeSync(fd); }
process.stdout.write(JSON.stringify(out));`;
  return JSON.parse((await lab.exec(ns, process.execPath, ['-e', script])).stdout) as number[];
}

/** A DSR backend set up by hand, as docs/datapaths.md "Direct server return" tells an operator without lb-agent there: the VIPs on lo, ARP kept quiet. */
export async function dsrBackendByHand(lab: Lab, ns: string, vips: readonly string[]): Promise<void> {
  // An IPv6 VIP needs no sysctl: Linux answers neighbour solicitations only for the receiving interface's addresses.
  await lab.sh(ns, `${vips.map((v) => (v.includes(':') ? `ip -6 addr add ${v}/128 dev lo preferred_lft 0` : `ip addr add ${v}/32 dev lo`)).join(' && ')} && sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2`);
}

export class JsonLinesProc {
  readonly events: Record<string, unknown>[] = [];
  stderr = '';
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();

  private constructor(readonly proc: ChildProcess, readonly name: string) {
    onJsonLines(proc.stdout!, (msg) => {
      const id = msg['id'];
      if (typeof id === 'number' && this.pending.has(id)) {
        const p = this.pending.get(id)!;
        this.pending.delete(id);
        if (msg['ok']) p.resolve(msg['result']);
        else p.reject(Object.assign(new Error(`${name}: ${JSON.stringify(msg['error'])}`), { detail: msg['error'] }));
      } else {
        this.events.push(msg);
      }
    });
    proc.stderr!.on('data', (d: Buffer) => { this.stderr = (this.stderr + d.toString()).slice(-20_000); });
    proc.on('exit', () => {
      for (const p of this.pending.values()) p.reject(new Error(`${name} exited: ${this.stderr.slice(-2000)}`));
      this.pending.clear();
    });
  }

  /** Start lab/bin/<script> in ns and wait for its "ready" event. */
  static async start(lab: Lab, ns: string, script: string, args: string[], name: string): Promise<JsonLinesProc> {
    const proc = lab.spawn(ns, process.execPath, [distPath('lab', 'bin', script), ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    const p = new JsonLinesProc(proc, name);
    await waitFor(`${name} ready`, () => {
      if (proc.exitCode !== null) throw new Error(`${name} exited: ${p.stderr}`);
      return p.events.some((e) => e['event'] === 'ready');
    }, 10_000);
    return p;
  }

  request<T = unknown>(cmd: Record<string, unknown>, timeoutMs = 30_000): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => { this.pending.delete(id); reject(new Error(`${this.name}: ${String(cmd['cmd'])} timed out`)); }, timeoutMs);
      this.pending.set(id, {
        resolve: (v) => { clearTimeout(timer); resolve(v as T); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      });
      this.proc.stdin!.write(`${JSON.stringify({ ...cmd, id })}\n`);
    });
  }

  /** End the process: closing stdin makes both fixtures exit; SIGKILL if not within 3 s. */
  async close(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise<void>((r) => this.proc.once('exit', () => r()));
    this.proc.stdin!.end();
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 3000);
    await exited;
    clearTimeout(timer);
  }
}

export interface ForwardLab {
  lab: Lab;
  node: string;
  client: string;
  backendNs: string[];
  backends: Backend[];
}

/** Build the lab; when udp is set, every backend also runs a UDP echo on 5353. */
export async function buildForwardLab(t: { teardown(fn: () => unknown): void }, opts: { udp?: boolean; backendPorts?: number[] } = {}): Promise<ForwardLab> {
  const lab = await createLab(t);
  const client = await lab.addHost('client', { address: `${CLIENT}/24` });
  const node = await lab.addHost('node', { address: `${NODE}/24`, extraAddresses: [`${VIP}/24`] });
  const backendNs: string[] = [];
  const backends: Backend[] = [];
  for (let i = 0; i < BACKENDS.length; i++) {
    const ns = await lab.addHost(IDS[i]!, { address: `${BACKENDS[i]}/24` });
    backendNs.push(ns);
    backends.push(await startBackend(lab, ns, IDS[i]!, opts.backendPorts ?? [8080]));
    if (opts.udp) {
      const p = lab.spawn(ns, process.execPath, [distPath('lab', 'bin', 'udp-echo.js'), '--id', IDS[i]!, '--port', '5353']);
      let outText = '';
      p.stdout?.on('data', (d: Buffer) => { outText += d.toString(); });
      await waitFor(`udp echo ${IDS[i]}`, () => outText.includes('listening'), 10_000);
    }
  }
  return { lab, node, client, backendNs, backends };
}

export type Weights = Partial<Record<(typeof IDS)[number], number>>;

/** The web service: HTTP 80 -> 8080 (and UDP 53 -> 5353 when udp), healthy set given as {b1: weight, ...}. */
export function webService(healthy: Weights, opts: { udp?: boolean; vip?: string | null } = {}): DriverService {
  const all = BACKENDS.map((address) => ({ address }));
  const ports: DriverService['ports'] = [{ name: 'http', port: HTTP_PORT, protocol: 'TCP', targetPort: 8080 }];
  if (opts.udp) ports.push({ name: 'dns', port: UDP_PORT, protocol: 'UDP', targetPort: 5353 });
  return {
    key: 'default/web',
    vip: opts.vip === undefined ? VIP : opts.vip,
    ports,
    healthy: IDS.flatMap((id, i) => (healthy[id] !== undefined ? [{ address: BACKENDS[i]!, weight: healthy[id] }] : [])),
    backends: all,
  };
}

export async function applyWeb(driver: JsonLinesProc, healthy: Weights, opts: { udp?: boolean } = {}): Promise<void> {
  await driver.request({ cmd: 'apply', state: { services: [webService(healthy, opts)] } });
}

export function startDriver(fl: ForwardLab, kind: 'kernel' | 'proxy', extra: string[] = []): Promise<JsonLinesProc> {
  return JsonLinesProc.start(fl.lab, fl.node, 'forward-driver.js', ['--kind', kind, ...extra], `driver(${kind})`);
}

export function startClient(fl: ForwardLab): Promise<JsonLinesProc> {
  return JsonLinesProc.start(fl.lab, fl.client, 'forward-client.js', [], 'client');
}

export interface Burst { counts: Record<string, number>; errors: Record<string, number> }

/** A peer-client asking host:port on a new connection every 20 ms until stopped (at most 1000); its failures by code. */
export function askLoop(cl: JsonLinesProc, host: string, port: number): { stop(): Promise<{ count: number; failures: Record<string, number> }> } {
  let count = 0;
  const failures: Record<string, number> = {};
  const inflight: Promise<unknown>[] = [];
  const timer = setInterval(() => {
    if (count >= 1000) return;
    count++;
    inflight.push(cl.request({ cmd: 'ask', host, port }, 5000).catch((e: unknown) => {
      const code = String((e as { code?: string }).code ?? (e as Error).message);
      failures[code] = (failures[code] ?? 0) + 1;
    }));
  }, 20);
  return { async stop() { clearInterval(timer); await Promise.all(inflight); return { count, failures }; } };
}
