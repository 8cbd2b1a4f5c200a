// Unit tests of the VRRPv3 codec: byte for byte against frames keepalived
// 2.2.7 (Debian) sent in a lab namespace, every refusal reason, and a
// bounded fuzz of the decoder (it never throws).
import t from 'tap';
import { prng } from '../helpers/random';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  DROP_REASONS,
  VRRP_MULTICAST_IP,
  decodeAdvertisement,
  encodeAdvertisement,
  encodeMessage,
  secondsToCentiseconds,
  virtualRouterMac,
  vrrpFilter,
  type AdvertisementFrame,
  type DecodeResult,
} from '../../agent/failover/codec';
import { internetChecksum } from '../../agent/net/packet/inet';
import { formatIPv4, parseIPv4, parseMac } from '../../agent/address';
import { isLbError } from '../../agent/errors';

const ip = (s: string): number => parseIPv4(s)!;
const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

// Captured with `tcpdump -i eth0 -n -xx -vv 'ip proto 112'` on the peer end of
// a veth pair while keepalived 2.2.7 (vrrp_version 3) ran on 10.99.0.2
// (MAC 02:00:0a:63:00:02). keepalived sends from the interface MAC, not the
// virtual router MAC, and lets no Ethernet padding through on a veth.
interface Golden {
  name: string;
  hex: string;
  vrid: number;
  priority: number;
  cs: number;
  ipId: number;
  addresses: string[];
}
const GOLDEN: Golden[] = [
  {
    // vrid 51, prio 150, intvl 100cs, addrs: 10.99.0.100 (advert_int 1)
    name: 'vrid 51 priority 150 advert_int 1',
    hex: '01005e000012 02000a630002 0800 45c0002000010000ff70d0350a630002e0000012 31339601006442ac0a630064',
    vrid: 51, priority: 150, cs: 100, ipId: 1, addresses: ['10.99.0.100'],
  },
  {
    // the same instance on SIGTERM: "(VI1) sent 0 priority"
    name: 'vrid 51 priority 0 on shutdown',
    hex: '01005e000012 02000a630002 0800 45c0002000040000ff70d0320a630002e0000012 313300010064d8ac0a630064',
    vrid: 51, priority: 0, cs: 100, ipId: 4, addresses: ['10.99.0.100'],
  },
  {
    // vrid 7, prio 254, intvl 5cs (advert_int 0.05), 4 addresses
    name: 'vrid 7 priority 254 advert_int 0.05, 4 addresses',
    hex: '01005e000012 02000a630002 0800 45c0002c00010000ff70d0290a630002e0000012 3107fe040005b6f30a6300640a6300650a630066c0a84dfa',
    vrid: 7, priority: 254, cs: 5, ipId: 1, addresses: ['10.99.0.100', '10.99.0.101', '10.99.0.102', '192.168.77.250'],
  },
  {
    name: 'vrid 7 priority 0, ip id 57',
    hex: '01005e000012 02000a630002 0800 45c0002c00390000ff70cff10a630002e0000012 310700040005b4f40a6300640a6300650a630066c0a84dfa',
    vrid: 7, priority: 0, cs: 5, ipId: 57, addresses: ['10.99.0.100', '10.99.0.101', '10.99.0.102', '192.168.77.250'],
  },
  {
    // vrid 1, prio 1, intvl 50cs: the lowest VRID and priority
    name: 'vrid 1 priority 1 advert_int 0.5',
    hex: '01005e000012 02000a630002 0800 45c0002000010000ff70d0350a630002e0000012 310101010032d77a0a6300fa',
    vrid: 1, priority: 1, cs: 50, ipId: 1, addresses: ['10.99.0.250'],
  },
  {
    // vrid 255, prio 200, intvl 4000cs (advert_int 40): the high bits of the 12-bit field
    name: 'vrid 255 priority 200 advert_int 40',
    hex: '01005e000012 02000a630002 0800 45c0002400010000ff70d0310a630002e0000012 31ffc8020fa0f50c0a6300ca0a6300c9',
    vrid: 255, priority: 200, cs: 4000, ipId: 1, addresses: ['10.99.0.202', '10.99.0.201'],
  },
  {
    name: 'vrid 255 priority 0 advert_int 40',
    hex: '01005e000012 02000a630002 0800 45c0002400020000ff70d0300a630002e0000012 31ff00020fa0bd0d0a6300ca0a6300c9',
    vrid: 255, priority: 0, cs: 4000, ipId: 2, addresses: ['10.99.0.202', '10.99.0.201'],
  },
];

/** Recompute the IPv4 header checksum of a frame (to reach the checks behind it). */
function fixIp(b: Buffer): Buffer {
  const ihl = (b[14]! & 0x0f) * 4;
  if (b.length < 14 + Math.max(ihl, 20)) return b;
  b.writeUInt16BE(0, 24);
  b.writeUInt16BE(internetChecksum(b, 14, 14 + ihl), 24);
  return b;
}

/** Recompute the VRRP checksum over the pseudo-header, as the IP header says the message is. */
function fixVrrp(b: Buffer): Buffer {
  const ihl = (b[14]! & 0x0f) * 4;
  const v = 14 + ihl;
  const len = b.readUInt16BE(16) - ihl;
  if (len < 8 || v + len > b.length) return b;
  b.writeUInt16BE(0, v + 6);
  const pseudo = Buffer.alloc(12);
  b.copy(pseudo, 0, 26, 34);
  pseudo[9] = 112;
  pseudo.writeUInt16BE(len, 10);
  b.writeUInt16BE(internetChecksum(Buffer.concat([pseudo, b.subarray(v, v + len)])), v + 6);
  return b;
}

function mustDecode(t: { fail(msg: string): unknown }, frame: Uint8Array): AdvertisementFrame {
  const r = decodeAdvertisement(frame);
  if (!r.ok) {
    t.fail(`decode failed: ${r.reason}`);
    throw new Error(r.reason);
  }
  return r.frame;
}

function reencode(f: AdvertisementFrame): Buffer {
  return encodeAdvertisement({
    vrid: f.vrid, priority: f.priority, maxAdverIntCs: f.maxAdverIntCs, addresses: f.addresses,
    srcIp: f.srcIp, dstIp: f.dstIp, srcMac: f.srcMac, dstMac: f.dstMac,
    ttl: f.ttl, tos: f.tos, ipId: f.ipId, ipFlags: f.ipFlags,
  });
}

t.test('keepalived frames decode to what keepalived was configured with', async (t) => {
  for (const g of GOLDEN) {
    const f = mustDecode(t, hex(g.hex));
    t.equal(f.vrid, g.vrid, `${g.name}: vrid`);
    t.equal(f.priority, g.priority, `${g.name}: priority`);
    t.equal(f.maxAdverIntCs, g.cs, `${g.name}: interval`);
    t.same(f.addresses.map(formatIPv4), g.addresses, `${g.name}: addresses`);
    t.equal(f.ipId, g.ipId, `${g.name}: ip id`);
    t.equal(formatIPv4(f.srcIp), '10.99.0.2');
    t.equal(f.dstIp, VRRP_MULTICAST_IP);
    t.equal(f.ttl, 255);
    t.equal(f.tos, 0xc0);
    t.equal(f.srcMac.toString('hex'), '02000a630002');
    t.equal(f.dstMac.toString('hex'), '01005e000012');
  }
});

t.test('re-encoding a keepalived frame gives the same bytes', async (t) => {
  for (const g of GOLDEN) {
    const bytes = hex(g.hex);
    t.equal(reencode(mustDecode(t, bytes)).toString('hex'), bytes.toString('hex'), g.name);
  }
});

t.test('encoding from the configuration alone reproduces keepalived byte for byte', async (t) => {
  for (const g of GOLDEN) {
    const frame = encodeAdvertisement({
      vrid: g.vrid, priority: g.priority, maxAdverIntCs: g.cs, addresses: g.addresses.map(ip),
      srcIp: ip('10.99.0.2'), srcMac: parseMac('02:00:0a:63:00:02'), ipId: g.ipId,
    });
    t.equal(frame.toString('hex'), hex(g.hex).toString('hex'), g.name);
  }
});

t.test('the VRRP checksum covers the IPv4 pseudo-header (RFC 5798 §5.2.8)', async (t) => {
  const g = hex(GOLDEN[0]!.hex);
  const msg = encodeMessage({ vrid: 51, priority: 150, maxAdverIntCs: 100, addresses: [ip('10.99.0.100')] }, ip('10.99.0.2'), VRRP_MULTICAST_IP);
  t.equal(msg.toString('hex'), g.subarray(34).toString('hex'), 'message alone');
  const other = encodeMessage({ vrid: 51, priority: 150, maxAdverIntCs: 100, addresses: [ip('10.99.0.100')] }, ip('10.99.0.3'), VRRP_MULTICAST_IP);
  t.not(other.readUInt16BE(6), msg.readUInt16BE(6), 'another source address changes the checksum');
  // The same frame with another source IP (IP checksum fixed up) fails the VRRP check.
  const forged = Buffer.from(g);
  forged[14 + 15] = 3;
  forged.writeUInt16BE(0, 14 + 10);
  forged.writeUInt16BE(internetChecksum(forged, 14, 34), 14 + 10);
  t.same(decodeAdvertisement(forged), { ok: false, reason: 'bad-checksum' });
});

t.test('our defaults: virtual router MAC, 224.0.0.18 group MAC, TTL 255, TOS 0xc0', async (t) => {
  const frame = encodeAdvertisement({ vrid: 52, priority: 100, maxAdverIntCs: 1, addresses: [], srcIp: ip('10.99.0.10') });
  const f = mustDecode(t, frame);
  t.equal(f.srcMac.toString('hex'), '00005e000134', 'RFC 5798 §7.3: 00:00:5e:00:01:{VRID}');
  t.equal(f.dstMac.toString('hex'), '01005e000012');
  t.equal(f.ttl, 255);
  t.equal(f.tos, 0xc0);
  t.equal(f.maxAdverIntCs, 1, '0.01 s');
  t.same(f.addresses, [], 'no VIP yet: count 0');
  t.equal(virtualRouterMac(255).toString('hex'), '00005e0001ff');
});

t.test('255 addresses fit, 256 do not', async (t) => {
  const addrs = Array.from({ length: 255 }, (_, i) => ip('10.1.0.0') + i);
  const frame = encodeAdvertisement({ vrid: 9, priority: 100, maxAdverIntCs: 100, addresses: addrs, srcIp: ip('10.99.0.10') });
  t.equal(frame.length, 14 + 20 + 8 + 4 * 255);
  t.same(mustDecode(t, frame).addresses, addrs);
  t.throws(() => encodeAdvertisement({ vrid: 9, priority: 100, maxAdverIntCs: 100, addresses: [...addrs, 1], srcIp: 1 }), { code: 'LB_ERR_VRRP_INVALID' });
});

t.test('encode refuses values the wire cannot carry', async (t) => {
  const base = { vrid: 9, priority: 100, maxAdverIntCs: 100, addresses: [], srcIp: 1 };
  for (const over of [{ vrid: 0 }, { vrid: 256 }, { priority: 256 }, { priority: -1 }, { maxAdverIntCs: 0 }, { maxAdverIntCs: 4096 }, { vrid: 1.5 }]) {
    try {
      encodeAdvertisement({ ...base, ...over });
      t.fail(`accepted ${JSON.stringify(over)}`);
    } catch (e) {
      t.ok(isLbError(e, 'LB_ERR_VRRP_INVALID'), JSON.stringify(over));
    }
  }
});

t.test('seconds to centiseconds', async (t) => {
  t.equal(secondsToCentiseconds(1), 100);
  t.equal(secondsToCentiseconds(0.01), 1);
  t.equal(secondsToCentiseconds(0.001), 1, 'clamped up');
  t.equal(secondsToCentiseconds(40.95), 4095);
  t.equal(secondsToCentiseconds(100), 4095, 'clamped down');
});

t.test('every refusal reason', async (t) => {
  const good = hex(GOLDEN[2]!.hex); // 4 addresses
  const mutate = (f: (b: Buffer) => void): Buffer => { const b = Buffer.from(good); f(b); return b; };
  const cases: [string, Buffer, DecodeResult['ok'] | string][] = [
    ['empty', Buffer.alloc(0), 'truncated'],
    ['ethernet header only', good.subarray(0, 14), 'truncated'],
    ['half an IP header', good.subarray(0, 30), 'truncated'],
    ['cut inside the addresses', good.subarray(0, good.length - 2), 'truncated'],
    ['cut inside the VRRP header', fixIp(mutate((b) => b.writeUInt16BE(20 + 4, 16))).subarray(0, 14 + 24), 'truncated'],
    ['ARP ethertype', mutate((b) => b.writeUInt16BE(0x0806, 12)), 'not-vrrp'],
    ['IPv6 version nibble', mutate((b) => { b[14] = 0x65; }), 'not-vrrp'],
    ['protocol 17', fixIp(mutate((b) => { b[23] = 17; })), 'not-vrrp'],
    ['VRID 0', fixVrrp(mutate((b) => { b[35] = 0; })), 'not-vrrp'],
    ['IHL 4', mutate((b) => { b[14] = 0x44; }), 'bad-length'],
    ['IP total length below the header', fixIp(mutate((b) => b.writeUInt16BE(19, 16))), 'bad-length'],
    ['count says 5 addresses, 4 present', fixVrrp(mutate((b) => { b[37] = 5; })), 'bad-length'],
    ['count says 3, 4 present', fixVrrp(mutate((b) => { b[37] = 3; })), 'bad-length'],
    ['IP header checksum off by one', mutate((b) => { b[24]! ^= 1; }), 'bad-ip-checksum'],
    ['TTL 254: crossed a router (§7.1)', fixIp(mutate((b) => { b[22] = 254; })), 'bad-ttl'],
    ['TTL 1', fixIp(mutate((b) => { b[22] = 1; })), 'bad-ttl'],
    ['VRRPv2', fixVrrp(mutate((b) => { b[34] = 0x21; })), 'bad-version'],
    ['type 2', fixVrrp(mutate((b) => { b[34] = 0x32; })), 'bad-type'],
    ['VRRP checksum flipped', mutate((b) => { b[41]! ^= 0xff; }), 'bad-checksum'],
    ['an address changed after checksumming', mutate((b) => { b[45]! ^= 1; }), 'bad-checksum'],
    ['more fragments set', fixIp(mutate((b) => { b[20] = 0x20; })), 'truncated'],
    ['fragment offset', fixIp(mutate((b) => { b[21] = 1; })), 'truncated'],
  ];
  for (const [name, frame, want] of cases) {
    const r = decodeAdvertisement(frame);
    t.equal(r.ok ? 'ok' : r.reason, want, name);
  }
  const covered = new Set(cases.map((c) => c[2]));
  // bad-hop-limit and bad-source are IPv6's (codec6.test.ts).
  for (const reason of DROP_REASONS.filter((r) => r !== 'bad-hop-limit' && r !== 'bad-source')) t.ok(covered.has(reason), `reason ${reason} is exercised`);
});

t.test('accepted variations', async (t) => {
  const good = hex(GOLDEN[0]!.hex);
  // A physical NIC pads the 46-octet frame to 60: the IP total length rules.
  const padded = Buffer.concat([good, Buffer.alloc(14)]);
  t.equal(mustDecode(t, padded).priority, 150, 'Ethernet padding ignored');
  // §5.2.6: reserved bits above Max Adver Int are ignored on receive.
  const rsvd = Buffer.from(good);
  rsvd[38] = 0xf0 | rsvd[38]!;
  rsvd.writeUInt16BE(0, 40);
  const pseudo = Buffer.alloc(12);
  rsvd.copy(pseudo, 0, 26, 34);
  pseudo[9] = 112;
  pseudo.writeUInt16BE(12, 10);
  rsvd.writeUInt16BE(internetChecksum(Buffer.concat([pseudo, rsvd.subarray(34)])), 40);
  t.equal(mustDecode(t, rsvd).maxAdverIntCs, 100, 'reserved bits masked');
  // IP options (IHL 6): the VRRP message starts after them.
  const opt = Buffer.concat([good.subarray(0, 34), Buffer.from([1, 1, 1, 0]), good.subarray(34)]);
  opt[14] = 0x46;
  opt.writeUInt16BE(36, 16);
  opt.writeUInt16BE(0, 24);
  opt.writeUInt16BE(internetChecksum(opt, 14, 38), 24);
  const f = mustDecode(t, opt);
  t.equal(f.vrid, 51, 'IP options skipped');
  t.same(f.addresses.map(formatIPv4), ['10.99.0.100']);
  // Unicast VRRP (keepalived unicast_peer): the checksum uses the real destination.
  const uni = encodeAdvertisement({ vrid: 3, priority: 90, maxAdverIntCs: 100, addresses: [ip('10.99.0.100')], srcIp: ip('10.99.0.4'), dstIp: ip('10.99.0.5') });
  t.equal(formatIPv4(mustDecode(t, uni).dstIp), '10.99.0.5');
});

t.test('the kernel filter is what tcpdump compiles', async (t) => {
  // `tcpdump -dd 'ip proto 112 and ip[1 + (ip[0] & 0xf) * 4] = 51'` (tcpdump 4.99.3)
  const tcpdump = [
    [0x28, 0, 0, 0x0000000c], [0x15, 0, 9, 0x00000800], [0x30, 0, 0, 0x00000017], [0x15, 0, 7, 0x00000070],
    [0x30, 0, 0, 0x0000000e], [0x54, 0, 0, 0x0000000f], [0x24, 0, 0, 0x00000004], [0x7, 0, 0, 0x00000004],
    [0x50, 0, 0, 0x0000000f], [0x15, 0, 1, 0x00000033], [0x6, 0, 0, 0x00040000], [0x6, 0, 0, 0x00000000],
  ];
  t.same(vrrpFilter(51), tcpdump);
  t.equal(vrrpFilter(200)[9]![3], 200);
  t.throws(() => vrrpFilter(0), { code: 'LB_ERR_VRRP_INVALID' });
});

function tcpdumpMissing(): string | false {
  try { execFileSync('tcpdump', ['--version'], { stdio: 'ignore' }); return false; } catch { return 'tcpdump not installed'; }
}

t.test('tcpdump reads our frames as valid VRRPv3', { skip: tcpdumpMissing() }, async (t) => {
  const frames = [
    encodeAdvertisement({ vrid: 52, priority: 100, maxAdverIntCs: 1, addresses: [ip('10.99.0.100')], srcIp: ip('10.99.0.10') }),
    encodeAdvertisement({ vrid: 200, priority: 0, maxAdverIntCs: 4095, addresses: [ip('10.99.0.100'), ip('10.99.0.101')], srcIp: ip('10.99.0.11'), ipId: 77 }),
  ];
  // A classic pcap file: global header, then a record per frame.
  const head = Buffer.alloc(24);
  head.writeUInt32LE(0xa1b2c3d4, 0); head.writeUInt16LE(2, 4); head.writeUInt16LE(4, 6);
  head.writeUInt32LE(65535, 16); head.writeUInt32LE(1, 20);
  const recs = frames.map((f, i) => {
    const r = Buffer.alloc(16);
    r.writeUInt32LE(1_700_000_000 + i, 0); r.writeUInt32LE(f.length, 8); r.writeUInt32LE(f.length, 12);
    return Buffer.concat([r, f]);
  });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vrrp-pcap-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'ours.pcap');
  fs.writeFileSync(file, Buffer.concat([head, ...recs]));
  const out = execFileSync('tcpdump', ['-nn', '-vv', '-r', file], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  t.match(out, /vrid 52, prio 100, intvl 1cs, length 12, addrs: 10\.99\.0\.100/);
  t.match(out, /vrid 200, prio 0, intvl 4095cs, length 16, addrs\(2\): 10\.99\.0\.100,10\.99\.0\.101/);
  t.match(out, /ttl 255, id 77/);
  t.notMatch(out, /bad|wrong|invalid/i, 'no checksum complaint');
});

t.test('fuzz: decode never throws, refuses with a known reason, and what it accepts re-encodes exactly', async (t) => {
  const rnd = prng(0x5798);
  const reasons = new Set<string>(DROP_REASONS);
  const seen = new Map<string, number>();
  const bases = GOLDEN.map((g) => hex(g.hex));
  let failures = 0;
  const ITER = 30_000;
  for (let i = 0; i < ITER && failures < 5; i++) {
    let frame: Buffer;
    const mode = i % 4;
    if (mode === 0) {
      frame = Buffer.alloc(Math.floor(rnd() * 80));
      for (let j = 0; j < frame.length; j++) frame[j] = Math.floor(rnd() * 256);
      if (rnd() < 0.5 && frame.length > 14) { frame.writeUInt16BE(0x0800, 12); frame[14] = 0x45; }
    } else {
      frame = Buffer.from(bases[Math.floor(rnd() * bases.length)]!);
      const flips = 1 + Math.floor(rnd() * 4);
      for (let j = 0; j < flips; j++) frame[Math.floor(rnd() * frame.length)] = Math.floor(rnd() * 256);
      // Half the time make the checksums right again, so the checks behind them run.
      if (rnd() < 0.5) { fixVrrp(frame); fixIp(frame); }
      if (mode === 2) frame = frame.subarray(0, Math.floor(rnd() * frame.length));
      if (mode === 3) frame = Buffer.concat([frame, Buffer.alloc(Math.floor(rnd() * 20), Math.floor(rnd() * 256))]);
    }
    let r: DecodeResult;
    try {
      r = decodeAdvertisement(frame);
    } catch (e) {
      failures++;
      t.fail(`threw on ${frame.toString('hex')}: ${String(e)}`);
      continue;
    }
    const key = r.ok ? 'ok' : r.reason;
    seen.set(key, (seen.get(key) ?? 0) + 1);
    if (!r.ok) {
      if (!reasons.has(r.reason)) { failures++; t.fail(`unknown reason ${r.reason}`); }
      continue;
    }
    // Accepted: IHL 5 frames re-encode to exactly the IP datagram received.
    if ((frame[14]! & 0x0f) === 5) {
      const total = frame.readUInt16BE(16);
      const again = reencode(r.frame);
      // The re-encode zeroes reserved bits that a flip may have set; compare where defined.
      const want = Buffer.from(frame.subarray(0, 14 + total));
      want[38] = want[38]! & 0x0f;
      if (again.length !== want.length || (again.compare(want) !== 0 && (frame[38]! & 0xf0) === 0)) {
        failures++;
        t.fail(`re-encode differs for ${frame.toString('hex')}`);
      }
    }
  }
  t.equal(failures, 0, `${ITER} frames, outcomes ${JSON.stringify(Object.fromEntries(seen))}`);
  t.ok((seen.get('ok') ?? 0) > 0, 'some mutations stay valid (a flip in the MAC, the IP id or a padding byte)');
});
