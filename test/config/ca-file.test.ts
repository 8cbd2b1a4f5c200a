// The CA file of HTTPS checks: PEM text with certificates passes with its
// digest and count; text without one, or with one that does not parse, is
// refused naming the file; the real reader keeps the config file's limits.
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createHash } from 'node:crypto';
import { checkCaPem, readCaFile, MAX_CA_FILE_BYTES } from '../../agent/config/ca-file';

const CA = path.resolve(__dirname, '..', '..', '..', 'test', 'config', 'fixtures', 'ca.pem');

t.test('a PEM bundle: every certificate counted, the digest of the text', async (t) => {
  const pem = fs.readFileSync(CA, 'utf8');
  const two = `${pem}\n# a second copy\n${pem}`;
  const r = checkCaPem('/etc/ca.pem', two);
  t.ok(r.ok);
  if (r.ok) {
    t.equal(r.certificates, 2);
    t.equal(r.sha256, createHash('sha256').update(two).digest('hex'));
    t.equal(r.pem, two);
  }
});

t.test('no certificate, or one that does not parse, is refused naming the file', async (t) => {
  const none = checkCaPem('/etc/key.pem', '-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n');
  t.same(none.ok ? 'ok' : none.message.split(' holds')[0], '/etc/key.pem');
  t.match(none.ok ? '' : none.message, /no PEM certificate/);
  const bad = checkCaPem('/etc/ca.pem', '-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n');
  t.match(bad.ok ? '' : bad.message, /^\/etc\/ca\.pem: certificate 1 of 1 does not parse/);
  t.match(checkCaPem('/x', '').ok ? '' : 'refused', 'refused', 'an empty file');
});

t.test('the reader: a missing file and an oversized one are refused, a real one read', async (t) => {
  t.match(readCaFile('/nonexistent/ca.pem'), { ok: false, message: 'cannot read /nonexistent/ca.pem: no such file' });
  const r = readCaFile(CA);
  t.ok(r.ok && r.certificates === 1);
  const dir = t.testdir({ 'big.pem': 'x'.repeat(MAX_CA_FILE_BYTES + 1) });
  t.match(readCaFile(path.join(dir, 'big.pem')), { ok: false, message: /more than the 1048576-byte limit/ });
});
