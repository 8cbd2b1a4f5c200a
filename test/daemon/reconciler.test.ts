// The reload plan over every kind of change: refusals with their reasons,
// the steps for services (add, remove, update, restart of the source) and
// for each top-level section, and their order.
import t from 'tap';
import { parseConfigText } from '../../agent/config/load';
import type { Desired } from '../../agent/config/types';
import { describeSummary, planReload, type ReloadStep, type RunningView } from '../../agent/daemon/reconciler';

function cfg(text: string): Desired {
  const r = parseConfigText(text, 'h');
  if (!r.ok) throw new Error(JSON.stringify(r.errors));
  return r.config;
}

const SERVICES = `services:
  - { name: a, ipam: dhcp, ports: [{ port: 80 }], backends: [10.0.0.1] }
  - { name: b, ports: [{ port: 80 }], backends: [10.0.0.2] }
  - { name: b2, primaryService: b, ports: [{ port: 81 }], backends: [10.0.0.2] }
  - { name: c, ports: [{ port: 80 }], backends: [10.0.0.3] }
`;
const base = `pools: { range-global: 10.0.0.10-10.0.0.20 }\n${SERVICES}`;
const running = (text = base, dataplane: 'kernel' | 'proxy' = 'kernel'): RunningView => ({ config: cfg(text), dataplane });
const ops = (steps: readonly ReloadStep[]): string[] => steps.map((s) => ('key' in s ? `${s.op} ${s.key}` : 'spec' in s ? `${s.op} ${s.spec.key}` : s.op));

function plan(next: string, r: RunningView = running()) {
  return planReload(r, cfg(next));
}

t.test('an identical file plans nothing', async (t) => {
  const p = plan(base);
  t.ok(p.ok);
  if (!p.ok) return;
  t.same(p.steps, []);
  t.equal(describeSummary(p.summary), 'reloaded: 0 added, 0 removed, 0 changed, 4 unchanged');
});

t.test('services: added, removed (secondary before primary), updated in place, address changes restart the source', async (t) => {
  const next = `pools: { range-global: 10.0.0.10-10.0.0.20 }
services:
  - { name: a, ipam: dhcp, ports: [{ port: 80 }, { port: 443 }], backends: [10.0.0.1, 10.0.0.9] }
  - { name: c, ports: [{ port: 80 }], backends: [10.0.0.3], loadBalancerIP: 10.0.0.15 }
  - { name: d, ports: [{ port: 80 }], backends: [10.0.0.4] }
  - { name: d2, primaryService: d, ports: [{ port: 81 }], backends: [10.0.0.4] }
`;
  const p = plan(next);
  t.ok(p.ok);
  if (!p.ok) return;
  t.same(ops(p.steps), ['remove default/b2', 'remove default/b', 'update default/a', 'restart-source default/c', 'add default/d', 'add default/d2']);
  const upd = p.steps.find((s) => s.op === 'update');
  t.same(upd && 'fields' in upd ? upd.fields : [], ['backends', 'ports'], 'an update names what changed; the VIP stays');
  const rs = p.steps.find((s) => s.op === 'restart-source');
  t.match(rs, { why: 'loadBalancerIP', release: true }, 'a new loadBalancerIP releases the old address');
  t.same(p.summary.added, ['default/d', 'default/d2']);
  t.same(p.summary.removed, ['default/b', 'default/b2']);
  t.same(p.summary.changed, ['default/a', 'default/c']);
});

t.test('a service\'s vrid or priority does not restart its source with failover.mode none', async (t) => {
  const p = plan(base.replace('{ name: c, ports', '{ name: c, vrid: 60, priority: 200, ports'));
  t.ok(p.ok);
  if (!p.ok) return;
  t.same(ops(p.steps), ['update default/c']);
});

t.test('each global section takes effect, or is accepted without effect with the reason', async (t) => {
  const next = `node: { name: renamed, priority: 200 }
failover: { mode: none, advertInterval: 0.5 }
metrics: { listen: 127.0.0.1:9555 }
dataplane: kernel
pools: { range-global: 10.0.0.30-10.0.0.40 }
arp: { probeNum: 1 }
dhcp: { retransmitInitial: 2, maxConcurrentStarts: 4 }
proxy: { algorithm: least-connections }
${SERVICES}`;
  const p = plan(next);
  t.ok(p.ok);
  if (!p.ok) return;
  t.same(ops(p.steps), ['pools', 'source-settings', 'metrics-listen']);
  t.same([...p.summary.sections].sort(), ['arp', 'dataplane', 'dhcp', 'metrics', 'node', 'pools']);
  t.same(p.summary.idle.map((i) => i.section).sort(), ['failover', 'proxy']);
  t.match(describeSummary(p.summary), /accepted without effect: .*failover \(failover.mode is none\)/);

  const onProxy = plan(next.replace('dataplane: kernel', 'dataplane: proxy'), running(base, 'proxy'));
  t.ok(onProxy.ok);
  if (onProxy.ok) t.ok(onProxy.steps.some((s) => s.op === 'proxy-settings'), 'on the proxy path the proxy settings apply');
  const priorityOnly = plan(`node: { priority: 200 }\n${base}`);
  t.ok(priorityOnly.ok && priorityOnly.summary.idle.some((i) => i.section === 'node'), 'node.priority alone has no effect without VRRP');
});

t.test('refused with a reason: what needs a restart, and a service\'s IPAM mode', async (t) => {
  const p = plan(`stateDir: /tmp/x\ncontrol: { socket: /tmp/y.sock }\nnode: { interface: eth9 }\ndataplane: proxy\n${base.replace('{ name: a, ipam: dhcp', '{ name: a, ipam: pool')}`);
  t.notOk(p.ok);
  if (p.ok) return;
  t.same(p.errors.map((e) => e.path).sort(), ['control.socket', 'dataplane', 'node.interface', 'services[0].ipam', 'stateDir']);
  for (const e of p.errors.filter((x) => x.path !== 'services[0].ipam')) t.match(e.message, /needs a restart \(systemctl restart lb-agent\), not a reload/);
  t.match(p.errors.find((e) => e.path === 'services[0].ipam')!.message, 'service default/a was created with dhcp IPAM and cannot change to pool');
  t.ok(plan(`dataplane: auto\n${base}`, running(base, 'kernel')).ok, 'auto that resolves to the running path is fine');
  t.notOk(plan(`dataplane: kernel\n${base}`, running(base, 'proxy')).ok, 'kernel while the proxy runs is refused');
});

t.test('with VRRP: failover, priorities and virtual routers need a restart; mode changes too', async (t) => {
  const vrrp = `failover: { mode: vrrp, vrid: 51 }\n${base}`;
  const r = running(vrrp);
  const adv = plan(vrrp.replace('vrid: 51', 'vrid: 51, advertInterval: 0.1'), r);
  t.notOk(adv.ok);
  if (!adv.ok) t.same(adv.errors.map((e) => e.path), ['failover']);
  const prio = plan(`node: { priority: 150 }\n${vrrp}`, r);
  t.notOk(prio.ok);
  if (!prio.ok) t.same(prio.errors.map((e) => e.path), ['node.priority']);
  const svc = plan(vrrp.replace('{ name: c, ports', '{ name: c, vrid: 60, ports'), r);
  t.notOk(svc.ok);
  if (!svc.ok) t.same(svc.errors.map((e) => e.path), ['services[3]']);
  const mode = plan(base, r);
  t.notOk(mode.ok);
  if (!mode.ok) t.same(mode.errors.map((e) => e.path), ['failover.mode']);
  t.ok(plan(vrrp.replace('backends: [10.0.0.3]', 'backends: [10.0.0.7]'), r).ok, 'backends still reload under VRRP');
});

t.test('issue 17: backend VIPs reload in place; a node zone change applies; DSR is refused where it cannot run', async (t) => {
  const withVips = plan(`backend: { vips: [10.0.0.99] }\n${base}`);
  t.ok(withVips.ok);
  if (withVips.ok) {
    t.same(ops(withVips.steps), ['backend-vips']);
    t.same(withVips.summary.sections, ['backend']);
  }
  const zone = plan(`node: { zone: zone-b }\n${base}`);
  t.ok(zone.ok && zone.summary.sections.includes('node') && zone.steps.length === 0, 'a new node.zone is applied (the daemon re-selects at every reload)');
  const preserve = base.replace('{ name: c, ports: [{ port: 80 }]', '{ name: c, sourceIP: preserve, ports: [{ port: 80 }]');
  const refused = plan(preserve, { ...running(), dsrUnavailable: 'this kernel cannot do direct server return: no nft_fwd_netdev' });
  t.notOk(refused.ok);
  if (!refused.ok) {
    t.same(refused.errors.map((e) => e.path), ['services[3].sourceIP']);
    t.match(refused.errors[0]!.message, /preserve: this kernel cannot do direct server return: no nft_fwd_netdev; use sourceIP: snat/);
  }
  const fine = plan(preserve);
  t.ok(fine.ok && fine.steps.some((s) => s.op === 'update' && s.fields.includes('sourceIP')), 'snat -> preserve is an update in place where DSR runs');
});

t.test('PROXY protocol on a running kernel path, and proxy.workers, need a restart (issues 17, 18)', async (t) => {
  const withPp = base.replace('{ name: c, ports: [{ port: 80 }]', '{ name: c, proxyProtocol: v2, ports: [{ port: 80 }]');
  const p = plan(withPp, running(base, 'kernel'));
  t.notOk(p.ok, 'auto chose the kernel path at start: a service that asks for PROXY protocol cannot ride it');
  if (!p.ok) {
    t.same(p.errors.map((e) => e.path), ['services[3].proxyProtocol']);
    t.match(p.errors[0]!.message, /default\/c asks for the PROXY protocol, which only the userspace proxy sends.*needs a restart/);
  }
  t.ok(plan(withPp, running(base, 'proxy')).ok, 'on the proxy path it is an update like any other');
  const two = `proxy: { workers: 2 }\n${base}`;
  const w = plan(`proxy: { workers: 3 }\n${base}`, running(two, 'proxy'));
  t.notOk(w.ok);
  if (!w.ok) t.match(w.errors[0]!, { path: 'proxy.workers', message: /changed from 2 to 3: the proxy's worker threads .* needs a restart/ });
  t.ok(plan(`proxy: { workers: 3 }\n${base}`, running(two, 'kernel')).ok, 'idle on the kernel path');
});

t.test('dual stack: adding the IPv6 family adds its family service, on either data path', async (t) => {
  const dual = `pools: { range-global: "10.0.0.10-10.0.0.20,fd00::10-fd00::20" }\nservices:\n  - { name: b, ports: [{ port: 80 }], backends: [10.0.0.2, "fd00::2"], ipFamilyPolicy: RequireDualStack }\n`;
  const single = `pools: { range-global: "10.0.0.10-10.0.0.20,fd00::10-fd00::20" }\nservices:\n  - { name: b, ports: [{ port: 80 }], backends: [10.0.0.2] }\n`;
  const p = plan(dual, running(single));
  t.ok(p.ok);
  if (p.ok) t.same(ops(p.steps), ['update default/b', 'add default/b@IPv6'], 'the IPv4 VIP updated in place (its policy), the IPv6 one added');
  const proxy = plan(dual, running(single, 'proxy'));
  t.ok(proxy.ok, 'the proxy takes an IPv6 VIP by reload');
  if (proxy.ok) t.same(ops(proxy.steps), ['update default/b', 'add default/b@IPv6']);
});

t.test('with VRRP: every network\'s tracks reload in place (one tracks step, last); the rest of failover and of a network still needs a restart', async (t) => {
  const net = (track = '', peers = '') => `node: { interface: eth0 }
failover: { mode: vrrp, vrid: 51${track} }
networks:
  vmnet:
    interface: eth1
    pools: { range-global: 10.1.0.10-10.1.0.20 }
    failover: { vrid: 61${peers} }
pools: { range-global: 10.0.0.10-10.0.0.20 }
${SERVICES}  - { name: d, network: vmnet, ports: [{ port: 80 }], backends: [10.1.0.3, 10.1.0.4] }
`;
  const r = running(net());
  const top = plan(net(', track: { interfaces: [{ name: eth0, weight: 50 }], services: [{ service: c }] }'), r);
  t.ok(top.ok, top.ok ? 'failover.track added: accepted' : JSON.stringify(top.errors));
  if (top.ok) {
    t.same(ops(top.steps), ['tracks']);
    t.same(top.summary.sections, ['failover'], 'reported as applied, not idle');
  }
  const vmTracked = net('', ', track: { services: [{ service: d, minHealthy: 2, weight: 60 }] }');
  const onNet = plan(vmTracked, r);
  t.ok(onNet.ok, onNet.ok ? 'networks.vmnet.failover.track added: accepted' : JSON.stringify(onNet.errors));
  if (onNet.ok) {
    t.same(ops(onNet.steps), ['tracks'], 'no pools step: vmnet\'s pools did not change');
    t.same(onNet.summary.sections, ['networks']);
  }
  const weight = plan(net('', ', track: { services: [{ service: d, minHealthy: 1, weight: 60 }] }'), running(vmTracked));
  t.ok(weight.ok && ops(weight.steps).join() === 'tracks', 'minHealthy changed: the tracks step');
  const removed = plan(net(), running(vmTracked));
  t.ok(removed.ok && ops(removed.steps).join() === 'tracks', 'removed: the tracks step');
  const withSvc = plan(`${net('', ', track: { services: [{ service: e }] }')}  - { name: e, network: vmnet, ports: [{ port: 80 }], backends: [10.1.0.5] }\n`, r);
  t.ok(withSvc.ok);
  if (withSvc.ok) t.same(ops(withSvc.steps), ['add default/e', 'tracks'], 'after the service it tracks is added');
  const both = plan(net(', advertInterval: 0.5, track: { interfaces: [{ name: eth0 }] }'), r);
  t.notOk(both.ok, 'a timer changed with a track: refused');
  if (!both.ok) {
    t.same(both.errors.map((e) => e.path), ['failover']);
    t.match(both.errors[0]!.message, /only failover\.track changes by reload/);
    t.notMatch(both.errors[0]!.message, /"track"/, 'the tracks are not named among what needs a restart');
  }
  const peers = plan(net('', ', peers: [10.1.0.3]'), r);
  t.notOk(peers.ok, 'a network\'s peers still need a restart');
  if (!peers.ok) t.same(peers.errors.map((e) => e.path), ['networks.vmnet']);
  const none = plan(net(', track: { interfaces: [{ name: eth0 }] }').replace('mode: vrrp', 'mode: none'), running(net().replace('mode: vrrp', 'mode: none')));
  t.ok(none.ok && ops(none.steps).length === 0, 'without VRRP: no step');
  if (none.ok) t.same(none.summary.idle.map((i) => i.section), ['failover']);
});
