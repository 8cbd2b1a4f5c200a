// `node dist/bench/heap.js FILE.heapsnapshot...`: each V8 heap snapshot
// summarised (bench/lib/heapsnapshot.ts): its classes by retained size and
// its largest dominators, as Markdown, in MiB. HEAP_TOP=N: rows of each
// table; HEAP_EXPAND=Class,...: what those classes' instances hold alone;
// HEAP_TREE=Class,...: the dominator tree under the largest of each;
// HEAP_OWNERS=Class,...: what dominates each class's instances.
import fs from 'node:fs';
import { renderHeapSummary, summariseHeap, type HeapSnapshotJson } from './lib/heapsnapshot';

const files = process.argv.slice(2);
if (files.length === 0) {
  process.stderr.write('usage: node dist/bench/heap.js FILE.heapsnapshot...\n');
  process.exit(2);
}
for (const f of files) {
  const snap = JSON.parse(fs.readFileSync(f, 'utf8')) as HeapSnapshotJson;
  process.stdout.write(`## ${f}\n\n${renderHeapSummary(summariseHeap(snap, Number(process.env['HEAP_TOP'] ?? 40), (process.env['HEAP_EXPAND'] ?? '').split(',').filter(Boolean), (process.env['HEAP_TREE'] ?? '').split(',').filter(Boolean), (process.env['HEAP_OWNERS'] ?? '').split(',').filter(Boolean)))}\n\n`);
}
