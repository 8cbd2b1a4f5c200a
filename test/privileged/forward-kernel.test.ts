// Privileged: the kernel data path (nftables) end to end in a lab: client ->
// VIP on the node -> DNAT/SNAT -> backends b1..b3, with the data path driven
// inside the node namespace (lab/bin/forward-driver.ts). The common
// scenarios (weights, removal mid-stream, long-lived connection, refusal) are
// in fixtures/forward-scenarios.ts; here also the table's life cycle: adopted when
// it matches, rewritten at start when someone altered it, removed at stop.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { run } from '../../lab/netns';
import { probeNftables } from '../../agent/forward/nft';
import { applyWeb, startDriver, HTTP_PORT, VIP, type Burst } from '../../lab/forward';
import { commonScenarios } from './fixtures/forward-scenarios';

if (requirePrivileged(t)) {
  t.test('probeNftables: the kernel takes our table in a throwaway namespace; the host is untouched', async (t) => {
    const before = await run('nft', ['list', 'table', 'ip', 'lb_agent'], { allowFail: true });
    const r = await probeNftables();
    t.same(r, { ok: true, reason: 'nftables accepted a test table in a throwaway namespace' });
    const after = await run('nft', ['list', 'table', 'ip', 'lb_agent'], { allowFail: true });
    t.equal(after.code, before.code, 'no lb_agent table appeared on the host');
  });

  t.test('kernel data path', async (t) => {
    // The driver logs at debug level: a failed scenario shows how each apply was written.
    const { fl, driver, client } = await commonScenarios(t, 'kernel', ['--log-level', 'debug']);
    const nft = (args: string[]) => fl.lab.exec(fl.node, 'nft', args, { allowFail: true });
    const http = { host: VIP, port: HTTP_PORT };

    await t.test('the agent turned on ip_forward and off ICMP redirects in its namespace, and says so', async (t) => {
      const st = await driver.request<{ details: Record<string, unknown> }>({ cmd: 'stats' });
      t.equal(st.details['ipForward'], 1);
      t.equal(st.details['ipForwardChangedByAgent'], true);
      t.equal((await fl.lab.sh(fl.node, 'cat /proc/sys/net/ipv4/ip_forward')).stdout.trim(), '1');
      const off = st.details['sendRedirectsDisabledOn'] as string[];
      t.ok(off.includes('all') && off.includes('eth0'), `send_redirects turned off on ${off.join(', ')}`);
      t.equal((await fl.lab.sh(fl.node, 'cat /proc/sys/net/ipv4/conf/all/send_redirects /proc/sys/net/ipv4/conf/eth0/send_redirects')).stdout.replace(/\s+/g, ''), '00', 'no redirects sent to clients');
      t.ok(typeof st.details['conntrackMax'] === 'number', `conntrack reported (max ${String(st.details['conntrackMax'])})`);
    });

    await t.test('table life cycle: adopted when it matches, rewritten when altered, removed at stop', async (t) => {
      const weights = { b1: 1, b2: 1, b3: 1 };
      await applyWeb(driver, weights, { udp: true });
      const r = await client.request<Burst>({ cmd: 'burst', ...http, n: 30, concurrency: 2 });
      t.same(r.errors, {});
      await driver.request({ cmd: 'exit' }); // a crash: no stop(), the table stays
      t.equal((await nft(['list', 'table', 'ip', 'lb_agent'])).code, 0, 'table left behind by the dead agent');

      // Restart with the same state: the table matches, so it is adopted as is (counters and all).
      let d = await startDriver(fl, 'kernel');
      t.teardown(() => d.close());
      await applyWeb(d, weights, { udp: true });
      let st = await d.request<{ details: Record<string, unknown>; flows: { connections: number; port: string }[] }>({ cmd: 'stats' });
      t.equal(st.details['startCheck'], 'matched', 'unchanged table adopted');
      t.equal(st.flows.filter((f) => f.port === 'http').reduce((s, f) => s + f.connections, 0), 30, 'its counters carry on');
      await d.request({ cmd: 'exit' });

      // Someone breaks it by hand: traffic to the VIP is dropped.
      t.equal((await nft(['insert', 'rule', 'ip', 'lb_agent', 'prerouting', 'ip', 'daddr', VIP, 'drop'])).code, 0, 'altered by hand');
      const broken = await client.request<{ result: string }>({ cmd: 'connect', ...http, timeoutMs: 1000 });
      t.equal(broken.result, 'timeout', 'the altered table drops traffic');

      // The next agent notices and rewrites it.
      d = await startDriver(fl, 'kernel');
      await applyWeb(d, weights, { udp: true });
      st = await d.request({ cmd: 'stats' });
      t.equal(st.details['startCheck'], 'rewritten', 'altered table detected');
      const listing = (await nft(['list', 'table', 'ip', 'lb_agent'])).stdout;
      t.notMatch(listing, /drop/, 'the hand-made rule is gone');
      const ok = await client.request<Burst>({ cmd: 'burst', ...http, n: 30, concurrency: 2 });
      t.same(ok.errors, {}, 'traffic flows again');
      t.same(Object.values(ok.counts).sort(), [10, 10, 10]);

      // stop() removes the table.
      await d.request({ cmd: 'stop' });
      const gone = await nft(['list', 'table', 'ip', 'lb_agent']);
      t.not(gone.code, 0, 'table removed at stop');
      t.match(gone.stderr, /No such file or directory/);
      await d.close();
    });
  });
}
