// The "Layout" section of docs/design.md matches the tree: every top-level
// folder and every agent/ subfolder is named there as `name/`, and every
// folder named there exists. Folders git ignores (node_modules/, dist/, ...)
// are not part of the tree.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..');

/** The text of the section headed `## Layout`, up to the next `## `. */
function layoutSection(readme: string): string | undefined {
  const m = /^## Layout\n([\s\S]*?)(?=^## |(?![\s\S]))/m.exec(readme);
  return m?.[1];
}

/** Folders the section names: every `path/` in backticks. */
function namedFolders(section: string): Set<string> {
  return new Set([...section.matchAll(/`([a-z0-9._-]+(?:\/[a-z0-9._-]+)*)\/`/g)].map((m) => m[1]!));
}

/** Top-level names .gitignore ignores wherever they are (`dist/`, `node_modules/`). */
function ignoredNames(): Set<string> {
  const text = fs.readFileSync(path.join(ROOT, '.gitignore'), 'utf8');
  return new Set(text.split('\n').map((l) => l.trim()).filter((l) => /^[^#/!*]+\/$/.test(l)).map((l) => l.slice(0, -1)));
}

function dirs(dir: string, ignored: Set<string>): string[] {
  return fs.readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isDirectory() && !e.name.startsWith('.') && !ignored.has(e.name))
    .map((e) => e.name)
    .sort();
}

/** What is wrong between a page and a tree's folders: missing from the page, or named but absent. */
function mismatches(readme: string, top: string[], agentDirs: string[], exists: (p: string) => boolean): string[] {
  const section = layoutSection(readme);
  if (section === undefined) return ['the page has no "## Layout" section'];
  const named = namedFolders(section);
  const out: string[] = [];
  for (const d of top) if (!named.has(d)) out.push(`${d}/ is not in the Layout section`);
  for (const d of agentDirs) if (!named.has(`agent/${d}`)) out.push(`agent/${d}/ is not in the Layout section`);
  for (const n of named) if (!exists(n)) out.push(`${n}/ is named in the Layout section but is not in the tree`);
  return out;
}

t.test('the checker sees a missing folder, an absent one, and a missing section', async (t) => {
  const readme = '# x\n## Layout\n- `agent/`: a\n  - `agent/net/`: b\n- `lab/`: c\n- `gone/`: d\n## Next\n- `bench/` is not in the section\n';
  const tree = new Set(['agent', 'agent/net', 'lab', 'bench', 'agent/dhcp']);
  t.same(mismatches(readme, ['agent', 'bench', 'lab'], ['dhcp', 'net'], (p) => tree.has(p)), [
    'bench/ is not in the Layout section',
    'agent/dhcp/ is not in the Layout section',
    'gone/ is named in the Layout section but is not in the tree',
  ]);
  t.same(mismatches('# x\n## Other\n', [], [], () => true), ['the page has no "## Layout" section']);
  t.same(mismatches('## Layout\n`a/` `a/b/`\n', ['a'], [], () => true), [], 'the last section of a file is read too');
});

t.test("docs/design.md's Layout section names every folder of the tree, and only those", async (t) => {
  const ignored = ignoredNames();
  t.ok(ignored.has('node_modules') && ignored.has('dist'), `ignored names read from .gitignore (${[...ignored].join(', ')})`);
  const top = dirs(ROOT, ignored);
  const agentDirs = dirs(path.join(ROOT, 'agent'), ignored);
  t.ok(top.includes('agent') && top.includes('lab') && agentDirs.includes('daemon'), `the tree was read (${top.join(', ')}; agent/: ${agentDirs.join(', ')})`);
  const readme = fs.readFileSync(path.join(ROOT, 'docs', 'design.md'), 'utf8');
  const exists = (p: string): boolean => fs.existsSync(path.join(ROOT, p)) && fs.statSync(path.join(ROOT, p)).isDirectory();
  t.same(mismatches(readme, top, agentDirs, exists), []);
});
