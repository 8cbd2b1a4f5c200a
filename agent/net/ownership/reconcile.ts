// Ownership reconcile (docs/design.md: "on start, the agent adopts or removes
// links ... that it owns"): a pure plan over the links that exist and the
// links wanted, and a driver that applies it through netlink.ts. A crash
// therefore never leaves a stale macvlan, or a duplicate MAC, on the LAN.
import type { Logger } from '../../log';
import { silentLogger } from '../../log';
import { setLinksOwned, type NetMetrics } from '../metrics';
import type { LinkInfo, MacvlanMode, NetlinkClient } from '../netlink/netlink';
import { hasOwnedName, isOwnedLink } from './ownership';

export interface WantedLink {
  readonly mac: string;
  /** Parent link by name or index. */
  readonly parent: string | number;
  /** Default 'bridge'. */
  readonly mode?: MacvlanMode;
}

export type RecreateReason = 'wrong-mac' | 'wrong-parent' | 'wrong-mode' | 'not-macvlan';

export interface OwnedLinksPlan {
  /** Ours, wanted, and exactly as wanted: keep as they are. */
  readonly adopt: LinkInfo[];
  /** Ours and not wanted: delete. */
  readonly remove: LinkInfo[];
  /** Ours and wanted but not as wanted: delete, then create again. */
  readonly recreate: Array<{ link: LinkInfo; reason: RecreateReason }>;
  /** Wanted names with no link: for the caller's normal create path. */
  readonly missing: string[];
  /** Wanted names held by a link that is not ours (MAC without the agent prefix): never touched. */
  readonly foreign: LinkInfo[];
}

/** Pure: what to do with every link carrying the agent's marks. */
export function planOwnedLinks(existing: readonly LinkInfo[], wanted: ReadonlyMap<string, WantedLink>): OwnedLinksPlan {
  const byName = new Map(existing.map((l) => [l.name, l]));
  const byIndex = new Map(existing.map((l) => [l.index, l]));
  const plan: OwnedLinksPlan = { adopt: [], remove: [], recreate: [], missing: [], foreign: [] };

  for (const link of existing) {
    if (!hasOwnedName(link.name)) continue;
    const want = wanted.get(link.name);
    if (!isOwnedLink(link)) {
      // Our naming pattern but not our MAC prefix: someone else's; leave it.
      if (want) plan.foreign.push(link);
      continue;
    }
    if (!want) {
      plan.remove.push(link);
      continue;
    }
    const parent = typeof want.parent === 'number' ? byIndex.get(want.parent) : byName.get(want.parent);
    let reason: RecreateReason | undefined;
    if (link.kind !== 'macvlan') reason = 'not-macvlan';
    else if (link.mac.toLowerCase() !== want.mac.toLowerCase()) reason = 'wrong-mac';
    else if (!parent || link.parentIndex !== parent.index) reason = 'wrong-parent';
    else if (link.macvlanMode !== (want.mode ?? 'bridge')) reason = 'wrong-mode';
    if (reason) plan.recreate.push({ link, reason });
    else plan.adopt.push(link);
  }
  for (const name of wanted.keys()) {
    if (!byName.has(name)) plan.missing.push(name);
  }
  return plan;
}

export interface ReconcileResult {
  /** Kept as found (addresses on them are the owner's to adopt or remove). */
  readonly adopted: LinkInfo[];
  /** Deleted: ours, not wanted. */
  readonly removed: LinkInfo[];
  /** Deleted and created again as wanted (left down, like createMacvlan). */
  readonly recreated: LinkInfo[];
  readonly missing: string[];
  readonly foreign: LinkInfo[];
}

export type NetlinkForReconcile = Pick<NetlinkClient, 'listLinks' | 'deleteLink' | 'createMacvlan'>;

/**
 * Apply planOwnedLinks. Stops at the first failing kernel call and throws
 * its LbError; running it again converges, because every step is decided
 * from what exists at that moment. Sets lbagent_net_links_owned.
 */
export async function reconcileOwnedLinks(
  netlink: NetlinkForReconcile,
  wanted: ReadonlyMap<string, WantedLink>,
  opts: { log?: Logger; metrics?: NetMetrics } = {},
): Promise<ReconcileResult> {
  const log = (opts.log ?? silentLogger()).child({ module: 'net/reconcile', op: 'reconcile-links' });
  const plan = planOwnedLinks(await netlink.listLinks(), wanted);
  const removed: LinkInfo[] = [];
  const recreated: LinkInfo[] = [];

  for (const link of plan.remove) {
    await netlink.deleteLink(link.index);
    removed.push(link);
    log.info({ name: link.name, mac: link.mac }, 'removed a stale agent link');
  }
  for (const { link, reason } of plan.recreate) {
    const want = wanted.get(link.name)!;
    await netlink.deleteLink(link.index);
    const created = await netlink.createMacvlan({ name: link.name, parent: want.parent, mac: want.mac, mode: want.mode ?? 'bridge' });
    recreated.push(created);
    log.info({ name: link.name, reason, mac: want.mac }, 'recreated an agent link');
  }
  for (const link of plan.adopt) log.info({ name: link.name, mac: link.mac }, 'adopted an agent link');
  for (const link of plan.foreign) log.warn({ name: link.name, mac: link.mac }, 'a link not owned by the agent holds a wanted name');

  setLinksOwned(opts.metrics, plan.adopt.length + recreated.length);
  return { adopted: plan.adopt, removed, recreated, missing: plan.missing, foreign: plan.foreign };
}
