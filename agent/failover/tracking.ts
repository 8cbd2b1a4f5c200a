// Priority tracking (pure, no I/O, no timers): what this node's VRRP
// priority is from what it observes of its tracked interfaces and services
// (failover.track), and why. keepalived's track_interface and track_script
// are the model: a failing track with a weight lowers the priority by it, a
// failing track without one puts the virtual routers in fault (priority 0
// here: the Master resigns, RFC 5798 §6.4.3, and the router stays out of the
// election until the track recovers). Unlike keepalived a track has
// hysteresis of its own: an observation counts only once it has held for
// failAfter (or recoverAfter) seconds, so a backend flapping faster than
// that never moves the priority.
//
// Functions of (tracks, observation, now) returning new tracks; the driver
// (failover/tracker.ts) feeds observations and fires at nextChangeAt().

export type TrackKind = 'interface' | 'service';

export interface TrackDef {
  /** "interface eth1", "service default/web": unique, the label in metrics and status. */
  readonly key: string;
  readonly kind: TrackKind;
  /** The interface name or the service key. */
  readonly name: string;
  /** Lowers the priority by this much while failing; undefined: fault. */
  readonly weight: number | undefined;
  readonly failAfterMs: number;
  readonly recoverAfterMs: number;
}

export interface Track {
  readonly def: TrackDef;
  /** What the last observation said: failing or not. */
  readonly observed: boolean;
  /** Since when (ms) the observation has said so. */
  readonly observedSince: number;
  /** What counts for the priority: the observation once it has held long enough. */
  readonly failing: boolean;
  /** Since when (ms) `failing` has had its value. */
  readonly failingSince: number;
  /** The last observation in words ("no carrier", "0 of 2 backends healthy, 1 needed"). */
  readonly detail: string;
}

/** New tracks, none failing, observed as fine at `now` (the driver observes each at once). */
export function createTracks(defs: readonly TrackDef[], now: number): Track[] {
  return defs.map((def) => ({ def, observed: false, observedSince: now, failing: false, failingSince: now, detail: 'not observed yet' }));
}

/** A track's new observation. The time it has held is counted from its first one of a run. */
export function observe(tracks: readonly Track[], key: string, failing: boolean, detail: string, now: number): Track[] {
  return tracks.map((t) => {
    if (t.def.key !== key) return t;
    if (t.observed === failing) return t.detail === detail ? t : { ...t, detail };
    return { ...t, observed: failing, observedSince: now, detail };
  });
}

/** How long an observation that differs from `failing` must hold before it counts. */
function holdMs(t: Track): number {
  return t.observed ? t.def.failAfterMs : t.def.recoverAfterMs;
}

export interface Settled {
  readonly tracks: Track[];
  /** Tracks whose `failing` changed now. */
  readonly changed: Track[];
}

/** Let every observation that has held long enough count. */
export function settle(tracks: readonly Track[], now: number): Settled {
  const changed: Track[] = [];
  const out = tracks.map((t) => {
    if (t.observed === t.failing || now - t.observedSince < holdMs(t)) return t;
    const n = { ...t, failing: t.observed, failingSince: now };
    changed.push(n);
    return n;
  });
  return { tracks: changed.length > 0 ? out : [...tracks], changed };
}

/** When the next pending observation counts (ms), undefined when none is pending. */
export function nextChangeAt(tracks: readonly Track[]): number | undefined {
  let at: number | undefined;
  for (const t of tracks) {
    if (t.observed === t.failing) continue;
    const due = t.observedSince + holdMs(t);
    if (at === undefined || due < at) at = due;
  }
  return at;
}

export interface EffectivePriority {
  /** 1-254 in use; 0: fault (a failing track without a weight). */
  readonly priority: number;
  /** The configured priority it comes from. */
  readonly base: number;
  /** One line per failing track, in config order: "interface eth1: no carrier (-50)". */
  readonly reasons: string[];
}

/**
 * The priority in use: the base less the weight of each failing track,
 * never below 1 (keepalived's floor: 0 means resigning, and 255 is the
 * address owner's); 0 when a failing track has no weight (fault).
 */
export function effectivePriority(base: number, tracks: readonly Track[]): EffectivePriority {
  let priority = base;
  let fault = false;
  const reasons: string[] = [];
  for (const t of tracks) {
    if (!t.failing) continue;
    if (t.def.weight === undefined) {
      fault = true;
      reasons.push(`${t.def.key}: ${t.detail} (fault)`);
    } else {
      priority -= t.def.weight;
      reasons.push(`${t.def.key}: ${t.detail} (-${t.def.weight})`);
    }
  }
  return { priority: fault ? 0 : Math.max(1, Math.min(254, priority)), base, reasons };
}

/**
 * A tracked service's observation from its backends' verdicts. Backends not
 * checked yet get the benefit of the doubt, and so does a service the
 * health checker does not know yet (total 0: the start, before its first
 * update).
 */
export function serviceObservation(up: number, unknown: number, total: number, minHealthy: number): { failing: boolean; detail: string } {
  if (total === 0) return { failing: false, detail: 'backends not known to the health checker yet' };
  const failing = up + unknown < minHealthy;
  const pending = unknown > 0 ? `, ${unknown} not checked yet` : '';
  return { failing, detail: `${up} of ${total} backends healthy${pending}, ${minHealthy} needed` };
}

/** A tracked interface's observation from its link: missing, administratively down, or without carrier fails. */
export function interfaceObservation(link: { readonly up: boolean; readonly carrier: boolean } | undefined): { failing: boolean; detail: string } {
  if (!link) return { failing: true, detail: 'no such interface' };
  if (!link.up) return { failing: true, detail: 'link down' };
  if (!link.carrier) return { failing: true, detail: 'no carrier' };
  return { failing: false, detail: 'up, carrier' };
}
