// Unit tests of the kernel path's pure parts: the rendered nft text (golden
// files, byte for byte), the table comparison used at start, counter parsing
// and the carrying of totals across rewrites, and the probe's verdicts.
// Loading the text into a real kernel is test/privileged/forward-kernel.test.ts.
import t from 'tap';
import { createLogger } from '../../agent/log';
import { goldenText, sourcePath } from '../helpers/golden';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { BackendSpec, PortSpec } from '../../agent/config/types';
import { parseIPv4 } from '../../agent/address';
import type { ForwardState } from '../../agent/forward/dataplane';
import * as os from 'node:os';
import { Registry } from 'prom-client';
import { ManualClock } from '../../agent/clock';
import { linkNameForService } from '../../agent/net/ownership/ownership';
import {
  ARRIVALS_BATCH_MS, NftDataplane, canonicalTableJson, flowTotals, handedBackTotals, parseNftCounters, probeDsr, probeNftables, renderIncremental, renderNft, renderNftDelta, renderPartsDelta, renderRemoval, udpFlowSweep, type Exec,
} from '../../agent/forward/nft';
import type { ConntrackClient, UdpFlowRule } from '../../agent/net/conntrack/conntrack';
import { flowId } from '../../agent/forward/dataplane';
import { dsrSeed, dsrSeedValue } from '../../agent/forward/nft-dsr';
import { dsrSlotTable } from '../../agent/forward/maglev';
import type { DsrBpf } from '../../agent/net/ebpf/ebpf-attach';
import type { BatchWriter, Rendering, ServicePart } from '../../agent/forward/nft';
import { encodeBatch, type NftOp } from '../../agent/net/netlink/nft-batch';

// Golden files live in the source tree (tests run from dist/). UPDATE_GOLDEN=1 rewrites them.
function golden(t: tap.Test, name: string, actual: string): void {
  t.equal(actual, goldenText(sourcePath('test', 'forward', 'golden', name), actual), `matches golden ${name}`);
}

const b = (address: string, weight = 1): BackendSpec => ({ address, addressNum: parseIPv4(address)!, weight });
const http: PortSpec = { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 };
const dns: PortSpec = { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 };
const tls: PortSpec = { name: '', port: 443, protocol: 'TCP', targetPort: 8443 };

const state: ForwardState = {
  services: [
    { key: 'default/web', vip: '10.99.0.50', ports: [http, dns], healthy: [b('10.99.0.12', 2), b('10.99.0.11', 1)], backends: [b('10.99.0.11'), b('10.99.0.12', 2), b('10.99.0.13')] },
    { key: 'apps/empty', vip: '10.99.0.60', ports: [tls], healthy: [], backends: [b('10.99.0.21')] },
    { key: 'apps/notheld', vip: undefined, ports: [tls], healthy: [b('10.99.0.21')], backends: [b('10.99.0.21')] },
  ],
};

/** A rendering's part of one service, by key. */
const partOf = (r: Rendering, key: string): ServicePart | undefined => {
  const i = r.normal.index.get(key);
  return i === undefined ? undefined : r.parts[i];
};

t.test('render: golden text for weighted TCP+UDP, a service with no healthy backend, one not held', async (t) => {
  const plan = renderNft(state);
  golden(t, 'basic.nft', plan.script);
  t.same(plan.problems, []);
  t.equal(plan.counters.length, 3 * (1 + 3 + 3), 'conns/to_backend/to_client per (port, backend) of the held services');
});

t.test('render: empty state still defines the table (base chains, empty maps)', async (t) => {
  golden(t, 'empty.nft', renderNft({ services: [] }).script);
});

t.test('render: one healthy backend goes straight to its chain (no numgen)', async (t) => {
  const plan = renderNft({ services: [{ key: 'a/one', vip: '10.99.0.70', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] });
  golden(t, 'single.nft', plan.script);
});

t.test("render: hand-back (VRRP takeover) for a service's TCP target ports, golden; none without a device, for DSR or UDP only", async (t) => {
  const hb: ForwardState = {
    services: [
      { ...state.services[0]!, handBack: '10.99.0.4' },
      { key: 'apps/dns', vip: '10.99.0.61', ports: [dns], healthy: [b('10.99.0.21')], backends: [b('10.99.0.21')], handBack: '10.99.0.4' },
      { key: 'apps/dsr', vip: '10.99.0.62', ports: [http], healthy: [b('10.99.0.21')], backends: [b('10.99.0.21')], sourceIP: 'preserve', vipMac: '02:00:00:00:00:62', handBack: '10.99.0.4' },
    ],
  };
  const plan = renderNft(hb, { dsrDevice: 'eth0' });
  golden(t, 'hand-back.nft', plan.script);
  t.same(plan.handBack, [{ name: 's2_handed_back', service: 'default/web', to: '10.99.0.4' }], 'one counter, for the SNAT service with TCP ports');
  t.equal(plan.counters.length, renderNft({ services: [hb.services[0]!, hb.services[1]!] }, { dsrDevice: 'eth0' }).counters.length + renderNft({ services: [hb.services[2]!] }, { dsrDevice: 'eth0' }).counters.length, 'the flow counters are untouched by it');
  t.match(plan.script, /ip daddr 10\.99\.0\.50 ip saddr \{ 10\.99\.0\.11, 10\.99\.0\.12, 10\.99\.0\.13 \} tcp sport \{ 8080 \} ip ttl \{ 64, 128, 255 \} ct state new,invalid goto hand_back_s2/, 'every configured backend, the TCP target port only, straight from it (an initial TTL)');
  t.match(plan.script, /counter name "s2_handed_back" dup to 10\.99\.0\.4 device "eth0" drop/);
  t.notMatch(renderNft(hb).script, /hand_back/, 'no device to send it out of: no hand-back');
  t.notMatch(renderNft({ services: [{ ...state.services[0]!, handBack: undefined }] }, { dsrDevice: 'eth0' }).script, /hand_back/, 'none when not asked for: the table is as before');
});

t.test('render: hand-back of an IPv6 VIP in `table ip6`, by hop limit, to the previous Master\'s link-local address through the device', async (t) => {
  const b6 = (address: string): BackendSpec => ({ address, addressNum: 0, weight: 1, family: 'IPv6' });
  const v6: ForwardState = {
    services: [
      { ...state.services[0]!, handBack: '10.99.0.4' },
      { key: 'default/web@IPv6', vip: 'fd00:99::200', ports: [http], healthy: [b6('fd00:99::11')], backends: [b6('fd00:99::11'), b6('fd00:99::12')], handBack: 'fe80::4' },
    ],
  };
  const plan = renderNft(v6, { dsrDevice: 'eth0' });
  t.same(plan.handBack, [
    { name: 's0_handed_back', service: 'default/web', to: '10.99.0.4' },
    { name: 'v6s0_handed_back', service: 'default/web@IPv6', to: 'fe80::4' },
  ], 'a counter per family\'s service');
  const ip6 = plan.script.slice(plan.script.indexOf('table ip6 lb_agent {\n'));
  const ip4 = plan.script.slice(plan.script.indexOf('table ip lb_agent {}'), plan.script.indexOf('table ip6 lb_agent {}'));
  t.match(ip6, /chain hand_back \{\n\t\ttype filter hook prerouting priority mangle; policy accept;\n\t\tip6 daddr fd00:99::200 ip6 saddr \{ fd00:99::11, fd00:99::12 \} tcp sport \{ 8080 \} ip6 hoplimit \{ 64, 128, 255 \} ct state new,invalid goto hand_back_v6s0\n/,
    'in the IPv6 table: every configured backend, the TCP target port, an initial hop limit');
  t.match(ip6, /chain hand_back_v6s0 \{\n\t\tcounter name "v6s0_handed_back" dup to fe80::4 device "eth0" drop\n/, 'to the link-local address, on the device that scopes it');
  t.match(ip6, /counter v6s0_handed_back \{\}/);
  t.notMatch(ip4, /fd00|fe80|v6s0/, 'nothing of it in the IPv4 table');
  t.match(ip4, /dup to 10\.99\.0\.4 device "eth0"/, 'whose own hand-back is unchanged');
  t.notMatch(renderNft(v6).script, /hand_back/, 'no device: no hand-back in either family');
});

t.test('render: IPv6 VIPs in `table ip6 lb_agent` beside the IPv4 table, golden; IPv4 alone is as before', async (t) => {
  const b6 = (address: string, weight = 1): BackendSpec => ({ address, addressNum: 0, weight, family: 'IPv6' });
  const dual: ForwardState = {
    services: [
      state.services[0]!,
      { key: 'default/web@IPv6', vip: 'fd00:99::200', ports: [http, dns], healthy: [b6('fd00:99::12', 2), b6('fd00:99::11')], backends: [b6('fd00:99::11'), b6('fd00:99::12', 2)] },
      { key: 'apps/empty@IPv6', vip: 'fd00:99::201', ports: [tls], healthy: [], backends: [b6('fd00:99::21')] },
    ],
  };
  const plan = renderNft(dual);
  golden(t, 'dual-stack.nft', plan.script);
  t.match(plan.script, /table ip6 lb_agent \{\n/, 'the IPv6 table');
  t.match(plan.script, /\t\t\t0 : fd00:99::12 \. 8080,\n/, 'an IPv6 backend in the slot map: address . port');
  t.match(plan.script, /meta l4proto tcp dnat ip6 to numgen inc mod \d+ map @v6s1p0_slots/, 'the DNAT by the map names its family');
  t.match(renderNft({ services: [{ key: 'x/six', vip: 'fd00:99::202', ports: [http], healthy: [b6('fd00:99::12')], backends: [b6('fd00:99::12')] }] }).script,
    /chain v6s0p0 \{\n\t\tmeta l4proto tcp dnat to \[fd00:99::12\]:8080\n/, 'one IPv6 backend: a plain DNAT, the address in brackets');
  t.match(plan.script, /reject with icmpv6 type port-unreachable/);
  t.match(plan.script, /ct status dnat ct original ip6 daddr @vips snat to ct original ip6 daddr/);
  const four = renderNft({ services: [state.services[0]!] }).script;
  t.equal(plan.script.slice(plan.script.indexOf('table ip lb_agent {}'), plan.script.indexOf('table netdev lb_agent {}')),
    four.slice(four.indexOf('table ip lb_agent {}'), four.indexOf('table netdev lb_agent {}')), 'the IPv4 table is the same with IPv6 VIPs beside it');
  t.notMatch(four, /ip6/, 'no IPv6 VIP: no IPv6 table');
  t.match(renderNft({ services: [state.services[0]!] }, { ip6Removal: true }).script, /table ip6 lb_agent \{\}\ndelete table ip6 lb_agent\n$/, 'the last IPv6 VIP gone: its table deleted');
  const names = plan.counters.map((c) => c.name);
  t.equal(new Set(names).size, names.length, 'counter names unique across the two tables');
});

t.test('render is deterministic whatever the input order', async (t) => {
  const shuffled: ForwardState = {
    services: [...state.services].reverse().map((s) => ({ ...s, ports: [...s.ports].reverse(), healthy: [...s.healthy].reverse(), backends: [...s.backends].reverse() })),
  };
  t.equal(renderNft(shuffled).script, renderNft(state).script);
});

/** The slots of map `name` in a rendered script, in slot order. */
function slotsOf(script: string, name: string): string[] {
  const m = new RegExp(`map ${name} \\{\\n\\t\\ttypeof [^\\n]*\\n\\t\\telements = \\{\\n([^}]*)\\t\\t\\}`).exec(script);
  if (!m) return [];
  return m[1]!.split('\n').filter(Boolean).map((l, i) => {
    const [slot, target] = l.trim().replace(/,$/, '').split(' : ') as [string, string];
    if (Number(slot) !== i) throw new Error(`slot ${slot} at ${i}`);
    return target.split(' . ')[0]!;
  });
}

t.test('render: slot map honours weights over a fixed modulus; names stay put when health changes', async (t) => {
  const all = [b('10.99.0.11'), b('10.99.0.12', 3), b('10.99.0.13', 2)];
  const s = (healthy: BackendSpec[]): ForwardState => ({ services: [{ key: 'x/y', vip: '10.99.0.80', ports: [http], healthy, backends: all }] });
  const full = renderNft(s(all)).script;
  // Tables of 6 (all), 5, 3 and 4 (each one less): lcm 60, within maxSlots.
  t.match(full, /chain s0p0 \{\n\t\tmeta l4proto tcp dnat ip to numgen inc mod 60 map @s0p0_slots\n\t\}/, 'one rule: the DNAT by the slot map');
  const slots = slotsOf(full, 's0p0_slots');
  t.equal(slots.length, 60);
  t.same(['10.99.0.11', '10.99.0.12', '10.99.0.13'].map((a) => slots.filter((x) => x === a).length), [10, 30, 20], 'slots per backend = weight');
  for (let w = 0; w + 6 <= 60; w += 6) {
    t.same(['10.99.0.11', '10.99.0.12', '10.99.0.13'].map((a) => slots.slice(w, w + 6).filter((x) => x === a).length), [1, 3, 2], `every window of 6 from slot ${w} splits exactly by weight`);
  }
  t.notMatch(full, /chain s0p0b|goto s0p0b|vmap \{/, 'no chain per backend, no verdict map');
  const less = renderNft(s([b('10.99.0.11'), b('10.99.0.13', 2)])).script;
  t.match(less, /numgen inc mod 60 map @s0p0_slots/, 'a backend down: the same modulus, so the same rule');
  t.same(['10.99.0.11', '10.99.0.12', '10.99.0.13'].map((a) => slotsOf(less, 's0p0_slots').filter((x) => x === a).length), [20, 0, 40], 'an unhealthy backend gets no new connections');
  t.match(less, /counter s0p0b10_99_0_12_conns \{\}/, 'its counters keep their names');
  t.match(less, /10\.99\.0\.80 \. 10\.99\.0\.12 \. tcp \. 8080 : "s0p0b10_99_0_12_to_backend"/, 'and its draining connections are still counted');
  t.match(less, /10\.99\.0\.80 \. 10\.99\.0\.12 \. tcp \. 8080 : "s0p0b10_99_0_12_conns"/, 'connections are counted after the DNAT, by the conns map');
  t.match(less, /ct status dnat counter name ct original ip daddr \. ip daddr \. meta l4proto \. th dport map @conns\n/, 'in postrouting');
  // Past maxSlots the modulus keeps what fits: a healthy set whose table does not divide it gets its own (the rule is rewritten).
  const ten = Array.from({ length: 10 }, (_, i) => b(`10.99.1.${i + 1}`));
  const tenText = renderNft({ services: [{ key: 'x/ten', vip: '10.99.0.81', ports: [http], healthy: ten, backends: ten }] }).script;
  const mod = Number(/numgen inc mod (\d+) map/.exec(tenText)![1]);
  t.ok(mod <= 1024 && mod % 10 === 0 && mod % 9 === 0, `ten equal backends: a modulus within maxSlots that 10 and 9 divide (${mod})`);
});

t.test('render: with VRRP (flow-hash) the SNAT pick is the seeded jhash onto the maglev table DSR uses', async (t) => {
  const all = [b('10.99.0.11'), b('10.99.0.12', 3), b('10.99.0.13', 2)];
  const s = (healthy: BackendSpec[]): ForwardState => ({ services: [{ key: 'x/y', vip: '10.99.0.80', ports: [http, dns], healthy, backends: all }] });
  const text = renderNft(s(all), { placement: 'flow-hash' }).script;
  t.notMatch(text, /numgen inc mod \d+ map/, 'no round-robin counter');
  const m = /chain s0p0 \{\n\t\tmeta l4proto tcp dnat ip to jhash ip saddr \. th sport mod (\d+) seed (0x[0-9a-f]{8}) map @s0p0_slots\n/.exec(text)!;
  t.ok(m, 'TCP port: jhash of the client address and port, onto the slot map');
  t.match(text, /chain s0p1 \{\n\t\tmeta l4proto udp dnat ip to jhash ip saddr \. th sport mod \d+ seed [^\n]* map @s0p1_slots\n/, 'UDP port too');
  t.equal(m[2], dsrSeed('x/y'), 'the seed is the service key\'s, so every peer has the same');
  const slots = slotsOf(text, 's0p0_slots');
  t.equal(Number(m[1]), slots.length);
  t.same(slots, dsrSlotTable(all, all).map((x) => x.address), 'slot i goes where the DSR table sends it');
  const share = ['10.99.0.11', '10.99.0.12', '10.99.0.13'].map((c) => slots.filter((x) => x === c).length / slots.length);
  t.ok(Math.abs(share[0]! - 1 / 6) < 0.01 && Math.abs(share[1]! - 3 / 6) < 0.01 && Math.abs(share[2]! - 2 / 6) < 0.01, `slots follow the weights 1:3:2 (${share.map((x) => x.toFixed(3)).join(' ')})`);
  // A backend leaving moves only its own slots: the flows of the others keep their place.
  const after = slotsOf(renderNft(s([all[1]!, all[2]!]), { placement: 'flow-hash' }).script, 's0p0_slots');
  t.equal(after.length, slots.length, 'the same table size: the same rule');
  t.equal(slots.filter((x, i) => x !== '10.99.0.11' && after[i] !== x).length, 0, 'no slot of b1 or b2 moves when b0 leaves');
  t.equal(renderNft(s(all), { placement: 'round-robin' }).script, renderNft(s(all)).script, 'round-robin is the default');
  t.match(renderNft({ services: [{ key: 'a/one', vip: '10.99.0.70', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] }, { placement: 'flow-hash' }).script,
    /chain s0p0 \{\n\t\tmeta l4proto tcp dnat to 10\.99\.0\.11:8080\n/, 'one healthy backend: straight to it');
});

t.test('render: a VIP:port claimed twice keeps the first service and reports the other', async (t) => {
  const plan = renderNft({
    services: [
      { key: 'b/second', vip: '10.99.0.50', ports: [http], healthy: [b('10.99.0.12')], backends: [b('10.99.0.12')] },
      { key: 'a/first', vip: '10.99.0.50', ports: [http, dns], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] },
    ],
  });
  t.equal(plan.problems.length, 1);
  t.match(plan.problems[0], /b\/second: TCP port 80 on 10\.99\.0\.50 is already forwarded for a\/first/);
  t.equal((plan.script.match(/10\.99\.0\.50 \. tcp \. 80 :/g) ?? []).length, 1);
});

t.test('render: a service name that is not nft-safe only appears in comments, sanitised', async (t) => {
  const plan = renderNft({ services: [{ key: 'ns/we\u00efrd"name', vip: '10.99.0.90', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] });
  t.match(plan.script, /# s0p0: ns\/we\?rd"name 10\.99\.0\.90/);
  t.notMatch(plan.script.split('\n').filter((l) => !l.startsWith('#')).join('\n'), /we/);
});

t.test('renderRemoval deletes whether or not the table exists', async (t) => {
  t.equal(renderRemoval(), 'table ip lb_agent {}\ndelete table ip lb_agent\ntable netdev lb_agent {}\ndelete table netdev lb_agent\ntable ip6 lb_agent {}\ndelete table ip6 lb_agent\n');
});

// `nft -j list table` output shaped like nft 1.0.6's.
function listing(opts: { handleBase?: number; packets?: number; elemOrder?: 'ab' | 'ba'; extraRule?: boolean } = {}): string {
  const h = opts.handleBase ?? 1;
  const elems = [[{ concat: ['10.99.0.50', 'tcp', 80] }, { jump: { target: 's0p0' } }], [{ concat: ['10.99.0.50', 'udp', 53] }, { jump: { target: 's0p1' } }]];
  const objs: unknown[] = [
    { metainfo: { version: '1.0.6', release_name: 'Lester Gooch #5', json_schema_version: 1 } },
    { table: { family: 'ip', name: 'lb_agent', handle: h } },
    { counter: { family: 'ip', name: 's0p0b0_conns', table: 'lb_agent', handle: h + 1, packets: opts.packets ?? 0, bytes: (opts.packets ?? 0) * 60 } },
    { map: { family: 'ip', name: 'services', table: 'lb_agent', type: ['ipv4_addr', 'inet_proto', 'inet_service'], handle: h + 2, map: 'verdict', elem: opts.elemOrder === 'ba' ? [elems[1], elems[0]] : elems } },
    { chain: { family: 'ip', table: 'lb_agent', name: 'prerouting', handle: h + 3, type: 'nat', hook: 'prerouting', prio: -100, policy: 'accept' } },
    { rule: { family: 'ip', table: 'lb_agent', chain: 'prerouting', handle: h + 4, expr: [{ vmap: { key: { concat: [{ payload: { protocol: 'ip', field: 'daddr' } }] }, data: '@services' } }] } },
  ];
  if (opts.extraRule) objs.push({ rule: { family: 'ip', table: 'lb_agent', chain: 'prerouting', handle: h + 9, expr: [{ drop: null }] } });
  return JSON.stringify({ nftables: objs });
}

/** N services of three backends each (svc-000 first in the canonical order), IPv4 VIPs from 10.98.0.0. */
function many(n: number, change: (i: number, backends: BackendSpec[]) => { healthy: BackendSpec[]; backends: BackendSpec[] } = (_, all) => ({ healthy: all, backends: all })): ForwardState {
  return {
    services: Array.from({ length: n }, (_, i) => {
      const all = [b(`10.97.${i >> 6}.${(i & 63) * 4 + 1}`), b(`10.97.${i >> 6}.${(i & 63) * 4 + 2}`), b(`10.97.${i >> 6}.${(i & 63) * 4 + 3}`)];
      return { key: `default/svc-${String(i).padStart(3, '0')}`, vip: `10.98.${i >> 8}.${i & 255}`, ports: [http], ...change(i, all) };
    }),
  };
}

t.test('renderNftDelta: one backend of one service among 10 or 1,000 changes the same few lines, never the table', async (t) => {
  const swapped = (i: number, all: BackendSpec[]) => {
    const backends = i === 0 ? [all[0]!, all[1]!, b('10.97.0.250')] : all;
    return { healthy: backends, backends };
  };
  const deltas = [10, 1000].map((n) => renderNftDelta(renderNft(many(n)), renderNft(many(n, swapped)))!);
  t.ok(deltas[0]!.script.length > 0, 'something to write');
  t.equal(deltas[1]!.script, deltas[0]!.script, 'the same transaction at 1,000 services as at 10');
  t.notMatch(deltas[1]!.script, /table ip lb_agent \{|delete table/, 'the table is neither defined nor deleted');
  t.ok(deltas[1]!.objects <= 16, `a few objects (${deltas[1]!.objects})`);
  t.ok(deltas[1]!.script.length < renderNft(many(10)).script.length / 4, `a fraction of even the 10-service table (${deltas[1]!.script.length} bytes)`);
  t.same([...deltas[1]!.reset].sort(), ['s0p0b10_97_0_3_conns', 's0p0b10_97_0_3_to_backend', 's0p0b10_97_0_3_to_client'], "the replaced backend's counters go; the others keep counting");
  t.match(deltas[1]!.script, /^add counter ip lb_agent s0p0b10_97_0_250_conns\n/);
  t.match(deltas[1]!.script, /\ndelete counter ip lb_agent s0p0b10_97_0_3_conns\n/);
  t.match(deltas[1]!.script, /\nadd element ip lb_agent conns \{ 10\.98\.0\.0 \. 10\.97\.0\.250 \. tcp \. 8080 : "s0p0b10_97_0_250_conns" \}\n/, 'its connections counted by the conns map');
  t.match(deltas[1]!.script, /\nadd element ip lb_agent s0p0_slots \{ 2 : 10\.97\.0\.250 \. 8080, 5 : 10\.97\.0\.250 \. 8080 \}\n/, 'the slots of the backend it replaces');
  t.notMatch(deltas[1]!.script, /chain|rule/, 'no chain, no rule');
  // A health transition: the slots that change, and nothing else; no counter restarts.
  const down = renderNftDelta(renderNft(many(1000)), renderNft(many(1000, (i, all) => ({ healthy: i === 500 ? all.slice(1) : all, backends: all }))))!;
  t.same(down.reset, new Set(), 'a health transition restarts no counter');
  t.same(down.script.split('\n').filter(Boolean), [
    'delete element ip lb_agent s500p0_slots { 0, 1, 2, 3 }',
    'add element ip lb_agent s500p0_slots { 0 : 10.97.7.210 . 8080, 1 : 10.97.7.211 . 8080, 2 : 10.97.7.210 . 8080, 3 : 10.97.7.211 . 8080 }',
  ], 'the slots that change (mod 6: three and two backends both divide it), no rule');
  // The last healthy backend gone: the port moves from the dispatch map to the refused one.
  const none = renderNftDelta(renderNft(many(3)), renderNft(many(3, (i, all) => ({ healthy: i === 1 ? [] : all, backends: all }))))!;
  t.match(none.script, /delete element ip lb_agent services \{ 10\.98\.0\.1 \. tcp \. 80 \}/);
  t.match(none.script, /add element ip lb_agent refused \{ 10\.98\.0\.1 \. tcp \. 80 : goto refuse_tcp \}/);
  t.match(none.script, /delete chain ip lb_agent s1p0\ndelete map ip lb_agent s1p0_slots\n/, 'the chain, then the map it looked up');
  t.equal(renderNftDelta(renderNft(many(3)), renderNft(many(3)))!.script, '', 'no change, nothing to write');
});

t.test('a health transition is data elements of the port\'s slot map: no jump, goto, rule or chain, the same batch at 1,000 services as at 10', async (t) => {
  // Three backends down to two and back, one to three, all to none and back: round-robin and flow hash.
  const health = (n: number, healthy: (all: BackendSpec[]) => BackendSpec[]) => many(n, (i, all) => ({ healthy: i === 7 ? healthy(all) : all, backends: all }));
  for (const placement of ['round-robin', 'flow-hash'] as const) {
    const batch = (n: number, from: (all: BackendSpec[]) => BackendSpec[], to: (all: BackendSpec[]) => BackendSpec[]): { script: string; ops: readonly NftOp[]; bytes: Buffer } => {
      const a = renderIncremental(health(n, from), { placement });
      const d = renderPartsDelta(a, renderIncremental(health(n, to), { placement }, a))!;
      return { script: d.script, ops: d.ops!, bytes: encodeBatch('lb_agent', d.ops!, { seq: 1, ack: true }).datagram };
    };
    for (const [what, from, to] of [
      ['one of three down', (all: BackendSpec[]) => all, (all: BackendSpec[]) => all.slice(1)],
      ['one of three back', (all: BackendSpec[]) => all.slice(1), (all: BackendSpec[]) => all],
      ['one back as another goes', (all: BackendSpec[]) => all.slice(1), (all: BackendSpec[]) => [all[0]!, all[2]!]],
    ] as const) {
      const [small, large] = [batch(10, from, to), batch(1000, from, to)];
      t.ok(large.ops.length > 0, `${placement}, ${what}: something to write`);
      t.ok(large.ops.every((o) => o.op === 'add-slot-elements' || o.op === 'delete-slot-elements'), `${placement}, ${what}: slot elements only (${large.ops.map((o) => o.op).join(', ')})`);
      t.notMatch(large.script, /\b(jump|goto|rule|chain)\b/, `${placement}, ${what}: no jump, goto, rule or chain in the script`);
      t.ok(large.bytes.equals(small.bytes), `${placement}, ${what}: byte for byte the same batch at 1,000 services as at 10 (${large.bytes.length} bytes)`);
    }
    // Down to a single backend the pick has nothing to choose: a plain DNAT replaces the rule and the map goes.
    const one = batch(1000, (all) => all.slice(1), (all) => all.slice(2));
    t.same(one.ops.map((o) => o.op), ['flush-chain', 'add-rule', 'delete-slot-map'], `${placement}, down to one: a plain DNAT, the map deleted`);
  }
});

t.test('a delta as typed steps for the netlink writer (a health transition, a backend replaced), in the script\'s order; what the writer does not encode has none', async (t) => {
  const health = (n: number, i0: number, healthy: (all: BackendSpec[]) => BackendSpec[]) => many(n, (i, all) => ({ healthy: i === i0 ? healthy(all) : all, backends: all }));
  const prev = renderIncremental(many(1000), {});
  const down = renderPartsDelta(prev, renderIncremental(health(1000, 500, (all) => all.slice(1)), {}, prev))!;
  t.same(down.ops, [
    { op: 'delete-slot-elements', family: 'ip', set: 's500p0_slots', elements: [0, 1, 2, 3].map((slot) => ({ slot })) },
    { op: 'add-slot-elements', family: 'ip', set: 's500p0_slots', elements: [0, 1, 2, 3].map((slot) => ({ slot, address: `10.97.7.${slot % 2 === 0 ? 210 : 211}`, port: 8080 })) },
  ], 'a backend down: one step for each line of the script');
  t.equal(down.ops!.length, down.script.split('\n').filter(Boolean).length);
  const mid = renderIncremental(health(3, 1, (all) => all.slice(0, 1)), {});
  const up = renderPartsDelta(mid, renderIncremental(health(3, 1, (all) => all), {}, mid))!;
  t.same(up.ops, [
    { op: 'add-slot-map', family: 'ip', set: 's1p0_slots', proto: 'tcp' },
    { op: 'flush-chain', family: 'ip', chain: 's1p0' },
    { op: 'add-rule', family: 'ip', chain: 's1p0', rule: { kind: 'dnat-map', proto: 'tcp', map: 's1p0_slots', pick: { kind: 'numgen', modulus: 6 } } },
    { op: 'add-slot-elements', family: 'ip', set: 's1p0_slots', elements: [0, 1, 2, 3, 4, 5].map((slot) => ({ slot, address: `10.97.0.${5 + (slot % 3)}`, port: 8080 })) },
  ], 'from one backend to three: the slot map comes, the plain DNAT becomes the DNAT by it');
  t.equal(up.ops!.length, up.script.split('\n').filter(Boolean).length, 'one step for each line of the script');
  const none = renderPartsDelta(mid, renderIncremental(health(3, 1, () => []), {}, mid))!;
  t.same(none.ops?.filter((o) => o.op === 'add-elements' || o.op === 'delete-elements'), [
    { op: 'delete-elements', family: 'ip', set: 'services', elements: [{ vip: '10.98.0.1', proto: 'tcp', port: 80 }] },
    { op: 'add-elements', family: 'ip', set: 'refused', elements: [{ vip: '10.98.0.1', proto: 'tcp', port: 80, verdict: { kind: 'goto', chain: 'refuse_tcp' } }] },
  ], 'the last one down: the port moves from the dispatch map to the refused one');
  const back = renderPartsDelta(renderIncremental(health(3, 1, () => []), {}), renderIncremental(health(3, 1, (all) => all.slice(0, 1)), {}))!;
  t.same(back.ops?.filter((o) => o.op === 'add-elements' || o.op === 'add-rule'), [
    { op: 'add-rule', family: 'ip', chain: 's1p0', rule: { kind: 'dnat', proto: 'tcp', address: '10.97.0.5', port: 8080 } },
    { op: 'add-elements', family: 'ip', set: 'services', elements: [{ vip: '10.98.0.1', proto: 'tcp', port: 80, verdict: { kind: 'jump', chain: 's1p0' } }] },
  ], 'one back: a plain DNAT rule and the dispatch element');
  // A backend replaced (a reload): its counters and byte-map elements are typed steps too.
  const swapped = renderPartsDelta(prev, renderIncremental(many(1000, (i, all) => (i === 0 ? { healthy: [all[0]!, b('10.97.0.250')], backends: [all[0]!, b('10.97.0.250')] } : { healthy: all, backends: all })), {}, prev))!;
  t.equal(swapped.ops?.length, swapped.script.split('\n').filter(Boolean).length, 'a backend replaced: one step for each line of the script');
  t.same(swapped.ops?.filter((o) => o.op.includes('counter')), [
    { op: 'add-counter', family: 'ip', name: 's0p0b10_97_0_250_conns' },
    { op: 'add-counter', family: 'ip', name: 's0p0b10_97_0_250_to_backend' },
    { op: 'add-counter', family: 'ip', name: 's0p0b10_97_0_250_to_client' },
    ...['conns', 'to_backend', 'to_client'].map((set) => ({ op: 'delete-counter-elements', family: 'ip', set, elements: [{ vip: '10.98.0.0', backend: '10.97.0.2', proto: 'tcp', port: 8080 }, { vip: '10.98.0.0', backend: '10.97.0.3', proto: 'tcp', port: 8080 }] })),
    { op: 'add-counter-elements', family: 'ip', set: 'conns', elements: [{ vip: '10.98.0.0', backend: '10.97.0.250', proto: 'tcp', port: 8080, counter: 's0p0b10_97_0_250_conns' }] },
    { op: 'add-counter-elements', family: 'ip', set: 'to_backend', elements: [{ vip: '10.98.0.0', backend: '10.97.0.250', proto: 'tcp', port: 8080, counter: 's0p0b10_97_0_250_to_backend' }] },
    { op: 'add-counter-elements', family: 'ip', set: 'to_client', elements: [{ vip: '10.98.0.0', backend: '10.97.0.250', proto: 'tcp', port: 8080, counter: 's0p0b10_97_0_250_to_client' }] },
    ...['2', '3'].flatMap((a) => ['conns', 'to_backend', 'to_client'].map((k) => ({ op: 'delete-counter', family: 'ip', name: `s0p0b10_97_0_${a}_${k}` }))),
  ], 'the new backend\'s counters added first, the byte-map elements swapped, the gone backends\' counters deleted last');
  // The transaction the kernel gets for it does not grow with the services: the same datagram at 10 as at 1,000.
  const reloadBatch = (n: number): Buffer => {
    const from = renderIncremental(many(n), {});
    const d = renderPartsDelta(from, renderIncremental(many(n, (i, all) => (i === 0 ? { healthy: [all[0]!, b('10.97.0.250')], backends: [all[0]!, b('10.97.0.250')] } : { healthy: all, backends: all })), {}, from))!;
    return encodeBatch('lb_agent', d.ops!, { seq: 1, ack: true }).datagram;
  };
  const [small, large] = [reloadBatch(10), reloadBatch(1000)];
  t.ok(large.equals(small), `a backend replaced: byte for byte the same batch at 1,000 services as at 10 (${large.length} bytes)`);
  t.ok(large.length < 4096, 'one datagram of a few KiB');
  const hashed = renderIncremental(many(3), { placement: 'flow-hash' });
  const hashedDown = renderPartsDelta(hashed, renderIncremental(health(3, 1, (all) => all.slice(1)), { placement: 'flow-hash' }, hashed))!;
  t.same(hashedDown.ops?.map((o) => o.op), ['delete-slot-elements', 'add-slot-elements'], 'with VRRP: the moved slots of the maglev table, no rule');
  const moved = hashedDown.ops?.[1]?.op === 'add-slot-elements' ? hashedDown.ops[1].elements : [];
  t.ok(moved.length > 0 && moved.every((e) => e.address !== '10.97.0.5'), `the slots of the backend that went, to the others (${moved.length})`);
  const hashedUp = renderPartsDelta(renderIncremental(health(3, 1, (all) => all.slice(0, 1)), { placement: 'flow-hash' }), renderIncremental(many(3), { placement: 'flow-hash' }))!;
  t.match(hashedUp.ops?.find((o) => o.op === 'add-rule'), { chain: 's1p0', rule: { kind: 'dnat-map', pick: { kind: 'jhash', seed: dsrSeedValue('default/svc-001') } } }, 'from one backend: the seeded flow hash\'s rule');
  t.match(hashedUp.script, `seed 0x${dsrSeedValue('default/svc-001').toString(16).padStart(8, '0')} map @s1p0_slots`, 'the seed the script names');
  const six = renderIncremental({ services: [...many(2).services, { key: 'x/six', vip: 'fd00::5', ports: [http], healthy: [], backends: [] }] }, {}, prev);
  t.equal(renderPartsDelta(renderIncremental(many(2), {}), six)!.ops, undefined, 'a table appearing: nft');
});

t.test('renderNftDelta: a service going shifts later positional service names; their counters restart and are reported', async (t) => {
  const three = many(3);
  const d = renderNftDelta(renderNft(three), renderNft({ services: [three.services[0]!, three.services[2]!] }))!;
  t.ok(d.reset.has('s1p0b10_97_0_5_conns') && d.reset.has('s2p0b10_97_0_9_conns'), "svc-001's counters go, svc-002's restart as s1");
  t.notOk(d.reset.has('s0p0b10_97_0_1_conns'), 'the service before it keeps its counters');
  t.match(d.script, /delete counter ip lb_agent s2p0b10_97_0_9_conns/);
});

t.test('renderNftDelta: a table of IPv6 VIPs appears and goes whole; the netdev table is written whole when its text changes', async (t) => {
  const v4 = many(2);
  const six: ForwardState = { services: [...v4.services, { key: 'default/six', vip: '2001:db8::50', ports: [http], healthy: [{ address: '2001:db8::11', addressNum: 0, weight: 1 }], backends: [{ address: '2001:db8::11', addressNum: 0, weight: 1 }] }] };
  const up = renderNftDelta(renderNft(v4), renderNft(six))!;
  t.match(up.script, /^table ip6 lb_agent \{\}\ndelete table ip6 lb_agent\ntable ip6 lb_agent \{\n/, 'the IPv6 table defined whole');
  t.notMatch(up.script, /ip lb_agent/, 'nothing of the IPv4 table');
  const gone = renderNftDelta(renderNft(six), renderNft(v4))!;
  t.equal(gone.script, 'table ip6 lb_agent {}\ndelete table ip6 lb_agent\n');
  t.ok(gone.reset.has('v6s0p0b2001_db8__11_conns'), 'its counters go with it');
  const dsr = (healthy: BackendSpec[]): ForwardState => ({ services: [...v4.services, {
    key: 'default/dsr', vip: '10.99.0.50', ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }], healthy, backends: [b('10.99.0.11'), b('10.99.0.12')], sourceIP: 'preserve', vipMac: '02:00:00:00:00:50',
  }] });
  const both = renderNft(dsr([b('10.99.0.11'), b('10.99.0.12')]), { dsrDevice: 'eth0' });
  const one = renderNftDelta(both, renderNft(dsr([b('10.99.0.11')]), { dsrDevice: 'eth0' }))!;
  t.ok(one.dsrRewritten);
  t.match(one.script, /table netdev lb_agent \{\}\ndelete table netdev lb_agent\ntable netdev lb_agent \{/);
  t.ok(one.reset.has('s0p0b0_conns') && !one.reset.has('s1p0b10_97_0_1_conns'), 'the netdev counters (default/dsr is s0) restart, the IPv4 ones do not');
  const other = renderNftDelta(both, renderNft({ services: [dsr([b('10.99.0.11'), b('10.99.0.12')]).services[2]!, ...many(2, (i, all) => ({ healthy: i === 0 ? all.slice(1) : all, backends: all })).services] }, { dsrDevice: 'eth0' }))!;
  t.ok(other.script.length > 0, 'the other change is written');
  t.notOk(other.dsrRewritten, 'a change elsewhere leaves the netdev table alone');
});

/** A transaction's objects, whatever their order: lines sorted, and the elements within a line's braces. */
function objectsOf(script: string): string {
  return script.split('\n').map((l) => l.replace(/\{ (.*) \}$/, (_m, e: string) => `{ ${e.split(', ').sort().join(', ')} }`)).sort().join('\n');
}

t.test('renderPartsDelta: from the changed services alone, the same objects as the diff of the whole tables; unchanged services are not rendered again', async (t) => {
  const six = (i: number): ForwardState['services'][number] => ({ key: `v6/s${i}`, vip: `2001:db8::${50 + i}`, ports: [http], healthy: [{ address: '2001:db8::11', addressNum: 0, weight: 1 }], backends: [{ address: '2001:db8::11', addressNum: 0, weight: 1 }] });
  const dsr = (healthy: BackendSpec[]): ForwardState['services'][number] => ({
    key: 'default/dsr', vip: '10.99.0.50', ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }], healthy, backends: [b('10.99.0.11'), b('10.99.0.12')], sourceIP: 'preserve', vipMac: '02:00:00:00:00:50',
  });
  // Two services on one VIP whose ports go to the same backend:targetPort share a byte-counter key.
  const shared = (key: string, port: number): ForwardState['services'][number] => ({ key, vip: '10.98.9.9', ports: [{ name: '', port, protocol: 'TCP', targetPort: 8080 }], healthy: [b('10.97.9.1')], backends: [b('10.97.9.1')] });
  const base = many(30).services;
  const cases: Array<[string, ForwardState, ForwardState]> = [
    ['one backend swapped', { services: base }, many(30, (i, all) => ({ healthy: i === 7 ? [all[0]!, b('10.97.0.250')] : all, backends: i === 7 ? [all[0]!, b('10.97.0.250')] : all }))],
    ['one backend down', { services: base }, many(30, (i, all) => ({ healthy: i === 12 ? all.slice(1) : all, backends: all }))],
    ['the last healthy backend gone', { services: base }, many(30, (i, all) => ({ healthy: i === 12 ? [] : all, backends: all }))],
    ['a service in the middle removed', { services: base }, { services: base.filter((_, i) => i !== 25) }],
    ['a service added', { services: base.filter((_, i) => i !== 25) }, { services: base }],
    ['a VIP lost', { services: base }, { services: base.map((s, i) => (i === 3 ? { ...s, vip: undefined } : s)) }],
    ['the first user of a shared byte key goes', { services: [...base, shared('z/one', 80), shared('z/two', 81)] }, { services: [...base, shared('z/two', 81)] }],
    ['a shared VIP keeps its set element', { services: [...base, shared('z/one', 80), shared('z/two', 81)] }, { services: [...base, shared('z/one', 80)] }],
    ['the IPv6 table appears', { services: base }, { services: [...base, six(1)] }],
    ['an IPv6 service added', { services: [...base, six(1)] }, { services: [...base, six(1), six(2)] }],
    ['the IPv6 table goes', { services: [...base, six(1), six(2)] }, { services: base }],
    ['a DSR backend down', { services: [...base, dsr([b('10.99.0.11'), b('10.99.0.12')])] }, { services: [...base, dsr([b('10.99.0.11')])] }],
    ['hand-back begins', { services: base }, { services: base.map((s, i) => (i === 9 ? { ...s, handBack: '10.99.0.4' } : s)) }],
    ['hand-back ends', { services: base.map((s, i) => (i === 9 || i === 10 ? { ...s, handBack: '10.99.0.4' } : s)) }, { services: base.map((s, i) => (i === 10 ? { ...s, handBack: '10.99.0.4' } : s)) }],
  ];
  for (const [what, from, to] of cases) {
    const opts = { dsrDevice: 'eth0' };
    const prev = renderIncremental(from, opts);
    const next = renderIncremental(to, opts, prev);
    t.equal(next.plan.script, renderNft(to, opts).script, `${what}: the plan is renderNft's`);
    const fresh = renderNft(to, opts);
    t.same([next.plan.dsr, next.plan.handBack, next.plan.devices, next.plan.problems, next.plan.dsrTable], [fresh.dsr, fresh.handBack, fresh.devices, fresh.problems, fresh.dsrTable], `${what}: and so are its DSR ports, hand-back counters, devices and problems`);
    const whole = renderNftDelta(renderNft(from, opts), renderNft(to, opts))!;
    const parts = renderPartsDelta(prev, next)!;
    t.equal(objectsOf(parts.script), objectsOf(whole.script), `${what}: the same objects as the whole diff`);
    t.same([...parts.reset].sort(), [...whole.reset].sort(), `${what}: the same counters restart`);
    t.same(parts.resetCounters.map((c) => c.name).sort(), [...parts.reset].filter((n) => !n.endsWith('_handed_back')).sort(), `${what}: what each restarting counter counted is known`);
    const kept = next.parts.filter((p) => partOf(prev, p.key) === p).length;
    t.ok(kept >= next.parts.length - (what.includes('removed') || what.includes('added') ? 15 : 1), `${what}: ${kept} of ${next.parts.length} services not rendered again (${parts.changed.size} changed)`);
  }
  const same = renderIncremental(many(30), {});
  t.equal(renderPartsDelta(same, renderIncremental(many(30), {}, same))!.script, '', 'no change: nothing to write');
});

t.test('renderIncremental at 1,000 services: one backend down renders that service alone, as a render from scratch does; the 999 others are the previous objects', async (t) => {
  const to = many(1000, (i, all) => ({ healthy: i === 500 ? all.slice(1) : all, backends: all }));
  const prev = renderIncremental(many(1000), {});
  t.ok(prev.plan.script.length > 1_000_000, 'the whole table written first (its text built)');
  const next = renderIncremental(to, {}, prev);
  const fresh = renderIncremental(to, {});
  const reused = next.parts.filter((p) => partOf(prev, p.key) === p);
  t.equal(reused.length, 999, 'every other service\'s part is the previous object');
  const part = partOf(next, 'default/svc-500')!;
  t.not(part, partOf(prev, 'default/svc-500'), 'the changed service is rendered again');
  t.same(part, partOf(fresh, 'default/svc-500'), 'its part is the one a render from scratch gives');
  t.same(next.parts.map((p) => p.key), fresh.parts.map((p) => p.key), 'in the same order');
  const delta = renderPartsDelta(prev, next)!;
  t.same([...delta.changed], ['default/svc-500'], 'one service changed');
  t.equal(delta.script, renderNftDelta(renderNft(many(1000)), renderNft(to))!.script, 'the transaction of the whole tables\' diff');
  t.equal(next.plan.script, fresh.plan.script, 'and the whole table, read again, is the scratch render\'s');
});

t.test('render: a state frozen as the config is (services, ports, backends) renders as an unfrozen one', async (t) => {
  const freeze = (s: ForwardState): ForwardState => Object.freeze({
    services: Object.freeze(s.services.map((x) => Object.freeze({ ...x, ports: Object.freeze(x.ports.map((p) => Object.freeze({ ...p }))), healthy: Object.freeze(x.healthy.map((h) => Object.freeze({ ...h }))), backends: Object.freeze(x.backends.map((h) => Object.freeze({ ...h }))) }))),
  });
  const plain = many(5, (i, all) => ({ healthy: i === 2 ? all.slice(1) : all, backends: all }));
  t.equal(renderIncremental(freeze(plain), {}).plan.script, renderNft(plain).script);
});

t.test('renderIncremental: a change to another service takes the netdev table\'s lines and DSR ports from the previous plan; a DSR service\'s change renders them again', async (t) => {
  const dsr = (healthy: BackendSpec[]): ForwardState['services'][number] => ({
    key: 'default/dsr', vip: '10.99.0.50', ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }], healthy, backends: [b('10.99.0.11'), b('10.99.0.12')], sourceIP: 'preserve', vipMac: '02:00:00:00:00:50',
  });
  const opts = { dsrDevice: 'eth0' };
  const both = dsr([b('10.99.0.11'), b('10.99.0.12')]);
  const prev = renderIncremental({ services: [...many(30).services, both] }, opts);
  const other = renderIncremental({ services: [...many(30, (i, all) => ({ healthy: i === 4 ? all.slice(1) : all, backends: all })).services, both] }, opts, prev);
  t.equal(other.plan.dsrLines, prev.plan.dsrLines, 'another service changed: the same lines, not rendered again');
  t.equal(other.plan.dsr, prev.plan.dsr, 'and the same BPF ports');
  const down = { services: [...many(30).services, dsr([b('10.99.0.11')])] };
  const changed = renderIncremental(down, opts, prev);
  t.not(changed.plan.dsrLines, prev.plan.dsrLines, 'the DSR service changed: rendered again');
  t.same(changed.plan.dsrLines, renderNft(down, opts).dsrLines, 'as renderNft renders them');
  t.notSame(changed.plan.dsrLines, prev.plan.dsrLines, 'with its backend gone');
});

t.test('canonicalTableJson: equal tables compare equal whatever the handles, counter values and element order', async (t) => {
  t.equal(canonicalTableJson(listing()), canonicalTableJson(listing({ handleBase: 40, packets: 1234, elemOrder: 'ba' })));
  t.not(canonicalTableJson(listing()), canonicalTableJson(listing({ extraRule: true })), 'a rule added by hand is a difference');
  t.throws(() => canonicalTableJson('{"x":1}'), /not nft JSON/);
});

t.test('parseNftCounters reads named counters of our table only', async (t) => {
  const json = JSON.stringify({
    nftables: [
      { metainfo: {} },
      { counter: { family: 'ip', name: 's0p0b10_99_0_11_conns', table: 'lb_agent', handle: 3, packets: 7, bytes: 420 } },
      { counter: { family: 'ip', name: 'other', table: 'filter', handle: 4, packets: 1, bytes: 1 } },
    ],
  });
  t.same([...parseNftCounters(json)], [['s0p0b10_99_0_11_conns', { packets: 7, bytes: 420 }]]);
});

t.test('flowTotals: live counters plus what earlier tables carried over', async (t) => {
  const plan = renderNft({ services: [{ key: 'x/y', vip: '10.99.0.80', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] });
  const live = new Map([
    ['s0p0b10_99_0_11_conns', { packets: 5, bytes: 300 }],
    ['s0p0b10_99_0_11_to_backend', { packets: 20, bytes: 2000 }],
    ['s0p0b10_99_0_11_to_client', { packets: 30, bytes: 9000 }],
  ]);
  const id = flowId('x/y', http, '10.99.0.11');
  const carry = new Map([[id, { conns: 10, toBackend: 1, toClient: 2 }]]);
  t.same(flowTotals(plan, live, carry).get(id), { conns: 15, toBackend: 2001, toClient: 9002 }, 'connections are first packets; bytes are bytes');
  t.same(carry.get(id), { conns: 10, toBackend: 1, toClient: 2 }, 'carry not mutated');
  t.same(flowTotals(undefined, live, new Map()).size, 0);
});

t.test('handedBackTotals: per service, live plus carried, flow counters apart; a removed service\'s count goes', async (t) => {
  const svc = { key: 'x/y', vip: '10.99.0.80', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] };
  const state: ForwardState = { services: [{ ...svc, handBack: '10.99.0.4' }] };
  const plan = renderNft(state, { dsrDevice: 'eth0' });
  const live = new Map([['s0_handed_back', { packets: 3, bytes: 180 }], ['s0p0b10_99_0_11_conns', { packets: 9, bytes: 0 }]]);
  t.same([...handedBackTotals(plan, live, new Map([['x/y', 2]]), state)], [['x/y', 5]]);
  t.same(flowTotals(plan, live, new Map()).get(flowId('x/y', http, '10.99.0.11'))?.conns, 9, 'the flow totals do not count it');
  // The window closed (a table without the rule): the count stays with the service.
  const later = renderNft({ services: [svc] }, { dsrDevice: 'eth0' });
  t.same([...handedBackTotals(later, new Map(), new Map([['x/y', 5]]), { services: [svc] })], [['x/y', 5]]);
  t.same([...handedBackTotals(later, new Map(), new Map([['x/y', 5]]), { services: [] })], [], 'gone with the service');
});

/** A /proc of the data path's sysctls (ip_forward on), removed after the test. */
function fakeProc(t: tap.Test): string {
  const proc = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-nft-proc-'));
  t.teardown(() => fs.rmSync(proc, { recursive: true, force: true }));
  fs.mkdirSync(path.join(proc, 'sys/net/ipv4'), { recursive: true });
  fs.writeFileSync(path.join(proc, 'sys/net/ipv4/ip_forward'), '1\n');
  return proc;
}

function fakeExec(handlers: Record<string, (args: readonly string[]) => { stdout?: string; stderr?: string; code?: string | number }>): Exec {
  return async (file, args) => {
    const r = handlers[file]?.(args) ?? {};
    if (r.code !== undefined) throw Object.assign(new Error(r.stderr ?? 'failed'), { code: r.code, stderr: r.stderr ?? '' });
    return { stdout: r.stdout ?? '', stderr: r.stderr ?? '' };
  };
}

t.test('probeNftables: verdicts and reasons', async (t) => {
  t.same(await probeNftables({ exec: fakeExec({ nft: () => ({}), unshare: () => ({}) }) }),
    { ok: true, reason: 'nftables accepted a test table in a throwaway namespace' });
  const missing = await probeNftables({ exec: fakeExec({ nft: () => ({ code: 'ENOENT' }) }) });
  t.equal(missing.ok, false);
  t.match(missing.reason, /nft not found/);
  const kernel = await probeNftables({
    exec: fakeExec({ nft: () => ({}), unshare: () => ({ code: 1, stderr: '/dev/stdin:40:3-20: Error: Could not process rule: No such file or directory\n\t\tnumgen inc mod 3\n' }) }),
  });
  t.match(kernel.reason, /kernel rejected the test table .*Could not process rule/);
  // No namespace allowed: falls back to nft --check, which changes nothing.
  const checks: string[][] = [];
  const viaCheck = await probeNftables({
    exec: fakeExec({
      unshare: () => ({ code: 1, stderr: 'unshare: unshare failed: Operation not permitted' }),
      nft: (args) => { checks.push([...args]); return {}; },
    }),
  });
  t.equal(viaCheck.ok, true);
  t.match(viaCheck.reason, /checked without committing; no throwaway namespace: unshare: unshare failed: Operation not permitted/);
  t.same(checks[1], ['--check', '-f', '-'], 'the fallback only checks');
  const eperm = await probeNftables({
    exec: fakeExec({
      unshare: () => ({ code: 'ENOENT' }),
      nft: (args) => (args[0] === '--check' ? { code: 1, stderr: 'Error: Could not process rule: Operation not permitted' } : {}),
    }),
  });
  t.same([eperm.ok, /not permitted \(needs root or CAP_NET_ADMIN\)/.test(eperm.reason)], [false, true]);
});

t.test('probeDsr: loads the DSR probe table the same way, and names the kernel options when refused', async (t) => {
  const seen: string[] = [];
  const ok = await probeDsr({ exec: async (file, args, input) => { seen.push(`${file} ${args.join(' ')}`); if (input) seen.push(input); return { stdout: '', stderr: '' }; } });
  t.same(ok, { ok: true, reason: 'nftables accepted a test table in a throwaway namespace' });
  t.ok(seen.some((l) => l.includes('hook ingress device "lo"') && l.includes('fwd ip to')), 'the netdev table went to the kernel');
  const refused = await probeDsr({ exec: fakeExec({ nft: () => ({}), unshare: () => ({ code: 1, stderr: 'Error: Could not process rule: No such file or directory\nfwd ip to 192.0.2.11 device "lo"' }) }) });
  t.equal(refused.ok, false);
  t.match(refused.reason, /CONFIG_NFT_FWD_NETDEV.*Could not process rule/);
});

t.test('execProgram: a child that exits without reading its input is a rejection, not a crash', async (t) => {
  // unshare without CAP_SYS_ADMIN exits at once; writing the script to it then fails with EPIPE.
  const { execProgram } = await import('../../agent/forward/nft');
  for (let i = 0; i < 5; i++) {
    await t.rejects(execProgram('/bin/false', [], 'table ip x {}\n'.repeat(100_000)), { code: 1 });
  }
});

t.test('ICMP redirects go off on every interface but the agent\'s own service macvlans, which forward nothing out (issue 18)', async (t) => {
  const proc = fakeProc(t);
  const svc = linkNameForService('default/web');
  for (const name of ['all', 'default', 'eth0', svc, 'lbvnotours']) {
    fs.mkdirSync(path.join(proc, 'sys/net/ipv4/conf', name), { recursive: true });
    fs.writeFileSync(path.join(proc, 'sys/net/ipv4/conf', name, 'send_redirects'), '1\n');
  }
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: '', stderr: '' };
  };
  const dp = new NftDataplane({ registry: new Registry(), exec, procRoot: proc, clock: new ManualClock(0) });
  t.teardown(() => dp.stop({ keep: true }));
  await dp.apply({ services: [] });
  const value = (name: string): string => fs.readFileSync(path.join(proc, 'sys/net/ipv4/conf', name, 'send_redirects'), 'utf8').trim();
  t.same(['all', 'default', 'eth0', 'lbvnotours'].map(value), ['0', '0', '0', '0'], 'off where the kernel may forward a packet back out');
  t.equal(value(svc), '1', `${svc}, a service macvlan, not read or written`);
  t.same([...((await dp.stats()).details.sendRedirectsDisabledOn as string[])].sort(), ['all', 'default', 'eth0', 'lbvnotours'], 'and status says where');
});

t.test('counters are read when a scrape asks, at most once per countersEveryMs, and never while nobody asks; a table just written counts from zero without a read', async (t) => {
  // A flow at zero has no traffic series (forward/metrics.ts); its stats say 0 at once.
  const proc = fakeProc(t);
  const one: ForwardState = { services: [{ key: 'default/web', vip: '10.99.0.50', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] };
  const calls: string[] = [];
  let conns = 3;
  const exec: Exec = async (file, args) => {
    calls.push(`${file} ${args.join(' ')}`);
    if (file === 'nft' && args.includes('counters')) {
      return { stdout: JSON.stringify({ nftables: [{ counter: { family: 'ip', name: 's0p0b10_99_0_11_conns', table: 'lb_agent', packets: conns, bytes: 180 } }] }), stderr: '' };
    }
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: '', stderr: '' };
  };
  const clock = new ManualClock(0);
  const registry = new Registry();
  const dp = new NftDataplane({ registry, exec, procRoot: proc, clock, countersEveryMs: 5000 });
  t.teardown(() => dp.stop({ keep: true }));
  await dp.apply(one);
  const series = /lbagent_forward_connections_total\{service="web",namespace="default",backend="10\.99\.0\.11",port="http"\} (\d+)/;
  const reads = (): number => calls.filter((c) => c.includes('list counters')).length;
  // Issue 18: the apply spawned nft to write the table and nothing more.
  t.equal(reads(), 0, 'no counter read right after the table was written');
  // Nobody asks for an hour: nothing reads.
  for (let i = 0; i < 12; i++) { clock.advance(300_000); await new Promise((r) => setTimeout(r, 2)); }
  t.equal(reads(), 0, 'an hour without a scrape reads no counter');
  t.equal(series.exec(await registry.metrics())?.[1], '3', 'the first scrape reads the counters and shows them');
  t.equal(reads(), 1, 'one read for that scrape');
  conns = 7;
  clock.advance(4999); // past the metrics' 250 ms cache (on the data path's clock), within countersEveryMs
  for (let i = 0; i < 3; i++) t.equal(series.exec(await registry.metrics())?.[1], '3', `scrape ${i + 1} within countersEveryMs shows the last read`);
  t.equal(reads(), 1, 'three scrapes within countersEveryMs share the one read');
  await dp.apply({ services: [...one.services] });
  t.equal(reads(), 1, 'an apply that leaves the table as it is spawns nothing (a VRRP takeover waits on it)');
  clock.advance(250); // past the cache of the scrapes above, and countersEveryMs since the read
  t.equal(series.exec(await registry.metrics())?.[1], '7', 'a scrape once countersEveryMs passed reads again: the current counters');
  t.equal(reads(), 2);
  clock.advance(60_000);
  await new Promise((r) => setTimeout(r, 20));
  t.equal(reads(), 2, 'and nothing reads again until the next scrape');
});

t.test('a table without counters is rewritten without reading any: one nft process per apply while VIPs bind (issue 18)', async (t) => {
  const proc = fakeProc(t);
  const calls: string[] = [];
  const exec: Exec = async (file, args) => {
    calls.push(`${file} ${args.join(' ')}`);
    if (file === 'nft' && args.includes('counters')) {
      return { stdout: JSON.stringify({ nftables: [{ counter: { family: 'ip', name: 's0p0b10_99_0_11_conns', table: 'lb_agent', packets: 4, bytes: 240 } }] }), stderr: '' };
    }
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: '', stderr: '' };
  };
  const dp = new NftDataplane({ registry: new Registry(), exec, procRoot: proc, clock: new ManualClock(0) });
  t.teardown(() => dp.stop({ keep: true }));
  const writes = (): number => calls.filter((c) => c === 'nft -f -').length;
  const reads = (): number => calls.filter((c) => c.includes('list counters')).length;
  // DHCP services bound one after the other, none with a backend yet (the bench's case): VIPs, ports, no counters.
  const bound = (n: number): ForwardState => ({
    services: Array.from({ length: n }, (_, i) => ({ key: `default/s${i}`, vip: `10.99.0.${100 + i}`, ports: [http], healthy: [], backends: [] })),
  });
  await dp.apply(bound(0));
  for (let n = 1; n <= 5; n++) await dp.apply(bound(n));
  t.equal(writes(), 6, 'every change written');
  t.equal(reads(), 0, 'no counter read: no table had a counter');
  t.same((await dp.stats()).flows, [], 'stats of a table without counters spawn nothing either');
  t.equal(reads(), 0);
  // A backend gives the table counters; a health change writes only what changed, and they keep counting in the kernel.
  const withBackend: ForwardState = { services: [{ key: 'default/s0', vip: '10.99.0.100', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] };
  await dp.apply(withBackend);
  t.equal(reads(), 0, 'the table before it had no counter to read');
  await dp.apply({ services: [{ ...withBackend.services[0]!, healthy: [] }] });
  t.equal(reads(), 0, 'the counters outlive an incremental change: nothing to read before it');
  t.equal(writes(), 8, 'the change written');
  const flow = (await dp.stats()).flows.find((f) => f.backend === '10.99.0.11');
  t.equal(flow?.connections, 4, 'the live 4, counted once');
  // A repair writes the tables whole: their counters restart, so they are read first and carried over.
  await dp.repair();
  t.equal(reads(), 2, 'read once before the rewrite');
  const carried = (await dp.stats()).flows.find((f) => f.backend === '10.99.0.11');
  t.equal(carried?.connections, 8, 'the old table\'s 4 carried over, plus the live 4');
});

t.test('a table rewritten whole when its counters cannot be read carries them as last read: totals never go backwards', async (t) => {
  const proc = fakeProc(t);
  let conns = 4;
  let unreadable = false;
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args.includes('counters')) {
      if (unreadable) throw Object.assign(new Error('nft: busy'), { code: 1, stderr: 'Error: Device or resource busy' });
      return { stdout: JSON.stringify({ nftables: [{ counter: { family: 'ip', name: 's0p0b10_99_0_11_conns', table: 'lb_agent', packets: conns, bytes: conns * 60 } }] }), stderr: '' };
    }
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: '', stderr: '' };
  };
  const clock = new ManualClock(0);
  const dp = new NftDataplane({ registry: new Registry(), exec, procRoot: proc, clock });
  t.teardown(() => dp.stop({ keep: true }));
  const state: ForwardState = { services: [{ key: 'default/s0', vip: '10.99.0.100', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] };
  await dp.apply(state);
  const connections = async (): Promise<number | undefined> => (await dp.stats()).flows.find((f) => f.backend === '10.99.0.11')?.connections;
  t.equal(await connections(), 4, 'the live 4');
  // The kernel's table counts 2 more, then its counters cannot be read just before a repair rewrites it.
  conns = 6;
  unreadable = true;
  await dp.repair();
  // The new table counts from zero: 1 so far.
  unreadable = false;
  conns = 1;
  clock.advance(60_000);
  t.equal(await connections(), 5, 'the 4 last read carried, plus the new table\'s 1: the 2 counted between the read and the rewrite are lost, nothing goes backwards');
});

t.test('a delta goes over netlink when every step is encoded, with nft otherwise or when the netlink write fails; each counted, the writer\'s commits ours', async (t) => {
  const proc = fakeProc(t);
  const scripts: string[] = [];
  const exec = fakeExec({ nft: (args) => (args[0] === '-j' ? { code: 1, stderr: 'Error: No such file or directory' } : {}) });
  const recording: Exec = async (file, args, input, hooks) => { if (file === 'nft' && args[0] === '-f') scripts.push(input ?? ''); return exec(file, args, input, hooks); };
  const batches: Array<readonly NftOp[]> = [];
  let refuse: Error | undefined;
  let made = 0;
  const writer: BatchWriter = {
    port: 4_000_000_123,
    write: async (_table, ops) => { if (refuse) throw refuse; batches.push(ops); },
    close: () => undefined,
  };
  const registry = new Registry();
  const dp = new NftDataplane({ registry, exec: recording, procRoot: proc, clock: new ManualClock(0), batchWriter: () => { made++; return writer; } });
  t.teardown(() => dp.stop({ keep: true }));
  const health = (k: number) => many(3, (i, all) => ({ healthy: i === 1 ? all.slice(0, k) : all, backends: all }));
  await dp.apply(health(3));
  t.equal(scripts.length, 1, 'the start writes the table whole with nft');
  t.equal(made, 0, 'no socket for a write whole');
  await dp.apply(health(2));
  t.equal(scripts.length, 1, 'a health transition spawns no nft');
  t.equal(batches.length, 1, 'it is one batch');
  t.ok(dp.ownsCommit(undefined, 4_000_000_123), 'a commit from the writer\'s port is the agent\'s own');
  t.notOk(dp.ownsCommit(undefined, 4_000_000_124), 'another port is not');
  refuse = new (require('../../agent/net/netlink/nft-batch') as typeof import('../../agent/net/netlink/nft-batch')).NftBatchError('refused', 2, undefined);
  await dp.apply(health(1));
  t.equal(scripts.length, 2, 'refused over netlink: the same delta with nft');
  t.match(scripts[1], /^flush chain ip lb_agent s1p0\n/, 'the delta, not the table');
  t.notMatch(scripts[1], /table ip lb_agent \{/);
  refuse = undefined;
  const added = { services: [...health(1).services, { key: 'default/new', vip: '10.98.9.9', ports: [http], healthy: [b('10.97.9.1')], backends: [b('10.97.9.1')] }] };
  await dp.apply(added);
  t.equal(scripts.length, 2, 'a service added (counters, byte maps, its VIP): no nft');
  t.equal(batches.length, 2, 'one more batch');
  t.ok(batches[1]!.some((o) => o.op === 'add-counter') && batches[1]!.some((o) => o.op === 'add-counter-elements') && batches[1]!.some((o) => o.op === 'add-addresses'), 'its counters, byte-map elements and VIP among the steps');
  const six: BackendSpec = { address: 'fd00::97:1', addressNum: 0, weight: 1, family: 'IPv6' };
  await dp.apply({ services: [...added.services, { key: 'default/six', vip: 'fd00::9', ports: [http], healthy: [six], backends: [six] }] });
  t.equal(scripts.length, 3, 'an IPv6 table appearing: with nft');
  t.match(scripts[2], /\ntable ip6 lb_agent \{\n/);
  t.equal(batches.length, 2);
  const details = (await dp.stats()).details as { deltaWrites?: unknown };
  t.same(details.deltaWrites, { netlink: 2, nft: 2, unencoded: 1, netlinkFailed: 1 }, 'counted in the stats');
  const text = await registry.metrics();
  for (const [labels, n] of [['via="netlink",reason=""', 2], ['via="nft",reason="unencoded"', 1], ['via="nft",reason="netlink-failed"', 1], ['via="nft",reason=""', 0]] as const) {
    t.match(text, `lbagent_forward_nft_delta_writes_total{${labels}} ${n}\n`, `metric ${labels}`);
  }
  t.equal(made, 1, 'one socket kept across a refusal');
});

t.test('direct server return: the BPF program in front of the table, counted with it; a failing program falls back to the table alone', async (t) => {
  const proc = fakeProc(t);
  const web = (healthy: BackendSpec[]): ForwardState => ({ services: [{
    key: 'default/web', vip: '10.99.0.50', ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }], healthy, backends: [b('10.99.0.11'), b('10.99.0.12')],
    sourceIP: 'preserve', vipMac: '02:00:00:00:00:50',
  }] });
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args.includes('counters')) {
      const family = args[args.indexOf('table') + 1];
      const counters = family === 'netdev' ? [{ counter: { family: 'netdev', name: 's0p0b0_conns', table: 'lb_agent', packets: 2, bytes: 120 } }] : [];
      return { stdout: JSON.stringify({ nftables: counters }), stderr: '' };
    }
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: '', stderr: '' };
  };
  const events: string[] = [];
  let fail: Error | undefined;
  let active = false;
  const fake = {
    apply: (ports: readonly { slots: readonly number[] }[]) => {
      events.push(`apply ${ports.length} port(s), ${ports[0]!.slots.length} slots`);
      if (fail) throw fail;
      active = true;
      return { replaced: 'own', unreadable: 0 };
    },
    detach: () => { events.push('detach'); active = false; },
    release: () => { events.push('release'); active = false; },
    get active() { return active; },
    counters: () => new Map([['s0p0b0_conns', { packets: 40, bytes: 0 }], ['s0p0b0_to_backend', { packets: 90, bytes: 5000 }]]),
  };
  const registry = new Registry();
  const clock = new ManualClock(0);
  const dp = new NftDataplane({ registry, exec, procRoot: proc, clock, dsrDevice: 'eth0', dsrBpf: () => fake as unknown as DsrBpf });
  await dp.apply(web([b('10.99.0.11'), b('10.99.0.12')]));
  t.same(events, ['apply 1 port(s), 1021 slots'], 'the program loaded with the table\'s slot table');
  t.same(dp.dsr, { engine: 'bpf', cause: 'tcx', reason: 'BPF program at tc ingress (tcx) of eth0, in front of table netdev lb_agent' });
  const st = await dp.stats();
  const f = st.flows.find((x) => x.backend === '10.99.0.11')!;
  t.same([f.connections, f.bytesToBackend], [42, 5000], 'program and table counters add up under the same names');
  t.match(await registry.metrics(), /lbagent_forward_dsr_engine_info\{engine="bpf",cause="tcx"\} 1/);

  fail = Object.assign(new Error('cannot load the DSR program: EPERM'), { code: 'LB_ERR_FORWARD_DSR_BPF' });
  await dp.apply(web([b('10.99.0.11')]));
  t.same(events.slice(1), ['apply 1 port(s), 1 slots', 'detach'], 'a failed swap detaches ours: the new table alone serves, never the old program');
  t.equal(dp.dsr?.engine, 'nft');
  t.equal(dp.dsr?.cause, 'fallback');
  t.match(dp.dsr?.reason, /cannot run here \(cannot load the DSR program: EPERM\); table netdev lb_agent forwards alone/);
  clock.advance(300); // past the metrics' 250 ms cache, on the data path's clock
  t.match(await registry.metrics(), /lbagent_forward_dsr_engine_info\{engine="nft",cause="fallback"\} 1/);

  fail = undefined;
  await dp.apply({ services: [] });
  t.equal(dp.dsr, undefined, 'no DSR port: no engine');
  t.equal(events[events.length - 1], 'detach');
  await dp.stop({ keep: true });
  t.equal(events[events.length - 1], 'release', 'a planned restart leaves the attachment for the next process');

  const forced: string[] = [];
  const dp2 = new NftDataplane({ exec, procRoot: proc, clock: new ManualClock(0), dsrDevice: 'eth0', dsrEngine: 'nft', dsrBpf: () => ({ ...fake, apply: () => forced.push('apply'), detach: () => forced.push('detach') }) as unknown as DsrBpf });
  await dp2.apply(web([b('10.99.0.11')]));
  t.same(forced, ['detach'], 'LB_AGENT_DSR_ENGINE=nft: nothing loaded, a leftover program detached');
  t.same(dp2.dsr?.cause, 'forced');
  await dp2.stop();
  t.same(forced, ['detach', 'detach'], 'stop removes the program with the tables');

  // Without CAP_SYS_ADMIN and nothing handed back by the fd store, programs at the hook cannot be told apart: said.
  const lines: string[] = [];
  const dp3 = new NftDataplane({
    exec, procRoot: proc, clock: new ManualClock(0), dsrDevice: 'eth0', log: createLogger('info', { write: (line: string) => { lines.push(line); } }),
    dsrBpf: () => ({ ...fake, apply: () => ({ replaced: 'none', unreadable: 1 }) }) as unknown as DsrBpf,
  });
  await dp3.apply(web([b('10.99.0.11')]));
  t.ok(lines.some((l) => l.includes('"op":"dsr-engine"') && l.includes('"unreadable":1') && l.includes('may not open by id')), 'a program it may not open and none handed back: the log warns');
  await dp3.stop({ keep: true });
});

t.test('a health transition of a DSR service: the apply\'s commit log comes after the write and the program\'s swap, and names the services it changed', async (t) => {
  const proc = fakeProc(t);
  const svc = (key: string, vip: string, healthy: BackendSpec[]): ForwardState['services'][number] => ({
    key, vip, ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }], healthy, backends: [b('10.99.0.11'), b('10.99.0.12')],
    sourceIP: 'preserve', vipMac: '02:00:00:00:00:50',
  });
  const state = (healthy: BackendSpec[]): ForwardState => ({ services: [svc('default/web', '10.99.0.50', healthy), svc('default/other', '10.99.0.51', [b('10.99.0.11')])] });
  const order: string[] = [];
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args[0] === '-f') order.push('nft -f');
    if (file === 'nft' && args[0] === '-j' && !args.includes('counters')) throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: JSON.stringify({ nftables: [] }), stderr: '' };
  };
  let active = false;
  const fake = {
    apply: (ports: readonly { slots: readonly number[] }[]) => { order.push(`program swapped (${ports.length} ports)`); active = true; return { replaced: 'own', unreadable: 0 }; },
    detach: () => { active = false; }, release: () => { active = false; }, get active() { return active; }, counters: () => new Map(),
  };
  const logged: Record<string, unknown>[] = [];
  const log = createLogger('debug', { write: (line: string) => { const l = JSON.parse(line) as Record<string, unknown>; logged.push(l); if (l['op'] === 'apply') order.push(`log: ${String(l['msg'])}`); } });
  // The daemon's writer: the netdev table has no typed form, so the delta goes to nft.
  const writer: BatchWriter = { port: 1, write: async () => { order.push('netlink write'); }, close: () => undefined };
  const dp = new NftDataplane({ exec, procRoot: proc, clock: new ManualClock(0), dsrDevice: 'eth0', log, dsrBpf: () => fake as unknown as DsrBpf, batchWriter: () => writer });
  await dp.apply(state([b('10.99.0.11'), b('10.99.0.12')]));
  order.length = 0;
  await dp.apply(state([b('10.99.0.11')]));
  t.same(order, [
    'log: the delta holds a step the netlink writer does not encode; writing it with nft',
    'nft -f',
    'program swapped (2 ports)',
    'log: nftables tables updated by changed objects',
  ], 'a note before the write, the commit\'s line after the table and the program hold the change');
  const done = logged.find((l) => l['msg'] === 'nftables tables updated by changed objects')!;
  t.same([done['services'], done['changed']], [1, ['default/web']], 'the commit\'s line names the service that changed, and only it');
  await dp.stop({ keep: true });
});

t.test('no DSR: the driver loads at start only when an earlier process left our netdev table; bpf(2) refused there is no problem', async (t) => {
  const proc = fakeProc(t);
  const web: ForwardState = { services: [{ key: 'default/web', vip: '10.99.0.50', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] }] };
  const start = async (netdevLeft: boolean): Promise<{ made: number; asked: number; dp: NftDataplane; order: string[] }> => {
    const order: string[] = [];
    const exec: Exec = async (file, args, input) => {
      if (file === 'nft' && args[0] === '-j' && !args.includes('counters')) {
        if (netdevLeft && args.includes('netdev')) return { stdout: JSON.stringify({ nftables: [{ table: { family: 'netdev', name: 'lb_agent' } }] }), stderr: '' };
        throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
      }
      if (file === 'nft' && args[0] === '-f' && input?.includes('delete table netdev lb_agent')) order.push('write');
      return { stdout: JSON.stringify({ nftables: [] }), stderr: '' };
    };
    const r = { made: 0, asked: 0, dp: undefined as unknown as NftDataplane, order };
    const refused = { detach: () => { r.asked++; order.push('detach'); throw Object.assign(new Error("EPERM: operation not permitted, bpf 'BPF_PROG_QUERY'"), { code: 'EPERM' }); }, release: () => undefined, active: false };
    r.dp = new NftDataplane({ exec, procRoot: proc, clock: new ManualClock(0), dsrDevice: 'eth0', dsrBpf: () => { r.made++; return refused as unknown as DsrBpf; } });
    await r.dp.apply(web);
    return r;
  };

  const clean = await start(false);
  t.equal(clean.made, 0, 'no netdev table at start: the BPF driver is not even loaded');
  t.equal(clean.dp.dsr, undefined);
  await clean.dp.apply({ services: [] });
  t.equal(clean.made, 0, 'nor by a later apply without DSR');
  await clean.dp.stop();
  t.equal(clean.made, 0, 'nor by a stop');

  const left = await start(true);
  t.ok(left.made === 1 && left.asked >= 1, 'our netdev table left at start: the first apply looks for the program in front of it');
  t.equal(left.order[0], 'detach', 'and detaches it before the write that removes the table');
  t.same((await left.dp.stats()).problems, [], 'a refusal is not shown as a problem');
  t.equal(left.dp.dsr, undefined);
  const asked = left.asked;
  await left.dp.apply({ services: [] });
  t.equal(left.asked, asked, 'a later apply that leaves the netdev part as it is (an incremental one) does not ask again');
  await left.dp.repair();
  t.equal(left.asked, asked + 1, 'a write whole without DSR asks again, because this process has a driver');
  await left.dp.stop({ keep: true });
});

t.test('UDP flows: the ports whose backends lost a member (or that went) are swept, nothing else', async (t) => {
  const web = (healthy: readonly BackendSpec[], more: Partial<ForwardState['services'][number]> = {}): ForwardState => ({ services: [{
    key: 'default/web', vip: '10.99.0.50', ports: [http, dns], healthy, backends: [b('10.99.0.11'), b('10.99.0.12'), b('10.99.0.13')], ...more,
  }] });
  const rule = (r: UdpFlowRule | undefined): { key: string; allowed: string[] } | undefined => (r ? { key: `${r.vip}:${r.port}`, allowed: [...r.allowed].sort() } : undefined);
  const all = web([b('10.99.0.11'), b('10.99.0.12'), b('10.99.0.13')]);
  t.same(udpFlowSweep(undefined, all).map(rule), [{ key: '10.99.0.50:53', allowed: ['10.99.0.11:5353', '10.99.0.12:5353', '10.99.0.13:5353'] }],
    'at start every UDP port (an earlier process\'s flows are unknown)');
  t.same(udpFlowSweep(all, all), [], 'nothing changed: no sweep');
  t.same(udpFlowSweep(web([b('10.99.0.11')]), all), [], 'backends only added: no sweep');
  t.same(udpFlowSweep(web([]), web([b('10.99.0.11')])).map(rule), [{ key: '10.99.0.50:53', allowed: ['10.99.0.11:5353'] }],
    'back from none healthy: a flow seen meanwhile had no DNAT and would keep skipping it');
  t.same(udpFlowSweep(all, web([b('10.99.0.11', 3), b('10.99.0.12'), b('10.99.0.13')])), [], 'a weight change moves no open flow');
  t.same(udpFlowSweep(all, web([b('10.99.0.11'), b('10.99.0.13')])).map(rule), [{ key: '10.99.0.50:53', allowed: ['10.99.0.11:5353', '10.99.0.13:5353'] }], 'one left: the rest may keep their flows');
  t.same(udpFlowSweep(all, web([])).map(rule), [{ key: '10.99.0.50:53', allowed: [] }], 'none healthy: every flow ends (the next datagram is refused)');
  t.same(udpFlowSweep(all, web([b('10.99.0.11')], { ports: [http, { ...dns, targetPort: 5354 }] })).map(rule), [{ key: '10.99.0.50:53', allowed: ['10.99.0.11:5354'] }], 'a new targetPort: flows to the old one end');
  t.same(udpFlowSweep(all, web(all.services[0]!.healthy, { ports: [http] })).map(rule), [{ key: '10.99.0.50:53', allowed: [] }], 'the UDP port went from the config');
  t.same(udpFlowSweep(all, { services: [] }).map(rule), [{ key: '10.99.0.50:53', allowed: [] }], 'the service went');
  t.same(udpFlowSweep(all, web(all.services[0]!.healthy, { vip: undefined })).map(rule), [{ key: '10.99.0.50:53', allowed: [] }], 'the VIP left this node');
  t.same(udpFlowSweep(web(all.services[0]!.healthy, { sourceIP: 'preserve', vipMac: '02:00:00:00:00:50' }), web([], { sourceIP: 'preserve', vipMac: '02:00:00:00:00:50' })), [],
    'direct server return never goes through conntrack');
  t.same(udpFlowSweep({ services: [{ ...all.services[0]!, ports: [http] }] }, { services: [{ ...all.services[0]!, ports: [http], healthy: [] }] }), [], 'TCP is never swept: its connections end and drain');
});

t.test('UDP flows: swept after the commit; a sweep that fails is a problem in status, never a failed apply', async (t) => {
  const proc = fakeProc(t);
  const order: string[] = [];
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    if (file === 'nft' && args[0] === '-f') order.push('write');
    return { stdout: JSON.stringify({ nftables: [] }), stderr: '' };
  };
  let fail = false;
  const swept: string[][] = [];
  const conntrack: ConntrackClient = {
    endUdpFlows: async (rules) => {
      order.push('sweep');
      swept.push(rules.map((r) => `${r.vip}:${r.port}=${[...r.allowed].sort().join(',')}`));
      if (fail) throw new Error('ctnetlink: EPERM');
      return { ended: 2, gone: 0, byPort: new Map(rules.map((r) => [`${r.vip}:${r.port}`, 2])) };
    },
    endUntranslatedFlows: async () => { throw new Error('not in this test'); },
    close: () => order.push('close'),
  };
  let made = 0;
  const dp = new NftDataplane({ exec, procRoot: proc, clock: new ManualClock(0), conntrack: () => { made++; return conntrack; } });
  const web = (healthy: BackendSpec[]): ForwardState => ({ services: [{ key: 'default/web', vip: '10.99.0.50', ports: [http, dns], healthy, backends: [b('10.99.0.11'), b('10.99.0.12')] }] });
  await dp.apply({ services: [] });
  t.equal(made, 0, 'a table without a UDP port never opens ctnetlink (nor loads its module)');
  await dp.apply(web([b('10.99.0.11'), b('10.99.0.12')]));
  t.same(swept, [], 'a port that only gained backends: nothing swept');
  await dp.apply(web([b('10.99.0.12')]));
  t.same(swept, [['10.99.0.50:53=10.99.0.12:5353']], 'b1 left: its flows are swept, b2 may keep its own');
  t.same(order.slice(-2), ['write', 'sweep'], 'after the commit: a flow\'s next datagram meets the new table');
  t.same((await dp.stats()).udpFlowsEnded, [{ service: 'default/web', port: 'dns', ended: 2 }], 'the ended flows are counted under their service and port');
  fail = true;
  await dp.apply(web([]));
  t.match((await dp.stats()).problems.join('\n'), /cannot end the UDP flows .*EPERM/, 'the failure is shown in status');
  fail = false;
  const other = { key: 'default/other', vip: '10.99.0.51', ports: [http], healthy: [b('10.99.0.11')], backends: [b('10.99.0.11')] };
  await dp.apply({ services: [...web([]).services, other] });
  t.match((await dp.stats()).problems.join('\n'), /cannot end the UDP flows/, 'a later write that sweeps nothing does not hide it');
  await dp.apply(web([b('10.99.0.11')]));
  t.notMatch((await dp.stats()).problems.join('\n'), /cannot end the UDP flows/, 'and cleared by the next sweep that works');
  t.same((await dp.stats()).udpFlowsEnded, [{ service: 'default/web', port: 'dns', ended: 4 }], 'a failed sweep counts nothing; the next one adds its own');
  await dp.apply({ services: [{ ...web([b('10.99.0.11')]).services[0]!, ports: [http] }] });
  t.same((await dp.stats()).udpFlowsEnded, [], 'the port went: its count goes with it');
  await dp.stop();
  t.same(swept.at(-1), ['10.99.0.50:53='], 'stopping (the table removed) ends every UDP flow it forwarded');
  t.equal(order.at(-1), 'close');
  t.equal(made, 1, 'one client for the life of the data path');
});

t.test('VIPs that came onto this node: their untranslated flows end in one sweep per batch, outside the apply queue; a failure is a problem in status', async (t) => {
  const proc = fakeProc(t);
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: JSON.stringify({ nftables: [] }), stderr: '' };
  };
  let fail = false;
  const asked: string[][] = [];
  const conntrack: ConntrackClient = {
    endUdpFlows: async () => ({ ended: 0, gone: 0, byPort: new Map() }),
    endUntranslatedFlows: async (ports) => {
      asked.push(ports.map((p) => `${p.vip}:${p.proto}/${p.port}`));
      if (fail) throw new Error('ctnetlink: EPERM');
      return { ended: 1, gone: 0, byPort: new Map() };
    },
    close: () => undefined,
  };
  const clock = new ManualClock(0);
  const dp = new NftDataplane({ exec, procRoot: proc, clock, conntrack: () => conntrack });
  await dp.apply({ services: [] });
  const arrive = async (...calls: [string, PortSpec[]][]): Promise<void> => {
    const done = calls.map(([vip, ports]) => dp.vipArrived(vip, ports));
    clock.advance(ARRIVALS_BATCH_MS);
    await Promise.all(done);
  };
  await arrive(['10.99.0.50', []]);
  t.same(asked, [], 'no port: ctnetlink is not asked');
  await arrive(['10.99.0.50', [http, dns, { ...http, name: 'again' }]], ['10.99.0.51', [http]]);
  t.same(asked, [['10.99.0.50:6/80', '10.99.0.50:17/53', '10.99.0.51:6/80']], 'two VIPs arriving together: one sweep, each VIP, protocol and port once');
  t.equal((await dp.stats()).details['untranslatedFlowsEnded'], 1, 'counted in status');
  const early = dp.vipArrived('10.99.0.52', [http]);
  clock.advance(ARRIVALS_BATCH_MS - 1);
  await new Promise((r) => setImmediate(r));
  t.equal(asked.length, 1, `not before ARRIVALS_BATCH_MS (${ARRIVALS_BATCH_MS} ms)`);
  clock.advance(1);
  await early;
  t.equal(asked.length, 2);
  fail = true;
  await arrive(['10.99.0.50', [http]]);
  t.match((await dp.stats()).problems.join('\n'), /cannot end the untranslated conntrack entries to 10\.99\.0\.50 .*EPERM/, 'the failure is shown in status, not thrown');
  fail = false;
  await arrive(['10.99.0.50', [http]]);
  t.notMatch((await dp.stats()).problems.join('\n'), /untranslated/, 'and cleared by the next one that works');
  t.equal((await dp.stats()).details['untranslatedFlowsEnded'], 3);
  await dp.stop();
  await arrive(['10.99.0.50', [http]]);
  t.equal(asked.length, 4, 'nothing after stop');
});

t.test('a health transition among 10 or 1,000 services reads the same services and parts: the work does not grow with the count', async (t) => {
  // Every service and every part of the previous rendering behind a proxy
  // that counts property reads: a service or part that is only carried
  // over (compared by identity, copied as a reference) is never read.
  const reads = { n: 0 };
  const counted = <T extends object>(o: T): T => new Proxy(o, { get: (target, p, receiver) => { reads.n++; return Reflect.get(target, p, receiver) as unknown; } });
  const down = (i: number, all: BackendSpec[]) => ({ healthy: i === 7 ? all.slice(1) : all, backends: all });
  const measure = (n: number): { reads: number[]; changed: string[]; script: string; rendered: number } => {
    const up = many(n).services.map(counted);
    const one = counted(many(n, down).services[7]!);
    const states = [up, up.map((s, i) => (i === 7 ? one : s)), up];
    const wrapped = new WeakSet<object>();
    const once = (p: ServicePart): ServicePart => {
      if (wrapped.has(p)) return p;
      const c = counted(p);
      wrapped.add(c);
      return c;
    };
    const wrap = (x: Rendering): Rendering => ({ ...x, parts: x.parts.map(once) });
    let r = wrap(renderIncremental({ services: states[0]! }, {}));
    const out = { reads: [] as number[], changed: [] as string[], script: '', rendered: 0 };
    // Down, up, down again: the first transition after a whole render also builds the VIP index once.
    for (const services of [states[1]!, states[2]!, states[1]!]) {
      reads.n = 0;
      const next = renderIncremental({ services }, {}, r);
      const d = renderPartsDelta(r, next)!;
      out.reads.push(reads.n);
      out.changed = [...d.changed];
      out.script = d.script;
      out.rendered = next.parts.filter((p, i) => p !== r.parts[i]).length;
      r = wrap(next);
    }
    return out;
  };
  const [small, large] = [measure(10), measure(1000)];
  t.ok(small.reads[1]! > 0, `a transition reads the changed service and its parts (${small.reads.join(', ')} reads at 10 services)`);
  t.same(large.reads.slice(1), small.reads.slice(1), `the same reads at 1,000 services as at 10 (${large.reads.join(', ')})`);
  t.equal(large.reads[0]! - small.reads[0]!, 990, 'the first transition after a whole render reads each part\'s VIP once more: the VIP index, built once for the renderings that follow');
  t.same([large.changed, large.rendered], [['default/svc-007'], 1], 'one service changed, one part rendered');
  t.equal(large.script, small.script, 'the same transaction');
  t.ok(large.script.includes('s7p0_slots') && !/10\.97\.0\.29 \. 8080/.test(large.script.split('\n').find((l) => l.startsWith('add element')) ?? '10.97.0.29 . 8080'), 'which takes the backend that went down out of the service\'s slots');
});

t.test('the stats of 10 or 1,000 services read no service of the state: they take the normalization the apply kept', async (t) => {
  const reads = { n: 0 };
  const counted = <T extends object>(o: T): T => new Proxy(o, { get: (target, p, receiver) => { reads.n++; return Reflect.get(target, p, receiver) as unknown; } });
  const exec: Exec = async (file, args) => {
    if (file === 'nft' && args.includes('counters')) return { stdout: JSON.stringify({ nftables: [] }), stderr: '' };
    if (file === 'nft' && args[0] === '-j') throw Object.assign(new Error('absent'), { code: 1, stderr: 'Error: No such file or directory' });
    return { stdout: '', stderr: '' };
  };
  const measure = async (n: number): Promise<{ reads: number; flows: number; services: number }> => {
    const dp = new NftDataplane({ exec, procRoot: fakeProc(t), clock: new ManualClock(0) });
    t.teardown(() => dp.stop({ keep: true }));
    await dp.apply({ services: many(n).services.map(counted) });
    reads.n = 0;
    const st = await dp.stats();
    return { reads: reads.n, flows: st.flows.length, services: st.services.length };
  };
  const [small, large] = [await measure(10), await measure(1000)];
  t.same([small.services, large.services], [10, 1000], 'every service is in the stats');
  t.ok(large.flows > small.flows && small.flows > 0, `with its flows (${small.flows}, ${large.flows})`);
  t.equal(large.reads, small.reads, `the same reads of the state at 1,000 services as at 10 (${large.reads})`);
});
