// agent/clock.ts: isoTime writes what Date#toISOString writes (issue 18: the
// agent's timestamps no longer go through V8's, which pages in ICU's
// time-zone names), and ManualClock fires timers in order.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { isoTime, ManualClock } from '../agent/clock';
import { prng } from './helpers/random';

t.test('isoTime is Date#toISOString for every timestamp the agent can meet', async (t) => {
  const fixed = [0, 1, 999, 1000, -1, Date.UTC(2026, 0, 1), Date.UTC(2026, 11, 31, 23, 59, 59, 999), Date.UTC(2024, 1, 29, 12, 0, 0, 7),
    Date.UTC(999, 0, 1), Date.UTC(9999, 11, 31, 23, 59, 59, 999), Date.UTC(1, 5, 6, 7, 8, 9, 10)];
  for (const ms of fixed) t.equal(isoTime(ms), new Date(ms).toISOString(), `${ms}`);
  const rnd = prng(18);
  let mismatches = 0;
  for (let i = 0; i < 20_000; i++) {
    const ms = Math.floor(rnd() * Date.UTC(2200, 0, 1));
    if (isoTime(ms) !== new Date(ms).toISOString()) mismatches++;
  }
  t.equal(mismatches, 0, '20,000 random timestamps from 1970 to 2200');
});

t.test('isoTime outside 0000-9999 and on invalid input behaves as V8 does', async (t) => {
  const far = Date.UTC(10000, 0, 1);
  t.equal(isoTime(far), '+010000-01-01T00:00:00.000Z');
  t.equal(isoTime(Date.UTC(-1, 0, 1)), new Date(Date.UTC(-1, 0, 1)).toISOString());
  t.throws(() => isoTime(NaN), RangeError);
});

/** agent/ files (relative) that call Date#toISOString or Date#toJSON. */
function toIsoCallers(): string[] {
  const root = path.resolve(__dirname, '..', '..', 'agent');
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts') && p !== path.join(root, 'clock.ts') && /\.to(ISOString|JSON)\(/.test(fs.readFileSync(p, 'utf8'))) out.push(path.relative(root, p));
    }
  };
  walk(root);
  return out.sort();
}

t.test('the agent writes its timestamps with isoTime, not V8\'s Date#toISOString', async (t) => {
  // One call anywhere pages ICU's time-zone names in for the process's life
  // (issue 18): the logger, the status document, the event ring and the DHCP
  // lease file all write theirs with isoTime.
  t.same(toIsoCallers(), []);
});

t.test('ManualClock fires due timers in time order, and not cancelled ones', async (t) => {
  const c = new ManualClock(0, 0);
  const fired: string[] = [];
  c.setTimeout(() => fired.push('b'), 20);
  c.setTimeout(() => fired.push('a'), 10);
  const h = c.setTimeout(() => fired.push('x'), 15);
  c.clearTimeout(h);
  c.advance(15);
  t.same(fired, ['a']);
  t.equal(c.now(), 15);
  c.advance(10);
  t.same(fired, ['a', 'b']);
  t.equal(c.wallNow(), 25);
});
