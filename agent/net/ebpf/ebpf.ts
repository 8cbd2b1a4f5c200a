// eBPF instruction builder (pure): what agent/net/packet/bpf.ts is for
// classic BPF, for the extended instruction set the kernel's verifier and JIT
// take (Documentation/bpf/standardization/instruction-set.rst). There is no
// clang on the machines lb-agent targets, and the programs are small and
// generated from the plan, so they are assembled here: mnemonics, labels
// resolved into jump offsets, struct bpf_insn bytes out. The verifier at
// BPF_PROG_LOAD is the real check of what a program does.
//
// Encoding (struct bpf_insn, little-endian hosts: x86-64 and arm64):
//   u8 code | u8 dst:4 (low nibble), src:4 (high nibble) | s16 off | s32 imm
// A 64-bit immediate load takes two slots, the second holding the high word.

/** Registers: r0 return value, r1-r5 arguments (clobbered by calls), r6-r9 preserved, r10 frame pointer (read-only). */
export type Reg = 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10;

// Instruction classes.
export const BPF_LD = 0x00;
export const BPF_LDX = 0x01;
export const BPF_ST = 0x02;
export const BPF_STX = 0x03;
export const BPF_ALU = 0x04;
export const BPF_JMP = 0x05;
export const BPF_JMP32 = 0x06;
export const BPF_ALU64 = 0x07;
// Sizes and modes of loads and stores.
export const BPF_W = 0x00;
export const BPF_H = 0x08;
export const BPF_B = 0x10;
export const BPF_DW = 0x18;
export const BPF_IMM = 0x00;
export const BPF_MEM = 0x60;
export const BPF_ATOMIC = 0xc0;
// Operand source.
export const BPF_K = 0x00;
export const BPF_X = 0x08;

export type Size = 'b' | 'h' | 'w' | 'dw';
const SIZE: Record<Size, number> = { b: BPF_B, h: BPF_H, w: BPF_W, dw: BPF_DW };

export type AluOp = 'add' | 'sub' | 'mul' | 'div' | 'or' | 'and' | 'lsh' | 'rsh' | 'mod' | 'xor' | 'mov' | 'arsh';
const ALU: Record<AluOp, number> = {
  add: 0x00, sub: 0x10, mul: 0x20, div: 0x30, or: 0x40, and: 0x50, lsh: 0x60, rsh: 0x70, mod: 0x90, xor: 0xa0, mov: 0xb0, arsh: 0xc0,
};

export type JmpOp = 'jeq' | 'jgt' | 'jge' | 'jset' | 'jne' | 'jsgt' | 'jsge' | 'jlt' | 'jle' | 'jslt' | 'jsle';
const JMP: Record<JmpOp, number> = {
  jeq: 0x10, jgt: 0x20, jge: 0x30, jset: 0x40, jne: 0x50, jsgt: 0x60, jsge: 0x70, jlt: 0xa0, jle: 0xb0, jslt: 0xc0, jsle: 0xd0,
};
const BPF_JA = 0x00;
const BPF_CALL = 0x80;
const BPF_EXIT = 0x90;
/** src_reg of a 64-bit immediate load that names a map by descriptor (BPF_PSEUDO_MAP_FD). */
export const BPF_PSEUDO_MAP_FD = 1;

/** One instruction before assembly; `target` is a label a jump still has to be resolved to. */
export interface Insn {
  readonly code: number;
  readonly dst: Reg;
  readonly src: number;
  readonly off: number;
  readonly imm: number;
  readonly target?: string;
}

function s32(v: number, what: string): number {
  if (!Number.isInteger(v) || v < -0x80000000 || v > 0xffffffff) throw new RangeError(`${what}: ${v} is not a 32-bit integer`);
  return v | 0;
}

function s16(v: number, what: string): number {
  if (!Number.isInteger(v) || v < -0x8000 || v > 0x7fff) throw new RangeError(`${what}: ${v} does not fit a 16-bit offset`);
  return v;
}

/** An eBPF program being written: instructions appended in order, jumps to labels. */
export class EbpfAsm {
  private readonly insns: Insn[] = [];
  private readonly labels = new Map<string, number>();

  /** The number of instruction slots so far (a 64-bit immediate counts two). */
  get length(): number {
    return this.insns.length;
  }

  private push(code: number, dst: Reg, src: number, off: number, imm: number, target?: string): this {
    this.insns.push(target === undefined ? { code, dst, src, off: s16(off, 'offset'), imm: s32(imm, 'immediate') } : { code, dst, src, off: 0, imm: s32(imm, 'immediate'), target });
    return this;
  }

  /** Mark the next instruction as `name`: jumps to it are resolved by assemble(). */
  label(name: string): this {
    if (this.labels.has(name)) throw new Error(`eBPF label ${name} defined twice`);
    this.labels.set(name, this.insns.length);
    return this;
  }

  /** dst op= imm, 64-bit. */
  alu64(op: AluOp, dst: Reg, imm: number): this { return this.push(BPF_ALU64 | ALU[op] | BPF_K, dst, 0, 0, imm); }
  /** dst op= src, 64-bit. */
  alu64r(op: AluOp, dst: Reg, src: Reg): this { return this.push(BPF_ALU64 | ALU[op] | BPF_X, dst, src, 0, 0); }
  /** dst op= imm, 32-bit (the result is zero-extended into the 64-bit register). */
  alu32(op: AluOp, dst: Reg, imm: number): this { return this.push(BPF_ALU | ALU[op] | BPF_K, dst, 0, 0, imm); }
  /** dst op= src, 32-bit (zero-extended). */
  alu32r(op: AluOp, dst: Reg, src: Reg): this { return this.push(BPF_ALU | ALU[op] | BPF_X, dst, src, 0, 0); }
  mov64(dst: Reg, imm: number): this { return this.alu64('mov', dst, imm); }
  mov64r(dst: Reg, src: Reg): this { return this.alu64r('mov', dst, src); }
  mov32(dst: Reg, imm: number): this { return this.alu32('mov', dst, imm); }
  mov32r(dst: Reg, src: Reg): this { return this.alu32r('mov', dst, src); }
  /** dst = rotate-left(src, n) on 32 bits, through `tmp` (eBPF has no rotate instruction). */
  rol32(dst: Reg, src: Reg, n: number, tmp: Reg): this {
    if (!Number.isInteger(n) || n <= 0 || n >= 32) throw new RangeError(`rotate by ${n}`);
    return this.mov32r(dst, src).alu32('lsh', dst, n).mov32r(tmp, src).alu32('rsh', tmp, 32 - n).alu32r('or', dst, tmp);
  }

  /** dst = *(size *)(src + off). */
  ldx(size: Size, dst: Reg, src: Reg, off: number): this { return this.push(BPF_LDX | BPF_MEM | SIZE[size], dst, src, off, 0); }
  /** *(size *)(dst + off) = src. */
  stx(size: Size, dst: Reg, off: number, src: Reg): this { return this.push(BPF_STX | BPF_MEM | SIZE[size], dst, src, off, 0); }
  /** *(size *)(dst + off) = imm. */
  st(size: Size, dst: Reg, off: number, imm: number): this { return this.push(BPF_ST | BPF_MEM | SIZE[size], dst, 0, off, imm); }
  /** Atomic *(u64 *)(dst + off) += src (BPF_ATOMIC | BPF_ADD, no fetch). */
  atomicAdd64(dst: Reg, off: number, src: Reg): this { return this.push(BPF_STX | BPF_ATOMIC | BPF_DW, dst, src, off, ALU.add); }

  /** dst = a 64-bit constant (two slots). */
  ld64(dst: Reg, value: bigint): this {
    const v = BigInt.asUintN(64, value);
    this.push(BPF_LD | BPF_IMM | BPF_DW, dst, 0, 0, Number(v & 0xffffffffn));
    return this.push(0, 0, 0, 0, Number(v >> 32n));
  }
  /** dst = the map with descriptor `fd` (two slots; the kernel swaps in the map's address at load). */
  ldMapFd(dst: Reg, fd: number): this {
    this.push(BPF_LD | BPF_IMM | BPF_DW, dst, BPF_PSEUDO_MAP_FD, 0, fd);
    return this.push(0, 0, 0, 0, 0);
  }

  /** if (dst op imm) goto label; 64-bit compare. */
  jmp(op: JmpOp, dst: Reg, imm: number, label: string): this { return this.push(BPF_JMP | JMP[op] | BPF_K, dst, 0, 0, imm, label); }
  /** if (dst op src) goto label; 64-bit compare. */
  jmpr(op: JmpOp, dst: Reg, src: Reg, label: string): this { return this.push(BPF_JMP | JMP[op] | BPF_X, dst, src, 0, 0, label); }
  /** if ((u32)dst op imm) goto label. */
  jmp32(op: JmpOp, dst: Reg, imm: number, label: string): this { return this.push(BPF_JMP32 | JMP[op] | BPF_K, dst, 0, 0, imm, label); }
  ja(label: string): this { return this.push(BPF_JMP | BPF_JA, 0, 0, 0, 0, label); }
  /** Call helper number `helper` (enum bpf_func_id); arguments in r1-r5, result in r0. */
  call(helper: number): this { return this.push(BPF_JMP | BPF_CALL, 0, 0, 0, helper); }
  exit(): this { return this.push(BPF_JMP | BPF_EXIT, 0, 0, 0, 0); }

  /** The instructions with every label resolved: a jump's offset counts from the instruction after it. */
  resolve(): Insn[] {
    return this.insns.map((insn, pc) => {
      if (insn.target === undefined) return insn;
      const to = this.labels.get(insn.target);
      if (to === undefined) throw new Error(`eBPF jump to undefined label ${insn.target}`);
      return { code: insn.code, dst: insn.dst, src: insn.src, off: s16(to - (pc + 1), `jump to ${insn.target}`), imm: insn.imm };
    });
  }

  /** struct bpf_insn[] as bytes, for BPF_PROG_LOAD. */
  assemble(): Buffer {
    return encode(this.resolve());
  }
}

/** struct bpf_insn[] bytes of resolved instructions. */
export function encode(insns: readonly Insn[]): Buffer {
  const out = Buffer.alloc(insns.length * 8);
  insns.forEach((i, n) => {
    if (i.target !== undefined) throw new Error(`unresolved jump to ${i.target}`);
    const o = n * 8;
    out.writeUInt8(i.code, o);
    out.writeUInt8(((i.src & 0xf) << 4) | (i.dst & 0xf), o + 1);
    out.writeInt16LE(i.off, o + 2);
    out.writeInt32LE(i.imm, o + 4);
  });
  return out;
}
