// Health verdicts that outlive the process: the crash-only start seeds the
// checker with the verdicts an earlier run reached, so the first forwarding
// state matches what the kernel already holds. One file in the state
// directory, written atomically off the event loop shortly after a change
// (bursts coalesce). Each service's part of the file is kept as text and
// read again only when that service's verdicts or backends changed, so a
// health transition among a thousand services reads one service.
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

/** Where the saved verdicts come from, read when a write runs (never a copy taken earlier). */
export interface HealthSource {
  /**
   * The configured services in order, each by its spec: an object replaced
   * when the service changes (a reload keeps an unchanged service's), so a
   * replaced one is read again.
   */
  services(): Iterable<{ readonly key: string }>;
  /** One service's backends that are up or down now (others left out). */
  verdicts(key: string): Readonly<Record<string, 'up' | 'down'>>;
}

export class HealthStore {
  private timer: NodeJS.Timeout | undefined;
  /** Each service's entry of the document as JSON text ('' for none), with the spec it was read for. */
  private parts = new Map<string, { readonly spec: object; readonly text: string }>();
  /** Services whose verdicts changed since their text was made. */
  private readonly touched = new Set<string>();

  constructor(private readonly store: StateStore, private readonly source: HealthSource, private readonly log: Logger) {}

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

  /** A service's verdicts changed: its part is read again at the next write. */
  touch(key: string): void {
    this.touched.add(key);
  }

  /** Save shortly: changes within SAVE_DELAY_MS make one atomic write. */
  saveSoon(): void {
    if (this.timer) return;
    this.timer = setTimeout(() => { this.timer = undefined; void this.write(); }, SAVE_DELAY_MS);
    this.timer.unref();
  }

  /** Save now (a stop): a write pending is folded into this one; resolves once it is on disk or failed (logged). Never rejects. */
  flush(): Promise<void> {
    this.cancel();
    return this.write();
  }

  cancel(): void {
    if (this.timer) { clearTimeout(this.timer); this.timer = undefined; }
  }

  /** The document as it is now, as JSON text: the parts of unchanged services as they were. */
  text(): string {
    const next = new Map<string, { readonly spec: object; readonly text: string }>();
    const entries: string[] = [];
    for (const spec of this.source.services()) {
      const key = spec.key;
      let part = this.parts.get(key);
      if (part === undefined || part.spec !== spec || this.touched.has(key)) {
        const v = this.source.verdicts(key);
        let text = '';
        for (const address in v) text += `${text === '' ? '' : ','}${JSON.stringify(address)}:${JSON.stringify(v[address])}`;
        part = { spec, text: text === '' ? '' : `${JSON.stringify(key)}:{${text}}` };
      }
      next.set(key, part);
      if (part.text !== '') entries.push(part.text);
    }
    this.parts = next;
    this.touched.clear();
    return `{${entries.join(',')}}\n`;
  }

  /**
   * One atomic write off the event loop (StateStore.writeTextAsync: temp
   * file, fsync, rename, directory fsync in libuv's thread pool, in order
   * with the writes before it). Never rejects: a failure is logged.
   */
  private write(): Promise<void> {
    let text: string;
    try { text = this.text(); } catch (e) {
      this.log.warn({ op: 'health', err: errorMessage(e) }, 'could not save health verdicts (a restart would start them unknown)');
      return Promise.resolve();
    }
    return this.store.writeTextAsync(HEALTH_FILE, text).catch((e: unknown) => {
      this.log.warn({ op: 'health', err: errorMessage(e) }, 'could not save health verdicts (a restart would start them unknown)');
    });
  }
}
