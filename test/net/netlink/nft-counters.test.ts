// The nftables counter dump codec (agent/net/netlink/nft-counters.ts)
// against frames captured from the kernel: the request for `table ip
// lb_agent`'s counters and the kernel's answer (two NEWOBJ in one datagram,
// then NLMSG_DONE in another). Malformed input is reported, never thrown.
import t from 'tap';
import { counterDumpRequest, parseCounterDump } from '../../../agent/net/netlink/nft-counters';
import { prng } from '../../helpers/random';

const hex = (s: string): Buffer => Buffer.from(s, 'hex');
// Captured on this kernel (x86_64, little-endian), sequence 77: the table held
// s0p0b0_conns (7 packets, 420 bytes) and big (5e9 packets, 123456789012 bytes).
const REQUEST = hex('2c000000130a01034d00000000000000020000000d0001006c625f6167656e74000000000800030000000001');
const OBJECTS = hex('70000000120a02084d000000380b0000020000020d0001006c625f6167656e7400000000110002007330703062305f636f6e6e730000000008000300000000010c000600000000000000000108000500000000001c0004000c00010000000000000001a40c000200000000000000000764000000120a02084d000000380b0000020000020d0001006c625f6167656e7400000000080002006269670008000300000000010c000600000000000000000208000500000000001c0004000c0001000000001cbe991a140c000200000000012a05f200');
const DONE = hex('14000000030002004d000000380b000000000000');

t.test('the request is the one that was sent to the kernel, byte for byte', async (t) => {
  t.same(counterDumpRequest(2, 'lb_agent', 77), REQUEST);
});

t.test('captured replies decode to the counters and the end of the dump', async (t) => {
  const part = parseCounterDump(OBJECTS, 'lb_agent', 77);
  t.same([...part.counters], [['s0p0b0_conns', { packets: 7, bytes: 420 }], ['big', { packets: 5_000_000_000, bytes: 123_456_789_012 }]], 'u64 values beyond 32 bits');
  t.same([part.done, part.malformed, part.errno], [false, false, undefined], 'more to come');
  t.same(parseCounterDump(DONE, 'lb_agent', 77), { counters: new Map(), done: true, errno: undefined, malformed: false, interrupted: false });
});

t.test('a dump the table changed under is flagged interrupted (NLM_F_DUMP_INTR), its counters still decoded', async (t) => {
  const intr = Buffer.from(OBJECTS);
  intr.writeUInt16LE(intr.readUInt16LE(6) | 0x10, 6);
  const part = parseCounterDump(intr, 'lb_agent', 77);
  t.equal(part.interrupted, true, 'the flag on the first message');
  t.equal(part.counters.size, 2);
  t.equal(parseCounterDump(OBJECTS, 'lb_agent', 77).interrupted, false, 'not without it');
  t.equal(parseCounterDump(intr, 'lb_agent', 78).interrupted, false, 'nor from another dump');
});

t.test('replies to another dump, or of another table, are not counted', async (t) => {
  t.equal(parseCounterDump(OBJECTS, 'lb_agent', 78).counters.size, 0, 'another sequence number');
  t.equal(parseCounterDump(DONE, 'lb_agent', 78).done, false, 'nor its end');
  t.equal(parseCounterDump(OBJECTS, 'other', 77).counters.size, 0, 'another table');
});

t.test('an error ends the dump with its errno; malformed input is reported, never thrown', async (t) => {
  const err = Buffer.alloc(36);
  err.writeUInt32LE(36, 0); err.writeUInt16LE(2, 4); err.writeUInt32LE(77, 8); err.writeInt32LE(-1, 16);
  t.same(parseCounterDump(err, 'lb_agent', 77), { counters: new Map(), done: true, errno: -1, malformed: false, interrupted: false });
  const short = Buffer.from(OBJECTS);
  short.writeUInt32LE(0x1000, 0);
  t.equal(parseCounterDump(short, 'lb_agent', 77).malformed, true, 'a length past the datagram');
  const badAttr = Buffer.from(OBJECTS);
  badAttr.writeUInt16LE(0xff, 20);
  t.equal(parseCounterDump(badAttr, 'lb_agent', 77).malformed, true, 'an attribute past its message');
  const random = prng(47);
  for (let i = 0; i < 200; i++) {
    const junk = Buffer.from(OBJECTS);
    for (let k = 0; k < 8; k++) junk[Math.floor(random() * junk.length)] = Math.floor(random() * 256);
    t.doesNotThrow(() => parseCounterDump(junk, 'lb_agent', 77));
  }
});

t.test('the in-place decoder gives what a decode through attribute maps gives, on captured and on corrupted replies', async (t) => {
  const { attributes } = await import('../../../agent/net/netlink/nft-watch');
  // The reference: every message's attributes into a map (first of each type), the nested counter's too.
  const reference = (buf: Buffer, table: string, seq: number): { counters: [string, { packets: number; bytes: number }][]; done: boolean; errno: number | undefined; malformed: boolean; interrupted: boolean } => {
    const counters = new Map<string, { packets: number; bytes: number }>();
    const str = (b: Buffer): string => { const nul = b.indexOf(0); return b.toString('utf8', 0, nul < 0 ? b.length : nul); };
    const u64 = (b: Buffer | undefined): number => (b && b.length >= 8 ? Number(b.readBigUInt64BE(0)) : 0);
    const out = (done: boolean, errno: number | undefined, malformed: boolean, interrupted: boolean) => ({ counters: [...counters], done, errno, malformed, interrupted });
    let interrupted = false;
    let o = 0;
    while (o + 16 <= buf.length) {
      const len = buf.readUInt32LE(o);
      if (len < 16 || o + len > buf.length) return out(false, undefined, true, interrupted);
      const type = buf.readUInt16LE(o + 4);
      if (buf.readUInt32LE(o + 8) === seq) {
        if ((buf.readUInt16LE(o + 6) & 0x10) !== 0) interrupted = true;
        if (type === 3) return out(true, undefined, false, interrupted);
        if (type === 2) { const e = len >= 20 ? buf.readInt32LE(o + 16) : -1; return out(true, e === 0 ? undefined : e, false, interrupted); }
        if (type === ((10 << 8) | 18) && len >= 20) {
          const a = attributes(buf, o + 20, o + len);
          if (!a) return out(false, undefined, true, interrupted);
          const [tb, n, ty, data] = [a.get(1), a.get(2), a.get(3), a.get(4)];
          if (tb && n && ty && ty.length >= 4 && ty.readUInt32BE(0) === 1 && data && str(tb) === table) {
            const d = attributes(data, 0, data.length);
            if (!d) return out(false, undefined, true, interrupted);
            counters.set(str(n), { packets: u64(d.get(2)), bytes: u64(d.get(1)) });
          }
        }
      }
      o += (len + 3) & ~3;
    }
    return out(false, undefined, false, interrupted);
  };
  const mine = (buf: Buffer, table: string, seq: number): ReturnType<typeof reference> => {
    const p = parseCounterDump(buf, table, seq);
    return { counters: [...p.counters], done: p.done, errno: p.errno, malformed: p.malformed, interrupted: p.interrupted };
  };
  t.same(mine(OBJECTS, 'lb_agent', 77), reference(OBJECTS, 'lb_agent', 77), 'the captured replies');
  // Values past 2^53: the same rounding as Number() of the BigInt.
  const huge = Buffer.from(OBJECTS);
  huge.writeUInt32BE(0xffffffff, 0x6c - 8 + 4); huge.writeUInt32BE(0x12345679, 0x6c - 8 + 8);
  t.same(mine(huge, 'lb_agent', 77), reference(huge, 'lb_agent', 77), 'a u64 past 2^53');
  const random = prng(4747);
  let differ = 0;
  let decoded = 0;
  for (let i = 0; i < 2000; i++) {
    const junk = Buffer.from(OBJECTS);
    for (let k = 0; k < 1 + (i % 6); k++) junk[Math.floor(random() * junk.length)] = Math.floor(random() * 256);
    const a = mine(junk, 'lb_agent', 77);
    const b = reference(junk, 'lb_agent', 77);
    if (JSON.stringify(a) !== JSON.stringify(b)) differ++;
    decoded += a.counters.length;
  }
  t.equal(differ, 0, `2,000 corrupted replies decoded alike (${decoded} counters among them)`);
  const into = new Map([['kept', { packets: 1, bytes: 2 }]]);
  t.equal(parseCounterDump(OBJECTS, 'lb_agent', 77, into).counters, into, 'counters go into the map handed in');
  t.same([...into.keys()], ['kept', 's0p0b0_conns', 'big'], 'beside what it held');
});
