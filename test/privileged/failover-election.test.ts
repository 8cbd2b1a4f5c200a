// Privileged: VRRPv3 election between real VirtualRouter processes
// (fixtures/failover-router.ts) in three lab namespaces on one bridge, on
// real AF_PACKET sockets:
// - exactly one Master, the highest priority; SIGKILL it and the next
//   highest takes over after about Master_Down_Interval;
// - SIGTERM the Master: it resigns with priority 0 and a Backup takes over
//   after about Skew_Time;
// - the old Master comes back: with preempt it takes over again, without it
//   stays Backup.
// Measured times are logged (t.comment); only a loose upper bound (5x the
// RFC interval, plus process start-up slack) is asserted.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, type Lab } from '../../lab/netns';
import { masterDownIntervalMs, skewTimeMs } from '../../agent/failover/machine';
import { RouterProc, masters, type RouterOptions } from './fixtures/failover-client';

if (requirePrivileged(t)) {
  const INTERVAL = 0.2; // seconds: fast enough for a test, slow enough for a loaded 2-core box
  const cs = INTERVAL * 100;
  const R = [
    { role: 'r1', ip: '10.99.0.11', priority: 100 },
    { role: 'r2', ip: '10.99.0.12', priority: 150 },
    { role: 'r3', ip: '10.99.0.13', priority: 200 },
  ];

  async function lab3(t: { teardown(fn: () => unknown): void }): Promise<{ lab: Lab; ns: string[] }> {
    const lab = await createLab(t);
    const ns: string[] = [];
    for (const r of R) ns.push(await lab.addHost(r.role, { address: `${r.ip}/24` }));
    return { lab, ns };
  }

  /** Start the three routers at once (returned in R's order). */
  async function startAll(lab: Lab, ns: string[], over: Partial<RouterOptions> = {}): Promise<RouterProc[]> {
    return Promise.all(R.map((r, i) => RouterProc.start(lab, ns[i]!, r.role, { srcIp: r.ip, priority: r.priority, interval: INTERVAL, ...over })));
  }

  /** Wait until `who` is the only Master and everyone alive names it; then check it stays so for a while. */
  async function converged(t: tap.Test, routers: RouterProc[], who: RouterProc, what: string, holdMs = 1500): Promise<void> {
    const alive = routers.filter((r) => r.proc.exitCode === null && r.proc.signalCode === null);
    await who.waitEvent(`${what}: Master`, () => who.state === 'master' && masters(alive).length === 1 && alive.every((r) => r.master === who.opts.srcIp), 10_000);
    const from = alive.map((r) => r.events.length);
    await new Promise((r) => setTimeout(r, holdMs));
    t.same(masters(alive).map((r) => r.name), [who.name], `${what}: exactly one Master, ${who.name}`);
    t.ok(alive.every((r, i) => r.events.slice(from[i]).every((e) => e.event !== 'master' && e.event !== 'backup')), `${what}: no flapping for ${holdMs} ms`);
    for (const r of alive) if (r !== who) t.equal(r.master, who.opts.srcIp, `${r.name} knows the Master is ${who.opts.srcIp}`);
  }


  t.test('three routers: one Master; SIGKILL it and the next-highest takes over within about Master_Down_Interval', async (t) => {
    const { lab, ns } = await lab3(t);
    const routers = await startAll(lab, ns);
    const [r1, r2, r3] = routers as [RouterProc, RouterProc, RouterProc];
    await converged(t, routers, r3, 'start');
    t.equal(r1.state, 'backup');
    t.equal(r2.state, 'backup');
    t.ok((await r1.metric('lbagent_vrrp_adverts_received_total{vrid="51"}')) > 0, 'backups count received adverts');
    t.ok((await r3.metric('lbagent_vrrp_adverts_sent_total{vrid="51"}')) > 0, 'the Master counts sent adverts');
    t.equal(await r3.metric('lbagent_vrrp_state{vrid="51",state="master"}'), 1);
    // On the wire (seen from r1): RFC 5798 §7.3 source MAC, the group MAC, TTL 255.
    const cap = await lab.exec(ns[0]!, 'tcpdump', ['-i', 'eth0', '-e', '-n', '-vv', '-c', '1', 'ip proto 112'], { timeoutMs: 5000 });
    t.match(cap.stdout, /00:00:5e:00:01:33 > 01:00:5e:00:00:12/, 'sent from the virtual router MAC to the VRRP group MAC');
    t.match(cap.stdout, /ttl 255.*\n.*10\.99\.0\.13 > 224\.0\.0\.18: VRRPv3, Advertisement, vrid 51, prio 200, intvl 20cs/, 'tcpdump decodes our advert');

    const from1 = r1.events.length;
    const from2 = r2.events.length;
    const killedAt = Date.now();
    await r3.kill('SIGKILL');
    const became = await r2.waitEvent('master after SIGKILL', (e) => e.event === 'master', 10_000, from2);
    const took = became.t - killedAt;
    const mdi = masterDownIntervalMs(150, cs);
    t.comment(`SIGKILL failover: ${took} ms (Master_Down_Interval for priority 150 at ${INTERVAL} s: ${mdi.toFixed(1)} ms)`);
    t.ok(took <= 5 * mdi, `took ${took} ms <= 5 x Master_Down_Interval`);
    t.ok(took >= INTERVAL * 1000, 'not instant: it waited for the adverts to stop');
    await converged(t, routers.slice(0, 2), r2, 'after SIGKILL');
    t.equal(r1.events.slice(from1).filter((e) => e.event === 'master').length, 0, 'the lowest priority did not become Master');
  });

  t.test('SIGTERM the Master: priority 0, a Backup takes over after about Skew_Time', async (t) => {
    const { lab, ns } = await lab3(t);
    const routers = await startAll(lab, ns);
    const [r1, r2, r3] = routers as [RouterProc, RouterProc, RouterProc];
    await converged(t, routers, r3, 'start', 800);
    const from1 = r1.events.length;
    const from2 = r2.events.length;
    const termAt = Date.now();
    await r3.kill('SIGTERM');
    t.ok(r3.events.some((e) => e.event === 'stopped' && e.priorityZero === true), 'the Master stopped with priority 0');
    // A Backup hearing priority 0 forgets the Master at once (RFC 5798 §6.4.2).
    await r1.waitEvent('master unknown', (e) => e.event === 'master-changed' && e.master === undefined, 5000, from1);
    t.pass('the lowest Backup received the priority-0 advert');
    const became = await r2.waitEvent('master after SIGTERM', (e) => e.event === 'master', 10_000, from2);
    const took = became.t - termAt;
    const skew = skewTimeMs(150, cs);
    const mdi = masterDownIntervalMs(150, cs);
    t.comment(`SIGTERM (priority 0) failover: ${took} ms (Skew_Time ${skew.toFixed(1)} ms; Master_Down_Interval would be ${mdi.toFixed(1)} ms)`);
    t.ok(took <= 5 * mdi, `took ${took} ms, bounded`);
    await converged(t, routers.slice(0, 2), r2, 'after SIGTERM');
  });

  for (const preempt of [true, false]) {
    t.test(`the higher router comes back with preempt ${preempt ? 'on' : 'off'}`, async (t) => {
      const { lab, ns } = await lab3(t);
      // The highest first: without preemption whoever is Master first stays so.
      const r3 = await RouterProc.start(lab, ns[2]!, 'r3', { srcIp: R[2]!.ip, priority: 200, interval: INTERVAL, preempt });
      await r3.waitEvent('master', (e) => e.event === 'master');
      const [r1, r2] = await Promise.all([0, 1].map((i) => RouterProc.start(lab, ns[i]!, R[i]!.role, { srcIp: R[i]!.ip, priority: R[i]!.priority, interval: INTERVAL, preempt })));
      const routers = [r1!, r2!, r3];
      await converged(t, routers, r3, 'start', 500);
      await r3.kill('SIGKILL');
      await converged(t, routers.slice(0, 2), r2!, 'after kill', 500);
      const back = await RouterProc.start(lab, ns[2]!, 'r3-again', { srcIp: R[2]!.ip, priority: 200, interval: INTERVAL, preempt });
      t.teardown(() => back.kill('SIGKILL'));
      const all = [r1!, r2!, back];
      if (preempt) {
        const from = r2!.events.length;
        await converged(t, all, back, 'preempt on', 1500);
        t.ok(r2!.events.slice(from).some((e) => e.event === 'backup'), 'r2 yielded to the returning priority 200');
        t.equal(back.events.filter((e) => e.event === 'master').length, 1, 'r3 took over once');
      } else {
        // Give it several Master_Down_Intervals: it must stay Backup.
        await back.waitEvent('backup', (e) => e.event === 'backup');
        await new Promise((r) => setTimeout(r, 5 * masterDownIntervalMs(200, cs)));
        t.equal(back.state, 'backup', 'preempt off: the returning priority 200 stays Backup');
        t.equal(back.master, R[1]!.ip, 'and follows r2');
        t.same(masters(all).map((r) => r.name), ['r2'], 'r2 is still the one Master');
        t.equal(back.events.filter((e) => e.event === 'master').length, 0, 'r3 never became Master');
      }
    });
  }
}
