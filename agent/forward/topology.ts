// forward/ layer: zone-aware balancing, PURE. From a service's
// topology policy, this node's zone and the backends the health checker
// calls healthy, the set new connections may go to and the reason. The
// daemon applies it where it builds each service's forwarding state, so both
// data paths (nftables, proxy) balance over the chosen set and the weights
// keep their meaning inside it.
//
//   any          every healthy backend, whatever its zone (zones ignored);
//   prefer-zone  the healthy backends in the node's zone; only when none of
//                them is healthy (or the node's zone is unknown), all healthy
//                backends; back to the zone as soon as one there is healthy;
//   zone-only    the healthy backends in the node's zone, or none: new
//                connections are refused rather than sent to another zone.
//
// Harvester syncs topology.kubernetes.io/zone from hosts to guest nodes so
// workloads spread across failure domains; sending every connection across
// zones would undo half of it (cross-zone latency and cost, a zone's outage
// felt everywhere). A backend without a zone is in no zone: never "local".
import type { BackendSpec, TopologyPolicy } from '../config/types';

/** Which backends are in use: the node's zone, every healthy one, or none. */
export type TopologySet = 'zone' | 'all' | 'none';

/** Why: a bounded label value (lbagent_service_topology_info) as well as status. */
export type TopologyReason =
  | 'policy-any'            // topology any: zones are not considered
  | 'zone-healthy'          // prefer-zone / zone-only: a backend in the node's zone is healthy
  | 'zone-unhealthy-spill'  // prefer-zone: none in the node's zone is healthy, the others take the traffic
  | 'zone-unknown-spill'    // prefer-zone: the node's zone is unknown, every healthy backend is used
  | 'zone-unhealthy-refuse' // zone-only: none in the node's zone is healthy, connections are refused
  | 'zone-unknown-refuse'   // zone-only: the node's zone is unknown, connections are refused
  | 'no-healthy-backend';   // no backend is healthy at all

export const TOPOLOGY_REASONS: readonly TopologyReason[] = [
  'policy-any', 'zone-healthy', 'zone-unhealthy-spill', 'zone-unknown-spill', 'zone-unhealthy-refuse', 'zone-unknown-refuse', 'no-healthy-backend',
];

export interface TopologySelection {
  readonly set: TopologySet;
  readonly reason: TopologyReason;
  /** The backends new connections may go to (a subset of the healthy ones, order kept). */
  readonly backends: readonly BackendSpec[];
  /** One sentence for status and logs. */
  readonly detail: string;
}

/** The set in use for one service. Pure and total. */
export function selectBackends(policy: TopologyPolicy, nodeZone: string | undefined, healthy: readonly BackendSpec[]): TopologySelection {
  const none = (reason: TopologyReason, detail: string): TopologySelection => ({ set: 'none', reason, backends: [], detail });
  if (policy === 'any') {
    return healthy.length > 0
      ? { set: 'all', reason: 'policy-any', backends: healthy, detail: `topology any: all ${healthy.length} healthy backend(s), zones not considered` }
      : none('no-healthy-backend', 'no healthy backend');
  }
  if (nodeZone === undefined) {
    if (policy === 'zone-only') return none('zone-unknown-refuse', 'zone-only: this node\'s zone is unknown (node.zone, or topology.kubernetes.io/zone in the labels file), so no backend is in it: new connections are refused');
    return healthy.length > 0
      ? { set: 'all', reason: 'zone-unknown-spill', backends: healthy, detail: `prefer-zone: this node's zone is unknown; using all ${healthy.length} healthy backend(s)` }
      : none('no-healthy-backend', 'no healthy backend');
  }
  const local = healthy.filter((b) => b.zone === nodeZone);
  if (local.length > 0) {
    return { set: 'zone', reason: 'zone-healthy', backends: local, detail: `${policy}: ${local.length} healthy backend(s) in zone ${nodeZone}` };
  }
  if (policy === 'zone-only') return none('zone-unhealthy-refuse', `zone-only: no healthy backend in zone ${nodeZone}: new connections are refused`);
  return healthy.length > 0
    ? { set: 'all', reason: 'zone-unhealthy-spill', backends: healthy, detail: `prefer-zone: no healthy backend in zone ${nodeZone}; spilling to ${healthy.length} healthy backend(s) in other zones` }
    : none('no-healthy-backend', 'no healthy backend');
}
