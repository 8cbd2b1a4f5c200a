// nat-layout.ts: the header parser and the encode/decode of map entries.
// The offsets it computes are checked against clang's own layout of
// native/bpf/nat.h for the BPF target (static assertions compiled by clang),
// so the TypeScript side and the program cannot disagree unnoticed.
import t from 'tap';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { CLayout, natHeaderPath, natLayout, parseCHeader } from '../../../agent/net/ebpf/nat-layout';

const clang = (() => { try { execFileSync('clang', ['--version'], { stdio: 'ignore' }); return true; } catch { return false; } })();

t.test('the header parses into the structs the program uses', async (t) => {
  const l = natLayout();
  const sizes = Object.fromEntries([...l.header.structs.values()].map((s) => [s.name, s.size]));
  t.same(sizes, {
    lbn_svc_key: 8, lbn_svc: 16, lbn_slot: 8, lbn_member_key: 12, lbn_member: 8,
    lbn_way: 32, lbn_flow_key: 16, lbn_flow: 56,
    lbn_svc_key6: 20, lbn_slot6: 20, lbn_member_key6: 36, lbn_flow_key6: 40, lbn_flow6: 72,
    lbn_counter: 40, lbn_config: 32,
  });
  t.equal(l.constant('LBN_EV_COUNT'), 13);
  t.equal(l.struct('lbn_flow6').fields.find((f) => f.name === 'seen_ns')?.offset, 32, 'the IPv6 entry\'s u64 after explicit padding at 32');
  t.equal(l.constant('LBN_PORT_TRIES'), 8);
  t.equal(l.struct('lbn_flow').fields.find((f) => f.name === 'seen_ns')?.offset, 16, 'a u64 after four u32s sits at 16');
  // The way out is one struct both families' entries end with, where its fields lay before (pinned flow maps keep their layout).
  t.same(['lbn_flow', 'lbn_flow6'].map((n) => l.struct(n).fields.find((f) => f.name === 'way')), [
    { name: 'way', offset: 24, size: 32, count: 1, struct: 'lbn_way' }, { name: 'way', offset: 40, size: 32, count: 1, struct: 'lbn_way' }]);
});

t.test('every offset and size matches clang\'s layout for the BPF target', { skip: clang ? false : 'clang is not installed (scripts/setup.sh installs it)' }, async (t) => {
  const l = natLayout();
  const asserts: string[] = [];
  for (const s of l.header.structs.values()) {
    asserts.push(`_Static_assert(sizeof(struct ${s.name}) == ${s.size}, "size of ${s.name}");`);
    for (const f of s.fields) asserts.push(`_Static_assert(__builtin_offsetof(struct ${s.name}, ${f.name}) == ${f.offset}, "${s.name}.${f.name}");`);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'natlayout-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'check.c');
  fs.writeFileSync(file, `#include "${natHeaderPath()}"\n${asserts.join('\n')}\n`);
  const triple = execFileSync('g++', ['-dumpmachine']).toString().trim();
  execFileSync('clang', ['-target', 'bpf', `-I/usr/include/${triple}`, '-fsyntax-only', file]);
  t.pass(`${asserts.length} static assertions held`);
});

t.test('encode and decode by field name; network-order fields as bytes', async (t) => {
  const l = natLayout();
  const key = l.encode('lbn_member_key', { svc: { vip: Buffer.from([10, 99, 0, 50]), port: Buffer.from([0, 80]), proto: 6 }, backend: Buffer.from([10, 99, 0, 11]) });
  t.same([...key], [10, 99, 0, 50, 0, 80, 6, 0, 10, 99, 0, 11]);
  const vip6 = Buffer.from('fd000099000000000000000000000050', 'hex');
  const be6 = Buffer.from('fd000099000000000000000000000011', 'hex');
  const key6 = l.encode('lbn_member_key6', { svc: { vip: vip6, port: Buffer.from([0, 80]), proto: 17 }, backend: be6 });
  t.same(key6, Buffer.concat([vip6, Buffer.from([0, 80, 17, 0]), be6]), 'the IPv6 member key: 16 address bytes as the wire has them, port, protocol, pad, backend');
  t.same(l.decode('lbn_slot6', l.encode('lbn_slot6', { backend: be6, counter: 7 })), { backend: be6, counter: 7 });
  const cfg = l.encode('lbn_config', { tcp_idle_ns: 7200n * 1_000_000_000n, port_min: 61001, port_count: 4535 });
  const back = l.decode('lbn_config', cfg);
  t.equal(back['tcp_idle_ns'], 7200n * 1_000_000_000n);
  t.equal(back['port_min'], 61001);
  t.equal(back['port_count'], 4535);
  t.throws(() => l.encode('lbn_slot', { backend: 1, nope: 2 }), /struct lbn_slot has no field nope/);
  t.throws(() => l.struct('lbn_nothing'), /nat.h has no struct lbn_nothing/);
});

t.test('the parser refuses what it cannot lay out, naming it', async (t) => {
  t.throws(() => parseCHeader('struct a { int x; };'), /struct a: "int" is not a fixed-width type/);
  t.throws(() => parseCHeader('struct a { struct b x; };'), /struct b is not defined before it/);
  t.throws(() => parseCHeader('struct a { __u8 x[N]; };'), /unknown array size N/);
  const h = new CLayout(parseCHeader('/* c */ #define W 3\nstruct p { __u8 a; __u32 b; __u8 c[W]; };\nenum e { A, B = 5, C };'));
  t.same(h.struct('p').fields.map((f) => [f.name, f.offset]), [['a', 0], ['b', 4], ['c', 8]]);
  t.equal(h.size('p'), 12, 'rounded up to the struct\'s alignment');
  t.same([h.constant('A'), h.constant('B'), h.constant('C')], [0, 5, 6]);
});
