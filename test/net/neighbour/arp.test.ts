// ARP codec: byte for byte against frames captured with `tcpdump -xx` on a
// veth pair between two lab namespaces (52:54:00:12:34:56 = 10.99.0.2,
// 52:54:00:ab:cd:ef = 10.99.0.3), and fuzzed: decode never throws.
import t from 'tap';
import { prng } from '../../helpers/random';
import {
  arpAnnouncement,
  arpProbe,
  ARP_OP_REPLY,
  ARP_OP_REQUEST,
  decodeArp,
  encodeArp,
  isArpProbe,
  type ArpPacket,
} from '../../../agent/net/neighbour/arp';
import { parseIPv4 } from '../../../agent/address';

function hex(s: string): Buffer {
  return Buffer.from(s.replace(/\s+/g, ''), 'hex');
}
const ip = (s: string): number => parseIPv4(s)!;

// Kernel ARP request: "who-has 10.99.0.3 tell 10.99.0.2" (busybox ping).
const KERNEL_REQUEST = hex(`ffff ffff ffff 5254 0012 3456 0806 0001
  0800 0604 0001 5254 0012 3456 0a63 0002
  0000 0000 0000 0a63 0003`);
// Kernel ARP reply: "10.99.0.3 is-at 52:54:00:ab:cd:ef".
const KERNEL_REPLY = hex(`5254 0012 3456 5254 00ab cdef 0806 0001
  0800 0604 0002 5254 00ab cdef 0a63 0003
  5254 0012 3456 0a63 0002`);
// busybox `arping -D` (duplicate address detection) for 10.99.0.9: a probe
// with sender IP 0 (its target MAC is ff:.., where RFC 5227 suggests zeros).
const BUSYBOX_PROBE = hex(`ffff ffff ffff 5254 0012 3456 0806 0001
  0800 0604 0001 5254 0012 3456 0000 0000
  ffff ffff ffff 0a63 0009`);
// busybox `arping -U`: unsolicited (gratuitous) request for 10.99.0.2.
const BUSYBOX_GARP = hex(`ffff ffff ffff 5254 0012 3456 0806 0001
  0800 0604 0001 5254 0012 3456 0a63 0002
  ffff ffff ffff 0a63 0002`);

t.test('decodes a kernel request and reply', async (t) => {
  const req = decodeArp(KERNEL_REQUEST);
  t.same(req, {
    ok: true,
    packet: {
      ethDst: 'ff:ff:ff:ff:ff:ff', ethSrc: '52:54:00:12:34:56', op: ARP_OP_REQUEST,
      senderMac: '52:54:00:12:34:56', senderIp: ip('10.99.0.2'), targetMac: '00:00:00:00:00:00', targetIp: ip('10.99.0.3'),
    },
  });
  const rep = decodeArp(KERNEL_REPLY);
  t.same(rep, {
    ok: true,
    packet: {
      ethDst: '52:54:00:12:34:56', ethSrc: '52:54:00:ab:cd:ef', op: ARP_OP_REPLY,
      senderMac: '52:54:00:ab:cd:ef', senderIp: ip('10.99.0.3'), targetMac: '52:54:00:12:34:56', targetIp: ip('10.99.0.2'),
    },
  });
});

t.test('encodes exactly what the kernel and busybox put on the wire', async (t) => {
  for (const frame of [KERNEL_REQUEST, KERNEL_REPLY, BUSYBOX_PROBE, BUSYBOX_GARP]) {
    const d = decodeArp(frame);
    t.ok(d.ok);
    if (d.ok) t.same(encodeArp(d.packet).toString('hex'), frame.toString('hex'));
  }
});

t.test('RFC 5227 probe and announcement frames', async (t) => {
  const mac = '52:54:00:12:34:56';
  // Same as busybox's probe but with the target MAC zeroed (§2.1.1 SHOULD).
  const probe = encodeArp(arpProbe(mac, ip('10.99.0.9')));
  const expectedProbe = Buffer.from(BUSYBOX_PROBE);
  expectedProbe.fill(0, 32, 38);
  t.same(probe.toString('hex'), expectedProbe.toString('hex'));
  t.ok(isArpProbe(arpProbe(mac, ip('10.99.0.9'))));

  const garp = encodeArp(arpAnnouncement(mac, ip('10.99.0.2')));
  const expectedGarp = Buffer.from(BUSYBOX_GARP);
  expectedGarp.fill(0, 32, 38);
  t.same(garp.toString('hex'), expectedGarp.toString('hex'));
  t.notOk(isArpProbe(arpAnnouncement(mac, ip('10.99.0.2'))));
});

t.test('Ethernet padding is ignored', async (t) => {
  const padded = Buffer.concat([KERNEL_REPLY, Buffer.alloc(18)]);
  t.same(decodeArp(padded), decodeArp(KERNEL_REPLY));
});

t.test('malformed frames yield a reason', async (t) => {
  const mutate = (off: number, v: number): Buffer => { const b = Buffer.from(KERNEL_REQUEST); b[off] = v; return b; };
  t.same(decodeArp(KERNEL_REQUEST.subarray(0, 41)), { ok: false, reason: 'short' });
  t.same(decodeArp(Buffer.alloc(0)), { ok: false, reason: 'short' });
  t.same(decodeArp(mutate(13, 0x00)), { ok: false, reason: 'not-arp' });
  t.same(decodeArp(mutate(15, 6)), { ok: false, reason: 'bad-hardware-type' });
  t.same(decodeArp(mutate(17, 0xdd)), { ok: false, reason: 'bad-protocol-type' });
  t.same(decodeArp(mutate(18, 8)), { ok: false, reason: 'bad-address-length' });
  t.same(decodeArp(mutate(19, 16)), { ok: false, reason: 'bad-address-length' });
  t.same(decodeArp(mutate(21, 3)), { ok: false, reason: 'bad-operation' });
});

t.test('encode rejects malformed arguments', async (t) => {
  const good: ArpPacket = arpProbe('02:00:00:00:00:01', 1);
  t.throws(() => encodeArp({ ...good, senderMac: 'nope' }), TypeError);
  t.throws(() => encodeArp({ ...good, targetIp: -1 }), TypeError);
  t.throws(() => encodeArp({ ...good, op: 3 }), TypeError);
});

t.test('fuzz: decode never throws and round-trips what it accepts', async (t) => {
  const rnd = prng(0x5227);
  let accepted = 0;
  for (let i = 0; i < 20_000; i++) {
    let b: Buffer;
    if (i % 2 === 0) {
      b = Buffer.alloc(Math.floor(rnd() * 80));
      for (let j = 0; j < b.length; j++) b[j] = Math.floor(rnd() * 256);
    } else {
      // Mutate a valid frame a little, so the deep branches are reached too.
      b = Buffer.from(KERNEL_REQUEST);
      const n = 1 + Math.floor(rnd() * 3);
      for (let k = 0; k < n; k++) b[Math.floor(rnd() * b.length)] = Math.floor(rnd() * 256);
    }
    const r = decodeArp(b);
    if (r.ok) {
      accepted++;
      if (!encodeArp(r.packet).equals(b.subarray(0, 42))) {
        t.fail(`round trip differs for ${b.toString('hex')}`);
        return;
      }
    } else if (typeof r.reason !== 'string') {
      t.fail('failure without a reason');
      return;
    }
  }
  t.ok(accepted > 0, `some mutated frames still decode (${accepted})`);
});
