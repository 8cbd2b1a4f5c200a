// The agent's version, read once from package.json: its one home. Kept apart
// from the daemon so the CLI can print it without loading the daemon.
export const VERSION: string = (() => {
  try {
    return (require('../../package.json') as { version: string }).version;
  } catch {
    return 'unknown';
  }
})();
