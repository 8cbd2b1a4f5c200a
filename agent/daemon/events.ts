// The daemon's event history for `lb-agent status`: a bounded ring of what
// happened (VIP gained or lost, backend up or down, VRRP transitions,
// reloads), each with its time and reason. Pure: no I/O, no clock of its own.

/** What an event is about; stable strings (part of the `status --json` shape). */
export type StatusEventKind =
  | 'vip-gained' | 'vip-lost'
  | 'backend-up' | 'backend-down'
  | 'vrrp-master' | 'vrrp-backup'
  /** The VRRP priority in use changed (failover.track): fault, a weight, or back. */
  | 'vrrp-priority'
  | 'reload-applied' | 'reload-rejected'
  | 'zone-changed'
  | 'drift-repaired' | 'drift-backoff'
  | 'parent-address';

/** One entry of `events` in the status document (oldest first). */
export interface StatusEvent {
  /** ISO 8601 wall time. */
  at: string;
  kind: StatusEventKind;
  /** The service key (namespace/name), absent for reloads and zone changes. */
  service?: string;
  /** The VIP (vip-*) or backend address (backend-*). */
  address?: string;
  /** Why, in words: the source's reason, the reload's verdict. */
  reason: string;
}

/** How many events status keeps. */
export const EVENT_HISTORY = 100;

export class EventRing {
  private readonly items: StatusEvent[] = [];
  constructor(private readonly capacity = EVENT_HISTORY) {}

  push(ev: StatusEvent): void {
    this.items.push(ev);
    if (this.items.length > this.capacity) this.items.splice(0, this.items.length - this.capacity);
  }

  /** Oldest first; a copy. */
  list(): StatusEvent[] { return this.items.slice(); }
}
