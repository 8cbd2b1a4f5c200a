// Kubernetes' dual-stack words on a service (spec.ipFamilies,
// spec.ipFamilyPolicy, one loadBalancerIP per family) turned into the
// families the agent serves, with the apiserver's defaulting and validation
// (pkg/registry/core/service/storage/alloc.go initIPFamilyFields) and the
// agent's own limits: which family has a pool; direct server return serves
// IPv4 only. Pure; load.ts calls it once per service
// and reports what it returns with the field path.
import type { Family } from '../address';
import { parseAddress } from '../address';
import type { IpamMode, IpFamilyPolicy, Pool, ServiceSpec } from './types';
import { describePool, poolContains, poolLookupOrder, selectPool } from './pools';

type Seg = string | number;

/** What a service says about families, as written. */
export interface FamilyAsk {
  readonly namespace: string;
  readonly ipam: IpamMode;
  readonly ipFamilies?: readonly Family[] | undefined;
  readonly ipFamilyPolicy?: IpFamilyPolicy | undefined;
  readonly loadBalancerIP?: string | undefined;
  readonly loadBalancerIPs?: readonly string[] | undefined;
  /** Backend addresses with the path of each. */
  readonly backends: readonly { readonly family: Family; readonly segs: readonly Seg[]; readonly address: string }[];
}

export interface FamilyContext {
  readonly pools: readonly Pool[];
}

export interface FamilyPlan {
  readonly policy: IpFamilyPolicy;
  /** The families asked for after defaulting, primary first. */
  readonly requested: readonly Family[];
  /** The families served, primary first: requested less what PreferDualStack let go. */
  readonly served: readonly Family[];
  /** The address asked for in each family. */
  readonly addresses: ReadonlyMap<Family, string>;
  /** Why a requested family is not served. */
  readonly notes: readonly string[];
}

export interface FamilyProblem { readonly segs: readonly Seg[]; readonly message: string }

const other = (f: Family): Family => (f === 'IPv4' ? 'IPv6' : 'IPv4');

/** The key of one family's VIP of a service: IPv4 keeps "namespace/name", IPv6 is "namespace/name@IPv6". */
export function familyServiceKey(key: string, family: Family): string {
  return family === 'IPv4' ? key : `${key}@${family}`;
}

/**
 * The key a DHCP service's macvlan, MAC and DUID derive from, given a family
 * service's key (familyServiceKey): the Kubernetes service's
 * "namespace/name", whichever family. Both families of a
 * dual-stack DHCP service ride one macvlan with one stable MAC, as a
 * dual-stack host does: the DHCPv4 lease and the DHCPv6 one are the same
 * client's.
 */
export function linkKeyOf(familyKey: string): string {
  return familyKey.endsWith('@IPv6') ? familyKey.slice(0, -'@IPv6'.length) : familyKey;
}

/**
 * Under VRRP, the IPv4 service whose virtual router an IPv6 VIP follows:
 * the IPv6 half of a dual-stack DHCP service, whose DHCPv6 lease rides the
 * macvlan the DHCPv4 source owns (daemon/wiring.ts sharedLink), so both
 * VIPs must be on one VM (failover/dual.ts). undefined for every other
 * service.
 */
export function tiedToIpv4(spec: Pick<ServiceSpec, 'key' | 'family' | 'ipam' | 'primaryService' | 'ipFamilies'>): string | undefined {
  if (spec.family !== 'IPv6' || spec.ipam !== 'dhcp' || spec.primaryService !== undefined) return undefined;
  return spec.ipFamilies?.includes('IPv4') ? linkKeyOf(spec.key) : undefined;
}

/** Why the agent cannot serve a family for this service, or undefined when it can. */
function unservable(f: Family, ask: FamilyAsk, ctx: FamilyContext): string | undefined {
  if (ask.ipam === 'pool' && !selectPool(ctx.pools, ask.namespace, f)) {
    return `no pool lists ${f} addresses for namespace ${ask.namespace} (looked for ${poolLookupOrder(ask.namespace).join(', ')} under pools)`;
  }
  return undefined;
}

/**
 * The families of one primary (or standalone) service. Kubernetes'
 * semantics: no ipFamilyPolicy is SingleStack, except that two ipFamilies and
 * no policy mean RequireDualStack; SingleStack takes one family, IPv4 unless
 * ipFamilies says otherwise; the dual-stack policies add the other family
 * after the one(s) listed; RequireDualStack fails unless both are served;
 * PreferDualStack serves the primary family and the second when it can.
 */
export function planFamilies(ask: FamilyAsk, ctx: FamilyContext): { plan: FamilyPlan; problems: FamilyProblem[] } {
  const problems: FamilyProblem[] = [];
  const listed = ask.ipFamilies;
  const policy: IpFamilyPolicy = ask.ipFamilyPolicy ?? (listed?.length === 2 ? 'RequireDualStack' : 'SingleStack');
  if (policy === 'SingleStack' && listed !== undefined && listed.length > 1) {
    problems.push({ segs: ['ipFamilies'], message: `[${listed.join(', ')}] lists two families, but ipFamilyPolicy is SingleStack (one family); set ipFamilyPolicy: PreferDualStack or RequireDualStack, or list one family` });
  }
  const primary: Family = listed?.[0] ?? 'IPv4';
  const requested: Family[] = policy === 'SingleStack' ? [primary] : [primary, listed?.[1] ?? other(primary)];

  // The addresses asked for, one per family.
  const addresses = new Map<Family, string>();
  if (ask.loadBalancerIP && ask.loadBalancerIPs !== undefined) {
    problems.push({ segs: ['loadBalancerIPs'], message: 'is set together with loadBalancerIP; use one of them (loadBalancerIPs takes one address per family)' });
  }
  const asked: { address: string; segs: Seg[] }[] = ask.loadBalancerIPs !== undefined
    ? ask.loadBalancerIPs.map((address, i) => ({ address, segs: ['loadBalancerIPs', i] }))
    : ask.loadBalancerIP ? [{ address: ask.loadBalancerIP, segs: ['loadBalancerIP'] }] : [];
  for (const { address, segs } of asked) {
    const a = parseAddress(address);
    if (!a) continue; // the schema reported it
    if (addresses.has(a.family)) {
      problems.push({ segs, message: `${address} is a second ${a.family} address (also ${addresses.get(a.family)!}); a service takes one address per family` });
      continue;
    }
    if (!requested.includes(a.family)) {
      problems.push({ segs, message: `${address} is ${a.family}, but the service asks for ${requested.join(' and ')} only (ipFamilyPolicy ${policy}${listed ? `, ipFamilies [${listed.join(', ')}]` : ', no ipFamilies: IPv4'}); set ipFamilies to include ${a.family}` });
      continue;
    }
    addresses.set(a.family, address);
    const pool = ask.ipam === 'pool' ? selectPool(ctx.pools, ask.namespace, a.family) : undefined;
    if (pool && !poolContains(pool, a)) {
      problems.push({ segs, message: `${address} is not in pool ${describePool(pool, a.family)}, the ${a.family} pool of namespace ${ask.namespace}` });
    }
  }

  const served: Family[] = [];
  const notes: string[] = [];
  requested.forEach((f, i) => {
    const why = unservable(f, ask, ctx);
    if (why === undefined) { served.push(f); return; }
    const optional = policy === 'PreferDualStack' && i > 0;
    if (optional) { notes.push(`${f} not served (PreferDualStack): ${why}`); return; }
    const field: Seg[] = listed !== undefined ? ['ipFamilies'] : ask.ipFamilyPolicy !== undefined ? ['ipFamilyPolicy'] : ['ipam'];
    const because = policy === 'RequireDualStack' ? 'RequireDualStack needs both families' : policy === 'SingleStack' ? `the service's one family is ${f}` : `${f} is the primary family`;
    problems.push({ segs: field, message: `${because}, and ${why}` });
  });

  for (const b of ask.backends) {
    if (!requested.includes(b.family)) {
      problems.push({ segs: b.segs, message: `${JSON.stringify(b.address)} is ${b.family}, but the service asks for ${requested.join(' and ')} only; each VIP forwards to backends of its own family, so this one would never get a connection (set ipFamilies and ipFamilyPolicy to serve ${b.family})` });
    }
  }
  return { plan: { policy, requested, served, addresses, notes }, problems };
}
