// The pure pool acquisition machine: every transition, with time as a number.
import t from 'tap';
import type { AllocationResult } from '../../agent/ipam/allocator';
import {
  initialPoolState, poolStep,
  type PoolAction, type PoolEvent, type PoolMachineConfig, type PoolPhase, type PoolState,
} from '../../agent/ipam/pool-machine';

const CFG: PoolMachineConfig = { probe: true, faultRetryMs: 30_000 };
const NO_PROBE: PoolMachineConfig = { probe: false, faultRetryMs: 30_000 };
const MAC = '52:54:00:ab:cd:ef';

const ok = (address: string, via: 'claim' | 'loadBalancerIP' | 'free' = 'free'): AllocationResult =>
  ({ ok: true, address, pool: 'range-global', via } as AllocationResult);
const fail = (reason: string, message: string, retryAt?: number): AllocationResult =>
  ({ ok: false, reason, message, pool: 'range-global', retryAt } as AllocationResult);

const types = (a: readonly PoolAction[]): string[] => a.filter((x) => x.type !== 'log').map((x) => x.type);

/** Feed events in order from `s`; returns the last step. */
function run(s: PoolState, events: PoolEvent[], now = 0, cfg = CFG) {
  let r = poolStep(s, events[0]!, now, cfg);
  for (const ev of events.slice(1)) r = poolStep(r.state, ev, now, cfg);
  return r;
}

function bound(cfg = CFG, address = '10.99.0.200'): PoolState {
  const events: PoolEvent[] = [{ type: 'start' }, { type: 'allocation', result: ok(address), onParent: false }];
  if (cfg.probe) events.push({ type: 'probe-free' });
  events.push({ type: 'committed' }, { type: 'added' }, { type: 'held' });
  return run(initialPoolState(), events, 0, cfg).state;
}

t.test('start -> allocate -> probe -> commit -> add -> hold -> bound, in that order', async (t) => {
  let r = poolStep(initialPoolState(), { type: 'start' }, 0, CFG);
  t.same([r.state.phase, r.state.source, types(r.actions)], ['allocating', 'acquiring', ['allocate']]);
  t.equal(poolStep(r.state, { type: 'start' }, 0, CFG).reason, 'already-running');
  r = poolStep(r.state, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, 1, CFG);
  t.same([r.state.phase, r.reason, types(r.actions)], ['probing', 'probing', ['probe']]);
  t.match(r.state.reason, /probing 10\.99\.0\.200/);
  r = poolStep(r.state, { type: 'probe-free' }, 2, CFG);
  t.same([r.state.phase, types(r.actions)], ['committing', ['commit']], 'the claim is persisted first');
  t.equal(r.state.onParent, undefined, 'not ours to remove yet');
  r = poolStep(r.state, { type: 'committed' }, 3, CFG);
  t.same([r.state.phase, types(r.actions), r.state.onParent], ['adding', ['add-address'], '10.99.0.200'], 'then the address goes on');
  r = poolStep(r.state, { type: 'added' }, 4, CFG);
  t.same([r.state.phase, types(r.actions)], ['announcing', ['hold']], 'then it is held on the wire');
  t.equal(r.state.source, 'acquiring', 'nobody is told before the first announcement');
  r = poolStep(r.state, { type: 'held' }, 5, CFG);
  t.same([r.state.phase, r.state.source, r.state.reason, types(r.actions)], ['bound', 'bound', undefined, ['up']]);
  t.same(r.actions.find((a) => a.type === 'up'), { type: 'up', address: '10.99.0.200' });
  t.equal(r.state.adopted, false);
});

t.test('VRRP (probe: false): no probe before the claim', async (t) => {
  let r = run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }], 0, NO_PROBE);
  // A takeover puts the address on and out first; the claim's two fsyncs
  // (3-35 ms here) come after the first gratuitous ARP (issue 14).
  t.same([r.state.phase, r.reason, types(r.actions)], ['adding', 'claiming-without-probe', ['add-address']]);
  t.equal(r.state.onParent, '10.99.0.200', 'ours to take off on stop from the moment it is being added');
  r = run(r.state, [{ type: 'added' }, { type: 'held' }], 0, NO_PROBE);
  t.same([r.state.phase, types(r.actions)], ['bound', ['up', 'commit']], 'announced, reported up, then the claim is written');
  t.same(r.actions.find((a) => a.type === 'commit'), { type: 'commit', address: '10.99.0.200' });
  t.same(types(poolStep(r.state, { type: 'committed' }, 0, NO_PROBE).actions), [], 'the write\'s success changes nothing');
  // A write that fails leaves the VIP served and says what is at stake.
  const f = poolStep(r.state, { type: 'fault', what: 'persisting the claim on 10.99.0.200', error: 'EROFS' }, 0, NO_PROBE);
  t.same([f.state, f.reason], [r.state, 'fault']);
  t.match(f.actions, [{ type: 'log', log: { level: 'error', msg: /EROFS; still serving 10\.99\.0\.200, but a restart will not find this claim/ } }]);
  t.equal(bound(NO_PROBE).phase, 'bound');
});

t.test('adoption: on the parent with a matching claim: not probed, announced at once, adopted: true', async (t) => {
  let r = run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200', 'claim'), onParent: true }]);
  t.same([r.state.phase, r.reason, types(r.actions)], ['adding', 'adopting', ['add-address']], 'the claim already names it: no write before serving');
  t.equal(r.state.adopted, true);
  t.equal(r.state.onParent, '10.99.0.200', 'ours to take off on stop, even before it is held');
  t.ok(r.actions.some((a) => a.type === 'log' && a.log.op === 'adopt'));
  r = run(r.state, [{ type: 'added' }, { type: 'held' }]);
  t.same([r.state.phase, r.state.adopted, types(r.actions)], ['bound', true, ['up', 'commit']]);

  // On the parent but not from a claim (loadBalancerIP, or another claim): probed like any address.
  const p = run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200', 'loadBalancerIP'), onParent: true }]);
  t.same([p.state.phase, p.state.adopted, p.state.onParent], ['probing', false, '10.99.0.200']);
  // ... and found in use: taken off again.
  const c = poolStep(p.state, { type: 'probe-conflict', mac: MAC }, 1, CFG);
  t.same(types(c.actions), ['mark-conflict', 'remove-address', 'allocate']);
  t.equal(c.state.onParent, undefined);
});

t.test('probe conflict: mark the address, count it, allocate another', async (t) => {
  const p = run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }]);
  const r = poolStep(p.state, { type: 'probe-conflict', mac: MAC }, 1000, CFG);
  t.same(r.actions.filter((a) => a.type !== 'log'), [
    { type: 'mark-conflict', address: '10.99.0.200', mac: MAC, counted: false },
    { type: 'allocate' },
  ]);
  t.same([r.state.phase, r.state.source, r.state.conflicts], ['allocating', 'acquiring', 1]);
  t.match(r.state.reason, /10\.99\.0\.200 is in use by 52:54:00:ab:cd:ef; trying another address/);
  t.same(r.state.lastConflict, { address: '10.99.0.200', mac: MAC, at: 1000, defended: false, phase: 'probe' });
});

t.test('exhausted or taken: pending until the pool changes (or the conflict back-off ends)', async (t) => {
  const a = poolStep(initialPoolState(), { type: 'start' }, 0, CFG).state;
  let r = poolStep(a, { type: 'allocation', result: fail('exhausted', 'pool range-global is exhausted'), onParent: false }, 0, CFG);
  t.same([r.state.phase, r.state.source, r.state.reason, r.reason], ['waiting', 'pending', 'pool range-global is exhausted', 'pending']);
  t.same(r.actions.filter((x) => x.type === 'wait'), [{ type: 'wait', until: undefined, onChange: true }]);
  t.ok(r.actions.some((x) => x.type === 'log' && x.log.level === 'warn'), 'logged once');
  t.equal(poolStep(r.state, { type: 'timer' }, 1e9, CFG).reason, 'ignored', 'no timer without a retry time');
  const again = poolStep(poolStep(r.state, { type: 'changed' }, 1, CFG).state, { type: 'allocation', result: fail('exhausted', 'pool range-global is exhausted'), onParent: false }, 2, CFG);
  t.notOk(again.actions.some((x) => x.type === 'log'), 'the same reason is not logged again');
  r = poolStep(r.state, { type: 'changed' }, 1, CFG);
  t.same([r.state.phase, types(r.actions)], ['allocating', ['allocate']], 'a pool change wakes it');

  const w = poolStep(a, { type: 'allocation', result: fail('taken', 'all held back by conflicts', 5000), onParent: false }, 0, CFG);
  t.same(w.actions.filter((x) => x.type === 'wait'), [{ type: 'wait', until: 5000, onChange: true }], 'until the conflict back-off ends');
  t.same(types(poolStep(w.state, { type: 'timer' }, 4000, CFG).actions), ['wait'], 'an early timer re-arms');
  t.same(types(poolStep(w.state, { type: 'timer' }, 5000, CFG).actions), ['allocate']);
});

t.test('no pool / outside the pool: failed, retried after faultRetryMs', async (t) => {
  const a = poolStep(initialPoolState(), { type: 'start' }, 0, CFG).state;
  const r = poolStep(a, { type: 'allocation', result: fail('no-pool', 'no pool for namespace default'), onParent: false }, 100, CFG);
  t.same([r.state.source, r.reason], ['failed', 'failed']);
  t.same(r.actions.filter((x) => x.type === 'wait'), [{ type: 'wait', until: 30_100, onChange: true }]);
  t.ok(r.actions.some((x) => x.type === 'log' && x.log.level === 'error'));
});

t.test('rate limit (RFC 5227 §2.1.1): pending for the delay; a pool change does not end it', async (t) => {
  const a = poolStep(initialPoolState(), { type: 'start' }, 0, CFG).state;
  const r = poolStep(a, { type: 'rate-limited', delayMs: 60_000 }, 10, CFG);
  t.same([r.state.phase, r.state.source], ['waiting', 'pending']);
  t.match(r.state.reason, /rate-limited .* next attempt in 60 s/);
  t.same(r.actions, [{ type: 'wait', until: 60_010, onChange: false }]);
  t.equal(poolStep(r.state, { type: 'changed' }, 20, CFG).reason, 'ignored');
  t.same(types(poolStep(r.state, { type: 'timer' }, 60_010, CFG).actions), ['allocate']);
});

t.test('bound: defend once (counted), give up on the second conflict and allocate another', async (t) => {
  const b = bound();
  const d = poolStep(b, { type: 'conflict', mac: MAC, defended: true }, 1000, CFG);
  t.same(types(d.actions), ['note-conflict']);
  t.same([d.state.phase, d.state.conflicts, d.state.defences], ['bound', 1, 1]);
  t.same(d.state.lastConflict, { address: '10.99.0.200', mac: MAC, at: 1000, defended: true, phase: 'defend' });
  const nd = poolStep(d.state, { type: 'conflict', mac: MAC, defended: false }, 1500, CFG);
  t.same([nd.state.phase, nd.state.conflicts, nd.state.defences, types(nd.actions)], ['bound', 2, 1, ['note-conflict']], 'an unanswered conflict (RFC 5227 §2.4 (c)) is counted, the address kept');
  const l = poolStep(d.state, { type: 'lost', mac: MAC }, 2000, CFG);
  t.same(l.actions.filter((a) => a.type !== 'log'), [
    { type: 'unhold' },
    { type: 'note-conflict', address: '10.99.0.200' },
    { type: 'mark-conflict', address: '10.99.0.200', mac: MAC, counted: true },
    { type: 'down', reason: `address conflict: ${MAC} uses 10.99.0.200`, cause: 'conflict' },
    { type: 'remove-address', address: '10.99.0.200' },
    { type: 'allocate' },
  ], 'stop announcing, count once, keep it away, tell the daemon, take it off, find another');
  t.same([l.state.phase, l.state.source, l.state.conflicts, l.state.defences, l.state.onParent], ['allocating', 'acquiring', 2, 1, undefined]);
  t.match(l.state.reason, /gave up 10\.99\.0\.200: 52:54:00:ab:cd:ef uses it too/);
  const next = run(l.state, [{ type: 'allocation', result: ok('10.99.0.201'), onParent: false }, { type: 'probe-free' }, { type: 'committed' }, { type: 'added' }, { type: 'held' }]);
  t.same([next.state.phase, next.state.address, next.state.conflicts], ['bound', '10.99.0.201', 2], 'counters survive the move');
});

t.test('faults: each phase undoes its own step, then failed and retried', async (t) => {
  const cases: Array<[string, PoolEvent[], string[]]> = [
    ['allocating', [{ type: 'start' }], []],
    ['probing', [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }], ['unreserve']],
    ['committing', [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, { type: 'probe-free' }], ['unreserve']],
    ['adding', [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, { type: 'probe-free' }, { type: 'committed' }], []],
    ['announcing', [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, { type: 'probe-free' }, { type: 'committed' }, { type: 'added' }], ['unhold', 'remove-address']],
  ];
  for (const [phase, events, undo] of cases) {
    const s = run(initialPoolState(), events).state;
    t.equal(s.phase, phase);
    const r = poolStep(s, { type: 'fault', what: 'adding 10.99.0.200/32 to eth0', error: 'EPERM' }, 500, CFG);
    t.same(types(r.actions), [...undo, 'reset-socket', 'wait'], `${phase}: undo, then wait`);
    t.same([r.state.phase, r.state.source, r.state.reason, r.state.onParent], ['waiting', 'failed', 'adding 10.99.0.200/32 to eth0: EPERM', undefined]);
    t.same(r.actions.find((a) => a.type === 'wait'), { type: 'wait', until: 30_500, onChange: true });
    t.ok(r.actions.some((a) => a.type === 'log' && a.log.level === 'error'));
    t.same(types(poolStep(r.state, { type: 'timer' }, 30_500, CFG).actions), ['allocate'], `${phase}: retried`);
  }
  const b = bound();
  const fb = poolStep(b, { type: 'fault', what: 'x', error: 'y' }, 0, CFG);
  t.same([fb.state, fb.reason, types(fb.actions)], [b, 'fault', []], 'bound: only a late claim write can fail, and the VIP stays');
});

t.test('stop: withdraw what is ours, release the hold (and the claim when removed)', async (t) => {
  const b = bound();
  const r = poolStep(b, { type: 'stop', release: false }, 0, CFG);
  t.same(r.actions, [{ type: 'unhold' }, { type: 'remove-address', address: '10.99.0.200' }, { type: 'release', deleteClaim: false }, { type: 'down', reason: 'stopped', cause: 'stopped' }]);
  t.same([r.state.phase, r.state.source, r.state.address], ['stopped', 'idle', undefined]);
  t.equal(r.state.conflicts, 0);
  const rel = poolStep(b, { type: 'stop', release: true }, 0, CFG);
  t.same(rel.actions.slice(-2), [{ type: 'release', deleteClaim: true }, { type: 'down', reason: 'released', cause: 'released' }]);
  t.equal(poolStep(r.state, { type: 'stop', release: false }, 0, CFG).reason, 'not-running');

  // Mid-acquisition: nothing was up, so nothing is reported lost.
  const probing = run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }]).state;
  t.same(poolStep(probing, { type: 'stop', release: false }, 0, CFG).actions, [{ type: 'release', deleteClaim: false }]);
  const adding = run(probing, [{ type: 'probe-free' }, { type: 'committed' }]).state;
  t.same(poolStep(adding, { type: 'stop', release: false }, 0, CFG).actions, [{ type: 'remove-address', address: '10.99.0.200' }, { type: 'release', deleteClaim: false }]);
  const announcing = poolStep(adding, { type: 'added' }, 0, CFG).state;
  t.same(types(poolStep(announcing, { type: 'stop', release: false }, 0, CFG).actions), ['unhold', 'remove-address', 'release']);

  // Counters survive a stop and start.
  const d = poolStep(b, { type: 'conflict', mac: MAC, defended: true }, 0, CFG).state;
  const again = run(d, [{ type: 'stop', release: false }, { type: 'start' }]);
  t.same([again.state.phase, again.state.conflicts, again.state.defences], ['allocating', 1, 1]);
});

t.test('events that do not apply in a phase change nothing', async (t) => {
  const phases: Record<PoolPhase, PoolState> = {
    stopped: initialPoolState(),
    allocating: run(initialPoolState(), [{ type: 'start' }]).state,
    waiting: run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: fail('exhausted', 'x'), onParent: false }]).state,
    probing: run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }]).state,
    committing: run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, { type: 'probe-free' }]).state,
    adding: run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, { type: 'probe-free' }, { type: 'committed' }]).state,
    announcing: run(initialPoolState(), [{ type: 'start' }, { type: 'allocation', result: ok('10.99.0.200'), onParent: false }, { type: 'probe-free' }, { type: 'committed' }, { type: 'added' }]).state,
    bound: bound(),
  };
  const applies: Record<string, PoolPhase[]> = {
    'rate-limited': ['allocating'], allocation: ['allocating'], timer: ['waiting'], changed: ['waiting'],
    'probe-free': ['probing'], 'probe-conflict': ['probing'], committed: ['committing'], added: ['adding'], held: ['announcing'],
    conflict: ['bound'], lost: ['bound'], fault: ['allocating', 'probing', 'committing', 'adding', 'announcing', 'bound'],
  };
  const events: PoolEvent[] = [
    { type: 'rate-limited', delayMs: 1 }, { type: 'allocation', result: ok('10.99.0.9'), onParent: false }, { type: 'timer' }, { type: 'changed' },
    { type: 'probe-free' }, { type: 'probe-conflict', mac: MAC }, { type: 'committed' }, { type: 'added' }, { type: 'held' },
    { type: 'conflict', mac: MAC, defended: true }, { type: 'lost', mac: MAC }, { type: 'fault', what: 'x', error: 'y' },
  ];
  let checked = 0;
  for (const [phase, s] of Object.entries(phases) as Array<[PoolPhase, PoolState]>) {
    for (const ev of events) {
      if (applies[ev.type]!.includes(phase)) continue;
      const r = poolStep(s, ev, 1e12, CFG);
      if (r.state !== s || r.actions.length > 0) t.fail(`${ev.type} in ${phase} changed something`);
      checked++;
    }
  }
  t.ok(checked > 60, `${checked} inapplicable (phase, event) pairs leave the state alone`);
});
