// Unit tests of the DHCPv6 client state machine with an injected clock and
// randomness: each retransmission schedule of RFC 8415 §15, ADVERTISE
// selection, a 12-hour lease through RENEW, REBIND and expiry in
// milliseconds, NoAddrsAvail and NoBinding, resume, a VRRP takeover's known
// address, DECLINE, RELEASE.
import t from 'tap';
import {
  DEFAULT_CLIENT6_CONFIG, KNOWN_CONFIRM_MS, SOLICIT_MAX_DELAY_MS, initialState6, nextRt, refusalWait, step6,
  type Client6Action, type Client6Config, type Client6Context, type Client6Event, type Client6State,
} from '../../agent/dhcp/client6';
import {
  MsgType6, Opt6, Status6, decodeDhcp6, decodeReply6, duidLl, encodeDhcp6, iaAddrOption, iaNaOption, statusOption,
  type Dhcp6Option, type Dhcp6Packet,
} from '../../agent/dhcp/codec6';
import { leaseFromReply, type Lease6 } from '../../agent/dhcp/lease6';
import { parseAddress } from '../../agent/address';
import * as golden from './fixtures/golden6';

const ip6 = (s: string): bigint => parseAddress(s)!.value;
const IAID = 0xd601;
const ME = duidLl('02:00:00:00:d6:01');
const S1 = duidLl('02:00:00:00:aa:01');
const S2 = duidLl('02:00:00:00:aa:02');
const A1 = ip6('fd00:99::101');
const A2 = ip6('fd00:99::202');
const H = 3_600_000;

/**
 * random() = 0.5 makes RAND 0 (and the first SOLICIT's RAND +0.05), the
 * delay before it 500 ms: these runs use RFC 8415's SOL_MAX_DELAY, not the
 * agent's default of none, so that the delay's schedule is tested too.
 */
function ctx(random: () => number = () => 0.5, config: Partial<Client6Config> = {}): Client6Context {
  return { config: { ...DEFAULT_CLIENT6_CONFIG, solicitMaxDelayMs: SOLICIT_MAX_DELAY_MS, ...config }, random };
}

function packet(type: number, xid: number, options: Dhcp6Option[]): Dhcp6Packet {
  const d = decodeDhcp6(encodeDhcp6({ type, xid, options }));
  if (!d.ok) throw new Error(d.reason);
  return d.value;
}

interface Grant { address?: bigint; preferred?: number; valid?: number; t1?: number; t2?: number; iaStatus?: number; status?: number; preference?: number; server?: Buffer }
function answer(type: number, xid: number, g: Grant = {}): Dhcp6Packet {
  const iaOpts: Dhcp6Option[] = g.iaStatus !== undefined
    ? [statusOption(g.iaStatus, 'refused')]
    : [iaAddrOption({ address: g.address ?? A1, preferred: g.preferred ?? 43200, valid: g.valid ?? 43200 })];
  const options: Dhcp6Option[] = [{ code: Opt6.CLIENTID, data: ME }, { code: Opt6.SERVERID, data: g.server ?? S1 }, iaNaOption({ iaid: IAID, t1: g.t1 ?? 0, t2: g.t2 ?? 0, options: iaOpts })];
  if (g.status !== undefined) options.push(statusOption(g.status, 'msg'));
  if (g.preference !== undefined) options.push({ code: Opt6.PREFERENCE, data: Buffer.from([g.preference]) });
  return packet(type, xid, options);
}

class Run {
  s: Client6State = initialState6(IAID);
  actions: Client6Action[] = [];
  reason = '';
  constructor(readonly c: Client6Context = ctx()) {}
  ev(e: Client6Event, now: number): this {
    const r = step6(this.c, this.s, e, now);
    this.s = r.state;
    this.actions = [...r.actions];
    this.reason = r.reason;
    return this;
  }
  timer(): this { return this.ev({ type: 'timer' }, this.s.timerAt!); }
  sent(): Extract<Client6Action, { type: 'send' }>['message'][] {
    return this.actions.flatMap((a) => (a.type === 'send' ? [a.message] : []));
  }
  has(type: Client6Action['type']): Client6Action | undefined { return this.actions.find((a) => a.type === type); }
  reply(g: Grant = {}, now = this.s.lastSentAt + 5): this { return this.ev({ type: 'reply', packet: answer(MsgType6.REPLY, this.s.xid, g) }, now); }
  advertise(g: Grant = {}, now = this.s.lastSentAt + 5): this { return this.ev({ type: 'reply', packet: answer(MsgType6.ADVERTISE, this.s.xid, g) }, now); }
  /** Started, solicited, advertised and requested: BOUND with a 12-hour lease from S1. */
  bound(g: Grant = {}): this {
    this.ev({ type: 'start' }, 0).timer().advertise({ preference: 255 }).reply(g);
    return this;
  }
}

t.test('RFC 8415 §15: RT doubles from IRT with RAND in -0.1..+0.1, capped at MRT', async (t) => {
  const p = DEFAULT_CLIENT6_CONFIG.solicit;
  t.equal(nextRt(p, 0, () => 0.5, true), 1050, 'the first SOLICIT RT is strictly more than IRT');
  t.ok(nextRt(p, 0, () => 0, true) > 1000);
  t.equal(nextRt(p, 0, () => 0, false), 900);
  t.equal(nextRt(p, 1000, () => 0.5), 2000);
  t.equal(nextRt(p, 1000, () => 0), 1900, 'RT = 2 x RTprev + RAND x RTprev');
  t.equal(nextRt(p, 1000, () => 1), 2100);
  t.equal(nextRt(p, 3_000_000, () => 0.5), 3_600_000, 'past MRT: MRT + RAND*MRT');
  t.equal(nextRt(p, 3_000_000, () => 0), 3_240_000);
});

t.test('SOLICIT: a random delay up to 1 s, then 1.05 s, 2.1 s, 4.2 s ... up to an hour, never giving up', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0);
  t.equal(r.s.name, 'INIT');
  t.same(r.sent(), []);
  t.equal(r.s.timerAt, 500, 'SOL_MAX_DELAY x random');
  r.timer();
  t.equal(r.s.name, 'SELECTING');
  t.match(r.sent()[0], { kind: 'SOLICIT', elapsedMs: 0, serverId: undefined, addresses: [] });
  const gaps: number[] = [];
  let last = 500;
  for (let i = 0; i < 16; i++) {
    r.timer();
    gaps.push(r.s.lastSentAt - last);
    last = r.s.lastSentAt;
    t.equal(r.sent().length, 1);
  }
  t.same(gaps.slice(0, 5), [1050, 2100, 4200, 8400, 16800]);
  t.same(gaps.slice(-2), [3_600_000, 3_600_000], 'SOL_MAX_RT');
  t.equal(r.s.name, 'SELECTING');
  t.equal(r.sent()[0]!.elapsedMs, last - 500, 'elapsed time counts from the first SOLICIT');
});

t.test('by default the first SOLICIT leaves at start, with no delay', async (t) => {
  const r = new Run({ config: DEFAULT_CLIENT6_CONFIG, random: () => 0.99 }).ev({ type: 'start' }, 0);
  t.equal(r.s.name, 'SELECTING');
  t.match(r.sent(), [{ kind: 'SOLICIT', elapsedMs: 0 }]);
  t.ok(r.s.timerAt! > 1000 && r.s.timerAt! <= 1100, 'the first RT (IRT + a positive RAND) is the only wait');
  const after = new Run({ config: DEFAULT_CLIENT6_CONFIG, random: () => 0.5 }).bound({ valid: 60, preferred: 60, t1: 30, t2: 48 });
  for (let i = 0; i < 20 && after.s.timerAt !== undefined && after.s.timerAt < 60_000; i++) after.timer();
  after.timer();
  t.equal(after.s.timerAt! > 60_000 && after.s.name, 'SELECTING', 'expiry solicits again at once too');
  t.match(after.sent(), [{ kind: 'SOLICIT' }]);
});

t.test('ADVERTISE selection: the highest preference after the first RT; 255 at once; after the first RT the first one', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0).timer();
  r.advertise({ preference: 10, server: S1, address: A1 }, 600);
  t.equal(r.reason, 'advert-kept');
  r.advertise({ preference: 50, server: S2, address: A2 }, 700);
  r.advertise({ preference: 20, server: S1, address: A1 }, 800);
  t.equal(r.s.timerAt, 1550, 'waits out the first RT');
  r.timer();
  t.equal(r.s.name, 'REQUESTING');
  t.match(r.sent()[0], { kind: 'REQUEST', elapsedMs: 0, addresses: [{ address: A2, preferred: 0, valid: 0 }] });
  t.ok(r.sent()[0]!.serverId!.equals(S2));

  const now = new Run().ev({ type: 'start' }, 0).timer().advertise({ preference: 255, server: S2 }, 600);
  t.equal(now.reason, 'advert-chosen');
  t.ok(now.sent()[0]!.serverId!.equals(S2));

  const late = new Run().ev({ type: 'start' }, 0).timer().timer().advertise({ preference: 0 }, 2000);
  t.equal(late.s.name, 'REQUESTING', 'after the first RT, no waiting for a better one');
});

t.test('an ADVERTISE with NoAddrsAvail is ignored and SOLICIT goes on', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0).timer();
  const before = r.s;
  r.advertise({ iaStatus: Status6.NoAddrsAvail, preference: 255 }, 600);
  t.equal(r.reason, 'advert-ignored');
  t.match(r.has('note'), { what: 'refused', detail: 'NoAddrsAvail' });
  t.equal(r.s, before);
});

t.test('REQUEST: 1 s doubling to 30 s, ten messages, then SOLICIT again', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0).timer().advertise({ preference: 255 }, 600);
  const at = [r.s.lastSentAt];
  for (let i = 0; i < 9; i++) { r.timer(); at.push(r.s.lastSentAt); }
  t.same(at.slice(1).map((x, i) => x - at[i]!), [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]);
  t.equal(r.s.attempts, 10);
  r.timer();
  t.equal(r.reason, 'request-timeout');
  t.equal(r.s.name, 'INIT');
  t.equal(r.s.timerAt! - (r.s.lastSentAt + 30000), 1000, 'SOLICIT after SOL_TIMEOUT');
});

t.test('a 12-hour lease: BOUND, RENEW at T1, REBIND at T2, withdrawn at the valid lifetime', async (t) => {
  const r = new Run().bound();
  t.equal(r.s.name, 'BOUND');
  const lease = (r.has('bind') as { lease: Lease6 }).lease;
  t.equal(lease.address, A1);
  t.equal(lease.t1Seconds, 21600, 'T1 0 from the server: 0.5 x preferred (RFC 8415 §14.2)');
  t.equal(lease.t2Seconds, 34560, 'T2 0: 0.8 x preferred');
  t.ok(r.has('persist'));
  t.match(r.actions.find((a) => a.type === 'note'), { what: 'acquired', ms: 510 });
  const obtained = lease.obtainedAt;
  t.equal(r.s.timerAt, obtained + 6 * H);
  r.timer();
  t.equal(r.s.name, 'RENEWING');
  t.match(r.sent()[0], { kind: 'RENEW', addresses: [{ address: A1 }] });
  t.ok(r.sent()[0]!.serverId!.equals(S1), 'RENEW names the granting server');
  const at = [r.s.lastSentAt];
  while (r.s.name === 'RENEWING') { r.timer(); if (r.s.name === 'RENEWING') at.push(r.s.lastSentAt); }
  t.same(at.slice(1, 8).map((x, i) => x - at[i]!), [10_000, 20_000, 40_000, 80_000, 160_000, 320_000, 600_000], 'REN_TIMEOUT doubling to REN_MAX_RT');
  t.ok(at.every((x) => x < obtained + 34560_000), 'RENEW stops at T2');
  t.equal(r.s.name, 'REBINDING');
  t.equal(r.s.lastSentAt, obtained + 34560_000);
  t.match(r.sent()[0], { kind: 'REBIND', serverId: undefined });
  t.notOk(r.has('unbind'), 'still serving while rebinding');
  while (r.s.name === 'REBINDING') r.timer();
  t.match(r.has('unbind'), { cause: 'expired', at: obtained + 12 * H, address: A1 });
  t.ok(r.has('forget'));
  t.equal(r.s.name, 'INIT');
  r.timer();
  t.match(r.sent()[0], { kind: 'SOLICIT', addresses: [{ address: A1 }] }, 'asks for the same address back');
});

t.test('T1/T2 from the IA_NA when given; a RENEW answered extends the lease', async (t) => {
  const r = new Run().bound({ t1: 3600, t2: 6300, preferred: 7200, valid: 7500 });
  const lease = (r.has('bind') as { lease: Lease6 }).lease;
  t.equal(r.s.timerAt, lease.obtainedAt + 3600_000);
  r.timer().reply({ t1: 3600, t2: 6300, preferred: 7200, valid: 7500 });
  t.equal(r.reason, 'renewed');
  t.equal(r.s.name, 'BOUND');
  t.notOk(r.has('bind'), 'the address never left the LAN');
  const renewed = (r.has('persist') as { lease: Lease6 }).lease;
  t.equal(renewed.expiresAt, r.s.lastSentAt + 7500_000);
});

t.test('NoBinding to RENEW: REQUEST the held address from that server, still serving it', async (t) => {
  const r = new Run().bound();
  r.timer().reply({ iaStatus: Status6.NoBinding });
  t.equal(r.reason, 'no-binding');
  t.equal(r.s.name, 'REQUESTING');
  t.notOk(r.has('unbind'));
  t.match(r.sent()[0], { kind: 'REQUEST', addresses: [{ address: A1 }] });
  t.ok(r.sent()[0]!.serverId!.equals(S1));
  r.reply();
  t.equal(r.reason, 'renewed');
  t.equal(r.s.name, 'BOUND');
  t.notOk(r.has('bind'));
});

t.test('NoAddrsAvail to REQUEST: back to SOLICIT after a growing wait', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0).timer().advertise({ preference: 255 }, 600);
  r.reply({ iaStatus: Status6.NoAddrsAvail }, 700);
  t.equal(r.reason, 'refused');
  t.equal(r.s.name, 'INIT');
  t.equal(r.s.timerAt, 700 + refusalWait(DEFAULT_CLIENT6_CONFIG, 1));
  r.timer().advertise({ preference: 255 }).reply({ iaStatus: Status6.NoAddrsAvail });
  t.equal(r.s.timerAt! - r.s.lastSentAt - 5, 2000);
  t.equal(refusalWait(DEFAULT_CLIENT6_CONFIG, 30), 3_600_000);
});

t.test('UnspecFail is no answer: the exchange goes on', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0).timer().advertise({ preference: 255 }, 600);
  const before = r.s;
  r.reply({ status: Status6.UnspecFail });
  t.equal(r.reason, 'unspec-fail');
  t.equal(r.s, before);
});

t.test('a reply for another transaction is dropped; one for another client never reaches the machine', async (t) => {
  const r = new Run().ev({ type: 'start' }, 0).timer().advertise({ preference: 255 }, 600);
  const before = r.s;
  r.ev({ type: 'reply', packet: answer(MsgType6.REPLY, (r.s.xid + 1) & 0xffffff) }, 700);
  t.equal(r.reason, 'wrong-xid');
  t.same(r.actions, []);
  t.equal(r.s, before);
  // The driver judges frames with decodeReply6 first: dnsmasq's NoBinding was for DUID-LL 02:00:00:00:d6:99.
  const d = decodeReply6(Buffer.from(golden.dnsmasqNoBinding.hex, 'hex'), { csumNotReady: true }, { xid: 0x123457, duid: ME });
  t.same(d, { ok: false, reason: 'wrong-client-id' });
});

t.test('the address going away in a RENEW reply withdraws it; another address moves the lease', async (t) => {
  const gone = new Run().bound();
  gone.timer().reply({ valid: 0, preferred: 0 });
  t.match(gone.has('unbind'), { cause: 'refused', address: A1 });
  t.equal(gone.s.name, 'INIT');
  const moved = new Run().bound();
  moved.timer().reply({ address: A2 });
  t.equal(moved.reason, 'address-changed');
  t.match(moved.actions.map((a) => a.type), ['unbind', 'bind', 'persist', 'note', 'setTimer']);
});

t.test('resume: the saved lease is served at once and RENEWed; a stale or foreign one only hints', async (t) => {
  const first = new Run().bound();
  const saved = (first.has('persist') as { lease: Lease6 }).lease;
  const r = new Run().ev({ type: 'start', saved, resume: true }, 2 * H);
  t.equal(r.reason, 'resumed');
  t.match(r.actions.slice(0, 2), [{ type: 'bind', lease: saved }, { type: 'note', what: 'resumed' }]);
  t.equal(r.s.name, 'RENEWING');
  t.match(r.sent()[0], { kind: 'RENEW', addresses: [{ address: A1 }] });
  t.equal(r.s.deadline, saved.rebindAt);
  const late = new Run().ev({ type: 'start', saved, resume: true }, saved.rebindAt + 1);
  t.equal(late.s.name, 'REBINDING', 'past T2: REBIND');
  const expired = new Run().ev({ type: 'start', saved, resume: true }, saved.expiresAt);
  t.equal(expired.s.name, 'INIT');
  t.notOk(expired.has('bind'));
  const cold = new Run().ev({ type: 'start', saved }, H).timer();
  t.match(cold.sent()[0], { kind: 'SOLICIT', addresses: [{ address: A1 }] });
  t.notOk(cold.actions.some((a) => a.type === 'bind'));
});

t.test('VRRP takeover with no lease of our own: the known address served at once, REBOUND with any server, withdrawn if nobody confirms it', async (t) => {
  const now = 5 * H;
  const r = new Run().ev({ type: 'start', resume: true, known: A1 }, now);
  t.equal(r.reason, 'resumed');
  t.match(r.actions.slice(0, 2), [{ type: 'bind', lease: { address: A1, expiresAt: now + KNOWN_CONFIRM_MS } }, { type: 'note', what: 'resumed', detail: /previous VRRP Master/ }]);
  t.notOk(r.has('persist'), 'nothing saved before a server grants it');
  t.equal(r.s.name, 'REBINDING');
  t.match(r.sent(), [{ kind: 'REBIND', serverId: undefined, addresses: [{ address: A1 }] }], 'REBIND names no server (RFC 8415 §18.2.5)');
  t.equal(r.s.deadline, now + KNOWN_CONFIRM_MS);
  // The server's binding is this DUID's: it extends it.
  const ok = new Run().ev({ type: 'start', resume: true, known: A1 }, now).reply({ server: S2 });
  t.equal(ok.reason, 'renewed');
  t.equal(ok.s.name, 'BOUND');
  t.match(ok.has('persist'), { lease: { address: A1, validSeconds: 43200 } });
  t.ok(ok.s.lease!.serverId.equals(S2), 'the answering server is the lease\'s from now on (its RENEWs go there)');
  t.notOk(ok.has('unbind'), 'the address never left the LAN');
  // It has another address for us: the known one goes, the granted one comes.
  const moved = new Run().ev({ type: 'start', resume: true, known: A1 }, now).reply({ address: A2 });
  t.match(moved.actions.map((a) => a.type), ['unbind', 'bind', 'persist', 'note', 'setTimer']);
  t.match(moved.has('unbind'), { address: A1, cause: 'address-changed' });
  // NoBinding: REQUEST the address from that server, serving it meanwhile.
  const nb = new Run().ev({ type: 'start', resume: true, known: A1 }, now).reply({ iaStatus: Status6.NoBinding, server: S2 });
  t.equal(nb.s.name, 'REQUESTING');
  t.match(nb.sent(), [{ kind: 'REQUEST', addresses: [{ address: A1 }] }]);
  t.notOk(nb.has('unbind'));
  // Nobody answers: REBIND retransmits until the deadline, then the address goes and SOLICIT hints it.
  const silent = new Run().ev({ type: 'start', resume: true, known: A1 }, now);
  let sends = 1;
  while (silent.s.name === 'REBINDING') { silent.timer(); sends += silent.sent().length; }
  t.ok(sends >= 2 && sends <= 4, `${sends} REBINDs in ${KNOWN_CONFIRM_MS} ms`);
  t.match(silent.has('unbind'), { address: A1 });
  t.equal(silent.s.name, 'INIT');
  t.equal(silent.s.hint, A1);
  // A saved lease of our own wins; without resume, known is ignored.
  const first = new Run().bound();
  const saved = (first.has('persist') as { lease: Lease6 }).lease;
  const own = new Run().ev({ type: 'start', saved, resume: true, known: A2 }, 2 * H);
  t.match(own.has('bind'), { lease: saved });
  t.equal(own.s.name, 'RENEWING');
  const cold = new Run().ev({ type: 'start', known: A2 }, H);
  t.notOk(cold.has('bind'));
  t.equal(cold.s.name, 'INIT');
});

t.test('DAD failure: withdraw, DECLINE to the server, SOLICIT again without that address', async (t) => {
  const r = new Run().bound();
  t.equal(r.ev({ type: 'dad-failed', address: A2 }, 1000).reason, 'stale-dad');
  r.ev({ type: 'dad-failed', address: A1 }, 1000);
  t.match(r.has('unbind'), { cause: 'dad-failed', address: A1 });
  t.equal(r.s.name, 'DECLINING');
  t.match(r.sent()[0], { kind: 'DECLINE', addresses: [{ address: A1 }] });
  t.ok(r.sent()[0]!.serverId!.equals(S1));
  r.reply();
  t.equal(r.s.name, 'INIT');
  r.timer();
  t.match(r.sent()[0], { kind: 'SOLICIT', addresses: [] });
  const silent = new Run().bound().ev({ type: 'dad-failed', address: A1 }, 1000);
  for (let i = 0; i < 3; i++) { silent.timer(); t.equal(silent.sent()[0]?.kind, 'DECLINE'); }
  silent.timer();
  t.equal(silent.s.name, 'INIT', 'DEC_MAX_RC: four DECLINEs, then on');
});

t.test('RELEASE only when asked; stop keeps the lease and sends nothing', async (t) => {
  const rel = new Run().bound().ev({ type: 'release' }, 1000);
  t.match(rel.has('unbind'), { cause: 'released' });
  t.match(rel.sent()[0], { kind: 'RELEASE', addresses: [{ address: A1 }] });
  rel.reply();
  t.equal(rel.s.name, 'STOPPED');
  t.ok(rel.has('forget'));
  const unanswered = new Run().bound().ev({ type: 'release' }, 1000);
  for (let i = 0; i < 3; i++) unanswered.timer();
  unanswered.timer();
  t.equal(unanswered.s.name, 'STOPPED', 'REL_MAX_RC: four RELEASEs');
  t.ok(unanswered.has('forget'));
  const stop = new Run().bound().ev({ type: 'stop' }, 1000);
  t.match(stop.has('unbind'), { cause: 'stopped' });
  t.same(stop.sent(), []);
  t.notOk(stop.has('forget'));
  t.equal(stop.s.name, 'STOPPED');
});

t.test('early timers and events while stopped change nothing', async (t) => {
  const r = new Run().bound();
  const before = r.s;
  t.equal(r.ev({ type: 'timer' }, 1).reason, 'early-timer');
  t.equal(r.s, before);
  const stopped = new Run();
  t.equal(stopped.ev({ type: 'timer' }, 1).reason, 'not-running');
  t.equal(stopped.ev({ type: 'reply', packet: answer(MsgType6.REPLY, 0) }, 1).reason, 'not-running');
  t.equal(new Run().bound().ev({ type: 'start' }, 5).reason, 'already-running');
});

t.test('leaseFromReply on dnsmasq\'s captured REPLY', async (t) => {
  const d = decodeDhcp6(Buffer.from(golden.dnsmasqReply.hex, 'hex').subarray(62));
  t.ok(d.ok);
  const l = d.ok ? leaseFromReply(d.value.fields, IAID, undefined, 0) : undefined;
  t.match(l, { ok: true, lease: { t1Seconds: 3600, t2Seconds: 6300, preferredSeconds: 7200, validSeconds: 7500, renewAt: 3600_000, expiresAt: 7500_000 } });
});
