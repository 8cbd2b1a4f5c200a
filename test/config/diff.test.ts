// Reload diff: what changed (the refusals are the reconciler's: test/daemon/reconciler.test.ts).
import t from 'tap';
import { parseConfigText } from '../../agent/config/load';
import { diffConfigs, SpecFingerprints } from '../../agent/config/diff';
import type { Desired } from '../../agent/config/types';

function cfg(text: string): Desired {
  const r = parseConfigText(text, 'h');
  if (!r.ok) throw new Error(JSON.stringify(r.errors));
  return r.config;
}

const base = `pools: { range-global: 10.0.0.10-10.0.0.20 }
services:
  - { name: a, ipam: dhcp, ports: [{ port: 80 }], backends: [10.0.0.1] }
  - { name: b, ports: [{ port: 80 }], backends: [10.0.0.2] }
  - { name: c, ports: [{ port: 80 }], backends: [10.0.0.3] }
`;

t.test('added, removed, changed, unchanged', async (t) => {
  const next = `pools: { range-global: 10.0.0.10-10.0.0.20 }
services:
  - { name: a, ipam: dhcp, ports: [{ port: 80 }], backends: [10.0.0.1] }
  - { name: b, ports: [{ port: 80 }], backends: [10.0.0.2, 10.0.0.4] }
  - { name: d, ports: [{ port: 80 }], backends: [10.0.0.3] }
`;
  const d = diffConfigs(cfg(base), cfg(next));
  t.same(d.added.map((s) => s.key), ['default/d']);
  t.same(d.removed.map((s) => s.key), ['default/c']);
  t.same(d.changed.map(([, n]) => n.key), ['default/b']);
  t.same(d.unchanged.map((s) => s.key), ['default/a']);
  t.same(d.globals, []);
});

t.test('identical configs diff to nothing', async (t) => {
  const d = diffConfigs(cfg(base), cfg(base));
  t.equal(d.added.length + d.removed.length + d.changed.length, 0);
  t.equal(d.unchanged.length, 3);
});

t.test('issue 17: the backend section is a global of its own', async (t) => {
  t.same(diffConfigs(cfg(base), cfg(`backend: { vips: [10.0.0.99] }\n${base}`)).globals, ['backend']);
});

t.test('SpecFingerprints: one text per spec object, and no change of any field kind goes unseen', async (t) => {
  const one = (svc: string): Desired => cfg(`pools: { range-global: 10.0.0.10-10.0.0.20 }\nservices:\n  - ${svc}\n`);
  const plain = '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }] }';
  const fp = new SpecFingerprints();
  const a = one(plain);
  const b = one(plain);
  t.not(a.services[0], b.services[0], 'two parses: two objects');
  t.equal(diffConfigs(a, b, (x, y) => fp.same(x, y)).unchanged.length, 1, 'the same text: unchanged');
  t.equal(fp.made, 2);
  diffConfigs(a, b, (x, y) => fp.same(x, y));
  t.equal(fp.made, 2, 'a spec\'s text is made once');
  const reordered = one('{ backends: [10.0.0.1, { weight: 2, address: 10.0.0.2 }], ports: [{ targetPort: 8080, port: 80 }], name: web }');
  t.equal(diffConfigs(a, reordered, (x, y) => fp.same(x, y)).unchanged.length, 1, 'keys written in another order: still unchanged');
  // Every kind of field: a string, a number, a boolean-like choice, an array element, a nested object, one added and one left out.
  const variants = [
    '{ name: web, ports: [{ port: 80, targetPort: 8081 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }] }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 3 }] }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.3, { address: 10.0.0.2, weight: 2 }] }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1] }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080, protocol: UDP }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }] }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }], healthCheck: { periodSeconds: 2 } }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }], healthCheck: { enabled: false } }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }], loadBalancerIP: 10.0.0.15 }',
    '{ name: web, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1, { address: 10.0.0.2, weight: 2 }], topology: prefer-zone }',
  ];
  for (const v of variants) {
    const d = diffConfigs(a, one(v), (x, y) => fp.same(x, y));
    t.equal(d.changed.length, 1, `changed: ${v}`);
    t.same(d.changed.length, diffConfigs(a, one(v)).changed.length, 'as the deep comparison says');
  }
});
