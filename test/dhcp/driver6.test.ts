// The DHCPv6 driver's pure helpers: the allow-list's policy from the config
// (dhcp.servers6) and the host view its reply guard judges
// against (the VM's IPv6 addresses but the service macvlan's, the parent's
// on-link prefixes without link-local ones). The driver itself runs against
// real dnsmasq and Kea in test/privileged/dhcp6-dnsmasq.test.ts and
// dhcp6-kea.test.ts.
import t from 'tap';
import type * as os from 'node:os';
import { guard6Of, host6View } from '../../agent/dhcp/driver6';
import { duidLl, formatDuid } from '../../agent/dhcp/codec6';
import { parseConfigText } from '../../agent/config/load';
import { judgeAddress6 } from '../../agent/dhcp/guard6';
import { parseAddress } from '../../agent/address';

const v6 = (s: string): bigint => (parseAddress(s) as { value: bigint }).value;
const a = (address: string, cidr: string | null, family: 'IPv4' | 'IPv6' = 'IPv6'): os.NetworkInterfaceInfo =>
  ({ address, cidr, family, netmask: '', mac: '02:00:00:00:00:01', internal: false, scopeid: 0 });

t.test('host6View: every IPv6 address but the macvlan\'s; prefixes of the parent only, no link-local', async (t) => {
  const view = host6View('eth0', 'lbv1', {
    lo: [a('::1', '::1/128')],
    eth0: [a('10.0.0.2', '10.0.0.2/24', 'IPv4'), a('fe80::1%eth0', 'fe80::1/64'), a('fd00:99::2', 'fd00:99::2/64'), a('2001:db8:1::9', '2001:db8:1::9/128')],
    eth1: [a('fd00:42::2', 'fd00:42::2/64')],
    lbv1: [a('fd00:99::135', 'fd00:99::135/128'), a('fe80::2', 'fe80::2/64')],
  });
  t.same([...view.local].sort(), [v6('::1'), v6('fe80::1'), v6('fd00:99::2'), v6('2001:db8:1::9'), v6('fd00:42::2')].sort());
  t.same(view.prefixes.map((p) => `${p.network.toString(16)}/${p.prefix}`), [`${v6('fd00:99::').toString(16)}/64`], 'the parent\'s /64, not its /128, not another NIC\'s');
  const policy = { allowOtherSubnets: false, servers: [] };
  t.equal(judgeAddress6(v6('fd00:99::135'), undefined, view, policy), 'ok', 'the lease the macvlan holds is renewable');
  t.equal(judgeAddress6(v6('fd00:99::2'), undefined, view, policy), 'addr-local');
  t.equal(judgeAddress6(v6('fd00:42::5'), undefined, view, policy), 'addr-off-prefix', 'another NIC\'s prefix is off the parent\'s link');
});

t.test('guard6Of: dhcp.servers6 as the config loads it admits those servers only, as their SERVERID bytes', async (t) => {
  const allowed = duidLl('02:00:00:00:aa:01');
  const rogue = duidLl('02:00:00:00:aa:66');
  t.equal(formatDuid(allowed), '00:03:00:01:02:00:00:00:aa:01', 'the form dnsmasq and Kea print');
  const loaded = parseConfigText('dhcp: { servers6: ["00:03:00:01:02:00:00:00:AA:01"] }\nservices: []\n');
  if (!loaded.ok) throw new Error('config did not load');
  const policy = guard6Of(loaded.config.dhcp);
  t.ok(policy.servers[0]!.equals(allowed));
  const host = { prefixes: [{ family: 'IPv6' as const, network: v6('fd00:99::'), prefix: 64 }], local: [] };
  t.equal(judgeAddress6(v6('fd00:99::135'), allowed, host, policy), 'ok');
  t.equal(judgeAddress6(v6('fd00:99::135'), rogue, host, policy), 'server-not-allowed');
  t.equal(judgeAddress6(v6('fd00:99::135'), undefined, host, policy), 'server-not-allowed', 'a reply without SERVERID is not from an allowed server');
  const open = guard6Of({ allowOtherSubnets: false, servers6: [] });
  t.equal(judgeAddress6(v6('fd00:99::135'), rogue, host, open), 'ok', 'empty: any server');
});
