// The event history in `lb-agent status` from a real agent: VRRP Master, VIP
// gained, a backend down and up again, an applied and a rejected reload (with
// its error), a VIP lost when its service is removed - each with its time and
// reason, oldest first, in --json and in the text.
import * as fs from 'node:fs';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { startBackend } from '../../lab/services';
import { operatorLab, FAST_ARP, poolService } from './fixtures/operator-lab';
import { startAgent, waitStatus, agentCli } from '../../lab/agent';
import type { StatusDocument, StatusEvent } from '../../agent/daemon/daemon';

t.test('status events: VRRP, VIPs, backends and reloads, with time and reason', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, node, b2: first } = await operatorLab(t);
  let b2 = first;
  const svc = poolService;
  const cfg = {
    node: { interface: 'eth0' }, metrics: { listen: '' }, arp: FAST_ARP,
    pools: { 'range-global': '10.99.0.200-10.99.0.201' },
    failover: { mode: 'vrrp', advertInterval: 0.1 },
    services: [svc('web'), svc('old')],
  };
  const started = Date.now();
  const agent = await startAgent(lab, node, cfg);
  const serving = (s: StatusDocument) => s.services.every((x) => x.state === 'serving' && x.healthyBackends === 2);
  await waitStatus(agent, 'both services serving, both backends up', serving, 20_000);
  await b2.stop();
  await waitStatus(agent, 'b2 down', (s) => s.services.every((x) => x.healthyBackends === 1), 10_000);
  b2 = await startBackend(lab, lab.ns('b2'), 'b2');
  await waitStatus(agent, 'b2 up again', serving, 10_000);
  agent.writeConfig({ ...cfg, services: [svc('web')] });
  t.equal((await agentCli(lab, node, ['reload', '--socket', agent.socket])).code, 0, 'reload removing "old" applied');
  fs.writeFileSync(agent.configPath, 'services:\n  - name: broken\n');
  t.equal((await agentCli(lab, node, ['reload', '--socket', agent.socket])).code, 2, 'a broken file rejected');

  const r = await agentCli(lab, node, ['status', '--json', '--socket', agent.socket]);
  const events = (JSON.parse(r.stdout) as StatusDocument).events;
  const ends = Date.now();
  const find = (kind: StatusEvent['kind'], pred: (e: StatusEvent) => boolean = () => true, after = -1): number => events.findIndex((e, i) => i > after && e.kind === kind && pred(e));
  for (const e of events) {
    const at = Date.parse(e.at);
    t.ok(at >= started - 1000 && at <= ends + 1000 && e.reason.length > 0, `${e.kind} ${e.service ?? ''} ${e.address ?? ''}: a time within the test and a reason`);
  }
  t.same(events.map((e) => e.at), [...events.map((e) => e.at)].sort(), 'oldest first');
  const master = find('vrrp-master', (e) => e.service === 'default/web');
  const gained = find('vip-gained', (e) => e.service === 'default/web' && /^10\.99\.0\.20[01]$/.test(e.address ?? ''));
  const down = find('backend-down', (e) => e.service === 'default/web' && e.address === '10.99.0.12');
  const up = find('backend-up', (e) => e.service === 'default/web' && e.address === '10.99.0.12', down);
  const lost = find('vip-lost', (e) => e.service === 'default/old' && e.address === events[find('vip-gained', (g) => g.service === 'default/old')]?.address);
  const applied = find('reload-applied');
  const rejected = find('reload-rejected');
  t.ok(master >= 0 && gained > master, 'VRRP Master, then the VIP gained');
  t.ok(down > gained && up > down, 'b2 down, then up again');
  t.ok(lost > 0, 'the removed service\'s VIP lost, naming the address it had gained');
  t.match(events[down]?.reason, /refused|failed|timeout/i, 'backend-down says why');
  t.ok(applied > up && lost > 0 && rejected > applied, 'the applied reload (and the removed service\'s VIP lost), then the rejected one');
  t.match(events[applied]?.reason, /removed/i);
  t.match(events[rejected]?.reason, /services\[0\]/, 'the rejected reload carries its error with the field path');
  t.equal(events.filter((e) => e.kind === 'reload-applied').length, 1, 'one event per reload');

  const text = await agentCli(lab, node, ['status', '--socket', agent.socket]);
  t.match(text.stdout, /last \d+ events?:/);
  t.match(text.stdout, /reload-rejected\s+-\s+reload rejected, running config kept:; .*services\[0\]/, 'the text shows the last reload and its error on one line');
});
