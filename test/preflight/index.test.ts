// runCheck: facts in (replayed from fixtures), report out, exit code back.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { runCheck } from '../../agent/preflight';
import type { Facts } from '../../agent/preflight/facts';

const FIX = path.resolve(__dirname, '..', '..', '..', 'test', 'preflight', 'fixtures');
const fixture = (name: string): Facts => JSON.parse(fs.readFileSync(path.join(FIX, `${name}.json`), 'utf8')) as Facts;

async function run(name: string, flags: { json?: boolean; strict?: boolean; dhcpProbe?: boolean } = {}): Promise<{ code: number; out: string; asked: { configPath: string; probe: boolean } }> {
  let out = '';
  const asked = { configPath: '', probe: false };
  const code = await runCheck(
    { configPath: '/etc/lb-agent/config.yaml', json: !!flags.json, strict: !!flags.strict, dhcpProbe: !!flags.dhcpProbe, stdout: (s) => { out += s; } },
    { gather: async (o) => { asked.configPath = o.configPath; asked.probe = o.dhcpProbe !== undefined; return fixture(name); } },
  );
  return { code, out, asked };
}

t.test('a healthy VM exits 0 with an OK verdict', async (t) => {
  const r = await run('healthy');
  t.equal(r.code, 0);
  t.match(r.out, /verdict: OK: all 11 checks passed/);
  t.equal(r.asked.configPath, '/etc/lb-agent/config.yaml');
  t.equal(r.asked.probe, false, 'no DHCP probe unless asked');
});

t.test('a failure exits 1; JSON carries every check', async (t) => {
  const r = await run('sles-kernel-default-base', { json: true });
  t.equal(r.code, 1);
  const doc = JSON.parse(r.out) as { ok: boolean; checks: { id: string; status: string; remedy: string | null }[] };
  t.equal(doc.ok, false);
  const mv = doc.checks.find((c) => c.id === 'macvlan')!;
  t.equal(mv.status, 'fail');
  t.equal(mv.remedy, 'install kernel-default (zypper in kernel-default) and reboot');
});

t.test('warnings: exit 0, exit 1 with --strict', async (t) => {
  t.equal((await run('sles-no-guest-agent')).code, 0);
  const strict = await run('sles-no-guest-agent', { strict: true, json: true });
  t.equal(strict.code, 1);
  t.equal((JSON.parse(strict.out) as { ok: boolean }).ok, false);
});

t.test('--dhcp-probe asks the gatherer for a probe', async (t) => {
  const r = await run('dhcp-offer', { dhcpProbe: true });
  t.equal(r.asked.probe, true);
  t.match(r.out, /dhcp-probe\s+OFFER of 10\.99\.0\.123/);
});

t.test('a preflight that breaks fails loudly rather than passing', async (t) => {
  let out = '';
  const code = await runCheck(
    { configPath: '/x', json: true, strict: false, dhcpProbe: false, stdout: (s) => { out += s; } },
    { gather: async () => { throw new Error('boom'); } },
  );
  t.equal(code, 1);
  const doc = JSON.parse(out) as { ok: boolean; checks: { id: string; detail: string }[] };
  t.equal(doc.ok, false);
  t.match(doc.checks[0]!.detail, /boom/);
});
