// forward/ layer: the kernel path with the eBPF full-NAT engine in front
// (`kernel.engine: ebpf`, or `auto` where the engine loads). A thin driver
// around the nft data path (nft.ts), which it runs unchanged underneath: the
// nft table is written first, exactly as without the engine, then the
// engine (native/bpf/nat.c at tcx ingress of the parent, driven by
// net/ebpf/nat-attach.ts) takes the plan of the same state (nat-plan.ts),
// written into its maps in place (only the ports of services whose inputs
// changed) where they have room for it, else with a program loaded for it
// and swapped in. The engine forwards the `sourceIP: snat` flows of IPv4
// and IPv6 VIPs without conntrack; whatever it passes on (direct server
// return, fragments, IP options, IPv6 extension headers, a packet too big
// for the way out, a port with no healthy backend, traffic the node itself
// sends to a VIP) reaches the nft table as before. So the nft path is both the fallback and the reference.
//
// A plan the engine cannot take (load, fill or attach failing) detaches it:
// the nft table, already written for the same state, serves alone, and
// status says why. A half-applied state (a new table behind an old program
// that would still send new flows to a backend just taken out) is never left.
import type { Registry } from 'prom-client';
import { errorMessage } from '../errors';
import { silentLogger, type Logger } from '../log';
import { SerialQueue } from '../serial';
import type { NatEngine, NatCounter, NatCounterTotals } from '../net/ebpf/nat-attach';
import { natLayout } from '../net/ebpf/nat-layout';
import type { Dataplane, ForwardState, ForwardStats } from './dataplane';
import { registerNatMetrics, withEngineFlows } from './nat-metrics';
import { natPlan, type NatPlan } from './nat-plan';
import type { NftDataplane } from './nft';
import type { TableOwner } from '../daemon/drift';

/** The engine as the drift guard names it among the owned things. */
export const NAT_ENGINE_SUBJECT = 'bpf lb_agent_nat';

/** Which engine forwards the snat flows now, and why (status details). */
export interface NatEngineState {
  readonly engine: 'ebpf' | 'nft';
  readonly reason: string;
}

export interface EbpfNatDataplaneOptions {
  /** The nft data path underneath (built without the engine). */
  readonly nft: NftDataplane;
  /** The engine on the parent NIC. */
  readonly engine: NatEngine;
  readonly registry?: Registry | undefined;
  readonly log?: Logger;
}

export class EbpfNatDataplane implements Dataplane, TableOwner {
  readonly kind = 'kernel' as const;
  private readonly nft: NftDataplane;
  private readonly engine: NatEngine;
  private readonly log: Logger;
  private readonly queue = new SerialQueue();
  private plan: NatPlan | undefined;
  private state: NatEngineState = { engine: 'nft', reason: 'no plan applied yet' };

  constructor(opts: EbpfNatDataplaneOptions) {
    this.nft = opts.nft;
    this.engine = opts.engine;
    this.log = (opts.log ?? silentLogger()).child({ module: 'forward', op: 'nat-engine' });
    if (opts.registry) this.registerMetrics(opts.registry);
    this.nft.viewStatsThrough((st) => this.withEngineFlows(st));
  }

  apply(state: ForwardState): Promise<void> {
    return this.queue.run(async () => {
      await this.nft.apply(state);
      // Services whose inputs did not change keep their plan: the engine writes only the others' entries.
      const plan = natPlan(state, natLayout(), this.plan);
      try {
        const done = this.engine.apply(plan);
        this.plan = plan;
        if (done.mode === 'load') this.log.info({ reason: done.reason, ports: done.ports, writes: done.writes, calls: done.calls, kept: this.engine.adoptMiss }, 'the eBPF NAT engine loaded a program for the plan');
        else if (done.mode === 'adopt') this.log.info({ ports: done.ports, writes: done.writes, calls: done.calls }, 'the eBPF NAT engine kept the program and maps an earlier process left, written where they differ from the plan');
        else this.log.debug({ ports: done.ports, writes: done.writes }, 'the eBPF NAT engine\'s maps written in place');
        if (this.state.engine !== 'ebpf') this.log.info({ device: this.engine.device }, 'the eBPF NAT engine forwards the snat ports');
        this.state = { engine: 'ebpf', reason: `tcx ingress of ${this.engine.device}: the snat flows of IPv4 and IPv6 VIPs` };
      } catch (err) {
        const reason = errorMessage(err);
        this.log.error({ err: reason }, 'the eBPF NAT engine cannot take this plan; the nft table forwards alone');
        try { this.engine.detach(); } catch (e) { this.log.error({ err: errorMessage(e) }, 'cannot detach the eBPF NAT engine'); }
        this.plan = undefined;
        this.state = { engine: 'nft', reason: `fallback: ${reason}` };
      }
    });
  }

  stop(opts?: { keep?: boolean }): Promise<void> {
    return this.queue.run(async () => {
      // The program goes before the table, so nothing is ever forwarded by a program whose fallback is gone.
      if (opts?.keep) this.engine.release();
      else this.engine.detach();
      this.plan = undefined;
      await this.nft.stop(opts);
    });
  }

  vipArrived(vip: string, ports: readonly { readonly protocol: 'TCP' | 'UDP'; readonly port: number }[]): Promise<void> {
    return this.nft.vipArrived(vip, ports);
  }

  // The drift guard's TableOwner (daemon/drift.ts): the nft table's, and the
  // engine's program and pins as one more owned thing, so a detached program
  // or a removed flow map is found at the guard's resync and put back alone
  // (repairProgram), as a drifted table is written again alone (repair).

  ownedTables(): string[] {
    return this.nft.ownedTables();
  }

  /** The engine's program or pins, where someone undid them (read at the guard's every resync). */
  programsUndone(): Array<{ subject: string; found: string }> {
    const drift = this.engine.active ? this.engine.drift() : undefined;
    return drift === undefined ? [] : [{ subject: NAT_ENGINE_SUBJECT, found: drift }];
  }

  ownsCommit(pid: number | undefined, port?: number): boolean {
    return this.nft.ownsCommit(pid, port);
  }

  keepForwarding(): ReturnType<NftDataplane['keepForwarding']> {
    return this.nft.keepForwarding();
  }

  /** The table written again whole (the engine's program is left as it is: repairProgram puts that back). */
  repair(): Promise<boolean> {
    return this.queue.run(() => this.nft.repair());
  }

  /**
   * The engine's program re-attached with its plan, and a removed flow map
   * created anew (its flows are picked up mid-way), where someone undid them;
   * the nft table is not written. Resolves with what was done; a program
   * that cannot be put back is detached (the table, already written for this
   * state, forwards alone, and status says why).
   */
  repairProgram(subject: string): Promise<string | undefined> {
    return this.queue.run(async () => {
      if (subject !== NAT_ENGINE_SUBJECT) return undefined;
      const drift = this.engine.active ? this.engine.drift() : undefined;
      if (drift === undefined || this.plan === undefined) return `nothing to put back (${this.state.engine === 'ebpf' ? 'the engine is whole again' : 'the nft table forwards alone'})`;
      try {
        this.engine.apply(this.plan, { reload: true });
        this.log.warn({ drift }, 'the eBPF NAT engine was undone by someone else; re-attached with its plan (flows without an entry are picked up mid-way)');
        return 'attached the eBPF NAT engine again with its maps and plan (the nft table not written)';
      } catch (err) {
        const reason = errorMessage(err);
        this.log.error({ drift, err: reason }, 'cannot repair the eBPF NAT engine; the nft table forwards alone');
        try { this.engine.detach(); } catch (e) { this.log.error({ err: errorMessage(e) }, 'cannot detach the eBPF NAT engine'); }
        this.plan = undefined;
        this.state = { engine: 'nft', reason: `fallback: repair failed: ${reason}` };
        return `could not attach the eBPF NAT engine again (${reason}): detached, the nft table forwards alone`;
      }
    });
  }

  /** Per (service, port, backend) counters of the engine, since this process started it. */
  engineCounters(): Map<string, NatCounter> {
    return this.plan ? this.engine.counters() : new Map<string, NatCounter>();
  }

  /**
   * The engine's flows never reach the nft counters: its own are added to the
   * same (service, port, backend) rows (nat-metrics.ts), read by counter index.
   */
  private withEngineFlows(st: ForwardStats): ForwardStats {
    return withEngineFlows(st, this.plan, (): NatCounterTotals => this.engine.totals());
  }

  async stats(): Promise<ForwardStats> {
    const st = this.withEngineFlows(await this.nft.stats());
    const flows = st.flows;
    let engine: Record<string, unknown> = { ...this.state };
    if (this.plan) {
      try {
        const ports = { IPv4: 0, IPv6: 0 };
        for (const s of this.plan.services) for (const p of s.ports) ports[p.family === 6 ? 'IPv6' : 'IPv4']++;
        engine = { ...engine, services: this.plan.services.map((s) => s.key), ports, events: this.engine.events(true), fill: this.engine.fill(), lastApply: this.engine.lastApply };
      } catch (err) {
        engine = { ...engine, problem: errorMessage(err) };
      }
    }
    return { ...st, flows, details: { ...st.details, natEngine: engine } };
  }

  /** The direct-server-return engine of the nft path underneath (status). */
  get dsr(): NftDataplane['dsr'] {
    return this.nft.dsr;
  }

  get engineState(): NatEngineState {
    return this.state;
  }

  private registerMetrics(registry: Registry): void {
    const engine = this.engine;
    registerNatMetrics(registry, {
      plan: () => this.plan,
      totals: () => engine.totals(),
      fill: () => engine.fill(),
      events: (withEvictions) => engine.events(withEvictions),
    });
  }
}
