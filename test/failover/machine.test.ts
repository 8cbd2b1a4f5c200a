// Unit tests of the pure RFC 5798 §6.4 state machine: every transition,
// the timer formulas of §6.1 down to 0.01 s, preemption and its delay,
// priority 0 and 255, split brain both ways, and a simulated LAN of routers.
import t from 'tap';
import {
  createMachine,
  MAX_PEERS,
  masterDownIntervalMs,
  skewTimeMs,
  step,
  type Action,
  type Machine,
  type MachineConfig,
  type MachineEvent,
} from '../../agent/failover/machine';
import { parseIPv4 } from '../../agent/address';

const ip = (s: string): number => parseIPv4(s)!;
const ME = ip('10.99.0.10');
const LOWER_IP = ip('10.99.0.5');
const HIGHER_IP = ip('10.99.0.20');

function cfg(over: Partial<MachineConfig> = {}): MachineConfig {
  return { priority: 100, advertIntervalCs: 100, preempt: true, preemptDelayMs: 0, primaryIp: ME, ...over };
}

const kinds = (actions: readonly Action[]): string[] => actions.map((a) => a.kind);
const find = <K extends Action['kind']>(actions: readonly Action[], kind: K): Extract<Action, { kind: K }> | undefined =>
  actions.find((a) => a.kind === kind) as Extract<Action, { kind: K }> | undefined;
const advert = (srcIp: number, priority: number, maxAdverIntCs = 100): MachineEvent => ({ kind: 'advert', srcIp, priority, maxAdverIntCs });

function backupAt(now: number, over: Partial<MachineConfig> = {}): Machine {
  return step(createMachine(cfg(over)), { kind: 'startup' }, now).machine;
}
function masterAt(now: number, over: Partial<MachineConfig> = {}): Machine {
  const b = backupAt(now, over);
  return step(b, { kind: 'timer' }, b.timerAt!).machine;
}

t.test('§6.1 formulas', async (t) => {
  t.equal(skewTimeMs(100, 100), 609.375, 'Skew_Time = (256 - 100) * 1 s / 256');
  t.equal(masterDownIntervalMs(100, 100), 3609.375, 'Master_Down_Interval = 3 s + Skew_Time');
  t.equal(skewTimeMs(255, 100), 1000 / 256);
  t.equal(skewTimeMs(1, 100), 255 * 1000 / 256);
  t.equal(masterDownIntervalMs(254, 1), 30 + 20 / 256, '0.01 s interval, priority 254');
  t.equal(masterDownIntervalMs(1, 4095), 3 * 40950 + (255 * 40950) / 256, 'the longest interval');
  t.ok(masterDownIntervalMs(200, 100) < masterDownIntervalMs(100, 100), 'a higher priority waits less');
});

t.test('Initialize', async (t) => {
  t.test('startup: Backup with Master_Down_Timer (§6.4.1)', async (t) => {
    const m0 = createMachine(cfg());
    t.equal(m0.state, 'initialize');
    const { machine, actions } = step(m0, { kind: 'startup' }, 1000);
    t.equal(machine.state, 'backup');
    t.equal(machine.masterAdverIntervalCs, 100, 'Master_Adver_Interval = Advertisement_Interval');
    t.equal(machine.timerAt, 1000 + 3609.375);
    t.same(kinds(actions), ['becomeBackup', 'setTimer'], 'no advert from a Backup');
    t.same(find(actions, 'becomeBackup'), { kind: 'becomeBackup', reason: 'startup', master: undefined });
  });
  t.test('startup of the owner (priority 255): Master at once', async (t) => {
    const { machine, actions } = step(createMachine(cfg({ priority: 255 })), { kind: 'startup' }, 1000);
    t.equal(machine.state, 'master');
    t.same(kinds(actions), ['sendAdvert', 'becomeMaster', 'setTimer', 'masterChanged']);
    t.same(find(actions, 'sendAdvert'), { kind: 'sendAdvert', priority: 255 });
    t.same(find(actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'owner' });
    t.equal(machine.timerAt, 2000, 'Adver_Timer = Advertisement_Interval');
    t.equal(machine.master, ME);
  });
  t.test('everything else is ignored before startup', async (t) => {
    const m0 = createMachine(cfg());
    for (const ev of [{ kind: 'shutdown' } as const, { kind: 'timer' } as const, advert(HIGHER_IP, 200), advert(LOWER_IP, 0)]) {
      const r = step(m0, ev, 5000);
      t.equal(r.machine, m0, ev.kind);
      t.same(r.actions, []);
    }
  });
  t.test('a second startup changes nothing', async (t) => {
    const b = backupAt(0);
    t.equal(step(b, { kind: 'startup' }, 10).machine, b);
  });
});

t.test('Backup', async (t) => {
  t.test('Master_Down_Timer fires: Master (§6.4.2)', async (t) => {
    const b = backupAt(0);
    t.same(step(b, { kind: 'timer' }, b.timerAt! - 0.5).actions, [], 'not yet: an early timer is ignored');
    const { machine, actions } = step(b, { kind: 'timer' }, b.timerAt!);
    t.equal(machine.state, 'master');
    t.same(kinds(actions), ['sendAdvert', 'becomeMaster', 'setTimer', 'masterChanged']);
    t.same(find(actions, 'sendAdvert'), { kind: 'sendAdvert', priority: 100 });
    t.same(find(actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'master-down' });
    t.same(find(actions, 'setTimer'), { kind: 'setTimer', at: b.timerAt! + 1000 });
    t.same(find(actions, 'masterChanged'), { kind: 'masterChanged', master: ME });
  });

  t.test('advert from a higher priority: learn its interval, reset the timer', async (t) => {
    const b = backupAt(0);
    const { machine, actions } = step(b, advert(HIGHER_IP, 200, 50), 500);
    t.equal(machine.state, 'backup');
    t.equal(machine.masterAdverIntervalCs, 50, 'Master_Adver_Interval learnt (§6.4.2)');
    t.equal(machine.timerAt, 500 + masterDownIntervalMs(100, 50));
    t.equal(machine.master, HIGHER_IP);
    t.equal(machine.masterPriority, 200);
    t.same(kinds(actions), ['setTimer', 'masterChanged']);
    const again = step(machine, advert(HIGHER_IP, 200, 50), 1000);
    t.same(kinds(again.actions), ['setTimer'], 'the same master again: no masterChanged');
  });

  t.test('advert with the same priority: accepted even with preempt', async (t) => {
    const { machine } = step(backupAt(0), advert(LOWER_IP, 100), 500);
    t.equal(machine.timerAt, 500 + 3609.375);
    t.equal(machine.master, LOWER_IP);
  });

  t.test('advert from a lower priority, preempt off: accepted, we stay Backup', async (t) => {
    let m = backupAt(0, { preempt: false });
    for (let now = 500; now < 20_000; now += 1000) {
      const r = step(m, advert(LOWER_IP, 50), now);
      m = r.machine;
      t.equal(m.timerAt, now + 3609.375);
    }
    t.equal(m.state, 'backup');
    t.equal(m.master, LOWER_IP);
  });

  t.test('advert from a lower priority, preempt on: discarded, the timer runs out, Master', async (t) => {
    const b = backupAt(0);
    const r = step(b, advert(LOWER_IP, 50), 500);
    t.equal(r.machine.timerAt, b.timerAt, 'Master_Down_Timer not reset');
    t.same(kinds(r.actions), ['masterChanged'], 'only learnt who is Master now');
    const r2 = step(r.machine, advert(LOWER_IP, 50), 1500);
    t.same(r2.actions, []);
    const fire = step(r2.machine, { kind: 'timer' }, b.timerAt!);
    t.equal(fire.machine.state, 'master');
    t.same(find(fire.actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'preempt' });
  });

  t.test('the owner (255) preempts even with preempt off (§6.1 note)', async (t) => {
    const b = step(createMachine(cfg({ priority: 255, preempt: false })), { kind: 'startup' }, 0).machine;
    // It starts Master; make it Backup by a higher-IP owner first.
    const yielded = step(b, advert(HIGHER_IP, 255), 100).machine;
    t.equal(yielded.state, 'backup', 'equal priority, higher IP wins');
    const r = step(yielded, advert(LOWER_IP, 200), 200);
    t.equal(r.machine.timerAt, yielded.timerAt, 'lower advert discarded: it will preempt');
  });

  t.test('priority 0 from the Master: take over after Skew_Time only (§6.4.2)', async (t) => {
    let m = step(backupAt(0), advert(HIGHER_IP, 200, 100), 500).machine;
    const r = step(m, advert(HIGHER_IP, 0, 100), 1000);
    m = r.machine;
    t.equal(m.timerAt, 1000 + 609.375, 'Skew_Time');
    t.equal(m.master, undefined, 'no Master now');
    t.same(kinds(r.actions), ['setTimer', 'masterChanged']);
    const fire = step(m, { kind: 'timer' }, m.timerAt!);
    t.equal(fire.machine.state, 'master');
    t.same(find(fire.actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'master-resigned' });
  });

  t.test('priority 0 uses the learnt interval for Skew_Time', async (t) => {
    let m = step(backupAt(0, { priority: 200 }), advert(HIGHER_IP, 250, 1), 100).machine;
    m = step(m, advert(HIGHER_IP, 0, 1), 110).machine;
    t.equal(m.timerAt, 110 + (56 * 10) / 256);
  });

  t.test('shutdown: Initialize, timer cancelled, nothing sent', async (t) => {
    const r = step(backupAt(0), { kind: 'shutdown' }, 100);
    t.equal(r.machine.state, 'initialize');
    t.equal(r.machine.timerAt, undefined);
    t.same(kinds(r.actions), ['clearTimer', 'becomeInitialize']);
  });

  t.test('after shutdown a stale timer does nothing', async (t) => {
    const b = backupAt(0);
    const down = step(b, { kind: 'shutdown' }, 100).machine;
    t.same(step(down, { kind: 'timer' }, b.timerAt! + 1).actions, []);
  });
});

t.test('preemptDelay', async (t) => {
  t.test('tolerates a lower Master for the delay, then takes over', async (t) => {
    let m = backupAt(0, { preemptDelayMs: 10_000 });
    const first = 1000;
    let now = first;
    for (; now < first + 10_000; now += 1000) {
      const r = step(m, advert(LOWER_IP, 50), now);
      m = r.machine;
      t.equal(m.state, 'backup');
      t.ok(m.timerAt! <= first + 10_000, 'timer never beyond the deadline');
    }
    t.equal(m.timerAt, first + 10_000, 'the timer is the deadline');
    const fire = step(m, { kind: 'timer' }, m.timerAt!);
    t.equal(fire.machine.state, 'master');
    t.same(find(fire.actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'preempt' });
  });
  t.test('an advert after the deadline is discarded', async (t) => {
    let m = backupAt(0, { preemptDelayMs: 2000 });
    m = step(m, advert(LOWER_IP, 50), 1000).machine;
    const timer = m.timerAt;
    t.equal(timer, 3000);
    const late = step(m, advert(LOWER_IP, 50), 3000);
    t.equal(late.machine.timerAt, timer, 'not pushed back');
    t.same(late.actions, []);
  });
  t.test('a higher Master in between restarts the delay', async (t) => {
    let m = backupAt(0, { preemptDelayMs: 5000 });
    m = step(m, advert(LOWER_IP, 50), 1000).machine;
    t.equal(m.lowerSince, 1000);
    m = step(m, advert(HIGHER_IP, 150), 2000).machine;
    t.equal(m.lowerSince, undefined);
    m = step(m, advert(LOWER_IP, 50), 3000).machine;
    t.equal(m.lowerSince, 3000, 'counted from the new lower Master');
    for (let now = 4000; now < 8000; now += 1000) m = step(m, advert(LOWER_IP, 50), now).machine;
    t.equal(m.timerAt, 8000, 'deadline = 3000 + 5000');
  });
  t.test('with preempt off the delay does not matter', async (t) => {
    let m = backupAt(0, { preempt: false, preemptDelayMs: 1000 });
    for (let now = 500; now < 10_000; now += 500) m = step(m, advert(LOWER_IP, 50), now).machine;
    t.equal(m.timerAt, 9500 + 3609.375);
    t.equal(m.lowerSince, undefined);
  });
});

t.test('Master', async (t) => {
  t.test('Adver_Timer fires: advertise and re-arm (§6.4.3)', async (t) => {
    const m = masterAt(0);
    const r = step(m, { kind: 'timer' }, m.timerAt!);
    t.equal(r.machine.state, 'master');
    t.same(r.actions, [{ kind: 'sendAdvert', priority: 100 }, { kind: 'setTimer', at: m.timerAt! + 1000 }]);
    t.same(step(m, { kind: 'timer' }, m.timerAt! - 1).actions, [], 'early: nothing');
  });

  t.test('advert with higher priority: yield at once, split brain resolved', async (t) => {
    const m = masterAt(0);
    const r = step(m, advert(HIGHER_IP, 150, 20), 5000);
    t.equal(r.machine.state, 'backup');
    t.equal(r.machine.masterAdverIntervalCs, 20);
    t.equal(r.machine.timerAt, 5000 + masterDownIntervalMs(100, 20));
    t.equal(r.machine.master, HIGHER_IP);
    t.same(kinds(r.actions), ['splitBrain', 'clearTimer', 'becomeBackup', 'setTimer', 'masterChanged']);
    t.same(find(r.actions, 'splitBrain'), { kind: 'splitBrain', peer: HIGHER_IP, peerPriority: 150, resolution: 'yielded' });
    t.same(find(r.actions, 'becomeBackup'), { kind: 'becomeBackup', reason: 'higher-priority', master: HIGHER_IP });
    t.notOk(find(r.actions, 'sendAdvert'), 'no advert on yielding');
  });

  t.test('equal priority: the higher primary address wins (§6.4.3)', async (t) => {
    const m = masterAt(0);
    const hi = step(m, advert(HIGHER_IP, 100), 5000);
    t.equal(hi.machine.state, 'backup', 'higher IP: yield');
    const lo = step(m, advert(LOWER_IP, 100), 5000);
    t.equal(lo.machine.state, 'master', 'lower IP: keep');
    t.same(lo.actions, [{ kind: 'splitBrain', peer: LOWER_IP, peerPriority: 100, resolution: 'kept' }]);
    // Compared as unsigned: 192.168.x.x beats 10.x.x.x.
    const big = step(m, advert(ip('192.168.0.1'), 100), 5000);
    t.equal(big.machine.state, 'backup', 'addresses compare unsigned');
  });

  t.test('advert with lower priority: split brain, keep Master, nothing else', async (t) => {
    const m = masterAt(0);
    const r = step(m, advert(LOWER_IP, 50), 5000);
    t.same({ ...r.machine, peers: undefined }, { ...m, peers: undefined }, 'machine unchanged');
    t.equal(r.machine.peers.get(LOWER_IP), 50, 'but for the router remembered');
    t.same(r.actions, [{ kind: 'splitBrain', peer: LOWER_IP, peerPriority: 50, resolution: 'kept' }]);
  });

  t.test('priority 0 from another router: advertise at once, reset Adver_Timer', async (t) => {
    const m = masterAt(0);
    const r = step(m, advert(LOWER_IP, 0), 5000);
    t.equal(r.machine.state, 'master');
    t.same(r.actions, [{ kind: 'sendAdvert', priority: 100 }, { kind: 'setTimer', at: 6000 }]);
  });

  t.test('shutdown: priority 0, then Initialize', async (t) => {
    const r = step(masterAt(0), { kind: 'shutdown' }, 9000);
    t.equal(r.machine.state, 'initialize');
    t.same(r.actions, [{ kind: 'clearTimer' }, { kind: 'sendAdvert', priority: 0 }, { kind: 'becomeInitialize' }, { kind: 'masterChanged', master: undefined }]);
    const silent = step(masterAt(0), { kind: 'shutdown', priorityZero: false }, 9000);
    t.notOk(find(silent.actions, 'sendAdvert'), 'priorityZero false: silent');
  });
});

t.test('our own advert (same source address) is ignored in every state', async (t) => {
  for (const m of [backupAt(0), masterAt(0)]) {
    const r = step(m, advert(ME, 200), 100);
    t.equal(r.machine, m, m.state);
    t.same(r.actions, []);
  }
});

t.test('an advert with interval 0 is treated as 1 cs (never a zero timer)', async (t) => {
  const r = step(backupAt(0), advert(HIGHER_IP, 200, 0), 100);
  t.equal(r.machine.masterAdverIntervalCs, 1);
  t.ok(r.machine.timerAt! > 100);
});

/**
 * A simulated LAN: routers as pure machines, adverts delivered to every
 * other router after `latency` ms, time advanced event by event.
 */
function simulate(configs: MachineConfig[], opts: {
  until: number; latency?: number; kill?: { at: number; who: number; priorityZero?: boolean }[]; revive?: { at: number; who: number }[];
  priority?: { at: number; who: number; priority: number }[];
}) {
  const latency = opts.latency ?? 0.1;
  const ms = configs.map((c) => createMachine(c));
  const alive = configs.map(() => true);
  const queue: { at: number; seq: number; run: () => void }[] = [];
  let seq = 0;
  const log: { at: number; who: number; kind: string }[] = [];
  const schedule = (at: number, run: () => void): void => { queue.push({ at, seq: seq++, run }); };
  const apply = (i: number, ev: MachineEvent, now: number): void => {
    if (!alive[i] && ev.kind !== 'startup' && ev.kind !== 'shutdown') return;
    const r = step(ms[i]!, ev, now);
    ms[i] = r.machine;
    for (const a of r.actions) {
      if (a.kind === 'sendAdvert') {
        for (let j = 0; j < ms.length; j++) {
          if (j !== i) schedule(now + latency, () => apply(j, { kind: 'advert', srcIp: configs[i]!.primaryIp, priority: a.priority, maxAdverIntCs: configs[i]!.advertIntervalCs }, now + latency));
        }
      } else if (a.kind === 'setTimer') {
        const at = a.at;
        schedule(at, () => { if (ms[i]!.timerAt === at) apply(i, { kind: 'timer' }, at); });
      } else if (a.kind === 'splitBrain') {
        log.push({ at: now, who: i, kind: `splitBrain:${a.resolution}` });
      } else if (a.kind === 'becomeMaster' || a.kind === 'becomeBackup' || a.kind === 'becomeInitialize' || a.kind === 'becomeFault') {
        log.push({ at: now, who: i, kind: a.kind });
      }
    }
  };
  configs.forEach((_, i) => schedule(i * 7, () => apply(i, { kind: 'startup' }, i * 7)));
  for (const k of opts.kill ?? []) {
    schedule(k.at, () => {
      if (k.priorityZero) apply(k.who, { kind: 'shutdown' }, k.at);
      alive[k.who] = false;
      ms[k.who] = createMachine(configs[k.who]!); // a dead router forgets everything
    });
  }
  for (const r of opts.revive ?? []) schedule(r.at, () => { alive[r.who] = true; apply(r.who, { kind: 'startup' }, r.at); });
  for (const p of opts.priority ?? []) schedule(p.at, () => apply(p.who, { kind: 'priority', priority: p.priority }, p.at));
  let steps = 0;
  while (queue.length && steps++ < 1_000_000) {
    queue.sort((a, b) => a.at - b.at || a.seq - b.seq);
    const e = queue.shift()!;
    if (e.at > opts.until) break;
    e.run();
  }
  return { machines: ms, alive, log };
}

const router = (i: number, priority: number, over: Partial<MachineConfig> = {}): MachineConfig =>
  cfg({ priority, primaryIp: ip(`10.99.0.${10 + i}`), ...over });

t.test('simulated LAN: exactly one Master, the highest priority', async (t) => {
  for (const cs of [100, 10, 1]) {
    const { machines } = simulate([router(0, 100, { advertIntervalCs: cs }), router(1, 200, { advertIntervalCs: cs }), router(2, 150, { advertIntervalCs: cs })], { until: cs * 10 * 20 });
    t.same(machines.map((m) => m.state), ['backup', 'master', 'backup'], `interval ${cs / 100} s`);
    t.same(machines.map((m) => m.master), [ip('10.99.0.11'), ip('10.99.0.11'), ip('10.99.0.11')], 'everyone knows the Master');
  }
});

t.test('simulated LAN at 0.01 s: the Master dies, the next-highest takes over within Master_Down_Interval', async (t) => {
  const cs = 1;
  const configs = [router(0, 100, { advertIntervalCs: cs }), router(1, 200, { advertIntervalCs: cs }), router(2, 150, { advertIntervalCs: cs })];
  const { machines, log } = simulate(configs, { until: 1000, kill: [{ at: 500, who: 1 }] });
  t.equal(machines[2]!.state, 'master');
  t.equal(machines[0]!.state, 'backup');
  const takeover = log.find((l) => l.who === 2 && l.kind === 'becomeMaster' && l.at > 500)!;
  const mdi = masterDownIntervalMs(150, cs);
  t.ok(takeover.at - 500 <= mdi + 10 + 1, `took ${(takeover.at - 500).toFixed(3)} ms, Master_Down_Interval ${mdi.toFixed(3)} ms (+ one advert interval)`);
  t.ok(takeover.at - 500 >= mdi - 10, 'not before the interval');
});

t.test('simulated LAN: a resigning Master (priority 0) is replaced after Skew_Time', async (t) => {
  const configs = [router(0, 100), router(1, 200), router(2, 150)];
  const { machines, log } = simulate(configs, { until: 30_000, kill: [{ at: 20_000, who: 1, priorityZero: true }] });
  t.equal(machines[2]!.state, 'master');
  const takeover = log.find((l) => l.who === 2 && l.kind === 'becomeMaster' && l.at > 20_000)!;
  t.ok(takeover.at - 20_000 < skewTimeMs(150, 100) + 1, `took ${(takeover.at - 20_000).toFixed(1)} ms, Skew_Time ${skewTimeMs(150, 100).toFixed(1)} ms`);
  t.equal(log.filter((l) => l.who === 0 && l.kind === 'becomeMaster').length, 0, 'the lower Backup never became Master (its skew is longer)');
});

t.test('simulated LAN: the higher router comes back, preempt on vs off', async (t) => {
  for (const preempt of [true, false]) {
    const configs = [router(0, 100, { preempt }), router(1, 200, { preempt }), router(2, 150, { preempt })];
    const { machines } = simulate(configs, { until: 40_000, kill: [{ at: 10_000, who: 1 }], revive: [{ at: 20_000, who: 1 }] });
    if (preempt) t.same(machines.map((m) => m.state), ['backup', 'master', 'backup'], 'preempt: 200 is Master again');
    else t.same(machines.map((m) => m.state), ['backup', 'backup', 'master'], 'no preempt: 150 stays Master');
  }
});

t.test('simulated LAN: a split brain heals, the lower Master yields', async (t) => {
  // Two routers of equal priority start 7 ms apart on a LAN with 50 ms of
  // latency: both time out before hearing the other, so both are Master
  // until the adverts cross; the lower address yields, the higher keeps it.
  const configs = [router(0, 100), router(1, 100)];
  const { machines, log } = simulate(configs, { until: 20_000, latency: 50 });
  t.same(machines.map((m) => m.state), ['backup', 'master'], 'equal priority: the higher address is Master');
  t.same(log.filter((l) => l.kind.startsWith('split')).map((l) => [l.who, l.kind]), [[1, 'splitBrain:kept'], [0, 'splitBrain:yielded']]);
  t.equal(log.filter((l) => l.kind === 'becomeMaster').length, 2, 'both were Master for a moment');
});

t.test('priority event (tracking)', async (t) => {
  t.test('ignored in Initialize', async (t) => {
    const m = createMachine(cfg());
    t.equal(step(m, { kind: 'priority', priority: 50 }, 0).machine, m);
  });
  t.test('Master: the new priority is advertised at once, the Adver_Timer restarts', async (t) => {
    const m = masterAt(0);
    const { machine, actions } = step(m, { kind: 'priority', priority: 40 }, 5000);
    t.equal(machine.state, 'master');
    t.equal(machine.config.priority, 40);
    t.same(actions, [{ kind: 'sendAdvert', priority: 40 }, { kind: 'setTimer', at: 6000 }]);
    t.same(step(machine, { kind: 'priority', priority: 40 }, 5001).actions, [], 'the same priority again: nothing');
  });
  t.test('Backup: kept for the next advert, no action', async (t) => {
    const b = backupAt(0);
    const { machine, actions } = step(b, { kind: 'priority', priority: 150 }, 10);
    t.equal(machine.config.priority, 150);
    t.equal(machine.state, 'backup');
    t.same(actions, []);
  });
  t.test('0 as Master: resign with priority 0, fault, no timer; adverts and timers ignored', async (t) => {
    const m = masterAt(0);
    const { machine, actions } = step(m, { kind: 'priority', priority: 0 }, 5000);
    t.equal(machine.state, 'fault');
    t.same(kinds(actions), ['clearTimer', 'sendAdvert', 'becomeFault', 'masterChanged'], 'and it no longer knows a Master');
    t.same(find(actions, 'sendAdvert'), { kind: 'sendAdvert', priority: 0 }, 'RFC 5798 §6.4.3 resignation');
    t.equal(machine.timerAt, undefined);
    t.equal(machine.master, undefined);
    t.same(step(machine, advert(HIGHER_IP, 200), 5100).actions, [], 'an advert is ignored in fault');
    t.same(step(machine, { kind: 'timer' }, 99_999).actions, [], 'no timer runs');
    t.same(step(machine, { kind: 'priority', priority: 0 }, 6000).actions, [], 'still fault: nothing');
    const back = step(machine, { kind: 'priority', priority: 100 }, 7000);
    t.equal(back.machine.state, 'backup', 'out of fault: Backup, as at startup');
    t.same(find(back.actions, 'becomeBackup'), { kind: 'becomeBackup', reason: 'fault-cleared', master: undefined });
    t.equal(back.machine.timerAt, 7000 + masterDownIntervalMs(100, 100));
    t.equal(step(back.machine, { kind: 'timer' }, back.machine.timerAt!).machine.state, 'master', 'alone: Master after Master_Down_Interval');
  });
  t.test('0 as Backup: fault without an advert', async (t) => {
    const { machine, actions } = step(backupAt(0), { kind: 'priority', priority: 0 }, 10);
    t.equal(machine.state, 'fault');
    t.same(kinds(actions), ['clearTimer', 'becomeFault']);
  });
  t.test('shutdown from fault: Initialize, no advert', async (t) => {
    const f = step(backupAt(0), { kind: 'priority', priority: 0 }, 10).machine;
    const { machine, actions } = step(f, { kind: 'shutdown' }, 20);
    t.equal(machine.state, 'initialize');
    t.same(kinds(actions), ['clearTimer', 'becomeInitialize']);
  });
  t.test('preempt off: a followed Master whose priority falls below ours is taken over from', async (t) => {
    let b = backupAt(0, { preempt: false, priority: 150 });
    b = step(b, advert(HIGHER_IP, 200), 100).machine;
    t.equal(b.masterPriority, 200);
    const drop = step(b, advert(HIGHER_IP, 140), 1100);
    t.same(drop.actions, [], 'its advert is discarded (Master_Down_Timer runs on)');
    t.ok(drop.machine.lowerSince !== undefined);
    const again = step(drop.machine, advert(HIGHER_IP, 140), 2100);
    t.same(again.actions, [], 'and so is the next one at the same priority');
    const took = step(again.machine, { kind: 'timer' }, again.machine.timerAt!);
    t.equal(took.machine.state, 'master');
    t.same(find(took.actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'preempt' });
  });
  t.test('preempt off: a lower Master that was there first is kept (RFC 5798 §6.4.2)', async (t) => {
    let b = backupAt(0, { preempt: false, priority: 150 });
    b = step(b, advert(HIGHER_IP, 100), 100).machine;
    const next = step(b, advert(HIGHER_IP, 100), 1100);
    t.same(kinds(next.actions), ['setTimer'], 'accepted: the timer is reset');
    t.equal(next.machine.lowerSince, undefined);
  });
  t.test('preempt off: a followed Master whose priority falls, but not below ours, is kept', async (t) => {
    let b = backupAt(0, { preempt: false, priority: 100 });
    b = step(b, advert(HIGHER_IP, 200), 100).machine;
    t.same(kinds(step(b, advert(HIGHER_IP, 120), 1100).actions), ['setTimer']);
  });
  t.test('preempt off: the Master recovers before the takeover: kept', async (t) => {
    let b = backupAt(0, { preempt: false, priority: 150 });
    b = step(b, advert(HIGHER_IP, 200), 100).machine;
    b = step(b, advert(HIGHER_IP, 140), 1100).machine;
    const rec = step(b, advert(HIGHER_IP, 200), 2100);
    t.same(kinds(rec.actions), ['setTimer']);
    t.equal(rec.machine.lowerSince, undefined);
  });
});

t.test('simulated LAN: the Master\'s priority drops below a Backup\'s and comes back', async (t) => {
  for (const preempt of [true, false]) {
    const configs = [router(0, 100, { preempt }), router(1, 200, { preempt }), router(2, 150, { preempt })];
    const { machines, log } = simulate(configs, {
      until: 40_000,
      priority: [{ at: 10_000, who: 1, priority: 140 }, { at: 20_000, who: 1, priority: 200 }],
    });
    const took = log.find((l) => l.who === 2 && l.kind === 'becomeMaster' && l.at > 10_000 && l.at < 20_000);
    t.ok(took, `preempt ${preempt}: 150 took over from the lowered Master`);
    t.ok(took && took.at - 10_000 <= masterDownIntervalMs(150, 100) + 1000 + 1, `within Master_Down_Interval of its next advert (${took ? took.at - 10_000 : '?'} ms)`);
    t.equal(log.filter((l) => l.who === 0 && l.kind === 'becomeMaster').length, 0, '100 never became Master');
    if (preempt) t.same(machines.map((m) => m.state), ['backup', 'master', 'backup'], 'preempt on: 200 takes it back when its priority returns');
    else t.same(machines.map((m) => m.state), ['backup', 'backup', 'master'], 'preempt off: 150 keeps it');
  }
});

t.test('simulated LAN: every router drops below nobody: no move', async (t) => {
  const configs = [router(1, 200), router(2, 150)];
  const { log } = simulate(configs, { until: 30_000, priority: [{ at: 10_000, who: 0, priority: 160 }, { at: 10_000, who: 1, priority: 90 }] });
  t.equal(log.filter((l) => l.kind === 'becomeMaster' && l.at > 10_000).length, 0, '160 still outranks 90');
});

t.test('simulated LAN: fault hands over after Skew_Time; the end of it preempts back (preempt on)', async (t) => {
  const configs = [router(1, 200), router(2, 150)];
  const { machines, log } = simulate(configs, { until: 40_000, priority: [{ at: 10_000, who: 0, priority: 0 }, { at: 20_000, who: 0, priority: 200 }] });
  const took = log.find((l) => l.who === 1 && l.kind === 'becomeMaster' && l.at > 10_000)!;
  t.ok(took.at - 10_000 < skewTimeMs(150, 100) + 1, `after Skew_Time (${(took.at - 10_000).toFixed(1)} ms)`);
  t.ok(log.some((l) => l.who === 0 && l.kind === 'becomeFault'));
  t.same(machines.map((m) => m.state), ['master', 'backup']);
});

t.test('stepping down (stepDownMs): a lowered Master that a heard router outranks', async (t) => {
  const heardAt150 = (): Machine => {
    // Master, having heard HIGHER_IP at 150 (it was Master before us).
    let b = backupAt(0, { priority: 200, stepDownMs: 200 });
    b = step(b, advert(HIGHER_IP, 150), 100).machine;
    return step(b, { kind: 'timer' }, b.timerAt!).machine;
  };
  t.test('goes Backup at once, nothing sent; resigns with priority 0 stepDownMs later', async (t) => {
    const m = heardAt150();
    t.equal(m.state, 'master');
    t.equal(m.peers.get(HIGHER_IP), 150, 'the heard router is remembered');
    const down = step(m, { kind: 'priority', priority: 140 }, 5000);
    t.equal(down.machine.state, 'backup');
    t.same(kinds(down.actions), ['clearTimer', 'becomeBackup', 'setTimer', 'masterChanged'], 'no advert yet: the VIPs are withdrawn first');
    t.same(find(down.actions, 'becomeBackup'), { kind: 'becomeBackup', reason: 'stepped-down', master: undefined });
    t.equal(down.machine.timerAt, 5200);
    t.same(step(down.machine, { kind: 'timer' }, 5199).actions, [], 'not before its time');
    const resign = step(down.machine, { kind: 'timer' }, 5200);
    t.same(resign.actions, [{ kind: 'sendAdvert', priority: 0 }, { kind: 'setTimer', at: 5200 + masterDownIntervalMs(140, 100) }], 'RFC 5798 §6.4.3 resignation, then a Backup');
    t.equal(resign.machine.state, 'backup');
    t.notOk(resign.machine.resigning);
    const alone = step(resign.machine, { kind: 'timer' }, resign.machine.timerAt!);
    t.same(find(alone.actions, 'becomeMaster'), { kind: 'becomeMaster', reason: 'master-down' }, 'nobody took over: Master again after Master_Down_Interval');
  });
  t.test('the other router speaks first: no resignation', async (t) => {
    const down = step(heardAt150(), { kind: 'priority', priority: 140 }, 5000).machine;
    const heard = step(down, advert(HIGHER_IP, 150), 5050);
    t.equal(heard.machine.master, HIGHER_IP);
    t.notOk(heard.machine.resigning);
    t.notOk(step(heard.machine, { kind: 'timer' }, heard.machine.timerAt!).actions.some((a) => a.kind === 'sendAdvert' && a.priority === 0), 'its timer is a Master_Down_Timer again');
  });
  t.test('shutdown or fault while stepping down still resigns', async (t) => {
    const down = step(heardAt150(), { kind: 'priority', priority: 140 }, 5000).machine;
    t.same(kinds(step(down, { kind: 'shutdown' }, 5010).actions), ['clearTimer', 'sendAdvert', 'becomeInitialize']);
    t.same(kinds(step(down, { kind: 'priority', priority: 0 }, 5010).actions), ['clearTimer', 'sendAdvert', 'becomeFault']);
  });
  t.test('no step-down: lowered but still above every heard router, unknown routers, a resigned router, or stepDownMs unset', async (t) => {
    const still = step(heardAt150(), { kind: 'priority', priority: 160 }, 5000);
    t.same(kinds(still.actions), ['sendAdvert', 'setTimer'], '160 > 150: the lowered priority is advertised');
    const none = masterAt(0, { priority: 200, stepDownMs: 200 });
    t.same(kinds(step(none, { kind: 'priority', priority: 140 }, 5000).actions), ['sendAdvert', 'setTimer'], 'nobody heard');
    let gone = heardAt150();
    gone = step(gone, advert(HIGHER_IP, 0), 4000).machine;
    t.equal(gone.peers.size, 0, 'priority 0 forgets its sender');
    t.same(kinds(step(gone, { kind: 'priority', priority: 140 }, 5000).actions), ['sendAdvert', 'setTimer']);
    let off = backupAt(0, { priority: 200 });
    off = step(off, advert(HIGHER_IP, 150), 100).machine;
    off = step(off, { kind: 'timer' }, off.timerAt!).machine;
    t.same(kinds(step(off, { kind: 'priority', priority: 140 }, 5000).actions), ['sendAdvert', 'setTimer'], 'stepDownMs unset');
  });
  t.test('the routers remembered are bounded', async (t) => {
    let m = masterAt(0, { stepDownMs: 200 });
    for (let i = 0; i < MAX_PEERS + 10; i++) m = step(m, advert(ip(`10.99.1.${i + 1}`), 50), 10 + i).machine;
    t.equal(m.peers.size, MAX_PEERS);
    t.notOk(m.peers.has(ip('10.99.1.1')), 'the least recently heard went first');
  });
});

t.test('simulated LAN: a lowered Master steps down; the heard Backup takes over after Skew_Time of its resignation', async (t) => {
  // 150 starts first and is Master until 200 preempts it: 200 has heard 150.
  const configs = [router(1, 150, { stepDownMs: 200 }), router(2, 200, { stepDownMs: 200 })];
  const { machines, log } = simulate(configs, {
    until: 30_000, kill: [{ at: 8, who: 1 }], revive: [{ at: 5_000, who: 1 }], priority: [{ at: 10_000, who: 1, priority: 140 }],
  });
  t.equal(log.filter((l) => l.who === 1 && l.kind === 'becomeMaster' && l.at < 10_000).length, 1, '200 preempted 150 once');
  const down = log.find((l) => l.who === 1 && l.kind === 'becomeBackup' && l.at >= 10_000)!;
  const took = log.find((l) => l.who === 0 && l.kind === 'becomeMaster' && l.at >= 10_000)!;
  t.equal(down.at, 10_000, 'the lowered Master stepped down at once');
  t.ok(took.at - 10_000 < 200 + skewTimeMs(150, 100) + 1, `150 took over ${(took.at - 10_000).toFixed(1)} ms later: stepDownMs + Skew_Time`);
  t.same(machines.map((m) => m.state), ['master', 'backup']);
  t.equal(log.filter((l) => l.kind === 'becomeMaster' && l.at > took.at).length, 0, 'and nothing moves after');
});
