// bench/lib/load.ts with real wrk and nginx in lab namespaces: the spread
// script (issue 17's direct3 reference) sends each wrk thread to its own
// backend. Were thread.addr ignored, wrk would quietly load the URL's one
// host and direct3 would measure one nginx under another name; each
// backend's own TCP passive opens (a per-namespace counter, read as the
// bench reads it: bench/lib/procfs.ts through the nginx's /proc) tell.
import * as fs from 'node:fs';
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { runWrk, wrkSpreadScript } from '../../bench/lib/load';
import { startNginxBackend } from '../../bench/lib/peers';
import { tcpPassiveOpens } from '../../bench/lib/procfs';

const BACKENDS = ['10.99.0.11', '10.99.0.12', '10.99.0.13'];

t.test('each wrk thread connects to its own backend, the request still the URL\'s', async (t) => {
  if (!requirePrivileged(t)) return;
  const lab = await createLab(t);
  const client = await lab.addHost('client', { address: '10.99.0.2/24' });
  const pids: (number | undefined)[] = [];
  for (const [i, b] of BACKENDS.entries()) {
    const ns = await lab.addHost(`b${i + 1}`, { address: `${b}/24` });
    pids.push((await startNginxBackend(lab, ns, `b${i + 1}`, 8080)).proc.pid);
  }
  const script = lab.file('spread.lua');
  fs.writeFileSync(script, wrkSpreadScript(BACKENDS, 8080));
  const before = pids.map((p) => tcpPassiveOpens(p));
  // The URL names b1 only: without the script every connection would go there.
  const w = await runWrk(lab, client, `http://${BACKENDS[0]}:8080/`, { seconds: 1, connections: 6, threads: 3, close: false, script });
  t.ok(w.requests > 0, `wrk got answers (${w.requests})`);
  t.equal(w.non2xx + w.socketErrors, 0, 'no errors');
  const opened = pids.map((p, i) => tcpPassiveOpens(p) - before[i]!);
  // Two connections per thread, and on b1 one more: wrk's check that the URL's address connects
  // (wrk.resolve) before any thread starts.
  t.same(opened, [3, 2, 2], `connections accepted by b1, b2, b3: ${opened.join(', ')}`);
});

t.test('one address: every thread to it (the VIP rows use the same script)', async (t) => {
  t.match(wrkSpreadScript(['10.99.0.52'], 8080), /local addrs = \{ "10\.99\.0\.52" \}/);
  t.throws(() => wrkSpreadScript([], 8080), /no address/);
});
