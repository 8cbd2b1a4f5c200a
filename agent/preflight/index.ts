// Preflight entry point: `lb-agent check [--config PATH] [--json] [--strict]
// [--dhcp-probe]`. Gathers the facts (facts.ts), judges them (checks.ts),
// prints the report (report.ts) and returns the exit code; the CLI only
// parses flags and calls runCheck.
import { errorMessage } from '../errors';
import { gatherFacts, type Facts, type GatherOptions } from './facts';
import { runChecks, type CheckResult } from './checks';
import { exitCode, formatHuman, formatJson, EXIT_FAILED } from './report';

export type { Facts } from './facts';
export type { CheckResult, CheckStatus } from './checks';
export { runChecks } from './checks';
export { gatherFacts } from './facts';
export { exitCode, formatHuman, formatJson, toJson, verdict, EXIT_OK, EXIT_FAILED, EXIT_USAGE } from './report';

export interface RunCheckOptions {
  configPath: string;
  json: boolean;
  strict: boolean;
  dhcpProbe: boolean;
  stdout: (s: string) => void;
  /** Seconds the DHCP probe waits for an OFFER (default 5). */
  dhcpTimeoutSeconds?: number;
}

export interface RunCheckDeps {
  /** Replaces fact gathering (tests replay fixtures through it). */
  gather?: (opts: GatherOptions) => Promise<Facts>;
}

/** Run the preflight; returns the exit code (0 ok, 1 something failed; 2, bad usage, is the CLI's). */
export async function runCheck(opts: RunCheckOptions, deps: RunCheckDeps = {}): Promise<number> {
  const gather = deps.gather ?? gatherFacts;
  let results: CheckResult[];
  try {
    const facts = await gather({
      configPath: opts.configPath,
      ...(opts.dhcpProbe ? {
        dhcpProbe: async (parent: string) => {
          // Loaded only when asked: it needs the native addon, the rest of the preflight does not.
          const { probeDhcp } = await import('./dhcp-probe');
          return probeDhcp(parent, opts.dhcpTimeoutSeconds !== undefined ? { timeoutSeconds: opts.dhcpTimeoutSeconds } : {});
        },
        dhcpProbe6: async (parent: string) => {
          const { probeDhcp6 } = await import('./dhcp6-probe');
          return probeDhcp6(parent, opts.dhcpTimeoutSeconds !== undefined ? { timeoutSeconds: opts.dhcpTimeoutSeconds } : {});
        },
      } : {}),
    });
    results = runChecks(facts);
  } catch (e) {
    // A bug in gathering must not look like a pass.
    results = [{ id: 'preflight', status: 'fail', detail: `the preflight itself failed: ${errorMessage(e)}`, remedy: 'report this as a bug in lb-agent check, with the output of the command' }];
    opts.stdout(opts.json ? formatJson(results, opts.strict) : formatHuman(results, opts.strict));
    return EXIT_FAILED;
  }
  opts.stdout(opts.json ? formatJson(results, opts.strict) : formatHuman(results, opts.strict));
  return exitCode(results, opts.strict);
}
