// failover/networks.ts: one gate per network behind one failover interface.
// The gates here are recording fakes (the composition is pure routing); the
// real gates on real NICs are test/privileged/networks.test.ts's.
import t from 'tap';
import { EventEmitter } from 'node:events';
import { NetworkGates, type NetworkGate } from '../../agent/failover/networks';
import type { ServiceSpec } from '../../agent/config/types';

class FakeGate extends EventEmitter implements NetworkGate {
  updates: string[][] = [];
  masters = new Set<string>();
  sources: string[] = [];
  stopped = false;
  update(services: readonly ServiceSpec[]): void { this.updates.push(services.map((s) => s.key)); }
  isMaster(k: string): boolean { return this.masters.has(k); }
  status(k: string): Record<string, unknown> | undefined { return this.masters.has(k) ? { state: 'master' } : { state: 'backup' }; }
  knownVip(k: string): string | undefined { return `vip-of-${k}`; }
  setSourceAddress(a: string): void { this.sources.push(a); }
  async stop(): Promise<void> { this.stopped = true; }
}

const spec = (key: string, network?: string): ServiceSpec => ({ key, ...(network ? { network } : {}) }) as unknown as ServiceSpec;

t.test('each gate gets its own network\'s services; questions go to the service\'s gate', async (t) => {
  const def = new FakeGate();
  const vm = new FakeGate();
  const g = new NetworkGates(new Map<string, NetworkGate>([['default', def], ['vmnet', vm]]));
  g.update([spec('ns/a'), spec('ns/b', 'vmnet'), spec('ns/c', 'vmnet')], () => undefined);
  t.same(def.updates, [['ns/a']]);
  t.same(vm.updates, [['ns/b', 'ns/c']]);
  vm.masters.add('ns/b');
  t.equal(g.isMaster('ns/b'), true, 'Master on its own network');
  t.equal(g.isMaster('ns/a'), false, 'the default network\'s gate says Backup for its service');
  t.same(g.status('ns/b'), { state: 'master', network: 'vmnet' }, 'status names the network');
  t.equal(g.knownVip('ns/c'), 'vip-of-ns/c');
  t.equal(g.isMaster('ns/unknown'), false, 'an unknown service is held by nobody');
  g.setSourceAddress('10.99.0.9');
  t.same([def.sources, vm.sources], [['10.99.0.9'], []], 'the parent\'s address moves the default network\'s adverts only');
  g.setSourceAddress('10.98.0.4', 'vmnet');
  t.same([def.sources, vm.sources], [['10.99.0.9'], ['10.98.0.4']], 'a named network\'s NIC address moves that network\'s adverts only');
  const seen: unknown[] = [];
  g.on('change', (keys: string[]) => seen.push(['change', keys]));
  g.on('reannounce', (keys: string[]) => seen.push(['reannounce', keys]));
  vm.emit('change', ['ns/b']);
  def.emit('reannounce', ['ns/a']);
  t.same(seen, [['change', ['ns/b']], ['reannounce', ['ns/a']]], 'every gate\'s events come out');
  g.update([spec('ns/a')], () => undefined);
  t.same(vm.updates.at(-1), [], 'a network left without services gets an empty update (its routers stop)');
  await g.stop();
  t.ok(def.stopped && vm.stopped, 'stop stops every gate');
});
