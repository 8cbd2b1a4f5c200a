// The daemon's side of systemd, pure parts: LISTEN_FDS parsing, fd store
// names, our unit from /proc/self/cgroup, and telling a stop from a restart.
import * as fs from 'node:fs';
import t from 'tap';
import { fdName, LISTEN_FDS_START, ownUnit, parseListenFds, stopJobPending, SystemdFdStore } from '../../agent/daemon/systemd';
import { restartPending } from '../../agent/daemon/withdraw';
import { silentLogger } from '../../agent/log';

t.test('parseListenFds: only for this pid, named, starting at fd 3', async (t) => {
  const env = { LISTEN_PID: '42', LISTEN_FDS: '3', LISTEN_FDNAMES: 'lb-a:lb-b:lb-a' };
  t.same([...parseListenFds(env, 42)], [['lb-a', [3, 5]], ['lb-b', [4]]]);
  t.same([...parseListenFds(env, 43)], [], 'another process\'s descriptors are not ours');
  t.same([...parseListenFds({ LISTEN_PID: '42', LISTEN_FDS: '1' }, 42)], [['unknown', [LISTEN_FDS_START]]], 'unnamed');
  t.same([...parseListenFds({ LISTEN_PID: '42', LISTEN_FDS: 'x' }, 42)], []);
  t.same([...parseListenFds({}, 42)], []);
});

t.test('fdName keeps FDNAME legal', async (t) => {
  t.equal(fdName('10.99.0.200|TCP|80'), 'lb-10.99.0.200|TCP|80');
  t.equal(fdName('a:b\nc'), 'lb-a_b_c', 'no colon (the LISTEN_FDNAMES separator), no control characters');
  t.equal(fdName('x'.repeat(300)).length, 255);
});

t.test('SystemdFdStore: take once, keep sends FDSTORE, drop only what was kept, release the rest', async (t) => {
  const sent: Array<[string, readonly number[] | undefined]> = [];
  // Real descriptors of our own: release() closes what nobody took.
  const a = fs.openSync('/dev/null', 'r');
  const b = fs.openSync('/dev/null', 'r');
  t.teardown(() => { try { fs.closeSync(a); } catch { /* closed */ } });
  const store = new SystemdFdStore((m, fds) => sent.push([m, fds]), new Map([['lb-a', [a]], ['lb-b', [b]]]), silentLogger());
  t.equal(store.take('a'), a);
  t.equal(store.take('a'), undefined, 'taken once');
  store.keep('c', 9);
  t.same(sent, [['FDSTORE=1\nFDNAME=lb-c', [9]]]);
  store.drop('a');
  store.drop('zzz');
  t.same(sent.slice(1), [['FDSTOREREMOVE=1\nFDNAME=lb-a', undefined]], 'an inherited descriptor that is dropped leaves the store; an unknown one sends nothing');
  t.equal(store.pending, 1);
  sent.length = 0;
  store.release();
  t.same(sent, [['FDSTOREREMOVE=1\nFDNAME=lb-b', undefined]], 'what nobody took is removed from the store');
  t.throws(() => fs.fstatSync(b), { code: 'EBADF' }, 'and closed');
  t.equal(store.pending, 0);
});

t.test('ownUnit from /proc/self/cgroup', async (t) => {
  t.equal(ownUnit('0::/system.slice/lb-agent.service\n'), 'lb-agent.service');
  t.equal(ownUnit('0::/system.slice/lb-agent.service/control\n'), 'lb-agent.service', 'a control process of the unit (ExecStopPost)');
  t.equal(ownUnit('0::/user.slice/user-0.slice/session-1.scope\n'), undefined);
});

t.test('stopJobPending: a stop job for our unit, not a restart, not another unit', async (t) => {
  t.ok(stopJobPending('123 lb-agent.service stop running\n', 'lb-agent.service'));
  t.notOk(stopJobPending('124 lb-agent.service restart running\n', 'lb-agent.service'));
  t.notOk(stopJobPending('125 other.service stop running\n', 'lb-agent.service'));
  t.notOk(stopJobPending('', 'lb-agent.service'), 'no job: a crash that Restart= recovers');
  t.ok(stopJobPending('1 shutdown.target start waiting\n7 lb-agent.service stop running\n', 'lb-agent.service'), 'a shutdown stops it');
});

t.test('restartPending: keep on a restart or crash, withdraw on a stop or when it cannot tell', async (t) => {
  const cg = '0::/system.slice/lb-agent.service\n';
  t.match(restartPending(() => '9 lb-agent.service restart running\n', cg), { keep: /no stop of lb-agent.service is under way/ });
  t.same(restartPending(() => '9 lb-agent.service stop running\n', cg), {});
  t.match(restartPending(() => { throw new Error('no systemctl'); }, cg), { error: /cannot read systemd's jobs \(no systemctl\); withdrawing/ });
});
