// The IPv6 VIP owner's driver on an in-memory socket with a manual clock:
// DAD joins the solicited-node group and ends at 'unique' without
// advertising, a duplicate is reported with why, the held owner advertises
// from the link-local address with override, defends a forged advertisement,
// withdraws without a frame; a malformed frame is dropped and counted.
import t from 'tap';
import { Registry } from 'prom-client';
import { MemorySocket } from '../../helpers/memory-socket';
import { ManualClock } from '../../../agent/clock';
import { parseAddress } from '../../../agent/address';
import { netMetrics } from '../../../agent/net/metrics';
import { decodeNdp, encodeNdp, ndpUnsolicitedAdvertisement, ALL_NODES_ADDRESS, type NdpPacket } from '../../../agent/net/neighbour/ndp';
import { dadProbe, NdpVipOwner, type NdpConflict } from '../../../agent/net/neighbour/ndp-driver';
import type { NdpOwnerConfig } from '../../../agent/net/neighbour/ndp-owner';
import type { NdpSocket } from '../../../agent/net/neighbour/ndp-socket';
import { createLogger } from '../../../agent/log';

const v6 = (s: string): bigint => parseAddress(s)!.value;
const OUR_MAC = '02:aa:bb:cc:dd:01';
const OTHER_MAC = '52:54:00:ab:cd:ef';
const VIP = 'fd00:99::2:abcd';
const LL = v6('fe80::aa:bbff:fecc:dd01');
const CFG: NdpOwnerConfig = { dadTransmits: 1, retransTimerMs: 1000, announceNum: 3, announceIntervalMs: 1000, refreshMs: 10_000, defendIntervalMs: 10_000, giveUp: true, answerSolicitations: false };

class GroupSocket extends MemorySocket {
  readonly groups: bigint[] = [];
  joinGroup(group: bigint): void { this.groups.push(group); }
  leaveGroup(group: bigint): void { this.groups.splice(this.groups.indexOf(group), 1); }
  injectNdp(p: NdpPacket): void { this.emit('frame', encodeNdp(p), { csumNotReady: false, pktType: 0 }); }
  get asNdp(): NdpSocket { return this; }
}

const decoded = (s: MemorySocket): NdpPacket[] => s.sent.map((f) => { const r = decodeNdp(f); if (!r.ok) throw new Error(r.reason); return r.packet; });

t.test('DAD: one probe from :: to the solicited-node group, then unique, nothing advertised', async (t) => {
  const sock = new GroupSocket();
  const clock = new ManualClock();
  const p = dadProbe({ socket: sock.asNdp, mac: OUR_MAC, ip: VIP, source: LL, config: CFG, clock });
  t.same(sock.groups, [v6('ff02::1:ff02:abcd')], 'joined ff02::1:ff02:abcd before the probe');
  const [probe] = decoded(sock);
  t.match(probe, { kind: 'solicitation', src: 0n, dst: v6('ff02::1:ff02:abcd'), target: v6(VIP), sourceMac: undefined });
  clock.advance(1000);
  t.same(await p, { duplicate: false });
  t.equal(sock.sent.length, 1, 'no advertisement after DAD');
  t.same(sock.groups, [], 'left the group');
});

t.test('DAD: an advertisement for the address from another host makes it a duplicate, with the MAC and why', async (t) => {
  const sock = new GroupSocket();
  const clock = new ManualClock();
  const p = dadProbe({ socket: sock.asNdp, mac: OUR_MAC, ip: VIP, config: CFG, clock });
  sock.injectNdp(ndpUnsolicitedAdvertisement(OTHER_MAC, v6(VIP)));
  t.same(await p, { duplicate: true, mac: OTHER_MAC, reason: 'advertised' });
  clock.advance(5000);
  t.equal(sock.sent.length, 1, 'only the probe went out');
});

t.test('DAD past the socket\'s group limit: logged, the probe still goes out and an answer to all-nodes is still heard', async (t) => {
  const sock = new GroupSocket();
  sock.joinGroup = (): void => { throw Object.assign(new Error('joining a solicited-node group failed: ENOMEM'), { code: 'LB_ERR_NET_SOCKET' }); };
  const clock = new ManualClock();
  const warned: string[] = [];
  const log = createLogger('info', { write: (line: string) => { warned.push((JSON.parse(line) as { msg: string }).msg); } });
  const p = dadProbe({ socket: sock.asNdp, mac: OUR_MAC, ip: VIP, config: CFG, clock, log });
  t.equal(sock.sent.length, 1, 'the probe went out');
  t.match(warned, [/could not join the solicited-node group/]);
  sock.injectNdp(ndpUnsolicitedAdvertisement(OTHER_MAC, v6(VIP)));
  t.same(await p, { duplicate: true, mac: OTHER_MAC, reason: 'advertised' });
});

t.test('held: burst from the link-local address with override, refresh, defence of a forged advertisement, silent withdrawal', async (t) => {
  const sock = new GroupSocket();
  const clock = new ManualClock();
  const registry = new Registry();
  const metrics = netMetrics(registry);
  const owner = new NdpVipOwner({ socket: sock.asNdp, mac: OUR_MAC, ip: VIP, source: LL, config: { ...CFG, dadTransmits: 0 }, clock, metrics });
  owner.start();
  clock.advance(1000);
  clock.advance(1000);
  const burst = decoded(sock);
  t.equal(burst.length, 3, 'three advertisements');
  for (const a of burst) t.match(a, { kind: 'advertisement', src: LL, dst: ALL_NODES_ADDRESS, target: v6(VIP), override: true, solicited: false, targetMac: OUR_MAC });
  clock.advance(10_000);
  t.equal(sock.sent.length, 4, 'the refresh');
  const conflicts: NdpConflict[] = [];
  owner.on('conflict', (c: NdpConflict) => conflicts.push(c));
  sock.injectNdp(ndpUnsolicitedAdvertisement(OTHER_MAC, v6(VIP)));
  t.same(conflicts, [{ ip: VIP, mac: OTHER_MAC, defended: true }]);
  t.equal(sock.sent.length, 5, 'answered at once');
  t.match(decoded(sock)[4], { kind: 'advertisement', override: true, targetMac: OUR_MAC });
  // A malformed frame (bad checksum) is dropped and counted, never trusted.
  const bad = encodeNdp(ndpUnsolicitedAdvertisement(OTHER_MAC, v6(VIP)));
  bad[bad.length - 1]! ^= 0xff;
  sock.emit('frame', bad, { csumNotReady: false, pktType: 0 });
  t.equal(conflicts.length, 1, 'the malformed one changed nothing');
  t.match(await registry.getSingleMetricAsString('lbagent_net_frames_dropped_total'), /reason="bad-icmp-checksum"} 1/);
  const sent = await registry.getSingleMetricAsString('lbagent_net_ndp_sent_total');
  t.match(sent, /reason="burst"} 3/);
  t.match(sent, /reason="refresh"} 1/);
  t.match(sent, /reason="defend"} 1/);
  t.match(await registry.getSingleMetricAsString('lbagent_net_ndp_conflicts_total'), /phase="defend"} 1/);
  owner.close();
  clock.advance(60_000);
  t.equal(sock.sent.length, 5, 'withdrawal sends nothing');
  t.same(sock.groups, [], 'left the group');
});


t.test('on the interface: no join of its own (the kernel\'s stands for it); joins when the address leaves, leaves when it is back; defends all along', async (t) => {
  const sock = new GroupSocket();
  const clock = new ManualClock();
  const group = v6('ff02::1:ff02:abcd');
  const owner = new NdpVipOwner({ socket: sock.asNdp, mac: OUR_MAC, ip: VIP, source: LL, config: { ...CFG, dadTransmits: 0 }, onInterface: true, clock });
  owner.start();
  t.same(sock.groups, [], 'held on the interface: the socket holds no join of the group');
  t.equal(owner.groupJoined, false);
  t.equal(sock.sent.length, 1, 'the burst starts all the same');
  owner.setOnInterface(false);
  t.same(sock.groups, [group], 'the address left the interface: the owner joins the group');
  t.equal(owner.groupJoined, true);
  owner.setOnInterface(false);
  t.same(sock.groups, [group], 'once');
  const conflicts: NdpConflict[] = [];
  owner.on('conflict', (c: NdpConflict) => conflicts.push(c));
  sock.injectNdp(ndpUnsolicitedAdvertisement(OTHER_MAC, v6(VIP)));
  t.same(conflicts, [{ ip: VIP, mac: OTHER_MAC, defended: true }], 'a forgery meanwhile is defended');
  owner.setOnInterface(true);
  t.same(sock.groups, [], 'back on the interface: left again');
  owner.setOnInterface(false);
  owner.close();
  t.same(sock.groups, [], 'a closed owner leaves what it held');
  owner.setOnInterface(false);
  t.same(sock.groups, [], 'and joins nothing after');
});

t.test('DAD with the address on the interface already: no join, the probe still goes out', async (t) => {
  const sock = new GroupSocket();
  const clock = new ManualClock();
  const p = dadProbe({ socket: sock.asNdp, mac: OUR_MAC, ip: VIP, config: CFG, onInterface: true, clock });
  t.same(sock.groups, [], 'no join');
  t.equal(sock.sent.length, 1, 'the probe');
  clock.advance(1000);
  t.same(await p, { duplicate: false });
});
