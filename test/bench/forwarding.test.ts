// bench/forwarding.ts (pure parts): keep-alive "x direct" from the direct run
// paired with each slot is the median of the per-pair ratios (issue 17), not
// a ratio of medians that one swinging direct round can move.
import t from 'tap';
import { pairedRatio } from '../../bench/forwarding';
import type { WrkResult } from '../../bench/lib/load';

const wrk = (rps: number): WrkResult => ({ rps } as WrkResult);

t.test('the median of per-pair ratios follows each pair, whatever direct did in other rounds', async (t) => {
  // Direct swings 95k / 73k / 53k; the target tracks it at 0.8 / 0.9 / 0.85 in its own pairs.
  const samples = [
    { keepalive: wrk(76_000), directKeepalive: wrk(95_000) },
    { keepalive: wrk(65_700), directKeepalive: wrk(73_000) },
    { keepalive: wrk(45_050), directKeepalive: wrk(53_000) },
  ];
  t.same(pairedRatio(samples), { xDirect: 0.85 });
  // The ratio of medians would have said 65,700 / 73,000 = 0.9: a different number from the same runs.
});

t.test('no pairs (direct itself, direct not in the run, older results): no paired ratio', async (t) => {
  t.same(pairedRatio([{ keepalive: wrk(50_000) }]), {});
  t.same(pairedRatio([]), {});
  t.same(pairedRatio([{ keepalive: wrk(50_000), directKeepalive: wrk(0) }]), {}, 'a direct run that served nothing is no pair');
});
