// Failover with the default config (issue 14): two agents, 0.1 s adverts,
// a DHCP VIP and a pool VIP; the Master VM dies (agent SIGKILLed, its NIC
// cut). The new Master serves both VIPs without an ARP probe (the election
// decided; a DHCP takeover binds its lease at once) and the Backup was ready
// (service macvlan created, down, with its MAC): the looping client's first
// answer through each VIP comes within 0.5 s of the death.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { buildVrrpLab, waitMaster, logTime, POOL_VIP, BACKEND_IDS } from '../../lab/vrrp';
import { gapReport, ClientLoop } from '../../lab/client-loop';
import { linkNameForService } from '../../agent/net/ownership/ownership';

t.test('default config, 0.1 s adverts: the Master dies, both VIPs answer again within 0.5 s', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, nodes, client } = await buildVrrpLab(t, { dhcp: true });
  const [, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
  const o = { defaults: true, services: ['pool', 'dhcp'] as const };
  await n3.start(o);
  await waitMaster([n3], n3, 'api');
  await n3.waitService('serving both', 'web', (s) => s.state === 'serving', 30_000);
  await n2.start(o);
  await waitMaster([n2, n3], n3, 'api');
  const web = (await n3.service('web')).vip!;

  const link = linkNameForService('default/web');
  const ready = await lab.sh(n2.ns, `ip -o link show ${link}`, { allowFail: true });
  t.match(ready.stdout, new RegExp(`${link}.*state DOWN`), 'the Backup keeps the service macvlan ready, down');
  t.notMatch((await lab.sh(n2.ns, 'ip -4 -o addr show')).stdout, new RegExp(`${web.replace(/\./g, '\\.')}/|${POOL_VIP.replace(/\./g, '\\.')}/`), 'and no VIP on it');

  const loops = { api: await ClientLoop.start(lab, client, `http://${POOL_VIP}/`, { timeoutMs: 300 }), web: await ClientLoop.start(lab, client, `http://${web}/`, { timeoutMs: 300 }) };
  t.teardown(async () => { for (const l of Object.values(loops)) await l.stop(); });
  await new Promise((r) => setTimeout(r, 500));
  const at = await n3.die();
  const served = { api: await loops.api.waitServed('api served after the death', at, 10_000), web: await loops.web.waitServed('web served after the death', at, 10_000) };
  await new Promise((r) => setTimeout(r, 500));
  for (const [name, loop] of Object.entries(loops)) {
    const rep = gapReport(await loop.stop(), at, BACKEND_IDS);
    const first = served[name as 'api' | 'web'];
    const ms = first.t + first.ms - at;
    t.comment(`${name}: first answer ${ms} ms after the death; ${rep.failures.length} failed requests (${JSON.stringify(rep.errors)})`);
    t.ok(ms <= 500, `${name}: first answer through the VIP within 0.5 s of the death (${ms} ms)`);
    t.equal(rep.wrongBodies.length, 0, `${name}: every answer from a backend`);
  }
  t.comment(n2.logs().filter((l) => logTime(l) >= at && l.op !== 'recv' && l.module !== 'health').map((l) => `${logTime(l) - at} ${String(l.module)} ${String(l.op)} ${String(l.msg)}`).slice(0, 40).join('\n'));
  t.notOk(n2.logs().some((l) => l.op === 'probe' && typeof l.msg === 'string' && /probing|ARP probe sent/.test(l.msg)), 'no ARP probe on takeover');
});
