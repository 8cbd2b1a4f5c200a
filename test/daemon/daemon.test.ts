// The daemon's life cycle (agent/daemon/daemon.ts) through its injected
// subsystems, no namespaces: in-memory fakes of the Subsystems interfaces
// (daemon/subsystems.ts) write what is asked of them to one journal, and the
// real config loader, state store, lock, control socket and metrics endpoint
// run in a scratch directory. What a user would notice: the order things
// come up and go down in, a failed start that leaves nothing running, a
// reload that does what its plan says and no more, overlapping reloads that
// fold into one, and a stop that lets a reload in flight finish its step.
import t from 'tap';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { EventEmitter } from 'node:events';
import { stringify } from '../../lab/yaml';
import { Daemon, type StatusDocument } from '../../agent/daemon/daemon';
import { START_HOLD_MAX_MS } from '../../agent/daemon/tiering';
import { STATUS_READINGS_MS } from '../../agent/daemon/status-view';
import type { BackendHealth, DataplaneLike, FailoverLike, ForwardService, HealthLike, ParentLink, Subsystems } from '../../agent/daemon/subsystems';
import type { AddressSource, SourceState, SourceStatus, Vip } from '../../agent/source';
import type { BackendSpec, Desired, PortSpec, ServiceSpec } from '../../agent/config/types';
import { controlRequest } from '../../agent/control/server';
import { InstanceLock } from '../../agent/daemon/lock';
import { RELOAD_INLINE_MAX_BYTES } from '../../agent/config/load-async';
import { silentLogger } from '../../agent/log';
import { METRICS_LIMITS } from '../../agent/metrics/server';

type Journal = string[];

/** A manual gate: a fake's step waits on it until the test opens it. */
class Gate {
  private open_: () => void = () => undefined;
  readonly promise = new Promise<void>((r) => { this.open_ = r; });
  open(): void { this.open_(); }
}

class FakeSource extends EventEmitter implements AddressSource {
  private state: SourceState = 'idle';
  private vip: Vip | undefined;
  /** Set by a test: stop() waits on it. */
  stopGate: Gate | undefined;

  constructor(readonly spec: ServiceSpec, private readonly journal: Journal) { super(); }

  start(): void {
    this.journal.push(`source ${this.spec.key} start`);
    if (this.state === 'idle') this.state = 'acquiring';
  }

  async stop(opts: { release: boolean; keep?: boolean }): Promise<void> {
    this.journal.push(`source ${this.spec.key} stop${opts.release ? ' release' : ''}${opts.keep ? ' keep' : ''}`);
    if (this.stopGate) await this.stopGate.promise;
    this.journal.push(`source ${this.spec.key} stopped`);
    const had = this.vip;
    this.state = 'idle';
    this.vip = undefined;
    if (had) this.emit('lost', opts.release ? 'released' : 'stopped');
  }

  /** The VIP is up on the LAN (what a bound lease or a claimed pool address does). */
  bind(address: string): void {
    this.state = 'bound';
    this.vip = { address, prefix: 24, ifname: 'eth0', ifindex: 2, mac: '02:00:00:00:00:01' };
    this.emit('vip', this.vip);
    this.emit('status');
  }

  /** A step that changes only what the source reports (a renewal's times), with no VIP event. */
  step(details: Record<string, unknown>): void {
    this.details = details;
    this.emit('status');
  }

  private details: Record<string, unknown> = {};

  status(): SourceStatus {
    return { state: this.state, reason: undefined, vip: this.vip, ifname: 'eth0', mac: '02:00:00:00:00:01', details: this.details };
  }
}

/** VRRP as the daemon sees it: who is Master of which service, and the VIP each is known to have. */
class FakeFailover extends EventEmitter implements FailoverLike {
  readonly masterOf = new Set<string>();
  readonly vips = new Map<string, string>();
  update(): void {}
  isMaster(key: string): boolean { return this.masterOf.has(key); }
  status(key: string): Record<string, unknown> { return { state: this.masterOf.has(key) ? 'master' : 'backup' }; }
  knownVip(key: string): string | undefined { return this.vips.get(key); }
  async stop(): Promise<void> {}
  /** An election's outcome: Master of `key` or not. */
  set(key: string, master: boolean): void {
    if (master) this.masterOf.add(key); else this.masterOf.delete(key);
    this.emit('change', [key]);
  }
}

class FakeHealth extends EventEmitter implements HealthLike {
  private services: readonly ServiceSpec[] = [];
  constructor(private readonly journal: Journal) { super(); }
  update(services: readonly ServiceSpec[]): void {
    this.services = services;
    this.journal.push(`health update ${services.map((s) => s.key).join(',')}`);
  }
  start(): void { this.journal.push('health start'); }
  stop(): void { this.journal.push('health stop'); }
  /** Backends the checker holds down, as "key address". */
  readonly down = new Set<string>();
  healthy(key: string): readonly BackendSpec[] { return (this.services.find((s) => s.key === key)?.backends ?? []).filter((b) => !this.down.has(`${key} ${b.address}`)); }
  status(key: string): readonly BackendHealth[] {
    return this.healthy(key).map((b) => ({ address: b.address, port: 8080, state: 'up', since: undefined, reason: undefined, takenOutBy: undefined }));
  }
}

class FakeDataplane implements DataplaneLike {
  readonly kind = 'kernel' as const;
  readonly reason = 'fake';
  /** Every state applied, newest last. */
  readonly applied: (readonly ForwardService[])[] = [];
  /** Called at stop(), to look at the world at that moment. */
  onStop: (() => void) | undefined;
  constructor(private readonly journal: Journal) {}
  /** Set by a test: apply() waits on it, after journaling. */
  applyGate: Gate | undefined;
  async apply(services: readonly ForwardService[]): Promise<void> {
    this.applied.push(services);
    this.journal.push(`dataplane apply ${services.map((s) => `${s.key.split('/')[1]}=${s.vip ?? '-'}`).join(',')}`);
    if (this.applyGate) await this.applyGate.promise;
  }
  async stop(opts: { keep?: boolean } = {}): Promise<void> {
    this.onStop?.();
    this.journal.push(`dataplane stop${opts.keep ? ' keep' : ''}`);
  }
  /** Every vipArrived(vip, ports), as "vip port/proto,..." (not in the journal: most tests do not care). */
  readonly arrived: string[] = [];
  async vipArrived(vip: string, ports: readonly PortSpec[]): Promise<void> {
    this.arrived.push(`${vip} ${ports.map((p) => `${p.port}/${p.protocol}`).join(',')}`);
  }
}

interface Fakes {
  journal: Journal;
  sources: Map<string, FakeSource>;
  health: FakeHealth;
  dataplane: FakeDataplane;
  /** Only when a test asks for VRRP. */
  failover: FakeFailover | undefined;
  /** Built by the daemon (undefined until buildSubsystems ran). */
  config: Desired | undefined;
  /** Awaited by the subsystems' close(), to look at the world at that moment. */
  onClose?: () => Promise<void>;
  /** What observeHeld reports: VIPs an earlier run left on the kernel, by service. */
  held: Map<string, string>;
}

function fakes(fail: { build?: Error } = {}, o: { vrrp?: boolean } = {}): Fakes & { build: (config: Desired) => Promise<Subsystems> } {
  const journal: Journal = [];
  const f: Fakes = { journal, sources: new Map(), health: new FakeHealth(journal), dataplane: new FakeDataplane(journal), failover: o.vrrp ? new FakeFailover() : undefined, config: undefined, held: new Map() };
  const parent: ParentLink = { name: 'eth0', index: 2, mac: '02:00:00:00:00:02', address: '10.99.0.2' };
  const build = async (config: Desired): Promise<Subsystems> => {
    journal.push('build');
    f.config = config;
    if (fail.build) throw fail.build;
    return {
      parent,
      createSource: (spec) => {
        journal.push(`create source ${spec.key}`);
        const s = new FakeSource(spec, journal);
        f.sources.set(spec.key, s);
        return s;
      },
      observeHeld: async () => { journal.push('observe held'); return new Map(f.held); },
      adoptOwned: async () => { journal.push('adopt owned'); return { adopted: [], removed: [] }; },
      health: f.health,
      dataplane: f.dataplane,
      // The backend side of DSR (issue 17) is not what these tests are about: no VIPs on lo.
      backend: { apply: async () => {}, withdraw: async () => {}, status: () => ({ vips: [], sysctls: {}, problems: [] }) },
      failover: f.failover,
      reconfigure: () => { journal.push('reconfigure'); },
      close: async () => { journal.push('close'); await f.onClose?.(); },
    };
  };
  return Object.assign(f, { build });
}

interface Svc { name: string; ipam?: 'dhcp' | 'pool'; backends?: string[]; loadBalancerIP?: string; primaryService?: string }

function writeConfig(file: string, dir: string, services: Svc[], extra: Record<string, unknown> = {}): void {
  fs.writeFileSync(file, stringify({
    node: { name: 'vm1', interface: 'eth0' },
    stateDir: path.join(dir, 'state'),
    control: { socket: path.join(dir, 'agent.sock') },
    metrics: { listen: '' },
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    ...extra,
    services: services.map((s) => ({
      name: s.name,
      ...(s.primaryService ? { primaryService: s.primaryService } : { ipam: s.ipam ?? 'pool' }),
      ...(s.loadBalancerIP ? { loadBalancerIP: s.loadBalancerIP } : {}),
      ports: [{ port: s.primaryService ? 8081 : 80, targetPort: 8080 }],
      backends: s.backends ?? ['10.99.0.11'],
    })),
  }));
}

interface Harness {
  dir: string;
  file: string;
  socket: string;
  daemon: Daemon;
  fk: ReturnType<typeof fakes>;
  notified: string[];
  /** The STATUS= lines sent to systemd, oldest first. */
  statuses: string[];
  /** How often the daemon asked to give freed memory back (DaemonOptions.trimMemory). */
  trims: { count: number };
  /** The optimizer hold's steps (DaemonOptions.holdOptimizer): 'hold', then 'release' at most once. */
  optimizer: string[];
  write(services: Svc[], extra?: Record<string, unknown>): void;
  /** The journal from index `from` on. */
  since(from: number): string[];
}

function harness(t: { teardown(fn: () => unknown): void }, services: Svc[], o: { fail?: { build?: Error }; extra?: Record<string, unknown>; vrrp?: boolean; startApplyBatchMs?: number } = {}): Harness {
  const optimizer: string[] = [];
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-daemon-'));
  const file = path.join(dir, 'config.yaml');
  const fk = fakes(o.fail, { vrrp: o.vrrp });
  const notified: string[] = [];
  const statuses: string[] = [];
  const trims = { count: 0 };
  const daemon = new Daemon({
    configPath: file, log: silentLogger(), buildSubsystems: (c) => fk.build(c), notify: (m) => { (m.startsWith('STATUS=') ? statuses : notified).push(m); },
    trimMemory: () => { trims.count++; },
    holdOptimizer: () => { optimizer.push('hold'); return () => { optimizer.push('release'); }; },
    ...(o.startApplyBatchMs !== undefined ? { startApplyBatchMs: o.startApplyBatchMs } : {}),
  });
  t.teardown(async () => { await daemon.stop().catch(() => undefined); fs.rmSync(dir, { recursive: true, force: true }); });
  const h: Harness = {
    dir, file, socket: path.join(dir, 'agent.sock'), daemon, fk, notified, statuses, trims, optimizer,
    write: (s, extra) => writeConfig(file, dir, s, { ...o.extra, ...extra }),
    since: (from) => fk.journal.slice(from),
  };
  h.write(services);
  return h;
}

/** Let queued applies and events run: until the journal has not grown for 100 ms (at most 5 s). */
async function settle(h: Harness): Promise<void> {
  for (let i = 0; i < 50; i++) {
    const n = h.fk.journal.length;
    await new Promise((r) => setTimeout(r, 100));
    if (h.fk.journal.length === n) return;
  }
}

async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.createConnection({ host: '127.0.0.1', port }, () => { c.destroy(); resolve(true); });
    c.on('error', () => resolve(false));
  });
}

const TWO: Svc[] = [{ name: 'web', ipam: 'dhcp' }, { name: 'api', ipam: 'pool' }];

t.test('start: the control socket, then subsystems, the first forwarding state, the sources; READY=1 last', async (t) => {
  const h = harness(t, TWO);
  const socketAt: Record<string, boolean> = {};
  const start = h.daemon.start();
  // The control socket answers from the start (issue 18: a restart is part of
  // every upgrade); status says "starting" until the first reconcile.
  h.fk.journal.push = function (...items: string[]) {
    for (const i of items) if (i === 'build' || i === 'source default/web start') socketAt[i] = fs.existsSync(h.socket);
    return Array.prototype.push.apply(this, items);
  };
  await start;
  t.same(h.fk.journal, [
    'build', 'adopt owned', 'observe held',
    'create source default/web', 'create source default/api',
    'health update default/web,default/api', 'health start',
    'dataplane apply web=-,api=-',
    'source default/web start', 'source default/api start',
  ], 'in order');
  t.same(socketAt, { build: true, 'source default/web start': true }, 'the control socket was up before the subsystems were built');
  t.same(h.notified, ['READY=1'], 'READY=1 once everything is up');
  t.equal(h.fk.config?.stateDir, path.join(h.dir, 'state'), 'the subsystems got the loaded config');

  const doc = await controlRequest(h.socket, 'status') as StatusDocument;
  t.same(doc.services.map((s) => [s.key, s.state, s.ready]), [['default/web', 'acquiring', false], ['default/api', 'acquiring', false]], 'status answers: no VIP yet');

  const from = h.fk.journal.length;
  h.fk.sources.get('default/api')!.bind('10.99.0.200');
  await waitJournal(h, 'dataplane apply web=-,api=10.99.0.200');
  // The 'vip' and 'status' events may fold into one transaction or make two of the same.
  t.same([...new Set(h.since(from))], ['dataplane apply web=-,api=10.99.0.200'], "a bound VIP is forwarded at once, the other service's state kept");
  const after = await controlRequest(h.socket, 'status') as StatusDocument;
  t.match(after.services[1], { key: 'default/api', vip: '10.99.0.200', state: 'serving', ready: true });
  t.match(after.events.at(-1), { kind: 'vip-gained', service: 'default/api', address: '10.99.0.200' });
});

t.test('a failed start undoes what it did: nothing keeps running, the lock and ports are free', async (t) => {
  await t.test('the control socket cannot be bound (the first step after the lock)', async (t) => {
    const port = await freePort();
    const h = harness(t, TWO, { extra: { metrics: { listen: `127.0.0.1:${port}` } } });
    // Something that is not a stale socket where the socket goes.
    fs.mkdirSync(h.socket);
    fs.writeFileSync(path.join(h.socket, 'keep'), '');
    await t.rejects(h.daemon.start(), { code: 'LB_ERR_DAEMON_START', message: new RegExp(`control socket ${h.socket}`) });
    t.same(h.fk.journal, [], 'nothing else was asked of anyone');
    t.equal(await portOpen(port), false, 'the metrics port never opened');
    t.notOk(fs.existsSync(path.join(h.dir, 'state', 'lb-agent.lock')), 'the lock is released');
    t.same(h.notified, [], 'never READY=1');
  });

  await t.test('the subsystems cannot be built', async (t) => {
    const port = await freePort();
    const h = harness(t, TWO, { fail: { build: Object.assign(new Error('macvlan: Operation not supported'), { code: 'EOPNOTSUPP' }) }, extra: { metrics: { listen: `127.0.0.1:${port}` } } });
    await t.rejects(h.daemon.start(), { message: 'macvlan: Operation not supported' });
    t.same(h.fk.journal, ['build'], 'nothing else was asked of anyone');
    t.equal(await portOpen(port), false, 'the metrics endpoint that had started is closed');
    const lock = new InstanceLock(path.join(h.dir, 'state'));
    lock.acquire();
    lock.release();
    t.pass('a next start can take the lock');
  });

  await t.test('an invalid file starts nothing', async (t) => {
    const h = harness(t, TWO);
    fs.writeFileSync(h.file, 'services:\n  - name: web\n    ports: [{ port: 70000 }]\n');
    await t.rejects(h.daemon.start(), { code: 'LB_ERR_CONFIG_INVALID', message: /services\[0\]\.ports\[0\]\.port/ });
    t.same(h.fk.journal, []);
    t.notOk(fs.existsSync(path.join(h.dir, 'state')), 'not even the state directory');
  });
});

t.test('a reload carries out its plan: removed, re-sourced, updated in place, added', async (t) => {
  const h = harness(t, [{ name: 'web', ipam: 'dhcp' }, { name: 'api' }, { name: 'gone' }]);
  await h.daemon.start();
  h.fk.sources.get('default/web')!.bind('10.99.0.100');
  await waitJournal(h, 'dataplane apply web=10.99.0.100,api=-,gone=-');
  await settle(h);
  const from = h.fk.journal.length;
  h.write([
    { name: 'web', ipam: 'dhcp', backends: ['10.99.0.11', '10.99.0.12'] }, // backends: updated in place
    { name: 'api', loadBalancerIP: '10.99.0.205' }, // the address changes: a new source
    { name: 'new' },
  ]);
  const r = await h.daemon.reload();
  t.equal(r.ok, true, r.message);
  t.same(r.summary && { added: r.summary.added, removed: r.summary.removed, changed: r.summary.changed }, { added: ['default/new'], removed: ['default/gone'], changed: ['default/web', 'default/api'] });
  t.equal(r.message, 'reloaded: 1 added, 1 removed, 2 changed, 0 unchanged');
  t.same(h.since(from), [
    'source default/gone stop release', 'source default/gone stopped',
    'source default/api stop release', 'source default/api stopped', 'create source default/api',
    'create source default/new',
    'health update default/web,default/api,default/new',
    'source default/web start', 'source default/api start', 'source default/new start',
    'dataplane apply web=10.99.0.100,api=-,new=-',
  ], 'the plan, step by step');
  t.notOk(h.since(from).some((l) => l.startsWith('source default/web stop')), 'web kept its source and its VIP');
  t.same(h.fk.dataplane.applied.at(-1)!.find((s) => s.key === 'default/web')!.healthy.map((b) => b.address), ['10.99.0.11', '10.99.0.12'], 'web forwards to its new backend');
  const doc = await controlRequest(h.socket, 'status') as StatusDocument;
  t.same([doc.config.generation, doc.config.lastReload?.ok], [2, true]);
  t.same(doc.services.map((s) => s.key), ['default/web', 'default/api', 'default/new'], 'in config order');

  const before = h.fk.journal.length;
  fs.writeFileSync(h.file, 'services: [ { name: web } ]\nunknown: 1\n');
  const bad = await h.daemon.reload();
  t.equal(bad.ok, false);
  t.match(bad.message, /reload rejected, running config kept/);
  t.same(h.since(before), [], 'a refused reload asks nothing of anyone');
  const kept = await controlRequest(h.socket, 'status') as StatusDocument;
  t.same([kept.config.generation, kept.config.lastReload?.ok, kept.services.length], [2, false, 3]);
});

t.test('a health transition hands the data path a new object for its service only (issue 47)', async (t) => {
  const h = harness(t, [{ name: 'web', backends: ['10.99.0.11', '10.99.0.12'] }, { name: 'api' }]);
  await h.daemon.start();
  h.fk.sources.get('default/web')!.bind('10.99.0.100');
  h.fk.sources.get('default/api')!.bind('10.99.0.101');
  await waitJournal(h, 'dataplane apply web=10.99.0.100,api=10.99.0.101');
  await settle(h);
  const before = h.fk.dataplane.applied.at(-1)!;
  const from = h.fk.dataplane.applied.length;
  h.fk.health.down.add('default/web 10.99.0.12');
  h.fk.health.emit('change', 'default/web', '10.99.0.12', false);
  for (let i = 0; i < 100 && h.fk.dataplane.applied.length === from; i++) await new Promise((r) => setTimeout(r, 10));
  const after = h.fk.dataplane.applied.at(-1)!;
  t.not(after, before, 'the transition was applied');
  const of = (l: readonly ForwardService[], key: string): ForwardService => l.find((s) => s.key === key)!;
  t.equal(of(after, 'default/api'), of(before, 'default/api'), 'the unchanged service keeps its object: the caches keyed by it do no work');
  t.not(of(after, 'default/web'), of(before, 'default/web'), 'the service that changed gets a new object');
  t.same(of(after, 'default/web').healthy.map((b) => b.address), ['10.99.0.11'], 'with the backend taken out');
  t.same(of(after, 'default/web').backends.map((b) => b.address), ['10.99.0.11', '10.99.0.12'], 'and every configured backend still tracked');
});

/**
 * What the daemon asks of the subsystems for one health transition among
 * `n` services, once every VIP is bound and applied and one transition
 * went before: calls to the sources'
 * status() and the checker's healthy() and status(), counted by wrapping the fakes.
 */
async function transitionWork(t: { teardown(fn: () => unknown): void }, n: number): Promise<{ sourceStatus: number; healthy: number; healthStatus: number; changed: number }> {
  const svcs: Svc[] = Array.from({ length: n }, (_, i) => ({ name: `s${i}`, ipam: 'dhcp' as const, backends: ['10.99.0.11', '10.99.0.12'] }));
  const h = harness(t, svcs);
  await h.daemon.start();
  [...h.fk.sources.values()].forEach((s, i) => s.bind(`10.98.${i >> 8}.${i & 255}`));
  await settle(h);
  // A first transition: the health file's first write reads every service once (its parts are kept after).
  h.fk.health.down.add('default/s0 10.99.0.12');
  h.fk.health.emit('change', 'default/s0', '10.99.0.12', false);
  await settle(h);
  await new Promise((r) => setTimeout(r, 150));
  const calls = { sourceStatus: 0, healthy: 0, healthStatus: 0 };
  for (const s of h.fk.sources.values()) {
    const status = s.status.bind(s);
    s.status = () => { calls.sourceStatus++; return status(); };
  }
  const health = h.fk.health;
  const healthy = health.healthy.bind(health);
  const status = health.status.bind(health);
  health.healthy = (key) => { calls.healthy++; return healthy(key); };
  health.status = (key) => { calls.healthStatus++; return status(key); };
  const before = h.fk.dataplane.applied.at(-1)!;
  const from = h.fk.dataplane.applied.length;
  const key = `default/s${n >> 1}`;
  health.down.add(`${key} 10.99.0.12`);
  health.emit('change', key, '10.99.0.12', false);
  for (let i = 0; i < 200 && h.fk.dataplane.applied.length === from; i++) await new Promise((r) => setTimeout(r, 10));
  // The health file's write (50 ms after) is part of the transition's work.
  await new Promise((r) => setTimeout(r, 150));
  const counted = { ...calls };
  const after = h.fk.dataplane.applied.at(-1)!;
  const changed = after.filter((s, i) => s !== before[i]).length;
  const moved = after.find((s) => s.key === key)!;
  if (moved.healthy.length !== 1 || after.length !== n) throw new Error(`the transition was not applied as asked: ${after.length} services, ${moved.healthy.length} healthy`);
  await h.daemon.stop();
  return { ...counted, changed };
}

t.test('a health transition among 1,000 services asks the sources and the checker what one among 10 does', async (t) => {
  const ten = await transitionWork(t, 10);
  const thousand = await transitionWork(t, 1000);
  t.equal(ten.changed, 1, 'among 10, one service object is new');
  t.equal(thousand.changed, 1, 'among 1,000, one service object is new');
  t.ok(ten.healthy >= 1, `the changed service's healthy backends are read (${ten.healthy})`);
  t.same(thousand, ten, `the same calls at 1,000 as at 10 (${JSON.stringify(thousand)})`);
});

t.test('the VIP series come from a view kept per change: a scrape asks no source, a VIP that moves or goes shows at the next', async (t) => {
  const port = await freePort();
  const n = 50;
  const svcs: Svc[] = Array.from({ length: n }, (_, i) => ({ name: `s${i}`, ipam: 'dhcp' as const }));
  const h = harness(t, svcs, { extra: { metrics: { listen: `127.0.0.1:${port}` } } });
  await h.daemon.start();
  const sources = [...h.fk.sources.values()];
  sources.forEach((s, i) => s.bind(`10.98.0.${i + 1}`));
  await settle(h);
  // Past the endpoint's reuse of its last gather, so each scrape gathers (METRICS_LIMITS.reuseMs).
  const vipLines = async (): Promise<string[]> => {
    await new Promise((r) => setTimeout(r, METRICS_LIMITS.reuseMs + 50));
    const res = await fetch(`http://127.0.0.1:${port}/metrics`);
    t.equal(res.status, 200, 'the scrape is answered');
    return (await res.text()).split('\n').filter((l) => l.startsWith('lbagent_service_vip_info{'));
  };
  const first = await vipLines();
  t.equal(first.length, n, 'one VIP series per served service');
  let calls = 0;
  for (const s of sources) {
    const status = s.status.bind(s);
    s.status = () => { calls++; return status(); };
  }
  const second = await vipLines();
  t.same(second, first, 'the same lines, in the same order, for the same state');
  t.ok(calls < n, `a scrape does not ask every source for its status (${calls} calls for ${n} services)`);
  sources[3]!.bind('10.98.1.4');
  await sources[5]!.stop({ release: true });
  const gone = await vipLines();
  t.ok(gone.includes('lbagent_service_vip_info{service="s3",namespace="default",vip="10.98.1.4",ipam="dhcp"} 1'), 'a VIP that moved shows its new address at the next scrape');
  t.notOk(gone.some((l) => l.includes('vip="10.98.0.4"')), 'and not the old one');
  t.notOk(gone.some((l) => l.includes('service="s5"')), 'a VIP withdrawn has no series at the next scrape');
  t.equal(gone.length, n - 1, 'the others keep theirs');
});

t.test('freed memory is given back once every VIP is in place, not while the sources start, and after a reload parsed in a worker (issue 18)', async (t) => {
  const h = harness(t, [{ name: 'web' }, { name: 'api' }]);
  await h.daemon.start();
  await settle(h);
  t.equal(h.trims.count, 0, 'not right after the start: the sources are taking their first steps');
  h.fk.sources.get('default/web')!.bind('10.99.0.100');
  await waitJournal(h, 'dataplane apply web=10.99.0.100,api=-');
  await settle(h);
  t.equal(h.trims.count, 0, 'not while a service still waits for its VIP');
  h.fk.sources.get('default/api')!.bind('10.99.0.101');
  await waitJournal(h, 'dataplane apply web=10.99.0.100,api=10.99.0.101');
  await settle(h);
  t.equal(h.trims.count, 1, 'once the apply put every VIP in place: the start has settled');
  h.write([{ name: 'web' }, { name: 'api' }, { name: 'new' }]);
  t.equal((await h.daemon.reload()).ok, true);
  await settle(h);
  t.equal(h.trims.count, 1, 'an accepted reload parsed inline: its garbage is young, no collection; and the start does not settle twice');
  h.write([{ name: 'web' }, { name: 'api' }, { name: 'new' }, { name: 'more' }]);
  fs.appendFileSync(h.file, '# padding\n'.repeat(Math.ceil(RELOAD_INLINE_MAX_BYTES / 10)));
  t.equal((await h.daemon.reload()).ok, true);
  await settle(h);
  t.equal(h.trims.count, 2, 'after a reload parsed in a worker thread: its memory given back');
  fs.writeFileSync(h.file, `services: [ { name: web } ]\nunknown: 1\n${'# padding\n'.repeat(Math.ceil(RELOAD_INLINE_MAX_BYTES / 10))}`);
  t.equal((await h.daemon.reload()).ok, false);
  await new Promise((r) => setImmediate(r));
  t.equal(h.trims.count, 3, 'after a refused one parsed in a worker: its parse left garbage too');
});

t.test('during the start, VIPs bound while other sources still acquire are written in one apply (issue 18)', async (t) => {
  const h = harness(t, [{ name: 'a' }, { name: 'b' }, { name: 'c' }], { startApplyBatchMs: 60_000 });
  await h.daemon.start();
  await settle(h);
  const from = h.fk.dataplane.applied.length;
  h.fk.sources.get('default/a')!.bind('10.99.0.100');
  h.fk.sources.get('default/b')!.bind('10.99.0.101');
  await settle(h);
  t.equal(h.fk.dataplane.applied.length, from, 'a and b bound, c still acquiring: no table write yet');
  h.fk.sources.get('default/c')!.bind('10.99.0.102');
  await waitJournal(h, 'dataplane apply a=10.99.0.100,b=10.99.0.101,c=10.99.0.102');
  await settle(h);
  t.same(h.since(0).filter((l) => l.startsWith('dataplane apply')).slice(-(h.fk.dataplane.applied.length - from)).map((l) => l === 'dataplane apply a=10.99.0.100,b=10.99.0.101,c=10.99.0.102'),
    Array(h.fk.dataplane.applied.length - from).fill(true), 'the last bind writes all three at once: no table with only a or b');
  t.equal(h.trims.count, 1, 'and the start settles');
});

t.test('VIPs bound in one turn of the loop make one STATUS= line, with all of them (issue 18)', async (t) => {
  const names = Array.from({ length: 20 }, (_, i) => `s${i}`);
  const h = harness(t, names.map((name) => ({ name })), { startApplyBatchMs: 60_000 });
  await h.daemon.start();
  await settle(h);
  const from = h.statuses.length;
  names.forEach((n, i) => h.fk.sources.get(`default/${n}`)!.bind(`10.99.0.${100 + i}`));
  t.equal(h.statuses.length, from, 'none sent while the turn\'s events are handled');
  await new Promise((r) => setImmediate(r));
  // One line per bind read every service's status each time: 20 lines here, 50 x 50 statuses for a 50-service start.
  t.equal(h.statuses.length, from + 1, 'one line for the 20 binds');
  t.match(h.statuses.at(-1), /^STATUS=20 VIPs served; 20 services, 20 serving, \d+ ready;/, 'counting all 20');
});

t.test('the start\'s batch waits at most startApplyBatchMs for a source that does not bind', async (t) => {
  const h = harness(t, [{ name: 'a' }, { name: 'b' }], { startApplyBatchMs: 200 });
  await h.daemon.start();
  await settle(h);
  h.fk.sources.get('default/a')!.bind('10.99.0.100');
  await waitJournal(h, 'dataplane apply a=10.99.0.100,b=-');
  t.pass('a is written while b still acquires');
});

t.test('with no VIP to wait for, the start settles at once', async (t) => {
  const h = harness(t, []);
  await h.daemon.start();
  await settle(h);
  t.equal(h.trims.count, 1, 'collected right after the start');
  t.same(h.optimizer, ['hold', 'release'], 'and the optimizing compiler is back on');
});

t.test('the optimizing compiler held for the start comes back when the start settles, after START_HOLD_MAX_MS at the latest, or on a stop (issue 18)', async (t) => {
  t.test('settled', async (t) => {
    const h = harness(t, [{ name: 'web' }]);
    await h.daemon.start();
    t.same(h.optimizer, ['hold'], 'held through the start: the source has not bound yet');
    h.fk.sources.get('default/web')!.bind('10.99.0.100');
    await waitJournal(h, 'dataplane apply web=10.99.0.100');
    await settle(h);
    t.same(h.optimizer, ['hold', 'release'], 'released once the VIP is in the table');
    h.write([{ name: 'web' }, { name: 'new' }]);
    t.equal((await h.daemon.reload()).ok, true);
    await settle(h);
    t.same(h.optimizer, ['hold', 'release'], 'a reload holds nothing');
  });
  t.test('time', async (t) => {
    const h = harness(t, [{ name: 'web' }]);
    const t0 = Date.now();
    await h.daemon.start();
    const started = Date.now();
    while (h.optimizer.length < 2 && Date.now() - t0 < START_HOLD_MAX_MS + 3000) await new Promise((r) => setTimeout(r, 20));
    t.same(h.optimizer, ['hold', 'release'], 'released with the VIP still not bound');
    t.ok(Date.now() - started >= START_HOLD_MAX_MS - 20, `not before START_HOLD_MAX_MS after "started" (${Date.now() - started} ms)`);
  });
  t.test('stop', async (t) => {
    const h = harness(t, [{ name: 'web' }]);
    await h.daemon.start();
    await h.daemon.stop();
    t.same(h.optimizer, ['hold', 'release'], 'a stop releases it');
  });
  t.test('a start that fails', async (t) => {
    const h = harness(t, [{ name: 'web' }], { fail: { build: new Error('no netlink') } });
    await t.rejects(h.daemon.start());
    t.same(h.optimizer, ['hold', 'release'], 'released by the failed start\'s stop');
    const bad = harness(t, [{ name: 'web' }]);
    fs.writeFileSync(bad.file, 'services: [ { name: web } ]\nunknown: 1\n');
    await t.rejects(bad.daemon.start(), /invalid configuration/);
    t.same(bad.optimizer, ['hold', 'release'], 'and by a start refused before it took anything (an invalid config)');
  });
});

t.test('overlapping reloads fold into one more reload of the newest file', async (t) => {
  const h = harness(t, [{ name: 'web' }, { name: 'gone' }]);
  await h.daemon.start();
  const gate = new Gate();
  h.fk.sources.get('default/gone')!.stopGate = gate;
  h.write([{ name: 'web' }]);
  const first = h.daemon.reload();
  // The first reload is now releasing default/gone. Two more requests arrive, the file changes again.
  await waitJournal(h, 'source default/gone stop release');
  h.write([{ name: 'web' }, { name: 'new' }]);
  const second = h.daemon.reload();
  const third = h.daemon.reload();
  t.equal(second, third, 'the requests that arrived during the reload share one promise');
  gate.open();
  const [r1, r2, r3] = await Promise.all([first, second, third]);
  t.match(r1, { ok: true, summary: { removed: ['default/gone'], added: [] } });
  t.match(r2, { ok: true, summary: { removed: [], added: ['default/new'] } }, 'the folded reload read the newest file');
  t.equal(r3, r2);
  t.equal(h.fk.journal.filter((l) => l === 'create source default/new').length, 1, 'one more reload, not two');
  const doc = await controlRequest(h.socket, 'status') as StatusDocument;
  t.equal(doc.config.generation, 3, 'two reloads applied (1 + 2)');
});

t.test('stop: in the reverse order of start, and the lock and socket go', async (t) => {
  const port = await freePort();
  const h = harness(t, TWO, { extra: { metrics: { listen: `127.0.0.1:${port}` } } });
  await h.daemon.start();
  h.fk.sources.get('default/web')!.bind('10.99.0.100');
  await waitJournal(h, 'dataplane apply web=10.99.0.100,api=-');
  await settle(h);
  t.equal(await portOpen(port), true, 'metrics listening');
  let socketAtDataplaneStop: boolean | undefined;
  let metricsAtClose: boolean | undefined;
  h.fk.dataplane.onStop = () => { socketAtDataplaneStop = fs.existsSync(h.socket); };
  h.fk.onClose = async () => { metricsAtClose = await portOpen(port); };
  const from = h.fk.journal.length;
  await h.daemon.stop();
  t.same(h.since(from), [
    'dataplane stop',
    'source default/web stop', 'source default/web stopped', 'source default/api stop', 'source default/api stopped',
    'health stop', 'close',
  ], 'forwarding is withdrawn, then the VIPs (leases kept: no release), then health and the subsystems');
  t.equal(socketAtDataplaneStop, false, 'the control socket went first');
  t.equal(metricsAtClose, true, 'the metrics endpoint (started first) was still up when the subsystems closed');
  t.equal(await portOpen(port), false, 'and is closed at the end');
  t.notOk(fs.existsSync(path.join(h.dir, 'state', 'lb-agent.lock')), 'the lock is released');
  t.same(h.notified, ['READY=1', 'STOPPING=1']);
  const again = h.fk.journal.length;
  await h.daemon.stop();
  t.same(h.since(again), [], 'a second stop does nothing');
});

t.test('stop with keep (a planned restart) leaves the VIPs and forwarding for the next process', async (t) => {
  const h = harness(t, TWO);
  await h.daemon.start();
  const from = h.fk.journal.length;
  await h.daemon.stop({ keep: true });
  t.same(h.since(from).sort(), [
    'close', 'dataplane stop keep', 'health stop',
    'source default/api stop keep', 'source default/api stopped', 'source default/web stop keep', 'source default/web stopped',
  ]);
  t.ok(h.since(from).indexOf('dataplane stop keep') > h.since(from).indexOf('source default/web stopped'), 'the sources let go of their sockets before the data path');
});

t.test('a reload removes its services together, and adds only after every removal is done', async (t) => {
  const h = harness(t, [{ name: 'web' }, { name: 'a' }, { name: 'b' }, { name: 'c' }]);
  await h.daemon.start();
  await settle(h);
  const gates = ['a', 'b', 'c'].map((n) => { const g = new Gate(); h.fk.sources.get(`default/${n}`)!.stopGate = g; return g; });
  const from = h.fk.journal.length;
  h.write([{ name: 'web' }, { name: 'new' }]);
  const reload = h.daemon.reload();
  // Were they one after another, the first release would hold the rest (and the teardown's stop) for good.
  const opened = setTimeout(() => { for (const g of gates) g.open(); }, 5000);
  t.teardown(() => clearTimeout(opened));
  for (const n of ['a', 'b', 'c']) await waitJournal(h, `source default/${n} stop release`);
  t.notOk(h.since(from).some((l) => l.endsWith(' stopped')), 'all three releases under way at once, none finished');
  gates[1]!.open();
  gates[0]!.open();
  await waitJournal(h, 'source default/a stopped');
  await settle(h);
  t.notOk(h.fk.journal.includes('create source default/new'), 'the add waits for the last removal');
  gates[2]!.open();
  const r = await reload;
  t.equal(r.ok, true, r.message);
  const after = h.since(from);
  t.ok(after.indexOf('create source default/new') > after.indexOf('source default/c stopped'), 'then the add');
  t.equal(r.message, 'reloaded: 1 added, 3 removed, 0 changed, 1 unchanged');
});

t.test('a VIP that comes onto this node under VRRP: the data path is told, with the ports of every service on it; not for a VIP an earlier run left here, nor without VRRP', async (t) => {
  const h = harness(t, [{ name: 'web', ipam: 'dhcp' }, { name: 'api', loadBalancerIP: '10.99.0.205' }, { name: 'admin', primaryService: 'api' }, { name: 'kept', loadBalancerIP: '10.99.0.206' }], { vrrp: true });
  const fo = h.fk.failover!;
  h.fk.held.set('default/kept', '10.99.0.206');
  for (const k of ['default/web', 'default/api', 'default/kept']) fo.masterOf.add(k);
  await h.daemon.start();
  h.fk.sources.get('default/web')!.bind('10.99.0.100');
  h.fk.sources.get('default/api')!.bind('10.99.0.205');
  h.fk.sources.get('default/kept')!.bind('10.99.0.206');
  t.same(h.fk.dataplane.arrived, ['10.99.0.100 80/TCP', '10.99.0.205 80/TCP,8081/TCP'],
    'web\'s lease and api\'s claim with its secondary\'s port; not kept, confirmed where the last run left it');
  // Lost and back (a VRRP Backup and Master again): it arrives again.
  await h.fk.sources.get('default/kept')!.stop({ release: false });
  h.fk.sources.get('default/kept')!.bind('10.99.0.206');
  t.same(h.fk.dataplane.arrived.at(-1), '10.99.0.206 80/TCP', 'kept, once it had gone and came back');

  const plain = harness(t, [{ name: 'web', ipam: 'dhcp' }]);
  await plain.daemon.start();
  plain.fk.sources.get('default/web')!.bind('10.99.0.100');
  t.same(plain.fk.dataplane.arrived, [], 'without VRRP a VIP never was on another node: no sweep (each walks the conntrack table)');
});

t.test('stop waits for the step of a reload in flight, and the reload goes no further', async (t) => {
  const h = harness(t, [{ name: 'web' }, { name: 'gone' }]);
  await h.daemon.start();
  const gate = new Gate();
  h.fk.sources.get('default/gone')!.stopGate = gate;
  h.write([{ name: 'web' }, { name: 'new' }]);
  const reload = h.daemon.reload();
  await waitJournal(h, 'source default/gone stop release');
  const from = h.fk.journal.length;
  let stopped = false;
  const stop = h.daemon.stop().then(() => { stopped = true; });
  await settle(h);
  t.same(h.since(from), [], 'nothing is withdrawn while the reload is releasing default/gone');
  t.equal(stopped, false);
  gate.open();
  await stop;
  await reload;
  const after = h.since(from);
  t.equal(after[0], 'source default/gone stopped', 'the step in flight finished first');
  t.ok(after.indexOf('dataplane stop') > 0, 'then the stop withdrew forwarding');
  t.notOk(h.fk.journal.includes('create source default/new'), "the reload's next step (add default/new) never ran");
});

async function waitJournal(h: Harness, line: string): Promise<void> {
  for (let i = 0; i < 1000 && !h.fk.journal.includes(line); i++) await new Promise((r) => setTimeout(r, 10));
  if (!h.fk.journal.includes(line)) throw new Error(`journal never had ${JSON.stringify(line)}: ${JSON.stringify(h.fk.journal)}`);
}

t.test('VRRP takeover of an armed VIP: the address goes on without waiting for the apply the election scheduled', async (t) => {
  const h = harness(t, [{ name: 'api', ipam: 'pool', loadBalancerIP: '10.99.0.200' }], { vrrp: true });
  const fo = h.fk.failover!;
  fo.vips.set('default/api', '10.99.0.200');
  await h.daemon.start();
  await settle(h);
  const api = h.fk.sources.get('default/api')!;
  t.equal(api.status().state, 'idle', 'Backup: the source stands by');
  t.match(h.fk.dataplane.applied.at(-1)?.find((s) => s.key === 'default/api')?.vip, '10.99.0.200', 'and the VIP\'s rules are armed');

  // The election: this node is Master. The daemon schedules an apply (the
  // same table); a slow one (an nft counter read ahead of it in the data
  // path's queue) must not hold the address back.
  h.fk.dataplane.applyGate = new Gate();
  const from = h.fk.journal.length;
  fo.set('default/api', true);
  for (let i = 0; i < 50 && !h.since(from).includes('source default/api start'); i++) await new Promise((r) => setTimeout(r, 10));
  t.ok(h.since(from).includes('source default/api start'), `the source started while the apply was still under way (${h.since(from).join('; ')})`);
  h.fk.dataplane.applyGate.open();
  h.fk.dataplane.applyGate = undefined;
  await settle(h);

  // Back to Backup, then a VIP the rules do not cover yet (the known
  // address changed): now the takeover waits for the apply that arms it.
  fo.set('default/api', false);
  await settle(h);
  fo.vips.set('default/api', '10.99.0.201');
  h.fk.dataplane.applyGate = new Gate();
  const from2 = h.fk.journal.length;
  fo.set('default/api', true);
  await new Promise((r) => setTimeout(r, 200));
  t.notOk(h.since(from2).includes('source default/api start'), 'an unarmed VIP: no address before its rules');
  h.fk.dataplane.applyGate.open();
  h.fk.dataplane.applyGate = undefined;
  await settle(h);
  const j = h.since(from2);
  t.ok(j.indexOf('source default/api start') > j.findIndex((l) => l.startsWith('dataplane apply') && l.includes('api=10.99.0.201')), `rules for 10.99.0.201 first, then the source (${j.join('; ')})`);
});

t.test('status calls a service ready only once the rules that forward it are applied', async (t) => {
  const h = harness(t, TWO);
  await h.daemon.start();
  h.fk.dataplane.applyGate = new Gate();
  h.fk.sources.get('default/api')!.bind('10.99.0.200');
  await waitJournal(h, 'dataplane apply web=-,api=10.99.0.200');
  const during = await controlRequest(h.socket, 'status') as StatusDocument;
  t.match(during.services[1], { key: 'default/api', vip: '10.99.0.200', state: 'serving', ready: false, reason: /being put in place/ }, 'the apply is under way: not ready yet');
  t.equal(during.ready, false, 'nor is the agent');
  t.match(h.statuses.at(-1), /1 VIP served; 2 services, 1 serving, 0 ready;/, 'systemd\'s STATUS= says so');
  h.fk.dataplane.applyGate.open();
  h.fk.dataplane.applyGate = undefined;
  await settle(h);
  const after = await controlRequest(h.socket, 'status') as StatusDocument;
  t.match(after.services[1], { key: 'default/api', state: 'serving', ready: true, reason: undefined }, 'applied: ready');
  t.match(h.statuses.at(-1), /1 VIP served; 2 services, 1 serving, 1 ready;/, 'and STATUS= follows the applied table');
});

t.test('the interruption label comes from the source\'s cause, not from its wording', async (t) => {
  const { interruptionKind, INTERRUPTION_KINDS } = await import('../../agent/daemon/daemon');
  for (const k of INTERRUPTION_KINDS) t.equal(interruptionKind(k === 'other' ? 'other' : k), k);
  t.equal(interruptionKind('stopped'), 'other', 'the agent\'s own withdrawals are not interruptions (never counted), and have no label of their own');
  t.equal(interruptionKind('released'), 'other');
});

t.test('status is built once per change: a thousand requests without one share a build, each kind of change is at the next request', async (t) => {
  const h = harness(t, [{ name: 'web', ipam: 'pool', backends: ['10.99.0.11', '10.99.0.12'] }, { name: 'api', ipam: 'dhcp' }]);
  await h.daemon.start();
  h.fk.sources.get('default/web')!.bind('10.99.0.200');
  await waitJournal(h, 'dataplane apply web=10.99.0.200,api=-');
  await settle(h);
  let builds = 0;
  const build = h.daemon.statusDocument.bind(h.daemon);
  h.daemon.statusDocument = () => { builds++; return build(); };
  const status = (): Promise<StatusDocument> => controlRequest(h.socket, 'status') as Promise<StatusDocument>;
  const rawStatus = (): Promise<string> => new Promise((resolve, reject) => {
    const c = net.createConnection(h.socket, () => c.write('{"op":"status"}\n'));
    let text = '';
    c.setEncoding('utf8');
    c.on('data', (d: string) => { text += d; });
    c.on('end', () => resolve(text));
    c.on('error', reject);
  });

  const began = Date.now();
  const texts = new Set<string>();
  for (let i = 0; i < 1000; i++) texts.add(await rawStatus());
  const took = Date.now() - began;
  // The readings (last probes) are re-read once they are STATUS_READINGS_MS
  // old: a machine so loaded that the thousand took longer may build once
  // more for each such interval, and for nothing else.
  const allowed = 1 + Math.floor(took / STATUS_READINGS_MS);
  t.ok(builds >= 1 && builds <= allowed, `a thousand requests back to back, no change: ${builds} build(s) in ${took} ms (one, or one per ${STATUS_READINGS_MS} ms)`);
  if (took < STATUS_READINGS_MS) t.equal(builds, 1, 'one build');
  t.equal(texts.size, builds, 'the same text for every request served one build');

  const web = (d: StatusDocument): StatusDocument['services'][number] => d.services.find((s) => s.key === 'default/web')!;
  const api = (d: StatusDocument): StatusDocument['services'][number] => d.services.find((s) => s.key === 'default/api')!;
  const changes: { what: string; make: () => Promise<void> | void; shows: (d: StatusDocument) => boolean }[] = [
    {
      what: 'a health transition',
      make: () => { h.fk.health.down.add('default/web 10.99.0.12'); h.fk.health.emit('change', 'default/web', '10.99.0.12', false); },
      shows: (d) => web(d).healthyBackends === 1 && d.events.at(-1)?.kind === 'backend-down',
    },
    {
      what: 'a first verdict (no transition)',
      make: () => { h.fk.health.down.add('default/web 10.99.0.11'); h.fk.health.emit('verdict', 'default/web', '10.99.0.11', 'down'); },
      shows: (d) => web(d).healthyBackends === 0,
    },
    {
      what: 'a VIP gained (ownership)',
      make: () => { h.fk.sources.get('default/api')!.bind('10.99.0.201'); },
      shows: (d) => api(d).vip === '10.99.0.201',
    },
    {
      what: 'a source\'s step with no VIP event (a renewal)',
      make: () => { h.fk.sources.get('default/api')!.step({ renewAt: 'soon' }); },
      shows: (d) => api(d).source?.renewAt === 'soon',
    },
    {
      what: 'a reload',
      make: async () => { h.write([{ name: 'web', ipam: 'pool', backends: ['10.99.0.11', '10.99.0.12'] }, { name: 'api', ipam: 'dhcp', backends: ['10.99.0.13'] }]); await h.daemon.reload(); },
      shows: (d) => d.config.generation === 2 && api(d).backends.length === 1 && api(d).backends[0]!.address === '10.99.0.13',
    },
  ];
  for (const c of changes) {
    await settle(h);
    const before = builds;
    await c.make();
    await settle(h);
    const d = await status();
    t.ok(c.shows(d), `${c.what}: shown at the next request`);
    t.equal(builds, before + 1, `${c.what}: built again, once`);
    for (let i = 0; i < 20; i++) await status();
    t.equal(builds, before + 1, `${c.what}: then kept`);
  }
});
