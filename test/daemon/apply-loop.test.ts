// The apply loop (agent/daemon/apply-loop.ts): changes of one turn make one
// transaction, changes during one make one more, a start's writes wait for
// sources still acquiring (up to the batch bound), a failed transaction
// leaves what was in place, and a VIP joins the set in place only once its
// transaction is committed.
import t from 'tap';
import { ApplyLoop } from '../../agent/daemon/apply-loop';
import { realClock } from '../../agent/clock';
import { silentLogger } from '../../agent/log';
import type { ForwardService } from '../../agent/daemon/subsystems';

const svc = (key: string, vip: string | undefined, healthy = 1): ForwardService => ({ key, vip, healthy: Array.from({ length: healthy }, () => ({ address: '10.0.0.1', weight: 1 })) } as unknown as ForwardService);

function loop(over: Partial<ConstructorParameters<typeof ApplyLoop>[0]> = {}): { l: ApplyLoop; applied: ForwardService[][]; served: number; setState(s: ForwardService[]): void; release(): void; fail: { next: boolean } } {
  let state: ForwardService[] = [];
  const applied: ForwardService[][] = [];
  const out = { served: 0 };
  let gate: (() => void) | undefined;
  const fail = { next: false };
  const l = new ApplyLoop({
    log: silentLogger(), clock: realClock, batchMs: 200,
    state: () => state,
    apply: async (s) => {
      applied.push([...s]);
      if (over.acquiring === undefined) await new Promise<void>((r) => { gate = r; setImmediate(r); });
      if (fail.next) { fail.next = false; throw new Error('nft failed'); }
    },
    acquiring: () => false,
    onServingChanged: () => { out.served++; },
    onIdle: () => undefined,
    ...over,
  });
  return { l, applied, get served() { return out.served; }, setState: (s) => { state = s; }, release: () => gate?.(), fail };
}

t.test('one transaction per burst; what is in place follows the commits', async (t) => {
  const h = loop();
  h.setState([svc('a', '10.99.0.200')]);
  h.l.schedule(); h.l.schedule(); h.l.schedule();
  await h.l.now();
  t.equal(h.applied.length, 1, 'three changes in one turn, one transaction');
  t.ok(h.l.hasVip('10.99.0.200'));
  t.ok(h.l.serves('a'));
  t.equal(h.served, 1);
  h.setState([svc('a', '10.99.0.200', 0)]);
  await h.l.now();
  t.notOk(h.l.serves('a'), 'no healthy backend: not served');
  t.ok(h.l.hasVip('10.99.0.200'), 'the VIP\'s rules are still in place');
  h.fail.next = true;
  h.setState([svc('a', '10.99.0.201')]);
  await h.l.now();
  t.ok(h.l.hasVip('10.99.0.200') && !h.l.hasVip('10.99.0.201'), 'a failed transaction leaves the old set');
  await h.l.stop();
  h.l.schedule();
  await new Promise((r) => setTimeout(r, 20));
  t.equal(h.applied.length, 3, 'nothing after stop');
});

t.test('a start waits for sources still acquiring, up to the batch bound; now() does not wait', async (t) => {
  let acquiring = true;
  const h = loop({ acquiring: () => acquiring });
  h.setState([svc('a', '10.99.0.200')]);
  const t0 = Date.now();
  h.l.schedule();
  await new Promise((r) => setTimeout(r, 50));
  t.equal(h.applied.length, 0, 'waiting while a source acquires');
  acquiring = false;
  h.l.schedule();
  await h.l.idle();
  await new Promise((r) => setTimeout(r, 20));
  t.equal(h.applied.length, 1, 'applied once nobody acquires');
  acquiring = true;
  h.l.schedule();
  const deadline = Date.now() + 2000;
  while (h.applied.length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  t.equal(h.applied.length, 2, 'the batch bound ends the wait');
  t.ok(Date.now() - t0 >= 200);
  await h.l.now();
  t.equal(h.applied.length, 3, 'now() applies at once');
  await h.l.stop();
});

t.test('a transaction reads the services that differ from the last commit, whatever their number', async (t) => {
  const reads = { n: 0 };
  const counted = (f: ForwardService): ForwardService => new Proxy(f, { get: (target, p, receiver) => { reads.n++; return Reflect.get(target, p, receiver) as unknown; } });
  const run = async (n: number): Promise<{ reads: number; serving: boolean[]; served: number }> => {
    const h = loop();
    const all = Array.from({ length: n }, (_, i) => counted(svc(`s${i}`, `10.99.${i >> 8}.${i & 255}`)));
    h.setState(all);
    await h.l.now();
    const served = h.served;
    // s3's last healthy backend goes, then comes back.
    h.setState(all.map((s, i) => (i === 3 ? counted(svc('s3', '10.99.0.3', 0)) : s)));
    reads.n = 0;
    await h.l.now();
    const r = reads.n;
    const serving = [h.l.serves('s3'), h.l.serves('s4'), h.l.hasVip('10.99.0.3')];
    h.setState(all);
    await h.l.now();
    serving.push(h.l.serves('s3'));
    return { reads: r, serving, served: h.served - served };
  };
  const [small, large] = [await run(10), await run(1000)];
  t.ok(small.reads > 0, `the changed service is read (${small.reads} reads)`);
  t.equal(large.reads, small.reads, 'as many reads at 1,000 services as at 10');
  t.same(large.serving, [false, true, true, true], 'the service without a healthy backend is not served, its VIP stays, and it is served again');
  t.equal(large.served, 2, 'serving changed twice');
});

t.test('a failed transaction leaves the counts of the last commit', async (t) => {
  const h = loop();
  h.setState([svc('a', '10.99.0.200'), svc('b', '10.99.0.201')]);
  await h.l.now();
  h.setState([svc('a', '10.99.0.200')]);
  h.fail.next = true;
  await h.l.now();
  t.ok(h.l.hasVip('10.99.0.201') && h.l.serves('b'), 'b and its VIP stay after the failed removal');
  h.setState([svc('a', '10.99.0.200')]);
  await h.l.now();
  t.ok(!h.l.hasVip('10.99.0.201') && !h.l.serves('b'), 'and go with the next committed one');
});
