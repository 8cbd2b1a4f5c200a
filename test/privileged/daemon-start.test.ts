// What a start costs and what it answers (issue 18), on the real binary:
// the control socket answers while the start is still under way and says
// every service is "starting" (a reload asked meanwhile waits for the
// start); a small config is parsed without a worker thread, at the start and
// on a reload (a reload of a larger file uses one); a pool service on the kernel path loads no DHCP, VRRP or proxy
// code, none of prom-client's extras, no ajv compiler and no node:crypto,
// and a reload that adds a DHCP service loads DHCP then and runs it (and
// still no node:crypto: the addon hashes its link name and MAC).
// Which of the agent's modules load is observed on tsc's module tree
// (AGENT_MODULE_TREE_BIN); the production bundle (AGENT_BIN, one file) is
// held to the same laziness by what it can show: no worker, no node:crypto,
// no file of the module tree, none of the built-ins behind pino's transport
// and sonic-boom's assert, one native addon (ours: the `netlink` package's
// own is not loaded), and a reload of a larger file parsed by its own
// worker bundle.
// The start is slowed by an `nft` on PATH whose `--version` (the probe's
// first call) waits 1.5 s, so "while starting" is a window, not a race.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startAgent, agentCli, AGENT_BIN, AGENT_MODULE_TREE_BIN } from '../../lab/agent';
import { controlRequest } from '../../agent/control/server';
import type { StatusDocument } from '../../agent/daemon/daemon';
import { RELOAD_INLINE_MAX_BYTES } from '../../agent/config/load-async';

/**
 * The agent with the observer preloaded, and nothing else: tap adds its own
 * loader to every child's NODE_OPTIONS (a worker thread and modules of its
 * own), which `env` replaces here.
 */
function observer(): string[] {
  return ['env', `NODE_OPTIONS=--require ${path.join(__dirname, 'fixtures', 'start-observer.js')}`];
}

/** What fixtures/start-observer.ts wrote at the agent's exit. */
interface Observed { workers: number; origins: string[]; execArgv: string[]; modules: string[]; builtins: string[]; atListen: string[]; addons: string[] }

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };

function config(withDhcp: boolean): Record<string, unknown> {
  return {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '' },
    // The nft table alone: what loads for the eBPF NAT engine (the default, auto) is not what these starts observe.
    kernel: { engine: 'nft' },
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    arp: FAST_ARP,
    services: [
      { name: 'web', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'] },
      ...(withDhcp ? [{ name: 'api', ipam: 'dhcp', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'] }] : []),
    ],
  };
}

t.test('start: control socket first, nothing the config does not use', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const bin = lab.file('slow-bin');
  fs.mkdirSync(bin);
  const realNft = ['/usr/sbin/nft', '/sbin/nft', '/usr/bin/nft'].find((p) => fs.existsSync(p))!;
  // Only the probe's first call (`nft --version`) waits: the start, not every apply.
  fs.writeFileSync(path.join(bin, 'nft'), `#!/bin/sh\n[ "$1" = --version ] && sleep 1.5\nexec ${realNft} "$@"\n`, { mode: 0o755 });
  const observed = lab.file('observed.json');
  const agent = await startAgent(lab, node, config(false), {
    waitReady: false,
    env: { PATH: `${bin}:${process.env.PATH ?? ''}`, LB_TEST_OBSERVE: observed }, command: observer(), bin: AGENT_MODULE_TREE_BIN,
  });
  t.teardown(() => { if (agent.proc.exitCode === null) agent.signal('SIGKILL'); });

  // The socket answers before the start has finished (the nft probe alone takes 1.5 s).
  const early = await waitFor('control socket', async () => (await controlRequest(agent.socket, 'status', 1000).catch(() => undefined)) as StatusDocument | undefined, 15_000, 20);
  t.notOk(agent.logs.some((l) => l.msg === 'lb-agent started'), 'answered before "lb-agent started"');
  t.same(early.services.map((s) => [s.key, s.state, s.ready]), [['default/web', 'starting', false]], 'the service is listed as starting, not ready');
  t.equal(early.ready, false);
  t.equal(early.config.generation, 1);

  // A reload asked while starting waits for the start, then applies.
  agent.writeConfig(config(true));
  const reload = await agentCli(lab, node, ['reload', '--socket', agent.socket], 30_000);
  t.equal(reload.code, 0, `reload applied after the start: ${reload.stdout}${reload.stderr}`);
  const started = agent.logs.findIndex((l) => l.msg === 'lb-agent started');
  const reloaded = agent.logs.findIndex((l) => l.op === 'reload' && typeof l.msg === 'string' && l.msg.startsWith('reloaded'));
  t.ok(started >= 0 && reloaded > started, 'the reload ran after the start finished');

  // The pool VIP's RFC 5227 claim may still run when the reload has applied
  // (a small reload parses inline now, without a worker's ~100 ms): wait for it.
  const after = await waitFor('both services, the pool one with its VIP', async () => {
    const s = await agent.status();
    return s.services.length === 2 && s.services.every((x) => x.state !== 'starting') && s.services.some((x) => x.key === 'default/web' && x.vip !== undefined) ? s : undefined;
  }, 15_000);
  t.equal(after.config.generation, 2);
  t.equal(after.services.find((s) => s.key === 'default/web')!.vip, '10.99.0.200', 'the pool service got its VIP');
  t.equal(after.services.find((s) => s.key === 'default/api')!.ipam, 'dhcp');
  // Its macvlan, then a start slot after the RFC 2131 start jitter (up to 1 s), then DISCOVERs.
  const api = await waitFor('the DHCP service discovering', async () => {
    const x = (await agent.status()).services.find((s) => s.key === 'default/api')!;
    return /selecting|init|pending/i.test(String(x.source?.state ?? x.state)) ? x : undefined;
  }, 15_000);
  t.pass(`the DHCP service added by the reload runs (no server here): ${api.state} ${api.reason ?? ''}`);

  agent.signal('SIGTERM');
  t.equal((await agent.exited).code, 0);
  const o = JSON.parse(fs.readFileSync(observed, 'utf8')) as Observed;
  t.equal(o.workers, 0, `no worker thread: the start and the reload of a small file parsed inline (issue 18; created at: ${o.origins.join('\n')})`);
  const loaded = (re: RegExp): string[] => o.modules.filter((m) => re.test(m));
  t.same(loaded(/\/agent\/failover\//), [], 'no VRRP code (failover.mode none)');
  t.same(loaded(/\/agent\/forward\/proxy\.js$/), [], 'no proxy code on the kernel path');
  t.same(loaded(/prom-client\/index\.js$|@opentelemetry/), [], 'prom-client\'s index and its exemplars\' @opentelemetry/api unloaded');
  t.same(loaded(/node_modules\/ajv\/(?!dist\/runtime\/)/), [], 'no ajv compiler (the schema is compiled at build time)');
  t.ok(loaded(/\/agent\/dhcp\/driver\.js$/).length === 1, 'the DHCP driver was loaded by the reload that added a DHCP service');
  // Issue 18: the DHCP service's link name and MAC are hashed by the addon (the node binary's OpenSSL), not node:crypto (~0.55 MiB).
  t.notOk(o.builtins.includes('crypto'), 'no node:crypto, not even for a DHCP service (its MAC is hashed by the addon)');
  // Issue 18: only what the control socket needs loads before it listens.
  const beforeListen = (re: RegExp): string[] => o.atListen.filter((m) => re.test(m));
  t.ok(beforeListen(/\/agent\/control\/server\.js$/).length === 1 && beforeListen(/\/node_modules\/js-yaml\//).length > 0, 'the observer saw the control socket listen, the config parsed');
  t.same(beforeListen(/\/node_modules\/prom-client\//), [], 'no prom-client before the control socket listens');
  t.same(beforeListen(/\/agent\/(daemon\/(late|wiring|reconciler)|metrics\/server|forward|health|net\/ownership|config\/labels)(\/|\.js$)/), [],
    'no reload planner, metrics server, data path, health or topology code before the control socket listens');
});

t.test('a pool-only start loads no DHCP code and no node:crypto', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const observed = lab.file('observed.json');
  const agent = await startAgent(lab, node, config(false), {
    env: { LB_TEST_OBSERVE: observed }, command: observer(), bin: AGENT_MODULE_TREE_BIN,
  });
  t.teardown(() => { if (agent.proc.exitCode === null) agent.signal('SIGKILL'); });
  await waitFor('VIP', async () => (await agent.status()).services[0]?.vip === '10.99.0.200', 15_000);
  agent.signal('SIGTERM');
  t.equal((await agent.exited).code, 0);
  const o = JSON.parse(fs.readFileSync(observed, 'utf8')) as Observed;
  t.equal(o.workers, 0, `no worker thread at all (created at: ${o.origins.join('\n')}; execArgv ${o.execArgv.join(' ')})`);
  t.same(o.modules.filter((m) => /\/agent\/dhcp\//.test(m)), [], 'no DHCP code');
  t.notOk(o.builtins.includes('crypto'), 'no node:crypto');
  // Issue 18: our DSR program never outlives the netdev table behind it, so
  // with no table left at start there is nothing to look for (forward/nft.ts).
  t.same(o.modules.filter((m) => /\/agent\/net\/ebpf/.test(m)), [], 'no BPF driver: no DSR asked for, no netdev table left at start');
});

t.test('the production bundle: one file, as lazy as the module tree, its parse worker beside it', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const observed = lab.file('observed.json');
  const agent = await startAgent(lab, node, config(false), { env: { LB_TEST_OBSERVE: observed }, command: observer() });
  t.teardown(() => { if (agent.proc.exitCode === null) agent.signal('SIGKILL'); });
  await waitFor('VIP', async () => (await agent.status()).services[0]?.vip === '10.99.0.200', 15_000);
  // A reload of a small file parses inline; of a file over RELOAD_INLINE_MAX_BYTES
  // in a worker thread: dist/bundle/parse-worker.js, found beside the bundle.
  const grown = { ...config(false), services: [...(config(false).services as object[]), { name: 'web2', ipam: 'pool', ports: [{ port: 81, targetPort: 8080 }], backends: ['10.99.0.11'] }] };
  agent.writeConfig(grown);
  const small = await agentCli(lab, node, ['reload', '--socket', agent.socket], 30_000);
  t.equal(small.code, 0, `the bundle's reload of a small file applied: ${small.stdout}${small.stderr}`);
  agent.writeConfig({ ...grown, services: grown.services.slice(0, 1) });
  fs.appendFileSync(agent.configPath, `${'# padding: a file the size of a large config\n'.repeat(Math.ceil(RELOAD_INLINE_MAX_BYTES / 40))}`);
  t.ok(fs.statSync(agent.configPath).size > RELOAD_INLINE_MAX_BYTES, 'the second reload\'s file is over the inline limit');
  const large = await agentCli(lab, node, ['reload', '--socket', agent.socket], 30_000);
  t.equal(large.code, 0, `the bundle's reload of a larger file applied: ${large.stdout}${large.stderr}`);
  t.equal((await agent.status()).config.generation, 3);
  t.same((await agent.status()).services.map((x) => x.key), ['default/web'], 'the larger file was applied');
  agent.signal('SIGTERM');
  t.equal((await agent.exited).code, 0);
  const o = JSON.parse(fs.readFileSync(observed, 'utf8')) as Observed;
  t.ok(o.modules.includes(AGENT_BIN), `the bundle ran (${AGENT_BIN})`);
  t.same(o.modules.filter((m) => /\/dist\/(agent|lab)\//.test(m)), [], 'no file of the module tree was loaded: the agent ran from the bundle alone');
  t.equal(o.workers, 1, `one worker thread, the larger reload's parse; the small one was inline (created at: ${o.origins.join('\n')})`);
  t.notOk(o.builtins.includes('crypto'), 'no node:crypto: the bundle keeps the lazy require()s of the module tree');
  // agent/bundle-build.ts LAZY_CALLS: pino's transport (thread-stream, Node's module loader API) and sonic-boom's assert load only if called.
  t.same(o.builtins.filter((b) => b === 'assert' || b === 'module' || b === 'internal/modules/esm/loader'), [], 'no assert, no `module`: pino\'s transport and sonic-boom\'s assert were not loaded');
  t.same(o.atListen.filter((m) => /prom-client/.test(m)), [], 'no prom-client before the control socket listens');
  // Issue 18: rtnetlink runs on the addon's netlink socket; the `netlink`
  // package's own prebuilt addon (~0.25 MiB of RSS) is never loaded.
  t.same(o.addons.map((f) => path.basename(f)), ['lbagent_native.node'], `one native addon mapped, ours (${o.addons.join(', ')})`);
  t.same(o.modules.filter((m) => /node_modules\/(netlink|node-gyp-build)\//.test(m)), [], 'no file of the netlink package loaded from node_modules: its JavaScript is bundled, its raw layer replaced');
});

t.test('the production bundle: a start takes the code cache the start before it wrote', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  const cc = lab.file('code-cache');
  const run = async (name: string): Promise<Record<string, unknown>[]> => {
    const agent = await startAgent(lab, node, config(false), { name, env: { LB_AGENT_CODE_CACHE: cc } });
    t.teardown(() => { if (agent.proc.exitCode === null) agent.signal('SIGKILL'); });
    await waitFor('VIP', async () => (await agent.status()).services[0]?.vip === '10.99.0.200', 15_000);
    agent.signal('SIGTERM');
    t.equal((await agent.exited).code, 0);
    return agent.logs;
  };
  const started = (logs: Record<string, unknown>[]): Record<string, unknown> | undefined => logs.find((l) => l.msg === 'lb-agent started');
  const written = (logs: Record<string, unknown>[]): Record<string, unknown> | undefined => logs.find((l) => l.op === 'code-cache');

  const first = await run('cc1');
  t.equal(started(first)?.codeCache, 'absent', 'the first start had no cache to take');
  t.ok(Number(written(first)?.bytes) > 100_000, `it wrote one once settled (${String(written(first)?.bytes)} bytes)`);
  const files = fs.readdirSync(cc);
  t.match(files, [/^run-[0-9a-f]{12}-[0-9a-f]{8}\.v8cache$/], 'one file, for the daemon\'s role');

  // The fast path's own test: a start that compiled from source again would say so here.
  const second = await run('cc2');
  t.equal(started(second)?.codeCache, 'accepted', 'the second start took it');
  t.equal(written(second), undefined, 'and wrote nothing');

  // A cache V8 refuses (not its data) costs a compile from source, then is replaced.
  const file = path.join(cc, files[0]!);
  const buf = fs.readFileSync(file);
  fs.writeFileSync(file, Buffer.concat([buf.subarray(0, buf.indexOf(10) + 1), Buffer.alloc(4096, 0x5a)]));
  const third = await run('cc3');
  t.equal(started(third)?.codeCache, 'rejected', 'a refused cache is said to be refused');
  t.ok(Number(written(third)?.bytes) > 100_000, 'and written again');
  t.equal(started(await run('cc4'))?.codeCache, 'accepted', 'which the next start takes');
});
