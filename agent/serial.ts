// One thing at a time: work that must not overlap (rtnetlink dumps on a
// shared socket, data path rewrites, pool reservations) runs through a
// SerialQueue. A failure rejects that caller only; the queue goes on.

export class SerialQueue {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.tail.then(fn, fn);
    this.tail = result.then(() => undefined, () => undefined);
    return result;
  }
}
