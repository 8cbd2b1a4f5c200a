// Reload by a pure plan (docs/design.md "The reconciler and reloads"): from the running and
// the new desired state, the steps a reload takes, or the reasons it is
// refused. No I/O: the daemon carries the steps out, one reload at a time.
//
// Every section of the file either takes effect at reload or refuses the
// whole reload with its reason; nothing is reported as applied that was not.
// What cannot change without a restart (the state directory, the control
// socket, the parent NIC, the data path kind, VRRP's timing and election)
// refuses; the tracks that lower a network's VRRP priority are handed to
// the running routers (tracksChanged); a section that has no effect in the running mode (proxy settings
// on the kernel path, failover settings with failover.mode none) is applied
// as the new config and reported as such.
import { isDeepStrictEqual } from 'node:util';
import type { Desired, ServiceSpec } from '../config/types';
import type { ConfigError } from '../config/load';
import { diffConfigs, type SameSpec } from '../config/diff';
import { networksOf } from '../config/networks';
import { proxyNeededReason, servicesNeedingProxy } from '../forward/dataplane';

export interface RunningView {
  readonly config: Desired;
  /** The data path this process runs (what `dataplane:` resolved to at start). */
  readonly dataplane: 'kernel' | 'proxy';
  /** Why direct server return cannot run here (forward/dataplane.ts dsrUnavailable); undefined when it can or was not asked. */
  readonly dsrUnavailable?: string | undefined;
  /** How two services' specs are compared (config/diff.ts SpecFingerprints); a deep comparison by default. */
  readonly same?: SameSpec;
}

export type ReloadStep =
  /** New pools for the pool manager (before any service that may need them starts). */
  | { readonly op: 'pools' }
  /** New arp: / dhcp: timings for every running source and the DHCP start limiter. */
  | { readonly op: 'source-settings' }
  /** New proxy: settings for the userspace data path. */
  | { readonly op: 'proxy-settings' }
  /** New `backend:` VIPs: put the new ones on lo, take the old ones off (net/dsr-backend.ts). */
  | { readonly op: 'backend-vips' }
  /** New tracks (failover.track, networks.<name>.failover.track) for the running routers: priorities recomputed, nothing restarted. */
  | { readonly op: 'tracks' }
  /** Move the metrics endpoint ("" turns it off). */
  | { readonly op: 'metrics-listen'; readonly listen: string }
  /** A service left the config: withdraw its VIP and release its lease or claim. */
  | { readonly op: 'remove'; readonly key: string; readonly spec: ServiceSpec }
  /** The service's address changes: the old source stops (releasing when asked) and a new one starts. */
  | { readonly op: 'restart-source'; readonly key: string; readonly spec: ServiceSpec; readonly release: boolean; readonly why: string }
  /** Ports, backends or health checks changed: same source, same VIP, new spec. */
  | { readonly op: 'update'; readonly key: string; readonly spec: ServiceSpec; readonly fields: readonly string[] }
  | { readonly op: 'add'; readonly spec: ServiceSpec };

export interface ReloadSummary {
  readonly added: readonly string[];
  readonly removed: readonly string[];
  readonly changed: readonly string[];
  readonly unchanged: number;
  /** Top-level sections that changed and take effect now. */
  readonly sections: readonly string[];
  /** Changed sections that are accepted but have no effect in the running mode, with why. */
  readonly idle: readonly { readonly section: string; readonly why: string }[];
}

export type ReloadPlan =
  | { readonly ok: true; readonly steps: readonly ReloadStep[]; readonly summary: ReloadSummary }
  | { readonly ok: false; readonly errors: readonly ConfigError[] };

const restartNeeded = (what: string, from: unknown, to: unknown): string =>
  `changed from ${JSON.stringify(from)} to ${JSON.stringify(to)}: ${what} this needs a restart (systemctl restart lb-agent), not a reload; the running config is kept`;

/** A failover section less its tracks: what the running routers were made with. */
function untracked<T extends { readonly track?: unknown }>(f: T): Omit<T, 'track'> {
  const { track: _track, ...rest } = f;
  return rest;
}

/**
 * Whether any network's tracks differ (failover.track is the default
 * network's): a reload hands them to the running routers with no restart.
 */
export function tracksChanged(old: Desired, next: Desired): boolean {
  const of = (c: Desired): [string, unknown][] => networksOf(c).map((n) => [n.name, n.failover.track]);
  return !isDeepStrictEqual(of(old), of(next));
}

/** Why a reload may not replace the running config; empty when it may. */
export function refusals(running: RunningView, next: Desired): ConfigError[] {
  const old = running.config;
  const errors: ConfigError[] = [];
  const oldBy = new Map(old.services.map((x) => [x.key, x]));
  next.services.forEach((s, i) => {
    const o = oldBy.get(s.key);
    if (o && o.ipam !== s.ipam) {
      errors.push({ path: `services[${i}].ipam`, message: `service ${s.key} was created with ${o.ipam} IPAM and cannot change to ${s.ipam}; create a new service instead` });
    }
  });
  if (running.dsrUnavailable !== undefined) {
    next.services.forEach((s, i) => {
      if (s.sourceIP === 'preserve') errors.push({ path: `services[${i}].sourceIP`, message: `preserve: ${running.dsrUnavailable}; use sourceIP: snat` });
    });
  }
  if (old.stateDir !== next.stateDir) errors.push({ path: 'stateDir', message: restartNeeded('the leases, claims and instance lock live there;', old.stateDir, next.stateDir) });
  if (old.control.socket !== next.control.socket) errors.push({ path: 'control.socket', message: restartNeeded('`lb-agent status` and reload talk to it;', old.control.socket, next.control.socket) });
  if (old.node.interface !== next.node.interface) errors.push({ path: 'node.interface', message: restartNeeded('every macvlan and pool VIP hangs off it;', old.node.interface ?? '(default route)', next.node.interface ?? '(default route)') });
  // A network's NIC (and its virtual routers) is found at start; its pools change by reload.
  const nets = (c: Desired): Map<string, unknown> => new Map((c.networks ?? []).map((n) => [n.name, { interface: n.interface, failover: untracked(n.failover) }]));
  const [was, now] = [nets(old), nets(next)];
  for (const name of new Set([...was.keys(), ...now.keys()])) {
    if (!isDeepStrictEqual(was.get(name), now.get(name))) {
      errors.push({ path: `networks.${name}`, message: restartNeeded('the network\'s NIC is found, and its virtual routers start, with the process;', was.get(name) ?? '(no such network)', now.get(name) ?? '(no such network)') });
    }
  }
  if (JSON.stringify(old.kernel) !== JSON.stringify(next.kernel)) {
    errors.push({ path: 'kernel', message: restartNeeded('the kernel path\'s engine and its flow maps are set up at start;', JSON.stringify(old.kernel), JSON.stringify(next.kernel)) });
  }
  const kind = next.dataplane === 'auto' ? running.dataplane : next.dataplane;
  if (kind !== running.dataplane) {
    errors.push({ path: 'dataplane', message: restartNeeded(`the ${running.dataplane} data path is running and would become ${kind};`, old.dataplane, next.dataplane) });
  }
  // a service asking for the PROXY protocol needs the proxy path, which `auto` picks only at start.
  const needed = running.dataplane === 'kernel' && kind === 'kernel' ? servicesNeedingProxy(next.services) : [];
  if (needed.length > 0) {
    const i = next.services.findIndex((s) => s.key === needed[0]);
    errors.push({ path: `services[${i}].proxyProtocol`, message: `${proxyNeededReason(needed)}, and the kernel data path is running (dataplane auto chose it at start); it needs a restart (systemctl restart lb-agent) to run the proxy path, not a reload; the running config is kept` });
  }
  // the worker threads and their listening sockets are set up at start.
  if (running.dataplane === 'proxy' && old.proxy.workers !== next.proxy.workers) {
    errors.push({ path: 'proxy.workers', message: restartNeeded('the proxy\'s worker threads and their listening sockets are made at start;', old.proxy.workers ?? 'one per CPU', next.proxy.workers ?? 'one per CPU') });
  }
  const vrrp = old.failover.mode === 'vrrp' || next.failover.mode === 'vrrp';
  if (old.failover.mode !== next.failover.mode) {
    errors.push({ path: 'failover.mode', message: restartNeeded('the VRRP election starts or ends with the process;', old.failover.mode, next.failover.mode) });
  } else if (vrrp && !isDeepStrictEqual(untracked(old.failover), untracked(next.failover))) {
    errors.push({ path: 'failover', message: restartNeeded('VRRP routers keep their timers and election state for the life of the process (only failover.track changes by reload);', untracked(old.failover), untracked(next.failover)) });
  }
  if (vrrp && old.node.priority !== next.node.priority) {
    errors.push({ path: 'node.priority', message: restartNeeded('the VRRP priority is advertised by the running routers;', old.node.priority, next.node.priority) });
  }
  if (vrrp) {
    next.services.forEach((s, i) => {
      const o = old.services.find((x) => x.key === s.key);
      if (o && (o.vrid !== s.vrid || o.priority !== s.priority)) {
        errors.push({ path: `services[${i}]`, message: `service ${s.key}: vrid or priority ${restartNeeded('its virtual router runs with them;', { vrid: o.vrid, priority: o.priority }, { vrid: s.vrid, priority: s.priority })}` });
      }
    });
  }
  return errors;
}

/** What moves a service's VIP: the source must start over. */
function addressChange(o: ServiceSpec, n: ServiceSpec): string | undefined {
  if (o.ipam !== n.ipam) return 'ipam';
  if (o.primaryService !== n.primaryService) return 'primaryService';
  if (o.loadBalancerIP !== n.loadBalancerIP) return 'loadBalancerIP';
  if (o.network !== n.network) return 'network';
  return undefined;
}

function changedFields(o: ServiceSpec, n: ServiceSpec): string[] {
  const keys = new Set([...Object.keys(o), ...Object.keys(n)]) as Set<keyof ServiceSpec>;
  return [...keys].filter((k) => !isDeepStrictEqual(o[k], n[k])).sort();
}

/** The plan of a reload from `running` to `next`. Pure. */
export function planReload(running: RunningView, next: Desired): ReloadPlan {
  const errors = refusals(running, next);
  if (errors.length > 0) return { ok: false, errors };
  const old = running.config;
  const d = diffConfigs(old, next, running.same);
  const steps: ReloadStep[] = [];
  const sections: string[] = [];
  const idle: { section: string; why: string }[] = [];
  for (const g of d.globals) {
    switch (g) {
      case 'pools':
      case 'networks':
        // Only a network's pools or tracks get here (its NIC and routers are
        // refused above); the tracks are stepped below.
        if (!steps.some((s) => s.op === 'pools') && (g === 'pools' || !isDeepStrictEqual(networksOf(old).map((n) => n.pools), networksOf(next).map((n) => n.pools)))) steps.push({ op: 'pools' });
        sections.push(g);
        break;
      case 'arp':
      case 'dhcp':
        if (!steps.some((s) => s.op === 'source-settings')) steps.push({ op: 'source-settings' });
        sections.push(g);
        break;
      case 'proxy':
        if (running.dataplane === 'proxy') { steps.push({ op: 'proxy-settings' }); sections.push(g); } else idle.push({ section: g, why: 'the kernel data path is running; the proxy settings apply if it ever runs' });
        break;
      case 'metrics': steps.push({ op: 'metrics-listen', listen: next.metrics.listen }); sections.push(g); break;
      case 'failover':
        // Only the tracks get here under VRRP (the rest is refused above); they are stepped below.
        if (next.failover.mode === 'vrrp') sections.push(g);
        else idle.push({ section: g, why: 'failover.mode is none' });
        break;
      case 'node':
        // interface is refused above; name is status only; zone, region and
        // labelsFile take effect at once (the daemon re-reads the labels at
        // every reload and re-selects each service's backends); priority
        // (under none) has nothing to drive.
        if (old.node.name !== next.node.name || old.node.zone !== next.node.zone || old.node.region !== next.node.region || old.node.labelsFile !== next.node.labelsFile) sections.push(g);
        else idle.push({ section: g, why: 'node.priority matters only with failover.mode vrrp' });
        break;
      case 'backend': steps.push({ op: 'backend-vips' }); sections.push(g); break;
      case 'dataplane': sections.push(g); break; // same kind as running (refused otherwise)
      default: sections.push(g);
    }
  }
  // Removals: secondaries before their primary (a primary never goes while one shares it).
  const removed = [...d.removed].sort((a, b) => Number(b.primaryService !== undefined) - Number(a.primaryService !== undefined));
  for (const s of removed) steps.push({ op: 'remove', key: s.key, spec: s });
  const changed: string[] = [];
  for (const [o, n] of d.changed) {
    changed.push(n.key);
    const why = addressChange(o, n);
    if (why) steps.push({ op: 'restart-source', key: n.key, spec: n, release: o.loadBalancerIP !== n.loadBalancerIP || o.network !== n.network, why });
    else steps.push({ op: 'update', key: n.key, spec: n, fields: changedFields(o, n) });
  }
  // Primaries before the secondaries that share their VIP.
  const added = [...d.added].sort((a, b) => Number(a.primaryService !== undefined) - Number(b.primaryService !== undefined));
  for (const s of added) steps.push({ op: 'add', spec: s });
  // Last: a tracked service the reload adds exists by then.
  if (next.failover.mode === 'vrrp' && tracksChanged(old, next)) steps.push({ op: 'tracks' });
  return {
    ok: true,
    steps,
    summary: { added: d.added.map((s) => s.key), removed: d.removed.map((s) => s.key), changed, unchanged: d.unchanged.length, sections, idle },
  };
}

/** The one-line verdict of an applied plan, for logs, status and `lb-agent reload`. */
export function describeSummary(s: ReloadSummary): string {
  const parts = [`reloaded: ${s.added.length} added, ${s.removed.length} removed, ${s.changed.length} changed, ${s.unchanged} unchanged`];
  if (s.sections.length > 0) parts.push(`applied sections: ${s.sections.join(', ')}`);
  if (s.idle.length > 0) parts.push(`accepted without effect: ${s.idle.map((i) => `${i.section} (${i.why})`).join(', ')}`);
  return parts.join('; ');
}
