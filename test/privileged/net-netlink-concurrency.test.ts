// One NetlinkClient is shared by every DHCP source, pool source and the
// start-up reconcile: concurrent requests on it must all succeed (an
// rtnetlink socket serves one dump at a time; the client queues).
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { distPath } from '../../lab/services';

t.test('concurrent requests on one client all succeed', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const ns = await lab.addHost('node', { address: '10.99.0.2/24' });
  const script = `
    const { openNetlink } = require(${JSON.stringify(distPath('agent', 'net', 'netlink', 'netlink.js'))});
    (async () => {
      const nl = openNetlink();
      const eth0 = await nl.getLink('eth0');
      const jobs = [];
      for (let i = 0; i < 40; i++) {
        jobs.push(nl.listLinks().then((l) => l.length));
        jobs.push(nl.listAddresses(eth0.index).then((a) => a.length));
        jobs.push(nl.addAddress(eth0.index, '10.99.0.' + (100 + i), 32).then(() => 1));
      }
      const res = await Promise.allSettled(jobs);
      const failed = res.filter((r) => r.status === 'rejected').map((r) => String(r.reason && r.reason.message));
      const addrs = await nl.listAddresses(eth0.index);
      nl.close();
      process.stdout.write(JSON.stringify({ failed, addresses: addrs.length }));
    })().catch((e) => { process.stdout.write(JSON.stringify({ fatal: String(e) })); });
  `;
  const r = await lab.exec(ns, process.execPath, ['-e', script], { timeoutMs: 30_000 });
  const out = JSON.parse(r.stdout) as { failed: string[]; addresses: number; fatal?: string };
  t.equal(out.fatal, undefined);
  t.same(out.failed, [], 'no request failed');
  t.equal(out.addresses, 41, 'every address added (40 plus the host\'s own)');
});
