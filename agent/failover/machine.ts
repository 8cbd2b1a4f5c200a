// State machine layer (pure, no I/O, no timers): one VRRPv3 virtual router as
// RFC 5798 §6.4 describes it - Initialize, Backup, Master. A function of
// (machine, event, now) that returns the next machine and the actions a
// driver performs (send an advert, arm the single timer, announce a role).
// Beyond the RFC, a 'fault' state (keepalived's FAULT): a tracked interface
// or service without a weight failed (failover/tracking.ts), so the router
// resigns and stays out of the election until its priority comes back.
// Time is `now` in milliseconds from the caller's clock; intervals live in
// centiseconds as on the wire (§5.2.7), so 0.01 s is exact.

export type VrrpState = 'initialize' | 'backup' | 'master' | 'fault';
export const VRRP_STATES: readonly VrrpState[] = ['initialize', 'backup', 'master', 'fault'];

export interface MachineConfig {
  /** 1-254 for a router that does not own the addresses; 255 = owner (§5.2.4). */
  readonly priority: number;
  /** Advertisement_Interval in centiseconds, 1-4095 (§6.1). */
  readonly advertIntervalCs: number;
  /** Preempt_Mode (§6.1); an owner (priority 255) preempts regardless. */
  readonly preempt: boolean;
  /**
   * Not in RFC 5798 (keepalived's preempt_delay): how long a higher-priority
   * Backup tolerates a lower-priority Master before taking over, counted from
   * the first advert of that Master it sees. 0 = the RFC behaviour.
   */
  readonly preemptDelayMs: number;
  /** This router's primary IP address on the interface (u32): the tie-breaker of §6.4.3. */
  readonly primaryIp: number;
  /**
   * Not in RFC 5798: a Master whose priority falls (tracking) below that of
   * a router it has heard steps down instead of waiting to be preempted. It
   * goes Backup at once (the driver's listeners withdraw the VIPs), and
   * this many ms later, once the withdrawal is done, resigns with a
   * priority-0 advert (§6.4.3), so the other router takes over after
   * Skew_Time into a LAN where nobody holds the VIPs. undefined: never
   * step down (a lowered Master advertises its priority and is preempted).
   */
  readonly stepDownMs?: number | undefined;
}

export interface Machine {
  readonly config: MachineConfig;
  readonly state: VrrpState;
  /** Master_Adver_Interval (§6.1): learnt from the Master's adverts while Backup. */
  readonly masterAdverIntervalCs: number;
  /** When the one running timer fires (ms): Adver_Timer as Master, Master_Down_Timer as Backup. */
  readonly timerAt: number | undefined;
  /** Primary IP of the current Master as far as we know (ours when Master). */
  readonly master: number | undefined;
  readonly masterPriority: number | undefined;
  /** Since when a lower-priority Master has been tolerated (preemptDelay bookkeeping). */
  readonly lowerSince: number | undefined;
  /** The last priority (1-255) each other router advertised, by primary IP; a priority-0 advert forgets its sender. */
  readonly peers: ReadonlyMap<number, number>;
  /** Stepped down (MachineConfig.stepDownMs): the timer sends the priority-0 advert. */
  readonly resigning: boolean;
}

export type MachineEvent =
  | { readonly kind: 'startup' }
  /** §6.4.2/§6.4.3 Shutdown; priorityZero false skips the resignation advert (tests of a silent death). */
  | { readonly kind: 'shutdown'; readonly priorityZero?: boolean }
  /** The timer armed at machine.timerAt has fired; ignored when early or stale. */
  | { readonly kind: 'timer' }
  /** A validated advert for this VRID from another router. */
  | { readonly kind: 'advert'; readonly srcIp: number; readonly priority: number; readonly maxAdverIntCs: number }
  /**
   * The priority in use changed (failover/tracking.ts): 1-254, or 0 for
   * fault. Ignored in Initialize: the driver applies it after 'startup'.
   */
  | { readonly kind: 'priority'; readonly priority: number };

export type BecomeMasterReason = 'owner' | 'master-down' | 'master-resigned' | 'preempt';
export type BecomeBackupReason = 'startup' | 'higher-priority' | 'fault-cleared' | 'stepped-down';

export type Action =
  | { readonly kind: 'sendAdvert'; readonly priority: number }
  | { readonly kind: 'becomeMaster'; readonly reason: BecomeMasterReason }
  | { readonly kind: 'becomeBackup'; readonly reason: BecomeBackupReason; readonly master: number | undefined }
  /** Back in Initialize after a shutdown. */
  | { readonly kind: 'becomeInitialize' }
  /** Out of the election: a tracked interface or service without a weight failed. */
  | { readonly kind: 'becomeFault' }
  | { readonly kind: 'setTimer'; readonly at: number }
  | { readonly kind: 'clearTimer' }
  /** The known Master's address changed (also on our own transitions). */
  | { readonly kind: 'masterChanged'; readonly master: number | undefined }
  /**
   * While Master, an advert from another Master arrived: two Masters at once.
   * 'kept': it had lower precedence and will yield on our next advert;
   * 'yielded': it had higher precedence and we went Backup at once.
   */
  | { readonly kind: 'splitBrain'; readonly peer: number; readonly peerPriority: number; readonly resolution: 'kept' | 'yielded' };

export interface Step {
  readonly machine: Machine;
  readonly actions: readonly Action[];
}

/** §6.1 Skew_Time = ((256 - Priority) * Master_Adver_Interval) / 256, in ms. */
export function skewTimeMs(priority: number, masterAdverIntervalCs: number): number {
  return ((256 - priority) * masterAdverIntervalCs * 10) / 256;
}

/** §6.1 Master_Down_Interval = (3 * Master_Adver_Interval) + Skew_Time, in ms. */
export function masterDownIntervalMs(priority: number, masterAdverIntervalCs: number): number {
  return 3 * masterAdverIntervalCs * 10 + skewTimeMs(priority, masterAdverIntervalCs);
}

export function createMachine(config: MachineConfig): Machine {
  return {
    config,
    state: 'initialize',
    masterAdverIntervalCs: config.advertIntervalCs,
    timerAt: undefined,
    master: undefined,
    masterPriority: undefined,
    lowerSince: undefined,
    peers: new Map(),
    resigning: false,
  };
}

/** Does an advert (priority, srcIp) win against us? §6.4.3: higher priority, then higher primary IP. */
function outranks(cfg: MachineConfig, priority: number, srcIp: number): boolean {
  return priority > cfg.priority || (priority === cfg.priority && srcIp >>> 0 > cfg.primaryIp >>> 0);
}

/** How many other routers' priorities a machine remembers: adverts come from the LAN, so the map is bounded. */
export const MAX_PEERS = 32;

/** Remember what another router advertised: its priority, or nothing once it resigned (0). The least recently heard is forgotten first. */
function withPeer(m: Machine, srcIp: number, priority: number): Machine {
  if (priority === 0 ? !m.peers.has(srcIp) : m.peers.get(srcIp) === priority) return m;
  const peers = new Map(m.peers);
  peers.delete(srcIp);
  if (priority > 0) {
    peers.set(srcIp, priority);
    if (peers.size > MAX_PEERS) peers.delete(peers.keys().next().value!);
  }
  return { ...m, peers };
}

export function step(m: Machine, ev: MachineEvent, now: number): Step {
  const out = transition(m, ev, now);
  if (out.machine.master === m.master) return out;
  return { machine: out.machine, actions: [...out.actions, { kind: 'masterChanged', master: out.machine.master }] };
}

function transition(m: Machine, ev: MachineEvent, now: number): Step {
  const cfg = m.config;
  const same: Step = { machine: m, actions: [] };
  const adverMs = cfg.advertIntervalCs * 10;

  const toMaster = (reason: BecomeMasterReason): Step => ({
    machine: { ...m, state: 'master', timerAt: now + adverMs, master: cfg.primaryIp, masterPriority: cfg.priority, lowerSince: undefined },
    // §6.4.2: send an ADVERTISEMENT, (broadcast gratuitous ARP: the daemon's
    // job once told), set the Adver_Timer, transition to Master.
    actions: [{ kind: 'sendAdvert', priority: cfg.priority }, { kind: 'becomeMaster', reason }, { kind: 'setTimer', at: now + adverMs }],
  });

  switch (ev.kind) {
    case 'startup': {
      if (m.state !== 'initialize') return same;
      // §6.4.1: the owner goes straight to Master.
      if (cfg.priority === 255) return toMaster('owner');
      const mai = cfg.advertIntervalCs;
      const at = now + masterDownIntervalMs(cfg.priority, mai);
      return {
        machine: { ...m, state: 'backup', masterAdverIntervalCs: mai, timerAt: at, master: undefined, masterPriority: undefined, lowerSince: undefined },
        actions: [{ kind: 'becomeBackup', reason: 'startup', master: undefined }, { kind: 'setTimer', at }],
      };
    }

    case 'priority': {
      const p = ev.priority;
      if (m.state === 'initialize' || (p === 0 && m.state === 'fault')) return same;
      if (p === 0) {
        // keepalived's FAULT: a Master resigns with priority 0 (§6.4.3, as
        // on shutdown) so that a Backup takes over after Skew_Time.
        const actions: Action[] = [{ kind: 'clearTimer' }];
        if (m.state === 'master' || m.resigning) actions.push({ kind: 'sendAdvert', priority: 0 });
        actions.push({ kind: 'becomeFault' });
        return {
          machine: { ...m, state: 'fault', timerAt: undefined, master: undefined, masterPriority: undefined, lowerSince: undefined, resigning: false },
          actions,
        };
      }
      const config = { ...cfg, priority: p };
      if (m.state === 'fault') {
        // Back as keepalived comes back from FAULT: Backup, as at startup
        // (§6.4.1), and the election decides.
        const mai = config.advertIntervalCs;
        const at = now + masterDownIntervalMs(p, mai);
        return {
          machine: { ...m, config, state: 'backup', masterAdverIntervalCs: mai, timerAt: at, master: undefined, masterPriority: undefined, lowerSince: undefined },
          actions: [{ kind: 'becomeBackup', reason: 'fault-cleared', master: undefined }, { kind: 'setTimer', at }],
        };
      }
      if (p === cfg.priority) return same;
      if (m.state === 'master' && cfg.stepDownMs !== undefined && p < cfg.priority && [...m.peers].some(([ip, pp]) => outranks(config, pp, ip))) {
        // A router we have heard outranks the new priority (MachineConfig.stepDownMs):
        // step down now, resign once the VIPs are withdrawn. Advertising
        // the lowered priority instead leaves the VIPs here for a
        // Master_Down_Interval and a handover (the new Master cannot take
        // them while we still answer for them).
        const at = now + cfg.stepDownMs;
        return {
          machine: { ...m, config, state: 'backup', timerAt: at, master: undefined, masterPriority: undefined, lowerSince: undefined, resigning: true },
          actions: [{ kind: 'clearTimer' }, { kind: 'becomeBackup', reason: 'stepped-down', master: undefined }, { kind: 'setTimer', at }],
        };
      }
      if (m.state === 'master') {
        // Advertise the new priority at once: a Backup that now outranks us
        // starts its takeover an interval sooner, and one that did not
        // outrank us stops (§6.4.2: its Master_Down_Timer is reset).
        const at = now + adverMs;
        return {
          machine: { ...m, config, timerAt: at, masterPriority: p },
          actions: [{ kind: 'sendAdvert', priority: p }, { kind: 'setTimer', at }],
        };
      }
      // Backup: the next advert is judged against the new priority.
      return { machine: { ...m, config }, actions: [] };
    }

    case 'shutdown': {
      if (m.state === 'initialize') return same;
      const base: Machine = { ...m, state: 'initialize', timerAt: undefined, master: undefined, masterPriority: undefined, lowerSince: undefined, resigning: false };
      const actions: Action[] = [{ kind: 'clearTimer' }];
      // §6.4.3: a Master shutting down sends an ADVERTISEMENT with Priority 0
      // so that a Backup takes over after Skew_Time instead of Master_Down_Interval.
      if ((m.state === 'master' || m.resigning) && ev.priorityZero !== false) actions.push({ kind: 'sendAdvert', priority: 0 });
      actions.push({ kind: 'becomeInitialize' });
      return { machine: base, actions };
    }

    case 'timer': {
      if (m.timerAt === undefined || now < m.timerAt) return same;
      if (m.state === 'master') {
        // §6.4.3: Adver_Timer fired: send an ADVERTISEMENT, reset the timer.
        const at = now + adverMs;
        return { machine: { ...m, timerAt: at }, actions: [{ kind: 'sendAdvert', priority: cfg.priority }, { kind: 'setTimer', at }] };
      }
      if (m.state === 'backup' && m.resigning) {
        // Stepped down and withdrawn: resign (§6.4.3). If nobody takes
        // over (the router that outranked us is gone), we do, after a
        // Master_Down_Interval as from startup.
        const at = now + masterDownIntervalMs(cfg.priority, cfg.advertIntervalCs);
        return {
          machine: { ...m, masterAdverIntervalCs: cfg.advertIntervalCs, timerAt: at, resigning: false },
          actions: [{ kind: 'sendAdvert', priority: 0 }, { kind: 'setTimer', at }],
        };
      }
      if (m.state === 'backup') {
        // §6.4.2: Master_Down_Timer fired. Why it ran out decides only the log line.
        let reason: BecomeMasterReason = 'master-down';
        if (m.master === undefined && m.masterPriority === 0) reason = 'master-resigned';
        else if (m.lowerSince !== undefined) reason = 'preempt';
        return toMaster(reason);
      }
      return same;
    }

    case 'advert': {
      // Our own advert looped back, or an address conflict: not a peer.
      if (ev.srcIp >>> 0 === cfg.primaryIp >>> 0) return same;
      m = withPeer(m, ev.srcIp >>> 0, ev.priority);
      if (m.resigning) {
        // Stepping down and someone else spoke first: no resignation needed
        // (one from a Master would be taken as ours, §6.4.2).
        m = { ...m, resigning: false };
      }

      if (m.state === 'backup') {
        if (ev.priority === 0) {
          // §6.4.2: the Master resigned: take over after Skew_Time only.
          const at = now + skewTimeMs(cfg.priority, m.masterAdverIntervalCs);
          return {
            machine: { ...m, timerAt: at, master: undefined, masterPriority: 0, lowerSince: undefined },
            actions: [{ kind: 'setTimer', at }],
          };
        }
        // Not in RFC 5798: with preempt off, a Master this router follows
        // whose advertised priority fell below ours (its tracking lowered
        // it: failover/tracking.ts) is taken over from as if preempt were
        // on. Preempt off keeps a healthy Master, not a failing one.
        // keepalived's nopreempt keeps it (docs/failover.md says so).
        const degraded = !cfg.preempt && ev.priority < cfg.priority && ev.srcIp >>> 0 === m.master
          && (m.lowerSince !== undefined || (m.masterPriority !== undefined && ev.priority < m.masterPriority));
        const preempt = cfg.preempt || cfg.priority === 255 || degraded; // §6.1 note: the owner always preempts
        const accept = (timerCap: number | undefined, lowerSince: number | undefined): Step => {
          // §6.4.2: learn Master_Adver_Interval, recompute Master_Down_Interval,
          // reset Master_Down_Timer.
          const mai = Math.max(1, ev.maxAdverIntCs);
          let at = now + masterDownIntervalMs(cfg.priority, mai);
          if (timerCap !== undefined && timerCap < at) at = timerCap;
          return {
            machine: { ...m, masterAdverIntervalCs: mai, timerAt: at, master: ev.srcIp >>> 0, masterPriority: ev.priority, lowerSince },
            actions: [{ kind: 'setTimer', at }],
          };
        };
        if (!preempt || ev.priority >= cfg.priority) return accept(undefined, undefined);
        // A lower-priority Master and we may preempt.
        if (cfg.preemptDelayMs > 0) {
          const since = m.lowerSince ?? now;
          const deadline = since + cfg.preemptDelayMs;
          // Tolerate it until the delay is over; the timer then fires and we take over.
          if (now < deadline) return accept(deadline, since);
          return { machine: { ...m, master: ev.srcIp >>> 0, masterPriority: ev.priority, lowerSince: since }, actions: [] };
        }
        // §6.4.2: discard the advert; Master_Down_Timer runs out and we preempt.
        return { machine: { ...m, master: ev.srcIp >>> 0, masterPriority: ev.priority, lowerSince: m.lowerSince ?? now }, actions: [] };
      }

      if (m.state === 'master') {
        if (ev.priority === 0) {
          // §6.4.3: another router resigned: advertise at once so its Backups
          // hear of us before their Skew_Time runs out.
          const at = now + adverMs;
          return { machine: { ...m, timerAt: at }, actions: [{ kind: 'sendAdvert', priority: cfg.priority }, { kind: 'setTimer', at }] };
        }
        if (outranks(cfg, ev.priority, ev.srcIp)) {
          // §6.4.3: a better Master exists: stop advertising, go Backup.
          const mai = Math.max(1, ev.maxAdverIntCs);
          const at = now + masterDownIntervalMs(cfg.priority, mai);
          return {
            machine: { ...m, state: 'backup', masterAdverIntervalCs: mai, timerAt: at, master: ev.srcIp >>> 0, masterPriority: ev.priority, lowerSince: undefined },
            actions: [
              { kind: 'splitBrain', peer: ev.srcIp >>> 0, peerPriority: ev.priority, resolution: 'yielded' },
              { kind: 'clearTimer' },
              { kind: 'becomeBackup', reason: 'higher-priority', master: ev.srcIp >>> 0 },
              { kind: 'setTimer', at },
            ],
          };
        }
        // §6.4.3: discard; the other Master yields when it hears our next advert.
        return { machine: m, actions: [{ kind: 'splitBrain', peer: ev.srcIp >>> 0, peerPriority: ev.priority, resolution: 'kept' }] };
      }
      return same;
    }
  }
}
