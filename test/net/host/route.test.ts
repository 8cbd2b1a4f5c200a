// The parent-NIC rule: which interface /proc/net/route names as the default
// route. The preflight and the daemon both call net/route.ts, so a VM with two
// default routes gets one answer (issue 16: they once picked different NICs).
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { parseDefaultRoute, defaultRouteInterface } from '../../../agent/net/host/route';

const HEADER = 'Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT';

t.test('two default routes: the lower metric wins even when listed second', async (t) => {
  const text = [
    HEADER,
    'eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0',
    'eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0',
  ].join('\n');
  t.equal(parseDefaultRoute(text), 'eth0', 'metric 100 beats metric 200, not the first 0/0 line');
});

t.test('only up 0/0 routes count', async (t) => {
  const text = [
    HEADER,
    'eth2\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0',
    'eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0',
    'eth1\t00000000\t0101A8C0\t0003\t0\t0\t300\t00000000\t0\t0\t0',
  ].join('\n');
  t.equal(parseDefaultRoute(text), 'eth1', 'eth2 is not RTF_UP; the eth0 line is a /24, not 0/0');
  t.equal(parseDefaultRoute(HEADER), undefined);
  t.equal(parseDefaultRoute(''), undefined);
});

t.test('the daemon reads the same rule from a route table file', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-route-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'route');
  fs.writeFileSync(file, [
    HEADER,
    'eth1\t00000000\t0101A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0',
    'eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0',
  ].join('\n') + '\n');
  t.equal(defaultRouteInterface(file), 'eth0');
  t.equal(defaultRouteInterface(path.join(dir, 'absent')), undefined);
});
