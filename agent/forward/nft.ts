// forward/ layer: the kernel data path (`dataplane: kernel`). Three parts:
// - renderNft(): PURE, desired forwarding state -> the tables the agent owns
//   (`table ip lb_agent`, and `table netdev lb_agent` for direct server
//   return, rendered by nft-dsr.ts, in the same transaction) as objects and
//   as the nft script that writes them whole, plus the map from counter
//   names back to (service, port, backend);
// - renderNftDelta(): PURE, two renders -> the transaction of what changed;
//   renderIncremental() and renderPartsDelta() do the same from the
//   services whose inputs changed alone (each service's part of the tables
//   is kept by its inputs), which is what the driver uses;
// - pure helpers to compare a listed table with a rendered one and to read
//   counters out of `nft -j` output;
// - NftDataplane: the thin driver that writes a delta as one nfnetlink
//   batch (net/netlink/nft-batch.ts) when every step of it has a typed
//   form, and runs `nft -f -` otherwise (the delta, or the tables whole),
//   checks the table at start, reads counters for stats and metrics (over
//   nfnetlink), and removes the table at stop.
// Plus probeNftables(), which the preflight and `dataplane: auto` use.
//
// Packet path for a VIP this node holds (client C, VIP V, backend B):
//   prerouting (nat, dstnat)  V:port -> slot (numgen, or jhash with VRRP)
//                             -> B:targetPort (DNAT by the port's slot map);
//                             a connection's first packet only: conntrack
//                             pins the choice for the rest of the connection,
//                             so established connections keep their backend
//                             when the set changes (drain for free). Only
//                             while V is a local address (`fib daddr type
//                             local`): a ready VRRP Backup keeps the rules
//                             armed, and after it yields, clients whose ARP
//                             entry still names its MAC keep sending to it;
//                             forwarding those would open connections that
//                             the new Master cannot know and resets when the
//                             ARP entry moves. Not dispatched, they are routed
//                             on unchanged to the new Master (or wait for a
//                             retransmitted SYN); conntrack keeps such a flow
//                             untranslated, and the agent deletes those
//                             entries when V comes back (vipArrived).
//   forward (filter)          bytes per backend and direction (named counters);
//   postrouting (nat, srcnat) a connection per backend (named counters, by
//                             the DNAT's result); source C -> V (SNAT to
//                             the VIP), see below;
//   input (filter)            V:port with no healthy backend: TCP reset /
//                             ICMP port unreachable at once, never a hang.
// Locally originated connections to a VIP take the output nat hook instead of
// prerouting (same dispatch map, same local-VIP condition: on a Backup a
// local connection to the VIP goes to the Master; dispatched here, it would
// leave SNATed to the VIP and its replies would go to the Master). UDP is per flow (conntrack's notion: client
// address:port to VIP:port): a flow keeps its backend while packets keep
// coming within nf_conntrack_udp_timeout, but not once that backend left the
// port's healthy set (or the port went): after the commit the agent deletes
// those conntrack entries (net/conntrack.ts), and the flow's next datagram is
// placed again. A UDP flow has no end a client would wait for, so "draining"
// it would blackhole a steady sender behind a dead backend for good.
// Needs net.ipv4.ip_forward=1 (set by the driver) and conntrack (loaded by
// the kernel with the nat chains; count and limit are reported in stats).
//
// Why SNAT to the VIP: backends sit on the same L2 as the client, so without
// source NAT a backend answers the client directly from its own address, the
// client drops the reply (it talked to V), and the connection never comes up.
// Rewriting the source so replies come back through this node is therefore
// always needed here. SNAT to the VIP rather than `masquerade`: the source
// stays the VIP whatever interface the route to the backend uses (a DHCP VIP
// lives on a macvlan, backends are reached through the parent), each VIP gets
// its own source-port space instead of all services sharing the node
// address's, a client that is itself a backend (hairpin) works, and
// masquerade's per-packet source-address lookup and its conntrack flush when
// the interface address changes are avoided. The client always sees the VIP
// as the source of replies: conntrack reverses the DNAT on the way back.
//
// Why `numgen inc` over `numgen random`: with a slot table of sum(weights)
// entries laid out in smooth weighted round-robin order, `inc` walks the
// table, so every window of sum(weights) new connections splits exactly by
// weight and the sequence interleaves (a a b a c ...) as nginx's does.
// `random` only converges: with weights 1:2:3 over 300 connections the
// lightest backend's share has a standard deviation of ~13% of its expected
// value, too loose for small services. The counter is one atomic per rule;
// it restarts at slot 0 when its rule is rewritten, which only shifts the
// phase. Its modulus is fixed per port (roundRobinModulus) and the healthy
// set's table repeated to fill it, so a health transition rewrites slots
// of the map, not the rule.
//
// Why a hash with VRRP (placement 'flow-hash'): peers do not share
// conntrack, so when a Master dies the new one meets the packets of
// connections it never saw open. Conntrack picks them up mid-flow
// (nf_conntrack_tcp_loose, on by default) and they take the nat hook like a
// first packet: with `numgen inc` each would go to whichever backend is next
// on this node's counter, which resets it. `jhash ip saddr . th sport` onto
// the seeded maglev table of direct server return (maglev.ts, nft-dsr.ts
// dsrSeed) is a function of the flow, the config and the healthy set alone,
// so every peer sends a flow where the old Master did; the source NAT to the
// VIP keeps the client's port unless another flow holds it, and the backend
// sees the same connection go on. The cost is the exact split: a hash
// spreads by weight only on average, as `random` does (above). Without VRRP
// there is no one to agree with, and round-robin stays.
//
// Why changes are written as a delta, and the table whole only at start
// and on repair: a change to one backend among a thousand services would
// otherwise be a transaction of the whole table (tens of thousands of
// lines) and a read of every counter first. renderPartsDelta writes the
// chains, map elements and counters that differ, worked out from the
// services whose inputs changed (the others' parts are kept, not rendered
// or compared again), in one transaction, which
// the kernel commits atomically as it does a whole table: packets see the
// old objects or the new ones, never a mix, and the base chains' hooks stay
// registered throughout (conntrack NAT bindings of established connections
// survive). Named counters of unchanged objects keep counting; those a
// delta deletes or gives another meaning (a service's position names its
// objects, so a service before it going shifts them; a backend's address
// names its own, so backends coming or going rename no other) restart at zero, and so do all of
// them when the table is written whole: the driver reads those just before
// the write, when their flows stay, and carries the totals over (the
// packets of the few milliseconds between that read and the commit are not
// counted).
import { execFile } from 'node:child_process';
import * as fs from 'node:fs/promises';
import * as path from 'node:path';
import type { Registry } from 'prom-client';
import type { PortSpec, Protocol } from '../config/types';
import { LbError, errorMessage } from '../errors';
import { silentLogger, type Logger } from '../log';
import { roundRobinModulus, roundRobinSlots } from './balancer';
import {
  flowId, normalizeState, normalizeStateFrom, portLabel,
  type Dataplane, type NormalizedState, type FlowStats, type ForwardState, type ForwardStats, type NormalizedService, type Placement, type ProbeResult, type UdpFlowsEnded,
} from './dataplane';
import { ForwardMetrics, StatsReadFailure } from './metrics';
import { DSR_FAMILY, DSR_PROBE_RULESET, DSR_TABLE, dsrDevices, dsrRemovalLines, dsrSeedValue, flowHashPick, flowHashSlots, renderDsrPort, renderDsrTable, type DsrPortRender } from './nft-dsr';
import { SerialQueue } from '../serial';
import type { DsrBpfPort } from '../net/ebpf/ebpf-dsr';
import type { DsrBpf, DsrFdStore } from '../net/ebpf/ebpf-attach';
import type { ConntrackClient, ForwardedPort, UdpFlowRule } from '../net/conntrack/conntrack';
import type { NftCounterElement, NftDispatchElement, NftFamily, NftOp, NftProto, NftRuleSpec, NftSlotElement, NftVerdict } from '../net/netlink/nft-batch';
import { hasOwnedName } from '../net/ownership/ownership';

// The BPF driver loads on demand: when a DSR port is forwarded, and at the
// first apply when an earlier process left our netdev table, to look for the
// program it may have left in front of it (syncBpf). Ours is always detached
// before that table goes (detachBeforeTableGoes, stop, `lb-agent withdraw`),
// so with no table there is no program of ours to find, and a start without
// DSR never loads the driver.
 
const ebpfAttach = (): typeof import('../net/ebpf/ebpf-attach') => require('../net/ebpf/ebpf-attach') as typeof import('../net/ebpf/ebpf-attach');
const nftCountersModule = (): typeof import('../net/netlink/nft-counters') => require('../net/netlink/nft-counters') as typeof import('../net/netlink/nft-counters');
const nftBatchModule = (): typeof import('../net/netlink/nft-batch') => require('../net/netlink/nft-batch') as typeof import('../net/netlink/nft-batch');

/** The most service keys an apply's log names (a reload may change every service). */
const CHANGED_LOGGED = 20;

// Loaded at the first change of a UDP port's healthy set: what a config does not use is not loaded.
const conntrackModule = (): typeof import('../net/conntrack/conntrack') => require('../net/conntrack/conntrack') as typeof import('../net/conntrack/conntrack');
import { realClock, type Clock } from '../clock';

export const NFT_FAMILY = 'ip';
/** The family of the table of IPv6 VIPs, beside `ip` (same name, same transaction). */
export const NFT6_FAMILY = 'ip6';
export const NFT_TABLE = 'lb_agent';

export type NftCounterKind = 'conns' | 'to_backend' | 'to_client';
export { DSR_FAMILY, DSR_TABLE };

/** A named counter in the table and what it counts. */
export interface NftCounterRef {
  readonly name: string;
  readonly kind: NftCounterKind;
  readonly service: string;
  readonly port: PortSpec;
  readonly backend: string;
}

export interface NftPlan {
  /** The nft script: `nft -f -` applies it as one transaction. */
  readonly script: string;
  readonly counters: readonly NftCounterRef[];
  readonly problems: readonly string[];
  /** The forwarded DSR ports, for the BPF program in front of the netdev table (empty when none). */
  readonly dsr: readonly DsrBpfPort[];
  /** The hand-back counters (VRRP takeover), one per service handing back (empty when none). */
  readonly handBack: readonly HandBackCounter[];
  /** The tables of `ip` and (while an IPv6 VIP is held) `ip6` as objects, for renderNftDelta. */
  readonly tables: readonly NftTableModel[];
  /** The netdev table's part of the script (its removal, then its definition when a DSR port is forwarded). */
  readonly dsrLines: readonly string[];
  /** The NICs the script names (the netdev table's hooks and `fwd`, hand-back's `dup`): the start check stands a veth in for each. */
  readonly devices: readonly string[];
  /** The plan defines `table ip6 lb_agent` (an IPv6 VIP is held). */
  readonly ip6: boolean;
  /** The plan defines the netdev table (a DSR port is forwarded). */
  readonly dsrTable: boolean;
}

/** A service's hand-back counter: packets handed back to the previous Master `to`. */
export interface HandBackCounter { readonly name: string; readonly service: string; readonly to: string }

export interface RenderOptions {
  /** Upper bound on the slot table of one service port (weights are scaled down past it). */
  readonly maxSlots?: number;
  /** The SNAT path's placement (default 'round-robin'); direct server return always hashes. */
  readonly placement?: Placement;
  /** The parent NIC, where direct server return hooks ingress and forwards (nft-dsr.ts) and hand-back copies leave; needed for sourceIP: preserve and for hand-back. */
  readonly dsrDevice?: string | undefined;
  /** With no IPv6 VIP held: delete `table ip6 lb_agent` all the same (a previous plan, or an earlier process, may have left one). */
  readonly ip6Removal?: boolean | undefined;
}

const proto = (p: Protocol): NftProto => (p === 'UDP' ? 'udp' : 'tcp');

// Hand-back (VRRP takeover, SNAT path). Peers share no conntrack: a
// connection the previous Master opened is picked up here from the
// client's next packet (the flow hash sends it to the same backend, SNAT to
// the VIP keeps its tuple), but a backend's answer already on its way when
// the VIP moved reaches this node first, finds no entry, and the kernel
// answers it with a reset: the backend drops the connection. For a few
// seconds after a takeover, such a packet (TCP from a backend's target
// port to the VIP that conntrack here sees as new or invalid) is sent on
// to the previous Master (`dup to` its address, then dropped here), whose
// conntrack still maps it to the client when only its agent died or it
// handed over alive. Only a packet that came straight from the backend is
// handed on: its TTL is still an initial one (64 Linux, 128 Windows, 255).
// A handed-on copy leaves with one less, and one the previous Master sends
// on again (it forwards the VIP's traffic, or hands it back to its own
// Master) arrives with less still, so it is never handed on twice: no
// bounce between two nodes that both lack the flow. (A per-segment set did
// that job first, keyed by addresses, ports and sequence number; a pure ACK
// and the data after it share a sequence number, and the data was dropped
// as a copy - vrrp-agent-splitbrain caught it, where a loser forwarding for
// stale ARP entries hands every backend packet back.) A backend with
// another initial TTL, or behind a router, gets no hand-back: the answer is
// refused as before. A node that is gone loses the answer, as before.
// IPv6 is the same in `table ip6` with the hop limit for the TTL (Linux and
// Windows start at 64 and 128 too, RFC 4861's default is 64); the previous
// Master there is the link-local address its IPv6 adverts came from
// (RFC 5798 §5.1.2.1), which names a host only with the device: `dup to
// fe80::... device` resolves its MAC by neighbour discovery on that link.
const HAND_BACK_TTLS = '{ 64, 128, 255 }';

/** The hand-back rules of one service (its TCP target ports), or undefined when it has none. */
function renderHandBack(prefix: string, svc: NormalizedService, device: string | undefined, w: NftFamilyWords): { rule: string; chain: NftChainModel; counter: HandBackCounter } | undefined {
  if (svc.handBack === undefined || svc.vip === undefined || svc.sourceIP !== 'snat' || device === undefined || svc.all.length === 0) return undefined;
  const tcp = svc.ports.filter((p) => p.spec.protocol === 'TCP');
  if (tcp.length === 0) return undefined;
  const targetPorts = [...new Set(tcp.map((p) => p.spec.targetPort))].sort((a, b) => a - b);
  const name = `${prefix}_handed_back`;
  const chain = `hand_back_${prefix}`;
  return {
    counter: { name, service: svc.key, to: svc.handBack },
    rule: `${w.ip} daddr ${svc.vip} ${w.ip} saddr { ${svc.all.map((b) => b.address).join(', ')} } tcp sport { ${targetPorts.join(', ')} } ${w.ttl} ${HAND_BACK_TTLS} ct state new,invalid goto ${chain}`,
    chain: { name: chain, rules: [`counter name "${name}" dup to ${svc.handBack} device "${device}" drop`] },
  };
}

/** A string safe inside an nft `#` comment (one line, printable). */
function commentSafe(s: string): string {
  return s.replace(/[^\x20-\x7e]/g, '?');
}

function elements(lines: readonly string[]): string[] {
  if (lines.length === 0) return [];
  return ['\t\telements = {', ...lines.map((l) => `\t\t\t${l},`), '\t\t}'];
}

/**
 * The words of one address family in the table: IPv4 VIPs live in `table ip
 * lb_agent`, IPv6 VIPs in `table ip6 lb_agent`, written in the same
 * transaction; the rules are the same with these words swapped.
 */
interface NftFamilyWords {
  readonly family: string;
  /** The selector of addresses in a rule: `ip` or `ip6`. */
  readonly ip: string;
  readonly addrType: string;
  /** How a UDP port with no healthy backend is refused. */
  readonly unreachable: string;
  /** The selector of a packet's TTL: `ip ttl` or `ip6 hoplimit`. */
  readonly ttl: string;
  /** The DNAT target of a backend and port (`[addr]:port` for IPv6). */
  dnatTo(address: string, port: number): string;
}

const IPV4_WORDS: NftFamilyWords = {
  family: NFT_FAMILY, ip: 'ip', addrType: 'ipv4_addr', unreachable: 'reject with icmp type port-unreachable', ttl: 'ip ttl',
  dnatTo: (a, port) => `${a}:${port}`,
};
const IPV6_WORDS: NftFamilyWords = {
  family: NFT6_FAMILY, ip: 'ip6', addrType: 'ipv6_addr', unreachable: 'reject with icmpv6 type port-unreachable', ttl: 'ip6 hoplimit',
  dnatTo: (a, port) => `[${a}]:${port}`,
};

/** What the services of one family put into their table. */
interface TableParts {
  /** Names of the named counters. */
  readonly counters: string[];
  readonly vips: Set<string>;
  readonly serviceElems: string[];
  readonly serviceSpecs: NftDispatchElement[];
  readonly refusedElems: string[];
  readonly refusedSpecs: NftDispatchElement[];
  readonly connsElems: string[];
  readonly toBackendElems: string[];
  readonly toClientElems: string[];
  /** connsElems, toBackendElems and toClientElems as typed objects, one for each. */
  readonly connsSpecs: NftCounterElement[];
  readonly toBackendSpecs: NftCounterElement[];
  readonly toClientSpecs: NftCounterElement[];
  readonly byteKeys: Set<string>;
  /** The ports' slot maps. */
  readonly maps: NftSetModel[];
  readonly chains: NftChainModel[];
  readonly handBack: string[];
  readonly handBackChains: NftChainModel[];
}

function emptyParts(): TableParts {
  return {
    counters: [], vips: new Set(), serviceElems: [], serviceSpecs: [], refusedElems: [], refusedSpecs: [], connsElems: [], toBackendElems: [], toClientElems: [],
    connsSpecs: [], toBackendSpecs: [], toClientSpecs: [], byteKeys: new Set(), maps: [], chains: [], handBack: [], handBackChains: [],
  };
}

/**
 * One chain of a table: its name, the hook line of a base chain, its rules
 * (nft syntax, without indentation). The unit an incremental update adds,
 * rewrites (flush and add its rules, in one transaction) or deletes.
 */
export interface NftChainModel {
  readonly name: string;
  readonly hook?: string;
  readonly rules: readonly string[];
  /** The rules as typed objects, one for each of `rules`, when every one has a form the netlink writer encodes (net/netlink/nft-batch.ts). */
  readonly specs?: readonly NftRuleSpec[];
}

/** A named set or map of a table: its elements (`key` for a set, `key : value` for a map) are what an incremental update adds and deletes. */
export interface NftSetModel {
  readonly name: string;
  readonly kind: 'set' | 'map';
  /** Its type (`ipv4_addr`, `ipv4_addr . inet_proto . inet_service : verdict`), or `typeof ...` for a map declared by the expressions that read it. */
  readonly type: string;
  readonly elements: readonly string[];
  /** The elements as typed objects, one for each of `elements` (the dispatch maps'), for the netlink writer. */
  readonly specs?: readonly NftDispatchElement[];
  /** The same for the byte-counter maps' elements. */
  readonly counterSpecs?: readonly NftCounterElement[];
  /** Its elements are addresses, typed as they are written (the `vips` set). */
  readonly addresses?: boolean;
  /** A port's slot map: its protocol (its declaration names it), the target port and each slot's backend address (its elements). */
  readonly slots?: SlotMapData;
}

/** What a port's slot map holds: slot i -> addresses[i] . port. */
interface SlotMapData { readonly proto: NftProto; readonly port: number; readonly addresses: readonly string[] }

/**
 * A port's slot map. Its element strings are made when read (a whole
 * write, a delta of its service), not kept: a flow-hash port has 1,021
 * slots, and a thousand such ports' strings and typed elements, kept
 * with the parts, would be a hundred MiB of heap; the addresses are the
 * backends' own strings.
 */
class SlotMapModel implements NftSetModel {
  readonly kind = 'map';
  constructor(readonly name: string, readonly type: string, readonly slots: SlotMapData) {}

  get elements(): string[] {
    const { port, addresses } = this.slots;
    return addresses.map((a, i) => `${i} : ${a} . ${port}`);
  }
}

/** The typed element of slot i of a slot map. */
function slotElement(d: SlotMapData, i: number): NftSlotElement {
  return { slot: i, address: d.addresses[i]!, port: d.port };
}

/** One family's table as objects (renderNft's text is written from it; renderNftDelta compares two). */
export interface NftTableModel {
  readonly family: string;
  /** Named counters. */
  readonly counters: readonly string[];
  readonly sets: readonly NftSetModel[];
  readonly chains: readonly NftChainModel[];
}

/** One family's table as objects. */
function tableModel(w: NftFamilyWords, t: TableParts): NftTableModel {
  const counterType = `${w.addrType} . ${w.addrType} . inet_proto . inet_service : counter`;
  const dispatchType = `${w.addrType} . inet_proto . inet_service : verdict`;
  return {
    family: w.family,
    counters: t.counters,
    sets: [
      { name: 'vips', kind: 'set', type: w.addrType, elements: [...t.vips], addresses: true },
      { name: 'services', kind: 'map', type: dispatchType, elements: t.serviceElems, specs: t.serviceSpecs },
      { name: 'refused', kind: 'map', type: dispatchType, elements: t.refusedElems, specs: t.refusedSpecs },
      { name: 'conns', kind: 'map', type: counterType, elements: t.connsElems, counterSpecs: t.connsSpecs },
      { name: 'to_backend', kind: 'map', type: counterType, elements: t.toBackendElems, counterSpecs: t.toBackendSpecs },
      { name: 'to_client', kind: 'map', type: counterType, elements: t.toClientElems, counterSpecs: t.toClientSpecs },
      ...t.maps,
    ],
    chains: [
      { name: 'prerouting', hook: 'type nat hook prerouting priority dstnat; policy accept;', rules: [`fib daddr type local ${w.ip} daddr . meta l4proto . th dport vmap @services`] },
      { name: 'output', hook: 'type nat hook output priority -100; policy accept;', rules: [`fib daddr type local ${w.ip} daddr . meta l4proto . th dport vmap @services`] },
      {
        // A nat chain sees a connection's first packet only: the conns counters count connections, after the DNAT picked the backend.
        name: 'postrouting', hook: 'type nat hook postrouting priority srcnat; policy accept;', rules: [
          `ct status dnat counter name ct original ${w.ip} daddr . ${w.ip} daddr . meta l4proto . th dport map @conns`,
          `ct status dnat ct original ${w.ip} daddr @vips snat to ct original ${w.ip} daddr`,
        ],
      },
      {
        name: 'forward', hook: 'type filter hook forward priority filter; policy accept;', rules: [
          `ct direction original counter name ct original ${w.ip} daddr . ${w.ip} daddr . meta l4proto . th dport map @to_backend`,
          `ct direction reply counter name ct original ${w.ip} daddr . ${w.ip} saddr . meta l4proto . th sport map @to_client`,
        ],
      },
      { name: 'input', hook: 'type filter hook input priority filter; policy accept;', rules: [`${w.ip} daddr . meta l4proto . th dport vmap @refused`] },
      { name: 'refuse_tcp', rules: ['reject with tcp reset'] },
      { name: 'refuse_udp', rules: [w.unreachable] },
      ...t.chains,
      ...(t.handBack.length === 0 ? [] : [
        { name: 'hand_back', hook: 'type filter hook prerouting priority mangle; policy accept;', rules: t.handBack },
        ...t.handBackChains,
      ]),
    ],
  };
}

function chainLines(c: NftChainModel): string[] {
  return [`\tchain ${c.name} {`, ...(c.hook === undefined ? [] : [`\t\t${c.hook}`]), ...c.rules.map((r) => `\t\t${r}`), '\t}'];
}

/** One family's table: create if missing, delete, define (the caller puts it in the transaction). */
function tableLines(m: NftTableModel): string[] {
  return [
    `table ${m.family} ${NFT_TABLE} {}`,
    `delete table ${m.family} ${NFT_TABLE}`,
    `table ${m.family} ${NFT_TABLE} {`,
    ...m.counters.map((c) => `\tcounter ${c} {}`),
    ...m.sets.flatMap((x) => [`\t${x.kind} ${x.name} {`, `\t\t${typeLine(x)}`, ...elements(x.elements), '\t}']),
    ...m.chains.flatMap(chainLines),
    '}',
  ];
}

/** A set's or map's type as its declaration writes it. */
function typeLine(x: NftSetModel): string {
  return x.type.startsWith('typeof ') ? x.type : `type ${x.type}`;
}

/** The lines that remove the IPv6 table whether or not it exists. */
function ip6RemovalLines(): string[] {
  return [`table ${NFT6_FAMILY} ${NFT_TABLE} {}`, `delete table ${NFT6_FAMILY} ${NFT_TABLE}`];
}

/** A backend's part of an object name: its address with `.` and `:` as `_`, so other backends coming or going rename nothing. */
function backendId(address: string): string {
  return address.replace(/[.:]/g, '_');
}

/** A map element of the byte counters (to_backend, to_client), keyed by what the forward hook sees. */
interface ByteElem {
  readonly key: string;
  readonly conns: string;
  readonly toBackend: string;
  readonly toClient: string;
  readonly connsSpec: NftCounterElement;
  readonly toBackendSpec: NftCounterElement;
  readonly toClientSpec: NftCounterElement;
}

/**
 * One service's part of the tables, rendered alone (renderPart): the unit
 * the incremental path caches by the service's inputs and renders again
 * only when they change.
 */
export interface ServicePart {
  readonly key: string;
  /** What names its objects (s<position>, v6s<position>). */
  readonly prefix: string;
  /** Everything the part is rendered from (name prefix included), as one string. */
  readonly input: string;
  readonly family: string;
  /** The VIP, when the service puts it in the `vips` set. */
  readonly vip: string | undefined;
  readonly header: readonly string[];
  /** Its flow counters (of the ip/ip6 table and of the netdev table). */
  readonly counters: readonly NftCounterRef[];
  /** The named counters it puts in its family's table (flow and hand-back). */
  readonly tableCounters: readonly string[];
  readonly serviceElems: readonly string[];
  readonly refusedElems: readonly string[];
  /** serviceElems and refusedElems as typed objects, one for each. */
  readonly serviceSpecs: readonly NftDispatchElement[];
  readonly refusedSpecs: readonly NftDispatchElement[];
  /** Its byte-counter elements; a key another service uses too goes to the first service in key order. */
  readonly byteElems: readonly ByteElem[];
  /** Its ports' slot maps. */
  readonly maps: readonly NftSetModel[];
  readonly chains: readonly NftChainModel[];
  readonly handBack: { readonly rule: string; readonly chain: NftChainModel; readonly counter: HandBackCounter } | undefined;
  readonly dsrPorts: readonly DsrPortRender[];
  readonly problems: readonly string[];
}

/** partInput's last string for a normalized service, by its object (normalizeState keeps the object of a service that did not change). */
const partInputs = new WeakMap<NormalizedService, { readonly prefix: string; readonly input: string }>();

/** The inputs of one service's part, as one string (renderPart's result depends on nothing else but the render options). */
function partInput(prefix: string, svc: NormalizedService): string {
  const kept = partInputs.get(svc);
  if (kept !== undefined && kept.prefix === prefix) return kept.input;
  const input = partInputOf(prefix, svc);
  partInputs.set(svc, { prefix, input });
  return input;
}

function partInputOf(prefix: string, svc: NormalizedService): string {
  const bs = (l: readonly { address: string; weight: number }[]): string => l.map((b) => `${b.address}*${b.weight}`).join(',');
  const ports = svc.ports.map((p) => `${p.index}:${p.spec.name}/${p.spec.protocol}/${p.spec.port}/${p.spec.targetPort}`).join(',');
  return `${prefix}|${svc.key}|${svc.vip ?? ''}|${ports}|${bs(svc.healthy)}|${bs(svc.all)}|${svc.sourceIP}|${svc.vipMac ?? ''}|${svc.handBack ?? ''}|${svc.device ?? ''}`;
}

/**
 * Flatten a string in place. A template literal gives a tree of
 * concatenations (V8's ConsString, an object per `+`), which a part kept
 * for the next render would hold for as long as the service is unchanged;
 * converting the string to a number flattens it where it is, and the
 * collector then drops the tree's nodes.
 */
function flatten(s: string): void {
  // eslint-disable-next-line @typescript-eslint/no-unused-expressions
  +s;
}

/**
 * Flatten every string a freshly rendered part holds, walking its arrays and
 * plain objects; frozen objects (the config's port specs) are not the
 * render's and are left alone.
 */
function flattenStrings(o: unknown): void {
  if (typeof o !== 'object' || o === null || Object.isFrozen(o)) return;
  if (!Array.isArray(o) && Object.getPrototypeOf(o) !== Object.prototype) return;
  for (const v of Array.isArray(o) ? o as unknown[] : Object.values(o)) {
    if (typeof v === 'string') flatten(v);
    else flattenStrings(v);
  }
}

/** renderPartOf, its strings flattened: the part is kept across renders while its service is unchanged. */
function renderPart(prefix: string, svc: NormalizedService, opts: RenderOptions): ServicePart {
  const part = renderPartOf(prefix, svc, opts);
  flattenStrings(part);
  return part;
}

/**
 * Render one service's part of the tables. Pure. `prefix` names its
 * objects (s<position>, v6s<position> for an IPv6 VIP); backends are
 * named by address (s0p0b10_99_0_11), so a backend coming or going renames
 * no other.
 */
function renderPartOf(prefix: string, svc: NormalizedService, opts: RenderOptions): ServicePart {
  const six = svc.vip?.includes(':') === true;
  const w = six ? IPV6_WORDS : IPV4_WORDS;
  const header: string[] = [];
  const counters: NftCounterRef[] = [];
  const tableCounters: string[] = [];
  const serviceElems: string[] = [];
  const refusedElems: string[] = [];
  const serviceSpecs: NftDispatchElement[] = [];
  const refusedSpecs: NftDispatchElement[] = [];
  const byteElems: ByteElem[] = [];
  const byteKeys = new Set<string>();
  const chains: NftChainModel[] = [];
  const maps: NftSetModel[] = [];
  const dsrPorts: DsrPortRender[] = [];
  const problems: string[] = [];
  const input = partInput(prefix, svc);
  const part = (handBack: ServicePart['handBack']): ServicePart => ({
    key: svc.key, prefix, input, family: w.family, vip: svc.vip !== undefined && svc.ports.length > 0 ? svc.vip : undefined,
    header, counters, tableCounters, serviceElems, refusedElems, serviceSpecs, refusedSpecs, byteElems, maps, chains, handBack, dsrPorts, problems,
  });
  if (svc.vip === undefined || svc.ports.length === 0) return part(undefined);
  for (const { spec, index: pi } of svc.ports) {
    const sp = `${prefix}p${pi}`;
    const p = proto(spec.protocol);
    const key = `${svc.vip} . ${p} . ${spec.port}`;
    const elem = (verdict: NftVerdict): NftDispatchElement => ({ vip: svc.vip!, proto: p, port: spec.port, verdict });
    const healthyText = svc.healthy.map((b) => `${b.address}(w${b.weight})`).join(' ') || 'none: refused';
    if (svc.sourceIP === 'preserve') {
      header.push(`# ${sp}: ${commentSafe(svc.key)} ${svc.vip} ${spec.protocol}/${spec.port} direct server return healthy ${healthyText}`);
      const r = renderDsrPort(sp, svc, spec, svc.device ?? opts.dsrDevice);
      dsrPorts.push(r);
      counters.push(...r.counters);
      if (r.problem) problems.push(r.problem);
      // The netdev hook steals every frame it forwards; what still reaches
      // the IP stack for this port (a fragment, a frame in the instant of a
      // rewrite) is dropped, not answered by this node's own TCP stack with
      // a reset: the client retransmits. With no healthy backend: refused.
      refusedElems.push(`${key} : ${r.dispatch !== undefined ? 'drop' : `goto refuse_${p}`}`);
      refusedSpecs.push(elem(r.dispatch !== undefined ? { kind: 'drop' } : { kind: 'goto', chain: `refuse_${p}` }));
      continue;
    }
    header.push(`# ${sp}: ${commentSafe(svc.key)} ${svc.vip} ${spec.protocol}/${spec.port} -> :${spec.targetPort} healthy ${healthyText}`);
    const backendChain = (address: string): string => `${sp}b${backendId(address)}`;
    for (const b of svc.all) {
      const base = backendChain(b.address);
      for (const kind of ['conns', 'to_backend', 'to_client'] as const) {
        const name = `${base}_${kind}`;
        tableCounters.push(name);
        counters.push({ name, kind, service: svc.key, port: spec, backend: b.address });
      }
      // Connection and byte counters are keyed on what the postrouting and
      // forward hooks see: the VIP the client used (conntrack original), the
      // backend and its port. Two ports of one VIP on the same
      // backend:targetPort cannot be told apart there; the first keeps the
      // count (nft 1.0.6 cannot put `ct original proto-dst` in a
      // concatenation: "variable sized data types").
      const bk = `${svc.vip} . ${b.address} . ${p} . ${spec.targetPort}`;
      if (!byteKeys.has(bk)) {
        byteKeys.add(bk);
        // Literals, not `{ ...at, counter }`: a spread V8 runs past its
        // inline cache makes each result a hidden class of its own, kept
        // with the part (6,000 at 1,000 services, about 2 MiB).
        const counterSpec = (counter: string): NftCounterElement => ({ vip: svc.vip!, backend: b.address, proto: p, port: spec.targetPort, counter });
        byteElems.push({
          key: bk, conns: `${bk} : "${base}_conns"`, toBackend: `${bk} : "${base}_to_backend"`, toClient: `${bk} : "${base}_to_client"`,
          connsSpec: counterSpec(`${base}_conns`), toBackendSpec: counterSpec(`${base}_to_backend`), toClientSpec: counterSpec(`${base}_to_client`),
        });
      }
    }
    if (svc.healthy.length === 0) {
      refusedElems.push(`${key} : goto refuse_${p}`);
      refusedSpecs.push(elem({ kind: 'goto', chain: `refuse_${p}` }));
      continue;
    }
    serviceElems.push(`${key} : jump ${sp}`);
    serviceSpecs.push(elem({ kind: 'jump', chain: sp }));
    const hashed = opts.placement === 'flow-hash';
    const slots = hashed ? flowHashSlots(svc) : roundRobinSlots(svc.healthy, roundRobinModulus(svc.all, opts.maxSlots), opts.maxSlots);
    const distinct = new Set(slots.map((b) => b.address));
    if (distinct.size === 1) {
      const address = slots[0]!.address;
      chains.push({
        name: sp, rules: [`meta l4proto ${p} dnat to ${w.dnatTo(address, spec.targetPort)}`],
        specs: [{ kind: 'dnat', proto: p, address, port: spec.targetPort }],
      });
    } else {
      // The slot pick as a data map (slot -> address . port): a health
      // transition rewrites the slots that change and no rule, so the
      // kernel's commit validates no chain (a verdict map of gotos makes it
      // walk every chain the table jumps to).
      const map = `${sp}_slots`;
      maps.push(new SlotMapModel(map, `typeof numgen inc mod 2 : ${w.ip} daddr . ${p} dport`, { proto: p, port: spec.targetPort, addresses: slots.map((b) => b.address) }));
      const pick = hashed ? flowHashPick(svc.key, slots.length, six ? 'ip6' : 'ip') : `numgen inc mod ${slots.length}`;
      chains.push({
        name: sp, rules: [`meta l4proto ${p} dnat ${w.ip} to ${pick} map @${map}`],
        specs: [{ kind: 'dnat-map', proto: p, map, pick: hashed ? { kind: 'jhash', seed: dsrSeedValue(svc.key), modulus: slots.length } : { kind: 'numgen', modulus: slots.length } }],
      });
    }
  }
  const hb = renderHandBack(prefix, svc, opts.dsrDevice, w);
  if (hb) {
    tableCounters.push(hb.counter.name);
    header.push(`# ${prefix}: ${commentSafe(svc.key)} ${svc.vip} hands back to ${svc.handBack} what a backend answers to connections this node never saw (VRRP takeover)`);
  }
  return part(hb);
}

/**
 * The parts of a normalized state, in its order. Positions are counted per
 * family (IPv6 names start with v6), so an IPv6 VIP coming or going
 * renames nothing in the IPv4 table. `render` gives a service's part
 * (renderPart, or a cached one for the same input).
 */
function partsOf(services: readonly NormalizedService[], render: (prefix: string, svc: NormalizedService) => ServicePart): ServicePart[] {
  let n4 = 0;
  let n6 = 0;
  return services.map((svc) => render(svc.vip?.includes(':') === true ? `v6s${n6++}` : `s${n4++}`, svc));
}

/** What the parts of one family put into its table, assembled in order (the first part to use a byte key keeps it). */
function familyParts(parts: readonly ServicePart[], family: string): TableParts {
  const t = emptyParts();
  for (const p of parts) {
    if (p.family !== family || p.vip === undefined) continue;
    t.vips.add(p.vip);
    t.counters.push(...p.tableCounters);
    t.serviceElems.push(...p.serviceElems);
    t.refusedElems.push(...p.refusedElems);
    t.serviceSpecs.push(...p.serviceSpecs);
    t.refusedSpecs.push(...p.refusedSpecs);
    t.maps.push(...p.maps);
    for (const e of p.byteElems) {
      if (t.byteKeys.has(e.key)) continue;
      t.byteKeys.add(e.key);
      t.connsElems.push(e.conns);
      t.connsSpecs.push(e.connsSpec);
      t.toBackendElems.push(e.toBackend);
      t.toClientElems.push(e.toClient);
      t.toBackendSpecs.push(e.toBackendSpec);
      t.toClientSpecs.push(e.toClientSpec);
    }
    t.chains.push(...p.chains);
    if (p.handBack) { t.handBack.push(p.handBack.rule); t.handBackChains.push(p.handBack.chain); }
  }
  return t;
}

function hasVip(parts: readonly ServicePart[], family: string): boolean {
  return parts.some((p) => p.family === family && p.vip !== undefined);
}

/** The netdev table's lines (its removal, then its definition when a DSR port is forwarded) for the parts. */
function dsrLinesOf(parts: readonly ServicePart[], opts: RenderOptions): string[] {
  return [...dsrRemovalLines(), ...renderDsrTable(opts.dsrDevice, parts.flatMap((p) => p.dsrPorts))];
}

/** What a plan gathers from the few parts that have DSR ports or a hand-back rule (planOf), kept with it for the next plan. */
interface PlanSide {
  readonly dsrParts: readonly ServicePart[];
  readonly handBackParts: readonly ServicePart[];
  readonly dsrDevice: string | undefined;
  readonly dsrLines: string[];
  readonly dsr: readonly DsrBpfPort[];
  readonly handBack: HandBackCounter[];
  readonly devices: string[];
}

const planSides = new WeakMap<NftPlan, PlanSide>();

const sameParts = (a: readonly ServicePart[], b: readonly ServicePart[]): boolean => a.length === b.length && a.every((p, i) => p === b[i]);

function planSide(dsrParts: readonly ServicePart[], handBackParts: readonly ServicePart[], opts: RenderOptions): PlanSide {
  const dsrPorts = dsrParts.flatMap((p) => p.dsrPorts);
  const handBack = handBackParts.map((p) => p.handBack!.counter);
  const devices = dsrDevices(opts.dsrDevice, dsrPorts);
  if (handBack.length > 0 && opts.dsrDevice !== undefined && !devices.includes(opts.dsrDevice)) devices.push(opts.dsrDevice);
  return {
    dsrParts, handBackParts, dsrDevice: opts.dsrDevice, dsrLines: dsrLinesOf(dsrParts, opts), handBack, devices,
    // The BPF program sits on the data path's own NIC: the IPv4 ports whose frames arrive there.
    dsr: opts.dsrDevice === undefined ? [] : dsrPorts.flatMap((p) => (p.dispatch !== undefined && p.bpf !== undefined && p.device === opts.dsrDevice ? [p.bpf] : [])),
  };
}

/**
 * The plan of a list of parts. Its script, tables and counter list are
 * built when read: an incremental apply reads none of them. The script is
 * built again at each read and never kept (the tables and the counter
 * list are kept once read). What it
 * gathers from the parts with DSR ports or a hand-back rule (the netdev
 * table's lines, the BPF ports, the devices) is `prev`'s when those parts
 * are `prev`'s objects, so an apply that changed other services walks the
 * parts once and renders none of it.
 */
function planOf(parts: readonly ServicePart[], normalizeProblems: readonly string[], opts: RenderOptions, prev?: NftPlan): NftPlan {
  const ip6 = hasVip(parts, NFT6_FAMILY);
  const dsrParts: ServicePart[] = [];
  const handBackParts: ServicePart[] = [];
  const problems = [...normalizeProblems];
  for (const p of parts) {
    if (p.dsrPorts.length > 0) dsrParts.push(p);
    if (p.handBack) handBackParts.push(p);
    for (const x of p.problems) problems.push(x);
  }
  const was = prev === undefined ? undefined : planSides.get(prev);
  const side = was !== undefined && was.dsrDevice === opts.dsrDevice && sameParts(was.dsrParts, dsrParts) && sameParts(was.handBackParts, handBackParts)
    ? was : planSide(dsrParts, handBackParts, opts);
  return planWith(parts, problems, opts, side, ip6);
}

/** A part with nothing the plan gathers from a few parts: no DSR port, no hand-back rule, no problem. */
const plain = (p: ServicePart): boolean => p.dsrPorts.length === 0 && p.handBack === undefined && p.problems.length === 0;

/**
 * planOf for `parts` that are `prev`'s parts with some replaced, each
 * replaced part and its replacement plain and on the same VIP: what the
 * plan gathers from the parts (problems, DSR and hand-back parts, the IPv6
 * table's presence) is `prev`'s, so no part is walked. Undefined when
 * that does not hold.
 */
function planReplacing(parts: readonly ServicePart[], replaced: readonly (readonly [before: ServicePart, after: ServicePart])[], opts: RenderOptions, prev: NftPlan): NftPlan | undefined {
  const side = planSides.get(prev);
  if (side === undefined || side.dsrDevice !== opts.dsrDevice) return undefined;
  for (const [a, b] of replaced) if (!plain(a) || !plain(b) || a.vip !== b.vip || a.family !== b.family) return undefined;
  return planWith(parts, prev.problems, opts, side, prev.ip6);
}

function planWith(parts: readonly ServicePart[], problems: readonly string[], opts: RenderOptions, side: PlanSide, ip6: boolean): NftPlan {
  const dsrLines = side.dsrLines;
  const dsrTable = dsrLines.length > dsrRemovalLines().length;
  let tables: NftTableModel[] | undefined;
  let counters: NftCounterRef[] | undefined;
  const buildTables = (): NftTableModel[] => [tableModel(IPV4_WORDS, familyParts(parts, NFT_FAMILY)), ...(ip6 ? [tableModel(IPV6_WORDS, familyParts(parts, NFT6_FAMILY))] : [])];
  const buildScript = (): string => {
    // Neither the text nor the tables it was built from are kept: the plan
    // stays for the next render, which reads only its parts.
    const t = tables ?? buildTables();
    return [
      '# lb-agent forwarding tables: generated. Written whole at start and on repair; other changes write only the objects that changed.',
      '# One transaction (create if missing, delete, define): the kernel swaps the rule set atomically.',
      ...parts.flatMap((p) => p.header),
      ...tableLines(t[0]!),
      ...dsrLines,
      ...(t[1] ? tableLines(t[1]) : opts.ip6Removal ? ip6RemovalLines() : []),
      '',
    ].join('\n');
  };
  const plan: NftPlan = {
    get script() { return buildScript(); },
    get tables() { return tables ??= buildTables(); },
    get counters() { return counters ??= parts.flatMap((p) => p.counters); },
    problems,
    dsr: side.dsr,
    handBack: side.handBack,
    dsrLines,
    devices: side.devices,
    ip6,
    dsrTable,
  };
  planSides.set(plan, side);
  return plan;
}

/**
 * Render the tables for a forwarding state. Pure and deterministic: the same
 * state (in any order) gives the same text, byte for byte. Object names are
 * s<service>p<port>b<backend address> (the service and port by position in
 * the canonical order of normalizeState) so that they stay short and valid
 * whatever the service names are; the returned counter list maps them back.
 * IPv4 VIPs go to `table ip lb_agent`; IPv6 VIPs to `table ip6 lb_agent`,
 * rendered only when one is held (or `ip6Removal` asks to delete the one a
 * previous plan had).
 */
export function renderNft(state: ForwardState, opts: RenderOptions = {}): NftPlan {
  const { services, problems } = normalizeState(state);
  return planOf(partsOf(services, (prefix, svc) => renderPart(prefix, svc, opts)), problems, opts);
}

/** What renderNftDelta compares of a plan. */
export type DeltaInput = Pick<NftPlan, 'tables' | 'counters' | 'handBack' | 'dsrLines'>;

/** What an incremental update changes (renderNftDelta). */
export interface NftDelta {
  /** The nft script of the change, one transaction; empty when the kernel holds `next` already (only comments differ). */
  readonly script: string;
  /** Counters whose values restart: deleted, or deleted and added again under a new meaning (fold their last values into the totals first). */
  readonly reset: ReadonlySet<string>;
  /** The netdev table (direct server return) is written whole: its text changed. */
  readonly dsrRewritten: boolean;
  /** Map and set elements, chains and counters the transaction adds, rewrites or deletes. */
  readonly objects: number;
  /**
   * The same transaction as typed steps for the netlink writer
   * (net/netlink/nft-batch.ts), in the script's order; undefined when a
   * step has no typed form (a set other than the VIPs, the dispatch and
   * byte-counter maps, a rule the writer does not encode, a base chain, a table or the
   * netdev table written whole): the script is then written with nft.
   */
  readonly ops: readonly NftOp[] | undefined;
}

/** What each named counter counts: a flow counter's reference, or the service of a hand-back counter. */
function counterMeanings(plan: DeltaInput): Map<string, NftCounterRef | string> {
  const out = new Map<string, NftCounterRef | string>();
  for (const c of plan.counters) out.set(c.name, c);
  for (const h of plan.handBack) out.set(h.name, h.service);
  return out;
}

function sameMeaning(a: NftCounterRef | string | undefined, b: NftCounterRef | string | undefined): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object') return false;
  return a.kind === b.kind && a.service === b.service && a.backend === b.backend && a.port.protocol === b.port.protocol
    && a.port.port === b.port.port && a.port.name === b.port.name && a.port.targetPort === b.port.targetPort;
}

/** The key of a set element or map element (`key : value`). Addresses hold no spaces, so ' : ' only ever separates the value. */
function elementKey(kind: 'set' | 'map', element: string): string {
  if (kind === 'set') return element;
  const i = element.indexOf(' : ');
  return i < 0 ? element : element.slice(0, i);
}

const sameRules = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && a.every((r, i) => r === b[i]);

/**
 * The transaction that takes the kernel from `prev`'s tables to `next`'s by
 * changed objects only, as kube-proxy's nftables mode does (partial sync):
 * counters, chains and map elements that are new, changed or gone, so one
 * backend changing in one service among a thousand writes a few lines,
 * not the table. In one `nft -f` transaction, ordered so that nothing is
 * referenced before it exists or deleted while referenced: new counters
 * and (empty) chains; flushes and element deletions; counters that change
 * meaning deleted and added again (so they restart at zero); rules and
 * elements added; chains and counters no longer wanted deleted. A table of
 * a family that appears or goes is defined or deleted whole; the netdev
 * table is written whole when its text changed (it is small: DSR ports
 * only). Pure. Undefined when a change has no incremental form (a base
 * chain's hook or a set's type changed): the caller writes the tables whole.
 */
export function renderNftDelta(prev: DeltaInput, next: DeltaInput): NftDelta | undefined {
  const before = counterMeanings(prev);
  const after = counterMeanings(next);
  const reset = new Set<string>();
  const head: string[] = [];
  const middle: string[] = [];
  const tail: string[] = [];
  // The typed steps, beside the lines; `typed` turns false at the first line that has none.
  const headOps: NftOp[] = [];
  const middleOps: NftOp[] = [];
  const tailOps: NftOp[] = [];
  let typed = true;
  let objects = 0;
  const families = new Set([...prev.tables, ...next.tables].map((m) => m.family));
  for (const family of families) {
    const P = prev.tables.find((m) => m.family === family);
    const N = next.tables.find((m) => m.family === family);
    const tbl = `${family} ${NFT_TABLE}`;
    const fam = family as NftFamily;
    if (!P && N) { head.push(...tableLines(N)); objects += 1; typed = false; continue; }
    if (P && !N) {
      tail.push(`table ${tbl} {}`, `delete table ${tbl}`);
      typed = false;
      for (const c of P.counters) reset.add(c);
      objects += 1;
      continue;
    }
    if (!P || !N) continue;
    const pCounters = new Set(P.counters);
    const nCounters = new Set(N.counters);
    // Same name, another meaning (positional names shift when a backend or a service before it goes): it must restart at zero.
    const redefined = P.counters.filter((c) => nCounters.has(c) && !sameMeaning(before.get(c), after.get(c)));
    const quoted = redefined.map((c) => `"${c}"`);
    const refersToRedefined = quoted.length === 0 ? (): boolean => false : (text: string): boolean => quoted.some((q) => text.includes(q));
    const addedCounters = N.counters.filter((c) => !pCounters.has(c));
    const deletedCounters = P.counters.filter((c) => !nCounters.has(c));
    for (const c of addedCounters) { head.push(`add counter ${tbl} ${c}`); headOps.push({ op: 'add-counter', family: fam, name: c }); }
    // Chains.
    const pChains = new Map(P.chains.map((c) => [c.name, c]));
    const nChains = new Map(N.chains.map((c) => [c.name, c]));
    const rewrite: NftChainModel[] = [];
    for (const c of N.chains) {
      const old = pChains.get(c.name);
      if (!old) {
        head.push(c.hook === undefined ? `add chain ${tbl} ${c.name}` : `add chain ${tbl} ${c.name} { ${c.hook} }`);
        if (c.hook === undefined) headOps.push({ op: 'add-chain', family: fam, chain: c.name });
        else typed = false;
        rewrite.push(c);
        objects++;
        continue;
      }
      if (old.hook !== c.hook) return undefined;
      if (!sameRules(old.rules, c.rules) || old.rules.some(refersToRedefined)) {
        if (old.rules.length > 0) { middle.push(`flush chain ${tbl} ${c.name}`); middleOps.push({ op: 'flush-chain', family: fam, chain: c.name }); }
        rewrite.push(c);
        objects++;
      }
    }
    const deletedChains = P.chains.filter((c) => !nChains.has(c.name));
    for (const c of deletedChains) { middle.push(`flush chain ${tbl} ${c.name}`); middleOps.push({ op: 'flush-chain', family: fam, chain: c.name }); }
    // Elements: a changed value is its key deleted and added again.
    const adds: string[] = [];
    const addOps: NftOp[] = [];
    // Sets and maps that come (a port's slot map): declared first, filled with the other elements; those that go: deleted last.
    const pSets = new Map(P.sets.map((x) => [x.name, x]));
    const nSets = new Set(N.sets.map((x) => x.name));
    const deletedSets = P.sets.filter((x) => !nSets.has(x.name));
    for (const ns of N.sets) {
      let ps = pSets.get(ns.name);
      if (!ps) {
        head.push(`add ${ns.kind} ${tbl} ${ns.name} { ${typeLine(ns)}; }`);
        if (ns.slots !== undefined) headOps.push({ op: 'add-slot-map', family: fam, set: ns.name, proto: ns.slots.proto });
        else typed = false;
        objects++;
        ps = { name: ns.name, kind: ns.kind, type: ns.type, elements: [], specs: [], counterSpecs: [], ...(ns.addresses === true ? { addresses: true } : {}), ...(ns.slots ? { slots: { ...ns.slots, addresses: [] } } : {}) };
      }
      if (ps.kind !== ns.kind || ps.type !== ns.type) return undefined;
      type Spec = NftDispatchElement | NftCounterElement | NftSlotElement | string;
      const specOf = (m: NftSetModel, i: number, elements: readonly string[]): Spec | undefined => (m.addresses === true ? elements[i] : m.slots !== undefined ? slotElement(m.slots, i) : m.specs?.[i] ?? m.counterSpecs?.[i]);
      const pByKey = new Map<string, string>();
      const pSpec = new Map<string, Spec | undefined>();
      const pElements = ps.elements;
      pElements.forEach((e, i) => { const k = elementKey(ps.kind, e); pByKey.set(k, e); pSpec.set(k, specOf(ps, i, pElements)); });
      const nByKey = new Map<string, string>();
      const nSpec = new Map<string, Spec | undefined>();
      const nElements = ns.elements;
      nElements.forEach((e, i) => { const k = elementKey(ns.kind, e); nByKey.set(k, e); nSpec.set(k, specOf(ns, i, nElements)); });
      const del: string[] = [];
      const delSpecs: Array<Spec | undefined> = [];
      for (const [k, e] of pByKey) if (nByKey.get(k) !== e || refersToRedefined(e)) { del.push(k); delSpecs.push(pSpec.get(k)); }
      const add: string[] = [];
      const addSpecs: Array<Spec | undefined> = [];
      for (const [k, e] of nByKey) if (pByKey.get(k) !== e || refersToRedefined(e)) { add.push(e); addSpecs.push(nSpec.get(k)); }
      // The dispatch maps' elements (a verdict), the byte-counter maps' (a counter's name) and the VIPs have typed forms; any other set's do not.
      const elementOp = (op: 'add' | 'delete', specs: ReadonlyArray<Spec | undefined>): NftOp | undefined => {
        if (specs.some((x) => x === undefined)) { typed = false; return undefined; }
        if (ns.addresses === true) return { op: op === 'add' ? 'add-addresses' : 'delete-addresses', family: fam, set: ns.name, addresses: specs as string[] };
        if (ns.slots !== undefined) {
          const elements = (specs as NftSlotElement[]).map((x) => (op === 'delete' ? { slot: x.slot } : x));
          return { op: op === 'add' ? 'add-slot-elements' : 'delete-slot-elements', family: fam, set: ns.name, elements };
        }
        if (ns.counterSpecs !== undefined) {
          const elements = (specs as NftCounterElement[]).map((x) => (op === 'delete' ? { vip: x.vip, backend: x.backend, proto: x.proto, port: x.port } : x));
          return { op: op === 'add' ? 'add-counter-elements' : 'delete-counter-elements', family: fam, set: ns.name, elements };
        }
        const elements = (specs as NftDispatchElement[]).map((x) => (op === 'delete' ? { vip: x.vip, proto: x.proto, port: x.port } : x));
        return { op: op === 'add' ? 'add-elements' : 'delete-elements', family: fam, set: ns.name, elements };
      };
      if (del.length > 0) {
        middle.push(`delete element ${tbl} ${ns.name} { ${del.join(', ')} }`);
        const op = elementOp('delete', delSpecs);
        if (op) middleOps.push(op);
      }
      if (add.length > 0) {
        adds.push(`add element ${tbl} ${ns.name} { ${add.join(', ')} }`);
        const op = elementOp('add', addSpecs);
        if (op) addOps.push(op);
      }
      objects += del.length + add.length;
    }
    for (const c of redefined) {
      middle.push(`delete counter ${tbl} ${c}`, `add counter ${tbl} ${c}`);
      middleOps.push({ op: 'delete-counter', family: fam, name: c }, { op: 'add-counter', family: fam, name: c });
      reset.add(c);
    }
    for (const c of rewrite) {
      for (const r of c.rules) middle.push(`add rule ${tbl} ${c.name} ${r}`);
      if (c.specs === undefined || c.specs.length !== c.rules.length) typed = false;
      else for (const rule of c.specs) middleOps.push({ op: 'add-rule', family: fam, chain: c.name, rule });
    }
    middle.push(...adds);
    middleOps.push(...addOps);
    for (const c of deletedChains) { tail.push(`delete chain ${tbl} ${c.name}`); tailOps.push({ op: 'delete-chain', family: fam, chain: c.name }); }
    // After the rules that looked them up are gone.
    for (const x of deletedSets) {
      tail.push(`delete ${x.kind} ${tbl} ${x.name}`);
      if (x.slots !== undefined) tailOps.push({ op: 'delete-slot-map', family: fam, set: x.name });
      else typed = false;
      objects++;
    }
    for (const c of deletedCounters) { tail.push(`delete counter ${tbl} ${c}`); tailOps.push({ op: 'delete-counter', family: fam, name: c }); reset.add(c); }
    objects += deletedChains.length + addedCounters.length + deletedCounters.length + redefined.length;
  }
  const dsrRewritten = prev.dsrLines.join('\n') !== next.dsrLines.join('\n');
  if (dsrRewritten) {
    typed = false;
    const inTables = new Set(prev.tables.flatMap((m) => m.counters));
    for (const c of prev.counters) if (!inTables.has(c.name)) reset.add(c.name);
    objects += 1;
  }
  const lines = [...head, ...middle, ...tail, ...(dsrRewritten ? next.dsrLines : [])];
  return { script: lines.length === 0 ? '' : `${lines.join('\n')}\n`, reset, dsrRewritten, objects, ops: typed ? [...headOps, ...middleOps, ...tailOps] : undefined };
}

/**
 * A render kept for the next one (renderIncremental): its plan, and the
 * services' parts in order and by key, which the next render reuses where
 * a service's inputs are unchanged.
 */
export interface Rendering {
  readonly plan: NftPlan;
  readonly parts: readonly ServicePart[];
  /** The normalized services the parts were rendered from; its index gives each part's position by key. */
  readonly normal: NormalizedState;
  readonly opts: RenderOptions;
  /** This rendering's identity, for `changed`. */
  readonly token: object;
  /**
   * Set when this rendering was worked out from the one whose token is
   * `from` by replacing the parts at `positions` (the others are its
   * objects, at the same positions): renderPartsDelta then looks at those
   * parts only.
   */
  readonly changed: { readonly from: object; readonly positions: readonly number[] } | undefined;
  /** The positions of the parts on each VIP, in order; shared by the renderings of one order of services and VIPs. */
  readonly onVip: LazyVips;
}

/** The positions of the parts on each VIP (built on first use; shared while positions and VIPs stay). */
interface LazyVips { map?: Map<string, number[]> }

function vipPositions(r: Rendering): Map<string, number[]> {
  if (r.onVip.map !== undefined) return r.onVip.map;
  const map = new Map<string, number[]>();
  r.parts.forEach((p, i) => {
    const vip = p.vip;
    if (vip === undefined) return;
    const at = map.get(vip);
    if (at === undefined) map.set(vip, [i]);
    else at.push(i);
  });
  return (r.onVip.map = map);
}

/** Whether two sets of render options render the same parts and plan. */
function sameOpts(a: RenderOptions, b: RenderOptions): boolean {
  const ka = Object.keys(a) as (keyof RenderOptions)[];
  return ka.length === Object.keys(b).length && ka.every((k) => a[k] === b[k]);
}

/**
 * renderNft, rendering again only the services whose inputs differ from
 * `prev`'s (the others' parts are taken as they are). The plan is the one
 * renderNft gives for the same state, object for object. When the state
 * differs from `prev`'s only in a few services that keep their position,
 * VIP and ports (normalizeStateFrom), only those are looked at: a health
 * transition among a thousand services renders, compares and walks one.
 */
export function renderIncremental(state: ForwardState, opts: RenderOptions, prev?: Rendering): Rendering {
  const normal = normalizeStateFrom(state, prev?.normal);
  const token = {};
  if (prev !== undefined && normal.changed !== undefined && normal.index === prev.normal.index && sameOpts(opts, prev.opts)) {
    let parts: ServicePart[] | undefined;
    const replaced: (readonly [ServicePart, ServicePart])[] = [];
    for (const at of normal.changed) {
      const old = prev.parts[at]!;
      const svc = normal.services[at]!;
      if (old.input === partInput(old.prefix, svc)) continue;
      const part = renderPart(old.prefix, svc, opts);
      parts ??= prev.parts.slice();
      parts[at] = part;
      replaced.push([old, part]);
    }
    if (parts === undefined) return { ...prev, normal, token, changed: { from: prev.token, positions: [] } };
    const plan = planReplacing(parts, replaced, opts, prev.plan);
    if (plan !== undefined) {
      const positions = normal.changed.filter((at) => parts[at] !== prev.parts[at]).sort((a, b) => a - b);
      return { plan, parts, normal, opts, token, changed: { from: prev.token, positions }, onVip: prev.onVip };
    }
  }
  const byKey = prev === undefined ? undefined : prev.normal.index;
  const parts = partsOf(normal.services, (prefix, svc) => {
    const at = byKey?.get(svc.key);
    const old = at === undefined ? undefined : prev!.parts[at];
    return old !== undefined && old.key === svc.key && old.input === partInput(prefix, svc) ? old : renderPart(prefix, svc, opts);
  });
  return { plan: planOf(parts, normal.problems, opts, prev?.plan), parts, normal, opts, token, changed: undefined, onVip: {} };
}

/** An incremental update worked out from the services that changed (renderPartsDelta). */
export interface PartsDelta extends NftDelta {
  /** The services whose parts differ (added, changed or gone). */
  readonly changed: ReadonlySet<string>;
  /** What the counters in `reset` counted (the previous plan's meaning). */
  readonly resetCounters: readonly NftCounterRef[];
  readonly resetHandBack: readonly HandBackCounter[];
}

/**
 * The first part (in order) to use each byte-counter key: the one whose
 * element the map holds. A key begins with its VIP, so only the parts on
 * `vips` are looked into.
 */
function byteWinners(r: Rendering, family: string, keys: ReadonlySet<string>, vips: ReadonlySet<string>): Map<string, ByteElem> {
  const out = new Map<string, ByteElem>();
  if (keys.size === 0) return out;
  for (const p of partsOnVips(r, family, vips)) {
    for (const e of p.byteElems) if (keys.has(e.key) && !out.has(e.key)) out.set(e.key, e);
  }
  return out;
}

/** The parts of `family` on these VIPs, in order (by the rendering's VIP positions: no other part is looked at). */
function partsOnVips(r: Rendering, family: string, vips: ReadonlySet<string>): ServicePart[] {
  const byVip = vipPositions(r);
  const at: number[] = [];
  for (const v of vips) for (const i of byVip.get(v) ?? []) at.push(i);
  if (vips.size > 1) at.sort((a, b) => a - b);
  return at.map((i) => r.parts[i]!).filter((p) => p.family === family);
}

/**
 * The keys of the services whose parts differ between two renderings, and
 * those parts in order: from `next.changed` when it was worked out from
 * `prev`, else by comparing every part.
 */
function changedParts(prev: Rendering, next: Rendering): { changed: Set<string>; chP: ServicePart[]; chN: ServicePart[] } {
  if (next.changed !== undefined && next.changed.from === prev.token) {
    const at = next.changed.positions;
    return { changed: new Set(at.map((i) => next.parts[i]!.key)), chP: at.map((i) => prev.parts[i]!), chN: at.map((i) => next.parts[i]!) };
  }
  const changed = new Set<string>();
  const partOf = (r: Rendering, key: string): ServicePart | undefined => {
    const i = r.normal.index.get(key);
    return i === undefined ? undefined : r.parts[i];
  };
  for (const p of next.parts) if (partOf(prev, p.key) !== p) changed.add(p.key);
  for (const p of prev.parts) if (partOf(next, p.key) === undefined) changed.add(p.key);
  return { changed, chP: prev.parts.filter((p) => changed.has(p.key)), chN: next.parts.filter((p) => changed.has(p.key)) };
}

/**
 * The transaction from `prev`'s tables to `next`'s, worked out from the
 * services whose parts differ only: renderNftDelta over the objects those
 * services own (their counters, chains and dispatch elements), beside the
 * objects services share, taken from every part - a VIP in the `vips` set
 * stays while any service uses it, a byte-counter key belongs to the first
 * service in key order, the `hand_back` chain holds every service's
 * hand-back rule, the netdev table and a table of a family that appears
 * or goes are written whole. Pure. The result is the transaction
 * renderNftDelta(prev.plan, next.plan) writes, in fewer objects' worth of
 * work. Undefined when the change has no incremental form.
 */
export function renderPartsDelta(prev: Rendering, next: Rendering): PartsDelta | undefined {
  const { changed, chP, chN } = changedParts(prev, next);
  const sub = (r: Rendering, ch: readonly ServicePart[], other: Rendering, otherCh: readonly ServicePart[]): Pick<NftPlan, 'tables' | 'counters' | 'handBack' | 'dsrLines'> => {
    const tables: NftTableModel[] = [];
    for (const w of [IPV4_WORDS, IPV6_WORDS]) {
      const has = w.family === NFT_FAMILY || r.plan.ip6;
      if (!has) continue;
      const otherHas = w.family === NFT_FAMILY || other.plan.ip6;
      // A table that appears or goes is defined or deleted whole.
      if (!otherHas) { tables.push(r.plan.tables.find((m) => m.family === w.family)!); continue; }
      const t = familyParts(ch, w.family);
      // Shared objects, as every part has them: VIPs and byte keys these services touch, hand-back rules.
      const touched = [...ch, ...otherCh].filter((p) => p.family === w.family && p.vip !== undefined);
      const vips = new Set(touched.map((p) => p.vip!));
      t.vips.clear();
      for (const p of partsOnVips(r, w.family, vips)) t.vips.add(p.vip!);
      const keys = new Set(touched.flatMap((p) => p.byteElems.map((e) => e.key)));
      t.connsElems.length = 0;
      t.toBackendElems.length = 0;
      t.toClientElems.length = 0;
      t.connsSpecs.length = 0;
      t.toBackendSpecs.length = 0;
      t.toClientSpecs.length = 0;
      for (const e of byteWinners(r, w.family, keys, vips).values()) {
        t.connsElems.push(e.conns);
        t.connsSpecs.push(e.connsSpec);
        t.toBackendElems.push(e.toBackend);
        t.toClientElems.push(e.toClient);
        t.toBackendSpecs.push(e.toBackendSpec);
        t.toClientSpecs.push(e.toClientSpec);
      }
      t.handBack.length = 0;
      // The plan gathered the parts with a hand-back rule, in order.
      for (const p of planSides.get(r.plan)?.handBackParts ?? r.parts) if (p.family === w.family && p.vip !== undefined && p.handBack) t.handBack.push(p.handBack.rule);
      tables.push(tableModel(w, t));
    }
    const whole = (family: string): readonly ServicePart[] => (family === NFT6_FAMILY && r.plan.ip6 !== other.plan.ip6 ? r.parts.filter((p) => p.family === family) : []);
    const own = [...ch, ...whole(NFT6_FAMILY).filter((p) => !changed.has(p.key))];
    return { tables, counters: own.flatMap((p) => p.counters), handBack: own.flatMap((p) => (p.handBack ? [p.handBack.counter] : [])), dsrLines: r.plan.dsrLines };
  };
  const before = sub(prev, chP, next, chN);
  const d = renderNftDelta(before, sub(next, chN, prev, chP));
  if (d === undefined) return undefined;
  const reset = new Set(d.reset);
  // The netdev table written whole restarts every counter in it, not only the changed services'.
  const dsrParts = d.dsrRewritten ? prev.parts.filter((p) => p.dsrPorts.length > 0) : [];
  for (const p of dsrParts) for (const port of p.dsrPorts) for (const c of port.counters) reset.add(c.name);
  const owners = [...chP, ...dsrParts.filter((p) => !changed.has(p.key))];
  const refs = [...before.counters, ...owners.slice(chP.length).flatMap((p) => p.counters)];
  return {
    ...d, reset, changed,
    resetCounters: refs.filter((c) => reset.has(c.name)),
    resetHandBack: before.handBack.filter((h) => reset.has(h.name)),
  };
}

/** The script that removes every table of the agent whether or not it exists (one transaction). */
export function renderRemoval(): string {
  return [`table ${NFT_FAMILY} ${NFT_TABLE} {}`, `delete table ${NFT_FAMILY} ${NFT_TABLE}`, ...dsrRemovalLines(), ...ip6RemovalLines(), ''].join('\n');
}

/** Does the plan define the netdev table (a DSR port is forwarded)? */
export function hasDsrTable(plan: NftPlan): boolean {
  return plan.dsrTable;
}

/** Does the plan define the IPv6 table (an IPv6 VIP is held)? */
export function hasIp6Table(plan: NftPlan): boolean {
  return plan.ip6;
}

// ---------------------------------------------------------------------------
// Pure helpers over `nft -j` output.

export interface CounterValue { readonly packets: number; readonly bytes: number }

function nftObjects(json: string): Record<string, unknown>[] {
  const doc = JSON.parse(json) as { nftables?: unknown };
  if (!doc || !Array.isArray(doc.nftables)) throw new Error('not nft JSON: no "nftables" array');
  return doc.nftables as Record<string, unknown>[];
}

/** Named counters of our table from `nft -j list counters table ip lb_agent` (or list table). */
export function parseNftCounters(json: string): Map<string, CounterValue> {
  const out = new Map<string, CounterValue>();
  for (const o of nftObjects(json)) {
    const c = o['counter'] as { name?: unknown; table?: unknown; packets?: unknown; bytes?: unknown } | undefined;
    if (!c || typeof c.name !== 'string' || c.table !== NFT_TABLE) continue;
    out.set(c.name, { packets: Number(c.packets) || 0, bytes: Number(c.bytes) || 0 });
  }
  return out;
}

function stripVolatile(v: unknown, parentKey: string): unknown {
  if (Array.isArray(v)) {
    const items = v.map((x) => stripVolatile(x, parentKey));
    // Set elements are listed in the kernel's hash order, which differs
    // between two otherwise identical tables: compare them as sets.
    if (parentKey === 'set' || parentKey === 'elem') return items.map((x) => JSON.stringify(x)).sort().map((x) => JSON.parse(x) as unknown);
    return items;
  }
  if (v && typeof v === 'object') {
    const o: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) {
      if (k === 'handle') continue;
      if ((parentKey === 'counter' || parentKey === '') && (k === 'packets' || k === 'bytes')) continue;
      o[k] = stripVolatile((v as Record<string, unknown>)[k], k);
    }
    return o;
  }
  return v;
}

/**
 * A canonical form of `nft -j list table` output for comparing two tables:
 * no handles, no counter values, set elements sorted, objects grouped by kind
 * and name while rules keep their order within a chain.
 */
export function canonicalTableJson(json: string): string {
  const objs = nftObjects(json).filter((o) => !('metainfo' in o));
  const keyed = objs.map((o, i) => {
    const kind = Object.keys(o)[0] ?? '';
    const body = o[kind] as Record<string, unknown>;
    const name = String(body?.['chain'] ?? body?.['name'] ?? '');
    return { sortKey: `${kind === 'rule' ? 'zz-rule' : kind}\u0000${name}`, i, v: stripVolatile(o, '') };
  });
  keyed.sort((a, b) => (a.sortKey < b.sortKey ? -1 : a.sortKey > b.sortKey ? 1 : a.i - b.i));
  return JSON.stringify(keyed.map((k) => k.v));
}

/**
 * Packets handed back per service (nft.ts "Hand-back"): what earlier tables
 * counted (`carry`) plus the live counters of `plan`'s rules; services no
 * longer in `state` are dropped (a removed service's count goes with it).
 */
export function handedBackTotals(plan: Pick<NftPlan, 'handBack'> | undefined, live: ReadonlyMap<string, CounterValue>, carry: ReadonlyMap<string, number>, state: ForwardState | undefined): Map<string, number> {
  // Nothing carried and no hand-back counter (no service hands back): no set of every key for a collect.
  if (carry.size === 0 && (plan?.handBack ?? []).length === 0) return new Map();
  const keep = new Set((state?.services ?? []).map((s) => s.key));
  const out = new Map([...carry].filter(([k]) => keep.has(k)));
  for (const c of plan?.handBack ?? []) {
    const v = live.get(c.name);
    if (v && keep.has(c.service)) out.set(c.service, (out.get(c.service) ?? 0) + v.packets);
  }
  return out;
}

/** Running totals of one (service, port, backend). */
export interface FlowTotals { conns: number; toBackend: number; toClient: number }

/**
 * Totals per flow: what was carried over from earlier tables plus what the
 * live counters of the current table say (connections = packets through the
 * DNAT rule, i.e. first packets; bytes from the forward-hook counters).
 */
export function flowTotals(plan: Pick<NftPlan, 'counters'> | undefined, live: ReadonlyMap<string, CounterValue>, carry: ReadonlyMap<string, FlowTotals>): Map<string, FlowTotals> {
  const out = new Map<string, FlowTotals>();
  for (const [id, t] of carry) out.set(id, { ...t });
  for (const c of plan?.counters ?? []) {
    const v = live.get(c.name);
    if (!v) continue;
    const id = flowId(c.service, c.port, c.backend);
    const t = out.get(id) ?? { conns: 0, toBackend: 0, toClient: 0 };
    if (c.kind === 'conns') t.conns += v.packets;
    else if (c.kind === 'to_backend') t.toBackend += v.bytes;
    else t.toClient += v.bytes;
    out.set(id, t);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Running nft.

export interface ExecResult { stdout: string; stderr: string }
/**
 * Runs a program with optional stdin; rejects with { code, stderr } like
 * execFile. `onSpawn` learns the child's pid before it runs: the drift
 * watch tells the agent's own commits from others' by it.
 */
export type Exec = (file: string, args: readonly string[], input?: string, hooks?: { onSpawn?(pid: number): void }) => Promise<ExecResult>;

export const execProgram: Exec = (file, args, input, hooks) => new Promise((resolve, reject) => {
  const child = execFile(file, [...args], { timeout: 30_000, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
    if (err) reject(Object.assign(new Error(err.message, { cause: err }), err, { stdout, stderr }));
    else resolve({ stdout, stderr });
  });
  if (child.pid !== undefined) hooks?.onSpawn?.(child.pid);
  // A child that exits before reading its input (unshare without
  // CAP_SYS_ADMIN does) makes the write fail with EPIPE; its exit status and
  // stderr already say why, so the write error must not crash the agent.
  child.stdin?.on('error', () => undefined);
  if (input !== undefined) child.stdin?.end(input);
  else child.stdin?.end();
});

function execError(err: unknown): { code: unknown; stderr: string } {
  const e = err as { code?: unknown; stderr?: unknown; message?: unknown };
  return { code: e.code, stderr: (typeof e.stderr === 'string' && e.stderr.trim()) || errorMessage(err) };
}

/** Between the two tables' listings in the start check's throwaway namespace. */
const LIST_SEPARATOR = '@@lb-agent@@';

function isAbsentTable(stderr: string): boolean {
  return /No such file or directory/.test(stderr);
}

/**
 * Can this kernel take our table? Loads a representative table (TCP and UDP
 * ports, weighted slots, a refused port: every expression the agent uses) in
 * a throwaway network namespace (`unshare -n`), so nothing on the host
 * changes and the namespace vanishes with the process; where no namespace may
 * be created, `nft --check` instead. Never throws.
 */
export async function probeNftables(opts: { exec?: Exec; placement?: Placement } = {}): Promise<ProbeResult> {
  const exec = opts.exec ?? execProgram;
  const b = (address: string, n: number, weight: number) => ({ address, addressNum: n, weight });
  const sample = renderNft({
    services: [
      {
        key: 'probe/a', vip: '192.0.2.10',
        ports: [{ name: 'tcp', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'udp', port: 53, protocol: 'UDP', targetPort: 5353 }],
        healthy: [b('192.0.2.11', 1, 1), b('192.0.2.12', 2, 2)], backends: [b('192.0.2.11', 1, 1), b('192.0.2.12', 2, 2)],
      },
      { key: 'probe/b', vip: '192.0.2.20', ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }], healthy: [], backends: [b('192.0.2.21', 3, 1)] },
    ],
  }, { placement: opts.placement });
  const hash = opts.placement === 'flow-hash' ? '/nft_hash (CONFIG_NFT_HASH: with VRRP connections are placed by a hash)' : '';
  return probeScript(exec, sample.script, `nf_tables/nf_nat/nft_numgen/nft_reject/nft_objref/nft_fib (CONFIG_NFT_FIB_IPV4)${hash}`);
}

/**
 * Can this kernel do direct server return? Loads DSR_PROBE_RULESET
 * - a netdev ingress chain, a MAC-keyed verdict map, a seeded jhash, `fwd ip
 * to` - the same way as probeNftables. Never throws.
 */
export function probeDsr(opts: { exec?: Exec } = {}): Promise<ProbeResult> {
  return probeScript(opts.exec ?? execProgram, DSR_PROBE_RULESET, 'nf_tables_netdev/netfilter ingress/nft_hash/nft_fwd_netdev (CONFIG_NF_TABLES_NETDEV, CONFIG_NETFILTER_INGRESS, CONFIG_NFT_HASH, CONFIG_NFT_FWD_NETDEV)');
}

/** Load `script` in a throwaway namespace, or `nft --check` it where none may be made. */
async function probeScript(exec: Exec, script: string, needs: string): Promise<ProbeResult> {
  try {
    await exec('nft', ['--version']);
  } catch (err) {
    const e = execError(err);
    if (e.code === 'ENOENT') return { ok: false, reason: 'nft not found (install the nftables package)' };
    return { ok: false, reason: `nft --version failed: ${e.stderr}` };
  }
  let unshareFailure: string;
  try {
    await exec('unshare', ['-n', 'nft', '-f', '-'], script);
    return { ok: true, reason: 'nftables accepted a test table in a throwaway namespace' };
  } catch (err) {
    const e = execError(err);
    const denied = /Operation not permitted|permission denied/i.test(e.stderr);
    // The kernel itself said no (not unshare): that is the verdict.
    if (!denied && e.code !== 'ENOENT') {
      return { ok: false, reason: `the kernel rejected the test table (missing ${needs} support?): ${firstLine(e.stderr)}` };
    }
    unshareFailure = e.code === 'ENOENT' ? 'unshare not found' : firstLine(e.stderr);
  }
  // No new namespace allowed (a container without CAP_SYS_ADMIN, no util-linux):
  // `nft --check` sends the same transaction to the kernel here and has it
  // aborted instead of committed, so it is validated and nothing changes.
  try {
    await exec('nft', ['--check', '-f', '-'], script);
    return { ok: true, reason: `nftables accepted a test table (checked without committing; no throwaway namespace: ${unshareFailure})` };
  } catch (err) {
    const e = execError(err);
    if (/Operation not permitted|permission denied/i.test(e.stderr)) {
      return { ok: false, reason: `not permitted (needs root or CAP_NET_ADMIN): ${firstLine(e.stderr)}` };
    }
    return { ok: false, reason: `the kernel rejected the test table (missing ${needs} support?): ${firstLine(e.stderr)}` };
  }
}

function firstLine(s: string): string {
  const lines = s.split('\n').map((l) => l.trim()).filter(Boolean);
  // nft prints "file:line:col: Error: ..." followed by the offending line; the error line is the useful one.
  return lines.find((l) => /Error/.test(l)) ?? lines[0] ?? s;
}

/** The facts forwarding through the kernel depends on. */
export interface KernelFacts {
  /** net.ipv4.ip_forward after ensureSysctls ran (1 required). */
  readonly ipForward: number | undefined;
  readonly ipForwardChangedByAgent: boolean;
  /** Interfaces (conf entries) whose send_redirects the agent turned off. */
  readonly sendRedirectsDisabledOn: readonly string[];
  readonly conntrackCount: number | undefined;
  readonly conntrackMax: number | undefined;
}

async function readNumber(file: string): Promise<number | undefined> {
  try {
    const n = Number((await fs.readFile(file, 'utf8')).trim());
    return Number.isFinite(n) ? n : undefined;
  } catch {
    return undefined;
  }
}

export type StartCheck = 'absent' | 'matched' | 'rewritten' | 'rewritten-unverified';

export interface NftDataplaneOptions {
  readonly registry?: Registry;
  readonly log?: Logger;
  /** Why this path was chosen (selectDataplane's reason), for the info metric. */
  readonly reason?: string;
  readonly exec?: Exec;
  /** Where /proc is (tests). */
  readonly procRoot?: string;
  /**
   * The counters are read for the metrics when a scrape asks and the last
   * read is older than this (ms): scrapes within it share one read, and
   * nothing reads them while nobody asks.
   */
  readonly countersEveryMs?: number;
  readonly clock?: Clock;
  /** The parent NIC: direct server return hooks its ingress and forwards out of it. */
  readonly dsrDevice?: string | undefined;
  /**
   * What forwards DSR frames: 'auto' (default) the BPF program at tc ingress
   * in front of the nft table, falling back to the table alone when it cannot
   * be loaded; 'nft' the table alone (LB_AGENT_DSR_ENGINE=nft).
   */
  readonly dsrEngine?: DsrEngineChoice;
  /** The BPF driver (tests); default: net/ebpf-attach.ts's on dsrDevice. */
  readonly dsrBpf?: () => DsrBpf;
  /** Where the DSR program's descriptors outlive the process (systemd's fd store): a restart without CAP_SYS_ADMIN replaces the program through it. */
  readonly dsrStore?: DsrFdStore | undefined;
  /** How the SNAT path places new connections (default 'round-robin'; the daemon hashes with VRRP). */
  readonly placement?: Placement;
  /** ctnetlink, to end the UDP flows of a backend a port no longer sends to (tests); default: net/conntrack.ts's. */
  readonly conntrack?: () => ConntrackClient;
  /**
   * Reads a table's named counters over nfnetlink (net/netlink/nft-counters.ts).
   * Default: that reader, unless `exec` is given: a data path whose `nft`
   * runs elsewhere (tests, another namespace) reads its counters through it too.
   */
  readonly counterReader?: (() => CounterReader) | undefined;
  /**
   * Writes a delta's typed steps over nfnetlink as one transaction
   * (net/netlink/nft-batch.ts). Default: that writer, unless `exec` is
   * given (its `nft` runs elsewhere: so must the deltas).
   */
  readonly batchWriter?: (() => BatchWriter) | undefined;
}

/** Applies typed steps to table `table` as one transaction (NftBatchWriter). */
export interface BatchWriter {
  write(table: string, ops: readonly NftOp[]): Promise<void>;
  /** The netlink port its commits carry. */
  readonly port: number;
  close(): void;
}

/** How the deltas were written (status details): over netlink, or with nft and why. */
export interface DeltaWrites {
  netlink: number;
  nft: number;
  /** Written with nft: the delta held a step the netlink writer does not encode. */
  unencoded: number;
  /** Written with nft after the netlink write failed (refused whole, or the socket failed). */
  netlinkFailed: number;
}

/** Reads the named counters of table `family name` (empty when it is not there). */
export interface CounterReader {
  read(family: string, table: string): Promise<Map<string, CounterValue>>;
  close(): void;
}

export type DsrEngineChoice = 'auto' | 'nft';

/** Which mechanism serves direct server return now, and why (status details, lbagent_forward_dsr_engine_info). */
export interface DsrEngineState {
  readonly engine: 'bpf' | 'nft';
  /** tcx: the BPF program; forced: LB_AGENT_DSR_ENGINE=nft; fallback: BPF failed here; table: no port the program serves (one on the data path's own NIC) is forwarded, the table forwards the others. */
  readonly cause: 'tcx' | 'forced' | 'fallback' | 'table';
  readonly reason: string;
}

/** The key of a (service, port label) pair in the ended-flow tallies. */
function udpEndedKey(service: string, port: string): string {
  return `${service}\u0000${port}`;
}

const UDP_FLOWS_ERROR = 'cannot end the UDP flows of a backend that left a port (they stay on it while their clients keep sending)';

/** A sweep's rule, with the service and port label its ended flows are counted under. */
export interface UdpFlowSweepRule extends UdpFlowRule {
  readonly service: string;
  readonly portLabel: string;
}

/**
 * The UDP flows to end after the table goes from `prev` to `next` (undefined:
 * unknown, at start): for each SNAT UDP VIP:port whose set of backends
 * (address:targetPort) lost a member, was empty (a flow seen then was not
 * translated and would stay so), or that is no longer forwarded, the set its
 * flows may still use. Ports whose set only grew or stayed are left out, so
 * most applies touch no conntrack at all. Direct server return is never in
 * conntrack (the netdev family forwards before it).
 */
export function udpFlowSweep(prev: ForwardState | undefined, next: ForwardState): UdpFlowSweepRule[] {
  return udpSweepOf(prev === undefined ? undefined : normalizeState(prev).services, normalizeState(next).services);
}

/** udpFlowSweep over normalized services (a few of them: the services an apply changed). */
function udpSweepOf(prev: readonly NormalizedService[] | undefined, next: readonly NormalizedService[]): UdpFlowSweepRule[] {
  const sets = (services: readonly NormalizedService[]): Map<string, UdpFlowSweepRule> => {
    const out = new Map<string, UdpFlowSweepRule>();
    for (const s of services) {
      if (s.vip === undefined || s.sourceIP !== 'snat') continue;
      for (const p of s.ports) {
        if (p.spec.protocol !== 'UDP') continue;
        out.set(`${s.vip}:${p.spec.port}`, { vip: s.vip, port: p.spec.port, allowed: new Set(s.healthy.map((b) => `${b.address}:${p.spec.targetPort}`)), service: s.key, portLabel: portLabel(p.spec) });
      }
    }
    return out;
  };
  const after = sets(next);
  if (prev === undefined) return [...after.values()];
  const rules: UdpFlowSweepRule[] = [];
  for (const [key, before] of sets(prev)) {
    const now = after.get(key);
    if (!now) rules.push({ ...before, allowed: new Set() });
    else if ((before.allowed.size === 0 && now.allowed.size > 0) || [...before.allowed].some((b) => !now.allowed.has(b))) rules.push(now);
  }
  return rules;
}

/** How long vipArrived waits for more VIPs to arrive before it sweeps (ms). */
export const ARRIVALS_BATCH_MS = 20;

/** VIPs that came onto the node together (their ports, each once), swept by one vipArrived. */
interface ArrivalBatch {
  readonly ports: Map<string, ForwardedPort>;
  readonly done: Promise<void>;
}

/** What the metrics show before the first counter read. */
const NO_STATS: ForwardStats = { kind: 'kernel', services: [], flows: [], problems: [], details: {} };

/**
 * The kernel data path. Owns `table ip lb_agent` (and `table ip6 lb_agent`
 * while it holds an IPv6 VIP, `table netdev lb_agent` for DSR) and nothing else in
 * nftables; other tables (a host firewall, kube-proxy) are never read or
 * touched, though a host firewall that drops forwarded packets will still
 * drop ours.
 */
export class NftDataplane implements Dataplane {
  readonly kind = 'kernel' as const;
  private readonly log: Logger;
  private readonly exec: Exec;
  private readonly procRoot: string;
  private readonly metrics: ForwardMetrics | undefined;
  private readonly queue = new SerialQueue();
  private started = false;
  private stopped = false;
  private plan: NftPlan | undefined;
  /** The render the kernel holds (plan is its plan): the next apply renders again only the services that differ from it. */
  private rendering: Rendering | undefined;
  private state: ForwardState = { services: [] };
  private carry = new Map<string, FlowTotals>();
  /**
   * The counters of the current tables as last read (collect). A write
   * whole empties it (the new table counts from zero); an incremental one
   * drops the counters it restarted, the rest keep counting in the kernel.
   */
  private live = new Map<string, CounterValue>();
  /** When `live` was last read from the kernel (clock ms): the stats' readAt. */
  private liveAt = -Infinity;
  /** Packets handed back per service by earlier tables (handedBackTotals). */
  private handedBack = new Map<string, number>();
  private startCheck: StartCheck | undefined;
  private facts: KernelFacts = { ipForward: undefined, ipForwardChangedByAgent: false, sendRedirectsDisabledOn: [], conntrackCount: undefined, conntrackMax: undefined };
  private lastError: string | undefined;
  private readonly clock: Clock;
  private readonly countersEveryMs: number;
  private readonly dsrDevice: string | undefined;
  private readonly placement: Placement;
  /** The counters as last read for the metrics (a scrape's, at most one per countersEveryMs). */
  private latest: ForwardStats = NO_STATS;
  /** When `latest` was read (clock ms); -Infinity before the first read. */
  private latestReadAt = -Infinity;
  /** An apply changed the tables since `latest` was derived. */
  private latestStale = false;
  /** What the metrics see of the stats: the eBPF NAT engine adds the flows it forwards (ebpf-nat.ts). */
  private statsView: ((st: ForwardStats) => ForwardStats) | undefined;
  private readonly dsrEngine: DsrEngineChoice;
  private readonly makeDsrBpf: (() => DsrBpf) | undefined;
  private dsrBpf: DsrBpf | undefined;
  /** undefined while no DSR port is forwarded. */
  private dsrState: DsrEngineState | undefined;
  /** Whether the device was checked for a program an earlier process left (first apply). */
  private dsrChecked = false;
  /** Whether our netdev table was there at start (checkAtStart): only then can an earlier process's program be. */
  private dsrTableAtStart = false;
  /** An IPv6 table was there at start (an earlier process's): the first write deletes it when no IPv6 VIP wants it. */
  private ip6TableAtStart = false;
  /** net.ipv6.conf.all.forwarding was made 1 (done once, when the first IPv6 table is written). */
  private ip6ForwardingChecked = false;
  private readonly makeConntrack: () => ConntrackClient;
  private readonly makeCounterReader: (() => CounterReader) | undefined;
  private counterReader: CounterReader | undefined;
  private readonly makeBatchWriter: (() => BatchWriter) | undefined;
  private batchWriter: BatchWriter | undefined;
  /** The ports of this process's batch writers: their commits are ours. */
  private readonly ownPorts = new Set<number>();
  private readonly deltaWrites: DeltaWrites = { netlink: 0, nft: 0, unencoded: 0, netlinkFailed: 0 };
  /** Why counters are read by spawning nft (the netlink reader failed), logged once. */
  private counterReaderFailed: string | undefined;
  private conntrack: ConntrackClient | undefined;
  /** The last sweep's failure, until one works (status). */
  private udpFlowsError: string | undefined;
  /** The last vipArrived's failure, until one works (status). */
  private forwardedFlowsError: string | undefined;
  /** Untranslated entries ended by vipArrived since start (status). */
  private forwardedFlowsEnded = 0;
  /** VIPs arrived whose sweep has not started (vipArrived). */
  private arrivals: ArrivalBatch | undefined;
  /** UDP flows ended because their backend left the port, by service and port label (udpEndedKey); a port's count goes with the port. */
  private readonly udpEnded = new Map<string, number>();
  /** The pids of this process's recent `nft -f` runs, with when each started: their commits are ours. */
  private readonly writers = new Map<number, number>();
  /** The next apply rewrites the tables even when the plan is unchanged (repair). */
  private forceWrite = false;

  constructor(opts: NftDataplaneOptions = {}) {
    this.log = (opts.log ?? silentLogger()).child({ module: 'forward', dataplane: 'kernel' });
    this.exec = opts.exec ?? execProgram;
    this.procRoot = opts.procRoot ?? '/proc';
    this.clock = opts.clock ?? realClock;
    this.countersEveryMs = opts.countersEveryMs ?? 5000;
    this.dsrDevice = opts.dsrDevice;
    this.placement = opts.placement ?? 'round-robin';
    this.dsrEngine = opts.dsrEngine ?? 'auto';
    const device = opts.dsrDevice;
    const store = opts.dsrStore;
    this.makeDsrBpf = opts.dsrBpf ?? (device === undefined ? undefined : () => new (ebpfAttach().DsrBpf)({ device, store }));
    this.makeConntrack = opts.conntrack ?? (() => new (conntrackModule().Conntrack)());
    this.makeCounterReader = opts.counterReader ?? (opts.exec ? undefined : () => new (nftCountersModule().NftCounterReader)());
    this.makeBatchWriter = opts.batchWriter ?? (opts.exec ? undefined : () => new (nftBatchModule().NftBatchWriter)());
    // A scrape never changes what the data path holds: it reads the
    // counters (over netlink) when the last read is older than
    // countersEveryMs, in the queue, so never against a half-applied table.
    this.metrics = opts.registry
      ? new ForwardMetrics({
        registry: opts.registry, kind: 'kernel', reason: opts.reason ?? 'configured', log: this.log, now: () => this.clock.now(),
        stats: async () => {
          const st = await this.latestStats();
          if (!this.statsView) return st;
          try { return this.statsView(st); } catch (err) { throw new StatsReadFailure('view', err); }
        },
      })
      : undefined;
  }

  apply(state: ForwardState): Promise<void> {
    return this.queue.run(async () => {
      // An apply that leaves the table as it is spawns nothing: a VRRP
      // takeover waits for the apply in flight before it puts the address on
      // (the rules were armed while Backup), and a counter read there would
      // put two `nft` processes in the path of a failover.
      const done = await this.applyNow(state);
      // A table nft just wrote counts from zero (the old one's totals are in
      // `carry`): the metrics need no `nft list counters` to know that.
      // A spawn stalls the event loop, and at start the applies run back to
      // back while every DHCP service binds.
      if (done && this.metrics) await this.refreshCounters(done === 'written');
    });
  }

  /**
   * Someone else changed a table the agent owns (or may have: notifications
   * were lost): write the current state again, whole, in one transaction.
   * Resolves true when the tables were written, false when there was
   * nothing to repair (not started, or stopped). Rejects when nft fails.
   */
  repair(): Promise<boolean> {
    return this.queue.run(async () => {
      if (!this.started || this.stopped) return false;
      this.forceWrite = true;
      const done = await this.applyNow(this.state);
      if (done && this.metrics) await this.refreshCounters(done === 'written');
      return done === 'written';
    });
  }

  /**
   * Was the nftables commit by this pid, or from a socket with this port,
   * one of this process's writes? The commit's pid is the initial PID
   * namespace's; the port is nft's pid as this process sees it, so in a
   * container only the port matches (net/netlink/nft-watch.ts).
   */
  ownsCommit(pid: number | undefined, port?: number): boolean {
    for (const p of [pid, port]) {
      if (p === undefined) continue;
      if (p === process.pid || this.writers.has(p) || this.ownPorts.has(p)) return true;
    }
    return false;
  }

  private noteWriter(pid: number): void {
    const now = this.clock.now();
    // A commit's notifications arrive within moments of its process; a pid
    // is forgotten after a minute, before the kernel could hand it out again.
    for (const [p, at] of this.writers) if (now - at > 60_000) this.writers.delete(p);
    this.writers.set(pid, now);
  }

  /** The tables this data path owns now, as "family name" (the nftables watch's keys). */
  ownedTables(): string[] {
    if (!this.started || this.stopped || !this.plan) return [];
    return [`${NFT_FAMILY} ${NFT_TABLE}`, ...(hasDsrTable(this.plan) ? [`${DSR_FAMILY} ${DSR_TABLE}`] : []), ...(hasIp6Table(this.plan) ? [`${NFT6_FAMILY} ${NFT_TABLE}`] : [])];
  }

  /**
   * The forwarding sysctls as the kernel path needs them (1):
   * net.ipv4.ip_forward, and net.ipv6.conf.all.forwarding while a table of
   * IPv6 VIPs is written (with accept_ra kept, ensureIpv6Forwarding). Read,
   * and put back when someone turned one off. Returns each one changed, with
   * the value found; none when they were right (or the path is not running).
   */
  async keepForwarding(): Promise<Array<{ sysctl: string; found: number }>> {
    if (!this.started || this.stopped) return [];
    const out: Array<{ sysctl: string; found: number }> = [];
    const file = path.join(this.procRoot, 'sys/net/ipv4/ip_forward');
    const now = await readNumber(file);
    if (now !== 1 && now !== undefined) {
      await fs.writeFile(file, '1\n');
      this.facts = { ...this.facts, ipForward: 1, ipForwardChangedByAgent: true };
      out.push({ sysctl: 'net.ipv4.ip_forward', found: now });
    }
    if (this.plan && hasIp6Table(this.plan)) {
      const six = await readNumber(path.join(this.procRoot, 'sys/net/ipv6/conf/all/forwarding'));
      if (six !== 1 && six !== undefined) {
        this.ip6ForwardingChecked = false;
        await this.ensureIpv6Forwarding();
        out.push({ sysctl: 'net.ipv6.conf.all.forwarding', found: six });
      }
    }
    return out;
  }

  /** The metrics' view of the stats goes through fn: an engine in front of the table adds the flows that never reach its counters. */
  viewStatsThrough(fn: (st: ForwardStats) => ForwardStats): void {
    this.statsView = fn;
  }

  /** Read the counters for the metrics now rather than at the next tick (e.g. right after a burst of test traffic). */
  readCountersNow(): Promise<void> {
    return this.queue.run(() => this.refreshCounters());
  }

  /**
   * Read the counters for the metrics (in the queue, so never against a
   * half-applied table). A read that fails here is not lost: `latest` keeps
   * the last good values and the next scrape reads again (latestStats),
   * where the metrics count and log the failure.
   */
  private async refreshCounters(fromLastRead = false): Promise<void> {
    if (this.stopped) return;
    // From the last read, the stats are derived when the metrics next ask
    // (latestStats): a derivation walks every flow, and an apply that
    // changed one service should cost that service's work.
    if (fromLastRead) { this.latestStale = true; return; }
    await this.readLatest().catch(() => undefined);
  }

  /**
   * A fresh read into `latest`. A counter read that failed still gives the
   * services as they are now, with the counters as last read
   * (countersFailure): it is not counted as read, so the next scrape reads
   * again. Rejects (step "derive") when the stats could not be worked out,
   * `latest` left as it was.
   */
  private async readLatest(): Promise<void> {
    let st: ForwardStats;
    try { st = await this.collect(false); } catch (err) { throw new StatsReadFailure('derive', err); }
    this.latest = st;
    this.latestStale = false;
    if (st.countersFailure === undefined) this.latestReadAt = this.clock.now();
  }

  /**
   * The stats the metrics show: a fresh read when the last is older than
   * countersEveryMs, else the last read (derived again when an apply changed
   * the tables since). Read only when asked: at 1,000 services a read is
   * thousands of counters decoded, and a timer reading them for nobody was
   * most of an idle agent's CPU.
   */
  private latestStats(): Promise<ForwardStats> {
    const due = (): boolean => this.clock.now() - this.latestReadAt >= this.countersEveryMs;
    if (!this.latestStale && !due()) return Promise.resolve(this.latest);
    return this.queue.run(async () => {
      if (this.stopped) return this.latest;
      if (due()) await this.readLatest();
      else if (this.latestStale) {
        try { this.latest = await this.collect(true); } catch (err) { throw new StatsReadFailure('derive', err); }
        this.latestStale = false;
      }
      return this.latest;
    });
  }

  /** Bring the table to `state`: 'written' when nft wrote it, 'adopted' when a running table was taken as is, false when it already matched. */
  private async applyNow(state: ForwardState): Promise<'written' | 'adopted' | false> {
    if (this.stopped) throw new LbError('LB_ERR_FORWARD_NFT', 'the kernel data path was stopped; create a new one');
    // A table of IPv6 VIPs goes with its last VIP, or at start when an earlier process left one.
    const ip6Removal = this.plan ? hasIp6Table(this.plan) : this.ip6TableAtStart;
    const opts = { dsrDevice: this.dsrDevice, placement: this.placement, ip6Removal };
    let next = renderIncremental(state, opts, this.rendering);
    let plan = next.plan;
    for (const p of plan.problems) this.log.warn({ op: 'apply', problem: p }, p);
    if (hasIp6Table(plan)) await this.ensureIpv6Forwarding();
    if (!this.started) {
      await this.ensureSysctls();
      const check = await this.checkAtStart(plan);
      if (this.ip6TableAtStart && !hasIp6Table(plan)) plan = (next = renderIncremental(state, { ...opts, ip6Removal: true }, next)).plan;
      this.started = true;
      this.startCheck = check;
      if (check === 'matched') {
        this.log.info({ op: 'start-check', result: check }, 'nftables table lb_agent already matches the desired state; adopted as is');
        this.plan = plan;
        this.rendering = next;
        this.state = state;
        this.syncBpf(plan);
        return 'adopted';
      }
      this.log.info({ op: 'start-check', result: check }, check === 'absent'
        ? 'creating nftables table lb_agent'
        : 'nftables table lb_agent differs from the desired state (changed by hand or by an older agent); rewriting it');
      this.detachBeforeTableGoes(plan);
      await this.write(plan.script);
      this.plan = plan;
      this.rendering = next;
      this.state = state;
      this.syncBpf(plan);
      // What an earlier process's table sent where is unknown: every UDP port is checked once.
      await this.endStaleUdpFlows(udpFlowSweep(undefined, state));
      return 'written';
    }
    if (!this.forceWrite && this.rendering) {
      const done = await this.applyDelta(next, state);
      if (done !== undefined) return done;
    }
    // Read the old table's counters just before it is replaced; fold them in
    // only once the new table is committed, so a failed write counts nothing twice.
    const live = await this.readCounters().catch((err: unknown) => this.countersAsLastRead(err));
    this.detachBeforeTableGoes(plan);
    await this.write(plan.script);
    this.forceWrite = false;
    this.live = new Map();
    this.carry = keepFlows(flowTotals(this.plan, live, this.carry), state);
    this.handedBack = handedBackTotals(this.plan, live, this.handedBack, state);
    const sweep = udpFlowSweep(this.state, state);
    this.plan = plan;
    this.rendering = next;
    this.state = state;
    this.syncBpf(plan);
    // After the commit, so a packet of an ended flow meets the new table.
    await this.endStaleUdpFlows(sweep);
    this.log.debug({ op: 'apply', services: state.services.length }, 'nftables table lb_agent rewritten');
    return 'written';
  }

  /**
   * Bring the tables from the current render to `next` by changed objects
   * only, worked out from the services that changed (renderPartsDelta), in
   * one transaction; the work of an apply, counters and UDP flows included,
   * is that of the changed services. Counters the delta restarts are read
   * first only when their flow stays in `state` (a name that took another
   * meaning); a counter that goes with its flow is not read at all.
   * Undefined when the change has no incremental form or the transaction
   * failed (the kernel then still holds the previous tables whole: an nft
   * transaction commits entirely or not at all), and the caller writes the
   * tables whole.
   */
  private async applyDelta(next: Rendering, state: ForwardState): Promise<'written' | false | undefined> {
    const prev = this.rendering!;
    const delta = renderPartsDelta(prev, next);
    if (delta === undefined) return undefined;
    if (delta.script === '') { this.plan = next.plan; this.rendering = next; this.state = state; return false; }
    // The changed services' parts and normalized services, looked up by key (no other part is walked).
    const at = (r: Rendering, key: string): number | undefined => r.normal.index.get(key);
    const ofChanged = <T>(r: Rendering, pick: (i: number) => T): T[] => {
      const out: T[] = [];
      for (const k of delta.changed) {
        const i = at(r, k);
        if (i !== undefined) out.push(pick(i));
      }
      return out;
    };
    const kept = new Set<string>();
    for (const p of ofChanged(next, (i) => next.parts[i]!)) {
      kept.add(p.key);
      for (const c of p.counters) kept.add(flowId(c.service, c.port, c.backend));
    }
    const needsRead = delta.resetCounters.some((c) => kept.has(flowId(c.service, c.port, c.backend))) || delta.resetHandBack.some((h) => kept.has(h.service));
    const live = needsRead ? await this.readCounters().catch((err: unknown) => this.countersAsLastRead(err)) : new Map<string, CounterValue>();
    if (delta.dsrRewritten) this.detachBeforeTableGoes(next.plan);
    try {
      await this.writeDelta(delta);
    } catch (err) {
      this.log.warn({ op: 'apply', objects: delta.objects, err: errorMessage(err) }, 'incremental nftables update refused (nothing of it applied); writing the tables whole');
      return undefined;
    }
    const resetPlan = { counters: delta.resetCounters, handBack: delta.resetHandBack } as const;
    if (needsRead) this.live = new Map([...live].filter(([name]) => !delta.reset.has(name)));
    // this.live is this data path's own map (no reader keeps it across an apply): its restarted counters go.
    else for (const name of delta.reset) this.live.delete(name);
    // Totals of flows that went (with a changed service) go with them; the others' are untouched.
    const gone = new Set<string>();
    for (const p of ofChanged(prev, (i) => prev.parts[i]!)) for (const c of p.counters) gone.add(flowId(c.service, c.port, c.backend));
    for (const id of kept) gone.delete(id);
    this.carry = flowTotals(resetPlan, live, this.carry);
    for (const id of gone) this.carry.delete(id);
    this.handedBack = handedBackTotals(resetPlan, live, this.handedBack, state);
    const sweep = udpSweepOf(ofChanged(prev, (i) => prev.normal.services[i]!), ofChanged(next, (i) => next.normal.services[i]!));
    this.plan = next.plan;
    this.rendering = next;
    this.state = state;
    if (delta.dsrRewritten) this.syncBpf(next.plan);
    await this.endStaleUdpFlows(sweep);
    // Logged once the transaction is committed and the BPF program holds it
    // too: what a reader waits for to know a change is in the data path.
    const changed = [...delta.changed];
    this.log.debug({
      op: 'apply', services: changed.length, changed: changed.slice(0, CHANGED_LOGGED), objects: delta.objects, bytes: delta.script.length,
    }, 'nftables tables updated by changed objects');
    return 'written';
  }

  /**
   * Write a delta: its typed steps over nfnetlink in one transaction (no
   * process: the cost of a health transition is its few messages), or its
   * script with nft when a step has no typed form or the netlink write
   * failed. Either commits all of the delta or none of it, so the
   * fallback starts from the tables the delta was worked out from.
   */
  private async writeDelta(delta: NftDelta): Promise<void> {
    if (this.makeBatchWriter) {
      if (delta.ops === undefined) {
        this.deltaWrites.unencoded++;
        this.log.debug({ op: 'apply', objects: delta.objects }, 'the delta holds a step the netlink writer does not encode; writing it with nft');
      } else {
        try {
          this.batchWriter ??= this.makeBatchWriter();
          this.ownPorts.add(this.batchWriter.port);
          await this.batchWriter.write(NFT_TABLE, delta.ops);
          this.deltaWrites.netlink++;
          this.lastError = undefined;
          return;
        } catch (err) {
          this.deltaWrites.netlinkFailed++;
          this.log.debug({ op: 'apply', objects: delta.objects, err: errorMessage(err) }, 'the netlink write of the delta failed (nothing of it applied); writing it with nft');
          // A refusal leaves the socket as it was; any other failure (the socket's, no answer) leaves it in doubt: the next delta opens another.
          if (!(err instanceof nftBatchModule().NftBatchError)) { this.batchWriter?.close(); this.batchWriter = undefined; }
        }
      }
    }
    await this.write(delta.script);
    this.deltaWrites.nft++;
  }

  /**
   * End the UDP flows conntrack still sends to a backend the port no longer
   * sends to (net/conntrack.ts says why). Never throws: the table is
   * committed whatever happens here; a failure is logged and shown in status.
   */
  private async endStaleUdpFlows(rules: readonly UdpFlowSweepRule[]): Promise<void> {
    if (rules.length === 0) return;
    try {
      this.conntrack ??= this.makeConntrack();
      const r = await this.conntrack.endUdpFlows(rules);
      this.udpFlowsError = undefined;
      const { udpFlowKey } = conntrackModule();
      for (const rule of rules) {
        const n = r.byPort.get(udpFlowKey(rule.vip, rule.port)) ?? 0;
        if (n === 0) continue;
        const k = udpEndedKey(rule.service, rule.portLabel);
        this.udpEnded.set(k, (this.udpEnded.get(k) ?? 0) + n);
      }
      if (r.ended > 0) this.log.info({ op: 'udp-flows', ended: r.ended, ports: rules.map((x) => `${x.vip}:${x.port}`) }, `ended ${r.ended} UDP flow(s) to backends their port no longer sends to; their next datagram is placed again`);
    } catch (err) {
      // Its own slot: a later table write succeeding says nothing of the flows still pinned.
      this.udpFlowsError = `${UDP_FLOWS_ERROR}: ${errorMessage(err)}`;
      this.log.warn({ op: 'udp-flows', err: errorMessage(err) }, this.udpFlowsError);
    }
  }

  /**
   * A VIP has come onto this node: end the untranslated conntrack entries to
   * its ports (net/conntrack.ts untranslatedFlows says why), which a client
   * reusing a source port would otherwise ride into a reset. VIPs that
   * arrive within ARRIVALS_BATCH_MS of the first share one sweep (a
   * takeover brings every VIP of a virtual router; each dump walks
   * conntrack's whole hash table, ~7 ms of kernel time here); the promise
   * settles when their sweep is done. Outside the apply queue: a takeover
   * must not wait behind a table write. Never throws; a failure is logged
   * and shown in status until one works.
   */
  vipArrived(vip: string, ports: readonly { readonly protocol: Protocol; readonly port: number }[]): Promise<void> {
    // Untranslated flows follow a VRRP move, which IPv6 VIPs do not have.
    if (this.stopped || ports.length === 0 || vip.includes(':')) return Promise.resolve();
    const { IPPROTO_TCP, IPPROTO_UDP } = conntrackModule();
    let batch = this.arrivals;
    if (!batch) {
      const arriving = new Map<string, ForwardedPort>();
      const done = new Promise<void>((resolve) => {
        this.clock.setTimeout(() => {
          if (this.arrivals?.ports === arriving) this.arrivals = undefined;
          void this.endUntranslated([...arriving.values()]).then(resolve);
        }, ARRIVALS_BATCH_MS);
      });
      this.arrivals = batch = { ports: arriving, done };
    }
    for (const p of ports) {
      const proto = p.protocol === 'UDP' ? IPPROTO_UDP : IPPROTO_TCP;
      batch.ports.set(`${vip}|${proto}|${p.port}`, { vip, proto, port: p.port });
    }
    return batch.done;
  }

  private async endUntranslated(ports: readonly ForwardedPort[]): Promise<void> {
    if (this.stopped) return;
    const startedAt = this.clock.now();
    const vips = [...new Set(ports.map((p) => p.vip))];
    const what = vips.join(', ');
    try {
      this.conntrack ??= this.makeConntrack();
      const r = await this.conntrack.endUntranslatedFlows(ports);
      this.forwardedFlowsError = undefined;
      this.forwardedFlowsEnded += r.ended;
      if (r.ended > 0) {
        this.log.info({ op: 'stale-flows', vips, ended: r.ended, ms: this.clock.now() - startedAt },
          `${what} came onto this node: ended ${r.ended} untranslated conntrack entr${r.ended === 1 ? 'y' : 'ies'} of flows it routed on while the VIP was elsewhere (a client reusing their source port would be reset)`);
      }
    } catch (err) {
      this.forwardedFlowsError = `cannot end the untranslated conntrack entries to ${what} (a client reusing their source port is reset until they expire): ${errorMessage(err)}`;
      this.log.warn({ op: 'stale-flows', vips, err: errorMessage(err) }, this.forwardedFlowsError);
    }
  }

  /**
   * Put the BPF program for `plan` in front of the netdev table the plan
   * just committed: a new program and maps swapped in with
   * BPF_F_REPLACE, so frames see the old program or the new one. When it
   * cannot be loaded or attached, ours is detached and the table alone
   * forwards (correct, at about twice the CPU per frame); with no DSR port
   * forwarded, or engine nft, ours (this process's or an earlier one's) is
   * detached. Never throws: the nft table serves whatever happens here.
   */
  private syncBpf(plan: NftPlan): void {
    const want = plan.dsr.length > 0 && hasDsrTable(plan);
    const prev = this.dsrState;
    const first = !this.dsrChecked;
    this.dsrChecked = true;
    // Without DSR nothing BPF is loaded, but the first apply looks for a
    // program an earlier process left - only when it left our netdev table,
    // which outlives the program (the header above).
    // DSR ports the program does not serve (another network's NIC) go by the table alone.
    const tableOnly: DsrEngineState | undefined = !want && hasDsrTable(plan)
      ? { engine: 'nft', cause: 'table', reason: `table ${DSR_FAMILY} ${DSR_TABLE} forwards every DSR port (the BPF program serves VIPs arriving on ${this.dsrDevice ?? 'the parent'} only, and none is forwarded)` }
      : undefined;
    if (tableOnly && prev?.reason !== tableOnly.reason) this.log.info({ op: 'dsr-engine', engine: 'nft' }, `direct server return: ${tableOnly.reason}`);
    if (!want && !this.dsrBpf && !(first && this.dsrTableAtStart)) { this.dsrState = tableOnly; return; }
    if (want && this.dsrEngine === 'auto' && this.makeDsrBpf) {
      try {
        this.dsrBpf ??= this.makeDsrBpf();
        const applied = this.dsrBpf.apply(plan.dsr);
        if (applied.replaced === 'none' && applied.unreadable > 0) {
          this.log.warn({ op: 'dsr-engine', unreadable: applied.unreadable },
            `direct server return: ${applied.unreadable} program(s) at tcx ingress of ${this.dsrDevice} that this process may not open by id (no CAP_SYS_ADMIN) and none handed back by the service manager's fd store: one an earlier process left may still forward in front of ours until \`lb-agent withdraw\` (as root) removes it`);
        }
        this.dsrState = { engine: 'bpf', cause: 'tcx', reason: `BPF program at tc ingress (tcx) of ${this.dsrDevice}, in front of table ${DSR_FAMILY} ${DSR_TABLE}` };
        if (prev?.engine !== 'bpf') this.log.info({ op: 'dsr-engine', engine: 'bpf', ports: plan.dsr.length }, `direct server return: ${this.dsrState.reason}`);
        return;
      } catch (err) {
        const reason = `the BPF program cannot run here (${errorMessage(err)}); table ${DSR_FAMILY} ${DSR_TABLE} forwards alone (correct, slower)`;
        this.dsrState = { engine: 'nft', cause: 'fallback', reason };
        if (prev?.reason !== reason) this.log.warn({ op: 'dsr-engine', engine: 'nft', code: (err as { code?: string }).code, err: errorMessage(err) }, `direct server return: ${reason}`);
      }
    } else {
      this.dsrState = !want ? tableOnly : { engine: 'nft', cause: 'forced', reason: `LB_AGENT_DSR_ENGINE=${this.dsrEngine}: table ${DSR_FAMILY} ${DSR_TABLE} forwards alone` };
      if (want && prev?.engine !== 'nft') this.log.info({ op: 'dsr-engine', engine: 'nft' }, `direct server return: ${this.dsrState!.reason}`);
    }
    // Looking for a leftover at the first apply of a config without DSR on a
    // node where bpf(2) is refused is no problem: nothing of ours can be
    // there that this process could have put there.
    this.detachBpf(!want && prev === undefined && this.dsrBpf?.active !== true);
  }

  /**
   * Before a write that removes our netdev table: detach the program in
   * front of it first (this process's, or at the first apply an earlier
   * one's), so a crash between the two never leaves a program without its
   * table - the invariant that lets a start without the table skip the
   * driver. The syncBpf after the write then finds nothing attached.
   */
  private detachBeforeTableGoes(plan: NftPlan): void {
    if (hasDsrTable(plan)) return;
    if (this.dsrBpf?.active || (!this.dsrChecked && this.dsrTableAtStart)) this.detachBpf(!this.dsrBpf?.active);
  }

  /** Detach our program (this process's or a leftover of an earlier one); a failure is logged and shown in status unless `quiet`. */
  private detachBpf(quiet = false): void {
    try {
      if (!this.dsrBpf && this.makeDsrBpf) this.dsrBpf = this.makeDsrBpf();
    } catch { return; /* no bpf(2) here: nothing of ours can be attached */ }
    try {
      this.dsrBpf?.detach();
    } catch (err) {
      const message = `cannot detach the DSR program from ${this.dsrDevice}: ${errorMessage(err)}`;
      if (quiet) { this.log.debug({ op: 'dsr-engine', err: errorMessage(err) }, message); return; }
      this.lastError = message;
      this.log.error({ op: 'dsr-engine', err: errorMessage(err) }, message);
    }
  }

  private async checkAtStart(plan: NftPlan): Promise<StartCheck> {
    const current = await this.listTable(NFT_FAMILY);
    const currentDsr = await this.listTable(DSR_FAMILY);
    // An earlier process's IPv6 table is adopted or rewritten like the IPv4 one (one `nft` more at start).
    const current6 = await this.listTable(NFT6_FAMILY);
    this.dsrTableAtStart = currentDsr !== undefined;
    this.ip6TableAtStart = current6 !== undefined;
    if (current === undefined && currentDsr === undefined && current6 === undefined) return 'absent';
    let expected: string;
    let expectedDsr: string;
    let expected6: string;
    try {
      // What the kernel would list for our script, from a throwaway namespace:
      // the same nft and kernel canonicalise both sides. `fwd ... device`
      // names a NIC (the parent, or a named network's), which nft resolves to
      // an index: a veth of that name stands in for each there.
      // (Hand-back rules' `dup ... device` name it too.)
      const setup = 'i=0; for d in "$@"; do i=$((i+1)); ip link add "$d" type veth peer name "lbchk$i" >/dev/null 2>&1; done; ';
      const r = await this.exec('unshare', ['-n', 'sh', '-c',
        `${setup}nft -f - >/dev/null && nft -j list table ${NFT_FAMILY} ${NFT_TABLE} && echo ${LIST_SEPARATOR} && { nft -j list table ${DSR_FAMILY} ${DSR_TABLE} 2>/dev/null || true; }`
        + ` && echo ${LIST_SEPARATOR} && { nft -j list table ${NFT6_FAMILY} ${NFT_TABLE} 2>/dev/null || true; }`,
        'sh', ...plan.devices], plan.script);
      // Split at the separator lines: a table that is not there lists nothing, not even a newline.
      const parts = r.stdout.split('\n').reduce<string[][]>((acc, line) => {
        if (line === LIST_SEPARATOR) acc.push([]);
        else acc[acc.length - 1]!.push(line);
        return acc;
      }, [[]]).map((lines) => lines.join('\n'));
      expected = parts[0] ?? '';
      expectedDsr = (parts[1] ?? '').trim();
      expected6 = (parts[2] ?? '').trim();
    } catch (err) {
      this.log.warn({ op: 'start-check', err: execError(err).stderr }, 'cannot render the expected table in a throwaway namespace; rewriting without comparing');
      return 'rewritten-unverified';
    }
    try {
      const same = (a: string | undefined, b: string): boolean => (a === undefined ? b === '' : b !== '' && canonicalTableJson(a) === canonicalTableJson(b));
      return same(current, expected) && same(currentDsr, expectedDsr) && same(current6, expected6) ? 'matched' : 'rewritten';
    } catch {
      return 'rewritten';
    }
  }

  private async listTable(family: string): Promise<string | undefined> {
    try {
      return (await this.exec('nft', ['-j', 'list', 'table', family, NFT_TABLE])).stdout;
    } catch (err) {
      const e = execError(err);
      if (isAbsentTable(e.stderr)) return undefined;
      throw this.nftError(err, 'list');
    }
  }

  private async write(script: string): Promise<void> {
    try {
      await this.exec('nft', ['-f', '-'], script, { onSpawn: (pid) => this.noteWriter(pid) });
      this.lastError = undefined;
    } catch (err) {
      const e = this.nftError(err, 'apply');
      this.lastError = e.message;
      throw e;
    }
  }

  private nftError(err: unknown, what: string): LbError {
    const e = execError(err);
    if (e.code === 'ENOENT') {
      return new LbError('LB_ERR_FORWARD_NFT_MISSING', 'nft not found: install the nftables package or use dataplane: proxy', undefined, { cause: err });
    }
    return new LbError('LB_ERR_FORWARD_NFT', `nft ${what} of table ${NFT_FAMILY} ${NFT_TABLE} failed: ${firstLine(e.stderr)}; the previous rule set stays in force`,
      { stderr: e.stderr }, { cause: err });
  }

  /**
   * The counters a write folds into its totals when the table's own cannot
   * be read just before it goes: those last read. What the table counted
   * since that read is lost, but the totals never go backwards, as they
   * would from no counters at all (a reset to Prometheus).
   */
  private countersAsLastRead(err: unknown): Map<string, CounterValue> {
    this.log.warn({ op: 'apply', err: errorMessage(err) }, 'counters of the nftables table unreadable before it is rewritten; its totals kept as last read');
    return this.live;
  }

  /**
   * The named counters of the table(s) the current plan defines (the netdev
   * table only when it has DSR ports). A plan without counters (no VIP held
   * yet, or services with no backends) has nothing to read: no `nft` is
   * spawned: each spawn forks the whole agent (libuv's uv_spawn uses fork()
   * on Linux), and while the DHCP VIPs bind, applies come back to back on
   * tables that have no counters yet.
   */
  private async readCounters(): Promise<Map<string, CounterValue>> {
    if (!this.plan || (this.plan.counters.length === 0 && this.plan.handBack.length === 0)) return new Map();
    const out = await this.tableCounters(NFT_FAMILY, NFT_TABLE);
    if (this.plan && hasIp6Table(this.plan)) {
      for (const [k, v] of await this.tableCounters(NFT6_FAMILY, NFT_TABLE)) out.set(k, v);
    }
    if (this.plan && hasDsrTable(this.plan)) {
      for (const [k, v] of await this.tableCounters(DSR_FAMILY, DSR_TABLE)) out.set(k, v);
      // The BPF program counts what it forwards under the same names; the
      // table counts only what the program passed on to it.
      if (this.dsrBpf?.active) {
        for (const [k, v] of this.dsrBpf.counters()) {
          const n = out.get(k);
          out.set(k, { packets: (n?.packets ?? 0) + v.packets, bytes: (n?.bytes ?? 0) + v.bytes });
        }
      }
    }
    return out;
  }

  /**
   * The named counters of one table: a dump over nfnetlink (no process,
   * no JSON), or `nft -j list counters` where the reader cannot be had or
   * failed (logged once; the next read tries netlink again).
   */
  private async tableCounters(family: string, table: string): Promise<Map<string, CounterValue>> {
    if (this.makeCounterReader) {
      try {
        this.counterReader ??= this.makeCounterReader();
        const r = await this.counterReader.read(family, table);
        this.counterReaderFailed = undefined;
        return r;
      } catch (err) {
        const why = errorMessage(err);
        if (this.counterReaderFailed !== why) this.log.warn({ op: 'counters', err: why }, 'cannot read nftables counters over netlink; reading them with nft');
        this.counterReaderFailed = why;
        this.counterReader?.close();
        this.counterReader = undefined;
      }
    }
    return parseNftCounters((await this.exec('nft', ['-j', 'list', 'counters', 'table', family, table])).stdout);
  }

  /**
   * Sysctls of this network namespace the kernel path needs:
   * - net.ipv4.ip_forward=1, without which DNAT to another host goes nowhere;
   * - send_redirects=0 on every interface: client, VIP and backends share one
   *   L2 segment, so every DNATed packet leaves by the interface it came in
   *   on and the kernel would send the client an ICMP redirect ("reach the
   *   backend directly") for it. Useless to the client, and the redirects use
   *   up the per-host ICMP rate limit, which then delays the port-unreachable
   *   that refuses UDP when no backend is healthy. The effective value is the
   *   OR of conf/all and conf/<if>, hence every entry - but the agent's own
   *   service macvlans: they carry one /32 VIP each and no route, so no
   *   packet is ever forwarded out of one, and a redirect needs the packet
   *   to leave by the interface it came in on. Skipping them keeps a start
   *   that finds them in place (a planned restart keeps them) from reading
   *   and writing two procfs files per service in front of its first apply.
   */
  private async ensureSysctls(): Promise<void> {
    const file = path.join(this.procRoot, 'sys/net/ipv4/ip_forward');
    const before = await readNumber(file);
    let changed = false;
    if (before !== 1) {
      try {
        await fs.writeFile(file, '1\n');
        changed = true;
        this.log.warn({ op: 'sysctl', sysctl: 'net.ipv4.ip_forward', before, after: 1 }, 'enabled net.ipv4.ip_forward: the kernel data path forwards VIP traffic to backends');
      } catch (err) {
        throw new LbError('LB_ERR_NET_SYSCTL', `cannot set net.ipv4.ip_forward=1 (${errorMessage(err)}); the kernel data path needs it: set it in /etc/sysctl.d or run the agent as root`,
          { file }, { cause: err });
      }
    }
    const confDir = path.join(this.procRoot, 'sys/net/ipv4/conf');
    const redirectsOff: string[] = [];
    const redirectsFailed: string[] = [];
    let entries: string[] = [];
    try { entries = await fs.readdir(confDir); } catch { /* no /proc here: nothing to do */ }
    for (const name of entries) {
      if (hasOwnedName(name)) continue;
      const f = path.join(confDir, name, 'send_redirects');
      if ((await readNumber(f)) !== 1) continue;
      try { await fs.writeFile(f, '0\n'); redirectsOff.push(name); } catch { redirectsFailed.push(name); }
    }
    if (redirectsOff.length > 0) {
      this.log.info({ op: 'sysctl', sysctl: 'net.ipv4.conf.*.send_redirects', after: 0, interfaces: redirectsOff }, 'disabled ICMP redirects: VIP traffic is forwarded out of the interface it arrived on');
    }
    if (redirectsFailed.length > 0) {
      this.log.warn({ op: 'sysctl', sysctl: 'net.ipv4.conf.*.send_redirects', interfaces: redirectsFailed }, 'could not disable ICMP redirects; clients will receive redirects for VIP traffic');
    }
    this.facts = { ...this.facts, ipForward: changed ? 1 : before, ipForwardChangedByAgent: changed, sendRedirectsDisabledOn: redirectsOff };
  }

  /**
   * net.ipv6.conf.all.forwarding=1, without which DNAT of an IPv6 VIP to a
   * backend goes nowhere; set once, before the first table of IPv6 VIPs. A
   * forwarding interface ignores router advertisements unless accept_ra is
   * 2, so every interface that accepts them (1) is moved to 2 first: the VM
   * keeps its SLAAC address and default route.
   */
  private async ensureIpv6Forwarding(): Promise<void> {
    if (this.ip6ForwardingChecked) return;
    const file = path.join(this.procRoot, 'sys/net/ipv6/conf/all/forwarding');
    const before = await readNumber(file);
    if (before === 1 || before === undefined) { this.ip6ForwardingChecked = true; return; }
    const confDir = path.join(this.procRoot, 'sys/net/ipv6/conf');
    let entries: string[] = [];
    try { entries = await fs.readdir(confDir); } catch { /* no /proc here */ }
    const keptRa: string[] = [];
    for (const name of entries) {
      const f = path.join(confDir, name, 'accept_ra');
      if ((await readNumber(f)) !== 1) continue;
      try { await fs.writeFile(f, '2\n'); keptRa.push(name); } catch { /* reported by the warning below if forwarding is set */ }
    }
    try {
      await fs.writeFile(file, '1\n');
    } catch (err) {
      throw new LbError('LB_ERR_NET_SYSCTL', `cannot set net.ipv6.conf.all.forwarding=1 (${errorMessage(err)}); the kernel data path needs it for IPv6 VIPs: set it in /etc/sysctl.d or run the agent as root`,
        { file }, { cause: err });
    }
    this.ip6ForwardingChecked = true;
    this.log.warn({ op: 'sysctl', sysctl: 'net.ipv6.conf.all.forwarding', before, after: 1, acceptRa2: keptRa }, 'enabled net.ipv6.conf.all.forwarding: the kernel data path forwards IPv6 VIP traffic to backends');
  }

  stop(opts: { keep?: boolean } = {}): Promise<void> {
    return this.queue.run(async () => {
      if (this.stopped) return;
      this.stopped = true;
      this.metrics?.unregister();
      this.counterReader?.close();
      this.counterReader = undefined;
      this.batchWriter?.close();
      this.batchWriter = undefined;
      if (opts.keep) {
        // A planned restart: the table keeps forwarding; the next process adopts it (start check).
        this.dsrBpf?.release();
        this.log.info({ op: 'stop', keep: true }, 'nftables table lb_agent left in place for the next process');
        return;
      }
      // The program and the table go together (the table first would leave
      // the program forwarding by a plan no process holds any more).
      if (this.dsrState?.engine === 'bpf' || this.dsrBpf) this.detachBpf();
      await this.write(renderRemoval());
      // Conntrack keeps translating an open UDP flow while any nat chain is
      // left in the namespace (another table's): none outlives ours.
      await this.endStaleUdpFlows(udpFlowSweep(this.state, { services: [] }));
      this.conntrack?.close();
      this.log.info({ op: 'stop' }, 'removed nftables table lb_agent');
    });
  }

  /** A fresh read of the counters (status, and a scrape once the last read is countersEveryMs old). */
  stats(): Promise<ForwardStats> {
    return this.collect(false);
  }

  /**
   * stats(); with `fromLastRead` no `nft` is spawned: the live values are
   * those of the last read (`live`), less what a write since restarted (a
   * table written whole counts from zero; its totals are in `carry`).
   */
  private async collect(fromLastRead: boolean): Promise<ForwardStats> {
    const plan = this.plan;
    let live = fromLastRead ? this.live : new Map<string, CounterValue>();
    let readAt = fromLastRead ? this.liveAt : this.clock.now();
    let countersFailure: ForwardStats['countersFailure'];
    const problems = [...(plan?.problems ?? [])];
    if (plan && !this.stopped && !fromLastRead) {
      try {
        live = await this.readCounters();
        this.live = live;
        this.liveAt = readAt;
      } catch (err) {
        // The counters as last read, not none: totals from the carry alone
        // would go backwards (a counter reset to Prometheus) and jump back
        // at the next good read.
        live = this.live;
        readAt = this.liveAt;
        const why = firstLine(execError(err).stderr);
        countersFailure = { step: 'counters', error: why };
        problems.push(`cannot read nftables counters: ${why}`);
      }
    }
    const metricsProblem = this.metrics?.readProblem();
    if (metricsProblem !== undefined) problems.push(metricsProblem);
    if (this.lastError) problems.push(this.lastError);
    if (this.udpFlowsError) problems.push(this.udpFlowsError);
    if (this.forwardedFlowsError) problems.push(this.forwardedFlowsError);
    const totals = flowTotals(plan, live, this.carry);
    const handedBack = [...handedBackTotals(plan, live, this.handedBack, this.state)].map(([service, packets]) => ({ service, packets }));
    const flows: FlowStats[] = [];
    const normal = this.normalServices();
    const udpPorts = new Set<string>();
    for (const s of normal) {
      for (const { spec } of s.ports) {
        if (spec.protocol === 'UDP') udpPorts.add(udpEndedKey(s.key, portLabel(spec)));
        for (const b of s.all) {
          const t = totals.get(flowId(s.key, spec, b.address)) ?? { conns: 0, toBackend: 0, toClient: 0 };
          flows.push({
            service: s.key, port: portLabel(spec), protocol: spec.protocol, backend: b.address,
            connections: t.conns, active: undefined, bytesToBackend: t.toBackend, bytesToClient: t.toClient, connectFailures: undefined,
          });
        }
      }
    }
    const services = normal.map((s) => ({
      key: s.key, vip: s.vip, healthy: s.healthy.length, backends: s.all.length, noHealthyBackend: s.healthy.length === 0,
    }));
    const udpFlowsEnded: UdpFlowsEnded[] = [];
    for (const [k, ended] of this.udpEnded) {
      if (!udpPorts.has(k)) { this.udpEnded.delete(k); continue; }
      const [service, port] = k.split('\u0000') as [string, string];
      udpFlowsEnded.push({ service, port, ended });
    }
    const nfDir = path.join(this.procRoot, 'sys/net/netfilter');
    this.facts = { ...this.facts, conntrackCount: await readNumber(path.join(nfDir, 'nf_conntrack_count')), conntrackMax: await readNumber(path.join(nfDir, 'nf_conntrack_max')) };
    return { kind: 'kernel', services, flows, problems, udpFlowsEnded, handedBack, ...(Number.isFinite(readAt) ? { readAt } : {}), ...(countersFailure ? { countersFailure } : {}), details: { table: `${NFT_FAMILY} ${NFT_TABLE}`, startCheck: this.startCheck, ...this.facts, deltaWrites: { ...this.deltaWrites }, untranslatedFlowsEnded: this.forwardedFlowsEnded, ...(this.dsrState ? { dsrEngine: this.dsrState } : {}) } };
  }

  /**
   * normalizeState of the state in place: the rendering's, kept from the
   * apply (normalizeStateFrom gives normalizeState's services object for
   * object) while it was made from this state's services; worked out whole
   * otherwise.
   */
  private normalServices(): readonly NormalizedService[] {
    const r = this.rendering;
    const input = this.state.services;
    if (r !== undefined && r.normal.from.length === input.length && r.normal.from.every((x, i) => x === input[i])) return r.normal.services;
    return normalizeState(this.state).services;
  }

  /** While the reads of the stats for /metrics keep failing: what and since when (forward/metrics.ts readProblem). */
  statsProblem(): string | undefined {
    return this.metrics?.readProblem();
  }

  /** Which mechanism serves direct server return now (undefined: no DSR port is forwarded). */
  get dsr(): DsrEngineState | undefined {
    return this.dsrState;
  }

  /** The script last applied (for `lb-agent status --verbose` and tests). */
  get script(): string | undefined {
    return this.plan?.script;
  }
}

/** Carried totals survive only for flows still in the state (a removed backend's series goes away). */
function keepFlows(totals: Map<string, FlowTotals>, state: ForwardState): Map<string, FlowTotals> {
  const keep = new Set<string>();
  for (const s of normalizeState(state).services) {
    for (const { spec } of s.ports) for (const b of s.all) keep.add(flowId(s.key, spec, b.address));
  }
  for (const id of [...totals.keys()]) if (!keep.has(id)) totals.delete(id);
  return totals;
}
