// YAML text to plain data, with what the config's errors need: the line of
// any node by its path, and a refusal of alias bombs before anything
// expands them. js-yaml does the parsing (YAML 1.2, core schema: no merge
// keys, no timestamps; duplicate keys refused); its parse listener, called
// as each node opens and closes, gives the node tree this file keeps beside
// the data: where each node starts, which nodes are aliases, and which key
// each mapping value belongs to. That tree is built only when an error or an
// alias needs it (parseYaml).
//
// Why js-yaml, not the yaml package: a start parses the config
// on a cold JIT, and the yaml package's generator-based lexer ran 35-80 ms
// for 50 services (5 KiB) against 9-12 ms for one, the largest single part
// of what 50 DHCP services cost a start over one; js-yaml takes 8-10 ms
// for the same file, and is a fifth of the yaml package's size in the
// bundle, which every start and every `lb-agent` command loads.
import { load, CORE_SCHEMA, YAMLException, type State } from 'js-yaml';

type Seg = string | number;

/** More alias uses than this, counted as expanded (an alias inside an aliased node counts each time), is refused. */
export const MAX_ALIAS_COUNT = 100;

export type YamlResult =
  | { ok: true; data: unknown; locate(segs: readonly Seg[]): number | undefined }
  /** `aliases`: refused as an alias bomb (the message is a whole sentence); `syntax`: js-yaml's error. */
  | { ok: false; kind: 'syntax' | 'aliases'; message: string; line?: number; column?: number };

/** One node as the parse listener saw it. */
interface Frame {
  /** Offset of its first character in the text (an empty node: where it would have been). */
  start: number;
  /** Where the listener saw it open, before any space or line break. */
  opened: number;
  /** An alias (*name): `value` is the node it names. */
  alias: boolean;
  /** Opened right after a ':' - the value of a mapping pair, not a key or an item. */
  afterColon: boolean;
  children: Frame[];
  value: unknown;
  kind: string | null;
}

/** Offset of the first character at or after `from` that is not a space, tab, line break or comment. */
function contentStart(text: string, from: number): number {
  let i = from;
  while (i < text.length) {
    const c = text.charCodeAt(i);
    if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) { i++; continue; }
    if (c === 0x23 /* # */) { while (i < text.length && text.charCodeAt(i) !== 0x0a) i++; continue; }
    break;
  }
  return i;
}

/** The previous character before `at` that is not a space or tab (or -1). */
function previousChar(text: string, at: number): number {
  let i = at - 1;
  while (i >= 0 && (text.charCodeAt(i) === 0x20 || text.charCodeAt(i) === 0x09)) i--;
  return i >= 0 ? text.charCodeAt(i) : -1;
}

/** 1-based line of an offset (binary search over the line starts). */
function lineOf(starts: number[], offset: number): number {
  let lo = 0;
  let hi = starts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (starts[mid]! <= offset) lo = mid; else hi = mid - 1;
  }
  return lo + 1;
}

/**
 * Alias uses in the expansion of `frame`, up to just past `limit`: an alias
 * counts once, plus the aliases inside the node it names, every time it is
 * used (a "billion laughs" file has a few dozen aliases in its text and
 * billions in its expansion). `defined` maps a collection to the frame that
 * wrote it out.
 */
function expandedAliases(frame: Frame, defined: Map<unknown, Frame>, memo: Map<Frame, number>, limit: number): number {
  const known = memo.get(frame);
  if (known !== undefined) return known;
  let n = 0;
  for (const c of frame.children) {
    if (c.alias) {
      n += 1;
      const target = typeof c.value === 'object' && c.value !== null ? defined.get(c.value) : undefined;
      if (target) n += expandedAliases(target, defined, memo, limit);
    } else {
      n += expandedAliases(c, defined, memo, limit);
    }
    if (n > limit) break;
  }
  memo.set(frame, n);
  return n;
}

/**
 * Parse one YAML document; never throws. The node tree that `locate` and
 * the alias check read is built only when they need it: a text without a
 * `*` has no alias (YAML 1.2 §7.1: an alias node is `*` and an anchor's
 * name), and `locate` is asked only for an error. Built beside the parse,
 * the tree is most of the parse's cost (a frame per node, a listener call
 * at each node's open and close), and a config that validates never reads it.
 */
export function parseYaml(text: string): YamlResult {
  if (text.indexOf('*') !== -1) return parseWithTree(text);
  let data: unknown;
  try {
    data = load(text, { schema: CORE_SCHEMA });
  } catch (e) {
    return syntaxError(e);
  }
  let tree: ((segs: readonly Seg[]) => number | undefined) | undefined;
  const locate = (segs: readonly Seg[]): number | undefined => {
    if (tree === undefined) {
      // The same text parses the same way again: only the tree is new.
      const again = parseWithTree(text);
      tree = again.ok ? (segs2) => again.locate(segs2) : () => undefined;
    }
    return tree(segs);
  };
  return { ok: true, data, locate };
}

function syntaxError(e: unknown): YamlResult {
  if (e instanceof YAMLException) {
    const mark = e.mark as { line?: number; column?: number } | undefined;
    const line = typeof mark?.line === 'number' ? mark.line + 1 : undefined;
    const column = typeof mark?.column === 'number' ? mark.column + 1 : undefined;
    return { ok: false, kind: 'syntax', message: e.reason || e.message.split('\n')[0]!, ...(line !== undefined ? { line } : {}), ...(column !== undefined ? { column } : {}) };
  }
  return { ok: false, kind: 'syntax', message: e instanceof Error ? e.message : String(e) };
}

/** The parse with the node tree built beside it: the alias check, and each node's line. */
function parseWithTree(text: string): YamlResult {
  const stack: Frame[] = [];
  const top: Frame[] = [];
  const aliases: Frame[] = [];
  const listener = (event: 'open' | 'close', state: State): void => {
    if (event === 'open') {
      const start = contentStart(state.input, state.position);
      stack.push({
        start, opened: state.position,
        alias: state.input.charCodeAt(start) === 0x2a /* * */,
        afterColon: previousChar(state.input, state.position) === 0x3a /* : */,
        children: [], value: undefined, kind: null,
      });
      return;
    }
    const f = stack.pop();
    if (!f) return;
    f.value = state.result;
    f.kind = state.kind;
    // Nothing was there (`priority:` and a line break): the line is the key's, not the next content's.
    if (f.kind === null) f.start = f.opened;
    if (f.alias) aliases.push(f);
    (stack.length > 0 ? stack[stack.length - 1]!.children : top).push(f);
  };
  let data: unknown;
  try {
    data = load(text, { schema: CORE_SCHEMA, listener });
  } catch (e) {
    return syntaxError(e);
  }
  const starts = [0];
  for (let i = text.indexOf('\n'); i !== -1; i = text.indexOf('\n', i + 1)) starts.push(i + 1);
  const root = top[top.length - 1];

  if (aliases.length > 0 && root) {
    const defined = new Map<unknown, Frame>();
    const walk = (f: Frame): void => {
      if (!f.alias && typeof f.value === 'object' && f.value !== null && !defined.has(f.value)) defined.set(f.value, f);
      for (const c of f.children) walk(c);
    };
    walk(root);
    if (expandedAliases(root, defined, new Map(), MAX_ALIAS_COUNT) > MAX_ALIAS_COUNT) {
      const first = aliases.reduce((a, b) => (b.start < a.start ? b : a));
      return { ok: false, kind: 'aliases', message: `YAML aliases expand too far (more than ${MAX_ALIAS_COUNT} alias uses, as in a "billion laughs" file); write the values out instead`, line: lineOf(starts, first.start) };
    }
  }

  // A mapping's children come as key, value, key, value; a key whose value
  // is empty and has no ':' (a flow-mapping entry `{ a }`) has no value child.
  const child = (f: Frame, seg: Seg): Frame | undefined => {
    if (f.kind === 'sequence') return typeof seg === 'number' ? f.children[seg] : undefined;
    if (f.kind !== 'mapping') return undefined;
    const cs = f.children;
    for (let i = 0; i < cs.length; i++) {
      const key = cs[i]!;
      if (key.afterColon) continue;
      const value = cs[i + 1]?.afterColon ? cs[i + 1] : undefined;
      if (String(key.value) === String(seg)) return value ?? key;
      if (value) i++;
    }
    return undefined;
  };
  const locate = (segs: readonly Seg[]): number | undefined => {
    if (!root || root.kind === null) return undefined; // an empty document
    let f = root;
    for (const seg of segs) {
      const next = child(f, seg);
      if (!next) break;
      f = next;
    }
    return lineOf(starts, f.start);
  };
  return { ok: true, data, locate };
}
