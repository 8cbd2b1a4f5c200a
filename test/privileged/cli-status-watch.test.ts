// `lb-agent status --watch` as an operator sees it, in a real terminal (tmux):
// it shows an unreachable daemon and keeps asking, then the real agent's
// services; a killed backend shows down within one refresh plus the health
// thresholds; Ctrl-C restores the cursor and exits 0.
import * as fs from 'node:fs';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { run, waitFor } from '../../lab/netns';
import { operatorLab, FAST_ARP, FAST_HC, poolService } from './fixtures/operator-lab';
import { startAgent, waitStatus, AGENT_BIN } from '../../lab/agent';

const INTERVAL_S = 0.5;

t.test('status --watch in tmux: unreachable, then live; a backend down within one refresh; Ctrl-C exits 0', async (t) => {
  if (!requirePrivileged(t)) return;
  const { lab, node, b2 } = await operatorLab(t);
  const socket = lab.file('watch.sock');
  const exitFile = lab.file('watch.exit');

  // A tmux server of our own (-L), killed at teardown whatever happens.
  const server = `lbwatch${process.pid}`;
  const tmux = (args: string[]) => run('tmux', ['-L', server, '-f', '/dev/null', ...args], { timeoutMs: 5000 });
  t.teardown(() => run('tmux', ['-L', server, 'kill-server'], { allowFail: true, timeoutMs: 5000 }));
  const pane = async (): Promise<string> => (await tmux(['capture-pane', '-p', '-J', '-t', 'w'])).stdout;
  // The shell keeps the pane (and its cursor state) after lb-agent exits, and records the exit code.
  const cmd = `${process.execPath} ${AGENT_BIN} status --watch --interval ${INTERVAL_S} --socket ${socket}; echo $? > ${exitFile}; exec sleep 60`;
  await tmux(['new-session', '-d', '-s', 'w', '-x', '220', '-y', '60', cmd]);

  await waitFor('the pane to say the daemon is unreachable', async () => /daemon unreachable: cannot reach the agent at .*watch\.sock: ENOENT/.test(await pane()), 10_000);
  t.pass('no daemon yet: shown as unreachable, and the watch keeps running');
  t.equal((await tmux(['display', '-p', '-t', 'w', '#{cursor_flag}'])).stdout.trim(), '0', 'the cursor is hidden while redrawing');

  const agent = await startAgent(lab, node, {
    node: { interface: 'eth0' }, metrics: { listen: '' }, arp: FAST_ARP, control: { socket },
    pools: { 'range-global': '10.99.0.200-10.99.0.201' },
    services: [poolService('web')],
  });
  await waitStatus(agent, 'web serving with both backends up', (s) => s.services[0]?.ready === true && s.services[0].healthyBackends === 2, 20_000);
  await waitFor('the pane to show both backends up', async () => {
    const p = await pane();
    return /10\.99\.0\.11:8080\s+up/.test(p) && /10\.99\.0\.12:8080\s+up/.test(p) && !/unreachable/.test(p);
  }, 5000, 100);
  t.pass('the daemon came up: the same pane now shows it, both backends up');

  const killedAt = Date.now();
  await b2.stop();
  // One refresh, plus failureThreshold probes of period + timeout each, plus 1 s for process and tmux.
  const bound = INTERVAL_S * 1000 + FAST_HC.failureThreshold * (FAST_HC.periodSeconds + FAST_HC.timeoutSeconds) * 1000 + 1000;
  const seen = await waitFor('the pane to show b2 down', async () => {
    const p = await pane();
    return /10\.99\.0\.12:8080\s+down/.test(p) ? p : undefined;
  }, bound, 50);
  const took = Date.now() - killedAt;
  t.ok(took <= bound, `b2 shown down ${took} ms after the kill (bound ${bound} ms)`);
  t.match(seen, /1\/2 up/, 'the service line counts one of two up');
  t.match(seen, /backend-down\s+default\/web 10\.99\.0\.12/, 'the event history shows the transition');

  await tmux(['send-keys', '-t', 'w', 'C-c']);
  const code = await waitFor('lb-agent status --watch to exit', () => (fs.existsSync(exitFile) ? fs.readFileSync(exitFile, 'utf8').trim() : undefined), 3000);
  t.equal(code, '0', 'Ctrl-C: exit 0');
  t.equal((await tmux(['display', '-p', '-t', 'w', '#{cursor_flag}'])).stdout.trim(), '1', 'the cursor is visible again');
});
