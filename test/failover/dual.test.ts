// Unit tests of DualGate: two real VrrpGates (IPv4 and IPv6) per node on an
// in-memory LAN. Each family service goes to the gate of its family, the two
// instances elect independently (RFC 5798 §5.1), events of both reach the
// daemon, status says the family, each family's hand-back aims at that
// family's previous Master (an IPv6 one by its link-local address), and without a link-local address IPv6 VIPs are not held.
// A tied IPv6 VIP hands back to the IPv6 peer with the MAC of the IPv4 peer
// its router follows, and to nobody without peers of both families.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import type { FrameInfo, PacketSocket, PacketSocketOptions } from '../../agent/net/packet/packet';
import { masterDownIntervalMs } from '../../agent/failover/machine';
import { HAND_BACK_MS, VrrpGate } from '../../agent/failover/gate';
import { DualGate } from '../../agent/failover/dual';
import { vrrpWire } from '../../agent/failover/wire';
import { encodeAdvertisement } from '../../agent/failover/codec';
import type { FailoverConfig, ServiceSpec } from '../../agent/config/types';

class FakeLan {
  readonly sockets = new Set<FakeSocket>();
  /** (node, EtherType) pairs whose frames are lost. */
  readonly cut = new Set<string>();
  constructor(readonly clock: ManualClock) {}
  open = (opts: PacketSocketOptions): PacketSocket => { const s = new FakeSocket(this, opts); this.sockets.add(s); return s; };
  deliver(from: FakeSocket, frame: Buffer): void {
    if (this.cut.has(`${from.ifindex}/${frame.readUInt16BE(12)}`)) return;
    for (const s of this.sockets) if (s !== from) this.clock.setTimeout(() => s.emit('frame', frame, { csumNotReady: false, pktType: 2 } satisfies FrameInfo), 0.2);
  }
}

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly ifindex: number;
  constructor(private readonly lan: FakeLan, readonly opts: PacketSocketOptions) { super(); this.ifindex = opts.ifindex; }
  send(frame: Buffer): void { this.lan.deliver(this, frame); }
  close(): void { this.lan.sockets.delete(this); }
}

const FAILOVER: FailoverConfig = { mode: 'vrrp', vrid: 51, advertInterval: 1, preempt: true, preemptDelay: 0, interface: undefined, peers: [], track: { interfaces: [], services: [] } };

function spec(family: 'IPv4' | 'IPv6'): ServiceSpec {
  return {
    key: family === 'IPv4' ? 'default/web' : 'default/web@IPv6', family, name: 'web', namespace: 'default', ipam: 'pool', primaryService: undefined,
    loadBalancerIP: family === 'IPv4' ? '10.99.0.200' : 'fd00:99::200', vrid: undefined, priority: undefined, ports: [], backends: [], sourceIP: 'snat', topology: 'any',
    healthCheck: { enabled: false, type: 'tcp', port: 80, successThreshold: 1, failureThreshold: 3, periodSeconds: 5, timeoutSeconds: 3, http: undefined, passiveFailures: 0 },
  };
}
const SERVICES = [spec('IPv4'), spec('IPv6')];

function node(lan: FakeLan, clock: ManualClock, n: number, priority: number, o: { ipv6?: boolean; config?: Partial<FailoverConfig>; peerMac?: (ip: string) => Uint8Array | undefined } = {}): { dual: DualGate; changes: string[][]; gates: VrrpGate[] } {
  const registry = new Registry();
  const gate = (family: 'IPv4' | 'IPv6', srcIp: string): VrrpGate => new VrrpGate({
    config: { ...FAILOVER, ...o.config }, nodePriority: priority, family, ifindex: n, ifname: 'eth0', srcIp, log: silentLogger(), registry, clock, openSocket: lan.open, peerMac: o.peerMac,
  });
  const gates = [gate('IPv4', `10.99.0.${n}`), ...(o.ipv6 === false ? [] : [gate('IPv6', `fe80::${n}`)])];
  const dual = new DualGate({ ipv4: gates[0]!, ipv6: gates[1], log: silentLogger() });
  const changes: string[][] = [];
  dual.on('change', (keys: string[]) => changes.push(keys));
  dual.update(SERVICES, () => undefined);
  return { dual, changes, gates };
}

t.test('one instance per family: each family service rides its own gate, and the two elect independently', async (t) => {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const a = node(lan, clock, 1, 100);
  const b = node(lan, clock, 2, 200);
  const sockets = [...lan.sockets].map((s) => s.opts.protocol).sort();
  t.same(sockets, [0x0800, 0x0800, 0x86dd, 0x86dd], 'an IPv4 and an IPv6 router on each node');
  clock.advance(masterDownIntervalMs(100, 100) + 100);
  t.same([b.dual.isMaster('default/web'), b.dual.isMaster('default/web@IPv6')], [true, true], 'the higher priority holds both VIPs');
  t.same([a.dual.isMaster('default/web'), a.dual.isMaster('default/web@IPv6')], [false, false]);
  t.match(a.dual.status('default/web@IPv6'), { family: 'IPv6', vrid: 51, state: 'backup', master: 'fe80::2' }, 'the IPv6 instance names the Master by its link-local address');
  t.match(a.dual.status('default/web'), { family: 'IPv4', vrid: 51, state: 'backup', master: '10.99.0.2' });
  t.equal(a.dual.handBack('default/web'), '10.99.0.2', 'the IPv4 Backup hands back to the IPv4 Master');
  t.equal(a.dual.handBack('default/web@IPv6'), 'fe80::2', "the IPv6 Backup hands back to the IPv6 Master's link-local address");
  t.equal(a.dual.knownVip('default/web@IPv6'), 'fd00:99::200');

  // b's IPv6 adverts stop reaching the LAN: only the IPv6 VIP moves.
  const from = a.changes.length;
  lan.cut.add(`2/${vrrpWire('IPv6').ethertype}`);
  clock.advance(masterDownIntervalMs(100, 100) + 100);
  t.same([a.dual.isMaster('default/web'), a.dual.isMaster('default/web@IPv6')], [false, true], 'a takes the IPv6 VIP, not the IPv4 one');
  t.same(a.changes.slice(from).flat(), ['default/web@IPv6'], "the change names the IPv6 service only");
  t.equal(a.dual.handBack('default/web@IPv6'), 'fe80::2', 'after the takeover the IPv6 VIP hands back to the previous IPv6 Master');
  t.equal(a.dual.handBack('default/web'), '10.99.0.2', 'the IPv4 Backup still to its Master');
  clock.advance(HAND_BACK_MS + 1);
  t.equal(a.dual.handBack('default/web@IPv6'), undefined, 'until HAND_BACK_MS after the takeover');
  await a.dual.stop();
  await b.dual.stop();
  t.equal(lan.sockets.size, 0, 'every socket closed');
});

t.test('a node without a link-local address holds no IPv6 VIP; its IPv4 instance runs', async (t) => {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const a = node(lan, clock, 1, 100, { ipv6: false });
  t.same([...lan.sockets].map((s) => s.opts.protocol), [0x0800], 'an IPv4 router only');
  clock.advance(masterDownIntervalMs(100, 100) + 100);
  t.equal(a.dual.isMaster('default/web'), true);
  t.equal(a.dual.isMaster('default/web@IPv6'), false);
  t.equal(a.dual.status('default/web@IPv6'), undefined);
  await a.dual.stop();
});

t.test('failover.vrid6 puts the IPv6 instance on its own VRID', async (t) => {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const a = node(lan, clock, 1, 100, { config: { vrid6: 60 } });
  t.equal(a.dual.status('default/web')?.vrid, 51);
  t.equal(a.dual.status('default/web@IPv6')?.vrid, 60);
  await a.dual.stop();
});

/** A dual-stack DHCP service: "default/dd" (IPv4) and "default/dd@IPv6", both leases on one macvlan. */
function dhcpPair(o: { loadBalancerIP6?: string } = {}): ServiceSpec[] {
  return (['IPv4', 'IPv6'] as const).map((family) => ({
    ...spec(family), key: family === 'IPv4' ? 'default/dd' : 'default/dd@IPv6', name: 'dd', ipam: 'dhcp' as const,
    ipFamilies: ['IPv4', 'IPv6'] as const, loadBalancerIP: family === 'IPv6' ? o.loadBalancerIP6 : undefined,
  }));
}

t.test('a dual-stack DHCP service: its IPv6 VIP follows the IPv4 router, both VIPs on one node in every state and in one change event', async (t) => {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const services = [...dhcpPair(), ...SERVICES];
  const held = new Map<string, string>([['default/dd@IPv6', 'fd00:99::150']]);
  const a = node(lan, clock, 1, 100);
  const b = node(lan, clock, 2, 200);
  a.dual.update(services, () => undefined);
  b.dual.update(services, (k) => held.get(k));
  const nodes = [a, b];
  const tied = ['default/dd', 'default/dd@IPv6'];
  const split: string[] = [];
  /** The invariant: on every node both VIPs of the pair are held, or neither. */
  const check = (when: string): void => {
    for (const [i, n] of nodes.entries()) {
      const [v4, v6] = tied.map((k) => n.dual.isMaster(k));
      if (v4 !== v6) split.push(`${when}: node ${i + 1} holds ${v4 ? 'IPv4' : 'IPv6'} only`);
    }
  };
  for (const n of nodes) n.dual.on('change', () => check('at a change event'));
  const run = (ms: number, when: string): void => {
    for (let left = ms; left > 0; left -= 50) { clock.advance(Math.min(50, left)); check(when); }
  };

  run(masterDownIntervalMs(100, 100) + 100, 'start');
  t.same(tied.map((k) => b.dual.isMaster(k)), [true, true], 'the higher priority holds both VIPs');
  t.same(tied.map((k) => a.dual.isMaster(k)), [false, false]);
  t.match(a.dual.status('default/dd@IPv6'), {
    family: 'IPv4', vrid: 51, state: 'backup', master: '10.99.0.2',
    tie: { router: 'IPv4', services: ['default/dd', 'default/dd@IPv6'], reason: /one macvlan/ },
  }, "the IPv6 VIP's status is the IPv4 router's, and says why");
  t.match(a.dual.status('default/dd'), { family: 'IPv4', tie: { services: ['default/dd', 'default/dd@IPv6'] } }, 'and so does the IPv4 one');
  t.notOk('tie' in (a.dual.status('default/web@IPv6') ?? {}), 'a dual-stack pool service is not tied');
  t.equal(b.dual.knownVip('default/dd@IPv6'), 'fd00:99::150', 'the Master knows the IPv6 VIP it holds');
  t.equal(a.dual.knownVip('default/dd@IPv6'), undefined, 'a node that never held it learns it from no advert (IPv4 adverts list IPv4 only)');

  // b's IPv6 adverts stop: the pool service's IPv6 VIP moves, the tied one does not.
  const from = a.changes.length;
  lan.cut.add(`2/${vrrpWire('IPv6').ethertype}`);
  run(masterDownIntervalMs(100, 100) + 100, 'IPv6 cut');
  t.equal(a.dual.isMaster('default/web@IPv6'), true, "the pool service's IPv6 VIP elects on its own");
  t.same(tied.map((k) => a.dual.isMaster(k)), [false, false], 'the tied pair stays at b: no IPv6 router decides for it');
  t.notOk(a.changes.slice(from).flat().some((k) => tied.includes(k)), 'and no change event names it');

  // b's IPv4 adverts stop too (its VM dies): a takes both, in one event.
  const from2 = a.changes.length;
  lan.cut.add(`2/${vrrpWire('IPv4').ethertype}`);
  run(masterDownIntervalMs(100, 100) + 100, 'b dies');
  t.same(tied.map((k) => a.dual.isMaster(k)), [true, true], 'a holds both VIPs of the pair');
  const events = a.changes.slice(from2).filter((keys) => keys.some((k) => tied.includes(k)));
  t.same(events, [['default/dd', 'default/dd@IPv6', 'default/web']], 'one change event names both (and the IPv4 pool VIP on the same router)');
  t.equal(a.dual.handBack('default/dd'), '10.99.0.2', 'the IPv4 VIP hands back to the previous Master');
  t.equal(a.dual.handBack('default/dd@IPv6'), undefined, 'the tied IPv6 VIP does not: without peers no IPv6 address of the previous Master is known');

  // b comes back (preempt on, higher priority): both VIPs go back together.
  const from3 = a.changes.length;
  lan.cut.clear();
  run(2_000, 'b back');
  t.same(tied.map((k) => b.dual.isMaster(k)), [true, true], 'b takes both back');
  t.same(tied.map((k) => a.dual.isMaster(k)), [false, false], 'a gives both up');
  t.ok(a.changes.slice(from3).some((keys) => tied.every((k) => keys.includes(k))), 'in one change event');
  t.same(split, [], 'never one VIP of the pair on a node without the other');

  // Reload: the service becomes IPv6-only DHCP; its VIP gets an IPv6 router of its own.
  a.dual.update([{ ...dhcpPair()[1]!, ipFamilies: ['IPv6'] }], () => undefined);
  t.notOk('tie' in (a.dual.status('default/dd@IPv6') ?? {}), 'untied after a reload');
  t.equal(a.dual.status('default/dd@IPv6')?.family, 'IPv6');
  await a.dual.stop();
  await b.dual.stop();
});

t.test("a tied IPv6 VIP's known address: the one held, its loadBalancerIPs entry, or the last one held here", async (t) => {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const a = node(lan, clock, 1, 100);
  let held: string | undefined = 'fd00:99::151';
  a.dual.update(dhcpPair(), (k) => (k === 'default/dd@IPv6' ? held : undefined));
  t.equal(a.dual.knownVip('default/dd@IPv6'), 'fd00:99::151');
  held = undefined;
  t.equal(a.dual.knownVip('default/dd@IPv6'), 'fd00:99::151', 'remembered after it was withdrawn');
  a.dual.update(dhcpPair({ loadBalancerIP6: 'fd00:99::1a0' }), () => undefined);
  t.equal(a.dual.knownVip('default/dd@IPv6'), 'fd00:99::1a0', 'the address asked for first');
  await a.dual.stop();
});

t.test("a tied IPv6 VIP hands back to the IPv6 peer with the MAC of the IPv4 peer its router follows; a forged advert moves nothing", async (t) => {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const MAC = { a: '02:00:00:00:00:01', b: '02:00:00:00:00:02', x: '02:00:00:00:00:66' };
  // What ARP and neighbour discovery answered: b's IPv4, global and link-local addresses share its MAC.
  const resolved = new Map<string, string>([
    ['10.99.0.1', MAC.a], ['fe80::1', MAC.a], ['10.99.0.2', MAC.b], ['fd00:99::2', MAC.b], ['fe80::2', MAC.b], ['fd00:99::66', MAC.x],
  ]);
  const peerMac = (ip: string): Uint8Array | undefined => { const m = resolved.get(ip); return m === undefined ? undefined : Buffer.from(m.replace(/:/g, ''), 'hex'); };
  // The global address is listed before the link-local one: the first with the MAC is the target.
  const config: Partial<FailoverConfig> = { peers: [0x0a630001, 0x0a630002], peers6: ['fe80::1', 'fd00:99::2', 'fe80::2'] };
  const services = [...dhcpPair(), ...SERVICES];
  const a = node(lan, clock, 1, 100, { config, peerMac });
  const b = node(lan, clock, 2, 200, { config, peerMac });
  a.dual.update(services, () => undefined);
  b.dual.update(services, () => undefined);
  clock.advance(masterDownIntervalMs(100, 100) + 100);
  t.match(a.dual.status('default/dd@IPv6'), { state: 'backup', master: '10.99.0.2' });
  t.equal(a.dual.handBack('default/dd'), '10.99.0.2', 'the IPv4 VIP: to the Master by its IPv4 address');
  t.equal(a.dual.handBack('default/dd@IPv6'), 'fd00:99::2', "the tied IPv6 VIP: to the first IPv6 peer with that address's MAC");
  t.equal(a.dual.handBack('default/web@IPv6'), 'fe80::2', "the pool service's IPv6 VIP: to its own router's Master, as before");

  // A host outside the peers sends adverts at 254 claiming the router, with b's MAC or its own: dropped, the target stays.
  const attacker = lan.open({ ifindex: 66, protocol: 0x0800 });
  const forged = encodeAdvertisement({ vrid: 51, priority: 254, maxAdverIntCs: 100, addresses: [], srcIp: 0x0a630042 });
  for (let i = 0; i < 5; i++) { attacker.send(forged); clock.advance(100); }
  clock.advance(masterDownIntervalMs(100, 100));
  t.match(a.dual.status('default/dd@IPv6'), { state: 'backup', master: '10.99.0.2' }, 'a still follows b');
  t.equal(a.dual.handBack('default/dd@IPv6'), 'fd00:99::2', 'and hands back to b');

  // A MAC that no IPv6 peer answers with (b's IPv6 addresses unresolved, or an ARP answer pointing elsewhere): nothing.
  resolved.set('10.99.0.2', MAC.x);
  t.equal(a.dual.handBack('default/dd@IPv6'), undefined, "an IPv4 peer whose MAC only a non-peer's address has: no target");
  resolved.set('10.99.0.2', MAC.b);
  resolved.delete('fd00:99::2');
  t.equal(a.dual.handBack('default/dd@IPv6'), 'fe80::2', 'the next IPv6 peer with the MAC');
  resolved.delete('fe80::2');
  t.equal(a.dual.handBack('default/dd@IPv6'), undefined, 'none resolved: no target');
  resolved.set('fd00:99::2', MAC.b);
  const events: string[][] = [];
  a.dual.on('hand-back', (keys: string[]) => events.push(keys));
  a.gates[1]!.emit('peers-resolved');
  t.same(events, [['default/dd@IPv6']], "a peer resolved: the tied VIP's hand-back is asked again");

  // b dies: a takes both; the tied VIP hands back to b's IPv6 address for HAND_BACK_MS.
  lan.cut.add('2/2048');
  clock.advance(masterDownIntervalMs(100, 100) + 100);
  t.same([a.dual.isMaster('default/dd'), a.dual.isMaster('default/dd@IPv6')], [true, true]);
  t.equal(a.dual.handBack('default/dd@IPv6'), 'fd00:99::2', 'after the takeover, to the previous Master');
  clock.advance(HAND_BACK_MS);
  t.equal(a.dual.handBack('default/dd@IPv6'), undefined, 'until HAND_BACK_MS after it');

  // Peers of one family only: nothing (no IPv6 address of the previous Master is known).
  const c = node(lan, clock, 3, 100, { config: { peers: [0x0a630002] }, peerMac });
  c.dual.update(services, () => undefined);
  lan.cut.clear();
  clock.advance(masterDownIntervalMs(100, 100) + 2000);
  t.match(c.dual.status('default/dd@IPv6'), { state: 'backup' });
  t.equal(c.dual.handBack('default/dd@IPv6'), undefined, 'IPv4 peers only: the tied VIP hands nothing back');
  for (const n of [a, b, c]) await n.dual.stop();
});
