// Preflight report: exit codes (strict or not), the verdict line, the human
// table and the JSON document a script or cloud-init parses.
import t from 'tap';
import { exitCode, verdict, formatHuman, formatJson, toJson, EXIT_OK, EXIT_FAILED, EXIT_USAGE } from '../../agent/preflight/report';
import type { CheckResult } from '../../agent/preflight/checks';

const ok: CheckResult = { id: 'config', status: 'pass', detail: 'fine', remedy: undefined };
const w: CheckResult = { id: 'guest-agent', status: 'warn', detail: 'qemu-guest-agent is not installed', remedy: 'zypper in qemu-guest-agent' };
const f: CheckResult = { id: 'macvlan', status: 'fail', detail: 'cannot create a macvlan', remedy: 'install kernel-default (zypper in kernel-default) and reboot' };

t.test('exit codes: warnings fail only with --strict', async (t) => {
  t.equal(EXIT_OK, 0);
  t.equal(EXIT_FAILED, 1);
  t.equal(EXIT_USAGE, 2);
  t.equal(exitCode([ok], false), 0);
  t.equal(exitCode([ok], true), 0);
  t.equal(exitCode([ok, w], false), 0);
  t.equal(exitCode([ok, w], true), 1);
  t.equal(exitCode([ok, f], false), 1);
  t.equal(exitCode([ok, w, f], true), 1);
});

t.test('verdict names what failed and what warned', async (t) => {
  t.match(verdict([ok], false), /^OK: all 1 checks passed/);
  t.match(verdict([ok, w], false), /^OK with 1 warning \(guest-agent\)/);
  t.match(verdict([ok, w], true), /^FAIL \(--strict\): 1 warning \(guest-agent\)/);
  t.match(verdict([ok, w, f], false), /^FAIL: 1 check failed \(macvlan\), 1 warning \(guest-agent\)/);
});

t.test('human table: one line per check, a fix line under each non-pass, the verdict last', async (t) => {
  const out = formatHuman([ok, w, f], false);
  const lines = out.trimEnd().split('\n');
  t.match(lines[0], /^ok\s+config\s+fine$/);
  t.match(lines[1], /^WARN\s+guest-agent\s+qemu-guest-agent is not installed$/);
  t.match(lines[2], /^\s+fix: zypper in qemu-guest-agent$/);
  t.match(lines[3], /^FAIL\s+macvlan\s+cannot create a macvlan$/);
  t.match(lines[4], /^\s+fix: install kernel-default/);
  t.match(lines.at(-1), /^verdict: FAIL: 1 check failed \(macvlan\)/);
  // Details line up in one column.
  t.equal(lines[0]!.indexOf('fine'), lines[1]!.indexOf('qemu-guest-agent'));
  t.equal(lines[2]!.indexOf('fix:'), lines[1]!.indexOf('qemu-guest-agent'));
});

t.test('JSON shape: { ok, checks: [{ id, status, detail, remedy }] }, remedy null on a pass', async (t) => {
  const doc = JSON.parse(formatJson([ok, w], false)) as unknown;
  t.same(doc, {
    ok: true,
    checks: [
      { id: 'config', status: 'pass', detail: 'fine', remedy: null },
      { id: 'guest-agent', status: 'warn', detail: 'qemu-guest-agent is not installed', remedy: 'zypper in qemu-guest-agent' },
    ],
  });
  for (const c of toJson([ok, w, f], false).checks) t.same(Object.keys(c), ['id', 'status', 'detail', 'remedy']);
  t.equal(toJson([ok, w], true).ok, false, 'ok follows the exit code under --strict');
  t.equal(toJson([f], false).ok, false);
});
