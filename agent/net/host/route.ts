// Routes: the IPv4 default route's interface, read from /proc/net/route.
// The one home of the parent-NIC rule (docs/design.md: node.interface defaults to
// the default route's NIC); the preflight and the daemon both ask here.
import * as fs from 'node:fs';

/**
 * The default route's interface in /proc/net/route text: among 0.0.0.0/0
 * routes that are RTF_UP, the one of lowest metric (the one the kernel uses);
 * the first listed wins a tie. Undefined when there is none.
 */
export function parseDefaultRoute(text: string): string | undefined {
  let best: { ifname: string; metric: number } | undefined;
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 8) continue;
    const [ifname, dest, , flags, , , metric, mask] = f as [string, string, string, string, string, string, string, string];
    // RTF_UP = 0x0001 (linux/route.h)
    if (dest !== '00000000' || mask !== '00000000' || (parseInt(flags, 16) & 1) === 0) continue;
    const m = Number(metric);
    if (!best || m < best.metric) best = { ifname, metric: m };
  }
  return best?.ifname;
}

/** The default route's interface on this machine; undefined when the table is unreadable or has none. */
export function defaultRouteInterface(routeTable = '/proc/net/route'): string | undefined {
  let text: string;
  try { text = fs.readFileSync(routeTable, 'utf8'); } catch { return undefined; }
  return parseDefaultRoute(text);
}
