// Privileged: the kernel path's incremental updates (nft.ts renderNftDelta,
// NftDataplane.applyDelta) against the real kernel, in namespaces of a lab:
// a change to one backend of one service sends the same small transaction
// whether the table holds 10 services or 300, and after any sequence of
// incremental updates (health transitions, a service going, an IPv6 VIP
// coming and going, flow-hash placement) the kernel holds exactly what a
// table written whole would hold. A transaction the kernel refuses (the
// table was deleted by hand) leaves nothing half-applied: the data path
// writes the tables whole instead. The counters are read over nfnetlink
// (net/netlink/nft-counters.ts) as nft(8) lists them. The same sequence
// with the data path inside the namespace (fixtures/nft-delta-driver.ts):
// its health transitions and reloads (counters and byte-map elements
// included) go as nfnetlink batches (net/netlink/nft-batch.ts), no nft
// spawned unless a table appears or goes, commits the drift guard takes as the agent's own, and the
// kernel holds what a write whole gives after each; a batch the kernel
// refuses leaves the tables exactly as they were.
import t from 'tap';
import * as fs from 'node:fs';
import * as readline from 'node:readline';
import * as os from 'node:os';
import * as path from 'node:path';
import { Registry } from 'prom-client';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, type Lab } from '../../lab/netns';
import { parseIPv4 } from '../../agent/address';
import type { BackendSpec, PortSpec } from '../../agent/config/types';
import type { ForwardState, Placement } from '../../agent/forward/dataplane';
import { NftDataplane, canonicalTableJson, execProgram, parseNftCounters, renderNft, renderNftDelta, type Exec } from '../../agent/forward/nft';
import { MAX_BATCH_BYTES, encodeBatch } from '../../agent/net/netlink/nft-batch';

const b = (address: string): BackendSpec => ({ address, addressNum: parseIPv4(address) ?? 0, weight: 1 });
const b6 = (address: string): BackendSpec => ({ address, addressNum: 0, weight: 1 });
const http: PortSpec = { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 };
const dns: PortSpec = { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 };

type Change = (i: number, all: BackendSpec[]) => { healthy: BackendSpec[]; backends: BackendSpec[] };
const same: Change = (_, all) => ({ healthy: all, backends: all });

/** N services of three backends each; svc-000 comes first in the canonical order (s0). */
function many(n: number, change: Change = same): ForwardState {
  return {
    services: Array.from({ length: n }, (_, i) => {
      const all = [1, 2, 3].map((k) => b(`10.97.${i >> 6}.${(i & 63) * 4 + k}`));
      return { key: `default/svc-${String(i).padStart(3, '0')}`, vip: `10.98.${i >> 8}.${i & 255}`, ports: [http, dns], ...change(i, all) };
    }),
  };
}

/** One backend of svc-000 replaced by another. */
const swapOne: Change = (i, all) => {
  const backends = i === 0 ? [all[0]!, all[1]!, b('10.97.0.250')] : all;
  return { healthy: backends, backends };
};

/**
 * The sequence of changes both data paths go through: [what, state, how
 * the data path inside the namespace writes it]: over nfnetlink; with nft
 * (a table appears or goes); or `shift`: positional names shift, so later
 * services' parts are written again, over nfnetlink with round-robin, and
 * with flow-hash, whose slot maps make the batch larger than one netlink
 * datagram, refused before it is sent and written with nft.
 */
function sequence(): { base: ForwardState; steps: Array<[string, ForwardState, 'netlink' | 'nft' | 'shift']> } {
  const six = (healthy: BackendSpec[]): ForwardState['services'][number] => ({ key: 'default/six', vip: 'fd00:98::50', ports: [http], healthy, backends: [b6('fd00:97::11'), b6('fd00:97::12')] });
  const base = many(6);
  const nine = base.services.filter((_, i) => i !== 2);
  // A service on svc-003's VIP whose port goes to the same backend:targetPort: the two share a VIP and a byte-counter key.
  const lodger: ForwardState['services'][number] = { ...base.services[3]!, key: 'default/svc-003b', ports: [{ ...http, port: 81 }] };
  const steps: Array<[string, ForwardState, 'netlink' | 'nft' | 'shift']> = [
      ['a backend of svc-004 unhealthy (its slots move to the others)', many(6, (i, all) => ({ healthy: i === 4 ? all.slice(1) : all, backends: all })), 'netlink'],
      ['every backend of svc-004 unhealthy: its ports refused', many(6, (i, all) => ({ healthy: i === 4 ? [] : all, backends: all })), 'netlink'],
      ['svc-004 healthy again', base, 'netlink'],
      ['a backend of svc-001 replaced (a reload): counters and byte-map elements', many(6, (i, all) => (i === 1 ? { healthy: [all[0]!, b('10.97.0.250')], backends: [all[0]!, b('10.97.0.250')] } : { healthy: all, backends: all })), 'netlink'],
      ['svc-001 as it was', base, 'netlink'],
      ['svc-002 removed: the positional names after it shift', { services: nine }, 'shift'],
      ['an IPv6 VIP comes', { services: [...nine, six([b6('fd00:97::11'), b6('fd00:97::12')])] }, 'nft'],
      ['a backend of the IPv6 VIP unhealthy', { services: [...nine, six([b6('fd00:97::12')])] }, 'netlink'],
      ['svc-002 comes back (and the IPv6 VIP goes)', base, 'nft'],
      ['a second service on svc-003\'s VIP', { services: [...base.services, lodger] }, 'shift'],
      ['svc-003 removed: the VIP and the shared byte key stay with the other', { services: [...base.services.filter((_, i) => i !== 3), lodger] }, 'shift'],
  ];
  return { base, steps };
}

if (requirePrivileged(t)) {
  const proc = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-nft-delta-proc-'));
  t.teardown(() => fs.rmSync(proc, { recursive: true, force: true }));
  // The sysctls the data path sets are not under test: it writes them here, not on the host.
  fs.mkdirSync(path.join(proc, 'sys/net/ipv4'), { recursive: true });
  fs.mkdirSync(path.join(proc, 'sys/net/ipv6/conf/all'), { recursive: true });
  fs.writeFileSync(path.join(proc, 'sys/net/ipv4/ip_forward'), '1\n');
  fs.writeFileSync(path.join(proc, 'sys/net/ipv6/conf/all/forwarding'), '1\n');

  /** A data path whose `nft` runs in `ns`, with what it ran recorded. */
  const dataplane = (ns: string, placement: Placement = 'round-robin') => {
    const writes: string[] = [];
    const runs: string[] = [];
    const exec: Exec = (file, args, input, hooks) => {
      runs.push(`${file} ${args.join(' ')}`);
      if (file === 'nft' && args[0] === '-f') writes.push(input ?? '');
      return execProgram('ip', ['netns', 'exec', ns, file, ...args], input, hooks);
    };
    const dp = new NftDataplane({ exec, procRoot: proc, registry: new Registry(), countersEveryMs: 3_600_000, placement });
    t.teardown(() => dp.stop({ keep: true }));
    return { dp, writes, runs };
  };

  /** Our tables in `ns`, canonical (no handles, no counter values, elements as sets); '' for one not there. */
  const tables = async (lab: Lab, ns: string): Promise<string> => {
    const out: string[] = [];
    for (const family of ['ip', 'ip6']) {
      const r = await lab.exec(ns, 'nft', ['-j', 'list', 'table', family, 'lb_agent'], { allowFail: true });
      out.push(r.code === 0 ? canonicalTableJson(r.stdout) : '');
    }
    return out.join('\n');
  };

  /** What the kernel holds when `state` is written whole into a fresh namespace. */
  const wholeIn = async (lab: Lab, ref: string, state: ForwardState, placement: Placement = 'round-robin'): Promise<string> => {
    await lab.exec(ref, 'nft', ['-f', '-'], { input: `${renderNft(state, { placement, ip6Removal: true }).script}` });
    return tables(lab, ref);
  };

  t.test('one backend of one service among 10 or 300: the same few-line transaction, no counter read, and the kernel holds the whole table\'s equal', async (t) => {
    const lab = await createLab(t);
    const ref = await lab.addHost('ref');
    const sent: string[] = [];
    for (const n of [10, 300]) {
      const ns = await lab.addHost(`n${n}`);
      const { dp, writes, runs } = dataplane(ns);
      await dp.apply(many(n));
      t.equal(writes.length, 1, `${n} services: the start writes the table whole`);
      t.match(writes[0], /\ntable ip lb_agent \{\n/);
      writes.length = 0;
      runs.length = 0;
      await dp.apply(many(n, swapOne));
      t.equal(writes.length, 1, `${n} services: one transaction for the change`);
      t.notMatch(writes[0], /table ip lb_agent|delete table ip /, 'not the table: neither defined nor deleted');
      t.notOk(runs.some((r) => r.includes('list')), `nothing read from the kernel first (${runs.join('; ')})`);
      sent.push(writes[0]!);
      t.equal(await tables(lab, ns), await wholeIn(lab, ref, many(n, swapOne)), `${n} services: the kernel holds what a write whole of the new state gives`);
    }
    t.equal(sent[1], sent[0], 'byte for byte the same transaction at 300 services as at 10');
    // Two ports of the service: per port the new backend's chain and counters
    // added, the old one's deleted (backends are named by address: no other
    // is renamed, nothing restarts that goes on counting), the slot chain
    // rewritten, and the byte-map elements of both.
    t.ok(sent[0]!.split('\n').length <= 30, `a few lines (${sent[0]!.split('\n').length - 1}, ${sent[0]!.length} bytes)`);
  });

  for (const placement of ['round-robin', 'flow-hash'] as const) t.test(`${placement}: any sequence of incremental updates leaves what a write whole gives; a refused one falls back to a write whole`, async (t) => {
    const lab = await createLab(t);
    const ref = await lab.addHost('ref');
    const ns = await lab.addHost('node');
    const { dp, writes } = dataplane(ns, placement);
    const { base, steps } = sequence();
    await dp.apply(base);
    for (const [what, state] of steps) {
      writes.length = 0;
      await dp.apply(state);
      t.equal(writes.length, 1, `${what}: one transaction`);
      t.notMatch(writes[0], /\ntable ip lb_agent \{\n|delete table ip lb_agent/, `${what}: the IPv4 table is not rewritten`);
      t.equal(await tables(lab, ns), await wholeIn(lab, ref, state, placement), `${what}: the kernel holds what a write whole gives`);
    }
    // Someone deletes the table: the next change's transaction names objects that are gone, the kernel refuses all of it, and the tables are written whole.
    t.equal((await lab.exec(ns, 'nft', ['delete', 'table', 'ip', 'lb_agent'])).code, 0, 'table deleted by hand');
    writes.length = 0;
    const last = many(6, (i, all) => ({ healthy: i === 5 ? all.slice(0, 2) : all, backends: all }));
    await dp.apply(last);
    t.equal(writes.length, 2, 'the refused transaction, then the write whole');
    t.match(writes[1], /\ntable ip lb_agent \{\n/, 'the second is the table whole');
    t.equal(await tables(lab, ns), await wholeIn(lab, ref, last, placement), 'the kernel holds the new state whole');
    t.same((await dp.stats()).problems, [], 'the fallback succeeded: no problem left in status');
  });

  t.test('counters over nfnetlink: a dump of 3,000 counters (many datagrams) reads what `nft list counters` does; a table not there reads empty', async (t) => {
    const lab = await createLab(t);
    const ns = await lab.addHost('node');
    const decls = Array.from({ length: 3000 }, (_, i) => `\tcounter c${i} { packets ${i * 7} bytes ${i * 7 * 1500 + 2 ** 33}; }`);
    const script = `table ip lb_agent {\n${decls.join('\n')}\n}\ntable ip other {\n\tcounter c1 { packets 1 bytes 1; }\n}\n`;
    t.equal((await lab.exec(ns, 'nft', ['-f', '-'], { input: script })).code, 0);
    const reader = require.resolve('../../agent/net/netlink/nft-counters');
    const js = `const { NftCounterReader } = require(${JSON.stringify(reader)});
      const r = new NftCounterReader(); const keep = setInterval(() => {}, 1000);
      Promise.all([r.read('ip', 'lb_agent'), r.read('ip6', 'lb_agent'), r.read('netdev', 'lb_agent')])
        .then(([a, b, c]) => { console.log(JSON.stringify([[...a], b.size, c.size])); r.close(); clearInterval(keep); });`;
    const out = await lab.exec(ns, process.execPath, ['-e', js]);
    const [read, six, netdev] = JSON.parse(out.stdout) as [Array<[string, { packets: number; bytes: number }]>, number, number];
    const listed = parseNftCounters((await lab.exec(ns, 'nft', ['-j', 'list', 'counters', 'table', 'ip', 'lb_agent'])).stdout);
    t.equal(read.length, 3000, 'every counter of the table, none of another table');
    t.same(new Map(read), listed, 'the same names and values as nft lists');
    t.same([six, netdev], [0, 0], 'tables not there: nothing');

    // Read while commits change the table: each one deletes and adds c0 in one
    // transaction, so it moves to the end of the table's list and a dump
    // resumed across it would skip or repeat a counter. An interrupted dump
    // (NLM_F_DUMP_INTR) is done again: every read is whole, and the reads go
    // on until one was done again (at most 300 reads; the commits end with them).
    const commit = 'delete counter ip lb_agent c0\nadd counter ip lb_agent c0 { packets 0 bytes 8589934592 }\n';
    const churn = lab.spawn(ns, 'sh', ['-c', `i=0; while [ $i -lt 3000 ]; do printf '${commit.replace(/\n/g, '\\n')}' | nft -f - || exit 1; sleep 0.02; i=$((i+1)); done`]);
    const churned = new Promise((r) => churn.once('exit', r));
    t.teardown(() => { churn.kill(); });
    const js2 = `const { NftCounterReader } = require(${JSON.stringify(reader)});
      const r = new NftCounterReader(); const keep = setInterval(() => {}, 1000);
      (async () => {
        const bad = []; let reads = 0;
        for (; reads < 300 && (reads < 20 || r.retries === 0); reads++) {
          const m = await r.read('ip', 'lb_agent');
          let ok = m.size === 3000;
          for (let i = 0; ok && i < 3000; i++) { const c = m.get('c' + i); ok = c !== undefined && c.packets === i * 7 && c.bytes === i * 7 * 1500 + 2 ** 33; }
          if (!ok) bad.push(m.size);
        }
        console.log(JSON.stringify({ reads, retries: r.retries, bad })); r.close(); clearInterval(keep);
      })().catch((e) => { console.log(JSON.stringify({ error: String(e) })); process.exit(1); });`;
    const res = JSON.parse((await lab.exec(ns, process.execPath, ['-e', js2])).stdout) as { reads: number; retries: number; bad: number[]; error?: string };
    t.equal(churn.exitCode, null, 'the commits went on throughout');
    churn.kill();
    await churned;
    t.equal(res.error, undefined, 'no read failed');
    t.same(res.bad, [], `every one of ${res.reads} reads under commits held the 3,000 counters and their values`);
    t.ok(res.retries > 0, `dumps the commits interrupted were done again (${res.retries} of ${res.reads} reads)`);
  });

  for (const placement of ['round-robin', 'flow-hash'] as const) t.test(`inside the namespace, ${placement}: health transitions and reloads as nfnetlink batches, no nft, the agent's own commits; the kernel holds what a write whole gives; a refused batch applies nothing`, async (t) => {
    const lab = await createLab(t);
    const ref = await lab.addHost('ref');
    const ns = await lab.addHost('node');
    const driver = path.join(__dirname, 'fixtures', 'nft-delta-driver.js');
    const child = lab.spawn(ns, process.execPath, [driver, proc, placement], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => { stderr += d.toString(); });
    const lines = readline.createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    type Applied = { nft: string[]; deltaWrites: { netlink: number; nft: number; unencoded: number; netlinkFailed: number }; commits: Array<{ ours: boolean; oursByPort: boolean }> };
    const ask = async <R>(cmd: Record<string, unknown>): Promise<R> => {
      child.stdin!.write(`${JSON.stringify(cmd)}\n`);
      const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
      const r = await lines.next();
      clearTimeout(timer);
      if (r.done) throw new Error(`the driver ended: ${stderr}`);
      return JSON.parse(r.value) as R;
    };
    const { base, steps } = sequence();
    const first = await ask<Applied>({ cmd: 'apply', state: base });
    t.equal(first.nft.length, 1, 'the start writes the tables whole with nft');
    let netlink = 0;
    let unencoded = 0;
    let tooLarge = 0;
    let prev = base;
    for (const [what, state, how] of steps) {
      // A shift rewrites the slots of every service after the one that went: with the flow hash's 1,021 slots a port that can outgrow a datagram.
      const bytes = (): number => encodeBatch('lb_agent', renderNftDelta(renderNft(prev, { placement }), renderNft(state, { placement }))!.ops!, { seq: 0, ack: true }).datagram.length;
      const large = how === 'shift' && bytes() > MAX_BATCH_BYTES;
      prev = state;
      const r = await ask<Applied>({ cmd: 'apply', state });
      if (large) {
        tooLarge++;
        t.equal(r.deltaWrites.netlinkFailed, tooLarge, `${what}: a batch larger than a datagram, refused before it is sent, counted`);
        t.equal(r.nft.length, 1, `${what}: and written with nft once`);
        t.notMatch(r.nft[0], /\ntable ip lb_agent \{\n|delete table ip lb_agent/, `${what}: not the table`);
      } else if (how !== 'nft') {
        netlink++;
        t.same(r.nft, [], `${what}: no nft spawned`);
        t.equal(r.deltaWrites.netlink, netlink, `${what}: one netlink batch`);
        t.ok(r.commits.length >= 1 && r.commits.every((c) => c.ours), `${what}: its commit is the agent's own to the drift guard (${JSON.stringify(r.commits)})`);
        // In a container the commit's pid is not the one the agent knows itself by: its socket's port alone must do.
        t.ok(r.commits.every((c) => c.oursByPort), `${what}: known by the batch socket's port alone`);
      } else {
        t.equal(r.nft.length, 1, `${what}: a table appearing or going goes to nft once`);
        unencoded++;
        t.equal(r.deltaWrites.unencoded, unencoded, `${what}: counted as a delta the writer does not encode`);
        t.notMatch(r.nft[0], /\ntable ip lb_agent \{\n|delete table ip lb_agent/, `${what}: and it is not the table`);
      }
      t.equal(await tables(lab, ns), await wholeIn(lab, ref, state, placement), `${what}: the kernel holds what a write whole gives`);
    }
    if (placement === 'flow-hash') t.ok(tooLarge > 0, `a shift outgrew a datagram (${tooLarge} of them)`);
    const last = steps[steps.length - 1]![1];
    // svc-005's ports leave the dispatch map when its backends all go; someone deleted its element by hand first.
    const down: ForwardState = { services: last.services.map((s) => (s.key === 'default/svc-005' ? { ...s, healthy: [] } : s)) };
    t.equal((await lab.exec(ns, 'nft', ['delete', 'element', 'ip', 'lb_agent', 'services', '{ 10.98.0.5 . tcp . 80 }'])).code, 0, 'element deleted by hand');
    const before = await tables(lab, ns);
    const refused = await ask<{ ops: number; error?: string; errno?: number }>({ cmd: 'batch', from: last, to: down });
    t.ok(refused.ops > 2, `a batch of ${refused.ops} steps`);
    t.match(refused.error, /refused the nftables batch at delete element ip services \{ 10\.98\.0\.5 \. tcp \. 80, 10\.98\.0\.5 \. udp \. 53 \}: errno 2 \(ENOENT\); nothing of it applied/, 'refused, naming the step');
    t.equal(await tables(lab, ns), before, 'nothing of it applied: the chains it flushed before the refused step are as they were');
    const r = await ask<Applied>({ cmd: 'apply', state: down });
    t.equal(r.deltaWrites.netlinkFailed, tooLarge + 1, 'the data path\'s batch refused too, and counted');
    t.equal(r.nft.length, 2, 'then nft: the same delta (refused as well), then the tables whole');
    t.match(r.nft[1], /\ntable ip lb_agent \{\n/);
    t.equal(await tables(lab, ns), await wholeIn(lab, ref, down, placement), 'the kernel holds the new state whole');
    child.stdin!.end();
  });
}
