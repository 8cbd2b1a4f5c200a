// V8's optimizing compiler (TurboFan) held off while the daemon starts
//. A start is a burst that runs once: config parse, 50 macvlans,
// 50 DHCP exchanges and binds in ~300 ms. TurboFan compiled the functions
// that burst made hot on V8's one background thread (the unit's
// --v8-pool-size=1), 190 ms more CPU there for 50 DHCP services than for
// one, on a 2-core VM where the event loop, dnsmasq and the `nft` children
// want the same cores, and most of that code never runs hot again. With it
// held, the interpreter and Sparkplug (the baseline compiler, on the main
// thread) run the burst; TurboFan comes back once the start has settled, or
// at the latest START_HOLD_MAX_MS after "lb-agent started", so the proxy's
// and the health checker's steady state is compiled as before.
//
// v8.setFlagsFromString() after V8 started: Node keeps V8's flags unfrozen
// for it (--no-freeze-flags-after-init is its default), and V8 reads this
// flag at each tier-up decision, so the change takes effect at once, in
// every isolate of the process (the proxy's workers too). The daemon
// already flips --compact-on-every-full-gc the same way.
import { setFlagsFromString } from 'node:v8';

/** The longest TurboFan stays off after "lb-agent started", however long the start takes to settle. */
export const START_HOLD_MAX_MS = 1_000;

/**
 * Flags with which the operator chose V8's tiers: a start that finds one
 * leaves the tiers as they are (re-enabling TurboFan under --jitless, say,
 * is not ours to do).
 */
const TIERING_FLAG = /^--(?:no-)?(?:opt|turbofan|jitless|max-opt|always-opt|always-turbofan|sparkplug|maglev|lite-mode)(?:=|$)/;

/** Whether any of these node/V8 arguments sets a tiering flag (underscores and dashes alike, as V8 reads them). */
export function choosesTiers(args: readonly string[]): boolean {
  return args.some((a) => TIERING_FLAG.test(a.replace(/_/g, '-')));
}

/**
 * Turn TurboFan off and return what turns it back on (idempotent), or
 * undefined when the process's own flags (execArgv, NODE_OPTIONS) choose
 * the tiers. `set` is v8.setFlagsFromString; tests pass their own.
 */
export function holdOptimizer(
  args: readonly string[] = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/).filter(Boolean)],
  set: (flags: string) => void = setFlagsFromString,
): (() => void) | undefined {
  if (choosesTiers(args)) return undefined;
  set('--no-turbofan');
  let held = true;
  return () => {
    if (!held) return;
    held = false;
    set('--turbofan');
  };
}
