// IPv6 VIP ownership, the pure core: DAD, the advertisement burst, the
// refresh, answers, defence, give-up or not, withdrawal. `now` is passed in:
// a minute of the protocol runs in microseconds.
import t from 'tap';
import { parseAddress } from '../../../agent/address';
import {
  ALL_NODES_ADDRESS,
  decodeNdp,
  encodeNdp,
  ndpDadProbe,
  ndpSolicitation,
  ndpSolicitedAdvertisement,
  ndpUnsolicitedAdvertisement,
  solicitedNodeAddress,
  type NdpPacket,
} from '../../../agent/net/neighbour/ndp';
import {
  DEFEND_INTERVAL_MS,
  DUP_ADDR_DETECT_TRANSMITS,
  initialNdpState,
  MAX_NEIGHBOR_ADVERTISEMENT,
  ndpStep,
  RETRANS_TIMER_MS,
  type NdpAction,
  type NdpOwnerConfig,
  type NdpState,
} from '../../../agent/net/neighbour/ndp-owner';

const v6 = (s: string): bigint => parseAddress(s)!.value;

const OUR_MAC = '02:aa:bb:cc:dd:01';
const OTHER_MAC = '52:54:00:ab:cd:ef';
const VIP = v6('fd00:99::2:abcd');
const CLIENT = v6('fd00:99::77');
const CFG: NdpOwnerConfig = {
  dadTransmits: DUP_ADDR_DETECT_TRANSMITS,
  retransTimerMs: RETRANS_TIMER_MS,
  announceNum: MAX_NEIGHBOR_ADVERTISEMENT,
  announceIntervalMs: 1000,
  refreshMs: 30_000,
  defendIntervalMs: DEFEND_INTERVAL_MS,
  giveUp: true,
  answerSolicitations: true,
};
const VRRP: NdpOwnerConfig = { ...CFG, dadTransmits: 0, giveUp: false };

const sends = (actions: readonly NdpAction[]): Array<[string, NdpPacket]> =>
  actions.flatMap((a) => (a.type === 'send' ? [[a.reason, a.packet] as [string, NdpPacket]] : []));

/** Start and run DAD to the end: held at `RETRANS_TIMER_MS`, first advertisement sent. */
function held(cfg = CFG): NdpState {
  let s = ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'start' }, 0, cfg).state;
  while (s.phase === 'tentative') s = ndpStep(s, { type: 'timer' }, s.deadline!, cfg).state;
  return s;
}

/** Another host's forged unsolicited advertisement for the VIP (what an attacker or a second holder sends). */
const forgedNa = (mac = OTHER_MAC): NdpPacket => ndpUnsolicitedAdvertisement(mac, VIP);

t.test('the solicited-node group to join is the VIP\'s, not the interface\'s first address\'s', async (t) => {
  // The interface's first addresses (a link-local, another global) have other groups; only the VIP's counts.
  const linkLocal = v6('fe80::5054:ff:fe12:3456');
  const firstGlobal = v6('fd00:99::5');
  const s = initialNdpState(VIP, OUR_MAC);
  t.equal(s.group, v6('ff02::1:ff02:abcd'));
  t.equal(s.groupMac, '33:33:ff:02:ab:cd');
  t.not(s.group, solicitedNodeAddress(linkLocal));
  t.not(s.group, solicitedNodeAddress(firstGlobal));
  const r = ndpStep(s, { type: 'start' }, 0, CFG);
  t.same(r.actions[0], { type: 'join', group: v6('ff02::1:ff02:abcd'), mac: '33:33:ff:02:ab:cd' }, 'joined before the first probe');
  // And the probe goes to that group, at its MAC.
  const [[, probe]] = sends(r.actions) as [[string, NdpPacket]];
  t.equal(probe.dst, s.group);
  t.equal(probe.ethDst, s.groupMac);
});

t.test('DAD: probes RetransTimer apart from ::, then unique and the burst', async (t) => {
  const cfg = { ...CFG, dadTransmits: 2 };
  let r = ndpStep(initialNdpState(VIP, OUR_MAC, '0102030405aa'), { type: 'start' }, 0, cfg);
  t.equal(r.reason, 'probing');
  t.equal(r.state.phase, 'tentative');
  t.same(sends(r.actions), [['dad-probe', ndpDadProbe(OUR_MAC, VIP, '0102030405aa')]]);
  t.same(r.actions.at(-1), { type: 'arm-timer', at: 1000 });
  const wire = decodeNdp(encodeNdp(ndpDadProbe(OUR_MAC, VIP, '0102030405aa')));
  t.ok(wire.ok && wire.packet.src === 0n && wire.packet.kind === 'solicitation' && wire.packet.sourceMac === undefined, 'from ::, no link-layer option');

  t.equal(ndpStep(r.state, { type: 'timer' }, 999, cfg).reason, 'early-timer');
  r = ndpStep(r.state, { type: 'timer' }, 1000, cfg);
  t.equal(r.reason, 'probe-sent');
  t.equal(r.state.probesSent, 2);
  t.same(r.actions.at(-1), { type: 'arm-timer', at: 2000 });

  // RetransTimer after the last probe: nobody objected.
  r = ndpStep(r.state, { type: 'timer' }, 2000, cfg);
  t.equal(r.reason, 'unique');
  t.equal(r.state.phase, 'held');
  t.same(r.actions, [
    { type: 'unique' },
    { type: 'send', reason: 'burst', packet: ndpUnsolicitedAdvertisement(OUR_MAC, VIP) },
    { type: 'arm-timer', at: 3000 },
  ]);
});

t.test('the burst: MAX_NEIGHBOR_ADVERTISEMENT unsolicited NAs with override, to all-nodes, then a refresh', async (t) => {
  let s = held();
  const sent: Array<[number, string]> = [[RETRANS_TIMER_MS, 'burst']];
  for (let i = 0; i < 4; i++) {
    const now = s.deadline!;
    const r = ndpStep(s, { type: 'timer' }, now, CFG);
    for (const [reason, p] of sends(r.actions)) {
      sent.push([now, reason]);
      t.ok(p.kind === 'advertisement' && p.override && !p.solicited && p.dst === ALL_NODES_ADDRESS && p.targetMac === OUR_MAC);
    }
    s = r.state;
  }
  t.same(sent, [[1000, 'burst'], [2000, 'burst'], [3000, 'burst'], [33_000, 'refresh'], [63_000, 'refresh']]);
  const wire = encodeNdp(ndpUnsolicitedAdvertisement(OUR_MAC, VIP));
  t.equal(wire[21], 255, 'hop limit 255');
});

t.test('refresh off: nothing after the burst', async (t) => {
  const cfg = { ...CFG, refreshMs: 0, announceNum: 1 };
  const s = held(cfg);
  t.equal(s.deadline, undefined);
  t.equal(ndpStep(s, { type: 'timer' }, 99_000, cfg).reason, 'no-advertisement-due');
});

t.test('DAD conflict: an advertisement for the tentative address', async (t) => {
  const s = ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'start' }, 0, CFG).state;
  const r = ndpStep(s, { type: 'ndp', packet: ndpSolicitedAdvertisement(OTHER_MAC, VIP, ndpDadProbe(OUR_MAC, VIP)) }, 500, CFG);
  t.equal(r.reason, 'duplicate');
  t.equal(r.state.phase, 'duplicate');
  t.equal(r.state.duplicateReason, 'advertised');
  t.equal(r.state.conflictingMac, OTHER_MAC);
  t.same(r.actions, [
    { type: 'clear-timer' },
    { type: 'leave', group: s.group, mac: s.groupMac },
    { type: 'duplicate', mac: OTHER_MAC, reason: 'advertised' },
  ]);
  t.same(sends(r.actions), [], 'nothing is sent for a duplicate');
  t.equal(ndpStep(r.state, { type: 'timer' }, 1000, CFG).reason, 'not-running', 'the address is never used');
});

t.test('DAD conflict: another node probing for the same address (RFC 4862 §5.4.3)', async (t) => {
  const s = ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'start' }, 0, CFG).state;
  const r = ndpStep(s, { type: 'ndp', packet: ndpDadProbe(OTHER_MAC, VIP, '111111111111') }, 200, CFG);
  t.equal(r.state.duplicateReason, 'probed');
  t.same(r.actions.at(-1), { type: 'duplicate', mac: OTHER_MAC, reason: 'probed' });
  // Another node sending from the address: in use.
  const u = ndpStep(s, { type: 'ndp', packet: ndpSolicitation(OTHER_MAC, VIP, CLIENT) }, 200, CFG);
  t.equal(u.state.duplicateReason, 'in-use');
});

t.test('DAD: what is not a conflict', async (t) => {
  const s = ndpStep(initialNdpState(VIP, OUR_MAC, 'aabbccddeeff'), { type: 'start' }, 0, CFG).state;
  // Address resolution for a tentative address is ignored, not answered (§5.4.3).
  const res = ndpStep(s, { type: 'ndp', packet: ndpSolicitation(OTHER_MAC, CLIENT, VIP) }, 100, CFG);
  t.equal(res.reason, 'resolution-for-tentative');
  t.same(res.actions, []);
  // Our own probe, seen on the socket, or looped back with our nonce (RFC 7527).
  t.equal(ndpStep(s, { type: 'ndp', packet: ndpDadProbe(OUR_MAC, VIP) }, 100, CFG).reason, 'own-frame');
  t.equal(ndpStep(s, { type: 'ndp', packet: { ...ndpDadProbe(OTHER_MAC, VIP), nonce: 'aabbccddeeff' } }, 100, CFG).reason, 'own-frame');
  // Another address.
  t.equal(ndpStep(s, { type: 'ndp', packet: ndpUnsolicitedAdvertisement(OTHER_MAC, CLIENT) }, 100, CFG).reason, 'unrelated');
  t.equal(ndpStep(s, { type: 'ndp', packet: ndpDadProbe(OTHER_MAC, CLIENT) }, 100, CFG).reason, 'unrelated');
});

t.test('a held VIP answers solicitations for it (RFC 4861 §7.2.4)', async (t) => {
  const s = held();
  const ns = ndpSolicitation(OTHER_MAC, CLIENT, VIP);
  const r = ndpStep(s, { type: 'ndp', packet: ns }, 5000, CFG);
  t.equal(r.reason, 'answered');
  t.same(r.actions, [{ type: 'send', reason: 'answer', packet: ndpSolicitedAdvertisement(OUR_MAC, VIP, ns) }]);
  const [[, na]] = sends(r.actions) as [[string, NdpPacket]];
  t.ok(na.kind === 'advertisement' && na.solicited && na.override && na.dst === CLIENT && na.ethDst === OTHER_MAC && na.src === VIP);
  // Another node's DAD probe for the held VIP: answered to all-nodes, so its DAD fails; not a conflict.
  const d = ndpStep(s, { type: 'ndp', packet: ndpDadProbe(OTHER_MAC, VIP) }, 5000, CFG);
  t.equal(d.reason, 'answered');
  t.same(sends(d.actions), [['answer', ndpUnsolicitedAdvertisement(OUR_MAC, VIP)]]);
  t.equal(d.state.conflictingMac, undefined);
  // When the kernel answers (the address is on the interface), the core does not answer twice.
  const quiet = ndpStep(s, { type: 'ndp', packet: ns }, 5000, { ...CFG, answerSolicitations: false });
  t.equal(quiet.reason, 'not-answering');
  t.same(quiet.actions, []);
  // Solicitations for other addresses are not ours to answer.
  t.equal(ndpStep(s, { type: 'ndp', packet: ndpSolicitation(OTHER_MAC, CLIENT, v6('fd00:99::5')) }, 5000, CFG).reason, 'unrelated');
});

t.test('a forged NA for a held VIP is answered by defence, not by giving up', async (t) => {
  for (const cfg of [CFG, VRRP]) {
    const s = held(cfg);
    const r = ndpStep(s, { type: 'ndp', packet: forgedNa() }, 20_000, cfg);
    t.equal(r.reason, 'defended');
    t.equal(r.state.phase, 'held');
    t.same(r.actions, [
      { type: 'send', reason: 'defend', packet: ndpUnsolicitedAdvertisement(OUR_MAC, VIP) },
      { type: 'defended', mac: OTHER_MAC },
      { type: 'arm-timer', at: 50_000 },
    ], 'one unsolicited NA with override; the refresh restarts from it');
    t.notOk(r.actions.some((a) => a.type === 'lost' || a.type === 'leave'));
  }
  // A forged NA that names another MAC in its option than in its Ethernet source: the option is the claim.
  const s = held();
  const spoof = { ...forgedNa(), ethSrc: '52:54:00:00:00:99' };
  t.same(ndpStep(s, { type: 'ndp', packet: spoof }, 20_000, CFG).actions.find((a) => a.type === 'defended'), { type: 'defended', mac: OTHER_MAC });
  // Someone sending from the VIP is a claim too.
  t.equal(ndpStep(s, { type: 'ndp', packet: ndpSolicitation(OTHER_MAC, VIP, CLIENT) }, 20_000, CFG).reason, 'defended');
  // An NA for the VIP naming our MAC (our kernel's own, through another port) is no conflict.
  t.equal(ndpStep(s, { type: 'ndp', packet: { ...forgedNa(OUR_MAC), ethSrc: OTHER_MAC } }, 20_000, CFG).reason, 'own-frame');
});

t.test('RFC 5227 §2.4 (b): a second conflict within the defend interval gives the address up', async (t) => {
  let r = ndpStep(held(), { type: 'ndp', packet: forgedNa() }, 20_000, CFG);
  r = ndpStep(r.state, { type: 'ndp', packet: forgedNa() }, 25_000, CFG);
  t.equal(r.reason, 'lost');
  t.equal(r.state.phase, 'lost');
  t.same(r.actions, [{ type: 'clear-timer' }, { type: 'leave', group: r.state.group, mac: r.state.groupMac }, { type: 'lost', mac: OTHER_MAC }]);
  t.same(sends(r.actions), [], 'giving up sends nothing');
  // Outside the interval it is a fresh defence.
  let q = ndpStep(held(), { type: 'ndp', packet: forgedNa() }, 20_000, CFG);
  q = ndpStep(q.state, { type: 'ndp', packet: forgedNa() }, 30_000, CFG);
  t.equal(q.reason, 'defended');
});

t.test('RFC 5227 §2.4 (c), VRRP: never give up, at most one defence per interval', async (t) => {
  let s = held(VRRP);
  const reasons: string[] = [];
  const defences: number[] = [];
  // An attacker floods forged NAs every 500 ms for 30 s.
  for (let now = 10_000; now < 40_000; now += 500) {
    const r = ndpStep(s, { type: 'ndp', packet: forgedNa() }, now, VRRP);
    reasons.push(r.reason);
    if (sends(r.actions).some(([why]) => why === 'defend')) defences.push(now);
    s = r.state;
  }
  t.equal(s.phase, 'held');
  t.notOk(reasons.includes('lost'));
  t.same(defences, [10_000, 20_000, 30_000]);
  t.equal(reasons.filter((x) => x === 'defence-rate-limited').length, 57);
});

t.test('no DAD (dadTransmits 0, a VRRP address): join and advertise at once', async (t) => {
  const r = ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'start' }, 0, VRRP);
  t.equal(r.reason, 'started');
  t.equal(r.state.phase, 'held');
  t.same(r.actions, [
    { type: 'join', group: r.state.group, mac: r.state.groupMac },
    { type: 'send', reason: 'burst', packet: ndpUnsolicitedAdvertisement(OUR_MAC, VIP) },
    { type: 'arm-timer', at: 1000 },
  ]);
  t.equal(ndpStep(r.state, { type: 'start' }, 10, VRRP).reason, 'already-started');
});

t.test('reannounce: a full burst again at once (a VIP that moved here)', async (t) => {
  let s = held();
  for (let i = 0; i < 2; i++) s = ndpStep(s, { type: 'timer' }, s.deadline!, CFG).state;
  t.equal(s.burstLeft, 0);
  const r = ndpStep(s, { type: 'reannounce' }, 40_000, CFG);
  t.equal(r.reason, 'reannounced');
  t.same(sends(r.actions).map(([why]) => why), ['reannounce']);
  t.equal(r.state.burstLeft, MAX_NEIGHBOR_ADVERTISEMENT - 1);
  t.same(r.actions.at(-1), { type: 'arm-timer', at: 41_000 });
  t.equal(ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'reannounce' }, 0, CFG).reason, 'not-running');
});

t.test('retime: the refresh follows the new interval from now', async (t) => {
  let s = held();
  for (let i = 0; i < 2; i++) s = ndpStep(s, { type: 'timer' }, s.deadline!, CFG).state;
  const cfg = { ...CFG, refreshMs: 5000 };
  const r = ndpStep(s, { type: 'retime' }, 10_000, cfg);
  t.equal(r.reason, 'retimed');
  t.same(r.actions, [{ type: 'arm-timer', at: 15_000 }]);
  // During a burst the burst finishes first.
  t.equal(ndpStep(held(), { type: 'retime' }, 1500, cfg).reason, 'not-running');
});

t.test('withdrawal sends nothing and leaves the group', async (t) => {
  for (const s of [held(), ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'start' }, 0, CFG).state]) {
    const r = ndpStep(s, { type: 'stop' }, 50_000, CFG);
    t.equal(r.reason, 'stopped');
    t.equal(r.state.phase, 'idle');
    t.same(r.actions, [{ type: 'clear-timer' }, { type: 'leave', group: s.group, mac: s.groupMac }]);
    t.same(sends(r.actions), []);
    // Nothing afterwards either: no answer, no defence, no refresh.
    t.equal(ndpStep(r.state, { type: 'timer' }, 90_000, CFG).reason, 'not-running');
    t.equal(ndpStep(r.state, { type: 'ndp', packet: ndpSolicitation(OTHER_MAC, CLIENT, VIP) }, 90_000, CFG).reason, 'not-running');
    t.equal(ndpStep(r.state, { type: 'ndp', packet: forgedNa() }, 90_000, CFG).reason, 'not-running');
  }
});

t.test('a duplicate address can be probed again later', async (t) => {
  const s = ndpStep(initialNdpState(VIP, OUR_MAC), { type: 'start' }, 0, CFG).state;
  const dup = ndpStep(s, { type: 'ndp', packet: forgedNa() }, 100, CFG).state;
  t.equal(dup.phase, 'duplicate');
  const again = ndpStep(dup, { type: 'start' }, 60_000, CFG);
  t.equal(again.reason, 'probing');
  t.equal(again.state.duplicateReason, undefined);
  t.equal(again.state.probesSent, 1);
});
