// bench/drift.ts, its pure half: a damage's time down runs to the first
// answer after the last failure on every VIP it reaches, only the requests
// started in its window count, the medians leave out rounds that went
// wrong, the timer reference is compared on the kinds both repaired, and the
// timer's restore and phases and the resync's cost are what they say.
import t from 'tap';
import { measureDamage, summarizeDrift, timerVersusAgent, chainNames, restoreScript, damagePhase, cpuPerResync, reaches, DAMAGE_KINDS, type DamageRun } from '../../bench/drift';
import type { ClientResult } from '../../lab/client-loop';

const ok = (at: number, ms = 5): ClientResult => ({ t: at, ms, ok: true, body: 'b1' });
const bad = (at: number, ms = 1): ClientResult => ({ t: at, ms, ok: false, error: 'ECONNREFUSED' });

t.test('down for: from the damage to the end of the first answer after the last failure', async (t) => {
  const loop = [ok(980), ok(1000), bad(1020), bad(1040), ok(1060, 8), ok(1080)];
  t.same(measureDamage([loop], 1010, 2000), { requests: 4, failures: 2, firstFailureMs: 10, downMs: 58 });
});

t.test('nothing failed: the next answer after the damage, first failure unknown', async (t) => {
  const m = measureDamage([[ok(1000), ok(1020, 7), ok(1040)]], 1010, 2000);
  t.equal(m.downMs, 17);
  t.equal(m.failures, 0);
  t.ok(Number.isNaN(m.firstFailureMs));
});

t.test('two VIPs reached: the one back last sets the time down, the first failure of either', async (t) => {
  const dhcp = [bad(1030), ok(1050)];
  const pool = [bad(1020), bad(1040), bad(1060), ok(1100, 10)];
  t.same(measureDamage([dhcp, pool], 1000, 2000), { requests: 6, failures: 4, firstFailureMs: 20, downMs: 110 });
});

t.test('requests outside the window belong to other damages; never served again is unknown, not 0', async (t) => {
  const loop = [bad(900), ok(1000), bad(1100), bad(1120), ok(2100)];
  const m = measureDamage([loop], 1050, 2000);
  t.equal(m.requests, 2);
  t.ok(Number.isNaN(m.downMs), 'no answer inside the window');
});

t.test('which VIPs each kind reaches', async (t) => {
  t.same(reaches('pool-address'), ['pool']);
  t.same(reaches('dhcp-link-del'), ['dhcp']);
  t.same(reaches('flush-ruleset'), ['dhcp', 'pool']);
  t.same(reaches('arp-ignore'), ['dhcp', 'pool'], 'the parent\'s sysctl: both');
});

const run = (who: DamageRun['who'], kind: DamageRun['kind'], round: number, downMs: number, error?: string): DamageRun => ({
  who, kind, round, requests: 50, failures: Math.round(downMs / 20), firstFailureMs: 5, downMs, ...(who === 'agent' ? { repairLoggedMs: downMs - 10 } : { phaseMs: 1000 }), ...(error ? { error } : {}),
});

t.test('medians per kind over the rounds that went as planned, agent rows first in the kinds\' order', async (t) => {
  const rows = summarizeDrift([
    run('timer', 'delete-table', 0, 7500), run('agent', 'pool-address', 0, 50), run('agent', 'delete-table', 0, 80),
    run('agent', 'delete-table', 1, 100), run('agent', 'delete-table', 2, 5000, 'not repaired within 15 s'), run('agent', 'pool-address', 1, 70),
  ]);
  t.same(rows.map((r) => `${r.who}/${r.kind}`), ['agent/delete-table', 'agent/pool-address', 'timer/delete-table']);
  t.match(rows[0], { downMs: 90, worstDownMs: 100, repairLoggedMs: 80, runs: 3, runsOk: 2 });
  t.match(rows[2], { downMs: 7500, runs: 1, runsOk: 1 });
});

t.test('the timer against the agent: only the kinds both repaired', async (t) => {
  const v = timerVersusAgent([
    run('timer', 'delete-table', 0, 7500), run('timer', 'pool-address', 0, 2500), run('timer', 'delete-chain', 0, 6000),
    run('agent', 'delete-table', 0, 80), run('agent', 'pool-address', 0, 50), run('agent', 'dhcp-link-del', 0, 150),
  ]);
  t.same(v.kinds, ['delete-table', 'pool-address'], 'delete-chain has no agent run, dhcp-link-del no timer run');
  t.equal(v.timerMs, 5000);
  t.equal(v.agentMs, 65);
});

t.test('the timer restores the saved table in one transaction, whether or not the table is there', async (t) => {
  const saved = 'table ip lb_agent {\n\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t}\n\tchain svc_1 {\n\t}\n}\n';
  t.same(chainNames(saved), ['prerouting', 'svc_1']);
  t.equal(restoreScript('ip', 'lb_agent', saved), `table ip lb_agent\ndelete table ip lb_agent\n${saved}`);
  t.same(chainNames(''), [], 'no table, no chain');
});

t.test('timer damages are spread over the period, mid-slot', async (t) => {
  t.same([0, 1, 2, 3].map((j) => damagePhase(j, 4, 10_000)), [1250, 3750, 6250, 8750]);
  t.equal(damagePhase(0, 1, 10_000), 5000, 'one damage: mid-period, the mean');
});

t.test('CPU per resync: median of the pairs\' differences over the resyncs, noise left visible', async (t) => {
  t.equal(cpuPerResync([{ withMs: 500, withoutMs: 300 }, { withMs: 700, withoutMs: 300 }, { withMs: 300, withoutMs: 320 }], 10), 20);
  t.equal(cpuPerResync([{ withMs: 300, withoutMs: 400 }], 10), -10);
  t.ok(Number.isNaN(cpuPerResync([], 10)));
  t.ok(Number.isNaN(cpuPerResync([{ withMs: 1, withoutMs: 0 }], 0)));
});

t.test('every kind the issue names is measured', async (t) => {
  t.equal(DAMAGE_KINDS.length, 9);
});
