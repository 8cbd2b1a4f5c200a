// Gate for privileged tests: they need root (netns, macvlan, raw sockets).
// When they cannot run they skip with the reason, unless CI asked for them
// with LB_AGENT_REQUIRE_PRIVILEGED=1, where a skip would hide a gap: fail.
import { labUnavailableReason } from '../../lab/netns';
import { systemdContainerUnavailableReason } from '../../lab/systemd-container';

interface TapLike {
  plan?(n: number, comment?: string): void;
  fail(msg: string): unknown;
  end(): void;
}

/** Call at the top of a privileged test file; returns false when the file must stop. */
export function requirePrivileged(t: TapLike & { skip?: unknown }): boolean {
  const reason = labUnavailableReason();
  if (!reason) return true;
  if (process.env.LB_AGENT_REQUIRE_PRIVILEGED === '1') {
    t.fail(`privileged test cannot run: ${reason} (LB_AGENT_REQUIRE_PRIVILEGED=1 forbids skipping)`);
    t.end();
    return false;
  }
  if (t.plan) t.plan(0, `skip: ${reason}`);
  return false;
}

/**
 * Gate for the tests that boot a systemd container (lab/systemd-container.ts)
 * on top of requirePrivileged: false, with a skip or (under CI's
 * LB_AGENT_REQUIRE_PRIVILEGED=1) a failure naming what is missing, when the
 * test must stop.
 */
export function requireSystemdContainer(t: TapLike): boolean {
  if (!requirePrivileged(t)) return false;
  const reason = systemdContainerUnavailableReason();
  if (!reason) return true;
  if (process.env.LB_AGENT_REQUIRE_PRIVILEGED === '1') {
    t.fail(`cannot boot a systemd container: ${reason} (LB_AGENT_REQUIRE_PRIVILEGED=1 forbids skipping)`);
    return false;
  }
  if (t.plan) t.plan(0, `skip: ${reason}`);
  return false;
}
