// ipam/ driver: reads of a parent interface (its link and its addresses of
// one family) shared by the pool sources that ask before the read starts.
// A start of 1,000 pool services has every source ask at once; each read
// dumps every address of the parent, which holds the VIPs already up, so
// one read per source makes the start O(n^2) in netlink traffic and parse
// work. Here the sources that ask while a read waits its turn in the pool
// manager's queue share that read, and each one's follow-up (a reserve())
// runs in the same turn of the queue right after it: the atomicity of
// "read the parent, then reserve" that one read per source gave.
export interface ParentReadsOptions {
  /** Runs each read and its follow-ups (the pool manager's queue). */
  readonly run: <T>(fn: () => Promise<T>) => Promise<T>;
}

interface Waiter<P> {
  then(p: P): unknown;
  resolve(v: { p: P; result: unknown }): void;
  reject(err: unknown): void;
}

export class ParentReads<P> {
  /** The batch of each key whose read has not started yet. */
  private readonly open = new Map<string, Waiter<P>[]>();
  /** Reads sent, for tests and the scale bench's account of a start. */
  reads = 0;

  constructor(private readonly opts: ParentReadsOptions) {}

  /**
   * `read` (the first caller's, for a key: the same interface, family and
   * network read the same) once for every caller that joins before it
   * starts; then each caller's `then`, in the same turn. A failed read
   * rejects every caller of its batch; a failed `then` only its own.
   */
  read<T>(key: string, read: () => Promise<P>, then: (p: P) => T): Promise<{ p: P; result: T }> {
    return new Promise<{ p: P; result: T }>((resolve, reject) => {
      let batch = this.open.get(key);
      if (batch === undefined) {
        const b: Waiter<P>[] = [];
        batch = b;
        this.open.set(key, b);
        void this.opts.run(async () => {
          // Whoever asks from here on needs a read made after theirs was asked: the next batch.
          if (this.open.get(key) === b) this.open.delete(key);
          this.reads++;
          let p: P;
          try {
            p = await read();
          } catch (err) {
            for (const w of b) w.reject(err);
            return;
          }
          for (const w of b) {
            try { w.resolve({ p, result: w.then(p) }); } catch (err) { w.reject(err); }
          }
        });
      }
      batch.push({ then, resolve: resolve as Waiter<P>['resolve'], reject });
    });
  }
}
