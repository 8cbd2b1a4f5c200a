// Worker-thread entry: parse and validate one config text off the daemon's
// event loop (load-async.ts starts it). Pure: text in, LoadResult out.
import { parentPort, workerData } from 'node:worker_threads';
import { parseConfigText } from './load';

const { text, hostname } = workerData as { text: string; hostname?: string };
const r = parseConfigText(text, hostname);
// What it built stays here: a copy would hand the next parse no object of the config it keeps.
parentPort!.postMessage(r.ok ? { ok: true, config: r.config } : r);
