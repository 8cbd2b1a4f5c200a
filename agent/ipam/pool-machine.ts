// Pool address acquisition (pure): one pool service's way from "wants an
// address" to "holds it on the LAN" and back, as a function of
// (state, event, now) returning the next state and the actions a driver
// (pool-source.ts) performs: reserve in the PoolManager, RFC 5227 probe,
// persist the claim, put the address on the parent, hold it on the wire
// (net/vip-owner.ts), and undo each of those. No I/O, no timers, no clock.
//
// The order is the contract with crash recovery: after a probe, the claim is
// written before the address goes on the parent, so an address that took
// seconds to win is never on the LAN without a claim that names its owner.
// An address found on the parent at start with a matching claim was left by
// an earlier run of this agent: it is adopted (announced and defended at
// once), not probed again, since RFC 5227 probes an address a host is about
// to begin using, and this one never stopped being used.
//
// Without a probe (an adoption, a VRRP takeover) the address goes on and out
// first and the claim is written after the first announcement: the claim
// write fsyncs twice, 3-35 ms on these disks, and a takeover is measured
// against keepalived, which writes nothing. A crash in that window
// leaves an address with the agent's mark and no claim, which the next start
// withdraws (daemon/wiring.ts adoptOwned): crash-safe, just not adopted.
import type { SourceState } from '../source';
import type { AllocationResult } from './allocator';

export type PoolPhase =
  | 'stopped'
  | 'allocating'   // a reserve() is in flight
  | 'waiting'      // pending, failed or rate-limited: a timer or a pool change wakes it
  | 'probing'      // RFC 5227 §2.1 probe of the reserved address
  | 'committing'   // persisting the claim
  | 'adding'       // putting the address on the parent
  | 'announcing'   // VipOwner starting (first gratuitous ARP)
  | 'bound';

export interface PoolConflictRecord {
  readonly address: string;
  readonly mac: string;
  /** On the machine's clock; the driver shows it as wall time. */
  readonly at: number;
  readonly defended: boolean;
  readonly phase: 'probe' | 'defend';
}

export interface PoolState {
  readonly phase: PoolPhase;
  /** What status shows. */
  readonly source: SourceState;
  readonly reason: string | undefined;
  /** The address being acquired or held. */
  readonly address: string | undefined;
  readonly pool: string | undefined;
  readonly via: string | undefined;
  /** The held address was found on the parent with a matching claim (an earlier run's). */
  readonly adopted: boolean;
  /** The address on the parent that is ours to take off (put on, or adopted). */
  readonly onParent: string | undefined;
  /** waiting: when the timer fires (undefined: only a pool change wakes it). */
  readonly waitUntil: number | undefined;
  /** waiting: whether a pool change (a claim released, a reload) ends the wait. */
  readonly wakeOnChange: boolean;
  /** The claim is written once the address is held (no-probe paths), not before. */
  readonly commitAfterHold: boolean;
  /** Allocation attempts since start or since the last binding. */
  readonly attempts: number;
  readonly conflicts: number;
  readonly defences: number;
  readonly lastConflict: PoolConflictRecord | undefined;
}

export interface PoolMachineConfig {
  /** RFC 5227 probe before claiming; off under VRRP (the election decided). */
  readonly probe: boolean;
  /** Retry after a fault, ms. */
  readonly faultRetryMs: number;
}

export type PoolEvent =
  | { readonly type: 'start' }
  | { readonly type: 'stop'; readonly release: boolean }
  /** The manager asks to wait before the next reserve() (RFC 5227 §2.1.1 rate limit). */
  | { readonly type: 'rate-limited'; readonly delayMs: number }
  /** reserve() answered; `onParent`: the address is on the parent as a host address (/32, /128) already. */
  | { readonly type: 'allocation'; readonly result: AllocationResult; readonly onParent: boolean }
  | { readonly type: 'timer' }
  /** The manager changed (a claim released, pools reloaded). */
  | { readonly type: 'changed' }
  | { readonly type: 'probe-free' }
  | { readonly type: 'probe-conflict'; readonly mac: string | undefined }
  | { readonly type: 'committed' }
  | { readonly type: 'added' }
  /** The VipOwner sent the first announcement. */
  | { readonly type: 'held' }
  /** RFC 5227 §2.4: a conflicting ARP the address is kept through; `defended`: answered with one announcement. */
  | { readonly type: 'conflict'; readonly mac: string; readonly defended: boolean }
  /** RFC 5227 §2.4: a second one within DEFEND_INTERVAL: give the address up. */
  | { readonly type: 'lost'; readonly mac: string }
  /** The action of the current phase failed (parent missing, EPERM, state write). */
  | { readonly type: 'fault'; readonly what: string; readonly error: string };

export type PoolLog = { readonly level: 'info' | 'warn' | 'error'; readonly op: string; readonly msg: string; readonly fields?: Readonly<Record<string, unknown>> };

export type PoolAction =
  /** Read the parent's addresses and reserve() in one turn of the manager; answer with 'allocation' or 'rate-limited' or 'fault'. */
  | { readonly type: 'allocate' }
  /** Wake with 'timer' at `until` (if set) and with 'changed' when the manager changes (if `onChange`). */
  | { readonly type: 'wait'; readonly until: number | undefined; readonly onChange: boolean }
  | { readonly type: 'probe'; readonly address: string }
  | { readonly type: 'commit'; readonly address: string }
  | { readonly type: 'add-address'; readonly address: string }
  /** Announce, defend and refresh the address (VipOwner); answer with 'held' or 'fault'. */
  | { readonly type: 'hold'; readonly address: string }
  | { readonly type: 'unhold' }
  | { readonly type: 'remove-address'; readonly address: string }
  /** Drop the manager's hold on the reserved address (the claim stays). */
  | { readonly type: 'unreserve' }
  /** Stop: drop the hold, and the persisted claim too when `deleteClaim`. */
  | { readonly type: 'release'; readonly deleteClaim: boolean }
  /** Keep the address away from everyone for a while (manager.markConflict). `counted`: the metric already has it. */
  | { readonly type: 'mark-conflict'; readonly address: string; readonly mac: string | undefined; readonly counted: boolean }
  /** Count a defended conflict (manager.noteConflict). */
  | { readonly type: 'note-conflict'; readonly address: string }
  /** Drop the ARP socket after a fault, so the next attempt opens a fresh one (the interface may have been recreated). */
  | { readonly type: 'reset-socket' }
  /** The VIP is up on the LAN: tell the daemon. */
  | { readonly type: 'up'; readonly address: string }
  /** The VIP was withdrawn: tell the daemon why. */
  | { readonly type: 'down'; readonly reason: string; readonly cause: 'stopped' | 'released' | 'conflict' }
  | { readonly type: 'log'; readonly log: PoolLog };

export type PoolReason =
  | 'started' | 'already-running' | 'not-running' | 'ignored'
  | 'rate-limited' | 'pending' | 'failed' | 'allocated' | 'adopting' | 'probing' | 'claiming-without-probe'
  | 'early-timer' | 'woken' | 'probe-free' | 'probe-conflict' | 'committed' | 'added' | 'bound'
  | 'defended' | 'lost' | 'fault' | 'stopped';

export interface PoolStep {
  readonly state: PoolState;
  readonly actions: readonly PoolAction[];
  readonly reason: PoolReason;
}

export function initialPoolState(): PoolState {
  return {
    phase: 'stopped', source: 'idle', reason: undefined, address: undefined, pool: undefined, via: undefined,
    adopted: false, onParent: undefined, waitUntil: undefined, wakeOnChange: false, commitAfterHold: false, attempts: 0,
    conflicts: 0, defences: 0, lastConflict: undefined,
  };
}

/** A full pool or an address held by someone else can free up: pending. No pool / outside the pool: a config change is needed. */
function sourceStateFor(r: Extract<AllocationResult, { ok: false }>): SourceState {
  return r.reason === 'exhausted' || r.reason === 'taken' ? 'pending' : 'failed';
}

function allocate(s: PoolState, actions: PoolAction[], reason?: string): PoolState {
  actions.push({ type: 'allocate' });
  return { ...s, phase: 'allocating', source: s.source === 'bound' || s.source === 'idle' ? 'acquiring' : s.source, reason: reason ?? s.reason, attempts: s.attempts + 1, waitUntil: undefined, wakeOnChange: false };
}

function wait(s: PoolState, actions: PoolAction[], until: number | undefined, onChange: boolean): PoolState {
  actions.push({ type: 'wait', until, onChange });
  return { ...s, phase: 'waiting', waitUntil: until, wakeOnChange: onChange };
}

const ACTIVE: ReadonlySet<PoolPhase> = new Set(['allocating', 'probing', 'committing', 'adding', 'announcing']);

export function poolStep(s: PoolState, ev: PoolEvent, now: number, cfg: PoolMachineConfig): PoolStep {
  const actions: PoolAction[] = [];
  const done = (state: PoolState, reason: PoolReason): PoolStep => ({ state, actions, reason });
  const ignore = (): PoolStep => done(s, s.phase === 'stopped' ? 'not-running' : 'ignored');

  switch (ev.type) {
    case 'start': {
      if (s.phase !== 'stopped') return done(s, 'already-running');
      const fresh: PoolState = { ...initialPoolState(), conflicts: s.conflicts, defences: s.defences, lastConflict: s.lastConflict, source: 'acquiring' };
      return done(allocate(fresh, actions), 'started');
    }

    case 'stop': {
      if (s.phase === 'stopped') return ignore();
      if (s.phase === 'bound' || s.phase === 'announcing') actions.push({ type: 'unhold' });
      if (s.onParent !== undefined) actions.push({ type: 'remove-address', address: s.onParent });
      actions.push({ type: 'release', deleteClaim: ev.release });
      if (s.phase === 'bound') actions.push({ type: 'down', reason: ev.release ? 'released' : 'stopped', cause: ev.release ? 'released' : 'stopped' });
      return done({ ...initialPoolState(), conflicts: s.conflicts, defences: s.defences, lastConflict: s.lastConflict }, 'stopped');
    }

    case 'rate-limited': {
      if (s.phase !== 'allocating') return ignore();
      const until = now + ev.delayMs;
      // Only time ends a rate-limit wait: a pool change does not make the LAN quieter.
      const next = wait({ ...s, source: 'pending', reason: `rate-limited after repeated address conflicts (RFC 5227 §2.1.1); next attempt in ${Math.ceil(ev.delayMs / 1000)} s` }, actions, until, false);
      return done(next, 'rate-limited');
    }

    case 'allocation': {
      if (s.phase !== 'allocating') return ignore();
      const r = ev.result;
      if (!r.ok) {
        const source = sourceStateFor(r);
        if (s.source !== source || s.reason !== r.message) {
          actions.push({ type: 'log', log: { level: source === 'failed' ? 'error' : 'warn', op: 'allocate', msg: r.message, fields: { reason: r.reason, pool: r.pool } } });
        }
        const until = r.retryAt ?? (source === 'failed' ? now + cfg.faultRetryMs : undefined);
        return done(wait({ ...s, source, reason: r.message, pool: r.pool }, actions, until, true), source === 'failed' ? 'failed' : 'pending');
      }
      const base: PoolState = { ...s, address: r.address, pool: r.pool, via: r.via, adopted: false, commitAfterHold: false, onParent: ev.onParent ? r.address : undefined };
      const fields = { address: r.address, pool: r.pool, via: r.via };
      if (ev.onParent && r.via === 'claim') {
        // Adopted from an earlier run: never left the interface, so not probed again.
        actions.push({ type: 'log', log: { level: 'info', op: 'adopt', msg: `adopting ${r.address}: on the parent with a matching claim (an earlier run's); announcing it without a probe`, fields } });
        actions.push({ type: 'add-address', address: r.address });
        return done({ ...base, phase: 'adding', adopted: true, commitAfterHold: true, onParent: r.address, source: 'acquiring', reason: `adopting ${r.address} (claim, pool ${r.pool})` }, 'adopting');
      }
      if (cfg.probe) {
        actions.push({ type: 'log', log: { level: 'info', op: 'probe', msg: `probing ${r.address} before claiming it`, fields: { ...fields, onParent: ev.onParent } } });
        actions.push({ type: 'probe', address: r.address });
        return done({ ...base, phase: 'probing', source: 'acquiring', reason: `probing ${r.address} (${r.via}, pool ${r.pool})` }, 'probing');
      }
      actions.push({ type: 'log', log: { level: 'info', op: 'claim', msg: `claiming ${r.address} without a probe: VRRP decided this node holds it`, fields } });
      actions.push({ type: 'add-address', address: r.address });
      return done({ ...base, phase: 'adding', commitAfterHold: true, onParent: r.address, source: 'acquiring', reason: `claiming ${r.address} (${r.via}, pool ${r.pool})` }, 'claiming-without-probe');
    }

    case 'timer': {
      if (s.phase !== 'waiting') return ignore();
      if (s.waitUntil === undefined) return ignore();
      if (now < s.waitUntil) {
        actions.push({ type: 'wait', until: s.waitUntil, onChange: s.wakeOnChange });
        return done(s, 'early-timer');
      }
      return done(allocate(s, actions), 'woken');
    }

    case 'changed': {
      if (s.phase !== 'waiting' || !s.wakeOnChange) return ignore();
      return done(allocate(s, actions), 'woken');
    }

    case 'probe-free': {
      if (s.phase !== 'probing') return ignore();
      // Persist the claim before the address goes on the interface (header).
      actions.push({ type: 'commit', address: s.address! });
      return done({ ...s, phase: 'committing' }, 'probe-free');
    }

    case 'probe-conflict': {
      if (s.phase !== 'probing') return ignore();
      const address = s.address!;
      const mac = ev.mac ?? '';
      actions.push({ type: 'mark-conflict', address, mac: ev.mac, counted: false });
      if (s.onParent !== undefined) actions.push({ type: 'remove-address', address: s.onParent });
      const next: PoolState = {
        ...s, onParent: undefined, conflicts: s.conflicts + 1,
        lastConflict: { address, mac, at: now, defended: false, phase: 'probe' },
      };
      return done(allocate(next, actions, `${address} is in use by ${ev.mac ?? 'another host'}; trying another address`), 'probe-conflict');
    }

    case 'committed': {
      if (s.phase !== 'committing') return ignore();
      const address = s.address!;
      // Ours to take off from here on, even if adding fails half-way.
      actions.push({ type: 'add-address', address });
      return done({ ...s, phase: 'adding', onParent: address }, 'committed');
    }

    case 'added': {
      if (s.phase !== 'adding') return ignore();
      // RFC 5227 §2.3: the first announcement goes out before anyone is told the VIP is up.
      actions.push({ type: 'hold', address: s.address! });
      return done({ ...s, phase: 'announcing' }, 'added');
    }

    case 'held': {
      if (s.phase !== 'announcing') return ignore();
      const address = s.address!;
      actions.push(
        { type: 'up', address },
        { type: 'log', log: { level: 'info', op: 'bound', msg: `holds ${address}/${address.includes(':') ? 128 : 32}${s.adopted ? ' (adopted from a previous run)' : ''}`, fields: { address, pool: s.pool, via: s.via, adopted: s.adopted, attempts: s.attempts } } },
      );
      if (s.commitAfterHold) actions.push({ type: 'commit', address });
      return done({ ...s, phase: 'bound', source: 'bound', reason: undefined, attempts: 0, commitAfterHold: false }, 'bound');
    }

    case 'conflict': {
      if (s.phase !== 'bound') return ignore();
      const address = s.address!;
      const how = ev.defended ? 'defended with one gratuitous ARP' : 'already defended within the defend interval';
      actions.push(
        { type: 'note-conflict', address },
        { type: 'log', log: { level: 'warn', op: 'defend', msg: `${ev.mac} claims ${address}; ${how} (RFC 5227 §2.4), keeping the address`, fields: { address, conflictingMac: ev.mac, defended: ev.defended } } },
      );
      return done({
        ...s, conflicts: s.conflicts + 1, defences: s.defences + (ev.defended ? 1 : 0),
        lastConflict: { address, mac: ev.mac, at: now, defended: ev.defended, phase: 'defend' },
      }, 'defended');
    }

    case 'lost': {
      if (s.phase !== 'bound') return ignore();
      const address = s.address!;
      // RFC 5227 §2.4 (b): cease using the address; keep it away from
      // everyone for a while and allocate another. Giving up rather than
      // fighting keeps two hosts from flapping the LAN's ARP caches.
      actions.push(
        { type: 'log', log: { level: 'error', op: 'give-up', msg: `${ev.mac} claims ${address} again within the defend interval; giving the address up and allocating another (RFC 5227 §2.4)`, fields: { address, conflictingMac: ev.mac } } },
        { type: 'unhold' },
        { type: 'note-conflict', address },
        { type: 'mark-conflict', address, mac: ev.mac, counted: true },
        { type: 'down', reason: `address conflict: ${ev.mac} uses ${address}`, cause: 'conflict' },
      );
      if (s.onParent !== undefined) actions.push({ type: 'remove-address', address: s.onParent });
      const next: PoolState = {
        ...s, onParent: undefined, adopted: false, source: 'acquiring', conflicts: s.conflicts + 1,
        lastConflict: { address, mac: ev.mac, at: now, defended: false, phase: 'defend' },
      };
      return done(allocate(next, actions, `gave up ${address}: ${ev.mac} uses it too`), 'lost');
    }

    case 'fault': {
      const message = `${ev.what}: ${ev.error}`;
      if (s.phase === 'bound') {
        // Only the claim written after the first announcement fails here: the
        // address stays served; what is lost is getting it back after a restart.
        actions.push({ type: 'log', log: { level: 'error', op: 'fault', msg: `${message}; still serving ${s.address!}, but a restart will not find this claim` } });
        return done(s, 'fault');
      }
      if (!ACTIVE.has(s.phase)) return ignore();
      let next: PoolState = s;
      switch (s.phase) {
        case 'probing':
        case 'committing':
          // The claim was not written (or not yet): let the address go back to the pool for now.
          actions.push({ type: 'unreserve' });
          break;
        case 'announcing':
          actions.push({ type: 'unhold' });
          if (s.onParent !== undefined) actions.push({ type: 'remove-address', address: s.onParent });
          next = { ...next, onParent: undefined };
          break;
        case 'adding':
          // Most likely not on the interface; the claim stays, and the next attempt adds it again.
          next = { ...next, onParent: undefined };
          break;
      }
      if (s.source !== 'failed' || s.reason !== message) {
        actions.push({ type: 'log', log: { level: 'error', op: 'fault', msg: message } });
      }
      actions.push({ type: 'reset-socket' });
      return done(wait({ ...next, source: 'failed', reason: message, adopted: false }, actions, now + cfg.faultRetryMs, true), 'fault');
    }
  }
}
