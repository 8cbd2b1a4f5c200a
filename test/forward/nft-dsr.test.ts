// Direct server return's rendering (forward/nft-dsr.ts, through renderNft):
// the netdev table as golden text, its dispatch key (the VIP interface's MAC),
// what the ip table keeps for a DSR port (drop stray packets, or refuse when
// no backend is healthy), the seed that survives rewrites, and the problems
// reported instead of forwarding. Loading it into a real kernel and sending
// traffic through it is test/privileged/forward-dsr.test.ts.
import t from 'tap';
import { goldenText, sourcePath } from '../helpers/golden';
import type { BackendSpec, PortSpec } from '../../agent/config/types';
import { parseIPv4 } from '../../agent/address';
import type { ForwardState } from '../../agent/forward/dataplane';
import { hasDsrTable, renderNft } from '../../agent/forward/nft';
import { DSR_KERNEL_OPTIONS, DSR_PROBE_RULESET, dsrSeed } from '../../agent/forward/nft-dsr';

// Golden files live in the source tree (tests run from dist/). UPDATE_GOLDEN=1 rewrites them.
function golden(t: tap.Test, name: string, actual: string): void {
  t.equal(actual, goldenText(sourcePath('test', 'forward', 'golden', name), actual), `matches golden ${name}`);
}

const b = (address: string, weight = 1): BackendSpec => ({ address, addressNum: parseIPv4(address)!, weight });
const http: PortSpec = { name: 'http', port: 80, protocol: 'TCP', targetPort: 80 };
const dns: PortSpec = { name: 'dns', port: 53, protocol: 'UDP', targetPort: 53 };
const PARENT_MAC = '52:54:00:12:34:56';

const dsr = (healthy: BackendSpec[], over: Record<string, unknown> = {}): ForwardState => ({
  services: [
    { key: 'default/web', vip: '10.99.0.50', ports: [http, dns], healthy, backends: [b('10.99.0.11'), b('10.99.0.12', 2)], sourceIP: 'preserve', vipMac: PARENT_MAC, ...over },
    // A SNAT service beside it: its rules stay in the ip table as before.
    { key: 'default/api', vip: '10.99.0.60', ports: [{ name: 'https', port: 443, protocol: 'TCP', targetPort: 8443 }], healthy: [b('10.99.0.21')], backends: [b('10.99.0.21')] },
  ],
});

t.test('golden: one DSR service (TCP and UDP, two single-backend chains) next to a SNAT service', async (t) => {
  // One healthy backend: a plain goto, so the golden file stays readable.
  const plan = renderNft(dsr([b('10.99.0.12', 2)]), { dsrDevice: 'eth0' });
  golden(t, 'dsr.nft', plan.script);
  t.same(plan.problems, []);
  t.ok(hasDsrTable(plan));
});

t.test('the netdev table: hook on the parent, dispatch keyed on the VIP interface MAC, fwd to each backend', async (t) => {
  const script = renderNft(dsr([b('10.99.0.11'), b('10.99.0.12', 2)]), { dsrDevice: 'eth0' }).script;
  const netdev = script.slice(script.indexOf('table netdev lb_agent {\n'));
  t.match(netdev, /type filter hook ingress device "eth0" priority -500; policy accept;/);
  t.match(netdev, /ether daddr \. ip daddr \. meta l4proto \. th dport vmap @dsr/);
  t.match(netdev, /52:54:00:12:34:56 \. 10\.99\.0\.50 \. tcp \. 80 : jump s1p0,/);
  t.match(netdev, /52:54:00:12:34:56 \. 10\.99\.0\.50 \. udp \. 53 : jump s1p1,/);
  const m = /jhash ip saddr \. th sport mod (\d+) seed (0x[0-9a-f]{8}) vmap \{ ([^}]*) \}/.exec(netdev)!;
  t.equal(m[1], '1021', 'Maglev size for 2 backends');
  t.equal(m[2], dsrSeed('default/web'), 'an explicit seed, derived from the service key');
  const slots = m[3]!.split(', ').map((e) => e.split(' goto ')[1]);
  const n1 = slots.filter((x) => x === 's1p0b0').length;
  t.ok(Math.abs(n1 - 1021 / 3) <= 2, `slots follow the weights 1:2 (${n1} of 1021 for weight 1)`);
  t.match(netdev, /chain s1p0b0 \{\n\t\ttcp flags & \(syn \| ack\) == syn counter name "s1p0b0_conns"\n\t\tcounter name "s1p0b0_to_backend" fwd ip to 10\.99\.0\.11 device "eth0"/);
  t.match(netdev, /chain s1p1b1 \{\n\t\tcounter name "s1p1b1_to_backend" fwd ip to 10\.99\.0\.12 device "eth0"/, 'UDP: no SYN to count');
  const ipTable = script.slice(script.indexOf('table ip lb_agent {\n'), script.indexOf('table netdev lb_agent {}'));
  t.notMatch(ipTable, /10\.99\.0\.11/, 'no DNAT, no counters in the ip table for a DSR port');
});

t.test('the ip table drops what slips past the hook, and refuses when no backend is healthy', async (t) => {
  const up = renderNft(dsr([b('10.99.0.11')]), { dsrDevice: 'eth0' }).script;
  t.match(up, /10\.99\.0\.50 \. tcp \. 80 : drop,/);
  const down = renderNft(dsr([]), { dsrDevice: 'eth0' });
  t.match(down.script, /10\.99\.0\.50 \. tcp \. 80 : goto refuse_tcp,/);
  t.match(down.script, /10\.99\.0\.50 \. udp \. 53 : goto refuse_udp,/);
  t.notOk(hasDsrTable(down), 'no netdev table (nor hook) when nothing is forwarded');
  t.match(down.script, /table netdev lb_agent \{\}\ndelete table netdev lb_agent\n$/, 'but a stale one is deleted');
});

t.test('the slot table only moves the slots of a backend that leaves the healthy set', async (t) => {
  const all = [b('10.99.0.11'), b('10.99.0.12'), b('10.99.0.13')];
  const slotsOf = (healthy: BackendSpec[]): string[] => {
    const s = renderNft({ services: [{ key: 'a/b', vip: '10.99.0.70', ports: [http], healthy, backends: all, sourceIP: 'preserve', vipMac: PARENT_MAC }] }, { dsrDevice: 'eth0' }).script;
    return /vmap \{ ([^}]*) \}/.exec(s.slice(s.indexOf('table netdev')))![1]!.split(', ').map((e) => e.split(' goto ')[1]!);
  };
  const full = slotsOf(all);
  const less = slotsOf([all[0]!, all[2]!]);
  const changed = full.map((c, i) => [c, less[i]]).filter(([x, y]) => x !== y);
  t.ok(changed.length > 0 && changed.every(([x]) => x === 's0p0b1'), `only b1's ${changed.length} slots moved`);
  t.same(slotsOf(all), full, 'and they all come back');
});

t.test('problems instead of forwarding: no parent device, no VIP MAC', async (t) => {
  const noDev = renderNft(dsr([b('10.99.0.11')]));
  t.match(noDev.problems.join('\n'), /direct server return needs the NIC of the service's network/);
  t.match(noDev.script, /10\.99\.0\.50 \. tcp \. 80 : goto refuse_tcp/, 'refused, not hanging');
  const noMac = renderNft(dsr([b('10.99.0.11')], { vipMac: undefined }), { dsrDevice: 'eth0' });
  t.match(noMac.problems.join('\n'), /needs the MAC the VIP 10\.99\.0\.50 answers with/);
  t.throws(() => renderNft(dsr([b('10.99.0.11')]), { dsrDevice: 'bad"name' }), /not an interface name/);
});

t.test('counters: connections (SYNs) and bytes to each backend; none towards clients (replies bypass the node)', async (t) => {
  const plan = renderNft(dsr([b('10.99.0.11')]), { dsrDevice: 'eth0' });
  const web = plan.counters.filter((c) => c.service === 'default/web');
  t.same([...new Set(web.map((c) => c.kind))].sort(), ['conns', 'to_backend']);
  t.equal(web.length, 2 * 2 * 2, '2 ports x 2 backends x 2 kinds');
});

const b6 = (address: string, weight = 1): BackendSpec => ({ address, addressNum: 0, weight, family: 'IPv6' });

t.test('an IPv6 VIP: its own dispatch map, the ip6 hash, fwd ip6 to its IPv6 backends; the program gets it with the same slots', async (t) => {
  const all = [b6('fd00:99::11'), b6('fd00:99::12', 2)];
  const state: ForwardState = {
    services: [
      { key: 'default/web', vip: '10.99.0.50', ports: [http], healthy: [b('10.99.0.11'), b('10.99.0.12')], backends: [b('10.99.0.11'), b('10.99.0.12')], sourceIP: 'preserve', vipMac: PARENT_MAC },
      { key: 'default/web@IPv6', vip: 'fd00:99::50', ports: [http], healthy: all, backends: all, sourceIP: 'preserve', vipMac: PARENT_MAC },
    ],
  };
  const plan = renderNft(state, { dsrDevice: 'eth0' });
  t.same(plan.problems, []);
  const netdev = plan.script.slice(plan.script.indexOf('table netdev lb_agent {\n'));
  t.match(netdev, /map dsr \{\n\t\ttype ether_addr \. ipv4_addr \. inet_proto \. inet_service : verdict\n\t\telements = \{\n\t\t\t52:54:00:12:34:56 \. 10\.99\.0\.50 \. tcp \. 80 : jump s0p0,\n/);
  t.match(netdev, /map dsr6 \{\n\t\ttype ether_addr \. ipv6_addr \. inet_proto \. inet_service : verdict\n\t\telements = \{\n\t\t\t52:54:00:12:34:56 \. fd00:99::50 \. tcp \. 80 : jump v6s0p0,\n/);
  t.match(netdev, /chain ingress \{\n\t\ttype filter hook ingress device "eth0" priority -500; policy accept;\n\t\tether daddr \. ip daddr \. meta l4proto \. th dport vmap @dsr\n\t\tether daddr \. ip6 daddr \. meta l4proto \. th dport vmap @dsr6\n\t\}/, 'one hook, a rule per family');
  const m = /chain v6s0p0 \{\n\t\tjhash ip6 saddr \. th sport mod (\d+) seed (0x[0-9a-f]{8}) vmap \{ ([^}]*) \}/.exec(netdev);
  t.ok(m, 'the IPv6 port hashes the client\'s IPv6 address and port');
  t.equal(m?.[2], dsrSeed('default/web@IPv6'), 'seeded by its own key');
  const slots = (m?.[3] ?? '').split(', ').map((e) => e.split(' goto ')[1]);
  t.equal(slots.length, 1021);
  const n0 = slots.filter((x) => x === 'v6s0p0b0').length;
  t.ok(Math.abs(n0 - 1021 / 3) <= 2, `the same weighted slot table as IPv4 (${n0} of 1021 for weight 1 of 3)`);
  t.match(netdev, /chain v6s0p0b1 \{\n\t\ttcp flags & \(syn \| ack\) == syn counter name "v6s0p0b1_conns"\n\t\tcounter name "v6s0p0b1_to_backend" fwd ip6 to fd00:99::12 device "eth0"\n/);
  t.notMatch(netdev, /fwd ip to fd00|fwd ip6 to 10\./, 'each VIP to its own family\'s backends');
  const ip6Table = plan.script.slice(plan.script.indexOf('table ip6 lb_agent {\n'));
  t.match(ip6Table, /fd00:99::50 \. tcp \. 80 : drop,/, 'what slips past the hook is dropped in the ip6 table');
  t.same(plan.dsr.map((p) => p.vip), ['10.99.0.50', 'fd00:99::50'], 'the BPF program gets both ports');
  const bpf6 = plan.dsr[1]!;
  t.same(bpf6.slots.map((i) => `v6s0p0b${i}`), slots, 'the IPv6 port\'s slot table is the netdev table\'s, slot for slot');
  t.same([bpf6.seed.toString(16).padStart(8, '0'), bpf6.backends.map((x) => [x.address, x.conns])], [dsrSeed('default/web@IPv6').slice(2), [['fd00:99::11', 'v6s0p0b0_conns'], ['fd00:99::12', 'v6s0p0b1_conns']]],
    'its seed and its backends, counting into the table\'s counter names');
  t.same(plan.counters.filter((c) => c.service === 'default/web@IPv6').map((c) => c.name).sort(), ['v6s0p0b0_conns', 'v6s0p0b0_to_backend', 'v6s0p0b1_conns', 'v6s0p0b1_to_backend']);
  const only6 = renderNft({ services: [state.services[1]!] }, { dsrDevice: 'eth0' }).script;
  t.notMatch(only6, /map dsr \{|ip daddr \. meta l4proto \. th dport vmap @dsr\n/, 'no IPv4 map or rule without an IPv4 DSR port');
  const down = renderNft({ services: [{ ...state.services[1]!, healthy: [] }] }, { dsrDevice: 'eth0' });
  t.notOk(hasDsrTable(down), 'no healthy IPv6 backend: no netdev table');
  t.match(down.script, /fd00:99::50 \. tcp \. 80 : goto refuse_tcp,/, 'and the port refused');
});

t.test('a service on another network: a hook on its NIC, fwd out of it, and the program keeps to the parent', async (t) => {
  const state: ForwardState = {
    services: [
      { key: 'default/a', vip: '10.99.0.50', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')], sourceIP: 'preserve', vipMac: PARENT_MAC, device: 'eth0' },
      { key: 'vm/b', vip: '10.98.0.50', ports: [http], healthy: [b('10.98.0.11')], backends: [b('10.98.0.11')], sourceIP: 'preserve', vipMac: '52:54:00:00:00:02', device: 'eth1' },
      { key: 'vm/c', vip: 'fd00:98::50', ports: [http], healthy: [b6('fd00:98::11')], backends: [b6('fd00:98::11')], sourceIP: 'preserve', vipMac: '52:54:00:00:00:02', device: 'eth1' },
    ],
  };
  const plan = renderNft(state, { dsrDevice: 'eth0' });
  t.same(plan.problems, []);
  const netdev = plan.script.slice(plan.script.indexOf('table netdev lb_agent {\n'));
  t.match(netdev, /chain ingress \{\n\t\ttype filter hook ingress device "eth0" priority -500; policy accept;\n\t\tether daddr \. ip daddr \. meta l4proto \. th dport vmap @dsr\n\t\}/);
  t.match(netdev, /chain ingress_n1 \{\n\t\ttype filter hook ingress device "eth1" priority -500; policy accept;\n\t\tether daddr \. ip daddr \. meta l4proto \. th dport vmap @dsr_n1\n\t\tether daddr \. ip6 daddr \. meta l4proto \. th dport vmap @dsr6_n1\n\t\}/);
  t.match(netdev, /map dsr \{[^}]*10\.99\.0\.50 \. tcp \. 80 : jump s0p0,\n\t\t\}/, 'the default network\'s VIP in the parent\'s map only');
  t.match(netdev, /map dsr_n1 \{[^}]*52:54:00:00:00:02 \. 10\.98\.0\.50 \. tcp \. 80 : jump s1p0,\n\t\t\}/, 'the other network\'s in its NIC\'s map');
  t.match(netdev, /fwd ip to 10\.99\.0\.11 device "eth0"/);
  t.match(netdev, /fwd ip to 10\.98\.0\.11 device "eth1"/, 'out of the NIC its frames came in by');
  t.match(netdev, /fwd ip6 to fd00:98::11 device "eth1"/);
  t.same(plan.dsr.map((p) => p.vip), ['10.99.0.50'], 'the program (on eth0) gets only the port whose frames arrive there');
  t.same(plan.devices, ['eth0', 'eth1'], 'the start check stands in a veth for each NIC');
  const alone = renderNft({ services: [state.services[1]!] }, { dsrDevice: 'eth0' });
  t.match(alone.script, /chain ingress_n0 \{\n\t\ttype filter hook ingress device "eth1"/, 'no hook on the parent when nothing there is forwarded');
  t.same([alone.dsr, alone.devices], [[], ['eth1']]);
});

t.test('the probe ruleset exercises every expression the table uses', async (t) => {
  for (const expr of ['hook ingress', 'ether_addr . ipv4_addr', 'ether_addr . ipv6_addr', 'jhash ip saddr', 'jhash ip6 saddr', 'seed', 'tcp flags', 'fwd ip to', 'fwd ip6 to', 'counter name']) t.ok(DSR_PROBE_RULESET.includes(expr), expr);
  t.same([...DSR_KERNEL_OPTIONS], ['NF_TABLES_NETDEV', 'NETFILTER_INGRESS', 'NFT_HASH', 'NFT_FWD_NETDEV']);
});
