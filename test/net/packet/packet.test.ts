// Packet socket driver, the parts that need no privileges: argument checks
// before any syscall, and the mapping of system errors to LbErrors.
// Real sockets are exercised in test/privileged/net-packet.test.ts.
import t from 'tap';
import { bpfArp, interfaceIndex, openPacketSocket, packetSocketError } from '../../../agent/net/packet/packet';

const sysErr = (code: string, syscall: string): Error => Object.assign(new Error(`${code}: x, ${syscall}`), { code, errno: -1, syscall });

t.test('system errors become LbErrors that name the fix', async (t) => {
  const perm = packetSocketError(sysErr('EPERM', 'socket'), 'opening a packet socket', 1);
  t.equal(perm.code, 'LB_ERR_NET_NO_CAPABILITY');
  t.match(perm.message, /CAP_NET_RAW/);
  t.match(perm.message, /lo \(ifindex 1\)/, 'names the interface when it exists');
  t.match(perm.details, { capability: 'CAP_NET_RAW', syscall: 'socket', errno: 'EPERM' });

  const nodev = packetSocketError(sysErr('ENODEV', 'bind'), 'opening a packet socket', 999_999);
  t.equal(nodev.code, 'LB_ERR_NET_NO_INTERFACE');
  t.match(nodev.message, /ifindex 999999 does not exist/);

  const other = packetSocketError(sysErr('ENETDOWN', 'sendto'), 'sending a frame', 1);
  t.equal(other.code, 'LB_ERR_NET_SOCKET');
  t.equal(packetSocketError('weird', 'x', 1).code, 'LB_ERR_NET_SOCKET');
});

t.test('arguments are checked before any syscall', async (t) => {
  t.throws(() => openPacketSocket({ ifindex: 0, protocol: 0x0806 }), RangeError);
  t.throws(() => openPacketSocket({ ifindex: 1, protocol: 0x10000 }), RangeError);
  t.throws(() => openPacketSocket({ ifindex: 1, protocol: 0x0806, filter: [] }), /invalid BPF filter/);
  t.throws(() => openPacketSocket({ ifindex: 1, protocol: 0x0806, filter: [...bpfArp()].slice(0, 2) }), /invalid BPF filter/);
});

t.test('interfaceIndex names a missing interface', async (t) => {
  t.equal(interfaceIndex('lo'), 1);
  t.throws(() => interfaceIndex('nosuchif0'), { code: 'LB_ERR_NET_NO_INTERFACE', message: /nosuchif0/ });
});
