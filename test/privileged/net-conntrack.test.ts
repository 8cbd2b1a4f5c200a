// Privileged: agent/net/conntrack/conntrack.ts against the kernel's own
// conntrack table, in a throwaway namespace, for both families. UDP flows to
// an IPv4 and an IPv6 VIP:port are made with conntrack-tools (`conntrack
// -I`: what the kernel path's DNAT leaves, a flow answered by a backend);
// the sweep the kernel path runs when a backend leaves a port ends the flows
// answered by the backend that left and keeps those of the backend still in
// the set, in each family's table (filtered dumps, decoding, deletes by the
// original tuple). The data path around it is test/privileged/forward-kernel.test.ts.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { distPath } from '../../lab/services';

const FLOWS = [
  // [client, VIP, backend that stays, backend that left]
  ['10.99.0.2', '10.99.0.50', '10.99.0.12', '10.99.0.11'],
  ['fd00:99::2', 'fd00:99::50', 'fd00:99::12', 'fd00:99::11'],
] as const;

if (requirePrivileged(t)) {
  t.test('the UDP sweep ends the flows of a backend that left, in the IPv4 and the IPv6 table', async (t) => {
    const lab = await createLab(t);
    const ns = await lab.addHost('node', { address: '10.99.0.10/24', ipv6: ['fd00:99::10/64'] });
    for (const [client, vip, kept, left] of FLOWS) {
      for (const [i, backend] of [kept, left].entries()) {
        const sport = 40_000 + i;
        await lab.sh(ns, `conntrack -I -p udp -s ${client} -d ${vip} --sport ${sport} --dport 53 --reply-src ${backend} --reply-dst ${client} --reply-port-src 5353 --reply-port-dst ${sport} -t 120`);
      }
      // Another port of the VIP: not the rule's, left alone.
      await lab.sh(ns, `conntrack -I -p udp -s ${client} -d ${vip} --sport 40002 --dport 54 --reply-src ${left} --reply-dst ${client} --reply-port-src 5353 --reply-port-dst 40002 -t 120`);
    }
    const rules = FLOWS.map(([, vip, kept]) => ({ vip, port: 53, allowed: [`${kept}:5353`] }));
    const script = `
      const { Conntrack } = require(${JSON.stringify(distPath('agent', 'net', 'conntrack', 'conntrack.js'))});
      const rules = ${JSON.stringify(rules)}.map((r) => ({ ...r, allowed: new Set(r.allowed) }));
      new Conntrack().endUdpFlows(rules).then((r) => process.stdout.write(JSON.stringify({ ended: r.ended, gone: r.gone, byPort: [...r.byPort] })), (e) => { process.stderr.write(String(e)); process.exit(1); });
    `;
    const r = await lab.exec(ns, process.execPath, ['-e', script], { timeoutMs: 20_000 });
    const out = JSON.parse(r.stdout) as { ended: number; gone: number; byPort: [string, number][] };
    t.equal(out.ended, 2, 'one flow ended in each family');
    t.same(out.byPort.sort(), [['10.99.0.50:53', 1], ['fd00:99::50:53', 1]], 'counted by VIP:port');
    for (const [client, vip, kept, left] of FLOWS) {
      const family = client.includes(':') ? 'ipv6' : 'ipv4';
      const list = (await lab.sh(ns, `conntrack -L -f ${family} -p udp 2>/dev/null`)).stdout;
      const lines = list.split('\n').filter((l) => l.includes(`dst=${vip} `));
      t.ok(lines.some((l) => l.includes('dport=53 ') && l.includes(`src=${kept} `)), `${family}: the flow answered by ${kept}, still in the set, stays`);
      t.notOk(lines.some((l) => l.includes('dport=53 ') && l.includes(`src=${left} `)), `${family}: the flow answered by ${left}, which left, is gone`);
      t.ok(lines.some((l) => l.includes('dport=54 ')), `${family}: another port's flow is left alone`);
    }
  });
}
