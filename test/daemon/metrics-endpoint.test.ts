// The metrics endpoint's life cycle (agent/daemon/metrics-endpoint.ts):
// bound at start, bound again by a reload, stopped, and moved with the
// parent's address only when it is bound to that address. Fake servers
// stand in for metrics/server.ts (the endpoint itself is tested there).
import t from 'tap';
import pino from 'pino';
import { MetricsEndpoint, type EndpointServer } from '../../agent/daemon/metrics-endpoint';

function harness(o: { failBind?: string; stopping?: boolean } = {}): { ep: MetricsEndpoint; journal: string[]; logs: { level: number; msg: string }[] } {
  const journal: string[] = [];
  const logs: { level: number; msg: string }[] = [];
  const log = pino({ level: 'info' }, { write: (line: string) => { const r = JSON.parse(line) as { level: number; msg: string }; logs.push({ level: r.level, msg: r.msg }); } });
  const ep = new MetricsEndpoint({
    log, stopping: () => o.stopping ?? false,
    create: (host, port): EndpointServer => ({
      start: async () => { if (host === o.failBind) throw new Error(`listen EADDRNOTAVAIL ${host}:${port}`); journal.push(`listen ${host}:${port}`); },
      stop: async () => { journal.push(`close ${host}:${port}`); },
    }),
  });
  return { ep, journal, logs };
}

t.test('start, a reload\'s new address, a reload that turns it off, stop', async (t) => {
  const h = harness();
  await h.ep.start('127.0.0.1:9477');
  t.same(h.ep.address, { host: '127.0.0.1', port: 9477 });
  await h.ep.restart('0.0.0.0:9478');
  t.same(h.journal, ['listen 127.0.0.1:9477', 'close 127.0.0.1:9477', 'listen 0.0.0.0:9478'], 'the old endpoint goes before the new one comes');
  await h.ep.restart('');
  t.equal(h.ep.address, undefined, '"" turns it off');
  await h.ep.restart('127.0.0.1:9479');
  await h.ep.stop();
  await h.ep.stop();
  t.same(h.journal.slice(3), ['close 0.0.0.0:9478', 'listen 127.0.0.1:9479', 'close 127.0.0.1:9479'], 'a second stop closes nothing');
});

t.test("bound to the parent's address, it moves with it", async (t) => {
  const h = harness();
  await h.ep.start('10.99.0.5:9477');
  await h.ep.followParentAddress('10.99.0.5', '10.99.0.6');
  t.same(h.journal, ['listen 10.99.0.5:9477', 'close 10.99.0.5:9477', 'listen 10.99.0.6:9477']);
  t.same(h.ep.address, { host: '10.99.0.6', port: 9477 });
  t.same(h.logs.at(-1), { level: 40, msg: "metrics endpoint moved to 10.99.0.6:9477 with the parent's address" }, 'a warning says where it went');
});

t.test('a wildcard, another address, no new address, or a stop: it stays', async (t) => {
  const wild = harness();
  await wild.ep.start('0.0.0.0:9477');
  await wild.ep.followParentAddress('10.99.0.5', '10.99.0.6');
  const other = harness();
  await other.ep.start('127.0.0.1:9477');
  await other.ep.followParentAddress('10.99.0.5', '10.99.0.6');
  const gone = harness();
  await gone.ep.start('10.99.0.5:9477');
  await gone.ep.followParentAddress('10.99.0.5', undefined);
  await gone.ep.followParentAddress('10.99.0.5', '10.99.0.5');
  const stopping = harness({ stopping: true });
  await stopping.ep.start('10.99.0.5:9477');
  await stopping.ep.followParentAddress('10.99.0.5', '10.99.0.6');
  const off = harness();
  await off.ep.followParentAddress('10.99.0.5', '10.99.0.6');
  t.same([wild.journal, other.journal, gone.journal, stopping.journal, off.journal],
    [['listen 0.0.0.0:9477'], ['listen 127.0.0.1:9477'], ['listen 10.99.0.5:9477'], ['listen 10.99.0.5:9477'], []]);
});

t.test('an address it cannot bind is logged; the endpoint is then off', async (t) => {
  const h = harness({ failBind: '10.99.0.6' });
  await h.ep.start('10.99.0.5:9477');
  await h.ep.followParentAddress('10.99.0.5', '10.99.0.6');
  t.same(h.journal, ['listen 10.99.0.5:9477', 'close 10.99.0.5:9477']);
  t.equal(h.ep.address, undefined);
  t.same(h.logs.at(-1), { level: 50, msg: "the metrics endpoint could not follow the parent's address" });
});
