// The event history status shows: bounded, oldest first, a copy.
import t from 'tap';
import { EventRing, EVENT_HISTORY } from '../../agent/daemon/events';

t.test('keeps the newest EVENT_HISTORY events, oldest first', async (t) => {
  const ring = new EventRing();
  for (let i = 0; i < EVENT_HISTORY + 5; i++) ring.push({ at: String(i), kind: 'vip-lost', service: 'default/web', reason: `r${i}` });
  const l = ring.list();
  t.equal(l.length, EVENT_HISTORY);
  t.equal(l[0]!.reason, 'r5');
  t.equal(l.at(-1)!.reason, `r${EVENT_HISTORY + 4}`);
  l.pop();
  t.equal(ring.list().length, EVENT_HISTORY, 'list() is a copy');
});
