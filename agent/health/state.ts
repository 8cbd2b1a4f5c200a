// Health state machine (pure): one backend as seen by one service. A function
// of (state, event, now, thresholds) returning the new state and whether it
// changed; no I/O, no timers. The checker feeds it probe results (active) and
// connect outcomes from the forwarding path (passive).
//
// States: unknown -> up | down; up <-> down. `unknown` is not healthy: a new
// backend gets traffic only after it has answered once.
//
// Rules (HAProxy rise/fall, Kubernetes success/failureThreshold):
// - unknown: the FIRST successful probe makes it up at once, whatever
//   successThreshold says. A new backend is as likely to be fine as an old one
//   that just recovered is not, and Harvester/Kubernetes readiness does the
//   same (a probe result, not a streak, decides the first state). Failures
//   need failureThreshold consecutive ones to mark it down, so a backend that
//   is slow to start is not reported down before it had its chance.
// - up: failureThreshold consecutive failed probes -> down (takenOutBy active).
// - down: successThreshold consecutive good probes -> up.
// - passive: passiveFailures consecutive failed connects on the forwarding
//   path mark an unknown/up backend down at once (takenOutBy passive);
//   0 turns passive checks off. Passive successes only reset that count: only
//   an active probe brings a backend back (Envoy outlier detection likewise
//   never readmits a host on traffic it no longer receives).
// Flapping is bounded by construction: every up->down change ends a run of
// failureThreshold failures (or passiveFailures passive ones) and every
// down->up change ends a run of successThreshold successes; the counters
// reset on each change, so no probe counts towards two changes.

export type HealthState = 'unknown' | 'up' | 'down';

/**
 * Why a probe or a connect failed. The first four come from the socket
 * (ECONNREFUSED, ETIMEDOUT or our timer, ECONNRESET, EHOSTUNREACH/ENETUNREACH);
 * `bad-status` is an HTTP answer outside the expected range; `tls` is a
 * handshake refused or a certificate that failed verification; `error` is
 * anything else (EMFILE, a parse error, ...). Also a metric label.
 */
export type FailureReason = 'refused' | 'timeout' | 'reset' | 'unreachable' | 'bad-status' | 'tls' | 'error';
export const FAILURE_REASONS: readonly FailureReason[] = ['refused', 'timeout', 'reset', 'unreachable', 'bad-status', 'tls', 'error'];

export type CheckPath = 'active' | 'passive';

export interface Thresholds {
  readonly successThreshold: number;
  readonly failureThreshold: number;
  /** Consecutive passive failures that mark a backend down; 0 = passive checks off. */
  readonly passiveFailures: number;
}

export interface FailureRecord {
  readonly reason: FailureReason;
  /** Time of the failure (the caller's clock; the checker passes wall-clock ms). */
  readonly at: number;
  readonly by: CheckPath;
  readonly detail: string | undefined;
}

export interface BackendHealth {
  readonly state: HealthState;
  /** Time of the last state change (or of creation). */
  readonly since: number;
  readonly consecutiveSuccesses: number;
  readonly consecutiveFailures: number;
  /** Consecutive failed connects reported by the forwarding path. */
  readonly passiveFailures: number;
  /** While down: the reason of the failure that took it down. */
  readonly reason: FailureReason | undefined;
  /** While down: which path took it down. */
  readonly takenOutBy: CheckPath | undefined;
  /** The most recent failure of either path, kept after recovery. */
  readonly lastFailure: FailureRecord | undefined;
}

export type HealthEvent =
  | { readonly kind: 'probe-ok' }
  | { readonly kind: 'probe-fail'; readonly reason: FailureReason; readonly detail?: string }
  | { readonly kind: 'passive-ok' }
  | { readonly kind: 'passive-fail'; readonly reason: FailureReason; readonly detail?: string };

export interface StepResult {
  readonly health: BackendHealth;
  /** The state changed (unknown->up, unknown->down, up->down, down->up). */
  readonly changed: boolean;
}

export function initialHealth(now: number): BackendHealth {
  return health('unknown', now, 0, 0, 0, undefined, undefined, undefined);
}

/** Whether traffic may go to a backend in this state. */
export function isHealthy(h: BackendHealth): boolean {
  return h.state === 'up';
}

/**
 * A BackendHealth with every field spelled out: a literal of one shape, which
 * V8 builds far faster than an object spread (the spread was a
 * visible part of the per-probe cost).
 */
function health(
  state: HealthState, since: number, consecutiveSuccesses: number, consecutiveFailures: number, passiveFailures: number,
  reason: FailureReason | undefined, takenOutBy: CheckPath | undefined, lastFailure: FailureRecord | undefined,
): BackendHealth {
  return { state, since, consecutiveSuccesses, consecutiveFailures, passiveFailures, reason, takenOutBy, lastFailure };
}

export function step(h: BackendHealth, ev: HealthEvent, now: number, th: Thresholds): StepResult {
  switch (ev.kind) {
    case 'probe-ok': {
      const succ = h.consecutiveSuccesses + 1;
      const goUp = h.state === 'unknown' || (h.state === 'down' && succ >= th.successThreshold);
      if (goUp) {
        return { changed: true, health: health('up', now, succ, 0, 0, undefined, undefined, h.lastFailure) };
      }
      return { changed: false, health: health(h.state, h.since, succ, 0, h.passiveFailures, h.reason, h.takenOutBy, h.lastFailure) };
    }
    case 'probe-fail': {
      const fail = h.consecutiveFailures + 1;
      const lastFailure: FailureRecord = { reason: ev.reason, at: now, by: 'active', detail: ev.detail };
      if (h.state !== 'down' && fail >= th.failureThreshold) {
        return { changed: true, health: health('down', now, 0, fail, h.passiveFailures, ev.reason, 'active', lastFailure) };
      }
      return { changed: false, health: health(h.state, h.since, 0, fail, h.passiveFailures, h.reason, h.takenOutBy, lastFailure) };
    }
    case 'passive-ok':
      return { changed: false, health: h.passiveFailures === 0 ? h : health(h.state, h.since, h.consecutiveSuccesses, h.consecutiveFailures, 0, h.reason, h.takenOutBy, h.lastFailure) };
    case 'passive-fail': {
      if (th.passiveFailures <= 0) return { changed: false, health: h };
      const pf = h.passiveFailures + 1;
      const lastFailure: FailureRecord = { reason: ev.reason, at: now, by: 'passive', detail: ev.detail };
      if (h.state !== 'down' && pf >= th.passiveFailures) {
        // Down at once; the active streak restarts so that recovery takes
        // successThreshold probes counted from here.
        return { changed: true, health: health('down', now, 0, h.consecutiveFailures, 0, ev.reason, 'passive', lastFailure) };
      }
      return { changed: false, health: health(h.state, h.since, h.consecutiveSuccesses, h.consecutiveFailures, h.state === 'down' ? 0 : pf, h.reason, h.takenOutBy, lastFailure) };
    }
  }
}
