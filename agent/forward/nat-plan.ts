// forward/ layer: what the eBPF full-NAT engine (native/bpf/nat.c) is to
// hold for a forwarding state, PURE: the entries of its per-plan maps
// (services, slots, members) and the counters' meaning. The driver
// (net/ebpf/nat-attach.ts) writes them into the maps of a freshly loaded
// program before it swaps that program in.
//
// The engine takes the kernel path's `sourceIP: snat` ports of IPv4 VIPs;
// the nft table behind it (nft.ts) keeps everything else (IPv6, direct
// server return) and whatever the program passes on.
//
// Placement: the same slot table and hash as the nft table's flow-hash
// placement (nft-dsr.ts flowHashSlots and flowHashPick: Maglev over every
// configured backend, the healthy ones filling it, nft's seeded jhash of the
// client's address and port), whatever the failover mode. So a flow lands
// where the nft table with VRRP puts it, and a VRRP peer running either
// engine picks it up mid-way on the same backend.
import { ipv4ToBytes } from '../address';
import type { PortSpec } from '../config/types';
import type { CLayout } from '../net/ebpf/nat-layout';
import { normalizeState, type ForwardState, type NormalizedService } from './dataplane';
import { dsrSeedValue, flowHashSlots } from './nft-dsr';

/** IPPROTO_TCP, IPPROTO_UDP. */
const IPPROTO = { TCP: 6, UDP: 17 } as const;

/** What one counter index of the engine counts. */
export interface NatCounterRef {
  readonly service: string;
  readonly port: PortSpec;
  readonly backend: string;
}

export interface NatEntry { readonly key: Buffer; readonly value: Buffer }

export interface NatPlan {
  /** lbn_svcs: (VIP, port, protocol) -> the port's slot range, seed and target port. */
  readonly services: readonly NatEntry[];
  /** lbn_slots, by key: slot -> backend and counter index. */
  readonly slots: readonly Buffer[];
  /** lbn_members: (port, configured backend) -> counter index, healthy. */
  readonly members: readonly NatEntry[];
  /** lbn_counters, by index. */
  readonly counters: readonly NatCounterRef[];
  /** The services the engine forwards, by key (for status). */
  readonly serviceKeys: readonly string[];
}

/** Does the engine take this service's ports? IPv4 VIP held, source NAT. */
export function natServes(svc: NormalizedService): boolean {
  return svc.vip !== undefined && !svc.vip.includes(':') && svc.sourceIP === 'snat' && svc.ports.length > 0;
}

function be16(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n);
  return b;
}

function addr(a: string): Buffer {
  const parts = a.split('.').map(Number);
  return ipv4ToBytes(((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0);
}

/** The plan of a forwarding state, in the canonical order of normalizeState (the same state always gives the same bytes). */
export function natPlan(state: ForwardState, layout: CLayout): NatPlan {
  const { services: all } = normalizeState(state);
  const services: NatEntry[] = [];
  const slots: Buffer[] = [];
  const members: NatEntry[] = [];
  const counters: NatCounterRef[] = [];
  const serviceKeys: string[] = [];
  for (const svc of all.filter(natServes)) {
    serviceKeys.push(svc.key);
    for (const { spec } of svc.ports) {
      const svcKey = { vip: addr(svc.vip!), port: be16(spec.port), proto: IPPROTO[spec.protocol] };
      const counterOf = new Map<string, number>();
      for (const b of svc.all) {
        counterOf.set(b.address, counters.length);
        counters.push({ service: svc.key, port: spec, backend: b.address });
      }
      const healthy = new Set(svc.healthy.map((b) => b.address));
      for (const b of svc.all) {
        members.push({
          key: layout.encode('lbn_member_key', { svc: svcKey, backend: addr(b.address) }),
          value: layout.encode('lbn_member', { counter: counterOf.get(b.address)!, healthy: healthy.has(b.address) ? 1 : 0 }),
        });
      }
      // One healthy backend: one slot (the hash has one answer).
      const table = healthy.size === 0 ? [] : healthy.size === 1 ? [svc.healthy[0]!] : flowHashSlots(svc);
      const base = slots.length;
      for (const b of table) slots.push(layout.encode('lbn_slot', { backend: addr(b.address), counter: counterOf.get(b.address)! }));
      services.push({
        key: layout.encode('lbn_svc_key', svcKey),
        value: layout.encode('lbn_svc', { base, slots: table.length, seed: dsrSeedValue(svc.key), target_port: be16(spec.targetPort) }),
      });
    }
  }
  return { services, slots, members, counters, serviceKeys };
}
