// Unit: the drift repair of forward/ebpf-nat.ts with a fake nft data path and
// a fake engine (pure: what each repair writes, and what it leaves alone).
import t from 'tap';
import { EbpfNatDataplane, NAT_ENGINE_SUBJECT } from '../../agent/forward/ebpf-nat';
import type { NftDataplane } from '../../agent/forward/nft';
import type { NatEngine } from '../../agent/net/ebpf/nat-attach';
import type { NatPlan } from '../../agent/forward/nat-plan';

interface Fakes {
  dp: EbpfNatDataplane;
  calls: string[];
  engine: { drift: string | undefined; active: boolean; failApply: boolean };
}

function fakes(): Fakes {
  const calls: string[] = [];
  const engine = { drift: undefined as string | undefined, active: false, failApply: false };
  const nft = {
    apply: () => { calls.push('nft.apply'); return Promise.resolve(); },
    repair: () => { calls.push('nft.repair'); return Promise.resolve(true); },
    ownedTables: () => ['ip lb_agent'],
    viewStatsThrough: () => undefined,
  } as unknown as NftDataplane;
  const eng = {
    device: 'eth0',
    get active() { return engine.active; },
    drift: () => engine.drift,
    apply: (plan: NatPlan, opts?: { reload?: boolean }) => {
      calls.push(`engine.apply(${plan.services.length}${opts?.reload ? ', reload' : ''})`);
      if (engine.failApply) throw new Error('EPERM');
      engine.active = true;
      engine.drift = undefined;
      return { mode: opts?.reload ? 'load' : 'delta', ports: 0, writes: 0 };
    },
    detach: () => { calls.push('engine.detach'); engine.active = false; return 1; },
    release: () => undefined,
  } as unknown as NatEngine;
  return { dp: new EbpfNatDataplane({ nft, engine: eng }), calls, engine };
}

t.test('a drifted table is written again alone: the engine is not touched', async (t) => {
  const { dp, calls, engine } = fakes();
  await dp.apply({ services: [] });
  calls.length = 0;
  t.equal(await dp.repair(), true);
  t.same(calls, ['nft.repair'], 'only the table');
  t.equal(engine.active, true);
});

t.test('a drifted program is attached again alone: the table is not written', async (t) => {
  const { dp, calls, engine } = fakes();
  await dp.apply({ services: [] });
  calls.length = 0;
  engine.drift = 'the program is not attached at tcx ingress of eth0';
  t.equal(await dp.repairProgram(NAT_ENGINE_SUBJECT), 'attached the eBPF NAT engine again with its maps and plan (the nft table not written)');
  t.same(calls, ['engine.apply(0, reload)'], 'only the engine, a program loaded with the plan in force');
  t.equal(dp.engineState.engine, 'ebpf');
  t.match(await dp.repairProgram(NAT_ENGINE_SUBJECT), /^nothing to put back \(the engine is whole again\)$/, 'asked again with nothing drifted: nothing done, and said');
  t.same(calls, ['engine.apply(0, reload)'], 'no second apply');
  t.equal(await dp.repairProgram('bpf something_else'), undefined, 'a subject not its own: not repaired');
});

t.test('a program that cannot be put back is detached: the table forwards alone, and status says why', async (t) => {
  const { dp, calls, engine } = fakes();
  await dp.apply({ services: [] });
  calls.length = 0;
  engine.drift = '/sys/fs/bpf/lb-agent/nat-eth0/lbn_flows is gone';
  engine.failApply = true;
  t.match(await dp.repairProgram(NAT_ENGINE_SUBJECT), /^could not attach the eBPF NAT engine again \(EPERM\): detached, the nft table forwards alone$/);
  t.same(calls, ['engine.apply(0, reload)', 'engine.detach'], 'tried, then detached; the table not written');
  t.same(dp.engineState, { engine: 'nft', reason: 'fallback: repair failed: EPERM' });
  t.match(await dp.repairProgram(NAT_ENGINE_SUBJECT), /nothing to put back \(the nft table forwards alone\)/, 'the next check finds nothing to put back');
});
