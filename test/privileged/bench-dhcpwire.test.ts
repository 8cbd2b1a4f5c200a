// bench/lib/dhcpwire.ts with a real tcpdump, dnsmasq and busybox udhcpc:
// the capture is written raw and decoded after the run, so every exchange
// has to be in the file when tcpdump is stopped. Each client here finishes
// long before the stop and nothing comes after it: the case where a capture
// without immediate delivery kept the packets in its ring's open block and
// wrote none (the one-client rows read "wire NaN").
import * as fs from 'node:fs';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { startDnsmasq } from '../../lab/services';
import { startWireCapture } from '../../bench/lib/dhcpwire';

const MACS = ['02:00:5e:10:00:01', '02:00:5e:10:00:02'];

t.test('every client\'s DISCOVER -> ACK is in the capture when it stops, and the file goes', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const server = await lab.addHost('dhcp', { address: '10.99.0.1/24' });
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const dns = await startDnsmasq(lab, server, { range: '10.99.0.100,10.99.0.150', leaseTime: '1h', noPing: true });
  t.teardown(() => dns.stop());
  const file = lab.file('wire.pcap');
  const wire = await startWireCapture(lab, server, file);
  for (const [i, mac] of MACS.entries()) {
    await lab.exec(node, 'ip', ['link', 'add', `mv${i}`, 'link', 'eth0', 'address', mac, 'type', 'macvlan', 'mode', 'bridge']);
    await lab.exec(node, 'ip', ['link', 'set', `mv${i}`, 'up']);
    await lab.exec(node, 'busybox', ['udhcpc', '-i', `mv${i}`, '-n', '-q', '-f', '-s', '/bin/true'], { timeoutMs: 15_000 });
  }
  const times = await wire.stop();
  t.same([...times.keys()].sort(), MACS, 'one exchange per client, by its MAC');
  for (const [mac, ms] of times) t.ok(Number.isFinite(ms) && ms >= 0 && ms < 10_000, `${mac}: ${ms} ms`);
  t.notOk(fs.existsSync(file), 'the capture file is removed');
});
