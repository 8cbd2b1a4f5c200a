// RFC 5227 IPv4 address conflict detection: a pure probe state machine
// (state, event, now) -> (state, actions), the §2.4 defence verdict, and thin
// drivers over a packet socket: probeAddress (§2.1) and a one-off announce
// (§2.3). Holding an address (burst, defence, refresh) is vip-owner.ts's.
// Time comes from an injected Clock and randomness from an injected source,
// so the whole probe runs in microseconds under test.
import type { Clock, TimerHandle } from '../../clock';
import { realClock } from '../../clock';
import type { ArpTimings } from '../../config/types';
import { formatIPv4, parseIPv4, parseMac } from '../../address';
import type { Logger } from '../../log';
import { silentLogger } from '../../log';
import { arpAnnouncement, arpProbe, decodeArp, encodeArp, isArpProbe, type ArpPacket } from './arp';
import { bpfArp, bpfArpAbout } from '../packet/bpf';
import type { NetMetrics } from '../metrics';
import { ETH_P_ARP, openPacketSocket, type PacketSocket } from '../packet/packet';

/** RFC 5227 §1.1 DEFEND_INTERVAL: 10 s between defences of one address. */
export const DEFEND_INTERVAL_MS = 10_000;

// ---------------------------------------------------------------------------
// Pure core

export type ProbePhase = 'idle' | 'waiting' | 'probing' | 'announce-wait' | 'free' | 'conflict';

export interface ProbeState {
  readonly phase: ProbePhase;
  /** The candidate address (u32). */
  readonly ip: number;
  /** Our hardware address, lower-case. */
  readonly mac: string;
  readonly probesSent: number;
  /** When the pending timer is due (ms on the injected clock), if any. */
  readonly deadline: number | undefined;
  readonly conflictingMac: string | undefined;
}

export type ProbeEvent = { type: 'start' } | { type: 'timer' } | { type: 'arp'; packet: ArpPacket };

export type ProbeAction =
  | { type: 'send-probe' }
  | { type: 'arm-timer'; at: number }
  | { type: 'finished'; conflict: false }
  | { type: 'finished'; conflict: true; mac: string };

/** Why an event did (or did not) change anything: for logs and tests. */
export type ProbeReason =
  | 'started'
  | 'probe-sent'
  | 'probe-wait-over'
  | 'address-free'
  | 'conflict-sender-ip'
  | 'conflict-probe'
  | 'own-frame'
  | 'unrelated'
  | 'not-running'
  | 'early-timer';

export interface ProbeStep {
  readonly state: ProbeState;
  readonly actions: readonly ProbeAction[];
  readonly reason: ProbeReason;
}

export function initialProbeState(ip: number, mac: string): ProbeState {
  return { phase: 'idle', ip, mac: mac.toLowerCase(), probesSent: 0, deadline: undefined, conflictingMac: undefined };
}

function uniform(random: () => number, minMs: number, maxMs: number): number {
  return minMs + random() * Math.max(0, maxMs - minMs);
}

/**
 * Advance the probe. `random` returns [0, 1). Events that do not apply in the
 * current phase leave the state as it is.
 */
export function probeStep(state: ProbeState, event: ProbeEvent, now: number, timings: ArpTimings, random: () => number): ProbeStep {
  const same = (reason: ProbeReason): ProbeStep => ({ state, actions: [], reason });
  const running = state.phase === 'waiting' || state.phase === 'probing' || state.phase === 'announce-wait';

  switch (event.type) {
    case 'start': {
      if (state.phase !== 'idle') return same('not-running');
      if (timings.probeNum <= 0) {
        return { state: { ...state, phase: 'free' }, actions: [{ type: 'finished', conflict: false }], reason: 'address-free' };
      }
      // §2.1.1: wait a random time in [0, PROBE_WAIT] so hosts powered on
      // together do not probe in lockstep.
      const at = now + uniform(random, 0, timings.probeWait * 1000);
      return { state: { ...state, phase: 'waiting', deadline: at }, actions: [{ type: 'arm-timer', at }], reason: 'started' };
    }

    case 'timer': {
      if (!running) return same('not-running');
      // Real timers can fire a little before the clock reaches the deadline
      // (libuv caches loop time): re-arm instead of acting early or stalling.
      if (state.deadline !== undefined && now < state.deadline) {
        return { state, actions: [{ type: 'arm-timer', at: state.deadline }], reason: 'early-timer' };
      }
      if (state.phase === 'announce-wait') {
        // §2.1.1: no conflict until ANNOUNCE_WAIT after the last probe.
        return { state: { ...state, phase: 'free', deadline: undefined }, actions: [{ type: 'finished', conflict: false }], reason: 'address-free' };
      }
      const probesSent = state.probesSent + 1;
      // §2.1.1: PROBE_NUM probes spaced uniformly PROBE_MIN..PROBE_MAX apart,
      // then ANNOUNCE_WAIT after the last one.
      const last = probesSent >= timings.probeNum;
      const at = last
        ? now + timings.announceWait * 1000
        : now + uniform(random, timings.probeMin * 1000, timings.probeMax * 1000);
      return {
        state: { ...state, phase: last ? 'announce-wait' : 'probing', probesSent, deadline: at },
        actions: [{ type: 'send-probe' }, { type: 'arm-timer', at }],
        reason: state.phase === 'waiting' ? 'probe-wait-over' : 'probe-sent',
      };
    }

    case 'arp': {
      if (!running) return same('not-running');
      const p = event.packet;
      const from = p.senderMac.toLowerCase();
      if (from === state.mac) return same('own-frame');
      // §2.1.1: any ARP packet (request or reply) whose sender IP is the
      // candidate means another host uses it.
      let reason: ProbeReason | undefined;
      if (p.senderIp === state.ip) reason = 'conflict-sender-ip';
      // §2.1.1: an ARP Probe for the same address from another host means it
      // is probing for it at the same time: both must back off.
      else if (isArpProbe(p) && p.targetIp === state.ip) reason = 'conflict-probe';
      if (!reason) return same('unrelated');
      return {
        state: { ...state, phase: 'conflict', deadline: undefined, conflictingMac: from },
        actions: [{ type: 'finished', conflict: true, mac: from }],
        reason,
      };
    }
  }
}

/** Decision of a defender about one received ARP packet (RFC 5227 §2.4). */
export type DefenseVerdict =
  | { verdict: 'ignore'; reason: 'own-frame' | 'not-held' | 'probe-for-held' }
  | { verdict: 'conflict'; ip: number; mac: string; defend: boolean; reason: 'first-in-interval' | 'repeated-within-interval' | 'defence-off' };

/**
 * §2.4: a packet whose sender IP is an address we hold, from another MAC, is
 * a conflict. Per option (b) we defend with one announcement unless we
 * already saw a conflict for that address within DEFEND_INTERVAL; after that
 * the owner should give the address up, which is its decision, not ours.
 * A probe (sender IP 0) for a held address is not a conflict: the kernel
 * answers it and the prober backs off.
 */
export function defenseVerdict(
  held: ReadonlySet<number>,
  ownMac: string,
  packet: ArpPacket,
  lastConflictAt: number | undefined,
  now: number,
  opts: { defend: boolean; defendIntervalMs: number },
): DefenseVerdict {
  const from = packet.senderMac.toLowerCase();
  if (from === ownMac.toLowerCase()) return { verdict: 'ignore', reason: 'own-frame' };
  if (!held.has(packet.senderIp)) {
    if (isArpProbe(packet) && held.has(packet.targetIp)) return { verdict: 'ignore', reason: 'probe-for-held' };
    return { verdict: 'ignore', reason: 'not-held' };
  }
  if (!opts.defend) return { verdict: 'conflict', ip: packet.senderIp, mac: from, defend: false, reason: 'defence-off' };
  const repeated = lastConflictAt !== undefined && now - lastConflictAt < opts.defendIntervalMs;
  return { verdict: 'conflict', ip: packet.senderIp, mac: from, defend: !repeated, reason: repeated ? 'repeated-within-interval' : 'first-in-interval' };
}

// ---------------------------------------------------------------------------
// Drivers

export function ipNumber(ip: string | number): number {
  if (typeof ip === 'number') {
    if (!Number.isInteger(ip) || ip < 0 || ip > 0xffffffff) throw new TypeError(`not an IPv4 address: ${ip}`);
    return ip;
  }
  const n = parseIPv4(ip);
  if (n === undefined) throw new TypeError(`not an IPv4 address: ${ip}`);
  return n;
}

export function macString(mac: string): string {
  if (!parseMac(mac)) throw new TypeError(`not a MAC address: ${mac}`);
  return mac.toLowerCase();
}

export interface SocketSource {
  /** Use this socket (not closed at the end). */
  socket?: PacketSocket;
  /** Or open an ARP socket on this interface for the duration. */
  ifindex?: number;
}

/** The caller's socket, or an ARP socket of its own that passes only frames about `about` (bpfArpAbout) when given. */
export function acquireSocket(src: SocketSource, metrics: NetMetrics | undefined, log: Logger, about?: number): { socket: PacketSocket; owned: boolean } {
  if (src.socket) return { socket: src.socket, owned: false };
  if (src.ifindex === undefined) throw new TypeError('either socket or ifindex is required');
  const filter = about === undefined ? bpfArp() : bpfArpAbout(about);
  return { socket: openPacketSocket({ ifindex: src.ifindex, protocol: ETH_P_ARP, filter, metrics, log }), owned: true };
}

/** Decode a frame for an ARP consumer, counting what is dropped. */
export function arpFromFrame(frame: Buffer, metrics: NetMetrics | undefined): ArpPacket | undefined {
  const r = decodeArp(frame);
  if (r.ok) return r.packet;
  // On a shared ETH_P_ALL socket most frames are simply not ARP: not a drop.
  if (r.reason !== 'not-arp') metrics?.framesDropped.inc({ reason: r.reason });
  return undefined;
}

export interface ProbeOptions extends SocketSource {
  /** Our hardware address: the source of the probes, and never a conflict. */
  mac: string;
  ip: string | number;
  timings: ArpTimings;
  clock?: Clock;
  random?: () => number;
  log?: Logger;
  metrics?: NetMetrics;
}

export interface ProbeResult {
  conflict: boolean;
  conflictingMac?: string;
}

/**
 * RFC 5227 §2.1: probe whether `ip` is in use on the link. Resolves with
 * the verdict after PROBE_WAIT + probes + ANNOUNCE_WAIT (about 5-7 s with the
 * defaults), or as soon as a conflict is seen. Rejects with LbError when the
 * socket cannot be opened or a probe cannot be sent; nothing is left open.
 */
export function probeAddress(opts: ProbeOptions): Promise<ProbeResult> {
  const clock = opts.clock ?? realClock;
  const random = opts.random ?? Math.random;
  const mac = macString(opts.mac);
  const ip = ipNumber(opts.ip);
  const log = (opts.log ?? silentLogger()).child({ module: 'net/arp-probe', op: 'probe', ip: formatIPv4(ip) });
  const metrics = opts.metrics;

  return new Promise<ProbeResult>((resolve, reject) => {
    let sock: { socket: PacketSocket; owned: boolean };
    try {
      sock = acquireSocket(opts, metrics, log, ip);
    } catch (err) {
      reject(err);
      return;
    }
    let state = initialProbeState(ip, mac);
    let timer: TimerHandle | undefined;
    let finished = false;

    const cleanup = (): void => {
      finished = true;
      if (timer !== undefined) clock.clearTimeout(timer);
      timer = undefined;
      sock.socket.off('frame', onFrame);
      if (sock.owned) sock.socket.close();
    };

    const feed = (event: ProbeEvent): void => {
      if (finished) return;
      const step = probeStep(state, event, clock.now(), opts.timings, random);
      state = step.state;
      for (const action of step.actions) {
        switch (action.type) {
          case 'send-probe':
            try {
              sock.socket.send(encodeArp(arpProbe(mac, ip)));
            } catch (err) {
              cleanup();
              reject(err);
              return;
            }
            metrics?.arpProbes.inc();
            log.debug({ probe: state.probesSent }, 'ARP probe sent');
            break;
          case 'arm-timer':
            if (timer !== undefined) clock.clearTimeout(timer);
            timer = clock.setTimeout(() => { timer = undefined; feed({ type: 'timer' }); }, Math.max(0, Math.ceil(action.at - clock.now())));
            break;
          case 'finished':
            cleanup();
            if (action.conflict) {
              metrics?.arpConflicts.inc({ phase: 'probe' });
              log.warn({ conflictingMac: action.mac, reason: step.reason }, 'address in use by another host');
              resolve({ conflict: true, conflictingMac: action.mac });
            } else {
              log.debug('address is free');
              resolve({ conflict: false });
            }
            return;
        }
      }
    };

    function onFrame(frame: Buffer): void {
      const packet = arpFromFrame(frame, metrics);
      if (packet) feed({ type: 'arp', packet });
    }

    sock.socket.on('frame', onFrame);
    feed({ type: 'start' });
  });
}

export interface AnnounceOptions extends SocketSource {
  mac: string;
  ip: string | number;
  /** How many announcements (RFC 5227 ANNOUNCE_NUM = 2). */
  count: number;
  /** Spacing in ms (RFC 5227 ANNOUNCE_INTERVAL = 2000). */
  intervalMs: number;
  clock?: Clock;
  log?: Logger;
  metrics?: NetMetrics;
}

/**
 * RFC 5227 §2.3: a burst of `count` ARP Announcements (gratuitous ARP),
 * the first at once, so switches and neighbours learn where the address
 * lives now (a VIP that came up or moved here).
 */
export function announce(opts: AnnounceOptions): Promise<void> {
  const clock = opts.clock ?? realClock;
  const mac = macString(opts.mac);
  const ip = ipNumber(opts.ip);
  const log = (opts.log ?? silentLogger()).child({ module: 'net/arp-probe', op: 'announce', ip: formatIPv4(ip) });
  const frame = encodeArp(arpAnnouncement(mac, ip));
  const count = Math.max(0, Math.floor(opts.count));

  return new Promise<void>((resolve, reject) => {
    if (count === 0) { resolve(); return; }
    let sock: { socket: PacketSocket; owned: boolean };
    try {
      sock = acquireSocket(opts, opts.metrics, log);
    } catch (err) {
      reject(err);
      return;
    }
    let sent = 0;
    const tick = (): void => {
      try {
        sock.socket.send(frame);
      } catch (err) {
        if (sock.owned) sock.socket.close();
        reject(err);
        return;
      }
      sent++;
      opts.metrics?.gratuitousArpsSent.inc();
      if (sent >= count) {
        if (sock.owned) sock.socket.close();
        log.debug({ count }, 'gratuitous ARPs sent');
        resolve();
        return;
      }
      clock.setTimeout(tick, opts.intervalMs);
    };
    tick();
  });
}
