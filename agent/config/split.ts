// The config file's text cut at its top-level `services:` entries, without
// parsing it: the file's other sections as one text, and each service entry's
// source lines, so a parse can take again what an unchanged entry built and
// parse only the entries whose text differs (load.ts parseConfigText). Pure.
//
// Only a plain layout is cut: a block mapping at column 0 whose `services:`
// key holds a block sequence, its items starting with `- ` at one indent,
// every other line of the sequence more indented than that (or blank, or a
// comment). Anything else - flow style at the top, tabs, CR line ends, a
// byte-order mark, document markers or directives, an alias (`*`: an entry
// would no longer stand alone) - is not cut, and the caller parses the file
// whole. A cut that parses differently (an entry that is not one sequence
// item on its own, a quoted scalar cut in two) shows as an entry that fails
// to parse alone; the caller then parses the whole file too, so every error
// it reports, and its line, is the whole parse's.

/** The file cut at its service entries. */
export interface ServiceEntries {
  /** The file with the entries' lines out and `services: []` for its key line: what the other sections parse from. */
  readonly head: string;
  /** Each entry's text as in the file (its `- ` indent and its last line break included), in order. */
  readonly entries: readonly string[];
}

const KEY = /^services:[ ]*(#.*)?$/;

/** Spaces before the line's first character (the line has no tab). */
function indentOf(line: string): number {
  let i = 0;
  while (i < line.length && line.charCodeAt(i) === 0x20) i++;
  return i;
}

/** Blank, or only a comment. */
function empty(line: string, indent: number): boolean {
  return indent === line.length || line.charCodeAt(indent) === 0x23 /* # */;
}

/** A line at column 0 of the top-level mapping that this cut accepts: not a directive, document marker, flow collection or sequence item. */
function topLevel(l: string): boolean {
  const c = l.charCodeAt(0);
  return !(c === 0x25 /* % */ || c === 0x2d /* - */ || c === 0x2e /* . */ || c === 0x7b /* { */ || c === 0x5b /* [ */);
}

/**
 * Cut `text` at its service entries, or undefined when its layout is not
 * the plain one (the file is then parsed whole). The caller checks that
 * the head parses with `services` as an empty list: a `services:` line
 * inside another section's quoted scalar is not the key.
 */
export function splitServiceEntries(text: string): ServiceEntries | undefined {
  if (/[\t\r*\uFEFF]/.test(text)) return undefined;
  const lines = text.split('\n');
  let at = -1;
  let seen = false;
  for (let i = 0; i < lines.length && at === -1; i++) {
    const l = lines[i]!;
    const ind = indentOf(l);
    if (empty(l, ind)) continue;
    if (!seen && ind !== 0) return undefined; // the top-level mapping is indented
    seen = true;
    if (ind !== 0) continue;
    if (!topLevel(l)) return undefined;
    if (KEY.test(l)) at = i;
  }
  if (at === -1) return undefined;

  // The sequence: from the key's next line to the next line at column 0 that is not an item of it.
  let itemIndent = -1;
  const entries: string[] = [];
  let start = -1;
  let end = at + 1;
  for (; end < lines.length; end++) {
    const l = lines[end]!;
    const ind = indentOf(l);
    if (empty(l, ind)) continue;
    const item = l.charCodeAt(ind) === 0x2d /* - */ && (ind + 1 === l.length || l.charCodeAt(ind + 1) === 0x20);
    if (itemIndent === -1) {
      if (!item) return undefined; // `services:` followed by a mapping, or by nothing but the next key
      itemIndent = ind;
    }
    if (ind === 0 && !(item && itemIndent === 0)) break;
    if (item && ind === itemIndent) {
      if (start !== -1) entries.push(`${lines.slice(start, end).join('\n')}\n`);
      start = end;
      continue;
    }
    if (ind <= itemIndent) return undefined;
  }
  if (start === -1) return undefined;
  // The rest of the top level: the same rules, and no second `services:` key (the whole parse refuses it).
  for (let i = end; i < lines.length; i++) {
    const l = lines[i]!;
    const ind = indentOf(l);
    if (ind !== 0 || empty(l, ind)) continue;
    if (!topLevel(l) || KEY.test(l)) return undefined;
  }
  // Each entry is its exact text, its last line break included (a block
  // scalar's value keeps it); blank and comment lines before the next item are its own.
  entries.push(lines.slice(start, end).join('\n') + (end < lines.length ? '\n' : ''));
  const head = [...lines.slice(0, at), 'services: []', ...lines.slice(end)].join('\n');
  return { head, entries };
}
