// Privileged, through the real agent: while a VIP is held, its owner
// re-announces it every arp.refreshInterval (keepalived's
// garp_master_refresh), for a DHCP VIP (from the service macvlan's MAC) and a
// pool VIP (from the parent's MAC) alike. Observed with tcpdump on a client.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { startAgent, waitStatus } from '../../lab/agent';
import { ArpCapture, buildVipLab, isAnnouncement, vipAgentConfig } from './fixtures/vip-lab';

const REFRESH_S = 0.5;
const WATCH_MS = 4000;

if (requirePrivileged(t)) {
  t.test(`gratuitous ARP refresh every ${REFRESH_S} s for DHCP and pool VIPs`, async (t) => {
    const { lab, node, client } = await buildVipLab(t);
    const agent = await startAgent(lab, node, vipAgentConfig({ refreshInterval: REFRESH_S, services: ['dhcp', 'pool'] }), { name: 'node' });
    const st = await waitStatus(agent, 'both VIPs up', (d) => d.services.every((s) => s.vip !== undefined), 20_000);
    const nodeMac = (await lab.sh(node, 'cat /sys/class/net/eth0/address')).stdout.trim();
    const vips = st.services.map((s) => ({ name: s.name, vip: s.vip!, mac: s.name === 'api' ? nodeMac : s.mac! }));
    // Past the start-up burst (announceNum 2, 0.1 s apart).
    await new Promise((r) => setTimeout(r, 500));
    const cap = await ArpCapture.start(lab, client, WATCH_MS + 5000);
    const from = Date.now();
    await new Promise((r) => setTimeout(r, WATCH_MS));
    const frames = await cap.stop();
    for (const v of vips) {
      const ann = frames.filter((f) => isAnnouncement(f, v.vip) && f.t >= from && f.t <= from + WATCH_MS);
      const gaps = ann.slice(1).map((f, i) => f.t - ann[i]!.t);
      const sorted = [...gaps].sort((a, b) => a - b);
      const median = sorted[Math.floor(sorted.length / 2)] ?? Number.NaN;
      t.comment(`${v.name} ${v.vip}: ${ann.length} announcements in ${WATCH_MS} ms, intervals ${gaps.join(', ')} ms (median ${median})`);
      t.ok(ann.every((f) => f.srcMac === v.mac), `${v.name}: every announcement comes from ${v.mac}`);
      const expected = WATCH_MS / (REFRESH_S * 1000);
      t.ok(ann.length >= expected - 1 && ann.length <= expected + 1, `${v.name}: ${ann.length} announcements, about ${expected} expected`);
      t.ok(median >= REFRESH_S * 1000 - 50 && median <= REFRESH_S * 1000 + 100, `${v.name}: median interval ${median} ms, configured ${REFRESH_S * 1000} ms`);
      t.ok(gaps.every((g) => g >= REFRESH_S * 1000 - 50), `${v.name}: never faster than configured`);
    }
    const m = await lab.exec(client, 'curl', ['-s', '--max-time', '2', 'http://10.99.0.2:9477/metrics']);
    t.match(m.stdout, /lbagent_net_vip_announcements_total\{reason="refresh"\} \d+/, 'counted as reason="refresh"');
    agent.signal('SIGTERM');
    t.equal((await agent.exited).code, 0, 'clean exit');
  });
}
