// The DHCP guard: every rule refuses what it names, with its own reason, and
// nothing else; a valid offer on the parent's subnet passes.
import t from 'tap';
import { judgeAddress, judgeReply, GUARD_REASONS, type ReplyFacts, type HostView, type GuardPolicy } from '../../agent/dhcp/guard';
import { parseIPv4, parseCidr } from '../../agent/address';

const ip = (s: string): number => parseIPv4(s)!;
const host: HostView = {
  subnets: [parseCidr('10.99.0.0/24')!],
  // parent 10.99.0.2, another service's VIP 10.99.0.120, loopback, a second NIC
  local: [ip('10.99.0.2'), ip('10.99.0.120'), ip('127.0.0.1'), ip('172.16.5.9')],
};
const any: GuardPolicy = { allowOtherSubnets: false, servers: [] };
const offer = (o: Partial<ReplyFacts> = {}): ReplyFacts => ({
  kind: 'OFFER', yiaddr: ip('10.99.0.101'), serverId: ip('10.99.0.1'), srcIp: ip('10.99.0.1'), routers: [ip('10.99.0.254')], prefix: 24, ...o,
});

t.test('a valid offer and ack pass', async (t) => {
  t.equal(judgeReply(offer(), host, any), 'ok');
  t.equal(judgeReply(offer({ kind: 'ACK' }), host, any), 'ok');
  t.equal(judgeReply(offer({ routers: [], prefix: undefined, serverId: undefined }), host, any), 'ok');
});

t.test('every yiaddr rule', async (t) => {
  const cases: [string, string][] = [
    ['0.0.0.0', 'yiaddr-zero'],
    ['0.1.2.3', 'yiaddr-zero'],
    ['127.0.0.1', 'yiaddr-loopback'],
    ['127.5.5.5', 'yiaddr-loopback'],
    ['224.0.0.5', 'yiaddr-multicast'],
    ['239.255.255.250', 'yiaddr-multicast'],
    ['255.255.255.255', 'yiaddr-broadcast'],
    ['10.99.0.0', 'yiaddr-network'],
    ['10.99.0.255', 'yiaddr-subnet-broadcast'],
    ['10.99.0.2', 'yiaddr-local'],
    ['10.99.0.120', 'yiaddr-local'],
    ['172.16.5.9', 'yiaddr-local'],
    ['10.99.0.1', 'yiaddr-server'],
    ['10.99.0.254', 'yiaddr-router'],
    ['192.168.77.10', 'yiaddr-off-subnet'],
  ];
  for (const [a, reason] of cases) {
    for (const kind of ['OFFER', 'ACK'] as const) t.equal(judgeReply(offer({ kind, yiaddr: ip(a) }), host, any), reason, `${kind} ${a}: ${reason}`);
  }
  t.equal(judgeReply(offer({ yiaddr: ip('10.99.0.7'), serverId: ip('10.99.0.7'), srcIp: ip('10.99.0.3') }), host, any), 'yiaddr-server', 'the server identifier');
  t.equal(judgeReply(offer({ yiaddr: ip('10.99.0.3'), srcIp: ip('10.99.0.3') }), host, any), 'yiaddr-server', 'the IP source of the reply (a relay or a server without option 54)');
  const covered = new Set(cases.map((c) => c[1]));
  t.same(GUARD_REASONS.filter((r) => r !== 'server-not-allowed' && !covered.has(r)), [], 'every reason has a case');
});

t.test('another subnet: refused unless allowed, then judged by the subnet the reply names', async (t) => {
  const other: GuardPolicy = { allowOtherSubnets: true, servers: [] };
  t.equal(judgeReply(offer({ yiaddr: ip('192.168.77.10') }), host, other), 'ok');
  t.equal(judgeReply(offer({ yiaddr: ip('192.168.77.0') }), host, other), 'yiaddr-network');
  t.equal(judgeReply(offer({ yiaddr: ip('192.168.77.255') }), host, other), 'yiaddr-subnet-broadcast');
  t.equal(judgeReply(offer({ yiaddr: ip('192.168.77.255'), prefix: undefined }), host, other), 'ok', 'no mask, no subnet to judge by');
  t.equal(judgeReply(offer({ yiaddr: ip('224.0.0.5') }), host, other), 'yiaddr-multicast', 'the absolute rules still hold');
  t.equal(judgeReply(offer({ yiaddr: ip('10.99.0.2') }), host, other), 'yiaddr-local');
});

t.test('/31 and /32 subnets have no network or broadcast address (RFC 3021)', async (t) => {
  const p2p: HostView = { subnets: [parseCidr('10.1.1.0/31')!], local: [ip('10.1.1.1')] };
  t.equal(judgeReply(offer({ yiaddr: ip('10.1.1.0'), serverId: ip('10.9.9.9'), srcIp: ip('10.9.9.9'), routers: [] }), p2p, any), 'ok');
});

t.test('no parent subnet known: everything is off-subnet unless allowed', async (t) => {
  t.equal(judgeReply(offer(), { subnets: [], local: [] }, any), 'yiaddr-off-subnet');
  t.equal(judgeReply(offer(), { subnets: [], local: [] }, { allowOtherSubnets: true, servers: [] }), 'ok');
});

t.test('dhcp.servers: only listed server identifiers, NAKs included', async (t) => {
  const only: GuardPolicy = { allowOtherSubnets: false, servers: [ip('10.99.0.1')] };
  t.equal(judgeReply(offer(), host, only), 'ok');
  t.equal(judgeReply(offer({ serverId: ip('10.99.0.66'), srcIp: ip('10.99.0.66') }), host, only), 'server-not-allowed');
  t.equal(judgeReply(offer({ serverId: undefined }), host, only), 'server-not-allowed', 'no server identifier');
  t.equal(judgeReply(offer({ kind: 'NAK', yiaddr: 0, serverId: ip('10.99.0.66') }), host, only), 'server-not-allowed', 'a rogue NAK');
  t.equal(judgeReply(offer({ kind: 'NAK', yiaddr: 0 }), host, only), 'ok', 'a NAK carries no address to judge');
  t.equal(judgeReply(offer({ kind: 'NAK', yiaddr: 0 }), host, any), 'ok');
});

t.test('judgeAddress: an address nobody\'s reply vouches for (a VRRP advert) gets the same rules', async (t) => {
  t.equal(judgeAddress(ip('10.99.0.101'), host, any), 'ok');
  const cases: [string, string][] = [
    ['0.0.0.0', 'yiaddr-zero'], ['127.0.0.1', 'yiaddr-loopback'], ['224.0.0.18', 'yiaddr-multicast'],
    ['255.255.255.255', 'yiaddr-broadcast'], ['10.99.0.0', 'yiaddr-network'], ['10.99.0.255', 'yiaddr-subnet-broadcast'],
    ['10.99.0.2', 'yiaddr-local'], ['192.168.77.10', 'yiaddr-off-subnet'],
  ];
  for (const [a, reason] of cases) t.equal(judgeAddress(ip(a), host, any), reason, `${a}: ${reason}`);
  t.equal(judgeAddress(ip('192.168.77.10'), host, { ...any, allowOtherSubnets: true }), 'ok', 'another subnet when allowed');
  t.equal(judgeReply(offer({ yiaddr: ip('10.99.0.1') }), host, any), 'yiaddr-server', 'a reply still names its own server');
  t.equal(judgeAddress(ip('10.99.0.1'), host, any), 'ok', 'without a reply there is no server to compare with');
});
