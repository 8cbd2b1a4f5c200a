// map-batch.ts against an in-memory stand-in for the addon's bpf(2) calls
// that records every call: the order the kernel would see, the chunking, and
// the fallback to one call an entry. The real kernel's batch calls are read
// back in test/privileged/forward-ebpf-nat.test.ts.
import t from 'tap';
import { MapBatchWriter, batchUnsupported, probeMapBatch, readArrayBatch } from '../../../agent/net/ebpf/map-batch';

interface Call { readonly cmd: 'update' | 'batch' | 'lookup' | 'lookupBatch'; readonly fd: number; readonly keys: string[] }

/** Maps by fd: key (hex) → value; `refuse`: the batch calls throw this errno code with count 0. */
function fakeBpf(opts: { refuse?: string; refuseAt?: number } = {}) {
  const maps = new Map<number, Map<string, Buffer>>();
  const writes: Array<[number, string, string]> = [];
  const calls: Call[] = [];
  const map = (fd: number): Map<string, Buffer> => maps.get(fd) ?? maps.set(fd, new Map()).get(fd)!;
  const put = (fd: number, k: Buffer, v: Buffer): void => {
    map(fd).set(k.toString('hex'), Buffer.from(v));
    writes.push([fd, k.toString('hex'), v.toString('hex')]);
  };
  let nextFd = 100;
  const bpf = {
    bpfMapCreate: () => nextFd++,
    bpfMapUpdate: (fd: number, k: Buffer, v: Buffer) => { calls.push({ cmd: 'update', fd, keys: [k.toString('hex')] }); put(fd, k, v); },
    bpfMapLookup: (fd: number, k: Buffer, out: Buffer) => {
      calls.push({ cmd: 'lookup', fd, keys: [k.toString('hex')] });
      const v = map(fd).get(k.toString('hex'));
      if (!v) return false;
      v.copy(out);
      return true;
    },
    bpfMapUpdateBatch: (fd: number, keys: Buffer, values: Buffer, count: number) => {
      const ks = keys.length / count;
      const vs = values.length / count;
      calls.push({ cmd: 'batch', fd, keys: Array.from({ length: count }, (_, i) => keys.subarray(i * ks, (i + 1) * ks).toString('hex')) });
      if (opts.refuse) throw Object.assign(new Error(`bpf BPF_MAP_UPDATE_BATCH ${opts.refuse}`), { code: opts.refuse, count: 0 });
      for (let i = 0; i < count; i++) {
        if (opts.refuseAt === i) throw Object.assign(new Error('bpf BPF_MAP_UPDATE_BATCH E2BIG'), { code: 'E2BIG', count: i });
        put(fd, keys.subarray(i * ks, (i + 1) * ks), values.subarray(i * vs, (i + 1) * vs));
      }
      return count;
    },
    bpfMapLookupBatch: (fd: number, inBatch: Buffer | null, outBatch: Buffer, keys: Buffer, values: Buffer, count: number) => {
      if (opts.refuse) throw Object.assign(new Error(`bpf BPF_MAP_LOOKUP_BATCH ${opts.refuse}`), { code: opts.refuse });
      const from = inBatch === null ? 0 : inBatch.readUInt32LE();
      const vs = values.length / count;
      const m = map(fd);
      calls.push({ cmd: 'lookupBatch', fd, keys: [String(from), String(count)] });
      for (let i = 0; i < count; i++) {
        const k = Buffer.alloc(4);
        k.writeUInt32LE(from + i);
        k.copy(keys, i * 4);
        (m.get(k.toString('hex')) ?? Buffer.alloc(vs)).copy(values, i * vs);
      }
      outBatch.writeUInt32LE(from + count);
      return { count, more: true };
    },
  };
  return { bpf, maps, writes, calls };
}

const key = (n: number): Buffer => { const b = Buffer.alloc(4); b.writeUInt32LE(n); return b; };
const val = (n: number, size = 8): Buffer => { const b = Buffer.alloc(size); b.writeUInt32LE(n); return b; };

t.test('puts reach the kernel in the order made, one map per batch, chunked', async (t) => {
  const f = fakeBpf();
  const w = new MapBatchWriter(f.bpf, { chunk: 3 });
  for (let i = 0; i < 4; i++) w.put(1, key(i), val(i));
  w.put(2, key(9), val(9, 12));
  w.put(1, key(5), val(5));
  w.flush();
  t.same(f.calls.map((c) => [c.cmd, c.fd, c.keys.length]), [['batch', 1, 3], ['batch', 1, 1], ['batch', 2, 1], ['batch', 1, 1]], 'a full chunk and a change of map send what is gathered');
  t.same(f.writes.map(([fd, k]) => [fd, k]), [[1, '00000000'], [1, '01000000'], [1, '02000000'], [1, '03000000'], [2, '09000000'], [1, '05000000']], 'the kernel writes in the order of the puts');
  t.equal(w.calls, 4);
  t.equal(w.entries, 6);
  t.equal(w.unsupported, undefined);
  t.equal(f.maps.get(2)!.get('09000000')!.length, 12, 'each map its own value size');
});

t.test('a caller\'s reused buffers are copied at the put', async (t) => {
  const f = fakeBpf();
  const w = new MapBatchWriter(f.bpf);
  const k = Buffer.alloc(4);
  const v = Buffer.alloc(8);
  for (let i = 0; i < 3; i++) {
    k.writeUInt32LE(i);
    v.writeUInt32LE(10 + i);
    w.put(1, k, v);
  }
  w.flush();
  t.same([...f.maps.get(1)!.entries()].map(([kk, vv]) => [kk, vv.readUInt32LE()]), [['00000000', 10], ['01000000', 11], ['02000000', 12]]);
});

t.test('a kernel that refuses batch calls gets the same entries one call each, and the reason is kept', async (t) => {
  for (const code of ['EINVAL', 'EOPNOTSUPP']) {
    const f = fakeBpf({ refuse: code });
    const w = new MapBatchWriter(f.bpf);
    for (let i = 0; i < 5; i++) w.put(1, key(i), val(i));
    w.flush();
    t.equal(f.maps.get(1)!.size, 5, `${code}: all written`);
    t.same(f.writes.map(([, k]) => k), ['00000000', '01000000', '02000000', '03000000', '04000000'], `${code}: in order`);
    t.match(w.unsupported, new RegExp(`refuses BPF_MAP_UPDATE_BATCH \\(${code}\\)`));
    for (let i = 5; i < 7; i++) w.put(1, key(i), val(i));
    w.flush();
    t.same(f.calls.map((c) => c.cmd), ['batch', 'update', 'update', 'update', 'update', 'update', 'update', 'update'], `${code}: the batch tried once, then single calls`);
  }
});

t.test('a refusal after entries were written is about an entry: thrown, not taken for no support', async (t) => {
  const f = fakeBpf({ refuseAt: 2 });
  const w = new MapBatchWriter(f.bpf);
  for (let i = 0; i < 4; i++) w.put(1, key(i), val(i));
  t.throws(() => w.flush(), { code: 'E2BIG' });
  t.equal(w.unsupported, undefined);
  t.equal(batchUnsupported({ code: 'EINVAL', count: 3 }), false);
  t.equal(batchUnsupported({ code: 'EINVAL', count: 0 }), true);
  t.equal(batchUnsupported({ code: 'Unknown system error 524', errno: -524 }), true, 'ENOTSUPP (a map type without batch ops)');
  t.equal(batchUnsupported({ code: 'ENOMEM', count: 0 }), false);
});

t.test('an addon without the batch calls: single calls from the start', async (t) => {
  const f = fakeBpf();
  const { bpfMapUpdateBatch: _u, bpfMapLookupBatch: _l, ...old } = f.bpf;
  const w = new MapBatchWriter(old);
  w.put(1, key(0), val(0));
  w.flush();
  t.same(f.calls.map((c) => c.cmd), ['update']);
  t.match(w.unsupported, /rebuild it/);
  t.match(probeMapBatch(old, () => {}), /no batch map calls/);
});

t.test('an array read in chunks equals the same read one lookup each', async (t) => {
  const f = fakeBpf();
  for (let i = 0; i < 10; i++) f.bpf.bpfMapUpdate(7, key(i), val(i * 3, 16));
  f.calls.length = 0;
  const batched = readArrayBatch(f.bpf, 7, 10, 16, { chunk: 4 });
  t.equal(batched.calls, 3, '10 entries, 4 a call');
  t.same(f.calls.map((c) => c.keys), [['0', '4'], ['4', '4'], ['8', '2']], 'each call goes on where the last ended');
  const single = readArrayBatch(f.bpf, 7, 10, 16, { unsupported: 'off' });
  t.equal(single.calls, 10);
  t.ok(batched.values.equals(single.values), 'the same bytes');
  t.equal(batched.values.readUInt32LE(9 * 16), 27);
  t.equal(readArrayBatch(f.bpf, 7, 0, 16).calls, 0, 'nothing to read: no call');
  const refused = readArrayBatch(fakeBpf({ refuse: 'EINVAL' }).bpf, 7, 3, 16);
  t.match(refused.unsupported, /BPF_MAP_LOOKUP_BATCH \(EINVAL\)/);
  t.equal(refused.calls, 4, 'a refused batch read (one call) falls back to three lookups');
});

t.test('the probe: a batch write read back', async (t) => {
  let closed = 0;
  t.equal(probeMapBatch(fakeBpf().bpf, () => { closed++; }), undefined);
  t.equal(closed, 1, 'its map closed');
  t.match(probeMapBatch(fakeBpf({ refuse: 'EINVAL' }).bpf, () => {}), /refuses BPF_MAP_UPDATE_BATCH \(EINVAL\)/);
});

t.test('the addon sums per-CPU values as the JavaScript sum does, to the last bit', async (t) => {
  const native = await import('../../../agent/native/native');
  const { sumPerCpu, sumPerCpuJs } = await import('../../../agent/net/ebpf/map-batch');
  const addon = native.loadNative();
  t.equal(typeof addon.bpfSumPerCpu, 'function', 'the addon has bpfSumPerCpu');
  // A seeded generator: the same buffers every run, so a failure can be replayed.
  let seed = 0x2545f491;
  const rnd = (): number => { seed ^= seed << 13; seed ^= seed >>> 17; seed ^= seed << 5; return seed >>> 0; };
  const offsets = Uint32Array.from([0, 8, 16, 24, 32]);
  let compared = 0;
  for (const [count, cpus, cpuSize] of [[1, 1, 40], [3, 2, 40], [257, 4, 40], [1000, 2, 48], [64, 64, 40]] as const) {
    const values = Buffer.alloc(count * cpus * cpuSize);
    for (let i = 0; i + 8 <= values.length; i += 8) {
      // Small numbers, numbers near 2^53, and whole 64-bit values (whose sum wraps as the kernel's u64 would).
      const kind = rnd() % 3;
      const v = kind === 0 ? BigInt(rnd() % 100_000) : kind === 1 ? (1n << 52n) + BigInt(rnd()) : (BigInt(rnd()) << 32n) | BigInt(rnd());
      values.writeBigUInt64LE(v, i);
    }
    const native = new Float64Array(count * offsets.length).fill(-1);
    const js = new Float64Array(count * offsets.length).fill(-2);
    sumPerCpu(addon, values, count, cpuSize, cpus, offsets, native);
    sumPerCpuJs(values, count, cpuSize, cpus, offsets, js);
    t.same(Array.from(native), Array.from(js), `${count} entries x ${cpus} CPUs of ${cpuSize} bytes: the same numbers`);
    compared += native.length;
  }
  t.ok(compared > 6_000, `${compared} sums compared`);
  // Below 2^53 the sum is exact: what Number() of the BigInt sum gives.
  const exact = Buffer.alloc(2 * 40);
  exact.writeBigUInt64LE((1n << 52n) + 1n, 0);
  exact.writeBigUInt64LE((1n << 52n) - 2n, 40);
  const out = new Float64Array(5);
  addon.bpfSumPerCpu!(exact, 1, 40, 2, offsets, out);
  t.equal(out[0], 2 ** 53 - 1, '2^52 + 1 and 2^52 - 2 over two CPUs sum to 2^53 - 1 exactly');
  t.throws(() => addon.bpfSumPerCpu!(exact, 2, 40, 2, offsets, out), /fewer than count entries/, 'values shorter than count entries are refused');
  t.throws(() => addon.bpfSumPerCpu!(exact, 1, 40, 2, offsets, new Float64Array(4)), /out holds fewer/, 'an out array too short is refused');
  t.throws(() => addon.bpfSumPerCpu!(exact, 1, 40, 2, Uint32Array.from([33]), out), /past cpuSize/, 'a field past the slot is refused');
});

t.test('readArrayBatch reads into a buffer it is handed, and clears an entry the map does not hold', async (t) => {
  const seen: number[] = [];
  const bpf = {
    bpfMapCreate: () => 1, bpfMapUpdate: () => undefined,
    bpfMapLookup: (_fd: number, k: Buffer, out: Buffer) => { const i = k.readUInt32LE(); seen.push(i); if (i === 1) return false; out.fill(i + 1); return true; },
  };
  const into = Buffer.alloc(64, 0xee);
  const r = readArrayBatch(bpf, 1, 3, 8, { into });
  t.equal(r.values.buffer, into.buffer, 'read into the buffer handed in');
  t.same([...r.values], [...Buffer.alloc(8, 1), ...Buffer.alloc(8, 0), ...Buffer.alloc(8, 3)], 'index 1, not found, reads as zeros (not what the buffer held)');
  const small = readArrayBatch(bpf, 1, 3, 8, { into: Buffer.alloc(8) });
  t.equal(small.values.length, 24, 'a buffer too small is not used');
});
