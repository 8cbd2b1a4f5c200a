// Privileged: the DSR program against the real kernel (issue 17). The
// verifier accepts it; for 300 client ports it picks the backend that nft's
// jhash and the maglev slot table pick (BPF_PROG_TEST_RUN, counters read back
// after each frame), and nft's jhash is the model's (real connections in a
// throwaway namespace); frames for another port, MAC or a fragment pass
// (TCX_NEXT); per-flow state keeps an open flow on its backend across a new
// plan while that backend is healthy; tcx attach, replace by a later process
// (which adopts the flow map), detach, with a foreign program on the same
// hook left alone; the probe passes here. ~1 s.
import t, { type Test } from 'tap';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { distPath } from '../../lab/services';
import {
  BACKEND_KEY_SIZE, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_PROG_TYPE_SCHED_CLS, COUNTER_VALUE_SIZE, DSR_PROG_NAME,
  FLOW_KEY_SIZE, FLOW_VALUE_SIZE, SLOT_VALUE_SIZE, TCX_NEXT, TC_ACT_REDIRECT, dsrMaps, dsrProgram, nftJhashSlot, type DsrBpfPort,
  BACKEND6_KEY_SIZE, FLOW6_KEY_SIZE, FLOW6_VALUE_SIZE, SLOT6_VALUE_SIZE, nftJhashSlot6,
} from '../../agent/net/ebpf/ebpf-dsr';
import type { NativeBpf } from '../../agent/native/native';
import { DsrBpf } from '../../agent/net/ebpf/ebpf-attach';
import { nativeBpf } from '../../agent/native/native';

const CLIENT = 0x0a000003;
const PLAN: DsrBpfPort = {
  mac: '02:00:00:00:00:01', vip: '10.0.0.100', protocol: 'TCP', port: 80, seed: 0x5eed5eed,
  // An uneven table so that a wrong hash shows: 1021 slots, backend i holds runs of i + 1.
  slots: Array.from({ length: 1021 }, (_, i) => [0, 1, 1, 2, 2, 2][i % 6]!),
  backends: ['10.0.0.11', '10.0.0.12', '10.0.0.13'].map((address, i) => ({ address, conns: `b${i}_conns`, toBackend: `b${i}_to_backend` })),
};

function frame(o: { sport: number; dport?: number; flags?: number; mac?: number; frag?: number }): Buffer {
  const f = Buffer.alloc(14 + 20 + 20);
  Buffer.from([2, 0, 0, 0, 0, o.mac ?? 1]).copy(f, 0);
  Buffer.from([2, 0, 0, 0, 0, 9]).copy(f, 6);
  f.writeUInt16BE(0x0800, 12);
  f[14] = 0x45;
  f.writeUInt16BE(40, 16);
  f.writeUInt16BE(o.frag ?? 0, 20);
  f[22] = 64;
  f[23] = 6;
  f.writeUInt32BE(CLIENT, 26);
  Buffer.from([10, 0, 0, 100]).copy(f, 30);
  f.writeUInt16BE(o.sport, 34);
  f.writeUInt16BE(o.dport ?? 80, 36);
  f[47] = o.flags ?? 0x02;
  return f;
}

const CLIENT6 = Buffer.from('20010db8000000000000000000000003', 'hex');
const PLAN6: DsrBpfPort = {
  ...PLAN, vip: '2001:db8::100',
  backends: ['2001:db8::11', '2001:db8::12', '2001:db8::13'].map((address, i) => ({ address, conns: `b${i}_conns`, toBackend: `b${i}_to_backend` })),
};

/**
 * An IPv6 TCP frame from CLIENT6 to PLAN6's VIP; `ext` puts an extension
 * header (its next header value: 0 hop-by-hop, 44 fragment) before TCP.
 */
function frame6(o: { sport: number; dport?: number; flags?: number; mac?: number; vip?: string; ext?: number; next?: number }): Buffer {
  const ext = o.ext === undefined ? Buffer.alloc(0) : Buffer.from([6, 0, 0, 0, 0, 0, 0, 0]);
  const f = Buffer.alloc(14 + 40 + ext.length + 20);
  Buffer.from([2, 0, 0, 0, 0, o.mac ?? 1]).copy(f, 0);
  Buffer.from([2, 0, 0, 0, 0, 9]).copy(f, 6);
  f.writeUInt16BE(0x86dd, 12);
  f[14] = 0x60;
  f.writeUInt16BE(ext.length + 20, 18);
  f[20] = o.ext ?? o.next ?? 6;
  f[21] = 64;
  CLIENT6.copy(f, 22);
  Buffer.from(o.vip ?? '20010db8000000000000000000000100', 'hex').copy(f, 38);
  ext.copy(f, 54);
  const l4 = 54 + ext.length;
  f.writeUInt16BE(o.sport, l4);
  f.writeUInt16BE(o.dport ?? 80, l4 + 2);
  f[l4 + 13] = o.flags ?? 0x02;
  return f;
}

const key = (k: number): Buffer => { const b = Buffer.alloc(4); b.writeUInt32LE(k); return b; };

/** The IPv6 maps (slots6, backends6) for `plan`, filled; the IPv4 ones empty. */
function loadPlan6(bpf: NativeBpf, plan: DsrBpfPort, flows: number, flows6: number, fds: number[]): { prog: number; counters: number } {
  const maps = dsrMaps([plan]);
  const mk = (type: number, k: number, v: number, n: number, name: string): number => { const fd = bpf.bpfMapCreate(type, k, v, n, name); fds.push(fd); return fd; };
  const slots = mk(BPF_MAP_TYPE_ARRAY, 4, SLOT_VALUE_SIZE, 1, 'test_slots');
  const backends = mk(BPF_MAP_TYPE_HASH, BACKEND_KEY_SIZE, SLOT_VALUE_SIZE, 1, 'test_backends');
  const counters = mk(BPF_MAP_TYPE_ARRAY, 4, COUNTER_VALUE_SIZE, maps.counters.length, 'test_counters');
  const slots6 = mk(BPF_MAP_TYPE_ARRAY, 4, SLOT6_VALUE_SIZE, maps.slots6.length, 'test_slots6');
  const backends6 = mk(BPF_MAP_TYPE_HASH, BACKEND6_KEY_SIZE, SLOT6_VALUE_SIZE, maps.backends6.length, 'test_backends6');
  maps.slots6.forEach((v, k) => bpf.bpfMapUpdate(slots6, key(k), v, 0));
  for (const b of maps.backends6) bpf.bpfMapUpdate(backends6, b.key, b.value, 0);
  const prog = bpf.bpfProgLoad(BPF_PROG_TYPE_SCHED_CLS, dsrProgram([plan], { slots, counters, flows, backends, slots6, flows6, backends6 }), 'GPL', DSR_PROG_NAME, 1 << 20);
  fds.push(prog);
  return { prog, counters };
}

/** Load the program for `plan` on the flow map `flows`, its other maps filled; every descriptor into `fds`. */
function loadPlan(bpf: NativeBpf, plan: DsrBpfPort, flows: number, fds: number[]): { prog: number; counters: number } {
  const maps = dsrMaps([plan]);
  const slots = bpf.bpfMapCreate(BPF_MAP_TYPE_ARRAY, 4, SLOT_VALUE_SIZE, maps.slots.length, 'test_slots');
  fds.push(slots);
  const counters = bpf.bpfMapCreate(BPF_MAP_TYPE_ARRAY, 4, COUNTER_VALUE_SIZE, maps.counters.length, 'test_counters');
  fds.push(counters);
  const backends = bpf.bpfMapCreate(BPF_MAP_TYPE_HASH, BACKEND_KEY_SIZE, SLOT_VALUE_SIZE, maps.backends.length, 'test_backends');
  fds.push(backends);
  maps.slots.forEach((v, k) => bpf.bpfMapUpdate(slots, key(k), v, 0));
  for (const b of maps.backends) bpf.bpfMapUpdate(backends, b.key, b.value, 0);
  const prog = bpf.bpfProgLoad(BPF_PROG_TYPE_SCHED_CLS, dsrProgram([plan], { slots, counters, flows, backends }), 'GPL', DSR_PROG_NAME, 1 << 20);
  fds.push(prog);
  return { prog, counters };
}

/** Run one frame through `prog`; the address of the backend whose packet counter moved (undefined: none). */
function placed(bpf: NativeBpf, plan: DsrBpfPort, l: { prog: number; counters: number }, f: Buffer): string | undefined {
  const value = Buffer.alloc(COUNTER_VALUE_SIZE);
  const packets = (): bigint[] => plan.backends.map((_, i) => { bpf.bpfMapLookup(l.counters, key(i), value); return value.readBigUInt64LE(8); });
  const before = packets();
  bpf.bpfProgTestRun(l.prog, f, Buffer.alloc(256), 1);
  const after = packets();
  return plan.backends[after.findIndex((c, i) => c > before[i]!)]?.address;
}

/** The addon's bpf calls, a flow map, and the list of descriptors the test's teardown closes. */
function setup(t: Test): { bpf: NativeBpf; fds: number[]; flows: number } {
  const bpf = nativeBpf();
  if (typeof bpf === 'string') throw new Error(bpf);
  const fds: number[] = [];
  t.teardown(() => { for (const fd of fds) fs.closeSync(fd); });
  const flows = bpf.bpfMapCreate(BPF_MAP_TYPE_LRU_HASH, FLOW_KEY_SIZE, FLOW_VALUE_SIZE, 4096, 'test_flows');
  fds.push(flows);
  return { bpf, fds, flows };
}

if (requirePrivileged(t)) {
  t.test('the program picks what nft picks, counts per backend, and passes what is not its own', async (t) => {
    const { bpf, fds, flows } = setup(t);
    const { prog, counters } = loadPlan(bpf, PLAN, flows, fds);
    t.equal(bpf.bpfProgInfo(prog).name, DSR_PROG_NAME, 'the verifier accepted it, under our name');
    const value = Buffer.alloc(COUNTER_VALUE_SIZE);
    const read = (): bigint[][] => PLAN.backends.map((_, i) => {
      bpf.bpfMapLookup(counters, key(i), value);
      return [value.readBigUInt64LE(0), value.readBigUInt64LE(8), value.readBigUInt64LE(16)];
    });
    const out = Buffer.alloc(256);
    let wrong = 0;
    let verdicts = 0;
    for (let sport = 40000; sport < 40300; sport++) {
      const before = read();
      const r = bpf.bpfProgTestRun(prog, frame({ sport }), out, 1);
      if (r.retval === TC_ACT_REDIRECT) verdicts++;
      const after = read();
      const moved = after.findIndex((c, i) => c[1]! > before[i]![1]!);
      if (moved !== PLAN.slots[nftJhashSlot(CLIENT, sport, PLAN.seed, 1021)]) wrong++;
    }
    t.equal(verdicts, 300, 'every frame for the VIP port redirected');
    t.equal(wrong, 0, 'every frame counted on the backend nft\'s jhash and the slot table name');
    const total = read();
    t.same(total.reduce((a, c) => a + c[0]!, 0n), 300n, 'SYNs counted as connections');
    t.same(total.reduce((a, c) => a + c[2]!, 0n), 300n * 40n, 'bytes from the IP header on (40 a frame, as nft counts at netdev ingress)');
    bpf.bpfProgTestRun(prog, frame({ sport: 40000, flags: 0x10 }), out, 1);
    t.same(read().reduce((a, c) => a + c[0]!, 0n), 300n, 'an ACK is not a connection');
    for (const [what, f] of [['another port', frame({ sport: 1, dport: 81 })], ['another MAC', frame({ sport: 1, mac: 2 })], ['a fragment', frame({ sport: 1, frag: 0x2000 })], ['a runt (no ports)', frame({ sport: 1 }).subarray(0, 36)]] as const) {
      t.equal(bpf.bpfProgTestRun(prog, Buffer.from(f), out, 1).retval | 0, TCX_NEXT, `${what}: no verdict (TCX_NEXT): on to later tc programs, nft and the stack`);
    }
  });

  t.test('per-flow state: an open connection keeps its backend across a new plan while that backend is healthy; a SYN and a departed backend re-place', async (t) => {
    const { bpf, fds, flows } = setup(t);
    const backend = (address: string, i: number): DsrBpfPort['backends'][number] => ({ address, conns: `b${i}_conns`, toBackend: `b${i}_to_backend` });
    // A reload adds a fourth backend (a new table), then one removes the second.
    const added: DsrBpfPort = { ...PLAN, slots: Array.from({ length: 1021 }, (_, i) => [3, 0, 1, 2, 3][i % 5]!), backends: ['10.0.0.11', '10.0.0.12', '10.0.0.13', '10.0.0.14'].map(backend) };
    const removed: DsrBpfPort = { ...PLAN, slots: Array.from({ length: 1021 }, (_, i) => [0, 1, 2][i % 3]!), backends: ['10.0.0.11', '10.0.0.13', '10.0.0.14'].map(backend) };
    const hashed = (plan: DsrBpfPort, sport: number): string => plan.backends[plan.slots[nftJhashSlot(CLIENT, sport, plan.seed, 1021)]!]!.address;
    const first = loadPlan(bpf, PLAN, flows, fds);
    const opened = new Map<number, string>();
    for (let sport = 41000; sport < 41200; sport++) opened.set(sport, placed(bpf, PLAN, first, frame({ sport }))!);
    t.ok([...opened].every(([sport, b]) => b === hashed(PLAN, sport)), 'the SYNs go where the hash points');

    const second = loadPlan(bpf, added, flows, fds);
    let moved = 0;
    let stayed = 0;
    for (const [sport, b] of opened) {
      if (hashed(added, sport) !== b) moved++;
      if (placed(bpf, added, second, frame({ sport, flags: 0x10 })) === b) stayed++;
    }
    t.ok(moved > 100, `the new table alone would move ${moved} of 200 open flows`);
    t.equal(stayed, 200, 'every open flow (an ACK) stays on its backend under the new plan');
    t.equal(placed(bpf, added, second, frame({ sport: 41999, flags: 0x10 })), hashed(added, 41999), 'a flow never seen (mid-stream, e.g. after a failover) goes by the hash');
    let reopened = 0;
    for (let sport = 41000; sport < 41020; sport++) if (placed(bpf, added, second, frame({ sport })) === hashed(added, sport)) reopened++;
    t.equal(reopened, 20, 'a SYN (a new connection on a port reused) is placed by the hash of the new plan');

    const third = loadPlan(bpf, removed, flows, fds);
    let left = 0;
    let wrong = 0;
    for (const [sport, b] of opened) {
      if (sport < 41020) continue; // re-placed above
      const now = placed(bpf, removed, third, frame({ sport, flags: 0x10 }));
      if (b === '10.0.0.12') { left++; if (now !== hashed(removed, sport)) wrong++; } else if (now !== b) wrong++;
    }
    t.ok(left > 20, `${left} open flows were on the backend that left`);
    t.equal(wrong, 0, 'the flows on the departed backend go by the hash; every other flow stays');
  });

  t.test('nft\'s jhash is the model\'s; tcx attach, replace, detach; a foreign program is left alone; the probe passes', async (t) => {
    const r = await new Promise<{ stdout: string; stderr: string }>((resolve, reject) => {
      execFile('unshare', ['-n', process.execPath, distPath('test', 'privileged', 'fixtures', 'ebpf-netns.js')], { timeout: 20_000 }, (err, stdout, stderr) => (err ? reject(Object.assign(err as Error, { stderr })) : resolve({ stdout, stderr })));
    });
    const seen = JSON.parse(r.stdout) as Record<string, unknown>;
    t.equal(seen['nftMatches'], seen['nftPorts'], `nft's jhash equals the model for all ${String(seen['nftPorts'])} source ports`);
    t.equal(seen['nft6Matches'], seen['nftPorts'], `nft's jhash of ip6 saddr . th sport equals the model's (nftJhashSlot6) for all ${String(seen['nftPorts'])} source ports`);
    t.same([seen['first'], seen['second'], seen['replaced']], [1, 1, true], 'the second apply replaced the first program: one of ours');
    t.equal(seen['totalAttached'], 2, 'ours and the foreign one');
    t.equal(seen['afterLater'], 1, 'a later process replaced ours, still one');
    t.same([seen['flowMapFound'], seen['flowMapKeptAcrossApply'], seen['flowMapAdoptedByLater']], [true, true, true],
      'one flow map: the second plan\'s program uses the first one\'s, and a later process adopts it');
    t.same([seen['flowMap6Found'], seen['flowMap6KeptAcrossApply'], seen['flowMap6AdoptedByLater']], [true, true, true],
      'the same for the IPv6 flow map of a dual-stack plan');
    t.same([seen['afterDetach'], seen['foreignLeft']], [0, 1], 'detach took ours only');
    t.equal(seen['probe'], 'ok');
    t.same(seen['unitApplies'], ['none', 'own', 'own'], 'with the unit\'s capabilities (no program opens by id): each later apply replaces the process\'s own program');
    t.equal(seen['unitAttachedAfterApplies'], 1, 'so one program after three applies, not three');
    t.same(seen['unitLater'], { replaced: 'none', unreadable: 1 }, 'a later process without the fd store attaches beside it, and knows there is one it cannot open (the daemon warns)');
    t.equal(seen['unitDetachedOwn'], 1, 'detach takes off its own program by its descriptor; the earlier one is left for withdraw (as root)');
  });

  t.test('IPv6: the program picks what nft picks, counts per backend, passes extension headers, fragments and what is not its own; per-flow state', async (t) => {
    const { bpf, fds, flows } = setup(t);
    const flows6 = bpf.bpfMapCreate(BPF_MAP_TYPE_LRU_HASH, FLOW6_KEY_SIZE, FLOW6_VALUE_SIZE, 4096, 'test_flows6');
    fds.push(flows6);
    const l = loadPlan6(bpf, PLAN6, flows, flows6, fds);
    const value = Buffer.alloc(COUNTER_VALUE_SIZE);
    const read = (): bigint[][] => PLAN6.backends.map((_, i) => {
      bpf.bpfMapLookup(l.counters, key(i), value);
      return [value.readBigUInt64LE(0), value.readBigUInt64LE(8), value.readBigUInt64LE(16)];
    });
    const out = Buffer.alloc(256);
    const hashed = (plan: DsrBpfPort, sport: number): string => plan.backends[plan.slots[nftJhashSlot6(CLIENT6, sport, plan.seed, 1021)]!]!.address;
    let wrong = 0;
    let verdicts = 0;
    for (let sport = 40000; sport < 40300; sport++) {
      const before = read();
      if (bpf.bpfProgTestRun(l.prog, frame6({ sport }), out, 1).retval === TC_ACT_REDIRECT) verdicts++;
      const moved = read().findIndex((c, i) => c[1]! > before[i]![1]!);
      if (PLAN6.backends[moved]?.address !== hashed(PLAN6, sport)) wrong++;
    }
    t.equal(verdicts, 300, 'every frame for the IPv6 VIP port redirected (bpf_redirect_neigh, AF_INET6 nexthop)');
    t.equal(wrong, 0, 'every frame counted on the backend nft\'s jhash of ip6 saddr . th sport and the slot table name');
    const total = read();
    t.ok(total.every((c) => c[1]! > 20n), `each backend took its share of the uneven table (1:2:3): ${total.map((c) => c[1]).join(', ')} frames`);
    t.same(total.reduce((a, c) => a + c[0]!, 0n), 300n, 'SYNs counted as connections');
    t.same(total.reduce((a, c) => a + c[2]!, 0n), 300n * 60n, 'bytes from the IPv6 header on (60 a frame)');
    for (const [what, f] of [
      ['another port', frame6({ sport: 1, dport: 81 })], ['another MAC', frame6({ sport: 1, mac: 2 })],
      ['another VIP (the last word differs)', frame6({ sport: 1, vip: '20010db8000000000000000000000101' })],
      ['another VIP (the first word differs)', frame6({ sport: 1, vip: '20010db9000000000000000000000100' })],
      ['a hop-by-hop extension header', frame6({ sport: 1, ext: 0 })], ['a fragment header', frame6({ sport: 1, ext: 44 })],
      ['UDP to the TCP port', frame6({ sport: 1, next: 17 })], ['a runt (no ports)', frame6({ sport: 1 }).subarray(0, 56)],
      ['an IPv4 frame', frame({ sport: 1 })],
    ] as const) {
      t.equal(bpf.bpfProgTestRun(l.prog, Buffer.from(f), out, 1).retval | 0, TCX_NEXT, `${what}: no verdict (TCX_NEXT): on to the nft table and the stack`);
    }
    t.same(read(), total, 'nothing passed on was counted');

    // Per-flow state: a new plan adds a fourth backend; open flows stay, a SYN re-places.
    const backend = (address: string, i: number): DsrBpfPort['backends'][number] => ({ address, conns: `b${i}_conns`, toBackend: `b${i}_to_backend` });
    const added: DsrBpfPort = { ...PLAN6, slots: Array.from({ length: 1021 }, (_, i) => [3, 0, 1, 2, 3][i % 5]!), backends: ['2001:db8::11', '2001:db8::12', '2001:db8::13', '2001:db8::14'].map(backend) };
    const removed: DsrBpfPort = { ...PLAN6, slots: Array.from({ length: 1021 }, (_, i) => [0, 1, 2][i % 3]!), backends: ['2001:db8::11', '2001:db8::13', '2001:db8::14'].map(backend) };
    const second = loadPlan6(bpf, added, flows, flows6, fds);
    let moved = 0;
    let stayed = 0;
    for (let sport = 40000; sport < 40100; sport++) {
      const was = hashed(PLAN6, sport);
      if (hashed(added, sport) !== was) moved++;
      if (placed(bpf, added, second, frame6({ sport, flags: 0x10 })) === was) stayed++;
    }
    t.ok(moved > 50, `the new table alone would move ${moved} of 100 open flows`);
    t.equal(stayed, 100, 'every open IPv6 flow (an ACK) stays on its backend under the new plan');
    t.equal(placed(bpf, added, second, frame6({ sport: 40000 })), hashed(added, 40000), 'a SYN is placed by the hash of the new plan');
    const third = loadPlan6(bpf, removed, flows, flows6, fds);
    let left = 0;
    wrong = 0;
    for (let sport = 40001; sport < 40100; sport++) {
      const was = hashed(PLAN6, sport);
      const now = placed(bpf, removed, third, frame6({ sport, flags: 0x10 }));
      if (was === '2001:db8::12') { left++; if (now !== hashed(removed, sport)) wrong++; } else if (now !== was) wrong++;
    }
    t.ok(left > 10, `${left} open flows were on the backend that left`);
    t.equal(wrong, 0, 'the flows on the departed backend go by the hash; every other flow stays');
  });

  t.test('a plan the program cannot be built from is an LB_ERR_FORWARD_DSR_BPF, with nothing attached', async (t) => {
    const d = new DsrBpf({ device: 'lo' });
    t.throws(() => d.apply([{ ...PLAN, mac: 'zz' }]), { code: 'LB_ERR_FORWARD_DSR_BPF' });
    t.notOk(d.active);
  });
}
