// Privileged: many pool VIPs through the real agent cost what a few do. The
// agent holds one ARP socket for the parent whatever the number of VIPs on
// it (net/neighbour/neighbour-sockets.ts), so its descriptors do not grow
// per VIP; a start reads the parent once for the pool sources that ask
// together (ipam/parent-reads.ts), not once per service; a start writes the
// claims file once per batch of claims (ipam/claims.ts setSoon), every
// claim of them on disk; and a stop
// withdraws every VIP in a few netlink batches, not a round trip each
// (net/netlink/address-removals.ts), leaving no address behind. Counted,
// not timed: /proc/PID/fd and the netlink requests the agent's "settled"
// and last log lines report.
import * as fs from 'node:fs';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { startAgent, waitStatus, type AgentHandle } from '../../lab/agent';
import type { NetlinkCounts } from '../../agent/net/netlink/netlink';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const FEW = 4;
const MANY = 200;

function config(n: number): Record<string, unknown> {
  return {
    node: { interface: 'eth0' },
    metrics: { listen: '' },
    arp: FAST_ARP,
    pools: { 'range-global': '10.99.1.1-10.99.1.250' },
    services: Array.from({ length: n }, (_, i) => ({
      name: `s${i}`, ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: { enabled: false },
    })),
  };
}

/** Descriptors of the agent and, of them, packet sockets (inodes in its namespace's /proc/net/packet). The least of a few samples: a descriptor open for a moment (a pipe to nft) is not the agent's to keep. */
async function descriptors(pid: number): Promise<{ total: number; packet: number }> {
  let best = { total: Infinity, packet: Infinity };
  for (let i = 0; i < 5; i++) {
    const inodes = new Set(fs.readFileSync(`/proc/${pid}/net/packet`, 'utf8').trim().split('\n').slice(1).map((l) => l.trim().split(/\s+/)[8]));
    const fds = fs.readdirSync(`/proc/${pid}/fd`);
    let packet = 0;
    for (const fd of fds) {
      try { if (inodes.has(/^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1])) packet++; } catch { /* closed meanwhile */ }
    }
    if (fds.length < best.total) best = { total: fds.length, packet };
    await new Promise((r) => setTimeout(r, 200));
  }
  return best;
}

async function poolAddresses(lab: Lab, ns: string): Promise<string[]> {
  const r = await lab.exec(ns, 'ip', ['-4', '-o', 'addr', 'show', 'dev', 'eth0']);
  return [...r.stdout.matchAll(/inet (10\.99\.1\.\d+)\/32/g)].map((m) => m[1]!);
}

interface Run { fds: { total: number; packet: number }; netlink: NetlinkCounts; start: NetlinkCounts; left: string[]; reachable: boolean; claims: number }

async function runWith(lab: Lab, node: string, client: string, n: number): Promise<Run> {
  const agent: AgentHandle = await startAgent(lab, node, config(n), { name: `a${n}`, logLevel: 'info' });
  try {
    const st = await waitStatus(agent, `${n} pool VIPs bound`, (s) => s.services.length === n && s.services.every((x) => x.vip !== undefined && x.ready), 60_000);
    const settled = await agent.waitLog('the settled line', (l) => l.op === 'settled', 10_000);
    const claims = Object.keys((JSON.parse(fs.readFileSync(`${agent.stateDir}/pool-claims.json`, 'utf8')) as { claims: object }).claims).length;
    const last = String(st.services.at(-1)!.vip);
    const reachable = (await lab.exec(client, 'ping', ['-c', '1', '-W', '2', last], { allowFail: true })).code === 0;
    const fds = await descriptors(agent.proc.pid!);
    agent.signal('SIGTERM');
    const exit = await agent.exited;
    if (exit.code !== 0) throw new Error(`agent exited ${String(exit.code ?? exit.signal)}: ${agent.stderr()}`);
    const stopped = await agent.waitLog('the stop line', (l) => l.msg === 'lb-agent stopped', 5000);
    return { fds, netlink: stopped.netlink as NetlinkCounts, start: settled.netlink as NetlinkCounts, left: await poolAddresses(lab, node), reachable, claims };
  } finally {
    if (agent.proc.exitCode === null && agent.proc.signalCode === null) { agent.signal('SIGKILL'); await agent.exited; }
  }
}

t.test(`${MANY} pool VIPs: descriptors as for ${FEW}, a stop in a few netlink batches, nothing left`, async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/16' });
  const client = await lab.addHost('client', { address: '10.99.0.50/16' });
  await lab.addHost('b1', { address: '10.99.0.11/16' });

  const few = await runWith(lab, node, client, FEW);
  const many = await runWith(lab, node, client, MANY);
  t.comment(`descriptors: ${FEW} VIPs ${JSON.stringify(few.fds)}, ${MANY} VIPs ${JSON.stringify(many.fds)}; stop netlink: ${JSON.stringify(few.netlink)} / ${JSON.stringify(many.netlink)}`);
  t.ok(few.reachable && many.reachable, 'a VIP answers a ping from the client in both runs');

  t.equal(many.fds.packet, few.fds.packet, `as many packet sockets for ${MANY} VIPs as for ${FEW} (one ARP socket on the parent)`);
  t.ok(few.fds.packet >= 1, 'the parent\'s ARP socket is there');
  // A socket per VIP would be 196 more.
  t.ok(many.fds.total - few.fds.total <= 8, `descriptors do not grow per VIP: ${few.fds.total} -> ${many.fds.total}`);

  for (const [n, r] of [[FEW, few], [MANY, many]] as const) {
    t.same(r.left, [], `${n} VIPs: none left on the parent after the stop`);
    t.ok(r.netlink.batched >= n, `${n} VIPs: every removal went in a batch (${r.netlink.batched} batched requests)`);
  }
  // A start: the parent read once for the sources that ask together, so
  // its dumps do not grow with the services (one per service would be 196 more).
  t.comment(`start netlink: ${JSON.stringify(few.start)} / ${JSON.stringify(many.start)}`);
  t.ok(many.start.dumps <= few.start.dumps + 4, `${MANY} VIPs: the start's dumps do not grow per VIP: ${few.start.dumps} -> ${many.start.dumps}`);
  t.ok(many.start.dumps < MANY / 10, `${MANY} VIPs: ${many.start.dumps} dumps for the whole start`);
  t.equal(few.claims, FEW, `${FEW} VIPs: every claim on disk`);
  t.equal(many.claims, MANY, `${MANY} VIPs: every claim on disk`);
  // One neighbour dump and a batch or two of removals, whatever the count.
  t.ok(many.netlink.batches <= 3, `${MANY} VIPs: ${many.netlink.batches} batch datagrams`);
  t.equal(many.netlink.batches, few.netlink.batches, `as many batches for ${MANY} VIPs as for ${FEW}`);
  t.ok(many.netlink.requests + many.netlink.dumps <= few.netlink.requests + few.netlink.dumps + 2, `round trips other than batches do not grow with VIPs: ${few.netlink.requests + few.netlink.dumps} -> ${many.netlink.requests + many.netlink.dumps}`);
  await waitFor('nothing left', async () => (await poolAddresses(lab, node)).length === 0, 1000);
});
