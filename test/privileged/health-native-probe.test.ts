// Privileged: the native batch TCP prober (agent/health/native-probe.ts) in a
// lab namespace, against a backend in another one - what loopback cannot
// show: SYNs that vanish (nft drop) end as a timeout, by our deadline and
// cancel, with the socket closed and nothing reported twice; a route marked
// unreachable fails at once with EHOSTUNREACH; and the same backend, once its
// packets flow, answers ok; a timed-out probe's socket, kept disconnected,
// connects the next probe to that backend. The prober runs in a small script
// in the node namespace and prints its outcomes as JSON. About 8 s.
import t from 'tap';
import * as path from 'node:path';
import { writeFileSync } from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor, type Lab } from '../../lab/netns';
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

  /** A node namespace and a backend (b1, 10.99.0.11:8080) whose input drops the SYNs to 8080 until `nft delete table inet lbtnp`. */
  const droppingLab = async (t: { teardown(fn: () => unknown): void }): Promise<{ lab: Lab; node: string; b1: string }> => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const b1 = await lab.addHost('b1', { address: '10.99.0.11/24' });
    const backend = await startBackend(lab, b1, 'b1', [8080]);
    t.teardown(() => backend.stop());
    await lab.sh(b1, "nft add table inet lbtnp && nft add chain inet lbtnp in '{ type filter hook input priority 0; }' && nft add rule inet lbtnp in tcp dport 8080 drop");
    return { lab, node, b1 };
  };

  t.test('dropped SYNs time out by our deadline; an unreachable route fails at once; packets flowing again are ok', async (t) => {
    const { lab, node, b1 } = await droppingLab(t);
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

  t.test('a socket kept after its probe timed out (SYN unanswered) connects the next probe once the backend answers', async (t) => {
    const { lab, node, b1 } = await droppingLab(t);
    const gate = lab.file('gate');
    // One prober, two probes to the same backend: the first while its SYNs
    // are dropped, the second after the test lifts the drop (the gate file).
    const code = `
      const fs = require('node:fs');
      const { NativeTcpProber } = require(${JSON.stringify(path.join(DIST, 'agent', 'health', 'native-probe.js'))});
      const out = [];
      const target = { address: '', addressNum: ${ip('10.99.0.11')}, port: 8080 };
      const p = new NativeTcpProber({ onOutcome: (ctx, ok, reason) => {
        out.push({ ctx, ok, reason, stats: p.stats() });
        if (ctx === 0) {
          process.stdout.write('first\\n');
          const wait = setInterval(() => {
            if (!fs.existsSync(${JSON.stringify(gate)})) return;
            clearInterval(wait);
            p.start(target, 2000, 1, performance.timeOrigin + performance.now());
          }, 20);
        } else {
          process.stdout.write(JSON.stringify(out) + '\\n');
          p.close();
        }
      } });
      p.start(target, 500, 0, performance.timeOrigin + performance.now());
    `;
    const child = lab.spawn(node, process.execPath, ['-e', code]);
    t.teardown(() => { child.kill('SIGKILL'); });
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => { stdout += d.toString(); });
    child.stderr!.on('data', (d: Buffer) => { stderr += d.toString(); });
    // waitFor reports the last error on a timeout: the script's output.
    const ready = (done: boolean): true => {
      if (done) return true;
      throw new Error(`stdout: ${stdout}; stderr: ${stderr.slice(0, 2000)}`);
    };
    await waitFor('the first probe\'s timeout', () => ready(stdout.includes('first')), 5000, 20);
    await lab.sh(b1, 'nft delete table inet lbtnp');
    writeFileSync(gate, '');
    await waitFor('the second probe', () => ready(stdout.trim().split('\n').length >= 2), 5000, 20);
    const out = JSON.parse(stdout.trim().split('\n')[1]!) as { ctx: number; ok: boolean; reason?: string; stats: { idle: number; reused: number } }[];
    t.same(out.map((o) => [o.ctx, o.ok, o.reason ?? null]), [[0, false, 'timeout'], [1, true, null]], 'a timeout, then ok');
    t.equal(out[0]!.stats.idle, 1, 'the timed-out probe\'s socket was kept, disconnected');
    t.equal(out[1]!.stats.reused, 1, 'and the next probe to the backend connected it');
  });
}
