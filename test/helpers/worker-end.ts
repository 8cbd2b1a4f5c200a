// Test helper (not a test): ends worker threads while a native handle of the
// addon is open in them, in a child process, so a crash at the worker's end
// (SIGSEGV when libuv runs a close callback of an unloaded addon, issue 18)
// is an exit status the test reads instead of the end of the test runner.
import { spawnSync } from 'node:child_process';
import { distPath } from '../../lab/services';

/**
 * `setup` runs in each worker with `addon` (the loaded addon) in scope and
 * must leave the handle open and working; the worker is then terminated from
 * the main thread, `rounds` times. Returns how the child ended.
 */
export function endWorkersHolding(setup: string, rounds = 5): { status: number | null; signal: NodeJS.Signals | null; out: string } {
  const nativeJs = distPath('agent', 'native', 'native.js');
  const worker = `const { parentPort } = require('node:worker_threads');\nconst addon = require(${JSON.stringify(nativeJs)}).loadNative();\n${setup}\nparentPort.postMessage('open');`;
  const main = `
    const { Worker } = require('node:worker_threads');
    (async () => {
      for (let i = 0; i < ${rounds}; i++) {
        const w = new Worker(${JSON.stringify(worker)}, { eval: true });
        await new Promise((resolve, reject) => { w.once('message', resolve); w.once('error', reject); });
        await new Promise((r) => setTimeout(r, 20));
        await w.terminate();
      }
      console.log('all ended');
    })().catch((e) => { console.error(e); process.exit(3); });`;
  // Without tap's loaders (NODE_OPTIONS): the child loads only the addon's JavaScript.
  const r = spawnSync(process.execPath, ['-e', main], { env: { ...process.env, NODE_OPTIONS: '' }, timeout: 30_000, encoding: 'utf8' });
  return { status: r.status, signal: r.signal, out: `${r.stdout}${r.stderr}`.trim() };
}
