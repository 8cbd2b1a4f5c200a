// Privileged: the NDP socket (agent/net/neighbour/ndp-socket.ts) on a real
// kernel. A node opens it on its LAN interface and joins the solicited-node
// group of an address it does not hold; a peer sends frames from a packet
// socket. Heard: a DAD probe from :: to the joined group (RFC 4862 §5.4.2),
// a solicitation to the node's own address with the peer's MAC taken from
// its source option, a forged advertisement to all-nodes, and a
// solicitation with hop limit 254, which decodes as dropped
// ('bad-hop-limit', RFC 4861 §7.1.1). Not heard: a probe to a group nobody
// joined, and ICMPv6 that is not neighbour discovery (an echo request). The
// frames leave by a packet socket of protocol 0: the node's
// /proc/net/packet lists no socket of ETH_P_IPV6.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { distPath } from '../../lab/services';

const JOINED = 'fd00:99::ab:cdef';
const NOT_JOINED = 'fd00:99::12:3456';
const MARKER = 'fd00:99::7:7777';

interface Heard { ok: boolean; reason?: string; kind?: string; src?: string; target?: string; ethSrc?: string; hopLimit?: number }

/** In the node: the socket, one joined group, each frame decoded as a JSON line; ends at the marker's advertisement or after 5 s. */
const listener = `
  const { openNdpSocket } = require(${JSON.stringify(distPath('agent', 'net', 'neighbour', 'ndp-socket.js'))});
  const { decodeNdp, solicitedNodeAddress } = require(${JSON.stringify(distPath('agent', 'net', 'neighbour', 'ndp.js'))});
  const { interfaceIndex } = require(${JSON.stringify(distPath('agent', 'net', 'packet', 'packet.js'))});
  const { formatAddress, parseAddress } = require(${JSON.stringify(distPath('agent', 'address.js'))});
  const v6 = (s) => parseAddress(s).value;
  const text = (a) => formatAddress({ family: 'IPv6', value: a });
  const s = openNdpSocket({ ifindex: interfaceIndex('eth0') });
  s.joinGroup(solicitedNodeAddress(v6(${JSON.stringify(JOINED)})));
  const done = () => { process.stdout.write(require('fs').readFileSync('/proc/net/packet', 'utf8').split('\\n').map((l) => 'packet ' + l).join('\\n') + '\\n'); s.close(); process.exit(0); };
  s.on('frame', (f) => {
    const r = decodeNdp(f);
    const p = r.ok ? r.packet : undefined;
    console.log(JSON.stringify(p ? { ok: true, kind: p.kind, src: text(p.src), target: text(p.target), ethSrc: p.ethSrc, hopLimit: f[21] } : { ok: false, reason: r.reason, hopLimit: f[21] }));
    if (p && p.target === v6(${JSON.stringify(MARKER)})) done();
  });
  setTimeout(done, 5000);
  console.log('ready');
`;

/** In the peer: the frames, from a packet socket of ETH_P_IPV6, in order. */
const sender = `
  const { openPacketSocket, interfaceIndex } = require(${JSON.stringify(distPath('agent', 'net', 'packet', 'packet.js'))});
  const n = require(${JSON.stringify(distPath('agent', 'net', 'neighbour', 'ndp.js'))});
  const { parseAddress } = require(${JSON.stringify(distPath('agent', 'address.js'))});
  const v6 = (s) => parseAddress(s).value;
  const mac = require('fs').readFileSync('/sys/class/net/eth0/address', 'utf8').trim();
  const nodeMac = process.argv[1];
  const sock = openPacketSocket({ ifindex: interfaceIndex('eth0'), protocol: 0x86dd, ref: false });
  sock.send(n.encodeNdp(n.ndpDadProbe(mac, v6(${JSON.stringify(NOT_JOINED)}))));
  sock.send(n.encodeNdp(n.ndpDadProbe(mac, v6(${JSON.stringify(JOINED)}))));
  const far = n.encodeNdp(n.ndpSolicitation(mac, v6('fd00:99::3'), v6(${JSON.stringify(JOINED)})));
  far[21] = 254; // the hop limit is outside the checksum: only RFC 4861 §7.1.1 refuses it
  sock.send(far);
  sock.send(n.encodeNdp({ ...n.ndpSolicitation(mac, v6('fd00:99::3'), v6('fd00:99::2')), ethDst: nodeMac, dst: v6('fd00:99::2') }));
  sock.send(n.encodeNdp(n.ndpUnsolicitedAdvertisement(mac, v6(${JSON.stringify(JOINED)}))));
  sock.close();
`;

if (requirePrivileged(t)) {
  t.test('the NDP socket hears DAD probes of joined groups, solicitations and advertisements, judges the hop limit, taps nothing else', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { ipv6: ['fd00:99::2/64'] });
    const peer = await lab.addHost('peer', { ipv6: ['fd00:99::3/64'] });
    const nodeMac = (await lab.exec(node, 'cat', ['/sys/class/net/eth0/address'])).stdout.trim();
    const peerMac = (await lab.exec(peer, 'cat', ['/sys/class/net/eth0/address'])).stdout.trim();

    const child = lab.spawn(node, process.execPath, ['-e', listener]);
    let out = '';
    child.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
    const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
    await waitFor('the listener ready', () => out.includes('ready\n'), 5000, 20);

    await lab.exec(peer, process.execPath, ['-e', sender, nodeMac]);
    // Not neighbour discovery: ICMP6_FILTER keeps it out.
    await lab.exec(peer, 'ping', ['-6', '-c', '1', '-W', '1', 'fd00:99::2'], { allowFail: true });
    await lab.exec(peer, process.execPath, ['-e', `
      const { openPacketSocket, interfaceIndex } = require(${JSON.stringify(distPath('agent', 'net', 'packet', 'packet.js'))});
      const n = require(${JSON.stringify(distPath('agent', 'net', 'neighbour', 'ndp.js'))});
      const mac = require('fs').readFileSync('/sys/class/net/eth0/address', 'utf8').trim();
      const sock = openPacketSocket({ ifindex: interfaceIndex('eth0'), protocol: 0x86dd, ref: false });
      sock.send(n.encodeNdp(n.ndpUnsolicitedAdvertisement(mac, require(${JSON.stringify(distPath('agent', 'address.js'))}).parseAddress(${JSON.stringify(MARKER)}).value)));
      sock.close();
    `]);
    await exited;

    const lines = out.split('\n');
    const heard = lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Heard);
    // What this test sent, in order: the solicitation of the node is the first for its address; the
    // kernels' own resolution of each other for the echo, which follows it, is left out.
    const ofNode = heard.find((h) => h.target === 'fd00:99::2');
    const sent = heard.filter((h) => h === ofNode || !(h.ok && h.src !== '::' && ['fd00:99::2', 'fd00:99::3'].includes(h.target!)));
    t.same(sent, [
      { ok: true, kind: 'solicitation', src: '::', target: JOINED, ethSrc: '00:00:00:00:00:00', hopLimit: 255 },
      { ok: false, reason: 'bad-hop-limit', hopLimit: 254 },
      { ok: true, kind: 'solicitation', src: 'fd00:99::3', target: 'fd00:99::2', ethSrc: peerMac, hopLimit: 255 },
      { ok: true, kind: 'advertisement', src: JOINED, target: JOINED, ethSrc: peerMac, hopLimit: 255 },
      { ok: true, kind: 'advertisement', src: MARKER, target: MARKER, ethSrc: peerMac, hopLimit: 255 },
    ], 'heard: the probe from :: to the joined group, the far solicitation (dropped), the solicitation of the node, the advertisements');
    t.notOk(heard.some((h) => h.target === NOT_JOINED), 'not the probe to a group nobody joined');
    t.notOk(heard.some((h) => !h.ok && h.reason !== 'bad-hop-limit'), 'nothing that is not neighbour discovery (the echo)');

    const packets = lines.filter((l) => l.startsWith('packet ')).slice(1).map((l) => l.slice(7).trim()).filter(Boolean).map((l) => l.split(/\s+/));
    t.same(packets.map((f) => Number.parseInt(f[3]!, 16)), [0], 'one packet socket, protocol 0: it sends and receives nothing');
  });
}
