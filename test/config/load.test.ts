// Config loading: every bad fixture is rejected with the field path and value
// it names in its "# expect:" line; good files load into the typed form.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as os from 'node:os';
import { loadConfigFile, parseConfigText, formatConfigErrors } from '../../agent/config/load';

const FIX = path.resolve(__dirname, '..', '..', '..', 'test', 'config', 'fixtures');
const REPO = path.resolve(__dirname, '..', '..', '..');

t.test('every bad fixture is rejected with its expected message', async (t) => {
  const files = fs.readdirSync(path.join(FIX, 'bad')).filter((f) => f.endsWith('.yaml'));
  t.ok(files.length >= 20, `at least 20 bad fixtures (have ${files.length})`);
  for (const f of files) {
    const file = path.join(FIX, 'bad', f);
    const expect = /^# expect: (.*)$/m.exec(fs.readFileSync(file, 'utf8'))?.[1];
    t.ok(expect, `${f} declares its expected error`);
    const res = loadConfigFile(file);
    t.equal(res.ok, false, `${f} is rejected`);
    if (!res.ok) {
      const text = formatConfigErrors(res.errors, file);
      t.ok(text.includes(expect!), `${f}: message contains ${JSON.stringify(expect)}; got:\n${text}`);
      t.ok(res.errors.every((e) => e.line !== undefined), `${f}: every error has a line`);
    }
  }
});

t.test('the README\'s configuration block loads (a key documented under the wrong section fails here)', async (t) => {
  const readme = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
  const block = /```yaml\n([\s\S]*?)```/.exec(readme.slice(readme.indexOf('## A first configuration')))?.[1];
  t.ok(block, 'the "A first configuration" section has a yaml block');
  const res = parseConfigText(block ?? '');
  t.ok(res.ok, `README config block loads${res.ok ? '' : `:\n${formatConfigErrors(res.errors)}`}`);
  if (res.ok) {
    t.same(res.config.services.map((s) => s.ipam).sort(), ['dhcp', 'pool'], 'one DHCP and one pool service');
    const lines = block!.trim().split('\n').length;
    t.ok(lines <= 25, `about 20 lines (${lines})`);
  }
});

t.test('every yaml block in docs/ loads, but those marked as partial', async (t) => {
  const dir = path.join(REPO, 'docs');
  let partial = 0;
  let loaded = 0;
  for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.md'))) {
    const text = fs.readFileSync(path.join(dir, f), 'utf8');
    for (const m of text.matchAll(/(<!-- not a complete config -->\n)?```yaml\n([\s\S]*?)```/g)) {
      if (m[1]) { partial++; continue; }
      const res = parseConfigText(m[2]!);
      loaded++;
      t.ok(res.ok, `docs/${f}: block at offset ${m.index} loads${res.ok ? '' : `:\n${formatConfigErrors(res.errors)}`}`);
    }
  }
  t.ok(loaded >= 3, `${loaded} blocks loaded`);
  t.ok(partial <= 3, `few blocks marked partial (${partial})`);
});

t.test('good fixtures and the shipped examples load', async (t) => {
  const files = [
    ...fs.readdirSync(path.join(FIX, 'good')).map((f) => path.join(FIX, 'good', f)),
    ...fs.readdirSync(path.join(REPO, 'examples')).filter((f) => f.endsWith('.yaml')).map((f) => path.join(REPO, 'examples', f)),
  ];
  t.ok(files.length >= 3);
  for (const file of files) {
    const res = loadConfigFile(file);
    t.ok(res.ok, `${file} loads${res.ok ? '' : `: ${formatConfigErrors(res.errors)}`}`);
  }
});

t.test('all errors of a file are reported at once', async (t) => {
  const res = parseConfigText(`
node: { priority: 0, bogus: 1 }
dataplane: nope
services:
  - name: web
    ipam: dhcp
    ports: [{ port: 0 }]
`);
  t.equal(res.ok, false);
  if (!res.ok) {
    const paths = res.errors.map((e) => e.path).sort();
    t.same(paths, ['dataplane', 'node.bogus', 'node.priority', 'services[0].ports[0].port']);
  }
});

t.test('defaults come from one place and match Harvester', async (t) => {
  const res = parseConfigText('services:\n  - { name: web, ipam: dhcp, ports: [{ port: 80, targetPort: 8080 }], backends: [10.0.0.1] }\n', 'host-a');
  t.ok(res.ok);
  if (!res.ok) return;
  const c = res.config;
  t.equal(c.node.name, 'host-a', 'node name defaults to the hostname');
  t.equal(c.node.priority, 100);
  t.equal(c.failover.mode, 'none');
  t.equal(c.dataplane, 'auto');
  t.equal(c.stateDir, '/var/lib/lb-agent');
  t.equal(c.metrics.listen, '0.0.0.0:9477');
  t.equal(c.control.socket, '/run/lb-agent/agent.sock');
  t.equal(c.arp.refreshInterval, 10, 'held VIPs are re-announced every 10 s');
  const s = c.services[0]!;
  t.equal(s.key, 'default/web');
  t.equal(s.namespace, 'default');
  t.same(s.ports[0], { name: 'tcp-80', port: 80, protocol: 'TCP', targetPort: 8080 });
  t.same(s.backends[0], { address: '10.0.0.1', addressNum: 0x0a000001, weight: 1 });
  t.match(s.healthCheck, { enabled: true, type: 'tcp', port: 8080, successThreshold: 1, failureThreshold: 3, periodSeconds: 5, timeoutSeconds: 3 });
  t.ok(Object.isFrozen(c) && Object.isFrozen(c.services[0]) && Object.isFrozen(c.services[0]!.ports[0]), 'deeply frozen');
});

t.test('ipam defaults to pool, as in Harvester', async (t) => {
  const res = parseConfigText('pools: { range-global: 10.0.0.10-10.0.0.20 }\nservices:\n  - { name: web, ports: [{ port: 80 }] }\n');
  t.ok(res.ok);
  if (res.ok) t.equal(res.config.services[0]!.ipam, 'pool');
});

t.test('Harvester annotations map onto typed fields', async (t) => {
  const res = loadConfigFile(path.join(FIX, 'good', 'harvester-annotations.yaml'));
  t.ok(res.ok);
  if (!res.ok) return;
  const [web, admin] = res.config.services;
  t.equal(web!.ipam, 'pool');
  t.match(web!.healthCheck, { port: 8080, successThreshold: 2, failureThreshold: 4, periodSeconds: 1, timeoutSeconds: 1 });
  t.equal(admin!.primaryService, 'default/web', 'a bare primary-service name is in the same namespace');
  t.equal(admin!.ipam, 'pool', 'a secondary takes the primary\'s IPAM mode');
});

t.test('annotation equal to the typed field is not a conflict', async (t) => {
  const res = parseConfigText(`services:
  - name: web
    ipam: dhcp
    annotations: { cloudprovider.harvesterhci.io/ipam: dhcp, cloudprovider.harvesterhci.io/healthcheck-failure-threshold: "3" }
    healthCheck: { failureThreshold: 3 }
    ports: [{ port: 80 }]
`);
  t.ok(res.ok, res.ok ? '' : formatConfigErrors(res.errors));
});

t.test('pools parse into usable ranges; CIDR network and broadcast excluded', async (t) => {
  const res = parseConfigText('pools:\n  cidr-default: 10.0.0.0/30,10.0.1.0/32\n  range-global: 10.0.2.1-10.0.2.3\nservices: []\n');
  t.ok(res.ok);
  if (!res.ok) return;
  const def = res.config.pools.find((p) => p.key === 'cidr-default')!;
  t.same(def.ranges.map((r) => [r.start, r.end]), [[0x0a000001, 0x0a000002], [0x0a000100, 0x0a000100]]);
  const g = res.config.pools.find((p) => p.key === 'range-global')!;
  t.same(g.ranges.map((r) => [r.start, r.end]), [[0x0a000201, 0x0a000203]]);
});

t.test('advertInterval is rounded to RFC 5798 centiseconds', async (t) => {
  const res = parseConfigText('failover: { mode: vrrp, advertInterval: 0.123 }\nservices: []\n');
  t.ok(res.ok);
  if (res.ok) t.equal(res.config.failover.advertInterval, 0.12);
});

t.test('a missing file names the path', async (t) => {
  const res = loadConfigFile('/nonexistent/lb-agent.yaml');
  t.equal(res.ok, false);
  if (!res.ok) t.match(res.errors[0]!.message, 'cannot read /nonexistent/lb-agent.yaml: no such file');
});

t.test('an empty file is invalid: a truncated file must not remove every service', async (t) => {
  for (const text of ['', '\n', '# only a comment\n', '---\n']) {
    const res = parseConfigText(text);
    t.equal(res.ok, false, `${JSON.stringify(text)} is refused`);
    if (!res.ok) t.match(res.errors[0]!.message, 'the file is empty; write `services: []`');
  }
});

t.test('a file without a services key is invalid; services: [] is "no services" on purpose', async (t) => {
  const res = parseConfigText('node: { priority: 5 }\n');
  t.equal(res.ok, false);
  if (!res.ok) {
    t.equal(res.errors[0]!.path, 'services');
    t.match(res.errors[0]!.message, 'is required');
    t.equal(res.errors[0]!.line, 1);
  }
  const none = parseConfigText('services: []\n');
  t.ok(none.ok);
  if (none.ok) t.equal(none.config.services.length, 0);
});

const BOMB = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
  ...'bcdefghi'.split('').map((k, i) => `${k}: &${k} [${Array(9).fill(`*${'abcdefghi'[i]}`).join(',')}]`),
  'services: []', ''].join('\n');

t.test('an alias bomb is an ordinary validation error with a line, not an exception', async (t) => {
  const started = Date.now();
  const res = parseConfigText(BOMB);
  t.equal(res.ok, false);
  if (!res.ok) {
    t.equal(res.errors.length, 1);
    t.match(res.errors[0]!.message, 'YAML aliases expand too far');
    t.equal(res.errors[0]!.line, 2, 'the line of the first alias');
  }
  t.ok(Date.now() - started < 1000, `refused in ${Date.now() - started} ms`);
});

t.test('a handful of aliases is still fine', async (t) => {
  const ok = parseConfigText('services:\n  - { name: a, ipam: dhcp, ports: &p [{ port: 80 }] }\n  - { name: b, ipam: dhcp, ports: *p }\n');
  t.ok(ok.ok, ok.ok ? '' : formatConfigErrors(ok.errors));
});

t.test('loadConfigFile refuses a device, a directory and an oversized file by fstat', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-load-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.symlinkSync('/dev/zero', path.join(dir, 'zero.yaml'));
  const zero = loadConfigFile(path.join(dir, 'zero.yaml'));
  t.equal(zero.ok, false);
  if (!zero.ok) t.match(zero.errors[0]!.message, 'not a regular file');
  const d = loadConfigFile(dir);
  t.equal(d.ok, false);
  if (!d.ok) t.match(d.errors[0]!.message, 'is a directory');
  const big = path.join(dir, 'big.yaml');
  fs.writeFileSync(big, 'services: []\n');
  fs.truncateSync(big, 20_000_000);
  const b = loadConfigFile(big);
  t.equal(b.ok, false);
  if (!b.ok) t.match(b.errors[0]!.message, 'more than the 4194304-byte limit');
  const good = path.join(dir, 'good.yaml');
  fs.writeFileSync(good, 'services: []\n');
  fs.symlinkSync(good, path.join(dir, 'link.yaml'));
  t.ok(loadConfigFile(path.join(dir, 'link.yaml')).ok, 'a symlink to a regular file is fine');
});

t.test('dhcp.servers and dhcp.allowOtherSubnets: typed once, defaults from one place', async (t) => {
  const def = parseConfigText('services: []\n');
  t.ok(def.ok);
  if (def.ok) t.same([def.config.dhcp.allowOtherSubnets, def.config.dhcp.servers], [false, []]);
  const set = parseConfigText('dhcp: { allowOtherSubnets: true, servers: [10.99.0.1, 10.99.0.3] }\nservices: []\n');
  t.ok(set.ok);
  if (set.ok) t.same([set.config.dhcp.allowOtherSubnets, set.config.dhcp.servers], [true, [0x0a630001, 0x0a630003]]);
  const bad = parseConfigText('dhcp: { servers: [10.99.0.300] }\nservices: []\n');
  t.equal(bad.ok, false);
  if (!bad.ok) t.match(formatConfigErrors(bad.errors), 'dhcp.servers[0]: "10.99.0.300" is not an IPv4 address');
});

t.test('dhcp.servers6: DHCPv6 server DUIDs, lowercased; a malformed one is refused with its path', async (t) => {
  const def = parseConfigText('services: []\n');
  if (def.ok) t.same(def.config.dhcp.servers6, [], 'default: any server');
  const set = parseConfigText('dhcp: { servers6: ["00:01:00:01:2C:5E:0A:11:02:00:00:00:AA:01", "00:03:00:01:02:00:00:00:aa:02"] }\nservices: []\n');
  t.ok(set.ok);
  if (set.ok) t.same(set.config.dhcp.servers6, ['00:01:00:01:2c:5e:0a:11:02:00:00:00:aa:01', '00:03:00:01:02:00:00:00:aa:02']);
  for (const [value, why] of [['0001000102', 'no colons'], ['00:01', 'shorter than a DUID type and one octet'], ['00:01:0g:02', 'not hex'], [Array(131).fill('ab').join(':'), 'longer than 130 octets']] as const) {
    const bad = parseConfigText(`dhcp: { servers: [10.99.0.1], servers6: ["00:03:00:01:02:00:00:00:aa:02", "${value}"] }\nservices: []\n`);
    t.equal(bad.ok, false, why);
    if (!bad.ok) t.match(formatConfigErrors(bad.errors), 'dhcp.servers6[1]: ', `${why}: the error names the entry`);
    if (!bad.ok) t.match(formatConfigErrors(bad.errors), 'a DUID in hex octets separated by colons', why);
  }
});

t.test('issue 17: sourceIP, topology, backend zones, node zone/region/labelsFile and backend.vips load typed, with defaults', async (t) => {
  const res = loadConfigFile(path.join(FIX, 'good', 'zones-dsr.yaml'));
  t.ok(res.ok);
  if (!res.ok) return;
  const c = res.config;
  t.same([c.node.zone, c.node.region, c.node.labelsFile], ['zone-a', 'region-1', '/etc/lb-agent/node-labels']);
  t.same(c.backend, { vips: ['10.99.0.250'] });
  const web = c.services.find((s) => s.name === 'web')!;
  t.same([web.sourceIP, web.topology], ['preserve', 'prefer-zone']);
  t.same(web.ports[0]!.targetPort, 80, 'targetPort defaults to port, as DSR needs');
  t.same(web.backends.map((b) => [b.address, b.weight, b.zone]), [['10.99.0.11', 1, 'zone-a'], ['10.99.0.12', 2, 'zone-b']]);
  const plain = c.services.find((s) => s.name === 'plain')!;
  t.same([plain.sourceIP, plain.topology], ['snat', 'any'], 'defaults: snat as today, every zone');
  const bare = parseConfigText('services: []\n');
  t.ok(bare.ok && bare.config.node.zone === undefined && bare.config.node.labelsFile === '/etc/lb-agent/node-labels' && bare.config.backend.vips.length === 0, 'zone from the labels file by default; no backend VIPs');
});

t.test('issue 17: a backend written as a bare address has no zone (not even an undefined key)', async (t) => {
  const res = parseConfigText('pools: { range-global: 10.0.0.10-10.0.0.20 }\nservices:\n  - { name: web, ports: [{ port: 80 }], backends: [10.0.0.11] }\n');
  t.ok(res.ok);
  if (res.ok) t.notOk('zone' in res.config.services[0]!.backends[0]!);
});

t.test('PROXY protocol and proxy workers are typed (issues 17, 18)', async (t) => {
  const res = loadConfigFile(path.join(FIX, 'good', 'proxy-protocol.yaml'));
  if (!res.ok) { t.fail(formatConfigErrors(res.errors)); return; }
  const [web, mail] = res.config.services;
  t.equal(web!.proxyProtocol, 'v2');
  t.equal(web!.healthCheck.proxyProtocol, 'v2', 'the probe sends the service\'s version');
  t.equal(mail!.proxyProtocol, 'v1');
  t.equal(mail!.healthCheck.proxyProtocol, undefined, 'probes send no header unless asked');
  t.equal(res.config.proxy.workers, 2);
  const plain = parseConfigText('services: [{ name: a, ipam: dhcp, ports: [{ port: 80 }] }]');
  t.ok(plain.ok && plain.config.services[0]!.proxyProtocol === undefined && plain.config.proxy.workers === undefined, 'off and unset by default');
});

t.test('https checks: the http keys apply, TLS settings are typed, the CA file is read at load', async (t) => {
  const ca = path.join(FIX, 'ca.pem');
  const res = parseConfigText([
    'services:',
    '  - { name: plain, ipam: dhcp, ports: [{ port: 443 }], healthCheck: { type: https } }',
    `  - { name: checked, ipam: dhcp, ports: [{ port: 443 }], healthCheck: { type: https, http: { path: /healthz, expectStatus: [200, 204] }, tls: { sni: web.example, caFile: ${ca} } } }`,
  ].join('\n'));
  if (!res.ok) { t.fail(formatConfigErrors(res.errors)); return; }
  const [plain, checked] = res.config.services.map((s) => s.healthCheck);
  t.same(plain!.http, { path: '/', expectStatus: [200, 399] }, 'the HTTP check\'s defaults');
  t.same(plain!.tls, { sni: undefined, caFile: undefined, ca: undefined, caSha256: undefined }, 'no server name, no verification');
  t.same(checked!.http, { path: '/healthz', expectStatus: [200, 204] });
  t.equal(checked!.tls?.sni, 'web.example');
  t.equal(checked!.tls?.caFile, ca);
  t.equal(checked!.tls?.ca, fs.readFileSync(ca, 'utf8'), 'the PEM text, read at load');
  t.match(checked!.tls?.caSha256, /^[0-9a-f]{64}$/);
  t.equal(res.config.services[0]!.healthCheck.tls === undefined, false);
  const tcp = parseConfigText('services: [{ name: a, ipam: dhcp, ports: [{ port: 80 }] }]');
  t.ok(tcp.ok && !('tls' in tcp.config.services[0]!.healthCheck), 'a tcp check has no tls key');
});

t.test('https checks: a CA file that is a directory, holds no certificate, or a broken one is refused with the path', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-ca-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const key = path.join(dir, 'key.pem');
  fs.writeFileSync(key, '-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIB\n-----END PRIVATE KEY-----\n');
  const broken = path.join(dir, 'broken.pem');
  fs.writeFileSync(broken, `${fs.readFileSync(path.join(FIX, 'ca.pem'), 'utf8')}-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n`);
  const cases: [string, RegExp][] = [
    [dir, /cannot read .*: it is a directory/],
    [key, /holds no PEM certificate/],
    [broken, /certificate 2 of 2 does not parse/],
  ];
  for (const [file, want] of cases) {
    const res = parseConfigText(`services:\n  - name: web\n    ipam: dhcp\n    ports: [{ port: 443 }]\n    healthCheck: { type: https, tls: { caFile: ${file} } }\n`);
    t.notOk(res.ok, `${path.basename(file)} refused`);
    if (!res.ok) {
      t.equal(res.errors.length, 1);
      t.equal(res.errors[0]!.path, 'services[0].healthCheck.tls.caFile');
      t.match(res.errors[0]!.message, want);
      t.equal(res.errors[0]!.line, 5, 'with its line');
    }
  }
});

t.test('https checks: a CA file rewritten between two loads gives another digest (a reload applies it)', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-ca-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'ca.pem');
  const text = `services: [{ name: web, ipam: dhcp, ports: [{ port: 443 }], healthCheck: { type: https, tls: { caFile: ${file} } } }]`;
  const pem = fs.readFileSync(path.join(FIX, 'ca.pem'), 'utf8');
  fs.writeFileSync(file, pem);
  const a = parseConfigText(text);
  fs.writeFileSync(file, `# the same CA, with a comment\n${pem}`);
  const b = parseConfigText(text);
  t.ok(a.ok && b.ok);
  if (a.ok && b.ok) t.not(a.config.services[0]!.healthCheck.tls?.caSha256, b.config.services[0]!.healthCheck.tls?.caSha256);
  fs.rmSync(file);
  const c = parseConfigText(text);
  t.notOk(c.ok, 'a CA file removed since the last load is refused at the next one');
});

t.test('failover.track: typed with defaults, and every mistake named by its field path', async (t) => {
  const svc = (extra = ''): string => `pools: { range-global: 10.0.0.200-10.0.0.210 }\nservices:\n  - { name: web, ports: [{ port: 80 }], backends: [10.0.0.11, 10.0.0.12]${extra} }\n  - { name: api, namespace: prod, ports: [{ port: 80 }], backends: [10.0.0.13] }\n`;
  const load = (track: string, extra = ''): ReturnType<typeof parseConfigText> => parseConfigText(`failover:\n  mode: vrrp\n  track: ${track}\n${svc(extra)}`);
  const ok = load('{ interfaces: [{ name: eth1 }, { name: eth2, weight: 50, failAfter: 0.5 }], services: [{ service: web, weight: 60 }, { service: prod/api, minHealthy: 1, failAfter: 2, recoverAfter: 0 }] }');
  t.ok(ok.ok, ok.ok ? 'loads' : formatConfigErrors(ok.errors));
  if (ok.ok) {
    t.same(ok.config.failover.track, {
      interfaces: [
        { name: 'eth1', weight: undefined, failAfter: 0, recoverAfter: 0 },
        { name: 'eth2', weight: 50, failAfter: 0.5, recoverAfter: 0 },
      ],
      services: [
        { service: 'default/web', minHealthy: 1, weight: 60, failAfter: 1, recoverAfter: 5 },
        { service: 'prod/api', minHealthy: 1, weight: undefined, failAfter: 2, recoverAfter: 0 },
      ],
    }, 'a bare name is in namespace default; no weight means fault; interfaces act at once, services after 1 s and recover after 5 s');
  }
  const none = parseConfigText(`failover: { mode: vrrp }\n${svc()}`);
  t.same(none.ok && none.config.failover.track, { interfaces: [], services: [] }, 'nothing tracked by default');
  const bad: [string, string, string, string?][] = [
    ['{ services: [{ service: db }] }', 'failover.track.services[0].service', 'no service default/db in this file (services: default/web, prod/api)'],
    ['{ services: [{ service: web, weight: 0 }] }', 'failover.track.services[0].weight', '0 is not an integer (1-254)'],
    ['{ interfaces: [{ name: eth1, weight: 255 }] }', 'failover.track.interfaces[0].weight', '255 is not an integer (1-254)'],
    ['{ interfaces: [{ name: eth1 }, { name: eth1, weight: 5 }] }', 'failover.track.interfaces[1].name', 'is tracked twice (also failover.track.interfaces[0])'],
    ['{ services: [{ service: web }, { service: default/web }] }', 'failover.track.services[1].service', 'is tracked twice'],
    ['{ services: [{ service: web, minHealthy: 3 }] }', 'failover.track.services[0].minHealthy', '3 is more than the 2 backends of service default/web'],
    ['{ services: [{ service: web }] }', 'failover.track.services[0].service', 'healthCheck.enabled: false', ', healthCheck: { enabled: false }'],
    ['{ interfaces: [{ name: "a/b" }] }', 'failover.track.interfaces[0].name', 'is not an interface name'],
    ['{ interfaces: [{ weight: 5 }] }', 'failover.track.interfaces[0].name', 'is required'],
    ['{ services: [{ service: web, failAfter: -1 }] }', 'failover.track.services[0].failAfter', 'is not a number of seconds (0-3600)'],
    ['{ scripts: [] }', 'failover.track.scripts', 'unknown key "scripts" (allowed here: interfaces, services)'],
  ];
  for (const [track, path, message, extra] of bad) {
    const r = load(track, extra);
    t.equal(r.ok, false, `${track}${extra ?? ''} is refused`);
    if (!r.ok) {
      const e = r.errors.find((x) => x.path === path);
      t.ok(e && e.message.includes(message), `${path}: ${message}; got ${formatConfigErrors(r.errors)}`);
    }
  }
});

t.test('kernel: the engine\'s settings, defaults, and a reversed NAT port range', async (t) => {
  const ok = parseConfigText('services: []\n');
  t.ok(ok.ok);
  if (ok.ok) t.same(ok.config.kernel, { engine: 'auto', flowEntries: 65536, natPorts: [61001, 65535] }, 'the eBPF engine where it loads, by default');
  const set = parseConfigText('kernel: { engine: auto, flowEntries: 200000, natPorts: [62000, 63000] }\nservices: []\n');
  t.ok(set.ok && set.config.kernel.engine === 'auto' && set.config.kernel.flowEntries === 200000 && set.config.kernel.natPorts[1] === 63000);
  const rev = parseConfigText('kernel: { natPorts: [63000, 62000] }\nservices: []\n');
  t.notOk(rev.ok);
  if (!rev.ok) t.match(formatConfigErrors(rev.errors), /kernel\.natPorts.*\[63000, 62000\] is reversed/);
  const small = parseConfigText('kernel: { flowEntries: 10 }\nservices: []\n');
  t.notOk(small.ok, 'flowEntries below 1024 refused');
});

t.test('a reparse takes unchanged services again: their objects kept, a changed one validated and built anew, checks across services over all', async (t) => {
  const file = (svcs: string[], pools = '10.0.0.10-10.0.0.40'): string => `pools: { range-global: ${pools} }\nservices:\n${svcs.map((s) => `  - ${s}`).join('\n')}\n`;
  const svc = (i: number, extra = '', backends = `[10.0.1.${i}, 10.0.2.${i}]`): string => `{ name: s${i}, ipam: pool, ports: [{ port: 80, targetPort: 8080 }], backends: ${backends}${extra} }`;
  const base = [0, 1, 2, 3].map((i) => svc(i));
  const first = parseConfigText(file(base));
  if (!first.ok) throw new Error(formatConfigErrors(first.errors));
  t.equal(first.reuse?.taken, 0, 'a first parse takes nothing');
  const same = parseConfigText(file(base), undefined, first.reuse);
  if (!same.ok) throw new Error(formatConfigErrors(same.errors));
  t.equal(same.reuse?.taken, 4, 'the same file: every service taken again');
  t.ok(same.config.services.every((s, i) => s === first.config.services[i]), 'the same ServiceSpec objects');
  t.ok(Object.isFrozen(same.config.services[0]) && Object.isFrozen(same.config), 'and frozen');

  // One backend of s2 changed: s2 alone is built again.
  const edited = [...base];
  edited[2] = svc(2, '', '[10.0.1.2, 10.0.3.2]');
  const one = parseConfigText(file(edited), undefined, same.reuse);
  if (!one.ok) throw new Error(formatConfigErrors(one.errors));
  t.equal(one.reuse?.taken, 3, 'three taken again');
  t.ok([0, 1, 3].every((i) => one.config.services[i] === first.config.services[i]), 'the unchanged ones keep their objects');
  t.not(one.config.services[2], first.config.services[2], 'the changed one is a new object');
  t.same(one.config.services[2]!.backends.map((b) => b.address), ['10.0.1.2', '10.0.3.2'], 'with the new backend');
  t.same(one.config, parseConfigText(file(edited)).ok ? (parseConfigText(file(edited)) as { config: unknown }).config : undefined, 'what a parse from nothing gives');

  // The edit asks for an IP another, unchanged, service holds: refused, naming the edited entry.
  const clash = [...base];
  clash[0] = svc(0, ', loadBalancerIP: 10.0.0.20');
  clash[3] = svc(3, ', loadBalancerIP: 10.0.0.20');
  const withIp = parseConfigText(file([clash[0], base[1]!, base[2]!, base[3]!]));
  if (!withIp.ok) throw new Error(formatConfigErrors(withIp.errors));
  const refused = parseConfigText(file(clash), undefined, withIp.reuse);
  t.notOk(refused.ok, 'a conflict across services is still refused');
  if (!refused.ok) t.match(formatConfigErrors(refused.errors), /^6: services\[3\]\.loadBalancerIP: 10\.0\.0\.20 is also asked for by default\/s0/m, 'with the edited entry\'s path and line');
  // A duplicate name made by an edit, among taken services.
  const dup = parseConfigText(file([...base, svc(1)]), undefined, same.reuse);
  t.notOk(dup.ok);
  if (!dup.ok) t.match(formatConfigErrors(dup.errors), /services\[4\]\.name: "default\/s1" is defined twice \(also services\[1\]\)/);
  // A schema error in the edited entry names the file's index, not its place among the entries validated.
  const bad = [...base];
  bad[3] = svc(3).replace('port: 80,', 'port: 70000,');
  const schema = parseConfigText(file(bad), undefined, same.reuse);
  t.notOk(schema.ok);
  if (!schema.ok) t.match(formatConfigErrors(schema.errors), /^6: services\[3\]\.ports\[0\]\.port: 70000/m);
  // Another section changed (the pool): nothing is taken again, so its effect reaches the unchanged services.
  const kept = [clash[0], base[1]!, base[2]!, base[3]!];
  const narrowed = parseConfigText(file(kept, '10.0.0.10-10.0.0.15'), undefined, withIp.reuse);
  t.notOk(narrowed.ok, 'an unchanged service\'s IP outside the narrowed pool');
  if (!narrowed.ok) t.match(formatConfigErrors(narrowed.errors), /^3: services\[0\]\.loadBalancerIP: service default\/s0: 10\.0\.0\.20 is not in pool/m);
  const wider = parseConfigText(file(base, '10.0.0.10-10.0.0.50'), undefined, same.reuse);
  t.equal(wider.ok && wider.reuse?.taken, 0, 'a pool changed: nothing taken again');
  // What an entry keeps for the next parse: its validated form and what it built, no paths of its own.
  const entry = [...same.reuse!.byText.values()][0]!;
  t.same(Object.keys(entry), ['raw', 'ipam', 'ipamGiven', 'hc', 'ports', 'backends', 'plan', 'specs'], 'a thousand services keep no path of each backend');
});

t.test('a reordered list takes every service again, in the file\'s new order, and an edit among them keeps its new index in errors', async (t) => {
  const file = (svcs: string[]): string => `pools: { range-global: 10.0.0.10-10.0.0.40 }\nservices:\n${svcs.map((s) => `  - ${s}`).join('\n')}\n`;
  const svc = (i: number, port = 80): string => `{ name: s${i}, ipam: pool, ports: [{ port: ${port}, targetPort: 8080 }], backends: [10.0.1.${i}] }`;
  const first = parseConfigText(file([0, 1, 2, 3].map((i) => svc(i))));
  if (!first.ok) throw new Error(formatConfigErrors(first.errors));
  const moved = parseConfigText(file([3, 0, 2, 1].map((i) => svc(i))), undefined, first.reuse);
  if (!moved.ok) throw new Error(formatConfigErrors(moved.errors));
  t.equal(moved.reuse?.taken, 4, 'every entry taken again');
  t.same(moved.config.services.map((s) => s.name), ['s3', 's0', 's2', 's1'], 'in the new order');
  t.ok(moved.config.services.every((s) => s === first.config.services.find((x) => x.name === s.name)), 'each its own object');
  const bad = parseConfigText(file([svc(3), svc(0), svc(2), svc(1, 0)]), undefined, moved.reuse);
  t.notOk(bad.ok);
  if (!bad.ok) t.match(formatConfigErrors(bad.errors), /^6: services\[3\]\.ports\[0\]\.port: 0/m, 'the edited entry named by its new index and line');
});
