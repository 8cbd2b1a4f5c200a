// TLS contexts of HTTPS checks: one per distinct CA (and one for checks
// without), made once however many targets use it, dropped with the last;
// verification is on exactly when there is a CA.
import t from 'tap';
import * as tls from 'node:tls';
import { TlsContexts, contextKey } from '../../agent/health/tls';
import type { TlsCheckSpec } from '../../agent/config/types';

const spec = (ca: string | undefined, sni?: string): TlsCheckSpec => ({ sni, caFile: ca && `/${ca}`, ca: ca && `PEM ${ca}`, caSha256: ca });

t.test('one context per CA digest, shared, released with its last user', async (t) => {
  const made: (string | undefined)[] = [];
  const c = new TlsContexts((ca) => { made.push(ca); return tls.createSecureContext({}); });
  const a1 = c.acquire(spec('a', 'x.lab'));
  const a2 = c.acquire(spec('a', 'y.lab'));
  const none = c.acquire(spec(undefined));
  c.acquire(spec('b'));
  t.same(made, ['PEM a', undefined, 'PEM b'], 'made once per CA, once for none');
  t.equal(a1.context, a2.context, 'shared by targets with the same CA');
  t.same([a1.servername, a2.servername, none.servername], ['x.lab', 'y.lab', undefined], 'the server name stays per target');
  t.same([a1.verify, none.verify], [true, false], 'verify exactly when a CA is given');
  t.not(a1.resume, a2.resume, 'a TLS session slot per target, never shared');
  t.same(a1.resume, { session: undefined, fullAt: 0 });
  t.equal(a1.connect, tls.connect, 'node:tls connect handed with the context: no module lookup per probe');
  t.equal(c.size, 3);
  c.release(spec('a'));
  t.equal(c.size, 3, 'one user of a left');
  c.release(spec('a'));
  t.equal(c.size, 2, 'a dropped with its last user');
  c.release(spec('a'));
  t.equal(c.size, 2, 'a release too many changes nothing');
  c.acquire(spec('a'));
  t.same(made.length, 4, 'made again when needed again');
});

t.test('the key is the CA digest, or empty for none', async (t) => {
  t.equal(contextKey(spec('abc')), 'abc');
  t.equal(contextKey(spec(undefined)), '');
});
