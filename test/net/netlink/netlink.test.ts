// rtnetlink verbs, pure parts: error mapping, the IFLA_LINKINFO bytes for a
// macvlan, and the parsing of link/address messages and notifications (link
// payloads encoded by the netlink package, decoded by our scan). The verbs
// against the kernel are in test/privileged/net-macvlan.test.ts and
// net-netlink-concurrency.test.ts.
import t from 'tap';
import { AttrStream, ifla, rt } from 'netlink';
import {
  addressInfoFromMessage,
  addressProto,
  createdLink,
  forEachAttr,
  IFA_PROTO,
  inetConfSpec,
  macvlanLinkInfo,
  netlinkErrno,
  netlinkError,
  parseLinkPayload,
  parseNotification,
  type MacvlanMode,
} from '../../../agent/net/netlink/netlink';

t.test('errno from the netlink package errors', async (t) => {
  t.equal(netlinkErrno(new Error('Request rejected: EPERM')), 'EPERM');
  t.equal(netlinkErrno(new Error('Request rejected: EOPNOTSUPP')), 'EOPNOTSUPP');
  t.equal(netlinkErrno(new Error('Timeout has been reached')), 'ETIMEDOUT');
  t.equal(netlinkErrno(Object.assign(new Error('x'), { code: 'ENOBUFS' })), 'ENOBUFS');
  t.equal(netlinkErrno('nope'), undefined);
});

t.test('errors carry stable codes and say what to do', async (t) => {
  const perm = netlinkError(new Error('Request rejected: EPERM'), 'creating', 'macvlan lbv1 on eth0', { macvlan: true });
  t.equal(perm.code, 'LB_ERR_NET_NO_CAPABILITY');
  t.match(perm.message, /CAP_NET_ADMIN/);
  t.match(perm.message, /lbv1 on eth0/);

  const nodev = netlinkError(new Error('Request rejected: ENODEV'), 'creating', 'macvlan lbv1 on eth9', { missing: 'eth9' });
  t.equal(nodev.code, 'LB_ERR_NET_NO_INTERFACE');
  t.match(nodev.message, /interface eth9 does not exist/);

  const unsup = netlinkError(new Error('Request rejected: EOPNOTSUPP'), 'creating', 'macvlan lbv1 on eth0', { macvlan: true });
  t.equal(unsup.code, 'LB_ERR_NET_MACVLAN_UNSUPPORTED');
  t.match(unsup.message, /kernel-default/);
  t.equal(netlinkError(new Error('Request rejected: EOPNOTSUPP'), 'x', 'y').code, 'LB_ERR_NET_NETLINK', 'EOPNOTSUPP elsewhere is generic');

  t.match(netlinkError(new Error('Request rejected: EEXIST'), 'creating', 'lbv1').message, /already exists/);
  t.equal(netlinkError(new Error('boom'), 'x', 'y').code, 'LB_ERR_NET_NETLINK');
});

t.test('IFLA_LINKINFO for a bridge-mode macvlan', async (t) => {
  // struct nlattr { u16 len; u16 type } + payload, 4-byte aligned, host order:
  // IFLA_INFO_KIND(1) "macvlan\0", IFLA_INFO_DATA(2) { IFLA_MACVLAN_MODE(1) u32 4 = MACVLAN_MODE_BRIDGE }.
  const expected = Buffer.from('0c000100' + Buffer.from('macvlan\0').toString('hex') + '0c000200' + '08000100' + '04000000', 'hex');
  t.equal(macvlanLinkInfo('bridge').toString('hex'), expected.toString('hex'));
  const info = ifla.parseInfo(macvlanLinkInfo('private'));
  t.equal(info.kind, 'macvlan');
  t.equal(ifla.parseMacvlan(info.data!).mode, 1, 'MACVLAN_MODE_PRIVATE');
});

function linkMessageBytes(msg: rt.LinkMessage): Buffer {
  const s = new AttrStream();
  rt.formatLinkMessage(msg, s);
  return Buffer.concat(s.bufs);
}

t.test("IFLA_AF_SPEC's AF_INET entry: IFLA_INET_CONF with one u32 per IPV4_DEVCONF id", async (t) => {
  const b = inetConfSpec([['arp_ignore', 1], ['arp_announce', 2], ['rp_filter', 2]]);
  // linux/ip.h: IPV4_DEVCONF_RP_FILTER 8, ARP_ANNOUNCE 18, ARP_IGNORE 19; IFLA_INET_CONF 1, nested.
  const attrs: Array<[number, number]> = [];
  t.equal(b.readUInt16LE(0), b.length, 'one attribute spans the entry');
  t.equal(b.readUInt16LE(2), 1 | 0x8000, 'IFLA_INET_CONF, NLA_F_NESTED');
  forEachAttr(b, 4, b.length, (type, at, to) => { t.equal(to - at, 4, 'u32 value'); attrs.push([type, b.readUInt32LE(at)]); });
  t.same(attrs, [[19, 1], [18, 2], [8, 2]]);
  // As NetlinkClient.setLink sends it: the package puts it under IFLA_AF_SPEC, keyed AF_INET, unchanged.
  const msg = rt.parseLinkMessage(linkMessageBytes({ kind: 'link', data: { index: 7 }, attrs: { afSpec: new Map([[2, b]]) } }));
  t.same([...(msg.attrs.afSpec?.keys() ?? [])], [2], 'under AF_INET');
  t.equal(msg.attrs.afSpec?.get(2)?.toString('hex'), b.toString('hex'));
  t.throws(() => inetConfSpec([['rp_filter', -1]]), RangeError);
  t.throws(() => inetConfSpec([['rp_filter', 1.5]]), RangeError);
  t.equal(inetConfSpec([]).length, 4, 'an empty IFLA_INET_CONF');
});

t.test('link messages become LinkInfo', async (t) => {
  const parent = Buffer.alloc(4);
  parent.writeUInt32LE(3);
  const bytes = linkMessageBytes({
    kind: 'link',
    data: { index: 7, flags: { up: true, broadcast: true } },
    attrs: {
      ifname: 'lbv0123456789ab',
      address: Buffer.from([2, 1, 2, 3, 4, 5]),
      carrier: 1,
      operstate: 6,
      mtu: 1500,
      link: parent,
      linkinfo: macvlanLinkInfo('bridge'),
      // Attributes LinkInfo does not hold are skipped, not decoded.
      txqlen: 1000,
      ifalias: 'an alias',
    },
  });
  t.same(parseLinkPayload(bytes), {
    index: 7, name: 'lbv0123456789ab', mac: '02:01:02:03:04:05', kind: 'macvlan', up: true, carrier: true,
    operState: 'up', parentIndex: 3, macvlanMode: 'bridge', mtu: 1500,
  });

  const down = parseLinkPayload(linkMessageBytes({ kind: 'link', data: { index: 2, flags: {} }, attrs: { ifname: 'eth0', carrier: 0, operstate: 2 } }));
  t.same(down, { index: 2, name: 'eth0', mac: '', up: false, carrier: false, operState: 'down' });

  const odd = parseLinkPayload(linkMessageBytes({ kind: 'link', data: { index: 2 }, attrs: { ifname: 'x', operstate: 99, linkinfo: Buffer.from([1, 2, 3]) } }));
  t.equal(odd.operState, 'unknown', 'unknown operstate values do not throw');
  t.equal(odd.kind, undefined, 'a malformed IFLA_LINKINFO is skipped');

  const self = Buffer.alloc(4);
  self.writeUInt32LE(9);
  const lo = parseLinkPayload(linkMessageBytes({ kind: 'link', data: { index: 9 }, attrs: { ifname: 'lo', address: Buffer.alloc(6), link: self } }));
  t.equal(lo.parentIndex, undefined, 'IFLA_LINK pointing at the link itself is no parent');
  t.equal(lo.mac, '00:00:00:00:00:00');

  const veth = parseLinkPayload(linkMessageBytes({ kind: 'link', data: { index: 5 }, attrs: { ifname: 'v', linkinfo: Buffer.from('09000100' + '7665746800000000' + '0c000200' + '08000100' + '04000000', 'hex') } }));
  t.equal(veth.kind, 'veth');
  t.equal(veth.macvlanMode, undefined, 'IFLA_INFO_DATA is a macvlan mode only on a macvlan');

  for (const mode of ['private', 'vepa', 'bridge', 'passthru', 'source'] as MacvlanMode[]) {
    t.equal(parseLinkPayload(linkMessageBytes({ kind: 'link', data: { index: 4 }, attrs: { ifname: 'm', linkinfo: macvlanLinkInfo(mode) } })).macvlanMode, mode, `mode ${mode} round-trips`);
  }

  const truncated = Buffer.concat([linkMessageBytes({ kind: 'link', data: { index: 3 }, attrs: { ifname: 'eth1' } }), Buffer.from([200, 0, 4, 0])]);
  t.equal(parseLinkPayload(truncated).name, 'eth1', 'a truncated trailing attribute ends the scan, what came before stands');
  t.throws(() => parseLinkPayload(Buffer.alloc(15)), /shorter than struct ifinfomsg/);
});

t.test('forEachAttr walks aligned attributes and stops at a malformed one', async (t) => {
  const b = Buffer.from('05000100' + 'aa000000' + '06000280' + 'bbcc0000' + '02000300', 'hex');
  const seen: Array<[number, string]> = [];
  t.equal(forEachAttr(b, 0, b.length, (type, at, to) => seen.push([type, b.subarray(at, to).toString('hex')])), false, 'the length-2 attribute is malformed');
  t.same(seen, [[1, 'aa'], [2, 'bbcc']], 'padding skipped, NLA_F_NESTED masked off the type');
  t.equal(forEachAttr(b, 0, 16, () => undefined), true);
});

t.test('createdLink: the echoed RTM_NEWLINK, or nothing when only the ACK came back', async (t) => {
  const echo = { type: rt.MessageType.NEWLINK, data: linkMessageBytes({ kind: 'link', data: { index: 12 }, attrs: { ifname: 'lbvabc', linkinfo: macvlanLinkInfo('bridge') } }) };
  t.same(createdLink([echo], 'lbvabc'), { index: 12, name: 'lbvabc', mac: '', kind: 'macvlan', up: false, carrier: false, operState: 'unknown', macvlanMode: 'bridge' });
  t.equal(createdLink([echo], 'lbvother'), undefined, 'another link is not the one created');
  t.equal(createdLink([], 'lbvabc'), undefined, 'a kernel before 6.1 answers with the ACK alone: read back');
});

t.test('address messages become AddressInfo (IPv4 only)', async (t) => {
  const a = addressInfoFromMessage({ kind: 'address', data: { family: 2, prefixlen: 24, index: 7 }, attrs: { local: Buffer.from([10, 99, 0, 50]), address: Buffer.from([10, 99, 0, 50]), label: 'lbv1' } });
  t.same(a, { index: 7, address: '10.99.0.50', prefix: 24, label: 'lbv1' });
  t.equal(addressInfoFromMessage({ kind: 'address', data: { family: 10, prefixlen: 64, index: 7 }, attrs: { address: Buffer.alloc(16) } }), undefined);
});

t.test('notifications: new/del link and address, others ignored', async (t) => {
  const bytes = linkMessageBytes({ kind: 'link', data: { index: 4, flags: {} }, attrs: { ifname: 'eth1' } });
  t.same(parseNotification(rt.MessageType.DELLINK, bytes)?.[0], 'link');
  t.equal((parseNotification(rt.MessageType.DELLINK, bytes)?.[1] as { type: string }).type, 'del');
  const s = new AttrStream();
  rt.formatAddressMessage({ kind: 'address', data: { family: 2, prefixlen: 32, index: 4 }, attrs: { local: Buffer.from([10, 0, 0, 1]) } }, s);
  const ev = parseNotification(rt.MessageType.NEWADDR, Buffer.concat(s.bufs));
  t.same(ev, ['address', { type: 'new', address: { index: 4, address: '10.0.0.1', prefix: 32 } }]);
  t.equal(parseNotification(rt.MessageType.NEWROUTE, Buffer.alloc(0)), undefined);
  t.throws(() => parseNotification(rt.MessageType.NEWLINK, Buffer.from([1, 2])), 'garbage throws here; the watcher catches and drops it');
});

t.test('addressProto reads IFA_PROTO from a raw RTM_NEWADDR payload', async (t) => {
  const attr = (type: number, data: Buffer): Buffer => {
    const len = 4 + data.length;
    const b = Buffer.alloc((len + 3) & ~3);
    b.writeUInt16LE(len, 0); b.writeUInt16LE(type, 2); data.copy(b, 4);
    return b;
  };
  const ifaddrmsg = Buffer.from([2, 32, 0, 0, 5, 0, 0, 0]);
  const msg = Buffer.concat([ifaddrmsg, attr(1, Buffer.from([10, 1, 2, 3])), attr(3, Buffer.from('eth0\0')), attr(IFA_PROTO, Buffer.from([76])), attr(8, Buffer.alloc(4))]);
  t.equal(addressProto(msg), 76);
  t.same(parseNotification(rt.MessageType.NEWADDR, msg), ['address', { type: 'new', address: { index: 5, address: '10.1.2.3', prefix: 32, label: 'eth0', proto: 76 } }],
    'a notification carries the mark too: the drift guard tells the agent\'s addresses from others\' by it');
  t.equal(addressProto(Buffer.concat([ifaddrmsg, attr(1, Buffer.from([10, 1, 2, 3]))])), undefined, 'no mark');
  t.equal(addressProto(Buffer.concat([ifaddrmsg, Buffer.from([200, 0, 11, 0, 76])])), undefined, 'a truncated attribute is no mark, not a throw');
  t.equal(addressProto(Buffer.alloc(3)), undefined);
});
