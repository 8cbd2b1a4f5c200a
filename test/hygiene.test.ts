// Product files state rules, not history (STYLE.md, "Logs and comments"):
// README.md, docs/ and the comments of agent/, native/, lab/ and systemd/
// carry no issue numbers of this project, no internal work tags, no commit
// hashes and no dated diaries. A public project's issue (kube-vip#871,
// harvester/harvester#5486) and an RFC section are references, and fine.
// Every finding is reported as file:line.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..');

/**
 * TODO: files another change is rewriting right now; each is checked once it
 * leaves this list, and the list goes when it is empty. Nothing else may be
 * added here: rewrite the comment instead.
 */
const PENDING_REWRITE_TODO: readonly string[] = [];

interface Finding { readonly kind: string; readonly text: string }

const ORDINALS = 'third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth';

/** What counts as history, by kind. Each pattern is global: every match is a finding. */
const PATTERNS: readonly { kind: string; re: RegExp; keep?: (m: string) => boolean }[] = [
  { kind: 'issue number', re: /\b[Ii]ssues? #?\d+/g },
  // #123 alone; owner/repo#123 and project#123 are another project's issue.
  { kind: 'issue number', re: /(?<![\w./-])#\d{1,5}\b/g },
  // s16, s32, s64 are C's signed integer types (struct layouts), not tags.
  { kind: 'work tag', re: /\bs(?!16\b|32\b|64\b)\d{2}\b/g },
  { kind: 'work tag', re: /\b(?:[Ss]tops?|[Ss]essions?|[Pp]ass(?:es)?) \d+\b/g },
  { kind: 'work tag', re: new RegExp(`\\b(?:${ORDINALS}) (?:pass|look|session|stop)\\b`, 'gi') },
  // 7 to 40 hex digits with at least one digit and one letter, not part of a
  // longer word, a hex constant (0x...), a MAC or IPv6 address, a path or a name.
  { kind: 'commit hash', re: /(?<![\w:./#-])[0-9a-f]{7,40}(?![\w:./-])/g, keep: (m) => /\d/.test(m) && /[a-f]/.test(m) },
  // A run's results in bench/results/ are named by its date: a path there
  // (a link to the latest run) names a file, it is not a diary.
  { kind: 'dated diary', re: /(?<!\bbench\/results\/(?:[\w.-]+\/)*)\b20\d{2}-[01]\d-[0-3]\d\b/g },
];

/** The history in one piece of prose (a comment's text, a Markdown line). */
function historyIn(text: string): Finding[] {
  const out: Finding[] = [];
  for (const { kind, re, keep } of PATTERNS) {
    for (const m of text.matchAll(re)) if (!keep || keep(m[0])) out.push({ kind, text: m[0] });
  }
  return out;
}

/**
 * The comments of a C-like source (TypeScript, JavaScript, C++), by line:
 * `//` and `/* ... *\/`, skipping string and template literals. Regular
 * expression literals are read as code, which is enough for this tree.
 */
function cComments(source: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let line = 1;
  let state: 'code' | 'line' | 'block' | '"' | "'" | '`' = 'code';
  let buf = '';
  const flush = (): void => { if (buf.trim() !== '') out.push({ line, text: buf }); buf = ''; };
  for (let i = 0; i < source.length; i++) {
    const c = source[i]!;
    const next = source[i + 1];
    if (c === '\n') {
      if (state === 'line' || state === 'block') flush();
      if (state === 'line' || state === '"' || state === "'") state = 'code';
      line++;
      continue;
    }
    switch (state) {
      case 'code':
        if (c === '/' && next === '/') { state = 'line'; i++; } else if (c === '/' && next === '*') { state = 'block'; i++; } else if (c === '"' || c === "'" || c === '`') state = c;
        break;
      case 'line': buf += c; break;
      case 'block':
        if (c === '*' && next === '/') { flush(); state = 'code'; i++; } else buf += c;
        break;
      default:
        if (c === '\\') i++;
        else if (c === state) state = 'code';
    }
  }
  flush();
  return out;
}

/** The comments of a shell script, unit file or gyp file: from a `#` at the start of a line or after a blank. */
function hashComments(source: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  source.split('\n').forEach((l, i) => {
    const m = /(?:^|\s)#(?!!)(.*)$/.exec(l);
    if (m) out.push({ line: i + 1, text: m[1]! });
  });
  return out;
}

function prose(file: string, source: string): { line: number; text: string }[] {
  if (/\.(ts|js|cc|h|c)$/.test(file)) return cComments(source);
  if (/\.md$/.test(file)) return source.split('\n').map((text, i) => ({ line: i + 1, text }));
  if (/\.(sh|service|sysusers|gyp|gypi|conf)$/.test(file)) return hashComments(source);
  return [];
}

function walk(rel: string): string[] {
  const abs = path.join(ROOT, rel);
  if (!fs.existsSync(abs)) return [];
  if (fs.statSync(abs).isFile()) return [rel];
  return fs.readdirSync(abs, { withFileTypes: true })
    .filter((e) => !e.name.startsWith('.') && e.name !== 'build' && e.name !== 'node_modules')
    .flatMap((e) => walk(path.join(rel, e.name)));
}

t.test('the matcher: history is found, references and numbers that are not history are not', async (t) => {
  const cases: [string, string[]][] = [
    ['Issue 17: snat, or preserve', ['issue number']],
    ['the fallback (issue 14) and issues 18 and', ['issue number', 'issue number']],
    ['fixed in #42 last week', ['issue number']],
    ['s24 (profiling) and then s29', ['work tag', 'work tag']],
    ['as of stop 42 and session 3', ['work tag', 'work tag']],
    ['pass 8 found it; the eighth pass did not', ['work tag', 'work tag']],
    ['reverted in 3bb7574, see a889ebc0', ['commit hash', 'commit hash']],
    ['measured 2026-11-24 on 2 vCPUs', ['dated diary']],
    // Near misses: references and numbers that are not history.
    ['kube-vip#871: renew from the macvlan\'s MAC', []],
    ['harvester/harvester#5486', []],
    ['RFC 5227 §2.1.1: probe before use', []],
    ['EtherType 0x8100 (802.1Q), 0xdeadbeef', []],
    ['MAC 02:00:5e:00:01:33 and fe80::1ff:fe23:4567:890a', []],
    ['a 16 KiB buffer, 1024 slots, 3 retries at 100 ms', []],
    ['sha256 of cli.js; uint32 and __s32 fields; 10s timeout', []],
    ['u8 code | s16 off | s32 imm, s64 sums', []],
    ['the first pass over the list, a second pass to sort', []],
    ['nft handle 1234567, the 1,000,000th packet', []],
    ['bench/results/ keeps every run', []],
    ['[bench/results/2026-11-30-3.md](../bench/results/2026-11-30-3.md)', []],
    ['bench/results/ has the run of 2026-11-30', ['dated diary']],
    ['notes/2026-11-30.md', ['dated diary']],
  ];
  for (const [text, kinds] of cases) t.same(historyIn(text).map((f) => f.kind), kinds, text);
});

t.test('comments are told from code and strings', async (t) => {
  const src = [
    "const a = 'issue 17 // not a comment'; // issue 18",
    '/* s24',
    '   2026-11-24 */ const b = "#12";',
    'const c = `template // issue 19`;',
  ].join('\n');
  t.same(cComments(src), [{ line: 1, text: ' issue 18' }, { line: 2, text: ' s24' }, { line: 3, text: '   2026-11-24 ' }]);
  t.same(hashComments('#!/bin/sh\n# issue 5\necho "x" # s24\n'), [{ line: 2, text: ' issue 5' }, { line: 3, text: ' s24' }]);
});

t.test('README, docs/ and the comments of agent/, native/, lab/, systemd/ carry no history', async (t) => {
  const files = ['README.md', 'docs', 'agent', 'native', 'lab', 'systemd'].flatMap(walk).sort();
  t.ok(files.length > 100, `${files.length} files read`);
  const findings: string[] = [];
  for (const file of files) {
    if (PENDING_REWRITE_TODO.includes(file)) continue;
    for (const { line, text } of prose(file, fs.readFileSync(path.join(ROOT, file), 'utf8'))) {
      for (const f of historyIn(text)) findings.push(`${file}:${line}: ${f.kind} "${f.text}"`);
    }
  }
  t.same(findings, [], `${findings.length} finding(s):\n${findings.join('\n')}`);
});
