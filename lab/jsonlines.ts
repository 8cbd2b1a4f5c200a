// lab/jsonlines.ts: read newline-delimited JSON from a child's stdout (the
// agent, lab/bin programs and test drivers print one JSON object per line).
// Lines that are not JSON go to onOther, or are ignored.
import type { Readable } from 'node:stream';

export function onJsonLines(stream: Readable, onObject: (obj: Record<string, unknown>) => void, onOther?: (line: string) => void): void {
  let buf = '';
  stream.on('data', (d: Buffer) => {
    buf += d.toString();
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      let obj: unknown;
      try { obj = JSON.parse(line); } catch { onOther?.(line); continue; }
      if (obj && typeof obj === 'object') onObject(obj as Record<string, unknown>);
      else onOther?.(line);
    }
  });
}
