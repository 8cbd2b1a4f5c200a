// `lb-agent status` as text: the table, and per service what an operator
// needs after a restart: whether the VIP was adopted, and the last
// interruption with its reason.
import t from 'tap';
import { formatStatus } from '../../agent/cli/format';
import type { ServiceStatus, StatusDocument } from '../../agent/daemon/daemon';

const svc = (over: Partial<ServiceStatus>): ServiceStatus => ({
  key: 'default/web', name: 'web', namespace: 'default', ipam: 'dhcp', primaryService: undefined,
  vip: '10.99.0.107', interface: 'lbv82b3ade9d00c', mac: '02:82:b3:ad:e9:d0', state: 'serving', reason: undefined, ready: true,
  startedAt: 0, adopted: false, interruptions: 0, lastInterruption: undefined, ports: ['80/TCP->8080'],
  source: { server: '10.99.0.1' }, failover: undefined, healthyBackends: 1,
  backends: [{ address: '10.99.0.11', port: 8080, state: 'up', since: 0, reason: undefined, takenOutBy: undefined }],
  ...over,
});

const doc = (services: ServiceStatus[]): StatusDocument => ({
  version: '0.1.0', pid: 42, node: { name: 'vm1', interface: 'eth0', address: '10.99.0.2', priority: 100 },
  config: { path: '/etc/lb-agent/config.yaml', loadedAt: '2026-11-23T20:00:00.000Z', generation: 1, lastReload: undefined },
  dataplane: { kind: 'kernel', reason: 'auto' }, failover: { mode: 'none' }, ready: true, services, events: [],
});

t.test('adoption and interruptions are shown per service', async (t) => {
  const text = formatStatus(doc([
    svc({ adopted: true, interruptions: 1, lastInterruption: { at: '2026-11-23T20:01:00.000Z', reason: 'server refused the lease of 10.99.0.107 (DHCPNAK: address not available)' } }),
    svc({ key: 'default/api', name: 'api', ipam: 'pool', vip: '10.99.0.200', adopted: false }),
  ]), 0);
  t.match(text, /default\/web: server 10\.99\.0\.1, VIP adopted from the previous run, interrupted 1x, last 2026-11-23T20:01:00\.000Z: server refused the lease of 10\.99\.0\.107 \(DHCPNAK: address not available\)/);
  t.notMatch(text, /default\/api:.*adopted/, 'nothing said of a VIP that was not adopted');
  t.match(text, /default\/web\s+dhcp\s+10\.99\.0\.107/);
});

t.test('the last 10 events, newest last, one line each', async (t) => {
  const d = doc([svc({})]);
  d.events = Array.from({ length: 12 }, (_, i) => ({ at: `2026-11-23T20:00:${String(i).padStart(2, '0')}.000Z`, kind: 'backend-down' as const, service: 'default/web', address: `10.99.0.${i}`, reason: 'connection refused' }));
  d.events.push({ at: '2026-11-23T20:01:00.000Z', kind: 'reload-rejected', reason: 'reload rejected, running config kept:\n/etc/lb-agent/config.yaml:3: services[0].ports: required' });
  const text = formatStatus(d, 0);
  t.match(text, /last 10 events:/);
  t.notMatch(text, /10\.99\.0\.2 /, 'the oldest events are left out');
  t.match(text, /20:00:11\.000Z\s+backend-down\s+default\/web 10\.99\.0\.11\s+connection refused/);
  t.match(text, /reload-rejected\s+-\s+reload rejected, running config kept:; \/etc\/lb-agent\/config\.yaml:3: services\[0\]\.ports: required\n$/, 'the verdict with its error on one line, last');
});

t.test('a document without events (an older daemon) still prints', async (t) => {
  const d = doc([svc({})]) as Partial<StatusDocument>;
  delete d.events;
  t.notMatch(formatStatus(d as StatusDocument, 0), /event/);
});

t.test('issue 17: the node\'s zone, the DSR backend side, and per service the source mode and the set in use', async (t) => {
  const d = doc([
    svc({ sourceIP: 'preserve', topology: { policy: 'prefer-zone', zone: 'zone-a', set: 'all', reason: 'zone-unhealthy-spill', detail: 'prefer-zone: no healthy backend in zone zone-a; spilling to 1 healthy backend(s) in other zones', inUse: ['10.99.0.11'] } }),
    svc({ key: 'default/api', name: 'api', topology: { policy: 'any', zone: 'zone-a', set: 'all', reason: 'policy-any', detail: 'topology any', inUse: [] } }),
  ]);
  d.node = { ...d.node, zone: 'zone-a', region: 'r1', zoneFrom: 'labels-file', labelsProblem: undefined };
  d.backend = { vips: [{ address: '10.99.0.250', interface: 'lo', state: 'on-lo', owned: true }], sysctls: { arp_ignore: 1, arp_announce: 2 }, problems: [] };
  const text = formatStatus(d, 0);
  t.match(text, /^zone: zone-a, region r1 \(from the labels file\)$/m);
  t.match(text, /^backend of DSR VIPs: 10\.99\.0\.250 on lo; all\.arp_ignore=1 all\.arp_announce=2$/m);
  t.match(text, /default\/web: server 10\.99\.0\.1, direct server return \(client address kept\), topology prefer-zone: no healthy backend in zone zone-a; spilling/);
  t.notMatch(text, /default\/api:.*topology/, 'topology any says nothing');
  const unknown = doc([svc({})]);
  unknown.node = { ...unknown.node, zone: undefined, zoneFrom: 'unknown', labelsProblem: '/etc/lb-agent/node-labels does not exist' };
  t.match(formatStatus(unknown, 0), /^zone: unknown; \/etc\/lb-agent\/node-labels does not exist$/m);
});

t.test('issue 17: the dataplane line says which engine serves direct server return, and nothing without DSR', async (t) => {
  const d = doc([svc({})]);
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\); failover/m, 'no DSR port: no engine');
  d.dataplane = { kind: 'kernel', reason: 'auto', dsr: { engine: 'bpf', cause: 'tcx', reason: 'BPF program at tc ingress (tcx) of eth0' } };
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\), direct server return on the BPF program \(tcx; open connections keep their backend\); failover/m);
  d.dataplane = { kind: 'kernel', reason: 'auto', dsr: { engine: 'nft', cause: 'fallback', reason: 'the BPF program cannot run here (EPERM)' } };
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\), direct server return on the nft table alone \(fallback; by hash alone: a change of backends moves some open connections\); failover/m);
});

t.test('the dataplane line says what forwards the snat flows where the eBPF NAT engine is configured', async (t) => {
  const d = doc([svc({})]);
  t.notMatch(formatStatus(d, 0), /snat flows/, 'not configured: nothing said');
  d.dataplane = { kind: 'kernel', reason: 'auto', natEngine: { engine: 'ebpf', reason: 'tcx ingress of eth0' } };
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\), snat flows on the eBPF NAT engine \(tcx ingress of eth0\); failover/m);
  d.dataplane = { kind: 'kernel', reason: 'auto', natEngine: { engine: 'nft', reason: 'fallback: /sys/fs/bpf is not on a BPF file system' } };
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\), snat flows on the nft table \(fallback: \/sys\/fs\/bpf is not on a BPF file system\); failover/m);
});

t.test('while the forwarding stats for /metrics keep failing, a dataplane problem line says so; none while they work', async (t) => {
  const d = doc([svc({})]);
  d.dataplane = { kind: 'kernel', reason: 'auto' };
  t.notMatch(formatStatus(d, 0), /dataplane problem/);
  const problem = 'the forwarding stats for /metrics could not be read 3 time(s) in a row over 30.0 s (counters: Error: No such file or directory); /metrics shows values from 35.0 s ago';
  d.dataplane = { kind: 'kernel', reason: 'auto', statsProblem: problem };
  t.match(formatStatus(d, 0), new RegExp(`^dataplane problem: ${problem.replace(/[()./]/g, '\\$&')}$`, 'm'));
});

t.test('the dataplane line says when new connections are placed by flow hash (VRRP), and nothing for round-robin', async (t) => {
  const d = doc([svc({})]);
  d.dataplane = { kind: 'kernel', reason: 'auto', placement: 'round-robin' };
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\); failover/m);
  d.dataplane = { kind: 'kernel', reason: 'auto', placement: 'flow-hash' };
  t.match(formatStatus(d, 0), /^dataplane: kernel \(auto\), new connections placed by flow hash \(they outlive a VRRP failover\); failover/m);
});

t.test('a backend that is down shows what its probe saw; one that is up shows no old failure', async (t) => {
  const text = formatStatus(doc([svc({
    healthyBackends: 1,
    backends: [
      { address: '10.99.0.11', port: 8443, state: 'down', since: 0, reason: 'tls', takenOutBy: 'active', lastFailure: { detail: 'certificate has expired' } },
      { address: '10.99.0.12', port: 8443, state: 'down', since: 0, reason: 'timeout', takenOutBy: 'active', lastFailure: { detail: 'TLS handshake timed out after 2000 ms' } },
      { address: '10.99.0.13', port: 8443, state: 'up', since: 0, reason: undefined, takenOutBy: undefined, lastFailure: { detail: 'HTTP 503, expected 200-399' } },
    ],
  })]), 0);
  t.match(text, /10\.99\.0\.11:8443\s+down\s+\S+\s+tls: certificate has expired \(active check\)/);
  t.match(text, /10\.99\.0\.12:8443\s+down\s+\S+\s+timeout: TLS handshake timed out after 2000 ms \(active check\)/);
  t.notMatch(text, /HTTP 503/, 'a recovered backend\'s last failure is not its state');
});

t.test('several networks: the NICs in the header, and a service\'s named network beside it', async (t) => {
  const d = doc([
    svc({ network: 'default' }),
    svc({ key: 'default/app', name: 'app', ipam: 'pool', vip: '10.98.0.200', interface: 'eth1', network: 'vmnet' }),
  ]);
  d.networks = [{ name: 'default', interface: 'eth0', address: '10.99.0.2' }, { name: 'vmnet', interface: 'eth1', address: '10.98.0.2' }];
  const text = formatStatus(d, 0);
  t.match(text, /^networks: default on eth0 \(10\.99\.0\.2\), vmnet on eth1 \(10\.98\.0\.2\)$/m);
  t.match(text, /^default\/app: network vmnet$/m);
  t.notMatch(text, /default\/web: .*network/, 'the default network goes unsaid');
  t.notMatch(formatStatus(doc([svc({})]), 0), /^networks:/m, 'one network: no networks line');
});

t.test('the VRRP priority in use is shown, with why, when tracking moved it', async (t) => {
  const lowered = formatStatus(doc([svc({ failover: { state: 'backup', master: '10.99.0.3', priority: 140, basePriority: 200, priorityReasons: ['service default/web: 0 of 2 backends healthy, 2 needed (-60)'] } })]), 0);
  t.match(lowered, 'vrrp backup master 10.99.0.3 priority 140 of 200 (service default/web: 0 of 2 backends healthy, 2 needed (-60))');
  const plain = formatStatus(doc([svc({ failover: { state: 'master', master: '10.99.0.2', priority: 200, basePriority: 200, priorityReasons: [] } })]), 0);
  t.match(plain, 'vrrp master master 10.99.0.2');
  t.notMatch(plain, /priority 200/, 'nothing said at the configured priority');
});
