// The node labels file (config/labels.ts): the downward API's key="value"
// lines and plain key=value, the node's zone and region from the config or
// the file, and what is reported when the file says nothing useful.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { MAX_LABELS_BYTES, parseLabels, readLabelsFile, readNodeTopology, resolveNodeTopology } from '../../agent/config/labels';

// As the Kubernetes downward API writes metadata.labels (Go %q values, sorted keys).
const DOWNWARD = `beta.kubernetes.io/arch="amd64"
kubernetes.io/hostname="worker-1"
node.kubernetes.io/instance-type="rke2"
topology.kubernetes.io/region="us-east-1"
topology.kubernetes.io/zone="us-east-1a"`;

t.test('parses the downward API format and plain key=value, with comments and blanks', async (t) => {
  const p = parseLabels(DOWNWARD);
  t.same(p.problems, []);
  t.equal(p.labels.get('topology.kubernetes.io/zone'), 'us-east-1a');
  t.equal(p.labels.get('kubernetes.io/hostname'), 'worker-1');
  const q = parseLabels('# written by hand\n\n  topology.kubernetes.io/zone = zone-b  \ntopology.kubernetes.io/region=eu\n');
  t.same(q.problems, []);
  t.same([...q.labels], [['topology.kubernetes.io/zone', 'zone-b'], ['topology.kubernetes.io/region', 'eu']]);
  t.equal(parseLabels('a/b=""').labels.get('a/b'), '', 'an empty label value is valid');
});

t.test('bad lines are skipped and reported with their line number', async (t) => {
  const p = parseLabels('topology.kubernetes.io/zone="z"\njunk line\nUPPER_Prefix.io/x=1\nk="unterminated\nk2=has space\nk3="a\\"b"');
  t.equal(p.labels.get('topology.kubernetes.io/zone'), 'z', 'the good line still counts');
  t.same(p.problems.map((x) => x.line), [2, 3, 4, 5, 6]);
  t.match(p.problems[0]!.message, /not key=value/);
  t.match(p.problems[1]!.message, /not a label key/);
  t.match(p.problems[2]!.message, /not a label value/);
});

t.test('the config wins; the file fills what the config leaves unset', async (t) => {
  const node = { zone: undefined, region: undefined, labelsFile: '/x/labels' };
  const fromFile = resolveNodeTopology(node, { text: DOWNWARD });
  t.same(fromFile, { zone: 'us-east-1a', region: 'us-east-1', zoneFrom: 'labels-file', regionFrom: 'labels-file', labelsFile: '/x/labels', problem: undefined });
  const mixed = resolveNodeTopology({ ...node, zone: 'mine' }, { text: DOWNWARD });
  t.same([mixed.zone, mixed.zoneFrom, mixed.region, mixed.regionFrom], ['mine', 'config', 'us-east-1', 'labels-file']);
  const both = resolveNodeTopology({ ...node, zone: 'z', region: 'r' }, undefined);
  t.same([both.zone, both.region, both.labelsFile, both.problem], ['z', 'r', undefined, undefined], 'the file is not consulted at all');
});

t.test('the pre-1.17 failure-domain labels are read when the topology ones are absent', async (t) => {
  const r = resolveNodeTopology({ zone: undefined, region: undefined, labelsFile: '/l' }, { text: 'failure-domain.beta.kubernetes.io/zone=old-a\n' });
  t.equal(r.zone, 'old-a');
});

t.test('unknown zone: missing file, unreadable file, no zone label - each says why', async (t) => {
  const node = { zone: undefined, region: undefined, labelsFile: '/etc/lb-agent/node-labels' };
  t.same([resolveNodeTopology(node, { missing: true }).zoneFrom, resolveNodeTopology(node, { missing: true }).problem], ['unknown', '/etc/lb-agent/node-labels does not exist']);
  t.match(resolveNodeTopology(node, { error: 'EACCES: permission denied' }).problem, /EACCES/);
  t.match(resolveNodeTopology(node, { text: 'kubernetes.io/hostname=a\n' }).problem, /has no topology.kubernetes.io\/zone label/);
  t.equal(resolveNodeTopology({ ...node, zone: 'z' }, { missing: true }).problem, undefined, 'a missing file does not matter once the zone is configured');
});

t.test('readLabelsFile / readNodeTopology read the real file, bounded', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-labels-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'node-labels');
  fs.writeFileSync(file, DOWNWARD);
  const topo = await readNodeTopology({ zone: undefined, region: undefined, labelsFile: file });
  t.same([topo.zone, topo.region], ['us-east-1a', 'us-east-1']);
  t.same(await readLabelsFile(path.join(dir, 'absent')), { missing: true });
  t.same(await readLabelsFile(dir), { error: 'not a regular file' });
  fs.writeFileSync(file, 'x'.repeat(MAX_LABELS_BYTES + 1));
  t.match(await readLabelsFile(file), { error: /larger than/ });
});
