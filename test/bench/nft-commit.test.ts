// bench/nft-commit.ts, its pure half: what each shape's transition puts in
// the kernel's transaction. The measurement rests on it: a delta of data
// elements alone asks the kernel for no validation of the chain graph, a
// jump/goto verdict or a rule does.
import t from 'tap';
import { SHAPES, type Shape } from '../../bench/nft-commit';

const shape = (name: string): Shape => {
  const s = SHAPES.find((x) => x.name === name);
  if (!s) throw new Error(`no shape ${name}`);
  return s;
};
const statements = (delta: string): string[] => delta.split('\n').filter((l) => l.trim() !== '');
/** A verdict that sends to a chain, or a rule added: what makes nf_tables validate the table at the commit. */
const asksValidation = (delta: string): boolean => /\b(jump|goto)\b/.test(delta) || /^add rule /m.test(delta);

t.test('the agent\'s own transitions (round-robin and flow hash) change data elements of the changed port\'s slot map only', async (t) => {
  for (const name of ['agent', 'agent-hash']) {
    for (const down of [true, false]) {
      const d = shape(name).delta(20, down);
      t.notOk(asksValidation(d), `${name} ${down ? 'down' : 'up'}: no jump, goto or rule`);
      const st = statements(d);
      t.ok(st.length > 0 && st.every((l) => /^(add|delete) element ip lb_agent s1p0_slots \{/.test(l)), `${name}: elements of s1p0_slots only`);
    }
  }
});

t.test('the slot-map transitions with a fixed modulus change data elements of one map only', async (t) => {
  for (const name of ['slotmap-rr-fixed', 'slotmap-hash']) {
    for (const down of [true, false]) {
      const d = shape(name).delta(20, down);
      t.notOk(asksValidation(d), `${name} ${down ? 'down' : 'up'}: no jump, goto or rule`);
      const st = statements(d);
      t.ok(st.length > 0, `${name}: the transition changes something`);
      t.ok(st.every((l) => /^(add|delete) element ip lb_agent s1p0 \{/.test(l)), `${name}: elements of the changed service's slot map only`);
    }
  }
  // The fixed modulus: the delta writes the slots whose backend changes, none of them to the backend that went.
  const down = shape('slotmap-rr-fixed').delta(20, true);
  const added = statements(down).find((l) => l.startsWith('add element'))!;
  t.notMatch(added, /10\.96\.0\.12 /, 'service 1\'s first backend (10.96.0.12) is given no slot when it goes');
  const slots = [...added.matchAll(/(\d+) : /g)].map((m) => Number(m[1]));
  t.ok(slots.length > 0 && slots.length < 12, `only the moved slots are written (${slots.length} of 12)`);
});

t.test('a round-robin slot-map transition whose modulus follows the healthy set rewrites its rule, with no goto', async (t) => {
  const d = shape('slotmap-rr').delta(20, true);
  t.match(d, /add rule ip lb_agent s1p0 meta l4proto tcp dnat ip to numgen inc mod 2 map @s1p0/);
  t.notMatch(d, /\b(jump|goto)\b/);
});

t.test('the slot-map tables have a chain a service port, none a backend', async (t) => {
  const chains = (text: string): number => (text.match(/^\s*chain /gm) ?? []).length;
  const slot = shape('slotmap-hash').table(20);
  t.equal(chains(slot), 20 + 3, '20 service chains and prerouting, postrouting, forward');
  t.notMatch(slot, /goto/, 'no goto anywhere');
  // 20 services of 2, 3 or 4 backends: 7 of 2, 7 of 3, 6 of 4 = 59 backend chains.
  t.notMatch(shape('agent').table(20), /chain s\d+p0b/, 'the agent table: no backend chain');
});
