// Status derivation (agent/daemon/status-view.ts): a service's status from
// its verdict and details, readiness, systemd's STATUS= line and the whole
// status document, from snapshots of the daemon's parts (fakes of the
// narrow views StatusView reads; no kernel).
import t from 'tap';
import { readinessOf, serviceStatusOf, startingStatuses, statusLine, StatusCache, StatusView, type ServiceState, type StatusViewOptions } from '../../agent/daemon/status-view';
import type { ServiceStatus } from '../../agent/daemon/status';
import type { ServiceRuntime } from '../../agent/daemon/services';
import type { Desired, ServiceSpec } from '../../agent/config/types';
import type { SourceStatus } from '../../agent/source';
import type { TopologySelection } from '../../agent/forward/topology';
import { VERSION } from '../../agent/version';

function spec(name: string, o: Partial<ServiceSpec> = {}): ServiceSpec {
  return {
    key: `default/${name}`, name, namespace: 'default', ipam: 'pool', primaryService: undefined, topology: 'any', sourceIP: 'snat',
    ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
    backends: [{ address: '10.99.0.11', weight: 1 }],
    ...o,
  } as unknown as ServiceSpec;
}

const ALL: TopologySelection = { set: 'all', reason: 'policy-any', backends: [{ address: '10.99.0.11', weight: 1 }], detail: 'all' } as unknown as TopologySelection;

function bound(address: string, o: Partial<SourceStatus> = {}): SourceStatus {
  return { state: 'bound', reason: undefined, vip: { address, prefix: 24, ifname: 'eth0', ifindex: 2, mac: '02:00:00:00:00:01' }, ifname: 'eth0', mac: undefined, details: { pool: 'range-global' }, ...o };
}

t.test('a service status: verdict, VIP, MAC and the primary\'s history', async (t) => {
  const st: ServiceState = { state: 'serving', reason: undefined, ready: true, src: bound('10.99.0.200'), failover: undefined, topology: ALL, healthyCount: 1, vip: undefined };
  const s = serviceStatusOf(st, {
    spec: spec('web'), startedAt: 5, primary: { adopted: true, interruptions: 2, lastInterruption: { at: 'then', reason: 'nak' } },
    parentMac: 'aa:bb:cc:00:00:01', backends: [{ address: '10.99.0.11', port: 8080, state: 'up', since: 1, reason: undefined, takenOutBy: undefined }], zone: 'z1',
  });
  t.match(s, {
    key: 'default/web', vip: '10.99.0.200', interface: 'eth0', state: 'serving', ready: true, startedAt: 5,
    adopted: true, interruptions: 2, lastInterruption: { at: 'then', reason: 'nak' }, ports: ['80/TCP->8080'],
    source: { state: 'bound', pool: 'range-global' }, healthyBackends: 1, sourceIP: 'snat',
    topology: { policy: 'any', zone: 'z1', set: 'all', inUse: ['10.99.0.11'] },
  });
  t.equal(s.mac, 'aa:bb:cc:00:00:01', "a pool VIP's MAC is the parent's while its source names none");
  const dhcp = serviceStatusOf({ ...st, src: undefined, vip: '10.99.0.50' }, { spec: spec('d', { ipam: 'dhcp' }), startedAt: 0, primary: undefined, parentMac: 'aa:bb:cc:00:00:01', backends: [], zone: undefined });
  t.equal(dhcp.vip, '10.99.0.50', 'the VIP served (an adopted one) before the source has one');
  t.equal(dhcp.mac, undefined, 'a DHCP VIP without its source has no MAC to show');
  t.same([dhcp.adopted, dhcp.interruptions, dhcp.source], [false, 0, undefined], 'no primary runtime: nothing adopted, no interruptions');
});

t.test('readiness: every service ready, and the agent running', async (t) => {
  const ok = { key: 'default/a', ready: true, state: 'serving', reason: undefined } as ServiceStatus;
  const down = { key: 'default/b', ready: false, state: 'serving', reason: 'no healthy backend: new connections are refused' } as ServiceStatus;
  const pending = { key: 'default/c', ready: false, state: 'pending', reason: undefined } as ServiceStatus;
  t.same(readinessOf([ok], true), { ready: true, notReady: [] });
  t.same(readinessOf([ok], false), { ready: false, notReady: [] }, 'not while starting or stopping');
  t.same(readinessOf([], true), { ready: true, notReady: [] }, 'no services: ready');
  t.same(readinessOf([ok, down, pending], true), { ready: false, notReady: ['default/b: no healthy backend: new connections are refused', 'default/c: pending'] }, 'each one not ready, with its reason or else its state');
});

t.test('before the first reconcile every configured service is starting', async (t) => {
  const s = startingStatuses([spec('a'), spec('b')], false, 42);
  t.same(s.map((x) => [x.key, x.state, x.ready, x.startedAt]), [['default/a', 'starting', false, 42], ['default/b', 'starting', false, 42]]);
  t.match(s[0]!.reason, /^the agent is starting/);
  t.equal(startingStatuses([spec('a')], true, 0)[0]!.reason, 'the agent stopped while starting');
});

t.test("systemd's STATUS= line", async (t) => {
  t.equal(statusLine('kernel', 3, undefined), 'STATUS=0 VIPs served; 3 services, 0 serving, 0 ready; dataplane kernel', 'before the first reconcile: the configured services');
  const serving = (vip: string | undefined, ready: boolean, src?: SourceStatus): Pick<ServiceState, 'state' | 'ready' | 'vip' | 'src'> => ({ state: 'serving', ready, vip, src });
  t.equal(statusLine('proxy', 9, [
    serving('10.99.0.200', true), serving('10.99.0.200', false), // Share IP: one VIP, two services
    serving(undefined, true, bound('10.99.0.201')), // the source's VIP when none is served by name
    { state: 'backup', ready: true, vip: undefined, src: undefined },
    { state: 'acquiring', ready: false, vip: undefined, src: undefined },
  ]), 'STATUS=2 VIPs served; 5 services, 3 serving, 3 ready; dataplane proxy');
  t.equal(statusLine('kernel', 0, [serving('10.99.0.200', true)]), 'STATUS=1 VIP served; 1 services, 1 serving, 1 ready; dataplane kernel', 'one VIP');
});

function view(o: { started: boolean; stopping?: boolean; subs?: boolean }): { v: StatusView; opts: StatusViewOptions } {
  const web = spec('web');
  const shared = spec('shared', { primaryService: 'default/web', ports: [{ name: 'x', port: 81, protocol: 'TCP', targetPort: 8081 }] });
  const src = bound('10.99.0.200');
  const runtimes = new Map<string, ServiceRuntime>([
    ['default/web', { spec: web, source: { status: () => src } as unknown as ServiceRuntime['source'], startedAt: 1, gate: Promise.resolve(), gatePending: false, held: undefined, adopted: true, interruptions: 1, lastInterruption: { at: 'x', reason: 'conflict' }, topology: undefined }],
    ['default/shared', { spec: shared, source: undefined, startedAt: 2, gate: Promise.resolve(), gatePending: false, held: undefined, adopted: false, interruptions: 0, lastInterruption: undefined, topology: undefined }],
  ]);
  const desired = { node: { name: 'vm1', priority: 100 }, failover: { mode: 'none' }, services: [web, shared] } as unknown as Desired;
  const opts: StatusViewOptions = {
    config: () => ({ path: '/etc/lb-agent/config.yaml', desired, loadedAt: 0, generation: 3, lastReload: { at: 9, ok: true, message: 'applied' } }),
    started: () => o.started, stopping: () => o.stopping ?? false,
    subs: () => (o.subs === false ? undefined : {
      parent: { name: 'eth0', index: 2, mac: 'aa:bb:cc:00:00:01', address: '10.99.0.5' },
      health: { healthy: () => [{ address: '10.99.0.11', weight: 1 }], status: () => [] },
      failover: undefined,
      dataplane: { kind: 'kernel', reason: 'nft works' },
      backend: { status: () => ({ vips: [], sysctls: {}, problems: [] }) },
    } as unknown as ReturnType<StatusViewOptions['subs']>),
    services: {
      values: () => runtimes.values(), get: (k) => runtimes.get(k), holds: () => true,
      vipOf: (s) => ((s.primaryService ?? s.key) === 'default/web' ? '10.99.0.200' : undefined),
    },
    topologyOf: () => ALL, serves: (key) => key === 'default/web', drift: () => undefined,
    zone: () => ({ zone: 'z1', region: undefined, zoneFrom: 'config', regionFrom: 'unknown', labelsFile: undefined, problem: undefined }),
    parentAddress: () => '10.99.0.6', events: () => [],
  };
  return { v: new StatusView(opts), opts };
}

t.test('the view of a started agent', async (t) => {
  const { v } = view({ started: true });
  const s = v.serviceStatuses();
  t.same(s.map((x) => [x.key, x.state, x.ready, x.vip, x.adopted, x.interruptions]), [
    ['default/web', 'serving', true, '10.99.0.200', true, 1],
    ['default/shared', 'serving', false, '10.99.0.200', true, 1],
  ], "a Share IP service serves on its primary's VIP, with the VIP's history");
  t.equal(s[1]!.reason, 'forwarding to the healthy backends is being put in place', 'ready only once its own forwarding is applied');
  t.same(v.readiness(), { ready: false, notReady: ['default/shared: forwarding to the healthy backends is being put in place'] });
  t.equal(v.statusLine(), 'STATUS=1 VIP served; 2 services, 2 serving, 1 ready; dataplane kernel');
  const doc = v.statusDocument();
  t.match(doc, {
    version: VERSION, pid: process.pid,
    node: { name: 'vm1', interface: 'eth0', address: '10.99.0.6', priority: 100, zone: 'z1', zoneFrom: 'config' },
    config: { path: '/etc/lb-agent/config.yaml', loadedAt: new Date(0).toISOString(), generation: 3, lastReload: { ok: true, message: 'applied' } },
    dataplane: { kind: 'kernel', reason: 'nft works' }, failover: { mode: 'none' }, ready: false, events: [],
  });
  t.equal(doc.services.length, 2);
  t.equal(doc.dataplane?.dsr, undefined, 'no DSR engine while no DSR port is forwarded');
});

t.test('the view while starting, and before the subsystems exist', async (t) => {
  const starting = view({ started: false }).v;
  t.same(starting.serviceStatuses().map((x) => x.state), ['starting', 'starting']);
  t.equal(starting.readiness().ready, false);
  t.equal(starting.statusLine(), 'STATUS=0 VIPs served; 2 services, 0 serving, 0 ready; dataplane kernel', 'the configured services, none serving yet');
  const bare = view({ started: false, subs: false }).v;
  t.equal(bare.statusLine(), undefined, 'no line before the data path is known');
  const doc = bare.statusDocument();
  t.same([doc.node.interface, doc.dataplane, doc.backend], [undefined, undefined, undefined]);
  t.same(view({ started: true, stopping: true }).v.readiness().ready, false, 'not ready while stopping');
});

t.test('the ready gauge\'s pass gives each service the readiness its status shows', async (t) => {
  const ready = (v: StatusView): [string, string, boolean][] => { const out: [string, string, boolean][] = []; v.eachReady((n, ns, r) => out.push([n, ns, r])); return out; };
  const { v } = view({ started: true });
  t.same(ready(v), v.serviceStatuses().map((s) => [s.name, s.namespace, s.ready]));
  t.same(ready(v), [['web', 'default', true], ['shared', 'default', false]]);
  t.same(ready(view({ started: false }).v), [['web', 'default', false], ['shared', 'default', false]], 'starting: not ready');
});

t.test('StatusCache: built once per change, not per request; readings re-read once older than their bound', async (t) => {
  let now = 0;
  let n = 0;
  const c = new StatusCache(() => ++n, () => now, 5000);
  t.equal(c.get(), 1);
  for (let i = 0; i < 1000; i++) { now += 1; c.get(); }
  t.equal(c.builds, 1, 'a thousand requests over a second, no change: one build');
  c.changed();
  t.equal(c.get(), 2, 'a change: built again at the next request');
  c.changed();
  c.changed();
  t.equal(c.get(), 3, 'changes between two requests: one build');
  t.equal(c.get(), 3, 'then kept');
  now += 4999;
  t.equal(c.get(), 3, 'readings within their bound: kept');
  now += 1;
  t.equal(c.get(), 4, 'readings as old as their bound: built again');
  t.equal(c.builds, 4);
});

t.test('StatusCache: a copy past its readings bound is let go, and only that copy', async (t) => {
  let now = 0;
  let n = 0;
  const due: { ms: number; fn: () => void }[] = [];
  const c = new StatusCache(() => ({ n: ++n }), () => now, 250, (ms, fn) => { due.push({ ms, fn }); });
  const first = c.get();
  t.same(due.map((d) => d.ms), [250], 'let go after the readings bound');
  c.changed();
  const second = c.get();
  t.not(second, first);
  due[0]!.fn();
  now = 100;
  t.equal(c.get(), second, 'the first copy\'s timer leaves the newer copy alone');
  due[1]!.fn();
  t.equal(c.builds, 2);
  const third = c.get();
  t.not(third, second, 'once let go: built again');
  t.equal(c.builds, 3);
});
