// Zone-aware balancing, the pure choice (forward/topology.ts): which backends
// a service uses under any / prefer-zone / zone-only, from the healthy ones
// and the node's zone, and the reason status and metrics show.
import t from 'tap';
import type { BackendSpec, TopologyPolicy } from '../../agent/config/types';
import { parseIPv4 } from '../../agent/address';
import { TOPOLOGY_REASONS, selectBackends } from '../../agent/forward/topology';

const b = (address: string, zone?: string, weight = 1): BackendSpec => ({ address, addressNum: parseIPv4(address)!, weight, ...(zone ? { zone } : {}) });
const a1 = b('10.0.0.11', 'zone-a');
const a2 = b('10.0.0.12', 'zone-a', 3);
const b1 = b('10.0.0.21', 'zone-b', 2);
const nz = b('10.0.0.31');
const addrs = (bs: readonly BackendSpec[]): string[] => bs.map((x) => x.address);

t.test('any: every healthy backend, zones ignored', async (t) => {
  const s = selectBackends('any', 'zone-a', [a1, b1, nz]);
  t.same([s.set, s.reason, addrs(s.backends)], ['all', 'policy-any', [a1.address, b1.address, nz.address]]);
  t.same([selectBackends('any', undefined, []).set, selectBackends('any', undefined, []).reason], ['none', 'no-healthy-backend']);
});

t.test('prefer-zone: the healthy backends of the node\'s zone, with their weights', async (t) => {
  const s = selectBackends('prefer-zone', 'zone-a', [a1, a2, b1, nz]);
  t.same([s.set, s.reason], ['zone', 'zone-healthy']);
  t.same(s.backends, [a1, a2], 'weights carried unchanged: they keep their meaning inside the set');
  t.match(s.detail, /2 healthy backend\(s\) in zone zone-a/);
});

t.test('prefer-zone spills to every healthy backend only when none in the zone is healthy, and comes back', async (t) => {
  const spill = selectBackends('prefer-zone', 'zone-a', [b1, nz]);
  t.same([spill.set, spill.reason, addrs(spill.backends)], ['all', 'zone-unhealthy-spill', [b1.address, nz.address]]);
  t.match(spill.detail, /no healthy backend in zone zone-a; spilling to 2/);
  const back = selectBackends('prefer-zone', 'zone-a', [a2, b1, nz]);
  t.same([back.set, addrs(back.backends)], ['zone', [a2.address]], 'one healthy backend back in the zone takes it all again');
  t.same(selectBackends('prefer-zone', 'zone-a', []).reason, 'no-healthy-backend');
});

t.test('zone-only refuses instead of spilling', async (t) => {
  const s = selectBackends('zone-only', 'zone-a', [b1, nz]);
  t.same([s.set, s.reason, s.backends], ['none', 'zone-unhealthy-refuse', []]);
  t.match(s.detail, /refused/);
  t.same(addrs(selectBackends('zone-only', 'zone-a', [a1, b1]).backends), [a1.address]);
});

t.test('an unknown node zone: prefer-zone uses everything, zone-only refuses', async (t) => {
  t.same(selectBackends('prefer-zone', undefined, [a1, b1]).reason, 'zone-unknown-spill');
  t.same(addrs(selectBackends('prefer-zone', undefined, [a1, b1]).backends), [a1.address, b1.address]);
  const only = selectBackends('zone-only', undefined, [a1, b1]);
  t.same([only.set, only.reason], ['none', 'zone-unknown-refuse']);
});

t.test('a backend without a zone is never local, even to a node without one', async (t) => {
  t.same(selectBackends('zone-only', 'zone-a', [nz]).set, 'none');
});

t.test('every reason the function returns is in the bounded list (metric label)', async (t) => {
  const seen = new Set<string>();
  const sets = [[], [a1], [b1], [a1, b1], [nz]];
  for (const policy of ['any', 'prefer-zone', 'zone-only'] as TopologyPolicy[]) {
    for (const zone of ['zone-a', undefined]) for (const h of sets) seen.add(selectBackends(policy, zone, h).reason);
  }
  t.same([...seen].sort(), [...TOPOLOGY_REASONS].sort());
});
