// The daemon's view of VRRP: which virtual router carries each service's VIP
// (assignVrids), one VirtualRouter per VRID on the VRRP interface, and the
// answer to "does this node hold service X now?". Mastership changes become
// one 'change' event listing the services whose VIP must move; the daemon
// starts or stops their address sources. Addresses are never touched here.
import { EventEmitter } from 'node:events';
import type { Registry } from 'prom-client';
import type { FailoverConfig, ServiceSpec } from '../config/types';
import type { Clock } from '../clock';
import type { Logger } from '../log';
import { VirtualRouter, assignVrids, type VirtualRouterStatus } from './driver';

export interface VrrpGateOptions {
  readonly config: FailoverConfig;
  readonly nodePriority: number;
  readonly ifindex: number;
  readonly ifname: string;
  readonly srcIp: string;
  readonly log: Logger;
  readonly registry: Registry;
  readonly clock?: Clock;
}

export class VrrpGate extends EventEmitter {
  private readonly opts: VrrpGateOptions;
  private readonly log: Logger;
  private readonly routers = new Map<number, VirtualRouter>();
  private vridOf = new Map<string, number>();
  private servicesOn = new Map<number, string[]>();
  private vips: (key: string) => string | undefined = () => undefined;

  constructor(opts: VrrpGateOptions) {
    super();
    this.opts = opts;
    this.log = opts.log.child({ module: 'failover' });
  }

  update(services: readonly ServiceSpec[], vips: (serviceKey: string) => string | undefined): void {
    this.vips = vips;
    const a = assignVrids(services, this.opts.config.vrid);
    for (const key of a.overflow) this.log.error({ op: 'assign', service: key }, 'no VRRP virtual router has room for this VIP (255 per VRID); it is not served');
    this.vridOf = new Map(a.vrids);
    const on = new Map<number, string[]>();
    for (const [key, vrid] of a.vrids) on.set(vrid, [...(on.get(vrid) ?? []), key]);
    this.servicesOn = on;
    // A router's priority: the node's, unless a service pinned to that VRID names its own.
    const priorityOf = (vrid: number): number => {
      const pinned = services.find((s) => a.vrids.get(s.key) === vrid && s.priority !== undefined);
      return pinned?.priority ?? this.opts.nodePriority;
    };
    for (const [vrid, router] of this.routers) {
      if (!on.has(vrid) || router.status().priority !== priorityOf(vrid)) {
        router.removeAllListeners();
        router.stop({ priorityZero: true });
        this.routers.delete(vrid);
        this.emit('change', [...(on.get(vrid) ?? [])]);
      }
    }
    for (const vrid of on.keys()) {
      if (this.routers.has(vrid)) continue;
      const router = new VirtualRouter({
        vrid, priority: priorityOf(vrid), advertInterval: this.opts.config.advertInterval,
        preempt: this.opts.config.preempt, preemptDelay: this.opts.config.preemptDelay,
        ifindex: this.opts.ifindex, ifname: this.opts.ifname, srcIp: this.opts.srcIp,
        vips: () => (this.servicesOn.get(vrid) ?? []).map((k) => this.vips(k)).filter((v): v is string => v !== undefined),
        clock: this.opts.clock, log: this.opts.log, registry: this.opts.registry,
      });
      const changed = (): void => { this.emit('change', [...(this.servicesOn.get(vrid) ?? [])]); };
      router.on('master', changed);
      router.on('backup', changed);
      router.on('split-brain', (e) => this.log.warn({ op: 'split-brain', ...e }, 'two Masters for one virtual router; resolved by priority, then address'));
      this.routers.set(vrid, router);
      router.start();
    }
  }

  isMaster(serviceKey: string): boolean {
    const vrid = this.vridOf.get(serviceKey);
    return vrid !== undefined && this.routers.get(vrid)?.state === 'master';
  }

  status(serviceKey: string): (VirtualRouterStatus & Record<string, unknown>) | undefined {
    const vrid = this.vridOf.get(serviceKey);
    const r = vrid === undefined ? undefined : this.routers.get(vrid);
    return r ? { ...r.status() } : undefined;
  }

  async stop(): Promise<void> {
    // Priority 0 (RFC 5798 §6.4.3): a Backup takes over at once instead of
    // waiting out Master_Down_Interval.
    for (const r of this.routers.values()) { r.removeAllListeners(); r.stop({ priorityZero: true }); }
    this.routers.clear();
  }
}
