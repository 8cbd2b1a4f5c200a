// agent/net/netlink.ts against the real kernel, inside lab namespaces:
// macvlan creation (name, MAC, bridge mode as `ip -d link` sees them), a VIP
// reachable from another namespace, errors naming the interface or the
// capability, ownership reconcile, and link/address change notifications.
import t from 'tap';
import { createLab } from '../../lab/netns';
import { requirePrivileged } from '../helpers/privileged';
import type { AddressInfo, LinkInfo } from '../../agent/net/netlink/netlink';
import { linkNameForService, macForService } from '../../agent/net/ownership/ownership';
import type { ReconcileResult } from '../../agent/net/ownership/reconcile';
import { driver, driverStream } from './fixtures/net-driver-run';

if (requirePrivileged(t)) {
  t.test('a bridge-mode macvlan with the service MAC answers from the LAN', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const client = await lab.addHost('client', { address: '10.99.0.3/24' });
    const name = linkNameForService('default/web');
    const mac = macForService('default/web');

    const r = await driver<{ link: LinkInfo; addresses: AddressInfo[] }>(lab, node, 'create-macvlan', {
      name, parent: 'eth0', mac, mode: 'bridge', up: true, address: '10.99.0.50', prefix: 24, sysctls: true,
    });
    t.ok(r.ok, JSON.stringify(r.error));
    const link = r.result!.link;
    t.match(link, { name, mac, kind: 'macvlan', macvlanMode: 'bridge', up: true });
    t.same(r.result!.addresses.map((a) => `${a.address}/${a.prefix}`), ['10.99.0.50/24']);

    const ipLink = await lab.exec(node, 'ip', ['-d', 'link', 'show', name]);
    t.match(ipLink.stdout, new RegExp(`${name}@eth0`), 'ip link: name and parent');
    t.match(ipLink.stdout, new RegExp(`link/ether ${mac}`), 'ip link: MAC');
    t.match(ipLink.stdout, /macvlan mode bridge/, 'ip link: bridge mode');
    const sysctl = await lab.sh(node, `cat /proc/sys/net/ipv4/conf/${name}/arp_ignore /proc/sys/net/ipv4/conf/${name}/arp_announce /proc/sys/net/ipv4/conf/${name}/rp_filter /proc/sys/net/ipv4/conf/eth0/arp_ignore`);
    t.same(sysctl.stdout.split('\n').filter(Boolean), ['1', '2', '2', '1'], 'VIP sysctls applied (DESIGN.md ARP flux)');

    // macvlan: the parent cannot reach its children, so the VIP is checked
    // from another namespace on the bridge.
    const ping = await lab.exec(client, 'busybox', ['ping', '-c', '2', '-W', '2', '10.99.0.50'], { allowFail: true });
    t.equal(ping.code, 0, 'ping 10.99.0.50 from the client');
    if (ping.code !== 0) t.comment(ping.stdout + ping.stderr);
    const neigh = await lab.exec(client, 'ip', ['neigh', 'show', '10.99.0.50', 'dev', 'eth0']);
    t.match(neigh.stdout, new RegExp(`lladdr ${mac}`), 'the client reached the VIP at the macvlan MAC');
  });

  t.test('IPv4 settings through netlink: on the request that brings a new link up, or alone on a link left down', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const conf = async (name: string): Promise<string[]> => (await lab.sh(node, ['arp_ignore', 'arp_announce', 'rp_filter'].map((k) => `cat /proc/sys/net/ipv4/conf/${name}/${k}`).join('; '))).stdout.split('\n').filter(Boolean);
    for (const up of [true, false]) {
      const key = `default/conf-${up ? 'up' : 'down'}`;
      const name = linkNameForService(key);
      const r = await driver<{ link: LinkInfo }>(lab, node, 'create-macvlan', { name, parent: 'eth0', mac: macForService(key), up, inetConf: true });
      t.ok(r.ok, JSON.stringify(r.error));
      t.equal(r.result?.link.up, up, up ? 'brought up by the same request' : 'still down');
      // The namespace's defaults are 0 0 0 (test/privileged/dhcp-lease.test.ts reads a DHCP service's macvlan the same way).
      t.same(await conf(name), ['1', '2', '2'], `arp_ignore, arp_announce, rp_filter set (${up ? 'with' : 'without'} the link going up)`);
    }
  });

  t.test('removing an address forgets what the neighbour table learnt of it', async (t) => {
    // A VRRP Backup that forwarded for the VIP during a hand-over learnt its
    // then holder's MAC; once it has held and given up the VIP itself, that
    // entry would send clients' packets back to a node that may no longer
    // hold it either (test/privileged/vrrp-systemd.test.ts).
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    await lab.sh(node, 'ip neigh replace 10.99.0.60 lladdr 02:00:00:00:00:60 dev eth0 nud stale && ip addr add 10.99.0.60/32 dev eth0');
    t.match((await lab.sh(node, 'ip neigh show 10.99.0.60 dev eth0')).stdout, /02:00:00:00:00:60/, 'the entry is there while the address is held');
    const r = await driver<boolean>(lab, node, 'remove-address', { name: 'eth0', address: '10.99.0.60', prefix: 32 });
    t.ok(r.ok && r.result === true, `removed (${JSON.stringify(r.error)})`);
    t.equal((await lab.sh(node, 'ip neigh show 10.99.0.60 dev eth0')).stdout.trim(), '', 'and its neighbour entry with it');
    const again = await driver<boolean>(lab, node, 'remove-address', { name: 'eth0', address: '10.99.0.60', prefix: 32 });
    t.ok(again.ok && again.result === false, 'removing it again: not there, no error');
  });

  t.test('concurrent reads of one link share a request, and a read after a change is sent anew (issue 18)', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const r = await driver<{ concurrent: number; same: boolean; missed: boolean; after: boolean }>(lab, node, 'shared-reads', {
      parent: 'eth0', name: linkNameForService('default/reads'), mac: macForService('default/reads'),
    });
    t.ok(r.ok, JSON.stringify(r.error));
    t.same(r.result, { concurrent: 1, same: true, missed: true, after: true },
      '10 reads of eth0 at once: 1 request, one answer; a read of the macvlan sent before its create says absent, one asked for after it finds it');
  });

  t.test('errors name the interface and the capability', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const name = linkNameForService('default/err');
    const mac = macForService('default/err');

    const noParent = await driver(lab, node, 'create-macvlan', { name, parent: 'eth9', mac, mode: 'bridge' });
    t.notOk(noParent.ok);
    t.equal(noParent.error?.code, 'LB_ERR_NET_NO_INTERFACE');
    t.match(noParent.error?.message, /eth9/);

    const dup = await driver(lab, node, 'create-macvlan', { name: 'eth0', parent: 'eth0', mac, mode: 'bridge' });
    t.equal(dup.error?.code, 'LB_ERR_NET_NETLINK', 'an existing name');
    t.match(dup.error?.message, /already exists/);

    const noAdmin = await driver(lab, node, 'create-macvlan', { name, parent: 'eth0', mac, mode: 'bridge' }, { dropCaps: true });
    t.notOk(noAdmin.ok);
    t.equal(noAdmin.error?.code, 'LB_ERR_NET_NO_CAPABILITY');
    t.match(noAdmin.error?.message, /CAP_NET_ADMIN/);
    const links = await lab.exec(node, 'ip', ['-o', 'link']);
    t.notMatch(links.stdout, new RegExp(name), 'nothing was created');

    const noRaw = await driver(lab, node, 'open-packet', { ifname: 'eth0' }, { dropCaps: true });
    t.equal(noRaw.error?.code, 'LB_ERR_NET_NO_CAPABILITY');
    t.match(noRaw.error?.message, /CAP_NET_RAW/);
    t.match(noRaw.error?.message, /eth0/);
  });

  t.test('reconcileOwnedLinks removes what is not wanted and adopts what is', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const keep = linkNameForService('default/keep');
    const stale = linkNameForService('default/stale');
    const moved = linkNameForService('default/moved');
    // Left by an "earlier run": one wanted, one not, one with a MAC that changed.
    for (const [n, m] of [[keep, macForService('default/keep')], [stale, macForService('default/stale')], [moved, '02:00:00:00:00:99']] as const) {
      await lab.exec(node, 'ip', ['link', 'add', n, 'link', 'eth0', 'address', m, 'type', 'macvlan', 'mode', 'bridge']);
    }
    // An operator's interface that merely looks like ours: never touched.
    await lab.exec(node, 'ip', ['link', 'add', 'lbv0123456789ab', 'link', 'eth0', 'address', '52:54:00:00:00:01', 'type', 'macvlan', 'mode', 'bridge']);

    const r = await driver<ReconcileResult & { metrics: string }>(lab, node, 'reconcile', {
      wanted: [
        [keep, { mac: macForService('default/keep'), parent: 'eth0' }],
        [moved, { mac: macForService('default/moved'), parent: 'eth0' }],
      ],
    });
    t.ok(r.ok, JSON.stringify(r.error));
    t.same(r.result!.adopted.map((l) => l.name), [keep]);
    t.same(r.result!.removed.map((l) => l.name), [stale]);
    t.same(r.result!.recreated.map((l) => [l.name, l.mac]), [[moved, macForService('default/moved')]]);
    t.match(r.result!.metrics, /lbagent_net_links_owned 2/);

    const links = (await lab.exec(node, 'ip', ['-o', 'link'])).stdout;
    t.match(links, new RegExp(keep));
    t.notMatch(links, new RegExp(stale), 'the stale link is gone');
    t.match(links, new RegExp(`${moved}@eth0.*${macForService('default/moved')}`), 'recreated with the right MAC');
    t.match(links, /lbv0123456789ab/, 'the operator interface is untouched');
  });

  t.test('link and address changes are reported', async (t) => {
    const lab = await createLab(t);
    const node = await lab.addHost('node', { address: '10.99.0.2/24' });
    const name = linkNameForService('default/watch');
    const created = await driver<{ link: LinkInfo }>(lab, node, 'create-macvlan', {
      name, parent: 'eth0', mac: macForService('default/watch'), mode: 'bridge', up: true, address: '10.99.0.51', prefix: 24,
    });
    t.ok(created.ok, JSON.stringify(created.error));
    const index = created.result!.link.index;
    const watch = await driverStream(lab, node, 'watch', { durationMs: 20_000 });
    t.teardown(() => watch.stop());

    // Someone else removes our address.
    await lab.exec(node, 'ip', ['addr', 'del', '10.99.0.51/24', 'dev', name]);
    const del = await watch.next('address removal', (e) => e.ev === 'address' && e.type === 'del');
    t.match(del, { address: { index, address: '10.99.0.51', prefix: 24 } });

    // The parent goes down: the macvlan loses its lower layer.
    await lab.exec(node, 'ip', ['link', 'set', 'eth0', 'down']);
    const parentDown = await watch.next('parent down', (e) => e.ev === 'link' && (e.link as LinkInfo).name === 'eth0' && (e.link as LinkInfo).up === false);
    t.ok(parentDown, 'parent down reported');
    const child = await watch.next('macvlan lower layer down', (e) => e.ev === 'link' && (e.link as LinkInfo).index === index && (e.link as LinkInfo).operState === 'lowerlayerdown');
    t.match(child.link, { name, carrier: false });

    await lab.exec(node, 'ip', ['link', 'del', name]);
    const gone = await watch.next('link deletion', (e) => e.ev === 'link' && e.type === 'del' && (e.link as LinkInfo).index === index);
    t.ok(gone, 'deletion reported');
  });
}
