// Unit tests of the VirtualRouter driver on an in-memory LAN (a fake packet
// socket that hands frames to the other sockets through a ManualClock):
// what goes on the wire, events, metrics, drops by reason, stop with
// priority 0. The same driver on real AF_PACKET sockets in namespaces, and
// against keepalived, is test/privileged/failover-*.test.ts.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import { formatAddress, formatIPv4, parseAddress, parseIPv4 } from '../../agent/address';
import { isLbError } from '../../agent/errors';
import type { FrameInfo, PacketSocket, PacketSocketOptions } from '../../agent/net/packet/packet';
import { decodeAdvertisement, encodeAdvertisement, vrrpFilter, type AdvertisementFrame } from '../../agent/failover/codec';
import { VirtualRouter, assignVrids, type VirtualRouterOptions } from '../../agent/failover/driver';
import { decodeAdvertisement6, encodeAdvertisement6 } from '../../agent/failover/codec6';

class FakeLan {
  readonly sockets = new Set<FakeSocket>();
  readonly wire: Buffer[] = [];
  constructor(readonly clock: ManualClock, public latencyMs = 0.2) {}
  open = (opts: PacketSocketOptions): PacketSocket => {
    const s = new FakeSocket(this, opts);
    this.sockets.add(s);
    return s;
  };
  deliver(from: FakeSocket | undefined, frame: Buffer): void {
    this.wire.push(frame);
    for (const s of this.sockets) {
      if (s === from) continue;
      this.clock.setTimeout(() => s.receive(frame, { csumNotReady: false, pktType: 2 }), this.latencyMs);
    }
  }
}

class FakeSocket extends EventEmitter implements PacketSocket {
  readonly ifindex: number;
  closed = false;
  failSends = false;
  constructor(private readonly lan: FakeLan, readonly opts: PacketSocketOptions) {
    super();
    this.ifindex = opts.ifindex;
  }
  send(frame: Buffer): void {
    if (this.closed) throw new Error('closed');
    if (this.failSends) throw Object.assign(new Error('send: ENETDOWN'), { code: 'ENETDOWN' });
    this.lan.deliver(this, frame);
  }
  receive(frame: Buffer, info: FrameInfo): void {
    if (!this.closed) this.emit('frame', frame, info);
  }
  close(): void {
    this.closed = true;
    this.lan.sockets.delete(this);
  }
}

interface Harness {
  clock: ManualClock;
  lan: FakeLan;
  registry: Registry;
  make(over: Partial<VirtualRouterOptions> & { srcIp: string; priority: number }): { router: VirtualRouter; events: [string, unknown][] };
}

function harness(): Harness {
  const clock = new ManualClock();
  const lan = new FakeLan(clock);
  const registry = new Registry();
  return {
    clock, lan, registry,
    make(over) {
      const router = new VirtualRouter({
        vrid: 51, advertInterval: 1, preempt: true, preemptDelay: 0, ifindex: 2, ifname: 'eth0',
        vips: () => ['10.99.0.100'], clock, log: silentLogger(), registry, openSocket: lan.open, ...over,
      });
      const events: [string, unknown][] = [];
      for (const e of ['master', 'backup', 'master-changed', 'split-brain', 'dropped', 'stopped']) router.on(e as 'master', (p: unknown) => events.push([e, p]));
      return { router, events };
    },
  };
}

async function metric(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === name);
  const v = (m?.values as { value: number; labels: Record<string, string | number> }[] | undefined)?.find((x) =>
    Object.entries(labels).every(([k, want]) => String(x.labels[k]) === want));
  return v?.value;
}

const decoded = (f: Buffer): AdvertisementFrame => {
  const r = decodeAdvertisement(f);
  if (!r.ok) throw new Error(r.reason);
  return r.frame;
};

t.test('opens a VRRP socket: IPv4, kernel filter on this VRID, the 224.0.0.18 group', async (t) => {
  const h = harness();
  const { router } = h.make({ srcIp: '10.99.0.10', priority: 100, vrid: 77, ifindex: 5 });
  router.start();
  const sock = [...h.lan.sockets][0]!;
  t.equal(sock.opts.ifindex, 5);
  t.equal(sock.opts.protocol, 0x0800);
  t.same(sock.opts.filter, vrrpFilter(77));
  t.same(sock.opts.multicast?.map((m) => m.toString('hex')), ['01005e000012']);
  router.stop();
  t.ok(sock.closed, 'closed on stop');
});

t.test('a lone router: Backup, then Master after Master_Down_Interval, then adverts every interval', async (t) => {
  const h = harness();
  const vips = ['10.99.0.100', '10.99.0.101'];
  const { router, events } = h.make({ srcIp: '10.99.0.10', priority: 100, vips: () => vips });
  let wallAtMaster = 0;
  router.on('master', () => { wallAtMaster = h.clock.wallNow(); });
  router.start();
  t.equal(router.state, 'backup');
  t.same(events, [['backup', { vrid: 51, master: undefined }]]);
  h.clock.advance(3609);
  t.equal(router.state, 'backup', 'not before Master_Down_Interval (3.609375 s)');
  h.clock.advance(1);
  t.equal(router.state, 'master');
  t.same(events.slice(1), [['master', { vrid: 51, master: '10.99.0.10', reason: 'master-down' }], ['master-changed', { vrid: 51, master: '10.99.0.10' }]]);
  t.equal(router.master, '10.99.0.10');
  h.clock.advance(3000);
  t.equal(h.lan.wire.length, 4, 'one advert on becoming Master, then one per second');
  const f = decoded(h.lan.wire[0]!);
  t.equal(f.srcMac.toString('hex'), '00005e000133', 'source MAC is the virtual router MAC (RFC 5798 §7.3)');
  t.equal(formatIPv4(f.srcIp), '10.99.0.10', 'source IP is the primary address');
  t.equal(f.priority, 100);
  t.equal(f.maxAdverIntCs, 100);
  t.same(f.addresses.map(formatIPv4), vips);
  t.same(h.lan.wire.map((w) => decoded(w).ipId), [1, 2, 3, 4], 'IP id counts up');
  vips.push('10.99.0.102');
  h.clock.advance(1000);
  t.same(decoded(h.lan.wire.at(-1)!).addresses.map(formatIPv4), vips, 'VIPs read at every advert');
  t.equal(await metric(h.registry, 'lbagent_vrrp_state', { vrid: '51', state: 'master' }), 1);
  t.equal(await metric(h.registry, 'lbagent_vrrp_state', { vrid: '51', state: 'backup' }), 0);
  t.equal(await metric(h.registry, 'lbagent_vrrp_transitions_total', { vrid: '51', to: 'master' }), 1);
  t.equal(await metric(h.registry, 'lbagent_vrrp_transitions_total', { vrid: '51', to: 'backup' }), 1);
  t.equal(await metric(h.registry, 'lbagent_vrrp_adverts_sent_total', { vrid: '51' }), 5);
  t.equal(await metric(h.registry, 'lbagent_vrrp_master_info', { vrid: '51', master: '10.99.0.10' }), 1);
  t.equal(await metric(h.registry, 'lbagent_vrrp_last_transition_timestamp_seconds', { vrid: '51' }), wallAtMaster / 1000, 'wall time of the transition');
  t.same(router.status(), {
    vrid: 51, family: 'IPv4', ifname: 'eth0', state: 'master', priority: 100, master: '10.99.0.10', masterPriority: 100,
    masterAdverInterval: 1, masterDownInterval: 3.609375,
  });
  router.stop();
});

t.test('an advert already queued when Master_Down_Interval runs out counts before the Backup decides', async (t) => {
  const h = harness();
  const { router, events } = h.make({ srcIp: '10.99.0.10', priority: 100 });
  router.start();
  // The peer's advert is due at the same instant as the Master-down timer and
  // queued after it: a busy event loop reads both in one turn, timers first.
  const sock = [...h.lan.sockets][0]!;
  const advert = encodeAdvertisement({ vrid: 51, priority: 200, maxAdverIntCs: 100, addresses: [parseIPv4('10.99.0.100')!], srcIp: parseIPv4('10.99.0.11')! });
  h.clock.setTimeout(() => sock.receive(advert, { csumNotReady: false, pktType: 2 }), 3609.375);
  h.clock.advance(3610);
  t.equal(router.state, 'backup', 'still Backup: the queued advert re-armed the timer');
  t.equal(router.master, '10.99.0.11', 'and names the live Master');
  t.notOk(events.some((e) => e[0] === 'master'), 'it never became Master');
  h.clock.advance(3700);
  t.equal(router.state, 'master', 'with no advert after it, Master one Master_Down_Interval later');
  router.stop();
});

t.test('two routers: the higher is Master, the other Backup knows it; priority 0 on stop hands over within Skew_Time', async (t) => {
  const h = harness();
  const a = h.make({ srcIp: '10.99.0.10', priority: 100 });
  const b = h.make({ srcIp: '10.99.0.11', priority: 200 });
  a.router.start();
  b.router.start();
  h.clock.advance(10_000);
  t.equal(b.router.state, 'master');
  t.equal(a.router.state, 'backup');
  t.equal(a.router.master, '10.99.0.11');
  t.same(a.events.filter((e) => e[0] === 'master-changed').at(-1), ['master-changed', { vrid: 51, master: '10.99.0.11' }]);
  t.ok(((await metric(h.registry, 'lbagent_vrrp_adverts_received_total', { vrid: '51' })) ?? 0) > 0, 'adverts received');
  const sentBefore = h.lan.wire.length;
  b.router.stop({ priorityZero: true });
  t.equal(h.lan.wire.length, sentBefore + 1, 'one advert on stop');
  t.equal(decoded(h.lan.wire.at(-1)!).priority, 0, 'priority 0');
  t.equal(b.router.state, 'initialize');
  t.same(b.events.at(-1), ['stopped', { vrid: 51 }]);
  const stoppedAt = h.clock.now();
  h.clock.advance(650);
  t.equal(a.router.state, 'master', `Backup took over within Skew_Time (609 ms) + latency`);
  t.ok(h.clock.now() - stoppedAt <= 650);
  a.router.stop();
});

t.test('stop without priority 0, and stop as Backup, send nothing', async (t) => {
  const h = harness();
  const a = h.make({ srcIp: '10.99.0.10', priority: 100 });
  a.router.start();
  h.clock.advance(4000);
  const n = h.lan.wire.length;
  a.router.stop({ priorityZero: false });
  t.equal(h.lan.wire.length, n);
  a.router.stop();
  t.equal(a.events.filter((e) => e[0] === 'stopped').length, 1, 'idempotent');
  const b = h.make({ srcIp: '10.99.0.12', priority: 100 });
  b.router.start();
  b.router.stop();
  t.equal(h.lan.wire.length, n, 'a Backup has nothing to resign');
  t.throws(() => b.router.start(), { code: 'LB_ERR_VRRP_SOCKET' }, 'a stopped router does not restart');
});

t.test('malformed adverts are dropped and counted by reason, and change nothing', async (t) => {
  const h = harness();
  const { router, events } = h.make({ srcIp: '10.99.0.10', priority: 100 });
  router.start();
  h.clock.advance(4000);
  t.equal(router.state, 'master');
  const forge = (over: Record<string, number>): Buffer =>
    encodeAdvertisement({ vrid: 51, priority: 250, maxAdverIntCs: 100, addresses: [], srcIp: parseIPv4('10.99.0.66')!, ...over });
  const badSum = forge({});
  badSum[14 + 20 + 7]! ^= 0xff;
  for (const f of [forge({ ttl: 64 }), forge({ version: 2 }), badSum, forge({ type: 7 }), Buffer.alloc(10)]) h.lan.deliver(undefined, f);
  h.clock.advance(1);
  t.equal(router.state, 'master', 'a forged priority 250 did not unseat us');
  for (const [reason, n] of [['bad-ttl', 1], ['bad-version', 1], ['bad-checksum', 1], ['bad-type', 1], ['truncated', 1]] as const) {
    t.equal(await metric(h.registry, 'lbagent_vrrp_dropped_total', { reason }), n, reason);
  }
  t.equal(events.filter((e) => e[0] === 'dropped').length, 5);
  t.equal(await metric(h.registry, 'lbagent_vrrp_adverts_received_total', { vrid: '51' }), undefined, 'none counted as received');
  // Other VRIDs (the kernel filter keeps them out anyway) and our own frames are ignored, not dropped.
  h.lan.deliver(undefined, forge({ vrid: 52 }));
  h.lan.deliver(undefined, encodeAdvertisement({ vrid: 51, priority: 250, maxAdverIntCs: 100, addresses: [], srcIp: parseIPv4('10.99.0.10')! }));
  const sock = [...h.lan.sockets][0]!;
  sock.receive(forge({}), { csumNotReady: false, pktType: 4 });
  h.clock.advance(1);
  t.equal(router.state, 'master');
  t.equal(events.filter((e) => e[0] === 'dropped').length, 5, 'not counted as drops');
  // And a genuine one does unseat us.
  h.lan.deliver(undefined, forge({}));
  h.clock.advance(1);
  t.equal(router.state, 'backup');
  t.equal(router.master, '10.99.0.66');
  router.stop();
});

t.test('split brain: counted on both sides, the lower one yields', async (t) => {
  const h = harness();
  const a = h.make({ srcIp: '10.99.0.10', priority: 100 });
  const b = h.make({ srcIp: '10.99.0.11', priority: 200 });
  // Cut the LAN: both become Master.
  h.lan.latencyMs = 60_000;
  a.router.start();
  b.router.start();
  h.clock.advance(5000);
  t.equal(a.router.state, 'master');
  t.equal(b.router.state, 'master');
  // Heal it: adverts in flight arrive at the same latency; make new ones fast.
  h.lan.latencyMs = 0.2;
  h.clock.advance(2000);
  t.equal(a.router.state, 'backup', 'the lower priority yielded');
  t.equal(b.router.state, 'master');
  t.same(a.events.find((e) => e[0] === 'split-brain'), ['split-brain', { vrid: 51, peer: '10.99.0.11', peerPriority: 200, resolution: 'yielded' }]);
  // The adverts a sent as Master during the cut reach b late: b hears
  // another (lower) Master while Master, counts it and keeps its role.
  h.clock.advance(70_000);
  t.equal(b.router.state, 'master');
  t.equal(a.router.state, 'backup');
  t.same(b.events.find((e) => e[0] === 'split-brain'), ['split-brain', { vrid: 51, peer: '10.99.0.10', peerPriority: 100, resolution: 'kept' }]);
  t.ok((await metric(h.registry, 'lbagent_vrrp_split_brain_total', { vrid: '51' }))! >= 2, 'counted on both sides');
  a.router.stop();
  b.router.stop();
});

t.test('0.01 s adverts: failover in tens of milliseconds', async (t) => {
  const h = harness();
  h.lan.latencyMs = 0.05;
  const a = h.make({ srcIp: '10.99.0.10', priority: 100, advertInterval: 0.01 });
  const b = h.make({ srcIp: '10.99.0.11', priority: 200, advertInterval: 0.01 });
  a.router.start();
  b.router.start();
  h.clock.advance(200);
  t.equal(b.router.state, 'master');
  b.router.stop({ priorityZero: false });
  const t0 = h.clock.now();
  let took = -1;
  a.router.once('master', () => { took = h.clock.now() - t0; });
  h.clock.advance(100);
  t.ok(took > 0 && took <= 3 * 10 + 6.1 + 10, `took ${took.toFixed(2)} ms (Master_Down_Interval 36.1 ms)`);
  a.router.stop();
});

t.test('a send that fails is logged, not thrown; more than 255 VIPs are cut to 255', async (t) => {
  const h = harness();
  const many = Array.from({ length: 300 }, (_, i) => `10.1.${i >> 8}.${i & 255}`);
  const { router } = h.make({ srcIp: '10.99.0.10', priority: 100, vips: () => many });
  router.start();
  h.clock.advance(3610);
  t.equal(decoded(h.lan.wire[0]!).addresses.length, 255);
  ([...h.lan.sockets][0] as FakeSocket).failSends = true;
  t.doesNotThrow(() => h.clock.advance(2000));
  t.equal(router.state, 'master');
  router.stop();
});

t.test('options are validated with LB_ERR_VRRP_INVALID', async (t) => {
  const h = harness();
  for (const over of [{ vrid: 0 }, { vrid: 256 }, { priority: 0 }, { priority: 256 }, { advertInterval: 0 }, { advertInterval: 41 }, { preemptDelay: -1 }, { srcIp: '10.99.0' }, { srcMac: 'zz' }]) {
    try {
      h.make({ srcIp: '10.99.0.10', priority: 100, ...over });
      t.fail(`accepted ${JSON.stringify(over)}`);
    } catch (e) {
      t.ok(isLbError(e, 'LB_ERR_VRRP_INVALID'), JSON.stringify(over));
    }
  }
  const { router } = h.make({ srcIp: '10.99.0.10', priority: 100, srcMac: '02:00:00:00:00:01' });
  router.start();
  h.clock.advance(4000);
  t.equal(decoded(h.lan.wire[0]!).srcMac.toString('hex'), '020000000001', 'srcMac overrides the virtual router MAC');
  router.stop();
});

t.test('several routers share one registry', async (t) => {
  const h = harness();
  const a = h.make({ srcIp: '10.99.0.10', priority: 100, vrid: 51 });
  const b = h.make({ srcIp: '10.99.0.10', priority: 100, vrid: 52 });
  a.router.start();
  b.router.start();
  t.equal(await metric(h.registry, 'lbagent_vrrp_state', { vrid: '51', state: 'backup' }), 1);
  t.equal(await metric(h.registry, 'lbagent_vrrp_state', { vrid: '52', state: 'backup' }), 1);
  a.router.stop();
  b.router.stop();
});

t.test('assignVrids is re-exported for the daemon', async (t) => {
  t.same([...assignVrids([{ key: 'default/a' }], 51).vrids], [['default/a', 51]]);
});

t.test('a socket that cannot open: start throws, nothing started', async (t) => {
  const h = harness();
  const { router, events } = h.make({
    srcIp: '10.99.0.10', priority: 100,
    openSocket: () => { throw Object.assign(new Error('needs CAP_NET_RAW'), { code: 'LB_ERR_NET_NO_CAPABILITY' }); },
  });
  t.throws(() => router.start(), { code: 'LB_ERR_NET_NO_CAPABILITY' });
  t.equal(router.state, 'initialize');
  h.clock.advance(10_000);
  t.same(events, [], 'no timer, no event');
  t.equal(await metric(h.registry, 'lbagent_vrrp_state', { vrid: '51', state: 'initialize' }), 1);
});

t.test('the interface\'s address changes: adverts carry the new one, and the Master stays Master', async (t) => {
  const h = harness();
  const { router, events } = h.make({ srcIp: '10.99.0.10', priority: 100 });
  router.start();
  h.clock.advance(3610);
  t.equal(router.state, 'master');
  const before = events.length;
  router.setSource('10.99.0.14');
  h.clock.advance(1000);
  const f = decoded(h.lan.wire.at(-1)!);
  t.equal(formatIPv4(f.srcIp), '10.99.0.14', 'the next advert is sent from the new address');
  t.equal(router.state, 'master');
  t.equal(router.master, '10.99.0.14', 'status names this node by its new address');
  router.setSource('not an address');
  h.clock.advance(1000);
  t.equal(formatIPv4(decoded(h.lan.wire.at(-1)!).srcIp), '10.99.0.14', 'a value that is no address changes nothing');
  t.same(events.slice(before).filter(([e]) => e === 'backup' || e === 'master'), [], 'no transition');
  router.stop();
});

t.test('IPv6 (RFC 5798 §5.1.2): adverts from the link-local address to ff02::12, IPv6 VIPs only; ties go to the greater address', async (t) => {
  const h = harness();
  const v6vips = () => ['10.99.0.100', 'fd00:99::200', 'FD00:99::200', 'fd00:99::201'];
  // Equal priorities: the greatest link-local address wins (§6.4.3), compared over all 128 bits.
  const a = h.make({ family: 'IPv6', srcIp: 'fe80::ffff', priority: 100, vips: v6vips });
  const b = h.make({ family: 'IPv6', srcIp: 'fe80::1:0', priority: 100, vips: v6vips });
  const c = h.make({ family: 'IPv6', srcIp: 'FE80::2', priority: 100, vips: v6vips });
  for (const r of [a, b, c]) r.router.start();
  const sock = [...h.lan.sockets][0]!;
  t.equal(sock.opts.protocol, 0x86dd, 'an ETH_P_IPV6 socket');
  t.same(sock.opts.multicast?.map((m) => Buffer.from(m).toString('hex')), ['333300000012'], 'joined the group MAC of ff02::12');
  h.clock.advance(10_000);
  t.same([a.router.state, b.router.state, c.router.state], ['backup', 'master', 'backup'], 'fe80::1:0 is the greatest');
  t.equal(a.router.master, 'fe80::1:0', 'Backups name the Master by its link-local address');
  t.equal(c.router.status().family, 'IPv6');
  t.equal(c.router.status().master, 'fe80::1:0');
  const sent = h.lan.wire.slice(-3).map((f) => decodeAdvertisement6(f));
  for (const r of sent) {
    if (!r.ok) { t.fail(r.reason); continue; }
    t.same([formatAddress({ family: 'IPv6', value: r.frame.src }), formatAddress({ family: 'IPv6', value: r.frame.dst }), r.frame.hopLimit, r.frame.srcMac.toString('hex')],
      ['fe80::1:0', 'ff02::12', 255, '00005e000233']);
    t.same(r.frame.addresses.map((v) => formatAddress({ family: 'IPv6', value: v })), ['fd00:99::200', 'fd00:99::201'], 'the IPv4 VIP left out, duplicates once');
  }
  // All three time out together (equal priorities) and the two lesser yield at the first advert.
  t.ok((await metric(h.registry, 'lbagent_vrrp_transitions_total', { vrid: '51', family: 'IPv6', to: 'master' }) ?? 0) >= 1, 'metrics carry the family');
  t.equal(await metric(h.registry, 'lbagent_vrrp_transitions_total', { vrid: '51', family: 'IPv4' }), undefined, 'and nothing counts as IPv4');
  t.equal(await metric(h.registry, 'lbagent_vrrp_master_info', { vrid: '51', family: 'IPv6', master: 'fe80::1:0' }), 1);
  // The Master leaves with priority 0; the next greatest takes over within Skew_Time.
  b.router.stop();
  h.clock.advance(1000);
  t.equal(c.router.state, 'backup');
  t.equal(a.router.state, 'master', 'fe80::ffff next');
  for (const r of [a, c]) r.router.stop();
});

t.test('IPv6: forged adverts are dropped and counted by reason; an IPv4 advert is not ours', async (t) => {
  const h = harness();
  const r = h.make({ family: 'IPv6', srcIp: 'fe80::1', priority: 100, vips: () => ['fd00::100'] });
  r.router.start();
  h.clock.advance(5000);
  t.equal(r.router.state, 'master');
  const forged = (o: Partial<Parameters<typeof encodeAdvertisement6>[0]>): Buffer => encodeAdvertisement6({
    vrid: 51, priority: 254, maxAdverIntCs: 100, addresses: [parseAddress('fd00::100')!.value], src: parseAddress('fe80::66')!.value, ...o,
  });
  const lan = (f: Buffer): void => { h.lan.deliver(undefined, f); h.clock.advance(1); };
  lan(forged({ hopLimit: 64 }));
  lan(forged({ src: parseAddress('fd00::66')!.value }));
  lan(forged({ version: 2 }));
  const bad = forged({});
  bad[bad.length - 1]! ^= 1;
  lan(bad);
  lan(encodeAdvertisement({ vrid: 51, priority: 254, maxAdverIntCs: 100, addresses: [0x0a630064], srcIp: 0x0a630066 }));
  h.clock.advance(5000);
  t.equal(r.router.state, 'master', 'nothing changed');
  for (const reason of ['bad-hop-limit', 'bad-source', 'bad-version', 'bad-checksum', 'not-vrrp']) {
    t.equal(await metric(h.registry, 'lbagent_vrrp_dropped_total', { reason, family: 'IPv6' }), 1, `${reason} counted once`);
  }
  t.same(r.events.filter(([e]) => e === 'dropped').map(([, p]) => (p as { reason: string }).reason), ['bad-hop-limit', 'bad-source', 'bad-version', 'bad-checksum', 'not-vrrp']);
  // A valid advert from a higher priority link-local router is heard.
  lan(forged({}));
  t.equal(r.router.state, 'backup', 'a genuine higher-priority advert is obeyed');
  t.equal(r.router.master, 'fe80::66');
  r.router.stop();
});

t.test('IPv6 failover.peers: only listed sources are heard, and each advert goes to each resolved peer unicast', async (t) => {
  const h = harness();
  const mac = Buffer.from('020000000009', 'hex');
  const r = h.make({ family: 'IPv6', srcIp: 'fe80::1', priority: 100, vips: () => ['fd00::100'], peers: ['fe80::9', 'fd00::9'], peerMac: (ip) => (ip === 'fd00::9' ? mac : undefined) });
  r.router.start();
  h.lan.deliver(undefined, encodeAdvertisement6({ vrid: 51, priority: 200, maxAdverIntCs: 100, addresses: [], src: parseAddress('fe80::66')!.value }));
  h.clock.advance(5000);
  t.equal(r.router.state, 'master', 'an advert from outside failover.peers changes nothing');
  t.equal(await metric(h.registry, 'lbagent_vrrp_dropped_total', { reason: 'not-a-peer', family: 'IPv6' }), 1);
  const ours = h.lan.wire.map((f) => decodeAdvertisement6(f)).filter((d) => d.ok && d.frame.src === parseAddress('fe80::1')!.value).map((d) => (d.ok ? d.frame : undefined)!);
  const uni = ours.filter((f) => f.dst !== parseAddress('ff02::12')!.value);
  t.ok(uni.length >= 1 && uni.length === ours.length - uni.length, `one unicast copy per advert (${uni.length})`);
  t.ok(uni.every((f) => f.dst === parseAddress('fd00::9')!.value && f.dstMac.equals(mac) && f.hopLimit === 255), 'to the resolved peer, hop limit 255');
  // A unicast advert from a global peer address is heard (keepalived unicast_peer).
  h.lan.deliver(undefined, encodeAdvertisement6({ vrid: 51, priority: 200, maxAdverIntCs: 100, addresses: [], src: parseAddress('fd00::9')!.value, dst: parseAddress('fe80::1')!.value }));
  h.clock.advance(1);
  t.equal(r.router.state, 'backup');
  t.equal(r.router.master, 'fd00::9');
  r.router.stop();
});
