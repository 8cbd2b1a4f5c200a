// The sd_notify protocol (sd_notify(3)) as systemd would see it from
// lb-agent.service (Type=notify, WatchdogSec=): the real agent, started with
// NOTIFY_SOCKET and WATCHDOG_USEC like systemd starts it, sends READY=1 and
// STATUS=, pings WATCHDOG=1 at half the deadline, stops pinging while its
// event loop cannot run, sends RELOADING=1/READY=1 around a SIGHUP and a
// reload asked over the control socket (`lb-agent reload`), and
// STOPPING=1 on SIGTERM. The listener is a unix datagram socket, as
// systemd's: Node cannot create AF_UNIX SOCK_DGRAM sockets, so a few lines
// of python3 bind it and print each datagram as a JSON line.
import t from 'tap';
import * as fs from 'node:fs';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { startBackend } from '../../lab/services';
import { startAgent, agentCli } from '../../lab/agent';
import { within } from '../../lab/within';

const FAST_ARP = { probeWait: 0.05, probeNum: 2, probeMin: 0.05, probeMax: 0.1, announceWait: 0.05, announceNum: 2, announceInterval: 0.1 };
const WATCHDOG_USEC = 400_000;

// Binds the socket, says so, then one line per datagram: arrival wall time
// in ms (comparable with Date.now()) and the payload.
const LISTENER = `
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print(json.dumps({"listening": True}), flush=True)
while True:
    data = s.recv(65536)
    print(json.dumps({"at": time.time() * 1000, "msg": data.decode("utf-8", "replace")}), flush=True)
`;

interface Datagram { at: number; msg: string }

t.test('sd_notify: READY, STATUS, WATCHDOG, RELOADING, STOPPING', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const node = await lab.addHost('node', { address: '10.99.0.2/24' });
  await lab.addHost('b1', { address: '10.99.0.11/24' });
  await startBackend(lab, lab.ns('b1'), 'b1');

  const sock = lab.file('notify.sock');
  // A path-bound unix socket is reachable from every network namespace.
  const listener = lab.spawn(node, 'python3', ['-c', LISTENER, sock]);
  const got: Datagram[] = [];
  let listening = false;
  let partial = '';
  let pyErr = '';
  listener.stderr?.on('data', (d: Buffer) => { pyErr += d.toString(); });
  listener.stdout?.on('data', (d: Buffer) => {
    partial += d.toString();
    let nl: number;
    while ((nl = partial.indexOf('\n')) >= 0) {
      const line = JSON.parse(partial.slice(0, nl)) as Datagram & { listening?: boolean };
      partial = partial.slice(nl + 1);
      if (line.listening) listening = true;
      else got.push(line);
    }
  });
  await waitFor('the notify listener to bind', () => {
    if (listener.exitCode !== null) throw new Error(`python3 listener exited: ${pyErr}`);
    return listening;
  }, 10_000);

  const agent = await startAgent(lab, node, {
    node: { name: 'vm1', interface: 'eth0' },
    metrics: { listen: '' },
    pools: { 'range-global': '10.99.0.200-10.99.0.210' },
    arp: FAST_ARP,
    services: [{ name: 'api', ipam: 'pool', ports: [{ port: 80, targetPort: 8080 }], backends: ['10.99.0.11'], healthCheck: { periodSeconds: 0.2, timeoutSeconds: 0.2 } }],
  }, { env: { NOTIFY_SOCKET: sock, WATCHDOG_USEC: String(WATCHDOG_USEC) }, logLevel: 'info' });

  const msgs = (): string[] => got.map((d) => d.msg);
  const watchdogs = (from: number, to = Infinity): Datagram[] => got.filter((d) => d.msg === 'WATCHDOG=1' && d.at >= from && d.at < to);

  t.test('READY=1 once started, and a STATUS= line', async (t) => {
    await waitFor('READY=1', () => msgs().includes('READY=1'), 10_000);
    t.pass('READY=1 received');
    const status = await waitFor('STATUS= saying the service is ready', () => msgs().find((m) => /^STATUS=1 VIP served; 1 services, 1 serving, 1 ready; dataplane \w+$/.test(m)), 15_000);
    t.match(status, /^STATUS=1 VIP served; /, status);
    t.ok(msgs().indexOf('READY=1') >= 0 && got.every((d) => d.msg.length < 4096), 'each datagram is one short message');
  });

  t.test('WATCHDOG=1 keeps coming at about half the deadline', async (t) => {
    const from = Date.now();
    await new Promise((r) => setTimeout(r, 2000));
    const pings = watchdogs(from, Date.now());
    // 200 ms apart: ~10 in 2 s; loosely, at least 4, so a slow machine passes.
    t.ok(pings.length >= 4, `${pings.length} WATCHDOG=1 in 2 s (deadline ${WATCHDOG_USEC / 1000} ms)`);
    const gaps = pings.slice(1).map((p, i) => p.at - pings[i]!.at);
    t.comment(`gaps between pings: ${gaps.map((g) => Math.round(g)).join(' ')} ms`);
  });

  t.test('a stopped event loop stops the pings; they resume with it', async (t) => {
    // SIGSTOP is the honest way to freeze the daemon's event loop from the
    // outside: the timer that sends WATCHDOG=1 lives in that loop, so no
    // ping may arrive, which is what lets systemd kill a hung agent.
    const stopAt = Date.now();
    agent.signal('SIGSTOP');
    await new Promise((r) => setTimeout(r, 1500));
    const contAt = Date.now();
    agent.signal('SIGCONT');
    // A datagram sent just before the stop may still be in flight: 250 ms grace.
    const during = watchdogs(stopAt + 250, contAt);
    t.same(during.map((d) => Math.round(d.at - stopAt)), [], 'no WATCHDOG=1 while stopped (past the 400 ms deadline: systemd would act)');
    const resumed = await waitFor('WATCHDOG=1 after SIGCONT', () => {
      const w = watchdogs(contAt);
      return w.length >= 3 ? w : undefined;
    }, 5000);
    t.ok(resumed.length >= 3, `pings resume after SIGCONT (first after ${Math.round(resumed[0]!.at - contAt)} ms)`);
    t.equal(agent.proc.exitCode, null, 'the agent survived the stop');
  });

  t.test('SIGHUP: RELOADING=1 then READY=1', async (t) => {
    const from = got.length;
    agent.signal('SIGHUP');
    await waitFor('READY=1 after RELOADING=1', () => {
      const after = got.slice(from).map((d) => d.msg);
      const r = after.indexOf('RELOADING=1');
      return r >= 0 && after.indexOf('READY=1', r) > r;
    }, 10_000);
    t.pass('RELOADING=1 was followed by READY=1');
  });

  t.test('lb-agent reload (the control socket): RELOADING=1 then READY=1, as for SIGHUP', async (t) => {
    const from = got.length;
    const r = await agentCli(lab, node, ['reload', '--socket', agent.socket]);
    t.equal(r.code, 0, `lb-agent reload: ${r.stdout}${r.stderr}`);
    t.match(r.stdout, /^lb-agent reloaded: 0 added, 0 removed, 0 changed, 1 unchanged/);
    // The verdict is sent after READY=1; the listener may print it a moment later.
    const after = await waitFor('READY=1 after RELOADING=1', () => {
      const m = got.slice(from).map((d) => d.msg);
      const i = m.indexOf('RELOADING=1');
      return i >= 0 && m.indexOf('READY=1', i) > i ? m : undefined;
    }, 5000);
    t.equal(after.filter((m) => m === 'RELOADING=1').length, 1, 'one reload bracket');
  });

  t.test('SIGHUP with an alias bomb: rejected, and still RELOADING=1 then READY=1 (issue 15)', async (t) => {
    const good = fs.readFileSync(agent.configPath);
    t.teardown(() => fs.writeFileSync(agent.configPath, good));
    fs.writeFileSync(agent.configPath, ['a: &a [x,x,x,x,x,x,x,x,x]', 'b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]', 'c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]',
      'd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]', 'services: []', ''].join('\n'));
    const from = got.length;
    agent.signal('SIGHUP');
    await waitFor('READY=1 after RELOADING=1', () => {
      const after = got.slice(from).map((d) => d.msg);
      const r = after.indexOf('RELOADING=1');
      return r >= 0 && after.indexOf('READY=1', r) > r;
    }, 10_000);
    t.pass('RELOADING=1 was followed by READY=1');
    await waitFor('STATUS= reload rejected', () => got.slice(from).some((d) => /^STATUS=reload rejected: .*aliases expand too far/.test(d.msg)), 5000);
    t.pass('STATUS= says the reload was rejected and why');
    const st = await agent.status();
    t.equal(st.config.lastReload?.ok, false);
    t.equal(st.services.length, 1, 'the running config is kept');
  });

  t.test('SIGTERM: STOPPING=1, then the agent exits', async (t) => {
    const from = got.length;
    agent.signal('SIGTERM');
    const res = await within(agent.exited, 12_000);
    const exitedAt = Date.now();
    t.same(res, { code: 0, signal: null }, 'exited cleanly');
    // The listener may print the last datagram a moment after the exit.
    await waitFor('STOPPING=1', () => got.slice(from).some((d) => d.msg === 'STOPPING=1'), 3000);
    const after = got.slice(from).map((d) => d.msg);
    t.ok(after.includes('STOPPING=1'), 'STOPPING=1 sent');
    t.notOk(after.slice(after.indexOf('STOPPING=1')).includes('READY=1'), 'no READY=1 after STOPPING=1');
    await new Promise((r) => setTimeout(r, 500));
    t.same(watchdogs(exitedAt), [], 'no WATCHDOG=1 after the exit');
  });
});
