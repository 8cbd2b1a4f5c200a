// The VM's addresses as the DHCP guard sees them.
import t from 'tap';
import * as os from 'node:os';
import { addressesChanged, currentInterfaces, localAddresses } from '../../agent/net/local-addresses';
import { parseIPv4 } from '../../agent/ipv4';

type Ifs = ReturnType<typeof os.networkInterfaces>;
const a = (address: string, cidr: string, family: 'IPv4' | 'IPv6' = 'IPv4') => ({ address, cidr, family, netmask: '', mac: '00:00:00:00:00:00', internal: false }) as os.NetworkInterfaceInfo;

t.test('parent subnets, every local address except the excluded macvlan', async (t) => {
  const ifs: Ifs = {
    lo: [a('127.0.0.1', '127.0.0.1/8'), a('::1', '::1/128', 'IPv6')],
    eth0: [a('10.99.0.2', '10.99.0.2/24'), a('10.99.0.200', '10.99.0.200/32')],
    eth1: [a('172.16.5.9', '172.16.5.9/16')],
    lbv1: [a('10.99.0.101', '10.99.0.101/32')],
    lbv2: [a('10.99.0.102', '10.99.0.102/32')],
  };
  const v = localAddresses('eth0', 'lbv1', ifs);
  t.same(v.subnets, [{ network: parseIPv4('10.99.0.0'), prefix: 24 }], 'the pool VIP /32 is no subnet');
  t.same([...v.local].sort(), ['127.0.0.1', '10.99.0.2', '10.99.0.200', '172.16.5.9', '10.99.0.102'].map((s) => parseIPv4(s)!).sort());
});

t.test('reads this host by default', async (t) => {
  const v = localAddresses('lo', 'none');
  t.ok(v.local.includes(parseIPv4('127.0.0.1')!));
});

t.test('the host is read once per event-loop turn, and again after the agent changes an address', async (t) => {
  let reads = 0;
  const host = (): Ifs => { reads++; return { eth0: [a('10.99.0.2', '10.99.0.2/24')], lbv1: [a(`10.99.0.${100 + reads}`, `10.99.0.${100 + reads}/32`)] }; };
  addressesChanged(); // an earlier test may have read the real host in this turn
  const first = currentInterfaces(host);
  t.equal(currentInterfaces(host), first, 'the same turn: the same read');
  t.equal(reads, 1);
  addressesChanged();
  const second = currentInterfaces(host);
  t.equal(reads, 2, 'an address change of our own reads again at once');
  t.same(localAddresses('eth0', 'none', second).local, [parseIPv4('10.99.0.2'), parseIPv4('10.99.0.102')]);
  await new Promise((r) => setImmediate(r));
  currentInterfaces(host);
  t.equal(reads, 3, 'the next turn reads the host again');
});

t.test('one read is parsed once, however many services ask in its turn (issue 18)', async (t) => {
  const ifs: Ifs = { eth0: [a('10.99.0.2', '10.99.0.2/24')], lbv1: [a('10.99.0.101', '10.99.0.101/32')], lbv2: [a('10.99.0.102', '10.99.0.102/32')] };
  let parsed = 0;
  // Count the entries walked: a getter on the family, which every parse reads for each entry.
  for (const list of Object.values(ifs)) {
    for (const e of list ?? []) {
      const family = e.family;
      Object.defineProperty(e, 'family', { get: () => { parsed++; return family; } });
    }
  }
  const one = localAddresses('eth0', 'lbv1', ifs);
  const two = localAddresses('eth0', 'lbv2', ifs);
  t.same(one.local, [parseIPv4('10.99.0.2'), parseIPv4('10.99.0.102')]);
  t.same(two.local, [parseIPv4('10.99.0.2'), parseIPv4('10.99.0.101')]);
  t.same(two.subnets, [{ network: parseIPv4('10.99.0.0'), prefix: 24 }]);
  t.equal(parsed, 3, 'three entries walked once, not once per service');
});
