// Unit: forward/nat-metrics.ts, the eBPF NAT engine's counters as series and
// as per-backend stats, read by counter index, against the families and the
// stats view as they were built from a map keyed per (service, port,
// backend) with prom-client (kept below as the reference): the same page,
// byte for byte, for fixed counters and after one backend's counters change;
// and only the changed lines rendered again. The engine's read itself (the
// per-CPU sum, the carried totals) runs against the kernel in
// test/privileged/forward-ebpf-nat.test.ts.
import t from 'tap';
import { Counter, Gauge, Registry } from 'prom-client';
import { parseIPv4 } from '../../agent/address';
import type { BackendSpec } from '../../agent/config/types';
import { portLabel, serviceLabels, type FlowStats, type ForwardService, type ForwardStats } from '../../agent/forward/dataplane';
import { natPlan, type NatPlan } from '../../agent/forward/nat-plan';
import { registerNatMetrics, withEngineFlows, NAT_BACKEND_FAMILIES } from '../../agent/forward/nat-metrics';
import { exposition, SeriesFamily } from '../../agent/metrics/series';
import { natCounterKey, NAT_COUNTER_WIDTH, type NatCounter, type NatCounterTotals, type NatEvent } from '../../agent/net/ebpf/nat-attach';
import { natLayout } from '../../agent/net/ebpf/nat-layout';

const b = (address: string): BackendSpec => ({ address, addressNum: parseIPv4(address)!, weight: 1 });

/** 60 services of one or two ports and 2-4 backends, one whose backends are all down. */
function state(): { services: ForwardService[] } {
  const services: ForwardService[] = [];
  for (let i = 0; i < 60; i++) {
    const backends = Array.from({ length: 2 + (i % 3) }, (_, j) => b(`10.1.${i}.${j + 10}`));
    services.push({
      key: `ns${i % 4}/svc-${i}`, vip: `10.0.${Math.floor(i / 250)}.${(i % 250) + 1}`, backends, healthy: i === 7 ? [] : backends,
      ports: i % 5 === 0
        ? [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }, { name: '', port: 53, protocol: 'UDP', targetPort: 5353 }]
        : [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 }],
    });
  }
  return { services };
}

/** Counter indices handed out in plan order (as a fresh engine does), and totals for them: a seeded mix of zeros and numbers up to 2^40. */
function engineOf(plan: NatPlan): { totals: Float64Array; ids: Map<string, number[]>; read: () => NatCounterTotals } {
  const ids = new Map<string, number[]>();
  let next = 0;
  for (const s of plan.services) for (const p of s.ports) ids.set(p.id, p.backends.map(() => next++));
  const totals = new Float64Array(next * NAT_COUNTER_WIDTH);
  let seed = 0x2545f491;
  const rnd = (): number => { seed ^= seed << 13; seed ^= seed >>> 17; seed ^= seed << 5; return seed >>> 0; };
  for (let k = 0; k < totals.length; k++) totals[k] = rnd() % 4 === 0 ? 0 : (rnd() % 2 === 0 ? rnd() % 1000 : rnd() * 512);
  return { totals, ids, read: () => ({ totals, indices: (id) => ids.get(id) }) };
}

/** The same numbers as a map per natCounterKey, as the engine's counters() hands them. */
function asMap(plan: NatPlan, e: ReturnType<typeof engineOf>): Map<string, NatCounter> {
  const m = new Map<string, NatCounter>();
  for (const s of plan.services) {
    for (const p of s.ports) {
      p.backends.forEach((backend, i) => {
        const o = e.ids.get(p.id)![i]! * NAT_COUNTER_WIDTH;
        const v = e.totals;
        m.set(natCounterKey(s.key, `${p.port.protocol}/${p.port.port}`, backend), { packetsToBackend: v[o]!, bytesToBackend: v[o + 1]!, packetsToClient: v[o + 2]!, bytesToClient: v[o + 3]!, flows: v[o + 4]! });
      });
    }
  }
  return m;
}

const fill = { flows: 12, replies: 12, flows6: 0, replies6: 0, capacity: 65536 };
const events = { new: 40, midflow: 0, expired: 3 } as unknown as Record<NatEvent, number>;

/** The reference: the engine's families as prom-client counters over the per-key map. */
function referenceFamilies(registry: Registry, plan: () => NatPlan | undefined, counters: () => Map<string, NatCounter>): void {
  const perBackend = (name: string, help: string, pick: (c: NatCounter) => number): void => {
    new Counter({
      name, help, registers: [registry], labelNames: ['service', 'namespace', 'port', 'backend'],
      collect() {
        this.reset();
        const now = counters();
        for (const s of plan()?.services ?? []) {
          for (const p of s.ports) {
            for (const backend of p.backends) {
              const c = now.get(natCounterKey(s.key, `${p.port.protocol}/${p.port.port}`, backend));
              if (c && pick(c) > 0) this.inc({ ...serviceLabels(s.key), port: portLabel(p.port), backend }, pick(c));
            }
          }
        }
      },
    });
  };
  perBackend('lbagent_forward_nat_flows_total', 'Flows the eBPF NAT engine placed on a backend since the agent started it.', (c) => c.flows);
  perBackend('lbagent_forward_nat_packets_to_backend_total', 'Packets the eBPF NAT engine sent to a backend.', (c) => c.packetsToBackend);
  perBackend('lbagent_forward_nat_bytes_to_backend_total', 'Bytes (IP packets) the eBPF NAT engine sent to a backend.', (c) => c.bytesToBackend);
  perBackend('lbagent_forward_nat_packets_to_client_total', 'Packets the eBPF NAT engine sent back to clients from a backend.', (c) => c.packetsToClient);
  perBackend('lbagent_forward_nat_bytes_to_client_total', 'Bytes (IP packets) the eBPF NAT engine sent back to clients from a backend.', (c) => c.bytesToClient);
  new Gauge({
    name: 'lbagent_forward_nat_flow_entries', help: 'Entries in the eBPF NAT engine\'s flow maps (one per direction of a flow; flows6 and replies6: IPv6) and the capacity of each.', registers: [registry],
    labelNames: ['map'],
    collect() {
      this.reset();
      if (!plan()) return;
      this.set({ map: 'flows' }, fill.flows);
      this.set({ map: 'replies' }, fill.replies);
      this.set({ map: 'flows6' }, fill.flows6);
      this.set({ map: 'replies6' }, fill.replies6);
      this.set({ map: 'capacity' }, fill.capacity);
    },
  });
  new Counter({
    name: 'lbagent_forward_nat_events_total',
    help: 'eBPF NAT engine events since its maps were created: new flows, mid-flow pickups, idle expiries, flows placed again, no free source port, no route, ICMP errors translated, IPv6 packets with an extension header passed to nft, flow map entries evicted.',
    registers: [registry], labelNames: ['event'],
    collect() {
      this.reset();
      if (!plan()) return;
      for (const [k, v] of Object.entries(events) as [NatEvent, number][]) if (v > 0) this.inc({ event: k }, v);
    },
  });
}

/** The reference stats view: a new row per (service, port, backend) the map holds. */
function referenceFlows(st: ForwardStats, plan: NatPlan, counters: Map<string, NatCounter>): ForwardStats {
  const ports = new Map<string, { protocol: string; port: number }>();
  for (const s of plan.services) for (const p of s.ports) ports.set(`${s.key}\n${portLabel(p.port)}`, p.port);
  const flows: FlowStats[] = st.flows.map((f) => {
    const port = ports.get(`${f.service}\n${f.port}`);
    const c = port ? counters.get(natCounterKey(f.service, `${port.protocol}/${port.port}`, f.backend)) : undefined;
    return c ? { ...f, connections: f.connections + c.flows, bytesToBackend: f.bytesToBackend + c.bytesToBackend, bytesToClient: f.bytesToClient + c.bytesToClient } : f;
  });
  return { ...st, flows };
}

t.test('the engine\'s families read by counter index: the page byte for byte as the per-key families made it, before and after one backend changes', async (t) => {
  const plan = natPlan(state(), natLayout());
  const e = engineOf(plan);
  const ref = new Registry();
  referenceFamilies(ref, () => plan, () => asMap(plan, e));
  const reg = new Registry();
  let reads = 0;
  registerNatMetrics(reg, { plan: () => plan, totals: () => { reads++; return e.read(); }, fill: () => fill, events: () => events });

  const before = await ref.metrics();
  t.ok(before.split('\n').length > 500, `the reference page has ${before.split('\n').length} lines`);
  t.match(before, /lbagent_forward_nat_bytes_to_client_total\{service="svc-0",namespace="ns0",port="53",backend="10\.1\.0\.1\d"\} \d+/, 'an unnamed port is labelled by its number');
  t.equal(await exposition(reg), before, 'the same page for the same counters');
  t.equal(reads, 5, 'each family read the counters once');
  const fams = NAT_BACKEND_FAMILIES.map((f) => reg.getSingleMetric(f.name) as unknown as SeriesFamily);
  const rendered = (): number => fams.reduce((s, f) => s + f.rendered, 0);
  const first = rendered();
  t.equal(await exposition(reg), before, 'scraped again, unchanged');
  t.equal(rendered(), first, 'and no line rendered again');

  // One backend's counters change (svc-13's second backend on http), one of them from 0.
  const p = plan.byKey.get('ns1/svc-13')!.ports[0]!;
  const o = e.ids.get(p.id)![1]! * NAT_COUNTER_WIDTH;
  e.totals[o + 4] = 0;
  t.equal(await exposition(reg), await ref.metrics(), 'a counter at 0 has no series, as before');
  for (let j = 0; j < NAT_COUNTER_WIDTH; j++) e.totals[o + j]! += 1000 + j;
  const beforeChange = rendered();
  const after = await ref.metrics();
  t.not(after, before, 'the reference page changed');
  const mine = await exposition(reg);
  t.equal(mine, after, 'the page after the change as the reference\'s, byte for byte (a series that came takes its place in plan order)');
  t.equal(rendered() - beforeChange, NAT_COUNTER_WIDTH, 'one line rendered per family: the changed backend\'s');
  t.match(mine, /lbagent_forward_nat_packets_to_client_total\{service="svc-13",namespace="ns1",port="http",backend="10\.1\.13\.11"\} \d+/);

  // The page with no plan: the families' headers alone, as prom-client's.
  const none = new Registry();
  registerNatMetrics(none, { plan: () => undefined, totals: () => { throw new Error('no read without a plan'); }, fill: () => fill, events: () => events });
  const noneRef = new Registry();
  referenceFamilies(noneRef, () => undefined, () => new Map());
  t.equal(await exposition(none), await noneRef.metrics(), 'without a plan, the same page of headers');
});

t.test('the stats view adds the engine\'s numbers to the same rows as the per-key view, and hands on a row it carried nothing for', async (t) => {
  const plan = natPlan(state(), natLayout());
  const e = engineOf(plan);
  const flows: FlowStats[] = [];
  for (const s of plan.services) {
    for (const p of s.ports) {
      for (const backend of p.backends) flows.push({ service: s.key, port: portLabel(p.port), protocol: p.port.protocol, backend, connections: 2, active: undefined, bytesToBackend: 5, bytesToClient: 7, connectFailures: undefined });
    }
  }
  // A row of a service the engine does not forward, and one of a backend it does not know.
  flows.push({ service: 'other/x', port: 'http', protocol: 'TCP', backend: '10.9.9.9', connections: 1, active: undefined, bytesToBackend: 1, bytesToClient: 1, connectFailures: undefined });
  flows.push({ service: 'ns0/svc-0', port: 'http', protocol: 'TCP', backend: '10.9.9.9', connections: 1, active: undefined, bytesToBackend: 1, bytesToClient: 1, connectFailures: undefined });
  const st: ForwardStats = { flows, services: [], details: {} } as unknown as ForwardStats;
  const mine = withEngineFlows(st, plan, e.read);
  t.same(mine.flows, referenceFlows(st, plan, asMap(plan, e)).flows, `the same ${flows.length} rows`);
  t.ok(mine.flows.some((f, i) => f !== flows[i]), 'rows the engine carried for are new');
  const zero = flows.findIndex((f) => f.service === 'other/x');
  t.equal(mine.flows[zero], flows[zero], 'a row of a service the engine does not forward is the same object');
  e.totals.fill(0);
  const idle = withEngineFlows(st, plan, e.read);
  t.ok(idle.flows.every((f, i) => f === flows[i]), 'with every engine counter at 0, no row is made again');
  t.equal(withEngineFlows(st, undefined, () => { throw new Error('no read without a plan'); }), st, 'no plan: the stats as they are');
});
