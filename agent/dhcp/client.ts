// DHCP client state machine (pure): RFC 2131 §4.4 as a function of
// (state, event, now) returning the next state and the actions a driver
// performs (send, setTimer, probe, bind, unbind, persist, ...). No I/O, no
// timers, no clock: `now` is passed in and randomness (xids, jitter) comes
// from the injected source, so a 12-hour lease is tested in milliseconds.
//
// States are RFC 2131 figure 5's, with INIT-REBOOT covering REBOOTING too
// (a REQUEST for the saved address is outstanding) and STOPPED for a client
// that is not running. After an ACK in REQUESTING or INIT-REBOOT the client
// ARP-probes the address before binding (§4.4.1, RFC 5227); the driver
// reports the verdict as probe-ok / probe-conflict / probe-failed.
import { isoTime } from '../clock';
import type { ClientMessageSpec, DhcpPacket } from './codec';
import { formatIPv4 } from '../address';
import { leaseFromAck, type Lease } from './lease';

export type DhcpStateName = 'INIT' | 'SELECTING' | 'REQUESTING' | 'BOUND' | 'RENEWING' | 'REBINDING' | 'INIT-REBOOT' | 'STOPPED';
export const DHCP_STATES: readonly DhcpStateName[] = ['INIT', 'SELECTING', 'REQUESTING', 'BOUND', 'RENEWING', 'REBINDING', 'INIT-REBOOT', 'STOPPED'];

export interface ClientConfig {
  /** loadBalancerIP: asked for (option 50) in every DISCOVER. */
  readonly requestedIp: number | undefined;
  /** ARP-probe an ACKed address before binding (DhcpTimings.probeOffer). */
  readonly probe: boolean;
  /** RFC 2131 §4.1: 4 s, doubling to 64 s, ±1 s. */
  readonly retransmitInitialMs: number;
  readonly retransmitMaxMs: number;
  readonly retransmitJitterMs: number;
  /** RFC 2131 §3.1.5: wait after a DHCPDECLINE (10 s). */
  readonly declineWaitMs: number;
}

export interface ClientState {
  readonly name: DhcpStateName;
  /** Transaction id of the current exchange. */
  readonly xid: number;
  /** Messages sent in the current exchange (1 = the first, no retransmission yet). */
  readonly attempts: number;
  /** When the current exchange began: the secs field counts from here (RFC 2131 §2). */
  readonly exchangeStart: number;
  /** When acquisition began (first DISCOVER or INIT-REBOOT REQUEST): DISCOVER-to-ACK duration. */
  readonly acquireStart: number | undefined;
  /** When the current REQUEST was first sent: lease times count from here (§4.4.1). */
  readonly requestSentAt: number | undefined;
  /** When to retransmit, if a reply is awaited. */
  readonly nextSendAt: number | undefined;
  /** INIT only: when to send the first DISCOVER (after a DECLINE or NAK back-off). */
  readonly waitUntil: number | undefined;
  /** REQUESTING: the OFFER being requested. */
  readonly offer: { readonly address: number; readonly serverId: number } | undefined;
  /** An ACKed lease being ARP-probed before it is bound. */
  readonly probing: Lease | undefined;
  /** Whether `probing` was confirmed by a server (false: the saved lease, used when no server answered INIT-REBOOT). */
  readonly probingConfirmed: boolean;
  /** The bound lease (BOUND, RENEWING, REBINDING). */
  readonly lease: Lease | undefined;
  /** A saved lease not yet confirmed (INIT-REBOOT). */
  readonly saved: Lease | undefined;
  /**
   * INIT-REBOOT only: an address already on the LAN that no server has
   * confirmed to us yet (a VRRP takeover serving the previous Master's
   * advertised VIP). An ACK makes it a lease; a NAK, another address or
   * silence takes it off.
   */
  readonly provisional: number | undefined;
  /** An address to ask for again in DISCOVER (the last one held), unless declined or NAKed. */
  readonly hint: number | undefined;
  /** Addresses declined since the last binding: never asked for again (a server that does not check would hand them out again). */
  readonly declined: readonly number[];
  /** DHCPNAKs to our REQUEST for an offer since the last binding: the first ones restart at once, later ones back off (nakDelay). */
  readonly naks: number;
  /** The one pending timer, if any. */
  readonly timerAt: number | undefined;
}

export type ClientEvent =
  /**
   * `resume`: serve the saved lease at once and confirm it in the background
   * (crash-only start: the address never left our macvlan; VRRP takeover: the
   * election decided who holds it). Only an unexpired saved lease resumes.
   * `known` (with `resume`, when no unexpired lease was saved here): the VIP
   * the previous VRRP Master advertised for this service. Every VM derives
   * the same client identifier for a service, so the server's lease for it
   * is this client's lease too: the address is served at once and confirmed
   * with an INIT-REBOOT REQUEST for it (RFC 2131 §3.2), like a saved lease
   * whose times we do not know.
   */
  | { readonly type: 'start'; readonly saved?: Lease | undefined; readonly resume?: boolean; readonly known?: number | undefined }
  | { readonly type: 'timer' }
  | { readonly type: 'reply'; readonly packet: DhcpPacket; readonly serverMac: string }
  | { readonly type: 'probe-ok' }
  | { readonly type: 'probe-conflict'; readonly mac?: string | undefined }
  | { readonly type: 'probe-failed'; readonly error: string }
  /**
   * Another host insists on the bound address (RFC 5227 §2.4: a second
   * conflicting ARP within DEFEND_INTERVAL, reported by net/vip-owner).
   */
  | { readonly type: 'conflict'; readonly address: number; readonly mac?: string | undefined }
  /** The service was removed: DHCPRELEASE (RFC 2131 §4.4.6), then stop. */
  | { readonly type: 'release' }
  /** Shutdown or failover: withdraw the VIP, keep the lease, send nothing. */
  | { readonly type: 'stop' };

export type Destination = { readonly kind: 'broadcast' } | { readonly kind: 'unicast'; readonly ip: number; readonly mac: string | undefined };

export type UnbindCause = 'expired' | 'nak' | 'released' | 'stopped' | 'address-changed' | 'conflict' | 'unconfirmed';

export type Note = 'acquired' | 'resumed' | 'renewed' | 'renewing' | 'rebinding' | 'nak' | 'declined' | 'expired' | 'request-timeout' | 'reboot-timeout';

export type ClientAction =
  /** Send a message; `srcIp` is the IP source (0 before an address is held, §4.1). */
  | { readonly type: 'send'; readonly message: ClientMessageSpec; readonly to: Destination; readonly srcIp: number }
  /** (Re)arm the single timer; fire a 'timer' event at `at`. */
  | { readonly type: 'setTimer'; readonly at: number }
  | { readonly type: 'clearTimer' }
  /** ARP-probe the address (RFC 5227 §2.1) and report probe-ok / probe-conflict / probe-failed. */
  | { readonly type: 'probe'; readonly ip: number }
  /** Put the address on the LAN. */
  | { readonly type: 'bind'; readonly lease: Lease }
  /** Put an address on the LAN before a server confirmed it (ClientState.provisional); a bind or an unbind follows. */
  | { readonly type: 'hold'; readonly address: number }
  /** Withdraw the address; `at` is when it happened (for expiry: the expiry time). */
  | { readonly type: 'unbind'; readonly address: number; readonly cause: UnbindCause; readonly at: number; readonly detail?: string }
  | { readonly type: 'persist'; readonly lease: Lease }
  /** Delete the saved lease. */
  | { readonly type: 'forget' }
  /** Something worth counting or logging; `ms` for 'acquired' is DISCOVER (or INIT-REBOOT) to ACK. */
  | { readonly type: 'note'; readonly what: Note; readonly ms?: number; readonly detail?: string };

/** Why a step did what it did: for logs and tests. */
export type StepReason =
  | 'started' | 'resumed' | 'already-running' | 'not-running'
  | 'early-timer' | 'retransmit' | 'request-timeout' | 'reboot-timeout' | 'init-wait-over'
  | 'renew' | 'rebind' | 'expired'
  | 'offer' | 'ack' | 'nak' | 'renewed' | 'address-changed'
  | 'wrong-xid' | 'wrong-server' | 'unexpected-reply' | 'offer-without-server-id' | 'ack-without-lease'
  | 'probe-ok' | 'probe-conflict' | 'probe-failed' | 'no-probe-pending'
  | 'conflict' | 'not-bound' | 'stale-conflict'
  | 'released' | 'stopped';

export interface StepResult {
  readonly state: ClientState;
  readonly actions: readonly ClientAction[];
  readonly reason: StepReason;
}

export interface ClientContext {
  readonly config: ClientConfig;
  /** [0, 1): xids and jitter. */
  readonly random: () => number;
}

export function initialState(): ClientState {
  return {
    name: 'STOPPED', xid: 0, attempts: 0, exchangeStart: 0, acquireStart: undefined, requestSentAt: undefined,
    nextSendAt: undefined, waitUntil: undefined, offer: undefined, probing: undefined, probingConfirmed: false,
    lease: undefined, saved: undefined, provisional: undefined, hint: undefined, declined: [], naks: 0, timerAt: undefined,
  };
}

function newXid(random: () => number): number {
  return Math.floor(random() * 0x100000000) >>> 0;
}

/**
 * RFC 2131 §4.1: the n-th retransmission waits 4 s x 2^n up to 64 s,
 * randomised by ±1 s (all from the config). Never negative.
 */
export function retransmitDelay(cfg: ClientConfig, attempt: number, random: () => number): number {
  const nominal = Math.min(cfg.retransmitInitialMs * 2 ** Math.max(0, attempt - 1), cfg.retransmitMaxMs);
  return Math.max(0, nominal + (2 * random() - 1) * cfg.retransmitJitterMs);
}

/** DHCPNAKs of REQUESTs for offers, in a row since the last binding, answered with an immediate DISCOVER (nakDelay). */
export const NAKS_WITHOUT_WAIT = 2;

/**
 * How long to wait before the next DISCOVER after the `naks`-th DHCPNAK of a
 * REQUEST for an offer since the last binding. RFC 2131 §3.1 step 5 and
 * §4.4.1 restart the configuration process on a NAK, with no wait. The usual
 * cause is benign: a server that keeps no record of its
 * outstanding offers (dnsmasq picks a free address from a hash of the MAC
 * and leases it only when the REQUEST comes) offers one address to two
 * clients starting together and NAKs the later REQUEST, "address in use";
 * the next DISCOVER gets a free address within a round trip. Waiting a
 * retransmission interval there put 4 s on 50 services starting at once.
 * Two in a row happen too: dnsmasq scans on from the taken address to the
 * next free one, which may be on offer to a third client. A server that NAKs
 * whatever it offers must still not make us loop, so from the third NAK on
 * the client backs off retransmitInitial, doubling up to retransmitMax
 * (dhcpcd's `nakoff` is alike: 0, 1, 2, 4, ... 60 s).
 */
export function nakDelay(cfg: ClientConfig, naks: number): number {
  if (naks <= NAKS_WITHOUT_WAIT) return 0;
  return Math.min(cfg.retransmitInitialMs * 2 ** (naks - NAKS_WITHOUT_WAIT - 1), cfg.retransmitMaxMs);
}

/** The retransmission algorithm is exhausted once a message sent at the ceiling went unanswered (§4.4.1). */
function exhausted(cfg: ClientConfig, attempts: number): boolean {
  return cfg.retransmitInitialMs * 2 ** Math.max(0, attempts - 1) >= cfg.retransmitMaxMs;
}

/**
 * RFC 2131 §4.4.5: in RENEWING and REBINDING, retransmit after half the
 * remaining time (to T2, or to expiry), down to a minimum of 60 s. The minimum
 * is capped at retransmitMax so shortened test timings shorten it too.
 */
function renewRetryAt(cfg: ClientConfig, now: number, until: number): number {
  const floor = Math.min(60_000, cfg.retransmitMaxMs);
  return now + Math.max(floor, (until - now) / 2);
}

/** Whether the client has been asking without an answer long enough that status should say so. */
export function isStalled(state: ClientState, cfg: ClientConfig): boolean {
  return state.name === 'SELECTING' && exhausted(cfg, state.attempts);
}

/** How many declined addresses are remembered (bounded state). */
const MAX_DECLINED = 8;

const secsSince = (now: number, start: number): number => Math.max(0, Math.floor((now - start) / 1000));

function withTimer(state: ClientState, actions: ClientAction[], at: number | undefined): StepResult['state'] {
  if (at === undefined || !Number.isFinite(at)) {
    actions.push({ type: 'clearTimer' });
    return { ...state, timerAt: undefined };
  }
  actions.push({ type: 'setTimer', at });
  return { ...state, timerAt: at };
}

function result(state: ClientState, actions: ClientAction[], reason: StepReason): StepResult {
  return { state, actions, reason };
}

// --- entering states --------------------------------------------------------

/** INIT: send DISCOVER now (-> SELECTING), or wait until `waitUntil` first. */
function enterInit(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[], opts: { hint: number | undefined; waitUntil?: number; keepAcquireStart?: boolean }): ClientState {
  const base: ClientState = {
    ...s, name: 'INIT', offer: undefined, probing: undefined, probingConfirmed: false, lease: undefined, saved: undefined, provisional: undefined,
    hint: opts.hint, nextSendAt: undefined, requestSentAt: undefined, attempts: 0,
    acquireStart: opts.keepAcquireStart ? s.acquireStart ?? now : now,
  };
  if (opts.waitUntil !== undefined && opts.waitUntil > now) {
    return withTimer({ ...base, waitUntil: opts.waitUntil }, actions, opts.waitUntil);
  }
  return sendDiscover(ctx, { ...base, waitUntil: undefined }, now, actions, true);
}

function sendDiscover(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[], fresh: boolean): ClientState {
  const xid = fresh ? newXid(ctx.random) : s.xid;
  const exchangeStart = fresh ? now : s.exchangeStart;
  const attempts = fresh ? 1 : s.attempts + 1;
  // Option 50: loadBalancerIP, else the address held last - unless it was found in use.
  const requestedIp = [ctx.config.requestedIp, s.hint].find((a) => a !== undefined && !s.declined.includes(a));
  actions.push({
    type: 'send',
    message: { kind: 'DISCOVER', xid, secs: secsSince(now, exchangeStart), ciaddr: 0, requestedIp, serverId: undefined },
    to: { kind: 'broadcast' },
    srcIp: 0,
  });
  const nextSendAt = now + retransmitDelay(ctx.config, attempts, ctx.random);
  return withTimer({ ...s, name: 'SELECTING', xid, exchangeStart, attempts, nextSendAt, waitUntil: undefined }, actions, nextSendAt);
}

function sendSelectingRequest(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[]): ClientState {
  const offer = s.offer!;
  const attempts = s.attempts + 1;
  actions.push({
    type: 'send',
    message: { kind: 'REQUEST', xid: s.xid, secs: secsSince(now, s.exchangeStart), ciaddr: 0, requestedIp: offer.address, serverId: offer.serverId },
    to: { kind: 'broadcast' },
    srcIp: 0,
  });
  const nextSendAt = now + retransmitDelay(ctx.config, attempts, ctx.random);
  return withTimer({ ...s, attempts, nextSendAt }, actions, nextSendAt);
}

function sendRebootRequest(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[]): ClientState {
  const attempts = s.attempts + 1;
  actions.push({
    type: 'send',
    // §4.4.2 / table 5: INIT-REBOOT: ciaddr 0, option 50 = the saved address, no server id; broadcast.
    message: { kind: 'REQUEST', xid: s.xid, secs: secsSince(now, s.exchangeStart), ciaddr: 0, requestedIp: (s.saved?.address ?? s.provisional)!, serverId: undefined },
    to: { kind: 'broadcast' },
    srcIp: 0,
  });
  const nextSendAt = now + retransmitDelay(ctx.config, attempts, ctx.random);
  return withTimer({ ...s, attempts, nextSendAt }, actions, nextSendAt);
}

function sendRenewRequest(s: ClientState, now: number, actions: ClientAction[]): void {
  const lease = s.lease!;
  const to: Destination = s.name === 'RENEWING'
    ? { kind: 'unicast', ip: lease.serverId, mac: lease.serverMac }
    : { kind: 'broadcast' };
  actions.push({
    type: 'send',
    // Table 5: RENEWING/REBINDING: ciaddr = our address, no option 50 or 54.
    message: { kind: 'REQUEST', xid: s.xid, secs: secsSince(now, s.exchangeStart), ciaddr: lease.address, requestedIp: undefined, serverId: undefined },
    to,
    srcIp: lease.address,
  });
}

/** RFC 2131 §4.4.5: RENEWING lasts until T2, REBINDING until the lease expires. */
function renewalEnd(name: 'RENEWING' | 'REBINDING', lease: Lease): number {
  return name === 'RENEWING' ? lease.rebindAt : lease.expiresAt;
}

/** The next REQUEST of a renewal, halfway to the end of its phase (§4.4.5), and the timer for it or for that end. */
function renewalTimer(cfg: ClientConfig, s: ClientState & { name: 'RENEWING' | 'REBINDING' }, now: number, actions: ClientAction[]): ClientState {
  const end = renewalEnd(s.name, s.lease!);
  const nextSendAt = renewRetryAt(cfg, now, end);
  return withTimer({ ...s, nextSendAt }, actions, Math.min(nextSendAt, end));
}

/** Enter RENEWING (at T1: unicast to the server) or REBINDING (at T2: broadcast): a new exchange and its first REQUEST. */
function enterRenewal(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[], name: 'RENEWING' | 'REBINDING'): ClientState {
  const next = { ...s, name, xid: newXid(ctx.random), exchangeStart: now, attempts: 1, requestSentAt: now };
  sendRenewRequest(next, now, actions);
  actions.push({ type: 'note', what: name === 'RENEWING' ? 'renewing' : 'rebinding' });
  return renewalTimer(ctx.config, next, now, actions);
}

/** BOUND with a fresh lease: bind, persist, count, and arm T1 (or act at once if T1 is already past). */
function bindLease(ctx: ClientContext, s: ClientState, lease: Lease, now: number, actions: ClientAction[]): ClientState {
  actions.push({ type: 'bind', lease }, { type: 'persist', lease });
  actions.push(s.acquireStart !== undefined ? { type: 'note', what: 'acquired', ms: now - s.acquireStart } : { type: 'note', what: 'acquired' });
  const bound: ClientState = {
    ...s, name: 'BOUND', lease, probing: undefined, probingConfirmed: false, offer: undefined, saved: undefined, provisional: undefined,
    hint: lease.address, declined: [], naks: 0, nextSendAt: undefined, waitUntil: undefined, acquireStart: undefined, attempts: 0,
  };
  return boundTimers(ctx, bound, now, actions);
}

/** In BOUND: whatever T1/T2/expiry say is due now, or the timer for the next of them. */
function boundTimers(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[]): ClientState {
  const lease = s.lease!;
  if (now >= lease.expiresAt) return expire(ctx, s, now, actions);
  if (now >= lease.rebindAt) return enterRenewal(ctx, s, now, actions, 'REBINDING');
  if (now >= lease.renewAt) return enterRenewal(ctx, s, now, actions, 'RENEWING');
  return withTimer(s, actions, lease.renewAt);
}

function expire(ctx: ClientContext, s: ClientState, now: number, actions: ClientAction[]): ClientState {
  const lease = s.lease!;
  actions.push(
    { type: 'unbind', address: lease.address, cause: 'expired', at: lease.expiresAt },
    { type: 'forget' },
    { type: 'note', what: 'expired' },
  );
  // Ask for the same address back: a server that was merely down will usually grant it.
  return enterInit(ctx, s, now, actions, { hint: lease.address });
}

/** An ACK for a new binding (REQUESTING, INIT-REBOOT, or a renewal that moved us): probe, then bind. */
function acceptNewLease(ctx: ClientContext, s: ClientState, lease: Lease, now: number, actions: ClientAction[], confirmed: boolean): ClientState {
  if (!ctx.config.probe) return bindLease(ctx, s, lease, now, actions);
  actions.push({ type: 'probe', ip: lease.address });
  // No timer while probing: the driver always reports a verdict, and the probe takes seconds.
  return withTimer({ ...s, probing: lease, probingConfirmed: confirmed, nextSendAt: undefined }, actions, undefined);
}

// --- the step function --------------------------------------------------------

export function step(ctx: ClientContext, s: ClientState, ev: ClientEvent, now: number): StepResult {
  const actions: ClientAction[] = [];
  const cfg = ctx.config;

  switch (ev.type) {
    case 'start': {
      if (s.name !== 'STOPPED') return result(s, actions, 'already-running');
      const saved = ev.saved;
      if (saved && saved.expiresAt > now && ev.resume) {
        // Crash-only start (docs/design.md "The data path outlives the process"): the address is served
        // now, with no ARP probe (RFC 5227 probes an address a host is about
        // to begin using; this one never stopped being ours), and confirmed
        // by a REQUEST for it right away: a RENEWING exchange, unicast to
        // the server with ciaddr (RFC 2131 §4.3.2). Only a NAK or the
        // lease's own expiry withdraws it.
        actions.push({ type: 'bind', lease: saved }, { type: 'note', what: 'resumed' });
        const bound: ClientState = { ...initialState(), name: 'BOUND', lease: saved, hint: saved.address };
        const next = now >= saved.renewAt ? boundTimers(ctx, bound, now, actions) : enterRenewal(ctx, bound, now, actions, 'RENEWING');
        return result(next, actions, 'resumed');
      }
      if (ev.resume && ev.known !== undefined && !(saved && saved.expiresAt > now)) {
        // A VRRP takeover with no lease of our own: serve what the previous
        // Master advertised now (the election decided; no probe, as for a
        // saved lease) and ask the server to confirm it, INIT-REBOOT style:
        // the lease is this client identifier's, whichever VM held it.
        actions.push({ type: 'hold', address: ev.known }, { type: 'note', what: 'resumed', detail: 'the previous VRRP Master\'s VIP, until a server confirms it' });
        const next: ClientState = {
          ...initialState(), name: 'INIT-REBOOT', provisional: ev.known, hint: ev.known, xid: newXid(ctx.random),
          exchangeStart: now, acquireStart: now, requestSentAt: now, attempts: 0,
        };
        return result(sendRebootRequest(ctx, next, now, actions), actions, 'resumed');
      }
      if (saved && saved.expiresAt > now) {
        // §3.2 / §4.4.2: a client that remembers an unexpired lease starts in INIT-REBOOT.
        const next: ClientState = {
          ...initialState(), name: 'INIT-REBOOT', saved, hint: saved.address, xid: newXid(ctx.random),
          exchangeStart: now, acquireStart: now, requestSentAt: now, attempts: 0,
        };
        return result(sendRebootRequest(ctx, next, now, actions), actions, 'started');
      }
      // An expired saved lease still names the address to ask for.
      return result(enterInit(ctx, initialState(), now, actions, { hint: saved?.address }), actions, 'started');
    }

    case 'timer': {
      if (s.name === 'STOPPED') return result(s, actions, 'not-running');
      if (s.timerAt !== undefined && now < s.timerAt) {
        return result(withTimer(s, actions, s.timerAt), actions, 'early-timer');
      }
      switch (s.name) {
        case 'INIT':
          return result(sendDiscover(ctx, s, now, actions, true), actions, 'init-wait-over');
        case 'SELECTING':
          return result(sendDiscover(ctx, s, now, actions, false), actions, 'retransmit');
        case 'REQUESTING':
          if (s.probing) return result(s, actions, 'early-timer');
          if (exhausted(cfg, s.attempts)) {
            // §4.4.1: neither ACK nor NAK after the retransmission algorithm: back to INIT.
            actions.push({ type: 'note', what: 'request-timeout' });
            return result(enterInit(ctx, s, now, actions, { hint: s.hint, keepAcquireStart: true }), actions, 'request-timeout');
          }
          return result(sendSelectingRequest(ctx, s, now, actions), actions, 'retransmit');
        case 'INIT-REBOOT': {
          if (s.probing) return result(s, actions, 'early-timer');
          if (!exhausted(cfg, s.attempts)) return result(sendRebootRequest(ctx, s, now, actions), actions, 'retransmit');
          actions.push({ type: 'note', what: 'reboot-timeout' });
          if (s.provisional !== undefined) {
            // No server confirmed the previous Master's address, and we know no
            // lease times of our own to keep using it for: off the LAN, and ask
            // for it again from INIT.
            actions.push({ type: 'unbind', address: s.provisional, cause: 'unconfirmed', at: now });
            return result(enterInit(ctx, s, now, actions, { hint: s.provisional, keepAcquireStart: true }), actions, 'reboot-timeout');
          }
          const saved = s.saved!;
          if (saved.expiresAt > now) {
            // §3.2 step 4: no answer to INIT-REBOOT: the client MAY use the
            // unexpired saved lease. We do, so a VIP survives a reboot while the
            // server is down - after the same ARP probe as any new address.
            return result(acceptNewLease(ctx, s, saved, now, actions, false), actions, 'reboot-timeout');
          }
          actions.push({ type: 'forget' });
          return result(enterInit(ctx, s, now, actions, { hint: saved.address, keepAcquireStart: true }), actions, 'reboot-timeout');
        }
        case 'BOUND':
          return result(boundTimers(ctx, s, now, actions), actions, now >= s.lease!.expiresAt ? 'expired' : now >= s.lease!.rebindAt ? 'rebind' : 'renew');
        case 'RENEWING':
        case 'REBINDING': {
          const lease = s.lease!;
          if (now >= lease.expiresAt) return result(expire(ctx, s, now, actions), actions, 'expired');
          if (s.name === 'RENEWING' && now >= lease.rebindAt) return result(enterRenewal(ctx, s, now, actions, 'REBINDING'), actions, 'rebind');
          sendRenewRequest(s, now, actions);
          return result(renewalTimer(cfg, { ...s, name: s.name, attempts: s.attempts + 1 }, now, actions), actions, 'retransmit');
        }
      }
      return result(s, actions, 'not-running');
    }

    case 'reply': {
      const { packet, serverMac } = ev;
      const f = packet.fields;
      const m = packet.message;
      if (s.name === 'STOPPED' || s.name === 'INIT' || s.name === 'BOUND' || s.probing) return result(s, actions, 'unexpected-reply');
      if (m.xid !== s.xid) return result(s, actions, 'wrong-xid');

      if (s.name === 'SELECTING') {
        if (f.kind !== 'OFFER' || m.yiaddr === 0) return result(s, actions, 'unexpected-reply');
        // Table 3: an OFFER must carry a server identifier; without one we could not request it.
        if (f.serverId === undefined) return result(s, actions, 'offer-without-server-id');
        // §4.4.1: the first acceptable OFFER is taken (no need to wait for others).
        const next: ClientState = { ...s, name: 'REQUESTING', offer: { address: m.yiaddr, serverId: f.serverId }, attempts: 0, requestSentAt: now };
        return result(sendSelectingRequest(ctx, next, now, actions), actions, 'offer');
      }

      if (f.kind !== 'ACK' && f.kind !== 'NAK') return result(s, actions, 'unexpected-reply');

      if (s.name === 'REQUESTING') {
        // §4.4.1: only the server we selected may answer our REQUEST; others saw it as a decline of their offer.
        if (f.serverId !== undefined && f.serverId !== s.offer!.serverId) return result(s, actions, 'wrong-server');
        if (f.kind === 'NAK') {
          actions.push({ type: 'note', what: 'nak', detail: f.message });
          // The first NAKs: DISCOVER again at once; later ones back off (nakDelay), so a server that NAKs what it offered cannot make us loop.
          const naks = s.naks + 1;
          return result(enterInit(ctx, { ...s, naks }, now, actions, { hint: undefined, waitUntil: now + nakDelay(cfg, naks), keepAcquireStart: true }), actions, 'nak');
        }
        const lease = leaseFromAck(m.yiaddr, f, serverMac, s.offer!.serverId, s.requestSentAt ?? now);
        if (!lease) return result(s, actions, 'ack-without-lease');
        return result(acceptNewLease(ctx, s, lease, now, actions, true), actions, 'ack');
      }

      if (s.name === 'INIT-REBOOT') {
        if (f.kind === 'NAK') {
          // §3.2 step 3: the saved address is not valid here (any more): forget it and start over.
          if (s.provisional !== undefined) actions.push({ type: 'unbind', address: s.provisional, cause: 'nak', at: now, ...(f.message ? { detail: f.message } : {}) });
          actions.push({ type: 'note', what: 'nak', detail: f.message }, { type: 'forget' });
          return result(enterInit(ctx, s, now, actions, { hint: undefined, keepAcquireStart: true }), actions, 'nak');
        }
        const lease = leaseFromAck(m.yiaddr, f, serverMac, undefined, s.requestSentAt ?? now);
        if (!lease) return result(s, actions, 'ack-without-lease');
        if (s.provisional !== undefined) {
          // The address is already ours on the LAN: confirmed, it is bound
          // without a probe; a server that moved us takes the old one off first.
          if (lease.address === s.provisional) return result(bindLease(ctx, s, lease, now, actions), actions, 'ack');
          actions.push({ type: 'unbind', address: s.provisional, cause: 'address-changed', at: now, detail: `server assigned ${formatIPv4(lease.address)}` });
          return result(acceptNewLease(ctx, { ...s, provisional: undefined }, lease, now, actions, true), actions, 'address-changed');
        }
        return result(acceptNewLease(ctx, s, lease, now, actions, true), actions, 'ack');
      }

      // RENEWING / REBINDING
      const old = s.lease!;
      if (f.kind === 'NAK') {
        // §4.4.5: a NAK means the address must not be used any more.
        actions.push(
          { type: 'unbind', address: old.address, cause: 'nak', at: now, ...(f.message ? { detail: f.message } : {}) },
          { type: 'forget' },
          { type: 'note', what: 'nak', detail: f.message },
        );
        return result(enterInit(ctx, s, now, actions, { hint: undefined }), actions, 'nak');
      }
      const lease = leaseFromAck(m.yiaddr, f, serverMac, old.serverId, s.requestSentAt ?? now);
      if (!lease) return result(s, actions, 'ack-without-lease');
      if (lease.address !== old.address) {
        actions.push({ type: 'unbind', address: old.address, cause: 'address-changed', at: now, detail: `server assigned ${formatIPv4(lease.address)}` });
        const fresh: ClientState = { ...s, lease: undefined, acquireStart: now };
        return result(acceptNewLease(ctx, fresh, lease, now, actions, true), actions, 'address-changed');
      }
      actions.push({ type: 'persist', lease }, { type: 'note', what: 'renewed' });
      const bound: ClientState = { ...s, name: 'BOUND', lease, nextSendAt: undefined, attempts: 0, hint: lease.address };
      return result(boundTimers(ctx, bound, now, actions), actions, 'renewed');
    }

    case 'probe-ok': {
      if (!s.probing) return result(s, actions, 'no-probe-pending');
      return result(bindLease(ctx, s, s.probing, now, actions), actions, 'probe-ok');
    }

    case 'probe-conflict': {
      const p = s.probing;
      if (!p) return result(s, actions, 'no-probe-pending');
      const by = ev.mac ? ` by ${ev.mac}` : '';
      if (s.probingConfirmed) {
        // §4.4.1 / RFC 5227 §2.1.1: the address is in use: DHCPDECLINE (broadcast, §4.4.4) with 50 and 54.
        actions.push({
          type: 'send',
          message: { kind: 'DECLINE', xid: s.xid, secs: 0, ciaddr: 0, requestedIp: p.address, serverId: p.serverId, message: `address in use${by}` },
          to: { kind: 'broadcast' },
          srcIp: 0,
        });
      }
      actions.push({ type: 'forget' }, { type: 'note', what: 'declined', detail: `${formatIPv4(p.address)} in use${by}` });
      const declined = [...s.declined.filter((a) => a !== p.address), p.address].slice(-MAX_DECLINED);
      // §3.1.5: wait (10 s) before starting over, so a loop of conflicts cannot flood the server.
      return result(enterInit(ctx, { ...s, declined }, now, actions, { hint: undefined, waitUntil: now + cfg.declineWaitMs, keepAcquireStart: true }), actions, 'probe-conflict');
    }

    case 'probe-failed': {
      if (!s.probing) return result(s, actions, 'no-probe-pending');
      // We could not tell whether the address is free: do not bind it, do not
      // decline it either (no conflict was seen); retry the whole exchange shortly.
      return result(enterInit(ctx, s, now, actions, { hint: s.probing.address, waitUntil: now + cfg.retransmitInitialMs, keepAcquireStart: true }), actions, 'probe-failed');
    }

    case 'conflict': {
      if (s.name === 'INIT-REBOOT' && s.provisional !== undefined && ev.address === s.provisional) {
        // Another host insists on the address we serve unconfirmed: no lease
        // of ours to decline; give it up and ask the server afresh.
        actions.push({ type: 'unbind', address: s.provisional, cause: 'conflict', at: now, ...(ev.mac ? { detail: ev.mac } : {}) });
        const declined = [...s.declined.filter((a) => a !== s.provisional), s.provisional].slice(-MAX_DECLINED);
        return result(enterInit(ctx, { ...s, declined }, now, actions, { hint: undefined, waitUntil: now + cfg.declineWaitMs }), actions, 'conflict');
      }
      const held = s.lease;
      if (!held || (s.name !== 'BOUND' && s.name !== 'RENEWING' && s.name !== 'REBINDING')) return result(s, actions, 'not-bound');
      // A verdict about an address we no longer hold (moved by a renewal) changes nothing.
      if (ev.address !== held.address) return result(s, actions, 'stale-conflict');
      const by = ev.mac ? ` by ${ev.mac}` : '';
      // RFC 5227 §2.4 (b): cease using the address; RFC 2131 §3.1.5 / §4.4.4:
      // tell the server with DHCPDECLINE (broadcast, options 50 and 54), so it
      // marks the address in use instead of handing it out again.
      actions.push(
        { type: 'unbind', address: held.address, cause: 'conflict', at: now, ...(ev.mac ? { detail: ev.mac } : {}) },
        {
          type: 'send',
          message: { kind: 'DECLINE', xid: newXid(ctx.random), secs: 0, ciaddr: 0, requestedIp: held.address, serverId: held.serverId, message: `address in use${by}` },
          to: { kind: 'broadcast' },
          srcIp: 0,
        },
        { type: 'forget' },
        { type: 'note', what: 'declined', detail: `${formatIPv4(held.address)} in use${by}` },
      );
      const declined = [...s.declined.filter((a) => a !== held.address), held.address].slice(-MAX_DECLINED);
      // §3.1.5: wait declineWait before DISCOVER, as after a probe conflict.
      return result(enterInit(ctx, { ...s, declined }, now, actions, { hint: undefined, waitUntil: now + cfg.declineWaitMs }), actions, 'conflict');
    }

    case 'release': {
      if (s.name === 'STOPPED') return result(s, actions, 'not-running');
      // Whatever lease the server has committed to us (bound, ACKed and being probed, or saved) is given back.
      const held = s.lease ?? (s.probingConfirmed ? s.probing : undefined) ?? (s.saved && s.saved.expiresAt > now ? s.saved : undefined);
      if (held) {
        actions.push({
          type: 'send',
          // §4.4.6 / table 5: unicast to the server, ciaddr = the address, option 54, no 50.
          message: { kind: 'RELEASE', xid: newXid(ctx.random), secs: 0, ciaddr: held.address, requestedIp: undefined, serverId: held.serverId },
          to: { kind: 'unicast', ip: held.serverId, mac: held.serverMac },
          srcIp: held.address,
        });
      }
      if (s.lease) actions.push({ type: 'unbind', address: s.lease.address, cause: 'released', at: now });
      else if (s.provisional !== undefined) actions.push({ type: 'unbind', address: s.provisional, cause: 'released', at: now });
      actions.push({ type: 'forget' });
      return result(withTimer(initialState(), actions, undefined), actions, 'released');
    }

    case 'stop': {
      if (s.name === 'STOPPED') return result(s, actions, 'not-running');
      const held = s.lease?.address ?? s.provisional;
      if (held !== undefined) actions.push({ type: 'unbind', address: held, cause: 'stopped', at: now });
      return result(withTimer(initialState(), actions, undefined), actions, 'stopped');
    }
  }
}

/** Human text for an unbind, with the wall-clock time of `at`: "lease expired at 2026-01-01T12:00:00.000Z". */
export function unbindReason(a: Extract<ClientAction, { type: 'unbind' }>, wallOffset: number): string {
  const when = Number.isFinite(a.at) ? isoTime(a.at + wallOffset) : 'never';
  const ip = formatIPv4(a.address);
  switch (a.cause) {
    case 'expired': return `lease of ${ip} expired at ${when}`;
    case 'nak': return `server refused the lease of ${ip} (DHCPNAK${a.detail ? `: ${a.detail}` : ''}) at ${when}`;
    case 'released': return `lease of ${ip} released at ${when} (service removed)`;
    case 'stopped': return `stopped at ${when}; lease of ${ip} kept for the next start`;
    case 'address-changed': return `server moved the lease from ${ip} at ${when}${a.detail ? `: ${a.detail}` : ''}`;
    case 'conflict': return `${a.detail ?? 'another host'} insisted on ${ip} (second ARP conflict within 10 s, RFC 5227 §2.4) at ${when}; declined it`;
    case 'unconfirmed': return `no DHCP server confirmed ${ip} (the previous VRRP Master's VIP) by ${when}; taken off and asked for again`;
  }
}
