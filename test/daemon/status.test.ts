// A service's state, reason and readiness (agent/daemon/status.ts
// serviceVerdict) from what was observed: each branch, in the order a user
// would want them told apart.
import t from 'tap';
import { serviceReady, serviceVerdict, startingStatus, portsText, statsProblemOf, type VerdictInput } from '../../agent/daemon/status';
import type { ServiceSpec } from '../../agent/config/types';

const spec = {
  key: 'default/web', name: 'web', namespace: 'default', ipam: 'pool', primaryService: undefined,
  ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
  backends: [{ address: '10.99.0.11', weight: 1 }],
} as unknown as ServiceSpec;
const base: VerdictInput = {
  spec, holds: true, failover: undefined, vip: '10.99.0.200', src: undefined, healthyCount: 1,
  topology: { set: 'all', reason: 'any', detail: '', backends: [] } as unknown as VerdictInput['topology'], applied: true, damage: undefined,
};

t.test('each verdict', async (t) => {
  t.same(serviceVerdict(base), { state: 'serving', reason: undefined, ready: true });
  t.same(serviceVerdict({ ...base, holds: false, failover: { master: '10.99.0.3' } }), { state: 'backup', ready: true, reason: 'VIP held by the VRRP Master 10.99.0.3' });
  t.match(serviceVerdict({ ...base, holds: false, failover: { handoverUntil: 'soon' } }).reason, /by preemption/);
  t.same(serviceVerdict({ ...base, vip: undefined, src: { state: 'acquiring', reason: 'DISCOVER sent', vip: undefined, ifname: undefined, mac: undefined, details: {} } }), { state: 'acquiring', ready: false, reason: 'DISCOVER sent' });
  t.same(serviceVerdict({ ...base, vip: undefined }), { state: 'pending', ready: false, reason: 'no VIP yet' });
  t.same(serviceVerdict({ ...base, damage: 'table ip lb_agent: deleted by nft (pid 7)' }), { state: 'repairing', ready: false, reason: 'table ip lb_agent: deleted by nft (pid 7)' }, 'not serving while the kernel lacks it');
  t.same(serviceVerdict({ ...base, spec: { ...spec, backends: [] } }), { state: 'serving', ready: false, reason: 'no backends configured' });
  t.same(serviceVerdict({ ...base, healthyCount: 0 }), { state: 'serving', ready: false, reason: 'no healthy backend: new connections are refused' });
  t.same(serviceVerdict({ ...base, topology: { ...base.topology, set: 'none', detail: 'no backend in zone a' } }), { state: 'serving', ready: false, reason: 'no backend in zone a' });
  t.same(serviceVerdict({ ...base, applied: false }), { state: 'serving', ready: false, reason: 'forwarding to the healthy backends is being put in place' });
});

t.test('readiness alone is the verdict\'s readiness, over every combination, reading no more than it needs', async (t) => {
  let cases = 0;
  for (let bits = 0; bits < 128; bits++) {
    const on = (k: number): boolean => (bits & (1 << k)) !== 0;
    const i: VerdictInput = {
      ...base, holds: on(0), vip: on(1) ? '10.99.0.200' : undefined, damage: on(2) ? 'address deleted' : undefined,
      spec: on(3) ? spec : { ...spec, backends: [] }, healthyCount: on(4) ? 2 : 0,
      topology: { ...base.topology, set: on(5) ? 'none' : 'all' }, applied: on(6),
    };
    const read: string[] = [];
    const r = (name: string, v: unknown): unknown => { read.push(name); return v; };
    const ready = serviceReady({
      holds: () => r('holds', i.holds) as boolean, hasVip: () => r('vip', i.vip !== undefined) as boolean, damaged: () => r('damage', i.damage !== undefined) as boolean,
      backends: () => r('backends', i.spec.backends.length) as number, healthyCount: () => r('healthy', i.healthyCount) as number,
      topologyNone: () => r('topology', i.topology.set === 'none') as boolean, applied: () => r('applied', i.applied) as boolean,
    });
    if (ready !== serviceVerdict(i).ready) t.fail(`bits ${bits.toString(2)}: ready ${ready}, the verdict says ${serviceVerdict(i).ready}`);
    if (read.includes('topology') && i.healthyCount === 0) t.fail(`bits ${bits.toString(2)}: the topology was read without a healthy backend`);
    if (!i.holds && read.length !== 1) t.fail(`bits ${bits.toString(2)}: a backup read ${read.join(', ')}`);
    cases++;
  }
  t.equal(cases, 128, 'every combination of the seven inputs agrees');
});

t.test('before the first reconcile, and the ports as status shows them', async (t) => {
  const s = startingStatus(spec, 'the agent is starting', 5);
  t.equal(s.state, 'starting');
  t.equal(s.ready, false);
  t.equal(s.startedAt, 5);
  t.same(portsText(spec), ['80/TCP->8080']);
});

t.test('dataplane.statsProblem: the data path\'s problem while its stats reads fail, absent otherwise', async (t) => {
  const dp = { kind: 'kernel' as const, reason: 'auto', apply: async () => undefined, stop: async () => undefined };
  t.same(statsProblemOf(dp), {}, 'a data path that reports none');
  let problem: string | undefined;
  const failing = { ...dp, statsProblem: () => problem };
  t.same(statsProblemOf(failing), {}, 'reads work');
  problem = 'the forwarding stats for /metrics could not be read 2 time(s) in a row';
  t.same(statsProblemOf(failing), { statsProblem: problem });
});
