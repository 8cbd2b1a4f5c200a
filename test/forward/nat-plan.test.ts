// nat-plan.ts: the engine's per-plan map entries for a forwarding state.
import t from 'tap';
import { parseIPv4 } from '../../agent/address';
import type { BackendSpec } from '../../agent/config/types';
import { normalizeState, type ForwardService } from '../../agent/forward/dataplane';
import { natPlan } from '../../agent/forward/nat-plan';
import { flowHashSlots } from '../../agent/forward/nft-dsr';
import { natLayout } from '../../agent/net/ebpf/nat-layout';

const b = (address: string, weight = 1): BackendSpec => ({ address, addressNum: parseIPv4(address) ?? 0, weight });
const all = [b('10.0.0.11'), b('10.0.0.12'), b('10.0.0.13', 2)];
const web = (healthy: BackendSpec[], extra: Partial<ForwardService> = {}): ForwardService => ({
  key: 'default/web', vip: '10.0.0.50', backends: all, healthy,
  ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }], ...extra,
});
const l = natLayout();
/** A network-order address field as decoded (a little-endian read of its bytes), dotted. */
const ip = (n: unknown): string => [0, 8, 16, 24].map((s) => ((n as number) >>> s) & 0xff).join('.');

t.test('a service with three healthy backends: both ports, the whole slot table, every member', async (t) => {
  const plan = natPlan({ services: [web(all)] }, l);
  t.same(plan.serviceKeys, ['default/web']);
  t.equal(plan.services.length, 2);
  t.equal(plan.members.length, 6, 'every configured backend of each port');
  t.equal(plan.counters.length, 6);
  const slots = flowHashSlots(normalizeState({ services: [web(all)] }).services[0]!);
  t.equal(plan.slots.length, 2 * slots.length);
  // Ports are in normalizeState's order: TCP 80 first.
  const tcp = plan.services[0]!;
  const key = l.decode('lbn_svc_key', tcp.key);
  t.same([ip(key['vip']), key['proto']], ['10.0.0.50', 6]);
  t.equal(key['port'], 0x5000, 'port 80 in network order (read little-endian)');
  const v = l.decode('lbn_svc', tcp.value);
  t.equal(v['base'], 0);
  t.equal(v['slots'], slots.length);
  t.equal(v['target_port'], 0x901f, '8080 in network order');
  let wrong = 0;
  slots.forEach((s, i) => { if (ip(l.decode('lbn_slot', plan.slots[i]!)['backend']) !== s.address) wrong++; });
  t.equal(wrong, 0, 'every slot names the backend nft\'s flow-hash table names');
  const udp = l.decode('lbn_svc', plan.services[1]!.value);
  t.equal(udp['base'], slots.length, 'the UDP port\'s slots follow the TCP port\'s');
});

t.test('health: one healthy backend is one slot, none is zero slots; members say who is healthy', async (t) => {
  const one = natPlan({ services: [web([all[1]!])] }, l);
  t.equal(l.decode('lbn_svc', one.services[0]!.value)['slots'], 1);
  t.equal(ip(l.decode('lbn_slot', one.slots[0]!)['backend']), '10.0.0.12');
  const healthy = one.members.map((m) => [ip(l.decode('lbn_member_key', m.key)['backend']), l.decode('lbn_member', m.value)['healthy']]);
  t.same(healthy.slice(0, 3), [['10.0.0.11', 0], ['10.0.0.12', 1], ['10.0.0.13', 0]]);
  const none = natPlan({ services: [web([])] }, l);
  t.same(none.services.map((s) => l.decode('lbn_svc', s.value)['slots']), [0, 0], 'no slot: the program passes such a port to the nft table, which refuses it');
  t.equal(none.slots.length, 0);
});

t.test('only IPv4 VIPs held in snat mode', async (t) => {
  const plan = natPlan({
    services: [
      web(all, { key: 'a/dsr', vip: '10.0.0.51', sourceIP: 'preserve' }),
      web(all, { key: 'a/v6', vip: 'fd00::50' }),
      web(all, { key: 'a/none', vip: undefined }),
      web(all, { key: 'a/web' }),
    ],
  }, l);
  t.same(plan.serviceKeys, ['a/web']);
  t.equal(plan.services.length, 2);
});
