// Health verdicts that outlive the process: the crash-only start seeds the
// checker with the verdicts an earlier run reached, so the first forwarding
// state matches what the kernel already holds. One file in the state
// directory, written atomically shortly after a change (bursts coalesce).
import { errorMessage } from '../errors';
import type { Logger } from '../log';
import type { StateStore } from '../state/store';

/** The file in stateDir. */
export const HEALTH_FILE = 'health.json';

/** How long a burst of changes is coalesced before one write (ms). */
const SAVE_DELAY_MS = 50;

export type HealthVerdict = readonly [serviceKey: string, address: string, state: 'up' | 'down'];

/** backends' up/down by service key, then by address. */
export type HealthDocument = Record<string, Record<string, 'up' | 'down'>>;

export class HealthStore {
  private timer: NodeJS.Timeout | undefined;

  /** `snapshot` reads the verdicts to save when a write runs (never a copy taken earlier). */
  constructor(private readonly store: StateStore, private readonly snapshot: () => HealthDocument, private readonly log: Logger) {}

  /** The verdicts an earlier run saved; [] when there are none or the file is unreadable (logged). */
  load(): HealthVerdict[] {
    let doc: unknown;
    try { doc = this.store.read<unknown>(HEALTH_FILE); } catch (e) {
      this.log.warn({ op: 'adopt', err: errorMessage(e) }, 'saved health verdicts unreadable; backends start unknown');
      return [];
    }
    const out: HealthVerdict[] = [];
    if (typeof doc !== 'object' || doc === null) return out;
    for (const [key, backends] of Object.entries(doc as Record<string, unknown>)) {
      if (typeof backends !== 'object' || backends === null) continue;
      for (const [address, state] of Object.entries(backends as Record<string, unknown>)) {
        if (state === 'up' || state === 'down') out.push([key, address, state]);
      }
    }
    return out;
  }

  /** Save shortly: changes within SAVE_DELAY_MS make one atomic write. */
  saveSoon(): void {
    if (this.timer) return;
    this.timer = setTimeout(() => { this.timer = undefined; this.save(); }, SAVE_DELAY_MS);
    this.timer.unref();
  }

  /** Save now (a stop); a write pending is folded into this one. */
  save(): void {
    this.cancel();
    try { this.store.write(HEALTH_FILE, this.snapshot()); } catch (e) {
      this.log.warn({ op: 'health', err: errorMessage(e) }, 'could not save health verdicts (a restart would start them unknown)');
    }
  }

  cancel(): void {
    if (this.timer) { clearTimeout(this.timer); this.timer = undefined; }
  }
}
