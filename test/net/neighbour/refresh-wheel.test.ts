// The refresh wheel on a ManualClock: every member once per period on one
// timer, spread over the period's slots; a member removed leaves it; and,
// with real VIP owners on an in-memory socket, a withdrawn or lost VIP
// sends nothing; a slot's refreshes run inside one call of the batch hook.
import t from 'tap';
import { ManualClock } from '../../../agent/clock';
import { parseIPv4 } from '../../../agent/address';
import { ARP_OP_REPLY, decodeArp, type ArpPacket } from '../../../agent/net/neighbour/arp';
import { RefreshWheel, MAX_SLOTS, type RefreshMember } from '../../../agent/net/neighbour/refresh-wheel';
import { VipOwner } from '../../../agent/net/neighbour/vip-owner';
import { MemorySocket } from '../../helpers/memory-socket';

/** A member that records when it was told to refresh. */
function member(clock: ManualClock): RefreshMember & { at: number[] } {
  const at: number[] = [];
  return { at, refreshDue: () => { at.push(clock.now()); } };
}

/** A wheel on a clock of its own. */
function fresh(): { clock: ManualClock; wheel: RefreshWheel } {
  const clock = new ManualClock();
  return { clock, wheel: new RefreshWheel({ clock }) };
}

/** Advance the clock by totalMs in steps of stepMs. */
function run(clock: ManualClock, totalMs: number, stepMs = 100): void {
  for (let t = 0; t < totalMs; t += stepMs) clock.advance(stepMs);
}

t.test('1,000 members that join together: each refreshed once per period, on one timer, 100 a slot', async (t) => {
  const { clock, wheel } = fresh();
  const ms = Array.from({ length: 1000 }, () => member(clock));
  const t0 = clock.now();
  for (const m of ms) wheel.add(m, 10_000);
  t.same(wheel.counts(), { members: 1000, timers: 1 }, 'one timer for all of them');
  run(clock, 100_000);
  const counts = ms.map((m) => m.at.length);
  t.equal(Math.min(...counts), 10, 'every member refreshed 10 times in 10 periods');
  t.equal(Math.max(...counts), 10, 'and none more often');
  const gaps = new Set<number>();
  for (const m of ms) for (let i = 1; i < m.at.length; i++) gaps.add(m.at[i]! - m.at[i - 1]!);
  t.same([...gaps], [10_000], 'each exactly one period after its last');
  t.ok(ms.every((m) => m.at[0]! > t0 && m.at[0]! <= t0 + 10_000), 'the first within one period of joining');
  const perInstant = new Map<number, number>();
  for (const m of ms) for (const a of m.at) perInstant.set(a, (perInstant.get(a) ?? 0) + 1);
  t.equal(Math.max(...perInstant.values()), 100, 'spread over the 10 slots: 100 at a time, never 1,000');
  t.equal(perInstant.size, 100, 'one batch a second');
});

t.test('a member removed leaves the wheel; the last one takes the timer with it; add twice is one membership', async (t) => {
  const { clock, wheel } = fresh();
  const a = member(clock);
  const b = member(clock);
  wheel.add(a, 10_000);
  wheel.add(a, 10_000);
  wheel.add(b, 10_000);
  t.same(wheel.counts(), { members: 2, timers: 1 });
  run(clock, 10_000);
  t.same([a.at.length, b.at.length], [1, 1], 'both once, a once though added twice');
  wheel.remove(a);
  t.notOk(wheel.has(a));
  run(clock, 30_000);
  t.same([a.at.length, b.at.length], [1, 4], 'a removed gets no more turns; b goes on');
  wheel.remove(b);
  wheel.remove(b);
  t.same(wheel.counts(), { members: 0, timers: 0 }, 'empty: no timer left');
  run(clock, 30_000);
  t.same([a.at.length, b.at.length], [1, 4]);
});

t.test('a member that leaves in its own turn, or removes another due in the same slot: no turn after leaving', async (t) => {
  const { clock, wheel } = fresh();
  const seen: string[] = [];
  const a: RefreshMember = { refreshDue: () => { seen.push('a'); wheel.remove(a); wheel.remove(b); } };
  const b: RefreshMember = { refreshDue: () => { seen.push('b'); } };
  // One slot: a period of one slot puts both in it.
  wheel.add(a, 1000);
  wheel.add(b, 1000);
  run(clock, 5000);
  t.same(seen, ['a'], 'b was removed before its turn in the same batch');
  t.same(wheel.counts(), { members: 0, timers: 0 });
});

t.test('periods: each has its ring; a long one has at most MAX_SLOTS slots; a bad period is refused', async (t) => {
  const { clock, wheel } = fresh();
  const fast = member(clock);
  const slow = member(clock);
  const hour = member(clock);
  wheel.add(fast, 500);
  wheel.add(slow, 10_000);
  wheel.add(hour, 3_600_000);
  t.same(wheel.counts(), { members: 3, timers: 3 });
  run(clock, 20_000);
  t.equal(fast.at.length, 40, 'every 0.5 s');
  t.equal(slow.at.length, 2, 'every 10 s');
  t.equal(hour.at.length, 0);
  run(clock, 3_600_000, 1000);
  t.equal(hour.at.length, 1, 'once in its hour');
  t.ok(hour.at[0]! - 1_000_000 > 3_600_000 - 3_600_000 / MAX_SLOTS, 'a lone member: about one period after it joined');
  wheel.add(fast, 10_000);
  t.same(wheel.counts(), { members: 3, timers: 2 }, 'moved to another period: the old ring went');
  t.throws(() => wheel.add(member(clock), 0), RangeError);
  t.throws(() => wheel.add(member(clock), NaN), RangeError);
  wheel.stop();
  t.same(wheel.counts(), { members: 0, timers: 0 });
});

t.test('VIP owners on one wheel: a refresh a period; a withdrawn VIP and a lost one send nothing and leave the wheel', async (t) => {
  const { clock, wheel } = fresh();
  // Twenty owners listen on this one socket (the daemon gives each its own handle of a shared socket).
  const socket = new MemorySocket();
  socket.setMaxListeners(20);
  const owners = Array.from({ length: 20 }, (_, i) => new VipOwner({ socket, mac: '02:aa:bb:cc:dd:01', ip: `10.99.0.${100 + i}`, announceNum: 2, announceIntervalMs: 2000, refreshMs: 10_000, wheel, clock }));
  for (const o of owners) o.start();
  t.same(wheel.counts(), { members: 20, timers: 1 }, 'twenty held VIPs, one timer');
  const sentFor = (ip: string): number => socket.sent.filter((f) => { const r = decodeArp(f); return r.ok && r.packet.senderIp === parseIPv4(ip); }).length;
  run(clock, 2000);
  t.ok(socket.sent.length >= 40 && socket.sent.length <= 42, `the bursts, and the slot that came round as they ended (${socket.sent.length})`);
  run(clock, 50_000);
  // A slot that comes round during the burst waits for its next turn; every
  // turn after it announces: 5 or 6 refreshes in the 52 s.
  t.ok(owners.every((o) => sentFor(o.ip) >= 7 && sentFor(o.ip) <= 8), `each VIP: its burst of 2, then one refresh per period (${[...new Set(owners.map((o) => sentFor(o.ip)))].join(', ')})`);
  const withdrawn = owners[0]!;
  withdrawn.close();
  const lost = owners[1]!;
  const claim: ArpPacket = { ethDst: 'ff:ff:ff:ff:ff:ff', ethSrc: '52:54:00:ab:cd:ef', op: ARP_OP_REPLY, senderMac: '52:54:00:ab:cd:ef', senderIp: parseIPv4(lost.ip)!, targetMac: '00:00:00:00:00:00', targetIp: parseIPv4(lost.ip)! };
  let lostSeen = false;
  lost.on('lost', () => { lostSeen = true; });
  lost.on('conflict', () => {});
  socket.inject(claim);
  socket.inject(claim);
  t.ok(lostSeen, 'the second conflict within DEFEND_INTERVAL gave the address up');
  t.same(wheel.counts(), { members: 18, timers: 1 }, 'both left the wheel');
  const before = [sentFor(withdrawn.ip), sentFor(lost.ip)];
  run(clock, 60_000);
  t.same([sentFor(withdrawn.ip), sentFor(lost.ip)], before, 'neither sends anything more');
  t.ok(owners.slice(2).every((o) => sentFor(o.ip) >= 12), 'the others go on');
  for (const o of owners) o.close();
  t.same(wheel.counts(), { members: 0, timers: 0 });
});

t.test('a slot\'s refreshes run inside one call of the batch hook, and only they', async (t) => {
  const clock = new ManualClock();
  let batches = 0;
  let inBatch = false;
  const wheel = new RefreshWheel({ clock, batch: (run) => { inBatch = true; run(); inBatch = false; batches++; } });
  const seen: boolean[] = [];
  const ms = Array.from({ length: 20 }, () => ({ refreshDue: () => { seen.push(inBatch); } }));
  for (const m of ms) wheel.add(m, 2000);
  run(clock, 2000);
  t.equal(seen.length, 20, 'every member once in one period');
  t.ok(seen.every(Boolean), 'each inside the batch hook');
  t.equal(batches, 2, 'one batch per slot: 2 slots at a 2 s period');
});
