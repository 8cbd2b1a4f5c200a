// Reading config.yaml off disk, with limits (file I/O only; no parsing here).
// Only a regular file (a symlink to one is fine) of at most MAX_CONFIG_BYTES,
// checked with fstat on the opened descriptor before a byte is read, so
// `ln -s /dev/zero config.yaml`, a FIFO or a 20 MB file is refused at once
// (/dev/zero grew the agent to 2 GB, a 20 MB file blocked the loop
// for 14.5 s). The descriptor is opened O_NONBLOCK so a FIFO cannot hang the
// open itself. The async variant is what the daemon uses: no read blocks the
// event loop.
import * as fs from 'node:fs';
import type { ConfigError } from './load';

/** The largest config file accepted: 4 MiB (a 10,000-service file is well under 2 MiB). */
export const MAX_CONFIG_BYTES = 4 * 1024 * 1024;

export type ReadResult =
  | { readonly ok: true; readonly text: string }
  | { readonly ok: false; readonly errors: readonly ConfigError[] };

const OPEN_FLAGS = fs.constants.O_RDONLY | fs.constants.O_NONBLOCK;

function fail(file: string, why: string): ReadResult {
  return { ok: false, errors: [{ path: '', message: `cannot read ${file}: ${why}` }] };
}

function openError(file: string, e: unknown): ReadResult {
  const code = (e as NodeJS.ErrnoException).code;
  const why = code === 'ENOENT' ? 'no such file'
    : code === 'EACCES' ? 'permission denied'
      : code === 'ELOOP' ? 'too many levels of symbolic links'
        : (e as Error).message;
  return fail(file, why);
}

/** Why the stat of an opened config file rules it out, or undefined when it may be read. */
export function refuseStat(st: { isFile(): boolean; isDirectory(): boolean; size: number }, limit = MAX_CONFIG_BYTES): string | undefined {
  if (st.isDirectory()) return 'it is a directory, not a file';
  if (!st.isFile()) return 'it is not a regular file (a device, FIFO or socket); point the config at a regular file';
  if (st.size > limit) return `it is ${st.size} bytes, more than the ${limit}-byte limit (${limit / 1024 / 1024} MiB)`;
  return undefined;
}

/** The buffer holds one byte more than fstat's size: filling it means the file grew after fstat. */
function decode(file: string, buf: Buffer, n: number, size: number): ReadResult {
  if (n > size) return fail(file, 'it grew while being read; try again once it is written');
  return { ok: true, text: buf.subarray(0, n).toString('utf8') };
}

/** Read a config file synchronously (the CLI: validate, status, check). */
export function readConfigText(file: string, limit = MAX_CONFIG_BYTES): ReadResult {
  let fd: number;
  try { fd = fs.openSync(file, OPEN_FLAGS); } catch (e) { return openError(file, e); }
  try {
    const st = fs.fstatSync(fd);
    const why = refuseStat(st, limit);
    if (why) return fail(file, why);
    const buf = Buffer.alloc(st.size + 1);
    let n = 0;
    for (;;) {
      const got = fs.readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) break;
      n += got;
      if (n === buf.length) break;
    }
    return decode(file, buf, n, st.size);
  } catch (e) {
    return openError(file, e);
  } finally {
    fs.closeSync(fd);
  }
}

/** Read a config file without blocking the event loop (the daemon: start and reload). */
export async function readConfigTextAsync(file: string, limit = MAX_CONFIG_BYTES): Promise<ReadResult> {
  let fh: fs.promises.FileHandle;
  try { fh = await fs.promises.open(file, OPEN_FLAGS); } catch (e) { return openError(file, e); }
  try {
    const st = await fh.stat();
    const why = refuseStat(st, limit);
    if (why) return fail(file, why);
    const buf = Buffer.alloc(st.size + 1);
    let n = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, n, buf.length - n, null);
      if (bytesRead === 0) break;
      n += bytesRead;
      if (n === buf.length) break;
    }
    return decode(file, buf, n, st.size);
  } catch (e) {
    return openError(file, e);
  } finally {
    await fh.close().catch(() => undefined);
  }
}
