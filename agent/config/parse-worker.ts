// Worker-thread entry: parse and validate one config text off the daemon's
// event loop (load-async.ts starts it). Pure: text in, LoadResult out.
import { parentPort, workerData } from 'node:worker_threads';
import { parseConfigText } from './load';

const { text, hostname } = workerData as { text: string; hostname?: string };
const r = parseConfigText(text, hostname);
// The config and what the next parse takes again (ConfigReuse) in one
// message: the structured clone keeps the objects they share shared, so
// each reused entry's specs are the config's own objects on the other side.
parentPort!.postMessage(r.ok ? { ok: true, config: r.config, reuse: r.reuse === undefined ? undefined : { globals: r.reuse.globals, byText: r.reuse.byText } } : r);
