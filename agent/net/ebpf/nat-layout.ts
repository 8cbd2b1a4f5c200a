// The full-NAT engine's map layouts, read from the one definition the BPF
// program is compiled with (native/bpf/nat.h), PURE apart from reading that
// file: a parser for the header's small C subset (structs of fixed-width
// fields, arrays, nested structs; enums; #define constants) computing the
// offsets and sizes the C compiler gives them (natural alignment, as clang
// lays out structs for the BPF target and for x86-64 alike), and the encode
// and decode of map entries by field name. A field the driver names that
// the header lacks is an error at the first use, never a silent zero.
import * as fs from 'node:fs';
import * as path from 'node:path';

export interface CField {
  readonly name: string;
  readonly offset: number;
  /** Bytes of one element. */
  readonly size: number;
  /** Elements (1 for a scalar). */
  readonly count: number;
  /** The nested struct's name, for a struct field. */
  readonly struct?: string;
}

export interface CStruct {
  readonly name: string;
  readonly size: number;
  readonly align: number;
  readonly fields: readonly CField[];
}

export interface CHeader {
  readonly structs: ReadonlyMap<string, CStruct>;
  /** Enumerators and #define'd integers by name. */
  readonly constants: ReadonlyMap<string, number>;
}

const SCALARS: Readonly<Record<string, number>> = { __u8: 1, __s8: 1, __u16: 2, __s16: 2, __u32: 4, __s32: 4, __u64: 8, __s64: 8 };

const roundUp = (n: number, a: number): number => Math.ceil(n / a) * a;

/** Parse the header's structs, enums and integer #defines; throws naming the line it cannot read. */
export function parseCHeader(text: string): CHeader {
  const src = text.replace(/\/\*[\s\S]*?\*\//g, (c) => c.replace(/[^\n]/g, ' ')).replace(/\/\/[^\n]*/g, '');
  const structs = new Map<string, CStruct>();
  const constants = new Map<string, number>();
  for (const m of src.matchAll(/^\s*#define\s+(\w+)\s+(0x[0-9a-fA-F]+|\d+)\s*$/gm)) constants.set(m[1]!, Number(m[2]));
  for (const m of src.matchAll(/\benum\s+\w+\s*\{([^}]*)\}/g)) {
    let next = 0;
    for (const item of m[1]!.split(',').map((s) => s.trim()).filter((s) => s !== '')) {
      const e = /^(\w+)(?:\s*=\s*(0x[0-9a-fA-F]+|\d+))?$/.exec(item);
      if (!e) throw new Error(`nat.h: cannot read the enumerator "${item}"`);
      const v = e[2] !== undefined ? Number(e[2]) : next;
      constants.set(e[1]!, v);
      next = v + 1;
    }
  }
  for (const m of src.matchAll(/\bstruct\s+(\w+)\s*\{([^}]*)\}\s*;/g)) {
    const name = m[1]!;
    const fields: CField[] = [];
    let offset = 0;
    let align = 1;
    for (const decl of m[2]!.split(';').map((s) => s.trim().replace(/\s+/g, ' ')).filter((s) => s !== '')) {
      const d = /^(?:struct (\w+)|(\w+)) (\w+)(?:\[(\w+)\])?$/.exec(decl);
      if (!d) throw new Error(`nat.h: struct ${name}: cannot read the field "${decl}"`);
      const nested = d[1] !== undefined ? structs.get(d[1]) : undefined;
      if (d[1] !== undefined && !nested) throw new Error(`nat.h: struct ${name}: struct ${d[1]} is not defined before it`);
      const size = nested ? nested.size : SCALARS[d[2]!];
      if (size === undefined) throw new Error(`nat.h: struct ${name}: "${d[2]}" is not a fixed-width type`);
      const a = nested ? nested.align : size;
      const countText = d[4];
      const count = countText === undefined ? 1 : /^\d+$/.test(countText) ? Number(countText) : constants.get(countText);
      if (count === undefined) throw new Error(`nat.h: struct ${name}: unknown array size ${countText}`);
      offset = roundUp(offset, a);
      fields.push({ name: d[3]!, offset, size, count, ...(nested ? { struct: nested.name } : {}) });
      offset += size * count;
      align = Math.max(align, a);
    }
    structs.set(name, { name, size: roundUp(offset, align), align, fields });
  }
  return { structs, constants };
}

/** native/bpf/nat.h, from dist/agent/net/ebpf or agent/net/ebpf (or the bundle). */
export function natHeaderPath(): string {
  const candidates = [
    path.resolve(__dirname, '..', '..', '..', '..', 'native', 'bpf', 'nat.h'),
    path.resolve(__dirname, '..', '..', '..', 'native', 'bpf', 'nat.h'),
    path.resolve(__dirname, '..', '..', 'native', 'bpf', 'nat.h'),
  ];
  return candidates.find((p) => fs.existsSync(p)) ?? candidates[0]!;
}

/** A value for one field: a number (up to 2^53) or a bigint for 64-bit fields; a Buffer for byte arrays. */
export type CValue = number | bigint | Buffer | CValues;
export interface CValues { readonly [field: string]: CValue }

/** The structs of one header, with encode and decode by field name. */
export class CLayout {
  constructor(readonly header: CHeader) {}

  struct(name: string): CStruct {
    const s = this.header.structs.get(name);
    if (!s) throw new Error(`nat.h has no struct ${name}`);
    return s;
  }

  constant(name: string): number {
    const v = this.header.constants.get(name);
    if (v === undefined) throw new Error(`nat.h has no constant ${name}`);
    return v;
  }

  size(name: string): number {
    return this.struct(name).size;
  }

  /** Encode `values` (missing fields are zero; an unknown field name throws). Little-endian host order for integers: the kernel's. */
  encode(name: string, values: CValues, out: Buffer = Buffer.alloc(this.size(name)), at = 0): Buffer {
    const s = this.struct(name);
    for (const key of Object.keys(values)) if (!s.fields.some((f) => f.name === key)) throw new Error(`nat.h: struct ${name} has no field ${key}`);
    for (const f of s.fields) {
      const v = values[f.name];
      if (v === undefined) continue;
      const o = at + f.offset;
      if (f.struct !== undefined) { this.encode(f.struct, v as CValues, out, o); continue; }
      if (Buffer.isBuffer(v)) { v.copy(out, o, 0, f.size * f.count); continue; }
      writeInt(out, o, f.size, v as number | bigint);
    }
    return out;
  }

  /** Decode a buffer into its fields (64-bit fields as bigint, nested structs as objects, arrays as Buffers). */
  decode(name: string, buf: Buffer, at = 0): Record<string, CValue> {
    const s = this.struct(name);
    const out: Record<string, CValue> = {};
    for (const f of s.fields) {
      const o = at + f.offset;
      if (f.struct !== undefined) out[f.name] = this.decode(f.struct, buf, o);
      else if (f.count > 1) out[f.name] = Buffer.from(buf.subarray(o, o + f.size * f.count));
      else out[f.name] = readInt(buf, o, f.size);
    }
    return out;
  }
}

function writeInt(out: Buffer, o: number, size: number, v: number | bigint): void {
  switch (size) {
    case 1: out.writeUInt8(Number(v), o); return;
    case 2: out.writeUInt16LE(Number(v), o); return;
    case 4: out.writeUInt32LE(Number(v) >>> 0, o); return;
    default: out.writeBigUInt64LE(BigInt(v), o);
  }
}

function readInt(buf: Buffer, o: number, size: number): number | bigint {
  switch (size) {
    case 1: return buf.readUInt8(o);
    case 2: return buf.readUInt16LE(o);
    case 4: return buf.readUInt32LE(o);
    default: return buf.readBigUInt64LE(o);
  }
}

let cached: CLayout | undefined;

/** The layouts of native/bpf/nat.h, read once. */
export function natLayout(): CLayout {
  return (cached ??= new CLayout(parseCHeader(fs.readFileSync(natHeaderPath(), 'utf8'))));
}
