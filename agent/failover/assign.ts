// VRID assignment (pure): which virtual router carries each service's VIP.
// One advert lists at most 255 addresses (RFC 5798 §5.2.5), so services that
// do not pin a VRID fill the base VRID and spill over to the next free ones.
// The daemon calls this on every (re)load; it touches nothing.

/** What assignVrids needs to know of a service (ServiceSpec fits). */
export interface VridCandidate {
  /** "namespace/name". */
  readonly key: string;
  /** A VRID the user pinned for this service, if any. */
  readonly vrid?: number | undefined;
  /** "namespace/name" of the service whose VIP this one shares (Share IP). */
  readonly primaryService?: string | undefined;
}

export interface VridAssignment {
  /** Service key to VRID, for every service that could be placed. */
  readonly vrids: ReadonlyMap<string, number>;
  /** VRID to the number of VIPs it carries (primaries only: a shared VIP is one address). */
  readonly load: ReadonlyMap<number, number>;
  /** Keys that found no VRID with room: all 255 are full, or a pinned VRID holds more than 255 VIPs. */
  readonly overflow: readonly string[];
}

/**
 * Assign VRIDs. Rules, in order:
 * - a service sharing another's IP rides its primary's VRID (one address,
 *   one owner), whatever it pinned itself;
 * - a pinned VRID is kept (the user chose which VMs' priorities apply);
 * - the others take baseVrid, then the next VRIDs up (wrapping after 255)
 *   that nobody pinned (pinning the base VRID itself changes nothing), 255 VIPs each, in the order given (config order), so
 *   adding a service at the end never moves an existing VIP.
 */
export function assignVrids(services: readonly VridCandidate[], baseVrid: number, maxPerVrid = 255): VridAssignment {
  const vrids = new Map<string, number>();
  const load = new Map<number, number>();
  const overflow: string[] = [];
  const byKey = new Map(services.map((s) => [s.key, s] as const));
  const isPrimary = (s: VridCandidate): boolean => s.primaryService === undefined || !byKey.has(s.primaryService) || s.primaryService === s.key;
  const validVrid = (v: number | undefined): v is number => v !== undefined && Number.isInteger(v) && v >= 1 && v <= 255;
  const pinned = new Set<number>();
  for (const s of services) if (isPrimary(s) && validVrid(s.vrid)) pinned.add(s.vrid);
  // Pinning the base VRID is the same as not pinning: those share it.
  pinned.delete(baseVrid);
  const add = (key: string, vrid: number): void => {
    vrids.set(key, vrid);
    load.set(vrid, (load.get(vrid) ?? 0) + 1);
  };

  for (const s of services) {
    if (!isPrimary(s) || !validVrid(s.vrid)) continue;
    if ((load.get(s.vrid) ?? 0) >= maxPerVrid) overflow.push(s.key);
    else add(s.key, s.vrid);
  }

  let next = validVrid(baseVrid) ? baseVrid : 1;
  let tried = 0;
  for (const s of services) {
    if (!isPrimary(s) || validVrid(s.vrid)) continue;
    // Move on past pinned and full VRIDs; give up after one full round.
    while (tried < 255 && (pinned.has(next) || (load.get(next) ?? 0) >= maxPerVrid)) {
      next = next === 255 ? 1 : next + 1;
      tried++;
    }
    if (tried >= 255) overflow.push(s.key);
    else add(s.key, next);
  }

  for (const s of services) {
    if (isPrimary(s)) continue;
    const v = vrids.get(s.primaryService!);
    if (v === undefined) overflow.push(s.key);
    else vrids.set(s.key, v); // same address: not counted again
  }
  return { vrids, load, overflow };
}
