// The root logger and lazy children (agent/log.ts): a lazy child's lines are
// an eager child's, byte for byte but the time; a line the level drops
// makes no child, and none is kept; a thousand lazy children share their
// methods.
import t from 'tap';
import { createLogger, lazyChild, type Logger } from '../agent/log';

/** A root logger at `level` whose lines land in the returned array, the time field blanked. */
function captured(level: 'info' | 'trace' = 'trace'): { log: Logger; lines: string[] } {
  const lines: string[] = [];
  const log = createLogger(level, { write: (s: string) => { lines.push(s.replace(/"time":"[^"]*"/, '"time":"T"')); } });
  return { log, lines };
}

const BINDINGS = { module: 'net/vip-owner', ip: '10.99.0.50', mac: '02:aa:bb:cc:dd:01' };

/** One error for both loggers: its stack is part of the line. */
const err = new Error('boom');

/** Every way the agent calls a level method, at every level. */
function writeAll(l: Logger): void {
  for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace'] as const) {
    l[level]('a message alone');
    l[level]({ op: 'announce', reason: 'refresh' }, 'with fields');
    l[level]({ op: 'defend', conflictingMac: '52:54:00:ab:cd:ef', n: 3, ok: true }, '%s claims %s', 'someone', 'it');
    l[level]({ op: 'stop', err }, 'an error object');
    l[level]({ op: 'nested', ip: 'overridden here' });
  }
}

t.test('a lazy child writes what an eager child writes, field for field', async (t) => {
  const eager = captured();
  writeAll(eager.log.child(BINDINGS));
  const lazy = captured();
  writeAll(lazyChild(lazy.log, BINDINGS));
  t.equal(lazy.lines.length, 30);
  t.same(lazy.lines, eager.lines);
  const first = JSON.parse(lazy.lines[1]!) as Record<string, unknown>;
  t.same(Object.keys(first), ['level', 'time', 'pid', 'module', 'ip', 'mac', 'op', 'reason', 'msg'], 'the bindings come after the base fields, before the line\'s own');
});

t.test('children of a lazy child carry both sets of bindings, as an eager one\'s do', async (t) => {
  const eager = captured();
  eager.log.child(BINDINGS).child({ op: 'start' }).info({ address: '10.99.0.50' }, 'claimed');
  const lazy = captured();
  lazyChild(lazy.log, BINDINGS).child({ op: 'start' }).info({ address: '10.99.0.50' }, 'claimed');
  t.same(lazy.lines, eager.lines);
  t.match(lazy.lines[0], /"module":"net\/vip-owner","ip":"10\.99\.0\.50","mac":"02:aa:bb:cc:dd:01","op":"start","address":"10\.99\.0\.50","msg":"claimed"/);
  t.same(lazyChild(lazy.log, BINDINGS).bindings(), BINDINGS);
});

t.test('a line the level drops makes no child; each line it lets through makes one, not kept', async (t) => {
  const { log, lines } = captured('info');
  const made: unknown[] = [];
  const child = log.child.bind(log);
  log.child = ((b: Record<string, unknown>) => { made.push(b); return child(b); });
  const l = lazyChild(log, BINDINGS);
  l.debug({ op: 'announce' }, 'gratuitous ARP sent');
  l.trace('trace');
  t.equal(made.length, 0, 'no child for dropped lines');
  t.equal(lines.length, 0);
  t.notOk(l.isLevelEnabled('debug'), 'the level is the parent\'s');
  t.equal(l.level, 'info');
  l.warn({ op: 'defend' }, 'defended');
  l.info('again');
  l.debug('dropped still');
  t.same(made, [BINDINGS, BINDINGS], 'a child for each line written, with the bindings given at the start');
  t.equal(lines.length, 2);
});

t.test('lazy children of one parent share their methods: one holds its bindings only', async (t) => {
  const { log } = captured();
  const many = Array.from({ length: 1000 }, (_, i) => lazyChild(log, { module: 'ipam.pool-source', service: `default/s${i}` }));
  for (const l of many) l.info({ op: 'bound' }, 'holds it');
  t.ok(many.every((l) => Object.getPrototypeOf(l) === Object.getPrototypeOf(many[0])), 'one prototype');
  t.same(Object.getOwnPropertyNames(many[0]), [], 'no function of its own, after a line too');
  t.equal(Object.getOwnPropertySymbols(many[0]).length, 1, 'its bindings');
  const other = lazyChild(createLogger('info', { write: () => undefined }), BINDINGS);
  t.not(Object.getPrototypeOf(other), Object.getPrototypeOf(many[0]), 'another parent, another prototype');
});
