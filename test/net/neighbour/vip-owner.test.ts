// VIP ownership: the pure core (burst, refresh, defence, give-up,
// re-announcement) and the driver on an in-memory socket with a ManualClock.
import t from 'tap';
import { Registry } from 'prom-client';
import { ManualClock } from '../../../agent/clock';
import { createLogger } from '../../../agent/log';
import { parseIPv4 } from '../../../agent/address';
import { arpAnnouncement, arpProbe, ARP_OP_REPLY, decodeArp, encodeArp, type ArpPacket } from '../../../agent/net/neighbour/arp';
import { netMetrics } from '../../../agent/net/metrics';
import { MemorySocket } from '../../helpers/memory-socket';
import { initialVipState, vipStep, VipOwner, type VipConflict, type VipOwnerConfig, type VipState } from '../../../agent/net/neighbour/vip-owner';
import { RefreshWheel } from '../../../agent/net/neighbour/refresh-wheel';

const ip = (s: string): number => parseIPv4(s)!;
const OUR_MAC = '02:aa:bb:cc:dd:01';
const OTHER_MAC = '52:54:00:ab:cd:ef';
const VIP = ip('10.99.0.50');
const CFG: VipOwnerConfig = { announceNum: 2, announceIntervalMs: 2000, refreshMs: 10_000, defendIntervalMs: 10_000, giveUp: true };

function claim(mac: string, senderIp = VIP): ArpPacket {
  return { ethDst: 'ff:ff:ff:ff:ff:ff', ethSrc: mac, op: ARP_OP_REPLY, senderMac: mac, senderIp, targetMac: '00:00:00:00:00:00', targetIp: senderIp };
}

function held(now = 0, cfg = CFG): VipState {
  return vipStep(initialVipState(VIP, OUR_MAC), { type: 'start' }, now, cfg).state;
}

t.test('core: start sends the first of ANNOUNCE_NUM announcements at once', async (t) => {
  const s = vipStep(initialVipState(VIP, OUR_MAC), { type: 'start' }, 100, CFG);
  t.equal(s.state.phase, 'held');
  t.same(s.actions, [{ type: 'announce', reason: 'burst' }, { type: 'arm-timer', at: 2100 }]);
  t.equal(vipStep(s.state, { type: 'start' }, 200, CFG).reason, 'already-held');
});

t.test('core: the burst on its timer, then no timer: a refresh is one announcement when the wheel says so, none during a burst', async (t) => {
  let s = held(0);
  t.equal(vipStep(s, { type: 'refresh' }, 1000, CFG).reason, 'in-burst', 'the burst announces already');
  t.same(vipStep(s, { type: 'refresh' }, 1000, CFG).actions, []);
  const r = vipStep(s, { type: 'timer' }, 2000, CFG);
  t.same(r.actions, [{ type: 'announce', reason: 'burst' }, { type: 'clear-timer' }], 'the last of the burst arms nothing');
  s = r.state;
  t.equal(vipStep(s, { type: 'refresh' }, 2000 + CFG.refreshMs / 2 - 1, CFG).reason, 'refresh', 'its slot announces even just after the burst: a neighbour waits one interval at most');
  for (const now of [10_000, 20_000]) {
    const x = vipStep(s, { type: 'refresh' }, now, CFG);
    t.equal(x.reason, 'refresh');
    t.same(x.actions, [{ type: 'announce', reason: 'refresh' }]);
    s = x.state;
  }
  t.equal(vipStep(initialVipState(VIP, OUR_MAC), { type: 'refresh' }, 0, CFG).reason, 'not-held', 'an address not held refreshes nothing');
  t.same(vipStep(vipStep(s, { type: 'stop' }, 30_000, CFG).state, { type: 'refresh' }, 30_000, CFG).actions, [], 'nor one withdrawn');
});

t.test('core: refresh off (0): nothing after the burst', async (t) => {
  const cfg = { ...CFG, refreshMs: 0 };
  const s = held(0, cfg);
  const r = vipStep(s, { type: 'timer' }, 2000, cfg);
  t.same(r.actions, [{ type: 'announce', reason: 'burst' }, { type: 'clear-timer' }]);
  t.equal(r.state.nextAnnounceAt, undefined);
  t.equal(vipStep(r.state, { type: 'timer' }, 50_000, cfg).reason, 'no-announcement-due');
});

t.test('core: an early timer re-arms and sends nothing', async (t) => {
  const s = held(0);
  const r = vipStep(s, { type: 'timer' }, 1999, CFG);
  t.equal(r.reason, 'early-timer');
  t.same(r.actions, [{ type: 'arm-timer', at: 2000 }]);
});

t.test('core: RFC 5227 §2.4 (b): defend once, give up on a second conflict within DEFEND_INTERVAL', async (t) => {
  let s = held(0);
  let r = vipStep(s, { type: 'arp', packet: claim(OTHER_MAC) }, 5000, CFG);
  t.equal(r.reason, 'defended');
  t.same(r.actions, [{ type: 'announce', reason: 'defend' }, { type: 'defended', mac: OTHER_MAC }, { type: 'clear-timer' }], 'one announcement; the refresh stays the wheel\'s');
  s = r.state;
  t.equal(s.phase, 'held');
  r = vipStep(s, { type: 'arp', packet: claim(OTHER_MAC) }, 14_999, CFG);
  t.equal(r.reason, 'lost');
  t.same(r.actions, [{ type: 'clear-timer' }, { type: 'lost', mac: OTHER_MAC }]);
  t.equal(r.state.phase, 'lost');
  t.equal(vipStep(r.state, { type: 'timer' }, 20_000, CFG).reason, 'not-held', 'nothing announced for a lost address');
  t.equal(vipStep(r.state, { type: 'reannounce' }, 20_000, CFG).reason, 'not-held');
});

t.test('core: RFC 5227 §2.4 (c) (giveUp false): never give up, defend at most once per DEFEND_INTERVAL', async (t) => {
  const c = { ...CFG, giveUp: false };
  let s = held(0, c);
  const seen: string[] = [];
  for (const now of [1000, 2000, 5000, 10_999, 11_000, 11_500]) {
    const r = vipStep(s, { type: 'arp', packet: claim(OTHER_MAC) }, now, c);
    seen.push(`${now}:${r.reason}:${r.actions.filter((a) => a.type === 'announce').length}`);
    s = r.state;
  }
  t.same(seen, ['1000:defended:1', '2000:defence-rate-limited:0', '5000:defence-rate-limited:0', '10999:defence-rate-limited:0', '11000:defended:1', '11500:defence-rate-limited:0']);
  t.equal(s.phase, 'held', 'still held');
  t.same(vipStep(s, { type: 'arp', packet: claim(OTHER_MAC) }, 11_600, c).actions, [{ type: 'conflict', mac: OTHER_MAC }]);
});

t.test('core: a second conflict after DEFEND_INTERVAL is defended again', async (t) => {
  const s1 = vipStep(held(0), { type: 'arp', packet: claim(OTHER_MAC) }, 5000, CFG).state;
  const r = vipStep(s1, { type: 'arp', packet: claim(OTHER_MAC) }, 15_000, CFG);
  t.equal(r.reason, 'defended');
});

t.test('core: what is not a conflict', async (t) => {
  const s = held(0);
  t.equal(vipStep(s, { type: 'arp', packet: claim(OUR_MAC) }, 1, CFG).reason, 'own-frame');
  t.equal(vipStep(s, { type: 'arp', packet: claim(OTHER_MAC, ip('10.99.0.51')) }, 1, CFG).reason, 'unrelated');
  t.equal(vipStep(s, { type: 'arp', packet: arpProbe(OTHER_MAC, VIP) }, 1, CFG).reason, 'probe-for-held', 'a probe for the VIP: the kernel answers it');
  t.equal(vipStep(initialVipState(VIP, OUR_MAC), { type: 'arp', packet: claim(OTHER_MAC) }, 1, CFG).reason, 'not-held');
});

t.test('core: reannounce starts a new burst; stop clears the timer', async (t) => {
  const s = vipStep(held(0), { type: 'timer' }, 2000, CFG).state;
  const r = vipStep(s, { type: 'reannounce' }, 3000, CFG);
  t.same(r.actions, [{ type: 'announce', reason: 'reannounce' }, { type: 'arm-timer', at: 5000 }]);
  const b = vipStep(r.state, { type: 'timer' }, 5000, CFG);
  t.same(b.actions, [{ type: 'announce', reason: 'burst' }, { type: 'clear-timer' }], 'the burst over: its timer goes');
  const st = vipStep(b.state, { type: 'stop' }, 6000, CFG);
  t.same(st.actions, [{ type: 'clear-timer' }]);
  t.equal(st.state.phase, 'idle');
  t.equal(vipStep(st.state, { type: 'stop' }, 7000, CFG).reason, 'not-held');
});


t.test('driver: burst and refresh on the clock, metrics by reason', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const registry = new Registry();
  const o = new VipOwner({ socket, mac: OUR_MAC, ip: '10.99.0.50', announceNum: 2, announceIntervalMs: 2000, refreshMs: 10_000, clock, metrics: netMetrics(registry) });
  o.start();
  t.equal(socket.sent.length, 1, 'first announcement at once');
  t.same(socket.sent[0], encodeArp(arpAnnouncement(OUR_MAC, VIP)));
  clock.advance(2000);
  t.equal(socket.sent.length, 2, 'burst of ANNOUNCE_NUM');
  // A lone VIP's slot: the wheel's boundary one period after it was held.
  clock.advance(7999);
  t.equal(socket.sent.length, 2);
  clock.advance(1);
  t.equal(socket.sent.length, 3, 'refresh refreshMs after the VIP was held');
  clock.advance(30_000);
  t.equal(socket.sent.length, 6, 'and every refreshMs after that');
  const m = await registry.metrics();
  t.match(m, /lbagent_net_vip_announcements_total\{reason="burst"\} 2/);
  t.match(m, /lbagent_net_vip_announcements_total\{reason="refresh"\} 4/);
  t.match(m, /lbagent_net_gratuitous_arps_sent_total 6/);
  o.close();
  clock.advance(60_000);
  t.equal(socket.sent.length, 6, 'nothing after close');
  t.notOk(socket.closed, 'a socket passed in is not closed');
});

t.test('driver: defends once, then reports the address lost', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const registry = new Registry();
  const o = new VipOwner({ socket, mac: OUR_MAC, ip: VIP, announceNum: 1, announceIntervalMs: 2000, refreshMs: 0, clock, metrics: netMetrics(registry) });
  const conflicts: VipConflict[] = [];
  const lost: VipConflict[] = [];
  o.on('conflict', (c: VipConflict) => conflicts.push(c));
  o.on('lost', (c: VipConflict) => { lost.push(c); o.close(); });
  o.start();
  clock.advance(1000);
  socket.inject(claim(OTHER_MAC));
  t.same(conflicts, [{ ip: '10.99.0.50', mac: OTHER_MAC, defended: true }]);
  t.equal(socket.sent.length, 2, 'one defending announcement');
  t.equal(decodeArp(socket.sent[1]!).ok, true);
  t.ok(o.held);
  clock.advance(3000);
  socket.inject(claim(OTHER_MAC));
  t.same(lost, [{ ip: '10.99.0.50', mac: OTHER_MAC, defended: false }]);
  t.equal(socket.sent.length, 2, 'no announcement for an address given up');
  t.notOk(o.held);
  t.match(await registry.metrics(), /lbagent_net_arp_conflicts_total\{phase="defend"\} 2/);
  t.match(await registry.metrics(), /lbagent_net_vip_announcements_total\{reason="defend"\} 1/);
});

t.test('driver: giveUp false keeps the address and reports unanswered conflicts', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const o = new VipOwner({ socket: socket.asSocket, mac: OUR_MAC, ip: VIP, announceNum: 1, announceIntervalMs: 2000, refreshMs: 0, giveUp: false, clock });
  const seen: VipConflict[] = [];
  o.on('conflict', (c: VipConflict) => seen.push(c));
  o.on('lost', () => t.fail('never lost'));
  o.start();
  socket.inject(claim(OTHER_MAC));
  socket.inject(claim(OTHER_MAC));
  socket.inject(claim(OTHER_MAC));
  t.same(seen.map((c) => c.defended), [true, false, false]);
  t.equal(socket.sent.length, 2, 'the start-up announcement and one defence');
  t.ok(o.held);
  o.close();
});

t.test('driver: reannounce sends a new burst; a failed first announcement throws', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const o = new VipOwner({ socket, mac: OUR_MAC, ip: VIP, announceNum: 3, announceIntervalMs: 100, refreshMs: 0, clock });
  o.start();
  clock.advance(1000);
  t.equal(socket.sent.length, 3);
  o.reannounce();
  clock.advance(1000);
  t.equal(socket.sent.length, 6, 'a full burst again');
  o.close();

  const bad = new MemorySocket();
  bad.failSends = true;
  const o2 = new VipOwner({ socket: bad, mac: OUR_MAC, ip: VIP, announceNum: 2, announceIntervalMs: 100, refreshMs: 1000, clock });
  t.throws(() => o2.start(), /ENETDOWN/);
  t.notOk(o2.held, 'not held when it could not be announced');
  bad.failSends = false;
  clock.advance(5000);
  t.equal(bad.sent.length, 0, 'no timer left behind');
  o2.close();
});

t.test('retime: a reload\'s refresh interval holds from now on; 0 takes the VIP out of the wheel', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const wheel = new RefreshWheel({ clock });
  const o = new VipOwner({ socket, mac: OUR_MAC, ip: '10.99.0.200', announceNum: 1, announceIntervalMs: 2000, refreshMs: 10_000, wheel, clock });
  o.start();
  t.equal(socket.sent.length, 1);
  clock.advance(3000);
  o.retime({ announceNum: 1, announceIntervalMs: 2000, refreshMs: 1000 });
  clock.advance(1000);
  t.equal(socket.sent.length, 2, 'the next refresh within 1 s');
  clock.advance(5000);
  t.equal(socket.sent.length, 7, 'then every second');
  o.retime({ announceNum: 1, announceIntervalMs: 2000, refreshMs: 0 });
  t.same(wheel.counts(), { members: 0, timers: 0 }, 'refresh turned off: out of the wheel');
  clock.advance(60_000);
  t.equal(socket.sent.length, 7, 'nothing more');
  o.close();
});

t.test('driver: its log lines carry module, ip and mac', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const lines: Record<string, unknown>[] = [];
  const log = createLogger('info', { write: (s: string) => { lines.push(JSON.parse(s) as Record<string, unknown>); } });
  const o = new VipOwner({ socket, mac: OUR_MAC, ip: VIP, announceNum: 1, announceIntervalMs: 2000, refreshMs: 0, clock, log });
  o.start();
  t.equal(lines.length, 0, 'the announcement is a debug line: nothing at info');
  socket.inject(claim(OTHER_MAC));
  t.equal(lines.length, 1);
  t.match(lines[0], { level: 'warn', module: 'net/vip-owner', ip: '10.99.0.50', mac: OUR_MAC, op: 'defend', conflictingMac: OTHER_MAC });
  o.close();
});
