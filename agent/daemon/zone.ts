// This node's zone and region (topology.kubernetes.io/zone and /region):
// from node.zone / node.region, else the labels file, re-read at every
// reload and whenever the file is rewritten (Harvester re-syncs the labels
// when a VM moves), so a migration takes effect without a reload.
import { watchFile, unwatchFile } from 'node:fs';
import type { NodeTopology } from '../config/labels';
import type { Desired } from '../config/types';
import type { Logger } from '../log';

/** How often the labels file is polled for a rewrite (one stat). */
const LABELS_POLL_MS = 2000;
const UNKNOWN: NodeTopology = { zone: undefined, region: undefined, zoneFrom: 'unknown', regionFrom: 'unknown', labelsFile: undefined, problem: undefined };

export interface NodeZoneOptions {
  readonly log: Logger;
  /** Reads the zone and region (config/labels.ts readNodeTopology). */
  read(node: Desired['node']): Promise<NodeTopology>;
  /** The labels file was rewritten: the owner re-reads (read()) when it may. */
  onRewrite(): void;
}

export class NodeZone {
  private now: NodeTopology = UNKNOWN;
  private watched: string | undefined;
  private stopped = false;
  private readonly onChange = (): void => { if (!this.stopped) this.opts.onRewrite(); };

  constructor(private readonly opts: NodeZoneOptions) {}

  get current(): NodeTopology { return this.now; }

  /** (Re)read the zone for this config; logs a change; returns the one it replaced. */
  async read(config: Desired): Promise<NodeTopology> {
    const before = this.now;
    const t = await this.opts.read(config.node);
    this.now = t;
    this.watch(t.labelsFile);
    if (t.zone !== before.zone || t.region !== before.region || t.problem !== before.problem) {
      const zoned = config.services.filter((sv) => sv.topology !== 'any').map((sv) => sv.key);
      const fields = { op: 'topology', zone: t.zone, region: t.region, zoneFrom: t.zoneFrom, labelsFile: t.labelsFile, problem: t.problem };
      if (t.zone === undefined && zoned.length > 0) this.opts.log.warn({ ...fields, services: zoned }, `this node's zone is unknown (${t.problem ?? 'no node.zone'}): prefer-zone services use every healthy backend, zone-only services refuse connections`);
      else if (t.zone !== undefined) this.opts.log.info(fields, `node zone ${t.zone} (from ${t.zoneFrom === 'config' ? 'node.zone' : t.labelsFile})`);
      else this.opts.log.debug(fields, 'node zone unknown (no service uses a zone policy)');
    }
    return before;
  }

  stop(): void {
    this.stopped = true;
    this.watch(undefined);
  }

  /**
   * Poll the labels file (a stat every LABELS_POLL_MS: stat follows the
   * downward API's symlink swap and sees a file that appears later).
   */
  private watch(path: string | undefined): void {
    if (path === this.watched) return;
    if (this.watched !== undefined) unwatchFile(this.watched, this.onChange);
    this.watched = path;
    if (path !== undefined && !this.stopped) watchFile(path, { interval: LABELS_POLL_MS, persistent: false }, this.onChange);
  }
}

/** "zone-a (region r1)", or "unknown": how an event names a place. */
export function placeOf(x: NodeTopology): string {
  return `${x.zone ?? 'unknown'}${x.region ? ` (region ${x.region})` : ''}`;
}
