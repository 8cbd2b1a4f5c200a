// bench/docs.ts: docs/benchmarks.md carries the summary of the latest full
// run committed in bench/results/ (else: npm run docs), and regenerating it
// keeps the page's own prose.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { benchmarksPage, REPO } from '../../bench/docs';
import { BENCH_BEGIN, BENCH_END, latestFullRun } from '../../bench/lib/report';

t.test('docs/benchmarks.md shows the latest full run (run npm run docs after committing one)', async (t) => {
  const page = fs.readFileSync(path.join(REPO, 'docs', 'benchmarks.md'), 'utf8');
  t.ok(page.includes(BENCH_BEGIN) && page.includes(BENCH_END), 'the page has the generated block');
  t.ok(benchmarksPage(page) === page, 'the block is what the latest run renders to');
  const latest = latestFullRun(fs.readdirSync(path.join(REPO, 'bench', 'results')))!;
  t.match(page, `](../bench/results/${latest.replace(/\.json$/, '.md')})`, `it links the run (${latest}) from docs/`);
  t.match(page, /## Running them[\s\S]*## Reading them/, 'the prose stays around it');
});

t.test('a page without the block gets one appended; the prose is kept', async (t) => {
  const out = benchmarksPage('# Benchmarks\n\nwords\n');
  t.ok(out.startsWith('# Benchmarks\n\nwords\n'));
  t.match(out, /## Latest results\n\n<!-- bench:begin/);
});
