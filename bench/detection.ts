// Bench area "health" (detection half): from a backend's death to its
// removal, lb-agent against HAProxy with equivalent settings, both checking
// the same two backends at the same time, so they see the same event.
//   default  lb-agent: success 1, failure 3, period 5 s, timeout 3 s (Harvester's)
//            HAProxy:  check inter 5s fall 3 rise 1, timeout check 3s
//   fast     lb-agent: success 1, failure 3, period 0.5 s, timeout 0.5 s
//            HAProxy:  check inter 500 fall 3 rise 1, timeout check 500ms
// Death is SIGKILL of the backend process (connects are then refused at
// once, so neither checker waits on its timeout). Removal is lb-agent's
// "backend ... is down" log line (its own timestamp) and HAProxy's
// "Server vip/b1 is DOWN" warning on stderr (stamped as it arrives). The
// backend is then restarted and the time until both put it back is kept too.
// No traffic flows, so lb-agent's passive failure detection plays no part.
import { Lab, waitFor } from '../lab/netns';
import { startBackend, type Backend } from '../lab/services';
import { waitStatus } from '../lab/agent';
import { runAgent, stopAgent, logTime, FAST_ARP } from './lib/agent';
import { startHaproxy } from './lib/peers';
import { median, round } from './lib/stats';

const NODE = '10.99.0.10';
const VIP = '10.99.0.50';
const PEER_VIP = '10.99.0.60';
const B1 = '10.99.0.11';
const B2 = '10.99.0.12';

export interface DetectionSetting { name: 'default' | 'fast'; period: number; timeout: number; fall: number; rise: number }

export const DETECTION_SETTINGS: DetectionSetting[] = [
  { name: 'default', period: 5, timeout: 3, fall: 3, rise: 1 },
  { name: 'fast', period: 0.5, timeout: 0.5, fall: 3, rise: 1 },
];

export interface DetectionOptions { rounds: number; settings: DetectionSetting[]; log: (msg: string) => void }

export interface DetectionRun { setting: string; round: number; agentDownMs: number; haproxyDownMs: number; agentUpMs: number; haproxyUpMs: number }

export interface DetectionResult {
  config: Omit<DetectionOptions, 'log'>;
  summary: Record<string, { agentDownMs: number; haproxyDownMs: number; agentUpMs: number; haproxyUpMs: number; worstCaseDownMs: number; runs: number }>;
  raw: DetectionRun[];
  errors: string[];
}

async function runSetting(lab: Lab, node: string, b1ns: string, set: DetectionSetting, o: DetectionOptions, raw: DetectionRun[]): Promise<void> {
  let b1: Backend = await startBackend(lab, b1ns, 'b1', [8080]);
  const agent = await runAgent(lab, node, {
    node: { name: 'bench', interface: 'eth0' },
    metrics: { listen: '' },
    pools: { 'range-global': `${VIP}-${VIP}` },
    arp: FAST_ARP,
    services: [{
      name: 'web', ipam: 'pool', loadBalancerIP: VIP, ports: [{ port: 80, targetPort: 8080 }], backends: [B1, B2],
      healthCheck: { successThreshold: set.rise, failureThreshold: set.fall, periodSeconds: set.period, timeoutSeconds: set.timeout, passiveFailures: 0 },
    }],
  }, { name: `detect-${set.name}` });
  const hap = await startHaproxy(lab, node, `haproxy-detect-${set.name}`, {
    threads: 1, bind: `${PEER_VIP}:80`,
    servers: [{ name: 'b1', address: `${B1}:8080` }, { name: 'b2', address: `${B2}:8080` }],
    check: { interMs: set.period * 1000, fall: set.fall, rise: set.rise, timeoutMs: set.timeout * 1000 },
  });
  try {
    const upInAgent = (): Promise<unknown> => waitStatus(agent, 'b1 up in lb-agent', (s) => s.services[0]?.backends.find((b) => b.address === B1)?.state === 'up', 60_000);
    await upInAgent();
    // HAProxy starts its servers UP; one passed check makes that real.
    await new Promise((r) => setTimeout(r, Math.max(500, set.period * 1000 + 200)));
    const deadline = (set.period * (set.fall + 2) + set.timeout) * 1000 + 5000;
    for (let round = 0; round < o.rounds; round++) {
      const agentMark = agent.logs.length;
      const hapMark = hap.lines.length;
      const killedAt = Date.now();
      await b1.stop();
      const agentDown = await waitFor('lb-agent to take b1 out', () => agent.logs.slice(agentMark).find((l) => typeof l.msg === 'string' && l.msg.startsWith(`backend ${B1}:8080`) && l.msg.endsWith('is down')), deadline, 20).catch(() => undefined);
      const hapDown = await waitFor('HAProxy to take b1 out', () => hap.lines.slice(hapMark).find((l) => /Server \S+\/b1 is DOWN/.test(l.text)), deadline, 20).catch(() => undefined);
      const agentUpMark = agent.logs.length;
      const hapUpMark = hap.lines.length;
      b1 = await startBackend(lab, b1ns, 'b1', [8080]);
      const startedAt = Date.now();
      const agentUp = await waitFor('lb-agent to put b1 back', () => agent.logs.slice(agentUpMark).find((l) => typeof l.msg === 'string' && l.msg.startsWith(`backend ${B1}:8080`) && l.msg.endsWith('is up')), deadline, 20).catch(() => undefined);
      const hapUp = await waitFor('HAProxy to put b1 back', () => hap.lines.slice(hapUpMark).find((l) => /Server \S+\/b1 is UP/.test(l.text)), deadline, 20).catch(() => undefined);
      const run: DetectionRun = {
        setting: set.name, round,
        agentDownMs: logTime(agentDown) - killedAt,
        haproxyDownMs: (hapDown?.at ?? NaN) - killedAt,
        agentUpMs: logTime(agentUp) - startedAt,
        haproxyUpMs: (hapUp?.at ?? NaN) - startedAt,
      };
      raw.push(run);
      o.log(`${set.name} round ${round + 1}/${o.rounds}: down detected by lb-agent ${run.agentDownMs} ms, HAProxy ${run.haproxyDownMs} ms; back up lb-agent ${run.agentUpMs} ms, HAProxy ${run.haproxyUpMs} ms`);
      // Desynchronise the next death from both checkers' schedules.
      await new Promise((r) => setTimeout(r, 200 + Math.random() * set.period * 1000));
    }
  } finally {
    await hap.stop();
    await stopAgent(agent);
    await b1.stop();
  }
}

export async function benchDetection(o: DetectionOptions): Promise<DetectionResult> {
  const lab = await Lab.create();
  const raw: DetectionRun[] = [];
  try {
    const node = await lab.addHost('node', { address: `${NODE}/24`, extraAddresses: [`${PEER_VIP}/24`] });
    const b1ns = await lab.addHost('b1', { address: `${B1}/24` });
    const b2ns = await lab.addHost('b2', { address: `${B2}/24` });
    await startBackend(lab, b2ns, 'b2', [8080]);
    const errors: string[] = [];
    for (const set of o.settings) {
      try {
        await runSetting(lab, node, b1ns, set, o, raw);
      } catch (e) {
        errors.push(`${set.name}: ${String((e as Error).message ?? e).slice(0, 300)}`);
        o.log(`${set.name}: FAILED: ${errors[errors.length - 1]}`);
      }
    }
    const summary: DetectionResult['summary'] = {};
    for (const set of o.settings) {
      const rs = raw.filter((r) => r.setting === set.name);
      summary[set.name] = {
        agentDownMs: round(median(rs.map((r) => r.agentDownMs)), 0),
        haproxyDownMs: round(median(rs.map((r) => r.haproxyDownMs)), 0),
        agentUpMs: round(median(rs.map((r) => r.agentUpMs)), 0),
        haproxyUpMs: round(median(rs.map((r) => r.haproxyUpMs)), 0),
        // fall probes one period apart, the first up to a period after the death.
        worstCaseDownMs: round(set.period * set.fall * 1000, 0),
        runs: rs.length,
      };
    }
    return { config: { rounds: o.rounds, settings: o.settings }, summary, raw, errors };
  } finally {
    await lab.destroy();
  }
}
