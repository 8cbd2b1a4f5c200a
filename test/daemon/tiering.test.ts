// tiering.ts: TurboFan held off for the start's burst (issue 18). The pure
// part (which flags mean the operator chose the tiers) and, in a real node
// process, that the hold does stop V8 from optimizing a hot function and the
// release lets it - so a Node whose V8 ignores the flag fails here instead of
// silently running the start with TurboFan as before.
import t from 'tap';
import * as path from 'node:path';
import { execFileSync } from 'node:child_process';
import { choosesTiers, holdOptimizer } from '../../agent/daemon/tiering';

t.test('flags that choose the tiers are the operator\'s: the hold stays away', async (t) => {
  for (const a of ['--no-opt', '--opt', '--turbofan', '--no-turbofan', '--jitless', '--max-opt=2', '--always_turbofan', '--no-sparkplug', '--maglev', '--lite-mode']) {
    t.ok(choosesTiers(['--max-semi-space-size=1', a]), `${a} chooses the tiers`);
    t.equal(holdOptimizer([a], () => t.fail(`set with ${a}`)), undefined, `no hold with ${a}`);
  }
  for (const a of ['--max-semi-space-size=1', '--expose-gc', '--v8-pool-size=1', '--optimize-for-size', '--perf-basic-prof', '--opt-something-else']) {
    t.notOk(choosesTiers([a]), `${a} does not`);
  }
});

t.test('hold, then release once', async (t) => {
  const set: string[] = [];
  const release = holdOptimizer([], (f) => set.push(f));
  t.same(set, ['--no-turbofan']);
  release!();
  release!();
  t.same(set, ['--no-turbofan', '--turbofan'], 'the second release does nothing');
});

t.test('in a real node: nothing is optimized while held, and optimization resumes after the release', async (t) => {
  const mod = path.resolve(__dirname, '..', '..', 'agent', 'daemon', 'tiering.js');
  const script = `
    const { holdOptimizer } = require(${JSON.stringify(mod)});
    function hot(x) { let s = 0; for (let i = 0; i < 50; i++) s += i * x; return s; }
    const optimized = () => (%GetOptimizationStatus(hot) & 16) !== 0;
    const release = holdOptimizer([]);
    for (let i = 0; i < 300000; i++) hot(i);
    const held = optimized();
    release();
    for (let i = 0; i < 300000 && !optimized(); i++) hot(i);
    console.log(JSON.stringify({ held, after: optimized() }));`;
  const out = JSON.parse(execFileSync(process.execPath, ['--allow-natives-syntax', '-e', script], { encoding: 'utf8', timeout: 30_000 }).trim()) as { held: boolean; after: boolean };
  t.same(out, { held: false, after: true });
});
