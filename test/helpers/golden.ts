// Golden files for tests of pure renderers: the expected text lives in the
// source tree (tests run from dist/) and is compared byte for byte;
// UPDATE_GOLDEN=1 rewrites it from the actual output first.
import * as fs from 'node:fs';
import * as path from 'node:path';

/** A path in the source tree, from a compiled test in dist/test/<area>/. */
export function sourcePath(...p: string[]): string {
  return path.resolve(__dirname, '..', '..', '..', ...p);
}

/** The golden text to compare `actual` with (rewritten from it under UPDATE_GOLDEN=1). */
export function goldenText(file: string, actual: string): string {
  if (process.env.UPDATE_GOLDEN === '1') fs.writeFileSync(file, actual);
  return fs.readFileSync(file, 'utf8');
}
