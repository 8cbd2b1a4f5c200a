// `npm run docs` (its benchmark part): replaces the generated summary in
// docs/benchmarks.md with the one of the latest full run committed in
// bench/results/ (lib/report.ts latestFullRun). No measurement runs; the
// page's prose around the block is kept. `--check` writes nothing and exits 1
// when the page differs. test/bench/docs.test.ts holds the page to this.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { BENCH_PAGE, evaluateTargets, latestFullRun, renderBenchSummary, updateBenchPage, type BenchResults } from './lib/report';

/** The checkout: dist/bench/ is two folders below it. */
export const REPO = path.resolve(__dirname, '..', '..');
const RESULTS = 'bench/results';

/** docs/benchmarks.md as it should read, from the text it has now and the results folder. */
export function benchmarksPage(page: string, resultsDir = path.join(REPO, RESULTS)): string {
  const latest = latestFullRun(fs.readdirSync(resultsDir));
  if (latest === undefined) throw new Error(`no full run in ${resultsDir}`);
  const r = JSON.parse(fs.readFileSync(path.join(resultsDir, latest), 'utf8')) as BenchResults;
  // The targets are judged again with today's rules and wording, not read from the run.
  r.targets = evaluateTargets(r);
  return updateBenchPage(page, renderBenchSummary(r, `${RESULTS}/${latest.replace(/\.json$/, '.md')}`));
}

function main(): void {
  const file = path.join(REPO, BENCH_PAGE);
  const now = fs.readFileSync(file, 'utf8');
  const next = benchmarksPage(now);
  if (next === now) return;
  if (process.argv.includes('--check')) {
    process.stderr.write(`out of date (run npm run docs): ${BENCH_PAGE}\n`);
    process.exitCode = 1;
    return;
  }
  fs.writeFileSync(file, next);
  process.stdout.write(`wrote ${BENCH_PAGE}\n`);
}

if (require.main === module) main();
