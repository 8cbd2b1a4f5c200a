// The config schema compiled at build time (issue 18): the file the build
// wrote is what the schema compiles to now (a schema edit without a build, or
// a build step that stopped running, fails here), and validating a config
// never loads ajv's compiler - the start-up cost this exists to remove.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { validatorSource } from '../../agent/config/validator-build';
import { VALIDATOR_FILE } from '../../agent/config/load';

const CONFIG_DIST = path.resolve(__dirname, '..', '..', 'agent', 'config');

t.test('the validator the build wrote is the one the schema compiles to', async (t) => {
  const file = path.join(CONFIG_DIST, VALIDATOR_FILE);
  t.ok(fs.existsSync(file), `${file} exists (npm run build writes it)`);
  t.equal(fs.readFileSync(file, 'utf8'), validatorSource(), 'identical to a fresh compile of schema.ts');
});

t.test('parsing a config uses the compiled validator, not ajv\'s compiler', async (t) => {
  // A fresh process: this test file itself loaded ajv to compile the source above.
  const script = `
    const { parseConfigText } = require(${JSON.stringify(path.join(CONFIG_DIST, 'load.js'))});
    const ok = parseConfigText('pools: { cidr-global: 10.0.0.96/28 }\\nservices: [{ name: a, ports: [{ port: 80 }], backends: [10.0.0.1] }]\\n');
    const bad = parseConfigText('services: [{ name: a, ports: [{ port: 80 }], backends: [10.0.0.300], bogus: 1 }]\\n');
    const ajv = Object.keys(require.cache).filter((k) => /node_modules\\/ajv\\//.test(k) && !/\\/dist\\/runtime\\//.test(k));
    process.stdout.write(JSON.stringify({ ok: ok.ok, hc: ok.ok && ok.config.services[0].healthCheck.periodSeconds, bad: bad.ok ? [] : bad.errors.map((e) => e.path + ': ' + e.message), ajv }));
  `;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30_000 });
  t.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { ok: boolean; hc: number; bad: string[]; ajv: string[] };
  t.equal(out.ok, true, 'a valid file validates');
  t.equal(out.hc, 5, 'schema defaults are filled in (healthCheck.periodSeconds)');
  t.ok(out.bad.some((e) => /backends\[0\].*10\.0\.0\.300.*IPv4/.test(e)), `the lb-ipv4 format rejects 10.0.0.300: ${out.bad.join('; ')}`);
  t.ok(out.bad.some((e) => /unknown key "bogus"/.test(e)), 'unknown keys are refused');
  t.same(out.ajv, [], 'no module of ajv but its small run-time helpers was loaded');
});
