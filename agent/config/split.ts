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

/** Where the line that begins at `at` ends (its line break's index, or the text's length). */
function lineEnd(text: string, at: number): number {
  const i = text.indexOf('\n', at);
  return i === -1 ? text.length : i;
}

/** Spaces from `at` to the line's first other character (the text has no tab). */
function indentAt(text: string, at: number, end: number): number {
  let i = at;
  while (i < end && text.charCodeAt(i) === 0x20) i++;
  return i - at;
}

/** Blank, or only a comment: the line's first character after its indent is its end or `#`. */
function empty(text: string, first: number, end: number): boolean {
  return first === end || text.charCodeAt(first) === 0x23 /* # */;
}

/** A line at column 0 of the top-level mapping that this cut accepts: not a directive, document marker, flow collection or sequence item. */
function topLevel(c: number): boolean {
  return !(c === 0x25 /* % */ || c === 0x2d /* - */ || c === 0x2e /* . */ || c === 0x7b /* { */ || c === 0x5b /* [ */);
}

/** The line from `at` to `end` is the `services:` key (an optional comment after it). */
function servicesKey(text: string, at: number, end: number): boolean {
  return text.startsWith('services:', at) && KEY.test(text.slice(at, end));
}

/**
 * Cut `text` at its service entries, or undefined when its layout is not
 * the plain one (the file is then parsed whole). The caller checks that
 * the head parses with `services` as an empty list: a `services:` line
 * inside another section's quoted scalar is not the key.
 *
 * The text is walked by offsets, a line at a time, without a string made
 * per line: a reload of a thousand services cuts a file of some 5,000
 * lines, and only its entries' texts (the keys the parse looks up) are made.
 */
export function splitServiceEntries(text: string): ServiceEntries | undefined {
  if (/[\t\r*\uFEFF]/.test(text)) return undefined;
  const n = text.length;
  // The key line: `at` its start, `next` the start of the line after it.
  let at = -1;
  let next = 0;
  let seen = false;
  for (let p = 0; p <= n && at === -1; ) {
    const e = lineEnd(text, p);
    const ind = indentAt(text, p, e);
    if (!empty(text, p + ind, e)) {
      if (!seen && ind !== 0) return undefined; // the top-level mapping is indented
      seen = true;
      if (ind === 0) {
        if (!topLevel(text.charCodeAt(p))) return undefined;
        if (servicesKey(text, p, e)) { at = p; next = e + 1; }
      }
    }
    if (e === n) break;
    p = e + 1;
  }
  if (at === -1) return undefined;

  // The sequence: from the key's next line to the next line at column 0 that is not an item of it.
  let itemIndent = -1;
  const entries: string[] = [];
  let start = -1;
  // The start of the first line after the sequence (n + 1: none, the text ends in it).
  let end = n + 1;
  for (let p = next; p <= n; ) {
    const e = lineEnd(text, p);
    const ind = indentAt(text, p, e);
    const first = p + ind;
    if (!empty(text, first, e)) {
      const item = text.charCodeAt(first) === 0x2d /* - */ && (first + 1 === e || text.charCodeAt(first + 1) === 0x20);
      if (itemIndent === -1) {
        if (!item) return undefined; // `services:` followed by a mapping, or by nothing but the next key
        itemIndent = ind;
      }
      if (ind === 0 && !(item && itemIndent === 0)) { end = p; break; }
      if (item && ind === itemIndent) {
        if (start !== -1) entries.push(text.slice(start, p));
        start = p;
      } else if (ind <= itemIndent) return undefined;
    }
    if (e === n) break;
    p = e + 1;
  }
  if (start === -1) return undefined;
  // The rest of the top level: the same rules, and no second `services:` key (the whole parse refuses it).
  for (let p = end; p <= n; ) {
    const e = lineEnd(text, p);
    if (e > p && text.charCodeAt(p) !== 0x20 && text.charCodeAt(p) !== 0x23 /* # */) {
      if (!topLevel(text.charCodeAt(p)) || servicesKey(text, p, e)) return undefined;
    }
    if (e === n) break;
    p = e + 1;
  }
  // Each entry is its exact text, its last line break included (a block
  // scalar's value keeps it); blank and comment lines before the next item are its own.
  entries.push(text.slice(start, Math.min(end, n)));
  const head = `${text.slice(0, at)}services: []${end <= n ? `\n${text.slice(end)}` : ''}`;
  return { head, entries };
}
