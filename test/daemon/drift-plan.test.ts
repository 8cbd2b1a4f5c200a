// The drift comparison (agent/daemon/drift-plan.ts) over every kind of
// drift, from kernel snapshots, with no kernel; and the back-off that keeps
// the agent from fighting another program.
import t from 'tap';
import { FightTracker, TableChanges, planDrift, driftSubject, strayMarkedAddresses, type HeldVip, type KernelSnapshot, type ObservedLink } from '../../agent/daemon/drift-plan';

const POOL: HeldVip = { key: 'default/api', address: '10.99.0.200', prefix: 32, ifindex: 2, ifname: 'eth0' };
const DHCP: HeldVip = { key: 'default/web', address: '10.99.0.107', prefix: 32, ifindex: 9, ifname: 'lbv82b3ade9d00c', link: { name: 'lbv82b3ade9d00c', mac: '02:82:B3:AD:E9:D0' } };
const ETH0: ObservedLink = { index: 2, name: 'eth0', mac: 'ba:56:7b:7e:49:2e', up: true };
const MACVLAN: ObservedLink = { index: 9, name: 'lbv82b3ade9d00c', mac: '02:82:b3:ad:e9:d0', up: true };

function snapshot(over: Partial<KernelSnapshot> = {}): KernelSnapshot {
  return {
    links: new Map([[ETH0.name, ETH0], [MACVLAN.name, MACVLAN]]),
    addresses: new Map([[2, new Set(['10.99.0.2/24', '10.99.0.200/32'])], [9, new Set(['10.99.0.107/32'])]]),
    tablesChanged: new Map(),
    sysctls: [
      { ifname: 'eth0', key: 'arp_ignore', role: 'parent', want: 1, got: 1 },
      { ifname: 'eth0', key: 'arp_announce', role: 'parent', want: 2, got: 2 },
    ],
    ...over,
  };
}

t.test('a kernel that holds everything: no drift', async (t) => {
  t.same(planDrift([POOL, DHCP], snapshot()), []);
  t.same(planDrift([], snapshot({ links: new Map(), addresses: new Map() })), [], 'nothing held, nothing owed');
});

t.test('a pool VIP\'s address removed from the parent', async (t) => {
  const d = planDrift([POOL, DHCP], snapshot({ addresses: new Map([[2, new Set(['10.99.0.2/24'])], [9, new Set(['10.99.0.107/32'])]]) }));
  t.same(d.map((x) => [x.kind, driftSubject(x)]), [['address', 'address 10.99.0.200/32']]);
  t.match(d[0]!.found, /VIP 10.99.0.200\/32 of default\/api was removed from eth0/);
});

t.test('a DHCP VIP\'s address removed from its macvlan', async (t) => {
  const d = planDrift([DHCP], snapshot({ addresses: new Map([[9, new Set()]]) }));
  t.same(d.map((x) => x.kind), ['address']);
  t.equal((d[0] as { key: string }).key, 'default/web');
});

t.test('the DHCP macvlan deleted: one link drift, not an address one too', async (t) => {
  const d = planDrift([DHCP], snapshot({ links: new Map([[ETH0.name, ETH0]]), addresses: new Map([[2, new Set(['10.99.0.2/24'])]]) }));
  t.same(d.map((x) => x.kind), ['link']);
  t.match(d[0]!.found, /lbv82b3ade9d00c of default\/web was deleted/);
});

t.test('the DHCP macvlan replaced by a link of another MAC, or made again by someone else', async (t) => {
  const other = { ...MACVLAN, mac: '02:00:00:00:00:01' };
  t.match(planDrift([DHCP], snapshot({ links: new Map([[other.name, other]]) }))[0]!.found, /has MAC 02:00:00:00:00:01.*replaced/);
  const remade = { ...MACVLAN, index: 12 };
  const d = planDrift([DHCP], snapshot({ links: new Map([[remade.name, remade]]) }));
  t.same(d.map((x) => x.kind), ['link']);
  t.match(d[0]!.found, /ifindex 9 -> 12/);
});

t.test('the DHCP macvlan set down', async (t) => {
  const down = { ...MACVLAN, up: false };
  t.same(planDrift([DHCP], snapshot({ links: new Map([[down.name, down]]) })).map((x) => x.kind), ['link-down']);
});

t.test('the parent down or gone is not the agent\'s to repair: only the pool VIP\'s address counts', async (t) => {
  const d = planDrift([POOL], snapshot({ links: new Map([[ETH0.name, { ...ETH0, up: false }]]) }));
  t.same(d, [], 'parent down, address still there');
});

t.test('a table another program changed', async (t) => {
  const d = planDrift([], snapshot({ tablesChanged: new Map([['ip lb_agent', 'deleted by nft (pid 7)']]) }));
  t.same(d, [{ kind: 'table', subject: 'ip lb_agent', found: 'table ip lb_agent: deleted by nft (pid 7)' }]);
});

t.test('a program the path owns beside its tables, undone: table drift that names it a program', async (t) => {
  const d = planDrift([], snapshot({ tablesChanged: new Map([['bpf lb_agent_nat', 'the program is not attached at tcx ingress of eth0']]) }));
  t.same(d, [{ kind: 'table', subject: 'bpf lb_agent_nat', found: 'program bpf lb_agent_nat: the program is not attached at tcx ingress of eth0' }]);
});

t.test('sysctls: one drift an interface, naming every wrong value; unreadable ones are not drift', async (t) => {
  const d = planDrift([], snapshot({
    sysctls: [
      { ifname: 'eth0', key: 'arp_ignore', role: 'parent', want: 1, got: 0 },
      { ifname: 'eth0', key: 'arp_announce', role: 'parent', want: 2, got: 0 },
      { ifname: 'lbv82b3ade9d00c', key: 'rp_filter', role: 'macvlan', want: 2, got: undefined },
    ],
  }));
  t.equal(d.length, 1);
  t.same(d[0], {
    kind: 'sysctl', subject: 'net.ipv4.conf.eth0', ifname: 'eth0', role: 'parent',
    found: 'net.ipv4.conf.eth0.arp_ignore is 0, the agent needs 1; net.ipv4.conf.eth0.arp_announce is 0, the agent needs 2 (ARP flux)',
  });
});

t.test('the fight tracker: repairs are free up to the threshold, then wait, doubling, capped; the window forgets', async (t) => {
  const f = new FightTracker({ windowMs: 60_000, threshold: 3, baseDelayMs: 1000, maxDelayMs: 4000 });
  let now = 0;
  for (let i = 0; i < 3; i++) { t.equal(f.delay('table x', now), 0, `repair ${i + 1} at once`); f.record('table x', now); now += 100; }
  t.same(f.fights(now), [], 'three repairs: not yet a fight');
  t.equal(f.delay('table x', now), 1000 - 100, 'the fourth waits for the base delay after the last repair');
  f.record('table x', now);
  t.same(f.fights(now), [{ subject: 'table x', repairs: 4, windowSeconds: 60 }], 'four: a fight');
  t.equal(f.delay('table x', now), 2000, 'then twice as long');
  f.record('table x', now += 2000);
  t.equal(f.delay('table x', now), 4000);
  f.record('table x', now += 4000);
  t.equal(f.delay('table x', now), 4000, 'capped');
  t.equal(f.delay('address y', now), 0, 'another subject is not held back');
  now += 61_000;
  t.equal(f.delay('table x', now), 0, 'a minute without repairs: free again');
  t.same(f.fights(now), []);
});

t.test('leftovers: an agent macvlan or marked parent address that nothing configured wants', async (t) => {
  const PARENT = { index: 2, name: 'eth0' };
  const STRAY: ObservedLink = { index: 14, name: 'lbv0123456789ab', mac: '02:01:23:45:67:89', up: true };
  const OPERATOR: ObservedLink = { index: 15, name: 'lbv-operator', mac: '02:aa:bb:cc:dd:ee', up: true };
  const NOT_OURS_MAC: ObservedLink = { index: 16, name: 'lbvfedcba987654', mac: 'aa:01:23:45:67:89', up: true };
  const links = new Map([[ETH0.name, ETH0], [MACVLAN.name, MACVLAN], [STRAY.name, STRAY], [OPERATOR.name, OPERATOR], [NOT_OURS_MAC.name, NOT_OURS_MAC]]);
  const marked = new Map([[2, new Set(['10.99.0.200/32', '10.99.0.201/32', '10.99.0.202/32'])]]);
  const wanted = { links: new Set([MACVLAN.name]), addresses: new Map([[2, new Set(['10.99.0.202'])]]) };
  const d = planDrift([POOL, DHCP], snapshot({ links, marked }), wanted, [PARENT]);
  t.same(d.map((x) => [x.kind, driftSubject(x)]), [['leftover', 'leftover link lbv0123456789ab'], ['leftover', 'leftover address 10.99.0.201/32']],
    'the stray agent link and the unexplained marked address; not the held VIP, the claimed address, a link without both marks');
  t.same(d.map((x) => (x.kind === 'leftover' ? x.remove : undefined)), [{ link: 14 }, { ifindex: 2, address: '10.99.0.201', prefix: 32 }]);
  t.match(d[0]!.found, /agent macvlan lbv0123456789ab \(02:01:23:45:67:89\) belongs to no configured service/);
  t.match(d[1]!.found, /10.99.0.201\/32 on eth0 carries the agent's mark and no service holds or claims it there/);
  t.same(planDrift([POOL, DHCP], snapshot({ links, marked })), [], 'without what is wanted, nothing is a leftover');
  t.same(planDrift([POOL], snapshot({ links: new Map([[ETH0.name, ETH0], [MACVLAN.name, MACVLAN]]), marked: new Map([[2, new Set(['10.99.0.200/32'])]]) }), { links: new Set<string>(), addresses: new Map() }, [PARENT])
    .map((x) => x.subject), ['link lbv82b3ade9d00c'], 'a macvlan of a service the config dropped is a leftover; the held pool VIP is not');
});

t.test('leftovers on every network\'s NIC: a marked address is explained by a VIP held on that NIC', async (t) => {
  const ETH1: ObservedLink = { index: 3, name: 'eth1', mac: 'ba:56:7b:7e:49:2f', up: true };
  const POOL_B: HeldVip = { key: 'default/b', address: '10.98.0.200', prefix: 32, ifindex: 3, ifname: 'eth1' };
  const k = snapshot({
    links: new Map([[ETH0.name, ETH0], [ETH1.name, ETH1]]),
    addresses: new Map([[2, new Set(['10.99.0.2/24', '10.99.0.200/32'])], [3, new Set(['10.98.0.2/24', '10.98.0.200/32', '10.98.0.201/32', '10.99.0.200/32'])]]),
    marked: new Map([[2, new Set(['10.99.0.200/32'])], [3, new Set(['10.98.0.200/32', '10.98.0.201/32'])]]),
  });
  const d = planDrift([POOL, POOL_B], k, { links: new Set<string>(), addresses: new Map() }, [{ index: 2, name: 'eth0' }, { index: 3, name: 'eth1' }]);
  t.same(d.map((x) => (x.kind === 'leftover' ? x.remove : x.kind)), [{ ifindex: 3, address: '10.98.0.201', prefix: 32 }], 'the stray on the second NIC goes; each held VIP is explained on its own NIC');
  t.match(d[0]!.found, /10\.98\.0\.201\/32 on eth1 carries the agent's mark/);
  t.same(planDrift([POOL, POOL_B], k, { links: new Set<string>(), addresses: new Map() }, [{ index: 2, name: 'eth0' }]), [], 'a NIC not watched is not looked at');
});

t.test('a claim marked on another network\'s NIC is a leftover there, kept on its own', async (t) => {
  const ETH1: ObservedLink = { index: 3, name: 'eth1', mac: 'ba:56:7b:7e:49:2f', up: true };
  const nics = [{ index: 2, name: 'eth0' }, { index: 3, name: 'eth1' }];
  // vmnet's claim 10.98.0.200 (not held: a Backup, or a source not yet up) and a copy of it marked on eth0.
  const k = snapshot({
    links: new Map([[ETH0.name, ETH0], [ETH1.name, ETH1]]),
    addresses: new Map([[2, new Set(['10.99.0.2/24', '10.99.0.200/32', '10.98.0.200/32'])], [3, new Set(['10.98.0.2/24', '10.98.0.200/32'])]]),
    marked: new Map([[2, new Set(['10.99.0.200/32', '10.98.0.200/32'])], [3, new Set(['10.98.0.200/32'])]]),
  });
  const wanted = { links: new Set<string>(), addresses: new Map([[2, new Set(['10.99.0.200'])], [3, new Set(['10.98.0.200'])]]) };
  const d = planDrift([], k, wanted, nics);
  t.same(d.map((x) => (x.kind === 'leftover' ? x.remove : x.kind)), [{ ifindex: 2, address: '10.98.0.200', prefix: 32 }], 'the copy on eth0 goes; the claim on its own NIC stays');
  t.match(d[0]!.found, /10\.98\.0\.200\/32 on eth0 carries the agent's mark and no service holds or claims it there/);
  // A VIP held on eth1 does not explain its copy on eth0 either.
  const held: HeldVip = { key: 'default/b', address: '10.98.0.200', prefix: 32, ifindex: 3, ifname: 'eth1' };
  t.same(planDrift([held], k, { links: new Set<string>(), addresses: new Map([[2, new Set(['10.99.0.200'])]]) }, nics).map((x) => x.subject), ['address 10.98.0.200/32']);
});

t.test('strayMarkedAddresses: the start\'s adoption and the drift guard decide alike, NIC by NIC', async (t) => {
  const nics = [{ index: 2, name: 'eth0' }, { index: 3, name: 'eth1' }];
  const marked = new Map([[2, ['10.99.0.200/32', '10.99.0.201/32', '10.98.0.200/32']], [3, ['10.98.0.200/32', 'fd00:98::c8/128']]]);
  const explained = new Map([[2, new Set(['10.99.0.200'])], [3, new Set(['10.98.0.200'])]]);
  t.same(strayMarkedAddresses(nics, marked, explained), [
    { ifindex: 2, ifname: 'eth0', cidr: '10.99.0.201/32', address: '10.99.0.201', prefix: 32 },
    { ifindex: 2, ifname: 'eth0', cidr: '10.98.0.200/32', address: '10.98.0.200', prefix: 32 },
    { ifindex: 3, ifname: 'eth1', cidr: 'fd00:98::c8/128', address: 'fd00:98::c8', prefix: 128 },
  ]);
  t.same(strayMarkedAddresses([nics[0]!], marked, new Map()).map((a) => a.cidr), ['10.99.0.200/32', '10.99.0.201/32', '10.98.0.200/32'], 'a NIC with nothing explained: every marked address on it');
  t.same(strayMarkedAddresses([], marked, explained), [], 'a NIC not listed is not looked at');
});

t.test('table changes: a write forgets only what was heard before it began', async (t) => {
  const c = new TableChanges();
  c.note('ip lb_agent', 'deleted by nft (pid 10)');
  const mark = c.mark();
  // Heard while the write was under way: it may have landed after it.
  c.note('ip6 lb_agent', 'deleted by nft (pid 11)');
  c.written(mark);
  t.same([...c.current()], [['ip6 lb_agent', 'deleted by nft (pid 11)']], 'the change heard during the write is kept for the next check');
  const again = c.mark();
  c.written(again);
  t.equal(c.size, 0, 'the next write repairs it');
  c.note('ip lb_agent', 'deleted by nft (pid 12)');
  const m2 = c.mark();
  c.note('ip lb_agent', 'added 1 rule by nft (pid 13)');
  c.written(m2);
  t.ok(c.has('ip lb_agent'), 'a table changed again during the write stays changed');
  t.equal(c.current().get('ip lb_agent'), 'added 1 rule by nft (pid 13)', 'with what was done last');
});

t.test('table changes: a write of some subjects forgets only theirs', async (t) => {
  const c = new TableChanges();
  c.note('ip lb_agent', 'deleted by nft (pid 10)');
  c.note('bpf lb_agent_nat', 'the program is not attached at tcx ingress of eth0');
  const mark = c.mark();
  c.written(mark, ['bpf lb_agent_nat']);
  t.same([...c.current()], [['ip lb_agent', 'deleted by nft (pid 10)']], 'the program put back: the table is still to be written');
  c.written(c.mark(), ['ip lb_agent', 'ip6 lb_agent']);
  t.equal(c.size, 0, 'then the table write');
});
