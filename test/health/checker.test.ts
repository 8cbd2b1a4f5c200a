// Unit tests of the health checker with an injected probe and ManualClock:
// first probe at once and unknown -> up, thresholds counted in probes, checks
// disabled, shared targets probed once with per-service thresholds, periods
// and timeouts, reload keeping state, passive checks, 'change' events, metrics,
// a backend gone down bringing its up siblings' probes forward.
// Checks of 1,000 services spread over the period, kept there by a reload.
// Then the checker as the daemon builds it, on loopback: TCP probes run on the
// native batch prober (a test that fails if they silently fall back to Node
// sockets), the fallback says so, and probes that find no descriptor
// (EMFILE, in a child process) blame no backend.
import t from 'tap';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { spawn } from 'node:child_process';
import { Writable } from 'node:stream';
import { Registry } from 'prom-client';
import { createLogger } from '../../agent/log';
import { isLbError } from '../../agent/errors';
import type { NativeAddon } from '../../agent/native/native';
import { ManualClock } from '../../agent/clock';
import { HealthChecker, targetKey } from '../../agent/health/checker';
import { NativeTcpProber } from '../../agent/health/native-probe';
import type { Probe, ProbeResult, ProbeTarget } from '../../agent/health/probe';
import { service, healthCheck } from './spec';
import { listen } from './loopback';

const flush = (): Promise<void> => new Promise((r) => setImmediate(r));

const OK: ProbeResult = { ok: true, durationMs: 1 };
const REFUSED: ProbeResult = { ok: false, reason: 'refused', detail: 'ECONNREFUSED', durationMs: 1 };

interface Call { address: string; port: number; type: string; timeoutMs: number; at: number }

function setup(opts: { maxInFlight?: number } = {}) {
  const clock = new ManualClock(0);
  const registry = new Registry();
  const results = new Map<string, ProbeResult>();
  const calls: Call[] = [];
  const probe: Probe = async (target: ProbeTarget, o) => {
    calls.push({ address: target.address, port: target.port, type: target.type, timeoutMs: o.timeoutMs, at: clock.now() });
    return results.get(`${target.address}:${target.port}`) ?? results.get(target.address) ?? OK;
  };
  const hc = new HealthChecker({ clock, registry, probe, jitter: 0, random: () => 0.5, maxInFlight: opts.maxInFlight ?? 64 });
  const changes: [string, string, boolean][] = [];
  hc.on('change', (s, a, up) => changes.push([s, a, up]));
  const advance = async (ms: number, stepMs = 10): Promise<void> => {
    for (let left = ms; left > 0; left -= stepMs) { clock.advance(Math.min(stepMs, left)); await flush(); }
    await flush();
  };
  const addrs = (key: string): string[] => hc.healthy(key).map((b) => b.address);
  const probesOf = (address: string): Call[] => calls.filter((c) => c.address === address);
  return { clock, registry, results, calls, hc, changes, advance, addrs, probesOf };
}

/** A metric sample from the registry's text, by name and label subset. */
async function sample(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  const text = await registry.metrics();
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

t.test('backends start unknown (no traffic), are probed at once on start, and go up on the first success', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2'], healthCheck: { successThreshold: 3 } })]);
  t.same(s.addrs('default/web'), [], 'unknown is not healthy');
  t.same(s.hc.status('default/web').map((b) => b.state), ['unknown', 'unknown']);
  await s.advance(100);
  t.equal(s.calls.length, 0, 'no probe before start');
  s.hc.start();
  await s.advance(1);
  t.same(s.calls.map((c) => [c.address, c.port, c.timeoutMs, c.at]), [['10.0.0.1', 8080, 3000, 100], ['10.0.0.2', 8080, 3000, 100]], 'both probed at once, on the health port, with the timeout');
  t.same(s.addrs('default/web'), ['10.0.0.1', '10.0.0.2'], 'up after the first success despite successThreshold 3');
  t.same(s.changes, [['default/web', '10.0.0.1', true], ['default/web', '10.0.0.2', true]]);
  const st = s.hc.status('default/web')[0]!;
  t.equal(st.state, 'up');
  t.equal(st.since, s.clock.wallNow());
  t.equal(st.consecutiveSuccesses, 1);
  t.equal(st.checked, true);
  s.hc.stop();
});

t.test('down after exactly failureThreshold failed probes, up after exactly successThreshold good ones', async (t) => {
  for (const [succ, fail] of [[1, 3], [2, 2], [3, 1]] as const) {
    const s = setup();
    s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { successThreshold: succ, failureThreshold: fail, periodSeconds: 1 } })]);
    s.hc.start();
    await s.advance(1);
    t.same(s.addrs('default/web'), ['10.0.0.1']);
    s.results.set('10.0.0.1', REFUSED);
    const n0 = s.calls.length;
    let downAfter = -1;
    s.hc.once('change', () => { downAfter = s.calls.length - n0; });
    await s.advance(10_000, 50);
    t.equal(downAfter, fail, `s=${succ} f=${fail}: down after ${fail} failed probes`);
    const st = s.hc.status('default/web')[0]!;
    t.equal(st.state, 'down');
    t.equal(st.reason, 'refused');
    t.equal(st.takenOutBy, 'active');
    t.equal(st.lastFailure?.detail, 'ECONNREFUSED');
    s.results.set('10.0.0.1', OK);
    const n1 = s.calls.length;
    let upAfter = -1;
    s.hc.once('change', () => { upAfter = s.calls.length - n1; });
    await s.advance(10_000, 50);
    t.equal(upAfter, succ, `s=${succ} f=${fail}: up after ${succ} good probes`);
    t.same(s.changes.map((c) => c[2]), [true, false, true]);
    s.hc.stop();
  }
});

t.test('checks disabled: every backend is healthy and nothing is probed', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2'], healthCheck: { enabled: false } })]);
  s.hc.start();
  await s.advance(20_000, 100);
  t.equal(s.calls.length, 0);
  t.same(s.addrs('default/web'), ['10.0.0.1', '10.0.0.2']);
  t.same(s.hc.status('default/web').map((b) => [b.state, b.checked, b.healthy]), [['up', false, true], ['up', false, true]]);
  t.notOk(s.hc.reportConnectFailure('default/web', '10.0.0.1'), 'passive reports are ignored');
  t.equal(await sample(s.registry, 'lbagent_health_backend_up', { backend: '10.0.0.1:8080' }), 1);
  s.hc.stop();
});

t.test('a backend shared by services is probed once; each service keeps its own thresholds', async (t) => {
  const s = setup();
  s.hc.update([
    service({ name: 'a', backends: ['10.0.0.1'], healthCheck: { failureThreshold: 1, periodSeconds: 1 } }),
    service({ name: 'b', namespace: 'other', backends: ['10.0.0.1', '10.0.0.2'], healthCheck: { failureThreshold: 3, periodSeconds: 1 } }),
  ]);
  s.hc.start();
  await s.advance(5000, 50);
  const shared = s.probesOf('10.0.0.1');
  t.ok(shared.length >= 5 && shared.length <= 6, `shared backend probed once per period (${shared.length} in 5 s), not once per service`);
  t.equal(s.hc.schedulerStats().targets, 2);
  s.results.set('10.0.0.1', REFUSED);
  const n0 = s.probesOf('10.0.0.1').length;
  await s.advance(1000, 50);
  t.equal(s.probesOf('10.0.0.1').length - n0, 1);
  t.same(s.addrs('default/a'), [], 'a (failureThreshold 1) is down after one failure');
  t.same(s.addrs('other/b'), ['10.0.0.1', '10.0.0.2'], 'b (failureThreshold 3) still up');
  await s.advance(2000, 50);
  t.same(s.addrs('other/b'), ['10.0.0.2'], 'b down after its third failure of the same probe stream');
  s.hc.stop();
});

t.test('shared probe: smallest period, largest timeout; each service takes results at its own period and timeout', async (t) => {
  const s = setup();
  s.hc.update([
    service({ name: 'fast', backends: ['10.0.0.1'], healthCheck: { failureThreshold: 2, periodSeconds: 1, timeoutSeconds: 0.5 } }),
    service({ name: 'slow', backends: ['10.0.0.1'], healthCheck: { failureThreshold: 2, periodSeconds: 3, timeoutSeconds: 2 } }),
  ]);
  s.hc.start();
  await s.advance(1);
  t.equal(s.calls[0]!.timeoutMs, 2000, 'probe timeout is the largest');
  // Answers in 1.5 s: a success for "slow" (2 s), a timeout for "fast" (0.5 s).
  s.results.set('10.0.0.1', { ok: true, durationMs: 1500 });
  const t0 = s.clock.now();
  let fastDown = -1;
  let slowDown = -1;
  s.hc.on('change', (key, _a, up) => {
    if (up) return;
    if (key === 'default/fast') fastDown = s.clock.now() - t0;
    if (key === 'default/slow') slowDown = s.clock.now() - t0;
  });
  await s.advance(8000, 50);
  t.ok(fastDown > 0 && fastDown <= 3000, `fast down after two 1 s periods (${fastDown} ms)`);
  t.equal(slowDown, -1, 'slow is fine with 1.5 s answers');
  t.equal(s.hc.status('default/fast')[0]!.reason, 'timeout');
  t.match(s.hc.status('default/fast')[0]!.lastFailure?.detail, /over the 500 ms timeout/);
  s.results.set('10.0.0.1', REFUSED);
  const t1 = s.clock.now();
  let slowAt = -1;
  s.hc.on('change', (key, _a, up) => { if (key === 'default/slow' && !up) slowAt = s.clock.now() - t1; });
  await s.advance(10_000, 50);
  t.ok(slowAt >= 3000 && slowAt <= 7000, `slow takes every third probe: down after 2 x 3 s, not 2 x 1 s (${slowAt} ms)`);
  s.hc.stop();
});

t.test('reload: unchanged backends keep state and schedule; changed checks start over; removed ones stop', async (t) => {
  const s = setup();
  const v1 = [service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2', '10.0.0.3'], healthCheck: { periodSeconds: 1, failureThreshold: 2 } })];
  s.hc.update(v1);
  s.hc.start();
  s.results.set('10.0.0.2', REFUSED);
  await s.advance(3000, 50);
  t.same(s.addrs('default/web'), ['10.0.0.1', '10.0.0.3']);
  const before = s.hc.status('default/web');
  const n0 = s.calls.length;
  // Same checks; a weight changes, 10.0.0.3 goes away, 10.0.0.4 comes in.
  s.hc.update([service({ name: 'web', backends: [{ address: '10.0.0.1', weight: 5 }, '10.0.0.2', '10.0.0.4'], healthCheck: { periodSeconds: 1, failureThreshold: 2 } })]);
  await s.advance(1);
  t.same(s.calls.slice(n0).map((c) => c.address), ['10.0.0.4'], 'only the new backend is probed at once');
  const after = s.hc.status('default/web');
  t.same(after.map((b) => [b.address, b.state]), [['10.0.0.1', 'up'], ['10.0.0.2', 'down'], ['10.0.0.4', 'up']]);
  t.equal(after[0]!.since, before[0]!.since, 'state and its time kept');
  t.equal(after[1]!.consecutiveFailures >= before[1]!.consecutiveFailures, true);
  t.equal(s.hc.healthy('default/web')[0]!.weight, 5, 'the new weight is served');
  t.same(s.changes.filter((c) => c[1] === '10.0.0.1'), [['default/web', '10.0.0.1', true]], 'no change event for a kept backend');
  await s.advance(3000, 50);
  t.equal(s.probesOf('10.0.0.3').filter((c) => c.at > s.clock.now() - 2500).length, 0, 'removed backend no longer probed');
  t.equal(await sample(s.registry, 'lbagent_health_backend_up', { backend: '10.0.0.3:8080' }), undefined, 'its series are gone');
  // The health port changes: a new check, so unknown until probed (at once).
  const n1 = s.calls.length;
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { port: 9090, periodSeconds: 1, failureThreshold: 2 } })]);
  t.same(s.addrs('default/web'), [], 'a changed check starts unknown');
  t.same(s.changes.slice(-1), [['default/web', '10.0.0.1', false]], 'and says so');
  await s.advance(1);
  t.same(s.calls.slice(n1).map((c) => [c.address, c.port]), [['10.0.0.1', 9090]]);
  t.same(s.addrs('default/web'), ['10.0.0.1']);
  t.equal(s.hc.schedulerStats().targets, 1, 'old targets removed');
  // Remove the service.
  s.hc.update([]);
  t.same(s.hc.status('default/web'), []);
  t.equal(s.hc.schedulerStats().keys, 0);
  s.hc.stop();
});

t.test('reload: new thresholds apply from the next result without losing the state', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 1, failureThreshold: 5 } })]);
  s.hc.start();
  await s.advance(1);
  s.results.set('10.0.0.1', REFUSED);
  await s.advance(2600, 50); // grid: 0, then 1500 (phase 0.5), 2500, 3500 ...
  t.equal(s.hc.status('default/web')[0]!.consecutiveFailures, 2);
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 1, failureThreshold: 3 } })]);
  t.equal(s.hc.status('default/web')[0]!.state, 'up');
  await s.advance(1000, 50);
  t.equal(s.hc.status('default/web')[0]!.state, 'down', 'third failure, counted across the reload');
  s.hc.stop();
});

t.test('a service joining a probed backend gets an answer at once; enabling/disabling checks emits changes', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'a', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 10 } })]);
  s.hc.start();
  await s.advance(3000, 50);
  const n0 = s.calls.length;
  const sinceA = s.hc.status('default/a')[0]!.since;
  s.hc.update([
    service({ name: 'a', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 10 } }),
    service({ name: 'b', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 10, enabled: false } }),
  ]);
  t.same(s.addrs('default/b'), ['10.0.0.1'], 'unchecked: healthy at once');
  s.hc.update([
    service({ name: 'a', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 10 } }),
    service({ name: 'b', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 10 } }),
  ]);
  t.same(s.changes.slice(-1), [['default/b', '10.0.0.1', false]], 'enabling checks takes it out until probed');
  await s.advance(1);
  t.equal(s.calls.length - n0, 1, 'one probe at once for the new subscriber');
  t.same(s.addrs('default/b'), ['10.0.0.1']);
  t.same(s.changes.slice(-1), [['default/b', '10.0.0.1', true]]);
  t.equal(s.hc.status('default/a')[0]!.since, sinceA, 'a kept its state');
  t.equal(s.hc.status('default/a')[0]!.state, 'up');
  s.hc.stop();
});

t.test('passive: N connect failures take a backend out at once; only the active probe brings it back', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2'], healthCheck: { periodSeconds: 5, successThreshold: 2, passiveFailures: 3 } })]);
  s.hc.start();
  await s.advance(1);
  t.ok(s.hc.reportConnectFailure('default/web', '10.0.0.1', 'refused', 'ECONNREFUSED'));
  s.hc.reportConnectFailure('default/web', '10.0.0.1', 'refused');
  s.hc.reportConnectSuccess('default/web', '10.0.0.1');
  s.hc.reportConnectFailure('default/web', '10.0.0.1', 'refused');
  s.hc.reportConnectFailure('default/web', '10.0.0.1', 'refused');
  t.same(s.addrs('default/web'), ['10.0.0.1', '10.0.0.2'], 'a success in between resets the count');
  s.hc.reportConnectFailure('default/web', '10.0.0.1', 'timeout');
  t.same(s.addrs('default/web'), ['10.0.0.2'], 'down at once on the third consecutive failure');
  t.same(s.changes.slice(-1), [['default/web', '10.0.0.1', false]]);
  const st = s.hc.status('default/web')[0]!;
  t.equal(st.takenOutBy, 'passive');
  t.equal(st.reason, 'timeout');
  for (let i = 0; i < 10; i++) s.hc.reportConnectSuccess('default/web', '10.0.0.1');
  t.same(s.addrs('default/web'), ['10.0.0.2'], 'passive successes do not bring it back');
  await s.advance(8000, 50); // grid: 0, then 7500 (phase 0.5), 12500
  t.same(s.addrs('default/web'), ['10.0.0.2'], 'one good probe is not enough with successThreshold 2');
  t.equal(s.hc.status('default/web')[0]!.consecutiveSuccesses, 1);
  await s.advance(5000, 50);
  t.same(s.addrs('default/web'), ['10.0.0.1', '10.0.0.2'], 'back after two good probes');
  t.equal(s.hc.status('default/web')[0]!.takenOutBy, undefined);
  t.notOk(s.hc.reportConnectFailure('default/nope', '10.0.0.1'), 'unknown service');
  t.notOk(s.hc.reportConnectFailure('default/web', '10.9.9.9'), 'unknown backend');
  s.hc.stop();
});

t.test('passive checks off with passiveFailures 0', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { passiveFailures: 0 } })]);
  s.hc.start();
  await s.advance(1);
  for (let i = 0; i < 50; i++) s.hc.reportConnectFailure('default/web', '10.0.0.1', 'refused');
  t.same(s.addrs('default/web'), ['10.0.0.1']);
  s.hc.stop();
});

t.test('metrics: up gauge, transitions, probe durations by result', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', namespace: 'shop', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 1, failureThreshold: 2 } })]);
  const labels = { service: 'web', namespace: 'shop', backend: '10.0.0.1:8080' };
  t.equal(await sample(s.registry, 'lbagent_health_backend_up', labels), 0, 'unknown reads 0');
  t.equal(await sample(s.registry, 'lbagent_health_transitions_total', { to: 'up' }), 0);
  s.hc.start();
  await s.advance(1);
  t.equal(await sample(s.registry, 'lbagent_health_backend_up', labels), 1);
  t.equal(await sample(s.registry, 'lbagent_health_transitions_total', { to: 'up' }), 1);
  s.results.set('10.0.0.1', REFUSED);
  await s.advance(3000, 50);
  t.equal(await sample(s.registry, 'lbagent_health_backend_up', labels), 0);
  t.equal(await sample(s.registry, 'lbagent_health_transitions_total', { to: 'down' }), 1);
  s.results.set('10.0.0.1', OK);
  await s.advance(1000, 50);
  t.equal(await sample(s.registry, 'lbagent_health_transitions_total', { to: 'up' }), 2);
  const okCount = await sample(s.registry, 'lbagent_health_probe_duration_seconds_count', { result: 'ok' });
  const refusedCount = await sample(s.registry, 'lbagent_health_probe_duration_seconds_count', { result: 'refused' });
  t.equal((okCount ?? 0) + (refusedCount ?? 0), s.calls.length, 'one observation per probe');
  t.ok((refusedCount ?? 0) >= 2);
  t.equal(await sample(s.registry, 'lbagent_health_probes_in_flight'), 0);
  s.hc.stop();
});

t.test('stop: no more probes, late results ignored, state kept; a throwing listener does not break probing', async (t) => {
  const s = setup();
  let release: (() => void) | undefined;
  const clock = new ManualClock(0);
  const registry = new Registry();
  let calls = 0;
  const hc = new HealthChecker({
    clock, registry, jitter: 0,
    probe: () => { calls++; return new Promise<ProbeResult>((r) => { release = () => r(REFUSED); }); },
  });
  hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { failureThreshold: 1 } })]);
  hc.start();
  clock.advance(1);
  await flush();
  t.equal(calls, 1);
  hc.stop();
  release!();
  await flush();
  t.equal(hc.status('default/web')[0]!.state, 'unknown', 'a result that lands after stop is ignored');
  clock.advance(60_000);
  await flush();
  t.equal(calls, 1);
  // Listener errors are logged, not thrown into the scheduler.
  s.hc.on('change', () => { throw new Error('listener bug'); });
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { periodSeconds: 1 } })]);
  s.hc.start();
  await s.advance(3000, 50);
  t.ok(s.calls.length >= 3, 'probing continues');
  t.same(s.addrs('default/web'), ['10.0.0.1']);
  s.hc.stop();
});

t.test('target keys: same address/port/check share; http path and range are part of the key', async (t) => {
  const tcp = healthCheck({ port: 80 });
  const http = healthCheck({ port: 80, type: 'http', http: { path: '/a', expectStatus: [200, 299] } });
  t.equal(targetKey(tcp, '10.0.0.1'), targetKey(healthCheck({ port: 80, failureThreshold: 9 }), '10.0.0.1'));
  t.not(targetKey(tcp, '10.0.0.1'), targetKey(http, '10.0.0.1'));
  t.not(targetKey(http, '10.0.0.1'), targetKey(healthCheck({ port: 80, type: 'http', http: { path: '/b', expectStatus: [200, 299] } }), '10.0.0.1'));
  t.not(targetKey(tcp, '10.0.0.1'), targetKey(healthCheck({ port: 81 }), '10.0.0.1'));
  // Issue 17: a probe that sends a PROXY header is another probe (a backend may answer it differently).
  t.not(targetKey(tcp, '10.0.0.1'), targetKey(healthCheck({ port: 80, proxyProtocol: 'v2' }), '10.0.0.1'));
  t.not(targetKey(healthCheck({ port: 80, proxyProtocol: 'v1' }), '10.0.0.1'), targetKey(healthCheck({ port: 80, proxyProtocol: 'v2' }), '10.0.0.1'));
});

t.test('target keys: an https check is its own probe; its server name and CA content are part of the key', async (t) => {
  const tls = (sni: string | undefined, caSha256: string | undefined) => ({ sni, caFile: caSha256 && '/ca.pem', ca: caSha256 && 'PEM', caSha256 });
  const https = (sni?: string, ca?: string) => healthCheck({ port: 443, type: 'https', http: { path: '/', expectStatus: [200, 399] }, tls: tls(sni, ca) });
  const http = healthCheck({ port: 443, type: 'http', http: { path: '/', expectStatus: [200, 399] } });
  t.not(targetKey(http, '10.0.0.1'), targetKey(https(), '10.0.0.1'), 'http and https on one port are two probes');
  t.equal(targetKey(https('a.lab', 'aa'), '10.0.0.1'), targetKey(https('a.lab', 'aa'), '10.0.0.1'));
  t.not(targetKey(https('a.lab', 'aa'), '10.0.0.1'), targetKey(https('b.lab', 'aa'), '10.0.0.1'), 'another server name');
  t.not(targetKey(https('a.lab', 'aa'), '10.0.0.1'), targetKey(https('a.lab', 'bb'), '10.0.0.1'), 'a CA file whose content changed');
  t.not(targetKey(https('a.lab', 'aa'), '10.0.0.1'), targetKey(https('a.lab'), '10.0.0.1'), 'verification turned off');
});

t.test('https targets share one TLS context per distinct CA, made once and dropped with the last target', async (t) => {
  const { hc, calls, advance } = setup({ maxInFlight: 1000 });
  const tls = (ca: string | undefined) => ({ sni: undefined, caFile: ca && `/${ca}.pem`, ca: ca && fakePem(ca), caSha256: ca });
  const svc = (name: string, ca: string | undefined, n: number) => service({
    name, backends: Array.from({ length: n }, (_, i) => `10.1.${name.length}.${i + 1}`),
    healthCheck: { port: 443, type: 'https', http: { path: '/', expectStatus: [200, 399] }, tls: tls(ca) },
  });
  hc.update([svc('a', 'ca1', 200), svc('bb', 'ca1', 200), svc('ccc', 'ca2', 100), svc('dddd', undefined, 100)]);
  t.equal(hc.tlsContexts(), 3, '600 targets, three contexts: ca1, ca2 and none');
  hc.start();
  await advance(1);
  t.equal(calls.filter((c) => c.type === 'https').length, 600, 'every target probed');
  hc.update([svc('a', 'ca1', 200), svc('dddd', undefined, 100)]);
  t.equal(hc.tlsContexts(), 2, 'ca2 gone with its last target; ca1 kept by the targets left');
  hc.update([]);
  t.equal(hc.tlsContexts(), 0);
  hc.stop();
});

t.test('https probes wait for one of maxTlsInFlight places; a waiting run whose target goes never starts', async (t) => {
  const clock = new ManualClock(0);
  const pending: { address: string; resolve: (r: ProbeResult) => void }[] = [];
  const probe: Probe = (target) => new Promise<ProbeResult>((resolve) => pending.push({ address: target.address, resolve }));
  const hc = new HealthChecker({ clock, registry: new Registry(), probe, jitter: 0, random: () => 0.5, maxInFlight: 64, maxTlsInFlight: 2 });
  const https = (name: string, backends: string[]) => service({ name, backends, healthCheck: { port: 443, type: 'https', http: { path: '/', expectStatus: [200, 399] } } });
  hc.update([https('a', ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4']), service({ name: 'plain', backends: ['10.0.1.1', '10.0.1.2', '10.0.1.3'] })]);
  hc.start();
  clock.advance(1);
  await flush();
  const started = (): string[] => pending.map((p) => p.address);
  t.same(started().filter((a) => a.startsWith('10.0.0.')), ['10.0.0.1', '10.0.0.2'], 'two https probes at once');
  t.equal(started().filter((a) => a.startsWith('10.0.1.')).length, 3, 'tcp probes are not held back by them');
  hc.update([https('a', ['10.0.0.1', '10.0.0.2', '10.0.0.4']), service({ name: 'plain', backends: ['10.0.1.1', '10.0.1.2', '10.0.1.3'] })]);
  pending.find((p) => p.address === '10.0.0.1')!.resolve(OK);
  await flush();
  t.same(started().filter((a) => a.startsWith('10.0.0.')), ['10.0.0.1', '10.0.0.2', '10.0.0.4'], 'a place freed: the next waiting one starts; the removed one never');
  pending.find((p) => p.address === '10.0.0.2')!.resolve(REFUSED);
  pending.find((p) => p.address === '10.0.0.4')!.resolve(OK);
  await flush();
  t.same(hc.healthy('default/a').map((b) => b.address), ['10.0.0.1', '10.0.0.4']);
  t.equal(pending.length, 6, 'nothing else started');
  hc.stop();
});

/** A checker whose targets get the phases given, in the order they are added (then 0.5). */
function phased(phases: number[]) {
  const clock = new ManualClock(0);
  const results = new Map<string, ProbeResult>();
  const calls: Call[] = [];
  const probe: Probe = async (target: ProbeTarget, o) => {
    calls.push({ address: target.address, port: target.port, type: target.type, timeoutMs: o.timeoutMs, at: clock.now() });
    return results.get(target.address) ?? OK;
  };
  const queue = [...phases];
  const hc = new HealthChecker({ clock, registry: new Registry(), probe, jitter: 0, random: () => queue.shift() ?? 0.5, maxInFlight: 64 });
  const downs: [string, string, number][] = [];
  hc.on('verdict', (svc, address, state) => { if (state === 'down') downs.push([svc, address, clock.now()]); });
  const advance = async (ms: number): Promise<void> => {
    for (let left = ms; left > 0; left -= 10) { clock.advance(Math.min(10, left)); await flush(); }
    await flush();
  };
  const at = (address: string): number[] => calls.filter((c) => c.address === address).map((c) => c.at);
  return { clock, results, hc, downs, advance, at };
}

t.test('a backend gone down: its siblings up with no failure counted are probed at once, outside their grid', async (t) => {
  // Phases: A at 100 ms into each second, B at 800 ms, C at 500 ms.
  const s = phased([0.1, 0.8, 0.5]);
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2', '10.0.0.3'], healthCheck: { periodSeconds: 1, timeoutSeconds: 0.2, failureThreshold: 1 } })]);
  s.hc.start();
  await s.advance(1450);
  t.same(s.hc.healthy('default/web').length, 3, 'all three up');
  // This node loses every backend at 1,450 ms (unreachable: each probe fails at once).
  for (const a of ['10.0.0.1', '10.0.0.2', '10.0.0.3']) s.results.set(a, { ok: false, reason: 'unreachable', detail: 'EHOSTUNREACH', durationMs: 0 });
  await s.advance(700);
  t.same(s.downs.map(([, a, when]) => [a, when]), [['10.0.0.3', 1500], ['10.0.0.1', 1500], ['10.0.0.2', 1500]],
    'C failed on its grid point at 1,500 ms; A and B, probed at once, were down with it (not at 1,800 and 2,100)');
  t.same(s.hc.healthy('default/web'), [], 'none left');
  t.same(['10.0.0.1', '10.0.0.2', '10.0.0.3'].map((a) => s.at(a).filter((x) => x === 1500).length), [1, 1, 1], 'A and B going down as well probed nothing more: once per period');
  await s.advance(2000);
  t.same(s.at('10.0.0.2').filter((x) => x > 1000), [1500, 1800, 2800, 3800].filter((x) => x <= s.clock.now()), 'B\'s grid kept its phase around the extra probe');
});

t.test('siblings: a failure already counted, a failure threshold above 1, and once per period at most', async (t) => {
  const s = phased([0.1, 0.8, 0.5]);
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2', '10.0.0.3'], healthCheck: { periodSeconds: 1, timeoutSeconds: 0.2, failureThreshold: 2 } })]);
  s.hc.start();
  await s.advance(1050);
  const fail: ProbeResult = { ok: false, reason: 'refused', detail: 'ECONNREFUSED', durationMs: 0 };
  // A fails from here; C fails once at 1,500 (one failure counted, still up).
  s.results.set('10.0.0.1', fail);
  await s.advance(400);
  s.results.set('10.0.0.3', fail);
  await s.advance(60);
  s.results.delete('10.0.0.3');
  // A: failures at 1,100 and 2,100 -> down at 2,100.
  await s.advance(1090);
  t.same(s.downs.map(([, a, when]) => [a, when]), [['10.0.0.1', 2100]], 'A down after two failures a period apart');
  t.ok(s.at('10.0.0.2').includes(2100), 'B (up, no failure) probed with it');
  t.notOk(s.at('10.0.0.3').includes(2100), 'C, a failure counted, kept its grid: the extra run would put two of its failures closer than a period');
  t.same(s.hc.status('default/web').map((b) => b.state), ['down', 'up', 'up'], 'one failure is not two: B stays up');
  // B fails from now on: its failures still come a period apart (the extra result was its last one taken).
  s.results.set('10.0.0.2', fail);
  await s.advance(3000);
  const bDown = s.downs.find(([, a]) => a === '10.0.0.2')?.[2];
  t.equal(bDown, 3800, 'B down at its second grid failure (2,800 then 3,800): the extra result did not move its grid');
  t.ok(s.at('10.0.0.3').includes(3800), 'B going down probed C (up, its failure since cleared), a period after the last time');
  t.same(s.hc.status('default/web').map((b) => b.state), ['down', 'down', 'up'], 'C answered: up');
});

/** A CA certificate the context accepts (a fixture of the config tests). */
function fakePem(_name: string): string {
  return fs.readFileSync(path.resolve(__dirname, '..', '..', '..', 'test', 'config', 'fixtures', 'ca.pem'), 'utf8');
}

/** A loopback listener (port 0) that reads and closes as a server would. */
async function loopbackBackend(t: { teardown(fn: () => unknown): void }): Promise<{ port: number }> {
  const server = net.createServer((sock) => { sock.on('error', () => {}); sock.resume(); });
  const port = await listen(server);
  t.teardown(() => server.close());
  return { port };
}

/** Log lines (JSON) of a real pino logger. */
function capturedLog(): { log: ReturnType<typeof createLogger>; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({ write(chunk: Buffer, _enc, cb) { for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>); cb(); } });
  return { log: createLogger('info', sink), lines };
}

async function waitUntil(what: string, fn: () => boolean | Promise<boolean>, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

t.test('TCP probes run on the native batch prober by default; this fails if they silently fall back to Node sockets', async (t) => {
  const b = await loopbackBackend(t);
  const registry = new Registry();
  const { log, lines } = capturedLog();
  // As daemon/wiring.ts builds it: no probe, no path chosen.
  const hc = new HealthChecker({ registry, log });
  t.teardown(() => hc.stop());
  hc.update([service({ name: 'web', backends: ['127.0.0.1'], healthCheck: { port: b.port, periodSeconds: 0.1, timeoutSeconds: 1 } })]);
  hc.start();
  // Counted by the checker: the native prober's reset before the handshake's ACK leaves the backend nothing to accept.
  await waitUntil('web up and probed a few times', async () => hc.healthy('default/web').length === 1
    && ((await sample(registry, 'lbagent_health_probes_total', { path: 'native', type: 'tcp' })) ?? 0) >= 3);
  t.equal(hc.probePath(), 'native', 'the checker says native');
  t.equal(await sample(registry, 'lbagent_health_probe_path_info', { path: 'native' }), 1, 'and so does /metrics');
  t.equal(await sample(registry, 'lbagent_health_probe_path_info', { path: 'node' }), undefined);
  const native = await sample(registry, 'lbagent_health_probes_total', { path: 'native', type: 'tcp' });
  t.ok((native ?? 0) >= 3, `every probe went through the native prober (${native})`);
  t.equal(await sample(registry, 'lbagent_health_probes_total', { path: 'node', type: 'tcp' }), undefined, 'none through a Node socket');
  const start = lines.find((l) => l.op === 'start');
  t.equal(start?.probePath, 'native', `the start line says so: ${String(start?.msg)}`);
  t.notOk(lines.some((l) => l.op === 'probe-path'), 'no fallback warning');
});

t.test('a TCP check that sends a PROXY header goes through a Node socket, beside native probes for the rest', async (t) => {
  // The batch prober only connects; a backend that requires the header on
  // every connection (issue 17) must get it from the check too.
  const received: Buffer[] = [];
  const server = net.createServer((sock) => { sock.on('error', () => {}); sock.on('data', (d: Buffer) => received.push(d)); });
  const ppPort = await listen(server);
  t.teardown(() => server.close());
  const plain = await loopbackBackend(t);
  const registry = new Registry();
  const hc = new HealthChecker({ registry });
  t.teardown(() => hc.stop());
  hc.update([
    service({ name: 'pp', backends: ['127.0.0.1'], healthCheck: { port: ppPort, periodSeconds: 0.1, timeoutSeconds: 1, proxyProtocol: 'v2' } }),
    service({ name: 'web', backends: ['127.0.0.1'], healthCheck: { port: plain.port, periodSeconds: 0.1, timeoutSeconds: 1 } }),
  ]);
  hc.start();
  await waitUntil('both up, the PROXY header seen', () => hc.healthy('default/pp').length === 1 && hc.healthy('default/web').length === 1 && received.length > 0);
  t.equal(hc.probePath(), 'native', 'plain TCP checks stay on the native prober');
  t.ok(((await sample(registry, 'lbagent_health_probes_total', { path: 'node', type: 'tcp' })) ?? 0) >= 1, 'the PROXY check ran on a Node socket');
  t.ok(((await sample(registry, 'lbagent_health_probes_total', { path: 'native', type: 'tcp' })) ?? 0) >= 1, 'the plain one on the native prober');
  t.same([...Buffer.concat(received).subarray(0, 12)], [0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a], 'the backend got the PROXY v2 signature first');
});

t.test('without the addon\'s prober: Node sockets, a warn line and the metric say so; an injected native prober refuses', async (t) => {
  const b = await loopbackBackend(t);
  const registry = new Registry();
  const { log, lines } = capturedLog();
  const oldAddon = (): NativeAddon => ({}) as NativeAddon;
  const hc = new HealthChecker({ registry, log, nativeAddon: oldAddon });
  t.teardown(() => hc.stop());
  hc.update([service({ name: 'web', backends: ['127.0.0.1'], healthCheck: { port: b.port, periodSeconds: 0.1, timeoutSeconds: 1 } })]);
  hc.start();
  await waitUntil('web up', () => hc.healthy('default/web').length === 1);
  t.equal(hc.probePath(), 'node');
  t.equal(await sample(registry, 'lbagent_health_probe_path_info', { path: 'node' }), 1);
  t.ok((await sample(registry, 'lbagent_health_probes_total', { path: 'node', type: 'tcp' }) ?? 0) >= 1, 'probes counted on the node path');
  const warn = lines.find((l) => l.op === 'probe-path');
  t.equal(warn?.level, 'warn');
  t.match(String(warn?.msg), /native TCP prober unavailable .*TcpProbeHandle.*Node socket/);
  const strict = new HealthChecker({ registry: new Registry(), tcpProber: (onOutcome, clock) => new NativeTcpProber({ onOutcome, clock, addon: oldAddon }) });
  let caught: unknown;
  try { strict.start(); } catch (err) { caught = err; }
  t.ok(isLbError(caught, 'LB_ERR_NET_NATIVE_MISSING'), 'an injected native prober: start() throws instead of falling back');
  t.equal(strict.probePath(), undefined, 'and nothing runs');
});

t.test('probes that find no descriptor (EMFILE) blame no backend: no verdict, counted as own exhaustion', async (t) => {
  // A child process: 20 backends with failureThreshold 1 (one failure taken
  // as a verdict would mark a backend down), every free descriptor but 3
  // taken, 2 s of probing at 0.1 s.
  const dist = path.resolve(__dirname, '..', '..');
  const script = `
    const fs = require('fs');
    const net = require('net');
    const { Registry } = require('prom-client');
    const { HealthChecker } = require(${JSON.stringify(path.join(dist, 'agent', 'health', 'checker.js'))});
    const { service } = require(${JSON.stringify(path.join(dist, 'test', 'health', 'spec.js'))});
    const ports = [];
    const servers = [];
    const next = () => {
      if (ports.length === 20) return run();
      const srv = net.createServer((s) => { s.on('error', () => {}); s.resume(); });
      servers.push(srv);
      srv.listen(0, '127.0.0.1', () => { ports.push(srv.address().port); next(); });
    };
    const run = () => {
      const registry = new Registry();
      const hc = new HealthChecker({ registry });
      hc.update(ports.map((port, i) => service({ name: 's' + i, backends: ['127.0.0.1'], healthCheck: { port, periodSeconds: 0.1, timeoutSeconds: 1, failureThreshold: 1 } })));
      let downs = 0;
      hc.on('probe', () => { for (let i = 0; i < 20; i++) if (hc.status('default/s' + i)[0].state === 'down') downs++; });
      const filler = [];
      for (;;) { try { filler.push(fs.openSync('/dev/null', 'r')); } catch { break; } }
      for (const fd of filler.splice(0, 3)) fs.closeSync(fd);
      hc.start();
      setTimeout(async () => {
        for (const fd of filler) fs.closeSync(fd);
        hc.stop();
        const text = await registry.metrics();
        const line = text.split('\\n').find((l) => l.startsWith('lbagent_health_probes_skipped_total{reason="own-exhaustion"} '));
        const skipped = line ? Number(line.split(' ')[1]) : 0;
        const states = ports.map((_, i) => hc.status('default/s' + i)[0].state);
        process.stdout.write(JSON.stringify({ skipped, downs, states, path: hc.probePath() }));
        process.exit(0);
      }, 2000);
    };
    next();
  `;
  const child = spawn('prlimit', ['--nofile=256:256', process.execPath, '-e', script], { stdio: ['ignore', 'pipe', 'pipe'], cwd: path.resolve(dist, '..') });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString(); });
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  t.equal(code, 0, `child exited cleanly ${stderr.slice(-500)}`);
  const r = JSON.parse(stdout || '{}') as { skipped: number; downs: number; states: string[]; path: string };
  t.equal(r.path, 'native');
  t.ok(r.skipped > 0, `${r.skipped} probes skipped for want of a descriptor`);
  t.equal(r.downs, 0, 'no backend was ever down');
  t.notOk(r.states.includes('down'), `states at the end: ${[...new Set(r.states)].join(', ')}`);
  t.ok(r.states.includes('up'), 'the probes that got a descriptor brought backends up');
});

t.test('healthy() answers the same list until a backend of that service changes state; an update with the same spec changes nothing', async (t) => {
  const s = setup();
  const hc = { periodSeconds: 1, failureThreshold: 1 };
  const web = service({ name: 'web', backends: ['10.0.0.1', '10.0.0.2'], healthCheck: hc });
  const api = service({ name: 'api', backends: ['10.0.0.3'], healthCheck: hc });
  s.hc.update([web, api]);
  s.hc.start();
  await s.advance(1);
  const webList = s.hc.healthy('default/web');
  const apiList = s.hc.healthy('default/api');
  t.same(webList.map((b) => b.address), ['10.0.0.1', '10.0.0.2']);
  t.equal(s.hc.healthy('default/web'), webList, 'asked again: the same array');
  const probes = s.calls.length;
  s.hc.update([web, api]);
  t.equal(s.hc.healthy('default/web'), webList, 'the same specs again: the same array');
  await s.advance(1);
  t.equal(s.calls.length, probes, 'and no probe brought forward');
  s.results.set('10.0.0.2', REFUSED);
  await s.advance(3000, 50);
  t.same(s.addrs('default/web'), ['10.0.0.1'], 'a backend down leaves the list');
  t.not(s.hc.healthy('default/web'), webList, 'as a new array');
  t.equal(s.hc.healthy('default/api'), apiList, 'the other service keeps its array');
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1', '10.0.0.4'], healthCheck: hc }), api]);
  await s.advance(1);
  t.same(s.addrs('default/web'), ['10.0.0.1', '10.0.0.4'], 'a changed spec is taken: its new backend probed and up');
  s.hc.stop();
});

t.test('1,000 services: checks spread over the period, and a reload keeps every kept target\'s phase', async (t) => {
  const clock = new ManualClock(0);
  const probe: Probe = async () => OK;
  const hc = new HealthChecker({ clock, registry: new Registry(), probe, maxInFlight: 4096 });
  const bases: { target: string; base: number }[] = [];
  hc.on('probe', (r) => bases.push({ target: r.target, base: r.slot.base }));
  const addr = (i: number, j: number): string => `10.1.${(i * 3 + j) >> 8}.${(i * 3 + j) & 255}`;
  const specs = (changed: number | undefined): ReturnType<typeof service>[] => Array.from({ length: 1000 }, (_, i) => service({
    name: `s${i}`, backends: [0, 1, 2].map((j) => (i === changed && j === 2 ? '10.9.9.9' : addr(i, j))),
  }));
  hc.update(specs(undefined));
  hc.start();
  const advance = async (ms: number): Promise<void> => { for (let left = ms; left > 0; left -= 10) { clock.advance(10); await flush(); } };
  await advance(11_000);
  const phases = (from: number, to: number): Map<string, number> => {
    const m = new Map<string, number>();
    for (const b of bases) if (b.base >= from && b.base < to) m.set(b.target, b.base % 5000);
    return m;
  };
  const before = phases(5000, 10_000);
  t.equal(before.size, 3000, 'each target once in its second period');
  const perSecond = [0, 0, 0, 0, 0];
  for (const p of before.values()) perSecond[Math.floor(p / 1000)]!++;
  t.ok(perSecond.every((n) => n >= 590 && n <= 610), `per second of the period: ${perSecond.join(', ')}`);
  // A reload: every spec a new object (as config/load makes them), one backend swapped.
  hc.update(specs(7));
  const at = clock.now();
  await advance(11_000);
  hc.stop();
  const after = phases(at + 5000, at + 10_000);
  let kept = 0;
  let moved = 0;
  for (const [target, p] of before) {
    if (!after.has(target)) continue;
    kept++;
    if (Math.abs(after.get(target)! - p) > 1e-6) moved++;
  }
  t.equal(kept, 2999, 'every target but the swapped one kept');
  t.equal(moved, 0, 'none moved in its period');
  t.ok(bases.some((b) => b.target.includes('10.9.9.9') && b.base === at), 'the new backend was probed at once');
});

t.test('a healthy backend\'s streak: counted at every result, ended by a failure, shown by status as the state machine counts it', async (t) => {
  const s = setup();
  s.hc.update([service({ name: 'web', backends: ['10.0.0.1'], healthCheck: { failureThreshold: 2, successThreshold: 2, periodSeconds: 1 } })]);
  s.hc.start();
  await s.advance(1);
  const st = (): ReturnType<typeof s.hc.status>[number] => s.hc.status('default/web')[0]!;
  const since = st().since;
  t.same([st().state, st().consecutiveSuccesses], ['up', 1]);
  await s.advance(5000, 50);
  const results = s.calls.length;
  t.ok(results >= 5, `${results} results in 5 s at a 1 s period`);
  t.same([st().state, st().consecutiveSuccesses, st().consecutiveFailures, st().since], ['up', results, 0, since], 'the streak is every result so far, nothing else moved');
  const held = st();
  await s.advance(1000, 50);
  t.equal(s.calls.length, results + 1);
  t.equal(held.consecutiveSuccesses, results, 'a status read earlier is a copy: it does not move');
  t.equal(st().consecutiveSuccesses, results + 1, 'one more');
  s.results.set('10.0.0.1', REFUSED);
  await s.advance(1000, 50);
  t.same([st().state, st().consecutiveSuccesses, st().consecutiveFailures], ['up', 0, 1], 'one failure: the streak ends, the backend stays up');
  s.results.set('10.0.0.1', OK);
  await s.advance(1000, 50);
  t.same([st().state, st().consecutiveSuccesses, st().consecutiveFailures], ['up', 1, 0], 'a success after it: counted by the state machine');
  await s.advance(1000, 50);
  t.same([st().state, st().consecutiveSuccesses], ['up', 2], 'and in place again');
  s.results.set('10.0.0.1', REFUSED);
  await s.advance(2000, 50);
  t.same([st().state, st().consecutiveFailures], ['down', 2], 'two failures: down');
  t.same(s.changes.map((c) => c[2]), [true, false]);
  s.results.set('10.0.0.1', OK);
  await s.advance(2000, 50);
  t.same([st().state, st().consecutiveSuccesses], ['up', 2], 'two successes: up again');
  t.same(s.changes.map((c) => c[2]), [true, false, true]);
  s.hc.stop();
});
