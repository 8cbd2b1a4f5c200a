// bench/families-cost.ts (pure parts): the variants of the agent's table
// are each the table less one part and nothing else, a table without that
// part is refused rather than measured as if it had it, and perf's
// inclusive shares are read per symbol.
import t from 'tap';
import { childrenShares, costTable, costVariants, type CostRun } from '../../bench/families-cost';

/** The agent's table as `nft list table` prints it (the lab's VIPs; counters, sets and backend chains cut). */
const chains = (ip: 'ip' | 'ip6', vip: string): string => [
  `table ${ip} lb_agent {`,
  '\tset vips {', `\t\ttype ${ip === 'ip' ? 'ipv4_addr' : 'ipv6_addr'}`, `\t\telements = { ${vip} }`, '\t}',
  '\tchain prerouting {', '\t\ttype nat hook prerouting priority dstnat; policy accept;', `\t\tfib daddr type local ${ip} daddr . meta l4proto . th dport vmap @services`, '\t}',
  '\tchain output {', '\t\ttype nat hook output priority -100; policy accept;', `\t\tfib daddr type local ${ip} daddr . meta l4proto . th dport vmap @services`, '\t}',
  '\tchain forward {', '\t\ttype filter hook forward priority filter; policy accept;',
  `\t\tct direction original counter name ct original ${ip} daddr . ${ip} daddr . meta l4proto . th dport map @to_backend`,
  `\t\tct direction reply counter name ct original ${ip} daddr . ${ip} saddr . meta l4proto . th sport map @to_client`, '\t}',
  '}', '',
].join('\n');
const table = chains('ip', '10.99.0.50') + chains('ip6', 'fd00:99::50');

const lines = (s: string): string[] => s.split('\n').filter((l) => l.trim() !== '');
const missing = (a: string, b: string): string[] => { const kept = new Set(lines(b)); return lines(a).filter((l) => !kept.has(l)); };

t.test('each variant is the agent\'s table at the node\'s address less one part', async (t) => {
  const v = costVariants(table);
  t.notOk(v.agent.includes('10.99.0.50') || v.agent.includes('fd00:99::50'), 'no VIP left: the table answers at the node\'s own addresses');
  t.match(v.agent, /elements = \{ 10\.99\.0\.10 \}/);
  t.match(v.agent, /elements = \{ fd00:99::10 \}/);
  t.equal(lines(v.agent).length, lines(table).length, 'the table itself unchanged otherwise');
  const gone = missing(v.agent, v['no-forward']);
  t.equal(gone.length, 4, 'no-forward: the two byte-counter rules of each family, nothing else');
  t.ok(gone.every((l) => /^\s*ct direction (original|reply) counter name /.test(l)));
  t.equal(lines(v['no-forward']).length, lines(v.agent).length - 4);
  t.equal(missing(v.agent, v['no-fib']).length, 4, 'no-fib: the prerouting and output rules of each family changed');
  t.equal(lines(v['no-fib']).length, lines(v.agent).length, 'the rules stay, without the check');
  t.notMatch(v['no-fib'], /fib daddr/);
  t.match(v['no-fib'], /^\s*ip6 daddr \. meta l4proto \. th dport vmap @services$/m);
  t.match(v.floor, /table ip6 lb_floor \{/, 'the floor is the families bench\'s own table');
});

t.test('a table without the parts a variant removes is refused', async (t) => {
  t.throws(() => costVariants(table.replace(/^\s*ct direction reply .*$/gm, '')), /forward rules/);
  t.throws(() => costVariants(table.split('fib daddr type local ').join('')), /fib checks/);
});

t.test('perf report --children: the first (inclusive) share of each symbol', async (t) => {
  const report = [
    '# Samples: 15K of event \'cpu-clock:pppH\'',
    '     3.67%     0.14%  [k] nf_hook_slow',
    '     1.01%     0.09%  [k] nft_do_chain_ipv4',
    '     0.48%     0.18%  [k] packet_rcv',
    '     0.20%     0.20%  [.] Builtins_LoadIC',
    '     0.10%     0.01%  [k] nf_hook_slow',
  ].join('\n');
  const s = childrenShares(report);
  t.equal(s.get('nf_hook_slow'), 3.67);
  t.equal(s.get('nft_do_chain_ipv4'), 1.01);
  t.equal(s.get('packet_rcv'), 0.48);
  t.equal(s.get('Builtins_LoadIC'), 0.2);
  t.equal(s.size, 4);
});

t.test('the report: medians per variant and kind, IPv6 less IPv4 paired by round', async (t) => {
  const run = (round: number, family: 'v4' | 'v6', hooksUs: number): CostRun => ({ round, variant: 'agent', kind: 'keepalive', family, rps: family === 'v4' ? 1000 : 900, requests: 3000, hooksUs, filterUs: 0.4, tapUs: family === 'v6' ? 0.1 : 0 });
  const out = costTable([run(0, 'v4', 1.0), run(0, 'v6', 1.5), run(1, 'v4', 2.0), run(1, 'v6', 2.1), run(2, 'v4', 1.2), run(2, 'v6', 1.4), run(3, 'v4', 1.2), run(3, 'v6', NaN)]).split('\n');
  t.equal(out.length, 3, 'a header, its rule, and the one variant and kind measured');
  t.equal(out[2], '| agent | keep-alive | 1.20 | 1.50 | 0.20 | 0.40 | 0.40 | 0.00 | 0.10 | 1000 | 900 | 3 |', 'a run perf read nothing in (NaN) is left out, and its pair with it');
});
