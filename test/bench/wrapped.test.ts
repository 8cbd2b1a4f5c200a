// bench/wrapped.ts, its pure half: the JSON another bench prints, as one
// document or as JSON lines among progress text.
import t from 'tap';
import { parseJsonOutput } from '../../bench/wrapped';

t.test('one pretty-printed document', async (t) => {
  t.same(parseJsonOutput('{\n  "a": 1\n}\n'), [{ a: 1 }]);
});

t.test('JSON lines mixed with other output', async (t) => {
  t.same(parseJsonOutput('{"n":1}\nprogress...\n{"n":2}\n{broken\n'), [{ n: 1 }, { n: 2 }]);
});

t.test('nothing usable', async (t) => {
  t.same(parseJsonOutput(''), []);
  t.same(parseJsonOutput('error: boom\n'), []);
});
