// Privileged: the native batch TCP prober (agent/health/native-probe.ts) in a
// lab namespace, against a backend in another one - what loopback cannot
// show: SYNs that vanish (nft drop) end as a timeout, by our deadline and
// cancel, with the socket closed and nothing reported twice; a route marked
// unreachable fails at once with EHOSTUNREACH; and the same backend, once its
// packets flow, answers ok. The prober runs in a small script in the node
// namespace and prints its outcomes as JSON. About 5 s.
import t from 'tap';
import * as path from 'node:path';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { startBackend } from '../../lab/services';

const DIST = path.resolve(__dirname, '..', '..');

/** Node code run in a namespace: probes each target once, prints outcomes and the prober's stats. */
function script(targets: { addressNum: number; port: number; timeoutMs: number }[]): string {
  return `
    const { NativeTcpProber } = require(${JSON.stringify(path.join(DIST, 'agent', 'health', 'native-probe.js'))});
    const out = [];
    const p = new NativeTcpProber({ onOutcome: (ctx, ok, reason, detail, durationMs) => {
      out.push({ ctx, ok, reason, detail, durationMs: Math.round(durationMs) });
      if (out.length === ${targets.length}) setTimeout(() => {
        process.stdout.write(JSON.stringify({ out, stats: p.stats() }));
        p.close();
      }, 300);
    } });
    const targets = ${JSON.stringify(targets)};
    const now = performance.timeOrigin + performance.now();
    targets.forEach((x, i) => p.start({ address: '', addressNum: x.addressNum, port: x.port }, x.timeoutMs, i, now));
  `;
}

interface Outcome { ctx: number; ok: boolean; reason?: string; detail?: string; durationMs: number }

if (requirePrivileged(t)) {
  const ip = (a: string): number => a.split('.').reduce((n, o) => n * 256 + Number(o), 0);

  t.test('dropped SYNs time out by our deadline; an unreachable route fails at once; packets flowing again are ok', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const b1 = await lab.addHost('b1', { address: '10.99.0.11/24' });
    const backend = await startBackend(lab, b1, 'b1', [8080]);
    t.teardown(() => backend.stop());
    await lab.sh(b1, "nft add table inet lbtnp && nft add chain inet lbtnp in '{ type filter hook input priority 0; }' && nft add rule inet lbtnp in tcp dport 8080 drop");
    await lab.sh(node, 'ip route add unreachable 10.98.0.0/24');
    const run = async (targets: Parameters<typeof script>[0]): Promise<{ out: Outcome[]; stats: { connecting: number; inFlight: number } }> => {
      const r = await lab.exec(node, process.execPath, ['-e', script(targets)], { timeoutMs: 20_000 });
      return JSON.parse(r.stdout) as { out: Outcome[]; stats: { connecting: number; inFlight: number } };
    };

    const dropped = await run([
      { addressNum: ip('10.99.0.11'), port: 8080, timeoutMs: 700 },
      { addressNum: ip('10.98.0.5'), port: 8080, timeoutMs: 3000 },
    ]);
    const byCtx = new Map(dropped.out.map((o) => [o.ctx, o]));
    t.equal(dropped.out.length, 2, 'one outcome per probe, none twice');
    const timeout = byCtx.get(0)!;
    t.same([timeout.ok, timeout.reason, timeout.detail], [false, 'timeout', 'no connection within 700 ms']);
    t.ok(timeout.durationMs >= 690 && timeout.durationMs < 2000, `timed out by our deadline (${timeout.durationMs} ms)`);
    const unreachable = byCtx.get(1)!;
    t.same([unreachable.ok, unreachable.reason, unreachable.detail], [false, 'unreachable', 'EHOSTUNREACH']);
    t.ok(unreachable.durationMs < 500, `at once (${unreachable.durationMs} ms), not after the 3 s timeout`);
    t.equal(dropped.stats.connecting, 0, 'the timed-out socket was closed (cancel)');
    t.equal(dropped.stats.inFlight, 0);

    await lab.sh(b1, 'nft delete table inet lbtnp');
    const flowing = await run([{ addressNum: ip('10.99.0.11'), port: 8080, timeoutMs: 700 }]);
    t.same(flowing.out.map((o) => [o.ok, o.reason]), [[true, undefined]], 'the same backend answers once its packets flow');
  });
}
