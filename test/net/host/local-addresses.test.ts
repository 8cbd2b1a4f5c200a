// The VM's addresses as the DHCP guard sees them.
import t from 'tap';
import * as os from 'node:os';
import { HOST_READ_MAX_AGE_MS, addressAdded, addressRemoved, addressesChanged, currentHost, localAddresses, parseRead } from '../../../agent/net/host/local-addresses';
import { parseIPv4 } from '../../../agent/address';

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
  const v = localAddresses('eth0', 'lbv1', parseRead(ifs));
  t.same(v.subnets, [{ network: parseIPv4('10.99.0.0'), prefix: 24 }], 'the pool VIP /32 is no subnet');
  t.same([...v.local].sort(), ['127.0.0.1', '10.99.0.2', '10.99.0.200', '172.16.5.9', '10.99.0.102'].map((s) => parseIPv4(s)!).sort());
});

t.test('reads this host by default', async (t) => {
  const v = localAddresses('lo', 'none');
  t.ok(v.local.includes(parseIPv4('127.0.0.1')!));
});

t.test('one read serves every reply for HOST_READ_MAX_AGE_MS, with the agent\'s own address changes written in (issue 18)', async (t) => {
  let reads = 0;
  const host = (): Ifs => { reads++; return { eth0: [a('10.99.0.2', '10.99.0.2/24')], lbv1: [a(`10.99.0.${100 + reads}`, `10.99.0.${100 + reads}/32`)] }; };
  const ip = (s: string): number => parseIPv4(s)!;
  addressesChanged(); // an earlier test may have read the real host
  const t0 = 1_000_000;
  const first = currentHost(host, t0);
  await new Promise((r) => setImmediate(r));
  t.equal(currentHost(host, t0 + HOST_READ_MAX_AGE_MS - 1), first, 'later turns within the age: the same read');
  t.equal(reads, 1);
  // 50 services binding at start: each VIP is in the view at once, and the host is not read again.
  addressAdded('lbv2', ip('10.99.0.150'));
  addressAdded('lbv2', ip('10.99.0.150'));
  const after = currentHost(host, t0 + 1);
  t.equal(reads, 1, 'an address the agent added needs no read');
  t.same(localAddresses('eth0', 'lbv1', after).local, [ip('10.99.0.2'), ip('10.99.0.150')], 'another service sees the new VIP (once)');
  t.same(localAddresses('eth0', 'lbv2', after).local, [ip('10.99.0.2'), ip('10.99.0.101')], 'its own macvlan is left out');
  addressRemoved('lbv2', ip('10.99.0.150'));
  t.same(localAddresses('eth0', 'lbv1', currentHost(host, t0 + 2)).local, [ip('10.99.0.2')], 'a VIP the agent took off is gone at once');
  t.equal(reads, 1);
  currentHost(host, t0 + HOST_READ_MAX_AGE_MS);
  t.equal(reads, 2, 'an older read is replaced: what other programs changed is seen');
  addressesChanged();
  currentHost(host, t0 + HOST_READ_MAX_AGE_MS + 1);
  t.equal(reads, 3, 'a change the agent does not describe reads again at once');
  currentHost(host, t0);
  t.equal(reads, 4, 'a clock that went back reads again');
});

t.test('one read is parsed once, however many services ask while it is in use (issue 18)', async (t) => {
  const ifs: Ifs = { eth0: [a('10.99.0.2', '10.99.0.2/24')], lbv1: [a('10.99.0.101', '10.99.0.101/32')], lbv2: [a('10.99.0.102', '10.99.0.102/32')] };
  let parsed = 0;
  // Count the entries walked: a getter on the family, which every parse reads for each entry.
  for (const list of Object.values(ifs)) {
    for (const e of list ?? []) {
      const family = e.family;
      Object.defineProperty(e, 'family', { get: () => { parsed++; return family; } });
    }
  }
  addressesChanged();
  const one = localAddresses('eth0', 'lbv1', currentHost(() => ifs, 5));
  const two = localAddresses('eth0', 'lbv2', currentHost(() => ifs, 6));
  t.same(one.local, [parseIPv4('10.99.0.2'), parseIPv4('10.99.0.102')]);
  t.same(two.local, [parseIPv4('10.99.0.2'), parseIPv4('10.99.0.101')]);
  t.same(two.subnets, [{ network: parseIPv4('10.99.0.0'), prefix: 24 }]);
  t.equal(parsed, 3, 'three entries walked once, not once per service');
  addressesChanged();
});
