// net/ebpf layer: map entries written and read many to a bpf(2) call
// (BPF_MAP_UPDATE_BATCH, BPF_MAP_LOOKUP_BATCH; Linux 5.6), through the
// addon's thin wrappers (native/src/bpf.cc). Bytes and descriptors only: what
// an entry means is the caller's. A kernel or an addon without the batch
// commands gets the same entries one call each, in the same order.
import type { NativeBpfObject } from '../../native/native';

/** Entries per batch call: a few thousand keeps one call's copy (keys and values, a few hundred KiB) small. */
export const MAP_BATCH_ENTRIES = 4096;

type BatchBpf = Pick<NativeBpfObject, 'bpfMapUpdate' | 'bpfMapLookup' | 'bpfMapUpdateBatch' | 'bpfMapLookupBatch' | 'bpfMapCreate'>;

/**
 * Does a refusal of a batch command say the kernel (or the map type) has
 * none? EINVAL (a kernel before 5.6 knows no such command), EOPNOTSUPP,
 * ENOTSUPP (errno 524: a map type without batch ops), ENOSYS. Only a
 * refusal of the first entry counts: one after entries were written is
 * about an entry.
 */
export function batchUnsupported(err: unknown): boolean {
  const e = err as { code?: string; errno?: number; count?: number };
  if ((e.count ?? 0) > 0) return false;
  return e.code === 'EINVAL' || e.code === 'EOPNOTSUPP' || e.code === 'ENOTSUP' || e.code === 'ENOSYS' || e.errno === 524 || e.errno === -524;
}

/**
 * Puts gathered per map in the order made, and handed to the kernel a chunk
 * at a time: a put to another map, a flush(), or a full chunk sends what is
 * gathered first, so the kernel sees the entries in exactly the order of
 * the puts (the kernel writes a batch's entries one after another, as
 * single updates would be). A caller flushes before anything that must come
 * after the puts (a delete, a read).
 */
export class MapBatchWriter {
  /** The bpf(2) calls made. */
  calls = 0;
  /** The entries written. */
  entries = 0;
  /** Why the batch command is not used (undefined: it is), as found by the first refusal. */
  unsupported: string | undefined;
  private fd = -1;
  private keySize = 0;
  private valueSize = 0;
  private keys: Buffer = Buffer.alloc(0);
  private values: Buffer = Buffer.alloc(0);
  private n = 0;
  private readonly chunk: number;

  constructor(private readonly bpf: BatchBpf, opts: { unsupported?: string | undefined; chunk?: number } = {}) {
    this.unsupported = opts.unsupported ?? (bpf.bpfMapUpdateBatch === undefined ? 'the native addon has no BPF_MAP_UPDATE_BATCH (rebuild it: npm ci)' : undefined);
    this.chunk = opts.chunk ?? MAP_BATCH_ENTRIES;
  }

  /** Queue key → value for map `fd` (copied: the caller may reuse its buffers). */
  put(fd: number, key: Buffer, value: Buffer): void {
    if (fd !== this.fd || key.length !== this.keySize || value.length !== this.valueSize || this.n === this.chunk) {
      this.flush();
      if (this.keys.length < this.chunk * key.length) this.keys = Buffer.allocUnsafe(this.chunk * key.length);
      if (this.values.length < this.chunk * value.length) this.values = Buffer.allocUnsafe(this.chunk * value.length);
      this.fd = fd;
      this.keySize = key.length;
      this.valueSize = value.length;
    }
    key.copy(this.keys, this.n * this.keySize);
    value.copy(this.values, this.n * this.valueSize);
    this.n++;
  }

  /** Send what is gathered. Throws what the kernel refused (the entries before it are written). */
  flush(): void {
    const n = this.n;
    if (n === 0) return;
    this.n = 0;
    const keys = this.keys.subarray(0, n * this.keySize);
    const values = this.values.subarray(0, n * this.valueSize);
    if (this.unsupported === undefined) {
      try {
        this.calls++;
        this.bpf.bpfMapUpdateBatch!(this.fd, keys, values, n, 0);
        this.entries += n;
        return;
      } catch (err) {
        if (!batchUnsupported(err)) throw err;
        const e = err as { code?: string; message?: string };
        this.unsupported = `the kernel refuses BPF_MAP_UPDATE_BATCH (${e.code ?? e.message ?? 'refused'})`;
      }
    }
    for (let i = 0; i < n; i++) {
      this.calls++;
      this.bpf.bpfMapUpdate(this.fd, keys.subarray(i * this.keySize, (i + 1) * this.keySize), values.subarray(i * this.valueSize, (i + 1) * this.valueSize), 0);
      this.entries++;
    }
  }
}

/**
 * The values of keys 0 .. count - 1 of an array map (per-CPU: `valueSize` is
 * the whole per-CPU value), read a chunk per call where the kernel has
 * BPF_MAP_LOOKUP_BATCH, else one lookup each. Returns the values packed
 * (`count` × valueSize) and the calls made; `unsupported` as MapBatchWriter's.
 * `into`: a buffer to read into where it is large enough (a reader that
 * reads the same map again and again keeps one), else a new one is made.
 */
export function readArrayBatch(bpf: BatchBpf, fd: number, count: number, valueSize: number, opts: { unsupported?: string | undefined; chunk?: number; into?: Buffer | undefined } = {}): { values: Buffer; calls: number; unsupported: string | undefined } {
  const values = opts.into !== undefined && opts.into.length >= count * valueSize ? opts.into.subarray(0, count * valueSize) : Buffer.alloc(count * valueSize);
  let unsupported = opts.unsupported ?? (bpf.bpfMapLookupBatch === undefined ? 'the native addon has no BPF_MAP_LOOKUP_BATCH (rebuild it: npm ci)' : undefined);
  const chunk = opts.chunk ?? MAP_BATCH_ENTRIES;
  let calls = 0;
  let done = 0;
  if (unsupported === undefined && count > 0) {
    const keys = Buffer.alloc(Math.min(chunk, count) * 4);
    const cursor = Buffer.alloc(4);
    const next = Buffer.alloc(4);
    try {
      while (done < count) {
        const want = Math.min(chunk, count - done);
        calls++;
        // An array map's batch position is the next index (a u32).
        const r = bpf.bpfMapLookupBatch!(fd, done === 0 ? null : cursor, next, keys, values.subarray(done * valueSize, (done + want) * valueSize), want);
        done += r.count;
        next.copy(cursor);
        if (!r.more || r.count === 0) break;
      }
    } catch (err) {
      if (!batchUnsupported(err) || done > 0) throw err;
      unsupported = `the kernel refuses BPF_MAP_LOOKUP_BATCH (${(err as { code?: string }).code ?? 'refused'})`;
    }
  }
  if (done < count) {
    const key = Buffer.alloc(4);
    const out = Buffer.alloc(valueSize);
    for (let i = done; i < count; i++) {
      key.writeUInt32LE(i);
      calls++;
      if (bpf.bpfMapLookup(fd, key, out)) out.copy(values, i * valueSize);
      else values.fill(0, i * valueSize, (i + 1) * valueSize);
    }
  }
  return { values, calls, unsupported };
}

/**
 * Does this kernel take batch writes and reads of an array map? A map of two
 * entries created, written and read back in one call each, then closed.
 * Returns why not, or undefined (the preflight's fact; the engine finds the
 * same at its first write and falls back there too).
 */
export function probeMapBatch(bpf: BatchBpf, close: (fd: number) => void): string | undefined {
  if (bpf.bpfMapUpdateBatch === undefined || bpf.bpfMapLookupBatch === undefined) return 'the native addon has no batch map calls (rebuild it: npm ci)';
  let fd: number | undefined;
  try {
    fd = bpf.bpfMapCreate(2 /* BPF_MAP_TYPE_ARRAY */, 4, 8, 2, 'lbn_probe');
    const keys = Buffer.from([0, 0, 0, 0, 1, 0, 0, 0]);
    const values = Buffer.alloc(16);
    values.writeBigUInt64LE(7n, 0);
    values.writeBigUInt64LE(9n, 8);
    const w = new MapBatchWriter(bpf);
    w.put(fd, keys.subarray(0, 4), values.subarray(0, 8));
    w.put(fd, keys.subarray(4), values.subarray(8));
    w.flush();
    if (w.unsupported !== undefined) return w.unsupported;
    const r = readArrayBatch(bpf, fd, 2, 8);
    if (r.unsupported !== undefined) return r.unsupported;
    if (!r.values.equals(values)) return 'BPF_MAP_LOOKUP_BATCH read back other values than BPF_MAP_UPDATE_BATCH wrote';
    return undefined;
  } catch (err) {
    return (err as Error).message;
  } finally {
    if (fd !== undefined) close(fd);
  }
}

/**
 * The per-CPU values of `count` entries of a per-CPU map, packed as
 * readArrayBatch returns them (each entry `cpus` slots of `cpuSize` bytes),
 * summed over the CPUs: field j (a u64 at offsets[j] of a slot) of entry i
 * into out[i * offsets.length + j]. The addon's bpfSumPerCpu does it in one
 * call (a u64 sum made a double: exact up to 2^53, as Number() of the sum);
 * an addon without it gets sumPerCpuJs, the same numbers.
 */
export function sumPerCpu(bpf: Pick<NativeBpfObject, 'bpfSumPerCpu'>, values: Buffer, count: number, cpuSize: number, cpus: number, offsets: Uint32Array, out: Float64Array): void {
  if (bpf.bpfSumPerCpu !== undefined) bpf.bpfSumPerCpu(values, count, cpuSize, cpus, offsets, out);
  else sumPerCpuJs(values, count, cpuSize, cpus, offsets, out);
}

/** sumPerCpu in JavaScript: a BigInt per CPU, field and entry (the reference the addon's sum is tested against). */
export function sumPerCpuJs(values: Buffer, count: number, cpuSize: number, cpus: number, offsets: Uint32Array, out: Float64Array): void {
  const fields = offsets.length;
  const entry = cpuSize * cpus;
  if (count * entry > values.length) throw new RangeError('sumPerCpu: values holds fewer than count entries of cpus x cpuSize bytes');
  if (count * fields > out.length) throw new RangeError('sumPerCpu: out holds fewer than count x offsets.length numbers');
  for (let i = 0; i < count; i++) {
    for (let j = 0; j < fields; j++) {
      let sum = 0n;
      for (let c = 0; c < cpus; c++) sum += values.readBigUInt64LE(i * entry + c * cpuSize + offsets[j]!);
      out[i * fields + j] = Number(BigInt.asUintN(64, sum));
    }
  }
}
