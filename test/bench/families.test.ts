// bench/families.ts (pure parts) and its lines in bench/lib/report.ts: the
// table shows each path's IPv6 against IPv4, and each ratio is judged
// against the 0.95x target (shown, never asserted).
import t from 'tap';
import { familiesTable, natFloorScript, type FamiliesResult } from '../../bench/families';
import { evaluateTargets, type BenchResults } from '../../bench/lib/report';

const result: FamiliesResult = {
  config: { rounds: 1, seconds: 1, warmup: 0, connections: 1, threads: 1, pairs: 1, wrk: 'wrk', backends: 'nginx', pairing: 'paired' },
  summary: [
    { path: 'kernel', keepalive: { v4: 70000, v6: 69000, xIPv4: 0.986 }, newConnections: { v4: 8000, v6: 7000, xIPv4: 0.875 }, errors: 0, pairs: 2 },
    { path: 'proxy', keepalive: { v4: 60000, v6: 60000, xIPv4: NaN }, newConnections: { v4: 5000, v6: 5000, xIPv4: 1 }, errors: 3, pairs: 2 },
    { path: 'dsr', keepalive: { v4: 100000, v6: 90000, xIPv4: 0.9 }, newConnections: { v4: 18000, v6: 17500, xIPv4: 0.972 }, errors: 0, pairs: 2 },
    { path: 'direct', keepalive: { v4: 50000, v6: 47000, xIPv4: 0.94 }, newConnections: { v4: 9000, v6: 8400, xIPv4: 0.933 }, errors: 0, pairs: 2 },
    { path: 'routed', keepalive: { v4: 40000, v6: 36000, xIPv4: 0.9 }, newConnections: { v4: 8000, v6: 7200, xIPv4: 0.9 }, errors: 0, pairs: 2 },
    { path: 'nat', keepalive: { v4: 38000, v6: 35000, xIPv4: 0.921 }, newConnections: { v4: 7600, v6: 7000, xIPv4: 0.921 }, errors: 0, pairs: 2 },
  ],
  raw: [], errors: [],
};

t.test('the table: a row per path, both families and the ratio', async (t) => {
  const lines = familiesTable(result).split('\n');
  t.equal(lines.length, 8);
  t.equal(lines[7], '| nat | 38000 | 35000 | 0.921x | 7600 | 7000 | 0.921x | 0 | 2 |', 'the floor: conntrack and NAT by a hand-written table, no agent');
  t.equal(lines[6], '| routed | 40000 | 36000 | 0.900x | 8000 | 7200 | 0.900x | 0 | 2 |', 'the floor: no agent, the backend through the node as a plain router');
  t.equal(lines[5], '| direct | 50000 | 47000 | 0.940x | 9000 | 8400 | 0.933x | 0 | 2 |', 'the floor: no agent, the client straight to a backend');
  t.equal(lines[4], '| dsr | 100000 | 90000 | 0.900x | 18000 | 17500 | 0.972x | 0 | 2 |', 'direct server return, each family\'s VIP to its own backends');
  t.equal(lines[2], '| kernel | 70000 | 69000 | 0.986x | 8000 | 7000 | 0.875x | 0 | 2 |');
  t.match(lines[3], /^\| proxy \| 60000 \| 60000 \| NaNx \| 5000 \| 5000 \| 1\.000x \| 3 \| 2 \|$/);
});

t.test('targets: IPv6 at least 0.95x IPv4 per path and kind; a ratio not measured is neither met nor missed; the floors are no target', async (t) => {
  const rows = evaluateTargets({ families: result } as unknown as BenchResults).filter((r) => r.area === 'families');
  t.same(rows.map((r) => [r.target, r.met]), [
    ['kernel path IPv6 keep-alive req/s >= 0.95x IPv4', true],
    ['kernel path IPv6 new connections/s >= 0.95x IPv4', false],
    ['proxy path IPv6 keep-alive req/s >= 0.95x IPv4', undefined],
    ['proxy path IPv6 new connections/s >= 0.95x IPv4', true],
    ['dsr path IPv6 keep-alive req/s >= 0.95x IPv4', false],
    ['dsr path IPv6 new connections/s >= 0.95x IPv4', true],
  ]);
});

t.test("the nat floor's tables: each family's, the node's port 80 to the three backends' 8080 in turn, SNAT to the node; off removes both", async (t) => {
  const on = natFloorScript(true);
  t.match(on, /table ip lb_floor \{[^]*ip daddr 10\.99\.0\.10 tcp dport 80 numgen inc mod 3 vmap \{ 0 : goto b0, 1 : goto b1, 2 : goto b2 \}/, 'IPv4: round robin from the node\'s address');
  t.match(on, /chain b2 \{ meta l4proto tcp dnat to \[fd00:99::13\]:8080; \}/, 'IPv6: the backend in brackets with its port');
  t.match(on, /table ip6 lb_floor \{[^]*ct status dnat snat to fd00:99::10/, 'IPv6: answered from the node');
  t.notMatch(on, /fib|counter|@/, 'no fib check, no counters, no named maps');
  const off = natFloorScript(false);
  t.same(off.trim().split('\n'), ['table ip lb_floor {}', 'delete table ip lb_floor', 'table ip6 lb_floor {}', 'delete table ip6 lb_floor'], 'off: both removed, whether or not they exist');
});
