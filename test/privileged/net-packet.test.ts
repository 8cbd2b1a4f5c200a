// Packet sockets (agent/net/packet.ts over the native addon) on the real
// kernel: a UDP frame whose checksum is left to offload (CHECKSUM_PARTIAL on
// veth) is delivered and flagged, the BPF filter keeps other ports out,
// multicast/promiscuous memberships live exactly as long as the socket, an
// interface that disappears is reported as an error event, and a port of a
// parent's shared socket (packet-shared.ts) sends out of its own macvlan.
import t from 'tap';
import { createLab, waitFor, type Lab } from '../../lab/netns';
import { requirePrivileged } from '../helpers/privileged';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';
import { driver, driverStream } from './fixtures/net-driver-run';
import { distPath } from '../../lab/services';
import { endWorkersHolding } from '../helpers/worker-end';
import { arpAnnouncement, encodeArp } from '../../agent/net/neighbour/arp';
import { parseIPv4 } from '../../agent/address';

function sendUdp(lab: Lab, ns: string, host: string, port: number, payload: string): Promise<unknown> {
  const script = `const s=require('dgram').createSocket('udp4');s.send(${JSON.stringify(payload)},${port},${JSON.stringify(host)},(e)=>{s.close();if(e)throw e;});`;
  return lab.exec(ns, process.execPath, ['-e', script]);
}

if (requirePrivileged(t)) {
  t.test('a frame with a pending checksum is delivered and flagged; the filter holds', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const client = await lab.addHost('client', { address: '10.99.0.3/24' });
    const cap = await driverStream(lab, node, 'capture-udp', { ifname: 'eth0', port: 5555, durationMs: 20_000 });
    t.teardown(() => cap.stop());

    await sendUdp(lab, client, '10.99.0.2', 5556, 'filtered-out');
    await sendUdp(lab, client, '10.99.0.2', 5555, 'hello-lb-agent');
    const ev = await cap.next('the UDP frame', (e) => e.ev === 'frame');
    const frame = Buffer.from(ev.hex as string, 'hex');
    t.ok(frame.includes(Buffer.from('hello-lb-agent')), 'the whole frame, payload included');
    t.equal(frame.readUInt16BE(12), 0x0800, 'from the Ethernet header on');
    // UDP from a socket over veth leaves with CHECKSUM_PARTIAL: the checksum
    // field holds only the pseudo-header sum. Dropping such frames as corrupt
    // is the bug csumNotReady exists to prevent.
    t.match(ev.info, { csumNotReady: true, pktType: 0 }, 'TP_STATUS_CSUMNOTREADY reported, PACKET_HOST');

    await sendUdp(lab, client, '10.99.0.2', 5556, 'filtered-out-2');
    await sendUdp(lab, client, '10.99.0.2', 5555, 'second');
    await cap.next('the second frame', (e) => e.ev === 'frame' && Buffer.from(e.hex as string, 'hex').includes(Buffer.from('second')));
    const frames = cap.events.filter((e) => e.ev === 'frame').map((e) => Buffer.from(e.hex as string, 'hex'));
    t.equal(frames.length, 2, 'only port 5555 reached the socket');
    t.notOk(frames.some((f) => f.includes(Buffer.from('filtered-out'))), 'the BPF filter kept port 5556 out');
  });

  t.test('multicast and promiscuous memberships last as long as the socket', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const vrrpMac = '01:00:5e:00:00:12';
    const maddr = async (): Promise<string> => (await lab.exec(node, 'ip', ['maddr', 'show', 'dev', 'eth0'])).stdout;
    const promiscuity = async (): Promise<number> => Number(/promiscuity (\d+)/.exec((await lab.exec(node, 'ip', ['-d', 'link', 'show', 'eth0'])).stdout)?.[1]);
    t.notMatch(await maddr(), vrrpMac);
    t.equal(await promiscuity(), 0);

    const hold = await driverStream(lab, node, 'hold-packet', { ifname: 'eth0', multicast: [vrrpMac], promiscuous: true, durationMs: 20_000 });
    t.match(await maddr(), vrrpMac, 'VRRP multicast MAC joined');
    t.equal(await promiscuity(), 1, 'promiscuous while open');
    await hold.stop();
    await waitFor('memberships to go with the socket', async () => !(await maddr()).includes(vrrpMac) && (await promiscuity()) === 0, 5_000);
    t.pass('the kernel dropped them when the socket closed');
  });

  t.test('an interface going down is an error event; the socket resumes when it is up', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const client = await lab.addHost('client', { address: '10.99.0.3/24' });
    const cap = await driverStream(lab, node, 'capture-udp', { ifname: 'eth0', port: 5555, durationMs: 20_000 });
    t.teardown(() => cap.stop());

    await lab.exec(node, 'ip', ['link', 'set', 'eth0', 'down']);
    const down = await cap.next('an error event', (e) => e.ev === 'error');
    t.match(down, { code: 'LB_ERR_NET_SOCKET', message: /eth0.*went down \(ENETDOWN\)/ });
    await lab.exec(node, 'ip', ['link', 'set', 'eth0', 'up']);
    await waitFor('the link to carry traffic again', async () => {
      await sendUdp(lab, client, '10.99.0.2', 5555, 'after-up');
      return cap.events.some((e) => e.ev === 'frame');
    }, 10_000, 200);
    t.pass('frames flow again on the same socket');
    t.equal(cap.proc.exitCode, null, 'the process is still running');
  });

  t.test('a port of the parent\'s shared socket sends out of its macvlan', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const name = linkNameForService('default/shared');
    const mac = macForService('default/shared');
    const r = await driver(lab, node, 'create-macvlan', { name, parent: 'eth0', mac, mode: 'bridge', up: true });
    t.ok(r.ok, JSON.stringify(r.error));
    // One process: a port on eth0's shared socket for the macvlan, and an
    // ETH_P_ALL socket on the macvlan itself that sees the frames leaving it
    // (PACKET_OUTGOING). A frame sent out of the parent never passes there.
    // (Receiving through the shared socket: dhcp-many, 50 services.)
    const script = `
      const { dhcpSockets } = require(${JSON.stringify(distPath('agent', 'dhcp', 'driver.js'))});
      const { openPacketSocket, interfaceIndex, ETH_P_ALL, PACKET_OUTGOING } = require(${JSON.stringify(distPath('agent', 'net', 'packet', 'packet.js'))});
      const { encodeUdpFrame, BROADCAST_MAC, BROADCAST_IP } = require(${JSON.stringify(distPath('agent', 'dhcp', 'codec.js'))});
      const ix = interfaceIndex(${JSON.stringify(name)});
      const seen = [];
      const tap = openPacketSocket({ ifindex: ix, protocol: ETH_P_ALL, ref: false });
      tap.on('frame', (f, info) => { if (info.pktType === PACKET_OUTGOING && f.includes(Buffer.from('from-the-port'))) seen.push('left ' + f.subarray(6, 12).toString('hex')); });
      const port = dhcpSockets.attach({ parentIfindex: interfaceIndex('eth0'), ifindex: ix, mac: ${JSON.stringify(mac)} });
      port.send(encodeUdpFrame({ srcMac: ${JSON.stringify(mac)}, dstMac: BROADCAST_MAC, srcIp: 0, dstIp: BROADCAST_IP, payload: Buffer.from('from-the-port') }));
      setTimeout(() => {
        process.stdout.write(JSON.stringify({ seen, counts: dhcpSockets.counts() }));
        port.close(); tap.close();
      }, 300);`;
    const out = JSON.parse((await lab.exec(node, process.execPath, ['-e', script])).stdout) as { seen: string[]; counts: { opened: number; attached: number } };
    t.same(out.seen, [`left ${mac.replace(/:/g, '')}`], 'the frame left from the macvlan, with its MAC as source');
    t.match(out.counts, { opened: 1, attached: 1 }, 'through the shared socket');
  });

  t.test('a refresh slot\'s gratuitous ARPs leave in one sendmmsg, the same frames one send each would; a failed frame is its own', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const peer = await lab.addHost('peer', { address: '10.99.0.3/24' });
    const cap = await driverStream(lab, peer, 'capture-arp', { ifname: 'eth0', durationMs: 20_000 });
    t.teardown(() => cap.stop());
    const mac = '02:00:5e:10:00:01';
    const ips = Array.from({ length: 30 }, (_, i) => `10.99.0.${100 + i}`);
    // One slot a second (refreshMs 1000): every owner's refresh in each slot.
    const r = await driver<{ counts: { batches: number; batchedFrames: number }; metrics: string }>(lab, node, 'refresh-batch', { ifname: 'eth0', mac, ips, slots: 1 });
    t.ok(r.ok, JSON.stringify(r.error));
    t.match(r.result!.counts, { batches: 1, batchedFrames: 30 }, 'the slot\'s 30 refreshes in one batch on the one socket');
    t.match(r.result!.metrics, /lbagent_net_vip_announcements_total\{reason="refresh"\} 30/, 'every batched frame counted as sent');
    const expected = new Map(ips.map((ip) => [encodeArp(arpAnnouncement(mac, parseIPv4(ip)!)).toString('hex'), ip]));
    // The start's announcement (a send of its own) and the slot's refresh.
    await waitFor('60 announcements on the peer', () => cap.events.filter((e) => e.ev === 'frame' && expected.has(e.hex as string)).length >= 60, 5_000);
    const perIp = new Map<string, number>();
    for (const e of cap.events) if (e.ev === 'frame') { const ip = expected.get(e.hex as string); if (ip !== undefined) perIp.set(ip, (perIp.get(ip) ?? 0) + 1); }
    t.same([...perIp.values()].sort(), ips.map(() => 2), 'each VIP\'s gratuitous ARP twice, byte for byte what it encodes');
    const stray = cap.events.filter((e) => e.ev === 'frame' && !expected.has(e.hex as string) && (e.hex as string).slice(12, 24) === mac.replace(/:/g, ''));
    t.same(stray, [], 'nothing else from its MAC');

    // sendmmsg stops at a frame the kernel refuses (longer than the MTU:
    // EMSGSIZE); the frames after it still go, and only that one fails.
    const ok = (i: number): string => encodeArp(arpAnnouncement(mac, parseIPv4(`10.99.0.${200 + i}`)!)).toString('hex');
    const big = ok(1) + '00'.repeat(2000);
    const m = await driver<(null | { errno?: string })[]>(lab, node, 'send-many', { ifname: 'eth0', frames: [ok(0), big, ok(2)] });
    t.ok(m.ok, JSON.stringify(m.error));
    t.match(m.result, [null, { errno: 'EMSGSIZE' }, null], 'the oversized frame failed alone');
    await waitFor('the two good frames on the peer', () => [ok(0), ok(2)].every((h) => cap.events.some((e) => e.hex === h)), 5_000);
    t.notOk(cap.events.some((e) => typeof e.hex === 'string' && e.hex.startsWith(ok(1))), 'the oversized one never left');
  });

  t.test('a worker thread that ends while its packet socket reads takes it down without a crash (loop_handles.h)', async (t) => {
    // Loopback of this namespace: nothing is sent, the socket only has to be open and polled.
    const r = endWorkersHolding(`
      const h = new addon.PacketHandle(addon.ifNameToIndex('lo'), 0x0800);
      h.start(() => {});`);
    t.same([r.signal, r.status, r.out], [null, 0, 'all ended'], 'SIGSEGV before: a plain cleanup hook');
  });

  t.test('an interface that is deleted is reported as gone', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const name = linkNameForService('default/gone');
    const r = await driver(lab, node, 'create-macvlan', { name, parent: 'eth0', mac: macForService('default/gone'), mode: 'bridge', up: true });
    t.ok(r.ok, JSON.stringify(r.error));
    const cap = await driverStream(lab, node, 'capture-udp', { ifname: name, port: 5555, durationMs: 20_000 });
    t.teardown(() => cap.stop());
    await lab.exec(node, 'ip', ['link', 'del', name]);
    const ev = await cap.next('an error event', (e) => e.ev === 'error');
    t.match(ev, { code: 'LB_ERR_NET_NO_INTERFACE', message: /no longer exists/ });
    t.equal(cap.proc.exitCode, null, 'the process is still running');
  });
}
