// The eBPF assembler: encodings byte for byte against struct bpf_insn as the
// kernel's uapi header lays it out (the atomic, store, jmp32, ja, map and
// mov32 rows spot-checked with a C program printing struct bpf_insn from this
// host's <linux/bpf.h>), and label
// resolution (a jump's offset counts from the instruction after it).
import t from 'tap';
import { EbpfAsm, encode } from '../../../agent/net/ebpf/ebpf';

const hex = (b: Buffer): string[] => Array.from({ length: b.length / 8 }, (_, i) => b.subarray(i * 8, i * 8 + 8).toString('hex'));

t.test('instruction encodings', async (t) => {
  const a = new EbpfAsm()
    .mov64(0, 0) // BPF_ALU64|BPF_MOV|BPF_K
    .mov64r(6, 1)
    .ldx('w', 7, 6, 76) // r7 = *(u32 *)(r6 + 76): __sk_buff.data
    .ldx('h', 2, 7, 12)
    .ldx('b', 4, 7, 23)
    .stx('w', 10, -4, 3)
    .st('w', 10, -24, 2)
    .atomicAdd64(0, 16, 1)
    .alu32r('xor', 3, 2)
    .alu32('lsh', 4, 14)
    .alu64('rsh', 3, 32)
    .alu64r('mul', 3, 8)
    .mov32(1, 0xdeadbef7 | 0)
    .call(152)
    .exit();
  t.same(hex(a.assemble()), [
    'b700000000000000',
    'bf16000000000000',
    '61674c0000000000',
    '69720c0000000000',
    '7174170000000000',
    '633afcff00000000',
    '620ae8ff02000000',
    'db10100000000000',
    'ac23000000000000',
    '640400000e000000',
    '7703000020000000',
    '2f83000000000000',
    'b4010000f7beadde',
    '8500000098000000',
    '9500000000000000',
  ]);
});

t.test('a map by descriptor and a 64-bit constant take two slots each', async (t) => {
  const a = new EbpfAsm().ldMapFd(1, 5).ld64(2, 0x1122334455667788n);
  t.equal(a.length, 4);
  t.same(hex(a.assemble()), ['1811000005000000', '0000000000000000', '1802000088776655', '0000000044332211']);
});

t.test('labels resolve forwards and backwards; 32-bit compares use BPF_JMP32', async (t) => {
  const a = new EbpfAsm()
    .label('top')
    .jmp('jne', 2, 0x45, 'out') // 0 -> 3: off 2
    .jmp32('jne', 4, -1, 'out') // 1 -> 3: off 1
    .ja('top') //                   2 -> 0: off -3
    .label('out')
    .jmpr('jgt', 2, 8, 'top') //    3 -> 0: off -4
    .exit();
  const insns = a.resolve();
  t.same(insns.map((i) => i.off), [2, 1, -3, -4, 0]);
  t.same(hex(encode(insns)).slice(0, 4), ['5502020045000000', '56040100ffffffff', '0500fdff00000000', '2d82fcff00000000']);
});

t.test('mistakes are caught before the kernel sees them', async (t) => {
  t.throws(() => new EbpfAsm().ja('nowhere').assemble(), /undefined label nowhere/);
  t.throws(() => new EbpfAsm().label('x').label('x'), /defined twice/);
  t.throws(() => new EbpfAsm().ldx('w', 1, 2, 40000), /16-bit offset/);
  t.throws(() => new EbpfAsm().mov64(1, 2 ** 33), /32-bit integer/);
  t.throws(() => new EbpfAsm().rol32(1, 2, 32, 3), /rotate by 32/);
  const far = new EbpfAsm().ja('end');
  for (let i = 0; i < 40000; i++) far.mov64(0, 0);
  far.label('end').exit();
  t.throws(() => far.assemble(), /jump to end.*16-bit offset/);
});

t.test('rol32 is a rotate: shift left, shift right by the rest, or', async (t) => {
  const insns = new EbpfAsm().rol32(4, 2, 14, 5).resolve();
  t.same(insns.map((i) => [i.code, i.dst, i.src, i.imm]), [[0xbc, 4, 2, 0], [0x64, 4, 0, 14], [0xbc, 5, 2, 0], [0x74, 5, 0, 18], [0x4c, 4, 5, 0]]);
});
