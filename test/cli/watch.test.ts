// `status --watch` without a terminal: each tick redraws in place, an
// unreachable daemon is shown and asked again, a stop restores the cursor.
import t from 'tap';
import { watchStatus, ANSI } from '../../agent/cli/watch';
import type { StatusDocument } from '../../agent/daemon/daemon';

const doc = (state: string): StatusDocument => ({
  version: '0.1.0', pid: 42, node: { name: 'vm1', interface: 'eth0', address: '10.99.0.2', priority: 100 },
  config: { path: '/c.yaml', loadedAt: '2026-11-23T20:00:00.000Z', generation: 1, lastReload: undefined },
  dataplane: { kind: 'kernel', reason: 'auto' }, failover: { mode: 'none' }, ready: true, events: [],
  services: [{
    key: 'default/web', name: 'web', namespace: 'default', ipam: 'pool', primaryService: undefined, vip: '10.99.0.200',
    interface: undefined, mac: undefined, state: 'serving', reason: undefined, ready: true, startedAt: 0, adopted: false,
    interruptions: 0, lastInterruption: undefined, ports: ['80/TCP->8080'], source: undefined, failover: undefined, healthyBackends: 1,
    backends: [{ address: '10.99.0.11', port: 8080, state, since: 0, reason: undefined, takenOutBy: undefined }],
  }],
});

t.test('redraws each tick, shows the daemon gone and back, stops with the cursor restored', async (t) => {
  const answers: Array<StatusDocument | Error> = [doc('up'), new Error('cannot reach the agent at /s.sock: ENOENT'), doc('down')];
  const frames: string[] = [];
  let stop: (() => void) | undefined;
  let unregistered = false;
  const started = Date.now();
  await watchStatus({
    socket: '/s.sock', intervalMs: 20, write: (s) => frames.push(s),
    onStop: (s) => { stop = s; return () => { unregistered = true; }; },
    fetch: async () => {
      const a = answers.shift();
      if (!a) { stop!(); return doc('down'); }
      if (a instanceof Error) throw a;
      return a;
    },
  });
  t.ok(Date.now() - started < 2000);
  t.equal(frames[0], ANSI.hideCursor + ANSI.clearScreen, 'hides the cursor and clears once');
  const draws = frames.slice(1, -1);
  t.equal(draws.length, 3, 'one redraw per answer; none after the stop');
  for (const d of draws) t.ok(d.startsWith(ANSI.home) && d.endsWith(ANSI.clearToEnd), 'in place: home first, clear to end last');
  t.match(draws[0], /10\.99\.0\.11:8080\s+up/);
  t.match(draws[1], /daemon unreachable: cannot reach the agent at \/s\.sock: ENOENT/);
  t.match(draws[2], /10\.99\.0\.11:8080\s+down/);
  t.equal(frames.at(-1), ANSI.showCursor, 'the cursor is restored last');
  t.ok(unregistered, 'the signal handlers are removed');
});

t.test('a stop during the wait ends at once', async (t) => {
  let stop: (() => void) | undefined;
  const started = Date.now();
  const p = watchStatus({ socket: '/s', intervalMs: 60_000, write: () => undefined, onStop: (s) => { stop = s; return () => undefined; }, fetch: async () => doc('up') });
  setTimeout(() => stop!(), 50);
  await p;
  t.ok(Date.now() - started < 1000, 'not after the 60 s interval');
});
