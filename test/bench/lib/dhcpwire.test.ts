// bench/lib/dhcpwire.ts: DISCOVER -> ACK per client MAC from tcpdump's text,
// checked against a capture of busybox udhcpc and dnsmasq 2.90 in a lab.
import t from 'tap';
import { parseTcpdumpDhcp, exchangeTimes } from '../../../bench/lib/dhcpwire';

const CAPTURE = `1795272919.408184 IP (tos 0x0, ttl 64, id 0, offset 0, flags [none], proto UDP (17), length 328)
    0.0.0.0.68 > 255.255.255.255.67: [udp sum ok] BOOTP/DHCP, Request from 5a:cb:7e:df:f0:0f, length 300, xid 0x72b59f61, Flags [none] (0x0000)
	  Client-Ethernet-Address 5a:cb:7e:df:f0:0f
	  Vendor-rfc1048 Extensions
	    Magic Cookie 0x63825363
	    DHCP-Message (53), length 1: Discover
	    MSZ (57), length 2: 576
	    Client-ID (61), length 7: ether 5a:cb:7e:df:f0:0f
1795272919.408713 IP (tos 0xc0, ttl 64, id 8715, offset 0, flags [none], proto UDP (17), length 328)
    10.99.0.1.67 > 10.99.0.112.68: [bad udp cksum 0x167c -> 0x519a!] BOOTP/DHCP, Reply, length 300, xid 0x72b59f61, Flags [none] (0x0000)
	  Your-IP 10.99.0.112
	  Client-Ethernet-Address 5a:cb:7e:df:f0:0f
	  Vendor-rfc1048 Extensions
	    DHCP-Message (53), length 1: Offer
1795272919.440123 IP (tos 0x0, ttl 64, id 0, offset 0, flags [none], proto UDP (17), length 328)
    0.0.0.0.68 > 255.255.255.255.67: [udp sum ok] BOOTP/DHCP, Request from 5a:cb:7e:df:f0:0f, length 300, xid 0x72b59f61, Flags [none] (0x0000)
	  Client-Ethernet-Address 5a:cb:7e:df:f0:0f
	    DHCP-Message (53), length 1: Request
	    Requested-IP (50), length 4: 10.99.0.112
1795272919.447089 IP (tos 0xc0, ttl 64, id 8722, offset 0, flags [none], proto UDP (17), length 328)
    10.99.0.1.67 > 10.99.0.112.68: [bad udp cksum 0x167c -> 0x4e9a!] BOOTP/DHCP, Reply, length 300, xid 0x72b59f61, Flags [none] (0x0000)
	  Client-Ethernet-Address 5a:cb:7e:df:f0:0f
	    DHCP-Message (53), length 1: ACK
`;

t.test('one exchange: four packets, DISCOVER to ACK', async (t) => {
  const p = parseTcpdumpDhcp(CAPTURE);
  t.same(p.map((x) => x.type), ['Discover', 'Offer', 'Request', 'ACK']);
  t.ok(p.every((x) => x.chaddr === '5a:cb:7e:df:f0:0f'));
  const ex = exchangeTimes(p);
  t.equal(ex.size, 1);
  t.ok(Math.abs(ex.get('5a:cb:7e:df:f0:0f')! - 38.905) < 0.01, 'ms between the first DISCOVER and the ACK');
});

t.test('retransmitted DISCOVERs count from the first; clients are kept apart', async (t) => {
  const p = [
    { at: 1000, chaddr: 'a', type: 'Discover' },
    { at: 1500, chaddr: 'b', type: 'Discover' },
    { at: 4000, chaddr: 'a', type: 'Discover' },
    { at: 4010, chaddr: 'a', type: 'ACK' },
    { at: 4020, chaddr: 'a', type: 'ACK' },
    { at: 1600, chaddr: 'c', type: 'ACK' },
  ];
  const ex = exchangeTimes(p);
  t.equal(ex.get('a'), 3010);
  t.notOk(ex.has('b'), 'no ACK: no time');
  t.notOk(ex.has('c'), 'an ACK without a DISCOVER seen: no time');
});

t.test('garbage and truncated text give no packets, never a throw', async (t) => {
  t.same(parseTcpdumpDhcp(''), []);
  t.same(parseTcpdumpDhcp('tcpdump: listening on eth0\nrandom text\n'), []);
  t.same(parseTcpdumpDhcp('1.5 IP (tos 0x0)\n  DHCP-Message (53), length 1: Discover\n'), [], 'no chaddr: dropped');
  t.same(parseTcpdumpDhcp(CAPTURE.slice(0, 300)).length, 0, 'a header cut before the options');
});
