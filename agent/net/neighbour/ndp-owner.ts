// IPv6 VIP ownership on the wire (RFC 4862 §5.4, RFC 4861 §7.2): one
// address held at one MAC. A pure core, ndpStep (state, event, now) ->
// (state, actions), the IPv6 twin of vip-owner.ts's vipStep with duplicate
// address detection in front: join the address's solicited-node group, probe
// (DAD), then the unsolicited advertisement burst, the periodic refresh,
// answers to solicitations, the defence, and a withdrawal that sends
// nothing. A driver performs the actions (send the packet an action holds,
// join or leave a group, arm a timer); time is the caller's `now`.
// It knows addresses and MACs, never services: what a duplicate or a lost
// address means (DHCPv6 DECLINE, another pool address) is the owner's decision.
import { DEFEND_INTERVAL_MS } from './arp-probe';
import {
  ipv6MulticastMac,
  isDadProbe,
  ndpDadProbe,
  ndpSolicitedAdvertisement,
  ndpUnsolicitedAdvertisement,
  solicitedNodeAddress,
  type NdpPacket,
} from './ndp';

/** RFC 4862 §5.1 DupAddrDetectTransmits default: one probe. */
export const DUP_ADDR_DETECT_TRANSMITS = 1;
/** RFC 4861 §10 RETRANS_TIMER: 1 s between probes, and the wait after the last. */
export const RETRANS_TIMER_MS = 1000;
/** RFC 4861 §10 MAX_NEIGHBOR_ADVERTISEMENT: unsolicited advertisements on gain (§7.2.6). */
export const MAX_NEIGHBOR_ADVERTISEMENT = 3;
/** The RFC 5227 defence interval, shared with IPv4 (§2.4): one defence per 10 s. */
export { DEFEND_INTERVAL_MS };

export interface NdpOwnerConfig {
  /**
   * RFC 4862 DupAddrDetectTransmits: DAD probes before the address is used.
   * 0: no DAD (§5.1): an address whose holder an election decides (VRRP),
   * which the current Master answers for and so would always look taken.
   */
  readonly dadTransmits: number;
  /** RFC 4861 RetransTimer in ms (1000): between probes, and after the last before the address is unique. */
  readonly retransTimerMs: number;
  /** Unsolicited advertisements in the burst on gain (MAX_NEIGHBOR_ADVERTISEMENT, 3). */
  readonly announceNum: number;
  /** Between them, ms; §7.2.6 asks for at least RetransTimer. */
  readonly announceIntervalMs: number;
  /** An unsolicited advertisement every refreshMs while held (the gratuitous ARP refresh's twin); 0 turns it off. */
  readonly refreshMs: number;
  /** Between defences, ms (RFC 5227 DEFEND_INTERVAL, 10 000). */
  readonly defendIntervalMs: number;
  /**
   * As vip-owner.ts: true, RFC 5227 §2.4 (b): defend once, give the address
   * up on a second conflict within defendIntervalMs. false, (c): never give
   * it up, defend at most once per defendIntervalMs (VRRP, where giving up
   * would leave the VIP with nobody).
   */
  readonly giveUp: boolean;
  /**
   * Answer solicitations for the held address. True when the kernel does not
   * (the address is not on the interface, or the kernel's answer is not
   * wanted); false when the address is on the interface and the kernel
   * answers, so the LAN does not get each answer twice.
   */
  readonly answerSolicitations: boolean;
}

export type NdpPhase = 'idle' | 'tentative' | 'held' | 'duplicate' | 'lost';

/** Why DAD found the address taken: recorded with the address that is skipped. */
export type NdpDuplicateReason =
  /** RFC 4862 §5.4.4: an advertisement for the tentative address. */
  | 'advertised'
  /** §5.4.3: a probe from :: for it: another node is running DAD for the same address. */
  | 'probed'
  /** Another node sends from the address: it is in use (RFC 5227 §2.1.1's sender-IP rule). */
  | 'in-use';

export interface NdpState {
  readonly phase: NdpPhase;
  /** The address, as an unsigned 128-bit integer (Address.value). */
  readonly ip: bigint;
  /** Our hardware address, lower-case. */
  readonly mac: string;
  /** The address's solicited-node group (RFC 4291 §2.7.1) and its Ethernet MAC: what the interface must listen to. */
  readonly group: bigint;
  readonly groupMac: string;
  /** RFC 7527 nonce of our probes (hex), if the driver gives one: a probe carrying it is our own, looped back. */
  readonly nonce: string | undefined;
  readonly probesSent: number;
  /** When the pending timer is due: the next probe, the end of DAD, or the next advertisement. */
  readonly deadline: number | undefined;
  /** Advertisements of the current burst still to send. */
  readonly burstLeft: number;
  readonly lastConflictAt: number | undefined;
  readonly lastDefendAt: number | undefined;
  readonly conflictingMac: string | undefined;
  readonly duplicateReason: NdpDuplicateReason | undefined;
}

export type NdpEvent =
  | { readonly type: 'start' }
  | { readonly type: 'timer' }
  | { readonly type: 'ndp'; readonly packet: NdpPacket }
  /** Advertise again at once, a full burst (a new VRRP Master, a split brain healed). */
  | { readonly type: 'reannounce' }
  /** The timings changed (a reload): the refresh runs at the new interval from now. */
  | { readonly type: 'retime' }
  | { readonly type: 'stop' };

/** Why a packet goes out: also a metric label. */
export type NdpSendReason = 'dad-probe' | 'burst' | 'refresh' | 'defend' | 'reannounce' | 'answer';

export type NdpAction =
  /** Listen to the solicited-node group (PACKET_ADD_MEMBERSHIP with groupMac, or IPV6_JOIN_GROUP), before the first probe (RFC 4862 §5.4.2). */
  | { readonly type: 'join'; readonly group: bigint; readonly mac: string }
  | { readonly type: 'leave'; readonly group: bigint; readonly mac: string }
  | { readonly type: 'send'; readonly reason: NdpSendReason; readonly packet: NdpPacket }
  | { readonly type: 'arm-timer'; readonly at: number }
  | { readonly type: 'clear-timer' }
  /** DAD is over and found nobody: the address may be used (comes before the burst's first advertisement). */
  | { readonly type: 'unique' }
  /** DAD found the address taken (RFC 4862 §5.4.5): it must not be used. */
  | { readonly type: 'duplicate'; readonly mac: string; readonly reason: NdpDuplicateReason }
  /** A conflict answered with one unsolicited advertisement: the address is kept. */
  | { readonly type: 'defended'; readonly mac: string }
  /** A conflict not answered (§2.4 (c) rate limit): the address is kept. */
  | { readonly type: 'conflict'; readonly mac: string }
  /** A second conflict within the defend interval (§2.4 (b)): the address must not be used any more. */
  | { readonly type: 'lost'; readonly mac: string };

export type NdpReason =
  | 'probing' | 'started' | 'already-started' | 'not-running' | 'early-timer' | 'probe-sent' | 'unique'
  | 'burst' | 'refresh' | 'no-advertisement-due' | 'own-frame' | 'unrelated' | 'resolution-for-tentative'
  | 'duplicate' | 'answered' | 'not-answering' | 'defended' | 'defence-rate-limited' | 'lost'
  | 'reannounced' | 'retimed' | 'stopped';

export interface NdpStep {
  readonly state: NdpState;
  readonly actions: readonly NdpAction[];
  readonly reason: NdpReason;
}

/**
 * The state of one address before start. The group is the address's own
 * solicited-node group, whatever other addresses the interface has and in
 * whatever order (MetalLB#2685, Cilium#44311).
 */
export function initialNdpState(ip: bigint, mac: string, nonce?: string): NdpState {
  const group = solicitedNodeAddress(ip);
  return {
    phase: 'idle', ip, mac: mac.toLowerCase(), group, groupMac: ipv6MulticastMac(group), nonce: nonce?.toLowerCase(),
    probesSent: 0, deadline: undefined, burstLeft: 0, lastConflictAt: undefined, lastDefendAt: undefined,
    conflictingMac: undefined, duplicateReason: undefined,
  };
}

/** After an advertisement at `now`: the rest of the burst, else the refresh, else nothing. */
function schedule(s: NdpState, now: number, cfg: NdpOwnerConfig, actions: NdpAction[]): NdpState {
  let at: number | undefined;
  if (s.burstLeft > 0) at = now + cfg.announceIntervalMs;
  else if (cfg.refreshMs > 0) at = now + cfg.refreshMs;
  actions.push(at === undefined ? { type: 'clear-timer' } : { type: 'arm-timer', at });
  return { ...s, deadline: at };
}

function advertise(s: NdpState, reason: NdpSendReason, actions: NdpAction[]): void {
  actions.push({ type: 'send', reason, packet: ndpUnsolicitedAdvertisement(s.mac, s.ip) });
}

/** One advertisement of a new burst of announceNum (at least one) now. */
function burst(s: NdpState, now: number, cfg: NdpOwnerConfig, reason: NdpSendReason, actions: NdpAction[]): NdpState {
  advertise(s, reason, actions);
  return schedule({ ...s, phase: 'held', burstLeft: Math.max(1, Math.floor(cfg.announceNum)) - 1 }, now, cfg, actions);
}

function probe(s: NdpState, now: number, cfg: NdpOwnerConfig, actions: NdpAction[]): NdpState {
  const at = now + cfg.retransTimerMs;
  actions.push({ type: 'send', reason: 'dad-probe', packet: ndpDadProbe(s.mac, s.ip, s.nonce) }, { type: 'arm-timer', at });
  return { ...s, phase: 'tentative', probesSent: s.probesSent + 1, deadline: at };
}

/** The MAC a packet claims for `ip`, if it claims it at all: as its target (an advertisement) or as its source. */
function claimOf(p: NdpPacket, ip: bigint): string | undefined {
  if (p.kind === 'advertisement' && p.target === ip) return p.targetMac ?? p.ethSrc;
  if (p.src === ip) return p.kind === 'solicitation' ? (p.sourceMac ?? p.ethSrc) : p.ethSrc;
  return undefined;
}

function onTentative(s: NdpState, p: NdpPacket, actions: NdpAction[]): NdpStep {
  let reason: NdpDuplicateReason | undefined;
  let mac = p.ethSrc;
  if (p.kind === 'advertisement' && p.target === s.ip) {
    reason = 'advertised';
    mac = p.targetMac ?? p.ethSrc;
  } else if (isDadProbe(p) && p.target === s.ip) {
    reason = 'probed';
  } else if (p.src === s.ip) {
    reason = 'in-use';
    mac = claimOf(p, s.ip) ?? p.ethSrc;
  } else if (p.kind === 'solicitation' && p.target === s.ip) {
    // §5.4.3: a tentative address answers no resolution.
    return { state: s, actions, reason: 'resolution-for-tentative' };
  }
  if (!reason) return { state: s, actions, reason: 'unrelated' };
  // §5.4.5: the address is a duplicate: not assigned, and we stop listening for it.
  actions.push({ type: 'clear-timer' }, { type: 'leave', group: s.group, mac: s.groupMac }, { type: 'duplicate', mac, reason });
  return {
    state: { ...s, phase: 'duplicate', deadline: undefined, conflictingMac: mac, duplicateReason: reason },
    actions,
    reason: 'duplicate',
  };
}

function onHeld(s: NdpState, p: NdpPacket, now: number, cfg: NdpOwnerConfig, actions: NdpAction[]): NdpStep {
  const claim = claimOf(p, s.ip);
  if (claim === undefined || claim === s.mac) {
    if (p.kind === 'solicitation' && p.target === s.ip) {
      // RFC 4861 §7.2.3, §7.2.4: answer, to the sender or (a DAD probe) to all-nodes.
      if (!cfg.answerSolicitations) return { state: s, actions, reason: 'not-answering' };
      actions.push({ type: 'send', reason: 'answer', packet: ndpSolicitedAdvertisement(s.mac, s.ip, p) });
      return { state: s, actions, reason: 'answered' };
    }
    return { state: s, actions, reason: claim === undefined ? 'unrelated' : 'own-frame' };
  }
  // Another MAC claims the address. (b) counts conflicts within the
  // interval, (c) counts defences.
  const since = cfg.giveUp ? s.lastConflictAt : s.lastDefendAt;
  const repeated = since !== undefined && now - since < cfg.defendIntervalMs;
  if (!repeated) {
    // One unsolicited advertisement with override puts every cache back; the refresh restarts from it.
    advertise(s, 'defend', actions);
    actions.push({ type: 'defended', mac: claim });
    const next = schedule({ ...s, lastConflictAt: now, lastDefendAt: now, conflictingMac: claim, burstLeft: 0 }, now, cfg, actions);
    return { state: next, actions, reason: 'defended' };
  }
  if (!cfg.giveUp) {
    actions.push({ type: 'conflict', mac: claim });
    return { state: { ...s, lastConflictAt: now, conflictingMac: claim }, actions, reason: 'defence-rate-limited' };
  }
  actions.push({ type: 'clear-timer' }, { type: 'leave', group: s.group, mac: s.groupMac }, { type: 'lost', mac: claim });
  return { state: { ...s, phase: 'lost', lastConflictAt: now, conflictingMac: claim, burstLeft: 0, deadline: undefined }, actions, reason: 'lost' };
}

export function ndpStep(state: NdpState, event: NdpEvent, now: number, cfg: NdpOwnerConfig): NdpStep {
  const actions: NdpAction[] = [];
  const same = (reason: NdpReason): NdpStep => ({ state, actions, reason });
  const running = state.phase === 'tentative' || state.phase === 'held';
  switch (event.type) {
    case 'start': {
      if (running) return same('already-started');
      const fresh: NdpState = {
        ...state, probesSent: 0, burstLeft: 0, deadline: undefined,
        lastConflictAt: undefined, lastDefendAt: undefined, conflictingMac: undefined, duplicateReason: undefined,
      };
      // RFC 4862 §5.4.2: join the solicited-node group before the first probe,
      // so a probe or an answer from another node is heard.
      actions.push({ type: 'join', group: state.group, mac: state.groupMac });
      if (cfg.dadTransmits <= 0) return { state: burst(fresh, now, cfg, 'burst', actions), actions, reason: 'started' };
      return { state: probe(fresh, now, cfg, actions), actions, reason: 'probing' };
    }
    case 'timer': {
      if (!running) return same('not-running');
      if (state.deadline === undefined) return same('no-advertisement-due');
      // A timer may fire a little early (libuv caches loop time): re-arm.
      if (now < state.deadline) {
        actions.push({ type: 'arm-timer', at: state.deadline });
        return { state, actions, reason: 'early-timer' };
      }
      if (state.phase === 'tentative') {
        if (state.probesSent < cfg.dadTransmits) return { state: probe(state, now, cfg, actions), actions, reason: 'probe-sent' };
        // §5.4: RetransTimer after the last probe and nobody objected.
        actions.push({ type: 'unique' });
        return { state: burst(state, now, cfg, 'burst', actions), actions, reason: 'unique' };
      }
      const inBurst = state.burstLeft > 0;
      advertise(state, inBurst ? 'burst' : 'refresh', actions);
      const next = schedule({ ...state, burstLeft: inBurst ? state.burstLeft - 1 : 0 }, now, cfg, actions);
      return { state: next, actions, reason: inBurst ? 'burst' : 'refresh' };
    }
    case 'ndp': {
      if (!running) return same('not-running');
      const p = event.packet;
      if (p.ethSrc.toLowerCase() === state.mac) return same('own-frame');
      // RFC 7527 §4.2: a probe carrying our nonce is our own, looped back.
      if (state.nonce !== undefined && p.kind === 'solicitation' && p.nonce === state.nonce) return same('own-frame');
      if (state.phase === 'tentative') return onTentative(state, p, actions);
      return onHeld(state, p, now, cfg, actions);
    }
    case 'reannounce': {
      if (state.phase !== 'held') return same('not-running');
      return { state: burst(state, now, cfg, 'reannounce', actions), actions, reason: 'reannounced' };
    }
    case 'retime': {
      // A burst under way finishes first; its last advertisement schedules the new refresh.
      if (state.phase !== 'held' || state.burstLeft > 0) return same('not-running');
      return { state: schedule(state, now, cfg, actions), actions, reason: 'retimed' };
    }
    case 'stop': {
      if (!running) return { state: { ...state, phase: 'idle' }, actions, reason: 'not-running' };
      // Withdrawal sends nothing: an advertisement now (without override, or
      // for another MAC) would only point caches somewhere wrong; they age out
      // or the new holder's burst overrides them.
      actions.push({ type: 'clear-timer' }, { type: 'leave', group: state.group, mac: state.groupMac });
      return { state: { ...state, phase: 'idle', burstLeft: 0, deadline: undefined }, actions, reason: 'stopped' };
    }
  }
}

