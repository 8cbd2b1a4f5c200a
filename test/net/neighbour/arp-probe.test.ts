// RFC 5227 probe state machine, defender verdicts, and the drivers on an
// in-memory socket with a ManualClock (the real-kernel runs are in
// test/privileged/net-arp.test.ts).
import t from 'tap';
import { DEFAULT_ARP } from '../../../agent/config/defaults';
import { Registry } from 'prom-client';
import { ManualClock } from '../../../agent/clock';
import type { ArpTimings } from '../../../agent/config/types';
import { parseIPv4 } from '../../../agent/address';
import { arpAnnouncement, arpProbe, ARP_OP_REPLY, ARP_OP_REQUEST, decodeArp, encodeArp, type ArpPacket } from '../../../agent/net/neighbour/arp';
import {
  announce,
  defenseVerdict,
  initialProbeState,
  probeAddress,
  probeStep,
  type ProbeEvent,
  type ProbeState,
} from '../../../agent/net/neighbour/arp-probe';
import { netMetrics } from '../../../agent/net/metrics';
import { MemorySocket } from '../../helpers/memory-socket';

const ip = (s: string): number => parseIPv4(s)!;
const OUR_MAC = '02:aa:bb:cc:dd:01';
const OTHER_MAC = '52:54:00:ab:cd:ef';
const CANDIDATE = ip('10.99.0.50');
const T: ArpTimings = DEFAULT_ARP; // RFC 5227 §1.1, the config's defaults

function run(state: ProbeState, event: ProbeEvent, now: number, random = () => 0.5) {
  return probeStep(state, event, now, T, random);
}

function reply(senderMac: string, senderIp: number, targetIp = ip('10.99.0.1')): ArpPacket {
  return { ethDst: OUR_MAC, ethSrc: senderMac, op: ARP_OP_REPLY, senderMac, senderIp, targetMac: OUR_MAC, targetIp };
}

t.test('a free address: probe wait, PROBE_NUM probes, ANNOUNCE_WAIT, free', async (t) => {
  let s = initialProbeState(CANDIDATE, OUR_MAC);
  let now = 0;
  let step = run(s, { type: 'start' }, now, () => 0.25);
  t.equal(step.state.phase, 'waiting');
  t.same(step.actions, [{ type: 'arm-timer', at: 250 }], 'PROBE_WAIT is uniform in [0, 1 s]');
  s = step.state;

  const sends: number[] = [];
  for (let i = 0; i < 10 && s.phase !== 'free'; i++) {
    now = s.deadline!;
    step = run(s, { type: 'timer' }, now, () => 0.5);
    if (step.actions.some((a) => a.type === 'send-probe')) sends.push(now);
    s = step.state;
  }
  t.equal(s.phase, 'free');
  t.same(step.actions, [{ type: 'finished', conflict: false }]);
  t.equal(sends.length, 3, 'PROBE_NUM = 3 probes');
  t.same(sends, [250, 1750, 3250], 'spaced PROBE_MIN + 0.5 * (PROBE_MAX - PROBE_MIN) = 1.5 s');
  t.equal(now, 3250 + 2000, 'done ANNOUNCE_WAIT (2 s) after the last probe');
});

t.test('probe spacing stays within PROBE_MIN..PROBE_MAX for any random value', async (t) => {
  for (const r of [0, 0.999999]) {
    let s = run(initialProbeState(CANDIDATE, OUR_MAC), { type: 'start' }, 0, () => r).state;
    t.ok(s.deadline! >= 0 && s.deadline! <= 1000);
    s = run(s, { type: 'timer' }, s.deadline!, () => r).state;
    const first = s.deadline!;
    const gap = run(s, { type: 'timer' }, first, () => r).state.deadline! - first;
    t.ok(gap >= 1000 && gap <= 2000, `gap ${gap} ms in [1000, 2000]`);
  }
});

t.test('conflicts (RFC 5227 §2.1.1)', async (t) => {
  const started = run(initialProbeState(CANDIDATE, OUR_MAC), { type: 'start' }, 0).state;
  const probing = run(started, { type: 'timer' }, started.deadline!).state;

  for (const [name, state] of [['while waiting', started], ['while probing', probing]] as const) {
    const step = run(state, { type: 'arp', packet: reply(OTHER_MAC, CANDIDATE) }, 10);
    t.equal(step.state.phase, 'conflict', `reply from the holder ${name}`);
    t.equal(step.reason, 'conflict-sender-ip');
    t.same(step.actions, [{ type: 'finished', conflict: true, mac: OTHER_MAC }]);
    t.equal(step.state.conflictingMac, OTHER_MAC);
  }

  const req: ArpPacket = { ...arpAnnouncement(OTHER_MAC, CANDIDATE), op: ARP_OP_REQUEST };
  t.equal(run(probing, { type: 'arp', packet: req }, 10).reason, 'conflict-sender-ip', 'a request from the holder counts too');

  const theirProbe = arpProbe(OTHER_MAC, CANDIDATE);
  const p = run(probing, { type: 'arp', packet: theirProbe }, 10);
  t.equal(p.reason, 'conflict-probe', 'another host probing the same address');
  t.equal(p.state.phase, 'conflict');

  t.equal(run(probing, { type: 'arp', packet: reply(OUR_MAC, CANDIDATE) }, 10).reason, 'own-frame');
  t.equal(run(probing, { type: 'arp', packet: arpProbe(OUR_MAC, CANDIDATE) }, 10).reason, 'own-frame', 'our own probe echoed');
  t.equal(run(probing, { type: 'arp', packet: reply(OTHER_MAC, ip('10.99.0.51')) }, 10).reason, 'unrelated');
  t.equal(run(probing, { type: 'arp', packet: arpProbe(OTHER_MAC, ip('10.99.0.51')) }, 10).reason, 'unrelated');
});

t.test('conflict during ANNOUNCE_WAIT still counts; after the verdict nothing does', async (t) => {
  let s = run(initialProbeState(CANDIDATE, OUR_MAC), { type: 'start' }, 0).state;
  while (s.phase !== 'announce-wait') s = run(s, { type: 'timer' }, s.deadline!).state;
  t.equal(run(s, { type: 'arp', packet: reply(OTHER_MAC, CANDIDATE) }, s.deadline! - 1).state.phase, 'conflict');
  const free = run(s, { type: 'timer' }, s.deadline!).state;
  t.equal(free.phase, 'free');
  const late = run(free, { type: 'arp', packet: reply(OTHER_MAC, CANDIDATE) }, s.deadline! + 1);
  t.equal(late.reason, 'not-running');
  t.same(late.actions, []);
});

t.test('early timers and repeated starts are ignored', async (t) => {
  const s = run(initialProbeState(CANDIDATE, OUR_MAC), { type: 'start' }, 0).state;
  const early = run(s, { type: 'timer' }, s.deadline! - 1);
  t.equal(early.reason, 'early-timer');
  t.same(early.actions, [{ type: 'arm-timer', at: s.deadline }], 'an early timer is re-armed, not lost');
  t.equal(early.state, s);
  t.equal(run(s, { type: 'start' }, 0).reason, 'not-running');
  t.equal(run(initialProbeState(CANDIDATE, OUR_MAC), { type: 'timer' }, 0).reason, 'not-running');
});

t.test('probeNum 0 means no probing', async (t) => {
  const step = probeStep(initialProbeState(CANDIDATE, OUR_MAC), { type: 'start' }, 0, { ...T, probeNum: 0 }, Math.random);
  t.same(step.actions, [{ type: 'finished', conflict: false }]);
});

t.test('defender verdicts (RFC 5227 §2.4)', async (t) => {
  const held = new Set([CANDIDATE]);
  const o = { defend: true, defendIntervalMs: 10_000 };
  t.same(defenseVerdict(held, OUR_MAC, reply(OTHER_MAC, CANDIDATE), undefined, 0, o),
    { verdict: 'conflict', ip: CANDIDATE, mac: OTHER_MAC, defend: true, reason: 'first-in-interval' });
  t.same(defenseVerdict(held, OUR_MAC, reply(OTHER_MAC, CANDIDATE), 0, 9_999, o),
    { verdict: 'conflict', ip: CANDIDATE, mac: OTHER_MAC, defend: false, reason: 'repeated-within-interval' });
  t.equal(defenseVerdict(held, OUR_MAC, reply(OTHER_MAC, CANDIDATE), 0, 10_000, o).verdict, 'conflict');
  t.same(defenseVerdict(held, OUR_MAC, reply(OUR_MAC, CANDIDATE), undefined, 0, o), { verdict: 'ignore', reason: 'own-frame' });
  t.same(defenseVerdict(held, OUR_MAC, reply(OTHER_MAC, ip('10.99.0.9')), undefined, 0, o), { verdict: 'ignore', reason: 'not-held' });
  t.same(defenseVerdict(held, OUR_MAC, arpProbe(OTHER_MAC, CANDIDATE), undefined, 0, o), { verdict: 'ignore', reason: 'probe-for-held' });
  t.same(defenseVerdict(held, OUR_MAC, reply(OTHER_MAC, CANDIDATE), undefined, 0, { ...o, defend: false }).verdict, 'conflict');
});


t.test('probeAddress driver: free address in simulated time', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const registry = new Registry();
  const metrics = netMetrics(registry);
  const p = probeAddress({ socket, mac: OUR_MAC, ip: '10.99.0.50', timings: T, clock, random: () => 0.5, metrics });
  clock.advance(10_000);
  t.same(await p, { conflict: false });
  t.equal(socket.sent.length, 3);
  const d = decodeArp(socket.sent[0]!);
  t.ok(d.ok && d.packet.senderIp === 0 && d.packet.targetIp === CANDIDATE && d.packet.senderMac === OUR_MAC, 'probes are RFC 5227 probes');
  t.equal(socket.listenerCount('frame'), 0, 'listener removed');
  t.notOk(socket.closed, 'a socket passed in is not closed');
  t.match(await registry.metrics(), /lbagent_net_arp_probes_total 3/);
});

t.test('probeAddress driver: conflict reported with the MAC', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const registry = new Registry();
  const metrics = netMetrics(registry);
  const p = probeAddress({ socket, mac: OUR_MAC, ip: CANDIDATE, timings: T, clock, random: () => 0.5, metrics });
  clock.advance(600);
  socket.emit('frame', Buffer.from('garbage'), { csumNotReady: false, pktType: 0 });
  socket.inject(reply(OTHER_MAC, CANDIDATE));
  t.same(await p, { conflict: true, conflictingMac: OTHER_MAC });
  const text = await registry.metrics();
  t.match(text, /lbagent_net_arp_conflicts_total\{phase="probe"\} 1/);
  t.match(text, /lbagent_net_frames_dropped_total\{reason="short"\} 1/);
  clock.advance(10_000);
  t.equal(socket.sent.length, 1, 'no probe after the verdict');
});

t.test('probeAddress driver: a send failure rejects', async (t) => {
  const socket = new MemorySocket();
  socket.send = () => { throw new Error('ENETDOWN'); };
  const clock = new ManualClock();
  const p = probeAddress({ socket, mac: OUR_MAC, ip: CANDIDATE, timings: T, clock, random: () => 0 });
  clock.advance(1);
  await t.rejects(p, /ENETDOWN/);
});

t.test('announce: count announcements, intervalMs apart', async (t) => {
  const clock = new ManualClock();
  const socket = new MemorySocket();
  const registry = new Registry();
  const p = announce({ socket, mac: OUR_MAC, ip: '10.99.0.50', count: 3, intervalMs: 2000, clock, metrics: netMetrics(registry) });
  t.equal(socket.sent.length, 1, 'first at once');
  clock.advance(1999);
  t.equal(socket.sent.length, 1);
  clock.advance(1);
  t.equal(socket.sent.length, 2);
  clock.advance(2000);
  await p;
  t.equal(socket.sent.length, 3);
  t.same(socket.sent[0], encodeArp(arpAnnouncement(OUR_MAC, CANDIDATE)));
  t.match(await registry.metrics(), /lbagent_net_gratuitous_arps_sent_total 3/);
});
