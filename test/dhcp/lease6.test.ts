// Unit tests of the DHCPv6 lease: T1/T2 per RFC 8415 §14.2 and §21.4, the
// address chosen from an IA_NA, and the stored form across a restart.
import t from 'tap';
import { INFINITE_LIFETIME, MsgType6, Opt6, Status6, decodeDhcp6, duidLl, encodeDhcp6, iaAddrOption, iaNaOption, statusOption, type Dhcp6Option } from '../../agent/dhcp/codec6';
import { fromStored6, lease6FileName, lease6Times, leaseFromReply, toStored6, usableAddress } from '../../agent/dhcp/lease6';
import { parseAddress } from '../../agent/address';

const ip6 = (s: string): bigint => parseAddress(s)!.value;
const ME = duidLl('02:00:00:00:d6:01');
const S1 = duidLl('02:00:00:00:aa:01');

function fields(ia: Dhcp6Option[], t1 = 0, t2 = 0, iaid = 7) {
  const d = decodeDhcp6(encodeDhcp6({ type: MsgType6.REPLY, xid: 1, options: [{ code: Opt6.CLIENTID, data: ME }, { code: Opt6.SERVERID, data: S1 }, iaNaOption({ iaid, t1, t2, options: ia })] }));
  if (!d.ok) throw new Error(d.reason);
  return d.value.fields;
}

t.test('T1 and T2: the server\'s, else 0.5 and 0.8 of the preferred lifetime', async (t) => {
  t.same(lease6Times(0, 0, 43200, 43200), { t1: 21600, t2: 34560 });
  t.same(lease6Times(3600, 6300, 7200, 7500), { t1: 3600, t2: 6300 });
  t.same(lease6Times(0, 0, 0, 1000), { t1: 500, t2: 800 }, 'a preferred lifetime of 0 leaves the valid one');
  t.same(lease6Times(0, 9000, 7200, 7500), { t1: 3600, t2: 6000 }, 'T2 at or past expiry: 0.8 x valid');
  t.same(lease6Times(5000, 4000, 7200, 7500).t1, 4000, 'T1 never after T2');
  t.same(lease6Times(0, 0, INFINITE_LIFETIME, INFINITE_LIFETIME), { t1: INFINITE_LIFETIME, t2: INFINITE_LIFETIME });
});

t.test('the usable address of our IA_NA, or why there is none', async (t) => {
  const a = ip6('fd00:99::1'), b = ip6('fd00:99::2');
  t.match(usableAddress(fields([iaAddrOption({ address: a, preferred: 10, valid: 20 }), iaAddrOption({ address: b, preferred: 10, valid: 20 })]), 7, b), { ok: true, address: { address: b } }, 'the one we hold, when listed');
  t.match(usableAddress(fields([iaAddrOption({ address: a, preferred: 30, valid: 20 })]), 7, undefined), { ok: false, problem: 'no-address' }, 'preferred > valid is discarded (§21.6)');
  t.match(usableAddress(fields([iaAddrOption({ address: a, preferred: 0, valid: 0 })]), 7, a), { ok: false, problem: 'no-address' });
  t.match(usableAddress(fields([iaAddrOption({ address: a, preferred: 10, valid: 20 })], 500, 400), 7, undefined), { ok: false, problem: 'bad-t1-t2' }, 'T1 > T2 discards the IA_NA (§21.4)');
  t.match(usableAddress(fields([statusOption(Status6.NoAddrsAvail, 'none')]), 7, undefined), { ok: false, problem: 'NoAddrsAvail', detail: 'none' });
  t.match(usableAddress(fields([iaAddrOption({ address: a, preferred: 10, valid: 20 })], 0, 0, 8), 7, undefined), { ok: false, problem: 'no-ia' });
  t.match(usableAddress(fields([iaAddrOption({ address: a, preferred: 10, valid: 20, options: [statusOption(Status6.NotOnLink, 'x')] })]), 7, undefined), { ok: false, problem: 'no-address' });
});

t.test('stored and read back across a restart with another clock offset', async (t) => {
  const r = leaseFromReply(fields([iaAddrOption({ address: ip6('fd00:99::191'), preferred: 7200, valid: 7500 })], 3600, 6300), 7, undefined, 1000);
  if (!r.ok) { t.fail(r.problem); return; }
  const doc = JSON.parse(JSON.stringify(toStored6(r.lease, 'default/web', ME, 5_000_000))) as unknown;
  t.match(doc, { address: 'fd00:99::191', serverId: S1.toString('hex'), duid: ME.toString('hex') });
  const back = fromStored6(doc, 'default/web', ME, 4_000_000);
  t.ok(back);
  t.equal(back!.address, r.lease.address);
  t.equal(back!.renewAt, r.lease.renewAt + 1_000_000);
  t.ok(back!.serverId.equals(S1));
  t.equal(fromStored6(doc, 'default/web', duidLl('02:00:00:00:d6:02'), 0), undefined, 'another DUID\'s lease is not ours');
  t.equal(fromStored6({ ...(doc as object), address: '10.0.0.1' }, 'default/web', ME, 0), undefined);
  t.equal(fromStored6('garbage', 'default/web', ME, 0), undefined);
  t.equal(lease6FileName('default/web'), 'dhcp6-default_web.json');
});
