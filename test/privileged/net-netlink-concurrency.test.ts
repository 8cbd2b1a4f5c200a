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

t.test('removeAddresses: 300 addresses in batches, an ACK each, the learnt neighbour entry deleted first', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const ns = await lab.addHost('node', { address: '10.99.0.2/24' });
  // 300 /32s on eth0 (10.98.0.1 - 10.98.1.44), and a learnt (stale) neighbour entry for one of them.
  const addrs = Array.from({ length: 300 }, (_, i) => `10.98.${Math.floor((i + 1) / 256)}.${(i + 1) % 256}`);
  await lab.exec(ns, 'ip', ['-batch', '-'], { input: addrs.map((a) => `address add ${a}/32 dev eth0`).join('\n') + '\n' });
  await lab.exec(ns, 'ip', ['neigh', 'replace', addrs[7]!, 'lladdr', '02:00:00:00:00:77', 'dev', 'eth0', 'nud', 'stale']);
  const script = `
    const { openNetlink } = require(${JSON.stringify(distPath('agent', 'net', 'netlink', 'netlink.js'))});
    (async () => {
      const nl = openNetlink();
      const eth0 = await nl.getLink('eth0');
      const list = ${JSON.stringify(addrs)}.map((address) => ({ index: eth0.index, address, prefix: 32 }));
      // Two that are not there: the kernel refuses each on its own (EADDRNOTAVAIL), the rest go on.
      list.splice(100, 0, { index: eth0.index, address: '10.97.0.1', prefix: 32 });
      list.push({ index: eth0.index, address: '10.97.0.2', prefix: 32 });
      const before = nl.counts();
      const res = await nl.removeAddresses(list);
      const after = nl.counts();
      const left = (await nl.listAddresses(eth0.index)).map((a) => a.address);
      nl.close();
      const sent = Object.fromEntries(Object.keys(after).map((k) => [k, after[k] - before[k]]));
      process.stdout.write(JSON.stringify({ res: res.map((r) => (typeof r === 'boolean' ? r : String(r.message))), sent, left }));
    })().catch((e) => { process.stdout.write(JSON.stringify({ fatal: String(e && e.stack) })); });
  `;
  const r = await lab.exec(ns, process.execPath, ['-e', script], { timeoutMs: 30_000 });
  const out = JSON.parse(r.stdout) as { res: Array<boolean | string>; sent: Record<string, number>; left: string[]; fatal?: string };
  t.equal(out.fatal, undefined);
  t.equal(out.res.length, 302);
  t.equal(out.res.filter((x) => x === true).length, 300, 'every address that was there: removed');
  t.same([out.res[100], out.res[301]], [false, false], 'the two that were not: false, and the batch went on past the first');
  t.same(out.left, ['10.99.0.2'], 'only the host\'s own address is left');
  // One neighbour dump, one batch deleting the one learnt entry it found, two
  // batches of address deletions (256 + 46): not 302 round trips and a
  // neighbour lookup each.
  t.same(out.sent, { requests: 0, dumps: 1, batches: 3, batched: 303 }, 'what was sent');
});
