// The forward entry point builds the data path that was selected.
import t from 'tap';
import { Registry } from 'prom-client';
import { createDataplane, natEngineChoice, parseDsrEngine, selectDataplane } from '../../agent/forward';

t.test('createDataplane builds the selected kind and labels the info metric with the reason', async (t) => {
  const proxy = { algorithm: 'round-robin' as const, idleTimeout: 60, connectTimeout: 3 };
  const registry = new Registry();
  const sel = await selectDataplane('auto', async () => ({ ok: false, reason: 'no nft' }));
  const dp = createDataplane(sel, { proxy, registry });
  t.equal(dp.kind, 'proxy');
  t.match(await registry.metrics(), /lbagent_forward_dataplane_info\{kind="proxy",reason="auto: nftables unavailable \(no nft\); using the userspace proxy"\} 1/);
  await dp.stop();
  const k = createDataplane({ kind: 'kernel', reason: 'configured: dataplane: kernel' }, { proxy });
  t.equal(k.kind, 'kernel', 'constructing the kernel path touches nothing until apply()');
});

t.test('LB_AGENT_DSR_ENGINE: unset or auto, nft; anything else refused at start', async (t) => {
  t.equal(parseDsrEngine(undefined), 'auto');
  t.equal(parseDsrEngine(''), 'auto');
  t.equal(parseDsrEngine('auto'), 'auto');
  t.equal(parseDsrEngine('nft'), 'nft');
  t.throws(() => parseDsrEngine('xdp'), { code: 'LB_ERR_CONFIG_INVALID', message: /LB_AGENT_DSR_ENGINE="xdp": expected auto or nft/ });
});

t.test('natEngineChoice: kernel.engine against the engine\'s probe', async (t) => {
  let probed = 0;
  const ok = (): undefined => { probed++; return undefined; };
  const no = (): string => { probed++; return 'libbpf is not installed'; };
  t.same(natEngineChoice('nft', no), { use: false, reason: 'configured: kernel.engine: nft' });
  t.equal(probed, 0, 'nft never probes');
  t.same(natEngineChoice('ebpf', ok), { use: true, reason: 'configured: kernel.engine: ebpf' });
  t.throws(() => natEngineChoice('ebpf', no), { code: 'LB_ERR_FORWARD_NAT_BPF', message: /kernel.engine: ebpf, and the eBPF NAT engine cannot run on this node: libbpf is not installed/ });
  t.same(natEngineChoice('auto', ok), { use: true, reason: 'auto: the eBPF NAT engine loads and attaches here' });
  t.same(natEngineChoice('auto', no), { use: false, reason: 'auto: the eBPF NAT engine cannot run here (libbpf is not installed); the nft table forwards alone' });
});
