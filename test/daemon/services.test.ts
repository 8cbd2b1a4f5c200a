// The services' runtimes (agent/daemon/services.ts): VRRP gating one step
// at a time (a flap queued behind a running step collapses into one step;
// a takeover puts the rules in before the address), the VIP a service is
// served on (an adopted one until its source confirms it, a primary's for
// Share IP), interruptions, a reload's removal, and the start's batch.
// Fakes of the address source and of VRRP, the narrow views the runtimes
// are given; no kernel.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { ServiceRuntimes, acquiringNow, type ServiceRuntimesOptions, type ServiceSubsystems } from '../../agent/daemon/services';
import type { AddressSource, SourceState, SourceStatus } from '../../agent/source';
import type { Desired, ServiceSpec } from '../../agent/config/types';
import type { DaemonMetrics } from '../../agent/daemon/metrics';
import { realClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';

function spec(name: string, o: Partial<ServiceSpec> = {}): ServiceSpec {
  return {
    key: `default/${name}`, name, namespace: 'default', ipam: 'pool', primaryService: undefined, topology: 'any',
    ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }], backends: [],
    ...o,
  } as unknown as ServiceSpec;
}

class FakeSource extends EventEmitter {
  state: SourceState = 'idle';
  vip: string | undefined;
  /** stop() and standby() wait for this when set. */
  hold: Promise<void> | undefined;
  constructor(readonly key: string, private readonly journal: string[]) { super(); }
  status(): SourceStatus {
    return { state: this.state, reason: undefined, vip: this.vip ? { address: this.vip, prefix: 24, ifname: 'eth0', ifindex: 2, mac: '02:00:00:00:00:01' } : undefined, ifname: 'eth0', mac: undefined, details: {} };
  }
  start(opts: { known?: string } = {}): void { this.journal.push(`start ${this.key}${opts.known ? ` known ${opts.known}` : ''}`); this.state = 'acquiring'; }
  async stop(opts: { release: boolean }): Promise<void> {
    this.journal.push(`stop ${this.key}${opts.release ? ' release' : ''}`);
    if (this.hold) await this.hold;
    this.state = 'idle';
    this.journal.push(`stopped ${this.key}`);
  }
  bind(address: string): void { this.state = 'bound'; this.vip = address; this.emit('vip'); }
}

interface Harness { rt: ServiceRuntimes; journal: string[]; sources: Map<string, FakeSource>; master: Set<string>; rules: Set<string>; interrupted: string[]; stopping: { now: boolean }; opts: ServiceRuntimesOptions }

function harness(o: { vrrp?: boolean; known?: Record<string, string> } = {}): Harness {
  const journal: string[] = [];
  const sources = new Map<string, FakeSource>();
  const master = new Set<string>();
  const rules = new Set<string>();
  const interrupted: string[] = [];
  const stopping = { now: false };
  const failover = o.vrrp ? {
    isMaster: (k: string) => master.has(k),
    status: () => ({ master: '10.99.0.3' }),
    knownVip: (k: string) => o.known?.[k],
    update: (services: readonly ServiceSpec[]) => { journal.push(`failover update ${services.map((s) => s.key).join(',')}`); },
  } : undefined;
  const subs = {
    createSource: (s: ServiceSpec) => { const src = new FakeSource(s.key, journal); sources.set(s.key, src); return src as unknown as AddressSource; },
    failover, dataplane: { kind: 'kernel', vipArrived: async (vip: string) => { journal.push(`vip arrived ${vip}`); } },
  } as unknown as ServiceSubsystems;
  const opts: ServiceRuntimesOptions = {
    log: silentLogger(), clock: realClock, subs: () => subs, config: () => ({}) as Desired, stopping: () => stopping.now,
    metrics: () => ({ interrupted: (name: string, _ns: string, cause: string) => { interrupted.push(`${name} ${cause}`); } }) as unknown as DaemonMetrics,
    hasRules: (vip) => rules.has(vip),
    scheduleApply: () => undefined,
    applyNow: async () => { journal.push('apply now'); },
    noteEvent: (kind, ev) => { journal.push(`event ${kind} ${ev.service ?? ''}`); },
    notifyStatusSoon: () => undefined,
  };
  return { rt: new ServiceRuntimes(opts), journal, sources, master, rules, interrupted, stopping, opts };
}

/** Until the gating steps queued now have run. */
async function gated(h: Harness, key: string): Promise<void> { await h.rt.get(key)!.gate; }

t.test('acquiring for the start\'s batch: acquiring, or bound with the address not yet in place', async (t) => {
  const at = (state: SourceState, vip?: boolean): boolean => acquiringNow({ source: { status: () => ({ state, vip: vip ? {} : undefined }) } as unknown as AddressSource });
  t.same([at('acquiring'), at('bound'), at('bound', true), at('renewing', true), at('pending'), at('idle')], [true, true, false, false, false, false]);
  t.equal(acquiringNow({ source: undefined }), false, 'a Share IP service has no source of its own');
  const h = harness();
  h.rt.add(spec('a')); h.rt.add(spec('b'));
  t.equal(h.rt.acquiring(), false, 'idle sources are not acquiring');
  h.rt.startSources();
  t.equal(h.rt.acquiring(), true);
  h.sources.get('default/a')!.bind('10.99.0.200');
  t.equal(h.rt.acquiring(), true, 'one still acquiring');
  h.sources.get('default/b')!.bind('10.99.0.201');
  t.equal(h.rt.acquiring(), false, 'all bound');
  t.equal(h.rt.everyVipInPlace(), false, 'no VIP has its rules yet');
  h.rules.add('10.99.0.200'); h.rules.add('10.99.0.201');
  t.equal(h.rt.everyVipInPlace(), true);
});

t.test('without VRRP every source starts at once', async (t) => {
  const h = harness();
  h.rt.add(spec('a')); h.rt.add(spec('s', { primaryService: 'default/a' }));
  h.rt.startSources();
  t.same(h.journal, ['start default/a'], 'a Share IP service has no source');
  t.equal(h.rt.holds('default/a'), true);
});

t.test('VRRP: a flap behind a running withdrawal collapses into one step', async (t) => {
  const h = harness({ vrrp: true });
  h.rt.add(spec('a'));
  h.master.add('default/a');
  h.rt.startSources();
  await gated(h, 'default/a');
  t.same(h.journal, ['start default/a'], 'Master: the source starts');
  let release: () => void = () => undefined;
  h.sources.get('default/a')!.hold = new Promise((r) => { release = r; });
  h.master.delete('default/a');
  h.rt.onFailoverChange(['default/a']);
  await new Promise((r) => setImmediate(r));
  // While the withdrawal runs: Master, Backup, Master again.
  h.master.add('default/a'); h.rt.gateSource('default/a');
  h.master.delete('default/a'); h.rt.gateSource('default/a');
  h.master.add('default/a'); h.rt.gateSource('default/a');
  release();
  await gated(h, 'default/a');
  t.same(h.journal, [
    'start default/a',
    'event vrrp-backup default/a', 'stop default/a', 'stopped default/a',
    'start default/a',
  ], 'the withdrawal finishes before the next start, and the three queued calls make one start');
});

t.test('VRRP: a takeover puts the rules in before the address', async (t) => {
  const h = harness({ vrrp: true, known: { 'default/a': '10.99.0.200' } });
  h.rt.add(spec('a'));
  h.master.add('default/a');
  h.rt.onFailoverChange(['default/a']);
  await gated(h, 'default/a');
  t.same(h.journal, ['event vrrp-master default/a', 'apply now', 'start default/a known 10.99.0.200'], 'an apply first when the armed rules are not in place');
  t.equal(h.rt.armedVip(spec('a')), '10.99.0.200', 'a Backup arms the rules for the VIP it knows of');
  const armed = harness({ vrrp: true, known: { 'default/a': '10.99.0.200' } });
  armed.rt.add(spec('a'));
  armed.rules.add('10.99.0.200');
  armed.master.add('default/a');
  armed.rt.onFailoverChange(['default/a']);
  await gated(armed, 'default/a');
  t.same(armed.journal, ['event vrrp-master default/a', 'start default/a known 10.99.0.200'], 'no wait when a ready Backup armed them already');
  armed.sources.get('default/a')!.bind('10.99.0.200');
  t.ok(armed.journal.includes('vip arrived 10.99.0.200'), 'a VIP that came over from another node has its old conntrack entries forgotten');
});

t.test('the VIP a service is served on', async (t) => {
  const h = harness();
  h.rt.add(spec('a'), '10.99.0.200');
  h.rt.add(spec('s', { primaryService: 'default/a', ports: [{ name: 'x', port: 81, protocol: 'TCP', targetPort: 8081 }] }));
  t.equal(h.rt.vipOf(spec('a')), '10.99.0.200', 'the VIP an earlier run left, until the source confirms it');
  t.equal(h.rt.get('default/a')!.adopted, true);
  t.equal(h.rt.vipOf(spec('s', { primaryService: 'default/a' })), '10.99.0.200', "a Share IP service: its primary's");
  t.same(h.rt.portsOf('default/a').map((p) => p.port), [80, 81], 'the ports of the primary and of the services sharing its VIP');
  t.same(h.rt.heldVips(), [], 'the drift guard keeps only what a source holds');
  h.rt.startSources();
  h.sources.get('default/a')!.bind('10.99.0.201');
  t.equal(h.rt.get('default/a')!.held, undefined, 'the source confirmed: held no more');
  t.equal(h.rt.vipOf(spec('a')), '10.99.0.201');
  t.same(h.journal.filter((l) => l.startsWith('vip arrived')), [], 'without VRRP no VIP comes from another node');
  t.same(h.rt.heldVips(), [{ key: 'default/a', address: '10.99.0.201', prefix: 24, ifindex: 2, ifname: 'eth0', link: undefined }]);
  const d = harness();
  d.rt.add(spec('d', { ipam: 'dhcp' }));
  d.rt.startSources();
  d.sources.get('default/d')!.bind('10.99.0.50');
  t.same(d.rt.heldVips()[0]!.link, { name: linkNameForService('default/d'), mac: macForService('default/d') }, "a DHCP VIP's macvlan is the drift guard's to keep too");
});

t.test('interruptions: a VIP lost while the service stays configured', async (t) => {
  const h = harness();
  h.rt.add(spec('a'));
  h.rt.startSources();
  const src = h.sources.get('default/a')!;
  src.bind('10.99.0.200');
  src.emit('lost', 'NAK from 10.99.0.1', 'nak');
  src.emit('lost', 'stopped', 'stopped');
  src.emit('lost', 'released', 'released');
  t.same(h.interrupted, ['a nak'], 'the agent\'s own stops and releases are not interruptions');
  t.match(h.rt.get('default/a')!, { interruptions: 1, lastInterruption: { reason: 'NAK from 10.99.0.1' } });
  h.stopping.now = true;
  src.emit('lost', 'conflict', 'conflict');
  t.same(h.interrupted, ['a nak'], 'nor is what happens while the agent stops');
  const held = harness();
  held.rt.add(spec('b'), '10.99.0.210');
  const b = held.sources.get('default/b')!;
  b.state = 'pending';
  b.emit('status');
  t.same(held.interrupted, ['b other'], 'an adopted VIP the source disproves is an interruption');
  t.equal(held.rt.vipOf(spec('b')), undefined, 'and no longer served');
});

t.test('a reload\'s removal: out of the runtimes at once, then the release', async (t) => {
  const h = harness();
  h.rt.add(spec('a')); h.rt.add(spec('b'));
  h.rt.startSources();
  const removing = h.rt.remove('default/a');
  t.equal(h.rt.get('default/a'), undefined, 'gone before the first await');
  t.equal(h.rt.size, 1);
  await removing;
  t.same(h.journal.slice(2), ['stop default/a release', 'stopped default/a']);
  h.rt.add(spec('c'));
  h.rt.reorder(['default/c', 'default/b']);
  t.same([...h.rt.values()].map((r) => r.spec.key), ['default/c', 'default/b'], 'config order');
  h.rt.reorder(['default/c', 'default/b']);
  t.same([...h.rt.values()].map((r) => r.spec.key), ['default/c', 'default/b'], 'the same order again: unchanged');
  h.rt.reorder(['default/b', 'default/c']);
  t.same([...h.rt.values()].map((r) => r.spec.key), ['default/b', 'default/c'], 'and moved when the config moves them');
  h.rt.reorder(['default/c', 'default/b']);
  await h.rt.restart('default/b', spec('b', { ipam: 'dhcp' }), false);
  t.same(h.journal.slice(-2), ['stop default/b', 'stopped default/b'], 'a restart stops the old source, keeping its lease');
  t.equal(h.rt.get('default/b')!.spec.ipam, 'dhcp', 'and a new runtime takes its place');
  const steps: string[] = [];
  await h.rt.stopSources({ release: false }, async (what, fn) => { steps.push(what); await fn(); });
  t.same(steps, ['service default/c', 'service default/b'], 'a stop names each service\'s step');
});
