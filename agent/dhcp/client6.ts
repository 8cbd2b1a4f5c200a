// DHCPv6 IA_NA client state machine (pure): RFC 8415 §18.2 as a function of
// (state, event, now) returning the next state and the actions a driver
// performs (send, setTimer, bind, unbind, persist, ...), as client.ts does
// for DHCPv4. No I/O, no timers, no clock: `now` is passed in and randomness
// (transaction ids, the first SOLICIT's delay if any, RAND of §15) comes from the
// injected source, so a 12-hour lease is tested in milliseconds.
//
// Every message goes to All_DHCP_Relay_Agents_and_Servers (§18.2: without a
// server unicast option, which we never ask for, clients multicast); RENEW,
// REQUEST, RELEASE and DECLINE name their server by its SERVERID instead.
// Replies reach step() only after codec6.decodeReply6 (transaction id,
// client id) and guard6 (the address) accepted them.
//
// After a restart, an unexpired saved lease is served at once and confirmed
// with a RENEW for it, not a CONFIRM (§18.2.3): CONFIRM only asks whether the
// addresses are on the link - dnsmasq and Kea both answer Success for a
// client that holds no binding at all - and extends nothing. A RENEW extends
// the lease, and a server that lost the binding says so (dnsmasq: NoBinding,
// answered with a REQUEST for the address, §18.2.10.1) or re-creates it (Kea).
import type { Client6MessageSpec, Dhcp6Packet } from './codec6';
import { formatIPv6 } from './codec6';
import { leaseFromReply, usableAddress, type Lease6 } from './lease6';

export type Dhcp6StateName = 'STOPPED' | 'INIT' | 'SELECTING' | 'REQUESTING' | 'BOUND' | 'RENEWING' | 'REBINDING' | 'DECLINING' | 'RELEASING';

/** Retransmission parameters of one message kind (RFC 8415 §15); 0 = no limit. */
export interface Retransmit {
  readonly irtMs: number;
  readonly mrtMs: number;
  readonly mrc: number;
  readonly mrdMs: number;
}

/** RFC 8415 §7.6 defaults. */
export const SOLICIT_RT: Retransmit = { irtMs: 1_000, mrtMs: 3_600_000, mrc: 0, mrdMs: 0 };
export const REQUEST_RT: Retransmit = { irtMs: 1_000, mrtMs: 30_000, mrc: 10, mrdMs: 0 };
/** MRD of RENEW is the time left to T2, of REBIND the time left to expiry (§18.2.4, §18.2.5). */
export const RENEW_RT: Retransmit = { irtMs: 10_000, mrtMs: 600_000, mrc: 0, mrdMs: 0 };
export const REBIND_RT: Retransmit = { irtMs: 10_000, mrtMs: 600_000, mrc: 0, mrdMs: 0 };
export const RELEASE_RT: Retransmit = { irtMs: 1_000, mrtMs: 0, mrc: 4, mrdMs: 0 };
export const DECLINE_RT: Retransmit = { irtMs: 1_000, mrtMs: 0, mrc: 4, mrdMs: 0 };
/** SOL_MAX_DELAY (§7.6): the most §18.2.1 has the first SOLICIT wait, a random 0..1 s. */
export const SOLICIT_MAX_DELAY_MS = 1_000;
/**
 * The first SOLICIT's delay the agent uses: none. §18.2.1's delay is a
 * SHOULD that spreads hosts powering up together; a service's VIP serves
 * nothing until it is bound, and the agent's DHCPv6 starts are not
 * synchronised across VMs (each starts when its own daemon does). ISC
 * dhclient -6 does wait it (a random 0..1 s between "Soliciting for
 * leases" and its first SOLICIT; bench/dhcp.ts measures both). The machine
 * still honours a delay when configured (tests, and `client` of driver6.ts).
 */
export const SOLICIT_DELAY_MS = 0;

export interface Client6Config {
  readonly solicit: Retransmit;
  readonly request: Retransmit;
  readonly renew: Retransmit;
  readonly rebind: Retransmit;
  readonly release: Retransmit;
  readonly decline: Retransmit;
  readonly solicitMaxDelayMs: number;
  /** An address asked for in every SOLICIT (loadBalancerIP), unless declined. */
  readonly requestedAddress: bigint | undefined;
}

export const DEFAULT_CLIENT6_CONFIG: Client6Config = {
  solicit: SOLICIT_RT, request: REQUEST_RT, renew: RENEW_RT, rebind: REBIND_RT, release: RELEASE_RT, decline: DECLINE_RT,
  solicitMaxDelayMs: SOLICIT_DELAY_MS, requestedAddress: undefined,
};

interface Advert {
  readonly serverId: Buffer;
  readonly address: bigint;
  readonly preference: number;
}

export interface Client6State {
  readonly name: Dhcp6StateName;
  readonly iaid: number;
  /** 24-bit transaction id of the current exchange. */
  readonly xid: number;
  /** When the current exchange's first message was sent: ELAPSED_TIME counts from here (§21.9). */
  readonly exchangeStart: number;
  /** When acquisition began (start, expiry, a refusal): start-to-bound duration. */
  readonly acquireStart: number | undefined;
  /** When the latest message of the exchange was sent: lifetimes of its answer count from here. */
  readonly lastSentAt: number;
  /** Messages sent in the exchange. */
  readonly attempts: number;
  /** The current retransmission timeout RT (§15). */
  readonly rtMs: number;
  readonly nextSendAt: number | undefined;
  /** Where this exchange gives up (MRD, or T2 / expiry for RENEW / REBIND). */
  readonly deadline: number | undefined;
  /** SELECTING: when the first RT ends, before which the best ADVERTISE is awaited (§18.2.1). */
  readonly firstRtEnd: number | undefined;
  /** SELECTING: the best ADVERTISE so far. */
  readonly advert: Advert | undefined;
  /** REQUESTING: the server and address asked for. */
  readonly asking: { readonly serverId: Buffer; readonly address: bigint } | undefined;
  /** The lease on the LAN (BOUND, RENEWING, REBINDING; REQUESTING after NoBinding). */
  readonly lease: Lease6 | undefined;
  /** INIT: when to send the first SOLICIT. */
  readonly waitUntil: number | undefined;
  /** The address to hint in SOLICIT: the last held. */
  readonly hint: bigint | undefined;
  /** Addresses declined since the last binding: never hinted again. */
  readonly declined: readonly bigint[];
  /** REQUESTs refused (NoAddrsAvail, NotOnLink) since the last binding: each waits longer before SOLICIT. */
  readonly refusals: number;
  /** DECLINING / RELEASING: the address the message is about. */
  readonly subject: { readonly serverId: Buffer; readonly address: bigint } | undefined;
  readonly timerAt: number | undefined;
}

export type Client6Event =
  /**
   * `resume`: serve the unexpired saved lease at once and RENEW it; otherwise
   * its address is only a SOLICIT hint. `known` (with `resume`, when no
   * unexpired lease was saved here): on a VRRP takeover, the VIP the
   * previous Master advertised. Every VM of the pair derives the same DUID
   * and IAID for the service, so the server's binding for it is this
   * client's too: the address is served at once and confirmed with a REBIND
   * (§18.2.5: to any server, for a client that does not know which server
   * granted it), within KNOWN_CONFIRM_MS.
   */
  | { readonly type: 'start'; readonly saved?: Lease6 | undefined; readonly resume?: boolean; readonly known?: bigint | undefined }
  | { readonly type: 'timer' }
  | { readonly type: 'reply'; readonly packet: Dhcp6Packet }
  /** Duplicate address detection (RFC 4862 §5.4) found the bound address in use. */
  | { readonly type: 'dad-failed'; readonly address: bigint }
  /** The service was removed: RELEASE (§18.2.7), then stop. */
  | { readonly type: 'release' }
  /** Shutdown or failover: withdraw the address, keep the lease, send nothing. */
  | { readonly type: 'stop' };

export type Unbind6Cause = 'expired' | 'no-binding' | 'released' | 'stopped' | 'address-changed' | 'dad-failed' | 'refused';

export type Note6 = 'acquired' | 'resumed' | 'renewed' | 'renewing' | 'rebinding' | 'declined' | 'expired' | 'request-timeout' | 'refused' | 'no-binding' | 'unspec-fail';

export type Client6Action =
  /** Multicast a message to All_DHCP_Relay_Agents_and_Servers from the macvlan's link-local address. */
  | { readonly type: 'send'; readonly message: Client6MessageSpec }
  | { readonly type: 'setTimer'; readonly at: number }
  | { readonly type: 'clearTimer' }
  /** Put the address on the LAN (with DAD: a failure comes back as 'dad-failed'). */
  | { readonly type: 'bind'; readonly lease: Lease6 }
  | { readonly type: 'unbind'; readonly address: bigint; readonly cause: Unbind6Cause; readonly at: number; readonly detail?: string }
  | { readonly type: 'persist'; readonly lease: Lease6 }
  | { readonly type: 'forget' }
  | { readonly type: 'note'; readonly what: Note6; readonly ms?: number; readonly detail?: string };

export type Step6Reason =
  | 'started' | 'resumed' | 'already-running' | 'not-running' | 'early-timer'
  | 'solicit' | 'retransmit' | 'advert-kept' | 'advert-chosen' | 'advert-ignored' | 'request-timeout'
  | 'renew' | 'rebind' | 'expired' | 'exchange-over'
  | 'bound' | 'renewed' | 'address-changed' | 'refused' | 'no-binding' | 'unspec-fail'
  | 'wrong-xid' | 'unexpected-reply'
  | 'dad-failed' | 'stale-dad' | 'released' | 'stopped';

export interface Step6Result {
  readonly state: Client6State;
  readonly actions: readonly Client6Action[];
  readonly reason: Step6Reason;
}

export interface Client6Context {
  readonly config: Client6Config;
  /** [0, 1): transaction ids, delays, RAND. */
  readonly random: () => number;
}

export function initialState6(iaid: number): Client6State {
  return {
    name: 'STOPPED', iaid: iaid >>> 0, xid: 0, exchangeStart: 0, acquireStart: undefined, lastSentAt: 0, attempts: 0, rtMs: 0, nextSendAt: undefined, deadline: undefined,
    firstRtEnd: undefined, advert: undefined, asking: undefined, lease: undefined, waitUntil: undefined, hint: undefined,
    declined: [], refusals: 0, subject: undefined, timerAt: undefined,
  };
}

const newXid = (random: () => number): number => Math.floor(random() * 0x1000000) & 0xffffff;

/** RAND of §15: uniform in [-0.1, +0.1]; strictly positive for the first SOLICIT. */
function rand(random: () => number, positive: boolean): number {
  const r = random();
  return positive ? 0.1 * (1 - r) : 0.2 * r - 0.1; // random() < 1: (0, 0.1]
}

/**
 * RFC 8415 §15: the first RT = IRT + RAND*IRT; each next RT = 2*RTprev +
 * RAND*RTprev; past MRT, RT = MRT + RAND*MRT. `prevMs` 0 means the first.
 */
export function nextRt(p: Retransmit, prevMs: number, random: () => number, firstSolicit = false): number {
  if (prevMs === 0) return p.irtMs + rand(random, firstSolicit) * p.irtMs;
  const rt = 2 * prevMs + rand(random, false) * prevMs;
  if (p.mrtMs > 0 && rt > p.mrtMs) return p.mrtMs + rand(random, false) * p.mrtMs;
  return rt;
}

/** The MRC and MRD limits (§15): whether a message may still be sent. */
function mayRetransmit(p: Retransmit, s: Client6State, now: number): boolean {
  if (p.mrc > 0 && s.attempts >= p.mrc) return false;
  if (s.deadline !== undefined && now >= s.deadline) return false;
  return true;
}

const MAX_DECLINED = 8;

/**
 * How long a VRRP takeover serves the previous Master's address without a
 * server's word (Client6Event 'start' `known`): REBIND's retransmissions
 * (IRT 10 s, §7.6) get three tries in it. No answer by then: the address
 * leaves the LAN and the client asks from INIT, hinting it.
 */
export const KNOWN_CONFIRM_MS = 30_000;

/** The lease a takeover serves the previous Master's address on until a server answers: no server known, lifetimes only to the confirm deadline. */
export function provisionalLease6(iaid: number, address: bigint, now: number): Lease6 {
  return {
    address, iaid: iaid >>> 0, serverId: Buffer.alloc(0), dns: [], preferredSeconds: 0, validSeconds: KNOWN_CONFIRM_MS / 1000, t1Seconds: 0, t2Seconds: 0,
    obtainedAt: now, renewAt: now, rebindAt: now, deprecatedAt: now, expiresAt: now + KNOWN_CONFIRM_MS,
  };
}

function withTimer(s: Client6State, actions: Client6Action[], at: number | undefined): Client6State {
  if (at === undefined || !Number.isFinite(at)) {
    actions.push({ type: 'clearTimer' });
    return { ...s, timerAt: undefined };
  }
  actions.push({ type: 'setTimer', at });
  return { ...s, timerAt: at };
}

const result = (state: Client6State, actions: Client6Action[], reason: Step6Reason): Step6Result => ({ state, actions, reason });

function params(cfg: Client6Config, name: Dhcp6StateName): Retransmit {
  switch (name) {
    case 'REQUESTING': return cfg.request;
    case 'RENEWING': return cfg.renew;
    case 'REBINDING': return cfg.rebind;
    case 'RELEASING': return cfg.release;
    case 'DECLINING': return cfg.decline;
    default: return cfg.solicit;
  }
}

/** The message of the current exchange, from the state. */
function messageFor(s: Client6State, cfg: Client6Config, now: number): Client6MessageSpec {
  const elapsedMs = s.attempts === 0 ? 0 : now - s.exchangeStart;
  const zero = (address: bigint): Client6MessageSpec['addresses'] => [{ address, preferred: 0, valid: 0 }];
  switch (s.name) {
    case 'REQUESTING':
      return { kind: 'REQUEST', xid: s.xid, elapsedMs, serverId: s.asking!.serverId, addresses: zero(s.asking!.address) };
    case 'RENEWING':
      return { kind: 'RENEW', xid: s.xid, elapsedMs, serverId: s.lease!.serverId, addresses: zero(s.lease!.address) };
    case 'REBINDING':
      return { kind: 'REBIND', xid: s.xid, elapsedMs, serverId: undefined, addresses: zero(s.lease!.address) };
    case 'RELEASING':
      return { kind: 'RELEASE', xid: s.xid, elapsedMs, serverId: s.subject!.serverId, addresses: zero(s.subject!.address) };
    case 'DECLINING':
      return { kind: 'DECLINE', xid: s.xid, elapsedMs, serverId: s.subject!.serverId, addresses: zero(s.subject!.address) };
    default: {
      // §18.2.1: an address may be hinted in SOLICIT; loadBalancerIP first, else the last held, never a declined one.
      const hint = [cfg.requestedAddress, s.hint].find((a) => a !== undefined && !s.declined.includes(a));
      return { kind: 'SOLICIT', xid: s.xid, elapsedMs, serverId: undefined, addresses: hint === undefined ? [] : zero(hint) };
    }
  }
}

/** Send the exchange's next message and arm the timer for its RT (never past the deadline). */
function transmit(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[]): Client6State {
  const p = params(ctx.config, s.name);
  actions.push({ type: 'send', message: messageFor(s, ctx.config, now) });
  const rtMs = nextRt(p, s.rtMs, ctx.random, s.name === 'SELECTING' && s.attempts === 0);
  const nextSendAt = now + rtMs;
  const next: Client6State = {
    ...s, attempts: s.attempts + 1, rtMs, nextSendAt, lastSentAt: now,
    firstRtEnd: s.name === 'SELECTING' && s.attempts === 0 ? nextSendAt : s.firstRtEnd,
  };
  return withTimer(next, actions, Math.min(nextSendAt, next.deadline ?? Infinity));
}

/** A new exchange in `name`: new xid, RT reset, first message now. */
function begin(ctx: Client6Context, s: Client6State, name: Dhcp6StateName, now: number, actions: Client6Action[], deadline: number | undefined): Client6State {
  const p = params(ctx.config, name);
  const mrd = p.mrdMs > 0 ? now + p.mrdMs : undefined;
  const next: Client6State = {
    ...s, name, xid: newXid(ctx.random), exchangeStart: now, attempts: 0, rtMs: 0, nextSendAt: undefined,
    deadline: deadline ?? mrd, firstRtEnd: undefined, advert: undefined, waitUntil: undefined,
  };
  return transmit(ctx, next, now, actions);
}

/** INIT: the first SOLICIT after a random delay (§18.2.1), or after `waitMs` when backing off. */
function enterInit(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[], waitMs?: number): Client6State {
  const wait = waitMs ?? ctx.random() * ctx.config.solicitMaxDelayMs;
  const base: Client6State = { ...s, name: 'INIT', acquireStart: s.acquireStart ?? now, lease: undefined, asking: undefined, subject: undefined, advert: undefined, nextSendAt: undefined, deadline: undefined };
  if (wait <= 0) return begin(ctx, base, 'SELECTING', now, actions, undefined);
  return withTimer({ ...base, waitUntil: now + wait }, actions, now + wait);
}

/** How long to wait before SOLICIT after the n-th refused REQUEST: SOLICIT's IRT doubling up to its MRT. */
export function refusalWait(cfg: Client6Config, refusals: number): number {
  const mrt = cfg.solicit.mrtMs > 0 ? cfg.solicit.mrtMs : Infinity;
  return Math.min(cfg.solicit.irtMs * 2 ** Math.max(0, refusals - 1), mrt);
}

function bindLease(s: Client6State, lease: Lease6, now: number, actions: Client6Action[], acquireStart: number | undefined): Client6State {
  actions.push({ type: 'bind', lease }, { type: 'persist', lease });
  actions.push(acquireStart !== undefined ? { type: 'note', what: 'acquired', ms: now - acquireStart } : { type: 'note', what: 'acquired' });
  return boundState(s, lease);
}

function boundState(s: Client6State, lease: Lease6): Client6State {
  return {
    ...s, name: 'BOUND', acquireStart: undefined, lease, asking: undefined, subject: undefined, advert: undefined, hint: lease.address,
    declined: [], refusals: 0, attempts: 0, rtMs: 0, nextSendAt: undefined, deadline: undefined, firstRtEnd: undefined, waitUntil: undefined,
  };
}

/** In BOUND: whatever T1/T2/expiry say is due now, or the timer for the next of them. */
function boundTimers(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[]): Client6State {
  const lease = s.lease!;
  if (now >= lease.expiresAt) return expire(ctx, s, now, actions);
  if (now >= lease.rebindAt) return enterRebind(ctx, s, now, actions);
  if (now >= lease.renewAt) return enterRenew(ctx, s, now, actions);
  return withTimer(s, actions, lease.renewAt);
}

/** §18.2.4: RENEW at T1, to the granting server, until T2. */
function enterRenew(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[]): Client6State {
  actions.push({ type: 'note', what: 'renewing' });
  return begin(ctx, s, 'RENEWING', now, actions, s.lease!.rebindAt);
}

/** §18.2.5: REBIND at T2, to any server, until the valid lifetime ends. */
function enterRebind(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[]): Client6State {
  actions.push({ type: 'note', what: 'rebinding' });
  return begin(ctx, s, 'REBINDING', now, actions, s.lease!.expiresAt);
}

function expire(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[]): Client6State {
  const lease = s.lease!;
  actions.push({ type: 'unbind', address: lease.address, cause: 'expired', at: lease.expiresAt }, { type: 'forget' }, { type: 'note', what: 'expired' });
  // Ask for the same address back: a server that was merely down will usually grant it.
  return enterInit(ctx, { ...s, hint: lease.address }, now, actions);
}

// --- replies --------------------------------------------------------------------

function onAdvertise(ctx: Client6Context, s: Client6State, p: Dhcp6Packet, now: number, actions: Client6Action[]): Step6Result {
  if (s.name !== 'SELECTING') return result(s, actions, 'unexpected-reply');
  // §18.2.9: an ADVERTISE with no address for us (NoAddrsAvail) is ignored, and retransmission goes on.
  const u = usableAddress(p.fields, s.iaid, s.hint);
  if (!u.ok || p.fields.serverId === undefined) {
    actions.push({ type: 'note', what: 'refused', detail: u.ok ? 'no server identifier' : u.problem });
    return result(s, actions, 'advert-ignored');
  }
  const advert: Advert = { serverId: p.fields.serverId, address: u.address.address, preference: p.fields.preference ?? 0 };
  const best = s.advert === undefined || advert.preference > s.advert.preference ? advert : s.advert;
  // §18.2.1: preference 255 is taken at once; after the first RT, the first ADVERTISE is.
  if (advert.preference === 255 || s.firstRtEnd === undefined || now >= s.firstRtEnd) {
    return result(request(ctx, s, advert.preference === 255 ? advert : best, now, actions), actions, 'advert-chosen');
  }
  return result(withTimer({ ...s, advert: best }, actions, Math.min(s.firstRtEnd, s.nextSendAt ?? Infinity)), actions, 'advert-kept');
}

/** §18.2.2: REQUEST the chosen server's address. */
function request(ctx: Client6Context, s: Client6State, a: { serverId: Buffer; address: bigint }, now: number, actions: Client6Action[]): Client6State {
  return begin(ctx, { ...s, asking: { serverId: a.serverId, address: a.address }, advert: undefined }, 'REQUESTING', now, actions, undefined);
}

function onReply(ctx: Client6Context, s: Client6State, p: Dhcp6Packet, now: number, actions: Client6Action[]): Step6Result {
  const f = p.fields;
  // §18.2.10: UnspecFail is no answer; the retransmission goes on (and limits the rate).
  if (f.status?.code === 1) {
    actions.push({ type: 'note', what: 'unspec-fail', detail: f.status.message });
    return result(s, actions, 'unspec-fail');
  }
  switch (s.name) {
    case 'RELEASING':
      actions.push({ type: 'forget' });
      return result(withTimer({ ...initialState6(s.iaid) }, actions, undefined), actions, 'released');
    case 'DECLINING':
      return result(enterInit(ctx, { ...s, subject: undefined }, now, actions), actions, 'exchange-over');
    case 'REQUESTING': {
      const want = s.asking!.address;
      const r = leaseFromReply(f, s.iaid, want, s.lastSentAt);
      if (r.ok) {
        if (s.lease && s.lease.address !== r.lease.address) {
          actions.push({ type: 'unbind', address: s.lease.address, cause: 'address-changed', at: now, detail: `server granted ${formatIPv6(r.lease.address)}` });
        }
        if (s.lease && s.lease.address === r.lease.address) {
          // NoBinding answered: the address never left the LAN.
          actions.push({ type: 'persist', lease: r.lease }, { type: 'note', what: 'renewed' });
          return result(boundTimers(ctx, boundState(s, r.lease), now, actions), actions, 'renewed');
        }
        return result(boundTimers(ctx, bindLease(s, r.lease, now, actions, s.acquireStart), now, actions), actions, 'bound');
      }
      // §18.2.10.1: NoAddrsAvail / NotOnLink (or nothing usable): back to SOLICIT, without this address as a hint.
      return result(refused(ctx, s, now, actions, r.problem, r.detail), actions, 'refused');
    }
    case 'RENEWING':
    case 'REBINDING': {
      const lease = s.lease!;
      const r = leaseFromReply(f, s.iaid, lease.address, s.lastSentAt);
      if (r.ok && r.lease.address === lease.address) {
        actions.push({ type: 'persist', lease: r.lease }, { type: 'note', what: 'renewed' });
        return result(boundTimers(ctx, boundState(s, r.lease), now, actions), actions, 'renewed');
      }
      if (r.ok) {
        // The server took our address away and gave another (§18.2.10.1: an address missing from the IA is no longer ours).
        actions.push({ type: 'unbind', address: lease.address, cause: 'address-changed', at: now, detail: `server granted ${formatIPv6(r.lease.address)}` });
        return result(boundTimers(ctx, bindLease(s, r.lease, now, actions, undefined), now, actions), actions, 'address-changed');
      }
      if (r.problem === 'NoBinding') {
        // §18.2.10.1: the server has no binding: REQUEST the address we hold from it, keeping it meanwhile.
        actions.push({ type: 'note', what: 'no-binding', detail: r.detail });
        const serverId = f.serverId ?? lease.serverId;
        return result(request(ctx, s, { serverId, address: lease.address }, now, actions), actions, 'no-binding');
      }
      // Our address with valid lifetime 0, or nothing for our IA: the binding is gone.
      actions.push({ type: 'unbind', address: lease.address, cause: 'refused', at: now, detail: r.detail ?? r.problem }, { type: 'forget' });
      return result(enterInit(ctx, { ...s, hint: undefined }, now, actions), actions, 'refused');
    }
    default:
      return result(s, actions, 'unexpected-reply');
  }
}

function refused(ctx: Client6Context, s: Client6State, now: number, actions: Client6Action[], problem: string, detail: string | undefined): Client6State {
  const refusals = s.refusals + 1;
  actions.push({ type: 'note', what: 'refused', detail: detail ? `${problem}: ${detail}` : problem });
  if (s.lease) actions.push({ type: 'unbind', address: s.lease.address, cause: 'refused', at: now, detail: problem }, { type: 'forget' });
  return enterInit(ctx, { ...s, refusals, hint: undefined }, now, actions, refusalWait(ctx.config, refusals));
}

// --- the step function ---------------------------------------------------------------

export function step6(ctx: Client6Context, s: Client6State, ev: Client6Event, now: number): Step6Result {
  const actions: Client6Action[] = [];
  switch (ev.type) {
    case 'start': {
      if (s.name !== 'STOPPED') return result(s, actions, 'already-running');
      const saved = ev.saved !== undefined && ev.saved.expiresAt > now && ev.saved.iaid === s.iaid ? ev.saved : undefined;
      if (saved && ev.resume) {
        // Crash-only start: the address never left our macvlan; serve it and RENEW it now (see the file comment).
        actions.push({ type: 'bind', lease: saved }, { type: 'note', what: 'resumed' });
        const bound = boundState(s, saved);
        const next = now >= saved.renewAt ? boundTimers(ctx, bound, now, actions) : enterRenew(ctx, bound, now, actions);
        return result(next, actions, 'resumed');
      }
      if (ev.resume && ev.known !== undefined && saved === undefined) {
        // A VRRP takeover with no lease of our own: the election decided, so
        // the previous Master's address is served now, and a REBIND asks any
        // server to confirm it (the binding is this DUID's, whichever VM held it).
        const lease = provisionalLease6(s.iaid, ev.known, now);
        actions.push({ type: 'bind', lease }, { type: 'note', what: 'resumed', detail: 'the previous VRRP Master\'s VIP, until a server confirms it' });
        return result(begin(ctx, boundState(s, lease), 'REBINDING', now, actions, lease.expiresAt), actions, 'resumed');
      }
      return result(enterInit(ctx, { ...s, hint: saved?.address }, now, actions), actions, 'started');
    }
    case 'timer': {
      if (s.name === 'STOPPED') return result(s, actions, 'not-running');
      if (s.timerAt === undefined || now < s.timerAt) return result(s, actions, 'early-timer');
      switch (s.name) {
        case 'INIT':
          return result(begin(ctx, s, 'SELECTING', now, actions, undefined), actions, 'solicit');
        case 'SELECTING':
          if (s.advert !== undefined && s.firstRtEnd !== undefined && now >= s.firstRtEnd) {
            return result(request(ctx, s, s.advert, now, actions), actions, 'advert-chosen');
          }
          return result(transmit(ctx, s, now, actions), actions, 'retransmit');
        case 'BOUND':
          return result(boundTimers(ctx, s, now, actions), actions, now >= s.lease!.rebindAt ? 'rebind' : 'renew');
        case 'RENEWING':
          if (now >= s.lease!.rebindAt) return result(boundTimers(ctx, s, now, actions), actions, 'rebind');
          return result(transmit(ctx, s, now, actions), actions, 'retransmit');
        case 'REBINDING':
          if (now >= s.lease!.expiresAt) return result(expire(ctx, s, now, actions), actions, 'expired');
          return result(transmit(ctx, s, now, actions), actions, 'retransmit');
        case 'REQUESTING':
          if (!mayRetransmit(ctx.config.request, s, now)) {
            actions.push({ type: 'note', what: 'request-timeout' });
            return result(refused(ctx, s, now, actions, 'no reply to REQUEST', undefined), actions, 'request-timeout');
          }
          return result(transmit(ctx, s, now, actions), actions, 'retransmit');
        case 'DECLINING':
          if (!mayRetransmit(ctx.config.decline, s, now)) return result(enterInit(ctx, { ...s, subject: undefined }, now, actions), actions, 'exchange-over');
          return result(transmit(ctx, s, now, actions), actions, 'retransmit');
        case 'RELEASING':
          if (!mayRetransmit(ctx.config.release, s, now)) {
            actions.push({ type: 'forget' });
            return result(withTimer(initialState6(s.iaid), actions, undefined), actions, 'released');
          }
          return result(transmit(ctx, s, now, actions), actions, 'retransmit');
      }
      return result(s, actions, 'not-running');
    }
    case 'reply': {
      if (s.name === 'STOPPED') return result(s, actions, 'not-running');
      if (ev.packet.message.xid !== s.xid) return result(s, actions, 'wrong-xid');
      if (ev.packet.fields.kind === 'ADVERTISE') return onAdvertise(ctx, s, ev.packet, now, actions);
      if (ev.packet.fields.kind === 'REPLY') return onReply(ctx, s, ev.packet, now, actions);
      return result(s, actions, 'unexpected-reply');
    }
    case 'dad-failed': {
      const lease = s.lease;
      if (lease === undefined || lease.address !== ev.address) return result(s, actions, 'stale-dad');
      // §18.2.8: DECLINE the address to its server, then SOLICIT again, never hinting it.
      actions.push(
        { type: 'unbind', address: lease.address, cause: 'dad-failed', at: now }, { type: 'forget' },
        { type: 'note', what: 'declined', detail: formatIPv6(lease.address) },
      );
      const declined = [...s.declined, lease.address].slice(-MAX_DECLINED);
      const next: Client6State = { ...s, lease: undefined, asking: undefined, hint: undefined, declined, subject: { serverId: lease.serverId, address: lease.address } };
      return result(begin(ctx, next, 'DECLINING', now, actions, undefined), actions, 'dad-failed');
    }
    case 'release': {
      const lease = s.lease;
      if (lease === undefined) {
        actions.push({ type: 'forget' });
        return result(withTimer(initialState6(s.iaid), actions, undefined), actions, 'released');
      }
      actions.push({ type: 'unbind', address: lease.address, cause: 'released', at: now });
      const next: Client6State = { ...s, lease: undefined, asking: undefined, subject: { serverId: lease.serverId, address: lease.address } };
      return result(begin(ctx, next, 'RELEASING', now, actions, undefined), actions, 'released');
    }
    case 'stop': {
      if (s.lease) actions.push({ type: 'unbind', address: s.lease.address, cause: 'stopped', at: now });
      return result(withTimer(initialState6(s.iaid), actions, undefined), actions, 'stopped');
    }
  }
}
