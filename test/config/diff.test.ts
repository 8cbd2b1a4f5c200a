// Reload diff: what changed (the refusals are the reconciler's: test/daemon/reconciler.test.ts).
import t from 'tap';
import { parseConfigText } from '../../agent/config/load';
import { diffConfigs } from '../../agent/config/diff';
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
