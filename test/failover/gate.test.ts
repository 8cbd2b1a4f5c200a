// Unit tests of VrrpGate on an in-memory LAN (fake packet sockets handing
// frames to each other through a ManualClock): which routers exist for which
// services, who holds a service, what the adverts list (held VIP,
// loadBalancerIP, the other Master's list, the last held; count 0 only when
// nothing is known), the preemption handover, the counts status shows, and
// reconfiguration. The gate through the real agent on the real kernel is
// test/privileged/vrrp-agent-*.test.ts.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import { formatIPv4 } from '../../agent/address';
import type { FrameInfo, PacketSocket, PacketSocketOptions } from '../../agent/net/packet/packet';
import { decodeAdvertisement } from '../../agent/failover/codec';
import { masterDownIntervalMs, skewTimeMs } from '../../agent/failover/machine';
import { VrrpGate, HAND_BACK_MS, PREEMPT_HANDOVER_MS, type PriorityEvent, type VrrpGateOptions } from '../../agent/failover/gate';
import { PriorityTracker } from '../../agent/failover/tracker';
import type { FailoverConfig, ServiceSpec } from '../../agent/config/types';

class FakeLan {
  readonly sockets = new Set<FakeSocket>();
  /** Frames sent, with the sender's ifindex (= node id here). */
  readonly wire: { from: number; frame: Buffer }[] = [];
  /** Nodes (by ifindex) cut off the LAN. */
  readonly cut = new Set<number>();
  constructor(readonly clock: ManualClock) {}
  open = (opts: PacketSocketOptions): PacketSocket => {
    const s = new FakeSocket(this, opts);
    this.sockets.add(s);
    return s;
  };
  deliver(from: FakeSocket, frame: Buffer): void {
    this.wire.push({ from: from.ifindex, frame });
    if (this.cut.has(from.ifindex)) return;
    for (const s of this.sockets) {
      if (s === from || this.cut.has(s.ifindex)) continue;
      this.clock.setTimeout(() => s.receive(frame, { csumNotReady: false, pktType: 2 }), 0.2);
    }
  }
  /** Adverts one node sent, decoded. */
  sent(ifindex: number): { priority: number; addresses: string[] }[] {
    return this.wire.filter((w) => w.from === ifindex).map((w) => {
      const r = decodeAdvertisement(w.frame);
      if (!r.ok) throw new Error(r.reason);
      return { priority: r.frame.priority, addresses: r.frame.addresses.map(formatIPv4) };
    });
  }
}

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly ifindex: number;
  constructor(private readonly lan: FakeLan, readonly opts: PacketSocketOptions) {
    super();
    this.ifindex = opts.ifindex;
  }
  send(frame: Buffer): void { this.lan.deliver(this, frame); }
  receive(frame: Buffer, info: FrameInfo): void { this.emit('frame', frame, info); }
  close(): void { this.lan.sockets.delete(this); }
}

function svc(name: string, over: Partial<ServiceSpec> = {}): ServiceSpec {
  return {
    key: `default/${name}`, name, namespace: 'default', ipam: 'pool', primaryService: undefined, loadBalancerIP: undefined,
    vrid: undefined, priority: undefined, ports: [], backends: [], sourceIP: 'snat', topology: 'any',
    healthCheck: { enabled: false, type: 'tcp', port: 80, successThreshold: 1, failureThreshold: 3, periodSeconds: 5, timeoutSeconds: 3, http: undefined, passiveFailures: 0 },
    ...over,
  };
}

const FAILOVER: FailoverConfig = { mode: 'vrrp', vrid: 51, advertInterval: 1, preempt: true, preemptDelay: 0, interface: undefined, peers: [], track: { interfaces: [], services: [] } };

interface Node {
  gate: VrrpGate;
  ip: string;
  /** What the node's sources hold: the daemon's vips callback. */
  held: Map<string, string>;
  changes: string[][];
  registry: Registry;
}

function world(): { clock: ManualClock; lan: FakeLan; node(n: number, priority: number, services: ServiceSpec[], over?: Partial<VrrpGateOptions>): Node } {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  return {
    clock, lan,
    node(n, priority, services, over = {}) {
      const registry = new Registry();
      const ip = `10.99.0.${n}`;
      const gate = new VrrpGate({ config: FAILOVER, nodePriority: priority, ifindex: n, ifname: 'eth0', srcIp: ip, log: silentLogger(), registry, clock, openSocket: lan.open, ...over });
      const held = new Map<string, string>();
      const changes: string[][] = [];
      gate.on('change', (keys: string[]) => changes.push(keys));
      gate.update(services, (k) => held.get(k));
      return { gate, ip, held, changes, registry };
    },
  };
}

const mdi = (priority: number, cs = 100): number => masterDownIntervalMs(priority, cs);

t.test('one router per VRID: services share the base VRID, a pinned one gets its own', async (t) => {
  const w = world();
  const a = w.node(1, 100, [svc('web'), svc('api'), svc('db', { vrid: 60 })]);
  t.equal(w.lan.sockets.size, 2, 'two routers (VRIDs 51 and 60)');
  t.equal(a.gate.status('default/web')?.vrid, 51);
  t.equal(a.gate.status('default/api')?.vrid, 51);
  t.equal(a.gate.status('default/db')?.vrid, 60);
  t.equal(a.gate.status('default/nope'), undefined);
  t.equal(a.gate.isMaster('default/web'), false, 'Backup at start');
  const sorted = (c: string[][]): string[] => c.map((k) => k.join(',')).sort();
  t.same(sorted(a.changes), ['default/db', 'default/web,default/api'], "each router's startup Backup is a change");
  w.clock.advance(mdi(100) + 1);
  t.equal(a.gate.isMaster('default/web'), true, 'alone: Master after Master_Down_Interval');
  t.equal(a.gate.isMaster('default/db'), true);
  t.same(sorted(a.changes.slice(2)), ['default/db', 'default/web,default/api']);
  await a.gate.stop();
  t.equal(w.lan.sockets.size, 0, 'stop closes every router');
  t.equal(a.gate.status('default/web'), undefined);
});

t.test('what a Master advertises: held VIP, else loadBalancerIP, else the last held; count 0 only when nothing is known', async (t) => {
  const w = world();
  const a = w.node(1, 100, [svc('web', { ipam: 'dhcp' }), svc('api', { loadBalancerIP: '10.99.0.200' })]);
  w.clock.advance(mdi(100) + 1);
  t.same(w.lan.sent(1).at(-1)?.addresses, ['10.99.0.200'], 'before any source is bound: the loadBalancerIP, not an empty list');
  a.held.set('default/api', '10.99.0.200');
  a.held.set('default/web', '10.99.0.107');
  w.clock.advance(1000);
  t.same(w.lan.sent(1).at(-1)?.addresses, ['10.99.0.107', '10.99.0.200'], 'held VIPs, in config order');
  a.held.clear(); // withdrawn (Backup for a while), then Master again
  w.clock.advance(1000);
  t.same(w.lan.sent(1).at(-1)?.addresses, ['10.99.0.107', '10.99.0.200'], 'a DHCP VIP not (yet) held again: the last one held here');
  t.equal(a.gate.knownVip('default/web'), '10.99.0.107');

  const w2 = world();
  w2.node(1, 100, [svc('web', { ipam: 'dhcp' })]);
  w2.clock.advance(mdi(100) + 1);
  const first = w2.lan.sent(1)[0]!;
  t.same(first.addresses, [], 'a DHCP service nobody knows the address of: count 0 (documented deviation from RFC 5798 §5.2.5)');
  t.equal(first.priority, 100, 'but the Master still advertises');
});

t.test("a Backup says when another router's advert changes (sender, priority, addresses), not at each advert: status shows them", async (t) => {
  const w = world();
  const lo = w.node(1, 100, [svc('web', { ipam: 'dhcp' })]);
  const hi = w.node(2, 200, [svc('web', { ipam: 'dhcp' })]);
  const heard: string[][] = [];
  lo.gate.on('heard', (keys: string[]) => heard.push(keys));
  w.clock.advance(5000);
  t.same(heard, [['default/web']], 'the Master heard first: one event, however many adverts followed');
  t.equal(lo.gate.status('default/web')?.master, '10.99.0.2');
  hi.held.set('default/web', '10.99.0.107');
  w.clock.advance(5000);
  t.same(heard, [['default/web'], ['default/web']], 'one more for the address it now lists');
  t.ok(lo.gate.status('default/web')!.advertsReceived >= 4, 'while adverts kept coming');
  hi.held.set('default/web', '10.99.0.108');
  w.clock.advance(5000);
  t.equal(heard.length, 3, 'and one more when the list changes');
  t.same(lo.gate.status('default/web')?.heardVips, ['10.99.0.108']);
  w.clock.advance(5000);
  t.equal(heard.length, 3, 'the same advert again says nothing');
});

t.test('two nodes: the higher priority is Master; the Backup knows it, counts its adverts and learns its VIPs', async (t) => {
  const w = world();
  const lo = w.node(1, 100, [svc('web', { ipam: 'dhcp' })]);
  const hi = w.node(2, 200, [svc('web', { ipam: 'dhcp' })]);
  hi.held.set('default/web', '10.99.0.107');
  w.clock.advance(5000);
  t.equal(hi.gate.isMaster('default/web'), true);
  t.equal(lo.gate.isMaster('default/web'), false);
  const s = lo.gate.status('default/web')!;
  t.equal(s.state, 'backup');
  t.equal(s.master, '10.99.0.2');
  t.equal(s.masterPriority, 200);
  t.same(s.heardVips, ['10.99.0.107'], "the Master's VIP list");
  t.ok(s.advertsReceived >= 2, `adverts received counted (${s.advertsReceived})`);
  t.equal(s.advertsSent, 0, 'a Backup sends nothing');
  t.equal(lo.gate.knownVip('default/web'), '10.99.0.107', "a DHCP VIP the Backup never held: the Master's advertised one");
  const m = hi.gate.status('default/web')!;
  t.ok(m.advertsSent >= 2);
  t.equal(m.transitions.master, 1);
  t.equal(m.transitions.backup, 1, 'the startup Backup counts');
  t.equal(m.lastTransition, new Date(w.clock.wallNow() - (5000 - mdi(200))).toISOString(), 'time of the last transition (wall clock)');
  t.equal(m.preempt, true);
  t.equal(m.handoverUntil, undefined);
  // The heard list is used only when it is unambiguous: two services on one VRID with unknown addresses.
  const w2 = world();
  const b = w2.node(1, 100, [svc('a', { ipam: 'dhcp' }), svc('b', { ipam: 'dhcp' })]);
  const c = w2.node(2, 200, [svc('a', { ipam: 'dhcp' }), svc('b', { ipam: 'dhcp' })]);
  c.held.set('default/a', '10.99.0.101');
  c.held.set('default/b', '10.99.0.102');
  w2.clock.advance(5000);
  t.same(b.gate.status('default/a')?.heardVips, ['10.99.0.101', '10.99.0.102']);
  t.equal(b.gate.knownVip('default/a'), undefined, 'which of two is ours is not guessed');
  // One pool service with a known address and one DHCP service on a router:
  // the address left over in the Master's list is the DHCP service's.
  const w3 = world();
  const pool = svc('api', { loadBalancerIP: '10.99.0.200' });
  const d = w3.node(1, 100, [pool, svc('web', { ipam: 'dhcp' })]);
  const e = w3.node(2, 200, [pool, svc('web', { ipam: 'dhcp' })]);
  e.held.set('default/api', '10.99.0.200');
  e.held.set('default/web', '10.99.0.107');
  w3.clock.advance(5000);
  t.equal(d.gate.knownVip('default/web'), '10.99.0.107', 'deduced: the listed address no other service of the router accounts for');
  t.equal(d.gate.knownVip('default/api'), '10.99.0.200');
});

t.test('the Master dies: the Backup holds the VIP at once, after Master_Down_Interval (no handover wait)', async (t) => {
  const w = world();
  const lo = w.node(1, 100, [svc('api')]);
  const hi = w.node(2, 200, [svc('api')]);
  w.clock.advance(5000);
  lo.changes.length = 0;
  w.lan.cut.add(2); // silent death
  w.clock.advance(mdi(100) + 1000);
  t.equal(lo.gate.isMaster('default/api'), true);
  t.equal(lo.gate.status('default/api')?.handoverUntil, undefined);
  t.same(lo.changes, [['default/api']], 'one change, when it became Master');
  void hi;
});

t.test('the Master resigns (priority 0): the Backup holds the VIP after Skew_Time, no handover wait', async (t) => {
  const w = world();
  const lo = w.node(1, 100, [svc('api')]);
  const hi = w.node(2, 200, [svc('api')]);
  w.clock.advance(5000);
  await hi.gate.stop();
  t.same(w.lan.sent(2).at(-1)?.priority, 0, 'the stopping Master sent priority 0');
  w.clock.advance(skewTimeMs(100, 100) + 1);
  t.equal(lo.gate.isMaster('default/api'), true);
});

t.test('preemption: the new Master takes the VIP only after the handover wait; the old one lets go at once', async (t) => {
  const w = world();
  const api = svc('api', { loadBalancerIP: '10.99.0.200' });
  const lo = w.node(1, 100, [api]);
  w.clock.advance(5000);
  t.equal(lo.gate.isMaster('default/api'), true);
  const hi = w.node(2, 200, [api]);
  lo.changes.length = 0;
  w.clock.advance(mdi(200) + 1);
  t.equal(hi.gate.status('default/api')?.state, 'master', 'hi preempted');
  t.equal(lo.gate.isMaster('default/api'), false, 'lo yielded on its first advert');
  t.same(lo.changes, [['default/api']]);
  t.equal(hi.gate.isMaster('default/api'), false, 'hi does not hold the VIP yet');
  t.ok(hi.gate.status('default/api')?.handoverUntil, 'status says until when');
  const before = hi.changes.length;
  w.clock.advance(PREEMPT_HANDOVER_MS);
  t.equal(hi.gate.isMaster('default/api'), true, 'after the handover wait it does');
  t.same(hi.changes.slice(before), [['default/api']], 'and says so with a change');
  t.equal(hi.gate.status('default/api')?.handoverUntil, undefined);
  t.same(w.lan.sent(2)[0], { priority: 200, addresses: ['10.99.0.200'] }, 'its adverts list the VIP from the first one on');
});

t.test('preempt off: no preemption, no handover wait', async (t) => {
  const w = world();
  const off = { config: { ...FAILOVER, preempt: false } };
  const lo = w.node(1, 100, [svc('api')], off);
  w.clock.advance(5000);
  const hi = w.node(2, 200, [svc('api')], off);
  w.clock.advance(5000);
  t.equal(lo.gate.isMaster('default/api'), true);
  t.equal(hi.gate.status('default/api')?.state, 'backup');
  t.equal(hi.gate.status('default/api')?.preempt, false);
});

t.test('split brain: the lower priority yields when the partition heals; both count it', async (t) => {
  const w = world();
  const lo = w.node(1, 100, [svc('api')]);
  const hi = w.node(2, 200, [svc('api')]);
  w.clock.advance(5000);
  w.lan.cut.add(2);
  w.clock.advance(5000);
  t.equal(lo.gate.isMaster('default/api'), true, 'partitioned: lo Master too');
  w.lan.cut.delete(2);
  w.clock.advance(1001);
  t.equal(lo.gate.isMaster('default/api'), false, 'healed: lo yielded');
  t.equal(hi.gate.isMaster('default/api'), true, 'hi kept it (no handover wait: it never let go)');
  const s = lo.gate.status('default/api')!;
  t.equal(s.splitBrains, 1);
  t.same([s.lastSplitBrain?.peer, s.lastSplitBrain?.peerPriority, s.lastSplitBrain?.resolution], ['10.99.0.2', 200, 'yielded']);
  const h = hi.gate.status('default/api')!;
  t.ok(h.splitBrains <= 1, 'hi saw lo at most once before lo yielded');
});

t.test('update: a priority change replaces the router (priority 0 first); a removed VRID goes; services keep their keys', async (t) => {
  const w = world();
  const a = w.node(1, 100, [svc('web'), svc('db', { vrid: 60 })]);
  w.clock.advance(5000);
  a.changes.length = 0;
  a.gate.update([svc('web', { priority: 120 })], () => undefined);
  t.equal(w.lan.sockets.size, 1, 'VRID 60 gone, VRID 51 replaced');
  t.ok(w.lan.wire.some((x) => x.from === 1 && decodeAdvertisement(x.frame).ok && (decodeAdvertisement(x.frame) as { frame: { priority: number } }).frame.priority === 0), 'a resigning advert went out');
  t.equal(a.gate.status('default/web')?.priority, 120);
  t.equal(a.gate.isMaster('default/web'), false, 'the new router starts as Backup');
  t.same(a.changes.flat().sort(), ['default/web', 'default/web'], 'web changed (old router gone, new one Backup); db removed quietly');
  await a.gate.stop();
});

t.test('failover.peers: an advert from outside the list changes nothing and is counted', async (t) => {
  const w = world();
  const peers = { config: { ...FAILOVER, peers: [0x0a630001, 0x0a630002] }, peerMac: () => undefined };
  const a = w.node(1, 100, [svc('web')], peers);
  w.clock.advance(mdi(100) + 1);
  t.equal(a.gate.isMaster('default/web'), true, 'a alone: Master');
  const before = a.changes.length;
  // Node 66 is not a peer: priority 254, it would win without the list.
  const evil = w.node(66, 254, [svc('web')]);
  w.clock.advance(mdi(254) + PREEMPT_HANDOVER_MS + 100);
  t.equal(evil.gate.isMaster('default/web'), true, 'the intruder thinks itself Master');
  w.clock.advance(5000);
  t.equal(a.gate.isMaster('default/web'), true, 'a stays Master');
  t.equal(a.changes.length, before, 'no change event');
  t.equal(a.gate.status('default/web')?.advertsReceived, 0, 'not counted as a received advert');
  t.match(await a.registry.metrics(), /lbagent_vrrp_dropped_total\{reason="not-a-peer",family="IPv4"\} [1-9]\d*/);
  // A listed peer is heard: node 2 at 200 takes over.
  const b = w.node(2, 200, [svc('web')], peers);
  w.clock.advance(mdi(200) + 1000);
  t.equal(b.gate.isMaster('default/web'), true);
  t.equal(a.gate.isMaster('default/web'), false, 'a yields to a listed peer of higher priority');
  await Promise.all([a.gate.stop(), b.gate.stop(), evil.gate.stop()]);
});

t.test('failover.peers: each advert also goes unicast to each peer whose MAC is known', async (t) => {
  const w = world();
  const mac = Buffer.from('02aabbccdd02', 'hex');
  const a = w.node(1, 100, [svc('web')], { config: { ...FAILOVER, peers: [0x0a630002, 0x0a630003] }, peerMac: (ip) => (ip === '10.99.0.2' ? mac : undefined) });
  w.clock.advance(mdi(100) + 1);
  w.clock.advance(2000);
  const frames = w.lan.wire.filter((x) => x.from === 1).map((x) => decodeAdvertisement(x.frame)).filter((r) => r.ok).map((r) => (r.ok ? r.frame : undefined)!);
  const multicast = frames.filter((f) => f.dstIp === 0xe0000012);
  const unicast = frames.filter((f) => f.dstIp !== 0xe0000012);
  t.ok(multicast.length >= 3, `multicast adverts: ${multicast.length}`);
  t.equal(unicast.length, multicast.length, 'one unicast copy per advert, to the one resolved peer');
  t.ok(unicast.every((f) => f.dstIp === 0x0a630002 && f.dstMac.equals(mac) && f.ttl === 255), 'to 10.99.0.2 at its MAC, TTL 255');
  await a.gate.stop();
});

t.test('hand-back: a Backup aims at the Master it follows; after a takeover, at the previous Master for HAND_BACK_MS', async (t) => {
  const w = world();
  const api = svc('api', { loadBalancerIP: '10.99.0.200' });
  const hi = w.node(2, 200, [api]);
  w.clock.advance(5000);
  t.equal(hi.gate.isMaster('default/api'), true);
  t.equal(hi.gate.handBack('default/api'), undefined, 'a Master that took over from nobody hands back to nobody');
  const lo = w.node(1, 100, [api]);
  const handBackEvents: string[][] = [];
  lo.gate.on('hand-back', (keys: string[]) => handBackEvents.push(keys));
  w.clock.advance(3000);
  t.equal(lo.gate.status('default/api')?.state, 'backup');
  t.equal(lo.gate.handBack('default/api'), hi.ip, 'the Backup: the Master it follows (armed before any takeover)');
  t.same(handBackEvents, [['default/api']], 'said once, when it learnt the Master');
  t.equal(lo.gate.handBack('default/nope'), undefined);

  // The Master dies (cut off, no priority 0): the Backup takes over and hands back to it.
  w.lan.cut.add(2);
  let tookOverAt: number | undefined;
  lo.gate.on('change', () => { tookOverAt ??= w.clock.now(); });
  w.clock.advance(mdi(100) + 1);
  t.equal(lo.gate.isMaster('default/api'), true, 'took over');
  t.equal(lo.gate.handBack('default/api'), hi.ip, 'hands back to the previous Master');
  const before = handBackEvents.length;
  w.clock.advance(tookOverAt! + HAND_BACK_MS - 10 - w.clock.now());
  t.equal(lo.gate.handBack('default/api'), hi.ip, 'still, just before the window closes');
  w.clock.advance(20);
  t.equal(lo.gate.handBack('default/api'), undefined, 'not after it');
  t.same(handBackEvents.slice(before), [['default/api']], 'and the end is an event (the daemon applies a table without it)');

  // Another Backup again (the old Master back, preempting): aimed at it; a stop clears everything.
  w.lan.cut.delete(2);
  w.clock.advance(3000);
  t.equal(lo.gate.status('default/api')?.state, 'backup', 'preempted back');
  t.equal(lo.gate.handBack('default/api'), hi.ip);
  t.equal(hi.gate.isMaster('default/api'), true);
  t.equal(hi.gate.handBack('default/api'), undefined, 'the returning Master never followed it: nothing to hand back to');
  await lo.gate.stop();
  t.equal(lo.gate.handBack('default/api'), undefined);
  await hi.gate.stop();
});

t.test('tracking: the Master whose priority falls below the Backup\'s loses the VIP, and takes it back with preempt', async (t) => {
  const w = world();
  const registry = new Registry();
  const links = new Map<string, { up: boolean; carrier: boolean } | undefined>([['eth1', { up: true, carrier: true }], ['eth2', { up: true, carrier: true }]]);
  const tracker = new PriorityTracker({
    track: { interfaces: [{ name: 'eth1', weight: 60, failAfter: 0, recoverAfter: 0 }, { name: 'eth2', weight: undefined, failAfter: 0, recoverAfter: 0 }], services: [] },
    readLink: (n) => Promise.resolve(links.get(n)), backends: () => ({ up: 0, unknown: 0, total: 0 }), log: silentLogger(), registry, clock: w.clock,
  });
  await tracker.start();
  const a = w.node(1, 200, [svc('web')], { tracker, registry });
  const b = w.node(2, 150, [svc('web')]);
  const events: PriorityEvent[] = [];
  a.gate.on('priority', (e: PriorityEvent) => events.push(e));
  w.clock.advance(mdi(150) + 1);
  t.equal(a.gate.isMaster('default/web'), true);
  t.equal(a.gate.status('default/web')?.priority, 200);

  tracker.linkChanged('eth1', { up: true, carrier: false });
  t.same(events, [{ network: 'default', vrid: 51, services: ['default/web'], from: 200, to: 140, base: 200, reasons: ['interface eth1: no carrier (-60)'] }]);
  t.equal(w.lan.sent(1).at(-1)?.priority, 140, 'the new priority is advertised at once');
  const st = a.gate.status('default/web')!;
  t.equal(st.priority, 140, 'status: the priority in use');
  t.equal(st.basePriority, 200);
  t.same(st.priorityReasons, ['interface eth1: no carrier (-60)']);
  t.same(st.tracks.map((x) => [x.track, x.failing]), [['interface eth1', true], ['interface eth2', false]]);
  const m = await registry.getSingleMetric('lbagent_vrrp_priority')?.get();
  t.equal(m?.values.find((v) => v.labels.vrid === '51')?.value, 140, 'lbagent_vrrp_priority');
  w.clock.advance(mdi(150) + 1000);
  t.equal(b.gate.isMaster('default/web'), true, 'the Backup (150) preempted the lowered Master (140)');
  t.equal(a.gate.isMaster('default/web'), false);

  tracker.linkChanged('eth1', { up: true, carrier: true });
  t.equal(events.at(-1)?.to, 200);
  t.same(events.at(-1)?.reasons, [], 'back at the configured priority');
  w.clock.advance(mdi(200) + 1000 + PREEMPT_HANDOVER_MS);
  t.equal(a.gate.isMaster('default/web'), true, 'preempt on: 200 takes the VIP back');

  tracker.linkChanged('eth2', { up: false, carrier: false });
  t.equal(a.gate.status('default/web')?.state, 'fault', 'eth2 has no weight: fault');
  t.equal(a.gate.isMaster('default/web'), false, 'a router in fault holds nothing');
  t.equal(w.lan.sent(1).at(-1)?.priority, 0, 'it resigned with priority 0');
  w.clock.advance(skewTimeMs(150, 100) + 1);
  t.equal(b.gate.isMaster('default/web'), true, 'the Backup took over after Skew_Time');
  t.ok(a.changes.length >= 4, 'each transition of the tracked router was a change for its services');
  const sentInFault = w.lan.sent(1).length;
  w.clock.advance(5000);
  t.equal(w.lan.sent(1).length, sentInFault, 'no adverts in fault');
  tracker.linkChanged('eth2', { up: true, carrier: true });
  t.equal(a.gate.status('default/web')?.state, 'backup', 'out of fault: Backup');
  await a.gate.stop();
  await b.gate.stop();
});

t.test('tracking: a lowered Master that has heard the Backup outrank it steps down, withdraws, then resigns; the Backup takes the VIP with no handover wait', async (t) => {
  const w = world();
  const registry = new Registry();
  const links = new Map<string, { up: boolean; carrier: boolean } | undefined>([['eth1', { up: true, carrier: true }]]);
  const tracker = new PriorityTracker({
    track: { interfaces: [{ name: 'eth1', weight: 60, failAfter: 0, recoverAfter: 0 }], services: [] },
    readLink: (n) => Promise.resolve(links.get(n)), backends: () => ({ up: 0, unknown: 0, total: 0 }), log: silentLogger(), registry, clock: w.clock,
  });
  await tracker.start();
  const b = w.node(2, 150, [svc('web')]);
  w.clock.advance(mdi(150) + 1);
  t.equal(b.gate.isMaster('default/web'), true, '150 alone: Master');
  // 200 joins and preempts 150: it has heard 150's adverts.
  const a = w.node(1, 200, [svc('web')], { tracker, registry });
  w.clock.advance(mdi(200) + PREEMPT_HANDOVER_MS + 1);
  t.equal(a.gate.isMaster('default/web'), true);

  const sentBefore = w.lan.sent(1).length;
  a.changes.length = 0;
  tracker.linkChanged('eth1', { up: true, carrier: false });
  t.equal(a.gate.status('default/web')?.state, 'backup', 'stepped down at once');
  t.equal(a.gate.isMaster('default/web'), false, 'and holds nothing');
  t.same(a.changes, [['default/web']], 'the daemon was told to withdraw');
  t.equal(w.lan.sent(1).length, sentBefore, 'nothing sent yet: the withdrawal goes first');
  w.clock.advance(PREEMPT_HANDOVER_MS);
  t.same(w.lan.sent(1).slice(sentBefore).map((x) => x.priority), [0], 'then one resignation advert, priority 0');
  w.clock.advance(skewTimeMs(150, 100) + 1);
  t.equal(b.gate.status('default/web')?.state, 'master', '150 took over after Skew_Time');
  t.equal(b.gate.isMaster('default/web'), true, 'and holds the VIP at once');
  t.equal(b.gate.status('default/web')?.handoverUntil, undefined, 'no handover wait');
  w.clock.advance(5000);
  t.equal(a.gate.status('default/web')?.state, 'backup', '140 follows 150');
  t.equal(b.gate.isMaster('default/web'), true);
  await a.gate.stop();
  await b.gate.stop();
});

t.test('tracking: a router created while a track without weight fails starts in fault', async (t) => {
  const w = world();
  const registry = new Registry();
  const tracker = new PriorityTracker({
    track: { interfaces: [{ name: 'eth1', weight: undefined, failAfter: 0, recoverAfter: 0 }], services: [] },
    readLink: () => Promise.resolve(undefined), backends: () => ({ up: 0, unknown: 0, total: 0 }), log: silentLogger(), registry, clock: w.clock,
  });
  await tracker.start();
  const a = w.node(1, 200, [svc('web')], { tracker, registry });
  t.equal(a.gate.status('default/web')?.state, 'fault');
  t.equal(a.gate.status('default/web')?.priority, 0);
  w.clock.advance(mdi(200) * 3);
  t.equal(w.lan.sent(1).length, 0, 'never advertised');
  t.equal(a.gate.isMaster('default/web'), false);
  await a.gate.stop();
});

t.test('tracking reloaded: a track added while failing lowers the running Master, removed it restores the priority; a weight changed moves it; nothing restarts', async (t) => {
  const w = world();
  const registry = new Registry();
  const links = new Map<string, { up: boolean; carrier: boolean } | undefined>([['eth1', { up: true, carrier: true }], ['eth3', { up: false, carrier: false }]]);
  const tracker = new PriorityTracker({
    track: { interfaces: [{ name: 'eth1', weight: 10, failAfter: 0, recoverAfter: 0 }], services: [] }, network: 'vmnet',
    readLink: (n) => Promise.resolve(links.get(n)), backends: () => ({ up: 0, unknown: 0, total: 0 }), log: silentLogger(), registry, clock: w.clock,
  });
  await tracker.start();
  const a = w.node(1, 200, [svc('web')], { tracker, registry, network: 'vmnet' });
  const b = w.node(2, 150, [svc('web')]);
  const events: PriorityEvent[] = [];
  a.gate.on('priority', (e: PriorityEvent) => events.push(e));
  w.clock.advance(mdi(150) + 1);
  t.equal(a.gate.isMaster('default/web'), true);
  const masterSince = a.gate.status('default/web')?.transitions.master;

  // A new weight on a track that is not failing: nothing moves.
  await tracker.reconfigure({ interfaces: [{ name: 'eth1', weight: 20, failAfter: 0, recoverAfter: 0 }], services: [] });
  t.same(events, [], 'no priority change');
  t.equal(a.gate.status('default/web')?.priority, 200);

  // eth3 is down: a track of it, added by the reload, counts at once (failAfter 0).
  await tracker.reconfigure({ interfaces: [{ name: 'eth1', weight: 20, failAfter: 0, recoverAfter: 0 }, { name: 'eth3', weight: 60, failAfter: 0, recoverAfter: 0 }], services: [] });
  t.same(events, [{ network: 'vmnet', vrid: 51, services: ['default/web'], from: 200, to: 140, base: 200, reasons: ['interface eth3: link down (-60)'] }], 'lowered by the added track, on vmnet\'s router');
  t.equal(a.gate.status('default/web')?.transitions.master, masterSince, 'the router was not restarted');
  t.equal(w.lan.sent(1).at(-1)?.priority, 140, 'advertised at once');
  w.clock.advance(mdi(150) + 1000);
  t.equal(b.gate.isMaster('default/web'), true, 'the Backup (150) took over from the lowered Master');
  t.equal(a.gate.isMaster('default/web'), false);

  // Its weight changed while it fails: the priority follows.
  await tracker.reconfigure({ interfaces: [{ name: 'eth1', weight: 20, failAfter: 0, recoverAfter: 0 }, { name: 'eth3', weight: 30, failAfter: 0, recoverAfter: 0 }], services: [] });
  t.equal(events.at(-1)?.to, 170, 'the new weight: 200 - 30');
  t.same(a.gate.status('default/web')?.priorityReasons, ['interface eth3: link down (-30)']);

  // Removed while failing: back to the configured priority, and with preempt on the VIP comes back.
  await tracker.reconfigure({ interfaces: [{ name: 'eth1', weight: 20, failAfter: 0, recoverAfter: 0 }], services: [] });
  t.equal(events.at(-1)?.to, 200);
  t.same(events.at(-1)?.reasons, [], 'no reason left');
  t.same(a.gate.status('default/web')?.tracks.map((x) => [x.track, x.network]), [['interface eth1', 'vmnet']], 'status lists the network\'s tracks');
  w.clock.advance(mdi(200) + 1000 + PREEMPT_HANDOVER_MS);
  t.equal(a.gate.isMaster('default/web'), true, 'preempt on: 200 takes the VIP back');
  await a.gate.stop();
  await b.gate.stop();
});
