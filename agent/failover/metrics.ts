// failover/ metrics: the lbagent_vrrp_* series on the Registry the daemon
// passes in (never the global one). Asking twice for one registry returns the
// same collectors (looked up by name in the registry itself, so no module
// state), which lets every VirtualRouter of the daemon share them.
// Labels are bounded: vrid (1-255), family (IPv4, IPv6: one instance per
// family, RFC 5798 §5.1, so VRID 51 of IPv4 and of IPv6 are two routers),
// state (3), to (3), reason (DROP_REASONS and "not-a-peer", peers.ts),
// master (one current address per vrid and family; the previous one is removed),
// track (the keys of failover.track: "interface eth1", "service ns/name"),
// network (a named network's tracks only: its networks.<name>.failover.track).
import { Counter, Gauge, Registry } from '../metrics/prom';

export interface VrrpMetrics {
  /** 1 for the state the router is in, 0 for the others. */
  readonly state: Gauge<'vrid' | 'family' | 'state'>;
  readonly transitions: Counter<'vrid' | 'family' | 'to'>;
  readonly advertsSent: Counter<'vrid' | 'family'>;
  readonly advertsReceived: Counter<'vrid' | 'family'>;
  readonly dropped: Counter<'reason' | 'family'>;
  /** 1 on the label set of the current Master's address. */
  readonly masterInfo: Gauge<'vrid' | 'family' | 'master'>;
  readonly lastTransition: Gauge<'vrid' | 'family'>;
  readonly splitBrain: Counter<'vrid' | 'family'>;
  /** The priority in use (failover/tracking.ts); 0 in fault. */
  readonly priority: Gauge<'vrid' | 'family'>;
  /** The configured priority it comes from. */
  readonly basePriority: Gauge<'vrid' | 'family'>;
  readonly priorityChanges: Counter<'vrid' | 'family'>;
  /** 1 while a track counts as failing. */
  readonly trackFailing: Gauge<'track' | 'network'>;
}

function getOrCreate<T>(registry: Registry, name: string, make: () => T): T {
  return (registry.getSingleMetric(name) as T | undefined) ?? make();
}

export function vrrpMetrics(registry: Registry): VrrpMetrics {
  const registers = [registry];
  return {
    state: getOrCreate(registry, 'lbagent_vrrp_state', () => new Gauge<'vrid' | 'family' | 'state'>({
      name: 'lbagent_vrrp_state',
      help: 'VRRP state of each virtual router of this node: 1 on the current state (initialize, backup, master)',
      labelNames: ['vrid', 'family', 'state'],
      registers,
    })),
    transitions: getOrCreate(registry, 'lbagent_vrrp_transitions_total', () => new Counter<'vrid' | 'family' | 'to'>({
      name: 'lbagent_vrrp_transitions_total',
      help: 'VRRP state transitions, by the state entered',
      labelNames: ['vrid', 'family', 'to'],
      registers,
    })),
    advertsSent: getOrCreate(registry, 'lbagent_vrrp_adverts_sent_total', () => new Counter<'vrid' | 'family'>({
      name: 'lbagent_vrrp_adverts_sent_total',
      help: 'VRRP advertisements sent (as Master, and the priority-0 one on shutdown)',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    advertsReceived: getOrCreate(registry, 'lbagent_vrrp_adverts_received_total', () => new Counter<'vrid' | 'family'>({
      name: 'lbagent_vrrp_adverts_received_total',
      help: 'Valid VRRP advertisements received from other routers',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    dropped: getOrCreate(registry, 'lbagent_vrrp_dropped_total', () => new Counter<'reason' | 'family'>({
      name: 'lbagent_vrrp_dropped_total',
      help: 'VRRP packets refused by the RFC 5798 §7.1 receive checks, or from outside failover.peers (not-a-peer), by reason',
      labelNames: ['reason', 'family'],
      registers,
    })),
    masterInfo: getOrCreate(registry, 'lbagent_vrrp_master_info', () => new Gauge<'vrid' | 'family' | 'master'>({
      name: 'lbagent_vrrp_master_info',
      help: 'The primary address of the current Master of each virtual router, as known by this node (value 1)',
      labelNames: ['vrid', 'family', 'master'],
      registers,
    })),
    lastTransition: getOrCreate(registry, 'lbagent_vrrp_last_transition_timestamp_seconds', () => new Gauge<'vrid' | 'family'>({
      name: 'lbagent_vrrp_last_transition_timestamp_seconds',
      help: 'Wall-clock time of the last VRRP state transition of each virtual router',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    splitBrain: getOrCreate(registry, 'lbagent_vrrp_split_brain_total', () => new Counter<'vrid' | 'family'>({
      name: 'lbagent_vrrp_split_brain_total',
      help: 'Adverts from another Master received while Master (two Masters at once); resolved by keeping Master (the other had lower precedence) or yielding',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    priority: getOrCreate(registry, 'lbagent_vrrp_priority', () => new Gauge<'vrid' | 'family'>({
      name: 'lbagent_vrrp_priority',
      help: 'The VRRP priority each virtual router of this node advertises: the configured one less the weights of failing tracks (failover.track); 0 in fault',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    basePriority: getOrCreate(registry, 'lbagent_vrrp_base_priority', () => new Gauge<'vrid' | 'family'>({
      name: 'lbagent_vrrp_base_priority',
      help: 'The configured VRRP priority of each virtual router of this node (node.priority or the service\'s priority)',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    priorityChanges: getOrCreate(registry, 'lbagent_vrrp_priority_changes_total', () => new Counter<'vrid' | 'family'>({
      name: 'lbagent_vrrp_priority_changes_total',
      help: 'Changes of the priority in use by tracking (failover.track), fault and its end included',
      labelNames: ['vrid', 'family'],
      registers,
    })),
    trackFailing: getOrCreate(registry, 'lbagent_vrrp_track_failing', () => new Gauge<'track' | 'network'>({
      name: 'lbagent_vrrp_track_failing',
      help: 'Whether a tracked interface or service counts as failing now (1) or not (0), after its failAfter/recoverAfter delay; network: the named network whose virtual routers it lowers (networks.<name>.failover.track), absent for the default network\'s (failover.track)',
      labelNames: ['track', 'network'],
      registers,
    })),
  };
}
