// The control socket's operations (agent/daemon/control-ops.ts controlOp):
// what each op answers, and the words of every refusal, as `lb-agent
// status`, `reload` and a successor's `--replace` see them.
import t from 'tap';
import { controlOp, type ControlTarget } from '../../agent/daemon/control-ops';

function target(o: Partial<{ started: boolean; stopping: boolean; handover: boolean }> = {}): ControlTarget & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    status: () => { calls.push('status'); return { doc: 1 }; },
    reload: async () => { calls.push('reload'); return { ok: true }; },
    started: () => o.started ?? true,
    stopping: () => o.stopping ?? false,
    onHandover: o.handover === false ? undefined : (path) => { calls.push(`handover ${path}`); return { pid: 7, listeners: 2 }; },
  };
}

t.test('status, ping and reload', async (t) => {
  const x = target();
  t.same(controlOp(x, 'status', {}), { doc: 1 }, 'status answers with the status document');
  t.equal(controlOp(x, 'ping', {}), 'pong');
  t.same(await (controlOp(x, 'reload', {}) as Promise<unknown>), { ok: true }, 'reload answers with the reload verdict');
  t.same(x.calls, ['status', 'reload'], 'ping reaches nothing');
  const starting = target({ started: false, stopping: true, handover: false });
  t.same(controlOp(starting, 'status', {}), { doc: 1 }, 'status answers while starting and while stopping');
});

t.test('handover: answered once started, with an absolute path, where hand-over is offered', async (t) => {
  const x = target();
  t.same(controlOp(x, 'handover', { path: '/run/next.sock' }), { pid: 7, listeners: 2 });
  t.same(x.calls, ['handover /run/next.sock']);
});

t.test('handover refusals, each in its words and in this order', async (t) => {
  const refused = (x: ControlTarget, req: Record<string, unknown>, message: string, what: string): void => {
    t.throws(() => controlOp(x, 'handover', req), { message }, what);
  };
  refused(target({ started: false, stopping: true, handover: false }), { path: '/x' },
    'this agent is still starting; try again once `lb-agent status` shows it started', 'still starting comes first');
  refused(target({ handover: false, stopping: true }), { path: '/x' },
    'this agent hands nothing over: it runs under systemd, whose fd store keeps the listening sockets across `systemctl restart`', 'under systemd');
  refused(target({ stopping: true }), { path: '/x' }, 'this agent is already stopping', 'stopping');
  const noPath = 'handover needs "path", the absolute path of the successor\'s unix datagram socket';
  refused(target(), {}, noPath, 'no path');
  refused(target(), { path: 'relative.sock' }, noPath, 'a relative path');
  refused(target(), { path: 7 }, noPath, 'a path that is not a string');
});

t.test('an unknown op names the known ones', async (t) => {
  const x = target();
  t.throws(() => controlOp(x, 'restart', {}), { message: 'unknown op "restart" (known: status, ping, reload, handover)' });
  t.same(x.calls, []);
});
