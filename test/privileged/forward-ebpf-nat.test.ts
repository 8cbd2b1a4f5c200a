// Privileged: the eBPF full-NAT engine (native/bpf/nat.c, forward/ebpf-nat.ts)
// against the nft path it stands in front of, in one lab: a client, a node
// holding the VIP on its eth0, three peer-echo backends (TCP, they answer
// who they saw) with a UDP echo. The same flows - chosen client ports, TCP
// and UDP - go through the nft path (flow-hash placement) and then through
// the engine, and every one must land on the backend the Maglev slot table
// and nft's jhash name for it, with the VIP as the source the backend sees.
// Then the engine alone: no conntrack entry in the node for its flows; a
// backend taken out gets no new flow from the next apply on; a planned
// restart keeps held connections and a 20 ms client loop served with one
// program attached, and writes no map entry when the maps hold the plan
// (only the changed service's ports when one backend changed); a connection whose flow entries are gone (a new VRRP
// Master, or maps lost) is picked up mid-way on the same backend; a removed
// backend's connections end; a stop leaves no program and no pin; a health
// transition among 200 services writes no more map entries than among 10
// (only the moved slots, rewritten where they are), with a client loop
// served throughout; maps
// written and counters read in batches equal those one call an entry; path MTU
// discovery works through the VIP both ways (a router's fragmentation-needed
// about a translated packet reaches the sender translated), on both paths;
// the same for an IPv6 VIP (its flows on the backends nft's IPv6 flow hash
// names, the VIP as their source, no conntrack entry, a backend taken out
// getting no new flow, a router's Packet Too Big translated both ways);
// a flow's stamp moves on once the clock is 2^24 ns past it and the flow
// expires once its idle timeout has passed, each to the nanosecond (a
// crafted entry and BPF_PROG_TEST_RUN); an engine that cannot load (no
// bpffs) leaves the nft table serving, and says why.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, run, waitFor, type Lab } from '../../lab/netns';
import { distPath } from '../../lab/services';
import { JsonLinesProc, askLoop, startPeerEchoes, CLIENT_EPHEMERAL_PORTS } from '../../lab/forward';
import type { DriverService } from '../../lab/bin/forward-driver';
import { addressToBytes, parseAddress } from '../../agent/address';
import { normalizeState } from '../../agent/forward/dataplane';
import { dsrSeedValue, flowHashSlots } from '../../agent/forward/nft-dsr';
import { nftJhashSlot, nftJhashSlot6 } from '../../agent/net/ebpf/ebpf-dsr';

const VIP = '10.99.0.50';
const NODE = '10.99.0.10';
const CLIENT = '10.99.0.2';
const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'] as const;
const IDS = ['b1', 'b2', 'b3'] as const;
const ECHO_PORT = 8081;
const UDP_TARGET = 5353;
const ROUTER = '10.99.0.30';
const FAR_CLIENT = '10.99.1.2';
const FAR_BACKEND = '10.99.1.3';
const BULK_TARGET = 9000;
const VIP6 = 'fd00:99::50';
const NODE6 = 'fd00:99::10';
const CLIENT6 = 'fd00:99::2';
const BACKENDS6 = ['fd00:99::11', 'fd00:99::12', 'fd00:99::13'] as const;
const ROUTER6 = 'fd00:99::30';
const FAR_CLIENT6 = 'fd00:99:1::2';
const FAR_BACKEND6 = 'fd00:99:1::3';

type Healthy = Partial<Record<(typeof IDS)[number], number>>;

function service(healthy: Healthy, configured: readonly (typeof IDS)[number][] = IDS): DriverService {
  return {
    key: 'default/web', vip: VIP,
    ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: ECHO_PORT }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: UDP_TARGET }],
    healthy: IDS.flatMap((id, i) => (healthy[id] !== undefined && configured.includes(id) ? [{ address: BACKENDS[i]!, weight: healthy[id] }] : [])),
    backends: IDS.flatMap((id, i) => (configured.includes(id) ? [{ address: BACKENDS[i]! }] : [])),
  };
}

function service6(healthy: Healthy, configured: readonly (typeof IDS)[number][] = IDS): DriverService {
  const v4 = service(healthy, configured);
  const six = (a: string): string => BACKENDS6[BACKENDS.indexOf(a as (typeof BACKENDS)[number])]!;
  return { ...v4, key: 'default/web6', vip: VIP6, healthy: v4.healthy.map((b) => ({ ...b, address: six(b.address) })), backends: v4.backends.map((b) => ({ address: six(b.address) })) };
}

/** A driver backend as config/load.ts makes it. */
const spec = (b: { address: string; weight?: number }): { address: string; addressNum: number; family?: 'IPv6'; weight: number } => {
  const a = parseAddress(b.address)!;
  return a.family === 'IPv4' ? { address: b.address, addressNum: Number(a.value), weight: b.weight ?? 1 } : { address: b.address, addressNum: 0, family: 'IPv6', weight: b.weight ?? 1 };
};

/** Where the slot table and nft's jhash (of `ip saddr . th sport`, or `ip6 saddr . th sport`) put the client port `port`: the reference both engines must meet. */
function expectedBackend(svc: DriverService, port: number): string {
  const st = normalizeState({ services: [{ ...svc, vip: svc.vip ?? undefined, healthy: svc.healthy.map(spec), backends: svc.backends.map(spec) }] }).services[0]!;
  const slots = flowHashSlots(st);
  const six = svc.vip?.includes(':') === true;
  const client = addressToBytes(parseAddress(six ? CLIENT6 : CLIENT)!);
  const b = slots[six ? nftJhashSlot6(client, port, dsrSeedValue(st.key), slots.length) : nftJhashSlot(client.readUInt32BE(0), port, dsrSeedValue(st.key), slots.length)]!;
  const i = (six ? BACKENDS6 : BACKENDS).indexOf(b.address as never);
  return IDS[i]!;
}

/** One UDP datagram from each client port to VIP:53 (`vip`, either family): the answering backend's id by port. */
async function udpFrom(lab: Lab, ns: string, ports: readonly number[], vip = VIP): Promise<Record<number, string>> {
  const script = `const dgram = require('node:dgram');
const ports = ${JSON.stringify(ports)}; const out = {};
(async () => { for (const p of ports) {
  out[p] = await new Promise((resolve) => { const s = dgram.createSocket(${JSON.stringify(vip.includes(':') ? 'udp6' : 'udp4')});
    const timer = setTimeout(() => { s.close(); resolve('timeout'); }, 1000);
    s.on('message', (m) => { clearTimeout(timer); s.close(); resolve(m.toString().trim()); });
    s.on('error', (e) => { clearTimeout(timer); s.close(); resolve('error:' + e.code); });
    s.bind(p, () => s.send('q', 53, ${JSON.stringify(vip)})); }); }
  process.stdout.write(JSON.stringify(out)); })();`;
  return JSON.parse((await lab.exec(ns, process.execPath, ['-e', script])).stdout) as Record<number, string>;
}

/** Our NAT programs attached at tcx ingress of eth0 in `ns`. */
async function natPrograms(lab: Lab, ns: string): Promise<number> {
  const script = `const n = require(${JSON.stringify(distPath('agent', 'native', 'native.js'))}); const fs = require('node:fs'); const b = n.nativeBpf();
let c = 0; for (const id of b.bpfProgQuery(n.ifNameToIndex('eth0'), 46)) { const fd = b.bpfProgGetFdById(id); if (b.bpfProgInfo(fd).name === 'lb_agent_nat') c++; fs.closeSync(fd); }
process.stdout.write(String(c));`;
  return Number((await lab.exec(ns, process.execPath, ['-e', script])).stdout);
}

/** Conntrack entries in `ns` towards the VIP (`vip`: either family's) or from the backends. */
async function conntrackEntries(lab: Lab, ns: string, vip = VIP): Promise<number> {
  const out = (await lab.exec(ns, 'conntrack', ['-L', '-f', vip.includes(':') ? 'ipv6' : 'ipv4', '-o', 'extended'], { allowFail: true })).stdout;
  return out.split('\n').filter((l) => l.includes(`=${vip} `)).length;
}

/** Both families' conntrack tables emptied. */
async function flushConntrack(lab: Lab, ns: string): Promise<void> {
  for (const f of ['ipv4', 'ipv6']) await lab.exec(ns, 'conntrack', ['-F', '-f', f], { allowFail: true });
}

/**
 * The per-plan maps of the NAT program at tcx ingress of eth0 in `ns`, read
 * apart from the engine: an array's every index one lookup each, a hash's
 * keys by BPF_MAP_LOOKUP_BATCH and each value by a lookup of its own; per
 * map a digest of the sorted "key=value" lines and their count, and each
 * counter index's flows summed over the CPUs.
 */
async function planMaps(lab: Lab, ns: string): Promise<{ maps: Record<string, { entries: number; digest: string }>; flows: number[] }> {
  const script = `const n = require(${JSON.stringify(distPath('agent', 'native', 'native.js'))}); const fs = require('node:fs'); const crypto = require('node:crypto');
const { natLayout } = require(${JSON.stringify(distPath('agent', 'net', 'ebpf', 'nat-layout.js'))});
const { possibleCpus } = require(${JSON.stringify(distPath('agent', 'net', 'ebpf', 'nat-attach.js'))});
const b = n.nativeBpfObject(); const cpus = possibleCpus(); const layout = natLayout();
let prog; for (const id of b.bpfProgQuery(n.ifNameToIndex('eth0'), 46)) { const fd = b.bpfProgGetFdById(id); if (b.bpfProgInfo(fd).name === 'lb_agent_nat') prog = fd; else fs.closeSync(fd); }
const out = { maps: {}, flows: [] };
for (const id of b.bpfProgInfo(prog).mapIds) {
  const fd = b.bpfMapGetFdById(id); const info = b.bpfMapInfo(fd);
  const lines = [];
  if (info.name === 'lbn_counters') {
    const size = layout.size('lbn_counter'); const at = layout.struct('lbn_counter').fields.find((f) => f.name === 'flows').offset;
    const v = Buffer.alloc(size * cpus); const k = Buffer.alloc(4);
    for (let i = 0; i < info.maxEntries; i++) { k.writeUInt32LE(i); b.bpfMapLookup(fd, k, v); let f = 0; for (let c = 0; c < cpus; c++) f += Number(v.readBigUInt64LE(c * size + at)); out.flows.push(f); }
  } else if (['lbn_slots', 'lbn_slots6', 'lbn_config'].includes(info.name)) {
    const v = Buffer.alloc(info.valueSize); const k = Buffer.alloc(4);
    for (let i = 0; i < info.maxEntries; i++) { k.writeUInt32LE(i); if (b.bpfMapLookup(fd, k, v) && v.some((x) => x !== 0)) lines.push(k.toString('hex') + '=' + v.toString('hex')); }
  } else if (['lbn_svcs', 'lbn_svcs6', 'lbn_members', 'lbn_members6'].includes(info.name)) {
    const keys = Buffer.alloc(info.keySize * info.maxEntries); const vals = Buffer.alloc(info.valueSize * info.maxEntries);
    const r = b.bpfMapLookupBatch(fd, null, Buffer.alloc(Math.max(8, info.keySize)), keys, vals, info.maxEntries);
    const v = Buffer.alloc(info.valueSize);
    for (let i = 0; i < r.count; i++) { const k = keys.subarray(i * info.keySize, (i + 1) * info.keySize); if (!b.bpfMapLookup(fd, k, v)) throw new Error('batch key not found'); lines.push(k.toString('hex') + '=' + v.toString('hex')); }
  }
  if (!['lbn_counters', 'lbn_events', 'lbn_flows', 'lbn_replies', 'lbn_flows6', 'lbn_replies6'].includes(info.name)) { lines.sort(); out.maps[info.name] = { entries: lines.length, digest: crypto.createHash('sha256').update(lines.join('\\n')).digest('hex').slice(0, 16) }; }
  fs.closeSync(fd);
}
fs.closeSync(prog);
process.stdout.write(JSON.stringify(out));`;
  return JSON.parse((await lab.exec(ns, process.execPath, ['-e', script])).stdout) as { maps: Record<string, { entries: number; digest: string }>; flows: number[] };
}

interface Ask { backend: string; peer: string }
interface NatStats {
  details: { natEngine?: { engine: string; reason: string; ports?: { IPv4: number; IPv6: number }; fill?: { flows: number; replies: number; flows6: number; replies6: number }; events?: Record<string, number>; lastApply?: { mode: string; ports: number; writes: number; calls: number } } };
  flows: { service: string; backend: string; port: string; connections: number }[];
}

if (requirePrivileged(t)) {
  t.test('the eBPF NAT engine beside the nft path', async (t) => {
    const t0 = Date.now();
    const lab = await createLab(t);
    const client = await lab.addHost('client', { address: `${CLIENT}/24`, ipv6: [`${CLIENT6}/64`], ephemeralPorts: CLIENT_EPHEMERAL_PORTS });
    const node = await lab.addHost('node', { address: `${NODE}/24`, extraAddresses: [`${VIP}/24`], ipv6: [`${NODE6}/64`, `${VIP6}/64`] });
    const backendNs: string[] = [];
    for (let i = 0; i < BACKENDS.length; i++) backendNs.push(await lab.addHost(IDS[i]!, { address: `${BACKENDS[i]}/24`, ipv6: [`${BACKENDS6[i]}/64`] }));
    await startPeerEchoes(lab, backendNs, IDS, ECHO_PORT);
    await startPeerEchoes(lab, backendNs, IDS, ECHO_PORT, 'IPv6');
    for (let i = 0; i < BACKENDS.length; i++) {
      for (const six of [false, true]) {
        const p = lab.spawn(backendNs[i]!, process.execPath, [distPath('lab', 'bin', 'udp-echo.js'), '--id', IDS[i]!, '--port', String(UDP_TARGET), ...(six ? ['--ipv6'] : [])]);
        let text = '';
        p.stdout?.on('data', (d: Buffer) => { text += d.toString(); });
        await waitFor(`udp echo ${IDS[i]}${six ? ' (IPv6)' : ''}`, () => text.includes('listening'), 10_000);
      }
    }
    // The engine pins its maps on a BPF file system of this test's own (the host's /sys/fs/bpf is left alone).
    const bpffs = fs.mkdtempSync(path.join(os.tmpdir(), `lbnat-${process.pid}-`));
    await run('mount', ['-t', 'bpf', 'bpf', bpffs]);
    t.teardown(async () => {
      await run('umount', [bpffs], { allowFail: true });
      fs.rmSync(bpffs, { recursive: true, force: true });
    });
    const pinDir = path.join(bpffs, 'nat-eth0');
    const startEngine = (extra: string[] = []): Promise<JsonLinesProc> => JsonLinesProc.start(lab, node, 'forward-driver.js',
      ['--kind', 'kernel', '--nat-engine', 'ebpf', '--nat-device', 'eth0', '--nat-pin-dir', pinDir, '--nat-flows', '4096', ...extra], 'driver(ebpf)');
    const cl = await JsonLinesProc.start(lab, client, 'peer-client.js', [], 'peer-client');
    t.teardown(() => cl.close());
    t.comment(`lab up in ${Date.now() - t0} ms`);

    const weighted = service({ b1: 1, b2: 1, b3: 2 });
    const bulk: DriverService = {
      key: 'default/bulk', vip: VIP, ports: [{ name: 'echo', port: 90, protocol: 'TCP', targetPort: BULK_TARGET }],
      healthy: [{ address: FAR_BACKEND, weight: 1 }], backends: [{ address: FAR_BACKEND }],
    };
    const weighted6 = service6({ b1: 1, b2: 1, b3: 2 });
    const landing = async (tt: typeof t, label: string, tcpFrom: number, udpFrom0: number, svc = weighted, n = 40): Promise<void> => {
      const vip = svc.vip!;
      const tcpPorts = Array.from({ length: n }, (_, i) => tcpFrom + i);
      let wrong = 0;
      let notVip = 0;
      const seen: Record<string, number> = {};
      for (const p of tcpPorts) {
        const a = await cl.request<Ask>({ cmd: 'ask', host: vip, port: 80, localPort: p });
        seen[a.backend] = (seen[a.backend] ?? 0) + 1;
        if (a.backend !== expectedBackend(svc, p)) wrong++;
        if (!a.peer.startsWith(`${vip}:`)) notVip++;
      }
      tt.equal(wrong, 0, `${label}: ${n} TCP connections each on the backend the slot table names (${JSON.stringify(seen)})`);
      tt.equal(notVip, 0, `${label}: every backend saw the VIP as the source`);
      tt.equal(Object.keys(seen).length, 3, `${label}: all three backends carry some`);
      const udpPorts = Array.from({ length: n / 2 }, (_, i) => udpFrom0 + i);
      const got = await udpFrom(lab, client, udpPorts, vip);
      tt.same(udpPorts.filter((p) => got[p] !== expectedBackend(svc, p)), [], `${label}: ${n / 2} UDP flows each answered by the slot table's backend`);
    };

    await t.test('the same flows land on the same backends through the nft path and the engine', async (t) => {
      const nft = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'kernel', '--placement', 'flow-hash'], 'driver(nft)');
      t.teardown(() => nft.close());
      await nft.request({ cmd: 'apply', state: { services: [weighted] } });
      await landing(t, 'nft', 41001, 43001);
      t.ok(await conntrackEntries(lab, node) > 0, 'the nft path keeps its flows in conntrack');
      await nft.request({ cmd: 'stop' });
      await nft.close();
      await lab.exec(node, 'conntrack', ['-F'], { allowFail: true });

      const eng = await startEngine();
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      await landing(t, 'ebpf', 42001, 44001);
      // A client port that is also the VIP's service port: the backend's replies to VIP:80 must not be taken for a client's packets.
      const same = await cl.request<Ask>({ cmd: 'ask', host: VIP, port: 80, localPort: 80 });
      const nport = Number(same.peer.slice(same.peer.lastIndexOf(':') + 1));
      t.ok(nport >= 61001 && nport <= 65535, `a client on port 80 is served, towards the backend from a port of the reserved range (${same.peer})`);
      t.equal(await conntrackEntries(lab, node), 0, 'the engine\'s flows leave nothing in the node\'s conntrack');
      const st = await eng.request<NatStats>({ cmd: 'stats' });
      t.equal(st.details.natEngine?.engine, 'ebpf', `status: ${st.details.natEngine?.reason}`);
      t.ok((st.details.natEngine?.events?.['new'] ?? 0) >= 61, `the engine placed the flows itself (${JSON.stringify(st.details.natEngine?.events)})`);
      t.ok((st.details.natEngine?.fill?.flows ?? 0) >= 60, `flow map fill ${st.details.natEngine?.fill?.flows}`);
      t.equal(st.details.natEngine?.events?.['evicted'], 0, 'flow maps with room evict nothing');
      const http = st.flows.filter((f) => f.port === 'http').reduce((s, f) => s + f.connections, 0);
      t.equal(http, 41, 'per-backend connections count the engine\'s TCP flows');
      const metrics = await eng.request<string>({ cmd: 'metrics' });
      t.match(metrics, /lbagent_forward_nat_flows_total\{service="web",namespace="default",port="http",backend="10\.99\.0\.1[123]"\} \d+/);
      t.equal(await natPrograms(lab, node), 1, 'one program at tcx ingress');
      await eng.request({ cmd: 'keep' }).catch(() => undefined);
    });

    await t.test('IPv6: the same flows land on the same backends through the nft path and the engine; a backend taken out gets no new flow', async (t) => {
      const nft = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'kernel', '--placement', 'flow-hash'], 'driver(nft)');
      t.teardown(() => nft.close());
      await nft.request({ cmd: 'apply', state: { services: [weighted6] } });
      await landing(t, 'nft IPv6', 41101, 43101, weighted6, 20);
      t.ok(await conntrackEntries(lab, node, VIP6) > 0, 'the nft path keeps its IPv6 flows in conntrack');
      await nft.request({ cmd: 'stop' });
      await nft.close();
      await flushConntrack(lab, node);

      const eng = await startEngine();
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state: { services: [weighted, weighted6] } });
      const v4flows = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.fill?.flows;
      await landing(t, 'ebpf IPv6', 42101, 44101, weighted6, 20);
      t.equal(await conntrackEntries(lab, node, VIP6), 0, 'the engine\'s IPv6 flows leave nothing in the node\'s conntrack');
      const st = await eng.request<NatStats>({ cmd: 'stats' });
      t.equal(st.details.natEngine?.engine, 'ebpf', `status: ${st.details.natEngine?.reason}`);
      t.match(st.details.natEngine?.reason, /IPv4 and IPv6/, 'status says the engine takes IPv6 VIPs');
      t.same(st.details.natEngine?.ports, { IPv4: 2, IPv6: 2 }, 'two ports of each family in the engine');
      t.ok((st.details.natEngine?.fill?.flows6 ?? 0) >= 30 && (st.details.natEngine?.fill?.replies6 ?? 0) >= 30, `the IPv6 flow maps hold the flows (${JSON.stringify(st.details.natEngine?.fill)})`);
      t.equal(st.details.natEngine?.fill?.flows, v4flows, 'and the IPv4 ones none of them');
      // Read after the status above that came before the traffic: that read must not answer for it.
      const http6 = st.flows.filter((f) => f.service === 'default/web6' && f.port === 'http');
      t.equal(http6.reduce((s, f) => s + f.connections, 0), 20, `per-backend connections count the engine's IPv6 TCP flows (${JSON.stringify(http6.map((f) => [f.backend, f.connections]))})`);
      const metrics = await eng.request<string>({ cmd: 'metrics' });
      t.match(metrics, /lbagent_forward_nat_flows_total\{service="web6",namespace="default",port="http",backend="fd00:99::1[123]"\} \d+/);

      // b3 out of the IPv6 service: no new flow reaches it.
      await eng.request({ cmd: 'apply', state: { services: [weighted, service6({ b1: 1, b2: 1 })] } });
      const burst = await cl.request<{ counts: Record<string, number>; errors: Record<string, number> }>({ cmd: 'burst', host: VIP6, port: 80, n: 40, fromPort: 46101, concurrency: 4 });
      t.same(burst.errors, {});
      t.equal(burst.counts['b3'] ?? 0, 0, `no new IPv6 connection to b3 (${JSON.stringify(burst.counts)})`);
      t.equal(await conntrackEntries(lab, node, VIP6), 0, 'still nothing in conntrack');

      // A datagram with a destination options header (RFC 8200 4.6, a PadN
      // option): the engine passes it to the nft table unread and counts it;
      // the nft path serves it.
      const ext = 'import socket\ns = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\ns.settimeout(2)\ns.bind(("", 47101))\n'
        + `s.sendmsg([b"q"], [(socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, bytes([0, 0, 1, 4, 0, 0, 0, 0]))], 0, ("${VIP6}", 53))\n`
        + 'print(s.recv(100).decode().strip())\n';
      const answer = (await lab.exec(client, 'python3', ['-c', ext], { timeoutMs: 5000 })).stdout.trim();
      t.match(answer, /^b[12]$/, `a datagram with an extension header served through the nft path, by a healthy backend (${answer})`);
      const events = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.events;
      t.ok((events?.['ipv6ExtHeader'] ?? 0) >= 1, `passed to nft and counted (${JSON.stringify(events)})`);
      t.ok(await conntrackEntries(lab, node, VIP6) >= 1, 'through conntrack, as the nft path serves it');
      await eng.request({ cmd: 'stop' });
    });

    await t.test('a backend taken out gets no new flow from the next apply on; held connections survive a restart', async (t) => {
      let eng = await startEngine();
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      const held = await cl.request<{ backends: string[] }>({ cmd: 'holdOpen', host: VIP, port: 80, n: 12, fromPort: 45001 });
      t.ok(held.backends.includes('b3'), `held connections on ${held.backends.join(' ')}`);

      // A planned restart: the program stays attached, the next process replaces it by its pin.
      const loop = askLoop(cl, VIP, 80);
      await new Promise((r) => setTimeout(r, 200));
      await eng.request({ cmd: 'keep' }).catch(() => undefined);
      eng = await startEngine();
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      await new Promise((r) => setTimeout(r, 200));
      const res = await loop.stop();
      t.same(res.failures, {}, `${res.count} requests at 20 ms across the restart, none failed`);
      t.equal(await natPrograms(lab, node), 1, 'exactly one program attached after the restart');
      const kept = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.lastApply;
      t.same(kept, { mode: 'adopt', ports: 0, writes: 0, calls: 0 }, 'the restart kept the program and maps that hold the plan, and wrote nothing');
      const again = await cl.request<{ backends: string[] }>({ cmd: 'holdAsk' });
      t.same(again.backends, held.backends, 'every held connection answered by its backend after the restart');

      // A restart with one backend changed (b3 taken out): only that service's two ports written.
      await eng.request({ cmd: 'keep' }).catch(() => undefined);
      eng = await startEngine();
      await eng.request({ cmd: 'apply', state: { services: [service({ b1: 1, b2: 1 })] } });
      const changed = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.lastApply;
      const slots = flowHashSlots(normalizeState({ services: [{ ...weighted, vip: VIP, healthy: weighted.healthy.map(spec), backends: weighted.backends.map(spec) }] }).services[0]!).length;
      t.same(changed && { mode: changed.mode, ports: changed.ports, writes: changed.writes }, { mode: 'adopt', ports: 2, writes: 2 * slots + 2 + 2 },
        `a restart with b3 out writes its ports alone: two slot tables of ${slots}, two svc entries, two member entries`);

      // b3 out: new connections avoid it at once; its open ones drain (TCP, as conntrack keeps them on the nft path).
      await eng.request({ cmd: 'apply', state: { services: [service({ b1: 1, b2: 1 })] } });
      const burst = await cl.request<{ counts: Record<string, number>; errors: Record<string, number> }>({ cmd: 'burst', host: VIP, port: 80, n: 60, fromPort: 46001, concurrency: 4 });
      t.same(burst.errors, {});
      t.equal(burst.counts['b3'] ?? 0, 0, `no new connection to b3 (${JSON.stringify(burst.counts)})`);
      const drained = await cl.request<{ backends: string[] }>({ cmd: 'holdAsk' });
      t.same(drained.backends, held.backends, 'open connections keep their backend, b3\'s too');

      // Maps written in place (b3 back) and a planned stop at once: the stop keeps their record, so the next process writes nothing.
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      await eng.request({ cmd: 'keep' }).catch(() => undefined);
      eng = await startEngine();
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      const recorded = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.lastApply;
      t.same(recorded, { mode: 'adopt', ports: 0, writes: 0, calls: 0 }, 'maps written in place just before a planned stop are recorded by the stop: the restart writes nothing');

      // The flow entries lost (a new VRRP Master, or maps gone): the next segment of each connection is placed mid-way, on the same backend.
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      await eng.request({ cmd: 'keep' }).catch(() => undefined);
      for (const m of ['lbn_flows', 'lbn_replies']) fs.unlinkSync(path.join(pinDir, m));
      eng = await startEngine();
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      const picked = await cl.request<{ backends: string[] }>({ cmd: 'holdAsk' });
      t.same(picked.backends, held.backends, 'held connections picked up mid-way by the new maps, each on its backend');
      const st = await eng.request<NatStats>({ cmd: 'stats' });
      t.ok((st.details.natEngine?.events?.['midflow'] ?? 0) >= held.backends.length, `mid-flow pickups counted (${JSON.stringify(st.details.natEngine?.events)})`);
      t.equal(st.details.natEngine?.events?.['evicted'], 0, 'the removed maps\' flows are not counted as evicted');
      t.equal(await conntrackEntries(lab, node), 0, 'and none of it went through conntrack');

      // b3 removed from the config: its connections end (the next segment is placed on another backend, which resets it).
      await eng.request({ cmd: 'apply', state: { services: [service({ b1: 1, b2: 1 }, ['b1', 'b2'])] } });
      const ended = await cl.request<{ backends: string[] }>({ cmd: 'holdAsk' });
      ended.backends.forEach((b, i) => {
        if (held.backends[i] === 'b3') t.match(b, /^error:/, `connection ${i} (was on b3) ended: ${b}`);
        else t.equal(b, held.backends[i], `connection ${i} stays on ${held.backends[i]}`);
      });
      await cl.request({ cmd: 'holdClose' });

      // A stop withdraws everything: no program, no pins; the nft table goes too.
      await eng.request({ cmd: 'stop' });
      t.equal(await natPrograms(lab, node), 0, 'no program after stop');
      t.same(fs.existsSync(pinDir) ? fs.readdirSync(pinDir) : [], [], 'no pin left');
    });
    await t.test('a health transition among many services writes as many map entries as among few, and flows keep flowing', async (t) => {
      // Services beside `weighted` on VIPs nothing sends to (entries in the
      // engine's maps and the nft table only). b3 taken out of `weighted`
      // and put back, among 10 and among 200 of them: the engine writes the
      // same entries both times (its two ports' tables, svc and member
      // entries), and a client loop through the VIP sees no failure.
      const filler = (n: number): DriverService[] => Array.from({ length: n }, (_, i) => ({
        key: `fill/s${i}`, vip: `10.98.${i >> 8}.${i & 255}`, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: ECHO_PORT }],
        healthy: BACKENDS.map((address) => ({ address, weight: 1 })), backends: BACKENDS.map((address) => ({ address })),
      }));
      const eng = await startEngine();
      t.teardown(() => eng.close());
      const writes: Record<number, number[]> = {};
      for (const n of [10, 200]) {
        await eng.request({ cmd: 'apply', state: { services: [weighted, ...filler(n)] } });
        const loop = askLoop(cl, VIP, 80);
        await new Promise((r) => setTimeout(r, 200));
        writes[n] = [];
        for (const state of [[service({ b1: 1, b2: 1 }), ...filler(n)], [weighted, ...filler(n)]]) {
          await eng.request({ cmd: 'apply', state: { services: state } });
          const last = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.lastApply;
          t.equal(last?.mode, 'delta', `${n} services: written in place (${JSON.stringify(last)})`);
          t.equal(last?.ports, 2, `${n} services: the two ports of the one service changed`);
          writes[n].push(last?.writes ?? NaN);
          await new Promise((r) => setTimeout(r, 150));
        }
        const res = await loop.stop();
        t.same(res.failures, {}, `${n} services: ${res.count} requests at 20 ms through the VIP across b3 out and back, none failed`);
      }
      const norm = normalizeState({ services: [{ ...weighted, vip: VIP, healthy: weighted.healthy.map(spec), backends: weighted.backends.map(spec) }] }).services[0]!;
      const slots = flowHashSlots(norm).length;
      // b3's slots (weight 2 of 4) are the ones that move, each way: rewritten where they are, no new range, no svc entry.
      const moved = flowHashSlots(norm).filter((x) => x.address === BACKENDS[2]).length;
      t.same(writes[200], writes[10], `the same map entries written among 200 services as among 10 (${JSON.stringify(writes)})`);
      t.same(writes[10], [2 * moved + 2, 2 * moved + 2], `each transition: on each of the two ports, the ${moved} of ${slots} slots b3 holds and its member entry`);
      await eng.request({ cmd: 'stop' });
    });
    await t.test('maps written and counters read in batches hold and read what one call an entry does', async (t) => {
      // The same plan (two services of each family's ports and 20 more) and
      // the same flows, once through batch calls and once one call an
      // entry: the per-plan maps, read back apart from the engine, are the
      // same byte for byte, and so are the per-backend flows the engine
      // reads (in batches the one time, a lookup each the other) and what
      // a reader apart from it finds.
      const filler = Array.from({ length: 20 }, (_, i): DriverService => ({
        key: `fill/b${i}`, vip: `10.97.0.${i + 1}`, ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: ECHO_PORT }],
        healthy: BACKENDS.map((address) => ({ address, weight: 1 })), backends: BACKENDS.map((address) => ({ address })),
      }));
      const state = { services: [weighted, weighted6, ...filler] };
      const runs: Array<{ maps: Record<string, { entries: number; digest: string }>; flows: Record<string, number>; read: number[]; calls: number; writes: number }> = [];
      for (const batch of ['on', 'off']) {
        const eng = await startEngine(['--nat-batch', batch]);
        t.teardown(() => eng.close());
        await eng.request({ cmd: 'apply', state });
        const last = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.lastApply;
        const burst = await cl.request<{ counts: Record<string, number>; errors: Record<string, number> }>({ cmd: 'burst', host: VIP, port: 80, n: 30, fromPort: 48001, concurrency: 3 });
        t.same(burst.errors, {}, `batch ${batch}: 30 connections served (${JSON.stringify(burst.counts)})`);
        const st = await eng.request<NatStats>({ cmd: 'stats' });
        const flows = Object.fromEntries(st.flows.filter((f) => f.service === 'default/web' && f.port === 'http').map((f) => [f.backend, f.connections]));
        const dump = await planMaps(lab, node);
        runs.push({ maps: dump.maps, flows, read: dump.flows, calls: last?.calls ?? NaN, writes: last?.writes ?? NaN });
        if (batch === 'on') {
          // The carried totals: a program loaded for a plan that outgrew the
          // maps carries every backend's flows over, and a backend's counter
          // retired (b3 out of the config) and placed again (b3 back) goes on
          // from its total.
          const webFlows = async (): Promise<Record<string, number>> => Object.fromEntries((await eng.request<NatStats>({ cmd: 'stats' })).flows.filter((f) => f.service === 'default/web' && f.port === 'http').map((f) => [f.backend, f.connections]));
          const more = Array.from({ length: 200 }, (_, i): DriverService => ({ ...filler[0]!, key: `more/m${i}`, vip: `10.96.${i >> 8}.${(i & 255) + 1}` }));
          await eng.request({ cmd: 'apply', state: { services: [weighted, weighted6, ...filler, ...more] } });
          t.equal((await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.lastApply?.mode, 'load', 'a plan that outgrew the maps loaded a program of its own');
          t.same(await webFlows(), flows, 'its per-backend flows carried over from the program it replaced');
          await eng.request({ cmd: 'apply', state: { services: [service({ b1: 1, b2: 1 }, ['b1', 'b2']), weighted6, ...filler] } });
          await eng.request({ cmd: 'apply', state: { services: [weighted, weighted6, ...filler] } });
          t.same(await webFlows(), flows, 'a backend taken out of the config and back goes on from its total');
        }
        await eng.request({ cmd: 'stop' });
      }
      const [on, off] = runs as [typeof runs[0], typeof runs[0]];
      t.ok((on.maps['lbn_slots']?.entries ?? 0) > 1000 && (on.maps['lbn_slots6']?.entries ?? 0) > 100 && (on.maps['lbn_members']?.entries ?? 0) === 3 * 22,
        `the maps hold the plan (${JSON.stringify(Object.fromEntries(Object.entries(on.maps).map(([k, v]) => [k, v.entries])))})`);
      t.same(on.maps, off.maps, 'batch writes leave every per-plan map as single writes do, byte for byte');
      t.equal(on.writes, off.writes, `the same entries written (${on.writes})`);
      t.ok(on.calls * 20 < off.calls, `in far fewer bpf(2) calls: ${on.calls} batched, ${off.calls} one an entry`);
      t.same(on.flows, off.flows, `the per-backend flows read in batches equal those read a lookup each (${JSON.stringify(on.flows)})`);
      t.equal(Object.values(on.flows).reduce((a, b) => a + b, 0), 30, 'and count the 30 connections');
      t.same(on.read, off.read, 'a reader apart from the engine finds the same counters after both');
      t.equal(on.read.reduce((a, b) => a + b, 0), 30, 'and the same 30 flows');
    });
    await t.test('path MTU discovery works through the VIP: ICMP errors reach the flow\'s other end translated', async (t) => {
      // A router on the LAN with a far network behind it, whose route there
      // allows 1280 bytes: a far client and a far backend each send 1500-byte
      // segments; the router answers fragmentation-needed to the VIP for the
      // node's translated packets, both ways, and only a translated ICMP
      // error tells the sender to send smaller. The same in IPv6, where the
      // router answers Packet Too Big (RFC 8201) and never fragments (its
      // route's MTU locked: IPv6 forwarding otherwise checks the device's,
      // ip6_dst_mtu_maybe_forward).
      const rtr = await lab.addHost('rtr', { address: `${ROUTER}/24`, ipv6: [`${ROUTER6}/64`] });
      await lab.addBridge('far');
      await lab.addNic('rtr', 'eth1', { bridge: 'far', address: '10.99.1.1/24' });
      await lab.sh(rtr, 'sysctl -qw net.ipv4.ip_forward=1 net.ipv4.icmp_ratelimit=0 net.ipv6.conf.all.forwarding=1 net.ipv6.icmp.ratelimit=0'
        + ' && ip route replace 10.99.1.0/24 dev eth1 proto kernel scope link src 10.99.1.1 mtu 1280'
        + ' && ip -6 addr add fd00:99:1::1/64 dev eth1 nodad && ip -6 route replace fd00:99:1::/64 dev eth1 proto kernel metric 256 mtu lock 1280');
      const farc = await lab.addHost('farc', { address: `${FAR_CLIENT}/24`, gateway: '10.99.1.1', bridge: 'far', ipv6: [`${FAR_CLIENT6}/64`] });
      const farb = await lab.addHost('farb', { address: `${FAR_BACKEND}/24`, gateway: '10.99.1.1', bridge: 'far', ipv6: [`${FAR_BACKEND6}/64`] });
      for (const ns of [farc, farb]) await lab.sh(ns, 'ip -6 route add default via fd00:99:1::1');
      await lab.sh(node, `ip route add 10.99.1.0/24 via ${ROUTER} && ip -6 route add fd00:99:1::/64 via ${ROUTER6}`);
      const echo = lab.spawn(farb, process.execPath, ['-e',
        `require('node:net').createServer({ allowHalfOpen: true }, (s) => { s.on('error', () => {}); s.pipe(s); }).listen(${BULK_TARGET}, () => console.log('listening'));`]);
      let echoOut = '';
      echo.stdout?.on('data', (d: Buffer) => { echoOut += d.toString(); });
      await waitFor('bulk echo', () => echoOut.includes('listening'), 10_000);
      const bulk6: DriverService = { ...bulk, key: 'default/bulk6', vip: VIP6, healthy: [{ address: FAR_BACKEND6, weight: 1 }], backends: [{ address: FAR_BACKEND6 }] };
      const state = { services: [weighted, bulk, bulk6] };
      /** 512 KiB from the far client through VIP:90 (`vip`, either family) to the far backend and back. */
      const transfer = async (vip = VIP): Promise<{ ok: boolean; got: number; error?: string }> => {
        const script = `const net = require('node:net'); const body = require('node:crypto').randomBytes(512 * 1024);
const parts = []; let n = 0; let done = false;
const out = (r) => { if (done) return; done = true; process.stdout.write(JSON.stringify(r)); process.exit(0); };
const s = net.connect({ host: ${JSON.stringify(vip)}, port: 90 }, () => s.end(body));
setTimeout(() => out({ ok: false, got: n, error: 'timeout' }), 8000);
s.on('data', (d) => { parts.push(d); n += d.length; });
s.on('end', () => out({ ok: Buffer.concat(parts).equals(body), got: n }));
s.on('error', (e) => out({ ok: false, got: n, error: e.code }));`;
        return JSON.parse((await lab.exec(farc, process.execPath, ['-e', script], { timeoutMs: 15_000 })).stdout) as { ok: boolean; got: number; error?: string };
      };
      const pmtu = async (ns: string, vip = VIP): Promise<string> => /\bmtu (\d+)/.exec((await lab.exec(ns, 'ip', ['route', 'get', vip])).stdout)?.[1] ?? 'none';
      const forget = (): Promise<unknown> => Promise.all([farc, farb].map((ns) => lab.sh(ns, 'ip route flush cache && ip -6 route flush cache')));

      const nft = await JsonLinesProc.start(lab, node, 'forward-driver.js', ['--kind', 'kernel', '--placement', 'flow-hash'], 'driver(nft)');
      t.teardown(() => nft.close());
      await nft.request({ cmd: 'apply', state });
      t.same(await transfer(), { ok: true, got: 512 * 1024 }, 'nft: 512 KiB echoed whole through the VIP');
      t.equal(await pmtu(farc), '1280', 'nft: the far client learned the path MTU from the router\'s error about the node\'s packet');
      t.equal(await pmtu(farb), '1280', 'nft: the far backend learned it too');
      t.same(await transfer(VIP6), { ok: true, got: 512 * 1024 }, 'nft IPv6: 512 KiB echoed whole through the IPv6 VIP');
      t.same([await pmtu(farc, VIP6), await pmtu(farb, VIP6)], ['1280', '1280'], 'nft IPv6: both far hosts learned the path MTU from the router\'s Packet Too Big');
      await nft.request({ cmd: 'stop' });
      await nft.close();
      await flushConntrack(lab, node);
      await forget();
      t.same([await pmtu(farc), await pmtu(farc, VIP6)], ['none', 'none'], 'the far hosts forgot it');

      const eng = await startEngine();
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state });
      t.same(await transfer(), { ok: true, got: 512 * 1024 }, 'ebpf: 512 KiB echoed whole through the VIP');
      t.equal(await pmtu(farc), '1280', 'ebpf: the far client learned the path MTU: the error about V:nport -> backend reached it as one about its own packet');
      t.equal(await pmtu(farb), '1280', 'ebpf: the far backend learned it: the error about V:90 -> client reached it as one about its own packet');
      const before = (await eng.request<NatStats>({ cmd: 'stats' })).details.natEngine?.events?.['icmpError'] ?? 0;
      t.ok(before >= 2, `the engine translated the errors itself (${before})`);
      t.same(await transfer(VIP6), { ok: true, got: 512 * 1024 }, 'ebpf IPv6: 512 KiB echoed whole through the IPv6 VIP');
      t.equal(await pmtu(farc, VIP6), '1280', 'ebpf IPv6: the far client learned the path MTU: the Packet Too Big about [V]:nport -> backend reached it as one about its own packet');
      t.equal(await pmtu(farb, VIP6), '1280', 'ebpf IPv6: the far backend learned it: the one about [V]:90 -> client reached it about its own packet');
      const st = await eng.request<NatStats>({ cmd: 'stats' });
      t.ok((st.details.natEngine?.events?.['icmpError'] ?? 0) >= before + 2, `the engine translated the IPv6 errors itself (${JSON.stringify(st.details.natEngine?.events)})`);
      t.ok((st.details.natEngine?.fill?.flows6 ?? 0) >= 1, 'the IPv6 transfer was the engine\'s flow');
      t.equal(await conntrackEntries(lab, node), 0, 'none of it went through conntrack');
      t.equal(await conntrackEntries(lab, node, VIP6), 0, 'nor of the IPv6 one');
      await eng.request({ cmd: 'stop' });
    });
    await t.test('flow maps too small for the flows evict, and the evictions are counted', async (t) => {
      // 16 entries a map, 40 UDP flows one after another from new client
      // ports: each is answered (its entries live long enough for its own
      // reply), and every key the engine added and no longer holds is an
      // eviction: two keys a flow (one a map) less what the maps hold.
      const eng = await JsonLinesProc.start(lab, node, 'forward-driver.js',
        ['--kind', 'kernel', '--nat-engine', 'ebpf', '--nat-device', 'eth0', '--nat-pin-dir', `${pinDir}-small`, '--nat-flows', '16'], 'driver(ebpf, 16 flows)');
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      const ports = Array.from({ length: 40 }, (_, i) => 45001 + i);
      const got = await udpFrom(lab, client, ports);
      t.same(ports.filter((p) => got[p] !== expectedBackend(weighted, p)), [], 'every flow answered by its backend');
      const st = await eng.request<NatStats>({ cmd: 'stats' });
      const fill = st.details.natEngine?.fill ?? { flows: NaN, replies: NaN };
      t.ok(fill.flows <= 16 && fill.replies <= 16, `the maps hold at most their size (${fill.flows} / ${fill.replies})`);
      t.equal(st.details.natEngine?.events?.['evicted'], 2 * ports.length - fill.flows - fill.replies, `evictions counted (${JSON.stringify(st.details.natEngine?.events)})`);
      const metrics = await eng.request<string>({ cmd: 'metrics' });
      t.match(metrics, new RegExp(`lbagent_forward_nat_events_total\\{event="evicted"\\} ${2 * ports.length - fill.flows - fill.replies}\\b`));
      await eng.request({ cmd: 'stop' });
    });
    await t.test('a flow\'s stamp moves on once the clock is 2^24 ns past it, not before; a flow expires once its idle timeout has passed since the stamp, not before', async (t) => {
      // The program stamps a held flow only once the coarse clock is 2^24 ns
      // (16.8 ms) past its stamp (a write on every packet bounces the entry's
      // cache line between the CPUs of the two directions), so an idle
      // timeout runs out up to that much early, never late. Crafted here, at
      // the nanosecond: a flow entry whose stamp is a chosen age behind the
      // program's own clock, one ACK of it run through the attached program
      // (BPF_PROG_TEST_RUN), the entry and the expired count read back. The
      // program's clock (bpf_ktime_get_coarse_ns, the last tick's) is read
      // through the program: a second flow stamped a second ago is stamped
      // anew by one packet, before and after the trial; a trial between two
      // readings that differ (a tick between them) is run again. No ingress
      // device in a test run, so a packet goes no further than the FIB lookup.
      const eng = await JsonLinesProc.start(lab, node, 'forward-driver.js',
        ['--kind', 'kernel', '--nat-engine', 'ebpf', '--nat-device', 'eth0', '--nat-pin-dir', `${pinDir}-grain`, '--nat-flows', '64'], 'driver(ebpf, stamp)');
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      const script = `const n = require(${JSON.stringify(distPath('agent', 'native', 'native.js'))}); const fs = require('node:fs');
const { natLayout } = require(${JSON.stringify(distPath('agent', 'net', 'ebpf', 'nat-layout.js'))});
const { possibleCpus } = require(${JSON.stringify(distPath('agent', 'net', 'ebpf', 'nat-attach.js'))});
const b = n.nativeBpfObject(); const cpus = possibleCpus(); const L = natLayout();
let prog; for (const id of b.bpfProgQuery(n.ifNameToIndex('eth0'), 46)) { const fd = b.bpfProgGetFdById(id); if (b.bpfProgInfo(fd).name === 'lb_agent_nat') prog = fd; else fs.closeSync(fd); }
const maps = {}; for (const id of b.bpfProgInfo(prog).mapIds) { const fd = b.bpfMapGetFdById(id); maps[b.bpfMapInfo(fd).name] = fd; }
const u32 = (x) => { const k = Buffer.alloc(4); k.writeUInt32LE(x); return k; };
const ip = (a) => Buffer.from(a.split('.').map(Number));
const be16 = (x) => { const k = Buffer.alloc(2); k.writeUInt16BE(x); return k; };
const cfgBuf = Buffer.alloc(L.size('lbn_config')); b.bpfMapLookup(maps.lbn_config, u32(0), cfgBuf);
const idle = L.decode('lbn_config', cfgBuf).tcp_idle_ns;
const expiredCount = () => { const v = Buffer.alloc(8 * cpus); b.bpfMapLookup(maps.lbn_events, u32(L.constant('LBN_EV_EXPIRED')), v); let s = 0n; for (let c = 0; c < cpus; c++) s += v.readBigUInt64LE(8 * c); return s; };
const key = (sport) => L.encode('lbn_flow_key', { saddr: ip('10.99.0.77'), daddr: ip(${JSON.stringify(VIP)}), sport: be16(sport), dport: be16(80), proto: 6 });
const frame = (sport) => { const f = Buffer.alloc(14 + 20 + 20);
  f.writeUInt16BE(0x0800, 12); f[14] = 0x45; f.writeUInt16BE(40, 16); f[22] = 64; f[23] = 6;
  ip('10.99.0.77').copy(f, 26); ip(${JSON.stringify(VIP)}).copy(f, 30); f.writeUInt16BE(sport, 34); f.writeUInt16BE(80, 36); f[46] = 0x50; f[47] = 0x10; return f; };
const entry = (seen) => L.encode('lbn_flow', { addr: ip(${JSON.stringify(BACKENDS[0])}), port: be16(${ECHO_PORT}), nat_port: be16(40000), counter: 0xffffffff, seen_ns: seen });
const out = Buffer.alloc(256); const got = Buffer.alloc(L.size('lbn_flow'));
const PROBE = 40998; const TRIAL = 40999;
const clock = () => {
  b.bpfMapUpdate(maps.lbn_flows, key(PROBE), entry(process.hrtime.bigint() - 1000000000n), 0);
  b.bpfProgTestRun(prog, frame(PROBE), out, 1);
  b.bpfMapLookup(maps.lbn_flows, key(PROBE), got);
  return L.decode('lbn_flow', got).seen_ns;
};
// One ACK of a flow whose stamp is age ns behind the program's clock: whether the stamp moved and the flow was found expired.
const trial = (age) => {
  for (let i = 0; i < 50; i++) {
    const e0 = expiredCount();
    const c0 = clock(); const seen = c0 - age;
    b.bpfMapUpdate(maps.lbn_flows, key(TRIAL), entry(seen), 0);
    b.bpfProgTestRun(prog, frame(TRIAL), out, 1);
    if (clock() !== c0) continue;
    if (!b.bpfMapLookup(maps.lbn_flows, key(TRIAL), got)) return { gone: true };
    return { moved: L.decode('lbn_flow', got).seen_ns !== seen, expired: Number(expiredCount() - e0), tries: i + 1 };
  }
  return { busy: true };
};
const G = 1n << 24n;
const r = { idleNs: String(idle), fresh: trial(0n), under: trial(G - 1n), at: trial(G), idle: trial(idle), over: trial(idle + 1n) };
for (const p of [PROBE, TRIAL]) b.bpfMapDelete(maps.lbn_flows, key(p));
process.stdout.write(JSON.stringify(r));`;
      const r = JSON.parse((await lab.exec(node, process.execPath, ['-e', script])).stdout) as Record<string, { moved?: boolean; expired?: number; tries?: number; busy?: boolean; gone?: boolean }> & { idleNs: string };
      t.comment(JSON.stringify(r));
      const idleS = Number(r.idleNs) / 1e9;
      t.same(r['fresh'], { ...r['fresh'], moved: false, expired: 0 }, 'a flow stamped at this tick: its stamp left as it is (no write)');
      t.same(r['under'], { ...r['under'], moved: false, expired: 0 }, 'stamped 2^24 - 1 ns ago: left as it is');
      t.same(r['at'], { ...r['at'], moved: true, expired: 0 }, 'stamped 2^24 ns ago: stamped anew');
      t.same(r['idle'], { ...r['idle'], moved: true, expired: 0 }, `stamped its idle timeout (${idleS} s) ago: held, and stamped anew`);
      t.same(r['over'], { ...r['over'], moved: false, expired: 1 }, `stamped its idle timeout and 1 ns ago: expired`);
      await eng.request({ cmd: 'stop' });
    });
    await t.test('an engine that cannot load leaves the nft table serving alone, and says why', async (t) => {
      const plain = fs.mkdtempSync(path.join(os.tmpdir(), `lbnat-plain-${process.pid}-`));
      t.teardown(() => fs.rmSync(plain, { recursive: true, force: true }));
      const eng = await JsonLinesProc.start(lab, node, 'forward-driver.js',
        ['--kind', 'kernel', '--nat-engine', 'ebpf', '--nat-device', 'eth0', '--nat-pin-dir', path.join(plain, 'nat-eth0')], 'driver(no bpffs)');
      t.teardown(() => eng.close());
      await eng.request({ cmd: 'apply', state: { services: [weighted] } });
      const st = await eng.request<NatStats>({ cmd: 'stats' });
      t.equal(st.details.natEngine?.engine, 'nft');
      t.match(st.details.natEngine?.reason, /^fallback: .*is not on a BPF file system/);
      const burst = await cl.request<{ counts: Record<string, number>; errors: Record<string, number> }>({ cmd: 'burst', host: VIP, port: 80, n: 20, fromPort: 47001, concurrency: 4 });
      t.same(burst.errors, {}, `served by the nft table (${JSON.stringify(burst.counts)})`);
      t.ok(await conntrackEntries(lab, node) > 0, 'through conntrack');
      t.equal(await natPrograms(lab, node), 0, 'no program attached');
      await eng.request({ cmd: 'stop' });
    });
    t.comment(`total ${Date.now() - t0} ms`);
  });
}
