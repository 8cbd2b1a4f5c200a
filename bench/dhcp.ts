// Bench area "dhcp": start to bound, for one service and for 50 at once,
// lb-agent against busybox udhcpc and ISC dhclient, with dnsmasq's ping check
// on and off. Every run gets a fresh dnsmasq (empty lease file, no ping
// cache) and fresh client MACs (new macvlans for the peers, new service
// names and an empty state dir for the agent), so no run inherits a lease.
// The peers run on their own macvlans (bridge mode) in the same node
// namespace as the agent. Times:
//   peers      spawn -> the lease is obtained (udhcpc -q exits; dhclient -d
//              prints "bound to")
//   lb-agent   spawn of `lb-agent run` -> the "VIP bound" log line of each
//              service (process start included), and the agent's own
//              lbagent_dhcp_acquire_duration_seconds (first DISCOVER to
//              bound), scraped from /metrics
//   wire       every client: its first DISCOVER to its ACK, stamped by
//              tcpdump in the server's namespace (process start-up and what
//              a client does after the ACK left out: equal terms)
// DHCPv6 (a lab of its own, IPv6 on, dnsmasq with a DHCPv6 range and
// enable-ra): one IPv6-only DHCP service of lb-agent against ISC
// `dhclient -6` on its own macvlan, spawn to bound, side by side in each
// round, reported as the ratio of the medians. Each clock starts before
// the client's link exists: dhclient -6's includes `ip link add` of its
// macvlan, as lb-agent's includes the agent creating its own. The lab's
// namespaces run no DAD of link-local addresses (lab/netns.ts: accept_dad
// 0), so neither waits for its link-local here. dhclient -6 waits the
// random SOL_MAX_DELAY (0..1 s, RFC 8415 §18.2.1) before its first
// SOLICIT; lb-agent sends it at once (client6.ts SOLICIT_DELAY_MS). Each
// run also gives start -> first SOLICIT (dhclient -6: its "XMT: Solicit"
// line; lb-agent: start -> bound less its own SOLICIT -> bound,
// lbagent_dhcp6_acquire_duration_seconds), which splits the start from
// the exchange. dnsmasq answers a SOLICIT whose sender is not in its
// neighbour table 100 ms late (get_client_mac: a neighbour solicitation,
// then a 100 ms sleep): dhclient -6's macvlan sends a router solicitation
// as it comes up (accept_ra 1), dnsmasq's RA to it resolves its
// link-local first; lb-agent's macvlan takes no RAs and sends none.
// lb-agent also runs duplicate address detection of the leased address
// (RFC 4862, one probe and RetransTimer 1 s) before binding, which
// dhclient -6 leaves to the kernel after its script, so it runs twice:
// with its defaults and without DAD (arp.probeNum: 0).
// lb-agent runs twice: with its defaults (RFC 2131 §4.4.1 start jitter and an
// RFC 5227 ARP probe of the offered address before binding, as docs/design.md asks)
// and like for like with the peers, which do neither (dhcp.probeOffer: false,
// dhcp.retransmitJitter: 0).
import * as fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import { Lab, waitFor } from '../lab/netns';
import { startDnsmasq } from '../lab/services';
import { runAgent, stopAgent, logTime, scrapeMetrics, histogramTotals } from './lib/agent';
import { startWireCapture } from './lib/dhcpwire';
import { median, max, round, rotate } from './lib/stats';
import { threadsCpuMs } from './lib/procfs';

export const DHCP_CLIENTS = ['udhcpc', 'dhclient', 'lbagent', 'lbagent-like'] as const;
export type DhcpClient = (typeof DHCP_CLIENTS)[number];

export const DHCP_LABELS: Record<DhcpClient, string> = {
  udhcpc: 'busybox udhcpc',
  dhclient: 'ISC dhclient',
  lbagent: 'lb-agent, defaults (start jitter + ARP probe)',
  'lbagent-like': 'lb-agent, like the peers (no jitter, no ARP probe)',
};

export interface DhcpOptions {
  rounds: number;
  /** Service counts to measure, e.g. [1, 50]. */
  counts: number[];
  clients: DhcpClient[];
  /** Clients for counts above 1 (default: clients). */
  manyClients?: DhcpClient[];
  /** dnsmasq ping check: [false, true] measures both. */
  ping: boolean[];
  /**
   * Rounds of the many-at-once runs with the ping check on, and their clients:
   * dnsmasq pings one candidate address at a time and waits up to 3 s for each,
   * so 50 at once take minutes, whoever the client is (0 skips them).
   */
  manyPingRounds: number;
  manyPingClients?: DhcpClient[];
  /**
   * Issue 18's like-for-like target is judged pair by pair: lb-agent like the
   * peers, one service and then the many, ping off, measured in the same
   * round. Each round gives one pair; up to this many pairs in all, the rest
   * run back to back after the rounds (one service and the many, the order
   * alternating), so the verdict rests on more than the rounds' three.
   */
  likePairs?: number;
  log: (msg: string) => void;
}

export interface DhcpRun {
  round: number; client: DhcpClient; count: number; ping: boolean;
  /** Per client or service: spawn -> bound, ms (NaN: not bound in time). */
  boundMs: number[];
  /** All bound: the first spawn -> the last bound, ms. */
  allMs: number;
  bound: number;
  /** Per client that completed it: first DISCOVER -> ACK on the wire, ms. */
  wireMs: number[];
  /**
   * lb-agent only: mean first DISCOVER -> bound from its histogram, and spawn
   * -> the first "DHCP client starting" line, logged just before the first
   * DISCOVER (Node start, config, netlink, and with the defaults the random
   * start delay).
   */
  acquireMeanMs?: number;
  processStartMs?: number;
  /**
   * CPU time (ms, on a CPU per the scheduler) over the run: lb-agent's
   * process from its spawn until the bench has seen its last bind (the
   * logs are polled every 20 ms); dnsmasq's from before the clients
   * started to the end of the run. Both share the machine's two cores with the clients: what
   * the server spends is CPU a client start waits for here and would not on
   * a LAN.
   */
  agentCpuMs?: number;
  serverCpuMs?: number;
  error?: string;
  /** A run of the extra like-for-like pairs (DhcpOptions.likePairs): in the paired ratio, not in the tables. */
  extra?: boolean;
}

export interface DhcpSummaryRow {
  label: string; client: DhcpClient; count: number; ping: boolean;
  /** Median over rounds of the per-round median time to bound. */
  medianMs: number;
  /** Median over rounds of the time until all `count` were bound. */
  allMs: number;
  /** Median over rounds of the per-round median DISCOVER -> ACK on the wire. */
  wireMs: number;
  acquireMeanMs?: number;
  processStartMs?: number;
  /** Medians over rounds of DhcpRun.agentCpuMs and serverCpuMs. */
  agentCpuMs?: number;
  serverCpuMs?: number;
  runs: number; failures: number;
}

export interface DhcpResult { config: Omit<DhcpOptions, 'log'> & { dnsmasq: string }; summary: DhcpSummaryRow[]; raw: DhcpRun[] }

const SERVER = '10.99.0.1';
const NODE = '10.99.0.2';
const RANGE = '10.99.0.100,10.99.0.250';
const TIMEOUT_MS = 90_000;

function randomMac(): string {
  const b = randomBytes(5);
  return ['02', ...[...b].map((x) => x.toString(16).padStart(2, '0'))].join(':');
}

async function addMacvlans(lab: Lab, ns: string, n: number, prefix: string): Promise<string[]> {
  const names = Array.from({ length: n }, (_, i) => `${prefix}${i}`);
  const script = names.map((name) => `ip link add ${name} link eth0 type macvlan mode bridge && ip link set ${name} address ${randomMac()} && ip link set ${name} up`).join(' && ');
  await lab.sh(ns, script, { timeoutMs: 60_000 });
  return names;
}

async function delMacvlans(lab: Lab, ns: string, names: string[]): Promise<void> {
  if (names.length) await lab.sh(ns, names.map((n) => `ip link del ${n}`).join('; '), { allowFail: true, timeoutMs: 60_000 });
}

function waitExit(p: ChildProcess, timeoutMs: number): Promise<{ code: number | null; at: number }> {
  return new Promise((resolve) => {
    if (p.exitCode !== null || p.signalCode !== null) return resolve({ code: p.exitCode, at: Date.now() });
    const timer = setTimeout(() => { p.kill('SIGKILL'); resolve({ code: null, at: NaN }); }, timeoutMs);
    p.once('exit', (code) => { clearTimeout(timer); resolve({ code, at: Date.now() }); });
  });
}

type ClientResult = Omit<DhcpRun, 'round' | 'client' | 'count' | 'ping' | 'wireMs'>;

async function runUdhcpc(lab: Lab, node: string, n: number, tag: string): Promise<ClientResult> {
  const ifs = await addMacvlans(lab, node, n, `bu${tag}x`);
  try {
    const starts: number[] = [];
    const procs: ChildProcess[] = [];
    const outs: string[] = [];
    for (const [i, ifname] of ifs.entries()) {
      starts.push(Date.now());
      // -f foreground, -q quit once bound, -n exit when no lease; -s: the
      // lease is not applied (dhclient below gets /bin/true too).
      const p = lab.spawn(node, 'busybox', ['udhcpc', '-i', ifname, '-n', '-q', '-f', '-s', '/bin/true']);
      outs.push('');
      p.stdout?.on('data', (d: Buffer) => { outs[i] += d.toString(); });
      p.stderr?.on('data', (d: Buffer) => { outs[i] += d.toString(); });
      procs.push(p);
    }
    const ends = await Promise.all(procs.map((p) => waitExit(p, TIMEOUT_MS)));
    const boundMs = ends.map((e, i) => (e.code === 0 && /lease of \S+ obtained/.test(outs[i]!) ? e.at - starts[i]! : NaN));
    const bound = boundMs.filter(Number.isFinite).length;
    return { boundMs, allMs: bound === n ? max(ends.map((e) => e.at)) - starts[0]! : NaN, bound, error: bound === n ? undefined : outs.find((_, i) => !Number.isFinite(boundMs[i]!))?.slice(-300) };
  } finally {
    await delMacvlans(lab, node, ifs);
  }
}

async function runDhclient(lab: Lab, node: string, n: number, tag: string): Promise<ClientResult> {
  const ifs = await addMacvlans(lab, node, n, `bd${tag}x`);
  const procs: ChildProcess[] = [];
  try {
    const starts: number[] = [];
    const boundAt: number[] = ifs.map(() => NaN);
    const outs: string[] = ifs.map(() => '');
    for (const [i, ifname] of ifs.entries()) {
      starts.push(Date.now());
      // -1 one try, -d foreground (prints the exchange on stderr and keeps
      // running), own lease and pid files so no earlier lease is reused.
      const p = lab.spawn(node, 'dhclient', ['-1', '-d', '-sf', '/bin/true', '-lf', lab.file(`dhclient-${tag}-${i}.leases`), '-pf', lab.file(`dhclient-${tag}-${i}.pid`), ifname]);
      const feed = (d: Buffer): void => {
        outs[i] += d.toString();
        if (Number.isNaN(boundAt[i]!) && /bound to \S+/.test(outs[i]!)) boundAt[i] = Date.now();
      };
      p.stdout?.on('data', feed);
      p.stderr?.on('data', feed);
      procs.push(p);
    }
    await waitFor('dhclients to bind', () => boundAt.every((b, i) => Number.isFinite(b) || procs[i]!.exitCode !== null) || undefined, TIMEOUT_MS, 20).catch(() => undefined);
    const boundMs = boundAt.map((b, i) => b - starts[i]!);
    const bound = boundMs.filter(Number.isFinite).length;
    return { boundMs, allMs: bound === n ? max(boundAt) - starts[0]! : NaN, bound, error: bound === n ? undefined : outs.find((_, i) => !Number.isFinite(boundMs[i]!))?.slice(-300) };
  } finally {
    for (const p of procs) { try { p.kill('SIGKILL'); } catch { /* gone */ } }
    await Promise.all(procs.map((p) => waitExit(p, 3000)));
    await delMacvlans(lab, node, ifs);
  }
}

async function runLbAgent(lab: Lab, node: string, n: number, tag: string, like: boolean): Promise<ClientResult> {
  const names = Array.from({ length: n }, (_, i) => `d${tag}x${i}`);
  const stateDir = lab.file(`dhcp-state-${tag}`);
  const listen = '127.0.0.1:9477';
  const cfg = {
    node: { name: 'bench', interface: 'eth0' },
    metrics: { listen },
    ...(like ? { dhcp: { probeOffer: false, retransmitJitter: 0 } } : {}),
    services: names.map((name) => ({ name, ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: [] })),
  };
  const t0 = Date.now();
  const agent = await runAgent(lab, node, cfg, { name: `dhcp-${tag}`, waitReady: false, stateDir });
  try {
    const binds = (): Record<string, unknown>[] => agent.logs.filter((l) => l.op === 'bind' && typeof l.service === 'string');
    await waitFor(`${n} DHCP services bound`, () => {
      // An agent that exited will bind nothing more: stop waiting (the error says why).
      if (agent.proc.exitCode !== null) return true;
      return new Set(binds().map((l) => l.service)).size >= n || undefined;
    }, TIMEOUT_MS, 20).catch(() => undefined);
    // Before the scrape below, which is CPU of the agent's too.
    const agentCpuMs = threadsCpuMs(agent.proc.pid);
    const first = new Map<string, number>();
    for (const l of binds()) if (!first.has(l.service as string)) first.set(l.service as string, logTime(l));
    const boundMs = names.map((name) => (first.get(`default/${name}`) ?? NaN) - t0);
    const bound = boundMs.filter(Number.isFinite).length;
    const starting = agent.logs.find((l) => l.msg === 'DHCP client starting');
    let acquireMeanMs: number | undefined;
    try {
      const h = histogramTotals(await scrapeMetrics(lab, node, listen), 'lbagent_dhcp_acquire_duration_seconds');
      acquireMeanMs = h.count > 0 ? (h.sum / h.count) * 1000 : undefined;
    } catch { /* reported as missing */ }
    return {
      boundMs, bound,
      allMs: bound === n ? max(boundMs) : NaN,
      acquireMeanMs,
      processStartMs: starting ? logTime(starting) - t0 : undefined,
      agentCpuMs: Number.isFinite(agentCpuMs) ? agentCpuMs : undefined,
      error: bound === n ? undefined : `${bound}/${n} bound; ${agent.logs.filter((l) => l.level === 'fatal' || l.level === 'error').map((l) => String(l.msg)).join('; ').slice(0, 400)} ${agent.stderr().slice(-300)}`,
    };
  } finally {
    await stopAgent(agent);
    fs.rmSync(stateDir, { recursive: true, force: true });
  }
}

export const DHCP6_CLIENTS = ['dhclient6', 'lbagent6', 'lbagent6-nodad'] as const;
export type Dhcp6Client = (typeof DHCP6_CLIENTS)[number];
export const DHCP6_LABELS: Record<Dhcp6Client, string> = {
  dhclient6: 'ISC dhclient -6',
  lbagent6: 'lb-agent DHCPv6, defaults (optimistic DAD of the lease)',
  'lbagent6-nodad': 'lb-agent DHCPv6, no DAD (arp.probeNum: 0)',
};

/** boundMs: start -> bound; solicitMs: start -> the first SOLICIT; acquireMs: lb-agent's SOLICIT -> bound. */
export interface Dhcp6Run { round: number; client: Dhcp6Client; boundMs: number; solicitMs?: number; acquireMs?: number; error?: string }
export interface Dhcp6SummaryRow { label: string; client: Dhcp6Client; medianMs: number; solicitMs?: number; acquireMs?: number; ratioToDhclient: number; runs: number; failures: number }
export interface Dhcp6Result { config: { rounds: number; dnsmasq: string }; summary: Dhcp6SummaryRow[]; raw: Dhcp6Run[] }

const RANGE6 = 'fd00:99::100,fd00:99::1ff,64,1h';

async function runDhclient6(lab: Lab, node: string, tag: string): Promise<{ boundMs: number; solicitMs?: number } | string> {
  const t0 = Date.now();
  const [ifname] = await addMacvlans(lab, node, 1, `b6${tag}x`);
  // -6 -1 one try, -d foreground, /bin/true as its script: the lease is not applied, as for the IPv4 peers.
  const p = lab.spawn(node, 'dhclient', ['-6', '-1', '-d', '-sf', '/bin/true', '-lf', lab.file(`dhclient6-${tag}.leases`), '-pf', lab.file(`dhclient6-${tag}.pid`), ifname!]);
  let out = '';
  let boundAt = NaN;
  let solicitAt = NaN;
  const feed = (d: Buffer): void => {
    out += d.toString();
    if (Number.isNaN(solicitAt) && /XMT: Solicit on/.test(out)) solicitAt = Date.now();
    if (Number.isNaN(boundAt) && /Bound to lease/i.test(out)) boundAt = Date.now();
  };
  p.stdout?.on('data', feed);
  p.stderr?.on('data', feed);
  try {
    await waitFor('dhclient -6 to bind', () => Number.isFinite(boundAt) || p.exitCode !== null || undefined, 30_000, 10).catch(() => undefined);
    return Number.isFinite(boundAt) ? { boundMs: boundAt - t0, ...(Number.isFinite(solicitAt) ? { solicitMs: solicitAt - t0 } : {}) } : out.slice(-300);
  } finally {
    try { p.kill('SIGKILL'); } catch { /* gone */ }
    await waitExit(p, 3000);
    await delMacvlans(lab, node, [ifname!]);
  }
}

async function runLbAgent6(lab: Lab, node: string, tag: string, dad: boolean): Promise<{ boundMs: number; solicitMs?: number; acquireMs?: number; error?: string }> {
  const stateDir = lab.file(`dhcp6-state-${tag}`);
  const listen = '127.0.0.1:9477';
  const cfg = {
    node: { name: 'bench', interface: 'eth0' },
    metrics: { listen },
    dataplane: 'kernel',
    ...(dad ? {} : { arp: { probeNum: 0 } }),
    services: [{ name: `s6${tag}`, ipam: 'dhcp', ipFamilies: ['IPv6'], ports: [{ port: 80, targetPort: 8080 }], backends: [] }],
  };
  const t0 = Date.now();
  const agent = await runAgent(lab, node, cfg, { name: `dhcp6-${tag}`, waitReady: false, stateDir });
  try {
    const bind = await waitFor('the DHCPv6 VIP bound', () => (agent.proc.exitCode !== null ? { exited: true } : agent.logs.find((l) => l.module === 'dhcp6' && l.op === 'bind')), 30_000, 10).catch(() => undefined);
    if (!bind || 'exited' in bind) return { boundMs: NaN, error: `not bound; ${agent.stderr().slice(-300)}` };
    let acquireMs: number | undefined;
    try {
      const h = histogramTotals(await scrapeMetrics(lab, node, listen), 'lbagent_dhcp6_acquire_duration_seconds');
      acquireMs = h.count > 0 ? (h.sum / h.count) * 1000 : undefined;
    } catch { /* reported as missing */ }
    const boundMs = logTime(bind) - t0;
    return { boundMs, ...(acquireMs !== undefined ? { solicitMs: boundMs - acquireMs, acquireMs } : {}) };
  } finally {
    await stopAgent(agent);
    fs.rmSync(stateDir, { recursive: true, force: true });
  }
}

/** DHCPv6 start to bound: lb-agent against dhclient -6, each round all three in rotated order, a fresh dnsmasq each run. */
export async function benchDhcp6(o: { rounds: number; log: (msg: string) => void }): Promise<Dhcp6Result> {
  const lab = await Lab.create();
  const raw: Dhcp6Run[] = [];
  try {
    const server = await lab.addHost('dhcp', { address: `${SERVER}/24`, ipv6: ['fd00:99::1/64'] });
    const node = await lab.addHost('node', { address: `${NODE}/24`, ipv6: ['fd00:99::2/64'] });
    let seq = 0;
    for (let round = 0; round < o.rounds; round++) {
      for (const client of rotate([...DHCP6_CLIENTS], round)) {
        const tag = (seq++).toString(36);
        const dns = await startDnsmasq(lab, server, { range: RANGE, noPing: true, name: `dnsmasq6-${tag}`, extra: [`--dhcp-range=${RANGE6}`, '--enable-ra'] });
        let run: Dhcp6Run;
        try {
          if (client === 'dhclient6') {
            const r = await runDhclient6(lab, node, tag);
            run = typeof r === 'string' ? { round, client, boundMs: NaN, error: r } : { round, client, ...r };
          } else {
            run = { round, client, ...(await runLbAgent6(lab, node, tag, client === 'lbagent6')) };
          }
        } catch (e) {
          run = { round, client, boundMs: NaN, error: String((e as Error).message ?? e).slice(0, 300) };
        } finally {
          await dns.stop();
        }
        raw.push(run);
        o.log(`dhcpv6 round ${round + 1}/${o.rounds} ${client.padEnd(15)} ${run.boundMs.toFixed(0).padStart(5)} ms${run.solicitMs !== undefined ? `  start->SOLICIT ${run.solicitMs.toFixed(0)} ms` : ''}${run.acquireMs !== undefined ? `  SOLICIT->bound ${run.acquireMs.toFixed(0)} ms` : ''}${run.error ? `  error: ${run.error.slice(0, 160)}` : ''}`);
      }
    }
    const med = (c: Dhcp6Client): number => median(raw.filter((r) => r.client === c && Number.isFinite(r.boundMs)).map((r) => r.boundMs));
    const base = med('dhclient6');
    const summary = DHCP6_CLIENTS.map((client): Dhcp6SummaryRow => {
      const rs = raw.filter((r) => r.client === client);
      const acq = rs.map((r) => r.acquireMs).filter((x): x is number => x !== undefined);
      const sol = rs.map((r) => r.solicitMs).filter((x): x is number => x !== undefined);
      return {
        label: DHCP6_LABELS[client], client, medianMs: round(med(client), 0),
        ...(sol.length ? { solicitMs: round(median(sol), 0) } : {}),
        ...(acq.length ? { acquireMs: round(median(acq), 0) } : {}),
        ratioToDhclient: round(med(client) / base, 2), runs: rs.length, failures: rs.filter((r) => !Number.isFinite(r.boundMs)).length,
      };
    });
    return { config: { rounds: o.rounds, dnsmasq: `dnsmasq --dhcp-range=${RANGE6} --enable-ra, fresh per run` }, summary, raw };
  } finally {
    await lab.destroy();
  }
}

export async function benchDhcp(o: DhcpOptions): Promise<DhcpResult> {
  const lab = await Lab.create();
  const raw: DhcpRun[] = [];
  try {
    const server = await lab.addHost('dhcp', { address: `${SERVER}/24` });
    const node = await lab.addHost('node', { address: `${NODE}/24` });
    let seq = 0;
    const measure = async (round: number, client: DhcpClient, count: number, ping: boolean, extra: boolean): Promise<void> => {
      const tag = `${(seq++).toString(36)}`;
      const dns = await startDnsmasq(lab, server, { range: RANGE, leaseTime: '1h', noPing: !ping, name: `dnsmasq-${tag}` });
      const wire = await startWireCapture(lab, server, lab.file(`wire-${tag}.pcap`));
      let res: ClientResult;
      let wireMs: number[] = [];
      let serverCpuMs: number | undefined;
      const server0 = threadsCpuMs(dns.proc.pid);
      try {
        if (client === 'udhcpc') res = await runUdhcpc(lab, node, count, tag);
        else if (client === 'dhclient') res = await runDhclient(lab, node, count, tag);
        else res = await runLbAgent(lab, node, count, tag, client === 'lbagent-like');
      } catch (e) {
        res = { boundMs: [], allMs: NaN, bound: 0, error: String((e as Error).message ?? e).slice(0, 500) };
      } finally {
        const server1 = threadsCpuMs(dns.proc.pid);
        if (Number.isFinite(server1 - server0)) serverCpuMs = server1 - server0;
        wireMs = [...(await wire.stop()).values()];
        await dns.stop();
      }
      const run: DhcpRun = { round, client, count, ping, ...res, wireMs, ...(serverCpuMs !== undefined ? { serverCpuMs } : {}), ...(extra ? { extra } : {}) };
      raw.push(run);
      o.log(`${extra ? `like-for-like pair ${round + 1}/${o.likePairs}` : `round ${round + 1}/${o.rounds}`} ${String(count).padStart(2)} x ${client.padEnd(12)} ping ${ping ? 'on ' : 'off'}  median ${median(res.boundMs).toFixed(0).padStart(5)} ms  all ${res.allMs.toFixed(0).padStart(5)} ms  wire ${median(wireMs).toFixed(0).padStart(5)} ms  ${res.bound}/${count} bound${res.acquireMeanMs !== undefined ? `  DISCOVER->bound ${res.acquireMeanMs.toFixed(0)} ms` : ''}${res.error ? `  error: ${res.error.slice(0, 160)}` : ''}`);
    };
    for (let round = 0; round < o.rounds; round++) {
      for (const count of o.counts) {
        for (const ping of o.ping) {
          if (ping && count > 1 && round >= o.manyPingRounds) continue;
          const clients = count === 1 ? o.clients : ping ? (o.manyPingClients ?? o.manyClients ?? o.clients) : (o.manyClients ?? o.clients);
          for (const client of rotate(clients, round)) await measure(round, client, count, ping, false);
        }
      }
    }
    const many = o.counts.find((c) => c > 1);
    if (many !== undefined && o.counts.includes(1) && o.ping.includes(false) && o.clients.includes('lbagent-like') && (o.manyClients ?? o.clients).includes('lbagent-like')) {
      for (let round = o.rounds; round < (o.likePairs ?? 0); round++) {
        for (const count of round % 2 ? [many, 1] : [1, many]) await measure(round, 'lbagent-like', count, false, true);
      }
    }
    const summary: DhcpSummaryRow[] = [];
    for (const count of o.counts) {
      for (const ping of o.ping) {
        for (const client of o.clients) {
          const rs = raw.filter((r) => !r.extra && r.client === client && r.count === count && r.ping === ping);
          if (rs.length === 0) continue;
          const ok = rs.filter((r) => r.bound === count);
          const opt = (xs: (number | undefined)[]): number | undefined => (xs.some((x) => x !== undefined) ? round(median(xs.map((x) => x ?? NaN)), 0) : undefined);
          summary.push({
            label: DHCP_LABELS[client], client, count, ping,
            medianMs: round(median(ok.map((r) => median(r.boundMs))), 0),
            allMs: round(median(ok.map((r) => r.allMs)), 0),
            wireMs: round(median(ok.map((r) => median(r.wireMs))), 0),
            acquireMeanMs: opt(ok.map((r) => r.acquireMeanMs)),
            processStartMs: opt(ok.map((r) => r.processStartMs)),
            agentCpuMs: opt(ok.map((r) => r.agentCpuMs)),
            serverCpuMs: opt(ok.map((r) => r.serverCpuMs)),
            runs: rs.length, failures: rs.length - ok.length,
          });
        }
      }
    }
    return { config: { rounds: o.rounds, likePairs: o.likePairs, counts: o.counts, clients: o.clients, manyClients: o.manyClients, ping: o.ping, manyPingRounds: o.manyPingRounds, manyPingClients: o.manyPingClients, dnsmasq: `dnsmasq --dhcp-range=${RANGE},1h --dhcp-authoritative [--no-ping], fresh per run` }, summary, raw };
  } finally {
    await lab.destroy();
  }
}
