// Reload (SIGHUP, `lb-agent reload`): read the file, plan by a pure diff
// (reconciler.ts planReload), carry the steps out on the services, the
// subsystems and the metrics endpoint, and publish the verdict. One reload
// runs at a time (Coalesced); a bad file changes nothing.
import { formatConfigErrors, type ConfigError, type ConfigReuse } from '../config/load';
import { loadConfigFileAsync } from '../config/load-async';
import { SpecFingerprints } from '../config/diff';
import type { Desired } from '../config/types';
import type { Clock } from '../clock';
import { errorMessage } from '../errors';
import type { Logger } from '../log';
import type { ReloadStep } from './reconciler';
import type { ReloadResult } from './status';
import type { StatusEvent, StatusEventKind } from './events';
import type { DaemonMetrics } from './metrics';
import type { ServiceRuntimes } from './services';
import type { MetricsEndpoint } from './metrics-endpoint';
import type { NodeZone } from './zone';
import type { Subsystems } from './subsystems';
import { lateModules } from './late-load';

/**
 * One run at a time: calls that arrive while a run is under way fold into
 * one more run, which begins when that one ends, and share its result. So
 * every caller gets the result of a run that began no earlier than its call
 * (a reload: one that read a file at least as new as its request). `once`
 * must never reject.
 */
export class Coalesced<R> {
  private running: Promise<R> | undefined;
  private next: Promise<R> | undefined;

  /** `after` runs once each run has ended, before a folded run begins. */
  constructor(private readonly once: () => Promise<R>, private readonly after: () => void = () => undefined) {}

  /** The run under way, if any. */
  get inFlight(): Promise<R> | undefined { return this.running; }

  run(): Promise<R> {
    if (!this.running) {
      this.running = this.once().finally(() => { this.running = undefined; this.after(); });
      return this.running;
    }
    if (!this.next) {
      this.next = this.running.then(() => { this.next = undefined; return this.run(); });
    }
    return this.next;
  }
}

/** What a reload reaches: the config in force, the parts its steps act on, and where it reports. */
export interface ReloaderOptions {
  readonly configPath: string;
  readonly log: Logger;
  readonly clock: Clock;
  /** The start in flight or done: a reload asked for while starting waits for it. */
  starting(): Promise<void> | undefined;
  started(): boolean;
  stopping(): boolean;
  /** The config in force (undefined before the start read it). */
  config(): Desired | undefined;
  /** An accepted file is the config in force from here on, before its steps are carried out. */
  adopt(next: Desired, at: number): void;
  subs(): Pick<Subsystems, 'reconfigure' | 'retrack' | 'dataplane' | 'health' | 'failover'> | undefined;
  readonly services: Pick<ServiceRuntimes, 'remove' | 'restart' | 'update' | 'add' | 'reconfigureSources' | 'reorder' | 'updateFailover' | 'startSources'>;
  readonly metricsEndpoint: Pick<MetricsEndpoint, 'restart'>;
  readonly zone: Pick<NodeZone, 'read' | 'current'>;
  metrics(): DaemonMetrics | undefined;
  /** The backend side of DSR (`backend.vips` on lo); never rejects. */
  applyBackendVips(vips: readonly string[]): Promise<void>;
  /** A data path transaction now, not batched: every service's forwarding state asked for, or `only` these services'. */
  applyNow(only?: Iterable<string>): Promise<void>;
  noteEvent(kind: StatusEventKind, ev: Omit<StatusEvent, 'at' | 'kind'>): void;
  notifyStatus(): void;
  /** After a reload, applied or not, whose file was parsed in a worker thread (RuntimeTuning.afterReload). */
  afterReload(): void;
}

/**
 * The CPU (the process's, every thread: the collector's helpers and the
 * thread pool's writes included) and the wall time of a reload's parts,
 * for its log line: what a slow reload spent, read without a profiler.
 */
class Spans {
  readonly cpuMs: Record<string, number> = {};
  readonly wallMs: Record<string, number> = {};
  private cpu = process.cpuUsage();
  private wall = performance.now();

  end(part: string): void {
    const cpu = process.cpuUsage();
    const wall = performance.now();
    this.cpuMs[part] = Math.round((cpu.user - this.cpu.user + cpu.system - this.cpu.system) / 100) / 10;
    this.wallMs[part] = Math.round((wall - this.wall) * 10) / 10;
    this.cpu = cpu;
    this.wall = wall;
  }
}

export class Reloader {
  private readonly runs: Coalesced<ReloadResult>;
  /** Each service's fingerprint, kept with its spec: a reload compares services by them (config/diff.ts). */
  private readonly fingerprints = new SpecFingerprints();
  /** What the last accepted parse built, by each service entry's text: the next parse takes the unchanged ones again (ConfigReuse). */
  private reuse: ConfigReuse | undefined;
  private gen = 1;
  /** The run under way read its file in a worker thread (load-async.ts). */
  private parsedInWorker = false;
  private last: { at: number; ok: boolean; message: string } | undefined;

  constructor(private readonly opts: ReloaderOptions) {
    this.runs = new Coalesced(
      () => { this.parsedInWorker = false; return this.reloadOnce().catch((e) => this.rejected([{ path: '', message: `internal error: ${errorMessage(e)}` }])); },
      // A worker's isolate leaves its memory to collect and trim; an inline
      // parse leaves young garbage that V8's own scavenges take, and a full
      // compacting collection at a thousand services costs more CPU than
      // the whole reload.
      () => { if (this.parsedInWorker) opts.afterReload(); },
    );
  }

  /**
   * What the start's parse built (ConfigReuse), for the first reload to take
   * its unchanged services again; a reload's own parse has precedence.
   */
  seed(reuse: ConfigReuse | undefined): void {
    this.reuse ??= reuse;
  }

  /** The config's generation: 1 for the file the start read, one more for each reload applied. */
  get generation(): number { return this.gen; }

  /** The last reload's verdict. */
  get lastReload(): { at: number; ok: boolean; message: string } | undefined { return this.last; }

  /** The reload under way, if any. */
  get inFlight(): Promise<ReloadResult> | undefined { return this.runs.inFlight; }

  /**
   * SIGHUP (or `lb-agent reload`): reload by a pure plan. One reload runs at
   * a time; requests that arrive meanwhile fold into one more reload of the
   * newest file, and each caller gets the verdict of the reload that read a
   * file at least as new as its request. Never throws.
   */
  reload(): Promise<ReloadResult> {
    return this.runs.run();
  }

  private rejected(errors: readonly ConfigError[]): ReloadResult {
    const message = `reload rejected, running config kept:\n${formatConfigErrors(errors, this.opts.configPath)}`;
    this.opts.log.error({ op: 'reload', errors }, message);
    this.opts.metrics()?.reload('rejected');
    this.last = { at: this.opts.clock.wallNow(), ok: false, message };
    this.opts.noteEvent('reload-rejected', { reason: message });
    return { ok: false, message, errors };
  }

  private async reloadOnce(): Promise<ReloadResult> {
    const o = this.opts;
    // Asked over the control socket while starting: after the start, as
    // systemd orders a reload after the start job.
    if (!o.started()) await o.starting()?.catch(() => undefined);
    const old = o.config();
    const subs = o.subs();
    if (!old || !subs || o.stopping()) return { ok: false, message: 'not running', errors: [] };
    const spans = new Spans();
    const res = await loadConfigFileAsync(o.configPath, { reuse: this.reuse });
    spans.end('load');
    this.parsedInWorker = res.via === 'worker';
    const at = o.clock.wallNow();
    if (!res.ok) return this.rejected(res.errors);
    const next = res.config;
    // Direct server return asked for by the new file: can this node do it? (probed once)
    const dsrUnavailable = next.services.some((s) => s.sourceIP === 'preserve')
      ? lateModules().dsrUnavailable(subs.dataplane.kind, await subs.dataplane.dsr?.())
      : undefined;
    const plan = lateModules().planReload({ config: old, dataplane: subs.dataplane.kind, dsrUnavailable, same: (a, b) => this.fingerprints.same(a, b) }, next);
    if (!plan.ok) return this.rejected(plan.errors);
    spans.end('plan');
    o.adopt(next, at);
    this.reuse = res.reuse;
    const steps = plan.steps;
    for (let i = 0; i < steps.length && !o.stopping();) {
      let j = i + 1;
      if (steps[i]!.op === 'remove') while (j < steps.length && steps[j]!.op === 'remove') j++;
      // Removals together: each stops a source of its own (its link, lease
      // or claim) and waits on the kernel (a link deletion, ~15 ms); one
      // after another, 50 took 1.6 s. Each takes its service out of the
      // runtimes before its first await, in plan order, so a secondary is
      // gone before its primary's source stops.
      await Promise.all(steps.slice(i, j).map((step) => this.carryOut(step, next)));
      i = j;
    }
    // Keep config order for status.
    o.services.reorder(next.services.map((sv) => sv.key));
    spans.end('steps');

    subs.health.update(next.services);
    spans.end('health');
    // Specs replaced in place and nothing else (the common reload: a
    // backend or a port of a few services): no source is new, so none is
    // started, and only those services' forwarding states are asked for. A
    // service added, removed or restarted, a section, VRRP (an election
    // moves with the services) or a new zone asks every service, as a start does.
    const inPlace = !subs.failover && steps.every((s) => s.op === 'update');
    o.services.updateFailover();
    if (!inPlace) o.services.startSources();
    const zone = o.zone.current;
    await o.zone.read(next);
    const sameZone = o.zone.current.zone === zone.zone && o.zone.current.region === zone.region;
    spans.end('sources');
    await o.applyNow(inPlace && sameZone ? plan.summary.changed : undefined);
    spans.end('apply');
    const message = lateModules().describeSummary(plan.summary);
    const sm = plan.summary;
    o.log.info({ op: 'reload', added: sm.added, removed: sm.removed, changed: sm.changed, sections: sm.sections, idle: sm.idle, cpuMs: spans.cpuMs, ms: spans.wallMs }, message);
    o.metrics()?.reload('applied');
    // Published together, once the new config is applied: a reader never sees
    // the new generation with the previous reload's verdict.
    this.gen++;
    this.last = { at, ok: true, message };
    o.noteEvent('reload-applied', { reason: message });
    o.notifyStatus();
    return { ok: true, message, errors: [], summary: plan.summary };
  }

  /** One step of a reload plan (reconciler.ts). */
  private async carryOut(step: ReloadStep, next: Desired): Promise<void> {
    const subs = this.opts.subs()!;
    switch (step.op) {
      case 'pools':
        subs.reconfigure(next);
        return;
      case 'source-settings':
        subs.reconfigure(next);
        this.opts.services.reconfigureSources(next);
        return;
      case 'proxy-settings':
        subs.dataplane.reconfigure?.(next.proxy);
        return;
      case 'backend-vips':
        await this.opts.applyBackendVips(next.backend.vips);
        return;
      case 'tracks':
        await subs.retrack?.(next);
        return;
      case 'metrics-listen':
        await this.opts.metricsEndpoint.restart(step.listen);
        return;
      case 'remove':
        await this.opts.services.remove(step.key);
        return;
      case 'restart-source':
        await this.opts.services.restart(step.key, step.spec, step.release);
        return;
      case 'update':
        this.opts.services.update(step.key, step.spec);
        return;
      case 'add':
        this.opts.services.add(step.spec);
        return;
    }
  }
}
