// Build time only (`npm run docs`): writes the documentation pages that are
// generated from their one definition (agent/cli/pages.ts) into docs/ of the
// checkout. `--check` writes nothing and exits 1 naming each page that
// differs, for a hook or CI; test/cli/pages.test.ts holds the same.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { generatedPages } from './cli/pages';

/** The checkout: dist/agent/ is two folders below it. */
const REPO = path.resolve(__dirname, '..', '..');

function main(): void {
  const check = process.argv.includes('--check');
  const stale: string[] = [];
  for (const [rel, text] of Object.entries(generatedPages())) {
    const file = path.join(REPO, rel);
    const now = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : undefined;
    if (now === text) continue;
    stale.push(rel);
    if (!check) {
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, text);
      process.stdout.write(`wrote ${rel}\n`);
    }
  }
  if (check && stale.length > 0) {
    process.stderr.write(`out of date (run npm run docs): ${stale.join(', ')}\n`);
    process.exitCode = 1;
  }
}

main();
