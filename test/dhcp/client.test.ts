// Unit tests of the pure RFC 2131 client state machine: time is a number we
// pass in, so a 12-hour lease runs in milliseconds; randomness is seeded.
import t from 'tap';
import { prng } from '../helpers/random';
import {
  initialState, isStalled, nakDelay, retransmitDelay, step, unbindReason,
  type ClientAction, type ClientConfig, type ClientContext, type ClientEvent, type ClientState,
} from '../../agent/dhcp/client';
import { buildClientMessage, decodeDhcp, encodeDhcp, type DhcpOption } from '../../agent/dhcp/codec';
import type { Lease } from '../../agent/dhcp/lease';
import { formatIPv4, parseIPv4 } from '../../agent/address';

const ip = (s: string): number => parseIPv4(s)!;
const SEC = 1000;
const HOUR = 3600 * SEC;
const T0 = 1_000_000;
const ADDR = ip('10.99.0.101');
const SERVER = ip('10.99.0.2');
const SERVER_MAC = '52:54:00:aa:00:01';
const MAC = '02:11:22:33:44:55';

const RFC: ClientConfig = {
  requestedIp: undefined, probe: true,
  retransmitInitialMs: 4 * SEC, retransmitMaxMs: 64 * SEC, retransmitJitterMs: 1 * SEC, declineWaitMs: 10 * SEC,
};

function ctx(config: Partial<ClientConfig> = {}, seed = 1): ClientContext {
  return { config: { ...RFC, ...config }, random: prng(seed) };
}

/** A reply as a server would send it, through the real encoder and decoder. */
function reply(kind: 'OFFER' | 'ACK' | 'NAK', xid: number, o: { yiaddr?: number; server?: number | null; lease?: number; t1?: number; t2?: number; message?: string } = {}): ClientEvent {
  const u32 = (code: number, v: number): DhcpOption => { const d = Buffer.alloc(4); d.writeUInt32BE(v >>> 0); return { code, data: d }; };
  const options: DhcpOption[] = [{ code: 53, data: Buffer.from([{ OFFER: 2, ACK: 5, NAK: 6 }[kind]]) }];
  if (o.server !== null) options.push(u32(54, o.server ?? SERVER));
  if (kind !== 'NAK') {
    options.push(u32(51, o.lease ?? 12 * 3600), u32(1, 0xffffff00), u32(3, ip('10.99.0.1')));
    if (o.t1 !== undefined) options.push(u32(58, o.t1));
    if (o.t2 !== undefined) options.push(u32(59, o.t2));
  }
  if (o.message) options.push({ code: 56, data: Buffer.from(o.message) });
  const d = decodeDhcp(encodeDhcp({ op: 2, xid, chaddr: MAC, yiaddr: kind === 'NAK' ? 0 : o.yiaddr ?? ADDR, options }));
  if (!d.ok) throw new Error(d.reason);
  return { type: 'reply', packet: d.value, serverMac: SERVER_MAC };
}

type Send = Extract<ClientAction, { type: 'send' }>;
const sends = (a: readonly ClientAction[]): Send[] => a.filter((x): x is Send => x.type === 'send');
const of = <K extends ClientAction['type']>(a: readonly ClientAction[], type: K): Extract<ClientAction, { type: K }>[] =>
  a.filter((x): x is Extract<ClientAction, { type: K }> => x.type === type);

/** Every message the machine asks to send must encode and decode (table 5 is the codec's job). */
function wire(s: Send): Map<number, Buffer> {
  const d = decodeDhcp(encodeDhcp(buildClientMessage(s.message, { mac: MAC, clientId: Buffer.from([1, 2, 0x11, 0x22, 0x33, 0x44, 0x55]), hostname: 'web' })));
  if (!d.ok) throw new Error(d.reason);
  return new Map(d.value.message.options.map((o) => [o.code, o.data]));
}

/** Run from STOPPED to BOUND with one server; returns the state and the time. */
function acquire(c: ClientContext, opts: { lease?: number; t1?: number; t2?: number } = {}): { s: ClientState; now: number; all: ClientAction[] } {
  const all: ClientAction[] = [];
  let now = T0;
  let r = step(c, initialState(), { type: 'start' }, now);
  all.push(...r.actions);
  now += 300;
  r = step(c, r.state, reply('OFFER', r.state.xid), now);
  all.push(...r.actions);
  now += 200;
  r = step(c, r.state, reply('ACK', r.state.xid, opts), now);
  all.push(...r.actions);
  if (c.config.probe) {
    now += 5 * SEC;
    r = step(c, r.state, { type: 'probe-ok' }, now);
    all.push(...r.actions);
  }
  return { s: r.state, now, all };
}

t.test('DISCOVER, OFFER, REQUEST, ACK, probe, BOUND', async (t) => {
  const c = ctx();
  let r = step(c, initialState(), { type: 'start' }, T0);
  t.equal(r.state.name, 'SELECTING');
  const [disc] = sends(r.actions);
  t.equal(disc!.message.kind, 'DISCOVER');
  t.same(disc!.to, { kind: 'broadcast' });
  t.equal(disc!.srcIp, 0, 'RFC 2131 §4.1: source 0.0.0.0 before an address is held');
  t.notOk(wire(disc!).has(50), 'nothing to ask for yet');
  const xid = r.state.xid;

  r = step(c, r.state, reply('OFFER', xid), T0 + 300);
  t.equal(r.state.name, 'REQUESTING');
  const [req] = sends(r.actions);
  t.equal(req!.message.kind, 'REQUEST');
  t.equal(req!.message.xid, xid, 'the REQUEST carries the DISCOVER/OFFER xid');
  const opts = wire(req!);
  t.equal(opts.get(50)!.readUInt32BE(0), ADDR);
  t.equal(opts.get(54)!.readUInt32BE(0), SERVER, 'SELECTING: server identifier of the chosen offer');

  r = step(c, r.state, reply('ACK', xid), T0 + 500);
  t.same(r.actions.filter((a) => a.type !== 'clearTimer'), [{ type: 'probe', ip: ADDR }], 'ACK: probe the address before binding');
  t.equal(r.state.name, 'REQUESTING');
  t.same(step(c, r.state, reply('ACK', xid), T0 + 600).actions, [], 'replies while probing are ignored');

  r = step(c, r.state, { type: 'probe-ok' }, T0 + 5500);
  t.equal(r.state.name, 'BOUND');
  const [bind] = of(r.actions, 'bind');
  t.equal(bind!.lease.address, ADDR);
  t.equal(bind!.lease.serverMac, SERVER_MAC);
  t.equal(bind!.lease.prefix, 24);
  t.equal(bind!.lease.obtainedAt, T0 + 300, 'RFC 2131 §4.4.1: lease counted from when the REQUEST was sent');
  t.equal(of(r.actions, 'persist').length, 1);
  t.same(of(r.actions, 'note'), [{ type: 'note', what: 'acquired', ms: 5500 }], 'DISCOVER to bound duration');
  t.same(of(r.actions, 'setTimer'), [{ type: 'setTimer', at: T0 + 300 + 6 * HOUR }], 'T1 armed');
});

t.test('a 12-hour lease: RENEWING at 6 h, REBINDING at 10.5 h, expiry at 12 h', async (t) => {
  const c = ctx();
  let { s } = acquire(c);
  const start = s.lease!.obtainedAt;
  const trace: { name: string; at: number; sends: Send[]; actions: readonly ClientAction[] }[] = [];
  // Drive the timers as a driver would, with no server answering.
  for (let i = 0; i < 200 && s.timerAt !== undefined && s.name !== 'SELECTING'; i++) {
    const now = s.timerAt;
    const r = step(c, s, { type: 'timer' }, now);
    trace.push({ name: r.state.name, at: now - start, sends: sends(r.actions), actions: r.actions });
    s = r.state;
  }
  const firstIn = (name: string): number | undefined => trace.find((x) => x.name === name)?.at;
  t.equal(firstIn('RENEWING'), 6 * HOUR, 'T1 = 0.5 x lease (RFC 2131 §4.4.5)');
  t.equal(firstIn('REBINDING'), 10.5 * HOUR, 'T2 = 0.875 x lease');
  const expiry = trace.find((x) => of(x.actions, 'unbind').length > 0)!;
  t.equal(expiry.at, 12 * HOUR, 'withdrawn exactly at expiry');
  const [unbind] = of(expiry.actions, 'unbind');
  t.equal(unbind!.cause, 'expired');
  t.equal(unbind!.at, start + 12 * HOUR);
  t.equal(unbindReason(unbind!, Date.UTC(2026, 0, 1) - T0), `lease of 10.99.0.101 expired at ${new Date(Date.UTC(2026, 0, 1) + 300 + 12 * HOUR).toISOString()}`);
  t.ok(of(expiry.actions, 'forget').length === 1 && of(expiry.actions, 'note').some((n) => n.what === 'expired'));
  t.equal(s.name, 'SELECTING', 'starts over at once');
  const [disc] = expiry.sends;
  t.equal(wire(disc!).get(50)!.readUInt32BE(0), ADDR, 'and asks for the same address back');

  const renewing = trace.filter((x) => x.name === 'RENEWING');
  for (const x of renewing) {
    for (const m of x.sends) {
      t.same(m.to, { kind: 'unicast', ip: SERVER, mac: SERVER_MAC }, 'RENEWING: unicast to the server');
      t.equal(m.srcIp, ADDR, 'from the VIP');
      t.equal(m.message.ciaddr, ADDR);
      const w = wire(m);
      t.notOk(w.has(50) || w.has(54), 'no 50/54 when renewing');
    }
  }
  // §4.4.5: retransmit after half the time remaining to T2, down to 60 s.
  const renewAts = renewing.map((x) => x.at);
  for (let i = 1; i < renewAts.length; i++) {
    const gap = renewAts[i]! - renewAts[i - 1]!;
    const remaining = 10.5 * HOUR - renewAts[i - 1]!;
    t.ok(gap === Math.max(60 * SEC, remaining / 2), `renew retransmission ${i}: ${gap / SEC} s`);
  }
  t.ok(renewAts.length >= 5 && renewAts.length < 40, `bounded number of renewal attempts (${renewAts.length})`);
  const rebinding = trace.filter((x) => x.name === 'REBINDING');
  t.ok(rebinding.length >= 2);
  for (const x of rebinding) for (const m of x.sends) t.same(m.to, { kind: 'broadcast' }, 'REBINDING: broadcast');
  t.equal(trace.filter((x) => of(x.actions, 'note').some((n) => n.what === 'rebinding')).length, 1, 'one rebinding note');
});

t.test('a renewal ACK extends the lease from when the REQUEST was sent', async (t) => {
  const c = ctx();
  const { s } = acquire(c);
  const t1 = s.lease!.renewAt;
  let r = step(c, s, { type: 'timer' }, t1);
  t.equal(r.state.name, 'RENEWING');
  const xid = r.state.xid;
  t.not(xid, s.xid, 'a new exchange, a new xid');
  r = step(c, r.state, reply('ACK', xid), t1 + 40);
  t.equal(r.state.name, 'BOUND');
  t.equal(r.state.lease!.obtainedAt, t1);
  t.equal(r.state.lease!.expiresAt, t1 + 12 * HOUR);
  t.same(r.actions.map((a) => a.type), ['persist', 'note', 'setTimer']);
  t.equal(of(r.actions, 'note')[0]!.what, 'renewed');
  t.equal(of(r.actions, 'bind').length + of(r.actions, 'unbind').length, 0, 'the VIP is untouched by a renewal');
});

t.test('T1 and T2 from options 58 and 59; inconsistent values fall back to the defaults', async (t) => {
  const { s } = acquire(ctx(), { lease: 600, t1: 100, t2: 200 });
  t.equal(s.lease!.renewAt - s.lease!.obtainedAt, 100 * SEC);
  t.equal(s.lease!.rebindAt - s.lease!.obtainedAt, 200 * SEC);
  const bad = acquire(ctx(), { lease: 600, t1: 500, t2: 700 }).s.lease!;
  t.equal(bad.rebindAt - bad.obtainedAt, 525 * SEC, 'T2 beyond the lease: 0.875 x lease');
  t.equal(bad.renewAt - bad.obtainedAt, 500 * SEC, 'T1 <= T2 kept');
  const inf = acquire(ctx(), { lease: 0xffffffff });
  t.equal(inf.s.name, 'BOUND');
  t.equal(inf.s.timerAt, undefined, 'an infinite lease arms no timer');
  t.equal(inf.s.lease!.expiresAt, Infinity);
});

t.test('retransmission: 4 s doubling to 64 s with ±1 s jitter, same xid, secs counting up', async (t) => {
  for (const seed of [1, 2, 3, 99]) {
    const c = ctx({}, seed);
    let r = step(c, initialState(), { type: 'start' }, T0);
    const xid = r.state.xid;
    let last = T0;
    const nominal = [4, 8, 16, 32, 64, 64, 64, 64];
    for (let k = 0; k < nominal.length; k++) {
      const at = r.state.timerAt!;
      const gap = at - last;
      t.ok(gap >= (nominal[k]! - 1) * SEC && gap <= (nominal[k]! + 1) * SEC, `seed ${seed} wait ${k + 1}: ${gap} ms ~ ${nominal[k]} s`);
      r = step(c, r.state, { type: 'timer' }, at);
      const [d] = sends(r.actions);
      t.equal(d!.message.kind, 'DISCOVER');
      t.equal(d!.message.xid, xid);
      t.equal(d!.message.secs, Math.floor((at - T0) / SEC));
      last = at;
    }
    t.ok(isStalled(r.state, c.config), 'status can say no server answers');
  }
  const c = ctx();
  const extremes = [0, 0.999999];
  for (const x of extremes) {
    const d = retransmitDelay(c.config, 1, () => x);
    t.ok(d >= 3 * SEC && d <= 5 * SEC);
  }
  t.equal(retransmitDelay({ ...c.config, retransmitJitterMs: 5000 }, 1, () => 0), 0, 'never negative');
});

t.test('REQUESTING gives up after the retransmission algorithm and starts over', async (t) => {
  const c = ctx({ retransmitInitialMs: 1000, retransmitMaxMs: 4000, retransmitJitterMs: 0 });
  let r = step(c, initialState(), { type: 'start' }, T0);
  const xid = r.state.xid;
  r = step(c, r.state, reply('OFFER', xid), T0 + 10);
  let requests = 1;
  for (let i = 0; i < 10 && r.state.name === 'REQUESTING'; i++) {
    r = step(c, r.state, { type: 'timer' }, r.state.timerAt!);
    requests += sends(r.actions).filter((s) => s.message.kind === 'REQUEST').length;
  }
  t.equal(requests, 3, 'REQUEST sent at 0, +1 s, +2 s; nothing after the 4 s wait');
  t.equal(r.state.name, 'SELECTING');
  t.not(r.state.xid, xid, 'a fresh DISCOVER, a fresh xid');
  t.ok(of(r.actions, 'note').some((n) => n.what === 'request-timeout'));
});

t.test('replies with another xid, or from another server while REQUESTING, are ignored', async (t) => {
  const c = ctx();
  let r = step(c, initialState(), { type: 'start' }, T0);
  const xid = r.state.xid;
  const wrong = step(c, r.state, reply('OFFER', xid ^ 1), T0 + 1);
  t.equal(wrong.reason, 'wrong-xid');
  t.same(wrong.actions, []);
  t.equal(wrong.state, r.state);
  t.equal(step(c, r.state, reply('ACK', xid), T0 + 1).reason, 'unexpected-reply', 'an ACK while SELECTING');
  t.equal(step(c, r.state, reply('OFFER', xid, { server: null }), T0 + 1).reason, 'offer-without-server-id');
  r = step(c, r.state, reply('OFFER', xid), T0 + 2);
  const other = ip('10.99.0.3');
  t.equal(step(c, r.state, reply('NAK', xid, { server: other }), T0 + 3).reason, 'wrong-server', 'a NAK from a server we did not select');
  t.equal(step(c, r.state, reply('ACK', xid, { server: other }), T0 + 3).reason, 'wrong-server');
  t.equal(step(c, r.state, reply('ACK', xid ^ 0x100), T0 + 3).reason, 'wrong-xid');
  const bound = acquire(c).s;
  t.equal(step(c, bound, reply('ACK', bound.xid), T0 + 9 * SEC).reason, 'unexpected-reply', 'a stray ACK while BOUND');
});

t.test('NAK: in REQUESTING start over at once, then back off; in RENEWING withdraw the VIP', async (t) => {
  const c = ctx();
  let r = step(c, initialState(), { type: 'start' }, T0);
  r = step(c, r.state, reply('OFFER', r.state.xid), T0 + 1);
  const firstXid = r.state.xid;
  // Issue 18: dnsmasq offered this address to another client too and leased it to the one that asked first.
  r = step(c, r.state, reply('NAK', r.state.xid, { message: 'address in use' }), T0 + 2);
  t.equal(r.reason, 'nak');
  t.same(of(r.actions, 'note'), [{ type: 'note', what: 'nak', detail: 'address in use' }]);
  t.equal(r.state.name, 'SELECTING', 'the first NAK: DISCOVER again at once (RFC 2131 §3.1 step 5)');
  const [again] = sends(r.actions);
  t.equal(again?.message.kind, 'DISCOVER');
  t.not(r.state.xid, firstXid, 'a new exchange');
  t.notOk(wire(again!).has(50), 'not asking for the refused address');
  t.equal(r.state.timerAt, r.state.nextSendAt, 'the DISCOVER retransmission timer, no wait');

  // The next free address may be on offer to a third client too: a second NAK in a row also restarts at once.
  let now = T0 + 12;
  r = step(c, r.state, reply('OFFER', r.state.xid, { yiaddr: ADDR + 1 }), now);
  r = step(c, r.state, reply('NAK', r.state.xid, { message: 'address in use' }), now + 10);
  t.equal(r.state.name, 'SELECTING', 'the second NAK in a row: DISCOVER again at once');
  t.same(sends(r.actions).map((x) => x.message.kind), ['DISCOVER']);

  // A server that NAKs whatever it offers: from the third NAK on, 4 s doubling to 64 s.
  const waits: number[] = [];
  now += 10;
  for (let i = 0; i < 7; i++) {
    now += 10;
    r = step(c, r.state, reply('OFFER', r.state.xid), now);
    t.equal(r.state.name, 'REQUESTING');
    now += 10;
    r = step(c, r.state, reply('NAK', r.state.xid), now);
    t.equal(r.state.name, 'INIT', `NAK ${i + 3}: waiting`);
    t.same(sends(r.actions), [], 'nothing sent while backing off');
    waits.push(r.state.timerAt! - now);
    now = r.state.timerAt!;
    r = step(c, r.state, { type: 'timer' }, now);
    t.equal(r.state.name, 'SELECTING');
  }
  t.same(waits, [4, 8, 16, 32, 64, 64, 64].map((x) => x * SEC), 'bounded back-off after repeated NAKs');
  t.same([0, 1, 2, 3, 4, 10].map((n) => nakDelay(RFC, n)), [0, 0, 0, 4 * SEC, 8 * SEC, 64 * SEC]);

  // A binding forgets the NAKs: the next refused offer starts over at once again.
  now += 10;
  r = step(c, r.state, reply('OFFER', r.state.xid), now);
  r = step(c, r.state, reply('ACK', r.state.xid), now + 10);
  r = step(c, r.state, { type: 'probe-ok' }, now + 20);
  t.equal(r.state.name, 'BOUND');
  t.equal(r.state.naks, 0, 'NAKs counted since the last binding only');

  const { s } = acquire(c);
  r = step(c, s, { type: 'timer' }, s.lease!.renewAt);
  r = step(c, r.state, reply('NAK', r.state.xid, { message: 'wrong network' }), s.lease!.renewAt + 5);
  const [u] = of(r.actions, 'unbind');
  t.equal(u!.cause, 'nak');
  t.equal(u!.detail, 'wrong network');
  t.match(unbindReason(u!, 0), /DHCPNAK: wrong network/);
  t.ok(of(r.actions, 'forget').length === 1);
  t.equal(r.state.name, 'SELECTING', 'DISCOVER again at once');
  t.notOk(wire(sends(r.actions)[0]!).has(50), 'not asking for the refused address');
  t.equal(r.state.lease, undefined);
});

function savedLease(now: number, o: { expiresIn?: number } = {}): Lease {
  const exp = o.expiresIn ?? 6 * HOUR;
  return {
    address: ADDR, prefix: 24, serverId: SERVER, serverMac: SERVER_MAC, routers: [], dns: [], leaseSeconds: 12 * 3600,
    t1Seconds: 6 * 3600, t2Seconds: 10.5 * 3600,
    obtainedAt: now + exp - 12 * HOUR, renewAt: now + exp - 6 * HOUR, rebindAt: now + exp - 1.5 * HOUR, expiresAt: now + exp,
  };
}

t.test('INIT-REBOOT from a saved lease asks for the same address', async (t) => {
  const c = ctx();
  let r = step(c, initialState(), { type: 'start', saved: savedLease(T0) }, T0);
  t.equal(r.state.name, 'INIT-REBOOT');
  const [req] = sends(r.actions);
  t.equal(req!.message.kind, 'REQUEST');
  const w = wire(req!);
  t.equal(w.get(50)!.readUInt32BE(0), ADDR, 'option 50 = the saved address');
  t.notOk(w.has(54), 'no server identifier (RFC 2131 §4.4.2)');
  t.equal(req!.message.ciaddr, 0);
  t.same(req!.to, { kind: 'broadcast' });
  r = step(c, r.state, reply('ACK', r.state.xid), T0 + 50);
  t.same(of(r.actions, 'probe'), [{ type: 'probe', ip: ADDR }]);
  r = step(c, r.state, { type: 'probe-ok' }, T0 + 5 * SEC);
  t.equal(r.state.name, 'BOUND');
  t.equal(r.state.lease!.expiresAt, T0 + 12 * HOUR, 'the new lease runs from the INIT-REBOOT REQUEST');

  const nak = step(c, step(c, initialState(), { type: 'start', saved: savedLease(T0) }, T0).state, reply('NAK', 0), T0);
  t.equal(nak.reason, 'wrong-xid');
  let n = step(c, initialState(), { type: 'start', saved: savedLease(T0) }, T0);
  n = step(c, n.state, reply('NAK', n.state.xid), T0 + 10);
  t.equal(n.state.name, 'SELECTING');
  t.ok(of(n.actions, 'forget').length === 1, 'a NAKed saved lease is forgotten');
  t.notOk(wire(sends(n.actions)[0]!).has(50));

  const expired = step(c, initialState(), { type: 'start', saved: savedLease(T0, { expiresIn: -1 }) }, T0);
  t.equal(expired.state.name, 'SELECTING', 'an expired saved lease: DISCOVER');
  t.equal(wire(sends(expired.actions)[0]!).get(50)!.readUInt32BE(0), ADDR, 'asking for the old address');

  const lbip = ctx({ requestedIp: ip('10.99.0.140') });
  const d = step(lbip, initialState(), { type: 'start' }, T0);
  t.equal(formatIPv4(wire(sends(d.actions)[0]!).get(50)!.readUInt32BE(0)), '10.99.0.140', 'loadBalancerIP asked for in DISCOVER');
});

t.test('INIT-REBOOT unanswered: the unexpired saved lease is used after a probe (RFC 2131 §3.2)', async (t) => {
  const c = ctx({ retransmitInitialMs: 1000, retransmitMaxMs: 2000, retransmitJitterMs: 0 });
  let r = step(c, initialState(), { type: 'start', saved: savedLease(T0, { expiresIn: 2 * HOUR }) }, T0);
  for (let i = 0; i < 5 && of(r.actions, 'probe').length === 0; i++) r = step(c, r.state, { type: 'timer' }, r.state.timerAt!);
  t.same(of(r.actions, 'probe'), [{ type: 'probe', ip: ADDR }]);
  const conflict = step(c, r.state, { type: 'probe-conflict', mac: '02:00:00:00:00:09' }, T0 + 10 * SEC);
  t.same(sends(conflict.actions), [], 'no DECLINE for a lease no server confirmed');
  t.equal(conflict.state.name, 'INIT');
  r = step(c, r.state, { type: 'probe-ok' }, T0 + 10 * SEC);
  // 2 h left of a 12 h lease: T1 is past, T2 (1.5 h before expiry) not yet: bind, then renew at once.
  t.same(r.actions.map((a) => a.type), ['bind', 'persist', 'note', 'send', 'note', 'setTimer']);
  t.equal(r.state.name, 'RENEWING', 'T1 already past: renewing straight away');
  t.equal(sends(r.actions)[0]!.to.kind, 'unicast');
});

t.test('resume: an unexpired saved lease is served at once, no probe, and confirmed by a REQUEST (crash-only start)', async (t) => {
  const c = ctx();
  const r = step(c, initialState(), { type: 'start', saved: savedLease(T0), resume: true }, T0);
  t.equal(r.reason, 'resumed');
  t.same(of(r.actions, 'bind').map((b) => b.lease.address), [ADDR], 'bound in the same step: clients keep the VIP');
  t.same(of(r.actions, 'probe'), [], 'no ARP probe of an address that never left us');
  t.same(of(r.actions, 'forget'), []);
  t.equal(r.state.name, 'RENEWING', 'the confirmation is a RENEWING exchange');
  const [req] = sends(r.actions);
  t.equal(req!.message.kind, 'REQUEST');
  t.equal(req!.message.ciaddr, ADDR, 'ciaddr = the address in use (RFC 2131 §4.3.2)');
  t.same(req!.to, { kind: 'unicast', ip: SERVER, mac: SERVER_MAC }, 'unicast to the server that granted it');
  t.equal(req!.srcIp, ADDR);

  const ack = step(c, r.state, reply('ACK', r.state.xid), T0 + 20);
  t.equal(ack.state.name, 'BOUND');
  t.same(of(ack.actions, 'unbind'), [], 'confirmed: nothing withdrawn');
  t.same(of(ack.actions, 'bind'), [], 'and not bound twice');
  t.equal(of(ack.actions, 'persist').length, 1, 'the refreshed lease is saved');
  t.equal(ack.state.lease!.expiresAt, T0 + 12 * HOUR, 'the lease now runs from the confirming REQUEST');

  const nak = step(c, r.state, reply('NAK', r.state.xid, { message: 'wrong network' }), T0 + 20);
  t.same(of(nak.actions, 'unbind').map((u) => [u.address, u.cause]), [[ADDR, 'nak']], 'a NAK withdraws the resumed address');
  t.equal(of(nak.actions, 'forget').length, 1);
  t.equal(nak.state.name, 'SELECTING', 'and a new lease is sought at once');

  const late = step(c, initialState(), { type: 'start', saved: savedLease(T0, { expiresIn: HOUR }), resume: true }, T0);
  t.equal(late.state.name, 'REBINDING', 'past T2: the confirmation is broadcast (REBINDING)');
  t.equal(of(late.actions, 'bind').length, 1);

  const expired = step(c, initialState(), { type: 'start', saved: savedLease(T0, { expiresIn: -1 }), resume: true }, T0);
  t.equal(expired.state.name, 'SELECTING', 'an expired lease never resumes');
  t.same(of(expired.actions, 'bind'), []);
  const plain = step(c, initialState(), { type: 'start', saved: savedLease(T0) }, T0);
  t.equal(plain.state.name, 'INIT-REBOOT', 'without resume: INIT-REBOOT and a probe, as before');
});

t.test('VRRP takeover with no lease of our own: the previous Master\'s VIP is served at once and confirmed by INIT-REBOOT', async (t) => {
  const c = ctx({ probe: false });
  const start = (): ReturnType<typeof step> => step(c, initialState(), { type: 'start', resume: true, known: ADDR }, T0);
  const r = start();
  t.equal(r.reason, 'resumed');
  t.same(of(r.actions, 'hold').map((h) => h.address), [ADDR], 'on the LAN in the same step: clients reach the new Master at once');
  t.same(of(r.actions, 'bind'), [], 'no lease to bind yet');
  t.same(of(r.actions, 'probe'), [], 'no ARP probe: the election decided');
  t.equal(r.state.name, 'INIT-REBOOT');
  t.equal(r.state.provisional, ADDR);
  const [req] = sends(r.actions);
  t.equal(req!.message.kind, 'REQUEST');
  t.equal(req!.message.ciaddr, 0, 'INIT-REBOOT: ciaddr 0 (RFC 2131 table 5)');
  t.equal(wire(req!).get(50)!.readUInt32BE(0), ADDR, 'option 50 = the advertised address');
  t.notOk(wire(req!).has(54), 'no server identifier: we do not know which server granted it');
  t.same(req!.to, { kind: 'broadcast' });

  const ack = step(c, r.state, reply('ACK', r.state.xid), T0 + 20);
  t.equal(ack.state.name, 'BOUND', 'the server confirms: a lease of our own');
  t.same(of(ack.actions, 'unbind'), [], 'nothing withdrawn');
  t.same(of(ack.actions, 'bind').map((b) => b.lease.address), [ADDR]);
  t.equal(of(ack.actions, 'persist').length, 1, 'and saved, for a crash-only start on this VM');
  t.equal(ack.state.provisional, undefined);

  const moved = step(c, r.state, reply('ACK', r.state.xid, { yiaddr: ip('10.99.0.120') }), T0 + 20);
  t.same(of(moved.actions, 'unbind').map((u) => [u.address, u.cause]), [[ADDR, 'address-changed']], 'another address: the advertised one comes off first');
  t.same(of(moved.actions, 'bind').map((b) => b.lease.address), [ip('10.99.0.120')]);

  const nak = step(c, r.state, reply('NAK', r.state.xid, { message: 'wrong network' }), T0 + 20);
  t.same(of(nak.actions, 'unbind').map((u) => [u.address, u.cause]), [[ADDR, 'nak']], 'a NAK withdraws it');
  t.equal(nak.state.name, 'SELECTING', 'and a lease is sought at once');

  // Nobody answers: after the retransmission algorithm the address comes off.
  let s = r.state;
  let timeout: ReturnType<typeof step> | undefined;
  for (let i = 0; i < 20 && s.name === 'INIT-REBOOT'; i++) {
    timeout = step(c, s, { type: 'timer' }, s.timerAt!);
    s = timeout.state;
  }
  t.equal(s.name, 'SELECTING', 'silence: back to INIT');
  const [off] = of(timeout!.actions, 'unbind');
  t.equal(off?.cause, 'unconfirmed', 'an address no server confirmed is not kept');
  t.match(unbindReason(off!, 0), /no DHCP server confirmed 10\.99\.0\.101/);
  t.equal(wire(sends(timeout!.actions)[0]!).get(50)!.readUInt32BE(0), ADDR, 'and asked for again');

  const conflict = step(c, r.state, { type: 'conflict', address: ADDR, mac: '52:54:00:00:00:99' }, T0 + 50);
  t.same(of(conflict.actions, 'unbind').map((u) => [u.address, u.cause]), [[ADDR, 'conflict']], 'a host that insists on it wins: no lease of ours to defend');
  t.equal(conflict.state.name, 'INIT');
  t.same(conflict.state.declined, [ADDR], 'and it is not asked for again');

  const stop = step(c, r.state, { type: 'stop' }, T0 + 50);
  t.same(of(stop.actions, 'unbind').map((u) => [u.address, u.cause]), [[ADDR, 'stopped']], 'a stop (back to Backup) takes it off');

  const own = step(c, initialState(), { type: 'start', saved: savedLease(T0), resume: true, known: ip('10.99.0.77') }, T0);
  t.same(of(own.actions, 'bind').map((b) => b.lease.address), [ADDR], 'a saved unexpired lease of our own wins over the advert');
  t.same(of(own.actions, 'hold'), []);
  const plain = step(c, initialState(), { type: 'start', known: ADDR }, T0);
  t.same(of(plain.actions, 'hold'), [], 'without resume (not a takeover) the advert is not used');
  t.equal(plain.state.name, 'SELECTING');
});

t.test('ARP conflict: DECLINE, wait declineWait, DISCOVER again', async (t) => {
  const c = ctx();
  let r = step(c, initialState(), { type: 'start' }, T0);
  r = step(c, r.state, reply('OFFER', r.state.xid), T0 + 1);
  r = step(c, r.state, reply('ACK', r.state.xid), T0 + 2);
  r = step(c, r.state, { type: 'probe-conflict', mac: '02:00:00:00:00:09' }, T0 + 5 * SEC);
  const [dec] = sends(r.actions);
  t.equal(dec!.message.kind, 'DECLINE');
  t.same(dec!.to, { kind: 'broadcast' }, 'RFC 2131 §4.4.4: DECLINE is broadcast');
  const w = wire(dec!);
  t.equal(w.get(50)!.readUInt32BE(0), ADDR);
  t.equal(w.get(54)!.readUInt32BE(0), SERVER);
  t.equal(w.get(56)!.toString(), 'address in use by 02:00:00:00:00:09');
  t.same(of(r.actions, 'bind'), [], 'never bound');
  t.ok(of(r.actions, 'note').some((n) => n.what === 'declined'));
  t.equal(r.state.name, 'INIT');
  t.equal(r.state.timerAt, T0 + 5 * SEC + 10 * SEC, 'RFC 2131 §3.1.5: 10 s before starting over');
  t.same(step(c, r.state, { type: 'timer' }, T0 + 6 * SEC).actions, [{ type: 'setTimer', at: T0 + 15 * SEC }], 'an early timer re-arms');
  r = step(c, r.state, { type: 'timer' }, T0 + 15 * SEC);
  t.equal(r.state.name, 'SELECTING');
  t.notOk(wire(sends(r.actions)[0]!).has(50), 'the declined address is not asked for');

  // loadBalancerIP found in use: not asked for again (a server without a ping check would offer it again).
  const lb = ctx({ requestedIp: ADDR });
  let l = step(lb, initialState(), { type: 'start' }, T0);
  t.equal(wire(sends(l.actions)[0]!).get(50)!.readUInt32BE(0), ADDR);
  l = step(lb, l.state, reply('OFFER', l.state.xid), T0 + 1);
  l = step(lb, l.state, reply('ACK', l.state.xid), T0 + 2);
  l = step(lb, l.state, { type: 'probe-conflict' }, T0 + 3);
  l = step(lb, l.state, { type: 'timer' }, l.state.timerAt!);
  t.notOk(wire(sends(l.actions)[0]!).has(50), 'the declined loadBalancerIP is not requested again');
  l = step(lb, l.state, reply('OFFER', l.state.xid, { yiaddr: ip('10.99.0.130') }), l.state.timerAt! - 1);
  l = step(lb, l.state, reply('ACK', l.state.xid, { yiaddr: ip('10.99.0.130') }), l.state.timerAt! - 1);
  l = step(lb, l.state, { type: 'probe-ok' }, T0 + 20 * SEC);
  t.equal(l.state.name, 'BOUND');
  t.same(l.state.declined, [], 'forgotten once bound');
});

t.test('probe failure: neither bind nor decline; retry shortly', async (t) => {
  const c = ctx();
  let r = step(c, initialState(), { type: 'start' }, T0);
  r = step(c, r.state, reply('OFFER', r.state.xid), T0 + 1);
  r = step(c, r.state, reply('ACK', r.state.xid), T0 + 2);
  r = step(c, r.state, { type: 'probe-failed', error: 'ENETDOWN' }, T0 + 3);
  t.same(sends(r.actions), []);
  t.equal(r.state.name, 'INIT');
  t.equal(r.state.timerAt, T0 + 3 + 4 * SEC);
});

t.test('probeOffer off: ACK binds directly', async (t) => {
  const c = ctx({ probe: false });
  const { s, all } = acquire(c);
  t.equal(s.name, 'BOUND');
  t.same(of(all, 'probe'), []);
});

t.test('release sends DHCPRELEASE to the server; stop sends nothing and keeps the lease', async (t) => {
  const c = ctx();
  const { s, now } = acquire(c);
  const rel = step(c, s, { type: 'release' }, now + 1000);
  t.equal(rel.state.name, 'STOPPED');
  const [m] = sends(rel.actions);
  t.equal(m!.message.kind, 'RELEASE');
  t.same(m!.to, { kind: 'unicast', ip: SERVER, mac: SERVER_MAC });
  t.equal(m!.message.ciaddr, ADDR);
  t.equal(m!.srcIp, ADDR);
  t.same(of(rel.actions, 'unbind').map((u) => u.cause), ['released']);
  t.equal(of(rel.actions, 'forget').length, 1);
  t.equal(rel.state.timerAt, undefined);

  const stop = step(c, s, { type: 'stop' }, now + 1000);
  t.equal(stop.state.name, 'STOPPED');
  t.same(stop.actions.map((a) => a.type), ['unbind', 'clearTimer']);
  t.equal(of(stop.actions, 'unbind')[0]!.cause, 'stopped');
  t.equal(step(c, stop.state, { type: 'release' }, now).reason, 'not-running');
  t.equal(step(c, stop.state, { type: 'timer' }, now).reason, 'not-running');

  const selecting = step(c, initialState(), { type: 'start' }, T0).state;
  t.same(sends(step(c, selecting, { type: 'release' }, T0).actions), [], 'nothing held, nothing released');
  const reboot = step(c, initialState(), { type: 'start', saved: savedLease(T0) }, T0).state;
  t.equal(sends(step(c, reboot, { type: 'release' }, T0).actions)[0]!.message.kind, 'RELEASE', 'a saved lease is released too');
  t.equal(step(c, s, { type: 'start' }, now).reason, 'already-running');
});

t.test('a renewal ACK for another address moves the VIP', async (t) => {
  const c = ctx();
  const { s } = acquire(c);
  let r = step(c, s, { type: 'timer' }, s.lease!.renewAt);
  r = step(c, r.state, reply('ACK', r.state.xid, { yiaddr: ip('10.99.0.120') }), s.lease!.renewAt + 1);
  t.same(of(r.actions, 'unbind').map((u) => [u.cause, formatIPv4(u.address)]), [['address-changed', '10.99.0.101']]);
  t.same(of(r.actions, 'probe'), [{ type: 'probe', ip: ip('10.99.0.120') }]);
  r = step(c, r.state, { type: 'probe-ok' }, s.lease!.renewAt + 5 * SEC);
  t.equal(r.state.name, 'BOUND');
  t.equal(formatIPv4(r.state.lease!.address), '10.99.0.120');
});

t.test('a long pause (suspended VM) past expiry withdraws at once', async (t) => {
  const c = ctx();
  const { s } = acquire(c);
  const r = step(c, s, { type: 'timer' }, s.lease!.expiresAt + HOUR);
  t.same(of(r.actions, 'unbind').map((u) => u.cause), ['expired']);
  t.equal(r.state.name, 'SELECTING');
});

t.test('random event sequences keep the invariants (bounded, seeded)', async (t) => {
  const c = ctx({ retransmitInitialMs: 1000, retransmitMaxMs: 8000 }, 7);
  const rnd = prng(42);
  let s = initialState();
  let now = T0;
  let bound = false;
  let problems = 0;
  for (let i = 0; i < 5000; i++) {
    now += Math.floor(rnd() * 30 * SEC);
    const pick = rnd();
    const xid = rnd() < 0.8 ? s.xid : Math.floor(rnd() * 2 ** 32);
    const ev: ClientEvent =
      pick < 0.05 ? { type: 'start', saved: rnd() < 0.5 ? savedLease(now) : undefined }
        : pick < 0.35 ? { type: 'timer' }
          : pick < 0.45 ? reply('OFFER', xid)
            : pick < 0.65 ? reply('ACK', xid, { lease: 20 + Math.floor(rnd() * 100) })
              : pick < 0.7 ? reply('NAK', xid)
                : pick < 0.8 ? { type: 'probe-ok' }
                  : pick < 0.85 ? { type: 'probe-conflict' }
                    : pick < 0.88 ? { type: 'probe-failed', error: 'x' }
                      : pick < 0.9 ? { type: 'release' }
                        : pick < 0.92 ? { type: 'stop' }
                          : { type: 'timer' };
    const r = step(c, s, ev, now);
    for (const a of r.actions) {
      if (a.type === 'bind') { if (bound) problems++; bound = true; }
      if (a.type === 'unbind') { if (!bound) problems++; bound = false; }
      if (a.type === 'setTimer' && !(Number.isFinite(a.at) && a.at >= now - 1)) problems++;
      if (a.type === 'send') wire(a);
    }
    s = r.state;
    const holds = s.name === 'BOUND' || s.name === 'RENEWING' || s.name === 'REBINDING';
    if (holds !== (s.lease !== undefined)) problems++;
    if (holds !== bound) problems++;
  }
  t.equal(problems, 0, 'bind/unbind alternate, a lease exactly in BOUND/RENEWING/REBINDING, timers in the future');
});

t.test('a host that insists on the bound address: unbind, DECLINE, wait declineWait, another lease', async (t) => {
  const c = ctx();
  const OTHER = '52:54:00:00:00:99';
  const { s, now } = acquire(c);
  t.equal(s.name, 'BOUND');
  t.equal(step(c, s, { type: 'conflict', address: ip('10.99.0.199'), mac: OTHER }, now + 1).reason, 'stale-conflict', 'a verdict about another address changes nothing');
  const r = step(c, s, { type: 'conflict', address: ADDR, mac: OTHER }, now + SEC);
  t.equal(r.reason, 'conflict');
  const [unbind] = of(r.actions, 'unbind');
  t.match(unbind, { address: ADDR, cause: 'conflict', at: now + SEC, detail: OTHER }, 'the address is withdrawn first');
  t.ok(r.actions.indexOf(unbind!) < r.actions.indexOf(sends(r.actions)[0]!), 'before the DECLINE goes out');
  t.match(unbindReason(unbind!, 0), /52:54:00:00:00:99 insisted on 10\.99\.0\.101 .*declined it/);
  const [dec] = sends(r.actions);
  t.equal(dec!.message.kind, 'DECLINE');
  t.same(dec!.to, { kind: 'broadcast' });
  t.equal(dec!.srcIp, 0, 'from 0.0.0.0: we no longer hold the address');
  const w = wire(dec!);
  t.equal(w.get(50)!.readUInt32BE(0), ADDR, 'option 50: the declined address');
  t.equal(w.get(54)!.readUInt32BE(0), SERVER, 'option 54: the server that leased it');
  t.equal(w.get(56)!.toString(), `address in use by ${OTHER}`);
  t.ok(of(r.actions, 'forget').length === 1, 'the saved lease is forgotten');
  t.ok(of(r.actions, 'note').some((n) => n.what === 'declined'));
  t.equal(r.state.name, 'INIT');
  t.equal(r.state.lease, undefined);
  t.same(r.state.declined, [ADDR]);
  t.equal(r.state.timerAt, now + SEC + 10 * SEC, 'RFC 2131 §3.1.5: declineWait before DISCOVER');
  const d = step(c, r.state, { type: 'timer' }, now + 11 * SEC);
  t.equal(d.state.name, 'SELECTING');
  t.notOk(wire(sends(d.actions)[0]!).has(50), 'the declined address is not asked for again');
  let n = step(c, d.state, reply('OFFER', d.state.xid, { yiaddr: ip('10.99.0.102') }), now + 12 * SEC);
  n = step(c, n.state, reply('ACK', n.state.xid, { yiaddr: ip('10.99.0.102') }), now + 12 * SEC);
  n = step(c, n.state, { type: 'probe-ok' }, now + 13 * SEC);
  t.equal(n.state.name, 'BOUND');
  t.same(of(n.actions, 'bind').map((b) => b.lease.address), [ip('10.99.0.102')], 'another lease bound');

  // RENEWING and REBINDING hold the address too.
  const renewing = step(c, s, { type: 'timer' }, s.lease!.renewAt).state;
  t.equal(renewing.name, 'RENEWING');
  t.equal(step(c, renewing, { type: 'conflict', address: ADDR }, s.lease!.renewAt + 1).state.name, 'INIT');
  const rebinding = step(c, renewing, { type: 'timer' }, s.lease!.rebindAt).state;
  t.equal(rebinding.name, 'REBINDING');
  const rb = step(c, rebinding, { type: 'conflict', address: ADDR }, s.lease!.rebindAt + 1);
  t.equal(rb.state.name, 'INIT');
  t.equal(wire(sends(rb.actions)[0]!).get(56)!.toString(), 'address in use');

  // Nothing is held in any other state: nothing to give up.
  for (const st of [initialState(), step(c, initialState(), { type: 'start' }, T0).state, r.state]) {
    const x = step(c, st, { type: 'conflict', address: ADDR, mac: OTHER }, now + 20 * SEC);
    t.equal(x.reason, 'not-bound', `${st.name}: ignored`);
    t.same(x.actions, []);
  }
});
