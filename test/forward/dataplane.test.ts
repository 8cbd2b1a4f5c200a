// Unit tests of the data-path contract: choosing kernel or proxy, and the
// canonical state both paths render from.
import t from 'tap';
import { parseIPv4 } from '../../agent/address';
import { isLbError } from '../../agent/errors';
import type { BackendSpec, PortSpec } from '../../agent/config/types';
import { dsrUnavailable, normalizeState, sameForwardService, portLabel, proxyNeededReason, selectDataplane, serviceLabels, servicesNeedingProxy } from '../../agent/forward/dataplane';

const ok = async () => ({ ok: true, reason: 'fine' });
const no = async () => ({ ok: false, reason: 'nft not found (install the nftables package)' });

t.test('selectDataplane', async (t) => {
  t.same(await selectDataplane('auto', ok), { kind: 'kernel', reason: 'auto: nftables probe passed' });
  t.same(await selectDataplane('auto', no), {
    kind: 'proxy', reason: 'auto: nftables unavailable (nft not found (install the nftables package)); using the userspace proxy',
  });
  t.same(await selectDataplane('kernel', ok), { kind: 'kernel', reason: 'configured: dataplane: kernel' });
  let probed = false;
  t.same(await selectDataplane('proxy', async () => { probed = true; return { ok: true, reason: '' }; }), { kind: 'proxy', reason: 'configured: dataplane: proxy' });
  t.notOk(probed, 'proxy does not probe');
  const err = await selectDataplane('kernel', no).catch((e: unknown) => e);
  t.ok(isLbError(err, 'LB_ERR_FORWARD_NFT_MISSING'), 'explicit kernel without nftables fails at start');
  t.match((err as Error).message, /nft not found.*dataplane: auto or proxy/);
});

t.test('dsrUnavailable: the kernel path and a passed probe, or why not', async (t) => {
  t.equal(dsrUnavailable('kernel', { ok: true, reason: 'fine' }), undefined);
  t.match(dsrUnavailable('proxy', { ok: true, reason: 'fine' }), /needs the kernel data path/);
  t.match(dsrUnavailable('kernel', { ok: false, reason: 'the kernel rejected the test table' }), /this kernel cannot do direct server return: the kernel rejected/);
  t.match(dsrUnavailable('kernel', undefined), /not probed/);
});

t.test('labels', async (t) => {
  t.same(serviceLabels('kube-system/dns'), { service: 'dns', namespace: 'kube-system' });
  t.same(serviceLabels('solo'), { service: 'solo', namespace: 'default' });
  t.equal(portLabel({ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }), 'http');
  t.equal(portLabel({ name: '', port: 80, protocol: 'TCP', targetPort: 8080 }), '80');
});

const b = (address: string, weight = 1): BackendSpec => ({ address, addressNum: parseIPv4(address)!, weight });
const p = (port: number, protocol: 'TCP' | 'UDP' = 'TCP'): PortSpec => ({ name: '', port, protocol, targetPort: port });

t.test('normalizeState: canonical order, backends merged, weightless healthy dropped, conflicts reported', async (t) => {
  const { services, problems } = normalizeState({
    services: [
      { key: 'z/z', vip: '10.0.0.1', ports: [p(80)], healthy: [], backends: [] },
      { key: 'a/a', vip: '10.0.0.1', ports: [p(80), p(53, 'UDP'), p(22)], healthy: [b('10.0.0.9'), b('10.0.0.10', 0), b('10.0.0.9')], backends: [b('10.0.0.10'), b('10.0.0.2')] },
    ],
  });
  t.same(services.map((s) => s.key), ['a/a', 'z/z']);
  t.same(services[0]!.ports.map((x) => `${x.spec.protocol}/${x.spec.port}#${x.index}`), ['TCP/22#0', 'TCP/80#1', 'UDP/53#2']);
  t.same(services[0]!.healthy.map((x) => x.address), ['10.0.0.9'], 'weight 0 is not healthy; duplicates removed');
  t.same(services[0]!.all.map((x) => x.address), ['10.0.0.2', '10.0.0.9', '10.0.0.10'], 'numeric address order; healthy-only backends included');
  t.same(services[1]!.ports, [], 'z/z loses the clashing port');
  t.same(problems, ['z/z: TCP port 80 on 10.0.0.1 is already forwarded for a/a; not forwarding it']);
  const notHeld = normalizeState({ services: [{ key: 'a/a', vip: undefined, ports: [p(80)], healthy: [], backends: [] }, { key: 'b/b', vip: undefined, ports: [p(80)], healthy: [], backends: [] }] });
  t.same(notHeld.problems, [], 'no VIP, no clash');
  // Issue 17: the source mode defaults to snat; the VIP's MAC is compared lower-case.
  const modes = normalizeState({ services: [
    { key: 'a/a', vip: '10.0.0.1', ports: [p(80)], healthy: [], backends: [] },
    { key: 'b/b', vip: '10.0.0.2', ports: [p(80)], healthy: [], backends: [], sourceIP: 'preserve', vipMac: '52:54:00:AB:CD:EF' },
  ] }).services;
  t.same(modes.map((s) => [s.sourceIP, s.vipMac]), [['snat', undefined], ['preserve', '52:54:00:ab:cd:ef']]);
});

t.test('normalizeState keeps a service\'s normalized object while its forwarding state is the same object (issue 47)', async (t) => {
  const a = { key: 'a/a', vip: '10.0.0.1', ports: [p(80), p(22)], healthy: [b('10.0.0.9')], backends: [b('10.0.0.9'), b('10.0.0.2')] };
  const z = { key: 'z/z', vip: '10.0.0.2', ports: [p(80)], healthy: [], backends: [] };
  const first = normalizeState({ services: [z, a] }).services;
  const again = normalizeState({ services: [a, z] }).services;
  t.equal(again[0], first[0], 'a: the same object');
  t.equal(again[1], first[1], 'z: the same object');
  const a2 = { ...a, healthy: [] };
  const changed = normalizeState({ services: [a2, z] }).services;
  t.not(changed[0], first[0], 'a new forwarding state is normalized again');
  t.same(changed[0]!.healthy, [], 'from its new fields');
  t.equal(changed[1], first[1], 'the other service keeps its object');
  // A clash depends on the other services: the object normalized alone keeps every port; the clashing one is dropped from a copy.
  const clash = { key: 'b/b', vip: '10.0.0.2', ports: [p(80), p(443)], healthy: [], backends: [] };
  const withClash = normalizeState({ services: [clash, z] });
  t.same(withClash.services[1]!.ports, [], 'z/z loses port 80 to b/b (b sorts first)');
  t.not(withClash.services[1], first[1], 'in a copy');
  t.same(normalizeState({ services: [z] }).services[0]!.ports.map((x) => x.spec.port), [80], 'z/z alone again: the copy did not leak into the kept object');
  const zFirst = normalizeState({ services: [{ ...z, key: 'a/z' }, clash] });
  t.same(zFirst.services[1]!.ports.map((x) => `${x.spec.port}#${x.index}`), ['443#1'], 'b/b keeps 443 at its index (80 sorts first and is a/z\'s)');
  t.same(zFirst.problems, ['b/b: TCP port 80 on 10.0.0.2 is already forwarded for a/z; not forwarding it']);
  const alone = normalizeState({ services: [clash] }).services[0]!;
  t.same(alone.ports.map((x) => `${x.spec.port}#${x.index}`), ['80#0', '443#1'], 'alone, every port again');
});

t.test('sameForwardService: every field, arrays element by element', async (t) => {
  const base = { key: 'a/a', vip: '10.0.0.1', ports: [p(80)], healthy: [b('10.0.0.9')], backends: [b('10.0.0.9'), b('10.0.0.2')], sourceIP: 'snat' as const };
  t.ok(sameForwardService(base, { ...base, ports: [p(80)], healthy: [b('10.0.0.9')] }), 'equal arrays of equal elements, new objects');
  t.notOk(sameForwardService(base, { ...base, healthy: [] }), 'a backend gone');
  t.notOk(sameForwardService(base, { ...base, healthy: [b('10.0.0.9', 2)] }), 'a weight changed');
  t.notOk(sameForwardService(base, { ...base, healthy: [b('10.0.0.2')] }), 'another backend');
  t.notOk(sameForwardService(base, { ...base, vip: undefined }), 'the VIP released');
  t.notOk(sameForwardService(base, { ...base, handBack: '10.0.0.7' }), 'a field more');
  t.notOk(sameForwardService(base, { ...base, vipMac: undefined }), 'a field more, even undefined');
  t.notOk(sameForwardService(base, { ...base, ports: [p(81)] }), 'a port changed');
});

t.test('auto runs the proxy when a service asks for the PROXY protocol; kernel and proxy stay as configured', async (t) => {
  const need = servicesNeedingProxy([{ key: 'a/web', proxyProtocol: 'v2' }, { key: 'a/db' }, { key: 'b/mail', proxyProtocol: 'v1' }]);
  t.same(need, ['a/web', 'b/mail']);
  let probed = false;
  t.same(await selectDataplane('auto', async () => { probed = true; return { ok: true, reason: '' }; }, need), {
    kind: 'proxy', reason: 'auto: a/web, b/mail ask for the PROXY protocol, which only the userspace proxy sends',
  });
  t.notOk(probed, 'no nftables probe: the choice is made');
  t.same(await selectDataplane('auto', ok, []), { kind: 'kernel', reason: 'auto: nftables probe passed' });
  t.equal(proxyNeededReason(['a', 'b', 'c', 'd', 'e']), 'a, b, c and 2 more ask for the PROXY protocol, which only the userspace proxy sends');
});
