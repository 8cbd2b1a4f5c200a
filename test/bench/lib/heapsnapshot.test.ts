// The heap snapshot summary (bench/lib/heapsnapshot.ts) over a snapshot
// small enough to work out by hand: dominators, retained sizes, classes
// counted once, what one class's instances hold alone, weak edges ignored.
import t from 'tap';
import { renderHeapSummary, summariseHeap, type HeapSnapshotJson } from '../../../bench/lib/heapsnapshot';

// root -> Holder -> Part b -> "text"; Holder -> Part c -> the same "text";
// root -> Other, which holds Part b weakly; root -> Part z (a Part under no Part).
const NODE_TYPES = ['hidden', 'array', 'string', 'object', 'code', 'closure', 'regexp', 'number', 'native', 'synthetic', 'concatenated string', 'sliced string', 'symbol', 'bigint', 'object shape'];
const EDGE_TYPES = ['context', 'element', 'property', 'internal', 'hidden', 'shortcut', 'weak'];
const strings = ['', '(root)', 'Holder', 'Part', 'text', 'Other', 'holder', 'b', 'c', 'other', 'weakPart', 'z', 'inner'];
// type, name, id, self_size, edge_count
const nodes = [
  9, 1, 1, 0, 3, // 0 root
  3, 2, 3, 10, 2, // 1 Holder
  3, 3, 5, 20, 1, // 2 Part b
  3, 3, 7, 30, 2, // 3 Part c
  2, 4, 9, 40, 0, // 4 "text"
  3, 5, 11, 5, 1, // 5 Other
  3, 3, 13, 7, 0, // 6 Part, under Part c
];
const F = 5;
// type, name_or_index, to_node (a node's index times the node field count)
const edges = [
  2, 6, 1 * F, 2, 9, 5 * F, 2, 11, 6 * F, // root: holder, other, z (z is Part c's inner too)
  2, 7, 2 * F, 2, 8, 3 * F, // Holder: b, c
  2, 4, 4 * F, // Part b: text
  2, 4, 4 * F, 2, 12, 6 * F, // Part c: text, inner
  6, 10, 2 * F, // Other: weakPart (weak)
];
const snap: HeapSnapshotJson = {
  snapshot: { meta: { node_fields: ['type', 'name', 'id', 'self_size', 'edge_count'], node_types: [NODE_TYPES], edge_fields: ['type', 'name_or_index', 'to_node'], edge_types: [EDGE_TYPES] } },
  nodes, edges, strings,
};

t.test('dominators, retained sizes and classes of a hand-made snapshot', async (t) => {
  const s = summariseHeap(snap, 10, ['Holder'], ['Holder'], ['Part']);
  t.equal(s.nodes, 7);
  t.equal(s.totalBytes, 112);
  const cls = new Map(s.classes.map((c) => [c.name, c]));
  t.same(cls.get('Holder'), { name: 'Holder', count: 1, selfBytes: 10, retainedBytes: 100 }, 'the shared string is the Holder\'s: both paths to it pass through it');
  t.same(cls.get('Part'), { name: 'Part', count: 3, selfBytes: 57, retainedBytes: 57 }, 'z, reached from the root and from Part c, is the root\'s, counted once');
  t.same(cls.get('Other'), { name: 'Other', count: 1, selfBytes: 5, retainedBytes: 5 }, 'a weak edge retains nothing');
  t.same(cls.get('(string)'), { name: '(string)', count: 1, selfBytes: 40, retainedBytes: 40 });
  // A path is the one the depth-first walk took (Holder's edges before the root's later ones).
  t.same(s.dominators.map((d) => [d.name, d.retainedBytes, d.path]), [['Holder', 100, 'holder'], ['Part', 7, 'holder.c.inner'], ['Other', 5, 'other']]);
  t.same(s.expansions, [{ name: 'Holder', count: 1, retainedBytes: 100, edges: [{ edge: '(through several) (string)', retainedBytes: 40 }, { edge: 'c', retainedBytes: 30 }, { edge: 'b', retainedBytes: 20 }] }]);
  t.equal(s.trees[0], 'Holder: Holder 0.10 KiB\n  ~text: (string) 0.04 KiB\n  c: Part 0.03 KiB\n  b: Part 0.02 KiB', 'the string it holds through two edges named by the walk\'s edge to it');
  t.match(s.owners[0], /Part by immediate dominator:\n {2}Holder \.c: 1, 0\.03 KiB\n {2}Holder \.b: 1, 0\.02 KiB\n {2}\(synthetic\) \(root\) \.z: 1, 0\.01 KiB/);
  t.match(renderHeapSummary(s), /\| Holder \| 1 \| 0\.00 \| 0\.00 \|/);
});
