// Unit tests of the DHCPv6 address guard: every reason an offered address is
// refused, and the addresses it lets through.
import t from 'tap';
import { GUARD6_REASONS, judgeAddress6, type Host6View, type Guard6Policy } from '../../agent/dhcp/guard6';
import { duidLl } from '../../agent/dhcp/codec6';
import { parseAddress, parseNetwork } from '../../agent/address';

const ip6 = (s: string): bigint => parseAddress(s)!.value;
const host: Host6View = {
  prefixes: [parseNetwork('fd00:99::/64')!, parseNetwork('2001:db8:5::/48')!],
  local: [ip6('fd00:99::10'), ip6('2001:db8:77::1')],
};
const any: Guard6Policy = { allowOtherSubnets: false, servers: [] };
const S1 = duidLl('02:00:00:00:aa:01');

t.test('offered addresses refused, each with its reason', async (t) => {
  const cases: [string, string][] = [
    ['::', 'addr-unspecified'],
    ['::1', 'addr-loopback'],
    ['ff02::1:2', 'addr-multicast'],
    ['ff05::1:3', 'addr-multicast'],
    ['fe80::1', 'addr-link-local'],
    ['febf::1', 'addr-link-local'],
    ['::ffff:10.0.0.1', 'addr-ipv4-mapped'],
    ['fd00:99::10', 'addr-local'],
    ['2001:db8:77::1', 'addr-local'],
    ['fd00:98::5', 'addr-off-prefix'],
  ];
  for (const [a, why] of cases) t.equal(judgeAddress6(ip6(a), S1, host, any), why, a);
  t.same(new Set(cases.map((c) => c[1])).size, GUARD6_REASONS.length - 1, 'every address reason covered (server-not-allowed below)');
});

t.test('addresses on the parent\'s prefixes pass; others only when allowed', async (t) => {
  t.equal(judgeAddress6(ip6('fd00:99::191'), S1, host, any), 'ok');
  t.equal(judgeAddress6(ip6('2001:db8:5:1::9'), S1, host, any), 'ok');
  t.equal(judgeAddress6(ip6('fd00:98::5'), S1, host, { ...any, allowOtherSubnets: true }), 'ok');
  t.equal(judgeAddress6(ip6('fec0::1'), S1, host, { ...any, allowOtherSubnets: true }), 'ok', 'fec0::/10 is not link-local');
  t.equal(judgeAddress6(ip6('fe80::1'), S1, host, { ...any, allowOtherSubnets: true }), 'addr-link-local', 'allowing other subnets never allows link-local');
});

t.test('servers: only the listed DUIDs when a list is given', async (t) => {
  const policy: Guard6Policy = { allowOtherSubnets: false, servers: [duidLl('02:00:00:00:aa:01')] };
  t.equal(judgeAddress6(ip6('fd00:99::191'), S1, host, policy), 'ok');
  t.equal(judgeAddress6(ip6('fd00:99::191'), duidLl('02:00:00:00:aa:02'), host, policy), 'server-not-allowed');
  t.equal(judgeAddress6(ip6('fd00:99::191'), undefined, host, policy), 'server-not-allowed');
});
