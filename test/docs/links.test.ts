// The README and docs/ as a reader meets them on a code host: the README is
// a front door under 200 lines, and every relative link in it and in docs/
// leads to a file, and a `#anchor` to a heading of that file (GitHub's
// slugs).
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..', '..');

/** The Markdown files a reader browses: README.md and docs/*.md. */
export function pages(): string[] {
  return ['README.md', ...fs.readdirSync(path.join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];
}

/** Text outside fenced code blocks. */
function prose(md: string): string {
  return md.replace(/^```[\s\S]*?^```/gm, '');
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2. */
export function anchors(md: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of prose(md).matchAll(/^#{1,6}\s+(.*?)\s*#*$/gm)) {
    const base = m[1]!.toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, '').replace(/ /g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** Relative link targets: [text](target), not URLs or mail. */
export function links(md: string): string[] {
  return [...prose(md).replace(/`[^`\n]*`/g, '').matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!).filter((l) => !/^[a-z]+:/i.test(l));
}

/** Problems with the links of one page, in words. */
export function brokenLinks(page: string, read: (rel: string) => string | undefined): string[] {
  const text = read(page);
  if (text === undefined) return [`${page} does not exist`];
  const out: string[] = [];
  for (const l of links(text)) {
    const [file, anchor] = l.split('#') as [string, string | undefined];
    const target = file === '' ? page : path.posix.normalize(path.posix.join(path.posix.dirname(page), file));
    const body = read(target);
    if (body === undefined) { out.push(`${page}: ${l}: ${target} does not exist`); continue; }
    if (anchor !== undefined && target.endsWith('.md') && !anchors(body).has(anchor)) out.push(`${page}: ${l}: no heading #${anchor} in ${target}`);
  }
  return out;
}

const readRepo = (rel: string): string | undefined => {
  const p = path.join(ROOT, rel);
  if (!fs.existsSync(p)) return undefined;
  return fs.statSync(p).isDirectory() ? '' : fs.readFileSync(p, 'utf8');
};

t.test('the checker: anchors as GitHub makes them, a missing file and a missing heading', async (t) => {
  t.same([...anchors('# A `b` c\n## Where a VIP lives\n## x\n## x\n```\n# not a heading\n```\n')], ['a-b-c', 'where-a-vip-lives', 'x', 'x-1']);
  const files: Record<string, string> = { 'docs/a.md': '[b](b.md#two) [c](c.md) [top](../README.md#one) [self](#here) [web](https://x.org/y) `[no](link.md)`\n# here\n', 'docs/b.md': '# one\n', 'README.md': '# one\n' };
  t.same(brokenLinks('docs/a.md', (r) => files[r]), ['docs/a.md: b.md#two: no heading #two in docs/b.md', 'docs/a.md: c.md: docs/c.md does not exist']);
});

t.test('the README is a front door: under 200 lines, the two set-up commands first', async (t) => {
  const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const lines = readme.split('\n').length;
  t.ok(lines < 200, `README.md has ${lines} lines`);
  const blocks = [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!.trim());
  t.same(blocks.slice(0, 2), ['bash scripts/setup.sh && npm run demo', 'bash scripts/setup.sh && npm test'], 'the demo and the test command, setup.sh first');
  // .ci/run runs exactly the README's test command.
  const ci = fs.readFileSync(path.join(ROOT, '.ci', 'run'), 'utf8').trim().split('\n').at(-1);
  t.equal(ci, blocks[1], '.ci/run ends with the README\'s test command');
});

t.test('every relative link in README.md and docs/ resolves, anchors included', async (t) => {
  const all = pages();
  t.ok(all.length >= 10, `pages read: ${all.join(', ')}`);
  t.same(all.flatMap((p) => brokenLinks(p, readRepo)), []);
});

t.test('docs/ stands alone: no link or path outside the repository', async (t) => {
  for (const p of pages()) {
    const text = fs.readFileSync(path.join(ROOT, p), 'utf8');
    t.notMatch(text, /\.\.\/shared\/|\/work\//, `${p} points at nothing outside the repository`);
  }
});
