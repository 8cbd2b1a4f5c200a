// Address removals in batches (driver over netlink.ts): the removals asked
// for in one turn of the event loop go to the kernel together, as
// NetlinkClient.removeAddresses' batches. A stop of 1,000 pool services asks
// for 1,000 removals in one turn (every source stops at once): a few
// datagrams, not 1,000 round trips, each of which waited for the one before
// it in the pool manager's queue.
import type { LbError } from '../../errors';
import type { AddressRef, NetlinkClient } from './netlink';

export interface AddressRemovalsOptions {
  readonly netlink: Pick<NetlinkClient, 'removeAddresses'>;
  /** Runs each batch (the pool manager's queue: no parent read sees it half done). Default: at once. */
  readonly run?: <T>(fn: () => Promise<T>) => Promise<T>;
  /** When the turn's removals are sent; default setImmediate. */
  readonly defer?: (fn: () => void) => void;
}

interface Pending extends AddressRef {
  resolve(removed: boolean): void;
  reject(err: LbError | Error): void;
}

export class AddressRemovals {
  /** The batch of this turn, whose place in the queue is taken; undefined once it is being sent. */
  private open: Pending[] | undefined;

  constructor(private readonly opts: AddressRemovalsOptions) {}

  /**
   * netlink's removeAddress, sent with the other removals of this turn: true
   * removed, false it was not there; rejects with its own error. The batch
   * takes its place in the queue at the first removal of the turn, so what
   * the caller queues after asking (a pool source that released its claim,
   * and another source that reads the parent to take the address) comes
   * after the removal, as with a removal queued on its own.
   */
  remove(index: number, address: string, prefix: number): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      if (this.open === undefined) {
        const batch: Pending[] = [];
        this.open = batch;
        void this.send(batch);
      }
      this.open.push({ index, address, prefix, resolve, reject });
    });
  }

  private async send(batch: Pending[]): Promise<void> {
    const run = this.opts.run ?? (<T>(fn: () => Promise<T>): Promise<T> => fn());
    try {
      const results = await run(async () => {
        // The rest of this turn's removals join first.
        await new Promise<void>((r) => (this.opts.defer ?? setImmediate)(r));
        if (this.open === batch) this.open = undefined;
        return this.opts.netlink.removeAddresses(batch);
      });
      batch.forEach((p, i) => {
        const r = results[i];
        if (typeof r === 'boolean') p.resolve(r);
        else p.reject(r ?? new Error(`no result for ${p.address}`));
      });
    } catch (err) {
      if (this.open === batch) this.open = undefined;
      for (const p of batch) p.reject(err as Error);
    }
  }
}
