// Loads late.ts on first use: the modules behind it (prom-client, the
// metrics server, the reload planner, the topology selection, the service
// MACs) are not read and compiled before the control socket answers. Every
// part of the daemon that needs one of them asks here.
let late: typeof import('./late') | undefined;

/** The modules used only after the control socket is up, loaded on first use (late.ts). */
export function lateModules(): typeof import('./late') {
  return (late ??= require('./late') as typeof import('./late'));
}
