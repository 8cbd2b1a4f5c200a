// The nftables notification codec (agent/net/nft-watch.ts) against frames
// captured from the kernel: a table created by `nft -f` (NEWTABLE, NEWCHAIN,
// then NEWGEN) and deleted by `nft delete table` (DELCHAIN, DELTABLE,
// NEWGEN), and the commits the assembler makes of them. Malformed input is
// reported, never thrown.
import t from 'tap';
import { CommitAssembler, getGenRequest, parseNftDatagram } from '../../../agent/net/netlink/nft-watch';

const hex = (s: string): Buffer => Buffer.from(s, 'hex');
// Captured on this kernel (x86_64, little-endian): pid 0x12dc made the table, pid 0x12e2 deleted it.
const CREATE = hex('40000000000a000001000000dc120000020000020d0001006c625f6167656e740000000008000300000000010c000400000000000000000108000200000000006c000000030a000402000000dc120000020000020d0001006c625f6167656e740000000008000300707265000c000200000000000000000114000400080001000000000008000200ffffff9c0800050000000001080007006e61740008000a00000000010800060000000000');
const CREATE_GEN = hex('2c0000000f0a000001000000dc12000000000002080001000000000208000200000012dc080003006e667400');
const DELETE = hex('38000000050a000001000000e2120000020000030d0001006c625f6167656e740000000008000300707265000c000200000000000000000138000000020a000001000000e2120000020000030d0001006c625f6167656e740000000008000300000000000c0004000000000000000001');
const DELETE_GEN = hex('2c0000000f0a000001000000e212000000000003080001000000000308000200000012e2080003006e667400');

t.test('captured notifications decode to what they say', async (t) => {
  t.same(parseNftDatagram(CREATE), {
    malformed: false,
    notifications: [
      { type: 'object', kind: 'table', op: 'new', family: 'ip', table: 'lb_agent', portid: 0x12dc },
      { type: 'object', kind: 'chain', op: 'new', family: 'ip', table: 'lb_agent', portid: 0x12dc },
    ],
  });
  t.same(parseNftDatagram(CREATE_GEN), { malformed: false, notifications: [{ type: 'gen', gen: 2, pid: 0x12dc, proc: 'nft' }] });
  t.same(parseNftDatagram(DELETE).notifications.map((n) => n.type === 'object' ? `${n.op} ${n.kind} ${n.family} ${n.table}` : n.type), ['del chain ip lb_agent', 'del table ip lb_agent']);
});

t.test('the assembler makes one commit per NEWGEN, with what it did to each table and who did it', async (t) => {
  const a = new CommitAssembler();
  t.same(a.push(parseNftDatagram(CREATE).notifications), [], 'nothing until the commit ends');
  const [c1] = a.push(parseNftDatagram(CREATE_GEN).notifications);
  t.equal(c1!.gen, 2);
  t.equal(c1!.pid, 0x12dc);
  t.same([...c1!.tables], [['ip lb_agent', [{ kind: 'table', op: 'new' }, { kind: 'chain', op: 'new' }]]]);
  const both = a.push([...parseNftDatagram(DELETE).notifications, ...parseNftDatagram(DELETE_GEN).notifications]);
  t.equal(both.length, 1);
  t.same([...both[0]!.tables.get('ip lb_agent')!], [{ kind: 'chain', op: 'del' }, { kind: 'table', op: 'del' }]);
  t.equal(both[0]!.pid, 0x12e2);
  t.equal(both[0]!.port, 0x12e2, 'and the port of its notifications, nft\'s pid in its own PID namespace');
});

t.test('a commit without NFTA_GEN_PROC_PID takes the pid from its notifications\' port', async (t) => {
  const noPid = Buffer.from(DELETE_GEN);
  // Drop the PROC_PID attribute: rewrite its type to an unknown one (9).
  noPid.writeUInt16LE(9, 30);
  const a = new CommitAssembler();
  const [c] = a.push([...parseNftDatagram(DELETE).notifications, ...parseNftDatagram(noPid).notifications]);
  t.equal(c!.pid, 0x12e2);
});

t.test('malformed datagrams are reported, never thrown, and what came before them is kept', async (t) => {
  const cut = CREATE.subarray(0, CREATE.length - 10);
  const r = parseNftDatagram(cut);
  t.equal(r.malformed, true);
  t.equal(r.notifications.length, 1, 'the first, whole message is kept');
  const badLen = Buffer.from(CREATE_GEN);
  badLen.writeUInt32LE(8, 0);
  t.equal(parseNftDatagram(badLen).malformed, true, 'a length under the header');
  const badAttr = Buffer.from(CREATE_GEN);
  badAttr.writeUInt16LE(200, 20);
  t.equal(parseNftDatagram(badAttr).malformed, true, 'an attribute past its message');
  // Fuzz: random bytes and random cuts of real frames.
  let seed = 42;
  const rnd = (): number => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
  for (let i = 0; i < 3000; i++) {
    const base = [CREATE, CREATE_GEN, DELETE, DELETE_GEN][i % 4]!;
    const b = Buffer.from(base.subarray(0, Math.floor(rnd() * (base.length + 1))));
    for (let j = 0; j < 3; j++) if (b.length > 0) b[Math.floor(rnd() * b.length)] = Math.floor(rnd() * 256);
    t.doesNotThrow(() => parseNftDatagram(b));
  }
  t.same(parseNftDatagram(Buffer.alloc(0)), { notifications: [], malformed: false });
});

t.test('the GETGEN request is an nfnetlink request for the ruleset generation', async (t) => {
  const b = getGenRequest(7);
  t.equal(b.length, 20);
  t.equal(b.readUInt32LE(0), 20);
  t.equal(b.readUInt16LE(4), (10 << 8) | 16, 'NFNL_SUBSYS_NFTABLES, NFT_MSG_GETGEN');
  t.equal(b.readUInt16LE(6), 1, 'NLM_F_REQUEST');
  t.equal(b.readUInt32LE(8), 7, 'sequence');
});
